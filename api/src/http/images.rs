//! Images: uploads streamed into the content-addressed store, their metadata, their bytes, their deletion.

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use bc_commands::door::Subject;
use bc_commands::images::{ImageContent, UploadImage};
use bc_domain::id::ImageId;
use bc_domain::image::Visibility;

use super::consistency::MinPosition;
use super::error::{CommonErrors, ErrorBody};
use super::fleet::ReadParams;
use super::request::{Authed, PageParams, QueryParams, committed_answer, next_cursor, path_id};
use super::{ApiError, AppState};
use crate::wire::ImagePage;
use crate::wire::images::{ImageDto, UploadParams};

/// The declared size of an upload: `size`, or the request's `Content-Length`; both must agree when both are given.
fn declared_size(params: &UploadParams, headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let length = match headers.get(header::CONTENT_LENGTH) {
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| ApiError::invalid_argument("content-length", "is not a number of bytes"))?,
        ),
        None => None,
    };
    match (params.size, length) {
        (Some(size), Some(length)) if size != length => Err(ApiError::invalid_argument(
            "size",
            format!("{size} bytes declared, but the request's Content-Length is {length}"),
        )),
        (size, length) => Ok(size.or(length)),
    }
}

/// An upload's body is the image itself: `application/octet-stream`, or no type at all.
fn check_octet_stream(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else { return Ok(()) };
    let essence = value.to_str().unwrap_or("").split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    if essence == "application/octet-stream" {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "UNSUPPORTED_MEDIA_TYPE",
        format!("content-type: an image is uploaded as application/octet-stream, not {essence:?}"),
    )
    .with_details(serde_json::json!({ "field": "content-type" })))
}

/// `POST /v1/images`: upload an image.
#[utoipa::path(
    post,
    path = "/v1/images",
    tag = "images",
    summary = "Upload an image: its bytes as the body, what they are in the query",
    description = "The bytes are hashed and counted as they arrive, and the image is stored only when they match \
                   `sha256` (and `size`): otherwise nothing is kept. A signature is checked against the control \
                   plane's signer allowlist before a byte is read. An image's name and version hold one content: \
                   the same upload again answers the stored image (200), other bytes are a CONFLICT. A `public` \
                   image also needs `images.publish`.",
    params(UploadParams),
    request_body(content = String, content_type = "application/octet-stream", description = "The image's bytes"),
    responses(
        CommonErrors,
        (status = 201, description = "Stored", body = ImageDto),
        (status = 200, description = "The same image was stored before: this is it", body = ImageDto),
        (status = 409, description = "The name and version hold other content", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn upload_image(
    State(state): State<AppState>,
    who: Authed,
    QueryParams(params): QueryParams<UploadParams>,
    headers: HeaderMap,
    deadline: Option<axum::Extension<super::request::BodyDeadline>>,
    body: Body,
) -> Result<Response, ApiError> {
    let caller = state.app.authorize(&who.0, "images.create", Subject::OwnTenant).await?;
    let visibility = params.visibility.unwrap_or(Visibility::Private);
    if visibility == Visibility::Public {
        // Publishing is decided on the fleet, which only the platform's tenant sees: to anyone else the fleet is
        // not found, and the answer says why the upload is refused instead.
        match state.app.authorize(&who.0, "images.publish", Subject::Fleet).await {
            Err(bc_commands::AppError::Rejected(bc_domain::Rejection::NotFound { .. })) => {
                return Err(ApiError::forbidden(
                    "visibility: a public image is published by the platform's administrators (images.publish)",
                ));
            }
            other => {
                other?;
            }
        }
    }
    if headers.contains_key("idempotency-key") {
        return Err(ApiError::invalid_argument(
            "Idempotency-Key",
            "an image upload is idempotent by its name, version and SHA-256 and takes no key",
        ));
    }
    check_octet_stream(&headers)?;
    let input = UploadImage {
        size_bytes: declared_size(&params, &headers)?,
        name: params.name,
        version: params.version,
        format: params.format,
        visibility,
        sha256: params.sha256,
        signer: params.signer,
        signature: params.signature,
    };
    let idle = deadline.map_or(super::request::BODY_DEADLINE, |axum::Extension(deadline)| deadline.0);
    let uploaded = state.app.upload_image(&caller, input, stalls_end(body, idle)).await?;
    let status = if uploaded.created { StatusCode::CREATED } else { StatusCode::OK };
    let location = format!("/v1/images/{}", uploaded.image.id);
    Ok(committed_answer(status, ImageDto::from(&uploaded.image), None, Some(location)))
}

/// The body's chunks, ending with an error when nothing arrives for `idle`: an upload may take as long as it
/// needs, but a client that stops sending does not hold its connection and its upload open.
fn stalls_end(body: Body, idle: std::time::Duration) -> impl futures_util::Stream<Item = Result<Bytes, String>> {
    futures_util::stream::unfold(Some(body.into_data_stream()), move |data| async move {
        let mut data = data?;
        match tokio::time::timeout(idle, futures_util::StreamExt::next(&mut data)).await {
            Ok(Some(Ok(bytes))) => Some((Ok(bytes), Some(data))),
            Ok(Some(Err(err))) => Some((Err(err.to_string()), None)),
            Ok(None) => None,
            Err(_) => Some((Err(format!("nothing arrived for {} ms", idle.as_millis())), None)),
        }
    })
}

/// `GET /v1/images`.
#[utoipa::path(
    get,
    path = "/v1/images",
    tag = "images",
    summary = "The images the caller's tenant sees: its own and the public ones",
    params(PageParams),
    responses(CommonErrors, (status = 200, description = "A page: items and nextCursor", body = ImagePage)),
    security(("bearer" = [])),
)]
pub async fn list_images(
    State(state): State<AppState>,
    who: Authed,
    // Images are read where they are written, so every token is already reached; it is still checked.
    MinPosition(_): MinPosition,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<ImagePage>, ApiError> {
    let caller = state.app.authorize(&who.0, "images.list", Subject::OwnTenant).await?;
    let page = params.page()?;
    let listed = state.app.list_images(&caller, &page).await?;
    Ok(Json(ImagePage {
        items: listed.items.iter().map(Into::into).collect(),
        next_cursor: next_cursor(&listed.next_key),
    }))
}

/// `GET /v1/images/{image_id}`.
#[utoipa::path(
    get,
    path = "/v1/images/{image_id}",
    tag = "images",
    summary = "One image",
    params(("image_id" = String, Path, description = "The image id"), ReadParams),
    responses(CommonErrors, (status = 200, description = "The image", body = ImageDto)),
    security(("bearer" = [])),
)]
pub async fn get_image(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    MinPosition(_): MinPosition,
    QueryParams(ReadParams { .. }): QueryParams<ReadParams>,
) -> Result<Json<ImageDto>, ApiError> {
    let id: ImageId = path_id("imageId", &id)?;
    state.app.authorize(&who.0, "images.get", Subject::Image(&id)).await?;
    Ok(Json((&state.app.image(&id).await?).into()))
}

/// `GET /v1/images/{image_id}/content`.
#[utoipa::path(
    get,
    path = "/v1/images/{image_id}/content",
    tag = "images",
    summary = "An image's bytes",
    description = "Streamed from the content-addressed store; `ETag` is the SHA-256 the bytes have.",
    params(("image_id" = String, Path, description = "The image id")),
    responses(CommonErrors, (status = 200, description = "The bytes", content_type = "application/octet-stream", body = String)),
    security(("bearer" = [])),
)]
pub async fn image_content(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    QueryParams(NoParams {}): QueryParams<NoParams>,
) -> Result<Response, ApiError> {
    let id: ImageId = path_id("imageId", &id)?;
    state.app.authorize(&who.0, "images.content.get", Subject::Image(&id)).await?;
    let content = state.app.image_content(&id).await?;
    Ok(stream_content(&state, content))
}

/// An image's bytes as a streamed answer, with their length and `ETag: "sha256:..."`.
pub(super) fn stream_content(state: &AppState, content: ImageContent) -> Response {
    let (size, etag) = (content.image.size_bytes, format!("\"sha256:{}\"", content.image.sha256));
    let app = state.app.clone();
    let chunks = futures_util::stream::unfold(
        (app, content, 0),
        |(app, content, seq): (_, ImageContent, i32)| async move {
            if seq >= content.chunks {
                return None;
            }
            let read = app.image_chunk(&content, seq).await.map(Bytes::from).map_err(|err| {
            tracing::warn!(image = %content.image.id, seq, error = %err, "an image's bytes could not be read to the end");
            std::io::Error::other(err.to_string())
        });
            // After an error the stream ends: the client sees fewer bytes than Content-Length says.
            let next = if read.is_ok() { seq + 1 } else { content.chunks };
            Some((read, (app, content, next)))
        },
    );
    let mut response = Body::from_stream(chunks).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    if let Ok(value) = HeaderValue::from_str(&etag) {
        headers.insert(header::ETAG, value);
    }
    response
}

/// No query parameters.
#[derive(Debug, Clone, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

/// `DELETE /v1/images/{image_id}`.
#[utoipa::path(
    delete,
    path = "/v1/images/{image_id}",
    tag = "images",
    summary = "Delete an image of the caller's tenant (its bytes go once no other image has them)",
    params(("image_id" = String, Path, description = "The image id")),
    responses(CommonErrors, (status = 200, description = "Deleted", body = crate::wire::CreatedDto)),
    security(("bearer" = [])),
)]
pub async fn delete_image(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id: ImageId = path_id("imageId", &id)?;
    let caller = state.app.authorize(&who.0, "images.delete", Subject::Image(&id)).await?;
    let done = state.app.delete_image(&caller, &id).await?;
    Ok(committed_answer(StatusCode::OK, crate::wire::CreatedDto { id: id.to_string() }, done.position, None))
}
