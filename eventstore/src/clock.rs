//! The one clock. SQL reads business time through `compute_now()`; tests and the simulator switch it to a
//! simulated clock that only moves forward. A process anchors its own notion of business time to the
//! database and re-samples it at each lease renewal.

use std::fmt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sqlx::Row;

use crate::db::{Db, Tx, TxOptions};
use crate::error::{Error, Result};
use crate::sql;

/// Skew between a process's clock and the database server's beyond which `ClockSkew` is raised.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(1);

/// Where `compute_now()` takes its time from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockMode {
    /// The database server's clock (production).
    System,
    /// The simulated clock in `compute_sim_clock`.
    Sim,
    /// `compute_now()` was redefined by someone else.
    Custom,
    /// There is no `compute_now()`: the database is not migrated.
    Missing,
}

impl fmt::Display for ClockMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClockMode::System => "system",
            ClockMode::Sim => "sim",
            ClockMode::Custom => "custom",
            ClockMode::Missing => "missing",
        })
    }
}

/// Runs one statement in its own read-committed transaction, mapping the clock functions' refusals
/// (SQLSTATE 22023, 22004, 55000) to [`Error::InvalidArgument`].
async fn clock_call(db: &Db, statement: &'static str, at_ms: Option<i64>) -> Result<()> {
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    let mut query = sql::query(statement);
    if let Some(at_ms) = at_ms {
        query = query.bind(at_ms);
    }
    let result = query.execute(tx.conn()).await;
    match result {
        Ok(_) => tx.commit().await,
        Err(err) => {
            tx.rollback().await;
            let refused = err
                .as_database_error()
                .filter(|db| matches!(db.code().as_deref(), Some("22023" | "22004" | "55000")))
                .map(|db| db.message().to_owned());
            match refused {
                Some(message) => Err(Error::InvalidArgument(message)),
                None => Err(err.into()),
            }
        }
    }
}

/// Points `compute_now()` at the simulated clock, starting at `start_ms` (epoch milliseconds). Affects the
/// whole database.
pub async fn use_sim_clock(db: &Db, start_ms: i64) -> Result<()> {
    clock_call(db, "SELECT use_sim_clock(timestamptz 'epoch' + $1::int8 * interval '1 millisecond')", Some(start_ms))
        .await
}

/// Moves the simulated clock to `at_ms`. Moving it back is refused with [`Error::InvalidArgument`].
pub async fn set_sim_clock(db: &Db, at_ms: i64) -> Result<()> {
    clock_call(db, "SELECT set_sim_clock(timestamptz 'epoch' + $1::int8 * interval '1 millisecond')", Some(at_ms)).await
}

/// Points `compute_now()` back at the database server's clock.
pub async fn restore_system_clock(db: &Db) -> Result<()> {
    clock_call(db, "SELECT restore_system_clock()", None).await
}

/// Where `compute_now()` takes its time from.
pub async fn compute_now_mode(db: &Db) -> Result<ClockMode> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let has_mode_fn: bool =
        sql::query_scalar("SELECT to_regprocedure('compute_now_mode()') IS NOT NULL").fetch_one(tx.conn()).await?;
    let mode = if has_mode_fn {
        let text: String = sql::query_scalar("SELECT compute_now_mode()").fetch_one(tx.conn()).await?;
        match text.as_str() {
            "system" => ClockMode::System,
            "sim" => ClockMode::Sim,
            "missing" => ClockMode::Missing,
            _ => ClockMode::Custom,
        }
    } else {
        let has_now: bool =
            sql::query_scalar("SELECT to_regprocedure('compute_now()') IS NOT NULL").fetch_one(tx.conn()).await?;
        if has_now { ClockMode::Custom } else { ClockMode::Missing }
    };
    tx.commit().await?;
    Ok(mode)
}

/// `compute_now()` in epoch milliseconds, as the transaction sees it.
pub async fn compute_now_ms(tx: &mut Tx) -> Result<i64> {
    Ok(sql::query_scalar("SELECT floor(extract(epoch FROM compute_now()) * 1000)::int8").fetch_one(tx.conn()).await?)
}

fn system_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// A process's anchor to business time: `compute_now()` sampled at a known instant, advanced by the
/// process's monotonic clock, plus the skew between the process's wall clock and the server's real clock.
#[derive(Debug, Clone, Copy)]
pub struct ClockAnchor {
    business_ms: i64,
    sampled_at: Instant,
    /// Process wall clock minus the database server's real clock, in milliseconds (round trip halved).
    skew_ms: i64,
    mode: ClockMode,
}

impl ClockAnchor {
    /// Samples the database. Call at start and at each lease renewal.
    pub async fn sample(db: &Db) -> Result<Self> {
        let mode = compute_now_mode(db).await?;
        let mut tx = db.begin(TxOptions::READ_ONLY).await?;
        let before = system_ms();
        let started = Instant::now();
        let row = sql::query(
            "SELECT floor(extract(epoch FROM compute_now()) * 1000)::int8 AS business_ms,
                    floor(extract(epoch FROM compute_db_clock()) * 1000)::int8 AS server_ms",
        )
        .fetch_one(tx.conn())
        .await?;
        let round_trip = started.elapsed();
        tx.commit().await?;
        let business_ms: i64 = row.try_get("business_ms")?;
        let server_ms: i64 = row.try_get("server_ms")?;
        let local_ms = before + (round_trip.as_millis() as i64) / 2;
        Ok(Self { business_ms, sampled_at: started + round_trip / 2, skew_ms: local_ms - server_ms, mode })
    }

    /// Business time now, in epoch milliseconds. Under a simulated clock it stays at the sampled value,
    /// since simulated time moves only when someone moves it.
    pub fn now_ms(&self) -> i64 {
        match self.mode {
            ClockMode::Sim => self.business_ms,
            _ => self.business_ms + self.sampled_at.elapsed().as_millis() as i64,
        }
    }

    pub fn mode(&self) -> ClockMode {
        self.mode
    }

    /// The process's wall clock minus the database server's, in milliseconds.
    pub fn skew_ms(&self) -> i64 {
        self.skew_ms
    }

    /// Whether the skew is beyond [`MAX_CLOCK_SKEW`] (exactly one second is not skew).
    pub fn is_skewed(&self) -> bool {
        self.skew_ms.unsigned_abs() > MAX_CLOCK_SKEW.as_millis() as u64
    }
}
