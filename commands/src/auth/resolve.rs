//! Resolving resources for decisions from Better Compute's own tables (the inline state, which every command
//! has already committed to): the tenant each resolves in, and the pool with its offerings and attributes.
//! Each resolution is one statement, run in the caller's read-only transaction.

use std::collections::BTreeMap;

use bc_domain::id::{
    ImageId, InstanceId, NodeId, PoolId, ProfileId, ProviderAccountId, ReservationId, SiteId, TenantId, WorkflowId,
};
use bc_eventstore::{Error, Result, Tx, sql};
use sqlx::Row as _;
use sqlx::postgres::PgRow;

use super::{Attribute, PoolFacts, Resource, Target};

fn tenant(text: String) -> Result<TenantId> {
    text.parse().map_err(|err| Error::Internal(format!("a stored tenant id: {err}")))
}

/// The pool columns every resolution selects (`p` the pool, `s` its site), its offers as two parallel arrays.
macro_rules! pool_facts {
    () => {
        "p.id AS pool_id, p.owner_tenant_id AS pool_owner, p.class AS pool_class,
    p.gpu_model AS pool_gpu_model, p.sharing AS pool_sharing, s.iam_region AS pool_region,
    ARRAY(SELECT o.tenant_id FROM pool_offers AS o WHERE o.pool_id = p.id ORDER BY o.tenant_id) AS offer_tenants,
    ARRAY(SELECT o.include_descendants FROM pool_offers AS o WHERE o.pool_id = p.id ORDER BY o.tenant_id)
        AS offer_descendants"
    };
}

/// A pool's facts as the tables give them: the columns [`pool_facts!`] selects, or the object `pool_authz`
/// (`capacity/0005`) answers to a command's facts call.
#[derive(Debug, Clone, serde::Deserialize)]
pub(crate) struct PoolParts {
    pool_id: String,
    pool_owner: String,
    pool_class: String,
    pool_gpu_model: String,
    pool_sharing: String,
    pool_region: String,
    offer_tenants: Vec<String>,
    offer_descendants: Vec<bool>,
}

impl PoolParts {
    fn of_row(row: &PgRow) -> Result<PoolParts> {
        Ok(PoolParts {
            pool_id: row.try_get("pool_id")?,
            pool_owner: row.try_get("pool_owner")?,
            pool_class: row.try_get("pool_class")?,
            pool_gpu_model: row.try_get("pool_gpu_model")?,
            pool_sharing: row.try_get("pool_sharing")?,
            pool_region: row.try_get("pool_region")?,
            offer_tenants: row.try_get("offer_tenants")?,
            offer_descendants: row.try_get("offer_descendants")?,
        })
    }

    pub(crate) fn facts(self) -> Result<PoolFacts> {
        let offers = self
            .offer_tenants
            .into_iter()
            .zip(self.offer_descendants)
            .map(|(t, d)| Ok((tenant(t)?, d)))
            .collect::<Result<Vec<_>>>()?;
        let attributes = BTreeMap::from([
            ("region".to_owned(), Attribute::Text(self.pool_region)),
            ("class".to_owned(), Attribute::Text(self.pool_class)),
            ("gpuModel".to_owned(), Attribute::Text(self.pool_gpu_model)),
            ("sharing".to_owned(), Attribute::Text(self.pool_sharing)),
        ]);
        Ok(PoolFacts {
            id: self.pool_id.parse().map_err(|err| Error::Internal(format!("a stored pool id: {err}")))?,
            owner_tenant_id: tenant(self.pool_owner)?,
            offers,
            attributes,
        })
    }
}

/// The pool facts of a row that selected [`pool_facts!`].
fn pool_facts(row: &PgRow) -> Result<PoolFacts> {
    PoolParts::of_row(row)?.facts()
}

/// The pool attributes a child resource (a node, a reservation) shows as its own.
fn inherited(facts: &PoolFacts, attributes: &mut BTreeMap<String, Attribute>) {
    for key in ["gpuModel", "region"] {
        attributes.insert(key.to_owned(), facts.attributes.get(key).cloned().unwrap_or(Attribute::Absent));
    }
}

/// A pool, its offerings and the attributes policies read.
pub async fn pool(tx: &mut Tx, id: &PoolId) -> Result<Option<PoolFacts>> {
    let query =
        concat!("SELECT ", pool_facts!(), " FROM pools AS p JOIN sites AS s ON s.id = p.site_id WHERE p.id = $1");
    let row = sql::query(query).bind(id.as_str()).fetch_optional(tx.conn()).await?;
    row.as_ref().map(pool_facts).transpose()
}

/// A pool as the resource of a pool method.
pub async fn pool_resource(tx: &mut Tx, id: &PoolId) -> Result<Option<Resource>> {
    Ok(pool(tx, id).await?.map(|facts| Resource {
        target: Target::Pool,
        id: id.to_string(),
        tenant_id: facts.owner_tenant_id.clone(),
        attributes: facts.attributes.clone(),
        pool: Some(facts),
    }))
}

/// A site: the tenant that owns it.
pub async fn site_resource(tx: &mut Tx, id: &SiteId) -> Result<Option<Resource>> {
    let row = sql::query("SELECT owner_tenant_id, iam_region, kind FROM sites WHERE id = $1")
        .bind(id.as_str())
        .fetch_optional(tx.conn())
        .await?;
    let Some(row) = row else { return Ok(None) };
    let region: String = row.try_get("iam_region")?;
    let attributes = BTreeMap::from([
        ("region".to_owned(), Attribute::Text(region.clone())),
        ("iamRegion".to_owned(), Attribute::Text(region)),
        ("kind".to_owned(), Attribute::Text(row.try_get("kind")?)),
    ]);
    Ok(Some(Resource {
        target: Target::Site,
        id: id.to_string(),
        tenant_id: tenant(row.try_get("owner_tenant_id")?)?,
        pool: None,
        attributes,
    }))
}

/// An image: the tenant that owns it, whether it is public and whether a signature verified it.
pub async fn image_resource(tx: &mut Tx, id: &ImageId) -> Result<Option<Resource>> {
    let row = sql::query("SELECT tenant_id, visibility, signer IS NOT NULL AS verified FROM images WHERE id = $1")
        .bind(id.as_str())
        .fetch_optional(tx.conn())
        .await?;
    let Some(row) = row else { return Ok(None) };
    let attributes = BTreeMap::from([
        ("visibility".to_owned(), Attribute::Text(row.try_get("visibility")?)),
        ("verified".to_owned(), Attribute::Bool(row.try_get("verified")?)),
    ]);
    Ok(Some(Resource {
        target: Target::Image,
        id: id.to_string(),
        tenant_id: tenant(row.try_get("tenant_id")?)?,
        pool: None,
        attributes,
    }))
}

/// A live profile version: the tenant that owns it.
pub async fn profile_resource(tx: &mut Tx, id: &ProfileId) -> Result<Option<Resource>> {
    let owner: Option<String> =
        sql::query_scalar("SELECT tenant_id FROM profiles WHERE id = $1 AND deleted_at IS NULL")
            .bind(id.as_str())
            .fetch_optional(tx.conn())
            .await?;
    let Some(owner) = owner else { return Ok(None) };
    Ok(Some(Resource {
        target: Target::Profile,
        id: id.to_string(),
        tenant_id: tenant(owner)?,
        pool: None,
        attributes: BTreeMap::new(),
    }))
}

/// A provider account: the tenant that owns it.
pub async fn provider_account_resource(tx: &mut Tx, id: &ProviderAccountId) -> Result<Option<Resource>> {
    let owner: Option<String> = sql::query_scalar("SELECT tenant_id FROM provider_accounts WHERE id = $1")
        .bind(id.as_str())
        .fetch_optional(tx.conn())
        .await?;
    let Some(owner) = owner else { return Ok(None) };
    Ok(Some(Resource {
        target: Target::ProviderAccount,
        id: id.to_string(),
        tenant_id: tenant(owner)?,
        pool: None,
        attributes: BTreeMap::new(),
    }))
}

/// A workflow: it resolves as its machine does, in the machine's pool.
pub async fn workflow_resource(tx: &mut Tx, id: &WorkflowId) -> Result<Option<Resource>> {
    let row = sql::query("SELECT node_id, kind FROM workflows WHERE id = $1")
        .bind(id.as_str())
        .fetch_optional(tx.conn())
        .await?;
    let Some(row) = row else { return Ok(None) };
    let node: String = row.try_get("node_id")?;
    let node: NodeId = node.parse().map_err(|err| Error::Internal(format!("a stored node id: {err}")))?;
    let Some(mut resource) = node_resource(tx, &node).await? else { return Ok(None) };
    resource.target = Target::Workflow;
    resource.id = id.to_string();
    resource.attributes = BTreeMap::from([("kind".to_owned(), Attribute::Text(row.try_get("kind")?))]);
    Ok(Some(resource))
}

/// A node: it resolves in its pool's owner tenant, with the pool as its parent.
pub async fn node_resource(tx: &mut Tx, id: &NodeId) -> Result<Option<Resource>> {
    let query = concat!(
        "SELECT n.trust, n.provision_state, n.owner_tenant_id AS dedicated_to, ",
        pool_facts!(),
        " FROM nodes AS n JOIN pools AS p ON p.id = n.pool_id JOIN sites AS s ON s.id = p.site_id WHERE n.id = $1"
    );
    let row = sql::query(query).bind(id.as_str()).fetch_optional(tx.conn()).await?;
    let Some(row) = row else { return Ok(None) };
    let facts = pool_facts(&row)?;
    let mut attributes = BTreeMap::from([
        ("trust".to_owned(), Attribute::Text(row.try_get("trust")?)),
        ("lifecycle".to_owned(), Attribute::Text(row.try_get("provision_state")?)),
        ("dedicatedTo".to_owned(), Attribute::from(row.try_get::<Option<String>, _>("dedicated_to")?)),
    ]);
    inherited(&facts, &mut attributes);
    Ok(Some(Resource {
        target: Target::Node,
        id: id.to_string(),
        tenant_id: facts.owner_tenant_id.clone(),
        pool: Some(facts),
        attributes,
    }))
}

/// A recorded reservation's facts as the tables give them (`reservation_authz` answers the same object).
#[derive(Debug, Clone, serde::Deserialize)]
pub(crate) struct ReservationParts {
    tenant_id: String,
    count: i32,
    project_id: Option<String>,
    duration_s: Option<f64>,
    #[serde(flatten)]
    pool: PoolParts,
}

impl ReservationParts {
    /// The reservation `id` as the resource of a reservation method.
    pub(crate) fn resource(self, id: &ReservationId) -> Result<Resource> {
        let facts = self.pool.facts()?;
        let mut attributes = BTreeMap::from([
            ("gpuCount".to_owned(), Attribute::Number(f64::from(self.count))),
            ("durationHours".to_owned(), Attribute::from(self.duration_s.map(|s| s / 3600.0))),
            ("projectId".to_owned(), Attribute::from(self.project_id)),
        ]);
        inherited(&facts, &mut attributes);
        Ok(Resource {
            target: Target::Reservation,
            id: id.to_string(),
            tenant_id: tenant(self.tenant_id)?,
            pool: Some(facts),
            attributes,
        })
    }
}

/// A recorded reservation: it resolves in the tenant that made it, with its pool as its parent.
pub async fn reservation_resource(tx: &mut Tx, id: &ReservationId) -> Result<Option<Resource>> {
    let query = concat!(
        "SELECT r.tenant_id, r.count, r.project_id, (r.request->>'durationS')::float8 AS duration_s, ",
        pool_facts!(),
        " FROM reservations AS r JOIN pools AS p ON p.id = r.pool_id JOIN sites AS s ON s.id = p.site_id
         WHERE r.id = $1"
    );
    let row = sql::query(query).bind(id.as_str()).fetch_optional(tx.conn()).await?;
    let Some(row) = row else { return Ok(None) };
    let parts = ReservationParts {
        tenant_id: row.try_get("tenant_id")?,
        count: row.try_get("count")?,
        project_id: row.try_get("project_id")?,
        duration_s: row.try_get("duration_s")?,
        pool: PoolParts::of_row(&row)?,
    };
    parts.resource(id).map(Some)
}

/// When a recorded reservation's window starts, once placed.
pub async fn reservation_start(tx: &mut Tx, id: &ReservationId) -> Result<Option<i64>> {
    let start: Option<Option<i64>> = sql::query_scalar("SELECT ts_ms(start_at) FROM reservations WHERE id = $1")
        .bind(id.as_str())
        .fetch_optional(tx.conn())
        .await?;
    Ok(start.flatten())
}

/// What policies read of an instance, recorded or a draft: its sizes, its image and whether an allowed signer
/// verified it, its project; and its pool's model and region.
pub(crate) fn instance_attributes(
    spec: &bc_domain::instance::InstanceSpec,
    image_verified: bool,
    pool: &PoolFacts,
) -> BTreeMap<String, Attribute> {
    let mut attributes = BTreeMap::from([
        ("vcpu".to_owned(), Attribute::Number(f64::from(spec.sizes.vcpu))),
        ("memoryGiB".to_owned(), Attribute::Number(f64::from(spec.sizes.memory_gib))),
        ("gpus".to_owned(), Attribute::Number(f64::from(spec.sizes.gpus))),
        ("imageId".to_owned(), Attribute::Text(spec.image_id.to_string())),
        ("imageVerified".to_owned(), Attribute::Bool(image_verified)),
        ("projectId".to_owned(), Attribute::from(spec.project_id.as_ref().map(|p| p.to_string()))),
    ]);
    inherited(pool, &mut attributes);
    attributes
}

/// A recorded instance: it resolves in the tenant that made it, with its pool as its parent.
pub async fn instance_resource(tx: &mut Tx, id: &InstanceId) -> Result<Option<Resource>> {
    let query = concat!(
        "SELECT i.doc::text AS doc, ",
        pool_facts!(),
        " FROM instances AS i JOIN pools AS p ON p.id = i.pool_id JOIN sites AS s ON s.id = p.site_id WHERE i.id = $1"
    );
    let row = sql::query(query).bind(id.as_str()).fetch_optional(tx.conn()).await?;
    let Some(row) = row else { return Ok(None) };
    let doc: String = row.try_get("doc")?;
    let instance: bc_domain::instance::Instance =
        serde_json::from_str(&doc).map_err(|err| Error::Internal(format!("instances.doc of {id}: {err}")))?;
    let facts = pool_facts(&row)?;
    let created = &instance.created;
    Ok(Some(Resource {
        target: Target::Instance,
        id: id.to_string(),
        tenant_id: created.tenant_id.clone(),
        attributes: instance_attributes(&created.spec, created.image_verified, &facts),
        pool: Some(facts),
    }))
}
