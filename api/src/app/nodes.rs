//! Commands on nodes: register one with its inventory (until the agent's join replaces it), cordon and
//! uncordon, maintenance on and off.

use bc_domain::Rejection;
use bc_domain::device::{GpuInfo, devices_for};
use bc_domain::id::{NodeId, TenantId};
use bc_domain::node::{
    Adapter, Condition, ConditionType, Connectivity, NodeEvent, NodeFlagChanged, NodeRegistered, ProvisionState, Role,
    Trust,
};
use bc_domain::site::check_name;
use bc_domain::{gpu, id::PoolId};
use bc_eventstore::events::{self, ExpectedVersion};
use bc_eventstore::{ScopedFutureExt as _, TxOptions, clock};

use super::fleet::{owned_pool, pending_key};
use super::store::{self, NamedTable};
use super::{App, AppResult, Caller, Committed, record, wake};

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
        let mut seen = std::collections::BTreeSet::new();
        for (i, gpu) in input.gpus.iter().enumerate() {
            if !seen.insert(gpu.uuid.clone()) {
                return Err(
                    Rejection::invalid(format!("gpus[{i}].uuid"), format!("{} is listed twice", gpu.uuid)).into()
                );
            }
        }
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
                    let ids: Vec<&str> = devices.iter().map(|d| d.id.as_str()).collect();
                    let taken = store::devices_taken(tx, &ids).await?;
                    if !taken.is_empty() {
                        return Err(Rejection::Conflict(format!(
                            "devices already registered on another node: {}",
                            taken.join(", ")
                        ))
                        .into());
                    }
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
                    let stream = node_id.as_str();
                    let position =
                        record(tx, caller, stream, &pool.owner_tenant_id, ExpectedVersion::NO_STREAM, vec![event])
                            .await?;
                    wake(tx, &pending_key(&input.pool_id), None).await?;
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
                    let unchanged = match verb {
                        NodeVerb::Cordon => node.cordoned,
                        NodeVerb::Uncordon => !node.cordoned,
                        NodeVerb::StartMaintenance => node.maintenance,
                        NodeVerb::EndMaintenance => !node.maintenance,
                    };
                    if unchanged {
                        return Ok(Committed { value: (), position: None });
                    }
                    let at_ms = clock::compute_now_ms(tx).await?;
                    let flag = NodeFlagChanged { node_id: node_id.clone(), reason: reason.clone(), at_ms };
                    let event = match verb {
                        NodeVerb::Cordon => NodeEvent::Cordoned(flag),
                        NodeVerb::Uncordon => NodeEvent::Uncordoned(flag),
                        NodeVerb::StartMaintenance => NodeEvent::MaintenanceStarted(flag),
                        NodeVerb::EndMaintenance => NodeEvent::MaintenanceEnded(flag),
                    };
                    let version = events::stream_version(tx, node_id.as_str()).await?;
                    let position = record(
                        tx,
                        caller,
                        node_id.as_str(),
                        &pool.owner_tenant_id,
                        ExpectedVersion::Exact(version),
                        vec![event],
                    )
                    .await?;
                    if matches!(verb, NodeVerb::Uncordon | NodeVerb::EndMaintenance) {
                        wake(tx, &pending_key(&node.pool_id), None).await?;
                    }
                    Ok(Committed { value: (), position })
                }
                .scope_boxed()
            })
            .await
    }
}
