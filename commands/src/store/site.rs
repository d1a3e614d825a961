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
    pub boot_mac: Option<String>,
    /// The machine's sealed BMC credentials, if it has them.
    pub sealed: Option<Vec<u8>>,
    /// For `insert-virtual-media`, the workflow's profile's `iso` image: its id, hash and size.
    pub media: Option<(String, String, i64)>,
}

/// The running `site` steps of the machines of `site`, oldest first.
/// `secret_kind` is the kind of the sealed secret that holds a machine's BMC credentials.
pub async fn running_steps(tx: &mut Tx, site: &str, secret_kind: &str) -> AppResult<Vec<SiteStepRow>> {
    let rows = sql::query(
        "SELECT s.workflow_id, s.index, s.attempt, s.action,
                (extract(epoch FROM s.deadline) * 1000)::int8 AS deadline_ms,
                w.node_id, b.driver, b.address, b.system_id, b.insecure_tls, b.drivers::text AS drivers, b.boot_mac,
                k.sealed, i.id AS media_id, i.sha256 AS media_sha256, i.size_bytes AS media_size
         FROM workflow_steps AS s
         JOIN workflows AS w ON w.id = s.workflow_id
         JOIN nodes AS n ON n.id = w.node_id
         JOIN node_bmcs AS b ON b.node_id = w.node_id
         LEFT JOIN sealed_secrets AS k ON k.kind = $2 AND k.owner_id = w.node_id
         LEFT JOIN profiles AS p ON s.action = 'insert-virtual-media' AND p.id = w.profile_id
         LEFT JOIN images AS i ON i.id = p.image_id AND i.format = 'iso'
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
            boot_mac: row.try_get("boot_mac")?,
            sealed: row.try_get("sealed")?,
            media: match row.try_get::<Option<String>, _>("media_id")? {
                Some(id) => Some((id, row.try_get("media_sha256")?, row.try_get("media_size")?)),
                None => None,
            },
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

/// The node that boots with `mac`, if one does.
pub async fn boot_mac_holder(tx: &mut Tx, mac: &str) -> AppResult<Option<String>> {
    Ok(sql::query_scalar("SELECT node_id FROM node_bmcs WHERE boot_mac = $1")
        .bind(mac)
        .fetch_optional(tx.conn())
        .await?)
}

/// The machine of `site` that boots with `mac`, or whose Redfish system id is `uuid` (the MAC first).
pub async fn machine_booting(
    tx: &mut Tx,
    site: &str,
    mac: Option<&str>,
    uuid: Option<&str>,
) -> AppResult<Option<String>> {
    Ok(sql::query_scalar(
        "SELECT b.node_id FROM node_bmcs AS b JOIN nodes AS n ON n.id = b.node_id
         WHERE n.site_id = $1 AND (b.boot_mac = $2 OR lower(b.system_id) = lower($3))
         ORDER BY (b.boot_mac = $2) IS TRUE DESC, b.node_id
         LIMIT 1",
    )
    .bind(site)
    .bind(mac)
    .bind(uuid)
    .fetch_optional(tx.conn())
    .await?)
}

/// The image with bytes `sha256` that a running deployment on a machine of `site` writes, if any: the only
/// images a site agent may fetch.
pub async fn image_deployed_at(tx: &mut Tx, site: &str, sha256: &str) -> AppResult<Option<String>> {
    Ok(sql::query_scalar(
        "SELECT i.id FROM workflows AS w
         JOIN nodes AS n ON n.id = w.node_id
         JOIN profiles AS p ON p.id = w.profile_id
         JOIN images AS i ON i.id = p.image_id
         WHERE w.outcome IS NULL AND n.site_id = $1 AND i.sha256 = $2
         LIMIT 1",
    )
    .bind(site)
    .bind(sha256)
    .fetch_optional(tx.conn())
    .await?)
}

/// A ramdisk credential's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RamdiskCredential {
    /// Handed to one boot in its iPXE script; claimed once.
    Boot,
    /// What a claim answers.
    Session,
}

impl RamdiskCredential {
    fn as_str(self) -> &'static str {
        match self {
            RamdiskCredential::Boot => "boot",
            RamdiskCredential::Session => "session",
        }
    }
}

/// Stores a ramdisk credential's hash for a workflow's machine, until `expires_at_ms`; a session also records the
/// hash of the boot credential that claimed it.
pub async fn insert_ramdisk_credential(
    tx: &mut Tx,
    secret_sha256: &str,
    kind: RamdiskCredential,
    workflow_id: &str,
    node_id: &str,
    expires_at_ms: i64,
    boot_sha256: Option<&str>,
) -> AppResult<()> {
    sql::query(
        "INSERT INTO ramdisk_credentials (secret_sha256, kind, workflow_id, node_id, expires_at, boot_sha256)
         VALUES ($1, $2, $3, $4, ms_ts($5), $6)",
    )
    .bind(secret_sha256)
    .bind(kind.as_str())
    .bind(workflow_id)
    .bind(node_id)
    .bind(expires_at_ms)
    .bind(boot_sha256)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// Whether the boot credential with hash `boot_sha256` claimed a session that is still live and was never used:
/// then its claim's answer may have been lost, and the ramdisk may claim again.
pub async fn unused_session_of(tx: &mut Tx, boot_sha256: &str) -> AppResult<bool> {
    Ok(sql::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM ramdisk_credentials
                        WHERE kind = 'session' AND boot_sha256 = $1 AND used_at IS NULL
                          AND expires_at > compute_now())",
    )
    .bind(boot_sha256)
    .fetch_one(tx.conn())
    .await?)
}

/// Records a session's first use (later uses change nothing).
pub async fn mark_session_used(tx: &mut Tx, secret_sha256: &str) -> AppResult<()> {
    sql::query(
        "UPDATE ramdisk_credentials SET used_at = compute_now()
         WHERE secret_sha256 = $1 AND kind = 'session' AND used_at IS NULL",
    )
    .bind(secret_sha256)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// A ramdisk credential as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RamdiskCredentialRow {
    pub workflow_id: String,
    pub node_id: String,
    pub expired: bool,
    pub claimed: bool,
}

/// The credential of `kind` with hash `secret_sha256`, locked (a claim marks it).
pub async fn lock_ramdisk_credential(
    tx: &mut Tx,
    secret_sha256: &str,
    kind: RamdiskCredential,
) -> AppResult<Option<RamdiskCredentialRow>> {
    let row = sql::query(
        "SELECT workflow_id, node_id, expires_at <= compute_now() AS expired, claimed_at IS NOT NULL AS claimed
         FROM ramdisk_credentials WHERE secret_sha256 = $1 AND kind = $2 FOR UPDATE",
    )
    .bind(secret_sha256)
    .bind(kind.as_str())
    .fetch_optional(tx.conn())
    .await?;
    let read = |row: sqlx::postgres::PgRow| -> Result<RamdiskCredentialRow, sqlx::Error> {
        Ok(RamdiskCredentialRow {
            workflow_id: row.try_get("workflow_id")?,
            node_id: row.try_get("node_id")?,
            expired: row.try_get("expired")?,
            claimed: row.try_get("claimed")?,
        })
    };
    Ok(row.map(read).transpose()?)
}

/// Marks a boot credential claimed, ends the earlier sessions of its workflow, and forgets expired credentials.
pub async fn claim_boot_credential(tx: &mut Tx, secret_sha256: &str, workflow_id: &str) -> AppResult<()> {
    sql::query("UPDATE ramdisk_credentials SET claimed_at = compute_now() WHERE secret_sha256 = $1")
        .bind(secret_sha256)
        .execute(tx.conn())
        .await?;
    sql::query(
        "DELETE FROM ramdisk_credentials
         WHERE (kind = 'session' AND workflow_id = $1) OR expires_at <= compute_now()",
    )
    .bind(workflow_id)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// The live ramdisk session with hash `secret_sha256`: its workflow and machine, and whether it was used before.
pub async fn ramdisk_session(tx: &mut Tx, secret_sha256: &str) -> AppResult<Option<(String, String, bool)>> {
    let row = sql::query(
        "SELECT workflow_id, node_id, used_at IS NOT NULL AS used FROM ramdisk_credentials
         WHERE secret_sha256 = $1 AND kind = 'session' AND expires_at > compute_now()",
    )
    .bind(secret_sha256)
    .fetch_optional(tx.conn())
    .await?;
    let read = |row: sqlx::postgres::PgRow| -> Result<(String, String, bool), sqlx::Error> {
        Ok((row.try_get("workflow_id")?, row.try_get("node_id")?, row.try_get("used")?))
    };
    Ok(row.map(read).transpose()?)
}
