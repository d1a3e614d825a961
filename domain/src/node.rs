//! Nodes: machines whose state is several independent axes (provisioning, maintenance, cordon, power,
//! connectivity, conditions), the schedulability rule over them, and the node's events.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::device::{Device, GpuInfo};
use crate::domain_events;
use crate::id::{NodeId, PoolId, SiteId, TenantId};

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
}

impl ConditionType {
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionType::GpuCountMismatch => "GpuCountMismatch",
            ConditionType::GpuModelUnknown => "GpuModelUnknown",
            ConditionType::ClockSkew => "ClockSkew",
            ConditionType::NodeUnreachable => "NodeUnreachable",
        }
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
    if !matches!(view.provision_state, ProvisionState::Adopted | ProvisionState::Deployed) {
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

/// A node's `noScheduleReasons`, derived from its conditions (each condition keeps the node off the scheduler).
pub fn no_schedule_reasons(conditions: &[Condition]) -> Vec<String> {
    let kinds: BTreeSet<ConditionType> = conditions.iter().map(|c| c.kind).collect();
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

domain_events! {
    /// Events of a node's stream.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub enum NodeEvent {
        Registered(NodeRegistered) = "node.registered",
        Cordoned(NodeFlagChanged) = "node.cordoned",
        Uncordoned(NodeFlagChanged) = "node.uncordoned",
        MaintenanceStarted(NodeFlagChanged) = "node.maintenance_started",
        MaintenanceEnded(NodeFlagChanged) = "node.maintenance_ended",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str) -> TenantId {
        name.parse().expect("tenant")
    }

    fn schedulable_view<'a>(
        reasons: &'a [String],
        owner: &'a TenantId,
        pool_owner: &'a TenantId,
    ) -> SchedulingView<'a> {
        SchedulingView {
            provision_state: ProvisionState::Adopted,
            role: Role::Host,
            maintenance: false,
            cordoned: false,
            connectivity: Connectivity::Connected,
            no_schedule_reasons: reasons,
            observed_generation: 1,
            trust: Trust::Platform,
            owner_tenant_id: Some(owner),
            pool_owner_tenant_id: pool_owner,
        }
    }

    #[test]
    fn a_node_meeting_all_eight_conditions_is_schedulable() {
        let platform = tenant("root");
        assert!(schedulability(&schedulable_view(&[], &platform, &platform)).is_empty());
        let deployed =
            SchedulingView { provision_state: ProvisionState::Deployed, ..schedulable_view(&[], &platform, &platform) };
        assert!(schedulability(&deployed).is_empty());
    }

    #[test]
    fn each_condition_alone_makes_a_node_unschedulable() {
        let platform = tenant("root");
        let other = tenant("acme");
        let reasons = vec!["GpuModelUnknown".to_owned()];
        let base = schedulable_view(&[], &platform, &platform);
        let cases: Vec<(SchedulingView<'_>, Unschedulable)> = vec![
            (
                SchedulingView { provision_state: ProvisionState::Ready, ..base.clone() },
                Unschedulable::ProvisionState(ProvisionState::Ready),
            ),
            (SchedulingView { role: Role::Site, ..base.clone() }, Unschedulable::Role(Role::Site)),
            (SchedulingView { maintenance: true, ..base.clone() }, Unschedulable::Maintenance),
            (SchedulingView { cordoned: true, ..base.clone() }, Unschedulable::Cordoned),
            (
                SchedulingView { connectivity: Connectivity::Disconnected, ..base.clone() },
                Unschedulable::Connectivity(Connectivity::Disconnected),
            ),
            (
                SchedulingView { no_schedule_reasons: &reasons, ..base.clone() },
                Unschedulable::NoScheduleReasons(reasons.clone()),
            ),
            (SchedulingView { observed_generation: 0, ..base.clone() }, Unschedulable::NotYetObserved),
            (
                SchedulingView { trust: Trust::TenantControlled, ..base.clone() },
                Unschedulable::Trust(Trust::TenantControlled),
            ),
            (
                SchedulingView { trust: Trust::TenantOwned, owner_tenant_id: Some(&other), ..base.clone() },
                Unschedulable::Trust(Trust::TenantOwned),
            ),
        ];
        for (view, expected) in cases {
            assert_eq!(schedulability(&view), vec![expected.clone()], "{expected}");
        }
    }

    #[test]
    fn a_tenant_owned_node_is_schedulable_in_a_pool_its_owner_owns() {
        let acme = tenant("acme");
        let view = SchedulingView { trust: Trust::TenantOwned, ..schedulable_view(&[], &acme, &acme) };
        assert!(schedulability(&view).is_empty());
    }

    #[test]
    fn every_provision_state_but_adopted_and_deployed_is_unschedulable() {
        let platform = tenant("root");
        use ProvisionState::*;
        for state in [
            Adopting,
            Enrolling,
            Inspecting,
            Commissioning,
            Ready,
            Deploying,
            Releasing,
            Rescue,
            Failed,
            Retiring,
            Retired,
        ] {
            let view = SchedulingView { provision_state: state, ..schedulable_view(&[], &platform, &platform) };
            assert_eq!(schedulability(&view), vec![Unschedulable::ProvisionState(state)]);
        }
    }

    #[test]
    fn conditions_feed_no_schedule_reasons() {
        let conditions = vec![
            Condition { kind: ConditionType::GpuModelUnknown, message: "x".into(), since_ms: 0 },
            Condition { kind: ConditionType::ClockSkew, message: "y".into(), since_ms: 0 },
        ];
        assert_eq!(no_schedule_reasons(&conditions), vec!["GpuModelUnknown".to_owned(), "ClockSkew".to_owned()]);
        assert_eq!(serde_json::to_string(&Adapter::BcdV1).expect("json"), "\"bcd/v1\"");
        assert_eq!(serde_json::to_string(&Trust::TenantControlled).expect("json"), "\"tenant-controlled\"");
    }
}
