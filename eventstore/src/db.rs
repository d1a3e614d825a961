//! Connections and the transaction executor.
//!
//! Everything here is safe behind PgBouncer in transaction mode: no session state (the statement timeout is
//! `SET LOCAL` in each transaction), no startup parameters PgBouncer rejects, only unnamed prepared
//! statements, and every statement inside an explicit transaction, so the Parse and the Bind of one
//! statement always reach the same server connection.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use scoped_futures::ScopedBoxFuture;
use sqlx::postgres::{PgConnectOptions, PgRow};
use sqlx::{AssertSqlSafe, PgConnection};
use tokio::sync::watch;

use crate::Position;
use crate::conns::{Conn, Pool, PoolStats};
use crate::error::{Error, Result, RetryReason, sql_state};
use crate::follow_up::{Batch, FollowUpFigures, FollowUps};

/// SQLSTATE `25P02`: a statement ran in a transaction that an earlier error had already aborted.
const IN_FAILED_SQL_TRANSACTION: &str = "25P02";

/// How a process connects: pool size and the per-transaction statement timeout.
#[derive(Debug, Clone)]
pub struct DbConfig {
    /// Connections this process may hold at once. The total over all processes is about this times the
    /// number of processes, which is why a large deployment puts PgBouncer in front.
    pub max_connections: u32,
    /// Applied with `SET LOCAL statement_timeout` at the start of every transaction.
    pub statement_timeout: Duration,
    /// How long a caller waits for a free connection before getting an error.
    pub acquire_timeout: Duration,
    /// Sent as `application_name` (a startup parameter PgBouncer accepts), so `pg_stat_activity` and
    /// `doctor` can name the process.
    pub application_name: Option<String>,
    /// While commits come faster than the writes of their follow-ups (a write carried several), the least time
    /// between the starts of two writes, so that each carries that time's commits (see [`Tx::follow_up`]).
    pub follow_up_pause: Duration,
}

impl Default for DbConfig {
    fn default() -> Self {
        Self {
            max_connections: 20,
            statement_timeout: Duration::from_secs(15),
            acquire_timeout: Duration::from_secs(5),
            application_name: Some("better-compute".to_owned()),
            follow_up_pause: Duration::from_millis(10),
        }
    }
}

/// Isolation level of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    ReadCommitted,
    RepeatableRead,
    Serializable,
}

/// How to open a transaction. Use the constants; commands run at repeatable read so that everything a
/// command read sorts before what it writes in the event log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxOptions {
    pub isolation: Isolation,
    pub access: Access,
}

/// Whether a transaction may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    ReadWrite,
    ReadOnly,
}

impl TxOptions {
    /// Read committed, read-write: the PostgreSQL default, for guarded single-row updates.
    pub const READ_COMMITTED: TxOptions = TxOptions { isolation: Isolation::ReadCommitted, access: Access::ReadWrite };
    /// Repeatable read, read-write: every command.
    pub const COMMAND: TxOptions = TxOptions { isolation: Isolation::RepeatableRead, access: Access::ReadWrite };
    /// Serializable, read-write: a command whose check reads rows another command's check must see written (a
    /// profile naming an image, and the image's deletion that no profile may name): PostgreSQL's serializable
    /// snapshot isolation fails one of two such commands that ran at once, and it is retried.
    pub const COMMAND_SERIALIZABLE: TxOptions =
        TxOptions { isolation: Isolation::Serializable, access: Access::ReadWrite };
    /// Read committed, read-only: log readers and queries.
    pub const READ_ONLY: TxOptions = TxOptions { isolation: Isolation::ReadCommitted, access: Access::ReadOnly };

    fn begin_sql(self, statement_timeout_ms: u128) -> String {
        let isolation = match self.isolation {
            Isolation::ReadCommitted => "READ COMMITTED",
            Isolation::RepeatableRead => "REPEATABLE READ",
            Isolation::Serializable => "SERIALIZABLE",
        };
        let access = match self.access {
            Access::ReadWrite => "READ WRITE",
            Access::ReadOnly => "READ ONLY",
        };
        format!("BEGIN ISOLATION LEVEL {isolation} {access}; SET LOCAL statement_timeout = {statement_timeout_ms}")
    }
}

impl Default for TxOptions {
    fn default() -> Self {
        Self::READ_COMMITTED
    }
}

/// Connect options made safe for PgBouncer's transaction mode: no statement cache (sqlx's cached statements
/// are named and outlive the transaction) and no `extra_float_digits` startup parameter (PgBouncer refuses
/// parameters it does not know).
pub fn pgbouncer_safe(options: PgConnectOptions) -> PgConnectOptions {
    options.statement_cache_capacity(0).extra_float_digits(None)
}

/// A pool of connections to one database, and the transaction executor over it.
#[derive(Debug, Clone)]
pub struct Db {
    pool: Pool,
    statement_timeout_ms: u128,
    /// The highest position this process's committed transactions appended, so a reader of the log in the same
    /// process (the event stream's hub) wakes at once instead of at its next poll.
    appends: Arc<watch::Sender<Position>>,
    /// The writer of the follow-ups committed transactions hand over ([`Tx::follow_up`]).
    follow_ups: Arc<FollowUps>,
}

impl Db {
    /// A pool that connects on first use, so a process can start while the database is down and serve
    /// `503` until it is back. A connection is not pinged when it is checked out (that would be a round trip
    /// before every transaction): one that broke while idle fails at BEGIN, before anything of the transaction
    /// was sent, and [`Db::begin`] closes it and begins again on another.
    pub fn connect_lazy(url: &str, config: &DbConfig) -> Result<Db> {
        let options: PgConnectOptions =
            url.parse().map_err(|err| Error::InvalidConfig(format!("the database URL is not valid: {err}")))?;
        Ok(Self::connect_lazy_with(options, config))
    }

    pub fn connect_lazy_with(options: PgConnectOptions, config: &DbConfig) -> Db {
        let mut options = pgbouncer_safe(options);
        if let Some(name) = &config.application_name {
            options = options.application_name(name);
        }
        let pool = Pool::new(options, config.max_connections, config.acquire_timeout, Duration::from_secs(300));
        Db {
            follow_ups: Arc::new(FollowUps::new(
                pool.clone(),
                config.statement_timeout.as_millis(),
                config.follow_up_pause,
            )),
            pool,
            statement_timeout_ms: config.statement_timeout.as_millis(),
            appends: Arc::new(watch::channel(Position::START).0),
        }
    }

    /// The highest position that a committed transaction of this process (through this pool or a clone of it)
    /// appended; it changes as they commit. Other processes' commits are not seen here: a reader still polls for
    /// those.
    pub fn appends(&self) -> watch::Receiver<Position> {
        self.appends.subscribe()
    }

    /// Like [`Db::connect_lazy`], then checks that the database answers.
    pub async fn connect(url: &str, config: &DbConfig) -> Result<Db> {
        let db = Self::connect_lazy(url, config)?;
        db.ping().await?;
        Ok(db)
    }

    /// Runs `SELECT 1` in a read-only transaction.
    pub async fn ping(&self) -> Result<()> {
        let mut tx = self.begin(TxOptions::READ_ONLY).await?;
        crate::sql::query("SELECT 1").execute(tx.conn()).await?;
        tx.commit().await
    }

    /// How many connections this pool holds, idle or in use, and may hold.
    pub fn connections(&self) -> PoolStats {
        self.pool.stats()
    }

    /// Waits until the follow-ups of every transaction this process committed before the call are written
    /// ([`Tx::follow_up`]), so what it reads next reflects them; for at most two seconds, after which it goes on. Call
    /// it holding no transaction of this pool: the writer needs a connection.
    pub async fn follow_ups_written(&self) {
        self.follow_ups.settled().await;
    }

    /// What the writer of follow-ups has done since this pool was made (for `/metrics`).
    pub fn follow_up_figures(&self) -> FollowUpFigures {
        self.follow_ups.figures()
    }

    /// Writes the follow-ups still queued, then closes every connection; later calls fail.
    pub async fn close(&self) {
        self.follow_ups.settled().await;
        self.pool.close().await;
    }

    /// Opens a transaction. Drop it without [`Tx::commit`] and it is rolled back (its connection is
    /// closed rather than returned to the pool mid-transaction).
    pub async fn begin(&self, options: TxOptions) -> Result<Tx> {
        Ok(self.begin_then(options, None).await?.0)
    }

    /// Opens a transaction and runs `first` in the same round trip (the simple query protocol carries BEGIN, the
    /// statement timeout and the call as one message). Returns the transaction and the call's result. When the
    /// call fails, the transaction is rolled back and its error returned; a broken idle connection is replaced as
    /// in [`Db::begin`].
    pub async fn begin_with(&self, options: TxOptions, first: &crate::sql::Call) -> Result<(Tx, Option<String>)> {
        let (tx, rows) = self.begin_then(options, Some(first.statement())).await?;
        Ok((tx, first_text(&rows)?))
    }

    /// [`Db::begin_with`] with `before` committed first, in a short read-committed transaction of its own, in the
    /// same round trip: BEGIN, `before`, COMMIT, then BEGIN with `options` and `first`. What `before` wrote is thus
    /// committed before the transaction's snapshot is taken (a quota claim every later command must see). Returns
    /// the transaction and `first`'s result. When either call fails, nothing stays open and the error is returned.
    pub async fn begin_after(
        &self,
        options: TxOptions,
        before: &crate::sql::Call,
        first: &crate::sql::Call,
    ) -> Result<(Tx, Option<String>)> {
        let prefix = format!(
            "{}; {}; COMMIT",
            TxOptions::READ_COMMITTED.begin_sql(self.statement_timeout_ms),
            before.statement()
        );
        let (tx, rows) = self.begin_then_after(Some(prefix), options, Some(first.statement())).await?;
        // `before` answered the first row, `first` the last.
        Ok((tx, first_text(&rows[rows.len().saturating_sub(1)..])?))
    }

    /// Runs `call` as a transaction of its own in one round trip: BEGIN, the call and COMMIT in one message. For a
    /// command that is one server-side call (a heartbeat). A broken idle connection is replaced as in
    /// [`Db::begin`]; a failing call rolls back.
    pub async fn call(&self, options: TxOptions, call: &crate::sql::Call) -> Result<Option<String>> {
        let text = format!("{}; COMMIT", call.statement());
        let (mut tx, rows) = self.begin_then(options, Some(text)).await?;
        // COMMIT ran in the message: nothing is open any more, and the connection goes back as it is.
        tx.open = false;
        first_text(&rows)
    }

    /// BEGIN (with the statement timeout), and `then` in the same message when given; the rows `then` answered.
    async fn begin_then(&self, options: TxOptions, then: Option<String>) -> Result<(Tx, Vec<PgRow>)> {
        self.begin_then_after(None, options, then).await
    }

    /// [`Db::begin_then`] after `prefix` (statements that end their own transaction) in the same message.
    async fn begin_then_after(
        &self,
        prefix: Option<String>,
        options: TxOptions,
        then: Option<String>,
    ) -> Result<(Tx, Vec<PgRow>)> {
        let mut text = options.begin_sql(self.statement_timeout_ms);
        if let Some(prefix) = prefix {
            text = format!("{prefix}; {text}");
        }
        if let Some(then) = then {
            text = format!("{text}; {then}");
        }
        // Every idle connection may have broken (the database restarted): one more try than the pool holds.
        let mut tries = self.pool.size() + 1;
        loop {
            let conn = self.pool.acquire().await?;
            // Construct the guard first: if BEGIN succeeds and what follows it fails, the transaction is ended.
            let mut tx = Tx {
                conn,
                savepoints: 0,
                open: true,
                appended: None,
                appends: Arc::clone(&self.appends),
                after_commit: Vec::new(),
                follow_ups: Vec::new(),
                writer: Arc::clone(&self.follow_ups),
                deferred: Vec::new(),
            };
            match sqlx::raw_sql(AssertSqlSafe(text.clone())).fetch_all(tx.conn()).await {
                Ok(rows) => return Ok((tx, rows)),
                // The connection broke (no answer, or the server saying it ended the session): dropping the
                // guard closes it, and nothing of the transaction ran, so another connection may begin it.
                Err(err) if crate::error::is_unavailable(&err) && tries > 1 => {
                    tracing::debug!(error = %err, "a pooled connection broke while idle; beginning on another");
                    tries -= 1;
                }
                Err(err) => {
                    if err.as_database_error().is_some() {
                        // BEGIN ran and what followed it failed: end the transaction and keep the connection.
                        tx.rollback().await;
                    }
                    return Err(err.into());
                }
            }
        }
    }

    /// Runs `f` between BEGIN and COMMIT and returns its result. An error from `f` rolls back; a COMMIT that
    /// PostgreSQL turned into a ROLLBACK (because `f` caught a statement error) is an [`Error::Internal`].
    ///
    /// ```text
    /// db.transaction(TxOptions::COMMAND, |tx| async move { append(tx, &batch).await }.scope_boxed()).await?;
    /// ```
    pub async fn transaction<'a, T, E, F>(&self, options: TxOptions, f: F) -> Result<T, E>
    where
        F: for<'t> FnOnce(&'t mut Tx) -> ScopedBoxFuture<'a, 't, Result<T, E>>,
        E: From<Error>,
    {
        let mut tx = self.begin(options).await?;
        let result = f(&mut tx).await;
        tx.end(result).await
    }

    /// Runs `f` in a transaction, and runs it again in a fresh transaction, a bounded number of times with
    /// jittered backoff, while it fails with a retryable error (a version conflict, `40001`, `40P01` or
    /// `23P01`). The last error is returned as is.
    pub async fn transaction_with_retry<'a, T, E, F>(
        &self,
        options: TxOptions,
        policy: &RetryPolicy,
        mut f: F,
    ) -> Result<T, E>
    where
        F: for<'t> FnMut(&'t mut Tx) -> ScopedBoxFuture<'a, 't, Result<T, E>>,
        E: From<Error> + Retryable,
    {
        let mut tries = 1;
        loop {
            match self.transaction(options, &mut f).await {
                Err(err) if policy.allows_another(tries, &err) => {
                    policy.pause(tries, &err).await;
                    tries += 1;
                }
                result => return result,
            }
        }
    }
}

/// What leads a transaction's last message, before its deferred calls and COMMIT
/// ([`crate::events::append_and_commit`]): an append, the calls that go with it, and what must run before it.
pub(crate) struct Lead {
    /// The statements before the append, the append's call, then the others.
    pub(crate) statements: Vec<String>,
    /// Where the append is among `statements`.
    pub(crate) append_at: usize,
    /// For each statement after the append: the function its answer (a JSON array) is handed to after the commit
    /// ([`Tx::follow_up`]); an empty array hands nothing.
    pub(crate) follow_ups: Vec<Option<&'static str>>,
    /// Where the append landed, read from its answer.
    pub(crate) landed: fn(&str) -> Result<Position>,
}

/// An open transaction on one pooled connection. Run statements on [`Tx::conn`].
#[derive(Debug)]
pub struct Tx {
    conn: Conn,
    savepoints: u32,
    open: bool,
    /// The last position this transaction appended: its commit is then signalled on [`Db::appends`].
    appended: Option<Position>,
    appends: Arc<watch::Sender<Position>>,
    /// Calls sent right after COMMIT, in the same message (see [`Tx::after_commit`]).
    after_commit: Vec<String>,
    /// Calls handed to the pool's writer once committed (see [`Tx::follow_up`]).
    follow_ups: Batch,
    writer: Arc<FollowUps>,
    /// Calls sent right before COMMIT, in the same message (see [`Tx::defer`]).
    deferred: Vec<String>,
}

impl Tx {
    /// The connection, as a sqlx executor. Use the builders in [`crate::sql`], which never name a statement.
    pub fn conn(&mut self) -> &mut PgConnection {
        self.conn.get()
    }

    /// Commits. If a statement had failed inside the transaction (and the error was caught), PostgreSQL
    /// would answer COMMIT with ROLLBACK; that is reported as [`Error::Internal`], never as success.
    pub async fn commit(self) -> Result<()> {
        // A statement before COMMIT in the same round trip fails with 25P02 when the transaction is aborted;
        // COMMIT alone would silently roll back. A deferred call is such a statement already.
        let guard = if self.deferred.is_empty() { "SELECT 1" } else { "" };
        self.commit_after(None, guard.to_owned()).await.map(drop)
    }

    /// Sends `call` right after this transaction's COMMIT, in the same round trip, outside the transaction (in its
    /// own implicit one, at the session's default isolation, read committed): for bookkeeping that must follow a
    /// commit but must never conflict with it, such as a hint recounted from what the transaction wrote. Only
    /// when the commit succeeds; the call must not fail (its error would read as the commit's), so it catches its
    /// own. Calls run in the order they were queued.
    pub fn after_commit(&mut self, call: &crate::sql::Call) {
        self.after_commit.push(call.statement());
    }

    /// Calls `function` with `array` (a JSON array) after this transaction commits, by the pool's writer of
    /// follow-ups, which merges the arrays that commits hand it for the same function into one call (the module
    /// `follow_up` says why): for a hint that may lag its commit, that many commits change at once, and that
    /// something repairs when a follow-up is lost (it is written at most once; the process may stop first). Like
    /// [`Tx::after_commit`] it runs outside the transaction, only when it commits, and must catch its own errors;
    /// unlike it, nothing waits for it. [`Db::follow_ups_written`] waits for it.
    pub fn follow_up(&mut self, function: &'static str, array: &str) {
        self.follow_ups.push((function, array.to_owned()));
    }

    /// Sends `call` with this transaction's COMMIT, in the same round trip and before it, inside the transaction:
    /// for a write whose answer nobody needs and that nothing later in the transaction reads (a wake queued for the
    /// worker). An error from it is the commit's, and rolls everything back. Calls run in the order they were
    /// queued.
    pub fn defer(&mut self, call: &crate::sql::Call) {
        self.deferred.push(call.statement());
    }

    /// Runs `calls` in this transaction, one after another, in one round trip (one message of the simple query
    /// protocol): what each answered, in order. The first that fails stops the rest, and the transaction is then
    /// aborted (the error is returned; roll back).
    pub async fn calls(&mut self, calls: &[crate::sql::Call]) -> Result<Vec<Option<String>>> {
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        let text = calls.iter().map(crate::sql::Call::statement).collect::<Vec<_>>().join("; ");
        let rows = sqlx::raw_sql(AssertSqlSafe(text)).fetch_all(self.conn.get()).await?;
        if rows.len() != calls.len() {
            return Err(Error::Internal(format!("{} server-side calls answered {} rows", calls.len(), rows.len())));
        }
        rows.iter().map(|row| first_text(std::slice::from_ref(row))).collect()
    }

    /// Forgets the calls [`Tx::after_commit`] and [`Tx::follow_up`] queued (a rebuild into a scratch schema queues
    /// calls for the live tables that must not run).
    pub fn clear_after_commit(&mut self) {
        self.after_commit.clear();
        self.follow_ups.clear();
    }

    /// Records that this transaction appended up to `position` (see [`Db::appends`]).
    pub(crate) fn mark_appended(&mut self, position: Position) {
        self.appended = Some(self.appended.map_or(position, |before| before.max(position)));
    }

    /// Runs `call` in this transaction in one round trip (the simple query protocol), returning its result.
    pub async fn call(&mut self, call: &crate::sql::Call) -> Result<Option<String>> {
        let rows = sqlx::raw_sql(AssertSqlSafe(call.statement())).fetch_all(self.conn.get()).await?;
        first_text(&rows)
    }

    /// Runs `last` and commits in one round trip, returning the call's result. If the call fails, COMMIT is not
    /// run (the rest of a simple query stops at an error) and the transaction is rolled back; a failing COMMIT is
    /// reported as from [`Tx::commit`].
    pub async fn commit_with(self, last: &crate::sql::Call) -> Result<Option<String>> {
        let (_, rows) = self.commit_after(None, last.statement()).await?;
        first_text(&rows)
    }

    /// Runs `lead` (an append and the calls that go with it), the deferred calls and COMMIT in one round trip;
    /// what each of `lead`'s statements answered. See [`crate::events::append_and_commit`].
    pub(crate) async fn commit_leading(self, lead: Lead) -> Result<Vec<Option<String>>> {
        self.commit_after(Some(lead), String::new()).await.map(|(answers, _)| answers)
    }

    /// `lead`'s statements, the deferred calls, `statement` (none when empty) and COMMIT in one message; what
    /// `lead`'s statements answered, and the rows the statement answered.
    async fn commit_after(
        mut self,
        mut lead: Option<Lead>,
        statement: String,
    ) -> Result<(Vec<Option<String>>, Vec<PgRow>)> {
        // The lead's statements move into the message (the append's carries every payload): only their count stays.
        let mut parts: Vec<String> = lead.as_mut().map(|lead| std::mem::take(&mut lead.statements)).unwrap_or_default();
        let led = parts.len();
        let deferred = self.deferred.len();
        parts.append(&mut self.deferred);
        if !statement.is_empty() {
            parts.push(statement);
        }
        parts.push("COMMIT".to_owned());
        let mut text = parts.join("; ");
        for call in self.after_commit.drain(..) {
            text.push_str("; ");
            text.push_str(&call);
        }
        match sqlx::raw_sql(AssertSqlSafe(text)).fetch_all(self.conn.get()).await {
            Ok(rows) => {
                self.open = false;
                // Committed: what the lead answered is read before the follow-ups go and the commit is signalled,
                // since the append's position and the follow-ups its calls asked for are among it.
                let mut rows = rows.into_iter();
                let answers: Vec<PgRow> = rows.by_ref().take(led).collect();
                let read = match &lead {
                    Some(lead) => self.read_lead(lead, led, &answers),
                    None => Ok(Vec::new()),
                };
                self.hand_over_follow_ups().await;
                if let Some(position) = self.appended {
                    self.appends.send_if_modified(|highest| {
                        let higher = position > *highest;
                        if higher {
                            *highest = position;
                        }
                        higher
                    });
                }
                // Each deferred call answered one row, before the statement's.
                Ok((read?, rows.skip(deferred).collect()))
            }
            Err(err) if sql_state(&err).as_deref() == Some(IN_FAILED_SQL_TRANSACTION) => {
                self.rollback().await;
                Err(Error::Internal(
                    "the transaction was aborted by an earlier statement error, so COMMIT would have rolled it back"
                        .to_owned(),
                ))
            }
            Err(err) => {
                if err.as_database_error().is_some() {
                    // The server answered: the statement or COMMIT itself failed (a deferred constraint, a
                    // serialization failure), which ends the transaction. ROLLBACK makes sure of it.
                    self.rollback().await;
                }
                Err(err.into())
            }
        }
    }

    /// Reads what a committed lead answered: marks where its append landed, and queues the follow-ups its calls'
    /// answers ask for.
    fn read_lead(&mut self, lead: &Lead, led: usize, rows: &[PgRow]) -> Result<Vec<Option<String>>> {
        if rows.len() != led {
            return Err(Error::Internal(format!("{led} statements led the commit, {} answered", rows.len())));
        }
        let answers = rows.iter().map(|row| first_text(std::slice::from_ref(row))).collect::<Result<Vec<_>>>()?;
        let landed = answers.get(lead.append_at).cloned().flatten();
        let landed = landed.ok_or_else(|| Error::Internal("the append answered NULL".into()))?;
        self.mark_appended((lead.landed)(&landed)?);
        for (answer, function) in answers.iter().skip(lead.append_at + 1).zip(&lead.follow_ups) {
            if let (Some(function), Some(array)) = (function, answer)
                && array != "[]"
            {
                self.follow_up(function, array);
            }
        }
        Ok(answers)
    }

    /// After the commit: the follow-ups go to the pool's writer, or, when there is none, are sent here at once.
    async fn hand_over_follow_ups(&mut self) {
        if self.follow_ups.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.follow_ups);
        if let Err(batch) = self.writer.hand_over(batch)
            && !self.writer.write_on(self.conn.get(), batch).await
        {
            self.conn.discard();
        }
    }

    /// Ends the transaction as `result` says: commits on success (a failing commit is the answer then), rolls back
    /// on an error and returns it.
    pub async fn end<T, E: From<Error>>(self, result: Result<T, E>) -> Result<T, E> {
        match result {
            Ok(value) => {
                self.commit().await?;
                Ok(value)
            }
            Err(err) => {
                self.rollback().await;
                Err(err)
            }
        }
    }

    /// Rolls back. Never fails: if ROLLBACK cannot be sent, the connection is closed instead.
    pub async fn rollback(mut self) {
        if sqlx::raw_sql("ROLLBACK").execute(self.conn.get()).await.is_ok() {
            self.open = false;
        }
    }

    /// Runs `f` inside a savepoint: an error from `f` rolls back to the savepoint and leaves this transaction
    /// usable; success releases it.
    pub async fn savepoint<'a, T, E, F>(&mut self, f: F) -> Result<T, E>
    where
        F: for<'t> FnOnce(&'t mut Tx) -> ScopedBoxFuture<'a, 't, Result<T, E>>,
        E: From<Error>,
    {
        self.savepoints += 1;
        let name = format!("bc_sp_{}", self.savepoints);
        let result = self.run_in_savepoint(&name, f).await;
        self.savepoints -= 1;
        result
    }

    async fn run_in_savepoint<'a, T, E, F>(&mut self, name: &str, f: F) -> Result<T, E>
    where
        F: for<'t> FnOnce(&'t mut Tx) -> ScopedBoxFuture<'a, 't, Result<T, E>>,
        E: From<Error>,
    {
        sqlx::raw_sql(AssertSqlSafe(format!("SAVEPOINT {name}"))).execute(self.conn()).await.map_err(Error::from)?;
        // What the savepoint queued for the commit goes with it when it is rolled back.
        let marks = (self.deferred.len(), self.after_commit.len(), self.follow_ups.len());
        let result = self.run_to_release(name, f).await;
        if result.is_err() {
            self.deferred.truncate(marks.0);
            self.after_commit.truncate(marks.1);
            self.follow_ups.truncate(marks.2);
        }
        result
    }

    async fn run_to_release<'a, T, E, F>(&mut self, name: &str, f: F) -> Result<T, E>
    where
        F: for<'t> FnOnce(&'t mut Tx) -> ScopedBoxFuture<'a, 't, Result<T, E>>,
        E: From<Error>,
    {
        match f(self).await {
            Ok(value) => {
                match sqlx::raw_sql(AssertSqlSafe(format!("RELEASE SAVEPOINT {name}"))).execute(self.conn()).await {
                    Ok(_) => Ok(value),
                    Err(err) if sql_state(&err).as_deref() == Some(IN_FAILED_SQL_TRANSACTION) => {
                        self.rollback_to(name).await?;
                        Err(Error::Internal(format!(
                            "savepoint {name} was aborted by a statement error that was caught; rolled back to it"
                        ))
                        .into())
                    }
                    Err(err) => Err(Error::from(err).into()),
                }
            }
            Err(err) => {
                self.rollback_to(name).await?;
                Err(err)
            }
        }
    }

    async fn rollback_to(&mut self, name: &str) -> Result<()> {
        let sql = format!("ROLLBACK TO SAVEPOINT {name}; RELEASE SAVEPOINT {name}");
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(self.conn()).await?;
        Ok(())
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        if self.open {
            // Never hand a connection back to the pool in the middle of a transaction.
            self.conn.discard();
        }
    }
}

/// The text of the first column of the only row a [`crate::sql::Call`] answers.
fn first_text(rows: &[PgRow]) -> Result<Option<String>> {
    use sqlx::Row as _;
    match rows.first() {
        Some(row) => Ok(row.try_get::<Option<String>, _>(0)?),
        None => Err(Error::Internal("a server-side call answered no row".to_owned())),
    }
}

/// Errors that say whether running the transaction again may succeed.
pub trait Retryable {
    /// Why another try may succeed; `None` when it may not.
    fn retry_reason(&self) -> Option<RetryReason>;

    fn is_retryable(&self) -> bool {
        self.retry_reason().is_some()
    }
}

impl Retryable for Error {
    fn retry_reason(&self) -> Option<RetryReason> {
        Error::retry_reason(self)
    }
}

/// Tries run again in this process since it started, by reason (in the order of [`RetryReason::ALL`]).
static RETRIES: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

/// How many transactions this process has run again since it started, by reason: what `/metrics` reports and
/// what the benchmarks divide by their cycles.
pub fn retries() -> [(RetryReason, u64); 4] {
    RetryReason::ALL.map(|reason| (reason, RETRIES[reason as usize].load(Ordering::Relaxed)))
}

/// How often and how patiently [`retry`] tries again.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Tries in all, the first included.
    pub max_attempts: u32,
    /// The backoff before the second try; it doubles each time, up to `max_delay`, with full jitter.
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self { max_attempts: 8, base_delay: Duration::from_millis(2), max_delay: Duration::from_millis(200) }
    }
}

impl RetryPolicy {
    /// Whether `err`, after `tries` tries, is worth another.
    pub fn allows_another<E: Retryable>(&self, tries: u32, err: &E) -> bool {
        err.is_retryable() && tries < self.max_attempts
    }

    /// Counts a retry for `err`'s reason (see [`retries`]) and waits [`RetryPolicy::backoff`] before try number
    /// `attempt + 1`. Every retry loop goes through here.
    pub async fn pause<E: Retryable>(&self, attempt: u32, err: &E) {
        if let Some(reason) = err.retry_reason() {
            RETRIES[reason as usize].fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(self.backoff(attempt)).await;
    }

    /// The jittered delay before try number `attempt + 1` (`attempt` counts from 1).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = self.base_delay.saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
        let cap = exp.min(self.max_delay);
        cap.mul_f64(fastrand::f64())
    }
}

/// Calls `attempt` until it succeeds, fails with an error that is not retryable, or the policy's tries run
/// out. Each call must do its whole unit of work (its own transaction).
pub async fn retry<T, E, F, Fut>(policy: &RetryPolicy, mut attempt: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Retryable,
{
    let mut tries = 1;
    loop {
        match attempt().await {
            Err(err) if policy.allows_another(tries, &err) => {
                policy.pause(tries, &err).await;
                tries += 1;
            }
            result => return result,
        }
    }
}
