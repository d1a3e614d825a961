//! Provider pools' machines (`capacity/0023_provider_machines`) and what a provider round reads.

use std::collections::BTreeMap;

use bc_domain::id::{PoolId, ProviderAccountId, TenantId};
use bc_eventstore::{Tx, sql};
use sqlx::Row as _;

use crate::AppResult;
use crate::store::corrupt;

/// Whether `pool` is a provider pool (it names a provider account).
pub async fn is_provider_pool(tx: &mut Tx, pool: &PoolId) -> AppResult<bool> {
    let account: Option<Option<String>> = sql::query_scalar("SELECT provider_account_id FROM pools WHERE id = $1")
        .bind(pool.as_str())
        .fetch_optional(tx.conn())
        .await?;
    Ok(account.flatten().is_some())
}

/// A provider pool and its account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderPool {
    pub owner: TenantId,
    pub gpu_model: String,
    pub account_id: ProviderAccountId,
    pub provider: String,
    pub endpoint: String,
    pub settings: BTreeMap<String, String>,
}

/// A pending reservation of the pool that no machine was acquired for yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub reservation_id: String,
    pub count: u32,
    pub duration_s: u64,
}

/// A machine the pool holds, with how things stand around it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub machine_id: String,
    pub reservation_id: String,
    pub node_id: Option<String>,
    pub state: String,
    /// Whether the reservation it was acquired for is over (or gone).
    pub reservation_over: bool,
    /// Whether anything live is booked on its node.
    pub node_busy: bool,
}

/// What a provider round reads: the pool and its account, the reservations waiting for a machine, the machines.
pub async fn round_facts(tx: &mut Tx, pool: &PoolId) -> AppResult<Option<(ProviderPool, Vec<Waiting>, Vec<Held>)>> {
    let row = sql::query(
        "SELECT p.owner_tenant_id, p.gpu_model, a.id, a.provider, a.endpoint, a.settings::text AS settings
         FROM pools AS p JOIN provider_accounts AS a ON a.id = p.provider_account_id WHERE p.id = $1",
    )
    .bind(pool.as_str())
    .fetch_optional(tx.conn())
    .await?;
    let Some(row) = row else { return Ok(None) };
    let settings: String = row.try_get("settings")?;
    let owner: String = row.try_get("owner_tenant_id")?;
    let account: String = row.try_get("id")?;
    let provider = ProviderPool {
        owner: owner.parse().map_err(|err| corrupt("pools.owner_tenant_id", err))?,
        gpu_model: row.try_get("gpu_model")?,
        account_id: account.parse().map_err(|err| corrupt("provider_accounts.id", err))?,
        provider: row.try_get("provider")?,
        endpoint: row.try_get("endpoint")?,
        settings: serde_json::from_str(&settings).map_err(|err| corrupt("provider_accounts.settings", err))?,
    };
    let waiting: Vec<(String, i32, Option<i64>)> = sql::query_as(
        "SELECT r.id, r.count, (r.request->>'durationS')::int8 FROM reservations AS r
         WHERE r.pool_id = $1 AND r.state = 'pending'
           AND NOT EXISTS (SELECT 1 FROM provider_machines AS m WHERE m.reservation_id = r.id)
         ORDER BY r.priority DESC, r.requested_at, r.id LIMIT 16",
    )
    .bind(pool.as_str())
    .fetch_all(tx.conn())
    .await?;
    let waiting = waiting
        .into_iter()
        .map(|(reservation_id, count, duration)| Waiting {
            reservation_id,
            count: count.max(0) as u32,
            duration_s: duration.unwrap_or(3600).max(1) as u64,
        })
        .collect();
    let held: Vec<(String, String, Option<String>, String, bool, bool)> = sql::query_as(
        "SELECT m.machine_id, m.reservation_id, m.node_id, m.state,
                coalesce(r.state IN ('denied', 'released', 'failed', 'cancelled', 'expired'), true),
                m.node_id IS NOT NULL AND EXISTS (
                    SELECT 1 FROM allocations AS a JOIN reservations AS b ON b.id = a.reservation_id
                    WHERE a.node_id = m.node_id AND b.state IN ('placed', 'binding', 'active', 'releasing'))
         FROM provider_machines AS m LEFT JOIN reservations AS r ON r.id = m.reservation_id
         WHERE m.pool_id = $1 AND m.state IN ('acquiring', 'ready')
         ORDER BY m.acquired_at, m.machine_id",
    )
    .bind(pool.as_str())
    .fetch_all(tx.conn())
    .await?;
    let held = held
        .into_iter()
        .map(|(machine_id, reservation_id, node_id, state, reservation_over, node_busy)| Held {
            machine_id,
            reservation_id,
            node_id,
            state,
            reservation_over,
            node_busy,
        })
        .collect();
    Ok(Some((provider, waiting, held)))
}

/// Records a machine acquired for `reservation` (a retry that found the same machine changes nothing).
pub async fn record_acquired(
    tx: &mut Tx,
    account: &ProviderAccountId,
    machine: &str,
    pool: &PoolId,
    reservation: &str,
    now_ms: i64,
) -> AppResult<()> {
    sql::query(
        "INSERT INTO provider_machines (account_id, machine_id, pool_id, reservation_id, state, acquired_at, updated_at)
         VALUES ($1, $2, $3, $4, 'acquiring', ms_ts($5), ms_ts($5))
         ON CONFLICT DO NOTHING",
    )
    .bind(account.as_str())
    .bind(machine)
    .bind(pool.as_str())
    .bind(reservation)
    .bind(now_ms)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// Moves a machine on: its state, the node it became, why.
pub async fn update(
    tx: &mut Tx,
    account: &ProviderAccountId,
    machine: &str,
    state: &str,
    node: Option<&str>,
    detail: Option<&str>,
    now_ms: i64,
) -> AppResult<()> {
    sql::query(
        "UPDATE provider_machines SET state = $3, node_id = coalesce($4, node_id), detail = $5, updated_at = ms_ts($6)
         WHERE account_id = $1 AND machine_id = $2",
    )
    .bind(account.as_str())
    .bind(machine)
    .bind(state)
    .bind(node)
    .bind(detail)
    .bind(now_ms)
    .execute(tx.conn())
    .await?;
    Ok(())
}
