//! Better Compute's pure domain model: ids, sites, pools and offerings, nodes and their schedulability,
//! devices and atoms, reservations (`decide`/`evolve`) and placement. No IO, no async.
//!
//! The crate stays free of tokio, sqlx and axum so that the `bcd` agent can link it alone.

pub mod device;
pub mod event;
pub mod gpu;
pub mod hardware;
pub mod id;
pub mod inventory;
pub mod node;
pub mod placement;
pub mod pool;
pub mod region;
pub mod rejection;
pub mod reservation;
pub mod site;
pub mod stream;
pub mod upcast;

pub use rejection::Rejection;
