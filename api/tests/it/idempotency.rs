//! `Idempotency-Key` on every create route: a retry is answered the first answer without running again, the
//! same key with another request is refused, a refused request gives its key back, and an answer holding a
//! secret is kept only sealed.

use axum::http::StatusCode;
use serde_json::json;

use crate::http_api::{Api, ROOT};

#[tokio::test]
async fn a_retried_create_is_answered_the_first_answer_and_runs_once() {
    let api = Api::new().await;
    let body = json!({ "name": "ams1", "iamRegion": "eu-west-1" }).to_string();
    let key = [("idempotency-key", "site-ams1")];
    let first = api.call("POST", "/v1/sites", Some(ROOT), &key, Some(body.clone())).await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    let events = api.events().await;
    let again = api.call("POST", "/v1/sites", Some(ROOT), &key, Some(body.clone())).await;
    assert_eq!((again.status, &again.body), (StatusCode::CREATED, &first.body));
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.header("x-position"), first.header("x-position"));
    assert_eq!(api.events().await, events, "the retry ran nothing");
    // The same key with another body, or on another route, is refused and writes nothing.
    let other = json!({ "name": "ams2", "iamRegion": "eu-west-1" }).to_string();
    let reused = api.call("POST", "/v1/sites", Some(ROOT), &key, Some(other)).await;
    assert_eq!(reused.status, StatusCode::CONFLICT, "{:?}", reused.body);
    assert_eq!(reused.body["error"]["code"], "IDEMPOTENCY_KEY_REUSED");
    let elsewhere = api.call("POST", "/v1/projects", Some(ROOT), &key, Some(json!({ "name": "p" }).to_string())).await;
    assert_eq!(elsewhere.body["error"]["code"], "IDEMPOTENCY_KEY_REUSED", "{:?}", elsewhere.body);
    assert_eq!(api.events().await, events);
    // Without a key, the same body is a second request, refused on its own merits.
    let unkeyed = api.call("POST", "/v1/sites", Some(ROOT), &[], Some(body)).await;
    assert_eq!(unkeyed.status, StatusCode::CONFLICT, "the name is taken: {:?}", unkeyed.body);
}

#[tokio::test]
async fn a_refused_create_gives_its_key_back_for_the_corrected_request() {
    let api = Api::new().await;
    let key = [("idempotency-key", "k")];
    let bad = api
        .call("POST", "/v1/sites", Some(ROOT), &key, Some(json!({ "name": "x", "iamRegion": "Mars" }).to_string()))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{:?}", bad.body);
    let good = api
        .call("POST", "/v1/sites", Some(ROOT), &key, Some(json!({ "name": "x", "iamRegion": "eu-west-1" }).to_string()))
        .await;
    assert_eq!(good.status, StatusCode::CREATED, "{:?}", good.body);
    let long = "k".repeat(256);
    let too_long = api.call("POST", "/v1/sites", Some(ROOT), &[("idempotency-key", &long)], Some("{}".into())).await;
    assert_eq!((too_long.status, too_long.field()), (StatusCode::BAD_REQUEST, "Idempotency-Key"));
}

#[tokio::test]
async fn a_join_token_retry_answers_the_same_secret_only_when_it_can_be_kept_sealed() {
    for sealed in [true, false] {
        let api = if sealed { Api::with_pki().await } else { Api::new().await };
        let pool = api.pool().await;
        let path = format!("/v1/pools/{pool}/join-tokens");
        let key = [("idempotency-key", "rack-7")];
        let first = api.call("POST", &path, Some(ROOT), &key, Some("{}".into())).await;
        assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
        let again = api.call("POST", &path, Some(ROOT), &key, Some("{}".into())).await;
        if sealed {
            assert_eq!((again.status, &again.body["token"]), (StatusCode::CREATED, &first.body["token"]));
        } else {
            assert_eq!(again.status, StatusCode::CONFLICT, "{:?}", again.body);
            assert!(again.body["error"]["message"].as_str().is_some_and(|m| m.contains("shown once")));
        }
        // Nowhere is the secret kept in the clear.
        let mut tx = api.fleet.t.db.begin(bc_eventstore::TxOptions::READ_ONLY).await.expect("begin");
        let kept: Vec<Option<Vec<u8>>> = bc_eventstore::sql::query_scalar("SELECT answer FROM idempotency_keys")
            .fetch_all(tx.conn())
            .await
            .expect("answers");
        tx.commit().await.expect("commit");
        let secret = first.body["token"].as_str().expect("token").as_bytes().to_vec();
        assert!(kept.iter().flatten().all(|a| !a.windows(secret.len()).any(|w| w == secret)), "sealed: {sealed}");
    }
}

#[tokio::test]
async fn every_create_route_documents_its_idempotency_key_and_the_layer_keeps_its_answers() {
    let api = Api::new().await;
    let doc = api.call("GET", "/v1/openapi.json", None, &[], None).await;
    let kept = |method: Option<&str>| bc_api::http::idempotency::CREATES.iter().any(|(m, _)| Some(*m) == method);
    for route in bc_api::http::routes().iter().filter(|r| r.http == "POST") {
        let post = &doc.body["paths"][route.path.as_str()]["post"];
        let id = post["operationId"].as_str().unwrap_or("");
        // Reservations, instances and bearer tokens derive their ids from the key; every other create keeps its
        // answer in the idempotency layer, and says so in the document.
        let own = matches!(route.method, Some("reservations.create" | "instances.create" | "tokens.create"));
        let documented = post["parameters"]
            .as_array()
            .is_some_and(|ps| ps.iter().any(|p| p["name"] == "Idempotency-Key" && p["in"] == "header"));
        let what = format!("POST {} ({id})", route.path);
        assert_eq!(documented, own || kept(route.method), "{what}: documented, yet the layer keeps nothing?");
        // A ticket is issued, not created: nothing is written, so nothing is kept for a retry.
        assert!(!id.starts_with("create_") || documented, "{what} creates something without an Idempotency-Key");
    }
    // Each method the layer serves is a routed create.
    for (method, _) in bc_api::http::idempotency::CREATES {
        assert!(bc_api::http::routes().iter().any(|r| r.http == "POST" && r.method == Some(*method)), "{method}");
    }
}
