//! Helpers shared by the tests: building events, appending in a command transaction, reading the whole log.

use std::time::Duration;

use bc_domain::event::EventMetadata;
use bc_eventstore::events::{self, AppendBatch, Appended, ExpectedVersion, NewEvent, RecordedEvent};
use bc_eventstore::{Db, Position, Result, TxOptions};

#[derive(Debug, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Counted {
    pub n: u64,
}

pub fn event(n: u64) -> NewEvent {
    NewEvent::encode("test.counted", 1, &Counted { n }, &EventMetadata::default()).expect("encode")
}

/// Appends one batch in its own command transaction.
pub async fn append(db: &Db, stream: &str, expected: ExpectedVersion, batch: &[NewEvent]) -> Result<Appended> {
    let mut tx = db.begin(TxOptions::COMMAND).await?;
    let appended =
        events::append(&mut tx, AppendBatch { stream_id: stream, tenant_id: None, expected, events: batch }).await?;
    tx.commit().await?;
    Ok(appended)
}

/// Reads the log after `after` as a reader would, once.
pub async fn read_after(db: &Db, after: Position) -> Vec<RecordedEvent> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let events = events::read_after(&mut tx, after, 10_000).await.expect("read");
    tx.commit().await.expect("commit");
    events
}

/// Reads until `count` events after `after` are visible. The horizon is cluster-wide, so other tests' open
/// transactions may hold it back for a moment; this waits for the condition instead of sleeping blindly.
pub async fn read_until(db: &Db, after: Position, count: usize) -> Vec<RecordedEvent> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let events = read_after(db, after).await;
        if events.len() >= count || tokio::time::Instant::now() > deadline {
            return events;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
