//! The reads an explanation makes when a request does not fit now: each node of the pool as the request sees it,
//! and the tenant's holdings over the window (for the quota's busiest instant). Never on the path of a placement
//! that fits.

use bc_domain::id::{PoolId, ReservationId, TenantId};
use bc_domain::reservation::DeviceRequest;
use bc_domain::reservation::explanation::NodeLook;
use bc_eventstore::{Tx, sql};
use sqlx::Row as _;

use super::{corrupt, selector_params};
use crate::AppResult;

/// The most nodes one explanation reads: a pool larger than this is explained from its first nodes in id order.
pub const MAX_LOOKED_AT: i64 = 20_000;

/// Every node of the pool (up to [`MAX_LOOKED_AT`]) as `request` sees it over `[start, end)`: its failed
/// schedulability conditions, its atoms matching the request's class and selector, how many of them are free over
/// the window, and the bookings that overlap it on them.
pub async fn node_looks(
    tx: &mut Tx,
    pool_id: &PoolId,
    request: &DeviceRequest,
    start_ms: i64,
    end_ms: i64,
) -> AppResult<Vec<NodeLook>> {
    let (model, product, attributes) = selector_params(request)?;
    // The planner prices this read at the pool's size and could compile it (a tenth of a second or more) for a
    // read of milliseconds: not in this transaction. The atoms are grouped once and joined to the nodes by hash
    // (a join to per-node aggregates was planned as a loop over every node, twenty times slower).
    sql::query("SET LOCAL jit = off").execute(tx.conn()).await?;
    let rows = sql::query(
        "WITH atoms AS (
             SELECT d.node_id, d.id, count(b.device_id) AS overlapping, min(upper(b.during)) AS first_frees
             FROM devices AS d LEFT JOIN device_bookings AS b
                  ON b.device_id = d.id AND b.live AND b.during && tstzrange(ms_ts($6), ms_ts($7))
             WHERE d.pool_id = $1 AND d.bookable AND d.class = $2
               AND ($3::text IS NULL OR d.gpu_model = $3)
               AND ($4::text IS NULL OR d.gpu_product = $4)
               AND ($5::jsonb = '{}'::jsonb OR d.attributes @> $5::jsonb)
             GROUP BY d.node_id, d.id
         )
         SELECT n.id,
                n.schedulable,
                array_remove(ARRAY[
                    CASE WHEN n.provision_state NOT IN ('adopted', 'deployed')
                         THEN 'provisionState is ' || n.provision_state END,
                    CASE WHEN n.role <> 'host' THEN 'role is ' || n.role END,
                    CASE WHEN n.maintenance THEN 'in maintenance' END,
                    CASE WHEN n.cordoned THEN 'cordoned' END,
                    CASE WHEN n.draining THEN 'draining' END,
                    CASE WHEN n.connectivity <> 'connected' THEN 'connectivity is ' || n.connectivity END,
                    CASE WHEN cardinality(n.no_schedule_reasons) > 0
                         THEN 'noScheduleReasons: ' || array_to_string(n.no_schedule_reasons, ', ') END,
                    CASE WHEN n.observed_generation < 1 THEN 'its agent has not reported yet' END
                ], NULL) AS reasons,
                count(a.id) AS matching,
                count(a.id) FILTER (WHERE a.overlapping > 0) AS busy,
                coalesce(sum(a.overlapping), 0)::int8 AS overlapping,
                ts_ms(min(a.first_frees)) AS first_frees_ms
         FROM nodes AS n LEFT JOIN atoms AS a ON a.node_id = n.id
         WHERE n.pool_id = $1
         GROUP BY n.id
         ORDER BY n.id
         LIMIT $8",
    )
    .bind(pool_id.as_str())
    .bind(request.class.as_str())
    .bind(model)
    .bind(product)
    .bind(&attributes)
    .bind(start_ms)
    .bind(end_ms)
    .bind(MAX_LOOKED_AT)
    .fetch_all(tx.conn())
    .await?;
    rows.iter()
        .map(|row| {
            let id: String = row.try_get("id")?;
            let schedulable: bool = row.try_get("schedulable")?;
            let mut unschedulable: Vec<String> = row.try_get("reasons")?;
            if !schedulable && unschedulable.is_empty() {
                // The one condition not spelled out above: a node its trust keeps from this pool's owner.
                unschedulable.push("its trust does not let the pool's owner schedule on it".to_owned());
            }
            let matching: i64 = row.try_get("matching")?;
            let busy: i64 = row.try_get("busy")?;
            let overlapping: i64 = row.try_get("overlapping")?;
            let first_frees_ms: Option<i64> = row.try_get("first_frees_ms")?;
            Ok(NodeLook {
                node_id: id.parse().map_err(|err| corrupt("nodes.id", err))?,
                unschedulable,
                matching: count(matching),
                free: count(matching - busy),
                overlapping: count(overlapping),
                first_frees_at_ms: first_frees_ms,
            })
        })
        .collect()
}

fn count(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

/// The tenant's holdings of `resource` in the pool over `[start, end)`, clipped to it: one interval per booked
/// allocation window, with its atoms, and the quota claims of commands in flight other than `own`'s.
pub async fn holdings(
    tx: &mut Tx,
    own: &ReservationId,
    tenant: &TenantId,
    pool_id: &PoolId,
    resource: &str,
    start_ms: i64,
    end_ms: i64,
) -> AppResult<Vec<(i64, i64, i64)>> {
    let rows = sql::query(
        "SELECT ts_ms(greatest(lower(b.during), ms_ts($4))) AS from_ms,
                ts_ms(least(upper(b.during), ms_ts($5))) AS to_ms,
                count(*)::int8 AS atoms
         FROM device_bookings AS b
         WHERE b.tenant_id = $1 AND b.pool_id = $2 AND b.resource = $3 AND b.live
           AND b.during && tstzrange(ms_ts($4), ms_ts($5))
         GROUP BY b.allocation_id, b.during
         UNION ALL
         SELECT greatest(c.start_ms, $4), least(c.end_ms, $5), c.count::int8
         FROM quota_claims AS c
         WHERE c.tenant_id = $1 AND c.pool_id = $2 AND c.resource = $3 AND c.end_ms > $4 AND c.start_ms < $5
           AND c.reservation_id <> $6",
    )
    .bind(tenant.as_str())
    .bind(pool_id.as_str())
    .bind(resource)
    .bind(start_ms)
    .bind(end_ms)
    .bind(own.as_str())
    .fetch_all(tx.conn())
    .await?;
    rows.iter()
        .map(|row| Ok((row.try_get::<i64, _>("from_ms")?, row.try_get::<i64, _>("to_ms")?, row.try_get("atoms")?)))
        .collect()
}
