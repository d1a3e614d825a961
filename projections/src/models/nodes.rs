//! `nodes`: every node's axes, its schedulability, and what it has.

use bc_domain::node::{
    Connectivity, NodeEvent, NodeRegistered, ProvisionState, Role, SchedulingView, Trust, no_schedule_reasons,
    schedulability,
};
use bc_domain::stream::AnyEvent;
use bc_eventstore::{Error, Result, Tx, sql};
use futures_util::future::BoxFuture;
use sqlx::Row as _;

use super::{json, text};
use crate::framework::{Envelope, Projection};

/// Version 1 of the nodes read model.
#[derive(Debug, Clone, Copy)]
pub struct NodesV1;

impl Projection for NodesV1 {
    fn name(&self) -> &'static str {
        "nodes"
    }

    fn version(&self) -> u32 {
        1
    }

    fn event_types(&self) -> &'static [&'static str] {
        &["node.registered", "node.cordoned", "node.uncordoned", "node.maintenance_started", "node.maintenance_ended"]
    }

    fn tables(&self) -> &'static [&'static str] {
        &["nodes_v1"]
    }

    fn apply<'a>(&'a self, tx: &'a mut Tx, events: &'a [Envelope]) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            for envelope in events {
                apply_one(tx, envelope).await?;
            }
            Ok(())
        })
    }
}

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

    /// Sets the flag named by [`flag_change`].
    pub(crate) fn set_flag(&mut self, column: &str, value: bool) {
        if column == "cordoned" {
            self.cordoned = value;
        } else {
            self.maintenance = value;
        }
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

/// A registered node's axes; the pool's owner is the tenant its stream belongs to.
pub(crate) fn registered_axes(e: &NodeRegistered, pool_owner: &str) -> Result<Axes> {
    Ok(Axes {
        role: text(&e.role)?,
        trust: text(&e.trust)?,
        owner_tenant_id: e.owner_tenant_id.as_ref().map(|t| t.to_string()),
        pool_owner_tenant_id: pool_owner.to_owned(),
        provision_state: text(&e.provision_state)?,
        connectivity: text(&e.connectivity)?,
        no_schedule_reasons: no_schedule_reasons(&e.conditions),
        observed_generation: e.observed_generation as i64,
        maintenance: false,
        cordoned: false,
    })
}

/// The flag a cordon or maintenance event sets, as (column, value).
pub(crate) fn flag_change(event: &NodeEvent) -> Option<(&'static str, bool)> {
    match event {
        NodeEvent::Cordoned(_) => Some(("cordoned", true)),
        NodeEvent::Uncordoned(_) => Some(("cordoned", false)),
        NodeEvent::MaintenanceStarted(_) => Some(("maintenance", true)),
        NodeEvent::MaintenanceEnded(_) => Some(("maintenance", false)),
        NodeEvent::Registered(_) => None,
    }
}

async fn apply_one(tx: &mut Tx, envelope: &Envelope) -> Result<()> {
    let Some(AnyEvent::Node(event)) = &envelope.event else { return Ok(()) };
    match event {
        NodeEvent::Registered(e) => {
            let pool_owner = envelope.recorded.tenant_id.clone().unwrap_or_default();
            let axes = registered_axes(e, &pool_owner)?;
            let atoms: Vec<_> = e.devices.iter().filter(|d| d.bookable).collect();
            sql::query(
                "INSERT INTO nodes_v1 (node_id, pool_id, site_id, owner_tenant_id, pool_owner_tenant_id, name, role, trust,
                                       adapter, provision_state, maintenance, cordoned, connectivity, conditions,
                                       no_schedule_reasons, observed_generation, schedulable, gpu_count, atom_class,
                                       atom_count, registered_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, false, false, $11, $12::jsonb, $13, $14, $15, $16, $17,
                         $18, timestamptz 'epoch' + $19::int8 * interval '1 millisecond')",
            )
            .bind(e.node_id.as_str())
            .bind(e.pool_id.as_str())
            .bind(e.site_id.as_str())
            .bind(&axes.owner_tenant_id)
            .bind(&pool_owner)
            .bind(&e.name)
            .bind(&axes.role)
            .bind(&axes.trust)
            .bind(text(&e.adapter)?)
            .bind(&axes.provision_state)
            .bind(&axes.connectivity)
            .bind(json(&e.conditions)?)
            .bind(&axes.no_schedule_reasons)
            .bind(axes.observed_generation)
            .bind(schedulable(&axes)?)
            .bind(e.gpus.len() as i32)
            .bind(atoms.first().map(|d| d.class.as_str()))
            .bind(atoms.len() as i32)
            .bind(e.at_ms)
            .execute(tx.conn())
            .await?;
        }
        other => {
            let Some((column, value)) = flag_change(other) else { return Ok(()) };
            let node_id = match other {
                NodeEvent::Cordoned(e)
                | NodeEvent::Uncordoned(e)
                | NodeEvent::MaintenanceStarted(e)
                | NodeEvent::MaintenanceEnded(e) => &e.node_id,
                NodeEvent::Registered(e) => &e.node_id,
            };
            let row = sql::query(
                "SELECT role, trust, owner_tenant_id, pool_owner_tenant_id, provision_state, connectivity,
                        no_schedule_reasons, observed_generation, maintenance, cordoned
                 FROM nodes_v1 WHERE node_id = $1",
            )
            .bind(node_id.as_str())
            .fetch_optional(tx.conn())
            .await?;
            let Some(row) = row else { return Ok(()) };
            let mut axes = Axes::from_row(&row)?;
            axes.set_flag(column, value);
            sql::query("UPDATE nodes_v1 SET cordoned = $2, maintenance = $3, schedulable = $4 WHERE node_id = $1")
                .bind(node_id.as_str())
                .bind(axes.cordoned)
                .bind(axes.maintenance)
                .bind(schedulable(&axes)?)
                .execute(tx.conn())
                .await?;
        }
    }
    Ok(())
}
