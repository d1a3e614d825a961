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
