//! `better-compute doctor`: checks a deployment's database and the processes working on it, and says what to
//! do about each problem found. Problems (`FAIL`) make it exit non-zero; warnings do not.

use std::fmt;
use std::time::Duration;

use bc_eventstore::clock::{self, ClockAnchor, ClockMode};
use bc_eventstore::migrate::Migrator;
use bc_eventstore::{Db, TxOptions, events, sql};
use sqlx::Row as _;

use bc_commands::SHARDS as SHARD_COUNT_HINT;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Level::Ok => "ok",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        })
    }
}

/// One check's answer, and what to do when it is not ok.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub level: Level,
    pub what: String,
    pub fix: Option<String>,
}

impl Finding {
    fn ok(what: impl Into<String>) -> Self {
        Self { level: Level::Ok, what: what.into(), fix: None }
    }

    fn warn(what: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { level: Level::Warn, what: what.into(), fix: Some(fix.into()) }
    }

    fn fail(what: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { level: Level::Fail, what: what.into(), fix: Some(fix.into()) }
    }
}

/// What counts as too old: a writing transaction, a projection's lag, a due work item.
#[derive(Debug, Clone, Copy)]
pub struct Thresholds {
    pub too_old: Duration,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self { too_old: Duration::from_secs(30) }
    }
}

/// Runs every check. A database that cannot be reached is the one finding.
pub async fn examine(db: &Db, thresholds: Thresholds) -> Vec<Finding> {
    if let Err(err) = db.ping().await {
        return vec![Finding::fail(
            format!("the database does not answer: {err}"),
            "check BETTER_COMPUTE_DATABASE_URL, that PostgreSQL runs, and that this machine may connect to it",
        )];
    }
    let mut findings = Vec::new();
    let too_old = thresholds.too_old.as_secs_f64();
    for check in [
        server(db).await,
        migrations(db).await,
        epoch(db).await,
        clock_mode(db).await,
        idle_timeout(db).await,
        autovacuum(db).await,
        long_transactions(db, too_old).await,
        projections(db, too_old).await,
        work_queue(db, too_old).await,
    ] {
        match check {
            Ok(mut found) => findings.append(&mut found),
            Err(err) => findings.push(Finding::fail(
                format!("a check could not run: {err}"),
                "run doctor again; if it persists, the database user may lack rights to read pg_stat_activity",
            )),
        }
    }
    findings
}

type Checked = bc_eventstore::Result<Vec<Finding>>;

async fn server(db: &Db) -> Checked {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let version: String = sql::query_scalar("SELECT current_setting('server_version')").fetch_one(tx.conn()).await?;
    let number: i32 =
        sql::query_scalar("SELECT current_setting('server_version_num')::int4").fetch_one(tx.conn()).await?;
    let gist: Option<String> = sql::query_scalar("SELECT extversion FROM pg_extension WHERE extname = 'btree_gist'")
        .fetch_optional(tx.conn())
        .await?;
    let available: bool =
        sql::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'btree_gist')")
            .fetch_one(tx.conn())
            .await?;
    tx.commit().await?;
    let mut found = vec![if number >= 130_000 {
        Finding::ok(format!("PostgreSQL {version}"))
    } else {
        Finding::fail(
            format!("PostgreSQL {version} is too old: the event log needs xid8 and pg_snapshot (13 or later)"),
            "upgrade PostgreSQL to 13 or later (15 is what the tests run on)",
        )
    }];
    found.push(match (gist, available) {
        (Some(v), _) => Finding::ok(format!("btree_gist {v} installed (the booking exclusion constraint needs it)")),
        (None, true) => Finding::fail(
            "btree_gist is available but not installed in this database",
            "run `better-compute migrate`, which creates it",
        ),
        (None, false) => Finding::fail(
            "btree_gist is not available on this server: no booking can be guarded",
            "install PostgreSQL's contrib modules (Debian: postgresql-contrib), then run `better-compute migrate`",
        ),
    });
    Ok(found)
}

async fn migrations(db: &Db) -> Checked {
    let migrator = Migrator::embedded();
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let ledger = migrator.check_ledger(&mut tx).await;
    tx.commit().await?;
    let ledger = match ledger {
        Ok(ledger) => ledger,
        Err(err) => {
            return Ok(vec![Finding::fail(
                err.to_string(),
                "run the release that migrated this database (or a newer one); never an older binary",
            )]);
        }
    };
    let pending: Vec<String> =
        migrator.migrations().iter().map(|m| m.name()).filter(|name| !ledger.contains(name)).collect();
    Ok(vec![if pending.is_empty() {
        Finding::ok(format!("migrations: all {} of this build applied", migrator.migrations().len()))
    } else {
        Finding::fail(
            format!("migrations: {} of this build not applied: {}", pending.len(), pending.join(", ")),
            "run `better-compute migrate` (once per deploy, before new processes start)",
        )
    }])
}

async fn epoch(db: &Db) -> Checked {
    Ok(vec![match events::check_epoch(db).await {
        Ok(()) => Finding::ok("event log epoch matches this cluster's transaction ids"),
        Err(err) => Finding::fail(err.to_string(), "run `better-compute migrate`, which raises the epoch"),
    }])
}

async fn clock_mode(db: &Db) -> Checked {
    let mut found = Vec::new();
    if clock::compute_now_mode(db).await? == ClockMode::Sim {
        found.push(Finding::warn(
            "business time runs on a simulated clock (compute_now() is set by hand)",
            "unless this is a test or simulation database: SELECT restore_system_clock();",
        ));
    } else {
        found.push(Finding::ok("business time follows the database server's clock"));
    }
    let anchor = ClockAnchor::sample(db).await?;
    found.push(if anchor.is_skewed() {
        Finding::fail(
            format!("this machine's clock differs from the database server's by {} ms", anchor.skew_ms()),
            "synchronise both machines' clocks (NTP, chrony); agents beyond a second raise ClockSkew",
        )
    } else {
        Finding::ok(format!("clock skew against the database server: {} ms", anchor.skew_ms()))
    });
    Ok(found)
}

async fn idle_timeout(db: &Db) -> Checked {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let timeout: String =
        sql::query_scalar("SELECT current_setting('idle_in_transaction_session_timeout')").fetch_one(tx.conn()).await?;
    tx.commit().await?;
    Ok(vec![if timeout == "0" {
        Finding::warn(
            "idle_in_transaction_session_timeout is off: a client that leaves a transaction open holds every \
             event reader back until it is noticed",
            "ALTER ROLE <the service's role> SET idle_in_transaction_session_timeout = '60s'; (or on the database)",
        )
    } else {
        Finding::ok(format!("idle_in_transaction_session_timeout = {timeout}"))
    }])
}

/// The longest `autovacuum_naptime` that keeps the hot capacity tables small (capacity/0011 asks for a vacuum once
/// a thousand of their rows are dead; autovacuum only notices between naps).
const NAPTIME_MAX_S: i64 = 15;

async fn autovacuum(db: &Db) -> Checked {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let (on, naptime): (bool, i64) = sql::query_as(
        "SELECT current_setting('autovacuum')::bool, \
                (SELECT setting::int8 FROM pg_settings WHERE name = 'autovacuum_naptime')",
    )
    .fetch_one(tx.conn())
    .await?;
    tx.commit().await?;
    Ok(vec![if !on {
        Finding::fail(
            "autovacuum is off: the tables every reservation rewrites grow without bound and placement slows",
            "ALTER SYSTEM SET autovacuum = on; SELECT pg_reload_conf();",
        )
    } else if naptime > NAPTIME_MAX_S {
        Finding::warn(
            format!(
                "autovacuum looks for work every {naptime} s: a busy pool's atom gaps and bookings carry many \
                 times their live rows between two looks, and placement slows"
            ),
            "ALTER SYSTEM SET autovacuum_naptime = '5s'; SELECT pg_reload_conf();",
        )
    } else {
        Finding::ok(format!("autovacuum on, looking for work every {naptime} s"))
    }])
}

async fn long_transactions(db: &Db, too_old: f64) -> Checked {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let rows = sql::query(
        "SELECT pid, coalesce(application_name, '') AS application, coalesce(usename::text, '') AS username,
                coalesce(datname::text, '') AS database, coalesce(state, '') AS state,
                extract(epoch FROM compute_db_clock() - xact_start)::float8 AS age,
                left(coalesce(query, ''), 120) AS query
         FROM pg_stat_activity
         WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()
           AND extract(epoch FROM compute_db_clock() - xact_start) >= $1
         ORDER BY xact_start",
    )
    .bind(too_old)
    .fetch_all(tx.conn())
    .await?;
    tx.commit().await?;
    if rows.is_empty() {
        return Ok(vec![Finding::ok(format!(
            "no writing transaction older than {too_old:.0} s holds the event log's horizon back"
        ))]);
    }
    let mut found = Vec::new();
    for row in rows {
        let pid: i32 = row.try_get("pid")?;
        let age: f64 = row.try_get("age")?;
        found.push(Finding::fail(
            format!(
                "transaction of pid {pid} ({} as {} on {}, {}) has been open {age:.0} s, holding every event \
                 reader (projections, event streams) back, in every database of the cluster: {}",
                row.try_get::<String, _>("application")?,
                row.try_get::<String, _>("username")?,
                row.try_get::<String, _>("database")?,
                row.try_get::<String, _>("state")?,
                row.try_get::<String, _>("query")?,
            ),
            format!("end it if nobody is waiting on it: SELECT pg_terminate_backend({pid});"),
        ));
    }
    Ok(found)
}

async fn projections(db: &Db, too_old: f64) -> Checked {
    let rows = bc_projections::status::status(db, &bc_projections::models::read_models()).await?;
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let running: i64 = sql::query_scalar(
        "SELECT count(*) FROM leases WHERE starts_with(name, 'singleton:projection:') AND expires_at > compute_now()",
    )
    .fetch_one(tx.conn())
    .await?;
    tx.commit().await?;
    let behind: Vec<_> = rows.iter().filter(|r| r.active && r.lag_events > 0).collect();
    let mut found = Vec::new();
    if running == 0 && (!behind.is_empty() || rows.iter().any(|r| r.state == "not started" && r.lag_events > 0)) {
        found.push(Finding::fail(
            "no process runs the projections, and the read models are behind the log",
            "start `better-compute serve` (role worker or all), or `better-compute projections run`",
        ));
    } else if running == 0 {
        found.push(Finding::warn(
            "no process runs the projections: the read models are caught up, but the next change will not show",
            "start `better-compute serve` (role worker or all), or `better-compute projections run`",
        ));
    }
    for row in &rows {
        if row.active && row.lag_seconds >= too_old {
            found.push(Finding::warn(
                format!(
                    "read model {} v{} is {} events and {:.0} s behind the log",
                    row.name, row.version, row.lag_events, row.lag_seconds
                ),
                "check the worker processes' logs (`projection batch failed`), and `better-compute projections \
                 status`; a writing transaction left open holds it back too",
            ));
        }
        if row.state == "building" {
            found.push(Finding::warn(
                format!("read model {} v{} is being built ({} events behind)", row.name, row.version, row.lag_events),
                "nothing to do: reads use the previous version until it has caught up",
            ));
        }
    }
    if found.is_empty() {
        found.push(Finding::ok(format!(
            "projections: {} versions, none more than {too_old:.0} s behind, {running} leases held",
            rows.len()
        )));
    }
    Ok(found)
}

async fn work_queue(db: &Db, too_old: f64) -> Checked {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let row = sql::query(
        "SELECT count(*) FILTER (WHERE not_before <= compute_now()) AS due,
                coalesce(extract(epoch FROM compute_now() - min(not_before) FILTER (WHERE not_before <= compute_now())), 0)::float8
                    AS oldest,
                (SELECT count(*) FROM leases WHERE starts_with(name, 'shard:') AND expires_at > compute_now()) AS shards,
                (SELECT count(*) FROM leases WHERE starts_with(name, 'member:worker:') AND expires_at > compute_now())
                    AS workers
         FROM work_queue",
    )
    .fetch_one(tx.conn())
    .await?;
    tx.commit().await?;
    let (due, oldest, shards, workers): (i64, f64, i64, i64) =
        (row.try_get("due")?, row.try_get("oldest")?, row.try_get("shards")?, row.try_get("workers")?);
    let mut found = Vec::new();
    if workers == 0 && due > 0 {
        found.push(Finding::fail(
            format!("no worker runs, and {due} work items are due (the oldest for {oldest:.0} s)"),
            "start `better-compute serve` with role worker or all",
        ));
    } else if workers == 0 {
        found.push(Finding::warn(
            "no worker runs: nothing is due yet, but no reservation will start or end, and no silent node will be \
             noticed",
            "start `better-compute serve` with role worker or all",
        ));
    } else if oldest >= too_old {
        found.push(Finding::warn(
            format!("{due} work items are due, the oldest for {oldest:.0} s"),
            "the workers are behind or failing: check their logs (`work item failed`) and bc_work_queue_* metrics",
        ));
    }
    if workers > 0 && shards < i64::from(SHARD_COUNT_HINT) {
        found.push(Finding::warn(
            format!("{workers} workers hold {shards} of the {SHARD_COUNT_HINT} shards"),
            "a worker died or just started: the shards are taken over within a lease's life (15 s); if this \
             lasts, check the workers' logs",
        ));
    }
    if found.is_empty() {
        found.push(Finding::ok(format!(
            "work queue: {due} items due; {workers} workers hold {shards} of {SHARD_COUNT_HINT} shards"
        )));
    }
    Ok(found)
}

/// Checks the PKI bundle in `dir`, when the deployment has one: a bundle that cannot be read must be restored
/// from the backup taken with the database, never made anew.
pub fn pki(dir: Option<&std::path::Path>) -> Vec<Finding> {
    let Some(dir) = dir else {
        return vec![Finding::warn(
            "no PKI bundle given (--pki-dir or BETTER_COMPUTE_PKI_DIR): its files were not checked",
            "run doctor with the --pki-dir that `serve` uses",
        )];
    };
    match bc_pki::Bundle::load(dir) {
        Ok(bundle) => {
            let (server, _) = bundle.server_certificate();
            let mut found =
                vec![Finding::ok(format!("PKI bundle in {}: CA sha256 {}", dir.display(), bundle.ca_fingerprint()))];
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or_default();
            for (what, pem, renew) in [
                (
                    "the CA certificate",
                    bundle.ca_pem(),
                    "rotate the CA: see docs/operations.md (every node joins again)",
                ),
                ("the server certificate", server, "better-compute pki server-certificate --dir ... --name ..."),
            ] {
                match bc_pki::certificate_validity(pem) {
                    Ok((_, until)) if until <= now => {
                        found.push(Finding::fail(format!("{what} expired at {}", bc_pki::date(until)), renew))
                    }
                    Ok((_, until)) if until - now < 30 * 24 * 3600 => {
                        found.push(Finding::warn(format!("{what} expires at {}", bc_pki::date(until)), renew))
                    }
                    Ok(_) => {}
                    Err(err) => {
                        found.push(Finding::fail(format!("{what} does not parse: {err}"), "restore the bundle"))
                    }
                }
            }
            found
        }
        Err(err) => vec![Finding::fail(
            format!("the PKI bundle cannot be used: {err}"),
            format!(
                "restore {} from the backup taken with the database; do not make a new one: a new CA makes every node \
                 join again and leaves the sealed secrets unreadable",
                dir.display()
            ),
        )],
    }
}

/// Prints the findings, each problem with what to do; answers whether none failed.
pub fn report(findings: &[Finding]) -> bool {
    for finding in findings {
        println!("{:<5} {}", finding.level, finding.what);
        if let Some(fix) = &finding.fix {
            println!("      do: {fix}");
        }
    }
    let fails = findings.iter().filter(|f| f.level == Level::Fail).count();
    let warns = findings.iter().filter(|f| f.level == Level::Warn).count();
    println!("{fails} problems, {warns} warnings");
    fails == 0
}
