//! `/v1/agent/*`: the routes `bcd` calls. The join authenticates with a join token in its body; every other
//! route with the node credential (`Authorization: Bearer nc_...`), which names the node, so these routes take
//! no node id from the caller. They sit outside the IAM method table: a node is not a tenant's principal.

use axum::Json;
use axum::extract::ConnectInfo;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use bc_domain::agent::{Ack, CertificateRequest, Heartbeat, JoinRequest, SessionRequest};
use bc_domain::id::CommandId;
use bc_domain::inventory::InventoryReport;
use serde::Deserialize;

use super::error::{CommonErrors, ErrorBody};
use super::request::{JsonBody, QueryParams, path_id};
use super::{ApiError, AppState};
use crate::tls::Peer;
use crate::wire::agent::{
    AckedDto, CertificateRequestDto, CommandsDto, CredentialDto, HeartbeatReplyDto, InventoryAcceptedDto, JoinedDto,
    NodeCertificateDto, SessionDto,
};
use bc_commands::agents::{NodeAuth, check_certified};

/// A request authenticated by a node credential.
#[derive(Debug, Clone)]
pub struct NodeAuthed(pub NodeAuth);

impl axum::extract::FromRequestParts<AppState> for NodeAuthed {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let NodeCredential(credential) = NodeCredential::from_request_parts(parts, state).await?;
        let certified = Certified::from_request_parts(parts, state).await?.required()?;
        let node = state.app.authenticate_node(&credential).await?;
        check_certified(&node, certified.as_deref())?;
        Ok(NodeAuthed(node))
    }
}

/// What the connection's client certificate says, where node routes need one: on a TLS connection to a
/// control plane with a PKI, every node route but the join (and a first certificate) requires the node's
/// certificate, and the credential must be that node's. Plain connections (a proxy terminating TLS, the HTTP
/// layer's own tests) need none.
#[derive(Debug, Clone)]
pub enum Certified {
    /// No certificate is needed on this connection.
    NotRequired,
    /// A verified certificate naming this node.
    Node(String),
    /// A certificate is needed and none was presented.
    Missing,
}

impl Certified {
    /// The node the certificate names, or `UNAUTHENTICATED` when one is needed and missing.
    fn required(self) -> Result<Option<String>, ApiError> {
        match self {
            Certified::NotRequired => Ok(None),
            Certified::Node(node) => Ok(Some(node)),
            Certified::Missing => Err(missing_certificate()),
        }
    }
}

fn missing_certificate() -> ApiError {
    ApiError::unauthenticated(
        "nodes speak mutual TLS with this control plane: present the node certificate the join answered",
    )
}

impl axum::extract::FromRequestParts<AppState> for Certified {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let Some(ConnectInfo(peer)) = parts.extensions.get::<ConnectInfo<Peer>>() else {
            return Ok(Certified::NotRequired);
        };
        if !peer.tls || state.app.pki().is_none() {
            return Ok(Certified::NotRequired);
        }
        Ok(match &peer.certificate {
            Some(certificate) => Certified::Node(certificate.common_name.clone()),
            None => Certified::Missing,
        })
    }
}

/// The node credential a request carries, not yet looked up (the heartbeat looks it up in its own statement).
#[derive(Debug, Clone)]
pub struct NodeCredential(pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for NodeCredential {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let header = parts.headers.get("authorization").and_then(|v| v.to_str().ok());
        let Some(credential) = header.and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer ")))
        else {
            return Err(ApiError::unauthenticated("send the node credential as `Authorization: Bearer nc_...`"));
        };
        Ok(NodeCredential(credential.trim().to_owned()))
    }
}

/// `POST /v1/agent/join`: a machine joins the pool of its join token.
#[utoipa::path(
    post,
    path = "/v1/agent/join",
    tag = "agent",
    summary = "Join a pool with a join token; answers the node's credential and a first session",
    request_body(content = Object, description = "JoinRequest: joinToken, agentVersion, inventory (every section)"),
    responses(CommonErrors, (status = 201, description = "Joined (or recognised as an existing node)", body = JoinedDto), (status = 409, description = "The machine is another pool's node, or its name or devices are taken", body = ErrorBody)),
)]
pub async fn join(State(state): State<AppState>, JsonBody(body): JsonBody<JoinRequest>) -> Result<Response, ApiError> {
    let joined = state.app.join(body).await?;
    Ok((StatusCode::CREATED, Json(JoinedDto::from(&joined))).into_response())
}

/// `POST /v1/agent/sessions`: an agent (re)starting opens a session.
#[utoipa::path(
    post,
    path = "/v1/agent/sessions",
    tag = "agent",
    summary = "Open a session with the node credential (ends any earlier one)",
    request_body(content = Object, description = "SessionRequest: agentVersion"),
    responses(CommonErrors, (status = 201, description = "The session", body = SessionDto)),
    security(("node" = [])),
)]
pub async fn open_session(
    State(state): State<AppState>,
    NodeAuthed(node): NodeAuthed,
    JsonBody(body): JsonBody<SessionRequest>,
) -> Result<Response, ApiError> {
    let session = state.app.open_session(&node, &body.agent_version).await?;
    Ok((StatusCode::CREATED, Json(SessionDto::from(&session))).into_response())
}

/// `POST /v1/agent/credential`: rotates the node credential.
#[utoipa::path(
    post,
    path = "/v1/agent/credential",
    tag = "agent",
    summary = "Rotate the node credential: the new one (shown once) replaces the current one at its first use",
    responses(CommonErrors, (status = 201, description = "The new credential", body = CredentialDto)),
    security(("node" = [])),
)]
pub async fn rotate_credential(
    State(state): State<AppState>,
    NodeAuthed(node): NodeAuthed,
) -> Result<Response, ApiError> {
    let credential = state.app.rotate_credential(&node).await?;
    let body = CredentialDto { node_id: node.node_id.to_string(), credential };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// `POST /v1/agent/certificate`: signs the node's next certificate.
#[utoipa::path(
    post,
    path = "/v1/agent/certificate",
    tag = "agent",
    summary = "Sign the node's next certificate for a CSR (before the current one expires; without one only when the node holds no live certificate)",
    request_body(content = CertificateRequestDto, description = "A certificate signing request for the node's key"),
    responses(CommonErrors, (status = 201, description = "The certificate", body = NodeCertificateDto)),
    security(("node" = [])),
)]
pub async fn issue_certificate(
    State(state): State<AppState>,
    NodeCredential(credential): NodeCredential,
    certified: Certified,
    JsonBody(body): JsonBody<CertificateRequest>,
) -> Result<Response, ApiError> {
    let node = state.app.authenticate_node(&credential).await?;
    match certified {
        Certified::NotRequired => {}
        Certified::Node(name) => check_certified(&node, Some(&name))?,
        // A node whose certificate expired (or that joined before the control plane had a PKI) gets one with
        // its credential alone; a node that holds a live certificate must present it.
        Certified::Missing => {
            if state.app.node_has_live_certificate(&node.node_id).await? {
                return Err(missing_certificate());
            }
        }
    }
    let issued = state.app.issue_node_certificate(&node, &body).await?;
    Ok((StatusCode::CREATED, Json(NodeCertificateDto::from(&issued))).into_response())
}

/// `POST /v1/agent/heartbeat`: renews the session's liveness lease.
#[utoipa::path(
    post,
    path = "/v1/agent/heartbeat",
    tag = "agent",
    summary = "Renew the liveness lease; answers the generation, the spec when newer, and whether commands wait",
    request_body(content = Object, description = "Heartbeat: sessionId, observedGeneration, clockMs, and optionally gpuUtilization, one {gpu, percent} per GPU (its UUID; 0 to 100)"),
    responses(CommonErrors, (status = 200, description = "Renewed", body = HeartbeatReplyDto), (status = 409, description = "The session was replaced", body = ErrorBody)),
    security(("node" = [])),
)]
pub async fn heartbeat(
    State(state): State<AppState>,
    NodeCredential(credential): NodeCredential,
    certified: Certified,
    JsonBody(body): JsonBody<Heartbeat>,
) -> Result<Response, ApiError> {
    let certified = certified.required()?;
    let reply = state.app.heartbeat_with_credential(&credential, &body, certified.as_deref()).await?;
    Ok(Json(HeartbeatReplyDto::from(&reply)).into_response())
}

/// `POST /v1/agent/inventory`: the node's inventory, only the changed sections with every hash.
#[utoipa::path(
    post,
    path = "/v1/agent/inventory",
    tag = "agent",
    summary = "Report the inventory: every section's hash and the sections the control plane lacks",
    request_body(content = Object, description = "InventoryReport"),
    responses(CommonErrors, (status = 200, description = "Accepted: the current snapshot", body = InventoryAcceptedDto), (status = 409, description = "A section the control plane does not hold is missing: send it whole", body = ErrorBody)),
    security(("node" = [])),
)]
pub async fn report_inventory(
    State(state): State<AppState>,
    NodeAuthed(node): NodeAuthed,
    JsonBody(body): JsonBody<InventoryReport>,
) -> Result<Response, ApiError> {
    let accepted = state.app.report_inventory(&node, body).await?;
    Ok(Json(InventoryAcceptedDto::from(&accepted)).into_response())
}

/// Query of `GET /v1/agent/commands`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct CommandsParams {
    /// At most this many (1 to 100, default 20).
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u32>,
}

/// `GET /v1/agent/commands`: the commands deliverable now, in `seq` order.
#[utoipa::path(
    get,
    path = "/v1/agent/commands",
    tag = "agent",
    summary = "The node's commands deliverable now, in seq order",
    params(CommandsParams),
    responses(CommonErrors, (status = 200, description = "Commands", body = CommandsDto)),
    security(("node" = [])),
)]
pub async fn agent_commands(
    State(state): State<AppState>,
    NodeAuthed(node): NodeAuthed,
    QueryParams(params): QueryParams<CommandsParams>,
) -> Result<Response, ApiError> {
    let limit = params.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::invalid_argument("limit", "must be from 1 to 100"));
    }
    let commands = state.app.agent_commands(&node, limit).await?;
    Ok(Json(CommandsDto::from(commands.as_slice())).into_response())
}

/// `POST /v1/agent/commands/{command_id}/ack`: the outcome of a command, idempotently.
#[utoipa::path(
    post,
    path = "/v1/agent/commands/{command_id}/ack",
    tag = "agent",
    summary = "Acknowledge a command of this node (idempotent)",
    params(("command_id" = String, Path, description = "The command id")),
    request_body(content = Object, description = "Ack: ok, message"),
    responses(CommonErrors, (status = 200, description = "The command's state", body = AckedDto)),
    security(("node" = [])),
)]
pub async fn ack_command(
    State(state): State<AppState>,
    NodeAuthed(node): NodeAuthed,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<Ack>,
) -> Result<Response, ApiError> {
    let id: CommandId = path_id("commandId", &id)?;
    let command_state = state.app.acknowledge_command(&node, &id, &body).await?;
    Ok(Json(AckedDto { id: id.to_string(), state: command_state }).into_response())
}

/// `GET /v1/agent/site/steps`: the site steps this site agent should run now.
#[utoipa::path(
    get,
    path = "/v1/agent/site/steps",
    tag = "agent",
    summary = "The running site steps of this site's machines (a site agent only; the serving one gets them)",
    responses(CommonErrors, (status = 200, description = "The steps", body = crate::wire::agent::SiteWorkDto)),
    security(("node" = [])),
)]
pub async fn site_steps(State(state): State<AppState>, NodeAuthed(node): NodeAuthed) -> Result<Response, ApiError> {
    let work = state.app.site_work(&node).await?;
    let dto =
        crate::wire::agent::SiteWorkDto { serving: work.serving, steps: work.steps.iter().map(Into::into).collect() };
    Ok(Json(dto).into_response())
}

/// `POST /v1/agent/site/steps/{workflow_id}/{index}`: how an attempt of a site step ended.
#[utoipa::path(
    post,
    path = "/v1/agent/site/steps/{workflow_id}/{index}",
    tag = "agent",
    summary = "Report an attempt of a site step (idempotent; refused on another attempt, place or after the end)",
    params(("workflow_id" = String, Path, description = "The workflow id"), ("index" = u32, Path, description = "The step's index")),
    request_body(content = Object, description = "attempt, ok, message"),
    responses(CommonErrors, (status = 200, description = "Recorded", body = crate::wire::agent::StepReportedDto)),
    security(("node" = [])),
)]
pub async fn report_site_step(
    State(state): State<AppState>,
    NodeAuthed(node): NodeAuthed,
    Path((id, index)): Path<(String, String)>,
    JsonBody(body): JsonBody<bc_domain::agent::StepReport>,
) -> Result<Response, ApiError> {
    let id: bc_domain::id::WorkflowId = path_id("workflowId", &id)?;
    let index: u32 = index.parse().map_err(|_| ApiError::invalid_argument("index", "is not a step index"))?;
    state.app.report_site_step(&node, &id, index, &body).await?;
    Ok(Json(crate::wire::agent::StepReportedDto { workflow_id: id.to_string(), index }).into_response())
}

/// The query of `GET /v1/agent/site/boot`.
#[derive(Debug, Clone, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct BootParams {
    /// The MAC address the machine boots with.
    pub mac: Option<String>,
    /// The machine's SMBIOS UUID (its Redfish system id).
    pub uuid: Option<String>,
}

/// `GET /v1/agent/site/boot`: what a machine of this site that boots from the network boots.
#[utoipa::path(
    get,
    path = "/v1/agent/site/boot",
    tag = "agent",
    summary = "What a machine of this site booting from the network boots (a site agent only): the ramdisk with a \
               single-use boot credential while its workflow has ramdisk steps ahead, its own disk otherwise",
    params(BootParams),
    responses(CommonErrors, (status = 200, description = "The answer", body = crate::wire::agent::BootAnswerDto)),
    security(("node" = [])),
)]
pub async fn site_boot(
    State(state): State<AppState>,
    NodeAuthed(node): NodeAuthed,
    QueryParams(params): QueryParams<BootParams>,
) -> Result<Response, ApiError> {
    let answer = state.app.site_boot(&node, params.mac.as_deref(), params.uuid.as_deref()).await?;
    Ok(Json(crate::wire::agent::BootAnswerDto::from(&answer)).into_response())
}

/// `GET /v1/agent/site/images/{sha256}`: the bytes of an image a deployment at this site writes.
#[utoipa::path(
    get,
    path = "/v1/agent/site/images/{sha256}",
    tag = "agent",
    summary = "The bytes of an image by its SHA-256, for the site agent's cache: only an image that a running \
               deployment on a machine of the agent's site writes",
    params(("sha256" = String, Path, description = "The image's SHA-256, lowercase hex")),
    responses(CommonErrors, (status = 200, description = "The bytes", content_type = "application/octet-stream", body = String)),
    security(("node" = [])),
)]
pub async fn site_image(
    State(state): State<AppState>,
    NodeAuthed(node): NodeAuthed,
    Path(sha256): Path<String>,
) -> Result<Response, ApiError> {
    if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(ApiError::invalid_argument("sha256", "64 lowercase hex digits"));
    }
    let content = state.app.site_image(&node, &sha256).await?;
    Ok(super::images::stream_content(&state, content))
}

/// `GET /v1/agent/instances`: the instances this node is to run.
#[utoipa::path(
    get,
    path = "/v1/agent/instances",
    tag = "agent",
    summary = "The instances this node is to run: each one whose allocation here has begun and that is not over, \
               with what its owner wants. An instance the node runs that is not listed is to be stopped and removed.",
    responses(CommonErrors, (status = 200, description = "The instances", body = crate::wire::agent::AgentInstancesDto)),
    security(("node" = [])),
)]
pub async fn agent_instances(
    State(state): State<AppState>,
    NodeAuthed(node): NodeAuthed,
) -> Result<Response, ApiError> {
    let instances = state.app.node_instances(&node.node_id).await?;
    Ok(Json(crate::wire::agent::AgentInstancesDto::from(instances.as_slice())).into_response())
}

/// `GET /v1/agent/instances/{instance_id}/image`: the bytes of the image an instance of this node boots from.
#[utoipa::path(
    get,
    path = "/v1/agent/instances/{instance_id}/image",
    tag = "agent",
    summary = "The bytes of an instance's image, for the node it runs on",
    params(("instance_id" = String, Path, description = "The instance id")),
    responses(CommonErrors, (status = 200, description = "The bytes", content_type = "application/octet-stream", body = String)),
    security(("node" = [])),
)]
pub async fn agent_instance_image(
    State(state): State<AppState>,
    NodeAuthed(node): NodeAuthed,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id: bc_domain::id::InstanceId = path_id("instanceId", &id)?;
    let content = state.app.node_instance_image(&node.node_id, &id).await?;
    Ok(super::images::stream_content(&state, content))
}

/// `POST /v1/agent/instances/{instance_id}/state`: what this node did with an instance.
#[utoipa::path(
    post,
    path = "/v1/agent/instances/{instance_id}/state",
    tag = "agent",
    summary = "Report an instance's state for the generation of its desired state the node acted on; `deleted` \
               (as its owner asked) releases its allocation",
    params(("instance_id" = String, Path, description = "The instance id")),
    request_body(content = Object, description = "InstanceStateReport: state, generation, message"),
    responses(CommonErrors, (status = 200, description = "The instance's state after the report", body = crate::wire::instances::InstanceDto)),
    security(("node" = [])),
)]
pub async fn report_instance_state(
    State(state): State<AppState>,
    NodeAuthed(node): NodeAuthed,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<bc_domain::agent::InstanceStateReport>,
) -> Result<Response, ApiError> {
    let id: bc_domain::id::InstanceId = path_id("instanceId", &id)?;
    let report = bc_commands::instances::InstanceReport {
        state: body.state,
        generation: body.generation,
        message: body.message,
    };
    let done = state.app.report_instance(&node.node_id, &node.caller(), &id, &report).await?;
    Ok(super::request::committed_answer(
        StatusCode::OK,
        crate::wire::instances::InstanceDto::from(&done.value),
        done.position,
        None,
    ))
}
