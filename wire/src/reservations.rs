//! Reservations on the wire: the create body and the one shape every reservation is answered in.

use std::collections::BTreeMap;

use bc_domain::Rejection;
use bc_domain::device::{AttrValue, DeviceClass};
use bc_domain::id::{PoolId, ProfileId, ProjectId};
use bc_domain::reservation::{Allocation, Binding, DeviceRequest, Reservation, ReservationRequest, Selector, Topology};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// An attribute value a selector asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum AttrValueDto {
    Bool(bool),
    Int(i64),
    String(String),
}

impl From<AttrValueDto> for AttrValue {
    fn from(value: AttrValueDto) -> Self {
        match value {
            AttrValueDto::Bool(b) => AttrValue::Bool(b),
            AttrValueDto::Int(i) => AttrValue::Int(i),
            AttrValueDto::String(s) => AttrValue::String(s),
        }
    }
}

impl From<&AttrValue> for AttrValueDto {
    fn from(value: &AttrValue) -> Self {
        match value {
            AttrValue::Bool(b) => AttrValueDto::Bool(*b),
            AttrValue::Int(i) => AttrValueDto::Int(*i),
            AttrValue::String(s) => AttrValueDto::String(s.clone()),
        }
    }
}

/// Which atoms qualify: `gpuModel`, `gpuProduct`, and attributes with these values.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SelectorDto {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_product: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, AttrValueDto>,
}

/// Where the atoms may be: `same-node` (the default), or a `gang` spread evenly over `nodes` nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "kebab-case", try_from = "TopologyFields")]
pub enum TopologyDto {
    #[default]
    SameNode,
    Gang {
        nodes: u32,
    },
}

/// A topology's fields as sent. serde's internally tagged enums let a unit variant carry any other field, so the
/// fields are read here and checked: `{"kind": "same-node", "colour": 1}` is refused, never silently ignored.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TopologyFields {
    kind: String,
    nodes: Option<u32>,
}

impl TryFrom<TopologyFields> for TopologyDto {
    type Error = String;

    fn try_from(fields: TopologyFields) -> Result<Self, String> {
        match (fields.kind.as_str(), fields.nodes) {
            ("same-node", None) => Ok(TopologyDto::SameNode),
            ("same-node", Some(_)) => Err("`nodes` is only for a gang".into()),
            ("gang", Some(nodes)) => Ok(TopologyDto::Gang { nodes }),
            ("gang", None) => Err("missing field `nodes`".into()),
            (kind, _) => Err(format!("unknown variant `{kind}`, expected `same-node` or `gang`")),
        }
    }
}

/// `devices` of a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DevicesDto {
    /// `gpu`, `gpu.mig` or `gpu.slot`: the atoms the pool's sharing mode books.
    #[schema(value_type = String, example = "gpu")]
    pub class: DeviceClass,
    /// How many atoms, 1 to 4096.
    #[schema(minimum = 1, maximum = 4096)]
    pub count: u32,
    #[serde(default)]
    pub selector: SelectorDto,
    #[serde(default)]
    pub topology: TopologyDto,
}

impl From<DevicesDto> for DeviceRequest {
    fn from(d: DevicesDto) -> Self {
        DeviceRequest {
            class: d.class,
            count: d.count,
            selector: Selector {
                gpu_model: d.selector.gpu_model,
                gpu_product: d.selector.gpu_product,
                attributes: d.selector.attributes.into_iter().map(|(k, v)| (k, v.into())).collect(),
            },
            topology: match d.topology {
                TopologyDto::SameNode => Topology::SameNode,
                TopologyDto::Gang { nodes } => Topology::Gang { nodes },
            },
        }
    }
}

impl From<&DeviceRequest> for DevicesDto {
    fn from(d: &DeviceRequest) -> Self {
        DevicesDto {
            class: d.class,
            count: d.count,
            selector: SelectorDto {
                gpu_model: d.selector.gpu_model.clone(),
                gpu_product: d.selector.gpu_product.clone(),
                attributes: d.selector.attributes.iter().map(|(k, v)| (k.clone(), v.into())).collect(),
            },
            topology: match d.topology {
                Topology::SameNode => TopologyDto::SameNode,
                Topology::Gang { nodes } => TopologyDto::Gang { nodes },
            },
        }
    }
}

/// The body of `POST /v1/reservations`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReserveBody {
    pub pool_id: String,
    pub devices: DevicesDto,
    /// When the window starts (epoch milliseconds, on a whole second, from now to 366 days ahead); without it,
    /// when the reservation is placed.
    #[schema(multiple_of = 1000, minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub start: Option<i64>,
    /// The window's length in whole seconds, 1 to 31622400 (366 days).
    #[schema(minimum = 1, maximum = 31_622_400)]
    pub duration: u64,
    /// `hold` (the default): GPUs handed to a workload manager on the node; `node`: whole machines of a
    /// `tenantRoot` pool (`devices.class` `node`, `devices.count` machines), deployed with `profileId`. An
    /// `instance` binding is made by creating the instance (`POST /v1/instances`), not here.
    #[serde(default)]
    #[schema(value_type = String, example = "hold")]
    pub binding: Binding,
    /// With `binding: node`: the caller's metal profile its machines are deployed with (`prof_...`).
    pub profile_id: Option<String>,
    pub lease_seconds: Option<u64>,
    pub project_id: Option<String>,
    /// The latest time it may still be placed (epoch milliseconds).
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub deadline: Option<i64>,
    /// Whether it may wait in `pending` (default true).
    pub wait: Option<bool>,
    /// Spot reservations are not offered yet; `true` is refused naming the field.
    pub spot: Option<bool>,
    /// Scalar amounts each allocation holds on its node beside its atoms: `vcpu` (logical CPUs), `memoryGiB` and
    /// `disk` (GiB), each 1 to 1000000. A gang's nodes each hold them; the quota is charged the total.
    #[serde(default)]
    #[schema(example = json!({"vcpu": 16, "memoryGiB": 128}))]
    pub resources: BTreeMap<String, u64>,
    /// A quote's token (`POST /v1/pools/{id}/quotes`): book exactly the quoted devices, with the quote's `reserve`
    /// body unchanged, or answer `QUOTE_STALE` naming what changed; a quoted reserve never waits in `pending`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quote: Option<String>,
}

impl ReserveBody {
    /// The body that sends `request` (with `quote`, if any): [`ReserveBody::request`] reads it back as the same
    /// request.
    pub fn of(request: &ReservationRequest, quote: Option<String>) -> ReserveBody {
        ReserveBody {
            pool_id: request.pool_id.to_string(),
            devices: (&request.devices).into(),
            start: request.start_ms,
            duration: request.duration_s,
            binding: request.binding,
            profile_id: request.profile_id.as_ref().map(ToString::to_string),
            lease_seconds: request.lease_seconds,
            project_id: request.project_id.as_ref().map(ToString::to_string),
            deadline: request.deadline_ms,
            wait: Some(request.wait),
            spot: None,
            resources: request.resources.clone(),
            quote,
        }
    }

    /// The domain's request, its ids parsed (naming the field when one is not).
    pub fn request(self) -> Result<ReservationRequest, Rejection> {
        if self.spot == Some(true) {
            return Err(Rejection::invalid("spot", "spot reservations are not offered yet"));
        }
        Ok(ReservationRequest {
            pool_id: parse_id::<PoolId>("poolId", &self.pool_id)?,
            devices: self.devices.into(),
            start_ms: self.start,
            duration_s: self.duration,
            binding: self.binding,
            lease_seconds: self.lease_seconds,
            project_id: self.project_id.as_deref().map(|p| parse_id::<ProjectId>("projectId", p)).transpose()?,
            deadline_ms: self.deadline,
            wait: self.wait.unwrap_or(true),
            profile_id: self.profile_id.as_deref().map(|p| parse_id::<ProfileId>("profileId", p)).transpose()?,
            resources: self.resources,
        })
    }
}

/// An id from a body's field, naming the field when it is not one.
fn parse_id<T>(field: &str, text: &str) -> Result<T, Rejection>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    text.parse().map_err(|err: T::Err| Rejection::invalid(field, err.to_string()))
}

/// A request as a reservation shows it: the create body's shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RequestDto {
    pub pool_id: String,
    pub devices: DevicesDto,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<i64>,
    pub duration: u64,
    pub binding: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline: Option<i64>,
    pub wait: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile_id: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, u64>,
}

impl From<&ReservationRequest> for RequestDto {
    fn from(r: &ReservationRequest) -> Self {
        RequestDto {
            pool_id: r.pool_id.to_string(),
            devices: (&r.devices).into(),
            start: r.start_ms,
            duration: r.duration_s,
            binding: r.binding.as_str().to_owned(),
            lease_seconds: r.lease_seconds,
            project_id: r.project_id.as_ref().map(ToString::to_string),
            deadline: r.deadline_ms,
            wait: r.wait,
            profile_id: r.profile_id.as_ref().map(ToString::to_string),
            resources: r.resources.clone(),
        }
    }
}

/// One node's share of a reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AllocationDto {
    pub allocation_id: String,
    pub node_id: String,
    /// Its atoms, in device id order.
    pub devices: Vec<String>,
    /// The scalar amounts it holds on its node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, u64>,
}

impl From<&Allocation> for AllocationDto {
    fn from(a: &Allocation) -> Self {
        AllocationDto {
            allocation_id: a.allocation_id.to_string(),
            node_id: a.node_id.to_string(),
            devices: a.devices.iter().map(ToString::to_string).collect(),
            resources: a.resources.clone(),
        }
    }
}

/// A reservation, as every route answers it (its GET, its commands, the list's items).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReservationDto {
    pub id: String,
    pub tenant_id: String,
    pub identity: String,
    pub pool_id: String,
    pub project_id: Option<String>,
    /// `draft`, `denied`, `awaiting-confirmation`, `pending`, `placed`, `binding`, `active`, `releasing`,
    /// `released`, `failed`, `cancelled` or `expired`.
    pub state: String,
    /// The quota resource it is charged against: its device class.
    pub resource: String,
    pub count: u32,
    pub request: RequestDto,
    pub priority: i32,
    pub requested_at: i64,
    pub pending_deadline: i64,
    pub start: Option<i64>,
    pub end: Option<i64>,
    pub lease_deadline: Option<i64>,
    pub ended_at: Option<i64>,
    /// Why it ended, once terminal: the denial's or cancel's reason, the failure reason or the expiry cause.
    pub outcome: Option<String>,
    pub allocations: Vec<AllocationDto>,
    /// Events folded so far.
    pub version: u32,
}

impl From<&Reservation> for ReservationDto {
    fn from(r: &Reservation) -> Self {
        ReservationDto {
            id: r.id.to_string(),
            tenant_id: r.tenant_id.to_string(),
            identity: r.identity.to_string(),
            pool_id: r.request.pool_id.to_string(),
            project_id: r.request.project_id.as_ref().map(ToString::to_string),
            state: r.state.as_str().to_owned(),
            resource: r.request.resource().to_owned(),
            count: r.request.devices.count,
            request: (&r.request).into(),
            priority: r.priority,
            requested_at: r.requested_at_ms,
            pending_deadline: r.pending_deadline_ms,
            start: r.start_ms,
            end: r.end_ms,
            lease_deadline: r.lease_deadline_ms,
            ended_at: r.ended_at_ms,
            outcome: r.outcome.clone(),
            allocations: r.allocations.iter().map(Into::into).collect(),
            version: r.version,
        }
    }
}

/// Body of `cancel`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CancelBody {
    /// Why, for the audit trail: at most 1024 characters.
    #[schema(max_length = 1024)]
    pub reason: Option<String>,
}

/// No body, or `{}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EmptyBody {}

/// Body of `extend`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExtendBody {
    /// The new end of the window (epoch milliseconds, on a whole second).
    #[schema(multiple_of = 1000, minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub end: i64,
}
