//! Scalar resources: nodes' vCPUs, memory and disk, booked beside the atoms, lent with the pool's overcommit, and
//! limited per tenant by the offering's quota at every instant.

use std::collections::BTreeMap;

use bc_commands::fleet::OfferPool;
use bc_domain::device::DeviceClass;
use bc_domain::id::{NodeId, PoolId};
use bc_domain::pool::{PoolPolicy, Sharing};
use bc_domain::reservation::{ReservationRequest, ReservationState, Topology};
use bc_eventstore::{TxOptions, sql};

use bc_commands::testing::{Fleet, HOUR, T0, caller, request};

fn with(pool: &PoolId, gpus: u32, scalars: &[(&str, u64)]) -> ReservationRequest {
    let mut request = request(pool, DeviceClass::Gpu, gpus);
    request.resources = scalars.iter().map(|(r, n)| ((*r).to_owned(), *n)).collect();
    request
}

fn at(mut request: ReservationRequest, start_ms: i64, hours: u64) -> ReservationRequest {
    request.start_ms = Some(start_ms);
    request.duration_s = hours * 3600;
    request
}

/// The scalar bookings a reservation has now, as (node, resource, amount, start, end).
async fn scalar_bookings(fleet: &Fleet, reservation: &str) -> Vec<(String, String, i64, i64, i64)> {
    let mut tx = fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let rows = sql::query_as(
        "SELECT node_id, resource, amount, ts_ms(lower(during)), ts_ms(upper(during)) FROM scalar_bookings
         WHERE reservation_id = $1 ORDER BY node_id, resource",
    )
    .bind(reservation)
    .fetch_all(tx.conn())
    .await
    .expect("scalar bookings");
    tx.commit().await.expect("commit");
    rows
}

/// What `node_resources` holds for a node.
async fn node_resources(fleet: &Fleet, node: &NodeId) -> BTreeMap<String, i64> {
    let mut tx = fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let rows: Vec<(String, i64)> =
        sql::query_as("SELECT resource, capacity FROM node_resources WHERE node_id = $1 ORDER BY resource")
            .bind(node.as_str())
            .fetch_all(tx.conn())
            .await
            .expect("node resources");
    tx.commit().await.expect("commit");
    rows.into_iter().collect()
}

#[tokio::test]
async fn scalars_are_booked_with_the_atoms_and_a_node_lends_what_it_has_times_the_overcommit() {
    let fleet = Fleet::new().await;
    let policy = PoolPolicy { overcommit: [("vcpu".to_owned(), 2.0)].into(), ..PoolPolicy::default() };
    let pool = fleet.pool_with("vps", Sharing::Exclusive, policy).await;
    let node = fleet.node_with(&pool, "a", 4, 0, &[("vcpu", 16), ("memoryGiB", 64)]).await;
    assert_eq!(node_resources(&fleet, &node).await, [("memoryGiB".to_owned(), 64), ("vcpu".to_owned(), 16)].into());

    // 16 vCPUs lend 32: 20 and then 12 more fit, with GPUs to spare.
    let big = with(&pool, 1, &[("vcpu", 20), ("memoryGiB", 32)]);
    let first = fleet.reserve(&fleet.owner, "first", big.clone()).await.expect("first").reservation;
    assert_eq!(first.state, ReservationState::Placed);
    assert_eq!(first.allocations[0].resources, big.resources, "the allocation lists its scalar amounts");
    let booked = scalar_bookings(&fleet, first.id.as_str()).await;
    let window = (first.start_ms.expect("start"), first.end_ms.expect("end"));
    assert_eq!(
        booked,
        [
            (node.to_string(), "memoryGiB".to_owned(), 32, window.0, window.1),
            (node.to_string(), "vcpu".to_owned(), 20, window.0, window.1),
        ]
    );
    let mut impatient = big.clone();
    impatient.wait = false;
    let err = fleet.reserve(&fleet.owner, "second", impatient).await.expect_err("40 of 32 vCPUs");
    assert_eq!(err.code(), "CAPACITY_UNAVAILABLE", "{err}");
    let fits = with(&pool, 1, &[("vcpu", 12)]);
    let third = fleet.reserve(&fleet.owner, "third", fits).await.expect("12 more").reservation;
    assert_eq!(third.state, ReservationState::Placed);
    let waiting = fleet.reserve(&fleet.owner, "fourth", with(&pool, 1, &[("vcpu", 1)])).await.expect("waits");
    assert_eq!(waiting.reservation.state, ReservationState::Pending, "every vCPU the node lends is held");

    // An ending frees its amounts at once, and the pending reservation takes them.
    fleet.app.cancel_reservation(&fleet.owner, &first.id, None).await.expect("cancel");
    fleet.worker().run_until_idle().await.expect("worker");
    assert!(scalar_bookings(&fleet, first.id.as_str()).await.is_empty(), "an ended reservation holds nothing");
    let waiting = fleet.app.reservation(&fleet.owner, &waiting.reservation.id).await.expect("read").value;
    assert!(waiting.state.holds_atoms(), "placed once the vCPUs were freed: {}", waiting.state);
    assert_eq!(scalar_bookings(&fleet, waiting.id.as_str()).await.len(), 1);
}

#[tokio::test]
async fn a_request_no_node_could_ever_hold_is_refused_and_a_node_without_the_resource_lends_none() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("vps", Sharing::Exclusive, None).await;
    fleet.node_with(&pool, "small", 1, 0, &[("vcpu", 8), ("memoryGiB", 32)]).await;
    fleet.node(&pool, "bare", 2, 0).await;
    let err = fleet.reserve(&fleet.owner, "huge", with(&pool, 1, &[("vcpu", 9)])).await.expect_err("larger");
    assert_eq!(err.code(), "CAPACITY_UNAVAILABLE");
    assert!(err.to_string().contains("can never fit") && err.to_string().contains("9 vcpu"), "{err}");
    let err = fleet.reserve(&fleet.owner, "disk", with(&pool, 1, &[("disk", 1)])).await.expect_err("no disk");
    assert!(err.to_string().contains("can never fit"), "no node reports disk: {err}");
    // Two allocations of 8 vCPUs need two nodes that report them; the bare node has none.
    let mut gang = with(&pool, 2, &[("vcpu", 8)]);
    gang.devices.topology = Topology::Gang { nodes: 2 };
    let err = fleet.reserve(&fleet.owner, "gang", gang).await.expect_err("one node reports vCPUs");
    assert_eq!(err.code(), "CAPACITY_UNAVAILABLE");
    // The GPUs on one node and the vCPUs on another: no node holds both.
    let err = fleet.reserve(&fleet.owner, "apart", with(&pool, 2, &[("vcpu", 4)])).await.expect_err("apart");
    assert_eq!(err.code(), "CAPACITY_UNAVAILABLE", "two GPUs and vCPUs are on no one node: {err}");
    assert!(err.to_string().contains("can never fit"), "{err}");
    let bad = fleet.reserve(&fleet.owner, "bad", with(&pool, 1, &[("gpu", 1)])).await.expect_err("not a scalar");
    assert_eq!(bad.code(), "INVALID_ARGUMENT");
    assert!(bad.to_string().contains("resources.gpu"), "{bad}");
}

#[tokio::test]
async fn the_scalar_quota_is_a_limit_at_every_instant_of_the_window() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("vps", Sharing::Exclusive, None).await;
    fleet.node_with(&pool, "a", 8, 0, &[("vcpu", 128), ("memoryGiB", 1024)]).await;
    let quota = [("gpu".to_owned(), 8), ("vcpu".to_owned(), 16)].into();
    let offer =
        OfferPool { tenant_id: "acme".parse().expect("tenant"), quota, priority: 0, include_descendants: false };
    fleet.app.offer_pool(&fleet.owner, &pool, offer).await.expect("offer");
    let acme = caller("acme", "alice@acme");

    let err = fleet.reserve(&acme, "memory", with(&pool, 1, &[("memoryGiB", 1)])).await.expect_err("no memory quota");
    assert_eq!(err.code(), "QUOTA_EXCEEDED", "a resource the quota does not name grants none: {err}");
    let err = fleet.reserve(&acme, "17", with(&pool, 1, &[("vcpu", 17)])).await.expect_err("17 of 16");
    assert_eq!(err.code(), "QUOTA_EXCEEDED");

    let ten = with(&pool, 1, &[("vcpu", 10)]);
    let early = fleet.reserve(&acme, "early", at(ten.clone(), T0 + HOUR, 1)).await.expect("early").reservation;
    assert_eq!(early.state, ReservationState::Placed);
    let late = fleet.reserve(&acme, "late", at(ten.clone(), T0 + 2 * HOUR, 1)).await.expect("late").reservation;
    assert_eq!(late.state, ReservationState::Placed, "back to back: never 20 at one instant");
    let overlapping = at(ten.clone(), T0 + HOUR + HOUR / 2, 1);
    let waits = fleet.reserve(&acme, "overlap", overlapping).await.expect("waits").reservation;
    assert_eq!(waits.state, ReservationState::Pending, "20 vCPUs at once is over the quota of 16");
    let six = at(with(&pool, 1, &[("vcpu", 6)]), T0 + HOUR + HOUR / 2, 1);
    let fits = fleet.reserve(&acme, "six", six).await.expect("six").reservation;
    assert_eq!(fits.state, ReservationState::Placed, "10 and 6 is exactly 16");

    // Cancelling one at a time: the waiting one is placed only once no instant of its window would be over.
    for (cancelled, placed) in [(&early, false), (&fits, false), (&late, true)] {
        fleet.app.cancel_reservation(&acme, &cancelled.id, None).await.expect("cancel");
        fleet.worker().run_until_idle().await.expect("worker");
        let now = fleet.app.reservation(&acme, &waits.id).await.expect("read").value;
        let expected = if placed { ReservationState::Placed } else { ReservationState::Pending };
        assert_eq!(now.state, expected, "after cancelling {}", cancelled.id);
    }
}

#[tokio::test]
async fn an_extension_keeps_the_nodes_and_the_quotas_limits_and_a_rebuild_gives_the_same_tables() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("vps", Sharing::Exclusive, None).await;
    fleet.node_with(&pool, "a", 4, 0, &[("vcpu", 16)]).await;
    let sixteen = with(&pool, 1, &[("vcpu", 16)]);
    let first = fleet.reserve(&fleet.owner, "first", at(sixteen.clone(), T0 + HOUR, 1)).await.expect("first");
    let second = fleet.reserve(&fleet.owner, "second", at(sixteen.clone(), T0 + 3 * HOUR, 1)).await.expect("second");
    let (first, second) = (first.reservation, second.reservation);
    assert_eq!((first.state, second.state), (ReservationState::Placed, ReservationState::Placed));
    assert_ne!(first.allocations[0].devices, second.allocations[0].devices, "the atoms differ, the vCPUs do not");

    let extended = fleet.app.extend_reservation(&fleet.owner, &first.id, T0 + 3 * HOUR).await.expect("up to second");
    assert_eq!(extended.value.end_ms, Some(T0 + 3 * HOUR));
    let booked = scalar_bookings(&fleet, first.id.as_str()).await;
    assert_eq!(booked[0].4, T0 + 3 * HOUR, "the vCPUs are held for the longer window");
    let err = fleet.app.extend_reservation(&fleet.owner, &first.id, T0 + 3 * HOUR + HOUR / 2).await.expect_err("over");
    assert_eq!(err.code(), "CAPACITY_UNAVAILABLE", "{err}");
    let unchanged = fleet.app.reservation(&fleet.owner, &first.id).await.expect("read").value;
    assert_eq!(unchanged.end_ms, Some(T0 + 3 * HOUR), "a refused extension changes nothing");
    assert_eq!(scalar_bookings(&fleet, first.id.as_str()).await, booked);

    let mut tx = fleet.t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    bc_projections::inline::rebuild_into(&mut tx, "scalars_rebuild").await.expect("rebuild");
    for table in ["node_resources", "scalar_bookings"] {
        let differences = bc_projections::inline::differences(&mut tx, "scalars_rebuild", table).await.expect("diff");
        assert_eq!(differences, 0, "{table} rebuilt from the log differs from the live table");
    }
    let rows: i64 =
        sql::query_scalar("SELECT count(*) FROM scalar_bookings").fetch_one(tx.conn()).await.expect("count");
    assert_eq!(rows, 2, "the comparison had rows to compare");
    tx.rollback().await;
}

#[tokio::test]
async fn a_placement_with_scalars_reads_the_first_fitting_nodes_and_the_whole_pool_only_when_they_lack_the_amounts_and_it_was_not_read_whole()
 {
    use bc_domain::reservation::explanation::{Tier, TierLook};
    let fleet = Fleet::new().await;
    let pool = fleet.pool("vps", Sharing::Exclusive, None).await;
    let mut nodes = Vec::new();
    for n in 0..24 {
        nodes.push(fleet.node_with(&pool, &format!("n{n:02}"), 2, 0, &[("vcpu", 4)]).await);
    }
    fleet.app.db().follow_ups_written().await;
    let looks = |id| {
        let fleet = &fleet;
        async move {
            let (explanation, _) = fleet.app.explanation(&fleet.owner, &id, None).await.expect("explanation");
            (explanation.tiers, explanation.chosen)
        }
    };

    // Every node lends 4 vCPUs: the first read's nodes hold 2, so the pool is not read whole.
    let small = fleet.reserve(&fleet.owner, "small", with(&pool, 1, &[("vcpu", 2)])).await.expect("small").reservation;
    assert_eq!(small.state, ReservationState::Placed);
    let (tiers, _) = looks(small.id.clone()).await;
    assert_eq!(tiers.len(), 1, "{tiers:?}");
    assert!(tiers[0].fits && tiers[0].candidates > 0 && tiers[0].candidates < 24, "{tiers:?}");

    // Only the node that sorts last in the hint's order (all hold a free GPU for good, so by id) lends 8: the first
    // read's nodes all lack the amount, and the whole pool is read to find it.
    let last = nodes.iter().max_by_key(|n| n.as_str()).expect("a node").clone();
    let mut tx = fleet.t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    sql::query("UPDATE node_resources SET capacity = 8 WHERE node_id = $1 AND resource = 'vcpu'")
        .bind(last.as_str())
        .execute(tx.conn())
        .await
        .expect("a bigger node");
    tx.commit().await.expect("commit");
    let big = fleet.reserve(&fleet.owner, "big", with(&pool, 1, &[("vcpu", 8)])).await.expect("big").reservation;
    assert_eq!(big.state, ReservationState::Placed);
    let (tiers, chosen) = looks(big.id.clone()).await;
    assert_eq!(
        tiers,
        [
            TierLook { tier: Tier::Scalars, candidates: 0, fits: false },
            TierLook { tier: Tier::Scalars, candidates: 1, fits: true }
        ]
    );
    assert_eq!(chosen, [last]);

    // In a pool of three nodes the first read already sees every one: a request none of them can lend now waits
    // after that one read, not after reading them all again.
    let small_pool = fleet.pool("vps-small", Sharing::Exclusive, None).await;
    for n in 0..3 {
        fleet.node_with(&small_pool, &format!("s{n}"), 2, 0, &[("vcpu", 8)]).await;
    }
    fleet.app.db().follow_ups_written().await;
    let eight = with(&small_pool, 1, &[("vcpu", 8)]);
    for n in 0..3 {
        let filled = fleet.reserve(&fleet.owner, &format!("fill{n}"), eight.clone()).await.expect("fill").reservation;
        assert_eq!(filled.state, ReservationState::Placed);
    }
    let waits = fleet.reserve(&fleet.owner, "waits", eight).await.expect("waits").reservation;
    assert_eq!(waits.state, ReservationState::Pending, "every node's vCPUs are lent, a GPU of each is free");
    let (tiers, _) = looks(waits.id.clone()).await;
    assert_eq!(tiers, [TierLook { tier: Tier::Scalars, candidates: 0, fits: false }]);
}
