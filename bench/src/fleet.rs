//! `better-compute bench fleet`: the system at the size of a large GPU cloud. On its own durable cluster it
//! generates, with bulk SQL and not through the commands, a fleet of 10,000 nodes with 80,000 H100s in ten pools
//! and 1,000,000 reservations over the past 60 days and the next 30: their events in the log (in time order, each
//! stream's events made by the domain's own `decide` and `evolve`), and the inline state that placement and the
//! quota sweep read (reservations, allocations, bookings under the exclusion constraint, quota rows, work-queue
//! entries). Then it measures placement, the earliest-start query, the capacity rollup, SSE fan-out and catch-up,
//! and the tables' sizes, beside baselines measured in the same run: pgbench's one-row INSERT, an
//! `INSERT ... SELECT` of the log, a plain read of the log, and the same commands on an empty database of the
//! same cluster.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use bc_domain::device::{DeviceClass, GpuInfo, devices_for};
use bc_domain::event::{AdmissionContext, DomainEvent, EventMetadata};
use bc_domain::id::{AllocationId, DeviceId, Identity, NodeId, PoolId, ReservationId, SiteId, TenantId};
use bc_domain::node::{Adapter, Connectivity, NodeEvent, NodeRegistered, ProvisionState, Role, Trust};
use bc_domain::pool::Sharing;
use bc_domain::reservation::{
    self, Allocation, Command, DeviceRequest, ExpiryCause, NewRequest, Reservation, ReservationEvent,
    ReservationRequest, Selector, Topology,
};
use bc_eventstore::bulk::{self, BulkEvents};
use bc_eventstore::migrate::Migrator;
use bc_eventstore::{Db, DbConfig, Position, TxOptions, clock, events, lease, queue, sql};
use bc_projections::framework::{self, Projection};
use bc_projections::inline::{self, bulk as bulk_inline};
use bc_projections::models;
use sqlx::{ConnectOptions as _, Connection as _, Row as _};
use tokio::net::TcpListener;

use super::fanout::{FanOutSpec, fan_out};
use super::reserve::{
    STATEMENTS_SETTINGS, bench_caller, bench_site, bulk_fleet, gpu_request, h100_pool, print_statements,
    reset_statements,
};
use super::{BenchCluster, PgbenchRun, millis, percentile, pgbench, wall_ms};
use bc_api::service::{Role as ServeRole, ServeOptions};
use bc_commands::auth::builtin::BuiltinAuthorizer;
use bc_commands::availability::{EarliestStart, MAX_CANDIDATE_STARTS};
use bc_commands::fleet::OfferPool;
use bc_commands::reservations::Reserve;
use bc_commands::work::WorkKey;
use bc_commands::{App, Caller};
use bc_domain::reservation::NextLook;

/// Pools the fleet's nodes are spread over; the first is the busy one (booked 90 to 99% of the time).
const POOLS: usize = 10;
/// GPUs per node.
const GPUS: usize = 8;
/// Tenants the pools are offered to; the first holds 30% of the reservations.
const TENANTS: usize = 20;
const BIG_TENANT_SHARE: f64 = 0.30;
const DAY_MS: i64 = 86_400_000;
/// The generated reservations cover the past 60 days and the next 30.
const PAST_MS: i64 = 60 * DAY_MS;
const AHEAD_MS: i64 = 30 * DAY_MS;
/// Events per bulk INSERT (one transaction each).
const EVENT_BATCH: usize = 20_000;
/// Reservations per bulk INSERT of the inline state (one transaction each).
const INLINE_BATCH: usize = 10_000;
/// Nodes in the empty database's pool, the baselines' fleet.
const EMPTY_POOL_NODES: i64 = 64;
const GPU_NAME: &str = "NVIDIA H100 80GB HBM3";
/// The GPU model of every pool and GPU the benchmark makes, which a request's selector may name.
const FLEET_MODEL: &str = "H100";
const SEED: u64 = 0x5eed_f1ee_7000_0001;
/// Reservations per second during the fan-out run.
const FANOUT_RATE: u32 = 20;
const ROOT_TOKEN: &str = "fleet-root-token-0123456789abcdef";
const USER_TOKEN: &str = "fleet-t01-token-0123456789abcdef";
const SMALL_TENANT_TOKEN: &str = "fleet-t05-token-0123456789abcdef";

/// What `bench fleet` generates and measures.
#[derive(Debug, Clone)]
pub struct FleetBenchConfig {
    /// Nodes of 8 H100s, spread over ten pools.
    pub nodes: usize,
    /// Reservations over the past 60 days and the next 30.
    pub reservations: usize,
    /// How long each placement run lasts, and the fan-out run.
    pub run_for: Duration,
    /// Concurrent clients of the placement runs.
    pub clients: usize,
    /// SSE subscribers of the fan-out run.
    pub subscribers: usize,
    /// How far back (in events) the SSE catch-up starts.
    pub resume_events: u64,
    /// Replay the whole log into a scratch schema and compare the inline tables (slow: for small runs).
    pub verify: bool,
    pub data_dir: Option<PathBuf>,
    pub keep: bool,
    /// Stop after generating (the cluster's folder is kept, whatever `keep` says).
    pub generate_only: bool,
    /// Profile the one-client placement runs with pg_stat_statements.
    pub statements: bool,
}

// ---------------------------------------------------------------------------------------------------------------
// The fleet's shape and the reservations' plans: pure, deterministic functions of the sizes and the start time.

/// A sequence of reservations of `size` GPUs on one node, one after another: GPUs `first_gpu..first_gpu+size`.
#[derive(Debug, Clone, Copy)]
struct Timeline {
    node: u32,
    first_gpu: u8,
    size: u8,
}

/// How a generated reservation ends (if its end is before now).
#[derive(Debug, Clone, Copy)]
enum Ending {
    /// Its window ends and the worker expires it.
    Expire,
    /// The tenant releases it early, at this time.
    Release(i64),
    /// The tenant cancels it before its start, at this time.
    Cancel(i64),
}

/// One generated reservation.
#[derive(Debug, Clone, Copy)]
struct Plan {
    timeline: u32,
    tenant: u8,
    /// Asked for a start time (an advance reservation), rather than "now".
    advance: bool,
    requested_ms: i64,
    start_ms: i64,
    end_ms: i64,
    ending: Ending,
}

/// The generated fleet.
struct Fleet {
    /// The generation's "now": events after it are not in the log.
    now_ms: i64,
    /// When the site, pools and offers were created (through the commands, on the simulated clock).
    created_ms: i64,
    /// When the nodes were registered.
    registered_ms: i64,
    window_start_ms: i64,
    window_end_ms: i64,
    site: SiteId,
    pools: Vec<PoolId>,
    tenants: Vec<TenantId>,
    identities: Vec<Identity>,
    nodes: usize,
    timelines: Vec<Timeline>,
    plans: Vec<Plan>,
}

/// Which metadata an event carries: the index into the metadata array bound with each batch (1-based, SQL).
#[derive(Debug, Clone, Copy)]
enum Actor {
    Operator,
    System,
    User(u8),
}

impl Actor {
    fn index(self) -> i32 {
        match self {
            Actor::Operator => 1,
            Actor::System => 2,
            Actor::User(tenant) => 3 + i32::from(tenant),
        }
    }
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The `k`-th pseudo-random draw of reservation `idx`, in [0, 1).
fn draw(idx: usize, k: u64) -> f64 {
    (mix(SEED ^ ((idx as u64) << 8) ^ k) >> 11) as f64 / (1u64 << 53) as f64
}

fn ceil_second(ms: i64) -> i64 {
    (ms + 999).div_euclid(1000) * 1000
}

fn pool_of(node: usize) -> usize {
    node % POOLS
}

/// Nodes take reservations of 8, 4, 2 or 1 GPUs, a quarter of each pool's nodes each.
fn group_size(node: usize) -> usize {
    [8, 4, 2, 1][(node / POOLS) % 4]
}

fn ulid_text(prefix: &str, ms: i64, random: u128) -> String {
    let ulid = ulid::Ulid::from_parts(ms.max(0) as u64, random);
    format!("{prefix}_{}", ulid.to_string().to_ascii_lowercase())
}

fn node_id(fleet: &Fleet, node: usize) -> anyhow::Result<NodeId> {
    Ok(ulid_text("node", fleet.registered_ms, node as u128).parse()?)
}

fn device_id(node: usize, gpu: usize) -> String {
    format!("GPU-{node:08x}-{gpu:04x}-4b1d-9c2e-{:012x}", node * GPUS + gpu)
}

/// Every GPU group of every node, and each group's share of `reservations`, laid end to end over the window.
fn plan_reservations(fleet: &mut Fleet, reservations: usize) -> anyhow::Result<()> {
    let mut timelines = Vec::new();
    for node in 0..fleet.nodes {
        let size = group_size(node);
        for group in 0..GPUS / size {
            timelines.push(Timeline { node: node as u32, first_gpu: (group * size) as u8, size: size as u8 });
        }
    }
    let span = fleet.window_end_ms - fleet.window_start_ms;
    let per_timeline = reservations.div_ceil(timelines.len().max(1));
    let shortest = span / per_timeline.max(1) as i64;
    ensure!(
        shortest >= 10 * 60_000,
        "{reservations} reservations on {} GPU groups leave {} s per reservation; use fewer reservations or more nodes",
        timelines.len(),
        shortest / 1000
    );
    let (base, extra) = (reservations / timelines.len(), reservations % timelines.len());
    let mut plans = Vec::with_capacity(reservations);
    for (t, timeline) in timelines.iter().enumerate() {
        let n = base + usize::from(t < extra);
        if n == 0 {
            continue;
        }
        let period = span / n as i64;
        let busy = pool_of(timeline.node as usize) == 0;
        for j in 0..n {
            let idx = plans.len();
            let d = |k| draw(idx, k);
            let slot = fleet.window_start_ms + j as i64 * period;
            let utilization = if busy { 0.90 + 0.09 * d(0) } else { 0.55 + 0.40 * d(0) };
            let duration_s = ((period as f64 * utilization) as i64 / 1000).clamp(60, (period - 2_000) / 1000);
            let room = period - duration_s * 1000 - 1000;
            let start_ms = ceil_second(slot + (room as f64 * d(1)) as i64);
            let end_ms = start_ms + duration_s * 1000;
            let tenant =
                if d(2) < BIG_TENANT_SHARE { 0 } else { 1 + (mix(SEED ^ idx as u64) % (TENANTS as u64 - 1)) as u8 };
            let lead = 60_000 + (2.0 * DAY_MS as f64 * d(4)) as i64;
            let (advance, requested_ms) = if start_ms > fleet.now_ms {
                // Windows still ahead were all asked for in the past week.
                let asked = fleet.now_ms - 60_000 - (7.0 * DAY_MS as f64 * d(5)) as i64;
                (true, (start_ms - lead).min(asked))
            } else if d(3) < 0.5 {
                (false, start_ms - 1 - (mix(SEED ^ !(idx as u64)) % 998) as i64)
            } else {
                (true, start_ms - lead)
            };
            let ending = if advance && start_ms - requested_ms > 600_000 && d(6) < 0.05 {
                Ending::Cancel(requested_ms + 1000 + ((start_ms - requested_ms - 2000) as f64 * d(7)) as i64)
            } else if d(6) < 0.20 {
                Ending::Release(start_ms + 2000 + ((duration_s * 1000 - 5000) as f64 * d(7)) as i64)
            } else {
                Ending::Expire
            };
            plans.push(Plan { timeline: t as u32, tenant, advance, requested_ms, start_ms, end_ms, ending });
        }
    }
    fleet.timelines = timelines;
    fleet.plans = plans;
    Ok(())
}

/// An event as the commands would record it: when, by whom, what.
type Recorded = (i64, Actor, ReservationEvent);

/// A reservation's life as the commands would record it, each event with when it is recorded and by whom.
struct Life {
    state: Option<Reservation>,
    events: Vec<Recorded>,
}

impl Life {
    fn record(&mut self, at: i64, actor: Actor, events: Vec<ReservationEvent>) {
        for event in events {
            self.state = reservation::evolve(self.state.take(), &event);
            self.events.push((at, actor, event));
        }
    }

    fn run(&mut self, at: i64, actor: Actor, command: Command) -> anyhow::Result<()> {
        let state = self.state.as_ref().context("a command before the request")?;
        let events = reservation::decide(state, &command)?;
        self.record(at, actor, events);
        Ok(())
    }
}

/// The events of generated reservation `idx` recorded by the fleet's "now", and its state then.
fn lifecycle(fleet: &Fleet, idx: usize) -> anyhow::Result<(Reservation, Vec<Recorded>)> {
    let plan = fleet.plans[idx];
    let timeline = fleet.timelines[plan.timeline as usize];
    let node = timeline.node as usize;
    let tenant = &fleet.tenants[usize::from(plan.tenant)];
    let identity = &fleet.identities[usize::from(plan.tenant)];
    let id = ReservationId::derive(tenant, identity, &format!("gen-{idx}"));
    let mut request =
        ReservationRequest::hold(fleet.pools[pool_of(node)].clone(), DeviceClass::Gpu, timeline.size.into());
    request.duration_s = ((plan.end_ms - plan.start_ms) / 1000) as u64;
    request.start_ms = plan.advance.then_some(plan.start_ms);
    let user = Actor::User(plan.tenant);
    let mut life = Life { state: None, events: Vec::with_capacity(6) };
    let requested = reservation::request(
        None,
        NewRequest {
            reservation_id: id,
            tenant_id: tenant.clone(),
            identity: identity.clone(),
            request,
            priority: 0,
            quota_holder: Some(tenant.clone()),
            now_ms: plan.requested_ms,
        },
    )?;
    life.record(plan.requested_ms, user, requested);
    let node_id = node_id(fleet, node)?;
    let first = usize::from(timeline.first_gpu);
    let devices = (first..first + usize::from(timeline.size))
        .map(|gpu| device_id(node, gpu).parse::<DeviceId>())
        .collect::<Result<Vec<_>, _>>()?;
    let allocation = Allocation {
        allocation_id: ulid_text("alloc", plan.requested_ms, idx as u128).parse::<AllocationId>()?,
        node_id: node_id.clone(),
        devices,
        resources: Default::default(),
    };
    life.run(plan.requested_ms, user, Command::Place { allocations: vec![allocation], now_ms: plan.requested_ms })?;
    match plan.ending {
        Ending::Cancel(at) => life.run(at, user, Command::Cancel { now_ms: at, reason: None })?,
        ending => {
            let awaiting = vec![node_id];
            let bind = plan.start_ms + 150;
            life.run(bind, Actor::System, Command::StartBinding { now_ms: bind, awaiting: awaiting.clone() })?;
            life.run(plan.start_ms + 1500, Actor::System, Command::Activate { now_ms: plan.start_ms + 1500 })?;
            if let Ending::Release(at) = ending {
                life.run(at, user, Command::Release { now_ms: at, awaiting })?;
                let done = at + 1500;
                life.run(done, Actor::System, Command::CompleteRelease { now_ms: done, unconfirmed: false })?;
            } else {
                let expired = plan.end_ms + 300;
                let expire = Command::Expire { cause: ExpiryCause::WindowEnded, now_ms: expired };
                life.run(expired, Actor::System, expire)?;
            }
        }
    }
    let mut events = life.events;
    events.retain(|(at, _, _)| *at <= fleet.now_ms);
    let state = reservation::fold(events.iter().map(|(_, _, event)| event)).context("a reservation without events")?;
    Ok((state, events))
}

// ---------------------------------------------------------------------------------------------------------------
// Bulk writes: each batch is one multi-row INSERT ... SELECT FROM unnest(...) in a transaction of its own.

/// Adds one event, made by the domain, to a batch of the log to come.
fn push_event<E: DomainEvent>(
    batch: &mut BulkEvents,
    stream: &str,
    version: i32,
    tenant: &str,
    actor: Actor,
    at: i64,
    event: &E,
) -> anyhow::Result<()> {
    batch.stream_ids.push(stream.to_owned());
    batch.stream_versions.push(version);
    batch.event_types.push(event.event_type());
    batch.schema_versions.push(event.schema_version());
    batch.tenant_ids.push(tenant.to_owned());
    batch.payloads.push(event.encode_payload()?);
    batch.metadata.push(actor.index());
    batch.recorded_at_ms.push(at);
    Ok(())
}

async fn insert_events(db: &Db, metadata: &[Vec<u8>], batch: &BulkEvents) -> anyhow::Result<()> {
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    bulk::load_events(&mut tx, metadata, batch).await?;
    tx.commit().await?;
    Ok(())
}

/// The metadata of each [`Actor`], encoded, in index order.
fn metadata(fleet: &Fleet) -> anyhow::Result<Vec<Vec<u8>>> {
    let admission = |identity: &str, kind: &str, tenant: &str| EventMetadata {
        admission: Some(AdmissionContext {
            identity: identity.to_owned(),
            session_kind: kind.to_owned(),
            agent: None,
            delegation: None,
            request_id: None,
            tenant_id: tenant.to_owned(),
        }),
        ..EventMetadata::default()
    };
    let mut all = vec![
        admission("operator@bench", "bench", "root").encode()?,
        admission("system:worker", "system", "root").encode()?,
    ];
    for (tenant, identity) in fleet.tenants.iter().zip(&fleet.identities) {
        all.push(admission(identity.as_str(), "user", tenant.as_str()).encode()?);
    }
    Ok(all)
}

/// Registers every node: its `node.registered` event, its row and its devices' rows, as `register_node` would.
async fn generate_nodes(db: &Db, fleet: &Fleet, metadata: &[Vec<u8>]) -> anyhow::Result<usize> {
    let mut written = 0;
    for chunk_start in (0..fleet.nodes).step_by(1000) {
        let chunk = chunk_start..(chunk_start + 1000).min(fleet.nodes);
        let mut batch = BulkEvents::default();
        let mut registered = Vec::new();
        for node in chunk {
            let pool = &fleet.pools[pool_of(node)];
            let id = node_id(fleet, node)?;
            let gpus = (0..GPUS)
                .map(|gpu| {
                    Ok(GpuInfo {
                        uuid: device_id(node, gpu).parse()?,
                        name: GPU_NAME.to_owned(),
                        memory_mib: 81_559,
                        pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x18 + gpu * 0x10)),
                        mig_instances: Vec::new(),
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let (node_devices, unknown) = devices_for(&gpus, Sharing::Exclusive, 1);
            ensure!(unknown.is_empty(), "{GPU_NAME:?} is not in gpu-models.json");
            let registered_at = fleet.registered_ms + node as i64;
            let name = format!("gpu-{:02}-{node:06}", pool_of(node));
            let event = NodeEvent::Registered(NodeRegistered {
                node_id: id.clone(),
                pool_id: pool.clone(),
                site_id: fleet.site.clone(),
                name,
                role: Role::Host,
                trust: Trust::Platform,
                owner_tenant_id: None,
                adapter: Adapter::BcdV1,
                provision_state: ProvisionState::Adopted,
                connectivity: Connectivity::Connected,
                generation: 1,
                observed_generation: 1,
                gpus,
                devices: node_devices,
                conditions: Vec::new(),
                at_ms: registered_at,
            });
            push_event(&mut batch, id.as_str(), 1, "root", Actor::Operator, registered_at, &event)?;
            if let NodeEvent::Registered(e) = event {
                registered.push(e);
            }
        }
        insert_events(db, metadata, &batch).await?;
        let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
        bulk_inline::load_registered_nodes(&mut tx, &"root".parse()?, &registered).await?;
        tx.commit().await?;
        written += batch.len();
    }
    Ok(written)
}

/// A batch of reservations' inline rows (through `inline::bulk`), and the work-queue wakes their recorded
/// times call for.
#[derive(Default)]
struct InlineBatch {
    rows: bulk_inline::Reservations,
    wakes: Vec<(WorkKey, i64)>,
}

impl InlineBatch {
    /// Adds reservation `r` (the fold of its events) and its next wake at `now_ms`.
    fn push(&mut self, r: &Reservation, now_ms: i64, summary: &mut InlineSummary) -> anyhow::Result<()> {
        *summary.by_state.entry(r.state.as_str()).or_default() += 1;
        self.rows.push(r, &mut summary.counters)?;
        let at = match reservation::next_look(r, now_ms) {
            NextLook::Never => None,
            NextLook::Now => Some(now_ms),
            NextLook::At(at) => Some(at),
        };
        if let Some(at) = at {
            self.wakes.push((WorkKey::Reservation(r.id.clone()), at));
        }
        Ok(())
    }
}

/// What the inline pass found, for the report and the last writes.
#[derive(Default)]
struct InlineSummary {
    by_state: BTreeMap<&'static str, u64>,
    events: u64,
    counters: bulk_inline::Counters,
}

/// Time spent on each table of the inline state during the bulk writes.
#[derive(Debug, Default, Clone, Copy)]
struct InlineTimes {
    reservations: Duration,
    allocations: Duration,
    bookings: Duration,
    work_queue: Duration,
}

async fn insert_inline(db: &Db, batch: &InlineBatch, times: &mut InlineTimes) -> anyhow::Result<()> {
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    let loaded = bulk_inline::load_reservations(&mut tx, &batch.rows).await?;
    times.reservations += loaded.reservations;
    times.allocations += loaded.allocations;
    times.bookings += loaded.bookings;
    let step = Instant::now();
    let keys: Vec<String> = batch.wakes.iter().map(|(key, _)| key.to_string()).collect();
    let wakes: Vec<queue::Enqueue<'_>> = batch
        .wakes
        .iter()
        .zip(&keys)
        .map(|((key, at), text)| queue::Enqueue { key: text, shard: key.shard(), not_before_ms: Some(*at) })
        .collect();
    queue::enqueue(&mut tx, &wakes).await?;
    tx.commit().await?;
    times.work_queue += step.elapsed();
    Ok(())
}

/// One event of the log to come: when it is recorded, whose it is, its place in the stream.
type LogEntry = (i64, u32, u8);

/// The GiST indexes of `device_bookings`, the exclusion constraint's among them (see `inline::bulk`).
async fn booking_gist_indexes(db: &Db) -> anyhow::Result<Vec<(String, String)>> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let indexes = bulk_inline::booking_indexes(&mut tx).await?;
    tx.commit().await?;
    Ok(indexes)
}

async fn drop_booking_indexes(db: &Db, indexes: &[(String, String)]) -> anyhow::Result<()> {
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    bulk_inline::drop_booking_indexes(&mut tx, indexes).await?;
    tx.commit().await?;
    Ok(())
}

async fn restore_booking_indexes(db: &Db, indexes: &[(String, String)]) -> anyhow::Result<()> {
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    bulk_inline::restore_booking_indexes(&mut tx, indexes).await?;
    tx.commit().await?;
    Ok(())
}

/// Writes every reservation's inline rows (in reservation order), and returns every event's place in time.
async fn generate_inline(db: &Db, fleet: &Arc<Fleet>) -> anyhow::Result<(InlineSummary, Vec<LogEntry>, InlineTimes)> {
    let (sender, mut receiver) = tokio::sync::mpsc::channel::<InlineBatch>(2);
    let producer = {
        let fleet = Arc::clone(fleet);
        tokio::task::spawn_blocking(move || -> anyhow::Result<(InlineSummary, Vec<LogEntry>)> {
            let mut summary = InlineSummary::default();
            let mut log = Vec::with_capacity(fleet.plans.len() * 5);
            let mut batch = InlineBatch::default();
            for idx in 0..fleet.plans.len() {
                let (state, events) = lifecycle(&fleet, idx)?;
                for (k, (at, _, _)) in events.iter().enumerate() {
                    log.push((*at, idx as u32, k as u8));
                }
                summary.events += events.len() as u64;
                batch.push(&state, fleet.now_ms, &mut summary)?;
                if batch.rows.len() >= INLINE_BATCH && sender.blocking_send(std::mem::take(&mut batch)).is_err() {
                    bail!("the inline writer stopped");
                }
            }
            if !batch.rows.is_empty() && sender.blocking_send(batch).is_err() {
                bail!("the inline writer stopped");
            }
            Ok((summary, log))
        })
    };
    let mut times = InlineTimes::default();
    while let Some(batch) = receiver.recv().await {
        insert_inline(db, &batch, &mut times).await?;
    }
    let (summary, log) = producer.await.context("join the inline generator")??;
    Ok((summary, log, times))
}

/// Writes every reservation event in the order of `log` (time order), each batch one transaction. Returns the
/// events written.
async fn generate_events(
    db: &Db,
    fleet: &Arc<Fleet>,
    metadata: &[Vec<u8>],
    mut log: Vec<LogEntry>,
) -> anyhow::Result<u64> {
    let (sender, mut receiver) = tokio::sync::mpsc::channel::<BulkEvents>(2);
    let producer = {
        let fleet = Arc::clone(fleet);
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            log.sort_unstable();
            // Streams whose first event was written and whose later events are still to come.
            let mut open: HashMap<u32, (String, VecDeque<Recorded>)> = HashMap::new();
            let mut batch = BulkEvents::default();
            for (_, idx, k) in log {
                if k == 0 {
                    let (state, events) = lifecycle(&fleet, idx as usize)?;
                    open.insert(idx, (state.id.to_string(), events.into()));
                }
                let (stream_id, stream) = open.get_mut(&idx).context("an event before its stream's first")?;
                let (at, actor, event) = stream.pop_front().context("an event the stream does not have")?;
                let tenant = fleet.tenants[usize::from(fleet.plans[idx as usize].tenant)].as_str();
                push_event(&mut batch, stream_id, i32::from(k) + 1, tenant, actor, at, &event)?;
                if stream.is_empty() {
                    open.remove(&idx);
                }
                if batch.len() >= EVENT_BATCH && sender.blocking_send(std::mem::take(&mut batch)).is_err() {
                    bail!("the event writer stopped");
                }
            }
            ensure!(open.is_empty(), "{} streams were not written out", open.len());
            if !batch.is_empty() && sender.blocking_send(batch).is_err() {
                bail!("the event writer stopped");
            }
            Ok(())
        })
    };
    let mut written = 0u64;
    while let Some(batch) = receiver.recv().await {
        insert_events(db, metadata, &batch).await?;
        written += batch.len() as u64;
    }
    producer.await.context("join the event generator")??;
    Ok(written)
}

/// Writes what the inline pass counted: `devices.booking_changes`, and the quota rows.
async fn finish_inline(db: &Db, summary: &InlineSummary) -> anyhow::Result<()> {
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    bulk_inline::finish(&mut tx, &summary.counters).await?;
    tx.commit().await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------------
// Setup through the commands.

fn tenant_caller(tenant: &TenantId, identity: &Identity) -> Caller {
    let mut caller = Caller::new(tenant.clone(), identity.clone(), "user");
    caller.ancestors = vec!["root".parse().expect("the root tenant id is valid")];
    caller
}

fn tenants() -> anyhow::Result<(Vec<TenantId>, Vec<Identity>)> {
    let mut tenants = Vec::new();
    let mut identities = Vec::new();
    for t in 0..TENANTS {
        tenants.push(format!("t{t:02}").parse()?);
        identities.push(format!("user@t{t:02}").parse()?);
    }
    Ok((tenants, identities))
}

/// Offers `pool` to every tenant with a quota of the whole pool.
async fn offer_to_all(
    app: &App,
    owner: &Caller,
    pool: &PoolId,
    tenants: &[TenantId],
    atoms: u32,
) -> anyhow::Result<()> {
    for tenant in tenants {
        let offer = OfferPool {
            tenant_id: tenant.clone(),
            quota: [("gpu".to_owned(), atoms)].into(),
            priority: 0,
            include_descendants: false,
        };
        app.offer_pool(owner, pool, offer).await?;
    }
    Ok(())
}

/// The baselines' database in the same cluster: one pool of 64 nodes of 8 H100s, nothing booked, a log of a few
/// dozen events.
async fn empty_database(bench: &BenchCluster, tenants: &[TenantId]) -> anyhow::Result<(Db, PoolId)> {
    let cluster = &bench.guard.cluster;
    let mut admin = cluster.connect_options("postgres").connect().await.context("connect to the bench cluster")?;
    sqlx::raw_sql("CREATE DATABASE bench_empty").execute(&mut admin).await.context("create bench_empty")?;
    admin.close().await.ok();
    let db = Db::connect_lazy_with(
        cluster.connect_options("bench_empty"),
        &DbConfig { max_connections: 24, ..DbConfig::default() },
    );
    Migrator::embedded().run(&db).await.context("migrate bench_empty")?;
    let app = App::new(db.clone());
    let owner = bench_caller("operator@bench")?;
    let site = bench_site(&app, &owner).await?;
    let pool = app.create_pool(&owner, h100_pool(&site, "empty")).await?.value;
    bulk_fleet(&db, &pool, &site, 0, EMPTY_POOL_NODES, GPUS as i64, 0).await?;
    offer_to_all(&app, &owner, &pool, tenants, (EMPTY_POOL_NODES as usize * GPUS) as u32).await?;
    analyze(&db).await?;
    Ok((db, pool))
}

async fn analyze(db: &Db) -> anyhow::Result<()> {
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    sqlx::raw_sql("ANALYZE").execute(tx.conn()).await?;
    tx.commit().await?;
    Ok(())
}

async fn db_now_ms(db: &Db) -> anyhow::Result<i64> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let now = clock::compute_now_ms(&mut tx).await?;
    tx.commit().await?;
    Ok(now)
}

/// Runs `projection` from its checkpoint until it has passed every event, the daemon's way (batches growing from
/// `batch` to the daemon's largest while behind, the next read ahead). Returns the events passed and how long it
/// took.
async fn run_to_head(db: &Db, projection: &Arc<dyn Projection>, batch: u32) -> anyhow::Result<(i64, Duration)> {
    let held = lease::acquire(db, &projection.lease_name(), "prc_bench_fleet", Duration::from_secs(3600))
        .await?
        .context("the projection lease is held")?;
    let config = framework::DaemonConfig { batch, ..framework::DaemonConfig::default() };
    let mut runner = framework::Runner::new(db.clone(), projection.clone(), &config);
    let started = Instant::now();
    let mut passed = 0i64;
    loop {
        let step = runner.step(&held).await?;
        passed += step.passed as i64;
        if step.caught_up {
            break;
        }
    }
    let took = started.elapsed();
    lease::release(db, &held).await?;
    Ok((passed, took))
}

// ---------------------------------------------------------------------------------------------------------------
// Measurements.

/// What one placement run measured.
struct PlacementRun {
    cycles_per_s: f64,
    p50: Duration,
    p99: Duration,
    placed: usize,
    pending: usize,
    /// Transactions run again per cycle, with their reasons.
    retries: String,
}

/// A placement run: `count` GPUs, starting now or `ahead` (spread over a week of hourly windows from there).
struct PlacementSpec<'a> {
    count: u32,
    ahead: Option<Duration>,
    /// The GPU model the request names in its selector, if any.
    model: Option<&'a str>,
    clients: usize,
    run_for: Duration,
    label: &'a str,
}

/// `spec.clients` tasks (tenants t00 to t03, one each) reserve in `pool` and cancel each reservation before the
/// next, for `spec.run_for`.
async fn placement_run(
    app: &App,
    fleet_tenants: &(Vec<TenantId>, Vec<Identity>),
    pool: &PoolId,
    spec: &PlacementSpec<'_>,
) -> anyhow::Result<PlacementRun> {
    let retried = bc_eventstore::retries();
    let started = Instant::now();
    let deadline = started + spec.run_for;
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..spec.clients {
        let app = app.clone();
        let pool = pool.clone();
        let t = client % 4;
        let who = tenant_caller(&fleet_tenants.0[t], &fleet_tenants.1[t]);
        let label = format!("{}-{client}", spec.label);
        let (count, ahead, model) = (spec.count, spec.ahead, spec.model.map(str::to_owned));
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            let mut pending = 0usize;
            let mut n = 0u64;
            while Instant::now() < deadline {
                let mut request = gpu_request(&pool, count);
                request.devices.selector.gpu_model = model.clone();
                if let Some(ahead) = ahead {
                    let hour = (mix(SEED ^ n ^ ((client as u64) << 40)) % (7 * 24)) as i64;
                    request.start_ms = Some(ceil_second(wall_ms() + ahead.as_millis() as i64 + hour * 3_600_000));
                }
                let key = format!("{label}-{n}");
                let took = Instant::now();
                let reserved = app.reserve(&who, Reserve { idempotency_key: key, request }).await?;
                let elapsed = took.elapsed();
                if reserved.value.reservation.allocations.is_empty() {
                    pending += 1;
                } else {
                    latencies.push(elapsed);
                }
                app.cancel_reservation(&who, &reserved.value.reservation.id, None).await?;
                n += 1;
            }
            anyhow::Ok((latencies, pending))
        });
    }
    let mut latencies = Vec::new();
    let mut pending = 0;
    while let Some(done) = tasks.join_next().await {
        let (mine, left) = done.context("join a placement client")??;
        latencies.extend(mine);
        pending += left;
    }
    let elapsed = started.elapsed();
    latencies.sort();
    Ok(PlacementRun {
        cycles_per_s: (latencies.len() + pending) as f64 / elapsed.as_secs_f64(),
        p50: percentile(&latencies, 0.5),
        p99: percentile(&latencies, 0.99),
        placed: latencies.len(),
        pending,
        retries: crate::retries_per_cycle(&retried, latencies.len() + pending),
    })
}

/// What one earliest-start question got.
struct Earliest {
    /// The answer, in ms from when it was asked; `None` when the search gave up.
    answer: Option<i64>,
    /// The candidate starts it went through (the first second, then each distinct booking end up to the answer).
    tried: i64,
    latencies: Vec<Duration>,
    /// The last sample ran past [`EARLIEST_LIMIT`] and was abandoned.
    timed_out: bool,
}

/// How long one earliest-start query may run before the benchmark stops waiting for it.
const EARLIEST_LIMIT: Duration = Duration::from_secs(300);

/// One earliest-start question on `pool`, asked `samples` times.
async fn earliest(
    app: &App,
    who: &Caller,
    pool: &PoolId,
    count: u32,
    duration_s: u64,
    samples: usize,
    model: Option<&str>,
) -> anyhow::Result<Earliest> {
    let query = EarliestStart {
        pool_id: pool.clone(),
        devices: DeviceRequest {
            class: DeviceClass::Gpu,
            count,
            selector: Selector { gpu_model: model.map(str::to_owned), ..Selector::default() },
            topology: Topology::SameNode,
        },
        duration_s,
        not_before_ms: None,
    };
    let mut latencies = Vec::with_capacity(samples);
    let mut answer = None;
    let mut asked_at = 0;
    let mut timed_out = false;
    for _ in 0..samples {
        asked_at = wall_ms();
        let started = Instant::now();
        match tokio::time::timeout(EARLIEST_LIMIT, app.earliest_start(who, &query)).await {
            Ok(result) => answer = result?,
            Err(_) => {
                timed_out = true;
                latencies.push(started.elapsed());
                break;
            }
        }
        latencies.push(started.elapsed());
    }
    latencies.sort();
    let tried: i64 = match answer {
        Some(at) if !timed_out => {
            let mut tx = app.db().begin(TxOptions::READ_ONLY).await?;
            let tried = sql::query_scalar(
                "SELECT 1 + count(DISTINCT ((ts_ms(upper(during)) + 999) / 1000) * 1000)
                 FROM device_bookings
                 WHERE pool_id = $1 AND upper(during) > ms_ts($2) AND upper(during) <= ms_ts($3)
                   AND NOT isempty(during)",
            )
            .bind(pool.as_str())
            .bind(asked_at)
            .bind(at)
            .fetch_one(tx.conn())
            .await?;
            tx.commit().await?;
            tried
        }
        _ => 1 + MAX_CANDIDATE_STARTS,
    };
    Ok(Earliest { answer: answer.map(|at| at - asked_at), tried, latencies, timed_out })
}

fn builtin_auth(tenants: &[TenantId]) -> anyhow::Result<Arc<BuiltinAuthorizer>> {
    let mut config = String::new();
    for tenant in tenants {
        config.push_str(&format!("[[tenants]]\nid = \"{tenant}\"\nparent = \"root\"\n\n"));
    }
    config.push_str(&format!(
        r#"
        [[identities]]
        identity = "ops@root"
        tenant = "root"
        token = "{ROOT_TOKEN}"
        admin = true

        [[identities]]
        identity = "user@t01"
        tenant = "t01"
        token = "{USER_TOKEN}"

        [[identities]]
        identity = "user@t05"
        tenant = "t05"
        token = "{SMALL_TENANT_TOKEN}"

        [[grants]]
        tenant = "t01"
        identity = "*"
        pool = "*"
        relation = "user"
        "#
    ));
    Ok(Arc::new(BuiltinAuthorizer::from_toml(&config).context("the bench's auth config")?))
}

/// The API (and the event stream) on a real port, without the worker or the projection daemon.
struct Server {
    base: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Server {
    async fn start(db: &Db, tenants: &[TenantId]) -> anyhow::Result<Server> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let options =
            ServeOptions { role: ServeRole::Api, events: super::fanout::events_config(), ..ServeOptions::default() };
        let task = tokio::spawn(bc_api::service::serve_with(
            db.clone(),
            builtin_auth(tenants)?,
            listener,
            options,
            async move {
                stopped.await.ok();
            },
        ));
        Ok(Server { base, stop, task })
    }

    async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.task.await.context("join the server")?
    }
}

/// Follows `GET /v1/events?after=` with `token` until the event at `last` arrives. Returns the events received.
async fn sse_catch_up(base: &str, token: &str, after: Position, last: Position) -> anyhow::Result<u64> {
    let client = reqwest::Client::builder().build()?;
    let mut reply = client.get(format!("{base}/v1/events?after={after}")).bearer_auth(token).send().await?;
    ensure!(reply.status().is_success(), "the event stream answered {}", reply.status());
    let wanted = format!("id: {last}\n");
    let mut buffer: Vec<u8> = Vec::new();
    let mut received = 0u64;
    while let Some(chunk) = reply.chunk().await? {
        buffer.extend_from_slice(&chunk);
        let mut consumed = 0;
        while let Some(end) = find(&buffer[consumed..], b"\n\n") {
            let message = &buffer[consumed..consumed + end + 2];
            consumed += end + 2;
            if message.starts_with(b"id: ") {
                received += 1;
                if message.starts_with(wanted.as_bytes()) {
                    return Ok(received);
                }
            } else if find(message, b"event: cut-off").is_some() || find(message, b"event: error").is_some() {
                bail!("the catch-up stream ended early: {}", String::from_utf8_lossy(message));
            }
        }
        buffer.drain(..consumed);
    }
    bail!("the catch-up stream ended after {received} events without reaching {last}")
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

/// The log read as the SSE catch-up reads it (batches of 500 after a position, one read-only transaction each),
/// without rendering or sending anything. Returns the events read.
async fn read_log(db: &Db, after: Position, last: Position) -> anyhow::Result<u64> {
    let mut cursor = after;
    let mut read = 0u64;
    while cursor < last {
        let mut tx = db.begin(TxOptions::READ_ONLY).await?;
        let batch = events::read_after(&mut tx, cursor, 500).await?;
        tx.commit().await?;
        let Some(tail) = batch.last() else { break };
        cursor = tail.position;
        read += batch.iter().filter(|event| event.position <= last).count() as u64;
    }
    Ok(read)
}

fn position_of(row: &sqlx::postgres::PgRow) -> anyhow::Result<Position> {
    let epoch: i32 = row.try_get("log_epoch")?;
    let txid: String = row.try_get("txid")?;
    let seq: i64 = row.try_get("seq")?;
    Ok(format!("{epoch}-{txid}-{seq}").parse()?)
}

/// The position `back` events before the end of the log, and the last event's.
async fn log_positions(db: &Db, back: u64) -> anyhow::Result<(Position, Position)> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    // Ordered by the columns, qualified: a bare `txid` would name the text alias and sort "1003" before "775".
    let query = "SELECT e.log_epoch, e.txid::text AS txid, e.seq FROM events AS e
                 ORDER BY e.log_epoch DESC, e.txid DESC, e.seq DESC OFFSET $1 LIMIT 1";
    let last = sql::query(query).bind(0i64).fetch_one(tx.conn()).await?;
    let from = sql::query(query).bind(back as i64).fetch_optional(tx.conn()).await?;
    tx.commit().await?;
    let from = match from {
        Some(row) => position_of(&row)?,
        None => Position::START,
    };
    Ok((from, position_of(&last)?))
}

/// Table, index and total sizes of the tables that grow with the fleet.
async fn print_sizes(db: &Db) -> anyhow::Result<()> {
    let tables = [
        "events",
        "device_bookings",
        "reservations",
        "allocations",
        "devices",
        "nodes",
        "work_queue",
        "quota_usage",
        "pool_capacity_holds_v1",
        "pool_capacity_nodes_v1",
        "pool_capacity_rollup_v1",
        "pools_v2",
        "nodes_v2",
        "reservations_v3",
    ];
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let rows = sql::query(
        "SELECT c.relname::text AS name, c.reltuples::int8 AS rows, pg_table_size(c.oid) AS heap,
                pg_indexes_size(c.oid) AS indexes, pg_total_relation_size(c.oid) AS total
         FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
         WHERE n.nspname = 'public' AND c.relname = ANY($1::text[])
         ORDER BY pg_total_relation_size(c.oid) DESC",
    )
    .bind(&tables[..])
    .fetch_all(tx.conn())
    .await?;
    let database: i64 = sql::query_scalar("SELECT pg_database_size(current_database())").fetch_one(tx.conn()).await?;
    let index_rows = sql::query(
        "SELECT i.indexrelid::regclass::text AS name, pg_relation_size(i.indexrelid) AS size
         FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indrelid
         WHERE c.relname IN ('events', 'device_bookings', 'reservations')
         ORDER BY pg_relation_size(i.indexrelid) DESC",
    )
    .fetch_all(tx.conn())
    .await?;
    tx.commit().await?;
    let mib = |bytes: i64| bytes as f64 / (1024.0 * 1024.0);
    println!("  table sizes (rows as estimated by ANALYZE; MiB):");
    println!("    {:<26} {:>12} {:>10} {:>10} {:>10}", "table", "rows", "heap", "indexes", "total");
    for row in rows {
        let name: String = row.try_get("name")?;
        println!(
            "    {name:<26} {:>12} {:>10.1} {:>10.1} {:>10.1}",
            row.try_get::<i64, _>("rows")?.max(0),
            mib(row.try_get("heap")?),
            mib(row.try_get("indexes")?),
            mib(row.try_get("total")?),
        );
    }
    println!("  indexes of events, device_bookings and reservations (MiB):");
    for row in index_rows {
        let name: String = row.try_get("name")?;
        println!("    {name:<40} {:>10.1}", mib(row.try_get("size")?));
    }
    println!("  database: {:.1} MiB", mib(database));
    Ok(())
}

fn print_latencies(label: &str, latencies: &[Duration]) {
    println!(
        "{label}: p50 {:.1} ms, p99 {:.1} ms ({} samples)",
        millis(percentile(latencies, 0.5)),
        millis(percentile(latencies, 0.99)),
        latencies.len()
    );
}

fn hours(ms: Option<i64>) -> String {
    ms.map_or_else(|| "none (the search gave up)".to_owned(), |ms| format!("now + {:.2} h", ms as f64 / 3_600_000.0))
}

// ---------------------------------------------------------------------------------------------------------------

/// Runs the fleet benchmark and prints its figures.
pub async fn fleet(config: FleetBenchConfig) -> anyhow::Result<()> {
    ensure!(config.nodes >= POOLS * 4, "--nodes must be at least {}", POOLS * 4);
    let more: &[(&str, &str)] = if config.statements { &STATEMENTS_SETTINGS } else { &[] };
    let bench = BenchCluster::start_with(config.data_dir.as_deref(), config.keep || config.generate_only, more).await?;
    let db = bench.db.clone();
    let bulk = bench.bulk_db();
    let tenants = tenants()?;
    println!(
        "fleet benchmark: PostgreSQL {}, durable cluster in {}, {} CPUs; {} nodes x {GPUS} H100s in {POOLS} pools, {} \
         reservations",
        bench.version,
        bench.root.display(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        config.nodes,
        config.reservations,
    );
    println!();

    // Site, pools and offers through the commands, dated before the generated history on the simulated clock.
    let generation = Instant::now();
    let now_ms = db_now_ms(&db).await?;
    let window_start_ms = now_ms - PAST_MS;
    let created_ms = window_start_ms - 4 * DAY_MS;
    let app = App::new(db.clone());
    let owner = bench_caller("operator@bench")?;
    let step = Instant::now();
    clock::use_sim_clock(&db, created_ms).await?;
    let setup = async {
        let site = bench_site(&app, &owner).await?;
        let mut pools = Vec::with_capacity(POOLS);
        for p in 0..POOLS {
            let pool = app.create_pool(&owner, h100_pool(&site, &format!("fleet-{p:02}"))).await?.value;
            let atoms = (config.nodes.div_ceil(POOLS) * GPUS) as u32;
            offer_to_all(&app, &owner, &pool, &tenants.0, atoms).await?;
            pools.push(pool);
        }
        anyhow::Ok((site, pools))
    }
    .await;
    clock::restore_system_clock(&db).await?;
    let (site, pools) = setup?;
    println!(
        "  setup through the commands (site, {POOLS} pools, {} offers): {:.1} s",
        POOLS * TENANTS,
        step.elapsed().as_secs_f64()
    );

    let mut fleet = Fleet {
        now_ms,
        created_ms,
        registered_ms: window_start_ms - 3 * DAY_MS,
        window_start_ms,
        window_end_ms: now_ms + AHEAD_MS,
        site,
        pools,
        tenants: tenants.0.clone(),
        identities: tenants.1.clone(),
        nodes: config.nodes,
        timelines: Vec::new(),
        plans: Vec::new(),
    };
    debug_assert!(fleet.created_ms < fleet.registered_ms);
    let metadata = metadata(&fleet)?;
    let step = Instant::now();
    let node_events = generate_nodes(&bulk, &fleet, &metadata).await?;
    println!(
        "  nodes: {} nodes, {} devices and {node_events} node.registered events in {:.1} s",
        config.nodes,
        config.nodes * GPUS,
        step.elapsed().as_secs_f64()
    );
    // The pools read model (which the capacity read checks visibility against) has everything it handles now.
    let pools_model =
        models::read_models().into_iter().find(|m| m.name() == "pools").context("the pools read model")?;
    run_to_head(&db, &pools_model, 2_000).await?;

    let step = Instant::now();
    plan_reservations(&mut fleet, config.reservations)?;
    let fleet = Arc::new(fleet);
    println!(
        "  plans: {} reservations on {} GPU groups in {:.1} s",
        fleet.plans.len(),
        fleet.timelines.len(),
        step.elapsed().as_secs_f64()
    );
    let step = Instant::now();
    let gist = booking_gist_indexes(&bulk).await?;
    ensure!(gist.len() == 1, "device_bookings has {} GiST indexes, not the exclusion constraint's alone", gist.len());
    drop_booking_indexes(&bulk, &gist).await?;
    let (summary, log, times) = generate_inline(&bulk, &fleet).await?;
    finish_inline(&bulk, &summary).await?;
    let indexing = Instant::now();
    restore_booking_indexes(&bulk, &gist).await?;
    let indexing = indexing.elapsed();
    let states: Vec<String> = summary.by_state.iter().map(|(state, n)| format!("{state} {n}")).collect();
    println!(
        "  inline state: {} reservations ({}), {} allocations' bookings rows, in {:.1} s",
        fleet.plans.len(),
        states.join(", "),
        summary.counters.bookings,
        step.elapsed().as_secs_f64()
    );
    println!(
        "    of which INSERTs: reservations {:.1} s, allocations {:.1} s, device_bookings {:.1} s (without the \
         exclusion constraint's GiST index), work_queue and commit {:.1} s; then the exclusion constraint made again \
         {:.1} s",
        times.reservations.as_secs_f64(),
        times.allocations.as_secs_f64(),
        times.bookings.as_secs_f64(),
        times.work_queue.as_secs_f64(),
        indexing.as_secs_f64()
    );
    let step = Instant::now();
    let reservation_events = generate_events(&bulk, &fleet, &metadata, log).await?;
    ensure!(reservation_events == summary.events, "{reservation_events} events written, {} expected", summary.events);
    let took = step.elapsed().as_secs_f64();
    println!(
        "  reservation events: {reservation_events} in time order in {took:.1} s ({:.0} events/s)",
        reservation_events as f64 / took
    );
    let step = Instant::now();
    let mut maintenance = bench.guard.cluster.connect_options("bench").connect().await?;
    sqlx::raw_sql("VACUUM (ANALYZE)").execute(&mut maintenance).await.context("vacuum the bench database")?;
    maintenance.close().await.ok();
    println!("  VACUUM (ANALYZE): {:.1} s", step.elapsed().as_secs_f64());
    println!("  generation in all: {:.1} s", generation.elapsed().as_secs_f64());
    println!();
    if config.generate_only {
        println!(
            "kept in {root}: start it with `pg_ctl start -D {root}/pgdata -o \"-k {root}/run -p 5432\"` (as the \
             folder's owner) and connect with `psql -h {root}/run -U postgres bench`",
            root = bench.root.display()
        );
        bulk.close().await;
        db.close().await;
        drop(bench);
        return Ok(());
    }

    // The baselines' database: an empty fleet of 64 nodes in the same cluster.
    let (empty_db, empty_pool) = empty_database(&bench, &tenants.0).await?;
    let empty_app = App::new(empty_db.clone());

    if config.verify {
        let step = Instant::now();
        let mut tx = bulk.begin(TxOptions::READ_COMMITTED).await?;
        let applied = inline::rebuild_into(&mut tx, "fleet_verify").await?;
        let mut differing = Vec::new();
        for table in inline::TABLES {
            let differences = inline::differences(&mut tx, "fleet_verify", table).await?;
            if differences != 0 {
                differing.push(format!("{table} {differences}"));
                for (from, to) in [("public", "fleet_verify"), ("fleet_verify", "public")] {
                    let query = format!(
                        "SELECT row_to_json(d)::text FROM (TABLE {from}.{table} EXCEPT ALL TABLE {to}.{table}) AS d LIMIT 2"
                    );
                    let rows: Vec<String> =
                        sqlx::query_scalar(sqlx::AssertSqlSafe(query)).persistent(false).fetch_all(tx.conn()).await?;
                    for row in rows {
                        println!("    only in {from}.{table}: {row}");
                    }
                }
            }
        }
        tx.rollback().await;
        ensure!(
            differing.is_empty(),
            "the inline tables rebuilt from the log differ from the generated ones: {}",
            differing.join(", ")
        );
        println!(
            "  verified: the log ({applied} events) replayed through the inline projections gives exactly the \
             generated inline tables ({:.1} s)",
            step.elapsed().as_secs_f64()
        );
        println!();
    }

    // Baselines: pgbench's one-row INSERT, INSERT ... SELECT of the newest part of the log.
    let narrow = bench.one_row_insert_script().await?;
    let seconds = config.run_for.as_secs().max(1);
    let run = PgbenchRun {
        script: &narrow,
        database: "bench",
        clients: config.clients as u32,
        seconds,
        name: "1-row INSERT",
        env: &[],
    };
    let inserts = pgbench(&bench.bins, &bench.guard.cluster, run)?;
    let (resume_from, head) = log_positions(&db, config.resume_events).await?;
    let mut tx = bulk.begin(TxOptions::READ_COMMITTED).await?;
    sqlx::raw_sql(
        "CREATE TABLE bench_copy (stream_id text, stream_version int, event_type text, payload bytea, metadata bytea)",
    )
    .execute(tx.conn())
    .await?;
    tx.commit().await?;
    let started = Instant::now();
    let mut tx = bulk.begin(TxOptions::READ_COMMITTED).await?;
    let copied = sql::query(
        "INSERT INTO bench_copy SELECT stream_id, stream_version, event_type, payload, metadata FROM events
         WHERE (log_epoch, txid, seq) > ($1, $2::text::xid8, $3)",
    )
    .bind(resume_from.epoch as i32)
    .bind(resume_from.txid.to_string())
    .bind(resume_from.seq as i64)
    .execute(tx.conn())
    .await?
    .rows_affected();
    tx.commit().await?;
    let baseline = copied as f64 / started.elapsed().as_secs_f64();
    let mut tx = bulk.begin(TxOptions::READ_COMMITTED).await?;
    sqlx::raw_sql("DROP TABLE bench_copy").execute(tx.conn()).await?;
    tx.commit().await?;
    println!(
        "  baselines: pgbench 1-row INSERT, {} clients: {inserts:.0} tx/s; INSERT ... SELECT of the newest {copied} \
         events: {baseline:.0} rows/s",
        config.clients
    );
    println!();

    // The capacity rollup from 0-0-0 over the whole log, then its read.
    let rollup = models::read_models()
        .into_iter()
        .find(|m| m.name() == "pool_capacity_rollup")
        .context("the pool_capacity_rollup read model")?;
    let (passed, took) = run_to_head(&db, &rollup, 500).await?;
    let rate = passed as f64 / took.as_secs_f64();
    println!(
        "  pool_capacity_rollup from 0-0-0: {passed} events in {:.1} s, {rate:.0} events/s, ratio to INSERT ... SELECT \
         {:.3}",
        took.as_secs_f64(),
        rate / baseline
    );
    let busy = fleet.pools[0].clone();
    let normal = fleet.pools[1].clone();
    let t01 = tenant_caller(&tenants.0[1], &tenants.1[1]);
    let mut latencies = Vec::with_capacity(200);
    let mut capacity = Vec::new();
    for _ in 0..200 {
        let started = Instant::now();
        capacity = app.pool_capacity(&t01, &busy, None).await?;
        latencies.push(started.elapsed());
    }
    latencies.sort();
    print_latencies(
        "  capacity read of the busy pool (App::pool_capacity, as GET /v1/pools/{id}/capacity)",
        &latencies,
    );
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let inline_row = sql::query(
        "SELECT coalesce(sum(count) FILTER (WHERE state IN ('binding', 'active', 'releasing')), 0)::int8 AS allocated,
                coalesce(sum(count) FILTER (WHERE state = 'placed'), 0)::int8 AS reserved
         FROM reservations WHERE pool_id = $1",
    )
    .bind(busy.as_str())
    .fetch_one(tx.conn())
    .await?;
    tx.commit().await?;
    let (allocated, reserved): (i64, i64) = (inline_row.try_get("allocated")?, inline_row.try_get("reserved")?);
    let read = capacity.first().context("the busy pool has a rollup row")?;
    println!(
        "    rollup: {read:?}; the inline reservations say allocated {allocated}, reserved {reserved}: {}",
        if read.allocated == allocated && read.reserved == reserved { "the same" } else { "DIFFERENT" }
    );
    println!();
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    sqlx::raw_sql("ANALYZE pool_capacity_rollup_v1, pool_capacity_nodes_v1, pool_capacity_holds_v1")
        .execute(tx.conn())
        .await?;
    tx.commit().await?;
    print_sizes(&db).await?;
    println!();
    if config.statements {
        let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
        sqlx::raw_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").execute(tx.conn()).await?;
        tx.commit().await?;
    }

    // Placement through the command, into the big fleet and into the empty database's pool.
    println!(
        "  placement: {} clients (tenants t00 to t03; t00 holds 30% of the bookings), each reserving then cancelling, \
         {seconds} s per run; pgbench 1-row INSERT {inserts:.0} tx/s",
        config.clients
    );
    let week = Duration::from_secs(7 * 24 * 3600);
    // The last run names the pool's own GPU model: a selector every atom matches, read like no selector.
    let runs = [
        (1, None, "now", None),
        (8, None, "now", None),
        (1, Some(week), "+7 d", None),
        (8, Some(week), "+7 d", None),
        (8, Some(week), "+7 d", Some(FLEET_MODEL)),
    ];
    for (count, ahead, when, model) in runs {
        let label = format!("{count}-{}{}", when.replace(['+', ' '], ""), model.unwrap_or_default());
        let spec =
            PlacementSpec { count, ahead, model, clients: config.clients, run_for: config.run_for, label: &label };
        let when = format!("{when}{}", model.map(|m| format!(", {m}")).unwrap_or_default());
        let big = placement_run(&app, &tenants, &normal, &spec).await?;
        let small = placement_run(&empty_app, &tenants, &empty_pool, &spec).await?;
        println!(
            "    {count} GPU(s) {when:>5}: fleet pool p50 {:>6.1} ms p99 {:>6.1} ms {:>6.1} cycles/s (ratio to 1-row \
             INSERT {:.4}, {} placed, {} pending, retries per cycle {}) | empty pool p50 {:>6.1} ms p99 {:>6.1} ms \
             {:>6.1} cycles/s | p50 ratio {:.2}",
            millis(big.p50),
            millis(big.p99),
            big.cycles_per_s,
            big.cycles_per_s / inserts,
            big.placed,
            big.pending,
            big.retries,
            millis(small.p50),
            millis(small.p99),
            small.cycles_per_s,
            millis(big.p50) / millis(small.p50).max(0.001),
        );
    }
    // The same requests from one client: what the placement costs on its own, with no other command queued on
    // the two cores beside it (with several clients, each waits for the others' statements too).
    if config.clients > 1 {
        println!("  the same placements from one client (tenant t00), fleet pool:");
        for (count, ahead, when, model) in runs {
            let label = format!("one-{count}-{}{}", when.replace(['+', ' '], ""), model.unwrap_or_default());
            let spec = PlacementSpec { count, ahead, model, clients: 1, run_for: config.run_for, label: &label };
            let when = format!("{when}{}", model.map(|m| format!(", {m}")).unwrap_or_default());
            if config.statements {
                reset_statements(&db).await?;
            }
            let one = placement_run(&app, &tenants, &normal, &spec).await?;
            println!(
                "    {count} GPU(s) {when:>5}: p50 {:>6.1} ms p99 {:>6.1} ms {:>6.1} cycles/s ({} placed, {} pending, \
                 retries per cycle {})",
                millis(one.p50),
                millis(one.p99),
                one.cycles_per_s,
                one.placed,
                one.pending,
                one.retries,
            );
            if config.statements {
                print_statements(&db).await?;
            }
        }
    }
    println!();

    // The earliest-start query on the busy pool (and on the empty pool for the questions of one hour).
    println!("  earliest start (App::earliest_start, as tenant t01):");
    let asks = [
        (1, 3600, 20, None),
        (8, 3600, 20, None),
        (8, 3600, 20, Some(FLEET_MODEL)),
        (8, 4 * 3600, 3, None),
        (8, 24 * 3600, 1, None),
    ];
    for (count, duration_s, samples, model) in asks {
        let asked = earliest(&app, &t01, &busy, count, duration_s, samples, model).await?;
        let latencies = &asked.latencies;
        let answer = if asked.timed_out {
            format!("no answer within {} s", EARLIEST_LIMIT.as_secs())
        } else {
            format!("{} after {} candidate start(s)", hours(asked.answer), asked.tried)
        };
        let mut line = format!(
            "    busy pool, {count} GPU(s) for {:>2} h{}: {answer}: p50 {:.1} ms, max {:.1} ms ({} samples)",
            duration_s / 3600,
            model.map(|m| format!(", {m}")).unwrap_or_default(),
            millis(percentile(latencies, 0.5)),
            millis(latencies.last().copied().unwrap_or_default()),
            latencies.len(),
        );
        if duration_s == 3600 {
            let small = earliest(&empty_app, &t01, &empty_pool, count, duration_s, samples, model).await?.latencies;
            line.push_str(&format!(
                " | empty pool p50 {:.1} ms, ratio {:.2}",
                millis(percentile(&small, 0.5)),
                millis(percentile(latencies, 0.5)) / millis(percentile(&small, 0.5)).max(0.001)
            ));
        }
        println!("{line}");
    }
    println!();

    // SSE: fan-out on the empty database and on the big one, then catch-up from far back.
    for (label, app, pool, database) in
        [("empty database", &empty_app, &empty_pool, &empty_db), ("fleet database", &app, &normal, &db)]
    {
        let server = Server::start(database, &tenants.0).await?;
        let spec = FanOutSpec {
            base: &server.base,
            token: USER_TOKEN,
            who: &t01,
            pool,
            subscribers: config.subscribers,
            rate: FANOUT_RATE,
            run_for: config.run_for,
        };
        let seen = fan_out(app, &spec).await?;
        server.stop().await?;
        println!(
            "  SSE fan-out, {label}: {} subscribers, {} reservations at {:.0}/s: commit-to-delivery p50 {:.1} ms, p99 \
             {:.1} ms, max {:.1} ms over {} deliveries; {} missing, {} cut off",
            config.subscribers,
            seen.reservations,
            seen.reservations as f64 / config.run_for.as_secs_f64(),
            millis(seen.p50),
            millis(seen.p99),
            millis(seen.max),
            seen.deliveries,
            seen.missing,
            seen.cut_off,
        );
    }
    let started = Instant::now();
    let read = read_log(&db, resume_from, head).await?;
    let read_rate = read as f64 / started.elapsed().as_secs_f64();
    println!(
        "  reading the newest {read} events as the catch-up does (batches of 500), no rendering: {read_rate:.0} events/s"
    );
    let server = Server::start(&db, &tenants.0).await?;
    let started = Instant::now();
    let received = sse_catch_up(&server.base, ROOT_TOKEN, resume_from, head).await?;
    let rate = received as f64 / started.elapsed().as_secs_f64();
    println!(
        "  SSE catch-up as the platform (every event) from {read} events back: {received} events in {:.1} s, {rate:.0} \
         events/s, ratio to the plain read {:.3}",
        started.elapsed().as_secs_f64(),
        rate / read_rate
    );
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let tenant_last = sql::query(
        "SELECT e.log_epoch, e.txid::text AS txid, e.seq FROM events AS e WHERE e.tenant_id = 't05'
         ORDER BY e.log_epoch DESC, e.txid DESC, e.seq DESC LIMIT 1",
    )
    .fetch_optional(tx.conn())
    .await?;
    tx.commit().await?;
    if let Some(row) = tenant_last {
        let last = position_of(&row)?;
        if last > resume_from {
            let started = Instant::now();
            let received = sse_catch_up(&server.base, SMALL_TENANT_TOKEN, resume_from, last).await?;
            println!(
                "  SSE catch-up as tenant t05 from the same position, no audit trail built: {received} of its events \
                 in {:.1} s ({:.0} log events/s read)",
                started.elapsed().as_secs_f64(),
                read as f64 / started.elapsed().as_secs_f64()
            );
            // As a served system runs: the audit trail's read model built, so a tenant's catch-up reads its own
            // events through that model's index by tenant.
            let audit = models::read_models()
                .into_iter()
                .find(|m| m.name() == "audit_events")
                .context("the audit_events read model")?;
            let (passed, took) = run_to_head(&db, &audit, framework::DaemonConfig::default().batch).await?;
            let started = Instant::now();
            let received = sse_catch_up(&server.base, SMALL_TENANT_TOKEN, resume_from, last).await?;
            println!(
                "  SSE catch-up as tenant t05 from the same position, through the audit trail (built from {passed} \
                 events in {:.1} s): {received} of its events in {:.1} s",
                took.as_secs_f64(),
                started.elapsed().as_secs_f64(),
            );
        }
    }
    server.stop().await?;

    empty_db.close().await;
    bulk.close().await;
    db.close().await;
    drop(bench);
    Ok(())
}
