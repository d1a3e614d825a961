//! What quotes read beside placement's own queries: whether a project is the caller's, and, when a quote is
//! booked, the quoted devices once locked (their nodes' state, the atoms themselves, and any live booking that now
//! overlaps the window). Off the hot path, so plain statements.

use bc_eventstore::{Tx, sql};

use crate::AppResult;

/// A quoted node as it is now: whether placement may use it, and the flags that say why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotedNode {
    pub id: String,
    pub pool_id: String,
    pub schedulable: bool,
    pub cordoned: bool,
    pub draining: bool,
    pub maintenance: bool,
    pub connectivity: String,
    pub provision_state: String,
    pub no_schedule_reasons: Vec<String>,
}

/// The nodes among `ids` that still exist, in id order.
pub async fn nodes(tx: &mut Tx, ids: &[&str]) -> AppResult<Vec<QuotedNode>> {
    type Row = (String, String, bool, bool, bool, bool, String, String, Vec<String>);
    let rows: Vec<Row> = sql::query_as(
        "SELECT id, pool_id, schedulable, cordoned, draining, maintenance, connectivity, provision_state,
                no_schedule_reasons
         FROM nodes WHERE id = ANY($1) ORDER BY id",
    )
    .bind(ids)
    .fetch_all(tx.conn())
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, pool_id, schedulable, cordoned, draining, maintenance, connectivity, provision_state, reasons)| {
            QuotedNode {
                id,
                pool_id,
                schedulable,
                cordoned,
                draining,
                maintenance,
                connectivity,
                provision_state,
                no_schedule_reasons: reasons,
            }
        })
        .collect())
}

/// A quoted atom as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotedAtom {
    pub id: String,
    pub node_id: String,
    pub pool_id: String,
    pub class: String,
    pub bookable: bool,
}

/// The atoms among `ids` that still exist, in id order.
pub async fn atoms(tx: &mut Tx, ids: &[&str]) -> AppResult<Vec<QuotedAtom>> {
    let rows: Vec<(String, String, String, String, bool)> =
        sql::query_as("SELECT id, node_id, pool_id, class, bookable FROM devices WHERE id = ANY($1) ORDER BY id")
            .bind(ids)
            .fetch_all(tx.conn())
            .await?;
    Ok(rows
        .into_iter()
        .map(|(id, node_id, pool_id, class, bookable)| QuotedAtom { id, node_id, pool_id, class, bookable })
        .collect())
}

/// A live booking of a quoted atom that overlaps the window: only the atom and the overlapping part, never whose
/// booking it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    pub device_id: String,
    pub from_ms: i64,
    pub to_ms: i64,
}

/// The live bookings of `atoms` that overlap `[start, end)`, cut to the window, in atom and time order.
pub async fn overlaps(tx: &mut Tx, atoms: &[&str], start_ms: i64, end_ms: i64) -> AppResult<Vec<Overlap>> {
    let rows: Vec<(String, i64, i64)> = sql::query_as(
        "SELECT device_id, ts_ms(greatest(lower(during), ms_ts($2))) AS from_ms,
                ts_ms(least(upper(during), ms_ts($3))) AS to_ms
         FROM device_bookings
         WHERE device_id = ANY($1) AND during && tstzrange(ms_ts($2), ms_ts($3))
         ORDER BY device_id, lower(during)",
    )
    .bind(atoms)
    .bind(start_ms)
    .bind(end_ms)
    .fetch_all(tx.conn())
    .await?;
    Ok(rows.into_iter().map(|(device_id, from_ms, to_ms)| Overlap { device_id, from_ms, to_ms }).collect())
}

/// Whether `project` is a project of `tenant` (as the reserve's facts call asks).
pub async fn project_in_tenant(
    tx: &mut Tx,
    project: &bc_domain::id::ProjectId,
    tenant: &bc_domain::id::TenantId,
) -> AppResult<bool> {
    Ok(sql::query_scalar("SELECT EXISTS (SELECT 1 FROM projects WHERE id = $1 AND tenant_id = $2)")
        .bind(project.as_str())
        .bind(tenant.as_str())
        .fetch_one(tx.conn())
        .await?)
}
