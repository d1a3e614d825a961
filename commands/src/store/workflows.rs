//! Workflows' rows: the inline `workflows` and `workflow_steps` tables (`provisioning/0003`).

use bc_eventstore::{Tx, sql};

use crate::AppResult;

/// The workflow running on a machine, if one is.
pub async fn running_on(tx: &mut Tx, node_id: &str) -> AppResult<Option<String>> {
    Ok(sql::query_scalar("SELECT id FROM workflows WHERE node_id = $1 AND outcome IS NULL")
        .bind(node_id)
        .fetch_optional(tx.conn())
        .await?)
}

/// A machine's workflows, newest first.
pub async fn of_node(tx: &mut Tx, node_id: &str, limit: u32) -> AppResult<Vec<String>> {
    Ok(sql::query_scalar("SELECT id FROM workflows WHERE node_id = $1 ORDER BY id DESC LIMIT $2")
        .bind(node_id)
        .bind(i64::from(limit))
        .fetch_all(tx.conn())
        .await?)
}
