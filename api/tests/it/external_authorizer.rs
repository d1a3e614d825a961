//! The external authorizer: a decision service over real HTTP decides every call, from what Better Compute
//! resolved in its own tables; a service that does not answer refuses instead of allowing.

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::http::StatusCode;
use bc_api::authorizer::HttpAuthorizer;
use bc_api::http::{AppState, router};
use serde_json::{Value, json};

use crate::http_api::Api;

/// A decision service: `ext-token-alice` is alice of acme; acme may list pools, is refused sites with a reason,
/// and the rest does not resolve for it. Every decide request it received is kept.
async fn decision_service() -> (String, Arc<Mutex<Vec<Value>>>) {
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let kept = Arc::clone(&seen);
    let app = axum::Router::new()
        .route(
            "/authenticate",
            axum::routing::post(|Json(body): Json<Value>| async move {
                if body["token"] == "ext-token-alice" {
                    (
                        StatusCode::OK,
                        Json(json!({ "tenantId": "acme", "identity": "alice@acme", "ancestors": ["root"] })),
                    )
                } else {
                    (StatusCode::UNAUTHORIZED, Json(json!({})))
                }
            }),
        )
        .route(
            "/decide",
            axum::routing::post(move |Json(body): Json<Value>| {
                let kept = Arc::clone(&kept);
                async move {
                    kept.lock().expect("lock").push(body.clone());
                    Json(match body["method"].as_str() {
                        Some("pools.list" | "events.tickets.create") => json!({ "decision": "allow" }),
                        Some("sites.create") => json!({ "decision": "deny", "reason": "acme builds no sites" }),
                        Some("projects.create") => json!({ "decision": "maybe" }),
                        _ => json!({ "decision": "not_found" }),
                    })
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    (url, seen)
}

fn api_over(api: &Api, url: &str) -> axum::Router {
    let auth = Arc::new(HttpAuthorizer::new(url, None).expect("authorizer"));
    let app = bc_commands::App::new(api.fleet.t.db.clone()).with_authorizer(auth);
    router(AppState::new(app).expect("the method table checks out"))
}

#[tokio::test]
async fn an_external_decision_service_decides_every_call_and_a_silent_one_refuses() {
    let base = Api::new().await;
    let pool = base.pool().await;
    let (url, seen) = decision_service().await;
    let api = Api { router: api_over(&base, &url), app: base.app.clone(), fleet: base.fleet };
    assert_eq!(api.get("/v1/pools", "ext-token-alice").await.status, StatusCode::OK);
    let refused = api.post("/v1/sites", "ext-token-alice", json!({ "name": "x", "iamRegion": "eu-west-1" })).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert_eq!(refused.body["error"]["message"], "acme builds no sites");
    let hidden = api.get(&format!("/v1/pools/{pool}"), "ext-token-alice").await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND);
    // A decision it does not know is a refusal, never an allow.
    let odd = api.post("/v1/projects", "ext-token-alice", json!({ "name": "p" })).await;
    assert_eq!(odd.status, StatusCode::FORBIDDEN, "{:?}", odd.body);
    assert_eq!(api.get("/v1/pools", "another-token-0000").await.status, StatusCode::UNAUTHORIZED);
    // It was asked with the method, its action, and the pool as Better Compute resolved it.
    let asked = seen.lock().expect("lock").clone();
    let get = asked.iter().find(|b| b["method"] == "pools.get").expect("pools.get was asked");
    assert_eq!(get["action"], "compute:pools.get");
    assert_eq!(get["principal"]["identity"], "alice@acme");
    assert_eq!(
        (get["resource"]["type"].as_str(), get["resource"]["id"].as_str()),
        (Some("compute-pool"), Some(pool.as_str()))
    );
    assert_eq!(get["resource"]["parent"]["ownerTenantId"], "root");
    // Tenancy is the decision service's: these routes say so.
    let tenants = api.post("/v1/tenants", "ext-token-alice", json!({ "tenantId": "x", "name": "x" })).await;
    assert_ne!(tenants.status, StatusCode::CREATED, "{:?}", tenants.body);

    // A decision service that is gone refuses everything (after its timeout), and nothing is written.
    let gone = Api { router: api_over(&api, "http://127.0.0.1:9"), app: api.app.clone(), fleet: api.fleet };
    let before = gone.events().await;
    assert_eq!(gone.get("/v1/pools", "ext-token-alice").await.status, StatusCode::UNAUTHORIZED);
    assert_eq!(gone.events().await, before);
    assert!(HttpAuthorizer::new("https://iam.example", None).is_err(), "https needs the CA it chains to");
    assert!(HttpAuthorizer::new("iam.example", None).is_err());
}
