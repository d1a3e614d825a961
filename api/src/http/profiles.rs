//! Profiles: versioned provisioning templates.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use bc_commands::door::Subject;
use bc_domain::id::ProfileId;

use super::consistency::MinPosition;
use super::error::CommonErrors;
use super::fleet::ReadParams;
use super::request::{Authed, JsonBody, PageParams, QueryParams, committed_answer, next_cursor, path_id};
use super::{ApiError, AppState};
use crate::wire::ProfilePage;
use crate::wire::profiles::{ProfileBody, ProfileDto};

/// `POST /v1/profiles`.
#[utoipa::path(
    post,
    path = "/v1/profiles",
    tag = "provisioning",
    summary = "Create the next version of a profile",
    description = "The first version of a name is 1; posting the same name again makes the next version. A version \
                   never changes once created. The image must be the tenant's own or a public one, and verified \
                   unless `allowUnverifiedImage` is set.",
    request_body = ProfileBody,
    responses(CommonErrors, (status = 201, description = "Created; `X-Position` is its consistency token", body = ProfileDto)),
    security(("bearer" = [])),
)]
pub async fn create_profile(
    State(state): State<AppState>,
    who: Authed,
    JsonBody(body): JsonBody<ProfileBody>,
) -> Result<Response, ApiError> {
    let caller = state.app.authorize(&who.0, "profiles.create", Subject::OwnTenant).await?;
    let spec = body.spec().map_err(|(field, message)| ApiError::invalid_argument(&field, message))?;
    let done = state.app.create_profile(&caller, &body.name, spec).await?;
    let location = format!("/v1/profiles/{}", done.value.id);
    Ok(committed_answer(StatusCode::CREATED, ProfileDto::from(&done.value), done.position, Some(location)))
}

/// `?name=` of the list, with its page.
#[derive(Debug, Clone, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ProfileListParams {
    /// Only the versions of this profile.
    pub name: Option<String>,
    /// Items per page, 1 to 500 (100 by default).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
    /// The `nextCursor` of the previous page.
    pub cursor: Option<String>,
    /// A consistency token: answer once the read models have passed this position.
    #[allow(dead_code)]
    pub after: Option<String>,
}

/// `GET /v1/profiles`.
#[utoipa::path(
    get,
    path = "/v1/profiles",
    tag = "provisioning",
    summary = "The caller's tenant's profile versions, by name and version",
    params(ProfileListParams),
    responses(CommonErrors, (status = 200, description = "A page: items and nextCursor", body = ProfilePage)),
    security(("bearer" = [])),
)]
pub async fn list_profiles(
    State(state): State<AppState>,
    who: Authed,
    // Profiles are read where they are written, so every token is already reached; it is still checked.
    MinPosition(_): MinPosition,
    QueryParams(params): QueryParams<ProfileListParams>,
) -> Result<Json<ProfilePage>, ApiError> {
    let caller = state.app.authorize(&who.0, "profiles.list", Subject::OwnTenant).await?;
    let page = PageParams { limit: params.limit, cursor: params.cursor, after: None }.page()?;
    let listed = state.app.list_profiles(&caller, params.name.as_deref(), &page).await?;
    Ok(Json(ProfilePage {
        items: listed.items.iter().map(Into::into).collect(),
        next_cursor: next_cursor(&listed.next_key),
    }))
}

/// `GET /v1/profiles/{profile_id}`.
#[utoipa::path(
    get,
    path = "/v1/profiles/{profile_id}",
    tag = "provisioning",
    summary = "One profile version",
    params(("profile_id" = String, Path, description = "The profile version's id"), ReadParams),
    responses(CommonErrors, (status = 200, description = "The profile version", body = ProfileDto)),
    security(("bearer" = [])),
)]
pub async fn get_profile(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    MinPosition(_): MinPosition,
    QueryParams(ReadParams { .. }): QueryParams<ReadParams>,
) -> Result<Json<ProfileDto>, ApiError> {
    let id: ProfileId = path_id("profileId", &id)?;
    state.app.authorize(&who.0, "profiles.get", Subject::Profile(&id)).await?;
    Ok(Json((&state.app.profile(&id).await?).into()))
}

/// `DELETE /v1/profiles/{profile_id}`.
#[utoipa::path(
    delete,
    path = "/v1/profiles/{profile_id}",
    tag = "provisioning",
    summary = "Delete a profile version (its number is never given again)",
    params(("profile_id" = String, Path, description = "The profile version's id")),
    responses(CommonErrors, (status = 200, description = "Deleted", body = crate::wire::CreatedDto)),
    security(("bearer" = [])),
)]
pub async fn delete_profile(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id: ProfileId = path_id("profileId", &id)?;
    let caller = state.app.authorize(&who.0, "profiles.delete", Subject::Profile(&id)).await?;
    let done = state.app.delete_profile(&caller, &id).await?;
    Ok(committed_answer(StatusCode::OK, crate::wire::CreatedDto { id: id.to_string() }, done.position, None))
}
