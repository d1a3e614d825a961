//! The API's one error type: `{"error": {"code", "message", "details"}}` with the matching status. A 5xx never
//! carries database text.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bc_domain::Rejection;
use bc_domain::reservation::ReservationState;
use serde_json::{Value, json};

use bc_commands::AppError;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub details: Value,
    /// What went wrong inside, for the log: never sent, since it can carry database text. The request's
    /// middleware logs it once, in the request's span ([`Failure`]).
    cause: Option<String>,
    /// Seconds to wait before trying again, sent as `Retry-After`.
    retry_after: Option<u32>,
}

/// The cause of a 5xx answer, left in the response's extensions for the middleware that logs it.
#[derive(Debug, Clone)]
pub struct Failure(pub String);

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self { status, code, message: message.into(), details: json!({}), cause: None, retry_after: None }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }

    /// The same answer with one more entry in its details.
    pub fn with_detail(mut self, key: &str, value: Value) -> Self {
        match &mut self.details {
            Value::Object(details) => {
                details.insert(key.to_owned(), value);
            }
            _ => self.details = serde_json::json!({ key: value }),
        }
        self
    }

    /// The same answer, with what went wrong inside for the log (never sent).
    pub fn with_cause(mut self, cause: impl std::fmt::Display) -> Self {
        self.cause = Some(cause.to_string());
        self
    }

    /// The same answer, telling the client to wait `seconds` before trying again (`Retry-After`).
    pub fn with_retry_after(mut self, seconds: u32) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE", message)
    }

    /// `400 INVALID_ARGUMENT` naming the field.
    pub fn invalid_argument(field: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        Self::new(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", format!("{field}: {message}"))
            .with_details(json!({ "field": field }))
    }

    /// `404 NOT_FOUND`: the thing does not exist, or the caller may not know that it does.
    pub fn not_found(kind: &str, id: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "NOT_FOUND", format!("{kind} {id} was not found"))
            .with_details(json!({ "kind": kind, "id": id }))
    }

    /// `401 UNAUTHENTICATED`.
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", message)
    }

    /// `403 FORBIDDEN` with the reason.
    pub fn forbidden(reason: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "FORBIDDEN", reason)
    }
}

/// A store error as the API answers it: `503 UNAVAILABLE` when the database is unreachable, `409 CONFLICT` when a
/// race outlasted the retries, otherwise a generic `500 INTERNAL_ERROR` whose cause is logged, never sent.
impl From<bc_eventstore::Error> for ApiError {
    fn from(err: bc_eventstore::Error) -> Self {
        let answer = match err.code() {
            "UNAVAILABLE" => Self::unavailable("the database is unreachable"),
            "CONFLICT" => {
                Self::new(StatusCode::CONFLICT, "CONFLICT", "the request raced with concurrent changes; retry it")
            }
            _ => Self::new(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL_ERROR", "internal error"),
        };
        Self { cause: Some(err.to_string()), ..answer }
    }
}

impl From<Rejection> for ApiError {
    fn from(rejection: Rejection) -> Self {
        AppError::Rejected(rejection).into()
    }
}

impl From<AppError> for ApiError {
    fn from(err: AppError) -> Self {
        match err {
            AppError::Rejected(rejection) => {
                let status = match &rejection {
                    Rejection::InvalidArgument { .. } => StatusCode::BAD_REQUEST,
                    Rejection::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
                    Rejection::NotFound { .. } => StatusCode::NOT_FOUND,
                    Rejection::WrongState { .. }
                    | Rejection::Conflict(_)
                    | Rejection::IdempotencyKeyReused { .. }
                    | Rejection::KeyReused(_)
                    | Rejection::QuotaExceeded(_)
                    | Rejection::CapacityUnavailable(_)
                    | Rejection::QuoteStale(_) => StatusCode::CONFLICT,
                    Rejection::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
                    Rejection::Forbidden(_) | Rejection::TenantSuspended(_) => StatusCode::FORBIDDEN,
                };
                let details = match &rejection {
                    Rejection::InvalidArgument { field, .. } | Rejection::TooLarge { field, .. } => {
                        json!({ "field": field })
                    }
                    Rejection::NotFound { kind, id } => json!({ "kind": kind, "id": id }),
                    Rejection::WrongState { state, .. } => json!({ "state": state.as_str() }),
                    Rejection::IdempotencyKeyReused { reservation_id } => json!({ "reservationId": reservation_id }),
                    _ => json!({}),
                };
                ApiError::new(status, rejection.code(), rejection.to_string()).with_details(details)
            }
            AppError::Store(err) => err.into(),
            AppError::NotYetConsistent { wanted, reached } => super::consistency::not_yet_consistent(wanted, reached),
            AppError::Denied(denied) => {
                let mut details = json!({ "reservationId": denied.reservation_id });
                if denied.state != ReservationState::Denied {
                    details["state"] = json!(denied.state.as_str());
                }
                ApiError::forbidden(denied.reason).with_details(details)
            }
            AppError::Explained(explained) => {
                let bc_commands::explain::Explained { rejection, explanation } = *explained;
                let mut error = ApiError::from(AppError::Rejected(rejection));
                let explanation = crate::wire::explanations::ExplanationDto::from(&*explanation);
                if let Ok(value) = serde_json::to_value(explanation) {
                    error = error.with_detail("explanation", value);
                }
                error
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message, "details": self.details}});
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert("www-authenticate", axum::http::HeaderValue::from_static("Bearer"));
        }
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from(seconds));
        }
        if self.status.is_server_error() {
            let cause = self.cause.unwrap_or_else(|| self.message.clone());
            response.extensions_mut().insert(Failure(cause));
        }
        response
    }
}

pub use bc_wire::{ErrorBody, ErrorDetail};

/// The errors every route with a body or a caller can answer.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // Only described, never built: the handlers answer `ApiError`.
pub enum CommonErrors {
    /// Bad input, naming the field in `details.field`; nothing was written.
    #[response(status = 400)]
    BadRequest(ErrorBody),
    /// No bearer token, or one nobody knows.
    #[response(status = 401)]
    Unauthenticated(ErrorBody),
    /// Not allowed, with the reason.
    #[response(status = 403)]
    Forbidden(ErrorBody),
    /// Not found, or not visible to the caller (the two are not told apart).
    #[response(status = 404)]
    NotFound(ErrorBody),
    /// A command that conflicts with the current state (a name taken, the disruption budget spent, the wrong
    /// state), or that raced with concurrent changes beyond its retries. Reads never answer it.
    #[response(status = 409)]
    Conflict(ErrorBody),
    /// The body did not arrive within the API's deadline (`REQUEST_TIMEOUT`, naming `body`).
    #[response(status = 408)]
    RequestTimeout(ErrorBody),
    /// The body is larger than the API reads.
    #[response(status = 413)]
    TooLarge(ErrorBody),
    /// A body that is not `application/json` (`UNSUPPORTED_MEDIA_TYPE`, naming `content-type`).
    #[response(status = 415)]
    UnsupportedMediaType(ErrorBody),
    /// The bearer token already has the most requests in flight the server takes from one token
    /// (`TOO_MANY_REQUESTS`, with `details.limit`); `Retry-After` says when to try again.
    #[response(status = 429)]
    TooManyRequests(ErrorBody),
    /// Something failed inside; the message is generic and the cause is logged.
    #[response(status = 500)]
    Internal(ErrorBody),
    /// The database is unreachable (or, for reads with a consistency token, `NOT_YET_CONSISTENT`).
    #[response(status = 503)]
    Unavailable(ErrorBody),
}
