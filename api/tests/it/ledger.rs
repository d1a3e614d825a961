//! The GPU-hour ledger through the API: reservations placed, activated late, released early, cancelled and
//! extended across hour boundaries give exactly the booked, bound, idle and free atom-hours each hour should, the
//! invariants hold in every hour, each tenant sees only its own rows, the CSV form carries the same numbers, the
//! read model rebuilt from the log equals the one built batch by batch, a bad range is refused naming its field,
//! the metrics scrape reports the last and current hours, and agents' utilization samples reach the hours their
//! reservations were bound.

use axum::body::Body;
use axum::http::StatusCode;
use bc_commands::testing::{HOUR, T0};
use bc_domain::agent::{Ack, GpuSample, Heartbeat, SessionRequest};
use bc_domain::node::Role;
use bc_projections::models::ledger::LedgerV1;
use bc_projections::rebuild;
use bc_projections::testing::catch_up;
use serde_json::{Value, json};

use crate::http_api::{ALICE, Api, GUS, LAB, ROOT};
use crate::metrics::{sample, scrape};
use crate::ramdisk::{as_, join};

const MIN: i64 = 60_000;

/// Atom-milliseconds as the atom-hours the API answers (the same arithmetic, so the figures compare exactly).
fn h(atom_ms: i64) -> f64 {
    atom_ms as f64 / 3_600_000.0
}

/// A tenant's expected hour: its id, booked and bound atom-milliseconds.
type Expected = (&'static str, i64, i64);

/// An hour of the first day after T0 (2030-01-01T00:00:00Z) as RFC 3339.
fn utc(hour_ms: i64) -> String {
    assert!((T0..T0 + 24 * HOUR).contains(&hour_ms));
    format!("2030-01-01T{:02}:00:00Z", (hour_ms - T0) / HOUR)
}

/// `GET /v1/ledger?...` as `token`, answered 200.
async fn ledger(api: &Api, token: &str, query: &str) -> Value {
    let reply = api.get(&format!("/v1/ledger?{query}"), token).await;
    assert_eq!(reply.status, StatusCode::OK, "{query}: {:?}", reply.body);
    reply.body
}

/// The tenants' rows at `hour`, with their tenant.
fn tenant_rows(body: &Value, hour: i64) -> Vec<(&str, &Value)> {
    body["tenants"]
        .as_array()
        .expect("tenants")
        .iter()
        .filter(|row| row["hour"] == hour)
        .map(|row| (row["tenantId"].as_str().expect("tenant"), row))
        .collect()
}

fn pool_row(body: &Value, hour: i64) -> &Value {
    body["pools"].as_array().expect("pools").iter().find(|row| row["hour"] == hour).expect("the pool's hour")
}

/// A reservation through the API as `token`: `count` GPUs for `duration_s`, from `start` (or now).
async fn reserve(
    api: &Api,
    token: &str,
    key: &str,
    pool: &str,
    count: u32,
    start: Option<i64>,
    duration_s: u64,
) -> String {
    let mut body = json!({ "poolId": pool, "devices": { "class": "gpu", "count": count }, "duration": duration_s });
    if let Some(start) = start {
        body["start"] = json!(start);
    }
    let reply = api.reserve(token, key, body).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{:?}", reply.body);
    reply.body["id"].as_str().expect("id").to_owned()
}

async fn verb(api: &Api, token: &str, id: &str, verb: &str, body: Value) {
    let reply = api.post(&format!("/v1/reservations/{id}/{verb}"), token, body).await;
    assert_eq!(reply.status, StatusCode::OK, "{verb}: {:?}", reply.body);
}

/// Checks the ledger's invariants in every hour of an owner's answer: free is capacity less every tenant's booked,
/// the pool's booked is the sum of its tenants', bound and idle make up booked, and nothing is negative.
fn assert_invariants(body: &Value) {
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    for pool in body["pools"].as_array().expect("pools") {
        let (capacity, booked, free) = (
            pool["capacity"].as_f64().expect("f64"),
            pool["booked"].as_f64().expect("f64"),
            pool["free"].as_f64().expect("f64"),
        );
        assert!(close(booked + free, capacity), "booked + free = capacity: {pool}");
        assert!(capacity >= 0.0 && booked >= 0.0 && free >= 0.0, "{pool}");
        let tenants: f64 = tenant_rows(body, pool["hour"].as_i64().expect("hour"))
            .iter()
            .filter(|(_, row)| row["poolId"] == pool["poolId"])
            .map(|(_, row)| row["booked"].as_f64().expect("f64"))
            .sum();
        assert!(close(tenants, booked), "the tenants' booked add up to the pool's: {pool}");
    }
    for row in body["tenants"].as_array().expect("tenants") {
        let (booked, bound, idle) = (
            row["booked"].as_f64().expect("f64"),
            row["bound"].as_f64().expect("f64"),
            row["idle"].as_f64().expect("f64"),
        );
        assert!(close(bound + idle, booked), "bound + idle = booked: {row}");
        assert!(booked > 0.0 && bound >= 0.0 && idle >= 0.0, "{row}");
    }
}

/// The scenario every check below reads: an exclusive pool of two 8-GPU nodes registered at T0 (16 atom-hours
/// each hour), offered to acme and globex.
///
/// - acme's `r1`, 2 GPUs from T0 for 2 hours, active at once, released at T0+45m.
/// - globex's `r2`, 1 GPU for an hour from T0+30m, active then, extended at T0+50m to end at T0+150m, expired.
/// - acme's `r3`, 4 GPUs placed at T0+10m for T0+100m, cancelled at T0+20m: it never booked a minute.
/// - acme's `r4`, 1 GPU placed at T0+70m for T0+80m; the worker binds it only at T0+90m; released at T0+130m.
async fn scenario(api: &Api) -> String {
    let fleet = &api.fleet;
    let pool = api.pool().await;
    let r1 = reserve(api, ALICE, "r1", &pool, 2, None, 7200).await;
    let r2 = reserve(api, GUS, "r2", &pool, 1, Some(T0 + 30 * MIN), 3600).await;
    fleet.advance_to(T0).await;
    fleet.advance_to(T0 + 10 * MIN).await;
    let r3 = reserve(api, ALICE, "r3", &pool, 4, Some(T0 + 100 * MIN), 3600).await;
    fleet.advance_to(T0 + 20 * MIN).await;
    verb(api, ALICE, &r3, "cancel", json!({})).await;
    fleet.advance_to(T0 + 30 * MIN).await;
    fleet.advance_to(T0 + 45 * MIN).await;
    verb(api, ALICE, &r1, "release", json!({})).await;
    fleet.advance_to(T0 + 50 * MIN).await;
    verb(api, GUS, &r2, "extend", json!({ "end": T0 + 150 * MIN })).await;
    fleet.advance_to(T0 + 70 * MIN).await;
    let r4 = reserve(api, ALICE, "r4", &pool, 1, Some(T0 + 80 * MIN), 3600).await;
    // The worker is late: the window began at T0+80m, the binding at T0+90m.
    fleet.advance_to(T0 + 90 * MIN).await;
    fleet.advance_to(T0 + 130 * MIN).await;
    verb(api, ALICE, &r4, "release", json!({})).await;
    fleet.advance_to(T0 + 130 * MIN).await;
    fleet.advance_to(T0 + 200 * MIN).await;
    catch_up(&fleet.t.db).await;
    for (token, id, state) in
        [(ALICE, &r1, "released"), (GUS, &r2, "expired"), (ALICE, &r3, "cancelled"), (ALICE, &r4, "released")]
    {
        assert_eq!(api.get(&format!("/v1/reservations/{id}"), token).await.body["state"], state, "{id}");
    }
    pool
}

#[tokio::test]
async fn each_hour_holds_exactly_what_was_booked_bound_and_idle_and_the_invariants_hold() {
    let api = Api::new().await;
    let pool = scenario(&api).await;
    let body = ledger(&api, ROOT, &format!("pool={pool}&from={T0}&to={}", T0 + 4 * HOUR)).await;
    assert_eq!((body["from"].as_i64(), body["to"].as_i64()), (Some(T0), Some(T0 + 4 * HOUR)));
    // Per hour, each tenant's booked and bound atom-milliseconds.
    let expected: [(i64, Vec<Expected>); 4] = [
        // acme: r1's 2 GPUs for 45 minutes, all bound; globex: r2's half hour from T0+30m, bound.
        (T0, vec![("acme", 2 * 45 * MIN, 2 * 45 * MIN), ("globex", 30 * MIN, 30 * MIN)]),
        // acme: r4 booked from T0+80m, bound from T0+90m; globex: r2 the whole hour.
        (T0 + HOUR, vec![("acme", 40 * MIN, 30 * MIN), ("globex", 60 * MIN, 60 * MIN)]),
        // acme: r4 until its release at T0+130m; globex: r2 until its extended end at T0+150m.
        (T0 + 2 * HOUR, vec![("acme", 10 * MIN, 10 * MIN), ("globex", 30 * MIN, 30 * MIN)]),
        (T0 + 3 * HOUR, vec![]),
    ];
    for (hour, tenants) in &expected {
        let rows = tenant_rows(&body, *hour);
        let found: Vec<(&str, f64, f64, f64)> = rows
            .iter()
            .map(|(tenant, row)| {
                let figure = |name: &str| row[name].as_f64().expect("a figure");
                (*tenant, figure("booked"), figure("bound"), figure("idle"))
            })
            .collect();
        let wanted: Vec<(&str, f64, f64, f64)> =
            tenants.iter().map(|(tenant, booked, bound)| (*tenant, h(*booked), h(*bound), h(booked - bound))).collect();
        assert_eq!(found, wanted, "the tenants' rows at hour {}", (hour - T0) / HOUR);
        let booked: i64 = tenants.iter().map(|(_, booked, _)| booked).sum();
        let pool_hour = pool_row(&body, *hour);
        assert_eq!(pool_hour["capacity"].as_f64(), Some(h(16 * HOUR)), "two 8-GPU nodes all hour");
        assert_eq!(pool_hour["booked"].as_f64(), Some(h(booked)));
        assert_eq!(pool_hour["free"].as_f64(), Some(h(16 * HOUR - booked)));
    }
    assert!(
        body["tenants"].as_array().expect("tenants").iter().all(|row| row["utilization"].is_null()),
        "no agent sampled anything"
    );
    assert_invariants(&body);
    // The whole default range (the 24 hours up to the end of the current one) holds the same rows.
    let default = ledger(&api, ROOT, "").await;
    assert_eq!(default["to"].as_i64(), Some(T0 + 4 * HOUR), "the clock is at T0+200m");
    assert_eq!(default["tenants"], body["tenants"]);
    assert_invariants(&default);
}

#[tokio::test]
async fn a_tenant_sees_its_own_rows_and_the_pools_it_is_offered_and_the_owner_sees_every_tenant() {
    let api = Api::new().await;
    let pool = scenario(&api).await;
    let range = format!("from={T0}&to={}", T0 + 4 * HOUR);
    let tenants_of = |body: &Value| -> Vec<String> {
        let mut seen: Vec<String> = body["tenants"]
            .as_array()
            .expect("tenants")
            .iter()
            .map(|row| row["tenantId"].as_str().expect("tenant").to_owned())
            .collect();
        seen.dedup();
        seen
    };
    let owner = ledger(&api, ROOT, &range).await;
    assert_eq!(tenants_of(&owner), ["acme", "globex", "acme", "globex", "acme", "globex"]);
    let acme = ledger(&api, ALICE, &range).await;
    assert_eq!(tenants_of(&acme), ["acme"]);
    let globex = ledger(&api, GUS, &range).await;
    assert_eq!(tenants_of(&globex), ["globex"]);
    assert_eq!(globex["tenants"].as_array().map(Vec::len), Some(3), "globex's three hours, and none of acme's figures");
    // Offered the pool, each sees its capacity and what is free, as availability shows it.
    assert_eq!(globex["pools"], owner["pools"]);
    assert_eq!(acme["pools"], owner["pools"]);
    // acmelab is offered nothing and booked nothing: it sees nothing, of the pool or of anyone.
    let lab = ledger(&api, LAB, &range).await;
    assert_eq!((lab["pools"].clone(), lab["tenants"].clone()), (json!([]), json!([])));
    // The pool filter keeps to the pool; another pool's id, one the caller cannot see, answers no rows.
    let one = ledger(&api, ROOT, &format!("{range}&pool={pool}")).await;
    assert_eq!(one["tenants"], owner["tenants"]);
    let other = api.fleet.pool("a100", bc_domain::pool::Sharing::Exclusive, None).await;
    api.fleet.node(&other, "c", 4, 0).await;
    catch_up(&api.fleet.t.db).await;
    let hidden = ledger(&api, GUS, &format!("{range}&pool={other}")).await;
    assert_eq!((hidden["pools"].clone(), hidden["tenants"].clone()), (json!([]), json!([])));
    let visible = ledger(&api, ROOT, &format!("{range}&pool={other}")).await;
    assert_eq!(pool_row(&visible, T0 + 3 * HOUR)["capacity"].as_f64(), Some(h(4 * 40 * MIN)), "from T0+200m");
}

#[tokio::test]
async fn the_csv_form_has_its_header_and_the_same_numbers() {
    let api = Api::new().await;
    scenario(&api).await;
    let query = format!("/v1/ledger?from={T0}&to={}", T0 + 4 * HOUR);
    let json = ledger(&api, ROOT, &query["/v1/ledger?".len()..]).await;
    let (reply, bytes) = api.call_raw("GET", &format!("{query}&format=csv"), Some(ROOT), &[], Body::empty()).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("content-type"), Some("text/csv; charset=utf-8"));
    let text = String::from_utf8(bytes).expect("utf-8");
    let (accepted, by_accept) = api.call_raw("GET", &query, Some(ROOT), &[("accept", "text/csv")], Body::empty()).await;
    assert_eq!(accepted.status, StatusCode::OK);
    assert_eq!(String::from_utf8(by_accept).expect("utf-8"), text, "Accept: text/csv answers the same");
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(bc_wire::ledger::CSV_HEADER));
    assert_eq!(bc_wire::ledger::CSV_HEADER, "pool_id,tenant_id,hour,capacity,booked,bound,idle,free,utilization");
    let rows: Vec<Vec<&str>> = lines.map(|line| line.split(',').collect()).collect();
    let pools = json["pools"].as_array().expect("pools");
    let tenants = json["tenants"].as_array().expect("tenants");
    assert_eq!(rows.len(), pools.len() + tenants.len(), "one line per row of the JSON form");
    let number = |cell: &str| cell.parse::<f64>().expect("a number");
    for row in &rows {
        assert_eq!(row.len(), 9, "{row:?}");
        let hour = &row[2];
        if row[1].is_empty() {
            let p = pools
                .iter()
                .find(|p| p["poolId"] == row[0] && utc(p["hour"].as_i64().expect("hour")) == *hour)
                .expect("the pool's hour in the JSON form");
            assert_eq!(number(row[3]), p["capacity"].as_f64().expect("f64"));
            assert_eq!(number(row[4]), p["booked"].as_f64().expect("f64"));
            assert_eq!(number(row[7]), p["free"].as_f64().expect("f64"));
        } else {
            let t = tenants
                .iter()
                .find(|t| {
                    t["poolId"] == row[0] && t["tenantId"] == row[1] && utc(t["hour"].as_i64().expect("hour")) == *hour
                })
                .expect("the tenant's hour in the JSON form");
            assert_eq!(number(row[4]), t["booked"].as_f64().expect("f64"));
            assert_eq!(number(row[5]), t["bound"].as_f64().expect("f64"));
            assert_eq!(number(row[6]), t["idle"].as_f64().expect("f64"));
        }
    }
    assert!(rows.iter().any(|row| row[2] == "2030-01-01T01:00:00Z"), "hours are written in RFC 3339");
}

#[tokio::test]
async fn the_read_model_rebuilt_from_the_log_equals_the_one_built_batch_by_batch() {
    let api = Api::new().await;
    scenario(&api).await;
    let before = ledger(&api, ROOT, &format!("from={T0}&to={}", T0 + 4 * HOUR)).await;
    for (table, differences) in rebuild::verify(&api.fleet.t.db, &LedgerV1).await.expect("verify") {
        assert_eq!(differences, 0, "{table} differs from its rebuild");
    }
    // A forced rebuild swaps in tables built from the log alone; the answer is the same.
    rebuild::force_rebuild(&api.fleet.t.db, &LedgerV1, &|_, _| {}).await.expect("rebuild");
    let after = ledger(&api, ROOT, &format!("from={T0}&to={}", T0 + 4 * HOUR)).await;
    assert_eq!(after, before);
}

#[tokio::test]
async fn a_bad_range_or_format_is_refused_naming_its_field() {
    let api = Api::new().await;
    let year = 366 * 24 * HOUR;
    for (query, field) in [
        (format!("from={T0}&to={T0}"), "to"),
        (format!("from={T0}&to={}", T0 - HOUR), "to"),
        (format!("from={T0}&to={}", T0 + 31 * 24 * HOUR + 1), "to"),
        (format!("from={}", T0 + year * 8000), "from"),
        ("from=-5".to_owned(), "from"),
        ("from=yesterday".to_owned(), "from"),
        ("format=xml".to_owned(), "format"),
        ("pool=no-such-pool".to_owned(), "pool"),
        ("group=tenant".to_owned(), "group"),
    ] {
        let reply = api.get(&format!("/v1/ledger?{query}"), ROOT).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{query}: {:?}", reply.body);
        assert_eq!(reply.field(), field, "{query}: {:?}", reply.body);
    }
    // 31 days exactly is the longest range.
    ledger(&api, ROOT, &format!("from={T0}&to={}", T0 + 31 * 24 * HOUR)).await;
}

#[tokio::test]
async fn the_metrics_report_the_last_and_the_current_hour_per_pool() {
    let api = Api::new().await;
    let fleet = &api.fleet;
    let pool = api.pool().await;
    reserve(&api, ALICE, "now", &pool, 2, None, 7200).await;
    // Placed at T0 for T0+30m: idle until the worker binds it at T0+45m.
    reserve(&api, GUS, "later", &pool, 1, Some(T0 + 30 * MIN), 3600).await;
    fleet.advance_to(T0).await;
    fleet.advance_to(T0 + 45 * MIN).await;
    catch_up(&fleet.t.db).await;
    let series =
        |hour: &str, kind: &str| format!(r#"bc_ledger_atom_seconds{{pool="{pool}",hour="{hour}",kind="{kind}"}}"#);
    let text = scrape(&api).await;
    // The current hour: 2 GPUs bound all hour; 1 GPU booked from T0+30m, idle 15 minutes, then bound.
    assert_eq!(sample(&text, &series("current", "bound")), Some((2 * 3600 + 15 * 60) as f64));
    assert_eq!(sample(&text, &series("current", "idle")), Some((15 * 60) as f64));
    assert_eq!(sample(&text, &series("current", "free")), Some((16 * 3600 - 2 * 3600 - 30 * 60) as f64));
    assert_eq!(sample(&text, &series("last", "free")), None, "the pool had no nodes the hour before T0");

    fleet.advance_to(T0 + 90 * MIN).await;
    catch_up(&fleet.t.db).await;
    let text = scrape(&api).await;
    assert_eq!(sample(&text, &series("last", "bound")), Some((2 * 3600 + 15 * 60) as f64));
    assert_eq!(sample(&text, &series("current", "bound")), Some((2 * 3600 + 30 * 60) as f64));
    assert_eq!(sample(&text, &series("current", "idle")), Some(0.0));
    assert_eq!(sample(&text, &series("current", "free")), Some((16 * 3600 - 2 * 3600 - 30 * 60) as f64));
}

/// Sends a heartbeat of the node's agent at `at_ms` (the simulated clock moved there first) with `samples` (GPU,
/// percent).
async fn beat(
    api: &Api,
    credential: &str,
    session: &Value,
    at_ms: i64,
    samples: &[(&str, u32)],
) -> crate::http_api::Reply {
    bc_eventstore::clock::set_sim_clock(&api.fleet.t.db, at_ms).await.expect("clock");
    let beat = Heartbeat {
        session_id: session["sessionId"].as_str().expect("session").parse().expect("session id"),
        observed_generation: session["generation"].as_u64().expect("generation"),
        // The skew check compares with the database server's own clock, not the simulated one.
        clock_ms: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as i64,
        gpu_utilization: samples
            .iter()
            .map(|(gpu, percent)| GpuSample { gpu: gpu.parse().expect("gpu"), percent: *percent })
            .collect(),
    };
    as_(api, "POST", "/v1/agent/heartbeat", credential, Some(serde_json::to_value(beat).expect("json"))).await
}

#[tokio::test]
async fn an_agents_utilization_samples_reach_the_hours_its_reservation_was_bound() {
    let api = Api::new().await;
    let fleet = &api.fleet;
    let pool = fleet.pool("h100", bc_domain::pool::Sharing::Exclusive, None).await;
    fleet.offer(&pool, "acme", 8).await;
    // A machine with two GPUs joins through the agent's routes, opens a session and applies its spec.
    let (credential, joined) = join(&api, pool.as_str(), None, "util-1", Role::Host).await;
    assert!(joined["nodeId"].is_string(), "{joined}");
    let opened = as_(
        &api,
        "POST",
        "/v1/agent/sessions",
        &credential,
        Some(serde_json::to_value(SessionRequest { agent_version: "test".into() }).expect("json")),
    )
    .await;
    assert_eq!(opened.status, StatusCode::CREATED, "{:?}", opened.body);
    let session = opened.body;
    assert_eq!(beat(&api, &credential, &session, T0, &[]).await.status, StatusCode::OK);
    catch_up(&fleet.t.db).await;
    // The GPUs the machine reported (a simulated 2xH100, as `join` sends it).
    let spec: bc_agent::simulate::Simulated = "2xH100".parse().expect("spec");
    let gpus: Vec<String> =
        bc_agent::simulate::inventory("util-1", &spec).gpus.iter().map(|g| g.info.uuid.to_string()).collect();
    assert_eq!(gpus.len(), 2);

    // acme's reservation of one GPU for three hours: bound once the agent acknowledges the binding.
    let id = reserve(&api, ALICE, "r", pool.as_str(), 1, None, 3 * 3600).await;
    fleet.worker().run_until_idle().await.expect("worker");
    let commands = as_(&api, "GET", "/v1/agent/commands", &credential, None).await;
    for command in commands.body["commands"].as_array().expect("commands") {
        let ack = serde_json::to_value(Ack { ok: true, message: None }).expect("json");
        let uri = format!("/v1/agent/commands/{}/ack", command["id"].as_str().expect("id"));
        assert_eq!(as_(&api, "POST", &uri, &credential, Some(ack)).await.status, StatusCode::OK);
    }
    fleet.worker().run_until_idle().await.expect("worker");
    let reservation = api.get(&format!("/v1/reservations/{id}"), ALICE).await.body;
    assert_eq!(reservation["state"], "active", "{reservation}");
    let held = reservation["allocations"][0]["devices"][0].as_str().expect("device").to_owned();
    let other = gpus.iter().find(|g| **g != held).expect("the other GPU").clone();

    // Samples of both GPUs in the first two hours; none in the third.
    for (at, held_percent, other_percent) in [(T0 + 2 * MIN, 40, 5), (T0 + 3 * MIN, 60, 5), (T0 + 61 * MIN, 20, 99)] {
        let reply = beat(&api, &credential, &session, at, &[(&held, held_percent), (&other, other_percent)]).await;
        assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    }
    // A bad sample is refused naming it, and records nothing.
    let bad = beat(&api, &credential, &session, T0 + 62 * MIN, &[(&held, 101)]).await;
    assert_eq!((bad.status, bad.field()), (StatusCode::BAD_REQUEST, "gpuUtilization[0].percent"));
    let twice = beat(&api, &credential, &session, T0 + 62 * MIN, &[(&held, 1), (&held, 2)]).await;
    assert_eq!((twice.status, twice.field()), (StatusCode::BAD_REQUEST, "gpuUtilization[1].gpu"));

    catch_up(&fleet.t.db).await;
    let body = ledger(&api, ALICE, &format!("from={T0}&to={}", T0 + 3 * HOUR)).await;
    let rows: Vec<(i64, Option<f64>)> = body["tenants"]
        .as_array()
        .expect("tenants")
        .iter()
        .map(|row| (row["hour"].as_i64().expect("hour"), row["utilization"].as_f64()))
        .collect();
    assert_eq!(
        rows,
        vec![(T0, Some(50.0)), (T0 + HOUR, Some(20.0)), (T0 + 2 * HOUR, None)],
        "the mean of the held GPU's samples in each bound hour, null where none was taken"
    );
}
