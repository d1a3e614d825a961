//! The tenancy tables' reads: the directory the authorizer loads, the aggregates the commands fold, and the
//! pages the API lists.

use bc_domain::id::{GrantId, IdentityId, LimitId, PoolId, TenantId};
use bc_domain::tenancy::{self, Grant, IdentityRecord, Limit, Relation, Tenant};
use bc_eventstore::{Tx, sql};

use super::{corrupt, folded_stream};
use crate::AppResult;
use crate::auth::{Directory, DirectoryGrant, DirectoryIdentity, DirectoryLimit, DirectoryTenant};

/// A stored id or name read back: an internal error naming the column when it does not parse.
pub(crate) fn parse<T: std::str::FromStr>(what: &str, text: &str) -> AppResult<T>
where
    T::Err: std::fmt::Display,
{
    text.parse().map_err(|err| corrupt(what, err))
}

/// A stored relation read back.
pub(crate) fn relation(text: &str) -> AppResult<Relation> {
    Relation::parse(text).ok_or_else(|| corrupt("a stored relation", text))
}

/// Everything the authorizer decides from, as the tables hold it now.
pub async fn directory(tx: &mut Tx) -> AppResult<Directory> {
    let tenants: Vec<(String, String, String, Option<String>, i64)> = sql::query_as(
        "SELECT id, parent_id, name, CASE WHEN state = 'suspended' THEN coalesce(suspended_reason, '') END,
                ts_ms(created_at)
         FROM tenants ORDER BY id",
    )
    .fetch_all(tx.conn())
    .await?;
    let identities: Vec<(String, String, String, bool, Vec<String>)> = sql::query_as(
        "SELECT i.tenant_id, i.name, i.kind, i.admin,
                ARRAY(SELECT t.sha256 FROM identity_tokens AS t WHERE t.identity_id = i.id ORDER BY t.id)
         FROM identities AS i ORDER BY i.id",
    )
    .fetch_all(tx.conn())
    .await?;
    let grants: Vec<(String, String, String, String)> =
        sql::query_as("SELECT tenant_id, identity, pool, relation FROM pool_grants ORDER BY id")
            .fetch_all(tx.conn())
            .await?;
    let limits: Vec<(String, String, Option<i32>, Option<i32>)> =
        sql::query_as("SELECT pool_id, relation, max_gpus, max_hours FROM attribute_limits ORDER BY id")
            .fetch_all(tx.conn())
            .await?;
    let count = |n: Option<i32>| n.map(|n| n.max(0) as u32);
    Ok(Directory {
        tenants: tenants
            .into_iter()
            .map(|(id, parent, name, suspended_reason, created_at_ms)| {
                Ok(DirectoryTenant {
                    id: parse("tenants.id", &id)?,
                    parent_id: parse("tenants.parent_id", &parent)?,
                    name,
                    suspended_reason,
                    created_at_ms,
                })
            })
            .collect::<AppResult<_>>()?,
        identities: identities
            .into_iter()
            .map(|(tenant, name, kind, admin, tokens)| {
                Ok(DirectoryIdentity {
                    tenant_id: parse("identities.tenant_id", &tenant)?,
                    name: parse("identities.name", &name)?,
                    kind,
                    admin,
                    tokens,
                })
            })
            .collect::<AppResult<_>>()?,
        grants: grants
            .into_iter()
            .map(|(tenant, identity, pool, rel)| {
                Ok(DirectoryGrant {
                    tenant_id: parse("pool_grants.tenant_id", &tenant)?,
                    identity,
                    pool,
                    relation: relation(&rel)?,
                })
            })
            .collect::<AppResult<_>>()?,
        limits: limits
            .into_iter()
            .map(|(pool, rel, max_gpus, max_hours)| {
                Ok(DirectoryLimit {
                    pool_id: parse("attribute_limits.pool_id", &pool)?,
                    relation: relation(&rel)?,
                    max_gpus: count(max_gpus),
                    max_hours: count(max_hours),
                })
            })
            .collect::<AppResult<_>>()?,
    })
}

/// A tenant made through the API, as the fold of its stream, with the stream's version.
pub async fn tenant_aggregate(tx: &mut Tx, id: &TenantId) -> AppResult<Option<(Tenant, u32)>> {
    folded_stream(tx, &tenancy::tenant_stream(id), tenancy::evolve_tenant).await
}

pub async fn identity_aggregate(tx: &mut Tx, id: &IdentityId) -> AppResult<Option<(IdentityRecord, u32)>> {
    folded_stream(tx, id.as_str(), tenancy::evolve_identity).await
}

pub async fn grant_aggregate(tx: &mut Tx, id: &GrantId) -> AppResult<Option<(Grant, u32)>> {
    folded_stream(tx, id.as_str(), tenancy::evolve_grant).await
}

pub async fn limit_aggregate(tx: &mut Tx, id: &LimitId) -> AppResult<Option<(Limit, u32)>> {
    folded_stream(tx, id.as_str(), tenancy::evolve_limit).await
}

/// Whether a tenant of the log already has this id.
pub async fn tenant_exists(tx: &mut Tx, id: &TenantId) -> AppResult<bool> {
    Ok(sql::query_scalar("SELECT EXISTS (SELECT 1 FROM tenants WHERE id = $1)")
        .bind(id.as_str())
        .fetch_one(tx.conn())
        .await?)
}

/// Whether the tenant has an identity of the log with this name.
pub async fn identity_named(tx: &mut Tx, tenant: &TenantId, name: &str) -> AppResult<bool> {
    Ok(sql::query_scalar("SELECT EXISTS (SELECT 1 FROM identities WHERE tenant_id = $1 AND name = $2)")
        .bind(tenant.as_str())
        .bind(name)
        .fetch_one(tx.conn())
        .await?)
}

/// An identity row: id, name, kind, admin, created at (epoch ms), its live tokens.
pub type IdentityRow = (String, String, String, bool, i64, i64);

/// A tenant's identities of the log by id after `after`, at most `limit`.
pub async fn identities(
    tx: &mut Tx,
    tenant: &TenantId,
    after: Option<&str>,
    limit: i64,
) -> AppResult<Vec<IdentityRow>> {
    Ok(sql::query_as(
        "SELECT i.id, i.name, i.kind, i.admin, ts_ms(i.created_at),
                (SELECT count(*) FROM identity_tokens AS t WHERE t.identity_id = i.id)
         FROM identities AS i
         WHERE i.tenant_id = $1 AND ($2::text IS NULL OR i.id > $2) ORDER BY i.id LIMIT $3",
    )
    .bind(tenant.as_str())
    .bind(after)
    .bind(limit)
    .fetch_all(tx.conn())
    .await?)
}

/// A grant row: id, identity, pool, relation, created at (epoch ms).
pub type GrantRow = (String, String, String, String, i64);

/// A tenant's grants of the log by id after `after`, at most `limit`.
pub async fn grants(tx: &mut Tx, tenant: &TenantId, after: Option<&str>, limit: i64) -> AppResult<Vec<GrantRow>> {
    Ok(sql::query_as(
        "SELECT id, identity, pool, relation, ts_ms(created_at) FROM pool_grants
         WHERE tenant_id = $1 AND ($2::text IS NULL OR id > $2) ORDER BY id LIMIT $3",
    )
    .bind(tenant.as_str())
    .bind(after)
    .bind(limit)
    .fetch_all(tx.conn())
    .await?)
}

/// A limit row: id, relation, max GPUs, max hours, created at (epoch ms).
pub type LimitRow = (String, String, Option<i32>, Option<i32>, i64);

/// A pool's limits of the log by id after `after`, at most `limit`.
pub async fn limits(tx: &mut Tx, pool: &PoolId, after: Option<&str>, limit: i64) -> AppResult<Vec<LimitRow>> {
    Ok(sql::query_as(
        "SELECT id, relation, max_gpus, max_hours, ts_ms(created_at) FROM attribute_limits
         WHERE pool_id = $1 AND ($2::text IS NULL OR id > $2) ORDER BY id LIMIT $3",
    )
    .bind(pool.as_str())
    .bind(after)
    .bind(limit)
    .fetch_all(tx.conn())
    .await?)
}

/// How many limits a pool has.
pub async fn limit_count(tx: &mut Tx, pool: &PoolId) -> AppResult<i64> {
    Ok(sql::query_scalar("SELECT count(*) FROM attribute_limits WHERE pool_id = $1")
        .bind(pool.as_str())
        .fetch_one(tx.conn())
        .await?)
}

/// How many grants a tenant has.
pub async fn grant_count(tx: &mut Tx, tenant: &TenantId) -> AppResult<i64> {
    Ok(sql::query_scalar("SELECT count(*) FROM pool_grants WHERE tenant_id = $1")
        .bind(tenant.as_str())
        .fetch_one(tx.conn())
        .await?)
}
