//! Machines from their BMC through the API: enrolment seals the credentials and starts the lifecycle in
//! `enrolling`; moves follow DESIGN section 10 and a move it does not allow names the state; a transitional
//! state that outlasts its limit goes to `failed`.

use axum::http::StatusCode;
use bc_commands::testing::T0;
use bc_eventstore::{TxOptions, sql};
use serde_json::{Value, json};

use crate::http_api::{Api, GUS, ROOT};

const PASSWORD: &str = "correct horse battery staple";

fn enrolment(pool: &str, name: &str) -> Value {
    json!({
        "poolId": pool,
        "name": name,
        "bmc": { "driver": "redfish", "address": "https://10.1.2.3:8443", "systemId": "1",
                 "username": "admin", "password": PASSWORD }
    })
}

async fn state_of(api: &Api, node: &str) -> Value {
    let read = api.get(&format!("/v1/nodes/{node}"), ROOT).await;
    assert_eq!(read.status, StatusCode::OK, "{:?}", read.body);
    read.body
}

async fn provision(api: &Api, node: &str, state: &str) -> crate::http_api::Reply {
    api.post(&format!("/v1/nodes/{node}/provision-state"), ROOT, json!({ "state": state, "reason": "test" })).await
}

#[tokio::test]
async fn an_enrolled_machine_starts_enrolling_with_its_bmc_and_its_credentials_sealed_out_of_the_log() {
    let api = Api::with_pki().await;
    let pool = api.pool().await;
    let made = api.post("/v1/nodes/enrol", ROOT, enrolment(&pool, "metal-1")).await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
    let node = made.body["id"].as_str().expect("id").to_owned();
    bc_projections::testing::catch_up(&api.fleet.t.db).await;
    let read = state_of(&api, &node).await;
    assert_eq!(
        (&read["provisionState"], &read["gpuCount"], &read["schedulable"]),
        (&json!("enrolling"), &json!(0), &json!(false))
    );
    assert_eq!(read["bmc"]["driver"], "redfish");
    assert_eq!(read["bmc"]["drivers"]["power"], "redfish");
    assert_eq!(read["bmc"]["drivers"]["deploy"], "bcd");
    assert_eq!(read["provisionSince"], json!(T0));
    assert!(!read.to_string().contains(PASSWORD), "the password is never shown");

    // The credentials are a sealed secret, not in any event, and open back with the bundle.
    let mut tx = api.fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let in_log: i64 =
        sql::query_scalar("SELECT count(*) FROM events WHERE position(convert_to($1, 'UTF8') IN payload) > 0")
            .bind(PASSWORD)
            .fetch_one(tx.conn())
            .await
            .expect("search the log");
    let sealed: Vec<u8> =
        sql::query_scalar("SELECT sealed FROM sealed_secrets WHERE kind = 'bmc-credentials' AND owner_id = $1")
            .bind(&node)
            .fetch_one(tx.conn())
            .await
            .expect("a sealed secret");
    tx.commit().await.expect("commit");
    assert_eq!(in_log, 0, "no event holds the password");
    assert!(!sealed.windows(PASSWORD.len()).any(|w| w == PASSWORD.as_bytes()), "sealed, not in the clear");
    let bundle = std::sync::Arc::new(bc_pki::Bundle::load(crate::process::test_pki()).expect("bundle"));
    let app = bc_commands::App::new(api.fleet.t.db.clone()).with_pki(bundle);
    let opened = app.bmc_credentials(&node.parse().expect("node id")).await.expect("open").expect("some");
    assert_eq!((opened.username.as_str(), opened.password.as_str()), ("admin", PASSWORD));

    // The name is the pool's once.
    let again = api.post("/v1/nodes/enrol", ROOT, enrolment(&pool, "metal-1")).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{:?}", again.body);
}

#[tokio::test]
async fn enrolment_needs_a_pki_bundle_to_seal_the_credentials() {
    let api = Api::new().await;
    let pool = api.pool().await;
    let events = api.events().await;
    let refused = api.post("/v1/nodes/enrol", ROOT, enrolment(&pool, "metal-1")).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{:?}", refused.body);
    assert!(refused.body["error"]["message"].as_str().unwrap_or("").contains("PKI"), "{:?}", refused.body);
    assert_eq!(api.events().await, events);
}

#[tokio::test]
async fn the_lifecycle_moves_as_the_design_says_and_a_wrong_move_names_the_state() {
    let api = Api::with_pki().await;
    let pool = api.pool().await;
    let node = api.post("/v1/nodes/enrol", ROOT, enrolment(&pool, "metal-1")).await.body["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let wrong = provision(&api, &node, "deployed").await;
    assert_eq!(wrong.status, StatusCode::CONFLICT, "{:?}", wrong.body);
    let message = wrong.body["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("is enrolling") && message.contains("inspecting"), "{message}");
    for state in
        ["inspecting", "commissioning", "ready", "deploying", "deployed", "releasing", "ready", "retiring", "retired"]
    {
        let moved = provision(&api, &node, state).await;
        assert_eq!(moved.status, StatusCode::OK, "to {state}: {:?}", moved.body);
        bc_projections::testing::catch_up(&api.fleet.t.db).await;
        assert_eq!(state_of(&api, &node).await["provisionState"], state);
    }
    let final_ = provision(&api, &node, "failed").await;
    assert_eq!(final_.status, StatusCode::CONFLICT, "{:?}", final_.body);
    assert!(final_.body["error"]["message"].as_str().unwrap_or("").contains("final"), "{:?}", final_.body);

    // Each move is an event naming where from and where to, with the reason.
    let mut tx = api.fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let moves: i64 =
        sql::query_scalar("SELECT count(*) FROM events WHERE stream_id = $1 AND event_type = 'node.provision_changed'")
            .bind(&node)
            .fetch_one(tx.conn())
            .await
            .expect("count");
    tx.commit().await.expect("commit");
    assert_eq!(moves, 9);
}

#[tokio::test]
async fn a_machine_stuck_in_a_transitional_state_fails_once_its_limit_passes() {
    let api = Api::with_pki().await;
    let pool = api.pool().await;
    let node = api.post("/v1/nodes/enrol", ROOT, enrolment(&pool, "metal-1")).await.body["id"]
        .as_str()
        .expect("id")
        .to_owned();
    api.fleet.advance_to(T0 + 5 * 60_000).await;
    assert_eq!(provision(&api, &node, "inspecting").await.status, StatusCode::OK);
    // Enrolling's limit (10 minutes from enrolment) passes without effect: the node moved on.
    api.fleet.advance_to(T0 + 11 * 60_000).await;
    bc_projections::testing::catch_up(&api.fleet.t.db).await;
    assert_eq!(state_of(&api, &node).await["provisionState"], "inspecting");
    // Inspecting's (30 minutes from T0 + 5 min) does fail it.
    api.fleet.advance_to(T0 + 36 * 60_000).await;
    bc_projections::testing::catch_up(&api.fleet.t.db).await;
    let read = state_of(&api, &node).await;
    assert_eq!(read["provisionState"], "failed", "{read}");
    assert!(read.get("provisionSince").is_none(), "failed has no limit");
    let mut tx = api.fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let payload: Vec<u8> = sql::query_scalar(
        "SELECT payload FROM events WHERE stream_id = $1 AND event_type = 'node.provision_changed' ORDER BY stream_version DESC LIMIT 1",
    )
    .bind(&node)
    .fetch_one(tx.conn())
    .await
    .expect("the last move");
    tx.commit().await.expect("commit");
    let event: bc_domain::node::NodeProvisionChanged = rmp_serde::from_slice(&payload).expect("decode");
    assert_eq!(event.reason.as_deref(), Some("stuck in inspecting for more than 1800 s"));
    // From failed, it may be inspected again.
    assert_eq!(provision(&api, &node, "inspecting").await.status, StatusCode::OK);
}

#[tokio::test]
async fn bad_enrolments_are_refused_naming_the_field_and_record_nothing() {
    let api = Api::with_pki().await;
    let pool = api.pool().await;
    let events = api.events().await;
    let with = |path: &[&str], value: Value| {
        let mut body = enrolment(&pool, "metal-1");
        let mut at = &mut body;
        for key in &path[..path.len() - 1] {
            at = &mut at[*key];
        }
        at[path[path.len() - 1]] = value;
        body
    };
    for (body, field) in [
        (with(&["bmc", "address"], json!("10.1.2.3")), "bmc.address"),
        (with(&["bmc", "driver"], json!("telnet")), "bmc.driver"),
        (with(&["bmc", "password"], json!("")), "bmc.password"),
        (with(&["bmc", "username"], json!("a\u{0000}b")), "bmc.username"),
        (with(&["bmc", "colour"], json!("red")), "bmc.colour"),
        (with(&["drivers"], json!({ "power": "ipmi" })), "drivers.power"),
        (with(&["drivers"], json!({ "deploy": "redfish" })), "drivers.deploy"),
        (with(&["name"], json!("")), "name"),
    ] {
        let refused = api.post("/v1/nodes/enrol", ROOT, body).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{field}: {:?}", refused.body);
        assert_eq!(refused.field(), field, "{:?}", refused.body);
    }
    // A pool the caller does not operate.
    let theirs = api.post("/v1/nodes/enrol", GUS, enrolment(&pool, "metal-1")).await;
    // A tenant that only uses the pool does not operate it.
    assert_eq!(theirs.status, StatusCode::FORBIDDEN, "{:?}", theirs.body);
    assert!(theirs.body["error"]["message"].as_str().unwrap_or("").contains("operator"), "{:?}", theirs.body);
    let bad_state = api
        .post(
            &format!("/v1/nodes/{}/provision-state", "node_00000000000000000000000000"),
            ROOT,
            json!({ "state": "flying" }),
        )
        .await;
    assert_eq!((bad_state.status, bad_state.field()), (StatusCode::BAD_REQUEST, "state"), "{:?}", bad_state.body);
    assert_eq!(api.events().await, events, "nothing recorded");
}
