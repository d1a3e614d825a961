//! Tenants, identities and their tokens, grants and attribute limits on the wire.

#[cfg(feature = "server")]
use bc_commands::auth::TenantView;
#[cfg(feature = "server")]
use bc_commands::tenancy::{GrantInfo, IdentityInfo, IssuedToken, LimitInfo, TokenInfo};
use bc_domain::tenancy::{Relation, SessionKind};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The body of `POST /v1/tenants`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantBody {
    /// The new tenant's id: 1 to 128 letters, digits, `_`, `-`, `.` and `:`.
    pub tenant_id: String,
    /// Its parent (the caller's own tenant when left out).
    #[serde(default)]
    pub parent_id: Option<String>,
    /// 1 to 128 printable characters.
    #[schema(min_length = 1, max_length = 128)]
    pub name: String,
}

/// The body of `POST /v1/tenants/{tenant_id}/suspend`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SuspendBody {
    /// Why, for the audit trail: at most 512 printable characters.
    #[serde(default)]
    #[schema(max_length = 512)]
    pub reason: String,
}

/// Who the caller's token speaks for (`GET /v1/whoami`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WhoAmIDto {
    pub tenant_id: String,
    pub identity: String,
    /// `user`, `service` or `agent`.
    pub session_kind: String,
    pub agent: Option<String>,
    pub delegation: Option<String>,
    /// The tenant's ancestors, parent first.
    pub ancestors: Vec<String>,
    /// Whether the tenant is the root tenant: the platform that runs the fleet.
    pub platform: bool,
}

/// A tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantDto {
    pub id: String,
    /// `null` for the root tenant, the platform.
    #[schema(required = true)]
    pub parent_id: Option<String>,
    #[schema(required = true)]
    pub name: Option<String>,
    /// `active` or `suspended` (a tenant of the bootstrap file may also be `pending` or `deleted`).
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suspended_reason: Option<String>,
    /// `api` for a tenant made through the API, `file` for one of the bootstrap file (changed only there).
    pub source: String,
    #[schema(required = true)]
    pub created_at: Option<i64>,
}

#[cfg(feature = "server")]
impl From<&TenantView> for TenantDto {
    fn from(t: &TenantView) -> Self {
        TenantDto {
            id: t.id.to_string(),
            parent_id: t.parent_id.as_ref().map(ToString::to_string),
            name: t.name.clone(),
            state: t.state.to_owned(),
            suspended_reason: t.suspended_reason.clone(),
            source: if t.in_log { "api" } else { "file" }.to_owned(),
            created_at: t.created_at_ms,
        }
    }
}

/// The tenants directly below one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantList {
    pub items: Vec<TenantDto>,
}

/// The body of `POST /v1/tenants/{tenant_id}/identities`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IdentityBody {
    /// 3 to 256 printable characters without spaces, unique in the tenant (`alice@acme`, `ci-runner`).
    #[schema(min_length = 3, max_length = 256)]
    pub name: String,
    /// `user` (the default), `service` or `agent`: the session kind its calls record.
    #[serde(default)]
    #[schema(value_type = String)]
    pub kind: SessionKind,
    /// An administrator of the tenant: sites, pools, projects, quotas, and its tenancy.
    #[serde(default)]
    pub admin: bool,
}

/// An identity made through the API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct IdentityDto {
    pub id: String,
    pub tenant_id: String,
    pub name: String,
    pub kind: String,
    pub admin: bool,
    /// How many live tokens it holds.
    pub tokens: i64,
    pub created_at: i64,
}

#[cfg(feature = "server")]
impl From<&IdentityInfo> for IdentityDto {
    fn from(i: &IdentityInfo) -> Self {
        IdentityDto {
            id: i.id.to_string(),
            tenant_id: i.tenant_id.to_string(),
            name: i.name.clone(),
            kind: i.kind.clone(),
            admin: i.admin,
            tokens: i.tokens,
            created_at: i.created_at_ms,
        }
    }
}

/// A bearer token as issued: `token` is shown in this answer only (only its SHA-256 is kept).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssuedTokenDto {
    pub id: String,
    pub identity_id: String,
    /// Send as `Authorization: Bearer <token>`.
    pub token: String,
    pub created_at: i64,
}

#[cfg(feature = "server")]
impl From<&IssuedToken> for IssuedTokenDto {
    fn from(t: &IssuedToken) -> Self {
        IssuedTokenDto {
            id: t.id.to_string(),
            identity_id: t.identity_id.to_string(),
            token: t.token.clone(),
            created_at: t.created_at_ms,
        }
    }
}

/// A live token, without its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenDto {
    pub id: String,
    pub created_at: i64,
}

#[cfg(feature = "server")]
impl From<&TokenInfo> for TokenDto {
    fn from(t: &TokenInfo) -> Self {
        TokenDto { id: t.id.to_string(), created_at: t.created_at_ms }
    }
}

/// An identity's live tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenList {
    pub items: Vec<TokenDto>,
}

/// The body of `POST /v1/tenants/{tenant_id}/grants`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GrantBody {
    /// An identity's name in the tenant, or `*` for every one.
    #[schema(min_length = 1, max_length = 256)]
    pub identity: String,
    /// A pool id the tenant can see, or `*` for every one.
    #[schema(min_length = 1, max_length = 64)]
    pub pool: String,
    /// `viewer`, `user`, `operator` or `admin`.
    #[schema(value_type = String)]
    pub relation: Relation,
}

/// A grant of a relation on pools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrantDto {
    pub id: String,
    pub tenant_id: String,
    pub identity: String,
    pub pool: String,
    pub relation: String,
    pub created_at: i64,
}

#[cfg(feature = "server")]
impl From<&GrantInfo> for GrantDto {
    fn from(g: &GrantInfo) -> Self {
        GrantDto {
            id: g.id.to_string(),
            tenant_id: g.tenant_id.to_string(),
            identity: g.identity.clone(),
            pool: g.pool.clone(),
            relation: g.relation.as_str().to_owned(),
            created_at: g.created_at_ms,
        }
    }
}

/// The body of `POST /v1/pools/{pool_id}/limits`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LimitBody {
    /// Applies to callers whose best relation on the pool is this one or below: `viewer`, `user` or `operator`.
    #[schema(value_type = String)]
    pub relation: Relation,
    /// The most GPUs one reservation may ask for, 0 to 1000000.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 1_000_000)]
    pub max_gpus: Option<u32>,
    /// The longest one reservation may last, in hours, 0 to 87600.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 87_600)]
    pub max_hours: Option<u32>,
}

/// An attribute limit on reservations in a pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LimitDto {
    pub id: String,
    pub pool_id: String,
    pub relation: String,
    #[schema(required = true)]
    pub max_gpus: Option<u32>,
    #[schema(required = true)]
    pub max_hours: Option<u32>,
    pub created_at: i64,
}

#[cfg(feature = "server")]
impl From<&LimitInfo> for LimitDto {
    fn from(l: &LimitInfo) -> Self {
        LimitDto {
            id: l.id.to_string(),
            pool_id: l.pool_id.to_string(),
            relation: l.relation.as_str().to_owned(),
            max_gpus: l.max_gpus,
            max_hours: l.max_hours,
            created_at: l.created_at_ms,
        }
    }
}
