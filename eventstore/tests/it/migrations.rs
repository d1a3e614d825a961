//! The migrations runner: the ledger, the three refusal rules, concurrent migrators, failed migrations.

use bc_eventstore::migrate::{EMBEDDED, Migration, Migrator};
use bc_eventstore::testing::TestDb;
use bc_eventstore::{Db, Error, TxOptions, sql};

fn core_and(extra: &[(&str, u32, &str, &str)]) -> Migrator {
    let mut migrations: Vec<Migration> = EMBEDDED.to_vec();
    migrations.extend(extra.iter().map(|(owner, number, slug, sql)| Migration::new(owner, *number, slug, sql)));
    Migrator::new(migrations).expect("well ordered")
}

async fn ledger(db: &Db) -> Vec<String> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let names = sql::query_scalar("SELECT name FROM compute_migrations ORDER BY name")
        .fetch_all(tx.conn())
        .await
        .expect("ledger");
    tx.commit().await.expect("commit");
    names
}

async fn exec(db: &Db, statement: &'static str) {
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    sql::query(statement).execute(tx.conn()).await.expect(statement);
    tx.commit().await.expect("commit");
}

async fn table_exists(db: &Db, table: &str) -> bool {
    let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let exists: bool =
        sql::query_scalar("SELECT to_regclass($1) IS NOT NULL").bind(table).fetch_one(tx.conn()).await.expect("q");
    tx.commit().await.expect("commit");
    exists
}

#[tokio::test]
async fn a_fresh_database_gets_every_migration_once_and_a_second_run_skips_them() {
    let t = TestDb::empty().await;
    let report = Migrator::embedded().run(&t.db).await.expect("migrate");
    let names: Vec<String> = EMBEDDED.iter().map(Migration::name).collect();
    assert_eq!(report.applied, names);
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(ledger(&t.db).await, sorted);
    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let version: i32 =
        sql::query_scalar("SELECT version FROM compute_schema_version").fetch_one(tx.conn()).await.expect("v");
    let has_gist: bool = sql::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'btree_gist')")
        .fetch_one(tx.conn())
        .await
        .expect("ext");
    tx.commit().await.expect("commit");
    assert_eq!(version, Migrator::embedded().base_version());
    assert!(has_gist);

    let again = Migrator::embedded().run(&t.db).await.expect("migrate again");
    assert!(again.applied.is_empty());
    assert_eq!(again.already_applied, EMBEDDED.len());
}

#[tokio::test]
async fn a_database_not_in_utf8_is_refused_before_anything_is_written() {
    let t = TestDb::empty_sql_ascii().await;
    let err = Migrator::embedded().run(&t.db).await.expect_err("SQL_ASCII is refused");
    assert_eq!(err.code(), "INVALID_CONFIG", "{err}");
    assert!(err.to_string().contains("SQL_ASCII") && err.to_string().contains("UTF8"), "{err}");
    assert!(!table_exists(&t.db, "compute_migrations").await, "nothing was written");
}

#[tokio::test]
async fn a_later_migration_of_a_known_owner_is_refused() {
    let t = TestDb::empty().await;
    let newer = core_and(&[("extra", 1, "device_links", "SELECT 1"), ("extra", 2, "holds", "SELECT 1")]);
    newer.run(&t.db).await.expect("the newer release migrates");
    let older = core_and(&[("extra", 1, "device_links", "SELECT 1")]);
    let err = older.run(&t.db).await.expect_err("the older release refuses");
    assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
    assert_eq!(err.code(), "INVALID_CONFIG");
    assert!(err.to_string().contains("extra/0002_holds"), "{err}");
}

#[tokio::test]
async fn an_unknown_name_at_or_below_an_owners_last_number_is_refused() {
    let t = TestDb::empty().await;
    core_and(&[("extra", 1, "device_links", "SELECT 1")]).run(&t.db).await.expect("first release");
    let renamed = core_and(&[("extra", 1, "links", "SELECT 1"), ("extra", 2, "holds", "SELECT 1")]);
    let err = renamed.run(&t.db).await.expect_err("refused");
    assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
    assert!(err.to_string().contains("extra/0001_device_links"), "{err}");
    assert!(!ledger(&t.db).await.contains(&"extra/0002_holds".to_owned()), "nothing applied after a refusal");
}

#[tokio::test]
async fn a_base_schema_version_above_this_builds_is_refused() {
    let t = TestDb::empty().await;
    Migrator::embedded().run(&t.db).await.expect("migrate");
    exec(&t.db, "UPDATE compute_schema_version SET version = 99").await;
    let err = Migrator::embedded().run(&t.db).await.expect_err("refused");
    assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
    assert!(err.to_string().contains("base schema version 99"), "{err}");
}

#[tokio::test]
async fn ledger_entries_of_unknown_owners_are_ignored() {
    let t = TestDb::empty().await;
    core_and(&[("plugin", 1, "extra", "CREATE TABLE plugin_extra (id int)")]).run(&t.db).await.expect("with plugin");
    Migrator::embedded().run(&t.db).await.expect("without the plugin, the ledger entry is ignored");
    assert!(table_exists(&t.db, "plugin_extra").await, "its tables stay");
}

#[tokio::test]
async fn two_migrators_at_once_apply_each_migration_once() {
    let t = TestDb::empty().await;
    let migrator = core_and(&[
        ("extra", 1, "counter", "CREATE TABLE applied (n int); INSERT INTO applied VALUES (1)"),
        ("extra", 2, "count_again", "INSERT INTO applied VALUES (2)"),
    ]);
    let other = t.pool(&bc_eventstore::testing::test_db_config());
    let (a, b) = tokio::join!(migrator.run(&t.db), migrator.run(&other));
    let (a, b) = (a.expect("first migrator"), b.expect("second migrator"));
    let mut applied: Vec<String> = a.applied.iter().chain(&b.applied).cloned().collect();
    applied.sort();
    let mut expected: Vec<String> = migrator.migrations().iter().map(Migration::name).collect();
    expected.sort();
    assert_eq!(applied, expected, "each migration applied by exactly one of them");

    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let rows: Vec<i32> = sql::query_scalar("SELECT n FROM applied ORDER BY n").fetch_all(tx.conn()).await.expect("q");
    tx.commit().await.expect("commit");
    assert_eq!(rows, vec![1, 2]);
}

#[tokio::test]
async fn a_failing_migration_leaves_neither_its_changes_nor_its_ledger_row() {
    let t = TestDb::empty().await;
    let migrator = core_and(&[
        ("extra", 1, "fine", "CREATE TABLE fine (id int)"),
        ("extra", 2, "broken", "CREATE TABLE half_done (id int); SELECT 1 / 0"),
        ("extra", 3, "after", "CREATE TABLE after_broken (id int)"),
    ]);
    let err = migrator.run(&t.db).await.expect_err("fails");
    assert!(matches!(&err, Error::Migration { name, .. } if name == "extra/0002_broken"), "{err}");
    assert!(table_exists(&t.db, "fine").await);
    assert!(!table_exists(&t.db, "half_done").await, "the failed migration's changes are rolled back");
    assert!(!table_exists(&t.db, "after_broken").await, "nothing after it ran");
    let names = ledger(&t.db).await;
    assert!(names.contains(&"extra/0001_fine".to_owned()));
    assert!(!names.contains(&"extra/0002_broken".to_owned()), "no ledger row for the failed migration");
}

#[tokio::test]
async fn the_migration_lock_is_a_transaction_lock() {
    let t = TestDb::empty().await;
    Migrator::embedded().run(&t.db).await.expect("migrate");
    // After the run no advisory lock remains held by any session: nothing outlives a transaction.
    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let held: i64 = sql::query_scalar(
        "SELECT count(*) FROM pg_locks
         WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_one(tx.conn())
    .await
    .expect("locks");
    tx.commit().await.expect("commit");
    assert_eq!(held, 0);
}

#[tokio::test]
async fn migrate_sets_the_idle_in_transaction_timeout_on_the_database() {
    let t = TestDb::empty().await;
    Migrator::embedded().run(&t.db).await.expect("migrate");
    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let settings: Vec<String> = sql::query_scalar(
        "SELECT unnest(setconfig) FROM pg_db_role_setting
         WHERE setrole = 0 AND setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_all(tx.conn())
    .await
    .expect("settings");
    tx.commit().await.expect("commit");
    let expected =
        format!("idle_in_transaction_session_timeout={}", bc_eventstore::migrate::IDLE_IN_TRANSACTION_TIMEOUT);
    assert!(settings.contains(&expected), "{settings:?}");
}
