//! The liveness controller and the node reconciler.
//!
//! Liveness is one sweep query per shard over `agent_sessions`: a node whose agent has been silent past its
//! lease moves `connected → disconnected → unreachable → lost` (DESIGN.md section 10), one event per change,
//! raising `NodeUnreachable` once it is unreachable. A heartbeat (see `agents`) brings it back.
//!
//! The reconciler runs a node's work-queue key (`node:<id>:replace`) whenever the node stops being able to hold
//! its future bookings (lost, in maintenance, drained, deleted, devices gone): those reservations are placed
//! again before their start, or fail with `node-lost`. It also completes drains, and, for a forced drain, ends
//! the reservations still running there (a forced delete ends them in its own transaction).

use bc_domain::id::{NodeId, ReservationId};
use bc_domain::node::{
    self, Condition, ConditionType, Connectivity, NodeCommand, NodeConditionRaised, NodeConnectivityChanged, NodeEvent,
    connectivity_after_silence,
};
use bc_domain::reservation::{self, Binding, Command, FailureReason, ReservationState};
use bc_eventstore::lease::Lease;
use bc_eventstore::queue::{self, WorkItem};
use bc_eventstore::{ScopedFutureExt as _, TxOptions, clock};

use super::explain::Trace;
use super::reservations::{apply_and_schedule, preempt, try_place};
use super::store::liveness;
use super::work::{self, WorkKey, fenced};
use super::{App, AppError, AppResult, Caller, record_node, store};

impl App {
    /// One liveness sweep of a shard: every node whose agent's silence calls for another connectivity gets it.
    /// Returns how many nodes changed.
    /// With `fence`, each change commits only while this process still holds the shard's lease.
    pub async fn sweep_liveness(&self, shard: i32, fence: Option<&Lease>) -> AppResult<usize> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let sessions = liveness::silent_sessions(&mut tx, shard).await?;
        tx.commit().await?;
        let lease_ms = self.liveness.lease.as_millis() as i64;
        let mut changed = 0;
        for silent in sessions {
            let due = connectivity_after_silence(silent.silence_ms, lease_ms, silent.lost_after_ms);
            if due != silent.connectivity && due != Connectivity::Connected {
                changed += usize::from(self.mark_silent(&silent.node_id, lease_ms, fence).await?);
            }
        }
        Ok(changed)
    }

    /// Moves one silent node to the connectivity its silence calls for, re-reading the session under a lock so
    /// a heartbeat that just arrived wins.
    async fn mark_silent(&self, node_id: &NodeId, lease_ms: i64, fence: Option<&Lease>) -> AppResult<bool> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                async move {
                    fenced(tx, fence).await?;
                    let Some(locked) = liveness::lock_session(tx, node_id).await? else { return Ok(false) };
                    let from = locked.silent.connectivity;
                    let to =
                        connectivity_after_silence(locked.silent.silence_ms, lease_ms, locked.silent.lost_after_ms);
                    if to == from || to == Connectivity::Connected {
                        return Ok(false);
                    }
                    let at_ms = clock::compute_now_ms(tx).await?;
                    let mut events = vec![NodeEvent::ConnectivityChanged(NodeConnectivityChanged {
                        node_id: node_id.clone(),
                        from,
                        to,
                        at_ms,
                    })];
                    if matches!(to, Connectivity::Unreachable | Connectivity::Lost) && !locked.unreachable_raised {
                        events.push(NodeEvent::ConditionRaised(NodeConditionRaised {
                            node_id: node_id.clone(),
                            condition: Condition {
                                kind: ConditionType::NodeUnreachable,
                                message: format!("no heartbeat for {} s", locked.silent.silence_ms / 1000),
                                since_ms: at_ms,
                            },
                        }));
                    }
                    record_node(tx, &Caller::system(), node_id, &locked.owner_tenant_id, events).await?;
                    if to == Connectivity::Lost {
                        work::wake_now(tx, &WorkKey::NodeReplace(node_id.clone())).await?;
                    }
                    Ok::<_, AppError>(true)
                }
                .scope_boxed()
            })
            .await
    }

    /// Reconciles a node's reservations (the `node:<id>:replace` work item): future bookings it can no longer
    /// hold are placed again or failed; a drain whose node holds nothing running completes; a forced drain or
    /// delete ends what still runs there. Returns when to look again, if ever.
    pub(crate) async fn reconcile_node(&self, caller: &Caller, node_id: &NodeId) -> AppResult<Option<i64>> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let holding = liveness::holding_reservations(&mut tx, node_id).await?;
        let node = liveness::drain_state(&mut tx, node_id).await?;
        tx.commit().await?;
        // A deleted node has no row: its future bookings move; what ran there was ended by a forced delete.
        let (schedulable, draining, force) = node.unwrap_or((false, false, false));
        let mut running = 0;
        for (id, state) in &holding {
            match state.as_str() {
                "placed" => self.replace_reservation(caller, id, node_id, schedulable).await?,
                "active" if force => self.preempt(caller, id).await?,
                _ => running += 1,
            }
        }
        if draining && running == 0 {
            self.complete_drain(caller, node_id).await?;
            return Ok(None);
        }
        // Something still runs on a draining node: look again when it may have ended.
        Ok((draining && running > 0).then_some(5_000))
    }

    /// Places a placed reservation again when its node can no longer hold it (or its devices are gone), before
    /// its start; fails it with `node-lost` when nothing fits.
    async fn replace_reservation(
        &self,
        caller: &Caller,
        id: &ReservationId,
        node_id: &NodeId,
        schedulable: bool,
    ) -> AppResult<()> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                async move {
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let Some(r) = store::reservation(tx, id).await? else { return Ok(()) };
                    if r.state != ReservationState::Placed || r.start_ms.is_some_and(|start| start <= now_ms) {
                        return Ok(());
                    }
                    let Some(allocation) = r.allocations.iter().find(|a| &a.node_id == node_id) else {
                        return Ok(());
                    };
                    let devices: Vec<&str> = allocation.devices.iter().map(|d| d.as_str()).collect();
                    let present = liveness::devices_present(tx, node_id, &devices).await?;
                    // A whole machine is handed over by its workflows, not its agent: it holds the reservation
                    // while it is in service for tenants, schedulable or not.
                    let holds = match r.request.binding {
                        Binding::Node => {
                            store::whole_nodes::in_service(tx, &r.request.pool_id, node_id.as_str()).await?
                        }
                        Binding::Hold | Binding::Instance => schedulable,
                    };
                    if holds && present == devices.len() as i64 {
                        return Ok(());
                    }
                    let reason = if present < devices.len() as i64 {
                        format!("devices of node {node_id} are gone")
                    } else {
                        format!("node {node_id} can no longer hold it")
                    };
                    let Some(pool) = store::pool(tx, &r.request.pool_id).await? else { return Ok(()) };
                    let command = match try_place(tx, &r, &pool, now_ms, 0, None, &mut Trace::default()).await? {
                        Some(allocations) => {
                            Command::Replace { allocations, from_node: node_id.clone(), reason, now_ms }
                        }
                        None => Command::Fail { reason: FailureReason::NodeLost, now_ms },
                    };
                    let events = reservation::decide(&r, &command)?;
                    apply_and_schedule(tx, caller, r, events, now_ms).await?;
                    Ok::<_, AppError>(())
                }
                .scope_boxed()
            })
            .await
    }

    /// Ends a running reservation whose node was drained with force.
    async fn preempt(&self, caller: &Caller, id: &ReservationId) -> AppResult<()> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                async move { preempt(tx, caller, id).await }.scope_boxed()
            })
            .await
    }

    async fn complete_drain(&self, caller: &Caller, node_id: &NodeId) -> AppResult<()> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                async move {
                    let Some(node) = store::node(tx, node_id).await? else { return Ok(()) };
                    let Some(pool) = store::pool(tx, &node.pool_id).await? else { return Ok(()) };
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = node::decide(&node, &NodeCommand::CompleteDrain { now_ms })?;
                    record_node(tx, caller, node_id, &pool.owner_tenant_id, events).await?;
                    Ok::<_, AppError>(())
                }
                .scope_boxed()
            })
            .await
    }

    /// Runs a node's reconcile work item, in the worker.
    /// The node's own writes are guarded by its stream's version, so a stale process cannot apply them twice; the
    /// item's completion is fenced by the shard's lease.
    pub(crate) async fn run_node_item(
        &self,
        caller: &Caller,
        item: &WorkItem,
        node_id: &NodeId,
        fence: Option<&Lease>,
    ) -> AppResult<()> {
        let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
        fenced(&mut tx, fence).await?;
        tx.commit().await?;
        let again = self.reconcile_node(caller, node_id).await?;
        let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
        fenced(&mut tx, fence).await?;
        match again {
            Some(delay_ms) => {
                let now_ms = clock::compute_now_ms(&mut tx).await?;
                queue::reschedule(&mut tx, item, now_ms + delay_ms).await?;
            }
            None => {
                queue::complete(&mut tx, item).await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }
}
