//! `better-compute-bench webhooks`: signed webhook deliveries to a local receiver (axum on 127.0.0.1, answering
//! 200 at once) through the service's deliverer, beside pgbench's one-row INSERT on the same cluster in the same
//! run. Two figures: deliveries per second with a backlog waiting (events committed before the deliverer
//! starts, one and eight subscriptions), and the time from a command's commit to the receiver holding its event
//! (p50, p99) while a writer commits events at a steady pace.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use bc_api::webhooks::WebhookConfig;
use bc_commands::fleet::CreateSite;
use bc_commands::{App, Caller};
use bc_domain::site::SiteKind;
use bc_domain::webhook::WebhookSpec;
use tokio::sync::watch;

use super::reserve::bench_caller;
use super::{BenchCluster, PgbenchRun, millis, percentile, pgbench};

/// What `bench webhooks` measures.
#[derive(Debug, Clone)]
pub struct WebhooksBenchConfig {
    /// Events in the backlog each subscription is delivered.
    pub backlog: usize,
    /// Events per second the latency run commits, and for how long.
    pub rate: u32,
    pub run_for: Duration,
    pub data_dir: Option<PathBuf>,
    pub keep: bool,
}

/// The receiver's record: when each (subscription path, message id) first arrived, and how many arrived.
#[derive(Debug, Default)]
struct Arrivals {
    first: HashMap<(String, String), Instant>,
    count: usize,
}

#[derive(Clone)]
struct Receiver {
    arrivals: Arc<Mutex<Arrivals>>,
    count: Arc<watch::Sender<usize>>,
}

async fn receive(State(receiver): State<Receiver>, uri: axum::http::Uri, headers: HeaderMap, _body: Bytes) {
    let id = headers.get("webhook-id").and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let count = {
        let mut arrivals = receiver.arrivals.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        arrivals.first.entry((uri.path().to_owned(), id)).or_insert_with(Instant::now);
        arrivals.count += 1;
        arrivals.count
    };
    receiver.count.send_replace(count);
}

impl Receiver {
    async fn start() -> anyhow::Result<(Receiver, String)> {
        let receiver = Receiver { arrivals: Arc::default(), count: Arc::new(watch::channel(0).0) };
        let router = axum::Router::new().fallback(receive).with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        tokio::spawn(async move { axum::serve(listener, router).await });
        Ok((receiver, url))
    }

    /// Waits until `n` deliveries arrived in all.
    async fn until(&self, n: usize) -> anyhow::Result<()> {
        let mut count = self.count.subscribe();
        tokio::time::timeout(Duration::from_secs(600), count.wait_for(|c| *c >= n)).await??;
        Ok(())
    }

    fn reset(&self) {
        *self.arrivals.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Arrivals::default();
        self.count.send_replace(0);
    }
}

fn deliverer() -> WebhookConfig {
    WebhookConfig { poll: Duration::from_millis(250), scan: Duration::from_millis(100), ..WebhookConfig::default() }
}

/// Commits `n` `site.created` events, one command each.
async fn sites(app: &App, owner: &Caller, prefix: &str, n: usize) -> anyhow::Result<Vec<(String, Instant)>> {
    let mut committed = Vec::with_capacity(n);
    for i in 0..n {
        let create =
            CreateSite { name: format!("{prefix}{i}"), iam_region: "eu-west-1".into(), kind: SiteKind::Shared };
        let made = app.create_site(owner, create).await?;
        let position = made.position.map(|p| p.to_string()).unwrap_or_default();
        committed.push((format!("evt_{position}"), Instant::now()));
    }
    Ok(committed)
}

/// Subscribes `n` receivers' paths to `site.created`.
async fn subscribe(app: &App, owner: &Caller, url: &str, n: usize) -> anyhow::Result<Vec<String>> {
    let mut paths = Vec::new();
    for s in 0..n {
        let path = format!("/s{s}");
        let spec = WebhookSpec {
            url: format!("{url}{path}"),
            event_types: vec!["site.created".into()],
            description: String::new(),
        };
        app.create_webhook(owner, spec).await?;
        paths.push(path);
    }
    Ok(paths)
}

/// Runs the webhooks benchmark and prints its figures.
pub async fn webhooks(config: WebhooksBenchConfig) -> anyhow::Result<()> {
    let bench = BenchCluster::start_with(config.data_dir.as_deref(), config.keep, &[]).await?;
    let db = bench.db.clone();
    let narrow = bench.one_row_insert_script().await?;
    let pki = bench.root.join("pki");
    bc_pki::Bundle::init(&pki, &bc_pki::InitOptions::default())?;
    let app = App::new(db.clone()).with_pki(Arc::new(bc_pki::Bundle::load(&pki)?));
    let owner = bench_caller("operator@bench")?;
    let (receiver, url) = Receiver::start().await?;
    println!(
        "webhooks benchmark: PostgreSQL {}, durable cluster in {}, {} CPUs; a backlog of {} events per \
         subscription, then {} events/s for {} s",
        bench.version,
        bench.root.display(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        config.backlog,
        config.rate,
        config.run_for.as_secs(),
    );
    // The baseline: a delivery is one commit (the cursor) after one HTTP round trip, from one task per sink.
    let seconds = config.run_for.as_secs().max(1);
    let inserts = pgbench(&bench.bins, &bench.guard.cluster, PgbenchRun::one_row_inserts(&narrow, 1, seconds))?;
    println!("  pgbench 1-row INSERT, 1 client: {inserts:>8.0} tx/s");
    println!();

    for subscriptions in [1usize, 8] {
        receiver.reset();
        let prefix = format!("b{subscriptions}-");
        let paths = subscribe(&app, &owner, &url, subscriptions).await?;
        sites(&app, &owner, &prefix, config.backlog).await?;
        let (stop, stopped) = watch::channel(false);
        let started = Instant::now();
        let task = tokio::spawn(bc_api::webhooks::run(app.clone(), deliverer(), stopped));
        receiver.until(config.backlog * subscriptions).await?;
        let elapsed = started.elapsed();
        let _ = stop.send(true);
        task.await?;
        let rate = (config.backlog * subscriptions) as f64 / elapsed.as_secs_f64();
        println!(
            "  backlog, {} subscription(s): {rate:>7.0} deliveries/s (ratio to the 1-row INSERT {:.3}; {} in {:.2} s)",
            paths.len(),
            rate / inserts,
            config.backlog * subscriptions,
            elapsed.as_secs_f64(),
        );
        // The next run's subscriptions are its own.
        for hook in app.webhook_ids().await? {
            app.delete_webhook(&owner, &hook).await?;
        }
    }

    // Commit-to-delivery at a steady pace, one subscription.
    receiver.reset();
    subscribe(&app, &owner, &url, 1).await?;
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(bc_api::webhooks::run(app.clone(), deliverer(), stopped));
    // The deliverer is holding its lease and following the log once a first event arrives.
    sites(&app, &owner, "warm-", 1).await?;
    receiver.until(1).await?;
    let events = (u64::from(config.rate) * config.run_for.as_secs().max(1)) as usize;
    let pause = Duration::from_secs(1) / config.rate.max(1);
    let mut committed = Vec::with_capacity(events);
    let mut tick = tokio::time::interval(pause);
    for i in 0..events {
        tick.tick().await;
        committed.extend(sites(&app, &owner, &format!("l{i}-"), 1).await?);
    }
    receiver.until(events + 1).await?;
    let _ = stop.send(true);
    task.await?;
    let mut latencies: Vec<Duration> = {
        let arrivals = receiver.arrivals.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        committed
            .iter()
            .filter_map(|(id, at)| {
                arrivals.first.get(&("/s0".to_owned(), id.clone())).map(|got| got.duration_since(*at))
            })
            .collect()
    };
    latencies.sort();
    println!(
        "  commit-to-delivery at {} events/s: p50 {:.2} ms, p99 {:.2} ms over {} deliveries",
        config.rate,
        millis(percentile(&latencies, 0.5)),
        millis(percentile(&latencies, 0.99)),
        latencies.len(),
    );
    db.close().await;
    drop(bench);
    Ok(())
}
