//! Readers never skip an event, and log order is causal order under repeatable read.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use bc_eventstore::events::{self, AppendBatch, ExpectedVersion, SubscribeOptions};
use bc_eventstore::testing::TestDb;
use bc_eventstore::{Db, Error, Position, RetryPolicy, Tx, TxOptions, sql};
use futures_util::StreamExt as _;

use crate::support::{self, event};

#[tokio::test]
async fn a_transaction_that_appended_first_but_commits_last_is_neither_skipped_nor_read_early() {
    let t = TestDb::new().await;
    // A appends first (the lower txid) and stays open; B appends later and commits.
    let mut a = t.db.begin(TxOptions::COMMAND).await.expect("begin a");
    let batch = [event(1)];
    let a_appended = events::append(
        &mut a,
        AppendBatch { stream_id: "a", tenant_id: None, expected: ExpectedVersion::NO_STREAM, events: &batch },
    )
    .await
    .expect("append a");
    let b_appended = support::append(&t.db, "b", ExpectedVersion::NO_STREAM, &[event(2)]).await.expect("append b");
    assert!(a_appended.position < b_appended.position, "A took the lower txid");

    // While A is open, B's event must not be handed out: a reader that took it would move its cursor past
    // A's event, which commits behind it.
    let early = support::read_after(&t.db, Position::START).await;
    assert!(early.is_empty(), "read before A committed: {early:?}");

    a.commit().await.expect("commit a");
    let read = support::read_until(&t.db, Position::START, 2).await;
    let streams: Vec<&str> = read.iter().map(|e| e.stream_id.as_str()).collect();
    assert_eq!(streams, vec!["a", "b"], "A's event is delivered, and before B's");
}

#[tokio::test]
async fn eight_concurrent_writers_and_a_subscriber_that_gets_every_event_once_in_order() {
    const WRITERS: u64 = 8;
    const APPENDS: u64 = 500;
    let t = TestDb::new().await;
    let subscriber_db = t.pool(&bc_eventstore::testing::test_db_config());
    let subscription = events::subscribe(
        subscriber_db,
        Position::START,
        SubscribeOptions { batch_size: 200, poll_interval: Duration::from_millis(5) },
    );
    let collector = tokio::spawn(async move {
        let mut subscription = std::pin::pin!(subscription);
        let mut received = Vec::new();
        while received.len() < (WRITERS * APPENDS) as usize {
            match tokio::time::timeout(Duration::from_secs(120), subscription.next()).await {
                Ok(Some(Ok(event))) => received.push(event),
                Ok(Some(Err(err))) => panic!("subscription failed: {err}"),
                Ok(None) => panic!("subscription ended"),
                Err(_) => panic!("no event for two minutes after {} events", received.len()),
            }
        }
        received
    });

    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let db = t.db.clone();
        writers.push(tokio::spawn(async move {
            let stream = format!("writer-{w}");
            for n in 0..APPENDS {
                support::append(&db, &stream, ExpectedVersion::Exact(n as u32), &[event(w * APPENDS + n)])
                    .await
                    .expect("append");
            }
        }));
    }
    for writer in writers {
        writer.await.expect("writer");
    }
    let received = collector.await.expect("collector");

    assert_eq!(received.len(), (WRITERS * APPENDS) as usize);
    assert!(received.windows(2).all(|w| w[0].position < w[1].position), "strictly increasing positions");
    let distinct: HashSet<(String, u32)> = received.iter().map(|e| (e.stream_id.clone(), e.stream_version)).collect();
    assert_eq!(distinct.len(), received.len(), "no event twice");
    for w in 0..WRITERS {
        let versions: Vec<u32> =
            received.iter().filter(|e| e.stream_id == format!("writer-{w}")).map(|e| e.stream_version).collect();
        assert_eq!(versions, (1..=APPENDS as u32).collect::<Vec<_>>(), "writer {w}: every version, in order");
    }
}

/// Takes the transaction's txid at once, the way a command does when its first statement locks a row.
async fn take_txid(tx: &mut Tx) {
    sql::query("SELECT pg_current_xact_id()::text").execute(tx.conn()).await.expect("txid");
}

/// One command: take the txid early, read the stream head, append the next version.
async fn read_then_append(
    db: &Db,
    options: TxOptions,
    stream: &str,
    other_commits: &tokio::sync::Notify,
) -> Result<(), Error> {
    let mut tx = db.begin(options).await?;
    take_txid(&mut tx).await;
    other_commits.notified().await;
    let head = events::stream_version(&mut tx, stream).await?;
    let batch = [event(u64::from(head) + 1)];
    events::append(
        &mut tx,
        AppendBatch { stream_id: stream, tenant_id: None, expected: ExpectedVersion::Exact(head), events: &batch },
    )
    .await?;
    tx.commit().await
}

async fn versions_in_log_order(db: &Db, stream: &str, count: usize) -> Vec<u32> {
    support::read_until(db, Position::START, count)
        .await
        .iter()
        .filter(|e| e.stream_id == stream)
        .map(|e| e.stream_version)
        .collect()
}

#[tokio::test]
async fn under_read_committed_a_command_could_write_a_version_before_the_one_it_read() {
    // The hazard the repeatable-read rule exists for, shown once so the next test means something: T1 takes
    // its txid, T2 (a higher txid) appends version 1 and commits, T1 reads head 1 and appends version 2.
    // Log order then puts version 2 before version 1.
    let t = TestDb::new().await;
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let db = t.db.clone();
    let g = gate.clone();
    let t1 = tokio::spawn(async move { read_then_append(&db, TxOptions::READ_COMMITTED, "s", &g).await });
    wait_for_open_transaction(&t.db).await;
    support::append(&t.db, "s", ExpectedVersion::NO_STREAM, &[event(1)]).await.expect("t2");
    gate.notify_one();
    t1.await.expect("join").expect("t1 commits under read committed");
    assert_eq!(versions_in_log_order(&t.db, "s", 2).await, vec![2, 1]);
}

#[tokio::test]
async fn under_repeatable_read_the_same_command_conflicts_and_its_retry_sorts_after() {
    let t = TestDb::new().await;
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let db = t.db.clone();
    let g = gate.clone();
    let t1 = tokio::spawn(async move { read_then_append(&db, TxOptions::COMMAND, "s", &g).await });
    wait_for_open_transaction(&t.db).await;
    support::append(&t.db, "s", ExpectedVersion::NO_STREAM, &[event(1)]).await.expect("t2");
    gate.notify_one();
    let err = t1.await.expect("join").expect_err("t1 read a snapshot from before t2 and must conflict");
    assert!(err.is_retryable(), "{err}");
    // The retry is a new transaction with a new txid: it reads version 1 and writes version 2 after it.
    let gate = tokio::sync::Notify::new();
    gate.notify_one();
    read_then_append(&t.db, TxOptions::COMMAND, "s", &gate).await.expect("retry");
    assert_eq!(versions_in_log_order(&t.db, "s", 2).await, vec![1, 2]);
}

/// Waits until some other session of this database holds a transaction id.
async fn wait_for_open_transaction(db: &Db) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
        let open: i64 = sql::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_xid IS NOT NULL",
        )
        .fetch_one(tx.conn())
        .await
        .expect("activity");
        tx.commit().await.expect("commit");
        if open > 0 {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "the other transaction never took its txid");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn concurrent_commands_keep_every_stream_in_version_order_and_effects_after_causes() {
    // Four workers run commands against two shared streams. Each command takes its txid first, reads the
    // head of one stream, and appends to the other stream an event that records what it read (the cause).
    // Conflicts are retried. Afterwards, in log order: each stream's versions rise one by one, and every
    // event comes after the event it read.
    const WORKERS: usize = 4;
    const COMMANDS: usize = 60;
    let t = TestDb::new().await;
    let policy = RetryPolicy { max_attempts: 1000, ..RetryPolicy::default() };
    let mut handles = Vec::new();
    for w in 0..WORKERS {
        let db = t.db.clone();
        let policy = policy.clone();
        handles.push(tokio::spawn(async move {
            for c in 0..COMMANDS {
                let (read_stream, write_stream) = if (w + c) % 2 == 0 { ("x", "y") } else { ("y", "x") };
                bc_eventstore::retry(&policy, || async {
                    let mut tx = db.begin(TxOptions::COMMAND).await?;
                    take_txid(&mut tx).await;
                    tokio::task::yield_now().await;
                    let cause = events::stream_version(&mut tx, read_stream).await?;
                    let head = events::stream_version(&mut tx, write_stream).await?;
                    let payload = serde_json::json!({"read": read_stream, "version": cause});
                    let batch = [bc_eventstore::NewEvent::encode(
                        "test.caused",
                        1,
                        &payload,
                        &bc_domain::event::EventMetadata::default(),
                    )
                    .expect("encode")];
                    events::append(
                        &mut tx,
                        AppendBatch {
                            stream_id: write_stream,
                            tenant_id: None,
                            expected: ExpectedVersion::Exact(head),
                            events: &batch,
                        },
                    )
                    .await?;
                    tx.commit().await
                })
                .await
                .expect("command");
            }
        }));
    }
    for handle in handles {
        handle.await.expect("worker");
    }
    let total = WORKERS * COMMANDS;
    let log = support::read_until(&t.db, Position::START, total).await;
    assert_eq!(log.len(), total);

    let mut heads: BTreeMap<String, u32> = BTreeMap::new();
    for event in &log {
        let head = heads.entry(event.stream_id.clone()).or_insert(0);
        assert_eq!(event.stream_version, *head + 1, "{} out of version order in the log", event.stream_id);
        *head = event.stream_version;
        let payload: serde_json::Value = event.decode(&bc_domain::event::Upcasters::new()).expect("decode");
        let read_stream = payload["read"].as_str().expect("read");
        let read_version = payload["version"].as_u64().expect("version") as u32;
        let seen = heads.get(read_stream).copied().unwrap_or(0);
        assert!(
            seen >= read_version,
            "{}@{} read {read_stream}@{read_version}, which the log puts after it",
            event.stream_id,
            event.stream_version
        );
    }
}
