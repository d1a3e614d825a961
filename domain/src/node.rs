//! Nodes: machines whose state is several independent axes (provisioning, maintenance, cordon, power,
//! connectivity, conditions), the schedulability rule over them, and the node's events.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::device::{Device, GpuInfo};
use crate::domain_events;
use crate::hardware::{HardwareKey, Identifier};
use crate::id::{DeviceId, JoinTokenId, NodeId, PoolId, SiteId, TenantId};
use crate::inventory::{Section, SectionHashes};

/// Where a node is in its lifecycle. Changed by workflows and the lifecycle controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProvisionState {
    Adopting,
    Adopted,
    Enrolling,
    Inspecting,
    Commissioning,
    Ready,
    Deploying,
    Deployed,
    Releasing,
    Rescue,
    Failed,
    Retiring,
    Retired,
}

/// Power as a BMC driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Power {
    On,
    Off,
    #[default]
    Unknown,
}

/// Whether the node's agent session is alive. Changed by sessions and the liveness controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Connectivity {
    Connected,
    Disconnected,
    Unreachable,
    Lost,
}

/// What a node is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    Unassigned,
    Host,
    Dedicated,
    Site,
}

/// Who controls a node's hardware.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Trust {
    Platform,
    TenantOwned,
    TenantControlled,
}

/// How the control plane reaches a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Adapter {
    #[default]
    #[serde(rename = "bcd/v1")]
    BcdV1,
    #[serde(rename = "provider-api/v1")]
    ProviderApiV1,
}

/// The typed conditions a node can carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ConditionType {
    GpuCountMismatch,
    GpuModelUnknown,
    ClockSkew,
    NodeUnreachable,
    /// The machine came back with some identifiers changed (a GPU or NIC swapped) and was matched on the ones
    /// that survived. A notice for the operator: the new hardware is already what the node offers.
    HardwareChanged,
}

impl ConditionType {
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionType::GpuCountMismatch => "GpuCountMismatch",
            ConditionType::GpuModelUnknown => "GpuModelUnknown",
            ConditionType::ClockSkew => "ClockSkew",
            ConditionType::NodeUnreachable => "NodeUnreachable",
            ConditionType::HardwareChanged => "HardwareChanged",
        }
    }

    /// Whether the condition keeps the node off the scheduler (it then appears in `noScheduleReasons`).
    pub fn blocks_scheduling(self) -> bool {
        !matches!(self, ConditionType::HardwareChanged)
    }
}

/// A condition raised on a node, with what raised it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub kind: ConditionType,
    pub message: String,
    pub since_ms: i64,
}

mod decide;
pub mod lifecycle;
mod state;

pub use decide::{Disruption, NodeCommand, VerbState, decide, disruption_allowance};
pub use state::{Node, evolve, fold};

/// The axes the schedulability rule reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulingView<'a> {
    pub provision_state: ProvisionState,
    pub role: Role,
    pub maintenance: bool,
    pub cordoned: bool,
    pub connectivity: Connectivity,
    pub no_schedule_reasons: &'a [String],
    pub observed_generation: u64,
    pub trust: Trust,
    pub owner_tenant_id: Option<&'a TenantId>,
    pub pool_owner_tenant_id: &'a TenantId,
}

/// Why a node is not schedulable: one value per failed condition of the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unschedulable {
    ProvisionState(ProvisionState),
    Role(Role),
    Maintenance,
    Cordoned,
    Connectivity(Connectivity),
    NoScheduleReasons(Vec<String>),
    NotYetObserved,
    Trust(Trust),
}

impl fmt::Display for Unschedulable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unschedulable::ProvisionState(state) => write!(f, "provisionState is {state:?}, not adopted or deployed"),
            Unschedulable::Role(role) => write!(f, "role is {role:?}, not host"),
            Unschedulable::Maintenance => f.write_str("in maintenance"),
            Unschedulable::Cordoned => f.write_str("cordoned"),
            Unschedulable::Connectivity(c) => write!(f, "connectivity is {c:?}, not connected"),
            Unschedulable::NoScheduleReasons(reasons) => write!(f, "noScheduleReasons: {}", reasons.join(", ")),
            Unschedulable::NotYetObserved => f.write_str("observedGeneration is 0"),
            Unschedulable::Trust(trust) => write!(f, "trust is {trust:?}"),
        }
    }
}

/// The schedulability rule: a node is schedulable only when all eight conditions hold. Returns each one that
/// fails; empty means schedulable.
pub fn schedulability(view: &SchedulingView<'_>) -> Vec<Unschedulable> {
    let mut failed = Vec::new();
    if !view.provision_state.schedulable() {
        failed.push(Unschedulable::ProvisionState(view.provision_state));
    }
    if view.role != Role::Host {
        failed.push(Unschedulable::Role(view.role));
    }
    if view.maintenance {
        failed.push(Unschedulable::Maintenance);
    }
    if view.cordoned {
        failed.push(Unschedulable::Cordoned);
    }
    if view.connectivity != Connectivity::Connected {
        failed.push(Unschedulable::Connectivity(view.connectivity));
    }
    if !view.no_schedule_reasons.is_empty() {
        failed.push(Unschedulable::NoScheduleReasons(view.no_schedule_reasons.to_vec()));
    }
    if view.observed_generation < 1 {
        failed.push(Unschedulable::NotYetObserved);
    }
    let trusted = match view.trust {
        Trust::Platform => true,
        Trust::TenantOwned => view.owner_tenant_id == Some(view.pool_owner_tenant_id),
        Trust::TenantControlled => false,
    };
    if !trusted {
        failed.push(Unschedulable::Trust(view.trust));
    }
    failed
}

/// A node's `noScheduleReasons`, derived from its conditions (each blocking condition keeps the node off the
/// scheduler).
pub fn no_schedule_reasons(conditions: &[Condition]) -> Vec<String> {
    let kinds: BTreeSet<ConditionType> =
        conditions.iter().map(|c| c.kind).filter(|kind| kind.blocks_scheduling()).collect();
    kinds.into_iter().map(|kind| kind.as_str().to_owned()).collect()
}

/// A node registered with its inventory (the agent's join replaces this command in a later issue).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRegistered {
    pub node_id: NodeId,
    pub pool_id: PoolId,
    pub site_id: SiteId,
    pub name: String,
    pub role: Role,
    pub trust: Trust,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_tenant_id: Option<TenantId>,
    pub adapter: Adapter,
    pub provision_state: ProvisionState,
    pub connectivity: Connectivity,
    pub generation: u64,
    pub observed_generation: u64,
    pub gpus: Vec<GpuInfo>,
    /// Every device, atoms and their parents, as the pool's sharing mode makes them.
    pub devices: Vec<Device>,
    pub conditions: Vec<Condition>,
    pub at_ms: i64,
}

/// A node's cordon or maintenance flag changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeFlagChanged {
    pub node_id: NodeId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub at_ms: i64,
}

/// A node's desired state. Its generation lives on the node and rises with every change; the agent reports the
/// generation it has applied as `observedGeneration`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSpec {
    /// How the node's GPUs are shared, as the pool says (`exclusive`, `mig`, `timeslice`, `mps`); empty for a
    /// node registered without an agent, which has no spec of its own.
    #[serde(default)]
    pub sharing: String,
    /// Slots per GPU for `timeslice` and `mps`.
    #[serde(default)]
    pub replicas: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_layout: Option<String>,
    /// Operator labels the agent applies (and reports back through its inventory).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// A machine joined a pool with a join token: recorded `adopting`, with its inventory's GPUs and devices and its
/// hardware identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeJoined {
    pub node_id: NodeId,
    pub pool_id: PoolId,
    pub site_id: SiteId,
    pub name: String,
    pub role: Role,
    pub trust: Trust,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_tenant_id: Option<TenantId>,
    pub join_token_id: JoinTokenId,
    pub gpus: Vec<GpuInfo>,
    pub devices: Vec<Device>,
    pub conditions: Vec<Condition>,
    pub hardware: HardwareKey,
    pub generation: u64,
    pub spec: NodeSpec,
    pub at_ms: i64,
}

/// The node passed the pool's acceptance checks and was adopted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeAdopted {
    pub node_id: NodeId,
    /// The checks it passed.
    pub checks: Vec<String>,
    pub at_ms: i64,
}

/// A machine that joined again (a reinstall, a lost credential) was matched to this node on identifiers that
/// survived, instead of becoming a second node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRejoined {
    pub node_id: NodeId,
    pub join_token_id: JoinTokenId,
    /// The identifiers it was matched on.
    pub matched: Vec<Identifier>,
    pub at_ms: i64,
}

/// The node's hardware changed (a GPU or NIC swapped): its GPUs, devices and identity as they are now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeHardwareChanged {
    pub node_id: NodeId,
    pub gpus: Vec<GpuInfo>,
    /// Every device the node has now.
    pub devices: Vec<Device>,
    /// Devices that are gone; bookings on them are placed again.
    pub removed_devices: Vec<DeviceId>,
    pub hardware: HardwareKey,
    pub at_ms: i64,
}

/// The agent reported an inventory that differs from the last one: snapshot `snapshot` was stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeInventoryReported {
    pub node_id: NodeId,
    pub snapshot: u64,
    pub hashes: SectionHashes,
    /// The sections whose hash changed.
    pub changed: Vec<Section>,
    pub at_ms: i64,
}

/// The node's agent session changed connectivity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeConnectivityChanged {
    pub node_id: NodeId,
    pub from: Connectivity,
    pub to: Connectivity,
    pub at_ms: i64,
}

/// A condition raised on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeConditionRaised {
    pub node_id: NodeId,
    pub condition: Condition,
}

/// A condition cleared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeConditionCleared {
    pub node_id: NodeId,
    #[serde(rename = "type")]
    pub kind: ConditionType,
    pub at_ms: i64,
}

/// The node's desired state changed; its generation rose to `generation`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSpecChanged {
    pub node_id: NodeId,
    pub generation: u64,
    pub spec: NodeSpec,
    pub at_ms: i64,
}

/// The agent applied its NodeSpec up to `observed_generation`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSpecObserved {
    pub node_id: NodeId,
    pub observed_generation: u64,
    pub at_ms: i64,
}

/// A drain began: the node is cordoned, its future bookings move elsewhere, and running ones finish (or, when
/// forced, are ended).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeDrainStarted {
    pub node_id: NodeId,
    pub force: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub at_ms: i64,
}

/// A node removed from its pool: its credential is revoked and its devices are gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeDeleted {
    pub node_id: NodeId,
    pub pool_id: PoolId,
    /// Deleted while bookings remained (they were placed again or failed).
    pub force: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub at_ms: i64,
}

/// A drain that completed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeAt {
    pub node_id: NodeId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub at_ms: i64,
}

/// How the control plane reaches a machine's BMC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BmcDriver {
    Redfish,
    Ipmi,
}

impl Power {
    pub fn as_str(self) -> &'static str {
        match self {
            Power::On => "on",
            Power::Off => "off",
            Power::Unknown => "unknown",
        }
    }

    pub(crate) fn is_unknown(&self) -> bool {
        *self == Power::Unknown
    }
}

impl BmcDriver {
    pub fn as_str(self) -> &'static str {
        match self {
            BmcDriver::Redfish => "redfish",
            BmcDriver::Ipmi => "ipmi",
        }
    }
}

/// A machine's BMC as the site reaches it, without its credentials (they are sealed, never in an event).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeBmc {
    pub driver: BmcDriver,
    /// `https://host[:port]` for Redfish, `host[:port]` for IPMI.
    pub address: String,
    /// The Redfish system's id or UUID, when the BMC has several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_id: Option<String>,
    /// Accept the BMC's certificate without checking it (self-signed BMCs); otherwise the site's trust applies.
    #[serde(default)]
    pub insecure_tls: bool,
    /// The driver bound to each concern of this machine.
    pub drivers: BTreeMap<crate::profile::Concern, String>,
    /// The MAC address (lowercase, colon-separated) the machine boots from the network with: how the site agent
    /// tells which machine asks for its boot script.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_mac: Option<String>,
}

/// A machine was enrolled with its BMC (its first event after `node.registered` in `enrolling`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeBmcSet {
    pub node_id: NodeId,
    pub bmc: NodeBmc,
    pub at_ms: i64,
}

/// The machine's power as its BMC reported it (after a site step changed or read it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodePowerObserved {
    pub node_id: NodeId,
    pub power: Power,
    pub at_ms: i64,
}

/// A move of the node's lifecycle (`provisionState`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeProvisionChanged {
    pub node_id: NodeId,
    pub from: ProvisionState,
    pub to: ProvisionState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub at_ms: i64,
}

/// The scalar resources a node has, as its inventory reports them (`vcpu`, `memoryGiB`, `disk`): what a pool's
/// overcommit multiplies and its allocations' scalar amounts are taken from. Every amount it had before is
/// replaced; a resource left out is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeResourcesChanged {
    pub node_id: NodeId,
    pub resources: BTreeMap<String, u64>,
    pub at_ms: i64,
}

/// The most of one scalar resource a node may report (a billion vCPUs or GiB: far past any machine).
pub const MAX_NODE_SCALAR: u64 = 1_000_000_000;

/// Checks the scalar resources a node is registered with: known resources, amounts up to [`MAX_NODE_SCALAR`].
pub fn check_resources(field: &str, resources: &BTreeMap<String, u64>) -> Result<(), crate::Rejection> {
    for (resource, amount) in resources {
        if !crate::pool::SCALAR_RESOURCES.contains(&resource.as_str()) {
            return Err(crate::Rejection::invalid(
                format!("{field}.{resource}"),
                format!("is not a scalar resource; nodes report {}", crate::pool::SCALAR_RESOURCES.join(", ")),
            ));
        }
        if *amount > MAX_NODE_SCALAR {
            return Err(crate::Rejection::invalid(
                format!("{field}.{resource}"),
                format!("must be at most {MAX_NODE_SCALAR}"),
            ));
        }
    }
    Ok(())
}

/// A node's scalar resources in an inventory: its logical CPUs, its memory and its disks in whole GiB. A
/// resource the inventory does not know (zero) is left out.
pub fn scalars_of(inventory: &crate::inventory::NodeInventory) -> BTreeMap<String, u64> {
    const GIB: u64 = 1 << 30;
    let disk_bytes: u64 = inventory.disks.iter().map(|d| d.size_bytes).fold(0, u64::saturating_add);
    [
        ("vcpu", u64::from(inventory.system.cpu_cores)),
        ("memoryGiB", inventory.system.memory_mib / 1024),
        ("disk", disk_bytes / GIB),
    ]
    .into_iter()
    .filter(|(_, amount)| *amount > 0)
    .map(|(resource, amount)| (resource.to_owned(), amount))
    .collect()
}

domain_events! {
    /// Events of a node's stream.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub enum NodeEvent {
        Registered(NodeRegistered) = "node.registered",
        Cordoned(NodeFlagChanged) = "node.cordoned",
        Uncordoned(NodeFlagChanged) = "node.uncordoned",
        MaintenanceStarted(NodeFlagChanged) = "node.maintenance_started",
        MaintenanceEnded(NodeFlagChanged) = "node.maintenance_ended",
        Joined(NodeJoined) = "node.joined",
        Adopted(NodeAdopted) = "node.adopted",
        Rejoined(NodeRejoined) = "node.rejoined",
        HardwareChanged(NodeHardwareChanged) = "node.hardware_changed",
        InventoryReported(NodeInventoryReported) = "node.inventory_reported",
        ConnectivityChanged(NodeConnectivityChanged) = "node.connectivity_changed",
        ConditionRaised(NodeConditionRaised) = "node.condition_raised",
        ConditionCleared(NodeConditionCleared) = "node.condition_cleared",
        SpecChanged(NodeSpecChanged) = "node.spec_changed",
        SpecObserved(NodeSpecObserved) = "node.spec_observed",
        DrainStarted(NodeDrainStarted) = "node.drain_started",
        Drained(NodeAt) = "node.drained",
        Deleted(NodeDeleted) = "node.deleted",
        BmcSet(NodeBmcSet) = "node.bmc_set",
        ProvisionChanged(NodeProvisionChanged) = "node.provision_changed",
        PowerObserved(NodePowerObserved) = "node.power_observed",
        ResourcesChanged(NodeResourcesChanged) = "node.resources_changed",
    }
}

impl NodeEvent {
    /// The node the event is about.
    pub fn node_id(&self) -> &NodeId {
        match self {
            NodeEvent::Registered(e) => &e.node_id,
            NodeEvent::Cordoned(e)
            | NodeEvent::Uncordoned(e)
            | NodeEvent::MaintenanceStarted(e)
            | NodeEvent::MaintenanceEnded(e) => &e.node_id,
            NodeEvent::Joined(e) => &e.node_id,
            NodeEvent::Adopted(e) => &e.node_id,
            NodeEvent::Rejoined(e) => &e.node_id,
            NodeEvent::HardwareChanged(e) => &e.node_id,
            NodeEvent::InventoryReported(e) => &e.node_id,
            NodeEvent::ConnectivityChanged(e) => &e.node_id,
            NodeEvent::ConditionRaised(e) => &e.node_id,
            NodeEvent::ConditionCleared(e) => &e.node_id,
            NodeEvent::SpecChanged(e) => &e.node_id,
            NodeEvent::SpecObserved(e) => &e.node_id,
            NodeEvent::DrainStarted(e) => &e.node_id,
            NodeEvent::Drained(e) => &e.node_id,
            NodeEvent::Deleted(e) => &e.node_id,
            NodeEvent::BmcSet(e) => &e.node_id,
            NodeEvent::ProvisionChanged(e) => &e.node_id,
            NodeEvent::PowerObserved(e) => &e.node_id,
            NodeEvent::ResourcesChanged(e) => &e.node_id,
        }
    }
}

/// Where an agent's silence puts its node (DESIGN.md section 10): within the liveness lease it is `connected`;
/// once the lease lapsed, `disconnected`; after twice the lease, `unreachable`; after the pool's `lostAfter`
/// (never sooner than `unreachable`), `lost`.
pub fn connectivity_after_silence(silence_ms: i64, lease_ms: i64, lost_after_ms: i64) -> Connectivity {
    if silence_ms < lease_ms {
        Connectivity::Connected
    } else if silence_ms < 2 * lease_ms {
        Connectivity::Disconnected
    } else if silence_ms < lost_after_ms.max(2 * lease_ms) {
        Connectivity::Unreachable
    } else {
        Connectivity::Lost
    }
}

/// The liveness lease an agent session holds by default (DESIGN.md section 10).
pub const LIVENESS_LEASE_MS: i64 = 40_000;

/// How far the agent's clock may stray from the database server's before `ClockSkew` is raised.
pub const MAX_CLOCK_SKEW_MS: i64 = 1_000;

#[cfg(test)]
mod tests;
