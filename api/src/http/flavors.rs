//! Flavors: the shapes instances are made in.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use bc_commands::door::Subject;
use bc_domain::flavor::FlavorSizes;
use bc_domain::id::FlavorId;
use bc_domain::image::Visibility;

use super::consistency::MinPosition;
use super::error::CommonErrors;
use super::fleet::ReadParams;
use super::request::{Authed, JsonBody, PageParams, QueryParams, committed_answer, next_cursor, path_id};
use super::{ApiError, AppState};
use crate::wire::FlavorPage;
use crate::wire::flavors::{FlavorBody, FlavorDto};

/// `POST /v1/flavors`.
#[utoipa::path(
    post,
    path = "/v1/flavors",
    tag = "instances",
    summary = "Create a flavor",
    description = "A flavor never changes once created. A public one is every tenant's and needs `flavors.publish` \
                   (the platform's administrators).",
    request_body = FlavorBody,
    responses(CommonErrors, (status = 201, description = "Created; `X-Position` is its consistency token", body = FlavorDto)),
    security(("bearer" = [])),
)]
pub async fn create_flavor(
    State(state): State<AppState>,
    who: Authed,
    JsonBody(body): JsonBody<FlavorBody>,
) -> Result<Response, ApiError> {
    let caller = state.app.authorize(&who.0, "flavors.create", Subject::OwnTenant).await?;
    let visibility = body.visibility.unwrap_or(Visibility::Private);
    if visibility == Visibility::Public {
        // Publishing is decided on the fleet, which only the platform's tenant sees: to anyone else the fleet is
        // not found, and the answer says why the flavor is refused instead.
        match state.app.authorize(&who.0, "flavors.publish", Subject::Fleet).await {
            Err(bc_commands::AppError::Rejected(bc_domain::Rejection::NotFound { .. })) => {
                return Err(ApiError::forbidden(
                    "visibility: a public flavor is published by the platform's administrators (flavors.publish)",
                ));
            }
            other => {
                other?;
            }
        }
    }
    let sizes = FlavorSizes { vcpu: body.vcpu, memory_gib: body.memory_gib, gpus: body.gpus, disk: body.disk };
    let done = state.app.create_flavor(&caller, &body.name, sizes, visibility).await?;
    let location = format!("/v1/flavors/{}", done.value.id);
    Ok(committed_answer(StatusCode::CREATED, FlavorDto::from(&done.value), done.position, Some(location)))
}

/// `GET /v1/flavors`.
#[utoipa::path(
    get,
    path = "/v1/flavors",
    tag = "instances",
    summary = "The flavors the caller's tenant may use: its own and the public ones",
    params(PageParams),
    responses(CommonErrors, (status = 200, description = "A page: items and nextCursor", body = FlavorPage)),
    security(("bearer" = [])),
)]
pub async fn list_flavors(
    State(state): State<AppState>,
    who: Authed,
    // Flavors are read where they are written, so every token is already reached; it is still checked.
    MinPosition(_): MinPosition,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<FlavorPage>, ApiError> {
    let caller = state.app.authorize(&who.0, "flavors.list", Subject::OwnTenant).await?;
    let page = params.page()?;
    let listed = state.app.list_flavors(&caller, &page).await?;
    Ok(Json(FlavorPage {
        items: listed.items.iter().map(Into::into).collect(),
        next_cursor: next_cursor(&listed.next_key),
    }))
}

/// `GET /v1/flavors/{flavor_id}`.
#[utoipa::path(
    get,
    path = "/v1/flavors/{flavor_id}",
    tag = "instances",
    summary = "One flavor the caller's tenant may use",
    params(("flavor_id" = String, Path, description = "The flavor's id"), ReadParams),
    responses(CommonErrors, (status = 200, description = "The flavor", body = FlavorDto)),
    security(("bearer" = [])),
)]
pub async fn get_flavor(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    MinPosition(_): MinPosition,
    QueryParams(ReadParams { .. }): QueryParams<ReadParams>,
) -> Result<Json<FlavorDto>, ApiError> {
    let id: FlavorId = path_id("flavorId", &id)?;
    let caller = state.app.authorize(&who.0, "flavors.get", Subject::OwnTenant).await?;
    Ok(Json((&state.app.flavor(&caller, &id).await?).into()))
}

/// `DELETE /v1/flavors/{flavor_id}`.
#[utoipa::path(
    delete,
    path = "/v1/flavors/{flavor_id}",
    tag = "instances",
    summary = "Delete a flavor of the caller's tenant (instances made from it keep their sizes)",
    params(("flavor_id" = String, Path, description = "The flavor's id")),
    responses(CommonErrors, (status = 200, description = "Deleted", body = crate::wire::CreatedDto)),
    security(("bearer" = [])),
)]
pub async fn delete_flavor(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id: FlavorId = path_id("flavorId", &id)?;
    let caller = state.app.authorize(&who.0, "flavors.delete", Subject::OwnTenant).await?;
    let done = state.app.delete_flavor(&caller, &id).await?;
    Ok(committed_answer(StatusCode::OK, crate::wire::CreatedDto { id: id.to_string() }, done.position, None))
}
