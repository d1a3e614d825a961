//! The figures a scrape reads: from the runtime tables the log's sequence, the horizon, the work queue and the
//! leases; and the fleet's, per pool, from the capacity rollup, the inline `nodes` table, the agents' sessions and
//! the GPU-hour ledger.

use bc_eventstore::{Tx, lease, sql};
use bc_projections::{framework, models};
use sqlx::{AssertSqlSafe, Row as _};

/// The runtime tables' figures, read in one snapshot: the log, the horizon, the work queue, the leases.
#[derive(Debug, Clone, PartialEq)]
pub struct LogFigures {
    /// Events appended to the log by every process (its sequence).
    pub appended: i64,
    /// Age of the oldest writing transaction, which holds the log's read horizon back (0: none).
    pub horizon_age_seconds: f64,
    /// Transaction ids between the horizon and the next one to be assigned.
    pub horizon_xids: i64,
    pub queue_depth: i64,
    pub queue_due: i64,
    pub queue_claimed: i64,
    pub queue_oldest_due_seconds: f64,
    /// (kind, held by this process, count).
    pub leases: Vec<(String, bool, i64)>,
}

/// Reads them in the caller's transaction (one snapshot).
pub async fn log_figures(tx: &mut Tx) -> bc_eventstore::Result<LogFigures> {
    // The log's sequence counts every event ever appended (and the few a rolled-back append used).
    let appended: i64 =
        sql::query_scalar("SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('events', 'seq')), 0)")
            .fetch_one(tx.conn())
            .await?;
    // Transactions with an id of their own (they wrote, or will) hold the log's read horizon back until they
    // end: how old the oldest is, by the database server's own clock, which `xact_start` is on.
    let horizon = sql::query(
        "SELECT coalesce(extract(epoch FROM compute_db_clock() - min(xact_start)), 0)::float8 AS age,
                (pg_snapshot_xmax(pg_current_snapshot())::text::numeric
                 - pg_snapshot_xmin(pg_current_snapshot())::text::numeric)::int8 AS xids
         FROM pg_stat_activity
         WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()",
    )
    .fetch_one(tx.conn())
    .await?;
    let queue = sql::query(
        "SELECT count(*) AS depth,
                count(*) FILTER (WHERE not_before <= compute_now()) AS due,
                count(*) FILTER (WHERE claimed_until > compute_now()) AS claimed,
                coalesce(extract(epoch FROM compute_now() - min(not_before) FILTER (WHERE not_before <= compute_now())), 0)::float8
                    AS oldest_due
         FROM work_queue",
    )
    .fetch_one(tx.conn())
    .await?;
    let leases: Vec<(String, bool, i64)> = sql::query_as(
        "SELECT split_part(name, ':', 1) AS kind, owner = $1 AS mine, count(*)
         FROM leases WHERE expires_at > compute_now() GROUP BY 1, 2 ORDER BY 1, 2",
    )
    .bind(lease::process_owner_id())
    .fetch_all(tx.conn())
    .await?;
    Ok(LogFigures {
        appended,
        horizon_age_seconds: horizon.try_get("age")?,
        horizon_xids: horizon.try_get("xids")?,
        queue_depth: queue.try_get("depth")?,
        queue_due: queue.try_get("due")?,
        queue_claimed: queue.try_get("claimed")?,
        queue_oldest_due_seconds: queue.try_get("oldest_due")?,
        leases,
    })
}

/// One pool's atoms of one resource, from the `pool_capacity_rollup` read model (it trails the log by that
/// projection's lag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolCapacity {
    pub pool_id: String,
    pub resource: String,
    /// Every bookable atom on the pool's nodes, schedulable or not.
    pub atoms: i64,
    /// Atoms on schedulable nodes.
    pub allocatable: i64,
    /// Atoms held by reservations binding, active or releasing: in use now.
    pub allocated: i64,
    /// Atoms of reservations placed and not yet started.
    pub reserved: i64,
    /// Allocatable atoms not allocated.
    pub available: i64,
}

/// How many of a pool's nodes are in one combination of the states an operator watches (inline `nodes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStates {
    pub pool_id: String,
    pub connectivity: String,
    pub provision_state: String,
    pub schedulable: bool,
    pub nodes: i64,
}

/// A pool's agent sessions: their leases and how fresh their heartbeats are.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolSessions {
    pub pool_id: String,
    /// Sessions whose liveness lease has not run out.
    pub live: i64,
    /// Sessions whose lease ran out: their node is no longer connected, or will not be after the next sweep.
    pub expired: i64,
    /// How long ago the live session heard from least recently had its last heartbeat (0: no live session).
    pub oldest_heartbeat_age_seconds: f64,
}

/// One pool's GPU-hour ledger over one hour (the `ledger` read model, summed over its tenants), in
/// atom-milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerHourFigures {
    pub pool_id: String,
    /// `current` (the hour now running, as booked so far, its later minutes included) or `last` (the hour before).
    pub hour: &'static str,
    pub capacity: i64,
    pub booked: i64,
    /// The part of `booked` its reservations were active.
    pub bound: i64,
}

/// The fleet's figures: capacity, nodes by state, agents' sessions and the ledger's last and current hours, each a
/// bounded number of rows per pool.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FleetFigures {
    pub capacity: Vec<PoolCapacity>,
    pub nodes: Vec<NodeStates>,
    pub sessions: Vec<PoolSessions>,
    pub ledger: Vec<LedgerHourFigures>,
}

/// Reads them in the caller's transaction (one snapshot). Each is one aggregate: the rollup's rows (one per pool
/// and resource) beside its node rows summed per pool, the inline nodes grouped by state, and the sessions joined
/// to their nodes' pools, grouped by pool.
pub async fn fleet_figures(tx: &mut Tx) -> bc_eventstore::Result<FleetFigures> {
    // Before the projection first ran nothing is active: the newest version's tables (empty until then) are read.
    let newest = models::read_models()
        .iter()
        .filter(|m| m.name() == "pool_capacity_rollup")
        .map(|m| m.version())
        .max()
        .unwrap_or(1);
    let version = framework::active_version(tx, "pool_capacity_rollup").await?.unwrap_or(newest);
    // The table names come from the version number alone, never from input.
    let query = format!(
        "SELECT coalesce(r.pool_id, n.pool_id) AS pool_id, coalesce(r.resource, n.resource) AS resource,
                coalesce(n.atoms, 0)::int8 AS atoms, coalesce(r.allocatable, 0)::int8 AS allocatable,
                coalesce(r.allocated, 0)::int8 AS allocated, coalesce(r.reserved, 0)::int8 AS reserved,
                coalesce(r.available, 0)::int8 AS available
         FROM pool_capacity_rollup_v{version} AS r
         FULL JOIN (SELECT pool_id, resource, sum(atoms) AS atoms FROM pool_capacity_nodes_v{version}
                    GROUP BY pool_id, resource) AS n
             ON n.pool_id = r.pool_id AND n.resource = r.resource
         ORDER BY 1, 2"
    );
    let rows = sqlx::query(AssertSqlSafe(query)).persistent(false).fetch_all(tx.conn()).await?;
    let mut capacity = Vec::with_capacity(rows.len());
    for row in rows {
        capacity.push(PoolCapacity {
            pool_id: row.try_get("pool_id")?,
            resource: row.try_get("resource")?,
            atoms: row.try_get("atoms")?,
            allocatable: row.try_get("allocatable")?,
            allocated: row.try_get("allocated")?,
            reserved: row.try_get("reserved")?,
            available: row.try_get("available")?,
        });
    }
    let rows = sql::query(
        "SELECT pool_id, connectivity, provision_state, schedulable, count(*) AS nodes
         FROM nodes GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4",
    )
    .fetch_all(tx.conn())
    .await?;
    let mut nodes = Vec::with_capacity(rows.len());
    for row in rows {
        nodes.push(NodeStates {
            pool_id: row.try_get("pool_id")?,
            connectivity: row.try_get("connectivity")?,
            provision_state: row.try_get("provision_state")?,
            schedulable: row.try_get("schedulable")?,
            nodes: row.try_get("nodes")?,
        });
    }
    let rows = sql::query(
        "SELECT n.pool_id,
                count(*) FILTER (WHERE s.expires_at > compute_now()) AS live,
                count(*) FILTER (WHERE s.expires_at <= compute_now()) AS expired,
                greatest(coalesce(extract(epoch FROM compute_now()
                                          - min(s.heartbeat_at) FILTER (WHERE s.expires_at > compute_now())), 0), 0)::float8
                    AS oldest
         FROM agent_sessions AS s JOIN nodes AS n ON n.id = s.node_id
         GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(tx.conn())
    .await?;
    let mut sessions = Vec::with_capacity(rows.len());
    for row in rows {
        sessions.push(PoolSessions {
            pool_id: row.try_get("pool_id")?,
            live: row.try_get("live")?,
            expired: row.try_get("expired")?,
            oldest_heartbeat_age_seconds: row.try_get("oldest")?,
        });
    }
    let ledger = ledger_figures(tx).await?;
    Ok(FleetFigures { capacity, nodes, sessions, ledger })
}

/// Every pool's ledger over the last complete hour and the current one.
async fn ledger_figures(tx: &mut Tx) -> bc_eventstore::Result<Vec<LedgerHourFigures>> {
    use models::ledger::{self, HOUR_MS, LedgerQuery, Scope};
    let newest = models::read_models().iter().filter(|m| m.name() == "ledger").map(|m| m.version()).max().unwrap_or(1);
    let version = framework::active_version(tx, "ledger").await?.unwrap_or(newest);
    let current = bc_eventstore::clock::compute_now_ms(tx).await?.div_euclid(HOUR_MS) * HOUR_MS;
    let query =
        LedgerQuery { from_ms: current - HOUR_MS, to_ms: current + HOUR_MS, pool_id: None, scope: &Scope::Fleet };
    let hours = ledger::read(tx, version, &query).await?;
    Ok(ledger::pool_totals(&hours)
        .into_iter()
        .map(|((pool_id, hour_ms), (capacity, booked, bound))| LedgerHourFigures {
            pool_id,
            hour: if hour_ms == current { "current" } else { "last" },
            capacity,
            booked,
            bound,
        })
        .collect())
}
