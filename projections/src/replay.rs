//! Investigations: the state of a stream, or of a pool's capacity, as the fold of the log up to a position.

use std::collections::BTreeMap;

use bc_domain::id::TenantId;
use bc_domain::node::{self, Node};
use bc_domain::pool::{self, PoolEvent};
use bc_domain::reservation::{self, ReservationEvent, ReservationState};
use bc_domain::site;
use bc_domain::stream::AnyEvent;
use bc_domain::tenancy;
use bc_eventstore::{Db, Error, Position, Result, TxOptions, events};
use serde_json::{Value, json};

use crate::framework::Envelope;

fn to_json(value: &impl serde::Serialize) -> Result<Value> {
    serde_json::to_value(value).map_err(|err| Error::Internal(format!("encode a replayed state: {err}")))
}

/// Reads every event of `stream_id` with a position at or before `until`.
pub async fn stream_until(db: &Db, stream_id: &str, until: Position) -> Result<Vec<Envelope>> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let recorded = events::read_stream(&mut tx, stream_id, 0, 1_000_000).await?;
    tx.commit().await?;
    recorded.into_iter().filter(|e| e.position <= until).map(Envelope::decode).collect()
}

/// The state of a stream as the fold of the given events (its own, in version order), through the domain's
/// `evolve` of its aggregate: the same fold every other reader of that aggregate uses.
pub fn stream_state(events: &[Envelope]) -> Result<Value> {
    let Some(first) = events.first() else { return Ok(Value::Null) };
    let decoded: Vec<&AnyEvent> = events.iter().filter_map(|e| e.event.as_ref()).collect();
    let mut state = match decoded.first() {
        Some(AnyEvent::Reservation(_)) => {
            let events = decoded.iter().filter_map(|e| if let AnyEvent::Reservation(r) = e { Some(r) } else { None });
            to_json(&reservation::fold(events))?
        }
        Some(AnyEvent::Pool(PoolEvent::JoinTokenIssued(_))) => {
            let events = decoded.iter().filter_map(|e| if let AnyEvent::Pool(p) = e { Some(p) } else { None });
            to_json(&events.fold(None, pool::evolve_join_token))?
        }
        Some(AnyEvent::Pool(_)) => {
            let events = decoded.iter().filter_map(|e| if let AnyEvent::Pool(p) = e { Some(p) } else { None });
            to_json(&pool::fold(events))?
        }
        Some(AnyEvent::Node(_)) => {
            let events = decoded.iter().filter_map(|e| if let AnyEvent::Node(n) = e { Some(n) } else { None });
            to_json(&node::fold(events))?
        }
        Some(AnyEvent::Site(_)) => {
            let events = decoded.iter().filter_map(|e| if let AnyEvent::Site(s) = e { Some(s) } else { None });
            to_json(&events.fold(None, site::evolve_site))?
        }
        Some(AnyEvent::Project(_)) => {
            let events = decoded.iter().filter_map(|e| if let AnyEvent::Project(p) = e { Some(p) } else { None });
            to_json(&events.fold(None, site::evolve_project))?
        }
        Some(AnyEvent::Tenant(_)) => {
            let events = decoded.iter().filter_map(|e| if let AnyEvent::Tenant(t) = e { Some(t) } else { None });
            to_json(&events.fold(None, tenancy::evolve_tenant))?
        }
        Some(AnyEvent::Identity(_)) => {
            let events = decoded.iter().filter_map(|e| if let AnyEvent::Identity(i) = e { Some(i) } else { None });
            to_json(&events.fold(None, tenancy::evolve_identity))?
        }
        Some(AnyEvent::Grant(_)) => {
            let events = decoded.iter().filter_map(|e| if let AnyEvent::Grant(g) = e { Some(g) } else { None });
            to_json(&events.fold(None, tenancy::evolve_grant))?
        }
        Some(AnyEvent::Limit(_)) => {
            let events = decoded.iter().filter_map(|e| if let AnyEvent::Limit(l) = e { Some(l) } else { None });
            to_json(&events.fold(None, tenancy::evolve_limit))?
        }
        Some(AnyEvent::Image(_)) => {
            let events = decoded.iter().filter_map(|e| if let AnyEvent::Image(i) = e { Some(i) } else { None });
            to_json(&events.fold(None, bc_domain::image::evolve_image))?
        }
        Some(AnyEvent::Profile(_)) => {
            let events = decoded.iter().filter_map(|e| if let AnyEvent::Profile(p) = e { Some(p) } else { None });
            to_json(&events.fold(None, bc_domain::profile::evolve_profile))?
        }
        Some(AnyEvent::Workflow(_)) => {
            let events = decoded.iter().filter_map(|e| if let AnyEvent::Workflow(w) = e { Some(w) } else { None });
            to_json(&events.fold(None, bc_domain::workflow::evolve_workflow))?
        }
        Some(AnyEvent::Flavor(_)) => {
            let events = decoded.iter().filter_map(|e| if let AnyEvent::Flavor(f) = e { Some(f) } else { None });
            to_json(&events.fold(None, bc_domain::flavor::evolve_flavor))?
        }
        Some(AnyEvent::Instance(_)) => {
            let events = decoded.iter().filter_map(|e| if let AnyEvent::Instance(i) = e { Some(i) } else { None });
            to_json(&events.fold(None, bc_domain::instance::evolve_instance))?
        }
        Some(AnyEvent::ProviderAccount(_)) => {
            let events =
                decoded.iter().filter_map(|e| if let AnyEvent::ProviderAccount(a) = e { Some(a) } else { None });
            to_json(&events.fold(None, bc_domain::provider::evolve_provider_account))?
        }
        Some(AnyEvent::Webhook(_)) => {
            let events = decoded.iter().filter_map(|e| if let AnyEvent::Webhook(w) = e { Some(w) } else { None });
            to_json(&events.fold(None, bc_domain::webhook::evolve_webhook))?
        }
        None => json!({}),
    };
    if let Value::Object(map) = &mut state {
        let last = &events[events.len() - 1].recorded;
        map.insert("streamId".into(), json!(first.recorded.stream_id));
        map.insert("streamVersion".into(), json!(last.stream_version));
        map.insert("position".into(), json!(last.position.to_string()));
    }
    Ok(state)
}

/// A pool's capacity rollup figures for one resource.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityFigures {
    pub resource: String,
    pub allocatable: i64,
    pub allocated: i64,
    pub reserved: i64,
    pub available: i64,
}

/// A node as the rollup sees it: its fold, and the tenant that owns its pool (which the trust rule reads).
struct NodeCapacity {
    node: Node,
    pool_owner: TenantId,
}

struct Hold {
    pool: String,
    resource: String,
    count: i64,
    state: ReservationState,
}

/// The capacity rollup as an in-memory fold of the log: the same definition as the `pool_capacity_rollup` read
/// model, for any past position.
#[derive(Default)]
pub struct CapacityFold {
    nodes: BTreeMap<String, NodeCapacity>,
    holds: BTreeMap<String, Hold>,
}

impl CapacityFold {
    pub fn apply(&mut self, envelope: &Envelope) -> Result<()> {
        match &envelope.event {
            Some(AnyEvent::Node(event)) => {
                let id = event.node_id().to_string();
                let known = self.nodes.remove(&id);
                let pool_owner = match &known {
                    Some(known) => known.pool_owner.clone(),
                    None => {
                        let owner = envelope.recorded.tenant_id.as_deref().unwrap_or_default();
                        owner.parse().map_err(|err| Error::Internal(format!("a node event's tenant: {err}")))?
                    }
                };
                if let Some(node) = node::evolve(known.map(|k| k.node), event)
                    && node.deleted_at_ms.is_none()
                {
                    self.nodes.insert(id, NodeCapacity { node, pool_owner });
                }
            }
            Some(AnyEvent::Reservation(event)) => {
                let id = envelope.recorded.stream_id.clone();
                if let ReservationEvent::Requested(e) = event {
                    self.holds.insert(
                        id,
                        Hold {
                            pool: e.request.pool_id.to_string(),
                            resource: e.request.resource().to_owned(),
                            count: i64::from(e.request.devices.count),
                            state: ReservationState::Pending,
                        },
                    );
                } else if let Some(hold) = self.holds.get_mut(&id) {
                    hold.state = event.state_after().unwrap_or(hold.state);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The rollup rows of one pool, by resource.
    pub fn figures(&self, pool_id: &str) -> Result<Vec<CapacityFigures>> {
        let mut by_resource: BTreeMap<&str, CapacityFigures> = BTreeMap::new();
        for known in self.nodes.values().filter(|n| n.node.pool_id.as_str() == pool_id) {
            let (Some(class), atoms) = known.node.atoms() else { continue };
            let resource = class.as_str();
            let figures = by_resource.entry(resource).or_insert_with(|| empty(resource));
            if known.node.unschedulable(&known.pool_owner).is_empty() {
                figures.allocatable += atoms as i64;
            }
        }
        for hold in self.holds.values().filter(|h| h.pool == pool_id) {
            let figures = by_resource.entry(&hold.resource).or_insert_with(|| empty(&hold.resource));
            match hold.state {
                ReservationState::Binding | ReservationState::Active | ReservationState::Releasing => {
                    figures.allocated += hold.count;
                }
                ReservationState::Placed => figures.reserved += hold.count,
                _ => {}
            }
        }
        Ok(by_resource
            .into_values()
            .map(|mut f| {
                f.available = f.allocatable - f.allocated;
                f
            })
            .collect())
    }
}

fn empty(resource: &str) -> CapacityFigures {
    CapacityFigures { resource: resource.to_owned(), allocatable: 0, allocated: 0, reserved: 0, available: 0 }
}

/// A pool's capacity as the fold of the whole log up to `until`.
pub async fn capacity_until(db: &Db, pool_id: &str, until: Position) -> Result<Vec<CapacityFigures>> {
    let mut fold = CapacityFold::default();
    let mut cursor = Position::START;
    loop {
        let mut tx = db.begin(TxOptions::READ_ONLY).await?;
        let batch = events::read_range(&mut tx, cursor, until, 5_000).await?;
        tx.commit().await?;
        let Some(last) = batch.last() else { break };
        cursor = last.position;
        for recorded in batch {
            let family = recorded.event_type.split('.').next().unwrap_or_default();
            if matches!(family, "node" | "reservation") {
                fold.apply(&Envelope::decode(recorded)?)?;
            }
        }
    }
    fold.figures(pool_id)
}

/// A reservation of a pool as a time-travel snapshot shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BookingView {
    pub tenant_id: Option<String>,
    pub state: String,
    pub resource: String,
    pub count: i64,
    pub start: Option<i64>,
    pub end: Option<i64>,
    /// The nodes its allocations are on.
    pub nodes: Vec<String>,
}

/// A pool at one position of the log: its capacity, its reservations (in every state), the offers that set
/// its tenants' quotas, and its policy.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolSnapshot {
    pub position: String,
    /// Whether the pool existed (and was not deleted) then.
    pub exists: bool,
    pub capacity: Vec<CapacityFigures>,
    pub bookings: BTreeMap<String, BookingView>,
    /// By tenant: `{quota, priority, includeDescendants}`.
    pub quotas: BTreeMap<String, Value>,
    pub policy: Value,
}

/// The fold behind [`pool_snapshots`]: the capacity fold, the pool's own stream, and its reservations.
struct PoolHistory {
    pool_id: String,
    capacity: CapacityFold,
    pool: Option<pool::Pool>,
    bookings: BTreeMap<String, BookingView>,
}

impl PoolHistory {
    fn apply(&mut self, envelope: &Envelope) -> Result<()> {
        self.capacity.apply(envelope)?;
        let stream = &envelope.recorded.stream_id;
        match &envelope.event {
            Some(AnyEvent::Pool(event)) if *stream == self.pool_id => {
                self.pool = pool::evolve(self.pool.take(), event);
            }
            Some(AnyEvent::Reservation(event)) => {
                if let ReservationEvent::Requested(e) = event {
                    if e.request.pool_id.as_str() == self.pool_id {
                        self.bookings.insert(
                            stream.clone(),
                            BookingView {
                                tenant_id: envelope.recorded.tenant_id.clone(),
                                state: ReservationState::Pending.as_str().to_owned(),
                                resource: e.request.resource().to_owned(),
                                count: i64::from(e.request.devices.count),
                                start: e.request.start_ms,
                                end: None,
                                nodes: Vec::new(),
                            },
                        );
                    }
                } else if let Some(booking) = self.bookings.get_mut(stream) {
                    if let Some(state) = event.state_after() {
                        booking.state = state.as_str().to_owned();
                    }
                    if let ReservationEvent::Placed(placed) = event {
                        booking.start = Some(placed.start_ms);
                        booking.end = Some(placed.end_ms);
                        booking.nodes = placed.allocations.iter().map(|a| a.node_id.to_string()).collect();
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn snapshot(&self, position: Position) -> Result<PoolSnapshot> {
        let live = self.pool.as_ref().filter(|p| p.deleted_at_ms.is_none());
        let quotas = live
            .map(|p| {
                p.offers
                    .iter()
                    .map(|o| {
                        let offer = json!({
                            "quota": o.quota, "priority": o.priority, "includeDescendants": o.include_descendants,
                        });
                        (o.tenant_id.to_string(), offer)
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(PoolSnapshot {
            position: position.to_string(),
            exists: live.is_some(),
            capacity: self.capacity.figures(&self.pool_id)?,
            bookings: self.bookings.clone(),
            quotas,
            policy: live.map(|p| to_json(&p.policy)).transpose()?.unwrap_or(Value::Null),
        })
    }
}

/// A pool as the fold of the log up to each of `positions` (in any order; answered in the order given), read
/// once from the start of the log.
pub async fn pool_snapshots(db: &Db, pool_id: &str, positions: &[Position]) -> Result<Vec<PoolSnapshot>> {
    let mut order: Vec<usize> = (0..positions.len()).collect();
    order.sort_by_key(|&i| positions[i]);
    let mut history = PoolHistory {
        pool_id: pool_id.to_owned(),
        capacity: CapacityFold::default(),
        pool: None,
        bookings: BTreeMap::new(),
    };
    let mut answers: Vec<Option<PoolSnapshot>> = vec![None; positions.len()];
    let mut cursor = Position::START;
    for i in order {
        let until = positions[i];
        while cursor < until {
            let mut tx = db.begin(TxOptions::READ_ONLY).await?;
            let batch = events::read_range(&mut tx, cursor, until, 5_000).await?;
            tx.commit().await?;
            let Some(last) = batch.last() else { break };
            cursor = last.position;
            for recorded in batch {
                let family = recorded.event_type.split('.').next().unwrap_or_default();
                if matches!(family, "node" | "reservation" | "pool") {
                    history.apply(&Envelope::decode(recorded)?)?;
                }
            }
        }
        answers[i] = Some(history.snapshot(until)?);
    }
    Ok(answers.into_iter().flatten().collect())
}

/// What changed in a pool between two snapshots, a line each: `+` appeared, `-` went away, `~` changed.
pub fn pool_diff(from: &PoolSnapshot, to: &PoolSnapshot) -> Vec<String> {
    let mut lines = Vec::new();
    if from.exists != to.exists {
        lines.push(if to.exists {
            "+ pool (made between the two positions)".into()
        } else {
            "- pool (deleted)".into()
        });
    }
    let figures = |snapshot: &PoolSnapshot| -> BTreeMap<String, CapacityFigures> {
        snapshot.capacity.iter().map(|f| (f.resource.clone(), f.clone())).collect()
    };
    let (before, after) = (figures(from), figures(to));
    for resource in before.keys().chain(after.keys()).collect::<std::collections::BTreeSet<_>>() {
        let zero = empty(resource);
        let (a, b) = (before.get(resource).unwrap_or(&zero), after.get(resource).unwrap_or(&zero));
        let mut changed = Vec::new();
        for (name, x, y) in [
            ("allocatable", a.allocatable, b.allocatable),
            ("allocated", a.allocated, b.allocated),
            ("reserved", a.reserved, b.reserved),
            ("available", a.available, b.available),
        ] {
            if x != y {
                changed.push(format!("{name} {x} → {y} ({:+})", y - x));
            }
        }
        if !changed.is_empty() {
            lines.push(format!("~ capacity {resource}: {}", changed.join(", ")));
        }
    }
    let describe = |b: &BookingView| {
        let window = match (b.start, b.end) {
            (Some(start), Some(end)) => format!(" [{start}, {end})"),
            _ => String::new(),
        };
        let nodes = if b.nodes.is_empty() { String::new() } else { format!(" on {}", b.nodes.join(",")) };
        format!("{}: {} {}, {}{window}{nodes}", b.tenant_id.as_deref().unwrap_or("-"), b.count, b.resource, b.state)
    };
    for (id, b) in &to.bookings {
        match from.bookings.get(id) {
            None => lines.push(format!("+ booking {id}: {}", describe(b))),
            Some(a) if a != b => {
                let mut changed = Vec::new();
                if a.state != b.state {
                    changed.push(format!("{} → {}", a.state, b.state));
                }
                if (a.start, a.end) != (b.start, b.end) {
                    changed.push(format!("window {:?}..{:?} → {:?}..{:?}", a.start, a.end, b.start, b.end));
                }
                if a.nodes != b.nodes {
                    changed.push(format!("nodes {} → {}", a.nodes.join(","), b.nodes.join(",")));
                }
                lines.push(format!("~ booking {id}: {}", changed.join(", ")));
            }
            Some(_) => {}
        }
    }
    for (tenant, after) in &to.quotas {
        match from.quotas.get(tenant) {
            None => lines.push(format!("+ quota of {tenant}: {after}")),
            Some(before) if before != after => lines.push(format!("~ quota of {tenant}: {before} → {after}")),
            Some(_) => {}
        }
    }
    for (tenant, before) in &from.quotas {
        if !to.quotas.contains_key(tenant) {
            lines.push(format!("- quota of {tenant}: {before} (offer withdrawn)"));
        }
    }
    if let (Value::Object(a), Value::Object(b)) = (&from.policy, &to.policy) {
        for key in a.keys().chain(b.keys()).collect::<std::collections::BTreeSet<_>>() {
            let (x, y) = (a.get(key).unwrap_or(&Value::Null), b.get(key).unwrap_or(&Value::Null));
            if x != y {
                lines.push(format!("~ policy {key}: {x} → {y}"));
            }
        }
    }
    lines
}
