//! `GET /v1/projections`: each read model's versions, positions and lag, honouring a consistency token.

use axum::Json;
use axum::extract::State;
use bc_projections::{consistency, models, status};
use serde_json::{Value, json};

use super::consistency::{MinPosition, not_yet_consistent};
use super::error::{CommonErrors, ErrorBody};
use super::request::Authed;
use super::{ApiError, AppState};
use bc_commands::auth::{Resource, Target};
use bc_commands::reads::CONSISTENCY_WAIT;

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
    let fleet = Resource::scope(Target::Fleet, &who.principal.tenant_id);
    state.authorize(&who, "projections.status", Some(&fleet), "fleet", "global").await?;
    let read_models = models::read_models();
    let names: Vec<&str> = read_models.iter().map(|p| p.name()).collect();
    if let Some(after) = after {
        match consistency::wait_for(state.db(), &names, after, CONSISTENCY_WAIT).await {
            Ok(None) => {}
            Ok(Some(reached)) => return Err(not_yet_consistent(after, reached)),
            Err(err) => return Err(err.into()),
        }
    }
    let rows = status::status(state.db(), &read_models).await?;
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
