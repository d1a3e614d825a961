//! Writing large logs straight into the event log, for the benchmarks' generators: events made elsewhere (by
//! the domain's own decisions) are inserted in one statement per batch, with no expected version and no
//! inline projection. Never used by a command: commands append through [`crate::events::append`].

use crate::db::Tx;
use crate::error::Result;
use crate::sql;

/// A batch of events to load, one entry per event in each column, in log order.
#[derive(Debug, Default, Clone)]
pub struct BulkEvents {
    pub stream_ids: Vec<String>,
    pub stream_versions: Vec<i32>,
    pub event_types: Vec<&'static str>,
    pub schema_versions: Vec<i16>,
    pub tenant_ids: Vec<String>,
    pub payloads: Vec<Vec<u8>>,
    /// The 1-based index of each event's metadata in the batch's shared metadata list.
    pub metadata: Vec<i32>,
    pub recorded_at_ms: Vec<i64>,
}

impl BulkEvents {
    pub fn len(&self) -> usize {
        self.stream_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stream_ids.is_empty()
    }
}

/// Loads `events` into the log at its current epoch, in the order given, each with its metadata from
/// `metadata` (the few distinct admission contexts a generated log has).
pub async fn load_events(tx: &mut Tx, metadata: &[Vec<u8>], events: &BulkEvents) -> Result<()> {
    sql::query(
        "INSERT INTO events (log_epoch, stream_id, stream_version, event_type, schema_version, tenant_id, payload,
                             metadata, recorded_at)
         SELECT (SELECT epoch FROM event_log_epoch), u.stream_id, u.version, u.event_type, u.schema_version,
                u.tenant_id, u.payload, ($7::bytea[])[u.meta], ms_ts(u.at)
         FROM unnest($1::text[], $2::int4[], $3::text[], $4::int2[], $5::text[], $6::bytea[], $8::int4[], $9::int8[])
              WITH ORDINALITY AS u(stream_id, version, event_type, schema_version, tenant_id, payload, meta, at, ord)
         ORDER BY u.ord",
    )
    .bind(&events.stream_ids)
    .bind(&events.stream_versions)
    .bind(&events.event_types)
    .bind(&events.schema_versions)
    .bind(&events.tenant_ids)
    .bind(&events.payloads)
    .bind(metadata)
    .bind(&events.metadata)
    .bind(&events.recorded_at_ms)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// One event of a stream that [`load_repeated`] writes for every stream.
#[derive(Debug, Clone, Copy)]
pub struct Template<'a> {
    pub event_type: &'a str,
    pub payload: &'a [u8],
    pub metadata: &'a [u8],
}

/// Loads `streams` streams of the tenant `tenant_id`, named `<prefix><n>` with `n` zero-padded to `width`, each
/// holding `templates` in order as versions 1, 2, ...: a large log generated in the database itself.
pub async fn load_repeated(
    tx: &mut Tx,
    streams: i64,
    prefix: &str,
    width: i32,
    tenant_id: &str,
    templates: &[Template<'_>],
) -> Result<()> {
    let types: Vec<&str> = templates.iter().map(|t| t.event_type).collect();
    let payloads: Vec<&[u8]> = templates.iter().map(|t| t.payload).collect();
    let metadata: Vec<&[u8]> = templates.iter().map(|t| t.metadata).collect();
    sql::query(
        "INSERT INTO events (log_epoch, stream_id, stream_version, event_type, schema_version, tenant_id, payload,
                             metadata)
         SELECT (SELECT epoch FROM event_log_epoch), $5 || lpad(n::text, $6, '0'), t.v, t.event_type, 1, $7,
                t.payload, t.metadata
         FROM generate_series(1, $1::int8) AS n,
              unnest($2::text[], $3::bytea[], $4::bytea[]) WITH ORDINALITY AS t(event_type, payload, metadata, v)
         ORDER BY n, t.v",
    )
    .bind(streams)
    .bind(&types)
    .bind(&payloads)
    .bind(&metadata)
    .bind(prefix)
    .bind(width)
    .bind(tenant_id)
    .execute(tx.conn())
    .await?;
    Ok(())
}
