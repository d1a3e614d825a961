//! The work queue: durable wake-ups for reservation starts and ends, lease expiries, retries and timeouts.
//!
//! A key is enqueued in the same transaction as the state change that needs it, and enqueueing coalesces: a
//! key already queued gets `gen + 1` and the earlier `not_before`. Workers claim due keys of their shards
//! with `FOR UPDATE SKIP LOCKED` for a while (`claimed_until`); success deletes the row only if `gen` is still
//! the claimed one, so a key dirtied again while it was being processed survives and runs again.

use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::Row;

use crate::db::Tx;
use crate::error::Result;
use crate::sql;

/// A claimed key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkItem {
    pub key: String,
    pub shard: i32,
    /// The generation claimed; completion succeeds only if it is still current.
    pub generation: i64,
    /// Claims so far, this one included.
    pub attempts: i32,
}

/// A key to enqueue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enqueue<'a> {
    pub key: &'a str,
    pub shard: i32,
    /// Not before this time (epoch milliseconds); `None` means `compute_now()`.
    pub not_before_ms: Option<i64>,
}

/// The shard a key belongs to, stable across processes and releases: the first four bytes of the key's
/// SHA-256, modulo the shard count.
pub fn shard_for(key: &str, shards: u32) -> i32 {
    let digest = Sha256::digest(key.as_bytes());
    let head = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    (head % shards.max(1)) as i32
}

/// [`enqueue`] as a server-side call (`enqueue_work`), for a command to send with its COMMIT ([`Tx::defer`]).
pub fn enqueue_call(items: &[Enqueue<'_>]) -> sql::Call {
    let keys: Vec<&str> = items.iter().map(|i| i.key).collect();
    let shards: Vec<i32> = items.iter().map(|i| i.shard).collect();
    let not_before: Vec<Option<i64>> = items.iter().map(|i| i.not_before_ms).collect();
    sql::Call::new("enqueue_work").texts(&keys).int4s(&shards).opt_int8s(&not_before)
}

/// Enqueues keys in one statement, coalescing with keys already queued (and with each other: a key listed
/// twice is queued once, at its earlier time).
pub async fn enqueue(tx: &mut Tx, items: &[Enqueue<'_>]) -> Result<()> {
    if items.is_empty() {
        return Ok(());
    }
    tx.call(&enqueue_call(items)).await?;
    Ok(())
}

/// Claims up to `limit` due keys of `shards` for `claim_for`, oldest first, skipping keys other workers hold.
pub async fn claim(tx: &mut Tx, shards: &[i32], limit: u32, claim_for: Duration) -> Result<Vec<WorkItem>> {
    let rows = sql::query(
        "WITH due AS (
             SELECT key FROM work_queue
             WHERE shard = ANY($1)
               AND not_before <= compute_now()
               AND (claimed_until IS NULL OR claimed_until < compute_now())
             ORDER BY not_before, key
             LIMIT $2
             FOR UPDATE SKIP LOCKED
         )
         UPDATE work_queue AS w
            SET claimed_until = compute_now() + make_interval(secs => $3), attempts = w.attempts + 1
           FROM due
          WHERE w.key = due.key
         RETURNING w.key, w.shard, w.gen, w.attempts",
    )
    .bind(shards)
    .bind(i64::from(limit))
    .bind(claim_for.as_secs_f64())
    .fetch_all(tx.conn())
    .await?;
    let mut items = rows
        .iter()
        .map(|row| {
            Ok(WorkItem {
                key: row.try_get("key")?,
                shard: row.try_get("shard")?,
                generation: row.try_get("gen")?,
                attempts: row.try_get("attempts")?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    items.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(items)
}

/// Marks a claimed key done. Returns `false` when the key was enqueued again while it was processed: it stays
/// queued, released from the claim, and runs again.
pub async fn complete(tx: &mut Tx, item: &WorkItem) -> Result<bool> {
    let deleted = sql::query("DELETE FROM work_queue WHERE key = $1 AND gen = $2")
        .bind(&item.key)
        .bind(item.generation)
        .execute(tx.conn())
        .await?
        .rows_affected();
    if deleted == 1 {
        return Ok(true);
    }
    sql::query("UPDATE work_queue SET claimed_until = NULL, attempts = 0, last_error = NULL WHERE key = $1")
        .bind(&item.key)
        .execute(tx.conn())
        .await?;
    Ok(false)
}

/// Puts a claimed key back to sleep until `not_before_ms`, if it was not enqueued again meanwhile (then it stays
/// due, so the new reason to look at it is not lost). Returns whether it was rescheduled.
pub async fn reschedule(tx: &mut Tx, item: &WorkItem, not_before_ms: i64) -> Result<bool> {
    let updated = sql::query(
        "UPDATE work_queue
            SET not_before = timestamptz 'epoch' + $3::int8 * interval '1 millisecond',
                claimed_until = NULL, attempts = 0, last_error = NULL
          WHERE key = $1 AND gen = $2",
    )
    .bind(&item.key)
    .bind(item.generation)
    .bind(not_before_ms)
    .execute(tx.conn())
    .await?
    .rows_affected();
    if updated == 1 {
        return Ok(true);
    }
    sql::query("UPDATE work_queue SET claimed_until = NULL WHERE key = $1").bind(&item.key).execute(tx.conn()).await?;
    Ok(false)
}

/// How long a failed key waits before its next try: doubling from `base` up to `max`, with jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { base: Duration::from_secs(1), max: Duration::from_secs(300) }
    }
}

impl Backoff {
    /// The delay after the `attempts`-th failed try: between half and all of `min(max, base * 2^(attempts-1))`.
    pub fn delay(&self, attempts: i32) -> Duration {
        let exponent = attempts.saturating_sub(1).clamp(0, 20) as u32;
        let full = self.base.saturating_mul(1 << exponent).min(self.max);
        full.mul_f64(0.5 + fastrand::f64() / 2.0)
    }
}

/// Records a failed try: the claim is released and the key waits out its backoff.
pub async fn fail(tx: &mut Tx, item: &WorkItem, error: &str, backoff: &Backoff) -> Result<()> {
    let delay = backoff.delay(item.attempts);
    sql::query(
        "UPDATE work_queue
            SET claimed_until = NULL,
                not_before = compute_now() + make_interval(secs => $2),
                last_error = left($3, 2000)
          WHERE key = $1",
    )
    .bind(&item.key)
    .bind(delay.as_secs_f64())
    .bind(error)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// Keys queued for `shards`, and how many of them are due.
pub async fn depth(tx: &mut Tx, shards: &[i32]) -> Result<(i64, i64)> {
    let row = sql::query(
        "SELECT count(*) AS queued, count(*) FILTER (WHERE not_before <= compute_now()) AS due
         FROM work_queue WHERE shard = ANY($1)",
    )
    .bind(shards)
    .fetch_one(tx.conn())
    .await?;
    Ok((row.try_get("queued")?, row.try_get("due")?))
}
