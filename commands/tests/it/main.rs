//! Integration tests of the write side against real PostgreSQL: the command handlers, the worker and the read
//! models they feed, without HTTP.

mod fleet;
mod nodes;
mod read_models;
mod reservations;
mod scalars;
mod secrets;
mod torture;
