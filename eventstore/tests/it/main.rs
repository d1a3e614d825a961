//! Integration tests of the event store against real PostgreSQL: one private cluster for this test process,
//! a fresh database per test.

mod eventlog;
