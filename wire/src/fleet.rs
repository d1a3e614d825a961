//! Sites, projects, pools and their offerings, capacity and availability, and the audit trail on the wire.

use std::collections::BTreeMap;

#[cfg(feature = "server")]
use bc_commands::availability::FreeAtoms;
#[cfg(feature = "server")]
use bc_commands::reads::{AuditEntry, CapacityView, OfferView, PoolView, SiteView};
use bc_domain::pool::{AdmissionPolicy, PoolAgent, PoolClass, PoolPolicy, Quota, Sharing, SharingPolicy};
use bc_domain::site::SiteKind;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[cfg(feature = "server")]
use super::spelling;

/// The body of `POST /v1/sites`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SiteBody {
    /// 1 to 128 printable characters.
    #[schema(min_length = 1, max_length = 128)]
    pub name: String,
    /// A region in Better IAM's grammar (`eu-central-1`).
    #[schema(pattern = "^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")]
    pub iam_region: String,
    /// `shared` (the default), `dedicated` or `custom`.
    #[serde(default = "shared")]
    #[schema(value_type = String)]
    pub kind: SiteKind,
}

fn shared() -> SiteKind {
    SiteKind::Shared
}

/// A site.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SiteDto {
    pub id: String,
    pub owner_tenant_id: String,
    pub name: String,
    pub iam_region: String,
    /// `shared`, `dedicated` or `custom`.
    pub kind: String,
    pub created_at: i64,
}

#[cfg(feature = "server")]
impl From<&SiteView> for SiteDto {
    fn from(s: &SiteView) -> Self {
        SiteDto {
            id: s.id.to_string(),
            owner_tenant_id: s.owner_tenant_id.to_string(),
            name: s.name.clone(),
            iam_region: s.iam_region.clone(),
            kind: spelling(&s.kind),
            created_at: s.created_at_ms,
        }
    }
}

/// The body of `POST /v1/projects`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProjectBody {
    /// 1 to 128 printable characters.
    #[schema(min_length = 1, max_length = 128)]
    pub name: String,
}

/// A pool's policy. In a create, every key may be left out for its default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolPolicyDto {
    /// Checks a node must pass to be adopted (`gpu-count=8`, `min-gpu-memory-mib=...`, `driver-prefix=...`,
    /// `trusted-hardware-key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acceptance: Option<Vec<String>>,
    /// Overcommit ratios of scalar resources (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overcommit: Option<BTreeMap<String, f64>>,
    /// Seconds without a heartbeat after which a node is `lost` (600), 1 to 2592000 (30 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 2_592_000)]
    pub lost_after: Option<u64>,
    /// The share of the pool's nodes that may be draining or in maintenance at once (0.05).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption_budget: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionDto>,
    /// How many reservations may wait in `pending` at once (1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware_profile: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<SharingPolicyDto>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_layout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_root: Option<bool>,
}

/// `policy.admission`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AdmissionDto {
    #[serde(default)]
    pub budget_check: bool,
}

/// `policy.sharing`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SharingPolicyDto {
    /// Slots per GPU in `timeslice` and `mps` pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
}

impl From<PoolPolicyDto> for PoolPolicy {
    fn from(p: PoolPolicyDto) -> Self {
        let defaults = PoolPolicy::default();
        PoolPolicy {
            acceptance: p.acceptance.unwrap_or(defaults.acceptance),
            overcommit: p.overcommit.unwrap_or(defaults.overcommit),
            lost_after: p.lost_after.unwrap_or(defaults.lost_after),
            disruption_budget: p.disruption_budget.unwrap_or(defaults.disruption_budget),
            admission: p.admission.map_or(defaults.admission, |a| AdmissionPolicy { budget_check: a.budget_check }),
            max_pending: p.max_pending.unwrap_or(defaults.max_pending),
            hardware_profile: p.hardware_profile,
            sharing: p.sharing.map_or(defaults.sharing, |s| SharingPolicy { replicas: s.replicas }),
            mig_layout: p.mig_layout,
            tenant_root: p.tenant_root.unwrap_or(defaults.tenant_root),
        }
    }
}

impl From<&PoolPolicy> for PoolPolicyDto {
    fn from(p: &PoolPolicy) -> Self {
        PoolPolicyDto {
            acceptance: Some(p.acceptance.clone()),
            overcommit: Some(p.overcommit.clone()),
            lost_after: Some(p.lost_after),
            disruption_budget: Some(p.disruption_budget),
            admission: Some(AdmissionDto { budget_check: p.admission.budget_check }),
            max_pending: Some(p.max_pending),
            hardware_profile: p.hardware_profile.clone(),
            sharing: Some(SharingPolicyDto { replicas: p.sharing.replicas }),
            mig_layout: p.mig_layout.clone(),
            tenant_root: Some(p.tenant_root),
        }
    }
}

/// The body of `PATCH /v1/pools/{id}`: what to change; what is left out stays.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolUpdateBody {
    /// 1 to 128 printable characters.
    #[schema(min_length = 1, max_length = 128)]
    pub name: Option<String>,
    /// The whole policy: what it leaves out takes its default.
    pub policy: Option<PoolPolicyDto>,
    /// Only while the pool has no nodes.
    #[schema(value_type = Option<String>)]
    pub sharing: Option<Sharing>,
}

/// The body of `POST /v1/pools`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolBody {
    pub site_id: String,
    /// 1 to 128 printable characters.
    #[schema(min_length = 1, max_length = 128)]
    pub name: String,
    /// `metal-host`, `metal-dedicated`, `vps-host` or `provider`.
    #[schema(value_type = String, example = "metal-host")]
    pub class: PoolClass,
    /// The GPU model it holds (`H100`): 1 to 64 letters, digits and `-`.
    #[schema(pattern = "^[A-Za-z0-9-]{1,64}$")]
    pub gpu_model: String,
    /// `exclusive` (the default), `mig`, `timeslice` or `mps`.
    #[serde(default)]
    #[schema(value_type = String)]
    pub sharing: Sharing,
    /// `bcd` (the default) or `none`.
    #[serde(default)]
    #[schema(value_type = String)]
    pub agent: PoolAgent,
    #[serde(default)]
    pub policy: PoolPolicyDto,
    pub provider_account_id: Option<String>,
}

/// One offering of a pool: the tenant it is offered to, with a quota per resource.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OfferDto {
    pub tenant_id: String,
    /// Atoms per resource (`gpu`, `gpu.mig`, `gpu.slot`, ...) the tenant may hold at any instant.
    pub quota: Quota,
    pub priority: i32,
    pub include_descendants: bool,
}

#[cfg(feature = "server")]
impl From<&OfferView> for OfferDto {
    fn from(o: &OfferView) -> Self {
        OfferDto {
            tenant_id: o.tenant_id.to_string(),
            quota: o.quota.clone(),
            priority: o.priority,
            include_descendants: o.include_descendants,
        }
    }
}

/// A pool; its offers other than the caller's own are left out unless the caller owns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolDto {
    pub id: String,
    pub site_id: String,
    pub owner_tenant_id: String,
    pub name: String,
    pub class: String,
    pub gpu_model: String,
    pub sharing: String,
    pub agent: String,
    pub policy: PoolPolicyDto,
    pub offers: Vec<OfferDto>,
    pub node_count: u32,
    pub created_at: i64,
}

#[cfg(feature = "server")]
impl From<&PoolView> for PoolDto {
    fn from(p: &PoolView) -> Self {
        PoolDto {
            id: p.id.to_string(),
            site_id: p.site_id.to_string(),
            owner_tenant_id: p.owner_tenant_id.to_string(),
            name: p.name.clone(),
            class: spelling(&p.class),
            gpu_model: p.gpu_model.clone(),
            sharing: spelling(&p.sharing),
            agent: spelling(&p.agent),
            policy: (&p.policy).into(),
            offers: p.offers.iter().map(Into::into).collect(),
            node_count: p.node_count,
            created_at: p.created_at_ms,
        }
    }
}

/// One resource of a pool's capacity, in atoms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacityDto {
    pub resource: String,
    /// Atoms on schedulable nodes.
    pub allocatable: i64,
    /// Atoms of reservations binding, active or releasing.
    pub allocated: i64,
    /// Atoms of placed reservations not yet started.
    pub reserved: i64,
    /// Allocatable less allocated.
    pub available: i64,
}

#[cfg(feature = "server")]
impl From<&CapacityView> for CapacityDto {
    fn from(c: &CapacityView) -> Self {
        CapacityDto {
            resource: c.resource.clone(),
            allocatable: c.allocatable,
            allocated: c.allocated,
            reserved: c.reserved,
            available: c.available,
        }
    }
}

/// `GET /v1/pools/{id}/capacity`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolCapacityDto {
    pub pool_id: String,
    pub items: Vec<CapacityDto>,
}

/// The earliest start of a window that fits (`null`: none within the search's reach).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EarliestStartDto {
    pub pool_id: String,
    #[schema(required = true)]
    pub earliest_start: Option<i64>,
}

/// Atoms of one node free over a whole window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeAtomsDto {
    pub node_id: String,
    pub atoms: Vec<String>,
}

#[cfg(feature = "server")]
impl From<&FreeAtoms> for NodeAtomsDto {
    fn from(f: &FreeAtoms) -> Self {
        NodeAtomsDto { node_id: f.node_id.to_string(), atoms: f.atoms.iter().map(ToString::to_string).collect() }
    }
}

/// The atoms free over `[start, end)`, by node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FreeAtomsDto {
    pub pool_id: String,
    pub start: i64,
    pub end: i64,
    pub nodes: Vec<NodeAtomsDto>,
}

/// `GET /v1/pools/{id}/availability`: the earliest start (asked with `count` and `duration`), or the free atoms
/// (asked with `start` and `end`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum AvailabilityDto {
    EarliestStart(EarliestStartDto),
    FreeAtoms(FreeAtomsDto),
}

/// The body of `POST /v1/pools/{id}/offers`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OfferBody {
    pub tenant_id: String,
    pub quota: Quota,
    #[serde(default)]
    pub priority: i32,
    #[serde(default)]
    pub include_descendants: bool,
}

/// An offering as made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OfferedDto {
    pub pool_id: String,
    pub tenant_id: String,
    pub quota: Quota,
    pub priority: i32,
    pub include_descendants: bool,
}

/// The body of `PUT /v1/pools/{id}/offers/{tenant}/quota`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QuotaBody {
    pub quota: Quota,
}

/// An offering's quota as set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaSetDto {
    pub pool_id: String,
    pub tenant_id: String,
    pub quota: Quota,
}

/// One entry of the audit trail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditDto {
    pub position: String,
    pub stream_id: String,
    pub stream_version: i64,
    pub event_type: String,
    pub tenant_id: Option<String>,
    /// `allowed` or `denied`.
    pub decision: String,
    pub reason: Option<String>,
    pub identity: Option<String>,
    pub session_kind: Option<String>,
    pub agent: Option<String>,
    pub delegation: Option<String>,
    pub request_id: Option<String>,
    pub admission_tenant_id: Option<String>,
    pub recorded_at: i64,
}

#[cfg(feature = "server")]
impl From<&AuditEntry> for AuditDto {
    fn from(a: &AuditEntry) -> Self {
        AuditDto {
            position: a.position.clone(),
            stream_id: a.stream_id.clone(),
            stream_version: a.stream_version,
            event_type: a.event_type.clone(),
            tenant_id: a.tenant_id.clone(),
            decision: a.decision.clone(),
            reason: a.reason.clone(),
            identity: a.identity.clone(),
            session_kind: a.session_kind.clone(),
            agent: a.agent.clone(),
            delegation: a.delegation.clone(),
            request_id: a.request_id.clone(),
            admission_tenant_id: a.admission_tenant_id.clone(),
            recorded_at: a.recorded_at_ms,
        }
    }
}

/// A project of the caller's tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectDto {
    pub id: String,
    pub name: String,
    pub created_at: i64,
}

#[cfg(feature = "server")]
impl From<&bc_commands::fleet::ProjectInfo> for ProjectDto {
    fn from(p: &bc_commands::fleet::ProjectInfo) -> Self {
        ProjectDto { id: p.id.to_string(), name: p.name.clone(), created_at: p.created_at_ms }
    }
}

/// An offering withdrawn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevokedOfferDto {
    pub pool_id: String,
    pub tenant_id: String,
}
