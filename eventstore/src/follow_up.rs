//! Calls that follow commits and may lag them, merged across commits ([`crate::Tx::follow_up`]).
//!
//! Some bookkeeping must follow a commit but nobody waits for it: a hint moved by what the transaction changed.
//! Sending it with the COMMIT makes every command pay for it on its own, and concurrent commands that touched the
//! same rows queue behind each other's hint writes. Instead each committed transaction hands its follow-ups to one
//! writer per pool, which takes every follow-up queued since its last write and sends them as one call per
//! function, the JSON arrays of all those commits concatenated. Alone, a follow-up is written right after its
//! commit. While commits come faster than the writes (the last write carried several), the writer leaves a pause
//! (`DbConfig::follow_up_pause`, 10 ms by default) between the starts of two writes, so that each carries the
//! commits of that time: a write costs about the same for one commit as for ten, and a reserve and the cancel of
//! the same atoms often meet in one write and cancel out. A wait for the follow-ups ([`FollowUps::settled`]) cuts
//! that pause short.
//!
//! A follow-up is written at most once and may be lost (the process exits between the commit and the write, or the
//! write fails): what it maintains must be a hint that something else repairs. A write runs under the pool's
//! statement timeout, so a change is either written or lost within the acquire and statement timeouts.
//! [`FollowUps::settled`] waits until everything queued before it was written (tests that read the hints, and a
//! pool closing).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::{AssertSqlSafe, PgConnection};
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
    /// How each write starts: the statement timeout for the rest of its message.
    timeout: Arc<str>,
    sender: OnceLock<Option<mpsc::UnboundedSender<Batch>>>,
    /// Commits whose follow-ups were handed to the writer.
    queued: AtomicU64,
    /// Commits whose follow-ups the writer has written (or given up on).
    written: Arc<watch::Sender<u64>>,
    /// Writes sent, and those that failed.
    writes: Arc<Writes>,
    /// Someone waits for the follow-ups ([`FollowUps::settled`]): the writer's pause between writes ends.
    hurry: Arc<Hurry>,
    /// The least time between the starts of two writes while the last one carried several commits.
    pause: Duration,
}

/// What the writer's pause between writes listens to: the most commits a caller of [`FollowUps::settled`] waits
/// for, and a wake for the pause under way.
#[derive(Debug, Default)]
struct Hurry {
    wanted: AtomicU64,
    wake: tokio::sync::Notify,
}

/// How many writes of follow-ups were sent, and how many of them failed.
#[derive(Debug, Default)]
struct Writes {
    sent: AtomicU64,
    failed: AtomicU64,
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
    pub(crate) fn new(pool: Pool, statement_timeout_ms: u128, pause: Duration) -> FollowUps {
        FollowUps {
            pool,
            timeout: format!("SELECT set_config('statement_timeout', '{statement_timeout_ms}', true)").into(),
            sender: OnceLock::new(),
            queued: AtomicU64::new(0),
            written: Arc::new(watch::channel(0).0),
            writes: Arc::default(),
            hurry: Arc::default(),
            pause,
        }
    }

    pub(crate) fn figures(&self) -> FollowUpFigures {
        FollowUpFigures {
            commits: self.queued.load(Ordering::Acquire),
            writes: self.writes.sent.load(Ordering::Acquire),
            failed: self.writes.failed.load(Ordering::Acquire),
        }
    }

    /// Writes one committed transaction's follow-ups on `conn` now (when [`FollowUps::hand_over`] found no writer),
    /// counted like the writer's. False when the server did not answer (the connection is broken).
    pub(crate) async fn write_on(&self, conn: &mut PgConnection, batch: Batch) -> bool {
        self.queued.fetch_add(1, Ordering::AcqRel);
        let answered = write_batches(conn, &self.timeout, &self.writes, vec![batch]).await;
        self.written.send_modify(|done| *done += 1);
        answered
    }

    /// Hands one committed transaction's follow-ups to the writer; gives them back when there is no writer (no
    /// runtime to run it on, or it is gone), for the caller to send itself.
    pub(crate) fn hand_over(&self, batch: Batch) -> Result<(), Batch> {
        let sender = self.sender.get_or_init(|| {
            let runtime = tokio::runtime::Handle::try_current().ok()?;
            let (sender, receiver) = mpsc::unbounded_channel();
            let writer = Writer {
                pool: self.pool.clone(),
                timeout: Arc::clone(&self.timeout),
                written: Arc::clone(&self.written),
                writes: Arc::clone(&self.writes),
                hurry: Arc::clone(&self.hurry),
                pause: self.pause,
            };
            runtime.spawn(writer.run(receiver));
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
        // A pause under way ends now; one that begins later sees `wanted` and does not begin.
        self.hurry.wanted.fetch_max(target, Ordering::AcqRel);
        self.hurry.wake.notify_waiters();
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

/// The writer task's share of [`FollowUps`].
struct Writer {
    pool: Pool,
    timeout: Arc<str>,
    written: Arc<watch::Sender<u64>>,
    writes: Arc<Writes>,
    hurry: Arc<Hurry>,
    pause: Duration,
}

impl Writer {
    /// Takes every batch queued, writes them as one call per function, until the pool's last handle is gone.
    async fn run(self, mut receiver: mpsc::UnboundedReceiver<Batch>) {
        // When the last write started, if it carried the follow-ups of more than one commit.
        let mut busy_since: Option<tokio::time::Instant> = None;
        while let Some(first) = receiver.recv().await {
            if let Some(started) = busy_since {
                // Listening before looking at `wanted`, so a wait that begins in between still ends the pause.
                let woken = self.hurry.wake.notified();
                tokio::pin!(woken);
                woken.as_mut().enable();
                if self.hurry.wanted.load(Ordering::Acquire) <= *self.written.borrow() {
                    tokio::select! {
                        () = tokio::time::sleep_until(started + self.pause) => {}
                        () = woken => {}
                    }
                }
            }
            let mut batches = vec![first];
            while batches.len() < MOST_PER_WRITE {
                match receiver.try_recv() {
                    Ok(batch) => batches.push(batch),
                    Err(_) => break,
                }
            }
            let count = batches.len() as u64;
            busy_since = (count > 1).then(tokio::time::Instant::now);
            match self.pool.acquire().await {
                Ok(mut conn) => {
                    if !write_batches(conn.get(), &self.timeout, &self.writes, batches).await {
                        // No answer from the server: the connection is not handed out again.
                        conn.discard();
                    }
                }
                Err(err) => {
                    self.writes.sent.fetch_add(1, Ordering::AcqRel);
                    self.writes.failed.fetch_add(1, Ordering::AcqRel);
                    tracing::warn!(error = %err, commits = count, "no connection to write follow-ups of committed transactions; they are lost");
                }
            }
            self.written.send_modify(|done| *done += count);
        }
    }
}

/// Writes `batches` on `conn` as one message, its statements under the pool's statement timeout, and counts the write.
/// False when the server did not answer (the connection is broken).
async fn write_batches(conn: &mut PgConnection, timeout: &str, writes: &Writes, batches: Vec<Batch>) -> bool {
    let calls = statement(batches);
    if calls.is_empty() {
        return true;
    }
    writes.sent.fetch_add(1, Ordering::AcqRel);
    match sqlx::raw_sql(AssertSqlSafe(format!("{timeout}; {calls}"))).execute(conn).await {
        Ok(_) => true,
        Err(err) => {
            writes.failed.fetch_add(1, Ordering::AcqRel);
            tracing::warn!(error = %err, "writing follow-ups of committed transactions failed; they are lost");
            err.as_database_error().is_some()
        }
    }
}

/// One call per function, its argument the concatenation of every batch's arrays for it, in the order queued.
fn statement(batches: Vec<Batch>) -> String {
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
