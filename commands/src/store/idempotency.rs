//! The first answers of create requests sent with an Idempotency-Key.

use bc_eventstore::{Tx, sql};

use crate::AppResult;

/// A stored row: the method, the request's SHA-256, and the answer once there is one (status, bytes, sealed).
pub type KeyRow = (String, String, Option<i32>, Option<Vec<u8>>, bool);

/// Takes the key for a new request (`None`), or answers the row that holds it. A row past its time (an answer
/// kept a day, a request that has not finished in two minutes: its process died) is dropped first.
pub async fn claim(
    tx: &mut Tx,
    tenant: &str,
    identity: &str,
    key: &str,
    method: &str,
    request_sha256: &str,
) -> AppResult<Option<KeyRow>> {
    sql::query(
        "DELETE FROM idempotency_keys
         WHERE tenant_id = $1 AND identity = $2 AND key = $3
           AND (created_at < compute_now() - interval '24 hours'
                OR (status IS NULL AND created_at < compute_now() - interval '2 minutes'))",
    )
    .bind(tenant)
    .bind(identity)
    .bind(key)
    .execute(tx.conn())
    .await?;
    let inserted = sql::query(
        "INSERT INTO idempotency_keys (tenant_id, identity, key, method, request_sha256, created_at)
         VALUES ($1, $2, $3, $4, $5, compute_now()) ON CONFLICT DO NOTHING",
    )
    .bind(tenant)
    .bind(identity)
    .bind(key)
    .bind(method)
    .bind(request_sha256)
    .execute(tx.conn())
    .await?
    .rows_affected();
    if inserted == 1 {
        return Ok(None);
    }
    Ok(sql::query_as(
        "SELECT method, request_sha256, status, answer, sealed FROM idempotency_keys
         WHERE tenant_id = $1 AND identity = $2 AND key = $3",
    )
    .bind(tenant)
    .bind(identity)
    .bind(key)
    .fetch_optional(tx.conn())
    .await?)
}

/// Keeps the first answer.
pub async fn answer(
    tx: &mut Tx,
    tenant: &str,
    identity: &str,
    key: &str,
    status: i32,
    answer: Option<&[u8]>,
    sealed: bool,
) -> AppResult<()> {
    sql::query(
        "UPDATE idempotency_keys SET status = $4, answer = $5, sealed = $6
         WHERE tenant_id = $1 AND identity = $2 AND key = $3 AND status IS NULL",
    )
    .bind(tenant)
    .bind(identity)
    .bind(key)
    .bind(status)
    .bind(answer)
    .bind(sealed)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// Gives the key back after a request that was refused or failed, so a retry runs it again.
pub async fn release(tx: &mut Tx, tenant: &str, identity: &str, key: &str) -> AppResult<()> {
    sql::query("DELETE FROM idempotency_keys WHERE tenant_id = $1 AND identity = $2 AND key = $3 AND status IS NULL")
        .bind(tenant)
        .bind(identity)
        .bind(key)
        .execute(tx.conn())
        .await?;
    Ok(())
}
