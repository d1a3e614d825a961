//! Workflows: a profile (or a built-in plan) expanded for one machine into persisted steps, run one at a time.
//! Each step runs in one place (the control plane, the site agent, the node's agent or the ramdisk), has a time
//! limit per attempt and a number of attempts, and its starts and ends are events: a workflow survives any
//! crash, since whoever drives it next reads where it is from its stream. A workflow drives its machine's
//! lifecycle: an inspection from `inspecting` to `ready`, a deployment from `deploying` to `deployed`, a release
//! from `releasing` to `ready`; a failed or cancelled one leaves the machine `failed`.

use serde::{Deserialize, Serialize};

use crate::Rejection;
use crate::domain_events;
use crate::id::{NodeId, ProfileId, ReservationId, TenantId, WorkflowId};
use crate::node::ProvisionState;
use crate::profile::{Await, RunsOn, StepAction, StepSpec};

/// What a workflow does to its machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkflowKind {
    Inspect,
    Deploy,
    Release,
}

impl WorkflowKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkflowKind::Inspect => "inspect",
            WorkflowKind::Deploy => "deploy",
            WorkflowKind::Release => "release",
        }
    }

    /// The states a machine may be in for this workflow to start, and the state it runs in.
    pub fn lifecycle(self) -> (&'static [ProvisionState], ProvisionState) {
        use ProvisionState::*;
        match self {
            WorkflowKind::Inspect => (&[Enrolling, Failed], Inspecting),
            WorkflowKind::Deploy => (&[Ready], Deploying),
            WorkflowKind::Release => (&[Deployed, Failed, Rescue], Releasing),
        }
    }

    /// Where the machine goes once the workflow succeeded (in order).
    pub fn on_success(self) -> &'static [ProvisionState] {
        use ProvisionState::*;
        match self {
            WorkflowKind::Inspect => &[Commissioning, Ready],
            WorkflowKind::Deploy => &[Deployed],
            WorkflowKind::Release => &[Ready],
        }
    }

    /// The built-in steps of a workflow whose profile gives none.
    pub fn default_steps(self) -> Vec<StepSpec> {
        use StepAction::*;
        let step = |name: &str, action: StepAction, timeout_s: u32, attempts: u32, wait_for: Option<Await>| StepSpec {
            name: name.to_owned(),
            action,
            runs_on: action.runs_on(),
            timeout_s,
            attempts,
            wait_for,
        };
        match self {
            WorkflowKind::Inspect => vec![
                step("boot-from-network", BootFromNetwork, 120, 3, None),
                step("power-reset", PowerReset, 120, 3, None),
                step("inspect", Inspect, 900, 1, None),
                step("power-off", PowerOff, 120, 3, None),
            ],
            WorkflowKind::Deploy => vec![
                step("boot-from-network", BootFromNetwork, 120, 3, None),
                step("power-reset", PowerReset, 120, 3, None),
                step("write-image", WriteImage, 1800, 1, None),
                step("write-config", WriteConfig, 300, 2, None),
                step("boot-from-disk", BootFromDisk, 120, 3, None),
                step("reboot", PowerReset, 120, 3, Some(Await::Rejoin)),
                step("await-join", AwaitJoin, 900, 1, None),
            ],
            WorkflowKind::Release => vec![
                step("boot-from-network", BootFromNetwork, 120, 3, None),
                step("power-reset", PowerReset, 120, 3, None),
                step("wipe-disks", WipeDisks, 3600, 1, None),
                step("power-off", PowerOff, 120, 3, None),
            ],
        }
    }
}

/// A workflow as created: its machine, what it does and its steps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowCreated {
    pub workflow_id: WorkflowId,
    /// The tenant that owns the machine's pool.
    pub tenant_id: TenantId,
    pub node_id: NodeId,
    pub kind: WorkflowKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_id: Option<ProfileId>,
    /// The `binding: node` reservation the workflow deploys or wipes the machine for, when one started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<ReservationId>,
    pub steps: Vec<StepSpec>,
    pub at_ms: i64,
}

/// An attempt of a step began.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepStarted {
    pub workflow_id: WorkflowId,
    pub index: u32,
    pub attempt: u32,
    /// When the attempt runs out of time.
    pub deadline_ms: i64,
    pub at_ms: i64,
}

/// An attempt of a step ended well.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepSucceeded {
    pub workflow_id: WorkflowId,
    pub index: u32,
    pub attempt: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    pub at_ms: i64,
}

/// An attempt of a step failed (its executor said so, or it ran out of time).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepFailed {
    pub workflow_id: WorkflowId,
    pub index: u32,
    pub attempt: u32,
    pub error: String,
    pub at_ms: i64,
}

/// The workflow ended: every step succeeded, or one failed for good, or it was cancelled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowEnded {
    pub workflow_id: WorkflowId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub at_ms: i64,
}

domain_events! {
    /// Events of a workflow's stream.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub enum WorkflowEvent {
        Created(WorkflowCreated) = "workflow.created",
        StepStarted(StepStarted) = "workflow.step_started",
        StepSucceeded(StepSucceeded) = "workflow.step_succeeded",
        StepFailed(StepFailed) = "workflow.step_failed",
        Succeeded(WorkflowEnded) = "workflow.succeeded",
        Failed(WorkflowEnded) = "workflow.failed",
        Cancelled(WorkflowEnded) = "workflow.cancelled",
    }
}

/// Where one step is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "state")]
pub enum StepState {
    Pending,
    #[serde(rename_all = "camelCase")]
    Running {
        attempt: u32,
        started_at_ms: i64,
        deadline_ms: i64,
    },
    #[serde(rename_all = "camelCase")]
    Succeeded {
        attempt: u32,
        /// When the attempt that succeeded started.
        #[serde(default)]
        started_at_ms: i64,
        at_ms: i64,
        detail: Option<String>,
    },
    /// The last attempt failed (more attempts may follow).
    #[serde(rename_all = "camelCase")]
    Failed {
        attempt: u32,
        at_ms: i64,
        error: String,
    },
}

/// How a workflow ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Succeeded,
    Failed,
    Cancelled,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
        }
    }
}

/// A workflow as its events left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Workflow {
    #[serde(flatten)]
    pub created: WorkflowCreated,
    pub states: Vec<StepState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at_ms: Option<i64>,
}

pub fn evolve_workflow(state: Option<Workflow>, event: &WorkflowEvent) -> Option<Workflow> {
    let mut wf = match (state, event) {
        (None, WorkflowEvent::Created(e)) => {
            return Some(Workflow {
                states: vec![StepState::Pending; e.steps.len()],
                created: e.clone(),
                outcome: None,
                reason: None,
                ended_at_ms: None,
            });
        }
        (None, _) => return None,
        (Some(wf), _) => wf,
    };
    let started_at = |index: u32| match wf.states.get(index as usize) {
        Some(StepState::Running { started_at_ms, .. }) => *started_at_ms,
        _ => 0,
    };
    let started_at_ms = match event {
        WorkflowEvent::StepSucceeded(e) => started_at(e.index),
        _ => 0,
    };
    let mut set = |index: u32, state: StepState| {
        if let Some(slot) = wf.states.get_mut(index as usize) {
            *slot = state;
        }
    };
    match event {
        WorkflowEvent::Created(_) => {}
        WorkflowEvent::StepStarted(e) => {
            set(e.index, StepState::Running { attempt: e.attempt, started_at_ms: e.at_ms, deadline_ms: e.deadline_ms })
        }
        WorkflowEvent::StepSucceeded(e) => set(
            e.index,
            StepState::Succeeded { attempt: e.attempt, started_at_ms, at_ms: e.at_ms, detail: e.detail.clone() },
        ),
        WorkflowEvent::StepFailed(e) => {
            set(e.index, StepState::Failed { attempt: e.attempt, at_ms: e.at_ms, error: e.error.clone() })
        }
        WorkflowEvent::Succeeded(e) | WorkflowEvent::Failed(e) | WorkflowEvent::Cancelled(e) => {
            wf.outcome = Some(match event {
                WorkflowEvent::Succeeded(_) => Outcome::Succeeded,
                WorkflowEvent::Failed(_) => Outcome::Failed,
                _ => Outcome::Cancelled,
            });
            wf.reason = e.reason.clone();
            wf.ended_at_ms = Some(e.at_ms);
        }
    }
    Some(wf)
}

/// What the driver of a workflow knows besides the workflow: facts the control plane's own steps wait on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Facts {
    /// The machine's agent joined (or rejoined) since [`Workflow::joins_count_from`] the current step.
    pub joined_since_step: bool,
}

/// When the driver should look at the workflow again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextLook {
    Never,
    Now,
    At(i64),
}

impl Workflow {
    /// The step to run or running: the first one that has not succeeded.
    pub fn current(&self) -> Option<(u32, &StepSpec, &StepState)> {
        self.states
            .iter()
            .enumerate()
            .find(|(_, s)| !matches!(s, StepState::Succeeded { .. }))
            .map(|(i, s)| (i as u32, &self.created.steps[i], s))
    }

    /// From when a join of the machine's agent counts for the control-plane step `index`: the start of the
    /// latest step before it that ends the agent's boot (`await: rejoin`; the agent may be back before that
    /// step's report), else the start of `index` itself.
    pub fn joins_count_from(&self, index: u32) -> Option<i64> {
        let rejoin = self.created.steps[..(index as usize).min(self.states.len())]
            .iter()
            .rposition(|step| step.wait_for == Some(Await::Rejoin));
        match rejoin.map(|i| &self.states[i]).unwrap_or(self.states.get(index as usize)?) {
            StepState::Running { started_at_ms, .. } | StepState::Succeeded { started_at_ms, .. } => {
                Some(*started_at_ms)
            }
            _ => None,
        }
    }

    /// Steps that succeeded.
    pub fn done(&self) -> usize {
        self.states.iter().filter(|s| matches!(s, StepState::Succeeded { .. })).count()
    }
}

/// Moves a workflow on as far as it can go now: starts the next step (or its next attempt), fails one that ran
/// out of time, finishes a control-plane step whose condition holds, and ends the workflow when every step
/// succeeded or one failed for good. Pure: the same workflow, time and facts always give the same events.
pub fn advance(wf: &Workflow, now_ms: i64, facts: Facts) -> (Vec<WorkflowEvent>, NextLook) {
    let mut events = Vec::new();
    let mut current = wf.clone();
    let id = wf.created.workflow_id.clone();
    for _ in 0..(2 * wf.states.len() + 4) {
        if current.outcome.is_some() {
            return (events, NextLook::Never);
        }
        let next = match current.current() {
            None => WorkflowEvent::Succeeded(WorkflowEnded { workflow_id: id.clone(), reason: None, at_ms: now_ms }),
            Some((index, step, state)) => match state {
                StepState::Pending => start(&id, index, step, 1, now_ms),
                StepState::Failed { attempt, .. } if *attempt < step.attempts => {
                    start(&id, index, step, attempt + 1, now_ms)
                }
                StepState::Failed { attempt, error, .. } => WorkflowEvent::Failed(WorkflowEnded {
                    workflow_id: id.clone(),
                    reason: Some(format!(
                        "step {} ({}) failed after {attempt} attempt(s): {error}",
                        step.name,
                        action_name(step.action)
                    )),
                    at_ms: now_ms,
                }),
                StepState::Running { attempt, deadline_ms, .. } => {
                    if step.action == StepAction::AwaitJoin && facts.joined_since_step {
                        WorkflowEvent::StepSucceeded(StepSucceeded {
                            workflow_id: id.clone(),
                            index,
                            attempt: *attempt,
                            detail: Some("the machine's agent joined".into()),
                            at_ms: now_ms,
                        })
                    } else if now_ms >= *deadline_ms {
                        WorkflowEvent::StepFailed(StepFailed {
                            workflow_id: id.clone(),
                            index,
                            attempt: *attempt,
                            error: format!("no result within {} s", step.timeout_s),
                            at_ms: now_ms,
                        })
                    } else {
                        return (events, NextLook::At(*deadline_ms));
                    }
                }
                // `current` never answers a step that succeeded.
                StepState::Succeeded { .. } => return (events, NextLook::Now),
            },
        };
        current = evolve_workflow(Some(current), &next).unwrap_or_else(|| wf.clone());
        events.push(next);
    }
    (events, NextLook::Now)
}

fn start(id: &WorkflowId, index: u32, step: &StepSpec, attempt: u32, now_ms: i64) -> WorkflowEvent {
    WorkflowEvent::StepStarted(StepStarted {
        workflow_id: id.clone(),
        index,
        attempt,
        deadline_ms: now_ms + i64::from(step.timeout_s) * 1000,
        at_ms: now_ms,
    })
}

/// An action's name as the API spells it.
pub fn action_name(action: StepAction) -> String {
    serde_json::to_value(action).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

/// What an executor says of a step it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    Succeeded { detail: Option<String> },
    Failed { error: String },
}

/// The longest detail or error a report carries.
pub const MAX_REPORT_CHARS: usize = 2048;

/// An executor's report on attempt `attempt` of step `index`, running in `place`. The same report again is
/// answered with no event (it was recorded); a report on a step that is not running that attempt, or that
/// runs elsewhere, is refused naming where the step is.
pub fn report(
    wf: &Workflow,
    index: u32,
    attempt: u32,
    place: RunsOn,
    report: Report,
    now_ms: i64,
) -> Result<Vec<WorkflowEvent>, Rejection> {
    let text = match &report {
        Report::Succeeded { detail } => detail.as_deref().unwrap_or(""),
        Report::Failed { error } => error.as_str(),
    };
    if text.chars().count() > MAX_REPORT_CHARS || text.contains('\0') {
        return Err(Rejection::invalid("detail", format!("at most {MAX_REPORT_CHARS} characters, no NUL")));
    }
    let id = &wf.created.workflow_id;
    let Some(step) = wf.created.steps.get(index as usize) else {
        return Err(Rejection::NotFound { kind: "workflow step", id: format!("{id}/{index}") });
    };
    if step.runs_on != place {
        return Err(Rejection::Forbidden(format!(
            "step {index} ({}) of workflow {id} runs on {}, not {}",
            step.name,
            step.runs_on.as_str(),
            place.as_str()
        )));
    }
    let state = &wf.states[index as usize];
    let same_again = match (state, &report) {
        (StepState::Succeeded { attempt: a, detail, .. }, Report::Succeeded { detail: d }) => {
            *a == attempt && detail == d
        }
        (StepState::Failed { attempt: a, error, .. }, Report::Failed { error: e }) => *a == attempt && error == e,
        _ => false,
    };
    if same_again {
        return Ok(Vec::new());
    }
    if let Some(outcome) = wf.outcome {
        return Err(Rejection::Conflict(format!("workflow {id} has ended ({})", outcome.as_str())));
    }
    match state {
        StepState::Running { attempt: running, .. } if *running == attempt => {}
        other => {
            let where_ = match other {
                StepState::Pending => "has not started".to_owned(),
                StepState::Running { attempt: a, .. } => format!("is running attempt {a}"),
                StepState::Succeeded { attempt: a, .. } => format!("succeeded on attempt {a}"),
                StepState::Failed { attempt: a, .. } => format!("failed on attempt {a}"),
            };
            return Err(Rejection::Conflict(format!(
                "step {index} ({}) of workflow {id} {where_}: a report on attempt {attempt} is refused",
                step.name
            )));
        }
    }
    Ok(vec![match report {
        Report::Succeeded { detail } => WorkflowEvent::StepSucceeded(StepSucceeded {
            workflow_id: id.clone(),
            index,
            attempt,
            detail,
            at_ms: now_ms,
        }),
        Report::Failed { error } => {
            WorkflowEvent::StepFailed(StepFailed { workflow_id: id.clone(), index, attempt, error, at_ms: now_ms })
        }
    }])
}

/// Cancels a workflow that has not ended.
pub fn cancel(wf: &Workflow, reason: Option<String>, now_ms: i64) -> Result<Vec<WorkflowEvent>, Rejection> {
    let max = crate::node::lifecycle::MAX_REASON_CHARS;
    if reason.as_ref().is_some_and(|r| r.chars().count() > max || r.contains('\0')) {
        return Err(Rejection::invalid("reason", format!("at most {max} characters, no NUL")));
    }
    if let Some(outcome) = wf.outcome {
        return Err(Rejection::Conflict(format!(
            "workflow {} has ended ({}): there is nothing to cancel",
            wf.created.workflow_id,
            outcome.as_str()
        )));
    }
    Ok(vec![WorkflowEvent::Cancelled(WorkflowEnded {
        workflow_id: wf.created.workflow_id.clone(),
        reason: Some(reason.unwrap_or_else(|| "cancelled".to_owned())),
        at_ms: now_ms,
    })])
}

/// Whether a workflow of `kind` may start on the machine now: it was enrolled from a BMC, it is in a state the
/// workflow starts from, and no other workflow (`running`) runs on it.
pub fn may_start(node: &crate::node::Node, kind: WorkflowKind, running: Option<&str>) -> Result<(), Rejection> {
    let node_id = &node.id;
    if node.bmc.is_none() {
        return Err(Rejection::Conflict(format!("node {node_id} was not enrolled from a BMC: it has no workflows")));
    }
    let (from, _) = kind.lifecycle();
    if !from.contains(&node.provision_state) {
        let allowed: Vec<&str> = from.iter().map(|s| s.as_str()).collect();
        return Err(Rejection::Conflict(format!(
            "node {node_id} is {}: a {} workflow starts from {}",
            node.provision_state.as_str(),
            kind.as_str(),
            allowed.join(" or ")
        )));
    }
    if let Some(running) = running {
        return Err(Rejection::Conflict(format!("workflow {running} is running on node {node_id}")));
    }
    Ok(())
}

/// The events that begin a workflow [`may_start`] allowed: the machine's move into the state the workflow runs in,
/// and `workflow.created`. Refused when a step needs a driver the machine has none bound for.
pub fn begin(
    node: &crate::node::Node,
    created: WorkflowCreated,
) -> Result<(Vec<crate::node::NodeEvent>, WorkflowEvent), Rejection> {
    let node_id = &node.id;
    let bound = node.bmc.as_ref().map(|bmc| &bmc.drivers);
    for (n, step) in created.steps.iter().enumerate() {
        if let Some(concern) = step.action.concern()
            && !bound.is_some_and(|drivers| drivers.contains_key(&concern))
        {
            return Err(Rejection::Conflict(format!(
                "step {n} ({}) needs a driver for {}, and node {node_id} has none bound",
                step.name,
                concern.as_str()
            )));
        }
    }
    let (_, runs_in) = created.kind.lifecycle();
    let why = format!("{} workflow {}", created.kind.as_str(), created.workflow_id);
    let moved = crate::node::lifecycle::change_provision(node, runs_in, Some(why), created.at_ms)?;
    Ok((moved, WorkflowEvent::Created(created)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{
        Adapter, BmcDriver, Connectivity, Node, NodeBmc, NodeBmcSet, NodeEvent, NodeRegistered, Role, Trust,
    };

    /// A machine in `state`, enrolled from a Redfish BMC with its default drivers unless `bmc` is false.
    fn machine(state: ProvisionState, bmc: bool) -> Node {
        let node_id: NodeId = "node_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("node");
        let registered = NodeEvent::Registered(NodeRegistered {
            node_id: node_id.clone(),
            pool_id: "pool_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("pool"),
            site_id: "site_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("site"),
            name: "metal-1".into(),
            role: Role::Host,
            trust: Trust::Platform,
            owner_tenant_id: None,
            adapter: Adapter::BcdV1,
            provision_state: state,
            connectivity: Connectivity::Disconnected,
            generation: 1,
            observed_generation: 0,
            gpus: Vec::new(),
            devices: Vec::new(),
            conditions: Vec::new(),
            at_ms: 1,
        });
        let drivers = crate::node::lifecycle::default_drivers(BmcDriver::Redfish, &Default::default());
        let set = NodeEvent::BmcSet(NodeBmcSet {
            node_id,
            bmc: NodeBmc {
                driver: BmcDriver::Redfish,
                address: "https://10.0.0.9".into(),
                system_id: None,
                insecure_tls: false,
                drivers,
                boot_mac: None,
            },
            at_ms: 1,
        });
        let events = if bmc { vec![registered, set] } else { vec![registered] };
        events.iter().fold(None, crate::node::evolve).expect("a node")
    }

    #[test]
    fn a_workflow_starts_on_an_enrolled_machine_in_its_state_with_nothing_else_running() {
        let ready = machine(ProvisionState::Ready, true);
        assert_eq!(may_start(&ready, WorkflowKind::Deploy, None), Ok(()));
        let conflict = |result: Result<(), Rejection>, says: &str| match result {
            Err(Rejection::Conflict(message)) => assert!(message.contains(says), "{message}"),
            other => panic!("expected a conflict saying {says:?}, got {other:?}"),
        };
        conflict(may_start(&ready, WorkflowKind::Release, None), "is ready: a release workflow starts from deployed");
        conflict(may_start(&ready, WorkflowKind::Deploy, Some("wf_x")), "workflow wf_x is running");
        conflict(may_start(&machine(ProvisionState::Adopted, false), WorkflowKind::Inspect, None), "not enrolled");

        let created = workflow(WorkflowKind::Deploy).created;
        let (moved, event) = begin(&ready, WorkflowCreated { at_ms: 5, ..created.clone() }).expect("begins");
        assert!(
            matches!(moved.as_slice(), [NodeEvent::ProvisionChanged(e)] if e.to == ProvisionState::Deploying),
            "{moved:?}"
        );
        assert!(matches!(event, WorkflowEvent::Created(_)));
        let mut bare = ready.clone();
        if let Some(bmc) = bare.bmc.as_mut() {
            bmc.drivers.remove(&crate::profile::Concern::Deploy);
        }
        match begin(&bare, created) {
            Err(Rejection::Conflict(message)) => assert!(message.contains("needs a driver for deploy"), "{message}"),
            other => panic!("a step without its driver: {other:?}"),
        }
    }

    fn workflow(kind: WorkflowKind) -> Workflow {
        let created = WorkflowCreated {
            workflow_id: WorkflowId::generate(),
            tenant_id: "root".parse().expect("tenant"),
            node_id: NodeId::generate(),
            kind,
            profile_id: None,
            reservation_id: None,
            steps: kind.default_steps(),
            at_ms: 0,
        };
        evolve_workflow(None, &WorkflowEvent::Created(created)).expect("created")
    }

    fn apply(wf: Workflow, events: &[WorkflowEvent]) -> Workflow {
        events.iter().fold(Some(wf), evolve_workflow).expect("folded")
    }

    #[test]
    fn steps_run_in_order_and_the_workflow_succeeds_after_the_last() {
        let mut wf = workflow(WorkflowKind::Release);
        for index in 0..4u32 {
            let (events, next) = advance(&wf, 10, Facts::default());
            assert!(
                matches!(&events[..], [WorkflowEvent::StepStarted(s)] if s.index == index && s.attempt == 1),
                "{events:?}"
            );
            wf = apply(wf, &events);
            assert!(matches!(next, NextLook::At(_)));
            let place = wf.created.steps[index as usize].runs_on;
            let done = report(&wf, index, 1, place, Report::Succeeded { detail: None }, 20).expect("report");
            wf = apply(wf, &done);
        }
        let (events, next) = advance(&wf, 30, Facts::default());
        assert!(matches!(&events[..], [WorkflowEvent::Succeeded(_)]), "{events:?}");
        assert_eq!(next, NextLook::Never);
    }

    #[test]
    fn a_step_out_of_time_is_retried_until_its_attempts_run_out_and_then_the_workflow_fails() {
        let wf = workflow(WorkflowKind::Release);
        let (events, _) = advance(&wf, 0, Facts::default());
        let mut wf = apply(wf, &events);
        for attempt in 2..=3 {
            let (events, _) = advance(&wf, 1_000_000 * i64::from(attempt), Facts::default());
            assert!(
                matches!(&events[..], [WorkflowEvent::StepFailed(_), WorkflowEvent::StepStarted(s)] if s.attempt == attempt),
                "{events:?}"
            );
            wf = apply(wf, &events);
        }
        let (events, next) = advance(&wf, 10_000_000, Facts::default());
        assert!(
            matches!(&events[..], [WorkflowEvent::StepFailed(_), WorkflowEvent::Failed(e)] if e.reason.as_deref().is_some_and(|r| r.contains("after 3 attempt"))),
            "{events:?}"
        );
        assert_eq!(next, NextLook::Never);
    }

    #[test]
    fn reports_twice_elsewhere_or_on_the_wrong_attempt_are_answered_clearly() {
        let wf = workflow(WorkflowKind::Inspect);
        let (events, _) = advance(&wf, 0, Facts::default());
        let wf = apply(wf, &events);
        let ok = Report::Succeeded { detail: Some("pxe".into()) };
        let wrong_place = report(&wf, 0, 1, RunsOn::Ramdisk, ok.clone(), 1).expect_err("wrong place");
        assert!(matches!(wrong_place, Rejection::Forbidden(m) if m.contains("runs on site")));
        let wrong_attempt = report(&wf, 0, 2, RunsOn::Site, ok.clone(), 1).expect_err("wrong attempt");
        assert!(matches!(wrong_attempt, Rejection::Conflict(m) if m.contains("running attempt 1")));
        let not_started = report(&wf, 1, 1, RunsOn::Site, ok.clone(), 1).expect_err("not started");
        assert!(matches!(not_started, Rejection::Conflict(m) if m.contains("has not started")));
        let done = report(&wf, 0, 1, RunsOn::Site, ok.clone(), 1).expect("first");
        let wf = apply(wf, &done);
        assert_eq!(report(&wf, 0, 1, RunsOn::Site, ok, 2).expect("again"), Vec::new(), "the same report again");
        let other = report(&wf, 0, 1, RunsOn::Site, Report::Failed { error: "x".into() }, 2).expect_err("other");
        assert!(matches!(other, Rejection::Conflict(m) if m.contains("succeeded on attempt 1")));
    }

    #[test]
    fn await_join_succeeds_once_the_agent_joined_and_a_cancelled_workflow_takes_no_report() {
        let mut wf = workflow(WorkflowKind::Deploy);
        let last = wf.created.steps.len() as u32 - 1;
        for index in 0..last {
            let (events, _) = advance(&wf, i64::from(index) * 10, Facts::default());
            wf = apply(wf, &events);
            let place = wf.created.steps[index as usize].runs_on;
            let done = report(&wf, index, 1, place, Report::Succeeded { detail: None }, i64::from(index) * 10 + 5);
            wf = apply(wf.clone(), &done.expect("report"));
        }
        let (events, _) = advance(&wf, i64::from(last) * 10, Facts::default());
        wf = apply(wf, &events);
        // The reboot's start counts: the agent may be back before the reboot was reported.
        let reboot = wf.created.steps.iter().position(|s| s.wait_for == Some(Await::Rejoin)).expect("reboot");
        assert_eq!(last as usize, reboot + 1);
        let reboot_started = reboot as i64 * 10;
        assert!(
            matches!(wf.states[reboot], StepState::Succeeded { started_at_ms, .. } if started_at_ms == reboot_started)
        );
        assert_eq!(wf.joins_count_from(last), Some(reboot_started));
        let (waiting, next) = advance(&wf, 1, Facts::default());
        assert!(waiting.is_empty() && matches!(next, NextLook::At(_)));
        let (joined, _) = advance(&wf, 2, Facts { joined_since_step: true });
        assert!(matches!(&joined[..], [WorkflowEvent::StepSucceeded(_), WorkflowEvent::Succeeded(_)]), "{joined:?}");

        let wf = workflow(WorkflowKind::Inspect);
        let (events, _) = advance(&wf, 0, Facts::default());
        let wf = apply(wf, &events);
        let long = Some("x".repeat(513));
        assert!(matches!(cancel(&wf, long, 1), Err(Rejection::InvalidArgument { field, .. }) if field == "reason"));
        let wf = apply(wf.clone(), &cancel(&wf, None, 1).expect("cancel"));
        assert!(matches!(cancel(&wf, None, 2), Err(Rejection::Conflict(_))));
        let late = report(&wf, 0, 1, RunsOn::Site, Report::Succeeded { detail: None }, 3).expect_err("late");
        assert!(matches!(late, Rejection::Conflict(m) if m.contains("cancelled")));
        assert_eq!(advance(&wf, 4, Facts::default()), (Vec::new(), NextLook::Never));
    }
}
