//! The site agent's rows: its role and site, and the running site steps of its site's machines.

use bc_eventstore::{Tx, sql};
use sqlx::Row as _;

use crate::AppResult;

/// A node's role and site.
pub async fn role_and_site(tx: &mut Tx, node_id: &str) -> AppResult<Option<(String, String)>> {
    let row =
        sql::query("SELECT role, site_id FROM nodes WHERE id = $1").bind(node_id).fetch_optional(tx.conn()).await?;
    Ok(row.map(|row| Ok::<_, sqlx::Error>((row.try_get("role")?, row.try_get("site_id")?))).transpose()?)
}

/// A running site step as the tables hold it, with its machine's BMC.
#[derive(Debug, Clone)]
pub struct SiteStepRow {
    pub workflow_id: String,
    pub index: i32,
    pub attempt: i32,
    pub action: String,
    pub deadline_ms: Option<i64>,
    pub node_id: String,
    pub driver: String,
    pub address: String,
    pub system_id: Option<String>,
    pub insecure_tls: bool,
    pub drivers: String,
    /// The machine's sealed BMC credentials, if it has them.
    pub sealed: Option<Vec<u8>>,
}

/// The running `site` steps of the machines of `site`, oldest first.
/// `secret_kind` is the kind of the sealed secret that holds a machine's BMC credentials.
pub async fn running_steps(tx: &mut Tx, site: &str, secret_kind: &str) -> AppResult<Vec<SiteStepRow>> {
    let rows = sql::query(
        "SELECT s.workflow_id, s.index, s.attempt, s.action,
                (extract(epoch FROM s.deadline) * 1000)::int8 AS deadline_ms,
                w.node_id, b.driver, b.address, b.system_id, b.insecure_tls, b.drivers::text AS drivers,
                k.sealed
         FROM workflow_steps AS s
         JOIN workflows AS w ON w.id = s.workflow_id
         JOIN nodes AS n ON n.id = w.node_id
         JOIN node_bmcs AS b ON b.node_id = w.node_id
         LEFT JOIN sealed_secrets AS k ON k.kind = $2 AND k.owner_id = w.node_id
         WHERE s.runs_on = 'site' AND s.state = 'running' AND w.outcome IS NULL AND n.site_id = $1
         ORDER BY s.started_at, s.workflow_id
         LIMIT 100",
    )
    .bind(site)
    .bind(secret_kind)
    .fetch_all(tx.conn())
    .await?;
    let read = |row: &sqlx::postgres::PgRow| -> Result<SiteStepRow, sqlx::Error> {
        Ok(SiteStepRow {
            workflow_id: row.try_get("workflow_id")?,
            index: row.try_get("index")?,
            attempt: row.try_get("attempt")?,
            action: row.try_get("action")?,
            deadline_ms: row.try_get("deadline_ms")?,
            node_id: row.try_get("node_id")?,
            driver: row.try_get("driver")?,
            address: row.try_get("address")?,
            system_id: row.try_get("system_id")?,
            insecure_tls: row.try_get("insecure_tls")?,
            drivers: row.try_get("drivers")?,
            sealed: row.try_get("sealed")?,
        })
    };
    Ok(rows.iter().map(read).collect::<Result<Vec<_>, _>>()?)
}

/// The machine a workflow runs on, and its site.
pub async fn workflow_machine(tx: &mut Tx, workflow_id: &str) -> AppResult<Option<(String, String)>> {
    let row = sql::query(
        "SELECT w.node_id, n.site_id FROM workflows AS w JOIN nodes AS n ON n.id = w.node_id WHERE w.id = $1",
    )
    .bind(workflow_id)
    .fetch_optional(tx.conn())
    .await?;
    Ok(row.map(|row| Ok::<_, sqlx::Error>((row.try_get("node_id")?, row.try_get("site_id")?))).transpose()?)
}
