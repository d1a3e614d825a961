//! `/v1/reservations`: create (with `Idempotency-Key`), get, list, renew, extend, cancel, release.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use bc_domain::id::{PoolId, ReservationId, TenantId};
use bc_domain::reservation::{Reservation, ReservationState};
use serde::Deserialize;

use super::consistency::MinPosition;
use super::error::{CommonErrors, ErrorBody};
use super::request::{Authed, JsonBody, OptionalBody, PageParams, QueryParams, committed_answer, next_cursor, path_id};
use super::{ApiError, AppState};
use crate::wire::ReservationPage;
use crate::wire::explanations::ReservationExplanationDto;
use crate::wire::reservations::{CancelBody, EmptyBody, ExtendBody, ReservationDto, ReserveBody};
use bc_commands::Caller;
use bc_commands::Committed;
use bc_commands::door::Subject;
use bc_commands::quotes::BookQuote;
use bc_commands::reads::ReservationFilter;
use bc_commands::reservations::Reserve;

/// A command's answer: the reservation, with its position as `X-Position` (the consistency token of reads).
fn answer(status: StatusCode, committed: &Committed<Reservation>) -> Response {
    committed_answer(status, ReservationDto::from(&committed.value), committed.position, None)
}

fn idempotency_key(headers: &HeaderMap) -> Result<String, ApiError> {
    super::request::idempotency_key(headers)?
        .ok_or_else(|| ApiError::invalid_argument("Idempotency-Key", "the header is required on creates"))
}

/// `POST /v1/reservations`: `201` with the new reservation (`placed` or `pending`), `200` with the existing one
/// for a retry with the same key and body. A request the authorizer refuses is recorded as `denied` and answered
/// `403`. With a `quote`, exactly the quoted devices are booked, or `409 QUOTE_STALE` says what changed.
#[utoipa::path(
    post,
    path = "/v1/reservations",
    tag = "reservations",
    summary = "Reserve GPUs in a pool",
    params(("Idempotency-Key" = String, Header, description = "Names the reservation with the caller: a retry with the same key and body answers the same one")),
    request_body = ReserveBody,
    responses(CommonErrors, (status = 201, description = "Created, placed or pending; `X-Position` is its consistency token", body = ReservationDto), (status = 200, description = "A retry: the existing reservation", body = ReservationDto), (status = 409, description = "CAPACITY_UNAVAILABLE, QUOTA_EXCEEDED, QUOTE_STALE (a quoted booking whose devices, nodes or quota changed) or IDEMPOTENCY_KEY_REUSED", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn create_reservation(
    State(state): State<AppState>,
    who: Authed,
    headers: HeaderMap,
    JsonBody(mut body): JsonBody<ReserveBody>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    let quote = body.quote.take();
    let request = body.request()?;
    let reserved = match quote {
        Some(quote) => state.app.book_quote_as(&who.0, BookQuote { idempotency_key: key, request, quote }).await?,
        None => state.app.reserve_as(&who.0, Reserve { idempotency_key: key, request }).await?,
    };
    let status = if reserved.value.created { StatusCode::CREATED } else { StatusCode::OK };
    let r = &reserved.value.reservation;
    let location = format!("/v1/reservations/{}", r.id);
    Ok(committed_answer(status, ReservationDto::from(r), reserved.position, Some(location)))
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
    responses(CommonErrors, (status = 200, description = "The reservation", body = ReservationDto)),
    security(("bearer" = [])),
)]
pub async fn get_reservation(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let (id, caller) = authorized(&state, &who, "reservations.get", &id).await?;
    let found = state.app.reservation(&caller, &id).await?;
    Ok(answer(StatusCode::OK, &found))
}

/// Query of `GET /v1/reservations/{id}/explanation`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ExplanationParams {
    /// A log position: the explanation as the log stood there (now when absent).
    pub at: Option<String>,
}

/// `GET /v1/reservations/{id}/explanation`: why its last placement decision went as it did, folded from its
/// stream (up to `at`), so a replay to the answered position gives the same explanation.
#[utoipa::path(
    get,
    path = "/v1/reservations/{reservation_id}/explanation",
    tag = "reservations",
    summary = "Why the reservation was placed where it is, waits, or was denied: the candidates by tier, the quota arithmetic, each passed-over node's reason",
    params(("reservation_id" = String, Path, description = "The reservation id"), ExplanationParams),
    responses(CommonErrors, (status = 200, description = "The explanation", body = ReservationExplanationDto)),
    security(("bearer" = [])),
)]
pub async fn get_explanation(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    QueryParams(params): QueryParams<ExplanationParams>,
) -> Result<Json<ReservationExplanationDto>, ApiError> {
    let (id, caller) = authorized(&state, &who, "reservations.get", &id).await?;
    let at = match params.at.as_deref() {
        Some(at) => Some(path_id::<bc_eventstore::Position>("at", at)?),
        None => None,
    };
    let (explanation, position) = state.app.explanation(&caller, &id, at).await?;
    Ok(Json(ReservationExplanationDto {
        reservation_id: id.to_string(),
        position: position.to_string(),
        explanation: (&explanation).into(),
    }))
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
    responses(CommonErrors, (status = 200, description = "A page: items and nextCursor", body = ReservationPage), (status = 503, description = "NOT_YET_CONSISTENT", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn list_reservations(
    State(state): State<AppState>,
    who: Authed,
    MinPosition(after): MinPosition,
    QueryParams(params): QueryParams<ListParams>,
) -> Result<Json<ReservationPage>, ApiError> {
    let caller = state.app.authorize(&who.0, "reservations.list", Subject::OwnTenant).await?;
    let (page, filter) = page_and_filter(params.limit, params.cursor, params.pool_id, params.state)?;
    let listed = state.app.list_reservations(&caller, &filter, &page, after).await?;
    Ok(Json(reservation_page(&listed)))
}

/// A list's page and its filter, each parameter checked and named when it is wrong.
fn page_and_filter(
    limit: Option<u32>,
    cursor: Option<String>,
    pool_id: Option<String>,
    state: Option<ReservationState>,
) -> Result<(bc_commands::reads::Page, ReservationFilter), ApiError> {
    let page = PageParams { limit, cursor, after: None }.page()?;
    let pool_id = pool_id.as_deref().map(|p| path_id::<PoolId>("poolId", p)).transpose()?;
    let filter =
        ReservationFilter { pool_id: pool_id.map(|p| p.to_string()), state: state.map(|s| s.as_str().to_owned()) };
    Ok((page, filter))
}

fn reservation_page(listed: &bc_commands::reads::Listed<Reservation>) -> ReservationPage {
    ReservationPage { items: listed.items.iter().map(Into::into).collect(), next_cursor: next_cursor(&listed.next_key) }
}

/// The query of `GET /v1/fleet/reservations`: [`ListParams`] and the tenant.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct FleetListParams {
    /// One tenant's reservations; every tenant's when left out.
    pub tenant: Option<String>,
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

/// `GET /v1/fleet/reservations`: every tenant's reservations, for the platform's operators.
#[utoipa::path(
    get,
    path = "/v1/fleet/reservations",
    tag = "reservations",
    summary = "Every tenant's reservations (or one tenant's, with ?tenant=), in id order: for the root tenant's administrators",
    params(FleetListParams, ("X-Min-Position" = Option<String>, Header, description = "A consistency token, as ?after=")),
    responses(CommonErrors, (status = 200, description = "A page: items and nextCursor", body = ReservationPage), (status = 503, description = "NOT_YET_CONSISTENT", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn list_fleet_reservations(
    State(state): State<AppState>,
    who: Authed,
    MinPosition(after): MinPosition,
    QueryParams(params): QueryParams<FleetListParams>,
) -> Result<Json<ReservationPage>, ApiError> {
    let caller = state.app.authorize(&who.0, "fleet.reservations.list", Subject::Fleet).await?;
    let tenant = params.tenant.as_deref().map(|t| path_id::<TenantId>("tenant", t)).transpose()?;
    let (page, filter) = page_and_filter(params.limit, params.cursor, params.pool_id, params.state)?;
    let listed = state.app.list_fleet_reservations(&caller, tenant.as_ref(), &filter, &page, after).await?;
    Ok(Json(reservation_page(&listed)))
}

#[utoipa::path(
    post,
    path = "/v1/reservations/{reservation_id}/cancel",
    tag = "reservations",
    summary = "Cancel before the start",
    params(("reservation_id" = String, Path, description = "The reservation id")),
    request_body = inline(Option<CancelBody>),
    responses(CommonErrors, (status = 200, description = "Cancelled", body = ReservationDto), (status = 409, description = "Wrong state: after the start, release instead", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn cancel_reservation(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    OptionalBody(body): OptionalBody<CancelBody>,
) -> Result<Response, ApiError> {
    if body.reason.as_ref().is_some_and(|r| r.chars().count() > 1024) {
        return Err(ApiError::invalid_argument("reason", "must be at most 1024 characters"));
    }
    let id: ReservationId = path_id("reservationId", &id)?;
    let done = state.app.cancel_as(&who.0, &id, body.reason).await?;
    Ok(answer(StatusCode::OK, &done))
}

#[utoipa::path(
    post,
    path = "/v1/reservations/{reservation_id}/release",
    tag = "reservations",
    summary = "Release after the start",
    params(("reservation_id" = String, Path, description = "The reservation id")),
    responses(CommonErrors, (status = 200, description = "Releasing", body = ReservationDto), (status = 409, description = "Wrong state: before the start, cancel instead", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn release_reservation(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    OptionalBody(EmptyBody {}): OptionalBody<EmptyBody>,
) -> Result<Response, ApiError> {
    let id: ReservationId = path_id("reservationId", &id)?;
    let done = state.app.release_as(&who.0, &id).await?;
    Ok(answer(StatusCode::OK, &done))
}

#[utoipa::path(
    post,
    path = "/v1/reservations/{reservation_id}/renew",
    tag = "reservations",
    summary = "Renew the allocation lease",
    params(("reservation_id" = String, Path, description = "The reservation id")),
    responses(CommonErrors, (status = 200, description = "Renewed", body = ReservationDto), (status = 409, description = "Wrong state, or the lease already lapsed", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn renew_reservation(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    OptionalBody(EmptyBody {}): OptionalBody<EmptyBody>,
) -> Result<Response, ApiError> {
    let id: ReservationId = path_id("reservationId", &id)?;
    let done = state.app.renew_as(&who.0, &id).await?;
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
    responses(CommonErrors, (status = 200, description = "Extended", body = ReservationDto), (status = 409, description = "Wrong state, another booking, or quota", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn extend_reservation(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<ExtendBody>,
) -> Result<Response, ApiError> {
    let id: ReservationId = path_id("reservationId", &id)?;
    let done = state.app.extend_as(&who.0, &id, body.end).await?;
    Ok(answer(StatusCode::OK, &done))
}
