//! Whole nodes for tenants (`binding: node` in `policy.tenantRoot` pools): the workflows that hand a reservation's
//! machines over. At the window's start each machine is deployed with the tenant's profile; at the release, or once
//! the reservation ended while they were handed over, each is wiped by a release workflow. The decisions are the
//! domain's (`reservation::whole_nodes`); this module reads the machines and starts or cancels their workflows, in
//! the reservation's transaction. The workflows carry the reservation's id, and their end wakes it.

use bc_domain::Rejection;
use bc_domain::id::WorkflowId;
use bc_domain::reservation::whole_nodes::{self, MachineAction};
use bc_domain::reservation::{self, Command, FailureReason, Reservation, ReservationEvent, ReservationState};
use bc_domain::workflow::WorkflowKind;
use bc_eventstore::Tx;

use crate::workflows::{NewWorkflow, begin_workflow, end_workflow};
use crate::{AppError, AppResult, Caller, store};

async fn machines(tx: &mut Tx, r: &Reservation) -> AppResult<Vec<whole_nodes::MachineFacts>> {
    let nodes: Vec<&str> = r.allocations.iter().map(|a| a.node_id.as_str()).collect();
    store::whole_nodes::hand_over(tx, &r.id, &nodes).await
}

/// Starts what recorded events call for: a hand-over that began (a binding, a release) deploys or wipes the
/// machines at once; a reservation that ended (expired or failed) while they were handed over wipes them, and
/// nobody waits for those wipes (one that cannot start leaves its machine as it is, for an operator).
pub(crate) async fn follow(
    tx: &mut Tx,
    caller: &Caller,
    before: &Reservation,
    events: &[ReservationEvent],
) -> AppResult<()> {
    let bound_before = matches!(before.state, ReservationState::Binding | ReservationState::Active);
    let ended = events.iter().any(|e| matches!(e, ReservationEvent::Expired(_) | ReservationEvent::Failed(_)));
    let began =
        events.iter().any(|e| matches!(e, ReservationEvent::BindingStarted(_) | ReservationEvent::ReleaseRequested(_)));
    let actions = if bound_before && ended {
        whole_nodes::wipe_after_end(before, &machines(tx, before).await?)
    } else if began && !ended {
        let after = events.iter().fold(Some(before.clone()), reservation::evolve).unwrap_or_else(|| before.clone());
        let found = machines(tx, &after).await?;
        whole_nodes::hand_over(&after, &found, after.hand_over_at_ms.unwrap_or_default()).actions
    } else {
        return Ok(());
    };
    // A deployment refused here fails the binding at the worker's next look, which meets the same refusal.
    carry_out(tx, caller, before, actions).await.map(|_| ())
}

/// Moves a whole-node hand-over on: starts or cancels the machines' workflows it calls for, and answers the
/// reservation's command once the hand-over is over (or a deployment could not even start: the binding fails).
pub(crate) async fn step(tx: &mut Tx, caller: &Caller, r: &Reservation, now_ms: i64) -> AppResult<Option<Command>> {
    let found = machines(tx, r).await?;
    let step = whole_nodes::hand_over(r, &found, now_ms);
    if step.command.is_some() {
        return Ok(step.command);
    }
    match carry_out(tx, caller, r, step.actions).await? {
        Some(refused) if r.state == ReservationState::Binding => {
            tracing::warn!(reservation = %r.id, %refused, "a machine's deployment could not start");
            Ok(Some(Command::Fail { reason: FailureReason::BindingFailed, now_ms }))
        }
        _ => Ok(None),
    }
}

/// Carries out the actions in order. A workflow the domain refuses to start (the profile was deleted, a step
/// needs a driver the machine lacks, the machine moved on) stops them: its refusal is answered.
async fn carry_out(
    tx: &mut Tx,
    caller: &Caller,
    r: &Reservation,
    actions: Vec<MachineAction>,
) -> AppResult<Option<Rejection>> {
    for action in actions {
        let (node_id, kind) = match action {
            MachineAction::Cancel { workflow_id, .. } => {
                let id: WorkflowId = workflow_id.parse().map_err(|err| store::corrupt("workflows.id", err))?;
                let why = format!("reservation {} released its machines", r.id);
                end_workflow(tx, caller, &id, Some(why)).await?;
                continue;
            }
            MachineAction::Deploy(node_id) => (node_id, WorkflowKind::Deploy),
            MachineAction::Release(node_id) => (node_id, WorkflowKind::Release),
        };
        let Some((node, _)) = store::node_aggregate(tx, &node_id).await? else { continue };
        let Some(pool) = store::pool(tx, &node.pool_id).await? else { continue };
        let profile = match kind {
            WorkflowKind::Deploy => r.request.profile_id.clone().map(|id| (id, r.tenant_id.clone())),
            WorkflowKind::Inspect | WorkflowKind::Release => None,
        };
        let new = NewWorkflow { kind, profile, reservation_id: Some(r.id.clone()) };
        match begin_workflow(tx, caller, &node, &pool.owner_tenant_id, &WorkflowId::generate(), new).await {
            Ok(_) => {}
            Err(AppError::Rejected(refused)) => return Ok(Some(refused)),
            Err(other) => return Err(other),
        }
    }
    Ok(None)
}
