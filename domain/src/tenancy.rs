//! Tenancy: tenants (with their parent and state), the identities that speak for them with bearer tokens, the
//! pool relations granted to those identities, and the attribute limits pool owners set on reservations. These
//! are what the built-in authorizer decides from; each change is an event like every other.
//!
//! A tenant's stream is `tenant:<id>`; an identity's, a grant's and a limit's are their ids.

use serde::{Deserialize, Serialize};

use crate::Rejection;
use crate::domain_events;
use crate::id::{GrantId, Identity, IdentityId, LimitId, PoolId, TenantId, TokenId};

/// The deepest a tenant may sit below the root (the root is depth 0).
pub const MAX_DEPTH: usize = 8;

/// The most live bearer tokens one identity may hold.
pub const MAX_TOKENS_PER_IDENTITY: usize = 16;

/// The stream of a tenant's own events.
pub fn tenant_stream(tenant: &TenantId) -> String {
    format!("tenant:{tenant}")
}

/// The relations on a pool, each including the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Relation {
    Viewer,
    User,
    Operator,
    Admin,
}

impl Relation {
    pub const ALL: [Relation; 4] = [Relation::Viewer, Relation::User, Relation::Operator, Relation::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Relation::Viewer => "viewer",
            Relation::User => "user",
            Relation::Operator => "operator",
            Relation::Admin => "admin",
        }
    }

    pub fn parse(text: &str) -> Option<Relation> {
        Relation::ALL.into_iter().find(|r| r.as_str() == text)
    }
}

/// Whether a tenant's callers may start new work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TenantState {
    #[default]
    Active,
    /// Refused new work; what already runs keeps running.
    Suspended,
}

impl TenantState {
    pub fn as_str(self) -> &'static str {
        match self {
            TenantState::Active => "active",
            TenantState::Suspended => "suspended",
        }
    }
}

/// The kind of session an identity's calls record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SessionKind {
    #[default]
    User,
    Service,
    Agent,
}

impl SessionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionKind::User => "user",
            SessionKind::Service => "service",
            SessionKind::Agent => "agent",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantCreated {
    pub tenant_id: TenantId,
    pub parent_id: TenantId,
    pub name: String,
    pub at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantSuspended {
    pub tenant_id: TenantId,
    pub reason: String,
    pub at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantResumed {
    pub tenant_id: TenantId,
    pub at_ms: i64,
}

domain_events! {
    /// Events of a tenant's stream.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub enum TenantEvent {
        Created(TenantCreated) = "tenant.created",
        Suspended(TenantSuspended) = "tenant.suspended",
        Resumed(TenantResumed) = "tenant.resumed",
    }
}

/// A tenant as its events left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tenant {
    pub tenant_id: TenantId,
    pub parent_id: TenantId,
    pub name: String,
    pub state: TenantState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended_reason: Option<String>,
    pub at_ms: i64,
}

/// Applies one event of a tenant's stream.
pub fn evolve_tenant(state: Option<Tenant>, event: &TenantEvent) -> Option<Tenant> {
    match (state, event) {
        (None, TenantEvent::Created(e)) => Some(Tenant {
            tenant_id: e.tenant_id.clone(),
            parent_id: e.parent_id.clone(),
            name: e.name.clone(),
            state: TenantState::Active,
            suspended_reason: None,
            at_ms: e.at_ms,
        }),
        (Some(t), TenantEvent::Suspended(e)) => {
            Some(Tenant { state: TenantState::Suspended, suspended_reason: Some(e.reason.clone()), ..t })
        }
        (Some(t), TenantEvent::Resumed(_)) => Some(Tenant { state: TenantState::Active, suspended_reason: None, ..t }),
        (state, _) => state,
    }
}

/// What creating a tenant is decided on: whether the id is taken (by a tenant of the log or of the bootstrap
/// file), and the parent's depth below the root (`None`: no such parent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantFacts {
    pub id_taken: bool,
    pub parent_depth: Option<usize>,
}

/// Decides creating tenant `id` under `parent`.
pub fn create_tenant(
    id: &TenantId,
    parent: &TenantId,
    name: &str,
    facts: TenantFacts,
    now_ms: i64,
) -> Result<Vec<TenantEvent>, Rejection> {
    crate::site::check_name("name", name)?;
    let Some(depth) = facts.parent_depth else {
        return Err(Rejection::invalid("parentId", format!("tenant {parent} does not exist")));
    };
    if depth + 1 > MAX_DEPTH {
        return Err(Rejection::invalid(
            "parentId",
            format!("tenant {parent} is {depth} levels below the root; tenants nest at most {MAX_DEPTH} deep"),
        ));
    }
    if facts.id_taken {
        return Err(Rejection::Conflict(format!("tenant {id} already exists")));
    }
    Ok(vec![TenantEvent::Created(TenantCreated {
        tenant_id: id.clone(),
        parent_id: parent.clone(),
        name: name.to_owned(),
        at_ms: now_ms,
    })])
}

/// Decides suspending a tenant: its callers are refused new work from then on. Suspending a suspended tenant
/// changes nothing.
pub fn suspend_tenant(
    tenant: Option<&Tenant>,
    id: &TenantId,
    reason: &str,
    now_ms: i64,
) -> Result<Vec<TenantEvent>, Rejection> {
    let tenant = tenant.ok_or_else(|| Rejection::NotFound { kind: "tenant", id: id.to_string() })?;
    if reason.chars().count() > 512 || reason.chars().any(char::is_control) {
        return Err(Rejection::invalid("reason", "must be at most 512 printable characters"));
    }
    if tenant.state == TenantState::Suspended {
        return Ok(vec![]);
    }
    Ok(vec![TenantEvent::Suspended(TenantSuspended {
        tenant_id: id.clone(),
        reason: reason.to_owned(),
        at_ms: now_ms,
    })])
}

/// Decides resuming a suspended tenant; resuming an active one changes nothing.
pub fn resume_tenant(tenant: Option<&Tenant>, id: &TenantId, now_ms: i64) -> Result<Vec<TenantEvent>, Rejection> {
    let tenant = tenant.ok_or_else(|| Rejection::NotFound { kind: "tenant", id: id.to_string() })?;
    if tenant.state == TenantState::Active {
        return Ok(vec![]);
    }
    Ok(vec![TenantEvent::Resumed(TenantResumed { tenant_id: id.clone(), at_ms: now_ms })])
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdentityCreated {
    pub identity_id: IdentityId,
    pub tenant_id: TenantId,
    pub name: Identity,
    pub kind: SessionKind,
    /// An administrator of its tenant.
    pub admin: bool,
    pub at_ms: i64,
}

/// A bearer token was issued: only its SHA-256 is kept, here and anywhere.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenIssued {
    pub identity_id: IdentityId,
    pub tenant_id: TenantId,
    pub token_id: TokenId,
    pub sha256: String,
    pub at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenRevoked {
    pub identity_id: IdentityId,
    pub tenant_id: TenantId,
    pub token_id: TokenId,
    pub at_ms: i64,
}

/// An identity was deleted, and every token it held with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdentityDeleted {
    pub identity_id: IdentityId,
    pub tenant_id: TenantId,
    pub at_ms: i64,
}

domain_events! {
    /// Events of an identity's stream.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub enum IdentityEvent {
        Created(IdentityCreated) = "identity.created",
        TokenIssued(TokenIssued) = "identity.token_issued",
        TokenRevoked(TokenRevoked) = "identity.token_revoked",
        Deleted(IdentityDeleted) = "identity.deleted",
    }
}

/// A live token of an identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenRecord {
    pub token_id: TokenId,
    pub sha256: String,
    pub at_ms: i64,
}

/// An identity as its events left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdentityRecord {
    pub identity_id: IdentityId,
    pub tenant_id: TenantId,
    pub name: Identity,
    pub kind: SessionKind,
    pub admin: bool,
    pub at_ms: i64,
    pub tokens: Vec<TokenRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_at_ms: Option<i64>,
}

/// Applies one event of an identity's stream.
pub fn evolve_identity(state: Option<IdentityRecord>, event: &IdentityEvent) -> Option<IdentityRecord> {
    match (state, event) {
        (None, IdentityEvent::Created(e)) => Some(IdentityRecord {
            identity_id: e.identity_id.clone(),
            tenant_id: e.tenant_id.clone(),
            name: e.name.clone(),
            kind: e.kind,
            admin: e.admin,
            at_ms: e.at_ms,
            tokens: Vec::new(),
            deleted_at_ms: None,
        }),
        (Some(mut identity), IdentityEvent::TokenIssued(e)) => {
            identity.tokens.push(TokenRecord {
                token_id: e.token_id.clone(),
                sha256: e.sha256.clone(),
                at_ms: e.at_ms,
            });
            Some(identity)
        }
        (Some(mut identity), IdentityEvent::TokenRevoked(e)) => {
            identity.tokens.retain(|t| t.token_id != e.token_id);
            Some(identity)
        }
        (Some(identity), IdentityEvent::Deleted(e)) => {
            Some(IdentityRecord { deleted_at_ms: Some(e.at_ms), tokens: Vec::new(), ..identity })
        }
        (state, _) => state,
    }
}

/// Checks an identity's name: 3 to 256 printable characters without spaces (`alice@acme`, `ci-runner`).
pub fn check_identity_name(name: &str) -> Result<Identity, Rejection> {
    let count = name.chars().count();
    if !(3..=256).contains(&count) || name.chars().any(|c| c.is_control() || c.is_whitespace()) || name == "*" {
        return Err(Rejection::invalid("name", "must be 3 to 256 printable characters without spaces"));
    }
    name.parse().map_err(|err: crate::id::IdError| Rejection::invalid("name", err.to_string()))
}

/// `identities.create` as the domain decides it; `name_taken` says whether the tenant already has an identity
/// of that name (in the log or the bootstrap file).
pub fn create_identity(
    identity_id: &IdentityId,
    tenant_id: &TenantId,
    name: &str,
    kind: SessionKind,
    admin: bool,
    name_taken: bool,
    now_ms: i64,
) -> Result<Vec<IdentityEvent>, Rejection> {
    let name = check_identity_name(name)?;
    if name_taken {
        return Err(Rejection::Conflict(format!("tenant {tenant_id} already has an identity named {name}")));
    }
    Ok(vec![IdentityEvent::Created(IdentityCreated {
        identity_id: identity_id.clone(),
        tenant_id: tenant_id.clone(),
        name,
        kind,
        admin,
        at_ms: now_ms,
    })])
}

fn live<'a>(identity: Option<&'a IdentityRecord>, id: &IdentityId) -> Result<&'a IdentityRecord, Rejection> {
    identity
        .filter(|i| i.deleted_at_ms.is_none())
        .ok_or_else(|| Rejection::NotFound { kind: "identity", id: id.to_string() })
}

/// Decides issuing a token whose SHA-256 is `sha256` to an identity.
pub fn issue_token(
    identity: Option<&IdentityRecord>,
    id: &IdentityId,
    token_id: &TokenId,
    sha256: &str,
    now_ms: i64,
) -> Result<Vec<IdentityEvent>, Rejection> {
    let identity = live(identity, id)?;
    if identity.tokens.len() >= MAX_TOKENS_PER_IDENTITY {
        return Err(Rejection::Conflict(format!(
            "identity {id} already holds {MAX_TOKENS_PER_IDENTITY} tokens: revoke one first"
        )));
    }
    Ok(vec![IdentityEvent::TokenIssued(TokenIssued {
        identity_id: id.clone(),
        tenant_id: identity.tenant_id.clone(),
        token_id: token_id.clone(),
        sha256: sha256.to_owned(),
        at_ms: now_ms,
    })])
}

/// Decides revoking one of an identity's tokens.
pub fn revoke_token(
    identity: Option<&IdentityRecord>,
    id: &IdentityId,
    token_id: &TokenId,
    now_ms: i64,
) -> Result<Vec<IdentityEvent>, Rejection> {
    let identity = live(identity, id)?;
    if !identity.tokens.iter().any(|t| &t.token_id == token_id) {
        return Err(Rejection::NotFound { kind: "token", id: token_id.to_string() });
    }
    Ok(vec![IdentityEvent::TokenRevoked(TokenRevoked {
        identity_id: id.clone(),
        tenant_id: identity.tenant_id.clone(),
        token_id: token_id.clone(),
        at_ms: now_ms,
    })])
}

/// Decides deleting an identity (its tokens stop working with it).
pub fn delete_identity(
    identity: Option<&IdentityRecord>,
    id: &IdentityId,
    now_ms: i64,
) -> Result<Vec<IdentityEvent>, Rejection> {
    let identity = live(identity, id)?;
    Ok(vec![IdentityEvent::Deleted(IdentityDeleted {
        identity_id: id.clone(),
        tenant_id: identity.tenant_id.clone(),
        at_ms: now_ms,
    })])
}

/// A grant of a relation on pools to identities of a tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrantCreated {
    pub grant_id: GrantId,
    pub tenant_id: TenantId,
    /// One identity's name, or `*`: every identity of the tenant.
    pub identity: String,
    /// One pool, or `*`: every pool the tenant can see.
    pub pool: String,
    pub relation: Relation,
    pub at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrantRevoked {
    pub grant_id: GrantId,
    pub tenant_id: TenantId,
    pub at_ms: i64,
}

domain_events! {
    /// Events of a grant's stream.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub enum GrantEvent {
        Created(GrantCreated) = "grant.created",
        Revoked(GrantRevoked) = "grant.revoked",
    }
}

/// A grant as its events left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    #[serde(flatten)]
    pub created: GrantCreated,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at_ms: Option<i64>,
}

/// Applies one event of a grant's stream.
pub fn evolve_grant(state: Option<Grant>, event: &GrantEvent) -> Option<Grant> {
    match (state, event) {
        (None, GrantEvent::Created(e)) => Some(Grant { created: e.clone(), revoked_at_ms: None }),
        (Some(grant), GrantEvent::Revoked(e)) => Some(Grant { revoked_at_ms: Some(e.at_ms), ..grant }),
        (state, _) => state,
    }
}

/// `grants.create` as the domain decides it. `identity_known` and `pool_known` say whether the named identity
/// exists in the tenant and the named pool resolves for it (`*` needs neither).
#[allow(clippy::too_many_arguments)]
pub fn create_grant(
    grant_id: &GrantId,
    tenant_id: &TenantId,
    identity: &str,
    pool: &str,
    relation: Relation,
    identity_known: bool,
    pool_known: bool,
    now_ms: i64,
) -> Result<Vec<GrantEvent>, Rejection> {
    if identity != "*" {
        check_identity_name(identity)
            .map_err(|_| Rejection::invalid("identity", "must be `*` or an identity's name"))?;
        if !identity_known {
            return Err(Rejection::invalid("identity", format!("tenant {tenant_id} has no identity named {identity}")));
        }
    }
    if pool != "*" {
        pool.parse::<PoolId>().map_err(|err| Rejection::invalid("pool", format!("must be `*` or a pool id: {err}")))?;
        if !pool_known {
            return Err(Rejection::invalid("pool", format!("pool {pool} is not visible to tenant {tenant_id}")));
        }
    }
    Ok(vec![GrantEvent::Created(GrantCreated {
        grant_id: grant_id.clone(),
        tenant_id: tenant_id.clone(),
        identity: identity.to_owned(),
        pool: pool.to_owned(),
        relation,
        at_ms: now_ms,
    })])
}

/// Decides revoking a grant.
pub fn revoke_grant(grant: Option<&Grant>, id: &GrantId, now_ms: i64) -> Result<Vec<GrantEvent>, Rejection> {
    let grant = grant
        .filter(|g| g.revoked_at_ms.is_none())
        .ok_or_else(|| Rejection::NotFound { kind: "grant", id: id.to_string() })?;
    Ok(vec![GrantEvent::Revoked(GrantRevoked {
        grant_id: id.clone(),
        tenant_id: grant.created.tenant_id.clone(),
        at_ms: now_ms,
    })])
}

/// "Users of this pool may reserve up to 8 H100s for at most 72 hours."
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LimitCreated {
    pub limit_id: LimitId,
    pub pool_id: PoolId,
    pub owner_tenant_id: TenantId,
    /// Applies to callers whose best relation on the pool is this one or below.
    pub relation: Relation,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_gpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_hours: Option<u32>,
    pub at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LimitDeleted {
    pub limit_id: LimitId,
    pub pool_id: PoolId,
    pub at_ms: i64,
}

domain_events! {
    /// Events of an attribute limit's stream.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub enum LimitEvent {
        Created(LimitCreated) = "limit.created",
        Deleted(LimitDeleted) = "limit.deleted",
    }
}

/// A limit as its events left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Limit {
    #[serde(flatten)]
    pub created: LimitCreated,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_at_ms: Option<i64>,
}

/// Applies one event of a limit's stream.
pub fn evolve_limit(state: Option<Limit>, event: &LimitEvent) -> Option<Limit> {
    match (state, event) {
        (None, LimitEvent::Created(e)) => Some(Limit { created: e.clone(), deleted_at_ms: None }),
        (Some(limit), LimitEvent::Deleted(e)) => Some(Limit { deleted_at_ms: Some(e.at_ms), ..limit }),
        (state, _) => state,
    }
}

/// The largest `maxGpus` a limit takes.
pub const MAX_LIMIT_GPUS: u32 = 1_000_000;
/// The largest `maxHours` a limit takes (ten years).
pub const MAX_LIMIT_HOURS: u32 = 87_600;

/// `limits.create` as the domain decides it.
pub fn create_limit(
    limit_id: &LimitId,
    pool_id: &PoolId,
    owner_tenant_id: &TenantId,
    relation: Relation,
    max_gpus: Option<u32>,
    max_hours: Option<u32>,
    now_ms: i64,
) -> Result<Vec<LimitEvent>, Rejection> {
    if max_gpus.is_none() && max_hours.is_none() {
        return Err(Rejection::invalid("maxGpus", "give maxGpus, maxHours or both"));
    }
    if max_gpus.is_some_and(|n| n > MAX_LIMIT_GPUS) {
        return Err(Rejection::invalid("maxGpus", format!("must be at most {MAX_LIMIT_GPUS}")));
    }
    if max_hours.is_some_and(|n| n > MAX_LIMIT_HOURS) {
        return Err(Rejection::invalid("maxHours", format!("must be at most {MAX_LIMIT_HOURS}")));
    }
    if relation == Relation::Admin {
        return Err(Rejection::invalid(
            "relation",
            "a pool's administrators are never limited: viewer, user or operator",
        ));
    }
    Ok(vec![LimitEvent::Created(LimitCreated {
        limit_id: limit_id.clone(),
        pool_id: pool_id.clone(),
        owner_tenant_id: owner_tenant_id.clone(),
        relation,
        max_gpus,
        max_hours,
        at_ms: now_ms,
    })])
}

/// Decides deleting a limit of `pool_id`.
pub fn delete_limit(
    limit: Option<&Limit>,
    id: &LimitId,
    pool_id: &PoolId,
    now_ms: i64,
) -> Result<Vec<LimitEvent>, Rejection> {
    limit
        .filter(|l| l.deleted_at_ms.is_none() && &l.created.pool_id == pool_id)
        .ok_or_else(|| Rejection::NotFound { kind: "limit", id: id.to_string() })?;
    Ok(vec![LimitEvent::Deleted(LimitDeleted { limit_id: id.clone(), pool_id: pool_id.clone(), at_ms: now_ms })])
}

#[cfg(test)]
mod tests;
