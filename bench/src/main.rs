//! `better-compute-bench`: the benchmarks. Each measures the service through the public functions of the crates
//! it measures, on a durable private cluster, beside PostgreSQL's own baselines measured in the same run, and
//! prints ratios (docs/benchmarks.md).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};

/// Measure Better Compute against PostgreSQL's own baselines.
#[derive(Debug, Parser)]
#[command(name = "better-compute-bench", version, about, long_about = None)]
struct Cli {
    /// Log filter, in tracing's EnvFilter syntax (such as `info` or `bc_eventstore=debug`).
    #[arg(long, env = "BETTER_COMPUTE_LOG", default_value = "info", global = true)]
    log: String,

    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Event log appends per second (1 and 8 writers, single events and 10-event batches) on a durable private
    /// cluster, beside pgbench running the same SQL and pgbench's one-row INSERT, printed as ratios.
    Append(BenchAppendArgs),
    /// Reserve-then-release cycles per second with 1, 4 and 16 clients beside pgbench's one-row INSERT, and the
    /// placement latency of an 8-GPU request in a pool of 1,000 nodes, half booked.
    Reserve(BenchReserveArgs),
    /// Instances created and deleted per second (each with its reservation of one GPU and its flavor's scalars)
    /// with 1, 4 and 16 clients, beside pgbench's one-row INSERT.
    Instances(BenchInstancesArgs),
    /// Rebuild rate of every read model from a large generated log, beside an INSERT ... SELECT of as many rows,
    /// and the read models' lag while writers append.
    Projections(BenchProjectionsArgs),
    /// Rebuild rate of the GPU-hour ledger from a generated log of reservations placed, bound and released, beside
    /// INSERT ... SELECT of as many rows as the log has events and of the rows the ledger writes, and its reads.
    Ledger(BenchLedgerArgs),
    /// Reserve-then-release cycles through the HTTP API next to the command layer at 16 clients, and SSE fan-out:
    /// commit-to-delivery latency to many subscribers while reservations are made.
    Http(BenchHttpArgs),
    /// Simulated machines joined through the join command, heartbeats per second through the command layer and
    /// the HTTP API beside pgbench's one-row INSERT, and how long a stopped agent's node stays schedulable.
    Agents(BenchAgentsArgs),
    /// The system at the size of a large GPU cloud (10,000 nodes, 80,000 GPUs, 1,000,000 reservations generated
    /// with bulk SQL): placement, the earliest-start query, the capacity rollup, SSE fan-out and catch-up, and the
    /// tables' sizes, beside baselines measured in the same run.
    Fleet(BenchFleetArgs),
    /// Machines on sushy-tools' Redfish emulator enrolled and inspected at once through the site agent, its boot
    /// path and in-process ramdisks: the time until all are ready and the control plane's cost per machine,
    /// beside pgbench's one-row INSERT.
    Provision(BenchProvisionArgs),
    /// Signed webhook deliveries per second to a local receiver (a backlog, one and eight subscriptions) and
    /// their commit-to-delivery p50 and p99 at a steady rate, beside pgbench's one-row INSERT.
    Webhooks(BenchWebhooksArgs),
}

#[derive(Debug, Args)]
struct BenchWebhooksArgs {
    /// Events waiting for each subscription when the deliverer starts.
    #[arg(long, default_value_t = 2_000)]
    backlog: usize,

    /// Events per second the latency run commits.
    #[arg(long, default_value_t = 50)]
    rate: u32,

    /// Seconds the latency run lasts (and pgbench's run).
    #[arg(long, default_value_t = 10)]
    seconds: u64,

    /// Folder for the durable cluster (a fresh temporary folder by default). It must not hold a cluster.
    #[arg(long)]
    data_dir: Option<PathBuf>,

    /// Keep the cluster's folder afterwards.
    #[arg(long)]
    keep: bool,
}

#[derive(Debug, Args)]
struct BenchProvisionArgs {
    /// Machines on the emulator.
    #[arg(long, default_value_t = 1_000)]
    machines: usize,

    /// The sushy-tools emulator to run (`python3 -m pip install sushy-tools==2.2.0`).
    #[arg(long, env = "BETTER_COMPUTE_SUSHY_EMULATOR", default_value = "sushy-emulator")]
    sushy: String,

    /// Keep the cluster here instead of a temporary folder.
    #[arg(long)]
    data_dir: Option<PathBuf>,

    /// Keep the cluster's folder afterwards.
    #[arg(long)]
    keep: bool,
}

#[derive(Debug, Args)]
struct BenchFleetArgs {
    /// Nodes of 8 H100s each, spread over ten pools.
    #[arg(long, default_value_t = 10_000)]
    nodes: usize,

    /// Reservations generated over the past 60 days and the next 30.
    #[arg(long, default_value_t = 1_000_000)]
    reservations: usize,

    /// Seconds per placement run (eight runs) and of the SSE fan-out runs (two).
    #[arg(long, default_value_t = 10)]
    seconds: u64,

    /// Concurrent clients of the placement runs.
    #[arg(long, default_value_t = 4)]
    clients: usize,

    /// SSE subscribers of the fan-out runs.
    #[arg(long, default_value_t = 200)]
    subscribers: usize,

    /// How many events back the SSE catch-up starts.
    #[arg(long, default_value_t = 1_000_000)]
    resume_events: u64,

    /// Replay the whole generated log through the inline projections and compare with the generated tables
    /// (slow: for small runs).
    #[arg(long)]
    verify: bool,

    /// Folder for the durable cluster (a fresh temporary folder by default). It must not hold a cluster.
    #[arg(long)]
    data_dir: Option<PathBuf>,

    /// Keep the cluster's folder afterwards.
    #[arg(long)]
    keep: bool,

    /// Generate the fleet, keep the cluster's folder and stop there (to explore it with psql).
    #[arg(long)]
    generate_only: bool,

    /// Load pg_stat_statements (nested statements included) and print, after each one-client placement run on the
    /// fleet pool (made when --clients is more than one), the statements the server spent the most time on.
    #[arg(long)]
    statements: bool,
}

#[derive(Debug, Args)]
struct BenchAgentsArgs {
    /// Simulated machines (1xH100 each) joined before the runs.
    #[arg(long, default_value_t = 5000)]
    agents: usize,

    /// Seconds per heartbeat throughput run (eight runs, plus two pgbench runs).
    #[arg(long, default_value_t = 10)]
    seconds: u64,

    /// The liveness lease in milliseconds during the detection run; agents heartbeat every quarter of it.
    #[arg(long, default_value_t = 4000)]
    lease_ms: u64,

    /// Agents stopped one at a time in the detection run.
    #[arg(long, default_value_t = 5)]
    samples: usize,

    /// Folder for the durable cluster (a fresh temporary folder by default). It must not hold a cluster.
    #[arg(long)]
    data_dir: Option<PathBuf>,

    /// Keep the cluster's folder afterwards.
    #[arg(long)]
    keep: bool,
}

#[derive(Debug, Args)]
struct BenchHttpArgs {
    /// Seconds per run (two throughput runs, a pgbench run and the fan-out run).
    #[arg(long, default_value_t = 10)]
    seconds: u64,

    /// SSE subscribers of the fan-out run.
    #[arg(long, default_value_t = 500)]
    subscribers: usize,

    /// Reservations per second made during the fan-out run.
    #[arg(long, default_value_t = 50)]
    rate: u32,

    /// Folder for the durable cluster (a fresh temporary folder by default). It must not hold a cluster.
    #[arg(long)]
    data_dir: Option<PathBuf>,

    /// Keep the cluster's folder afterwards.
    #[arg(long)]
    keep: bool,
}

#[derive(Debug, Args)]
struct BenchLedgerArgs {
    /// Reservations in the generated log (six events each).
    #[arg(long, default_value_t = 200_000)]
    reservations: u64,

    /// Folder for the durable cluster (a fresh temporary folder by default). It must not hold a cluster.
    #[arg(long)]
    data_dir: Option<PathBuf>,

    /// Keep the cluster's folder afterwards.
    #[arg(long)]
    keep: bool,
}

#[derive(Debug, Args)]
struct BenchProjectionsArgs {
    /// Events in the generated log.
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,

    /// Seconds of appending for the lag figures.
    #[arg(long, default_value_t = 10)]
    lag_seconds: u64,

    /// Rebuild only these read models (comma-separated names, such as `reservations,audit_events`); all by default.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,

    /// Folder for the durable cluster (a fresh temporary folder by default). It must not hold a cluster.
    #[arg(long)]
    data_dir: Option<PathBuf>,

    /// Keep the cluster's folder afterwards.
    #[arg(long)]
    keep: bool,
}

#[derive(Debug, Args)]
struct BenchInstancesArgs {
    /// Seconds per throughput run (there are three, plus three pgbench runs).
    #[arg(long, default_value_t = 10)]
    seconds: u64,

    /// Folder for the durable cluster (a fresh temporary folder by default). It must not hold a cluster.
    #[arg(long)]
    data_dir: Option<PathBuf>,

    /// Keep the cluster's folder afterwards.
    #[arg(long)]
    keep: bool,
}

#[derive(Debug, Args)]
struct BenchReserveArgs {
    /// Seconds per throughput run (there are three, plus three pgbench runs).
    #[arg(long, default_value_t = 10)]
    seconds: u64,

    /// Placements the latency percentiles are taken over.
    #[arg(long, default_value_t = 200)]
    samples: usize,

    /// Load pg_stat_statements (nested statements included) and print where the server spent its time over the
    /// cycles with this many clients (1, 4 or 16; 1 when no value is given), or over the 8-GPU placements
    /// (`placement`): the statements by total execution time, with their calls and planning time.
    #[arg(long, num_args = 0..=1, default_missing_value = "1", value_parser = ["1", "4", "16", "placement"])]
    statements: Option<String>,

    /// Log every statement's CPU in the server (`log_statement_stats`) over the cycles with this many clients (1, 4
    /// or 16) and over the ceiling's run beside them, and print the CPU a cycle of each statement: what each costs,
    /// waiting for a core left out.
    #[arg(long, value_parser = ["1", "4", "16"])]
    statement_cpu: Option<String>,

    /// Folder for the durable cluster (a fresh temporary folder by default). It must not hold a cluster.
    #[arg(long)]
    data_dir: Option<PathBuf>,

    /// Keep the cluster's folder afterwards.
    #[arg(long)]
    keep: bool,
}

#[derive(Debug, Args)]
struct BenchAppendArgs {
    /// Seconds per run (there are twelve runs).
    #[arg(long, default_value_t = 10)]
    seconds: u64,

    /// Folder for the durable cluster (a fresh temporary folder by default). It must not hold a cluster.
    #[arg(long)]
    data_dir: Option<PathBuf>,

    /// Keep the cluster's folder afterwards.
    #[arg(long)]
    keep: bool,
}

fn main() -> std::process::ExitCode {
    bc_pki::tls::install_default_provider();
    match start() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // One line, never a backtrace.
            eprintln!("better-compute-bench: {}", format!("{err:#}").replace('\n', " "));
            std::process::ExitCode::FAILURE
        }
    }
}

fn start() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&cli.log).context("parse --log")?)
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("start the runtime")?;
    runtime.block_on(run(cli.command))
}

async fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Append(args) => {
            bc_bench::append(bc_bench::AppendBenchConfig {
                run_for: Duration::from_secs(args.seconds.max(1)),
                data_dir: args.data_dir,
                keep: args.keep,
            })
            .await
        }

        BenchCommand::Reserve(args) => {
            bc_bench::reserve(bc_bench::ReserveBenchConfig {
                run_for: Duration::from_secs(args.seconds.max(1)),
                samples: args.samples.max(1),
                statements: args.statements,
                statement_cpu: args.statement_cpu.and_then(|clients| clients.parse().ok()),
                data_dir: args.data_dir,
                keep: args.keep,
            })
            .await
        }

        BenchCommand::Webhooks(args) => {
            bc_bench::webhooks(bc_bench::WebhooksBenchConfig {
                backlog: args.backlog.max(1),
                rate: args.rate.max(1),
                run_for: Duration::from_secs(args.seconds.max(1)),
                data_dir: args.data_dir,
                keep: args.keep,
            })
            .await
        }
        BenchCommand::Instances(args) => {
            bc_bench::instances(bc_bench::InstancesBenchConfig {
                run_for: Duration::from_secs(args.seconds.max(1)),
                data_dir: args.data_dir,
                keep: args.keep,
            })
            .await
        }

        BenchCommand::Http(args) => {
            bc_bench::http(bc_bench::HttpBenchConfig {
                run_for: Duration::from_secs(args.seconds.max(1)),
                subscribers: args.subscribers,
                rate: args.rate.max(1),
                data_dir: args.data_dir,
                keep: args.keep,
            })
            .await
        }

        BenchCommand::Agents(args) => {
            bc_bench::agents(bc_bench::AgentsBenchConfig {
                agents: args.agents.max(1),
                run_for: Duration::from_secs(args.seconds.max(1)),
                lease: Duration::from_millis(args.lease_ms.max(100)),
                samples: args.samples.max(1),
                data_dir: args.data_dir,
                keep: args.keep,
            })
            .await
        }

        BenchCommand::Provision(args) => {
            bc_bench::provision(bc_bench::ProvisionBenchConfig {
                machines: args.machines,
                sushy: args.sushy,
                data_dir: args.data_dir,
                keep: args.keep,
            })
            .await
        }

        BenchCommand::Fleet(args) => {
            bc_bench::fleet(bc_bench::FleetBenchConfig {
                nodes: args.nodes,
                reservations: args.reservations.max(1),
                run_for: Duration::from_secs(args.seconds.max(1)),
                clients: args.clients.max(1),
                subscribers: args.subscribers,
                resume_events: args.resume_events.max(1),
                verify: args.verify,
                data_dir: args.data_dir,
                keep: args.keep,
                generate_only: args.generate_only,
                statements: args.statements,
            })
            .await
        }

        BenchCommand::Ledger(args) => {
            bc_bench::ledger(bc_bench::LedgerBenchConfig {
                reservations: args.reservations,
                data_dir: args.data_dir,
                keep: args.keep,
            })
            .await
        }

        BenchCommand::Projections(args) => {
            bc_bench::projections(bc_bench::ProjectionsBenchConfig {
                events: args.events.max(3),
                lag_run: Duration::from_secs(args.lag_seconds.max(1)),
                only: args.only,
                data_dir: args.data_dir,
                keep: args.keep,
            })
            .await
        }
    }
}
