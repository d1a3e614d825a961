//! Rejections: the business answers a command can get instead of events. Each maps to an API error code.

use crate::reservation::ReservationState;

/// Why a command was refused. Not a failure of the system: the caller can act on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// A field of the request is wrong. `INVALID_ARGUMENT`.
    #[error("{field}: {message}")]
    InvalidArgument { field: String, message: String },

    /// A field, or the body it describes, is larger than this control plane takes. `INVALID_ARGUMENT`, answered
    /// `413`.
    #[error("{field}: {message}")]
    TooLarge { field: String, message: String },

    /// The thing named does not exist, or is not visible to the caller. `NOT_FOUND`.
    #[error("{kind} {id} was not found")]
    NotFound { kind: &'static str, id: String },

    /// The reservation is in a state where this verb does not apply. `CONFLICT`, naming the state.
    #[error("cannot {verb} a reservation that is {state}")]
    WrongState { verb: &'static str, state: ReservationState },

    /// Another conflict with the current state (a name taken, a lease already lapsed). `CONFLICT`.
    #[error("{0}")]
    Conflict(String),

    /// The same idempotency key was used with a different request. `IDEMPOTENCY_KEY_REUSED`.
    #[error("the idempotency key was already used for a different request (reservation {reservation_id})")]
    IdempotencyKeyReused { reservation_id: String },

    /// The same idempotency key was used with another request on another route, or with another body.
    /// `IDEMPOTENCY_KEY_REUSED`.
    #[error("{0}")]
    KeyReused(String),

    /// The tenant's quota can never admit this request. `QUOTA_EXCEEDED`.
    #[error("{0}")]
    QuotaExceeded(String),

    /// The credential presented (a join token, a node credential) is unknown, used up or expired.
    /// `UNAUTHENTICATED`.
    #[error("{0}")]
    Unauthenticated(String),

    /// The caller is who it says, but may not do this (a node speaking for another). `FORBIDDEN`.
    #[error("{0}")]
    Forbidden(String),

    /// The caller's tenant, or one of its ancestors, is suspended, and the call would start new work.
    /// `TENANT_SUSPENDED`.
    #[error("{0}")]
    TenantSuspended(String),

    /// The request can never fit the pool, or the pool's pending queue is full, or the caller asked not to
    /// wait. `CAPACITY_UNAVAILABLE`.
    #[error("{0}")]
    CapacityUnavailable(String),

    /// A quoted booking whose devices, nodes or quota changed since the quote, so nothing was booked.
    /// `QUOTE_STALE`, naming what changed.
    #[error("{0}")]
    QuoteStale(String),
}

impl Rejection {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Rejection::InvalidArgument { field: field.into(), message: message.into() }
    }

    /// The API error code.
    pub fn code(&self) -> &'static str {
        match self {
            Rejection::InvalidArgument { .. } | Rejection::TooLarge { .. } => "INVALID_ARGUMENT",
            Rejection::NotFound { .. } => "NOT_FOUND",
            Rejection::WrongState { .. } | Rejection::Conflict(_) => "CONFLICT",
            Rejection::IdempotencyKeyReused { .. } | Rejection::KeyReused(_) => "IDEMPOTENCY_KEY_REUSED",
            Rejection::QuotaExceeded(_) => "QUOTA_EXCEEDED",
            Rejection::CapacityUnavailable(_) => "CAPACITY_UNAVAILABLE",
            Rejection::QuoteStale(_) => "QUOTE_STALE",
            Rejection::Unauthenticated(_) => "UNAUTHENTICATED",
            Rejection::Forbidden(_) => "FORBIDDEN",
            Rejection::TenantSuspended(_) => "TENANT_SUSPENDED",
        }
    }
}
