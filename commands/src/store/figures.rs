//! The figures a scrape reads from the runtime tables: the log's sequence, the horizon, the work queue, the
//! leases.

use bc_eventstore::{Tx, lease, sql};
use sqlx::Row as _;

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
