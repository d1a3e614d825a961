//! `better-compute bench reserve`: reserve-then-release cycles per second with 1, 4 and 16 clients, beside
//! pgbench's one-row INSERT on the same cluster in the same run (and the same cycles for a GPU that also holds
//! vCPUs and memory, which are placed statement by statement); and the latency of placing one 8-GPU request in
//! a pool of 1,000 nodes with 8 GPUs each, half of them booked (the fleet generated with bulk SQL, not commands).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bc_domain::device::DeviceClass;
use bc_domain::id::{PoolId, SiteId};
use bc_domain::pool::{PoolAgent, PoolClass, PoolPolicy, Sharing};
use bc_domain::reservation::ReservationRequest;
use bc_domain::site::SiteKind;
use bc_eventstore::{Db, TxOptions};

use super::statement_cpu::{Shape, StatementCpu};
use super::{BenchCluster, CpuReading, PgbenchRun, drive, percentile, pgbench};
use bc_commands::fleet::{CreatePool, CreateSite};
use bc_commands::reservations::Reserve;
use bc_commands::{App, Caller};

/// What `bench reserve` measures.
#[derive(Debug, Clone)]
pub struct ReserveBenchConfig {
    /// How long each throughput run lasts.
    pub run_for: Duration,
    /// How many placements the latency figures are taken over.
    pub samples: usize,
    /// Print the server's time by statement (pg_stat_statements) for the cycles with this many clients ("1", "4",
    /// "16") or for the 8-GPU placements ("placement").
    pub statements: Option<String>,
    /// Print the server's own CPU by statement (`log_statement_stats`) for the cycles with this many clients, and
    /// for the ceiling's run beside them.
    pub statement_cpu: Option<usize>,
    pub data_dir: Option<PathBuf>,
    pub keep: bool,
}

pub(super) fn bench_caller(identity: &str) -> anyhow::Result<Caller> {
    Ok(Caller::new("root".parse()?, identity.parse()?, "bench"))
}

pub(super) fn gpu_request(pool: &PoolId, count: u32) -> ReservationRequest {
    ReservationRequest::hold(pool.clone(), DeviceClass::Gpu, count)
}

/// The benchmarks' site, created through the command.
pub(super) async fn bench_site(app: &App, owner: &Caller) -> anyhow::Result<SiteId> {
    let site = CreateSite { name: "bench".into(), iam_region: "local-1".into(), kind: SiteKind::Shared };
    Ok(app.create_site(owner, site).await?.value)
}

/// An exclusive H100 pool of `site`.
pub(super) fn h100_pool(site: &SiteId, name: &str) -> CreatePool {
    CreatePool {
        site_id: site.clone(),
        name: name.into(),
        class: PoolClass::MetalHost,
        gpu_model: "H100".into(),
        sharing: Sharing::Exclusive,
        agent: PoolAgent::Bcd,
        policy: PoolPolicy::default(),
        provider_account_id: None,
    }
}

/// Inserts `nodes` schedulable nodes with `gpus` H100s each straight into the inline tables, and books every GPU of
/// the first `booked` nodes for the next 30 days. Node and device ids start after `offset`.
pub(super) async fn bulk_fleet(
    db: &Db,
    pool: &PoolId,
    site: &SiteId,
    offset: i64,
    nodes: i64,
    gpus: i64,
    booked: i64,
) -> anyhow::Result<()> {
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    bc_projections::inline::bulk::synthetic_fleet(&mut tx, pool.as_str(), site.as_str(), offset, nodes, gpus, booked)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Runs reserve-then-release cycles from four clients for two seconds, then `ANALYZE`s the database, so that the
/// timed runs start from the plans of a service that has run a while. A fresh database is analyzed nearly empty,
/// and the plans a session keeps (a PL/pgSQL function's, for the life of the connection) were made for tables of a
/// page: a scan of the whole table where an index would read one row, kept while the table grows, until
/// autovacuum analyzes it again up to a minute later.
pub(crate) async fn warm_up(app: &App, db: &Db, pool: &PoolId) -> anyhow::Result<()> {
    cycles(app, pool, 4, Duration::from_secs(2), &[], "warm").await?;
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    sqlx::raw_sql("ANALYZE").execute(tx.conn()).await?;
    tx.commit().await?;
    Ok(())
}

/// Reserve-then-release cycles (a reservation that has not started is released by `cancel`) from `clients`
/// tasks for `run_for`, each of one GPU (with `scalars` beside it). Returns cycles per second.
async fn cycles(
    app: &App,
    pool: &PoolId,
    clients: usize,
    run_for: Duration,
    scalars: &[(&str, u64)],
    tag: &'static str,
) -> anyhow::Result<f64> {
    let (app, pool) = (app.clone(), pool.clone());
    let resources: std::collections::BTreeMap<String, u64> =
        scalars.iter().map(|(r, n)| ((*r).to_owned(), *n)).collect();
    drive(clients, run_for, move |client, n| {
        let (app, pool, resources) = (app.clone(), pool.clone(), resources.clone());
        async move {
            let who = bench_caller(&format!("cycle-{tag}-{clients}-{client}"))?;
            let request = ReservationRequest { resources, ..gpu_request(&pool, 1) };
            let reserved = app.reserve(&who, Reserve { idempotency_key: format!("{tag}{n}"), request }).await?;
            app.cancel_reservation(&who, &reserved.value.reservation.id, None).await?;
            Ok(())
        }
    })
    .await
}

/// What recording each decision's explanation costs: the cycles with and without it (alternating, so the noise
/// of the shared machine falls on both), and a refusal in a full pool of 1,000 nodes, the one path that reads
/// every node of the pool to say why each was passed over.
async fn explanation_cost(
    app: &App,
    db: &Db,
    site: &SiteId,
    cycle_pool: &PoolId,
    config: &ReserveBenchConfig,
) -> anyhow::Result<()> {
    let mut plain = app.clone();
    plain.explain = false;
    println!();
    for clients in [1usize, 16] {
        let with = cycles(app, cycle_pool, clients, config.run_for, &[], "ew").await?;
        let without = cycles(&plain, cycle_pool, clients, config.run_for, &[], "eo").await?;
        println!(
            "  explanations, {clients:>2} clients: {with:>7.1} cycles/s explained, {without:>7.1} without (ratio {:.3})",
            with / without
        );
    }
    let owner = bench_caller("operator@bench")?;
    let full = app.create_pool(&owner, h100_pool(site, "full")).await?.value;
    bulk_fleet(db, &full, site, 300_000, 1_000, 8, 1_000).await?;
    // As after the other pools were written: the planner sees the new rows (the first read would otherwise be
    // planned on statistics without them, seconds instead of milliseconds).
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    sqlx::raw_sql("ANALYZE").execute(tx.conn()).await?;
    tx.commit().await?;
    // Each explained refusal by an identity of its own: an identity's refusals past its budget of node reads a
    // minute are explained without them, which the third run measures.
    let refusals = |app: App, tag: &'static str, one_identity: bool| {
        let full = full.clone();
        async move {
            let mut latencies = Vec::with_capacity(config.samples);
            let budget = if one_identity { bc_commands::auth::DIAGNOSED_REFUSALS_PER_MINUTE as usize } else { 0 };
            for n in 0..budget + config.samples {
                let who = bench_caller(&if one_identity {
                    "refused@bench".to_owned()
                } else {
                    format!("refused-{n}@bench")
                })?;
                let request = ReservationRequest { wait: false, ..gpu_request(&full, 8) };
                let started = Instant::now();
                let refused = app.reserve(&who, Reserve { idempotency_key: format!("{tag}{n}"), request }).await;
                if n >= budget {
                    latencies.push(started.elapsed());
                }
                anyhow::ensure!(
                    refused.as_ref().is_err_and(|err| err.code() == "CAPACITY_UNAVAILABLE"),
                    "a request in a full pool was not refused: {refused:?}"
                );
            }
            latencies.sort();
            Ok::<_, anyhow::Error>(latencies)
        }
    };
    let with = refusals(app.clone(), "rw", false).await?;
    let without = refusals(plain, "ro", false).await?;
    let unread = refusals(app.clone(), "ru", true).await?;
    let ms = |l: &[Duration], p| percentile(l, p).as_secs_f64() * 1000.0;
    println!(
        "  a refusal in a full pool of 1,000 nodes x 8 GPUs ({} samples): p50 {:.1} ms explained (p99 {:.1}), \
         {:.1} ms without (p99 {:.1}); ratio of p50s {:.2}; past its identity's budget of node reads, explained \
         without them: p50 {:.1} ms (p99 {:.1})",
        with.len(),
        ms(&with, 0.5),
        ms(&with, 0.99),
        ms(&without, 0.5),
        ms(&without, 0.99),
        ms(&without, 0.5) / ms(&with, 0.5),
        ms(&unread, 0.5),
        ms(&unread, 0.99),
    );
    Ok(())
}

/// The settings that load pg_stat_statements, nested statements and planning included.
pub(crate) const STATEMENTS_SETTINGS: [(&str, &str); 3] = [
    ("shared_preload_libraries", "'pg_stat_statements'"),
    ("pg_stat_statements.track", "all"),
    ("pg_stat_statements.track_planning", "on"),
];

/// Forgets what pg_stat_statements counted so far.
pub(crate) async fn reset_statements(db: &Db) -> anyhow::Result<()> {
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    sqlx::raw_sql("SELECT pg_stat_statements_reset()").execute(tx.conn()).await?;
    tx.commit().await?;
    Ok(())
}

/// The statements the server spent the most time on since the last reset, nested ones included.
pub(crate) async fn print_statements(db: &Db) -> anyhow::Result<()> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let rows: Vec<(String, i64, f64, f64, bool, f64)> = sqlx::query_as(
        "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 110), calls, total_exec_time, total_plan_time, toplevel,
                wal_bytes::float8 / greatest(calls, 1)
         FROM pg_stat_statements ORDER BY total_exec_time + total_plan_time DESC LIMIT 25",
    )
    .persistent(false)
    .fetch_all(tx.conn())
    .await?;
    tx.commit().await?;
    println!("    statements by server time over these cycles (ms total exec / plan, calls, WAL bytes a call):");
    for (query, calls, exec, plan, toplevel, wal) in rows {
        let level = if toplevel { "top" } else { "   " };
        println!("      {exec:>9.1} {plan:>8.1} {calls:>7} {wal:>8.0} {level} {query}");
    }
    Ok(())
}

/// The backend CPU of each statement shape over `cycles` cycles, most first, and their sum.
fn print_statement_cpu(what: &str, shapes: &std::collections::BTreeMap<String, Shape>, cycles: f64) {
    let cycles = cycles.max(1.0);
    let mut rows: Vec<(&String, &Shape)> = shapes.iter().collect();
    rows.sort_by(|a, b| b.1.cpu.total_cmp(&a.1.cpu));
    let total: f64 = shapes.values().map(|s| s.cpu).sum();
    println!(
        "    {what} statements by the server's own CPU (log_statement_stats): {:.3} ms a cycle in all",
        total * 1000.0 / cycles
    );
    println!("      ms a cycle   calls a cycle   µs CPU a call   µs elapsed a call   statement");
    for (name, shape) in rows {
        let per_cycle = shape.cpu * 1000.0 / cycles;
        if per_cycle < 0.005 {
            continue;
        }
        let calls = shape.calls.max(1) as f64;
        println!(
            "      {per_cycle:>10.3}   {:>13.2}   {:>13.1}   {:>17.1}   {}",
            shape.calls as f64 / cycles,
            shape.cpu * 1e6 / calls,
            shape.elapsed * 1e6 / calls,
            name.chars().take(110).collect::<String>(),
        );
    }
}

/// Runs the reservation benchmark and prints its figures.
pub async fn reserve(config: ReserveBenchConfig) -> anyhow::Result<()> {
    let more: &[(&str, &str)] = if config.statements.is_some() { &STATEMENTS_SETTINGS } else { &[] };
    let bench = BenchCluster::start_with(config.data_dir.as_deref(), config.keep, more).await?;
    let db = bench.db.clone();
    let narrow = bench.one_row_insert_script().await?;
    let ceiling_script = bench.ceiling_script().await?;

    let app = App::new(db.clone());
    let owner = bench_caller("operator@bench")?;
    let site = bench_site(&app, &owner).await?;
    let cycle_pool = app.create_pool(&owner, h100_pool(&site, "cycles")).await?.value;
    let fleet_pool = app.create_pool(&owner, h100_pool(&site, "fleet")).await?.value;
    let scalar_pool = app.create_pool(&owner, h100_pool(&site, "scalars")).await?.value;
    bulk_fleet(&db, &cycle_pool, &site, 0, 64, 8, 0).await?;
    bulk_fleet(&db, &scalar_pool, &site, 200_000, 64, 8, 0).await?;
    // Each of those nodes lends 128 vCPUs and 1,024 GiB: room for every GPU's share of the cycles.
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    sqlx::query(
        "INSERT INTO node_resources (node_id, resource, capacity)
         SELECT n.id, r.resource, r.capacity FROM nodes AS n,
                (VALUES ('vcpu', 128::bigint), ('memoryGiB', 1024::bigint)) AS r(resource, capacity)
         WHERE n.pool_id = $1",
    )
    .bind(scalar_pool.as_str())
    .persistent(false)
    .execute(tx.conn())
    .await?;
    tx.commit().await?;
    bulk_fleet(&db, &fleet_pool, &site, 100_000, 1_000, 8, 500).await?;
    warm_up(&app, &db, &cycle_pool).await?;

    let seconds = config.run_for.as_secs().max(1);
    println!(
        "reserve benchmark: PostgreSQL {}, durable cluster in {}, {} CPUs, {seconds} s per run",
        bench.version,
        bench.root.display(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    );
    println!();
    if config.statements.is_some() {
        let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
        sqlx::raw_sql("CREATE EXTENSION pg_stat_statements").execute(tx.conn()).await?;
        tx.commit().await?;
    }
    // Cycles per second by client count, ours and the ceiling's, for the scaling line after the runs.
    let mut rates: Vec<(usize, f64, f64)> = Vec::new();
    for clients in [1usize, 4, 16] {
        let profiled = config.statements.as_deref() == Some(clients.to_string().as_str());
        if profiled {
            reset_statements(&db).await?;
        }
        let priced = config.statement_cpu == Some(clients);
        let retried = bc_eventstore::retries();
        let pricing = if priced { Some(StatementCpu::start(&bench.guard.cluster).await?) } else { None };
        let cpu_before = CpuReading::now(&bench.guard.cluster).await;
        let rust = cycles(&app, &cycle_pool, clients, config.run_for, &[], "c").await?;
        let cpu_after = CpuReading::now(&bench.guard.cluster).await;
        let ours = match pricing {
            Some(pricing) => Some(pricing.finish(&bench.guard.cluster).await?),
            None => None,
        };
        let retries = crate::retries_per_cycle(&retried, (rust * config.run_for.as_secs_f64()).round() as usize);
        if profiled {
            print_statements(&db).await?;
        }
        let run =
            |script, name| PgbenchRun { script, database: "bench", clients: clients as u32, seconds, name, env: &[] };
        let inserts = pgbench(&bench.bins, &bench.guard.cluster, run(&narrow, "1-row INSERT"))?;
        let pricing = if priced { Some(StatementCpu::start(&bench.guard.cluster).await?) } else { None };
        let ceiling_before = CpuReading::now(&bench.guard.cluster).await;
        let ceiling = pgbench(&bench.bins, &bench.guard.cluster, run(&ceiling_script, "the ceiling"))?;
        let ceiling_after = CpuReading::now(&bench.guard.cluster).await;
        let ceiling_shapes = match pricing {
            Some(pricing) => Some(pricing.finish(&bench.guard.cluster).await?),
            None => None,
        };
        println!(
            "  {clients:>2} clients: {rust:>7.1} reserve-then-release cycles/s   pgbench 1-row INSERT {inserts:>8.0} tx/s \
             (ratio {:.4})   pgbench ceiling {ceiling:>7.1} cycles/s (ratio {:.3}; the ceiling itself {:.3} of the INSERT)   \
             retries per cycle {retries}",
            rust / inserts,
            rust / ceiling,
            ceiling / inserts,
        );
        if let (Some(a), Some(b), Some(c), Some(d)) = (cpu_before, cpu_after, ceiling_before, ceiling_after) {
            // Our cycles ran for `run_for`, pgbench for its whole `seconds`.
            let (server, ours) = a.per(&b, rust * config.run_for.as_secs_f64());
            let (ceiling_server, pgbench_client) = c.per(&d, ceiling * seconds as f64);
            println!(
                "      CPU a cycle: PostgreSQL {server:.2} ms, this process {ours:.2} ms; the ceiling's PostgreSQL \
                 {ceiling_server:.2} ms, pgbench {pgbench_client:.2} ms (ratio of all CPU {:.3})",
                (ceiling_server + pgbench_client) / (server + ours).max(f64::MIN_POSITIVE),
            );
        }
        if let (Some(ours), Some(theirs)) = (ours, ceiling_shapes) {
            print_statement_cpu("these cycles", &ours, rust * config.run_for.as_secs_f64());
            print_statement_cpu("the ceiling's", &theirs, ceiling * seconds as f64);
        }
        rates.push((clients, rust, ceiling));
        let scalars = [("vcpu", 8), ("memoryGiB", 64)];
        let with_scalars = cycles(&app, &scalar_pool, clients, config.run_for, &scalars, "s").await?;
        println!(
            "      with 8 vCPUs and 64 GiB beside the GPU: {with_scalars:>7.1} cycles/s (ratio {:.4} of the INSERT, {:.2} of \
             the GPU alone)",
            with_scalars / inserts,
            with_scalars / rust,
        );
    }
    let rate = |n: usize| rates.iter().find(|(clients, _, _)| *clients == n).map(|&(_, ours, ceiling)| (ours, ceiling));
    if let (Some((ours4, ceiling4)), Some((ours16, ceiling16))) = (rate(4), rate(16)) {
        // Sixteen clients on a machine with fewer cores queue for them: whether the ceiling itself keeps its rate
        // from four to sixteen says how much of ours is the machine's.
        println!(
            "  16 clients / 4 clients: these cycles {:.2}, the ceiling {:.2}",
            ours16 / ours4.max(f64::MIN_POSITIVE),
            ceiling16 / ceiling4.max(f64::MIN_POSITIVE),
        );
    }

    let who = bench_caller("latency@bench")?;
    let placements_profiled = config.statements.as_deref() == Some("placement");
    if placements_profiled {
        reset_statements(&db).await?;
    }
    let mut latencies = Vec::with_capacity(config.samples);
    for n in 0..config.samples {
        let started = Instant::now();
        let reserved = app
            .reserve(&who, Reserve { idempotency_key: format!("l{n}"), request: gpu_request(&fleet_pool, 8) })
            .await?;
        latencies.push(started.elapsed());
        anyhow::ensure!(reserved.value.reservation.allocations.len() == 1, "the 8-GPU request was not placed");
        app.cancel_reservation(&who, &reserved.value.reservation.id, None).await?;
    }
    if placements_profiled {
        print_statements(&db).await?;
    }
    latencies.sort();
    println!();
    println!(
        "  placement of one 8-GPU request among 1,000 nodes x 8 GPUs, half booked ({} samples, the whole reserve \
         command): p50 {:.1} ms, p99 {:.1} ms",
        latencies.len(),
        percentile(&latencies, 0.5).as_secs_f64() * 1000.0,
        percentile(&latencies, 0.99).as_secs_f64() * 1000.0,
    );
    explanation_cost(&app, &db, &site, &cycle_pool, &config).await?;
    db.close().await;
    drop(bench);
    Ok(())
}
