//! Commands to nodes: durable one-shot messages, numbered per node from 1 and delivered strictly in that order.
//! A command waits until its `not_before` and until the node has observed its `min_generation`; one still
//! undelivered past its `not_after` becomes `expired` and is skipped. The agent acknowledges by id, and an
//! acknowledgement given twice changes nothing. The rows are `store::node_commands`'; this module decides which
//! commands reservations call for.

use bc_domain::agent::CommandKind;
use bc_domain::id::NodeId;
use bc_domain::reservation::{Allocation, Binding, Reservation, ReservationEvent, ReservationState};
use bc_eventstore::Tx;

pub use super::store::node_commands::{CommandRecord, Delivery};
pub(crate) use super::store::node_commands::{acknowledge, agent_nodes, all_succeeded, deliverable, enqueue, list};
use super::{AppResult, Caller};

/// The agent nodes a reservation's allocations are on.
pub(crate) async fn awaiting_for(tx: &mut Tx, allocations: &[Allocation]) -> AppResult<Vec<NodeId>> {
    let nodes: Vec<&NodeId> = allocations.iter().map(|a| &a.node_id).collect();
    agent_nodes(tx, &nodes).await
}

/// Queues the bind and unbind commands that recorded reservation events call for: a binding that began hands
/// the devices over on each awaited node; a release takes them back; a reservation that ended while its devices
/// were handed over (expired, failed) takes them back without waiting for it.
/// `agents` are the agent nodes of its allocations when the caller read them already.
pub(crate) async fn follow_hand_overs(
    tx: &mut Tx,
    caller: &Caller,
    before: &Reservation,
    events: &[ReservationEvent],
    agents: Option<&[NodeId]>,
) -> AppResult<()> {
    if before.request.binding == Binding::Node {
        return super::whole_nodes::follow(tx, caller, before, events).await;
    }
    let bound_before = matches!(before.state, ReservationState::Binding | ReservationState::Active);
    for event in events {
        let (nodes, bind) = match event {
            ReservationEvent::BindingStarted(e) => (e.awaiting.clone(), true),
            ReservationEvent::ReleaseRequested(e) => (e.awaiting.clone(), false),
            ReservationEvent::Expired(_) | ReservationEvent::Failed(_) if bound_before => match agents {
                Some(agents) => (agents.to_vec(), false),
                None => (awaiting_for(tx, &before.allocations).await?, false),
            },
            _ => continue,
        };
        for allocation in before.allocations.iter().filter(|a| nodes.contains(&a.node_id)) {
            let (reservation_id, allocation_id, devices) =
                (before.id.clone(), allocation.allocation_id.clone(), allocation.devices.clone());
            let kind = if bind {
                CommandKind::Bind { reservation_id, allocation_id, devices }
            } else {
                CommandKind::Unbind { reservation_id, allocation_id, devices }
            };
            enqueue(tx, &allocation.node_id, &kind, Some(&before.id), &Delivery::default()).await?;
        }
    }
    Ok(())
}

/// Fills in which agents a binding or a release must wait for (the nodes of the reservation's allocations that
/// run one); other commands pass unchanged.
pub(crate) async fn with_awaiting(
    tx: &mut Tx,
    r: &Reservation,
    command: bc_domain::reservation::Command,
) -> AppResult<bc_domain::reservation::Command> {
    use bc_domain::reservation::Command;
    Ok(match command {
        Command::StartBinding { .. } | Command::Release { .. } if r.request.binding == Binding::Node => {
            with_agents(command, whole_nodes(r))
        }
        Command::StartBinding { .. } | Command::Release { .. } => {
            with_agents(command, awaiting_for(tx, &r.allocations).await?)
        }
        other => other,
    })
}

/// The machines a `binding: node` reservation hands over: every node of its allocations, agent or not.
pub(crate) fn whole_nodes(r: &Reservation) -> Vec<NodeId> {
    r.allocations.iter().map(|a| a.node_id.clone()).collect()
}

/// [`with_awaiting`] when the agent nodes of the reservation's allocations are known.
pub(crate) fn with_agents(
    command: bc_domain::reservation::Command,
    agents: Vec<NodeId>,
) -> bc_domain::reservation::Command {
    use bc_domain::reservation::Command;
    match command {
        Command::StartBinding { now_ms, .. } => Command::StartBinding { now_ms, awaiting: agents },
        Command::Release { now_ms, .. } => Command::Release { now_ms, awaiting: agents },
        other => other,
    }
}
