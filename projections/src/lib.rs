//! The read side: projections of the event log into read models.
//!
//! `inline` holds the projections that run inside the command's own transaction (bookings, quota holders,
//! device and node state used by placement, reservations) and can be rebuilt from the log into a scratch
//! schema and compared with the live tables. `framework` runs the asynchronous projections (the read models in
//! `models`) in a daemon, with versions, checkpoints, fenced leases and switches.

pub mod consistency;
pub mod framework;
pub mod inline;
pub mod models;
pub mod rebuild;
pub mod replay;
pub mod status;

pub use bc_eventstore::Position;
#[cfg(feature = "testing")]
pub mod testing;
