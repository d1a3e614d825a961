//! `POST /v1/pools/{id}/quotes`: the exact devices and window a request would get now, and the signed token that
//! books them through `POST /v1/reservations`.

use axum::Json;
use axum::extract::{Path, State};
use bc_domain::id::PoolId;

use super::error::{CommonErrors, ErrorBody};
use super::request::{Authed, JsonBody, path_id};
use super::{ApiError, AppState};
use crate::wire::quotes::{QuoteBody, QuoteDto};
use bc_commands::quotes::AskQuote;

/// `POST /v1/pools/{pool_id}/quotes`: writes nothing.
#[utoipa::path(
    post,
    path = "/v1/pools/{pool_id}/quotes",
    tag = "reservations",
    summary = "Quote a request: the exact devices and window it would get now, and the token that books them",
    description = "Decided as `pools.quote` on the pool and as `reservations.create` on the draft, so a quote is only \
                   given for what the caller could book. The placement is the reservation's own: the earliest start \
                   (or exactly `start`) at which the request fits the pool within the caller's quota at every \
                   instant of the window. Book it by sending `reserve` unchanged to `POST /v1/reservations` before \
                   `expiresAt`: it gets exactly these devices, or `409 QUOTE_STALE` naming what changed. Nothing is \
                   written.",
    params(("pool_id" = String, Path, description = "The pool id")),
    request_body = QuoteBody,
    responses(CommonErrors, (status = 200, description = "The quote", body = QuoteDto), (status = 409, description = "CAPACITY_UNAVAILABLE (it fits nowhere within 366 days, or not at `start`) or QUOTA_EXCEEDED (the quota can never admit it)", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn quote_reservation(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<QuoteBody>,
) -> Result<Json<QuoteDto>, ApiError> {
    let id: PoolId = path_id("poolId", &id)?;
    let (request, not_before_ms) = body.request(&id)?;
    let quote = state.app.quote_as(&who.0, &AskQuote { request, not_before_ms }).await?;
    Ok(Json(QuoteDto::from(&quote)))
}
