//! `GET /v1/openapi.json`: the OpenAPI document, generated from the handlers' annotations.

use axum::Json;
use serde::Serialize;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use super::{agent, events, fleet, health, nodes, projections, reservations};

/// Every error: `{"error": {"code", "message", "details"}}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// The error itself.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// `INVALID_ARGUMENT`, `UNAUTHENTICATED`, `FORBIDDEN`, `NOT_FOUND`, `CONFLICT`, `CAPACITY_UNAVAILABLE`,
    /// `QUOTA_EXCEEDED`, `IDEMPOTENCY_KEY_REUSED`, `NOT_YET_CONSISTENT`, `UNAVAILABLE`, `INTERNAL_ERROR`.
    pub code: String,
    pub message: String,
    /// Such as `field`, naming what is wrong with the input.
    #[schema(value_type = Object)]
    pub details: serde_json::Value,
}

/// The errors every authorized route can answer.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // Only described, never built: the handlers answer `ApiError`.
pub enum CommonErrors {
    /// Bad input, naming the field in `details.field`; nothing was written.
    #[response(status = 400)]
    BadRequest(ErrorBody),
    /// No bearer token, or one nobody knows.
    #[response(status = 401)]
    Unauthenticated(ErrorBody),
    /// Not allowed, with the reason.
    #[response(status = 403)]
    Forbidden(ErrorBody),
    /// Not found, or not visible to the caller (the two are not told apart).
    #[response(status = 404)]
    NotFound(ErrorBody),
}

/// Bearer tokens, as the authorizer knows them.
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme("bearer", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
        // Node agents authenticate with the credential their node got at join (`nc_...`), as a bearer token.
        components.add_security_scheme("node", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Better Compute",
        description = "The control plane of a GPU fleet: sites, pools, nodes and reservations. Times are epoch \
                       milliseconds, durations seconds; every response carries `X-Request-Id`, every command's \
                       `X-Position` is a consistency token for reads (`?after=` or `X-Min-Position`)."
    ),
    paths(
        health::healthz,
        fleet::create_site,
        fleet::list_sites,
        fleet::get_site,
        fleet::create_project,
        fleet::create_pool,
        fleet::list_pools,
        fleet::get_pool,
        fleet::pool_capacity,
        fleet::availability,
        fleet::offer_pool,
        fleet::set_quota,
        nodes::register,
        nodes::list,
        nodes::get,
        nodes::cordon,
        nodes::uncordon,
        nodes::start_maintenance,
        nodes::end_maintenance,
        nodes::drain,
        nodes::delete,
        nodes::set_spec,
        nodes::create_command,
        nodes::list_commands,
        nodes::inventory,
        nodes::create_join_token,
        agent::join,
        agent::open_session,
        agent::rotate_credential,
        agent::heartbeat,
        agent::inventory,
        agent::commands,
        agent::ack,
        reservations::create,
        reservations::list,
        reservations::get,
        reservations::renew,
        reservations::extend,
        reservations::cancel,
        reservations::release,
        fleet::audit,
        events::stream,
        projections::list,
        document,
    ),
    components(schemas(ErrorBody, ErrorDetail)),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

/// The document.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "health",
    summary = "This OpenAPI document",
    responses((status = 200, description = "The document", body = Object))
)]
pub async fn document() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
