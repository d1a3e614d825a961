//! What every request goes through: its `X-Request-Id`, the bearer token, JSON bodies and query strings parsed
//! with errors that name the field, and opaque pagination cursors.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, MatchedPath, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use base64::Engine as _;
use serde::de::DeserializeOwned;
use serde_json::json;
use tracing::Instrument as _;

use super::error::Failure;
use super::{ApiError, AppState};
use bc_commands::door::Call;
use bc_commands::reads::Page;
use bc_eventstore::Position;
use serde::Serialize;

/// The request's id: the client's `X-Request-Id` when it is sensible, otherwise a new one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub String);

fn sensible_request_id(value: &str) -> bool {
    !value.is_empty() && value.len() <= 128 && value.bytes().all(|b| b.is_ascii_graphic())
}

/// Middleware around every request: gives it an id (and its response the `X-Request-Id` header), runs it in a
/// span naming its method, matched route and id, and logs a 5xx answer's cause there, once. Nothing else logs
/// a failed request.
pub async fn around_request(mut request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| sensible_request_id(v))
        .map(str::to_owned)
        .unwrap_or_else(|| format!("req_{}", ulid::Ulid::new().to_string().to_ascii_lowercase()));
    request.extensions_mut().insert(RequestId(id.clone()));
    let route = request.extensions().get::<MatchedPath>().map_or("unmatched", |p| p.as_str()).to_owned();
    let span = tracing::info_span!("request", method = %request.method(), route, request_id = id);
    let mut response = next.run(request).instrument(span.clone()).await;
    if let Some(Failure(cause)) = response.extensions_mut().remove::<Failure>() {
        let status = response.status().as_u16();
        span.in_scope(|| {
            if status == 500 {
                tracing::error!(status, cause, "request failed");
            } else {
                tracing::warn!(status, cause, "request not served");
            }
        });
    }
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", value);
    }
    response
}

impl<S: Send + Sync> FromRequestParts<S> for RequestId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get::<RequestId>().cloned().unwrap_or_else(|| RequestId("req_unknown".to_owned())))
    }
}

/// An authenticated request: the call the write side's door decides (who it speaks for, and its id).
#[derive(Debug, Clone)]
pub struct Authed(pub Call);

impl FromRequestParts<AppState> for Authed {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        // A layer that needed the caller first (the idempotency keys') authenticated it once already.
        if let Some(authed) = parts.extensions.get::<Authed>() {
            return Ok(authed.clone());
        }
        let RequestId(request_id) = RequestId::from_request_parts(parts, state).await?;
        let header = parts.headers.get("authorization").and_then(|v| v.to_str().ok());
        let token = header.and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer ")));
        Ok(Authed(state.app.authenticate(token, &request_id).await?))
    }
}

/// The largest body the API reads.
pub const BODY_LIMIT: usize = 64 * 1024;

/// How long a client may take to send a JSON body, once the API starts reading it; and, for an image upload,
/// how long it may send nothing. A body of at most [`BODY_LIMIT`] takes longer only when trickled, and a trickle
/// holds a connection and a task for as long as it lasts.
pub const BODY_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// The body deadline of this router ([`BODY_DEADLINE`] unless the state says otherwise), in each request's
/// extensions.
#[derive(Debug, Clone, Copy)]
pub struct BodyDeadline(pub std::time::Duration);

impl BodyDeadline {
    /// The deadline a request carries, or the default.
    pub fn of(extensions: &axum::http::Extensions) -> std::time::Duration {
        extensions.get::<BodyDeadline>().map_or(BODY_DEADLINE, |deadline| deadline.0)
    }

    /// `408 REQUEST_TIMEOUT` naming the body: it did not arrive in time.
    pub fn passed(deadline: std::time::Duration) -> ApiError {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "REQUEST_TIMEOUT",
            format!("body: not received within {} ms", deadline.as_millis()),
        )
        .with_details(json!({ "field": "body" }))
    }
}

/// The whole body, if it arrives within the request's [`BodyDeadline`].
async fn read_body<S: Send + Sync>(request: Request, state: &S) -> Result<Bytes, ApiError> {
    let deadline = BodyDeadline::of(request.extensions());
    let read = tokio::time::timeout(deadline, Bytes::from_request(request, state));
    read.await.map_err(|_| BodyDeadline::passed(deadline))?.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "INVALID_ARGUMENT",
                format!("body: larger than {} KiB", BODY_LIMIT / 1024),
            )
            .with_details(json!({ "field": "body", "limit": BODY_LIMIT }))
        } else {
            ApiError::invalid_argument("body", rejection.body_text())
        }
    })
}

/// A JSON body; a malformed one is a `400` naming the field (or a `413` when too large), before anything runs.
#[derive(Debug, Clone)]
pub struct JsonBody<T>(pub T);

/// The field a serde error is about: the path, with the unknown or missing field's name appended.
fn field_of(path: &str, message: &str) -> String {
    let named = ["unknown field `", "missing field `"]
        .iter()
        .find_map(|prefix| message.strip_prefix(prefix).and_then(|rest| rest.split('`').next()));
    match (path, named) {
        (path, Some(name)) if path == name || path.ends_with(&format!(".{name}")) => path.to_owned(),
        (".", Some(name)) => name.to_owned(),
        (path, Some(name)) => format!("{path}.{name}"),
        (".", None) => "body".to_owned(),
        (path, None) => path.to_owned(),
    }
}

/// serde's message without the position suffix serde_json adds.
fn clean(message: &str) -> &str {
    message.split(" at line ").next().unwrap_or(message)
}

/// Parses JSON into `T` with errors that name the field.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // Every body is a JSON object. serde would also read a struct from an array of its fields in order, which
    // no client means to send (schemathesis found `[""]` accepted as a session request).
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        None => return Err(ApiError::invalid_argument("body", "a JSON object is required")),
        Some(b'{') => {}
        Some(_) => return Err(ApiError::invalid_argument("body", "must be a JSON object")),
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            return ApiError::invalid_argument("body", format!("is not valid JSON ({inner})"));
        }
        let message = inner.to_string();
        ApiError::invalid_argument(&field_of(&path, &message), clean(&message))
    })?;
    deserializer.end().map_err(|err| ApiError::invalid_argument("body", format!("is not valid JSON ({err})")))?;
    refuse_nul(bytes)?;
    Ok(value)
}

/// PostgreSQL holds no NUL character in text or `jsonb`, so no body may carry one (JSON can only spell it as an
/// escape): it is refused here, naming where, whatever the endpoint later does with the field.
fn refuse_nul(bytes: &[u8]) -> Result<(), ApiError> {
    if !bytes.windows(5).any(|w| w.eq_ignore_ascii_case(b"u0000")) {
        return Ok(());
    }
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|err| ApiError::invalid_argument("body", err.to_string()))?;
    match bc_domain::device::first_nul(&value, "") {
        None => Ok(()),
        Some(path) => {
            let field = path.strip_prefix('.').filter(|p| !p.is_empty()).unwrap_or("body");
            Err(ApiError::invalid_argument(field, "contains a NUL character"))
        }
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        check_json_content_type(request.headers())?;
        let bytes = read_body(request, state).await?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// Refuses a body that does not say it is JSON: `415 UNSUPPORTED_MEDIA_TYPE`, naming `content-type`.
/// `application/json` with parameters (`; charset=utf-8`) is JSON.
fn check_json_content_type(headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
    let value = headers.get(axum::http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let media = value.split(';').next().unwrap_or_default().trim();
    if media.eq_ignore_ascii_case("application/json") {
        return Ok(());
    }
    let said = if value.is_empty() { "no content-type".to_owned() } else { format!("content-type {value:?}") };
    Err(ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "UNSUPPORTED_MEDIA_TYPE",
        format!("the body must be application/json, not {said}"),
    )
    .with_details(json!({ "field": "content-type" })))
}

/// An optional JSON body: absent or empty means the default.
#[derive(Debug, Clone)]
pub struct OptionalBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for OptionalBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let headers = request.headers().clone();
        let bytes = read_body(request, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalBody(T::default()));
        }
        check_json_content_type(&headers)?;
        parse_json(&bytes).map(OptionalBody)
    }
}

/// A query string parsed into `T` (declare it with `deny_unknown_fields`), with errors naming the parameter.
#[derive(Debug, Clone)]
pub struct QueryParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or("");
        // No text PostgreSQL reads may hold a NUL character.
        if let Some((name, _)) =
            form_urlencoded_parse(query).find(|(name, value)| name.contains('\0') || value.contains('\0'))
        {
            let name = if name.contains('\0') { "query".to_owned() } else { name.into_owned() };
            return Err(ApiError::invalid_argument(&name, "contains a NUL character"));
        }
        let deserializer = serde_urlencoded::Deserializer::new(form_urlencoded_parse(query));
        serde_path_to_error::deserialize(deserializer).map(QueryParams).map_err(|err| {
            let path = err.path().to_string();
            let message = err.into_inner().to_string();
            ApiError::invalid_argument(&field_of(&path, &message), message)
        })
    }
}

fn form_urlencoded_parse(query: &str) -> form_urlencoded::Parse<'_> {
    form_urlencoded::parse(query.as_bytes())
}

/// `?limit=&cursor=` of a list, with `?after=` (the consistency token, read by [`super::consistency`]).
#[derive(Debug, Clone, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Items per page, 1 to 500 (100 by default).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
    /// The `nextCursor` of the previous page.
    pub cursor: Option<String>,
    /// A consistency token: answer once the read models have passed this position.
    pub after: Option<String>,
}

/// The most items one page holds.
pub const MAX_PAGE: u32 = 500;
/// Items per page unless the caller says otherwise.
pub const DEFAULT_PAGE: u32 = 100;

impl PageParams {
    pub fn page(&self) -> Result<Page, ApiError> {
        let limit = self.limit.unwrap_or(DEFAULT_PAGE);
        if limit == 0 || limit > MAX_PAGE {
            return Err(ApiError::invalid_argument("limit", format!("must be from 1 to {MAX_PAGE}")));
        }
        let after_key = self.cursor.as_deref().map(decode_cursor).transpose()?;
        Ok(Page { limit, after_key })
    }
}

/// The `nextCursor` of a page that ended before the key `next_key` (none on the last page).
pub fn next_cursor(next_key: &Option<String>) -> Option<String> {
    next_key.as_deref().map(encode_cursor)
}

/// A command's answer: its body, its position as `X-Position` (the consistency token of reads), and where
/// the new thing is, for a create.
pub fn committed_answer<T: Serialize>(
    status: StatusCode,
    body: T,
    position: Option<Position>,
    location: Option<String>,
) -> Response {
    let mut response = (status, axum::Json(body)).into_response();
    if let Some(position) = position
        && let Ok(value) = HeaderValue::from_str(&position.to_string())
    {
        response.headers_mut().insert("x-position", value);
    }
    if let Some(location) = location
        && let Ok(value) = HeaderValue::from_str(&location)
    {
        response.headers_mut().insert("location", value);
    }
    response
}

/// An opaque cursor for the last key of a page.
pub fn encode_cursor(key: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("v1:{key}"))
}

fn decode_cursor(cursor: &str) -> Result<String, ApiError> {
    let invalid = || ApiError::invalid_argument("cursor", "is not a cursor this API gave out");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(cursor).map_err(|_| invalid())?;
    let text = String::from_utf8(bytes).map_err(|_| invalid())?;
    text.strip_prefix("v1:").map(str::to_owned).ok_or_else(invalid)
}

/// Parses a path id into its typed form, naming the parameter when it is not one.
/// The `Idempotency-Key` header, when sent: 1 to 255 printable characters.
pub fn idempotency_key(headers: &axum::http::HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else { return Ok(None) };
    let key = value.to_str().map_err(|_| ApiError::invalid_argument("Idempotency-Key", "must be printable text"))?;
    if key.is_empty() || key.len() > 255 || key.chars().any(char::is_control) {
        return Err(ApiError::invalid_argument("Idempotency-Key", "must be 1 to 255 printable characters"));
    }
    Ok(Some(key.to_owned()))
}

pub fn path_id<T>(field: &str, text: &str) -> Result<T, ApiError>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    text.parse().map_err(|err: T::Err| ApiError::invalid_argument(field, err.to_string()))
}
