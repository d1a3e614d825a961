//! Better Compute's pure domain model: ids, sites, pools and offerings, nodes and their schedulability,
//! devices and atoms, reservations and placement. Each aggregate (reservation, node, pool, join token, site,
//! project) has one `evolve` that folds its events and the decisions that make them; `testing` holds the
//! given/when/then harness they are tested with. No IO, no async.
//!
//! The crate stays free of tokio, sqlx and axum so that the `bcd` agent can link it alone.

pub mod acceptance;
pub mod agent;
pub mod audit;
pub mod device;
pub mod event;
pub mod flavor;
pub mod gpu;
pub mod hardware;
pub mod id;
pub mod image;
pub mod instance;
pub mod instant;
pub mod inventory;
pub mod node;
pub mod placement;
pub mod pool;
pub mod position;
pub mod profile;
pub mod provider;
pub mod region;
pub mod rejection;
pub mod reservation;
pub mod site;
pub mod stream;
pub mod tenancy;
pub mod testing;
pub mod upcast;
pub mod webhook;
pub mod workflow;

pub use rejection::Rejection;

/// The lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: impl AsRef<[u8]>) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes).iter().fold(String::with_capacity(64), |mut hex, byte| {
        use std::fmt::Write as _;
        let _ = write!(hex, "{byte:02x}");
        hex
    })
}
