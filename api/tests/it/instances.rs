//! Instances through the API: made with the reservation that holds their allocation, run by their node's agent
//! (its routes driven by hand here, as `bcd` drives them), stopped, started, deleted; the allocation and its
//! scalar amounts freed once the node has stopped the instance; refusals that name the field and record nothing.

use axum::http::StatusCode;
use bc_commands::fleet::OfferPool;
use bc_domain::agent::{Ack, Heartbeat, SessionRequest};
use bc_domain::device::Sharing;
use bc_domain::node::Role;
use bc_domain::pool::{PoolClass, PoolPolicy};
use serde_json::{Value, json};

use crate::http_api::{ALICE, Api, GUS, ROOT, Reply};
use crate::ramdisk::{as_, join};

/// A vps-host pool offered to acme with room for two one-GPU instances of the test's flavor.
async fn vps_pool(api: &Api) -> String {
    let pool = api.fleet.pool_of("vps", PoolClass::VpsHost, Sharing::Exclusive, PoolPolicy::default()).await;
    let quota = [("gpu", 2), ("vcpu", 32), ("memoryGiB", 256), ("disk", 1000)].map(|(r, n)| (r.to_owned(), n)).into();
    let offer =
        OfferPool { tenant_id: "acme".parse().expect("tenant"), quota, priority: 0, include_descendants: false };
    api.app().offer_pool(&api.fleet.owner, &pool, offer).await.expect("offer");
    pool.to_string()
}

/// A node of the pool whose agent joined and keeps a session: schedulable. Answers its credential and id.
async fn vps_node(api: &Api, pool: &str) -> (String, String) {
    let (credential, joined) = join(api, pool, None, "vps-1", Role::Host).await;
    let node_id = joined["nodeId"].as_str().expect("node id").to_owned();
    let session = SessionRequest { agent_version: "test".into() };
    let opened =
        as_(api, "POST", "/v1/agent/sessions", &credential, Some(serde_json::to_value(session).expect("json"))).await;
    assert_eq!(opened.status, StatusCode::CREATED, "{:?}", opened.body);
    let beat = Heartbeat {
        session_id: opened.body["sessionId"].as_str().expect("session").parse().expect("session id"),
        observed_generation: opened.body["generation"].as_u64().expect("generation"),
        // The node's clock agrees with the database server's.
        clock_ms: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as i64,
        gpu_utilization: Vec::new(),
    };
    let beat =
        as_(api, "POST", "/v1/agent/heartbeat", &credential, Some(serde_json::to_value(beat).expect("json"))).await;
    assert_eq!(beat.status, StatusCode::OK, "{:?}", beat.body);
    bc_projections::testing::catch_up(&api.fleet.t.db).await;
    (credential, node_id)
}

/// A public image, published by the platform.
async fn image(api: &Api) -> String {
    let data = b"a guest's disk".repeat(64);
    let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&data));
    let headers = [("content-type", "application/octet-stream")];
    let uri = format!("/v1/images?name=guest&version=1&format=raw&sha256={sha}&visibility=public");
    let (made, _) = api.call_raw("POST", &uri, Some(ROOT), &headers, axum::body::Body::from(data)).await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
    made.body["id"].as_str().expect("id").to_owned()
}

/// A flavor of the platform's: public, or its own.
async fn flavor(api: &Api, visibility: &str, gpus: u32, vcpu: u32) -> String {
    let body = json!({ "name": format!("{visibility}-{gpus}x{vcpu}"), "vcpu": vcpu, "memoryGiB": 64, "gpus": gpus,
                       "disk": 100, "visibility": visibility });
    let made = api.post("/v1/flavors", ROOT, body).await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
    made.body["id"].as_str().expect("id").to_owned()
}

async fn create(api: &Api, token: &str, key: &str, body: &Value) -> Reply {
    api.call("POST", "/v1/instances", Some(token), &[("idempotency-key", key)], Some(body.to_string())).await
}

/// Acknowledges every command waiting for the node's agent, as `bcd` does once it acted on each.
async fn ack_commands(api: &Api, credential: &str) -> Vec<String> {
    let waiting = as_(api, "GET", "/v1/agent/commands", credential, None).await;
    assert_eq!(waiting.status, StatusCode::OK, "{:?}", waiting.body);
    let mut kinds = Vec::new();
    for command in waiting.body["commands"].as_array().expect("commands") {
        kinds.push(command["kind"].as_str().expect("kind").to_owned());
        let id = command["id"].as_str().expect("id");
        let ack = serde_json::to_value(Ack { ok: true, message: None }).expect("json");
        let done = as_(api, "POST", &format!("/v1/agent/commands/{id}/ack"), credential, Some(ack)).await;
        assert_eq!(done.status, StatusCode::OK, "{:?}", done.body);
    }
    kinds
}

async fn listed(api: &Api, credential: &str) -> Vec<Value> {
    let list = as_(api, "GET", "/v1/agent/instances", credential, None).await;
    assert_eq!(list.status, StatusCode::OK, "{:?}", list.body);
    list.body["instances"].as_array().expect("instances").clone()
}

async fn report(api: &Api, credential: &str, id: &str, state: &str, generation: u64) -> Reply {
    let body = json!({ "state": state, "generation": generation });
    as_(api, "POST", &format!("/v1/agent/instances/{id}/state"), credential, Some(body)).await
}

async fn reservation(api: &Api, id: &str) -> Value {
    api.fleet.worker().run_until_idle().await.expect("worker");
    api.get(&format!("/v1/reservations/{id}"), ALICE).await.body
}

#[tokio::test]
async fn an_instance_lives_on_its_allocation_from_creation_to_deletion_as_its_node_reports() {
    let api = Api::new().await;
    let pool = vps_pool(&api).await;
    let (agent, node_id) = vps_node(&api, &pool).await;
    let image_id = image(&api).await;
    let flavor_id = flavor(&api, "public", 1, 8).await;
    let body = json!({ "name": "trainer", "poolId": pool, "flavorId": flavor_id, "imageId": image_id,
                       "duration": 3600, "userData": "#cloud-config\n" });

    // Made with its reservation: the flavor's GPU on one node with its vCPUs, memory and disk beside it.
    let made = create(&api, ALICE, "i1", &body).await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
    let instance = &made.body["instance"];
    let id = instance["id"].as_str().expect("id").to_owned();
    assert!(id.starts_with("inst_"), "{id}");
    assert_eq!((instance["state"].as_str(), instance["desiredState"].as_str()), (Some("pending"), Some("running")));
    assert_eq!(instance["imageVerified"], json!(false));
    let r = &made.body["reservation"];
    let rid = r["id"].as_str().expect("reservation").to_owned();
    assert_eq!(instance["reservationId"], json!(rid));
    assert_eq!((r["state"].as_str(), r["request"]["binding"].as_str()), (Some("placed"), Some("instance")));
    assert_eq!(r["allocations"][0]["nodeId"], json!(node_id));
    assert_eq!(r["allocations"][0]["resources"], json!({ "vcpu": 8, "memoryGiB": 64, "disk": 100 }));
    let again = create(&api, ALICE, "i1", &body).await;
    assert_eq!((again.status, &again.body["instance"]["id"]), (StatusCode::OK, &json!(id)), "a retry: the same one");
    let mut other = body.clone();
    other["name"] = json!("another");
    assert_eq!(create(&api, ALICE, "i1", &other).await.body["error"]["code"], "IDEMPOTENCY_KEY_REUSED");
    let hidden = api.get(&format!("/v1/instances/{id}"), GUS).await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND, "acme's: {:?}", hidden.body);
    let reserved_directly = json!({ "poolId": pool, "devices": { "class": "gpu", "count": 1 }, "duration": 60,
                                    "binding": "instance" });
    let refused = api.reserve(ALICE, "direct", reserved_directly).await;
    assert_eq!((refused.status, refused.field()), (StatusCode::BAD_REQUEST, "binding"), "{:?}", refused.body);

    // Its window began: the node binds the allocation, then runs the instance it is listed.
    assert_eq!(reservation(&api, &rid).await["state"], "binding");
    assert_eq!(ack_commands(&api, &agent).await, ["bind"]);
    assert_eq!(reservation(&api, &rid).await["state"], "active");
    let on_node = listed(&api, &agent).await;
    assert_eq!(on_node.len(), 1, "{on_node:?}");
    assert_eq!((on_node[0]["instanceId"].as_str(), on_node[0]["desired"].as_str()), (Some(&*id), Some("running")));
    assert_eq!(on_node[0]["image"]["format"], "raw");
    assert_eq!(on_node[0]["devices"], r["allocations"][0]["devices"]);
    let bytes = api.call_raw("GET", &format!("/v1/agent/instances/{id}/image"), Some(&agent), &[], "".into()).await.1;
    assert_eq!(bytes, b"a guest's disk".repeat(64), "the node fetches the image's bytes");
    let ahead = report(&api, &agent, &id, "running", 2).await;
    assert_eq!((ahead.status, ahead.field()), (StatusCode::BAD_REQUEST, "generation"), "{:?}", ahead.body);
    let running = report(&api, &agent, &id, "running", 1).await;
    assert_eq!(running.body["state"], "running", "{:?}", running.body);
    assert_eq!(running.body["nodeId"], json!(node_id));

    // Stopped and started again: each a new generation the node acts on; the allocation stays held.
    let stop = api.post(&format!("/v1/instances/{id}/stop"), ALICE, json!({})).await;
    assert_eq!((stop.body["desiredState"].as_str(), stop.body["generation"].as_u64()), (Some("stopped"), Some(2)));
    assert_eq!(report(&api, &agent, &id, "stopped", 2).await.body["state"], "stopped");
    let start = api.post(&format!("/v1/instances/{id}/start"), ALICE, json!({})).await;
    assert_eq!(start.body["generation"], 3, "{:?}", start.body);
    assert_eq!(report(&api, &agent, &id, "running", 3).await.body["state"], "running");
    assert_eq!(reservation(&api, &rid).await["state"], "active");

    // Deleted: the allocation is released once the node stopped the instance, and the instance ends with it.
    let gone = api.call("DELETE", &format!("/v1/instances/{id}"), Some(ALICE), &[], None).await;
    assert_eq!((gone.status, gone.body["desiredState"].as_str()), (StatusCode::OK, Some("deleted")), "{:?}", gone.body);
    assert_eq!(reservation(&api, &rid).await["state"], "releasing");
    let to_delete = listed(&api, &agent).await;
    assert_eq!(to_delete.len(), 0, "a releasing allocation's instance is to be stopped and removed: {to_delete:?}");
    let restart = api.post(&format!("/v1/instances/{id}/start"), ALICE, json!({})).await;
    assert_eq!(restart.status, StatusCode::CONFLICT, "being deleted: {:?}", restart.body);
    assert_eq!(ack_commands(&api, &agent).await, ["unbind"]);
    assert_eq!(reservation(&api, &rid).await["state"], "released");
    let ended = api.get(&format!("/v1/instances/{id}"), ALICE).await;
    assert_eq!(ended.body["state"], "deleted", "{:?}", ended.body);
    assert!(ended.body["message"].as_str().is_some_and(|m| m.contains(&rid)), "{:?}", ended.body);
    assert_eq!(report(&api, &agent, &id, "running", 3).await.body["state"], "deleted", "a late report changes nothing");

    // Its GPU, vCPUs and memory are free again: two more instances fit the node and the quota.
    let big = flavor(&api, "public", 1, 16).await;
    for key in ["i2", "i3"] {
        let mut body = body.clone();
        body["flavorId"] = json!(big);
        let next = create(&api, ALICE, key, &body).await;
        assert_eq!(next.status, StatusCode::CREATED, "{key}: {:?}", next.body);
    }
    let listed = api.get("/v1/instances", ALICE).await;
    assert_eq!(listed.body["items"].as_array().map(Vec::len), Some(3), "{:?}", listed.body);
}

#[tokio::test]
async fn instance_requests_that_cannot_be_made_are_refused_naming_why_and_record_nothing() {
    let api = Api::new().await;
    let pool = vps_pool(&api).await;
    vps_node(&api, &pool).await;
    let metal = api.pool().await;
    let image_id = image(&api).await;
    let flavor_id = flavor(&api, "public", 1, 8).await;
    let platform_flavor = flavor(&api, "private", 1, 8).await;
    let three_gpus = flavor(&api, "public", 3, 8).await;
    let all_cpus = flavor(&api, "public", 1, 40).await;
    let body = json!({ "name": "t", "poolId": pool, "flavorId": flavor_id, "imageId": image_id, "duration": 3600 });
    let with = |key: &str, value: Value| {
        let mut b = body.clone();
        b[key] = value;
        b
    };
    let before = api.events().await;
    let refusals = [
        (ALICE, with("name", json!("")), "name"),
        (ALICE, with("duration", json!(0)), "duration"),
        (ALICE, with("userData", json!("x".repeat(16 * 1024 + 1))), "userData"),
        (ALICE, with("desiredState", json!("deleted")), "desiredState"),
        (ALICE, with("flavorId", json!("flv_nope")), "flavorId"),
        (ALICE, with("poolId", json!(metal)), "vps-host"),
        (ALICE, with("flavorId", json!(platform_flavor)), "was not found"),
        (ALICE, with("imageId", json!("img_01jd8w2k3m4n5p6q7r8s9t0v1w")), "was not found"),
        (ALICE, with("flavorId", json!(three_gpus)), "QUOTA_EXCEEDED"),
        (ALICE, with("flavorId", json!(all_cpus)), "QUOTA_EXCEEDED"),
        (GUS, body.clone(), "NOT_FOUND"),
    ];
    for (token, body, names) in refusals {
        let refused = create(&api, token, "k", &body).await;
        assert!(refused.status.is_client_error(), "{body}: {:?}", refused.body);
        let said = refused.body["error"].to_string();
        assert!(said.contains(names), "{names} in {body}: {said}");
    }
    let no_key = api.post("/v1/instances", ALICE, body.clone()).await;
    assert_eq!((no_key.status, no_key.field()), (StatusCode::BAD_REQUEST, "Idempotency-Key"));
    assert_eq!(api.events().await, before, "a refusal records nothing");

    // Within a generous quota, a flavor larger than any node (the node lends 32 vCPUs) is refused as capacity.
    let pool_id: bc_domain::id::PoolId = pool.parse().expect("pool");
    let quota =
        [("gpu", 8), ("vcpu", 1000), ("memoryGiB", 4000), ("disk", 100_000)].map(|(r, n)| (r.to_owned(), n)).into();
    let offer =
        OfferPool { tenant_id: "acme".parse().expect("tenant"), quota, priority: 0, include_descendants: false };
    api.app().offer_pool(&api.fleet.owner, &pool_id, offer).await.expect("offer");
    let huge = flavor(&api, "public", 1, 64).await;
    let before = api.events().await;
    let refused = create(&api, ALICE, "huge", &with("flavorId", json!(huge))).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{:?}", refused.body);
    assert_eq!(refused.body["error"]["code"], "CAPACITY_UNAVAILABLE", "{:?}", refused.body);
    assert_eq!(api.events().await, before, "nothing half-made");
}
