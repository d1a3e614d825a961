//! A node's state: the fold of its stream's events. Every place that shows or follows a node (the read model,
//! `events replay`, the given/when/then tests) folds through [`evolve`]; the schedulability rule and the
//! `noScheduleReasons` derivation it applies are the same pure functions the inline state uses.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{
    Adapter, Condition, Connectivity, NodeEvent, NodeSpec, ProvisionState, Role, SchedulingView, Trust, Unschedulable,
    no_schedule_reasons, schedulability,
};
use crate::device::{Device, DeviceClass, GpuInfo};
use crate::hardware::HardwareKey;
use crate::id::{NodeId, PoolId, SiteId, TenantId};

/// A node as its events left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    pub id: NodeId,
    pub pool_id: PoolId,
    pub site_id: SiteId,
    pub name: String,
    pub role: Role,
    pub trust: Trust,
    /// The tenant a dedicated or tenant-owned node belongs to.
    pub owner_tenant_id: Option<TenantId>,
    pub adapter: Adapter,
    pub provision_state: ProvisionState,
    pub maintenance: bool,
    pub cordoned: bool,
    /// A drain began and has not completed; `drain_forced` when running reservations are ended.
    pub draining: bool,
    pub drain_forced: bool,
    pub connectivity: Connectivity,
    /// One per condition type, in the order they were raised.
    pub conditions: Vec<Condition>,
    pub generation: u64,
    pub spec: NodeSpec,
    pub observed_generation: u64,
    pub gpus: Vec<GpuInfo>,
    /// Every device, atoms and their parents.
    pub devices: Vec<Device>,
    pub hardware: Option<HardwareKey>,
    /// The latest inventory snapshot reported, if any.
    pub inventory_snapshot: Option<u64>,
    pub registered_at_ms: i64,
    /// When it was deleted; a deleted node accepts nothing more.
    pub deleted_at_ms: Option<i64>,
    /// The BMC of a machine enrolled from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc: Option<super::NodeBmc>,
    /// Since when it is in a transitional `provisionState` that has a time limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provision_since_ms: Option<i64>,
    /// Power as its BMC last reported it (`unknown` for a machine without one).
    #[serde(default, skip_serializing_if = "super::Power::is_unknown")]
    pub power: super::Power,
    /// Its scalar resources (`vcpu`, `memoryGiB`, `disk`) as last reported.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, u64>,
    /// Events folded.
    pub version: u32,
}

impl Node {
    /// Its `noScheduleReasons`: the blocking conditions it carries.
    pub fn no_schedule_reasons(&self) -> Vec<String> {
        no_schedule_reasons(&self.conditions)
    }

    /// Why it is not schedulable in a pool owned by `pool_owner` (empty: schedulable).
    pub fn unschedulable(&self, pool_owner: &TenantId) -> Vec<Unschedulable> {
        let reasons = self.no_schedule_reasons();
        let view = SchedulingView {
            provision_state: self.provision_state,
            role: self.role,
            maintenance: self.maintenance,
            cordoned: self.cordoned,
            connectivity: self.connectivity,
            no_schedule_reasons: &reasons,
            observed_generation: self.observed_generation,
            trust: self.trust,
            owner_tenant_id: self.owner_tenant_id.as_ref(),
            pool_owner_tenant_id: pool_owner,
        };
        if self.deleted_at_ms.is_some() {
            return vec![Unschedulable::ProvisionState(self.provision_state)];
        }
        schedulability(&view)
    }

    /// The class and number of its atoms (its bookable devices).
    pub fn atoms(&self) -> (Option<DeviceClass>, usize) {
        let mut atoms = self.devices.iter().filter(|d| d.bookable);
        let first = atoms.next().map(|d| d.class);
        (first, usize::from(first.is_some()) + atoms.count())
    }

    fn set_condition(&mut self, condition: Option<&Condition>, kind: super::ConditionType) {
        self.conditions.retain(|c| c.kind != kind);
        if let Some(condition) = condition {
            self.conditions.push(condition.clone());
        }
    }
}

/// Applies one event. No decisions here: the command decided; this only records what it decided.
pub fn evolve(state: Option<Node>, event: &NodeEvent) -> Option<Node> {
    let mut node = match (state, event) {
        (None, NodeEvent::Registered(e)) => {
            return Some(Node {
                id: e.node_id.clone(),
                pool_id: e.pool_id.clone(),
                site_id: e.site_id.clone(),
                name: e.name.clone(),
                role: e.role,
                trust: e.trust,
                owner_tenant_id: e.owner_tenant_id.clone(),
                adapter: e.adapter,
                provision_state: e.provision_state,
                maintenance: false,
                cordoned: false,
                draining: false,
                drain_forced: false,
                connectivity: e.connectivity,
                conditions: e.conditions.clone(),
                generation: e.generation,
                spec: NodeSpec::default(),
                observed_generation: e.observed_generation,
                gpus: e.gpus.clone(),
                devices: e.devices.clone(),
                hardware: None,
                inventory_snapshot: None,
                registered_at_ms: e.at_ms,
                deleted_at_ms: None,
                bmc: None,
                provision_since_ms: e.provision_state.limit_ms().map(|_| e.at_ms),
                power: super::Power::Unknown,
                resources: BTreeMap::new(),
                version: 1,
            });
        }
        (None, NodeEvent::Joined(e)) => {
            return Some(Node {
                id: e.node_id.clone(),
                pool_id: e.pool_id.clone(),
                site_id: e.site_id.clone(),
                name: e.name.clone(),
                role: e.role,
                trust: e.trust,
                owner_tenant_id: e.owner_tenant_id.clone(),
                adapter: Adapter::BcdV1,
                provision_state: ProvisionState::Adopting,
                maintenance: false,
                cordoned: false,
                draining: false,
                drain_forced: false,
                connectivity: Connectivity::Connected,
                conditions: e.conditions.clone(),
                generation: e.generation,
                spec: e.spec.clone(),
                observed_generation: 0,
                gpus: e.gpus.clone(),
                devices: e.devices.clone(),
                hardware: Some(e.hardware.clone()),
                inventory_snapshot: None,
                registered_at_ms: e.at_ms,
                deleted_at_ms: None,
                bmc: None,
                provision_since_ms: None,
                power: super::Power::Unknown,
                resources: BTreeMap::new(),
                version: 1,
            });
        }
        (None, _) => return None,
        (Some(node), _) => node,
    };
    node.version += 1;
    match event {
        NodeEvent::Registered(_) | NodeEvent::Joined(_) | NodeEvent::Rejoined(_) => {}
        NodeEvent::Cordoned(_) => node.cordoned = true,
        NodeEvent::Uncordoned(_) => {
            node.cordoned = false;
            node.draining = false;
            node.drain_forced = false;
        }
        NodeEvent::MaintenanceStarted(_) => node.maintenance = true,
        NodeEvent::MaintenanceEnded(_) => node.maintenance = false,
        NodeEvent::DrainStarted(e) => {
            node.cordoned = true;
            node.draining = true;
            node.drain_forced = e.force;
        }
        NodeEvent::Drained(_) => {
            node.draining = false;
            node.drain_forced = false;
        }
        NodeEvent::Adopted(_) => node.provision_state = ProvisionState::Adopted,
        NodeEvent::HardwareChanged(e) => {
            node.gpus = e.gpus.clone();
            node.devices = e.devices.clone();
            node.hardware = Some(e.hardware.clone());
        }
        NodeEvent::InventoryReported(e) => node.inventory_snapshot = Some(e.snapshot),
        NodeEvent::ConnectivityChanged(e) => node.connectivity = e.to,
        NodeEvent::ConditionRaised(e) => node.set_condition(Some(&e.condition), e.condition.kind),
        NodeEvent::ConditionCleared(e) => node.set_condition(None, e.kind),
        NodeEvent::SpecChanged(e) => {
            node.generation = e.generation;
            node.spec = e.spec.clone();
        }
        NodeEvent::SpecObserved(e) => node.observed_generation = e.observed_generation,
        NodeEvent::Deleted(e) => node.deleted_at_ms = Some(e.at_ms),
        NodeEvent::BmcSet(e) => node.bmc = Some(e.bmc.clone()),
        NodeEvent::PowerObserved(e) => node.power = e.power,
        NodeEvent::ResourcesChanged(e) => node.resources = e.resources.clone(),
        NodeEvent::ProvisionChanged(e) => {
            node.provision_state = e.to;
            node.provision_since_ms = e.to.limit_ms().map(|_| e.at_ms);
        }
    }
    Some(node)
}

/// Folds a stream's events, in version order.
pub fn fold<'a>(events: impl IntoIterator<Item = &'a NodeEvent>) -> Option<Node> {
    events.into_iter().fold(None, evolve)
}
