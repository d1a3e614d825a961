//! `/v1/tenants`: tenants and their suspension, identities and their bearer tokens, grants of pool relations;
//! `/v1/pools/{id}/limits`: attribute limits on reservations.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use bc_commands::door::Subject;
use bc_domain::id::{GrantId, IdentityId, LimitId, PoolId, TenantId, TokenId};
use serde::Deserialize;

use super::consistency::MinPosition;
use super::error::{CommonErrors, ErrorBody};
use super::request::{
    Authed, JsonBody, OptionalBody, PageParams, QueryParams, committed_answer, idempotency_key, next_cursor, path_id,
};
use super::{ApiError, AppState};
use crate::wire::tenancy::{
    GrantBody, GrantDto, IdentityBody, IdentityDto, IssuedTokenDto, LimitBody, LimitDto, SuspendBody, TenantBody,
    TenantDto, TenantList, TokenList, WhoAmIDto,
};
use crate::wire::{CreatedDto, GrantPage, IdentityPage, LimitPage};

/// The `parentId` a call names, or the caller's own tenant.
fn parent_or_own(who: &Authed, parent: Option<&str>) -> Result<TenantId, ApiError> {
    parent.map_or_else(|| Ok(who.0.principal.tenant_id.clone()), |parent| path_id("parentId", parent))
}

/// `GET /v1/whoami`.
#[utoipa::path(
    get,
    path = "/v1/whoami",
    tag = "tenancy",
    summary = "Who the caller's token speaks for: tenant, identity, session kind, and whether it is the platform",
    responses(CommonErrors, (status = 200, description = "The caller", body = WhoAmIDto)),
    security(("bearer" = [])),
)]
pub async fn whoami(State(state): State<AppState>, who: Authed) -> Result<Json<WhoAmIDto>, ApiError> {
    state.app.authorize(&who.0, "whoami", Subject::OwnTenant).await?;
    let principal = &who.0.principal;
    Ok(Json(WhoAmIDto {
        tenant_id: principal.tenant_id.to_string(),
        identity: principal.identity.to_string(),
        session_kind: principal.session_kind.clone(),
        agent: principal.agent.clone(),
        delegation: principal.delegation.clone(),
        ancestors: principal.ancestors.iter().map(ToString::to_string).collect(),
        platform: principal.is_root(),
    }))
}

/// `POST /v1/tenants`.
#[utoipa::path(
    post,
    path = "/v1/tenants",
    tag = "tenancy",
    summary = "Create a tenant below the caller's own (or below `parentId`, for an administrator of it or of an ancestor)",
    request_body = TenantBody,
    responses(CommonErrors, (status = 201, description = "Created", body = TenantDto), (status = 409, description = "The id is taken", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn create_tenant(
    State(state): State<AppState>,
    who: Authed,
    JsonBody(body): JsonBody<TenantBody>,
) -> Result<Response, ApiError> {
    let id: TenantId = path_id("tenantId", &body.tenant_id)?;
    let parent = parent_or_own(&who, body.parent_id.as_deref())?;
    let caller = state.app.authorize(&who.0, "tenants.create", Subject::Tenant(&parent)).await?;
    let done = state.app.create_tenant(&caller, &id, &parent, &body.name).await?;
    let location = format!("/v1/tenants/{id}");
    Ok(committed_answer(StatusCode::CREATED, TenantDto::from(&done.value), done.position, Some(location)))
}

/// The query of `GET /v1/tenants`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TenantQuery {
    /// The tenant whose children to list (the caller's own by default).
    pub parent_id: Option<String>,
}

/// `GET /v1/tenants`.
#[utoipa::path(
    get,
    path = "/v1/tenants",
    tag = "tenancy",
    summary = "The tenants directly below the caller's own (or below `parentId`)",
    params(TenantQuery),
    responses(CommonErrors, (status = 200, description = "The tenants, by id", body = TenantList)),
    security(("bearer" = [])),
)]
pub async fn list_tenants(
    State(state): State<AppState>,
    who: Authed,
    QueryParams(query): QueryParams<TenantQuery>,
) -> Result<Json<TenantList>, ApiError> {
    let parent = parent_or_own(&who, query.parent_id.as_deref())?;
    state.app.authorize(&who.0, "tenants.list", Subject::Tenant(&parent)).await?;
    let items = state.app.list_tenants(&parent)?.iter().map(TenantDto::from).collect();
    Ok(Json(TenantList { items }))
}

/// `GET /v1/tenants/{tenant_id}`.
#[utoipa::path(
    get,
    path = "/v1/tenants/{tenant_id}",
    tag = "tenancy",
    summary = "One tenant",
    params(("tenant_id" = String, Path, description = "The tenant id")),
    responses(CommonErrors, (status = 200, description = "The tenant", body = TenantDto)),
    security(("bearer" = [])),
)]
pub async fn get_tenant(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
) -> Result<Json<TenantDto>, ApiError> {
    let id: TenantId = path_id("tenantId", &id)?;
    state.app.authorize(&who.0, "tenants.get", Subject::Tenant(&id)).await?;
    Ok(Json(TenantDto::from(&state.app.get_tenant(&id)?)))
}

/// `POST /v1/tenants/{tenant_id}/suspend`.
#[utoipa::path(
    post,
    path = "/v1/tenants/{tenant_id}/suspend",
    tag = "tenancy",
    summary = "Suspend a tenant: its callers (and its descendants') are refused new work with TENANT_SUSPENDED; what it runs keeps running",
    params(("tenant_id" = String, Path, description = "The tenant id")),
    request_body = inline(Option<SuspendBody>),
    responses(CommonErrors, (status = 200, description = "The tenant, suspended", body = TenantDto)),
    security(("bearer" = [])),
)]
pub async fn suspend_tenant(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    OptionalBody(body): OptionalBody<SuspendBody>,
) -> Result<Response, ApiError> {
    let id: TenantId = path_id("tenantId", &id)?;
    let caller = state.app.authorize(&who.0, "tenants.suspend", Subject::Tenant(&id)).await?;
    let done = state.app.set_tenant_suspended(&caller, &id, Some(&body.reason)).await?;
    Ok(committed_answer(StatusCode::OK, TenantDto::from(&done.value), done.position, None))
}

/// `POST /v1/tenants/{tenant_id}/resume`.
#[utoipa::path(
    post,
    path = "/v1/tenants/{tenant_id}/resume",
    tag = "tenancy",
    summary = "Resume a suspended tenant",
    params(("tenant_id" = String, Path, description = "The tenant id")),
    responses(CommonErrors, (status = 200, description = "The tenant, active", body = TenantDto)),
    security(("bearer" = [])),
)]
pub async fn resume_tenant(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id: TenantId = path_id("tenantId", &id)?;
    let caller = state.app.authorize(&who.0, "tenants.resume", Subject::Tenant(&id)).await?;
    let done = state.app.set_tenant_suspended(&caller, &id, None).await?;
    Ok(committed_answer(StatusCode::OK, TenantDto::from(&done.value), done.position, None))
}

/// `POST /v1/tenants/{tenant_id}/identities`.
#[utoipa::path(
    post,
    path = "/v1/tenants/{tenant_id}/identities",
    tag = "tenancy",
    summary = "Create an identity in a tenant (then issue it a token)",
    params(("tenant_id" = String, Path, description = "The tenant id")),
    request_body = IdentityBody,
    responses(CommonErrors, (status = 201, description = "Created", body = IdentityDto), (status = 409, description = "The name is taken", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn create_identity(
    State(state): State<AppState>,
    who: Authed,
    Path(tenant): Path<String>,
    JsonBody(body): JsonBody<IdentityBody>,
) -> Result<Response, ApiError> {
    let tenant: TenantId = path_id("tenantId", &tenant)?;
    let caller = state.app.authorize(&who.0, "identities.create", Subject::Tenant(&tenant)).await?;
    let done = state.app.create_identity(&caller, &tenant, &body.name, body.kind, body.admin).await?;
    let location = format!("/v1/tenants/{tenant}/identities/{}", done.value.id);
    Ok(committed_answer(StatusCode::CREATED, IdentityDto::from(&done.value), done.position, Some(location)))
}

/// `GET /v1/tenants/{tenant_id}/identities`.
#[utoipa::path(
    get,
    path = "/v1/tenants/{tenant_id}/identities",
    tag = "tenancy",
    summary = "A tenant's identities made through the API, by id",
    params(("tenant_id" = String, Path, description = "The tenant id"), PageParams),
    responses(CommonErrors, (status = 200, description = "A page: items and nextCursor", body = IdentityPage)),
    security(("bearer" = [])),
)]
pub async fn list_identities(
    State(state): State<AppState>,
    who: Authed,
    // Tenancy is read where it is written, so every token is already reached; it is still checked.
    MinPosition(_): MinPosition,
    Path(tenant): Path<String>,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<IdentityPage>, ApiError> {
    let tenant: TenantId = path_id("tenantId", &tenant)?;
    state.app.authorize(&who.0, "identities.list", Subject::Tenant(&tenant)).await?;
    let listed = state.app.list_identities(&tenant, &params.page()?).await?;
    Ok(Json(IdentityPage {
        items: listed.items.iter().map(Into::into).collect(),
        next_cursor: next_cursor(&listed.next_key),
    }))
}

/// `DELETE /v1/tenants/{tenant_id}/identities/{identity_id}`.
#[utoipa::path(
    delete,
    path = "/v1/tenants/{tenant_id}/identities/{identity_id}",
    tag = "tenancy",
    summary = "Delete an identity; its tokens stop working",
    params(("tenant_id" = String, Path, description = "The tenant id"), ("identity_id" = String, Path, description = "The identity id")),
    responses(CommonErrors, (status = 200, description = "Deleted", body = CreatedDto)),
    security(("bearer" = [])),
)]
pub async fn delete_identity(
    State(state): State<AppState>,
    who: Authed,
    Path((tenant, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let tenant: TenantId = path_id("tenantId", &tenant)?;
    let id: IdentityId = path_id("identityId", &id)?;
    let caller = state.app.authorize(&who.0, "identities.delete", Subject::Tenant(&tenant)).await?;
    let done = state.app.delete_identity(&caller, &tenant, &id).await?;
    Ok(committed_answer(StatusCode::OK, CreatedDto { id: id.to_string() }, done.position, None))
}

/// `POST /v1/tenants/{tenant_id}/identities/{identity_id}/tokens`.
#[utoipa::path(
    post,
    path = "/v1/tenants/{tenant_id}/identities/{identity_id}/tokens",
    tag = "tenancy",
    summary = "Issue a bearer token to an identity: the token is in this answer only",
    params(
        ("tenant_id" = String, Path, description = "The tenant id"),
        ("identity_id" = String, Path, description = "The identity id"),
        ("Idempotency-Key" = Option<String>, Header, description = "A retry with the same key answers the same token (made again from the PKI bundle's key; nothing but its SHA-256 is stored)"),
    ),
    responses(CommonErrors, (status = 201, description = "Issued", body = IssuedTokenDto), (status = 200, description = "A retry with the same Idempotency-Key: the same token", body = IssuedTokenDto)),
    security(("bearer" = [])),
)]
pub async fn issue_token(
    State(state): State<AppState>,
    who: Authed,
    headers: HeaderMap,
    Path((tenant, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let tenant: TenantId = path_id("tenantId", &tenant)?;
    let id: IdentityId = path_id("identityId", &id)?;
    let key = idempotency_key(&headers)?;
    let caller = state.app.authorize(&who.0, "tokens.create", Subject::Tenant(&tenant)).await?;
    let done = state.app.issue_token(&caller, &tenant, &id, key.as_deref()).await?;
    let status = if done.position.is_some() { StatusCode::CREATED } else { StatusCode::OK };
    Ok(committed_answer(status, IssuedTokenDto::from(&done.value), done.position, None))
}

/// `GET /v1/tenants/{tenant_id}/identities/{identity_id}/tokens`.
#[utoipa::path(
    get,
    path = "/v1/tenants/{tenant_id}/identities/{identity_id}/tokens",
    tag = "tenancy",
    summary = "An identity's live tokens, without their secrets",
    params(("tenant_id" = String, Path, description = "The tenant id"), ("identity_id" = String, Path, description = "The identity id")),
    responses(CommonErrors, (status = 200, description = "The tokens", body = TokenList)),
    security(("bearer" = [])),
)]
pub async fn list_tokens(
    State(state): State<AppState>,
    who: Authed,
    Path((tenant, id)): Path<(String, String)>,
) -> Result<Json<TokenList>, ApiError> {
    let tenant: TenantId = path_id("tenantId", &tenant)?;
    let id: IdentityId = path_id("identityId", &id)?;
    state.app.authorize(&who.0, "tokens.list", Subject::Tenant(&tenant)).await?;
    let items = state.app.list_tokens(&tenant, &id).await?.iter().map(Into::into).collect();
    Ok(Json(TokenList { items }))
}

/// `DELETE /v1/tenants/{tenant_id}/identities/{identity_id}/tokens/{token_id}`.
#[utoipa::path(
    delete,
    path = "/v1/tenants/{tenant_id}/identities/{identity_id}/tokens/{token_id}",
    tag = "tenancy",
    summary = "Revoke a token: every process refuses it within a second",
    params(
        ("tenant_id" = String, Path, description = "The tenant id"),
        ("identity_id" = String, Path, description = "The identity id"),
        ("token_id" = String, Path, description = "The token id"),
    ),
    responses(CommonErrors, (status = 200, description = "Revoked", body = CreatedDto)),
    security(("bearer" = [])),
)]
pub async fn revoke_token(
    State(state): State<AppState>,
    who: Authed,
    Path((tenant, id, token)): Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    let tenant: TenantId = path_id("tenantId", &tenant)?;
    let id: IdentityId = path_id("identityId", &id)?;
    let token: TokenId = path_id("tokenId", &token)?;
    let caller = state.app.authorize(&who.0, "tokens.revoke", Subject::Tenant(&tenant)).await?;
    let done = state.app.revoke_token(&caller, &tenant, &id, &token).await?;
    Ok(committed_answer(StatusCode::OK, CreatedDto { id: token.to_string() }, done.position, None))
}

/// `POST /v1/tenants/{tenant_id}/grants`.
#[utoipa::path(
    post,
    path = "/v1/tenants/{tenant_id}/grants",
    tag = "tenancy",
    summary = "Grant a relation on a pool (or every pool the tenant sees) to an identity (or every one) of the tenant",
    params(("tenant_id" = String, Path, description = "The tenant id")),
    request_body = GrantBody,
    responses(CommonErrors, (status = 201, description = "Granted", body = GrantDto)),
    security(("bearer" = [])),
)]
pub async fn create_grant(
    State(state): State<AppState>,
    who: Authed,
    Path(tenant): Path<String>,
    JsonBody(body): JsonBody<GrantBody>,
) -> Result<Response, ApiError> {
    let tenant: TenantId = path_id("tenantId", &tenant)?;
    let caller = state.app.authorize(&who.0, "grants.create", Subject::Tenant(&tenant)).await?;
    let done = state.app.create_grant(&caller, &tenant, &body.identity, &body.pool, body.relation).await?;
    Ok(committed_answer(StatusCode::CREATED, GrantDto::from(&done.value), done.position, None))
}

/// `GET /v1/tenants/{tenant_id}/grants`.
#[utoipa::path(
    get,
    path = "/v1/tenants/{tenant_id}/grants",
    tag = "tenancy",
    summary = "A tenant's grants made through the API, by id",
    params(("tenant_id" = String, Path, description = "The tenant id"), PageParams),
    responses(CommonErrors, (status = 200, description = "A page: items and nextCursor", body = GrantPage)),
    security(("bearer" = [])),
)]
pub async fn list_grants(
    State(state): State<AppState>,
    who: Authed,
    // Tenancy is read where it is written, so every token is already reached; it is still checked.
    MinPosition(_): MinPosition,
    Path(tenant): Path<String>,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<GrantPage>, ApiError> {
    let tenant: TenantId = path_id("tenantId", &tenant)?;
    state.app.authorize(&who.0, "grants.list", Subject::Tenant(&tenant)).await?;
    let listed = state.app.list_grants(&tenant, &params.page()?).await?;
    Ok(Json(GrantPage {
        items: listed.items.iter().map(Into::into).collect(),
        next_cursor: next_cursor(&listed.next_key),
    }))
}

/// `DELETE /v1/tenants/{tenant_id}/grants/{grant_id}`.
#[utoipa::path(
    delete,
    path = "/v1/tenants/{tenant_id}/grants/{grant_id}",
    tag = "tenancy",
    summary = "Revoke a grant",
    params(("tenant_id" = String, Path, description = "The tenant id"), ("grant_id" = String, Path, description = "The grant id")),
    responses(CommonErrors, (status = 200, description = "Revoked", body = CreatedDto)),
    security(("bearer" = [])),
)]
pub async fn revoke_grant(
    State(state): State<AppState>,
    who: Authed,
    Path((tenant, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let tenant: TenantId = path_id("tenantId", &tenant)?;
    let id: GrantId = path_id("grantId", &id)?;
    let caller = state.app.authorize(&who.0, "grants.revoke", Subject::Tenant(&tenant)).await?;
    let done = state.app.revoke_grant(&caller, &tenant, &id).await?;
    Ok(committed_answer(StatusCode::OK, CreatedDto { id: id.to_string() }, done.position, None))
}

/// `POST /v1/pools/{pool_id}/limits`.
#[utoipa::path(
    post,
    path = "/v1/pools/{pool_id}/limits",
    tag = "tenancy",
    summary = "Limit reservations in a pool the caller's tenant owns, for callers up to a relation (\"users may reserve at most 8 GPUs for 72 hours\")",
    params(("pool_id" = String, Path, description = "The pool id")),
    request_body = LimitBody,
    responses(CommonErrors, (status = 201, description = "Created", body = LimitDto)),
    security(("bearer" = [])),
)]
pub async fn create_limit(
    State(state): State<AppState>,
    who: Authed,
    Path(pool): Path<String>,
    JsonBody(body): JsonBody<LimitBody>,
) -> Result<Response, ApiError> {
    let pool: PoolId = path_id("poolId", &pool)?;
    let caller = state.app.authorize(&who.0, "limits.create", Subject::Pool(&pool)).await?;
    let done = state.app.create_limit(&caller, &pool, body.relation, body.max_gpus, body.max_hours).await?;
    Ok(committed_answer(StatusCode::CREATED, LimitDto::from(&done.value), done.position, None))
}

/// `GET /v1/pools/{pool_id}/limits`.
#[utoipa::path(
    get,
    path = "/v1/pools/{pool_id}/limits",
    tag = "tenancy",
    summary = "A pool's attribute limits made through the API, by id",
    params(("pool_id" = String, Path, description = "The pool id"), PageParams),
    responses(CommonErrors, (status = 200, description = "A page: items and nextCursor", body = LimitPage)),
    security(("bearer" = [])),
)]
pub async fn list_limits(
    State(state): State<AppState>,
    who: Authed,
    // Tenancy is read where it is written, so every token is already reached; it is still checked.
    MinPosition(_): MinPosition,
    Path(pool): Path<String>,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<LimitPage>, ApiError> {
    let pool: PoolId = path_id("poolId", &pool)?;
    state.app.authorize(&who.0, "limits.list", Subject::Pool(&pool)).await?;
    let listed = state.app.list_limits(&pool, &params.page()?).await?;
    Ok(Json(LimitPage {
        items: listed.items.iter().map(Into::into).collect(),
        next_cursor: next_cursor(&listed.next_key),
    }))
}

/// `DELETE /v1/pools/{pool_id}/limits/{limit_id}`.
#[utoipa::path(
    delete,
    path = "/v1/pools/{pool_id}/limits/{limit_id}",
    tag = "tenancy",
    summary = "Delete an attribute limit",
    params(("pool_id" = String, Path, description = "The pool id"), ("limit_id" = String, Path, description = "The limit id")),
    responses(CommonErrors, (status = 200, description = "Deleted", body = CreatedDto)),
    security(("bearer" = [])),
)]
pub async fn delete_limit(
    State(state): State<AppState>,
    who: Authed,
    Path((pool, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let pool: PoolId = path_id("poolId", &pool)?;
    let id: LimitId = path_id("limitId", &id)?;
    let caller = state.app.authorize(&who.0, "limits.delete", Subject::Pool(&pool)).await?;
    let done = state.app.delete_limit(&caller, &pool, &id).await?;
    Ok(committed_answer(StatusCode::OK, CreatedDto { id: id.to_string() }, done.position, None))
}
