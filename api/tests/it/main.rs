//! Integration tests of the application against real PostgreSQL: the command handlers, the router in
//! process, and the `better-compute` binary as a real process.

mod agents;
mod consistency;
mod fleet;
mod health;
mod hostile;
mod http_api;
mod investigate;
mod metrics;
mod nodes;
mod process;
mod read_models;
mod reservations;
mod scale_out;
mod sse;
mod support;
mod torture;
