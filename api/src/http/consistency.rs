//! The consistency token of a read: `?after=<position>` or the `X-Min-Position` header.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use bc_commands::App;
use bc_eventstore::Position;
use serde_json::json;

use super::{ApiError, AppState};

/// The position a read must reflect, if the caller named one. Both forms are checked when both are sent, and
/// the later position is the one waited for; a position this log never handed out is refused, since waiting
/// for it could only time out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinPosition(pub Option<Position>);

fn invalid(field: &str, err: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_argument(field, err.to_string())
}

/// The positions named in a request's `?after=` and `X-Min-Position`, each with its field's name.
fn named_positions(parts: &Parts) -> Result<Vec<(&'static str, Position)>, ApiError> {
    let mut named = Vec::new();
    let query = parts.uri.query().unwrap_or_default();
    for (key, text) in form_urlencoded::parse(query.as_bytes()) {
        if key == "after" {
            named.push(("after", text.parse().map_err(|err| invalid("after", err))?));
        }
    }
    for value in parts.headers.get_all("x-min-position") {
        let text = value.to_str().map_err(|_| invalid("X-Min-Position", "is not text"))?;
        named.push(("X-Min-Position", text.trim().parse().map_err(|err| invalid("X-Min-Position", err))?));
    }
    Ok(named)
}

/// Refuses a position this log cannot have handed out (see [`App::within_log`]).
pub async fn check_within_log(app: &App, field: &str, position: Position) -> Result<(), ApiError> {
    if app.within_log(position).await? {
        Ok(())
    } else {
        Err(invalid(field, format!("{position} is beyond the end of this event log: it was not handed out by it")))
    }
}

impl FromRequestParts<AppState> for MinPosition {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let named = named_positions(parts)?;
        for (field, position) in &named {
            check_within_log(&state.app, field, *position).await?;
        }
        Ok(MinPosition(named.into_iter().map(|(_, position)| position).max()))
    }
}

/// `503 NOT_YET_CONSISTENT` with the position the read models reached.
pub fn not_yet_consistent(wanted: Position, reached: Position) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "NOT_YET_CONSISTENT",
        format!("the read models reached {reached}, not yet {wanted}; retry shortly"),
    )
    .with_details(json!({ "wanted": wanted.to_string(), "reached": reached.to_string() }))
}
