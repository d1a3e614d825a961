//! Resolving resources for decisions from Better Compute's own tables (the inline state, which every command
//! has already committed to): the tenant each resolves in, and the pool with its offerings and attributes.

use std::collections::BTreeMap;

use bc_domain::id::{NodeId, PoolId, ReservationId, SiteId, TenantId};
use bc_eventstore::{Db, Error, Result, TxOptions, sql};
use serde_json::{Value, json};
use sqlx::Row as _;

use super::{PoolFacts, Resource, Target};

fn tenant(text: String) -> Result<TenantId> {
    text.parse().map_err(|err| Error::Internal(format!("a stored tenant id: {err}")))
}

fn pool_id(text: String) -> Result<PoolId> {
    text.parse().map_err(|err| Error::Internal(format!("a stored pool id: {err}")))
}

/// A pool, its offerings and the attributes policies read.
pub async fn pool(db: &Db, id: &PoolId) -> Result<Option<PoolFacts>> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let row = sql::query(
        "SELECT p.owner_tenant_id, p.class, p.gpu_model, p.sharing, s.iam_region
         FROM pools AS p JOIN sites AS s ON s.id = p.site_id WHERE p.id = $1",
    )
    .bind(id.as_str())
    .fetch_optional(tx.conn())
    .await?;
    let Some(row) = row else {
        tx.commit().await?;
        return Ok(None);
    };
    let offers =
        sql::query("SELECT tenant_id, include_descendants FROM pool_offers WHERE pool_id = $1 ORDER BY tenant_id")
            .bind(id.as_str())
            .fetch_all(tx.conn())
            .await?;
    tx.commit().await?;
    let offers = offers
        .into_iter()
        .map(|o| Ok((tenant(o.try_get("tenant_id")?)?, o.try_get("include_descendants")?)))
        .collect::<Result<Vec<_>>>()?;
    let region: String = row.try_get("iam_region")?;
    let mut attributes = BTreeMap::new();
    attributes.insert("region".to_owned(), json!(region));
    attributes.insert("class".to_owned(), json!(row.try_get::<String, _>("class")?));
    attributes.insert("gpuModel".to_owned(), json!(row.try_get::<String, _>("gpu_model")?));
    attributes.insert("sharing".to_owned(), json!(row.try_get::<String, _>("sharing")?));
    Ok(Some(PoolFacts {
        id: id.clone(),
        owner_tenant_id: tenant(row.try_get("owner_tenant_id")?)?,
        offers,
        attributes,
    }))
}

/// A pool as the resource of a pool method.
pub async fn pool_resource(db: &Db, id: &PoolId) -> Result<Option<Resource>> {
    Ok(pool(db, id).await?.map(|facts| Resource {
        target: Target::Pool,
        id: id.to_string(),
        tenant_id: facts.owner_tenant_id.clone(),
        attributes: facts.attributes.clone(),
        pool: Some(facts),
    }))
}

/// A site: the tenant that owns it.
pub async fn site_resource(db: &Db, id: &SiteId) -> Result<Option<Resource>> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let row = sql::query("SELECT owner_tenant_id, iam_region, kind FROM sites WHERE id = $1")
        .bind(id.as_str())
        .fetch_optional(tx.conn())
        .await?;
    tx.commit().await?;
    let Some(row) = row else { return Ok(None) };
    let region: String = row.try_get("iam_region")?;
    let attributes = BTreeMap::from([
        ("region".to_owned(), json!(region)),
        ("iamRegion".to_owned(), json!(region)),
        ("kind".to_owned(), json!(row.try_get::<String, _>("kind")?)),
    ]);
    Ok(Some(Resource {
        target: Target::Site,
        id: id.to_string(),
        tenant_id: tenant(row.try_get("owner_tenant_id")?)?,
        pool: None,
        attributes,
    }))
}

/// A node: it resolves in its pool's owner tenant, with the pool as its parent.
pub async fn node_resource(db: &Db, id: &NodeId) -> Result<Option<Resource>> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let row = sql::query("SELECT pool_id, trust, provision_state, owner_tenant_id FROM nodes WHERE id = $1")
        .bind(id.as_str())
        .fetch_optional(tx.conn())
        .await?;
    tx.commit().await?;
    let Some(row) = row else { return Ok(None) };
    let Some(facts) = pool(db, &pool_id(row.try_get("pool_id")?)?).await? else { return Ok(None) };
    let attributes = BTreeMap::from([
        ("trust".to_owned(), json!(row.try_get::<String, _>("trust")?)),
        ("lifecycle".to_owned(), json!(row.try_get::<String, _>("provision_state")?)),
        (
            "dedicatedTo".to_owned(),
            row.try_get::<Option<String>, _>("owner_tenant_id")?.map_or(Value::Null, Value::from),
        ),
        ("gpuModel".to_owned(), facts.attributes.get("gpuModel").cloned().unwrap_or(Value::Null)),
        ("region".to_owned(), facts.attributes.get("region").cloned().unwrap_or(Value::Null)),
    ]);
    Ok(Some(Resource {
        target: Target::Node,
        id: id.to_string(),
        tenant_id: facts.owner_tenant_id.clone(),
        pool: Some(facts),
        attributes,
    }))
}

/// A recorded reservation: it resolves in the tenant that made it, with its pool as its parent.
pub async fn reservation_resource(db: &Db, id: &ReservationId) -> Result<Option<Resource>> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let row = sql::query(
        "SELECT tenant_id, pool_id, count, request->>'durationS' AS duration FROM reservations WHERE id = $1",
    )
    .bind(id.as_str())
    .fetch_optional(tx.conn())
    .await?;
    tx.commit().await?;
    let Some(row) = row else { return Ok(None) };
    let Some(facts) = pool(db, &pool_id(row.try_get("pool_id")?)?).await? else { return Ok(None) };
    let count: i32 = row.try_get("count")?;
    let duration: Option<String> = row.try_get("duration")?;
    let hours = duration.and_then(|d| d.parse::<f64>().ok()).map_or(Value::Null, |s| json!(s / 3600.0));
    let attributes = BTreeMap::from([
        ("gpuCount".to_owned(), json!(count)),
        ("durationHours".to_owned(), hours),
        ("gpuModel".to_owned(), facts.attributes.get("gpuModel").cloned().unwrap_or(Value::Null)),
        ("region".to_owned(), facts.attributes.get("region").cloned().unwrap_or(Value::Null)),
    ]);
    Ok(Some(Resource {
        target: Target::Reservation,
        id: id.to_string(),
        tenant_id: tenant(row.try_get("tenant_id")?)?,
        pool: Some(facts),
        attributes,
    }))
}
