//! The event log: append a batch to one stream with an expected version, read a stream by version, read the
//! log after a position, and subscribe (catch up, then poll).
//!
//! Readers never trust `seq` alone, since commit order is not `seq` order. They read the rows after their
//! cursor in `(log_epoch, txid, seq)` order, limited to rows that no transaction still running can precede:
//! an older epoch, or a `txid` below the snapshot's `xmin`. Nothing can then commit behind a cursor, so no
//! reader ever skips an event.

use std::time::Duration;

use bc_domain::event::{EncodeError, EventMetadata, Upcasters, decode_payload};
use futures_core::Stream;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::db::{Db, Tx, TxOptions};
use crate::error::{Error, Result};
use crate::position::Position;
use crate::sql;

/// An event to append, already encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    /// `<aggregate>.<past tense>`, such as `reservation.placed`.
    pub event_type: String,
    /// The version of this event type's payload shape.
    pub schema_version: i16,
    /// MessagePack map (`rmp_serde::to_vec_named`).
    pub payload: Vec<u8>,
    /// MessagePack of [`EventMetadata`].
    pub metadata: Vec<u8>,
}

impl NewEvent {
    /// Encodes `payload` and `metadata` as MessagePack maps.
    pub fn encode<T: Serialize + ?Sized>(
        event_type: &str,
        schema_version: i16,
        payload: &T,
        metadata: &EventMetadata,
    ) -> Result<Self, EncodeError> {
        Ok(Self {
            event_type: event_type.to_owned(),
            schema_version,
            payload: bc_domain::event::encode("event payload", payload)?,
            metadata: metadata.encode()?,
        })
    }
}

/// The stream version an append expects to find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpectedVersion {
    /// The stream's head must be exactly this version; `Exact(0)` means the stream must not exist yet.
    Exact(u32),
    /// Append after whatever the head is. Concurrent appenders still never write the same version.
    Any,
}

impl ExpectedVersion {
    pub const NO_STREAM: ExpectedVersion = ExpectedVersion::Exact(0);
}

/// A batch of events for one stream.
#[derive(Debug, Clone, Copy)]
pub struct AppendBatch<'a> {
    pub stream_id: &'a str,
    /// The owner tenant, copied onto every event for filtering and isolation.
    pub tenant_id: Option<&'a str>,
    pub expected: ExpectedVersion,
    pub events: &'a [NewEvent],
}

/// Where an appended batch landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub first_version: u32,
    pub last_version: u32,
    /// The position of the batch's last event: the consistency token a command returns.
    pub position: Position,
}

/// The append statement, a call of the `append_events` function (`core/0002_events`): `$1` stream, `$2` tenant,
/// `$3` expected version (NULL for any), `$4`..`$7` the events' types, schema versions, payloads and metadata
/// as arrays. Public so that the benchmark runs the very same SQL through pgbench.
pub const APPEND_SQL: &str = "SELECT head, log_epoch, txid, seq, stream_version
     FROM append_events($1, $2, $3, $4::text[], $5::int2[], $6::bytea[], $7::bytea[])";

/// Appends a batch to one stream in one statement. If the stream's head is not the expected version, nothing
/// is written and the answer is [`Error::Conflict`]; so is losing a race with a concurrent appender of the
/// same version (the unique `(stream_id, stream_version)` key refuses the second).
///
/// Not cancel-safe in the sense that matters: once sent, the statement may have run. The transaction is
/// what makes it atomic.
pub async fn append(tx: &mut Tx, batch: AppendBatch<'_>) -> Result<Appended> {
    check_batch(&batch)?;
    let expected = expected_version(batch.expected)?;
    // One message of the simple query protocol (one round trip), where a statement of the extended protocol takes
    // two (Parse and Describe, then Bind and Execute): the same function and arguments as `APPEND_SQL`.
    let call = append_call("append_events", &batch, expected);
    let answer = match tx.call(&call).await {
        Ok(answer) => answer,
        Err(Error::Database(err)) => return Err(conflict_on_unique_violation(err, batch.stream_id, batch.expected)),
        Err(other) => return Err(other),
    };
    let answer = answer.ok_or_else(|| Error::Internal("the append answered NULL".to_owned()))?;
    let (head, landed) = parse_appended(&answer)?;
    let Some((last_version, position)) = landed else {
        return Err(Error::Conflict {
            stream_id: batch.stream_id.to_owned(),
            expected: expected.map_or(0, |v| v as u32),
            actual: Some(head),
        });
    };
    tx.mark_appended(position);
    Ok(Appended { first_version: head + 1, last_version, position })
}

/// A call of `function` (`append_events` or `append_events_or_refuse`, which take the same arguments) for `batch`.
fn append_call(function: &'static str, batch: &AppendBatch<'_>, expected: Option<i32>) -> sql::Call {
    let Columns { event_types, schema_versions, payloads, metadata } = Columns::of(batch);
    sql::Call::new(function)
        .text(batch.stream_id)
        .opt_text(batch.tenant_id)
        .opt_int4(expected)
        .texts(&event_types)
        .int2s(&schema_versions)
        .byteas(&payloads)
        .byteas(&metadata)
}

/// Reads `append_events`' answer as a record's text, `(head,log_epoch,txid,seq,stream_version)`: the head it
/// found, and where the batch landed (its last version and position) unless the head was not the expected one
/// (every field after the head empty, for NULL).
fn parse_appended(text: &str) -> Result<(u32, Option<(u32, Position)>)> {
    let bad = || Error::Internal(format!("the append answered {text:?}"));
    let inner = text.strip_prefix('(').and_then(|t| t.strip_suffix(')')).ok_or_else(bad)?;
    let fields: Vec<&str> = inner.split(',').collect();
    let [head, epoch, txid, seq, version] = fields.as_slice() else { return Err(bad()) };
    let head = head.parse::<u32>().map_err(|_| bad())?;
    if version.is_empty() {
        return Ok((head, None));
    }
    let epoch = epoch.parse::<i32>().map_err(|_| bad())?;
    let seq = seq.parse::<i64>().map_err(|_| bad())?;
    let version = version.parse::<u32>().map_err(|_| bad())?;
    let position = Position::from_row(epoch, txid, seq).map_err(|err| Error::Internal(err.to_string()))?;
    Ok((head, Some((version, position))))
}

/// SQLSTATE `BC409`: `append_events_or_refuse` found the stream's head elsewhere than expected.
const HEAD_MOVED: &str = "BC409";

/// Appends a batch and runs `then` after it in the same transaction, all in one round trip (one message of the
/// simple query protocol): the way a command writes its events and every inline table they change at once. The
/// append refuses a head that is not the expected one with an error, so nothing of `then` runs without it; that
/// and losing the race for a version are [`Error::Conflict`], as from [`append`]. Answers where the batch landed
/// and what each call of `then` answered, in order.
pub async fn append_with(
    tx: &mut Tx,
    batch: AppendBatch<'_>,
    then: &[sql::Call],
) -> Result<(Appended, Vec<Option<String>>)> {
    check_batch(&batch)?;
    let expected = expected_version(batch.expected)?;
    let append = append_call("append_events_or_refuse", &batch, expected);
    let mut calls = Vec::with_capacity(then.len() + 1);
    calls.push(append);
    calls.extend_from_slice(then);
    let mut answers = tx.calls(&calls).await.map_err(|err| append_error(err, &batch))?;
    let landed = answers.remove(0).ok_or_else(|| Error::Internal("the append answered NULL".to_owned()))?;
    let appended = parse_landed(&landed)?;
    tx.mark_appended(appended.position);
    Ok((appended, answers))
}

/// Appends a batch, runs `then` after it and commits, all in the transaction's last round trip: the append and
/// `then` lead the message, the calls deferred with [`Tx::defer`] follow, then COMMIT. For a command whose events
/// are its last writes and whose answer needs only where they landed: it saves the round trip [`append_with`]
/// takes before the commit. `follow_ups[i]`, when set, names the function `then[i]`'s answer (a JSON array) is
/// handed to after the commit ([`Tx::follow_up`]). `first`, when given, runs ahead of the append in the same
/// message: a check that raises when what the events rely on is gone (a placement's lock of its atoms), so that
/// nothing after it is written. Errors as from [`append_with`] (and `first`'s own), and the transaction is then
/// rolled back; a failing COMMIT is the answer as from [`Tx::commit`]. Answers where the batch landed and what each
/// call of `then` answered.
pub async fn append_and_commit(
    tx: Tx,
    batch: AppendBatch<'_>,
    first: Option<&sql::Call>,
    then: &[sql::Call],
    follow_ups: &[Option<&'static str>],
) -> Result<(Appended, Vec<Option<String>>)> {
    let checked = check_batch(&batch).and_then(|()| expected_version(batch.expected));
    let expected = match checked {
        Ok(expected) => expected,
        Err(err) => {
            tx.rollback().await;
            return Err(err);
        }
    };
    let mut statements = Vec::with_capacity(then.len() + 2);
    statements.extend(first.map(sql::Call::statement));
    let append_at = statements.len();
    statements.push(append_call("append_events_or_refuse", &batch, expected).statement());
    statements.extend(then.iter().map(sql::Call::statement));
    let lead = crate::db::Lead {
        statements,
        append_at,
        follow_ups: follow_ups.to_vec(),
        landed: |text| parse_landed(text).map(|appended| appended.position),
    };
    let mut answers = tx.commit_leading(lead).await.map_err(|err| append_error(err, &batch))?;
    // What `first` and the append answered, then what each call of `then` did.
    let then_answers = answers.split_off(append_at + 1);
    let landed = answers.pop().flatten().ok_or_else(|| Error::Internal("the append answered NULL".to_owned()))?;
    Ok((parse_landed(&landed)?, then_answers))
}

/// What a failed `append_events_or_refuse` (with what ran in its message) answers: a moved head, or a lost race for
/// a version, is a [`Error::Conflict`]; anything else is as it came.
fn append_error(err: Error, batch: &AppendBatch<'_>) -> Error {
    match err {
        Error::Database(err) if crate::error::sql_state(&err).as_deref() == Some(HEAD_MOVED) => Error::Conflict {
            stream_id: batch.stream_id.to_owned(),
            expected: match batch.expected {
                ExpectedVersion::Exact(version) => version,
                ExpectedVersion::Any => 0,
            },
            actual: None,
        },
        Error::Database(err) => conflict_on_unique_violation(err, batch.stream_id, batch.expected),
        other => other,
    }
}

/// Reads `append_events_or_refuse`'s answer: `head last_version epoch txid seq`.
fn parse_landed(text: &str) -> Result<Appended> {
    let bad = || Error::Internal(format!("the append answered {text:?}"));
    let parts: Vec<&str> = text.split(' ').collect();
    let [head, last, epoch, txid, seq] = parts.as_slice() else { return Err(bad()) };
    let number = |part: &str| part.parse::<i64>().map_err(|_| bad());
    let (head, last) = (number(head)?, number(last)?);
    let position = Position::from_row(i32::try_from(number(epoch)?).map_err(|_| bad())?, txid, number(seq)?)
        .map_err(|err| Error::Internal(err.to_string()))?;
    Ok(Appended {
        first_version: u32::try_from(head + 1).map_err(|_| bad())?,
        last_version: u32::try_from(last).map_err(|_| bad())?,
        position,
    })
}

/// A batch's events as the parallel arrays `append_events` takes.
struct Columns<'a> {
    event_types: Vec<&'a str>,
    schema_versions: Vec<i16>,
    payloads: Vec<&'a [u8]>,
    metadata: Vec<&'a [u8]>,
}

impl<'a> Columns<'a> {
    fn of(batch: &AppendBatch<'a>) -> Columns<'a> {
        Columns {
            event_types: batch.events.iter().map(|e| e.event_type.as_str()).collect(),
            schema_versions: batch.events.iter().map(|e| e.schema_version).collect(),
            payloads: batch.events.iter().map(|e| e.payload.as_slice()).collect(),
            metadata: batch.events.iter().map(|e| e.metadata.as_slice()).collect(),
        }
    }
}

fn check_batch(batch: &AppendBatch<'_>) -> Result<()> {
    if batch.events.is_empty() {
        return Err(Error::InvalidArgument(format!("an append to {} carries no events", batch.stream_id)));
    }
    if batch.stream_id.is_empty() {
        return Err(Error::InvalidArgument("an append names no stream".to_owned()));
    }
    Ok(())
}

fn expected_version(expected: ExpectedVersion) -> Result<Option<i32>> {
    match expected {
        ExpectedVersion::Exact(version) => Ok(Some(
            i32::try_from(version)
                .map_err(|_| Error::InvalidArgument(format!("expected version {version} is out of range")))?,
        )),
        ExpectedVersion::Any => Ok(None),
    }
}

fn conflict_on_unique_violation(err: sqlx::Error, stream_id: &str, expected: ExpectedVersion) -> Error {
    if crate::error::is_version_race(&err) {
        let expected = match expected {
            ExpectedVersion::Exact(version) => version,
            ExpectedVersion::Any => 0,
        };
        return Error::Conflict { stream_id: stream_id.to_owned(), expected, actual: None };
    }
    err.into()
}

/// An event as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedEvent {
    pub position: Position,
    pub stream_id: String,
    pub stream_version: u32,
    pub event_type: String,
    pub schema_version: i16,
    pub tenant_id: Option<String>,
    pub payload: Vec<u8>,
    pub metadata: Vec<u8>,
    /// When it was recorded (`compute_now()` of the appending transaction), in epoch milliseconds.
    pub recorded_at_ms: i64,
}

impl RecordedEvent {
    /// Decodes the payload, after bringing an old schema version up to date through `upcasters`.
    pub fn decode<T: DeserializeOwned>(&self, upcasters: &Upcasters) -> Result<T> {
        let (version, payload) = upcasters.upcast(&self.event_type, self.schema_version, &self.payload)?;
        Ok(decode_payload(&self.event_type, version, &payload)?)
    }

    pub fn metadata(&self) -> Result<EventMetadata> {
        Ok(EventMetadata::decode(&self.metadata)?)
    }

    /// An event from a row whose columns are, in this order, `log_epoch, txid` (as text: sqlx knows no `xid8`, and
    /// looking its type up runs a query that drops the unnamed statement being read), `seq, stream_id,
    /// stream_version, event_type, schema_version, tenant_id, payload, metadata, recorded_at`, the rest as stored
    /// (every read of the log selects them so). Read by place, not name: a lookup by name hashes the name, eleven
    /// times a row.
    fn from_row(row: &PgRow) -> Result<Self> {
        let position = Position::from_row(row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)
            .map_err(|err| Error::Internal(err.to_string()))?;
        let stream_version: i32 = row.try_get(4)?;
        Ok(Self {
            position,
            stream_id: row.try_get(3)?,
            stream_version: stream_version as u32,
            event_type: row.try_get(5)?,
            schema_version: row.try_get(6)?,
            tenant_id: row.try_get(7)?,
            payload: row.try_get(8)?,
            metadata: row.try_get(9)?,
            // As stored, not `extract(epoch ...)`, which cost about half of a log read's execution on the server.
            recorded_at_ms: sql::timestamp_ms(row, 10)?,
        })
    }
}

/// Reads up to `limit` events of one stream after `after_version`, in version order. Meant for loading an
/// aggregate inside the command's transaction, so it sees exactly that transaction's snapshot.
pub async fn read_stream(tx: &mut Tx, stream_id: &str, after_version: u32, limit: u32) -> Result<Vec<RecordedEvent>> {
    let rows = sql::query(
        "SELECT log_epoch, txid::text AS txid, seq, stream_id, stream_version, event_type, schema_version,
                tenant_id, payload, metadata, recorded_at
         FROM events
         WHERE stream_id = $1 AND stream_version > $2
         ORDER BY stream_version
         LIMIT $3",
    )
    .bind(stream_id)
    .bind(i64::from(after_version))
    .bind(i64::from(limit))
    .fetch_all(tx.conn())
    .await?;
    rows.iter().map(RecordedEvent::from_row).collect()
}

/// The last event of a stream, if it has any: one index probe.
pub async fn last_of_stream(tx: &mut Tx, stream_id: &str) -> Result<Option<RecordedEvent>> {
    let row = sql::query(
        "SELECT log_epoch, txid::text AS txid, seq, stream_id, stream_version, event_type, schema_version,
                tenant_id, payload, metadata, recorded_at
         FROM events
         WHERE stream_id = $1
         ORDER BY stream_version DESC
         LIMIT 1",
    )
    .bind(stream_id)
    .fetch_optional(tx.conn())
    .await?;
    row.as_ref().map(RecordedEvent::from_row).transpose()
}

/// The version of a stream's last event, `0` when the stream does not exist.
pub async fn stream_version(tx: &mut Tx, stream_id: &str) -> Result<u32> {
    let version: i32 = sql::query_scalar("SELECT coalesce(max(stream_version), 0) FROM events WHERE stream_id = $1")
        .bind(stream_id)
        .fetch_one(tx.conn())
        .await?;
    Ok(version as u32)
}

/// Reads up to `limit` events after `after`, in log order, stopping at the horizon: only events that no
/// transaction still running can precede. Events not returned now will be returned by a later call with
/// the same cursor; none is ever skipped.
pub async fn read_after(tx: &mut Tx, after: Position, limit: u32) -> Result<Vec<RecordedEvent>> {
    read_after_selected(tx, after, limit, Selection::EVERYTHING).await
}

/// Which parts of each event a reader of the log needs beyond its position, stream, type and tenant: the rest
/// is not sent, and reads back empty. A read model that handles a few types, or reads the payload of fewer, asks
/// for those alone, and what it skips costs neither the server's sending nor the client's copying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Selection<'a> {
    /// The types whose metadata is read (`None`: every type).
    pub metadata_of: Option<&'a [&'a str]>,
    /// The types whose payload is read (`None`: every type whose metadata is read).
    pub payload_of: Option<&'a [&'a str]>,
    /// The one tenant whose events are read whole (`None`: every tenant's): a reader that shows one tenant its
    /// events gets the others' without payload or metadata.
    pub tenant: Option<&'a str>,
}

impl Selection<'_> {
    /// Every part of every event.
    pub const EVERYTHING: Selection<'static> = Selection { metadata_of: None, payload_of: None, tenant: None };
}

/// [`read_after`], sending of each event only what `selection` asks for: the payload and metadata of the others
/// read back empty. The events returned, their order and the horizon are the same.
pub async fn read_after_selected(
    tx: &mut Tx,
    after: Position,
    limit: u32,
    selection: Selection<'_>,
) -> Result<Vec<RecordedEvent>> {
    let (epoch, txid, seq) = after.binds();
    let rows = sql::query(
        "SELECT e.log_epoch, e.txid::text AS txid, e.seq, e.stream_id, e.stream_version, e.event_type,
                e.schema_version, e.tenant_id,
                CASE WHEN ($5::text[] IS NULL OR e.event_type = ANY($5::text[]))
                          AND ($6::text[] IS NULL OR e.event_type = ANY($6::text[]))
                          AND ($7::text IS NULL OR e.tenant_id = $7::text)
                     THEN e.payload ELSE ''::bytea END AS payload,
                CASE WHEN ($5::text[] IS NULL OR e.event_type = ANY($5::text[]))
                          AND ($7::text IS NULL OR e.tenant_id = $7::text)
                     THEN e.metadata ELSE ''::bytea END AS metadata,
                e.recorded_at
         FROM events AS e
         WHERE (e.log_epoch, e.txid, e.seq) > ($1, $2::text::xid8, $3)
           AND (e.log_epoch < (SELECT epoch FROM event_log_epoch)
                OR e.txid < pg_snapshot_xmin(pg_current_snapshot()))
         ORDER BY e.log_epoch, e.txid, e.seq
         LIMIT $4",
    )
    .bind(epoch)
    .bind(txid)
    .bind(seq)
    .bind(i64::from(limit))
    .bind(selection.metadata_of)
    .bind(selection.payload_of)
    .bind(selection.tenant)
    .fetch_all(tx.conn())
    .await?;
    rows.iter().map(RecordedEvent::from_row).collect()
}

/// Reads up to `limit` of `tenant`'s events after `after` and up to `until` (inclusive), in log order, found
/// through `index`: a table of positions (`log_epoch`, `txid`, `seq`) by `tenant_id`, indexed on
/// `(tenant_id, log_epoch, txid, seq)`, that lists every event up to `until` (a read model's table, up to its
/// checkpoint). The other tenants' events are not read at all. `index` is a table name the caller chose, never
/// input. No horizon: `until` is a position a checkpoint already reached, where nothing can still commit.
pub async fn read_tenant_range_through(
    tx: &mut Tx,
    index: &str,
    tenant: &str,
    after: Position,
    until: Position,
    limit: u32,
) -> Result<Vec<RecordedEvent>> {
    let (epoch, txid, seq) = after.binds();
    let (until_epoch, until_txid, until_seq) = until.binds();
    let query = format!(
        "SELECT e.log_epoch, e.txid::text AS txid, e.seq, e.stream_id, e.stream_version, e.event_type,
                e.schema_version, e.tenant_id, e.payload, e.metadata,
                e.recorded_at
         FROM {index} AS i
         JOIN events AS e ON (e.log_epoch, e.txid, e.seq) = (i.log_epoch, i.txid, i.seq)
         WHERE i.tenant_id = $7
           AND (i.log_epoch, i.txid, i.seq) > ($1, $2::text::xid8, $3)
           AND (i.log_epoch, i.txid, i.seq) <= ($4, $5::text::xid8, $6)
         ORDER BY i.log_epoch, i.txid, i.seq
         LIMIT $8"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(query))
        .persistent(false)
        .bind(epoch)
        .bind(txid)
        .bind(seq)
        .bind(until_epoch)
        .bind(until_txid)
        .bind(until_seq)
        .bind(tenant)
        .bind(i64::from(limit))
        .fetch_all(tx.conn())
        .await?;
    rows.iter().map(RecordedEvent::from_row).collect()
}

/// Reads up to `limit` events after `after` and up to `until` (inclusive), in log order. No horizon: meant for
/// a range a checkpoint already reached, where nothing can still commit.
pub async fn read_range(tx: &mut Tx, after: Position, until: Position, limit: u32) -> Result<Vec<RecordedEvent>> {
    let (epoch, txid, seq) = after.binds();
    let (until_epoch, until_txid, until_seq) = until.binds();
    let rows = sql::query(
        "SELECT e.log_epoch, e.txid::text AS txid, e.seq, e.stream_id, e.stream_version, e.event_type,
                e.schema_version, e.tenant_id, e.payload, e.metadata,
                e.recorded_at
         FROM events AS e
         WHERE (e.log_epoch, e.txid, e.seq) > ($1, $2::text::xid8, $3)
           AND (e.log_epoch, e.txid, e.seq) <= ($4, $5::text::xid8, $6)
         ORDER BY e.log_epoch, e.txid, e.seq
         LIMIT $7",
    )
    .bind(epoch)
    .bind(txid)
    .bind(seq)
    .bind(until_epoch)
    .bind(until_txid)
    .bind(until_seq)
    .bind(i64::from(limit))
    .fetch_all(tx.conn())
    .await?;
    rows.iter().map(RecordedEvent::from_row).collect()
}

/// Waits, up to `within`, until every event this transaction can see is behind the horizon, so that
/// [`read_after`] returns all of them: transactions that began before the last of them (in any database of the
/// cluster, since the horizon is the cluster's oldest running transaction) have ended. The horizon moves
/// only between statements, so the transaction must be READ COMMITTED, and must not have appended events itself.
pub async fn wait_for_horizon(tx: &mut Tx, within: Duration) -> Result<()> {
    let isolation: String =
        sql::query_scalar("SELECT current_setting('transaction_isolation')").fetch_one(tx.conn()).await?;
    if isolation != "read committed" {
        return Err(Error::InvalidArgument(format!(
            "waiting for the horizon needs a READ COMMITTED transaction, not {isolation}: its snapshot never moves"
        )));
    }
    let deadline = std::time::Instant::now() + within;
    let mut pause = Duration::from_millis(5);
    loop {
        let beyond: bool = sql::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM events
                            WHERE log_epoch = (SELECT epoch FROM event_log_epoch)
                              AND txid >= pg_snapshot_xmin(pg_current_snapshot()))",
        )
        .fetch_one(tx.conn())
        .await?;
        if !beyond {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(Error::Internal(format!(
                "events stayed beyond the horizon for {within:?}: a transaction older than they are is still running"
            )));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// The position of the last event a reader can see now (below the horizon), or [`Position::START`].
pub async fn horizon_head(tx: &mut Tx) -> Result<Position> {
    let row = sql::query(
        "SELECT e.log_epoch, e.txid::text AS txid, e.seq
         FROM events AS e
         WHERE e.log_epoch < (SELECT epoch FROM event_log_epoch)
            OR e.txid < pg_snapshot_xmin(pg_current_snapshot())
         ORDER BY e.log_epoch DESC, e.txid DESC, e.seq DESC
         LIMIT 1",
    )
    .fetch_optional(tx.conn())
    .await?;
    match row {
        Some(row) => Position::from_row(row.try_get("log_epoch")?, row.try_get("txid")?, row.try_get("seq")?)
            .map_err(|err| Error::Internal(err.to_string())),
        None => Ok(Position::START),
    }
}

/// The position of the last event a reader can see now, and whether any event after `after` up to it is of one
/// of `families` (the part of its type before the dot: `tenant` for `tenant.created`). A follower that only
/// needs to know that something of a kind changed moves its cursor to the position without reading the events.
pub async fn changed_since(tx: &mut Tx, after: Position, families: &[&str]) -> Result<(Position, bool)> {
    let head = horizon_head(tx).await?;
    if head <= after {
        return Ok((after, false));
    }
    let (epoch, txid, seq) = after.binds();
    let (head_epoch, head_txid, head_seq) = head.binds();
    let families: Vec<String> = families.iter().map(|f| (*f).to_owned()).collect();
    let changed: bool = sql::query_scalar(
        "SELECT EXISTS (
             SELECT 1 FROM events AS e
             WHERE (e.log_epoch, e.txid, e.seq) > ($1, $2::text::xid8, $3)
               AND (e.log_epoch, e.txid, e.seq) <= ($4, $5::text::xid8, $6)
               AND split_part(e.event_type, '.', 1) = ANY($7))",
    )
    .bind(epoch)
    .bind(txid)
    .bind(seq)
    .bind(head_epoch)
    .bind(head_txid)
    .bind(head_seq)
    .bind(&families)
    .fetch_one(tx.conn())
    .await?;
    Ok((head, changed))
}

/// The log's current epoch.
pub async fn current_epoch(tx: &mut Tx) -> Result<u32> {
    let epoch: i32 = sql::query_scalar("SELECT epoch FROM event_log_epoch").fetch_one(tx.conn()).await?;
    Ok(epoch as u32)
}

/// Whether this log can have handed `position` out: its epoch is not past the current one, and in the current
/// epoch its transaction id was assigned already. A position past that was never given out (mistyped, or taken
/// from another deployment): a read waiting for it would wait for ever, and a stream resuming after it would
/// skip events that are still to come.
pub async fn within_log(tx: &mut Tx, position: Position) -> Result<bool> {
    let (epoch, txid, _) = position.binds();
    let within: bool = sql::query_scalar(
        "SELECT $1 < cur.epoch OR ($1 = cur.epoch AND $2::text::xid8 < pg_snapshot_xmax(pg_current_snapshot()))
         FROM event_log_epoch AS cur",
    )
    .bind(epoch)
    .bind(txid)
    .fetch_one(tx.conn())
    .await?;
    Ok(within)
}

/// Whether the current epoch holds a `txid` above this cluster's current one: the log was restored into a
/// cluster whose transaction ids start lower, and the epoch must rise before anything appends.
async fn epoch_is_behind(tx: &mut Tx) -> Result<bool> {
    let behind: bool = sql::query_scalar(
        "SELECT coalesce((SELECT e.txid >= pg_snapshot_xmax(pg_current_snapshot())
                          FROM events AS e, event_log_epoch AS cur
                          WHERE e.log_epoch = cur.epoch
                          ORDER BY e.txid DESC LIMIT 1), false)",
    )
    .fetch_one(tx.conn())
    .await?;
    Ok(behind)
}

/// Raises the epoch when the log was restored into a cluster whose transaction ids are lower, so old events
/// stay readable and new ones sort after them. Returns the new epoch when it rose. Run by `migrate`.
pub async fn raise_epoch_if_behind(tx: &mut Tx) -> Result<Option<u32>> {
    sql::query("SELECT epoch FROM event_log_epoch FOR UPDATE").execute(tx.conn()).await?;
    if !epoch_is_behind(tx).await? {
        return Ok(None);
    }
    let epoch: i32 =
        sql::query_scalar("UPDATE event_log_epoch SET epoch = epoch + 1, raised_at = compute_now() RETURNING epoch")
            .fetch_one(tx.conn())
            .await?;
    tracing::info!(epoch, "raised the event log epoch: the log's transaction ids were ahead of this cluster's");
    Ok(Some(epoch as u32))
}

/// Refuses to serve a log whose epoch must rise first (see [`raise_epoch_if_behind`]).
pub async fn check_epoch(db: &Db) -> Result<()> {
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    let behind = epoch_is_behind(&mut tx).await?;
    tx.rollback().await;
    if behind {
        return Err(Error::InvalidConfig(
            "the event log holds transaction ids ahead of this database cluster's (was it restored from a \
             logical backup?); run `better-compute migrate` to raise the log epoch before serving"
                .to_owned(),
        ));
    }
    Ok(())
}

/// How a subscription reads.
#[derive(Debug, Clone)]
pub struct SubscribeOptions {
    /// Events read per query.
    pub batch_size: u32,
    /// The pause after a read that came back short, before polling again.
    pub poll_interval: Duration,
}

impl Default for SubscribeOptions {
    fn default() -> Self {
        Self { batch_size: 500, poll_interval: Duration::from_millis(100) }
    }
}

/// Every event after `after`, in log order, once each: first what is already in the log, then new events as
/// they pass the horizon, by polling (LISTEN/NOTIFY does not work behind PgBouncer). The stream ends after
/// yielding the first error; resubscribe from the last position received.
pub fn subscribe(
    db: Db,
    after: Position,
    options: SubscribeOptions,
) -> impl Stream<Item = Result<RecordedEvent>> + Send + 'static {
    async_stream::try_stream! {
        let mut cursor = after;
        loop {
            let mut tx = db.begin(TxOptions::READ_ONLY).await?;
            let batch = read_after(&mut tx, cursor, options.batch_size).await?;
            tx.commit().await?;
            let short = batch.len() < options.batch_size as usize;
            for event in batch {
                cursor = event.position;
                yield event;
            }
            if short {
                tokio::time::sleep(options.poll_interval).await;
            }
        }
    }
}
