//! Workflows through the API: steps run in order and their reports move the workflow on; a step out of time is
//! retried and then fails the workflow; the workflow's end moves its machine's lifecycle; a cancelled workflow
//! takes no more reports; a report twice, elsewhere or late is answered clearly.

use axum::http::StatusCode;
use bc_commands::testing::T0;
use bc_domain::profile::RunsOn;
use bc_domain::workflow::Report;
use serde_json::{Value, json};

use crate::http_api::{Api, GUS, ROOT};

async fn enrolled(api: &Api) -> String {
    let pool = api.pool().await;
    let body = json!({
        "poolId": pool, "name": "metal-1",
        "bmc": { "driver": "redfish", "address": "https://10.1.2.3", "username": "admin", "password": "pw" }
    });
    let made = api.post("/v1/nodes/enrol", ROOT, body).await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
    made.body["id"].as_str().expect("id").to_owned()
}

async fn node_state(api: &Api, node: &str) -> String {
    bc_projections::testing::catch_up(&api.fleet.t.db).await;
    api.get(&format!("/v1/nodes/{node}"), ROOT).await.body["provisionState"].as_str().unwrap_or("").to_owned()
}

async fn workflow(api: &Api, id: &str) -> Value {
    let read = api.get(&format!("/v1/workflows/{id}"), ROOT).await;
    assert_eq!(read.status, StatusCode::OK, "{:?}", read.body);
    read.body
}

/// Reports every running step a success, running the worker between, until the workflow ends or `stop_at`
/// steps are done.
async fn run_steps(api: &Api, id: &str, stop_at: usize) {
    let wf_id = id.parse().expect("workflow id");
    for _ in 0..20 {
        api.fleet.worker().run_until_idle().await.expect("worker");
        let wf = workflow(api, id).await;
        if wf["state"] != "running" || wf["progress"]["done"].as_u64() == Some(stop_at as u64) {
            return;
        }
        let step = wf["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .find(|s| s["state"] == "running")
            .cloned()
            .expect("a running step");
        let place: RunsOn = serde_json::from_value(step["runsOn"].clone()).expect("a place");
        let (index, attempt) =
            (step["index"].as_u64().expect("index") as u32, step["attempt"].as_u64().expect("attempt") as u32);
        api.fleet
            .app
            .report_step(
                &api.fleet.owner,
                &wf_id,
                index,
                attempt,
                place,
                Report::Succeeded { detail: Some(format!("{} done", step["name"])) },
            )
            .await
            .expect("report");
    }
    panic!("the workflow did not end");
}

#[tokio::test]
async fn an_inspection_runs_its_steps_in_order_and_leaves_the_machine_ready() {
    let api = Api::with_pki().await;
    let node = enrolled(&api).await;
    let started = api.post(&format!("/v1/nodes/{node}/workflows"), ROOT, json!({ "kind": "inspect" })).await;
    assert_eq!(started.status, StatusCode::CREATED, "{:?}", started.body);
    assert_eq!(
        (&started.body["state"], &started.body["progress"]),
        (&json!("running"), &json!({ "done": 0, "total": 4 }))
    );
    let id = started.body["id"].as_str().expect("id").to_owned();
    assert!(id.starts_with("wf_"), "{id}");
    assert_eq!(node_state(&api, &node).await, "inspecting");
    // One workflow at a time on a machine.
    let second = api.post(&format!("/v1/nodes/{node}/workflows"), ROOT, json!({ "kind": "inspect" })).await;
    assert_eq!(second.status, StatusCode::CONFLICT, "{:?}", second.body);

    api.fleet.worker().run_until_idle().await.expect("worker");
    let wf = workflow(&api, &id).await;
    assert_eq!(
        (&wf["steps"][0]["state"], &wf["steps"][0]["attempt"], &wf["steps"][1]["state"]),
        (&json!("running"), &json!(1), &json!("pending"))
    );
    run_steps(&api, &id, usize::MAX).await;
    let wf = workflow(&api, &id).await;
    assert_eq!((&wf["state"], &wf["progress"]["done"]), (&json!("succeeded"), &json!(4)), "{wf}");
    assert_eq!(wf["steps"][2]["detail"], "\"inspect\" done");
    assert_eq!(node_state(&api, &node).await, "ready");
    let listed = api.get(&format!("/v1/nodes/{node}/workflows"), ROOT).await;
    assert_eq!(listed.body["items"][0]["id"], json!(id));
    // A tenant that only uses the pool does not operate its machines' workflows.
    let theirs = api.get(&format!("/v1/workflows/{id}"), GUS).await;
    assert_eq!(theirs.status, StatusCode::FORBIDDEN, "{:?}", theirs.body);
    assert!(theirs.body["error"]["message"].as_str().unwrap_or("").contains("operator"), "{:?}", theirs.body);
}

#[tokio::test]
async fn a_step_out_of_time_is_retried_then_fails_the_workflow_and_the_machine() {
    let api = Api::with_pki().await;
    let node = enrolled(&api).await;
    let id = api.post(&format!("/v1/nodes/{node}/workflows"), ROOT, json!({ "kind": "inspect" })).await.body["id"]
        .as_str()
        .expect("id")
        .to_owned();
    // The first step has 120 s an attempt and three attempts; nobody runs it.
    api.fleet.advance_to(T0).await;
    for (n, at) in [(1, T0 + 121_000), (2, T0 + 242_000)] {
        api.fleet.advance_to(at).await;
        let wf = workflow(&api, &id).await;
        assert_eq!((&wf["steps"][0]["state"], &wf["steps"][0]["attempt"]), (&json!("running"), &json!(n + 1)), "{wf}");
    }
    api.fleet.advance_to(T0 + 363_000).await;
    let wf = workflow(&api, &id).await;
    assert_eq!(wf["state"], "failed", "{wf}");
    assert!(wf["reason"].as_str().unwrap_or("").contains("after 3 attempt"), "{wf}");
    assert_eq!(wf["steps"][0]["detail"], "no result within 120 s");
    assert_eq!(node_state(&api, &node).await, "failed");
}

#[tokio::test]
async fn a_deployment_runs_its_profile_and_a_cancelled_workflow_takes_no_more_reports() {
    let api = Api::with_images(bc_commands::images::ImagePolicy::default()).await;
    let node = enrolled(&api).await;
    // Deploying needs a ready machine and a profile.
    let early = api
        .post(
            &format!("/v1/nodes/{node}/workflows"),
            ROOT,
            json!({ "kind": "deploy", "profileId": "prof_00000000000000000000000000" }),
        )
        .await;
    assert_eq!(early.status, StatusCode::CONFLICT, "{:?}", early.body);
    assert!(early.body["error"]["message"].as_str().unwrap_or("").contains("is enrolling"), "{:?}", early.body);
    let no_profile = api.post(&format!("/v1/nodes/{node}/workflows"), ROOT, json!({ "kind": "deploy" })).await;
    assert_eq!((no_profile.status, no_profile.field()), (StatusCode::BAD_REQUEST, "profileId"));
    let inspect = api.post(&format!("/v1/nodes/{node}/workflows"), ROOT, json!({ "kind": "inspect" })).await;
    run_steps(&api, inspect.body["id"].as_str().expect("id"), usize::MAX).await;

    let profile = deploy_profile(&api).await;
    let deploy =
        api.post(&format!("/v1/nodes/{node}/workflows"), ROOT, json!({ "kind": "deploy", "profileId": profile })).await;
    assert_eq!(deploy.status, StatusCode::CREATED, "{:?}", deploy.body);
    assert_eq!(deploy.body["steps"][2]["runsOn"], "ramdisk");
    let id = deploy.body["id"].as_str().expect("id").to_owned();
    run_steps(&api, &id, 2).await;
    assert_eq!(node_state(&api, &node).await, "deploying");

    // The ramdisk is writing when the operator cancels: the machine is failed, a late report is refused.
    let wf_id = id.parse().expect("id");
    let app = &api.fleet.app;
    let wrong_place =
        app.report_step(&api.fleet.owner, &wf_id, 2, 1, RunsOn::Site, Report::Succeeded { detail: None }).await;
    assert!(wrong_place.is_err_and(|e| e.to_string().contains("runs on ramdisk")));
    let cancelled = api.post(&format!("/v1/workflows/{id}/cancel"), ROOT, json!({ "reason": "wrong image" })).await;
    assert_eq!(cancelled.status, StatusCode::OK, "{:?}", cancelled.body);
    assert_eq!((&cancelled.body["state"], &cancelled.body["reason"]), (&json!("cancelled"), &json!("wrong image")));
    assert_eq!(node_state(&api, &node).await, "failed");
    let late =
        app.report_step(&api.fleet.owner, &wf_id, 2, 1, RunsOn::Ramdisk, Report::Succeeded { detail: None }).await;
    assert!(late.is_err_and(|e| e.to_string().contains("cancelled")));
    let again = api.post(&format!("/v1/workflows/{id}/cancel"), ROOT, json!({})).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{:?}", again.body);

    // From failed, a release wipes it back to ready.
    let release = api.post(&format!("/v1/nodes/{node}/workflows"), ROOT, json!({ "kind": "release" })).await;
    assert_eq!(release.status, StatusCode::CREATED, "{:?}", release.body);
    run_steps(&api, release.body["id"].as_str().expect("id"), usize::MAX).await;
    assert_eq!(node_state(&api, &node).await, "ready");
}

#[tokio::test]
async fn a_machine_registered_with_its_gpus_has_no_workflows() {
    let api = Api::with_pki().await;
    let pool = api.pool().await;
    bc_projections::testing::catch_up(&api.fleet.t.db).await;
    let nodes = api.get(&format!("/v1/nodes?poolId={pool}"), ROOT).await;
    let node = nodes.body["items"][0]["id"].as_str().expect("a node").to_owned();
    let refused = api.post(&format!("/v1/nodes/{node}/workflows"), ROOT, json!({ "kind": "inspect" })).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{:?}", refused.body);
    assert!(refused.body["error"]["message"].as_str().unwrap_or("").contains("not enrolled"), "{:?}", refused.body);
    let bad = api.post(&format!("/v1/nodes/{node}/workflows"), ROOT, json!({ "kind": "dance" })).await;
    assert_eq!((bad.status, bad.field()), (StatusCode::BAD_REQUEST, "kind"), "{:?}", bad.body);
}

#[tokio::test]
async fn workflows_watch_follows_a_workflow_to_its_end_and_exits_by_its_outcome() {
    let api = Api::with_pki().await;
    let node = enrolled(&api).await;
    let id = api.post(&format!("/v1/nodes/{node}/workflows"), ROOT, json!({ "kind": "inspect" })).await.body["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let watch = |id: &str| {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_better-compute"))
            .args(["--log", "error", "workflows", "watch", id])
            .env("BETTER_COMPUTE_DATABASE_URL", api.fleet.t.url())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the watcher")
    };
    let watcher = watch(&id);
    run_steps(&api, &id, usize::MAX).await;
    let done = watcher.wait_with_output().await.expect("the watcher's end");
    let (stdout, stderr) = (String::from_utf8_lossy(&done.stdout), String::from_utf8_lossy(&done.stderr));
    assert!(done.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains(&format!("workflow {id} (inspect of node {node}) succeeded")), "{stdout}");

    // A cancelled workflow: the watcher says so and exits 1.
    let release = api.post(&format!("/v1/nodes/{node}/workflows"), ROOT, json!({ "kind": "release" })).await;
    assert_eq!(release.status, StatusCode::CONFLICT, "a ready machine is not released: {:?}", release.body);
    api.post(&format!("/v1/nodes/{node}/provision-state"), ROOT, json!({ "state": "rescue" })).await;
    let release = api.post(&format!("/v1/nodes/{node}/workflows"), ROOT, json!({ "kind": "release" })).await;
    let release_id = release.body["id"].as_str().expect("id").to_owned();
    let watcher = watch(&release_id);
    api.post(&format!("/v1/workflows/{release_id}/cancel"), ROOT, json!({ "reason": "changed my mind" })).await;
    let done = watcher.wait_with_output().await.expect("the watcher's end");
    let stdout = String::from_utf8_lossy(&done.stdout);
    assert_eq!(done.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("cancelled: changed my mind"), "{stdout}");
}

/// A metal profile of four steps (network boot, power, the image written, disk boot) deploying an unsigned
/// image: its id.
async fn deploy_profile(api: &Api) -> String {
    let data = b"an image".to_vec();
    let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&data));
    let headers = [("content-type", "application/octet-stream")];
    let (img, _) = api
        .call_raw(
            "POST",
            &format!("/v1/images?name=os&version=1&format=raw&sha256={sha}"),
            Some(ROOT),
            &headers,
            axum::body::Body::from(data),
        )
        .await;
    let profile = api
        .post(
            "/v1/profiles",
            ROOT,
            json!({
                "name": "gpu-node", "target": "metal", "allowUnverifiedImage": true,
                "drivers": { "power": "redfish", "boot": "redfish", "deploy": "bcd" },
                "imageId": img.body["id"],
                "steps": [
                    { "name": "net", "action": "boot-from-network" },
                    { "name": "on", "action": "power-reset" },
                    { "name": "write", "action": "write-image" },
                    { "name": "disk", "action": "boot-from-disk" }
                ]
            }),
        )
        .await;
    assert_eq!(profile.status, StatusCode::CREATED, "{:?}", profile.body);
    profile.body["id"].as_str().expect("id").to_owned()
}

/// Work items queued under `key` (a prefix when it ends with `%`).
async fn queued(api: &Api, key: &str) -> i64 {
    let mut tx = api.fleet.t.db.begin(bc_eventstore::TxOptions::READ_ONLY).await.expect("begin");
    let n: i64 = bc_eventstore::sql::query_scalar("SELECT count(*) FROM work_queue WHERE key LIKE $1")
        .bind(key)
        .fetch_one(tx.conn())
        .await
        .expect("count");
    tx.commit().await.expect("commit");
    n
}

#[tokio::test]
async fn a_machine_a_workflow_deploys_or_releases_has_its_pool_and_bookings_looked_at() {
    let api = Api::with_images(bc_commands::images::ImagePolicy::default()).await;
    let node = enrolled(&api).await;
    let inspect = api.post(&format!("/v1/nodes/{node}/workflows"), ROOT, json!({ "kind": "inspect" })).await;
    run_steps(&api, inspect.body["id"].as_str().expect("id"), usize::MAX).await;
    assert_eq!(node_state(&api, &node).await, "ready");
    let pool: String =
        api.get(&format!("/v1/nodes/{node}"), ROOT).await.body["poolId"].as_str().expect("pool").to_owned();
    api.fleet.worker().run_until_idle().await.expect("worker");
    let pending = format!("pool:{pool}:pending@%");
    assert_eq!(queued(&api, &pending).await, 0);

    // Deployed, the machine is schedulable: its pool's pending reservations are tried again.
    let profile = deploy_profile(&api).await;
    let deploy =
        api.post(&format!("/v1/nodes/{node}/workflows"), ROOT, json!({ "kind": "deploy", "profileId": profile })).await;
    let deploy_id = deploy.body["id"].as_str().expect("id").to_owned();
    run_steps(&api, &deploy_id, 3).await;
    // The last step's report, then one round of the worker: it ends the workflow, and only queues what follows.
    let last = workflow(&api, &deploy_id).await["steps"][3]["attempt"].as_u64().expect("attempt") as u32;
    let report = Report::Succeeded { detail: None };
    let wf_id = deploy_id.parse().expect("id");
    api.fleet.app.report_step(&api.fleet.owner, &wf_id, 3, last, RunsOn::Site, report).await.expect("report");
    api.fleet.worker().run_once().await.expect("a round");
    assert_eq!(workflow(&api, &deploy_id).await["state"], "succeeded");
    assert_eq!(node_state(&api, &node).await, "deployed");
    assert!(queued(&api, &pending).await > 0, "the pool's pending reservations were not woken");

    // Released, it no longer is: its future bookings are looked at to move them elsewhere.
    api.fleet.worker().run_until_idle().await.expect("worker");
    let replace = format!("node:{node}:replace");
    assert_eq!(queued(&api, &replace).await, 0);
    let release = api.post(&format!("/v1/nodes/{node}/workflows"), ROOT, json!({ "kind": "release" })).await;
    assert_eq!(release.status, StatusCode::CREATED, "{:?}", release.body);
    assert_eq!(queued(&api, &replace).await, 1, "the machine's bookings were not looked at");
}
