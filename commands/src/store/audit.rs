//! The audit checkpoints' rows (the `checkpoints` owner's `audit_checkpoints` and `audit_checkpoint_leaves`),
//! and the reads of the audit trail's active table that making and verifying them needs. The table's name is
//! the caller's (`audit_events_v<N>`, from the projection's active version), never input.

use bc_eventstore::{Position, Tx, sql};
use sqlx::{AssertSqlSafe, Row as _};

use super::corrupt;
use crate::AppResult;
use crate::reads::AuditEntry;

/// A stored checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRow {
    pub id: String,
    pub tenant_id: String,
    pub sequence: i64,
    pub hour_ms: i64,
    pub first_position: Position,
    pub last_position: Position,
    pub leaf_count: i64,
    pub root: Vec<u8>,
    pub previous_hash: Vec<u8>,
    pub hash: Vec<u8>,
    pub public_key: String,
    pub signature: Vec<u8>,
    pub made_at_ms: i64,
}

/// One leaf of a checkpoint: the entry's position and its leaf hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafRow {
    pub position: Position,
    pub leaf_hash: Vec<u8>,
}

/// A tenant whose audit trail holds entries after its last checkpoint: that checkpoint (if any) and when the
/// first entry after it was recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantBacklog {
    pub tenant_id: String,
    pub head: Option<CheckpointRow>,
    pub first_recorded_at_ms: i64,
}

const CHECKPOINT_COLUMNS: &str = "c.id, c.tenant_id, c.sequence, ts_ms(c.hour_start) AS hour_ms, c.first_position,
    c.last_position, c.leaf_count::int8 AS leaf_count, c.root, c.previous_hash, c.hash, c.public_key, c.signature,
    ts_ms(c.made_at) AS made_at_ms";

/// The entry's columns as the JSON an [`AuditEntry`] reads, like the audit trail's reads.
const ENTRY_JSON: &str = "jsonb_build_object(
    'position', a.position, 'streamId', a.stream_id, 'streamVersion', a.stream_version,
    'eventType', a.event_type, 'tenantId', a.tenant_id, 'decision', a.decision, 'reason', a.reason,
    'identity', a.identity, 'sessionKind', a.session_kind, 'agent', a.agent,
    'delegation', a.delegation, 'requestId', a.request_id,
    'admissionTenantId', a.admission_tenant_id, 'recordedAt', ts_ms(a.recorded_at))::text";

fn checkpoint_row(row: &sqlx::postgres::PgRow) -> AppResult<CheckpointRow> {
    let position = |column: &str| -> AppResult<Position> {
        let text: String = row.try_get(column)?;
        text.parse().map_err(|err| corrupt("a checkpoint's position", err))
    };
    Ok(CheckpointRow {
        id: row.try_get("id")?,
        tenant_id: row.try_get("tenant_id")?,
        sequence: row.try_get("sequence")?,
        hour_ms: row.try_get("hour_ms")?,
        first_position: position("first_position")?,
        last_position: position("last_position")?,
        leaf_count: row.try_get("leaf_count")?,
        root: row.try_get("root")?,
        previous_hash: row.try_get("previous_hash")?,
        hash: row.try_get("hash")?,
        public_key: row.try_get("public_key")?,
        signature: row.try_get("signature")?,
        made_at_ms: row.try_get("made_at_ms")?,
    })
}

fn entry(text: &str) -> AppResult<AuditEntry> {
    serde_json::from_str(text).map_err(|err| corrupt("an audit entry", err))
}

/// The tenants with entries after their last checkpoint, each with that checkpoint and the first such entry's
/// time. The tenants are found by skipping through the trail's index by tenant, one probe per tenant. (No
/// `xid8` column is answered: sqlx would look its type up between the unnamed statement's parse and bind.)
pub async fn backlogs(tx: &mut Tx, table: &str) -> AppResult<Vec<TenantBacklog>> {
    let query = format!(
        "WITH RECURSIVE t AS (
             (SELECT a.tenant_id FROM {table} AS a WHERE a.tenant_id IS NOT NULL ORDER BY a.tenant_id LIMIT 1)
             UNION ALL
             SELECT (SELECT a.tenant_id FROM {table} AS a WHERE a.tenant_id > t.tenant_id
                     ORDER BY a.tenant_id LIMIT 1)
             FROM t WHERE t.tenant_id IS NOT NULL
         )
         SELECT t.tenant_id AS backlog_tenant, ts_ms(n.recorded_at) AS first_recorded_at_ms, h.id, h.tenant_id,
                h.sequence, h.hour_ms, h.first_position, h.last_position, h.leaf_count, h.root, h.previous_hash,
                h.hash, h.public_key, h.signature, h.made_at_ms
         FROM t
         LEFT JOIN LATERAL (
             SELECT {CHECKPOINT_COLUMNS}, c.last_epoch, c.last_txid, c.last_seq FROM audit_checkpoints AS c
             WHERE c.tenant_id = t.tenant_id ORDER BY c.sequence DESC LIMIT 1
         ) AS h ON true
         JOIN LATERAL (
             SELECT a.recorded_at FROM {table} AS a
             WHERE a.tenant_id = t.tenant_id
               AND (h.id IS NULL OR (a.log_epoch, a.txid, a.seq) > (h.last_epoch, h.last_txid, h.last_seq))
             ORDER BY a.log_epoch, a.txid, a.seq LIMIT 1
         ) AS n ON true
         WHERE t.tenant_id IS NOT NULL
         ORDER BY t.tenant_id"
    );
    let rows = sqlx::query(AssertSqlSafe(query)).persistent(false).fetch_all(tx.conn()).await?;
    rows.iter()
        .map(|row| {
            let id: Option<String> = row.try_get("id")?;
            Ok(TenantBacklog {
                tenant_id: row.try_get("backlog_tenant")?,
                head: id.map(|_| checkpoint_row(row)).transpose()?,
                first_recorded_at_ms: row.try_get("first_recorded_at_ms")?,
            })
        })
        .collect()
}

/// `tenant`'s entries after `after` (all of them without), in log position order, up to the first one recorded
/// at or after `end_ms`, which is left out with everything after it.
pub async fn entries_before(
    tx: &mut Tx,
    table: &str,
    tenant: &str,
    after: Option<&Position>,
    end_ms: i64,
) -> AppResult<Vec<AuditEntry>> {
    let query = format!(
        "WITH stop AS MATERIALIZED (
             SELECT b.log_epoch, b.txid, b.seq FROM {table} AS b
             WHERE b.tenant_id = $1 AND ($2::int4 IS NULL OR (b.log_epoch, b.txid, b.seq) > ($2, $3::text::xid8, $4))
               AND b.recorded_at >= to_timestamp($5::float8 / 1000)
             ORDER BY b.log_epoch, b.txid, b.seq LIMIT 1
         )
         SELECT {ENTRY_JSON} AS entry FROM {table} AS a
         WHERE a.tenant_id = $1 AND ($2::int4 IS NULL OR (a.log_epoch, a.txid, a.seq) > ($2, $3::text::xid8, $4))
           AND NOT EXISTS (SELECT 1 FROM stop WHERE (a.log_epoch, a.txid, a.seq) >= (stop.log_epoch, stop.txid, stop.seq))
         ORDER BY a.log_epoch, a.txid, a.seq"
    );
    let rows = sqlx::query(AssertSqlSafe(query))
        .persistent(false)
        .bind(tenant)
        .bind(after.map(|p| p.epoch as i32))
        .bind(after.map(|p| p.txid.to_string()))
        .bind(after.map(|p| p.seq as i64))
        .bind(end_ms as f64)
        .fetch_all(tx.conn())
        .await?;
    rows.iter().map(|row| entry(row.try_get::<&str, _>("entry")?)).collect()
}

/// `tenant`'s entries from `first` to `last` (both included), in log position order: what a checkpoint covers.
pub async fn entries_between(
    tx: &mut Tx,
    table: &str,
    tenant: &str,
    first: &Position,
    last: &Position,
) -> AppResult<Vec<AuditEntry>> {
    let query = format!(
        "SELECT {ENTRY_JSON} AS entry FROM {table} AS a
         WHERE a.tenant_id = $1
           AND (a.log_epoch, a.txid, a.seq) >= ($2::int4, $3::text::xid8, $4::int8)
           AND (a.log_epoch, a.txid, a.seq) <= ($5::int4, $6::text::xid8, $7::int8)
         ORDER BY a.log_epoch, a.txid, a.seq"
    );
    let rows = sqlx::query(AssertSqlSafe(query))
        .persistent(false)
        .bind(tenant)
        .bind(first.epoch as i32)
        .bind(first.txid.to_string())
        .bind(first.seq as i64)
        .bind(last.epoch as i32)
        .bind(last.txid.to_string())
        .bind(last.seq as i64)
        .fetch_all(tx.conn())
        .await?;
    rows.iter().map(|row| entry(row.try_get::<&str, _>("entry")?)).collect()
}

/// The entry at `position`, if the trail holds it.
pub async fn entry_at(tx: &mut Tx, table: &str, position: &Position) -> AppResult<Option<AuditEntry>> {
    let query = format!(
        "SELECT {ENTRY_JSON} AS entry FROM {table} AS a
         WHERE (a.log_epoch, a.txid, a.seq) = ($1::int4, $2::text::xid8, $3::int8)"
    );
    let row = sqlx::query(AssertSqlSafe(query))
        .persistent(false)
        .bind(position.epoch as i32)
        .bind(position.txid.to_string())
        .bind(position.seq as i64)
        .fetch_optional(tx.conn())
        .await?;
    row.map(|row| entry(row.try_get::<&str, _>("entry")?)).transpose()
}

/// A new checkpoint and its leaves. Answers `false`, writing nothing, when the tenant already has a checkpoint
/// of that sequence number or hour (another process made it first).
pub async fn insert(tx: &mut Tx, checkpoint: &CheckpointRow, leaves: &[LeafRow]) -> AppResult<bool> {
    let (first, last) = (&checkpoint.first_position, &checkpoint.last_position);
    let inserted = sql::query(
        "INSERT INTO audit_checkpoints (id, tenant_id, sequence, hour_start, first_epoch, first_txid, first_seq,
                                        first_position, last_epoch, last_txid, last_seq, last_position, leaf_count,
                                        root, previous_hash, hash, public_key, signature)
         VALUES ($1, $2, $3, to_timestamp($4::float8 / 1000), $5, $6::text::xid8, $7, $8, $9, $10::text::xid8, $11,
                 $12, $13, $14, $15, $16, $17, $18)
         ON CONFLICT DO NOTHING",
    )
    .bind(&checkpoint.id)
    .bind(&checkpoint.tenant_id)
    .bind(checkpoint.sequence)
    .bind(checkpoint.hour_ms as f64)
    .bind(first.epoch as i32)
    .bind(first.txid.to_string())
    .bind(first.seq as i64)
    .bind(first.to_string())
    .bind(last.epoch as i32)
    .bind(last.txid.to_string())
    .bind(last.seq as i64)
    .bind(last.to_string())
    .bind(i32::try_from(checkpoint.leaf_count).map_err(|err| corrupt("a checkpoint's leaf count", err))?)
    .bind(&checkpoint.root)
    .bind(&checkpoint.previous_hash)
    .bind(&checkpoint.hash)
    .bind(&checkpoint.public_key)
    .bind(&checkpoint.signature)
    .execute(tx.conn())
    .await?
    .rows_affected();
    if inserted == 0 {
        return Ok(false);
    }
    let epochs: Vec<i32> = leaves.iter().map(|l| l.position.epoch as i32).collect();
    let txids: Vec<String> = leaves.iter().map(|l| l.position.txid.to_string()).collect();
    let seqs: Vec<i64> = leaves.iter().map(|l| l.position.seq as i64).collect();
    let hashes: Vec<&[u8]> = leaves.iter().map(|l| l.leaf_hash.as_slice()).collect();
    sql::query(
        "INSERT INTO audit_checkpoint_leaves (checkpoint_id, leaf_index, log_epoch, txid, seq, leaf_hash)
         SELECT $1, l.ord::int4 - 1, l.epoch, l.txid::xid8, l.seq, l.hash
         FROM unnest($2::int4[], $3::text[], $4::int8[], $5::bytea[]) WITH ORDINALITY AS l(epoch, txid, seq, hash, ord)",
    )
    .bind(&checkpoint.id)
    .bind(epochs)
    .bind(txids)
    .bind(seqs)
    .bind(hashes)
    .execute(tx.conn())
    .await?;
    Ok(true)
}

/// `tenant`'s checkpoints after sequence number `after` (from the first without), oldest first, at most `limit`.
pub async fn list(tx: &mut Tx, tenant: &str, after: Option<i64>, limit: i64) -> AppResult<Vec<CheckpointRow>> {
    let query = format!(
        "SELECT {CHECKPOINT_COLUMNS} FROM audit_checkpoints AS c
         WHERE c.tenant_id = $1 AND c.sequence > coalesce($2::int8, 0)
         ORDER BY c.sequence LIMIT $3"
    );
    let rows = sqlx::query(AssertSqlSafe(query))
        .persistent(false)
        .bind(tenant)
        .bind(after)
        .bind(limit)
        .fetch_all(tx.conn())
        .await?;
    rows.iter().map(checkpoint_row).collect()
}

/// Every checkpoint, or one tenant's, by tenant and then sequence number.
pub async fn all(tx: &mut Tx, tenant: Option<&str>) -> AppResult<Vec<CheckpointRow>> {
    let query = format!(
        "SELECT {CHECKPOINT_COLUMNS} FROM audit_checkpoints AS c
         WHERE $1::text IS NULL OR c.tenant_id = $1
         ORDER BY c.tenant_id, c.sequence"
    );
    let rows = sqlx::query(AssertSqlSafe(query)).persistent(false).bind(tenant).fetch_all(tx.conn()).await?;
    rows.iter().map(checkpoint_row).collect()
}

/// The checkpoint `id`, if there is one.
pub async fn get(tx: &mut Tx, id: &str) -> AppResult<Option<CheckpointRow>> {
    let query = format!("SELECT {CHECKPOINT_COLUMNS} FROM audit_checkpoints AS c WHERE c.id = $1");
    let row = sqlx::query(AssertSqlSafe(query)).persistent(false).bind(id).fetch_optional(tx.conn()).await?;
    row.as_ref().map(checkpoint_row).transpose()
}

/// A checkpoint's leaves, in order.
pub async fn leaves(tx: &mut Tx, id: &str) -> AppResult<Vec<LeafRow>> {
    let rows = sql::query(
        "SELECT l.log_epoch || '-' || l.txid::text || '-' || l.seq AS position, l.leaf_hash
         FROM audit_checkpoint_leaves AS l WHERE l.checkpoint_id = $1 ORDER BY l.leaf_index",
    )
    .bind(id)
    .fetch_all(tx.conn())
    .await?;
    rows.iter()
        .map(|row| {
            let position: String = row.try_get("position")?;
            Ok(LeafRow {
                position: position.parse().map_err(|err| corrupt("a leaf's position", err))?,
                leaf_hash: row.try_get("leaf_hash")?,
            })
        })
        .collect()
}

/// The checkpoint holding the entry at `position`, and the entry's leaf index in it.
pub async fn leaf_of(tx: &mut Tx, position: &Position) -> AppResult<Option<(String, i64)>> {
    let row = sql::query(
        "SELECT l.checkpoint_id, l.leaf_index::int8 AS leaf_index FROM audit_checkpoint_leaves AS l
         WHERE (l.log_epoch, l.txid, l.seq) = ($1::int4, $2::text::xid8, $3::int8)",
    )
    .bind(position.epoch as i32)
    .bind(position.txid.to_string())
    .bind(position.seq as i64)
    .fetch_optional(tx.conn())
    .await?;
    row.map(|row| Ok((row.try_get("checkpoint_id")?, row.try_get("leaf_index")?))).transpose()
}
