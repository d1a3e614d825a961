//! Reads of the read models, scoped to the caller's tenant, a page at a time, each honouring a consistency
//! token: with `after`, the answer waits (boundedly) until the read models it reads have passed that position.
//! Rows come out as typed views (times in epoch milliseconds); the HTTP layer renders them.

use std::time::Duration;

use bc_domain::device::DeviceClass;
use bc_domain::id::{NodeId, PoolId, SiteId, TenantId};
use bc_domain::node::{Adapter, Condition, Connectivity, Node, ProvisionState, Role, Trust};
use bc_domain::pool::{Pool, PoolAgent, PoolClass, PoolPolicy, Quota, Sharing};
use bc_domain::reservation::Reservation;
use bc_domain::site::SiteKind;
use bc_eventstore::{Position, Tx, TxOptions};
use bc_projections::models::reservations::read_folded;
use bc_projections::{consistency, framework};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use sqlx::AssertSqlSafe;

use super::{App, AppError, AppResult, Caller};

/// How long a read waits for the read models to reach its consistency token.
pub const CONSISTENCY_WAIT: Duration = Duration::from_secs(2);

/// At most `limit` items after the key `after_key` (in the list's order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub limit: u32,
    pub after_key: Option<String>,
}

impl Page {
    /// The first page of up to `limit` items.
    pub fn first(limit: u32) -> Page {
        Page { limit, after_key: None }
    }
}

/// One page of a list, and the key to continue after when there may be more.
#[derive(Debug, Clone, PartialEq)]
pub struct Listed<T> {
    pub items: Vec<T>,
    pub next_key: Option<String>,
}

/// A pool as the caller's tenant sees it (the `pools` read model): offers other than its own are left out
/// unless it owns the pool.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolView {
    pub id: PoolId,
    pub site_id: SiteId,
    pub owner_tenant_id: TenantId,
    pub name: String,
    pub class: PoolClass,
    pub gpu_model: String,
    pub sharing: Sharing,
    pub agent: PoolAgent,
    pub policy: PoolPolicy,
    pub offers: Vec<OfferView>,
    pub node_count: u32,
    pub created_at_ms: i64,
}

impl PoolView {
    /// `pool` (with `node_count` nodes) as `caller` sees it.
    pub fn seen_by(pool: Pool, node_count: i32, caller: &Caller) -> PoolView {
        let owner = pool.owner_tenant_id == caller.tenant_id;
        // A tenant sees the offering that governs it: its own, or an ancestor's that includes descendants.
        let governing = bc_domain::pool::governing_offer(&pool.offers, &caller.tenant_id, &caller.ancestors)
            .map(|offer| offer.tenant_id.clone());
        PoolView {
            offers: pool
                .offers
                .iter()
                .filter(|offer| owner || Some(&offer.tenant_id) == governing.as_ref())
                .map(|offer| OfferView {
                    tenant_id: offer.tenant_id.clone(),
                    quota: offer.quota.clone(),
                    priority: offer.priority,
                    include_descendants: offer.include_descendants,
                })
                .collect(),
            id: pool.id,
            site_id: pool.site_id,
            owner_tenant_id: pool.owner_tenant_id,
            name: pool.name,
            class: pool.class,
            gpu_model: pool.gpu_model,
            sharing: pool.sharing,
            agent: pool.agent,
            policy: pool.policy,
            node_count: node_count.max(0) as u32,
            created_at_ms: pool.created_at_ms,
        }
    }
}

/// One offering of a pool.
#[derive(Debug, Clone, PartialEq)]
pub struct OfferView {
    pub tenant_id: TenantId,
    pub quota: Quota,
    pub priority: i32,
    pub include_descendants: bool,
}

/// A site of the caller's tenant.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SiteView {
    pub id: SiteId,
    pub owner_tenant_id: TenantId,
    pub name: String,
    pub iam_region: String,
    pub kind: SiteKind,
    #[serde(rename = "createdAt")]
    pub created_at_ms: i64,
}

/// A node of a pool the caller's tenant owns (the `nodes` read model).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub id: NodeId,
    pub pool_id: PoolId,
    pub site_id: SiteId,
    pub owner_tenant_id: Option<TenantId>,
    pub name: String,
    pub role: Role,
    pub trust: Trust,
    pub adapter: Adapter,
    pub provision_state: ProvisionState,
    pub maintenance: bool,
    pub cordoned: bool,
    pub connectivity: Connectivity,
    pub conditions: Vec<Condition>,
    pub no_schedule_reasons: Vec<String>,
    pub observed_generation: u64,
    pub schedulable: bool,
    pub gpu_count: u32,
    pub atom_class: Option<DeviceClass>,
    pub atom_count: u32,
    /// A drain began and has not completed.
    pub draining: bool,
    pub generation: u64,
    pub registered_at_ms: i64,
    /// The hash of the machine's surviving identifiers, and whether enough of them survived to trust it.
    pub hardware_key: Option<String>,
    pub hardware_trusted: bool,
    /// Its devices: GPUs and, below them, the atoms a pool books (MIG instances, slots).
    pub devices: Vec<bc_domain::device::Device>,
    /// The BMC of a machine enrolled from it (never its credentials).
    pub bmc: Option<bc_domain::node::NodeBmc>,
    /// Since when it is in a transitional `provisionState` that has a time limit.
    pub provision_since_ms: Option<i64>,
    /// Power as its BMC last reported it.
    pub power: bc_domain::node::Power,
    /// Its scalar resources as last reported, before the pool's overcommit.
    pub resources: std::collections::BTreeMap<String, u64>,
}

impl NodeView {
    /// The view of a node's fold in a pool owned by `pool_owner`.
    pub fn of(node: &Node, pool_owner: &TenantId) -> NodeView {
        let (atom_class, atom_count) = node.atoms();
        NodeView {
            id: node.id.clone(),
            pool_id: node.pool_id.clone(),
            site_id: node.site_id.clone(),
            owner_tenant_id: node.owner_tenant_id.clone(),
            name: node.name.clone(),
            role: node.role,
            trust: node.trust,
            adapter: node.adapter,
            provision_state: node.provision_state,
            maintenance: node.maintenance,
            cordoned: node.cordoned,
            connectivity: node.connectivity,
            conditions: node.conditions.clone(),
            no_schedule_reasons: node.no_schedule_reasons(),
            observed_generation: node.observed_generation,
            schedulable: node.unschedulable(pool_owner).is_empty(),
            gpu_count: node.gpus.len() as u32,
            atom_class,
            atom_count: atom_count as u32,
            draining: node.draining,
            generation: node.generation,
            registered_at_ms: node.registered_at_ms,
            hardware_key: node.hardware.as_ref().map(|h| h.key.clone()),
            hardware_trusted: node.hardware.as_ref().is_some_and(|h| h.trusted),
            devices: node.devices.clone(),
            bmc: node.bmc.clone(),
            provision_since_ms: node.provision_since_ms,
            power: node.power,
            resources: node.resources.clone(),
        }
    }
}

/// One resource of a pool's capacity rollup, in atoms.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityView {
    pub resource: String,
    pub allocatable: i64,
    pub allocated: i64,
    pub reserved: i64,
    pub available: i64,
}

/// One entry of a tenant's audit trail: an allowed mutation with its admission context, or a recorded denial
/// (`decision` is `allowed` or `denied`). The same record the audit checkpoints hash into their leaves.
pub use bc_domain::audit::AuditRecord as AuditEntry;

/// Filters of `reservations.list`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReservationFilter {
    pub pool_id: Option<String>,
    pub state: Option<String>,
}

/// The table a read model's active version keeps `table` in (`pools` → `pools_v2`).
pub(crate) async fn active_table(tx: &mut Tx, name: &str, table: &str) -> AppResult<String> {
    // Before any projection ran, nothing is active: the newest version's table (made by its migration, empty
    // until the daemon fills it) is the one the queries here are written for.
    let newest = || {
        bc_projections::models::read_models()
            .iter()
            .filter(|m| m.name() == name)
            .map(|m| m.version())
            .max()
            .unwrap_or(1)
    };
    let version = framework::active_version(tx, name).await?.unwrap_or_else(newest);
    Ok(format!("{table}_v{version}"))
}

/// Runs a query whose rows are `(key, json)`, from text naming tables this module chose; binds are text. Each
/// row's JSON is read into its view.
async fn rows<T: DeserializeOwned>(tx: &mut Tx, query: String, binds: &[Option<&str>]) -> AppResult<Vec<(String, T)>> {
    let mut q = sqlx::query_as::<_, (String, String)>(AssertSqlSafe(query)).persistent(false);
    for bind in binds {
        q = q.bind(*bind);
    }
    let found = q.fetch_all(tx.conn()).await?;
    found
        .into_iter()
        .map(|(key, text)| {
            let value = serde_json::from_str(&text).map_err(|err| {
                AppError::Store(bc_eventstore::Error::Internal(format!("a read model row of {key}: {err}")))
            })?;
            Ok((key, value))
        })
        .collect()
}

/// Runs a query whose rows are `(key, folded state as JSON text, a count)`, from text naming tables this module
/// chose; binds are text.
async fn folded_rows(tx: &mut Tx, query: String, binds: &[Option<&str>]) -> AppResult<Vec<(String, String, i32)>> {
    let mut q = sqlx::query_as::<_, (String, String, i32)>(AssertSqlSafe(query)).persistent(false);
    for bind in binds {
        q = q.bind(*bind);
    }
    Ok(q.fetch_all(tx.conn()).await?)
}

/// A folded aggregate of read model `name` read back.
fn read_fold<T: DeserializeOwned>(name: &str, id: &str, text: &str) -> AppResult<T> {
    Ok(bc_projections::models::folded::read(name, id, text)?)
}

/// The views of folded pools (with their node counts), as `caller` sees them.
/// The views of folded pools that `caller` may see: it owns them, or an offering governs it (its own, or an
/// ancestor's with `includeDescendants`). The rows were read with any offering of the tenant or its ancestors.
fn pool_views(found: Vec<(String, String, i32)>, caller: &Caller) -> AppResult<Vec<(String, PoolView)>> {
    let mut views = Vec::with_capacity(found.len());
    for (id, text, nodes) in found {
        let pool: Pool = read_fold("pools", &id, &text)?;
        let visible = pool.owner_tenant_id == caller.tenant_id
            || bc_domain::pool::governing_offer(&pool.offers, &caller.tenant_id, &caller.ancestors).is_some();
        if visible {
            views.push((id, PoolView::seen_by(pool, nodes, caller)));
        }
    }
    Ok(views)
}

/// The caller's tenant and its ancestors, comma-separated, for `string_to_array` (tenant ids hold no comma).
fn tenant_and_ancestors(caller: &Caller) -> String {
    std::iter::once(caller.tenant_id.as_str())
        .chain(caller.ancestors.iter().map(TenantId::as_str))
        .collect::<Vec<_>>()
        .join(",")
}

/// The views of folded nodes, for a caller of the tenant that owns their pools (the rows were filtered so).
fn node_views(found: Vec<(String, String, i32)>, caller: &Caller) -> AppResult<Vec<(String, NodeView)>> {
    found
        .into_iter()
        .map(|(id, text, _)| Ok((id.clone(), NodeView::of(&read_fold("nodes", &id, &text)?, &caller.tenant_id))))
        .collect()
}

/// The one row of a read by id, or `NOT_FOUND` naming what was looked for.
fn the_one<T>(found: Vec<(String, T)>, kind: &'static str, id: &str) -> AppResult<T> {
    let missing = || bc_domain::Rejection::NotFound { kind, id: id.to_owned() }.into();
    found.into_iter().next().map(|(_, value)| value).ok_or_else(missing)
}

/// Cuts one extra row off (its presence says there is a next page).
pub(crate) fn paged<T>(mut found: Vec<(String, T)>, page: &Page) -> Listed<T> {
    let more = found.len() > page.limit as usize;
    found.truncate(page.limit as usize);
    let next_key = if more { found.last().map(|(key, _)| key.clone()) } else { None };
    Listed { items: found.into_iter().map(|(_, value)| value).collect(), next_key }
}

/// A site as the API shows it.
const SITE_JSON: &str = "jsonb_build_object(
    'id', s.id, 'ownerTenantId', s.owner_tenant_id, 'name', s.name, 'iamRegion', s.iam_region, 'kind', s.kind,
    'createdAt', ts_ms(s.created_at))";

impl App {
    /// Waits for the consistency token, if any.
    pub(crate) async fn consistent(&self, names: &[&str], after: Option<Position>) -> AppResult<()> {
        let Some(after) = after else { return Ok(()) };
        match consistency::wait_for(&self.db, names, after, CONSISTENCY_WAIT).await? {
            None => Ok(()),
            Some(reached) => Err(AppError::NotYetConsistent { wanted: after, reached }),
        }
    }

    /// The pools the caller's tenant owns or is offered, from the `pools` read model.
    pub async fn list_pools(
        &self,
        caller: &Caller,
        page: &Page,
        after: Option<Position>,
    ) -> AppResult<Listed<PoolView>> {
        self.consistent(&["pools"], after).await?;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let table = active_table(&mut tx, "pools", "pools").await?;
        let query = format!(
            "SELECT p.pool_id, p.folded::text, p.node_count FROM {table} AS p
             WHERE (p.owner_tenant_id = $1 OR p.offer_tenants && string_to_array($3, ','))
               AND ($2::text IS NULL OR p.pool_id > $2)
             ORDER BY p.pool_id LIMIT {}",
            page.limit + 1
        );
        let tenants = tenant_and_ancestors(caller);
        let binds = [Some(caller.tenant_id.as_str()), page.after_key.as_deref(), Some(tenants.as_str())];
        let found = folded_rows(&mut tx, query, &binds).await?;
        tx.commit().await?;
        // A row an ancestor's offering brought that does not include descendants is dropped after the page is
        // cut, so the next key still follows the rows read and nothing is skipped.
        let read = paged(found.into_iter().map(|row| (row.0.clone(), row)).collect(), page);
        let items = pool_views(read.items, caller)?.into_iter().map(|(_, view)| view).collect();
        Ok(Listed { items, next_key: read.next_key })
    }

    /// One pool the caller's tenant owns or is offered.
    pub async fn pool(&self, caller: &Caller, pool_id: &PoolId, after: Option<Position>) -> AppResult<PoolView> {
        self.consistent(&["pools"], after).await?;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let table = active_table(&mut tx, "pools", "pools").await?;
        let query = format!(
            "SELECT p.pool_id, p.folded::text, p.node_count FROM {table} AS p
             WHERE (p.owner_tenant_id = $1 OR p.offer_tenants && string_to_array($3, ',')) AND p.pool_id = $2"
        );
        let tenants = tenant_and_ancestors(caller);
        let binds = [Some(caller.tenant_id.as_str()), Some(pool_id.as_str()), Some(tenants.as_str())];
        let found = folded_rows(&mut tx, query, &binds).await?;
        tx.commit().await?;
        the_one(pool_views(found, caller)?, "pool", pool_id.as_str())
    }

    /// A pool's capacity rollup, by resource, if the caller may see the pool.
    pub async fn pool_capacity(
        &self,
        caller: &Caller,
        pool_id: &PoolId,
        after: Option<Position>,
    ) -> AppResult<Vec<CapacityView>> {
        self.pool(caller, pool_id, after).await?;
        self.consistent(&["pool_capacity_rollup"], after).await?;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let table = active_table(&mut tx, "pool_capacity_rollup", "pool_capacity_rollup").await?;
        let query = format!(
            "SELECT r.resource, jsonb_build_object('resource', r.resource, 'allocatable', r.allocatable,
                    'allocated', r.allocated, 'reserved', r.reserved, 'available', r.available)::text
             FROM {table} AS r WHERE r.pool_id = $1 ORDER BY r.resource"
        );
        let found = rows(&mut tx, query, &[Some(pool_id.as_str())]).await?;
        tx.commit().await?;
        Ok(found.into_iter().map(|(_, value)| value).collect())
    }

    /// The caller's tenant's sites, in id order. Sites are written in their command's transaction (they guard
    /// pool creation), so the read is as fresh as any command.
    pub async fn list_sites(&self, caller: &Caller, page: &Page) -> AppResult<Listed<SiteView>> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let query = format!(
            "SELECT s.id, ({SITE_JSON})::text FROM sites AS s
             WHERE s.owner_tenant_id = $1 AND ($2::text IS NULL OR s.id > $2) ORDER BY s.id LIMIT {}",
            page.limit + 1
        );
        let found = rows(&mut tx, query, &[Some(caller.tenant_id.as_str()), page.after_key.as_deref()]).await?;
        tx.commit().await?;
        Ok(paged(found, page))
    }

    /// One site of the caller's tenant.
    pub async fn site(&self, caller: &Caller, site_id: &SiteId) -> AppResult<SiteView> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let query =
            format!("SELECT s.id, ({SITE_JSON})::text FROM sites AS s WHERE s.owner_tenant_id = $1 AND s.id = $2");
        let found = rows(&mut tx, query, &[Some(caller.tenant_id.as_str()), Some(site_id.as_str())]).await?;
        tx.commit().await?;
        the_one(found, "site", site_id.as_str())
    }

    /// One node of a pool the caller's tenant owns, from the `nodes` read model.
    pub async fn node(&self, caller: &Caller, node_id: &NodeId, after: Option<Position>) -> AppResult<NodeView> {
        self.consistent(&["nodes"], after).await?;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let table = active_table(&mut tx, "nodes", "nodes").await?;
        let query = format!(
            "SELECT n.node_id, n.folded::text, 0 FROM {table} AS n WHERE n.pool_owner_tenant_id = $1 AND n.node_id = $2"
        );
        let found = folded_rows(&mut tx, query, &[Some(caller.tenant_id.as_str()), Some(node_id.as_str())]).await?;
        tx.commit().await?;
        the_one(node_views(found, caller)?, "node", node_id.as_str())
    }

    /// The nodes of the pools the caller's tenant owns, from the `nodes` read model.
    pub async fn list_nodes(
        &self,
        caller: &Caller,
        pool_id: Option<&PoolId>,
        page: &Page,
        after: Option<Position>,
    ) -> AppResult<Listed<NodeView>> {
        self.consistent(&["nodes"], after).await?;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let table = active_table(&mut tx, "nodes", "nodes").await?;
        let query = format!(
            "SELECT n.node_id, n.folded::text, 0
             FROM {table} AS n
             WHERE n.pool_owner_tenant_id = $1 AND ($2::text IS NULL OR n.node_id > $2)
               AND ($3::text IS NULL OR n.pool_id = $3)
             ORDER BY n.node_id LIMIT {}",
            page.limit + 1
        );
        let binds = [Some(caller.tenant_id.as_str()), page.after_key.as_deref(), pool_id.map(PoolId::as_str)];
        let found = folded_rows(&mut tx, query, &binds).await?;
        tx.commit().await?;
        Ok(paged(node_views(found, caller)?, page))
    }

    /// The caller's tenant's reservations, from the `reservations` read model, in id order: each as the
    /// domain folds its stream, exactly what a read by id answers.
    pub async fn list_reservations(
        &self,
        caller: &Caller,
        filter: &ReservationFilter,
        page: &Page,
        after: Option<Position>,
    ) -> AppResult<Listed<Reservation>> {
        self.reservations_of(Some(&caller.tenant_id), filter, page, after).await
    }

    /// Every tenant's reservations (or one tenant's), for the platform's operators: call it only with a caller
    /// the door allowed `fleet.reservations.list`, which resolves in the root tenant alone.
    pub async fn list_fleet_reservations(
        &self,
        _caller: &Caller,
        tenant: Option<&TenantId>,
        filter: &ReservationFilter,
        page: &Page,
        after: Option<Position>,
    ) -> AppResult<Listed<Reservation>> {
        self.reservations_of(tenant, filter, page, after).await
    }

    async fn reservations_of(
        &self,
        tenant: Option<&TenantId>,
        filter: &ReservationFilter,
        page: &Page,
        after: Option<Position>,
    ) -> AppResult<Listed<Reservation>> {
        self.consistent(&["reservations"], after).await?;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let table = active_table(&mut tx, "reservations", "reservations").await?;
        let query = format!(
            "SELECT r.reservation_id, r.folded::text
             FROM {table} AS r
             WHERE ($1::text IS NULL OR r.tenant_id = $1) AND ($2::text IS NULL OR r.reservation_id > $2)
               AND ($3::text IS NULL OR r.pool_id = $3) AND ($4::text IS NULL OR r.state = $4)
             ORDER BY r.reservation_id LIMIT {}",
            page.limit + 1
        );
        let found: Vec<(String, String)> = sqlx::query_as(AssertSqlSafe(query))
            .persistent(false)
            .bind(tenant.map(TenantId::as_str))
            .bind(page.after_key.as_deref())
            .bind(filter.pool_id.as_deref())
            .bind(filter.state.as_deref())
            .fetch_all(tx.conn())
            .await?;
        tx.commit().await?;
        let found = found
            .into_iter()
            .map(|(id, text)| Ok((id.clone(), read_folded(&id, &text)?)))
            .collect::<AppResult<Vec<_>>>()?;
        Ok(paged(found, page))
    }

    /// The caller's tenant's audit trail, oldest first: every allowed mutation with its admission context, and
    /// every recorded denial.
    pub async fn audit(&self, caller: &Caller, page: &Page, after: Option<Position>) -> AppResult<Listed<AuditEntry>> {
        self.audit_of(Some(&caller.tenant_id), page, after).await
    }

    /// Every tenant's audit trail (or one tenant's), for the platform's operators: call it only with a caller
    /// the door allowed `fleet.audit.list`, which resolves in the root tenant alone.
    pub async fn fleet_audit(
        &self,
        _caller: &Caller,
        tenant: Option<&TenantId>,
        page: &Page,
        after: Option<Position>,
    ) -> AppResult<Listed<AuditEntry>> {
        self.audit_of(tenant, page, after).await
    }

    async fn audit_of(
        &self,
        tenant: Option<&TenantId>,
        page: &Page,
        after: Option<Position>,
    ) -> AppResult<Listed<AuditEntry>> {
        self.consistent(&["audit_events"], after).await?;
        let after_key: Option<Position> =
            page.after_key.as_deref().map(|key| key.parse()).transpose().map_err(
                |err: bc_eventstore::PositionError| bc_domain::Rejection::invalid("cursor", err.to_string()),
            )?;
        let (epoch, txid, seq) = after_key.map_or((None, None, None), |p| {
            (Some(p.epoch.to_string()), Some(p.txid.to_string()), Some(p.seq.to_string()))
        });
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let table = active_table(&mut tx, "audit_events", "audit_events").await?;
        let query = format!(
            "SELECT a.position, jsonb_build_object(
                    'position', a.position, 'streamId', a.stream_id, 'streamVersion', a.stream_version,
                    'eventType', a.event_type, 'tenantId', a.tenant_id, 'decision', a.decision, 'reason', a.reason,
                    'identity', a.identity, 'sessionKind', a.session_kind, 'agent', a.agent,
                    'delegation', a.delegation, 'requestId', a.request_id,
                    'admissionTenantId', a.admission_tenant_id, 'recordedAt', ts_ms(a.recorded_at))::text
             FROM {table} AS a
             WHERE ($1::text IS NULL OR a.tenant_id = $1)
               AND ($2::text IS NULL OR (a.log_epoch, a.txid, a.seq) > ($2::int4, $3::text::xid8, $4::int8))
             ORDER BY a.log_epoch, a.txid, a.seq LIMIT {}",
            page.limit + 1
        );
        let binds = [tenant.map(TenantId::as_str), epoch.as_deref(), txid.as_deref(), seq.as_deref()];
        let found = rows(&mut tx, query, &binds).await?;
        tx.commit().await?;
        Ok(paged(found, page))
    }
}
