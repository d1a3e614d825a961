//! The event log: appends, conflicts, reads after a position.

use bc_domain::event::EventMetadata;
use bc_eventstore::events::{self, AppendBatch, ExpectedVersion, NewEvent};
use bc_eventstore::testing::TestDb;
use bc_eventstore::{Error, Position, TxOptions};

fn event(n: u32) -> NewEvent {
    #[derive(serde::Serialize)]
    struct Payload {
        n: u32,
    }
    NewEvent::encode("test.happened", 1, &Payload { n }, &EventMetadata::default()).expect("encode")
}

#[tokio::test]
async fn append_then_read_back_in_order() {
    let t = TestDb::new().await;
    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    let batch = [event(1), event(2), event(3)];
    let appended = events::append(
        &mut tx,
        AppendBatch {
            stream_id: "s-1",
            tenant_id: Some("ten_a"),
            expected: ExpectedVersion::NO_STREAM,
            events: &batch,
        },
    )
    .await
    .expect("append");
    tx.commit().await.expect("commit");
    assert_eq!((appended.first_version, appended.last_version), (1, 3));
    assert!(appended.position.txid > 1 << 32, "the harness runs with txids above 2^32: {}", appended.position);

    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let read = events::read_after(&mut tx, Position::START, 100).await.expect("read");
    tx.commit().await.expect("commit");
    assert_eq!(read.len(), 3);
    assert_eq!(read.iter().map(|e| e.stream_version).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert_eq!(read[2].position, appended.position);
    assert_eq!(read[0].tenant_id.as_deref(), Some("ten_a"));
}

#[tokio::test]
async fn a_wrong_expected_version_is_a_conflict_and_writes_nothing() {
    let t = TestDb::new().await;
    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    let batch = [event(1)];
    events::append(
        &mut tx,
        AppendBatch { stream_id: "s", tenant_id: None, expected: ExpectedVersion::NO_STREAM, events: &batch },
    )
    .await
    .expect("append");
    let err = events::append(
        &mut tx,
        AppendBatch { stream_id: "s", tenant_id: None, expected: ExpectedVersion::Exact(5), events: &batch },
    )
    .await
    .expect_err("conflict");
    assert!(matches!(err, Error::Conflict { expected: 5, actual: Some(1), .. }), "{err}");
    tx.commit().await.expect("the transaction is still usable");
}
