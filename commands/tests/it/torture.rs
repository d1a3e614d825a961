//! The capacity torture test: 16 concurrent clients make 2,000 random reserve, extend, renew, release and cancel
//! calls against exclusive, MIG and time-slice pools and a pool whose reservations also hold vCPUs and memory
//! under an overcommit (with gangs, future and overlapping windows, and quotas near their limits) while the simulated clock moves and two workers run the queue. Afterwards the invariants
//! are checked against the database. The seed is printed; `BC_TORTURE_SEED=<n>` replays a run.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bc_commands::reservations::Reserve;
use bc_commands::worker::{Worker, WorkerConfig};
use bc_commands::{App, Caller, held_cte};
use bc_domain::device::DeviceClass;
use bc_domain::id::{PoolId, ReservationId};
use bc_domain::pool::{PoolPolicy, Sharing};
use bc_domain::reservation::{ReservationRequest, Topology};
use bc_eventstore::{DbConfig, Tx, TxOptions, clock, sql, testing};

use bc_commands::testing::{Fleet, T0, caller, request};

const CLIENTS: usize = 16;
const OPERATIONS: usize = 2_000;
const MINUTE: i64 = 60_000;

/// Outcomes by operation and answer code.
type Tally = Arc<Mutex<BTreeMap<(String, String), u64>>>;

struct Pools {
    exclusive: PoolId,
    mig: PoolId,
    slots: PoolId,
    roomy: PoolId,
    vps: PoolId,
}

struct Client {
    app: App,
    who: Caller,
    is_owner: bool,
    pools: Arc<Pools>,
    now: Arc<AtomicI64>,
    rng: fastrand::Rng,
    tally: Tally,
    unexpected: Arc<Mutex<Vec<String>>>,
    mine: Vec<ReservationId>,
    roomy: Vec<ReservationId>,
    keys: Vec<(String, ReservationRequest)>,
}

impl Client {
    fn note(&self, op: &str, code: &str, detail: impl FnOnce() -> String) {
        *self.tally.lock().expect("tally").entry((op.to_owned(), code.to_owned())).or_default() += 1;
        let allowed: &[&str] = match op {
            // A reservation that fits the pool is placed or left pending; exhausted conflict retries too.
            "reserve" => &["OK"],
            // The roomy pool always has at least twice the in-flight demand free: never CAPACITY_UNAVAILABLE.
            "reserve-roomy" => &["OK"],
            "retry" => &["OK"],
            "reuse" => &["IDEMPOTENCY_KEY_REUSED"],
            // The atoms are free but a node's scalars are not: CAPACITY_UNAVAILABLE.
            "extend" => &["OK", "CONFLICT", "QUOTA_EXCEEDED", "CAPACITY_UNAVAILABLE"],
            _ => &["OK", "CONFLICT"],
        };
        if !allowed.contains(&code) {
            self.unexpected.lock().expect("unexpected").push(format!("{op}: {code}: {}", detail()));
        }
    }

    /// A window starting now, or one to four hours ahead. The simulated clock runs about ten minutes per real
    /// second here, so a start closer than an hour could pass while a contended request retries.
    fn window(&mut self) -> (Option<i64>, u64) {
        let start = if self.rng.bool() {
            None
        } else {
            let now = self.now.load(Ordering::SeqCst);
            Some((now / 1000) * 1000 + self.rng.i64(60..=240) * MINUTE)
        };
        (start, self.rng.u64(10..=120) * 60)
    }

    fn new_request(&mut self) -> (ReservationRequest, bool) {
        let roll = self.rng.u8(0..100);
        let (start_ms, duration_s) = self.window();
        let (mut req, roomy) = if self.is_owner && roll < 20 {
            let mut req = request(&self.pools.roomy, DeviceClass::Gpu, self.rng.u32(1..=2));
            req.wait = false;
            (req, true)
        } else if roll < 50 {
            let mut req = request(&self.pools.exclusive, DeviceClass::Gpu, self.rng.u32(1..=4));
            if self.rng.u8(0..5) == 0 {
                req.devices.count = 4;
                req.devices.topology = Topology::Gang { nodes: 2 };
            }
            (req, false)
        } else if roll < 70 {
            (request(&self.pools.mig, DeviceClass::GpuMig, self.rng.u32(1..=5)), false)
        } else if roll < 85 {
            (request(&self.pools.slots, DeviceClass::GpuSlot, self.rng.u32(1..=4)), false)
        } else {
            let mut req = request(&self.pools.vps, DeviceClass::Gpu, self.rng.u32(1..=2));
            req.resources =
                [("vcpu".to_owned(), self.rng.u64(4..=24)), ("memoryGiB".to_owned(), self.rng.u64(16..=128))].into();
            if self.rng.u8(0..5) == 0 {
                req.devices.count = 2;
                req.devices.topology = Topology::Gang { nodes: 2 };
            }
            (req, false)
        };
        if !roomy {
            req.start_ms = start_ms;
        }
        req.duration_s = duration_s;
        if self.rng.u8(0..4) == 0 {
            req.lease_seconds = Some(self.rng.u64(600..=1800));
        }
        (req, roomy)
    }

    async fn reserve(&mut self, n: usize) {
        let roll = self.rng.u8(0..100);
        if roll < 5 && !self.keys.is_empty() {
            let (key, body) = self.keys[self.rng.usize(0..self.keys.len())].clone();
            let result = self.app.reserve(&self.who, Reserve { idempotency_key: key, request: body }).await;
            let code = match &result {
                Ok(committed) if !committed.value.created => "OK",
                Ok(_) => "CREATED-AGAIN",
                Err(err) => err.code(),
            };
            self.note("retry", code, || format!("{result:?}"));
            return;
        }
        if roll < 7 && !self.keys.is_empty() {
            let (key, mut body) = self.keys[self.rng.usize(0..self.keys.len())].clone();
            body.duration_s += 60;
            let result = self.app.reserve(&self.who, Reserve { idempotency_key: key, request: body }).await;
            self.note("reuse", result.as_ref().map_or_else(|e| e.code(), |_| "OK"), || format!("{result:?}"));
            return;
        }
        if self.roomy.len() >= 2 {
            let oldest = self.roomy.remove(0);
            self.end(&oldest).await;
        }
        let (body, roomy) = self.new_request();
        let key = format!("{}-{n}", self.who.identity);
        let result = self.app.reserve(&self.who, Reserve { idempotency_key: key.clone(), request: body.clone() }).await;
        let op = if roomy { "reserve-roomy" } else { "reserve" };
        match result {
            Ok(committed) => {
                self.note(op, "OK", String::new);
                self.keys.push((key, body));
                let id = committed.value.reservation.id;
                if roomy {
                    self.roomy.push(id.clone());
                }
                self.mine.push(id);
            }
            Err(err) => self.note(op, err.code(), || format!("{body:?}: {err}")),
        }
    }

    /// Cancels before the start, releases after it: whichever applies.
    async fn end(&mut self, id: &ReservationId) {
        let cancelled = self.app.cancel_reservation(&self.who, id, None).await;
        if cancelled.is_err() {
            let released = self.app.release_reservation(&self.who, id).await;
            self.note("end", released.as_ref().map_or_else(|e| e.code(), |_| "OK"), || format!("{released:?}"));
        }
    }

    fn pick(&mut self) -> Option<ReservationId> {
        (!self.mine.is_empty()).then(|| self.mine[self.rng.usize(0..self.mine.len())].clone())
    }

    async fn run(mut self, operations: usize) {
        for n in 0..operations {
            let roll = self.rng.u8(0..100);
            match (roll, self.pick()) {
                (0..45, _) | (_, None) => self.reserve(n).await,
                (45..60, Some(id)) => {
                    let result = self.app.cancel_reservation(&self.who, &id, None).await;
                    self.note("cancel", result.as_ref().map_or_else(|e| e.code(), |_| "OK"), || format!("{result:?}"));
                }
                (60..70, Some(id)) => {
                    let result = self.app.release_reservation(&self.who, &id).await;
                    self.note("release", result.as_ref().map_or_else(|e| e.code(), |_| "OK"), || format!("{result:?}"));
                }
                (70..80, Some(id)) => {
                    let result = self.app.renew_reservation(&self.who, &id).await;
                    self.note("renew", result.as_ref().map_or_else(|e| e.code(), |_| "OK"), || format!("{result:?}"));
                }
                (80..95, Some(id)) => {
                    let current = self.app.reservation(&self.who, &id).await;
                    let Some(end) = current.ok().and_then(|c| c.value.end_ms) else {
                        self.note("extend", "CONFLICT", String::new);
                        continue;
                    };
                    let to = end + self.rng.i64(10..=60) * MINUTE;
                    let result = self.app.extend_reservation(&self.who, &id, to).await;
                    self.note("extend", result.as_ref().map_or_else(|e| e.code(), |_| "OK"), || format!("{result:?}"));
                }
                (_, Some(id)) => {
                    let result = self.app.reservation(&self.who, &id).await;
                    self.note("read", result.as_ref().map_or_else(|e| e.code(), |_| "OK"), || format!("{result:?}"));
                }
            }
        }
    }
}

/// What every reservation held of scalars, ended ones too: each allocation's amounts (its request's) from its start
/// to its end, or to when it ended if that came first, as a CTE named `sheld`.
macro_rules! scalar_held_cte {
    () => {
        "sheld AS (
             SELECT r.id AS reservation_id, a.node_id, r.tenant_id, r.pool_id, e.key AS resource,
                    e.value::bigint AS amount,
                    tstzrange(r.start_at, greatest(r.start_at, least(r.end_at, coalesce(r.ended_at, r.end_at))))
                        AS during
             FROM reservations AS r
             JOIN allocations AS a ON a.reservation_id = r.id
             CROSS JOIN LATERAL jsonb_each_text(r.request -> 'resources') AS e
             WHERE r.start_at IS NOT NULL
         )"
    };
}

/// The most of each scalar `sheld` held at any instant, grouped by the columns named (and the resource).
macro_rules! scalar_peaks {
    ($by:literal) => {
        concat!(
            "SELECT ",
            $by,
            ", resource, max(running) AS peak FROM (
                 SELECT ",
            $by,
            ", resource,
                        sum(delta) OVER (PARTITION BY ",
            $by,
            ", resource ORDER BY at, delta
                                         ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS running
                 FROM (SELECT ",
            $by,
            ", resource, lower(during) AS at, amount AS delta FROM sheld
                       WHERE NOT isempty(during)
                       UNION ALL
                       SELECT ",
            $by,
            ", resource, upper(during), -amount FROM sheld
                       WHERE NOT isempty(during)) AS steps) AS sweep
             GROUP BY ",
            $by,
            ", resource"
        )
    };
}

async fn scalar(tx: &mut Tx, query: &'static str) -> i64 {
    sql::query_scalar(query).fetch_one(tx.conn()).await.unwrap_or_else(|err| panic!("{query}: {err}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn capacity_torture_keeps_every_invariant() {
    let seed: u64 =
        std::env::var("BC_TORTURE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| fastrand::u64(..));
    println!("capacity torture seed: {seed} (replay with BC_TORTURE_SEED={seed})");
    eprintln!("capacity torture seed: {seed}");

    let fleet = Fleet::new().await;
    let exclusive = fleet.pool("exclusive", Sharing::Exclusive, None).await;
    let mig = fleet.pool("mig", Sharing::Mig, None).await;
    let slots = fleet.pool("slots", Sharing::Timeslice, Some(4)).await;
    let roomy = fleet.pool("roomy", Sharing::Exclusive, None).await;
    let overcommit = [("vcpu".to_owned(), 2.0)].into();
    let vps = fleet.pool_with("vps", Sharing::Exclusive, PoolPolicy { overcommit, ..PoolPolicy::default() }).await;
    for n in 0..3 {
        fleet.node_with(&vps, &format!("vps{n}"), 8, 0, &[("vcpu", 32), ("memoryGiB", 256)]).await;
    }
    for n in 0..4 {
        fleet.node(&exclusive, &format!("ex{n}"), 8, 0).await;
    }
    for n in 0..2 {
        fleet.node(&mig, &format!("mig{n}"), 4, 7).await;
        fleet.node(&slots, &format!("ts{n}"), 4, 0).await;
    }
    for n in 0..16 {
        fleet.node(&roomy, &format!("roomy{n}"), 8, 0).await;
    }
    let tenants = ["acme", "globex", "initech"];
    for tenant in tenants {
        let vps_quota = [("gpu", 8), ("vcpu", 48), ("memoryGiB", 384)];
        for (pool, quota) in [
            (&exclusive, &[("gpu", 6)][..]),
            (&mig, &[("gpu.mig", 10)][..]),
            (&slots, &[("gpu.slot", 8)][..]),
            (&vps, &vps_quota[..]),
        ] {
            let quota = quota.iter().map(|(resource, n)| ((*resource).to_owned(), *n)).collect();
            fleet
                .app
                .offer_pool(
                    &fleet.owner,
                    pool,
                    bc_commands::fleet::OfferPool {
                        tenant_id: tenant.parse().expect("tenant"),
                        quota,
                        priority: 0,
                        include_descendants: false,
                    },
                )
                .await
                .expect("offer");
        }
    }

    let db = fleet.t.pool(&DbConfig { max_connections: 30, ..testing::test_db_config() });
    let app = App::new(db.clone());
    let pools = Arc::new(Pools { exclusive, mig, slots, roomy, vps });
    let now = Arc::new(AtomicI64::new(T0));
    let stop = Arc::new(AtomicBool::new(false));
    let clock_task = {
        let (db, now, stop) = (db.clone(), now.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let next = now.load(Ordering::SeqCst) + 10_000;
                clock::set_sim_clock(&db, next).await.expect("move the clock");
                now.store(next, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        })
    };
    let (stop_workers, workers_stopped) = tokio::sync::watch::channel(false);
    let worker =
        Worker::new(app.clone(), WorkerConfig { idle_poll: Duration::from_millis(20), ..WorkerConfig::default() });
    let worker_tasks: Vec<_> = (0..2).map(|_| tokio::spawn(worker.clone().run(workers_stopped.clone()))).collect();

    let tally: Tally = Arc::default();
    let unexpected = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let tenant = if i % 4 == 0 { "root" } else { tenants[i % 4 - 1] };
            let who = caller(tenant, &format!("client-{i}@{tenant}"));
            let client = Client {
                app: app.clone(),
                is_owner: tenant == "root",
                who,
                pools: pools.clone(),
                now: now.clone(),
                rng: fastrand::Rng::with_seed(seed.wrapping_add(i as u64)),
                tally: tally.clone(),
                unexpected: unexpected.clone(),
                mine: Vec::new(),
                roomy: Vec::new(),
                keys: Vec::new(),
            };
            tokio::spawn(client.run(OPERATIONS / CLIENTS))
        })
        .collect();
    for client in clients {
        client.await.expect("client");
    }
    stop.store(true, Ordering::SeqCst);
    clock_task.await.expect("clock");
    let _ = stop_workers.send(true);
    for task in worker_tasks {
        task.await.expect("worker");
    }
    worker.run_until_idle().await.expect("drain the queue");

    println!("outcomes: {:?}", tally.lock().expect("tally"));
    let unexpected = unexpected.lock().expect("unexpected").clone();
    assert!(
        unexpected.is_empty(),
        "{} unexpected answers (seed {seed}), first: {:?}",
        unexpected.len(),
        &unexpected[..unexpected.len().min(5)]
    );
    assert_eq!(worker.failures(), 0, "no work item failed (seed {seed}); last: {:?}", worker.last_failure());
    let made: u64 = tally
        .lock()
        .expect("tally")
        .iter()
        .filter(|((op, code), _)| op.starts_with("reserve") && code == "OK")
        .map(|(_, n)| n)
        .sum();
    assert!(made > 300, "the run made {made} reservations");

    // Every writer has finished, and so has the writer of the hints that follow the commits (each of its writes merged
    // the changes of the commits queued behind it; none failed).
    db.follow_ups_written().await;
    let follow_ups = db.follow_up_figures();
    assert_eq!(follow_ups.failed, 0, "a write of the hints failed (seed {seed}): {follow_ups:?}");
    assert!(follow_ups.writes <= follow_ups.commits, "{follow_ups:?}");
    println!("hint follow-ups: {follow_ups:?}");
    // READ COMMITTED lets the inline rebuild below wait for the horizon.
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    // Over what every reservation held (`held_cte!`: ended ones too, whose bookings are gone), no two reservations
    // ever held one device at the same time.
    let overlaps = scalar(
        &mut tx,
        concat!(
            "WITH ",
            held_cte!(),
            " SELECT count(*) FROM held AS a JOIN held AS b
               ON a.device_id = b.device_id AND a.allocation_id < b.allocation_id AND a.during && b.during"
        ),
    )
    .await;
    assert_eq!(overlaps, 0, "overlapping holdings (seed {seed})");
    // No tenant held more than its quota at any instant of any window.
    let over_quota = scalar(
        &mut tx,
        concat!(
            "WITH ",
            held_cte!(),
            ", steps AS (
             SELECT b.tenant_id, b.pool_id, b.resource, lower(b.during) AS at, 1 AS delta FROM held AS b
             WHERE NOT isempty(b.during)
             UNION ALL
             SELECT b.tenant_id, b.pool_id, b.resource, upper(b.during), -1 FROM held AS b
             WHERE NOT isempty(b.during)
         ), peaks AS (
             SELECT tenant_id, pool_id, resource, max(running) AS peak FROM (
                 SELECT tenant_id, pool_id, resource,
                        sum(delta) OVER (PARTITION BY tenant_id, pool_id, resource ORDER BY at, delta
                                         ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS running
                 FROM steps) AS sweep
             GROUP BY tenant_id, pool_id, resource
         )
         SELECT count(*) FROM peaks AS p JOIN pool_offers AS o ON o.pool_id = p.pool_id AND o.tenant_id = p.tenant_id
         WHERE p.peak > coalesce((o.quota ->> p.resource)::int, 0)"
        ),
    )
    .await;
    assert_eq!(over_quota, 0, "a tenant exceeded its quota (seed {seed})");
    // Scalars: over what every reservation held of them (each allocation its request's amounts, for the window it
    // held its atoms), no node lent more than it has times the pool's overcommit at any instant, and no tenant held
    // more than its quota.
    let scalar_held = scalar(&mut tx, concat!("WITH ", scalar_held_cte!(), " SELECT count(*) FROM sheld")).await;
    assert!(scalar_held > 20, "the run held scalars {scalar_held} times (seed {seed})");
    let node_over = scalar(
        &mut tx,
        concat!(
            "WITH ",
            scalar_held_cte!(),
            ", peaks AS (",
            scalar_peaks!("node_id"),
            ")
         SELECT count(*) FROM peaks AS p
         JOIN node_resources AS n ON n.node_id = p.node_id AND n.resource = p.resource
         JOIN nodes ON nodes.id = p.node_id JOIN pools ON pools.id = nodes.pool_id
         WHERE p.peak > floor(n.capacity * coalesce((pools.policy -> 'overcommit' ->> p.resource)::float8, 1))"
        ),
    )
    .await;
    assert_eq!(node_over, 0, "a node lent more of a scalar than it has times the overcommit (seed {seed})");
    let tenant_over = scalar(
        &mut tx,
        concat!(
            "WITH ",
            scalar_held_cte!(),
            ", peaks AS (",
            scalar_peaks!("tenant_id, pool_id"),
            ")
         SELECT count(*) FROM peaks AS p JOIN pool_offers AS o ON o.pool_id = p.pool_id AND o.tenant_id = p.tenant_id
         WHERE p.peak > coalesce((o.quota ->> p.resource)::int, 0)"
        ),
    )
    .await;
    assert_eq!(tenant_over, 0, "a tenant held more of a scalar than its quota (seed {seed})");
    // Every live reservation holds exactly its amounts on each of its nodes for its window, and nothing else does.
    let wrong_scalars = scalar(
        &mut tx,
        "SELECT count(*) FROM ((SELECT a.id, a.node_id, e.key, e.value::bigint, tstzrange(r.start_at, r.end_at)
                                FROM reservations AS r JOIN allocations AS a ON a.reservation_id = r.id
                                CROSS JOIN LATERAL jsonb_each_text(r.request -> 'resources') AS e
                                WHERE r.state IN ('placed', 'binding', 'active', 'releasing')
                                EXCEPT ALL
                                SELECT allocation_id, node_id, resource, amount, during FROM scalar_bookings)
                               UNION ALL
                               (SELECT allocation_id, node_id, resource, amount, during FROM scalar_bookings
                                EXCEPT ALL
                                SELECT a.id, a.node_id, e.key, e.value::bigint, tstzrange(r.start_at, r.end_at)
                                FROM reservations AS r JOIN allocations AS a ON a.reservation_id = r.id
                                CROSS JOIN LATERAL jsonb_each_text(r.request -> 'resources') AS e
                                WHERE r.state IN ('placed', 'binding', 'active', 'releasing'))) AS d",
    )
    .await;
    assert_eq!(wrong_scalars, 0, "the scalar bookings are not exactly the live reservations' amounts (seed {seed})");
    // Every quota claim went with its command: the ones that booked, and the ones that failed.
    let claims = scalar(&mut tx, "SELECT count(*) FROM quota_claims").await;
    assert_eq!(claims, 0, "quota claims left behind (seed {seed})");
    // Every live reservation holds exactly its count of atoms, each for exactly its window.
    let wrong_holdings = scalar(
        &mut tx,
        "SELECT count(*) FROM reservations AS r
         WHERE r.state IN ('placed', 'binding', 'active', 'releasing')
           AND (SELECT count(*) FROM device_bookings AS b
                WHERE b.reservation_id = r.id AND b.during = tstzrange(r.start_at, r.end_at)) <> r.count",
    )
    .await;
    assert_eq!(wrong_holdings, 0, "a live reservation does not hold exactly its atoms (seed {seed})");
    // The free-capacity summary: each atom's end of live bookings is exactly that, and the hint that orders
    // placement, moved after every commit by what it booked or freed, adds up to a recount from the devices.
    let wrong_ends = scalar(
        &mut tx,
        "SELECT count(*) FROM devices AS d
         WHERE d.booked_until IS DISTINCT FROM (SELECT max(upper(b.during)) FROM device_bookings AS b
                                                 WHERE b.device_id = d.id)",
    )
    .await;
    assert_eq!(wrong_ends, 0, "an atom's booked_until is not the end of its live bookings (seed {seed})");
    // The table holds the bookings that still hold an atom, and nothing else.
    let not_holding = scalar(
        &mut tx,
        "SELECT count(*) FROM device_bookings AS b LEFT JOIN reservations AS r ON r.id = b.reservation_id
         WHERE r.id IS NULL OR r.ended_at IS NOT NULL OR isempty(b.during) OR NOT b.live",
    )
    .await;
    assert_eq!(not_holding, 0, "a booking of an ended or replaced reservation is still there (seed {seed})");
    // The exclusion constraint compares atom numbers: every booking carries its own device's.
    let misnumbered = scalar(
        &mut tx,
        "SELECT count(*) FROM device_bookings AS b LEFT JOIN atom_numbers AS n ON n.device_id = b.device_id
         WHERE n.atom IS DISTINCT FROM b.atom",
    )
    .await;
    assert_eq!(misnumbered, 0, "a booking does not carry its device's atom number (seed {seed})");
    let drifted = scalar(
        &mut tx,
        "SELECT count(*) FROM node_free AS f
         FULL JOIN (SELECT node_id, class, count(*) AS atoms, count(*) FILTER (WHERE booked_until IS NULL) AS free
                    FROM devices WHERE bookable GROUP BY node_id, class) AS c
              ON c.node_id = f.node_id AND c.class = f.class
         WHERE (f.atoms, f.free) IS DISTINCT FROM (c.atoms, c.free)",
    )
    .await;
    assert_eq!(drifted, 0, "the free-capacity hint drifted from the devices (seed {seed})");
    let fit_drifted = scalar(
        &mut tx,
        "SELECT count(*) FROM ((TABLE node_fit EXCEPT ALL
                                SELECT * FROM node_fit_of(ARRAY(SELECT DISTINCT node_id FROM devices)))
                               UNION ALL (SELECT * FROM node_fit_of(ARRAY(SELECT DISTINCT node_id FROM devices))
                                          EXCEPT ALL TABLE node_fit)) AS d",
    )
    .await;
    assert_eq!(fit_drifted, 0, "the hint of how long nodes can hold k atoms drifted from their gaps (seed {seed})");
    let gaps_drifted = scalar(
        &mut tx,
        "SELECT count(*) FROM ((TABLE atom_gaps EXCEPT ALL SELECT * FROM atom_gaps_from_bookings())
                               UNION ALL (SELECT * FROM atom_gaps_from_bookings() EXCEPT ALL TABLE atom_gaps)) AS d",
    )
    .await;
    assert_eq!(gaps_drifted, 0, "the atoms' free time is not the complement of their live bookings (seed {seed})");
    // Every stream's events appear in the log in version order.
    let out_of_order = scalar(
        &mut tx,
        "SELECT count(*) FROM (
             SELECT stream_version, lag(stream_version) OVER (PARTITION BY stream_id ORDER BY log_epoch, txid, seq) AS previous
             FROM events) AS e
         WHERE e.previous IS NOT NULL AND e.stream_version <> e.previous + 1",
    )
    .await;
    assert_eq!(out_of_order, 0, "a stream's events are out of version order in the log (seed {seed})");
    // Rebuilding the inline tables from the log, in log order with the exclusion constraint on, gives exactly
    // the live ones.
    let applied = bc_projections::inline::rebuild_into(&mut tx, "torture_rebuild").await.expect("rebuild");
    assert!(applied > 1_000, "{applied} events replayed");
    for table in bc_projections::inline::TABLES {
        let differences =
            bc_projections::inline::differences(&mut tx, "torture_rebuild", table).await.expect("compare");
        assert_eq!(differences, 0, "{table} rebuilt from the log differs from the live table (seed {seed})");
    }
    tx.rollback().await;
}
