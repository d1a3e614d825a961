//! Explained decisions through the API: a placement names the read that answered, the nodes chosen and the quota
//! arithmetic; a wait and a refusal name every passed-over node's reason and the quota at its busiest instant (a
//! refusal within its caller's budget of such reads); a denial its rule. The explanation at a position is the
//! replay of the log there.

use axum::http::StatusCode;
use bc_domain::pool::Sharing;
use bc_projections::replay;
use serde_json::{Value, json};

use crate::http_api::{ALICE, Api, GUS, ROOT};

fn request(pool: &str, count: u32) -> Value {
    json!({ "poolId": pool, "devices": { "class": "gpu", "count": count }, "duration": 3600 })
}

async fn explanation(api: &Api, token: &str, id: &str, at: Option<&str>) -> (StatusCode, Value) {
    let uri = match at {
        Some(at) => format!("/v1/reservations/{id}/explanation?at={at}"),
        None => format!("/v1/reservations/{id}/explanation"),
    };
    let reply = api.get(&uri, token).await;
    (reply.status, reply.body)
}

#[tokio::test]
async fn a_placement_is_explained_by_the_read_that_answered_the_node_chosen_and_the_quota_arithmetic() {
    let api = Api::new().await;
    let pool = api.pool().await;
    let placed = api.reserve(ALICE, "first", request(&pool, 4)).await;
    assert_eq!(placed.status, StatusCode::CREATED, "{:?}", placed.body);
    assert_eq!(placed.body["state"], "placed");
    let id = placed.body["id"].as_str().expect("id");
    let (status, body) = explanation(&api, ALICE, id, None).await;
    assert_eq!(status, StatusCode::OK, "{body:?}");
    let e = &body["explanation"];
    assert_eq!(e["decision"], "placed");
    assert_eq!(e["chosen"], json!([placed.body["allocations"][0]["nodeId"]]));
    let tiers = e["tiers"].as_array().expect("tiers");
    assert!(tiers.last().is_some_and(|t| t["fits"] == true && t["candidates"].as_u64() >= Some(1)), "{tiers:?}");
    assert_eq!(e["quota"]["resource"], "gpu");
    assert_eq!(e["quota"]["limit"], 16);
    assert_eq!(e["quota"]["peak"], 0);
    assert_eq!(e["quota"]["requested"], 4);
    assert_eq!(e["quota"]["admits"], true);
    assert_eq!(e["start"], placed.body["start"]);
    assert!(e["summary"].as_str().is_some_and(|s| s.starts_with("placed on node")), "{e:?}");

    // Another tenant does not learn it exists.
    let (status, _) = explanation(&api, GUS, id, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_wait_names_each_passed_over_node_and_the_quota_at_its_busiest_instant() {
    let api = Api::new().await;
    let pool = api.fleet.pool("h100", Sharing::Exclusive, None).await;
    let a = api.fleet.node(&pool, "a", 8, 0).await;
    let b = api.fleet.node(&pool, "b", 8, 0).await;
    api.fleet.offer(&pool, "acme", 16).await;
    let pool = pool.to_string();
    let first = api.reserve(ALICE, "first", request(&pool, 8)).await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    let busy_node = first.body["allocations"][0]["nodeId"].as_str().expect("node").to_owned();
    let other = if busy_node == a.as_str() { b.to_string() } else { a.to_string() };
    let cordoned = api.post(&format!("/v1/nodes/{other}/cordon"), ROOT, json!({ "reason": "fan swap" })).await;
    assert_eq!(cordoned.status, StatusCode::OK, "{:?}", cordoned.body);

    let waiting = api.reserve(ALICE, "second", request(&pool, 8)).await;
    assert_eq!(waiting.status, StatusCode::CREATED, "{:?}", waiting.body);
    assert_eq!(waiting.body["state"], "pending");
    let (status, body) = explanation(&api, ALICE, waiting.body["id"].as_str().expect("id"), None).await;
    assert_eq!(status, StatusCode::OK, "{body:?}");
    let e = &body["explanation"];
    assert_eq!(e["decision"], "pending");
    assert_eq!(e["excludedBy"], json!({ "busy": 1, "unschedulable": 1 }));
    let excluded = e["excluded"].as_array().expect("excluded");
    let busy = excluded.iter().find(|n| n["nodeId"] == busy_node.as_str()).expect("the busy node is named");
    assert_eq!(busy["kind"], "busy");
    assert_eq!(busy["free"], 0);
    assert_eq!(busy["needed"], 8);
    assert_eq!(busy["overlapping"], 8);
    assert_eq!(busy["firstFreesAt"], first.body["end"]);
    let off = excluded.iter().find(|n| n["nodeId"] == other.as_str()).expect("the cordoned node is named");
    assert_eq!(off["kind"], "unschedulable");
    assert!(off["conditions"].as_array().expect("conditions").iter().any(|c| c == "cordoned"), "{off:?}");
    // The quota admits it: the wait is for capacity, and the line says so with the instant it is busiest.
    assert_eq!(e["quota"]["peak"], 8);
    assert_eq!(e["quota"]["admits"], true);
    assert_eq!(e["quota"]["peakAt"], e["start"]);
    assert!(e["summary"].as_str().is_some_and(|s| s.contains("1 busy") && s.contains("1 unschedulable")), "{e:?}");
}

#[tokio::test]
async fn a_refusal_answers_its_explanation_with_the_quota_arithmetic_and_records_nothing() {
    let api = Api::new().await;
    let pool = api.fleet.pool("h100", Sharing::Exclusive, None).await;
    api.fleet.node(&pool, "a", 8, 0).await;
    api.fleet.node(&pool, "b", 8, 0).await;
    api.fleet.offer(&pool, "globex", 6).await;
    let pool = pool.to_string();
    let held = api.reserve(GUS, "held", request(&pool, 4)).await;
    assert_eq!(held.status, StatusCode::CREATED, "{:?}", held.body);
    let events = api.events().await;
    let mut impatient = request(&pool, 3);
    impatient["wait"] = json!(false);
    let refused = api.reserve(GUS, "impatient", impatient).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{:?}", refused.body);
    assert_eq!(refused.body["error"]["code"], "CAPACITY_UNAVAILABLE");
    let e = &refused.body["error"]["details"]["explanation"];
    assert_eq!(e["decision"], "refused", "{:?}", refused.body);
    assert_eq!(e["quota"]["limit"], 6);
    assert_eq!(e["quota"]["peak"], 4);
    assert_eq!(e["quota"]["requested"], 3);
    assert_eq!(e["quota"]["admits"], false);
    assert_eq!(
        e["quota"]["arithmetic"],
        format!("quota gpu: 4 held + 3 requested = 7 > 6 (busiest at {})", e["start"])
    );
    assert!(e["policy"].as_str().is_some_and(|p| p.contains("wait: false")), "{e:?}");
    assert_eq!(api.events().await, events, "a refusal records nothing");

    // More than the quota could ever admit: refused by the rule, before any placement.
    let over = api.reserve(GUS, "over", request(&pool, 7)).await;
    assert_eq!(over.status, StatusCode::CONFLICT, "{:?}", over.body);
    assert_eq!(over.body["error"]["code"], "QUOTA_EXCEEDED");
    let e = &over.body["error"]["details"]["explanation"];
    assert_eq!(e["decision"], "refused");
    assert_eq!(e["policy"], over.body["error"]["message"]);
    assert_eq!(api.events().await, events, "a refusal records nothing");
}

#[tokio::test]
async fn refusals_past_an_identitys_budget_are_explained_without_reading_the_nodes_and_say_so() {
    let api = Api::new().await;
    let pool = api.fleet.pool("h100", Sharing::Exclusive, None).await;
    api.fleet.node(&pool, "a", 8, 0).await;
    api.fleet.offer(&pool, "acme", 64).await;
    api.fleet.offer(&pool, "globex", 64).await;
    let pool = pool.to_string();
    let full = api.reserve(ALICE, "full", request(&pool, 8)).await;
    assert_eq!(full.status, StatusCode::CREATED, "{:?}", full.body);
    let events = api.events().await;
    let mut impatient = request(&pool, 1);
    impatient["wait"] = json!(false);
    let refuse = |who: &'static str, key: String| {
        let (api, body) = (&api, impatient.clone());
        async move {
            let refused = api.reserve(who, &key, body).await;
            assert_eq!(refused.status, StatusCode::CONFLICT, "{:?}", refused.body);
            assert_eq!(refused.body["error"]["code"], "CAPACITY_UNAVAILABLE");
            refused.body["error"]["details"]["explanation"].clone()
        }
    };
    for n in 0..bc_commands::auth::DIAGNOSED_REFUSALS_PER_MINUTE {
        let e = refuse(ALICE, format!("within-{n}")).await;
        assert_eq!(e["excludedBy"], json!({ "busy": 1 }), "refusal {n} names the busy node: {e:?}");
        assert!(!e["summary"].as_str().unwrap_or_default().contains("not read"), "{e:?}");
    }

    // Past the budget: refused as before, by the same rule, but the pool's nodes are not read, and it says why.
    let e = refuse(ALICE, "past".to_owned()).await;
    assert_eq!(e["excluded"], json!([]), "{e:?}");
    assert_eq!(e["excludedBy"], json!({}), "{e:?}");
    assert!(e["policy"].as_str().is_some_and(|p| p.contains("wait: false")), "{e:?}");
    let summary = e["summary"].as_str().unwrap_or_default();
    assert!(summary.contains("the nodes were not read"), "{summary}");
    assert!(summary.contains(&format!("at most {} refusals", bc_commands::auth::DIAGNOSED_REFUSALS_PER_MINUTE)));
    assert!(summary.contains("alice@acme"), "{summary}");

    // The budget is the identity's own: another caller's refusal still names the node.
    let e = refuse(GUS, "gus".to_owned()).await;
    assert_eq!(e["excludedBy"], json!({ "busy": 1 }), "{e:?}");
    assert_eq!(api.events().await, events, "refusals record nothing");
}

#[tokio::test]
async fn a_denial_is_explained_by_the_rule_that_denied_it() {
    let api = Api::new().await;
    let pool = api.pool().await;
    // The authorizer's limit: users may reserve up to 8 H100s.
    let denied = api.reserve(ALICE, "greedy", request(&pool, 12)).await;
    assert_eq!(denied.status, StatusCode::FORBIDDEN, "{:?}", denied.body);
    let id = denied.body["error"]["details"]["reservationId"].as_str().expect("the denial is recorded");
    let (status, body) = explanation(&api, ALICE, id, None).await;
    assert_eq!(status, StatusCode::OK, "{body:?}");
    assert_eq!(body["explanation"]["decision"], "denied");
    assert_eq!(body["explanation"]["policy"], denied.body["error"]["message"]);
}

#[tokio::test]
async fn the_explanation_at_a_position_is_the_replay_of_the_log_there() {
    let api = Api::new().await;
    let pool = api.fleet.pool("h100", Sharing::Exclusive, None).await;
    api.fleet.node(&pool, "a", 8, 0).await;
    api.fleet.offer(&pool, "acme", 16).await;
    let pool = pool.to_string();
    let first = api.reserve(ALICE, "first", request(&pool, 8)).await;
    let first_id = first.body["id"].as_str().expect("id").to_owned();
    let second = api.reserve(ALICE, "second", request(&pool, 8)).await;
    assert_eq!(second.body["state"], "pending", "{:?}", second.body);
    let id = second.body["id"].as_str().expect("id").to_owned();
    let (_, waited) = explanation(&api, ALICE, &id, None).await;
    let waited_at = waited["position"].as_str().expect("position").to_owned();

    // The first one cancelled: the worker places the second, and explains that placement.
    let cancelled = api.post(&format!("/v1/reservations/{first_id}/cancel"), ALICE, json!({})).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{:?}", cancelled.body);
    api.fleet.worker().run_until_idle().await.expect("worker");
    let (_, placed) = explanation(&api, ALICE, &id, None).await;
    assert_eq!(placed["explanation"]["decision"], "placed", "{placed:?}");
    assert_ne!(placed["position"], waited["position"]);

    // As the log stood when it was left waiting: the same answer as then, and what a replay there folds.
    let (status, then) = explanation(&api, ALICE, &id, Some(&waited_at)).await;
    assert_eq!(status, StatusCode::OK, "{then:?}");
    assert_eq!(then, waited);
    let events =
        replay::stream_until(&api.fleet.t.db, &id, waited_at.parse().expect("position")).await.expect("replay");
    let state = replay::stream_state(&events).expect("fold");
    assert_eq!(state["explanation"]["decision"], "pending");
    assert_eq!(state["explanation"]["summary"], waited["explanation"]["summary"]);
    assert_eq!(state["explanation"]["excludedBy"], waited["explanation"]["excludedBy"]);

    let (status, body) = explanation(&api, ALICE, &id, Some("not-a-position")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["details"]["field"], "at");
}
