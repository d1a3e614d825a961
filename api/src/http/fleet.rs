//! Sites, projects, pools, offerings and quotas, capacity, availability, and the audit trail.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use bc_domain::device::DeviceClass;
use bc_domain::id::{PoolId, ProjectId, SiteId, TenantId};
use bc_domain::reservation::{DeviceRequest, Selector, Topology};
use serde::Deserialize;

use super::consistency::MinPosition;
use super::error::{CommonErrors, ErrorBody};
use super::request::{Authed, JsonBody, PageParams, QueryParams, committed_answer, next_cursor, path_id};
use super::{ApiError, AppState};
use crate::wire::fleet::{
    AvailabilityDto, EarliestStartDto, FreeAtomsDto, OfferBody, OfferedDto, PoolBody, PoolCapacityDto, PoolDto,
    PoolUpdateBody, ProjectBody, QuotaBody, QuotaSetDto, SiteBody, SiteDto,
};
use crate::wire::fleet::{ProjectDto, RevokedOfferDto};
use crate::wire::{AuditPage, CreatedDto, PoolPage, ProjectPage, SitePage};
use bc_commands::availability::EarliestStart;
use bc_commands::door::Subject;
use bc_commands::fleet::{CreatePool, CreateSite, OfferPool};

/// `POST /v1/sites`.
#[utoipa::path(
    post,
    path = "/v1/sites",
    tag = "fleet",
    summary = "Create a site in the caller's tenant",
    request_body = SiteBody,
    responses(CommonErrors, (status = 201, description = "Created; `X-Position` is its consistency token", body = CreatedDto), (status = 409, description = "The name is taken", body = ErrorBody)),
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
    Ok(committed_answer(StatusCode::CREATED, CreatedDto { id: done.value.to_string() }, done.position, None))
}

/// `GET /v1/sites`: the caller's tenant's sites.
#[utoipa::path(
    get,
    path = "/v1/sites",
    tag = "fleet",
    summary = "The caller's tenant's sites",
    params(PageParams),
    responses(CommonErrors, (status = 200, description = "A page: items and nextCursor", body = SitePage)),
    security(("bearer" = [])),
)]
pub async fn list_sites(
    State(state): State<AppState>,
    who: Authed,
    // Sites are read where they are written, so every token is already reached; it is still checked.
    MinPosition(_): MinPosition,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<SitePage>, ApiError> {
    let caller = state.app.authorize(&who.0, "sites.list", Subject::OwnTenant).await?;
    let page = params.page()?;
    let listed = state.app.list_sites(&caller, &page).await?;
    Ok(Json(SitePage {
        items: listed.items.iter().map(Into::into).collect(),
        next_cursor: next_cursor(&listed.next_key),
    }))
}

/// `GET /v1/sites/{id}`.
#[utoipa::path(
    get,
    path = "/v1/sites/{site_id}",
    tag = "fleet",
    summary = "One site of the caller's tenant",
    params(("site_id" = String, Path, description = "The site id"), ReadParams),
    responses(CommonErrors, (status = 200, description = "The site", body = SiteDto)),
    security(("bearer" = [])),
)]
pub async fn get_site(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    MinPosition(_): MinPosition,
    QueryParams(ReadParams { .. }): QueryParams<ReadParams>,
) -> Result<Json<SiteDto>, ApiError> {
    let id: SiteId = path_id("siteId", &id)?;
    let caller = state.app.authorize(&who.0, "sites.get", Subject::Site(&id)).await?;
    Ok(Json((&state.app.site(&caller, &id).await?).into()))
}

/// `DELETE /v1/sites/{site_id}`: a site that holds no pools.
#[utoipa::path(
    delete,
    path = "/v1/sites/{site_id}",
    tag = "fleet",
    summary = "Delete a site of the caller's tenant (refused with CONFLICT while it holds pools)",
    params(("site_id" = String, Path, description = "The site id")),
    responses(CommonErrors, (status = 200, description = "Deleted", body = CreatedDto)),
    security(("bearer" = [])),
)]
pub async fn delete_site(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id: SiteId = path_id("siteId", &id)?;
    let caller = state.app.authorize(&who.0, "sites.delete", Subject::Site(&id)).await?;
    let done = state.app.delete_site(&caller, &id).await?;
    Ok(committed_answer(StatusCode::OK, CreatedDto { id: id.to_string() }, done.position, None))
}

/// `POST /v1/projects`.
#[utoipa::path(
    post,
    path = "/v1/projects",
    tag = "fleet",
    summary = "Create a project in the caller's tenant",
    request_body = ProjectBody,
    responses(CommonErrors, (status = 201, description = "Created", body = CreatedDto), (status = 409, description = "The name is taken", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn create_project(
    State(state): State<AppState>,
    who: Authed,
    JsonBody(body): JsonBody<ProjectBody>,
) -> Result<Response, ApiError> {
    let caller = state.app.authorize(&who.0, "projects.create", Subject::OwnTenant).await?;
    let done = state.app.create_project(&caller, body.name).await?;
    Ok(committed_answer(StatusCode::CREATED, CreatedDto { id: done.value.to_string() }, done.position, None))
}

/// `GET /v1/projects`: the caller's tenant's projects.
#[utoipa::path(
    get,
    path = "/v1/projects",
    tag = "fleet",
    summary = "The caller's tenant's projects, by id",
    params(PageParams),
    responses(CommonErrors, (status = 200, description = "A page: items and nextCursor", body = ProjectPage)),
    security(("bearer" = [])),
)]
pub async fn list_projects(
    State(state): State<AppState>,
    who: Authed,
    // Projects are read where they are written, so every token is already reached; it is still checked.
    MinPosition(_): MinPosition,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<ProjectPage>, ApiError> {
    let caller = state.app.authorize(&who.0, "projects.list", Subject::OwnTenant).await?;
    let listed = state.app.list_projects(&caller, &params.page()?).await?;
    Ok(Json(ProjectPage {
        items: listed.items.iter().map(Into::into).collect(),
        next_cursor: next_cursor(&listed.next_key),
    }))
}

/// `GET /v1/projects/{project_id}`.
#[utoipa::path(
    get,
    path = "/v1/projects/{project_id}",
    tag = "fleet",
    summary = "One project of the caller's tenant",
    params(("project_id" = String, Path, description = "The project id")),
    responses(CommonErrors, (status = 200, description = "The project", body = ProjectDto)),
    security(("bearer" = [])),
)]
pub async fn get_project(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
) -> Result<Json<ProjectDto>, ApiError> {
    let id: ProjectId = path_id("projectId", &id)?;
    let caller = state.app.authorize(&who.0, "projects.get", Subject::OwnTenant).await?;
    Ok(Json((&state.app.get_project(&caller, &id).await?).into()))
}

/// `DELETE /v1/projects/{project_id}`: once its reservations have ended.
#[utoipa::path(
    delete,
    path = "/v1/projects/{project_id}",
    tag = "fleet",
    summary = "Delete a project of the caller's tenant (refused with CONFLICT while its reservations have not ended)",
    params(("project_id" = String, Path, description = "The project id")),
    responses(CommonErrors, (status = 200, description = "The project as it was", body = ProjectDto)),
    security(("bearer" = [])),
)]
pub async fn delete_project(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id: ProjectId = path_id("projectId", &id)?;
    let caller = state.app.authorize(&who.0, "projects.delete", Subject::OwnTenant).await?;
    let done = state.app.delete_project(&caller, &id).await?;
    Ok(committed_answer(StatusCode::OK, ProjectDto::from(&done.value), done.position, None))
}

/// `POST /v1/pools`: a pool in one of the caller's tenant's sites.
#[utoipa::path(
    post,
    path = "/v1/pools",
    tag = "fleet",
    summary = "Create a pool in one of the caller's tenant's sites",
    request_body = PoolBody,
    responses(CommonErrors, (status = 201, description = "Created", body = CreatedDto), (status = 409, description = "The name is taken", body = ErrorBody)),
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
        policy: body.policy.into(),
        provider_account_id: body.provider_account_id,
    };
    let done = state.app.create_pool(&caller, input).await?;
    let location = format!("/v1/pools/{}", done.value);
    Ok(committed_answer(StatusCode::CREATED, CreatedDto { id: done.value.to_string() }, done.position, Some(location)))
}

/// `GET /v1/pools`: the pools the caller's tenant owns or is offered.
#[utoipa::path(
    get,
    path = "/v1/pools",
    tag = "fleet",
    summary = "The pools the caller's tenant owns or is offered",
    params(PageParams, ("X-Min-Position" = Option<String>, Header, description = "A consistency token, as ?after=")),
    responses(CommonErrors, (status = 200, description = "A page: items and nextCursor", body = PoolPage), (status = 503, description = "NOT_YET_CONSISTENT", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn list_pools(
    State(state): State<AppState>,
    who: Authed,
    MinPosition(after): MinPosition,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<PoolPage>, ApiError> {
    let caller = state.app.authorize(&who.0, "pools.list", Subject::OwnTenant).await?;
    let page = params.page()?;
    let listed = state.app.list_pools(&caller, &page, after).await?;
    Ok(Json(PoolPage {
        items: listed.items.iter().map(Into::into).collect(),
        next_cursor: next_cursor(&listed.next_key),
    }))
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

/// `PATCH /v1/pools/{id}`: change a pool's name, policy or (while it has no nodes) sharing mode.
#[utoipa::path(
    patch,
    path = "/v1/pools/{pool_id}",
    tag = "fleet",
    summary = "Change the pool's name, policy or (while it has no nodes) sharing mode",
    params(("pool_id" = String, Path, description = "The pool id")),
    request_body = PoolUpdateBody,
    responses(CommonErrors, (status = 200, description = "Changed", body = CreatedDto)),
    security(("bearer" = [])),
)]
pub async fn update_pool(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<PoolUpdateBody>,
) -> Result<Response, ApiError> {
    let id: PoolId = path_id("poolId", &id)?;
    let caller = state.app.authorize(&who.0, "pools.update", Subject::Pool(&id)).await?;
    let change =
        bc_domain::pool::PoolChange { name: body.name, policy: body.policy.map(Into::into), sharing: body.sharing };
    let done = state.app.update_pool(&caller, &id, change).await?;
    Ok(committed_answer(StatusCode::OK, CreatedDto { id: id.to_string() }, done.position, None))
}

/// `DELETE /v1/pools/{id}`: a pool without nodes or live reservations.
#[utoipa::path(
    delete,
    path = "/v1/pools/{pool_id}",
    tag = "fleet",
    summary = "Delete a pool (refused with CONFLICT while it has nodes or reservations that have not ended)",
    params(("pool_id" = String, Path, description = "The pool id")),
    responses(CommonErrors, (status = 200, description = "Deleted", body = CreatedDto)),
    security(("bearer" = [])),
)]
pub async fn delete_pool(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id: PoolId = path_id("poolId", &id)?;
    let caller = state.app.authorize(&who.0, "pools.delete", Subject::Pool(&id)).await?;
    let done = state.app.delete_pool(&caller, &id).await?;
    Ok(committed_answer(StatusCode::OK, CreatedDto { id: id.to_string() }, done.position, None))
}

/// `GET /v1/pools/{id}`.
#[utoipa::path(
    get,
    path = "/v1/pools/{pool_id}",
    tag = "fleet",
    summary = "One pool",
    params(("pool_id" = String, Path, description = "The pool id"), ReadParams, ("X-Min-Position" = Option<String>, Header, description = "A consistency token, as ?after=")),
    responses(CommonErrors, (status = 200, description = "The pool", body = PoolDto), (status = 503, description = "NOT_YET_CONSISTENT", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn get_pool(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    MinPosition(after): MinPosition,
    QueryParams(ReadParams { .. }): QueryParams<ReadParams>,
) -> Result<Json<PoolDto>, ApiError> {
    let id: PoolId = path_id("poolId", &id)?;
    let caller = state.app.authorize(&who.0, "pools.get", Subject::Pool(&id)).await?;
    Ok(Json((&state.app.pool(&caller, &id, after).await?).into()))
}

/// `GET /v1/pools/{id}/capacity`: allocatable, allocated, reserved and available atoms per resource.
#[utoipa::path(
    get,
    path = "/v1/pools/{pool_id}/capacity",
    tag = "fleet",
    summary = "Allocatable, allocated, reserved and available atoms per resource",
    params(("pool_id" = String, Path, description = "The pool id"), ReadParams, ("X-Min-Position" = Option<String>, Header, description = "A consistency token, as ?after=")),
    responses(CommonErrors, (status = 200, description = "The rollup", body = PoolCapacityDto), (status = 503, description = "NOT_YET_CONSISTENT", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn pool_capacity(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    MinPosition(after): MinPosition,
    QueryParams(ReadParams { .. }): QueryParams<ReadParams>,
) -> Result<Json<PoolCapacityDto>, ApiError> {
    let id: PoolId = path_id("poolId", &id)?;
    let caller = state.app.authorize(&who.0, "pools.capacity", Subject::Pool(&id)).await?;
    let items = state.app.pool_capacity(&caller, &id, after).await?;
    Ok(Json(PoolCapacityDto { pool_id: id.to_string(), items: items.iter().map(Into::into).collect() }))
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
    /// The request's length in whole seconds, 1 to 31622400 (366 days).
    #[param(minimum = 1, maximum = 31_622_400)]
    pub duration: Option<u64>,
    /// Epoch milliseconds, like `start` and `end`: from 0 to the end of the year 9999.
    #[param(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub not_before: Option<i64>,
    #[param(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub start: Option<i64>,
    #[param(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub end: Option<i64>,
}

/// `GET /v1/pools/{id}/availability`.
#[utoipa::path(
    get,
    path = "/v1/pools/{pool_id}/availability",
    tag = "fleet",
    summary = "The earliest start of a request, or the atoms free over a window",
    params(("pool_id" = String, Path, description = "The pool id"), AvailabilityParams),
    responses(CommonErrors, (status = 200, description = "earliestStart, or nodes with their free atoms", body = AvailabilityDto)),
    security(("bearer" = [])),
)]
pub async fn availability(
    State(state): State<AppState>,
    who: Authed,
    Path(id): Path<String>,
    QueryParams(params): QueryParams<AvailabilityParams>,
) -> Result<Json<AvailabilityDto>, ApiError> {
    let id: PoolId = path_id("poolId", &id)?;
    let caller = state.app.authorize(&who.0, "pools.availability", Subject::Pool(&id)).await?;
    match (params.count, params.duration, params.start, params.end) {
        (Some(count), Some(duration), None, None) => {
            let class = match params.class {
                Some(class) => class,
                None => {
                    let pool = state.app.pool(&caller, &id, None).await?;
                    // A pool of whole machines books them, not their GPUs.
                    if pool.policy.tenant_root { DeviceClass::Node } else { pool.sharing.atom_class() }
                }
            };
            let query = EarliestStart {
                pool_id: id.clone(),
                devices: DeviceRequest { class, count, selector: Selector::default(), topology: Topology::SameNode },
                duration_s: duration,
                not_before_ms: params.not_before,
            };
            let earliest = state.app.earliest_start(&caller, &query).await?;
            Ok(Json(AvailabilityDto::EarliestStart(EarliestStartDto {
                pool_id: id.to_string(),
                earliest_start: earliest,
            })))
        }
        (None, None, Some(start), Some(end)) => {
            let free = state.app.free_atoms(&caller, &id, start, end).await?;
            let nodes = free.iter().map(Into::into).collect();
            Ok(Json(AvailabilityDto::FreeAtoms(FreeAtomsDto { pool_id: id.to_string(), start, end, nodes })))
        }
        _ => Err(ApiError::invalid_argument(
            "count",
            "ask with count and duration (the earliest start) or with start and end (the free atoms)",
        )),
    }
}

/// `DELETE /v1/pools/{pool_id}/offers/{tenant_id}`: withdraw an offering.
#[utoipa::path(
    delete,
    path = "/v1/pools/{pool_id}/offers/{tenant_id}",
    tag = "fleet",
    summary = "Withdraw the pool's offering to a tenant: it no longer sees the pool or reserves in it; what it reserved keeps running",
    params(("pool_id" = String, Path, description = "The pool id"), ("tenant_id" = String, Path, description = "The tenant the pool was offered to")),
    responses(CommonErrors, (status = 200, description = "Withdrawn", body = RevokedOfferDto)),
    security(("bearer" = [])),
)]
pub async fn revoke_offer(
    State(state): State<AppState>,
    who: Authed,
    Path((id, tenant)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let id: PoolId = path_id("poolId", &id)?;
    let tenant_id: TenantId = path_id("tenantId", &tenant)?;
    let caller = state.app.authorize(&who.0, "pools.offers.revoke", Subject::Pool(&id)).await?;
    let done = state.app.revoke_offer(&caller, &id, &tenant_id).await?;
    let body = RevokedOfferDto { pool_id: id.to_string(), tenant_id: tenant_id.to_string() };
    Ok(committed_answer(StatusCode::OK, body, done.position, None))
}

/// `POST /v1/pools/{id}/offers`: offer the pool to a tenant (or replace the offer).
#[utoipa::path(
    post,
    path = "/v1/pools/{pool_id}/offers",
    tag = "fleet",
    summary = "Offer the pool to a tenant with a quota per resource",
    params(("pool_id" = String, Path, description = "The pool id")),
    request_body = OfferBody,
    responses(CommonErrors, (status = 200, description = "The offering", body = OfferedDto)),
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
    if !state.app.tenant_known(&tenant_id) {
        return Err(ApiError::invalid_argument("tenantId", format!("no tenant {tenant_id} is known")));
    }
    let offer = OfferPool {
        tenant_id: tenant_id.clone(),
        quota: body.quota.clone(),
        priority: body.priority,
        include_descendants: body.include_descendants,
    };
    let done = state.app.offer_pool(&caller, &id, offer).await?;
    let body = OfferedDto {
        pool_id: id.to_string(),
        tenant_id: tenant_id.to_string(),
        quota: body.quota,
        priority: body.priority,
        include_descendants: body.include_descendants,
    };
    Ok(committed_answer(StatusCode::OK, body, done.position, None))
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
    responses(CommonErrors, (status = 200, description = "The new quota", body = QuotaSetDto)),
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
    let body = QuotaSetDto { pool_id: id.to_string(), tenant_id: tenant_id.to_string(), quota: body.quota };
    Ok(committed_answer(StatusCode::OK, body, done.position, None))
}

/// The query of `GET /v1/fleet/audit`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct FleetAuditParams {
    /// One tenant's trail; every tenant's when left out.
    pub tenant: Option<String>,
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
    pub cursor: Option<String>,
    /// A consistency token: answer once the read models have passed this position.
    #[allow(dead_code)]
    pub after: Option<String>,
}

/// `GET /v1/fleet/audit`: every tenant's audit trail, for the platform's operators.
#[utoipa::path(
    get,
    path = "/v1/fleet/audit",
    tag = "audit",
    summary = "Every tenant's audit trail (or one tenant's, with ?tenant=), oldest first: for the root tenant's administrators",
    params(FleetAuditParams, ("X-Min-Position" = Option<String>, Header, description = "A consistency token, as ?after=")),
    responses(CommonErrors, (status = 200, description = "A page: items and nextCursor", body = AuditPage), (status = 503, description = "NOT_YET_CONSISTENT", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn fleet_audit(
    State(state): State<AppState>,
    who: Authed,
    MinPosition(after): MinPosition,
    QueryParams(params): QueryParams<FleetAuditParams>,
) -> Result<Json<AuditPage>, ApiError> {
    let caller = state.app.authorize(&who.0, "fleet.audit.list", Subject::Fleet).await?;
    let tenant = params.tenant.as_deref().map(|t| path_id::<TenantId>("tenant", t)).transpose()?;
    let page = PageParams { limit: params.limit, cursor: params.cursor, after: None }.page()?;
    let listed = state.app.fleet_audit(&caller, tenant.as_ref(), &page, after).await?;
    Ok(Json(AuditPage {
        items: listed.items.iter().map(Into::into).collect(),
        next_cursor: next_cursor(&listed.next_key),
    }))
}

/// `GET /v1/audit`: the caller's tenant's audit trail, oldest first.
#[utoipa::path(
    get,
    path = "/v1/audit",
    tag = "audit",
    summary = "The caller's tenant's audit trail: allowed mutations with their admission context, and denials",
    params(PageParams, ("X-Min-Position" = Option<String>, Header, description = "A consistency token, as ?after=")),
    responses(CommonErrors, (status = 200, description = "A page: items and nextCursor", body = AuditPage), (status = 503, description = "NOT_YET_CONSISTENT", body = ErrorBody)),
    security(("bearer" = [])),
)]
pub async fn audit(
    State(state): State<AppState>,
    who: Authed,
    MinPosition(after): MinPosition,
    QueryParams(params): QueryParams<PageParams>,
) -> Result<Json<AuditPage>, ApiError> {
    let caller = state.app.authorize(&who.0, "audit.list", Subject::OwnTenant).await?;
    let page = params.page()?;
    let listed = state.app.audit(&caller, &page, after).await?;
    Ok(Json(AuditPage {
        items: listed.items.iter().map(Into::into).collect(),
        next_cursor: next_cursor(&listed.next_key),
    }))
}
