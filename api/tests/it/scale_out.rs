//! Several `serve` processes on one database: the work queue's shards spread over them through `shard:<n>`
//! leases, and a process killed under load has its shards taken over once its leases lapse, with nothing lost
//! or done twice and no error reaching a client.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bc_domain::pool::Sharing;
use bc_eventstore::{Db, TxOptions, clock, sql};

use crate::http_api::{AUTH, ROOT};
use crate::process::{Server, auth_file, command};
use bc_commands::testing::Fleet;

const WAIT: Duration = Duration::from_secs(60);

/// Each live shard lease: shard number to (owner, epoch).
async fn shard_owners(db: &Db) -> BTreeMap<i32, (String, i64)> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let rows: Vec<(String, String, i64)> = sql::query_as(
        "SELECT name, owner, epoch FROM leases WHERE starts_with(name, 'shard:') AND expires_at > compute_now()",
    )
    .fetch_all(tx.conn())
    .await
    .expect("leases");
    tx.commit().await.expect("commit");
    rows.into_iter()
        .map(|(name, owner, epoch)| (name["shard:".len()..].parse().expect("shard number"), (owner, epoch)))
        .collect()
}

/// The owners of live leases whose names start with `prefix`, without the prefix.
async fn live_owners(db: &Db, prefix: &str) -> BTreeSet<String> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let owners: Vec<String> =
        sql::query_scalar("SELECT owner FROM leases WHERE starts_with(name, $1) AND expires_at > compute_now()")
            .bind(prefix)
            .fetch_all(tx.conn())
            .await
            .expect("leases");
    tx.commit().await.expect("commit");
    owners.into_iter().collect()
}

async fn wait_until<F: AsyncFnMut() -> bool>(what: &str, mut done: F) {
    let deadline = Instant::now() + WAIT;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_process_has_its_shards_taken_over_and_nothing_is_lost_or_done_twice() {
    // A fleet on the real clock, since leases lapse as time passes: 32 GPUs without agents, so reservations go
    // active at their start and expire at their end through the work queue alone.
    let fleet = Fleet::new().await;
    clock::restore_system_clock(&fleet.t.db).await.expect("system clock");
    let pool = fleet.pool("h100", Sharing::Exclusive, None).await;
    for name in ["a", "b", "c", "d"] {
        fleet.node(&pool, name, 8, 0).await;
    }

    // Two processes serving everything and one worker, with 2 s leases renewed every 0.5 s.
    let auth = auth_file("scale-out", AUTH);
    let start = |role: &str| {
        let mut c = command(&["serve", "--no-migrate", "--listen", "127.0.0.1:0", "--role", role]);
        c.args(["--lease-ttl-ms", "2000", "--lease-renew-ms", "500", "--auth-config"]);
        c.arg(&auth).env("BETTER_COMPUTE_DATABASE_URL", fleet.t.url());
        tokio::task::block_in_place(|| Server::start(c))
    };
    let (mut a, mut b, mut worker) = (start("all"), start("all"), start("worker"));

    // The shards spread over the three members; the worker is the member without a gateway lease.
    let db = fleet.t.db.clone();
    wait_until("the shards are spread over three processes", async || {
        let owners = shard_owners(&db).await;
        let holders: BTreeSet<&String> = owners.values().map(|(owner, _)| owner).collect();
        owners.len() == 16 && holders.len() == 3
    })
    .await;
    let members = live_owners(&db, "member:worker:").await;
    let gateways = live_owners(&db, "gateway:").await;
    assert_eq!((members.len(), gateways.len()), (3, 2), "three workers, two API processes");
    let killed = members.difference(&gateways).next().expect("the worker process").clone();
    let before = shard_owners(&db).await;
    let killed_shards: BTreeMap<i32, i64> =
        before.iter().filter(|(_, (owner, _))| *owner == killed).map(|(&shard, (_, epoch))| (shard, *epoch)).collect();
    assert!(!killed_shards.is_empty(), "the worker holds shards: {before:?}");

    // Clients reserving short windows through the two API processes; every answer must be a success.
    let urls = [a.base_url.clone(), b.base_url.clone()];
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let answered = Arc::new(Mutex::new(Vec::<String>::new()));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut clients = Vec::new();
    for c in 0..4 {
        let (urls, done, answered, errors, pool) =
            (urls.clone(), done.clone(), answered.clone(), errors.clone(), pool.to_string());
        clients.push(tokio::spawn(async move {
            let http = crate::process::https().timeout(Duration::from_secs(10)).build().expect("client");
            let mut i = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let body =
                    serde_json::json!({ "poolId": pool, "devices": { "class": "gpu", "count": 1 }, "duration": 1 });
                let sent = http
                    .post(format!("{}/v1/reservations", urls[i % 2]))
                    .bearer_auth(ROOT)
                    .header("idempotency-key", format!("c{c}-{i}"))
                    .json(&body)
                    .send()
                    .await;
                match sent {
                    Ok(response) if response.status().is_success() => {
                        let reply: serde_json::Value = response.json().await.expect("json");
                        answered.lock().expect("answered").push(reply["id"].as_str().expect("id").to_owned());
                    }
                    Ok(response) => {
                        let status = response.status();
                        let text = response.text().await.unwrap_or_default();
                        errors.lock().expect("errors").push(format!("{status}: {text}"));
                    }
                    Err(err) => errors.lock().expect("errors").push(err.to_string()),
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
        }));
    }

    // Under load, the worker is killed; its shards go to the survivors once its leases lapse.
    tokio::time::sleep(Duration::from_secs(2)).await;
    worker.signal("KILL");
    let killed_at = Instant::now();
    let _ = worker.wait();
    wait_until("the survivors took every shard over", async || {
        let owners = shard_owners(&db).await;
        owners.len() == 16 && owners.values().all(|(owner, _)| *owner != killed)
    })
    .await;
    let took_over = killed_at.elapsed();
    let after = shard_owners(&db).await;
    for (shard, epoch) in &killed_shards {
        let (owner, new_epoch) = &after[shard];
        assert!(gateways.contains(owner), "shard {shard} went to a survivor, not {owner}");
        assert!(new_epoch > epoch, "shard {shard}'s epoch rose with its new owner ({epoch} to {new_epoch})");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    for client in clients {
        client.await.expect("client");
    }
    assert_eq!(*errors.lock().expect("errors"), Vec::<String>::new(), "no error reached a client");
    let answered = answered.lock().expect("answered").clone();
    assert!(answered.len() >= 20, "the load ran: {} reservations", answered.len());
    println!(
        "{} reservations through two API processes; the killed worker's {} shards taken over after {:.1} s",
        answered.len(),
        killed_shards.len(),
        took_over.as_secs_f64()
    );

    // Every reservation ran its course: activated once and expired once at the end of its window, work queued
    // on the dead process's shards included.
    wait_until("every reservation expired", async || {
        let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
        let expired: i64 = sql::query_scalar(
            "SELECT count(DISTINCT stream_id) FROM events WHERE stream_id = ANY($1) AND event_type = 'reservation.expired'",
        )
        .bind(&answered)
        .fetch_one(tx.conn())
        .await
        .expect("expired");
        tx.commit().await.expect("commit");
        expired == answered.len() as i64
    })
    .await;
    let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let twice: Vec<(String, String, i64)> = sql::query_as(
        "SELECT stream_id, event_type, count(*) FROM events
         WHERE stream_id = ANY($1) AND event_type IN ('reservation.activated', 'reservation.expired')
         GROUP BY stream_id, event_type HAVING count(*) <> 1",
    )
    .bind(&answered)
    .fetch_all(tx.conn())
    .await
    .expect("counts");
    let overdue: i64 =
        sql::query_scalar("SELECT count(*) FROM work_queue WHERE not_before < compute_now() - interval '10 seconds'")
            .fetch_one(tx.conn())
            .await
            .expect("overdue");
    tx.commit().await.expect("commit");
    assert_eq!(twice, Vec::new(), "no work done twice");
    assert_eq!(overdue, 0, "no work item left behind");

    // The survivors stop and give everything up; every read model equals its rebuild.
    for server in [&mut a, &mut b] {
        server.signal("TERM");
        assert!(server.wait().success());
    }
    wait_until("every lease is free", async || live_owners(&db, "").await.is_empty()).await;
    bc_projections::testing::catch_up(&db).await;
    crate::investigate::assert_models_equal_rebuilds(&db, "after the kill").await;
}
