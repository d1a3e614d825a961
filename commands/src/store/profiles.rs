//! Profiles' rows: the inline `profiles` table (`provisioning/0001`).

use bc_eventstore::{Tx, sql};
use sqlx::Row as _;
use sqlx::postgres::PgRow;

use crate::AppResult;
use crate::store::corrupt;

/// A profile version as the `profiles` table holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileRow {
    pub id: String,
    pub tenant_id: String,
    pub name: String,
    pub version: i32,
    pub spec: String,
    pub created_at_ms: i64,
}

fn profile_row(row: &PgRow) -> AppResult<ProfileRow> {
    let read = || -> Result<ProfileRow, sqlx::Error> {
        Ok(ProfileRow {
            id: row.try_get("id")?,
            tenant_id: row.try_get("tenant_id")?,
            name: row.try_get("name")?,
            version: row.try_get("version")?,
            spec: row.try_get("spec")?,
            created_at_ms: row.try_get("created_at_ms")?,
        })
    };
    read().map_err(|err| corrupt("a profiles row", err))
}

/// One live profile version by id.
pub async fn profile(tx: &mut Tx, id: &str) -> AppResult<Option<ProfileRow>> {
    let row = sql::query(
        "SELECT id, tenant_id, name, version, spec::text AS spec,
                (extract(epoch FROM created_at) * 1000)::int8 AS created_at_ms
         FROM profiles WHERE id = $1 AND deleted_at IS NULL",
    )
    .bind(id)
    .fetch_optional(tx.conn())
    .await?;
    row.as_ref().map(profile_row).transpose()
}

/// A page of a tenant's live profile versions, by name and version, after `after` (`name\0version`).
pub async fn list(
    tx: &mut Tx,
    tenant: &str,
    name: Option<&str>,
    after: Option<(&str, i32)>,
    limit: u32,
) -> AppResult<Vec<ProfileRow>> {
    let rows = sql::query(
        "SELECT id, tenant_id, name, version, spec::text AS spec,
                (extract(epoch FROM created_at) * 1000)::int8 AS created_at_ms
         FROM profiles
         WHERE tenant_id = $1 AND deleted_at IS NULL AND ($2::text IS NULL OR name = $2)
           AND ($3::text IS NULL OR (name, version) > ($3, $4::int4))
         ORDER BY name, version LIMIT $5",
    )
    .bind(tenant)
    .bind(name)
    .bind(after.map(|(name, _)| name))
    .bind(after.map(|(_, version)| version))
    .bind(i64::from(limit))
    .fetch_all(tx.conn())
    .await?;
    rows.iter().map(profile_row).collect()
}

/// The highest version `name` has had in `tenant`, deleted or not.
pub async fn latest_version(tx: &mut Tx, tenant: &str, name: &str) -> AppResult<Option<i32>> {
    Ok(sql::query_scalar("SELECT max(version) FROM profiles WHERE tenant_id = $1 AND name = $2")
        .bind(tenant)
        .bind(name)
        .fetch_one(tx.conn())
        .await?)
}

/// Whether `tenant` sees image `id` (its own, or a public one), and whether it is verified.
pub async fn image_for(tx: &mut Tx, tenant: &str, id: &str) -> AppResult<Option<bool>> {
    Ok(sql::query_scalar(
        "SELECT signer IS NOT NULL FROM images WHERE id = $1 AND (tenant_id = $2 OR visibility = 'public')",
    )
    .bind(id)
    .bind(tenant)
    .fetch_optional(tx.conn())
    .await?)
}

/// A live profile version that deploys image `id`, if any.
pub async fn profile_using_image(tx: &mut Tx, image: &str) -> AppResult<Option<String>> {
    Ok(sql::query_scalar("SELECT id FROM profiles WHERE image_id = $1 AND deleted_at IS NULL ORDER BY id LIMIT 1")
        .bind(image)
        .fetch_optional(tx.conn())
        .await?)
}
