//! `GET /v1/projections`: each read model's versions, positions and lag, honouring a consistency token.

use crate::wire::ops::ProjectionsDto;
use axum::Json;
use axum::extract::State;

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
    responses(CommonErrors, (status = 200, description = "The versions", body = ProjectionsDto), (status = 503, description = "NOT_YET_CONSISTENT", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn projection_status(
    State(state): State<AppState>,
    who: Authed,
    MinPosition(after): MinPosition,
) -> Result<Json<ProjectionsDto>, ApiError> {
    state.app.authorize(&who.0, "projections.status", Subject::Fleet).await?;
    let rows = state.app.projection_status(after).await?;
    Ok(Json(ProjectionsDto { items: rows.iter().map(Into::into).collect() }))
}
