//! Query builders that never name a prepared statement.
//!
//! sqlx names and caches statements by default; a named statement outlives the transaction and breaks behind
//! PgBouncer in transaction mode. Every statement of this workspace goes through these builders, which send
//! an unnamed statement, and runs inside a [`crate::Tx`].

use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::{Query, QueryAs, QueryScalar};
use sqlx::{FromRow, Postgres};

/// `sqlx::query`, unnamed.
pub fn query(sql: &'static str) -> Query<'static, Postgres, PgArguments> {
    sqlx::query(sql).persistent(false)
}

/// `sqlx::query_as`, unnamed.
pub fn query_as<O>(sql: &'static str) -> QueryAs<'static, Postgres, O, PgArguments>
where
    O: for<'r> FromRow<'r, PgRow>,
{
    sqlx::query_as(sql).persistent(false)
}

/// `sqlx::query_scalar`, unnamed.
pub fn query_scalar<O>(sql: &'static str) -> QueryScalar<'static, Postgres, O, PgArguments>
where
    (O,): for<'r> FromRow<'r, PgRow>,
{
    sqlx::query_scalar(sql).persistent(false)
}
