//! Connections: a dropped idle connection is replaced, and no statement is ever named.

use std::time::Duration;

use bc_eventstore::events::ExpectedVersion;
use bc_eventstore::testing::{self, TestDb};
use bc_eventstore::{DbConfig, Position, TxOptions, clock, lease, sql};

use crate::support::{self, event};

#[tokio::test]
async fn a_dropped_idle_connection_is_replaced_without_an_error() {
    let t = TestDb::new().await;
    let config = DbConfig {
        max_connections: 1,
        application_name: Some("bc-dropped-conn".to_owned()),
        ..testing::test_db_config()
    };
    let db = t.pool(&config);
    db.ping().await.expect("first use");

    // The server (or a restart, or a proxy) ends the idle connection under the pool.
    let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    let terminated: i64 = sql::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                               WHERE application_name = 'bc-dropped-conn') AS t",
    )
    .fetch_one(tx.conn())
    .await
    .expect("terminate");
    tx.commit().await.expect("commit");
    assert_eq!(terminated, 1);

    for _ in 0..3 {
        db.ping().await.expect("the pool reconnects");
    }
}

#[tokio::test]
async fn no_statement_is_ever_named() {
    let t = TestDb::new().await;
    let config = DbConfig { max_connections: 1, ..testing::test_db_config() };
    let db = t.pool(&config);
    support::append(&db, "s", ExpectedVersion::NO_STREAM, &[event(1)]).await.expect("append");
    support::read_until(&db, Position::START, 1).await;
    clock::use_sim_clock(&db, 1_893_456_000_000).await.expect("clock");
    lease::acquire(&db, "shard:3", "prc_y", Duration::from_secs(5)).await.expect("lease");
    // The pool has one connection, so this runs on the connection that ran everything above.
    let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let named: i64 =
        sql::query_scalar("SELECT count(*) FROM pg_prepared_statements").fetch_one(tx.conn()).await.expect("q");
    tx.commit().await.expect("commit");
    assert_eq!(named, 0);
}
