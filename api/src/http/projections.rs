//! `GET /v1/projections`: each read model's versions, positions and lag, honouring a consistency token.

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use super::consistency::MinPosition;
use super::error::{CommonErrors, ErrorBody};
use super::request::Authed;
use super::{ApiError, AppState};
use bc_commands::door::Subject;

/// `GET /v1/projections`: for the platform (decided on `fleet/global`, which resolves only in the root tenant).
#[utoipa::path(
    get,
    path = "/v1/projections",
    tag = "operations",
    summary = "Each read model version's position, lag and state (the platform only)",
    params(("after" = Option<String>, Query, description = "A consistency token"), ("X-Min-Position" = Option<String>, Header, description = "A consistency token, as ?after=")),
    responses((status = 200, description = "The versions", body = Object), (status = 503, description = "NOT_YET_CONSISTENT", body = ErrorBody), CommonErrors),
    security(("bearer" = [])),
)]
pub async fn list(
    State(state): State<AppState>,
    who: Authed,
    MinPosition(after): MinPosition,
) -> Result<Json<Value>, ApiError> {
    state.app.authorize(&who.0, "projections.status", Subject::Fleet).await?;
    let rows = state.app.projection_status(after).await?;
    let items: Vec<Value> = rows
        .into_iter()
        .map(|row| {
            json!({
                "name": row.name,
                "version": row.version,
                "state": row.state,
                "active": row.active,
                "position": row.position.to_string(),
                "eventsApplied": row.events_applied,
                "lagEvents": row.lag_events,
                "lagSeconds": if row.lag_seconds.is_finite() { json!(row.lag_seconds) } else { Value::Null },
            })
        })
        .collect();
    Ok(Json(json!({ "items": items })))
}
