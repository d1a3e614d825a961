//! The work queue: coalescing, claims that skip each other, completion guarded by the generation, backoff.

use std::time::Duration;

use bc_eventstore::queue::{self, Backoff, Enqueue};
use bc_eventstore::testing::TestDb;
use bc_eventstore::{Db, TxOptions, clock, sql};
use sqlx::Row as _;

const T0: i64 = 1_893_456_000_000;
const CLAIM: Duration = Duration::from_secs(30);

async fn enqueue(db: &Db, key: &str, not_before_ms: Option<i64>) {
    let mut tx = db.begin(TxOptions::COMMAND).await.expect("begin");
    queue::enqueue(&mut tx, &[Enqueue { key, shard: 0, not_before_ms }]).await.expect("enqueue");
    tx.commit().await.expect("commit");
}

async fn claim(db: &Db) -> Vec<queue::WorkItem> {
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    let items = queue::claim(&mut tx, &[0], 10, CLAIM).await.expect("claim");
    tx.commit().await.expect("commit");
    items
}

async fn complete(db: &Db, item: &queue::WorkItem) -> bool {
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    let done = queue::complete(&mut tx, item).await.expect("complete");
    tx.commit().await.expect("commit");
    done
}

#[tokio::test]
async fn a_key_dirtied_again_while_it_was_processed_survives_its_completion() {
    let t = TestDb::new().await;
    clock::use_sim_clock(&t.db, T0).await.expect("sim");
    enqueue(&t.db, "rsv_1:start", None).await;
    let first = claim(&t.db).await;
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].generation, 1);

    // While the worker processes it, a state change enqueues the key again.
    enqueue(&t.db, "rsv_1:start", None).await;
    assert!(!complete(&t.db, &first[0]).await, "the completion of generation 1 must not delete generation 2");

    let second = claim(&t.db).await;
    assert_eq!(second.len(), 1, "the key is due again at once");
    assert_eq!(second[0].generation, 2);
    assert!(complete(&t.db, &second[0]).await);
    assert!(claim(&t.db).await.is_empty());
}

#[tokio::test]
async fn enqueue_coalesces_and_keeps_the_earlier_time() {
    let t = TestDb::new().await;
    clock::use_sim_clock(&t.db, T0).await.expect("sim");
    enqueue(&t.db, "k", Some(T0 + 60_000)).await;
    enqueue(&t.db, "k", Some(T0 + 10_000)).await;
    enqueue(&t.db, "k", Some(T0 + 90_000)).await;
    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let row = sql::query(
        "SELECT gen, floor(extract(epoch FROM not_before) * 1000)::int8 AS not_before_ms FROM work_queue WHERE key = 'k'",
    )
    .fetch_one(tx.conn())
    .await
    .expect("row");
    let generation: i64 = row.try_get("gen").expect("gen");
    let not_before_ms: i64 = row.try_get("not_before_ms").expect("not_before");
    tx.commit().await.expect("commit");
    assert_eq!((generation, not_before_ms), (3, T0 + 10_000));

    assert!(claim(&t.db).await.is_empty(), "not due before its time");
    clock::set_sim_clock(&t.db, T0 + 10_000).await.expect("move");
    assert_eq!(claim(&t.db).await.len(), 1);

    // A batch naming the same key twice is queued once.
    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    queue::enqueue(
        &mut tx,
        &[
            Enqueue { key: "dup", shard: 0, not_before_ms: Some(T0 + 20_000) },
            Enqueue { key: "dup", shard: 0, not_before_ms: Some(T0 + 15_000) },
        ],
    )
    .await
    .expect("enqueue a batch with a repeated key");
    tx.commit().await.expect("commit");
}

#[tokio::test]
async fn concurrent_claims_never_hand_out_the_same_key() {
    let t = TestDb::new().await;
    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    let keys: Vec<String> = (0..40).map(|n| format!("key-{n:02}")).collect();
    let items: Vec<Enqueue<'_>> = keys.iter().map(|key| Enqueue { key, shard: 0, not_before_ms: None }).collect();
    queue::enqueue(&mut tx, &items).await.expect("enqueue");
    tx.commit().await.expect("commit");

    // One claimer holds its claim transaction open while the other claims: SKIP LOCKED passes over its rows.
    let mut holder = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    let held = queue::claim(&mut holder, &[0], 15, CLAIM).await.expect("claim");
    let other = claim(&t.db).await;
    holder.commit().await.expect("commit");
    assert_eq!(held.len(), 15);
    assert_eq!(other.len(), 10);
    assert!(other.iter().all(|o| held.iter().all(|h| h.key != o.key)), "no key claimed twice");

    // Claimed keys are not due again until the claim lapses.
    let rest = claim(&t.db).await;
    assert_eq!(rest.len(), 10);
    assert!(rest.iter().all(|r| held.iter().chain(&other).all(|h| h.key != r.key)));
}

#[tokio::test]
async fn a_failed_key_backs_off_and_is_claimed_again_later() {
    let t = TestDb::new().await;
    clock::use_sim_clock(&t.db, T0).await.expect("sim");
    enqueue(&t.db, "flaky", None).await;
    let item = claim(&t.db).await.pop().expect("claimed");
    let backoff = Backoff { base: Duration::from_secs(10), max: Duration::from_secs(60) };
    let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    queue::fail(&mut tx, &item, "node unreachable", &backoff).await.expect("fail");
    tx.commit().await.expect("commit");
    assert!(claim(&t.db).await.is_empty(), "backing off");
    clock::set_sim_clock(&t.db, T0 + 10_000).await.expect("move");
    let again = claim(&t.db).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].attempts, 2);
    for attempts in 1..10 {
        let delay = backoff.delay(attempts);
        assert!(delay <= backoff.max && delay >= backoff.base / 2, "{attempts}: {delay:?}");
    }
}

#[test]
fn shards_are_stable_and_in_range() {
    assert_eq!(queue::shard_for("rsv_abc", 16), queue::shard_for("rsv_abc", 16));
    let shards: std::collections::HashSet<i32> = (0..1000).map(|n| queue::shard_for(&format!("k{n}"), 16)).collect();
    assert_eq!(shards.len(), 16);
    assert!(shards.iter().all(|s| (0..16).contains(s)));
}

#[tokio::test]
async fn depth_counts_queued_and_due_keys_of_the_given_shards() {
    let t = TestDb::new().await;
    clock::use_sim_clock(&t.db, T0).await.expect("sim");
    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    queue::enqueue(
        &mut tx,
        &[
            Enqueue { key: "due", shard: 1, not_before_ms: Some(T0) },
            Enqueue { key: "later", shard: 1, not_before_ms: Some(T0 + 60_000) },
            Enqueue { key: "elsewhere", shard: 2, not_before_ms: Some(T0) },
        ],
    )
    .await
    .expect("enqueue");
    assert_eq!(queue::depth(&mut tx, &[1]).await.expect("depth"), (2, 1));
    assert_eq!(queue::depth(&mut tx, &[1, 2]).await.expect("depth"), (3, 2));
    tx.commit().await.expect("commit");
}
