//! The application: the HTTP API (axum), the service's lifecycle (`serve`, `dev`, `migrate`) and, in later
//! issues, command handlers, reconcilers and authorization. The `better-compute` binary is a thin `main` over
//! this library: it parses the command line and the environment into typed configuration and calls in here.

pub mod app;
pub mod bench;
pub mod dev;
pub mod http;
pub mod ops;
pub mod service;
