//! Integration tests of the HTTP API against real PostgreSQL: the router in process, the server on a real
//! port, and the `better-compute` binary as a real process.

mod agents;
mod audit_checkpoints;
mod browser;
mod cli;
mod consistency;
mod console;
mod dashboard;
mod external_authorizer;
mod flavors;
mod health;
mod hostile;
mod http_api;
mod idempotency;
mod images;
mod instances;
mod investigate;
mod lifecycle;
mod metal;
mod metrics;
mod outcomes;
mod process;
mod profiles;
mod providers;
mod ramdisk;
mod runtime;
mod scale_out;
mod site;
mod sse;
mod tenancy;
mod tidy;
mod webhooks;
mod whole_nodes;
mod workflows;
