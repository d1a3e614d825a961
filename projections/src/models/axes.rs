//! A node's scheduling axes as the capacity rollup keeps them per row, the schedulability rule over them (the
//! domain's), and every node event type the node read models follow.

use std::collections::BTreeSet;

use bc_domain::device::Device;
use bc_domain::id::{NodeId, PoolId, TenantId};
use bc_domain::node::{
    ConditionType, Connectivity, NodeEvent, ProvisionState, Role, SchedulingView, Trust, no_schedule_reasons,
    schedulability,
};
use bc_eventstore::{Error, Result};
use sqlx::Row as _;

use super::text;

/// The axes the schedulability rule reads, as a node's row holds them.
pub(crate) struct Axes {
    pub role: String,
    pub trust: String,
    pub owner_tenant_id: Option<String>,
    pub pool_owner_tenant_id: String,
    pub provision_state: String,
    pub connectivity: String,
    pub no_schedule_reasons: Vec<String>,
    pub observed_generation: i64,
    pub maintenance: bool,
    pub cordoned: bool,
}

impl Axes {
    /// The axes of a row that has the columns of the same names.
    pub(crate) fn from_row(row: &sqlx::postgres::PgRow) -> Result<Self> {
        Ok(Axes {
            role: row.try_get("role")?,
            trust: row.try_get("trust")?,
            owner_tenant_id: row.try_get("owner_tenant_id")?,
            pool_owner_tenant_id: row.try_get("pool_owner_tenant_id")?,
            provision_state: row.try_get("provision_state")?,
            connectivity: row.try_get("connectivity")?,
            no_schedule_reasons: row.try_get("no_schedule_reasons")?,
            observed_generation: row.try_get("observed_generation")?,
            maintenance: row.try_get("maintenance")?,
            cordoned: row.try_get("cordoned")?,
        })
    }
}

fn parse<T: serde::de::DeserializeOwned>(value: &str) -> Result<T> {
    serde_json::from_value(serde_json::Value::String(value.to_owned()))
        .map_err(|err| Error::Internal(format!("a node axis holds an unknown value {value:?}: {err}")))
}

/// The schedulability rule over a row's axes.
pub(crate) fn schedulable(axes: &Axes) -> Result<bool> {
    let owner =
        axes.owner_tenant_id.as_deref().map(str::parse).transpose().map_err(|e| Error::Internal(format!("{e}")))?;
    let pool_owner = axes.pool_owner_tenant_id.parse().map_err(|e| Error::Internal(format!("{e}")))?;
    let view = SchedulingView {
        provision_state: parse::<ProvisionState>(&axes.provision_state)?,
        role: parse::<Role>(&axes.role)?,
        maintenance: axes.maintenance,
        cordoned: axes.cordoned,
        connectivity: parse::<Connectivity>(&axes.connectivity)?,
        no_schedule_reasons: &axes.no_schedule_reasons,
        observed_generation: axes.observed_generation.max(0) as u64,
        trust: parse::<Trust>(&axes.trust)?,
        owner_tenant_id: owner.as_ref(),
        pool_owner_tenant_id: &pool_owner,
    };
    Ok(schedulability(&view).is_empty())
}

/// What a node's first event says about it: `node.registered` or `node.joined`.
pub(crate) struct NewNode<'a> {
    pub node_id: &'a NodeId,
    pub pool_id: &'a PoolId,
    pub devices: &'a [Device],
    pub axes: Axes,
}

impl<'a> NewNode<'a> {
    /// The new node of a first event (the pool's owner is the tenant its stream belongs to); `None` for the
    /// other events.
    pub(crate) fn of(event: &'a NodeEvent, pool_owner: &str) -> Result<Option<Self>> {
        let new = |e_role: &Role, e_trust: &Trust, owner: Option<&TenantId>, state: ProvisionState| -> Result<Axes> {
            Ok(Axes {
                role: text(e_role)?,
                trust: text(e_trust)?,
                owner_tenant_id: owner.map(|t| t.to_string()),
                pool_owner_tenant_id: pool_owner.to_owned(),
                provision_state: text(&state)?,
                connectivity: text(&Connectivity::Connected)?,
                no_schedule_reasons: Vec::new(),
                observed_generation: 0,
                maintenance: false,
                cordoned: false,
            })
        };
        Ok(Some(match event {
            NodeEvent::Registered(e) => {
                let mut axes = new(&e.role, &e.trust, e.owner_tenant_id.as_ref(), e.provision_state)?;
                axes.connectivity = text(&e.connectivity)?;
                axes.no_schedule_reasons = no_schedule_reasons(&e.conditions);
                axes.observed_generation = e.observed_generation as i64;
                NewNode { node_id: &e.node_id, pool_id: &e.pool_id, devices: &e.devices, axes }
            }
            NodeEvent::Joined(e) => {
                let mut axes = new(&e.role, &e.trust, e.owner_tenant_id.as_ref(), ProvisionState::Adopting)?;
                axes.no_schedule_reasons = no_schedule_reasons(&e.conditions);
                NewNode { node_id: &e.node_id, pool_id: &e.pool_id, devices: &e.devices, axes }
            }
            _ => return Ok(None),
        }))
    }

    /// The class and count of its atoms.
    pub(crate) fn atoms(&self) -> (Option<&'static str>, usize) {
        let atoms: Vec<&Device> = self.devices.iter().filter(|d| d.bookable).collect();
        (atoms.first().map(|d| d.class.as_str()), atoms.len())
    }
}

/// How a node event moves the axes the schedulability rule reads; `false` when it does not touch them.
pub(crate) fn change_axes(axes: &mut Axes, event: &NodeEvent) -> Result<bool> {
    match event {
        NodeEvent::Cordoned(_) | NodeEvent::DrainStarted(_) => axes.cordoned = true,
        NodeEvent::Uncordoned(_) => axes.cordoned = false,
        NodeEvent::MaintenanceStarted(_) => axes.maintenance = true,
        NodeEvent::MaintenanceEnded(_) => axes.maintenance = false,
        NodeEvent::Adopted(_) => axes.provision_state = text(&ProvisionState::Adopted)?,
        NodeEvent::ProvisionChanged(e) => axes.provision_state = text(&e.to)?,
        NodeEvent::ConnectivityChanged(e) => axes.connectivity = text(&e.to)?,
        NodeEvent::SpecObserved(e) => axes.observed_generation = e.observed_generation as i64,
        NodeEvent::ConditionRaised(e) => axes.set_reason(e.condition.kind, true)?,
        NodeEvent::ConditionCleared(e) => axes.set_reason(e.kind, false)?,
        _ => return Ok(false),
    }
    Ok(true)
}

impl Axes {
    /// Adds or removes a condition type from `noScheduleReasons` (only the types that block scheduling appear).
    fn set_reason(&mut self, kind: ConditionType, present: bool) -> Result<()> {
        let mut kinds: BTreeSet<ConditionType> =
            self.no_schedule_reasons.iter().map(|r| parse::<ConditionType>(r)).collect::<Result<_>>()?;
        if present && kind.blocks_scheduling() {
            kinds.insert(kind);
        } else {
            kinds.remove(&kind);
        }
        self.no_schedule_reasons = kinds.into_iter().map(|k| k.as_str().to_owned()).collect();
        Ok(())
    }
}
