//! `better-compute-bench ledger`: how fast the GPU-hour ledger rebuilds from a generated log (reservations placed,
//! activated, released early: six events each, made by the domain's own `decide`), beside an `INSERT ... SELECT`
//! of as many rows as the log has events and one of the rows the ledger writes, in the same run; and how long a
//! read of its hours takes over what it built.

use std::sync::Arc;
use std::time::Instant;

use bc_domain::device::DeviceClass;
use bc_domain::event::{DomainEvent, EventMetadata};
use bc_domain::id::{AllocationId, Identity, NodeId, PoolId, ReservationId, TenantId};
use bc_domain::reservation::{self, Allocation, Command, NewRequest, ReservationEvent, ReservationRequest};
use bc_eventstore::events::NewEvent;
use bc_eventstore::{Access, Db, Isolation, TxOptions, bulk};
use bc_projections::framework::Projection;
use bc_projections::models::ledger::{self, HOUR_MS, LedgerQuery, LedgerV1, Scope};

use super::BenchCluster;
use super::projections::rebuild_rate;

/// What `bench ledger` measures.
#[derive(Debug, Clone)]
pub struct LedgerBenchConfig {
    /// Reservations in the generated log (six events each).
    pub reservations: u64,
    pub data_dir: Option<std::path::PathBuf>,
    pub keep: bool,
}

/// 2030-01-01T00:00:00Z.
const T0: i64 = 1_893_456_000_000;

/// One reservation's life as the domain decides it: requested and placed at T0 for two hours, bound at T0+1s,
/// released at T0+45m. Six events.
fn life() -> anyhow::Result<Vec<ReservationEvent>> {
    let tenant: TenantId = "acme".parse()?;
    let identity: Identity = "bench@acme".parse()?;
    let pool: PoolId = "pool_01m8q000000000000000000000".parse()?;
    let mut request = ReservationRequest::hold(pool, DeviceClass::Gpu, 2);
    request.duration_s = 7200;
    let mut events = reservation::request(
        None,
        NewRequest {
            reservation_id: ReservationId::derive(&tenant, &identity, "template"),
            tenant_id: tenant,
            identity,
            request,
            priority: 0,
            quota_holder: None,
            now_ms: T0,
        },
    )?;
    let node = NodeId::generate();
    let allocations = vec![Allocation {
        allocation_id: AllocationId::generate(),
        node_id: node.clone(),
        devices: vec!["GPU-bench-0".parse()?, "GPU-bench-1".parse()?],
        resources: Default::default(),
    }];
    let commands = [
        Command::Place { allocations, now_ms: T0 },
        Command::StartBinding { now_ms: T0 + 1_000, awaiting: vec![node] },
        Command::Activate { now_ms: T0 + 1_000 },
        Command::Release { now_ms: T0 + 45 * 60_000, awaiting: Vec::new() },
        Command::CompleteRelease { now_ms: T0 + 45 * 60_000, unconfirmed: false },
    ];
    let mut state = reservation::fold(&events).ok_or_else(|| anyhow::anyhow!("no reservation"))?;
    for command in &commands {
        for event in reservation::decide(&state, command)? {
            state = reservation::evolve(Some(state), &event).ok_or_else(|| anyhow::anyhow!("no reservation"))?;
            events.push(event);
        }
    }
    Ok(events)
}

/// Inserts `reservations` generated reservations (six events each) in one statement, as one transaction.
async fn generate(db: &Db, reservations: i64) -> anyhow::Result<()> {
    let metadata = EventMetadata { request_id: Some("req_bench".into()), ..EventMetadata::default() }.encode()?;
    let encoded: Vec<NewEvent> = life()?
        .iter()
        .map(|event| {
            Ok(NewEvent {
                event_type: event.event_type().to_owned(),
                schema_version: event.schema_version(),
                payload: event.encode_payload()?,
                metadata: metadata.clone(),
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let templates: Vec<bulk::Template<'_>> = encoded
        .iter()
        .map(|t| bulk::Template { event_type: &t.event_type, payload: &t.payload, metadata: &t.metadata })
        .collect();
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    bulk::load_repeated(&mut tx, reservations, "rsv_", 52, "acme", &templates).await?;
    tx.commit().await?;
    Ok(())
}

/// The median of three runs of `statement` (after `reset`), in rows per second for `rows` rows.
async fn median_rate(
    db: &Db,
    reset: &'static str,
    statement: &'static str,
    rows: i64,
) -> anyhow::Result<(f64, String)> {
    let mut rates = Vec::new();
    for _ in 0..3 {
        let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
        sqlx::raw_sql(reset).execute(tx.conn()).await?;
        tx.commit().await?;
        let started = Instant::now();
        let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
        sqlx::raw_sql(statement).execute(tx.conn()).await?;
        tx.commit().await?;
        rates.push(rows as f64 / started.elapsed().as_secs_f64());
    }
    let runs: Vec<String> = rates.iter().map(|rate| format!("{rate:.0}")).collect();
    rates.sort_by(f64::total_cmp);
    Ok((rates[1], runs.join(", ")))
}

/// Runs the ledger benchmark and prints its figures.
pub async fn ledger(config: LedgerBenchConfig) -> anyhow::Result<()> {
    let bench = BenchCluster::start(config.data_dir.as_deref(), config.keep).await?;
    let db = bench.db.clone();
    let bulk = bench.bulk_db();
    let reservations = config.reservations.max(1) as i64;
    let events = reservations * life()?.len() as i64;
    let started = Instant::now();
    generate(&bulk, reservations).await?;
    let generated = started.elapsed();
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    sqlx::raw_sql(
        "ANALYZE events;
         CREATE TABLE bench_copy (stream_id text, stream_version int, event_type text, payload bytea, metadata bytea);
         CREATE TABLE bench_ledger (LIKE ledger_bookings_v1 INCLUDING ALL)",
    )
    .execute(tx.conn())
    .await?;
    tx.commit().await?;
    println!(
        "ledger benchmark: PostgreSQL {}, durable cluster in {}, {} CPUs; {reservations} reservations ({events} events) generated with bulk SQL in {:.1} s",
        bench.version,
        bench.root.display(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        generated.as_secs_f64()
    );
    let (baseline, runs) = median_rate(
        &bulk,
        "TRUNCATE bench_copy",
        "INSERT INTO bench_copy SELECT stream_id, stream_version, event_type, payload, metadata FROM events",
        events,
    )
    .await?;
    println!("  INSERT ... SELECT of the {events} events:   {baseline:>10.0} rows/s (median of {runs})");

    let projection: Arc<dyn Projection> = Arc::new(LedgerV1);
    let rate = rebuild_rate(&db, &projection, events).await?;
    println!("  rebuild ledger v1:                  {rate:>10.0} events/s   ratio {:.3}", rate / baseline);
    let (rows_baseline, runs) = median_rate(
        &bulk,
        "TRUNCATE bench_ledger",
        "INSERT INTO bench_ledger SELECT * FROM ledger_bookings_v1",
        reservations,
    )
    .await?;
    let rows_rate = rate / (events as f64 / reservations as f64);
    println!(
        "  INSERT ... SELECT of its {reservations} rows:  {rows_baseline:>10.0} rows/s (median of {runs}); the rebuild wrote {rows_rate:.0} rows/s, ratio {:.3}",
        rows_rate / rows_baseline
    );

    // Reads of the hours it built: every booking lies in the first hour of the range, so the 24-hour and 31-day
    // reads sum every row.
    for hours in [24, 31 * 24] {
        let scope = Scope::Fleet;
        let query = LedgerQuery { from_ms: T0, to_ms: T0 + hours * HOUR_MS, pool_id: None, scope: &scope };
        let started = Instant::now();
        let mut tx = db.begin(TxOptions { isolation: Isolation::RepeatableRead, access: Access::ReadOnly }).await?;
        let read = ledger::read(&mut tx, 1, &query).await?;
        tx.commit().await?;
        println!(
            "  read of {hours} hours (every tenant and pool, {} tenant rows): {:.1} ms",
            read.tenants.len(),
            started.elapsed().as_secs_f64() * 1000.0
        );
    }
    bulk.close().await;
    db.close().await;
    drop(bench);
    Ok(())
}
