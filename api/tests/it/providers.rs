//! Provider accounts through the API: the credential sealed and never shown, a provider pool that must name a
//! live account of its owner, and an account that is not deleted while a pool names it.

use axum::http::StatusCode;
use bc_eventstore::{TxOptions, sql};
use serde_json::{Value, json};

use crate::http_api::{ALICE, Api, ROOT};

const SECRET: &str = "bc-remote-token-0123456789";

fn account(name: &str) -> Value {
    json!({ "name": name, "provider": "better-compute", "endpoint": "https://compute.partner.example",
            "credential": SECRET, "settings": { "poolId": "pool_01jd8w2k3m4n5p6q7r8s9t0v1w" } })
}

/// Whether the secret appears anywhere in the log or in the sealed secrets' table, in the clear.
async fn secret_in_the_clear(api: &Api, secret: &str) -> i64 {
    let mut tx = api.fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let found: i64 = sql::query_scalar(
        "SELECT (SELECT count(*) FROM events WHERE position(convert_to($1, 'UTF8') in payload) > 0
                                              OR position(convert_to($1, 'UTF8') in metadata) > 0)
              + (SELECT count(*) FROM sealed_secrets WHERE position(convert_to($1, 'UTF8') in sealed) > 0)
              + (SELECT count(*) FROM provider_accounts WHERE endpoint LIKE '%' || $1 || '%'
                                                         OR settings::text LIKE '%' || $1 || '%')",
    )
    .bind(secret)
    .fetch_one(tx.conn())
    .await
    .expect("search");
    tx.commit().await.expect("commit");
    found
}

#[tokio::test]
async fn a_provider_account_keeps_its_credential_sealed_and_backs_provider_pools() {
    let api = Api::with_pki().await;
    let site = api.post("/v1/sites", ROOT, json!({ "name": "ams1", "iamRegion": "eu-west-1" })).await;
    let site_id = site.body["id"].as_str().expect("site").to_owned();

    // Bad input is refused naming the field, and records nothing.
    let before = api.events().await;
    let mut cases: Vec<(Value, &str)> = Vec::new();
    for (key, value, field) in [
        ("provider", json!("aws"), "provider"),
        ("endpoint", json!("http://compute.partner.example"), "endpoint"),
        ("endpoint", json!("https://user:pw@compute.partner.example"), "endpoint"),
        ("credential", json!(""), "credential"),
        ("name", json!(""), "name"),
        ("settings", json!({ "poolId": "gpus" }), "settings.poolId"),
    ] {
        let mut body = account("partner");
        body[key] = value;
        cases.push((body, field));
    }
    for (body, field) in cases {
        let refused = api.post("/v1/provider-accounts", ROOT, body.clone()).await;
        assert_eq!((refused.status, refused.field()), (StatusCode::BAD_REQUEST, field), "{body}: {:?}", refused.body);
    }
    let forbidden = api.post("/v1/provider-accounts", ALICE, account("mine")).await;
    assert_eq!(forbidden.status, StatusCode::FORBIDDEN, "alice administers nothing: {:?}", forbidden.body);
    assert_eq!(api.events().await, before);

    let made = api.post("/v1/provider-accounts", ROOT, account("partner")).await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
    let id = made.body["id"].as_str().expect("id").to_owned();
    assert!(id.starts_with("pacct_"), "{id}");
    assert_eq!(made.header("location"), Some(format!("/v1/provider-accounts/{id}").as_str()));
    assert!(!made.body.to_string().contains(SECRET), "the credential is never shown: {}", made.body);
    assert_eq!(made.body["settings"]["poolId"], "pool_01jd8w2k3m4n5p6q7r8s9t0v1w");
    assert_eq!(secret_in_the_clear(&api, SECRET).await, 0, "sealed, and in no event");
    assert_eq!(api.app().provider_credential(&id.parse().expect("id")).await.expect("open"), Some(SECRET.to_owned()));
    let again = api.post("/v1/provider-accounts", ROOT, account("partner")).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "one name per tenant: {:?}", again.body);

    let listed = api.get("/v1/provider-accounts", ROOT).await;
    assert_eq!(listed.body["items"].as_array().map(Vec::len), Some(1), "{:?}", listed.body);
    let other = api.get(&format!("/v1/provider-accounts/{id}"), ALICE).await;
    assert_eq!(other.status, StatusCode::NOT_FOUND, "another tenant's account does not exist for acme");
    let rotated =
        api.post(&format!("/v1/provider-accounts/{id}/credential"), ROOT, json!({ "credential": "next" })).await;
    assert_eq!(rotated.status, StatusCode::OK, "{:?}", rotated.body);
    assert_eq!(api.app().provider_credential(&id.parse().expect("id")).await.expect("open"), Some("next".to_owned()));

    // A provider pool names a live account of its owner, and runs no agent.
    let pool = |account: &str, agent: &str| {
        json!({ "siteId": site_id, "name": format!("borrowed-{agent}"), "class": "provider", "gpuModel": "H100",
                "agent": agent, "providerAccountId": account })
    };
    let missing = api.post("/v1/pools", ROOT, pool("pacct_01jd8w2k3m4n5p6q7r8s9t0v1w", "none")).await;
    assert_eq!((missing.status, missing.field()), (StatusCode::BAD_REQUEST, "providerAccountId"), "{:?}", missing.body);
    let with_agent = api.post("/v1/pools", ROOT, pool(&id, "bcd")).await;
    assert_eq!((with_agent.status, with_agent.field()), (StatusCode::BAD_REQUEST, "agent"), "{:?}", with_agent.body);
    let backed = api.post("/v1/pools", ROOT, pool(&id, "none")).await;
    assert_eq!(backed.status, StatusCode::CREATED, "{:?}", backed.body);
    let pool_id = backed.body["id"].as_str().expect("pool").to_owned();

    let refused = api.call("DELETE", &format!("/v1/provider-accounts/{id}"), Some(ROOT), &[], None).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{:?}", refused.body);
    assert!(refused.body["error"]["message"].as_str().is_some_and(|m| m.contains(&pool_id)), "{:?}", refused.body);
    let gone = api.call("DELETE", &format!("/v1/pools/{pool_id}"), Some(ROOT), &[], None).await;
    assert_eq!(gone.status, StatusCode::OK, "{:?}", gone.body);
    let deleted = api.call("DELETE", &format!("/v1/provider-accounts/{id}"), Some(ROOT), &[], None).await;
    assert_eq!(deleted.status, StatusCode::OK, "{:?}", deleted.body);
    assert_eq!(api.get(&format!("/v1/provider-accounts/{id}"), ROOT).await.status, StatusCode::NOT_FOUND);
    assert_eq!(api.app().provider_credential(&id.parse().expect("id")).await.expect("open"), None, "its secret went");
    let reused = api.post("/v1/provider-accounts", ROOT, account("partner")).await;
    assert_eq!(reused.status, StatusCode::CREATED, "the name is free again: {:?}", reused.body);
}

#[tokio::test]
async fn without_a_pki_bundle_no_account_is_made() {
    let api = Api::new().await;
    let before = api.events().await;
    let refused = api.post("/v1/provider-accounts", ROOT, account("partner")).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{:?}", refused.body);
    assert!(refused.body["error"]["message"].as_str().is_some_and(|m| m.contains("PKI bundle")), "{:?}", refused.body);
    assert_eq!(api.events().await, before);
}

/// The built-in `better-compute` provider driver, served out of process's way (over the driver protocol's mutual
/// TLS, with identities the PKI bundle issues), passes the conformance suite against a real lending deployment:
/// it borrows one GPU there as a reservation of the account's tenant, and gives it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_better_compute_driver_borrows_from_a_lending_deployment_and_passes_the_conformance_suite() {
    use reqwest::Method;
    bc_pki::tls::install_default_provider();
    // The lender is a real `better-compute serve` process on its own database.
    let lender = crate::agents::Cluster::start_process("lender").await;
    let gpus: Vec<Value> = (0..2)
        .map(|g| json!({ "uuid": format!("GPU-lent-{g}"), "name": "NVIDIA H100 80GB HBM3", "memoryMib": 81559 }))
        .collect();
    let node = json!({ "poolId": lender.pool, "name": "lent-1", "role": "host", "trust": "platform", "gpus": gpus });
    let (status, body) = lender.call(Method::POST, "/v1/nodes", Some(node)).await;
    assert_eq!(status, 201, "{body}");
    let offer = json!({ "tenantId": "acme", "quota": { "gpu": 2 } });
    let (status, body) = lender.call(Method::POST, &format!("/v1/pools/{}/offers", lender.pool), Some(offer)).await;
    assert!(status < 300, "{body}");

    // The driver's and the control plane's identities, from the borrowing side's bundle.
    let dir = lender.root.path().join("borrower-pki");
    let bundle = bc_pki::Bundle::init(&dir, &bc_pki::InitOptions::default()).expect("bundle");
    let hosts = ["127.0.0.1".to_owned()];
    let issue = |name: &str| {
        let (cert_pem, key_pem) = bundle.issue_driver_identity(name, &hosts).expect("identity");
        bcx::tls::Identity { ca_pem: bundle.ca_pem().to_owned(), cert_pem, key_pem }
    };
    let (driver_identity, caller) = (issue("better-compute"), issue("control-plane"));
    let driver = bcx::better_compute::BetterCompute::new(Some(&lender.ca)).expect("driver");
    let driver = bcx::server::Driver::provider(bcx::better_compute::NAME, "test", driver);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("https://127.0.0.1:{}", listener.local_addr().expect("addr").port());
    tokio::spawn(async move { bcx::server::serve(listener, &driver_identity, driver, std::future::pending()).await });

    let client = bcx::client::DriverClient::new(&url, &caller).expect("client");
    let setup = bcx::conformance::Setup {
        account: bcx::protocol::Account {
            account_id: "pacct_test".into(),
            endpoint: lender.base.clone(),
            settings: [("poolId".to_owned(), lender.pool.to_string())].into(),
            credential: ALICE.to_owned(),
        },
        gpu_model: "H100".into(),
        key: "conformance-1".into(),
        patience: std::time::Duration::from_secs(30),
    };
    let passed = bcx::conformance::provider(&client, &setup).await.expect("the conformance suite");
    assert!(passed.len() >= 8, "{passed:?}");

    // At the lender, the machine was acme's reservation of one GPU, given back.
    let mut tx = lender.db().begin(TxOptions::READ_ONLY).await.expect("begin");
    let rows: Vec<(String, String, i32)> =
        sql::query_as("SELECT tenant_id, state, count FROM reservations WHERE pool_id = $1")
            .bind(lender.pool.as_str())
            .fetch_all(tx.conn())
            .await
            .expect("reservations");
    tx.commit().await.expect("commit");
    assert_eq!(rows.len(), 1, "one machine, one reservation, however often it was asked for: {rows:?}");
    assert_eq!(rows[0].0, "acme");
    assert!(["released", "releasing", "cancelled"].contains(&rows[0].1.as_str()), "{rows:?}");
    assert_eq!(rows[0].2, 1);

    // A wrong credential is refused as the lender refuses it.
    let mut wrong = setup.clone();
    wrong.account.credential = "not-a-token-0000000000".into();
    wrong.key = "conformance-2".into();
    let refused = bcx::conformance::provider(&client, &wrong).await.expect_err("a wrong credential");
    assert!(refused.why.contains("Unauthenticated"), "{refused}");
}

/// Two real deployments on two databases: a reservation in the borrowing one's provider pool waits, its provider
/// round acquires a machine at the lending one (a reservation of the account's tenant there), registers it as a
/// node, and the reservation is placed on it; released, the machine is given back and its node removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_pool_borrows_a_machine_from_another_deployment_and_gives_it_back() {
    use reqwest::Method;
    bc_pki::tls::install_default_provider();
    let mut lender = crate::agents::Cluster::start_process("lends").await;
    let gpus: Vec<Value> = (0..2)
        .map(|g| json!({ "uuid": format!("GPU-lends-{g}"), "name": "NVIDIA H100 80GB HBM3", "memoryMib": 81559 }))
        .collect();
    let node = json!({ "poolId": lender.pool, "name": "lends-1", "role": "host", "trust": "platform", "gpus": gpus });
    let (status, body) = lender.call(Method::POST, "/v1/nodes", Some(node)).await;
    assert_eq!(status, 201, "{body}");
    let offer = json!({ "tenantId": "acme", "quota": { "gpu": 2 } });
    let (status, body) = lender.call(Method::POST, &format!("/v1/pools/{}/offers", lender.pool), Some(offer)).await;
    assert!(status < 300, "{body}");

    // The borrower trusts the lender's CA (the tests' deployments share one).
    let ca = crate::process::test_pki().join("ca.crt").display().to_string();
    let borrower = crate::agents::Cluster::start_process_with("borrows", vec!["--provider-trust".into(), ca]).await;
    let account = json!({ "name": "lends", "provider": "better-compute", "endpoint": lender.base, "credential": ALICE,
                           "settings": { "poolId": lender.pool } });
    let (status, account) = borrower.call(Method::POST, "/v1/provider-accounts", Some(account)).await;
    assert_eq!(status, 201, "{account}");
    let mut tx = borrower.db().begin(TxOptions::READ_ONLY).await.expect("begin");
    let site: String = sql::query_scalar("SELECT site_id FROM pools WHERE id = $1")
        .bind(borrower.pool.as_str())
        .fetch_one(tx.conn())
        .await
        .expect("site");
    tx.commit().await.expect("commit");
    let pool = json!({ "siteId": site, "name": "borrowed", "class": "provider", "gpuModel": "H100", "agent": "none",
                       "providerAccountId": account["id"] });
    let (status, pool) = borrower.call(Method::POST, "/v1/pools", Some(pool)).await;
    assert_eq!(status, 201, "{pool}");
    let pool = pool["id"].as_str().expect("pool").to_owned();

    // The pool is empty: the reservation waits, and is placed on the machine borrowed for it, though the lender
    // is killed (SIGKILL) when it is asked and comes back only after the borrower's round failed to reach it.
    lender.kill_server();
    let reserve = json!({ "poolId": pool, "devices": { "class": "gpu", "count": 1 }, "duration": 3600 });
    let made = borrower
        .http
        .post(format!("{}/v1/reservations", borrower.base))
        .bearer_auth(ROOT)
        .header("idempotency-key", "borrow-1")
        .json(&reserve)
        .send()
        .await
        .expect("reserve");
    assert_eq!(made.status().as_u16(), 201);
    let made: Value = made.json().await.expect("body");
    assert_eq!(made["state"], "pending", "{made}");
    let id = made["id"].as_str().expect("id").to_owned();
    let round = format!("pool:{pool}:provider");
    crate::agents::eventually("a provider round that could not reach the lender", || async {
        let mut tx = borrower.db().begin(TxOptions::READ_ONLY).await.expect("begin");
        let later: bool =
            sql::query_scalar("SELECT count(*) > 0 FROM work_queue WHERE key = $1 AND not_before > compute_now()")
                .bind(&round)
                .fetch_one(tx.conn())
                .await
                .expect("work queue");
        tx.commit().await.expect("commit");
        later.then_some(())
    })
    .await;
    lender.start_server();
    borrower.await_reservation(&id, "active").await;
    let rows = |cluster: &crate::agents::Cluster, query: &'static str, pool: String| {
        let db = cluster.db().clone();
        async move {
            let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
            let rows: Vec<(String, String)> = sql::query_as(query).bind(pool).fetch_all(tx.conn()).await.expect("rows");
            tx.commit().await.expect("commit");
            rows
        }
    };
    let lent =
        rows(&lender, "SELECT tenant_id, state FROM reservations WHERE pool_id = $1", lender.pool.to_string()).await;
    assert_eq!(lent.len(), 1, "{lent:?}");
    assert_eq!(lent[0].0, "acme", "borrowed as the account's tenant: {lent:?}");
    let nodes = rows(&borrower, "SELECT id, name FROM nodes WHERE pool_id = $1", pool.clone()).await;
    assert_eq!(nodes.len(), 1, "the machine is a node of the provider pool: {nodes:?}");
    assert!(nodes[0].1.starts_with("rsv_"), "named by its machine at the lender: {nodes:?}");

    // Released here, the machine goes back there and its node goes.
    let (status, body) = borrower.call(Method::POST, &format!("/v1/reservations/{id}/release"), Some(json!({}))).await;
    assert_eq!(status, 200, "{body}");
    borrower.await_reservation(&id, "released").await;
    let lender_state = || async {
        let lent =
            rows(&lender, "SELECT tenant_id, state FROM reservations WHERE pool_id = $1", lender.pool.to_string())
                .await;
        lent.first().filter(|(_, state)| ["released", "releasing"].contains(&state.as_str())).cloned()
    };
    crate::agents::eventually("the machine given back at the lender", lender_state).await;
    let machine = || async {
        let held =
            rows(&borrower, "SELECT machine_id, state FROM provider_machines WHERE pool_id = $1", pool.clone()).await;
        held.first().filter(|(_, state)| state == "released").cloned()
    };
    crate::agents::eventually("the machine recorded as given back", machine).await;

    // An account whose credential the lender refuses: the waiting reservation fails, saying why, and nothing is
    // borrowed.
    let account = json!({ "name": "refused", "provider": "better-compute", "endpoint": lender.base,
                           "credential": "not-a-token-of-the-lender", "settings": { "poolId": lender.pool } });
    let (status, account) = borrower.call(Method::POST, "/v1/provider-accounts", Some(account)).await;
    assert_eq!(status, 201, "{account}");
    let refused = json!({ "siteId": site, "name": "refused", "class": "provider", "gpuModel": "H100", "agent": "none",
                          "providerAccountId": account["id"] });
    let (status, refused) = borrower.call(Method::POST, "/v1/pools", Some(refused)).await;
    assert_eq!(status, 201, "{refused}");
    let reserve = json!({ "poolId": refused["id"], "devices": { "class": "gpu", "count": 1 }, "duration": 3600 });
    let made = borrower
        .http
        .post(format!("{}/v1/reservations", borrower.base))
        .bearer_auth(ROOT)
        .header("idempotency-key", "borrow-2")
        .json(&reserve)
        .send()
        .await
        .expect("reserve");
    let made: Value = made.json().await.expect("body");
    let id = made["id"].as_str().expect("id").to_owned();
    borrower.await_reservation(&id, "failed").await;
    let (_, failed) = borrower.call(Method::GET, &format!("/v1/reservations/{id}"), None).await;
    assert_eq!(failed["outcome"], "provider-refused", "{failed}");
    let lent =
        rows(&lender, "SELECT tenant_id, state FROM reservations WHERE pool_id = $1", lender.pool.to_string()).await;
    assert_eq!(lent.len(), 1, "nothing more borrowed, nothing double-booked: {lent:?}");
}
