//! What the liveness sweep and the node reconciler read: silent sessions, and the reservations a node holds.

use bc_domain::id::{NodeId, ReservationId, TenantId};
use bc_domain::node::Connectivity;
use bc_eventstore::{Tx, sql};
use sqlx::Row as _;

use super::corrupt;
use crate::AppResult;

/// A session past its lease, as the sweep (or the locked re-read) finds it.
pub struct Silent {
    pub node_id: NodeId,
    pub connectivity: Connectivity,
    pub silence_ms: i64,
    pub lost_after_ms: i64,
}

/// A silent node's session re-read under its lock: the sweep's facts, the pool's owner, and whether
/// `NodeUnreachable` is raised already.
pub struct LockedSilent {
    pub silent: Silent,
    pub owner_tenant_id: TenantId,
    pub unreachable_raised: bool,
}

fn connectivity(text: &str) -> AppResult<Connectivity> {
    serde_json::from_value(serde_json::Value::String(text.to_owned())).map_err(|err| corrupt("nodes.connectivity", err))
}

fn silent(row: &sqlx::postgres::PgRow) -> AppResult<Silent> {
    let node_id: String = row.try_get("node_id")?;
    Ok(Silent {
        node_id: node_id.parse().map_err(|err| corrupt("agent_sessions.node_id", err))?,
        connectivity: connectivity(&row.try_get::<String, _>("connectivity")?)?,
        silence_ms: row.try_get("silence_ms")?,
        lost_after_ms: row.try_get("lost_after_ms")?,
    })
}

/// The sweep's one query: the sessions of a shard past their lease whose node is not yet lost.
pub async fn silent_sessions(tx: &mut Tx, shard: i32) -> AppResult<Vec<Silent>> {
    let rows = sql::query(
        "SELECT s.node_id, n.connectivity, ts_ms(compute_now()) - ts_ms(s.heartbeat_at) AS silence_ms,
                coalesce((p.policy ->> 'lostAfter')::bigint, 600) * 1000 AS lost_after_ms
         FROM agent_sessions AS s JOIN nodes AS n ON n.id = s.node_id JOIN pools AS p ON p.id = n.pool_id
         WHERE s.shard = $1 AND s.expires_at <= compute_now() AND n.connectivity <> 'lost'",
    )
    .bind(shard)
    .fetch_all(tx.conn())
    .await?;
    rows.iter().map(silent).collect()
}

/// The node's session, locked, so that a heartbeat arriving now waits or wins; `None` without a session.
pub async fn lock_session(tx: &mut Tx, node_id: &NodeId) -> AppResult<Option<LockedSilent>> {
    let row = sql::query(
        "SELECT s.node_id, n.connectivity, n.pool_id, p.owner_tenant_id,
                ts_ms(compute_now()) - ts_ms(s.heartbeat_at) AS silence_ms,
                coalesce((p.policy ->> 'lostAfter')::bigint, 600) * 1000 AS lost_after_ms,
                n.conditions @> '[{\"type\": \"NodeUnreachable\"}]'::jsonb AS unreachable_raised
         FROM agent_sessions AS s JOIN nodes AS n ON n.id = s.node_id JOIN pools AS p ON p.id = n.pool_id
         WHERE s.node_id = $1
         FOR UPDATE OF s",
    )
    .bind(node_id.as_str())
    .fetch_optional(tx.conn())
    .await?;
    let Some(row) = row else { return Ok(None) };
    let tenant: String = row.try_get("owner_tenant_id")?;
    Ok(Some(LockedSilent {
        silent: silent(&row)?,
        owner_tenant_id: tenant.parse().map_err(|err| corrupt("pools.owner_tenant_id", err))?,
        unreachable_raised: row.try_get("unreachable_raised")?,
    }))
}

/// The reservations with an allocation on the node that still hold it (placed to releasing), with their state,
/// in id order.
pub async fn holding_reservations(tx: &mut Tx, node_id: &NodeId) -> AppResult<Vec<(ReservationId, String)>> {
    let rows = sql::query(
        "SELECT DISTINCT r.id, r.state FROM allocations AS a JOIN reservations AS r ON r.id = a.reservation_id
         WHERE a.node_id = $1 AND r.state IN ('placed', 'binding', 'active', 'releasing')
         ORDER BY r.id",
    )
    .bind(node_id.as_str())
    .fetch_all(tx.conn())
    .await?;
    rows.iter()
        .map(|row| {
            let id: String = row.try_get("id")?;
            Ok((id.parse().map_err(|err| corrupt("reservations.id", err))?, row.try_get("state")?))
        })
        .collect()
}

/// Whether the node is schedulable, draining, and drained with force; `None` once it is deleted.
pub async fn drain_state(tx: &mut Tx, node_id: &NodeId) -> AppResult<Option<(bool, bool, bool)>> {
    let row = sql::query("SELECT schedulable, draining, drain_forced FROM nodes WHERE id = $1")
        .bind(node_id.as_str())
        .fetch_optional(tx.conn())
        .await?;
    row.map(|row| Ok((row.try_get("schedulable")?, row.try_get("draining")?, row.try_get("drain_forced")?))).transpose()
}

/// How many of `devices` the node still has.
pub async fn devices_present(tx: &mut Tx, node_id: &NodeId, devices: &[&str]) -> AppResult<i64> {
    Ok(sql::query_scalar("SELECT count(*) FROM devices WHERE node_id = $1 AND id = ANY($2)")
        .bind(node_id.as_str())
        .bind(devices)
        .fetch_one(tx.conn())
        .await?)
}
