//! `/v1/reservations`: create (with `Idempotency-Key`), get, list, renew, extend, cancel, release.

use axum::Json;
use axum::extract::{FromRequest, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bc_domain::device::DeviceClass;
use bc_domain::id::{PoolId, ProjectId, ReservationId};
use bc_domain::reservation::{
    Binding, DeviceRequest, Reservation, ReservationRequest, ReservationState, Selector, Topology,
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::consistency::MinPosition;
use super::error::{CommonErrors, ErrorBody};
use super::request::{Authed, JsonBody, PageParams, QueryParams, page_json, parse_json, path_id};
use super::{ApiError, AppState};
use bc_commands::Caller;
use bc_commands::Committed;
use bc_commands::door::Subject;
use bc_commands::reads::{Listed, ReservationFilter};
use bc_commands::reservations::Reserve;

/// `devices` of a request.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DevicesBody {
    /// `gpu`, `gpu.mig` or `gpu.slot`: the atoms the pool's sharing mode books.
    #[schema(value_type = String, example = "gpu")]
    pub class: DeviceClass,
    pub count: u32,
    /// `gpuModel`, `gpuProduct` and `attributes` the atoms must have.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub selector: Selector,
    /// `{"kind": "same-node"}` (the default) or `{"kind": "gang", "nodes": n}`.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub topology: Topology,
}

/// The body of `POST /v1/reservations`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReserveBody {
    pub pool_id: String,
    pub devices: DevicesBody,
    /// When the window starts (epoch milliseconds); without it, when the reservation is placed.
    pub start: Option<i64>,
    /// The window's length in seconds.
    pub duration: u64,
    /// `hold` (the default); `instance` and `node` are not offered yet.
    #[serde(default)]
    #[schema(value_type = String, example = "hold")]
    pub binding: Binding,
    pub lease_seconds: Option<u64>,
    pub project_id: Option<String>,
    /// The latest time it may still be placed (epoch milliseconds).
    pub deadline: Option<i64>,
    /// Whether it may wait in `pending` (default true).
    pub wait: Option<bool>,
    /// Spot reservations are not offered yet; `true` is refused naming the field.
    pub spot: Option<bool>,
}

impl ReserveBody {
    fn request(self) -> Result<ReservationRequest, ApiError> {
        if self.spot == Some(true) {
            return Err(ApiError::invalid_argument("spot", "spot reservations are not offered yet"));
        }
        Ok(ReservationRequest {
            pool_id: path_id::<PoolId>("poolId", &self.pool_id)?,
            devices: DeviceRequest {
                class: self.devices.class,
                count: self.devices.count,
                selector: self.devices.selector,
                topology: self.devices.topology,
            },
            start_ms: self.start,
            duration_s: self.duration,
            binding: self.binding,
            lease_seconds: self.lease_seconds,
            project_id: self.project_id.as_deref().map(|p| path_id::<ProjectId>("projectId", p)).transpose()?,
            deadline_ms: self.deadline,
            wait: self.wait.unwrap_or(true),
        })
    }
}

/// A request as the API shows it (the create body's shape).
pub fn request_json(request: &ReservationRequest) -> Value {
    let mut out = json!({
        "poolId": request.pool_id,
        "devices": request.devices,
        "duration": request.duration_s,
        "binding": request.binding,
        "wait": request.wait,
    });
    let optional = [
        ("start", request.start_ms.map(Value::from)),
        ("leaseSeconds", request.lease_seconds.map(Value::from)),
        ("projectId", request.project_id.as_ref().map(|p| Value::from(p.as_str()))),
        ("deadline", request.deadline_ms.map(Value::from)),
    ];
    for (key, value) in optional {
        if let Some(value) = value {
            out[key] = value;
        }
    }
    out
}

/// A reservation as the API shows it (the same shape as the list's items).
pub fn reservation_json(r: &Reservation) -> Value {
    json!({
        "id": r.id,
        "tenantId": r.tenant_id,
        "identity": r.identity,
        "poolId": r.request.pool_id,
        "projectId": r.request.project_id,
        "state": r.state.as_str(),
        "resource": r.request.resource(),
        "count": r.request.devices.count,
        "request": request_json(&r.request),
        "priority": r.priority,
        "requestedAt": r.requested_at_ms,
        "pendingDeadline": r.pending_deadline_ms,
        "start": r.start_ms,
        "end": r.end_ms,
        "leaseDeadline": r.lease_deadline_ms,
        "endedAt": r.ended_at_ms,
        "outcome": r.outcome,
        "allocations": r.allocations,
        "version": r.version,
    })
}

/// A command's answer: the reservation, with its position as `X-Position` (the consistency token of reads).
fn answer(status: StatusCode, committed: &Committed<Reservation>) -> Response {
    let mut response = (status, Json(reservation_json(&committed.value))).into_response();
    if let Some(position) = committed.position
        && let Ok(value) = HeaderValue::from_str(&position.to_string())
    {
        response.headers_mut().insert("x-position", value);
    }
    response
}

fn idempotency_key(headers: &HeaderMap) -> Result<String, ApiError> {
    let value = headers
        .get("idempotency-key")
        .ok_or_else(|| ApiError::invalid_argument("Idempotency-Key", "the header is required on creates"))?;
    let key = value.to_str().map_err(|_| ApiError::invalid_argument("Idempotency-Key", "must be printable text"))?;
    if key.is_empty() || key.len() > 255 {
        return Err(ApiError::invalid_argument("Idempotency-Key", "must be 1 to 255 printable characters"));
    }
    Ok(key.to_owned())
}

/// `POST /v1/reservations`: `201` with the new reservation (`placed` or `pending`), `200` with the existing one
/// for a retry with the same key and body. A request the authorizer refuses is recorded as `denied` and answered
/// `403`.
#[utoipa::path(
    post,
    path = "/v1/reservations",
    tag = "reservations",
    summary = "Reserve GPUs in a pool",
    params(("Idempotency-Key" = String, Header, description = "Names the reservation with the caller: a retry with the same key and body answers the same one")),
    request_body = ReserveBody,
    responses((status = 201, description = "Created, placed or pending; `X-Position` is its consistency token", body = Object), (status = 200, description = "A retry: the existing reservation", body = Object), (status = 409, description = "CAPACITY_UNAVAILABLE, QUOTA_EXCEEDED or IDEMPOTENCY_KEY_REUSED", body = ErrorBody), CommonErrors),
    security(("bearer" = [])),
)]
pub async fn create(
    State(state): State<AppState>,
    who: Authed,
    headers: HeaderMap,
    JsonBody(body): JsonBody<ReserveBody>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    let request = body.request()?;
    let reserved = state.app.reserve_as(&who.0, Reserve { idempotency_key: key, request }).await?;
    let status = if reserved.value.created { StatusCode::CREATED } else { StatusCode::OK };
    let committed = Committed { value: reserved.value.reservation, position: reserved.position };
    let mut response = answer(status, &committed);
    if let Ok(location) = HeaderValue::from_str(&format!("/v1/reservations/{}", committed.value.id)) {
        response.headers_mut().insert("location", location);
    }
    Ok(response)
}

/// Decides `method` on the reservation a path names: its id and the caller to run the command as.
async fn authorized(
    state: &AppState,
    who: &Authed,
    method: &'static str,
    id: &str,
) -> Result<(ReservationId, Caller), ApiError> {
    let id: ReservationId = path_id("reservationId", id)?;
    let caller = state.app.authorize(&who.0, method, Subject::Reservation(&id)).await?;
    Ok((id, caller))
}

/// `GET /v1/reservations/{id}`: read from its stream, so a reservation whose create answered is never `404`.
#[utoipa::path(
    get,
    path = "/v1/reservations/{reservation_id}",
    tag = "reservations",
    summary = "One reservation, read from its stream",
    params(("reservation_id" = String, Path, description = "The reservation id")),
    responses((status = 200, description = "The reservation", body = Object), CommonErrors),
    security(("bearer" = [])),
)]
pub async fn get(State(state): State<AppState>, who: Authed, Path(id): Path<String>) -> Result<Response, ApiError> {
    let (id, caller) = authorized(&state, &who, "reservations.get", &id).await?;
    let found = state.app.reservation(&caller, &id).await?;
    Ok(answer(StatusCode::OK, &found))
}

/// Query of `GET /v1/reservations`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
    pub cursor: Option<String>,
    /// A consistency token: answer once the read models have passed this position (as `X-Min-Position`).
    #[allow(dead_code)]
    pub after: Option<String>,
    pub pool_id: Option<String>,
    #[param(value_type = Option<String>)]
    pub state: Option<ReservationState>,
}

/// `GET /v1/reservations`: the caller's tenant's reservations, a page at a time, in id order.
#[utoipa::path(
    get,
    path = "/v1/reservations",
    tag = "reservations",
    summary = "The caller's tenant's reservations, in id order",
    params(ListParams, ("X-Min-Position" = Option<String>, Header, description = "A consistency token, as ?after=")),
    responses((status = 200, description = "A page: items and nextCursor", body = Object), (status = 503, description = "NOT_YET_CONSISTENT", body = ErrorBody), CommonErrors),
    security(("bearer" = [])),
)]
pub async fn list(
    State(state): State<AppState>,
    who: Authed,
    MinPosition(after): MinPosition,
    QueryParams(params): QueryParams<ListParams>,
) -> Result<Json<Value>, ApiError> {
    let caller = state.app.authorize(&who.0, "reservations.list", Subject::OwnTenant).await?;
    let page = PageParams { limit: params.limit, cursor: params.cursor, after: None }.page()?;
    let pool_id = params.pool_id.as_deref().map(|p| path_id::<PoolId>("poolId", p)).transpose()?;
    let filter = ReservationFilter {
        pool_id: pool_id.map(|p| p.to_string()),
        state: params.state.map(|s| s.as_str().to_owned()),
    };
    let listed = state.app.list_reservations(&caller, &filter, &page, after).await?;
    let items = listed.items.iter().map(reservation_json).collect();
    Ok(Json(page_json(Listed { items, next_key: listed.next_key })))
}

/// An optional JSON body: absent or empty means the default.
pub struct OptionalBody<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Default> FromRequest<S> for OptionalBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = axum::body::Bytes::from_request(request, state)
            .await
            .map_err(|rejection| ApiError::invalid_argument("body", rejection.body_text()))?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalBody(T::default()));
        }
        parse_json(&bytes).map(OptionalBody)
    }
}

/// Body of `cancel`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CancelBody {
    pub reason: Option<String>,
}

/// No body, or `{}`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmptyBody {}

/// Body of `extend`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExtendBody {
    /// The new end of the window (epoch milliseconds).
    pub end: i64,
}

#[utoipa::path(
    post,
    path = "/v1/reservations/{reservation_id}/cancel",
    tag = "reservations",
    summary = "Cancel before the start",
    params(("reservation_id" = String, Path, description = "The reservation id")),
    request_body = inline(Option<CancelBody>),
    responses((status = 200, description = "Cancelled", body = Object), (status = 409, description = "Wrong state: after the start, release instead", body = ErrorBody), CommonErrors),
    security(("bearer" = [])),
)]
pub async fn cancel(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    OptionalBody(body): OptionalBody<CancelBody>,
) -> Result<Response, ApiError> {
    if body.reason.as_ref().is_some_and(|r| r.len() > 1024) {
        return Err(ApiError::invalid_argument("reason", "must be at most 1024 characters"));
    }
    let (id, caller) = authorized(&state, &who, "reservations.cancel", &id).await?;
    let done = state.app.cancel_reservation(&caller, &id, body.reason).await?;
    Ok(answer(StatusCode::OK, &done))
}

#[utoipa::path(
    post,
    path = "/v1/reservations/{reservation_id}/release",
    tag = "reservations",
    summary = "Release after the start",
    params(("reservation_id" = String, Path, description = "The reservation id")),
    responses((status = 200, description = "Releasing", body = Object), (status = 409, description = "Wrong state: before the start, cancel instead", body = ErrorBody), CommonErrors),
    security(("bearer" = [])),
)]
pub async fn release(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    OptionalBody(EmptyBody {}): OptionalBody<EmptyBody>,
) -> Result<Response, ApiError> {
    let (id, caller) = authorized(&state, &who, "reservations.release", &id).await?;
    let done = state.app.release_reservation(&caller, &id).await?;
    Ok(answer(StatusCode::OK, &done))
}

#[utoipa::path(
    post,
    path = "/v1/reservations/{reservation_id}/renew",
    tag = "reservations",
    summary = "Renew the allocation lease",
    params(("reservation_id" = String, Path, description = "The reservation id")),
    responses((status = 200, description = "Renewed", body = Object), (status = 409, description = "Wrong state, or the lease already lapsed", body = ErrorBody), CommonErrors),
    security(("bearer" = [])),
)]
pub async fn renew(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    OptionalBody(EmptyBody {}): OptionalBody<EmptyBody>,
) -> Result<Response, ApiError> {
    let (id, caller) = authorized(&state, &who, "reservations.renew", &id).await?;
    let done = state.app.renew_reservation(&caller, &id).await?;
    Ok(answer(StatusCode::OK, &done))
}

/// `extend` is decided like a create for the new length: the attribute limits apply to the extended window.
#[utoipa::path(
    post,
    path = "/v1/reservations/{reservation_id}/extend",
    tag = "reservations",
    summary = "Lengthen the window on the same atoms",
    params(("reservation_id" = String, Path, description = "The reservation id")),
    request_body = ExtendBody,
    responses((status = 200, description = "Extended", body = Object), (status = 409, description = "Wrong state, another booking, or quota", body = ErrorBody), CommonErrors),
    security(("bearer" = [])),
)]
pub async fn extend(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<ExtendBody>,
) -> Result<Response, ApiError> {
    let id: ReservationId = path_id("reservationId", &id)?;
    let done = state.app.extend_as(&who.0, &id, body.end).await?;
    Ok(answer(StatusCode::OK, &done))
}
