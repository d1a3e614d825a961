//! Instances: a VM, microVM or single-tenant container on an allocation, made from a flavor and an image, with the
//! state its owner wants (`desiredState`) and the state its node last reported (`state`). The decisions here are
//! pure; the commands that record them (with the `binding: instance` reservation that holds the allocation) come
//! with the instances' API.

use serde::{Deserialize, Serialize};

use crate::Rejection;
use crate::domain_events;
use crate::flavor::FlavorSizes;
use crate::id::{FlavorId, Identity, ImageId, InstanceId, NodeId, PoolId, ProjectId, ReservationId, TenantId};

/// The most user data an instance carries (cloud-init's own limit is 16 KiB).
pub const MAX_USER_DATA: usize = 16 * 1024;

/// What the owner wants of an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DesiredState {
    Running,
    Stopped,
    /// Final: a deleted instance is never started again.
    Deleted,
}

impl DesiredState {
    pub fn as_str(self) -> &'static str {
        match self {
            DesiredState::Running => "running",
            DesiredState::Stopped => "stopped",
            DesiredState::Deleted => "deleted",
        }
    }
}

/// What an instance is, as its node last reported it (`pending` until then; `deleted` and `failed` are final).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstanceState {
    /// Not reported yet: waiting for its allocation, or for its node to start it.
    Pending,
    Running,
    Stopped,
    Deleted,
    Failed,
}

impl InstanceState {
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceState::Pending => "pending",
            InstanceState::Running => "running",
            InstanceState::Stopped => "stopped",
            InstanceState::Deleted => "deleted",
            InstanceState::Failed => "failed",
        }
    }

    pub fn is_final(self) -> bool {
        matches!(self, InstanceState::Deleted | InstanceState::Failed)
    }
}

/// What an instance is made of, as its creation asked.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceSpec {
    pub name: String,
    pub pool_id: PoolId,
    pub flavor_id: FlavorId,
    /// The flavor's sizes when the instance was made: a flavor deleted later changes nothing here.
    pub sizes: FlavorSizes,
    pub image_id: ImageId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<ProjectId>,
    /// Given to the guest as cloud-init user data.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub user_data: String,
    /// How long its allocation holds, in seconds (its reservation's window).
    pub duration_s: u64,
}

impl InstanceSpec {
    /// Checks the fields that need no lookup.
    pub fn check(&self) -> Result<(), Rejection> {
        crate::site::check_name("name", &self.name)?;
        self.sizes.check()?;
        if self.user_data.len() > MAX_USER_DATA || self.user_data.contains('\0') {
            return Err(Rejection::invalid("userData", format!("must be at most {MAX_USER_DATA} bytes, without NUL")));
        }
        crate::reservation::check_length_s("duration", self.duration_s)
    }

    /// A digest of the request, to tell a retry from a reuse of its idempotency key.
    pub fn hash(&self, desired: DesiredState) -> String {
        let bytes = rmp_serde::to_vec_named(&(self, desired)).unwrap_or_default();
        crate::sha256_hex(&bytes)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceCreated {
    pub instance_id: InstanceId,
    pub tenant_id: TenantId,
    pub identity: Identity,
    /// The `binding: instance` reservation that holds its allocation.
    pub reservation_id: ReservationId,
    /// Boxed: the events of a stream are one enum, sized by its largest variant.
    pub spec: Box<InstanceSpec>,
    /// Whether the image was verified by an allowed signer when the instance was made.
    pub image_verified: bool,
    pub desired: DesiredState,
    pub request_hash: String,
    pub at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceDesiredChanged {
    pub instance_id: InstanceId,
    pub desired: DesiredState,
    /// Counts the changes of `desired`: a node reports which one it acted on.
    pub generation: u64,
    pub at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceObserved {
    pub instance_id: InstanceId,
    pub node_id: NodeId,
    pub state: InstanceState,
    /// The generation of the desired state the node acted on.
    pub generation: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub at_ms: i64,
}

/// The instance is over because its allocation ended (its reservation released, cancelled, expired or failed):
/// nothing runs it any more, whatever its node last reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceEnded {
    pub instance_id: InstanceId,
    /// `deleted` when its owner deleted it or its window ran out, `failed` when its allocation failed.
    pub state: InstanceState,
    pub reason: String,
    pub at_ms: i64,
}

domain_events! {
    /// Events of an instance's stream.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub enum InstanceEvent {
        Created(InstanceCreated) = "instance.created",
        DesiredChanged(InstanceDesiredChanged) = "instance.desired_changed",
        Observed(InstanceObserved) = "instance.observed",
        Ended(InstanceEnded) = "instance.ended",
    }
}

/// An instance as its events left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    #[serde(flatten)]
    pub created: InstanceCreated,
    /// Named apart from the creation's own `desired` (the state first asked for), which is flattened beside it.
    #[serde(rename = "desiredState")]
    pub desired: DesiredState,
    pub generation: u64,
    pub state: InstanceState,
    /// The generation the node last acted on, and where it runs.
    pub observed_generation: u64,
    pub node_id: Option<NodeId>,
    pub message: Option<String>,
    pub version: u32,
}

pub fn evolve_instance(state: Option<Instance>, event: &InstanceEvent) -> Option<Instance> {
    match (state, event) {
        (None, InstanceEvent::Created(e)) => Some(Instance {
            created: e.clone(),
            desired: e.desired,
            generation: 1,
            state: InstanceState::Pending,
            observed_generation: 0,
            node_id: None,
            message: None,
            version: 1,
        }),
        (Some(i), InstanceEvent::DesiredChanged(e)) => {
            Some(Instance { desired: e.desired, generation: e.generation, version: i.version + 1, ..i })
        }
        (Some(i), InstanceEvent::Observed(e)) => Some(Instance {
            state: e.state,
            observed_generation: e.generation,
            node_id: Some(e.node_id.clone()),
            message: e.message.clone(),
            version: i.version + 1,
            ..i
        }),
        (Some(i), InstanceEvent::Ended(e)) => {
            Some(Instance { state: e.state, message: Some(e.reason.clone()), version: i.version + 1, ..i })
        }
        (state, _) => state,
    }
}

/// A new instance's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewInstance {
    pub instance_id: InstanceId,
    pub tenant_id: TenantId,
    pub identity: Identity,
    pub reservation_id: ReservationId,
    pub spec: InstanceSpec,
    pub image_verified: bool,
    pub desired: DesiredState,
    pub now_ms: i64,
}

/// `instances.create`: a new instance, or nothing for a retry of the same request (the same key and body);
/// the same key with another body is `IDEMPOTENCY_KEY_REUSED`. Only `running` or `stopped` may be asked for.
pub fn create(existing: Option<&Instance>, new: NewInstance) -> Result<Vec<InstanceEvent>, Rejection> {
    new.spec.check()?;
    if new.desired == DesiredState::Deleted {
        return Err(Rejection::invalid("desiredState", "a new instance is running or stopped"));
    }
    let hash = new.spec.hash(new.desired);
    if let Some(existing) = existing {
        return if existing.created.request_hash == hash {
            Ok(Vec::new())
        } else {
            Err(Rejection::KeyReused(format!(
                "the idempotency key was already used for a different request (instance {})",
                existing.created.instance_id
            )))
        };
    }
    Ok(vec![InstanceEvent::Created(InstanceCreated {
        instance_id: new.instance_id,
        tenant_id: new.tenant_id,
        identity: new.identity,
        reservation_id: new.reservation_id,
        spec: Box::new(new.spec),
        image_verified: new.image_verified,
        desired: new.desired,
        request_hash: hash,
        at_ms: new.now_ms,
    })])
}

/// `instances.start`, `instances.stop`, `instances.delete`: the desired state changed. Asking for what is already
/// desired records nothing; a deleted instance (or one that failed or was deleted) changes no more.
pub fn change_desired(i: &Instance, desired: DesiredState, now_ms: i64) -> Result<Vec<InstanceEvent>, Rejection> {
    if i.state.is_final() || (i.desired == DesiredState::Deleted && desired != DesiredState::Deleted) {
        let state = if i.state.is_final() { i.state.as_str() } else { "being deleted" };
        return Err(Rejection::Conflict(format!(
            "cannot {} instance {}: it is {state}",
            desired_verb(desired),
            i.created.instance_id
        )));
    }
    if i.desired == desired {
        return Ok(Vec::new());
    }
    Ok(vec![InstanceEvent::DesiredChanged(InstanceDesiredChanged {
        instance_id: i.created.instance_id.clone(),
        desired,
        generation: i.generation + 1,
        at_ms: now_ms,
    })])
}

fn desired_verb(desired: DesiredState) -> &'static str {
    match desired {
        DesiredState::Running => "start",
        DesiredState::Stopped => "stop",
        DesiredState::Deleted => "delete",
    }
}

/// A node's report of an instance: only the node of its allocation (`allocated`) reports it; a report for a
/// generation not yet asked for is refused; the same report again, or one after the end, records nothing.
pub fn observe(
    i: &Instance,
    node_id: &NodeId,
    allocated: Option<&NodeId>,
    state: InstanceState,
    generation: u64,
    message: Option<String>,
    now_ms: i64,
) -> Result<Vec<InstanceEvent>, Rejection> {
    if allocated != Some(node_id) {
        return Err(Rejection::NotFound { kind: "instance", id: i.created.instance_id.to_string() });
    }
    if state == InstanceState::Pending {
        return Err(Rejection::invalid("state", "a node reports running, stopped, deleted or failed"));
    }
    if generation == 0 || generation > i.generation {
        return Err(Rejection::invalid(
            "generation",
            format!("the instance's desired state is at generation {}", i.generation),
        ));
    }
    if let Some(message) = &message
        && (message.len() > 4096 || message.contains('\0'))
    {
        return Err(Rejection::invalid("message", "must be at most 4096 bytes, without NUL"));
    }
    if i.state.is_final() || generation < i.observed_generation {
        return Ok(Vec::new());
    }
    if i.state == state && i.observed_generation == generation && i.message == message {
        return Ok(Vec::new());
    }
    if state == InstanceState::Deleted && i.desired != DesiredState::Deleted {
        return Err(Rejection::Conflict(format!(
            "instance {} is not to be deleted: its desired state is {}",
            i.created.instance_id,
            i.desired.as_str()
        )));
    }
    Ok(vec![InstanceEvent::Observed(InstanceObserved {
        instance_id: i.created.instance_id.clone(),
        node_id: node_id.clone(),
        state,
        generation,
        message,
        at_ms: now_ms,
    })])
}

/// The instance's allocation ended (`reservation` names why): the instance is `deleted`, or `failed` when the
/// allocation failed. Nothing for an instance already over.
pub fn end(i: &Instance, failed: bool, reason: String, now_ms: i64) -> Vec<InstanceEvent> {
    if i.state.is_final() {
        return Vec::new();
    }
    let state = if failed { InstanceState::Failed } else { InstanceState::Deleted };
    vec![InstanceEvent::Ended(InstanceEnded {
        instance_id: i.created.instance_id.clone(),
        state,
        reason,
        at_ms: now_ms,
    })]
}

#[cfg(test)]
mod tests;
