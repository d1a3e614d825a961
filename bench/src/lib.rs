//! Benchmarks, each on a durable private cluster of its own, printing ratios against baselines measured in the
//! same run on the same cluster (the machine is shared and noisy, so raw rates mean little).

pub mod agents;
pub mod append;
mod fanout;
pub mod fleet;
pub mod http;
pub mod instances;
pub mod ledger;
pub mod projections;
pub mod provision;
pub mod reserve;
mod statement_cpu;
pub mod webhooks;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bc_eventstore::cluster::{Cluster, InitOptions, PgBinaries, PgSearch, RunAs, StopMode};
use bc_eventstore::migrate::Migrator;
use bc_eventstore::{Db, DbConfig};
use sqlx::{ConnectOptions as _, Connection as _};

pub use agents::{AgentsBenchConfig, agents};
pub use append::{AppendBenchConfig, append};
pub use fleet::{FleetBenchConfig, fleet};
pub use http::{HttpBenchConfig, http};
pub use instances::{InstancesBenchConfig, instances};
pub use ledger::{LedgerBenchConfig, ledger};
pub use projections::{ProjectionsBenchConfig, projections};
pub use provision::{ProvisionBenchConfig, provision};
pub use reserve::{ReserveBenchConfig, reserve};
pub use webhooks::{WebhooksBenchConfig, webhooks};

/// Stops the benchmark's cluster (and removes its folder) however the benchmark ends.
pub(crate) struct ClusterGuard {
    pub cluster: Cluster,
    remove: bool,
}

impl Drop for ClusterGuard {
    fn drop(&mut self) {
        if let Err(err) = self.cluster.stop(StopMode::Fast) {
            tracing::warn!(error = %err, "could not stop the benchmark cluster");
        }
        if self.remove {
            let _ = std::fs::remove_dir_all(self.cluster.root());
        }
    }
}

/// A durable private cluster with a migrated `bench` database.
pub(crate) struct BenchCluster {
    pub bins: PgBinaries,
    pub root: PathBuf,
    pub version: String,
    pub db: Db,
    // Dropped last: stops the cluster after the pool is gone.
    pub guard: ClusterGuard,
}

impl BenchCluster {
    /// Creates the one-column `bench_narrow` table and writes the pgbench script of the baseline: a one-row
    /// INSERT into it. Returns the script's path.
    pub async fn one_row_insert_script(&self) -> anyhow::Result<PathBuf> {
        let mut tx = self.db.begin(bc_eventstore::TxOptions::READ_COMMITTED).await?;
        sqlx::raw_sql("CREATE TABLE bench_narrow (id bigint)").execute(tx.conn()).await?;
        tx.commit().await?;
        let script = self.root.join("narrow.sql");
        std::fs::write(&script, "INSERT INTO bench_narrow (id) VALUES (1);\n")?;
        Ok(script)
    }

    /// Loads the ceiling's functions (`bench/ceiling.sql`: a reserve's and a cancel's minimal writes, one call
    /// each, in the pool named `cycles`) and writes their pgbench script. Returns the script's path; run it with
    /// at most as many clients as that pool has devices.
    pub async fn ceiling_script(&self) -> anyhow::Result<PathBuf> {
        let mut tx = self.db.begin(bc_eventstore::TxOptions::READ_COMMITTED).await?;
        sqlx::raw_sql(include_str!("../ceiling.sql")).execute(tx.conn()).await.context("load bench/ceiling.sql")?;
        tx.commit().await?;
        let script = self.root.join("ceiling.pgbench");
        std::fs::write(&script, include_str!("../ceiling.pgbench"))?;
        Ok(script)
    }

    /// Creates and starts the cluster in `data_dir` (a fresh temporary folder when `None`), creates and
    /// migrates the `bench` database.
    pub async fn start(data_dir: Option<&Path>, keep: bool) -> anyhow::Result<Self> {
        Self::start_with(data_dir, keep, &[]).await
    }

    /// [`BenchCluster::start`] with more `postgresql.conf` settings.
    pub async fn start_with(data_dir: Option<&Path>, keep: bool, more: &[(&str, &str)]) -> anyhow::Result<Self> {
        let bins = PgBinaries::find(&PgSearch::from_env())?;
        let run_as = RunAs::for_this_process()?;
        let root = match data_dir {
            Some(dir) => dir.to_path_buf(),
            None => std::env::temp_dir().join(format!("bc-bench-{}", std::process::id())),
        };
        if root.join("pgdata").exists() {
            bail!("{} already holds a cluster; the benchmark needs a fresh folder", root.display());
        }
        let cluster = Cluster::new(bins.clone(), root.clone(), run_as);
        let mut settings = vec![("shared_buffers".into(), "256MB".into()), ("max_wal_size".into(), "4GB".into())];
        settings.extend(more.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())));
        let init = InitOptions { settings, ..InitOptions::default() };
        cluster.init(&init)?;
        cluster.start()?;
        let guard = ClusterGuard { cluster, remove: !keep };
        let cluster = &guard.cluster;
        let mut admin = cluster.connect_options("postgres").connect().await.context("connect to the bench cluster")?;
        sqlx::raw_sql("CREATE DATABASE bench").execute(&mut admin).await.context("create the bench database")?;
        let version: String = sqlx::query_scalar("SHOW server_version").persistent(false).fetch_one(&mut admin).await?;
        admin.close().await.ok();
        let db = Db::connect_lazy_with(
            cluster.connect_options("bench"),
            &DbConfig { max_connections: 40, ..DbConfig::default() },
        );
        Migrator::embedded().run(&db).await.context("migrate the bench database")?;
        Ok(Self { bins, root, version, db, guard })
    }

    /// A small pool for bulk statements (generating a log, copying it), which run far longer than the service's
    /// statement timeout allows.
    pub fn bulk_db(&self) -> Db {
        Db::connect_lazy_with(
            self.guard.cluster.connect_options("bench"),
            &DbConfig { max_connections: 4, statement_timeout: Duration::from_secs(7200), ..DbConfig::default() },
        )
    }
}

/// Runs `cycle(client, n)` from `clients` tasks until `run_for` has passed. Returns cycles per second.
pub(crate) async fn drive<F, Fut>(clients: usize, run_for: Duration, cycle: F) -> anyhow::Result<f64>
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let started = Instant::now();
    let deadline = started + run_for;
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..clients {
        let cycle = cycle.clone();
        tasks.spawn(async move {
            let mut done = 0u64;
            while Instant::now() < deadline {
                cycle(client, done).await?;
                done += 1;
            }
            anyhow::Ok(done)
        });
    }
    let mut total = 0;
    while let Some(done) = tasks.join_next().await {
        total += done.context("join a client")??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// This machine's clock in epoch milliseconds.
pub(crate) fn wall_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or_default()
}

/// A duration in milliseconds, for printing.
pub(crate) fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The `p` quantile (0 to 1) of sorted durations.
pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(index).copied().unwrap_or_default()
}

/// One pgbench run.
struct PgbenchRun<'a> {
    script: &'a Path,
    database: &'a str,
    clients: u32,
    seconds: u64,
    name: &'a str,
    env: &'a [(&'a str, &'a str)],
}

impl<'a> PgbenchRun<'a> {
    /// The baseline every benchmark prints beside its figures: pgbench's one-row INSERT (`script`).
    fn one_row_inserts(script: &'a Path, clients: usize, seconds: u64) -> PgbenchRun<'a> {
        PgbenchRun { script, database: "bench", clients: clients as u32, seconds, name: "1-row INSERT", env: &[] }
    }
}

/// Runs pgbench and reads its transaction rate.
fn pgbench(bins: &PgBinaries, cluster: &Cluster, run: PgbenchRun<'_>) -> anyhow::Result<f64> {
    let clients = run.clients.to_string();
    let output = Command::new(bins.tool("pgbench"))
        .arg("-n")
        .arg("-h")
        .arg(cluster.socket_dir())
        .args(["-p", "5432", "-U", "postgres"])
        .args(["-c", &clients, "-j", &clients, "-T", &run.seconds.to_string()])
        .arg("-f")
        .arg(run.script)
        .arg(run.database)
        .envs(run.env.iter().copied())
        .output()
        .with_context(|| format!("run pgbench ({})", run.name))?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        bail!("pgbench ({}) failed: {}{}", run.name, text, String::from_utf8_lossy(&output.stderr));
    }
    text.lines()
        .find_map(|line| line.trim().strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|number| number.parse::<f64>().ok())
        .with_context(|| format!("read the tps from pgbench's output:\n{text}"))
}

/// CPU time used so far by the cluster's server processes and by this process, read from `/proc`: on a shared
/// machine, where a run's rate moves with what else is running, the CPU a cycle costs holds steadier.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuReading {
    /// The postmaster, its live children (backends, autovacuum, the WAL writer...), and the children it has
    /// reaped (the backends of connections closed since it started).
    pub server: Duration,
    /// This process's threads and its reaped children (the pgbench runs).
    pub bench: Duration,
}

impl CpuReading {
    /// Reads both once the server's processes have settled; `None` where `/proc` cannot say (not Linux, or the
    /// postmaster's pid is unreadable).
    ///
    /// A backend whose client has gone (a pgbench run that just ended) leaves `/proc` a moment before the
    /// postmaster reaps it and adds its time to its own: a reading in that moment misses the backend's whole
    /// run, and the next reading counts it. So this reads until two readings 20 ms apart agree on the server's
    /// children and on what the postmaster has reaped (at most for two seconds).
    pub async fn now(cluster: &Cluster) -> Option<CpuReading> {
        let pid_file = std::fs::read_to_string(cluster.pgdata().join("postmaster.pid")).ok()?;
        let postmaster: u32 = pid_file.lines().next()?.trim().parse().ok()?;
        let mut last = server_times(postmaster)?;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let again = server_times(postmaster)?;
            let settled = again.children == last.children && again.reaped == last.reaped;
            last = again;
            if settled {
                break;
            }
        }
        let (_, own, reaped) = proc_times("/proc/self/stat")?;
        Some(CpuReading { server: last.total, bench: own + reaped })
    }

    /// The CPU used between `self` (the earlier reading) and `later`, per one of `count` things done, in
    /// milliseconds: (server, this process).
    pub fn per(&self, later: &CpuReading, count: f64) -> (f64, f64) {
        let count = count.max(1.0);
        (
            millis(later.server.saturating_sub(self.server)) / count,
            millis(later.bench.saturating_sub(self.bench)) / count,
        )
    }
}

/// The server's CPU time in one reading: the postmaster's own and reaped children's, and its live children's.
struct ServerTimes {
    total: Duration,
    reaped: Duration,
    children: Vec<u32>,
}

fn server_times(postmaster: u32) -> Option<ServerTimes> {
    let (_, own, reaped) = proc_times(&format!("/proc/{postmaster}/stat"))?;
    let mut times = ServerTimes { total: own + reaped, reaped, children: Vec::new() };
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if let Some((parent, own, _)) = proc_times(&format!("/proc/{pid}/stat"))
            && parent == postmaster
        {
            times.total += own;
            times.children.push(pid);
        }
    }
    times.children.sort_unstable();
    Some(times)
}

/// A process's parent, its own CPU time (user and system), and its reaped children's, from its `stat` file.
fn proc_times(path: &str) -> Option<(u32, Duration, Duration)> {
    let stat = std::fs::read_to_string(path).ok()?;
    // The command name, in parentheses, may hold spaces: the fields that follow start after its last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let tick = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    // Counted in USER_HZ, which Linux fixes at 100 a second for /proc on the architectures this runs on.
    let time = |ticks: u64| Duration::from_millis(ticks * 10);
    let parent = fields.get(1)?.parse().ok()?;
    Some((parent, time(tick(11)? + tick(12)?), time(tick(13)? + tick(14)?)))
}

/// The transactions this process ran again since `before` (a reading of [`bc_eventstore::retries`]), per cycle of
/// `cycles`, with the reasons that occurred: `0.42 (serialization 0.40, exclusion 0.02)`.
pub fn retries_per_cycle(before: &[(bc_eventstore::RetryReason, u64); 4], cycles: usize) -> String {
    let cycles = cycles.max(1) as f64;
    let now = bc_eventstore::retries();
    let mut total = 0u64;
    let mut reasons = Vec::new();
    for ((reason, was), (_, is)) in before.iter().zip(now.iter()) {
        let n = is.saturating_sub(*was);
        total += n;
        if n > 0 {
            reasons.push(format!("{} {:.2}", reason.as_str(), n as f64 / cycles));
        }
    }
    if reasons.is_empty() {
        format!("{:.2}", total as f64 / cycles)
    } else {
        format!("{:.2} ({})", total as f64 / cycles, reasons.join(", "))
    }
}
