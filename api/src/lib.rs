//! The HTTP API (REST under `/v1`, the SSE event stream, metrics) and the service's lifecycle (`serve`, `dev`,
//! `migrate`, `doctor`, the investigation commands). The `better-compute` binary is a thin `main` over this
//! library: it parses the command line and the environment into typed configuration and calls in here. The
//! write side it serves is `bc-commands`; this crate holds no SQL of its own beyond what operators' commands
//! read.

pub mod authorizer;
pub mod cli;
pub mod dev;
pub mod doctor;
pub mod http;
pub mod metrics;
pub mod ops;
pub mod service;
pub mod tls;
pub mod webhooks;
pub use bc_wire as wire;
