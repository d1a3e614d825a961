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
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while in_flight.tokens() == 0 {
        assert!(std::time::Instant::now() < deadline, "the held reserve never took its place");
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

/// The status line and headers of what a raw connection was answered, once it is answered.
async fn answer_of(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt as _;
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buffer).await.expect("read the answer");
        assert!(n > 0, "the connection closed unanswered");
        answer.extend_from_slice(&buffer[..n]);
    }
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn the_client_waits_out_retry_after_and_sends_a_call_or_a_streamed_get_refused_as_too_many_again() {
    use bc_api::tls::{Bound, PlainListener};
    use tokio::io::AsyncWriteExt as _;
    let t = bc_eventstore::testing::TestDb::new().await;
    let auth =
        std::sync::Arc::new(bc_commands::auth::BuiltinAuthorizer::from_toml(crate::http_api::AUTH).expect("auth"));
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = tcp.local_addr().expect("address");
    let options = bc_api::service::ServeOptions { requests_per_token: 1, ..Default::default() };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(bc_api::service::serve_with(
        t.db.clone(),
        auth,
        Bound::Plain(PlainListener::new(tcp)),
        options,
        async move {
            let _ = stopped.await;
        },
    ));

    // A reserve whose two-byte body has not arrived yet holds alice's one place.
    let mut held = tokio::net::TcpStream::connect(address).await.expect("connect");
    let head = format!(
        "POST /v1/reservations HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer {ALICE}\r\n\
         Content-Type: application/json\r\nIdempotency-Key: held\r\nContent-Length: 2\r\n\r\n"
    );
    held.write_all(head.as_bytes()).await.expect("send the head");
    let client = bc_client::Client::new(&format!("http://{address}"), Some(ALICE.to_owned()), None).expect("client");
    let streamer = client.clone();
    let call = tokio::spawn(async move { client.get::<serde_json::Value>("/v1/reservations").await });
    let streamed = tokio::spawn(async move {
        let response = streamer.get_stream("/v1/pools", std::time::Duration::from_secs(30)).await?;
        Ok::<_, bc_client::Error>(response.bytes().await.expect("the streamed body"))
    });

    // Both calls are refused while the place is held (a scrape shows it), then the held request is answered;
    // the client, waiting out `Retry-After: 1`, sends each again and both are served.
    let refused = |route: &str| format!(r#"bc_http_requests_total{{method="GET",route="{route}",status="429"}}"#);
    let (listed, pools) = (refused("/v1/reservations"), refused("/v1/pools"));
    crate::metrics::scrape_until(address, "both calls refused", |text| {
        crate::metrics::sample(text, &listed).is_some_and(|n| n >= 1.0)
            && crate::metrics::sample(text, &pools).is_some_and(|n| n >= 1.0)
    })
    .await;
    held.write_all(b"{}").await.expect("send the body");
    assert!(answer_of(&mut held).await.starts_with("HTTP/1.1 400"), "the held reserve is answered");
    let page = call.await.expect("join").expect("the call is served once sent again");
    assert!(page["items"].is_array(), "{page}");
    let body = streamed.await.expect("join").expect("the streamed call is served once sent again");
    let pools: serde_json::Value = serde_json::from_slice(&body).expect("a page of pools");
    assert!(pools["items"].is_array(), "{pools}");

    drop(held);
    let _ = stop.send(());
    serving.await.expect("join").expect("serve");
}
