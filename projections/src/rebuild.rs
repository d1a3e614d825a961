//! Rebuilding a projection from the log: into a scratch schema to compare with the live tables, or into shadow
//! tables that replace the live ones in one short transaction (a forced rebuild, while the live ones serve).

use bc_eventstore::events;
use bc_eventstore::{Db, Error, Position, Result, Tx, TxOptions};
use sqlx::AssertSqlSafe;

use crate::framework::{Envelope, MAX_BATCH, Projection, lock_checkpoint};

fn check_identifier(name: &str) -> Result<()> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
        return Err(Error::InvalidArgument(format!("{name:?} must be lower-case letters, digits and '_'")));
    }
    Ok(())
}

/// Creates `schema` with empty copies of the projection's tables (constraints and indexes included), and puts
/// it first on the transaction's `search_path`.
pub async fn create_shadow(tx: &mut Tx, projection: &dyn Projection, schema: &str) -> Result<()> {
    check_identifier(schema)?;
    let mut ddl = format!("CREATE SCHEMA {schema};");
    for table in projection.tables() {
        check_identifier(table)?;
        ddl.push_str(&format!(" CREATE TABLE {schema}.{table} (LIKE public.{table} INCLUDING ALL);"));
    }
    ddl.push_str(&format!(" SET LOCAL search_path = {schema}, public;"));
    sqlx::raw_sql(AssertSqlSafe(ddl)).execute(tx.conn()).await?;
    Ok(())
}

/// Applies every event of the projection's types after `after` and up to `until` to the tables on the
/// transaction's `search_path`, in batches. Returns the events applied.
pub async fn replay(
    tx: &mut Tx,
    projection: &dyn Projection,
    after: Position,
    until: Position,
    progress: &(dyn Fn(u64) + Send + Sync),
) -> Result<u64> {
    let mut cursor = after;
    let mut applied = 0;
    loop {
        let batch = events::read_range(tx, cursor, until, MAX_BATCH).await?;
        let Some(last) = batch.last() else { break };
        cursor = last.position;
        let mut envelopes = Vec::with_capacity(batch.len());
        for event in batch {
            if projection.handles(&event.event_type) {
                envelopes.push(Envelope::decode_for(projection, event)?);
            }
        }
        projection.apply(tx, &envelopes).await?;
        applied += envelopes.len() as u64;
        progress(applied);
    }
    Ok(applied)
}

/// Rows that differ between a live table and its copy in `schema`, both ways, compared as their text (a `json`
/// column has no equality operator).
pub async fn differences(tx: &mut Tx, schema: &str, table: &str) -> Result<i64> {
    check_identifier(schema)?;
    check_identifier(table)?;
    let query = format!(
        "SELECT count(*) FROM ((SELECT t::text FROM public.{table} AS t EXCEPT ALL SELECT t::text FROM {schema}.{table} AS t)
                               UNION ALL (SELECT t::text FROM {schema}.{table} AS t
                                          EXCEPT ALL SELECT t::text FROM public.{table} AS t)) AS d"
    );
    Ok(sqlx::query_scalar(AssertSqlSafe(query)).persistent(false).fetch_one(tx.conn()).await?)
}

/// Rebuilds a projection version from `0-0-0` up to its checkpoint in a scratch schema and compares it with the
/// live tables, holding the checkpoint's lock so the daemon waits. Returns the differing rows per table; nothing
/// is kept.
pub async fn verify(db: &Db, projection: &dyn Projection) -> Result<Vec<(String, i64)>> {
    let mut tx = db.begin(TxOptions::COMMAND).await?;
    let checkpoint = lock_checkpoint(&mut tx, projection.name(), projection.version()).await?;
    let schema = format!("verify_{}_v{}", projection.name(), projection.version());
    create_shadow(&mut tx, projection, &schema).await?;
    replay(&mut tx, projection, Position::START, checkpoint.position, &|_| {}).await?;
    let mut result = Vec::new();
    for table in projection.tables() {
        result.push((table.to_string(), differences(&mut tx, &schema, table).await?));
    }
    tx.rollback().await;
    Ok(result)
}

/// Forces a rebuild of a projection version while its live tables keep serving: the tables are built from
/// `0-0-0` in a shadow schema, batch by batch, then one short transaction (holding the checkpoint's lock, so the
/// daemon waits) applies what arrived meanwhile, puts the shadow tables in place of the live ones and moves the
/// checkpoint. `progress` gets (events read, events in the log when the rebuild began). Returns events applied.
pub async fn force_rebuild(
    db: &Db,
    projection: &dyn Projection,
    progress: &(dyn Fn(u64, u64) + Send + Sync),
) -> Result<u64> {
    let schema = format!("rebuild_{}_v{}", projection.name(), projection.version());
    check_identifier(&schema)?;
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    sqlx::raw_sql(AssertSqlSafe(format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))).execute(tx.conn()).await?;
    create_shadow(&mut tx, projection, &schema).await?;
    let total: i64 =
        bc_eventstore::sql::query_scalar("SELECT count(*) FROM public.events").fetch_one(tx.conn()).await?;
    tx.commit().await?;

    let mut cursor = Position::START;
    let (mut read, mut applied) = (0u64, 0u64);
    // Batches in their own transactions: the live tables serve meanwhile.
    loop {
        let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
        // Nothing reads the shadow tables before the switch, whose commit waits for the disk (and with it every
        // earlier commit): these need not.
        bc_eventstore::sql::query("SET LOCAL synchronous_commit = off").execute(tx.conn()).await?;
        let done = shadow_batch(&mut tx, projection, &schema, &mut cursor, &mut read, &mut applied).await?;
        tx.commit().await?;
        progress(read, total.max(0) as u64);
        if done {
            break;
        }
    }
    // The switch: catch up under the checkpoint's lock, then swap the tables.
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    lock_checkpoint(&mut tx, projection.name(), projection.version()).await?;
    while !shadow_batch(&mut tx, projection, &schema, &mut cursor, &mut read, &mut applied).await? {}
    let mut swap = String::new();
    for table in projection.tables() {
        swap.push_str(&format!("DROP TABLE public.{table}; ALTER TABLE {schema}.{table} SET SCHEMA public; "));
    }
    swap.push_str(&format!("DROP SCHEMA {schema}; SET LOCAL search_path = public;"));
    sqlx::raw_sql(AssertSqlSafe(swap)).execute(tx.conn()).await?;
    bc_eventstore::sql::query(
        "UPDATE projection_checkpoints
            SET log_epoch = $3, txid = $4::text::xid8, seq = $5, events_applied = $6, events_passed = $7,
                updated_at = compute_now()
          WHERE name = $1 AND version = $2",
    )
    .bind(projection.name())
    .bind(projection.version() as i32)
    .bind(cursor.epoch as i32)
    .bind(cursor.txid.to_string())
    .bind(cursor.seq as i64)
    .bind(applied as i64)
    .bind(read as i64)
    .execute(tx.conn())
    .await?;
    tx.commit().await?;
    progress(read, read);
    Ok(applied)
}

/// One batch into the shadow schema; returns whether the horizon was reached.
async fn shadow_batch(
    tx: &mut Tx,
    projection: &dyn Projection,
    schema: &str,
    cursor: &mut Position,
    read: &mut u64,
    applied: &mut u64,
) -> Result<bool> {
    sqlx::raw_sql(AssertSqlSafe(format!("SET LOCAL search_path = {schema}, public"))).execute(tx.conn()).await?;
    let batch = events::read_after(tx, *cursor, MAX_BATCH).await?;
    let done = batch.len() < MAX_BATCH as usize;
    if let Some(last) = batch.last() {
        *cursor = last.position;
    }
    *read += batch.len() as u64;
    let mut envelopes = Vec::with_capacity(batch.len());
    for event in batch {
        if projection.handles(&event.event_type) {
            envelopes.push(Envelope::decode_for(projection, event)?);
        }
    }
    projection.apply(tx, &envelopes).await?;
    *applied += envelopes.len() as u64;
    Ok(done)
}
