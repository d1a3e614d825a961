//! Leases: takeover only after expiry and with a higher epoch; the old owner's fenced work is refused.

use std::time::Duration;

use bc_eventstore::clock;
use bc_eventstore::lease::{self, LeaseConfig};
use bc_eventstore::testing::TestDb;
use bc_eventstore::{Db, Error, TxOptions, sql};

const T0: i64 = 1_893_456_000_000;
const TTL: Duration = Duration::from_secs(10);

#[tokio::test]
async fn takeover_only_after_expiry_and_with_a_higher_epoch() {
    let t = TestDb::new().await;
    clock::use_sim_clock(&t.db, T0).await.expect("sim");
    let a = lease::acquire(&t.db, "shard:1", "prc_a", TTL).await.expect("acquire").expect("free lease");
    assert_eq!(a.epoch, 1);
    assert_eq!(lease::acquire(&t.db, "shard:1", "prc_b", TTL).await.expect("acquire"), None, "held");

    // At the instant of expiry it is still held (takeover needs expires_at < now).
    clock::set_sim_clock(&t.db, T0 + 10_000).await.expect("move");
    assert_eq!(lease::acquire(&t.db, "shard:1", "prc_b", TTL).await.expect("acquire"), None, "still held");
    // The owner can renew at the same epoch.
    lease::renew(&t.db, &a).await.expect("renew");
    clock::set_sim_clock(&t.db, T0 + 19_999).await.expect("move");
    assert_eq!(lease::acquire(&t.db, "shard:1", "prc_b", TTL).await.expect("acquire"), None, "renewed");
    let again = lease::acquire(&t.db, "shard:1", "prc_a", TTL).await.expect("acquire").expect("own lease");
    assert_eq!(again.epoch, 1, "re-acquiring one's own lease keeps the epoch");

    clock::set_sim_clock(&t.db, T0 + 30_001).await.expect("move past expiry");
    let b = lease::acquire(&t.db, "shard:1", "prc_b", TTL).await.expect("acquire").expect("expired lease");
    assert_eq!(b.epoch, 2, "a new owner gets a higher epoch");

    let err = lease::renew(&t.db, &a).await.expect_err("the old owner lost it");
    assert!(matches!(err, Error::LeaseLost { .. }), "{err}");
    let err = lease::begin_fenced(&t.db, &a, TxOptions::COMMAND).await.expect_err("fenced out");
    assert!(matches!(err, Error::LeaseLost { .. }), "{err}");
    lease::begin_fenced(&t.db, &b, TxOptions::COMMAND).await.expect("the new owner passes the fence");
}

#[tokio::test]
async fn release_lets_another_owner_take_over_at_once_with_a_higher_epoch() {
    let t = TestDb::new().await;
    clock::use_sim_clock(&t.db, T0).await.expect("sim");
    let a = lease::acquire(&t.db, "gateway:x", "prc_a", TTL).await.expect("acquire").expect("free");
    lease::release(&t.db, &a).await.expect("release");
    let b = lease::acquire(&t.db, "gateway:x", "prc_b", TTL).await.expect("acquire").expect("released");
    assert_eq!(b.epoch, 2);
}

#[tokio::test]
async fn a_fenced_transaction_holds_up_the_takeover_until_it_ends() {
    let t = TestDb::new().await;
    clock::use_sim_clock(&t.db, T0).await.expect("sim");
    let a = lease::acquire(&t.db, "pool:p", "prc_a", TTL).await.expect("acquire").expect("free");
    let fenced = lease::begin_fenced(&t.db, &a, TxOptions::COMMAND).await.expect("fenced");

    // Time passes beyond the TTL while A's transaction is open; B tries to take over and must wait for A's
    // row lock, then win.
    clock::set_sim_clock(&t.db, T0 + 60_000).await.expect("move");
    let db = t.db.clone();
    let takeover = tokio::spawn(async move { lease::acquire(&db, "pool:p", "prc_b", TTL).await });
    wait_for_lock_wait(&t.db).await;
    assert!(!takeover.is_finished());
    fenced.commit().await.expect("A's work commits: it held the fence");
    let b = takeover.await.expect("join").expect("acquire").expect("taken over");
    assert_eq!(b.epoch, 2);
}

async fn wait_for_lock_wait(db: &Db) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
        let waiting: i64 = sql::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(tx.conn())
        .await
        .expect("activity");
        tx.commit().await.expect("commit");
        if waiting > 0 {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "the takeover never waited on the lock");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn owner_ids_are_unique_per_process_and_defaults_match_the_design() {
    let owner = lease::process_owner_id();
    assert!(owner.starts_with("prc_") && owner.len() == 30, "{owner}");
    assert_eq!(owner, lease::process_owner_id(), "stable within the process");
    assert_eq!(LeaseConfig::SHARD.ttl, Duration::from_secs(15));
    assert_eq!(LeaseConfig::GATEWAY.ttl, Duration::from_secs(20));
    assert_eq!(LeaseConfig::SHARD.renew_every, Duration::from_secs(5));
    assert_eq!(LeaseConfig::SHARD.max_fenced_transaction(), Duration::from_secs(10));
}

#[tokio::test]
async fn a_keeper_holds_renews_and_releases_its_lease() {
    let t = TestDb::new().await;
    let config = LeaseConfig { ttl: Duration::from_secs(2), renew_every: Duration::from_millis(50) };
    let mut keeper = lease::LeaseKeeper::start(t.db.clone(), "singleton:test".into(), "prc_keeper".into(), config);
    let held = tokio::time::timeout(Duration::from_secs(30), keeper.held()).await.expect("in time").expect("held");
    assert_eq!(held.epoch, 1);
    assert!(keeper.clock().is_some(), "the clock is anchored at renewal");

    // Renewals keep pushing the expiry, so a competitor never gets it while the keeper runs.
    let first_expiry = expiry_ms(&t.db, "singleton:test").await;
    wait_until(|| async { expiry_ms(&t.db, "singleton:test").await > first_expiry }).await;
    assert_eq!(lease::acquire(&t.db, "singleton:test", "prc_other", config.ttl).await.expect("acquire"), None);

    keeper.stop().await;
    let other = lease::acquire(&t.db, "singleton:test", "prc_other", config.ttl).await.expect("acquire");
    assert_eq!(other.map(|l| l.epoch), Some(2), "released at once, taken over with a higher epoch");
}

#[tokio::test]
async fn a_keeper_notices_a_takeover_and_stops_claiming_the_lease() {
    let t = TestDb::new().await;
    clock::use_sim_clock(&t.db, T0).await.expect("sim");
    let config = LeaseConfig { ttl: Duration::from_secs(10), renew_every: Duration::from_millis(50) };
    let mut keeper = lease::LeaseKeeper::start(t.db.clone(), "shard:7".into(), "prc_keeper".into(), config);
    tokio::time::timeout(Duration::from_secs(30), keeper.held()).await.expect("in time").expect("held");

    // Another process takes the lease over behind the keeper's back (as after a long pause).
    let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    sql::query("UPDATE leases SET owner = 'prc_other', epoch = epoch + 1 WHERE name = 'shard:7'")
        .execute(tx.conn())
        .await
        .expect("take over");
    tx.commit().await.expect("commit");
    tokio::time::timeout(Duration::from_secs(30), keeper.lost()).await.expect("the keeper notices");
    assert_eq!(keeper.current(), None);
    keeper.stop().await;
}

async fn expiry_ms(db: &Db, name: &str) -> i64 {
    let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let ms: i64 =
        sql::query_scalar("SELECT floor(extract(epoch FROM expires_at) * 1000)::int8 FROM leases WHERE name = $1")
            .bind(name)
            .fetch_one(tx.conn())
            .await
            .expect("lease row");
    tx.commit().await.expect("commit");
    ms
}

async fn wait_until<F, Fut>(mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !condition().await {
        assert!(tokio::time::Instant::now() < deadline, "condition not reached in time");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
