//! The one clock: the simulated clock moves only forward, and column defaults follow it.

use bc_eventstore::clock::{self, ClockAnchor, ClockMode};
use bc_eventstore::events::ExpectedVersion;
use bc_eventstore::testing::TestDb;
use bc_eventstore::{Error, Position, TxOptions, sql};

use crate::support::{self, event};

/// 2030-01-01T00:00:00Z.
const T0: i64 = 1_893_456_000_000;

#[tokio::test]
async fn the_simulated_clock_never_moves_back_and_column_defaults_follow_it() {
    let t = TestDb::new().await;
    assert_eq!(clock::compute_now_mode(&t.db).await.expect("mode"), ClockMode::System);
    clock::use_sim_clock(&t.db, T0).await.expect("use");
    assert_eq!(clock::compute_now_mode(&t.db).await.expect("mode"), ClockMode::Sim);

    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    assert_eq!(clock::compute_now_ms(&mut tx).await.expect("now"), T0);
    tx.commit().await.expect("commit");

    support::append(&t.db, "s", ExpectedVersion::NO_STREAM, &[event(1)]).await.expect("append");
    clock::set_sim_clock(&t.db, T0 + 5_000).await.expect("forward");
    support::append(&t.db, "s", ExpectedVersion::Exact(1), &[event(2)]).await.expect("append");
    let read = support::read_until(&t.db, Position::START, 2).await;
    assert_eq!(read.iter().map(|e| e.recorded_at_ms).collect::<Vec<_>>(), vec![T0, T0 + 5_000]);

    let err = clock::set_sim_clock(&t.db, T0 + 4_999).await.expect_err("backwards");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(err.to_string().contains("only moves forward"), "{err}");
    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    assert_eq!(clock::compute_now_ms(&mut tx).await.expect("now"), T0 + 5_000, "unchanged by the refusal");
    tx.commit().await.expect("commit");
    clock::set_sim_clock(&t.db, T0 + 5_000).await.expect("standing still is allowed");

    clock::restore_system_clock(&t.db).await.expect("restore");
    assert_eq!(clock::compute_now_mode(&t.db).await.expect("mode"), ClockMode::System);
    let err = clock::set_sim_clock(&t.db, T0 + 10_000).await.expect_err("not in use");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
}

#[tokio::test]
async fn compute_now_mode_tells_custom_and_missing_apart() {
    let t = TestDb::new().await;
    let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    sql::query("CREATE OR REPLACE FUNCTION compute_now() RETURNS timestamptz LANGUAGE sql STABLE AS $$ SELECT timestamptz '2001-01-01' $$")
        .execute(tx.conn())
        .await
        .expect("redefine");
    tx.commit().await.expect("commit");
    assert_eq!(clock::compute_now_mode(&t.db).await.expect("mode"), ClockMode::Custom);

    let empty = TestDb::empty().await;
    assert_eq!(clock::compute_now_mode(&empty.db).await.expect("mode"), ClockMode::Missing);
}

#[tokio::test]
async fn a_process_anchors_business_time_to_the_database() {
    let t = TestDb::new().await;
    clock::use_sim_clock(&t.db, T0).await.expect("use");
    let anchor = ClockAnchor::sample(&t.db).await.expect("sample");
    assert_eq!(anchor.mode(), ClockMode::Sim);
    assert_eq!(anchor.now_ms(), T0);
    // The simulated clock's jump does not look like skew: skew compares real clocks.
    assert!(!anchor.is_skewed(), "skew {} ms", anchor.skew_ms());
}
