//! Workflows on the wire.

use bc_domain::workflow::{StepState, Workflow, action_name};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The body of `POST /v1/nodes/{id}/workflows`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkflowBody {
    /// `inspect` (from `enrolling` or `failed`), `deploy` (from `ready`, with `profileId`) or `release` (from
    /// `deployed`, `failed` or `rescue`).
    #[schema(value_type = String)]
    pub kind: bc_domain::workflow::WorkflowKind,
    /// The profile a deployment runs.
    #[serde(default)]
    pub profile_id: Option<String>,
}

/// The body of `POST /v1/workflows/{id}/cancel`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CancelWorkflowBody {
    #[serde(default)]
    pub reason: Option<String>,
}

/// One step of a workflow, and where it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowStepDto {
    pub index: u32,
    pub name: String,
    pub action: String,
    /// `control-plane`, `site`, `node` or `ramdisk`.
    pub runs_on: String,
    pub timeout_s: u32,
    pub attempts: u32,
    /// `pending`, `running`, `succeeded` or `failed` (the last attempt; more may follow).
    pub state: String,
    /// The attempt running or last run (0: none yet).
    pub attempt: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<i64>,
    /// When the running attempt runs out of time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<i64>,
    /// What the executor said, or the error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// `rejoin`: the step ends the agent's boot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_for: Option<String>,
}

/// How far a workflow is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProgressDto {
    pub done: u32,
    pub total: u32,
}

/// A workflow: a profile (or a built-in plan) expanded for one machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowDto {
    pub id: String,
    pub tenant_id: String,
    pub node_id: String,
    /// `inspect`, `deploy` or `release`.
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile_id: Option<String>,
    /// The `binding: node` reservation that deploys or wipes the machine with this workflow.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<String>,
    /// `running`, `succeeded`, `failed` or `cancelled`.
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub progress: ProgressDto,
    pub steps: Vec<WorkflowStepDto>,
    pub created_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<i64>,
}

/// A machine's workflows, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowList {
    pub items: Vec<WorkflowDto>,
}

impl From<&Workflow> for WorkflowDto {
    fn from(wf: &Workflow) -> Self {
        let c = &wf.created;
        let steps = c
            .steps
            .iter()
            .zip(&wf.states)
            .enumerate()
            .map(|(index, (spec, state))| {
                let (name, attempt, started, deadline, ended, detail) = match state {
                    StepState::Pending => ("pending", 0, None, None, None, None),
                    StepState::Running { attempt, started_at_ms, deadline_ms } => {
                        ("running", *attempt, Some(*started_at_ms), Some(*deadline_ms), None, None)
                    }
                    StepState::Succeeded { attempt, at_ms, detail, .. } => {
                        ("succeeded", *attempt, None, None, Some(*at_ms), detail.clone())
                    }
                    StepState::Failed { attempt, at_ms, error } => {
                        ("failed", *attempt, None, None, Some(*at_ms), Some(error.clone()))
                    }
                };
                WorkflowStepDto {
                    index: index as u32,
                    name: spec.name.clone(),
                    action: action_name(spec.action),
                    runs_on: spec.runs_on.as_str().to_owned(),
                    timeout_s: spec.timeout_s,
                    attempts: spec.attempts,
                    state: name.to_owned(),
                    attempt,
                    started_at: started,
                    deadline,
                    ended_at: ended,
                    detail,
                    wait_for: spec.wait_for.map(|_| "rejoin".to_owned()),
                }
            })
            .collect();
        WorkflowDto {
            id: c.workflow_id.to_string(),
            tenant_id: c.tenant_id.to_string(),
            node_id: c.node_id.to_string(),
            kind: c.kind.as_str().to_owned(),
            profile_id: c.profile_id.as_ref().map(ToString::to_string),
            reservation_id: c.reservation_id.as_ref().map(ToString::to_string),
            state: wf.outcome.map_or("running", |o| o.as_str()).to_owned(),
            reason: wf.reason.clone(),
            progress: ProgressDto { done: wf.done() as u32, total: c.steps.len() as u32 },
            steps,
            created_at: c.at_ms,
            ended_at: wf.ended_at_ms,
        }
    }
}
