//! `/v1/ramdisk/*`: the routes `bcd ramdisk` calls. The claim authenticates with the single-use boot credential
//! of the machine's iPXE script, in its body; the others with the session it answers (`Authorization: Bearer
//! rds_...`), which names one workflow of one machine, so they take neither from the caller. Like the agent's
//! routes they sit outside the IAM method table.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use bc_commands::ramdisk::RamdiskAuth;
use bc_domain::agent::{RamdiskClaim, RamdiskReport};

use super::error::CommonErrors;
use super::request::JsonBody;
use super::{ApiError, AppState};
use crate::wire::agent::{RamdiskSessionDto, RamdiskWorkDto, StepReportedDto};

/// A request authenticated by a ramdisk session.
#[derive(Debug, Clone)]
pub struct RamdiskAuthed(pub RamdiskAuth);

impl axum::extract::FromRequestParts<AppState> for RamdiskAuthed {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let header = parts.headers.get("authorization").and_then(|v| v.to_str().ok());
        let Some(token) = header.and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer "))) else {
            return Err(ApiError::unauthenticated("send the ramdisk session as `Authorization: Bearer rds_...`"));
        };
        Ok(RamdiskAuthed(state.app.ramdisk_auth(token.trim()).await?))
    }
}

/// `POST /v1/ramdisk/sessions`: a ramdisk claims its session with its boot credential.
#[utoipa::path(
    post,
    path = "/v1/ramdisk/sessions",
    tag = "ramdisk",
    summary = "Claim a ramdisk session with the boot credential of the machine's iPXE script (once; a later boot's \
               claim ends the earlier session)",
    request_body(content = Object, description = "bootToken"),
    responses(CommonErrors, (status = 201, description = "The session", body = RamdiskSessionDto)),
)]
pub async fn claim_session(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<RamdiskClaim>,
) -> Result<Response, ApiError> {
    let session = state.app.claim_ramdisk_session(&body.boot_token).await?;
    Ok((StatusCode::CREATED, Json(RamdiskSessionDto::from(&session))).into_response())
}

/// `GET /v1/ramdisk/work`: the session's workflow and its running ramdisk step.
#[utoipa::path(
    get,
    path = "/v1/ramdisk/work",
    tag = "ramdisk",
    summary = "Where the ramdisk's workflow is: its running ramdisk step with the image to write or the deployed \
               machine's configuration, or that it ended",
    responses(CommonErrors, (status = 200, description = "The work", body = RamdiskWorkDto)),
    security(("ramdisk" = [])),
)]
pub async fn work(State(state): State<AppState>, RamdiskAuthed(auth): RamdiskAuthed) -> Result<Response, ApiError> {
    let work = state.app.ramdisk_work(&auth).await?;
    Ok(Json(RamdiskWorkDto::from(&work)).into_response())
}

/// `POST /v1/ramdisk/steps/{index}`: how an attempt of a ramdisk step ended.
#[utoipa::path(
    post,
    path = "/v1/ramdisk/steps/{index}",
    tag = "ramdisk",
    summary = "Report an attempt of a ramdisk step of the session's workflow (idempotent; refused on another \
               attempt, a step that runs elsewhere, or after the end); an inspection reports the inventory",
    params(("index" = u32, Path, description = "The step's index")),
    request_body(content = Object, description = "attempt, ok, message, inventory"),
    responses(CommonErrors, (status = 200, description = "Recorded", body = StepReportedDto)),
    security(("ramdisk" = [])),
)]
pub async fn report_step(
    State(state): State<AppState>,
    RamdiskAuthed(auth): RamdiskAuthed,
    Path(index): Path<String>,
    JsonBody(body): JsonBody<RamdiskReport>,
) -> Result<Response, ApiError> {
    let index: u32 = index.parse().map_err(|_| ApiError::invalid_argument("index", "is not a step index"))?;
    state.app.report_ramdisk_step(&auth, index, &body).await?;
    Ok(Json(StepReportedDto { workflow_id: auth.workflow_id.to_string(), index }).into_response())
}
