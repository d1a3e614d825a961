//! The cap on the requests one bearer token has in flight: past it the API answers `429 TOO_MANY_REQUESTS` at
//! once, while other tokens, and the same token's event streams, are served as before.

use axum::body::{Body, Bytes};
use axum::http::{Request, StatusCode};
use bc_api::http::{AppState, router};
use tower::ServiceExt as _;

use crate::http_api::{ALICE, Api, GUS};

#[tokio::test]
async fn a_token_past_its_requests_in_flight_is_answered_429_while_other_tokens_and_its_streams_are_served() {
    let mut api = Api::new().await;
    let state = AppState::new(api.app.clone()).expect("state").with_requests_per_token(1);
    let in_flight = std::sync::Arc::clone(&state.in_flight);
    api.router = router(state);

    // A reserve whose body has not arrived yet holds alice's one place.
    let (send, chunks) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    let chunks = futures_util::stream::unfold(chunks, |mut chunks| async move { Some((chunks.recv().await?, chunks)) });
    let request = Request::post("/v1/reservations")
        .header("authorization", format!("Bearer {ALICE}"))
        .header("content-type", "application/json")
        .header("idempotency-key", "held")
        .body(Body::from_stream(chunks))
        .expect("request");
    let held = tokio::spawn(api.router.clone().oneshot(request));
    while in_flight.tokens() == 0 {
        tokio::task::yield_now().await;
    }

    let refused = api.call("GET", "/v1/reservations", Some(ALICE), &[], None).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{}", refused.body);
    assert_eq!(refused.body["error"]["code"], "TOO_MANY_REQUESTS");
    assert_eq!(refused.body["error"]["details"]["scope"], "token");
    assert_eq!(refused.body["error"]["details"]["limit"], 1);
    assert_eq!(refused.header("retry-after"), Some("1"));

    // Another token is served, and so is alice's event stream, which has limits of its own.
    let other = api.call("GET", "/v1/reservations", Some(GUS), &[], None).await;
    assert_eq!(other.status, StatusCode::OK, "{}", other.body);
    let (stream, _) = api.status_of("GET", "/v1/events", ALICE).await;
    assert_eq!(stream, StatusCode::OK);

    // The held request's body arrives (without a pool: refused), and its place is given back with its answer.
    send.send(Ok(Bytes::from_static(b"{}"))).await.expect("send the body");
    drop(send);
    let answer = held.await.expect("join").expect("answer");
    assert_eq!(answer.status(), StatusCode::BAD_REQUEST);
    assert_eq!(in_flight.tokens(), 0, "no token is kept once its requests are answered");
    let again = api.call("GET", "/v1/reservations", Some(ALICE), &[], None).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
}
