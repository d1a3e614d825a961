//! The REST API called as a new client would, through the router in process: every route's success, each kind of
//! bad input with its 4xx and no write, tenant isolation, the attribute limit and its recorded denial, and reads
//! after a create.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use bc_api::http::{AppState, router};
use bc_commands::auth::BuiltinAuthorizer;
use bc_domain::pool::Sharing;
use bc_eventstore::{TxOptions, sql};
use http_body_util::BodyExt as _;
use serde_json::{Value, json};
use tower::ServiceExt as _;

use bc_commands::testing::{Fleet, HOUR, T0};
use bc_projections::testing::catch_up;

pub const ROOT: &str = "root-token-000000000001";
pub const ALICE: &str = "alice-token-00000000001";
pub const GUS: &str = "gus-token-0000000000001";
/// A tenant below acme.
pub const LAB: &str = "lab-token-0000000000001";

/// The authorizer of these tests: the platform's operator (the fleet's owner), two customers with the user
/// relation on what they are offered, and the limit "users may reserve up to 8 H100s for at most 72 hours".
pub const AUTH: &str = r#"
    [[tenants]]
    id = "acme"
    parent = "root"

    [[tenants]]
    id = "globex"
    parent = "root"

    [[tenants]]
    id = "acmelab"
    parent = "acme"

    [[identities]]
    identity = "operator@platform"
    tenant = "root"
    admin = true
    token = "root-token-000000000001"

    [[identities]]
    identity = "alice@acme"
    tenant = "acme"
    token = "alice-token-00000000001"

    [[identities]]
    identity = "gus@globex"
    tenant = "globex"
    token = "gus-token-0000000000001"

    [[identities]]
    identity = "lab@acmelab"
    tenant = "acmelab"
    token = "lab-token-0000000000001"

    [[grants]]
    tenant = "acme"
    relation = "user"

    [[grants]]
    tenant = "globex"
    relation = "user"

    [[limits]]
    relation = "user"
    gpu_model = "H100"
    max_gpus = 8
    max_hours = 72
"#;

/// An answer: status, headers and the JSON body (`null` when empty).
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The `details.field` of an error.
    pub fn field(&self) -> &str {
        self.body["error"]["details"]["field"].as_str().unwrap_or("")
    }
}

/// A fleet and the router over it.
pub struct Api {
    pub fleet: Fleet,
    pub router: Router,
    /// The write side the router serves (with its authorizer and bundle).
    pub app: bc_commands::App,
}

impl Api {
    pub async fn new() -> Api {
        Self::of(|app| app).await
    }

    /// With the tests' PKI bundle, whose key seals and derives the secrets the service must make again.
    pub async fn with_pki() -> Api {
        let bundle = Arc::new(bc_pki::Bundle::load(crate::process::test_pki()).expect("the tests' bundle"));
        Self::of(|app| app.with_pki(bundle)).await
    }

    /// With the tests' PKI bundle and `policy` for images.
    pub async fn with_images(policy: bc_commands::images::ImagePolicy) -> Api {
        let bundle = Arc::new(bc_pki::Bundle::load(crate::process::test_pki()).expect("the tests' bundle"));
        Self::of(|app| app.with_pki(bundle).with_image_policy(policy)).await
    }

    /// A call with a raw body, typed only as `headers` say; the answer's body is kept as bytes too (a JSON answer
    /// is still checked against the document).
    pub async fn call_raw(
        &self,
        method: &str,
        uri: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: Body,
    ) -> (Reply, Vec<u8>) {
        let mut request = Request::builder().method(method).uri(uri);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = self.router.clone().oneshot(request.body(body).expect("request")).await.expect("response");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.expect("body").to_bytes().to_vec();
        let json = headers.get("content-type").is_some_and(|t| t.as_bytes().starts_with(b"application/json"));
        let body = if json { serde_json::from_slice(&bytes).expect("a JSON body") } else { Value::Null };
        self.conforms(method, uri, status, &body).await;
        (Reply { status, headers, body }, bytes)
    }

    async fn of(configure: impl FnOnce(bc_commands::App) -> bc_commands::App) -> Api {
        let fleet = Fleet::new().await;
        let auth = Arc::new(BuiltinAuthorizer::from_toml(AUTH).expect("auth config"));
        let app = configure(bc_commands::App::new(fleet.t.db.clone()).with_authorizer(auth));
        // A listener's limit, as `serve` gives its state, so that scrapes carry the connection families too (the
        // router is called directly here: nothing is ever open under it).
        let state = AppState::new(app.clone())
            .expect("the method table checks out")
            .with_connection_limit(bc_api::tls::ConnectionLimit::default());
        Api { router: router(state), fleet, app }
    }

    /// The write side the router serves.
    pub fn app(&self) -> &bc_commands::App {
        &self.app
    }

    pub async fn call(
        &self,
        method: &str,
        uri: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<String>,
    ) -> Reply {
        let mut request = Request::builder().method(method).uri(uri);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if body.is_some() {
            request = request.header("content-type", "application/json");
        }
        let request = request.body(body.map_or_else(Body::empty, Body::from)).expect("request");
        let response = self.router.clone().oneshot(request).await.expect("response");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.expect("body").to_bytes();
        let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).expect("a JSON body") };
        self.conforms(method, uri, status, &body).await;
        Reply { status, headers, body }
    }

    /// Checks a served body against the schema the OpenAPI document gives its route and status: every JSON
    /// answer of every test that calls through here is validated.
    async fn conforms(&self, method: &str, uri: &str, status: StatusCode, body: &Value) {
        if uri.starts_with("/v1/openapi.json") || body.is_null() {
            return;
        }
        let doc = self.document().await;
        let path = uri.split('?').next().unwrap_or(uri);
        let Some((template, operation)) =
            doc["paths"].as_object().expect("paths").iter().find_map(|(template, item)| {
                let operation = item.get(method.to_ascii_lowercase())?;
                matches_template(template, path).then_some((template, operation))
            })
        else {
            assert!(
                status == StatusCode::NOT_FOUND || status == StatusCode::METHOD_NOT_ALLOWED,
                "{method} {uri} is not documented"
            );
            return;
        };
        let responses = &operation["responses"];
        let response = responses.get(status.as_str()).unwrap_or_else(|| {
            // The errors every route can answer are described once, as the common ones are.
            panic!("{method} {template} answered {status}, which its document does not list: {body}")
        });
        let schema = &response["content"]["application/json"]["schema"];
        assert!(!schema.is_null(), "{method} {template} {status}: no JSON schema");
        let root = json!({ "$ref": schema["$ref"].clone(), "components": doc["components"].clone() });
        let root = if schema.get("$ref").is_some() {
            root
        } else {
            json!({ "allOf": [schema], "components": doc["components"].clone() })
        };
        let validator = jsonschema::validator_for(&root).expect("the schema compiles");
        let errors: Vec<String> =
            validator.iter_errors(body).map(|e| format!("{} at {}", e, e.instance_path())).collect();
        assert!(errors.is_empty(), "{method} {template} {status}: the body breaks its schema: {errors:?}\n{body}");
    }

    /// The served OpenAPI document, read once.
    async fn document(&self) -> Value {
        let request = Request::builder().uri("/v1/openapi.json").body(Body::empty()).expect("request");
        let response = self.router.clone().oneshot(request).await.expect("response");
        let bytes = response.into_body().collect().await.expect("body").to_bytes();
        serde_json::from_slice(&bytes).expect("the document")
    }

    /// The status and error code of a call, without waiting for the body's end (an event stream has none).
    pub async fn status_of(&self, method: &str, uri: &str, token: &str) -> (StatusCode, Option<String>) {
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .header("authorization", format!("Bearer {token}"))
            .body(Body::empty())
            .expect("request");
        let response = self.router.clone().oneshot(request).await.expect("response");
        let status = response.status();
        if !status.is_client_error() {
            return (status, None);
        }
        let bytes = response.into_body().collect().await.expect("body").to_bytes();
        let body: Value = serde_json::from_slice(&bytes).expect("a JSON error");
        (status, body["error"]["message"].as_str().map(str::to_owned))
    }

    pub async fn get(&self, uri: &str, token: &str) -> Reply {
        self.call("GET", uri, Some(token), &[], None).await
    }

    pub async fn post(&self, uri: &str, token: &str, body: Value) -> Reply {
        self.call("POST", uri, Some(token), &[], Some(body.to_string())).await
    }

    /// `POST /v1/reservations` with an idempotency key.
    pub async fn reserve(&self, token: &str, key: &str, body: Value) -> Reply {
        self.call("POST", "/v1/reservations", Some(token), &[("idempotency-key", key)], Some(body.to_string())).await
    }

    /// Every event in the log: bad input must not add any.
    pub async fn events(&self) -> i64 {
        let mut tx = self.fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
        let n: i64 = sql::query_scalar("SELECT count(*) FROM events").fetch_one(tx.conn()).await.expect("count");
        tx.commit().await.expect("commit");
        n
    }

    /// Bookings of all reservations and quota rows: a denial must leave both alone.
    pub async fn bookings_and_charges(&self) -> (i64, i64) {
        let mut tx = self.fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
        let bookings: i64 = sql::query_scalar("SELECT count(*) FROM device_bookings WHERE NOT isempty(during)")
            .fetch_one(tx.conn())
            .await
            .expect("bookings");
        let charges: i64 =
            sql::query_scalar("SELECT count(*) FROM reservations WHERE state IN ('placed', 'binding', 'active')")
                .fetch_one(tx.conn())
                .await
                .expect("charges");
        tx.commit().await.expect("commit");
        (bookings, charges)
    }

    /// An exclusive H100 pool with two 8-GPU nodes, offered to acme and globex with 16 GPUs each.
    pub async fn pool(&self) -> String {
        let pool = self.fleet.pool("h100", Sharing::Exclusive, None).await;
        self.fleet.node(&pool, "a", 8, 0).await;
        self.fleet.node(&pool, "b", 8, 0).await;
        self.fleet.offer(&pool, "acme", 16).await;
        self.fleet.offer(&pool, "globex", 16).await;
        pool.to_string()
    }
}

/// Whether a concrete path is an instance of a template like `/v1/pools/{pool_id}`.
fn matches_template(template: &str, path: &str) -> bool {
    let (t, p): (Vec<&str>, Vec<&str>) = (template.split('/').collect(), path.split('/').collect());
    t.len() == p.len() && t.iter().zip(&p).all(|(t, p)| (t.starts_with('{') && !p.is_empty()) || t == p)
}

fn reservation(pool: &str, count: u32, duration_s: u64) -> Value {
    json!({ "poolId": pool, "devices": { "class": "gpu", "count": count }, "duration": duration_s })
}

#[tokio::test]
async fn every_route_answers_a_new_client() {
    let api = Api::new().await;
    // Fleet structure, as the platform's operator.
    let site = api.post("/v1/sites", ROOT, json!({ "name": "ams1", "iamRegion": "eu-west-1" })).await;
    assert_eq!(site.status, StatusCode::CREATED, "{:?}", site.body);
    assert!(site.header("x-request-id").is_some_and(|id| id.starts_with("req_")));
    assert!(site.header("x-position").is_some());
    let site_id = site.body["id"].as_str().expect("site id").to_owned();
    let project = api.post("/v1/projects", ALICE, json!({ "name": "training" })).await;
    assert_eq!(project.status, StatusCode::FORBIDDEN, "alice is no administrator: {:?}", project.body);
    let project = api.post("/v1/projects", ROOT, json!({ "name": "platform-tests" })).await;
    assert_eq!(project.status, StatusCode::CREATED, "{:?}", project.body);
    let pool = api
        .post(
            "/v1/pools",
            ROOT,
            json!({ "siteId": site_id, "name": "a100", "class": "metal-host", "gpuModel": "A100" }),
        )
        .await;
    assert_eq!(pool.status, StatusCode::CREATED, "{:?}", pool.body);
    let pool_id = pool.body["id"].as_str().expect("pool id").to_owned();
    assert_eq!(pool.header("location"), Some(format!("/v1/pools/{pool_id}").as_str()));
    let node = api
        .post(
            "/v1/nodes",
            ROOT,
            json!({ "poolId": pool_id, "name": "n1", "role": "host", "trust": "platform",
                    "gpus": [{ "uuid": "GPU-http-0", "name": "NVIDIA A100-SXM4-80GB", "memoryMib": 81920 },
                             { "uuid": "GPU-http-1", "name": "NVIDIA A100-SXM4-80GB", "memoryMib": 81920 }] }),
        )
        .await;
    assert_eq!(node.status, StatusCode::CREATED, "{:?}", node.body);
    let node_id = node.body["id"].as_str().expect("node id").to_owned();
    let offer = api
        .post(&format!("/v1/pools/{pool_id}/offers"), ROOT, json!({ "tenantId": "acme", "quota": { "gpu": 2 } }))
        .await;
    assert_eq!(offer.status, StatusCode::OK, "{:?}", offer.body);
    let quota = api
        .call(
            "PUT",
            &format!("/v1/pools/{pool_id}/offers/acme/quota"),
            Some(ROOT),
            &[],
            Some(json!({ "quota": { "gpu": 1 } }).to_string()),
        )
        .await;
    assert_eq!(quota.status, StatusCode::OK, "{:?}", quota.body);
    for verb in ["cordon", "uncordon", "maintenance/start", "maintenance/end"] {
        let done = api.call("POST", &format!("/v1/nodes/{node_id}/{verb}"), Some(ROOT), &[], None).await;
        assert_eq!(done.status, StatusCode::OK, "{verb}: {:?}", done.body);
    }
    let reasoned = api.post(&format!("/v1/nodes/{node_id}/cordon"), ROOT, json!({ "reason": "bad fan" })).await;
    assert_eq!(reasoned.status, StatusCode::OK);

    // Reads, once the read models have caught up.
    catch_up(&api.fleet.t.db).await;
    let pools = api.get("/v1/pools", ALICE).await;
    assert_eq!(pools.status, StatusCode::OK);
    assert_eq!(pools.body["items"].as_array().expect("items").len(), 1, "acme sees the pool offered to it");
    assert_eq!(pools.body["items"][0]["offers"].as_array().expect("offers").len(), 1, "only its own offer");
    assert_eq!(pools.body["items"][0]["offers"][0]["quota"]["gpu"], 1);
    assert_eq!(api.get(&format!("/v1/pools/{pool_id}"), ALICE).await.body["gpuModel"], "A100");
    let capacity = api.get(&format!("/v1/pools/{pool_id}/capacity"), ROOT).await;
    assert_eq!(capacity.status, StatusCode::OK);
    assert_eq!(capacity.body["items"][0]["allocatable"], 0, "the node is cordoned: {:?}", capacity.body);
    let nodes = api.get("/v1/nodes", ROOT).await;
    assert_eq!(nodes.body["items"][0]["cordoned"], true);
    assert_eq!(nodes.body["items"][0]["noScheduleReasons"], json!([]));
    let one = api.get(&format!("/v1/nodes/{node_id}"), ROOT).await;
    assert_eq!((one.status, &one.body["name"], &one.body["gpuCount"]), (StatusCode::OK, &json!("n1"), &json!(2)));
    let hidden = api.get(&format!("/v1/nodes/{node_id}"), ALICE).await;
    assert_eq!(
        hidden.status,
        StatusCode::NOT_FOUND,
        "a customer of the pool does not see its hosts: {:?}",
        hidden.body
    );
    let bad = api.get("/v1/nodes/node_nope", ROOT).await;
    assert_eq!((bad.status, &bad.body["error"]["details"]["field"]), (StatusCode::BAD_REQUEST, &json!("nodeId")));
    let sites = api.get("/v1/sites", ROOT).await;
    assert_eq!(sites.status, StatusCode::OK, "{:?}", sites.body);
    let listed = sites.body["items"].as_array().expect("items");
    let ams1 = listed.iter().find(|s| s["id"] == site_id.as_str()).expect("the new site is listed");
    assert_eq!(ams1["iamRegion"], "eu-west-1");
    assert_eq!(api.get("/v1/sites", ALICE).await.body["items"], json!([]), "acme owns no site");
    assert_eq!(api.get(&format!("/v1/sites/{site_id}"), ROOT).await.body["name"], "ams1");
    let other = api.get(&format!("/v1/sites/{site_id}"), ALICE).await;
    assert_eq!(other.status, StatusCode::NOT_FOUND, "another tenant's site: {:?}", other.body);
    let bad = api.get("/v1/sites/site_nope", ROOT).await;
    assert_eq!((bad.status, &bad.body["error"]["details"]["field"]), (StatusCode::BAD_REQUEST, &json!("siteId")));
    api.call("POST", &format!("/v1/nodes/{node_id}/uncordon"), Some(ROOT), &[], None).await;
    let earliest = api.get(&format!("/v1/pools/{pool_id}/availability?count=1&duration=3600"), ALICE).await;
    assert_eq!(earliest.status, StatusCode::OK, "{:?}", earliest.body);
    assert_eq!(earliest.body["earliestStart"], T0);
    let free = api.get(&format!("/v1/pools/{pool_id}/availability?start={T0}&end={}", T0 + HOUR), ALICE).await;
    assert_eq!(free.body["nodes"][0]["atoms"].as_array().expect("atoms").len(), 2);

    // A reservation's life: create (with a lease), get, list, renew, extend, release; another, cancelled.
    let mut body = reservation(&pool_id, 1, 3600);
    body["leaseSeconds"] = json!(600);
    let created = api.reserve(ALICE, "first", body.clone()).await;
    assert_eq!(created.status, StatusCode::CREATED, "{:?}", created.body);
    assert_eq!(created.body["state"], "placed");
    assert_eq!(created.body["request"]["duration"], 3600);
    let id = created.body["id"].as_str().expect("id").to_owned();
    assert_eq!(created.header("location"), Some(format!("/v1/reservations/{id}").as_str()));
    let again = api.reserve(ALICE, "first", body).await;
    assert_eq!(again.status, StatusCode::OK, "a retry answers the same reservation");
    assert_eq!(again.body["id"], id.as_str());
    assert_eq!(api.get(&format!("/v1/reservations/{id}"), ALICE).await.body["state"], "placed");
    let renewed = api.call("POST", &format!("/v1/reservations/{id}/renew"), Some(ALICE), &[], None).await;
    assert_eq!(renewed.status, StatusCode::OK, "{:?}", renewed.body);
    api.fleet.advance_to(T0 + 1_000).await;
    assert_eq!(api.get(&format!("/v1/reservations/{id}"), ALICE).await.body["state"], "active");
    let end = created.body["end"].as_i64().expect("end") + HOUR;
    let extended = api.post(&format!("/v1/reservations/{id}/extend"), ALICE, json!({ "end": end })).await;
    assert_eq!(extended.status, StatusCode::OK, "{:?}", extended.body);
    assert_eq!(extended.body["end"], end);
    let released = api.call("POST", &format!("/v1/reservations/{id}/release"), Some(ALICE), &[], None).await;
    assert_eq!(released.status, StatusCode::OK, "{:?}", released.body);
    let later = api.reserve(ALICE, "second", reservation(&pool_id, 1, 600)).await;
    let later_id = later.body["id"].as_str().expect("id").to_owned();
    let cancelled =
        api.post(&format!("/v1/reservations/{later_id}/cancel"), ALICE, json!({ "reason": "not needed" })).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{:?}", cancelled.body);
    assert_eq!(cancelled.body["state"], "cancelled");
    catch_up(&api.fleet.t.db).await;
    let listed = api.get("/v1/reservations?limit=1", ALICE).await;
    assert_eq!(listed.body["items"].as_array().expect("items").len(), 1);
    let cursor = listed.body["nextCursor"].as_str().expect("a second page");
    let next = api.get(&format!("/v1/reservations?limit=1&cursor={cursor}"), ALICE).await;
    assert_eq!(next.body["items"].as_array().expect("items").len(), 1);
    assert_eq!(next.body["nextCursor"], Value::Null);
    let mut both: Vec<String> =
        [&listed, &next].iter().map(|r| r.body["items"][0]["id"].as_str().expect("id").to_owned()).collect();
    both.sort();
    let mut expected = vec![id.clone(), later_id.clone()];
    expected.sort();
    assert_eq!(both, expected);
    assert_eq!(api.get("/v1/reservations?state=cancelled", ALICE).await.body["items"][0]["id"], later_id.as_str());
    let audit = api.get("/v1/audit", ALICE).await;
    let audit = audit.body["items"].as_array().expect("items").clone();
    assert!(audit.iter().any(|a| a["eventType"] == "reservation.requested"
        && a["identity"] == "alice@acme"
        && a["sessionKind"] == "user"
        && a["requestId"].as_str().is_some_and(|r| r.starts_with("req_"))));
    assert!(audit.iter().all(|a| a["tenantId"] == "acme"), "acme's trail only");
    let status = api.get("/v1/projections", ROOT).await;
    assert_eq!(status.status, StatusCode::OK);
    assert_eq!(api.get("/v1/healthz", ROOT).await.status, StatusCode::OK);
}

/// A bad request: method, path, headers, body, the status and the field its error must name.
type BadInput<'a> = (&'a str, String, Vec<(&'a str, &'a str)>, Option<String>, StatusCode, &'a str);

#[tokio::test]
async fn bad_input_is_a_4xx_naming_what_is_wrong_and_writes_nothing() {
    let api = Api::new().await;
    let pool = api.pool().await;
    let good = api.reserve(ALICE, "exists", reservation(&pool, 1, 3600)).await;
    let id = good.body["id"].as_str().expect("id").to_owned();
    let before = api.events().await;
    let big = "x".repeat(70 * 1024);
    let cases: Vec<BadInput> = vec![
        ("POST", "/v1/reservations".into(), vec![("idempotency-key", "k")], Some("{".into()), StatusCode::BAD_REQUEST, "body"),
        // A body must say it is JSON.
        ("POST", "/v1/reservations".into(), vec![("idempotency-key", "k"), ("content-type", "text/plain")],
            Some(reservation(&pool, 1, 60).to_string()), StatusCode::UNSUPPORTED_MEDIA_TYPE, "content-type"),
        ("POST", "/v1/sites".into(), vec![("content-type", "application/x-www-form-urlencoded")],
            Some(json!({ "name": "form", "iamRegion": "eu-central-1", "kind": "shared" }).to_string()),
            StatusCode::UNSUPPORTED_MEDIA_TYPE, "content-type"),
        ("POST", "/v1/reservations".into(), vec![("idempotency-key", "k")], Some(String::new()), StatusCode::BAD_REQUEST, "body"),
        // A struct's fields as an array, which serde alone would read (found by schemathesis).
        ("POST", "/v1/sites".into(), vec![("idempotency-key", "k")], Some(r#"["x", "eu-central-1", "shared"]"#.into()), StatusCode::BAD_REQUEST, "body"),
        ("POST", "/v1/reservations".into(), vec![("idempotency-key", "k")], Some("  [1]".into()), StatusCode::BAD_REQUEST, "body"),
        ("POST", "/v1/reservations".into(), vec![], Some(reservation(&pool, 1, 60).to_string()), StatusCode::BAD_REQUEST, "Idempotency-Key"),
        ("POST", "/v1/reservations".into(), vec![("idempotency-key", "k")],
            Some(json!({ "poolId": pool, "devices": { "class": "gpu", "count": "two" }, "duration": 60 }).to_string()),
            StatusCode::BAD_REQUEST, "devices.count"),
        ("POST", "/v1/reservations".into(), vec![("idempotency-key", "k")],
            Some(json!({ "poolId": pool, "devices": { "class": "gpu", "count": 1 }, "duration": 60, "colour": "red" }).to_string()),
            StatusCode::BAD_REQUEST, "colour"),
        ("POST", "/v1/reservations".into(), vec![("idempotency-key", "k")],
            Some(json!({ "poolId": pool, "devices": { "class": "gpu", "count": 1 } }).to_string()),
            StatusCode::BAD_REQUEST, "duration"),
        ("POST", "/v1/reservations".into(), vec![("idempotency-key", "k")],
            Some(json!({ "poolId": "pool_nope", "devices": { "class": "gpu", "count": 1 }, "duration": 60 }).to_string()),
            StatusCode::BAD_REQUEST, "poolId"),
        ("POST", "/v1/reservations".into(), vec![("idempotency-key", "k")],
            Some(json!({ "poolId": pool, "devices": { "class": "gpu", "count": 0 }, "duration": 60 }).to_string()),
            StatusCode::BAD_REQUEST, "devices.count"),
        // A NUL in a selector reached the placement read's parameters (found by schemathesis).
        ("POST", "/v1/reservations".into(), vec![("idempotency-key", "k")],
            Some(json!({ "poolId": pool, "devices": { "class": "gpu", "count": 1, "selector": { "gpuModel": "H\u{0}" } }, "duration": 60 }).to_string()),
            StatusCode::BAD_REQUEST, "devices.selector.gpuModel"),
        ("POST", "/v1/reservations".into(), vec![("idempotency-key", "k")],
            Some(json!({ "poolId": pool, "devices": { "class": "gpu", "count": 1, "selector": { "attributes": { "rack": "a\u{0}" } } }, "duration": 60 }).to_string()),
            StatusCode::BAD_REQUEST, "devices.selector.attributes.rack"),
        ("POST", "/v1/reservations".into(), vec![("idempotency-key", "k")],
            Some(json!({ "poolId": pool, "devices": { "class": "gpu", "count": 1, "topology": { "kind": "same-node", "colour": [] } }, "duration": 60 }).to_string()),
            StatusCode::BAD_REQUEST, "devices.topology.colour"),
        ("POST", "/v1/reservations".into(), vec![("idempotency-key", "k")],
            Some(json!({ "poolId": pool, "devices": { "class": "gpu", "count": 2, "topology": { "kind": "same-node", "nodes": 2 } }, "duration": 60 }).to_string()),
            StatusCode::BAD_REQUEST, "devices.topology"),
        ("POST", "/v1/reservations".into(), vec![("idempotency-key", "k")],
            Some(json!({ "poolId": pool, "devices": { "class": "gpu", "count": 1 }, "duration": 60, "spot": true }).to_string()),
            StatusCode::BAD_REQUEST, "spot"),
        ("POST", "/v1/reservations".into(), vec![("idempotency-key", "k")],
            Some(json!({ "poolId": pool, "devices": { "class": "gpu", "count": 1 }, "duration": 60, "note": big }).to_string()),
            StatusCode::PAYLOAD_TOO_LARGE, "body"),
        ("GET", "/v1/reservations/not-an-id".into(), vec![], None, StatusCode::BAD_REQUEST, "reservationId"),
        ("GET", "/v1/reservations?after=1-2".into(), vec![], None, StatusCode::BAD_REQUEST, "after"),
        ("GET", "/v1/reservations?limit=0".into(), vec![], None, StatusCode::BAD_REQUEST, "limit"),
        ("GET", "/v1/reservations?limit=ten".into(), vec![], None, StatusCode::BAD_REQUEST, "limit"),
        ("GET", "/v1/reservations?cursor=nope".into(), vec![], None, StatusCode::BAD_REQUEST, "cursor"),
        ("GET", "/v1/reservations?state=sleeping".into(), vec![], None, StatusCode::BAD_REQUEST, "state"),
        // A misspelled event type would match nothing: it is refused, not silently streamed as nothing.
        ("GET", "/v1/events?types=reservation.plaecd".into(), vec![], None, StatusCode::BAD_REQUEST, "types"),
        ("GET", "/v1/events?types=nothing.*".into(), vec![], None, StatusCode::BAD_REQUEST, "types"),
        ("GET", "/v1/events?types=reserv*".into(), vec![], None, StatusCode::BAD_REQUEST, "types"),
        ("GET", "/v1/reservations?colour=red".into(), vec![], None, StatusCode::BAD_REQUEST, "colour"),
        ("POST", format!("/v1/reservations/{id}/extend"), vec![], Some("{}".into()), StatusCode::BAD_REQUEST, "end"),
        ("POST", format!("/v1/reservations/{id}/cancel"), vec![], Some(r#"{"why": 1}"#.into()), StatusCode::BAD_REQUEST, "why"),
        // No body or query may carry a NUL character: PostgreSQL holds none, whatever the endpoint does with it.
        ("POST", format!("/v1/reservations/{id}/cancel"), vec![], Some(json!({ "reason": "a\u{0}" }).to_string()), StatusCode::BAD_REQUEST, "reason"),
        ("DELETE", "/v1/nodes/node_01m8q000000000000000000000?reason=a%00".into(), vec![], None, StatusCode::BAD_REQUEST, "reason"),
        ("POST", "/v1/sites".into(), vec![], Some(json!({ "name": "x", "iamRegion": "Not A Region" }).to_string()), StatusCode::BAD_REQUEST, "iamRegion"),
        ("POST", "/v1/sites".into(), vec![], Some(json!({ "name": "x" }).to_string()), StatusCode::BAD_REQUEST, "iamRegion"),
        // PostgreSQL refuses a NUL in text: a name is checked before any query reads with it (found by schemathesis).
        ("POST", "/v1/sites".into(), vec![], Some(json!({ "name": "a\u{0}b", "iamRegion": "eu-central-1" }).to_string()), StatusCode::BAD_REQUEST, "name"),
        ("POST", "/v1/projects".into(), vec![], Some(json!({ "name": "a\u{0}b" }).to_string()), StatusCode::BAD_REQUEST, "name"),
        ("POST", "/v1/pools".into(), vec![], Some(json!({ "siteId": api.fleet.site, "name": "a\u{0}b", "class": "metal-host", "gpuModel": "H100" }).to_string()), StatusCode::BAD_REQUEST, "name"),
        ("POST", "/v1/nodes".into(), vec![], Some(json!({ "poolId": pool, "name": "a\u{0}b", "role": "host", "trust": "platform", "gpus": [] }).to_string()), StatusCode::BAD_REQUEST, "name"),
        ("POST", "/v1/pools".into(), vec![], Some(json!({ "siteId": "site_x", "name": "p", "class": "metal-host", "gpuModel": "H100" }).to_string()), StatusCode::BAD_REQUEST, "siteId"),
        ("POST", "/v1/pools".into(), vec![], Some(json!({ "siteId": api.fleet.site, "name": "p", "class": "spaceship", "gpuModel": "H100" }).to_string()), StatusCode::BAD_REQUEST, "class"),
        ("POST", format!("/v1/pools/{pool}/offers"), vec![], Some(json!({ "tenantId": "acme", "quota": { "gpu": -1 } }).to_string()), StatusCode::BAD_REQUEST, "quota.gpu"),
        ("PUT", format!("/v1/pools/{pool}/offers/has%20space/quota"), vec![], Some(json!({ "quota": {} }).to_string()), StatusCode::BAD_REQUEST, "tenantId"),
        ("POST", "/v1/nodes".into(), vec![], Some(json!({ "poolId": pool, "name": "n", "role": "host", "trust": "platform", "gpus": [{ "uuid": "", "name": "x" }] }).to_string()), StatusCode::BAD_REQUEST, "gpus[0].uuid"),
        ("POST", "/v1/nodes/node_nope/cordon".into(), vec![], None, StatusCode::BAD_REQUEST, "nodeId"),
        // A field the kind does not have is refused, never dropped.
        ("POST", "/v1/nodes/node_01m8q000000000000000000000/commands".into(), vec![],
            Some(json!({ "kind": "refresh-inventory", "note": "dropped?" }).to_string()), StatusCode::BAD_REQUEST, "note"),
        ("GET", format!("/v1/pools/{pool}/availability?count=1"), vec![], None, StatusCode::BAD_REQUEST, "count"),
        ("GET", "/v1/audit?cursor=%25%25".into(), vec![], None, StatusCode::BAD_REQUEST, "cursor"),
        // A duration past i64's range is too long, never wrapped into a short one (nor an overflow).
        ("POST", "/v1/reservations".into(), vec![("idempotency-key", "huge")],
            Some(json!({ "poolId": pool, "devices": { "class": "gpu", "count": 1 }, "duration": u64::MAX }).to_string()),
            StatusCode::BAD_REQUEST, "duration"),
        ("POST", "/v1/reservations".into(), vec![("idempotency-key", "lease")],
            Some(json!({ "poolId": pool, "devices": { "class": "gpu", "count": 1 }, "duration": 60, "leaseSeconds": u64::MAX }).to_string()),
            StatusCode::BAD_REQUEST, "leaseSeconds"),
    ];
    for (method, uri, headers, body, status, field) in cases {
        let token = if ["/v1/sites", "/v1/pools", "/v1/nodes", "/v1/projects"].iter().any(|p| uri.starts_with(p)) {
            ROOT
        } else {
            ALICE
        };
        let reply = api.call(method, &uri, Some(token), &headers, body).await;
        assert_eq!(reply.status, status, "{method} {uri}: {:?}", reply.body);
        assert_eq!(reply.field(), field, "{method} {uri}: {:?}", reply.body);
        let code =
            if status == StatusCode::UNSUPPORTED_MEDIA_TYPE { "UNSUPPORTED_MEDIA_TYPE" } else { "INVALID_ARGUMENT" };
        assert_eq!(reply.body["error"]["code"], code, "{method} {uri}");
        assert!(reply.header("x-request-id").is_some(), "{method} {uri}: errors carry the request id too");
    }
    assert_eq!(api.events().await, before, "no bad input wrote anything");

    let reused = api.reserve(ALICE, "exists", reservation(&pool, 2, 3600)).await;
    assert_eq!(
        (reused.status, reused.body["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("IDEMPOTENCY_KEY_REUSED"))
    );
    let unauthenticated = api.call("GET", "/v1/pools", None, &[], None).await;
    assert_eq!(unauthenticated.status, StatusCode::UNAUTHORIZED);
    assert_eq!(unauthenticated.body["error"]["code"], "UNAUTHENTICATED");
    assert_eq!(unauthenticated.header("www-authenticate"), Some("Bearer"));
    let unknown = api.call("GET", "/v1/pools", Some("not-a-token-at-all-000"), &[], None).await;
    assert_eq!(unknown.status, StatusCode::UNAUTHORIZED);
    let nowhere = api.get("/v1/nowhere", ALICE).await;
    assert_eq!(nowhere.status, StatusCode::NOT_FOUND);
    let wrong_method = api.call("DELETE", "/v1/pools", Some(ROOT), &[], None).await;
    assert_eq!(wrong_method.status, StatusCode::METHOD_NOT_ALLOWED);
    let echoed = api.call("GET", "/v1/healthz", None, &[("x-request-id", "trace-42")], None).await;
    assert_eq!(echoed.header("x-request-id"), Some("trace-42"), "a client's request id comes back");
    assert_eq!(api.events().await, before);
}

#[tokio::test]
async fn another_tenant_can_neither_read_nor_act_on_a_reservation_and_learns_nothing() {
    let api = Api::new().await;
    let pool = api.pool().await;
    let mine = api.reserve(ALICE, "mine", reservation(&pool, 1, 3600)).await;
    let id = mine.body["id"].as_str().expect("id").to_owned();
    let missing = "rsv_".to_owned() + &"a".repeat(52);
    catch_up(&api.fleet.t.db).await;
    let before = api.events().await;
    for (method, verb) in [("GET", ""), ("POST", "/renew"), ("POST", "/cancel"), ("POST", "/release")] {
        let theirs = api.call(method, &format!("/v1/reservations/{id}{verb}"), Some(GUS), &[], None).await;
        let nobody = api.call(method, &format!("/v1/reservations/{missing}{verb}"), Some(GUS), &[], None).await;
        assert_eq!(theirs.status, StatusCode::NOT_FOUND, "{method} {verb}");
        assert_eq!(theirs.body["error"]["code"], nobody.body["error"]["code"]);
        assert_eq!(
            theirs.body["error"]["message"].as_str().map(|m| m.replace(&id, "ID")),
            nobody.body["error"]["message"].as_str().map(|m| m.replace(&missing, "ID")),
            "the answer is the same as for a reservation that does not exist"
        );
    }
    let extend = api.post(&format!("/v1/reservations/{id}/extend"), GUS, json!({ "end": T0 + 5 * HOUR })).await;
    assert_eq!(extend.status, StatusCode::NOT_FOUND);
    assert_eq!(api.events().await, before, "nothing was written for globex");
    let listed = api.get("/v1/reservations", GUS).await;
    assert_eq!(listed.body["items"], json!([]));
    let audit = api.get("/v1/audit", GUS).await;
    assert!(
        audit.body["items"].as_array().expect("items").iter().all(|a| a["tenantId"] == "globex"),
        "globex's audit shows nothing of acme's: {:?}",
        audit.body
    );
    assert_eq!(api.get("/v1/projections", GUS).await.status, StatusCode::NOT_FOUND, "the fleet is the platform's");
    // The reservation is still acme's, untouched.
    assert_eq!(api.get(&format!("/v1/reservations/{id}"), ALICE).await.body["state"], "placed");
}

#[tokio::test]
async fn the_attribute_limit_admits_8_h100_for_72_hours_and_records_a_denial_beyond_it() {
    let api = Api::new().await;
    let pool = api.pool().await;
    let allowed = api.reserve(ALICE, "eight", reservation(&pool, 8, 72 * 3600)).await;
    assert_eq!(allowed.status, StatusCode::CREATED, "{:?}", allowed.body);
    let held = api.bookings_and_charges().await;
    let events = api.events().await;
    for (key, count, hours) in [("nine", 9, 72), ("long", 8, 73)] {
        let denied = api.reserve(ALICE, key, reservation(&pool, count, hours * 3600)).await;
        assert_eq!(denied.status, StatusCode::FORBIDDEN, "{key}: {:?}", denied.body);
        assert_eq!(denied.body["error"]["code"], "FORBIDDEN");
        let id = denied.body["error"]["details"]["reservationId"].as_str().expect("the denied draft's id").to_owned();
        assert_eq!(api.bookings_and_charges().await, held, "{key}: the denial books and charges nothing");
        let recorded = api.get(&format!("/v1/reservations/{id}"), ALICE).await;
        assert_eq!(recorded.body["state"], "denied", "{key}: recorded as denied");
        assert!(recorded.body["allocations"].as_array().is_some_and(Vec::is_empty));
        // A retry is denied again without recording anything more.
        let before = api.events().await;
        let retry = api.reserve(ALICE, key, reservation(&pool, count, hours * 3600)).await;
        assert_eq!(retry.status, StatusCode::FORBIDDEN);
        assert_eq!(api.events().await, before);
    }
    assert_eq!(api.events().await, events + 2, "one reservation.denied event per denied request");
    catch_up(&api.fleet.t.db).await;
    let audit = api.get("/v1/audit", ALICE).await;
    let denials: Vec<&Value> =
        audit.body["items"].as_array().expect("items").iter().filter(|a| a["decision"] == "denied").collect();
    assert_eq!(denials.len(), 2);
    assert!(denials.iter().all(|d| d["eventType"] == "reservation.denied" && d["identity"] == "alice@acme"));
    assert!(denials[0]["reason"].as_str().is_some_and(|r| r.contains("at most 8 H100 GPUs")));
    // The platform's operator is above the limit's relation.
    let big = api.reserve(ROOT, "root-nine", reservation(&pool, 8, 100 * 3600)).await;
    assert_eq!(big.status, StatusCode::CREATED, "{:?}", big.body);
}

#[tokio::test]
async fn a_created_reservation_is_readable_at_once_and_listed_after_its_position() {
    let api = Api::new().await;
    let pool = api.pool().await;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let config = bc_projections::framework::DaemonConfig {
        poll: std::time::Duration::from_millis(10),
        ..bc_projections::framework::DaemonConfig::default()
    };
    let daemon = tokio::spawn(bc_projections::framework::run_daemon(
        api.fleet.t.db.clone(),
        bc_projections::models::read_models(),
        config,
        stopped,
    ));
    for n in 0..5 {
        let created = api.reserve(ALICE, &format!("k{n}"), reservation(&pool, 1, 600)).await;
        assert_eq!(created.status, StatusCode::CREATED);
        let id = created.body["id"].as_str().expect("id");
        let got = api.get(&format!("/v1/reservations/{id}"), ALICE).await;
        assert_eq!(got.status, StatusCode::OK, "never 404 right after the 201");
        let position = created.header("x-position").expect("the consistency token");
        let listed = api.get(&format!("/v1/reservations?after={position}"), ALICE).await;
        assert_eq!(listed.status, StatusCode::OK, "{:?}", listed.body);
        assert!(listed.body["items"].as_array().expect("items").iter().any(|r| r["id"] == id));
        let headed = api.call("GET", "/v1/reservations", Some(ALICE), &[("x-min-position", position)], None).await;
        assert!(headed.body["items"].as_array().expect("items").iter().any(|r| r["id"] == id));
    }
    let _ = stop.send(true);
    daemon.await.expect("daemon");
}

#[tokio::test]
async fn the_openapi_document_lists_every_route_and_only_routed_paths() {
    let api = Api::new().await;
    let doc = api.call("GET", "/v1/openapi.json", None, &[], None).await;
    assert_eq!(doc.status, StatusCode::OK);
    let mut documented = std::collections::BTreeSet::new();
    for (path, operations) in doc.body["paths"].as_object().expect("paths") {
        for (method, operation) in operations.as_object().expect("operations") {
            documented.insert((method.to_ascii_uppercase(), path.clone()));
            // Every answer is described by a named schema: no route answers a bare `Object`.
            for (status, response) in operation["responses"].as_object().expect("responses") {
                for (media, content) in response["content"].as_object().expect("content") {
                    let schema = &content["schema"];
                    // Documents that are not JSON (the event stream, the PKI's certificate and revocation list)
                    // are strings of their media type.
                    let typed =
                        schema.get("$ref").is_some() || (media != "application/json" && schema["type"] == "string");
                    assert!(typed, "{method} {path} {status} {media}: an untyped schema {schema}");
                }
            }
            // The join carries its join token in the body, and a ramdisk's claim its boot credential; the other
            // agent routes use the node credential, the ramdisk's its session.
            let open = path == "/v1/healthz"
                || path == "/v1/openapi.json"
                || path == "/v1/agent/join"
                || path == "/v1/ramdisk/sessions"
                || path.starts_with("/v1/pki/");
            assert_eq!(operation.get("security").is_none(), open, "{method} {path}: bearer security unless open");
            if let Some(security) = operation.get("security") {
                let scheme = if path.starts_with("/v1/agent/") {
                    "node"
                } else if path.starts_with("/v1/ramdisk/") {
                    "ramdisk"
                } else {
                    "bearer"
                };
                assert!(security[0].get(scheme).is_some(), "{method} {path}: {scheme} security");
            }
        }
    }
    let routed: std::collections::BTreeSet<(String, String)> =
        bc_api::http::routes().iter().map(|r| (r.http.to_owned(), r.path.to_owned())).collect();
    assert_eq!(documented, routed, "the document and the router list the same routes");
    // Every routed path answers something other than the router's own 404.
    for (method, path) in &routed {
        let concrete = path
            .replace("{pool_id}", "pool_01m8q000000000000000000001")
            .replace("{node_id}", "node_01m8q000000000000000000001")
            .replace("{tenant_id}", "acme")
            .replace("{site_id}", "site_01m8q000000000000000000001")
            .replace("{command_id}", "cmd_01m8q000000000000000000001")
            .replace("{reservation_id}", &("rsv_".to_owned() + &"a".repeat(52)));
        let (status, message) = api.status_of(method, &concrete, ROOT).await;
        let unrouted = status == StatusCode::NOT_FOUND && message.is_some_and(|m| m.starts_with("no route"));
        assert!(!unrouted && status != StatusCode::METHOD_NOT_ALLOWED, "{method} {path} is not routed");
    }
    let schemas = doc.body["components"]["schemas"].as_object().expect("schemas");
    for schema in ["ReserveBody", "DevicesDto", "PoolBody", "ErrorBody", "ReservationDto", "PoolDto", "NodeDto"] {
        assert!(schemas.contains_key(schema), "{schema} is described");
    }
    assert_eq!(doc.body["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
}

#[tokio::test]
async fn a_customer_offered_a_pool_cannot_operate_its_nodes_and_nothing_is_written() {
    let api = Api::new().await;
    let pool = api.pool().await;
    let mut tx = api.fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let node: String =
        sql::query_scalar("SELECT id FROM nodes ORDER BY id LIMIT 1").fetch_one(tx.conn()).await.expect("a node");
    tx.commit().await.expect("commit");
    let missing = "node_01m8q000000000000000000001";
    let before = api.events().await;
    let calls: [(&str, &str, Option<Value>); 8] = [
        ("POST", "/drain", Some(json!({ "force": true }))),
        ("DELETE", "?force=true", None),
        ("PUT", "/spec", Some(json!({ "labels": { "a": "b" } }))),
        ("POST", "/commands", Some(json!({ "kind": "probe" }))),
        ("GET", "/commands", None),
        ("GET", "/inventory", None),
        ("POST", "/cordon", None),
        ("POST", "/maintenance/start", None),
    ];
    for token in [ALICE, GUS] {
        for (method, tail, body) in &calls {
            let theirs = api
                .call(method, &format!("/v1/nodes/{node}{tail}"), Some(token), &[], body.as_ref().map(Value::to_string))
                .await;
            // The node is in a pool offered to them, so they may see it: refused with the reason, not hidden.
            assert_eq!(theirs.status, StatusCode::FORBIDDEN, "{method} {tail}: {:?}", theirs.body);
            assert!(
                theirs.body["error"]["message"].as_str().is_some_and(|m| m.contains("operator")),
                "{:?}",
                theirs.body
            );
            let nobody = api
                .call(
                    method,
                    &format!("/v1/nodes/{missing}{tail}"),
                    Some(token),
                    &[],
                    body.as_ref().map(Value::to_string),
                )
                .await;
            assert_eq!(nobody.status, StatusCode::NOT_FOUND, "{method} {tail}");
        }
        // Offered the pool as a user, a customer may not admit machines into it.
        let token_call = api.post(&format!("/v1/pools/{pool}/join-tokens"), token, json!({})).await;
        assert!(matches!(token_call.status, StatusCode::FORBIDDEN | StatusCode::NOT_FOUND), "{:?}", token_call.body);
    }
    assert_eq!(api.events().await, before, "nothing was written");
    // The platform's operator can.
    let issued = api.post(&format!("/v1/pools/{pool}/join-tokens"), ROOT, json!({ "ttlSeconds": 600 })).await;
    assert_eq!(issued.status, StatusCode::CREATED, "{:?}", issued.body);
    assert!(issued.body["token"].as_str().is_some_and(|t| t.starts_with("jt_")));
}

/// A body each route accepts far enough to reach its authorization.
fn body_for(method: &str, path: &str, pool: &str) -> Option<Value> {
    if method == "GET" || method == "DELETE" {
        return None;
    }
    Some(match path {
        "/v1/reservations" => reservation(pool, 1, 3600),
        "/v1/pools" => json!({ "siteId": "site_01m8q000000000000000000001", "name": "p", "class": "metal-host",
                               "gpuModel": "H100", "sharing": "exclusive" }),
        "/v1/nodes" => json!({ "poolId": pool, "name": "n", "role": "host", "trust": "platform",
                               "gpus": [{ "uuid": "GPU-x", "name": "NVIDIA H100 80GB HBM3" }] }),
        "/v1/pools/{pool_id}/offers" => json!({ "tenantId": "globex", "quota": { "gpu": 1 } }),
        "/v1/pools/{pool_id}/offers/{tenant_id}/quota" => json!({ "quota": { "gpu": 99 } }),
        "/v1/reservations/{reservation_id}/extend" => json!({ "end": T0 + 5 * HOUR }),
        "/v1/nodes/{node_id}/spec" => json!({ "labels": {} }),
        "/v1/nodes/{node_id}/commands" => json!({ "kind": "probe" }),
        _ => json!({}),
    })
}

#[tokio::test]
async fn every_route_answers_another_tenants_ids_exactly_as_ids_that_do_not_exist() {
    let api = Api::new().await;
    // A pool of the platform offered to acme only, with nodes, and acme's reservation in it.
    let pool = api.fleet.pool("private", Sharing::Exclusive, None).await;
    api.fleet.node(&pool, "p", 2, 0).await;
    api.fleet.offer(&pool, "acme", 4).await;
    let pool = pool.to_string();
    let made = api.reserve(ALICE, "theirs", reservation(&pool, 1, 3600)).await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
    let reservation_id = made.body["id"].as_str().expect("id").to_owned();
    let mut tx = api.fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let node: String = sql::query_scalar("SELECT id FROM nodes WHERE pool_id = $1 LIMIT 1")
        .bind(&pool)
        .fetch_one(tx.conn())
        .await
        .expect("node");
    tx.commit().await.expect("commit");
    let site = api.fleet.site.to_string();
    let real = [
        ("{pool_id}", pool.clone()),
        ("{node_id}", node.clone()),
        ("{reservation_id}", reservation_id.clone()),
        ("{site_id}", site.clone()),
        ("{tenant_id}", "acme".to_owned()),
        ("{command_id}", "cmd_01m8q000000000000000000002".to_owned()),
    ];
    let fake = [
        ("{pool_id}", "pool_01m8q000000000000000000009".to_owned()),
        ("{node_id}", "node_01m8q000000000000000000009".to_owned()),
        ("{reservation_id}", "rsv_".to_owned() + &"b".repeat(52)),
        ("{site_id}", "site_01m8q000000000000000000009".to_owned()),
        ("{tenant_id}", "acme".to_owned()),
        ("{command_id}", "cmd_01m8q000000000000000000002".to_owned()),
    ];
    let fill = |path: &str, ids: &[(&str, String)]| ids.iter().fold(path.to_owned(), |p, (k, v)| p.replace(k, v));
    let secret_ids = [pool.as_str(), node.as_str(), reservation_id.as_str()];
    catch_up(&api.fleet.t.db).await;
    let before = api.events().await;
    let mut checked = 0;
    for route in bc_api::http::routes() {
        // Routes a tenant uses on its own scope, which create in it, and the event stream (its own test).
        if matches!(route.method, Some("sites.create" | "projects.create" | "events.stream" | "events.tickets.create"))
        {
            continue;
        }
        let body = |ids: &[(&str, String)]| body_for(route.http.as_str(), route.path.as_str(), &fill("{pool_id}", ids));
        let theirs = api
            .call(
                route.http.as_str(),
                &fill(route.path.as_str(), &real),
                Some(GUS),
                &[],
                body(&real).map(|b| b.to_string()),
            )
            .await;
        let nobody = api
            .call(
                route.http.as_str(),
                &fill(route.path.as_str(), &fake),
                Some(GUS),
                &[],
                body(&fake).map(|b| b.to_string()),
            )
            .await;
        let what = format!("{} {}", route.http.as_str(), route.path.as_str());
        let text = theirs.body.to_string();
        for id in secret_ids {
            // An id the caller sent may come back in a not-found message; anything else would leak it.
            let sent = route.path.as_str().contains("{") && fill(route.path.as_str(), &real).contains(id)
                || body(&real).is_some_and(|b| b.to_string().contains(id));
            assert!(sent || !text.contains(id), "{what} reveals {id}: {text}");
        }
        assert_eq!(theirs.status, nobody.status, "{what}: {} against {}", theirs.body, nobody.body);
        if theirs.status.is_success() {
            assert_eq!(route.http.as_str(), "GET", "{what} succeeded for another tenant: {text}");
        } else {
            let strip = |reply: &Reply, ids: &[(&str, String)]| {
                let message = reply.body["error"]["message"].as_str().unwrap_or_default().to_owned();
                ids.iter().fold(message, |m, (_, v)| m.replace(v, "ID"))
            };
            assert_eq!(strip(&theirs, &real), strip(&nobody, &fake), "{what}: the answers differ");
        }
        checked += 1;
    }
    assert!(checked >= 40, "{checked} routes checked");
    assert_eq!(api.events().await, before, "globex wrote nothing");
}

#[tokio::test]
async fn the_agent_protocol_and_the_node_routes_answer_within_their_schemas() {
    use bc_agent::simulate::{self, Simulated};
    use bc_domain::inventory::SectionHashes;

    let api = Api::new().await;
    let pool = api.pool().await;
    let token = api.post(&format!("/v1/pools/{pool}/join-tokens"), ROOT, json!({})).await;
    assert_eq!(token.status, StatusCode::CREATED, "{:?}", token.body);
    let spec: Simulated = "2xH100".parse().expect("spec");
    let machine = simulate::inventory("sim-1", &spec);
    let join = json!({
        "joinToken": token.body["token"],
        "agentVersion": "test",
        "inventory": machine.report(&SectionHashes::new()),
    });
    let joined = api.call("POST", "/v1/agent/join", None, &[], Some(join.to_string())).await;
    assert_eq!(joined.status, StatusCode::CREATED, "{:?}", joined.body);
    let credential = joined.body["credential"].as_str().expect("credential").to_owned();
    let node = joined.body["nodeId"].as_str().expect("node").to_owned();
    let session_id = joined.body["session"]["sessionId"].clone();

    let agent = |method: &'static str, uri: String, body: Option<Value>| {
        let credential = credential.clone();
        let api = &api;
        async move { api.call(method, &uri, Some(&credential), &[], body.map(|b| b.to_string())).await }
    };
    let session = agent("POST", "/v1/agent/sessions".into(), Some(json!({ "agentVersion": "test" }))).await;
    assert_eq!(session.status, StatusCode::CREATED, "{:?}", session.body);
    let beat = json!({ "sessionId": session.body["sessionId"], "observedGeneration": 1, "clockMs": T0 });
    let renewed = agent("POST", "/v1/agent/heartbeat".into(), Some(beat)).await;
    assert_eq!(renewed.status, StatusCode::OK, "{:?}", renewed.body);
    assert_ne!(session.body["sessionId"], session_id, "a new session replaced the join's");
    let hashes: SectionHashes =
        serde_json::from_value(joined.body["session"]["inventoryHashes"].clone()).expect("hashes");
    let report = agent("POST", "/v1/agent/inventory".into(), Some(json!(machine.report(&hashes)))).await;
    assert_eq!(report.status, StatusCode::OK, "{:?}", report.body);

    let probe = api.post(&format!("/v1/nodes/{node}/commands"), ROOT, json!({ "kind": "probe", "note": "hi" })).await;
    assert_eq!(probe.status, StatusCode::CREATED, "{:?}", probe.body);
    let commands = agent("GET", "/v1/agent/commands".into(), None).await;
    assert_eq!(commands.body["commands"][0]["kind"], "probe", "{:?}", commands.body);
    let command = commands.body["commands"][0]["id"].as_str().expect("id").to_owned();
    let acked = agent("POST", format!("/v1/agent/commands/{command}/ack"), Some(json!({ "ok": true }))).await;
    assert_eq!(acked.body["state"], "succeeded", "{:?}", acked.body);
    for uri in
        [format!("/v1/nodes/{node}"), format!("/v1/nodes/{node}/commands"), format!("/v1/nodes/{node}/inventory")]
    {
        catch_up(&api.fleet.t.db).await;
        let read = api.get(&uri, ROOT).await;
        assert_eq!(read.status, StatusCode::OK, "{uri}: {:?}", read.body);
    }
    let rotated = agent("POST", "/v1/agent/credential".into(), None).await;
    assert_eq!(rotated.status, StatusCode::CREATED, "{:?}", rotated.body);
    assert_eq!(rotated.body["nodeId"], node.as_str());
}

#[tokio::test]
async fn join_tokens_are_listed_without_their_secrets_and_an_unused_one_is_revoked_for_good() {
    use bc_agent::simulate::{self, Simulated};
    use bc_domain::agent::JoinRequest;
    use bc_domain::inventory::SectionHashes;

    let api = Api::new().await;
    let pool = api.pool().await;
    let issue = || async {
        let made = api.call("POST", &format!("/v1/pools/{pool}/join-tokens"), Some(ROOT), &[], None).await;
        assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
        (made.body["id"].as_str().expect("id").to_owned(), made.body["token"].as_str().expect("token").to_owned())
    };
    let (kept, kept_secret) = issue().await;
    let (revoked, revoked_secret) = issue().await;

    let listed = api.call("GET", &format!("/v1/pools/{pool}/join-tokens"), Some(ROOT), &[], None).await;
    assert_eq!(listed.status, StatusCode::OK, "{:?}", listed.body);
    let text = listed.body.to_string();
    assert!(!text.contains(&kept_secret) && !text.contains("jt_"), "no secret is ever listed: {text}");
    let items = listed.body["items"].as_array().expect("items");
    assert_eq!(items.len(), 2);
    assert!(items.iter().all(|t| t["state"] == "unused" && t["createdBy"] == "operator@platform"), "{items:?}");
    // A customer of the pool is no operator of it.
    let customer = api.call("GET", &format!("/v1/pools/{pool}/join-tokens"), Some(ALICE), &[], None).await;
    assert!(
        customer.status == StatusCode::FORBIDDEN || customer.status == StatusCode::NOT_FOUND,
        "{:?}",
        customer.body
    );

    // Revoked, it admits nobody; revoking again answers it as it is and appends nothing.
    let path = format!("/v1/pools/{pool}/join-tokens/{revoked}");
    let done = api.call("DELETE", &path, Some(ROOT), &[], None).await;
    assert_eq!((done.status, done.body["state"].as_str()), (StatusCode::OK, Some("revoked")), "{:?}", done.body);
    assert!(done.header("x-position").is_some());
    let events = api.events().await;
    let again = api.call("DELETE", &path, Some(ROOT), &[], None).await;
    assert_eq!((again.status, again.body["state"].as_str()), (StatusCode::OK, Some("revoked")));
    assert_eq!(api.events().await, events, "a second revocation appends nothing");
    let spec: Simulated = "2xH100".parse().expect("spec");
    let join = |token: String, host: &str| JoinRequest {
        join_token: token,
        agent_version: "test".into(),
        inventory: simulate::inventory(host, &spec).report(&SectionHashes::new()),
        csr: None,
        role: None,
    };
    let refused = api.fleet.app.join(join(revoked_secret, "sim-revoked")).await.expect_err("a revoked token");
    assert!(refused.to_string().contains("was revoked"), "{refused}");

    // Used, it cannot be revoked: it admits nobody else already, and the node is what to delete.
    let joined = api.fleet.app.join(join(kept_secret, "sim-kept")).await.expect("join");
    let used = api.call("DELETE", &format!("/v1/pools/{pool}/join-tokens/{kept}"), Some(ROOT), &[], None).await;
    assert_eq!(used.status, StatusCode::CONFLICT, "{:?}", used.body);
    assert!(used.body.to_string().contains(&joined.node_id.to_string()), "{:?}", used.body);
    let listed = api.call("GET", &format!("/v1/pools/{pool}/join-tokens?limit=1"), Some(ROOT), &[], None).await;
    assert_eq!(listed.body["items"].as_array().map(Vec::len), Some(1));
    let cursor = listed.body["nextCursor"].as_str().expect("a second page").to_owned();
    let rest = api.call("GET", &format!("/v1/pools/{pool}/join-tokens?cursor={cursor}"), Some(ROOT), &[], None).await;
    let states: Vec<&str> = listed.body["items"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(rest.body["items"].as_array().into_iter().flatten())
        .filter_map(|t| t["state"].as_str())
        .collect();
    let mut sorted = states.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, ["revoked", "used"], "{states:?}");
    let missing = api
        .call("DELETE", &format!("/v1/pools/{pool}/join-tokens/jtk_01jd8w2k3m4n5p6q7r8s9t0v1w"), Some(ROOT), &[], None)
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn projects_are_listed_read_and_deleted_once_their_reservations_have_ended() {
    let api = Api::new().await;
    let pool = api.pool().await;
    let made = api.call("POST", "/v1/projects", Some(ROOT), &[], Some(json!({ "name": "research" }).to_string())).await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
    let id = made.body["id"].as_str().expect("id").to_owned();
    let listed = api.call("GET", "/v1/projects", Some(ROOT), &[], None).await;
    assert_eq!(listed.body["items"][0]["name"], "research", "{:?}", listed.body);
    let read = api.call("GET", &format!("/v1/projects/{id}"), Some(ROOT), &[], None).await;
    assert_eq!((read.status, read.body["id"].as_str()), (StatusCode::OK, Some(id.as_str())));
    // Another tenant neither lists nor reads it.
    let other = api.call("GET", "/v1/projects", Some(GUS), &[], None).await;
    assert_eq!(other.body["items"].as_array().map(Vec::len), Some(0), "{:?}", other.body);
    assert_eq!(
        api.call("GET", &format!("/v1/projects/{id}"), Some(GUS), &[], None).await.status,
        StatusCode::NOT_FOUND
    );

    // A live reservation of the project holds it.
    let mut body = reservation(&pool, 1, 3600);
    body["projectId"] = json!(id);
    let reserved = api.reserve(ROOT, "in-project", body).await;
    assert_eq!(reserved.status, StatusCode::CREATED, "{:?}", reserved.body);
    let held = api.call("DELETE", &format!("/v1/projects/{id}"), Some(ROOT), &[], None).await;
    assert_eq!(held.status, StatusCode::CONFLICT, "{:?}", held.body);
    assert!(held.body.to_string().contains("1 reservations"), "{:?}", held.body);
    let rid = reserved.body["id"].as_str().expect("id");
    let cancelled = api.call("POST", &format!("/v1/reservations/{rid}/cancel"), Some(ROOT), &[], None).await;
    assert!(cancelled.status.is_success(), "{:?}", cancelled.body);

    let deleted = api.call("DELETE", &format!("/v1/projects/{id}"), Some(ROOT), &[], None).await;
    assert_eq!(
        (deleted.status, deleted.body["name"].as_str()),
        (StatusCode::OK, Some("research")),
        "{:?}",
        deleted.body
    );
    assert_eq!(
        api.call("GET", &format!("/v1/projects/{id}"), Some(ROOT), &[], None).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        api.call("DELETE", &format!("/v1/projects/{id}"), Some(ROOT), &[], None).await.status,
        StatusCode::NOT_FOUND
    );
    // Its name is free again.
    let again =
        api.call("POST", "/v1/projects", Some(ROOT), &[], Some(json!({ "name": "research" }).to_string())).await;
    assert_eq!(again.status, StatusCode::CREATED, "{:?}", again.body);
}

#[tokio::test]
async fn a_revoked_offering_hides_the_pool_and_refuses_new_reservations_while_the_old_keep_running() {
    let api = Api::new().await;
    let pool = api.pool().await;
    let kept = api.reserve(ALICE, "before", reservation(&pool, 1, 3600)).await;
    assert_eq!(kept.status, StatusCode::CREATED, "{:?}", kept.body);
    let kept_id = kept.body["id"].as_str().expect("id").to_owned();

    // Only the pool's administrators withdraw it.
    let path = format!("/v1/pools/{pool}/offers/acme");
    assert!(api.call("DELETE", &path, Some(ALICE), &[], None).await.status.is_client_error());
    let done = api.call("DELETE", &path, Some(ROOT), &[], None).await;
    assert_eq!(done.status, StatusCode::OK, "{:?}", done.body);
    assert!(done.header("x-position").is_some());
    assert_eq!(api.call("DELETE", &path, Some(ROOT), &[], None).await.status, StatusCode::NOT_FOUND, "withdrawn once");

    let refused = api.reserve(ALICE, "after", reservation(&pool, 1, 3600)).await;
    assert!(refused.status.is_client_error(), "{:?}", refused.body);
    let position = done.header("x-position").expect("position").to_owned();
    catch_up(&api.fleet.t.db).await;
    let pools = api.call("GET", &format!("/v1/pools?after={position}"), Some(ALICE), &[], None).await;
    assert_eq!(pools.status, StatusCode::OK, "{:?}", pools.body);
    assert!(!pools.body.to_string().contains(&pool), "the pool is no longer listed for acme: {:?}", pools.body);
    // What acme had reserved keeps running; globex keeps its offering.
    let mut tx = api.fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let state: String = sql::query_scalar("SELECT state FROM reservations WHERE id = $1")
        .bind(&kept_id)
        .fetch_one(tx.conn())
        .await
        .expect("state");
    tx.commit().await.expect("commit");
    assert_eq!(state, "placed");
    let globex = api.reserve(GUS, "globex", reservation(&pool, 1, 3600)).await;
    assert_eq!(globex.status, StatusCode::CREATED, "{:?}", globex.body);
}

#[tokio::test]
async fn a_pool_is_changed_and_deleted_and_its_site_after_it_each_refused_while_something_remains() {
    let api = Api::new().await;
    let site = api.post("/v1/sites", ROOT, json!({ "name": "ams1", "iamRegion": "eu-west-1" })).await;
    let site_id = site.body["id"].as_str().expect("site id").to_owned();
    let pool = api
        .post(
            "/v1/pools",
            ROOT,
            json!({ "siteId": site_id, "name": "h100", "class": "metal-host", "gpuModel": "H100" }),
        )
        .await;
    let pool_id = pool.body["id"].as_str().expect("pool id").to_owned();
    let path = format!("/v1/pools/{pool_id}");
    let api = &api;
    let patch = |body: Value| {
        let path = path.clone();
        async move { api.call("PATCH", &path, Some(ROOT), &[], Some(body.to_string())).await }
    };

    // Renamed, with a new policy, and (while empty) a new sharing mode.
    let changed = patch(json!({ "name": "h100-b", "policy": { "disruptionBudget": 0.5 }, "sharing": "mig" })).await;
    assert_eq!(changed.status, StatusCode::OK, "{:?}", changed.body);
    let position = changed.header("x-position").expect("position").to_owned();
    catch_up(&api.fleet.t.db).await;
    let read = api.call("GET", &format!("/v1/pools/{pool_id}?after={position}"), Some(ROOT), &[], None).await;
    assert_eq!(read.status, StatusCode::OK, "{:?}", read.body);
    assert_eq!(
        (read.body["name"].as_str(), read.body["sharing"].as_str()),
        (Some("h100-b"), Some("mig")),
        "{:?}",
        read.body
    );
    assert_eq!(read.body["policy"]["disruptionBudget"], 0.5, "{:?}", read.body);
    for (body, field) in [
        (json!({}), "body"),
        (json!({ "colour": "red" }), "colour"),
        (json!({ "policy": { "disruptionBudget": 2 } }), "policy.disruptionBudget"),
        (json!({ "name": "" }), "name"),
    ] {
        let refused = patch(body.clone()).await;
        assert_eq!((refused.status, refused.field()), (StatusCode::BAD_REQUEST, field), "{body}: {:?}", refused.body);
    }
    assert_eq!(patch(json!({ "sharing": "exclusive" })).await.status, StatusCode::OK, "back, while still empty");
    // With a node, its sharing mode stays and it cannot be deleted; nor can its site.
    let node = api.fleet.node(&pool_id.parse().expect("pool"), "n1", 2, 0).await;
    let refused = patch(json!({ "sharing": "mig" })).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{:?}", refused.body);
    let held = api.call("DELETE", &format!("/v1/pools/{pool_id}"), Some(ROOT), &[], None).await;
    assert_eq!(held.status, StatusCode::CONFLICT, "{:?}", held.body);
    let site_held = api.call("DELETE", &format!("/v1/sites/{site_id}"), Some(ROOT), &[], None).await;
    assert_eq!(site_held.status, StatusCode::CONFLICT, "{:?}", site_held.body);
    assert!(site_held.body.to_string().contains("1 pools"), "{:?}", site_held.body);

    // Without the node, the pool goes, then the site; both are then not found, and their names are free.
    let gone = api.call("DELETE", &format!("/v1/nodes/{node}?force=true"), Some(ROOT), &[], None).await;
    assert!(gone.status.is_success(), "{:?}", gone.body);
    let deleted = api.call("DELETE", &format!("/v1/pools/{pool_id}"), Some(ROOT), &[], None).await;
    assert_eq!(deleted.status, StatusCode::OK, "{:?}", deleted.body);
    assert_eq!(
        api.call("GET", &format!("/v1/pools/{pool_id}"), Some(ROOT), &[], None).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(patch(json!({ "name": "x" })).await.status, StatusCode::NOT_FOUND);
    catch_up(&api.fleet.t.db).await;
    let listed = api.get("/v1/pools", ROOT).await;
    assert!(!listed.body.to_string().contains(&pool_id), "{:?}", listed.body);
    let site_deleted = api.call("DELETE", &format!("/v1/sites/{site_id}"), Some(ROOT), &[], None).await;
    assert_eq!(site_deleted.status, StatusCode::OK, "{:?}", site_deleted.body);
    assert_eq!(
        api.call("GET", &format!("/v1/sites/{site_id}"), Some(ROOT), &[], None).await.status,
        StatusCode::NOT_FOUND
    );
    let again = api.post("/v1/sites", ROOT, json!({ "name": "ams1", "iamRegion": "eu-west-1" })).await;
    assert_eq!(again.status, StatusCode::CREATED, "the name is free again: {:?}", again.body);
}

#[tokio::test]
async fn the_platforms_administrators_read_every_tenants_reservations_and_audit_and_nobody_else_does() {
    let api = Api::new().await;
    let pool = api.pool().await;
    let acme = api.reserve(ALICE, "acme", reservation(&pool, 1, 3600)).await;
    let globex = api.reserve(GUS, "globex", reservation(&pool, 1, 3600)).await;
    let (acme_id, globex_id) = (acme.body["id"].as_str().expect("id"), globex.body["id"].as_str().expect("id"));
    let position = globex.header("x-position").expect("position").to_owned();
    catch_up(&api.fleet.t.db).await;

    let all = api.call("GET", &format!("/v1/fleet/reservations?after={position}"), Some(ROOT), &[], None).await;
    assert_eq!(all.status, StatusCode::OK, "{:?}", all.body);
    let ids: Vec<&str> = all.body["items"].as_array().expect("items").iter().filter_map(|r| r["id"].as_str()).collect();
    assert!(ids.contains(&acme_id) && ids.contains(&globex_id), "{ids:?}");
    let one = api.call("GET", "/v1/fleet/reservations?tenant=acme", Some(ROOT), &[], None).await;
    let ids: Vec<&str> = one.body["items"].as_array().expect("items").iter().filter_map(|r| r["id"].as_str()).collect();
    assert_eq!(ids, [acme_id], "{:?}", one.body);
    let audit = api.call("GET", "/v1/fleet/audit?tenant=globex", Some(ROOT), &[], None).await;
    assert_eq!(audit.status, StatusCode::OK, "{:?}", audit.body);
    let tenants: std::collections::BTreeSet<&str> =
        audit.body["items"].as_array().expect("items").iter().filter_map(|a| a["tenantId"].as_str()).collect();
    assert_eq!(tenants.into_iter().collect::<Vec<_>>(), ["globex"], "{:?}", audit.body);
    let every = api.call("GET", "/v1/fleet/audit", Some(ROOT), &[], None).await;
    let tenants: std::collections::BTreeSet<&str> =
        every.body["items"].as_array().expect("items").iter().filter_map(|a| a["tenantId"].as_str()).collect();
    assert!(tenants.contains("acme") && tenants.contains("globex"), "{tenants:?}");

    // A customer reads neither, whatever it asks; its own lists stay its own.
    for path in ["/v1/fleet/reservations", "/v1/fleet/reservations?tenant=acme", "/v1/fleet/audit?tenant=acme"] {
        let refused = api.call("GET", path, Some(ALICE), &[], None).await;
        assert!(
            refused.status == StatusCode::FORBIDDEN || refused.status == StatusCode::NOT_FOUND,
            "{path}: {:?}",
            refused.body
        );
    }
    let own = api.call("GET", "/v1/reservations", Some(ALICE), &[], None).await;
    let ids: Vec<&str> = own.body["items"].as_array().expect("items").iter().filter_map(|r| r["id"].as_str()).collect();
    assert_eq!(ids, [acme_id]);
    let bad = api.call("GET", "/v1/fleet/reservations?tenant=Not%20A%20Tenant", Some(ROOT), &[], None).await;
    assert_eq!((bad.status, bad.field()), (StatusCode::BAD_REQUEST, "tenant"), "{:?}", bad.body);
}

#[tokio::test]
async fn a_descendant_reads_a_pool_offered_to_its_ancestor_with_descendants_and_only_then() {
    let api = Api::new().await;
    let pool = api.pool().await;
    let offer = |descendants: bool| {
        json!({ "tenantId": "acme", "quota": { "gpu": 4 }, "priority": 0, "includeDescendants": descendants })
            .to_string()
    };
    let path = format!("/v1/pools/{pool}/offers");
    let without = api.call("POST", &path, Some(ROOT), &[], Some(offer(false))).await;
    assert_eq!(without.status, StatusCode::OK, "{:?}", without.body);
    catch_up(&api.fleet.t.db).await;
    assert_eq!(api.call("GET", &format!("/v1/pools/{pool}"), Some(LAB), &[], None).await.status, StatusCode::NOT_FOUND);
    let listed = api.call("GET", "/v1/pools", Some(LAB), &[], None).await;
    assert_eq!(listed.body["items"].as_array().map(Vec::len), Some(0), "{:?}", listed.body);

    let with = api.call("POST", &path, Some(ROOT), &[], Some(offer(true))).await;
    assert_eq!(with.status, StatusCode::OK, "{:?}", with.body);
    catch_up(&api.fleet.t.db).await;
    let read = api.call("GET", &format!("/v1/pools/{pool}"), Some(LAB), &[], None).await;
    assert_eq!(read.status, StatusCode::OK, "{:?}", read.body);
    let offers: Vec<&str> =
        read.body["offers"].as_array().expect("offers").iter().filter_map(|o| o["tenantId"].as_str()).collect();
    assert_eq!(offers, ["acme"], "it sees the offering that governs it, and no other: {:?}", read.body);
    let capacity = api.call("GET", &format!("/v1/pools/{pool}/capacity"), Some(LAB), &[], None).await;
    assert_eq!(capacity.status, StatusCode::OK, "{:?}", capacity.body);
    let listed = api.call("GET", "/v1/pools", Some(LAB), &[], None).await;
    let ids: Vec<&str> =
        listed.body["items"].as_array().expect("items").iter().filter_map(|p| p["id"].as_str()).collect();
    assert_eq!(ids, [pool.as_str()], "{:?}", listed.body);
}

#[tokio::test]
async fn one_caller_s_denials_are_recorded_up_to_a_bound_per_minute_and_refused_beyond_it() {
    let api = Api::new().await;
    let pool = api.pool().await;
    let events = api.events().await;
    let bound = bc_commands::auth::RECORDED_DENIALS_PER_MINUTE as i64;
    for n in 0..bound + 5 {
        let denied = api.reserve(ALICE, &format!("flood-{n}"), reservation(&pool, 9, 3600)).await;
        assert_eq!(denied.status, StatusCode::FORBIDDEN, "{n}: {:?}", denied.body);
        let recorded = denied.body["error"]["details"]["reservationId"].is_string();
        assert_eq!(recorded, n < bound, "{n}: {:?}", denied.body);
        if !recorded {
            assert!(denied.body["error"]["message"].as_str().is_some_and(|m| m.contains("not recorded")));
        }
    }
    assert_eq!(api.events().await, events + bound, "the log grew by the bound, not by the flood");
    // Another caller's budget is its own.
    let gus = api.reserve(GUS, "theirs", reservation(&pool, 9, 3600)).await;
    assert!(gus.body["error"]["details"]["reservationId"].is_string(), "{:?}", gus.body);
}

/// Every instant a caller names is checked against 1970 to the end of the year 9999 before the service computes
/// with it: `i64`'s extremes once reached the database (an overflow, answered 500) or overflowed in Rust (a panic
/// that dropped the connection).
#[tokio::test]
async fn instants_outside_1970_to_9999_are_refused_naming_the_field_and_write_nothing() {
    let api = Api::new().await;
    let pool = api.pool().await;
    let placed = api.reserve(ALICE, "placed", reservation(&pool, 1, 3600)).await;
    assert_eq!(placed.status, StatusCode::CREATED, "{:?}", placed.body);
    let id = placed.body["id"].as_str().expect("id").to_owned();
    let before = api.events().await;
    let last = bc_domain::instant::MAX_EPOCH_MS;
    for (n, at) in [i64::MAX, i64::MIN, -1_000, last + 1].into_iter().enumerate() {
        let with = |field: &str| {
            let mut body = reservation(&pool, 1, 3600);
            body[field] = json!(at);
            body
        };
        let asks: Vec<(&str, String, Option<Value>, &str)> = vec![
            ("POST", "/v1/reservations".into(), Some(with("start")), "start"),
            ("POST", "/v1/reservations".into(), Some(with("deadline")), "deadline"),
            ("POST", format!("/v1/reservations/{id}/extend"), Some(json!({ "end": at })), "end"),
            ("GET", format!("/v1/pools/{pool}/availability?start={at}&end={}", i64::MAX), None, "start"),
            ("GET", format!("/v1/pools/{pool}/availability?start=0&end={at}"), None, "end"),
            (
                "GET",
                format!("/v1/pools/{pool}/availability?class=gpu&count=1&duration=3600&notBefore={at}"),
                None,
                "notBefore",
            ),
            (
                "POST",
                format!("/v1/pools/{pool}/quotes"),
                Some(json!({ "devices": { "class": "gpu", "count": 1 }, "duration": 3600, "start": at })),
                "start",
            ),
            (
                "POST",
                format!("/v1/pools/{pool}/quotes"),
                Some(json!({ "devices": { "class": "gpu", "count": 1 }, "duration": 3600, "notBefore": at })),
                "notBefore",
            ),
            ("GET", format!("/v1/ledger?from={at}"), None, "from"),
        ];
        for (method, uri, body, field) in asks {
            let key = format!("instant-{n}-{field}");
            let headers: Vec<(&str, &str)> =
                if uri == "/v1/reservations" { vec![("idempotency-key", &key)] } else { vec![] };
            let token = if uri.starts_with("/v1/ledger") { ROOT } else { ALICE };
            let reply = api.call(method, &uri, Some(token), &headers, body.map(|b| b.to_string())).await;
            assert_eq!(
                (reply.status, reply.field()),
                (StatusCode::BAD_REQUEST, field),
                "{method} {uri} at {at}: {:?}",
                reply.body
            );
            assert!(
                reply.body["error"]["message"].as_str().is_some_and(|m| m.contains("the end of the year 9999")),
                "{method} {uri}: {:?}",
                reply.body
            );
        }
    }
    // A length whose milliseconds pass i64's range (u64::MAX wraps to a negative and was refused; this overflowed).
    let long = api.reserve(ALICE, "long", reservation(&pool, 1, i64::MAX as u64)).await;
    assert_eq!((long.status, long.field()), (StatusCode::BAD_REQUEST, "duration"), "{:?}", long.body);
    assert_eq!(api.events().await, before, "no refused instant wrote anything");
    // The last instant is one the service computes with: a window starting then is refused for its distance, a free
    // read over it answers.
    let far = api
        .reserve(ALICE, "far", {
            let mut body = reservation(&pool, 1, 3600);
            body["start"] = json!(last - last % 1000);
            body
        })
        .await;
    assert_eq!((far.status, far.field()), (StatusCode::BAD_REQUEST, "start"), "{:?}", far.body);
    assert!(far.body["error"]["message"].as_str().is_some_and(|m| m.contains("366 days ahead")), "{:?}", far.body);
    let free = api.get(&format!("/v1/pools/{pool}/availability?start=0&end={last}"), ALICE).await;
    assert_eq!(free.status, StatusCode::OK, "{:?}", free.body);
    let beyond =
        api.get(&format!("/v1/pools/{pool}/availability?class=gpu&count=1&duration={}", 366 * 86_400 + 1), ALICE).await;
    assert_eq!((beyond.status, beyond.field()), (StatusCode::BAD_REQUEST, "duration"), "{:?}", beyond.body);
}

#[tokio::test]
async fn the_documented_integer_ranges_are_the_ones_the_service_checks() {
    let api = Api::new().await;
    let doc = api.call("GET", "/v1/openapi.json", None, &[], None).await;
    let schemas = &doc.body["components"]["schemas"];
    let range = |schema: &str, property: &str| {
        let p = &schemas[schema]["properties"][property];
        (p["minimum"].as_i64(), p["maximum"].as_i64())
    };
    let max_duration = bc_domain::reservation::MAX_AHEAD_MS / 1000;
    assert_eq!(range("DevicesDto", "count"), (Some(1), Some(i64::from(bc_domain::reservation::MAX_COUNT))));
    assert_eq!(range("ReserveBody", "duration"), (Some(1), Some(max_duration)));
    assert_eq!(range("PoolPolicyDto", "lostAfter"), (Some(1), Some(bc_domain::pool::MAX_LOST_AFTER_S as i64)));
    assert_eq!(schemas["ReserveBody"]["properties"]["start"]["multipleOf"].as_i64(), Some(1000));
    let ttl = bc_commands::agents::MAX_JOIN_TOKEN_TTL_S as i64;
    let join = &doc.body["paths"]["/v1/pools/{pool_id}/join-tokens"]["post"]["requestBody"];
    let ttl_seconds = find_property(join, "ttlSeconds").expect("ttlSeconds is described");
    assert_eq!((ttl_seconds["minimum"].as_i64(), ttl_seconds["maximum"].as_i64()), (Some(60), Some(ttl)));
    assert_eq!(range("LimitBody", "maxGpus"), (Some(0), Some(i64::from(bc_domain::tenancy::MAX_LIMIT_GPUS))));
    assert_eq!(range("LimitBody", "maxHours"), (Some(0), Some(i64::from(bc_domain::tenancy::MAX_LIMIT_HOURS))));
    // Every instant a caller names: the literal in the schemas is the domain's bound.
    let instant = (Some(0), Some(bc_domain::instant::MAX_EPOCH_MS));
    for (schema, property) in [
        ("ReserveBody", "start"),
        ("ReserveBody", "deadline"),
        ("ExtendBody", "end"),
        ("QuoteBody", "start"),
        ("QuoteBody", "notBefore"),
    ] {
        assert_eq!(range(schema, property), instant, "{schema}.{property}");
    }
    for (path, name) in [
        ("/v1/pools/{pool_id}/availability", "start"),
        ("/v1/pools/{pool_id}/availability", "end"),
        ("/v1/pools/{pool_id}/availability", "notBefore"),
        ("/v1/ledger", "from"),
        ("/v1/ledger", "to"),
    ] {
        let params = doc.body["paths"][path]["get"]["parameters"].as_array().expect("parameters");
        let schema = &params.iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("{path} {name}"))["schema"];
        assert_eq!((schema["minimum"].as_i64(), schema["maximum"].as_i64()), instant, "{path} ?{name}");
    }
    // At the edges: the largest documented value is taken, one more is refused naming the field.
    let pool = api.pool().await;
    let edge = api.reserve(ROOT, "edge", reservation(&pool, 1, max_duration as u64)).await;
    assert_ne!(edge.field(), "duration", "{:?}", edge.body);
    let beyond = api.reserve(ROOT, "beyond", reservation(&pool, 1, max_duration as u64 + 1)).await;
    assert_eq!((beyond.status, beyond.field()), (StatusCode::BAD_REQUEST, "duration"), "{:?}", beyond.body);
    let many = api.reserve(ROOT, "many", reservation(&pool, bc_domain::reservation::MAX_COUNT + 1, 60)).await;
    assert_eq!((many.status, many.field()), (StatusCode::BAD_REQUEST, "devices.count"), "{:?}", many.body);
}

/// The first property named `name` anywhere below `value`.
fn find_property<'a>(value: &'a Value, name: &str) -> Option<&'a Value> {
    match value {
        Value::Object(map) => map
            .get("properties")
            .and_then(|p| p.get(name))
            .or_else(|| map.values().find_map(|v| find_property(v, name))),
        Value::Array(items) => items.iter().find_map(|v| find_property(v, name)),
        _ => None,
    }
}

#[tokio::test]
async fn a_pool_s_devices_are_listed_node_by_node_for_its_owner_only() {
    let api = Api::new().await;
    let pool = api.pool().await;
    catch_up(&api.fleet.t.db).await;
    let listed = api.get(&format!("/v1/pools/{pool}/devices?limit=1"), ROOT).await;
    assert_eq!(listed.status, StatusCode::OK, "{:?}", listed.body);
    let first = &listed.body["items"][0];
    assert_eq!(first["items"].as_array().map(Vec::len), Some(8), "{:?}", listed.body);
    let cursor = listed.body["nextCursor"].as_str().expect("a second page");
    let next = api.get(&format!("/v1/pools/{pool}/devices?limit=1&cursor={cursor}"), ROOT).await;
    assert_eq!(next.body["items"].as_array().map(Vec::len), Some(1));
    assert_ne!(next.body["items"][0]["nodeId"], first["nodeId"]);
    assert!(next.body["nextCursor"].is_null());
    // A tenant offered the pool reads its capacity, not its machines; another sees nothing of it.
    for token in [ALICE, GUS] {
        assert_eq!(api.get(&format!("/v1/pools/{pool}/devices"), token).await.status, StatusCode::NOT_FOUND);
    }
}

#[tokio::test]
async fn policy_keys_and_quota_resources_the_service_does_not_act_on_yet_are_refused_naming_them() {
    let api = Api::new().await;
    let pool = api.pool().await;
    let before = api.events().await;
    let cases = [
        (
            "PATCH",
            format!("/v1/pools/{pool}"),
            json!({ "policy": { "lostAfter": 9_223_372_036_854_775_808u64 } }),
            "policy.lostAfter",
        ),
        (
            "PATCH",
            format!("/v1/pools/{pool}"),
            json!({ "policy": { "hardwareProfile": "dgx-h100" } }),
            "policy.hardwareProfile",
        ),
        (
            "PATCH",
            format!("/v1/pools/{pool}"),
            json!({ "policy": { "overcommit": { "gpu": 2.0 } } }),
            "policy.overcommit.gpu",
        ),
        (
            "PATCH",
            format!("/v1/pools/{pool}"),
            json!({ "policy": { "admission": { "budgetCheck": true } } }),
            "policy.admission.budgetCheck",
        ),
        (
            "POST",
            format!("/v1/pools/{pool}/offers"),
            json!({ "tenantId": "acme", "quota": { "gpu": 1, "nic.vf": 8 } }),
            "quota.nic.vf",
        ),
        ("PUT", format!("/v1/pools/{pool}/offers/acme/quota"), json!({ "quota": { "nic.vf": 64 } }), "quota.nic.vf"),
    ];
    for (method, uri, body, field) in cases {
        let reply = api.call(method, &uri, Some(ROOT), &[], Some(body.to_string())).await;
        assert_eq!((reply.status, reply.field()), (StatusCode::BAD_REQUEST, field), "{method} {uri}: {:?}", reply.body);
    }
    // Whether a pool hands out whole machines decides what its atoms are: it changes only while it has no nodes.
    let whole = api
        .call(
            "PATCH",
            &format!("/v1/pools/{pool}"),
            Some(ROOT),
            &[],
            Some(json!({ "policy": { "tenantRoot": true } }).to_string()),
        )
        .await;
    assert_eq!(whole.status, StatusCode::CONFLICT, "{:?}", whole.body);
    assert!(whole.body["error"]["message"].as_str().unwrap_or("").contains("policy.tenantRoot"), "{:?}", whole.body);
    assert_eq!(api.events().await, before, "nothing was written");
}

#[tokio::test]
async fn scalar_resources_go_from_a_node_to_an_allocation_and_bad_amounts_are_refused_naming_them() {
    let api = Api::new().await;
    let pool = api.pool().await;
    let policy = json!({ "policy": { "overcommit": { "vcpu": 2.0 } } });
    let patched = api.call("PATCH", &format!("/v1/pools/{pool}"), Some(ROOT), &[], Some(policy.to_string())).await;
    assert_eq!(patched.status, StatusCode::OK, "{:?}", patched.body);
    let gpus: Vec<Value> = (0..2)
        .map(|g| json!({ "uuid": format!("GPU-scalar-{g}"), "name": "NVIDIA H100 80GB HBM3", "memoryMib": 81559 }))
        .collect();
    let register = |resources: Value| {
        json!({ "poolId": pool, "name": "vps", "role": "host", "trust": "platform", "gpus": gpus,
                "resources": resources })
    };

    let before = api.events().await;
    for (resources, field) in
        [(json!({ "cpu": 8 }), "resources.cpu"), (json!({ "vcpu": 1_000_000_001u64 }), "resources.vcpu")]
    {
        let refused = api.post("/v1/nodes", ROOT, register(resources)).await;
        assert_eq!((refused.status, refused.field()), (StatusCode::BAD_REQUEST, field), "{:?}", refused.body);
    }
    for (resources, field) in [
        (json!({ "gpu": 1 }), "resources.gpu"),
        (json!({ "vcpu": 0 }), "resources.vcpu"),
        (json!({ "memoryGiB": 1_000_001 }), "resources.memoryGiB"),
    ] {
        let mut body = reservation(&pool, 1, 3600);
        body["resources"] = resources;
        let refused = api.reserve(ROOT, "bad", body).await;
        assert_eq!((refused.status, refused.field()), (StatusCode::BAD_REQUEST, field), "{:?}", refused.body);
    }
    assert_eq!(api.events().await, before, "a refusal records nothing");

    let node = api.post("/v1/nodes", ROOT, register(json!({ "vcpu": 8, "memoryGiB": 64 }))).await;
    assert_eq!(node.status, StatusCode::CREATED, "{:?}", node.body);
    let node_id = node.body["id"].as_str().expect("node id");
    catch_up(&api.fleet.t.db).await;
    let shown = api.get(&format!("/v1/nodes/{node_id}"), ROOT).await;
    assert_eq!(shown.body["resources"], json!({ "vcpu": 8, "memoryGiB": 64 }), "{:?}", shown.body);

    // Only the new node reports vCPUs, and it lends twice its 8.
    let mut body = reservation(&pool, 1, 3600);
    body["resources"] = json!({ "vcpu": 16, "memoryGiB": 32 });
    let made = api.reserve(ROOT, "scalars", body.clone()).await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
    assert_eq!(made.body["request"]["resources"], json!({ "vcpu": 16, "memoryGiB": 32 }));
    assert_eq!(made.body["allocations"][0]["nodeId"], json!(node_id));
    assert_eq!(made.body["allocations"][0]["resources"], json!({ "vcpu": 16, "memoryGiB": 32 }));
    body["resources"] = json!({ "vcpu": 1 });
    body["wait"] = json!(false);
    let full = api.reserve(ROOT, "one-more", body).await;
    assert_eq!(full.status, StatusCode::CONFLICT, "every vCPU it lends is held: {:?}", full.body);
    assert_eq!(full.body["error"]["code"], "CAPACITY_UNAVAILABLE", "{:?}", full.body);
}
