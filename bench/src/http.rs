//! `better-compute bench http`: reserve-then-release cycles through the HTTP API (a real port, bearer tokens,
//! the authorizer) next to the same cycles through the command layer directly, both at 16 clients and beside
//! pgbench's one-row INSERT; then SSE fan-out: subscribers on `GET /v1/events` while reservations are made, and
//! the time from each reservation's commit to its `reservation.placed` reaching every subscriber.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bc_client::Client;
use bc_domain::id::PoolId;
use bc_wire::reservations::ReserveBody;
use serde_json::json;
use tokio::net::TcpListener;

use super::fanout::{FanOutSpec, WRITERS, fan_out};
use super::reserve::{bench_site, bulk_fleet, gpu_request, h100_pool};
use super::{BenchCluster, CpuReading, PgbenchRun, drive, millis, percentile, pgbench};
use bc_commands::auth::builtin::BuiltinAuthorizer;
use bc_commands::fleet::OfferPool;
use bc_commands::reservations::Reserve;
use bc_commands::{App, Caller};

/// Clients of the throughput runs.
const CLIENTS: usize = 16;
/// The tenant every reservation is made for, a user of the pool with the attribute limit of `dev`.
const TENANT: &str = "acme";
const IDENTITY: &str = "bench@acme";
const TOKEN: &str = "bench-token-0123456789abcdef";

/// What `bench http` measures.
#[derive(Debug, Clone)]
pub struct HttpBenchConfig {
    /// How long each throughput run and the fan-out run last.
    pub run_for: Duration,
    /// SSE subscribers of the fan-out run.
    pub subscribers: usize,
    /// Reservations per second made during the fan-out run.
    pub rate: u32,
    pub data_dir: Option<PathBuf>,
    pub keep: bool,
}

fn auth_config() -> String {
    format!(
        r#"
        [[tenants]]
        id = "{TENANT}"
        parent = "root"

        [[identities]]
        identity = "{IDENTITY}"
        tenant = "{TENANT}"
        token = "{TOKEN}"

        [[grants]]
        tenant = "{TENANT}"
        identity = "*"
        pool = "*"
        relation = "user"

        [[limits]]
        pool = "*"
        relation = "user"
        gpu_model = "H100"
        max_gpus = 8
        max_hours = 72
        "#
    )
}

/// The caller the command layer sees for an HTTP request of the bench's token.
fn caller() -> anyhow::Result<Caller> {
    let mut caller = Caller::new(TENANT.parse()?, IDENTITY.parse()?, "user");
    caller.ancestors = vec!["root".parse()?];
    Ok(caller)
}

/// One reserve-then-cancel cycle through the HTTP API.
async fn http_cycle(client: &Client, pool: &PoolId, key: String) -> anyhow::Result<()> {
    http_cycle_timed(client, pool, key).await.map(|_| ())
}

/// One reserve-then-cancel cycle through the HTTP API, with the typed client a user of the API would use;
/// returns how long the reserve took, from sending the request to decoding the whole answer.
async fn http_cycle_timed(client: &Client, pool: &PoolId, key: String) -> anyhow::Result<Duration> {
    let body: ReserveBody =
        serde_json::from_value(json!({ "poolId": pool, "devices": { "class": "gpu", "count": 1 }, "duration": 3600 }))?;
    let at = Instant::now();
    let reserved = client.reserve(&body, &key).await.context("reserve")?;
    let took = at.elapsed();
    client.cancel(&reserved.id, None).await.context("cancel")?;
    Ok(took)
}

/// A reserve's latency with one client: p50 and p99 of `reserve` over cycles of reserve-then-cancel run for
/// `run_for`, through the command layer and through HTTP.
struct OneClient {
    direct: (Duration, Duration),
    http: (Duration, Duration),
    cycles: (usize, usize),
}

async fn one_client(
    app: &App,
    who: &Caller,
    client: &Client,
    pool: &PoolId,
    run_for: Duration,
) -> anyhow::Result<OneClient> {
    let mut direct = Vec::new();
    let deadline = Instant::now() + run_for;
    while Instant::now() < deadline {
        let key = format!("one-direct-{}", direct.len());
        let at = Instant::now();
        let reserved = app.reserve(who, Reserve { idempotency_key: key, request: gpu_request(pool, 1) }).await?;
        direct.push(at.elapsed());
        app.cancel_reservation(who, &reserved.value.reservation.id, None).await?;
    }
    let mut http = Vec::new();
    let deadline = Instant::now() + run_for;
    while Instant::now() < deadline {
        let key = format!("one-http-{}", http.len());
        http.push(http_cycle_timed(client, pool, key).await?);
    }
    direct.sort();
    http.sort();
    Ok(OneClient {
        direct: (percentile(&direct, 0.5), percentile(&direct, 0.99)),
        http: (percentile(&http, 0.5), percentile(&http, 0.99)),
        cycles: (direct.len(), http.len()),
    })
}

/// Runs the HTTP and SSE benchmark and prints its figures.
pub async fn http(config: HttpBenchConfig) -> anyhow::Result<()> {
    let bench = BenchCluster::start(config.data_dir.as_deref(), config.keep).await?;
    let db = bench.db.clone();
    let narrow = bench.one_row_insert_script().await?;
    let ceiling_script = bench.ceiling_script().await?;

    let app = App::new(db.clone());
    let owner = super::reserve::bench_caller("operator@bench")?;
    let site = bench_site(&app, &owner).await?;
    let pool = app.create_pool(&owner, h100_pool(&site, "cycles")).await?.value;
    bulk_fleet(&db, &pool, &site, 0, 64, 8, 0).await?;
    let offer = OfferPool {
        tenant_id: TENANT.parse()?,
        quota: [("gpu".to_owned(), 100_000)].into(),
        priority: 0,
        include_descendants: false,
    };
    app.offer_pool(&owner, &pool, offer).await?;
    super::reserve::warm_up(&app, &db, &pool).await?;

    // The service as `serve` runs it (worker and projection daemon included), on a real port.
    let auth = Arc::new(BuiltinAuthorizer::from_toml(&auth_config()).context("the bench's auth config")?);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let options = bc_api::service::ServeOptions {
        events: super::fanout::events_config(),
        ..bc_api::service::ServeOptions::default()
    };
    let server = tokio::spawn(bc_api::service::serve_with(db.clone(), auth, listener, options, async move {
        stopped.await.ok();
    }));

    let seconds = config.run_for.as_secs().max(1);
    println!(
        "http benchmark: PostgreSQL {}, durable cluster in {}, {} CPUs, {seconds} s per run, server on {base}",
        bench.version,
        bench.root.display(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    );
    println!();

    let who = caller()?;
    let http_client = Client::new(&base, Some(TOKEN.to_owned()), None)?;
    let one = one_client(&app, &who, &http_client, &pool, config.run_for / 2).await?;
    let cpu_start = CpuReading::now(&bench.guard.cluster).await;
    let direct = {
        let (app, pool) = (app.clone(), pool.clone());
        drive(CLIENTS, config.run_for, move |client, n| {
            let (app, pool, who) = (app.clone(), pool.clone(), who.clone());
            async move {
                let key = format!("direct-{client}-{n}");
                let reserved =
                    app.reserve(&who, Reserve { idempotency_key: key, request: gpu_request(&pool, 1) }).await?;
                app.cancel_reservation(&who, &reserved.value.reservation.id, None).await?;
                Ok(())
            }
        })
        .await?
    };
    let cpu_between = CpuReading::now(&bench.guard.cluster).await;
    let through_http = {
        let (client, pool) = (http_client.clone(), pool.clone());
        drive(CLIENTS, config.run_for, move |c, n| {
            let (client, pool) = (client.clone(), pool.clone());
            async move { http_cycle(&client, &pool, format!("http-{c}-{n}")).await }
        })
        .await?
    };
    let cpu_end = CpuReading::now(&bench.guard.cluster).await;
    let run = PgbenchRun {
        script: &narrow,
        database: "bench",
        clients: CLIENTS as u32,
        seconds,
        name: "1-row INSERT",
        env: &[],
    };
    let inserts = pgbench(&bench.bins, &bench.guard.cluster, run)?;
    let run = PgbenchRun {
        script: &ceiling_script,
        database: "bench",
        clients: CLIENTS as u32,
        seconds,
        name: "the ceiling",
        env: &[],
    };
    let ceiling = pgbench(&bench.bins, &bench.guard.cluster, run)?;
    println!(
        "  one client, a reserve's latency (each followed by its cancel), {} and {} cycles:",
        one.cycles.0, one.cycles.1
    );
    println!("    command layer  p50 {:.2} ms   p99 {:.2} ms", millis(one.direct.0), millis(one.direct.1));
    println!("    HTTP API       p50 {:.2} ms   p99 {:.2} ms", millis(one.http.0), millis(one.http.1));
    println!();
    println!("  {CLIENTS} clients, reserve-then-release cycles (two commands each), tenant {TENANT} as a pool user:");
    println!(
        "    command layer  {direct:>7.1} cycles/s   ratio to pgbench 1-row INSERT {:.4}   to the ceiling {:.3}",
        direct / inserts,
        direct / ceiling
    );
    println!(
        "    HTTP API       {through_http:>7.1} cycles/s   ratio to pgbench 1-row INSERT {:.4}   to the ceiling {:.3}   \
         to the command layer {:.3}",
        through_http / inserts,
        through_http / ceiling,
        through_http / direct
    );
    if let (Some(a), Some(b), Some(c)) = (cpu_start, cpu_between, cpu_end) {
        let seconds = config.run_for.as_secs_f64();
        let (direct_server, direct_ours) = a.per(&b, direct * seconds);
        let (http_server, http_ours) = b.per(&c, through_http * seconds);
        println!(
            "    CPU a cycle: command layer PostgreSQL {direct_server:.2} ms, this process {direct_ours:.2} ms; HTTP \
             PostgreSQL {http_server:.2} ms, this process (server and client) {http_ours:.2} ms (ratio of all CPU {:.3})",
            (direct_server + direct_ours) / (http_server + http_ours).max(f64::MIN_POSITIVE),
        );
    }
    println!(
        "    pgbench 1-row INSERT, {CLIENTS} clients: {inserts:.0} tx/s; the ceiling (bench/ceiling.sql): {ceiling:.1} \
         cycles/s, {:.3} of the INSERT",
        ceiling / inserts
    );

    // SSE fan-out.
    let who = caller()?;
    let spec = FanOutSpec {
        base: &base,
        token: TOKEN,
        who: &who,
        pool: &pool,
        subscribers: config.subscribers,
        rate: config.rate,
        run_for: config.run_for,
    };
    let seen = fan_out(&app, &spec).await?;
    println!();
    println!(
        "  SSE fan-out: {} subscribers of reservation.placed, {} reservations made over {seconds} s by {WRITERS} \
         writers through the command layer ({:.0}/s):",
        config.subscribers,
        seen.reservations,
        seen.reservations as f64 / config.run_for.as_secs_f64()
    );
    println!(
        "    commit-to-delivery over {} deliveries: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; {} missing, {} \
         subscribers cut off",
        seen.deliveries,
        millis(seen.p50),
        millis(seen.p99),
        millis(seen.max),
        seen.missing,
        seen.cut_off,
    );

    let _ = stop.send(());
    server.await.context("join the server")??;
    db.close().await;
    drop(bench);
    Ok(())
}
