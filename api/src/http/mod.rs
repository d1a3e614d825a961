//! The HTTP API under `/v1`: JSON in the seeds' camelCase, times in epoch milliseconds and durations in seconds,
//! errors as `{"error": {"code", "message", "details"}}`, `X-Request-Id` on every response, bearer tokens
//! decided by the [`Authorizer`](bc_commands::auth::Authorizer) against the method table.

pub mod agent;
pub mod consistency;
mod error;
pub mod events;
mod fleet;
mod health;
mod nodes;
pub mod openapi;
mod projections;
pub mod request;
mod reservations;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;

pub use error::ApiError;

use bc_commands::App;
use bc_commands::auth::{Authorizer, InvalidConfig};

/// What every handler can reach: the write side's one door, the event stream's hub, the process's metrics.
/// No database: everything a handler reads or changes goes through [`App`].
#[derive(Debug, Clone)]
pub struct AppState {
    pub app: App,
    /// The event stream's one log poller.
    pub events: Arc<events::EventHub>,
    /// What `/metrics` reports of this process.
    pub metrics: Arc<crate::metrics::Metrics>,
}

impl AppState {
    /// The state of a router over `app`, its authorizer checked against the method table first: a missing or
    /// wrong entry is `INVALID_CONFIG` before anything touches the store.
    pub fn new(app: App) -> Result<Self, InvalidConfig> {
        Self::with_events(app, events::EventsConfig::default())
    }

    /// [`AppState::new`] with the event stream configured.
    pub fn with_events(app: App, config: events::EventsConfig) -> Result<Self, InvalidConfig> {
        check_routes(app.authorizer())?;
        let events = Arc::new(events::EventHub::new(app.clone(), config));
        Ok(Self { app, events, metrics: crate::metrics::shared() })
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

/// Declares every route once, making both [`ROUTES`] and the router's routes from it, so the two cannot differ.
macro_rules! routes {
    ($($verb:ident $path:literal => $handler:path, $method:tt;)*) => {
        /// Every route the API serves.
        pub const ROUTES: &[Route] = &[$(Route { http: routes!(@http $verb), path: $path, method: routes!(@method $method) },)*];

        fn routed(router: Router<AppState>) -> Router<AppState> {
            router$(.route($path, axum::routing::$verb($handler)))*
        }
    };
    (@http get) => { "GET" };
    (@http post) => { "POST" };
    (@http put) => { "PUT" };
    (@http delete) => { "DELETE" };
    (@method open) => { None };
    (@method $method:literal) => { Some($method) };
}

routes! {
    get "/v1/healthz" => health::healthz, open;
    get "/v1/openapi.json" => openapi::document, open;
    post "/v1/sites" => fleet::create_site, "sites.create";
    get "/v1/sites" => fleet::list_sites, "sites.list";
    get "/v1/sites/{site_id}" => fleet::get_site, "sites.get";
    post "/v1/projects" => fleet::create_project, "projects.create";
    post "/v1/pools" => fleet::create_pool, "pools.create";
    get "/v1/pools" => fleet::list_pools, "pools.list";
    get "/v1/pools/{pool_id}" => fleet::get_pool, "pools.get";
    get "/v1/pools/{pool_id}/capacity" => fleet::pool_capacity, "pools.capacity";
    get "/v1/pools/{pool_id}/availability" => fleet::availability, "pools.availability";
    post "/v1/pools/{pool_id}/offers" => fleet::offer_pool, "pools.offer";
    put "/v1/pools/{pool_id}/offers/{tenant_id}/quota" => fleet::set_quota, "quotas.set";
    post "/v1/nodes" => nodes::register, "nodes.register";
    get "/v1/nodes" => nodes::list, "nodes.list";
    get "/v1/nodes/{node_id}" => nodes::get, "nodes.get";
    post "/v1/nodes/{node_id}/cordon" => nodes::cordon, "nodes.cordon";
    post "/v1/nodes/{node_id}/uncordon" => nodes::uncordon, "nodes.uncordon";
    post "/v1/nodes/{node_id}/maintenance/start" => nodes::start_maintenance, "nodes.maintenance.start";
    post "/v1/nodes/{node_id}/maintenance/end" => nodes::end_maintenance, "nodes.maintenance.end";
    post "/v1/nodes/{node_id}/drain" => nodes::drain, "nodes.drain";
    delete "/v1/nodes/{node_id}" => nodes::delete, "nodes.delete";
    put "/v1/nodes/{node_id}/spec" => nodes::set_spec, "nodes.spec.set";
    post "/v1/nodes/{node_id}/commands" => nodes::create_command, "nodes.commands.create";
    get "/v1/nodes/{node_id}/commands" => nodes::list_commands, "nodes.commands.list";
    get "/v1/nodes/{node_id}/inventory" => nodes::inventory, "nodes.inventory.get";
    post "/v1/pools/{pool_id}/join-tokens" => nodes::create_join_token, "nodes.join_tokens.create";
    // The agent's routes: a join token or the node credential, never a tenant's principal.
    post "/v1/agent/join" => agent::join, open;
    post "/v1/agent/sessions" => agent::open_session, open;
    post "/v1/agent/credential" => agent::rotate_credential, open;
    post "/v1/agent/heartbeat" => agent::heartbeat, open;
    post "/v1/agent/inventory" => agent::inventory, open;
    get "/v1/agent/commands" => agent::commands, open;
    post "/v1/agent/commands/{command_id}/ack" => agent::ack, open;
    post "/v1/reservations" => reservations::create, "reservations.create";
    get "/v1/reservations" => reservations::list, "reservations.list";
    get "/v1/reservations/{reservation_id}" => reservations::get, "reservations.get";
    post "/v1/reservations/{reservation_id}/renew" => reservations::renew, "reservations.renew";
    post "/v1/reservations/{reservation_id}/extend" => reservations::extend, "reservations.extend";
    post "/v1/reservations/{reservation_id}/cancel" => reservations::cancel, "reservations.cancel";
    post "/v1/reservations/{reservation_id}/release" => reservations::release, "reservations.release";
    get "/v1/audit" => fleet::audit, "audit.list";
    get "/v1/events" => events::stream, "events.stream";
    get "/v1/projections" => projections::list, "projections.status";
}

/// Checks the method table (and the authorizer's catalog) against every route's method.
pub fn check_routes(auth: &dyn Authorizer) -> Result<(), InvalidConfig> {
    let routed: Vec<&str> = ROUTES.iter().filter_map(|r| r.method).collect();
    bc_commands::auth::check_config(auth, &routed)
}

/// The router of the whole API.
pub fn router(state: AppState) -> Router {
    routed(Router::new())
        .route("/metrics", axum::routing::get(health::metrics))
        .fallback(not_routed)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(request::BODY_LIMIT))
        .layer(axum::middleware::from_fn_with_state(state.metrics.clone(), crate::metrics::count_requests))
        .layer(axum::middleware::from_fn(request::around_request))
        .with_state(state)
}

/// The router of a process without the API (`serve --role worker`): its health check and its metrics only, so
/// that probes and scrapers watch it the same way.
pub fn worker_router(state: AppState) -> Router {
    Router::new()
        .route("/v1/healthz", axum::routing::get(health::healthz))
        .route("/metrics", axum::routing::get(health::metrics))
        .fallback(not_routed)
        .layer(axum::middleware::from_fn_with_state(state.metrics.clone(), crate::metrics::count_requests))
        .layer(axum::middleware::from_fn(request::around_request))
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
