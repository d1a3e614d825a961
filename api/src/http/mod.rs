//! The HTTP API under `/v1`: JSON in the seeds' camelCase, times in epoch milliseconds and durations in seconds,
//! errors as `{"error": {"code", "message", "details"}}`, `X-Request-Id` on every response, bearer tokens
//! decided by the [`Authorizer`](bc_commands::auth::Authorizer) against the method table.

pub mod agent;
mod audit;
pub mod consistency;
pub mod console;
mod error;
pub mod events;
mod flavors;
mod fleet;
mod health;
pub mod idempotency;
mod images;
pub mod in_flight;
mod instances;
mod ledger;
mod lifecycle;
mod nodes;
pub mod openapi;
mod pki;
mod profiles;
mod projections;
mod providers;
mod quotes;
mod ramdisk;
pub mod request;
mod reservations;
mod tenancy;
mod webhooks;
mod workflows;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;

pub use error::ApiError;
use openapi::{BearerAuth, IdempotentCreates, TextPatterns};

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
    /// The web origins whose pages may call the API (CORS); none by default.
    pub cors_origins: Vec<axum::http::HeaderValue>,
    /// How long a client may take over a JSON body, or stay silent in an upload ([`request::BODY_DEADLINE`]).
    pub body_deadline: std::time::Duration,
    /// The limit on the listener's open connections, whose figures `/metrics` reports; none for a router
    /// served some other way (tests).
    pub connections: Option<crate::tls::ConnectionLimit>,
    /// The requests each bearer token has in flight, capped ([`in_flight::MAX_REQUESTS_PER_TOKEN`] by default).
    pub in_flight: Arc<in_flight::InFlight>,
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
        Ok(Self {
            app,
            events,
            metrics: crate::metrics::shared(),
            cors_origins: Vec::new(),
            body_deadline: request::BODY_DEADLINE,
            connections: None,
            in_flight: Arc::new(in_flight::InFlight::default()),
        })
    }

    /// The same state, answering `429 TOO_MANY_REQUESTS` to a bearer token with `max` requests in flight.
    pub fn with_requests_per_token(mut self, max: usize) -> Self {
        self.in_flight = Arc::new(in_flight::InFlight::new(max));
        self
    }

    /// The same state, reporting the open connections of the listener that `limit` bounds.
    pub fn with_connection_limit(mut self, limit: crate::tls::ConnectionLimit) -> Self {
        self.connections = Some(limit);
        self
    }

    /// The same state, answering CORS for pages of `origins` (`https://console.example.com`).
    pub fn with_cors(mut self, origins: &[String]) -> Result<Self, InvalidConfig> {
        self.cors_origins = origins
            .iter()
            .map(|origin| {
                check_origin(origin)
                    .and_then(|()| axum::http::HeaderValue::from_str(origin).map_err(|err| err.to_string()))
                    .map_err(|reason| InvalidConfig { problems: vec![format!("CORS origin {origin:?}: {reason}")] })
            })
            .collect::<Result<_, _>>()?;
        Ok(self)
    }
}

/// An origin as browsers send it: `scheme://host[:port]`, nothing after.
fn check_origin(origin: &str) -> Result<(), String> {
    let rest = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
        .ok_or("must start with https:// or http://")?;
    if rest.is_empty() || rest.contains(['/', '?', '#', ' ', '*']) || origin.len() > 255 {
        return Err("must be scheme://host[:port], with no path and no wildcard".to_owned());
    }
    Ok(())
}

/// The CORS answer for the configured origins: the API's methods and the headers its clients send and read.
fn cors(origins: &[axum::http::HeaderValue]) -> tower_http::cors::CorsLayer {
    use axum::http::{HeaderName, Method};
    let headers =
        ["authorization", "content-type", "idempotency-key", "last-event-id", "x-min-position", "x-request-id"];
    let exposed = ["x-position", "x-request-id", "location", "idempotent-replayed"];
    tower_http::cors::CorsLayer::new()
        .allow_origin(origins.to_vec())
        .allow_methods([Method::GET, Method::POST, Method::PUT, Method::PATCH, Method::DELETE])
        .allow_headers(headers.map(HeaderName::from_static))
        .expose_headers(exposed.map(HeaderName::from_static))
        .max_age(std::time::Duration::from_secs(600))
}

/// One route: its HTTP method and path (axum's syntax), and the API method it is decided as (`None`: open to
/// everyone, such as the health check, or outside the method table, such as the agent's routes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub http: String,
    pub path: String,
    pub method: Option<&'static str>,
}

/// Declares every route once: its handler, whose `#[utoipa::path]` alone names its HTTP method and path, and
/// the API method it is decided as. The OpenAPI document ([`ApiDoc`]), the router and [`routes`] are all made
/// from it, so none of them can differ from the others.
macro_rules! routes {
    ($($module:ident :: $handler:ident => $method:tt;)*) => {
        /// The OpenAPI document of every route.
        #[derive(utoipa::OpenApi)]
        #[openapi(
            info(
                title = "Better Compute",
                description = "The control plane of a GPU fleet: sites, pools, nodes and reservations. Times are \
                               epoch milliseconds, durations seconds; every response carries `X-Request-Id`, every \
                               command's `X-Position` is a consistency token for reads (`?after=` or \
                               `X-Min-Position`)."
            ),
            paths($($module::$handler,)*),
            components(schemas(error::ErrorBody, error::ErrorDetail)),
            modifiers(&BearerAuth, &TextPatterns, &IdempotentCreates)
        )]
        pub struct ApiDoc;

        /// Every route the API serves, with the API method each is decided as.
        pub fn routes() -> &'static [Route] {
            static ROUTES: std::sync::OnceLock<Vec<Route>> = std::sync::OnceLock::new();
            ROUTES.get_or_init(|| {
                let doc = openapi::document_once();
                vec![$({
                    let (_, http, path) = openapi::operation(doc, stringify!($handler));
                    Route { http: http.to_owned(), path, method: routes!(@method $method) }
                },)*]
            })
        }

        fn routed(router: Router<AppState>) -> Router<AppState> {
            let doc = openapi::document_once();
            $(let (filter, _, path) = openapi::operation(doc, stringify!($handler));
            let router = router.route(&path, axum::routing::on(filter, $module::$handler));)*
            router
        }
    };
    (@method open) => { None };
    (@method $method:literal) => { Some($method) };
}

routes! {
    health::healthz => open;
    openapi::document => open;
    pki::ca_certificate => open;
    pki::revocation_list => open;
    pki::audit_key => open;
    fleet::create_site => "sites.create";
    fleet::list_sites => "sites.list";
    fleet::get_site => "sites.get";
    fleet::delete_site => "sites.delete";
    fleet::create_project => "projects.create";
    fleet::list_projects => "projects.list";
    fleet::get_project => "projects.get";
    fleet::delete_project => "projects.delete";
    fleet::create_pool => "pools.create";
    fleet::list_pools => "pools.list";
    fleet::get_pool => "pools.get";
    fleet::update_pool => "pools.update";
    fleet::delete_pool => "pools.delete";
    fleet::pool_capacity => "pools.capacity";
    fleet::availability => "pools.availability";
    quotes::quote_reservation => "pools.quote";
    fleet::offer_pool => "pools.offer";
    fleet::revoke_offer => "pools.offers.revoke";
    fleet::set_quota => "quotas.set";
    nodes::register_node => "nodes.register";
    lifecycle::enrol_node => "nodes.enrol";
    lifecycle::change_provision_state => "nodes.provision";
    workflows::create_workflow => "workflows.create";
    workflows::list_workflows => "workflows.list";
    workflows::get_workflow => "workflows.get";
    workflows::cancel_workflow => "workflows.cancel";
    nodes::list_nodes => "nodes.list";
    nodes::get_node => "nodes.get";
    nodes::node_devices => "nodes.get";
    nodes::pool_devices => "nodes.list";
    nodes::cordon => "nodes.cordon";
    nodes::uncordon => "nodes.uncordon";
    nodes::start_maintenance => "nodes.maintenance.start";
    nodes::end_maintenance => "nodes.maintenance.end";
    nodes::drain_node => "nodes.drain";
    nodes::delete_node => "nodes.delete";
    nodes::set_spec => "nodes.spec.set";
    nodes::create_command => "nodes.commands.create";
    nodes::list_commands => "nodes.commands.list";
    nodes::node_inventory => "nodes.inventory.get";
    nodes::create_join_token => "nodes.join_tokens.create";
    nodes::list_join_tokens => "nodes.join_tokens.list";
    nodes::revoke_join_token => "nodes.join_tokens.revoke";
    // The agent's routes: a join token or the node credential, never a tenant's principal.
    agent::join => open;
    agent::open_session => open;
    agent::rotate_credential => open;
    agent::issue_certificate => open;
    agent::heartbeat => open;
    agent::report_inventory => open;
    agent::agent_commands => open;
    agent::ack_command => open;
    agent::site_steps => open;
    agent::report_site_step => open;
    agent::site_boot => open;
    agent::site_image => open;
    agent::agent_instances => open;
    agent::agent_instance_image => open;
    agent::report_instance_state => open;
    // The ramdisk's routes: its boot credential or its session, never a tenant's principal.
    ramdisk::claim_session => open;
    ramdisk::work => open;
    ramdisk::report_step => open;
    reservations::create_reservation => "reservations.create";
    reservations::list_reservations => "reservations.list";
    reservations::list_fleet_reservations => "fleet.reservations.list";
    reservations::get_reservation => "reservations.get";
    reservations::get_explanation => "reservations.get";
    reservations::renew_reservation => "reservations.renew";
    reservations::extend_reservation => "reservations.extend";
    reservations::cancel_reservation => "reservations.cancel";
    reservations::release_reservation => "reservations.release";
    tenancy::whoami => "whoami";
    tenancy::create_tenant => "tenants.create";
    tenancy::list_tenants => "tenants.list";
    tenancy::get_tenant => "tenants.get";
    tenancy::suspend_tenant => "tenants.suspend";
    tenancy::resume_tenant => "tenants.resume";
    tenancy::create_identity => "identities.create";
    tenancy::list_identities => "identities.list";
    tenancy::delete_identity => "identities.delete";
    tenancy::issue_token => "tokens.create";
    tenancy::list_tokens => "tokens.list";
    tenancy::revoke_token => "tokens.revoke";
    tenancy::create_grant => "grants.create";
    tenancy::list_grants => "grants.list";
    tenancy::revoke_grant => "grants.revoke";
    tenancy::create_limit => "limits.create";
    tenancy::list_limits => "limits.list";
    tenancy::delete_limit => "limits.delete";
    images::upload_image => "images.create";
    images::list_images => "images.list";
    images::get_image => "images.get";
    images::image_content => "images.content.get";
    images::delete_image => "images.delete";
    profiles::create_profile => "profiles.create";
    profiles::list_profiles => "profiles.list";
    profiles::get_profile => "profiles.get";
    profiles::delete_profile => "profiles.delete";
    instances::create_instance => "instances.create";
    instances::list_instances => "instances.list";
    instances::get_instance => "instances.get";
    instances::start_instance => "instances.start";
    instances::stop_instance => "instances.stop";
    instances::delete_instance => "instances.delete";
    flavors::create_flavor => "flavors.create";
    flavors::list_flavors => "flavors.list";
    flavors::get_flavor => "flavors.get";
    flavors::delete_flavor => "flavors.delete";
    providers::create_provider_account => "provider_accounts.create";
    providers::list_provider_accounts => "provider_accounts.list";
    providers::get_provider_account => "provider_accounts.get";
    providers::rotate_provider_credential => "provider_accounts.credential.rotate";
    providers::delete_provider_account => "provider_accounts.delete";
    webhooks::create_webhook => "webhooks.create";
    webhooks::list_webhooks => "webhooks.list";
    webhooks::get_webhook => "webhooks.get";
    webhooks::delete_webhook => "webhooks.delete";
    webhooks::rotate_webhook_secret => "webhooks.secret.rotate";
    webhooks::webhook_deliveries => "webhooks.deliveries.list";
    webhooks::replay_webhook_dead_letters => "webhooks.dead_letters.replay";
    ledger::get_ledger => "ledger.get";
    fleet::audit => "audit.list";
    fleet::fleet_audit => "fleet.audit.list";
    audit::list_checkpoints => "audit.checkpoints.list";
    audit::get_checkpoint => "audit.checkpoints.get";
    audit::get_proof => "audit.proofs.get";
    events::event_stream => "events.stream";
    events::issue_ticket => "events.tickets.create";
    projections::projection_status => "projections.status";
}

/// Checks the method table (and the authorizer's catalog) against every route's method.
pub fn check_routes(auth: &dyn Authorizer) -> Result<(), InvalidConfig> {
    let routed: Vec<&str> = routes().iter().filter_map(|r| r.method).collect();
    bc_commands::auth::check_config(auth, &routed)
}

/// The router of the whole API.
pub fn router(state: AppState) -> Router {
    let origins = state.cors_origins.clone();
    let deadline = request::BodyDeadline(state.body_deadline);
    let router = routed(Router::new())
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), idempotency::keep_first_answer))
        // Outside the idempotency keys' layer: a request past its token's cap touches nothing.
        .route_layer(axum::middleware::from_fn_with_state(Arc::clone(&state.in_flight), in_flight::limit_per_token))
        .route("/metrics", axum::routing::get(health::metrics))
        .route("/console", axum::routing::get(console::root))
        .route("/console/", axum::routing::get(console::index))
        .route("/console/{*path}", axum::routing::get(console::file))
        .fallback(not_routed)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(request::BODY_LIMIT))
        .layer(axum::Extension(deadline))
        .layer(axum::middleware::from_fn_with_state(state.metrics.clone(), crate::metrics::count_requests))
        .layer(axum::middleware::from_fn(request::around_request))
        .with_state(state);
    if origins.is_empty() { router } else { router.layer(cors(&origins)) }
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
