//! Integration tests of the application against real PostgreSQL.

mod health;
