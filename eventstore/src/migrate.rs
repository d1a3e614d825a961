//! The migrations runner: SQL files embedded at build time, applied in registration order, each in its own
//! transaction together with its ledger row, serialized between processes by a transaction-level advisory
//! lock (never a session lock, which PgBouncer's transaction mode would break).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use sqlx::AssertSqlSafe;

use crate::db::{Db, Tx, TxOptions};
use crate::error::{Error, Result};
use crate::{events, sql};

/// The advisory lock key pair every migration transaction takes ("bcmp", 1).
pub const MIGRATION_LOCK: (i32, i32) = (1_650_683_248, 1);

/// The owner of the base schema; its migrations always run first.
pub const CORE: &str = "core";

/// One migration: `<owner>/<nnnn>_<slug>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    pub owner: Cow<'static, str>,
    pub number: u32,
    pub slug: Cow<'static, str>,
    pub sql: Cow<'static, str>,
}

impl Migration {
    pub const fn new_static(owner: &'static str, number: u32, slug: &'static str, sql: &'static str) -> Self {
        Self { owner: Cow::Borrowed(owner), number, slug: Cow::Borrowed(slug), sql: Cow::Borrowed(sql) }
    }

    pub fn new(owner: &str, number: u32, slug: &str, sql: &str) -> Self {
        Self {
            owner: Cow::Owned(owner.to_owned()),
            number,
            slug: Cow::Owned(slug.to_owned()),
            sql: Cow::Owned(sql.to_owned()),
        }
    }

    /// `core/0001_clock`.
    pub fn name(&self) -> String {
        format!("{}/{:04}_{}", self.owner, self.number, self.slug)
    }
}

/// The migrations compiled into this build, in registration order.
pub static EMBEDDED: &[Migration] = include!(concat!(env!("OUT_DIR"), "/migrations.rs"));

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigrationReport {
    /// Names applied by this run, in order.
    pub applied: Vec<String>,
    /// Migrations that were already in the ledger.
    pub already_applied: usize,
    /// The event log's new epoch, when this run raised it (after a restore into a younger cluster).
    pub raised_epoch: Option<u32>,
}

/// Applies a fixed, ordered set of migrations.
#[derive(Debug, Clone)]
pub struct Migrator {
    migrations: Vec<Migration>,
}

/// A ledger row parsed as `<owner>/<nnnn>_<slug>`.
struct LedgerName<'a> {
    owner: &'a str,
    number: Option<u32>,
}

fn parse_ledger_name(name: &str) -> Option<LedgerName<'_>> {
    let (owner, rest) = name.split_once('/')?;
    let number = rest.split_once('_').and_then(|(number, _)| number.parse().ok());
    Some(LedgerName { owner, number })
}

impl Migrator {
    /// The migrations embedded in this build.
    pub fn embedded() -> Self {
        Self { migrations: EMBEDDED.to_vec() }
    }

    /// A migrator over `migrations`, which must be in registration order: `core` first, each owner's
    /// migrations together, numbers rising within an owner.
    pub fn new(migrations: Vec<Migration>) -> Result<Self> {
        let mut seen_owners: Vec<&str> = Vec::new();
        let mut last: Option<&Migration> = None;
        for migration in &migrations {
            if migration.owner.is_empty() || migration.owner.contains('/') || migration.slug.is_empty() {
                return Err(Error::InvalidConfig(format!(
                    "migration {:?} is not named <owner>/<nnnn>_<slug>",
                    migration.name()
                )));
            }
            match last {
                Some(prev) if prev.owner == migration.owner => {
                    if migration.number <= prev.number {
                        return Err(Error::InvalidConfig(format!(
                            "migration {} does not come after {}: numbers must rise within an owner",
                            migration.name(),
                            prev.name()
                        )));
                    }
                }
                _ => {
                    if seen_owners.contains(&migration.owner.as_ref()) {
                        return Err(Error::InvalidConfig(format!(
                            "the migrations of owner {} are not listed together",
                            migration.owner
                        )));
                    }
                    if migration.owner == CORE && !seen_owners.is_empty() {
                        return Err(Error::InvalidConfig("the core migrations must come first".to_owned()));
                    }
                    seen_owners.push(&migration.owner);
                }
            }
            last = Some(migration);
        }
        Ok(Self { migrations })
    }

    pub fn migrations(&self) -> &[Migration] {
        &self.migrations
    }

    /// The base schema version this build brings: how many `core` migrations it has.
    pub fn base_version(&self) -> i32 {
        self.migrations.iter().filter(|m| m.owner == CORE).count() as i32
    }

    /// Applies every migration not yet in the ledger, then raises the event log's epoch if the database was
    /// restored into a cluster with lower transaction ids. Refuses with `INVALID_CONFIG`, naming the entries,
    /// when the ledger holds what this build cannot account for. Safe to run from several processes at once.
    pub async fn run(&self, db: &Db) -> Result<MigrationReport> {
        let mut report = MigrationReport::default();
        let mut tx = self.locked_tx(db).await?;
        check_encoding(&mut tx).await?;
        bootstrap_ledger(&mut tx).await?;
        self.check_ledger(&mut tx).await?;
        tx.commit().await?;

        for migration in &self.migrations {
            let name = migration.name();
            let mut tx = self.locked_tx(db).await?;
            // Checked again under the lock: another process may have migrated meanwhile.
            let ledger = self.check_ledger(&mut tx).await?;
            if ledger.contains(&name) {
                tx.rollback().await;
                report.already_applied += 1;
                continue;
            }
            sqlx::raw_sql(AssertSqlSafe(migration.sql.clone()))
                .execute(tx.conn())
                .await
                .map_err(|source| Error::Migration { name: name.clone(), source })?;
            sql::query("INSERT INTO compute_migrations (name, applied_at) VALUES ($1, compute_now())")
                .bind(&name)
                .execute(tx.conn())
                .await?;
            if migration.owner == CORE {
                sql::query(
                    "INSERT INTO compute_schema_version (singleton, version)
                     SELECT true, count(*) FROM compute_migrations WHERE name LIKE 'core/%'
                     ON CONFLICT (singleton) DO UPDATE SET version = excluded.version",
                )
                .execute(tx.conn())
                .await?;
            }
            tx.commit().await?;
            tracing::info!(migration = %name, "applied migration");
            report.applied.push(name);
        }

        let mut tx = self.locked_tx(db).await?;
        report.raised_epoch = events::raise_epoch_if_behind(&mut tx).await?;
        tx.commit().await?;
        set_idle_in_transaction_timeout(db).await;
        Ok(report)
    }

    /// A read-committed transaction holding the migration lock until it ends.
    async fn locked_tx(&self, db: &Db) -> Result<Tx> {
        let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
        sql::query("SELECT pg_advisory_xact_lock($1, $2)")
            .bind(MIGRATION_LOCK.0)
            .bind(MIGRATION_LOCK.1)
            .execute(tx.conn())
            .await?;
        Ok(tx)
    }

    /// Reads the ledger and applies the three refusal rules. Returns the names in the ledger.
    pub async fn check_ledger(&self, tx: &mut Tx) -> Result<BTreeSet<String>> {
        let exists: bool =
            sql::query_scalar("SELECT to_regclass('compute_migrations') IS NOT NULL").fetch_one(tx.conn()).await?;
        if !exists {
            return Ok(BTreeSet::new());
        }
        let names: Vec<String> =
            sql::query_scalar("SELECT name FROM compute_migrations ORDER BY name").fetch_all(tx.conn()).await?;
        let base_version: Option<i32> =
            sql::query_scalar("SELECT version FROM compute_schema_version").fetch_optional(tx.conn()).await?;
        let ledger: BTreeSet<String> = names.into_iter().collect();
        let problems = self.refusals(&ledger, base_version);
        if !problems.is_empty() {
            return Err(Error::InvalidConfig(format!(
                "refusing to migrate: the migrations ledger holds what this build cannot account for: {}",
                problems.join("; ")
            )));
        }
        Ok(ledger)
    }

    fn refusals(&self, ledger: &BTreeSet<String>, base_version: Option<i32>) -> Vec<String> {
        let mut last_of_owner: BTreeMap<&str, &Migration> = BTreeMap::new();
        for migration in &self.migrations {
            last_of_owner.insert(&migration.owner, migration);
        }
        let known: BTreeSet<String> = self.migrations.iter().map(Migration::name).collect();
        let mut problems = Vec::new();
        for name in ledger {
            if known.contains(name) {
                continue;
            }
            // Owners this build has no migrations for are ignored (a module dropped from the configuration).
            let Some(parsed) = parse_ledger_name(name) else { continue };
            let Some(last) = last_of_owner.get(parsed.owner) else { continue };
            match parsed.number {
                Some(number) if number > last.number => problems.push(format!(
                    "{name} is later than this build's last {} migration {} (a newer release migrated this \
                     database)",
                    parsed.owner,
                    last.name()
                )),
                _ => problems.push(format!(
                    "{name} is not a migration of this build, yet at or below its last {} migration {} (a \
                     migration was renamed or removed)",
                    parsed.owner,
                    last.name()
                )),
            }
        }
        if let Some(version) = base_version
            && version > self.base_version()
        {
            problems.push(format!(
                "base schema version {version} is above this build's {} (a newer release migrated this database)",
                self.base_version()
            ));
        }
        problems
    }
}

/// How long a session may sit idle inside an open transaction before PostgreSQL ends it. The horizon every log
/// reader waits for is cluster-wide, so a forgotten transaction would hold back all of them.
pub const IDLE_IN_TRANSACTION_TIMEOUT: &str = "60s";

/// Sets `idle_in_transaction_session_timeout` on the database itself (never as session state, which PgBouncer
/// would leak between clients). It needs the database's owner; without that it is left as it is, with a warning.
async fn set_idle_in_transaction_timeout(db: &Db) {
    let result = async {
        let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
        let statement = format!(
            "DO $$ BEGIN
                 EXECUTE format('ALTER DATABASE %I SET idle_in_transaction_session_timeout = %L',
                                current_database(), '{IDLE_IN_TRANSACTION_TIMEOUT}');
             END $$"
        );
        sqlx::raw_sql(AssertSqlSafe(statement)).execute(tx.conn()).await?;
        tx.commit().await
    }
    .await;
    if let Err(err) = result {
        tracing::warn!(
            error = %err,
            "could not set idle_in_transaction_session_timeout on the database; set it as its owner: \
             ALTER DATABASE <name> SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION_TIMEOUT}'"
        );
    }
}

/// Refuses a database whose encoding is not UTF-8. Text reaches the server as Unicode (a call's arguments are
/// ASCII with Unicode escapes, JSON documents may hold `\u` escapes), which another encoding may not hold, and
/// SQL_ASCII would store bytes without checking them.
async fn check_encoding(tx: &mut Tx) -> Result<()> {
    let encoding: String = sql::query_scalar("SELECT current_setting('server_encoding')").fetch_one(tx.conn()).await?;
    if encoding != "UTF8" {
        return Err(Error::InvalidConfig(format!(
            "the database's encoding is {encoding}; Better Compute needs a UTF8 database \
             (CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0)"
        )));
    }
    Ok(())
}

/// Creates the ledger tables on a fresh database. Runs under the migration lock. PostgreSQL's notice that a table
/// already exists is kept out of the log (every start after the first would print two).
async fn bootstrap_ledger(tx: &mut Tx) -> Result<()> {
    sqlx::raw_sql(
        "SET LOCAL client_min_messages = warning;
         CREATE TABLE IF NOT EXISTS compute_migrations (
             name text PRIMARY KEY,
             applied_at timestamptz NOT NULL
         );
         CREATE TABLE IF NOT EXISTS compute_schema_version (
             singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
             version integer NOT NULL CHECK (version >= 0)
         );",
    )
    .execute(tx.conn())
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_migrations_start_with_the_base_schema() {
        let migrator = Migrator::new(EMBEDDED.to_vec()).expect("embedded migrations are well ordered");
        let names: Vec<String> = migrator.migrations().iter().map(Migration::name).collect();
        assert_eq!(names[0], "core/0001_clock");
        assert_eq!(names[1], "core/0002_events");
        assert!(migrator.base_version() >= 5);
    }

    #[test]
    fn disordered_sets_are_refused() {
        let m = |owner: &str, number: u32| Migration::new(owner, number, "x", "SELECT 1");
        assert!(Migrator::new(vec![m("core", 2), m("core", 1)]).is_err());
        assert!(Migrator::new(vec![m("capacity", 1), m("core", 1)]).is_err());
        assert!(Migrator::new(vec![m("core", 1), m("capacity", 1), m("nodes", 1), m("capacity", 2)]).is_err());
        assert!(Migrator::new(vec![m("core", 1), m("capacity", 1), m("capacity", 3)]).is_ok());
    }
}
