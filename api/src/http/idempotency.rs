//! `Idempotency-Key` on every create route: the first answer to a caller's key is kept (by the write side),
//! and a retry with the same key, route and body is answered it with `Idempotent-Replayed: true`, without
//! running again; the same key with another request is `IDEMPOTENCY_KEY_REUSED`. Reservations and bearer
//! tokens answer retries themselves (their ids derive from the key).

use std::collections::HashMap;
use std::sync::OnceLock;

use axum::body::{Body, to_bytes};
use axum::extract::{FromRequestParts as _, MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use bc_commands::idempotency::Claim;
use serde::{Deserialize, Serialize};

use super::request::{Authed, BODY_LIMIT, idempotency_key};
use super::{ApiError, AppState};

/// The create routes this layer keeps answers for (by API method), and whether an answer holds a secret.
pub const CREATES: &[(&str, bool)] = &[
    ("sites.create", false),
    ("projects.create", false),
    ("pools.create", false),
    ("nodes.register", false),
    ("nodes.enrol", false),
    ("workflows.create", false),
    ("nodes.commands.create", false),
    ("nodes.join_tokens.create", true),
    ("tenants.create", false),
    ("identities.create", false),
    ("grants.create", false),
    ("limits.create", false),
    ("profiles.create", false),
    ("provider_accounts.create", false),
    ("flavors.create", false),
    ("webhooks.create", true),
];

/// The headers of an answer that a replay repeats.
const KEPT_HEADERS: &[&str] = &["content-type", "location", "x-position"];

/// The largest answer kept.
const ANSWER_LIMIT: usize = 256 * 1024;

#[derive(Serialize, Deserialize)]
struct Kept {
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// The API method of a create route this layer serves, with whether its answer holds a secret: looked up by
/// the matched path in a table made once from the route table, since every POST passes here.
fn create_route(request: &Request) -> Option<(&'static str, bool)> {
    static BY_PATH: OnceLock<HashMap<String, (&'static str, bool)>> = OnceLock::new();
    if request.method() != axum::http::Method::POST {
        return None;
    }
    let by_path = BY_PATH.get_or_init(|| {
        let creates = super::routes().iter().filter(|r| r.http == "POST").filter_map(|r| {
            let (method, secret) = CREATES.iter().find(|(m, _)| Some(*m) == r.method)?;
            Some((r.path.clone(), (*method, *secret)))
        });
        creates.collect()
    });
    by_path.get(request.extensions().get::<MatchedPath>()?.as_str()).copied()
}

pub async fn keep_first_answer(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Some((method, holds_secret)) = create_route(&request) else { return next.run(request).await };
    let key = match idempotency_key(request.headers()) {
        Ok(Some(key)) => key,
        Ok(None) => return next.run(request).await,
        Err(err) => return err.into_response(),
    };
    match keyed(&state, method, holds_secret, &key, request, next).await {
        Ok(response) => response,
        Err(err) => err.into_response(),
    }
}

async fn keyed(
    state: &AppState,
    method: &'static str,
    holds_secret: bool,
    key: &str,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let (mut parts, body) = request.into_parts();
    // The handler takes this caller from the extensions instead of authenticating again.
    let Authed(call) = Authed::from_request_parts(&mut parts, state).await?;
    parts.extensions.insert(Authed(call.clone()));
    let deadline = super::request::BodyDeadline::of(&parts.extensions);
    let bytes = tokio::time::timeout(deadline, to_bytes(body, BODY_LIMIT))
        .await
        .map_err(|_| super::request::BodyDeadline::passed(deadline))?
        .map_err(|_| ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "INVALID_ARGUMENT", "the body is too large"))?;
    let target = parts.uri.path_and_query().map_or_else(|| parts.uri.path().to_owned(), ToString::to_string);
    let mut hashed = Vec::with_capacity(bytes.len() + target.len() + method.len() + 2);
    hashed.extend_from_slice(method.as_bytes());
    hashed.push(0);
    hashed.extend_from_slice(target.as_bytes());
    hashed.push(0);
    hashed.extend_from_slice(&bytes);
    let sha256 = bc_domain::sha256_hex(&hashed);
    match state.app.claim_key(&call.principal, key, method, &sha256).await? {
        Claim::Replay { status, answer } => {
            let kept: Kept = serde_json::from_slice(&answer)
                .map_err(|err| ApiError::from(bc_eventstore::Error::Internal(format!("a kept answer: {err}"))))?;
            let mut response = Response::new(Body::from(kept.body));
            *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            put_headers(response.headers_mut(), &kept.headers);
            response.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
            Ok(response)
        }
        Claim::Run => {
            let response = next.run(Request::from_parts(parts, Body::from(bytes))).await;
            if !response.status().is_success() {
                state.app.release_key(&call.principal, key).await?;
                return Ok(response);
            }
            let (parts, body) = response.into_parts();
            let body = to_bytes(body, ANSWER_LIMIT)
                .await
                .map_err(|_| ApiError::from(bc_eventstore::Error::Internal("an answer too large to keep".into())))?;
            let headers: Vec<(String, String)> = KEPT_HEADERS
                .iter()
                .filter_map(|name| {
                    parts.headers.get(*name).and_then(|v| v.to_str().ok()).map(|v| ((*name).to_owned(), v.to_owned()))
                })
                .collect();
            let kept = serde_json::to_vec(&Kept { headers, body: body.to_vec() })
                .map_err(|err| ApiError::from(bc_eventstore::Error::Internal(format!("keep an answer: {err}"))))?;
            state.app.keep_answer(&call.principal, key, parts.status.as_u16(), &kept, holds_secret).await?;
            Ok(Response::from_parts(parts, Body::from(body)))
        }
    }
}

fn put_headers(headers: &mut HeaderMap, kept: &[(String, String)]) {
    for (name, value) in kept {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name.as_str()), HeaderValue::from_str(value)) {
            headers.insert(name, value);
        }
    }
}
