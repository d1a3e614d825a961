//! The hand-over of whole nodes (`binding: node`): at the window's start each machine is deployed with the
//! tenant's profile, and at the release (or once the reservation ended while they were handed over) each is wiped
//! by a release workflow. Pure: the caller reads each machine's lifecycle state and the reservation's workflows on
//! it, and carries out the actions decided here.

use crate::id::NodeId;
use crate::node::ProvisionState;
use crate::workflow::Outcome;

use super::{Command, FailureReason, Reservation, ReservationState};

/// A workflow the reservation started on a machine: running (`None`) or ended with an outcome.
pub type Run = Option<Outcome>;

/// One machine of a `binding: node` reservation, as its hand-over reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineFacts {
    pub node_id: NodeId,
    pub provision_state: ProvisionState,
    /// The workflow running on the machine now: whether this reservation started it.
    pub running: Option<RunningWorkflow>,
    /// The reservation's latest deployment and latest wipe of the machine.
    pub deploy: Option<Run>,
    pub release: Option<Run>,
}

/// The workflow running on a machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningWorkflow {
    pub workflow_id: String,
    pub mine: bool,
}

/// What the caller does on a machine, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MachineAction {
    /// Deploy the reservation's profile.
    Deploy(NodeId),
    /// Cancel the reservation's own workflow that still runs (a deployment the release overtook).
    Cancel { node_id: NodeId, workflow_id: String },
    /// Wipe the machine with a release workflow.
    Release(NodeId),
}

/// One step of a hand-over: the actions to carry out now, and the reservation's command once the hand-over is
/// over (activate, fail, complete the release).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HandOverStep {
    pub actions: Vec<MachineAction>,
    pub command: Option<Command>,
}

/// How often a hand-over looks at its machines while it waits: a workflow's end wakes it at once, so this only
/// bounds the wait for a machine still being wiped after its previous tenant.
pub const NODE_POLL_MS: i64 = 10_000;

/// The next step of a whole-node hand-over at `now_ms`: a binding deploys each machine once it is `ready` and
/// free of other workflows, and activates when every deployment succeeded (any failure fails the binding); a
/// release wipes each machine (cancelling a deployment it overtook), and completes when every wipe ended, as
/// unconfirmed when one did not succeed. `machines` are those of the reservation's allocations that still exist.
pub fn hand_over(r: &Reservation, machines: &[MachineFacts], now_ms: i64) -> HandOverStep {
    let allocated = r.allocations.iter().map(|a| &a.node_id);
    let mut step = HandOverStep::default();
    match r.state {
        ReservationState::Binding => {
            let mut done = 0;
            for node in allocated {
                let Some(m) = machines.iter().find(|m| &m.node_id == node) else {
                    step.command = Some(Command::Fail { reason: FailureReason::BindingFailed, now_ms });
                    return step;
                };
                match m.deploy {
                    Some(Some(Outcome::Succeeded)) => done += 1,
                    Some(Some(Outcome::Failed | Outcome::Cancelled)) => {
                        step.command = Some(Command::Fail { reason: FailureReason::BindingFailed, now_ms });
                        return step;
                    }
                    Some(None) => {}
                    None if m.provision_state == ProvisionState::Ready && m.running.is_none() => {
                        step.actions.push(MachineAction::Deploy(node.clone()));
                    }
                    None => {}
                }
            }
            if done == r.allocations.len() {
                step.command = Some(Command::Activate { now_ms });
            }
        }
        ReservationState::Releasing => {
            let (actions, over, unconfirmed) = wipe(r, machines);
            step.actions = actions;
            if over {
                step.command = Some(Command::CompleteRelease { now_ms, unconfirmed });
            }
        }
        _ => {}
    }
    step
}

/// The actions that wipe the reservation's machines once it ended while they were handed over (it expired or
/// failed): nobody waits for them.
pub fn wipe_after_end(r: &Reservation, machines: &[MachineFacts]) -> Vec<MachineAction> {
    wipe(r, machines).0
}

/// The wipe of each machine: the actions to take, whether every wipe is over, and whether one of them did not
/// succeed (or the machine was gone or in someone else's hands).
fn wipe(r: &Reservation, machines: &[MachineFacts]) -> (Vec<MachineAction>, bool, bool) {
    let mut actions = Vec::new();
    let (mut over, mut unconfirmed) = (true, false);
    for node in r.allocations.iter().map(|a| &a.node_id) {
        let Some(m) = machines.iter().find(|m| &m.node_id == node) else {
            unconfirmed = true;
            continue;
        };
        match (&m.release, &m.running) {
            (Some(Some(Outcome::Succeeded)), _) => {}
            (Some(Some(Outcome::Failed | Outcome::Cancelled)), _) => unconfirmed = true,
            (Some(None), _) => over = false,
            (None, Some(running)) if running.mine => {
                actions.push(MachineAction::Cancel { node_id: node.clone(), workflow_id: running.workflow_id.clone() });
                actions.push(MachineAction::Release(node.clone()));
                over = false;
            }
            // An operator's workflow holds the machine: it is theirs to finish.
            (None, Some(_)) => unconfirmed = true,
            (None, None) => match m.provision_state {
                ProvisionState::Deployed | ProvisionState::Failed | ProvisionState::Rescue => {
                    actions.push(MachineAction::Release(node.clone()));
                    over = false;
                }
                // Never deployed for it, or wiped already.
                ProvisionState::Ready => {}
                _ => unconfirmed = true,
            },
        }
    }
    (actions, over, unconfirmed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::{AllocationId, DeviceId, Identity, ReservationId};
    use crate::reservation::{Allocation, Binding, ReservationRequest};

    fn reservation(state: ReservationState, nodes: &[&NodeId]) -> Reservation {
        let mut request = ReservationRequest::hold(
            "pool_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("pool"),
            crate::device::DeviceClass::Node,
            nodes.len() as u32,
        );
        request.binding = Binding::Node;
        let identity: Identity = "alice@acme".parse().expect("identity");
        let id = ReservationId::derive(&"root".parse().expect("tenant"), &identity, "k");
        let mut r = Reservation::recorded(&id, &"root".parse().expect("tenant"), &identity, &request, "h", 0);
        r.state = state;
        r.allocations = nodes
            .iter()
            .map(|node| Allocation {
                allocation_id: AllocationId::generate(),
                node_id: (*node).clone(),
                devices: vec![DeviceId::whole_node(node)],
                resources: Default::default(),
            })
            .collect();
        r
    }

    fn machine(node_id: &NodeId, state: ProvisionState) -> MachineFacts {
        MachineFacts { node_id: node_id.clone(), provision_state: state, running: None, deploy: None, release: None }
    }

    #[test]
    fn a_binding_deploys_each_ready_machine_and_is_active_once_every_deployment_succeeded() {
        let (a, b) = (NodeId::generate(), NodeId::generate());
        let r = reservation(ReservationState::Binding, &[&a, &b]);
        // `b` is still being wiped after its previous tenant: it waits.
        let wiping = MachineFacts {
            running: Some(RunningWorkflow { workflow_id: "wf_x".into(), mine: false }),
            ..machine(&b, ProvisionState::Releasing)
        };
        let step = hand_over(&r, &[machine(&a, ProvisionState::Ready), wiping], 5);
        assert_eq!(step, HandOverStep { actions: vec![MachineAction::Deploy(a.clone())], command: None });

        let deploying = MachineFacts { deploy: Some(None), ..machine(&a, ProvisionState::Deploying) };
        let deployed = MachineFacts { deploy: Some(Some(Outcome::Succeeded)), ..machine(&b, ProvisionState::Deployed) };
        assert_eq!(hand_over(&r, &[deploying, deployed.clone()], 5), HandOverStep::default());
        let both = MachineFacts { node_id: a.clone(), ..deployed.clone() };
        assert_eq!(hand_over(&r, &[both, deployed.clone()], 5).command, Some(Command::Activate { now_ms: 5 }));

        let failed = MachineFacts { deploy: Some(Some(Outcome::Failed)), ..machine(&a, ProvisionState::Failed) };
        let fail = Some(Command::Fail { reason: FailureReason::BindingFailed, now_ms: 5 });
        assert_eq!(hand_over(&r, &[failed, deployed.clone()], 5).command, fail);
        assert_eq!(hand_over(&r, &[deployed], 5).command, fail, "a machine that is gone fails it");
    }

    #[test]
    fn a_release_wipes_each_machine_and_completes_once_every_wipe_ended() {
        let (a, b) = (NodeId::generate(), NodeId::generate());
        let r = reservation(ReservationState::Releasing, &[&a, &b]);
        // `a` is still being deployed for it: the deployment is cancelled first.
        let deploying = MachineFacts {
            running: Some(RunningWorkflow { workflow_id: "wf_a".into(), mine: true }),
            deploy: Some(None),
            ..machine(&a, ProvisionState::Deploying)
        };
        let step = hand_over(&r, &[deploying, machine(&b, ProvisionState::Deployed)], 9);
        assert_eq!(
            step.actions,
            vec![
                MachineAction::Cancel { node_id: a.clone(), workflow_id: "wf_a".into() },
                MachineAction::Release(a.clone()),
                MachineAction::Release(b.clone()),
            ]
        );
        assert_eq!(step.command, None);

        let wiped = |node: &NodeId, outcome| MachineFacts {
            release: Some(Some(outcome)),
            ..machine(node, ProvisionState::Ready)
        };
        let done = hand_over(&r, &[wiped(&a, Outcome::Succeeded), wiped(&b, Outcome::Succeeded)], 9);
        assert_eq!(done.command, Some(Command::CompleteRelease { now_ms: 9, unconfirmed: false }));
        let one_failed = hand_over(&r, &[wiped(&a, Outcome::Succeeded), wiped(&b, Outcome::Failed)], 9);
        assert_eq!(one_failed.command, Some(Command::CompleteRelease { now_ms: 9, unconfirmed: true }));
        // Never deployed (the binding failed before it began): nothing to wipe.
        let idle = hand_over(&r, &[machine(&a, ProvisionState::Ready), wiped(&b, Outcome::Succeeded)], 9);
        assert_eq!(idle.command, Some(Command::CompleteRelease { now_ms: 9, unconfirmed: false }));
    }
}
