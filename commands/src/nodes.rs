//! Commands on nodes: register one with its inventory (until the agent's join replaces it), cordon and
//! uncordon, maintenance on and off.

use bc_domain::Rejection;
use bc_domain::agent::CommandKind;
use bc_domain::device::{GpuInfo, devices_for};
use bc_domain::id::CommandId;
use bc_domain::id::{NodeId, TenantId};
use bc_domain::node::{
    self, Adapter, Condition, ConditionType, Connectivity, NodeCommand, NodeEvent, NodeRegistered,
    NodeResourcesChanged, ProvisionState, Role, Trust, VerbState,
};
use bc_domain::site::check_name;
use bc_domain::{gpu, id::PoolId};
use bc_eventstore::events::ExpectedVersion;
use bc_eventstore::{ScopedFutureExt as _, Tx, TxOptions, clock};

use super::node_commands::{self as commands, CommandRecord, Delivery};

use super::fleet::owned_pool;
use super::store::{self, NamedTable};
use super::work::{self, WorkKey};
use super::{App, AppResult, Caller, Committed, record, record_node};

/// `nodes.register`: a node and what it has.
#[derive(Debug, Clone)]
pub struct RegisterNode {
    pub pool_id: PoolId,
    pub name: String,
    pub role: Role,
    pub trust: Trust,
    /// The tenant that owns a `tenant-owned` or `tenant-controlled` machine.
    pub owner_tenant_id: Option<TenantId>,
    pub gpus: Vec<GpuInfo>,
    /// Its scalar resources (`vcpu`, `memoryGiB`, `disk`), for a node whose agent does not report an inventory.
    pub resources: std::collections::BTreeMap<String, u64>,
}

/// The node flags the operator verbs change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeVerb {
    Cordon,
    Uncordon,
    StartMaintenance,
    EndMaintenance,
}

impl App {
    /// Registers a node in a pool the caller owns. Its devices and atoms follow the pool's sharing mode; GPUs of
    /// an unknown model raise `GpuModelUnknown`, which keeps the node off the scheduler.
    pub async fn register_node(&self, caller: &Caller, input: RegisterNode) -> AppResult<Committed<NodeId>> {
        check_name("name", &input.name)?;
        if input.gpus.is_empty() {
            return Err(Rejection::invalid("gpus", "a node reports at least one GPU").into());
        }
        if input.trust != Trust::Platform && input.owner_tenant_id.is_none() {
            return Err(Rejection::invalid(
                "ownerTenantId",
                "is required for tenant-owned and tenant-controlled nodes",
            )
            .into());
        }
        bc_domain::device::check_gpus("gpus", &input.gpus)?;
        bc_domain::device::check_no_nul("gpus", &input.gpus)?;
        node::check_resources("resources", &input.resources)?;
        let node_id = NodeId::generate();
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let (input, node_id) = (&input, &node_id);
                async move {
                    let pool = owned_pool(tx, caller, &input.pool_id).await?;
                    for (i, info) in input.gpus.iter().enumerate() {
                        let name = gpu::classify(&info.name);
                        if name.known && name.gpu_model != pool.gpu_model {
                            return Err(Rejection::invalid(
                                format!("gpus[{i}].name"),
                                format!(
                                    "is a {} GPU, but pool {} holds {} GPUs",
                                    name.gpu_model, pool.id, pool.gpu_model
                                ),
                            )
                            .into());
                        }
                    }
                    if store::name_taken(tx, NamedTable::Nodes, input.pool_id.as_str(), &input.name).await? {
                        return Err(Rejection::Conflict(format!(
                            "a node named {:?} is already in the pool",
                            input.name
                        ))
                        .into());
                    }
                    let (devices, unknown) = devices_for(&input.gpus, pool.sharing, pool.policy.replicas());
                    store::refuse_taken_devices(tx, &devices).await?;
                    let site_id = store::pool_site(tx, &input.pool_id).await?;
                    let at_ms = clock::compute_now_ms(tx).await?;
                    let conditions = unknown
                        .iter()
                        .map(|name| Condition {
                            kind: ConditionType::GpuModelUnknown,
                            message: format!("no gpu-models.json entry for {name:?}"),
                            since_ms: at_ms,
                        })
                        .collect();
                    let event = NodeEvent::Registered(NodeRegistered {
                        node_id: node_id.clone(),
                        pool_id: input.pool_id.clone(),
                        site_id,
                        name: input.name.clone(),
                        role: input.role,
                        trust: input.trust,
                        owner_tenant_id: input.owner_tenant_id.clone(),
                        adapter: Adapter::BcdV1,
                        provision_state: ProvisionState::Adopted,
                        connectivity: Connectivity::Connected,
                        generation: 1,
                        observed_generation: 1,
                        gpus: input.gpus.clone(),
                        devices,
                        conditions,
                        at_ms,
                    });
                    let mut events = vec![event];
                    let resources = input.resources.clone();
                    if !resources.is_empty() {
                        let node_id = node_id.clone();
                        events.push(NodeEvent::ResourcesChanged(NodeResourcesChanged { node_id, resources, at_ms }));
                    }
                    let stream = node_id.as_str();
                    let position =
                        record(tx, caller, stream, &pool.owner_tenant_id, ExpectedVersion::NO_STREAM, events).await?;
                    work::wake_now(tx, &WorkKey::pool_pending(&input.pool_id)).await?;
                    Ok(Committed { value: node_id.clone(), position })
                }
                .scope_boxed()
            })
            .await
    }

    /// `nodes.cordon`, `nodes.uncordon`, maintenance on and off. Setting a flag that is already set records
    /// nothing. Existing bookings stay; freeing a node wakes the pool's pending reservations.
    pub async fn node_verb(
        &self,
        caller: &Caller,
        node_id: &NodeId,
        verb: NodeVerb,
        reason: Option<String>,
    ) -> AppResult<Committed<()>> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let reason = &reason;
                async move {
                    let Some(node) = store::node(tx, node_id).await? else {
                        return Err(Rejection::NotFound { kind: "node", id: node_id.to_string() }.into());
                    };
                    let pool = owned_pool(tx, caller, &node.pool_id)
                        .await
                        .map_err(|_| Rejection::NotFound { kind: "node", id: node_id.to_string() })?;
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let reason = reason.clone();
                    let command = match verb {
                        NodeVerb::Cordon => NodeCommand::Cordon { reason, now_ms },
                        NodeVerb::Uncordon => NodeCommand::Uncordon { reason, now_ms },
                        NodeVerb::EndMaintenance => NodeCommand::EndMaintenance { reason, now_ms },
                        NodeVerb::StartMaintenance => {
                            store::lock_pool(tx, &pool.id).await?;
                            let disruption = store::disruption(tx, &pool, node_id).await?;
                            NodeCommand::StartMaintenance { reason, disruption, now_ms }
                        }
                    };
                    let events = node::decide(&node, &command)?;
                    if events.is_empty() {
                        return Ok(Committed { value: (), position: None });
                    }
                    let position = record_node(tx, caller, node_id, &pool.owner_tenant_id, events).await?;
                    if matches!(verb, NodeVerb::Uncordon | NodeVerb::EndMaintenance) {
                        work::wake_now(tx, &WorkKey::pool_pending(&node.pool_id)).await?;
                    }
                    if verb == NodeVerb::StartMaintenance {
                        work::wake_now(tx, &WorkKey::NodeReplace(node_id.clone())).await?;
                    }
                    Ok(Committed { value: (), position })
                }
                .scope_boxed()
            })
            .await
    }
}

/// What an operator may send a node directly (bindings come only from reservations).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorCommand {
    pub kind: CommandKind,
    pub delivery: Delivery,
}

/// A node's latest inventory snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InventorySnapshot {
    pub snapshot: u64,
    pub document: bc_domain::inventory::NodeInventory,
    pub received_at_ms: i64,
}

/// Loads a node the caller operates (its pool's owner), or `NOT_FOUND`.
async fn operated_node(tx: &mut Tx, caller: &Caller, node_id: &NodeId) -> AppResult<(VerbState, store::PoolRow)> {
    let not_found = || Rejection::NotFound { kind: "node", id: node_id.to_string() };
    let Some(node) = store::node(tx, node_id).await? else { return Err(not_found().into()) };
    let pool = owned_pool(tx, caller, &node.pool_id).await.map_err(|_| not_found())?;
    Ok((node, pool))
}

impl App {
    /// `nodes.drain`: cordons the node and moves its future bookings elsewhere; running reservations finish
    /// (or, with `force`, are ended). Within the pool's disruption budget.
    pub async fn drain_node(
        &self,
        caller: &Caller,
        node_id: &NodeId,
        force: bool,
        reason: Option<String>,
    ) -> AppResult<Committed<()>> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let reason = &reason;
                async move {
                    let (node, pool) = operated_node(tx, caller, node_id).await?;
                    store::lock_pool(tx, &pool.id).await?;
                    let disruption = store::disruption(tx, &pool, node_id).await?;
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let command = NodeCommand::Drain { force, reason: reason.clone(), disruption, now_ms };
                    let events = node::decide(&node, &command)?;
                    if events.is_empty() {
                        return Ok(Committed { value: (), position: None });
                    }
                    let position = record_node(tx, caller, node_id, &pool.owner_tenant_id, events).await?;
                    work::wake_now(tx, &WorkKey::NodeReplace(node_id.clone())).await?;
                    Ok(Committed { value: (), position })
                }
                .scope_boxed()
            })
            .await
    }

    /// `nodes.delete`: removes the node, revoking its credential and ending its session. Refused while
    /// reservations are placed or running on it, unless `force`: then future ones are placed again (or fail)
    /// and running ones end.
    pub async fn delete_node(
        &self,
        caller: &Caller,
        node_id: &NodeId,
        force: bool,
        reason: Option<String>,
    ) -> AppResult<Committed<()>> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let reason = &reason;
                async move {
                    let (node, pool) = operated_node(tx, caller, node_id).await?;
                    store::lock_pool(tx, &pool.id).await?;
                    let (held, active) = store::held_on_node(tx, node_id).await?;
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let command = NodeCommand::Delete { force, reason: reason.clone(), held: held.clone(), now_ms };
                    let events = node::decide(&node, &command)?;
                    // What still runs there ends now; future bookings move (the reconciler, below).
                    for id in active {
                        super::reservations::preempt(tx, caller, &id).await?;
                    }
                    let position = record_node(tx, caller, node_id, &pool.owner_tenant_id, events).await?;
                    store::agents::forget_node(tx, node_id).await?;
                    if !held.is_empty() {
                        work::wake_now(tx, &WorkKey::NodeReplace(node_id.clone())).await?;
                    }
                    Ok(Committed { value: (), position })
                }
                .scope_boxed()
            })
            .await
    }

    /// Changes a node's desired state (its labels, its MIG layout): the generation rises and the agent applies
    /// it and reports the generation it observed.
    pub async fn set_node_spec(
        &self,
        caller: &Caller,
        node_id: &NodeId,
        labels: std::collections::BTreeMap<String, String>,
        mig_layout: Option<String>,
    ) -> AppResult<Committed<u64>> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let (labels, mig_layout) = (&labels, &mig_layout);
                async move {
                    let (node, pool) = operated_node(tx, caller, node_id).await?;
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let command =
                        NodeCommand::SetSpec { labels: labels.clone(), mig_layout: mig_layout.clone(), now_ms };
                    let events = node::decide(&node, &command)?;
                    let generation = node.generation + 1;
                    let position = record_node(tx, caller, node_id, &pool.owner_tenant_id, events).await?;
                    Ok(Committed { value: generation, position })
                }
                .scope_boxed()
            })
            .await
    }

    /// Queues an operator's command for a node (`probe`, `refresh-inventory`).
    pub async fn queue_node_command(
        &self,
        caller: &Caller,
        node_id: &NodeId,
        command: OperatorCommand,
    ) -> AppResult<(CommandId, u64)> {
        if matches!(command.kind, CommandKind::Bind { .. } | CommandKind::Unbind { .. }) {
            return Err(Rejection::invalid("kind", "bind and unbind come only from reservations").into());
        }
        if let (Some(before), Some(after)) = (command.delivery.not_before_ms, command.delivery.not_after_ms)
            && after < before
        {
            return Err(Rejection::invalid("notAfter", "must not be before notBefore").into());
        }
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let command = &command;
                async move {
                    operated_node(tx, caller, node_id).await?;
                    commands::enqueue(tx, node_id, &command.kind, None, &command.delivery).await
                }
                .scope_boxed()
            })
            .await
    }

    /// A node's commands, newest first.
    pub async fn node_commands(&self, caller: &Caller, node_id: &NodeId) -> AppResult<Vec<CommandRecord>> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        operated_node(&mut tx, caller, node_id).await?;
        let list = commands::list(&mut tx, node_id, 200).await?;
        tx.commit().await?;
        Ok(list)
    }

    /// A node's latest inventory snapshot.
    pub async fn node_inventory(&self, caller: &Caller, node_id: &NodeId) -> AppResult<InventorySnapshot> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        operated_node(&mut tx, caller, node_id).await?;
        let latest = store::agents::latest_snapshot_received(&mut tx, node_id).await?;
        tx.commit().await?;
        let Some((snapshot, document, received_at_ms)) = latest else {
            return Err(Rejection::NotFound { kind: "inventory of node", id: node_id.to_string() }.into());
        };
        Ok(InventorySnapshot { snapshot, document, received_at_ms })
    }
}
