//! Flavors through the API: sizes checked field by field, a tenant's own and the public ones, and publishing
//! reserved to the platform.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::http_api::{ALICE, Api, GUS, ROOT};

fn flavor(name: &str, visibility: &str) -> Value {
    json!({ "name": name, "vcpu": 16, "memoryGiB": 128, "gpus": 1, "disk": 200, "visibility": visibility })
}

fn names(reply: &Value) -> Vec<String> {
    reply["items"].as_array().expect("items").iter().map(|f| f["name"].as_str().expect("name").to_owned()).collect()
}

#[tokio::test]
async fn flavors_are_checked_shared_when_public_and_private_otherwise() {
    let api = Api::new().await;
    let before = api.events().await;
    for (key, value, field) in [
        ("vcpu", json!(0), "vcpu"),
        ("memoryGiB", json!(65_537), "memoryGiB"),
        ("gpus", json!(65), "gpus"),
        ("disk", json!(0), "disk"),
        ("name", json!(""), "name"),
    ] {
        let mut body = flavor("bad", "private");
        body[key] = value;
        let refused = api.post("/v1/flavors", ROOT, body.clone()).await;
        assert_eq!((refused.status, refused.field()), (StatusCode::BAD_REQUEST, field), "{body}: {:?}", refused.body);
    }
    let mut unknown = flavor("bad", "private");
    unknown["gpu"] = json!(1);
    assert_eq!(api.post("/v1/flavors", ROOT, unknown).await.status, StatusCode::BAD_REQUEST, "unknown keys");
    let published = api.post("/v1/flavors", ALICE, flavor("mine", "public")).await;
    assert_eq!(published.status, StatusCode::FORBIDDEN, "only the platform publishes: {:?}", published.body);
    assert_eq!(api.events().await, before, "refusals record nothing");

    let shared = api.post("/v1/flavors", ROOT, flavor("g1.large", "public")).await;
    assert_eq!(shared.status, StatusCode::CREATED, "{:?}", shared.body);
    assert!(shared.body["id"].as_str().is_some_and(|id| id.starts_with("flv_")), "{:?}", shared.body);
    assert_eq!(shared.body["memoryGiB"], 128);
    let internal = api.post("/v1/flavors", ROOT, flavor("internal", "private")).await;
    assert_eq!(internal.status, StatusCode::CREATED, "{:?}", internal.body);
    let internal_id = internal.body["id"].as_str().expect("id").to_owned();
    let taken = api.post("/v1/flavors", ROOT, flavor("internal", "private")).await;
    assert_eq!(taken.status, StatusCode::CONFLICT, "one name per tenant: {:?}", taken.body);

    // acme sees the public flavor, not the platform's private one.
    let seen = api.get("/v1/flavors", ALICE).await;
    assert_eq!(names(&seen.body), ["g1.large"], "{:?}", seen.body);
    assert_eq!(api.get(&format!("/v1/flavors/{internal_id}"), ALICE).await.status, StatusCode::NOT_FOUND);
    let shared_id = shared.body["id"].as_str().expect("id");
    assert_eq!(api.get(&format!("/v1/flavors/{shared_id}"), GUS).await.status, StatusCode::OK);
    let mut all = names(&api.get("/v1/flavors", ROOT).await.body);
    all.sort();
    assert_eq!(all, ["g1.large", "internal"]);

    // Only its tenant deletes a flavor; then its name is free.
    let other = api.call("DELETE", &format!("/v1/flavors/{shared_id}"), Some(ALICE), &[], None).await;
    assert!(matches!(other.status, StatusCode::NOT_FOUND | StatusCode::FORBIDDEN), "{:?}", other.body);
    let gone = api.call("DELETE", &format!("/v1/flavors/{internal_id}"), Some(ROOT), &[], None).await;
    assert_eq!(gone.status, StatusCode::OK, "{:?}", gone.body);
    assert_eq!(api.get(&format!("/v1/flavors/{internal_id}"), ROOT).await.status, StatusCode::NOT_FOUND);
    assert_eq!(api.post("/v1/flavors", ROOT, flavor("internal", "private")).await.status, StatusCode::CREATED);
}
