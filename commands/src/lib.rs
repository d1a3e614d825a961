//! The application layer: command handlers callable without HTTP. Each command runs in one repeatable-read
//! transaction: read `compute_now()` once, load what it decides on, decide (pure, in `domain`), append the
//! events with the expected stream version, apply the inline projections, enqueue follow-up work, commit; the
//! whole transaction is retried on serialization failures, deadlocks, booking races and version conflicts.

pub mod agents;
pub mod audit;
pub mod auth;
pub mod availability;
mod beats;
pub mod borrowing;
pub use beats::{BatchFigures as HeartbeatBatchFigures, batch_figures as heartbeat_batch_figures};
pub mod door;
pub mod explain;
pub mod figures;
pub mod flavors;
pub mod fleet;
mod gate;
pub mod idempotency;
pub mod images;
pub mod instances;
pub mod ledger;
pub mod lifecycle;
pub mod liveness;
pub mod log;
pub mod node_commands;
pub mod nodes;
pub mod profiles;
pub mod providers;
pub mod quotes;
pub mod ramdisk;
pub mod reads;
pub mod reservations;
mod sealed;
pub mod site;
mod store;
pub mod tenancy;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tickets;
pub mod webhooks;
mod whole_nodes;
pub mod work;
pub mod worker;
pub mod workflows;

use std::sync::Arc;

use auth::{Authorizer, DenialCounts};
use bc_domain::Rejection;
use bc_domain::event::{AdmissionContext, DomainEvent, EventMetadata};
use bc_domain::id::{Identity, NodeId, TenantId};
use bc_domain::node::NodeEvent;
use bc_domain::stream::AnyEvent;
use bc_eventstore::events::{self, AppendBatch, ExpectedVersion, NewEvent};
use bc_eventstore::{Db, Position, RetryPolicy, Retryable, Tx};

pub use work::SHARDS;

/// Who is calling, as the authorizer admitted them. Asynchronous work acts on the recorded copy of this
/// (in each event's metadata), never on a stored token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub tenant_id: TenantId,
    pub identity: Identity,
    /// `user`, `service`, `agent`, `system` ...
    pub session_kind: String,
    /// The agent acting for the identity, if any.
    pub agent: Option<String>,
    /// The delegation the session runs under, if any.
    pub delegation: Option<String>,
    pub request_id: Option<String>,
    /// The tenant's ancestors in the tenant tree, parent first (for offers with `includeDescendants`).
    pub ancestors: Vec<TenantId>,
    /// The event this work answers (background work: the event that made it due), by position.
    pub causation_id: Option<String>,
    /// The operation this work belongs to: the request that began it, carried by everything it causes.
    pub correlation_id: Option<String>,
}

impl Caller {
    /// The platform's own workers, acting on recorded decisions.
    pub fn system() -> Caller {
        Caller {
            tenant_id: "root".parse().expect("a valid tenant id"),
            identity: "system:worker".parse().expect("a valid identity"),
            session_kind: "system".to_owned(),
            agent: None,
            delegation: None,
            request_id: None,
            ancestors: Vec::new(),
            causation_id: None,
            correlation_id: None,
        }
    }

    /// The same caller, answering `cause`: its position becomes the causation, and its correlation (or the
    /// request that made it) carries on, so the work links back to whoever began it.
    pub fn caused_by(mut self, cause: &events::RecordedEvent) -> Caller {
        self.causation_id = Some(cause.position.to_string());
        if let Ok(metadata) = cause.metadata() {
            self.correlation_id = metadata.correlation_id.or(metadata.request_id);
        }
        self
    }

    /// A caller with no agent, delegation, request id or ancestors (tools, tests, benchmarks).
    pub fn new(tenant_id: TenantId, identity: Identity, session_kind: &str) -> Caller {
        Caller { tenant_id, identity, session_kind: session_kind.to_owned(), ..Caller::system() }
    }

    fn metadata(&self) -> EventMetadata {
        EventMetadata {
            admission: Some(AdmissionContext {
                identity: self.identity.to_string(),
                session_kind: self.session_kind.clone(),
                agent: self.agent.clone(),
                delegation: self.delegation.clone(),
                request_id: self.request_id.clone(),
                tenant_id: self.tenant_id.to_string(),
            }),
            request_id: self.request_id.clone(),
            causation_id: self.causation_id.clone(),
            correlation_id: self.correlation_id.clone().or_else(|| self.request_id.clone()),
        }
    }
}

/// What a command can fail with.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// A business answer: the caller can act on it.
    #[error(transparent)]
    Rejected(#[from] Rejection),
    /// The store failed (or a retry budget ran out).
    #[error(transparent)]
    Store(#[from] bc_eventstore::Error),
    /// A read's consistency token was not reached within the bounded wait.
    #[error("the read models reached {reached}, not yet {wanted}; retry")]
    NotYetConsistent { wanted: Position, reached: Position },
    /// A reservation request the authorizer refused, recorded (`FORBIDDEN`).
    #[error("{}", .0.reason)]
    Denied(door::Denied),
    /// A reserve refused (nothing recorded), with the explanation of why.
    #[error("{}", .0.rejection)]
    Explained(Box<explain::Explained>),
}

impl AppError {
    /// A unique violation is someone else creating the same thing at the same moment: the conflict the decision
    /// would have named (`message`), had it seen the other's row.
    pub(crate) fn on_unique_violation(self, message: impl FnOnce() -> String) -> AppError {
        match &self {
            AppError::Store(store) if store.sql_state().as_deref() == Some(bc_eventstore::error::UNIQUE_VIOLATION) => {
                AppError::Rejected(Rejection::Conflict(message()))
            }
            _ => self,
        }
    }
}

impl AppError {
    /// The API error code.
    pub fn code(&self) -> &'static str {
        match self {
            AppError::Rejected(rejection) => rejection.code(),
            AppError::Store(err) => err.code(),
            AppError::NotYetConsistent { .. } => "NOT_YET_CONSISTENT",
            AppError::Denied(_) => "FORBIDDEN",
            AppError::Explained(explained) => explained.rejection.code(),
        }
    }
}

impl From<bc_domain::event::EncodeError> for AppError {
    fn from(err: bc_domain::event::EncodeError) -> Self {
        AppError::Store(err.into())
    }
}

impl From<bc_domain::event::DecodeError> for AppError {
    fn from(err: bc_domain::event::DecodeError) -> Self {
        AppError::Store(err.into())
    }
}

impl From<sqlx::Error> for AppError {
    fn from(err: sqlx::Error) -> Self {
        AppError::Store(err.into())
    }
}

impl Retryable for AppError {
    fn retry_reason(&self) -> Option<bc_eventstore::RetryReason> {
        match self {
            AppError::Store(err) => err.retry_reason(),
            _ => None,
        }
    }
}

pub type AppResult<T> = Result<T, AppError>;

/// The result of a command: its value and the position of its last event, the consistency token reads can
/// wait for (a command that appended nothing returns the stream's head).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed<T> {
    pub value: T,
    pub position: Option<Position>,
}

/// The application: the database, who may call it, and its settings.
#[derive(Debug, Clone)]
pub struct App {
    db: Db,
    pub retry: RetryPolicy,
    /// How agents keep their sessions.
    pub liveness: agents::LivenessConfig,
    /// Who a token is and what they may do: the door ([`door`]) asks it before anything from outside runs.
    auth: Arc<dyn Authorizer>,
    /// Denials by method, since start.
    denials: Arc<DenialCounts>,
    /// How many more denials each identity may have recorded this minute.
    denial_budget: Arc<auth::IdentityBudget>,
    /// Refusals explained node by node, per identity ([`auth::DIAGNOSED_REFUSALS_PER_MINUTE`]).
    diagnosis_budget: Arc<auth::IdentityBudget>,
    /// The PKI bundle whose CA signs node certificates, when the control plane has one.
    pki: Option<Arc<bc_pki::Bundle>>,
    /// How long a node certificate lasts (30 days); nodes ask for the next one when a third is left.
    pub node_certificate_lifetime: std::time::Duration,
    /// This process's own key, for what must be signed when there is no PKI bundle (stream tickets).
    process_sealer: bc_pki::seal::Sealer,
    /// Held from reading the tenancy tables to handing them to the authorizer ([`App::refresh_tenancy`]), so that
    /// a read made earlier never replaces one made later.
    tenancy_refresh: Arc<tokio::sync::Mutex<()>>,
    /// The writers that renew heartbeats' sessions together, started by the first heartbeat.
    beats: Arc<std::sync::OnceLock<beats::Batcher>>,
    /// How images are taken: the signer allowlist and the largest size.
    images: Arc<images::ImagePolicy>,
    /// The provider drivers provider pools borrow their capacity through.
    providers: Arc<borrowing::ProviderDrivers>,
    /// Whether reserves record the explanation of their decisions (on by default; the benchmark turns it off to
    /// measure its cost).
    pub explain: bool,
    /// Whether reserves lost races for their chosen atoms lately (where a first try locks them).
    lock_races: Arc<reservations::LockRaces>,
}

impl App {
    /// The application over `db`, deciding with an authorizer that knows no token (for tools and tests that
    /// call the commands directly; see [`App::with_authorizer`]).
    pub fn new(db: Db) -> Self {
        Self {
            db,
            retry: RetryPolicy { max_attempts: 16, ..RetryPolicy::default() },
            liveness: agents::LivenessConfig::default(),
            auth: Arc::new(auth::BuiltinAuthorizer::nobody()),
            denials: Arc::new(DenialCounts::default()),
            denial_budget: Arc::new(auth::IdentityBudget::per_minute(auth::RECORDED_DENIALS_PER_MINUTE)),
            diagnosis_budget: Arc::new(auth::IdentityBudget::per_minute(auth::DIAGNOSED_REFUSALS_PER_MINUTE)),
            pki: None,
            node_certificate_lifetime: std::time::Duration::from_secs(30 * 24 * 3600),
            process_sealer: bc_pki::seal::Sealer::new(&bc_pki::seal::Sealer::generate_key().unwrap_or_else(|err| {
                // Without randomness only tickets of a process without a bundle are weak; say so.
                tracing::error!(error = %err, "no randomness for this process's key");
                [0; 32]
            })),
            tenancy_refresh: Arc::new(tokio::sync::Mutex::new(())),
            beats: Arc::new(std::sync::OnceLock::new()),
            images: Arc::new(images::ImagePolicy::default()),
            providers: Arc::new(borrowing::ProviderDrivers::default()),
            explain: true,
            lock_races: Arc::new(reservations::LockRaces::default()),
        }
    }

    /// The same application, signing node certificates with `bundle`'s CA.
    pub fn with_pki(mut self, bundle: Arc<bc_pki::Bundle>) -> Self {
        self.pki = Some(bundle);
        self
    }

    /// The PKI bundle, when there is one.
    pub fn pki(&self) -> Option<&Arc<bc_pki::Bundle>> {
        self.pki.as_ref()
    }

    /// The same application, deciding calls from outside with `auth`.
    pub fn with_authorizer(mut self, auth: Arc<dyn Authorizer>) -> Self {
        self.auth = auth;
        self
    }

    /// The database, for tools and tests that look underneath (the HTTP layer never does).
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The authorizer the door asks.
    pub fn authorizer(&self) -> &dyn Authorizer {
        self.auth.as_ref()
    }

    /// Denials by (method, kind) since start.
    pub fn denials(&self) -> std::collections::BTreeMap<(&'static str, &'static str), u64> {
        self.denials.snapshot()
    }
}

/// Appends `events` to `stream_id` (owned by `tenant`) and applies the inline projections, in the caller's
/// transaction. Returns the position of the last event.
pub(crate) async fn record<E>(
    tx: &mut Tx,
    caller: &Caller,
    stream_id: &str,
    tenant: &TenantId,
    expected: ExpectedVersion,
    events: Vec<E>,
) -> AppResult<Option<Position>>
where
    E: DomainEvent + Into<AnyEvent>,
{
    if events.is_empty() {
        return Ok(None);
    }
    let prepared = Prepared::of(caller, stream_id, events)?;
    let batch = AppendBatch { stream_id, tenant_id: Some(tenant.as_str()), expected, events: &prepared.new_events };
    match &prepared.inline {
        // Events whose inline writes are server-side calls go in the append's own message: one round trip for the
        // whole record.
        Some(inline) => {
            let sent: Vec<bc_eventstore::sql::Call> = inline.iter().map(|c| c.call.clone()).collect();
            let (appended, answers) = events::append_with(tx, batch, &sent).await?;
            bc_projections::inline::follow_answers(tx, inline, &answers)?;
            Ok(Some(appended.position))
        }
        // The others are applied statement by statement after it.
        None => prepared.append_then_apply(tx, batch).await,
    }
}

/// [`record`], then the commit, ending `tx`. When every event's inline writes are server-side calls, the append,
/// those calls, the calls deferred with [`Tx::defer`] and COMMIT go in one message
/// ([`events::append_and_commit`]): the command's last round trip carries its writes. For a command whose answer
/// needs nothing the transaction would read after its events. `first`, when given, runs before the events, in the
/// same message: a lock the events rely on, which raises when it cannot be taken. Answers the position of the
/// last event (`None` when there were none).
pub(crate) async fn record_and_commit<E>(
    mut tx: Tx,
    caller: &Caller,
    stream: (&str, &TenantId, ExpectedVersion),
    first: Option<&bc_eventstore::sql::Call>,
    events: Vec<E>,
) -> AppResult<Option<Position>>
where
    E: DomainEvent + Into<AnyEvent>,
{
    let (stream_id, tenant, expected) = stream;
    if events.is_empty() {
        let checked = match first {
            Some(first) => tx.call(first).await.map(drop).map_err(AppError::from),
            None => Ok(()),
        };
        return tx.end(checked.map(|()| None)).await;
    }
    let prepared = match Prepared::of(caller, stream_id, events) {
        Ok(prepared) => prepared,
        Err(err) => return tx.end(Err(err)).await,
    };
    let batch = AppendBatch { stream_id, tenant_id: Some(tenant.as_str()), expected, events: &prepared.new_events };
    match &prepared.inline {
        Some(inline) => {
            let sent: Vec<bc_eventstore::sql::Call> = inline.iter().map(|c| c.call.clone()).collect();
            let follow_ups: Vec<Option<&'static str>> = inline.iter().map(|c| c.follow_up()).collect();
            let (appended, _) = events::append_and_commit(tx, batch, first, &sent, &follow_ups).await?;
            Ok(Some(appended.position))
        }
        None => {
            let recorded = async {
                if let Some(first) = first {
                    tx.call(first).await?;
                }
                prepared.append_then_apply(&mut tx, batch).await
            }
            .await;
            tx.end(recorded).await
        }
    }
}

/// Events ready to append: encoded for the log with the caller's metadata, and their inline writes as
/// server-side calls when every one of them has such calls.
struct Prepared {
    new_events: Vec<NewEvent>,
    events: Vec<AnyEvent>,
    inline: Option<Vec<bc_projections::inline::InlineCall>>,
}

impl Prepared {
    fn of<E>(caller: &Caller, stream_id: &str, events: Vec<E>) -> AppResult<Prepared>
    where
        E: DomainEvent + Into<AnyEvent>,
    {
        let metadata = caller.metadata().encode()?;
        let new_events = events
            .iter()
            .map(|event| {
                Ok(NewEvent {
                    event_type: event.event_type().to_owned(),
                    schema_version: event.schema_version(),
                    payload: event.encode_payload()?,
                    metadata: metadata.clone(),
                })
            })
            .collect::<AppResult<Vec<_>>>()?;
        let events: Vec<AnyEvent> = events.into_iter().map(Into::into).collect();
        let mut inline = Some(Vec::new());
        for event in &events {
            match (bc_projections::inline::calls(stream_id, event)?, &mut inline) {
                (Some(calls), Some(inline)) => inline.extend(calls),
                (None, inline) => *inline = None,
                (Some(_), None) => {}
            }
        }
        Ok(Prepared { new_events, events, inline })
    }

    /// Appends, then applies each event's inline writes statement by statement.
    async fn append_then_apply(&self, tx: &mut Tx, batch: AppendBatch<'_>) -> AppResult<Option<Position>> {
        let appended = events::append(tx, batch).await?;
        for event in &self.events {
            bc_projections::inline::apply(tx, batch.stream_id, event).await?;
        }
        Ok(Some(appended.position))
    }
}

/// Records events on a node's stream, expecting its current version, in the caller's transaction.
pub(crate) async fn record_node(
    tx: &mut Tx,
    caller: &Caller,
    node_id: &NodeId,
    tenant: &TenantId,
    events: Vec<NodeEvent>,
) -> AppResult<Option<Position>> {
    if events.is_empty() {
        return Ok(None);
    }
    let version = events::stream_version(tx, node_id.as_str()).await?;
    record(tx, caller, node_id.as_str(), tenant, ExpectedVersion::Exact(version), events).await
}
