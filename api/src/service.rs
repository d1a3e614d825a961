//! The service's lifecycle: connect, migrate (unless told not to), check the log's epoch, serve until a
//! shutdown signal.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use bc_eventstore::clock::ClockAnchor;
use bc_eventstore::lease::{self, LeaseConfig, LeaseKeeper};
use bc_eventstore::migrate::Migrator;
use bc_eventstore::shards::{ShardConfig, ShardKeeper};
use bc_eventstore::{Db, events};
use tokio::net::TcpListener;

use crate::tls::{Bound, ConnectionLimit, PlainListener, TlsListener, serve_http};

use bc_projections::framework::{self, DaemonConfig};
use bc_projections::models;

use crate::http::{self, AppState};
use bc_commands::auth::{Authorizer, BuiltinAuthorizer};
use bc_commands::worker::{Worker, WorkerConfig};
use bc_commands::{App, SHARDS};

/// Whether `serve` and `dev` apply migrations on start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrateOnStart {
    Migrate,
    Skip,
}

/// Loads the built-in authorizer from `path` and checks the method table against its catalog: a missing or
/// wrong entry stops the process with `INVALID_CONFIG` before anything touches the store.
pub fn load_authorizer(path: &Path) -> anyhow::Result<Arc<dyn Authorizer>> {
    let auth: Arc<dyn Authorizer> = Arc::new(BuiltinAuthorizer::from_file(path)?);
    http::check_routes(auth.as_ref())?;
    Ok(auth)
}

/// The external decision service at `url` (its TLS trusting `ca_pem`), checked against the method table.
pub fn external_authorizer(url: &str, ca_pem: Option<&str>) -> anyhow::Result<Arc<dyn Authorizer>> {
    let auth: Arc<dyn Authorizer> = Arc::new(crate::authorizer::HttpAuthorizer::new(url, ca_pem)?);
    http::check_routes(auth.as_ref())?;
    Ok(auth)
}

/// Applies the embedded migrations and reports what changed.
pub async fn migrate(db: &Db) -> anyhow::Result<()> {
    let report = Migrator::embedded().run(db).await.context("migrate the database")?;
    if report.applied.is_empty() {
        tracing::info!(already_applied = report.already_applied, "the database schema is up to date");
    } else {
        tracing::info!(applied = report.applied.len(), "applied migrations: {}", report.applied.join(", "));
    }
    if let Some(epoch) = report.raised_epoch {
        tracing::info!(epoch, "raised the event log epoch");
    }
    Ok(())
}

/// Prepares the database for serving: migrations (unless skipped), then the epoch check.
pub async fn prepare(db: &Db, migrate_on_start: MigrateOnStart) -> anyhow::Result<()> {
    if migrate_on_start == MigrateOnStart::Migrate {
        migrate(db).await?;
    }
    events::check_epoch(db).await.context("check the event log epoch")?;
    let anchor = ClockAnchor::sample(db).await.context("anchor the clock to the database")?;
    if anchor.is_skewed() {
        tracing::warn!(
            skew_ms = anchor.skew_ms(),
            "ClockSkew: this machine's clock differs from the database server's by more than a second"
        );
    }
    tracing::info!(mode = %anchor.mode(), "anchored business time to the database");
    Ok(())
}

/// The PKI a TLS listener serves with: the bundle (whose CA signs node certificates and whose revocation list
/// the handshakes check) and the certificate presented, when it is not the bundle's.
#[derive(Debug, Clone)]
pub struct Pki {
    pub bundle: Arc<bc_pki::Bundle>,
    /// A certificate chain and its key, PEM, presented instead of the bundle's server certificate.
    pub certificate: Option<(String, String)>,
}

impl Pki {
    /// The server configuration refusing the certificates `crl` revokes.
    pub fn server_config(&self, crl: Option<&[u8]>) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        let certificate = self.certificate.as_ref().map(|(c, k)| (c.as_str(), k.as_str()));
        Ok(bc_pki::tls::server_config_with_crl(&self.bundle, certificate, crl)?)
    }
}

/// How `serve` and `dev` listen.
#[derive(Debug, Clone)]
pub enum Transport {
    /// TLS with the PKI bundle.
    Tls(Pki),
    /// Plain HTTP, asked for explicitly (`--insecure-http`), for a proxy that terminates TLS in front.
    InsecureHttp,
}

impl Transport {
    /// TLS from the PKI bundle in `pki_dir`, presenting `certificate` (a PEM chain file and its key file)
    /// instead of the bundle's server certificate when given.
    pub fn from_bundle(pki_dir: &Path, certificate: Option<(&Path, &Path)>) -> anyhow::Result<Transport> {
        let bundle = bc_pki::Bundle::load(pki_dir)?;
        Transport::tls(bundle, certificate)
    }

    /// TLS from a loaded bundle.
    pub fn tls(bundle: bc_pki::Bundle, certificate: Option<(&Path, &Path)>) -> anyhow::Result<Transport> {
        let read = |path: &Path, what: &str| {
            std::fs::read_to_string(path).with_context(|| format!("read the TLS {what} {}", path.display()))
        };
        let certificate = match certificate {
            Some((chain, key)) => Some((read(chain, "certificate")?, read(key, "key")?)),
            None => None,
        };
        let pki = Pki { bundle: Arc::new(bundle), certificate };
        // Checked now, so that a bad certificate stops the start with its reason.
        pki.server_config(None)?;
        Ok(Transport::Tls(pki))
    }

    /// The PKI, for TLS.
    pub fn pki(&self) -> Option<Pki> {
        match self {
            Transport::Tls(pki) => Some(pki.clone()),
            Transport::InsecureHttp => None,
        }
    }
}

/// Binds `listen` (port 0 picks a free port), keeping at most `max_connections` open at once, and says where the
/// API is, on standard output, so that scripts and tests can find it. First raises the process's limit on open
/// files as far as it may go.
pub async fn bind(listen: SocketAddr, transport: &Transport, max_connections: usize) -> anyhow::Result<Bound> {
    raise_open_files_limit(max_connections);
    let listener = TcpListener::bind(listen).await.with_context(|| format!("listen on {listen}"))?;
    let limit = ConnectionLimit::new(max_connections);
    let bound = match transport {
        Transport::Tls(pki) => Bound::Tls(TlsListener::with_limit(listener, pki.server_config(None)?, limit)?),
        Transport::InsecureHttp => Bound::Plain(PlainListener::with_limit(listener, limit)),
    };
    let url = bound.url().context("read the listening address")?;
    tracing::info!(address = %url, "serving the API");
    println!("better-compute: serving {url}");
    Ok(bound)
}

/// File descriptors a serving process needs besides its connections: its database pool, the log, images being
/// uploaded, the runtime's own.
const FILES_BESIDES_CONNECTIONS: u64 = 1_024;

/// Raises this process's soft limit on open files to its hard limit. Many systems start a service with a soft
/// limit of 1,024, below the default limit on connections (and on event streams), where a busy server would fail
/// to accept, to reach its database and to open files; the hard limit is the operator's to set (`LimitNOFILE=`
/// in a systemd unit, `ulimit -Hn`). Says so in the log when even that is below what `max_connections` needs.
fn raise_open_files_limit(max_connections: usize) {
    let needed = u64::try_from(max_connections).unwrap_or(u64::MAX).saturating_add(FILES_BESIDES_CONNECTIONS);
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) if limit < needed => tracing::warn!(
            open_files = limit,
            needed,
            max_connections,
            "the limit on open files is below what the connection limit needs: raise the hard limit (ulimit -Hn, \
             LimitNOFILE=) or lower --max-connections"
        ),
        Ok(limit) => tracing::debug!(open_files = limit, "limit on open files"),
        Err(err) => tracing::warn!(error = %err, "cannot read or raise the limit on open files"),
    }
}

/// What a `serve` process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// The HTTP API and the event stream (holding a gateway lease), with no background work.
    Api,
    /// The work queue's shards and the projections, with only a health check over HTTP.
    Worker,
    /// Both.
    #[default]
    All,
}

impl Role {
    fn serves_api(self) -> bool {
        matches!(self, Role::Api | Role::All)
    }

    fn works(self) -> bool {
        matches!(self, Role::Worker | Role::All)
    }
}

impl std::str::FromStr for Role {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "api" => Ok(Role::Api),
            "worker" => Ok(Role::Worker),
            "all" => Ok(Role::All),
            other => Err(format!("unknown role {other:?}: expected api, worker or all")),
        }
    }
}

/// How a `serve` process runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub role: Role,
    /// The shard leases of the work queue, and the projections' leases (seed: 15 s, renewed every 5 s).
    pub work_lease: LeaseConfig,
    /// The gateway lease of the event stream's poller (seed: 20 s, renewed every 5 s).
    pub gateway_lease: LeaseConfig,
    /// The PKI, when the listener is TLS: joins get node certificates, node routes require them, and the
    /// handshakes refuse revoked ones.
    pub pki: Option<Pki>,
    /// The web origins whose pages may call the API (CORS).
    pub cors_origins: Vec<String>,
    /// How images are taken: the signer allowlist and the largest size.
    pub images: bc_commands::images::ImagePolicy,
    /// The CA certificates (PEM) of the deployments the built-in `better-compute` provider driver may call.
    pub provider_trust: Option<String>,
    /// Out-of-process provider drivers: (provider, URL).
    pub provider_drivers: Vec<(String, String)>,
    /// How webhooks are delivered (their leases are `work_lease`).
    pub webhooks: crate::webhooks::WebhookConfig,
    /// How the event stream reads and fans out, and how many streams it serves.
    pub events: http::events::EventsConfig,
    /// How long a client may take to send a request's head, and how long an idle connection is kept.
    pub request_head_timeout: std::time::Duration,
    /// How many requests one bearer token may have in flight at once.
    pub requests_per_token: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            role: Role::All,
            work_lease: LeaseConfig::SHARD,
            gateway_lease: LeaseConfig::GATEWAY,
            pki: None,
            cors_origins: Vec::new(),
            images: bc_commands::images::ImagePolicy::default(),
            provider_trust: None,
            provider_drivers: Vec::new(),
            webhooks: crate::webhooks::WebhookConfig::default(),
            events: http::events::EventsConfig::default(),
            request_head_timeout: crate::tls::REQUEST_HEAD_TIMEOUT,
            requests_per_token: http::in_flight::MAX_REQUESTS_PER_TOKEN,
        }
    }
}

/// The provider drivers of a process with a PKI bundle: the built-in `better-compute` driver served on a loopback
/// port over the driver protocol's mutual TLS (called the same way as an out-of-process one), and the drivers
/// `options` names, with identities the bundle issues. None without a bundle.
pub async fn provider_drivers(
    options: &ServeOptions,
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<bc_commands::borrowing::ProviderDrivers> {
    let mut drivers = bc_commands::borrowing::ProviderDrivers::default();
    let Some(pki) = &options.pki else { return Ok(drivers) };
    let hosts = ["127.0.0.1".to_owned()];
    let identity = |name: &str| -> anyhow::Result<bcx::tls::Identity> {
        let (cert_pem, key_pem) = pki.bundle.issue_driver_identity(name, &hosts)?;
        Ok(bcx::tls::Identity { ca_pem: pki.bundle.ca_pem().to_owned(), cert_pem, key_pem })
    };
    let caller = identity("control-plane")?;
    if !options.provider_drivers.iter().any(|(name, _)| name == bcx::better_compute::NAME) {
        let builtin = bcx::better_compute::BetterCompute::new(options.provider_trust.as_deref())?;
        let driver = bcx::server::Driver::provider(bcx::better_compute::NAME, env!("CARGO_PKG_VERSION"), builtin);
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("https://127.0.0.1:{}", listener.local_addr()?.port());
        let served = identity(bcx::better_compute::NAME)?;
        let mut stop = stop;
        tokio::spawn(async move {
            let shutdown = async move {
                let _ = stop.changed().await;
            };
            if let Err(err) = bcx::server::serve(listener, &served, driver, shutdown).await {
                tracing::error!(error = %err, "the built-in better-compute driver stopped");
            }
        });
        drivers = drivers.with(bcx::better_compute::NAME, bcx::client::DriverClient::new(&url, &caller)?);
    }
    for (name, url) in &options.provider_drivers {
        drivers = drivers.with(name, bcx::client::DriverClient::new(url, &caller)?);
    }
    Ok(drivers)
}

/// How often a TLS listener reads the revoked node certificates.
const REVOCATION_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// Keeps `config` refusing the node certificates revoked in the database: reads them every second and, when
/// they changed, gives new handshakes a configuration with the new revocation list.
pub async fn keep_revocations(
    app: App,
    pki: Pki,
    config: crate::tls::SharedConfig,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut applied: Option<Vec<(String, i64)>> = None;
    loop {
        match app.revoked_certificates().await {
            Ok(revoked) if applied.as_ref() != Some(&revoked) => {
                let rebuilt = app
                    .revocation_list_of(&revoked)
                    .map_err(anyhow::Error::from)
                    .and_then(|crl| pki.server_config(crl.as_deref().filter(|_| !revoked.is_empty())));
                match rebuilt {
                    Ok(next) => {
                        match config.write() {
                            Ok(mut current) => *current = next,
                            Err(poisoned) => *poisoned.into_inner() = next,
                        }
                        if !revoked.is_empty() {
                            tracing::info!(
                                revoked = revoked.len(),
                                "TLS handshakes refuse the revoked node certificates"
                            );
                        }
                        applied = Some(revoked);
                    }
                    Err(err) => tracing::warn!(error = %err, "cannot apply the revocation list; keeping the last one"),
                }
            }
            Ok(_) => {}
            Err(err) => tracing::debug!(error = %err, "cannot read the revoked node certificates; retrying"),
        }
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep(REVOCATION_POLL) => {}
        }
    }
}

/// Serves the API on a bound listener, with the work-queue worker and the projection daemon beside it, until
/// `shutdown` completes; in-flight requests, the worker's current round and the daemon's batches finish first.
pub async fn serve_on(
    db: Db,
    auth: Arc<dyn Authorizer>,
    listener: impl Into<Bound>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    serve_with(db, auth, listener, ServeOptions::default(), shutdown).await
}

/// [`serve_on`] in a role. Workers spread the work queue's shards among themselves through `shard:<n>` leases
/// and run the projections under theirs; API processes hold a `gateway:<owner>` lease for their event-stream
/// poller. Every lease is given up at once on shutdown, so the other processes take over without waiting.
pub async fn serve_with(
    db: Db,
    auth: Arc<dyn Authorizer>,
    listener: impl Into<Bound>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let owner = lease::process_owner_id().to_owned();
    let (stop_background, stopped) = tokio::sync::watch::channel(false);
    let mut background = Vec::new();
    let mut shards = None;
    if options.role.works() {
        let keeper = ShardKeeper::start(
            db.clone(),
            owner.clone(),
            ShardConfig { lease: options.work_lease, ..ShardConfig::workers(SHARDS) },
        );
        let mut worker_app =
            App::new(db.clone()).with_provider_drivers(provider_drivers(&options, stopped.clone()).await?);
        if let Some(pki) = &options.pki {
            worker_app = worker_app.with_pki(Arc::clone(&pki.bundle));
        }
        let webhooks = crate::webhooks::WebhookConfig { lease: options.work_lease, ..options.webhooks.clone() };
        background.push(tokio::spawn(crate::webhooks::run(worker_app.clone(), webhooks, stopped.clone())));
        let worker = Worker::new(worker_app, WorkerConfig::default()).with_shard_leases(keeper.watch());
        background.push(tokio::spawn(worker.run(stopped.clone())));
        let daemon = DaemonConfig { lease: options.work_lease, ..DaemonConfig::default() };
        background.push(tokio::spawn(framework::run_daemon(
            db.clone(),
            models::read_models(),
            daemon,
            stopped.clone(),
        )));
        shards = Some(keeper);
    }
    let gateway = options
        .role
        .serves_api()
        .then(|| LeaseKeeper::start(db.clone(), format!("gateway:{owner}"), owner.clone(), options.gateway_lease));
    let mut app = App::new(db.clone()).with_authorizer(auth).with_image_policy(options.images.clone());
    if let Some(pki) = &options.pki {
        app = app.with_pki(Arc::clone(&pki.bundle));
    }
    if options.role.serves_api() {
        // The tenancy the log holds is loaded before the first request, then followed.
        app.refresh_tenancy().await.context("load the tenants, identities and grants")?;
        let follower = app.clone();
        let stop = stopped.clone();
        background.push(tokio::spawn(async move { follower.follow_tenancy(stop).await }));
    }
    let listener = listener.into();
    if let (Bound::Tls(tls), Some(pki)) = (&listener, &options.pki) {
        background.push(tokio::spawn(keep_revocations(app.clone(), pki.clone(), tls.config(), stopped.clone())));
    }
    let state = AppState::with_events(app, options.events.clone())
        .and_then(|state| state.with_cors(&options.cors_origins))
        .map(|state| {
            state.with_connection_limit(listener.limit().clone()).with_requests_per_token(options.requests_per_token)
        })
        .map_err(|err| bc_eventstore::Error::InvalidConfig(err.to_string()))
        .context("check the configuration")?;
    let hub = Arc::clone(&state.events);
    let router = if options.role.serves_api() { http::router(state) } else { http::worker_router(state) };
    // On the signal the listener stops accepting, in-flight requests finish, and event streams end with a
    // `retry:` hint instead of holding the shutdown open; then the worker and the projection daemon stop and
    // give up their leases at once.
    let shutdown = async move {
        shutdown.await;
        hub.close();
    };
    let head = options.request_head_timeout;
    let served = match listener {
        Bound::Plain(listener) => serve_http(listener, router, head, shutdown).await,
        Bound::Tls(listener) => serve_http(listener, router, head, shutdown).await,
    }
    .context("serve HTTP");
    let _ = stop_background.send(true);
    for task in background {
        task.await.context("stop the background work")?;
    }
    // The worker's last round is over: nothing runs under the shard leases any more.
    if let Some(keeper) = shards {
        keeper.stop().await;
    }
    if let Some(gateway) = gateway {
        gateway.stop().await;
    }
    // The hint changes of the last commits, still with the writer of follow-ups, are written before the process
    // goes (the hints' walk would repair them, but later).
    db.follow_ups_written().await;
    served
}

/// Resolves on Ctrl-C (SIGINT) or SIGTERM. The handlers are installed when this is called, not when the
/// future is first polled: call it before saying where the process serves, so a signal sent right after that
/// line shuts down gracefully instead of killing the process.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let interrupt = signal(SignalKind::interrupt());
    let terminate = signal(SignalKind::terminate());
    let wait = |installed: std::io::Result<tokio::signal::unix::Signal>, name: &'static str| async move {
        match installed {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::error!(error = %err, "cannot listen for {name}");
                std::future::pending::<()>().await;
            }
        }
    };
    async move {
        tokio::select! {
            () = wait(interrupt, "Ctrl-C") => tracing::info!("Ctrl-C: shutting down"),
            () = wait(terminate, "SIGTERM") => tracing::info!("SIGTERM: shutting down"),
        }
    }
}
