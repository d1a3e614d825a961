//! The walk over the free-capacity hints (`node_free`, `node_fit`): the nodes of a step, the fit recounted, the
//! free counts that disagree with their devices, and the guarded correction of one.

use bc_eventstore::{Tx, sql};

use crate::AppResult;

/// A node class whose free count (`node_free.free`) disagreed with a recount from its devices, as one walk of the
/// hints found it: the count held, the recount, and the node class's booking changes then.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FreeCountSeen {
    pub node_id: String,
    pub class: String,
    pub held: i32,
    pub recount: i32,
    pub changes: i64,
}

/// The next `limit` node ids after `after`, in id order.
pub async fn nodes_after(tx: &mut Tx, after: Option<&str>, limit: i64) -> AppResult<Vec<String>> {
    Ok(sql::query_scalar("SELECT id FROM nodes WHERE id > $1 ORDER BY id LIMIT $2")
        .bind(after.unwrap_or(""))
        .bind(limit)
        .fetch_all(tx.conn())
        .await?)
}

/// Recounts the nodes' `node_fit` rows (`refit_nodes` catches its own errors, as a warning).
pub async fn refit(tx: &mut Tx, nodes: &[String]) -> AppResult<()> {
    sql::query("SELECT refit_nodes($1)").bind(nodes).execute(tx.conn()).await?;
    Ok(())
}

/// The nodes' free counts that differ from a count of their devices with nothing booked.
pub async fn disagreeing_free_counts(tx: &mut Tx, nodes: &[String]) -> AppResult<Vec<FreeCountSeen>> {
    let rows: Vec<(String, String, i32, i32, i64)> = sql::query_as(
        "SELECT c.node_id, c.class, f.free, c.free, c.changes
         FROM (SELECT d.node_id, d.class, (count(*) FILTER (WHERE d.booked_until IS NULL))::int4 AS free,
                      sum(d.booking_changes)::int8 AS changes
               FROM devices AS d WHERE d.node_id = ANY($1) AND d.bookable
               GROUP BY d.node_id, d.class) AS c
         JOIN node_free AS f ON f.node_id = c.node_id AND f.class = c.class
         WHERE f.free <> c.free
         ORDER BY c.node_id, c.class",
    )
    .bind(nodes)
    .fetch_all(tx.conn())
    .await?;
    Ok(rows
        .into_iter()
        .map(|(node_id, class, held, recount, changes)| FreeCountSeen { node_id, class, held, recount, changes })
        .collect())
}

/// Sets a free count to its recount if it still holds what was seen and its node class's booking changes have not
/// moved since (read again by this statement). Whether it did.
pub async fn correct_free_count(tx: &mut Tx, seen: &FreeCountSeen) -> AppResult<bool> {
    let corrected = sql::query(
        "UPDATE node_free AS f SET free = $4
         WHERE f.node_id = $1 AND f.class = $2 AND f.free = $3
           AND (SELECT sum(d.booking_changes)::int8 FROM devices AS d
                WHERE d.node_id = $1 AND d.class = $2 AND d.bookable) = $5",
    )
    .bind(&seen.node_id)
    .bind(&seen.class)
    .bind(seen.held)
    .bind(seen.recount)
    .bind(seen.changes)
    .execute(tx.conn())
    .await?
    .rows_affected();
    Ok(corrected > 0)
}
