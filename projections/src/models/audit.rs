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
    fn reads_payload(&self, event_type: &str) -> bool {
        event_type == "reservation.denied"
    }

    fn apply<'a>(&'a self, tx: &'a mut Tx, events: &'a [Envelope]) -> BoxFuture<'a, Result<()>> {
        Box::pin(insert_batch(tx, events))
    }
}

async fn insert_batch(tx: &mut Tx, events: &[Envelope]) -> Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let mut epochs = Vec::new();
    let mut txids = Vec::new();
    let mut seqs = Vec::new();
    let mut positions = Vec::new();
    let mut streams = Vec::new();
    let mut versions = Vec::new();
    let mut types = Vec::new();
    let mut tenants = Vec::new();
    let mut decisions = Vec::new();
    let mut reasons = Vec::new();
    let mut identities = Vec::new();
    let mut kinds = Vec::new();
    let mut agents = Vec::new();
    let mut delegations = Vec::new();
    let mut requests = Vec::new();
    let mut admission_tenants = Vec::new();
    let mut recorded = Vec::new();
    for envelope in events {
        let e = &envelope.recorded;
        let admission = envelope.metadata.admission.as_ref();
        let denial = match &envelope.event {
            Some(AnyEvent::Reservation(ReservationEvent::Denied(denied))) => Some(denied.reason.clone()),
            _ => None,
        };
        epochs.push(e.position.epoch as i32);
        txids.push(e.position.txid.to_string());
        seqs.push(e.position.seq as i64);
        positions.push(e.position.to_string());
        streams.push(e.stream_id.clone());
        versions.push(e.stream_version as i32);
        types.push(e.event_type.clone());
        tenants.push(e.tenant_id.clone());
        decisions.push(if denial.is_some() { "denied" } else { "allowed" });
        reasons.push(denial);
        identities.push(admission.map(|a| a.identity.clone()));
        kinds.push(admission.map(|a| a.session_kind.clone()));
        agents.push(admission.and_then(|a| a.agent.clone()));
        delegations.push(admission.and_then(|a| a.delegation.clone()));
        requests.push(admission.and_then(|a| a.request_id.clone()).or_else(|| envelope.metadata.request_id.clone()));
        admission_tenants.push(admission.map(|a| a.tenant_id.clone()));
        recorded.push(e.recorded_at_ms);
    }
    sql::query(
        "INSERT INTO audit_events_v1 (log_epoch, txid, seq, position, stream_id, stream_version, event_type, tenant_id,
                                      decision, reason, identity, session_kind, agent, delegation, request_id,
                                      admission_tenant_id, recorded_at)
         SELECT u.log_epoch, u.txid::xid8, u.seq, u.position, u.stream_id, u.stream_version, u.event_type, u.tenant_id,
                u.decision, u.reason, u.identity, u.session_kind, u.agent, u.delegation, u.request_id,
                u.admission_tenant_id, timestamptz 'epoch' + u.recorded_ms * interval '1 millisecond'
         FROM unnest($1::int4[], $2::text[], $3::int8[], $4::text[], $5::text[], $6::int4[], $7::text[], $8::text[],
                     $9::text[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::text[],
                     $16::text[], $17::int8[])
              AS u(log_epoch, txid, seq, position, stream_id, stream_version, event_type, tenant_id, decision, reason,
                   identity, session_kind, agent, delegation, request_id, admission_tenant_id, recorded_ms)",
    )
    .bind(&epochs)
    .bind(&txids)
    .bind(&seqs)
    .bind(&positions)
    .bind(&streams)
    .bind(&versions)
    .bind(&types)
    .bind(&tenants)
    .bind(&decisions)
    .bind(&reasons)
    .bind(&identities)
    .bind(&kinds)
    .bind(&agents)
    .bind(&delegations)
    .bind(&requests)
    .bind(&admission_tenants)
    .bind(&recorded)
    .execute(tx.conn())
    .await?;
    Ok(())
}
