//! A reservation's outcome reads the same wherever it is shown: its GET (the fold of its stream), the list (the
//! read model), the event stream (the payload of the event that ended it) and `events replay` (the fold of the
//! log up to a position).

use std::sync::Arc;

use bc_api::http::events::{EventHub, EventsConfig, Filter, Item, subscription};
use bc_eventstore::Position;
use bc_projections::replay;
use bc_projections::testing::catch_up;
use futures_util::StreamExt as _;
use serde_json::{Value, json};

use crate::http_api::{ALICE, Api};
use bc_commands::testing::{HOUR, T0};

/// What every view says of reservation `id`'s outcome, and what the event that ended it carries.
async fn outcomes(api: &Api, id: &str) -> [Value; 4] {
    let got = api.get(&format!("/v1/reservations/{id}"), ALICE).await.body["outcome"].clone();
    catch_up(&api.fleet.t.db).await;
    let listed = api.get("/v1/reservations?limit=500", ALICE).await.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|item| item["id"] == id)
        .map(|item| item["outcome"].clone())
        .expect("listed");

    let hub = Arc::new(EventHub::new(api.fleet.app.clone(), EventsConfig::default()));
    let filter = Filter { stream: Some(id.to_owned()), ..Filter::default() };
    let mut stream = std::pin::pin!(subscription(hub, Position::START, filter));
    let mut ending = Value::Null;
    let mut last = Position::START;
    while let Some(Item::Event { position, event_type, data }) =
        tokio::time::timeout(std::time::Duration::from_secs(5), stream.next()).await.ok().flatten()
    {
        last = position;
        if ["reservation.cancelled", "reservation.failed"].contains(&event_type.as_str()) {
            ending = serde_json::from_str::<Value>(&data).expect("event JSON")["payload"]["reason"].clone();
            break;
        }
    }
    let events = replay::stream_until(&api.fleet.t.db, id, last).await.expect("replay");
    let replayed = replay::stream_state(&events).expect("state")["outcome"].clone();
    [got, listed, ending, replayed]
}

#[tokio::test]
async fn a_cancelled_or_failed_reservations_outcome_reads_the_same_everywhere() {
    let api = Api::new().await;
    let pool = api.pool().await;

    let later =
        json!({ "poolId": pool, "devices": { "class": "gpu", "count": 2 }, "duration": 3600, "start": T0 + HOUR });
    let placed = api.reserve(ALICE, "later", later).await;
    assert_eq!(placed.status.as_u16(), 201, "{:?}", placed.body);
    let cancelled_id = placed.body["id"].as_str().expect("id").to_owned();
    let cancelled =
        api.post(&format!("/v1/reservations/{cancelled_id}/cancel"), ALICE, json!({ "reason": "plans changed" })).await;
    assert_eq!(cancelled.body["outcome"], "plans changed", "{:?}", cancelled.body);
    assert_eq!(
        outcomes(&api, &cancelled_id).await,
        [json!("plans changed"), json!("plans changed"), json!("plans changed"), json!("plans changed")]
    );

    // Both nodes taken for the next hour; a request that must be placed within a minute waits, then fails.
    let whole = json!({ "poolId": pool, "devices": { "class": "gpu", "count": 8 }, "duration": 3600 });
    for key in ["a", "b"] {
        assert_eq!(api.reserve(ALICE, key, whole.clone()).await.status.as_u16(), 201);
    }
    let waiting =
        json!({ "poolId": pool, "devices": { "class": "gpu", "count": 1 }, "duration": 600, "deadline": T0 + 60_000 });
    let pending = api.reserve(ALICE, "waiting", waiting).await;
    assert_eq!(pending.body["state"], "pending", "{:?}", pending.body);
    let failed_id = pending.body["id"].as_str().expect("id").to_owned();
    api.fleet.advance_to(T0 + 61_000).await;
    assert_eq!(
        outcomes(&api, &failed_id).await,
        [json!("deadline-passed"), json!("deadline-passed"), json!("deadline-passed"), json!("deadline-passed")]
    );
}
