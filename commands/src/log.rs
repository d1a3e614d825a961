//! Reading the event log from outside: where it ends, batches after a position (the event stream's catch-up
//! and its live poller), and whether a position is one this log handed out. Every read honours the horizon.

use bc_eventstore::events::{self, RecordedEvent};
use bc_eventstore::{Position, TxOptions};

use crate::{App, AppResult};

/// What one read of a subscriber's catch-up found: [`App::catch_up_after`].
#[derive(Debug)]
pub struct CatchUpRead {
    /// In log order: the events the reader may see and, where the log itself was read for one tenant, the other
    /// tenants' events without payload or metadata (their positions, streams, types and tenants only).
    pub events: Vec<RecordedEvent>,
    /// The position the read covered: the next read starts after it.
    pub covered: Position,
    /// Whether the log may hold more after `covered`; `false` once a read of the log came back short.
    pub more: bool,
}

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
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let batch = events::read_after(&mut tx, after, limit).await?;
        tx.commit().await?;
        Ok(batch)
    }

    /// One read of a subscriber's catch-up: up to `limit` events after `after` for a reader that shows `tenant` its
    /// own events only (`None`: every tenant's), and the position the read covered. For one tenant, as far as the
    /// audit trail's read model has passed (its active version's checkpoint), its events are found through that
    /// model's index by tenant, so a catch-up from far back reads the tenant's own events rather than every
    /// tenant's log. Beyond that checkpoint, without that model, or for every tenant, it reads the log.
    pub async fn catch_up_after(&self, after: Position, limit: u32, tenant: Option<&str>) -> AppResult<CatchUpRead> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let through = match tenant {
            Some(tenant) => bc_projections::framework::active_checkpoint(&mut tx, "audit_events")
                .await?
                .filter(|(_, checkpoint)| *checkpoint > after)
                .map(|(version, checkpoint)| (tenant, format!("audit_events_v{version}"), checkpoint)),
            None => None,
        };
        let read = match through {
            Some((tenant, index, checkpoint)) => {
                let batch =
                    events::read_tenant_range_through(&mut tx, &index, tenant, after, checkpoint, limit).await?;
                // A short batch holds every event of the tenant's up to the checkpoint; the log goes on after it.
                let covered = match batch.last() {
                    Some(last) if batch.len() as u64 >= u64::from(limit) => last.position,
                    _ => checkpoint,
                };
                CatchUpRead { events: batch, covered, more: true }
            }
            None => {
                let selection = events::Selection { tenant, ..events::Selection::EVERYTHING };
                let batch = events::read_after_selected(&mut tx, after, limit, selection).await?;
                let covered = batch.last().map_or(after, |last| last.position);
                let more = batch.len() as u64 >= u64::from(limit);
                CatchUpRead { events: batch, covered, more }
            }
        };
        tx.commit().await?;
        Ok(read)
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
