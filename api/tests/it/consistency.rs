//! Consistency tokens: a read that names a command's position sees that command's effect, or answers
//! `NOT_YET_CONSISTENT` with the position reached.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use bc_api::http::{AppState, router};
use bc_commands::auth::BuiltinAuthorizer;
use bc_commands::fleet::OfferPool;
use bc_commands::reads::Page;
use bc_domain::pool::Sharing;
use bc_projections::framework::{self, DaemonConfig};
use bc_projections::models;
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

use bc_commands::testing::{Fleet, caller};

async fn get(state: AppState, uri: &str, header: Option<&str>) -> (StatusCode, serde_json::Value) {
    let mut request = Request::get(uri).header("authorization", format!("Bearer {}", crate::http_api::ROOT));
    if let Some(position) = header {
        request = request.header("X-Min-Position", position);
    }
    let response = router(state).oneshot(request.body(Body::empty()).expect("request")).await.expect("response");
    let status = response.status();
    let body = response.into_body().collect().await.expect("body").to_bytes();
    (status, serde_json::from_slice(&body).expect("json"))
}

#[tokio::test]
async fn a_read_after_a_commands_position_sees_its_effect() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    let offer = OfferPool {
        tenant_id: "acme".parse().expect("tenant"),
        quota: [("gpu".to_owned(), 4)].into(),
        priority: 0,
        include_descendants: false,
    };
    let position = fleet.app.offer_pool(&fleet.owner, &pool, offer).await.expect("offer").position.expect("a position");
    let acme = caller("acme", "alice@acme");

    // No daemon yet: the read model cannot have the offer, and the read says how far it got.
    let err = fleet.app.list_pools(&acme, &Page::first(10), Some(position)).await.expect_err("not yet");
    assert_eq!(err.code(), "NOT_YET_CONSISTENT");
    let auth = std::sync::Arc::new(BuiltinAuthorizer::from_toml(crate::http_api::AUTH).expect("auth"));
    let state = AppState::new(bc_commands::App::new(fleet.t.db.clone()).with_authorizer(auth)).expect("state");
    let (status, body) = get(state.clone(), &format!("/v1/projections?after={position}"), None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "NOT_YET_CONSISTENT");
    assert!(body["error"]["details"]["reached"].as_str().is_some());

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let config = DaemonConfig { poll: Duration::from_millis(10), ..DaemonConfig::default() };
    let daemon = tokio::spawn(framework::run_daemon(fleet.t.db.clone(), models::read_models(), config, stopped));
    let pools = fleet.app.list_pools(&acme, &Page::first(10), Some(position)).await.expect("consistent read");
    assert_eq!(pools.items.len(), 1, "the offer made the pool visible to acme");
    assert_eq!(pools.items[0].offers[0].quota.get("gpu"), Some(&4));
    let globex = caller("globex", "bob@globex");
    let elsewhere = fleet.app.list_pools(&globex, &Page::first(10), Some(position)).await.expect("read");
    assert!(elsewhere.items.is_empty(), "another tenant sees nothing");

    // The same through HTTP, with ?after= and with X-Min-Position.
    let (status, body) = get(state.clone(), &format!("/v1/projections?after={position}"), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body["items"].as_array().expect("items").iter().all(|i| i["position"]
            .as_str()
            .expect("position")
            .parse::<bc_eventstore::Position>()
            .expect("position")
            >= position)
    );
    let (status, _) = get(state.clone(), "/v1/projections", Some(&position.to_string())).await;
    assert_eq!(status, StatusCode::OK);

    // Positions this log never handed out, in a later epoch or a transaction not yet begun, could only time
    // out: they are refused at once, naming the field.
    let later_epoch = bc_eventstore::Position::new(position.epoch + 5, 1, 1);
    let later_txid = bc_eventstore::Position::new(position.epoch, position.txid + 1_000_000, 1);
    for far in [later_epoch, later_txid] {
        let (status, body) = get(state.clone(), &format!("/v1/projections?after={far}"), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(body["error"]["details"]["field"], "after");
        let (status, body) = get(state.clone(), "/v1/pools", Some(&far.to_string())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(body["error"]["details"]["field"], "X-Min-Position");
    }

    let (status, body) = get(state.clone(), "/v1/projections?after=1-2", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["details"]["field"], "after");
    // Both forms are checked when both are sent, and a percent-encoded position is read as the position.
    let (status, body) = get(state.clone(), &format!("/v1/projections?after={position}"), Some("")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["details"]["field"], "X-Min-Position");
    let encoded = position.to_string().replace('-', "%2D");
    let (status, body) = get(state.clone(), &format!("/v1/sites?after={encoded}"), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = get(state, "/v1/sites?after=", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "sites check the token too: {body}");
    assert_eq!(body["error"]["details"]["field"], "after");

    let _ = stop.send(true);
    daemon.await.expect("daemon");
}
