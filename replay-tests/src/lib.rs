//! Replay tests: recorded event logs, checked in as data, replayed through every projection and compared with
//! checked-in snapshots (`UPDATE_EXPECT=1` rewrites them).
//!
//! A log is recorded by running a scenario (`scenarios`) through the real command handlers and exporting its
//! events as JSON lines (`cargo run -p bc-replay-tests --bin record-scenarios`). A log is loaded by appending its
//! events again, never by inserting their old positions: each gets a new position in the new database, and the
//! inline projections apply it in the same transaction, as a command would.

pub mod scenarios;

use std::time::Duration;

use anyhow::Context as _;
use bc_domain::stream::AnyEvent;
use bc_eventstore::events::{self, AppendBatch, ExpectedVersion, NewEvent};
use bc_eventstore::{Db, Position, TxOptions, clock, lease, sql};
use bc_projections::{framework, inline, models};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedLine {
    pub stream_id: String,
    pub stream_version: u32,
    pub event_type: String,
    pub schema_version: i16,
    pub tenant_id: Option<String>,
    /// Epoch milliseconds.
    pub recorded_at: i64,
    pub payload: Value,
    pub metadata: Value,
}

/// Every event of the log, in log order, as JSON lines' values.
pub async fn export(db: &Db) -> anyhow::Result<Vec<RecordedLine>> {
    let mut out = Vec::new();
    let mut cursor = Position::START;
    loop {
        let mut tx = db.begin(TxOptions::READ_ONLY).await?;
        let batch = events::read_after(&mut tx, cursor, 1_000).await?;
        tx.commit().await?;
        let Some(last) = batch.last() else { break };
        cursor = last.position;
        for event in batch {
            out.push(RecordedLine {
                payload: rmp_serde::from_slice(&event.payload).context("decode a payload")?,
                metadata: rmp_serde::from_slice(&event.metadata).context("decode metadata")?,
                stream_id: event.stream_id,
                stream_version: event.stream_version,
                event_type: event.event_type,
                schema_version: event.schema_version,
                tenant_id: event.tenant_id,
                recorded_at: event.recorded_at_ms,
            });
        }
    }
    Ok(out)
}

/// Parses a recorded log: one JSON object per line; empty lines and lines starting with `#` are comments.
pub fn parse(text: &str) -> anyhow::Result<Vec<RecordedLine>> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty() && !line.starts_with('#'))
        .map(|(n, line)| serde_json::from_str(line).with_context(|| format!("line {}", n + 1)))
        .collect()
}

/// Appends a recorded log's events again, each with its stream version as the expected one and the simulated
/// clock at its recorded time, and applies the inline projections in the same transaction.
pub async fn load(db: &Db, lines: &[RecordedLine]) -> anyhow::Result<()> {
    let Some(first) = lines.first() else { return Ok(()) };
    clock::use_sim_clock(db, first.recorded_at).await?;
    let mut now = first.recorded_at;
    for line in lines {
        if line.recorded_at > now {
            clock::set_sim_clock(db, line.recorded_at).await?;
            now = line.recorded_at;
        }
        let event = NewEvent {
            event_type: line.event_type.clone(),
            schema_version: line.schema_version,
            payload: rmp_serde::to_vec_named(&line.payload)?,
            metadata: rmp_serde::to_vec_named(&line.metadata)?,
        };
        let mut tx = db.begin(TxOptions::COMMAND).await?;
        let batch = [event];
        let append = AppendBatch {
            stream_id: &line.stream_id,
            tenant_id: line.tenant_id.as_deref(),
            expected: ExpectedVersion::Exact(line.stream_version - 1),
            events: &batch,
        };
        events::append(&mut tx, append)
            .await
            .with_context(|| format!("append {} v{}", line.stream_id, line.stream_version))?;
        if let Some(decoded) = AnyEvent::decode(&line.event_type, line.schema_version, &batch[0].payload)? {
            inline::apply(&mut tx, &line.stream_id, &decoded).await?;
        }
        tx.commit().await?;
    }
    Ok(())
}

/// Runs every read model until it has passed every event of the log.
pub async fn run_read_models(db: &Db) -> anyhow::Result<()> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let total: i64 = sql::query_scalar("SELECT count(*) FROM events").fetch_one(tx.conn()).await?;
    tx.commit().await?;
    for projection in models::read_models() {
        let held = lease::acquire(db, &projection.lease_name(), "prc_replay", Duration::from_secs(3600))
            .await?
            .context("the projection lease is held elsewhere")?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            framework::step(db, projection.as_ref(), &held, 500).await?;
            let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
            let checkpoint = framework::lock_checkpoint(&mut tx, projection.name(), projection.version()).await?;
            tx.commit().await?;
            if checkpoint.events_passed >= total {
                break;
            }
            anyhow::ensure!(tokio::time::Instant::now() < deadline, "{} never caught up", projection.name());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        lease::release(db, &held).await?;
    }
    Ok(())
}

/// Columns that depend on where an event landed in this database (positions), left out of snapshots.
const VOLATILE: &[&str] = &["log_epoch", "txid", "seq", "position"];

/// Every inline table and read-model table, each row as a JSON object without its volatile columns, sorted.
pub async fn snapshot(db: &Db) -> anyhow::Result<String> {
    let mut tables: Vec<&str> = inline::TABLES.to_vec();
    for projection in models::read_models() {
        tables.extend(projection.tables());
    }
    let mut out = String::new();
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    for table in tables {
        let mut drop = String::new();
        for column in VOLATILE {
            drop.push_str(&format!(" - '{column}'"));
        }
        let query = format!("SELECT (to_jsonb(t){drop})::text AS row FROM {table} AS t ORDER BY 1");
        let rows: Vec<String> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(query)).persistent(false).fetch_all(tx.conn()).await?;
        out.push_str(&format!("== {table} ({} rows)\n", rows.len()));
        for row in rows {
            out.push_str(&row);
            out.push('\n');
        }
    }
    tx.commit().await?;
    Ok(out)
}
