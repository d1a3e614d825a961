//! The resource types Better Compute adds to the IAM catalog, and the normative method table: every method the
//! API serves, the IAM action it is decided as, the resource type it is decided on, and what the built-in
//! authorizer asks of the caller. [`check`] verifies the table against the merged catalog at start-up.

use std::collections::BTreeSet;

/// The default prefix of the resource type names.
pub const DEFAULT_PREFIX: &str = "compute-";

/// One resource type, without its prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceTypeSpec {
    /// The name after the prefix (`pool` for `compute-pool`).
    pub name: &'static str,
    /// The parent type's name after the prefix, if any.
    pub parent: Option<&'static str>,
    pub relations: &'static [&'static str],
    pub attributes: &'static [&'static str],
    /// Scope types are what methods acting on a whole scope are decided on.
    pub scope: bool,
}

const fn ty(
    name: &'static str,
    parent: Option<&'static str>,
    relations: &'static [&'static str],
    attributes: &'static [&'static str],
    scope: bool,
) -> ResourceTypeSpec {
    ResourceTypeSpec { name, parent, relations, attributes, scope }
}

/// The eleven types, all application-owned: resolved from Better Compute's own tables, never registered in IAM.
pub const RESOURCE_TYPES: &[ResourceTypeSpec] = &[
    ty("fleet", None, &[], &[], true),
    ty("tenant", None, &[], &[], true),
    ty("project", None, &["member", "admin"], &[], true),
    ty("site", None, &[], &["region", "iamRegion", "kind"], false),
    ty(
        "pool",
        None,
        &["viewer", "user", "operator", "admin"],
        &["region", "class", "gpuModel", "gpuMemoryGb", "sharing"],
        false,
    ),
    ty(
        "node",
        Some("pool"),
        &["operator"],
        &["region", "gpuModel", "gpuCount", "lifecycle", "trust", "dedicatedTo"],
        false,
    ),
    ty(
        "reservation",
        Some("pool"),
        &[],
        &["region", "gpuModel", "gpuCount", "durationHours", "binding", "projectId", "spot"],
        false,
    ),
    ty("instance", Some("pool"), &[], &["vcpu", "memoryGiB", "gpus", "imageId", "imageVerified", "projectId"], false),
    ty("image", None, &[], &["visibility", "verified"], false),
    ty("profile", None, &[], &[], false),
    ty("workflow", Some("pool"), &[], &["kind"], false),
    ty("provider-account", None, &[], &[], false),
];

/// The resource types a method can be decided on (names after the prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// `fleet/global`: resolves only in the root tenant.
    Fleet,
    /// `tenant/{t}`: the caller's own tenant.
    Tenant,
    Site,
    Pool,
    Node,
    Reservation,
    /// An instance: its tenant's, under its pool.
    Instance,
    /// An image: its tenant's, or every tenant's to read when public.
    Image,
    /// A profile version: its tenant's.
    Profile,
    /// A workflow: its machine's pool decides.
    Workflow,
    /// A provider account: its tenant's.
    ProviderAccount,
}

impl Target {
    /// The type's name after the prefix.
    pub fn type_name(self) -> &'static str {
        match self {
            Target::Fleet => "fleet",
            Target::Tenant => "tenant",
            Target::Site => "site",
            Target::Pool => "pool",
            Target::Node => "node",
            Target::Reservation => "reservation",
            Target::Instance => "instance",
            Target::Image => "image",
            Target::Profile => "profile",
            Target::Workflow => "workflow",
            Target::ProviderAccount => "provider-account",
        }
    }
}

/// What the built-in authorizer asks of the caller, beyond the resource resolving in its tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Requirement {
    /// Any identity of the tenant (or, for a pool, any relation: an offering makes it visible).
    Member,
    /// An administrator of the tenant.
    TenantAdmin,
    /// At least this relation on the pool (itself, or the parent of a node or reservation).
    Pool(Relation),
    /// An administrator of the tenant acted on, or of the root tenant (the platform administers every tenant).
    TenancyAdmin,
}

pub use bc_domain::tenancy::Relation;

/// One row of the method table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MethodSpec {
    /// The method, as routes and logs name it (`reservations.create`).
    pub method: &'static str,
    /// The IAM action it is decided as.
    pub action: &'static str,
    pub target: Target,
    pub requirement: Requirement,
    /// Whether it changes anything (an allowed mutation records its admission context).
    pub mutation: bool,
}

const fn m(
    method: &'static str,
    action: &'static str,
    target: Target,
    requirement: Requirement,
    mutation: bool,
) -> MethodSpec {
    MethodSpec { method, action, target, requirement, mutation }
}

const MEMBER: Requirement = Requirement::Member;
const TENANT_ADMIN: Requirement = Requirement::TenantAdmin;
const TENANCY_ADMIN: Requirement = Requirement::TenancyAdmin;
const VIEWER: Requirement = Requirement::Pool(Relation::Viewer);
const USER: Requirement = Requirement::Pool(Relation::User);
const OPERATOR: Requirement = Requirement::Pool(Relation::Operator);
const ADMIN: Requirement = Requirement::Pool(Relation::Admin);

/// The normative method table.
pub const METHODS: &[MethodSpec] = &[
    m("sites.create", "compute:sites.create", Target::Tenant, TENANT_ADMIN, true),
    m("sites.list", "compute:sites.list", Target::Tenant, MEMBER, false),
    m("sites.get", "compute:sites.get", Target::Site, MEMBER, false),
    m("sites.delete", "compute:sites.delete", Target::Site, TENANT_ADMIN, true),
    m("pools.create", "compute:pools.create", Target::Site, TENANT_ADMIN, true),
    m("pools.list", "compute:pools.list", Target::Tenant, MEMBER, false),
    m("pools.get", "compute:pools.get", Target::Pool, VIEWER, false),
    m("pools.capacity", "compute:pools.capacity", Target::Pool, VIEWER, false),
    m("pools.availability", "compute:pools.availability", Target::Pool, VIEWER, false),
    m("pools.quote", "compute:pools.quote", Target::Pool, VIEWER, false),
    m("pools.update", "compute:pools.update", Target::Pool, ADMIN, true),
    m("pools.delete", "compute:pools.delete", Target::Pool, ADMIN, true),
    m("pools.offer", "compute:pools.offer", Target::Pool, ADMIN, true),
    m("pools.offers.revoke", "compute:pools.offers.revoke", Target::Pool, ADMIN, true),
    m("quotas.set", "compute:quotas.set", Target::Tenant, TENANT_ADMIN, true),
    m("projects.create", "compute:projects.create", Target::Tenant, TENANT_ADMIN, true),
    m("projects.list", "compute:projects.list", Target::Tenant, MEMBER, false),
    m("projects.get", "compute:projects.get", Target::Tenant, MEMBER, false),
    m("projects.delete", "compute:projects.delete", Target::Tenant, TENANT_ADMIN, true),
    m("nodes.register", "compute:nodes.register", Target::Pool, OPERATOR, true),
    m("nodes.enrol", "compute:nodes.enrol", Target::Pool, OPERATOR, true),
    m("nodes.provision", "compute:nodes.provision", Target::Node, OPERATOR, true),
    m("workflows.create", "compute:workflows.create", Target::Node, OPERATOR, true),
    m("workflows.list", "compute:workflows.list", Target::Node, OPERATOR, false),
    m("workflows.get", "compute:workflows.get", Target::Workflow, OPERATOR, false),
    m("workflows.cancel", "compute:workflows.cancel", Target::Workflow, OPERATOR, true),
    m("nodes.list", "compute:nodes.list", Target::Tenant, MEMBER, false),
    m("nodes.get", "compute:nodes.get", Target::Node, MEMBER, false),
    m("nodes.cordon", "compute:nodes.cordon", Target::Node, OPERATOR, true),
    m("nodes.uncordon", "compute:nodes.uncordon", Target::Node, OPERATOR, true),
    m("nodes.maintenance.start", "compute:nodes.maintenance.start", Target::Node, OPERATOR, true),
    m("nodes.maintenance.end", "compute:nodes.maintenance.end", Target::Node, OPERATOR, true),
    m("nodes.drain", "compute:nodes.drain", Target::Node, OPERATOR, true),
    m("nodes.delete", "compute:nodes.delete", Target::Node, OPERATOR, true),
    m("nodes.spec.set", "compute:nodes.spec.set", Target::Node, OPERATOR, true),
    m("nodes.commands.create", "compute:nodes.commands.create", Target::Node, OPERATOR, true),
    m("nodes.commands.list", "compute:nodes.commands.list", Target::Node, OPERATOR, false),
    m("nodes.inventory.get", "compute:nodes.inventory.get", Target::Node, OPERATOR, false),
    m("nodes.join_tokens.create", "compute:nodes.join_tokens.create", Target::Pool, OPERATOR, true),
    m("nodes.join_tokens.list", "compute:nodes.join_tokens.list", Target::Pool, OPERATOR, false),
    m("nodes.join_tokens.revoke", "compute:nodes.join_tokens.revoke", Target::Pool, OPERATOR, true),
    m("reservations.create", "compute:reservations.create", Target::Reservation, USER, true),
    m("reservations.get", "compute:reservations.get", Target::Reservation, MEMBER, false),
    m("reservations.list", "compute:reservations.list", Target::Tenant, MEMBER, false),
    m("reservations.renew", "compute:reservations.renew", Target::Reservation, MEMBER, true),
    m("reservations.extend", "compute:reservations.extend", Target::Reservation, USER, true),
    m("reservations.cancel", "compute:reservations.cancel", Target::Reservation, MEMBER, true),
    m("reservations.release", "compute:reservations.release", Target::Reservation, MEMBER, true),
    // An instance's creation is also decided as its reservation's (`reservations.create`, on that draft).
    m("instances.create", "compute:instances.create", Target::Instance, USER, true),
    m("instances.get", "compute:instances.get", Target::Instance, MEMBER, false),
    m("instances.list", "compute:instances.list", Target::Tenant, MEMBER, false),
    m("instances.start", "compute:instances.start", Target::Instance, MEMBER, true),
    m("instances.stop", "compute:instances.stop", Target::Instance, MEMBER, true),
    m("instances.delete", "compute:instances.delete", Target::Instance, MEMBER, true),
    m("images.create", "compute:images.create", Target::Tenant, TENANT_ADMIN, true),
    m("images.publish", "compute:images.publish", Target::Fleet, TENANT_ADMIN, true),
    m("images.list", "compute:images.list", Target::Tenant, MEMBER, false),
    m("images.get", "compute:images.get", Target::Image, MEMBER, false),
    m("images.content.get", "compute:images.content.get", Target::Image, MEMBER, false),
    m("images.delete", "compute:images.delete", Target::Image, TENANT_ADMIN, true),
    m("profiles.create", "compute:profiles.create", Target::Tenant, TENANT_ADMIN, true),
    m("profiles.list", "compute:profiles.list", Target::Tenant, MEMBER, false),
    m("profiles.get", "compute:profiles.get", Target::Profile, MEMBER, false),
    m("profiles.delete", "compute:profiles.delete", Target::Profile, TENANT_ADMIN, true),
    // Flavors are decided on the caller's scope (the seeds name no flavor type): reading one the tenant may not
    // use, or deleting another tenant's, is not found by the command.
    m("flavors.create", "compute:flavors.create", Target::Tenant, TENANT_ADMIN, true),
    m("flavors.publish", "compute:flavors.publish", Target::Fleet, TENANT_ADMIN, true),
    m("flavors.list", "compute:flavors.list", Target::Tenant, MEMBER, false),
    m("flavors.get", "compute:flavors.get", Target::Tenant, MEMBER, false),
    m("flavors.delete", "compute:flavors.delete", Target::Tenant, TENANT_ADMIN, true),
    m("provider_accounts.create", "compute:provider_accounts.create", Target::Tenant, TENANT_ADMIN, true),
    m("provider_accounts.list", "compute:provider_accounts.list", Target::Tenant, MEMBER, false),
    m("provider_accounts.get", "compute:provider_accounts.get", Target::ProviderAccount, MEMBER, false),
    m(
        "provider_accounts.credential.rotate",
        "compute:provider_accounts.credential.rotate",
        Target::ProviderAccount,
        TENANT_ADMIN,
        true,
    ),
    m("provider_accounts.delete", "compute:provider_accounts.delete", Target::ProviderAccount, TENANT_ADMIN, true),
    m("webhooks.create", "compute:webhooks.create", Target::Tenant, TENANT_ADMIN, true),
    m("webhooks.list", "compute:webhooks.list", Target::Tenant, MEMBER, false),
    m("webhooks.get", "compute:webhooks.get", Target::Tenant, MEMBER, false),
    m("webhooks.delete", "compute:webhooks.delete", Target::Tenant, TENANT_ADMIN, true),
    m("webhooks.secret.rotate", "compute:webhooks.secret.rotate", Target::Tenant, TENANT_ADMIN, true),
    m("webhooks.deliveries.list", "compute:webhooks.deliveries.list", Target::Tenant, MEMBER, false),
    m("webhooks.dead_letters.replay", "compute:webhooks.dead_letters.replay", Target::Tenant, TENANT_ADMIN, true),
    m("ledger.get", "compute:ledger.get", Target::Tenant, MEMBER, false),
    m("audit.list", "compute:audit.list", Target::Tenant, MEMBER, false),
    m("fleet.audit.list", "compute:fleet.audit.list", Target::Fleet, TENANT_ADMIN, false),
    m("audit.checkpoints.list", "compute:audit.checkpoints.list", Target::Tenant, MEMBER, false),
    m("audit.checkpoints.get", "compute:audit.checkpoints.get", Target::Tenant, MEMBER, false),
    m("audit.proofs.get", "compute:audit.proofs.get", Target::Tenant, MEMBER, false),
    m("fleet.reservations.list", "compute:fleet.reservations.list", Target::Fleet, TENANT_ADMIN, false),
    m("whoami", "compute:whoami", Target::Tenant, MEMBER, false),
    m("tenants.create", "compute:tenants.create", Target::Tenant, TENANCY_ADMIN, true),
    m("tenants.list", "compute:tenants.list", Target::Tenant, TENANCY_ADMIN, false),
    m("tenants.get", "compute:tenants.get", Target::Tenant, TENANCY_ADMIN, false),
    m("tenants.suspend", "compute:tenants.suspend", Target::Tenant, TENANCY_ADMIN, true),
    m("tenants.resume", "compute:tenants.resume", Target::Tenant, TENANCY_ADMIN, true),
    m("identities.create", "compute:identities.create", Target::Tenant, TENANCY_ADMIN, true),
    m("identities.list", "compute:identities.list", Target::Tenant, TENANCY_ADMIN, false),
    m("identities.delete", "compute:identities.delete", Target::Tenant, TENANCY_ADMIN, true),
    m("tokens.create", "compute:tokens.create", Target::Tenant, TENANCY_ADMIN, true),
    m("tokens.list", "compute:tokens.list", Target::Tenant, TENANCY_ADMIN, false),
    m("tokens.revoke", "compute:tokens.revoke", Target::Tenant, TENANCY_ADMIN, true),
    m("grants.create", "compute:grants.create", Target::Tenant, TENANCY_ADMIN, true),
    m("grants.list", "compute:grants.list", Target::Tenant, TENANCY_ADMIN, false),
    m("grants.revoke", "compute:grants.revoke", Target::Tenant, TENANCY_ADMIN, true),
    m("limits.create", "compute:limits.create", Target::Pool, ADMIN, true),
    m("limits.list", "compute:limits.list", Target::Pool, VIEWER, false),
    m("limits.delete", "compute:limits.delete", Target::Pool, ADMIN, true),
    m("events.stream", "compute:events.stream", Target::Tenant, MEMBER, false),
    m("events.tickets.create", "compute:events.tickets.create", Target::Tenant, MEMBER, false),
    m("projections.status", "compute:projections.status", Target::Fleet, TENANT_ADMIN, false),
];

/// The table row of `method`.
pub fn method(name: &str) -> Option<&'static MethodSpec> {
    METHODS.iter().find(|spec| spec.method == name)
}

/// The catalog an authorizer merges with Better Compute's types: more types, and the actions it knows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalog {
    /// Full type names (with their prefix), their relations and attributes.
    pub types: Vec<CatalogType>,
    /// Every action the catalog defines.
    pub actions: BTreeSet<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogType {
    pub name: String,
    pub parent: Option<String>,
    pub relations: Vec<String>,
    pub attributes: Vec<String>,
}

impl Catalog {
    /// Better Compute's own types under `prefix`, and the actions of the method table.
    pub fn compute(prefix: &str) -> Catalog {
        Catalog {
            types: RESOURCE_TYPES
                .iter()
                .map(|t| CatalogType {
                    name: format!("{prefix}{}", t.name),
                    parent: t.parent.map(|p| format!("{prefix}{p}")),
                    relations: t.relations.iter().map(|r| (*r).to_owned()).collect(),
                    attributes: t.attributes.iter().map(|a| (*a).to_owned()).collect(),
                })
                .collect(),
            actions: METHODS.iter().map(|m| m.action.to_owned()).collect(),
        }
    }

    /// This catalog with `other`'s types and actions added.
    pub fn merge(mut self, other: Catalog) -> Catalog {
        self.types.extend(other.types);
        self.actions.extend(other.actions);
        self
    }
}

/// What is wrong with a catalog or the method table: `INVALID_CONFIG` at start-up, before the store is touched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("INVALID_CONFIG: {}", problems.join("; "))]
pub struct InvalidConfig {
    pub problems: Vec<String>,
}

const RESERVED_TYPES: &[&str] =
    &["iam", "role", "oauth-client", "scim", "saml", "ssf", "tenant", "identity", "session"];

fn valid_type_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some('a'..='z'))
        && name.len() <= 64
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

fn valid_attribute(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name != "tenantId"
}

fn valid_action(action: &str) -> bool {
    !action.is_empty()
        && !action.starts_with("iam:")
        && !action.starts_with("tenant/")
        && !action.chars().any(|c| c == '*' || c == '?' || c.is_whitespace())
}

/// Checks `methods` (every method `routed` names must have a row) against `catalog` under `prefix`: each
/// method's action is in the catalog and well formed, its resource type exists (with the parent its
/// requirement relies on), and the catalog's own types follow the IAM catalog's rules.
pub fn check(catalog: &Catalog, prefix: &str, methods: &[MethodSpec], routed: &[&str]) -> Result<(), InvalidConfig> {
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for t in &catalog.types {
        if !valid_type_name(&t.name) || RESERVED_TYPES.contains(&t.name.as_str()) {
            problems.push(format!("resource type {:?} is not a valid, unreserved type name", t.name));
        }
        if !seen.insert(t.name.as_str()) {
            problems.push(format!("resource type {:?} is declared twice", t.name));
        }
        if t.attributes.len() > 64 {
            problems.push(format!("resource type {:?} has more than 64 attributes", t.name));
        }
        for attribute in t.attributes.iter().filter(|a| !valid_attribute(a)) {
            problems.push(format!("resource type {:?} has an invalid attribute name {attribute:?}", t.name));
        }
        if t.relations.len() > 32 {
            problems.push(format!("resource type {:?} has more than 32 relations", t.name));
        }
        for relation in t.relations.iter().filter(|r| r.is_empty() || r.chars().any(|c| !c.is_ascii_lowercase())) {
            problems.push(format!("resource type {:?} has an invalid relation name {relation:?}", t.name));
        }
    }
    let find = |name: &str| catalog.types.iter().find(|t| t.name == name);
    let mut methods_seen = BTreeSet::new();
    for spec in methods {
        if !methods_seen.insert(spec.method) {
            problems.push(format!("method {} is in the method table twice", spec.method));
        }
        if !valid_action(spec.action) {
            problems.push(format!("method {}: action {:?} is not a valid action name", spec.method, spec.action));
        }
        if !catalog.actions.contains(spec.action) {
            problems.push(format!("method {}: action {:?} is not in the catalog", spec.method, spec.action));
        }
        let type_name = format!("{prefix}{}", spec.target.type_name());
        let Some(resource_type) = find(&type_name) else {
            problems.push(format!("method {}: resource type {type_name:?} is not in the catalog", spec.method));
            continue;
        };
        if let Requirement::Pool(relation) = spec.requirement {
            let pool = format!("{prefix}pool");
            let holder = if resource_type.name == pool { Some(resource_type) } else { None }
                .or_else(|| resource_type.parent.as_deref().filter(|parent| *parent == pool).and_then(find));
            match holder {
                Some(pool_type) if pool_type.relations.iter().any(|r| r == relation.as_str()) => {}
                _ => problems.push(format!(
                    "method {}: {type_name} has no {pool} relation {:?} to decide on",
                    spec.method,
                    relation.as_str()
                )),
            }
        }
    }
    for method in routed {
        if !methods.iter().any(|spec| spec.method == *method) {
            problems.push(format!("method {method} is served but has no row in the method table"));
        }
    }
    if problems.is_empty() { Ok(()) } else { Err(InvalidConfig { problems }) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routed() -> Vec<&'static str> {
        METHODS.iter().map(|m| m.method).collect()
    }

    #[test]
    fn the_table_checks_out_against_the_compute_catalog() {
        assert_eq!(check(&Catalog::compute(DEFAULT_PREFIX), DEFAULT_PREFIX, METHODS, &routed()), Ok(()));
        assert_eq!(check(&Catalog::compute("gpu-"), "gpu-", METHODS, &routed()), Ok(()));
    }

    #[test]
    fn a_served_method_without_a_row_is_invalid_config() {
        let without: Vec<MethodSpec> = METHODS.iter().copied().filter(|m| m.method != "reservations.cancel").collect();
        let err = check(&Catalog::compute(DEFAULT_PREFIX), DEFAULT_PREFIX, &without, &routed()).expect_err("missing");
        assert_eq!(err.problems, vec!["method reservations.cancel is served but has no row in the method table"]);
        assert!(err.to_string().starts_with("INVALID_CONFIG: "));
    }

    #[test]
    fn a_wrong_action_or_type_is_invalid_config() {
        let mut methods = METHODS.to_vec();
        methods[0].action = "compute:sites.make";
        let mut catalog = Catalog::compute(DEFAULT_PREFIX);
        catalog.types.retain(|t| t.name != "compute-node");
        let err = check(&catalog, DEFAULT_PREFIX, &methods, &routed()).expect_err("wrong");
        assert!(
            err.problems
                .contains(&"method sites.create: action \"compute:sites.make\" is not in the catalog".to_owned())
        );
        assert!(
            err.problems
                .contains(&"method nodes.cordon: resource type \"compute-node\" is not in the catalog".to_owned())
        );
    }

    #[test]
    fn catalog_rules_are_enforced() {
        let extra = Catalog {
            types: vec![
                CatalogType {
                    name: "tenant".into(),
                    parent: None,
                    relations: vec!["Owner".into()],
                    attributes: vec!["tenantId".into()],
                },
                CatalogType { name: "compute-pool".into(), parent: None, relations: vec![], attributes: vec![] },
            ],
            actions: ["iam:everything".to_owned()].into(),
        };
        let catalog = Catalog::compute(DEFAULT_PREFIX).merge(extra);
        let err = check(&catalog, DEFAULT_PREFIX, METHODS, &routed()).expect_err("invalid");
        for expected in [
            "resource type \"tenant\" is not a valid, unreserved type name",
            "resource type \"tenant\" has an invalid attribute name \"tenantId\"",
            "resource type \"tenant\" has an invalid relation name \"Owner\"",
            "resource type \"compute-pool\" is declared twice",
        ] {
            assert!(err.problems.iter().any(|p| p == expected), "{expected} in {:?}", err.problems);
        }
    }

    #[test]
    fn action_names_follow_the_catalog_grammar() {
        assert!(valid_action("compute:pools.list"));
        for bad in ["", "iam:x", "tenant/x", "a*b", "a?b", "a b"] {
            assert!(!valid_action(bad), "{bad}");
        }
    }
}
