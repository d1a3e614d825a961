//! What probes and scrapers read: `GET /v1/healthz` (200 while the database answers, 503 `UNAVAILABLE` while it
//! does not) and `GET /metrics`.

use std::time::Duration;

use crate::wire::ops::HealthDto;
use axum::Json;
use axum::extract::State;
use axum::response::Response;

use super::error::ErrorBody;
use super::{ApiError, AppState};
use bc_commands::figures::Unhealthy;

/// How long the health check waits for the database.
const PING_TIMEOUT: Duration = Duration::from_secs(2);

#[utoipa::path(
    get,
    path = "/v1/healthz",
    tag = "health",
    summary = "Whether the service and its database answer",
    responses((status = 200, description = "Healthy", body = HealthDto), (status = 503, description = "The database does not answer", body = ErrorBody)),
)]
pub async fn healthz(State(state): State<AppState>) -> Result<Json<HealthDto>, ApiError> {
    match state.app.ping(PING_TIMEOUT).await {
        Ok(()) => Ok(Json(HealthDto { status: "ok".to_owned(), database: "reachable".to_owned() })),
        Err(Unhealthy::Unreachable(err)) => Err(ApiError::unavailable("the database is unreachable").with_cause(err)),
        Err(Unhealthy::TimedOut) => Err(ApiError::unavailable("the database did not answer in time")),
    }
}

/// `GET /metrics`: open like the health check (it names no tenant's records; keep it on the operators'
/// network). `503 UNAVAILABLE` when the database does not answer.
pub async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let figures = state.app.database_figures().await?;
    let scrape = crate::metrics::Scrape {
        figures,
        connections: state.app.connections(),
        follow_ups: state.app.db().follow_up_figures(),
        denials: state.app.denials(),
        subscribers: state.events.subscribers(),
        listener: state.connections.clone(),
    };
    Ok(crate::metrics::exposition(&state.metrics, scrape))
}
