//! The API's one error type: `{"error": {"code", "message", "details"}}` with the matching status. A 5xx never
//! carries database text.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub details: Value,
}

impl ApiError {
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "UNAVAILABLE",
            message: message.into(),
            details: json!({}),
        }
    }
}

impl ApiError {
    /// `400 INVALID_ARGUMENT` naming the field.
    pub fn invalid_argument(field: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        Self {
            status: StatusCode::BAD_REQUEST,
            code: "INVALID_ARGUMENT",
            message: format!("{field}: {message}"),
            details: json!({ "field": field }),
        }
    }

    /// A store error as the API answers it: `503 UNAVAILABLE` when the database is unreachable, otherwise a
    /// generic `500 INTERNAL_ERROR` (the database's text is logged, never sent).
    pub fn from_store(err: &bc_eventstore::Error) -> Self {
        if err.code() == "UNAVAILABLE" {
            return Self::unavailable("the database is unreachable");
        }
        tracing::error!(error = %err, "request failed");
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: "INTERNAL_ERROR",
            message: "internal error".to_owned(),
            details: json!({}),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message, "details": self.details}});
        (self.status, Json(body)).into_response()
    }
}
