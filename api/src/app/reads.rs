//! Reads of the read models, scoped to the caller's tenant, each honouring a consistency token: with `after`,
//! the answer waits (boundedly) until the read models it reads have passed that position.

use std::time::Duration;

use bc_domain::id::PoolId;
use bc_eventstore::{Position, Tx, TxOptions};
use bc_projections::{consistency, framework};
use serde_json::Value;
use sqlx::AssertSqlSafe;

use super::{App, AppError, AppResult, Caller};

/// How long a read waits for the read models to reach its consistency token.
pub const CONSISTENCY_WAIT: Duration = Duration::from_secs(2);

/// The table a read model's active version keeps `table` in (`pools` → `pools_v1`).
async fn active_table(tx: &mut Tx, name: &str, table: &str) -> AppResult<String> {
    let version = framework::active_version(tx, name).await?.unwrap_or(1);
    Ok(format!("{table}_v{version}"))
}

/// Rows as JSON objects, from a query whose text names tables this module chose.
async fn rows(tx: &mut Tx, query: String, binds: &[&str]) -> AppResult<Vec<Value>> {
    let mut q = sqlx::query_scalar::<_, String>(AssertSqlSafe(query)).persistent(false);
    for bind in binds {
        q = q.bind(*bind);
    }
    let texts = q.fetch_all(tx.conn()).await?;
    texts
        .iter()
        .map(|text| {
            serde_json::from_str(text).map_err(|err| AppError::Store(bc_eventstore::Error::Internal(err.to_string())))
        })
        .collect()
}

impl App {
    /// Waits for the consistency token, if any.
    async fn consistent(&self, names: &[&str], after: Option<Position>) -> AppResult<()> {
        let Some(after) = after else { return Ok(()) };
        match consistency::wait_for(&self.db, names, after, CONSISTENCY_WAIT).await? {
            None => Ok(()),
            Some(reached) => Err(AppError::NotYetConsistent { wanted: after, reached }),
        }
    }

    /// The pools the caller's tenant owns or is offered, from the `pools` read model.
    pub async fn list_pools(&self, caller: &Caller, after: Option<Position>) -> AppResult<Vec<Value>> {
        self.consistent(&["pools"], after).await?;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let table = active_table(&mut tx, "pools", "pools").await?;
        let query = format!(
            "SELECT to_jsonb(p)::text FROM {table} AS p
             WHERE p.owner_tenant_id = $1 OR p.offers @> jsonb_build_array(jsonb_build_object('tenantId', $1::text))
             ORDER BY p.pool_id"
        );
        let found = rows(&mut tx, query, &[caller.tenant_id.as_str()]).await?;
        tx.commit().await?;
        Ok(found)
    }

    /// A pool's capacity rollup, if the caller may see the pool.
    pub async fn pool_capacity(
        &self,
        caller: &Caller,
        pool_id: &PoolId,
        after: Option<Position>,
    ) -> AppResult<Vec<Value>> {
        let visible = self.list_pools(caller, after).await?.iter().any(|p| p["pool_id"] == pool_id.as_str());
        if !visible {
            return Err(bc_domain::Rejection::NotFound { kind: "pool", id: pool_id.to_string() }.into());
        }
        self.consistent(&["pool_capacity_rollup"], after).await?;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let table = active_table(&mut tx, "pool_capacity_rollup", "pool_capacity_rollup").await?;
        let query = format!("SELECT to_jsonb(r)::text FROM {table} AS r WHERE r.pool_id = $1 ORDER BY r.resource");
        let found = rows(&mut tx, query, &[pool_id.as_str()]).await?;
        tx.commit().await?;
        Ok(found)
    }

    /// The caller's tenant's reservations, from the `reservations` read model.
    pub async fn list_reservations(&self, caller: &Caller, after: Option<Position>) -> AppResult<Vec<Value>> {
        self.consistent(&["reservations"], after).await?;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let table = active_table(&mut tx, "reservations", "reservations").await?;
        let query =
            format!("SELECT to_jsonb(r)::text FROM {table} AS r WHERE r.tenant_id = $1 ORDER BY r.reservation_id");
        let found = rows(&mut tx, query, &[caller.tenant_id.as_str()]).await?;
        tx.commit().await?;
        Ok(found)
    }

    /// The caller's tenant's audit trail, newest last.
    pub async fn audit(&self, caller: &Caller, after: Option<Position>) -> AppResult<Vec<Value>> {
        self.consistent(&["audit_events"], after).await?;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let table = active_table(&mut tx, "audit_events", "audit_events").await?;
        let query = format!(
            "SELECT (to_jsonb(a) - 'txid' - 'log_epoch' - 'seq')::text FROM {table} AS a
             WHERE a.tenant_id = $1 ORDER BY a.log_epoch, a.txid, a.seq"
        );
        let found = rows(&mut tx, query, &[caller.tenant_id.as_str()]).await?;
        tx.commit().await?;
        Ok(found)
    }
}
