//! The read side: projections of the event log into read models (pools, capacity rollups, audit,
//! reservations, nodes), their inline and asynchronous runners, checkpoints and rebuilds.
//!
//! The projection framework arrives with its own issue; this crate holds the place in the dependency
//! chain `domain ← eventstore ← projections ← api`.

pub use bc_eventstore::Position;
