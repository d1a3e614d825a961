//! `audit_events`: every recorded mutation with the admission context it was allowed under (identity, session
//! kind, agent, delegation, request id, tenant, position), and every recorded denial with its reason.

use bc_domain::reservation::ReservationEvent;
use bc_domain::stream::AnyEvent;
use bc_eventstore::{Result, Tx, sql};
use futures_util::future::BoxFuture;

use crate::framework::{Envelope, Projection};

/// Version 1 of the audit trail: one row per event, every event type.
#[derive(Debug, Clone, Copy)]
pub struct AuditV1;

impl Projection for AuditV1 {
    fn name(&self) -> &'static str {
        "audit_events"
    }

    fn version(&self) -> u32 {
        1
    }

    fn event_types(&self) -> &'static [&'static str] {
        &[]
    }

    fn tables(&self) -> &'static [&'static str] {
        &["audit_events_v1"]
    }

    /// A row is the event's position, stream, type and admission metadata; only a denial's reason comes from its
    /// payload.
    fn payload_types(&self) -> Option<&'static [&'static str]> {
        Some(&["reservation.denied"])
    }

    fn apply<'a>(&'a self, tx: &'a mut Tx, events: &'a [Envelope]) -> BoxFuture<'a, Result<()>> {
        Box::pin(insert_batch(tx, events))
    }
}

async fn insert_batch(tx: &mut Tx, events: &[Envelope]) -> Result<()> {
    let mut rows = sql::CopyRows::new();
    for envelope in events {
        let e = &envelope.recorded;
        let admission = envelope.metadata.admission.as_ref();
        let denial = match &envelope.event {
            Some(AnyEvent::Reservation(ReservationEvent::Denied(denied))) => Some(denied.reason.as_str()),
            _ => None,
        };
        let request = admission.and_then(|a| a.request_id.as_deref()).or(envelope.metadata.request_id.as_deref());
        let version = i32::try_from(e.stream_version).map_err(|_| {
            bc_eventstore::Error::Internal(format!("{} has a version past the audit trail's column", e.stream_id))
        })?;
        rows.position(&e.position)
            .text(Some(&e.position.to_string()))
            .text(Some(&e.stream_id))
            .int4(version)
            .text(Some(&e.event_type))
            .text(e.tenant_id.as_deref())
            .text(Some(if denial.is_some() { "denied" } else { "allowed" }))
            .text(denial)
            .text(admission.map(|a| a.identity.as_str()))
            .text(admission.map(|a| a.session_kind.as_str()))
            .text(admission.and_then(|a| a.agent.as_deref()))
            .text(admission.and_then(|a| a.delegation.as_deref()))
            .text(request)
            .text(admission.map(|a| a.tenant_id.as_str()))
            .timestamp_ms(e.recorded_at_ms)?;
        rows.end_row();
    }
    // COPY, not an INSERT of unnested arrays: a rebuild writes a row per event of the log, and the server parses
    // these rows at a fraction of the arrays' cost (and binary rows for less than text ones).
    rows.copy_in(
        tx,
        "COPY audit_events_v1 (log_epoch, txid, seq, position, stream_id, stream_version, event_type, tenant_id,
                               decision, reason, identity, session_kind, agent, delegation, request_id,
                               admission_tenant_id, recorded_at) FROM STDIN (FORMAT binary)",
    )
    .await?;
    Ok(())
}
