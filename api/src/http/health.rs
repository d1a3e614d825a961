//! `GET /v1/healthz`: 200 while the database answers, 503 `UNAVAILABLE` while it does not.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use super::openapi::ErrorBody;
use super::{ApiError, AppState};

/// How long the health check waits for the database.
const PING_TIMEOUT: Duration = Duration::from_secs(2);

#[utoipa::path(
    get,
    path = "/v1/healthz",
    tag = "health",
    summary = "Whether the service and its database answer",
    responses((status = 200, description = "Healthy", body = Object), (status = 503, description = "The database does not answer", body = ErrorBody)),
)]
pub async fn healthz(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    // A read-only ping holds no locks and appends nothing, so abandoning it at the timeout is safe.
    match tokio::time::timeout(PING_TIMEOUT, state.db().ping()).await {
        Ok(Ok(())) => Ok(Json(json!({"status": "ok", "database": "reachable"}))),
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "health check: the database did not answer");
            Err(ApiError::unavailable("the database is unreachable"))
        }
        Err(_) => {
            tracing::warn!("health check: the database did not answer in time");
            Err(ApiError::unavailable("the database did not answer in time"))
        }
    }
}
