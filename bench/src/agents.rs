//! `better-compute bench agents`: a fleet of simulated machines joined through the join command, the heartbeats
//! per second the control plane absorbs (through the command layer and through `POST /v1/agent/heartbeat`)
//! beside pgbench's one-row INSERT, and how long a node whose agent stops stays schedulable while the liveness
//! sweep runs as the service runs it.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bc_agent::client::{Client as AgentClient, ServerTrust};
use bc_domain::agent::{Heartbeat, JoinRequest};
use bc_domain::id::{NodeId, SessionId};
use bc_domain::inventory::SectionHashes;
use bc_eventstore::{Db, DbConfig, TxOptions, sql};
use tokio::net::TcpListener;

use super::reserve::{bench_caller, bench_site, h100_pool};
use super::{BenchCluster, PgbenchRun, millis, percentile, pgbench, wall_ms};
use bc_api::http::AppState;
use bc_commands::App;
use bc_commands::agents::{LivenessConfig, NodeAuth};
use bc_commands::worker::{Worker, WorkerConfig};

/// Connections the app's pool may hold: fewer than the 64-client runs have clients, as in production, where
/// the service's pool (20 by default) is smaller than its fleet.
const APP_CONNECTIONS: u32 = 32;
/// Tasks that join machines, authenticate them and run the warm-up round.
const SETUP_TASKS: usize = 16;
/// Client counts of the heartbeat throughput runs.
const CLIENT_COUNTS: [usize; 2] = [16, 64];
/// The liveness sweep's period, the service's default.
const SWEEP: Duration = Duration::from_secs(1);
/// Tasks that keep the live sessions heartbeating during the detection run.
const BEATERS: usize = 16;
/// How often the detection run reads the stopped node's row.
const POLL: Duration = Duration::from_millis(10);
/// The lease of every session outside the detection run: long enough that no session lapses while the
/// throughput runs leave some of them alone, and that sessions outside the detection run's live set stay
/// connected without costing heartbeats.
const LONG_LEASE: Duration = Duration::from_secs(3600);

/// What `bench agents` measures.
#[derive(Debug, Clone)]
pub struct AgentsBenchConfig {
    /// Simulated machines joined.
    pub agents: usize,
    /// How long each heartbeat throughput run lasts.
    pub run_for: Duration,
    /// The liveness lease during the detection run; agents heartbeat every quarter of it.
    pub lease: Duration,
    /// Agents stopped, one at a time, in the detection run.
    pub samples: usize,
    pub data_dir: Option<PathBuf>,
    pub keep: bool,
}

/// One joined simulated machine, as its agent knows it.
struct SimAgent {
    host: String,
    credential: String,
    auth: NodeAuth,
    session: SessionId,
    /// The node's generation when the session opened (1 after a join), sent as observed.
    generation: u64,
}

impl SimAgent {
    fn beat(&self) -> Heartbeat {
        Heartbeat {
            session_id: self.session.clone(),
            observed_generation: self.generation,
            clock_ms: wall_ms(),
            gpu_utilization: Vec::new(),
        }
    }
}

/// Runs `task(i)` for every `i` below `count` from `tasks` concurrent tasks. Returns the results in order of `i`.
pub(crate) async fn each<T, F, Fut>(count: usize, tasks: usize, task: F) -> anyhow::Result<Vec<T>>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<T>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..tasks.clamp(1, count.max(1)) {
        let (next, task) = (Arc::clone(&next), task.clone());
        set.spawn(async move {
            let mut done = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return anyhow::Ok(done);
                }
                done.push((i, task(i).await?));
            }
        });
    }
    let mut results: Vec<Option<T>> = (0..count).map(|_| None).collect();
    while let Some(done) = set.join_next().await {
        for (i, value) in done.context("join a task")?? {
            results[i] = Some(value);
        }
    }
    results.into_iter().map(|value| value.context("a task left a result out")).collect()
}

/// What a throughput run measured: calls per second and every call's latency, sorted.
struct Timed {
    rate: f64,
    latencies: Vec<Duration>,
}

/// Runs `call(client, n)` from `clients` tasks until `run_for` has passed, timing each call.
async fn drive_timed<F, Fut>(clients: usize, run_for: Duration, call: F) -> anyhow::Result<Timed>
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let started = Instant::now();
    let deadline = started + run_for;
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..clients {
        let call = call.clone();
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            let mut n = 0u64;
            while Instant::now() < deadline {
                let at = Instant::now();
                call(client, n).await?;
                latencies.push(at.elapsed());
                n += 1;
            }
            anyhow::Ok(latencies)
        });
    }
    let mut latencies = Vec::new();
    while let Some(done) = tasks.join_next().await {
        latencies.extend(done.context("join a client")??);
    }
    let rate = latencies.len() as f64 / started.elapsed().as_secs_f64();
    latencies.sort();
    Ok(Timed { rate, latencies })
}

/// The `n`th agent of `client`'s share (the agents whose index is `client` modulo `clients`), cycling.
fn share(agents: usize, clients: usize, client: usize, n: u64) -> usize {
    let count = (agents - client).div_ceil(clients);
    client + clients * (n % count as u64) as usize
}

async fn count(db: &Db, query: &'static str) -> anyhow::Result<i64> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let n: i64 = sql::query_scalar(query).fetch_one(tx.conn()).await?;
    tx.commit().await?;
    Ok(n)
}

/// One heartbeat through the API, sent by `bcd`'s own client.
async fn http_beat(client: &AgentClient, agent: &SimAgent) -> anyhow::Result<()> {
    let reply = client.with_credential(&agent.credential).heartbeat(&agent.beat()).await.context("the heartbeat")?;
    anyhow::ensure!(reply.spec.is_none(), "the heartbeat sent the spec again: the observed generation is stale");
    Ok(())
}

fn print_run(what: &str, run: &Timed, inserts: f64) {
    println!(
        "    {what:<26} {:>6.0}/s   ratio to pgbench 1-row INSERT {:.3}   p50 {:.2} ms, p99 {:.2} ms",
        run.rate,
        run.rate / inserts,
        millis(percentile(&run.latencies, 0.5)),
        millis(percentile(&run.latencies, 0.99)),
    );
}

/// A live agent of the detection run: stopped by the bench, and when its last heartbeat returned.
#[derive(Default)]
struct Liveness {
    stopped: bool,
    last_ok: Option<Instant>,
}

/// What the background heartbeaters saw.
struct Beaten {
    /// How late each heartbeat started against its schedule, sorted.
    lateness: Vec<Duration>,
    errors: u64,
    last_error: Option<String>,
}

/// Keeps `live` agents heartbeating every `interval` from `BEATERS` tasks, each agent at its own offset within
/// the interval, until `stop` is set. A heartbeat holds its agent's lock, so whoever takes the lock afterwards
/// sees the last heartbeat that will ever return.
fn beat_in_background(
    app: &App,
    agents: &Arc<Vec<SimAgent>>,
    live: &Arc<Vec<tokio::sync::Mutex<Liveness>>>,
    interval: Duration,
    stop: &Arc<AtomicBool>,
) -> tokio::task::JoinSet<Beaten> {
    let mut tasks = tokio::task::JoinSet::new();
    let start = tokio::time::Instant::now();
    for beater in 0..BEATERS.min(live.len()) {
        let (app, agents, live, stop) = (app.clone(), Arc::clone(agents), Arc::clone(live), Arc::clone(stop));
        tasks.spawn(async move {
            let mine: Vec<usize> = (beater..live.len()).step_by(BEATERS).collect();
            let spacing = interval / mine.len().max(1) as u32;
            let stagger = spacing / BEATERS as u32 * beater as u32;
            let mut seen = Beaten { lateness: Vec::new(), errors: 0, last_error: None };
            let mut round = 0u32;
            while !stop.load(Ordering::Relaxed) {
                for (slot, &i) in mine.iter().enumerate() {
                    let due = start + interval * round + spacing * slot as u32 + stagger;
                    tokio::time::sleep_until(due).await;
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    seen.lateness.push(tokio::time::Instant::now().saturating_duration_since(due));
                    let mut state = live[i].lock().await;
                    if state.stopped {
                        continue;
                    }
                    match app.heartbeat(&agents[i].auth, &agents[i].beat()).await {
                        Ok(_) => state.last_ok = Some(Instant::now()),
                        Err(err) => {
                            seen.errors += 1;
                            seen.last_error = Some(err.to_string());
                        }
                    }
                }
                round += 1;
            }
            seen.lateness.sort();
            seen
        });
    }
    tasks
}

/// The node's schedulability and connectivity as the scheduler sees them.
async fn node_row(db: &Db, node: &NodeId) -> anyhow::Result<(bool, String)> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let row: (bool, String) = sql::query_as("SELECT schedulable, connectivity FROM nodes WHERE id = $1")
        .bind(node.as_str())
        .fetch_one(tx.conn())
        .await?;
    tx.commit().await?;
    Ok(row)
}

/// Reads the node's row every `POLL` until `done` holds for it; returns when it first did. Gives up after `limit`.
async fn wait_for(
    db: &Db,
    node: &NodeId,
    limit: Duration,
    done: impl Fn(bool, &str) -> bool,
) -> anyhow::Result<Instant> {
    let started = Instant::now();
    loop {
        let (schedulable, connectivity) = node_row(db, node).await?;
        if done(schedulable, &connectivity) {
            return Ok(Instant::now());
        }
        anyhow::ensure!(started.elapsed() < limit, "node {node} did not change within {} s", limit.as_secs());
        tokio::time::sleep(POLL).await;
    }
}

/// Runs the agents benchmark and prints its figures.
pub async fn agents(config: AgentsBenchConfig) -> anyhow::Result<()> {
    let bench = BenchCluster::start(config.data_dir.as_deref(), config.keep).await?;
    let narrow = bench.one_row_insert_script().await?;
    // A pool of the app's own, small enough that pgbench's 64 clients fit beside it under the cluster's 100
    // connections (sqlx may open more connections than there are concurrent users, up to its maximum).
    bench.db.close().await;
    let db = Db::connect_lazy_with(
        bench.guard.cluster.connect_options("bench"),
        &DbConfig { max_connections: APP_CONNECTIONS, ..DbConfig::default() },
    );
    let count_agents = config.agents.max(1);
    let seconds = config.run_for.as_secs().max(1);
    println!(
        "agents benchmark: PostgreSQL {}, durable cluster in {}, {} CPUs, {count_agents} simulated 1xH100 machines, \
         {seconds} s per run",
        bench.version,
        bench.root.display(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    );
    println!();

    // Setup and throughput runs use a long lease; the detection run switches to the short one.
    let mut setup_app = App::new(db.clone());
    setup_app.liveness = LivenessConfig { lease: LONG_LEASE, ..LivenessConfig::default() };
    let owner = bench_caller("operator@bench")?;
    let site = bench_site(&setup_app, &owner).await?;
    let pool = setup_app.create_pool(&owner, h100_pool(&site, "agents")).await?.value;

    // Tokens are issued one after another: each appends to the pool's stream, and concurrent issues for one pool
    // race for its next version until some run out of retries.
    let started = Instant::now();
    let tokens = {
        let (app, owner, pool) = (setup_app.clone(), owner.clone(), pool.clone());
        each(count_agents, 1, move |_| {
            let (app, owner, pool) = (app.clone(), owner.clone(), pool.clone());
            async move { Ok(app.create_join_token(&owner, &pool, 3600).await?.value.token) }
        })
        .await?
    };
    let tokens_took = started.elapsed();
    let spec: bc_agent::simulate::Simulated =
        "1xH100".parse().map_err(|err: String| anyhow::anyhow!(err)).context("parse the simulated machine")?;
    let tokens = Arc::new(tokens);
    let started = Instant::now();
    let joined = {
        let (app, tokens) = (setup_app.clone(), Arc::clone(&tokens));
        each(count_agents, SETUP_TASKS, move |i| {
            let (app, tokens, spec) = (app.clone(), Arc::clone(&tokens), spec.clone());
            async move {
                let host = format!("sim-{:05}", i + 1);
                let document = bc_agent::simulate::inventory(&host, &spec);
                let request = JoinRequest {
                    join_token: tokens[i].clone(),
                    agent_version: bc_agent::VERSION.to_owned(),
                    inventory: document.report(&SectionHashes::new()),
                    csr: None,
                    role: None,
                };
                let joined = app.join(request).await.with_context(|| format!("join {host}"))?;
                anyhow::ensure!(!joined.rejoined, "{host} was taken for a machine that already joined");
                Ok((host, joined))
            }
        })
        .await?
    };
    let joins_took = started.elapsed();
    // A real agent's credential is looked up on every request; here once per agent, up front.
    let agents: Arc<Vec<SimAgent>> = {
        let app = setup_app.clone();
        let joined = Arc::new(joined);
        let agents = each(count_agents, SETUP_TASKS, move |i| {
            let (app, joined) = (app.clone(), Arc::clone(&joined));
            async move {
                let (host, j) = &joined[i];
                let auth = app.authenticate_node(&j.credential).await?;
                anyhow::ensure!(auth.node_id == j.node_id, "{host}'s credential names another node");
                Ok(SimAgent {
                    host: host.clone(),
                    credential: j.credential.clone(),
                    auth,
                    session: j.session.session_id.clone(),
                    generation: j.session.generation,
                })
            }
        })
        .await?;
        Arc::new(agents)
    };
    // The first heartbeat of each node records that it observed generation 1 (a command with an event); every
    // later one takes the one-statement path.
    let started = Instant::now();
    {
        let (app, agents) = (setup_app.clone(), Arc::clone(&agents));
        each(count_agents, SETUP_TASKS, move |i| {
            let (app, agents) = (app.clone(), Arc::clone(&agents));
            async move {
                app.heartbeat(&agents[i].auth, &agents[i].beat()).await?;
                Ok(())
            }
        })
        .await?;
    }
    let warm_up_took = started.elapsed();
    let ready = count(
        &db,
        "SELECT count(*) FROM nodes WHERE connectivity = 'connected' AND schedulable AND observed_generation = generation",
    )
    .await?;
    anyhow::ensure!(ready == count_agents as i64, "{ready} of {count_agents} nodes are connected and schedulable");
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    sqlx::raw_sql("ANALYZE").execute(tx.conn()).await?;
    tx.commit().await?;
    let rate = |took: Duration| count_agents as f64 / took.as_secs_f64();
    println!("  setup, one pool:");
    println!(
        "    join tokens     {count_agents} in {:>6.1} s  {:>6.1}/s   (one task)",
        tokens_took.as_secs_f64(),
        rate(tokens_took)
    );
    println!(
        "    joins           {count_agents} in {:>6.1} s  {:>6.1}/s   ({SETUP_TASKS} tasks; App::join, a whole 1xH100 inventory each)",
        joins_took.as_secs_f64(),
        rate(joins_took)
    );
    println!(
        "    first heartbeats {count_agents} in {:>5.1} s  {:>6.1}/s   ({SETUP_TASKS} tasks; each records NodeSpecObserved); \
         all {ready} nodes connected and schedulable",
        warm_up_took.as_secs_f64(),
        rate(warm_up_took)
    );

    // The API on a real port, over an app with the same liveness settings; no worker, no projection daemon.
    let state = AppState::new(setup_app.clone()).context("check the method table")?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, bc_api::http::router(state))
            .with_graceful_shutdown(async move {
                server_stopped.await.ok();
            })
            .await
    });

    let (mut direct_best, mut http_best) = (0f64, 0f64);
    for clients in CLIENT_COUNTS {
        let clients = clients.min(count_agents);
        let run = PgbenchRun::one_row_inserts(&narrow, clients, seconds);
        let inserts = pgbench(&bench.bins, &bench.guard.cluster, run)?;
        let events_before = count(&db, "SELECT count(*) FROM events").await?;
        let direct = {
            let (app, agents) = (setup_app.clone(), Arc::clone(&agents));
            drive_timed(clients, config.run_for, move |client, n| {
                let (app, agents) = (app.clone(), Arc::clone(&agents));
                async move {
                    let agent = &agents[share(agents.len(), clients, client, n)];
                    let reply = app.heartbeat(&agent.auth, &agent.beat()).await?;
                    anyhow::ensure!(reply.spec.is_none(), "the heartbeat sent the spec again");
                    Ok(())
                }
            })
            .await?
        };
        // What the API does for a heartbeat, without HTTP: the credential's lookup, then the heartbeat.
        let looked_up = {
            let (app, agents) = (setup_app.clone(), Arc::clone(&agents));
            drive_timed(clients, config.run_for, move |client, n| {
                let (app, agents) = (app.clone(), Arc::clone(&agents));
                async move {
                    let agent = &agents[share(agents.len(), clients, client, n)];
                    let auth = app.authenticate_node(&agent.credential).await?;
                    app.heartbeat(&auth, &agent.beat()).await?;
                    Ok(())
                }
            })
            .await?
        };
        // The heartbeat's transaction around the cheapest statement: what the executor's envelope costs alone.
        let envelope = {
            let db = db.clone();
            drive_timed(clients, config.run_for, move |_, _| {
                let db = db.clone();
                async move {
                    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
                    sql::query("INSERT INTO bench_narrow (id) VALUES (1)").execute(tx.conn()).await?;
                    tx.commit().await?;
                    Ok(())
                }
            })
            .await?
        };
        let http_client = AgentClient::new(&url, &ServerTrust::InsecureHttp)?;
        let through_http = {
            let (client, agents) = (http_client.clone(), Arc::clone(&agents));
            drive_timed(clients, config.run_for, move |c, n| {
                let (client, agents) = (client.clone(), Arc::clone(&agents));
                async move { http_beat(&client, &agents[share(agents.len(), clients, c, n)]).await }
            })
            .await?
        };
        let events = count(&db, "SELECT count(*) FROM events").await? - events_before;
        println!();
        println!(
            "  {clients} clients; each heartbeating client cycles through its {} sessions ({events} events appended by \
             the heartbeats):",
            count_agents.div_ceil(clients)
        );
        print_run("heartbeat, command layer", &direct, inserts);
        print_run("heartbeat + lookup, direct", &looked_up, inserts);
        print_run("heartbeat, HTTP API", &through_http, inserts);
        print_run("1-row INSERT, executor", &envelope, inserts);
        println!(
            "    HTTP / command layer {:.3}; lookup = authenticate_node then heartbeat, as the API does; executor = \
             Db::begin, the INSERT, Tx::commit (the heartbeat's envelope); pgbench 1-row INSERT, {clients} clients: \
             {inserts:.0} tx/s",
            through_http.rate / direct.rate
        );
        direct_best = direct_best.max(direct.rate);
        http_best = http_best.max(through_http.rate);
    }
    let _ = stop_server.send(());
    server.await.context("join the server")?.context("serve HTTP")?;
    println!();
    for (what, capacity) in [("command layer", direct_best), ("HTTP API", http_best)] {
        let half = capacity / 2.0;
        println!(
            "  at half the {what}'s best rate ({capacity:.0}/s): {count_agents} agents at one heartbeat every {:.1} s \
             need {half:.0}/s",
            count_agents as f64 / half
        );
    }

    // Detection: the short lease, agents heartbeating every quarter of it, the sweep every second.
    let lease = config.lease;
    let interval = lease / 4;
    let mut app = App::new(db.clone());
    app.liveness = LivenessConfig { lease, heartbeat: interval };
    let affordable = (direct_best / 2.0 * interval.as_secs_f64()) as usize;
    let samples = config.samples.max(1);
    let live_count = count_agents.min(affordable.max(samples + 1));
    let live: Arc<Vec<tokio::sync::Mutex<Liveness>>> =
        Arc::new((0..live_count).map(|_| tokio::sync::Mutex::new(Liveness::default())).collect());
    let stop_beating = Arc::new(AtomicBool::new(false));
    let mut beaters = beat_in_background(&app, &agents, &live, interval, &stop_beating);
    let (stop_worker, worker_stopped) = tokio::sync::watch::channel(false);
    let worker = Worker::new(app.clone(), WorkerConfig { liveness_sweep: SWEEP, ..WorkerConfig::default() });
    let worker = tokio::spawn(worker.run(worker_stopped));
    println!();
    if live_count < count_agents {
        println!(
            "  detection: lease {} ms, heartbeats every {} ms, sweep every {} ms; {live_count} of {count_agents} agents \
             heartbeat ({:.0}/s, half the command layer's best: all {count_agents} would need {:.0}/s); the other {} \
             keep the one-hour lease of their last heartbeat",
            lease.as_millis(),
            interval.as_millis(),
            SWEEP.as_millis(),
            live_count as f64 / interval.as_secs_f64(),
            count_agents as f64 / interval.as_secs_f64(),
            count_agents - live_count,
        );
    } else {
        println!(
            "  detection: lease {} ms, heartbeats every {} ms, sweep every {} ms; all {count_agents} agents heartbeat \
             ({:.0}/s)",
            lease.as_millis(),
            interval.as_millis(),
            SWEEP.as_millis(),
            live_count as f64 / interval.as_secs_f64(),
        );
    }
    // Let every live session move to the short lease and the sweep settle.
    tokio::time::sleep(lease).await;
    let limit = lease * 3 + SWEEP * 5;
    let mut detected = Vec::with_capacity(samples);
    let mut unreachable = None;
    for sample in 0..samples {
        let i = sample * live_count / samples;
        let last_ok = {
            let mut state = live[i].lock().await;
            state.stopped = true;
            state.last_ok.context("the agent never heartbeat")?
        };
        let node = &agents[i].auth.node_id;
        let off = wait_for(&db, node, limit, |schedulable, _| !schedulable).await?;
        let took = off.saturating_duration_since(last_ok);
        println!("    {}: unschedulable {:>6.0} ms after its last heartbeat", agents[i].host, millis(took));
        detected.push(took);
        if sample + 1 == samples {
            let at = wait_for(&db, node, limit, |_, connectivity| connectivity == "unreachable").await?;
            unreachable = Some((agents[i].host.clone(), at.saturating_duration_since(last_ok)));
        }
    }
    stop_beating.store(true, Ordering::Relaxed);
    let mut lateness = Vec::new();
    let (mut errors, mut last_error) = (0, None);
    while let Some(seen) = beaters.join_next().await {
        let seen = seen.context("join a heartbeater")?;
        lateness.extend(seen.lateness);
        errors += seen.errors;
        last_error = last_error.or(seen.last_error);
    }
    lateness.sort();
    let _ = stop_worker.send(true);
    worker.await.context("join the worker")?;
    let others = count(&db, "SELECT count(*) FROM nodes WHERE connectivity <> 'connected'").await?;
    detected.sort();
    println!(
        "    median {:.0} ms over {} samples (min {:.0}, max {:.0}); expected about the lease ({} ms) plus up to one \
         sweep period ({} ms)",
        millis(percentile(&detected, 0.5)),
        detected.len(),
        millis(detected.first().copied().unwrap_or_default()),
        millis(detected.last().copied().unwrap_or_default()),
        lease.as_millis(),
        SWEEP.as_millis(),
    );
    if let Some((host, took)) = unreachable {
        println!(
            "    {host}: unreachable {:.0} ms after its last heartbeat (twice the lease is {} ms)",
            millis(took),
            (lease * 2).as_millis()
        );
    }
    println!(
        "    background heartbeats started late against their schedule by p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; \
         {errors} failed{}; nodes not connected at the end: {others} (the {samples} stopped)",
        millis(percentile(&lateness, 0.5)),
        millis(percentile(&lateness, 0.99)),
        millis(lateness.last().copied().unwrap_or_default()),
        last_error.map(|e| format!(" (last: {e})")).unwrap_or_default(),
    );

    db.close().await;
    drop(bench);
    Ok(())
}
