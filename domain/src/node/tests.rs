//! The node aggregate without IO: given its events, when an operator's command, then events or a rejection.

use super::*;
use std::collections::BTreeMap;

use crate::Rejection;
use crate::device::{GpuInfo, devices_for};
use crate::testing::{Nodes, given};

const T0: i64 = 1_893_456_000_000;

fn node_id() -> NodeId {
    "node_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("node")
}

fn pool_owner() -> TenantId {
    "root".parse().expect("tenant")
}

fn registered() -> NodeEvent {
    let gpus: Vec<GpuInfo> = (0..2)
        .map(|g| GpuInfo {
            uuid: format!("GPU-n-{g}").parse().expect("uuid"),
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_mib: 81_559,
            pci_bus_id: None,
            mig_instances: Vec::new(),
        })
        .collect();
    let (devices, _) = devices_for(&gpus, crate::device::Sharing::Exclusive, 1);
    NodeEvent::Registered(NodeRegistered {
        node_id: node_id(),
        pool_id: "pool_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("pool"),
        site_id: "site_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("site"),
        name: "a".into(),
        role: Role::Host,
        trust: Trust::Platform,
        owner_tenant_id: None,
        adapter: Adapter::BcdV1,
        provision_state: ProvisionState::Adopted,
        connectivity: Connectivity::Connected,
        generation: 1,
        observed_generation: 1,
        gpus,
        devices,
        conditions: Vec::new(),
        at_ms: T0,
    })
}

fn flag(at_ms: i64) -> NodeFlagChanged {
    NodeFlagChanged { node_id: node_id(), reason: None, at_ms }
}

/// Room for one more node out: a budget of one node in ten, none out yet.
fn room() -> Disruption {
    Disruption { budget: 0.1, nodes: 10, disrupted: 0 }
}

fn verb(command: NodeCommand) -> impl FnOnce(Option<&Node>) -> Result<Vec<NodeEvent>, Rejection> {
    move |node| decide(&node.expect("a node").verb_state(), &command)
}

#[test]
fn a_registered_node_is_schedulable_and_holds_its_atoms() {
    let node = given::<Nodes>([registered()]).state().cloned().expect("a node");
    assert!(node.unschedulable(&pool_owner()).is_empty());
    assert_eq!(node.atoms(), (Some(crate::device::DeviceClass::Gpu), 2));
}

#[test]
fn cordoning_twice_records_once_and_uncordoning_ends_a_drain() {
    let cordoned = given::<Nodes>([registered()])
        .when(verb(NodeCommand::Cordon { reason: None, now_ms: T0 }))
        .then([NodeEvent::Cordoned(flag(T0))])
        .expect("a node");
    assert_eq!(cordoned.unschedulable(&pool_owner()), vec![Unschedulable::Cordoned]);
    given::<Nodes>([registered(), NodeEvent::Cordoned(flag(T0))])
        .when(verb(NodeCommand::Cordon { reason: None, now_ms: T0 + 1 }))
        .then_nothing();
    let drain = NodeEvent::DrainStarted(NodeDrainStarted { node_id: node_id(), force: true, reason: None, at_ms: T0 });
    let back = given::<Nodes>([registered(), drain])
        .when(verb(NodeCommand::Uncordon { reason: None, now_ms: T0 + 1 }))
        .then([NodeEvent::Uncordoned(flag(T0 + 1))])
        .expect("a node");
    assert!(!back.cordoned && !back.draining && !back.drain_forced);
}

#[test]
fn maintenance_and_drains_stay_within_the_disruption_budget() {
    let spent = Disruption { budget: 0.1, nodes: 10, disrupted: 1 };
    given::<Nodes>([registered()])
        .when(verb(NodeCommand::StartMaintenance { reason: None, disruption: spent, now_ms: T0 }))
        .then_rejected(|r| matches!(r, Rejection::Conflict(m) if m.contains("disruption budget (0.1) allows 1")));
    given::<Nodes>([registered()])
        .when(verb(NodeCommand::Drain { force: false, reason: None, disruption: spent, now_ms: T0 }))
        .then_rejected(|r| matches!(r, Rejection::Conflict(_)));
    // A node already out does not count twice: in maintenance, it may drain; draining, it may go into maintenance.
    let in_maintenance = [registered(), NodeEvent::MaintenanceStarted(flag(T0))];
    given::<Nodes>(in_maintenance)
        .when(verb(NodeCommand::Drain { force: false, reason: None, disruption: spent, now_ms: T0 + 1 }))
        .then([NodeEvent::DrainStarted(NodeDrainStarted {
            node_id: node_id(),
            force: false,
            reason: None,
            at_ms: T0 + 1,
        })]);
    // With room, maintenance starts; the budget's floor is one node however small the pool.
    let tiny = Disruption { budget: 0.05, nodes: 3, disrupted: 0 };
    let out = given::<Nodes>([registered()])
        .when(verb(NodeCommand::StartMaintenance { reason: Some("bios".into()), disruption: tiny, now_ms: T0 }))
        .then([NodeEvent::MaintenanceStarted(NodeFlagChanged {
            node_id: node_id(),
            reason: Some("bios".into()),
            at_ms: T0,
        })])
        .expect("a node");
    assert!(out.maintenance);
    assert_eq!(disruption_allowance(0.05, 3), 1);
    assert_eq!(disruption_allowance(0.25, 40), 10);
}

#[test]
fn a_drain_cordons_repeats_only_with_force_and_completes_once() {
    let started =
        NodeEvent::DrainStarted(NodeDrainStarted { node_id: node_id(), force: false, reason: None, at_ms: T0 });
    let draining = given::<Nodes>([registered()])
        .when(verb(NodeCommand::Drain { force: false, reason: None, disruption: room(), now_ms: T0 }))
        .then([started.clone()])
        .expect("a node");
    assert!(draining.cordoned && draining.draining && !draining.drain_forced);
    given::<Nodes>([registered(), started.clone()])
        .when(verb(NodeCommand::Drain { force: false, reason: None, disruption: room(), now_ms: T0 + 1 }))
        .then_nothing();
    let forced = given::<Nodes>([registered(), started.clone()])
        .when(verb(NodeCommand::Drain { force: true, reason: None, disruption: room(), now_ms: T0 + 1 }))
        .then([NodeEvent::DrainStarted(NodeDrainStarted {
            node_id: node_id(),
            force: true,
            reason: None,
            at_ms: T0 + 1,
        })])
        .expect("a node");
    assert!(forced.drain_forced);
    let done = given::<Nodes>([registered(), started.clone()])
        .when(verb(NodeCommand::CompleteDrain { now_ms: T0 + 2 }))
        .then([NodeEvent::Drained(NodeAt { node_id: node_id(), reason: None, at_ms: T0 + 2 })])
        .expect("a node");
    assert!(done.cordoned && !done.draining, "a drained node stays cordoned");
    given::<Nodes>([registered()]).when(verb(NodeCommand::CompleteDrain { now_ms: T0 })).then_nothing();
}

#[test]
fn a_node_holding_reservations_is_deleted_only_with_force() {
    let held = vec!["rsv_a".to_owned()];
    given::<Nodes>([registered()])
        .when(verb(NodeCommand::Delete { force: false, reason: None, held: held.clone(), now_ms: T0 }))
        .then_rejected(|r| matches!(r, Rejection::Conflict(m) if m.contains("rsv_a")));
    let pool_id: PoolId = "pool_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("pool");
    let gone = given::<Nodes>([registered()])
        .when(verb(NodeCommand::Delete { force: true, reason: Some("rma".into()), held, now_ms: T0 }))
        .then([NodeEvent::Deleted(NodeDeleted {
            node_id: node_id(),
            pool_id,
            force: true,
            reason: Some("rma".into()),
            at_ms: T0,
        })])
        .expect("the deleted node");
    assert_eq!(gone.deleted_at_ms, Some(T0));
    assert!(!gone.unschedulable(&pool_owner()).is_empty());
}

#[test]
fn a_new_spec_raises_the_generation_and_bad_labels_are_refused() {
    let labels = BTreeMap::from([("rack".to_owned(), "r12".to_owned())]);
    let changed = given::<Nodes>([registered()])
        .when(verb(NodeCommand::SetSpec { labels: labels.clone(), mig_layout: None, now_ms: T0 }))
        .then([NodeEvent::SpecChanged(NodeSpecChanged {
            node_id: node_id(),
            generation: 2,
            spec: NodeSpec { labels, ..NodeSpec::default() },
            at_ms: T0,
        })])
        .expect("a node");
    assert_eq!((changed.generation, changed.observed_generation), (2, 1));
    let bad = BTreeMap::from([(String::new(), "x".to_owned())]);
    given::<Nodes>([registered()])
        .when(verb(NodeCommand::SetSpec { labels: bad, mig_layout: None, now_ms: T0 }))
        .then_rejected(|r| matches!(r, Rejection::InvalidArgument { field, .. } if field == "labels."));
}

#[test]
fn conditions_are_kept_one_per_type_and_only_blocking_ones_keep_it_off_the_scheduler() {
    let raised = |kind, message: &str, at| {
        NodeEvent::ConditionRaised(NodeConditionRaised {
            node_id: node_id(),
            condition: Condition { kind, message: message.into(), since_ms: at },
        })
    };
    let history = [
        registered(),
        raised(ConditionType::GpuCountMismatch, "1 of 2", T0),
        raised(ConditionType::GpuCountMismatch, "0 of 2", T0 + 1),
        raised(ConditionType::HardwareChanged, "a GPU swapped", T0 + 2),
    ];
    let node = given::<Nodes>(history.clone()).state().cloned().expect("a node");
    assert_eq!(node.conditions.len(), 2);
    assert_eq!(node.no_schedule_reasons(), vec!["GpuCountMismatch".to_owned()]);
    let mut cleared = history.to_vec();
    cleared.push(NodeEvent::ConditionCleared(NodeConditionCleared {
        node_id: node_id(),
        kind: ConditionType::GpuCountMismatch,
        at_ms: T0 + 3,
    }));
    let node = given::<Nodes>(cleared).state().cloned().expect("a node");
    assert!(node.unschedulable(&pool_owner()).is_empty(), "HardwareChanged does not block scheduling");
}

#[test]
fn a_silent_node_leaves_the_scheduler_and_comes_back() {
    let moved = |from, to, at| {
        NodeEvent::ConnectivityChanged(NodeConnectivityChanged { node_id: node_id(), from, to, at_ms: at })
    };
    let lost = given::<Nodes>([registered(), moved(Connectivity::Connected, Connectivity::Lost, T0)])
        .state()
        .cloned()
        .expect("a node");
    assert_eq!(lost.unschedulable(&pool_owner()), vec![Unschedulable::Connectivity(Connectivity::Lost)]);
    let back = given::<Nodes>([
        registered(),
        moved(Connectivity::Connected, Connectivity::Lost, T0),
        moved(Connectivity::Lost, Connectivity::Connected, T0 + 1),
    ])
    .state()
    .cloned()
    .expect("a node");
    assert!(back.unschedulable(&pool_owner()).is_empty());
}

fn tenant(name: &str) -> TenantId {
    name.parse().expect("tenant")
}

fn schedulable_view<'a>(reasons: &'a [String], owner: &'a TenantId, pool_owner: &'a TenantId) -> SchedulingView<'a> {
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
    for state in
        [Adopting, Enrolling, Inspecting, Commissioning, Ready, Deploying, Releasing, Rescue, Failed, Retiring, Retired]
    {
        let view = SchedulingView { provision_state: state, ..schedulable_view(&[], &platform, &platform) };
        assert_eq!(schedulability(&view), vec![Unschedulable::ProvisionState(state)]);
    }
}

#[test]
fn silence_moves_a_node_through_disconnected_and_unreachable_to_lost() {
    let lease = LIVENESS_LEASE_MS;
    let lost_after = 600_000;
    let at = |silence| connectivity_after_silence(silence, lease, lost_after);
    assert_eq!(at(0), Connectivity::Connected);
    assert_eq!(at(lease - 1), Connectivity::Connected);
    assert_eq!(at(lease), Connectivity::Disconnected);
    assert_eq!(at(2 * lease - 1), Connectivity::Disconnected);
    assert_eq!(at(2 * lease), Connectivity::Unreachable);
    assert_eq!(at(lost_after - 1), Connectivity::Unreachable);
    assert_eq!(at(lost_after), Connectivity::Lost);
    // A lostAfter shorter than twice the lease never skips unreachable.
    assert_eq!(connectivity_after_silence(2 * lease - 1, lease, 1_000), Connectivity::Disconnected);
    assert_eq!(connectivity_after_silence(2 * lease, lease, 1_000), Connectivity::Lost);
}

#[test]
fn a_hardware_change_is_a_notice_not_a_reason_to_stop_scheduling() {
    let conditions = vec![
        Condition { kind: ConditionType::HardwareChanged, message: "gpu swapped".into(), since_ms: 0 },
        Condition { kind: ConditionType::NodeUnreachable, message: "silent".into(), since_ms: 0 },
    ];
    assert_eq!(no_schedule_reasons(&conditions), vec!["NodeUnreachable".to_owned()]);
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
