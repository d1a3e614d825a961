//! `GET /v1/healthz` through the router.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use std::sync::Arc;

use bc_api::http::{AppState, router};
use bc_commands::auth::BuiltinAuthorizer;
use bc_eventstore::testing::TestDb;
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

fn state(db: bc_eventstore::Db) -> AppState {
    let auth = Arc::new(BuiltinAuthorizer::from_toml(crate::http_api::AUTH).expect("auth"));
    AppState::new(bc_commands::App::new(db).with_authorizer(auth)).expect("state")
}

async fn get_healthz(state: AppState) -> (StatusCode, serde_json::Value) {
    let response = router(state)
        .oneshot(Request::get("/v1/healthz").body(Body::empty()).expect("request"))
        .await
        .expect("response");
    let status = response.status();
    let body = response.into_body().collect().await.expect("body").to_bytes();
    (status, serde_json::from_slice(&body).expect("json"))
}

#[tokio::test]
async fn healthz_is_ok_while_the_database_answers() {
    let t = TestDb::new().await;
    let (status, body) = get_healthz(state(t.db.clone())).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "ok");
}

#[tokio::test]
async fn healthz_is_503_unavailable_without_a_database() {
    let t = TestDb::new().await;
    // A pool on a database that does not exist: the server answers, the database does not.
    let db = bc_eventstore::Db::connect_lazy_with(
        t.connect_options().database("no_such_database"),
        &bc_eventstore::testing::test_db_config(),
    );
    let (status, body) = get_healthz(state(db)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["error"]["code"], "UNAVAILABLE");
    assert!(!body["error"]["message"].as_str().unwrap_or_default().contains("no_such_database"));
}
