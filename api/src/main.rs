//! `better-compute`: the control plane's command line. Parses the command line and environment once into
//! typed configuration, installs logging, and runs the chosen command.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use bc_api::cli;
use bc_api::dev::{self, DevConfig};
use bc_api::http::events::StreamLimits;
use bc_api::service::{self, MigrateOnStart};
use bc_eventstore::{Db, DbConfig, Position};
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
    /// Check the database and the processes working on it, and say what to do about each problem (exits 1 on
    /// a problem).
    Doctor {
        /// What counts as too old, in seconds: a writing transaction holding the log's horizon back, a read
        /// model's lag, a due work item.
        #[arg(long, default_value_t = 30)]
        threshold_secs: u64,
        /// The PKI bundle `serve` uses, to check that it can be read and its certificates are current.
        #[arg(long, env = "BETTER_COMPUTE_PKI_DIR")]
        pki_dir: Option<PathBuf>,
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// Apply the database migrations, then exit. Run once per deploy, before new processes start.
    Migrate(DatabaseArgs),
    /// Run the service on an embedded database (a private PostgreSQL cluster in a data folder), or on
    /// BETTER_COMPUTE_DATABASE_URL when it is set.
    Dev(DevArgs),
    /// Inspect and rebuild the read models.
    #[command(subcommand)]
    Projections(ProjectionsCommand),
    /// Read the event log: follow it, show a stream's history, replay state at a past position.
    #[command(subcommand)]
    Events(EventsCommand),
    /// The control plane's PKI bundle: its CA, server certificate and sealing key.
    #[command(subcommand)]
    Pki(PkiCommand),
    /// The tamper-evident audit trail: export its signed checkpoints, entries and inclusion proofs through the
    /// API, and verify them offline or against the database.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Follow machines' workflows.
    #[command(subcommand)]
    Workflows(WorkflowsCommand),
    /// List sites, pools, nodes, reservations, instances or the audit trail through the API (`-o
    /// table|wide|json|yaml|name`, `-w` to watch).
    Get(cli::GetArgs),
    /// Show one reservation, node, pool, site or instance with its conditions, allocations and events.
    Describe(cli::DescribeArgs),
    /// Reserve devices in a pool (`--dry-run` says when it could start and what would be free, and reserves
    /// nothing).
    Reserve(cli::ReserveArgs),
    /// Cancel a reservation before its window began.
    Cancel(cli::ReservationVerb),
    /// Release a running reservation's devices.
    Release(cli::ReservationVerb),
    /// Stop placing reservations on a node.
    Cordon(cli::NodeVerb),
    /// Place reservations on a cordoned node again.
    Uncordon(cli::NodeVerb),
    /// Cordon a node and follow it until what runs there has ended.
    Drain(cli::NodeVerb),
    /// The GPU-hour ledger: per pool and UTC hour the capacity, booked and free GPU-hours, per tenant the booked,
    /// bound and idle ones (`-o table|csv|json`).
    Ledger(cli::ledger::LedgerArgs),
    /// Who the CLI's token speaks for, on which server.
    Whoami {
        #[command(flatten)]
        connection: cli::Connection,
    },
    /// Fleet as code: export the sites, pools and profiles as YAML, plan a document's changes, apply them.
    #[command(subcommand)]
    Fleet(cli::FleetCommand),
    /// The CLI's servers and tokens (the configuration file).
    #[command(subcommand)]
    Config(cli::ConfigCommand),
    /// Print a shell completion script.
    Completion {
        #[arg(value_enum)]
        shell: cli::Shell,
    },
}

#[derive(Debug, Subcommand)]
enum AuditCommand {
    /// Write the caller's tenant's checkpoints (with their leaves), audit entries and the asked inclusion
    /// proofs as one JSON bundle to standard output, for `audit verify`.
    Export(cli::audit::ExportArgs),
    /// Verify a bundle offline: each tenant's chain of checkpoints, their signatures against the pinned key,
    /// the entries against their checkpoints' leaves and roots, and the inclusion proofs. With --database,
    /// recompute every checkpoint from the database's audit rows instead. Exits 1 naming the first failure.
    Verify {
        /// The bundle `audit export` wrote (`-` for standard input).
        #[arg(required_unless_present = "database", conflicts_with = "database")]
        bundle: Option<PathBuf>,
        /// The audit key to hold the checkpoints to, hex (`pki show` prints it, `/v1/pki/audit-key` serves it).
        #[arg(long)]
        public_key: Option<String>,
        /// Pin the audit key of this PKI bundle instead of --public-key.
        #[arg(long, conflicts_with = "public_key")]
        pki_dir: Option<PathBuf>,
        /// Verify against the database (BETTER_COMPUTE_DATABASE_URL) instead of a bundle: every checkpoint
        /// recomputed from the audit rows as they are now, naming any row that changed, went missing or appeared.
        #[arg(long)]
        database: bool,
        /// Only this tenant's checkpoints (with --database).
        #[arg(long, requires = "database")]
        tenant: Option<String>,
        #[command(flatten)]
        db: DatabaseArgs,
    },
}

#[derive(Debug, Subcommand)]
enum WorkflowsCommand {
    /// Follow a workflow to its end with a progress bar; exits 1 when it failed or was cancelled.
    Watch {
        /// The workflow id (`wf_...`).
        id: String,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

#[derive(Debug, Subcommand)]
enum PkiCommand {
    /// Make a new bundle (refused where one exists: a new CA makes every node join again).
    Init {
        /// The bundle's folder.
        #[arg(long, env = "BETTER_COMPUTE_PKI_DIR")]
        dir: PathBuf,
        /// A DNS name or IP address the server certificate is valid for (repeat for each; default localhost,
        /// 127.0.0.1 and ::1).
        #[arg(long = "name")]
        names: Vec<String>,
    },
    /// Show the bundle: the CA's fingerprint (what `bcd` pins), the server certificate's expiry and the audit
    /// key (what `audit verify` pins).
    Show {
        #[arg(long, env = "BETTER_COMPUTE_PKI_DIR")]
        dir: PathBuf,
    },
    /// Issue a new server certificate for these names (the CA and the nodes' certificates stay valid).
    ServerCertificate {
        #[arg(long, env = "BETTER_COMPUTE_PKI_DIR")]
        dir: PathBuf,
        #[arg(long = "name", required = true)]
        names: Vec<String>,
    },
    /// Issue a driver's identity for the driver protocol's mutual TLS (`bcx serve --ca --cert --key-file`):
    /// writes `ca.crt`, `driver.crt` and `driver.key` (0600) into `--out`.
    DriverIdentity {
        #[arg(long, env = "BETTER_COMPUTE_PKI_DIR")]
        dir: PathBuf,
        /// The driver's name (its certificate's common name).
        #[arg(long)]
        driver: String,
        /// A DNS name or IP address the control plane reaches the driver at (repeat for each).
        #[arg(long = "host", required = true)]
        hosts: Vec<String>,
        #[arg(long)]
        out: PathBuf,
    },
}

/// How `serve` and `dev` listen.
#[derive(Debug, Args)]
struct TransportArgs {
    /// The PKI bundle's folder (made by `better-compute pki init`): the API speaks TLS with its server
    /// certificate, and verifies node certificates against its CA.
    #[arg(long, env = "BETTER_COMPUTE_PKI_DIR")]
    pki_dir: Option<PathBuf>,

    /// Present this certificate chain (PEM) instead of the bundle's server certificate; needs --tls-key.
    #[arg(long, env = "BETTER_COMPUTE_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,

    /// The key of --tls-cert (PEM).
    #[arg(long, env = "BETTER_COMPUTE_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,

    /// Serve plain HTTP, for a proxy in front that terminates TLS. Node certificates are not checked then.
    #[arg(long, conflicts_with_all = ["pki_dir", "tls_cert", "tls_key"])]
    insecure_http: bool,
}

impl TransportArgs {
    fn transport(&self) -> anyhow::Result<service::Transport> {
        if self.insecure_http {
            return Ok(service::Transport::InsecureHttp);
        }
        let Some(dir) = &self.pki_dir else {
            anyhow::bail!(
                "serve needs TLS: give --pki-dir (make a bundle with `better-compute pki init --dir DIR`), or \
                 --insecure-http behind a proxy that terminates TLS"
            );
        };
        let certificate = self.tls_cert.as_deref().zip(self.tls_key.as_deref());
        service::Transport::from_bundle(dir, certificate)
    }
}

#[derive(Debug, Subcommand)]
enum ProjectionsCommand {
    /// Each projection version's state, position, and lag in events and seconds.
    Status(DatabaseArgs),
    /// Rebuild a read model from the log while the live one keeps serving, then switch to it.
    Rebuild {
        /// The read model: pools, nodes, reservations, pool_capacity_rollup, audit_events.
        name: String,
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// Run the projection daemon alone (serve runs it too).
    Run {
        /// Events per batch once caught up; while a read model is behind, its batches double up to 10,000 (or
        /// this, if larger).
        #[arg(long, default_value_t = 500)]
        batch: u32,
        /// Crash-recovery test hook: abort in the middle of the n-th batch that applies events.
        #[arg(long, env = "BETTER_COMPUTE_FAILPOINT_ABORT_MID_BATCH", hide = true)]
        abort_mid_batch: Option<u64>,
        /// How long each projection's lease lives without renewal, in milliseconds (the seed default: 15 s).
        #[arg(long, default_value_t = 15_000)]
        lease_ttl_ms: u64,
        /// How often the leases are renewed, in milliseconds; less than the lease's life (default 5 s).
        #[arg(long, default_value_t = 5_000)]
        lease_renew_ms: u64,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

#[derive(Debug, Subcommand)]
enum EventsCommand {
    /// Follow the log live, one JSON line per event.
    Tail {
        /// Start after this position (`<epoch>-<txid>-<seq>`; `0-0-0` for the whole log). Default: now.
        #[arg(long)]
        after: Option<Position>,
        /// Only these event types (repeatable; `reservation.*` matches a family).
        #[arg(long = "type")]
        types: Vec<String>,
        /// Only this stream.
        #[arg(long)]
        stream: Option<String>,
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// A stream's history, with the admission context of each event.
    Show {
        stream: String,
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// The state of a stream, or of a pool's capacity, as the fold of the log up to a position.
    Replay {
        /// The last position to include.
        #[arg(long, visible_alias = "at")]
        until: Position,
        /// With --pool: what changed in the pool (capacity, bookings, quotas, policy) from --until to this
        /// position.
        #[arg(long)]
        diff: Option<Position>,
        /// The stream whose state to fold.
        #[arg(long, conflicts_with = "pool", required_unless_present = "pool")]
        stream: Option<String>,
        /// The pool whose capacity to fold.
        #[arg(long)]
        pool: Option<String>,
        #[command(flatten)]
        database: DatabaseArgs,
    },
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

/// How images are taken.
#[derive(Debug, Args)]
struct ImageArgs {
    /// The image signers' allowlist (TOML: `[[signer]]` tables of `name` and `public-key`, an Ed25519 public key
    /// in PEM). An image whose signature one of them made is `verified`; without the file every image is stored
    /// unverified and a signature is refused.
    #[arg(long, env = "BETTER_COMPUTE_IMAGE_SIGNERS")]
    image_signers: Option<PathBuf>,

    /// The largest image taken, in bytes (64 GiB by default).
    #[arg(long, env = "BETTER_COMPUTE_IMAGE_MAX_BYTES", default_value_t = bc_commands::images::DEFAULT_MAX_IMAGE_BYTES)]
    image_max_bytes: u64,
}

impl ImageArgs {
    fn policy(&self) -> anyhow::Result<bc_commands::images::ImagePolicy> {
        let signers = match &self.image_signers {
            Some(path) => bc_commands::images::ImageSigners::load(path).map_err(anyhow::Error::msg)?,
            None => bc_commands::images::ImageSigners::none(),
        };
        if self.image_max_bytes == 0 {
            anyhow::bail!("--image-max-bytes must be above 0");
        }
        Ok(bc_commands::images::ImagePolicy { signers, max_bytes: self.image_max_bytes })
    }
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "BETTER_COMPUTE_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,

    /// The built-in authorizer's file (TOML): the bootstrap of tenants, bearer tokens (as SHA-256), relations on
    /// pools and attribute limits; the rest is administered through the API. `better-compute dev` writes an
    /// example.
    #[arg(long, env = "BETTER_COMPUTE_AUTH_CONFIG", required_unless_present = "authorizer_url")]
    auth_config: Option<PathBuf>,

    /// Ask an external decision service (Better IAM, or your own) instead of the built-in authorizer: see
    /// docs/operations.md for its two calls.
    #[arg(long, env = "BETTER_COMPUTE_AUTHORIZER_URL", conflicts_with = "auth_config")]
    authorizer_url: Option<String>,

    /// The CA certificate (PEM) an https --authorizer-url chains to.
    #[arg(long, env = "BETTER_COMPUTE_AUTHORIZER_CA", requires = "authorizer_url")]
    authorizer_ca: Option<PathBuf>,

    /// Do not apply migrations on start (run `better-compute migrate` first).
    #[arg(long)]
    no_migrate: bool,

    /// What this process runs: `api` (the HTTP API and event stream), `worker` (the work queue's shards and the
    /// projections, with a health check over HTTP) or `all`. Run as many of each as needed on one database.
    #[arg(long, env = "BETTER_COMPUTE_ROLE", default_value = "all")]
    role: service::Role,

    /// How long shard, projection and gateway leases live without renewal, in milliseconds (seed: 15 s for
    /// shards and projections, 20 s for gateways); a dead process's work is taken over after this.
    #[arg(long)]
    lease_ttl_ms: Option<u64>,

    /// How often those leases are renewed, in milliseconds (seed: 5 s); less than their life.
    #[arg(long)]
    lease_renew_ms: Option<u64>,

    /// Attempts of one webhook delivery before the event becomes a dead letter.
    #[arg(long, env = "BETTER_COMPUTE_WEBHOOK_ATTEMPTS", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=30))]
    webhook_attempts: u32,

    /// The pause after a webhook delivery's first failure, in milliseconds; it doubles after each later one
    /// (up to five minutes), with up to half of it again added at random.
    #[arg(long, env = "BETTER_COMPUTE_WEBHOOK_BACKOFF_MS", default_value_t = 1000)]
    webhook_backoff_ms: u64,

    /// The longest one webhook POST may take, in milliseconds.
    #[arg(long, env = "BETTER_COMPUTE_WEBHOOK_TIMEOUT_MS", default_value_t = 10_000)]
    webhook_timeout_ms: u64,

    /// A web origin whose pages may call the API (CORS), as `https://console.example.com`; repeat for more.
    /// None by default: browsers then refuse other origins' pages.
    #[arg(long = "cors-origin", env = "BETTER_COMPUTE_CORS_ORIGINS", value_delimiter = ',')]
    cors_origins: Vec<String>,

    /// Event streams (`GET /v1/events`) this process serves at once; more are refused with 429.
    #[arg(long, env = "BETTER_COMPUTE_EVENTS_MAX_STREAMS", default_value_t = StreamLimits::default().process, value_parser = open_limit())]
    events_max_streams: usize,

    /// Event streams one tenant's identities hold open at once, together.
    #[arg(long, env = "BETTER_COMPUTE_EVENTS_MAX_STREAMS_PER_TENANT", default_value_t = StreamLimits::default().tenant, value_parser = open_limit())]
    events_max_streams_per_tenant: usize,

    /// Event streams one identity holds open at once.
    #[arg(long, env = "BETTER_COMPUTE_EVENTS_MAX_STREAMS_PER_IDENTITY", default_value_t = StreamLimits::default().identity, value_parser = open_limit())]
    events_max_streams_per_identity: usize,

    /// Connections this process keeps open at once, TLS handshakes included. At the limit it stops accepting
    /// until one closes: new clients wait in the kernel's queue. It also raises its limit on open files to the
    /// hard limit, and warns when that is below this and a thousand more.
    #[arg(long, env = "BETTER_COMPUTE_MAX_CONNECTIONS", default_value_t = bc_api::tls::MAX_CONNECTIONS, value_parser = open_limit())]
    max_connections: usize,

    /// Requests one bearer token may have in flight at once; past it the API answers `429 TOO_MANY_REQUESTS`
    /// with `Retry-After` at once, so that one client's flood does not queue every other caller behind it.
    /// Event streams are not counted (they have limits of their own).
    #[arg(long, env = "BETTER_COMPUTE_MAX_REQUESTS_PER_TOKEN", default_value_t = bc_api::http::in_flight::MAX_REQUESTS_PER_TOKEN, value_parser = open_limit())]
    max_requests_per_token: usize,

    /// How long a client may take to send a request's head, in seconds, counted from the connection's start or
    /// its last answer: also how long an idle connection is kept. Behind a load balancer, keep it above the
    /// balancer's idle timeout.
    #[arg(long, env = "BETTER_COMPUTE_REQUEST_HEAD_TIMEOUT_S", default_value_t = bc_api::tls::REQUEST_HEAD_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..=3600))]
    request_head_timeout_s: u64,

    #[command(flatten)]
    transport: TransportArgs,

    #[command(flatten)]
    images: ImageArgs,

    /// The CA certificates (PEM) of the Better Compute deployments provider pools may borrow from: the built-in
    /// `better-compute` driver trusts only these.
    #[arg(long, env = "BETTER_COMPUTE_PROVIDER_TRUST")]
    provider_trust: Option<PathBuf>,

    /// An out-of-process provider driver, `provider=https://host:port` (repeat for each): called over the driver
    /// protocol's mutual TLS with an identity from the PKI bundle; it replaces a built-in one of that name.
    #[arg(long = "provider-driver", env = "BETTER_COMPUTE_PROVIDER_DRIVERS", value_delimiter = ',')]
    provider_drivers: Vec<String>,

    #[command(flatten)]
    database: DatabaseArgs,
}

/// A limit on open event streams or connections: 1 to a million.
fn open_limit() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000)
}

impl ServeArgs {
    fn options(&self) -> anyhow::Result<service::ServeOptions> {
        let mut options = service::ServeOptions {
            role: self.role,
            cors_origins: self.cors_origins.clone(),
            images: self.images.policy()?,
            webhooks: bc_api::webhooks::WebhookConfig {
                attempts: self.webhook_attempts,
                backoff: Duration::from_millis(self.webhook_backoff_ms),
                timeout: Duration::from_millis(self.webhook_timeout_ms.max(1)),
                ..Default::default()
            },
            request_head_timeout: Duration::from_secs(self.request_head_timeout_s),
            requests_per_token: self.max_requests_per_token,
            events: bc_api::http::events::EventsConfig {
                limits: StreamLimits {
                    process: self.events_max_streams,
                    tenant: self.events_max_streams_per_tenant,
                    identity: self.events_max_streams_per_identity,
                },
                ..Default::default()
            },
            ..Default::default()
        };
        if let Some(path) = &self.provider_trust {
            options.provider_trust = Some(
                std::fs::read_to_string(path).with_context(|| format!("read --provider-trust {}", path.display()))?,
            );
        }
        for driver in &self.provider_drivers {
            let Some((name, url)) = driver.split_once('=') else {
                anyhow::bail!("--provider-driver {driver:?}: expected provider=https://host:port");
            };
            if !url.starts_with("https://") {
                anyhow::bail!("--provider-driver {driver:?}: drivers are reached over mutual TLS (https://)");
            }
            options.provider_drivers.push((name.to_owned(), url.to_owned()));
        }
        if self.lease_ttl_ms.is_some() || self.lease_renew_ms.is_some() {
            let ttl = self.lease_ttl_ms.unwrap_or(15_000);
            let renew = self.lease_renew_ms.unwrap_or(5_000);
            if renew == 0 || renew >= ttl {
                anyhow::bail!("--lease-renew-ms ({renew}) must be above 0 and below --lease-ttl-ms ({ttl})");
            }
            let config = bc_eventstore::lease::LeaseConfig {
                ttl: Duration::from_millis(ttl),
                renew_every: Duration::from_millis(renew),
            };
            options.work_lease = config;
            options.gateway_lease = config;
        }
        Ok(options)
    }
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

    /// The built-in authorizer's file (default: auth.toml in the data folder, written on first start with a
    /// platform token and a demo customer's token).
    #[arg(long, env = "BETTER_COMPUTE_AUTH_CONFIG")]
    auth_config: Option<PathBuf>,

    /// The PKI bundle's folder (default: pki in the data folder, made on the first start).
    #[arg(long, env = "BETTER_COMPUTE_PKI_DIR")]
    pki_dir: Option<PathBuf>,

    /// Serve plain HTTP instead of TLS.
    #[arg(long, conflicts_with = "pki_dir")]
    insecure_http: bool,

    #[command(flatten)]
    images: ImageArgs,

    #[command(flatten)]
    database: DatabaseArgs,
}

fn connect(args: &DatabaseArgs) -> anyhow::Result<Db> {
    Ok(Db::connect_lazy(args.required_url()?, &args.config())?)
}

fn migrate_on_start(no_migrate: bool) -> MigrateOnStart {
    if no_migrate { MigrateOnStart::Skip } else { MigrateOnStart::Migrate }
}

fn main() -> std::process::ExitCode {
    bc_pki::tls::install_default_provider();
    let cli = Cli::parse();
    match start(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // One line a person can act on, never a backtrace: the code of the first error in the chain that
            // has one, then the chain of causes.
            eprintln!("better-compute: {}", describe(&err));
            std::process::ExitCode::FAILURE
        }
    }
}

fn start(cli: Cli) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&cli.log).context("parse --log")?)
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("start the runtime")?;
    runtime.block_on(run(cli.command))
}

/// An error as one line: `CODE: what, because why` where the chain holds a coded error.
fn describe(err: &anyhow::Error) -> String {
    let code = err.chain().find_map(|cause| {
        if let Some(store) = cause.downcast_ref::<bc_eventstore::Error>() {
            return Some(store.code());
        }
        cause.downcast_ref::<bc_commands::auth::InvalidConfig>().map(|_| "INVALID_CONFIG")
    });
    let text = format!("{err:#}").replace('\n', " ");
    match code {
        Some(code) if !text.starts_with(code) => format!("{code}: {text}"),
        _ => text,
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve(args) => {
            let shutdown = service::shutdown_signal();
            let mut options = args.options()?;
            let auth = match (&args.authorizer_url, &args.auth_config) {
                (Some(url), _) => {
                    let ca = args.authorizer_ca.as_ref().map(std::fs::read_to_string).transpose()?;
                    service::external_authorizer(url, ca.as_deref())?
                }
                (None, Some(path)) => service::load_authorizer(path)?,
                (None, None) => anyhow::bail!("serve needs --auth-config or --authorizer-url"),
            };
            let transport = args.transport.transport()?;
            options.pki = transport.pki();
            let db = Db::connect_lazy(args.database.required_url()?, &args.database.config())?;
            service::prepare(&db, migrate_on_start(args.no_migrate)).await?;
            let listener = service::bind(args.listen, &transport, args.max_connections).await?;
            service::serve_with(db, auth, listener, options, shutdown).await
        }
        Command::Doctor { threshold_secs, pki_dir, database } => {
            let db = connect(&database)?;
            let thresholds = bc_api::doctor::Thresholds { too_old: Duration::from_secs(threshold_secs) };
            let mut findings = bc_api::doctor::examine(&db, thresholds).await;
            findings.extend(bc_api::doctor::pki(pki_dir.as_deref()));
            if bc_api::doctor::report(&findings) { Ok(()) } else { std::process::exit(1) }
        }
        Command::Migrate(args) => {
            // The method table against Better Compute's own catalog, before anything touches the store.
            bc_api::http::check_routes(&bc_commands::auth::BuiltinAuthorizer::new(Default::default())?)?;
            let db = Db::connect_lazy(args.required_url()?, &args.config())?;
            service::migrate(&db).await
        }
        Command::Projections(command) => match command {
            ProjectionsCommand::Status(args) => bc_api::ops::projections_status(&connect(&args)?).await,
            ProjectionsCommand::Rebuild { name, database } => {
                bc_api::ops::projections_rebuild(&connect(&database)?, &name).await
            }
            ProjectionsCommand::Run { batch, abort_mid_batch, lease_ttl_ms, lease_renew_ms, database } => {
                if lease_renew_ms == 0 || lease_renew_ms >= lease_ttl_ms {
                    anyhow::bail!(
                        "--lease-renew-ms ({lease_renew_ms}) must be above 0 and below --lease-ttl-ms ({lease_ttl_ms})"
                    );
                }
                let config = bc_projections::framework::DaemonConfig {
                    batch: batch.max(1),
                    poll: Duration::from_millis(50),
                    abort_mid_batch,
                    lease: bc_eventstore::lease::LeaseConfig {
                        ttl: Duration::from_millis(lease_ttl_ms),
                        renew_every: Duration::from_millis(lease_renew_ms),
                    },
                    ..Default::default()
                };
                bc_api::ops::projections_run(connect(&database)?, config).await
            }
        },
        Command::Events(command) => match command {
            EventsCommand::Tail { after, types, stream, database } => {
                bc_api::ops::events_tail(&connect(&database)?, after, &types, stream.as_deref()).await
            }
            EventsCommand::Show { stream, database } => bc_api::ops::events_show(&connect(&database)?, &stream).await,
            EventsCommand::Replay { until, diff, stream, pool, database } => {
                let target = match (stream, pool, diff) {
                    (Some(_), _, Some(_)) => {
                        anyhow::bail!(
                            "INVALID_ARGUMENT: --diff compares a pool at two positions: give --pool, not --stream"
                        )
                    }
                    (Some(stream), _, None) => bc_api::ops::ReplayTarget::Stream(stream),
                    (None, Some(pool), Some(to)) => bc_api::ops::ReplayTarget::PoolDiff { pool, to },
                    (None, Some(pool), None) => bc_api::ops::ReplayTarget::PoolCapacity(pool),
                    (None, None, _) => anyhow::bail!("name a --stream or a --pool"),
                };
                bc_api::ops::events_replay(&connect(&database)?, until, target).await
            }
        },
        Command::Pki(command) => pki(command),
        Command::Audit(AuditCommand::Export(args)) => {
            let bundle = cli::audit::export(&args).await?;
            println!("{}", serde_json::to_string_pretty(&bundle)?);
            Ok(())
        }
        Command::Audit(AuditCommand::Verify { bundle, public_key, pki_dir, database, tenant, db }) => {
            let pinned = match (public_key, pki_dir) {
                (Some(key), _) => Some(key.trim().to_ascii_lowercase()),
                (None, Some(dir)) => Some(bc_pki::Bundle::load(&dir)?.audit_signer().public_key_hex()),
                (None, None) => None,
            };
            if database {
                let key = pinned.context("--database needs the key: give --pki-dir or --public-key")?;
                let tenant = tenant.map(|t| t.parse::<bc_domain::id::TenantId>()).transpose()?;
                let app = bc_commands::App::new(connect(&db)?);
                let failures = app.verify_audit_checkpoints(tenant.as_ref(), &key).await?;
                return cli::audit::report(&failures, "every checkpoint matches the audit rows");
            }
            let path = bundle.context("name the bundle to verify, or give --database")?;
            let bundle = cli::audit::read_bundle(&path)?;
            let key = match (pinned, &bundle.public_key) {
                (Some(key), _) => key,
                (None, Some(key)) => {
                    eprintln!("warning: no key pinned; verifying against the key the bundle names, {key}");
                    key.clone()
                }
                (None, None) => anyhow::bail!("no key to verify against: give --public-key or --pki-dir"),
            };
            let failures = cli::audit::verify_bundle(&bundle, &key);
            let checked = format!(
                "{} checkpoints, {} entries, {} proofs verified against key {key}",
                bundle.checkpoints.len(),
                bundle.entries.len(),
                bundle.proofs.len()
            );
            cli::audit::report(&failures, &checked)
        }
        Command::Get(args) => cli::get(args).await,
        Command::Describe(args) => cli::describe(args).await,
        Command::Reserve(args) => cli::reserve(args).await,
        Command::Cancel(args) => cli::cancel(args).await,
        Command::Release(args) => cli::release(args).await,
        Command::Cordon(args) => cli::cordon(args).await,
        Command::Uncordon(args) => cli::uncordon(args).await,
        Command::Drain(args) => cli::drain(args).await,
        Command::Config(command) => cli::config(command),
        Command::Fleet(command) => cli::fleet(command).await,
        Command::Ledger(args) => cli::ledger::ledger(args).await,
        Command::Whoami { connection } => cli::whoami(connection).await,
        Command::Completion { shell } => {
            cli::completion(shell, &mut <Cli as clap::CommandFactory>::command(), &mut std::io::stdout());
            Ok(())
        }
        Command::Workflows(WorkflowsCommand::Watch { id, database }) => {
            bc_api::ops::workflows_watch(&connect(&database)?, &id).await
        }
        Command::Dev(args) => {
            let data_dir = match args.data_dir {
                Some(dir) => dir,
                None => dev::default_data_dir()?,
            };
            dev::check_data_dir(&data_dir)?;
            dev::run(DevConfig {
                images: args.images.policy()?,
                listen: args.listen,
                auth_config: args.auth_config,
                database_url: args.database.database_url.clone().filter(|url| !url.is_empty()),
                migrate: migrate_on_start(args.no_migrate),
                db: args.database.config(),
                pg: bc_eventstore::cluster::PgSearch::from_env(),
                transport: if args.insecure_http {
                    dev::DevTransport::InsecureHttp
                } else {
                    dev::DevTransport::Tls { pki_dir: args.pki_dir.unwrap_or_else(|| data_dir.join("pki")) }
                },
                data_dir,
            })
            .await
        }
    }
}

fn pki(command: PkiCommand) -> anyhow::Result<()> {
    match command {
        PkiCommand::Init { dir, names } => {
            let mut options = bc_pki::InitOptions::default();
            if !names.is_empty() {
                options.server_names = names;
            }
            let bundle = bc_pki::Bundle::init(&dir, &options)?;
            println!("made the PKI bundle in {}", dir.display());
            println!("  CA certificate: {} (sha256 {})", dir.join("ca.crt").display(), bundle.ca_fingerprint());
            println!("  server certificate for: {}", options.server_names.join(", "));
            println!("back this folder up with the database: a new bundle makes every node join again");
            Ok(())
        }
        PkiCommand::Show { dir } => {
            let bundle = bc_pki::Bundle::load(&dir)?;
            let (server, _) = bundle.server_certificate();
            let (ca_from, ca_until) = bc_pki::certificate_validity(bundle.ca_pem())?;
            let (_, server_until) = bc_pki::certificate_validity(server)?;
            println!("PKI bundle in {}", dir.display());
            println!("  CA sha256 {}", bundle.ca_fingerprint());
            println!("  CA valid from {} until {}", bc_pki::date(ca_from), bc_pki::date(ca_until));
            println!("  server certificate valid until {}", bc_pki::date(server_until));
            println!("  audit key (ed25519) {}", bundle.audit_signer().public_key_hex());
            Ok(())
        }
        PkiCommand::DriverIdentity { dir, driver, hosts, out } => {
            let bundle = bc_pki::Bundle::load(&dir)?;
            let (cert, key) = bundle.issue_driver_identity(&driver, &hosts)?;
            std::fs::create_dir_all(&out)?;
            std::fs::write(out.join("ca.crt"), bundle.ca_pem())?;
            std::fs::write(out.join("driver.crt"), cert)?;
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create(true).truncate(true);
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            std::io::Write::write_all(&mut options.open(out.join("driver.key"))?, key.as_bytes())?;
            println!("issued driver {driver}'s identity for {} into {}", hosts.join(", "), out.display());
            Ok(())
        }
        PkiCommand::ServerCertificate { dir, names } => {
            let mut bundle = bc_pki::Bundle::load(&dir)?;
            bundle.reissue_server_certificate(&names)?;
            println!(
                "issued a new server certificate for {} in {}; restart serve to use it",
                names.join(", "),
                dir.display()
            );
            Ok(())
        }
    }
}
