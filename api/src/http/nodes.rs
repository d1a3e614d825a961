//! `/v1/nodes`: register a node with its GPUs (until the agent's join replaces it), list, and the operator verbs.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use bc_domain::device::GpuInfo;
use bc_domain::id::{DeviceId, JoinTokenId, NodeId, PoolId, TenantId};
use serde::Deserialize;

use super::consistency::MinPosition;
use super::error::{CommonErrors, ErrorBody};
use super::request::{Authed, JsonBody, OptionalBody, PageParams, QueryParams, committed_answer, next_cursor, path_id};
use super::{ApiError, AppState};
use crate::wire::nodes::{
    CommandBody, CommandListDto, CommandQueuedDto, ForceBody, InventoryDto, JoinTokenBody, JoinTokenDto,
    NodeChangedDto, NodeDeletedDto, NodeDto, RegisterBody, SpecBody, SpecSetDto, VerbBody,
};
use crate::wire::nodes::{JoinTokenInfoDto, NodeDevicesDto};
use crate::wire::{CreatedDto, JoinTokenPage, NodePage, PoolDevicesPage};
use bc_commands::Caller;
use bc_commands::door::Subject;
use bc_commands::node_commands::Delivery;
use bc_commands::nodes::{NodeVerb, OperatorCommand, RegisterNode};
use bc_domain::agent::CommandKind;

/// `POST /v1/nodes`: a node in a pool the caller operates, with its GPUs.
#[utoipa::path(
    post,
    path = "/v1/nodes",
    tag = "nodes",
    summary = "Register a node with its GPUs in a pool the caller operates",
    request_body = RegisterBody,
    responses(CommonErrors, (status = 201, description = "Registered", body = CreatedDto), (status = 409, description = "A name or GPU is taken", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn register_node(
    State(state): State<AppState>,
    who: Authed,
    JsonBody(body): JsonBody<RegisterBody>,
) -> Result<Response, ApiError> {
    let pool_id: PoolId = path_id("poolId", &body.pool_id)?;
    let caller = state.app.authorize(&who.0, "nodes.register", Subject::Pool(&pool_id)).await?;
    let owner_tenant_id =
        body.owner_tenant_id.as_deref().map(|t| path_id::<TenantId>("ownerTenantId", t)).transpose()?;
    let gpus = body
        .gpus
        .into_iter()
        .enumerate()
        .map(|(i, gpu)| {
            Ok(GpuInfo {
                uuid: path_id::<DeviceId>(&format!("gpus[{i}].uuid"), &gpu.uuid)?,
                name: gpu.name,
                memory_mib: gpu.memory_mib,
                pci_bus_id: gpu.pci_bus_id,
                mig_instances: gpu.mig_instances.into_iter().map(Into::into).collect(),
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let input = RegisterNode {
        pool_id,
        name: body.name,
        role: body.role,
        trust: body.trust,
        owner_tenant_id,
        gpus,
        resources: body.resources,
    };
    let done = state.app.register_node(&caller, input).await?;
    Ok(committed_answer(StatusCode::CREATED, CreatedDto { id: done.value.to_string() }, done.position, None))
}

/// Query of `GET /v1/nodes`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
    pub cursor: Option<String>,
    /// A consistency token: answer once the read models have passed this position (as `X-Min-Position`).
    #[allow(dead_code)]
    pub after: Option<String>,
    pub pool_id: Option<String>,
}

/// `GET /v1/nodes`: the nodes of the caller's tenant's pools.
#[utoipa::path(
    get,
    path = "/v1/nodes",
    tag = "nodes",
    summary = "The nodes of the caller's tenant's pools",
    params(ListParams, ("X-Min-Position" = Option<String>, Header, description = "A consistency token, as ?after=")),
    responses(CommonErrors, (status = 200, description = "A page: items and nextCursor", body = NodePage), (status = 503, description = "NOT_YET_CONSISTENT", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn list_nodes(
    State(state): State<AppState>,
    who: Authed,
    MinPosition(after): MinPosition,
    QueryParams(params): QueryParams<ListParams>,
) -> Result<Json<NodePage>, ApiError> {
    let caller = state.app.authorize(&who.0, "nodes.list", Subject::OwnTenant).await?;
    let page = PageParams { limit: params.limit, cursor: params.cursor, after: None }.page()?;
    let pool_id = params.pool_id.as_deref().map(|p| path_id::<PoolId>("poolId", p)).transpose()?;
    let listed = state.app.list_nodes(&caller, pool_id.as_ref(), &page, after).await?;
    Ok(Json(NodePage {
        items: listed.items.iter().map(Into::into).collect(),
        next_cursor: next_cursor(&listed.next_key),
    }))
}

/// `GET /v1/nodes/{id}`: one node of the caller's tenant's pools.
#[utoipa::path(
    get,
    path = "/v1/nodes/{node_id}",
    tag = "nodes",
    summary = "One node of the caller's tenant's pools",
    params(("node_id" = String, Path, description = "The node id"), super::fleet::ReadParams, ("X-Min-Position" = Option<String>, Header, description = "A consistency token, as ?after=")),
    responses(CommonErrors, (status = 200, description = "The node", body = NodeDto), (status = 503, description = "NOT_YET_CONSISTENT", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn get_node(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    MinPosition(after): MinPosition,
    QueryParams(super::fleet::ReadParams { .. }): QueryParams<super::fleet::ReadParams>,
) -> Result<Json<NodeDto>, ApiError> {
    let id: NodeId = path_id("nodeId", &id)?;
    let caller = state.app.authorize(&who.0, "nodes.get", Subject::Node(&id)).await?;
    Ok(Json((&state.app.node(&caller, &id, after).await?).into()))
}

async fn verb(
    state: AppState,
    who: Authed,
    id: String,
    body: VerbBody,
    method: &'static str,
    verb: NodeVerb,
) -> Result<Response, ApiError> {
    check_reason(&body.reason)?;
    let id: NodeId = path_id("nodeId", &id)?;
    let caller = state.app.authorize(&who.0, method, Subject::Node(&id)).await?;
    let done = state.app.node_verb(&caller, &id, verb, body.reason).await?;
    Ok(committed_answer(StatusCode::OK, NodeChangedDto { id: id.to_string() }, done.position, None))
}

#[utoipa::path(
    post,
    path = "/v1/nodes/{node_id}/cordon",
    tag = "nodes",
    summary = "Cordon a node: no new placements",
    params(("node_id" = String, Path, description = "The node id")),
    request_body = inline(Option<VerbBody>),
    responses(CommonErrors, (status = 200, description = "Done (or already so)", body = NodeChangedDto)),
    security(("bearer" = [])),
)]
pub async fn cordon(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    OptionalBody(body): OptionalBody<VerbBody>,
) -> Result<Response, ApiError> {
    verb(state, who, id, body, "nodes.cordon", NodeVerb::Cordon).await
}

#[utoipa::path(
    post,
    path = "/v1/nodes/{node_id}/uncordon",
    tag = "nodes",
    summary = "Uncordon a node",
    params(("node_id" = String, Path, description = "The node id")),
    request_body = inline(Option<VerbBody>),
    responses(CommonErrors, (status = 200, description = "Done (or already so)", body = NodeChangedDto)),
    security(("bearer" = [])),
)]
pub async fn uncordon(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    OptionalBody(body): OptionalBody<VerbBody>,
) -> Result<Response, ApiError> {
    verb(state, who, id, body, "nodes.uncordon", NodeVerb::Uncordon).await
}

#[utoipa::path(
    post,
    path = "/v1/nodes/{node_id}/maintenance/start",
    tag = "nodes",
    summary = "Put a node in maintenance",
    params(("node_id" = String, Path, description = "The node id")),
    request_body = inline(Option<VerbBody>),
    responses(CommonErrors, (status = 200, description = "Done (or already so)", body = NodeChangedDto)),
    security(("bearer" = [])),
)]
pub async fn start_maintenance(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    OptionalBody(body): OptionalBody<VerbBody>,
) -> Result<Response, ApiError> {
    verb(state, who, id, body, "nodes.maintenance.start", NodeVerb::StartMaintenance).await
}

#[utoipa::path(
    post,
    path = "/v1/nodes/{node_id}/maintenance/end",
    tag = "nodes",
    summary = "Take a node out of maintenance",
    params(("node_id" = String, Path, description = "The node id")),
    request_body = inline(Option<VerbBody>),
    responses(CommonErrors, (status = 200, description = "Done (or already so)", body = NodeChangedDto)),
    security(("bearer" = [])),
)]
pub async fn end_maintenance(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    OptionalBody(body): OptionalBody<VerbBody>,
) -> Result<Response, ApiError> {
    verb(state, who, id, body, "nodes.maintenance.end", NodeVerb::EndMaintenance).await
}

/// `POST /v1/pools/{pool_id}/join-tokens`: a single-use join token for one machine.
#[utoipa::path(
    post,
    path = "/v1/pools/{pool_id}/join-tokens",
    tag = "nodes",
    summary = "Issue a single-use join token for the pool (the secret is shown once)",
    params(("pool_id" = String, Path, description = "The pool id")),
    request_body = inline(Option<JoinTokenBody>),
    responses(CommonErrors, (status = 201, description = "The token: id, token, poolId, expiresAt", body = JoinTokenDto)),
    security(("bearer" = [])),
)]
pub async fn create_join_token(
    State(state): State<AppState>,
    who: Authed,
    Path(pool_id): Path<String>,
    OptionalBody(body): OptionalBody<JoinTokenBody>,
) -> Result<Response, ApiError> {
    let pool_id: PoolId = path_id("poolId", &pool_id)?;
    let caller = state.app.authorize(&who.0, "nodes.join_tokens.create", Subject::Pool(&pool_id)).await?;
    let done = state.app.create_join_token(&caller, &pool_id, body.ttl_seconds.unwrap_or(3600)).await?;
    Ok(committed_answer(StatusCode::CREATED, JoinTokenDto::from(&done.value), done.position, None))
}

/// `GET /v1/nodes/{node_id}/devices`: the node's GPUs and the atoms below them.
#[utoipa::path(
    get,
    path = "/v1/nodes/{node_id}/devices",
    tag = "nodes",
    summary = "The node's devices: its GPUs and the atoms below them (MIG instances, slots), each saying whether its pool books it",
    params(("node_id" = String, Path, description = "The node id"), super::fleet::ReadParams, ("X-Min-Position" = Option<String>, Header, description = "A consistency token, as ?after=")),
    responses(CommonErrors, (status = 200, description = "The devices", body = NodeDevicesDto), (status = 503, description = "NOT_YET_CONSISTENT", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn node_devices(
    State(state): State<AppState>,
    who: Authed,
    MinPosition(after): MinPosition,
    Path(id): Path<String>,
    QueryParams(super::fleet::ReadParams { .. }): QueryParams<super::fleet::ReadParams>,
) -> Result<Json<NodeDevicesDto>, ApiError> {
    let (id, caller) = on_node(&state, &who, "nodes.get", &id).await?;
    let node = state.app.node(&caller, &id, after).await?;
    Ok(Json(NodeDevicesDto { node_id: id.to_string(), items: node.devices.iter().map(Into::into).collect() }))
}

/// `GET /v1/pools/{pool_id}/devices`: the devices of a pool the caller's tenant owns, node by node.
#[utoipa::path(
    get,
    path = "/v1/pools/{pool_id}/devices",
    tag = "nodes",
    summary = "The devices of a pool the caller's tenant owns, node by node (a page of nodes), each saying whether the pool books it",
    params(("pool_id" = String, Path, description = "The pool id"), PageParams, ("X-Min-Position" = Option<String>, Header, description = "A consistency token, as ?after=")),
    responses(CommonErrors, (status = 200, description = "A page of nodes with their devices", body = PoolDevicesPage), (status = 503, description = "NOT_YET_CONSISTENT", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn pool_devices(
    State(state): State<AppState>,
    who: Authed,
    MinPosition(after): MinPosition,
    Path(id): Path<String>,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<PoolDevicesPage>, ApiError> {
    let pool_id: PoolId = path_id("poolId", &id)?;
    // Its nodes are the owner's to see: a tenant it is offered to reads its capacity, not its machines.
    let caller = state.app.authorize(&who.0, "nodes.list", Subject::Pool(&pool_id)).await?;
    let listed = state.app.list_nodes(&caller, Some(&pool_id), &params.page()?, after).await?;
    let items = listed
        .items
        .iter()
        .map(|node| NodeDevicesDto {
            node_id: node.id.to_string(),
            items: node.devices.iter().map(Into::into).collect(),
        })
        .collect();
    Ok(Json(PoolDevicesPage { items, next_cursor: next_cursor(&listed.next_key) }))
}

/// `GET /v1/pools/{pool_id}/join-tokens`: the pool's join tokens, never their secrets.
#[utoipa::path(
    get,
    path = "/v1/pools/{pool_id}/join-tokens",
    tag = "nodes",
    summary = "The pool's join tokens (never their secrets), by id: whether each is unused, used, expired or revoked",
    params(("pool_id" = String, Path, description = "The pool id"), PageParams),
    responses(CommonErrors, (status = 200, description = "A page: items and nextCursor", body = JoinTokenPage)),
    security(("bearer" = [])),
)]
pub async fn list_join_tokens(
    State(state): State<AppState>,
    who: Authed,
    // Join tokens are read where they are written, so every token is already reached; it is still checked.
    MinPosition(_): MinPosition,
    Path(pool_id): Path<String>,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<JoinTokenPage>, ApiError> {
    let pool_id: PoolId = path_id("poolId", &pool_id)?;
    let caller = state.app.authorize(&who.0, "nodes.join_tokens.list", Subject::Pool(&pool_id)).await?;
    let page = params.page()?;
    let listed = state.app.list_join_tokens(&caller, &pool_id, &page).await?;
    Ok(Json(JoinTokenPage {
        items: listed.items.iter().map(Into::into).collect(),
        next_cursor: next_cursor(&listed.next_key),
    }))
}

/// `DELETE /v1/pools/{pool_id}/join-tokens/{token_id}`: revokes a join token no machine used.
#[utoipa::path(
    delete,
    path = "/v1/pools/{pool_id}/join-tokens/{token_id}",
    tag = "nodes",
    summary = "Revoke a join token no machine used: it admits nobody from now on (revoking again answers it as it is)",
    params(("pool_id" = String, Path, description = "The pool id"), ("token_id" = String, Path, description = "The join token's id")),
    responses(CommonErrors, (status = 200, description = "The token, revoked", body = JoinTokenInfoDto)),
    security(("bearer" = [])),
)]
pub async fn revoke_join_token(
    State(state): State<AppState>,
    who: Authed,
    Path((pool_id, token_id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let pool_id: PoolId = path_id("poolId", &pool_id)?;
    let token_id: JoinTokenId = path_id("tokenId", &token_id)?;
    let caller = state.app.authorize(&who.0, "nodes.join_tokens.revoke", Subject::Pool(&pool_id)).await?;
    let done = state.app.revoke_join_token(&caller, &pool_id, &token_id).await?;
    Ok(committed_answer(StatusCode::OK, JoinTokenInfoDto::from(&done.value), done.position, None))
}

/// Decides `method` on the node a path names: the node's id and the caller to run the command as.
async fn on_node(state: &AppState, who: &Authed, method: &'static str, id: &str) -> Result<(NodeId, Caller), ApiError> {
    let id: NodeId = path_id("nodeId", id)?;
    let caller = state.app.authorize(&who.0, method, Subject::Node(&id)).await?;
    Ok((id, caller))
}

fn check_reason(reason: &Option<String>) -> Result<(), ApiError> {
    if reason.as_ref().is_some_and(|r| r.chars().count() > 1024) {
        return Err(ApiError::invalid_argument("reason", "must be at most 1024 characters"));
    }
    Ok(())
}

/// `POST /v1/nodes/{node_id}/drain`.
#[utoipa::path(
    post,
    path = "/v1/nodes/{node_id}/drain",
    tag = "nodes",
    summary = "Drain a node: cordon it, move its future bookings, let running ones finish (or end them with force)",
    params(("node_id" = String, Path, description = "The node id")),
    request_body = inline(Option<ForceBody>),
    responses(CommonErrors, (status = 200, description = "Draining", body = NodeChangedDto), (status = 409, description = "The pool's disruption budget is spent", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn drain_node(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    OptionalBody(body): OptionalBody<ForceBody>,
) -> Result<Response, ApiError> {
    check_reason(&body.reason)?;
    let (id, caller) = on_node(&state, &who, "nodes.drain", &id).await?;
    let done = state.app.drain_node(&caller, &id, body.force, body.reason).await?;
    Ok(committed_answer(StatusCode::OK, NodeChangedDto { id: id.to_string() }, done.position, None))
}

/// Query of `DELETE /v1/nodes/{node_id}`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeleteParams {
    /// Delete even though reservations are placed or running on it.
    pub force: Option<bool>,
    pub reason: Option<String>,
}

/// `DELETE /v1/nodes/{node_id}`.
#[utoipa::path(
    delete,
    path = "/v1/nodes/{node_id}",
    tag = "nodes",
    summary = "Delete a node, revoking its credential (refused while it holds reservations, unless force)",
    params(("node_id" = String, Path, description = "The node id"), DeleteParams),
    responses(CommonErrors, (status = 200, description = "Deleted", body = NodeDeletedDto), (status = 409, description = "Reservations remain", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn delete_node(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    QueryParams(params): QueryParams<DeleteParams>,
) -> Result<Response, ApiError> {
    check_reason(&params.reason)?;
    let (id, caller) = on_node(&state, &who, "nodes.delete", &id).await?;
    let done = state.app.delete_node(&caller, &id, params.force.unwrap_or(false), params.reason).await?;
    Ok(committed_answer(StatusCode::OK, NodeDeletedDto { id: id.to_string(), deleted: true }, done.position, None))
}

/// `PUT /v1/nodes/{node_id}/spec`.
#[utoipa::path(
    put,
    path = "/v1/nodes/{node_id}/spec",
    tag = "nodes",
    summary = "Set a node's desired state (labels, MIG layout); its generation rises",
    params(("node_id" = String, Path, description = "The node id")),
    request_body = SpecBody,
    responses(CommonErrors, (status = 200, description = "The new generation", body = SpecSetDto)),
    security(("bearer" = [])),
)]
pub async fn set_spec(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<SpecBody>,
) -> Result<Response, ApiError> {
    let (id, caller) = on_node(&state, &who, "nodes.spec.set", &id).await?;
    let done = state.app.set_node_spec(&caller, &id, body.labels, body.mig_layout).await?;
    let body = SpecSetDto { id: id.to_string(), generation: done.value };
    Ok(committed_answer(StatusCode::OK, body, done.position, None))
}

/// `POST /v1/nodes/{node_id}/commands`.
#[utoipa::path(
    post,
    path = "/v1/nodes/{node_id}/commands",
    tag = "nodes",
    summary = "Queue a command for a node (probe, refresh-inventory)",
    params(("node_id" = String, Path, description = "The node id")),
    request_body = CommandBody,
    responses(CommonErrors, (status = 201, description = "Queued: id and seq", body = CommandQueuedDto)),
    security(("bearer" = [])),
)]
pub async fn create_command(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<CommandBody>,
) -> Result<Response, ApiError> {
    let kind = match body.kind.as_str() {
        "probe" => CommandKind::Probe { note: body.note },
        "refresh-inventory" if body.note.is_some() => {
            return Err(ApiError::invalid_argument("note", "only a probe carries a note"));
        }
        "refresh-inventory" => CommandKind::RefreshInventory,
        other => {
            return Err(ApiError::invalid_argument(
                "kind",
                format!("{other:?} is not a command operators send; use probe or refresh-inventory"),
            ));
        }
    };
    let (id, caller) = on_node(&state, &who, "nodes.commands.create", &id).await?;
    let delivery =
        Delivery { not_before_ms: body.not_before, not_after_ms: body.not_after, min_generation: body.min_generation };
    let (command_id, seq) = state.app.queue_node_command(&caller, &id, OperatorCommand { kind, delivery }).await?;
    let body = CommandQueuedDto { id: command_id.to_string(), node_id: id.to_string(), seq };
    Ok(committed_answer(StatusCode::CREATED, body, None, None))
}

/// `GET /v1/nodes/{node_id}/commands`.
#[utoipa::path(
    get,
    path = "/v1/nodes/{node_id}/commands",
    tag = "nodes",
    summary = "A node's commands, newest first, with their states",
    params(("node_id" = String, Path, description = "The node id")),
    responses(CommonErrors, (status = 200, description = "items", body = CommandListDto)),
    security(("bearer" = [])),
)]
pub async fn list_commands(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
) -> Result<Json<CommandListDto>, ApiError> {
    let (id, caller) = on_node(&state, &who, "nodes.commands.list", &id).await?;
    let items = state.app.node_commands(&caller, &id).await?;
    Ok(Json(CommandListDto { items: items.iter().map(Into::into).collect() }))
}

/// `GET /v1/nodes/{node_id}/inventory`.
#[utoipa::path(
    get,
    path = "/v1/nodes/{node_id}/inventory",
    tag = "nodes",
    summary = "A node's latest NodeInventory v1 snapshot",
    params(("node_id" = String, Path, description = "The node id")),
    responses(CommonErrors, (status = 200, description = "snapshot, receivedAt, document", body = InventoryDto)),
    security(("bearer" = [])),
)]
pub async fn node_inventory(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
) -> Result<Json<InventoryDto>, ApiError> {
    let (id, caller) = on_node(&state, &who, "nodes.inventory.get", &id).await?;
    let snapshot = state.app.node_inventory(&caller, &id).await?;
    Ok(Json(InventoryDto::new(id.to_string(), snapshot)))
}
