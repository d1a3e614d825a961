//! The tamper-evident audit trail: per tenant and closed hour a signed Merkle checkpoint chained to the tenant's
//! previous one; inclusion proofs through the API that verify offline against the pinned audit key; a row
//! changed or deleted in the database afterwards is named by the offline verification, by the database's own and
//! by the binary's `audit verify`; and a tenant reads only its own checkpoints and proofs.

use std::path::Path;

use axum::http::StatusCode;
use bc_commands::testing::{HOUR, T0};
use bc_eventstore::{TxOptions, clock, sql};
use bc_projections::testing::catch_up;
use bc_wire::audit::{AuditBundleDto, AuditProofDto, CheckpointDto};
use bc_wire::fleet::AuditDto;
use serde_json::{Value, json};

use crate::http_api::{ALICE, Api, GUS, ROOT};

const MINUTE: i64 = 60_000;

fn reservation(pool: &str, count: u32) -> Value {
    json!({ "poolId": pool, "devices": { "class": "gpu", "count": count }, "duration": 3600 })
}

fn typed<T: serde::de::DeserializeOwned>(value: &Value) -> T {
    serde_json::from_value(value.clone()).expect("a body of its documented type")
}

/// What `better-compute audit export` would fetch, through the router as `token`.
async fn export(api: &Api, token: &str, proofs: &[&str]) -> AuditBundleDto {
    let listed = api.get("/v1/audit/checkpoints?limit=500", token).await;
    assert_eq!(listed.status, StatusCode::OK, "{:?}", listed.body);
    let mut checkpoints = Vec::new();
    for item in listed.body["items"].as_array().expect("items") {
        let id = item["id"].as_str().expect("id");
        let one = api.get(&format!("/v1/audit/checkpoints/{id}"), token).await;
        assert_eq!(one.status, StatusCode::OK, "{:?}", one.body);
        checkpoints.push(typed::<CheckpointDto>(&one.body));
    }
    let entries = api.get("/v1/audit?limit=500", token).await;
    let entries: Vec<AuditDto> = typed(&entries.body["items"]);
    let mut bundle = AuditBundleDto { public_key: None, checkpoints, entries, proofs: Vec::new() };
    for position in proofs {
        let proof = api.get(&format!("/v1/audit/proof?position={position}"), token).await;
        assert_eq!(proof.status, StatusCode::OK, "{:?}", proof.body);
        bundle.proofs.push(typed::<AuditProofDto>(&proof.body));
    }
    bundle
}

async fn execute(api: &Api, statement: &'static str, position: &str) -> u64 {
    let mut tx = api.fleet.t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    let done = sql::query(statement).bind(position).execute(tx.conn()).await.expect("tamper");
    tx.commit().await.expect("commit");
    done.rows_affected()
}

/// Runs the binary's `audit verify` on `args`, answering whether it succeeded and what it said.
async fn verify_with_binary(api: &Api, args: &[&str]) -> (bool, String) {
    let done = tokio::process::Command::new(env!("CARGO_BIN_EXE_better-compute"))
        .args(["--log", "error", "audit", "verify"])
        .args(args)
        .env("BETTER_COMPUTE_DATABASE_URL", api.fleet.t.url())
        .env_remove("BETTER_COMPUTE_PKI_DIR")
        .output()
        .await
        .expect("run better-compute audit verify");
    let said = format!("{}{}", String::from_utf8_lossy(&done.stdout), String::from_utf8_lossy(&done.stderr));
    (done.status.success(), said)
}

fn write_bundle(dir: &Path, name: &str, bundle: &AuditBundleDto) -> String {
    let path = dir.join(name);
    std::fs::write(&path, serde_json::to_vec(bundle).expect("json")).expect("write the bundle");
    path.to_str().expect("a UTF-8 path").to_owned()
}

#[tokio::test]
async fn hourly_checkpoints_chain_per_tenant_verify_offline_and_name_a_changed_or_deleted_row() {
    let api = Api::with_pki().await;
    let key = api.app.audit_signer().expect("the bundle's audit key").public_key_hex();
    let pool = api.pool().await;
    // Hour 0: both customers act.
    for (token, key) in [(ALICE, "a1"), (GUS, "g1"), (ALICE, "a2")] {
        let made = api.reserve(token, key, reservation(&pool, 1)).await;
        assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
    }
    catch_up(&api.fleet.t.db).await;
    // Nothing is checkpointed while the hour is open, nor right after its end.
    assert_eq!(api.app.make_audit_checkpoints().await.expect("checkpoints"), 0);
    clock::set_sim_clock(&api.fleet.t.db, T0 + HOUR + MINUTE).await.expect("clock");
    assert_eq!(api.app.make_audit_checkpoints().await.expect("checkpoints"), 0, "the hour closes 5 minutes late");
    clock::set_sim_clock(&api.fleet.t.db, T0 + HOUR + 10 * MINUTE).await.expect("clock");
    let made = api.app.make_audit_checkpoints().await.expect("checkpoints");
    assert_eq!(made, 3, "one each for root (the fleet's set-up), acme and globex");
    assert_eq!(api.app.make_audit_checkpoints().await.expect("again"), 0, "each hour once");
    // Hour 1: acme acts again; its second checkpoint chains to its first.
    let made = api.reserve(ALICE, "a3", reservation(&pool, 1)).await;
    assert_eq!(made.status, StatusCode::CREATED, "{:?}", made.body);
    catch_up(&api.fleet.t.db).await;
    clock::set_sim_clock(&api.fleet.t.db, T0 + 2 * HOUR + 10 * MINUTE).await.expect("clock");
    assert_eq!(api.app.make_audit_checkpoints().await.expect("checkpoints"), 1);

    let listed = api.get("/v1/audit/checkpoints", ALICE).await;
    assert_eq!(listed.status, StatusCode::OK, "{:?}", listed.body);
    let acme: Vec<CheckpointDto> = typed(&listed.body["items"]);
    assert_eq!(acme.len(), 2, "{:?}", listed.body);
    assert!(acme.iter().all(|c| c.tenant_id == "acme" && c.public_key == key && c.leaves.is_empty()));
    assert_eq!((acme[0].sequence, acme[0].hour, acme[1].sequence, acme[1].hour), (1, T0, 2, T0 + HOUR));
    assert_eq!(acme[0].previous_hash, "0".repeat(64));
    assert_eq!(acme[1].previous_hash, acme[0].hash, "the chain");
    let trail: Vec<AuditDto> = typed(&api.get("/v1/audit", ALICE).await.body["items"]);
    assert_eq!(acme[0].leaf_count + acme[1].leaf_count, trail.len() as i64, "every entry in one checkpoint");
    assert_eq!(
        (acme[0].first_position.as_str(), acme[1].last_position.as_str()),
        (trail[0].position.as_str(), trail[trail.len() - 1].position.as_str())
    );
    let served_key = api.get("/v1/pki/audit-key", ALICE).await;
    assert_eq!(served_key.body["publicKey"], key.as_str());

    // A proof and the whole export verify offline against the pinned key; another key refuses them.
    let first = trail[0].position.clone();
    let later = trail[trail.len() - 1].position.clone();
    let bundle = export(&api, ALICE, &[&first, &later]).await;
    assert_eq!(bundle.checkpoints.iter().map(|c| c.leaves.len() as i64).sum::<i64>(), trail.len() as i64);
    assert_eq!(bc_api::cli::audit::verify_bundle(&bundle, &key), vec![], "an untouched trail verifies");
    let other_key = "11".repeat(32);
    let refused = bc_api::cli::audit::verify_bundle(&bundle, &other_key);
    assert!(refused.iter().any(|f| f.message.contains("not the pinned")), "{refused:?}");
    assert_eq!(api.app.verify_audit_checkpoints(None, &key).await.expect("verify"), vec![]);
    let dir = bc_eventstore::testing::server().scratch_dir("audit-bundles");
    let good = write_bundle(&dir, "good.json", &bundle);
    let (ok, said) = verify_with_binary(&api, &[&good, "--public-key", &key]).await;
    assert!(ok, "{said}");

    // Tenancy: globex sees none of acme's; the platform's administrator sees them with ?tenant=.
    let acme_id = &acme[0].id;
    assert_eq!(api.get(&format!("/v1/audit/checkpoints/{acme_id}"), GUS).await.status, StatusCode::NOT_FOUND);
    assert_eq!(api.get(&format!("/v1/audit/proof?position={first}"), GUS).await.status, StatusCode::NOT_FOUND);
    let as_gus = api.get("/v1/audit/checkpoints?tenant=acme", GUS).await.status;
    assert_eq!(as_gus, api.get("/v1/fleet/audit?tenant=acme", GUS).await.status, "as the audit trail answers");
    assert!(as_gus.is_client_error(), "{as_gus}");
    let globex: Vec<CheckpointDto> = typed(&api.get("/v1/audit/checkpoints", GUS).await.body["items"]);
    assert_eq!(globex.iter().map(|c| c.tenant_id.as_str()).collect::<Vec<_>>(), ["globex"]);
    let as_root = api.get("/v1/audit/checkpoints?tenant=acme", ROOT).await;
    assert_eq!(typed::<Vec<CheckpointDto>>(&as_root.body["items"]), acme);
    assert_eq!(api.get(&format!("/v1/audit/checkpoints/{acme_id}"), ROOT).await.status, StatusCode::OK);
    assert_eq!(api.get(&format!("/v1/audit/proof?position={first}"), ROOT).await.status, StatusCode::OK);

    // Bad input is refused naming the field; an unknown checkpoint or position is not found.
    let bad = api.get("/v1/audit/proof?position=yesterday", ALICE).await;
    assert_eq!((bad.status, bad.field()), (StatusCode::BAD_REQUEST, "position"), "{:?}", bad.body);
    let bad = api.get("/v1/audit/proof", ALICE).await;
    assert_eq!((bad.status, bad.field()), (StatusCode::BAD_REQUEST, "position"), "{:?}", bad.body);
    let bad = api.get("/v1/audit/checkpoints/ckp_nothex", ALICE).await;
    assert_eq!((bad.status, bad.field()), (StatusCode::BAD_REQUEST, "checkpointId"), "{:?}", bad.body);
    let unknown = format!("/v1/audit/checkpoints/ckp_{}", "0".repeat(32));
    assert_eq!(api.get(&unknown, ALICE).await.status, StatusCode::NOT_FOUND);
    assert_eq!(api.get("/v1/audit/proof?position=1-1-1", ALICE).await.status, StatusCode::NOT_FOUND);

    // Someone with the database's password rewrites who did something.
    let changed =
        execute(&api, "UPDATE audit_events_v1 SET identity = 'mallory@acme' WHERE position = $1", &first).await;
    assert_eq!(changed, 1);
    let tampered = export(&api, ALICE, &[&first]).await;
    let failures = bc_api::cli::audit::verify_bundle(&tampered, &key);
    assert_eq!(failures.first().and_then(|f| f.position.as_deref()), Some(first.as_str()), "{failures:?}");
    assert!(
        failures[0].message.contains(&format!("entry {first} does not match checkpoint {acme_id}")),
        "{failures:?}"
    );
    assert!(
        failures.iter().any(|f| f.message == format!("entry {first} does not match checkpoint {acme_id} root")),
        "the proof fails too: {failures:?}"
    );
    let found = api.app.verify_audit_checkpoints(None, &key).await.expect("verify");
    assert_eq!(found.iter().map(|f| f.position.as_deref()).collect::<Vec<_>>(), [Some(first.as_str())], "{found:?}");
    let path = write_bundle(&dir, "tampered.json", &tampered);
    let (ok, said) = verify_with_binary(&api, &[&path, "--public-key", &key]).await;
    assert!(!ok && said.contains(&format!("entry {first} does not match checkpoint {acme_id}")), "{said}");
    let pki = crate::process::test_pki().to_str().expect("path").to_owned();
    let (ok, said) = verify_with_binary(&api, &["--database", "--pki-dir", &pki]).await;
    assert!(!ok && said.contains(&format!("entry {first}")), "{said}");

    // A deleted row is named too.
    let deleted = execute(&api, "DELETE FROM audit_events_v1 WHERE position = $1", &later).await;
    assert_eq!(deleted, 1);
    let found = api.app.verify_audit_checkpoints(Some(&"acme".parse().expect("tenant")), &key).await.expect("verify");
    assert!(
        found.iter().any(|f| f.position.as_deref() == Some(later.as_str()) && f.message.contains("is missing")),
        "{found:?}"
    );
    let failures = bc_api::cli::audit::verify_bundle(&export(&api, ALICE, &[]).await, &key);
    assert!(failures.iter().any(|f| f.message.contains(&format!("entry {later} of checkpoint"))), "{failures:?}");

    // A checkpoint rewritten to hide it breaks its signature and the chain.
    let mut tx = api.fleet.t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    sql::query("UPDATE audit_checkpoints SET leaf_count = leaf_count - 1 WHERE id = $1")
        .bind(&acme[1].id)
        .execute(tx.conn())
        .await
        .expect("rewrite");
    tx.commit().await.expect("commit");
    let found = api.app.verify_audit_checkpoints(Some(&"acme".parse().expect("tenant")), &key).await.expect("verify");
    let second = &acme[1].id;
    assert!(found.iter().any(|f| f.message == format!("checkpoint {second} signature invalid")), "{found:?}");
    assert!(found.iter().any(|f| f.message.contains(&format!("checkpoint {second} does not hash"))), "{found:?}");
    // Globex's trail is untouched and still verifies.
    let globex_found =
        api.app.verify_audit_checkpoints(Some(&"globex".parse().expect("tenant")), &key).await.expect("verify");
    assert_eq!(globex_found, vec![]);
}
