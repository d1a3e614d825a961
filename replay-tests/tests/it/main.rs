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

#[tokio::test]
async fn reservation_endings() {
    replay(
        include_str!("../../data/reservation_endings.jsonl"),
        expect_file!["../../snapshots/reservation_endings.txt"],
    )
    .await;
}

#[tokio::test]
async fn agent_life() {
    replay(include_str!("../../data/agent_life.jsonl"), expect_file!["../../snapshots/agent_life.txt"]).await;
}

#[tokio::test]
async fn tenancy() {
    replay(include_str!("../../data/tenancy.jsonl"), expect_file!["../../snapshots/tenancy.txt"]).await;
}

#[tokio::test]
async fn images() {
    replay(include_str!("../../data/images.jsonl"), expect_file!["../../snapshots/images.txt"]).await;
}

#[tokio::test]
async fn instances() {
    replay(include_str!("../../data/instances.jsonl"), expect_file!["../../snapshots/instances.txt"]).await;
}

#[tokio::test]
async fn webhooks() {
    replay(include_str!("../../data/webhooks.jsonl"), expect_file!["../../snapshots/webhooks.txt"]).await;
}

/// The recorded logs, together, hold every event type this build knows: each type's `apply` in every read
/// model is held against a checked-in snapshot.
#[test]
fn every_event_type_appears_in_a_recorded_log() {
    let logs = [
        include_str!("../../data/fleet_basics.jsonl"),
        include_str!("../../data/reservation_lifecycle.jsonl"),
        include_str!("../../data/reservation_endings.jsonl"),
        include_str!("../../data/agent_life.jsonl"),
        include_str!("../../data/legacy_site.jsonl"),
        include_str!("../../data/tenancy.jsonl"),
        include_str!("../../data/images.jsonl"),
        include_str!("../../data/instances.jsonl"),
        include_str!("../../data/webhooks.jsonl"),
    ];
    let recorded: std::collections::BTreeSet<String> =
        logs.iter().flat_map(|log| parse(log).expect("parse the log")).map(|line| line.event_type.clone()).collect();
    let missing: Vec<&str> =
        bc_domain::stream::AnyEvent::event_types().into_iter().filter(|t| !recorded.contains(*t)).collect();
    assert!(missing.is_empty(), "no recorded log holds {missing:?}: add them to a scenario and record it again");
}
