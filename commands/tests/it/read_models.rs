//! The read models after real commands: their contents, and each equal to its rebuild from the log after a
//! random command sequence.

use bc_domain::device::DeviceClass;
use bc_domain::pool::Sharing;
use bc_eventstore::{Db, TxOptions, sql};
use bc_projections::{models, rebuild};

use bc_commands::testing::{Fleet, T0, caller, request};
use bc_projections::testing::{catch_up, catch_up_in};

async fn assert_equal_to_rebuilds(db: &Db) {
    for projection in models::read_models() {
        let differences = rebuild::verify(db, projection.as_ref()).await.expect("verify");
        for (table, count) in differences {
            assert_eq!(count, 0, "{table} differs from its rebuild from the log");
        }
    }
}

#[tokio::test]
async fn read_models_show_pools_nodes_reservations_capacity_and_the_audit_trail() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    let node = fleet.node(&pool, "a", 8, 0).await;
    fleet.node(&pool, "b", 8, 0).await;
    fleet.offer(&pool, "acme", 4).await;
    let acme = caller("acme", "alice@acme");
    let mut later = request(&pool, DeviceClass::Gpu, 2);
    later.start_ms = Some(T0 + 3_600_000);
    let placed = fleet.reserve(&acme, "later", later).await.expect("placed").reservation;
    let now = fleet.reserve(&fleet.owner, "now", request(&pool, DeviceClass::Gpu, 3)).await.expect("now").reservation;
    fleet.advance_to(T0 + 1_000).await;
    fleet.app.node_verb(&fleet.owner, &node, bc_commands::nodes::NodeVerb::Cordon, None).await.expect("cordon");
    catch_up(&fleet.t.db).await;

    let mut tx = fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let seen = fleet.app.pool(&fleet.owner, &pool, None).await.expect("pool");
    assert_eq!(seen.node_count, 2);
    assert_eq!(seen.offers.len(), 1);
    assert_eq!((seen.offers[0].tenant_id.as_str(), seen.offers[0].quota.get("gpu")), ("acme", Some(&4)));
    let as_acme = fleet.app.pool(&acme, &pool, None).await.expect("offered");
    assert_eq!(as_acme.offers.len(), 1, "a customer sees its own offer");

    let page = bc_commands::reads::Page::first(10);
    let nodes = fleet.app.list_nodes(&fleet.owner, Some(&pool), &page, None).await.expect("nodes").items;
    let schedulable: Vec<(String, bool, bool)> =
        nodes.iter().map(|n| (n.name.clone(), n.schedulable, n.cordoned)).collect();
    assert_eq!(schedulable, vec![("a".to_owned(), false, true), ("b".to_owned(), true, false)]);

    let states: Vec<(String, String)> =
        sql::query_as("SELECT reservation_id, state FROM reservations_v3 ORDER BY requested_at, reservation_id")
            .fetch_all(tx.conn())
            .await
            .expect("reservations");
    assert!(states.contains(&(placed.id.to_string(), "placed".to_owned())));
    assert!(states.contains(&(now.id.to_string(), "active".to_owned())));

    let rollup: (i32, i32, i32, i32) = sql::query_as(
        "SELECT allocatable, allocated, reserved, available FROM pool_capacity_rollup_v1 WHERE pool_id = $1 AND resource = 'gpu'",
    )
    .bind(pool.as_str())
    .fetch_one(tx.conn())
    .await
    .expect("rollup");
    assert_eq!(rollup, (8, 3, 2, 5), "one node cordoned; 3 atoms active, 2 placed ahead");

    let audit: Vec<(String, Option<String>, Option<String>)> = sql::query_as(
        "SELECT event_type, identity, session_kind FROM audit_events_v1 WHERE stream_id = $1 ORDER BY log_epoch, txid, seq",
    )
    .bind(placed.id.as_str())
    .fetch_all(tx.conn())
    .await
    .expect("audit");
    tx.commit().await.expect("commit");
    assert_eq!(audit[0], ("reservation.requested".to_owned(), Some("alice@acme".to_owned()), Some("user".to_owned())));
    assert_eq!(audit[1].0, "reservation.placed");

    assert_equal_to_rebuilds(&fleet.t.db).await;
}

#[tokio::test]
async fn every_read_model_equals_its_rebuild_after_a_random_command_sequence() {
    let seed = fastrand::u64(..);
    println!("read model seed: {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let fleet = Fleet::new().await;
    let pools = [
        (fleet.pool("whole", Sharing::Exclusive, None).await, DeviceClass::Gpu),
        (fleet.pool("mig", Sharing::Mig, None).await, DeviceClass::GpuMig),
    ];
    let mut nodes = Vec::new();
    for (i, (pool, class)) in pools.iter().enumerate() {
        for n in 0..3 {
            let mig = if *class == DeviceClass::GpuMig { 3 } else { 0 };
            nodes.push(fleet.node(pool, &format!("n{i}{n}"), 4, mig).await);
        }
        fleet.offer(pool, "acme", 6).await;
    }
    let acme = caller("acme", "alice@acme");
    let mut mine = Vec::new();
    let mut now = T0;
    for step in 0..150 {
        let who = if rng.bool() { &acme } else { &fleet.owner };
        match rng.u8(0..10) {
            0..=4 => {
                let (pool, class) = &pools[rng.usize(0..pools.len())];
                let mut req = request(pool, *class, rng.u32(1..=3));
                if rng.bool() {
                    req.start_ms = Some((now / 1000) * 1000 + rng.i64(1..=120) * 60_000);
                }
                if let Ok(reserved) = fleet.reserve(who, &format!("k{step}"), req).await {
                    mine.push((who.clone(), reserved.reservation.id));
                }
            }
            5 if !mine.is_empty() => {
                let (who, id) = &mine[rng.usize(0..mine.len())];
                let _ = fleet.app.cancel_reservation(who, id, None).await;
            }
            6 if !mine.is_empty() => {
                let (who, id) = &mine[rng.usize(0..mine.len())];
                let _ = fleet.app.release_reservation(who, id).await;
            }
            7 => {
                let verb = if rng.bool() {
                    bc_commands::nodes::NodeVerb::Cordon
                } else {
                    bc_commands::nodes::NodeVerb::Uncordon
                };
                let _ = fleet.app.node_verb(&fleet.owner, &nodes[rng.usize(0..nodes.len())], verb, None).await;
            }
            _ => {
                now += rng.i64(1..=30) * 60_000;
                fleet.advance_to(now).await;
            }
        }
        if step % 50 == 49 {
            // Small batches of varying size: a reservation's events land in different batches, so the models
            // that fold a batch in memory also start from rows written by an earlier one.
            catch_up_in(&fleet.t.db, rng.u32(1..=40)).await;
        }
    }
    catch_up_in(&fleet.t.db, rng.u32(1..=40)).await;
    // Then reservations alone, one event a batch: no node event makes the rollup sum a pool again, so its rows are
    // what the batches' differences added up to. Every node schedulable first, and a window a month ahead, so the
    // last reservations are placed.
    for node in &nodes {
        let _ = fleet.app.node_verb(&fleet.owner, node, bc_commands::nodes::NodeVerb::Uncordon, None).await;
    }
    catch_up_in(&fleet.t.db, 40).await;
    for (i, (pool, class)) in pools.iter().enumerate() {
        let mut ahead = request(pool, *class, 1);
        ahead.start_ms = Some((now / 1000) * 1000 + 30 * 24 * 3_600_000);
        let placed = fleet.reserve(&fleet.owner, &format!("tail-{i}"), ahead).await.expect("a month ahead");
        assert!(!placed.reservation.allocations.is_empty(), "placed a month ahead");
    }
    catch_up_in(&fleet.t.db, 1).await;
    assert_equal_to_rebuilds(&fleet.t.db).await;
    // The rollup adds each batch's differences to its rows: they must still be the sums over its own nodes and holds.
    let mut tx = fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let (rows, differing): (i64, i64) = sql::query_as(
        "SELECT count(*), count(*) FILTER (WHERE (r.allocatable, r.allocated, r.reserved, r.available)
                                             IS DISTINCT FROM (s.allocatable, s.allocated, s.reserved,
                                                               s.allocatable - s.allocated))
         FROM pool_capacity_rollup_v1 AS r
         CROSS JOIN LATERAL (
             SELECT coalesce((SELECT sum(n.atoms) FROM pool_capacity_nodes_v1 AS n
                              WHERE n.pool_id = r.pool_id AND n.resource = r.resource AND n.schedulable), 0)::int
                        AS allocatable,
                    coalesce((SELECT sum(h.count) FROM pool_capacity_holds_v1 AS h
                              WHERE h.pool_id = r.pool_id AND h.resource = r.resource
                                AND h.state IN ('binding', 'active', 'releasing')), 0)::int AS allocated,
                    coalesce((SELECT sum(h.count) FROM pool_capacity_holds_v1 AS h
                              WHERE h.pool_id = r.pool_id AND h.resource = r.resource AND h.state = 'placed'), 0)::int
                        AS reserved) AS s",
    )
    .fetch_one(tx.conn())
    .await
    .expect("rollup against its sums");
    tx.commit().await.expect("commit");
    assert_eq!((rows, differing), (2, 0), "both pools' rollup rows equal the sums over their nodes and holds");
}
