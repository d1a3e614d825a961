//! Scalar resources: what nodes report (`node_resources`) and what allocations hold of it (`scalar_bookings`),
//! read and locked for placement (`capacity/0019_scalar_resources`).

use std::collections::BTreeMap;

use bc_domain::id::{NodeId, PoolId, ReservationId, TenantId};
use bc_domain::placement::{NodeCandidate, ScalarHeld};
use bc_domain::reservation::DeviceRequest;
use bc_eventstore::{Tx, sql};
use sqlx::Row as _;

use super::corrupt;
use crate::AppResult;

/// Schedulable nodes of the pool with one node's share of atoms free over `[start, end)`: at most about `limit` of
/// them, or every one when `limit` is `None`. Scalars rule out nodes the atoms alone would not, so a placement that
/// finds no fit among the first ones reads them all before it gives up.
pub async fn atom_candidates(
    tx: &mut Tx,
    pool_id: &PoolId,
    request: &DeviceRequest,
    start_ms: i64,
    end_ms: i64,
    limit: Option<i64>,
) -> AppResult<Vec<NodeCandidate>> {
    let limit = limit.unwrap_or(i64::from(i32::MAX));
    super::candidates_up_to(tx, pool_id, request, (start_ms, end_ms), limit, None).await
}

/// The limit of a scalar placement's first read: four times what the summary offers a request without scalars,
/// since the exact read answers with a quarter of its limit when the `node_fit` hint names that many.
pub fn first_read_limit(nodes: u32, spread: usize) -> i64 {
    super::summary_limit(nodes, spread).saturating_mul(4)
}

/// Whether a read of at most `limit` candidates that answered `read` of them saw every fitting node. The hint
/// answers exactly a quarter of the limit (at least one); fewer can only come from the read of the gaps, which
/// answers every fitting node when they are fewer than its limit.
pub fn read_whole(read: usize, limit: i64) -> bool {
    i64::try_from(read).unwrap_or(i64::MAX) < (limit / 4).max(1)
}

/// What each of `nodes` reports of `resources`, and the most its bookings hold at any instant of `[start, end)`
/// (reservation `exclude`'s own left out, when it names one).
pub async fn node_peaks(
    tx: &mut Tx,
    nodes: &[&str],
    resources: &[&str],
    start_ms: i64,
    end_ms: i64,
    exclude: Option<&ReservationId>,
) -> AppResult<Vec<ScalarHeld>> {
    let rows = sql::query(
        "SELECT node_id, resource, capacity, peak FROM node_scalar_peaks($1::text[], $2::text[], $3, $4, $5)",
    )
    .bind(nodes)
    .bind(resources)
    .bind(start_ms)
    .bind(end_ms)
    .bind(exclude.map(ReservationId::as_str))
    .fetch_all(tx.conn())
    .await?;
    rows.iter()
        .map(|row| {
            let node_id: String = row.try_get("node_id")?;
            let capacity: i64 = row.try_get("capacity")?;
            Ok(ScalarHeld {
                node_id: node_id.parse().map_err(|err| corrupt("node_resources.node_id", err))?,
                resource: row.try_get("resource")?,
                capacity: u64::try_from(capacity).map_err(|err| corrupt("node_resources.capacity", err))?,
                peak: row.try_get("peak")?,
            })
        })
        .collect()
}

/// Locks the chosen nodes' rows of `resources` for update, and updates them, last in the lock order: a
/// concurrent placement on them that committed since this snapshot makes this transaction retry.
pub async fn lock_nodes(tx: &mut Tx, nodes: &[&str], resources: &[&str]) -> AppResult<()> {
    sql::query("SELECT lock_node_resources($1::text[], $2::text[])")
        .bind(nodes)
        .bind(resources)
        .execute(tx.conn())
        .await?;
    Ok(())
}

/// The most of `resource` the tenant's bookings in the pool hold at any instant of `[start, end)` (reservation
/// `exclude`'s own left out, when it names one).
pub async fn tenant_peak(
    tx: &mut Tx,
    tenant: &TenantId,
    pool_id: &PoolId,
    resource: &str,
    start_ms: i64,
    end_ms: i64,
    exclude: Option<&ReservationId>,
) -> AppResult<i64> {
    Ok(sql::query_scalar("SELECT tenant_scalar_peak($1, $2, $3, $4, $5, $6)")
        .bind(tenant.as_str())
        .bind(pool_id.as_str())
        .bind(resource)
        .bind(start_ms)
        .bind(end_ms)
        .bind(exclude.map(ReservationId::as_str))
        .fetch_one(tx.conn())
        .await?)
}

/// The pool's nodes that could ever hold one allocation's `amounts` once `ratios` (the pool's overcommit) multiply
/// what they report.
pub async fn nodes_that_could_hold(
    tx: &mut Tx,
    pool_id: &PoolId,
    amounts: &BTreeMap<String, u64>,
    ratios: &BTreeMap<String, f64>,
) -> AppResult<Vec<NodeId>> {
    let amounts = serde_json::to_string(amounts).map_err(|err| corrupt("scalar amounts", err))?;
    let ratios = serde_json::to_string(ratios).map_err(|err| corrupt("overcommit ratios", err))?;
    let ids: Vec<String> = sql::query_scalar("SELECT nodes_with_scalars($1, $2::jsonb, $3::jsonb)")
        .bind(pool_id.as_str())
        .bind(&amounts)
        .bind(&ratios)
        .fetch_one(tx.conn())
        .await?;
    ids.into_iter().map(|id| id.parse().map_err(|err| corrupt("nodes.id", err))).collect()
}

/// How many of `nodes` have enough atoms matching the request to ever hold one node's share of it (whatever is
/// booked now): with [`nodes_that_could_hold`], the nodes that could ever hold a request with scalars.
pub async fn atom_holders_among(
    tx: &mut Tx,
    pool_id: &PoolId,
    request: &DeviceRequest,
    nodes: &[NodeId],
) -> AppResult<i64> {
    let (model, product, attributes) = super::selector_params(request)?;
    let nodes: Vec<&str> = nodes.iter().map(NodeId::as_str).collect();
    Ok(sql::query_scalar(
        "SELECT count(*) FROM (
             SELECT d.node_id FROM devices AS d
             WHERE d.pool_id = $1 AND d.bookable AND d.class = $2
               AND ($3::text IS NULL OR d.gpu_model = $3) AND ($4::text IS NULL OR d.gpu_product = $4)
               AND ($5::jsonb = '{}'::jsonb OR d.attributes @> $5::jsonb)
               AND d.node_id = ANY ($7::text[])
             GROUP BY d.node_id
             HAVING count(*) >= $6
         ) AS holders",
    )
    .bind(pool_id.as_str())
    .bind(request.class.as_str())
    .bind(model)
    .bind(product)
    .bind(&attributes)
    .bind(request.per_node() as i64)
    .bind(&nodes)
    .fetch_one(tx.conn())
    .await?)
}
