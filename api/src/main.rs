//! `better-compute`: the control plane's command line. Parses the command line and environment once into
//! typed configuration, installs logging, and runs the chosen command.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use bc_api::dev::{self, DevConfig};
use bc_api::service::{self, MigrateOnStart};
use bc_eventstore::{Db, DbConfig};
use clap::{Args, Parser, Subcommand};

/// Better Compute: the control plane of a GPU fleet.
#[derive(Debug, Parser)]
#[command(name = "better-compute", version, about, long_about = None)]
struct Cli {
    /// Log filter, in tracing's EnvFilter syntax (such as `info` or `bc_eventstore=debug`).
    #[arg(long, env = "BETTER_COMPUTE_LOG", default_value = "info", global = true)]
    log: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the API on an existing database.
    Serve(ServeArgs),
    /// Apply the database migrations, then exit. Run once per deploy, before new processes start.
    Migrate(DatabaseArgs),
    /// Run the service on an embedded database (a private PostgreSQL cluster in a data folder), or on
    /// BETTER_COMPUTE_DATABASE_URL when it is set.
    Dev(DevArgs),
    /// Measure the service against PostgreSQL's own baselines.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Event log appends per second (1 and 8 writers, single events and 10-event batches) on a durable private
    /// cluster, beside pgbench running the same SQL and pgbench's one-row INSERT, printed as ratios.
    Append(BenchAppendArgs),
    /// Reserve-then-release cycles per second with 1, 4 and 16 clients beside pgbench's one-row INSERT, and the
    /// placement latency of an 8-GPU request in a pool of 1,000 nodes, half booked.
    Reserve(BenchReserveArgs),
}

#[derive(Debug, Args)]
struct BenchReserveArgs {
    /// Seconds per throughput run (there are three, plus three pgbench runs).
    #[arg(long, default_value_t = 10)]
    seconds: u64,

    /// Placements the latency percentiles are taken over.
    #[arg(long, default_value_t = 200)]
    samples: usize,

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

#[derive(Debug, Args)]
struct DatabaseArgs {
    /// PostgreSQL URL, such as postgres://user:password@host:5432/better_compute.
    #[arg(long, env = "BETTER_COMPUTE_DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,

    /// Connections this process may hold at once.
    #[arg(long, env = "BETTER_COMPUTE_DB_MAX_CONNECTIONS", default_value_t = 20)]
    db_max_connections: u32,

    /// Statement timeout in milliseconds, applied with SET LOCAL in every transaction.
    #[arg(long, env = "BETTER_COMPUTE_DB_STATEMENT_TIMEOUT_MS", default_value_t = 15_000)]
    db_statement_timeout_ms: u64,
}

impl DatabaseArgs {
    fn config(&self) -> DbConfig {
        DbConfig {
            max_connections: self.db_max_connections.max(1),
            statement_timeout: Duration::from_millis(self.db_statement_timeout_ms),
            ..DbConfig::default()
        }
    }

    fn required_url(&self) -> anyhow::Result<&str> {
        self.database_url
            .as_deref()
            .filter(|url| !url.is_empty())
            .context("no database: set BETTER_COMPUTE_DATABASE_URL or pass --database-url")
    }
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "BETTER_COMPUTE_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,

    /// Do not apply migrations on start (run `better-compute migrate` first).
    #[arg(long)]
    no_migrate: bool,

    #[command(flatten)]
    database: DatabaseArgs,
}

#[derive(Debug, Args)]
struct DevArgs {
    /// Address to listen on.
    #[arg(long, env = "BETTER_COMPUTE_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,

    /// Folder of the embedded database (default: under the user's data folder; as root,
    /// /var/lib/better-compute/dev).
    #[arg(long, env = "BETTER_COMPUTE_DATA_DIR")]
    data_dir: Option<PathBuf>,

    /// Do not apply migrations on start.
    #[arg(long)]
    no_migrate: bool,

    #[command(flatten)]
    database: DatabaseArgs,
}

fn migrate_on_start(no_migrate: bool) -> MigrateOnStart {
    if no_migrate { MigrateOnStart::Skip } else { MigrateOnStart::Migrate }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&cli.log).context("parse --log")?)
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("start the runtime")?;
    runtime.block_on(run(cli.command))
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve(args) => {
            let db = Db::connect_lazy(args.database.required_url()?, &args.database.config())?;
            service::prepare(&db, migrate_on_start(args.no_migrate)).await?;
            let listener = service::bind(args.listen).await?;
            service::serve_on(db, listener, service::shutdown_signal()).await
        }
        Command::Migrate(args) => {
            let db = Db::connect_lazy(args.required_url()?, &args.config())?;
            service::migrate(&db).await
        }
        Command::Bench(BenchCommand::Append(args)) => {
            bc_api::bench::append(bc_api::bench::AppendBenchConfig {
                run_for: Duration::from_secs(args.seconds.max(1)),
                data_dir: args.data_dir,
                keep: args.keep,
            })
            .await
        }
        Command::Bench(BenchCommand::Reserve(args)) => {
            bc_api::bench::reserve(bc_api::bench::ReserveBenchConfig {
                run_for: Duration::from_secs(args.seconds.max(1)),
                samples: args.samples.max(1),
                data_dir: args.data_dir,
                keep: args.keep,
            })
            .await
        }
        Command::Dev(args) => {
            let data_dir = match args.data_dir {
                Some(dir) => dir,
                None => dev::default_data_dir()?,
            };
            dev::check_data_dir(&data_dir)?;
            dev::run(DevConfig {
                listen: args.listen,
                database_url: args.database.database_url.clone().filter(|url| !url.is_empty()),
                data_dir,
                migrate: migrate_on_start(args.no_migrate),
                db: args.database.config(),
            })
            .await
        }
    }
}
