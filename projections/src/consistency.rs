//! The consistency token: a read may name a position (a command's answer) and be answered once the read models
//! it reads have passed it, or, after a bounded wait, be told how far they got.

use std::time::Duration;

use bc_eventstore::{Db, Position, Result, TxOptions, sql};
use sqlx::Row as _;

/// How far the named read models' active versions have got: the least of their positions (`0-0-0` if one has not
/// started).
pub async fn reached(db: &Db, names: &[&str]) -> Result<Position> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let rows = sql::query(
        "SELECT coalesce(c.log_epoch, 0) AS log_epoch, coalesce(c.txid, '0')::text AS txid, coalesce(c.seq, 0) AS seq
         FROM unnest($1::text[]) AS n(name)
         LEFT JOIN projection_active AS a ON a.name = n.name
         LEFT JOIN projection_checkpoints AS c ON c.name = a.name AND c.version = a.version",
    )
    .bind(names)
    .fetch_all(tx.conn())
    .await?;
    tx.commit().await?;
    let mut least: Option<Position> = None;
    for row in rows {
        let text = format!(
            "{}-{}-{}",
            row.try_get::<i32, _>("log_epoch")?,
            row.try_get::<String, _>("txid")?,
            row.try_get::<i64, _>("seq")?
        );
        let position: Position = text.parse().unwrap_or(Position::START);
        least = Some(least.map_or(position, |l| l.min(position)));
    }
    Ok(least.unwrap_or(Position::START))
}

/// Waits until the named read models have passed `position`, for at most `wait`. `Ok(None)` once they have;
/// `Ok(Some(reached))` with the position they got to when the wait ran out.
pub async fn wait_for(db: &Db, names: &[&str], position: Position, wait: Duration) -> Result<Option<Position>> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let now = reached(db, names).await?;
        if now >= position {
            return Ok(None);
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(Some(now));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
