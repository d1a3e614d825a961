//! The application: command handlers, workers, authorization, the HTTP API (axum) and the service's lifecycle
//! (`serve`, `dev`, `migrate`). The `better-compute` binary is a thin `main` over
//! this library: it parses the command line and the environment into typed configuration and calls in here.

pub mod app;
pub mod auth;
pub mod bench;
pub mod dev;
pub mod doctor;
pub mod http;
pub mod metrics;
pub mod ops;
pub mod service;
