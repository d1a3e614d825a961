//! Provider accounts' rows (`capacity/0020_provider_accounts`).

use bc_eventstore::{Tx, sql};
use sqlx::Row as _;
use sqlx::postgres::PgRow;

use crate::AppResult;
use crate::store::corrupt;

/// A `provider_accounts` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountRow {
    pub id: String,
    pub tenant_id: String,
    pub name: String,
    pub provider: String,
    pub endpoint: String,
    pub settings: String,
    pub created_at_ms: i64,
    pub credential_at_ms: i64,
}

fn account_row(row: &PgRow) -> AppResult<AccountRow> {
    let read = || -> Result<AccountRow, sqlx::Error> {
        Ok(AccountRow {
            id: row.try_get("id")?,
            tenant_id: row.try_get("tenant_id")?,
            name: row.try_get("name")?,
            provider: row.try_get("provider")?,
            endpoint: row.try_get("endpoint")?,
            settings: row.try_get("settings")?,
            created_at_ms: row.try_get("created_at_ms")?,
            credential_at_ms: row.try_get("credential_at_ms")?,
        })
    };
    read().map_err(|err| corrupt("a provider_accounts row", err))
}

/// One account.
pub async fn account(tx: &mut Tx, id: &str) -> AppResult<Option<AccountRow>> {
    let row = sql::query(
        "SELECT id, tenant_id, name, provider, endpoint, settings::text AS settings,
                ts_ms(created_at) AS created_at_ms, ts_ms(credential_at) AS credential_at_ms
         FROM provider_accounts WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(tx.conn())
    .await?;
    row.as_ref().map(account_row).transpose()
}

/// A page of a tenant's accounts by name, after `after`.
pub async fn list(tx: &mut Tx, tenant: &str, after: Option<&str>, limit: i64) -> AppResult<Vec<AccountRow>> {
    let rows = sql::query(
        "SELECT id, tenant_id, name, provider, endpoint, settings::text AS settings,
                ts_ms(created_at) AS created_at_ms, ts_ms(credential_at) AS credential_at_ms
         FROM provider_accounts WHERE tenant_id = $1 AND ($2::text IS NULL OR name > $2)
         ORDER BY name LIMIT $3",
    )
    .bind(tenant)
    .bind(after)
    .bind(limit)
    .fetch_all(tx.conn())
    .await?;
    rows.iter().map(account_row).collect()
}

/// Whether the tenant has an account of that name.
pub async fn name_taken(tx: &mut Tx, tenant: &str, name: &str) -> AppResult<bool> {
    Ok(sql::query_scalar("SELECT EXISTS (SELECT 1 FROM provider_accounts WHERE tenant_id = $1 AND name = $2)")
        .bind(tenant)
        .bind(name)
        .fetch_one(tx.conn())
        .await?)
}

/// Whether `id` is an account of the tenant, locked in share mode so that it is not deleted before the pool that
/// names it commits.
pub async fn lock_owned(tx: &mut Tx, tenant: &str, id: &str) -> AppResult<bool> {
    Ok(sql::query_scalar(
        "SELECT count(*) > 0 FROM (SELECT 1 FROM provider_accounts WHERE id = $1 AND tenant_id = $2 FOR SHARE) AS a",
    )
    .bind(id)
    .bind(tenant)
    .fetch_one(tx.conn())
    .await?)
}

/// The first few pools that name the account.
pub async fn pools_naming(tx: &mut Tx, id: &str) -> AppResult<Vec<String>> {
    Ok(sql::query_scalar("SELECT id FROM pools WHERE provider_account_id = $1 ORDER BY id LIMIT 5")
        .bind(id)
        .fetch_all(tx.conn())
        .await?)
}
