//! Reservations through the command handlers and the worker, on real PostgreSQL with the simulated clock.

use bc_commands::AppError;
use bc_commands::availability::EarliestStart;
use bc_domain::Rejection;
use bc_domain::device::DeviceClass;
use bc_domain::pool::{PoolPolicy, Sharing};
use bc_domain::reservation::{Binding, ExpiryCause, ReservationState, Topology};

use bc_commands::testing::{Fleet, HOUR, T0, caller, request};

#[tokio::test]
async fn a_reservation_that_fits_is_placed_and_booked_for_its_window() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    fleet.node(&pool, "a", 8, 0).await;
    let reserved = fleet.reserve(&fleet.owner, "k1", request(&pool, DeviceClass::Gpu, 4)).await.expect("reserve");
    assert!(reserved.created);
    let r = reserved.reservation;
    assert_eq!(r.state, ReservationState::Placed);
    assert_eq!((r.start_ms, r.end_ms), (Some(T0), Some(T0 + HOUR)));
    let bookings = fleet.bookings(r.id.as_str()).await;
    assert_eq!(bookings.len(), 4);
    assert!(bookings.iter().all(|(_, start, end)| (*start, *end) == (T0, T0 + HOUR)));
}

#[tokio::test]
async fn the_same_key_and_body_returns_the_same_reservation_even_when_racing() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    fleet.node(&pool, "a", 8, 0).await;
    let body = request(&pool, DeviceClass::Gpu, 1);
    let (a, b) = tokio::join!(
        fleet.reserve(&fleet.owner, "same", body.clone()),
        fleet.reserve(&fleet.owner, "same", body.clone())
    );
    let (a, b) = (a.expect("first"), b.expect("second"));
    assert_eq!(a.reservation.id, b.reservation.id);
    assert_eq!([a.created, b.created].iter().filter(|c| **c).count(), 1, "exactly one created it");
    let again = fleet.reserve(&fleet.owner, "same", body.clone()).await.expect("retry");
    assert_eq!((again.reservation.id.clone(), again.created), (a.reservation.id.clone(), false));
    assert_eq!(fleet.bookings(a.reservation.id.as_str()).await.len(), 1, "booked once");

    let other_body = request(&pool, DeviceClass::Gpu, 2);
    let err = fleet.reserve(&fleet.owner, "same", other_body).await.expect_err("reuse");
    assert_eq!(err.code(), "IDEMPOTENCY_KEY_REUSED");

    let acme = caller("acme", "operator@platform");
    fleet.offer(&pool, "acme", 8).await;
    let theirs = fleet.reserve(&acme, "same", body).await.expect("another tenant");
    assert_ne!(theirs.reservation.id, a.reservation.id, "another tenant with the same key gets another id");
}

#[tokio::test]
async fn without_room_a_reservation_waits_and_is_placed_when_capacity_frees() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    fleet.node(&pool, "a", 2, 0).await;
    let first =
        fleet.reserve(&fleet.owner, "first", request(&pool, DeviceClass::Gpu, 2)).await.expect("first").reservation;
    let second =
        fleet.reserve(&fleet.owner, "second", request(&pool, DeviceClass::Gpu, 2)).await.expect("second").reservation;
    assert_eq!(second.state, ReservationState::Pending);
    assert!(fleet.bookings(second.id.as_str()).await.is_empty(), "nothing booked or charged while pending");

    fleet.app.cancel_reservation(&fleet.owner, &first.id, Some("not needed".into())).await.expect("cancel");
    fleet.worker().run_until_idle().await.expect("worker");
    let second = fleet.app.reservation(&fleet.owner, &second.id).await.expect("read").value;
    assert_eq!(second.state, ReservationState::Active, "placed, and its window starts at once");
    assert_eq!(fleet.bookings(second.id.as_str()).await.len(), 2);
    assert!(
        fleet.bookings(first.id.as_str()).await.is_empty(),
        "a cancelled reservation's bookings end when cancelled"
    );
}

#[tokio::test]
async fn capacity_unavailable_only_when_it_can_never_fit_or_must_not_wait_or_the_queue_is_full() {
    let fleet = Fleet::new().await;
    let policy = PoolPolicy { max_pending: 1, ..PoolPolicy::default() };
    let pool = fleet.pool_with("small", Sharing::Exclusive, policy).await;
    fleet.node(&pool, "a", 2, 0).await;
    fleet.node(&pool, "b", 2, 0).await;

    let too_big =
        fleet.reserve(&fleet.owner, "big", request(&pool, DeviceClass::Gpu, 3)).await.expect_err("never fits one node");
    assert_eq!(too_big.code(), "CAPACITY_UNAVAILABLE");
    let mut gang = request(&pool, DeviceClass::Gpu, 6);
    gang.devices.topology = Topology::Gang { nodes: 3 };
    assert_eq!(
        fleet.reserve(&fleet.owner, "gang", gang).await.expect_err("three nodes").code(),
        "CAPACITY_UNAVAILABLE"
    );
    let mut wrong_class = request(&pool, DeviceClass::GpuMig, 1);
    wrong_class.devices.count = 1;
    assert_eq!(
        fleet.reserve(&fleet.owner, "mig", wrong_class).await.expect_err("no mig").code(),
        "CAPACITY_UNAVAILABLE"
    );

    let mut gang = request(&pool, DeviceClass::Gpu, 4);
    gang.devices.topology = Topology::Gang { nodes: 2 };
    let placed = fleet.reserve(&fleet.owner, "gang-ok", gang).await.expect("a gang over both nodes").reservation;
    assert_eq!(placed.allocations.len(), 2, "one allocation per node");

    let mut impatient = request(&pool, DeviceClass::Gpu, 1);
    impatient.wait = false;
    assert_eq!(
        fleet.reserve(&fleet.owner, "now", impatient).await.expect_err("full now").code(),
        "CAPACITY_UNAVAILABLE"
    );
    let waiting = fleet.reserve(&fleet.owner, "wait", request(&pool, DeviceClass::Gpu, 1)).await.expect("waits");
    assert_eq!(waiting.reservation.state, ReservationState::Pending);
    let queue_full =
        fleet.reserve(&fleet.owner, "wait-2", request(&pool, DeviceClass::Gpu, 1)).await.expect_err("maxPending 1");
    assert_eq!(queue_full.code(), "CAPACITY_UNAVAILABLE");
}

#[tokio::test]
async fn quota_is_a_limit_at_every_instant_of_the_window() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    fleet.node(&pool, "a", 8, 0).await;
    fleet.offer(&pool, "acme", 2).await;
    let acme = caller("acme", "alice@acme");

    assert_eq!(
        fleet.reserve(&acme, "three", request(&pool, DeviceClass::Gpu, 3)).await.expect_err("over").code(),
        "QUOTA_EXCEEDED"
    );
    let now = fleet.reserve(&acme, "now", request(&pool, DeviceClass::Gpu, 2)).await.expect("now").reservation;
    assert_eq!(now.state, ReservationState::Placed);
    // The next hour is free of acme's atoms, so two more fit there; an overlapping window waits.
    let mut later = request(&pool, DeviceClass::Gpu, 2);
    later.start_ms = Some(T0 + HOUR);
    assert_eq!(fleet.reserve(&acme, "later", later).await.expect("later").reservation.state, ReservationState::Placed);
    let mut overlapping = request(&pool, DeviceClass::Gpu, 1);
    overlapping.start_ms = Some(T0 + HOUR / 2);
    let waiting = fleet.reserve(&acme, "overlap", overlapping).await.expect("waits for quota").reservation;
    assert_eq!(waiting.state, ReservationState::Pending);

    // A pool nobody offered is invisible.
    let other = fleet.pool("private", Sharing::Exclusive, None).await;
    assert_eq!(
        fleet.reserve(&acme, "x", request(&other, DeviceClass::Gpu, 1)).await.expect_err("invisible").code(),
        "NOT_FOUND"
    );
    // The owner is not quota-limited.
    assert_eq!(
        fleet.reserve(&fleet.owner, "own", request(&pool, DeviceClass::Gpu, 4)).await.expect("owner").reservation.state,
        ReservationState::Placed
    );
}

#[tokio::test]
async fn the_worker_starts_activates_and_expires_at_the_recorded_times() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    fleet.node(&pool, "a", 2, 0).await;
    let mut req = request(&pool, DeviceClass::Gpu, 1);
    req.start_ms = Some(T0 + 60_000);
    let r = fleet.reserve(&fleet.owner, "k", req).await.expect("reserve").reservation;
    fleet.advance_to(T0 + 30_000).await;
    assert_eq!(fleet.app.reservation(&fleet.owner, &r.id).await.expect("read").value.state, ReservationState::Placed);
    fleet.advance_to(T0 + 60_000).await;
    assert_eq!(fleet.app.reservation(&fleet.owner, &r.id).await.expect("read").value.state, ReservationState::Active);
    // The worker runs late; the reservation still ends at its recorded end.
    fleet.advance_to(T0 + 60_000 + HOUR + 45_000).await;
    let ended = fleet.app.reservation(&fleet.owner, &r.id).await.expect("read").value;
    assert_eq!((ended.state, ended.expiry_cause), (ReservationState::Expired, Some(ExpiryCause::WindowEnded)));
    let held = fleet.held(r.id.as_str()).await;
    assert_eq!(held.len(), 1);
    assert_eq!((held[0].1, held[0].2), (T0 + 60_000, T0 + 60_000 + HOUR), "ended at the window's end");
    assert!(fleet.bookings(r.id.as_str()).await.is_empty(), "its booking left with it");
}

#[tokio::test]
async fn an_allocation_lease_lapses_unless_renewed() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    fleet.node(&pool, "a", 2, 0).await;
    let mut req = request(&pool, DeviceClass::Gpu, 1);
    req.lease_seconds = Some(60);
    let r = fleet.reserve(&fleet.owner, "leased", req).await.expect("reserve").reservation;
    fleet.advance_to(T0 + 50_000).await;
    let renewed = fleet.app.renew_reservation(&fleet.owner, &r.id).await.expect("renew").value;
    assert_eq!(renewed.lease_deadline_ms, Some(T0 + 110_000));
    fleet.advance_to(T0 + 100_000).await;
    assert_eq!(fleet.app.reservation(&fleet.owner, &r.id).await.expect("read").value.state, ReservationState::Active);
    fleet.advance_to(T0 + 111_000).await;
    let lapsed = fleet.app.reservation(&fleet.owner, &r.id).await.expect("read").value;
    assert_eq!((lapsed.state, lapsed.expiry_cause), (ReservationState::Expired, Some(ExpiryCause::LeaseLapsed)));
    assert_eq!(fleet.held(r.id.as_str()).await[0].2, T0 + 110_000, "ended at the lease deadline");
    assert!(fleet.bookings(r.id.as_str()).await.is_empty(), "its booking left with it");
    let late = fleet.app.renew_reservation(&fleet.owner, &r.id).await.expect_err("too late");
    assert_eq!(late.code(), "CONFLICT");
}

#[tokio::test]
async fn a_pending_reservation_fails_at_its_deadline() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    fleet.node(&pool, "a", 1, 0).await;
    fleet.reserve(&fleet.owner, "hog", request(&pool, DeviceClass::Gpu, 1)).await.expect("hog");
    let mut req = request(&pool, DeviceClass::Gpu, 1);
    req.deadline_ms = Some(T0 + 120_000);
    let waiting = fleet.reserve(&fleet.owner, "waiting", req).await.expect("pending").reservation;
    fleet.advance_to(T0 + 121_000).await;
    let failed = fleet.app.reservation(&fleet.owner, &waiting.id).await.expect("read").value;
    assert_eq!(failed.state, ReservationState::Failed);
    assert_eq!(failed.ended_at_ms, Some(T0 + 120_000));
}

#[tokio::test]
async fn the_wrong_verb_is_a_conflict_naming_the_state_and_release_ends_the_bookings() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    fleet.node(&pool, "a", 2, 0).await;
    let r = fleet.reserve(&fleet.owner, "k", request(&pool, DeviceClass::Gpu, 1)).await.expect("reserve").reservation;
    let err = fleet.app.release_reservation(&fleet.owner, &r.id).await.expect_err("not started");
    assert_eq!(err.code(), "CONFLICT");
    assert!(err.to_string().contains("placed"), "{err}");
    fleet.advance_to(T0 + 1_000).await;
    fleet.advance_to(T0 + 600_000).await;
    let err = fleet.app.cancel_reservation(&fleet.owner, &r.id, None).await.expect_err("started");
    assert!(err.to_string().contains("active"), "{err}");
    fleet.app.release_reservation(&fleet.owner, &r.id).await.expect("release");
    fleet.advance_to(T0 + 700_000).await;
    let released = fleet.app.reservation(&fleet.owner, &r.id).await.expect("read").value;
    assert_eq!(released.state, ReservationState::Released);
    assert_eq!(fleet.held(r.id.as_str()).await[0].2, T0 + 600_000, "ends when the tenant released");
    assert!(fleet.bookings(r.id.as_str()).await.is_empty(), "its booking left with it");
    let stranger = caller("acme", "eve@acme");
    assert_eq!(fleet.app.reservation(&stranger, &r.id).await.expect_err("not theirs").code(), "NOT_FOUND");
}

#[tokio::test]
async fn extend_keeps_the_atoms_and_is_refused_onto_someone_elses_time() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    fleet.node(&pool, "a", 1, 0).await;
    let r = fleet.reserve(&fleet.owner, "first", request(&pool, DeviceClass::Gpu, 1)).await.expect("first").reservation;
    let extended = fleet.app.extend_reservation(&fleet.owner, &r.id, T0 + 2 * HOUR).await.expect("extend").value;
    assert_eq!(extended.end_ms, Some(T0 + 2 * HOUR));
    assert_eq!(fleet.bookings(r.id.as_str()).await[0].2, T0 + 2 * HOUR);
    let mut next = request(&pool, DeviceClass::Gpu, 1);
    next.start_ms = Some(T0 + 2 * HOUR);
    fleet.reserve(&fleet.owner, "next", next).await.expect("the following window");
    let err = fleet.app.extend_reservation(&fleet.owner, &r.id, T0 + 3 * HOUR).await.expect_err("taken");
    assert_eq!(err.code(), "CONFLICT");
    assert_eq!(fleet.bookings(r.id.as_str()).await[0].2, T0 + 2 * HOUR, "unchanged");
}

#[tokio::test]
async fn out_of_scope_fields_and_unknown_projects_are_refused_by_name() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    fleet.node(&pool, "a", 1, 0).await;
    let mut instance = request(&pool, DeviceClass::Gpu, 1);
    instance.binding = Binding::Instance;
    assert!(fleet.reserve(&fleet.owner, "i", instance).await.expect_err("binding").to_string().starts_with("binding:"));
    let mut project = request(&pool, DeviceClass::Gpu, 1);
    project.project_id = Some(bc_domain::id::ProjectId::generate());
    assert!(
        fleet
            .reserve(&fleet.owner, "p", project.clone())
            .await
            .expect_err("project")
            .to_string()
            .starts_with("projectId:")
    );
    let created = fleet.app.create_project(&fleet.owner, "research".into()).await.expect("project").value;
    project.project_id = Some(created);
    fleet.reserve(&fleet.owner, "p2", project).await.expect("a project of the tenant");
    assert!(fleet.reserve(&fleet.owner, "", request(&pool, DeviceClass::Gpu, 1)).await.is_err(), "an empty key");
}

#[tokio::test]
async fn mig_and_timeslice_pools_book_their_own_atoms() {
    let fleet = Fleet::new().await;
    let mig = fleet.pool("mig", Sharing::Mig, None).await;
    let slots = fleet.pool("slots", Sharing::Timeslice, Some(4)).await;
    fleet.node(&mig, "m", 1, 7).await;
    fleet.node(&slots, "s", 1, 0).await;
    let r = fleet.reserve(&fleet.owner, "mig", request(&mig, DeviceClass::GpuMig, 3)).await.expect("mig").reservation;
    assert!(fleet.bookings(r.id.as_str()).await.iter().all(|(d, _, _)| d.contains("/gi")));
    let r =
        fleet.reserve(&fleet.owner, "slot", request(&slots, DeviceClass::GpuSlot, 4)).await.expect("slots").reservation;
    assert!(fleet.bookings(r.id.as_str()).await.iter().all(|(d, _, _)| d.contains("/s")));
    let full = fleet
        .reserve(&fleet.owner, "slot-2", request(&slots, DeviceClass::GpuSlot, 1))
        .await
        .expect("waits")
        .reservation;
    assert_eq!(full.state, ReservationState::Pending);
}

#[tokio::test]
async fn availability_answers_the_earliest_start_and_the_free_atoms() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    fleet.node(&pool, "a", 2, 0).await;
    fleet.reserve(&fleet.owner, "busy", request(&pool, DeviceClass::Gpu, 2)).await.expect("busy");
    let mut later = request(&pool, DeviceClass::Gpu, 1);
    later.start_ms = Some(T0 + 2 * HOUR);
    fleet.reserve(&fleet.owner, "later", later).await.expect("later");

    let one_hour = EarliestStart {
        pool_id: pool.clone(),
        devices: request(&pool, DeviceClass::Gpu, 2).devices,
        duration_s: 3600,
        not_before_ms: None,
    };
    assert_eq!(fleet.app.earliest_start(&fleet.owner, &one_hour).await.expect("query"), Some(T0 + HOUR));
    let two_hours = EarliestStart { duration_s: 7200, ..one_hour.clone() };
    assert_eq!(
        fleet.app.earliest_start(&fleet.owner, &two_hours).await.expect("query"),
        Some(T0 + 3 * HOUR),
        "the later booking is in the way"
    );
    let free = fleet.app.free_atoms(&fleet.owner, &pool, T0 + HOUR, T0 + 2 * HOUR).await.expect("free");
    assert_eq!(free.iter().map(|f| f.atoms.len()).sum::<usize>(), 2);
    let free = fleet.app.free_atoms(&fleet.owner, &pool, T0, T0 + HOUR).await.expect("free");
    assert!(free.is_empty());
}

#[tokio::test]
async fn the_free_atoms_listing_names_every_free_atom_of_a_pool_larger_than_placement_reads() {
    // Placement reads a few fitting nodes and stops; the listing must not. Twenty-four nodes of two GPUs, ten atoms
    // booked now, and six reservations of two atoms booked ahead, an hour each.
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    for n in 0..24 {
        fleet.node(&pool, &format!("n{n:02}"), 2, 0).await;
    }
    for step in 0..10 {
        fleet.reserve(&fleet.owner, &format!("now{step}"), request(&pool, DeviceClass::Gpu, 1)).await.expect("now");
    }
    for step in 0..6 {
        let mut ahead = request(&pool, DeviceClass::Gpu, 2);
        ahead.start_ms = Some(T0 + (2 + step) * HOUR);
        fleet.reserve(&fleet.owner, &format!("ahead{step}"), ahead).await.expect("ahead");
    }
    let mut tx = fleet.t.db.begin(bc_eventstore::TxOptions::READ_ONLY).await.expect("begin");
    for (start, end) in [(T0, T0 + HOUR), (T0 + HOUR, T0 + 3 * HOUR), (T0 + 4 * HOUR, T0 + 5 * HOUR)] {
        let expected = free_by_the_bookings(&mut tx, &pool, start, end).await;
        let listed = listed_free_atoms(&fleet, &pool, start, end).await;
        assert!(expected.len() > 16, "the pool holds fewer free nodes than placement reads: {}", expected.len());
        assert_eq!(listed, expected, "over [{start}, {end})");
    }
    tx.commit().await.expect("commit");
}

#[tokio::test]
async fn the_free_atoms_listing_finds_a_gap_of_every_length_at_and_beside_each_power_of_two_seconds() {
    // The gaps that contain a window are read by length class (2^k to 2^(k+1) seconds), each class bounded by where
    // its gaps can end. One GPU a node, and on each atom one gap between two bookings: under a second, then 2^k
    // seconds less a millisecond, exactly, and plus a millisecond, for k up to 42 (the last class holds every gap of
    // 2^40 seconds or more). Windows: each gap whole, each less a millisecond at both ends, its first and its last
    // millisecond. The listing must name what the bookings say is free, no more and no less. (Windows that end
    // after the year 9999 are read from the function the listing reads: the listing refuses them.)
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    const SECOND: i64 = 1000;
    let mut lengths = vec![1, 500, SECOND];
    for k in 1..=42 {
        let exact = (1i64 << k) * SECOND;
        lengths.extend([exact - 1, exact, exact + 1]);
    }
    for n in 0..lengths.len() {
        fleet.node(&pool, &format!("n{n:03}"), 1, 0).await;
    }
    let mut tx = fleet.t.db.begin(bc_eventstore::TxOptions::READ_ONLY).await.expect("begin");
    let devices = pool_gpus(&mut tx, &pool).await;
    tx.commit().await.expect("commit");
    assert_eq!(devices.len(), lengths.len());
    let opens = T0 + HOUR;
    let mut gaps = Vec::new();
    for ((_, device), length) in devices.iter().zip(&lengths) {
        let (from, until) = (opens + MINUTE, opens + MINUTE + length);
        assert_eq!(book_directly(&fleet, "before", device, opens, from).await, None, "the booking before");
        assert_eq!(book_directly(&fleet, "after", device, until, until + MINUTE).await, None, "the booking after");
        gaps.push((from, until));
    }

    let mut tx = fleet.t.db.begin(bc_eventstore::TxOptions::READ_ONLY).await.expect("begin");
    let mut checked = 0;
    for &(from, until) in &gaps {
        let mut windows = vec![(from, until), (from, from + 1), (until - 1, until)];
        if until - from > 2 {
            windows.push((from + 1, until - 1));
        }
        for (start, end) in windows {
            let expected = free_by_the_bookings(&mut tx, &pool, start, end).await;
            let listed = listed_free_atoms(&fleet, &pool, start, end).await;
            assert!(!expected.is_empty(), "the window's own gap is free over [{start}, {end})");
            assert_eq!(listed, expected, "over [{start}, {end}), in the gap [{from}, {until})");
            checked += 1;
        }
    }
    tx.commit().await.expect("commit");
    assert!(checked > 4 * 120, "{checked} windows");
}

/// The pool's atoms that no booking touches over `[start, end)`, by node in id order: what the free atoms listing
/// must answer.
async fn free_by_the_bookings(
    tx: &mut bc_eventstore::Tx,
    pool: &bc_domain::id::PoolId,
    start: i64,
    end: i64,
) -> Vec<(String, Vec<String>)> {
    let query = "SELECT d.node_id, array_agg(d.id ORDER BY d.id) FROM devices AS d
         WHERE d.pool_id = $1 AND NOT EXISTS (
             SELECT 1 FROM device_bookings AS b
             WHERE b.device_id = d.id AND b.during && tstzrange(ms_ts($2), ms_ts($3)))
         GROUP BY d.node_id ORDER BY d.node_id";
    atoms_by_node(tx, query, pool, start, end).await
}

/// What `query` answers for the pool and `[start, end)` (`$1` to `$3`): each node and its atoms.
async fn atoms_by_node(
    tx: &mut bc_eventstore::Tx,
    query: &'static str,
    pool: &bc_domain::id::PoolId,
    start: i64,
    end: i64,
) -> Vec<(String, Vec<String>)> {
    bc_eventstore::sql::query_as(query)
        .bind(pool.as_str())
        .bind(start)
        .bind(end)
        .fetch_all(tx.conn())
        .await
        .unwrap_or_else(|err| panic!("{query}: {err}"))
}

/// The free atoms listing over `[start, end)`, as the pool's owner sees it. A window that ends after the year
/// 9999 is refused by the listing (no caller may name such an instant), so it is read from the function the listing
/// reads (`free_atoms_over`), to reach the gaps of the longest length class.
async fn listed_free_atoms(
    fleet: &Fleet,
    pool: &bc_domain::id::PoolId,
    start: i64,
    end: i64,
) -> Vec<(String, Vec<String>)> {
    let listed = fleet.app.free_atoms(&fleet.owner, pool, start, end).await;
    if end <= bc_domain::instant::MAX_EPOCH_MS {
        let listed = listed.expect("free atoms");
        return listed
            .into_iter()
            .map(|f| (f.node_id.to_string(), f.atoms.iter().map(|a| a.to_string()).collect()))
            .collect();
    }
    let past = if start > bc_domain::instant::MAX_EPOCH_MS { "start" } else { "end" };
    assert!(
        matches!(listed, Err(AppError::Rejected(Rejection::InvalidArgument { ref field, .. })) if field == past),
        "a window past the year 9999 is refused naming the first instant past it ({past}): {listed:?}"
    );
    let query = "SELECT g.node_id, array_agg(g.device_id ORDER BY g.device_id)
         FROM free_atoms_over($1, 'gpu', ms_ts($2), ms_ts($3), NULL) AS g
         GROUP BY g.node_id ORDER BY g.node_id";
    let mut tx = fleet.t.db.begin(bc_eventstore::TxOptions::READ_ONLY).await.expect("begin");
    let read = atoms_by_node(&mut tx, query, pool, start, end).await;
    tx.commit().await.expect("commit");
    read
}

#[tokio::test]
async fn when_conflict_retries_run_out_the_reservation_is_left_pending_not_failed() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    fleet.node(&pool, "a", 2, 0).await;
    // No tries left for placement at all: the request is recorded as pending, and the worker places it.
    let mut app = fleet.app.clone();
    app.retry.max_attempts = 0;
    let committed = app
        .reserve(
            &fleet.owner,
            bc_commands::reservations::Reserve {
                idempotency_key: "k".into(),
                request: request(&pool, DeviceClass::Gpu, 1),
            },
        )
        .await
        .expect("recorded");
    assert_eq!(committed.value.reservation.state, ReservationState::Pending);
    fleet.worker().run_until_idle().await.expect("worker");
    let placed = fleet.app.reservation(&fleet.owner, &committed.value.reservation.id).await.expect("read").value;
    assert!(placed.state.holds_atoms(), "{}", placed.state);
}

#[tokio::test]
async fn pending_reservations_are_placed_by_offering_priority_then_first_come() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    fleet.node(&pool, "a", 1, 0).await;
    for (tenant, priority) in [("low", 0), ("high", 10)] {
        let offer = bc_commands::fleet::OfferPool {
            tenant_id: tenant.parse().expect("tenant"),
            quota: [("gpu".to_owned(), 4)].into(),
            priority,
            include_descendants: false,
        };
        fleet.app.offer_pool(&fleet.owner, &pool, offer).await.expect("offer");
    }
    let hog = fleet.reserve(&fleet.owner, "hog", request(&pool, DeviceClass::Gpu, 1)).await.expect("hog").reservation;
    let low_first = fleet
        .reserve(&caller("low", "l@low"), "l1", request(&pool, DeviceClass::Gpu, 1))
        .await
        .expect("low")
        .reservation;
    let low_second = fleet
        .reserve(&caller("low", "l@low"), "l2", request(&pool, DeviceClass::Gpu, 1))
        .await
        .expect("low")
        .reservation;
    let high = fleet
        .reserve(&caller("high", "h@high"), "h1", request(&pool, DeviceClass::Gpu, 1))
        .await
        .expect("high")
        .reservation;
    assert!([&low_first, &low_second, &high].iter().all(|r| r.state == ReservationState::Pending));

    let state = |who: &'static str, id| {
        let app = fleet.app.clone();
        async move {
            app.reservation(&caller(who, if who == "low" { "l@low" } else { "h@high" }), id)
                .await
                .expect("read")
                .value
                .state
        }
    };
    fleet.app.cancel_reservation(&fleet.owner, &hog.id, None).await.expect("free the GPU");
    fleet.worker().run_until_idle().await.expect("worker");
    assert!(state("high", &high.id).await.holds_atoms(), "the higher-priority offering goes first");
    assert_eq!(state("low", &low_first.id).await, ReservationState::Pending);

    fleet.app.release_reservation(&caller("high", "h@high"), &high.id).await.expect("release");
    fleet.worker().run_until_idle().await.expect("worker");
    assert!(state("low", &low_first.id).await.holds_atoms(), "then first come, first served");
    assert_eq!(state("low", &low_second.id).await, ReservationState::Pending);
}

#[tokio::test]
async fn placement_uses_schedulable_nodes_only() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    let node = fleet.node(&pool, "a", 2, 0).await;
    fleet.app.node_verb(&fleet.owner, &node, bc_commands::nodes::NodeVerb::Cordon, None).await.expect("cordon");
    let waiting =
        fleet.reserve(&fleet.owner, "k", request(&pool, DeviceClass::Gpu, 1)).await.expect("reserve").reservation;
    assert_eq!(waiting.state, ReservationState::Pending, "a cordoned node takes no new bookings");
    fleet.app.node_verb(&fleet.owner, &node, bc_commands::nodes::NodeVerb::Uncordon, None).await.expect("uncordon");
    fleet.worker().run_until_idle().await.expect("worker");
    let placed = fleet.app.reservation(&fleet.owner, &waiting.id).await.expect("read").value;
    assert!(placed.state.holds_atoms(), "uncordoning wakes the pool's pending reservations");
}

/// Transaction ids gain a digit as a log grows (999 to 1000, 99,999 to 100,000): the inline rebuild must replay
/// in numeric position order then too, not in the order of the ids' text.
#[tokio::test]
async fn the_inline_rebuild_replays_in_log_order_across_transaction_ids_of_different_lengths() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    fleet.node(&pool, "a", 2, 0).await;
    let placed = fleet.reserve(&fleet.owner, "k", request(&pool, DeviceClass::Gpu, 2)).await.expect("reserve");
    let id = placed.reservation.id;
    fleet.app.cancel_reservation(&fleet.owner, &id, None).await.expect("cancel");

    let mut tx = fleet.t.db.begin(bc_eventstore::TxOptions::READ_COMMITTED).await.expect("begin");
    // Every event up to the reservation's first moves to a transaction id a digit shorter, starting "9...": the
    // log's numeric order is kept (and every id stays behind the horizon), while its text order now puts the
    // cancellation before the placement.
    let first: String = bc_eventstore::sql::query_scalar("SELECT min(txid)::text FROM events WHERE stream_id = $1")
        .bind(id.as_str())
        .fetch_one(tx.conn())
        .await
        .expect("the reservation's first transaction");
    let lowest: String = bc_eventstore::sql::query_scalar("SELECT min(txid)::text FROM events")
        .fetch_one(tx.conn())
        .await
        .expect("the log's first transaction");
    let shorter = 9 * 10i64.pow(first.len() as u32 - 2);
    let moved = bc_eventstore::sql::query(
        "UPDATE events SET txid = (txid::text::int8 - $2::text::int8 + $3)::text::xid8 WHERE txid <= $1::text::xid8",
    )
    .bind(&first)
    .bind(&lowest)
    .bind(shorter)
    .execute(tx.conn())
    .await
    .expect("move the earlier events")
    .rows_affected();
    assert!(moved > 0, "the reservation's first transaction and those before it");
    let bound = 10i64.pow(first.len() as u32 - 1).to_string();
    let (moved_max, kept_min): (String, String) = bc_eventstore::sql::query_as(
        "SELECT (SELECT max(txid)::text FROM events WHERE txid < $1::text::xid8),
                (SELECT min(txid)::text FROM events WHERE txid >= $1::text::xid8)",
    )
    .bind(&bound)
    .fetch_one(tx.conn())
    .await
    .expect("the moved ids");
    assert!(kept_min < moved_max, "{kept_min} sorts before {moved_max} as text, though it is larger");

    let logged: i64 = bc_eventstore::sql::query_scalar(
        "SELECT count(*) FROM events
         WHERE split_part(event_type, '.', 1) IN ('site', 'project', 'pool', 'node', 'reservation')",
    )
    .fetch_one(tx.conn())
    .await
    .expect("count the events");
    let applied = bc_projections::inline::rebuild_into(&mut tx, "digits_rebuild").await.expect("rebuild");
    assert_eq!(applied as i64, logged, "every event replayed once");
    for table in bc_projections::inline::TABLES {
        let differences = bc_projections::inline::differences(&mut tx, "digits_rebuild", table).await.expect("compare");
        assert_eq!(differences, 0, "{table} rebuilt from the log differs from the live table");
    }
    tx.rollback().await;
}

#[tokio::test]
async fn the_worker_s_events_name_the_event_they_answer_and_carry_the_creator_s_correlation() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    fleet.node(&pool, "a", 2, 0).await;
    let alice = bc_commands::Caller { request_id: Some("req_alice_1".into()), ..fleet.owner.clone() };
    let mut later = request(&pool, DeviceClass::Gpu, 1);
    later.start_ms = Some(T0 + HOUR);
    let placed = fleet.reserve(&alice, "later", later).await.expect("placed").reservation;
    fleet.advance_to(T0 + HOUR).await;
    fleet.worker().run_until_idle().await.expect("worker");
    let mut tx = fleet.t.db.begin(bc_eventstore::TxOptions::READ_ONLY).await.expect("begin");
    let history = bc_eventstore::events::read_stream(&mut tx, placed.id.as_str(), 0, 100).await.expect("history");
    tx.commit().await.expect("commit");
    let first = history[0].metadata().expect("metadata");
    assert_eq!(first.correlation_id.as_deref(), Some("req_alice_1"), "a request begins its own operation");
    assert!(first.causation_id.is_none());
    let by_worker: Vec<_> = history
        .iter()
        .enumerate()
        .filter(|(_, e)| e.metadata().is_ok_and(|m| m.admission.is_some_and(|a| a.session_kind == "system")))
        .collect();
    assert!(
        !by_worker.is_empty(),
        "the worker started it: {:?}",
        history.iter().map(|e| &e.event_type).collect::<Vec<_>>()
    );
    for (at, event) in by_worker {
        let metadata = event.metadata().expect("metadata");
        assert_eq!(metadata.correlation_id.as_deref(), Some("req_alice_1"), "{}", event.event_type);
        let cause = metadata.causation_id.expect("a cause");
        assert!(history[..at].iter().any(|e| e.position.to_string() == cause), "{}: {cause}", event.event_type);
    }
}

#[tokio::test]
async fn a_placement_skips_atoms_a_concurrent_command_holds_and_takes_the_next_fit() {
    use bc_eventstore::{TxOptions, sql};
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    let tight = fleet.node(&pool, "tight", 2, 0).await;
    let roomy = fleet.node(&pool, "roomy", 4, 0).await;

    // Another command is booking both atoms of the best-fitting node and has not committed.
    let mut holder = fleet.t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    let held: Vec<String> = sql::query_scalar("SELECT id FROM devices WHERE node_id = $1 ORDER BY id FOR UPDATE")
        .bind(tight.as_str())
        .fetch_all(holder.conn())
        .await
        .expect("lock the tight node's atoms");
    assert_eq!(held.len(), 2);
    let raced = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        fleet.reserve(&fleet.owner, "racing", request(&pool, DeviceClass::Gpu, 1)),
    )
    .await
    .expect("the reserve waited on atoms another command holds instead of choosing free ones")
    .expect("reserve");
    assert_eq!(raced.reservation.state, ReservationState::Placed);
    assert_eq!(raced.reservation.allocations[0].node_id, roomy, "the next fit, not the held atoms");
    holder.rollback().await;

    // With nothing held, best fit still wins: the two-atom node.
    let calm = fleet.reserve(&fleet.owner, "calm", request(&pool, DeviceClass::Gpu, 1)).await.expect("reserve");
    assert_eq!(calm.reservation.allocations[0].node_id, tight);
}

#[tokio::test]
async fn a_placement_that_lost_its_best_fit_draws_its_next_choice_from_the_best_few_nodes() {
    use bc_eventstore::{TxOptions, sql};
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    let tight = fleet.node(&pool, "tight", 1, 0).await;
    let snug = fleet.node(&pool, "snug", 2, 0).await;
    let roomy = fleet.node(&pool, "roomy", 8, 0).await;

    // Another command holds the best fit's only atom: every request loses it, and chooses again.
    let mut holder = fleet.t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    let held: Vec<String> = sql::query_scalar("SELECT id FROM devices WHERE node_id = $1 FOR UPDATE")
        .bind(tight.as_str())
        .fetch_all(holder.conn())
        .await
        .expect("lock the tight node's atom");
    assert_eq!(held.len(), 1);
    let mut chosen = std::collections::BTreeMap::new();
    for i in 0..20 {
        let r = fleet
            .reserve(&fleet.owner, &format!("loser-{i}"), request(&pool, DeviceClass::Gpu, 1))
            .await
            .expect("reserve")
            .reservation;
        *chosen.entry(r.allocations[0].node_id.clone()).or_insert(0) += 1;
        fleet.app.cancel_reservation(&fleet.owner, &r.id, None).await.expect("cancel");
    }
    holder.rollback().await;
    // Strict best fit would send all twenty to the next best fit; drawn from the best few (by a hash of each
    // reservation id), they land on both.
    assert!(!chosen.contains_key(&tight), "{chosen:?}");
    assert!(chosen.contains_key(&snug) && chosen.contains_key(&roomy), "{chosen:?}");
}

#[tokio::test]
async fn a_placement_skips_atoms_booked_since_its_snapshot_instead_of_failing() {
    use bc_eventstore::{TxOptions, sql};
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    let node = fleet.node(&pool, "a", 2, 0).await;
    let mut late = fleet.t.db.begin(TxOptions::COMMAND).await.expect("begin");
    let atoms: Vec<String> = sql::query_scalar("SELECT id FROM devices WHERE node_id = $1 ORDER BY id")
        .bind(node.as_str())
        .fetch_all(late.conn())
        .await
        .expect("the node's atoms, in the late command's snapshot");
    assert_eq!(atoms.len(), 2);

    // Another command books one of them and commits after that snapshot was taken.
    let first = fleet.reserve(&fleet.owner, "first", request(&pool, DeviceClass::Gpu, 1)).await.expect("reserve");
    let taken = fleet.bookings(first.reservation.id.as_str()).await[0].0.clone();
    let other = atoms.iter().find(|atom| **atom != taken).expect("the other atom").clone();

    // The late command chose both (its snapshot says both are free): it locks the one still as it saw it and skips
    // the other, and its transaction goes on.
    let answer: String = sql::query_scalar("SELECT lock_chosen($1, $2, true)::text")
        .bind(vec![node.to_string()])
        .bind(&atoms)
        .fetch_one(late.conn())
        .await
        .expect("the lock skips the atom booked since the snapshot instead of refusing the transaction");
    let answer: serde_json::Value = serde_json::from_str(&answer).expect("json");
    assert_eq!(answer["locked"], serde_json::json!([other]), "{answer}");
    assert_eq!(answer["schedulable"], 1, "{answer}");
    let still: i64 = sql::query_scalar("SELECT count(*) FROM devices WHERE id = $1")
        .bind(&other)
        .fetch_one(late.conn())
        .await
        .expect("the transaction is still usable");
    assert_eq!(still, 1);
    late.rollback().await;
}

const MINUTE: i64 = 60_000;

/// A pool of one node of 2 GPUs booked by 50 one-minute reservations of one GPU, back to back from now: 50 booking
/// ends (more than one page of them) before two atoms are free together.
async fn a_node_behind_a_chain_of_minutes() -> (Fleet, bc_domain::id::PoolId) {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    fleet.node(&pool, "a", 2, 0).await;
    for k in 0..50 {
        let mut link = request(&pool, DeviceClass::Gpu, 1);
        link.start_ms = Some(T0 + k * MINUTE);
        link.duration_s = 60;
        fleet.reserve(&fleet.owner, &format!("link-{k}"), link).await.expect("link");
    }
    (fleet, pool)
}

#[tokio::test]
async fn earliest_start_reads_past_many_booking_ends_in_order() {
    // A two-atom hour first fits when the chain ends, past its 50 booking ends.
    let (fleet, pool) = a_node_behind_a_chain_of_minutes().await;
    let question = EarliestStart {
        pool_id: pool.clone(),
        devices: request(&pool, DeviceClass::Gpu, 2).devices,
        duration_s: 3600,
        not_before_ms: None,
    };
    assert_eq!(fleet.app.earliest_start(&fleet.owner, &question).await.expect("query"), Some(T0 + 50 * MINUTE));
    let after = EarliestStart { not_before_ms: Some(T0 + 50 * MINUTE + 1), ..question };
    assert_eq!(
        fleet.app.earliest_start(&fleet.owner, &after).await.expect("query"),
        Some(T0 + 50 * MINUTE + 1000),
        "not before a given instant, rounded up to the second"
    );
}

#[tokio::test]
async fn earliest_start_answers_at_once_when_no_node_could_ever_hold_the_request() {
    // Behind 50 booking ends, a request that no node of the pool could hold at any time (a selector nothing
    // matches, more atoms on one node than any has) is answered from one read of the pool's devices: the walk over
    // the booking ends, which reads the free atoms again at each of them, is skipped.
    use bc_eventstore::Db;
    use bc_eventstore::testing::{RoundTrips, test_db_config};
    let (fleet, pool) = a_node_behind_a_chain_of_minutes().await;
    let trips = RoundTrips::start(fleet.t.connect_options());
    let app = bc_commands::App::new(Db::connect_lazy_with(trips.connect_options(), &test_db_config()));
    let two = EarliestStart {
        pool_id: pool.clone(),
        devices: request(&pool, DeviceClass::Gpu, 2).devices,
        duration_s: 3600,
        not_before_ms: None,
    };
    let mut no_match = two.clone();
    no_match.devices.selector.gpu_product = Some("A100-SXM4-40GB".into());
    let three = EarliestStart { devices: request(&pool, DeviceClass::Gpu, 3).devices, ..two.clone() };
    for (what, question) in [("a selector nothing matches", &no_match), ("three atoms on one node", &three)] {
        trips.take();
        assert_eq!(app.earliest_start(&fleet.owner, question).await.expect("query"), None, "{what}");
        let taken = trips.take();
        assert!(taken <= 16, "{what}: {taken} round trips, the booking ends were walked");
    }
    // A request the node could hold still walks the booking ends to its answer.
    trips.take();
    assert_eq!(app.earliest_start(&fleet.owner, &two).await.expect("query"), Some(T0 + 50 * MINUTE));
    assert!(trips.take() > 50, "the walk past 50 booking ends");
}

#[tokio::test]
async fn the_free_capacity_summary_follows_placements_extensions_endings_and_expiries() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    let node = fleet.node(&pool, "a", 4, 0).await;
    assert_eq!(fleet.free_capacity(&node).await, ((4, 4), vec![None; 4]), "a new node is all free");

    let first = fleet.reserve(&fleet.owner, "first", request(&pool, DeviceClass::Gpu, 2)).await.expect("first");
    let (summary, ends) = fleet.free_capacity(&node).await;
    assert_eq!(summary, (4, 2));
    assert_eq!(ends.iter().filter(|end| **end == Some(T0 + HOUR)).count(), 2, "{ends:?}");

    fleet.app.extend_reservation(&fleet.owner, &first.reservation.id, T0 + 2 * HOUR).await.expect("extend");
    let (summary, ends) = fleet.free_capacity(&node).await;
    assert_eq!(summary, (4, 2));
    assert_eq!(ends.iter().filter(|end| **end == Some(T0 + 2 * HOUR)).count(), 2, "{ends:?}");

    let mut later = request(&pool, DeviceClass::Gpu, 1);
    later.start_ms = Some(T0 + 3 * HOUR);
    let later = fleet.reserve(&fleet.owner, "later", later).await.expect("later");
    assert_eq!(fleet.free_capacity(&node).await.0, (4, 1), "a booking in the future holds its atom too");

    fleet.app.cancel_reservation(&fleet.owner, &first.reservation.id, None).await.expect("cancel");
    let (summary, ends) = fleet.free_capacity(&node).await;
    assert_eq!(summary, (4, 3), "a cancelled reservation's atoms are free again");
    assert_eq!(ends.iter().flatten().copied().collect::<Vec<_>>(), vec![T0 + 4 * HOUR], "{ends:?}");

    // The later reservation runs its window and expires: the node is all free again.
    fleet.advance_to(T0 + 3 * HOUR).await;
    fleet.advance_to(T0 + 4 * HOUR + 1_000).await;
    let ended = fleet.app.reservation(&fleet.owner, &later.reservation.id).await.expect("read").value;
    assert_eq!(ended.state, ReservationState::Expired);
    assert_eq!(fleet.free_capacity(&node).await, ((4, 4), vec![None; 4]));
}

#[tokio::test]
async fn atoms_booked_only_after_a_window_are_placed_through_the_exact_query() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    let node = fleet.node(&pool, "a", 2, 0).await;
    let mut later = request(&pool, DeviceClass::Gpu, 2);
    later.start_ms = Some(T0 + 2 * HOUR);
    fleet.reserve(&fleet.owner, "later", later).await.expect("later");
    assert_eq!(fleet.free_capacity(&node).await.0, (2, 0), "the summary counts both atoms as booked");
    // An hour now ends before the later booking starts: it fits, though the summary has no free atom.
    let now = fleet.reserve(&fleet.owner, "now", request(&pool, DeviceClass::Gpu, 2)).await.expect("now");
    assert_eq!(now.reservation.state, ReservationState::Placed);
    assert_eq!(fleet.bookings(now.reservation.id.as_str()).await.len(), 2);
    let question = EarliestStart {
        pool_id: pool.clone(),
        devices: request(&pool, DeviceClass::Gpu, 1).devices,
        duration_s: 1800,
        not_before_ms: Some(T0 + HOUR),
    };
    assert_eq!(
        fleet.app.earliest_start(&fleet.owner, &question).await.expect("query"),
        Some(T0 + HOUR),
        "between the two bookings"
    );
}

#[tokio::test]
async fn an_atom_s_free_time_is_the_complement_of_its_live_bookings_through_every_change() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    let node = fleet.node(&pool, "a", 1, 0).await;
    let free_time = || async {
        let (gaps, drift) = fleet.free_time(&node).await;
        assert_eq!(drift, 0, "atom_gaps differs from the live bookings: {gaps:?}");
        gaps.into_iter().map(|(_, from, until)| (from, until)).collect::<Vec<_>>()
    };
    assert_eq!(free_time().await, vec![(None, None)], "a new atom is free at every instant");

    let first = fleet.reserve(&fleet.owner, "first", request(&pool, DeviceClass::Gpu, 1)).await.expect("first");
    assert_eq!(free_time().await, vec![(None, Some(T0)), (Some(T0 + HOUR), None)]);

    let mut later = request(&pool, DeviceClass::Gpu, 1);
    later.start_ms = Some(T0 + 3 * HOUR);
    let later = fleet.reserve(&fleet.owner, "later", later).await.expect("later");
    assert_eq!(later.reservation.state, ReservationState::Placed);
    assert_eq!(
        free_time().await,
        vec![(None, Some(T0)), (Some(T0 + HOUR), Some(T0 + 3 * HOUR)), (Some(T0 + 4 * HOUR), None)]
    );

    fleet.app.extend_reservation(&fleet.owner, &first.reservation.id, T0 + 2 * HOUR).await.expect("extend");
    assert_eq!(
        free_time().await,
        vec![(None, Some(T0)), (Some(T0 + 2 * HOUR), Some(T0 + 3 * HOUR)), (Some(T0 + 4 * HOUR), None)]
    );
    // Only the time between the two bookings is left for a window of an hour and a half: it does not fit.
    let mut between = request(&pool, DeviceClass::Gpu, 1);
    between.start_ms = Some(T0 + 2 * HOUR);
    between.duration_s = 5400;
    let between = fleet.reserve(&fleet.owner, "between", between).await.expect("between");
    assert_eq!(between.reservation.state, ReservationState::Pending, "{:?}", between.reservation);
    fleet.app.cancel_reservation(&fleet.owner, &between.reservation.id, None).await.expect("cancel between");

    fleet.app.cancel_reservation(&fleet.owner, &first.reservation.id, None).await.expect("cancel");
    assert_eq!(free_time().await, vec![(None, Some(T0 + 3 * HOUR)), (Some(T0 + 4 * HOUR), None)]);

    fleet.advance_to(T0 + 3 * HOUR).await;
    fleet.advance_to(T0 + 4 * HOUR + 1_000).await;
    let ended = fleet.app.reservation(&fleet.owner, &later.reservation.id).await.expect("read").value;
    assert_eq!(ended.state, ReservationState::Expired);
    assert_eq!(free_time().await, vec![(None, None)], "every booking ended");
}

#[tokio::test]
async fn the_free_time_edited_in_place_matches_the_bookings_after_random_reserves_and_cancels() {
    // Windows that touch, nest between others and leave no gap (adjacent bookings), on three atoms, in a random
    // order: each insert splits a gap, each cancel merges its window with the gaps either side of it.
    random_reserves_and_cancels_keep_the_free_time(3, 17).await;
}

#[tokio::test]
async fn the_free_time_of_many_atoms_edited_at_once_matches_the_bookings_after_random_reserves_and_cancels() {
    // The same on eight atoms with requests of one to seven: a statement that books or frees four atoms or more
    // edits all their gaps in two statements (capacity/0030), fewer keep the loop of one atom at a time.
    random_reserves_and_cancels_keep_the_free_time(8, 30).await;
}

/// Reserves (one to `atoms - 1` GPUs, in random windows) and cancels at random on one node of `atoms` atoms,
/// checking after every step that the gaps are the complement of the live bookings.
async fn random_reserves_and_cancels_keep_the_free_time(atoms: usize, seed: u64) {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    let node = fleet.node(&pool, "a", atoms, 0).await;
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut live: Vec<bc_domain::id::ReservationId> = Vec::new();
    let (mut placed, mut wide) = (0, 0);
    for step in 0..80 {
        if live.is_empty() || rng.u8(0..3) > 0 {
            let count = rng.u32(1..u32::try_from(atoms).expect("a few atoms"));
            let mut wanted = request(&pool, DeviceClass::Gpu, count);
            wanted.start_ms = Some(T0 + rng.i64(0..8) * HOUR / 2);
            wanted.duration_s = 1800 * rng.u64(1..4);
            wanted.wait = false;
            match fleet.reserve(&fleet.owner, &format!("r{step}"), wanted).await {
                Ok(reserved) if reserved.reservation.state == ReservationState::Placed => {
                    placed += 1;
                    wide += usize::from(count >= 4);
                    live.push(reserved.reservation.id);
                }
                Ok(_) | Err(_) => {}
            }
        } else {
            let id = live.swap_remove(rng.usize(0..live.len()));
            fleet.app.cancel_reservation(&fleet.owner, &id, None).await.expect("cancel");
        }
        let (gaps, drift) = fleet.free_time(&node).await;
        assert_eq!(drift, 0, "step {step}: atom_gaps differs from the live bookings: {gaps:?}");
    }
    assert!(placed >= 20, "the sequence booked too little to test anything: {placed}");
    if atoms >= 4 {
        assert!(wide >= 5, "too few reservations of four atoms or more were placed: {wide}");
    }
}

/// The exact placement read (`exact_candidates`) of GPUs in `pool` over `window`, `per_node` a node, with a
/// selector's attributes as JSON, at the limit a reserve of one node reads with (64), each step settled by a quarter
/// of it (what the scalar placement's first read asks): each node with its free atoms.
async fn exact_read(
    tx: &mut bc_eventstore::Tx,
    pool: &bc_domain::id::PoolId,
    attributes: &str,
    window: (i64, i64),
    per_node: i32,
) -> Vec<(String, Vec<String>)> {
    exact_read_settled_by(tx, pool, attributes, window, per_node, 64 / 4).await
}

/// [`exact_read`] with the count of nodes that settles each of its steps given (`exact_candidates`' last argument).
async fn exact_read_settled_by(
    tx: &mut bc_eventstore::Tx,
    pool: &bc_domain::id::PoolId,
    attributes: &str,
    (start, end): (i64, i64),
    per_node: i32,
    enough: i64,
) -> Vec<(String, Vec<String>)> {
    bc_eventstore::sql::query_as(
        "SELECT node_id, free FROM exact_candidates($1, 'gpu', NULL, NULL, $2::jsonb, $3, $4, $5, 64, $6)",
    )
    .bind(pool.as_str())
    .bind(attributes)
    .bind(start)
    .bind(end)
    .bind(per_node)
    .bind(enough)
    .fetch_all(tx.conn())
    .await
    .expect("the candidates")
}

/// A reservation of 2 GPUs of `pool` by its owner, from `start_ms` for `duration_s` seconds.
async fn two_gpus_at(
    fleet: &Fleet,
    pool: &bc_domain::id::PoolId,
    key: &str,
    start_ms: i64,
    duration_s: u64,
) -> bc_domain::reservation::Reservation {
    let mut wanted = request(pool, DeviceClass::Gpu, 2);
    wanted.start_ms = Some(start_ms);
    wanted.duration_s = duration_s;
    fleet.reserve(&fleet.owner, key, wanted).await.expect("2 GPUs").reservation
}

/// Every booking of `pool`: its atom's node, the atom, and its window in ms.
async fn pool_bookings(tx: &mut bc_eventstore::Tx, pool: &bc_domain::id::PoolId) -> Vec<(String, String, i64, i64)> {
    bc_eventstore::sql::query_as(
        "SELECT d.node_id, b.device_id, ts_ms(lower(b.during)), ts_ms(upper(b.during))
         FROM device_bookings AS b JOIN devices AS d ON d.id = b.device_id WHERE b.pool_id = $1",
    )
    .bind(pool.as_str())
    .fetch_all(tx.conn())
    .await
    .expect("the bookings")
}

/// The GPUs of `pool`, each with its node: `(node, device)`.
async fn pool_gpus(tx: &mut bc_eventstore::Tx, pool: &bc_domain::id::PoolId) -> Vec<(String, String)> {
    bc_eventstore::sql::query_as("SELECT node_id, id FROM devices WHERE pool_id = $1 AND class = 'gpu'")
        .bind(pool.as_str())
        .fetch_all(tx.conn())
        .await
        .expect("the devices")
}

#[tokio::test]
async fn the_quota_sweep_and_the_free_atoms_agree_with_every_booking_over_random_windows() {
    // Bookings of a quota-limited tenant, short and long (up to 40 hours), laid over two days on four nodes; then
    // random windows, some starting now. The quota sweep reads bookings by their start, bounded by the holder's
    // longest, and the free atoms come from three indexes of the gaps: both must answer what every booking says.
    use std::collections::BTreeMap;
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    for name in ["a", "b", "c", "d"] {
        fleet.node(&pool, name, 4, 0).await;
    }
    fleet.offer(&pool, "acme", 64).await;
    let acme = caller("acme", "dev@acme");
    let mut rng = fastrand::Rng::with_seed(14);
    let mut live = Vec::new();
    for step in 0..60 {
        if live.len() < 4 || rng.u8(0..4) > 0 {
            let mut wanted = request(&pool, DeviceClass::Gpu, rng.u32(1..5));
            wanted.start_ms = Some(T0 + rng.i64(0..96) * HOUR / 2);
            wanted.duration_s = if rng.u8(0..5) == 0 { 3600 * rng.u64(10..41) } else { 1800 * rng.u64(1..6) };
            wanted.wait = false;
            if let Ok(reserved) = fleet.reserve(&acme, &format!("r{step}"), wanted).await
                && reserved.reservation.state == ReservationState::Placed
            {
                live.push(reserved.reservation.id);
            }
        } else {
            let id = live.swap_remove(rng.usize(0..live.len()));
            fleet.app.cancel_reservation(&acme, &id, None).await.expect("cancel");
        }
    }
    assert!(live.len() >= 15, "the sequence booked too little to test anything: {}", live.len());

    let mut tx = fleet.t.db.begin(bc_eventstore::TxOptions::READ_ONLY).await.expect("begin");
    let bookings = pool_bookings(&mut tx, &pool).await;
    let devices = pool_gpus(&mut tx, &pool).await;
    assert!(bookings.iter().any(|(_, _, from, until)| until - from >= 10 * HOUR), "a long booking");
    let mut long_windows = 0;
    for round in 0..60 {
        // Now, from where a booking ends (a gap begins), up to where one starts, or anywhere in the next two days.
        let length = rng.i64(1..40) * HOUR / 4;
        let (start, end) = match round % 4 {
            0 => (T0, T0 + length),
            1 => {
                let start = bookings[rng.usize(0..bookings.len())].3;
                (start, start + length)
            }
            2 => {
                let end = bookings[rng.usize(0..bookings.len())].2;
                (end - length, end)
            }
            _ => {
                let start = T0 + rng.i64(0..240) * HOUR / 4;
                (start, start + length)
            }
        };
        long_windows += i64::from(end - start > 4 * HOUR);

        // The peak: at each instant where a booking may begin to count, how many atoms are held.
        let overlapping: Vec<(i64, i64)> = bookings
            .iter()
            .filter(|(_, _, from, until)| *from < end && *until > start)
            .map(|(_, _, from, until)| (*from, *until))
            .collect();
        let expected = std::iter::once(start)
            .chain(overlapping.iter().map(|(from, _)| *from).filter(|from| *from > start))
            .map(|at| overlapping.iter().filter(|(from, until)| *from <= at && at < *until).count() as i64)
            .max()
            .unwrap_or(0);
        let peak: i64 = bc_eventstore::sql::query_scalar("SELECT tenant_peak('acme', $1, 'gpu', $2, $3)")
            .bind(pool.as_str())
            .bind(start)
            .bind(end)
            .fetch_one(tx.conn())
            .await
            .expect("the peak");
        assert_eq!(peak, expected, "round {round}: the peak over [{start}, {end})");

        // The atoms free over the whole window, by node.
        let mut free: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (node, device) in &devices {
            let booked = bookings.iter().any(|(_, d, from, until)| d == device && *from < end && *until > start);
            if !booked {
                free.entry(node.clone()).or_default().push(device.clone());
            }
        }
        for per_node in [1, 3] {
            let found: BTreeMap<String, Vec<String>> =
                exact_read(&mut tx, &pool, "{}", (start, end), per_node).await.into_iter().collect();
            let mut wanted = free.clone();
            wanted.retain(|_, atoms| atoms.len() >= per_node as usize);
            for atoms in wanted.values_mut() {
                atoms.sort();
            }
            assert_eq!(found, wanted, "round {round}: {per_node} per node over [{start}, {end})");
        }
    }
    assert!(long_windows > 5, "too few long windows: {long_windows}");
    tx.commit().await.expect("commit");
}

#[tokio::test]
async fn in_a_calendar_booked_ahead_the_exact_read_names_the_hint_s_tightest_fitting_nodes() {
    // Every atom booked somewhere ahead, so the summary of atoms with nothing booked offers none: the nodes come from
    // the hint of how long each can hold k atoms, checked against the gaps, tightest fit first, and only as many as
    // the read asks for.
    use std::collections::BTreeMap;
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    let mut nodes = Vec::new();
    for n in 0..24 {
        nodes.push(fleet.node(&pool, &format!("n{n:02}"), 2, 0).await);
    }
    let mut rng = fastrand::Rng::with_seed(15);
    for step in 0..120 {
        let mut wanted = request(&pool, DeviceClass::Gpu, rng.u32(1..3));
        wanted.start_ms = Some(T0 + rng.i64(1..48) * HOUR);
        wanted.duration_s = 3600 * rng.u64(1..4);
        wanted.wait = false;
        let _ = fleet.reserve(&fleet.owner, &format!("ahead{step}"), wanted).await;
    }
    // The hints follow each commit through the pool's writer: once it has written them all, they match a recount.
    fleet.app.db().follow_ups_written().await;
    let mut tx = fleet.t.db.begin(bc_eventstore::TxOptions::READ_ONLY).await.expect("begin");
    let free_now: i64 = bc_eventstore::sql::query_scalar("SELECT coalesce(sum(free), 0) FROM node_free")
        .fetch_one(tx.conn())
        .await
        .expect("the summary");
    assert!(free_now < 8, "too many atoms with nothing booked ahead for the test to mean anything: {free_now}");
    let drift: i64 = bc_eventstore::sql::query_scalar(
        "SELECT count(*) FROM ((TABLE node_fit EXCEPT ALL SELECT * FROM node_fit_of(ARRAY(SELECT id FROM nodes)))
                               UNION ALL (SELECT * FROM node_fit_of(ARRAY(SELECT id FROM nodes))
                                          EXCEPT ALL TABLE node_fit)) AS d",
    )
    .fetch_one(tx.conn())
    .await
    .expect("the hint against a recount");
    assert_eq!(drift, 0, "the hint drifted from the atoms' first gaps");
    // Each atom's first booking start (the end of its first gap), by node.
    let firsts: Vec<(String, String, Option<i64>)> = bc_eventstore::sql::query_as(
        "SELECT d.node_id, d.id, (SELECT min(ts_ms(lower(b.during))) FROM device_bookings AS b WHERE b.device_id = d.id)
         FROM devices AS d WHERE d.pool_id = $1",
    )
    .bind(pool.as_str())
    .fetch_all(tx.conn())
    .await
    .expect("the first bookings");
    let mut used_hint = 0;
    for hours in [1, 2, 4, 8, 16, 30] {
        let end = T0 + hours * HOUR;
        for per_node in [1usize, 2] {
            let rows = exact_read(&mut tx, &pool, "{}", (T0, end), per_node as i32).await;
            // How long each node can hold `per_node` atoms from now: the per_node-th latest first booking start.
            let mut holds: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
            for (node, _, first) in &firsts {
                holds.entry(node.as_str()).or_default().push(first.unwrap_or(i64::MAX));
            }
            let until: BTreeMap<&str, i64> = holds
                .into_iter()
                .map(|(node, mut ends)| {
                    ends.sort_unstable_by(|a, b| b.cmp(a));
                    (node, ends.get(per_node - 1).copied().unwrap_or(i64::MIN))
                })
                .collect();
            let fitting: Vec<&str> = until.iter().filter(|(_, u)| **u >= end).map(|(n, _)| *n).collect();
            for (node, atoms) in &rows {
                assert!(atoms.len() >= per_node, "{node} offers {atoms:?} for {per_node} per node");
                for atom in atoms {
                    let first = firsts.iter().find(|(_, id, _)| id == atom).expect("a device").2;
                    assert!(first.is_none_or(|first| first >= end), "{atom} is booked before {end}");
                }
            }
            let found: Vec<&str> = rows.iter().map(|(node, _)| node.as_str()).collect();
            if fitting.len() >= 16 {
                used_hint += 1;
                assert_eq!(found.len(), 16, "{hours} h, {per_node} per node: the first quarter of the limit");
                let last = until[found[15]];
                assert!(
                    found.windows(2).all(|w| until[w[0]] <= until[w[1]]),
                    "{hours} h, {per_node} per node: not tightest first: {found:?}"
                );
                assert!(
                    fitting.iter().filter(|n| !found.contains(n)).all(|n| until[n] >= last),
                    "{hours} h, {per_node} per node: a tighter fit was passed over"
                );
            } else {
                let mut found = found.clone();
                found.sort_unstable();
                assert_eq!(found, fitting, "{hours} h, {per_node} per node: every fitting node");
            }
        }
    }
    assert!(used_hint >= 2, "the hint answered too few of the questions: {used_hint}");
    tx.commit().await.expect("commit");
}

#[tokio::test]
async fn a_selector_is_answered_from_the_hint_and_the_gaps_sample_like_a_request_without_one() {
    // 48 nodes of 2 GPUs, 96 atoms: more than the gaps' sample holds for one atom a node (64, the read's limit).
    // 44 nodes have GPUs with more memory. A selector on that memory is answered as a request without one is: by the
    // hint while nothing is booked, then, once every atom has a booking before the window, from the gaps' sample.
    // Only matching atoms, and no more nodes than the hint's quarter of the limit or the sample holds. A selector
    // that too few of those match reads every free atom; one that nothing matches finds nothing.
    use std::collections::{BTreeMap, BTreeSet};
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    let (mut big, mut small) = (BTreeSet::new(), BTreeSet::new());
    for n in 0..48 {
        let name = format!("n{n:02}");
        let memory = if n % 12 == 5 { 81_559 } else { 95_830 };
        let gpus = (0..2)
            .map(|g| bc_domain::device::GpuInfo {
                memory_mib: memory,
                ..bc_commands::testing::gpu(&format!("{name}-{g}"), 0)
            })
            .collect();
        let node = fleet.node_of(&pool, &name, gpus, &[]).await;
        if memory == 81_559 {
            small.insert(node.to_string())
        } else {
            big.insert(node.to_string())
        };
    }
    assert_eq!((big.len(), small.len()), (44, 4));
    let (start, end) = (T0 + 7 * 24 * HOUR, T0 + 7 * 24 * HOUR + HOUR);
    let read = |memory: i64, per_node: i32| {
        let (db, pool) = (fleet.t.db.clone(), pool.clone());
        async move {
            let selector = serde_json::json!({ "memoryMiB": memory }).to_string();
            let mut tx = db.begin(bc_eventstore::TxOptions::READ_ONLY).await.expect("begin");
            let rows = exact_read(&mut tx, &pool, &selector, (start, end), per_node).await;
            tx.commit().await.expect("commit");
            rows.into_iter().collect::<BTreeMap<String, Vec<String>>>()
        }
    };
    let nodes = |found: &BTreeMap<String, Vec<String>>| found.keys().cloned().collect::<BTreeSet<_>>();
    // Nothing booked: the hint names 16 nodes (a quarter of the limit), every one with the larger GPUs.
    for per_node in [1, 2] {
        let found = read(95_830, per_node).await;
        assert_eq!(found.len(), 16, "{per_node} a node from the hint");
        assert!(nodes(&found).is_subset(&big), "only nodes whose GPUs match: {found:?}");
        assert!(found.values().all(|atoms| atoms.len() == 2), "each node's matching free atoms: {found:?}");
    }
    // The hint names at most 4 nodes with the smaller GPUs, too few: the gaps' sample (cut short, and holding at
    // most those 4), then a sample twice as large, which holds every free atom.
    assert_eq!(nodes(&read(81_559, 1).await), small, "every node with the smaller GPUs");
    // A minute booked on every atom an hour from now: no node can hold anything from now to the window's end, so
    // the hint names none and the gaps' sample answers.
    for n in 0..48 {
        let mut minute = request(&pool, DeviceClass::Gpu, 2);
        minute.start_ms = Some(T0 + HOUR);
        minute.duration_s = 60;
        fleet.reserve(&fleet.owner, &format!("minute-{n}"), minute).await.expect("a minute");
    }
    fleet.app.db().follow_ups_written().await;
    // One atom a node: the sample holds 32 of the nodes, at least 28 of them with the larger GPUs, and names them
    // all (not the hint's 16, nor the full read's 44).
    let found = read(95_830, 1).await;
    assert!((28..=32).contains(&found.len()), "answered from the sample: {} nodes", found.len());
    assert!(nodes(&found).is_subset(&big), "only nodes whose GPUs match: {found:?}");
    assert!(found.values().all(|atoms| atoms.len() == 2), "each node's matching free atoms: {found:?}");
    // Two atoms a node: the sample holds every free atom, so every matching node.
    assert_eq!(nodes(&read(95_830, 2).await), big, "two atoms a node");
    assert_eq!(nodes(&read(81_559, 1).await), small, "every node with the smaller GPUs");
    assert!(read(1, 1).await.is_empty(), "nothing matches");
}

#[tokio::test]
async fn a_selector_no_sample_holds_enough_of_reads_every_free_atom() {
    // 130 nodes of 2 GPUs with nothing booked: 260 free atoms, more than the largest one-atom sample reads (256, in the
    // nodes' order). The last two nodes registered have GPUs with less memory. A selector on that memory finds neither
    // among the hint's first 64 nodes nor in any sample, so only the read of every free atom names them.
    use std::collections::BTreeSet;
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    let (mut all, mut small) = (BTreeSet::new(), BTreeSet::new());
    for n in 0..130 {
        let name = format!("n{n:03}");
        let memory = if n >= 128 { 81_559 } else { 95_830 };
        let gpus = (0..2)
            .map(|g| bc_domain::device::GpuInfo {
                memory_mib: memory,
                ..bc_commands::testing::gpu(&format!("{name}-{g}"), 0)
            })
            .collect();
        let node = fleet.node_of(&pool, &name, gpus, &[]).await.to_string();
        all.insert(node.clone());
        if memory == 81_559 {
            small.insert(node);
        }
    }
    assert!(all.iter().rev().take(2).eq(small.iter().rev()), "the smaller GPUs' nodes come last in the nodes' order");
    let selector = serde_json::json!({ "memoryMiB": 81_559 }).to_string();
    let mut tx = fleet.t.db.begin(bc_eventstore::TxOptions::READ_ONLY).await.expect("begin");
    let found = exact_read(&mut tx, &pool, &selector, (T0 + 7 * 24 * HOUR, T0 + 7 * 24 * HOUR + HOUR), 1).await;
    tx.commit().await.expect("commit");
    assert_eq!(found.iter().map(|(node, _)| node.clone()).collect::<BTreeSet<_>>(), small, "both, from every atom");
    assert!(found.iter().all(|(_, atoms)| atoms.len() == 2), "each with both atoms: {found:?}");
}

#[tokio::test]
async fn the_exact_read_stops_at_the_nodes_a_reserve_draws_from_and_the_reserve_places_on_one() {
    // 40 nodes of 2 GPUs, each booked whole for a minute an hour from now and again after a week-ahead window. Six
    // nodes are booked again within the day after the window (for three days), the rest two days after it, so every
    // one of these bookings overlaps every other and each lands on a node of its own. The first round of the gaps'
    // sample (the gaps that end within a day of the window) names the six. A reserve of one node on its first try asks
    // for six (twice its node and four more), so their answer stands; asked for seven, or for a quarter of the limit
    // (16), the read goes on and names all 40. Best fit then ties, and placement draws among the tied nodes by a hash
    // of the reservation's id: a reserve that read past the first round would land outside the six 34 times in 40,
    // and its explanation would say the exact read offered 40 nodes.
    use std::collections::BTreeSet;
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    for n in 0..40 {
        fleet.node(&pool, &format!("n{n:02}"), 2, 0).await;
    }
    let (start, end) = (T0 + 7 * 24 * HOUR, T0 + 7 * 24 * HOUR + HOUR);
    let mut soon = BTreeSet::new();
    for n in 0..40 {
        two_gpus_at(&fleet, &pool, &format!("minute-{n}"), T0 + HOUR, 60).await;
        let (at, seconds) =
            if n < 6 { (end + (n + 1) * MINUTE, 3 * 24 * 3600) } else { (end + 48 * HOUR + n * MINUTE, 3600) };
        let later = two_gpus_at(&fleet, &pool, &format!("after-{n}"), at, seconds).await;
        assert_eq!(later.allocations.len(), 1, "placed");
        if n < 6 {
            soon.insert(later.allocations[0].node_id.to_string());
        }
    }
    assert_eq!(soon.len(), 6, "six nodes of their own");
    fleet.app.db().follow_ups_written().await;

    let mut tx = fleet.t.db.begin(bc_eventstore::TxOptions::READ_ONLY).await.expect("begin");
    let nodes = |found: Vec<(String, Vec<String>)>| found.into_iter().map(|(node, _)| node).collect::<BTreeSet<_>>();
    assert_eq!(nodes(exact_read_settled_by(&mut tx, &pool, "{}", (start, end), 2, 6).await), soon, "six settle it");
    assert_eq!(exact_read_settled_by(&mut tx, &pool, "{}", (start, end), 2, 7).await.len(), 40, "six of seven go on");
    assert_eq!(exact_read(&mut tx, &pool, "{}", (start, end), 2).await.len(), 40, "a quarter of the limit");
    tx.commit().await.expect("commit");

    let mut wanted = request(&pool, DeviceClass::Gpu, 2);
    wanted.start_ms = Some(start);
    wanted.duration_s = 3600;
    let placed = fleet.reserve(&fleet.owner, "in-the-window", wanted).await.expect("reserve");
    let node = placed.reservation.allocations[0].node_id.to_string();
    assert!(soon.contains(&node), "placed on {node}, not one of the six {soon:?}");
    let (explanation, _) = fleet.app.explanation(&fleet.owner, &placed.reservation.id, None).await.expect("explained");
    use bc_domain::reservation::explanation::{Tier, TierLook};
    assert_eq!(
        explanation.tiers.last(),
        Some(&TierLook { tier: Tier::Exact, candidates: 6, fits: true }),
        "the exact read offered the six: {:?}",
        explanation.tiers
    );
}

#[tokio::test]
async fn a_window_between_bookings_is_answered_from_the_gaps_that_end_soonest_after_it() {
    // 48 nodes of 2 GPUs, 96 atoms: more than the gaps' sample holds for one atom a node (64). Every node is booked
    // whole for a minute an hour from now, and again from a minute of its own after the window, so the window lies in a
    // gap bounded on both sides on every atom. The sample reads those gaps by where they end: it names the 32 nodes
    // whose next booking comes soonest after the window, each with both atoms (they share one gap). Read in any other
    // order, the sample names other nodes, or, with a node's atoms scattered over it, too few, and reads everything.
    // Then random bookings: whatever a read names is free, and a short answer is the whole answer.
    use std::collections::{BTreeMap, BTreeSet};
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    for n in 0..48 {
        fleet.node(&pool, &format!("n{n:02}"), 2, 0).await;
    }
    let (start, end) = (T0 + 7 * 24 * HOUR, T0 + 7 * 24 * HOUR + HOUR);
    for n in 0..48 {
        two_gpus_at(&fleet, &pool, &format!("minute-{n}"), T0 + HOUR, 60).await;
        two_gpus_at(&fleet, &pool, &format!("after-{n}"), end + (48 - n) * MINUTE, 3600).await;
    }
    fleet.app.db().follow_ups_written().await;

    let mut tx = fleet.t.db.begin(bc_eventstore::TxOptions::READ_ONLY).await.expect("begin");
    let mut next: BTreeMap<String, i64> = BTreeMap::new();
    for (node, _, from, _) in pool_bookings(&mut tx, &pool).await {
        if from >= end {
            let at = next.entry(node).or_insert(from);
            *at = (*at).min(from);
        }
    }
    assert_eq!(next.len(), 48, "every node booked after the window");
    let mut soonest: Vec<(i64, String)> = next.into_iter().map(|(node, at)| (at, node)).collect();
    soonest.sort();
    let tightest: BTreeSet<String> = soonest.iter().take(32).map(|(_, node)| node.clone()).collect();
    let found: BTreeMap<String, Vec<String>> =
        exact_read(&mut tx, &pool, "{}", (start, end), 1).await.into_iter().collect();
    assert_eq!(found.keys().cloned().collect::<BTreeSet<_>>(), tightest, "the 32 tightest fits");
    assert!(found.values().all(|atoms| atoms.len() == 2), "both atoms of each node: {found:?}");
    // Two atoms a node: the sample of 128 holds every free atom, so it names every node.
    assert_eq!(exact_read(&mut tx, &pool, "{}", (start, end), 2).await.len(), 48, "two atoms a node");
    tx.commit().await.expect("commit");

    let mut rng = fastrand::Rng::with_seed(32);
    for step in 0..250 {
        let mut wanted = request(&pool, DeviceClass::Gpu, rng.u32(1..3));
        wanted.start_ms = Some(T0 + 2 * HOUR + rng.i64(0..24) * HOUR / 2);
        wanted.duration_s = 1800 * rng.u64(1..9);
        wanted.wait = false;
        let _ = fleet.reserve(&fleet.owner, &format!("random-{step}"), wanted).await;
    }
    fleet.app.db().follow_ups_written().await;
    let mut tx = fleet.t.db.begin(bc_eventstore::TxOptions::READ_ONLY).await.expect("begin");
    let bookings = pool_bookings(&mut tx, &pool).await;
    let devices = pool_gpus(&mut tx, &pool).await;
    let (mut sampled, mut whole) = (0, 0);
    for round in 0..60 {
        let start = T0 + 2 * HOUR + rng.i64(0..56) * HOUR / 4;
        let end = start + rng.i64(1..12) * HOUR / 4;
        let mut free: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (node, device) in &devices {
            if !bookings.iter().any(|(_, d, from, until)| d == device && *from < end && *until > start) {
                free.entry(node.clone()).or_default().insert(device.clone());
            }
        }
        for per_node in [1, 2] {
            let mut wanted = free.clone();
            wanted.retain(|_, atoms| atoms.len() >= per_node as usize);
            let found = exact_read(&mut tx, &pool, "{}", (start, end), per_node).await;
            for (node, atoms) in &found {
                let free_here = wanted.get(node).unwrap_or_else(|| panic!("round {round}: {node} cannot hold it"));
                assert!(atoms.len() >= per_node as usize, "round {round}: {node} named with {atoms:?}");
                assert!(atoms.iter().all(|atom| free_here.contains(atom)), "round {round}: {atoms:?} not all free");
            }
            if found.len() < 16 {
                let named: BTreeSet<String> = found.iter().map(|(node, _)| node.clone()).collect();
                assert_eq!(named, wanted.keys().cloned().collect(), "round {round}: a short answer is every node");
                whole += 1;
            } else {
                sampled += 1;
            }
        }
    }
    tx.commit().await.expect("commit");
    assert!(sampled > 10 && whole > 10, "windows of both kinds: {sampled} sampled, {whole} whole");
}

#[tokio::test]
async fn a_reserve_is_two_round_trips_three_after_a_lost_race_and_a_cancel_two() {
    use bc_eventstore::Db;
    use bc_eventstore::testing::{RoundTrips, test_db_config};
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    for name in ["a", "b", "c"] {
        fleet.node(&pool, name, 8, 0).await;
    }
    fleet.offer(&pool, "acme", 16).await;
    let trips = RoundTrips::start(fleet.t.connect_options());
    let app = bc_commands::App::new(Db::connect_lazy_with(trips.connect_options(), &test_db_config()));
    let acme = caller("acme", "alice@acme");
    // The hints follow each commit in a write of the pool's writer of follow-ups, off the command's path (one write
    // carries many commits' changes under load): counted apart from the command's own round trips.
    let own_trips = || async {
        let before = app.db().follow_up_figures().writes;
        app.db().follow_ups_written().await;
        let hint_writes = app.db().follow_up_figures().writes - before;
        assert!(hint_writes <= 1, "one command's hints took {hint_writes} writes");
        trips.take() - hint_writes
    };
    // A quota-limited tenant's reserve takes every step: the quota row, the summary, the atom lock, the sweep. With
    // no race for atoms lost lately, the lock of its chosen atoms, its events, their inline writes, its wakes and
    // COMMIT go in its last message.
    for (key, count) in [("k1", 8), ("k2", 4)] {
        own_trips().await;
        let reserved = app
            .reserve(
                &acme,
                bc_commands::reservations::Reserve {
                    idempotency_key: key.into(),
                    request: request(&pool, DeviceClass::Gpu, count),
                },
            )
            .await
            .expect("reserve")
            .value;
        let reserve_trips = own_trips().await;
        assert_eq!(reserved.reservation.state, ReservationState::Placed);
        assert_eq!(reserve_trips, 2, "facts, and the atoms' lock with the events and COMMIT");

        app.cancel_reservation(&acme, &reserved.reservation.id, None).await.expect("cancel");
        let cancel_trips = own_trips().await;
        assert_eq!(cancel_trips, 2, "facts, and the events with COMMIT");
    }
    // A retry of a recorded request reads and answers: BEGIN with the facts, and COMMIT.
    app.reserve(
        &acme,
        bc_commands::reservations::Reserve {
            idempotency_key: "k1".into(),
            request: request(&pool, DeviceClass::Gpu, 8),
        },
    )
    .await
    .expect("retry");
    assert!(own_trips().await <= 2);

    // A node with one atom left is the best fit for one GPU; another command holds its atoms and has not committed.
    let reserve = |key: &'static str| {
        let (app, acme, request) = (app.clone(), acme.clone(), request(&pool, DeviceClass::Gpu, 7));
        async move {
            let input = bc_commands::reservations::Reserve { idempotency_key: key.into(), request };
            app.reserve(&acme, input).await.expect("reserve").value.reservation
        }
    };
    let half = reserve("k3").await;
    let tight = half.allocations[0].node_id.clone();
    let mut holder = fleet.t.db.begin(bc_eventstore::TxOptions::READ_COMMITTED).await.expect("begin");
    bc_eventstore::sql::query("SELECT id FROM devices WHERE node_id = $1 ORDER BY id FOR UPDATE")
        .bind(tight.as_str())
        .fetch_all(holder.conn())
        .await
        .expect("hold the node's atoms");
    own_trips().await;
    let one = |key: &'static str| {
        let (app, acme, request) = (app.clone(), acme.clone(), request(&pool, DeviceClass::Gpu, 1));
        async move {
            let input = bc_commands::reservations::Reserve { idempotency_key: key.into(), request };
            app.reserve(&acme, input).await.expect("reserve").value.reservation
        }
    };
    let raced = one("k4").await;
    assert_ne!(raced.allocations[0].node_id, tight, "the lost race planned again around the held atoms");
    assert_eq!(
        own_trips().await,
        7,
        "facts, the refused lock with the events, ROLLBACK; then facts, the lock first (which skips the held atom), \
         the lock of the next fit, and the events with COMMIT"
    );
    holder.rollback().await;
    // Having lost a race lately, the next first tries lock first.
    let next = one("k5").await;
    assert_eq!(next.state, ReservationState::Placed);
    assert_eq!(own_trips().await, 3, "facts, the atoms' lock, and the events with COMMIT");
}

#[tokio::test]
async fn a_reserve_in_flight_holds_a_claim_not_the_tenant_s_quota_row() {
    use bc_eventstore::{TxOptions, sql};
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    let node = fleet.node(&pool, "a", 2, 0).await;
    fleet.offer(&pool, "acme", 2).await;
    let acme = caller("acme", "alice@acme");
    // acme's first reserve makes its quota row.
    let first = fleet.reserve(&acme, "first", request(&pool, DeviceClass::Gpu, 1)).await.expect("first").reservation;
    fleet.app.cancel_reservation(&acme, &first.id, None).await.expect("cancel");

    // Another command holds every atom, so the next reserve waits at its atom lock, inside its transaction.
    let mut holder = fleet.t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    let held: Vec<String> = sql::query_scalar("SELECT id FROM devices WHERE node_id = $1 ORDER BY id FOR UPDATE")
        .bind(node.as_str())
        .fetch_all(holder.conn())
        .await
        .expect("lock the atoms");
    assert_eq!(held.len(), 2);
    let waiting = {
        let (app, acme, req) = (fleet.app.clone(), acme.clone(), request(&pool, DeviceClass::Gpu, 2));
        tokio::spawn(async move {
            app.reserve(&acme, bc_commands::reservations::Reserve { idempotency_key: "second".into(), request: req })
                .await
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut looked = loop {
        assert!(std::time::Instant::now() < deadline, "the reserve never waited at its atom lock with a claim");
        // A transaction of its own each time: one reads the activity of other sessions once and keeps it.
        let mut looked = fleet.t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
        let claims: i64 = sql::query_scalar("SELECT count(*) FROM quota_claims WHERE tenant_id = 'acme'")
            .fetch_one(looked.conn())
            .await
            .expect("claims");
        let waits: i64 = sql::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%lock_chosen(%'",
        )
        .fetch_one(looked.conn())
        .await
        .expect("waits");
        if claims == 1 && waits == 1 {
            break looked;
        }
        looked.rollback().await;
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    // The reserve in flight holds its claim, committed, and not the quota row: another of acme's commands may take it.
    let row: Option<i64> = sql::query_scalar(
        "SELECT checks FROM quota_usage WHERE tenant_id = 'acme' AND pool_id = $1 AND resource = 'gpu' FOR UPDATE NOWAIT",
    )
    .bind(pool.as_str())
    .fetch_optional(looked.conn())
    .await
    .expect("the quota row is free while acme's reserve is in flight");
    assert!(row.is_some(), "acme's quota row exists");
    looked.rollback().await;
    holder.rollback().await;

    let placed = waiting.await.expect("task").expect("reserve").value.reservation;
    assert_eq!(placed.state, ReservationState::Placed);
    let mut tx = fleet.t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    let left: i64 = sql::query_scalar("SELECT count(*) FROM quota_claims").fetch_one(tx.conn()).await.expect("count");
    assert_eq!(left, 0, "the claim went with the bookings");
}

#[tokio::test]
async fn another_reserve_s_claim_counts_against_the_quota_until_it_is_dropped_or_swept() {
    use bc_eventstore::{TxOptions, sql};
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    fleet.node(&pool, "a", 8, 0).await;
    fleet.offer(&pool, "acme", 2).await;
    let acme = caller("acme", "alice@acme");
    // A reserve of acme's for both atoms of its quota is in flight: its claim is committed, its bookings not yet.
    let mut tx = fleet.t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    sql::query(
        "INSERT INTO quota_claims (reservation_id, tenant_id, pool_id, resource, count, start_ms, end_ms, claimed_at)
         VALUES ('res_inflight', 'acme', $1, 'gpu', 2, $2, $3, compute_db_clock())",
    )
    .bind(pool.as_str())
    .bind(T0)
    .bind(T0 + 2 * HOUR)
    .execute(tx.conn())
    .await
    .expect("claim");
    tx.commit().await.expect("commit");

    let blocked = fleet.reserve(&acme, "blocked", request(&pool, DeviceClass::Gpu, 1)).await.expect("waits");
    assert_eq!(blocked.reservation.state, ReservationState::Pending, "the claim holds the quota");
    // Outside the claim's window the quota is free.
    let mut after = request(&pool, DeviceClass::Gpu, 2);
    after.start_ms = Some(T0 + 2 * HOUR);
    let placed = fleet.reserve(&acme, "after", after).await.expect("after").reservation;
    assert_eq!(placed.state, ReservationState::Placed);

    // A claim older than a minute (its command died) is swept by the next claim.
    let mut tx = fleet.t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    sql::query("UPDATE quota_claims SET claimed_at = compute_db_clock() - interval '2 minutes'")
        .execute(tx.conn())
        .await
        .expect("age the claim");
    tx.commit().await.expect("commit");
    let next = fleet.reserve(&acme, "next", request(&pool, DeviceClass::Gpu, 1)).await.expect("next").reservation;
    assert_eq!(next.state, ReservationState::Placed, "the stale claim no longer counts");
    let mut tx = fleet.t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    let left: i64 = sql::query_scalar("SELECT count(*) FROM quota_claims").fetch_one(tx.conn()).await.expect("count");
    assert_eq!(left, 0, "swept, and every reserve dropped its own");
}

#[tokio::test]
async fn the_hints_walk_recounts_the_fit_and_corrects_a_free_count_seen_wrong_twice_without_a_change_between() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    let nodes =
        [fleet.node(&pool, "a", 4, 0).await, fleet.node(&pool, "b", 4, 0).await, fleet.node(&pool, "c", 4, 0).await];
    let mut ahead = request(&pool, DeviceClass::Gpu, 2);
    ahead.start_ms = Some(T0 + 2 * HOUR);
    fleet.reserve(&fleet.owner, "now", request(&pool, DeviceClass::Gpu, 3)).await.expect("now");
    fleet.reserve(&fleet.owner, "ahead", ahead).await.expect("ahead");
    fleet.app.db().follow_ups_written().await;
    let hints = "SELECT (SELECT string_agg(concat_ws(' ', node_id, class, pool_id, atoms, free), ', '
                                        ORDER BY node_id, class) FROM node_free),
                        (SELECT string_agg(concat_ws(' ', node_id, class, k, pool_id, until), ', '
                                           ORDER BY node_id, class, k) FROM node_fit)";
    let read = || async {
        let mut tx = fleet.t.db.begin(bc_eventstore::TxOptions::READ_ONLY).await.expect("begin");
        let found: (Option<String>, Option<String>) =
            bc_eventstore::sql::query_as(hints).fetch_one(tx.conn()).await.expect("the hints");
        tx.commit().await.expect("commit");
        found
    };
    let right = read().await;
    assert!(right.0.is_some() && right.1.is_some(), "{right:?}");
    // Hints that lost a change: free counts off and a node's fit gone.
    let mut tx = fleet.t.db.begin(bc_eventstore::TxOptions::READ_COMMITTED).await.expect("begin");
    bc_eventstore::sql::query("UPDATE node_free SET free = 0 WHERE node_id = $1")
        .bind(nodes[1].as_str())
        .execute(tx.conn())
        .await
        .expect("break the free counts");
    bc_eventstore::sql::query("DELETE FROM node_fit WHERE node_id = $1")
        .bind(nodes[2].as_str())
        .execute(tx.conn())
        .await
        .expect("break the fit");
    tx.commit().await.expect("commit");
    assert_ne!(read().await, right);
    // The walk, two nodes at a time: a full step, then the rest. The fit is recounted at once; the free count
    // is only reported, since a commit's change may be on its way to it.
    let mut ids: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
    ids.sort();
    let first = fleet.app.walk_free_capacity(None, 2, &[]).await.expect("first step");
    assert_eq!(first.last.as_deref(), Some(ids[1].as_str()));
    let second = fleet.app.walk_free_capacity(first.last.as_deref(), 2, &[]).await.expect("second step");
    assert_eq!(second.last, None, "past the last node");
    let found: Vec<_> = first.disagreeing.iter().chain(&second.disagreeing).cloned().collect();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!((found[0].node_id.as_str(), found[0].held), (nodes[1].as_str(), 0));
    assert_eq!(first.corrected + second.corrected, 0);
    let (free_wrong, fit_right) = read().await;
    assert_ne!(free_wrong, right.0);
    assert_eq!(fit_right, right.1, "the fit recounted");
    // The next walk finds it the same way, with no booking change between: corrected.
    let again = fleet.app.walk_free_capacity(None, 3, &found).await.expect("the next walk");
    assert_eq!((again.corrected, again.disagreeing.len()), (1, 0));
    assert_eq!(read().await, right, "every hint recounted");
    // A count seen wrong once, then a booking change on its node: not corrected from the stale sighting.
    let mut tx = fleet.t.db.begin(bc_eventstore::TxOptions::READ_COMMITTED).await.expect("begin");
    bc_eventstore::sql::query("UPDATE node_free SET free = 0 WHERE node_id = $1")
        .bind(nodes[0].as_str())
        .execute(tx.conn())
        .await
        .expect("break the free counts");
    tx.commit().await.expect("commit");
    let seen = fleet.app.walk_free_capacity(None, 3, &[]).await.expect("seen").disagreeing;
    assert_eq!(seen.len(), 1, "{seen:?}");
    let mut tx = fleet.t.db.begin(bc_eventstore::TxOptions::READ_COMMITTED).await.expect("begin");
    bc_eventstore::sql::query("UPDATE devices SET booking_changes = booking_changes + 1 WHERE node_id = $1")
        .bind(nodes[0].as_str())
        .execute(tx.conn())
        .await
        .expect("a booking change");
    tx.commit().await.expect("commit");
    let after_change = fleet.app.walk_free_capacity(None, 3, &seen).await.expect("after a change");
    assert_eq!(after_change.corrected, 0);
    assert_eq!(after_change.disagreeing.len(), 1, "seen again, to be corrected by the walk after");
}

#[tokio::test]
async fn a_write_of_the_hints_merging_several_commits_sums_their_changes_to_one_node() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    let (a, b) = (fleet.node(&pool, "a", 4, 0).await, fleet.node(&pool, "b", 4, 0).await);
    // What the writer of follow-ups sends for four commits: three changes to a, one to b, in one array.
    let deltas = format!(
        r#"[["{a}", "gpu", -1], ["{b}", "gpu", -1], ["{a}", "gpu", -1], ["{a}", "gpu", -1], ["{a}", "gpu", 1]]"#
    );
    let mut tx = fleet.t.db.begin(bc_eventstore::TxOptions::READ_COMMITTED).await.expect("begin");
    bc_eventstore::sql::query("SELECT adjust_free($1::jsonb)").bind(&deltas).execute(tx.conn()).await.expect("adjust");
    tx.commit().await.expect("commit");
    assert_eq!(fleet.free_capacity(&a).await.0, (4, 2), "every change to a counted");
    assert_eq!(fleet.free_capacity(&b).await.0, (4, 3));
}

#[tokio::test]
async fn a_running_worker_walks_the_hints_and_corrects_a_free_count_that_lost_a_change() {
    use bc_commands::worker::{Worker, WorkerConfig};
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    let mut nodes = Vec::new();
    for n in 0..5 {
        nodes.push(fleet.node(&pool, &format!("n{n}"), 2, 0).await);
    }
    fleet.reserve(&fleet.owner, "now", request(&pool, DeviceClass::Gpu, 2)).await.expect("now");
    fleet.app.db().follow_ups_written().await;
    let free = |node: &bc_domain::id::NodeId| {
        let (db, node) = (fleet.t.db.clone(), node.to_string());
        async move {
            let mut tx = db.begin(bc_eventstore::TxOptions::READ_ONLY).await.expect("begin");
            let free: i32 = bc_eventstore::sql::query_scalar("SELECT free FROM node_free WHERE node_id = $1")
                .bind(&node)
                .fetch_one(tx.conn())
                .await
                .expect("free");
            tx.commit().await.expect("commit");
            free
        }
    };
    let mut right = Vec::new();
    for node in &nodes {
        right.push(free(node).await);
    }
    // Two nodes' counts lose a change each.
    let mut tx = fleet.t.db.begin(bc_eventstore::TxOptions::READ_COMMITTED).await.expect("begin");
    bc_eventstore::sql::query("UPDATE node_free SET free = 1 WHERE node_id = ANY($1)")
        .bind(vec![nodes[1].to_string(), nodes[4].to_string()])
        .execute(tx.conn())
        .await
        .expect("break two counts");
    tx.commit().await.expect("commit");
    // A walk of two nodes every 20 ms: each count is seen twice within a few walks and corrected.
    let config = WorkerConfig {
        idle_poll: std::time::Duration::from_millis(10),
        hint_recount: std::time::Duration::from_millis(20),
        hint_recount_nodes: 2,
        ..WorkerConfig::default()
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(Worker::new(fleet.app.clone(), config).run(stopped));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let mut now = Vec::new();
        for node in &nodes {
            now.push(free(node).await);
        }
        if now == right {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never corrected: {now:?}, wanted {right:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    stop.send(true).expect("stop");
    running.await.expect("the worker");
}

/// Inserts a booking of `device` for [from, to) in ms, straight into the table, and answers the SQLSTATE it failed
/// with (`None` when it was written).
async fn book_directly(fleet: &Fleet, reservation: &str, device: &str, from: i64, to: i64) -> Option<String> {
    let mut tx = fleet.t.db.begin(bc_eventstore::TxOptions::READ_COMMITTED).await.expect("begin");
    let written = bc_eventstore::sql::query(
        "INSERT INTO device_bookings (device_id, allocation_id, reservation_id, tenant_id, pool_id, resource, during)
         VALUES ($1, 'alloc_direct_' || $2 || '_' || $3, $4, 'acme', 'pool_direct', 'gpu', tstzrange(ms_ts($2), ms_ts($3)))",
    )
    .bind(device)
    .bind(from)
    .bind(to)
    .bind(reservation)
    .execute(tx.conn())
    .await;
    match written {
        Ok(_) => {
            tx.commit().await.expect("commit");
            None
        }
        Err(e) => Some(bc_eventstore::sql_state(&e).expect("a database error").into_owned()),
    }
}

/// The number `atom_numbers` gives `device`, if any.
async fn atom_number(fleet: &Fleet, device: &str) -> Option<i64> {
    let mut tx = fleet.t.db.begin(bc_eventstore::TxOptions::READ_COMMITTED).await.expect("begin");
    let n = bc_eventstore::sql::query_scalar("SELECT atom FROM atom_numbers WHERE device_id = $1")
        .bind(device)
        .fetch_optional(tx.conn())
        .await
        .expect("read the number");
    tx.commit().await.expect("commit");
    n
}

#[tokio::test]
async fn two_bookings_of_one_atom_never_overlap_even_after_its_device_was_removed_and_reported_again() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    let node = fleet.node(&pool, "a", 1, 0).await;
    let placed = fleet.reserve(&fleet.owner, "k1", request(&pool, DeviceClass::Gpu, 1)).await.expect("reserve");
    let (device, start, end) = fleet.bookings(placed.reservation.id.as_str()).await.remove(0);
    assert_eq!((start, end), (T0, T0 + HOUR));
    // Another booking of the same atom overlapping the reservation's window is refused by the constraint; one
    // right after it is not.
    assert_eq!(book_directly(&fleet, "rsv_x", &device, T0 + HOUR / 2, T0 + 2 * HOUR).await.as_deref(), Some("23P01"));
    assert_eq!(book_directly(&fleet, "rsv_x", &device, T0 + HOUR, T0 + 2 * HOUR).await, None);
    // The device leaves its node and comes back (the same id reported again): it keeps its number, so the
    // bookings made before still exclude the new ones.
    let before = atom_number(&fleet, &device).await.expect("numbered when it was inserted");
    let mut tx = fleet.t.db.begin(bc_eventstore::TxOptions::READ_COMMITTED).await.expect("begin");
    let row: (String, String, String, String) =
        bc_eventstore::sql::query_as("DELETE FROM devices WHERE id = $1 RETURNING node_id, pool_id, class, gpu_model")
            .bind(&device)
            .fetch_one(tx.conn())
            .await
            .expect("remove the device");
    bc_eventstore::sql::query(
        "INSERT INTO devices (id, node_id, pool_id, class, bookable, gpu_model, gpu_product)
         VALUES ($1, $2, $3, $4, true, $5, $5)",
    )
    .bind(&device)
    .bind(&row.0)
    .bind(&row.1)
    .bind(&row.2)
    .bind(&row.3)
    .execute(tx.conn())
    .await
    .expect("report it again");
    tx.commit().await.expect("commit");
    assert_eq!(row.0, node.as_str());
    assert_eq!(atom_number(&fleet, &device).await, Some(before), "the same number");
    assert_eq!(book_directly(&fleet, "rsv_y", &device, T0, T0 + HOUR / 4).await.as_deref(), Some("23P01"));
    assert_eq!(
        book_directly(&fleet, "rsv_y", &device, T0 + 3 * HOUR / 2, T0 + 3 * HOUR).await.as_deref(),
        Some("23P01")
    );
    // A device id nobody numbered yet is numbered by its first booking, and its second overlapping one is refused.
    assert_eq!(atom_number(&fleet, "GPU-never-seen").await, None);
    assert_eq!(book_directly(&fleet, "rsv_z", "GPU-never-seen", T0, T0 + HOUR).await, None);
    let new = atom_number(&fleet, "GPU-never-seen").await.expect("numbered by its booking");
    assert_ne!(new, before);
    assert_eq!(
        book_directly(&fleet, "rsv_z", "GPU-never-seen", T0 + HOUR / 2, T0 + HOUR).await.as_deref(),
        Some("23P01")
    );
    // Moving a booking to another atom renumbers it: it now collides with that atom's bookings.
    let mut tx = fleet.t.db.begin(bc_eventstore::TxOptions::READ_COMMITTED).await.expect("begin");
    let moved = bc_eventstore::sql::query("UPDATE device_bookings SET device_id = $1 WHERE reservation_id = 'rsv_z'")
        .bind(&device)
        .execute(tx.conn())
        .await
        .expect_err("the moved booking overlaps the device's");
    assert_eq!(bc_eventstore::sql_state(&moved).as_deref(), Some("23P01"));
}
