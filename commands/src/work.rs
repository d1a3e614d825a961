//! The work queue as the write side uses it: the keys the worker is asked to look at (one typed value, written
//! and parsed here only), waking a key in the caller's transaction, and fencing a shard's work by its lease.

use std::fmt;
use std::str::FromStr;

use bc_domain::id::{NodeId, PoolId, ReservationId};
use bc_domain::reservation::NextLook;
use bc_eventstore::Tx;
use bc_eventstore::lease::{self, Lease};
use bc_eventstore::queue::{self, Enqueue};

use super::AppResult;

/// The number of work-queue shards keys are spread over.
pub const SHARDS: u32 = 16;

/// What a work-queue row asks the worker to look at.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum WorkKey {
    /// A reservation whose recorded times call for a step: placement, binding, expiry (`rsv:<id>`).
    Reservation(ReservationId),
    /// A node whose future bookings must be placed elsewhere, or whose drain may complete
    /// (`node:<id>:replace`).
    NodeReplace(NodeId),
    /// A node whose transitional `provisionState` may outlast its limit (`node:<id>:lifecycle`).
    NodeLifecycle(NodeId),
    /// A workflow to move on: its next step, a step's deadline, its end (`wf:<id>`).
    Workflow(bc_domain::id::WorkflowId),
    /// A pool whose pending reservations should be tried again, because capacity freed
    /// (`pool:<id>:pending@<wake>`). Each wake has a key of its own: one shared key would be a row that every
    /// command freeing capacity updates, and repeatable-read commands updating one row abort each other. The
    /// worker coalesces a pool's wakes when it runs them ([`WorkKey::pending_prefix`]).
    PoolPending { pool: PoolId, wake: String },
    /// A provider pool's round: acquire machines for its waiting reservations, register the ready ones, give back
    /// those no longer needed (`pool:<id>:provider`).
    PoolProvider(PoolId),
}

impl WorkKey {
    /// A new wake of a pool's pending reservations.
    pub fn pool_pending(pool: &PoolId) -> WorkKey {
        WorkKey::PoolPending { pool: pool.clone(), wake: bc_domain::id::new_ulid().to_string().to_ascii_lowercase() }
    }

    /// The text every pending wake of `pool` starts with.
    pub fn pending_prefix(pool: &PoolId) -> String {
        format!("pool:{pool}:pending@")
    }

    /// The shard this key's row belongs to.
    pub fn shard(&self) -> i32 {
        queue::shard_for(&self.to_string(), SHARDS)
    }
}

impl fmt::Display for WorkKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkKey::Reservation(id) => write!(f, "rsv:{id}"),
            WorkKey::NodeReplace(node) => write!(f, "node:{node}:replace"),
            WorkKey::NodeLifecycle(node) => write!(f, "node:{node}:lifecycle"),
            WorkKey::Workflow(id) => write!(f, "wf:{id}"),
            WorkKey::PoolPending { pool, wake } => write!(f, "{}{wake}", WorkKey::pending_prefix(pool)),
            WorkKey::PoolProvider(pool) => write!(f, "pool:{pool}:provider"),
        }
    }
}

/// A work-queue key this build does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key:?} is not a work-queue key: {reason}")]
pub struct UnknownWorkKey {
    pub key: String,
    pub reason: String,
}

impl FromStr for WorkKey {
    type Err = UnknownWorkKey;

    fn from_str(key: &str) -> Result<Self, Self::Err> {
        let unknown = |reason: String| UnknownWorkKey { key: key.to_owned(), reason };
        if let Some(id) = key.strip_prefix("wf:") {
            return id.parse().map(WorkKey::Workflow).map_err(|err| unknown(format!("{err}")));
        }
        if let Some(id) = key.strip_prefix("rsv:") {
            return id.parse().map(WorkKey::Reservation).map_err(|err| unknown(format!("{err}")));
        }
        if let Some(node) = key.strip_prefix("node:").and_then(|rest| rest.strip_suffix(":replace")) {
            return node.parse().map(WorkKey::NodeReplace).map_err(|err| unknown(format!("{err}")));
        }
        if let Some(node) = key.strip_prefix("node:").and_then(|rest| rest.strip_suffix(":lifecycle")) {
            return node.parse().map(WorkKey::NodeLifecycle).map_err(|err| unknown(format!("{err}")));
        }
        if let Some(pool) = key.strip_prefix("pool:").and_then(|rest| rest.strip_suffix(":provider")) {
            return pool.parse().map(WorkKey::PoolProvider).map_err(|err| unknown(format!("{err}")));
        }
        if let Some((pool, wake)) = key.strip_prefix("pool:").and_then(|rest| rest.split_once(":pending@")) {
            if wake.is_empty() || !wake.bytes().all(|b| b.is_ascii_alphanumeric()) {
                return Err(unknown("the wake is not a ULID".to_owned()));
            }
            let pool = pool.parse().map_err(|err| unknown(format!("{err}")))?;
            return Ok(WorkKey::PoolPending { pool, wake: wake.to_owned() });
        }
        Err(unknown("no kind of key starts so".to_owned()))
    }
}

/// Asks the worker to look at `key` as soon as it can, in the caller's transaction.
pub(crate) async fn wake_now(tx: &mut Tx, key: &WorkKey) -> AppResult<()> {
    enqueue(tx, key, None).await
}

/// Asks the worker to look at `key` at `at_ms`, in the caller's transaction (an earlier wake already queued
/// stays).
pub(crate) async fn wake_at(tx: &mut Tx, key: &WorkKey, at_ms: i64) -> AppResult<()> {
    enqueue(tx, key, Some(at_ms)).await
}

/// Schedules the next look a decision asked for.
pub(crate) async fn schedule(tx: &mut Tx, key: &WorkKey, next: NextLook) -> AppResult<()> {
    match next {
        NextLook::Never => Ok(()),
        NextLook::Now => wake_now(tx, key).await,
        NextLook::At(at_ms) => wake_at(tx, key, at_ms).await,
    }
}

/// Schedules the next look a decision asked for with the transaction's COMMIT, in its round trip
/// ([`Tx::defer`]): for commands, after which nothing in the transaction reads the work queue.
pub(crate) fn schedule_with_commit(tx: &mut Tx, key: &WorkKey, next: NextLook) {
    match next {
        NextLook::Never => {}
        NextLook::Now => enqueue_with_commit(tx, key, None),
        NextLook::At(at_ms) => enqueue_with_commit(tx, key, Some(at_ms)),
    }
}

/// [`wake_now`] with the transaction's COMMIT (see [`schedule_with_commit`]).
pub(crate) fn wake_with_commit(tx: &mut Tx, key: &WorkKey) {
    enqueue_with_commit(tx, key, None);
}

fn enqueue_with_commit(tx: &mut Tx, key: &WorkKey, not_before_ms: Option<i64>) {
    let text = key.to_string();
    tx.defer(&queue::enqueue_call(&[Enqueue { key: &text, shard: key.shard(), not_before_ms }]));
}

async fn enqueue(tx: &mut Tx, key: &WorkKey, not_before_ms: Option<i64>) -> AppResult<()> {
    let text = key.to_string();
    queue::enqueue(tx, &[Enqueue { key: &text, shard: key.shard(), not_before_ms }]).await?;
    Ok(())
}

/// Starts a transaction's work for a shard, fenced by the shard's lease when the worker holds one: a process
/// that lost the shard cannot commit work for it.
pub(crate) async fn fenced(tx: &mut Tx, fence: Option<&Lease>) -> AppResult<()> {
    if let Some(lease) = fence {
        lease::fence(tx, lease).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_reads_back_as_itself() {
        let keys = [
            WorkKey::Reservation(ReservationId::derive(
                &"acme".parse().expect("tenant"),
                &"alice".parse().expect("identity"),
                "k",
            )),
            WorkKey::NodeReplace(NodeId::generate()),
            WorkKey::NodeLifecycle(NodeId::generate()),
            WorkKey::Workflow(bc_domain::id::WorkflowId::generate()),
            WorkKey::pool_pending(&PoolId::generate()),
        ];
        for key in keys {
            assert_eq!(key.to_string().parse::<WorkKey>(), Ok(key.clone()), "{key}");
        }
    }

    #[test]
    fn pending_wakes_of_a_pool_share_its_prefix_and_differ() {
        let pool = PoolId::generate();
        let (a, b) = (WorkKey::pool_pending(&pool).to_string(), WorkKey::pool_pending(&pool).to_string());
        assert_ne!(a, b);
        assert!(a.starts_with(&WorkKey::pending_prefix(&pool)) && b.starts_with(&WorkKey::pending_prefix(&pool)));
    }

    #[test]
    fn foreign_keys_are_refused_naming_the_key() {
        for key in ["", "rsv:", "rsv:nope", "node:node_x", "pool:pool_x:pending@", "pool:x:pending@abc", "lease:x"] {
            let err = key.parse::<WorkKey>().expect_err(key);
            assert_eq!(err.key, key);
        }
    }
}
