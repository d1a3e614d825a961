//! The command handlers' reads: lookups of the inline tables, the placement query, the quota sweep and the
//! locks, each in the lock order quota_usage → pools → nodes → devices → device_bookings.

use bc_domain::event::DomainEvent;
use bc_domain::id::{NodeId, PoolId, ReservationId, TenantId};
use bc_domain::node::{Disruption, VerbState};
use bc_domain::placement::NodeCandidate;
use bc_domain::pool::{PoolEvent, PoolOffered, PoolPolicy, Sharing};
use bc_domain::reservation::{self, DeviceRequest, Reservation, ReservationEvent};
use bc_eventstore::{Error, Tx, events, sql};
use sqlx::Row as _;

use super::{AppError, AppResult};

pub mod agents;
pub mod audit;
pub mod certificates;
pub mod explain;
pub mod facts;
pub mod figures;
pub mod flavors;
pub mod hints;
pub mod idempotency;
pub mod images;
pub mod instances;
pub mod liveness;
pub mod node_commands;
pub mod profiles;
pub mod provider_machines;
pub mod providers;
pub mod quotes;
pub mod scalars;
pub mod site;
pub mod tenancy;
pub mod webhooks;
pub mod whole_nodes;
pub mod workflows;

/// A stored value that does not read back: an internal error naming what.
pub(crate) fn corrupt(what: &str, err: impl std::fmt::Display) -> AppError {
    AppError::Store(Error::Internal(format!("{what}: {err}")))
}

/// What handlers need of a pool.
#[derive(Debug, Clone)]
pub struct PoolRow {
    pub id: PoolId,
    pub owner_tenant_id: TenantId,
    pub gpu_model: String,
    pub sharing: Sharing,
    pub policy: PoolPolicy,
}

pub async fn pool(tx: &mut Tx, pool_id: &PoolId) -> AppResult<Option<PoolRow>> {
    let row = sql::query("SELECT owner_tenant_id, gpu_model, sharing, policy::text AS policy FROM pools WHERE id = $1")
        .bind(pool_id.as_str())
        .fetch_optional(tx.conn())
        .await?;
    let Some(row) = row else { return Ok(None) };
    let owner: String = row.try_get("owner_tenant_id")?;
    let sharing: String = row.try_get("sharing")?;
    let policy: String = row.try_get("policy")?;
    Ok(Some(PoolRow {
        id: pool_id.clone(),
        owner_tenant_id: owner.parse().map_err(|err| corrupt("pools.owner_tenant_id", err))?,
        gpu_model: row.try_get("gpu_model")?,
        sharing: serde_json::from_value(serde_json::Value::String(sharing))
            .map_err(|err| corrupt("pools.sharing", err))?,
        policy: serde_json::from_str(&policy).map_err(|err| corrupt("pools.policy", err))?,
    }))
}

/// The site a pool is in.
pub async fn pool_site(tx: &mut Tx, pool_id: &PoolId) -> AppResult<bc_domain::id::SiteId> {
    let site: String = sql::query_scalar("SELECT site_id FROM pools WHERE id = $1")
        .bind(pool_id.as_str())
        .fetch_one(tx.conn())
        .await?;
    site.parse().map_err(|err| corrupt("pools.site_id", err))
}

/// Locks a pool's row in share mode (second in the lock order), so a concurrent change to the pool waits.
pub async fn lock_pool(tx: &mut Tx, pool_id: &PoolId) -> AppResult<()> {
    sql::query("SELECT 1 FROM pools WHERE id = $1 FOR SHARE").bind(pool_id.as_str()).execute(tx.conn()).await?;
    Ok(())
}

pub async fn offers(tx: &mut Tx, pool_id: &PoolId) -> AppResult<Vec<PoolOffered>> {
    let rows = sql::query(
        "SELECT tenant_id, quota::text AS quota, priority, include_descendants, ts_ms(updated_at) AS at_ms
         FROM pool_offers WHERE pool_id = $1 ORDER BY tenant_id",
    )
    .bind(pool_id.as_str())
    .fetch_all(tx.conn())
    .await?;
    rows.iter()
        .map(|row| {
            let tenant: String = row.try_get("tenant_id")?;
            let quota: String = row.try_get("quota")?;
            Ok(PoolOffered {
                pool_id: pool_id.clone(),
                tenant_id: tenant.parse().map_err(|err| corrupt("pool_offers.tenant_id", err))?,
                quota: serde_json::from_str(&quota).map_err(|err| corrupt("pool_offers.quota", err))?,
                priority: row.try_get("priority")?,
                include_descendants: row.try_get("include_descendants")?,
                at_ms: row.try_get("at_ms")?,
            })
        })
        .collect()
}

pub async fn site_owner(tx: &mut Tx, site_id: &str) -> AppResult<Option<String>> {
    Ok(sql::query_scalar("SELECT owner_tenant_id FROM sites WHERE id = $1")
        .bind(site_id)
        .fetch_optional(tx.conn())
        .await?)
}

pub async fn name_taken(tx: &mut Tx, table: NamedTable, owner: &str, name: &str) -> AppResult<bool> {
    let query = match table {
        NamedTable::Sites => "SELECT EXISTS (SELECT 1 FROM sites WHERE owner_tenant_id = $1 AND name = $2)",
        NamedTable::Pools => "SELECT EXISTS (SELECT 1 FROM pools WHERE owner_tenant_id = $1 AND name = $2)",
        NamedTable::Projects => "SELECT EXISTS (SELECT 1 FROM projects WHERE tenant_id = $1 AND name = $2)",
        NamedTable::Nodes => "SELECT EXISTS (SELECT 1 FROM nodes WHERE pool_id = $1 AND name = $2)",
    };
    Ok(sql::query_scalar(query).bind(owner).bind(name).fetch_one(tx.conn()).await?)
}

/// Tables whose rows have a name unique within an owner.
#[derive(Debug, Clone, Copy)]
pub enum NamedTable {
    Sites,
    Pools,
    Projects,
    Nodes,
}

/// What the operator's decisions read of a node, from its inline row (`None`: no such node). Two verbs on one
/// node at once both append at the stream's next version; the second is retried on its conflict.
pub async fn node(tx: &mut Tx, node_id: &NodeId) -> AppResult<Option<VerbState>> {
    let row = sql::query(
        "SELECT pool_id, cordoned, maintenance, draining, generation, spec::text AS spec FROM nodes WHERE id = $1",
    )
    .bind(node_id.as_str())
    .fetch_optional(tx.conn())
    .await?;
    let Some(row) = row else { return Ok(None) };
    let pool: String = row.try_get("pool_id")?;
    let spec: String = row.try_get("spec")?;
    Ok(Some(VerbState {
        id: node_id.clone(),
        pool_id: pool.parse().map_err(|err| corrupt("nodes.pool_id", err))?,
        cordoned: row.try_get("cordoned")?,
        maintenance: row.try_get("maintenance")?,
        draining: row.try_get("draining")?,
        generation: row.try_get::<i64, _>("generation")?.max(0) as u64,
        spec: serde_json::from_str(&spec).map_err(|err| corrupt("nodes.spec", err))?,
    }))
}

/// How much of a pool's disruption budget the other nodes than `node_id` already spend.
pub async fn disruption(tx: &mut Tx, pool: &PoolRow, node_id: &NodeId) -> AppResult<Disruption> {
    let row = sql::query(
        "SELECT count(*) AS nodes, count(*) FILTER (WHERE (draining OR maintenance) AND id <> $2) AS disrupted
         FROM nodes WHERE pool_id = $1",
    )
    .bind(pool.id.as_str())
    .bind(node_id.as_str())
    .fetch_one(tx.conn())
    .await?;
    Ok(Disruption {
        budget: pool.policy.disruption_budget,
        nodes: row.try_get("nodes")?,
        disrupted: row.try_get("disrupted")?,
    })
}

/// The reservations placed or running on a node (at most 20, in id order), and those of them active.
pub async fn held_on_node(tx: &mut Tx, node_id: &NodeId) -> AppResult<(Vec<String>, Vec<ReservationId>)> {
    let rows: Vec<(String, String)> = sql::query_as(
        "SELECT DISTINCT r.id, r.state FROM allocations AS a JOIN reservations AS r ON r.id = a.reservation_id
         WHERE a.node_id = $1 AND r.state IN ('placed', 'binding', 'active', 'releasing')
         ORDER BY r.id",
    )
    .bind(node_id.as_str())
    .fetch_all(tx.conn())
    .await?;
    let active = rows
        .iter()
        .filter(|(_, state)| state == "active")
        .map(|(id, _)| id.parse().map_err(|err| corrupt("reservations.id", err)))
        .collect::<AppResult<Vec<_>>>()?;
    Ok((rows.into_iter().take(20).map(|(id, _)| id).collect(), active))
}

/// Refuses (`CONFLICT`, naming them) devices that another node already has.
pub async fn refuse_taken_devices(tx: &mut Tx, devices: &[bc_domain::device::Device]) -> AppResult<()> {
    let ids: Vec<&str> = devices.iter().map(|d| d.id.as_str()).collect();
    let taken = devices_taken(tx, &ids).await?;
    if !taken.is_empty() {
        return Err(bc_domain::Rejection::Conflict(format!(
            "devices already registered on another node: {}",
            taken.join(", ")
        ))
        .into());
    }
    Ok(())
}

pub async fn devices_taken(tx: &mut Tx, ids: &[&str]) -> AppResult<Vec<String>> {
    Ok(sql::query_scalar("SELECT id FROM devices WHERE id = ANY($1) ORDER BY id")
        .bind(ids)
        .fetch_all(tx.conn())
        .await?)
}

/// A reservation's state, folded from its stream, and the stream's version.
pub async fn reservation(tx: &mut Tx, id: &ReservationId) -> AppResult<Option<Reservation>> {
    let recorded = events::read_stream(tx, id.as_str(), 0, 10_000).await?;
    let mut decoded = Vec::with_capacity(recorded.len());
    for event in &recorded {
        decoded.push(ReservationEvent::decode(&event.event_type, event.schema_version, &event.payload)?);
    }
    Ok(reservation::fold(&decoded))
}

/// A pool as the fold of its stream, with the stream's version (`None`: no such pool).
pub async fn pool_aggregate(tx: &mut Tx, pool_id: &PoolId) -> AppResult<Option<(bc_domain::pool::Pool, u32)>> {
    let recorded = events::read_stream(tx, pool_id.as_str(), 0, 100_000).await?;
    let mut decoded = Vec::with_capacity(recorded.len());
    for event in &recorded {
        decoded.push(PoolEvent::decode(&event.event_type, event.schema_version, &event.payload)?);
    }
    let version = recorded.last().map_or(0, |e| e.stream_version);
    Ok(bc_domain::pool::fold(&decoded).map(|pool| (pool, version)))
}

/// A stream folded through `evolve`, with its version (`None`: no such stream, or one `evolve` never starts).
async fn folded_stream<E: DomainEvent, S>(
    tx: &mut Tx,
    stream_id: &str,
    evolve: fn(Option<S>, &E) -> Option<S>,
) -> AppResult<Option<(S, u32)>> {
    // Page by page to the stream's end: a stream longer than one page (a long-lived node, a workflow of many
    // retried steps) is folded whole, and its version is its real head.
    const PAGE: u32 = 1_000;
    let mut state = None;
    let mut version = 0;
    loop {
        let recorded = events::read_stream(tx, stream_id, version, PAGE).await?;
        for event in &recorded {
            state = evolve(state, &E::decode(&event.event_type, event.schema_version, &event.payload)?);
        }
        version = recorded.last().map_or(version, |e| e.stream_version);
        if recorded.len() < PAGE as usize {
            return Ok(state.map(|state| (state, version)));
        }
    }
}

/// An image as the fold of its stream, with the stream's version.
pub async fn image_aggregate(
    tx: &mut Tx,
    id: &bc_domain::id::ImageId,
) -> AppResult<Option<(bc_domain::image::Image, u32)>> {
    folded_stream(tx, id.as_str(), bc_domain::image::evolve_image).await
}

/// A profile version as the fold of its stream, with the stream's version.
pub async fn profile_aggregate(
    tx: &mut Tx,
    id: &bc_domain::id::ProfileId,
) -> AppResult<Option<(bc_domain::profile::Profile, u32)>> {
    folded_stream(tx, id.as_str(), bc_domain::profile::evolve_profile).await
}

/// A flavor as the fold of its stream, with the stream's version.
pub async fn flavor_aggregate(
    tx: &mut Tx,
    id: &bc_domain::id::FlavorId,
) -> AppResult<Option<(bc_domain::flavor::Flavor, u32)>> {
    folded_stream(tx, id.as_str(), bc_domain::flavor::evolve_flavor).await
}

/// An instance as the fold of its stream, with the stream's version.
pub async fn instance_aggregate(
    tx: &mut Tx,
    id: &bc_domain::id::InstanceId,
) -> AppResult<Option<(bc_domain::instance::Instance, u32)>> {
    folded_stream(tx, id.as_str(), bc_domain::instance::evolve_instance).await
}

/// A provider account as the fold of its stream, with the stream's version.
pub async fn provider_account_aggregate(
    tx: &mut Tx,
    id: &bc_domain::id::ProviderAccountId,
) -> AppResult<Option<(bc_domain::provider::ProviderAccount, u32)>> {
    folded_stream(tx, id.as_str(), bc_domain::provider::evolve_provider_account).await
}

/// A webhook subscription as the fold of its stream, with the stream's version.
pub async fn webhook_aggregate(
    tx: &mut Tx,
    id: &bc_domain::id::WebhookId,
) -> AppResult<Option<(bc_domain::webhook::Webhook, u32)>> {
    folded_stream(tx, id.as_str(), bc_domain::webhook::evolve_webhook).await
}

/// A workflow as the fold of its stream, with the stream's version.
pub async fn workflow_aggregate(
    tx: &mut Tx,
    id: &bc_domain::id::WorkflowId,
) -> AppResult<Option<(bc_domain::workflow::Workflow, u32)>> {
    folded_stream(tx, id.as_str(), bc_domain::workflow::evolve_workflow).await
}

/// A node as the fold of its stream, with the stream's version.
pub async fn node_aggregate(tx: &mut Tx, id: &NodeId) -> AppResult<Option<(bc_domain::node::Node, u32)>> {
    folded_stream(tx, id.as_str(), bc_domain::node::evolve).await
}

/// The tenant that owns a pool.
pub async fn pool_owner(tx: &mut Tx, pool_id: &PoolId) -> AppResult<TenantId> {
    let owner: String = sql::query_scalar("SELECT owner_tenant_id FROM pools WHERE id = $1")
        .bind(pool_id.as_str())
        .fetch_one(tx.conn())
        .await?;
    owner.parse().map_err(|err| corrupt("pools.owner_tenant_id", err))
}

/// A join token as the fold of its stream, with the stream's version.
pub async fn join_token_aggregate(
    tx: &mut Tx,
    id: &bc_domain::id::JoinTokenId,
) -> AppResult<Option<(bc_domain::pool::JoinToken, u32)>> {
    folded_stream(tx, id.as_str(), bc_domain::pool::evolve_join_token).await
}

/// A project as the fold of its stream, with the stream's version.
pub async fn project_aggregate(
    tx: &mut Tx,
    id: &bc_domain::id::ProjectId,
) -> AppResult<Option<(bc_domain::site::Project, u32)>> {
    folded_stream(tx, id.as_str(), bc_domain::site::evolve_project).await
}

/// A site as the fold of its stream, with the stream's version.
pub async fn site_aggregate(
    tx: &mut Tx,
    id: &bc_domain::id::SiteId,
) -> AppResult<Option<(bc_domain::site::Site, u32)>> {
    folded_stream(tx, id.as_str(), bc_domain::site::evolve_site).await
}

/// How many pools a site holds.
pub async fn site_pool_count(tx: &mut Tx, id: &bc_domain::id::SiteId) -> AppResult<i64> {
    Ok(sql::query_scalar("SELECT count(*) FROM pools WHERE site_id = $1")
        .bind(id.as_str())
        .fetch_one(tx.conn())
        .await?)
}

/// How many nodes a pool has.
pub async fn pool_node_count(tx: &mut Tx, pool_id: &PoolId) -> AppResult<i64> {
    Ok(sql::query_scalar("SELECT count(*) FROM nodes WHERE pool_id = $1")
        .bind(pool_id.as_str())
        .fetch_one(tx.conn())
        .await?)
}

/// How many reservations in a pool have not ended.
pub async fn live_reservations_of_pool(tx: &mut Tx, pool_id: &PoolId) -> AppResult<i64> {
    Ok(sql::query_scalar(
        "SELECT count(*) FROM reservations
         WHERE pool_id = $1 AND state NOT IN ('released', 'failed', 'cancelled', 'expired', 'denied')",
    )
    .bind(pool_id.as_str())
    .fetch_one(tx.conn())
    .await?)
}

/// How many reservations of a project have not ended.
pub async fn live_reservations_of_project(tx: &mut Tx, id: &bc_domain::id::ProjectId) -> AppResult<i64> {
    Ok(sql::query_scalar(
        "SELECT count(*) FROM reservations
         WHERE project_id = $1 AND state NOT IN ('released', 'failed', 'cancelled', 'expired', 'denied')",
    )
    .bind(id.as_str())
    .fetch_one(tx.conn())
    .await?)
}

/// A project row: id, name, created at (epoch ms).
pub type ProjectRow = (String, String, i64);

/// A tenant's projects by id after `after`, at most `limit`.
pub async fn projects(tx: &mut Tx, tenant: &TenantId, after: Option<&str>, limit: i64) -> AppResult<Vec<ProjectRow>> {
    Ok(sql::query_as(
        "SELECT id, name, ts_ms(created_at) FROM projects
         WHERE tenant_id = $1 AND ($2::text IS NULL OR id > $2) ORDER BY id LIMIT $3",
    )
    .bind(tenant.as_str())
    .bind(after)
    .bind(limit)
    .fetch_all(tx.conn())
    .await?)
}

/// The selector's SQL parameters: gpuModel, gpuProduct, and the attributes as a JSON object.
/// PostgreSQL refuses a NUL in text and in `jsonb`: a selector holding one is bad input, named here, before any query
/// reads with it.
pub fn selector_params(request: &DeviceRequest) -> AppResult<(Option<&str>, Option<&str>, String)> {
    bc_domain::device::check_no_nul("devices.selector", &request.selector)?;
    let attributes = serde_json::to_string(&request.selector.attributes).map_err(|err| corrupt("selector", err))?;
    Ok((request.selector.gpu_model.as_deref(), request.selector.gpu_product.as_deref(), attributes))
}

/// How many fitting nodes the summary's placement read returns for a request of `nodes` nodes that may draw from
/// `spread` more: enough to plan again around the atoms concurrent commands hold, few enough that the read stops
/// early. Each node read costs its atoms' rows: with sixteen clients reserving one GPU, a first try reading six
/// nodes instead of ten cut the server's CPU for the reserve's facts by up to a sixth, without more retries (four
/// tripled them: a lost race found too few nodes left to plan around).
pub fn summary_limit(nodes: u32, spread: usize) -> i64 {
    let wanted = i64::from(nodes).saturating_add(spread.min(1024) as i64);
    (wanted * 2 + 4).min(CANDIDATE_LIMIT.max(i64::from(nodes) * 4))
}

/// Nodes of the pool whose atoms hold one node's share of the request from `start` on, read from the free-capacity
/// summary best fit first (the fewest atoms without a live booking) and stopping at the first ones that fit: its
/// cost follows the request, not the pool. An atom counts as free when none of its live bookings reaches past
/// `start`; atoms booked only after a window are not found this way (ask [`candidates`] when these do not fit).
pub async fn summary_candidates(
    tx: &mut Tx,
    pool_id: &PoolId,
    request: &DeviceRequest,
    start_ms: i64,
    spread: usize,
) -> AppResult<Vec<NodeCandidate>> {
    let (model, product, attributes) = selector_params(request)?;
    let rows = sql::query("SELECT node_id, free FROM summary_candidates($1, $2, $3, $4, $5::jsonb, $6, $7, $8)")
        .bind(pool_id.as_str())
        .bind(request.class.as_str())
        .bind(model)
        .bind(product)
        .bind(&attributes)
        .bind(start_ms)
        .bind(request.per_node() as i32)
        .bind(summary_limit(request.nodes(), spread))
        .fetch_all(tx.conn())
        .await?;
    node_candidates(&rows)
}

fn node_candidates(rows: &[sqlx::postgres::PgRow]) -> AppResult<Vec<NodeCandidate>> {
    rows.iter()
        .map(|row| {
            let node: String = row.try_get("node_id")?;
            let free: Vec<String> = row.try_get("free")?;
            Ok(NodeCandidate {
                node_id: node.parse().map_err(|err| corrupt("devices.node_id", err))?,
                free_atoms: free
                    .into_iter()
                    .map(|id| id.parse().map_err(|err| corrupt("devices.id", err)))
                    .collect::<AppResult<_>>()?,
            })
        })
        .collect()
}

/// How many fitting nodes the exact placement query returns for a request of `nodes` nodes.
pub fn exact_limit(nodes: u32) -> i64 {
    CANDIDATE_LIMIT.max(i64::from(nodes) * 4)
}

/// How many fitting nodes the placement query returns at most: placement ranks them best fit first, so the
/// ones it would never reach are not worth reading.
const CANDIDATE_LIMIT: i64 = 64;

/// Schedulable nodes of the pool with at least one node's share of atoms that match the request and are free
/// over `[start, end)`, at most [`CANDIDATE_LIMIT`] of them (or four per node of a gang): those the `node_fit` hint
/// names, tightest fit in time first, when it names enough; otherwise best fit first (the fewest free atoms). A read
/// stops at the first of its steps that names what a placement drawing from the best `spread` more nodes than it
/// needs asks of the summary ([`summary_limit`]), or a quarter of its limit when that is fewer.
pub async fn candidates(
    tx: &mut Tx,
    pool_id: &PoolId,
    request: &DeviceRequest,
    (start_ms, end_ms): (i64, i64),
    spread: usize,
) -> AppResult<Vec<NodeCandidate>> {
    let enough = summary_limit(request.nodes(), spread);
    candidates_up_to(tx, pool_id, request, (start_ms, end_ms), exact_limit(request.nodes()), Some(enough)).await
}

/// [`candidates`], at most `limit` of them, each step's answer standing once it names `enough` nodes (a quarter of
/// the limit when `None`, or when that is fewer).
async fn candidates_up_to(
    tx: &mut Tx,
    pool_id: &PoolId,
    request: &DeviceRequest,
    (start_ms, end_ms): (i64, i64),
    limit: i64,
    enough: Option<i64>,
) -> AppResult<Vec<NodeCandidate>> {
    let (model, product, attributes) = selector_params(request)?;
    let rows = sql::query("SELECT node_id, free FROM exact_candidates($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9, $10)")
        .bind(pool_id.as_str())
        .bind(request.class.as_str())
        .bind(model)
        .bind(product)
        .bind(&attributes)
        .bind(start_ms)
        .bind(end_ms)
        .bind(request.per_node() as i32)
        .bind(limit)
        .bind(enough.unwrap_or(limit / 4))
        .fetch_all(tx.conn())
        .await?;
    node_candidates(&rows)
}

/// Every atom of the pool's `class` free over the whole of `[start, end)` on a schedulable node, by node in id
/// order: the availability listing, which must not stop at the first fits as placement does.
pub async fn all_free_atoms(
    tx: &mut Tx,
    pool_id: &PoolId,
    class: &str,
    start_ms: i64,
    end_ms: i64,
) -> AppResult<Vec<NodeCandidate>> {
    let rows = sql::query(
        "SELECT g.node_id, array_agg(g.device_id ORDER BY g.device_id) AS free
         FROM free_atoms_over($1, $2, ms_ts($3), ms_ts($4), NULL) AS g
         JOIN nodes AS n ON n.id = g.node_id
         WHERE n.pool_id = $1 AND n.schedulable
         GROUP BY g.node_id
         ORDER BY g.node_id",
    )
    .bind(pool_id.as_str())
    .bind(class)
    .bind(start_ms)
    .bind(end_ms)
    .fetch_all(tx.conn())
    .await?;
    node_candidates(&rows)
}

/// How many nodes of the pool (schedulable now or not) have enough matching atoms to ever hold one node's
/// share of the request.
pub async fn nodes_that_could_hold(tx: &mut Tx, pool_id: &PoolId, request: &DeviceRequest) -> AppResult<i64> {
    let (model, product, attributes) = selector_params(request)?;
    Ok(sql::query_scalar("SELECT pool_holders($1, $2, $3, $4, $5::jsonb, $6)")
        .bind(pool_id.as_str())
        .bind(request.class.as_str())
        .bind(model)
        .bind(product)
        .bind(&attributes)
        .bind(request.per_node() as i32)
        .fetch_one(tx.conn())
        .await?)
}

/// How a placement locks the atoms it chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomLock {
    /// Skips atoms a concurrent command holds, so the caller can choose others instead of waiting on a race it
    /// would lose.
    SkipHeld,
    /// Waits for them (and, under this transaction's snapshot, fails with a serialization failure when the holder
    /// commits).
    Wait,
}

/// What locking a placement's choice found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chosen {
    /// A chosen node is no longer schedulable.
    NodeGone,
    /// Every chosen node is schedulable; these chosen atoms are now locked by this transaction (all of them unless
    /// some were skipped).
    Locked(Vec<String>),
}

/// Re-reads the chosen nodes `FOR SHARE`, so a concurrent cordon or delete cannot slip between the choice and
/// the booking, and then locks the chosen atoms `FOR UPDATE`, in the lock order and in one statement: a command
/// racing for the same atoms learns it here, before it writes anything. Under the command's repeatable-read
/// snapshot, an atom that another command booked and committed since the snapshot refuses the lock with a
/// serialization failure (retried with a fresh snapshot).
pub async fn lock_chosen(tx: &mut Tx, nodes: &[&str], atoms: &[&str], how: AtomLock) -> AppResult<Chosen> {
    let answer = tx.call(&lock_chosen_call(nodes, atoms, how)).await?;
    chosen(nodes, answer)
}

/// [`lock_chosen`] as a server-side call.
pub fn lock_chosen_call(nodes: &[&str], atoms: &[&str], how: AtomLock) -> sql::Call {
    sql::Call::new("lock_chosen").texts(nodes).texts(atoms).boolean(how == AtomLock::SkipHeld)
}

/// The lock of a placement's chosen atoms that goes ahead of its events, with its COMMIT
/// (`lock_chosen_or_refuse`, `capacity/0029`): it raises [`CHOSEN_TAKEN`] when a chosen node is no longer
/// schedulable or an atom could not be locked, so that nothing after it is written.
pub fn lock_chosen_with_commit_call(nodes: &[&str], atoms: &[&str]) -> sql::Call {
    sql::Call::new("lock_chosen_or_refuse").texts(nodes).texts(atoms)
}

/// What `lock_chosen_or_refuse` raises when its atoms were taken.
const CHOSEN_TAKEN: &str = "BC423";

/// Whether `err` is [`lock_chosen_with_commit_call`]'s refusal.
pub fn chosen_taken(err: &AppError) -> bool {
    matches!(err, AppError::Store(err) if err.sql_state().as_deref() == Some(CHOSEN_TAKEN))
}

/// Reads what `lock_chosen` answered for `nodes`.
pub fn chosen(nodes: &[&str], answer: Option<String>) -> AppResult<Chosen> {
    #[derive(serde::Deserialize)]
    struct Answer {
        schedulable: i64,
        locked: Vec<String>,
    }
    let answer: Answer =
        serde_json::from_str(answer.as_deref().unwrap_or("null")).map_err(|err| corrupt("lock_chosen", err))?;
    if answer.schedulable != nodes.len() as i64 {
        return Ok(Chosen::NodeGone);
    }
    Ok(Chosen::Locked(answer.locked))
}

/// Creates the tenant's quota row for (pool, resource) if needed and updates it: first in the lock order, it
/// serializes quota checks of one tenant in one pool. An update rather than `FOR UPDATE`, because this
/// repeatable-read transaction's snapshot predates the lock: after waiting for a concurrent check that
/// committed, only an updated row makes PostgreSQL refuse the stale snapshot (40001, and the command is retried
/// with a fresh one that sees the other check's bookings).
pub async fn lock_quota(tx: &mut Tx, tenant: &TenantId, pool_id: &PoolId, resource: &str) -> AppResult<()> {
    // One statement (in `lock_quota`): at repeatable read, an upsert that meets a row another transaction updated
    // (or inserted) since this snapshot is refused (40001) exactly as the UPDATE alone would be.
    sql::query("SELECT lock_quota($1, $2, $3)")
        .bind(tenant.as_str())
        .bind(pool_id.as_str())
        .bind(resource)
        .execute(tx.conn())
        .await?;
    Ok(())
}

/// The most atoms of `resource` the tenant holds in the pool at any instant of `[start, end)`: a sweep over
/// its bookings (each row is one atom), where a booking ending at an instant does not overlap one starting at it.
pub async fn peak_usage(
    tx: &mut Tx,
    tenant: &TenantId,
    pool_id: &PoolId,
    resource: &str,
    start_ms: i64,
    end_ms: i64,
) -> AppResult<i64> {
    Ok(sql::query_scalar("SELECT tenant_peak($1, $2, $3, $4, $5)")
        .bind(tenant.as_str())
        .bind(pool_id.as_str())
        .bind(resource)
        .bind(start_ms)
        .bind(end_ms)
        .fetch_one(tx.conn())
        .await?)
}

pub async fn pending_count(tx: &mut Tx, pool_id: &PoolId) -> AppResult<i64> {
    Ok(sql::query_scalar("SELECT count(*) FROM reservations WHERE pool_id = $1 AND state = 'pending'")
        .bind(pool_id.as_str())
        .fetch_one(tx.conn())
        .await?)
}

/// The pool's pending reservations in the order they are retried: offering priority, then first come.
pub async fn pending_in_order(tx: &mut Tx, pool_id: &PoolId, limit: i64) -> AppResult<Vec<ReservationId>> {
    let ids: Vec<String> = sql::query_scalar(
        "SELECT id FROM reservations WHERE pool_id = $1 AND state = 'pending'
         ORDER BY priority DESC, requested_at, id LIMIT $2",
    )
    .bind(pool_id.as_str())
    .bind(limit)
    .fetch_all(tx.conn())
    .await?;
    ids.into_iter().map(|id| id.parse().map_err(|err| corrupt("reservations.id", err))).collect()
}

/// The nodes among `nodes` that are draining, in id order.
pub async fn draining_nodes(tx: &mut Tx, nodes: &[&str]) -> AppResult<Vec<NodeId>> {
    let ids: Vec<String> = sql::query_scalar("SELECT id FROM nodes WHERE id = ANY($1) AND draining ORDER BY id")
        .bind(nodes)
        .fetch_all(tx.conn())
        .await?;
    ids.into_iter().map(|id| id.parse().map_err(|err| corrupt("nodes.id", err))).collect()
}

/// The other pending-wake keys of a pool queued now (committed before this read).
pub async fn queued_pending_wakes(tx: &mut Tx, pool_id: &PoolId, except: &str) -> AppResult<Vec<String>> {
    let prefix = crate::work::WorkKey::pending_prefix(pool_id);
    Ok(sql::query_scalar("SELECT key FROM work_queue WHERE starts_with(key, $1) AND key <> $2 ORDER BY key LIMIT 1000")
        .bind(prefix)
        .bind(except)
        .fetch_all(tx.conn())
        .await?)
}

/// Removes wakes a finished pass covered, unless another worker claimed one meanwhile.
pub async fn drop_unclaimed_wakes(tx: &mut Tx, keys: &[String]) -> AppResult<()> {
    if keys.is_empty() {
        return Ok(());
    }
    sql::query("DELETE FROM work_queue WHERE key = ANY($1) AND claimed_until IS NULL")
        .bind(keys)
        .execute(tx.conn())
        .await?;
    Ok(())
}

/// The distinct ends of the pool's bookings after `after_ms` and up to `until_ms`, rounded up to the second, in
/// order, at most `limit`: the moments at which a request that does not fit now might start. Each end is one probe
/// of the (pool_id, upper(during)) index for the first end past the one before, so the cost grows with `limit`, not
/// with the pool's bookings.
pub async fn booking_ends(
    tx: &mut Tx,
    pool_id: &PoolId,
    after_ms: i64,
    until_ms: i64,
    limit: i64,
) -> AppResult<Vec<i64>> {
    Ok(sql::query_scalar(
        "WITH RECURSIVE ends (at, n) AS (
             SELECT (SELECT ((ts_ms(min(upper(during))) + 999) / 1000) * 1000 FROM device_bookings
                     WHERE pool_id = $1 AND live AND upper(during) > ms_ts($2)), 1
             UNION ALL
             SELECT (SELECT ((ts_ms(min(upper(during))) + 999) / 1000) * 1000 FROM device_bookings
                     WHERE pool_id = $1 AND live AND upper(during) > ms_ts(e.at)), e.n + 1
             FROM ends AS e
             WHERE e.at IS NOT NULL AND e.at <= $3 AND e.n < $4
         )
         SELECT at FROM ends WHERE at IS NOT NULL AND at <= $3 ORDER BY at",
    )
    .bind(pool_id.as_str())
    .bind(after_ms)
    .bind(until_ms)
    .bind(limit)
    .fetch_all(tx.conn())
    .await?)
}
