//! `/v1/instances`: create (with `Idempotency-Key`, with the reservation that holds the allocation), list, get,
//! start, stop, delete.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use bc_commands::door::Subject;
use bc_commands::instances::CreateInstance;
use bc_domain::id::{FlavorId, ImageId, InstanceId, PoolId, ProjectId};
use bc_domain::instance::DesiredState;

use super::consistency::MinPosition;
use super::error::{CommonErrors, ErrorBody};
use super::request::{Authed, JsonBody, OptionalBody, PageParams, QueryParams, committed_answer, next_cursor, path_id};
use super::{ApiError, AppState};
use crate::wire::InstancePage;
use crate::wire::instances::{InstanceBody, InstanceDto, MadeInstanceDto};
use crate::wire::reservations::EmptyBody;

fn body_id<T>(field: &str, text: &str) -> Result<T, ApiError>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    text.parse().map_err(|err: T::Err| ApiError::invalid_argument(field, err.to_string()))
}

/// `POST /v1/instances`: `201` with the new instance and its reservation (`placed`, or refused when the pool
/// cannot hold it now), `200` with the same for a retry with the same key and body.
#[utoipa::path(
    post,
    path = "/v1/instances",
    tag = "instances",
    summary = "Create an instance in a vps-host pool, with the reservation that holds its allocation",
    description = "Decided as `instances.create` on the draft (vcpu, memoryGiB, gpus, imageId, imageVerified, \
                   projectId) and as its reservation's `reservations.create`. The reservation holds the flavor's \
                   GPUs on one node with its vCPUs, memory and disk, from now for `duration` seconds; it does \
                   not wait: a pool that cannot hold it now answers CAPACITY_UNAVAILABLE or QUOTA_EXCEEDED.",
    params(("Idempotency-Key" = String, Header, description = "Names the instance with the caller: a retry with the same key and body answers the same one")),
    request_body = InstanceBody,
    responses(CommonErrors, (status = 201, description = "Created; `X-Position` is its consistency token", body = MadeInstanceDto), (status = 200, description = "A retry: the existing instance", body = MadeInstanceDto), (status = 409, description = "CAPACITY_UNAVAILABLE, QUOTA_EXCEEDED or IDEMPOTENCY_KEY_REUSED", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn create_instance(
    State(state): State<AppState>,
    who: Authed,
    headers: HeaderMap,
    JsonBody(body): JsonBody<InstanceBody>,
) -> Result<Response, ApiError> {
    let key = super::request::idempotency_key(&headers)?
        .ok_or_else(|| ApiError::invalid_argument("Idempotency-Key", "the header is required on creates"))?;
    let input = CreateInstance {
        idempotency_key: key,
        name: body.name,
        pool_id: body_id::<PoolId>("poolId", &body.pool_id)?,
        flavor_id: body_id::<FlavorId>("flavorId", &body.flavor_id)?,
        image_id: body_id::<ImageId>("imageId", &body.image_id)?,
        project_id: body.project_id.as_deref().map(|p| body_id::<ProjectId>("projectId", p)).transpose()?,
        user_data: body.user_data,
        duration_s: body.duration,
        desired: body.desired_state.unwrap_or(DesiredState::Running),
    };
    let made = state.app.create_instance_as(&who.0, input).await?;
    let status = if made.value.created { StatusCode::CREATED } else { StatusCode::OK };
    let location = format!("/v1/instances/{}", made.value.instance.created.instance_id);
    Ok(committed_answer(status, MadeInstanceDto::from(&made.value), made.position, Some(location)))
}

/// `GET /v1/instances`.
#[utoipa::path(
    get,
    path = "/v1/instances",
    tag = "instances",
    summary = "The caller's tenant's instances, in id order",
    params(PageParams),
    responses(CommonErrors, (status = 200, description = "A page: items and nextCursor", body = InstancePage)),
    security(("bearer" = [])),
)]
pub async fn list_instances(
    State(state): State<AppState>,
    who: Authed,
    // Instances are read where they are written, so every token is already reached; it is still checked.
    MinPosition(_): MinPosition,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<InstancePage>, ApiError> {
    let caller = state.app.authorize(&who.0, "instances.list", Subject::OwnTenant).await?;
    let page = params.page()?;
    let listed = state.app.list_instances(&caller, &page).await?;
    Ok(Json(InstancePage {
        items: listed.items.iter().map(Into::into).collect(),
        next_cursor: next_cursor(&listed.next_key),
    }))
}

/// `GET /v1/instances/{instance_id}`: read from its stream, so an instance whose create answered is never `404`.
#[utoipa::path(
    get,
    path = "/v1/instances/{instance_id}",
    tag = "instances",
    summary = "One instance, read from its stream",
    params(("instance_id" = String, Path, description = "The instance id")),
    responses(CommonErrors, (status = 200, description = "The instance", body = InstanceDto)),
    security(("bearer" = [])),
)]
pub async fn get_instance(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
) -> Result<Json<InstanceDto>, ApiError> {
    let id: InstanceId = path_id("instanceId", &id)?;
    let caller = state.app.authorize(&who.0, "instances.get", Subject::Instance(&id)).await?;
    Ok(Json((&state.app.instance(&caller, &id).await?).into()))
}

async fn change(state: &AppState, who: &Authed, id: &str, desired: DesiredState) -> Result<Response, ApiError> {
    let id: InstanceId = path_id("instanceId", id)?;
    let done = state.app.change_instance_as(&who.0, &id, desired).await?;
    Ok(committed_answer(StatusCode::OK, InstanceDto::from(&done.value), done.position, None))
}

/// `POST /v1/instances/{instance_id}/start`.
#[utoipa::path(
    post,
    path = "/v1/instances/{instance_id}/start",
    tag = "instances",
    summary = "Ask for the instance to run (its node starts it)",
    params(("instance_id" = String, Path, description = "The instance id")),
    responses(CommonErrors, (status = 200, description = "Its desired state is running", body = InstanceDto), (status = 409, description = "It is deleted, failed or being deleted", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn start_instance(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    OptionalBody(EmptyBody {}): OptionalBody<EmptyBody>,
) -> Result<Response, ApiError> {
    change(&state, &who, &id, DesiredState::Running).await
}

/// `POST /v1/instances/{instance_id}/stop`.
#[utoipa::path(
    post,
    path = "/v1/instances/{instance_id}/stop",
    tag = "instances",
    summary = "Ask for the instance to stop (its allocation stays held)",
    params(("instance_id" = String, Path, description = "The instance id")),
    responses(CommonErrors, (status = 200, description = "Its desired state is stopped", body = InstanceDto), (status = 409, description = "It is deleted, failed or being deleted", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn stop_instance(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    OptionalBody(EmptyBody {}): OptionalBody<EmptyBody>,
) -> Result<Response, ApiError> {
    change(&state, &who, &id, DesiredState::Stopped).await
}

/// `DELETE /v1/instances/{instance_id}`.
#[utoipa::path(
    delete,
    path = "/v1/instances/{instance_id}",
    tag = "instances",
    summary = "Delete the instance: its allocation is released once its node has stopped it (cancelled before \
               its window began), and the instance ends with it",
    params(("instance_id" = String, Path, description = "The instance id")),
    responses(CommonErrors, (status = 200, description = "Its desired state is deleted", body = InstanceDto), (status = 409, description = "It already failed", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn delete_instance(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    change(&state, &who, &id, DesiredState::Deleted).await
}
