//! Authorization: who a bearer token speaks for, and whether they may call a method on a resource.
//!
//! Every route names a method of the [normative table](catalog::METHODS). The handler resolves the resource from
//! Better Compute's own tables (its owner tenant, and for pools, nodes and reservations the pool with its
//! offerings and attributes), then asks the [`Authorizer`]. An allowed mutation runs as a [`Caller`] built from
//! the principal, so its admission context is recorded in the event's metadata; a denial is logged and counted,
//! and a denied reservation request is recorded as one `reservation.denied` event.

pub mod builtin;
pub mod catalog;
pub mod resolve;

use std::collections::BTreeMap;
use std::sync::Mutex;

use bc_domain::id::{Identity, PoolId, TenantId};
use futures_util::future::BoxFuture;

pub use builtin::BuiltinAuthorizer;
pub use catalog::{Catalog, InvalidConfig, MethodSpec, Relation, Requirement, Target};

use crate::Caller;

/// Who a request speaks for, as the authorizer authenticated it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub tenant_id: TenantId,
    pub identity: Identity,
    /// `user`, `service` or `agent`.
    pub session_kind: String,
    /// The agent acting for the identity, if any.
    pub agent: Option<String>,
    /// The delegation (an assumed role, a grant) the session runs under, if any.
    pub delegation: Option<String>,
    /// The tenant's ancestors, parent first (offerings with `includeDescendants` reach down this chain).
    pub ancestors: Vec<TenantId>,
}

impl Principal {
    /// The command layer's caller for this principal in the request `request_id`.
    pub fn caller(&self, request_id: &str) -> Caller {
        Caller {
            tenant_id: self.tenant_id.clone(),
            identity: self.identity.clone(),
            session_kind: self.session_kind.clone(),
            agent: self.agent.clone(),
            delegation: self.delegation.clone(),
            request_id: Some(request_id.to_owned()),
            ancestors: self.ancestors.clone(),
            causation_id: None,
            correlation_id: Some(request_id.to_owned()),
        }
    }

    /// Whether the principal is of the root tenant, the platform.
    pub fn is_root(&self) -> bool {
        self.tenant_id.as_str() == ROOT_TENANT
    }
}

/// The root tenant's id: the platform.
pub const ROOT_TENANT: &str = "root";

/// The value of an attribute policies read.
#[derive(Debug, Clone, PartialEq)]
pub enum Attribute {
    /// Not set (a node dedicated to no tenant, a reservation in no project).
    Absent,
    Bool(bool),
    Number(f64),
    Text(String),
}

impl Attribute {
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Attribute::Number(n) => Some(*n),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Attribute::Text(text) => Some(text),
            _ => None,
        }
    }
}

impl From<&str> for Attribute {
    fn from(text: &str) -> Self {
        Attribute::Text(text.to_owned())
    }
}

impl From<String> for Attribute {
    fn from(text: String) -> Self {
        Attribute::Text(text)
    }
}

impl From<f64> for Attribute {
    fn from(n: f64) -> Self {
        Attribute::Number(n)
    }
}

impl From<bool> for Attribute {
    fn from(b: bool) -> Self {
        Attribute::Bool(b)
    }
}

impl<T: Into<Attribute>> From<Option<T>> for Attribute {
    fn from(value: Option<T>) -> Self {
        value.map_or(Attribute::Absent, Into::into)
    }
}

/// A pool as decisions see it, resolved from Better Compute's tables.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolFacts {
    pub id: PoolId,
    pub owner_tenant_id: TenantId,
    /// The tenants it is offered to, and whether each offer reaches the tenant's descendants.
    pub offers: Vec<(TenantId, bool)>,
    /// `region`, `class`, `gpuModel`, `gpuMemoryGb`, `sharing`.
    pub attributes: BTreeMap<String, Attribute>,
}

/// The resource a method is decided on.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    pub target: Target,
    /// Its id (`global` for the fleet, the tenant id for a tenant scope).
    pub id: String,
    /// The tenant it resolves in, from trusted storage (never from the request).
    pub tenant_id: TenantId,
    /// The pool itself, or the parent pool of a node or reservation.
    pub pool: Option<PoolFacts>,
    /// The attributes policies can read (for a reservation draft: `gpuCount`, `durationHours`, ...).
    pub attributes: BTreeMap<String, Attribute>,
}

impl Resource {
    /// A scope: `tenant/{t}`, or `fleet/global` in the root tenant.
    pub fn scope(target: Target, tenant: &TenantId) -> Resource {
        let id = if target == Target::Fleet { "global".to_owned() } else { tenant.to_string() };
        let tenant_id = if target == Target::Fleet { root_tenant() } else { tenant.clone() };
        Resource { target, id, tenant_id, pool: None, attributes: BTreeMap::new() }
    }
}

pub(crate) fn root_tenant() -> TenantId {
    ROOT_TENANT.parse().expect("root is a valid tenant id")
}

/// The answer to one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// The resource does not resolve for the caller: answered `404`, as if it did not exist.
    NotFound,
    /// The caller may see the resource but not do this: `403 FORBIDDEN` with the reason.
    Deny(String),
    /// The caller's tenant (or an ancestor) is suspended and this would start new work: `403 TENANT_SUSPENDED`.
    Suspended(String),
}

/// A tenant as the authorizer knows it (from its bootstrap file, or made through the API).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantView {
    pub id: TenantId,
    /// `None` for the root tenant only.
    pub parent_id: Option<TenantId>,
    pub name: Option<String>,
    /// `active`, `suspended` (or the file's `pending`, `deleted`).
    pub state: &'static str,
    pub suspended_reason: Option<String>,
    /// Made through the API (its changes are events), not by the bootstrap file.
    pub in_log: bool,
    pub created_at_ms: Option<i64>,
    /// Its ancestors, parent first (empty for the root; their count is how deep it sits).
    pub ancestors: Vec<TenantId>,
}

/// Tenancy as the inline tables hold it, for an authorizer to load.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Directory {
    pub tenants: Vec<DirectoryTenant>,
    pub identities: Vec<DirectoryIdentity>,
    pub grants: Vec<DirectoryGrant>,
    pub limits: Vec<DirectoryLimit>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectoryTenant {
    pub id: TenantId,
    pub parent_id: TenantId,
    pub name: String,
    /// Set while suspended.
    pub suspended_reason: Option<String>,
    pub created_at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectoryIdentity {
    pub tenant_id: TenantId,
    pub name: Identity,
    pub kind: String,
    pub admin: bool,
    /// The hex SHA-256 of each live token.
    pub tokens: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectoryGrant {
    pub tenant_id: TenantId,
    pub identity: String,
    pub pool: String,
    pub relation: Relation,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectoryLimit {
    pub pool_id: PoolId,
    pub relation: Relation,
    pub max_gpus: Option<u32>,
    pub max_hours: Option<u32>,
}

/// Decides who a token is and what they may do. The built-in one reads a file; another could ask Better IAM.
pub trait Authorizer: Send + Sync + std::fmt::Debug + 'static {
    /// The principal a bearer token speaks for, or `None` when the token is unknown.
    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Option<Principal>>;

    /// Whether `principal` may call `method` on `resource`.
    fn decide<'a>(
        &'a self,
        principal: &'a Principal,
        method: &'a MethodSpec,
        resource: &'a Resource,
    ) -> BoxFuture<'a, Decision>;

    /// Types and actions this authorizer adds to the catalog the method table is checked against.
    fn catalog(&self) -> Catalog {
        Catalog::default()
    }

    /// The prefix of Better Compute's resource type names.
    fn prefix(&self) -> &str {
        catalog::DEFAULT_PREFIX
    }

    /// Whether tenants, identities, grants and limits are administered through this service's API (the
    /// built-in authorizer); an external decision service administers its own.
    fn administers_tenancy(&self) -> bool {
        false
    }

    /// Every tenant known, the root first.
    fn tenants(&self) -> Vec<TenantView> {
        Vec::new()
    }

    /// One tenant.
    fn tenant(&self, _id: &TenantId) -> Option<TenantView> {
        None
    }

    /// Whether the bootstrap file already names `name` in `tenant` (the API cannot give that name again).
    fn file_identity(&self, _tenant: &TenantId, _name: &Identity) -> bool {
        false
    }

    /// Takes tenancy as the inline tables now hold it.
    fn reload(&self, _directory: &Directory) {}

    /// The principal of a known identity (for a stream ticket, which names it), if it is still known.
    fn principal(&self, _tenant: &TenantId, _identity: &Identity) -> Option<Principal> {
        None
    }
}

/// Denials by method, since start: logged one by one, counted here.
#[derive(Debug, Default)]
pub struct DenialCounts(Mutex<BTreeMap<(&'static str, &'static str), u64>>);

impl DenialCounts {
    /// Counts one denial of `method` (`kind`: `unauthenticated`, `not_found` or `forbidden`).
    pub fn count(&self, method: &'static str, kind: &'static str) {
        let mut counts = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *counts.entry((method, kind)).or_default() += 1;
    }

    /// The counts, by (method, kind).
    pub fn snapshot(&self) -> BTreeMap<(&'static str, &'static str), u64> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// How many denied reservation requests of one identity are recorded per minute; past that they are still
/// refused, logged and counted, but not recorded, so no caller can grow the log without bound.
pub const RECORDED_DENIALS_PER_MINUTE: u32 = 30;

/// How many refused reservation requests of one identity are explained node by node per minute. That read covers
/// every node of the pool (about 14 µs a node: 140 ms at 10,000) and a refusal writes nothing, so past this a
/// refusal is explained by its rule, quota line and reads alone, and says why.
pub const DIAGNOSED_REFUSALS_PER_MINUTE: u32 = 60;

/// A budget per identity in one-minute windows: of recorded denials, or of refusals explained node by node.
#[derive(Debug)]
pub struct IdentityBudget {
    per_minute: u32,
    buckets: Mutex<BTreeMap<(TenantId, Identity), (std::time::Instant, u32)>>,
}

impl IdentityBudget {
    pub fn per_minute(per_minute: u32) -> Self {
        IdentityBudget { per_minute, buckets: Mutex::default() }
    }

    /// How many the budget allows an identity each minute.
    pub fn limit(&self) -> u32 {
        self.per_minute
    }

    /// Whether this identity may spend one more now (and spends it).
    pub fn take(&self, tenant: &TenantId, identity: &Identity) -> bool {
        let now = std::time::Instant::now();
        let window = std::time::Duration::from_secs(60);
        let mut buckets = self.buckets.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if buckets.len() > 10_000 {
            buckets.retain(|_, (start, _)| now.duration_since(*start) < window);
        }
        let bucket = buckets.entry((tenant.clone(), identity.clone())).or_insert((now, 0));
        if now.duration_since(bucket.0) >= window {
            *bucket = (now, 0);
        }
        if bucket.1 >= self.per_minute {
            return false;
        }
        bucket.1 += 1;
        true
    }
}

/// Checks the method table against the authorizer's merged catalog, every method `routed` names included.
pub fn check_config(authorizer: &dyn Authorizer, routed: &[&str]) -> Result<(), InvalidConfig> {
    let prefix = authorizer.prefix();
    let merged = Catalog::compute(prefix).merge(authorizer.catalog());
    catalog::check(&merged, prefix, catalog::METHODS, routed)
}
