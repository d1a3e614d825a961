//! The HTTP API under `/v1`.

pub mod consistency;
mod error;
mod health;
mod projections;

use axum::Router;
use axum::routing::get;
use bc_eventstore::Db;

pub use error::ApiError;

/// What every handler can reach.
#[derive(Debug, Clone)]
pub struct AppState {
    pub db: Db,
}

/// The router of the whole API.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/healthz", get(health::healthz))
        .route("/v1/projections", get(projections::list))
        .with_state(state)
}
