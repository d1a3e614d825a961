//! The projection framework against real PostgreSQL: batches and checkpoints, leases and fencing, versions and
//! switches, rebuild comparisons. A test projection counts events per stream.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bc_domain::event::EventMetadata;
use bc_eventstore::events::{self, AppendBatch, ExpectedVersion, NewEvent};
use bc_eventstore::lease::{self, Lease};
use bc_eventstore::testing::TestDb;
use bc_eventstore::{Db, Error, Position, Result, Tx, TxOptions, clock, sql};
use bc_projections::framework::{self, Envelope, Projection, VersionState};
use bc_projections::rebuild;
use futures_util::future::BoxFuture;

/// Counts events per stream; version 2 also counts the streams' event types it saw.
#[derive(Debug, Clone, Copy)]
struct Counter {
    version: u32,
    only: Option<&'static str>,
}

const V1_TABLES: &[&str] = &["counter_v1"];
const V2_TABLES: &[&str] = &["counter_v2"];

impl Projection for Counter {
    fn name(&self) -> &'static str {
        "counter"
    }

    fn version(&self) -> u32 {
        self.version
    }

    fn event_types(&self) -> &'static [&'static str] {
        match self.only {
            Some("test.special") => &["test.special"],
            _ => &[],
        }
    }

    fn tables(&self) -> &'static [&'static str] {
        if self.version == 1 { V1_TABLES } else { V2_TABLES }
    }

    fn apply<'a>(&'a self, tx: &'a mut Tx, events: &'a [Envelope]) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            for envelope in events {
                let query = if self.version == 1 {
                    "INSERT INTO counter_v1 (stream_id, events) VALUES ($1, 1)
                     ON CONFLICT (stream_id) DO UPDATE SET events = counter_v1.events + 1"
                } else {
                    "INSERT INTO counter_v2 (stream_id, events, kinds) VALUES ($1, 1, ARRAY[$2])
                     ON CONFLICT (stream_id) DO UPDATE SET events = counter_v2.events + 1,
                         kinds = (SELECT array_agg(DISTINCT k ORDER BY k) FROM unnest(counter_v2.kinds || $2) AS k)"
                };
                sql::query(query)
                    .bind(&envelope.recorded.stream_id)
                    .bind(&envelope.recorded.event_type)
                    .execute(tx.conn())
                    .await?;
            }
            Ok(())
        })
    }
}

/// Records, for each batch, whether the step set its commit not to wait for the WAL to reach the disk (the
/// test cluster never waits, so the setting's source tells, not its value).
#[derive(Debug, Clone, Copy)]
struct CommitProbe;

impl Projection for CommitProbe {
    fn name(&self) -> &'static str {
        "commit_probe"
    }

    fn version(&self) -> u32 {
        1
    }

    fn event_types(&self) -> &'static [&'static str] {
        &[]
    }

    fn tables(&self) -> &'static [&'static str] {
        &["commit_probe_v1"]
    }

    fn apply<'a>(&'a self, tx: &'a mut Tx, events: &'a [Envelope]) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            sql::query(
                "INSERT INTO commit_probe_v1 (events, synchronous_commit)
                 SELECT $1, setting || ' from ' || source FROM pg_settings WHERE name = 'synchronous_commit'",
            )
            .bind(events.len() as i32)
            .execute(tx.conn())
            .await?;
            Ok(())
        })
    }
}

const V1: Counter = Counter { version: 1, only: None };
const V2: Counter = Counter { version: 2, only: None };

async fn setup() -> TestDb {
    let t = TestDb::new().await;
    let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    sqlx::raw_sql(
        "CREATE TABLE counter_v1 (stream_id text PRIMARY KEY, events int NOT NULL);
         CREATE TABLE counter_v2 (stream_id text PRIMARY KEY, events int NOT NULL, kinds text[] NOT NULL);
         CREATE TABLE commit_probe_v1 (batch serial PRIMARY KEY, events int NOT NULL, synchronous_commit text NOT NULL);",
    )
    .execute(tx.conn())
    .await
    .expect("tables");
    tx.commit().await.expect("commit");
    t
}

async fn append(db: &Db, stream: &str, event_type: &str, n: usize) {
    let events: Vec<NewEvent> =
        (0..n).map(|i| NewEvent::encode(event_type, 1, &i, &EventMetadata::default()).expect("encode")).collect();
    let mut tx = db.begin(TxOptions::COMMAND).await.expect("begin");
    events::append(
        &mut tx,
        AppendBatch { stream_id: stream, tenant_id: None, expected: ExpectedVersion::Any, events: &events },
    )
    .await
    .expect("append");
    tx.commit().await.expect("commit");
}

async fn lease_for(db: &Db, projection: &dyn Projection, owner: &str) -> Lease {
    lease::acquire(db, &projection.lease_name(), owner, Duration::from_secs(30)).await.expect("acquire").expect("free")
}

/// Steps until the projection reports it caught up. The horizon is cluster-wide, so other tests may hold it back
/// for a moment: keep stepping until nothing is left.
async fn catch_up(db: &Db, projection: &dyn Projection, lease: &Lease, total_events: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        framework::step(db, projection, lease, 100).await.expect("step");
        let checkpoint = checkpoint(db, projection).await;
        if checkpoint.events_passed >= total_events {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "never caught up: {checkpoint:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the first `n` events of the log are below the cluster-wide horizon (other tests' transactions
/// may hold it back), so that a step reads them all at once rather than finding nothing and calling itself
/// caught up.
async fn visible(db: &Db, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
        let seen = events::read_after(&mut tx, Position::START, n as u32).await.expect("read").len();
        tx.commit().await.expect("commit");
        if seen >= n {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "only {seen} of {n} events ever became visible");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn checkpoint(db: &Db, projection: &dyn Projection) -> framework::Checkpoint {
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    let checkpoint =
        framework::lock_checkpoint(&mut tx, projection.name(), projection.version()).await.expect("checkpoint");
    tx.commit().await.expect("commit");
    checkpoint
}

async fn total(db: &Db, table: &'static str) -> i64 {
    let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let query = if table == "counter_v1" {
        "SELECT coalesce(sum(events), 0)::int8 FROM counter_v1"
    } else {
        "SELECT coalesce(sum(events), 0)::int8 FROM counter_v2"
    };
    let n: i64 = sql::query_scalar(query).fetch_one(tx.conn()).await.expect("sum");
    tx.commit().await.expect("commit");
    n
}

#[tokio::test]
async fn a_batch_and_its_checkpoint_commit_together_and_quiet_projections_advance() {
    let t = setup().await;
    append(&t.db, "a", "test.plain", 3).await;
    append(&t.db, "b", "test.special", 2).await;
    append(&t.db, "c", "test.plain", 4).await;

    let quiet = Counter { version: 1, only: Some("test.special") };
    let lease = lease_for(&t.db, &quiet, "prc_a").await;
    catch_up(&t.db, &quiet, &lease, 9).await;
    let checkpoint = checkpoint(&t.db, &quiet).await;
    assert_eq!(checkpoint.events_applied, 2, "only its own types are applied");
    assert_eq!(checkpoint.events_passed, 9, "but the checkpoint passes every event");
    assert_eq!(total(&t.db, "counter_v1").await, 2);
    assert_eq!(checkpoint.state, VersionState::Live, "the first version to catch up becomes the active one");
    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    assert_eq!(framework::active_version(&mut tx, "counter").await.expect("active"), Some(1));
    tx.commit().await.expect("commit");

    // More events of other types only: the checkpoint still moves to the horizon.
    append(&t.db, "d", "test.plain", 5).await;
    catch_up(&t.db, &quiet, &lease, 14).await;
    let moved = self::checkpoint(&t.db, &quiet).await;
    assert_eq!((moved.events_applied, moved.events_passed), (2, 14));
}

#[tokio::test]
async fn only_the_lease_holder_applies_and_a_paused_holder_cannot_write_afterwards() {
    let t = setup().await;
    clock::use_sim_clock(&t.db, 1_893_456_000_000).await.expect("sim");
    append(&t.db, "a", "test.plain", 5).await;
    let a =
        lease::acquire(&t.db, &V1.lease_name(), "prc_a", Duration::from_secs(2)).await.expect("acquire").expect("free");
    assert_eq!(
        lease::acquire(&t.db, &V1.lease_name(), "prc_b", Duration::from_secs(2)).await.expect("acquire"),
        None,
        "the second daemon does not get the lease"
    );
    catch_up(&t.db, &V1, &a, 5).await;

    // The holder pauses (between transactions) past its lease; the other daemon takes over and applies.
    clock::set_sim_clock(&t.db, 1_893_456_003_000).await.expect("past the lease");
    let b = lease::acquire(&t.db, &V1.lease_name(), "prc_b", Duration::from_secs(2))
        .await
        .expect("acquire")
        .expect("expired");
    append(&t.db, "a", "test.plain", 3).await;
    let err = framework::step(&t.db, &V1, &a, 100).await.expect_err("the paused holder is fenced out");
    assert!(matches!(err, Error::LeaseLost { .. }), "{err}");
    assert_eq!(total(&t.db, "counter_v1").await, 5, "nothing written by the stale holder");
    catch_up(&t.db, &V1, &b, 8).await;
    assert_eq!(total(&t.db, "counter_v1").await, 8, "each event applied exactly once");
}

#[tokio::test]
async fn a_new_version_builds_beside_the_old_one_and_switches_in_while_writes_continue() {
    let t = setup().await;
    append(&t.db, "seed", "test.plain", 20).await;
    let v1_lease = lease_for(&t.db, &V1, "prc_a").await;
    catch_up(&t.db, &V1, &v1_lease, 20).await;

    let writing = Arc::new(AtomicBool::new(true));
    let written = Arc::new(std::sync::atomic::AtomicI64::new(20));
    let writer = {
        let (db, writing, written) = (t.db.clone(), writing.clone(), written.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while writing.load(Ordering::SeqCst) {
                append(&db, &format!("s{}", n % 7), "test.plain", 1).await;
                written.fetch_add(1, Ordering::SeqCst);
                n += 1;
                tokio::task::yield_now().await;
            }
        })
    };
    // The old version keeps serving (its daemon keeps applying) while the new one builds.
    let v1_daemon = {
        let (db, lease) = (t.db.clone(), v1_lease.clone());
        tokio::spawn(async move {
            loop {
                match framework::step(&db, &V1, &lease, 50).await {
                    Ok(done) if done.retired => return,
                    Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                    Err(err) => panic!("v1 step: {err}"),
                }
            }
        })
    };
    // A reader always reads the active version's table; it must never see it empty or going backwards.
    let reader = {
        let (db, writing) = (t.db.clone(), writing.clone());
        tokio::spawn(async move {
            let mut last = 0;
            let mut seen_versions = std::collections::BTreeSet::new();
            while writing.load(Ordering::SeqCst) {
                let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
                let version = framework::active_version(&mut tx, "counter").await.expect("active").expect("active");
                let query = if version == 1 {
                    "SELECT coalesce(sum(events), 0)::int8 FROM counter_v1"
                } else {
                    "SELECT coalesce(sum(events), 0)::int8 FROM counter_v2"
                };
                let n: i64 = sql::query_scalar(query).fetch_one(tx.conn()).await.expect("read");
                tx.commit().await.expect("commit");
                assert!(n >= 20 && n >= last, "read {n} after {last} (version {version})");
                last = n;
                seen_versions.insert(version);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            seen_versions
        })
    };
    let v2_lease = lease_for(&t.db, &V2, "prc_b").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let done = framework::step(&t.db, &V2, &v2_lease, 25).await.expect("v2 step");
        if done.switched {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "v2 never switched in");
    }
    // Let the writer go on a little after the switch, then stop it.
    for _ in 0..20 {
        framework::step(&t.db, &V2, &v2_lease, 25).await.expect("v2 step");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    writing.store(false, Ordering::SeqCst);
    writer.await.expect("writer");
    let seen = reader.await.expect("reader");
    v1_daemon.await.expect("v1 stops once retired");
    assert!(seen.contains(&2), "reads moved to version 2");

    let written = written.load(Ordering::SeqCst);
    catch_up(&t.db, &V2, &v2_lease, written).await;
    assert_eq!(total(&t.db, "counter_v2").await, written, "after the switch the model includes every event");
    assert_eq!(checkpoint(&t.db, &V1).await.state, VersionState::Retired);
    assert_eq!(checkpoint(&t.db, &V2).await.state, VersionState::Live);
}

#[tokio::test]
async fn a_version_resumes_from_its_checkpoint_and_equals_a_rebuild() {
    let t = setup().await;
    append(&t.db, "a", "test.plain", 30).await;
    let lease = lease_for(&t.db, &V1, "prc_a").await;
    // One batch of ten (once the cluster-wide horizon lets the events through).
    while checkpoint(&t.db, &V1).await.events_passed == 0 {
        framework::step(&t.db, &V1, &lease, 10).await.expect("one batch");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(checkpoint(&t.db, &V1).await.events_passed, 10);
    // A new process (another owner after the lease is released) resumes where the checkpoint is.
    lease::release(&t.db, &lease).await.expect("release");
    let next = lease_for(&t.db, &V1, "prc_b").await;
    catch_up(&t.db, &V1, &next, 30).await;
    assert_eq!(total(&t.db, "counter_v1").await, 30);
    let differences = rebuild::verify(&t.db, &V1).await.expect("verify");
    assert_eq!(differences, vec![("counter_v1".to_owned(), 0)]);
    // A table changed behind the projection's back differs from the rebuild.
    let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    sql::query("UPDATE counter_v1 SET events = events + 1").execute(tx.conn()).await.expect("tamper");
    tx.commit().await.expect("commit");
    assert_eq!(rebuild::verify(&t.db, &V1).await.expect("verify"), vec![("counter_v1".to_owned(), 2)]);
}

#[tokio::test]
async fn a_runner_doubles_its_batches_while_behind_and_drops_a_batch_read_ahead_of_a_moved_checkpoint() {
    let t = setup().await;
    append(&t.db, "a", "test.plain", 100).await;
    let lease = lease_for(&t.db, &V1, "prc_a").await;
    let config = framework::DaemonConfig { batch: 10, max_batch: 40, ..framework::DaemonConfig::default() };
    let mut runner = framework::Runner::new(t.db.clone(), Arc::new(V1), &config);
    // The hundred events are one transaction: once the cluster-wide horizon lets them through, all of them are.
    let first = loop {
        let step = runner.step(&lease).await.expect("step");
        if step.passed > 0 {
            break step;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!((first.passed, first.caught_up), (10, false));
    // While the runner's next batch (twenty events after the tenth) is read ahead, another step moves the
    // checkpoint past where that read began: the runner must read again from the checkpoint.
    framework::step(&t.db, &V1, &lease, 5).await.expect("a step of five");
    let mut passed = Vec::new();
    loop {
        let step = runner.step(&lease).await.expect("step");
        passed.push(step.passed);
        if step.caught_up {
            break;
        }
    }
    assert_eq!(passed, vec![20, 40, 25], "batches double up to the largest while behind");
    assert_eq!(checkpoint(&t.db, &V1).await.events_passed, 100);
    assert_eq!(total(&t.db, "counter_v1").await, 100, "every event applied once: none twice, none skipped");
    assert_eq!(rebuild::verify(&t.db, &V1).await.expect("verify"), vec![("counter_v1".to_owned(), 0)]);

    // Caught up, the runner is back to its smallest batch.
    append(&t.db, "b", "test.plain", 15).await;
    let after = loop {
        let step = runner.step(&lease).await.expect("step");
        if step.passed > 0 {
            break step;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!((after.passed, after.caught_up), (10, false));
}

#[tokio::test]
async fn a_building_version_commits_without_waiting_for_the_disk_and_a_live_one_waits() {
    let t = setup().await;
    append(&t.db, "a", "test.plain", 25).await;
    let lease = lease_for(&t.db, &CommitProbe, "prc_a").await;
    // The first batch applies while the version builds (it switches in as that batch catches up); later ones
    // apply to the live version. A first step that found nothing yet would switch in before any batch.
    visible(&t.db, 25).await;
    catch_up(&t.db, &CommitProbe, &lease, 25).await;
    append(&t.db, "a", "test.plain", 5).await;
    catch_up(&t.db, &CommitProbe, &lease, 30).await;
    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let batches: Vec<(i32, String)> =
        sql::query_as("SELECT events, synchronous_commit FROM commit_probe_v1 WHERE events > 0 ORDER BY batch")
            .fetch_all(tx.conn())
            .await
            .expect("batches");
    tx.commit().await.expect("commit");
    let settings: Vec<&str> = batches.iter().map(|(_, setting)| setting.as_str()).collect();
    assert_eq!(settings.first(), Some(&"off from session"), "a building version's batch: {batches:?}");
    assert!(settings.last().is_some_and(|s| !s.ends_with("from session")), "the live version's batch: {batches:?}");
    assert_eq!(checkpoint(&t.db, &CommitProbe).await.state, VersionState::Live);
}

#[test]
fn positions_start_at_the_beginning() {
    assert_eq!(Position::START.to_string(), "0-0-0");
}
