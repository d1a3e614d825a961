//! The boot path's control-plane side through the API: a site agent asks what an enrolled machine boots (the
//! ramdisk with a single-use boot credential while its workflow has ramdisk steps ahead, its own disk
//! otherwise); the ramdisk claims a session once, reads its steps and reports them; an inspection's inventory
//! becomes the node's hardware; a deployment hands out its image by hash and the deployed machine's join token,
//! and the machine's agent joining with it ends the deployment.

use axum::http::StatusCode;
use bc_agent::simulate;
use bc_domain::agent::JoinRequest;
use bc_domain::inventory::SectionHashes;
use bc_domain::node::Role;
use serde_json::{Value, json};

use crate::http_api::{Api, ROOT, Reply};

pub(crate) const MAC: &str = "52:54:00:aa:bb:01";

/// A joined agent's credential.
pub(crate) async fn join(api: &Api, pool: &str, token: Option<String>, host: &str, role: Role) -> (String, Value) {
    let token = match token {
        Some(token) => token,
        None => {
            let made = api.post(&format!("/v1/pools/{pool}/join-tokens"), ROOT, json!({})).await;
            assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
            made.body["token"].as_str().expect("token").to_owned()
        }
    };
    let request = JoinRequest {
        join_token: token,
        agent_version: "test".into(),
        inventory: inventory(host),
        csr: None,
        role: Some(role),
    };
    let joined =
        api.call("POST", "/v1/agent/join", None, &[], Some(serde_json::to_string(&request).expect("json"))).await;
    assert_eq!(joined.status, StatusCode::CREATED, "{:?}", joined.body);
    (joined.body["credential"].as_str().expect("credential").to_owned(), joined.body)
}

pub(crate) async fn as_(api: &Api, method: &str, uri: &str, token: &str, body: Option<Value>) -> Reply {
    api.call(method, uri, Some(token), &[], body.map(|b| b.to_string())).await
}

pub(crate) async fn workflow(api: &Api, id: &str) -> Value {
    api.fleet.worker().run_until_idle().await.expect("worker");
    let read = api.get(&format!("/v1/workflows/{id}"), ROOT).await;
    assert_eq!(read.status, StatusCode::OK, "{:?}", read.body);
    read.body
}

pub(crate) async fn node(api: &Api, id: &str) -> Value {
    bc_projections::testing::catch_up(&api.fleet.t.db).await;
    api.get(&format!("/v1/nodes/{id}"), ROOT).await.body
}

/// Reports the running site step of a workflow a success, through the site agent's route.
pub(crate) async fn site_step_done(api: &Api, site: &str, wf: &str) {
    let body = workflow(api, wf).await;
    let step = body["steps"].as_array().expect("steps").iter().find(|s| s["state"] == "running").cloned();
    let step = step.expect("a running step");
    assert_eq!(step["runsOn"], "site", "{body}");
    let index = step["index"].as_u64().expect("index");
    let uri = format!("/v1/agent/site/steps/{wf}/{index}");
    let done = as_(api, "POST", &uri, site, Some(json!({ "attempt": step["attempt"], "ok": true }))).await;
    assert_eq!(done.status, StatusCode::OK, "{:?}", done.body);
}

/// A ramdisk session for the machine's running workflow, as its boot gets it.
pub(crate) async fn boot_ramdisk(api: &Api, site: &str) -> (String, String) {
    let answer = as_(api, "GET", &format!("/v1/agent/site/boot?mac={MAC}"), site, None).await;
    assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.body);
    let token = answer.body["bootToken"].as_str().expect("a boot credential").to_owned();
    assert!(token.starts_with("rbt_"), "{token}");
    let claimed =
        api.call("POST", "/v1/ramdisk/sessions", None, &[], Some(json!({ "bootToken": token }).to_string())).await;
    assert_eq!(claimed.status, StatusCode::CREATED, "{:?}", claimed.body);
    (token, claimed.body["token"].as_str().expect("session").to_owned())
}

struct Machine {
    api: Api,
    pool: String,
    node: String,
    site: String,
}

/// A pool with a site agent and a machine enrolled with its boot MAC.
async fn machine() -> Machine {
    let api = Api::with_pki().await;
    let pool = api.pool().await;
    let enrol = |name: &str, mac: &str| {
        json!({
            "poolId": pool, "name": name, "bootMac": mac,
            "bmc": { "driver": "redfish", "address": "https://10.1.2.3", "username": "admin", "password": "pw" }
        })
    };
    let made = api.post("/v1/nodes/enrol", ROOT, enrol("metal-1", "52-54-00-AA-BB-01")).await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
    let node_id = made.body["id"].as_str().expect("id").to_owned();
    assert_eq!(node(&api, &node_id).await["bmc"]["bootMac"], MAC, "kept lowercase, with colons");
    let twice = api.post("/v1/nodes/enrol", ROOT, enrol("metal-2", MAC)).await;
    assert_eq!(twice.status, StatusCode::CONFLICT, "{:?}", twice.body);
    assert!(twice.body["error"]["message"].as_str().unwrap_or("").contains(MAC), "{:?}", twice.body);
    let bad = api.post("/v1/nodes/enrol", ROOT, enrol("metal-3", "52:54:00:aa:bb")).await;
    assert_eq!((bad.status, &bad.body["error"]["details"]["field"]), (StatusCode::BAD_REQUEST, &json!("bootMac")));
    let (site, _) = join(&api, &pool, None, "site-1", Role::Site).await;
    Machine { api, pool, node: node_id, site }
}

#[tokio::test]
async fn a_ramdisk_inspects_a_machine_with_a_single_use_boot_credential_and_its_inventory_becomes_the_node() {
    let Machine { api, pool, node: node_id, site } = machine().await;
    // Nothing runs on the machine: it boots from its disk; an unknown machine too; a boot names the machine.
    let idle = as_(&api, "GET", &format!("/v1/agent/site/boot?mac={MAC}"), &site, None).await;
    assert_eq!((idle.status, &idle.body), (StatusCode::OK, &json!({ "nodeId": node_id })));
    let unknown = as_(&api, "GET", "/v1/agent/site/boot?mac=52:54:00:00:00:09", &site, None).await;
    assert_eq!((unknown.status, &unknown.body), (StatusCode::OK, &json!({})));
    let nameless = as_(&api, "GET", "/v1/agent/site/boot", &site, None).await;
    assert_eq!(nameless.status, StatusCode::BAD_REQUEST, "{:?}", nameless.body);

    let started = api.post(&format!("/v1/nodes/{node_id}/workflows"), ROOT, json!({ "kind": "inspect" })).await;
    assert_eq!(started.status, StatusCode::CREATED, "{:?}", started.body);
    let wf = started.body["id"].as_str().expect("id").to_owned();
    workflow(&api, &wf).await;

    // A host's agent is not a site agent: it gets no boot answers.
    let (host, _) = join(&api, &pool, None, "host-9", Role::Host).await;
    let refused = as_(&api, "GET", &format!("/v1/agent/site/boot?mac={MAC}"), &host, None).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{:?}", refused.body);

    // Each boot gets its own credential. A claim whose answer was lost may be made again while its session was
    // never used (the new session replaces it); from the session's first use on, the credential is spent.
    let (first_token, lost) = boot_ramdisk(&api, &site).await;
    let claim = || {
        let body = json!({ "bootToken": first_token }).to_string();
        api.call("POST", "/v1/ramdisk/sessions", None, &[], Some(body))
    };
    let retried = claim().await;
    assert_eq!(retried.status, StatusCode::CREATED, "{:?}", retried.body);
    let first = retried.body["token"].as_str().expect("session").to_owned();
    assert_ne!(first, lost);
    let replaced = as_(&api, "GET", "/v1/ramdisk/work", &lost, None).await;
    assert_eq!(replaced.status, StatusCode::UNAUTHORIZED, "{:?}", replaced.body);
    assert_eq!(as_(&api, "GET", "/v1/ramdisk/work", &first, None).await.status, StatusCode::OK);
    let again = claim().await;
    assert_eq!(again.status, StatusCode::UNAUTHORIZED, "{:?}", again.body);
    assert!(again.body["error"]["message"].as_str().unwrap_or("").contains("already claimed"), "{:?}", again.body);
    // A later boot's claim ends the earlier session.
    let (_, session) = boot_ramdisk(&api, &site).await;
    let over = as_(&api, "GET", "/v1/ramdisk/work", &first, None).await;
    assert_eq!(over.status, StatusCode::UNAUTHORIZED, "{:?}", over.body);
    let forged = as_(&api, "GET", "/v1/ramdisk/work", "rds_forged", None).await;
    assert_eq!(forged.status, StatusCode::UNAUTHORIZED, "{:?}", forged.body);

    // The workflow is at a site step: the ramdisk waits.
    let waiting = as_(&api, "GET", "/v1/ramdisk/work", &session, None).await;
    assert_eq!(waiting.body, json!({ "workflowId": wf, "nodeId": node_id, "ended": false }));
    site_step_done(&api, &site, &wf).await;
    site_step_done(&api, &site, &wf).await;
    workflow(&api, &wf).await;
    let work = as_(&api, "GET", "/v1/ramdisk/work", &session, None).await;
    assert_eq!(
        (&work.body["step"]["action"], &work.body["step"]["index"], &work.body["step"]["attempt"]),
        (&json!("inspect"), &json!(2), &json!(1)),
        "{:?}",
        work.body
    );

    // An inspection reports the inventory; a report on a site step is refused; the same report twice is one.
    let bare = as_(&api, "POST", "/v1/ramdisk/steps/2", &session, Some(json!({ "attempt": 1, "ok": true }))).await;
    assert_eq!((bare.status, &bare.body["error"]["details"]["field"]), (StatusCode::BAD_REQUEST, &json!("inventory")));
    let report = json!({ "attempt": 1, "ok": true, "message": "inspected", "inventory": inventory("metal-1") });
    for _ in 0..2 {
        let done = as_(&api, "POST", "/v1/ramdisk/steps/2", &session, Some(report.clone())).await;
        assert_eq!(done.status, StatusCode::OK, "{:?}", done.body);
    }
    let elsewhere = as_(&api, "POST", "/v1/ramdisk/steps/3", &session, Some(json!({ "attempt": 1, "ok": true }))).await;
    assert_eq!(elsewhere.status, StatusCode::FORBIDDEN, "{:?}", elsewhere.body);
    let found = node(&api, &node_id).await;
    assert_eq!((&found["gpuCount"], &found["schedulable"]), (&json!(2), &json!(false)), "{found}");
    assert!(found["hardwareKey"].is_string(), "the deployed agent will be recognised by it: {found}");
    let steps = workflow(&api, &wf).await;
    assert_eq!(steps["steps"][2]["state"], "succeeded", "{steps}");

    site_step_done(&api, &site, &wf).await;
    let ended = workflow(&api, &wf).await;
    assert_eq!(ended["state"], "succeeded", "{ended}");
    assert_eq!(node(&api, &node_id).await["provisionState"], "ready");
    let work = as_(&api, "GET", "/v1/ramdisk/work", &session, None).await;
    assert_eq!((&work.body["ended"], work.body.get("step")), (&json!(true), None));
    let idle = as_(&api, "GET", &format!("/v1/agent/site/boot?mac={MAC}"), &site, None).await;
    assert_eq!(idle.body, json!({ "nodeId": node_id }), "after the workflow the machine boots its disk");
}

/// The inventory of the simulated machine `host` (two H100s), as its ramdisk or agent reports it.
pub(crate) fn inventory(host: &str) -> bc_domain::inventory::InventoryReport {
    let spec: simulate::Simulated = "2xH100".parse().expect("spec");
    simulate::inventory(host, &spec).report(&SectionHashes::default())
}

/// Uploads `data` as a raw image and makes the metal profile `name` that deploys it (hostname `hostname`, an
/// empty cloud-config); answers the image's SHA-256 and the profile's id.
pub(crate) async fn raw_image_profile(api: &Api, name: &str, hostname: &str, data: &[u8]) -> (String, String) {
    let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(data));
    let headers = [("content-type", "application/octet-stream")];
    let uri = format!("/v1/images?name={name}-os&version=1&format=raw&sha256={sha}");
    let (img, _) = api.call_raw("POST", &uri, Some(ROOT), &headers, axum::body::Body::from(data.to_vec())).await;
    assert_eq!(img.status, StatusCode::CREATED, "{:?}", img.body);
    let profile = api
        .post(
            "/v1/profiles",
            ROOT,
            json!({
                "name": name, "target": "metal", "allowUnverifiedImage": true,
                "drivers": { "power": "redfish", "boot": "redfish", "deploy": "bcd" },
                "imageId": img.body["id"], "userData": "#cloud-config\n", "hostConfig": { "hostname": hostname }
            }),
        )
        .await;
    assert_eq!(profile.status, StatusCode::CREATED, "{:?}", profile.body);
    (sha, profile.body["id"].as_str().expect("id").to_owned())
}

/// Runs a workflow to its end: site steps reported by the site agent, ramdisk steps by `ramdisk` (which says
/// what each returns), until it ends or reaches a step of another place.
pub(crate) async fn drive(
    api: &Api,
    site: &str,
    session: &str,
    wf: &str,
    ramdisk: &mut dyn FnMut(&Value) -> Value,
) -> Value {
    for _ in 0..20 {
        let body = workflow(api, wf).await;
        let Some(step) = body["steps"].as_array().expect("steps").iter().find(|s| s["state"] == "running").cloned()
        else {
            return body;
        };
        match step["runsOn"].as_str() {
            Some("site") => site_step_done(api, site, wf).await,
            Some("ramdisk") => {
                let work = as_(api, "GET", "/v1/ramdisk/work", session, None).await;
                let step = &work.body["step"];
                let report = ramdisk(step);
                let uri = format!("/v1/ramdisk/steps/{}", step["index"]);
                let done = as_(api, "POST", &uri, session, Some(report)).await;
                assert_eq!(done.status, StatusCode::OK, "{:?}", done.body);
            }
            _ => return body,
        }
    }
    panic!("the workflow did not end");
}

#[tokio::test]
async fn a_deployment_writes_its_image_by_hash_and_ends_when_the_deployed_agent_joins_with_its_token() {
    let Machine { api, pool, node: node_id, site } = machine().await;
    let inspect = api.post(&format!("/v1/nodes/{node_id}/workflows"), ROOT, json!({ "kind": "inspect" })).await;
    let inspect = inspect.body["id"].as_str().expect("id").to_owned();
    workflow(&api, &inspect).await;
    let (_, session) = boot_ramdisk(&api, &site).await;
    let ended = drive(&api, &site, &session, &inspect, &mut |step| {
        assert_eq!(step["action"], "inspect");
        json!({ "attempt": step["attempt"], "ok": true, "inventory": inventory("metal-1") })
    })
    .await;
    assert_eq!(ended["state"], "succeeded", "{ended}");

    let data = b"a whole disk, byte for byte".repeat(1000);
    let (sha, profile_id) = raw_image_profile(&api, "gpu-node", "gpu-1", &data).await;
    // The site agent may fetch an image only while a deployment at its site writes it.
    let early = as_(&api, "GET", &format!("/v1/agent/site/images/{sha}"), &site, None).await;
    assert_eq!(early.status, StatusCode::NOT_FOUND, "{:?}", early.body);

    let deploy = api
        .post(&format!("/v1/nodes/{node_id}/workflows"), ROOT, json!({ "kind": "deploy", "profileId": profile_id }))
        .await;
    assert_eq!(deploy.status, StatusCode::CREATED, "{:?}", deploy.body);
    let deploy = deploy.body["id"].as_str().expect("id").to_owned();
    workflow(&api, &deploy).await;
    let uri = format!("/v1/agent/site/images/{sha}");
    let (fetched, bytes) = api.call_raw("GET", &uri, Some(&site), &[], axum::body::Body::empty()).await;
    assert_eq!(fetched.status, StatusCode::OK);
    assert!(bytes == data, "the image's bytes");
    let bad = as_(&api, "GET", "/v1/agent/site/images/ABC", &site, None).await;
    assert_eq!((bad.status, &bad.body["error"]["details"]["field"]), (StatusCode::BAD_REQUEST, &json!("sha256")));

    let (_, session) = boot_ramdisk(&api, &site).await;
    let mut join_token = None;
    let waiting = drive(&api, &site, &session, &deploy, &mut |step| {
        match step["action"].as_str() {
            Some("write-image") => {
                assert_eq!(
                    (&step["image"]["sha256"], &step["image"]["size"], &step["image"]["format"]),
                    (&json!(sha), &json!(data.len()), &json!("raw"))
                );
            }
            Some("write-config") => {
                let config = &step["config"];
                assert_eq!((&config["hostname"], &config["userData"]), (&json!("gpu-1"), &json!("#cloud-config\n")));
                join_token = config["joinToken"].as_str().map(str::to_owned);
            }
            other => panic!("the ramdisk got {other:?}"),
        }
        json!({ "attempt": step["attempt"], "ok": true })
    })
    .await;
    let current = waiting["steps"].as_array().expect("steps").iter().find(|s| s["state"] == "running").cloned();
    assert_eq!(current.as_ref().map(|s| &s["action"]), Some(&json!("await-join")), "{waiting}");
    assert_eq!(node(&api, &node_id).await["provisionState"], "deploying");

    // The deployed machine's agent joins with the token of its configuration and is recognised as the node.
    let token = join_token.expect("a join token in the configuration");
    let (_, joined) = join(&api, &pool, Some(token.clone()), "metal-1", Role::Host).await;
    assert_eq!((&joined["nodeId"], &joined["rejoined"]), (&json!(node_id), &json!(true)));
    let done = workflow(&api, &deploy).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    let deployed = node(&api, &node_id).await;
    assert_eq!((&deployed["provisionState"], &deployed["connectivity"]), (&json!("deployed"), &json!("connected")));
    let reused = api
        .call(
            "POST",
            "/v1/agent/join",
            None,
            &[],
            Some(
                serde_json::to_string(&JoinRequest {
                    join_token: token,
                    agent_version: "test".into(),
                    inventory: inventory("metal-1"),
                    csr: None,
                    role: None,
                })
                .expect("json"),
            ),
        )
        .await;
    assert_eq!(reused.status, StatusCode::UNAUTHORIZED, "a join token admits one machine: {:?}", reused.body);
}
