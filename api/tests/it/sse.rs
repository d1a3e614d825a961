//! `GET /v1/events`: over a real port, a subscriber that disconnects while writers append resumes with
//! `Last-Event-ID` and receives every event once, in order, and only its tenant's; a subscriber that falls a
//! whole buffer behind is cut off and can resume.

use std::sync::Arc;
use std::time::Duration;

use bc_api::http::events::{EventHub, EventsConfig, Filter, Item, subscription};
use bc_api::http::{AppState, router};
use bc_commands::auth::BuiltinAuthorizer;
use bc_eventstore::events::{self, AppendBatch, ExpectedVersion, NewEvent};
use bc_eventstore::testing::TestDb;
use bc_eventstore::{Db, Position, TxOptions};
use futures_util::StreamExt as _;
use tokio::sync::watch;

use crate::http_api::{ALICE, AUTH, GUS, ROOT};

async fn append(db: &Db, tenant: &str, event_type: &str, n: u64) -> Position {
    let event = NewEvent::encode(event_type, 1, &n, &bc_domain::event::EventMetadata::default()).expect("encode");
    let mut tx = db.begin(TxOptions::COMMAND).await.expect("begin");
    let stream = format!("sse-{tenant}");
    let batch = std::slice::from_ref(&event);
    let appended = events::append(
        &mut tx,
        AppendBatch { stream_id: &stream, tenant_id: Some(tenant), expected: ExpectedVersion::Any, events: batch },
    )
    .await
    .expect("append");
    tx.commit().await.expect("commit");
    appended.position
}

/// One SSE event: its id, type and data.
#[derive(Debug, Clone)]
struct Sse {
    id: Option<String>,
    event: Option<String>,
    data: String,
}

/// Reads SSE events from a streaming response until `wanted` says stop (or the stream ends).
async fn read_events(response: &mut reqwest::Response, buffer: &mut String, mut wanted: impl FnMut(&Sse) -> bool) {
    loop {
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let mut sse = Sse { id: None, event: None, data: String::new() };
            for line in block.lines() {
                if let Some(id) = line.strip_prefix("id: ").or_else(|| line.strip_prefix("id:")) {
                    sse.id = Some(id.to_owned());
                } else if let Some(event) = line.strip_prefix("event: ").or_else(|| line.strip_prefix("event:")) {
                    sse.event = Some(event.to_owned());
                } else if let Some(data) = line.strip_prefix("data: ").or_else(|| line.strip_prefix("data:")) {
                    sse.data.push_str(data);
                }
            }
            if (sse.id.is_some() || sse.event.is_some()) && !wanted(&sse) {
                return;
            }
        }
        let chunk = tokio::time::timeout(Duration::from_secs(60), response.chunk())
            .await
            .expect("the stream went quiet")
            .expect("read the stream");
        let Some(chunk) = chunk else { return };
        buffer.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
    }
}

/// The router of `state` on a real port: its base URL, the switch that stops it, and the server's task.
async fn serve(state: AppState) -> (String, watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("address"));
    let (stop, mut stopped) = watch::channel(false);
    let server = tokio::spawn(async move {
        axum::serve(listener, router(state))
            .with_graceful_shutdown(async move {
                let _ = stopped.changed().await;
            })
            .await
            .expect("serve");
    });
    (base, stop, server)
}

#[tokio::test]
async fn a_subscriber_resumes_with_last_event_id_and_gets_every_event_once_in_order() {
    let t = TestDb::new().await;
    let auth = Arc::new(BuiltinAuthorizer::from_toml(AUTH).expect("auth"));
    let config = EventsConfig { poll: Duration::from_millis(10), ..EventsConfig::default() };
    let state =
        AppState::with_events(bc_commands::App::new(t.db.clone()).with_authorizer(auth), config).expect("state");
    let (base, stop, server) = serve(state).await;

    // Writers append acme's events (numbered), noise of another type, and globex's events, all the time.
    const TOTAL: u64 = 120;
    let start = append(&t.db, "acme", "site.created", 0).await;
    let writer = {
        let db = t.db.clone();
        tokio::spawn(async move {
            for n in 1..TOTAL {
                append(&db, "acme", "site.created", n).await;
                append(&db, "acme", "pool.created", n).await;
                append(&db, "globex", "site.created", 1000 + n).await;
                tokio::task::yield_now().await;
            }
        })
    };

    let client = reqwest::Client::builder()
        .tls_backend_preconfigured(bc_pki::tls::plain_http_client_config().expect("tls"))
        .build()
        .expect("client");
    let mut received: Vec<u64> = Vec::new();
    let mut last_id = start.to_string();
    // The first connection starts before the first event (?after=) and drops a third of the way.
    let first_after = Position::START.to_string();
    let mut response = client
        .get(format!("{base}/v1/events?after={first_after}&types=site.created"))
        .bearer_auth(ALICE)
        .send()
        .await
        .expect("subscribe");
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut buffer = String::new();
    read_events(&mut response, &mut buffer, |sse| {
        let data: serde_json::Value = serde_json::from_str(&sse.data).expect("json");
        received.push(data["payload"].as_u64().expect("n"));
        last_id = sse.id.clone().expect("id");
        received.len() < (TOTAL / 3) as usize
    })
    .await;
    drop(response);

    // Writers go on while it is away; then it resumes where it left off.
    let mut attempts = 0;
    while received.len() < TOTAL as usize {
        attempts += 1;
        assert!(attempts < 10, "too many reconnections");
        let mut response = client
            .get(format!("{base}/v1/events?types=site.created"))
            .bearer_auth(ALICE)
            .header("last-event-id", &last_id)
            .send()
            .await
            .expect("resume");
        let mut buffer = String::new();
        read_events(&mut response, &mut buffer, |sse| {
            assert_eq!(sse.event.as_deref(), Some("site.created"), "{sse:?}");
            let data: serde_json::Value = serde_json::from_str(&sse.data).expect("json");
            assert_eq!(data["tenantId"], "acme", "only acme's events");
            received.push(data["payload"].as_u64().expect("n"));
            last_id = sse.id.clone().expect("id");
            received.len() < TOTAL as usize
        })
        .await;
    }
    writer.await.expect("writer");
    assert_eq!(received, (0..TOTAL).collect::<Vec<_>>(), "every event once, in order");

    // The platform sees every tenant's events; a bad position names the header.
    let mut root = client
        .get(format!("{base}/v1/events?after={first_after}&types=site.*,pool.*"))
        .bearer_auth(ROOT)
        .send()
        .await
        .expect("subscribe");
    let mut tenants = std::collections::BTreeSet::new();
    let mut seen = 0;
    let mut buffer = String::new();
    read_events(&mut root, &mut buffer, |sse| {
        let data: serde_json::Value = serde_json::from_str(&sse.data).expect("json");
        tenants.insert(data["tenantId"].as_str().expect("tenant").to_owned());
        seen += 1;
        seen < 3 * TOTAL - 2
    })
    .await;
    assert_eq!(tenants.into_iter().collect::<Vec<_>>(), vec!["acme".to_owned(), "globex".to_owned()]);
    let bad = client
        .get(format!("{base}/v1/events"))
        .bearer_auth(ALICE)
        .header("last-event-id", "yesterday")
        .send()
        .await
        .expect("request");
    assert_eq!(bad.status().as_u16(), 400);
    let body: serde_json::Value = bad.json().await.expect("json");
    assert_eq!(body["error"]["details"]["field"], "Last-Event-ID");
    // A position past the log's end was never handed out: resuming after it would skip events still to come.
    for (name, value) in [("last-event-id", "99-1-1"), ("after", "1-18446744073709551615-1")] {
        let request = if name == "after" {
            client.get(format!("{base}/v1/events?after={value}"))
        } else {
            client.get(format!("{base}/v1/events")).header(name, value)
        };
        let request = request.bearer_auth(ALICE);
        let ahead = request.send().await.expect("request");
        assert_eq!(ahead.status().as_u16(), 400, "{name}: {value}");
        let body: serde_json::Value = ahead.json().await.expect("json");
        assert_eq!(body["error"]["details"]["field"], if name == "after" { "after" } else { "Last-Event-ID" });
    }
    let unauthenticated = client.get(format!("{base}/v1/events")).send().await.expect("request");
    assert_eq!(unauthenticated.status().as_u16(), 401);

    let _ = stop.send(true);
    drop(root);
    server.await.expect("server");
}

#[tokio::test]
async fn a_subscriber_a_whole_buffer_behind_is_cut_off_and_resumes_without_losing_anything() {
    let t = TestDb::new().await;
    let config = EventsConfig { poll: Duration::from_millis(5), buffer: 4, ..EventsConfig::default() };
    let hub = Arc::new(EventHub::new(bc_commands::App::new(t.db.clone()), config));
    let filter = Filter { tenant: Some("acme".into()), ..Filter::default() };
    let first = append(&t.db, "acme", "site.created", 0).await;
    let slow = subscription(Arc::clone(&hub), Position::START, filter.clone());
    let mut slow = std::pin::pin!(slow);
    let got = slow.next().await.expect("the first event");
    assert!(matches!(got, Item::Event { position, .. } if position == first));

    // Twenty more events while the slow subscriber reads nothing; a prompt one keeps up meanwhile.
    let prompt = subscription(Arc::clone(&hub), first, filter.clone());
    let mut prompt = std::pin::pin!(prompt);
    let mut last = first;
    for n in 1..=20 {
        last = append(&t.db, "acme", "site.created", n).await;
        let item = tokio::time::timeout(Duration::from_secs(30), prompt.next()).await.expect("prompt").expect("item");
        assert!(matches!(item, Item::Event { position, .. } if position == last), "{item:?}");
    }
    while hub.published().is_none_or(|p| p < last) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // It may first get what lies between its catch-up and the hub's start from the log; then it is cut off,
    // told to resume after the last event it got.
    let mut seen = vec![first];
    let resume_after = loop {
        match slow.next().await.expect("an item") {
            Item::Event { position, .. } => seen.push(position),
            Item::CutOff { resume_after } => break resume_after,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(Some(&resume_after), seen.last(), "cut off, told where to resume");
    assert!(seen.len() < 21, "it was cut off before the end");
    assert!(slow.next().await.is_none(), "and the stream ends");

    // Resuming from there yields what it missed, once each, in order.
    let missing = 21 - seen.len();
    let resumed = subscription(Arc::clone(&hub), resume_after, filter);
    let positions: Vec<Position> = resumed
        .take(missing)
        .map(|item| match item {
            Item::Event { position, .. } => position,
            other => panic!("{other:?}"),
        })
        .collect()
        .await;
    seen.extend(positions);
    assert_eq!(seen.len(), 21);
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "every event once, in order");
    assert_eq!(seen.last(), Some(&last));
}

#[tokio::test]
async fn a_stream_without_a_position_gets_what_commits_after_its_response_began() {
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;

    let t = TestDb::new().await;
    append(&t.db, "acme", "test.before", 0).await;
    let auth = Arc::new(BuiltinAuthorizer::from_toml(AUTH).expect("auth"));
    let config = EventsConfig { poll: Duration::from_millis(10), ..EventsConfig::default() };
    let state =
        AppState::with_events(bc_commands::App::new(t.db.clone()).with_authorizer(auth), config).expect("state");
    let request = axum::http::Request::get("/v1/events")
        .header("authorization", format!("Bearer {ROOT}"))
        .body(axum::body::Body::empty())
        .expect("request");
    let response = router(state).oneshot(request).await.expect("response");
    assert_eq!(response.status(), axum::http::StatusCode::OK);
    // Committed after the response began but before its body is first read: the subscriber must still get it.
    // (It may get `test.before` first: the head is the log's horizon, which a transaction of another test's
    // database still open in the same cluster can hold below that event.)
    let after = append(&t.db, "acme", "test.after", 1).await;
    let mut body = response.into_body();
    let mut text = String::new();
    let read = async {
        while !text.contains("event: test.after") {
            let frame = body.frame().await.expect("a frame").expect("read the body");
            if let Ok(data) = frame.into_data() {
                text.push_str(std::str::from_utf8(&data).expect("utf-8"));
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("the event committed after the response began never came");
    assert!(text.contains(&format!("id: {after}\nevent: test.after")), "{text}");
}

#[tokio::test]
async fn the_hub_wakes_on_its_own_process_s_commits_without_waiting_for_its_poll() {
    let t = TestDb::new().await;
    // A poll so long that only the commit signal can deliver within the test.
    let config = EventsConfig { poll: Duration::from_secs(3600), ..EventsConfig::default() };
    let hub = Arc::new(EventHub::new(bc_commands::App::new(t.db.clone()), config));
    let filter = Filter { tenant: Some("acme".into()), ..Filter::default() };
    let first = append(&t.db, "acme", "site.created", 0).await;
    let follower = subscription(Arc::clone(&hub), Position::START, filter);
    let mut follower = std::pin::pin!(follower);
    let got = follower.next().await.expect("the first event");
    assert!(matches!(got, Item::Event { position, .. } if position == first));
    // The follower is parked inside its catch-up: start the hub here, where its catch-up ended.
    hub.start(first);
    for n in 1..=3 {
        // Through another handle of the same pool, as the service's commands are.
        let last = append(&t.db.clone(), "acme", "site.created", n).await;
        let item = tokio::time::timeout(Duration::from_secs(30), follower.next())
            .await
            .unwrap_or_else(|_| panic!("event {n}: the hub waited for its poll instead of waking on the commit"))
            .expect("item");
        assert!(matches!(item, Item::Event { position, .. } if position == last), "{item:?}");
    }
}

/// A second identity of acme, beside the identities of `AUTH`.
const BOB: &str = r#"
    [[identities]]
    identity = "bob@acme"
    tenant = "acme"
    token = "bob-token-000000000001"
"#;

#[tokio::test]
async fn streams_past_a_limit_are_refused_with_429_naming_it_and_a_closed_stream_frees_its_place() {
    use bc_api::http::events::StreamLimits;

    let t = TestDb::new().await;
    let auth = Arc::new(BuiltinAuthorizer::from_toml(&format!("{AUTH}{BOB}")).expect("auth"));
    // The heartbeat stays at its default (15 s): a stream's place must come back when its client goes, not at
    // the server's next write.
    let config = EventsConfig {
        poll: Duration::from_millis(10),
        limits: StreamLimits { process: 4, tenant: 3, identity: 2 },
        ..EventsConfig::default()
    };
    let state =
        AppState::with_events(bc_commands::App::new(t.db.clone()).with_authorizer(auth), config).expect("state");
    let hub = Arc::clone(&state.events);
    let (base, stop, server) = serve(state).await;
    let client = reqwest::Client::builder()
        .tls_backend_preconfigured(bc_pki::tls::plain_http_client_config().expect("tls"))
        .build()
        .expect("client");
    let open = |token: &'static str, query: &'static str| {
        let request = client.get(format!("{base}/v1/events{query}")).bearer_auth(token);
        async move { request.send().await.expect("send") }
    };
    let refused = |response: reqwest::Response, scope: &'static str, limit: u64| async move {
        assert_eq!(response.status(), reqwest::StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("5"));
        let body: serde_json::Value = response.json().await.expect("json");
        assert_eq!(body["error"]["code"], "TOO_MANY_STREAMS", "{body}");
        assert_eq!(body["error"]["details"]["scope"], scope, "{body}");
        assert_eq!(body["error"]["details"]["limit"], limit, "{body}");
        assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains(&format!("limit of {limit}"))), "{body}");
    };

    const BOB_TOKEN: &str = "bob-token-000000000001";
    let alice_1 = open(ALICE, "").await;
    let alice_2 = open(ALICE, "").await;
    assert_eq!((alice_1.status(), alice_2.status()), (reqwest::StatusCode::OK, reqwest::StatusCode::OK));
    refused(open(ALICE, "").await, "identity", 2).await;
    // Bad input is still answered for what it is, and takes no place.
    assert_eq!(open(ALICE, "?types=no.such.type").await.status(), reqwest::StatusCode::BAD_REQUEST);
    // Another identity of the same tenant gets the tenant's third place, not a fourth.
    let bob = open(BOB_TOKEN, "").await;
    assert_eq!(bob.status(), reqwest::StatusCode::OK);
    refused(open(BOB_TOKEN, "").await, "tenant", 3).await;
    // Another tenant gets the process's last place; then nobody gets one.
    let gus = open(GUS, "").await;
    assert_eq!(gus.status(), reqwest::StatusCode::OK);
    refused(open(ROOT, "").await, "process", 4).await;
    assert_eq!(hub.open_streams("acme"), (4, 3));

    // Alice's client goes away: her place comes back, and she gets a stream again.
    drop(alice_1);
    tokio::time::timeout(Duration::from_secs(10), async {
        while hub.open_streams("acme") != (3, 2) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the closed stream's place never came back");
    let alice_3 = open(ALICE, "").await;
    assert_eq!(alice_3.status(), reqwest::StatusCode::OK);
    refused(open(ALICE, "").await, "identity", 2).await;

    drop((alice_2, alice_3, bob, gus));
    let _ = stop.send(true);
    server.await.expect("server");
}

#[tokio::test]
async fn subscribers_catching_up_through_one_log_reader_each_get_every_event_once_in_order() {
    let t = TestDb::new().await;
    let mut last = Position::START;
    for n in 0..60 {
        last = append(&t.db, "acme", "site.created", n).await;
        append(&t.db, "globex", "site.created", n).await;
    }
    // One read of the log at a time for every subscriber, in batches of 7 events.
    let config = EventsConfig { poll: Duration::from_millis(10), batch: 7, log_readers: 1, ..EventsConfig::default() };
    let hub = Arc::new(EventHub::new(bc_commands::App::new(t.db.clone()), config));
    let followers = (0..6).map(|_| {
        let filter = Filter { tenant: Some("acme".into()), ..Filter::default() };
        let items = subscription(Arc::clone(&hub), Position::START, filter);
        async move {
            let mut items = std::pin::pin!(items);
            let mut seen = Vec::new();
            while seen.last() != Some(&last) {
                match items.next().await.expect("an item") {
                    Item::Event { position, .. } => seen.push(position),
                    other => panic!("{other:?}"),
                }
            }
            seen
        }
    });
    let all = tokio::time::timeout(Duration::from_secs(60), futures_util::future::join_all(followers))
        .await
        .expect("the subscribers did not all catch up");
    for seen in all {
        assert_eq!(seen.len(), 60);
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "every event once, in order");
    }
}

#[tokio::test]
async fn a_tenant_catches_up_through_the_audit_trail_as_far_as_it_has_passed_then_from_the_log() {
    let t = TestDb::new().await;
    let mut acme = Vec::new();
    let mut checkpoint = Position::START;
    for n in 0..30 {
        acme.push(append(&t.db, "acme", "sse.tested", n).await);
        checkpoint = append(&t.db, "globex", "sse.tested", n).await;
    }
    bc_projections::testing::catch_up(&t.db).await;
    for n in 30..45 {
        acme.push(append(&t.db, "acme", "sse.tested", n).await);
        append(&t.db, "globex", "sse.tested", n).await;
    }
    let app = bc_commands::App::new(t.db.clone());
    let positions = |read: &bc_commands::log::CatchUpRead| read.events.iter().map(|e| e.position).collect::<Vec<_>>();

    // Up to the audit trail's checkpoint, a read finds acme's events through its index: globex's are not read.
    let full = app.catch_up_after(Position::START, 7, Some("acme")).await.expect("read");
    assert_eq!(positions(&full), acme[..7]);
    assert_eq!((full.covered, full.more), (acme[6], true), "a full batch covers up to its last event");
    let short = app.catch_up_after(full.covered, 100, Some("acme")).await.expect("read");
    assert_eq!(positions(&short), acme[7..30]);
    assert!(short.events.iter().all(|e| e.tenant_id.as_deref() == Some("acme") && !e.payload.is_empty()));
    assert_eq!((short.covered, short.more), (checkpoint, true), "a short batch covers up to the checkpoint");

    // Past it, the log itself: globex's events come too, without their payloads, and a short read says there is no
    // more for now. Reads of the log stop at the horizon, which other tests' transactions on the same cluster can
    // hold back for a moment, so the rest may take more than one read.
    let mut from_log = Vec::new();
    let mut covered = short.covered;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while from_log.len() < 30 {
        assert!(tokio::time::Instant::now() < deadline, "the log past the checkpoint never came whole: {from_log:?}");
        let log = app.catch_up_after(covered, 100, Some("acme")).await.expect("read");
        assert!(log.events.iter().all(|e| (e.tenant_id.as_deref() == Some("acme")) != e.payload.is_empty()));
        assert_eq!(log.more, log.events.len() >= 100, "only a full read of the log says there may be more");
        covered = log.covered;
        from_log.extend(log.events.iter().map(|e| e.position));
        if log.events.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert_eq!(from_log.len(), 30, "each event once");
    assert_eq!(from_log.into_iter().filter(|p| acme.contains(p)).collect::<Vec<_>>(), acme[30..]);

    // A subscriber from the start, in batches of 7, gets acme's 45 events once each, in order, across the seam.
    let config = EventsConfig { poll: Duration::from_millis(10), batch: 7, ..EventsConfig::default() };
    let hub = Arc::new(EventHub::new(app, config));
    let filter = Filter { tenant: Some("acme".into()), ..Filter::default() };
    let mut items = std::pin::pin!(subscription(hub, Position::START, filter));
    let mut seen = Vec::new();
    while seen.len() < acme.len() {
        match tokio::time::timeout(Duration::from_secs(30), items.next()).await.expect("an item in time") {
            Some(Item::Event { position, .. }) => seen.push(position),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(seen, acme);
}
