//! Better Compute's pure domain model: ids, event encoding and metadata. No IO, no async.
//!
//! Later issues add the aggregates (`decide`/`evolve`), placement and the agent protocol here; the crate
//! stays free of tokio, sqlx and axum so that the `bcd` agent can link it alone.

pub mod event;
pub mod id;
