//! Better Compute's PostgreSQL layer: connections and the transaction executor, the event log, the
//! migrations runner, the one clock, leases with fencing, the work queue, and private PostgreSQL clusters
//! (the embedded database of `better-compute dev`, and, behind the `testing` feature, the test harness).
//!
//! PostgreSQL is the only place processes coordinate. Everything here works behind PgBouncer in transaction
//! mode: no session state, no session advisory locks, no LISTEN/NOTIFY, no named prepared statements.

pub mod bulk;
pub mod clock;
pub mod cluster;
mod conns;
pub mod db;
pub mod error;
pub mod events;
mod follow_up;
pub mod lease;
pub mod migrate;
pub mod queue;
pub mod shards;
pub mod sql;
#[cfg(feature = "testing")]
pub mod testing;

pub use bc_domain::position::{self, Position, PositionError};
pub use conns::PoolStats;
pub use db::{Access, Db, DbConfig, Isolation, RetryPolicy, Retryable, Tx, TxOptions, retries, retry};
pub use error::{Error, Result, RetryReason, sql_state};
pub use events::{AppendBatch, Appended, ExpectedVersion, NewEvent, RecordedEvent};
pub use follow_up::FollowUpFigures;
pub use scoped_futures::ScopedFutureExt;
