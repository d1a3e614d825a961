//! `better-compute bench projections`: how fast the read models rebuild from a large log (1,000,000 events by
//! default, generated with bulk SQL), beside an `INSERT ... SELECT` writing as many rows in the same run; and
//! their steady-state lag while writers append.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bc_domain::device::DeviceClass;
use bc_domain::event::{DomainEvent, EventMetadata};
use bc_domain::id::{AllocationId, Identity, NodeId, PoolId, ReservationId, TenantId};
use bc_domain::reservation::{Allocation, Cancelled, Placed, Requested, ReservationEvent, ReservationRequest};
use bc_eventstore::events::{self, AppendBatch, ExpectedVersion, NewEvent};
use bc_eventstore::{Db, TxOptions, bulk, lease};
use bc_projections::framework::{self, DaemonConfig, Projection};
use bc_projections::{models, status};

use super::{BenchCluster, PgbenchRun, pgbench};

/// Writers appending during the lag run.
const WRITERS: usize = 8;

/// What `bench projections` measures.
#[derive(Debug, Clone)]
pub struct ProjectionsBenchConfig {
    /// Events in the generated log (a multiple of three: requested, placed, cancelled).
    pub events: u64,
    /// How long the lag run appends.
    pub lag_run: Duration,
    /// The read models to rebuild, by name; all when empty.
    pub only: Vec<String>,
    pub data_dir: Option<std::path::PathBuf>,
    pub keep: bool,
}

/// The three events of one generated reservation, encoded.
fn templates() -> anyhow::Result<Vec<NewEvent>> {
    let tenant: TenantId = "root".parse()?;
    let identity: Identity = "bench@platform".parse()?;
    let pool: PoolId = "pool_01m8q000000000000000000000".parse()?;
    let request = ReservationRequest::hold(pool, DeviceClass::Gpu, 2);
    let at_ms = 1_893_456_000_000;
    let events = [
        ReservationEvent::Requested(Requested {
            reservation_id: ReservationId::derive(&tenant, &identity, "template"),
            tenant_id: tenant.clone(),
            identity: identity.clone(),
            request_hash: request.hash(),
            request,
            priority: 0,
            quota_holder: None,
            pending_deadline_ms: at_ms,
            at_ms,
            explanation: None,
        }),
        ReservationEvent::Placed(Placed {
            allocations: vec![Allocation {
                allocation_id: AllocationId::generate(),
                node_id: NodeId::generate(),
                devices: vec!["GPU-bench-0".parse()?, "GPU-bench-1".parse()?],
                resources: Default::default(),
            }],
            start_ms: at_ms,
            end_ms: at_ms + 3_600_000,
            lease_deadline_ms: None,
            at_ms,
            explanation: None,
        }),
        ReservationEvent::Cancelled(Cancelled { at_ms: at_ms + 60_000, reason: None }),
    ];
    let metadata = EventMetadata { request_id: Some("req_bench".into()), ..EventMetadata::default() }.encode()?;
    events
        .iter()
        .map(|event| {
            Ok(NewEvent {
                event_type: event.event_type().to_owned(),
                schema_version: event.schema_version(),
                payload: event.encode_payload()?,
                metadata: metadata.clone(),
            })
        })
        .collect()
}

/// Inserts `reservations` generated reservations (three events each) in one statement, as one transaction.
async fn generate(db: &Db, reservations: i64) -> anyhow::Result<()> {
    let templates = templates()?;
    let templates: Vec<bulk::Template<'_>> = templates
        .iter()
        .map(|t| bulk::Template { event_type: &t.event_type, payload: &t.payload, metadata: &t.metadata })
        .collect();
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    bulk::load_repeated(&mut tx, reservations, "rsv_", 52, "root", &templates).await?;
    tx.commit().await?;
    Ok(())
}

/// Runs one read model from `0-0-0` until it has passed `total` events, the way the daemon runs it (batches
/// growing while behind, the next read while one is applied). Returns events per second.
pub(crate) async fn rebuild_rate(db: &Db, projection: &Arc<dyn Projection>, total: i64) -> anyhow::Result<f64> {
    let held = lease::acquire(db, &projection.lease_name(), "prc_bench", Duration::from_secs(3600))
        .await?
        .context("the projection lease is held")?;
    let mut runner = framework::Runner::new(db.clone(), projection.clone(), &DaemonConfig::default());
    let started = Instant::now();
    loop {
        let step = runner.step(&held).await?;
        if step.caught_up {
            let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
            let checkpoint = framework::lock_checkpoint(&mut tx, projection.name(), projection.version()).await?;
            tx.commit().await?;
            if checkpoint.events_passed >= total {
                break;
            }
        }
    }
    let rate = total as f64 / started.elapsed().as_secs_f64();
    lease::release(db, &held).await?;
    Ok(rate)
}

/// Runs the projections benchmark and prints its figures.
pub async fn projections(config: ProjectionsBenchConfig) -> anyhow::Result<()> {
    let read_models = models::read_models();
    if let Some(unknown) = config.only.iter().find(|name| !read_models.iter().any(|p| p.name() == name.as_str())) {
        let names: Vec<&str> = read_models.iter().map(|p| p.name()).collect();
        anyhow::bail!("--only: no read model is named {unknown:?} (there are {})", names.join(", "));
    }
    let bench = BenchCluster::start(config.data_dir.as_deref(), config.keep).await?;
    let db = bench.db.clone();
    let bulk = bench.bulk_db();
    let reservations = (config.events / 3).max(1) as i64;
    let total = reservations * 3;
    let started = Instant::now();
    generate(&bulk, reservations).await?;
    let generated = started.elapsed();
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    sqlx::raw_sql(
        "ANALYZE events;
         CREATE TABLE bench_copy (stream_id text, stream_version int, event_type text, payload bytea, metadata bytea)",
    )
    .execute(tx.conn())
    .await?;
    tx.commit().await?;
    println!(
        "projections benchmark: PostgreSQL {}, durable cluster in {}, {} CPUs; {total} events generated with bulk SQL in {:.1} s",
        bench.version,
        bench.root.display(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        generated.as_secs_f64()
    );

    // The bulk insert's rate swings by half from one run to the next here: the median of three.
    let mut baselines = Vec::new();
    for _ in 0..3 {
        let mut tx = bulk.begin(TxOptions::READ_COMMITTED).await?;
        sqlx::raw_sql("TRUNCATE bench_copy").execute(tx.conn()).await?;
        tx.commit().await?;
        let started = Instant::now();
        let mut tx = bulk.begin(TxOptions::READ_COMMITTED).await?;
        sqlx::raw_sql(
            "INSERT INTO bench_copy SELECT stream_id, stream_version, event_type, payload, metadata FROM events",
        )
        .execute(tx.conn())
        .await?;
        tx.commit().await?;
        baselines.push(total as f64 / started.elapsed().as_secs_f64());
    }
    let runs: Vec<String> = baselines.iter().map(|rate| format!("{rate:.0}")).collect();
    baselines.sort_by(f64::total_cmp);
    let baseline = baselines[1];
    println!("  INSERT ... SELECT of {total} rows: {baseline:>10.0} rows/s (median of {})", runs.join(", "));
    println!();

    // With `--only`, the lag run below runs the same read models (the others never caught up).
    let read_models: Vec<Arc<dyn Projection>> = read_models
        .into_iter()
        .filter(|p| config.only.is_empty() || config.only.iter().any(|name| name == p.name()))
        .collect();
    let started = Instant::now();
    for projection in &read_models {
        let rate = rebuild_rate(&db, projection, total).await?;
        println!(
            "  rebuild {:<22} v{}: {rate:>10.0} events/s   ratio {:.3}",
            projection.name(),
            projection.version(),
            rate / baseline
        );
    }
    let all = total as f64 * read_models.len() as f64 / started.elapsed().as_secs_f64();
    println!("  {} read models, one after another: {all:>10.0} events/s (per model-event)", read_models.len());

    // Steady-state lag: the daemon runs the read models while the writers append.
    let (stop_daemon, stopped) = tokio::sync::watch::channel(false);
    let daemon = tokio::spawn(framework::run_daemon(
        db.clone(),
        read_models.clone(),
        DaemonConfig { poll: Duration::from_millis(50), ..DaemonConfig::default() },
        stopped,
    ));
    let writing = Arc::new(AtomicBool::new(true));
    let mut writers = tokio::task::JoinSet::new();
    for writer in 0..WRITERS {
        let (db, writing) = (db.clone(), writing.clone());
        writers.spawn(async move {
            let event = NewEvent::encode("bench.appended", 1, &writer, &EventMetadata::default())?;
            let stream = format!("bench-{writer}");
            let mut appended = 0u64;
            while writing.load(Ordering::SeqCst) {
                let mut tx = db.begin(TxOptions::COMMAND).await?;
                let batch = std::slice::from_ref(&event);
                events::append(
                    &mut tx,
                    AppendBatch { stream_id: &stream, tenant_id: None, expected: ExpectedVersion::Any, events: batch },
                )
                .await?;
                tx.commit().await?;
                appended += 1;
            }
            anyhow::Ok(appended)
        });
    }
    let mut lag_events = Vec::new();
    let mut lag_seconds: Vec<f64> = Vec::new();
    let until = Instant::now() + config.lag_run;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let rows = status::status(&db, &read_models).await?;
        lag_events.push(rows.iter().map(|r| r.lag_events).max().unwrap_or(0));
        lag_seconds.push(rows.iter().map(|r| r.lag_seconds).fold(0.0, f64::max));
    }
    writing.store(false, Ordering::SeqCst);
    let mut appended = 0;
    while let Some(done) = writers.join_next().await {
        appended += done.context("join a writer")??;
    }
    let _ = stop_daemon.send(true);
    daemon.await.context("stop the daemon")?;
    lag_events.sort_unstable();
    lag_seconds.sort_by(f64::total_cmp);
    let pick = |v: &[i64], p: f64| v.get(((v.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0);
    let pick_s = |v: &[f64], p: f64| v.get(((v.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0.0);
    let narrow = bench.one_row_insert_script().await?;
    let run = PgbenchRun {
        script: &narrow,
        database: "bench",
        clients: WRITERS as u32,
        seconds: config.lag_run.as_secs(),
        name: "1-row INSERT",
        env: &[],
    };
    let inserts = pgbench(&bench.bins, &bench.guard.cluster, run)?;
    let append_rate = appended as f64 / config.lag_run.as_secs_f64();
    println!();
    println!(
        "  {WRITERS} writers appended {append_rate:.0} events/s (pgbench 1-row INSERT, {WRITERS} clients: {inserts:.0} tx/s, ratio {:.3})",
        append_rate / inserts
    );
    println!(
        "  steady-state lag meanwhile, sampled every 200 ms for {} s: events behind p50 {} max {}; seconds behind p50 {:.2} max {:.2}",
        config.lag_run.as_secs(),
        pick(&lag_events, 0.5),
        pick(&lag_events, 1.0),
        pick_s(&lag_seconds, 0.5),
        pick_s(&lag_seconds, 1.0),
    );
    bulk.close().await;
    db.close().await;
    drop(bench);
    Ok(())
}
