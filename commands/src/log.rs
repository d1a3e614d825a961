//! Reading the event log from outside: where it ends, batches after a position (the event stream's catch-up
//! and its live poller), and whether a position is one this log handed out. Every read honours the horizon.

use bc_eventstore::events::{self, RecordedEvent};
use bc_eventstore::{Position, TxOptions};

use crate::{App, AppResult};

/// What one tenant's catch-up read found: [`App::tenant_log_after`].
#[derive(Debug)]
pub struct TenantRead {
    /// In log order: the tenant's events, and, where the log itself was read, the other tenants' events without
    /// payload or metadata.
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

    /// One tenant's catch-up read: up to `limit` events after `after` for a reader that shows `tenant` its own
    /// events only, and the position the read covered (the next read starts there). As far as the audit trail's
    /// read model has passed (its active version's checkpoint), the tenant's events are found through that
    /// model's index by tenant, so a catch-up from far back reads the tenant's own events rather than every
    /// tenant's log; beyond it, or without that model, it reads the log as [`App::log_after_for`] does.
    pub async fn tenant_log_after(&self, after: Position, limit: u32, tenant: &str) -> AppResult<TenantRead> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let active = bc_projections::consistency::active_checkpoint(&mut tx, "audit_events").await?;
        let through = active.and_then(|(version, checkpoint)| {
            (checkpoint > after).then(|| (format!("audit_events_v{version}"), checkpoint))
        });
        let read = match through {
            Some((index, checkpoint)) => {
                let batch =
                    events::read_tenant_range_through(&mut tx, &index, tenant, after, checkpoint, limit).await?;
                // A short batch holds every event of the tenant's up to the checkpoint; the log goes on after it.
                let covered = match batch.last() {
                    Some(last) if batch.len() as u64 >= u64::from(limit) => last.position,
                    _ => checkpoint,
                };
                TenantRead { events: batch, covered, more: true }
            }
            None => {
                let selection = events::Selection { tenant: Some(tenant), ..events::Selection::EVERYTHING };
                let batch = events::read_after_selected(&mut tx, after, limit, selection).await?;
                let covered = batch.last().map_or(after, |last| last.position);
                let more = batch.len() as u64 >= u64::from(limit);
                TenantRead { events: batch, covered, more }
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
