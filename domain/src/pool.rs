//! Pools (scheduling and policy domains in one site, owned by one tenant), their policy, and offerings (a pool
//! made visible to another tenant with a quota per resource), with their events.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Rejection;
pub use crate::device::Sharing;
use crate::domain_events;
use crate::id::{PoolId, SiteId, TenantId};

/// What kind of machines a pool holds and how tenants get them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PoolClass {
    MetalHost,
    MetalDedicated,
    VpsHost,
    Provider,
}

/// How the control plane reaches a pool's machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PoolAgent {
    /// The machines run `bcd`.
    #[default]
    Bcd,
    /// Reached only through a provider's API.
    None,
}

/// `policy.admission`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AdmissionPolicy {
    #[serde(default)]
    pub budget_check: bool,
}

/// `policy.sharing`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SharingPolicy {
    /// Slots per GPU in `timeslice` and `mps` pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
}

/// A pool's policy. Keys and defaults as the domain model names them; `disruptionBudget` defaults to 0.05.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolPolicy {
    /// Checks a node must pass to be adopted into the pool (see [`crate::acceptance`]).
    #[serde(default)]
    pub acceptance: Vec<String>,
    /// Overcommit ratios for scalar resources (from 1 to 64): a node lends `ratio` times what it has. A resource
    /// left out is not overcommitted.
    #[serde(default)]
    pub overcommit: BTreeMap<String, f64>,
    /// Seconds without a heartbeat after which a node is `lost`.
    #[serde(default = "default_lost_after")]
    pub lost_after: u64,
    /// The share of the pool's nodes that may be draining or in maintenance at once.
    #[serde(default = "default_disruption_budget")]
    pub disruption_budget: f64,
    #[serde(default)]
    pub admission: AdmissionPolicy,
    /// How many reservations may wait in `pending` at once.
    #[serde(default = "default_max_pending")]
    pub max_pending: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware_profile: Option<String>,
    #[serde(default)]
    pub sharing: SharingPolicy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_layout: Option<String>,
    #[serde(default)]
    pub tenant_root: bool,
}

fn default_lost_after() -> u64 {
    600
}

fn default_disruption_budget() -> f64 {
    0.05
}

fn default_max_pending() -> u32 {
    1000
}

impl Default for PoolPolicy {
    fn default() -> Self {
        Self {
            acceptance: Vec::new(),
            overcommit: BTreeMap::new(),
            lost_after: default_lost_after(),
            disruption_budget: default_disruption_budget(),
            admission: AdmissionPolicy::default(),
            max_pending: default_max_pending(),
            hardware_profile: None,
            sharing: SharingPolicy::default(),
            mig_layout: None,
            tenant_root: false,
        }
    }
}

// PoolPolicy holds f64s, which have no Eq; the values are validated finite, so equality is total.
impl Eq for PoolPolicy {}

impl PoolPolicy {
    /// Slots per GPU in a sharing pool (1 for the others).
    pub fn replicas(&self) -> u32 {
        self.sharing.replicas.unwrap_or(1)
    }

    pub(crate) fn check(&self, sharing: Sharing) -> Result<(), Rejection> {
        if !(self.disruption_budget.is_finite() && self.disruption_budget > 0.0 && self.disruption_budget <= 1.0) {
            return Err(Rejection::invalid("policy.disruptionBudget", "must be above 0 and at most 1"));
        }
        if self.lost_after == 0 || self.lost_after > MAX_LOST_AFTER_S {
            return Err(Rejection::invalid("policy.lostAfter", format!("must be 1 to {MAX_LOST_AFTER_S} seconds")));
        }
        crate::acceptance::parse(&self.acceptance)
            .map_err(|(i, why)| Rejection::invalid(format!("policy.acceptance[{i}]"), why))?;
        // Keys this build keeps but does not act on yet are refused, never silently ignored.
        if self.admission.budget_check {
            return Err(Rejection::invalid(
                "policy.admission.budgetCheck",
                "is not acted on yet (leave it out or false)",
            ));
        }
        if self.hardware_profile.is_some() {
            return Err(Rejection::invalid(
                "policy.hardwareProfile",
                "is not acted on yet: hardware profiles come with bare-metal provisioning (leave it out)",
            ));
        }
        if self.tenant_root && sharing != Sharing::Exclusive {
            return Err(Rejection::invalid(
                "policy.tenantRoot",
                "applies to exclusive pools only: a whole machine is handed over with every GPU it has",
            ));
        }
        for (resource, ratio) in &self.overcommit {
            if !SCALAR_RESOURCES.contains(&resource.as_str()) {
                return Err(Rejection::invalid(
                    format!("policy.overcommit.{resource}"),
                    format!("is not a scalar resource; overcommit applies to {}", SCALAR_RESOURCES.join(", ")),
                ));
            }
            if !(ratio.is_finite() && (1.0..=MAX_OVERCOMMIT).contains(ratio)) {
                return Err(Rejection::invalid(
                    format!("policy.overcommit.{resource}"),
                    format!("must be a ratio from 1 to {MAX_OVERCOMMIT}"),
                ));
            }
        }
        match (sharing, self.sharing.replicas) {
            (Sharing::Timeslice | Sharing::Mps, None) => {
                Err(Rejection::invalid("policy.sharing.replicas", "is required for timeslice and mps pools"))
            }
            (Sharing::Timeslice | Sharing::Mps, Some(replicas)) if !(1..=64).contains(&replicas) => {
                Err(Rejection::invalid("policy.sharing.replicas", "must be from 1 to 64"))
            }
            (Sharing::Exclusive | Sharing::Mig, Some(_)) => {
                Err(Rejection::invalid("policy.sharing.replicas", "applies only to timeslice and mps pools"))
            }
            _ => Ok(()),
        }
    }
}

impl PoolPolicy {
    /// How much of `resource` a node that has `capacity` of it lends: its capacity times the pool's overcommit
    /// ratio, rounded down.
    pub fn allocatable(&self, resource: &str, capacity: u64) -> u64 {
        match self.overcommit.get(resource) {
            Some(ratio) => (capacity as f64 * ratio).floor() as u64,
            None => capacity,
        }
    }
}

/// The highest overcommit ratio a pool may set.
pub const MAX_OVERCOMMIT: f64 = 64.0;

/// The scalar resources: amounts on a node (`vcpu` in logical CPUs, `memoryGiB` and `disk` in GiB) that an
/// allocation holds beside its atoms, accounted per node and per tenant at every instant of a window.
pub const SCALAR_RESOURCES: &[&str] = &["vcpu", "memoryGiB", "disk"];

/// The longest `policy.lostAfter`: 30 days (the liveness sweep multiplies it into milliseconds).
pub const MAX_LOST_AFTER_S: u64 = 30 * 24 * 3600;

/// The resources a quota can name.
pub const QUOTA_RESOURCES: &[&str] = &["gpu", "gpu.mig", "gpu.slot", "node", "vcpu", "memoryGiB", "nic.vf", "disk"];

/// The resources placement accounts today (the atoms and the scalars); `nic.vf` is refused in a quota until
/// placement books it.
pub const ACCOUNTED_RESOURCES: &[&str] = &["gpu", "gpu.mig", "gpu.slot", "node", "vcpu", "memoryGiB", "disk"];

/// Atoms (or scalar amounts) per resource that a tenant may hold in a pool at any instant. A resource missing from it grants zero.
pub type Quota = BTreeMap<String, u32>;

/// Checks a quota's resource names and amounts.
pub fn check_quota(field: &str, quota: &Quota) -> Result<(), Rejection> {
    for (resource, amount) in quota {
        if !QUOTA_RESOURCES.contains(&resource.as_str()) {
            return Err(Rejection::invalid(
                format!("{field}.{resource}"),
                format!("is not a resource; quotas name {}", QUOTA_RESOURCES.join(", ")),
            ));
        }
        if !ACCOUNTED_RESOURCES.contains(&resource.as_str()) {
            return Err(Rejection::invalid(
                format!("{field}.{resource}"),
                format!(
                    "is not accounted yet: placement does not book {resource}; quotas act on {}",
                    ACCOUNTED_RESOURCES.join(", ")
                ),
            ));
        }
        if *amount > 1_000_000 {
            return Err(Rejection::invalid(format!("{field}.{resource}"), "must be at most 1000000"));
        }
    }
    Ok(())
}

/// A pool as created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolCreated {
    pub pool_id: PoolId,
    pub site_id: SiteId,
    pub owner_tenant_id: TenantId,
    pub name: String,
    pub class: PoolClass,
    /// Exactly one GPU model family per pool, such as `H100`.
    pub gpu_model: String,
    pub sharing: Sharing,
    pub agent: PoolAgent,
    pub policy: PoolPolicy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_account_id: Option<String>,
    pub at_ms: i64,
}

impl PoolCreated {
    /// Checks the pool's own fields (the site's existence is the handler's business).
    pub fn check(&self) -> Result<(), Rejection> {
        crate::site::check_name("name", &self.name)?;
        if self.gpu_model.is_empty()
            || self.gpu_model.len() > 64
            || !self.gpu_model.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            return Err(Rejection::invalid("gpuModel", "must be a GPU model family such as H100"));
        }
        match (self.class, &self.provider_account_id) {
            (PoolClass::Provider, None) => {
                return Err(Rejection::invalid("providerAccountId", "is required for provider pools"));
            }
            (PoolClass::Provider, Some(account)) => {
                if account.parse::<crate::id::ProviderAccountId>().is_err() {
                    return Err(Rejection::invalid("providerAccountId", "names a provider account (pacct_...)"));
                }
                if self.agent != PoolAgent::None {
                    return Err(Rejection::invalid(
                        "agent",
                        "a provider pool's machines are reached through the provider's API: agent none",
                    ));
                }
            }
            (_, Some(_)) => {
                return Err(Rejection::invalid("providerAccountId", "applies only to provider pools"));
            }
            (_, None) => {}
        }
        if self.agent == PoolAgent::None && self.class != PoolClass::Provider {
            return Err(Rejection::invalid("agent", "none is only for provider pools, reached through their API"));
        }
        self.policy.check(self.sharing)
    }
}

/// An offering: the pool made visible to another tenant, with a quota per resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolOffered {
    pub pool_id: PoolId,
    pub tenant_id: TenantId,
    pub quota: Quota,
    /// Pending reservations are retried by offering priority, higher first.
    pub priority: i32,
    /// The offer extends to the tenant's descendants in the tenant tree.
    pub include_descendants: bool,
    pub at_ms: i64,
}

/// An offering's quota replaced. Lowering it keeps existing reservations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolQuotaSet {
    pub pool_id: PoolId,
    pub tenant_id: TenantId,
    pub quota: Quota,
    pub at_ms: i64,
}

/// A join token was issued for the pool (the secret itself is never recorded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinTokenIssued {
    pub pool_id: PoolId,
    pub token_id: crate::id::JoinTokenId,
    pub expires_at_ms: i64,
    pub at_ms: i64,
}

/// A pool's name, policy or (while it had no nodes) sharing mode changed; only what changed is set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolUpdated {
    pub pool_id: PoolId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PoolPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,
    pub at_ms: i64,
}

/// A pool without nodes or live reservations was deleted; its name is free again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolDeleted {
    pub pool_id: PoolId,
    pub at_ms: i64,
}

/// An offering was revoked: the tenant can no longer see the pool or reserve in it; what it already reserved
/// keeps running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolOfferRevoked {
    pub pool_id: PoolId,
    pub tenant_id: TenantId,
    pub at_ms: i64,
}

/// A join token that no machine had used was revoked: it admits nobody from now on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinTokenRevoked {
    pub pool_id: PoolId,
    pub token_id: crate::id::JoinTokenId,
    pub at_ms: i64,
}

domain_events! {
    /// Events of a pool's stream.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub enum PoolEvent {
        Created(PoolCreated) = "pool.created",
        Offered(PoolOffered) = "pool.offered",
        QuotaSet(PoolQuotaSet) = "pool.quota_set",
        JoinTokenIssued(JoinTokenIssued) = "pool.join_token_issued",
        JoinTokenRevoked(JoinTokenRevoked) = "pool.join_token_revoked",
        OfferRevoked(PoolOfferRevoked) = "pool.offer_revoked",
        Updated(PoolUpdated) = "pool.updated",
        Deleted(PoolDeleted) = "pool.deleted",
    }
}

mod state;

pub use state::{
    CreationFacts, JoinToken, Pool, PoolChange, PoolCommand, UpdateFacts, create, decide, evolve, evolve_join_token,
    fold, issue_join_token, revoke_join_token,
};

/// Which offering governs a tenant in a pool: a direct offer wins over one inherited through an ancestor's
/// `includeDescendants`; among inherited ones the nearest ancestor wins. `ancestors` runs from the parent up.
pub fn governing_offer<'a>(
    offers: &'a [PoolOffered],
    tenant: &TenantId,
    ancestors: &[TenantId],
) -> Option<&'a PoolOffered> {
    offers.iter().find(|offer| &offer.tenant_id == tenant).or_else(|| {
        ancestors
            .iter()
            .find_map(|ancestor| offers.iter().find(|offer| &offer.tenant_id == ancestor && offer.include_descendants))
    })
}

#[cfg(test)]
mod tests;
