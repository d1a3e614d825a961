//! What node agents do: join with a join token, open sessions and heartbeat with their node credential, report
//! their inventory, fetch and acknowledge commands. Every call after the join is authenticated by the node
//! credential, which names the node: nothing in a body can make one node speak for another.
//!
//! Heartbeats are runtime rows: a heartbeat is one statement on `agent_sessions` unless something changed that
//! the log must record (connectivity back to `connected`, a newly observed generation, clock skew crossing its
//! limit), and only then does it run a command transaction.

use std::collections::BTreeSet;
use std::time::Duration;

use bc_domain::Rejection;
use bc_domain::agent::{
    Ack, AgentCommand, CREDENTIAL_PREFIX, CertificateRequest, Heartbeat, HeartbeatReply, InventoryAccepted,
    JOIN_TOKEN_PREFIX, JoinRequest, Joined, NodeCertificate, Session,
};
use bc_domain::device::{Device, GpuInfo, devices_for};
use bc_domain::hardware::{HardwareKey, hardware_key};
use bc_domain::id::{CommandId, DeviceId, Identity, JoinTokenId, NodeId, PoolId, SessionId, TenantId};
use bc_domain::inventory::{InventoryReport, NodeInventory, ReportError};
use bc_domain::node::{
    Condition, ConditionType, Connectivity, MAX_CLOCK_SKEW_MS, NodeAdopted, NodeConditionCleared, NodeConditionRaised,
    NodeConnectivityChanged, NodeEvent, NodeHardwareChanged, NodeInventoryReported, NodeJoined, NodeRejoined,
    NodeResourcesChanged, NodeSpec, NodeSpecObserved, Role, Trust, scalars_of,
};
use bc_domain::reservation::{self, Command, FailureReason, ReservationState};
use bc_domain::{acceptance, gpu, site::check_name};
use bc_eventstore::events::ExpectedVersion;
use bc_eventstore::{ScopedFutureExt as _, Tx, TxOptions, clock};

use super::fleet::owned_pool;
use super::node_commands as commands;
use super::reservations::apply_and_schedule;
use super::sealed::{pki_failure, secret_context};
pub use super::store::agents::JoinTokenInfo;
use super::store::agents::{self, NodeState};
use super::store::certificates;
use super::store::{self, PoolRow, corrupt};
use super::work::{self, WorkKey};
use super::{App, AppError, AppResult, Caller, Committed, record, record_node};

/// How agents keep their sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LivenessConfig {
    /// The liveness lease a heartbeat renews (DESIGN.md section 10: 40 s).
    pub lease: Duration,
    /// How often agents are told to heartbeat.
    pub heartbeat: Duration,
}

impl Default for LivenessConfig {
    fn default() -> Self {
        Self {
            lease: Duration::from_millis(bc_domain::node::LIVENESS_LEASE_MS as u64),
            heartbeat: Duration::from_secs(5),
        }
    }
}

/// The node a credential belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAuth {
    pub node_id: NodeId,
    pub pool_id: PoolId,
    /// The pool's owner, whose streams the node's events belong to.
    pub tenant_id: TenantId,
}

impl NodeAuth {
    /// The admission context of what the node's agent does.
    pub fn caller(&self) -> Caller {
        node_caller(&self.node_id, &self.tenant_id)
    }
}

pub(crate) fn node_caller(node_id: &NodeId, tenant: &TenantId) -> Caller {
    let identity: Identity = format!("node:{node_id}").parse().expect("a node id makes a valid identity");
    Caller::new(tenant.clone(), identity, "agent")
}

/// A join token as issued: the secret is shown once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedJoinToken {
    pub id: JoinTokenId,
    pub token: String,
    pub pool_id: PoolId,
    pub expires_at_ms: i64,
}

/// The longest a join token may live.
pub const MAX_JOIN_TOKEN_TTL_S: u64 = 7 * 24 * 3600;

/// A new secret with `prefix`, and the SHA-256 hex under which it is stored.
pub(crate) fn new_secret(prefix: &str) -> AppResult<(String, String)> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|err| AppError::Store(bc_eventstore::Error::Internal(format!("no randomness: {err}"))))?;
    let secret = format!("{prefix}{}", bc_domain::id::crockford_base32(&bytes));
    let hash = bc_domain::sha256_hex(&secret);
    Ok((secret, hash))
}

/// The GPUs of an inventory as capacity sees them.
fn gpus_of(document: &NodeInventory) -> Vec<GpuInfo> {
    document.gpus.iter().map(|g| g.info.clone()).collect()
}

/// The devices a machine's GPUs give under the pool's sharing mode. A GPU in MIG mode without instances can run
/// nothing until it is partitioned, so it is never an atom.
fn devices_of(node_id: &NodeId, document: &NodeInventory, pool: &PoolRow) -> Vec<Device> {
    let (mut devices, _) = devices_for(&gpus_of(document), pool.sharing, pool.policy.replicas());
    let idle: BTreeSet<&DeviceId> = document
        .gpus
        .iter()
        .filter(|g| g.mig_enabled && g.info.mig_instances.is_empty())
        .map(|g| &g.info.uuid)
        .collect();
    for device in &mut devices {
        if idle.contains(&device.id) || device.parent.as_ref().is_some_and(|p| idle.contains(p)) {
            device.bookable = false;
        }
    }
    if pool.policy.tenant_root {
        bc_domain::device::whole_node(node_id, &mut devices, &pool.gpu_model);
    }
    devices
}

/// The NodeSpec a pool gives its nodes.
fn spec_for(pool: &PoolRow) -> NodeSpec {
    NodeSpec {
        sharing: pool.sharing.as_str().to_owned(),
        replicas: pool.policy.replicas(),
        mig_layout: pool.policy.mig_layout.clone(),
        labels: Default::default(),
    }
}

/// The pool's acceptance checks on an inventory: the built-in ones (at least one GPU, none listed twice, the
/// pool's model) and the pool's own (`policy.acceptance`). A machine that fails one is refused, naming the check,
/// and nothing is written. Returns the checks passed and the conditions to raise (an unknown model is adopted
/// with `GpuModelUnknown`).
fn acceptance(
    pool: &PoolRow,
    document: &NodeInventory,
    hardware: &HardwareKey,
    at_ms: i64,
) -> AppResult<(Vec<String>, Vec<Condition>)> {
    let gpus = gpus_of(document);
    if gpus.is_empty() {
        return Err(Rejection::invalid(
            "inventory.gpus",
            format!("the machine reports no GPU, and pool {} holds {} GPUs", pool.id, pool.gpu_model),
        )
        .into());
    }
    let mut seen = BTreeSet::new();
    let mut conditions = Vec::new();
    for (i, info) in gpus.iter().enumerate() {
        if !seen.insert(info.uuid.clone()) {
            return Err(Rejection::invalid(
                format!("inventory.gpus[{i}].uuid"),
                format!("{} is listed twice", info.uuid),
            )
            .into());
        }
        let name = gpu::classify(&info.name);
        if !name.known {
            conditions.push(Condition {
                kind: ConditionType::GpuModelUnknown,
                message: format!("no gpu-models.json entry for {:?}", info.name),
                since_ms: at_ms,
            });
        } else if name.gpu_model != pool.gpu_model {
            return Err(Rejection::invalid(
                format!("inventory.gpus[{i}].name"),
                format!("is a {} GPU, but pool {} holds {} GPUs", name.gpu_model, pool.id, pool.gpu_model),
            )
            .into());
        }
    }
    conditions.dedup_by_key(|c| c.kind);
    let mut passed = vec!["inventory-valid".to_owned(), "gpu-model".to_owned()];
    let checks = acceptance::parse(&pool.policy.acceptance)
        .map_err(|(i, why)| corrupt(&format!("pool {} policy.acceptance[{i}]", pool.id), why))?;
    let failures: Vec<String> = checks.iter().filter_map(|c| c.failure(document, hardware.trusted)).collect();
    if !failures.is_empty() {
        return Err(Rejection::invalid(
            "inventory",
            format!("the machine fails pool {}'s acceptance checks: {}", pool.id, failures.join("; ")),
        )
        .into());
    }
    passed.extend(checks.iter().map(ToString::to_string));
    Ok((passed, conditions))
}

/// The node's events that bring it back to `connected` (and clear `NodeUnreachable`), if it was not.
fn reconnect(node_id: &NodeId, state: &NodeState, at_ms: i64) -> Vec<NodeEvent> {
    let mut events = Vec::new();
    if state.connectivity != Connectivity::Connected {
        events.push(NodeEvent::ConnectivityChanged(NodeConnectivityChanged {
            node_id: node_id.clone(),
            from: state.connectivity,
            to: Connectivity::Connected,
            at_ms,
        }));
    }
    events.extend(follow_condition(node_id, state, ConditionType::NodeUnreachable, false, String::new, at_ms));
    events
}

/// The event that makes a node's condition `kind` follow `active`: raised (with `message`) when it becomes true,
/// cleared when it stops being so, nothing when the node already agrees.
fn follow_condition(
    node_id: &NodeId,
    state: &NodeState,
    kind: ConditionType,
    active: bool,
    message: impl FnOnce() -> String,
    at_ms: i64,
) -> Option<NodeEvent> {
    match (active, state.has(kind)) {
        (true, false) => Some(NodeEvent::ConditionRaised(NodeConditionRaised {
            node_id: node_id.clone(),
            condition: Condition { kind, message: message(), since_ms: at_ms },
        })),
        (false, true) => {
            Some(NodeEvent::ConditionCleared(NodeConditionCleared { node_id: node_id.clone(), kind, at_ms }))
        }
        _ => None,
    }
}

/// The GPU changes between what a node has and what its inventory now reports.
struct GpuChange {
    /// GPUs that are gone, and new ones.
    removed: Vec<DeviceId>,
    added: Vec<DeviceId>,
}

fn gpu_change(held: &[DeviceId], reported: &[GpuInfo]) -> GpuChange {
    let held: BTreeSet<&DeviceId> = held.iter().collect();
    let now: BTreeSet<&DeviceId> = reported.iter().map(|g| &g.uuid).collect();
    GpuChange {
        removed: held.difference(&now).map(|d| (*d).clone()).collect(),
        added: now.difference(&held).map(|d| (*d).clone()).collect(),
    }
}

/// The events a changed inventory causes on an existing node: a GPU count that no longer matches raises
/// `GpuCountMismatch` (the node keeps its devices until the count is right again); the same count with other
/// GPUs, or other machine identifiers, is a hardware change that replaces the devices and raises
/// `HardwareChanged`. Returns the events and whether devices went away.
async fn hardware_events(
    tx: &mut Tx,
    node_id: &NodeId,
    state: &NodeState,
    document: &NodeInventory,
    hardware: &HardwareKey,
    at_ms: i64,
) -> AppResult<(Vec<NodeEvent>, bool)> {
    let held = agents::node_devices(tx, node_id, true).await?;
    let gpus = gpus_of(document);
    let change = gpu_change(&held, &gpus);
    let mut events = Vec::new();
    let count_mismatch = !held.is_empty() && held.len() != gpus.len();
    events.extend(follow_condition(
        node_id,
        state,
        ConditionType::GpuCountMismatch,
        count_mismatch,
        || format!("the inventory reports {} GPUs; the node holds {}", gpus.len(), held.len()),
        at_ms,
    ));
    let stored_key = agents::hardware_key_of(tx, node_id).await?;
    let swapped = !count_mismatch && (!change.removed.is_empty() || !change.added.is_empty());
    let identity_changed = stored_key.as_deref() != Some(hardware.key.as_str());
    if !(swapped || identity_changed) || count_mismatch {
        return Ok((events, false));
    }
    let pool = store::pool(tx, &state.pool_id).await?.ok_or_else(|| corrupt("the node's pool", "missing"))?;
    let devices = devices_of(node_id, document, &pool);
    let kept: BTreeSet<&str> = devices.iter().map(|d| d.id.as_str()).collect();
    let removed_devices: Vec<DeviceId> =
        agents::node_devices(tx, node_id, false).await?.into_iter().filter(|id| !kept.contains(id.as_str())).collect();
    let mut described = Vec::new();
    if !change.removed.is_empty() {
        described.push(format!("GPUs {} replaced by {}", list(&change.removed), list(&change.added)));
    }
    if identity_changed && !swapped {
        described.push("machine identifiers changed".to_owned());
    }
    let lost_devices = !removed_devices.is_empty();
    events.push(NodeEvent::HardwareChanged(NodeHardwareChanged {
        node_id: node_id.clone(),
        gpus,
        devices,
        removed_devices,
        hardware: hardware.clone(),
        at_ms,
    }));
    events.push(NodeEvent::ConditionRaised(NodeConditionRaised {
        node_id: node_id.clone(),
        condition: Condition { kind: ConditionType::HardwareChanged, message: described.join("; "), since_ms: at_ms },
    }));
    Ok((events, lost_devices))
}

/// The node's scalar resources as `document` reports them, as an event when they differ from what it holds. A site
/// agent's machine lends nothing.
async fn resources_event(
    tx: &mut Tx,
    node_id: &NodeId,
    document: &NodeInventory,
    at_ms: i64,
) -> AppResult<Option<NodeEvent>> {
    let (role, held) = agents::node_scalars(tx, node_id).await?;
    let resources = if role == "site" { Default::default() } else { scalars_of(document) };
    Ok((resources != held)
        .then(|| NodeEvent::ResourcesChanged(NodeResourcesChanged { node_id: node_id.clone(), resources, at_ms })))
}

fn list(ids: &[DeviceId]) -> String {
    ids.iter().map(DeviceId::as_str).collect::<Vec<_>>().join(", ")
}

/// Records join token `id` (its secret's hash `hash`) for a pool, valid for `ttl_s` seconds, in the caller's
/// transaction: when it expires, and the position of its event.
pub(crate) async fn record_join_token(
    tx: &mut Tx,
    caller: &Caller,
    pool_id: &PoolId,
    tenant: &TenantId,
    id: &JoinTokenId,
    hash: &str,
    ttl_s: u64,
) -> AppResult<(i64, Option<bc_eventstore::Position>)> {
    let at_ms = clock::compute_now_ms(tx).await?;
    let events = bc_domain::pool::issue_join_token(pool_id, id, ttl_s, MAX_JOIN_TOKEN_TTL_S, at_ms)?;
    let expires_at_ms = at_ms + ttl_s as i64 * 1000;
    agents::insert_join_token(tx, id, hash, pool_id, caller.identity.as_str(), expires_at_ms).await?;
    // Each token is a stream of its own, so that tokens issued at once for one pool never race for the pool
    // stream's next version.
    let position = record(tx, caller, id.as_str(), tenant, ExpectedVersion::Exact(0), events).await?;
    Ok((expires_at_ms, position))
}

impl App {
    /// Issues a single-use join token for a pool the caller operates, valid for `ttl_s` seconds.
    pub async fn create_join_token(
        &self,
        caller: &Caller,
        pool_id: &PoolId,
        ttl_s: u64,
    ) -> AppResult<Committed<IssuedJoinToken>> {
        let (token, hash) = new_secret(JOIN_TOKEN_PREFIX)?;
        let id = JoinTokenId::generate();
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let (token, hash, id) = (&token, &hash, &id);
                async move {
                    let pool = owned_pool(tx, caller, pool_id).await?;
                    let (expires_at_ms, position) =
                        record_join_token(tx, caller, pool_id, &pool.owner_tenant_id, id, hash, ttl_s).await?;
                    Ok(Committed {
                        value: IssuedJoinToken {
                            id: id.clone(),
                            token: token.clone(),
                            pool_id: pool_id.clone(),
                            expires_at_ms,
                        },
                        position,
                    })
                }
                .scope_boxed()
            })
            .await
    }

    /// A page of the pool's join tokens (never their secrets), by id.
    pub async fn list_join_tokens(
        &self,
        caller: &Caller,
        pool_id: &PoolId,
        page: &crate::reads::Page,
    ) -> AppResult<crate::reads::Listed<JoinTokenInfo>> {
        let after: Option<JoinTokenId> = match &page.after_key {
            Some(key) => {
                Some(key.parse().map_err(|_| Rejection::invalid("cursor", "is not a cursor this API gave out"))?)
            }
            None => None,
        };
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        owned_pool(&mut tx, caller, pool_id).await?;
        let tokens = agents::list_join_tokens(&mut tx, pool_id, after.as_ref(), i64::from(page.limit) + 1).await?;
        tx.commit().await?;
        Ok(crate::reads::paged(tokens.into_iter().map(|t| (t.id.to_string(), t)).collect(), page))
    }

    /// Revokes a join token no machine has used: it admits nobody from now on. Revoking it again answers it
    /// as it is; one a machine used is refused (`CONFLICT`).
    pub async fn revoke_join_token(
        &self,
        caller: &Caller,
        pool_id: &PoolId,
        token_id: &JoinTokenId,
    ) -> AppResult<Committed<JoinTokenInfo>> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                async move {
                    let pool = owned_pool(tx, caller, pool_id).await?;
                    let not_found = || Rejection::NotFound { kind: "join token", id: token_id.to_string() };
                    let Some(row) = agents::lock_pool_join_token(tx, pool_id, token_id).await? else {
                        return Err(not_found().into());
                    };
                    let Some((state, version)) = store::join_token_aggregate(tx, token_id).await? else {
                        return Err(not_found().into());
                    };
                    let at_ms = clock::compute_now_ms(tx).await?;
                    let used_by = row.node_id.as_ref().map(NodeId::as_str);
                    let events = bc_domain::pool::revoke_join_token(&state, used_by, at_ms)?;
                    let mut value = row;
                    if !events.is_empty() {
                        agents::revoke_join_token(tx, token_id).await?;
                        value.revoked_at_ms = Some(at_ms);
                    }
                    let version = ExpectedVersion::Exact(version);
                    let position =
                        record(tx, caller, token_id.as_str(), &pool.owner_tenant_id, version, events).await?;
                    Ok(Committed { value, position })
                }
                .scope_boxed()
            })
            .await
    }

    /// A machine joins the pool of its join token: the token is used up, the inventory checked against the
    /// pool's acceptance checks, and the machine is either a new node (`adopting`, then `adopted`) or, when it
    /// shares two identifiers with an existing node, that node again. Answers the node's new credential and a
    /// first session.
    pub async fn join(&self, request: JoinRequest) -> AppResult<Joined> {
        let Some(_) = request.join_token.strip_prefix(JOIN_TOKEN_PREFIX) else {
            return Err(Rejection::invalid("joinToken", format!("a join token starts with {JOIN_TOKEN_PREFIX}")).into());
        };
        if request.inventory.schema != bc_domain::inventory::SCHEMA {
            return Err(Rejection::invalid(
                "inventory.schema",
                format!("expected {}, got {:?}", bc_domain::inventory::SCHEMA, request.inventory.schema),
            )
            .into());
        }
        let document = request.inventory.clone().apply(None).map_err(|err| match err {
            ReportError::Missing(section) => {
                Rejection::invalid(format!("inventory.{}", section_name(section)), "a join sends every section")
            }
            other => Rejection::invalid("inventory", other.to_string()),
        })?;
        check_name("inventory.system.hostname", &document.system.hostname)?;
        check_inventory(&document)?;
        let role = match request.role.unwrap_or(Role::Host) {
            role @ (Role::Host | Role::Site) => role,
            other => {
                return Err(
                    Rejection::invalid("role", format!("a machine joins as host or site, not {other:?}")).into()
                );
            }
        };
        let token_hash = bc_domain::sha256_hex(&request.join_token);
        let (credential, credential_hash) = new_secret(CREDENTIAL_PREFIX)?;
        let lease = self.liveness.lease;
        let joined = self
            .db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let (request, document, token_hash, credential_hash) =
                    (&request, &document, &token_hash, &credential_hash);
                async move {
                    // Join approvals lock the pool first, then the token.
                    let Some(pool_id) = agents::join_token_pool(tx, token_hash).await? else {
                        return Err(Rejection::Unauthenticated("the join token is unknown".to_owned()).into());
                    };
                    store::lock_pool(tx, &pool_id).await?;
                    let token = agents::lock_join_token(tx, token_hash).await?;
                    let token_id = token.id;
                    if token.used {
                        return Err(Rejection::Unauthenticated(format!(
                            "join token {token_id} was already used; a join token admits one machine"
                        ))
                        .into());
                    }
                    if token.expired {
                        return Err(Rejection::Unauthenticated(format!("join token {token_id} expired")).into());
                    }
                    if token.revoked {
                        return Err(Rejection::Unauthenticated(format!("join token {token_id} was revoked")).into());
                    }
                    let pool =
                        store::pool(tx, &pool_id).await?.ok_or_else(|| corrupt("the join token's pool", "missing"))?;
                    let at_ms = clock::compute_now_ms(tx).await?;
                    let gpus = gpus_of(document);
                    let hardware = hardware_key(&document.hardware_identity());
                    let (checks, conditions) = acceptance(&pool, document, &hardware, at_ms)?;
                    let caller_for = |node: &NodeId| node_caller(node, &pool.owner_tenant_id);
                    let (node_id, rejoined) = match agents::matching_node(tx, &hardware).await? {
                        Some((node_id, matched_pool, matched)) => {
                            if matched_pool != pool_id {
                                return Err(Rejection::Conflict(format!(
                                    "this machine is node {node_id} of pool {matched_pool}; delete that node before it joins pool {pool_id}"
                                ))
                                .into());
                            }
                            let state = agents::node_state(tx, &node_id).await?;
                            let mut events = vec![NodeEvent::Rejoined(NodeRejoined {
                                node_id: node_id.clone(),
                                join_token_id: token_id.clone(),
                                matched: matched.iter().filter_map(|&i| hardware.surviving.get(i).cloned()).collect(),
                                at_ms,
                            })];
                            let (hardware_events, lost_devices) =
                                hardware_events(tx, &node_id, &state, document, &hardware, at_ms).await?;
                            events.extend(hardware_events);
                            events.extend(resources_event(tx, &node_id, document, at_ms).await?);
                            events.extend(reconnect(&node_id, &state, at_ms));
                            record_node(tx, &caller_for(&node_id), &node_id, &pool.owner_tenant_id, events).await?;
                            if lost_devices {
                                work::wake_now(tx, &WorkKey::NodeReplace(node_id.clone())).await?;
                            }
                            agents::revoke_credentials(tx, &node_id).await?;
                            // A deployment waiting for this machine's agent goes on now.
                            if let Some(running) = store::workflows::running_on(tx, node_id.as_str()).await? {
                                let running = running.parse().map_err(|err| corrupt("a workflow id", err))?;
                                work::wake_now(tx, &WorkKey::Workflow(running)).await?;
                            }
                            let number = agents::latest_snapshot(tx, &node_id).await?.map_or(0, |s| s.number);
                            agents::store_snapshot(tx, &node_id, number + 1, document).await?;
                            (node_id, true)
                        }
                        None => {
                            let node_id = NodeId::generate();
                            let name = &document.system.hostname;
                            if store::name_taken(tx, store::NamedTable::Nodes, pool_id.as_str(), name).await? {
                                return Err(Rejection::Conflict(format!(
                                    "pool {pool_id} already has a node named {name:?} that is not this machine"
                                ))
                                .into());
                            }
                            // A site agent's devices are its own: the pool books none of them.
                            let devices = if role == Role::Site { Vec::new() } else { devices_of(&node_id, document, &pool) };
                            let conditions = if role == Role::Site { Vec::new() } else { conditions.clone() };
                            store::refuse_taken_devices(tx, &devices).await?;
                            let site_id = store::pool_site(tx, &pool_id).await?;
                            let events = vec![
                                NodeEvent::Joined(NodeJoined {
                                    node_id: node_id.clone(),
                                    pool_id: pool_id.clone(),
                                    site_id,
                                    name: name.clone(),
                                    role,
                                    trust: Trust::Platform,
                                    owner_tenant_id: None,
                                    join_token_id: token_id.clone(),
                                    gpus,
                                    devices,
                                    conditions,
                                    hardware: hardware.clone(),
                                    generation: 1,
                                    spec: spec_for(&pool),
                                    at_ms,
                                }),
                                NodeEvent::Adopted(NodeAdopted { node_id: node_id.clone(), checks, at_ms }),
                            ];
                            let resources = if role == Role::Site { Default::default() } else { scalars_of(document) };
                            let mut events = events;
                            if !resources.is_empty() {
                                events.push(NodeEvent::ResourcesChanged(NodeResourcesChanged {
                                    node_id: node_id.clone(),
                                    resources,
                                    at_ms,
                                }));
                            }
                            record(
                                tx,
                                &caller_for(&node_id),
                                node_id.as_str(),
                                &pool.owner_tenant_id,
                                ExpectedVersion::Exact(0),
                                events,
                            )
                            .await?;
                            agents::store_snapshot(tx, &node_id, 1, document).await?;
                            (node_id, false)
                        }
                    };
                    agents::use_join_token(tx, &token_id, &node_id).await?;
                    agents::insert_credential(tx, credential_hash, &node_id, true).await?;
                    // A machine that joins again has a new key: the certificates of its earlier life end.
                    certificates::revoke_all(tx, &node_id).await?;
                    let certificate = match &request.csr {
                        Some(csr) => Some(self.sign_node_certificate(tx, &node_id, csr).await?),
                        None => None,
                    };
                    let session_id = agents::upsert_session(tx, &node_id, &request.agent_version, lease).await?;
                    work::wake_now(tx, &WorkKey::pool_pending(&pool_id)).await?;
                    let session = self.session(tx, &node_id, session_id).await?;
                    Ok::<_, AppError>((node_id, rejoined, session, certificate))
                }
                .scope_boxed()
            })
            .await?;
        let (node_id, rejoined, session, certificate) = joined;
        Ok(Joined { node_id, credential, rejoined, session, certificate: certificate.map(|c| c.certificate) })
    }

    /// Signs `csr` for `node_id` with the bundle's CA and records the certificate, in the caller's transaction.
    async fn sign_node_certificate(&self, tx: &mut Tx, node_id: &NodeId, csr: &str) -> AppResult<NodeCertificate> {
        let Some(bundle) = &self.pki else {
            return Err(Rejection::invalid(
                "csr",
                "this control plane signs no certificates: it serves without a PKI bundle (leave csr out)",
            )
            .into());
        };
        let lifetime = self.node_certificate_lifetime.as_secs().min(i64::MAX as u64) as i64;
        let issued = bundle.sign_node_csr(csr, node_id.as_str(), lifetime).map_err(|err| match err {
            bc_pki::PkiError::InvalidCsr(reason) => AppError::from(Rejection::invalid("csr", reason)),
            other => AppError::Store(bc_eventstore::Error::Internal(format!("sign a node certificate: {other}"))),
        })?;
        certificates::insert(tx, &issued.serial, node_id, issued.not_after).await?;
        Ok(NodeCertificate {
            node_id: node_id.clone(),
            certificate: issued.pem,
            serial: issued.serial,
            not_after: issued.not_after,
        })
    }

    /// A node's next certificate, for `csr`. Its earlier certificates stay valid until they expire, so a
    /// rotation whose answer was lost leaves the node its current one.
    pub async fn issue_node_certificate(
        &self,
        node: &NodeAuth,
        request: &CertificateRequest,
    ) -> AppResult<NodeCertificate> {
        let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
        let issued = self.sign_node_certificate(&mut tx, &node.node_id, &request.csr).await?;
        tx.commit().await?;
        Ok(issued)
    }

    /// Whether `node` holds a certificate that is neither expired nor revoked.
    pub async fn node_has_live_certificate(&self, node: &NodeId) -> AppResult<bool> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let live = certificates::has_live(&mut tx, node).await?;
        tx.commit().await?;
        Ok(live)
    }

    /// Keeps `secret` (a BMC's password, a provider's key) sealed with the bundle's sealing key, bound to its
    /// `kind` and `owner_id`: never in the clear, never in an event.
    pub async fn seal_secret(&self, kind: &str, owner_id: &str, secret: &[u8]) -> AppResult<()> {
        let sealer = self.sealer()?;
        let sealed = sealer.seal(secret, &secret_context(kind, owner_id)).map_err(pki_failure)?;
        let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
        certificates::put_secret(&mut tx, kind, owner_id, &sealed).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The secret of `kind` for `owner_id`, opened; `None` when there is none.
    pub async fn open_secret(&self, kind: &str, owner_id: &str) -> AppResult<Option<Vec<u8>>> {
        let sealer = self.sealer()?;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let sealed = certificates::secret(&mut tx, kind, owner_id).await?;
        tx.commit().await?;
        sealed.map(|sealed| sealer.open(&sealed, &secret_context(kind, owner_id)).map_err(pki_failure)).transpose()
    }

    pub(crate) fn sealer(&self) -> AppResult<&bc_pki::seal::Sealer> {
        match &self.pki {
            Some(bundle) => Ok(bundle.sealer()),
            None => Err(Rejection::Conflict(
                "no PKI bundle: secrets are sealed with its key (serve with --pki-dir)".to_owned(),
            )
            .into()),
        }
    }

    /// The node certificates revoked and not yet expired: serial and when it was revoked (seconds since the
    /// epoch), oldest revocation first.
    pub async fn revoked_certificates(&self) -> AppResult<Vec<(String, i64)>> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let revoked = certificates::revoked(&mut tx).await?;
        tx.commit().await?;
        Ok(revoked)
    }

    /// The revocation list of the node certificates revoked and not yet expired, signed by the CA (DER), or
    /// `None` without a PKI.
    pub async fn revocation_list(&self) -> AppResult<Option<Vec<u8>>> {
        let revoked = self.revoked_certificates().await?;
        self.revocation_list_of(&revoked)
    }

    /// The revocation list of `revoked`, signed by the CA (DER), or `None` without a PKI. Its number grows with
    /// every revocation, so a newer list has a higher one.
    pub fn revocation_list_of(&self, revoked: &[(String, i64)]) -> AppResult<Option<Vec<u8>>> {
        let Some(bundle) = &self.pki else { return Ok(None) };
        let latest = revoked.iter().map(|(_, at)| *at).max().unwrap_or(0).max(0) as u64;
        let number = latest.saturating_mul(1_000).saturating_add(revoked.len() as u64);
        let revoked: Vec<bc_pki::RevokedCertificate> = revoked
            .iter()
            .map(|(serial, revoked_at)| bc_pki::RevokedCertificate { serial: serial.clone(), revoked_at: *revoked_at })
            .collect();
        let der = bundle.revocation_list(&revoked, number).map_err(|err| {
            AppError::Store(bc_eventstore::Error::Internal(format!("sign the revocation list: {err}")))
        })?;
        Ok(Some(der))
    }

    /// The session as the agent gets it, read in the transaction that opened it.
    async fn session(&self, tx: &mut Tx, node_id: &NodeId, session_id: SessionId) -> AppResult<Session> {
        let state = agents::node_state(tx, node_id).await?;
        let hashes = agents::latest_snapshot(tx, node_id).await?.map(|s| s.hashes).unwrap_or_default();
        Ok(Session {
            session_id,
            node_id: node_id.clone(),
            heartbeat_ms: self.liveness.heartbeat.as_millis() as u64,
            lease_ms: self.liveness.lease.as_millis() as u64,
            generation: state.generation,
            spec: state.spec,
            inventory_hashes: hashes,
        })
    }

    /// The node a credential belongs to, or `UNAUTHENTICATED`. The first use of a rotated credential confirms
    /// it and revokes the node's other credentials.
    pub async fn authenticate_node(&self, credential: &str) -> AppResult<NodeAuth> {
        if !credential.starts_with(CREDENTIAL_PREFIX) {
            return Err(Rejection::Unauthenticated(format!("a node credential starts with {CREDENTIAL_PREFIX}")).into());
        }
        let hash = bc_domain::sha256_hex(credential);
        let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
        let Some(row) = agents::credential(&mut tx, &hash).await? else {
            tx.commit().await?;
            return Err(Rejection::Unauthenticated("the node credential is unknown or revoked".to_owned()).into());
        };
        let auth = NodeAuth { node_id: row.node_id, pool_id: row.pool_id, tenant_id: row.tenant_id };
        if !row.confirmed {
            agents::confirm_credential(&mut tx, &auth.node_id, &hash).await?;
        }
        tx.commit().await?;
        Ok(auth)
    }

    /// Issues the node a new credential. The current one keeps working until the new one is first used.
    pub async fn rotate_credential(&self, node: &NodeAuth) -> AppResult<String> {
        let (credential, hash) = new_secret(CREDENTIAL_PREFIX)?;
        let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
        agents::insert_credential(&mut tx, &hash, &node.node_id, false).await?;
        tx.commit().await?;
        Ok(credential)
    }

    /// An agent (re)starting opens a session: any earlier session of the node ends, and a node that was not
    /// connected is connected again.
    pub async fn open_session(&self, node: &NodeAuth, agent_version: &str) -> AppResult<Session> {
        let lease = self.liveness.lease;
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                async move {
                    let state = agents::node_state(tx, &node.node_id).await?;
                    let at_ms = clock::compute_now_ms(tx).await?;
                    let events = reconnect(&node.node_id, &state, at_ms);
                    record_node(tx, &node.caller(), &node.node_id, &node.tenant_id, events).await?;
                    let session_id = agents::upsert_session(tx, &node.node_id, agent_version, lease).await?;
                    work::wake_now(tx, &WorkKey::pool_pending(&node.pool_id)).await?;
                    self.session(tx, &node.node_id, session_id).await
                }
                .scope_boxed()
            })
            .await
    }

    /// A heartbeat renews the session's liveness lease in one round trip (BEGIN, one call, COMMIT), shared with
    /// the heartbeats that arrived at the same moment ([`crate::beats`]); only when the
    /// log must record something (the node back to `connected`, a newly observed generation, clock skew crossing
    /// its limit) does it run a command transaction as well.
    pub async fn heartbeat(&self, node: &NodeAuth, beat: &Heartbeat) -> AppResult<HeartbeatReply> {
        bc_domain::agent::check_gpu_samples(&beat.gpu_utilization)?;
        let row = self.renew(self.beat_item(agents::Beater::Node(node.node_id.clone()), beat)).await?;
        let Some(row) = row else {
            return Err(Rejection::Conflict(format!(
                "session {} of node {} is not current: another session replaced it; open a new one",
                beat.session_id, node.node_id
            ))
            .into());
        };
        self.finish_heartbeat(node, beat, row).await
    }

    /// A heartbeat authenticated by the node credential itself, in one statement: the credential's node is looked
    /// up in the call of `agent_heartbeat`. A credential that is unknown or not yet confirmed, or a session that
    /// is not current, takes the slow path, which says which it is (or confirms the credential).
    ///
    /// `certified` is the node a verified client certificate names, where the connection must carry one: the
    /// credential must then be that node's.
    pub async fn heartbeat_with_credential(
        &self,
        credential: &str,
        beat: &Heartbeat,
        certified: Option<&str>,
    ) -> AppResult<HeartbeatReply> {
        if !credential.starts_with(CREDENTIAL_PREFIX) {
            return Err(Rejection::Unauthenticated(format!("a node credential starts with {CREDENTIAL_PREFIX}")).into());
        }
        bc_domain::agent::check_gpu_samples(&beat.gpu_utilization)?;
        let hash = bc_domain::sha256_hex(credential);
        let beater = agents::Beater::CredentialHash(hash, certified.map(str::to_owned));
        let row = self.renew(self.beat_item(beater, beat)).await?;
        let Some(row) = row else {
            let node = self.authenticate_node(credential).await?;
            check_certified(&node, certified)?;
            return self.heartbeat(&node, beat).await;
        };
        let node =
            NodeAuth { node_id: row.node_id.clone(), pool_id: row.pool_id.clone(), tenant_id: row.tenant_id.clone() };
        self.finish_heartbeat(&node, beat, row).await
    }

    /// Renews a heartbeat's session together with the heartbeats waiting beside it ([`crate::beats`]), or alone
    /// in one call when its batch could not be written. `None`: the session is not current, or the credential
    /// unknown.
    async fn renew(&self, item: agents::BeatItem) -> AppResult<Option<agents::Beat>> {
        let batcher = self.beats.get_or_init(|| crate::beats::Batcher::start(&self.db));
        // A copy, for the path alone: a writer that goes away with the runtime that started it takes the queued one.
        if let Some(row) = batcher.beat(item.clone()).await {
            return Ok(row);
        }
        agents::beat(self.db.call(TxOptions::READ_COMMITTED, &item.call()).await?)
    }

    fn beat_item(&self, beater: agents::Beater, beat: &Heartbeat) -> agents::BeatItem {
        agents::BeatItem {
            beater,
            session_id: beat.session_id.clone(),
            lease: self.liveness.lease,
            clock_ms: beat.clock_ms,
        }
    }

    /// What a renewed session's row calls for: the log's changes when there are any, and the reply.
    async fn finish_heartbeat(
        &self,
        node: &NodeAuth,
        beat: &Heartbeat,
        row: agents::Beat,
    ) -> AppResult<HeartbeatReply> {
        let (generation, observed, skew_ms) = (row.generation, row.observed_generation, row.clock_skew_ms);
        let (connectivity, skew_raised) = (row.connectivity.as_str(), row.skew_raised);
        let skewed = skew_ms.abs() > MAX_CLOCK_SKEW_MS;
        let newly_observed = beat.observed_generation > observed && beat.observed_generation <= generation;
        if beat.observed_generation > generation {
            return Err(Rejection::invalid(
                "observedGeneration",
                format!("{} is ahead of the node's generation {generation}", beat.observed_generation),
            )
            .into());
        }
        if connectivity != "connected" || newly_observed || skewed != skew_raised {
            self.heartbeat_changes(node, beat.observed_generation, skew_ms).await?;
        }
        if !beat.gpu_utilization.is_empty() {
            self.record_utilization(&node.node_id, &beat.gpu_utilization).await;
        }
        Ok(HeartbeatReply {
            lease_expires_ms: row.expires_ms,
            generation,
            spec: if beat.observed_generation < generation {
                Some(serde_json::from_str(&row.spec).map_err(|err| corrupt("nodes.spec", err))?)
            } else {
                None
            },
            commands_waiting: row.waiting,
        })
    }

    /// Adds a heartbeat's GPU samples to the node's current hour: one more statement, only for a heartbeat that
    /// carries samples. The samples only feed the ledger's utilization, so a failed write loses them and the
    /// heartbeat still counts.
    async fn record_utilization(&self, node_id: &NodeId, samples: &[bc_domain::agent::GpuSample]) {
        let call = agents::utilization_call(node_id, samples);
        if let Err(err) = self.db.call(TxOptions::READ_COMMITTED, &call).await {
            tracing::warn!(node = %node_id, error = %err, "a heartbeat's GPU utilization samples were not recorded");
        }
    }

    async fn heartbeat_changes(&self, node: &NodeAuth, observed_generation: u64, skew_ms: i64) -> AppResult<()> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                async move {
                    let state = agents::node_state(tx, &node.node_id).await?;
                    let at_ms = clock::compute_now_ms(tx).await?;
                    let node_id = &node.node_id;
                    let mut events = reconnect(node_id, &state, at_ms);
                    if observed_generation > state.observed_generation && observed_generation <= state.generation {
                        events.push(NodeEvent::SpecObserved(NodeSpecObserved {
                            node_id: node_id.clone(),
                            observed_generation,
                            at_ms,
                        }));
                    }
                    events.extend(follow_condition(
                        node_id,
                        &state,
                        ConditionType::ClockSkew,
                        skew_ms.abs() > MAX_CLOCK_SKEW_MS,
                        || {
                            format!(
                                "the agent's clock is {skew_ms} ms off the database server's (limit {MAX_CLOCK_SKEW_MS} ms)"
                            )
                        },
                        at_ms,
                    ));
                    let frees = !events.is_empty();
                    record_node(tx, &node.caller(), node_id, &node.tenant_id, events).await?;
                    if frees {
                        work::wake_now(tx, &WorkKey::pool_pending(&node.pool_id)).await?;
                    }
                    Ok(())
                }
                .scope_boxed()
            })
            .await
    }

    /// The agent reports its inventory: every section's hash and the sections that changed. A report missing a
    /// section the control plane does not hold is refused (`CONFLICT`, naming it), and the agent sends it
    /// whole. A changed document is a new snapshot; changed GPUs or identifiers change the node.
    pub async fn report_inventory(&self, node: &NodeAuth, report: InventoryReport) -> AppResult<InventoryAccepted> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let report = &report;
                async move {
                    let held = agents::latest_snapshot(tx, &node.node_id).await?;
                    let document =
                        report.clone().apply(held.as_ref().map(|s| &s.document)).map_err(|err| match err {
                            ReportError::Missing(section) => Rejection::Conflict(format!(
                                "the control plane does not hold section {} of this inventory; send it whole",
                                section_name(section)
                            )),
                            other => Rejection::invalid("inventory", other.to_string()),
                        })?;
                    check_inventory(&document)?;
                    let hashes = document.hashes();
                    let number = held.as_ref().map_or(0, |s| s.number);
                    let previous = held.as_ref().map(|s| s.hashes.clone()).unwrap_or_default();
                    if held.is_some() && previous == hashes {
                        return Ok(InventoryAccepted { snapshot: number, changed: Vec::new(), hashes });
                    }
                    let changed: Vec<_> = bc_domain::inventory::Section::ALL
                        .into_iter()
                        .filter(|s| previous.get(s) != hashes.get(s))
                        .collect();
                    let at_ms = clock::compute_now_ms(tx).await?;
                    agents::store_snapshot(tx, &node.node_id, number + 1, &document).await?;
                    let state = agents::node_state(tx, &node.node_id).await?;
                    let mut events = vec![NodeEvent::InventoryReported(NodeInventoryReported {
                        node_id: node.node_id.clone(),
                        snapshot: number + 1,
                        hashes: hashes.clone(),
                        changed: changed.clone(),
                        at_ms,
                    })];
                    let hardware = hardware_key(&document.hardware_identity());
                    let (more, lost_devices) =
                        hardware_events(tx, &node.node_id, &state, &document, &hardware, at_ms).await?;
                    let resources = resources_event(tx, &node.node_id, &document, at_ms).await?;
                    let node_changed = !more.is_empty() || resources.is_some();
                    events.extend(more);
                    events.extend(resources);
                    record_node(tx, &node.caller(), &node.node_id, &node.tenant_id, events).await?;
                    if lost_devices {
                        work::wake_now(tx, &WorkKey::NodeReplace(node.node_id.clone())).await?;
                    }
                    if node_changed {
                        work::wake_now(tx, &WorkKey::pool_pending(&node.pool_id)).await?;
                    }
                    Ok(InventoryAccepted { snapshot: number + 1, changed, hashes })
                }
                .scope_boxed()
            })
            .await
    }

    /// The commands deliverable to the node now, in `seq` order.
    pub async fn agent_commands(&self, node: &NodeAuth, limit: u32) -> AppResult<Vec<AgentCommand>> {
        let limit = i64::from(limit.clamp(1, 100));
        self.db
            .transaction_with_retry(TxOptions::READ_COMMITTED, &self.retry, |tx| {
                async move { commands::deliverable(tx, &node.node_id, limit).await }.scope_boxed()
            })
            .await
    }

    /// The agent acknowledges a command. A binding acknowledged on every node activates the reservation; one
    /// that failed fails it; a release acknowledged everywhere completes it.
    pub async fn acknowledge_command(&self, node: &NodeAuth, command_id: &CommandId, ack: &Ack) -> AppResult<String> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                async move {
                    let acked =
                        commands::acknowledge(tx, &node.node_id, command_id, ack.ok, ack.message.as_deref()).await?;
                    let (true, Some(reservation_id)) = (acked.changed, acked.reservation_id.as_ref()) else {
                        return Ok(acked.state);
                    };
                    let Some(r) = store::reservation(tx, reservation_id).await? else { return Ok(acked.state) };
                    if !r.awaiting.contains(&node.node_id) {
                        return Ok(acked.state);
                    }
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let command = match (acked.kind.as_str(), r.state, ack.ok) {
                        ("bind", ReservationState::Binding, false) => {
                            Some(Command::Fail { reason: FailureReason::BindingFailed, now_ms })
                        }
                        ("bind", ReservationState::Binding, true)
                            if commands::all_succeeded(tx, reservation_id, "bind").await? =>
                        {
                            Some(Command::Activate { now_ms })
                        }
                        ("unbind", ReservationState::Releasing, true)
                            if commands::all_succeeded(tx, reservation_id, "unbind").await? =>
                        {
                            Some(Command::CompleteRelease { now_ms, unconfirmed: false })
                        }
                        _ => None,
                    };
                    if let Some(command) = command {
                        let events = reservation::decide(&r, &command)?;
                        apply_and_schedule(tx, &node.caller(), r, events, now_ms).await?;
                    }
                    Ok(acked.state)
                }
                .scope_boxed()
            })
            .await
    }
}

fn section_name(section: bc_domain::inventory::Section) -> &'static str {
    match section {
        bc_domain::inventory::Section::System => "system",
        bc_domain::inventory::Section::Gpus => "gpus",
        bc_domain::inventory::Section::Nics => "nics",
        bc_domain::inventory::Section::Disks => "disks",
    }
}

/// Checks an inventory document before anything is stored: GPU UUIDs that leave room for the device ids made
/// from them, and no NUL character anywhere (PostgreSQL's `jsonb` cannot hold one).
fn check_inventory(document: &NodeInventory) -> Result<(), Rejection> {
    bc_domain::device::check_gpus("inventory.gpus", document.gpus.iter().map(|g| &g.info))?;
    bc_domain::device::check_no_nul("inventory", document)
}

/// Refuses a node credential used on a connection whose client certificate names another node.
pub fn check_certified(node: &NodeAuth, certified: Option<&str>) -> AppResult<()> {
    match certified {
        Some(name) if name != node.node_id.as_str() => Err(Rejection::Unauthenticated(format!(
            "the client certificate is node {name}'s, but the credential is node {}'s",
            node.node_id
        ))
        .into()),
        _ => Ok(()),
    }
}

/// What a ramdisk's inspection found, checked as a join checks its inventory: the whole document.
pub(crate) fn inspected_document(report: &InventoryReport) -> Result<NodeInventory, Rejection> {
    if report.schema != bc_domain::inventory::SCHEMA {
        return Err(Rejection::invalid(
            "inventory.schema",
            format!("expected {}, got {:?}", bc_domain::inventory::SCHEMA, report.schema),
        ));
    }
    let document = report.clone().apply(None).map_err(|err| match err {
        ReportError::Missing(section) => {
            Rejection::invalid(format!("inventory.{}", section_name(section)), "an inspection sends every section")
        }
        other => Rejection::invalid("inventory", other.to_string()),
    })?;
    check_name("inventory.system.hostname", &document.system.hostname)?;
    check_inventory(&document)?;
    Ok(document)
}

/// Records what the inspection of an enrolled machine found, in the caller's transaction: its GPUs, devices
/// and hardware identity (so the agent of the deployed machine is recognised as this node when it joins), and
/// the inventory snapshot. Devices of another node refuse it.
pub(crate) async fn record_inspection(
    tx: &mut Tx,
    caller: &Caller,
    node_id: &NodeId,
    document: &NodeInventory,
) -> AppResult<String> {
    let state = agents::node_state(tx, node_id).await?;
    let pool = store::pool(tx, &state.pool_id).await?.ok_or_else(|| corrupt("the node's pool", "missing"))?;
    let at_ms = clock::compute_now_ms(tx).await?;
    let hardware = hardware_key(&document.hardware_identity());
    if let Some((holder, _, _)) = agents::matching_node(tx, &hardware).await?
        && holder != *node_id
    {
        return Err(Rejection::Conflict(format!(
            "this machine's hardware identifiers are node {holder}'s: delete that node before inspecting it as \
             {node_id}"
        ))
        .into());
    }
    let gpus = gpus_of(document);
    let devices = devices_of(node_id, document, &pool);
    let kept: BTreeSet<&str> = devices.iter().map(|d| d.id.as_str()).collect();
    let held = agents::node_devices(tx, node_id, false).await?;
    let own: BTreeSet<&str> = held.iter().map(DeviceId::as_str).collect();
    let fresh: Vec<Device> = devices.iter().filter(|d| !own.contains(d.id.as_str())).cloned().collect();
    store::refuse_taken_devices(tx, &fresh).await?;
    let removed_devices: Vec<DeviceId> = held.iter().filter(|id| !kept.contains(id.as_str())).cloned().collect();
    let summary = format!("{} GPUs, host {}", gpus.len(), document.system.hostname);
    let event = NodeEvent::HardwareChanged(NodeHardwareChanged {
        node_id: node_id.clone(),
        gpus,
        devices,
        removed_devices,
        hardware,
        at_ms,
    });
    let mut events = vec![event];
    events.extend(resources_event(tx, node_id, document, at_ms).await?);
    record_node(tx, caller, node_id, &pool.owner_tenant_id, events).await?;
    let number = agents::latest_snapshot(tx, node_id).await?.map_or(0, |s| s.number);
    agents::store_snapshot(tx, node_id, number + 1, document).await?;
    Ok(summary)
}
