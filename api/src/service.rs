//! The service's lifecycle: connect, migrate (unless told not to), check the log's epoch, serve until a
//! shutdown signal.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use bc_eventstore::clock::ClockAnchor;
use bc_eventstore::migrate::Migrator;
use bc_eventstore::{Db, events};
use tokio::net::TcpListener;

use bc_projections::framework::{self, DaemonConfig};
use bc_projections::models;

use crate::app::App;
use crate::app::worker::{Worker, WorkerConfig};
use crate::auth::{Authorizer, BuiltinAuthorizer};
use crate::http::{self, AppState};

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

/// Binds `listen` (port 0 picks a free port) and says where the API is, on standard output, so that scripts
/// and tests can find it.
pub async fn bind(listen: SocketAddr) -> anyhow::Result<TcpListener> {
    let listener = TcpListener::bind(listen).await.with_context(|| format!("listen on {listen}"))?;
    let local = listener.local_addr().context("read the listening address")?;
    tracing::info!(address = %local, "serving the API");
    println!("better-compute: serving http://{local}");
    Ok(listener)
}

/// Serves the API on a bound listener, with the work-queue worker and the projection daemon beside it, until
/// `shutdown` completes; in-flight requests, the worker's current round and the daemon's batches finish first.
pub async fn serve_on(
    db: Db,
    auth: Arc<dyn Authorizer>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (stop_background, stopped) = tokio::sync::watch::channel(false);
    let worker = tokio::spawn(Worker::new(App::new(db.clone()), WorkerConfig::default()).run(stopped.clone()));
    let daemon =
        tokio::spawn(framework::run_daemon(db.clone(), models::read_models(), DaemonConfig::default(), stopped));
    let state = AppState::new(db, auth).context("check the method table")?;
    let hub = Arc::clone(&state.events);
    let router = http::router(state);
    // On the signal the listener stops accepting, in-flight requests finish, and event streams end with a
    // `retry:` hint instead of holding the shutdown open; then the worker and the projection daemon stop and
    // give up their leases at once.
    let shutdown = async move {
        shutdown.await;
        hub.close();
    };
    let served = axum::serve(listener, router).with_graceful_shutdown(shutdown).await.context("serve HTTP");
    let _ = stop_background.send(true);
    worker.await.context("stop the worker")?;
    daemon.await.context("stop the projection daemon")?;
    served
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %err, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::error!(error = %err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = ctrl_c => tracing::info!("Ctrl-C: shutting down"),
        () = terminate => tracing::info!("SIGTERM: shutting down"),
    }
}
