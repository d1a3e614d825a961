//! `reservations`: every reservation as the domain folds it, for lists and tenants' views.
//!
//! Each row keeps the reservation's state as [`reservation::evolve`] leaves it (`folded`), so a list answers
//! exactly what a read by id (the fold of the stream) answers. A batch is applied as load, fold, write back:
//! the rows its events touch are read in one statement, the events folded onto them in memory in log order,
//! and the results written in one upsert, so a rebuild costs two statements per batch, not one per event.

use bc_domain::reservation::{self, Reservation, ReservationEvent};
use bc_domain::stream::AnyEvent;
use bc_eventstore::{Error, Result, Tx, sql};
use foldhash::{HashMap, HashMapExt, HashSet};
use futures_util::future::BoxFuture;

use super::json;
use crate::framework::{Envelope, Projection};

/// Version 3 of the reservations read model: the domain's fold of each stream, stored as `json` (version 2 stored
/// it as `jsonb`, which nothing queried and which cost a fifth more to write).
#[derive(Debug, Clone, Copy)]
pub struct ReservationsV3;

impl Projection for ReservationsV3 {
    fn name(&self) -> &'static str {
        "reservations"
    }

    fn version(&self) -> u32 {
        3
    }

    fn event_types(&self) -> &'static [&'static str] {
        <ReservationEvent as bc_domain::event::DomainEvent>::event_types()
    }

    fn tables(&self) -> &'static [&'static str] {
        &["reservations_v3"]
    }

    fn apply<'a>(&'a self, tx: &'a mut Tx, events: &'a [Envelope]) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let events: Vec<(&str, &ReservationEvent)> = events
                .iter()
                .filter_map(|envelope| match &envelope.event {
                    Some(AnyEvent::Reservation(event)) => Some((envelope.recorded.stream_id.as_str(), event)),
                    _ => None,
                })
                .collect();
            if events.is_empty() {
                return Ok(());
            }
            let mut folded = load(tx, &events).await?;
            // The rows that exist are the ones just loaded: `load` read every stream the batch continues, and a stream
            // it did not read starts in this batch. The others' rows are copied in rather than upserted.
            let existing: HashSet<String> = folded.keys().cloned().collect();
            let mut touched: Vec<&str> = Vec::new();
            for (id, event) in events {
                if super::evolve_in(&mut folded, id, |state| reservation::evolve(state, event)) {
                    touched.push(id);
                }
            }
            touched.sort_unstable();
            touched.dedup();
            let (new, continued): (Vec<&str>, Vec<&str>) = touched.iter().partition(|id| !existing.contains(**id));
            copy_new(tx, new.iter().filter_map(|id| folded.get(*id).map(|r| (*id, r)))).await?;
            store(tx, continued.iter().filter_map(|id| folded.get(*id).map(|r| (*id, r)))).await
        })
    }
}

/// The folded reservations the batch's events continue (not those it starts).
async fn load(tx: &mut Tx, events: &[(&str, &ReservationEvent)]) -> Result<HashMap<String, Reservation>> {
    let ids = super::continued(events, |event| event.opens_stream());
    let mut folded = HashMap::with_capacity(events.len());
    if ids.is_empty() {
        return Ok(folded);
    }
    let rows: Vec<(String, String)> = sql::query_as(
        "SELECT reservation_id, folded::text FROM reservations_v3 WHERE reservation_id = ANY($1::text[])",
    )
    .bind(&ids)
    .fetch_all(tx.conn())
    .await?;
    for (id, text) in rows {
        let state = read_folded(&id, &text)?;
        folded.insert(id, state);
    }
    Ok(folded)
}

/// Writes the rows of the reservations the batch started (none of which has a row yet) with one `COPY`: a
/// rebuild starts most of the reservations it writes, and the server parses copied rows more cheaply than
/// unnested arrays.
async fn copy_new<'r>(tx: &mut Tx, folded: impl Iterator<Item = (&'r str, &'r Reservation)>) -> Result<()> {
    let mut rows = sql::CopyRows::new();
    for (id, r) in folded {
        rows.text(Some(id))
            .text(Some(r.tenant_id.as_str()))
            .text(Some(r.request.pool_id.as_str()))
            .text(Some(r.state.as_str()))
            .timestamp_ms(r.requested_at_ms)?
            .json(&json(r)?);
        rows.end_row();
    }
    rows.copy_in(
        tx,
        "COPY reservations_v3 (reservation_id, tenant_id, pool_id, state, requested_at, folded) FROM STDIN (FORMAT binary)",
    )
    .await?;
    Ok(())
}

/// Writes the folded reservations back in one statement, each under the stream it was folded from (the key
/// [`load`] reads it back by).
async fn store<'r>(tx: &mut Tx, folded: impl Iterator<Item = (&'r str, &'r Reservation)>) -> Result<()> {
    let (mut ids, mut tenants, mut pools, mut states, mut requested, mut docs) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (id, r) in folded {
        ids.push(id);
        tenants.push(r.tenant_id.as_str());
        pools.push(r.request.pool_id.as_str());
        states.push(r.state.as_str());
        requested.push(r.requested_at_ms);
        docs.push(json(r)?);
    }
    if ids.is_empty() {
        return Ok(());
    }
    sql::query(
        "INSERT INTO reservations_v3 (reservation_id, tenant_id, pool_id, state, requested_at, folded)
         SELECT r.id, r.tenant, r.pool, r.state, ms_ts(r.requested_at), r.folded::json
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[], $6::text[])
              AS r(id, tenant, pool, state, requested_at, folded)
         ON CONFLICT (reservation_id) DO UPDATE
             SET tenant_id = excluded.tenant_id, pool_id = excluded.pool_id, state = excluded.state,
                 requested_at = excluded.requested_at, folded = excluded.folded",
    )
    .bind(&ids)
    .bind(&tenants)
    .bind(&pools)
    .bind(&states)
    .bind(&requested)
    .bind(&docs)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// A folded reservation as stored, read back.
pub fn read_folded(id: &str, text: &str) -> Result<Reservation> {
    serde_json::from_str(text)
        .map_err(|err| Error::Internal(format!("the reservations read model's fold of {id} does not read back: {err}")))
}
