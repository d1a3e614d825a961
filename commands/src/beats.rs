//! Heartbeats written together: the heartbeats that arrive while others are being written share one call of
//! `agent_heartbeats_json` and one commit.
//!
//! A fleet heartbeats all the time (10,000 agents every 5 s is 2,000 a second), and a heartbeat writes one row:
//! on its own, each pays a transaction, a round trip and a commit for it. Here each heartbeat is queued to a few
//! writers; a writer takes the first waiting heartbeat and every other one queued behind it (up to
//! [`MAX_BATCH`]), renews their sessions in one transaction, and answers each caller with its own row. An idle
//! service answers a lone heartbeat at once, in a batch of one: nothing waits for a batch to fill.
//!
//! A batch that fails (the database went away, a statement timed out) answers every caller "write it alone", and
//! each heartbeat then takes the one-call path with its own error, so an error is never one caller's report of
//! another's heartbeat. The writers are started on the first heartbeat, on the runtime that sent it, and end
//! when the application is dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bc_eventstore::{Db, TxOptions};
use tokio::sync::{Mutex, mpsc, oneshot};

use crate::store::agents::{self, Beat, BeatItem};

/// The most heartbeats one transaction renews.
pub const MAX_BATCH: usize = 128;
/// How many batches are written at once (each holds a connection while it is).
const WRITERS: usize = 4;
/// How many heartbeats may wait for a writer before senders wait too.
const QUEUE: usize = 4 * 1024;

/// Heartbeats the writers took, the transactions they wrote them in, and the transactions that failed (whose
/// heartbeats were then written alone), since this process started.
static TAKEN: AtomicU64 = AtomicU64::new(0);
static WRITTEN: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);

/// What the heartbeat writers of this process have done since it started: the mean batch is `heartbeats` over
/// `transactions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchFigures {
    /// Heartbeats taken from the queue, in a transaction that committed.
    pub heartbeats: u64,
    /// Transactions that committed them.
    pub transactions: u64,
    /// Transactions that failed (their heartbeats were written alone).
    pub failed: u64,
}

/// The figures of this process's heartbeat writers.
pub fn batch_figures() -> BatchFigures {
    BatchFigures {
        heartbeats: TAKEN.load(Ordering::Relaxed),
        transactions: WRITTEN.load(Ordering::Relaxed),
        failed: FAILED.load(Ordering::Relaxed),
    }
}

/// A queued heartbeat and where its answer goes: `Some(row)` as written (`None` inside when its session is not
/// current or its credential unknown), `None` when the batch failed and the heartbeat must be written alone.
struct Pending {
    item: BeatItem,
    answer: oneshot::Sender<Option<Option<Beat>>>,
}

/// The queue the writers take heartbeats from.
#[derive(Debug)]
pub(crate) struct Batcher {
    queue: mpsc::Sender<Pending>,
}

impl Batcher {
    /// Starts the writers over `db` on the current runtime.
    pub(crate) fn start(db: &Db) -> Batcher {
        let (queue, waiting) = mpsc::channel(QUEUE);
        let waiting = Arc::new(Mutex::new(waiting));
        for _ in 0..WRITERS {
            tokio::spawn(write_batches(db.clone(), Arc::clone(&waiting)));
        }
        Batcher { queue }
    }

    /// Renews `item`'s session with whatever else is waiting: its row as written, or `None` when it must be written
    /// alone (its batch failed, or the writers are gone with the runtime that started them).
    pub(crate) async fn beat(&self, item: BeatItem) -> Option<Option<Beat>> {
        let (answer, answered) = oneshot::channel();
        self.queue.send(Pending { item, answer }).await.ok()?;
        answered.await.ok().flatten()
    }
}

/// One writer: takes a batch, writes it, answers it; ends when the queue is closed.
async fn write_batches(db: Db, waiting: Arc<Mutex<mpsc::Receiver<Pending>>>) {
    loop {
        let mut batch = {
            let mut waiting = waiting.lock().await;
            let Some(first) = waiting.recv().await else { return };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match waiting.try_recv() {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            batch
        };
        // A caller that went away no longer needs its heartbeat written.
        batch.retain(|pending| !pending.answer.is_closed());
        if batch.is_empty() {
            continue;
        }
        let written = if let [lone] = batch.as_slice() {
            // Alone, the one-heartbeat call costs the database less than a batch of one.
            db.call(TxOptions::READ_COMMITTED, &lone.item.call())
                .await
                .map_err(crate::AppError::from)
                .and_then(|answer| Ok(vec![agents::beat(answer)?]))
        } else {
            let call = agents::heartbeats_call(batch.iter().map(|pending| &pending.item));
            db.call(TxOptions::READ_COMMITTED, &call)
                .await
                .map_err(crate::AppError::from)
                .and_then(|answer| agents::beats(answer, batch.len()))
        };
        match written {
            Ok(beats) => {
                TAKEN.fetch_add(batch.len() as u64, Ordering::Relaxed);
                WRITTEN.fetch_add(1, Ordering::Relaxed);
                for (pending, beat) in batch.into_iter().zip(beats) {
                    let _ = pending.answer.send(Some(beat));
                }
            }
            Err(err) => {
                FAILED.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %err, heartbeats = batch.len(), "a batch of heartbeats failed; writing each alone");
                for pending in batch {
                    let _ = pending.answer.send(None);
                }
            }
        }
    }
}
