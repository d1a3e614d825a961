//! What operators watch, read from the database: the figures a metrics scrape reports (the log, the read models,
//! the horizon, the work queue, the leases, the fleet's capacity, nodes and agents' sessions), the projections'
//! status, and whether the database answers.

use std::time::Duration;

use bc_eventstore::{Access, Db, Isolation, Position, TxOptions};
use bc_projections::status::VersionStatus;
use bc_projections::{consistency, models, status};

use crate::reads::CONSISTENCY_WAIT;
use crate::store;
use crate::{App, AppError, AppResult};

/// One projection version's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct ProjectionFigures {
    pub name: String,
    pub version: u32,
    pub active: bool,
    pub applied: i64,
    pub lag_events: i64,
    pub lag_seconds: f64,
}

/// What a scrape reads from the database.
#[derive(Debug, Clone, PartialEq)]
pub struct DatabaseFigures {
    pub log: LogFigures,
    pub projections: Vec<ProjectionFigures>,
    /// Per pool: capacity, nodes by state, agents' sessions.
    pub fleet: FleetFigures,
}

pub use crate::store::figures::{FleetFigures, LedgerHourFigures, LogFigures, NodeStates, PoolCapacity, PoolSessions};

impl DatabaseFigures {
    async fn read(db: &Db) -> bc_eventstore::Result<Self> {
        let projections = status::status(db, &models::read_models())
            .await?
            .into_iter()
            .map(|v| ProjectionFigures {
                name: v.name,
                version: v.version,
                active: v.active,
                applied: v.events_applied,
                lag_events: v.lag_events,
                lag_seconds: v.lag_seconds,
            })
            .collect();
        let mut tx = db.begin(TxOptions { isolation: Isolation::RepeatableRead, access: Access::ReadOnly }).await?;
        let log = store::figures::log_figures(&mut tx).await?;
        let fleet = store::figures::fleet_figures(&mut tx).await?;
        tx.commit().await?;
        Ok(Self { log, projections, fleet })
    }
}

/// Why the database is not healthy.
#[derive(Debug, thiserror::Error)]
pub enum Unhealthy {
    #[error("the database is unreachable: {0}")]
    Unreachable(bc_eventstore::Error),
    #[error("the database did not answer in time")]
    TimedOut,
}

/// This process's database connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connections {
    pub size: u32,
    pub idle: u32,
    pub max: u32,
}

impl App {
    /// One read-only snapshot of the figures a metrics scrape reports.
    pub async fn database_figures(&self) -> AppResult<DatabaseFigures> {
        Ok(DatabaseFigures::read(&self.db).await?)
    }

    /// This process's database connections, by state.
    pub fn connections(&self) -> Connections {
        let pool = self.db.connections();
        Connections { size: pool.size, idle: pool.idle, max: pool.max }
    }

    /// Whether the database answers within `timeout` (a read-only ping holds no locks and appends nothing, so
    /// abandoning it at the timeout is safe).
    pub async fn ping(&self, timeout: Duration) -> Result<(), Unhealthy> {
        match tokio::time::timeout(timeout, self.db.ping()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => Err(Unhealthy::Unreachable(err)),
            Err(_) => Err(Unhealthy::TimedOut),
        }
    }

    /// Each read model version's state, position and lag, once the read models passed `after` (a bounded wait).
    pub async fn projection_status(&self, after: Option<Position>) -> AppResult<Vec<VersionStatus>> {
        let read_models = models::read_models();
        if let Some(after) = after {
            let names: Vec<&str> = read_models.iter().map(|p| p.name()).collect();
            if let Some(reached) = consistency::wait_for(&self.db, &names, after, CONSISTENCY_WAIT).await? {
                return Err(AppError::NotYetConsistent { wanted: after, reached });
            }
        }
        Ok(status::status(&self.db, &read_models).await?)
    }
}
