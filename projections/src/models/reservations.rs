//! `reservations`: every reservation's state, window, lease and allocations, for lists and tenants' views.
//!
//! A batch is applied as load, fold, write back: the rows its events touch are read in one statement, the
//! events are folded onto them in memory, in log order, and the results are written in one upsert. A rebuild
//! thus costs two statements per batch, not one per event.

use std::collections::HashMap;

use bc_domain::reservation::{ReservationEvent, ReservationState};
use bc_domain::stream::AnyEvent;
use bc_eventstore::{Result, Tx, sql};
use futures_util::future::BoxFuture;
use sqlx::Row as _;

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
            let mut rows = load(tx, &events).await?;
            let mut order: Vec<String> = Vec::new();
            for (id, event) in events {
                if fold(&mut rows, id, event)? {
                    order.push(id.to_owned());
                }
            }
            order.sort();
            order.dedup();
            store(tx, order.iter().filter_map(|id| rows.get(id))).await
        })
    }
}

/// One row of `reservations_v1`, times in Unix milliseconds, JSON columns as text.
#[derive(Debug, Clone)]
struct Row {
    reservation_id: String,
    tenant_id: String,
    identity: String,
    pool_id: String,
    project_id: Option<String>,
    state: String,
    resource: String,
    count: i32,
    request: String,
    priority: i32,
    requested_at: i64,
    pending_deadline: i64,
    start_at: Option<i64>,
    end_at: Option<i64>,
    lease_deadline: Option<i64>,
    ended_at: Option<i64>,
    outcome: Option<String>,
    allocations: String,
    version: i32,
}

/// The existing rows of the reservations the batch touches, except those it creates.
async fn load(tx: &mut Tx, events: &[(&str, &ReservationEvent)]) -> Result<HashMap<String, Row>> {
    let mut ids: Vec<&str> = events
        .iter()
        .filter(|(_, event)| !matches!(event, ReservationEvent::Requested(_) | ReservationEvent::Denied(_)))
        .map(|(id, _)| *id)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let mut rows = HashMap::with_capacity(events.len());
    if ids.is_empty() {
        return Ok(rows);
    }
    let found = sql::query(
        "SELECT reservation_id, tenant_id, identity, pool_id, project_id, state, resource, count, request::text AS request,
                priority, ts_ms(requested_at) AS requested_at, ts_ms(pending_deadline) AS pending_deadline,
                ts_ms(start_at) AS start_at, ts_ms(end_at) AS end_at, ts_ms(lease_deadline) AS lease_deadline,
                ts_ms(ended_at) AS ended_at, outcome, allocations::text AS allocations, version
         FROM reservations_v1 WHERE reservation_id = ANY($1::text[])",
    )
    .bind(&ids)
    .fetch_all(tx.conn())
    .await?;
    for row in found {
        let row = Row {
            reservation_id: row.try_get("reservation_id")?,
            tenant_id: row.try_get("tenant_id")?,
            identity: row.try_get("identity")?,
            pool_id: row.try_get("pool_id")?,
            project_id: row.try_get("project_id")?,
            state: row.try_get("state")?,
            resource: row.try_get("resource")?,
            count: row.try_get("count")?,
            request: row.try_get("request")?,
            priority: row.try_get("priority")?,
            requested_at: row.try_get("requested_at")?,
            pending_deadline: row.try_get("pending_deadline")?,
            start_at: row.try_get("start_at")?,
            end_at: row.try_get("end_at")?,
            lease_deadline: row.try_get("lease_deadline")?,
            ended_at: row.try_get("ended_at")?,
            outcome: row.try_get("outcome")?,
            allocations: row.try_get("allocations")?,
            version: row.try_get("version")?,
        };
        rows.insert(row.reservation_id.clone(), row);
    }
    Ok(rows)
}

/// Applies one event to the in-memory rows; returns whether a row changed.
fn fold(rows: &mut HashMap<String, Row>, id: &str, event: &ReservationEvent) -> Result<bool> {
    let created = |state: &str, e: &bc_domain::reservation::ReservationRequest, tenant: &str, who: &str| {
        Ok::<_, bc_eventstore::Error>(Row {
            reservation_id: id.to_owned(),
            tenant_id: tenant.to_owned(),
            identity: who.to_owned(),
            pool_id: e.pool_id.to_string(),
            project_id: e.project_id.as_ref().map(|p| p.to_string()),
            state: state.to_owned(),
            resource: e.resource().to_owned(),
            count: e.devices.count as i32,
            request: json(e)?,
            priority: 0,
            requested_at: 0,
            pending_deadline: 0,
            start_at: None,
            end_at: None,
            lease_deadline: None,
            ended_at: None,
            outcome: None,
            allocations: "[]".to_owned(),
            version: 1,
        })
    };
    match event {
        ReservationEvent::Requested(e) => {
            let row = Row {
                priority: e.priority,
                requested_at: e.at_ms,
                pending_deadline: e.pending_deadline_ms,
                ..created(ReservationState::Pending.as_str(), &e.request, e.tenant_id.as_str(), e.identity.as_str())?
            };
            rows.insert(id.to_owned(), row);
            return Ok(true);
        }
        ReservationEvent::Denied(e) => {
            let row = Row {
                requested_at: e.at_ms,
                pending_deadline: e.at_ms,
                ended_at: Some(e.at_ms),
                outcome: Some(e.reason.clone()),
                ..created(ReservationState::Denied.as_str(), &e.request, e.tenant_id.as_str(), e.identity.as_str())?
            };
            rows.insert(id.to_owned(), row);
            return Ok(true);
        }
        _ => {}
    }
    let Some(row) = rows.get_mut(id) else { return Ok(false) };
    let end = |row: &mut Row, state: ReservationState, at_ms: i64, outcome: Option<String>| {
        row.state = state.as_str().to_owned();
        row.ended_at = Some(at_ms);
        row.outcome = outcome;
    };
    match event {
        ReservationEvent::Requested(_) | ReservationEvent::Denied(_) => unreachable!("handled above"),
        ReservationEvent::Placed(e) => {
            row.state = ReservationState::Placed.as_str().to_owned();
            row.start_at = Some(e.start_ms);
            row.end_at = Some(e.end_ms);
            row.lease_deadline = e.lease_deadline_ms;
            row.allocations = json(&e.allocations)?;
        }
        ReservationEvent::BindingStarted(_) => row.state = ReservationState::Binding.as_str().to_owned(),
        ReservationEvent::Activated(_) => row.state = ReservationState::Active.as_str().to_owned(),
        ReservationEvent::ReleaseRequested(_) => row.state = ReservationState::Releasing.as_str().to_owned(),
        ReservationEvent::Renewed(e) => row.lease_deadline = Some(e.lease_deadline_ms),
        ReservationEvent::Extended(e) => row.end_at = Some(e.end_ms),
        ReservationEvent::Replaced(e) => row.allocations = json(&e.allocations)?,
        ReservationEvent::Cancelled(e) => end(row, ReservationState::Cancelled, e.at_ms, e.reason.clone()),
        ReservationEvent::Released(e) => end(row, ReservationState::Released, e.at_ms, None),
        ReservationEvent::Expired(e) => end(row, ReservationState::Expired, e.at_ms, Some(text(&e.cause)?)),
        ReservationEvent::Failed(e) => end(row, ReservationState::Failed, e.at_ms, Some(text(&e.reason)?)),
    }
    row.version += 1;
    Ok(true)
}

/// Writes the folded rows back in one statement.
async fn store(tx: &mut Tx, rows: impl Iterator<Item = &Row>) -> Result<()> {
    #[derive(Default)]
    struct Columns<'r> {
        id: Vec<&'r str>,
        tenant: Vec<&'r str>,
        identity: Vec<&'r str>,
        pool: Vec<&'r str>,
        project: Vec<Option<&'r str>>,
        state: Vec<&'r str>,
        resource: Vec<&'r str>,
        count: Vec<i32>,
        request: Vec<&'r str>,
        priority: Vec<i32>,
        requested_at: Vec<i64>,
        pending_deadline: Vec<i64>,
        start_at: Vec<Option<i64>>,
        end_at: Vec<Option<i64>>,
        lease_deadline: Vec<Option<i64>>,
        ended_at: Vec<Option<i64>>,
        outcome: Vec<Option<&'r str>>,
        allocations: Vec<&'r str>,
        version: Vec<i32>,
    }
    let mut c = Columns::default();
    for row in rows {
        c.id.push(&row.reservation_id);
        c.tenant.push(&row.tenant_id);
        c.identity.push(&row.identity);
        c.pool.push(&row.pool_id);
        c.project.push(row.project_id.as_deref());
        c.state.push(&row.state);
        c.resource.push(&row.resource);
        c.count.push(row.count);
        c.request.push(&row.request);
        c.priority.push(row.priority);
        c.requested_at.push(row.requested_at);
        c.pending_deadline.push(row.pending_deadline);
        c.start_at.push(row.start_at);
        c.end_at.push(row.end_at);
        c.lease_deadline.push(row.lease_deadline);
        c.ended_at.push(row.ended_at);
        c.outcome.push(row.outcome.as_deref());
        c.allocations.push(&row.allocations);
        c.version.push(row.version);
    }
    if c.id.is_empty() {
        return Ok(());
    }
    sql::query(
        "INSERT INTO reservations_v1 (reservation_id, tenant_id, identity, pool_id, project_id, state, resource, count,
                                      request, priority, requested_at, pending_deadline, start_at, end_at,
                                      lease_deadline, ended_at, outcome, allocations, version)
         SELECT r.id, r.tenant, r.identity, r.pool, r.project, r.state, r.resource, r.count, r.request::jsonb,
                r.priority, ms_ts(r.requested_at), ms_ts(r.pending_deadline), ms_ts(r.start_at), ms_ts(r.end_at),
                ms_ts(r.lease_deadline), ms_ts(r.ended_at), r.outcome, r.allocations::jsonb, r.version
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::int4[],
                     $9::text[], $10::int4[], $11::int8[], $12::int8[], $13::int8[], $14::int8[], $15::int8[],
                     $16::int8[], $17::text[], $18::text[], $19::int4[])
              AS r(id, tenant, identity, pool, project, state, resource, count, request, priority, requested_at,
                   pending_deadline, start_at, end_at, lease_deadline, ended_at, outcome, allocations, version)
         ON CONFLICT (reservation_id) DO UPDATE
             SET tenant_id = excluded.tenant_id, identity = excluded.identity, pool_id = excluded.pool_id,
                 project_id = excluded.project_id, state = excluded.state, resource = excluded.resource,
                 count = excluded.count, request = excluded.request, priority = excluded.priority,
                 requested_at = excluded.requested_at, pending_deadline = excluded.pending_deadline,
                 start_at = excluded.start_at, end_at = excluded.end_at, lease_deadline = excluded.lease_deadline,
                 ended_at = excluded.ended_at, outcome = excluded.outcome, allocations = excluded.allocations,
                 version = excluded.version",
    )
    .bind(&c.id)
    .bind(&c.tenant)
    .bind(&c.identity)
    .bind(&c.pool)
    .bind(&c.project)
    .bind(&c.state)
    .bind(&c.resource)
    .bind(&c.count)
    .bind(&c.request)
    .bind(&c.priority)
    .bind(&c.requested_at)
    .bind(&c.pending_deadline)
    .bind(&c.start_at)
    .bind(&c.end_at)
    .bind(&c.lease_deadline)
    .bind(&c.ended_at)
    .bind(&c.outcome)
    .bind(&c.allocations)
    .bind(&c.version)
    .execute(tx.conn())
    .await?;
    Ok(())
}
