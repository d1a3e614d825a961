//! Integration tests of the application against real PostgreSQL: the router in process, and the
//! `better-compute` binary as a real process.

mod health;
mod process;
