//! The read side: projections of the event log into read models.
//!
//! `inline` holds the projections that run inside the command's own transaction (bookings, quota holders,
//! device and node state used by placement, reservations) and can be rebuilt from the log into a scratch
//! schema and compared with the live tables. The asynchronous projection framework arrives with its issue.

pub mod inline;

pub use bc_eventstore::Position;
