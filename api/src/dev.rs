//! `better-compute dev`: the service on an embedded database. With no database URL it starts (or reuses) a
//! persistent private PostgreSQL cluster in a data folder, creates the `better_compute` database, migrates,
//! seeds a demo fleet into an empty database, starts its simulated machines' agents in process, and serves;
//! Ctrl-C stops the agents, the service, and then the cluster it started.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use bc_eventstore::cluster::{Cluster, InitOptions, PgBinaries, PgSearch, RunAs, StopMode, running_as_root};
use bc_eventstore::{Db, DbConfig};
use sqlx::{ConnectOptions as _, Connection as _};

use bc_domain::pool::{PoolAgent, PoolClass, PoolPolicy, Sharing};
use bc_domain::site::SiteKind;

use crate::service::{self, MigrateOnStart};
use bc_commands::fleet::{CreatePool, CreateSite, OfferPool};
use bc_commands::{App, Caller};

/// The database `dev` creates in its cluster.
pub const DEV_DATABASE: &str = "better_compute";

/// Where the embedded cluster lives when `--data-dir` is not given: under the user's data folder, or, for
/// root (whose home the `postgres` user cannot enter), under `/var/lib/better-compute`.
pub fn default_data_dir() -> anyhow::Result<PathBuf> {
    if running_as_root() {
        return Ok(PathBuf::from("/var/lib/better-compute/dev"));
    }
    let base = dirs::data_dir().context("find the user's data folder (set --data-dir)")?;
    Ok(base.join("better-compute").join("dev"))
}

/// The embedded database, started by `dev` or found running.
#[derive(Debug)]
pub struct EmbeddedDatabase {
    pub cluster: Cluster,
    /// Whether this process owns the cluster (and so stops it at the end).
    started_here: bool,
}

impl EmbeddedDatabase {
    /// Creates the cluster in `data_dir` if it is new, and starts it unless it is already running. Call it
    /// holding the data folder's lock: a cluster found running then was left by a `dev` that crashed (no
    /// other `dev` can hold the folder), and this one adopts it, stopping it at the end like one it started.
    pub fn start(data_dir: &Path, search: &PgSearch) -> anyhow::Result<Self> {
        let bins = PgBinaries::find(search)?;
        let run_as = RunAs::for_this_process()?;
        let cluster = Cluster::new(bins, data_dir.to_path_buf(), run_as);
        if !cluster.is_initialized() {
            if let Some(parent) = data_dir.parent() {
                std::fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
            }
            tracing::info!(path = %data_dir.display(), "creating the embedded database cluster");
            cluster.init(&InitOptions::default())?;
        }
        if cluster.is_running() {
            tracing::info!(path = %data_dir.display(), "adopting the embedded database cluster a stopped dev left running");
            return Ok(Self { cluster, started_here: true });
        }
        cluster.start()?;
        tracing::info!(path = %data_dir.display(), "started the embedded database cluster");
        Ok(Self { cluster, started_here: true })
    }

    /// Creates the `better_compute` database if it does not exist, and returns a pool on it.
    pub async fn connect(&self, config: &DbConfig) -> anyhow::Result<Db> {
        let mut admin =
            self.cluster.connect_options("postgres").connect().await.context("connect to the embedded cluster")?;
        let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .persistent(false)
            .bind(DEV_DATABASE)
            .fetch_one(&mut admin)
            .await
            .context("look for the dev database")?;
        if !exists {
            sqlx::raw_sql(concat!("CREATE DATABASE ", "better_compute"))
                .execute(&mut admin)
                .await
                .context("create the dev database")?;
        }
        admin.close().await.ok();
        Ok(Db::connect_lazy_with(self.cluster.connect_options(DEV_DATABASE), config))
    }

    /// Stops the cluster if this process started it.
    pub fn stop(&self) -> anyhow::Result<()> {
        if self.started_here {
            self.cluster.stop(StopMode::Fast)?;
            tracing::info!("stopped the embedded database cluster");
        }
        Ok(())
    }
}

/// The demo pools: name, GPU model.
const DEMO_POOLS: &[(&str, &str)] = &[("h100", "H100"), ("a100", "A100")];

/// The demo machines: host name, pool, simulated GPUs.
const DEMO_AGENTS: &[(&str, &str, &str)] = &[
    ("gpu-h100-0", "h100", "8xH100"),
    ("gpu-h100-1", "h100", "8xH100"),
    ("gpu-h100-2", "h100", "8xH100"),
    ("gpu-a100-0", "a100", "4xA100-SXM4-80GB"),
    ("gpu-a100-1", "a100", "4xA100-SXM4-80GB"),
];

fn dev_operator() -> anyhow::Result<Caller> {
    Ok(Caller::new("root".parse()?, "operator@dev".parse()?, "system"))
}

/// Seeds a small demo fleet into an empty database: a site and two exclusive pools (H100 and A100), owned by the
/// platform (tenant `root`) and offered to the demo tenant. Its machines are simulated agents that join when
/// `dev` starts ([`start_demo_agents`]). A database that has any site is left alone.
pub async fn seed_demo_fleet(db: &Db) -> anyhow::Result<()> {
    let mut tx = db.begin(bc_eventstore::TxOptions::READ_ONLY).await?;
    let sites: i64 = bc_eventstore::sql::query_scalar("SELECT count(*) FROM sites").fetch_one(tx.conn()).await?;
    tx.commit().await?;
    if sites > 0 {
        return Ok(());
    }
    let app = App::new(db.clone());
    let operator = dev_operator()?;
    let site = app
        .create_site(
            &operator,
            CreateSite { name: "demo".into(), iam_region: "local-1".into(), kind: SiteKind::Shared },
        )
        .await?
        .value;
    for (name, model) in DEMO_POOLS {
        let pool = app
            .create_pool(
                &operator,
                CreatePool {
                    site_id: site.clone(),
                    name: (*name).into(),
                    class: PoolClass::MetalHost,
                    gpu_model: (*model).into(),
                    sharing: Sharing::Exclusive,
                    agent: PoolAgent::Bcd,
                    policy: PoolPolicy::default(),
                    provider_account_id: None,
                },
            )
            .await?
            .value;
        let offer = OfferPool {
            tenant_id: DEMO_TENANT.parse()?,
            quota: [("gpu".to_owned(), 8)].into(),
            priority: 0,
            include_descendants: false,
        };
        app.offer_pool(&operator, &pool, offer).await?;
    }
    tracing::info!("seeded a demo fleet: site demo, pools h100 and a100 (offered to tenant {DEMO_TENANT})");
    Ok(())
}

/// The demo agents running in this process.
pub struct DemoAgents {
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl DemoAgents {
    /// Stops the agents (their nodes go silent, as machines that were switched off).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            match task.await {
                Ok(Err(err)) => tracing::warn!(error = %err, "a demo agent failed"),
                Err(err) => tracing::warn!(error = %err, "a demo agent panicked"),
                Ok(Ok(())) => {}
            }
        }
    }
}

/// Starts the demo machines' agents in this process, against the API at `server`: each keeps its credential
/// under `<data dir>/agents/<host>` and joins with a fresh join token the first time. Machines whose pool is
/// not in the database (it was seeded by an older `dev`) are left out.
pub async fn start_demo_agents(
    db: &Db,
    server: &str,
    trust: &bc_agent::run::ServerTrust,
    data_dir: &Path,
) -> anyhow::Result<DemoAgents> {
    let app = App::new(db.clone());
    let operator = dev_operator()?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for (host, pool_name, gpus) in DEMO_AGENTS {
        let mut tx = db.begin(bc_eventstore::TxOptions::READ_ONLY).await?;
        let pool: Option<String> =
            bc_eventstore::sql::query_scalar("SELECT id FROM pools WHERE owner_tenant_id = 'root' AND name = $1")
                .bind(*pool_name)
                .fetch_optional(tx.conn())
                .await?;
        tx.commit().await?;
        let Some(pool) = pool else { continue };
        let state_dir = data_dir.join("agents").join(host);
        let join_token = match bc_agent::run::saved_node(&state_dir)? {
            Some(_) => None,
            None => Some(app.create_join_token(&operator, &pool.parse()?, 3600).await?.value.token),
        };
        let spec: bc_agent::simulate::Simulated = gpus.parse().map_err(anyhow::Error::msg)?;
        let (inventory, _) = bc_agent::run::InventorySource::simulated(bc_agent::simulate::inventory(host, &spec));
        let config = bc_agent::run::AgentConfig {
            server: server.to_owned(),
            trust: trust.clone(),
            join_token,
            cdi_dir: state_dir.join("cdi"),
            state_dir,
            inventory,
            inventory_every: 60,
            site: None,
            runtime: None,
        };
        let mut stopped = stopped.clone();
        tasks.push(tokio::spawn(bc_agent::run::run(config, async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        })));
    }
    Ok(DemoAgents { stop, tasks })
}

/// Waits (a bounded time) until every demo machine's node is connected and schedulable, so the welcome comes
/// when GPUs can be reserved.
async fn await_demo_nodes(db: &Db) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let mut tx = db.begin(bc_eventstore::TxOptions::READ_ONLY).await?;
        let ready: i64 =
            bc_eventstore::sql::query_scalar("SELECT count(*) FROM nodes WHERE schedulable AND name = ANY($1)")
                .bind(DEMO_AGENTS.iter().map(|(host, _, _)| *host).collect::<Vec<_>>())
                .fetch_one(tx.conn())
                .await?;
        tx.commit().await?;
        if ready as usize == DEMO_AGENTS.len() || tokio::time::Instant::now() > deadline {
            tracing::info!(ready, "demo agents connected");
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The demo customer tenant `dev` creates.
pub const DEMO_TENANT: &str = "acme";

/// A fresh development token (two ULIDs: 160 random bits).
fn new_token() -> String {
    format!("bc_dev_{}{}", ulid::Ulid::new(), ulid::Ulid::new()).to_ascii_lowercase()
}

/// The built-in authorizer's file for `dev`: the platform's administrator and a demo customer, with a pool
/// relation and an attribute limit to show. Written once into the data folder; returns the two tokens.
pub fn dev_auth_config(path: &Path) -> anyhow::Result<(String, String)> {
    if !path.exists() {
        let text = format!(
            r#"# Written by `better-compute dev`: the built-in authorizer's file (see `better-compute serve --help`).

[[tenants]]
id = "{DEMO_TENANT}"
parent = "root"

[[identities]]
identity = "ops@platform"
tenant = "root"
admin = true
token = "{}"

[[identities]]
identity = "alice@{DEMO_TENANT}"
tenant = "{DEMO_TENANT}"
token = "{}"

[[grants]]
tenant = "{DEMO_TENANT}"
relation = "user"

[[limits]]
relation = "user"
gpu_model = "H100"
max_gpus = 8
max_hours = 72
"#,
            new_token(),
            new_token()
        );
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
        }
        std::fs::write(path, text).with_context(|| format!("write {}", path.display()))?;
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let tokens: Vec<String> = text
        .lines()
        .filter_map(|line| line.trim().strip_prefix("token = \""))
        .filter_map(|rest| rest.strip_suffix('"'))
        .map(str::to_owned)
        .collect();
    match tokens.as_slice() {
        [root, demo, ..] => Ok((root.clone(), demo.clone())),
        _ => bail!("{} holds no development tokens; remove it to have dev write a new one", path.display()),
    }
}

/// Prints how to call the API as the platform and as the demo customer.
fn print_welcome(base: &str, ca: Option<&Path>, root: &str, demo: &str) {
    let curl = match ca {
        Some(ca) => format!("curl --cacert {}", ca.display()),
        None => "curl".to_owned(),
    };
    println!("better-compute dev: call the API with one of these headers");
    println!("  platform administrator (ops@platform): Authorization: Bearer {root}");
    println!("  demo customer (alice@{DEMO_TENANT}):        Authorization: Bearer {demo}");
    if let Some(ca) = ca {
        println!("the API speaks TLS with a certificate of dev's own CA, {}: trust that file", ca.display());
    }
    println!("for example:");
    println!("  {curl} -H 'Authorization: Bearer {demo}' {base}/v1/pools");
    println!(
        "  {curl} -H 'Authorization: Bearer {demo}' -H 'Idempotency-Key: first' -H 'Content-Type: application/json' \\\n       -d '{{\"poolId\": \"<id from /v1/pools>\", \"devices\": {{\"class\": \"gpu\", \"count\": 2}}, \"duration\": 3600}}' {base}/v1/reservations"
    );
    println!("  {curl} -N -H 'Authorization: Bearer {demo}' {base}/v1/events");
    println!("the console: {base}/console (sign in with one of the tokens above)");
    // The CLI's contexts, so that `better-compute get pools` works at once; a configuration that cannot be
    // written is said, not fatal.
    match crate::cli::add_dev_contexts(base, ca, root, demo) {
        Ok(path) => println!(
            "the CLI: better-compute get nodes (as the administrator; --context dev-demo as the customer), set up in {}",
            path.display()
        ),
        Err(err) => println!("the CLI is not set up: {err:#}"),
    }
}

/// How `dev` listens.
#[derive(Debug, Clone)]
pub enum DevTransport {
    /// TLS with the PKI bundle in this folder, made on the first start.
    Tls { pki_dir: PathBuf },
    /// Plain HTTP (`--insecure-http`).
    InsecureHttp,
}

impl DevTransport {
    /// The transport and, for TLS, the CA certificate's file and its PEM text.
    fn prepare(&self, listen: std::net::SocketAddr) -> anyhow::Result<(service::Transport, Option<(PathBuf, String)>)> {
        match self {
            DevTransport::InsecureHttp => Ok((service::Transport::InsecureHttp, None)),
            DevTransport::Tls { pki_dir } => {
                let mut options = bc_pki::InitOptions::default();
                if !listen.ip().is_unspecified() && !listen.ip().is_loopback() {
                    options.server_names.push(listen.ip().to_string());
                }
                let made = !bc_pki::Bundle::exists(pki_dir);
                let bundle = bc_pki::Bundle::load_or_init(pki_dir, &options)?;
                if made {
                    tracing::info!(path = %pki_dir.display(), ca = %bundle.ca_fingerprint(), "made the PKI bundle");
                }
                let ca = bundle.ca_pem().to_owned();
                let transport = service::Transport::tls(bundle, None)?;
                Ok((transport, Some((pki_dir.join("ca.crt"), ca))))
            }
        }
    }
}

/// What `dev` needs.
#[derive(Debug, Clone)]
pub struct DevConfig {
    pub listen: std::net::SocketAddr,
    /// The built-in authorizer's file; by default `auth.toml` in the data folder, written on first start.
    pub auth_config: Option<PathBuf>,
    /// An existing database to use instead of the embedded one.
    pub database_url: Option<String>,
    pub data_dir: PathBuf,
    pub migrate: MigrateOnStart,
    pub db: DbConfig,
    /// Where the embedded database's PostgreSQL binaries are.
    pub pg: PgSearch,
    pub transport: DevTransport,
    /// How images are taken.
    pub images: bc_commands::images::ImagePolicy,
}

/// Locks `data_dir/dev.lock` for as long as `dev` runs, so that a second `dev` on the same folder refuses to
/// start instead of sharing the cluster, the authorization file and the agents' state with the first (the two
/// would then hang each other's shutdown). A cluster left running by a `dev` that crashed holds no lock, and is
/// reused.
fn lock_data_dir(data_dir: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::create_dir_all(data_dir).with_context(|| format!("create {}", data_dir.display()))?;
    let path = data_dir.join("dev.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("open {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => bail!(
            "another `better-compute dev` is running on {}: stop it first (Ctrl-C), or give this one another \
             --data-dir",
            data_dir.display()
        ),
        Err(std::fs::TryLockError::Error(err)) => Err(err).with_context(|| format!("lock {}", path.display())),
    }
}

/// Runs `dev` until Ctrl-C or SIGTERM.
pub async fn run(config: DevConfig) -> anyhow::Result<()> {
    let shutdown = service::shutdown_signal();
    let _lock = lock_data_dir(&config.data_dir)?;
    let auth_path = config.auth_config.clone().unwrap_or_else(|| config.data_dir.join("auth.toml"));
    let (root_token, demo_token) = dev_auth_config(&auth_path)?;
    let auth = service::load_authorizer(&auth_path)?;
    if let Some(url) = &config.database_url {
        let db = Db::connect_lazy(url, &config.db)?;
        service::prepare(&db, config.migrate).await?;
        let (transport, ca) = config.transport.prepare(config.listen)?;
        let listener = service::bind(config.listen, &transport, crate::tls::MAX_CONNECTIONS).await?;
        print_welcome(&listener.url()?, ca.as_ref().map(|(path, _)| path.as_path()), &root_token, &demo_token);
        let options =
            service::ServeOptions { pki: transport.pki(), images: config.images.clone(), ..Default::default() };
        return service::serve_with(db, auth, listener, options, shutdown).await;
    }

    let (data_dir, pg) = (config.data_dir.clone(), config.pg.clone());
    let embedded = tokio::task::spawn_blocking(move || EmbeddedDatabase::start(&data_dir, &pg))
        .await
        .context("start the embedded database")??;
    let result = async {
        let db = embedded.connect(&config.db).await?;
        service::prepare(&db, config.migrate).await?;
        seed_demo_fleet(&db).await.context("seed the demo fleet")?;
        println!(
            "better-compute dev: embedded database in {} (psql -h {} -U postgres {DEV_DATABASE})",
            embedded.cluster.root().display(),
            embedded.cluster.socket_dir().display(),
        );
        println!(
            "better-compute dev: the other commands take BETTER_COMPUTE_DATABASE_URL='{}'",
            embedded.cluster.url(DEV_DATABASE)
        );
        let (transport, ca) = config.transport.prepare(config.listen)?;
        let listener = service::bind(config.listen, &transport, crate::tls::MAX_CONNECTIONS).await?;
        let base = listener.url()?;
        // The agents reach the API at the address it listens on, or by loopback when it listens on every address:
        // both are names the certificate holds.
        let mut reach = listener.local_addr()?;
        if reach.ip().is_unspecified() {
            reach.set_ip(if reach.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        let scheme = if ca.is_some() { "https" } else { "http" };
        let agents_base = format!("{scheme}://{reach}");
        let trust = match &ca {
            Some((_, pem)) => bc_agent::run::ServerTrust::PinnedCa(pem.clone()),
            None => bc_agent::run::ServerTrust::InsecureHttp,
        };
        let (agents_up, agents_ready) = tokio::sync::oneshot::channel::<DemoAgents>();
        let signal = async move {
            shutdown.await;
            // The machines go first, so they do not outlive the API they talk to.
            if let Ok(agents) = agents_ready.await {
                agents.stop().await;
            }
        };
        let options =
            service::ServeOptions { pki: transport.pki(), images: config.images.clone(), ..Default::default() };
        let serving = tokio::spawn(service::serve_with(db.clone(), auth, listener, options, signal));
        let agents = start_demo_agents(&db, &agents_base, &trust, &config.data_dir).await?;
        await_demo_nodes(&db).await?;
        let _ = agents_up.send(agents);
        print_welcome(&base, ca.as_ref().map(|(path, _)| path.as_path()), &root_token, &demo_token);
        let served = serving.await.context("the server task")?;
        db.close().await;
        served
    }
    .await;
    let stopped = tokio::task::spawn_blocking(move || embedded.stop()).await.context("stop the embedded database")?;
    match (result, stopped) {
        (Err(err), _) => Err(err),
        (Ok(()), Err(err)) => Err(err),
        (Ok(()), Ok(())) => Ok(()),
    }
}

/// Refuses a data folder that is a file.
pub fn check_data_dir(path: &Path) -> anyhow::Result<()> {
    if path.exists() && !path.is_dir() {
        bail!("--data-dir {} is not a folder", path.display());
    }
    Ok(())
}
