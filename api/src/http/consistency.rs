//! The consistency token of a read: `?after=<position>` or the `X-Min-Position` header.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use bc_eventstore::Position;
use serde_json::json;

use super::ApiError;

/// The position a read must reflect, if the caller named one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinPosition(pub Option<Position>);

fn invalid(field: &str, err: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_argument(field, err.to_string())
}

impl<S: Send + Sync> FromRequestParts<S> for MinPosition {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let from_query = parts
            .uri
            .query()
            .and_then(|query| query.split('&').find_map(|pair| pair.strip_prefix("after=").map(str::to_owned)));
        if let Some(text) = from_query {
            return text.parse().map(|p| MinPosition(Some(p))).map_err(|err| invalid("after", err));
        }
        match parts.headers.get("x-min-position") {
            Some(value) => {
                let text = value.to_str().map_err(|_| invalid("X-Min-Position", "is not text"))?;
                text.parse().map(|p| MinPosition(Some(p))).map_err(|err| invalid("X-Min-Position", err))
            }
            None => Ok(MinPosition(None)),
        }
    }
}

/// `503 NOT_YET_CONSISTENT` with the position the read models reached.
pub fn not_yet_consistent(wanted: Position, reached: Position) -> ApiError {
    ApiError {
        status: axum::http::StatusCode::SERVICE_UNAVAILABLE,
        code: "NOT_YET_CONSISTENT",
        message: format!("the read models reached {reached}, not yet {wanted}; retry shortly"),
        details: json!({ "wanted": wanted.to_string(), "reached": reached.to_string() }),
    }
}
