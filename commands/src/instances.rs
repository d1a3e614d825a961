//! Instances: made with the `binding: instance` reservation that holds their allocation, in one transaction;
//! their owner's wishes (start, stop, delete); their node's reports; and their end with their allocation's.
//!
//! A deletion releases the allocation (or cancels it before its window began): its node's agent stops the
//! instance before it confirms the release, and the release's end ends the instance. Whatever else ends the
//! reservation (its window, its lease, a failure) ends the instance the same way.

use bc_domain::Rejection;
use bc_domain::device::DeviceClass;
use bc_domain::id::{FlavorId, ImageId, InstanceId, NodeId, PoolId, ProjectId};
use bc_domain::instance::{self, DesiredState, Instance, InstanceSpec, InstanceState, NewInstance};
use bc_domain::reservation::{
    self, Binding, Command, DeviceRequest, Reservation, ReservationRequest, ReservationState, Selector, Topology,
};
use bc_eventstore::events::ExpectedVersion;
use bc_eventstore::{Position, ScopedFutureExt as _, Tx, TxOptions};

use bc_domain::agent::{AgentInstance, ImageToWrite};

use crate::auth::{Resource, Target, resolve};
use crate::gate::{Call, Subject};
use crate::images::ImageContent;
use crate::reads::{Listed, Page};
use crate::reservations::{Known, apply_and_schedule_known};
use crate::store;
use crate::store::instances::NodeInstance;
use crate::{App, AppError, AppResult, Caller, Committed, record};

/// `instances.create`: what the owner asks for. The idempotency key names the instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateInstance {
    pub idempotency_key: String,
    pub name: String,
    pub pool_id: PoolId,
    pub flavor_id: FlavorId,
    pub image_id: ImageId,
    pub project_id: Option<ProjectId>,
    pub user_data: String,
    /// How long its allocation holds, in seconds.
    pub duration_s: u64,
    pub desired: DesiredState,
}

/// An instance made (or found again by a retry), with the reservation that holds its allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MadeInstance {
    pub instance: Instance,
    pub reservation: Reservation,
    pub created: bool,
}

/// What a node reports of an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceReport {
    pub state: InstanceState,
    pub generation: u64,
    pub message: Option<String>,
}

/// What the node's agent is sent of an instance it is to run.
fn for_agent(found: NodeInstance) -> AppResult<AgentInstance> {
    let bad = |err: String| store::corrupt("an instance's allocation", err);
    let devices = found
        .devices
        .iter()
        .map(|d| d.parse().map_err(|err: bc_domain::id::IdError| bad(err.to_string())))
        .collect::<AppResult<_>>()?;
    let image = if found.image_sha256.is_empty() {
        None
    } else {
        Some(ImageToWrite {
            image_id: found.instance.created.spec.image_id.clone(),
            sha256: found.image_sha256,
            size: u64::try_from(found.image_size).map_err(|err| bad(err.to_string()))?,
            format: serde_json::from_value(serde_json::Value::String(found.image_format))
                .map_err(|err| bad(err.to_string()))?,
        })
    };
    let i = found.instance;
    Ok(AgentInstance {
        instance_id: i.created.instance_id.clone(),
        reservation_id: i.created.reservation_id.clone(),
        name: i.created.spec.name.clone(),
        desired: i.desired,
        generation: i.generation,
        state: i.state,
        sizes: i.created.spec.sizes,
        devices,
        image,
        user_data: i.created.spec.user_data.clone(),
    })
}

/// The reservation an instance's allocation is held by: its flavor's GPUs on one node with the flavor's scalar
/// amounts beside them, from now for `duration_s`.
fn reservation_request(spec: &InstanceSpec) -> ReservationRequest {
    ReservationRequest {
        pool_id: spec.pool_id.clone(),
        devices: DeviceRequest {
            class: DeviceClass::Gpu,
            count: spec.sizes.gpus,
            selector: Selector::default(),
            topology: Topology::SameNode,
        },
        start_ms: None,
        duration_s: spec.duration_s,
        binding: Binding::Instance,
        lease_seconds: None,
        project_id: spec.project_id.clone(),
        deadline_ms: None,
        wait: false,
        profile_id: None,
        resources: spec.sizes.scalars(),
    }
}

fn not_found(id: &InstanceId) -> AppError {
    Rejection::NotFound { kind: "instance", id: id.to_string() }.into()
}

impl App {
    /// Creates an instance as `call`: decided as `instances.create` on the draft (its sizes, image and project
    /// under its pool), then as its reservation's `reservations.create`; the instance and its reservation are
    /// recorded in one transaction, so neither exists without the other. A retry with the same key and body
    /// answers the same instance.
    pub async fn create_instance_as(&self, call: &Call, input: CreateInstance) -> AppResult<Committed<MadeInstance>> {
        self.create_instance_gated(&call.caller(), input, Some(call)).await
    }

    /// Creates an instance as `caller`, deciding nothing (tools and tests; the API goes through
    /// [`App::create_instance_as`]).
    pub async fn create_instance(&self, caller: &Caller, input: CreateInstance) -> AppResult<Committed<MadeInstance>> {
        self.create_instance_gated(caller, input, None).await
    }

    async fn create_instance_gated(
        &self,
        caller: &Caller,
        input: CreateInstance,
        gate: Option<&Call>,
    ) -> AppResult<Committed<MadeInstance>> {
        crate::reservations::check_idempotency_key(&input.idempotency_key)?;
        // The fields that need no lookup first: PostgreSQL refuses a NUL in text.
        bc_domain::site::check_name("name", &input.name)?;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let pool = resolve::pool(&mut tx, &input.pool_id).await?;
        let flavor = store::flavors::flavor(&mut tx, input.flavor_id.as_str()).await?;
        let image = store::profiles::image_for(&mut tx, caller.tenant_id.as_str(), input.image_id.as_str()).await?;
        tx.commit().await?;

        let flavor = flavor
            .filter(|f| f.tenant_id == caller.tenant_id.as_str() || f.visibility == "public")
            .ok_or_else(|| Rejection::NotFound { kind: "flavor", id: input.flavor_id.to_string() })?;
        let sizes = crate::flavors::FlavorView::sizes_of(&flavor)?;
        let spec = InstanceSpec {
            name: input.name.clone(),
            pool_id: input.pool_id.clone(),
            flavor_id: input.flavor_id.clone(),
            sizes,
            image_id: input.image_id.clone(),
            project_id: input.project_id.clone(),
            user_data: input.user_data.clone(),
            duration_s: input.duration_s,
        };
        spec.check()?;
        let instance_id = InstanceId::derive(&caller.tenant_id, &caller.identity, &input.idempotency_key);
        // Decided on the draft before the image is looked at: a caller without access learns nothing of it.
        let draft = pool.clone().map(|facts| Resource {
            target: Target::Instance,
            id: instance_id.to_string(),
            tenant_id: caller.tenant_id.clone(),
            attributes: resolve::instance_attributes(&spec, image.unwrap_or(false), &facts),
            pool: Some(facts),
        });
        if let Some(call) = gate {
            self.decide(call, "instances.create", draft.as_ref(), Subject::Pool(&input.pool_id)).await?;
        } else if pool.is_none() {
            return Err(Rejection::NotFound { kind: "pool", id: input.pool_id.to_string() }.into());
        }
        if let Some(facts) = &pool
            && let Some(class) = facts.attributes.get("class").and_then(crate::auth::Attribute::as_str)
            && class != "vps-host"
        {
            return Err(Rejection::invalid(
                "poolId",
                format!("instances run in vps-host pools; pool {} is a {class} pool", input.pool_id),
            )
            .into());
        }
        let Some(image_verified) = image else {
            return Err(Rejection::NotFound { kind: "image", id: input.image_id.to_string() }.into());
        };

        let reservation_id = instance_id.reservation_id(&caller.tenant_id, &caller.identity);
        let request = reservation_request(&spec);
        let new = NewInstance {
            instance_id,
            tenant_id: caller.tenant_id.clone(),
            identity: caller.identity.clone(),
            reservation_id: reservation_id.clone(),
            spec,
            image_verified,
            desired: input.desired,
            now_ms: 0,
        };
        let reserved = self.reserve_derived(caller, &reservation_id, &request, gate, Some(&new)).await?;
        let Committed { value, position } = reserved;
        let instance = value.instance.ok_or_else(|| store::corrupt("an instance's reservation", "no instance"))?;
        Ok(Committed {
            value: MadeInstance { instance, reservation: value.reservation, created: value.created },
            position,
        })
    }

    /// A page of the caller's tenant's instances, by id.
    pub async fn list_instances(&self, caller: &Caller, page: &Page) -> AppResult<Listed<Instance>> {
        let after = match page.after_key.as_deref() {
            Some(key) => Some(
                key.parse::<InstanceId>()
                    .map_err(|_| Rejection::invalid("cursor", "is not a cursor of this list"))?
                    .to_string(),
            ),
            None => None,
        };
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let limit = i64::from(page.limit) + 1;
        let found = store::instances::list(&mut tx, caller.tenant_id.as_str(), after.as_deref(), limit).await?;
        tx.commit().await?;
        let found = found.into_iter().map(|i| (i.created.instance_id.to_string(), i)).collect();
        Ok(crate::reads::paged(found, page))
    }

    /// One instance of the caller's tenant, read from its stream (a created one is never answered 404).
    pub async fn instance(&self, caller: &Caller, id: &InstanceId) -> AppResult<Instance> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let found = store::instance_aggregate(&mut tx, id).await?;
        tx.commit().await?;
        match found {
            Some((i, _)) if i.created.tenant_id == caller.tenant_id => Ok(i),
            _ => Err(not_found(id)),
        }
    }

    /// Starts, stops or deletes an instance as `call` (`instances.start`, `.stop`, `.delete`). A deletion ends its
    /// allocation in the same transaction: released once its node has stopped it, or cancelled before it began.
    pub async fn change_instance_as(
        &self,
        call: &Call,
        id: &InstanceId,
        desired: DesiredState,
    ) -> AppResult<Committed<Instance>> {
        let method = match desired {
            DesiredState::Running => "instances.start",
            DesiredState::Stopped => "instances.stop",
            DesiredState::Deleted => "instances.delete",
        };
        let caller = self.authorize(call, method, Subject::Instance(id)).await?;
        self.change_instance(&caller, id, desired).await
    }

    /// [`App::change_instance_as`] as `caller`, deciding nothing.
    pub async fn change_instance(
        &self,
        caller: &Caller,
        id: &InstanceId,
        desired: DesiredState,
    ) -> AppResult<Committed<Instance>> {
        bc_eventstore::retry(&self.retry, || async {
            let mut tx = self.db.begin(TxOptions::COMMAND).await?;
            let decided = change_desired(&mut tx, caller, id, desired).await;
            tx.end(decided).await
        })
        .await
    }

    /// The instances the node is to run, with the atoms of each one's allocation and its image.
    pub async fn node_instances(&self, node: &NodeId) -> AppResult<Vec<AgentInstance>> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let found = store::instances::on_node(&mut tx, node).await?;
        tx.commit().await?;
        found.into_iter().map(for_agent).collect()
    }

    /// The bytes of the image an instance the node is to run boots from.
    pub async fn node_instance_image(&self, node: &NodeId, id: &InstanceId) -> AppResult<ImageContent> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let found = store::instances::on_node(&mut tx, node).await?;
        tx.commit().await?;
        let Some(found) = found.into_iter().find(|n| &n.instance.created.instance_id == id) else {
            return Err(Rejection::NotFound { kind: "instance on this node", id: id.to_string() }.into());
        };
        self.image_content(&found.instance.created.spec.image_id).await
    }

    /// The report of node `node` (whose agent acts as `caller`) of an instance it runs. Only the node of the instance's allocation reports it; a report
    /// that it is deleted, as its owner asked, releases the allocation in the same transaction.
    pub async fn report_instance(
        &self,
        node: &NodeId,
        caller: &Caller,
        id: &InstanceId,
        report: &InstanceReport,
    ) -> AppResult<Committed<Instance>> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let (caller, report) = (caller, report);
                async move {
                    let Some((i, version)) = store::instance_aggregate(tx, id).await? else {
                        return Err(not_found(id));
                    };
                    let allocated = store::instances::allocated_node(tx, &i.created.reservation_id).await?;
                    let now_ms = bc_eventstore::clock::compute_now_ms(tx).await?;
                    let events = instance::observe(
                        &i,
                        node,
                        allocated.as_ref(),
                        report.state,
                        report.generation,
                        report.message.clone(),
                        now_ms,
                    )?;
                    let deleted = events.iter().any(
                        |e| matches!(e, instance::InstanceEvent::Observed(o) if o.state == InstanceState::Deleted),
                    );
                    let state = events.iter().fold(Some(i.clone()), instance::evolve_instance).unwrap_or(i.clone());
                    let tenant = &i.created.tenant_id;
                    let mut position =
                        record(tx, caller, id.as_str(), tenant, ExpectedVersion::Exact(version), events).await?;
                    if deleted {
                        position = end_allocation(tx, caller, &i.created.reservation_id).await?.or(position);
                    }
                    Ok(Committed { value: state, position })
                }
                .scope_boxed()
            })
            .await
    }
}

/// Records the owner's wish for an instance and, for a deletion, ends its allocation.
async fn change_desired(
    tx: &mut Tx,
    caller: &Caller,
    id: &InstanceId,
    desired: DesiredState,
) -> AppResult<Committed<Instance>> {
    let (i, version) = match store::instance_aggregate(tx, id).await? {
        Some((i, version)) if i.created.tenant_id == caller.tenant_id => (i, version),
        _ => return Err(not_found(id)),
    };
    let now_ms = bc_eventstore::clock::compute_now_ms(tx).await?;
    let events = instance::change_desired(&i, desired, now_ms)?;
    let state = events.iter().fold(Some(i.clone()), instance::evolve_instance).unwrap_or(i.clone());
    let mut position =
        record(tx, caller, id.as_str(), &i.created.tenant_id, ExpectedVersion::Exact(version), events).await?;
    if desired == DesiredState::Deleted {
        position = end_allocation(tx, caller, &i.created.reservation_id).await?.or(position);
    }
    // Read again after a deletion: ending the allocation may have ended the instance.
    let state = match position {
        Some(_) if desired == DesiredState::Deleted => {
            store::instance_aggregate(tx, id).await?.map_or(state, |(i, _)| i)
        }
        _ => state,
    };
    Ok(Committed { value: state, position })
}

/// Ends an instance's allocation: releases it once begun (its node's agent confirms once the instance is
/// stopped), cancels it before. Nothing when it is over or already being released.
async fn end_allocation(
    tx: &mut Tx,
    caller: &Caller,
    reservation_id: &bc_domain::id::ReservationId,
) -> AppResult<Option<Position>> {
    let facts_call = store::facts::reservation_facts_call(reservation_id);
    let answer = tx.call(&facts_call).await?;
    let facts = store::facts::reservation_facts(reservation_id, answer)?;
    let Some((r, _)) = facts.reservation else {
        return Err(store::corrupt("an instance's reservation", "it has no stream"));
    };
    let now_ms = facts.now_ms;
    let command = match r.state {
        ReservationState::Pending | ReservationState::Placed | ReservationState::AwaitingConfirmation => {
            Command::Cancel { now_ms, reason: Some("its instance was deleted".to_owned()) }
        }
        ReservationState::Binding | ReservationState::Active => {
            crate::node_commands::with_agents(Command::Release { now_ms, awaiting: Vec::new() }, facts.agents.clone())
        }
        _ => return Ok(None),
    };
    let events = reservation::decide(&r, &command)?;
    let known = Known { agents: Some(&facts.agents), draining: Some(&facts.draining), with_commit: true };
    let done = apply_and_schedule_known(tx, caller, r, events, now_ms, &known).await?;
    Ok(done.position)
}
