//! The agents' runtime rows: join tokens, node credentials, sessions and their heartbeats, inventory snapshots,
//! and the node and device rows a join or a report is decided on.

use std::collections::BTreeMap;
use std::time::Duration;

use bc_domain::Rejection;
use bc_domain::hardware::{HardwareKey, MIN_MATCHING_IDENTIFIERS};
use bc_domain::id::{DeviceId, JoinTokenId, NodeId, PoolId, SessionId, TenantId};
use bc_domain::inventory::{NodeInventory, SectionHashes};
use bc_domain::node::{Condition, ConditionType, Connectivity, NodeSpec};
use bc_eventstore::queue::shard_for;
use bc_eventstore::{Tx, sql};
use sqlx::Row as _;

use super::corrupt;
use crate::AppResult;
use crate::work::SHARDS;

/// A stored inventory snapshot: its number, document and hashes.
pub struct Snapshot {
    pub number: u64,
    pub document: NodeInventory,
    pub hashes: SectionHashes,
}

/// The node's latest inventory snapshot, if it has one.
pub async fn latest_snapshot(tx: &mut Tx, node_id: &NodeId) -> AppResult<Option<Snapshot>> {
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

/// The node's latest inventory snapshot as an operator reads it: its number, document and when it arrived.
pub async fn latest_snapshot_received(tx: &mut Tx, node_id: &NodeId) -> AppResult<Option<(u64, NodeInventory, i64)>> {
    let row = sql::query(
        "SELECT snapshot, document::text AS document, ts_ms(received_at) AS received_at_ms
         FROM node_inventory_snapshots WHERE node_id = $1 ORDER BY snapshot DESC LIMIT 1",
    )
    .bind(node_id.as_str())
    .fetch_optional(tx.conn())
    .await?;
    let Some(row) = row else { return Ok(None) };
    let document: String = row.try_get("document")?;
    Ok(Some((
        row.try_get::<i64, _>("snapshot")? as u64,
        serde_json::from_str(&document).map_err(|err| corrupt("an inventory snapshot", err))?,
        row.try_get("received_at_ms")?,
    )))
}

/// Stores snapshot `number` of the node's inventory.
pub async fn store_snapshot(tx: &mut Tx, node_id: &NodeId, number: u64, document: &NodeInventory) -> AppResult<()> {
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
pub async fn upsert_session(
    tx: &mut Tx,
    node_id: &NodeId,
    agent_version: &str,
    lease: Duration,
) -> AppResult<SessionId> {
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

/// What the node row says about connectivity and conditions.
pub struct NodeState {
    pub pool_id: PoolId,
    pub connectivity: Connectivity,
    pub generation: u64,
    pub observed_generation: u64,
    pub spec: NodeSpec,
    pub conditions: Vec<Condition>,
}

impl NodeState {
    /// Whether the node has condition `kind` now.
    pub fn has(&self, kind: ConditionType) -> bool {
        self.conditions.iter().any(|c| c.kind == kind)
    }
}

/// The node's connectivity, generations, spec and conditions; `NOT_FOUND` when there is no such node.
pub async fn node_state(tx: &mut Tx, node_id: &NodeId) -> AppResult<NodeState> {
    let row = sql::query(
        "SELECT n.pool_id, n.connectivity, n.generation, n.observed_generation, n.spec::text AS spec,
                n.conditions::text AS conditions
         FROM nodes AS n WHERE n.id = $1",
    )
    .bind(node_id.as_str())
    .fetch_optional(tx.conn())
    .await?;
    let Some(row) = row else {
        return Err(Rejection::NotFound { kind: "node", id: node_id.to_string() }.into());
    };
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

/// The node's devices, in id order: every class, or only its GPUs.
pub async fn node_devices(tx: &mut Tx, node_id: &NodeId, only_gpus: bool) -> AppResult<Vec<DeviceId>> {
    let ids: Vec<String> =
        sql::query_scalar("SELECT id FROM devices WHERE node_id = $1 AND (NOT $2 OR class = 'gpu') ORDER BY id")
            .bind(node_id.as_str())
            .bind(only_gpus)
            .fetch_all(tx.conn())
            .await?;
    ids.into_iter().map(|id| id.parse().map_err(|err| corrupt("devices.id", err))).collect()
}

/// The node's role, and the scalar resources it holds (`node_resources`).
pub async fn node_scalars(tx: &mut Tx, node_id: &NodeId) -> AppResult<(String, BTreeMap<String, u64>)> {
    let row = sql::query(
        "SELECT n.role,
                coalesce(jsonb_object_agg(r.resource, r.capacity) FILTER (WHERE r.resource IS NOT NULL), '{}')::text
                    AS resources
         FROM nodes AS n LEFT JOIN node_resources AS r ON r.node_id = n.id
         WHERE n.id = $1
         GROUP BY n.role",
    )
    .bind(node_id.as_str())
    .fetch_optional(tx.conn())
    .await?
    .ok_or_else(|| Rejection::NotFound { kind: "node", id: node_id.to_string() })?;
    let resources: String = row.try_get("resources")?;
    let resources = serde_json::from_str(&resources).map_err(|err| corrupt("node_resources", err))?;
    Ok((row.try_get("role")?, resources))
}

/// The hardware key the node row holds.
pub async fn hardware_key_of(tx: &mut Tx, node_id: &NodeId) -> AppResult<Option<String>> {
    Ok(sql::query_scalar("SELECT hardware_key FROM nodes WHERE id = $1")
        .bind(node_id.as_str())
        .fetch_one(tx.conn())
        .await?)
}

/// A node's existing match for a machine: the node sharing the most identifiers, at least
/// [`MIN_MATCHING_IDENTIFIERS`], with its pool and the indexes of the matched identifiers in `hardware.surviving`.
pub async fn matching_node(tx: &mut Tx, hardware: &HardwareKey) -> AppResult<Option<(NodeId, PoolId, Vec<usize>)>> {
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
    .bind(MIN_MATCHING_IDENTIFIERS as i64)
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

/// Stores a join token's hash, for its pool, until `expires_at_ms`.
pub async fn insert_join_token(
    tx: &mut Tx,
    id: &JoinTokenId,
    secret_sha256: &str,
    pool_id: &PoolId,
    created_by: &str,
    expires_at_ms: i64,
) -> AppResult<()> {
    sql::query(
        "INSERT INTO join_tokens (id, secret_sha256, pool_id, created_by, expires_at)
         VALUES ($1, $2, $3, $4, ms_ts($5))",
    )
    .bind(id.as_str())
    .bind(secret_sha256)
    .bind(pool_id.as_str())
    .bind(created_by)
    .bind(expires_at_ms)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// The pool of the join token with this hash, read without a lock (a join locks the pool first).
pub async fn join_token_pool(tx: &mut Tx, secret_sha256: &str) -> AppResult<Option<PoolId>> {
    let pool_id: Option<String> = sql::query_scalar("SELECT pool_id FROM join_tokens WHERE secret_sha256 = $1")
        .bind(secret_sha256)
        .fetch_optional(tx.conn())
        .await?;
    pool_id.map(|p| p.parse().map_err(|err| corrupt("join_tokens.pool_id", err))).transpose()
}

/// A join token as a join finds it, locked.
pub struct JoinTokenRow {
    pub id: JoinTokenId,
    pub used: bool,
    pub expired: bool,
    pub revoked: bool,
}

/// Locks the join token with this hash (after its pool, in the lock order).
pub async fn lock_join_token(tx: &mut Tx, secret_sha256: &str) -> AppResult<JoinTokenRow> {
    let row = sql::query(
        "SELECT id, used_at IS NOT NULL AS used, expires_at <= compute_now() AS expired,
                revoked_at IS NOT NULL AS revoked
         FROM join_tokens WHERE secret_sha256 = $1 FOR UPDATE",
    )
    .bind(secret_sha256)
    .fetch_one(tx.conn())
    .await?;
    let id: String = row.try_get("id")?;
    Ok(JoinTokenRow {
        id: id.parse().map_err(|err| corrupt("join_tokens.id", err))?,
        used: row.try_get("used")?,
        expired: row.try_get("expired")?,
        revoked: row.try_get("revoked")?,
    })
}

/// A join token as an operator sees it (never its secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinTokenInfo {
    pub id: JoinTokenId,
    pub pool_id: PoolId,
    pub created_by: String,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
    pub used_at_ms: Option<i64>,
    pub node_id: Option<NodeId>,
    pub revoked_at_ms: Option<i64>,
    /// Whether it had expired when it was read.
    pub expired: bool,
}

fn join_token_info(row: &sqlx::postgres::PgRow) -> AppResult<JoinTokenInfo> {
    let text = |column: &str| -> AppResult<String> { Ok(row.try_get::<String, _>(column)?) };
    let node_id: Option<String> = row.try_get("node_id")?;
    Ok(JoinTokenInfo {
        id: text("id")?.parse().map_err(|err| corrupt("join_tokens.id", err))?,
        pool_id: text("pool_id")?.parse().map_err(|err| corrupt("join_tokens.pool_id", err))?,
        created_by: text("created_by")?,
        created_at_ms: row.try_get("created_at")?,
        expires_at_ms: row.try_get("expires_at")?,
        used_at_ms: row.try_get("used_at")?,
        node_id: node_id.map(|n| n.parse().map_err(|err| corrupt("join_tokens.node_id", err))).transpose()?,
        revoked_at_ms: row.try_get("revoked_at")?,
        expired: row.try_get("expired")?,
    })
}

/// The pool's join tokens after `after` (by id), at most `limit`, newest id last.
pub async fn list_join_tokens(
    tx: &mut Tx,
    pool_id: &PoolId,
    after: Option<&JoinTokenId>,
    limit: i64,
) -> AppResult<Vec<JoinTokenInfo>> {
    let rows = sql::query(
        "SELECT id, pool_id, created_by, ts_ms(created_at) AS created_at, ts_ms(expires_at) AS expires_at,
                ts_ms(used_at) AS used_at, node_id, ts_ms(revoked_at) AS revoked_at,
                expires_at <= compute_now() AS expired
         FROM join_tokens WHERE pool_id = $1 AND ($2::text IS NULL OR id > $2)
         ORDER BY id LIMIT $3",
    )
    .bind(pool_id.as_str())
    .bind(after.map(JoinTokenId::as_str))
    .bind(limit)
    .fetch_all(tx.conn())
    .await?;
    rows.iter().map(join_token_info).collect()
}

/// One join token of the pool, locked.
pub async fn lock_pool_join_token(tx: &mut Tx, pool_id: &PoolId, id: &JoinTokenId) -> AppResult<Option<JoinTokenInfo>> {
    let row = sql::query(
        "SELECT id, pool_id, created_by, ts_ms(created_at) AS created_at, ts_ms(expires_at) AS expires_at,
                ts_ms(used_at) AS used_at, node_id, ts_ms(revoked_at) AS revoked_at,
                expires_at <= compute_now() AS expired
         FROM join_tokens WHERE pool_id = $1 AND id = $2 FOR UPDATE",
    )
    .bind(pool_id.as_str())
    .bind(id.as_str())
    .fetch_optional(tx.conn())
    .await?;
    row.as_ref().map(join_token_info).transpose()
}

/// Marks a join token revoked.
pub async fn revoke_join_token(tx: &mut Tx, id: &JoinTokenId) -> AppResult<()> {
    sql::query("UPDATE join_tokens SET revoked_at = compute_now() WHERE id = $1 AND revoked_at IS NULL")
        .bind(id.as_str())
        .execute(tx.conn())
        .await?;
    Ok(())
}

/// Marks a join token used by the node it admitted.
pub async fn use_join_token(tx: &mut Tx, token_id: &JoinTokenId, node_id: &NodeId) -> AppResult<()> {
    sql::query("UPDATE join_tokens SET used_at = compute_now(), node_id = $2 WHERE id = $1")
        .bind(token_id.as_str())
        .bind(node_id.as_str())
        .execute(tx.conn())
        .await?;
    Ok(())
}

/// Stores a node credential's hash; an unconfirmed one replaces the node's others on its first use.
pub async fn insert_credential(tx: &mut Tx, secret_sha256: &str, node_id: &NodeId, confirmed: bool) -> AppResult<()> {
    sql::query("INSERT INTO node_credentials (secret_sha256, node_id, confirmed) VALUES ($1, $2, $3)")
        .bind(secret_sha256)
        .bind(node_id.as_str())
        .bind(confirmed)
        .execute(tx.conn())
        .await?;
    Ok(())
}

/// Revokes every credential of the node.
pub async fn revoke_credentials(tx: &mut Tx, node_id: &NodeId) -> AppResult<()> {
    sql::query("DELETE FROM node_credentials WHERE node_id = $1").bind(node_id.as_str()).execute(tx.conn()).await?;
    Ok(())
}

/// Whom a credential speaks for.
pub struct CredentialRow {
    pub node_id: NodeId,
    pub pool_id: PoolId,
    pub tenant_id: TenantId,
    pub confirmed: bool,
}

/// The node, pool and pool owner of the credential with this hash, if it is known.
pub async fn credential(tx: &mut Tx, secret_sha256: &str) -> AppResult<Option<CredentialRow>> {
    let row = sql::query(
        "SELECT c.node_id, n.pool_id, p.owner_tenant_id, c.confirmed
         FROM node_credentials AS c JOIN nodes AS n ON n.id = c.node_id JOIN pools AS p ON p.id = n.pool_id
         WHERE c.secret_sha256 = $1",
    )
    .bind(secret_sha256)
    .fetch_optional(tx.conn())
    .await?;
    let Some(row) = row else { return Ok(None) };
    let text = |column: &str| -> AppResult<String> { Ok(row.try_get::<String, _>(column)?) };
    Ok(Some(CredentialRow {
        node_id: text("node_id")?.parse().map_err(|err| corrupt("node_credentials.node_id", err))?,
        pool_id: text("pool_id")?.parse().map_err(|err| corrupt("nodes.pool_id", err))?,
        tenant_id: text("owner_tenant_id")?.parse().map_err(|err| corrupt("pools.owner_tenant_id", err))?,
        confirmed: row.try_get("confirmed")?,
    }))
}

/// Confirms the credential with this hash and revokes the node's others.
pub async fn confirm_credential(tx: &mut Tx, node_id: &NodeId, secret_sha256: &str) -> AppResult<()> {
    sql::query("DELETE FROM node_credentials WHERE node_id = $1 AND secret_sha256 <> $2")
        .bind(node_id.as_str())
        .bind(secret_sha256)
        .execute(tx.conn())
        .await?;
    sql::query("UPDATE node_credentials SET confirmed = true WHERE secret_sha256 = $1")
        .bind(secret_sha256)
        .execute(tx.conn())
        .await?;
    Ok(())
}

/// Who sends a heartbeat: a node already authenticated, or a confirmed credential looked up in the same statement.
#[derive(Debug, Clone)]
pub enum Beater {
    Node(NodeId),
    /// A credential's hash, and the node the connection's client certificate names, when it must name one.
    CredentialHash(String, Option<String>),
}

impl Beater {
    /// The node id, the credential's hash and the certified node, as `agent_heartbeat_json` takes them.
    fn parts(&self) -> (Option<&str>, Option<&str>, Option<&str>) {
        match self {
            Beater::Node(node_id) => (Some(node_id.as_str()), None, None),
            Beater::CredentialHash(hash, certified) => (None, Some(hash), certified.as_deref()),
        }
    }
}

/// A session renewed by a heartbeat, as `agent_heartbeat` answers it.
pub struct Beat {
    pub node_id: NodeId,
    pub pool_id: PoolId,
    pub tenant_id: TenantId,
    pub connectivity: String,
    pub generation: u64,
    pub observed_generation: u64,
    pub clock_skew_ms: i64,
    pub skew_raised: bool,
    /// The node's spec as stored (JSON).
    pub spec: String,
    pub expires_ms: i64,
    pub waiting: bool,
}

/// One heartbeat: who sends it, for which session, the lease it renews by and the agent's clock.
#[derive(Debug, Clone)]
pub struct BeatItem {
    pub beater: Beater,
    pub session_id: SessionId,
    pub lease: Duration,
    pub clock_ms: i64,
}

impl BeatItem {
    /// The call that renews this heartbeat's session alone (`agent_heartbeat_json`), as a transaction of its own in
    /// one round trip ([`bc_eventstore::Db::call`]).
    pub fn call(&self) -> sql::Call {
        let (node, hash, certified) = self.beater.parts();
        sql::Call::new("agent_heartbeat_json")
            .opt_text(node)
            .opt_text(hash)
            .opt_text(certified)
            .text(self.session_id.as_str())
            .float8(self.lease.as_secs_f64())
            .int8(self.clock_ms)
    }
}

/// The call that adds one heartbeat's GPU utilization samples to the node's current hour (`record_gpu_utilization`,
/// `nodes/0005`), sent only when the heartbeat carries samples.
pub fn utilization_call(node_id: &NodeId, samples: &[bc_domain::agent::GpuSample]) -> sql::Call {
    let gpus: Vec<&str> = samples.iter().map(|s| s.gpu.as_str()).collect();
    let percents: Vec<i32> = samples.iter().map(|s| i32::try_from(s.percent).unwrap_or(i32::MAX)).collect();
    sql::Call::new("record_gpu_utilization").text(node_id.as_str()).texts(&gpus).int4s(&percents)
}

/// The call that renews the sessions of many heartbeats in one transaction (`agent_heartbeats_json`): each item as
/// [`BeatItem::call`] would, its answer at its position.
pub fn heartbeats_call<'a>(items: impl Iterator<Item = &'a BeatItem>) -> sql::Call {
    let items: Vec<serde_json::Value> = items
        .map(|item| {
            let (node, hash, certified) = item.beater.parts();
            serde_json::json!({
                "n": node,
                "h": hash,
                "c": certified,
                "s": item.session_id.as_str(),
                "k": item.clock_ms,
                "l": item.lease.as_secs_f64(),
            })
        })
        .collect();
    sql::Call::new("agent_heartbeats_json").jsonb(&serde_json::Value::Array(items).to_string())
}

/// A session as `agent_heartbeat` answers it.
#[derive(serde::Deserialize)]
struct RawBeat {
    node_id: String,
    pool_id: String,
    tenant_id: String,
    expires_ms: i64,
    clock_skew_ms: i64,
    connectivity: String,
    generation: i64,
    observed_generation: i64,
    spec: String,
    skew_raised: bool,
    waiting: bool,
}

impl RawBeat {
    fn read(self) -> AppResult<Beat> {
        Ok(Beat {
            node_id: self.node_id.parse().map_err(|err| corrupt("agent_heartbeat.node_id", err))?,
            pool_id: self.pool_id.parse().map_err(|err| corrupt("agent_heartbeat.pool_id", err))?,
            tenant_id: self.tenant_id.parse().map_err(|err| corrupt("agent_heartbeat.tenant_id", err))?,
            connectivity: self.connectivity,
            generation: self.generation.max(0) as u64,
            observed_generation: self.observed_generation.max(0) as u64,
            clock_skew_ms: self.clock_skew_ms,
            skew_raised: self.skew_raised,
            spec: self.spec,
            expires_ms: self.expires_ms,
            waiting: self.waiting,
        })
    }
}

/// Reads what [`BeatItem::call`] answered: `None` when the session is not the node's current one (or, for a
/// credential, when it is unknown or not yet confirmed).
pub fn beat(answer: Option<String>) -> AppResult<Option<Beat>> {
    let Some(text) = answer else { return Ok(None) };
    let raw: RawBeat = serde_json::from_str(&text).map_err(|err| corrupt("agent_heartbeat_json", err))?;
    raw.read().map(Some)
}

/// Reads what [`heartbeats_call`] answered for `items` heartbeats: each as [`beat`] reads one, in their order.
pub fn beats(answer: Option<String>, items: usize) -> AppResult<Vec<Option<Beat>>> {
    let text = answer.ok_or_else(|| corrupt("agent_heartbeats_json", "no answer"))?;
    let raws: Vec<Option<RawBeat>> =
        serde_json::from_str(&text).map_err(|err| corrupt("agent_heartbeats_json", err))?;
    if raws.len() != items {
        return Err(corrupt("agent_heartbeats_json", format!("{} answers for {items} heartbeats", raws.len())));
    }
    raws.into_iter().map(|raw| raw.map(RawBeat::read).transpose()).collect()
}

/// Forgets a deleted node's runtime rows: its credentials and session end, its certificates are revoked, and its
/// queued commands expire.
pub async fn forget_node(tx: &mut Tx, node_id: &NodeId) -> AppResult<()> {
    for statement in [
        "DELETE FROM node_credentials WHERE node_id = $1",
        "DELETE FROM agent_sessions WHERE node_id = $1",
        "UPDATE node_certificates SET revoked_at = compute_now() WHERE node_id = $1 AND revoked_at IS NULL",
        "UPDATE node_commands SET state = 'expired', finished_at = compute_now(), message = 'the node was deleted'
         WHERE node_id = $1 AND state = 'queued'",
    ] {
        sql::query(statement).bind(node_id.as_str()).execute(tx.conn()).await?;
    }
    Ok(())
}
