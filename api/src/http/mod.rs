//! The HTTP API under `/v1`: JSON in the seeds' camelCase, times in epoch milliseconds and durations in seconds,
//! errors as `{"error": {"code", "message", "details"}}`, `X-Request-Id` on every response, bearer tokens
//! decided by the [`Authorizer`](crate::auth::Authorizer) against the method table.

pub mod consistency;
mod error;
pub mod events;
mod fleet;
mod health;
mod nodes;
mod projections;
pub mod request;
mod reservations;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post, put};
use bc_eventstore::Db;

pub use error::ApiError;

use crate::app::App;
use crate::auth::{Authorizer, DenialCounts, InvalidConfig};

/// What every handler can reach.
#[derive(Debug, Clone)]
pub struct AppState {
    pub app: App,
    pub auth: Arc<dyn Authorizer>,
    pub denials: Arc<DenialCounts>,
    /// The event stream's one log poller.
    pub events: Arc<events::EventHub>,
}

impl AppState {
    /// The state of a router over `db`, its authorization checked against the method table first: a missing or
    /// wrong entry is `INVALID_CONFIG` before anything touches the store.
    pub fn new(db: Db, auth: Arc<dyn Authorizer>) -> Result<Self, InvalidConfig> {
        Self::with_events(db, auth, events::EventsConfig::default())
    }

    /// [`AppState::new`] with the event stream configured.
    pub fn with_events(db: Db, auth: Arc<dyn Authorizer>, config: events::EventsConfig) -> Result<Self, InvalidConfig> {
        check_routes(auth.as_ref())?;
        let events = Arc::new(events::EventHub::new(db.clone(), config));
        Ok(Self { app: App::new(db), auth, denials: Arc::new(DenialCounts::default()), events })
    }

    pub fn db(&self) -> &Db {
        &self.app.db
    }
}

/// One route: its HTTP method and path (axum's syntax), and the API method it is decided as (`None`: open to
/// everyone, such as the health check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub http: &'static str,
    pub path: &'static str,
    pub method: Option<&'static str>,
}

const fn route(http: &'static str, path: &'static str, method: Option<&'static str>) -> Route {
    Route { http, path, method }
}

/// Every route the API serves.
pub const ROUTES: &[Route] = &[
    route("GET", "/v1/healthz", None),
    route("POST", "/v1/sites", Some("sites.create")),
    route("POST", "/v1/projects", Some("projects.create")),
    route("POST", "/v1/pools", Some("pools.create")),
    route("GET", "/v1/pools", Some("pools.list")),
    route("GET", "/v1/pools/{pool_id}", Some("pools.get")),
    route("GET", "/v1/pools/{pool_id}/capacity", Some("pools.capacity")),
    route("GET", "/v1/pools/{pool_id}/availability", Some("pools.availability")),
    route("POST", "/v1/pools/{pool_id}/offers", Some("pools.offer")),
    route("PUT", "/v1/pools/{pool_id}/offers/{tenant_id}/quota", Some("quotas.set")),
    route("POST", "/v1/nodes", Some("nodes.register")),
    route("GET", "/v1/nodes", Some("nodes.list")),
    route("POST", "/v1/nodes/{node_id}/cordon", Some("nodes.cordon")),
    route("POST", "/v1/nodes/{node_id}/uncordon", Some("nodes.uncordon")),
    route("POST", "/v1/nodes/{node_id}/maintenance/start", Some("nodes.maintenance.start")),
    route("POST", "/v1/nodes/{node_id}/maintenance/end", Some("nodes.maintenance.end")),
    route("POST", "/v1/reservations", Some("reservations.create")),
    route("GET", "/v1/reservations", Some("reservations.list")),
    route("GET", "/v1/reservations/{reservation_id}", Some("reservations.get")),
    route("POST", "/v1/reservations/{reservation_id}/renew", Some("reservations.renew")),
    route("POST", "/v1/reservations/{reservation_id}/extend", Some("reservations.extend")),
    route("POST", "/v1/reservations/{reservation_id}/cancel", Some("reservations.cancel")),
    route("POST", "/v1/reservations/{reservation_id}/release", Some("reservations.release")),
    route("GET", "/v1/audit", Some("audit.list")),
    route("GET", "/v1/events", Some("events.stream")),
    route("GET", "/v1/projections", Some("projections.status")),
];

/// Checks the method table (and the authorizer's catalog) against every route's method.
pub fn check_routes(auth: &dyn Authorizer) -> Result<(), InvalidConfig> {
    let routed: Vec<&str> = ROUTES.iter().filter_map(|r| r.method).collect();
    crate::auth::check_config(auth, &routed)
}

/// The router of the whole API.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/healthz", get(health::healthz))
        .route("/v1/sites", post(fleet::create_site))
        .route("/v1/projects", post(fleet::create_project))
        .route("/v1/pools", post(fleet::create_pool).get(fleet::list_pools))
        .route("/v1/pools/{pool_id}", get(fleet::get_pool))
        .route("/v1/pools/{pool_id}/capacity", get(fleet::pool_capacity))
        .route("/v1/pools/{pool_id}/availability", get(fleet::availability))
        .route("/v1/pools/{pool_id}/offers", post(fleet::offer_pool))
        .route("/v1/pools/{pool_id}/offers/{tenant_id}/quota", put(fleet::set_quota))
        .route("/v1/nodes", post(nodes::register).get(nodes::list))
        .route("/v1/nodes/{node_id}/cordon", post(nodes::cordon))
        .route("/v1/nodes/{node_id}/uncordon", post(nodes::uncordon))
        .route("/v1/nodes/{node_id}/maintenance/start", post(nodes::start_maintenance))
        .route("/v1/nodes/{node_id}/maintenance/end", post(nodes::end_maintenance))
        .route("/v1/reservations", post(reservations::create).get(reservations::list))
        .route("/v1/reservations/{reservation_id}", get(reservations::get))
        .route("/v1/reservations/{reservation_id}/renew", post(reservations::renew))
        .route("/v1/reservations/{reservation_id}/extend", post(reservations::extend))
        .route("/v1/reservations/{reservation_id}/cancel", post(reservations::cancel))
        .route("/v1/reservations/{reservation_id}/release", post(reservations::release))
        .route("/v1/audit", get(fleet::audit))
        .route("/v1/events", get(events::stream))
        .route("/v1/projections", get(projections::list))
        .fallback(not_routed)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(request::BODY_LIMIT))
        .layer(axum::middleware::from_fn(request::request_id))
        .with_state(state)
}

async fn not_routed(uri: axum::http::Uri) -> ApiError {
    ApiError::new(axum::http::StatusCode::NOT_FOUND, "NOT_FOUND", format!("no route {}", uri.path()))
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        "INVALID_ARGUMENT",
        format!("{method} is not served on {}", uri.path()),
    )
}
