//! Every recorded log, loaded by appending its events again and replayed through every projection, must give
//! exactly its checked-in snapshot (`UPDATE_EXPECT=1 cargo test -p bc-replay-tests` rewrites them), and every
//! read model must equal its rebuild from the log.

use bc_eventstore::testing::TestDb;
use bc_projections::{models, rebuild};
use bc_replay_tests::{load, parse, run_read_models, snapshot};
use expect_test::{ExpectFile, expect_file};

async fn replay(log: &str, expected: ExpectFile) {
    let lines = parse(log).expect("parse the log");
    assert!(!lines.is_empty());
    let t = TestDb::new().await;
    load(&t.db, &lines).await.expect("load");
    run_read_models(&t.db).await.expect("read models");
    expected.assert_eq(&snapshot(&t.db).await.expect("snapshot"));
    for projection in models::read_models() {
        for (table, differences) in rebuild::verify(&t.db, projection.as_ref()).await.expect("verify") {
            assert_eq!(differences, 0, "{table} differs from its rebuild");
        }
    }
}

#[tokio::test]
async fn fleet_basics() {
    replay(include_str!("../../data/fleet_basics.jsonl"), expect_file!["../../snapshots/fleet_basics.txt"]).await;
}

#[tokio::test]
async fn reservation_lifecycle() {
    replay(
        include_str!("../../data/reservation_lifecycle.jsonl"),
        expect_file!["../../snapshots/reservation_lifecycle.txt"],
    )
    .await;
}

#[tokio::test]
async fn an_old_schema_version_replays_through_its_upcaster() {
    // site.created version 1 called the region `region`; this build writes version 2 (`iamRegion`).
    replay(include_str!("../../data/legacy_site.jsonl"), expect_file!["../../snapshots/legacy_site.txt"]).await;
}
