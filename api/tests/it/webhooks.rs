//! Webhooks through the API and to a real HTTP receiver on 127.0.0.1: subscriptions refused by field and their
//! secrets sealed and shown once; deliveries signed (checked here with HMAC-SHA256 of our own, not the server's
//! code), in log order, only of the subscribing tenant; a failing receiver retried with backoff, a dead letter
//! that does not hold the next events back, and its replay; and a `serve` process SIGKILLed while a delivery
//! waits for its answer, whose successor delivers every event at least once, in order.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use bc_api::webhooks::WebhookConfig;
use bc_eventstore::lease::LeaseConfig;
use bc_eventstore::{Position, TxOptions, clock, sql};
use hmac::{Hmac, Mac as _};
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};

use crate::http_api::{AUTH, Api, ROOT};
use crate::process::{Server, auth_file, command};

/// Longest wait for something the deliverer must do.
const WAIT: Duration = Duration::from_secs(90);

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Received {
    path: String,
    id: String,
    timestamp: String,
    signature: String,
    body: Vec<u8>,
    at: Instant,
}

impl Received {
    fn event(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON event")
    }

    fn position(&self) -> Position {
        self.event()["position"].as_str().expect("position").parse().expect("a position")
    }

    /// Whether the signature verifies with `secret` (`whsec_<base64>`), done here the Standard Webhooks way:
    /// HMAC-SHA256 over `{id}.{timestamp}.{body}` keyed with the secret's decoded bytes, compared with each
    /// `v1,` entry.
    fn signed_by(&self, secret: &str) -> bool {
        let key = base64::engine::general_purpose::STANDARD
            .decode(secret.strip_prefix("whsec_").expect("whsec_ prefix"))
            .expect("base64");
        let mut mac = <Hmac<sha2::Sha256>>::new_from_slice(&key).expect("key");
        mac.update(format!("{}.{}.", self.id, self.timestamp).as_bytes());
        mac.update(&self.body);
        let expected = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        self.signature.split(' ').any(|entry| entry.strip_prefix("v1,") == Some(expected.as_str()))
    }
}

/// What the receiver answers.
#[derive(Debug, Default)]
struct Plan {
    /// Answer 503 to this many requests first.
    fail_next: usize,
    /// Answer 500 to everything.
    fail_always: bool,
    /// Hold the answer to the n-th request (1-based) until released.
    hold_at: Option<usize>,
}

#[derive(Clone)]
struct Receiver {
    got: Arc<Mutex<Vec<Received>>>,
    count: Arc<watch::Sender<usize>>,
    plan: Arc<Mutex<Plan>>,
    holding: Arc<Notify>,
    release: Arc<Notify>,
}

impl Receiver {
    /// Starts a receiver on 127.0.0.1 and answers its base URL.
    async fn start() -> (Receiver, String) {
        let receiver = Receiver {
            got: Arc::default(),
            count: Arc::new(watch::channel(0).0),
            plan: Arc::default(),
            holding: Arc::new(Notify::new()),
            release: Arc::new(Notify::new()),
        };
        let router = axum::Router::new().fallback(receive).with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        tokio::spawn(async move { axum::serve(listener, router).await });
        (receiver, url)
    }

    fn plan(&self) -> std::sync::MutexGuard<'_, Plan> {
        self.plan.lock().expect("plan")
    }

    fn got(&self) -> Vec<Received> {
        self.got.lock().expect("got").clone()
    }

    /// Waits until `done` holds of what was received.
    async fn until(&self, what: &str, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let mut count = self.count.subscribe();
        let waited = tokio::time::timeout(WAIT, async {
            loop {
                let got = self.got();
                if done(&got) {
                    return got;
                }
                let _ = count.changed().await;
            }
        })
        .await;
        waited.unwrap_or_else(|_| panic!("timed out waiting until {what}: got {:?}", self.got()))
    }
}

async fn receive(
    State(receiver): State<Receiver>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let received = Received {
        path: uri.path().to_owned(),
        id: header("webhook-id"),
        timestamp: header("webhook-timestamp"),
        signature: header("webhook-signature"),
        body: body.to_vec(),
        at: Instant::now(),
    };
    let n = {
        let mut got = receiver.got.lock().expect("got");
        got.push(received);
        got.len()
    };
    let (hold, status) = {
        let mut plan = receiver.plan();
        let status = if plan.fail_always {
            StatusCode::INTERNAL_SERVER_ERROR
        } else if plan.fail_next > 0 {
            plan.fail_next -= 1;
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::OK
        };
        (plan.hold_at == Some(n), status)
    };
    receiver.count.send_replace(n);
    if hold {
        receiver.holding.notify_one();
        receiver.release.notified().await;
    }
    status
}

/// The deliverer of these tests: quick retries, and a short poll.
fn quick() -> WebhookConfig {
    WebhookConfig {
        timeout: Duration::from_secs(10),
        attempts: 4,
        backoff: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        poll: Duration::from_millis(50),
        scan: Duration::from_millis(50),
        batch: 500,
        lease: LeaseConfig::SHARD,
    }
}

/// Runs the deliverer over the API's write side until the answer is dropped.
fn deliver(api: &Api) -> watch::Sender<bool> {
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(bc_api::webhooks::run(api.app().clone(), quick(), stopped));
    stop
}

/// Reads `path` until `done` holds of its body: the deliverer commits after the receiver answered.
async fn read_until(api: &Api, path: &str, token: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let read = api.get(path, token).await;
        assert_eq!(read.status, StatusCode::OK, "{path}: {:?}", read.body);
        if done(&read.body) {
            return read.body;
        }
        assert!(Instant::now() < deadline, "timed out reading {path}: {}", read.body);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Makes tenant `id` with an administrator, and answers the administrator's token.
async fn customer(api: &Api, id: &str) -> String {
    let made = api.post("/v1/tenants", ROOT, json!({ "tenantId": id, "name": format!("{id} inc.") })).await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
    let boss = api
        .post(&format!("/v1/tenants/{id}/identities"), ROOT, json!({ "name": format!("boss@{id}"), "admin": true }))
        .await;
    assert_eq!(boss.status, StatusCode::CREATED, "{:?}", boss.body);
    let identity = boss.body["id"].as_str().expect("identity id");
    let token = api.post(&format!("/v1/tenants/{id}/identities/{identity}/tokens"), ROOT, json!({})).await;
    assert_eq!(token.status, StatusCode::CREATED, "{:?}", token.body);
    token.body["token"].as_str().expect("a token").to_owned()
}

/// Subscribes `url` to `types` as `token`; answers the subscription's id and secret.
async fn subscribe(api: &Api, token: &str, url: &str, types: &[&str]) -> (String, String) {
    let made = api.post("/v1/webhooks", token, json!({ "url": url, "eventTypes": types })).await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
    let id = made.body["id"].as_str().expect("id").to_owned();
    (id, made.body["secret"].as_str().expect("secret").to_owned())
}

/// How many times `secret`'s text appears in the clear in the log, the sealed secrets or the kept answers.
async fn in_the_clear(api: &Api, secret: &str) -> i64 {
    let mut tx = api.fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let found: i64 = sql::query_scalar(
        "SELECT (SELECT count(*) FROM events WHERE position(convert_to($1, 'UTF8') in payload) > 0)
              + (SELECT count(*) FROM sealed_secrets WHERE position(convert_to($1, 'UTF8') in sealed) > 0)
              + (SELECT count(*) FROM idempotency_keys
                 WHERE position(convert_to($1, 'UTF8') in coalesce(answer, ''::bytea)) > 0)",
    )
    .bind(secret)
    .fetch_one(tx.conn())
    .await
    .expect("search");
    tx.commit().await.expect("commit");
    found
}

#[tokio::test]
async fn a_subscription_names_the_field_it_refuses_and_shows_its_sealed_secret_once() {
    let api = Api::with_pki().await;
    let boss = customer(&api, "initech").await;
    let before = api.events().await;
    for (body, field) in [
        (json!({ "url": "http://hooks.example.com/x", "eventTypes": ["webhook.*"] }), "url"),
        (json!({ "url": "hooks.example.com", "eventTypes": ["webhook.*"] }), "url"),
        (json!({ "url": "https://hooks.example.com", "eventTypes": [] }), "eventTypes"),
        (
            json!({ "url": "https://hooks.example.com", "eventTypes": ["pool.*", "reservation.plaecd"] }),
            "eventTypes[1]",
        ),
        (json!({ "url": "https://hooks.example.com", "eventTypes": ["nothing.*"] }), "eventTypes[0]"),
        (
            json!({ "url": "https://hooks.example.com", "eventTypes": ["pool.*"], "description": "\u{7}" }),
            "description",
        ),
    ] {
        let refused = api.post("/v1/webhooks", &boss, body.clone()).await;
        assert_eq!((refused.status, refused.field()), (StatusCode::BAD_REQUEST, field), "{body}: {:?}", refused.body);
    }
    assert_eq!(api.events().await, before, "a refusal writes nothing");

    let made = api
        .call(
            "POST",
            "/v1/webhooks",
            Some(&boss),
            &[("idempotency-key", "hook-1")],
            Some(
                json!({ "url": "https://hooks.example.com/bc", "eventTypes": ["reservation.*"], "description": "ops" })
                    .to_string(),
            ),
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
    let id = made.body["id"].as_str().expect("id").to_owned();
    assert!(id.starts_with("whk_"), "{id}");
    assert_eq!(made.header("location"), Some(format!("/v1/webhooks/{id}").as_str()));
    let secret = made.body["secret"].as_str().expect("secret").to_owned();
    let key = base64::engine::general_purpose::STANDARD.decode(&secret["whsec_".len()..]).expect("base64");
    assert_eq!(key.len(), 32, "{secret}");
    let again = api
        .call(
            "POST",
            "/v1/webhooks",
            Some(&boss),
            &[("idempotency-key", "hook-1")],
            Some(
                json!({ "url": "https://hooks.example.com/bc", "eventTypes": ["reservation.*"], "description": "ops" })
                    .to_string(),
            ),
        )
        .await;
    assert_eq!((again.status, &again.body["secret"]), (StatusCode::CREATED, &made.body["secret"]), "a retry");
    assert_eq!(in_the_clear(&api, &secret).await, 0, "sealed, in no event and no kept answer");

    let read = api.get(&format!("/v1/webhooks/{id}"), &boss).await;
    assert_eq!(read.status, StatusCode::OK, "{:?}", read.body);
    assert!(read.body.get("secret").is_none() && !read.body.to_string().contains(&secret), "{:?}", read.body);
    assert_eq!(read.body["eventTypes"], json!(["reservation.*"]));
    let listed = api.get("/v1/webhooks", &boss).await;
    assert_eq!(listed.body["items"].as_array().map(Vec::len), Some(1), "{:?}", listed.body);
    let other = customer(&api, "hooli").await;
    for (method, path) in [
        ("GET", format!("/v1/webhooks/{id}")),
        ("GET", format!("/v1/webhooks/{id}/deliveries")),
        ("DELETE", format!("/v1/webhooks/{id}")),
        ("POST", format!("/v1/webhooks/{id}/rotate-secret")),
        ("POST", format!("/v1/webhooks/{id}/dead-letters/replay")),
    ] {
        let answer = api.call(method, &path, Some(&other), &[], None).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{method} {path}: another tenant's: {:?}", answer.body);
    }
    assert_eq!(api.get("/v1/webhooks", &other).await.body["items"], json!([]));

    let rotated = api.call("POST", &format!("/v1/webhooks/{id}/rotate-secret"), Some(&boss), &[], None).await;
    assert_eq!(rotated.status, StatusCode::OK, "{:?}", rotated.body);
    let next = rotated.body["secret"].as_str().expect("new secret");
    assert!(next.starts_with("whsec_") && next != secret, "{next}");
    assert_eq!(in_the_clear(&api, next).await, 0);

    let deleted = api.call("DELETE", &format!("/v1/webhooks/{id}"), Some(&boss), &[], None).await;
    assert_eq!(deleted.status, StatusCode::OK, "{:?}", deleted.body);
    assert_eq!(api.get(&format!("/v1/webhooks/{id}"), &boss).await.status, StatusCode::NOT_FOUND);
    let mut tx = api.fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let kept: i64 = sql::query_scalar("SELECT count(*) FROM sealed_secrets WHERE owner_id = $1")
        .bind(&id)
        .fetch_one(tx.conn())
        .await
        .expect("count");
    tx.commit().await.expect("commit");
    assert_eq!(kept, 0, "its secret went with it");

    let bare = Api::new().await;
    let refused =
        bare.post("/v1/webhooks", ROOT, json!({ "url": "https://h.example", "eventTypes": ["pool.*"] })).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "no bundle, no sealed secret: {:?}", refused.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_are_signed_in_log_order_and_only_of_the_subscribing_tenant() {
    let api = Api::with_pki().await;
    let (receiver, url) = Receiver::start().await;
    let initech = customer(&api, "initech").await;
    let hooli = customer(&api, "hooli").await;
    let (hook, secret) = subscribe(&api, &initech, &format!("{url}/initech"), &["webhook.*"]).await;
    let (_, hooli_secret) = subscribe(&api, &hooli, &format!("{url}/hooli"), &["webhook.*"]).await;
    let _stop = deliver(&api);

    // initech's own changes, and hooli's between them.
    let quiet = format!("{url}/quiet");
    let (a, _) = subscribe(&api, &initech, &quiet, &["node.cordoned"]).await;
    let (hooli_hook, _) = subscribe(&api, &hooli, &quiet, &["node.cordoned"]).await;
    let (b, _) = subscribe(&api, &initech, &quiet, &["node.cordoned"]).await;
    let rotated = api.call("POST", &format!("/v1/webhooks/{a}/rotate-secret"), Some(&initech), &[], None).await;
    assert_eq!(rotated.status, StatusCode::OK, "{:?}", rotated.body);
    let deleted = api.call("DELETE", &format!("/v1/webhooks/{b}"), Some(&initech), &[], None).await;
    assert_eq!(deleted.status, StatusCode::OK, "{:?}", deleted.body);

    let got = receiver
        .until("initech's four events and hooli's one arrive", |got| {
            got.iter().filter(|r| r.path == "/initech").count() >= 4 && got.iter().any(|r| r.path == "/hooli")
        })
        .await;
    let initech_got: Vec<&Received> = got.iter().filter(|r| r.path == "/initech").collect();
    let seen: Vec<(String, String)> = initech_got
        .iter()
        .map(|r| {
            let event = r.event();
            (event["eventType"].as_str().unwrap_or("").to_owned(), event["streamId"].as_str().unwrap_or("").to_owned())
        })
        .collect();
    let expected = [
        ("webhook.created", a.as_str()),
        ("webhook.created", b.as_str()),
        ("webhook.secret_rotated", a.as_str()),
        ("webhook.deleted", b.as_str()),
    ];
    assert_eq!(seen, expected.map(|(t, s)| (t.to_owned(), s.to_owned())), "initech's own events, in order");
    for r in &initech_got {
        assert!(r.signed_by(&secret), "{r:?} verifies with the subscription's secret");
        assert!(!r.signed_by(&hooli_secret), "and with no other");
        assert_eq!(r.id, format!("evt_{}", r.position()), "the id is the event's");
        let age = r.timestamp.parse::<u64>().expect("seconds");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("now").as_secs();
        assert!(age.abs_diff(now) < 300, "a timestamp of now, in seconds: {age}");
        assert_eq!(r.event()["tenantId"], "initech");
    }
    let positions: Vec<Position> = initech_got.iter().map(|r| r.position()).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "in log order: {positions:?}");
    let hooli_got: Vec<&Received> = got.iter().filter(|r| r.path == "/hooli").collect();
    assert_eq!(hooli_got.len(), 1, "hooli's one event: {hooli_got:?}");
    assert_eq!(hooli_got[0].event()["streamId"], hooli_hook.as_str());
    assert!(hooli_got[0].signed_by(&hooli_secret));
    assert!(got.iter().all(|r| r.path != "/quiet"), "nobody cordoned a node");

    // The subscription counts what it delivered and moved its cursor past it.
    let read = read_until(&api, &format!("/v1/webhooks/{hook}"), &initech, |w| w["delivered"] == 4).await;
    assert_eq!(read["position"].as_str(), Some(positions[3].to_string().as_str()));
    let deliveries = api.get(&format!("/v1/webhooks/{hook}/deliveries"), &initech).await;
    let attempts = deliveries.body["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 4, "{:?}", deliveries.body);
    assert!(attempts.iter().all(|a| a["outcome"] == "delivered" && a["status"] == 200 && a["attempt"] == 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_receiver_is_retried_with_backoff_then_dead_lettered_without_blocking_and_replayed() {
    let api = Api::with_pki().await;
    let (receiver, url) = Receiver::start().await;
    let initech = customer(&api, "initech").await;
    let (hook, secret) = subscribe(&api, &initech, &url, &["webhook.created"]).await;
    let _stop = deliver(&api);
    let config = quick();
    let quiet = format!("{url}/quiet");

    // Two failures, then an acknowledgement: three attempts of one message, further apart each time.
    receiver.plan().fail_next = 2;
    let (first, _) = subscribe(&api, &initech, &quiet, &["node.cordoned"]).await;
    let got = receiver.until("the third attempt", |got| got.len() >= 3).await;
    assert!(got.iter().all(|r| r.id == got[0].id && r.signed_by(&secret)), "one message, signed each time");
    assert_eq!(got[0].event()["streamId"], first.as_str());
    assert!(got[1].at - got[0].at >= config.backoff, "backed off: {:?}", got[1].at - got[0].at);
    assert!(got[2].at - got[1].at >= config.backoff * 2, "backed off longer: {:?}", got[2].at - got[1].at);

    // Every attempt fails: the event becomes a dead letter, and the next event is delivered all the same.
    receiver.plan().fail_always = true;
    let (second, _) = subscribe(&api, &initech, &quiet, &["node.cordoned"]).await;
    receiver.until("four attempts of the second event", |got| got.len() >= 3 + 4).await;
    receiver.plan().fail_always = false;
    let (third, _) = subscribe(&api, &initech, &quiet, &["node.cordoned"]).await;
    let got = receiver.until("the third event", |got| got.len() >= 8).await;
    let streams: Vec<String> = got.iter().map(|r| r.event()["streamId"].as_str().unwrap_or("").to_owned()).collect();
    assert_eq!(streams[3..7], [second.clone(), second.clone(), second.clone(), second.clone()]);
    assert_eq!(streams[7], third);

    let deliveries = read_until(&api, &format!("/v1/webhooks/{hook}/deliveries"), &initech, |d| {
        d["attempts"].as_array().is_some_and(|a| a.len() == 8)
    })
    .await;
    let dead = deliveries["deadLetters"].as_array().expect("dead letters");
    assert_eq!(dead.len(), 1, "{deliveries:?}");
    assert_eq!((dead[0]["attempts"].as_i64(), dead[0]["queued"].as_bool()), (Some(4), Some(false)));
    assert_eq!(dead[0]["lastError"], "answered 500 Internal Server Error");
    let outcomes: Vec<(i64, String)> = deliveries["attempts"]
        .as_array()
        .expect("attempts")
        .iter()
        .rev()
        .map(|a| (a["attempt"].as_i64().unwrap_or(0), a["outcome"].as_str().unwrap_or("").to_owned()))
        .collect();
    let expected: Vec<(i64, String)> = [
        (1, "failed"),
        (2, "failed"),
        (3, "delivered"),
        (1, "failed"),
        (2, "failed"),
        (3, "failed"),
        (4, "dead"),
        (1, "delivered"),
    ]
    .iter()
    .map(|(n, o)| (*n, (*o).to_owned()))
    .collect();
    assert_eq!(outcomes, expected, "oldest first");
    assert_eq!(api.get(&format!("/v1/webhooks/{hook}"), &initech).await.body["deadLetters"], 1);

    // The replay sends the dead letter again, with its id, and it leaves the dead letters once acknowledged.
    let replayed =
        api.call("POST", &format!("/v1/webhooks/{hook}/dead-letters/replay"), Some(&initech), &[], None).await;
    assert_eq!((replayed.status, &replayed.body["queued"]), (StatusCode::OK, &json!(1)), "{:?}", replayed.body);
    let got = receiver.until("the replayed dead letter", |got| got.len() >= 9).await;
    assert_eq!(got[8].event()["streamId"], second.as_str());
    assert_eq!(got[8].id, got[3].id, "the same message id as its first attempts");
    assert!(got[8].signed_by(&secret));
    let read = read_until(&api, &format!("/v1/webhooks/{hook}"), &initech, |w| w["delivered"] == 3).await;
    assert_eq!(read["deadLetters"], 0, "{read:?}");
    let after = api.get(&format!("/v1/webhooks/{hook}/deliveries"), &initech).await;
    assert_eq!(after.body["deadLetters"], json!([]), "{:?}", after.body);
    let nothing =
        api.call("POST", &format!("/v1/webhooks/{hook}/dead-letters/replay"), Some(&initech), &[], None).await;
    assert_eq!((nothing.status, &nothing.body["queued"]), (StatusCode::OK, &json!(0)), "{:?}", nothing.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_serve_process_killed_mid_delivery_loses_nothing_its_successor_delivers_every_event_in_order() {
    // The real clock: the dead process's lease lapses as time passes.
    let api = Api::with_pki().await;
    clock::restore_system_clock(&api.fleet.t.db).await.expect("system clock");
    let (receiver, url) = Receiver::start().await;
    let (hook, secret) = subscribe(&api, ROOT, &url, &["site.created"]).await;
    const SITES: usize = 30;
    const HELD: usize = 10;
    receiver.plan().hold_at = Some(HELD);

    let auth = auth_file("webhooks-kill", AUTH);
    let start = || {
        let mut c = command(&["serve", "--no-migrate", "--listen", "127.0.0.1:0", "--role", "all"]);
        c.args(["--lease-ttl-ms", "2000", "--lease-renew-ms", "500", "--auth-config"]);
        c.arg(&auth).env("BETTER_COMPUTE_DATABASE_URL", api.fleet.t.url());
        tokio::task::block_in_place(|| Server::start(c))
    };
    let mut first = start();
    let client = first.client();
    let mut sites = Vec::new();
    for i in 0..SITES {
        let made = client
            .post(format!("{}/v1/sites", first.base_url))
            .bearer_auth(ROOT)
            .json(&json!({ "name": format!("s{i}"), "iamRegion": "eu-west-1" }))
            .send()
            .await
            .expect("create a site");
        assert_eq!(made.status(), StatusCode::CREATED);
        sites.push(made.json::<Value>().await.expect("json")["id"].as_str().expect("id").to_owned());
    }

    // The tenth delivery is in flight, its answer held: the process dies before it can commit anything more.
    tokio::time::timeout(WAIT, receiver.holding.notified()).await.expect("the held delivery");
    first.signal("KILL");
    tokio::task::block_in_place(|| first.wait());
    receiver.release.notify_one();
    let mut second = start();

    let got = receiver
        .until("every site arrives", |got| {
            let ids: std::collections::BTreeSet<String> =
                got.iter().map(|r| r.event()["streamId"].as_str().unwrap_or("").to_owned()).collect();
            sites.iter().all(|site| ids.contains(site))
        })
        .await;
    read_until(&api, &format!("/v1/webhooks/{hook}"), ROOT, |w| w["delivered"] == SITES).await;
    second.signal("TERM");
    tokio::task::block_in_place(|| second.wait());

    // At least once, in order: dropping the repeats leaves every site's event once, in log order.
    assert!(got.iter().all(|r| r.signed_by(&secret)), "every delivery verifies");
    let mut firsts: Vec<&Received> = Vec::new();
    for r in &got {
        if !firsts.iter().any(|seen| seen.id == r.id) {
            firsts.push(r);
        }
    }
    let delivered: Vec<String> =
        firsts.iter().map(|r| r.event()["streamId"].as_str().unwrap_or("").to_owned()).collect();
    assert_eq!(delivered, sites, "every site's event once, in the order they were made");
    let positions: Vec<Position> = firsts.iter().map(|r| r.position()).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "in log order: {positions:?}");
    let held = &got[HELD - 1];
    assert!(
        got[HELD..].iter().any(|r| r.id == held.id),
        "the delivery the process died in is sent again, with the same id: {:?}",
        got.iter().map(|r| &r.id).collect::<Vec<_>>()
    );
    // Nothing after the held one reached the receiver before the process died.
    assert_eq!(got[HELD].id, held.id, "the successor starts again at the unacknowledged delivery");
    let read = api.get(&format!("/v1/webhooks/{hook}"), ROOT).await;
    assert_eq!(read.body["delivered"], SITES, "each acknowledged once: {:?}", read.body);
}
