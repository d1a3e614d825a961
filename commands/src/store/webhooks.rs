//! Webhook subscriptions' rows (`webhooks/0001_webhooks`): the inline `webhooks` table's reads, and the runtime
//! rows of delivery (cursors, attempts, dead letters) that the holder of a subscription's lease writes.

use bc_eventstore::{Tx, sql};
use sqlx::Row as _;
use sqlx::postgres::PgRow;

use crate::AppResult;
use crate::store::corrupt;

/// A `webhooks` row with where its deliveries stand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookRow {
    pub id: String,
    pub tenant_id: String,
    pub url: String,
    pub event_types: String,
    pub description: String,
    pub created_at_ms: i64,
    pub secret_at_ms: i64,
    /// The cursor's position (`None` only for a row written before its cursor, which cannot commit).
    pub position: Option<String>,
    pub delivered: i64,
    pub dead_letters: i64,
}

/// A statement reading subscriptions with their cursors and dead letters, ending with `$rest`.
macro_rules! select_webhooks {
    ($rest:literal) => {
        concat!(
            "SELECT w.id, w.tenant_id, w.url, w.event_types::text AS event_types, w.description,
                    ts_ms(w.created_at) AS created_at_ms, ts_ms(w.secret_at) AS secret_at_ms, c.position,
                    coalesce(c.delivered, 0) AS delivered,
                    (SELECT count(*) FROM webhook_dead_letters d WHERE d.webhook_id = w.id AND NOT d.queued)
                        AS dead_letters
             FROM webhooks w LEFT JOIN webhook_cursors c ON c.webhook_id = w.id ",
            $rest
        )
    };
}

fn webhook_row(row: &PgRow) -> AppResult<WebhookRow> {
    let read = || -> Result<WebhookRow, sqlx::Error> {
        Ok(WebhookRow {
            id: row.try_get("id")?,
            tenant_id: row.try_get("tenant_id")?,
            url: row.try_get("url")?,
            event_types: row.try_get("event_types")?,
            description: row.try_get("description")?,
            created_at_ms: row.try_get("created_at_ms")?,
            secret_at_ms: row.try_get("secret_at_ms")?,
            position: row.try_get("position")?,
            delivered: row.try_get("delivered")?,
            dead_letters: row.try_get("dead_letters")?,
        })
    };
    read().map_err(|err| corrupt("a webhooks row", err))
}

/// One subscription.
pub async fn webhook(tx: &mut Tx, id: &str) -> AppResult<Option<WebhookRow>> {
    let row = sql::query(select_webhooks!("WHERE w.id = $1")).bind(id).fetch_optional(tx.conn()).await?;
    row.as_ref().map(webhook_row).transpose()
}

/// A page of a tenant's subscriptions by id, after `after`.
pub async fn list(tx: &mut Tx, tenant: &str, after: Option<&str>, limit: i64) -> AppResult<Vec<WebhookRow>> {
    let rows = sql::query(select_webhooks!(
        "WHERE w.tenant_id = $1 AND ($2::text IS NULL OR w.id > $2) ORDER BY w.id LIMIT $3"
    ))
    .bind(tenant)
    .bind(after)
    .bind(limit)
    .fetch_all(tx.conn())
    .await?;
    rows.iter().map(webhook_row).collect()
}

/// Every live subscription's id, for the deliverers.
pub async fn ids(tx: &mut Tx) -> AppResult<Vec<String>> {
    Ok(sql::query_scalar("SELECT id FROM webhooks ORDER BY id").fetch_all(tx.conn()).await?)
}

/// A new subscription's cursor: after its own creation event.
pub async fn start_cursor(tx: &mut Tx, id: &str, position: &str) -> AppResult<()> {
    sql::query("INSERT INTO webhook_cursors (webhook_id, position) VALUES ($1, $2)")
        .bind(id)
        .bind(position)
        .execute(tx.conn())
        .await?;
    Ok(())
}

/// Removes a deleted subscription's runtime rows.
pub async fn forget(tx: &mut Tx, id: &str) -> AppResult<()> {
    sql::query(
        "WITH a AS (DELETE FROM webhook_attempts WHERE webhook_id = $1),
              d AS (DELETE FROM webhook_dead_letters WHERE webhook_id = $1)
         DELETE FROM webhook_cursors WHERE webhook_id = $1",
    )
    .bind(id)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// Moves the cursor to `position` if given (never back: the caller read it under the same lease), counting
/// `delivered` more deliveries.
pub async fn advance(tx: &mut Tx, id: &str, position: Option<&str>, delivered: i64) -> AppResult<()> {
    sql::query(
        "UPDATE webhook_cursors SET position = coalesce($2, position), delivered = delivered + $3,
                                    updated_at = compute_now()
         WHERE webhook_id = $1",
    )
    .bind(id)
    .bind(position)
    .bind(delivered)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// One attempt of a delivery, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRow {
    pub message_id: String,
    pub position: String,
    pub event_type: String,
    pub attempt: i32,
    pub at_ms: i64,
    pub status: Option<i32>,
    pub error: Option<String>,
    pub outcome: String,
}

/// Records attempts (one statement for all of them), at `compute_now()` (their `at_ms` is not read).
pub async fn record_attempts(tx: &mut Tx, id: &str, attempts: &[AttemptRow]) -> AppResult<()> {
    if attempts.is_empty() {
        return Ok(());
    }
    let column = |f: fn(&AttemptRow) -> String| attempts.iter().map(f).collect::<Vec<_>>();
    sql::query(
        "INSERT INTO webhook_attempts (webhook_id, message_id, position, event_type, attempt, status, error, outcome)
         SELECT $1, m, p, t, a, s, e, o
         FROM UNNEST($2::text[], $3::text[], $4::text[], $5::int4[], $6::int4[], $7::text[], $8::text[])
              AS u(m, p, t, a, s, e, o)",
    )
    .bind(id)
    .bind(column(|a| a.message_id.clone()))
    .bind(column(|a| a.position.clone()))
    .bind(column(|a| a.event_type.clone()))
    .bind(attempts.iter().map(|a| a.attempt).collect::<Vec<_>>())
    .bind(attempts.iter().map(|a| a.status).collect::<Vec<_>>())
    .bind(attempts.iter().map(|a| a.error.clone()).collect::<Vec<_>>())
    .bind(column(|a| a.outcome.clone()))
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// Forgets attempts older than a week.
pub async fn prune_attempts(tx: &mut Tx, id: &str) -> AppResult<()> {
    sql::query("DELETE FROM webhook_attempts WHERE webhook_id = $1 AND at < compute_now() - interval '7 days'")
        .bind(id)
        .execute(tx.conn())
        .await?;
    Ok(())
}

/// The most recent attempts, newest first.
pub async fn recent_attempts(tx: &mut Tx, id: &str, limit: i64) -> AppResult<Vec<AttemptRow>> {
    let rows = sql::query(
        "SELECT message_id, position, event_type, attempt, ts_ms(at) AS at_ms, status, error, outcome
         FROM webhook_attempts WHERE webhook_id = $1 ORDER BY id DESC LIMIT $2",
    )
    .bind(id)
    .bind(limit)
    .fetch_all(tx.conn())
    .await?;
    rows.iter()
        .map(|row| {
            let read = || -> Result<AttemptRow, sqlx::Error> {
                Ok(AttemptRow {
                    message_id: row.try_get("message_id")?,
                    position: row.try_get("position")?,
                    event_type: row.try_get("event_type")?,
                    attempt: row.try_get("attempt")?,
                    at_ms: row.try_get("at_ms")?,
                    status: row.try_get("status")?,
                    error: row.try_get("error")?,
                    outcome: row.try_get("outcome")?,
                })
            };
            read().map_err(|err| corrupt("a webhook_attempts row", err))
        })
        .collect()
}

/// A dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterRow {
    pub position: String,
    pub event_type: String,
    pub attempts: i32,
    pub last_error: String,
    pub dead_at_ms: i64,
    pub queued: bool,
}

/// Keeps an event whose every attempt failed (or again, after a replay failed: its attempts add up).
pub async fn bury(
    tx: &mut Tx,
    id: &str,
    position: &str,
    event_type: &str,
    attempts: i32,
    error: &str,
) -> AppResult<()> {
    sql::query(
        "INSERT INTO webhook_dead_letters (webhook_id, position, event_type, attempts, last_error)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (webhook_id, position) DO UPDATE
             SET attempts = webhook_dead_letters.attempts + excluded.attempts, last_error = excluded.last_error,
                 dead_at = compute_now(), queued = false",
    )
    .bind(id)
    .bind(position)
    .bind(event_type)
    .bind(attempts)
    .bind(error)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// Removes a dead letter that a replay delivered.
pub async fn unbury(tx: &mut Tx, id: &str, position: &str) -> AppResult<()> {
    sql::query("DELETE FROM webhook_dead_letters WHERE webhook_id = $1 AND position = $2")
        .bind(id)
        .bind(position)
        .execute(tx.conn())
        .await?;
    Ok(())
}

/// Queues every dead letter of the subscription for another delivery; answers how many.
pub async fn queue_dead_letters(tx: &mut Tx, id: &str) -> AppResult<i64> {
    let done = sql::query("UPDATE webhook_dead_letters SET queued = true WHERE webhook_id = $1 AND NOT queued")
        .bind(id)
        .execute(tx.conn())
        .await?;
    Ok(i64::try_from(done.rows_affected()).unwrap_or(i64::MAX))
}

/// Which dead letters a read wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Which {
    All,
    Queued,
}

/// The subscription's dead letters, oldest first.
async fn dead_letters_where(tx: &mut Tx, id: &str, which: Which, limit: i64) -> AppResult<Vec<DeadLetterRow>> {
    let rows = sql::query(
        "SELECT position, event_type, attempts, last_error, ts_ms(dead_at) AS dead_at_ms, queued
         FROM webhook_dead_letters WHERE webhook_id = $1 AND (queued OR NOT $2) ORDER BY id LIMIT $3",
    )
    .bind(id)
    .bind(which == Which::Queued)
    .bind(limit)
    .fetch_all(tx.conn())
    .await?;
    rows.iter()
        .map(|row| {
            let read = || -> Result<DeadLetterRow, sqlx::Error> {
                Ok(DeadLetterRow {
                    position: row.try_get("position")?,
                    event_type: row.try_get("event_type")?,
                    attempts: row.try_get("attempts")?,
                    last_error: row.try_get("last_error")?,
                    dead_at_ms: row.try_get("dead_at_ms")?,
                    queued: row.try_get("queued")?,
                })
            };
            read().map_err(|err| corrupt("a webhook_dead_letters row", err))
        })
        .collect()
}

/// Every dead letter of the subscription (up to `limit`), oldest first.
pub async fn dead_letters(tx: &mut Tx, id: &str, limit: i64) -> AppResult<Vec<DeadLetterRow>> {
    dead_letters_where(tx, id, Which::All, limit).await
}

/// The dead letters queued for a replay, oldest first.
pub async fn queued_dead_letters(tx: &mut Tx, id: &str, limit: i64) -> AppResult<Vec<DeadLetterRow>> {
    dead_letters_where(tx, id, Which::Queued, limit).await
}
