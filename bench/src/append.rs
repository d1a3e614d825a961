//! `better-compute bench append`: the event log's append rate on a durable private cluster, beside pgbench
//! running the same SQL on the same table (what the Rust path costs) and pgbench's one-row INSERT into a narrow
//! table (what this PostgreSQL can commit at all), all in the same run, printed as ratios.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bc_domain::event::EventMetadata;
use bc_eventstore::cluster::{Cluster, PgBinaries};
use bc_eventstore::events::{self, APPEND_SQL, AppendBatch, ExpectedVersion, NewEvent};
use bc_eventstore::{Db, TxOptions};

use super::{BenchCluster, PgbenchRun, pgbench};

/// What `bench append` measures.
#[derive(Debug, Clone)]
pub struct AppendBenchConfig {
    /// How long each run lasts.
    pub run_for: Duration,
    /// Where the durable cluster lives; a fresh temporary folder when `None`.
    pub data_dir: Option<PathBuf>,
    /// Keep the cluster's folder afterwards.
    pub keep: bool,
}

/// A representative payload: a reservation placed on a few devices.
#[derive(Debug, serde::Serialize)]
struct BenchPayload<'a> {
    reservation_id: &'a str,
    pool_id: &'a str,
    devices: [&'a str; 2],
    start_ms: i64,
    end_ms: i64,
}

fn bench_event() -> anyhow::Result<NewEvent> {
    let payload = BenchPayload {
        reservation_id: "rsv_4bq7x2m9k1c8d0e5f6g3h2j1k0m9n8p7q6r5s4t3v2w1x0y9z8a7",
        pool_id: "pool_01jd8w2k3m4n5p6q7r8s9t0v1w",
        devices: ["GPU-5b1d9c2e-8f3a-4b6c-9d0e-1f2a3b4c5d6e", "GPU-6c2e0d3f-9a4b-5c7d-0e1f-2a3b4c5d6e7f"],
        start_ms: 1_893_456_000_000,
        end_ms: 1_893_459_600_000,
    };
    let metadata = EventMetadata { request_id: Some("req_01jd8w2k3m4n5p6q7r8s9t0v1w".into()), ..Default::default() };
    Ok(NewEvent::encode("reservation.placed", 1, &payload, &metadata)?)
}

/// One line of the result table.
#[derive(Debug, Clone)]
struct Run {
    name: String,
    writers: u32,
    events_per_tx: u32,
    tx_per_sec: f64,
}

impl Run {
    fn events_per_sec(&self) -> f64 {
        self.tx_per_sec * f64::from(self.events_per_tx)
    }
}

/// Runs the append benchmark and prints its table.
pub async fn append(config: AppendBenchConfig) -> anyhow::Result<()> {
    let bench = BenchCluster::start(config.data_dir.as_deref(), config.keep).await?;
    let (bins, cluster, root, version) = (&bench.bins, &bench.guard.cluster, bench.root.clone(), bench.version.clone());
    let db = bench.db.clone();
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    sqlx::raw_sql("CREATE TABLE bench_narrow (id bigint)").execute(tx.conn()).await?;
    tx.commit().await?;

    let event = bench_event()?;
    let scripts = Scripts::write(&root, &event)?;
    let message_db = MessageDb::install(bins, cluster, &root, &event);
    let seconds = config.run_for.as_secs().max(1);
    println!(
        "append benchmark: PostgreSQL {version}, durable cluster (fsync on, synchronous_commit on) in {}, \
         {} CPUs, {seconds} s per run",
        root.display(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    );
    if let Err(reason) = &message_db {
        println!("Message DB comparison skipped: {reason}");
    }

    for (writers, batch) in [(1, 1), (8, 1), (1, 10), (8, 10)] {
        let pgbench = |script: &Path, database: &str, name: &str, env: &[(&str, &str)]| {
            pgbench(bins, cluster, PgbenchRun { script, database, clients: writers, seconds, name, env })
                .map(|tx_per_sec| Run { name: name.to_owned(), writers, events_per_tx: batch, tx_per_sec })
        };
        let rust = rust_appends(&db, &event, writers, batch, config.run_for).await?;
        let mut baselines = vec![
            pgbench(scripts.command(batch), "bench", "pgbench, same SQL", &[])?,
            pgbench(scripts.alone(batch), "bench", "pgbench, append alone", &[])?,
        ];
        if let Ok(message_db) = &message_db {
            let env = [("PGOPTIONS", "-c search_path=message_store,public")];
            baselines.push(pgbench(message_db.script(batch), "message_store", "pgbench, Message DB", &env)?);
        }
        let narrow = pgbench(&scripts.narrow, "bench", "pgbench, 1-row INSERT", &[])?;
        baselines.push(Run { events_per_tx: 1, ..narrow });
        print_group(&rust, &baselines);
    }
    db.close().await;
    drop(bench);
    Ok(())
}

fn print_group(rust: &Run, baselines: &[Run]) {
    let line = |run: &Run, ratio: String| {
        println!(
            "  {:<24} {:>2} writers {:>2} events/tx {:>9.0} tx/s {:>9.0} events/s  {ratio}",
            run.name,
            run.writers,
            run.events_per_tx,
            run.tx_per_sec,
            run.events_per_sec()
        )
    };
    println!();
    line(rust, String::new());
    for baseline in baselines {
        let ratio = rust.events_per_sec() / baseline.events_per_sec();
        line(baseline, format!("Rust path = {ratio:.2} x this (events/s)"));
    }
}

/// Appends `batch` events per transaction from `writers` tasks for `run_for`, each to its own stream.
async fn rust_appends(db: &Db, event: &NewEvent, writers: u32, batch: u32, run_for: Duration) -> anyhow::Result<Run> {
    let events: Vec<NewEvent> = (0..batch).map(|_| event.clone()).collect();
    let deadline = Instant::now() + run_for;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for writer in 0..writers {
        let db = db.clone();
        let events = events.clone();
        tasks.spawn(async move {
            let stream = format!("bench-{writers}x{batch}-{writer}");
            let mut done = 0u64;
            while Instant::now() < deadline {
                let mut tx = db.begin(TxOptions::COMMAND).await?;
                let append = AppendBatch {
                    stream_id: &stream,
                    tenant_id: None,
                    expected: ExpectedVersion::Any,
                    events: &events,
                };
                events::append(&mut tx, append).await?;
                tx.commit().await?;
                done += 1;
            }
            anyhow::Ok(done)
        });
    }
    let mut total = 0u64;
    while let Some(done) = tasks.join_next().await {
        total += done.context("join a writer")??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    Ok(Run { name: "Rust append".into(), writers, events_per_tx: batch, tx_per_sec: total as f64 / elapsed })
}

/// The pgbench scripts, written once into the benchmark's folder.
struct Scripts {
    command_1: PathBuf,
    command_10: PathBuf,
    alone_1: PathBuf,
    alone_10: PathBuf,
    narrow: PathBuf,
}

impl Scripts {
    fn write(root: &Path, event: &NewEvent) -> anyhow::Result<Self> {
        let dir = root.join("pgbench");
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let scripts = Scripts {
            command_1: dir.join("command-1.sql"),
            command_10: dir.join("command-10.sql"),
            alone_1: dir.join("alone-1.sql"),
            alone_10: dir.join("alone-10.sql"),
            narrow: dir.join("narrow.sql"),
        };
        std::fs::write(&scripts.command_1, command_script(event, 1))?;
        std::fs::write(&scripts.command_10, command_script(event, 10))?;
        std::fs::write(&scripts.alone_1, format!("{};\n", append_statement(event, 1)))?;
        std::fs::write(&scripts.alone_10, format!("{};\n", append_statement(event, 10)))?;
        std::fs::write(&scripts.narrow, "INSERT INTO bench_narrow (id) VALUES (1);\n")?;
        Ok(scripts)
    }

    fn command(&self, batch: u32) -> &Path {
        if batch == 1 { &self.command_1 } else { &self.command_10 }
    }

    fn alone(&self, batch: u32) -> &Path {
        if batch == 1 { &self.alone_1 } else { &self.alone_10 }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// The append statement with its parameters written in as literals, each pgbench client on its own stream.
fn append_statement(event: &NewEvent, batch: u32) -> String {
    let repeat = |item: String| vec![item; batch as usize].join(",");
    let append = APPEND_SQL
        .replace("$1", "('pgb-' || :client_id)")
        .replace("$2", "NULL::text")
        .replace("$3", "NULL")
        .replace("$4", &format!("ARRAY[{}]", repeat(format!("'{}'", event.event_type))))
        .replace("$5", &format!("ARRAY[{}]", repeat(event.schema_version.to_string())))
        .replace("$6", &format!("ARRAY[{}]", repeat(format!("'\\x{}'::bytea", hex(&event.payload)))))
        .replace("$7", &format!("ARRAY[{}]", repeat(format!("'\\x{}'::bytea", hex(&event.metadata)))));
    append.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The transaction the Rust path runs, as pgbench SQL: the same BEGIN, statement timeout, append and commit
/// check.
fn command_script(event: &NewEvent, batch: u32) -> String {
    format!(
        "BEGIN ISOLATION LEVEL REPEATABLE READ READ WRITE;\nSET LOCAL statement_timeout = 15000;\n{};\n\
         SELECT 1;\nCOMMIT;\n",
        append_statement(event, batch)
    )
}

/// Message DB (`@eventide/message-db`, fetched from npm at benchmark time, never kept), installed into the
/// benchmark's cluster for a comparison with its `write_message`.
struct MessageDb {
    script_1: PathBuf,
    script_10: PathBuf,
}

impl MessageDb {
    const PACKAGE: &'static str = "@eventide/message-db@1.3.1";

    fn install(bins: &PgBinaries, cluster: &Cluster, root: &Path, event: &NewEvent) -> Result<Self, String> {
        let dir = root.join("message-db");
        std::fs::create_dir_all(&dir).map_err(|err| format!("create {}: {err}", dir.display()))?;
        let packed = Command::new("npm")
            .args(["pack", Self::PACKAGE, "--pack-destination"])
            .arg(&dir)
            .output()
            .map_err(|err| format!("npm is not available ({err})"))?;
        if !packed.status.success() {
            return Err(format!(
                "npm pack {} failed: {}",
                Self::PACKAGE,
                String::from_utf8_lossy(&packed.stderr).trim()
            ));
        }
        let tarball = String::from_utf8_lossy(&packed.stdout).trim().lines().last().unwrap_or_default().to_owned();
        let untar = Command::new("tar").arg("xzf").arg(dir.join(&tarball)).arg("-C").arg(&dir).status();
        if !untar.is_ok_and(|status| status.success()) {
            return Err(format!("could not unpack {tarball}"));
        }
        let path = format!("{}:{}", bins.bin_dir.display(), std::env::var("PATH").unwrap_or_default());
        let installed = Command::new("bash")
            .arg(dir.join("package/database/install.sh"))
            .env("PATH", path)
            .env("PGHOST", cluster.socket_dir())
            .env("PGPORT", "5432")
            .env("PGUSER", "postgres")
            .env("DATABASE_NAME", "message_store")
            .output()
            .map_err(|err| format!("run Message DB's install.sh: {err}"))?;
        if !installed.status.success() {
            return Err(format!(
                "Message DB's install.sh failed: {}",
                String::from_utf8_lossy(&installed.stderr).trim()
            ));
        }
        // The same content as JSON, which is what Message DB stores.
        let payload: serde_json::Value = rmp_serde::from_slice(&event.payload).map_err(|err| err.to_string())?;
        let metadata: serde_json::Value = rmp_serde::from_slice(&event.metadata).map_err(|err| err.to_string())?;
        // Message DB locks per category (the stream name before its first '-'), so each client gets its own.
        let call = format!(
            "SELECT write_message(gen_random_uuid()::varchar, 'bench' || :client_id || '-1', 'ReservationPlaced', \
             '{payload}'::jsonb, '{metadata}'::jsonb);"
        );
        let script_1 = dir.join("write-1.sql");
        let script_10 = dir.join("write-10.sql");
        let batch = [call.as_str(); 10].join("\n");
        std::fs::write(&script_1, format!("{call}\n")).map_err(|err| err.to_string())?;
        std::fs::write(&script_10, format!("BEGIN;\n{batch}\nCOMMIT;\n")).map_err(|err| err.to_string())?;
        Ok(Self { script_1, script_10 })
    }

    fn script(&self, batch: u32) -> &Path {
        if batch == 1 { &self.script_1 } else { &self.script_10 }
    }
}
