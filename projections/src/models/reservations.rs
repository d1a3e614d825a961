//! `reservations`: every reservation's state, window, lease and allocations, for lists and tenants' views.

use bc_domain::reservation::{ReservationEvent, ReservationState};
use bc_domain::stream::AnyEvent;
use bc_eventstore::{Result, Tx, sql};
use futures_util::future::BoxFuture;

use super::{json, text};
use crate::framework::{Envelope, Projection};

/// Version 1 of the reservations read model.
#[derive(Debug, Clone, Copy)]
pub struct ReservationsV1;

impl Projection for ReservationsV1 {
    fn name(&self) -> &'static str {
        "reservations"
    }

    fn version(&self) -> u32 {
        1
    }

    fn event_types(&self) -> &'static [&'static str] {
        <ReservationEvent as bc_domain::event::DomainEvent>::event_types()
    }

    fn tables(&self) -> &'static [&'static str] {
        &["reservations_v1"]
    }

    fn apply<'a>(&'a self, tx: &'a mut Tx, events: &'a [Envelope]) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            for envelope in events {
                if let Some(AnyEvent::Reservation(event)) = &envelope.event {
                    apply_one(tx, &envelope.recorded.stream_id, event).await?;
                }
            }
            Ok(())
        })
    }
}

async fn set_state(tx: &mut Tx, id: &str, state: ReservationState) -> Result<()> {
    sql::query("UPDATE reservations_v1 SET state = $2, version = version + 1 WHERE reservation_id = $1")
        .bind(id)
        .bind(state.as_str())
        .execute(tx.conn())
        .await?;
    Ok(())
}

async fn end(tx: &mut Tx, id: &str, state: ReservationState, at_ms: i64, outcome: Option<String>) -> Result<()> {
    sql::query(
        "UPDATE reservations_v1
            SET state = $3, ended_at = timestamptz 'epoch' + $2::int8 * interval '1 millisecond', outcome = $4,
                version = version + 1
          WHERE reservation_id = $1",
    )
    .bind(id)
    .bind(at_ms)
    .bind(state.as_str())
    .bind(outcome)
    .execute(tx.conn())
    .await?;
    Ok(())
}

async fn apply_one(tx: &mut Tx, id: &str, event: &ReservationEvent) -> Result<()> {
    match event {
        ReservationEvent::Requested(e) => {
            sql::query(
                "INSERT INTO reservations_v1 (reservation_id, tenant_id, identity, pool_id, project_id, state, resource,
                                              count, request, priority, requested_at, pending_deadline, version)
                 VALUES ($1, $3, $4, $5, $6, 'pending', $7, $8, $9::jsonb, $10,
                         timestamptz 'epoch' + $2::int8 * interval '1 millisecond',
                         timestamptz 'epoch' + $11::int8 * interval '1 millisecond', 1)",
            )
            .bind(id)
            .bind(e.at_ms)
            .bind(e.tenant_id.as_str())
            .bind(e.identity.as_str())
            .bind(e.request.pool_id.as_str())
            .bind(e.request.project_id.as_ref().map(|p| p.as_str()))
            .bind(e.request.resource())
            .bind(e.request.devices.count as i32)
            .bind(json(&e.request)?)
            .bind(e.priority)
            .bind(e.pending_deadline_ms)
            .execute(tx.conn())
            .await?;
        }
        ReservationEvent::Denied(e) => {
            sql::query(
                "INSERT INTO reservations_v1 (reservation_id, tenant_id, identity, pool_id, project_id, state, resource,
                                              count, request, priority, requested_at, pending_deadline, ended_at, outcome,
                                              version)
                 VALUES ($1, $3, $4, $5, $6, 'denied', $7, $8, $9::jsonb, 0,
                         timestamptz 'epoch' + $2::int8 * interval '1 millisecond',
                         timestamptz 'epoch' + $2::int8 * interval '1 millisecond',
                         timestamptz 'epoch' + $2::int8 * interval '1 millisecond', $10, 1)",
            )
            .bind(id)
            .bind(e.at_ms)
            .bind(e.tenant_id.as_str())
            .bind(e.identity.as_str())
            .bind(e.request.pool_id.as_str())
            .bind(e.request.project_id.as_ref().map(|p| p.as_str()))
            .bind(e.request.resource())
            .bind(e.request.devices.count as i32)
            .bind(json(&e.request)?)
            .bind(&e.reason)
            .execute(tx.conn())
            .await?;
        }
        ReservationEvent::Placed(e) => {
            sql::query(
                "UPDATE reservations_v1
                    SET state = 'placed',
                        start_at = timestamptz 'epoch' + $2::int8 * interval '1 millisecond',
                        end_at = timestamptz 'epoch' + $3::int8 * interval '1 millisecond',
                        lease_deadline = timestamptz 'epoch' + $4::int8 * interval '1 millisecond',
                        allocations = $5::jsonb, version = version + 1
                  WHERE reservation_id = $1",
            )
            .bind(id)
            .bind(e.start_ms)
            .bind(e.end_ms)
            .bind(e.lease_deadline_ms)
            .bind(json(&e.allocations)?)
            .execute(tx.conn())
            .await?;
        }
        ReservationEvent::BindingStarted(_) => set_state(tx, id, ReservationState::Binding).await?,
        ReservationEvent::Activated(_) => set_state(tx, id, ReservationState::Active).await?,
        ReservationEvent::ReleaseRequested(_) => set_state(tx, id, ReservationState::Releasing).await?,
        ReservationEvent::Renewed(e) => {
            sql::query(
                "UPDATE reservations_v1
                    SET lease_deadline = timestamptz 'epoch' + $2::int8 * interval '1 millisecond', version = version + 1
                  WHERE reservation_id = $1",
            )
            .bind(id)
            .bind(e.lease_deadline_ms)
            .execute(tx.conn())
            .await?;
        }
        ReservationEvent::Extended(e) => {
            sql::query(
                "UPDATE reservations_v1
                    SET end_at = timestamptz 'epoch' + $2::int8 * interval '1 millisecond', version = version + 1
                  WHERE reservation_id = $1",
            )
            .bind(id)
            .bind(e.end_ms)
            .execute(tx.conn())
            .await?;
        }
        ReservationEvent::Cancelled(e) => end(tx, id, ReservationState::Cancelled, e.at_ms, e.reason.clone()).await?,
        ReservationEvent::Released(e) => end(tx, id, ReservationState::Released, e.at_ms, None).await?,
        ReservationEvent::Expired(e) => end(tx, id, ReservationState::Expired, e.at_ms, Some(text(&e.cause)?)).await?,
        ReservationEvent::Failed(e) => end(tx, id, ReservationState::Failed, e.at_ms, Some(text(&e.reason)?)).await?,
    }
    Ok(())
}
