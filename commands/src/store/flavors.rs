//! Flavors' rows (`capacity/0021_flavors`).

use bc_eventstore::{Tx, sql};
use sqlx::Row as _;
use sqlx::postgres::PgRow;

use crate::AppResult;
use crate::store::corrupt;

/// A `flavors` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlavorRow {
    pub id: String,
    pub tenant_id: String,
    pub name: String,
    pub vcpu: i64,
    pub memory_gib: i64,
    pub gpus: i64,
    pub disk_gib: i64,
    pub visibility: String,
    pub created_at_ms: i64,
}

fn flavor_row(row: &PgRow) -> AppResult<FlavorRow> {
    let read = || -> Result<FlavorRow, sqlx::Error> {
        Ok(FlavorRow {
            id: row.try_get("id")?,
            tenant_id: row.try_get("tenant_id")?,
            name: row.try_get("name")?,
            vcpu: row.try_get("vcpu")?,
            memory_gib: row.try_get("memory_gib")?,
            gpus: row.try_get("gpus")?,
            disk_gib: row.try_get("disk_gib")?,
            visibility: row.try_get("visibility")?,
            created_at_ms: row.try_get("created_at_ms")?,
        })
    };
    read().map_err(|err| corrupt("a flavors row", err))
}

/// One flavor.
pub async fn flavor(tx: &mut Tx, id: &str) -> AppResult<Option<FlavorRow>> {
    let row = sql::query(
        "SELECT id, tenant_id, name, vcpu, memory_gib, gpus, disk_gib, visibility, ts_ms(created_at) AS created_at_ms
         FROM flavors WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(tx.conn())
    .await?;
    row.as_ref().map(flavor_row).transpose()
}

/// A page of the flavors a tenant may use (its own and the public ones), by id, after `after`.
pub async fn list(tx: &mut Tx, tenant: &str, after: Option<&str>, limit: i64) -> AppResult<Vec<FlavorRow>> {
    let rows = sql::query(
        "SELECT id, tenant_id, name, vcpu, memory_gib, gpus, disk_gib, visibility, ts_ms(created_at) AS created_at_ms
         FROM flavors WHERE (tenant_id = $1 OR visibility = 'public') AND ($2::text IS NULL OR id > $2)
         ORDER BY id LIMIT $3",
    )
    .bind(tenant)
    .bind(after)
    .bind(limit)
    .fetch_all(tx.conn())
    .await?;
    rows.iter().map(flavor_row).collect()
}

/// Whether the tenant has a flavor of that name.
pub async fn name_taken(tx: &mut Tx, tenant: &str, name: &str) -> AppResult<bool> {
    Ok(sql::query_scalar("SELECT count(*) > 0 FROM flavors WHERE tenant_id = $1 AND name = $2")
        .bind(tenant)
        .bind(name)
        .fetch_one(tx.conn())
        .await?)
}
