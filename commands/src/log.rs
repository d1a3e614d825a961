//! Reading the event log from outside: where it ends, batches after a position (the event stream's catch-up
//! and its live poller), and whether a position is one this log handed out. Every read honours the horizon.

use bc_eventstore::events::{self, RecordedEvent};
use bc_eventstore::{Position, TxOptions};

use crate::{App, AppResult};

impl App {
    /// The position of the last event no earlier transaction can still join: where a reader that wants only
    /// new events starts.
    pub async fn log_head(&self) -> AppResult<Position> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let head = events::horizon_head(&mut tx).await?;
        tx.commit().await?;
        Ok(head)
    }

    /// Up to `limit` events after `after`, in log order.
    pub async fn log_after(&self, after: Position, limit: u32) -> AppResult<Vec<RecordedEvent>> {
        self.log_after_for(after, limit, None).await
    }

    /// [`App::log_after`] for a reader that shows one tenant its own events only (`None`: every tenant's): the
    /// other tenants' events come without payload or metadata (their positions, streams, types and tenants are
    /// still there, so the reader knows how far it has read).
    pub async fn log_after_for(
        &self,
        after: Position,
        limit: u32,
        tenant: Option<&str>,
    ) -> AppResult<Vec<RecordedEvent>> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let selection = events::Selection { tenant, ..events::Selection::EVERYTHING };
        let batch = events::read_after_selected(&mut tx, after, limit, selection).await?;
        tx.commit().await?;
        Ok(batch)
    }

    /// Up to `limit` events after `after` and up to `until`, in log order.
    pub async fn log_range(&self, after: Position, until: Position, limit: u32) -> AppResult<Vec<RecordedEvent>> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let batch = events::read_range(&mut tx, after, until, limit).await?;
        tx.commit().await?;
        Ok(batch)
    }

    /// Whether this log can have handed `position` out (see [`events::within_log`]): a position beyond its end
    /// could only be waited for until a timeout.
    pub async fn within_log(&self, position: Position) -> AppResult<bool> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let within = events::within_log(&mut tx, position).await?;
        tx.commit().await?;
        Ok(within)
    }
}
