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
    Ack, AgentCommand, CREDENTIAL_PREFIX, Heartbeat, HeartbeatReply, InventoryAccepted, JOIN_TOKEN_PREFIX, JoinRequest,
    Joined, Session,
};
use bc_domain::device::{Device, GpuInfo, devices_for};
use bc_domain::hardware::{HardwareKey, hardware_key};
use bc_domain::id::{CommandId, DeviceId, Identity, JoinTokenId, NodeId, PoolId, SessionId, TenantId};
use bc_domain::inventory::{InventoryReport, NodeInventory, ReportError, SectionHashes};
use bc_domain::node::{
    Condition, ConditionType, Connectivity, MAX_CLOCK_SKEW_MS, NodeAdopted, NodeConditionCleared, NodeConditionRaised,
    NodeConnectivityChanged, NodeEvent, NodeHardwareChanged, NodeInventoryReported, NodeJoined, NodeRejoined, NodeSpec,
    NodeSpecObserved, Role, Trust,
};
use bc_domain::reservation::{self, Command, FailureReason, ReservationState};
use bc_domain::{acceptance, gpu, site::check_name};
use bc_eventstore::events::ExpectedVersion;
use bc_eventstore::queue::shard_for;
use bc_eventstore::{ScopedFutureExt as _, Tx, TxOptions, clock, sql};
use sqlx::Row as _;

use super::fleet::owned_pool;
use super::node_commands as commands;
use super::reservations::apply_and_schedule;
use super::store::{self, PoolRow, corrupt};
use super::work::{self, SHARDS, WorkKey};
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

fn node_caller(node_id: &NodeId, tenant: &TenantId) -> Caller {
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
fn new_secret(prefix: &str) -> AppResult<(String, String)> {
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
fn devices_of(document: &NodeInventory, pool: &PoolRow) -> Vec<Device> {
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

/// A stored snapshot: its number, document and hashes.
struct Snapshot {
    number: u64,
    document: NodeInventory,
    hashes: SectionHashes,
}

async fn latest_snapshot(tx: &mut Tx, node_id: &NodeId) -> AppResult<Option<Snapshot>> {
    let row = sql::query(
        "SELECT snapshot, document::text AS document, hashes::text AS hashes FROM node_inventory_snapshots
         WHERE node_id = $1 ORDER BY snapshot DESC LIMIT 1",
    )
    .bind(node_id.as_str())
    .fetch_optional(tx.conn())
    .await?;
    let Some(row) = row else { return Ok(None) };
    let document: String = row.try_get("document")?;
    let hashes: String = row.try_get("hashes")?;
    Ok(Some(Snapshot {
        number: row.try_get::<i64, _>("snapshot")? as u64,
        document: serde_json::from_str(&document).map_err(|err| corrupt("an inventory snapshot", err))?,
        hashes: serde_json::from_str(&hashes).map_err(|err| corrupt("an inventory snapshot's hashes", err))?,
    }))
}

async fn store_snapshot(tx: &mut Tx, node_id: &NodeId, number: u64, document: &NodeInventory) -> AppResult<()> {
    let json = |text: serde_json::Result<String>| text.map_err(|err| corrupt("an inventory snapshot", err));
    sql::query(
        "INSERT INTO node_inventory_snapshots (node_id, snapshot, document, hashes) VALUES ($1, $2, $3::jsonb, $4::jsonb)",
    )
    .bind(node_id.as_str())
    .bind(number as i64)
    .bind(json(serde_json::to_string(document))?)
    .bind(json(serde_json::to_string(&document.hashes()))?)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// Opens (or replaces) a node's session, renewing its lease; returns the new session id.
async fn upsert_session(tx: &mut Tx, node_id: &NodeId, agent_version: &str, lease: Duration) -> AppResult<SessionId> {
    let session = SessionId::generate();
    sql::query(
        "INSERT INTO agent_sessions (node_id, session_id, shard, agent_version, expires_at)
         VALUES ($1, $2, $3, $4, compute_now() + make_interval(secs => $5))
         ON CONFLICT (node_id) DO UPDATE
             SET session_id = excluded.session_id, agent_version = excluded.agent_version,
                 started_at = compute_now(), heartbeat_at = compute_now(), expires_at = excluded.expires_at",
    )
    .bind(node_id.as_str())
    .bind(session.as_str())
    .bind(shard_for(node_id.as_str(), SHARDS) as i32)
    .bind(agent_version)
    .bind(lease.as_secs_f64())
    .execute(tx.conn())
    .await?;
    Ok(session)
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

/// What the node row says about connectivity and conditions.
struct NodeState {
    pool_id: PoolId,
    connectivity: Connectivity,
    generation: u64,
    observed_generation: u64,
    spec: NodeSpec,
    conditions: Vec<Condition>,
}

impl NodeState {
    fn has(&self, kind: ConditionType) -> bool {
        self.conditions.iter().any(|c| c.kind == kind)
    }
}

async fn node_state(tx: &mut Tx, node_id: &NodeId) -> AppResult<NodeState> {
    let row = sql::query(
        "SELECT n.pool_id, n.connectivity, n.generation, n.observed_generation, n.spec::text AS spec,
                n.conditions::text AS conditions
         FROM nodes AS n WHERE n.id = $1",
    )
    .bind(node_id.as_str())
    .fetch_optional(tx.conn())
    .await?;
    let Some(row) = row else { return Err(Rejection::NotFound { kind: "node", id: node_id.to_string() }.into()) };
    let text = |column: &str| -> AppResult<String> { Ok(row.try_get::<String, _>(column)?) };
    Ok(NodeState {
        pool_id: text("pool_id")?.parse().map_err(|err| corrupt("nodes.pool_id", err))?,
        connectivity: serde_json::from_value(serde_json::Value::String(text("connectivity")?))
            .map_err(|err| corrupt("nodes.connectivity", err))?,
        generation: row.try_get::<i64, _>("generation")?.max(0) as u64,
        observed_generation: row.try_get::<i64, _>("observed_generation")?.max(0) as u64,
        spec: serde_json::from_str(&text("spec")?).unwrap_or_default(),
        conditions: serde_json::from_str(&text("conditions")?).map_err(|err| corrupt("nodes.conditions", err))?,
    })
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

async fn node_gpus(tx: &mut Tx, node_id: &NodeId) -> AppResult<Vec<DeviceId>> {
    let ids: Vec<String> = sql::query_scalar("SELECT id FROM devices WHERE node_id = $1 AND class = 'gpu' ORDER BY id")
        .bind(node_id.as_str())
        .fetch_all(tx.conn())
        .await?;
    ids.into_iter().map(|id| id.parse().map_err(|err| corrupt("devices.id", err))).collect()
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
    let held = node_gpus(tx, node_id).await?;
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
    let stored_key: Option<String> = sql::query_scalar("SELECT hardware_key FROM nodes WHERE id = $1")
        .bind(node_id.as_str())
        .fetch_one(tx.conn())
        .await?;
    let swapped = !count_mismatch && (!change.removed.is_empty() || !change.added.is_empty());
    let identity_changed = stored_key.as_deref() != Some(hardware.key.as_str());
    if !(swapped || identity_changed) || count_mismatch {
        return Ok((events, false));
    }
    let pool = store::pool(tx, &state.pool_id).await?.ok_or_else(|| corrupt("the node's pool", "missing"))?;
    let devices = devices_of(document, &pool);
    let kept: BTreeSet<&str> = devices.iter().map(|d| d.id.as_str()).collect();
    let removed_devices: Vec<DeviceId> =
        sql::query_scalar::<String>("SELECT id FROM devices WHERE node_id = $1 ORDER BY id")
            .bind(node_id.as_str())
            .fetch_all(tx.conn())
            .await?
            .into_iter()
            .filter(|id| !kept.contains(id.as_str()))
            .map(|id| id.parse().map_err(|err| corrupt("devices.id", err)))
            .collect::<AppResult<_>>()?;
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

fn list(ids: &[DeviceId]) -> String {
    ids.iter().map(DeviceId::as_str).collect::<Vec<_>>().join(", ")
}

/// A node's existing match for a machine: the node sharing the most identifiers, at least two.
async fn matching_node(tx: &mut Tx, hardware: &HardwareKey) -> AppResult<Option<(NodeId, PoolId, Vec<usize>)>> {
    let (kinds, values): (Vec<&str>, Vec<&str>) = hardware.surviving.iter().map(|i| i.parts()).unzip();
    let row = sql::query(
        "SELECT i.node_id, n.pool_id, array_agg(u.ord ORDER BY u.ord) AS matched
         FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(kind, value, ord)
         JOIN node_identifiers AS i ON i.kind = u.kind AND i.value = u.value
         JOIN nodes AS n ON n.id = i.node_id
         GROUP BY i.node_id, n.pool_id
         HAVING count(*) >= $3
         ORDER BY count(*) DESC, i.node_id
         LIMIT 1",
    )
    .bind(&kinds)
    .bind(&values)
    .bind(bc_domain::hardware::MIN_MATCHING_IDENTIFIERS as i64)
    .fetch_optional(tx.conn())
    .await?;
    let Some(row) = row else { return Ok(None) };
    let node: String = row.try_get("node_id")?;
    let pool: String = row.try_get("pool_id")?;
    let matched: Vec<i64> = row.try_get("matched")?;
    Ok(Some((
        node.parse().map_err(|err| corrupt("node_identifiers.node_id", err))?,
        pool.parse().map_err(|err| corrupt("nodes.pool_id", err))?,
        matched.into_iter().map(|i| (i - 1) as usize).collect(),
    )))
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
                    let at_ms = clock::compute_now_ms(tx).await?;
                    let events = bc_domain::pool::issue_join_token(pool_id, id, ttl_s, MAX_JOIN_TOKEN_TTL_S, at_ms)?;
                    let expires_at_ms = at_ms + ttl_s as i64 * 1000;
                    sql::query(
                        "INSERT INTO join_tokens (id, secret_sha256, pool_id, created_by, expires_at)
                         VALUES ($1, $2, $3, $4, ms_ts($5))",
                    )
                    .bind(id.as_str())
                    .bind(hash)
                    .bind(pool_id.as_str())
                    .bind(caller.identity.as_str())
                    .bind(expires_at_ms)
                    .execute(tx.conn())
                    .await?;
                    // Each token is a stream of its own, so that tokens issued at once for one pool never race
                    // for the pool stream's next version.
                    let position =
                        record(tx, caller, id.as_str(), &pool.owner_tenant_id, ExpectedVersion::Exact(0), events)
                            .await?;
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
                    let pool_id: Option<String> =
                        sql::query_scalar("SELECT pool_id FROM join_tokens WHERE secret_sha256 = $1")
                            .bind(token_hash)
                            .fetch_optional(tx.conn())
                            .await?;
                    let Some(pool_id) = pool_id else {
                        return Err(Rejection::Unauthenticated("the join token is unknown".to_owned()).into());
                    };
                    let pool_id: PoolId = pool_id.parse().map_err(|err| corrupt("join_tokens.pool_id", err))?;
                    store::lock_pool(tx, &pool_id).await?;
                    let token = sql::query(
                        "SELECT id, used_at IS NOT NULL AS used, expires_at <= compute_now() AS expired
                         FROM join_tokens WHERE secret_sha256 = $1 FOR UPDATE",
                    )
                    .bind(token_hash)
                    .fetch_one(tx.conn())
                    .await?;
                    let token_id: String = token.try_get("id")?;
                    let token_id: JoinTokenId = token_id.parse().map_err(|err| corrupt("join_tokens.id", err))?;
                    if token.try_get::<bool, _>("used")? {
                        return Err(Rejection::Unauthenticated(format!(
                            "join token {token_id} was already used; a join token admits one machine"
                        ))
                        .into());
                    }
                    if token.try_get::<bool, _>("expired")? {
                        return Err(Rejection::Unauthenticated(format!("join token {token_id} expired")).into());
                    }
                    let pool =
                        store::pool(tx, &pool_id).await?.ok_or_else(|| corrupt("the join token's pool", "missing"))?;
                    let at_ms = clock::compute_now_ms(tx).await?;
                    let gpus = gpus_of(document);
                    let hardware = hardware_key(&document.hardware_identity());
                    let (checks, conditions) = acceptance(&pool, document, &hardware, at_ms)?;
                    let caller_for = |node: &NodeId| node_caller(node, &pool.owner_tenant_id);
                    let (node_id, rejoined) = match matching_node(tx, &hardware).await? {
                        Some((node_id, matched_pool, matched)) => {
                            if matched_pool != pool_id {
                                return Err(Rejection::Conflict(format!(
                                    "this machine is node {node_id} of pool {matched_pool}; delete that node before it joins pool {pool_id}"
                                ))
                                .into());
                            }
                            let state = node_state(tx, &node_id).await?;
                            let mut events = vec![NodeEvent::Rejoined(NodeRejoined {
                                node_id: node_id.clone(),
                                join_token_id: token_id.clone(),
                                matched: matched.iter().filter_map(|&i| hardware.surviving.get(i).cloned()).collect(),
                                at_ms,
                            })];
                            let (hardware_events, lost_devices) =
                                hardware_events(tx, &node_id, &state, document, &hardware, at_ms).await?;
                            events.extend(hardware_events);
                            events.extend(reconnect(&node_id, &state, at_ms));
                            record_node(tx, &caller_for(&node_id), &node_id, &pool.owner_tenant_id, events).await?;
                            if lost_devices {
                                work::wake_now(tx, &WorkKey::NodeReplace(node_id.clone())).await?;
                            }
                            sql::query("DELETE FROM node_credentials WHERE node_id = $1")
                                .bind(node_id.as_str())
                                .execute(tx.conn())
                                .await?;
                            let number = latest_snapshot(tx, &node_id).await?.map_or(0, |s| s.number);
                            store_snapshot(tx, &node_id, number + 1, document).await?;
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
                            let devices = devices_of(document, &pool);
                            store::refuse_taken_devices(tx, &devices).await?;
                            let site_id = store::pool_site(tx, &pool_id).await?;
                            let events = vec![
                                NodeEvent::Joined(NodeJoined {
                                    node_id: node_id.clone(),
                                    pool_id: pool_id.clone(),
                                    site_id,
                                    name: name.clone(),
                                    role: Role::Host,
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
                            record(
                                tx,
                                &caller_for(&node_id),
                                node_id.as_str(),
                                &pool.owner_tenant_id,
                                ExpectedVersion::Exact(0),
                                events,
                            )
                            .await?;
                            store_snapshot(tx, &node_id, 1, document).await?;
                            (node_id, false)
                        }
                    };
                    sql::query("UPDATE join_tokens SET used_at = compute_now(), node_id = $2 WHERE id = $1")
                        .bind(token_id.as_str())
                        .bind(node_id.as_str())
                        .execute(tx.conn())
                        .await?;
                    sql::query("INSERT INTO node_credentials (secret_sha256, node_id) VALUES ($1, $2)")
                        .bind(credential_hash)
                        .bind(node_id.as_str())
                        .execute(tx.conn())
                        .await?;
                    let session_id = upsert_session(tx, &node_id, &request.agent_version, lease).await?;
                    work::wake_now(tx, &WorkKey::pool_pending(&pool_id)).await?;
                    let session = self.session(tx, &node_id, session_id).await?;
                    Ok::<_, AppError>((node_id, rejoined, session))
                }
                .scope_boxed()
            })
            .await?;
        let (node_id, rejoined, session) = joined;
        Ok(Joined { node_id, credential, rejoined, session })
    }

    /// The session as the agent gets it, read in the transaction that opened it.
    async fn session(&self, tx: &mut Tx, node_id: &NodeId, session_id: SessionId) -> AppResult<Session> {
        let state = node_state(tx, node_id).await?;
        let hashes = latest_snapshot(tx, node_id).await?.map(|s| s.hashes).unwrap_or_default();
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
        let row = sql::query(
            "SELECT c.node_id, n.pool_id, p.owner_tenant_id, c.confirmed
             FROM node_credentials AS c JOIN nodes AS n ON n.id = c.node_id JOIN pools AS p ON p.id = n.pool_id
             WHERE c.secret_sha256 = $1",
        )
        .bind(&hash)
        .fetch_optional(tx.conn())
        .await?;
        let Some(row) = row else {
            tx.commit().await?;
            return Err(Rejection::Unauthenticated("the node credential is unknown or revoked".to_owned()).into());
        };
        let text = |column: &str| -> AppResult<String> { Ok(row.try_get::<String, _>(column)?) };
        let auth = NodeAuth {
            node_id: text("node_id")?.parse().map_err(|err| corrupt("node_credentials.node_id", err))?,
            pool_id: text("pool_id")?.parse().map_err(|err| corrupt("nodes.pool_id", err))?,
            tenant_id: text("owner_tenant_id")?.parse().map_err(|err| corrupt("pools.owner_tenant_id", err))?,
        };
        if !row.try_get::<bool, _>("confirmed")? {
            sql::query("DELETE FROM node_credentials WHERE node_id = $1 AND secret_sha256 <> $2")
                .bind(auth.node_id.as_str())
                .bind(&hash)
                .execute(tx.conn())
                .await?;
            sql::query("UPDATE node_credentials SET confirmed = true WHERE secret_sha256 = $1")
                .bind(&hash)
                .execute(tx.conn())
                .await?;
        }
        tx.commit().await?;
        Ok(auth)
    }

    /// Issues the node a new credential. The current one keeps working until the new one is first used.
    pub async fn rotate_credential(&self, node: &NodeAuth) -> AppResult<String> {
        let (credential, hash) = new_secret(CREDENTIAL_PREFIX)?;
        let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
        sql::query("INSERT INTO node_credentials (secret_sha256, node_id, confirmed) VALUES ($1, $2, false)")
            .bind(&hash)
            .bind(node.node_id.as_str())
            .execute(tx.conn())
            .await?;
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
                    let state = node_state(tx, &node.node_id).await?;
                    let at_ms = clock::compute_now_ms(tx).await?;
                    let events = reconnect(&node.node_id, &state, at_ms);
                    record_node(tx, &node.caller(), &node.node_id, &node.tenant_id, events).await?;
                    let session_id = upsert_session(tx, &node.node_id, agent_version, lease).await?;
                    work::wake_now(tx, &WorkKey::pool_pending(&node.pool_id)).await?;
                    self.session(tx, &node.node_id, session_id).await
                }
                .scope_boxed()
            })
            .await
    }

    /// A heartbeat renews the session's liveness lease in one statement; only when the log must record
    /// something (the node back to `connected`, a newly observed generation, clock skew crossing its limit)
    /// does it run a command transaction as well.
    pub async fn heartbeat(&self, node: &NodeAuth, beat: &Heartbeat) -> AppResult<HeartbeatReply> {
        let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
        let row = sql::query("SELECT * FROM agent_heartbeat($1, $2, $3, $4)")
            .bind(node.node_id.as_str())
            .bind(beat.session_id.as_str())
            .bind(self.liveness.lease.as_secs_f64())
            .bind(beat.clock_ms)
            .fetch_optional(tx.conn())
            .await?;
        tx.commit().await?;
        let Some(row) = row else {
            return Err(Rejection::Conflict(format!(
                "session {} of node {} is not current: another session replaced it; open a new one",
                beat.session_id, node.node_id
            ))
            .into());
        };
        self.finish_heartbeat(node, beat, &row).await
    }

    /// A heartbeat authenticated by the node credential itself, in one statement: the credential's node is looked
    /// up in the call of `agent_heartbeat`. A credential that is unknown or not yet confirmed, or a session that
    /// is not current, takes the slow path, which says which it is (or confirms the credential).
    pub async fn heartbeat_with_credential(&self, credential: &str, beat: &Heartbeat) -> AppResult<HeartbeatReply> {
        if !credential.starts_with(CREDENTIAL_PREFIX) {
            return Err(Rejection::Unauthenticated(format!("a node credential starts with {CREDENTIAL_PREFIX}")).into());
        }
        let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
        let row = sql::query(
            "SELECT * FROM agent_heartbeat(
                 (SELECT node_id FROM node_credentials WHERE secret_sha256 = $1 AND confirmed), $2, $3, $4)",
        )
        .bind(bc_domain::sha256_hex(credential))
        .bind(beat.session_id.as_str())
        .bind(self.liveness.lease.as_secs_f64())
        .bind(beat.clock_ms)
        .fetch_optional(tx.conn())
        .await?;
        tx.commit().await?;
        let Some(row) = row else {
            let node = self.authenticate_node(credential).await?;
            return self.heartbeat(&node, beat).await;
        };
        let text = |column: &str| -> AppResult<String> { Ok(row.try_get::<String, _>(column)?) };
        let node = NodeAuth {
            node_id: text("node_id")?.parse().map_err(|err| corrupt("agent_heartbeat.node_id", err))?,
            pool_id: text("pool_id")?.parse().map_err(|err| corrupt("agent_heartbeat.pool_id", err))?,
            tenant_id: text("tenant_id")?.parse().map_err(|err| corrupt("agent_heartbeat.tenant_id", err))?,
        };
        self.finish_heartbeat(&node, beat, &row).await
    }

    /// What a renewed session's row calls for: the log's changes when there are any, and the reply.
    async fn finish_heartbeat(
        &self,
        node: &NodeAuth,
        beat: &Heartbeat,
        row: &sqlx::postgres::PgRow,
    ) -> AppResult<HeartbeatReply> {
        let connectivity: String = row.try_get("connectivity")?;
        let generation = row.try_get::<i64, _>("generation")?.max(0) as u64;
        let observed = row.try_get::<i64, _>("observed_generation")?.max(0) as u64;
        let skew_ms: i64 = row.try_get("clock_skew_ms")?;
        let skew_raised: bool = row.try_get("skew_raised")?;
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
        let spec: String = row.try_get("spec")?;
        Ok(HeartbeatReply {
            lease_expires_ms: row.try_get("expires_ms")?,
            generation,
            spec: if beat.observed_generation < generation {
                Some(serde_json::from_str(&spec).map_err(|err| corrupt("nodes.spec", err))?)
            } else {
                None
            },
            commands_waiting: row.try_get("waiting")?,
        })
    }

    async fn heartbeat_changes(&self, node: &NodeAuth, observed_generation: u64, skew_ms: i64) -> AppResult<()> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                async move {
                    let state = node_state(tx, &node.node_id).await?;
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
                    let held = latest_snapshot(tx, &node.node_id).await?;
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
                    store_snapshot(tx, &node.node_id, number + 1, &document).await?;
                    let state = node_state(tx, &node.node_id).await?;
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
                    let node_changed = !more.is_empty();
                    events.extend(more);
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
