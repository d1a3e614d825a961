//! Workflows: started on a machine, read, cancelled.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use bc_commands::door::Subject;
use bc_domain::id::{NodeId, ProfileId, WorkflowId};

use super::error::{CommonErrors, ErrorBody};
use super::request::{Authed, JsonBody, OptionalBody, QueryParams, committed_answer, path_id};
use super::{ApiError, AppState};
use crate::wire::workflows::{CancelWorkflowBody, WorkflowBody, WorkflowDto, WorkflowList};

/// `POST /v1/nodes/{node_id}/workflows`.
#[utoipa::path(
    post,
    path = "/v1/nodes/{node_id}/workflows",
    tag = "provisioning",
    summary = "Start a workflow on a machine enrolled from its BMC: an inspection, a deployment or a release",
    description = "The machine moves into the state the workflow runs in (inspecting, deploying, releasing) in the \
                   same transaction; the workflow's end moves it on (ready, deployed, ready) or to failed. One \
                   workflow runs on a machine at a time.",
    params(("node_id" = String, Path, description = "The node id")),
    request_body = WorkflowBody,
    responses(CommonErrors, (status = 201, description = "Started", body = WorkflowDto), (status = 409, description = "The machine is in another state, or runs another workflow", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn create_workflow(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<WorkflowBody>,
) -> Result<Response, ApiError> {
    let node: NodeId = path_id("nodeId", &id)?;
    let profile: Option<ProfileId> = body.profile_id.as_deref().map(|p| path_id("profileId", p)).transpose()?;
    let caller = state.app.authorize(&who.0, "workflows.create", Subject::Node(&node)).await?;
    let done = state.app.start_workflow(&caller, &node, body.kind, profile.as_ref()).await?;
    let workflow = state.app.workflow(&done.value).await?;
    let location = format!("/v1/workflows/{}", done.value);
    Ok(committed_answer(StatusCode::CREATED, WorkflowDto::from(&workflow), done.position, Some(location)))
}

/// `?limit=` of a machine's workflows.
#[derive(Debug, Clone, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WorkflowListParams {
    /// The newest this many (20 by default, at most 100).
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u32>,
}

/// `GET /v1/nodes/{node_id}/workflows`.
#[utoipa::path(
    get,
    path = "/v1/nodes/{node_id}/workflows",
    tag = "provisioning",
    summary = "A machine's workflows, newest first",
    params(("node_id" = String, Path, description = "The node id"), WorkflowListParams),
    responses(CommonErrors, (status = 200, description = "The workflows", body = WorkflowList)),
    security(("bearer" = [])),
)]
pub async fn list_workflows(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    QueryParams(params): QueryParams<WorkflowListParams>,
) -> Result<Json<WorkflowList>, ApiError> {
    let node: NodeId = path_id("nodeId", &id)?;
    let limit = params.limit.unwrap_or(20);
    if limit == 0 || limit > 100 {
        return Err(ApiError::invalid_argument("limit", "must be from 1 to 100"));
    }
    state.app.authorize(&who.0, "workflows.list", Subject::Node(&node)).await?;
    let found = state.app.node_workflows(&node, limit).await?;
    Ok(Json(WorkflowList { items: found.iter().map(Into::into).collect() }))
}

/// `GET /v1/workflows/{workflow_id}`.
#[utoipa::path(
    get,
    path = "/v1/workflows/{workflow_id}",
    tag = "provisioning",
    summary = "A workflow, its steps and where each is",
    params(("workflow_id" = String, Path, description = "The workflow id")),
    responses(CommonErrors, (status = 200, description = "The workflow", body = WorkflowDto)),
    security(("bearer" = [])),
)]
pub async fn get_workflow(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
) -> Result<Json<WorkflowDto>, ApiError> {
    let id: WorkflowId = path_id("workflowId", &id)?;
    state.app.authorize(&who.0, "workflows.get", Subject::Workflow(&id)).await?;
    Ok(Json((&state.app.workflow(&id).await?).into()))
}

/// `POST /v1/workflows/{workflow_id}/cancel`.
#[utoipa::path(
    post,
    path = "/v1/workflows/{workflow_id}/cancel",
    tag = "provisioning",
    summary = "Cancel a running workflow; its machine goes to failed",
    params(("workflow_id" = String, Path, description = "The workflow id")),
    request_body = inline(Option<CancelWorkflowBody>),
    responses(CommonErrors, (status = 200, description = "Cancelled", body = WorkflowDto), (status = 409, description = "It has ended", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn cancel_workflow(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    OptionalBody(body): OptionalBody<CancelWorkflowBody>,
) -> Result<Response, ApiError> {
    let id: WorkflowId = path_id("workflowId", &id)?;
    let caller = state.app.authorize(&who.0, "workflows.cancel", Subject::Workflow(&id)).await?;
    let done = state.app.cancel_workflow(&caller, &id, body.reason).await?;
    let workflow = state.app.workflow(&id).await?;
    Ok(committed_answer(StatusCode::OK, WorkflowDto::from(&workflow), done.position, None))
}
