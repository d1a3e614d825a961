//! The projection framework. A projection has a name, a version, the event types it handles, its tables and a
//! pure `apply`. Asynchronous projections run in the daemon: one owner per projection version, through a
//! fenced lease (`singleton:projection:<name>:v<N>`); each batch and its checkpoint commit in one transaction,
//! so every event takes effect exactly once whatever crashes. A batch without any of the projection's event
//! types still moves the checkpoint, so a quiet projection is never behind.
//!
//! Versions: each has its own tables and checkpoint. A version newer than the active one builds from `0-0-0`
//! while the active one serves; once it has caught up, and has applied at least as much of the log as the active
//! one, one short transaction makes it the active version. The old version retires itself at its next batch.

use std::sync::Arc;
use std::time::Duration;

use bc_domain::event::EventMetadata;
use bc_domain::stream::AnyEvent;
use bc_eventstore::events::{self, RecordedEvent};
use bc_eventstore::lease::{self, Lease, LeaseConfig, LeaseKeeper};
use bc_eventstore::{Db, Error, Position, Result, Tx, TxOptions, sql};
use futures_util::future::BoxFuture;
use sqlx::Row as _;

/// An event as projections see it: as stored, decoded (when it is of a known family) and its metadata.
#[derive(Debug, Clone)]
pub struct Envelope {
    pub recorded: RecordedEvent,
    pub event: Option<AnyEvent>,
    pub metadata: EventMetadata,
}

impl Envelope {
    pub fn decode(recorded: RecordedEvent) -> Result<Self> {
        let event = AnyEvent::decode(&recorded.event_type, recorded.schema_version, &recorded.payload)?;
        let metadata = recorded.metadata()?;
        Ok(Self { recorded, event, metadata })
    }

    /// The event as `projection` reads it: its payload decoded only when the projection reads the payload of
    /// that type ([`Projection::reads_payload`]), `event` `None` otherwise.
    pub fn decode_for(projection: &dyn Projection, recorded: RecordedEvent) -> Result<Self> {
        if projection.reads_payload(&recorded.event_type) {
            return Self::decode(recorded);
        }
        let metadata = recorded.metadata()?;
        Ok(Self { recorded, event: None, metadata })
    }
}

/// A projection of the log into read-model tables.
pub trait Projection: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn version(&self) -> u32;
    /// The event types it handles; empty means every event.
    fn event_types(&self) -> &'static [&'static str];
    /// Its tables (named `<something>_v<version>`), for rebuilds.
    fn tables(&self) -> &'static [&'static str];
    /// Applies a batch of events, in log order, inside the caller's transaction. Pure: everything it writes
    /// comes from the events (never the clock).
    fn apply<'a>(&'a self, tx: &'a mut Tx, events: &'a [Envelope]) -> BoxFuture<'a, Result<()>>;

    fn handles(&self, event_type: &str) -> bool {
        let types = self.event_types();
        types.is_empty() || types.contains(&event_type)
    }

    /// The event types whose payload it reads, when fewer than it handles (`None`: every one it handles): the
    /// others reach `apply` with their metadata but without a decoded event, and their payloads are neither sent
    /// by the server nor decoded.
    fn payload_types(&self) -> Option<&'static [&'static str]> {
        None
    }

    /// Whether it reads the payload of the events of `event_type` it handles (see [`Projection::payload_types`]).
    fn reads_payload(&self, event_type: &str) -> bool {
        self.payload_types().is_none_or(|types| types.contains(&event_type))
    }

    fn lease_name(&self) -> String {
        format!("singleton:projection:{}:v{}", self.name(), self.version())
    }
}

/// A projection version's progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub position: Position,
    pub events_applied: i64,
    pub events_passed: i64,
    pub state: VersionState,
    pub last_event_at_ms: Option<i64>,
}

/// Where a projection version is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionState {
    /// Catching up from `0-0-0`; not read yet.
    Building,
    /// The version reads use.
    Live,
    /// Replaced by a newer version; no longer applied.
    Retired,
}

impl VersionState {
    pub fn as_str(self) -> &'static str {
        match self {
            VersionState::Building => "building",
            VersionState::Live => "live",
            VersionState::Retired => "retired",
        }
    }

    fn parse(text: &str) -> Result<Self> {
        match text {
            "building" => Ok(VersionState::Building),
            "live" => Ok(VersionState::Live),
            "retired" => Ok(VersionState::Retired),
            other => Err(Error::Internal(format!("unknown projection state {other:?}"))),
        }
    }
}

/// Creates the checkpoint row if needed and locks it for the rest of the transaction: the daemon's batches and a
/// forced rebuild's switch take it, so they never interleave.
pub async fn lock_checkpoint(tx: &mut Tx, name: &str, version: u32) -> Result<Checkpoint> {
    sql::query("INSERT INTO projection_checkpoints (name, version) VALUES ($1, $2) ON CONFLICT DO NOTHING")
        .bind(name)
        .bind(version as i32)
        .execute(tx.conn())
        .await?;
    let row = sql::query(
        "SELECT log_epoch, txid::text AS txid, seq, events_applied, events_passed, state,
                floor(extract(epoch FROM last_event_at) * 1000)::int8 AS last_event_at_ms
         FROM projection_checkpoints WHERE name = $1 AND version = $2 FOR UPDATE",
    )
    .bind(name)
    .bind(version as i32)
    .fetch_one(tx.conn())
    .await?;
    checkpoint_from_row(&row)
}

/// A checkpoint's position from its `log_epoch`, `txid` (as text) and `seq` columns.
fn position_from_row(row: &sqlx::postgres::PgRow) -> Result<Position> {
    let epoch: i32 = row.try_get("log_epoch")?;
    let txid: String = row.try_get("txid")?;
    let seq: i64 = row.try_get("seq")?;
    format!("{epoch}-{txid}-{seq}")
        .parse()
        .map_err(|err: bc_eventstore::PositionError| Error::Internal(err.to_string()))
}

fn checkpoint_from_row(row: &sqlx::postgres::PgRow) -> Result<Checkpoint> {
    Ok(Checkpoint {
        position: position_from_row(row)?,
        events_applied: row.try_get("events_applied")?,
        events_passed: row.try_get("events_passed")?,
        state: VersionState::parse(&row.try_get::<String, _>("state")?)?,
        last_event_at_ms: row.try_get("last_event_at_ms")?,
    })
}

async fn save_checkpoint(
    tx: &mut Tx,
    name: &str,
    version: u32,
    last: &RecordedEvent,
    applied: i64,
    passed: i64,
) -> Result<()> {
    sql::query(
        "UPDATE projection_checkpoints
            SET log_epoch = $3, txid = $4::text::xid8, seq = $5, events_applied = events_applied + $6,
                events_passed = events_passed + $7,
                last_event_at = timestamptz 'epoch' + $8::int8 * interval '1 millisecond',
                updated_at = compute_now()
          WHERE name = $1 AND version = $2",
    )
    .bind(name)
    .bind(version as i32)
    .bind(last.position.epoch as i32)
    .bind(last.position.txid.to_string())
    .bind(last.position.seq as i64)
    .bind(applied)
    .bind(passed)
    .bind(last.recorded_at_ms)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// The version reads of `name` use, if any is active yet.
pub async fn active_version(tx: &mut Tx, name: &str) -> Result<Option<u32>> {
    let version: Option<i32> = sql::query_scalar("SELECT version FROM projection_active WHERE name = $1")
        .bind(name)
        .fetch_optional(tx.conn())
        .await?;
    Ok(version.map(|v| v as u32))
}

/// The active version of the read model `name` and the position its checkpoint has passed; `None` while no
/// version of it is active.
pub async fn active_checkpoint(tx: &mut Tx, name: &str) -> Result<Option<(u32, Position)>> {
    let row = sql::query(
        "SELECT a.version, c.log_epoch, c.txid::text AS txid, c.seq
         FROM projection_active AS a
         JOIN projection_checkpoints AS c ON c.name = a.name AND c.version = a.version
         WHERE a.name = $1",
    )
    .bind(name)
    .fetch_optional(tx.conn())
    .await?;
    let Some(row) = row else { return Ok(None) };
    Ok(Some((row.try_get::<i32, _>("version")? as u32, position_from_row(&row)?)))
}

/// What one batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Step {
    /// Events read (of any type).
    pub passed: usize,
    /// Events of the projection's types applied.
    pub applied: usize,
    /// The batch came back short: the projection has reached the horizon.
    pub caught_up: bool,
    /// This version is retired; its daemon should stop.
    pub retired: bool,
    /// This step made the version the active one.
    pub switched: bool,
}

/// Applies one batch of up to `batch` events after the version's checkpoint, in a transaction fenced by `lease`,
/// together with the checkpoint update. Once caught up, makes the version active if it is newer than the
/// active one.
pub async fn step(db: &Db, projection: &dyn Projection, lease: &Lease, batch: u32) -> Result<Step> {
    step_inner(db, projection, lease, batch, None, None, &|| {}).await.map(|(step, _)| step)
}

/// Events read after a position, those of the projection's types decoded.
struct Batch {
    after: Position,
    /// Events read, of any type.
    passed: usize,
    /// The last event read.
    last: Option<RecordedEvent>,
    envelopes: Vec<Envelope>,
}

/// Reads up to `limit` events after `after` and decodes those `projection` handles.
async fn read_batch(tx: &mut Tx, projection: &dyn Projection, after: Position, limit: u32) -> Result<Batch> {
    // Only the types it handles need their metadata, and only those whose payload it reads their payload; the
    // rest of the batch is read for its positions alone.
    let types = projection.event_types();
    let selection = events::Selection {
        metadata_of: (!types.is_empty()).then_some(types),
        payload_of: projection.payload_types(),
        tenant: None,
    };
    let recorded = events::read_after_selected(tx, after, limit, selection).await?;
    let passed = recorded.len();
    let last = recorded.last().cloned();
    // Room for the whole batch at once: an envelope is 776 bytes, and growing the vector by doubling copied a
    // 10,000-event batch's 7.8 MB once more, step by step, each step into freshly zeroed pages.
    let mut envelopes = Vec::with_capacity(recorded.len());
    for event in recorded {
        if projection.handles(&event.event_type) {
            envelopes.push(Envelope::decode_for(projection, event)?);
        }
    }
    Ok(Batch { after, passed, last, envelopes })
}

/// The next batch, read and decoded on a connection of its own while the current one is applied.
struct ReadAhead {
    after: Position,
    limit: u32,
    task: tokio::task::JoinHandle<Result<Batch>>,
}

impl ReadAhead {
    fn start(db: &Db, projection: &Arc<dyn Projection>, after: Position, limit: u32) -> Self {
        let (db, projection) = (db.clone(), projection.clone());
        let task = tokio::spawn(async move {
            let mut tx = db.begin(TxOptions::READ_ONLY).await?;
            let batch = read_batch(&mut tx, projection.as_ref(), after, limit).await?;
            tx.commit().await?;
            Ok(batch)
        });
        Self { after, limit, task }
    }

    /// The batch, if it was read after `after` with `limit` and the read succeeded.
    async fn take(self, after: Position, limit: u32) -> Option<Batch> {
        if self.after != after || self.limit != limit {
            self.task.abort();
            return None;
        }
        match self.task.await {
            Ok(Ok(batch)) => Some(batch),
            Ok(Err(err)) => {
                tracing::debug!(error = %err, "reading the next batch ahead failed; reading it again");
                None
            }
            Err(_) => None,
        }
    }
}

/// [`step`], taking the batch from `ahead` when it was read after the checkpoint the step finds, and calling
/// `before_commit` after the batch is applied and before it commits (the crash-recovery tests' way in). With
/// `read_next` (its projection and the next batch's size), a full batch starts reading the one after it before
/// it is applied; that read is returned.
async fn step_inner(
    db: &Db,
    projection: &dyn Projection,
    lease: &Lease,
    batch: u32,
    ahead: Option<ReadAhead>,
    read_next: Option<(&Arc<dyn Projection>, u32)>,
    before_commit: &(dyn Fn() + Send + Sync),
) -> Result<(Step, Option<ReadAhead>)> {
    let mut tx = lease::begin_fenced(db, lease, TxOptions::READ_COMMITTED).await?;
    let name = projection.name();
    let version = projection.version();
    let checkpoint = lock_checkpoint(&mut tx, name, version).await?;
    if checkpoint.state == VersionState::Retired {
        tx.rollback().await;
        if let Some(ahead) = ahead {
            ahead.task.abort();
        }
        return Ok((Step { retired: true, ..Step::default() }, None));
    }
    if checkpoint.state == VersionState::Building {
        // Nothing reads a version still building, and its rows and checkpoint commit together, so a commit lost
        // in a crash only makes it apply that batch again: it need not wait for the WAL to reach the disk. The
        // switch's commit waits, and with it every earlier one.
        sql::query("SET LOCAL synchronous_commit = off").execute(tx.conn()).await?;
    }
    let read = match ahead {
        Some(ahead) => ahead.take(checkpoint.position, batch).await,
        None => None,
    };
    let read = match read {
        Some(read) => read,
        None => read_batch(&mut tx, projection, checkpoint.position, batch).await?,
    };
    debug_assert_eq!(read.after, checkpoint.position);
    let mut outcome = Step { passed: read.passed, caught_up: read.passed < batch as usize, ..Step::default() };
    let mut position = checkpoint.position;
    let mut next = None;
    if let Some(last) = read.last {
        position = last.position;
        if let (false, Some((shared, limit))) = (outcome.caught_up, read_next) {
            next = Some(ReadAhead::start(db, shared, position, limit));
        }
        projection.apply(&mut tx, &read.envelopes).await?;
        outcome.applied = read.envelopes.len();
        save_checkpoint(&mut tx, name, version, &last, read.envelopes.len() as i64, outcome.passed as i64).await?;
        if outcome.applied > 0 {
            before_commit();
        }
    }
    if outcome.caught_up {
        outcome.switched = switch_if_newer(&mut tx, name, version, &position).await?;
        if !outcome.switched && active_version(&mut tx, name).await?.is_some_and(|active| active > version) {
            retire(&mut tx, name, version).await?;
            outcome.retired = true;
        }
    }
    tx.commit().await?;
    Ok((outcome, next))
}

/// Runs one projection version's batches the way the daemon does: a batch that comes back full makes the next
/// one twice as large, up to [`DaemonConfig::max_batch`], and one that comes back short (caught up) returns to
/// [`DaemonConfig::batch`]; while a full batch is applied, the next is read and decoded on another connection,
/// so reading the log and writing the read model overlap. A batch read ahead is used only if the checkpoint is
/// still where that read began (another owner, or a forced rebuild, may have moved it); otherwise it is read
/// again, so nothing is applied twice or skipped.
pub struct Runner {
    db: Db,
    projection: Arc<dyn Projection>,
    batch: u32,
    min: u32,
    max: u32,
    ahead: Option<ReadAhead>,
}

impl Runner {
    pub fn new(db: Db, projection: Arc<dyn Projection>, config: &DaemonConfig) -> Self {
        let min = config.batch.max(1);
        Self { db, projection, batch: min, min, max: config.max_batch.max(min), ahead: None }
    }

    /// One batch; see [`step`].
    pub async fn step(&mut self, lease: &Lease) -> Result<Step> {
        self.step_with_hook(lease, &|| {}).await
    }

    async fn step_with_hook(&mut self, lease: &Lease, before_commit: &(dyn Fn() + Send + Sync)) -> Result<Step> {
        let batch = self.batch;
        let next = (batch.saturating_mul(2)).min(self.max);
        let ahead = self.ahead.take();
        let result = step_inner(
            &self.db,
            self.projection.as_ref(),
            lease,
            batch,
            ahead,
            Some((&self.projection, next)),
            before_commit,
        )
        .await;
        match result {
            Ok((step, ahead)) => {
                self.ahead = ahead;
                self.batch = if step.caught_up { self.min } else { next };
                Ok(step)
            }
            Err(err) => {
                self.batch = self.min;
                Err(err)
            }
        }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if let Some(ahead) = self.ahead.take() {
            ahead.task.abort();
        }
    }
}

async fn retire(tx: &mut Tx, name: &str, version: u32) -> Result<()> {
    sql::query("UPDATE projection_checkpoints SET state = 'retired' WHERE name = $1 AND version = $2")
        .bind(name)
        .bind(version as i32)
        .execute(tx.conn())
        .await?;
    Ok(())
}

/// Makes `version` the active one if it is newer than the active one (or none is) and has applied at least as
/// much of the log as the active one (at `position`), and marks it live; reads never go backwards across a
/// switch. The active version's checkpoint is share-locked for the comparison, so its daemon cannot move it on
/// before this transaction commits; the old version retires itself at its own next caught-up batch and never
/// locks the new version's checkpoint, so the two never wait on each other in a cycle. Returns whether it
/// switched.
async fn switch_if_newer(tx: &mut Tx, name: &str, version: u32, position: &Position) -> Result<bool> {
    let active = sql::query(
        "SELECT c.log_epoch, c.txid::text AS txid, c.seq
         FROM projection_active AS a
         JOIN projection_checkpoints AS c ON c.name = a.name AND c.version = a.version
         WHERE a.name = $1 AND a.version < $2
         FOR SHARE OF c",
    )
    .bind(name)
    .bind(version as i32)
    .fetch_optional(tx.conn())
    .await?;
    if let Some(row) = active
        && position_from_row(&row)? > *position
    {
        return Ok(false);
    }
    let switched = sql::query(
        "INSERT INTO projection_active (name, version) VALUES ($1, $2)
         ON CONFLICT (name) DO UPDATE SET version = excluded.version, switched_at = compute_now()
             WHERE projection_active.version < excluded.version",
    )
    .bind(name)
    .bind(version as i32)
    .execute(tx.conn())
    .await?
    .rows_affected()
        == 1;
    if switched {
        sql::query("UPDATE projection_checkpoints SET state = 'live' WHERE name = $1 AND version = $2")
            .bind(name)
            .bind(version as i32)
            .execute(tx.conn())
            .await?;
        tracing::info!(projection = name, version, "switched reads to the new projection version");
    }
    Ok(switched)
}

/// The largest batch a projection reads while catching up (by default; a rebuild's batches too): ten thousand
/// events are a few megabytes, and past that the rebuilds measured no faster.
pub const MAX_BATCH: u32 = 10_000;

/// How the daemon runs.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Events per batch when caught up; the first batch's size.
    pub batch: u32,
    /// The largest batch, reached by doubling while a projection is behind (a rebuild catching up).
    pub max_batch: u32,
    /// The pause after a batch that came back short.
    pub poll: Duration,
    pub lease: LeaseConfig,
    /// The lease owner (the process's, by default).
    pub owner: String,
    /// A crash-recovery test hook: abort the process in the middle of the n-th batch that applied events (after
    /// applying, before committing). Never set in production.
    pub abort_mid_batch: Option<u64>,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        Self {
            batch: 500,
            max_batch: MAX_BATCH,
            poll: Duration::from_millis(100),
            lease: LeaseConfig::SHARD,
            owner: lease::process_owner_id().to_owned(),
            abort_mid_batch: None,
        }
    }
}

/// Runs every projection version until `shutdown` flips to true: each under its own lease, so several processes
/// may run daemons and each version has one owner at a time. Not cancel-safe inside a batch; it finishes it.
pub async fn run_daemon(
    db: Db,
    projections: Vec<Arc<dyn Projection>>,
    config: DaemonConfig,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut tasks = tokio::task::JoinSet::new();
    for projection in projections {
        tasks.spawn(run_one(db.clone(), projection, config.clone(), shutdown.clone()));
    }
    while tasks.join_next().await.is_some() {}
}

async fn run_one(
    db: Db,
    projection: Arc<dyn Projection>,
    config: DaemonConfig,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut keeper = LeaseKeeper::start(db.clone(), projection.lease_name(), config.owner.clone(), config.lease);
    let mut runner = Runner::new(db, projection.clone(), &config);
    let batches = std::sync::atomic::AtomicU64::new(0);
    let before_commit = || {
        let n = batches.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if config.abort_mid_batch == Some(n) {
            tracing::error!(
                projection = projection.name(),
                batch = n,
                "crash test hook: aborting in the middle of a batch"
            );
            std::process::abort();
        }
    };
    loop {
        if *shutdown.borrow() {
            break;
        }
        let Some(lease) = keeper.current() else {
            tokio::select! {
                _ = shutdown.changed() => {}
                _ = keeper.held() => {}
            }
            continue;
        };
        match runner.step_with_hook(&lease, &before_commit).await {
            Ok(done) if done.retired => {
                tracing::info!(
                    projection = projection.name(),
                    version = projection.version(),
                    "version retired; stopping"
                );
                break;
            }
            Ok(done) if !done.caught_up => continue,
            Ok(_) => {}
            Err(Error::LeaseLost { .. }) => {
                tracing::warn!(projection = projection.name(), "lost the projection lease; waiting to take it again");
                keeper.lost().await;
                continue;
            }
            Err(err) => {
                tracing::warn!(projection = projection.name(), error = %err, "projection batch failed; retrying")
            }
        }
        tokio::select! {
            _ = shutdown.changed() => {}
            () = tokio::time::sleep(config.poll) => {}
        }
    }
    keeper.stop().await;
}
