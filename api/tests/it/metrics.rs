//! `/metrics`: the Prometheus text a scraper reads, with requests by route template, the work queue, the leases,
//! projection lag and the horizon, each checked against the database it describes.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use bc_domain::device::DeviceClass;
use bc_domain::pool::Sharing;
use bc_eventstore::{TxOptions, clock, lease, sql};
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

use crate::http_api::{Api, ROOT};
use bc_commands::testing::{T0, request};

/// The scrape's text.
pub(crate) async fn scrape(api: &Api) -> String {
    let request = Request::get("/metrics").body(Body::empty()).expect("request");
    let response = api.router.clone().oneshot(request).await.expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    let kind = response.headers()["content-type"].to_str().expect("text").to_owned();
    assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
    let bytes = response.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8(bytes.to_vec()).expect("utf-8")
}

/// The value of the sample `series` (its name and labels exactly as written).
pub(crate) fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn metrics_describe_requests_by_route_and_the_database_as_it_is() {
    let api = Api::new().await;
    let fleet = &api.fleet;
    let pool = fleet.pool("h100", Sharing::Exclusive, None).await;
    fleet.node(&pool, "a", 8, 0).await;
    // A reservation two hours out: its start is one key waiting in the work queue.
    let mut later = request(&pool, DeviceClass::Gpu, 1);
    later.start_ms = Some(T0 + 7_200_000);
    fleet.reserve(&fleet.owner, "later", later).await.expect("reserve");

    // Requests count under their route's template, never their ids.
    let reply = api.call("GET", &format!("/v1/sites/{}", fleet.site), Some(ROOT), &[], None).await;
    assert_eq!(reply.status, StatusCode::OK);
    let missing = api.call("GET", "/v1/pools/pool_01jd8w2k3m4n5p6q7r8s9t0v1w", Some(ROOT), &[], None).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    api.call("GET", "/nowhere", None, &[], None).await;
    // No projection daemon runs, and the clock moves on: the read models trail the log by every event, the
    // oldest of them recorded at T0.
    clock::set_sim_clock(&fleet.t.db, T0 + 10_000).await.expect("clock");
    let lease = lease::acquire(&fleet.t.db, "shard:3", lease::process_owner_id(), std::time::Duration::from_secs(60))
        .await
        .expect("acquire")
        .expect("free");
    // The reserve's hint changes have been written by the pool's writer of follow-ups.
    fleet.app.db().follow_ups_written().await;

    let text = scrape(&api).await;
    assert_eq!(
        sample(&text, r#"bc_http_requests_total{method="GET",route="/v1/sites/{site_id}",status="200"}"#),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, r#"bc_http_requests_total{method="GET",route="/v1/pools/{pool_id}",status="404"}"#),
        Some(1.0)
    );
    assert_eq!(sample(&text, r#"bc_http_requests_total{method="GET",route="unmatched",status="404"}"#), Some(1.0));
    assert!(!text.contains(fleet.site.as_str()), "no id becomes a label value");
    assert_eq!(
        sample(&text, r#"bc_http_request_duration_seconds_count{method="GET",route="/v1/sites/{site_id}"}"#),
        Some(1.0)
    );

    let mut tx = fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let (events, queued, due): (i64, i64, i64) = sql::query_as(
        "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM work_queue),
                (SELECT count(*) FROM work_queue WHERE not_before <= compute_now())",
    )
    .fetch_one(tx.conn())
    .await
    .expect("counts");
    tx.commit().await.expect("commit");
    assert!(queued >= 1);
    assert_eq!(sample(&text, "bc_events_appended_total"), Some(events as f64));
    assert_eq!(sample(&text, "bc_work_queue_depth"), Some(queued as f64));
    assert_eq!(sample(&text, "bc_work_queue_due_keys"), Some(due as f64));
    // No worker runs here to claim any.
    assert_eq!(sample(&text, "bc_work_queue_claimed_keys"), Some(0.0));
    for projection in bc_projections::models::read_models() {
        let (name, version) = (projection.name(), projection.version());
        if !["pools", "reservations", "audit_events"].contains(&name) {
            continue;
        }
        let labels = format!(r#"{{projection="{name}",version="{version}",active="false"}}"#);
        assert_eq!(sample(&text, &format!("bc_projection_lag_events{labels}")), Some(events as f64), "{name}");
        assert_eq!(sample(&text, &format!("bc_projection_lag_seconds{labels}")), Some(10.0), "{name}");
    }
    assert_eq!(sample(&text, r#"bc_leases_live{kind="shard",holder="this_process"}"#), Some(1.0));
    let max = fleet.t.db.connections().max;
    assert_eq!(sample(&text, "bc_db_pool_max_connections"), Some(f64::from(max)));
    assert!(sample(&text, r#"bc_db_pool_connections{state="busy"}"#).is_some());
    assert_eq!(sample(&text, r#"bc_db_pool_connections{state="max"}"#), None, "the limit is no state");
    assert_eq!(sample(&text, "bc_sse_subscribers"), Some(0.0));
    for reason in ["stream_version", "serialization", "deadlock", "exclusion"] {
        let retries = sample(&text, &format!(r#"bc_transaction_retries_total{{reason="{reason}"}}"#));
        assert!(retries.is_some(), "no bc_transaction_retries_total sample for {reason}");
    }
    let beats = bc_commands::heartbeat_batch_figures();
    assert!(sample(&text, "bc_heartbeats_written_total").is_some_and(|n| n <= beats.heartbeats as f64));
    assert!(sample(&text, "bc_heartbeat_transactions_total").is_some_and(|n| n <= beats.transactions as f64));
    assert!(sample(&text, "bc_heartbeat_transactions_failed_total").is_some());
    // The placements above moved the hints through the pool's writer of follow-ups.
    let follow_ups = fleet.app.db().follow_up_figures();
    let commits = sample(&text, "bc_hint_follow_up_commits_total").expect("follow-up commits");
    let writes = sample(&text, "bc_hint_follow_up_writes_total").expect("follow-up writes");
    assert!(commits >= 1.0 && commits <= follow_ups.commits as f64, "{commits} {follow_ups:?}");
    assert!(writes >= 1.0 && writes <= commits, "{writes} {commits}");
    assert_eq!(sample(&text, "bc_hint_follow_up_writes_failed_total"), Some(0.0));
    assert!(text.ends_with("# EOF\n"));
    lease::release(&fleet.t.db, &lease).await.expect("release");

    // A writing transaction left open holds the horizon back: the scrape sees it trail the transactions
    // committed since, and its age.
    let mut open = fleet.t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    sql::query("SELECT pg_current_xact_id()::text").execute(open.conn()).await.expect("a transaction id");
    fleet.node(&pool, "b", 8, 0).await;
    let text = scrape(&api).await;
    open.commit().await.expect("commit");
    let trailing = sample(&text, "bc_horizon_trailing_xids").expect("trailing xids");
    assert!(trailing >= 1.0, "the open transaction holds the horizon back: {trailing}");
    assert!(sample(&text, "bc_horizon_age_seconds").expect("age") >= 0.0);
}

/// One scrape through `address` on a connection of its own, as a scraper makes it.
async fn scrape_at(address: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(address).await.expect("connect");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: metrics\r\nConnection: close\r\n\r\n")
        .await
        .expect("send the request");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("read the answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    answer
}

/// Scrapes until `holds` is true of the scrape's text, and answers that text (within a minute).
pub(crate) async fn scrape_until(address: std::net::SocketAddr, what: &str, holds: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let text = scrape_at(address).await;
        if holds(&text) {
            return text;
        }
        assert!(std::time::Instant::now() < deadline, "{what} never showed in a scrape:\n{text}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_listener_reports_its_open_connections_its_limit_and_how_often_it_was_full() {
    use bc_api::tls::{Bound, ConnectionLimit, PlainListener};
    let t = bc_eventstore::testing::TestDb::new().await;
    let auth = std::sync::Arc::new(
        bc_commands::auth::BuiltinAuthorizer::from_toml(crate::http_api::AUTH).expect("auth config"),
    );
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = tcp.local_addr().expect("address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let listener = Bound::Plain(PlainListener::with_limit(tcp, ConnectionLimit::new(3)));
    let serving = tokio::spawn(bc_api::service::serve_on(t.db.clone(), auth, listener, async move {
        let _ = stopped.await;
    }));

    // Two clients connect and send nothing; a scrape takes the third and last place.
    let first = tokio::net::TcpStream::connect(address).await.expect("connect");
    let second = tokio::net::TcpStream::connect(address).await.expect("connect");
    let open = |n: f64| move |text: &str| sample(text, "bc_http_connections") == Some(n);
    let text = scrape_until(address, "three open connections and the limit reached", |text| {
        open(3.0)(text) && sample(text, "bc_http_connection_limit_reached_total").is_some_and(|n| n >= 1.0)
    })
    .await;
    assert_eq!(sample(&text, "bc_http_max_connections"), Some(3.0));

    // A client that goes gives its place back: the gauge falls to the second client and the scrape.
    drop(first);
    scrape_until(address, "two open connections", open(2.0)).await;

    drop(second);
    let _ = stop.send(());
    serving.await.expect("join").expect("serve");
}
