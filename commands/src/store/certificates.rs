//! Node certificates the CA signed (the pki module's `node_certificates`), and sealed secrets.

use bc_domain::id::NodeId;
use bc_eventstore::{Tx, sql};
use sqlx::Row as _;

use crate::AppResult;

/// Records a certificate issued to `node_id`.
pub async fn insert(tx: &mut Tx, serial: &str, node_id: &NodeId, not_after_secs: i64) -> AppResult<()> {
    sql::query("INSERT INTO node_certificates (serial, node_id, not_after) VALUES ($1, $2, to_timestamp($3))")
        .bind(serial)
        .bind(node_id.as_str())
        .bind(not_after_secs as f64)
        .execute(tx.conn())
        .await?;
    Ok(())
}

/// Revokes every certificate of `node_id` not revoked yet.
pub async fn revoke_all(tx: &mut Tx, node_id: &NodeId) -> AppResult<u64> {
    let done =
        sql::query("UPDATE node_certificates SET revoked_at = compute_now() WHERE node_id = $1 AND revoked_at IS NULL")
            .bind(node_id.as_str())
            .execute(tx.conn())
            .await?;
    Ok(done.rows_affected())
}

/// Whether `node_id` holds a certificate that is neither expired nor revoked.
pub async fn has_live(tx: &mut Tx, node_id: &NodeId) -> AppResult<bool> {
    Ok(sql::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM node_certificates
                        WHERE node_id = $1 AND revoked_at IS NULL AND not_after > compute_now())",
    )
    .bind(node_id.as_str())
    .fetch_one(tx.conn())
    .await?)
}

/// The revoked certificates that have not expired yet (an expired one is refused anyway): serial and when it
/// was revoked, in seconds since the epoch, oldest revocation first.
pub async fn revoked(tx: &mut Tx) -> AppResult<Vec<(String, i64)>> {
    let rows = sql::query(
        "SELECT serial, floor(extract(epoch FROM revoked_at))::int8 AS revoked_at FROM node_certificates
         WHERE revoked_at IS NOT NULL AND not_after > compute_now()
         ORDER BY revoked_at, serial",
    )
    .fetch_all(tx.conn())
    .await?;
    rows.iter().map(|row| Ok((row.try_get("serial")?, row.try_get("revoked_at")?))).collect()
}

/// Stores a sealed secret, replacing the one of the same kind and owner.
pub async fn put_secret(tx: &mut Tx, kind: &str, owner_id: &str, sealed: &[u8]) -> AppResult<()> {
    sql::query(
        "INSERT INTO sealed_secrets (kind, owner_id, sealed) VALUES ($1, $2, $3)
         ON CONFLICT (kind, owner_id) DO UPDATE SET sealed = excluded.sealed, sealed_at = compute_now()",
    )
    .bind(kind)
    .bind(owner_id)
    .bind(sealed)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// A sealed secret, if there is one.
pub async fn secret(tx: &mut Tx, kind: &str, owner_id: &str) -> AppResult<Option<Vec<u8>>> {
    Ok(sql::query_scalar("SELECT sealed FROM sealed_secrets WHERE kind = $1 AND owner_id = $2")
        .bind(kind)
        .bind(owner_id)
        .fetch_optional(tx.conn())
        .await?)
}

/// Removes a sealed secret, if there is one.
pub async fn delete_secret(tx: &mut Tx, kind: &str, owner_id: &str) -> AppResult<()> {
    sql::query("DELETE FROM sealed_secrets WHERE kind = $1 AND owner_id = $2")
        .bind(kind)
        .bind(owner_id)
        .execute(tx.conn())
        .await?;
    Ok(())
}
