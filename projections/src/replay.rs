//! Investigations: the state of a stream, or of a pool's capacity, as the fold of the log up to a position.

use std::collections::BTreeMap;

use bc_domain::node::NodeEvent;
use bc_domain::pool::PoolEvent;
use bc_domain::reservation::{self, ReservationEvent, ReservationState};
use bc_domain::site::{ProjectEvent, SiteEvent};
use bc_domain::stream::AnyEvent;
use bc_eventstore::{Db, Error, Position, Result, TxOptions, events};
use serde_json::{Value, json};

use crate::framework::Envelope;
use crate::models::nodes::{Axes, NewNode, change_axes, schedulable};

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

/// The state of a stream as the fold of the given events (its own, in version order).
pub fn stream_state(events: &[Envelope]) -> Result<Value> {
    let Some(first) = events.first() else { return Ok(Value::Null) };
    let decoded: Vec<&AnyEvent> = events.iter().filter_map(|e| e.event.as_ref()).collect();
    let mut state = match decoded.first() {
        Some(AnyEvent::Reservation(_)) => {
            let reservation_events: Vec<&ReservationEvent> =
                decoded.iter().filter_map(|e| if let AnyEvent::Reservation(r) = e { Some(r) } else { None }).collect();
            to_json(&reservation::fold(reservation_events))?
        }
        Some(AnyEvent::Pool(_)) => {
            let mut state = Value::Null;
            let mut offers = BTreeMap::new();
            for event in &decoded {
                match event {
                    AnyEvent::Pool(PoolEvent::Created(e)) => state = to_json(e)?,
                    AnyEvent::Pool(PoolEvent::Offered(e)) => {
                        offers.insert(e.tenant_id.to_string(), to_json(e)?);
                    }
                    AnyEvent::Pool(PoolEvent::QuotaSet(e)) => {
                        if let Some(offer) = offers.get_mut(e.tenant_id.as_str()) {
                            offer["quota"] = to_json(&e.quota)?;
                        }
                    }
                    _ => {}
                }
            }
            state["offers"] = Value::Array(offers.into_values().collect());
            state
        }
        Some(AnyEvent::Node(_)) => {
            let mut state = Value::Null;
            for event in &decoded {
                if let AnyEvent::Node(event) = event {
                    node_step(&mut state, event)?;
                }
            }
            state
        }
        Some(AnyEvent::Site(SiteEvent::Created(e))) => to_json(e)?,
        Some(AnyEvent::Project(ProjectEvent::Created(e))) => to_json(e)?,
        _ => json!({}),
    };
    if let Value::Object(map) = &mut state {
        let last = &events[events.len() - 1].recorded;
        map.insert("streamId".into(), json!(first.recorded.stream_id));
        map.insert("streamVersion".into(), json!(last.stream_version));
        map.insert("position".into(), json!(last.position.to_string()));
    }
    Ok(state)
}

/// One node event's effect on a node stream's replayed state.
fn node_step(state: &mut Value, event: &NodeEvent) -> Result<()> {
    match event {
        NodeEvent::Registered(e) => *state = to_json(e)?,
        NodeEvent::Joined(e) => {
            *state = to_json(e)?;
            state["provisionState"] = json!("adopting");
            state["connectivity"] = json!("connected");
            state["observedGeneration"] = json!(0);
        }
        NodeEvent::Cordoned(_) => state["cordoned"] = json!(true),
        NodeEvent::Uncordoned(_) => {
            state["cordoned"] = json!(false);
            state["draining"] = json!(false);
        }
        NodeEvent::MaintenanceStarted(_) => state["maintenance"] = json!(true),
        NodeEvent::MaintenanceEnded(_) => state["maintenance"] = json!(false),
        NodeEvent::DrainStarted(_) => {
            state["cordoned"] = json!(true);
            state["draining"] = json!(true);
        }
        NodeEvent::Drained(_) => state["draining"] = json!(false),
        NodeEvent::Adopted(_) => state["provisionState"] = json!("adopted"),
        NodeEvent::Rejoined(e) => state["rejoinedAt"] = json!(e.at_ms),
        NodeEvent::HardwareChanged(e) => {
            state["gpus"] = to_json(&e.gpus)?;
            state["devices"] = to_json(&e.devices)?;
            state["hardware"] = to_json(&e.hardware)?;
        }
        NodeEvent::InventoryReported(e) => state["inventorySnapshot"] = json!(e.snapshot),
        NodeEvent::ConnectivityChanged(e) => state["connectivity"] = to_json(&e.to)?,
        NodeEvent::ConditionRaised(e) => {
            let kind = e.condition.kind.as_str();
            let mut conditions: Vec<Value> = state["conditions"].as_array().cloned().unwrap_or_default();
            conditions.retain(|c| c["type"] != kind);
            conditions.push(to_json(&e.condition)?);
            state["conditions"] = Value::Array(conditions);
        }
        NodeEvent::ConditionCleared(e) => {
            let mut conditions: Vec<Value> = state["conditions"].as_array().cloned().unwrap_or_default();
            conditions.retain(|c| c["type"] != e.kind.as_str());
            state["conditions"] = Value::Array(conditions);
        }
        NodeEvent::SpecChanged(e) => {
            state["generation"] = json!(e.generation);
            state["spec"] = to_json(&e.spec)?;
        }
        NodeEvent::SpecObserved(e) => state["observedGeneration"] = json!(e.observed_generation),
        NodeEvent::Deleted(e) => state["deletedAt"] = json!(e.at_ms),
    }
    for flag in ["cordoned", "maintenance"] {
        if state.get(flag).is_none() && state.is_object() {
            state[flag] = json!(false);
        }
    }
    Ok(())
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

struct NodeCapacity {
    pool: String,
    resource: String,
    atoms: i64,
    axes: Axes,
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
                let pool_owner = envelope.recorded.tenant_id.clone().unwrap_or_default();
                if let Some(node) = NewNode::of(event, &pool_owner)? {
                    if let (Some(resource), atoms) = node.atoms() {
                        self.nodes.insert(
                            node.node_id.to_string(),
                            NodeCapacity {
                                pool: node.pool_id.to_string(),
                                resource: resource.to_owned(),
                                atoms: atoms as i64,
                                axes: node.axes,
                            },
                        );
                    }
                } else if let NodeEvent::Deleted(e) = event {
                    self.nodes.remove(e.node_id.as_str());
                } else if let Some(node) = self.nodes.get_mut(event.node_id().as_str()) {
                    if let NodeEvent::HardwareChanged(e) = event {
                        node.atoms = e.devices.iter().filter(|d| d.bookable).count() as i64;
                    }
                    change_axes(&mut node.axes, event)?;
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
        for node in self.nodes.values().filter(|n| n.pool == pool_id) {
            let figures = by_resource.entry(&node.resource).or_insert_with(|| empty(&node.resource));
            if schedulable(&node.axes)? {
                figures.allocatable += node.atoms;
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
