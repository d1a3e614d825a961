//! Machines from their BMC: enrolment, and moves of a node's lifecycle.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use bc_commands::door::Subject;
use bc_commands::lifecycle::EnrolNode;
use bc_domain::id::{NodeId, PoolId};
use bc_domain::node::NodeBmc;
use bc_domain::node::lifecycle::default_drivers;

use super::error::{CommonErrors, ErrorBody};
use super::request::{Authed, JsonBody, committed_answer, path_id};
use super::{ApiError, AppState};
use crate::wire::CreatedDto;
use crate::wire::nodes::{EnrolBody, NodeChangedDto, ProvisionBody};

/// `POST /v1/nodes/enrol`.
#[utoipa::path(
    post,
    path = "/v1/nodes/enrol",
    tag = "nodes",
    summary = "Enrol a machine by its BMC into a pool the caller operates",
    description = "The node starts in `enrolling`, without devices until it is inspected. The BMC's credentials are \
                   sealed with the control plane's key: they are never shown, and never in an event. A stuck \
                   transitional state goes to `failed` once its limit passes.",
    request_body = EnrolBody,
    responses(CommonErrors, (status = 201, description = "Enrolled", body = CreatedDto), (status = 409, description = "The name is taken", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn enrol_node(
    State(state): State<AppState>,
    who: Authed,
    JsonBody(body): JsonBody<EnrolBody>,
) -> Result<Response, ApiError> {
    let pool_id: PoolId = path_id("poolId", &body.pool_id)?;
    let caller = state.app.authorize(&who.0, "nodes.enrol", Subject::Pool(&pool_id)).await?;
    let bmc = NodeBmc {
        driver: body.bmc.driver,
        address: body.bmc.address,
        system_id: body.bmc.system_id,
        insecure_tls: body.bmc.insecure_tls,
        drivers: default_drivers(body.bmc.driver, &body.drivers),
        boot_mac: body.boot_mac.as_deref().map(bc_domain::node::lifecycle::normalize_mac).transpose()?,
    };
    let input = EnrolNode { pool_id, name: body.name, bmc, username: body.bmc.username, password: body.bmc.password };
    let done = state.app.enrol_node(&caller, input).await?;
    let location = format!("/v1/nodes/{}", done.value);
    Ok(committed_answer(StatusCode::CREATED, CreatedDto { id: done.value.to_string() }, done.position, Some(location)))
}

/// `POST /v1/nodes/{node_id}/provision-state`.
#[utoipa::path(
    post,
    path = "/v1/nodes/{node_id}/provision-state",
    tag = "nodes",
    summary = "Move a node's lifecycle (provisionState) to the state given, as the lifecycle allows",
    description = "A move the lifecycle does not allow is a CONFLICT naming the state the node is in and where it \
                   may go.",
    params(("node_id" = String, Path, description = "The node id")),
    request_body = ProvisionBody,
    responses(CommonErrors, (status = 200, description = "Moved", body = NodeChangedDto)),
    security(("bearer" = [])),
)]
pub async fn change_provision_state(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<ProvisionBody>,
) -> Result<Response, ApiError> {
    let id: NodeId = path_id("nodeId", &id)?;
    let caller = state.app.authorize(&who.0, "nodes.provision", Subject::Node(&id)).await?;
    let done = state.app.change_provision_state(&caller, &id, body.state, body.reason).await?;
    Ok(committed_answer(StatusCode::OK, NodeChangedDto { id: id.to_string() }, done.position, None))
}
