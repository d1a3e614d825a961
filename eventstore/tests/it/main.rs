//! Integration tests of the event store against real PostgreSQL: one private cluster for this test process,
//! a fresh database per test.

mod clock;
mod concurrency;
mod connections;
mod eventlog;
mod executor;
mod harness;
mod leases;
mod migrations;
mod pgbouncer;
mod queue;
mod restore;
mod sql_now;
mod support;
