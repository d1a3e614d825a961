//! What the read models that keep an aggregate's fold share: reading folded rows back and writing them.

use bc_eventstore::{Error, Result, Tx};
use serde::de::DeserializeOwned;

/// The folded states of `ids` in `table` (a table of this crate's read models), by id.
pub(crate) async fn load<T: DeserializeOwned>(
    tx: &mut Tx,
    table: &'static str,
    key: &'static str,
    ids: &[&str],
) -> Result<Vec<(String, T)>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let query = format!("SELECT {key}, folded::text FROM {table} WHERE {key} = ANY($1::text[])");
    let rows: Vec<(String, String)> =
        sqlx::query_as(sqlx::AssertSqlSafe(query)).persistent(false).bind(ids).fetch_all(tx.conn()).await?;
    rows.into_iter().map(|(id, text)| Ok((id.clone(), read(table, &id, &text)?))).collect()
}

/// A folded state as stored, read back.
pub fn read<T: DeserializeOwned>(table: &str, id: &str, text: &str) -> Result<T> {
    serde_json::from_str(text)
        .map_err(|err| Error::Internal(format!("{table}.folded of {id} does not read back: {err}")))
}

/// Deletes the rows of `ids` from `table`.
pub(crate) async fn delete(tx: &mut Tx, table: &'static str, key: &'static str, ids: &[&str]) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let query = format!("DELETE FROM {table} WHERE {key} = ANY($1::text[])");
    sqlx::query(sqlx::AssertSqlSafe(query)).persistent(false).bind(ids).execute(tx.conn()).await?;
    Ok(())
}
