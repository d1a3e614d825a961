//! The worker: runs the work queue. A reservation's key (`rsv:<id>`) makes it look at the reservation at its
//! recorded times (start, end, lease deadline, pending deadline) and apply what is due; a pool's key
//! (`pool:<id>:pending`) retries its pending reservations, by offering priority and then first come, whenever
//! capacity may have freed.

use std::time::Duration;

use bc_domain::id::{PoolId, ReservationId};
use bc_domain::reservation::{self, Binding, Due, ReservationState};
use bc_eventstore::lease::{self, Lease};
use bc_eventstore::queue::{self, Backoff, WorkItem};
use bc_eventstore::shards::OwnedShards;
use bc_eventstore::{ScopedFutureExt as _, TxOptions, clock};

use super::explain::Trace;
use super::reservations::{apply_and_schedule, place_events, record_reservation, try_place};
use bc_eventstore::Retryable as _;

use super::work::{self, SHARDS, WorkKey, fenced};
use super::{App, AppError, AppResult, Caller, store};

/// How a worker claims and paces its work.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The shards this worker serves when it holds no shard leases (tests, the simulator); a worker with shard
    /// leases ([`Worker::with_shard_leases`]) serves the shards it holds instead.
    pub shards: Vec<i32>,
    /// Keys claimed per round.
    pub batch: u32,
    /// How long a claim lasts before another worker may take the key.
    pub claim_for: Duration,
    /// The pause when nothing was due.
    pub idle_poll: Duration,
    pub backoff: Backoff,
    /// How often the liveness sweep runs over this worker's shards.
    pub liveness_sweep: Duration,
    /// How often the worker serving shard 0 walks the free-capacity hints of the next
    /// [`WorkerConfig::hint_recount_nodes`] nodes ([`App::walk_free_capacity`]): with the defaults, 10,000 nodes
    /// in about eight minutes. Keep it above the longest a write of the hints can take (the pool's acquire and
    /// statement timeouts, 20 s by default): two sightings of a wrong count must be further apart than that.
    pub hint_recount: Duration,
    pub hint_recount_nodes: i64,
    /// How often the worker serving shard 0 makes the audit checkpoints that are due
    /// ([`App::make_audit_checkpoints`]; hours close [`bc_domain::audit::CLOSE_AFTER_MS`] after they end).
    pub audit_checkpoints: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS as i32).collect(),
            batch: 32,
            claim_for: Duration::from_secs(30),
            idle_poll: Duration::from_millis(200),
            backoff: Backoff::default(),
            liveness_sweep: Duration::from_secs(1),
            hint_recount: Duration::from_secs(30),
            hint_recount_nodes: 600,
            audit_checkpoints: Duration::from_secs(60),
        }
    }
}

/// A worker over the app's database.
#[derive(Debug, Clone)]
pub struct Worker {
    app: App,
    config: WorkerConfig,
    caller: Caller,
    failures: std::sync::Arc<std::sync::atomic::AtomicU64>,
    last_failure: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    /// The shards this process holds, when the work is spread over processes.
    leased: Option<tokio::sync::watch::Receiver<OwnedShards>>,
}

/// Whether an error says the shard's lease is no longer this process's.
fn lease_lost(err: &AppError) -> bool {
    matches!(err, AppError::Store(bc_eventstore::Error::LeaseLost { .. }))
}

impl Worker {
    pub fn new(app: App, config: WorkerConfig) -> Self {
        Self {
            app,
            config,
            caller: Caller::system(),
            failures: Default::default(),
            last_failure: Default::default(),
            leased: None,
        }
    }

    /// Serves only the shards whose leases this process holds (a [`bc_eventstore::shards::ShardKeeper`]'s
    /// watch), each item's transactions fenced by its shard's lease.
    pub fn with_shard_leases(mut self, owned: tokio::sync::watch::Receiver<OwnedShards>) -> Self {
        self.leased = Some(owned);
        self
    }

    /// The shards to serve now, with their leases when they are leased.
    fn serving(&self) -> (Vec<i32>, Option<OwnedShards>) {
        match &self.leased {
            None => (self.config.shards.clone(), None),
            Some(owned) => {
                let owned = owned.borrow().clone();
                (owned.shards(), Some(owned))
            }
        }
    }

    /// Work items that failed with an error a retry would not cure (and were put back with a backoff) since this
    /// worker was made, clones included. Items that lost races until their retries ran out are not counted:
    /// they run again after the backoff, as designed.
    pub fn failures(&self) -> u64 {
        self.failures.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The key and error of the last failed work item.
    pub fn last_failure(&self) -> Option<String> {
        self.last_failure.lock().ok().and_then(|last| last.clone())
    }

    /// Claims one batch of due keys and processes them. Returns how many it claimed.
    pub async fn run_once(&self) -> AppResult<usize> {
        let (mut shards, owned) = self.serving();
        let mut tx = self.app.db.begin(TxOptions::READ_COMMITTED).await?;
        if let Some(owned) = &owned {
            // Claim only on shards still ours at this moment (each read locks its lease row until the claim commits).
            let mut still = Vec::with_capacity(shards.len());
            for (&shard, lease) in &owned.leases {
                match lease::fence(&mut tx, lease).await {
                    Ok(()) => still.push(shard),
                    Err(bc_eventstore::Error::LeaseLost { .. }) => {}
                    Err(err) => return Err(err.into()),
                }
            }
            shards = still;
        }
        if shards.is_empty() {
            tx.commit().await?;
            return Ok(0);
        }
        let items = queue::claim(&mut tx, &shards, self.config.batch, self.config.claim_for).await?;
        tx.commit().await?;
        for item in &items {
            let fence = owned.as_ref().and_then(|owned| owned.lease(item.shard));
            if let Err(err) = self.process(item, fence).await {
                if lease_lost(&err) {
                    // The shard moved to another process, which released this claim when it took the lease.
                    tracing::info!(key = %item.key, shard = item.shard, "shard lease lost; leaving the item to its new owner");
                    continue;
                }
                if !err.is_retryable() {
                    self.failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if let Ok(mut last) = self.last_failure.lock() {
                        *last = Some(format!("{}: {err}", item.key));
                    }
                }
                tracing::warn!(key = %item.key, attempts = item.attempts, error = %err, "work item failed; backing off");
                let mut tx = self.app.db.begin(TxOptions::READ_COMMITTED).await?;
                match fenced(&mut tx, fence).await {
                    Ok(()) => queue::fail(&mut tx, item, &err.to_string(), &self.config.backoff).await?,
                    Err(err) if lease_lost(&err) => {}
                    Err(err) => return Err(err),
                }
                tx.commit().await?;
            }
        }
        Ok(items.len())
    }

    /// Processes due keys until none is left (for tests and the simulator).
    pub async fn run_until_idle(&self) -> AppResult<usize> {
        let mut total = 0;
        loop {
            let claimed = self.run_once().await?;
            if claimed == 0 {
                return Ok(total);
            }
            total += claimed;
        }
    }

    /// One liveness sweep over this worker's shards; returns how many nodes changed connectivity.
    pub async fn sweep_liveness(&self) -> AppResult<usize> {
        let (shards, owned) = self.serving();
        let mut changed = 0;
        for shard in shards {
            let fence = owned.as_ref().and_then(|owned| owned.lease(shard));
            match self.app.sweep_liveness(shard, fence).await {
                Ok(n) => changed += n,
                Err(err) if lease_lost(&err) => {}
                Err(err) => return Err(err),
            }
        }
        Ok(changed)
    }

    /// Runs until `shutdown` resolves. Not cancel-safe inside a round: it finishes the round first.
    pub async fn run(self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut last_sweep = tokio::time::Instant::now();
        let mut last_recount = tokio::time::Instant::now();
        let mut last_checkpoints = tokio::time::Instant::now();
        let mut walked: Option<String> = None;
        // Free counts the walk found disagreeing, each until the walk passes its node again.
        let mut disagreeing: Vec<crate::availability::FreeCountSeen> = Vec::new();
        loop {
            if *shutdown.borrow() {
                return;
            }
            if last_sweep.elapsed() >= self.config.liveness_sweep {
                last_sweep = tokio::time::Instant::now();
                if let Err(err) = self.sweep_liveness().await {
                    tracing::warn!(error = %err, "liveness sweep failed");
                }
            }
            // One process walks the hints: the one serving shard 0.
            if last_recount.elapsed() >= self.config.hint_recount && self.serving().0.contains(&0) {
                last_recount = tokio::time::Instant::now();
                let nodes = self.config.hint_recount_nodes;
                match self.app.walk_free_capacity(walked.as_deref(), nodes, &disagreeing).await {
                    Ok(step) => {
                        // This step's nodes, (from, last]: forget what was seen of them before, keep what is seen now.
                        let in_step = |node: &str| {
                            walked.as_deref().is_none_or(|after| node > after)
                                && step.last.as_deref().is_none_or(|last| node <= last)
                        };
                        disagreeing.retain(|seen| !in_step(&seen.node_id));
                        disagreeing.extend(step.disagreeing);
                        walked = step.last;
                    }
                    Err(err) => tracing::warn!(error = %err, "walking the free-capacity hints failed"),
                }
                // The same process, as often, removes the image uploads whose writer died.
                match self.app.sweep_image_uploads().await {
                    Ok(0) => {}
                    Ok(removed) => tracing::info!(removed, "removed abandoned image uploads"),
                    Err(err) => tracing::warn!(error = %err, "sweeping abandoned image uploads failed"),
                }
            }
            // The same process makes the audit checkpoints of the hours that closed; several processes doing it
            // at once would only be refused by the checkpoints' unique keys.
            if last_checkpoints.elapsed() >= self.config.audit_checkpoints && self.serving().0.contains(&0) {
                last_checkpoints = tokio::time::Instant::now();
                if let Err(err) = self.app.make_audit_checkpoints().await {
                    tracing::warn!(error = %err, "making the audit checkpoints failed");
                }
            }
            let claimed = match self.run_once().await {
                Ok(claimed) => claimed,
                Err(err) => {
                    tracing::warn!(error = %err, "worker round failed");
                    0
                }
            };
            if claimed == 0 {
                let pause = self.config.idle_poll.min(self.config.liveness_sweep);
                tokio::select! {
                    _ = shutdown.changed() => {}
                    () = tokio::time::sleep(pause) => {}
                }
            }
        }
    }

    async fn process(&self, item: &WorkItem, fence: Option<&Lease>) -> AppResult<()> {
        match item.key.parse::<WorkKey>() {
            Ok(WorkKey::Reservation(id)) => return self.reconcile_reservation(item, &id, fence).await,
            Ok(WorkKey::NodeReplace(node)) => return self.app.run_node_item(&self.caller, item, &node, fence).await,
            Ok(WorkKey::NodeLifecycle(node)) => {
                return self.app.run_lifecycle_item(&self.caller, item, &node, fence).await;
            }
            Ok(WorkKey::Workflow(id)) => return self.app.run_workflow_item(&self.caller, item, &id, fence).await,
            Ok(WorkKey::PoolPending { pool, .. }) => return self.retry_pending(item, &pool, fence).await,
            Ok(WorkKey::PoolProvider(pool)) => return self.app.run_provider_item(item, &pool, fence).await,
            Err(unknown) => tracing::warn!(%unknown, "dropping a work item this build does not know"),
        }
        let mut tx = self.app.db.begin(TxOptions::READ_COMMITTED).await?;
        fenced(&mut tx, fence).await?;
        queue::complete(&mut tx, item).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Applies whatever is due for one reservation, in one transaction with the completion of its work item.
    async fn reconcile_reservation(&self, item: &WorkItem, id: &ReservationId, fence: Option<&Lease>) -> AppResult<()> {
        let caller = &self.caller;
        self.app
            .db
            .transaction_with_retry(TxOptions::COMMAND, &self.app.retry, |tx| {
                async move {
                    fenced(tx, fence).await?;
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let Some(mut r) = store::reservation(tx, id).await? else {
                        queue::complete(tx, item).await?;
                        return Ok(());
                    };
                    // Read when the first step records: most rounds only reschedule.
                    let mut answering: Option<Caller> = None;
                    // A few steps at most: placed → binding → active happen together at the start.
                    for _ in 0..4 {
                        let handing_over = matches!(r.state, ReservationState::Binding | ReservationState::Releasing);
                        let whole = if handing_over && r.request.binding == Binding::Node {
                            super::whole_nodes::step(tx, caller, &r, now_ms).await?
                        } else {
                            None
                        };
                        let events = match whole.map(Due::Apply).unwrap_or_else(|| reservation::due(&r, now_ms)) {
                            Due::Done => {
                                queue::complete(tx, item).await?;
                                return Ok(());
                            }
                            Due::WakeAt(at) => {
                                queue::reschedule(tx, item, at).await?;
                                return Ok(());
                            }
                            Due::TryPlace { wake_at_ms } => {
                                let pool = store::pool(tx, &r.request.pool_id).await?;
                                let mut trace = Trace::default();
                                let placed = match &pool {
                                    Some(pool) => try_place(tx, &r, pool, now_ms, 0, None, &mut trace).await?,
                                    None => None,
                                };
                                match placed {
                                    Some(allocations) => {
                                        place_events(&r, allocations, now_ms, self.app.explain.then_some(trace))?
                                    }
                                    None => {
                                        queue::reschedule(tx, item, wake_at_ms).await?;
                                        return Ok(());
                                    }
                                }
                            }
                            Due::Apply(command) => {
                                reservation::decide(&r, &super::node_commands::with_awaiting(tx, &r, command).await?)?
                            }
                        };
                        // The worker holds this reservation's key and reschedules it itself, so it records without waking it.
                        if answering.is_none() {
                            answering = Some(answering_last_event(tx, caller, id.as_str()).await?);
                        }
                        let caller = answering.as_ref().unwrap_or(caller);
                        r = record_reservation(tx, caller, r, events).await?.0;
                    }
                    // Still due after the steps: leave the key due, so the next round goes on.
                    queue::reschedule(tx, item, now_ms).await?;
                    Ok(())
                }
                .scope_boxed()
            })
            .await
    }

    /// Retries the pool's pending reservations in order, each in its own transaction. Other wakes of the same
    /// pool that were already queued when the pass began are covered by it, and are removed with its own.
    async fn retry_pending(&self, item: &WorkItem, pool_id: &PoolId, fence: Option<&Lease>) -> AppResult<()> {
        let mut tx = self.app.db.begin(TxOptions::READ_ONLY).await?;
        let covered = store::queued_pending_wakes(&mut tx, pool_id, &item.key).await?;
        let pending = store::pending_in_order(&mut tx, pool_id, 200).await?;
        tx.commit().await?;
        let caller = &self.caller;
        let mut raced = false;
        for id in &pending {
            let placed = self
                .app
                .db
                .transaction_with_retry(TxOptions::COMMAND, &self.app.retry, |tx| {
                    async move {
                        fenced(tx, fence).await?;
                        let now_ms = clock::compute_now_ms(tx).await?;
                        let Some(r) = store::reservation(tx, id).await? else { return Ok(()) };
                        if r.state != ReservationState::Pending || now_ms >= r.pending_deadline_ms {
                            return Ok(());
                        }
                        let Some(pool) = store::pool(tx, pool_id).await? else { return Ok(()) };
                        let mut trace = Trace::default();
                        if let Some(allocations) = try_place(tx, &r, &pool, now_ms, 0, None, &mut trace).await? {
                            let events = place_events(&r, allocations, now_ms, self.app.explain.then_some(trace))?;
                            let caller = &answering_last_event(tx, caller, id.as_str()).await?;
                            apply_and_schedule(tx, caller, r, events, now_ms).await?;
                        }
                        Ok::<_, AppError>(())
                    }
                    .scope_boxed()
                })
                .await;
            match placed {
                // Lost races until the retries ran out: go on with the others, and wake the pool again.
                Err(err) if err.is_retryable() => raced = true,
                other => other?,
            }
        }
        let mut tx = self.app.db.begin(TxOptions::READ_COMMITTED).await?;
        fenced(&mut tx, fence).await?;
        queue::complete(&mut tx, item).await?;
        store::drop_unclaimed_wakes(&mut tx, &covered).await?;
        if raced {
            work::wake_now(&mut tx, &WorkKey::pool_pending(pool_id)).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

/// The worker as it records on `stream`: answering the stream's last event (its causation), in the operation
/// that event belongs to (its correlation), so the work links back to whoever began it.
async fn answering_last_event(tx: &mut bc_eventstore::Tx, worker: &Caller, stream: &str) -> AppResult<Caller> {
    Ok(match bc_eventstore::events::last_of_stream(tx, stream).await? {
        Some(cause) => worker.clone().caused_by(&cause),
        None => worker.clone(),
    })
}
