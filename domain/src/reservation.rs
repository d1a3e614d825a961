//! Reservations: a tenant's claim on GPUs of one pool for a time window. The request and its validation, the
//! states and every legal transition between them (`decide`, pure), the events, and `evolve`.
//!
//! `draft` → `denied` | `awaiting-confirmation` | `pending`; `awaiting-confirmation` → `pending` | `cancelled`;
//! `pending` → `placed` | `failed` | `cancelled`; `placed` → `binding` | `cancelled` | `expired` | `failed`;
//! `binding` → `active` | `failed` | `releasing`; `active` → `releasing` | `expired`; `releasing` →
//! `released`. Every move to a terminal state ends the reservation's bookings at a recorded time.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::Rejection;
use crate::device::{AttrValue, DeviceClass};
use crate::domain_events;
use crate::id::{AllocationId, DeviceId, Identity, NodeId, PoolId, ProfileId, ProjectId, ReservationId, TenantId};
pub use explanation::Explanation;

/// The furthest ahead a window may start, and the longest a window may last.
pub const MAX_AHEAD_MS: i64 = 366 * 24 * 3600 * 1000;
/// How long a reservation without a start or deadline may wait in `pending`.
pub const DEFAULT_PENDING_WAIT_MS: i64 = 24 * 3600 * 1000;
/// The most atoms one reservation may ask for.
pub const MAX_COUNT: u32 = 4096;
/// The most whole nodes one `binding: node` reservation may ask for.
pub const MAX_NODES: u32 = 256;
/// The largest scalar amount one allocation may ask for (a quota's own ceiling).
pub const MAX_SCALAR: u64 = 1_000_000;

/// A reservation's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReservationState {
    Draft,
    Denied,
    AwaitingConfirmation,
    Pending,
    Placed,
    Binding,
    Active,
    Releasing,
    Released,
    Failed,
    Cancelled,
    Expired,
}

impl ReservationState {
    pub const ALL: [ReservationState; 12] = [
        ReservationState::Draft,
        ReservationState::Denied,
        ReservationState::AwaitingConfirmation,
        ReservationState::Pending,
        ReservationState::Placed,
        ReservationState::Binding,
        ReservationState::Active,
        ReservationState::Releasing,
        ReservationState::Released,
        ReservationState::Failed,
        ReservationState::Cancelled,
        ReservationState::Expired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReservationState::Draft => "draft",
            ReservationState::Denied => "denied",
            ReservationState::AwaitingConfirmation => "awaiting-confirmation",
            ReservationState::Pending => "pending",
            ReservationState::Placed => "placed",
            ReservationState::Binding => "binding",
            ReservationState::Active => "active",
            ReservationState::Releasing => "releasing",
            ReservationState::Released => "released",
            ReservationState::Failed => "failed",
            ReservationState::Cancelled => "cancelled",
            ReservationState::Expired => "expired",
        }
    }

    /// No transition leaves a terminal state.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            ReservationState::Denied
                | ReservationState::Failed
                | ReservationState::Cancelled
                | ReservationState::Released
                | ReservationState::Expired
        )
    }

    /// Whether the reservation holds atoms (and is charged against quota) in this state.
    pub fn holds_atoms(self) -> bool {
        matches!(
            self,
            ReservationState::Placed
                | ReservationState::Binding
                | ReservationState::Active
                | ReservationState::Releasing
        )
    }
}

impl fmt::Display for ReservationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the booked devices are handed to the tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Binding {
    /// CDI devices on the node, consumed by a workload manager there.
    #[default]
    Hold,
    /// A VPS instance's allocation: made by creating the instance, never through `reservations.create`.
    Instance,
    /// Whole nodes of a `tenantRoot` pool, deployed with the tenant's profile at the window's start and wiped
    /// at its end.
    Node,
}

impl Binding {
    pub fn as_str(self) -> &'static str {
        match self {
            Binding::Hold => "hold",
            Binding::Instance => "instance",
            Binding::Node => "node",
        }
    }
}

/// Where the atoms may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Topology {
    /// Every atom on one node.
    #[default]
    SameNode,
    /// The atoms spread evenly over `nodes` nodes, one allocation per node.
    Gang { nodes: u32 },
}

/// Which atoms qualify.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Selector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_product: Option<String>,
    /// Attributes the atom must have, with these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, AttrValue>,
}

/// What devices a reservation asks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRequest {
    pub class: DeviceClass,
    pub count: u32,
    #[serde(default)]
    pub selector: Selector,
    #[serde(default)]
    pub topology: Topology,
}

impl DeviceRequest {
    /// How many nodes the atoms spread over (for whole nodes, the count).
    pub fn nodes(&self) -> u32 {
        if self.class == DeviceClass::Node {
            return self.count.max(1);
        }
        match self.topology {
            Topology::SameNode => 1,
            Topology::Gang { nodes } => nodes.max(1),
        }
    }

    /// Atoms on each node.
    pub fn per_node(&self) -> u32 {
        self.count / self.nodes()
    }
}

/// A reservation request, in domain units (epoch milliseconds, seconds).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReservationRequest {
    pub pool_id: PoolId,
    pub devices: DeviceRequest,
    /// When the window starts; without it, the window starts when the reservation is placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ms: Option<i64>,
    pub duration_s: u64,
    pub binding: Binding,
    /// With it, the reservation lapses unless renewed within every period of this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<ProjectId>,
    /// The latest time it may still be placed; by default its start, or a day after the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<i64>,
    /// Whether it may wait in `pending` for capacity; `false` answers `CAPACITY_UNAVAILABLE` instead.
    pub wait: bool,
    /// The tenant's metal profile a `binding: node` reservation deploys on its nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_id: Option<ProfileId>,
    /// Scalar amounts (`vcpu`, `memoryGiB`, `disk`) each allocation holds on its node beside its atoms.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, u64>,
}

impl ReservationRequest {
    /// An hour-long hold of `count` devices of `class` on one node, starting when placed, with no lease,
    /// project or deadline, waiting in `pending` when the pool is full.
    pub fn hold(pool_id: PoolId, class: DeviceClass, count: u32) -> Self {
        ReservationRequest {
            pool_id,
            devices: DeviceRequest { class, count, selector: Selector::default(), topology: Topology::SameNode },
            start_ms: None,
            duration_s: 3600,
            binding: Binding::Hold,
            lease_seconds: None,
            project_id: None,
            deadline_ms: None,
            wait: true,
            profile_id: None,
            resources: BTreeMap::new(),
        }
    }

    /// Checks the ranges of the request's times that need no clock: its instants (see [`crate::instant`]), its
    /// length and its lease. Applied before the request reaches the database or any sum of its times, and again
    /// by [`ReservationRequest::check`].
    pub fn check_bounds(&self) -> Result<(), Rejection> {
        crate::instant::check_opt_epoch_ms("start", self.start_ms)?;
        crate::instant::check_opt_epoch_ms("deadline", self.deadline_ms)?;
        check_length_s("duration", self.duration_s)?;
        self.lease_seconds.map_or(Ok(()), |lease| check_length_s("leaseSeconds", lease))
    }

    /// Checks the request against the rules that need no lookup. `now_ms` is the command's time.
    pub fn check(&self, now_ms: i64) -> Result<(), Rejection> {
        self.check_bounds()?;
        let devices = &self.devices;
        match (self.binding, devices.class) {
            (Binding::Node, DeviceClass::Node) => {
                if devices.count == 0 || devices.count > MAX_NODES {
                    return Err(Rejection::invalid("devices.count", format!("must be from 1 to {MAX_NODES} nodes")));
                }
                if devices.topology != Topology::SameNode {
                    return Err(Rejection::invalid(
                        "devices.topology",
                        "does not apply to whole nodes: each node is one atom (leave it out)",
                    ));
                }
                if self.profile_id.is_none() {
                    return Err(Rejection::invalid(
                        "profileId",
                        "a node binding names the metal profile its nodes are deployed with",
                    ));
                }
            }
            (Binding::Node, _) => {
                return Err(Rejection::invalid("devices.class", "a node binding reserves whole nodes: class node"));
            }
            (Binding::Hold | Binding::Instance, DeviceClass::Node) => {
                return Err(Rejection::invalid("binding", "whole nodes are reserved with binding node"));
            }
            (Binding::Hold | Binding::Instance, DeviceClass::Gpu | DeviceClass::GpuMig | DeviceClass::GpuSlot) => {}
            (Binding::Hold | Binding::Instance, _) => {
                return Err(Rejection::invalid(
                    "devices.class",
                    "only gpu, gpu.mig and gpu.slot atoms, or whole nodes, can be reserved",
                ));
            }
        }
        for (resource, amount) in &self.resources {
            if !crate::pool::SCALAR_RESOURCES.contains(&resource.as_str()) {
                return Err(Rejection::invalid(
                    format!("resources.{resource}"),
                    format!("is not a scalar resource; allocations hold {}", crate::pool::SCALAR_RESOURCES.join(", ")),
                ));
            }
            if *amount == 0 || *amount > MAX_SCALAR {
                return Err(Rejection::invalid(
                    format!("resources.{resource}"),
                    format!("must be from 1 to {MAX_SCALAR}"),
                ));
            }
        }
        if self.binding == Binding::Node && !self.resources.is_empty() {
            return Err(Rejection::invalid("resources", "a whole node holds every resource it has (leave it out)"));
        }
        if self.binding != Binding::Node && self.profile_id.is_some() {
            return Err(Rejection::invalid("profileId", "only a node binding deploys a profile"));
        }
        if devices.count == 0 || devices.count > MAX_COUNT {
            return Err(Rejection::invalid("devices.count", format!("must be from 1 to {MAX_COUNT}")));
        }
        if let Topology::Gang { nodes } = devices.topology {
            if nodes < 2 {
                return Err(Rejection::invalid("devices.topology.nodes", "a gang spans at least 2 nodes"));
            }
            if !devices.count.is_multiple_of(nodes) {
                return Err(Rejection::invalid(
                    "devices.topology.nodes",
                    format!("{} atoms do not spread evenly over {nodes} nodes", devices.count),
                ));
            }
        }
        for (field, value) in [
            ("devices.selector.gpuModel", &devices.selector.gpu_model),
            ("devices.selector.gpuProduct", &devices.selector.gpu_product),
        ] {
            if value.as_ref().is_some_and(|v| v.is_empty() || v.len() > 64) {
                return Err(Rejection::invalid(field, "must be 1 to 64 characters"));
            }
        }
        crate::device::check_no_nul("devices.selector", &devices.selector)?;
        if let Some(start_ms) = self.start_ms {
            if start_ms % 1000 != 0 {
                return Err(Rejection::invalid("start", "must fall on a whole second"));
            }
            if start_ms < now_ms - 1000 {
                return Err(Rejection::invalid("start", "is in the past"));
            }
            if start_ms > now_ms + MAX_AHEAD_MS {
                return Err(Rejection::invalid("start", "is more than 366 days ahead"));
            }
        }
        if let Some(deadline) = self.deadline_ms {
            if deadline < now_ms {
                return Err(Rejection::invalid("deadline", "is in the past"));
            }
            if self.start_ms.is_some_and(|start| deadline > start) {
                return Err(Rejection::invalid(
                    "deadline",
                    "is after the start: a window cannot be placed once it began",
                ));
            }
        }
        Ok(())
    }

    /// The last moment the reservation may still be placed.
    pub fn pending_deadline(&self, requested_at_ms: i64) -> i64 {
        self.deadline_ms.or(self.start_ms).unwrap_or(requested_at_ms + DEFAULT_PENDING_WAIT_MS)
    }

    /// A digest of the request, to tell a retry from a reuse of its idempotency key.
    pub fn hash(&self) -> String {
        let bytes = rmp_serde::to_vec_named(self).unwrap_or_default();
        crate::sha256_hex(&bytes)
    }

    /// The quota resource the request is charged against: its device class.
    pub fn resource(&self) -> &'static str {
        self.devices.class.as_str()
    }

    /// The scalar amounts the whole request holds (each allocation's amount times its nodes), by resource.
    pub fn scalar_totals(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        let nodes = u64::from(self.devices.nodes());
        self.resources.iter().map(move |(resource, amount)| (resource.as_str(), amount * nodes))
    }
}

/// Refuses a length in seconds (a window's, a lease's) outside 1 second to 366 days, naming `field`.
pub fn check_length_s(field: &str, seconds: u64) -> Result<(), Rejection> {
    if seconds == 0 || seconds > (MAX_AHEAD_MS / 1000) as u64 {
        return Err(Rejection::invalid(field, "must be from 1 second to 366 days"));
    }
    Ok(())
}

/// Whether a window starting at `start_ms` has a whole-second end.
fn window_end(start_ms: i64, duration_s: u64) -> i64 {
    start_ms + duration_s as i64 * 1000
}

/// One node's share of a reservation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Allocation {
    pub allocation_id: AllocationId,
    pub node_id: NodeId,
    /// Its atoms, in device id order.
    pub devices: Vec<DeviceId>,
    /// The scalar amounts it holds on its node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, u64>,
}

/// Why an active or placed reservation expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExpiryCause {
    WindowEnded,
    LeaseLapsed,
    /// Its node was drained or deleted with force while it ran.
    Preempted,
}

impl ExpiryCause {
    pub fn as_str(self) -> &'static str {
        match self {
            ExpiryCause::WindowEnded => "window-ended",
            ExpiryCause::LeaseLapsed => "lease-lapsed",
            ExpiryCause::Preempted => "preempted",
        }
    }
}

/// Why a reservation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureReason {
    /// Still pending at its deadline.
    DeadlinePassed,
    /// The pool's pending queue was full.
    MaxPending,
    /// Its node was lost or removed and no re-placement fits.
    NodeLost,
    /// The binding never completed.
    BindingTimedOut,
    /// A node's agent could not hand the devices over.
    BindingFailed,
    /// A provider pool's provider refused to lend a machine for it for good (the account's credential or the
    /// request was refused, not a lack of capacity).
    ProviderRefused,
}

impl FailureReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::DeadlinePassed => "deadline-passed",
            FailureReason::MaxPending => "max-pending",
            FailureReason::NodeLost => "node-lost",
            FailureReason::BindingTimedOut => "binding-timed-out",
            FailureReason::BindingFailed => "binding-failed",
            FailureReason::ProviderRefused => "provider-refused",
        }
    }
}

/// The request accepted: the reservation exists, waiting for capacity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Requested {
    pub reservation_id: ReservationId,
    pub tenant_id: TenantId,
    pub identity: Identity,
    pub request: ReservationRequest,
    pub request_hash: String,
    /// The governing offering's priority (pending reservations are retried by it, then first come).
    pub priority: i32,
    /// The tenant whose offering's quota the reservation is charged against (the caller's own offer, or an
    /// ancestor's with `includeDescendants`); `None` for the pool's owner, who is not quota-limited. Later
    /// placements read that offering's quota as it is then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota_holder: Option<TenantId>,
    pub pending_deadline_ms: i64,
    pub at_ms: i64,
    /// Why it did not fit when requested, when it was left pending by the call that requested it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explanation: Option<Box<Explanation>>,
}

/// The request refused by authorization: recorded, booking and charging nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Denied {
    pub reservation_id: ReservationId,
    pub tenant_id: TenantId,
    pub identity: Identity,
    pub request: ReservationRequest,
    pub request_hash: String,
    pub reason: String,
    pub at_ms: i64,
}

/// Placed: its atoms are booked for `[start_ms, end_ms)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Placed {
    pub allocations: Vec<Allocation>,
    pub start_ms: i64,
    pub end_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_deadline_ms: Option<i64>,
    pub at_ms: i64,
    /// Why these atoms: the reads the placement made, the nodes it chose and the quota line it was within.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explanation: Option<Box<Explanation>>,
}

/// A transition that carries only its time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct At {
    pub at_ms: i64,
}

/// Cancelled before its start; its bookings end at `at_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cancelled {
    pub at_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Released: its bookings end at `at_ms`, the time the tenant released it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Released {
    pub at_ms: i64,
    /// Set when an agent never confirmed taking the devices back before the release timed out.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unconfirmed: bool,
}

/// A hand-over of devices that began (a binding at the start, or a release): the nodes whose agents must
/// confirm it. Empty when no node of the reservation runs an agent, and then it completes at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HandOver {
    pub at_ms: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub awaiting: Vec<NodeId>,
}

/// Placed again before its start, because a node it was placed on was lost, put in maintenance, drained or
/// deleted: the old bookings end and the new ones cover the same window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Replaced {
    pub allocations: Vec<Allocation>,
    /// The node that could no longer hold it.
    pub from_node: NodeId,
    pub reason: String,
    pub at_ms: i64,
}

/// Expired: its bookings end at `at_ms`, the recorded end (the window's end or the lease deadline).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Expired {
    pub at_ms: i64,
    pub cause: ExpiryCause,
}

/// Failed: its bookings (if any) end at `at_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Failed {
    pub at_ms: i64,
    pub reason: FailureReason,
}

/// The allocation lease renewed until `lease_deadline_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Renewed {
    pub lease_deadline_ms: i64,
    pub at_ms: i64,
}

/// The window lengthened to `end_ms`, on the same atoms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Extended {
    pub previous_end_ms: i64,
    pub end_ms: i64,
    pub at_ms: i64,
}

domain_events! {
    /// Events of a reservation's stream.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub enum ReservationEvent {
        Requested(Requested) = "reservation.requested",
        Denied(Denied) = "reservation.denied",
        Placed(Placed) = "reservation.placed",
        BindingStarted(HandOver) = "reservation.binding_started",
        Activated(At) = "reservation.activated",
        Cancelled(Cancelled) = "reservation.cancelled",
        ReleaseRequested(HandOver) = "reservation.release_requested",
        Released(Released) = "reservation.released",
        Expired(Expired) = "reservation.expired",
        Failed(Failed) = "reservation.failed",
        Renewed(Renewed) = "reservation.renewed",
        Extended(Extended) = "reservation.extended",
        Replaced(Replaced) = "reservation.replaced",
    }
}

impl ReservationEvent {
    /// Whether this event opens a reservation's stream (and can only be its first): a request, or a denial recorded
    /// in its place.
    pub fn opens_stream(&self) -> bool {
        matches!(self, ReservationEvent::Requested(_) | ReservationEvent::Denied(_))
    }

    /// The state this event moves a reservation to; `None` for the events that keep its state (renewals and
    /// extensions).
    pub fn state_after(&self) -> Option<ReservationState> {
        Self::state_after_type(crate::event::DomainEvent::event_type(self))
    }

    /// [`ReservationEvent::state_after`] from the event's type alone, for a reader that does not decode the
    /// payload; `None` also for a type of another family.
    pub fn state_after_type(event_type: &str) -> Option<ReservationState> {
        Some(match event_type {
            "reservation.requested" => ReservationState::Pending,
            "reservation.denied" => ReservationState::Denied,
            "reservation.placed" => ReservationState::Placed,
            "reservation.binding_started" => ReservationState::Binding,
            "reservation.activated" => ReservationState::Active,
            "reservation.cancelled" => ReservationState::Cancelled,
            "reservation.release_requested" => ReservationState::Releasing,
            "reservation.released" => ReservationState::Released,
            "reservation.expired" => ReservationState::Expired,
            "reservation.failed" => ReservationState::Failed,
            // Renewals, extensions and replacements keep the state.
            _ => return None,
        })
    }

    /// Why a reservation ended, in words, when this event ends it: the denial's or the cancel's reason, the
    /// failure reason or the expiry cause (`node-lost`, `window-ended`, ...). `None` for the other events, a
    /// release, and a cancel that gave no reason. Every place that shows an outcome reads it from here.
    pub fn outcome(&self) -> Option<String> {
        match self {
            ReservationEvent::Denied(e) => Some(e.reason.clone()),
            ReservationEvent::Cancelled(e) => e.reason.clone(),
            ReservationEvent::Expired(e) => Some(e.cause.as_str().to_owned()),
            ReservationEvent::Failed(e) => Some(e.reason.as_str().to_owned()),
            _ => None,
        }
    }

    /// When this event ends the reservation's bookings, the time they end.
    pub fn ends_bookings_at(&self) -> Option<i64> {
        match self {
            ReservationEvent::Cancelled(e) => Some(e.at_ms),
            ReservationEvent::Released(e) => Some(e.at_ms),
            ReservationEvent::Expired(e) => Some(e.at_ms),
            ReservationEvent::Failed(e) => Some(e.at_ms),
            _ => None,
        }
    }
}

/// A reservation's state: the fold of its events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    pub id: ReservationId,
    pub tenant_id: TenantId,
    pub identity: Identity,
    pub request: ReservationRequest,
    pub request_hash: String,
    pub state: ReservationState,
    pub priority: i32,
    pub quota_holder: Option<TenantId>,
    pub requested_at_ms: i64,
    pub pending_deadline_ms: i64,
    pub allocations: Vec<Allocation>,
    pub start_ms: Option<i64>,
    pub end_ms: Option<i64>,
    pub lease_deadline_ms: Option<i64>,
    pub release_requested_at_ms: Option<i64>,
    /// When the current hand-over (binding or release) began, and the nodes whose agents must still confirm it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hand_over_at_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub awaiting: Vec<NodeId>,
    /// When it ended (its bookings' recorded end), once terminal.
    pub ended_at_ms: Option<i64>,
    /// Why it ended, in words, once terminal (see [`ReservationEvent::outcome`]); `None` for a plain release
    /// or a cancel without a reason.
    #[serde(default)]
    pub outcome: Option<String>,
    pub expiry_cause: Option<ExpiryCause>,
    pub failure_reason: Option<FailureReason>,
    pub denial_reason: Option<String>,
    /// The explanation of its last placement decision (placed, left pending, or denied), as recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explanation: Option<Box<Explanation>>,
    /// The number of events folded.
    pub version: u32,
}

impl Reservation {
    /// The state a stream's first event starts from: a draft as requested at `at_ms`.
    fn recorded(
        id: &ReservationId,
        tenant_id: &TenantId,
        identity: &Identity,
        request: &ReservationRequest,
        request_hash: &str,
        at_ms: i64,
    ) -> Self {
        Reservation {
            id: id.clone(),
            tenant_id: tenant_id.clone(),
            identity: identity.clone(),
            request: request.clone(),
            request_hash: request_hash.to_owned(),
            state: ReservationState::Draft,
            priority: 0,
            quota_holder: None,
            requested_at_ms: at_ms,
            pending_deadline_ms: at_ms,
            allocations: Vec::new(),
            start_ms: None,
            end_ms: None,
            lease_deadline_ms: None,
            release_requested_at_ms: None,
            hand_over_at_ms: None,
            awaiting: Vec::new(),
            ended_at_ms: None,
            outcome: None,
            expiry_cause: None,
            failure_reason: None,
            denial_reason: None,
            explanation: None,
            version: 1,
        }
    }
}

/// Applies one event. No decisions here: `decide` made them; this only records them.
pub fn evolve(state: Option<Reservation>, event: &ReservationEvent) -> Option<Reservation> {
    let mut r = match (state, event) {
        (None, ReservationEvent::Requested(e)) => {
            let mut r = Reservation::recorded(
                &e.reservation_id,
                &e.tenant_id,
                &e.identity,
                &e.request,
                &e.request_hash,
                e.at_ms,
            );
            r.state = ReservationState::Pending;
            r.priority = e.priority;
            r.quota_holder = e.quota_holder.clone();
            r.pending_deadline_ms = e.pending_deadline_ms;
            r.explanation = e.explanation.clone();
            return Some(r);
        }
        (None, ReservationEvent::Denied(e)) => {
            let mut r = Reservation::recorded(
                &e.reservation_id,
                &e.tenant_id,
                &e.identity,
                &e.request,
                &e.request_hash,
                e.at_ms,
            );
            r.state = ReservationState::Denied;
            r.ended_at_ms = Some(e.at_ms);
            r.denial_reason = Some(e.reason.clone());
            r.outcome = event.outcome();
            let start = e.request.start_ms.unwrap_or(e.at_ms);
            r.explanation =
                Some(Box::new(Explanation::denied((start, window_end(start, e.request.duration_s)), &e.reason)));
            return Some(r);
        }
        (None, _) => return None,
        (Some(r), _) => r,
    };
    r.version += 1;
    match event {
        ReservationEvent::Requested(_) | ReservationEvent::Denied(_) => {}
        ReservationEvent::Placed(e) => {
            r.state = ReservationState::Placed;
            r.allocations = e.allocations.clone();
            r.start_ms = Some(e.start_ms);
            r.end_ms = Some(e.end_ms);
            r.lease_deadline_ms = e.lease_deadline_ms;
            if e.explanation.is_some() {
                r.explanation = e.explanation.clone();
            }
        }
        ReservationEvent::BindingStarted(e) => {
            r.state = ReservationState::Binding;
            r.hand_over_at_ms = Some(e.at_ms);
            r.awaiting = e.awaiting.clone();
        }
        ReservationEvent::Activated(_) => {
            r.state = ReservationState::Active;
            r.hand_over_at_ms = None;
            r.awaiting.clear();
        }
        ReservationEvent::Cancelled(e) => {
            r.state = ReservationState::Cancelled;
            r.ended_at_ms = Some(e.at_ms);
        }
        ReservationEvent::ReleaseRequested(e) => {
            r.state = ReservationState::Releasing;
            r.release_requested_at_ms = Some(e.at_ms);
            r.hand_over_at_ms = Some(e.at_ms);
            r.awaiting = e.awaiting.clone();
        }
        ReservationEvent::Released(e) => {
            r.state = ReservationState::Released;
            r.ended_at_ms = Some(e.at_ms);
        }
        ReservationEvent::Expired(e) => {
            r.state = ReservationState::Expired;
            r.ended_at_ms = Some(e.at_ms);
            r.expiry_cause = Some(e.cause);
        }
        ReservationEvent::Failed(e) => {
            r.state = ReservationState::Failed;
            r.ended_at_ms = Some(e.at_ms);
            r.failure_reason = Some(e.reason);
        }
        ReservationEvent::Renewed(e) => r.lease_deadline_ms = Some(e.lease_deadline_ms),
        ReservationEvent::Extended(e) => r.end_ms = Some(e.end_ms),
        ReservationEvent::Replaced(e) => r.allocations = e.allocations.clone(),
    }
    if r.state.is_terminal() {
        r.hand_over_at_ms = None;
        r.awaiting.clear();
    }
    if event.ends_bookings_at().is_some() {
        r.outcome = event.outcome();
    }
    Some(r)
}

/// Folds a stream's events, in version order.
pub fn fold<'a>(events: impl IntoIterator<Item = &'a ReservationEvent>) -> Option<Reservation> {
    events.into_iter().fold(None, evolve)
}

/// A new reservation request, ready to be recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRequest {
    pub reservation_id: ReservationId,
    pub tenant_id: TenantId,
    pub identity: Identity,
    pub request: ReservationRequest,
    pub priority: i32,
    pub quota_holder: Option<TenantId>,
    pub now_ms: i64,
}

/// Records a new request (validated first), or answers a retry of one already recorded: the same request
/// under the same id is no new event; another request under the same id is `IDEMPOTENCY_KEY_REUSED`.
pub fn request(existing: Option<&Reservation>, new: NewRequest) -> Result<Vec<ReservationEvent>, Rejection> {
    let hash = new.request.hash();
    if let Some(existing) = existing {
        if existing.request_hash == hash {
            return Ok(Vec::new());
        }
        return Err(Rejection::IdempotencyKeyReused { reservation_id: existing.id.to_string() });
    }
    new.request.check(new.now_ms)?;
    Ok(vec![ReservationEvent::Requested(Requested {
        pending_deadline_ms: new.request.pending_deadline(new.now_ms),
        reservation_id: new.reservation_id,
        tenant_id: new.tenant_id,
        identity: new.identity,
        request_hash: hash,
        request: new.request,
        priority: new.priority,
        quota_holder: new.quota_holder,
        at_ms: new.now_ms,
        explanation: None,
    })])
}

/// Records `explanation` on the decision among `events` it explains: the placement, or else the request left
/// pending. Nothing when neither is among them.
pub fn explain(events: &mut [ReservationEvent], explanation: Explanation) {
    let decision = events.iter_mut().rev().find_map(|event| match event {
        ReservationEvent::Placed(e) => Some(&mut e.explanation),
        ReservationEvent::Requested(e) => Some(&mut e.explanation),
        _ => None,
    });
    if let Some(slot) = decision {
        *slot = Some(Box::new(explanation));
    }
}

/// A command on an existing reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Book the planned atoms for the window starting at `start_ms` (or now, rounded up to a second).
    Place {
        allocations: Vec<Allocation>,
        now_ms: i64,
    },
    /// The window began: hand the devices over, on the agents of `awaiting` (empty: nothing to wait for).
    StartBinding {
        now_ms: i64,
        awaiting: Vec<NodeId>,
    },
    /// The devices were handed over.
    Activate {
        now_ms: i64,
    },
    Cancel {
        now_ms: i64,
        reason: Option<String>,
    },
    /// The tenant released it: take the devices back, on the agents of `awaiting`.
    Release {
        now_ms: i64,
        awaiting: Vec<NodeId>,
    },
    /// The devices were taken back after a release (`unconfirmed`: the agents never said so in time).
    CompleteRelease {
        now_ms: i64,
        unconfirmed: bool,
    },
    /// Move a placed reservation off `from_node` onto new atoms for the same window.
    Replace {
        allocations: Vec<Allocation>,
        from_node: NodeId,
        reason: String,
        now_ms: i64,
    },
    Expire {
        cause: ExpiryCause,
        now_ms: i64,
    },
    Fail {
        reason: FailureReason,
        now_ms: i64,
    },
    Renew {
        now_ms: i64,
    },
    /// Lengthen the window to `end_ms`.
    Extend {
        end_ms: i64,
        now_ms: i64,
    },
}

impl Command {
    /// The verb, for error messages.
    pub fn verb(&self) -> &'static str {
        match self {
            Command::Place { .. } => "place",
            Command::StartBinding { .. } => "start binding",
            Command::Activate { .. } => "activate",
            Command::Cancel { .. } => "cancel",
            Command::Release { .. } => "release",
            Command::CompleteRelease { .. } => "complete the release of",
            Command::Replace { .. } => "place again",
            Command::Expire { .. } => "expire",
            Command::Fail { .. } => "fail",
            Command::Renew { .. } => "renew",
            Command::Extend { .. } => "extend",
        }
    }
}

/// The start a window gets when placed at `now_ms`: its requested start, or now rounded up to a whole second
/// (so it never overlaps a booking that ended at `now_ms`).
pub fn placed_start(request: &ReservationRequest, now_ms: i64) -> i64 {
    request.start_ms.unwrap_or_else(|| now_ms.div_euclid(1000) * 1000 + if now_ms % 1000 == 0 { 0 } else { 1000 })
}

/// The window a reservation placed at `now_ms` gets: `[placed_start, placed_start + duration)`.
pub fn placed_window(request: &ReservationRequest, now_ms: i64) -> (i64, i64) {
    let start = placed_start(request, now_ms);
    (start, window_end(start, request.duration_s))
}

/// Decides a command on a reservation: the events it causes, or why it is refused.
pub fn decide(r: &Reservation, command: &Command) -> Result<Vec<ReservationEvent>, Rejection> {
    use ReservationState as S;
    let wrong_state = || Rejection::WrongState { verb: command.verb(), state: r.state };
    match command {
        Command::Place { allocations, now_ms } => {
            if r.state != S::Pending {
                return Err(wrong_state());
            }
            let planned: u32 = allocations.iter().map(|a| a.devices.len() as u32).sum();
            if planned != r.request.devices.count || allocations.len() as u32 != r.request.devices.nodes() {
                return Err(Rejection::invalid("allocations", "do not match the request's count and topology"));
            }
            let start_ms = placed_start(&r.request, *now_ms);
            Ok(vec![ReservationEvent::Placed(Placed {
                allocations: allocations.clone(),
                start_ms,
                end_ms: window_end(start_ms, r.request.duration_s),
                lease_deadline_ms: r.request.lease_seconds.map(|lease| now_ms + lease as i64 * 1000),
                at_ms: *now_ms,
                explanation: None,
            })])
        }
        Command::StartBinding { now_ms, awaiting } => {
            if r.state != S::Placed {
                return Err(wrong_state());
            }
            if r.start_ms.is_some_and(|start| *now_ms < start) {
                return Err(Rejection::Conflict(format!("the window starts at {}", r.start_ms.unwrap_or_default())));
            }
            Ok(vec![ReservationEvent::BindingStarted(HandOver { at_ms: *now_ms, awaiting: awaiting.clone() })])
        }
        Command::Activate { now_ms } => match r.state {
            S::Binding => Ok(vec![ReservationEvent::Activated(At { at_ms: *now_ms })]),
            _ => Err(wrong_state()),
        },
        Command::Cancel { now_ms, reason } => match r.state {
            S::Pending | S::Placed | S::AwaitingConfirmation => {
                Ok(vec![ReservationEvent::Cancelled(Cancelled { at_ms: *now_ms, reason: reason.clone() })])
            }
            _ => Err(wrong_state()),
        },
        Command::Release { now_ms, awaiting } => match r.state {
            S::Binding | S::Active => {
                Ok(vec![ReservationEvent::ReleaseRequested(HandOver { at_ms: *now_ms, awaiting: awaiting.clone() })])
            }
            _ => Err(wrong_state()),
        },
        Command::CompleteRelease { now_ms, unconfirmed } => match r.state {
            S::Releasing => {
                let at_ms = r.release_requested_at_ms.unwrap_or(*now_ms);
                Ok(vec![ReservationEvent::Released(Released { at_ms, unconfirmed: *unconfirmed })])
            }
            _ => Err(wrong_state()),
        },
        Command::Replace { allocations, from_node, reason, now_ms } => {
            if r.state != S::Placed {
                return Err(wrong_state());
            }
            if r.start_ms.is_some_and(|start| *now_ms >= start) {
                return Err(Rejection::Conflict("the window already began".to_owned()));
            }
            let planned: u32 = allocations.iter().map(|a| a.devices.len() as u32).sum();
            if planned != r.request.devices.count || allocations.len() as u32 != r.request.devices.nodes() {
                return Err(Rejection::invalid("allocations", "do not match the request's count and topology"));
            }
            Ok(vec![ReservationEvent::Replaced(Replaced {
                allocations: allocations.clone(),
                from_node: from_node.clone(),
                reason: reason.clone(),
                at_ms: *now_ms,
            })])
        }
        Command::Expire { cause, now_ms } => {
            let at_ms = match (r.state, cause) {
                (S::Placed, ExpiryCause::LeaseLapsed) | (S::Active, ExpiryCause::LeaseLapsed) => {
                    match r.lease_deadline_ms {
                        Some(deadline) if *now_ms > deadline => deadline,
                        _ => return Err(Rejection::Conflict("the allocation lease has not lapsed".to_owned())),
                    }
                }
                (S::Active, ExpiryCause::Preempted) => *now_ms,
                (S::Active, ExpiryCause::WindowEnded) => match r.end_ms {
                    Some(end) if *now_ms >= end => end,
                    _ => return Err(Rejection::Conflict("the window has not ended".to_owned())),
                },
                _ => return Err(wrong_state()),
            };
            Ok(vec![ReservationEvent::Expired(Expired { at_ms, cause: *cause })])
        }
        Command::Fail { reason, now_ms } => {
            let allowed = matches!(
                (r.state, reason),
                (
                    S::Pending,
                    FailureReason::DeadlinePassed | FailureReason::MaxPending | FailureReason::ProviderRefused
                ) | (S::Placed, FailureReason::NodeLost)
                    | (S::Binding, FailureReason::BindingTimedOut | FailureReason::BindingFailed)
            );
            if !allowed {
                return Err(wrong_state());
            }
            let at_ms = match reason {
                FailureReason::DeadlinePassed => r.pending_deadline_ms.min(*now_ms),
                _ => *now_ms,
            };
            Ok(vec![ReservationEvent::Failed(Failed { at_ms, reason: *reason })])
        }
        Command::Renew { now_ms } => {
            if !matches!(r.state, S::Placed | S::Binding | S::Active) {
                return Err(wrong_state());
            }
            let (Some(lease), Some(deadline)) = (r.request.lease_seconds, r.lease_deadline_ms) else {
                return Err(Rejection::Conflict(format!("reservation {} has no allocation lease to renew", r.id)));
            };
            if *now_ms > deadline {
                return Err(Rejection::Conflict(format!(
                    "the allocation lease lapsed at {deadline}; a renew after its deadline is refused"
                )));
            }
            Ok(vec![ReservationEvent::Renewed(Renewed {
                lease_deadline_ms: now_ms + lease as i64 * 1000,
                at_ms: *now_ms,
            })])
        }
        Command::Extend { end_ms, now_ms } => {
            if !matches!(r.state, S::Placed | S::Binding | S::Active) {
                return Err(wrong_state());
            }
            let (Some(start), Some(end)) = (r.start_ms, r.end_ms) else {
                return Err(wrong_state());
            };
            crate::instant::check_epoch_ms("end", *end_ms)?;
            if end_ms % 1000 != 0 {
                return Err(Rejection::invalid("end", "must fall on a whole second"));
            }
            if *end_ms <= end {
                return Err(Rejection::invalid("end", format!("must be after the current end {end}")));
            }
            if end_ms - start > MAX_AHEAD_MS {
                return Err(Rejection::invalid("end", "a window lasts at most 366 days"));
            }
            if *now_ms >= end {
                return Err(Rejection::Conflict("the window already ended".to_owned()));
            }
            Ok(vec![ReservationEvent::Extended(Extended { previous_end_ms: end, end_ms: *end_ms, at_ms: *now_ms })])
        }
    }
}

/// How long agents have to confirm a binding (then it fails) or a release (then it completes unconfirmed).
pub const HAND_OVER_TIMEOUT_MS: i64 = 120_000;
/// How long whole nodes have to be deployed (a binding) or wiped (a release): the workflows' own step timeouts
/// end them sooner when a step hangs; this bounds the wait for a node still being wiped after its previous
/// tenant.
pub const NODE_HAND_OVER_TIMEOUT_MS: i64 = 3 * 3600 * 1000;

/// When a hand-over waiting until `deadline` looks again: whole nodes are looked at every
/// [`whole_nodes::NODE_POLL_MS`] (their workflows wake it sooner), agents' hand-overs only at the deadline (their
/// acknowledgements wake it).
fn poll_whole_nodes(r: &Reservation, now_ms: i64, deadline: i64) -> i64 {
    match r.request.binding {
        Binding::Node => deadline.min(now_ms + whole_nodes::NODE_POLL_MS),
        Binding::Hold | Binding::Instance => deadline,
    }
}

/// How long a reservation's hand-overs may take.
pub fn hand_over_timeout_ms(r: &Reservation) -> i64 {
    match r.request.binding {
        Binding::Node => NODE_HAND_OVER_TIMEOUT_MS,
        Binding::Hold | Binding::Instance => HAND_OVER_TIMEOUT_MS,
    }
}

/// What the reservation's work-queue job should do at `now_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Due {
    /// Nothing more will ever be due.
    Done,
    /// Try to place it now; then look again at `wake_at_ms` (its deadline).
    TryPlace { wake_at_ms: i64 },
    /// Apply this command (then look again).
    Apply(Command),
    /// Nothing to do before `wake_at_ms`.
    WakeAt(i64),
}

/// When the work queue should look at a reservation next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextLook {
    /// Nothing more will ever be due.
    Never,
    /// Something is due now.
    Now,
    /// Nothing is due before this time (epoch ms).
    At(i64),
}

/// When the work queue should look at `r` next, given what is [`due`] at `now_ms`.
pub fn next_look(r: &Reservation, now_ms: i64) -> NextLook {
    match due(r, now_ms) {
        Due::Done => NextLook::Never,
        Due::Apply(_) => NextLook::Now,
        Due::WakeAt(at) | Due::TryPlace { wake_at_ms: at } => NextLook::At(at),
    }
}

/// The next step of a reservation whose recorded times are reached: the work queue runs this at those times.
pub fn due(r: &Reservation, now_ms: i64) -> Due {
    use ReservationState as S;
    match r.state {
        S::Pending if now_ms >= r.pending_deadline_ms => {
            Due::Apply(Command::Fail { reason: FailureReason::DeadlinePassed, now_ms })
        }
        S::Pending => Due::TryPlace { wake_at_ms: r.pending_deadline_ms },
        S::Placed => {
            let start = r.start_ms.unwrap_or(now_ms);
            match r.lease_deadline_ms {
                Some(deadline) if now_ms > deadline && deadline < start => {
                    Due::Apply(Command::Expire { cause: ExpiryCause::LeaseLapsed, now_ms })
                }
                _ if now_ms >= start => Due::Apply(Command::StartBinding { now_ms, awaiting: Vec::new() }),
                Some(deadline) if deadline < start => Due::WakeAt(deadline + 1),
                _ => Due::WakeAt(start),
            }
        }
        // With no agent to wait for, a binding completes at once; otherwise the agents' acknowledgements complete
        // it, and it fails when they do not come in time.
        S::Binding if r.awaiting.is_empty() => Due::Apply(Command::Activate { now_ms }),
        S::Binding => {
            let deadline = r.hand_over_at_ms.unwrap_or(now_ms) + hand_over_timeout_ms(r);
            if now_ms >= deadline {
                Due::Apply(Command::Fail { reason: FailureReason::BindingTimedOut, now_ms })
            } else {
                Due::WakeAt(poll_whole_nodes(r, now_ms, deadline))
            }
        }
        S::Active => {
            let end = r.end_ms.unwrap_or(now_ms);
            match r.lease_deadline_ms {
                _ if now_ms >= end => Due::Apply(Command::Expire { cause: ExpiryCause::WindowEnded, now_ms }),
                Some(deadline) if now_ms > deadline => {
                    Due::Apply(Command::Expire { cause: ExpiryCause::LeaseLapsed, now_ms })
                }
                Some(deadline) if deadline < end => Due::WakeAt(deadline + 1),
                _ => Due::WakeAt(end),
            }
        }
        S::Releasing if r.awaiting.is_empty() => Due::Apply(Command::CompleteRelease { now_ms, unconfirmed: false }),
        S::Releasing => {
            let deadline = r.hand_over_at_ms.unwrap_or(now_ms) + hand_over_timeout_ms(r);
            if now_ms >= deadline {
                Due::Apply(Command::CompleteRelease { now_ms, unconfirmed: true })
            } else {
                Due::WakeAt(poll_whole_nodes(r, now_ms, deadline))
            }
        }
        S::Draft | S::AwaitingConfirmation => Due::WakeAt(r.pending_deadline_ms),
        S::Denied | S::Released | S::Failed | S::Cancelled | S::Expired => Due::Done,
    }
}

mod admission;
pub mod explanation;
pub mod whole_nodes;

pub use admission::{AdmissionFacts, Admitted, Waiting, admit, may_wait, quota_of, within_limit, within_quota};

#[cfg(test)]
mod tests;
