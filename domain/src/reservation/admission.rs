//! Reservation admission as one pure decision over the facts it needs: which offering governs the tenant (and
//! so its priority and whose quota it is charged against), whether the request can ever be admitted by that
//! quota and by the pool, and, when it does not fit now, whether it may wait.

use crate::Rejection;
use crate::device::{DeviceClass, Sharing};
use crate::id::{PoolId, TenantId};
use crate::pool::{PoolOffered, governing_offer};

use super::{Binding, ReservationRequest};

/// What admitting a request reads about its pool and its caller.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionFacts<'a> {
    pub pool_id: &'a PoolId,
    pub pool_owner: &'a TenantId,
    pub sharing: Sharing,
    /// Whether the pool hands out whole machines (`policy.tenantRoot`): then its atoms are nodes.
    pub tenant_root: bool,
    pub gpu_model: &'a str,
    pub offers: &'a [PoolOffered],
    /// The caller's tenant and its ancestors, parent first (offers with `includeDescendants` reach down).
    pub tenant: &'a TenantId,
    pub ancestors: &'a [TenantId],
    /// Whether the request's project (if it names one) is a project of the caller's tenant.
    pub project_in_tenant: bool,
}

/// A request admitted: its priority among the pool's pending reservations, and the tenant whose offering's
/// quota it is charged against (`None` for the pool's owner, who is not quota-limited).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    pub priority: i32,
    pub quota_holder: Option<TenantId>,
}

/// Decides whether a request may be recorded at all: a pool the caller sees (owned or offered; otherwise it
/// does not exist for it), a quota that could ever admit the count, a project of the caller's, and atoms of the
/// kind and model the pool holds.
pub fn admit(request: &ReservationRequest, facts: &AdmissionFacts<'_>) -> Result<Admitted, Rejection> {
    let not_found = || Rejection::NotFound { kind: "pool", id: facts.pool_id.to_string() };
    let admitted = if facts.pool_owner == facts.tenant {
        Admitted { priority: 0, quota_holder: None }
    } else {
        let offer = governing_offer(facts.offers, facts.tenant, facts.ancestors).ok_or_else(not_found)?;
        let quota = quota_of(offer, request.resource());
        if request.devices.count > quota {
            return Err(Rejection::QuotaExceeded(format!(
                "the quota for {} in pool {} is {quota}; the request asks for {}",
                request.resource(),
                facts.pool_id,
                request.devices.count
            )));
        }
        for (resource, total) in request.scalar_totals() {
            let quota = quota_of(offer, resource);
            if total > u64::from(quota) {
                return Err(Rejection::QuotaExceeded(format!(
                    "the quota for {resource} in pool {} is {quota}; the request asks for {total}",
                    facts.pool_id
                )));
            }
        }
        Admitted { priority: offer.priority, quota_holder: Some(offer.tenant_id.clone()) }
    };
    if let Some(project) = &request.project_id
        && !facts.project_in_tenant
    {
        return Err(Rejection::invalid("projectId", format!("{project} is not a project of tenant {}", facts.tenant)));
    }
    if facts.tenant_root != (request.binding == Binding::Node) {
        return Err(Rejection::CapacityUnavailable(if facts.tenant_root {
            format!(
                "pool {} hands out whole machines (policy.tenantRoot): reserve them with binding node",
                facts.pool_id
            )
        } else {
            format!(
                "pool {} does not hand out whole machines: binding node needs a policy.tenantRoot pool",
                facts.pool_id
            )
        }));
    }
    let atom_class: DeviceClass = if facts.tenant_root { DeviceClass::Node } else { facts.sharing.atom_class() };
    if request.devices.class != atom_class {
        return Err(Rejection::CapacityUnavailable(format!(
            "pool {} shares its GPUs as {}, so it books {atom_class} atoms, not {}",
            facts.pool_id,
            facts.sharing.as_str(),
            request.devices.class
        )));
    }
    if request.devices.selector.gpu_model.as_deref().is_some_and(|model| model != facts.gpu_model) {
        return Err(Rejection::CapacityUnavailable(format!(
            "pool {} holds {} GPUs only",
            facts.pool_id, facts.gpu_model
        )));
    }
    Ok(admitted)
}

/// The atoms of `resource` an offering's quota grants: a resource it does not name grants none.
pub fn quota_of(offer: &PoolOffered, resource: &str) -> u32 {
    offer.quota.get(resource).copied().unwrap_or(0)
}

/// Whether holding `count` more atoms keeps a tenant within `quota` at every instant, when at its busiest
/// instant of the window it already holds `peak`.
pub fn within_quota(peak: i64, count: u32, quota: u32) -> bool {
    peak + i64::from(count) <= i64::from(quota)
}

/// Whether holding `amount` more of a scalar resource keeps a holder (a tenant in a pool, or a node) within
/// `limit` at every instant, when at its busiest instant of the window it already holds `peak`.
pub fn within_limit(peak: i64, amount: u64, limit: u64) -> bool {
    i128::from(peak) + i128::from(amount) <= i128::from(limit)
}

/// What the pool says when an admitted request does not fit now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting<'a> {
    pub pool_id: &'a PoolId,
    /// How many of the pool's nodes could ever hold one node's share of the request.
    pub holders: i64,
    /// Reservations already pending in the pool, and how many may be.
    pub pending: i64,
    pub max_pending: u32,
}

/// Decides whether a request that does not fit now may wait in `pending`: not when it can never fit the pool,
/// when it asked not to wait, or when the pool's pending queue is full (`CAPACITY_UNAVAILABLE`, saying which).
pub fn may_wait(request: &ReservationRequest, waiting: &Waiting<'_>) -> Result<(), Rejection> {
    let pool_id = waiting.pool_id;
    if waiting.holders < i64::from(request.devices.nodes()) {
        let scalars: String =
            request.resources.iter().map(|(resource, amount)| format!(", {amount} {resource}")).collect();
        return Err(Rejection::CapacityUnavailable(format!(
            "the request can never fit pool {pool_id}: it needs {} node(s) with {} matching {} atoms{scalars}, and \
             the pool has {}",
            request.devices.nodes(),
            request.devices.per_node(),
            request.devices.class,
            waiting.holders
        )));
    }
    if !request.wait {
        return Err(Rejection::CapacityUnavailable(format!(
            "pool {pool_id} has no room for the request now, and it asked not to wait"
        )));
    }
    if waiting.pending >= i64::from(waiting.max_pending) {
        return Err(Rejection::CapacityUnavailable(format!(
            "pool {pool_id}'s pending queue is full (maxPending {})",
            waiting.max_pending
        )));
    }
    Ok(())
}
