//! Tenants, identities, tokens, grants and limits administered through the API: each change decides the very
//! next call (and another process's within a second), a suspended tenant starts nothing new while what it runs
//! keeps running, and bad input is refused naming the field without writing anything.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use bc_api::http::{AppState, router};
use bc_commands::auth::BuiltinAuthorizer;
use serde_json::{Value, json};

use crate::http_api::{ALICE, AUTH, Api, GUS, ROOT};

fn reservation(pool: &str, count: u32) -> Value {
    json!({ "poolId": pool, "devices": { "class": "gpu", "count": count }, "duration": 3600 })
}

/// Makes tenant `id` below root with an administrator, and answers the administrator's token.
async fn customer(api: &Api, id: &str) -> String {
    let made = api.post("/v1/tenants", ROOT, json!({ "tenantId": id, "name": format!("{id} inc.") })).await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
    assert_eq!((made.body["state"].as_str(), made.body["parentId"].as_str()), (Some("active"), Some("root")));
    let boss = api
        .post(&format!("/v1/tenants/{id}/identities"), ROOT, json!({ "name": format!("boss@{id}"), "admin": true }))
        .await;
    assert_eq!(boss.status, StatusCode::CREATED, "{:?}", boss.body);
    let identity = boss.body["id"].as_str().expect("identity id");
    let token = api.post(&format!("/v1/tenants/{id}/identities/{identity}/tokens"), ROOT, json!({})).await;
    assert_eq!(token.status, StatusCode::CREATED, "{:?}", token.body);
    token.body["token"].as_str().expect("a token").to_owned()
}

#[tokio::test]
async fn a_tenant_and_its_identities_and_tokens_are_made_through_the_api_and_work_at_once() {
    let api = Api::with_pki().await;
    let boss = customer(&api, "initech").await;
    assert!(boss.starts_with("bct_"), "{boss}");
    // The token speaks for its identity at once: its tenant's scope, and nothing of another's.
    let pools = api.get("/v1/pools", &boss).await;
    assert_eq!(pools.status, StatusCode::OK, "{:?}", pools.body);
    assert_eq!(api.get("/v1/tenants/acme", &boss).await.status, StatusCode::NOT_FOUND);
    // Its administrator administers the tenant, and makes children below it.
    let child = api.post("/v1/tenants", &boss, json!({ "tenantId": "initech-ml", "name": "ML" })).await;
    assert_eq!(child.status, StatusCode::CREATED, "{:?}", child.body);
    assert_eq!(child.body["parentId"], "initech");
    let listed = api.get("/v1/tenants", &boss).await;
    let ids: Vec<&str> =
        listed.body["items"].as_array().expect("items").iter().filter_map(|t| t["id"].as_str()).collect();
    assert_eq!(ids, ["initech-ml"]);
    let dev =
        api.post("/v1/tenants/initech-ml/identities", &boss, json!({ "name": "dev@ml", "kind": "service" })).await;
    assert_eq!(dev.status, StatusCode::CREATED, "an ancestor's administrator: {:?}", dev.body);
    let dev_id = dev.body["id"].as_str().expect("id").to_owned();
    // An idempotency key makes a retry answer the same token, not a second one.
    let path = format!("/v1/tenants/initech-ml/identities/{dev_id}/tokens");
    let first = api.call("POST", &path, Some(&boss), &[("idempotency-key", "k1")], None).await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    let again = api.call("POST", &path, Some(&boss), &[("idempotency-key", "k1")], None).await;
    assert_eq!(again.status, StatusCode::OK, "{:?}", again.body);
    assert_eq!(again.body["token"], first.body["token"]);
    let other_key = api.call("POST", &path, Some(&boss), &[("idempotency-key", "k2")], None).await;
    assert_ne!(other_key.body["token"], first.body["token"], "another key is another token");
    let tokens = api.get(&path, &boss).await;
    assert_eq!(tokens.body["items"].as_array().map(Vec::len), Some(2), "{:?}", tokens.body);
    assert!(!tokens.body.to_string().contains(first.body["token"].as_str().expect("token")), "no secret is listed");
    // The identity's session kind is what its mutations record.
    let dev_token = first.body["token"].as_str().expect("token").to_owned();
    let project = api.post("/v1/projects", &dev_token, json!({ "name": "x" })).await;
    assert_eq!(project.status, StatusCode::FORBIDDEN, "not an administrator: {:?}", project.body);
    // Another customer sees none of it; the child's own identity cannot reach its parent.
    for uri in ["/v1/tenants/initech", "/v1/tenants/initech-ml", "/v1/tenants/initech/identities"] {
        assert_eq!(api.get(uri, GUS).await.status, StatusCode::NOT_FOUND, "{uri}");
        assert_eq!(
            api.get(uri, &dev_token).await.status,
            if uri.ends_with("-ml") { StatusCode::FORBIDDEN } else { StatusCode::NOT_FOUND },
            "{uri}"
        );
    }
    // Revoked, the token stops working on the next call.
    let token_id = first.body["id"].as_str().expect("id");
    let revoked = api.call("DELETE", &format!("{path}/{token_id}"), Some(&boss), &[], None).await;
    assert_eq!(revoked.status, StatusCode::OK, "{:?}", revoked.body);
    assert_eq!(api.get("/v1/pools", &dev_token).await.status, StatusCode::UNAUTHORIZED);
    // A deleted identity's tokens stop with it.
    let initech_boss = api.get("/v1/tenants/initech/identities", &boss).await;
    let boss_id = initech_boss.body["items"][0]["id"].as_str().expect("boss id").to_owned();
    let gone = api.call("DELETE", &format!("/v1/tenants/initech/identities/{boss_id}"), Some(ROOT), &[], None).await;
    assert_eq!(api.get("/v1/pools", other_key.body["token"].as_str().expect("token")).await.status, StatusCode::OK);
    assert_eq!(gone.status, StatusCode::OK, "{:?}", gone.body);
    assert_eq!(api.get("/v1/pools", &boss).await.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn without_a_pki_bundle_a_retried_token_issue_is_refused_rather_than_issuing_a_second_secret() {
    let api = Api::new().await;
    customer(&api, "wonka").await;
    let identity =
        api.get("/v1/tenants/wonka/identities", ROOT).await.body["items"][0]["id"].as_str().expect("id").to_owned();
    let path = format!("/v1/tenants/wonka/identities/{identity}/tokens");
    let first = api.call("POST", &path, Some(ROOT), &[("idempotency-key", "k")], None).await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    let again = api.call("POST", &path, Some(ROOT), &[("idempotency-key", "k")], None).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{:?}", again.body);
    assert!(again.body["error"]["message"].as_str().is_some_and(|m| m.contains("shown once")));
    let tokens = api.get(&path, ROOT).await;
    assert_eq!(
        tokens.body["items"].as_array().map(Vec::len),
        Some(2),
        "the customer's own and the first: {:?}",
        tokens.body
    );
}

#[tokio::test]
async fn a_suspended_tenant_starts_nothing_new_and_its_running_reservations_keep_running() {
    let api = Api::new().await;
    let pool = api.pool().await;
    let boss = customer(&api, "hooli").await;
    let offer = api
        .post(&format!("/v1/pools/{pool}/offers"), ROOT, json!({ "tenantId": "hooli", "quota": { "gpu": 8 } }))
        .await;
    assert_eq!(offer.status, StatusCode::OK, "{:?}", offer.body);
    let grant =
        api.post("/v1/tenants/hooli/grants", ROOT, json!({ "identity": "*", "pool": "*", "relation": "user" })).await;
    assert_eq!(grant.status, StatusCode::CREATED, "{:?}", grant.body);
    let placed = api.reserve(&boss, "before", reservation(&pool, 2)).await;
    assert_eq!(placed.status, StatusCode::CREATED, "{:?}", placed.body);
    let id = placed.body["id"].as_str().expect("id").to_owned();

    // A tenant never suspends itself; its parent's administrators do.
    let own = api.post("/v1/tenants/hooli/suspend", &boss, json!({ "reason": "self" })).await;
    assert_eq!(own.status, StatusCode::FORBIDDEN, "{:?}", own.body);
    let suspended = api.post("/v1/tenants/hooli/suspend", ROOT, json!({ "reason": "invoice overdue" })).await;
    assert_eq!(suspended.status, StatusCode::OK, "{:?}", suspended.body);
    assert_eq!(
        (suspended.body["state"].as_str(), suspended.body["suspendedReason"].as_str()),
        (Some("suspended"), Some("invoice overdue"))
    );

    let refused = api.reserve(&boss, "after", reservation(&pool, 1)).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{:?}", refused.body);
    assert_eq!(refused.body["error"]["code"], "TENANT_SUSPENDED");
    let project = api.post("/v1/projects", &boss, json!({ "name": "new" })).await;
    assert_eq!(project.body["error"]["code"], "TENANT_SUSPENDED", "{:?}", project.body);
    // What runs keeps running, and the tenant still reads it.
    let read = api.get(&format!("/v1/reservations/{id}"), &boss).await;
    assert_eq!((read.status, read.body["state"].as_str()), (StatusCode::OK, Some("placed")), "{:?}", read.body);
    // A bootstrap tenant is changed in its file only.
    let file = api.post("/v1/tenants/acme/suspend", ROOT, json!({})).await;
    assert_eq!(file.status, StatusCode::CONFLICT, "{:?}", file.body);

    let resumed = api.post("/v1/tenants/hooli/resume", ROOT, json!({})).await;
    assert_eq!(
        (resumed.status, resumed.body["state"].as_str()),
        (StatusCode::OK, Some("active")),
        "{:?}",
        resumed.body
    );
    let later = api.reserve(&boss, "after", reservation(&pool, 1)).await;
    assert_eq!(later.status, StatusCode::CREATED, "{:?}", later.body);
}

#[tokio::test]
async fn grants_and_limits_made_through_the_api_decide_the_next_reservation() {
    let api = Api::new().await;
    let pool = api.pool().await;
    let boss = customer(&api, "umbrella").await;
    api.post(&format!("/v1/pools/{pool}/offers"), ROOT, json!({ "tenantId": "umbrella", "quota": { "gpu": 8 } })).await;
    // Offered, the pool is only viewed until a grant says more.
    let viewer = api.reserve(&boss, "a", reservation(&pool, 1)).await;
    assert_eq!(viewer.status, StatusCode::FORBIDDEN, "{:?}", viewer.body);
    assert!(viewer.body["error"]["message"].as_str().is_some_and(|m| m.contains("needs the user relation")));
    let grant = api
        .post(
            "/v1/tenants/umbrella/grants",
            &boss,
            json!({ "identity": "boss@umbrella", "pool": pool, "relation": "user" }),
        )
        .await;
    assert_eq!(grant.status, StatusCode::CREATED, "{:?}", grant.body);
    assert_eq!(api.reserve(&boss, "b", reservation(&pool, 1)).await.status, StatusCode::CREATED);
    // The pool's owner limits its users; the limit decides the very next request.
    let limit = api.post(&format!("/v1/pools/{pool}/limits"), ROOT, json!({ "relation": "user", "maxGpus": 1 })).await;
    assert_eq!(limit.status, StatusCode::CREATED, "{:?}", limit.body);
    let over = api.reserve(&boss, "c", reservation(&pool, 2)).await;
    assert_eq!(over.status, StatusCode::FORBIDDEN, "{:?}", over.body);
    assert!(over.body["error"]["message"].as_str().is_some_and(|m| m.contains("at most 1")), "{:?}", over.body);
    // A customer cannot set limits on a pool it is only offered.
    let theirs =
        api.post(&format!("/v1/pools/{pool}/limits"), &boss, json!({ "relation": "user", "maxGpus": 99 })).await;
    assert_eq!(theirs.status, StatusCode::FORBIDDEN, "{:?}", theirs.body);
    let listed = api.get(&format!("/v1/pools/{pool}/limits"), &boss).await;
    assert_eq!(listed.body["items"].as_array().map(Vec::len), Some(1), "{:?}", listed.body);
    let limit_id = limit.body["id"].as_str().expect("id");
    let deleted = api.call("DELETE", &format!("/v1/pools/{pool}/limits/{limit_id}"), Some(ROOT), &[], None).await;
    assert_eq!(deleted.status, StatusCode::OK, "{:?}", deleted.body);
    assert_eq!(api.reserve(&boss, "e", reservation(&pool, 2)).await.status, StatusCode::CREATED);
    // Revoked, the grant no longer lets the identity reserve.
    let grant_id = grant.body["id"].as_str().expect("id");
    let revoked = api.call("DELETE", &format!("/v1/tenants/umbrella/grants/{grant_id}"), Some(&boss), &[], None).await;
    assert_eq!(revoked.status, StatusCode::OK, "{:?}", revoked.body);
    assert_eq!(api.reserve(&boss, "d", reservation(&pool, 1)).await.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn bad_tenancy_input_is_refused_naming_the_field_and_writes_nothing() {
    let api = Api::new().await;
    let pool = api.pool().await;
    let before = api.events().await;
    let cases: Vec<(&str, String, Value, StatusCode, &str)> = vec![
        (
            "POST",
            "/v1/tenants".into(),
            json!({ "tenantId": "bad id", "name": "x" }),
            StatusCode::BAD_REQUEST,
            "tenantId",
        ),
        ("POST", "/v1/tenants".into(), json!({ "tenantId": "ok", "name": "" }), StatusCode::BAD_REQUEST, "name"),
        ("POST", "/v1/tenants".into(), json!({ "tenantId": "ok", "name": "a\u{0}b" }), StatusCode::BAD_REQUEST, "name"),
        ("POST", "/v1/tenants".into(), json!({ "tenantId": "acme", "name": "again" }), StatusCode::CONFLICT, ""),
        (
            "POST",
            "/v1/tenants".into(),
            json!({ "tenantId": "ok", "name": "x", "colour": 1 }),
            StatusCode::BAD_REQUEST,
            "colour",
        ),
        (
            "POST",
            "/v1/tenants".into(),
            json!({ "tenantId": "ok", "parentId": "nope", "name": "x" }),
            StatusCode::NOT_FOUND,
            "",
        ),
        ("POST", "/v1/tenants/acme/identities".into(), json!({ "name": "two words" }), StatusCode::BAD_REQUEST, "name"),
        ("POST", "/v1/tenants/acme/identities".into(), json!({ "name": "alice@acme" }), StatusCode::CONFLICT, ""),
        (
            "POST",
            "/v1/tenants/acme/identities".into(),
            json!({ "name": "ok@acme", "kind": "robot" }),
            StatusCode::BAD_REQUEST,
            "kind",
        ),
        (
            "POST",
            "/v1/tenants/acme/grants".into(),
            json!({ "identity": "*", "pool": "*", "relation": "owner" }),
            StatusCode::BAD_REQUEST,
            "relation",
        ),
        (
            "POST",
            "/v1/tenants/acme/grants".into(),
            json!({ "identity": "nobody@acme", "pool": "*", "relation": "user" }),
            StatusCode::BAD_REQUEST,
            "identity",
        ),
        (
            "POST",
            "/v1/tenants/acme/grants".into(),
            json!({ "identity": "*", "pool": "pool_01m8q000000000000000000009", "relation": "user" }),
            StatusCode::BAD_REQUEST,
            "pool",
        ),
        ("POST", format!("/v1/pools/{pool}/limits"), json!({ "relation": "user" }), StatusCode::BAD_REQUEST, "maxGpus"),
        (
            "POST",
            format!("/v1/pools/{pool}/offers"),
            json!({ "tenantId": "nobody", "quota": { "gpu": 1 } }),
            StatusCode::BAD_REQUEST,
            "tenantId",
        ),
        (
            "POST",
            format!("/v1/pools/{pool}/limits"),
            json!({ "relation": "user", "maxHours": 87_601 }),
            StatusCode::BAD_REQUEST,
            "maxHours",
        ),
        (
            "POST",
            format!("/v1/pools/{pool}/limits"),
            json!({ "relation": "user", "maxGpus": -1 }),
            StatusCode::BAD_REQUEST,
            "maxGpus",
        ),
        (
            "POST",
            "/v1/tenants/acme/identities/idt_01m8q000000000000000000009/tokens".into(),
            json!({}),
            StatusCode::NOT_FOUND,
            "",
        ),
        (
            "DELETE",
            "/v1/tenants/acme/identities/bad/tokens/tok_01m8q000000000000000000009".into(),
            Value::Null,
            StatusCode::BAD_REQUEST,
            "identityId",
        ),
    ];
    for (method, uri, body, status, field) in cases {
        let body = (!body.is_null()).then(|| body.to_string());
        let reply = api.call(method, &uri, Some(ROOT), &[], body).await;
        assert_eq!(reply.status, status, "{method} {uri}: {:?}", reply.body);
        assert_eq!(reply.field(), field, "{method} {uri}: {:?}", reply.body);
    }
    // A customer administers nothing of another tenant, nor its own without being an administrator.
    let alice = api.post("/v1/tenants/acme/identities", ALICE, json!({ "name": "eve@acme", "admin": true })).await;
    assert_eq!(alice.status, StatusCode::FORBIDDEN, "{:?}", alice.body);
    let gus = api.post("/v1/tenants/acme/identities", GUS, json!({ "name": "eve@acme" })).await;
    assert_eq!(gus.status, StatusCode::NOT_FOUND, "{:?}", gus.body);
    assert_eq!(api.events().await, before, "nothing was written");
}

#[tokio::test]
async fn another_process_takes_a_new_token_and_refuses_a_revoked_one_within_a_second() {
    let api = Api::new().await;
    // A second process over the same database: its own authorizer, kept current by following the log.
    let auth = Arc::new(BuiltinAuthorizer::from_toml(AUTH).expect("auth config"));
    let app = bc_commands::App::new(api.fleet.t.db.clone()).with_authorizer(auth);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let follower = app.clone();
    let following = tokio::spawn(async move { follower.follow_tenancy(stopped).await });
    let other = router(AppState::new(app).expect("state"));

    let token = customer(&api, "stark").await;
    wait_for(&other, &token, StatusCode::OK).await;
    let identity =
        api.get("/v1/tenants/stark/identities", ROOT).await.body["items"][0]["id"].as_str().expect("id").to_owned();
    let tokens = api.get(&format!("/v1/tenants/stark/identities/{identity}/tokens"), ROOT).await;
    let token_id = tokens.body["items"][0]["id"].as_str().expect("token id").to_owned();
    let path = format!("/v1/tenants/stark/identities/{identity}/tokens/{token_id}");
    assert_eq!(api.call("DELETE", &path, Some(ROOT), &[], None).await.status, StatusCode::OK);
    wait_for(&other, &token, StatusCode::UNAUTHORIZED).await;
    let _ = stop.send(true);
    following.await.expect("the follower stops");
}

/// Waits until `token` is answered `status` by `router` (a few seconds at most).
async fn wait_for(router: &axum::Router, token: &str, status: StatusCode) {
    use tower::ServiceExt as _;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let request = axum::http::Request::builder()
            .uri("/v1/pools")
            .header("authorization", format!("Bearer {token}"))
            .body(axum::body::Body::empty())
            .expect("request");
        let got = router.clone().oneshot(request).await.expect("response").status();
        if got == status {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "still {got}, not {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_is_known_as_soon_as_its_create_answers_while_the_follower_reloads() {
    // The follower (`follow_tenancy`) reloads the authorizer from the tables each second; here four tasks do so
    // without pause. A reload that read the tables before a create committed must not land after the
    // create's own reload: the next request would not know the tenant its create just answered.
    let fleet = bc_commands::testing::Fleet::new().await;
    let auth = Arc::new(BuiltinAuthorizer::from_toml(AUTH).expect("auth config"));
    let app = bc_commands::App::new(fleet.t.db.clone()).with_authorizer(auth);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut followers = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (app, stopped) = (app.clone(), stopped.clone());
        followers.spawn(async move {
            while !*stopped.borrow() {
                app.refresh_tenancy().await.expect("reload");
            }
        });
    }
    let root = bc_commands::testing::caller("root", "root@root");
    let parent: bc_domain::id::TenantId = "root".parse().expect("root");
    for n in 0..200 {
        let id: bc_domain::id::TenantId = format!("customer-{n}").parse().expect("an id");
        app.create_tenant(&root, &id, &parent, "Customer").await.expect("the create answers the tenant");
        assert!(app.get_tenant(&id).is_ok(), "{id} is unknown right after its create answered");
    }
    stop.send(true).expect("stop");
    while let Some(done) = followers.join_next().await {
        done.expect("a follower");
    }
}
