//! Images' rows: the inline `images` table, and the runtime tables that hold their bytes (`images/0001`).

use bc_eventstore::{Tx, sql};
use sqlx::Row as _;
use sqlx::postgres::PgRow;

use crate::AppResult;
use crate::store::corrupt;

/// An image as the `images` table holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRow {
    pub id: String,
    pub tenant_id: String,
    pub name: String,
    pub version: String,
    pub format: String,
    pub sha256: String,
    pub size_bytes: i64,
    pub visibility: String,
    pub signer: Option<String>,
    pub created_at_ms: i64,
}

const COLUMNS: &str = "id, tenant_id, name, version, format, sha256, size_bytes, visibility, signer,
     (extract(epoch FROM created_at) * 1000)::int8 AS created_at_ms";

fn image_row(row: &PgRow) -> AppResult<ImageRow> {
    let read = || -> Result<ImageRow, sqlx::Error> {
        Ok(ImageRow {
            id: row.try_get("id")?,
            tenant_id: row.try_get("tenant_id")?,
            name: row.try_get("name")?,
            version: row.try_get("version")?,
            format: row.try_get("format")?,
            sha256: row.try_get("sha256")?,
            size_bytes: row.try_get("size_bytes")?,
            visibility: row.try_get("visibility")?,
            signer: row.try_get("signer")?,
            created_at_ms: row.try_get("created_at_ms")?,
        })
    };
    read().map_err(|err| corrupt("an images row", err))
}

/// One image by id.
pub async fn image(tx: &mut Tx, id: &str) -> AppResult<Option<ImageRow>> {
    let query = format!("SELECT {COLUMNS} FROM images WHERE id = $1");
    let row = sqlx::query(sqlx::AssertSqlSafe(query)).persistent(false).bind(id).fetch_optional(tx.conn()).await?;
    row.as_ref().map(image_row).transpose()
}

/// The id of the image of `tenant` named `name@version`, if there is one.
pub async fn image_named(tx: &mut Tx, tenant: &str, name: &str, version: &str) -> AppResult<Option<String>> {
    Ok(sql::query_scalar("SELECT id FROM images WHERE tenant_id = $1 AND name = $2 AND version = $3")
        .bind(tenant)
        .bind(name)
        .bind(version)
        .fetch_optional(tx.conn())
        .await?)
}

/// A page of the images `tenant` sees (its own and the public ones), by id, after `after`.
pub async fn list(tx: &mut Tx, tenant: &str, after: Option<&str>, limit: u32) -> AppResult<Vec<ImageRow>> {
    let query = format!(
        "SELECT {COLUMNS} FROM images
         WHERE (tenant_id = $1 OR visibility = 'public') AND ($2::text IS NULL OR id > $2)
         ORDER BY id LIMIT $3"
    );
    let rows = sqlx::query(sqlx::AssertSqlSafe(query))
        .persistent(false)
        .bind(tenant)
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(tx.conn())
        .await?;
    rows.iter().map(image_row).collect()
}

/// Starts an upload owned by `tenant`.
pub async fn begin_upload(tx: &mut Tx, id: &str, tenant: &str) -> AppResult<()> {
    sql::query(
        "INSERT INTO image_uploads (id, tenant_id, started_at, touched_at) VALUES ($1, $2, compute_now(), compute_now())",
    )
    .bind(id)
    .bind(tenant)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// Writes one chunk of an upload, and marks the upload as alive.
pub async fn write_chunk(tx: &mut Tx, upload: &str, seq: i32, data: &[u8]) -> AppResult<()> {
    sql::query(
        "WITH chunk AS (INSERT INTO image_chunks (upload_id, seq, data) VALUES ($1, $2, $3))
         UPDATE image_uploads SET touched_at = compute_now() WHERE id = $1",
    )
    .bind(upload)
    .bind(seq)
    .bind(data)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// Records `upload` as the bytes of `sha256`, unless another upload already holds them: whether it did. The
/// blob's row is written either way, so a concurrent deletion of the last image with these bytes (which
/// deletes the row) and this command conflict, and the loser is retried on what the winner committed.
pub async fn store_blob(tx: &mut Tx, sha256: &str, size_bytes: i64, upload: &str) -> AppResult<bool> {
    let holder: String = sql::query_scalar(
        "INSERT INTO image_blobs (sha256, size_bytes, upload_id, stored_at) VALUES ($1, $2, $3, compute_now())
         ON CONFLICT (sha256) DO UPDATE SET sha256 = image_blobs.sha256 RETURNING upload_id",
    )
    .bind(sha256)
    .bind(size_bytes)
    .bind(upload)
    .fetch_one(tx.conn())
    .await?;
    Ok(holder == upload)
}

/// Removes an upload and its chunks, unless a blob names it.
pub async fn remove_upload(tx: &mut Tx, upload: &str) -> AppResult<()> {
    sql::query(
        "DELETE FROM image_uploads AS u WHERE u.id = $1
           AND NOT EXISTS (SELECT 1 FROM image_blobs AS b WHERE b.upload_id = u.id)",
    )
    .bind(upload)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// Removes the bytes of `sha256` when no image has them any more; the upload that held them is returned, to be
/// removed in turn.
pub async fn release_blob(tx: &mut Tx, sha256: &str) -> AppResult<Option<String>> {
    Ok(sql::query_scalar(
        "DELETE FROM image_blobs AS b WHERE b.sha256 = $1
           AND NOT EXISTS (SELECT 1 FROM images AS i WHERE i.sha256 = b.sha256)
         RETURNING b.upload_id",
    )
    .bind(sha256)
    .fetch_optional(tx.conn())
    .await?)
}

/// The upload that holds the bytes of `sha256`, with their size.
pub async fn blob(tx: &mut Tx, sha256: &str) -> AppResult<Option<(String, i64)>> {
    let row = sql::query("SELECT upload_id, size_bytes FROM image_blobs WHERE sha256 = $1")
        .bind(sha256)
        .fetch_optional(tx.conn())
        .await?;
    row.map(|row| Ok((row.try_get("upload_id")?, row.try_get("size_bytes")?)))
        .transpose()
        .map_err(|err: sqlx::Error| corrupt("an image_blobs row", err))
}

/// Chunk `seq` of an upload.
pub async fn chunk(tx: &mut Tx, upload: &str, seq: i32) -> AppResult<Option<Vec<u8>>> {
    Ok(sql::query_scalar("SELECT data FROM image_chunks WHERE upload_id = $1 AND seq = $2")
        .bind(upload)
        .bind(seq)
        .fetch_optional(tx.conn())
        .await?)
}

/// Removes the uploads no blob names whose last chunk arrived before `idle_ms` ago (their writer died or gave
/// up): how many.
pub async fn sweep_uploads(tx: &mut Tx, idle_ms: i64) -> AppResult<u64> {
    let done = sql::query(
        "DELETE FROM image_uploads AS u
         WHERE u.touched_at < compute_now() - make_interval(secs => $1::float8 / 1000)
           AND NOT EXISTS (SELECT 1 FROM image_blobs AS b WHERE b.upload_id = u.id)",
    )
    .bind(idle_ms)
    .execute(tx.conn())
    .await?;
    Ok(done.rows_affected())
}
