//! Workflows: started on an enrolled machine (an inspection, a deployment of a profile, a release), driven by
//! the worker through the work queue (`wf:<id>`), their steps reported by whoever runs them, cancelled by
//! operators. A workflow's end moves its machine's lifecycle, in the same transaction.

use bc_domain::Rejection;
use bc_domain::event::DomainEvent as _;
use bc_domain::id::{NodeId, ProfileId, ReservationId, TenantId, WorkflowId};
use bc_domain::node::lifecycle;
use bc_domain::node::{NodeEvent, ProvisionState};
use bc_domain::profile::RunsOn;
use bc_domain::workflow::{self, Facts, NextLook, Outcome, Report, Workflow, WorkflowCreated, WorkflowKind};
use bc_eventstore::events::{self, ExpectedVersion};
use bc_eventstore::lease::Lease;
use bc_eventstore::queue::{self, WorkItem};
use bc_eventstore::{ScopedFutureExt as _, Tx, TxOptions, clock};

use crate::fleet::owned_pool;
use crate::lifecycle::record_moves;
use crate::store;
use crate::work::{self, WorkKey, fenced};
use crate::{App, AppResult, Caller, Committed, record};

/// Whether the machine's agent joined or rejoined at or after `since_ms`.
async fn joined_since(tx: &mut Tx, node: &NodeId, since_ms: i64) -> AppResult<bool> {
    let recorded = events::read_stream(tx, node.as_str(), 0, 10_000).await?;
    for event in recorded.iter().rev() {
        if !matches!(event.event_type.as_str(), "node.joined" | "node.rejoined") {
            continue;
        }
        let decoded = NodeEvent::decode(&event.event_type, event.schema_version, &event.payload)?;
        let at = match &decoded {
            NodeEvent::Joined(e) => e.at_ms,
            NodeEvent::Rejoined(e) => e.at_ms,
            _ => continue,
        };
        if at >= since_ms {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The lifecycle moves that follow a workflow's end: where its machine goes.
fn lifecycle_after(
    node: &bc_domain::node::Node,
    kind: WorkflowKind,
    outcome: Outcome,
    reason: Option<&str>,
    now_ms: i64,
) -> AppResult<Vec<NodeEvent>> {
    let targets: Vec<ProvisionState> = match outcome {
        Outcome::Succeeded => kind.on_success().to_vec(),
        Outcome::Failed | Outcome::Cancelled => vec![ProvisionState::Failed],
    };
    let mut events = Vec::new();
    let mut current = node.clone();
    for to in targets {
        if current.provision_state == to || !current.provision_state.may_go_to(to) {
            continue;
        }
        let why = match outcome {
            Outcome::Succeeded => format!("{} workflow succeeded", kind.as_str()),
            _ => format!("{} workflow {}: {}", kind.as_str(), outcome.as_str(), reason.unwrap_or("")),
        };
        let moved = lifecycle::change_provision(&current, to, Some(why), now_ms)?;
        current = moved.iter().fold(Some(current), bc_domain::node::evolve).unwrap_or_else(|| node.clone());
        events.extend(moved);
    }
    Ok(events)
}

/// What a workflow about to start runs, and the reservation that starts it, if one does.
pub(crate) struct NewWorkflow {
    pub kind: WorkflowKind,
    /// The profile a deployment runs, and the tenant whose profile it must be; `None`: the built-in steps.
    pub profile: Option<(ProfileId, TenantId)>,
    pub reservation_id: Option<ReservationId>,
}

/// Starts a workflow on an enrolled machine, in the caller's transaction: the domain decides whether the machine
/// may run it (`workflow::may_start`: its lifecycle state, no other workflow running; then the profile; then
/// `workflow::begin`: a driver bound for every step that needs one, and the machine's move into the state the
/// workflow runs in); the workflow is recorded on a stream of `owner` (the pool's owner) and the worker drives it.
pub(crate) async fn begin_workflow(
    tx: &mut Tx,
    caller: &Caller,
    node: &bc_domain::node::Node,
    owner: &TenantId,
    workflow_id: &WorkflowId,
    new: NewWorkflow,
) -> AppResult<Option<bc_eventstore::Position>> {
    let kind = new.kind;
    let running = store::workflows::running_on(tx, node.id.as_str()).await?;
    workflow::may_start(node, kind, running.as_deref())?;
    let steps = match &new.profile {
        Some((profile_id, tenant)) => crate::profiles::deploy_steps(tx, profile_id, tenant, kind).await?,
        None => kind.default_steps(),
    };
    let now_ms = clock::compute_now_ms(tx).await?;
    let (moved, created) = workflow::begin(
        node,
        WorkflowCreated {
            workflow_id: workflow_id.clone(),
            tenant_id: owner.clone(),
            node_id: node.id.clone(),
            kind,
            profile_id: new.profile.map(|(profile_id, _)| profile_id),
            reservation_id: new.reservation_id,
            steps,
            at_ms: now_ms,
        },
    )?;
    record_moves(tx, caller, node, owner, moved).await?;
    let position = record(tx, caller, workflow_id.as_str(), owner, ExpectedVersion::NO_STREAM, vec![created]).await?;
    work::wake_now(tx, &WorkKey::Workflow(workflow_id.clone())).await?;
    Ok(position)
}

/// Cancels a running workflow in the caller's transaction, moving its machine to `failed` (what the workflow did so
/// far is unknown). `None` when it had already ended.
pub(crate) async fn end_workflow(
    tx: &mut Tx,
    caller: &Caller,
    workflow_id: &WorkflowId,
    reason: Option<String>,
) -> AppResult<Option<bc_eventstore::Position>> {
    let not_found = || Rejection::NotFound { kind: "workflow", id: workflow_id.to_string() };
    let Some((wf, version)) = store::workflow_aggregate(tx, workflow_id).await? else {
        return Err(not_found().into());
    };
    if wf.outcome.is_some() {
        return Ok(None);
    }
    let Some((node, _)) = store::node_aggregate(tx, &wf.created.node_id).await? else {
        return Err(not_found().into());
    };
    let now_ms = clock::compute_now_ms(tx).await?;
    let events = workflow::cancel(&wf, reason, now_ms)?;
    let ended = events.iter().fold(Some(wf.clone()), workflow::evolve_workflow).unwrap_or(wf.clone());
    let tenant = wf.created.tenant_id.clone();
    let position = record(tx, caller, workflow_id.as_str(), &tenant, ExpectedVersion::Exact(version), events).await?;
    let moves = lifecycle_after(&node, wf.created.kind, Outcome::Cancelled, ended.reason.as_deref(), now_ms)?;
    record_moves(tx, caller, &node, &tenant, moves).await?;
    wake_reservation(tx, &wf).await?;
    Ok(position)
}

/// Wakes the reservation that started a workflow, so its hand-over sees the workflow's end.
async fn wake_reservation(tx: &mut Tx, wf: &Workflow) -> AppResult<()> {
    if let Some(reservation) = &wf.created.reservation_id {
        work::wake_now(tx, &WorkKey::Reservation(reservation.clone())).await?;
    }
    Ok(())
}

impl App {
    /// Starts a workflow of `kind` on an enrolled machine of a pool the caller's tenant owns (see
    /// [`begin_workflow`]). A deployment runs the steps of `profile` (its built-in steps when the profile
    /// gives none); an inspection and a release run built-in steps.
    pub async fn start_workflow(
        &self,
        caller: &Caller,
        node_id: &NodeId,
        kind: WorkflowKind,
        profile_id: Option<&ProfileId>,
    ) -> AppResult<Committed<WorkflowId>> {
        match (kind, profile_id) {
            (WorkflowKind::Deploy, None) => {
                return Err(Rejection::invalid("profileId", "a deployment names the profile it deploys").into());
            }
            (WorkflowKind::Inspect | WorkflowKind::Release, Some(_)) => {
                return Err(Rejection::invalid("profileId", "only a deployment runs a profile").into());
            }
            _ => {}
        }
        let workflow_id = WorkflowId::generate();
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let workflow_id = &workflow_id;
                async move {
                    let not_found = || Rejection::NotFound { kind: "node", id: node_id.to_string() };
                    let Some((node, _)) = store::node_aggregate(tx, node_id).await? else {
                        return Err(not_found().into());
                    };
                    if node.deleted_at_ms.is_some() {
                        return Err(not_found().into());
                    }
                    let pool = owned_pool(tx, caller, &node.pool_id).await.map_err(|_| not_found())?;
                    let profile = profile_id.map(|id| (id.clone(), pool.owner_tenant_id.clone()));
                    let new = NewWorkflow { kind, profile, reservation_id: None };
                    let position = begin_workflow(tx, caller, &node, &pool.owner_tenant_id, workflow_id, new).await?;
                    Ok(Committed { value: workflow_id.clone(), position })
                }
                .scope_boxed()
            })
            .await
            .map_err(|err: crate::AppError| {
                err.on_unique_violation(|| format!("another workflow started on node {node_id} at the same moment"))
            })
    }

    /// Records an executor's report on a step, and has the worker move the workflow on.
    pub async fn report_step(
        &self,
        caller: &Caller,
        workflow_id: &WorkflowId,
        index: u32,
        attempt: u32,
        place: RunsOn,
        report: Report,
    ) -> AppResult<Committed<()>> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let report = report.clone();
                async move {
                    let Some((wf, version)) = store::workflow_aggregate(tx, workflow_id).await? else {
                        return Err(Rejection::NotFound { kind: "workflow", id: workflow_id.to_string() }.into());
                    };
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = workflow::report(&wf, index, attempt, place, report, now_ms)?;
                    if events.is_empty() {
                        return Ok(Committed { value: (), position: None });
                    }
                    let stream = workflow_id.as_str();
                    let tenant = &wf.created.tenant_id;
                    let position = record(tx, caller, stream, tenant, ExpectedVersion::Exact(version), events).await?;
                    work::wake_now(tx, &WorkKey::Workflow(workflow_id.clone())).await?;
                    Ok(Committed { value: (), position })
                }
                .scope_boxed()
            })
            .await
    }

    /// Cancels a workflow on a machine of a pool the caller's tenant owns; the machine goes to `failed`, since
    /// what the workflow did so far is unknown.
    pub async fn cancel_workflow(
        &self,
        caller: &Caller,
        workflow_id: &WorkflowId,
        reason: Option<String>,
    ) -> AppResult<Committed<()>> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let reason = reason.clone();
                async move {
                    let not_found = || Rejection::NotFound { kind: "workflow", id: workflow_id.to_string() };
                    let Some((wf, _)) = store::workflow_aggregate(tx, workflow_id).await? else {
                        return Err(not_found().into());
                    };
                    let Some((node, _)) = store::node_aggregate(tx, &wf.created.node_id).await? else {
                        return Err(not_found().into());
                    };
                    owned_pool(tx, caller, &node.pool_id).await.map_err(|_| not_found())?;
                    if wf.outcome.is_some() {
                        // The domain names the state it refuses from.
                        let now_ms = clock::compute_now_ms(tx).await?;
                        workflow::cancel(&wf, reason.clone(), now_ms)?;
                    }
                    let position = end_workflow(tx, caller, workflow_id, reason).await?;
                    Ok(Committed { value: (), position })
                }
                .scope_boxed()
            })
            .await
    }

    /// The worker's item of one workflow: moves it on as far as it goes now, ends its machine's state with it,
    /// and schedules the next look.
    pub(crate) async fn run_workflow_item(
        &self,
        caller: &Caller,
        item: &WorkItem,
        workflow_id: &WorkflowId,
        fence: Option<&Lease>,
    ) -> AppResult<()> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                async move {
                    fenced(tx, fence).await?;
                    let Some((wf, version)) = store::workflow_aggregate(tx, workflow_id).await? else {
                        queue::complete(tx, item).await?;
                        return Ok(());
                    };
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let joined_since_step = match wf.current() {
                        // Pending too: the agent may have joined before the step starts (after the reboot).
                        Some((index, step, _)) if step.action == bc_domain::profile::StepAction::AwaitJoin => {
                            match wf.joins_count_from(index) {
                                Some(since) => joined_since(tx, &wf.created.node_id, since).await?,
                                None => false,
                            }
                        }
                        _ => false,
                    };
                    let (events, next) = workflow::advance(&wf, now_ms, Facts { joined_since_step });
                    if !events.is_empty() {
                        let after =
                            events.iter().fold(Some(wf.clone()), workflow::evolve_workflow).unwrap_or(wf.clone());
                        let tenant = wf.created.tenant_id.clone();
                        record(tx, caller, workflow_id.as_str(), &tenant, ExpectedVersion::Exact(version), events)
                            .await?;
                        if let (Some(outcome), None) = (after.outcome, wf.outcome)
                            && let Some((node, _)) = store::node_aggregate(tx, &wf.created.node_id).await?
                        {
                            let moves =
                                lifecycle_after(&node, wf.created.kind, outcome, after.reason.as_deref(), now_ms)?;
                            record_moves(tx, caller, &node, &tenant, moves).await?;
                        }
                        if after.outcome.is_some() && wf.outcome.is_none() {
                            wake_reservation(tx, &wf).await?;
                        }
                    }
                    match next {
                        NextLook::Never => queue::complete(tx, item).await?,
                        NextLook::Now => queue::reschedule(tx, item, now_ms).await?,
                        NextLook::At(at) => queue::reschedule(tx, item, at).await?,
                    };
                    Ok(())
                }
                .scope_boxed()
            })
            .await
    }

    /// A workflow of a machine in a pool the caller's tenant owns (the door decided the caller may see it).
    pub async fn workflow(&self, id: &WorkflowId) -> AppResult<Workflow> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let found = store::workflow_aggregate(&mut tx, id).await?;
        tx.commit().await?;
        found.map(|(wf, _)| wf).ok_or_else(|| Rejection::NotFound { kind: "workflow", id: id.to_string() }.into())
    }

    /// The workflows of a machine, newest first (at most `limit`).
    pub async fn node_workflows(&self, node_id: &NodeId, limit: u32) -> AppResult<Vec<Workflow>> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let ids = store::workflows::of_node(&mut tx, node_id.as_str(), limit).await?;
        let mut found = Vec::with_capacity(ids.len());
        for id in ids {
            let id: WorkflowId = id.parse().map_err(|err| store::corrupt("a workflow id", err))?;
            if let Some((wf, _)) = store::workflow_aggregate(&mut tx, &id).await? {
                found.push(wf);
            }
        }
        tx.commit().await?;
        Ok(found)
    }
}
