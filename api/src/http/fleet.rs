//! Sites, projects, pools, offerings and quotas, capacity, availability, and the audit trail.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bc_domain::device::DeviceClass;
use bc_domain::id::{PoolId, SiteId, TenantId};
use bc_domain::pool::{PoolAgent, PoolClass, PoolPolicy, Quota, Sharing};
use bc_domain::reservation::{DeviceRequest, Selector, Topology};
use bc_domain::site::SiteKind;
use bc_eventstore::Position;
use serde::Deserialize;
use serde_json::{Value, json};

use super::consistency::MinPosition;
use super::error::{CommonErrors, ErrorBody};
use super::request::{Authed, JsonBody, PageParams, QueryParams, page_json, path_id};
use super::{ApiError, AppState};
use bc_commands::availability::EarliestStart;
use bc_commands::door::Subject;
use bc_commands::fleet::{CreatePool, CreateSite, OfferPool};

/// A command's answer with its position as `X-Position` (the consistency token of reads).
pub(super) fn committed(
    status: StatusCode,
    body: Value,
    position: Option<Position>,
    location: Option<String>,
) -> Response {
    let mut response = (status, Json(body)).into_response();
    if let Some(position) = position
        && let Ok(value) = HeaderValue::from_str(&position.to_string())
    {
        response.headers_mut().insert("x-position", value);
    }
    if let Some(location) = location
        && let Ok(value) = HeaderValue::from_str(&location)
    {
        response.headers_mut().insert("location", value);
    }
    response
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SiteBody {
    pub name: String,
    pub iam_region: String,
    /// `shared` (the default), `dedicated` or `custom`.
    #[serde(default = "shared")]
    #[schema(value_type = String)]
    pub kind: SiteKind,
}

fn shared() -> SiteKind {
    SiteKind::Shared
}

/// `POST /v1/sites`.
#[utoipa::path(
    post,
    path = "/v1/sites",
    tag = "fleet",
    summary = "Create a site in the caller's tenant",
    request_body = SiteBody,
    responses((status = 201, description = "Created; `X-Position` is its consistency token", body = Object), (status = 409, description = "The name is taken", body = ErrorBody), CommonErrors),
    security(("bearer" = [])),
)]
pub async fn create_site(
    State(state): State<AppState>,
    who: Authed,
    JsonBody(body): JsonBody<SiteBody>,
) -> Result<Response, ApiError> {
    let caller = state.app.authorize(&who.0, "sites.create", Subject::OwnTenant).await?;
    let input = CreateSite { name: body.name, iam_region: body.iam_region, kind: body.kind };
    let done = state.app.create_site(&caller, input).await?;
    Ok(committed(StatusCode::CREATED, json!({ "id": done.value }), done.position, None))
}

/// `GET /v1/sites`: the caller's tenant's sites.
#[utoipa::path(
    get,
    path = "/v1/sites",
    tag = "fleet",
    summary = "The caller's tenant's sites",
    params(PageParams),
    responses((status = 200, description = "A page: items and nextCursor", body = Object), CommonErrors),
    security(("bearer" = [])),
)]
pub async fn list_sites(
    State(state): State<AppState>,
    who: Authed,
    // Sites are read where they are written, so every token is already reached; it is still checked.
    MinPosition(_): MinPosition,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<Value>, ApiError> {
    let caller = state.app.authorize(&who.0, "sites.list", Subject::OwnTenant).await?;
    let page = params.page()?;
    Ok(Json(page_json(state.app.list_sites(&caller, &page).await?)))
}

/// `GET /v1/sites/{id}`.
#[utoipa::path(
    get,
    path = "/v1/sites/{site_id}",
    tag = "fleet",
    summary = "One site of the caller's tenant",
    params(("site_id" = String, Path, description = "The site id"), ReadParams),
    responses((status = 200, description = "The site", body = Object), CommonErrors),
    security(("bearer" = [])),
)]
pub async fn get_site(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    MinPosition(_): MinPosition,
    QueryParams(ReadParams { .. }): QueryParams<ReadParams>,
) -> Result<Json<Value>, ApiError> {
    let id: SiteId = path_id("siteId", &id)?;
    let caller = state.app.authorize(&who.0, "sites.get", Subject::Site(&id)).await?;
    Ok(Json(state.app.site(&caller, &id).await?))
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProjectBody {
    pub name: String,
}

/// `POST /v1/projects`.
#[utoipa::path(
    post,
    path = "/v1/projects",
    tag = "fleet",
    summary = "Create a project in the caller's tenant",
    request_body = ProjectBody,
    responses((status = 201, description = "Created", body = Object), (status = 409, description = "The name is taken", body = ErrorBody), CommonErrors),
    security(("bearer" = [])),
)]
pub async fn create_project(
    State(state): State<AppState>,
    who: Authed,
    JsonBody(body): JsonBody<ProjectBody>,
) -> Result<Response, ApiError> {
    let caller = state.app.authorize(&who.0, "projects.create", Subject::OwnTenant).await?;
    let done = state.app.create_project(&caller, body.name).await?;
    Ok(committed(StatusCode::CREATED, json!({ "id": done.value }), done.position, None))
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolBody {
    pub site_id: String,
    pub name: String,
    #[schema(value_type = String, example = "metal-host")]
    pub class: PoolClass,
    pub gpu_model: String,
    /// `exclusive` (the default), `mig`, `timeslice` or `mps`.
    #[serde(default)]
    #[schema(value_type = String)]
    pub sharing: Sharing,
    #[serde(default)]
    #[schema(value_type = String)]
    pub agent: PoolAgent,
    #[serde(default)]
    #[schema(value_type = Object)]
    pub policy: PoolPolicy,
    pub provider_account_id: Option<String>,
}

/// `POST /v1/pools`: a pool in one of the caller's tenant's sites.
#[utoipa::path(
    post,
    path = "/v1/pools",
    tag = "fleet",
    summary = "Create a pool in one of the caller's tenant's sites",
    request_body = PoolBody,
    responses((status = 201, description = "Created", body = Object), (status = 409, description = "The name is taken", body = ErrorBody), CommonErrors),
    security(("bearer" = [])),
)]
pub async fn create_pool(
    State(state): State<AppState>,
    who: Authed,
    JsonBody(body): JsonBody<PoolBody>,
) -> Result<Response, ApiError> {
    let site_id: SiteId = path_id("siteId", &body.site_id)?;
    let caller = state.app.authorize(&who.0, "pools.create", Subject::Site(&site_id)).await?;
    let input = CreatePool {
        site_id,
        name: body.name,
        class: body.class,
        gpu_model: body.gpu_model,
        sharing: body.sharing,
        agent: body.agent,
        policy: body.policy,
        provider_account_id: body.provider_account_id,
    };
    let done = state.app.create_pool(&caller, input).await?;
    let location = format!("/v1/pools/{}", done.value);
    Ok(committed(StatusCode::CREATED, json!({ "id": done.value }), done.position, Some(location)))
}

/// `GET /v1/pools`: the pools the caller's tenant owns or is offered.
#[utoipa::path(
    get,
    path = "/v1/pools",
    tag = "fleet",
    summary = "The pools the caller's tenant owns or is offered",
    params(PageParams, ("X-Min-Position" = Option<String>, Header, description = "A consistency token, as ?after=")),
    responses((status = 200, description = "A page: items and nextCursor", body = Object), (status = 503, description = "NOT_YET_CONSISTENT", body = ErrorBody), CommonErrors),
    security(("bearer" = [])),
)]
pub async fn list_pools(
    State(state): State<AppState>,
    who: Authed,
    MinPosition(after): MinPosition,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<Value>, ApiError> {
    let caller = state.app.authorize(&who.0, "pools.list", Subject::OwnTenant).await?;
    let page = params.page()?;
    Ok(Json(page_json(state.app.list_pools(&caller, &page, after).await?)))
}

/// Query of reads that take only a consistency token.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ReadParams {
    /// A consistency token: answer once the read models have passed this position (as `X-Min-Position`).
    #[allow(dead_code)]
    pub after: Option<String>,
}

/// `GET /v1/pools/{id}`.
#[utoipa::path(
    get,
    path = "/v1/pools/{pool_id}",
    tag = "fleet",
    summary = "One pool",
    params(("pool_id" = String, Path, description = "The pool id"), ReadParams, ("X-Min-Position" = Option<String>, Header, description = "A consistency token, as ?after=")),
    responses((status = 200, description = "The pool", body = Object), (status = 503, description = "NOT_YET_CONSISTENT", body = ErrorBody), CommonErrors),
    security(("bearer" = [])),
)]
pub async fn get_pool(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    MinPosition(after): MinPosition,
    QueryParams(ReadParams { .. }): QueryParams<ReadParams>,
) -> Result<Json<Value>, ApiError> {
    let id: PoolId = path_id("poolId", &id)?;
    let caller = state.app.authorize(&who.0, "pools.get", Subject::Pool(&id)).await?;
    Ok(Json(state.app.pool(&caller, &id, after).await?))
}

/// `GET /v1/pools/{id}/capacity`: allocatable, allocated, reserved and available atoms per resource.
#[utoipa::path(
    get,
    path = "/v1/pools/{pool_id}/capacity",
    tag = "fleet",
    summary = "Allocatable, allocated, reserved and available atoms per resource",
    params(("pool_id" = String, Path, description = "The pool id"), ReadParams, ("X-Min-Position" = Option<String>, Header, description = "A consistency token, as ?after=")),
    responses((status = 200, description = "The rollup", body = Object), (status = 503, description = "NOT_YET_CONSISTENT", body = ErrorBody), CommonErrors),
    security(("bearer" = [])),
)]
pub async fn pool_capacity(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    MinPosition(after): MinPosition,
    QueryParams(ReadParams { .. }): QueryParams<ReadParams>,
) -> Result<Json<Value>, ApiError> {
    let id: PoolId = path_id("poolId", &id)?;
    let caller = state.app.authorize(&who.0, "pools.capacity", Subject::Pool(&id)).await?;
    let items = state.app.pool_capacity(&caller, &id, after).await?;
    Ok(Json(json!({ "poolId": id, "items": items })))
}

/// Query of `GET /v1/pools/{id}/availability`: either `count` and `duration` (the earliest start, not before
/// `notBefore`), or `start` and `end` (the atoms free over that window).
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AvailabilityParams {
    #[param(value_type = Option<String>)]
    pub class: Option<DeviceClass>,
    pub count: Option<u32>,
    pub duration: Option<u64>,
    pub not_before: Option<i64>,
    pub start: Option<i64>,
    pub end: Option<i64>,
}

/// `GET /v1/pools/{id}/availability`.
#[utoipa::path(
    get,
    path = "/v1/pools/{pool_id}/availability",
    tag = "fleet",
    summary = "The earliest start of a request, or the atoms free over a window",
    params(("pool_id" = String, Path, description = "The pool id"), AvailabilityParams),
    responses((status = 200, description = "earliestStart, or nodes with their free atoms", body = Object), CommonErrors),
    security(("bearer" = [])),
)]
pub async fn availability(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    QueryParams(params): QueryParams<AvailabilityParams>,
) -> Result<Json<Value>, ApiError> {
    let id: PoolId = path_id("poolId", &id)?;
    let caller = state.app.authorize(&who.0, "pools.availability", Subject::Pool(&id)).await?;
    match (params.count, params.duration, params.start, params.end) {
        (Some(count), Some(duration), None, None) => {
            let class = match params.class {
                Some(class) => class,
                None => {
                    let pool = state.app.pool(&caller, &id, None).await?;
                    serde_json::from_value::<Sharing>(pool["sharing"].clone())
                        .map(|sharing| sharing.atom_class())
                        .map_err(|_| ApiError::invalid_argument("class", "name the atom class to ask about"))?
                }
            };
            let query = EarliestStart {
                pool_id: id.clone(),
                devices: DeviceRequest { class, count, selector: Selector::default(), topology: Topology::SameNode },
                duration_s: duration,
                not_before_ms: params.not_before,
            };
            let earliest = state.app.earliest_start(&caller, &query).await?;
            Ok(Json(json!({ "poolId": id, "earliestStart": earliest })))
        }
        (None, None, Some(start), Some(end)) => {
            let free = state.app.free_atoms(&caller, &id, start, end).await?;
            let nodes: Vec<Value> =
                free.into_iter().map(|f| json!({ "nodeId": f.node_id, "atoms": f.atoms })).collect();
            Ok(Json(json!({ "poolId": id, "start": start, "end": end, "nodes": nodes })))
        }
        _ => Err(ApiError::invalid_argument(
            "count",
            "ask with count and duration (the earliest start) or with start and end (the free atoms)",
        )),
    }
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OfferBody {
    pub tenant_id: String,
    pub quota: Quota,
    #[serde(default)]
    pub priority: i32,
    #[serde(default)]
    pub include_descendants: bool,
}

/// `POST /v1/pools/{id}/offers`: offer the pool to a tenant (or replace the offer).
#[utoipa::path(
    post,
    path = "/v1/pools/{pool_id}/offers",
    tag = "fleet",
    summary = "Offer the pool to a tenant with a quota per resource",
    params(("pool_id" = String, Path, description = "The pool id")),
    request_body = OfferBody,
    responses((status = 200, description = "The offering", body = Object), CommonErrors),
    security(("bearer" = [])),
)]
pub async fn offer_pool(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<OfferBody>,
) -> Result<Response, ApiError> {
    let id: PoolId = path_id("poolId", &id)?;
    let caller = state.app.authorize(&who.0, "pools.offer", Subject::Pool(&id)).await?;
    let tenant_id: TenantId = path_id("tenantId", &body.tenant_id)?;
    let offer = OfferPool {
        tenant_id: tenant_id.clone(),
        quota: body.quota.clone(),
        priority: body.priority,
        include_descendants: body.include_descendants,
    };
    let done = state.app.offer_pool(&caller, &id, offer).await?;
    let body = json!({
        "poolId": id, "tenantId": tenant_id, "quota": body.quota, "priority": body.priority,
        "includeDescendants": body.include_descendants,
    });
    Ok(committed(StatusCode::OK, body, done.position, None))
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QuotaBody {
    pub quota: Quota,
}

/// `PUT /v1/pools/{id}/offers/{tenant}/quota`: replace the quota of an offering (decided on the caller's tenant
/// scope, as a whole-scope method).
#[utoipa::path(
    put,
    path = "/v1/pools/{pool_id}/offers/{tenant_id}/quota",
    tag = "fleet",
    summary = "Replace the quota of an offering",
    params(("pool_id" = String, Path, description = "The pool id"), ("tenant_id" = String, Path, description = "The offered tenant")),
    request_body = QuotaBody,
    responses((status = 200, description = "The new quota", body = Object), CommonErrors),
    security(("bearer" = [])),
)]
pub async fn set_quota(
    State(state): State<AppState>,
    who: Authed,
    Path((id, tenant)): Path<(String, String)>,
    JsonBody(body): JsonBody<QuotaBody>,
) -> Result<Response, ApiError> {
    let id: PoolId = path_id("poolId", &id)?;
    let tenant_id: TenantId = path_id("tenantId", &tenant)?;
    let caller = state.app.authorize(&who.0, "quotas.set", Subject::OwnTenant).await?;
    let done = state.app.set_quota(&caller, &id, &tenant_id, body.quota.clone()).await?;
    let body = json!({ "poolId": id, "tenantId": tenant_id, "quota": body.quota });
    Ok(committed(StatusCode::OK, body, done.position, None))
}

/// `GET /v1/audit`: the caller's tenant's audit trail, oldest first.
#[utoipa::path(
    get,
    path = "/v1/audit",
    tag = "audit",
    summary = "The caller's tenant's audit trail: allowed mutations with their admission context, and denials",
    params(PageParams, ("X-Min-Position" = Option<String>, Header, description = "A consistency token, as ?after=")),
    responses((status = 200, description = "A page: items and nextCursor", body = Object), (status = 503, description = "NOT_YET_CONSISTENT", body = ErrorBody), CommonErrors),
    security(("bearer" = [])),
)]
pub async fn audit(
    State(state): State<AppState>,
    who: Authed,
    MinPosition(after): MinPosition,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<Value>, ApiError> {
    let caller = state.app.authorize(&who.0, "audit.list", Subject::OwnTenant).await?;
    let page = params.page()?;
    Ok(Json(page_json(state.app.audit(&caller, &page, after).await?)))
}
