//! The store's error type: business-level answers (`Conflict`, `LeaseLost`, `InvalidConfig`) kept apart
//! from database failures, with the SQLSTATE helpers that decide what is worth a retry.

use std::borrow::Cow;

use bc_domain::event::{DecodeError, EncodeError};

/// SQLSTATE `40001`: the transaction could not be serialized and may succeed when retried.
pub const SERIALIZATION_FAILURE: &str = "40001";
/// SQLSTATE `40P01`: PostgreSQL broke a deadlock by aborting this transaction.
pub const DEADLOCK_DETECTED: &str = "40P01";
/// SQLSTATE `23P01`: an exclusion constraint refused the row (two bookings overlapped).
pub const EXCLUSION_VIOLATION: &str = "23P01";
/// SQLSTATE `23505`: a unique constraint refused the row.
pub const UNIQUE_VIOLATION: &str = "23505";
/// SQLSTATE `57014`: the statement ran past `statement_timeout` (or was cancelled).
pub const QUERY_CANCELED: &str = "57014";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The stream's head was not the version the caller expected. `actual` is the head this transaction saw;
    /// it is `None` when a concurrent transaction appended the same version and committed first, whose
    /// head this transaction's snapshot cannot see.
    #[error("stream {stream_id} was expected at version {expected}, but {}", actual_text(*actual))]
    Conflict { stream_id: String, expected: u32, actual: Option<u32> },

    /// The lease is no longer held by this owner at this epoch: another process owns the work now.
    #[error("lease {name} is no longer held by this process (epoch {epoch})")]
    LeaseLost { name: String, epoch: i64 },

    /// Configuration or stored state this build cannot work with. Maps to `INVALID_CONFIG`.
    #[error("{0}")]
    InvalidConfig(String),

    /// The caller passed a value the store refuses. Maps to `INVALID_ARGUMENT`.
    #[error("{0}")]
    InvalidArgument(String),

    /// Something that must not happen did, such as a COMMIT that PostgreSQL turned into a ROLLBACK.
    /// Maps to `INTERNAL_ERROR`.
    #[error("{0}")]
    Internal(String),

    /// A migration failed; its changes and its ledger row were rolled back together.
    #[error("migration {name} failed and was rolled back: {source}")]
    Migration {
        name: String,
        #[source]
        source: sqlx::Error,
    },

    #[error(transparent)]
    Encode(#[from] EncodeError),

    #[error(transparent)]
    Decode(#[from] DecodeError),

    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

fn actual_text(actual: Option<u32>) -> String {
    match actual {
        Some(version) => format!("it is at version {version}"),
        None => "a concurrent transaction appended that version first".to_owned(),
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The API error code this error maps to.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Conflict { .. } => "CONFLICT",
            Error::LeaseLost { .. } => "CONFLICT",
            Error::InvalidConfig(_) => "INVALID_CONFIG",
            Error::InvalidArgument(_) => "INVALID_ARGUMENT",
            Error::Database(err) if is_unavailable(err) => "UNAVAILABLE",
            // A race that outlasted its retries is a conflict the caller may retry, not an internal fault.
            Error::Database(_) if self.is_retryable() => "CONFLICT",
            Error::Internal(_) | Error::Migration { .. } | Error::Encode(_) | Error::Decode(_) | Error::Database(_) => {
                "INTERNAL_ERROR"
            }
        }
    }

    /// The SQLSTATE of the database error behind this one, if any.
    pub fn sql_state(&self) -> Option<Cow<'_, str>> {
        match self {
            Error::Database(err) => sql_state(err),
            _ => None,
        }
    }

    /// Whether running the whole transaction again may succeed: a version conflict, a serialization failure,
    /// a deadlock, or atoms booked meanwhile.
    pub fn is_retryable(&self) -> bool {
        self.retry_reason().is_some()
    }

    /// Why running the whole transaction again may succeed, as a metric label: `stream_version` (another writer
    /// appended that version first), `serialization` (a row this snapshot read or locks changed meanwhile),
    /// `deadlock`, or `exclusion` (atoms booked meanwhile). `None` when it may not.
    pub fn retry_reason(&self) -> Option<RetryReason> {
        match self {
            Error::Conflict { .. } => Some(RetryReason::StreamVersion),
            Error::Database(err) if is_version_race(err) => Some(RetryReason::StreamVersion),
            Error::Database(err) => match sql_state(err).as_deref() {
                Some(SERIALIZATION_FAILURE) => Some(RetryReason::Serialization),
                Some(DEADLOCK_DETECTED) => Some(RetryReason::Deadlock),
                Some(EXCLUSION_VIOLATION) => Some(RetryReason::Exclusion),
                _ => None,
            },
            _ => None,
        }
    }
}

/// Why a transaction is run again (see [`Error::retry_reason`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryReason {
    StreamVersion,
    Serialization,
    Deadlock,
    Exclusion,
}

impl RetryReason {
    pub const ALL: [RetryReason; 4] =
        [RetryReason::StreamVersion, RetryReason::Serialization, RetryReason::Deadlock, RetryReason::Exclusion];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryReason::StreamVersion => "stream_version",
            RetryReason::Serialization => "serialization",
            RetryReason::Deadlock => "deadlock",
            RetryReason::Exclusion => "exclusion",
        }
    }
}

/// Whether the error is a concurrent appender winning the same stream version (the unique key of the log), which
/// a server-side function that appends reports as it is: the same conflict as [`Error::Conflict`].
pub fn is_version_race(err: &sqlx::Error) -> bool {
    err.as_database_error().is_some_and(|db| {
        db.code().as_deref() == Some(UNIQUE_VIOLATION) && db.constraint() == Some("events_stream_version_key")
    })
}

/// Reads the SQLSTATE (such as `23P01`) of a database error.
pub fn sql_state(err: &sqlx::Error) -> Option<Cow<'_, str>> {
    err.as_database_error().and_then(|db| db.code())
}

/// Whether the error means the database could not be reached (as opposed to refusing a statement).
pub fn is_unavailable(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => {
            // Class 08 (connection exception) and 57P0x (admin or crash shutdown, cannot connect now).
            db.code().is_some_and(|code| code.starts_with("08") || code.starts_with("57P0"))
        }
        _ => false,
    }
}
