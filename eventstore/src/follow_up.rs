//! Calls that follow commits and may lag them, merged across commits ([`crate::Tx::follow_up`]).
//!
//! Some bookkeeping must follow a commit but nobody waits for it: a hint moved by what the transaction changed.
//! Sending it with the COMMIT makes every command pay for it on its own, and concurrent commands that touched the
//! same rows queue behind each other's hint writes. Instead each committed transaction hands its follow-ups to one
//! writer per pool, which takes every follow-up queued since its last write and sends them as one call per
//! function, the JSON arrays of all those commits concatenated. Under load a write carries the changes of many
//! commits; alone, a follow-up is written right after its commit.
//!
//! A follow-up is written at most once and may be lost (the process exits between the commit and the write, or the
//! write fails): what it maintains must be a hint that something else repairs. [`FollowUps::settled`] waits until
//! everything queued before it was written, so a reader in the same process sees the hints of every command that
//! answered before it started.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::AssertSqlSafe;
use tokio::sync::{mpsc, watch};

use crate::conns::Pool;

/// The most commits' follow-ups merged into one write.
const MOST_PER_WRITE: usize = 256;

/// How long [`FollowUps::settled`] waits at most: longer only when the writer cannot get a connection, and then the
/// reader goes on with the hints as they are.
const SETTLE_AT_MOST: Duration = Duration::from_secs(2);

/// One commit's follow-ups: each a function taking one JSON array, and the array.
pub(crate) type Batch = Vec<(&'static str, String)>;

/// The writer of one pool's follow-ups, started with the first of them.
#[derive(Debug)]
pub(crate) struct FollowUps {
    pool: Pool,
    sender: OnceLock<Option<mpsc::UnboundedSender<Batch>>>,
    /// Commits whose follow-ups were handed to the writer.
    queued: AtomicU64,
    /// Commits whose follow-ups the writer has written (or given up on).
    written: Arc<watch::Sender<u64>>,
    /// Writes sent, and those that failed.
    writes: Arc<Writes>,
}

/// How many writes of follow-ups were sent, and how many of them failed.
#[derive(Debug, Default)]
pub(crate) struct Writes {
    pub(crate) sent: AtomicU64,
    pub(crate) failed: AtomicU64,
}

/// What the writer of follow-ups has done since the pool was made ([`crate::Db::follow_up_figures`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FollowUpFigures {
    /// Committed transactions that handed follow-ups over.
    pub commits: u64,
    /// Writes sent, each carrying the follow-ups of one or more commits.
    pub writes: u64,
    /// Writes that failed (their follow-ups are lost, and left to whatever repairs them).
    pub failed: u64,
}

impl FollowUps {
    pub(crate) fn new(pool: Pool) -> FollowUps {
        FollowUps {
            pool,
            sender: OnceLock::new(),
            queued: AtomicU64::new(0),
            written: Arc::new(watch::channel(0).0),
            writes: Arc::default(),
        }
    }

    pub(crate) fn figures(&self) -> FollowUpFigures {
        FollowUpFigures {
            commits: self.queued.load(Ordering::Acquire),
            writes: self.writes.sent.load(Ordering::Acquire),
            failed: self.writes.failed.load(Ordering::Acquire),
        }
    }

    /// Counts a write the caller sent itself (when there was no writer).
    pub(crate) fn counted(&self, result: &Result<(), sqlx::Error>) {
        self.writes.sent.fetch_add(1, Ordering::AcqRel);
        if result.is_err() {
            self.writes.failed.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Hands one committed transaction's follow-ups to the writer; gives them back when there is no writer (no
    /// runtime to run it on, or it is gone), for the caller to send itself.
    pub(crate) fn hand_over(&self, batch: Batch) -> Result<(), Batch> {
        let sender = self.sender.get_or_init(|| {
            let runtime = tokio::runtime::Handle::try_current().ok()?;
            let (sender, receiver) = mpsc::unbounded_channel();
            runtime.spawn(write(receiver, self.pool.clone(), Arc::clone(&self.written), Arc::clone(&self.writes)));
            Some(sender)
        });
        let Some(sender) = sender else { return Err(batch) };
        self.queued.fetch_add(1, Ordering::AcqRel);
        sender.send(batch).map_err(|gone| {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            gone.0
        })
    }

    /// Waits until every follow-up handed over before this call has been written (at most [`SETTLE_AT_MOST`]).
    /// Call it holding no connection of the pool: the writer needs one.
    pub(crate) async fn settled(&self) {
        let target = self.queued.load(Ordering::Acquire);
        let mut written = self.written.subscribe();
        if *written.borrow() >= target {
            return;
        }
        let Some(Some(sender)) = self.sender.get() else { return };
        let sender = sender.clone();
        let wait = async {
            tokio::select! {
                _ = written.wait_for(|done| *done >= target) => {}
                () = sender.closed() => {}
            }
        };
        if tokio::time::timeout(SETTLE_AT_MOST, wait).await.is_err() {
            tracing::warn!("the follow-ups of earlier commits are not written yet; reading without waiting longer");
        }
    }
}

/// The writer: takes every batch queued, writes them as one call per function, until the pool's last handle is gone.
async fn write(
    mut receiver: mpsc::UnboundedReceiver<Batch>,
    pool: Pool,
    written: Arc<watch::Sender<u64>>,
    writes: Arc<Writes>,
) {
    while let Some(first) = receiver.recv().await {
        let mut batches = vec![first];
        while batches.len() < MOST_PER_WRITE {
            match receiver.try_recv() {
                Ok(batch) => batches.push(batch),
                Err(_) => break,
            }
        }
        let count = batches.len() as u64;
        let text = statement(batches);
        if !text.is_empty() {
            writes.sent.fetch_add(1, Ordering::AcqRel);
            if let Err(err) = send(&pool, text).await {
                writes.failed.fetch_add(1, Ordering::AcqRel);
                tracing::warn!(error = %err, commits = count, "writing follow-ups of committed transactions failed; they are lost");
            }
        }
        written.send_modify(|done| *done += count);
    }
}

/// One call per function, its argument the concatenation of every batch's arrays for it, in the order queued.
pub(crate) fn statement(batches: Vec<Batch>) -> String {
    let mut merged: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    for (function, array) in batches.into_iter().flatten() {
        let inner = array.trim().strip_prefix('[').and_then(|rest| rest.strip_suffix(']')).unwrap_or("").trim();
        if !inner.is_empty() {
            merged.entry(function).or_default().push(inner.to_owned());
        }
    }
    merged
        .into_iter()
        .map(|(function, parts)| crate::sql::Call::new(function).jsonb(&format!("[{}]", parts.join(", "))).statement())
        .collect::<Vec<_>>()
        .join("; ")
}

async fn send(pool: &Pool, text: String) -> Result<(), sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let result = sqlx::raw_sql(AssertSqlSafe(text)).execute(conn.get()).await.map(drop);
    if result.as_ref().is_err_and(|err| err.as_database_error().is_none()) {
        // No answer from the server: the connection is not handed out again.
        conn.discard();
    }
    result
}

#[cfg(test)]
mod tests {
    use super::statement;

    #[test]
    fn the_arrays_of_many_commits_are_joined_into_one_call_per_function() {
        let text = statement(vec![
            vec![("a", "[1, 2]".to_owned()), ("b", "[\"x\"]".to_owned())],
            vec![("a", " [3] ".to_owned()), ("b", "[]".to_owned())],
        ]);
        let a = crate::sql::Call::new("a").jsonb("[1, 2, 3]").statement();
        let b = crate::sql::Call::new("b").jsonb("[\"x\"]").statement();
        assert_eq!(text, format!("{a}; {b}"));
        assert_eq!(statement(vec![vec![("a", "[]".to_owned())]]), "");
    }
}
