//! What a web page needs: stream tickets for an `EventSource` (which cannot send an `Authorization` header),
//! events it receives through `onmessage`, tickets that outlive a server restart, and CORS for the configured
//! origins only.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use bc_api::http::{AppState, router};
use bc_commands::auth::BuiltinAuthorizer;
use bc_eventstore::testing::TestDb;
use http_body_util::BodyExt as _;
use serde_json::{Value, json};
use tower::ServiceExt as _;

use crate::http_api::{ALICE, AUTH, Api, ROOT};

/// A request without an `Authorization` header, as a browser's `EventSource` sends it; the status and headers.
async fn bare(router: &axum::Router, method: &str, uri: &str, headers: &[(&str, &str)]) -> axum::http::Response<Body> {
    let mut request = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    router.clone().oneshot(request.body(Body::empty()).expect("request")).await.expect("response")
}

async fn ticket_for(api: &Api, token: &str) -> String {
    let issued = api.call("POST", "/v1/events/tickets", Some(token), &[], None).await;
    assert_eq!(issued.status, StatusCode::CREATED, "{:?}", issued.body);
    assert!(issued.body["expiresAt"].as_i64().is_some());
    issued.body["ticket"].as_str().expect("a ticket").to_owned()
}

#[tokio::test]
async fn a_stream_ticket_opens_the_event_stream_without_an_authorization_header() {
    let api = Api::new().await;
    let ticket = ticket_for(&api, ALICE).await;
    let open = bare(&api.router, "GET", &format!("/v1/events?ticket={ticket}&eventName=message"), &[]).await;
    assert_eq!(open.status(), StatusCode::OK);
    assert_eq!(open.headers()["content-type"], "text/event-stream");
    // A forged or altered ticket, or none, is refused.
    let mut forged = ticket.clone();
    let last = forged.pop().expect("a character");
    forged.push(if last == '0' { '1' } else { '0' });
    for uri in [format!("/v1/events?ticket={forged}"), "/v1/events?ticket=bst_zz".into(), "/v1/events".into()] {
        let refused = bare(&api.router, "GET", &uri, &[]).await;
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED, "{uri}");
    }
    let bad_name = bare(&api.router, "GET", &format!("/v1/events?ticket={ticket}&eventName=both"), &[]).await;
    assert_eq!(bad_name.status(), StatusCode::BAD_REQUEST);
    // A ticket speaks for its identity only while the identity is known.
    let made = api.post("/v1/tenants", ROOT, json!({ "tenantId": "pied", "name": "Pied Piper" })).await;
    assert_eq!(made.status, StatusCode::CREATED);
    let who = api.post("/v1/tenants/pied/identities", ROOT, json!({ "name": "r@pied" })).await;
    let id = who.body["id"].as_str().expect("id").to_owned();
    let token = api.post(&format!("/v1/tenants/pied/identities/{id}/tokens"), ROOT, json!({})).await;
    let theirs = ticket_for(&api, token.body["token"].as_str().expect("token")).await;
    assert_eq!(bare(&api.router, "GET", &format!("/v1/events?ticket={theirs}"), &[]).await.status(), StatusCode::OK);
    api.call("DELETE", &format!("/v1/tenants/pied/identities/{id}"), Some(ROOT), &[], None).await;
    let gone = bare(&api.router, "GET", &format!("/v1/events?ticket={theirs}"), &[]).await;
    assert_eq!(gone.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_page_receives_every_event_through_onmessage() {
    let t = TestDb::new().await;
    let auth = Arc::new(BuiltinAuthorizer::from_toml(AUTH).expect("auth"));
    let app = bc_commands::App::new(t.db.clone()).with_authorizer(auth);
    let state = AppState::new(app.clone()).expect("state");
    let router = router(state);
    let issued = router
        .clone()
        .oneshot(
            Request::post("/v1/events/tickets")
                .header("authorization", format!("Bearer {ROOT}"))
                .body(Body::empty())
                .expect("request"),
        )
        .await
        .expect("response");
    let body: Value =
        serde_json::from_slice(&issued.into_body().collect().await.expect("body").to_bytes()).expect("json");
    let ticket = body["ticket"].as_str().expect("ticket").to_owned();
    let response = bare(&router, "GET", &format!("/v1/events?ticket={ticket}&eventName=message"), &[]).await;
    assert_eq!(response.status(), StatusCode::OK);
    let caller = bc_commands::Caller::new("root".parse().expect("t"), "operator@platform".parse().expect("i"), "user");
    let create = bc_commands::fleet::CreateSite {
        name: "ams1".into(),
        iam_region: "eu-west-1".into(),
        kind: bc_domain::site::SiteKind::Shared,
    };
    app.create_site(&caller, create).await.expect("a site");
    // The first event arrives as an unnamed message: `id:` and `data:`, no `event:` line.
    let mut body = response.into_body();
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !text.contains("site.created") {
        let frame = tokio::time::timeout_at(deadline, body.frame()).await.expect("an event in time");
        let Some(Ok(frame)) = frame else { panic!("the stream ended: {text}") };
        if let Some(bytes) = frame.data_ref() {
            text.push_str(std::str::from_utf8(bytes).expect("utf-8"));
        }
    }
    let message = text.split("\n\n").find(|m| m.contains("site.created")).expect("the event");
    assert!(message.lines().any(|l| l.starts_with("id:")), "{message}");
    assert!(!message.lines().any(|l| l.starts_with("event:")), "unnamed, for onmessage: {message}");
}

#[tokio::test]
async fn a_ticket_signed_with_the_bundle_works_after_a_restart_and_nowhere_else() {
    let t = TestDb::new().await;
    let bundle = Arc::new(bc_pki::Bundle::load(crate::process::test_pki()).expect("bundle"));
    let app = |pki: bool| {
        let auth = Arc::new(BuiltinAuthorizer::from_toml(AUTH).expect("auth"));
        let app = bc_commands::App::new(t.db.clone()).with_authorizer(auth);
        if pki { app.with_pki(Arc::clone(&bundle)) } else { app }
    };
    let before = app(true);
    let call = before.authenticate(Some(ALICE), "req_1").await.expect("alice");
    let issued = before.issue_stream_ticket(&call);
    // A new process with the same bundle (the server restarted) takes it; one without the bundle does not.
    let after = app(true);
    assert_eq!(after.authenticate_ticket(&issued.ticket, "req_2").expect("taken").principal, call.principal);
    assert!(app(false).authenticate_ticket(&issued.ticket, "req_3").is_err());
}

#[tokio::test]
async fn cors_answers_the_configured_origins_only() {
    let t = TestDb::new().await;
    let auth = Arc::new(BuiltinAuthorizer::from_toml(AUTH).expect("auth"));
    let state = AppState::new(bc_commands::App::new(t.db.clone()).with_authorizer(auth)).expect("state");
    let allowed = "https://console.example.com";
    let configured = router(state.clone().with_cors(&[allowed.to_owned()]).expect("origins"));
    let preflight = |origin: &'static str| {
        [
            ("origin", origin),
            ("access-control-request-method", "POST"),
            ("access-control-request-headers", "authorization,content-type,idempotency-key"),
        ]
    };
    let ok = bare(&configured, "OPTIONS", "/v1/reservations", &preflight(allowed)).await;
    assert!(ok.status().is_success(), "{}", ok.status());
    assert_eq!(ok.headers()["access-control-allow-origin"], allowed);
    let methods = ok.headers()["access-control-allow-methods"].to_str().expect("text").to_owned();
    assert!(methods.contains("POST") && methods.contains("DELETE"), "{methods}");
    let answer = bare(&configured, "GET", "/v1/healthz", &[("origin", allowed)]).await;
    assert_eq!(answer.headers()["access-control-allow-origin"], allowed);
    assert!(answer.headers()["access-control-expose-headers"].to_str().expect("text").contains("x-position"));
    for (router, origin) in [(&configured, "https://evil.example"), (&router(state.clone()), allowed)] {
        let refused = bare(router, "OPTIONS", "/v1/reservations", &preflight(origin)).await;
        assert!(refused.headers().get("access-control-allow-origin").is_none(), "{origin}");
    }
    for bad in ["console.example.com", "https://*.example.com", "https://a.example/path", "ftp://x"] {
        assert!(state.clone().with_cors(&[bad.to_owned()]).is_err(), "{bad}");
    }
}

/// A child's standard output lines, read on a thread.
pub(crate) fn lines_of(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead as _;
    let stdout = child.stdout.take().expect("stdout");
    let (send, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

/// The browser driver's next line, which must be `wanted`.
fn expect_line(lines: &std::sync::mpsc::Receiver<String>, wanted: &str) {
    let line =
        lines.recv_timeout(Duration::from_secs(120)).unwrap_or_else(|_| panic!("the browser never said {wanted:?}"));
    assert_eq!(line, wanted, "the browser driver");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_in_headless_chromium_receives_events_and_resumes_after_the_server_restarts() {
    use std::io::Write as _;
    if !crate::hostile::slow_tests_enabled("chromium") {
        return;
    }
    // The page, from an origin of its own.
    let page = axum::Router::new()
        .route("/", axum::routing::get(|| async { axum::response::Html(include_str!("../browser/page.html")) }));
    let page_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let origin = format!("http://{}", page_listener.local_addr().expect("address"));
    tokio::spawn(async move { axum::serve(page_listener, page).await.expect("serve the page") });

    // The real service over TLS, allowing that origin, on a port it gets again after its restart.
    let t = TestDb::empty().await;
    let migrated =
        crate::process::command(&["migrate"]).env("BETTER_COMPUTE_DATABASE_URL", t.url()).output().expect("migrate");
    assert!(migrated.status.success(), "{}", String::from_utf8_lossy(&migrated.stderr));
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("address").port();
    let auth = crate::process::auth_file("browser", AUTH);
    let start = || {
        let listen = format!("127.0.0.1:{port}");
        let mut c = crate::process::command(&["serve", "--no-migrate", "--listen", &listen, "--cors-origin", &origin]);
        c.arg("--auth-config").arg(&auth).env("BETTER_COMPUTE_DATABASE_URL", t.url());
        crate::process::Server::start(c)
    };
    let mut server = start();
    let create_site = |server: &crate::process::Server, name: &str| {
        let request = server
            .client()
            .post(format!("{}/v1/sites", server.base_url))
            .bearer_auth(ROOT)
            .json(&json!({ "name": name, "iamRegion": "eu-west-1" }));
        async move { assert_eq!(request.send().await.expect("create a site").status().as_u16(), 201) }
    };

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/follow.py");
    let python = std::env::var("BETTER_COMPUTE_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let url = format!("{origin}/?api={}&token={ROOT}", server.base_url);
    let mut browser = std::process::Command::new(python)
        .args([script, &url])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the browser driver (pip install selenium; apt install chromium chromium-driver)");
    let lines = lines_of(&mut browser);
    let mut say = browser.stdin.take().expect("stdin");
    let mut tell = |line: &str| writeln!(say, "{line}").and_then(|()| say.flush()).expect("tell the browser driver");
    tokio::task::block_in_place(|| expect_line(&lines, "open"));

    create_site(&server, "page-first").await;
    tell("expect page-first");
    tokio::task::block_in_place(|| expect_line(&lines, "saw page-first"));

    // The server restarts; the page's EventSource reconnects on its own (the same ticket, Last-Event-ID) and
    // receives what happens next.
    server.signal("TERM");
    assert!(server.wait().success());
    let server = start();
    tell("reopened 2");
    tokio::task::block_in_place(|| expect_line(&lines, "reopened 2"));
    create_site(&server, "page-second").await;
    tell("expect page-second");
    tokio::task::block_in_place(|| expect_line(&lines, "saw page-second"));
    tell("quit");
    assert!(browser.wait().expect("the driver exits").success());
}
