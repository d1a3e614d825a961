//! Whole machines for tenants through the API: a `binding: node` reservation in a `policy.tenantRoot` pool books
//! a machine's node atom, deploys the tenant's profile on it when the window starts (the reservation is `active`
//! once the deployment succeeded), and wipes it with a release workflow when the tenant releases it (`released`
//! once the wipe succeeded, the machine `ready` again). Requests that do not fit the pool are refused naming why.

use axum::http::StatusCode;
use bc_domain::device::Sharing;
use bc_domain::node::Role;
use bc_domain::pool::PoolPolicy;
use serde_json::{Value, json};

use crate::http_api::Reply;
use crate::http_api::{ALICE, Api, ROOT};
use crate::ramdisk::{MAC, boot_ramdisk, drive, inventory, join, node, raw_image_profile, workflow};

/// The machine's workflows, newest first.
async fn workflows_of(api: &Api, node_id: &str) -> Vec<Value> {
    api.fleet.worker().run_until_idle().await.expect("worker");
    let listed = api.get(&format!("/v1/nodes/{node_id}/workflows"), ROOT).await;
    assert_eq!(listed.status, StatusCode::OK, "{:?}", listed.body);
    listed.body["items"].as_array().expect("items").clone()
}

async fn reservation(api: &Api, id: &str) -> Value {
    api.fleet.worker().run_until_idle().await.expect("worker");
    let read = api.get(&format!("/v1/reservations/{id}?consistency=strong"), ROOT).await;
    assert_eq!(read.status, StatusCode::OK, "{:?}", read.body);
    read.body
}

/// `POST /v1/reservations` as `token` with an idempotency key.
async fn reserve(api: &Api, token: &str, key: &str, body: &Value) -> Reply {
    api.call("POST", "/v1/reservations", Some(token), &[("idempotency-key", key)], Some(body.to_string())).await
}

/// Runs a reservation's workflow on the machine to its end (the ramdisk answering `report`), and answers it.
async fn run_through(api: &Api, site: &str, wf: &str, report: &mut dyn FnMut(&Value) -> Value) -> Value {
    workflow(api, wf).await;
    let (_, session) = boot_ramdisk(api, site).await;
    drive(api, site, &session, wf, report).await
}

/// Runs the machine's newest workflow, the wipe that reservation `id` started, to its success.
async fn wipe(api: &Api, site: &str, node_id: &str, id: &str) {
    let wipe = workflows_of(api, node_id).await[0].clone();
    assert_eq!((&wipe["kind"], &wipe["reservationId"]), (&json!("release"), &json!(id)), "{wipe}");
    let wf = wipe["id"].as_str().expect("id");
    let wiped = run_through(api, site, wf, &mut |step| json!({ "attempt": step["attempt"], "ok": true })).await;
    assert_eq!(wiped["state"], "succeeded", "{wiped}");
}

#[tokio::test]
async fn a_node_reservation_deploys_the_tenants_profile_on_a_whole_machine_and_wipes_it_at_the_release() {
    let api = Api::with_pki().await;
    let policy = PoolPolicy { tenant_root: true, ..PoolPolicy::default() };
    let pool = api.fleet.pool_with("whole", Sharing::Exclusive, policy).await.to_string();
    api.fleet.offer(&pool.parse().expect("pool"), "acme", 16).await;
    let enrol = json!({
        "poolId": pool, "name": "metal-1", "bootMac": MAC,
        "bmc": { "driver": "redfish", "address": "https://10.1.2.3", "username": "admin", "password": "pw" }
    });
    let made = api.post("/v1/nodes/enrol", ROOT, enrol).await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
    let node_id = made.body["id"].as_str().expect("id").to_owned();
    let (site, _) = join(&api, &pool, None, "site-1", Role::Site).await;

    // Inspected, the machine is one `node` atom; its GPUs are listed but never booked alone.
    let inspect = api.post(&format!("/v1/nodes/{node_id}/workflows"), ROOT, json!({ "kind": "inspect" })).await;
    let inspect = inspect.body["id"].as_str().expect("id").to_owned();
    let inspected = run_through(
        &api,
        &site,
        &inspect,
        &mut |step| json!({ "attempt": step["attempt"], "ok": true, "inventory": inventory("metal-1") }),
    )
    .await;
    assert_eq!(inspected["state"], "succeeded", "{inspected}");
    bc_projections::testing::catch_up(&api.fleet.t.db).await;
    let devices = api.get(&format!("/v1/pools/{pool}/devices"), ROOT).await;
    let atoms: Vec<(&Value, &Value)> = devices.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .flat_map(|n| n["items"].as_array().expect("a node's devices"))
        .filter(|d| d["bookable"] == json!(true))
        .map(|d| (&d["id"], &d["class"]))
        .collect();
    assert_eq!(atoms, vec![(&json!(format!("{node_id}/node")), &json!("node"))], "{:?}", devices.body);

    let (_, profile_id) = raw_image_profile(&api, "tenant-os", "t-1", &b"the tenant's own system".repeat(100)).await;
    let whole = |profile: Option<&str>| {
        let mut body = json!({
            "poolId": pool, "devices": { "class": "node", "count": 1 }, "duration": 3600, "binding": "node",
            "wait": false
        });
        if let Some(profile) = profile {
            body["profileId"] = json!(profile);
        }
        body
    };

    // What does not fit a pool of whole machines is refused, naming why, and records nothing.
    let before = api.events().await;
    let refusals = [
        (ROOT, json!({ "poolId": pool, "devices": { "class": "gpu", "count": 1 }, "duration": 60 }), "binding node"),
        (ROOT, whole(None), "profileId"),
        (
            ROOT,
            {
                let mut b = whole(Some(&profile_id));
                b["binding"] = json!("hold");
                b
            },
            "binding node",
        ),
        (ROOT, whole(Some("prof_01jd8w2k3m4n5p6q7r8s9t0v1w")), "was not found"),
        (ALICE, whole(Some(&profile_id)), "quota for node"),
    ];
    for (token, body, names) in refusals {
        let refused = reserve(&api, token, "k", &body).await;
        assert!(refused.status.is_client_error(), "{body}: {:?}", refused.body);
        let said = refused.body["error"].to_string();
        assert!(said.contains(names), "{body}: {said}");
    }
    assert_eq!(api.events().await, before, "a refusal records nothing");
    let elsewhere = api.pool().await;
    let mut body = whole(Some(&profile_id));
    body["poolId"] = json!(elsewhere);
    let refused = reserve(&api, ROOT, "x", &body).await;
    assert!(refused.body["error"].to_string().contains("tenantRoot"), "{:?}", refused.body);

    // The reservation books the machine, and its window's start deploys the profile on it.
    let made = reserve(&api, ROOT, "r1", &whole(Some(&profile_id))).await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
    let id = made.body["id"].as_str().expect("id").to_owned();
    assert_eq!(made.body["allocations"][0]["devices"], json!([format!("{node_id}/node")]), "{:?}", made.body);
    // The pool's availability is in machines: the earliest start of one is this window's end, and the machine is
    // free after it.
    let end = made.body["end"].as_i64().expect("the window's end");
    api.fleet.worker().run_until_idle().await.expect("worker");
    bc_projections::testing::catch_up(&api.fleet.t.db).await;
    let uri = format!("/v1/pools/{pool}/availability?count=1&duration=3600");
    let earliest = api.get(&uri, ROOT).await;
    assert_eq!(earliest.body["earliestStart"], json!(end), "{:?}", earliest.body);
    let free = api.get(&format!("/v1/pools/{pool}/availability?start={end}&end={}", end + 3_600_000), ROOT).await;
    assert_eq!(
        free.body["nodes"],
        json!([{ "nodeId": node_id, "atoms": [format!("{node_id}/node")] }]),
        "{:?}",
        free.body
    );
    let second = reserve(&api, ROOT, "r2", &whole(Some(&profile_id))).await;
    assert!(second.status.is_client_error(), "one machine, one tenant at a time: {:?}", second.body);
    assert_eq!(reservation(&api, &id).await["state"], "binding");
    let deploy = workflows_of(&api, &node_id).await[0].clone();
    assert_eq!(
        (&deploy["kind"], &deploy["reservationId"], &deploy["profileId"], &deploy["state"]),
        (&json!("deploy"), &json!(id), &json!(profile_id), &json!("running")),
        "{deploy}"
    );
    let mut join_token = None;
    let waiting = run_through(&api, &site, deploy["id"].as_str().expect("id"), &mut |step| {
        if step["action"] == "write-config" {
            join_token = step["config"]["joinToken"].as_str().map(str::to_owned);
        }
        json!({ "attempt": step["attempt"], "ok": true })
    })
    .await;
    assert_eq!(waiting["state"], "running", "it awaits the deployed agent: {waiting}");
    assert_eq!(reservation(&api, &id).await["state"], "binding", "not handed over before the deployment ends");
    join(&api, &pool, join_token, "metal-1", Role::Host).await;
    assert_eq!(workflow(&api, deploy["id"].as_str().expect("id")).await["state"], "succeeded");
    assert_eq!(reservation(&api, &id).await["state"], "active");
    assert_eq!(node(&api, &node_id).await["provisionState"], "deployed");

    // The next tenant's window, booked on the same machine after this one: the wipe in between must not move it.
    let active = reservation(&api, &id).await;
    let next_start = active["end"].as_i64().expect("the window's end");
    let mut next = whole(Some(&profile_id));
    next["start"] = json!(next_start);
    let next = reserve(&api, ROOT, "next", &next).await;
    assert_eq!(next.status, StatusCode::CREATED, "{:?}", next.body);
    let next_id = next.body["id"].as_str().expect("id").to_owned();
    assert_eq!(next.body["state"], "placed", "{:?}", next.body);

    // The release wipes the machine; the reservation is released once the wipe succeeded.
    let released = api.post(&format!("/v1/reservations/{id}/release"), ROOT, json!({})).await;
    assert_eq!(released.status, StatusCode::OK, "{:?}", released.body);
    assert_eq!(reservation(&api, &id).await["state"], "releasing");
    wipe(&api, &site, &node_id, &id).await;
    let ended = reservation(&api, &id).await;
    assert_eq!(ended["state"], "released", "{ended}");
    assert_eq!(node(&api, &node_id).await["provisionState"], "ready");
    let waiting = reservation(&api, &next_id).await;
    assert_eq!(
        (&waiting["state"], &waiting["allocations"][0]["nodeId"]),
        (&json!("placed"), &json!(node_id)),
        "the wipe left the next window where it was: {waiting}"
    );
    let cancelled = api.post(&format!("/v1/reservations/{next_id}/cancel"), ROOT, json!({})).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{:?}", cancelled.body);
    let again = reserve(&api, ROOT, "r3", &whole(Some(&profile_id))).await;
    assert_eq!(again.status, StatusCode::CREATED, "the wiped machine is free again: {:?}", again.body);
    let again = again.body["id"].as_str().expect("id").to_owned();

    // A deployment that fails fails the binding, and the machine it left half-written is wiped.
    let deploy = workflows_of(&api, &node_id).await[0].clone();
    assert_eq!((&deploy["kind"], &deploy["reservationId"]), (&json!("deploy"), &json!(again)), "{deploy}");
    let broken = run_through(&api, &site, deploy["id"].as_str().expect("id"), &mut |step| {
        json!({ "attempt": step["attempt"], "ok": step["action"] != "write-image", "message": "disk error" })
    })
    .await;
    assert_eq!(broken["state"], "failed", "{broken}");
    let failed = reservation(&api, &again).await;
    assert_eq!((&failed["state"], &failed["outcome"]), (&json!("failed"), &json!("binding-failed")), "{failed}");
    wipe(&api, &site, &node_id, &again).await;
    assert_eq!(node(&api, &node_id).await["provisionState"], "ready");
}
