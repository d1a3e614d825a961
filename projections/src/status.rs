//! What `better-compute projections status` shows: each projection version's state, position, and lag in events
//! and seconds behind the log.

use std::sync::Arc;

use bc_eventstore::{Access, Db, Isolation, Position, Result, TxOptions, sql};
use sqlx::Row as _;

use crate::framework::Projection;

/// One projection version's progress.
#[derive(Debug, Clone, PartialEq)]
pub struct VersionStatus {
    pub name: String,
    pub version: u32,
    /// `building`, `live`, `retired` (see `framework::VersionState`), or `not started` (no checkpoint yet).
    pub state: String,
    /// Whether reads use this version.
    pub active: bool,
    pub position: Position,
    pub events_applied: i64,
    /// Events in the log after its position.
    pub lag_events: i64,
    /// How long the oldest event it has not passed has been in the log (0 when it has passed every event): how
    /// stale its reads can be.
    pub lag_seconds: f64,
}

/// The status of every version this build knows, and every version with a checkpoint.
pub async fn status(db: &Db, projections: &[Arc<dyn Projection>]) -> Result<Vec<VersionStatus>> {
    // One snapshot for every figure: under read committed, a daemon committing between the statements made the
    // versions look further along than the log head they were compared with.
    let mut tx = db.begin(TxOptions { isolation: Isolation::RepeatableRead, access: Access::ReadOnly }).await?;
    let total: i64 = sql::query_scalar("SELECT count(*) FROM events").fetch_one(tx.conn()).await?;
    let now_ms: i64 = sql::query_scalar("SELECT ts_ms(compute_now())").fetch_one(tx.conn()).await?;
    let first_ms: Option<i64> =
        sql::query_scalar("SELECT ts_ms(recorded_at) FROM events ORDER BY log_epoch, txid, seq LIMIT 1")
            .fetch_optional(tx.conn())
            .await?;
    let rows = sql::query(
        "SELECT c.name, c.version, c.state, c.log_epoch, c.txid::text AS txid, c.seq, c.events_applied,
                (SELECT ts_ms(e.recorded_at) FROM events AS e
                 WHERE (e.log_epoch, e.txid, e.seq) > (c.log_epoch, c.txid, c.seq)
                 ORDER BY e.log_epoch, e.txid, e.seq LIMIT 1) AS oldest_unpassed_ms,
                (a.version = c.version) IS TRUE AS active,
                (SELECT count(*) FROM events AS e WHERE (e.log_epoch, e.txid, e.seq) > (c.log_epoch, c.txid, c.seq))
                    AS lag_events
         FROM projection_checkpoints AS c LEFT JOIN projection_active AS a ON a.name = c.name
         ORDER BY c.name, c.version",
    )
    .fetch_all(tx.conn())
    .await?;
    tx.commit().await?;
    let mut out: Vec<VersionStatus> = Vec::new();
    for row in &rows {
        let position = format!(
            "{}-{}-{}",
            row.try_get::<i32, _>("log_epoch")?,
            row.try_get::<String, _>("txid")?,
            row.try_get::<i64, _>("seq")?
        )
        .parse()
        .unwrap_or(Position::START);
        let oldest_unpassed: Option<i64> = row.try_get("oldest_unpassed_ms")?;
        let lag_events: i64 = row.try_get("lag_events")?;
        let lag_seconds = oldest_unpassed.map_or(0.0, |at| (now_ms - at).max(0) as f64 / 1000.0);
        out.push(VersionStatus {
            name: row.try_get("name")?,
            version: row.try_get::<i32, _>("version")? as u32,
            state: row.try_get("state")?,
            active: row.try_get("active")?,
            position,
            events_applied: row.try_get("events_applied")?,
            lag_events,
            lag_seconds,
        });
    }
    for projection in projections {
        if !out.iter().any(|s| s.name == projection.name() && s.version == projection.version()) {
            out.push(VersionStatus {
                name: projection.name().to_owned(),
                version: projection.version(),
                state: "not started".to_owned(),
                active: false,
                position: Position::START,
                events_applied: 0,
                lag_events: total,
                lag_seconds: first_ms.map_or(0.0, |at| (now_ms - at).max(0) as f64 / 1000.0),
            });
        }
    }
    Ok(out)
}
