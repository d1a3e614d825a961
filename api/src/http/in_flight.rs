//! A cap on the requests one bearer token has in flight at once. Without it one client firing thousands of
//! requests at once queues them all for the database pool, and every other caller's request waits behind the
//! whole queue; with it the flood past the cap is answered `429 TOO_MANY_REQUESTS` at once, and the others wait
//! behind at most the cap. Event streams are not counted here (they are long-lived, and capped on their own by
//! `events::StreamLimits`), nor are requests without a bearer token (refused at once, or served by the node's
//! certificate).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::{MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use serde_json::json;

use super::ApiError;

/// How many requests one bearer token may have in flight at once unless told otherwise.
pub const MAX_REQUESTS_PER_TOKEN: usize = 64;

/// The API methods left out: event streams have limits of their own.
const UNCOUNTED_METHODS: &[&str] = &["events.stream"];

/// Whether a request to `path` (its route's template) with `http` is counted: the routes the method table
/// decides (a caller's requests), but not those open to everyone nor the agents' (each node speaks for itself).
fn counted(http: &axum::http::Method, path: &str) -> bool {
    static COUNTED: std::sync::OnceLock<HashMap<String, Vec<String>>> = std::sync::OnceLock::new();
    let routes = COUNTED.get_or_init(|| {
        let mut routes: HashMap<String, Vec<String>> = HashMap::new();
        for route in super::routes() {
            if route.method.is_some_and(|method| !UNCOUNTED_METHODS.contains(&method)) {
                routes.entry(route.path.clone()).or_default().push(route.http.clone());
            }
        }
        routes
    });
    routes.get(path).is_some_and(|methods| methods.iter().any(|m| m.eq_ignore_ascii_case(http.as_str())))
}

/// The requests in flight per bearer token. Tokens are kept as keyed hashes, never as text.
#[derive(Debug)]
pub struct InFlight {
    max: usize,
    hasher: RandomState,
    counts: Mutex<HashMap<u64, usize>>,
}

impl InFlight {
    pub fn new(max: usize) -> InFlight {
        InFlight { max: max.max(1), hasher: RandomState::new(), counts: Mutex::new(HashMap::new()) }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// A place for one more request of `token`, held until dropped; `None` when it has `max` in flight.
    fn enter(self: &Arc<Self>, token: &str) -> Option<Entered> {
        let key = self.hasher.hash_one(token);
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let count = counts.entry(key).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(Entered { in_flight: Arc::clone(self), key })
    }

    /// Tokens with a request in flight now (the map's size: it keeps no token whose requests are all answered).
    pub fn tokens(&self) -> usize {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

impl Default for InFlight {
    fn default() -> Self {
        InFlight::new(MAX_REQUESTS_PER_TOKEN)
    }
}

/// One request's place, given back when its answer is ready.
#[derive(Debug)]
struct Entered {
    in_flight: Arc<InFlight>,
    key: u64,
}

impl Drop for Entered {
    fn drop(&mut self) {
        let mut counts = self.in_flight.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = counts.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

/// The middleware that holds each routed request's place while its handler runs.
pub async fn limit_per_token(State(in_flight): State<Arc<InFlight>>, request: Request, next: Next) -> Response {
    let counted = request.extensions().get::<MatchedPath>().is_some_and(|p| counted(request.method(), p.as_str()));
    let token = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|token| counted && !token.is_empty());
    let Some(token) = token else {
        return next.run(request).await;
    };
    let Some(entered) = in_flight.enter(token) else {
        let max = in_flight.max();
        return ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "TOO_MANY_REQUESTS",
            format!(
                "this bearer token already has as many requests in flight as the server takes from one token at \
                 once ({max}): wait for their answers before sending more"
            ),
        )
        .with_details(json!({ "scope": "token", "limit": max }))
        .with_retry_after(1)
        .into_response();
    };
    let response = next.run(request).await;
    drop(entered);
    response
}
