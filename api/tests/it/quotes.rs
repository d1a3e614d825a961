//! Quote, then book: `POST /v1/pools/{id}/quotes` answers the exact devices and window a request would get, and
//! booking its `reserve` body gets exactly those, or `409 QUOTE_STALE` naming what changed with nothing written.

use axum::http::StatusCode;
use bc_domain::id::{NodeId, PoolId};
use bc_domain::pool::Sharing;
use bc_projections::testing::catch_up;
use serde_json::{Value, json};

use crate::http_api::{ALICE, Api, GUS, ROOT, Reply};
use bc_commands::testing::{HOUR, T0};

/// A pool of two 8-GPU nodes offered to acme and globex with `quota` GPUs each.
async fn pool(api: &Api, quota: u32) -> (PoolId, NodeId, NodeId) {
    let pool = api.fleet.pool("h100", Sharing::Exclusive, None).await;
    let a = api.fleet.node(&pool, "a", 8, 0).await;
    let b = api.fleet.node(&pool, "b", 8, 0).await;
    api.fleet.offer(&pool, "acme", quota).await;
    api.fleet.offer(&pool, "globex", quota).await;
    (pool, a, b)
}

async fn quote(api: &Api, token: &str, pool: &PoolId, body: Value) -> Reply {
    api.post(&format!("/v1/pools/{pool}/quotes"), token, body).await
}

/// A quote's allocations as (node, devices), in node order.
fn allocations(body: &Value) -> Vec<(String, Vec<String>)> {
    let mut found: Vec<(String, Vec<String>)> = body["allocations"]
        .as_array()
        .expect("allocations")
        .iter()
        .map(|a| {
            let devices = a["devices"].as_array().expect("devices").iter();
            (
                a["nodeId"].as_str().expect("node").to_owned(),
                devices.map(|d| d.as_str().expect("id").to_owned()).collect(),
            )
        })
        .collect();
    found.sort();
    found
}

/// The caller's reservations, once the read models caught up.
async fn listed(api: &Api, token: &str) -> Value {
    catch_up(&api.fleet.t.db).await;
    api.get("/v1/reservations", token).await.body["items"].clone()
}

#[tokio::test]
async fn a_quote_writes_nothing_and_its_booking_gets_exactly_the_quoted_devices_once() {
    let api = Api::new().await;
    let (pool, ..) = pool(&api, 16).await;
    let before = api.events().await;
    let quoted =
        quote(&api, ALICE, &pool, json!({ "devices": { "class": "gpu", "count": 3 }, "duration": 3600 })).await;
    assert_eq!(quoted.status, StatusCode::OK, "{:?}", quoted.body);
    assert_eq!(api.events().await, before, "a quote writes nothing");
    assert_eq!((quoted.body["start"].as_i64(), quoted.body["end"].as_i64()), (Some(T0), Some(T0 + HOUR)));
    assert_eq!(quoted.body["expiresAt"].as_i64(), Some(T0 + 5 * 60_000));
    let devices = allocations(&quoted.body);
    assert_eq!(devices.len(), 1, "same-node: one node holds all three: {devices:?}");
    assert_eq!(devices[0].1.len(), 3);
    let reserve = quoted.body["reserve"].clone();
    assert_eq!(reserve["quote"], quoted.body["quote"], "the body that books it carries the token");
    assert!(reserve["start"].is_null(), "a window that starts now starts when booked: {reserve}");

    let booked = api.reserve(ALICE, "book-1", reserve.clone()).await;
    assert_eq!(booked.status, StatusCode::CREATED, "{:?}", booked.body);
    assert_eq!(booked.body["state"], "placed");
    assert_eq!(allocations(&booked.body), devices, "exactly the quoted devices");
    assert_eq!(booked.body["start"].as_i64(), Some(T0));
    // Its placement is explained as the quote's.
    let id = booked.body["id"].as_str().expect("id");
    let explained = api.get(&format!("/v1/reservations/{id}/explanation"), ALICE).await;
    assert_eq!(explained.status, StatusCode::OK, "{:?}", explained.body);
    assert_eq!(explained.body["explanation"]["tiers"][0]["tier"], "quote");
    assert_eq!(explained.body["explanation"]["decision"], "placed");
    let again = api.reserve(ALICE, "book-1", reserve).await;
    assert_eq!(again.status, StatusCode::OK, "a retry answers the same reservation: {:?}", again.body);
    assert_eq!(again.body["id"], booked.body["id"]);
}

#[tokio::test]
async fn a_quoted_atom_another_tenant_booked_is_named_and_the_booking_writes_nothing() {
    let api = Api::new().await;
    let (pool, a, b) = pool(&api, 16).await;
    let quoted =
        quote(&api, ALICE, &pool, json!({ "devices": { "class": "gpu", "count": 8 }, "duration": 3600 })).await;
    assert_eq!(quoted.status, StatusCode::OK, "{:?}", quoted.body);
    let (node, atoms) = allocations(&quoted.body).remove(0);
    // Globex can only get the quoted node now: the other one is cordoned.
    let other = if node == a.as_str() { &b } else { &a };
    let cordoned = api.call("POST", &format!("/v1/nodes/{other}/cordon"), Some(ROOT), &[], None).await;
    assert_eq!(cordoned.status, StatusCode::OK);
    let theirs = api
        .reserve(GUS, "theirs", json!({ "poolId": pool, "devices": { "class": "gpu", "count": 1 }, "duration": 600 }))
        .await;
    assert_eq!(theirs.status, StatusCode::CREATED, "{:?}", theirs.body);
    let taken = theirs.body["allocations"][0]["devices"][0].as_str().expect("an atom").to_owned();
    assert!(atoms.contains(&taken), "globex got one of the quoted atoms");

    let before = api.events().await;
    let booked = api.reserve(ALICE, "book", quoted.body["reserve"].clone()).await;
    assert_eq!(booked.status, StatusCode::CONFLICT, "{:?}", booked.body);
    assert_eq!(booked.body["error"]["code"], "QUOTE_STALE");
    let message = booked.body["error"]["message"].as_str().expect("a message");
    assert!(
        message.contains(&taken)
            && message.contains(&node)
            && message.contains(&format!("from {T0} to {}", T0 + 600_000)),
        "names the atom, its node and the part of the window: {message}"
    );
    let rival = theirs.body["id"].as_str().expect("id");
    assert!(!message.contains(rival) && !message.contains("globex"), "never whose booking it is: {message}");
    assert_eq!(api.events().await, before, "nothing was written");
    assert_eq!(listed(&api, ALICE).await, json!([]), "no reservation exists");
}

#[tokio::test]
async fn a_quoted_node_cordoned_since_is_named() {
    let api = Api::new().await;
    let (pool, ..) = pool(&api, 16).await;
    let quoted =
        quote(&api, ALICE, &pool, json!({ "devices": { "class": "gpu", "count": 2 }, "duration": 3600 })).await;
    let (node, _) = allocations(&quoted.body).remove(0);
    let cordoned = api.call("POST", &format!("/v1/nodes/{node}/cordon"), Some(ROOT), &[], None).await;
    assert_eq!(cordoned.status, StatusCode::OK);
    let before = api.events().await;
    let booked = api.reserve(ALICE, "book", quoted.body["reserve"].clone()).await;
    assert_eq!((booked.status, &booked.body["error"]["code"]), (StatusCode::CONFLICT, &json!("QUOTE_STALE")));
    let message = booked.body["error"]["message"].as_str().expect("a message");
    assert!(message.contains(&format!("node {node} is no longer schedulable (cordoned)")), "{message}");
    assert_eq!(api.events().await, before, "nothing was written");
    assert_eq!(listed(&api, ALICE).await, json!([]));
}

#[tokio::test]
async fn a_gang_quote_spans_both_nodes_and_books_on_the_quoted_nodes() {
    let api = Api::new().await;
    let (pool, a, b) = pool(&api, 16).await;
    let gang = json!({ "devices": { "class": "gpu", "count": 8, "topology": { "kind": "gang", "nodes": 2 } },
                       "duration": 7200 });
    let quoted = quote(&api, ALICE, &pool, gang).await;
    assert_eq!(quoted.status, StatusCode::OK, "{:?}", quoted.body);
    let devices = allocations(&quoted.body);
    let mut nodes: Vec<&str> = devices.iter().map(|(node, _)| node.as_str()).collect();
    let mut expected = vec![a.as_str(), b.as_str()];
    nodes.sort_unstable();
    expected.sort_unstable();
    assert_eq!(nodes, expected, "four atoms on each node");
    assert!(devices.iter().all(|(_, atoms)| atoms.len() == 4), "{devices:?}");
    let booked = api.reserve(ALICE, "gang", quoted.body["reserve"].clone()).await;
    assert_eq!(booked.status, StatusCode::CREATED, "{:?}", booked.body);
    assert_eq!(allocations(&booked.body), devices, "booked on the quoted nodes, the quoted atoms");
}

#[tokio::test]
async fn a_tampered_expired_or_another_callers_quote_is_refused_naming_quote_and_writes_nothing() {
    let api = Api::new().await;
    let (pool, ..) = pool(&api, 16).await;
    let quoted = quote(&api, ALICE, &pool, json!({ "devices": { "class": "gpu", "count": 1 }, "duration": 600 })).await;
    let reserve = quoted.body["reserve"].clone();
    let token = quoted.body["quote"].as_str().expect("a token").to_owned();
    let before = api.events().await;
    let refused = |reply: &Reply, why: &str| {
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{why}: {:?}", reply.body);
        assert_eq!(reply.field(), "quote", "{why}: {:?}", reply.body);
    };

    // Another window: the claims altered, the tag kept.
    let (signed, tag) = token.rsplit_once('.').expect("a tag");
    let payload = signed.strip_prefix("bcq1.").expect("the version");
    let altered = {
        use base64::Engine as _;
        let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut claims: Value = serde_json::from_slice(&engine.decode(payload).expect("base64url")).expect("JSON");
        claims["endMs"] = json!(T0 + 10 * HOUR);
        format!("bcq1.{}.{tag}", engine.encode(claims.to_string()))
    };
    let mut body = reserve.clone();
    body["quote"] = json!(altered);
    refused(&api.reserve(ALICE, "altered", body).await, "altered claims");
    let mut body = reserve.clone();
    body["quote"] = json!(format!("{signed}.{}", "A".repeat(43)));
    refused(&api.reserve(ALICE, "forged", body).await, "a forged tag");
    let mut body = reserve.clone();
    body["quote"] = json!("not a quote");
    refused(&api.reserve(ALICE, "malformed", body).await, "malformed");
    // The request changed: a longer window than was quoted.
    let mut body = reserve.clone();
    body["duration"] = json!(7200);
    refused(&api.reserve(ALICE, "longer", body).await, "another request");
    // Another tenant presenting it.
    let theirs = api.reserve(GUS, "theirs", reserve.clone()).await;
    refused(&theirs, "another tenant's");
    assert!(theirs.body["error"]["message"].as_str().unwrap_or("").contains("another caller"), "{:?}", theirs.body);
    assert_eq!(api.events().await, before, "nothing was written");

    // Expired: the simulated clock passes its five minutes.
    api.fleet.advance_to(T0 + 5 * 60_000 + 1_000).await;
    let before = api.events().await;
    let expired = api.reserve(ALICE, "late", reserve).await;
    refused(&expired, "expired");
    assert!(expired.body["error"]["message"].as_str().unwrap_or("").contains("expired"), "{:?}", expired.body);
    assert_eq!(api.events().await, before, "nothing was written");
    assert_eq!(listed(&api, ALICE).await, json!([]));
    assert_eq!(listed(&api, GUS).await, json!([]));
}

#[tokio::test]
async fn a_quote_keeps_within_the_quota_at_every_instant_and_its_booking_checks_it_again() {
    let api = Api::new().await;
    let (pool, ..) = pool(&api, 4).await;
    let held = api
        .reserve(ALICE, "held", json!({ "poolId": pool, "devices": { "class": "gpu", "count": 3 }, "duration": 3600 }))
        .await;
    assert_eq!(held.status, StatusCode::CREATED, "{:?}", held.body);
    // The pool has 13 free GPUs now, but acme's quota of 4 holds only one more until its hour ends.
    let two = json!({ "devices": { "class": "gpu", "count": 2 }, "duration": 1800 });
    let quoted = quote(&api, ALICE, &pool, two.clone()).await;
    assert_eq!(quoted.status, StatusCode::OK, "{:?}", quoted.body);
    assert_eq!(quoted.body["start"].as_i64(), Some(T0 + HOUR), "quoted when acme's booking ends");
    assert_eq!(quoted.body["reserve"]["start"].as_i64(), Some(T0 + HOUR), "a later window is booked as quoted");
    let one = quote(&api, ALICE, &pool, json!({ "devices": { "class": "gpu", "count": 1 }, "duration": 1800 })).await;
    assert_eq!(one.body["start"].as_i64(), Some(T0), "one more fits now: {:?}", one.body);

    // The quota can never admit five.
    let five = quote(&api, ALICE, &pool, json!({ "devices": { "class": "gpu", "count": 5 }, "duration": 60 })).await;
    assert_eq!((five.status, &five.body["error"]["code"]), (StatusCode::CONFLICT, &json!("QUOTA_EXCEEDED")));
    // Nine atoms fit on no one node of eight.
    let nine = quote(&api, ROOT, &pool, json!({ "devices": { "class": "gpu", "count": 9 }, "duration": 60 })).await;
    assert_eq!((nine.status, &nine.body["error"]["code"]), (StatusCode::CONFLICT, &json!("CAPACITY_UNAVAILABLE")));
    assert!(nine.body["error"]["message"].as_str().unwrap_or("").contains("can never fit"), "{:?}", nine.body);

    // Acme books the later hour in the meantime: the quote's booking would exceed the quota then.
    let later = api
        .reserve(
            ALICE,
            "later",
            json!({ "poolId": pool, "devices": { "class": "gpu", "count": 3 }, "duration": 600, "start": T0 + HOUR }),
        )
        .await;
    assert_eq!(later.status, StatusCode::CREATED, "{:?}", later.body);
    let before = api.events().await;
    let booked = api.reserve(ALICE, "book", quoted.body["reserve"].clone()).await;
    assert_eq!((booked.status, &booked.body["error"]["code"]), (StatusCode::CONFLICT, &json!("QUOTE_STALE")));
    let message = booked.body["error"]["message"].as_str().expect("a message");
    assert!(
        message.contains("the quota of 4 gpu") && message.contains("holds up to 3") && message.contains("2 more"),
        "names the quota line: {message}"
    );
    assert_eq!(api.events().await, before, "nothing was written");

    // Quoted again, it starts after both of acme's bookings, and books as quoted.
    let again = quote(&api, ALICE, &pool, two).await;
    assert_eq!(again.body["start"].as_i64(), Some(T0 + HOUR + 600_000), "{:?}", again.body);
    let booked = api.reserve(ALICE, "book-again", again.body["reserve"].clone()).await;
    assert_eq!(booked.status, StatusCode::CREATED, "{:?}", booked.body);
    assert_eq!(booked.body["start"].as_i64(), Some(T0 + HOUR + 600_000));
    assert_eq!(allocations(&booked.body), allocations(&again.body));
}

#[tokio::test]
async fn a_quote_is_only_given_for_what_the_caller_could_book() {
    let api = Api::new().await;
    let (pool, ..) = pool(&api, 32).await;
    // The attribute limit of these tests: users reserve at most 8 H100s.
    let sixteen = json!({ "devices": { "class": "gpu", "count": 16, "topology": { "kind": "gang", "nodes": 2 } },
                          "duration": 60 });
    let before = api.events().await;
    let limited = quote(&api, ALICE, &pool, sixteen.clone()).await;
    assert_eq!(limited.status, StatusCode::FORBIDDEN, "{:?}", limited.body);
    assert_eq!(quote(&api, ROOT, &pool, sixteen).await.status, StatusCode::OK, "the pool's owner is not limited");
    assert_eq!(api.events().await, before, "neither wrote anything");
    let both = quote(
        &api,
        ALICE,
        &pool,
        json!({ "devices": { "class": "gpu", "count": 1 }, "duration": 60, "start": T0 + HOUR, "notBefore": T0 }),
    )
    .await;
    assert_eq!((both.status, both.field()), (StatusCode::BAD_REQUEST, "notBefore"));
}
