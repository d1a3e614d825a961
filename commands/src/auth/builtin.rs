//! The built-in authorizer, configured from a TOML file: bearer tokens to identities and tenants, the tenant
//! tree, relations on pools and attribute limits on reservations.
//!
//! ```toml
//! [[tenants]]
//! id = "acme"            # the root tenant ("root", the platform) always exists
//! parent = "root"
//! status = "active"      # pending | active | suspended | deleted
//!
//! [[identities]]
//! identity = "alice@acme"
//! tenant = "acme"
//! token_sha256 = "..."   # hex SHA-256 of the bearer token (or `token = "..."`, for development)
//! admin = false          # an administrator of the tenant: sites, pools, projects, quotas, its own pools
//! kind = "user"          # the session kind recorded with each mutation: user | service | agent
//!
//! [[grants]]             # a relation on pools to identities of a tenant
//! tenant = "acme"
//! identity = "*"         # one identity, or every identity of the tenant
//! pool = "*"             # one pool id, or every pool the tenant can see (its own, or offered to it)
//! relation = "user"      # viewer | user | operator | admin
//!
//! [[limits]]             # "users of this pool may reserve up to 8 H100s for at most 72 hours"
//! pool = "*"
//! relation = "user"      # applies to callers whose best relation on the pool is this one or below
//! gpu_model = "H100"     # optional: only pools of this GPU model
//! max_gpus = 8
//! max_hours = 72
//! ```
//!
//! A tenant sees its own records only: parents grant nothing to children. A pool resolves for its owner tenant
//! and for the tenants it is offered to (with `includeDescendants`, their descendants too), who are its viewers;
//! more than viewing takes a grant (or, in the owner tenant, being its administrator).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, RwLock};

use bc_domain::id::{Identity, TenantId};
use futures_util::future::BoxFuture;
use serde::Deserialize;

use super::catalog::{MethodSpec, Relation, Requirement, Target};
use super::{Attribute, Authorizer, Decision, Directory, PoolFacts, Principal, ROOT_TENANT, Resource, TenantView};

/// A tenant's status; authorization needs the tenant and every ancestor active.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TenantStatus {
    Pending,
    #[default]
    Active,
    Suspended,
    Deleted,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantConfig {
    id: TenantId,
    parent: Option<TenantId>,
    #[serde(default)]
    status: TenantStatus,
    name: Option<String>,
    /// Made through the API (its changes are events), not by the file.
    #[serde(skip)]
    in_log: bool,
    #[serde(skip)]
    suspended_reason: Option<String>,
    #[serde(skip)]
    created_at_ms: Option<i64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct IdentityConfig {
    identity: Identity,
    tenant: TenantId,
    token: Option<String>,
    token_sha256: Option<String>,
    #[serde(default)]
    admin: bool,
    #[serde(default = "default_kind")]
    kind: String,
    agent: Option<String>,
    delegation: Option<String>,
}

fn default_kind() -> String {
    "user".to_owned()
}

fn any() -> String {
    "*".to_owned()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantConfig {
    tenant: TenantId,
    #[serde(default = "any")]
    identity: String,
    #[serde(default = "any")]
    pool: String,
    relation: Relation,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitConfig {
    #[serde(default = "any")]
    pool: String,
    relation: Relation,
    gpu_model: Option<String>,
    max_gpus: Option<u32>,
    max_hours: Option<u32>,
}

/// The file's shape.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    prefix: Option<String>,
    #[serde(default)]
    tenants: Vec<TenantConfig>,
    #[serde(default)]
    identities: Vec<IdentityConfig>,
    #[serde(default)]
    grants: Vec<GrantConfig>,
    #[serde(default)]
    limits: Vec<LimitConfig>,
}

/// What is wrong with an authorization file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("INVALID_CONFIG: cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("INVALID_CONFIG: {0}")]
    Invalid(String),
}

/// The built-in authorizer: the bootstrap file, and over it what the log holds (tenants, identities with their
/// tokens, grants and limits made through the API), reloaded from the inline tables whenever the log changes them.
#[derive(Debug)]
pub struct BuiltinAuthorizer {
    prefix: String,
    /// What the file alone says.
    file: Arc<Snapshot>,
    /// The file with the log's entries over it: what decisions read.
    current: RwLock<Arc<Snapshot>>,
}

/// One consistent view of every tenant, token, grant and limit.
#[derive(Debug, Clone, Default)]
struct Snapshot {
    /// By the hex SHA-256 of the token.
    accounts: HashMap<String, Principal>,
    admins: Vec<(TenantId, Identity)>,
    tenants: BTreeMap<TenantId, TenantConfig>,
    grants: Vec<GrantConfig>,
    limits: Vec<LimitConfig>,
}

/// The hex SHA-256 of a token, as `token_sha256` holds it.
pub fn token_sha256(token: &str) -> String {
    bc_domain::sha256_hex(token)
}

impl BuiltinAuthorizer {
    /// Reads and checks a TOML file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
        Self::from_toml(&text).map_err(|err| match err {
            ConfigError::Invalid(message) => ConfigError::Invalid(format!("{}: {message}", path.display())),
            other => other,
        })
    }

    /// Parses and checks the configuration.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let config: AuthConfig = toml::from_str(text).map_err(|err| ConfigError::Invalid(err.to_string()))?;
        Self::new(config)
    }

    /// An authorizer that knows no token: every call from outside is `UNAUTHENTICATED`.
    pub fn nobody() -> Self {
        Self::new(AuthConfig::default()).expect("an empty configuration is valid")
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        Arc::clone(&self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    pub fn new(config: AuthConfig) -> Result<Self, ConfigError> {
        let invalid = |message: String| Err(ConfigError::Invalid(message));
        let mut tenants = BTreeMap::new();
        let root: TenantId = ROOT_TENANT.parse().map_err(|_| ConfigError::Invalid("root".into()))?;
        let root_config = TenantConfig {
            id: root.clone(),
            parent: None,
            status: TenantStatus::Active,
            name: Some("the platform".to_owned()),
            in_log: false,
            suspended_reason: None,
            created_at_ms: None,
        };
        tenants.insert(root.clone(), root_config);
        for tenant in config.tenants {
            if tenant.id == root {
                if tenant.parent.is_some() {
                    return invalid("the root tenant has no parent".into());
                }
                continue;
            }
            let Some(parent) = &tenant.parent else {
                return invalid(format!("tenant {} needs a parent (the root tenant is \"root\")", tenant.id));
            };
            if parent == &tenant.id {
                return invalid(format!("tenant {} is its own parent", tenant.id));
            }
            if tenants.insert(tenant.id.clone(), tenant.clone()).is_some() {
                return invalid(format!("tenant {} is listed twice", tenant.id));
            }
        }
        for tenant in tenants.values() {
            let mut seen = vec![tenant.id.clone()];
            let mut at = tenant.parent.clone();
            while let Some(parent) = at {
                let Some(next) = tenants.get(&parent) else {
                    return invalid(format!("tenant {}: parent {parent} is not a listed tenant", tenant.id));
                };
                if seen.contains(&parent) {
                    return invalid(format!("tenant {} is its own ancestor", tenant.id));
                }
                seen.push(parent.clone());
                at = next.parent.clone();
            }
        }
        let prefix = config.prefix.unwrap_or_else(|| super::catalog::DEFAULT_PREFIX.to_owned());
        let mut authorizer = Snapshot { tenants, ..Snapshot::default() };
        for (i, entry) in config.identities.into_iter().enumerate() {
            if !authorizer.tenants.contains_key(&entry.tenant) {
                return invalid(format!("identities[{i}]: tenant {} is not a listed tenant", entry.tenant));
            }
            let hash = match (&entry.token, &entry.token_sha256) {
                (Some(token), None) if token.len() >= 16 => token_sha256(token),
                (Some(_), None) => return invalid(format!("identities[{i}]: token must be at least 16 characters")),
                (None, Some(hash)) if hash.len() == 64 && hash.chars().all(|c| c.is_ascii_hexdigit()) => {
                    hash.to_ascii_lowercase()
                }
                (None, Some(_)) => return invalid(format!("identities[{i}]: token_sha256 must be 64 hex digits")),
                _ => return invalid(format!("identities[{i}]: give exactly one of token and token_sha256")),
            };
            if !matches!(entry.kind.as_str(), "user" | "service" | "agent") {
                return invalid(format!("identities[{i}]: kind must be user, service or agent"));
            }
            let principal = Principal {
                ancestors: authorizer.ancestors(&entry.tenant),
                tenant_id: entry.tenant.clone(),
                identity: entry.identity.clone(),
                session_kind: entry.kind,
                agent: entry.agent,
                delegation: entry.delegation,
            };
            if entry.admin {
                authorizer.admins.push((entry.tenant, entry.identity));
            }
            if authorizer.accounts.insert(hash, principal).is_some() {
                return invalid(format!("identities[{i}]: the token is already given to another identity"));
            }
        }
        for (i, grant) in config.grants.iter().enumerate() {
            if !authorizer.tenants.contains_key(&grant.tenant) {
                return invalid(format!("grants[{i}]: tenant {} is not a listed tenant", grant.tenant));
            }
        }
        for (i, limit) in config.limits.iter().enumerate() {
            if limit.max_gpus.is_none() && limit.max_hours.is_none() {
                return invalid(format!("limits[{i}]: give max_gpus, max_hours or both"));
            }
        }
        authorizer.grants = config.grants;
        authorizer.limits = config.limits;
        let file = Arc::new(authorizer);
        Ok(BuiltinAuthorizer { prefix, current: RwLock::new(Arc::clone(&file)), file })
    }

    /// The file's entries with the log's over them. An entry of the log that collides with the file's (which the
    /// commands refuse to make) is skipped with a warning: the file wins.
    fn merged(&self, directory: &Directory) -> Snapshot {
        let mut next = (*self.file).clone();
        for tenant in &directory.tenants {
            if next.tenants.contains_key(&tenant.id) {
                tracing::warn!(tenant = %tenant.id, "a tenant of the log has the id of one of the file's; the file's wins");
                continue;
            }
            let status = if tenant.suspended_reason.is_some() { TenantStatus::Suspended } else { TenantStatus::Active };
            next.tenants.insert(
                tenant.id.clone(),
                TenantConfig {
                    id: tenant.id.clone(),
                    parent: Some(tenant.parent_id.clone()),
                    status,
                    name: Some(tenant.name.clone()),
                    in_log: true,
                    suspended_reason: tenant.suspended_reason.clone(),
                    created_at_ms: Some(tenant.created_at_ms),
                },
            );
        }
        for identity in &directory.identities {
            if !next.tenants.contains_key(&identity.tenant_id) {
                tracing::warn!(identity = %identity.name, tenant = %identity.tenant_id, "an identity of an unknown tenant is skipped");
                continue;
            }
            let principal = Principal {
                ancestors: next.ancestors(&identity.tenant_id),
                tenant_id: identity.tenant_id.clone(),
                identity: identity.name.clone(),
                session_kind: identity.kind.clone(),
                agent: None,
                delegation: None,
            };
            if identity.admin {
                next.admins.push((identity.tenant_id.clone(), identity.name.clone()));
            }
            for sha256 in &identity.tokens {
                if next.accounts.contains_key(sha256) {
                    tracing::warn!(identity = %identity.name, "a token of the log is the file's; the file's wins");
                    continue;
                }
                next.accounts.insert(sha256.clone(), principal.clone());
            }
        }
        for grant in &directory.grants {
            next.grants.push(GrantConfig {
                tenant: grant.tenant_id.clone(),
                identity: grant.identity.clone(),
                pool: grant.pool.clone(),
                relation: grant.relation,
            });
        }
        for limit in &directory.limits {
            next.limits.push(LimitConfig {
                pool: limit.pool_id.to_string(),
                relation: limit.relation,
                gpu_model: None,
                max_gpus: limit.max_gpus,
                max_hours: limit.max_hours,
            });
        }
        next
    }
}

impl TenantConfig {
    fn view(&self, ancestors: Vec<TenantId>) -> TenantView {
        let state = match self.status {
            TenantStatus::Pending => "pending",
            TenantStatus::Active => "active",
            TenantStatus::Suspended => "suspended",
            TenantStatus::Deleted => "deleted",
        };
        TenantView {
            id: self.id.clone(),
            parent_id: self.parent.clone(),
            name: self.name.clone(),
            state,
            suspended_reason: self.suspended_reason.clone(),
            in_log: self.in_log,
            created_at_ms: self.created_at_ms,
            ancestors,
        }
    }
}

impl Snapshot {
    /// A tenant's ancestors, parent first.
    fn ancestors(&self, tenant: &TenantId) -> Vec<TenantId> {
        let mut out = Vec::new();
        let mut at = self.tenants.get(tenant).and_then(|t| t.parent.clone());
        // The file is checked for cycles and the log's tenants name existing parents; the bound is a backstop.
        while let Some(parent) = at {
            if out.len() > bc_domain::tenancy::MAX_DEPTH * 2 || out.contains(&parent) {
                break;
            }
            at = self.tenants.get(&parent).and_then(|t| t.parent.clone());
            out.push(parent);
        }
        out
    }

    /// The first of the principal's tenant and its ancestors that is not active, with its status.
    fn inactive<'a>(&self, principal: &'a Principal) -> Option<(&'a TenantId, TenantStatus)> {
        std::iter::once(&principal.tenant_id).chain(&principal.ancestors).find_map(|t| {
            let status = self.tenants.get(t).map_or(TenantStatus::Deleted, |t| t.status);
            (status != TenantStatus::Active).then_some((t, status))
        })
    }

    fn is_admin(&self, principal: &Principal) -> bool {
        self.admins.iter().any(|(t, i)| *t == principal.tenant_id && *i == principal.identity)
    }

    /// The caller's best relation on a pool; `None` when the pool does not resolve for its tenant.
    fn relation(&self, principal: &Principal, pool: &PoolFacts) -> Option<Relation> {
        let owner = pool.owner_tenant_id == principal.tenant_id;
        let offered = pool.offers.iter().any(|(tenant, descendants)| {
            *tenant == principal.tenant_id || (*descendants && principal.ancestors.contains(tenant))
        });
        if !owner && !offered {
            return None;
        }
        if owner && self.is_admin(principal) {
            return Some(Relation::Admin);
        }
        let granted = self
            .grants
            .iter()
            .filter(|g| g.tenant == principal.tenant_id)
            .filter(|g| g.identity == "*" || g.identity == principal.identity.as_str())
            .filter(|g| g.pool == "*" || g.pool == pool.id.as_str())
            .map(|g| g.relation)
            .max();
        Some(granted.map_or(Relation::Viewer, |g| g.max(Relation::Viewer)))
    }

    /// The first attribute limit the request breaks, as a reason.
    fn limit_broken(
        &self,
        relation: Relation,
        pool: &PoolFacts,
        attributes: &BTreeMap<String, Attribute>,
    ) -> Option<String> {
        // A reservation's GPUs are `gpuCount`, an instance's `gpus`.
        let count =
            attributes.get("gpuCount").or_else(|| attributes.get("gpus")).and_then(Attribute::as_f64).unwrap_or(0.0);
        let hours = attributes.get("durationHours").and_then(Attribute::as_f64).unwrap_or(0.0);
        let model = pool.attributes.get("gpuModel").and_then(Attribute::as_str);
        for limit in &self.limits {
            if relation > limit.relation || (limit.pool != "*" && limit.pool != pool.id.as_str()) {
                continue;
            }
            if limit.gpu_model.as_deref().is_some_and(|wanted| Some(wanted) != model) {
                continue;
            }
            let who = format!("{}s of pool {}", limit.relation.as_str(), pool.id);
            let what = limit.gpu_model.as_deref().map_or_else(|| "GPUs".to_owned(), |m| format!("{m} GPUs"));
            if let Some(max) = limit.max_gpus
                && count > f64::from(max)
            {
                return Some(format!("{who} may reserve at most {max} {what}; the request asks for {count}"));
            }
            if let Some(max) = limit.max_hours
                && hours > f64::from(max)
            {
                return Some(format!("{who} may reserve {what} for at most {max} hours; the request asks for {hours}"));
            }
        }
        None
    }

    fn decide_now(&self, principal: &Principal, method: &MethodSpec, resource: &Resource) -> Decision {
        match self.inactive(principal) {
            // A suspended tenant reads, and ends or keeps alive what it already runs; it starts nothing new.
            Some((tenant, TenantStatus::Suspended))
                if method.mutation && !ENDS_OR_KEEPS_WORK.contains(&method.method) =>
            {
                return Decision::Suspended(format!(
                    "tenant {tenant} is suspended: {} is refused until it is resumed (what already runs keeps running)",
                    method.method
                ));
            }
            None | Some((_, TenantStatus::Suspended)) => {}
            Some((tenant, _)) => return Decision::Deny(format!("tenant {tenant} is not active")),
        }
        if method.requirement == Requirement::TenancyAdmin && resource.tenant_id != principal.tenant_id {
            // Administering a tenant (its identities, tokens, grants and children) is for its own administrators
            // and its ancestors' (the platform's administer every tenant); parents still see none of its records.
            if !self.ancestors(&resource.tenant_id).contains(&principal.tenant_id) {
                return Decision::NotFound;
            }
            return if self.is_admin(principal) {
                Decision::Allow
            } else {
                Decision::Deny(format!("{} needs an administrator of tenant {}", method.method, principal.tenant_id))
            };
        }
        let admin = || {
            if self.is_admin(principal) {
                Decision::Allow
            } else {
                Decision::Deny(format!("{} needs an administrator of tenant {}", method.method, principal.tenant_id))
            }
        };
        match (method.target, resource.pool.as_ref()) {
            // A public image is every tenant's to read; only its own tenant changes it.
            (Target::Image, _)
                if resource.tenant_id != principal.tenant_id
                    && !method.mutation
                    && resource.attributes.get("visibility") == Some(&Attribute::Text("public".to_owned())) =>
            {
                Decision::Allow
            }
            (
                Target::Fleet
                | Target::Tenant
                | Target::Site
                | Target::Image
                | Target::Profile
                | Target::ProviderAccount,
                _,
            )
            | (Target::Reservation | Target::Instance, _)
                if !matches!(method.requirement, Requirement::Pool(_)) =>
            {
                if resource.tenant_id != principal.tenant_id {
                    return Decision::NotFound;
                }
                match method.requirement {
                    Requirement::TenantAdmin | Requirement::TenancyAdmin => admin(),
                    _ => Decision::Allow,
                }
            }
            (_, Some(pool)) => {
                if matches!(method.target, Target::Reservation | Target::Instance)
                    && resource.tenant_id != principal.tenant_id
                {
                    return Decision::NotFound;
                }
                let Some(relation) = self.relation(principal, pool) else { return Decision::NotFound };
                let needed = match method.requirement {
                    Requirement::Pool(needed) => needed,
                    Requirement::Member => Relation::Viewer,
                    Requirement::TenantAdmin | Requirement::TenancyAdmin => return admin(),
                };
                if relation < needed {
                    return Decision::Deny(format!(
                        "{} needs the {} relation on pool {}; {} has {}",
                        method.method,
                        needed.as_str(),
                        pool.id,
                        principal.identity,
                        relation.as_str()
                    ));
                }
                if matches!(method.target, Target::Reservation | Target::Instance)
                    && let Some(reason) = self.limit_broken(relation, pool, &resource.attributes)
                {
                    return Decision::Deny(reason);
                }
                Decision::Allow
            }
            (_, None) => Decision::NotFound,
        }
    }
}

/// The mutations a suspended tenant may still make: ending its reservations, and renewing their leases so that
/// what runs keeps running.
const ENDS_OR_KEEPS_WORK: &[&str] =
    &["reservations.cancel", "reservations.release", "reservations.renew", "instances.stop", "instances.delete"];

impl Authorizer for BuiltinAuthorizer {
    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Option<Principal>> {
        let found = self.snapshot().accounts.get(&token_sha256(token)).cloned();
        Box::pin(async move { found })
    }

    fn decide<'a>(
        &'a self,
        principal: &'a Principal,
        method: &'a MethodSpec,
        resource: &'a Resource,
    ) -> BoxFuture<'a, Decision> {
        let decision = self.snapshot().decide_now(principal, method, resource);
        Box::pin(async move { decision })
    }

    fn prefix(&self) -> &str {
        &self.prefix
    }

    fn administers_tenancy(&self) -> bool {
        true
    }

    fn tenants(&self) -> Vec<TenantView> {
        let snapshot = self.snapshot();
        snapshot.tenants.values().map(|t| t.view(snapshot.ancestors(&t.id))).collect()
    }

    fn tenant(&self, id: &TenantId) -> Option<TenantView> {
        let snapshot = self.snapshot();
        snapshot.tenants.get(id).map(|t| t.view(snapshot.ancestors(id)))
    }

    fn file_identity(&self, tenant: &TenantId, name: &Identity) -> bool {
        // Every identity of the file has a token, so the file's accounts name them all.
        self.file.accounts.values().any(|p| p.tenant_id == *tenant && p.identity == *name)
    }

    fn principal(&self, tenant: &TenantId, identity: &Identity) -> Option<Principal> {
        self.snapshot().accounts.values().find(|p| p.tenant_id == *tenant && p.identity == *identity).cloned()
    }

    fn reload(&self, directory: &Directory) {
        let next = Arc::new(self.merged(directory));
        *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::catalog::method;
    use crate::auth::{DirectoryIdentity, DirectoryTenant};

    const CONFIG: &str = r#"
        [[tenants]]
        id = "acme"
        parent = "root"

        [[tenants]]
        id = "acme-research"
        parent = "acme"

        [[tenants]]
        id = "globex"
        parent = "root"

        [[tenants]]
        id = "initech"
        parent = "root"
        status = "suspended"

        [[identities]]
        identity = "ops@platform"
        tenant = "root"
        token = "root-token-0123456789"
        admin = true

        [[identities]]
        identity = "alice@acme"
        tenant = "acme"
        token = "alice-token-0123456789"

        [[identities]]
        identity = "bob@acme"
        tenant = "acme"
        token_sha256 = "TOKEN_HASH"

        [[identities]]
        identity = "rita@research"
        tenant = "acme-research"
        token = "rita-token-0123456789"

        [[identities]]
        identity = "gus@globex"
        tenant = "globex"
        token = "gus-token-0123456789"
        admin = true

        [[identities]]
        identity = "ian@initech"
        tenant = "initech"
        token = "ian-token-0123456789"

        [[grants]]
        tenant = "acme"
        relation = "user"

        [[grants]]
        tenant = "acme"
        identity = "bob@acme"
        pool = "pool_01m8q000000000000000000001"
        relation = "operator"

        [[limits]]
        relation = "user"
        gpu_model = "H100"
        max_gpus = 8
        max_hours = 72
    "#;

    fn authorizer() -> BuiltinAuthorizer {
        let config = CONFIG.replace("TOKEN_HASH", &token_sha256("bob-token-0123456789"));
        BuiltinAuthorizer::from_toml(&config).expect("valid config")
    }

    async fn who(a: &BuiltinAuthorizer, token: &str) -> Principal {
        a.authenticate(token).await.expect("known token")
    }

    fn pool(offers: &[(&str, bool)]) -> PoolFacts {
        PoolFacts {
            id: "pool_01m8q000000000000000000001".parse().expect("pool id"),
            owner_tenant_id: "root".parse().expect("tenant"),
            offers: offers.iter().map(|(t, d)| (t.parse().expect("tenant"), *d)).collect(),
            attributes: BTreeMap::from([("gpuModel".to_owned(), Attribute::from("H100"))]),
        }
    }

    fn draft(tenant: &Principal, pool: PoolFacts, gpus: u32, hours: u32) -> Resource {
        Resource {
            target: Target::Reservation,
            id: "rsv_draft".into(),
            tenant_id: tenant.tenant_id.clone(),
            pool: Some(pool),
            attributes: BTreeMap::from([
                ("gpuCount".to_owned(), Attribute::Number(f64::from(gpus))),
                ("durationHours".to_owned(), Attribute::Number(f64::from(hours))),
            ]),
        }
    }

    fn spec(name: &str) -> &'static MethodSpec {
        method(name).expect("in the method table")
    }

    #[tokio::test]
    async fn tokens_authenticate_by_their_hash_and_carry_the_tenant_tree() {
        let a = authorizer();
        let bob = who(&a, "bob-token-0123456789").await;
        assert_eq!(bob.identity.as_str(), "bob@acme");
        let rita = who(&a, "rita-token-0123456789").await;
        assert_eq!(rita.ancestors, vec!["acme".parse::<TenantId>().expect("t"), "root".parse().expect("t")]);
        assert_eq!(rita.session_kind, "user");
        assert!(a.authenticate("nobody-token-0123456789").await.is_none());
        assert!(a.authenticate("").await.is_none());
    }

    #[tokio::test]
    async fn a_pool_resolves_only_for_its_owner_and_the_tenants_it_is_offered_to() {
        let a = authorizer();
        let alice = who(&a, "alice-token-0123456789").await;
        let gus = who(&a, "gus-token-0123456789").await;
        let rita = who(&a, "rita-token-0123456789").await;
        let get = spec("pools.get");
        let resource = |facts: PoolFacts| Resource {
            target: Target::Pool,
            id: facts.id.to_string(),
            tenant_id: facts.owner_tenant_id.clone(),
            attributes: BTreeMap::new(),
            pool: Some(facts),
        };
        assert_eq!(a.decide(&alice, get, &resource(pool(&[]))).await, Decision::NotFound);
        assert_eq!(a.decide(&alice, get, &resource(pool(&[("acme", false)]))).await, Decision::Allow);
        assert_eq!(a.decide(&gus, get, &resource(pool(&[("acme", false)]))).await, Decision::NotFound);
        // Offers reach descendants only when they say so; parents never grant anything to children.
        assert_eq!(a.decide(&rita, get, &resource(pool(&[("acme", false)]))).await, Decision::NotFound);
        assert_eq!(a.decide(&rita, get, &resource(pool(&[("acme", true)]))).await, Decision::Allow);
        // The owner tenant's administrator administers its pools.
        let root = who(&a, "root-token-0123456789").await;
        assert_eq!(a.decide(&root, spec("pools.offer"), &resource(pool(&[]))).await, Decision::Allow);
        let offer = a.decide(&alice, spec("pools.offer"), &resource(pool(&[("acme", false)]))).await;
        assert!(matches!(offer, Decision::Deny(reason) if reason.contains("needs the admin relation")));
    }

    #[tokio::test]
    async fn reserving_takes_the_user_relation_and_keeps_within_the_attribute_limits() {
        let a = authorizer();
        let alice = who(&a, "alice-token-0123456789").await;
        let create = spec("reservations.create");
        let offered = pool(&[("acme", false)]);
        assert_eq!(a.decide(&alice, create, &draft(&alice, offered.clone(), 8, 72)).await, Decision::Allow);
        let nine = a.decide(&alice, create, &draft(&alice, offered.clone(), 9, 72)).await;
        assert!(matches!(&nine, Decision::Deny(r) if r.contains("at most 8 H100 GPUs")), "{nine:?}");
        let long = a.decide(&alice, create, &draft(&alice, offered.clone(), 8, 73)).await;
        assert!(matches!(&long, Decision::Deny(r) if r.contains("at most 72 hours")), "{long:?}");
        // The limit is for users: an operator of the pool is not held to it.
        let bob = who(&a, "bob-token-0123456789").await;
        assert_eq!(a.decide(&bob, create, &draft(&bob, offered.clone(), 9, 100)).await, Decision::Allow);
        // Another pool model is not limited; a tenant with no grant only views.
        let mut other = offered.clone();
        other.attributes.insert("gpuModel".into(), Attribute::from("A100"));
        assert_eq!(a.decide(&alice, create, &draft(&alice, other, 16, 100)).await, Decision::Allow);
        let gus = who(&a, "gus-token-0123456789").await;
        let viewer = a.decide(&gus, create, &draft(&gus, pool(&[("globex", false)]), 1, 1)).await;
        assert!(matches!(viewer, Decision::Deny(r) if r.contains("needs the user relation")));
    }

    #[tokio::test]
    async fn tenants_act_only_on_their_own_records() {
        let a = authorizer();
        let alice = who(&a, "alice-token-0123456789").await;
        let gus = who(&a, "gus-token-0123456789").await;
        let root = who(&a, "root-token-0123456789").await;
        let mine = Resource { id: "rsv_x".into(), ..draft(&alice, pool(&[("acme", false), ("globex", false)]), 1, 1) };
        for name in ["reservations.get", "reservations.cancel", "reservations.renew", "reservations.release"] {
            assert_eq!(a.decide(&alice, spec(name), &mine).await, Decision::Allow, "{name}");
            assert_eq!(a.decide(&gus, spec(name), &mine).await, Decision::NotFound, "{name}");
            assert_eq!(a.decide(&root, spec(name), &mine).await, Decision::NotFound, "{name} by the platform");
        }
        let acme_scope = Resource::scope(Target::Tenant, &alice.tenant_id);
        assert_eq!(a.decide(&alice, spec("reservations.list"), &acme_scope).await, Decision::Allow);
        assert_eq!(a.decide(&gus, spec("reservations.list"), &acme_scope).await, Decision::NotFound);
        let sites = a.decide(&alice, spec("sites.create"), &acme_scope).await;
        assert!(matches!(sites, Decision::Deny(r) if r.contains("administrator")));
        let fleet = Resource::scope(Target::Fleet, &alice.tenant_id);
        assert_eq!(a.decide(&alice, spec("projections.status"), &fleet).await, Decision::NotFound);
        assert_eq!(a.decide(&root, spec("projections.status"), &fleet).await, Decision::Allow);
    }

    #[tokio::test]
    async fn a_suspended_tenant_reads_and_ends_its_work_but_starts_nothing_new() {
        let a = authorizer();
        let ian = who(&a, "ian-token-0123456789").await;
        let scope = Resource::scope(Target::Tenant, &ian.tenant_id);
        assert_eq!(a.decide(&ian, spec("pools.list"), &scope).await, Decision::Allow);
        let refused = a.decide(&ian, spec("sites.create"), &scope).await;
        assert!(matches!(&refused, Decision::Suspended(r) if r.contains("initech is suspended")), "{refused:?}");
        let mine = Resource { id: "rsv_x".into(), ..draft(&ian, pool(&[("initech", false)]), 1, 1) };
        for name in ["reservations.cancel", "reservations.release", "reservations.renew", "reservations.get"] {
            assert_eq!(a.decide(&ian, spec(name), &mine).await, Decision::Allow, "{name}");
        }
        for name in ["reservations.create", "reservations.extend"] {
            assert!(matches!(a.decide(&ian, spec(name), &mine).await, Decision::Suspended(_)), "{name}");
        }
    }

    #[tokio::test]
    async fn the_log_s_entries_join_the_file_s_and_a_reload_replaces_them() {
        let a = authorizer();
        let directory = Directory {
            tenants: vec![DirectoryTenant {
                id: "acme-ml".parse().expect("t"),
                parent_id: "acme".parse().expect("t"),
                name: "ML".into(),
                suspended_reason: None,
                created_at_ms: 1,
            }],
            identities: vec![DirectoryIdentity {
                tenant_id: "acme-ml".parse().expect("t"),
                name: "ml@acme".parse().expect("i"),
                kind: "service".into(),
                admin: true,
                tokens: vec![token_sha256("ml-token-0123456789")],
            }],
            grants: vec![],
            limits: vec![],
        };
        a.reload(&directory);
        let ml = who(&a, "ml-token-0123456789").await;
        assert_eq!((ml.session_kind.as_str(), ml.ancestors.len()), ("service", 2));
        assert_eq!(a.tenant(&"acme-ml".parse().expect("t")).map(|t| (t.in_log, t.ancestors.len())), Some((true, 2)));
        // The file's entries stay; the log's are what the last reload said.
        a.reload(&Directory::default());
        assert!(a.authenticate("ml-token-0123456789").await.is_none());
        assert!(a.authenticate("alice-token-0123456789").await.is_some());
    }

    #[test]
    fn a_bad_file_is_invalid_config_naming_the_entry() {
        let cases = [
            ("[[tenants]]\nid = \"a\"\n", "tenant a needs a parent"),
            ("[[tenants]]\nid = \"a\"\nparent = \"b\"\n", "parent b is not a listed tenant"),
            (
                "[[tenants]]\nid = \"a\"\nparent = \"b\"\n[[tenants]]\nid = \"b\"\nparent = \"a\"\n",
                "is its own ancestor",
            ),
            (
                "[[identities]]\nidentity = \"x\"\ntenant = \"root\"\ntoken = \"short\"\n",
                "identities[0]: token must be",
            ),
            ("[[identities]]\nidentity = \"x\"\ntenant = \"nope\"\ntoken = \"long-enough-token-123\"\n", "tenant nope"),
            ("[[grants]]\ntenant = \"root\"\nrelation = \"owner\"\n", "unknown variant"),
            ("[[limits]]\nrelation = \"user\"\n", "limits[0]: give max_gpus"),
            ("colour = \"blue\"\n", "unknown field"),
        ];
        for (text, expected) in cases {
            let err = BuiltinAuthorizer::from_toml(text).expect_err(expected).to_string();
            assert!(err.starts_with("INVALID_CONFIG"), "{err}");
            assert!(err.contains(expected), "{err} should mention {expected}");
        }
    }
}
