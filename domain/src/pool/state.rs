//! A pool's state (the fold of its stream), a join token's (a stream of its own), and the decisions on them:
//! creating a pool, offering it, setting an offering's quota, issuing a join token.

use serde::{Deserialize, Serialize};

use super::{
    JoinTokenIssued, JoinTokenRevoked, PoolAgent, PoolClass, PoolCreated, PoolDeleted, PoolEvent, PoolOfferRevoked,
    PoolOffered, PoolPolicy, PoolQuotaSet, PoolUpdated, Quota, Sharing, check_quota,
};
use crate::Rejection;
use crate::id::{JoinTokenId, PoolId, SiteId, TenantId};

/// A pool as its events left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pool {
    pub id: PoolId,
    pub site_id: SiteId,
    pub owner_tenant_id: TenantId,
    pub name: String,
    pub class: PoolClass,
    pub gpu_model: String,
    pub sharing: Sharing,
    pub agent: PoolAgent,
    pub policy: PoolPolicy,
    pub provider_account_id: Option<String>,
    pub created_at_ms: i64,
    /// Its offerings, one per tenant, in tenant order; a quota change updates the offering in place.
    pub offers: Vec<PoolOffered>,
    /// Events folded.
    pub version: u32,
    /// When it was deleted, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_at_ms: Option<i64>,
}

/// A join token as its stream records it (the secret itself is never recorded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinToken {
    pub id: JoinTokenId,
    pub pool_id: PoolId,
    pub expires_at_ms: i64,
    pub issued_at_ms: i64,
    /// When it was revoked, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at_ms: Option<i64>,
}

/// Applies one event of a pool's stream (a `pool.join_token_issued` belongs to the token's own stream).
pub fn evolve(state: Option<Pool>, event: &PoolEvent) -> Option<Pool> {
    let mut pool = match (state, event) {
        (None, PoolEvent::Created(e)) => {
            return Some(Pool {
                id: e.pool_id.clone(),
                site_id: e.site_id.clone(),
                owner_tenant_id: e.owner_tenant_id.clone(),
                name: e.name.clone(),
                class: e.class,
                gpu_model: e.gpu_model.clone(),
                sharing: e.sharing,
                agent: e.agent,
                policy: e.policy.clone(),
                provider_account_id: e.provider_account_id.clone(),
                created_at_ms: e.at_ms,
                offers: Vec::new(),
                version: 1,
                deleted_at_ms: None,
            });
        }
        (Some(pool), _) => pool,
        (None, _) => return None,
    };
    pool.version += 1;
    match event {
        PoolEvent::Created(_) | PoolEvent::JoinTokenIssued(_) | PoolEvent::JoinTokenRevoked(_) => {}
        PoolEvent::Offered(e) => {
            pool.offers.retain(|offer| offer.tenant_id != e.tenant_id);
            pool.offers.push(e.clone());
            pool.offers.sort_by(|a, b| a.tenant_id.cmp(&b.tenant_id));
        }
        PoolEvent::QuotaSet(e) => {
            if let Some(offer) = pool.offers.iter_mut().find(|offer| offer.tenant_id == e.tenant_id) {
                offer.quota = e.quota.clone();
                offer.at_ms = e.at_ms;
            }
        }
        PoolEvent::OfferRevoked(e) => pool.offers.retain(|offer| offer.tenant_id != e.tenant_id),
        PoolEvent::Updated(e) => {
            if let Some(name) = &e.name {
                pool.name = name.clone();
            }
            if let Some(policy) = &e.policy {
                pool.policy = policy.clone();
            }
            if let Some(sharing) = e.sharing {
                pool.sharing = sharing;
            }
        }
        PoolEvent::Deleted(e) => {
            pool.deleted_at_ms.get_or_insert(e.at_ms);
        }
    }
    Some(pool)
}

/// Folds a pool stream's events, in version order.
pub fn fold<'a>(events: impl IntoIterator<Item = &'a PoolEvent>) -> Option<Pool> {
    events.into_iter().fold(None, evolve)
}

/// Applies one event of a join token's stream.
pub fn evolve_join_token(state: Option<JoinToken>, event: &PoolEvent) -> Option<JoinToken> {
    match (state, event) {
        (None, PoolEvent::JoinTokenIssued(e)) => Some(JoinToken {
            id: e.token_id.clone(),
            pool_id: e.pool_id.clone(),
            expires_at_ms: e.expires_at_ms,
            issued_at_ms: e.at_ms,
            revoked_at_ms: None,
        }),
        (Some(token), PoolEvent::JoinTokenRevoked(e)) if token.revoked_at_ms.is_none() => {
            Some(JoinToken { revoked_at_ms: Some(e.at_ms), ..token })
        }
        (state, _) => state,
    }
}

/// What creating a pool needs to know beyond the request itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CreationFacts {
    /// Whether the site exists and belongs to the creating tenant.
    pub site_owned: bool,
    /// Whether the owner already has a pool of that name.
    pub name_taken: bool,
    /// For a provider pool: whether the account it names is a live account of the creating tenant.
    pub provider_account_owned: bool,
}

/// Decides creating a pool.
pub fn create(created: &PoolCreated, facts: CreationFacts) -> Result<Vec<PoolEvent>, Rejection> {
    created.check()?;
    if !facts.site_owned {
        return Err(Rejection::NotFound { kind: "site", id: created.site_id.to_string() });
    }
    if facts.name_taken {
        return Err(Rejection::Conflict(format!("a pool named {:?} already exists", created.name)));
    }
    if let Some(account) = &created.provider_account_id
        && !facts.provider_account_owned
    {
        return Err(Rejection::invalid("providerAccountId", format!("provider account {account} was not found")));
    }
    Ok(vec![PoolEvent::Created(created.clone())])
}

/// A command on an existing pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolCommand {
    /// Offer the pool to a tenant (or replace its offer).
    Offer { tenant_id: TenantId, quota: Quota, priority: i32, include_descendants: bool, now_ms: i64 },
    /// Replace an existing offering's quota.
    SetQuota { tenant_id: TenantId, quota: Quota, now_ms: i64 },
    /// Withdraw an offering.
    RevokeOffer { tenant_id: TenantId, now_ms: i64 },
    /// Change the name, the policy or (while the pool has no nodes) the sharing mode.
    Update { change: PoolChange, facts: UpdateFacts, now_ms: i64 },
    /// Delete a pool with no nodes and no live reservations.
    Delete { facts: UpdateFacts, now_ms: i64 },
}

/// What a pool update asks to change; what is left out stays.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolChange {
    pub name: Option<String>,
    pub policy: Option<PoolPolicy>,
    pub sharing: Option<Sharing>,
}

/// What updating or deleting a pool needs to know beyond the pool itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UpdateFacts {
    /// Whether the owner has another pool of the new name.
    pub name_taken: bool,
    pub nodes: u64,
    /// Reservations in the pool that have not ended.
    pub live_reservations: u64,
}

/// Decides a command on a pool.
pub fn decide(pool: &Pool, command: &PoolCommand) -> Result<Vec<PoolEvent>, Rejection> {
    match command {
        PoolCommand::Offer { tenant_id, quota, priority, include_descendants, now_ms } => {
            check_quota("quota", quota)?;
            if tenant_id == &pool.owner_tenant_id {
                return Err(Rejection::invalid("tenantId", "the pool's owner needs no offer"));
            }
            Ok(vec![PoolEvent::Offered(PoolOffered {
                pool_id: pool.id.clone(),
                tenant_id: tenant_id.clone(),
                quota: quota.clone(),
                priority: *priority,
                include_descendants: *include_descendants,
                at_ms: *now_ms,
            })])
        }
        PoolCommand::SetQuota { tenant_id, quota, now_ms } => {
            check_quota("quota", quota)?;
            if !pool.offers.iter().any(|offer| &offer.tenant_id == tenant_id) {
                return Err(Rejection::NotFound { kind: "offering", id: format!("{}/{tenant_id}", pool.id) });
            }
            Ok(vec![PoolEvent::QuotaSet(PoolQuotaSet {
                pool_id: pool.id.clone(),
                tenant_id: tenant_id.clone(),
                quota: quota.clone(),
                at_ms: *now_ms,
            })])
        }
        PoolCommand::Update { change, facts, now_ms } => {
            if change.name.is_none() && change.policy.is_none() && change.sharing.is_none() {
                return Err(Rejection::invalid("body", "give name, policy or sharing to change"));
            }
            if let Some(name) = &change.name {
                crate::site::check_name("name", name)?;
                if facts.name_taken && name != &pool.name {
                    return Err(Rejection::Conflict(format!("a pool named {name:?} already exists")));
                }
            }
            let sharing = change.sharing.unwrap_or(pool.sharing);
            if change.sharing.is_some_and(|s| s != pool.sharing) && facts.nodes > 0 {
                return Err(Rejection::Conflict(format!(
                    "pool {} has {} nodes: its sharing mode changes only while it has none",
                    pool.id, facts.nodes
                )));
            }
            if change.policy.as_ref().is_some_and(|p| p.tenant_root != pool.policy.tenant_root) && facts.nodes > 0 {
                return Err(Rejection::Conflict(format!(
                    "pool {} has {} nodes: policy.tenantRoot changes only while it has none (it decides whether \
                     the pool's atoms are GPUs or whole nodes)",
                    pool.id, facts.nodes
                )));
            }
            change.policy.as_ref().unwrap_or(&pool.policy).check(sharing)?;
            Ok(vec![PoolEvent::Updated(PoolUpdated {
                pool_id: pool.id.clone(),
                name: change.name.clone(),
                policy: change.policy.clone(),
                sharing: change.sharing,
                at_ms: *now_ms,
            })])
        }
        PoolCommand::Delete { facts, now_ms } => {
            if facts.nodes > 0 {
                return Err(Rejection::Conflict(format!(
                    "pool {} has {} nodes: delete them first",
                    pool.id, facts.nodes
                )));
            }
            if facts.live_reservations > 0 {
                return Err(Rejection::Conflict(format!(
                    "pool {} has {} reservations that have not ended: cancel or release them first",
                    pool.id, facts.live_reservations
                )));
            }
            Ok(vec![PoolEvent::Deleted(PoolDeleted { pool_id: pool.id.clone(), at_ms: *now_ms })])
        }
        PoolCommand::RevokeOffer { tenant_id, now_ms } => {
            if !pool.offers.iter().any(|offer| &offer.tenant_id == tenant_id) {
                return Err(Rejection::NotFound { kind: "offering", id: format!("{}/{tenant_id}", pool.id) });
            }
            Ok(vec![PoolEvent::OfferRevoked(PoolOfferRevoked {
                pool_id: pool.id.clone(),
                tenant_id: tenant_id.clone(),
                at_ms: *now_ms,
            })])
        }
    }
}

/// Decides issuing a join token for `pool_id`, valid for `ttl_s` seconds from `now_ms`.
pub fn issue_join_token(
    pool_id: &PoolId,
    token_id: &JoinTokenId,
    ttl_s: u64,
    max_ttl_s: u64,
    now_ms: i64,
) -> Result<Vec<PoolEvent>, Rejection> {
    if !(60..=max_ttl_s).contains(&ttl_s) {
        return Err(Rejection::invalid("ttlSeconds", format!("must be 60 to {max_ttl_s}")));
    }
    Ok(vec![PoolEvent::JoinTokenIssued(JoinTokenIssued {
        pool_id: pool_id.clone(),
        token_id: token_id.clone(),
        expires_at_ms: now_ms + ttl_s as i64 * 1000,
        at_ms: now_ms,
    })])
}

/// Decides revoking a join token: one a machine used is refused (delete that node instead); revoking a revoked
/// token again changes nothing.
pub fn revoke_join_token(token: &JoinToken, used_by: Option<&str>, now_ms: i64) -> Result<Vec<PoolEvent>, Rejection> {
    if let Some(node) = used_by {
        return Err(Rejection::Conflict(format!(
            "join token {} was used by node {node}: it admits nobody else already (delete the node to remove it)",
            token.id
        )));
    }
    if token.revoked_at_ms.is_some() {
        return Ok(Vec::new());
    }
    Ok(vec![PoolEvent::JoinTokenRevoked(JoinTokenRevoked {
        pool_id: token.pool_id.clone(),
        token_id: token.id.clone(),
        at_ms: now_ms,
    })])
}
