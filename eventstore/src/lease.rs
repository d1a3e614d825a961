//! Ownership leases with fencing: `shard:<n>`, `pool:<id>`, `site:<id>:boot`, `singleton:<job>`,
//! `gateway:<id>`. A lease is a row with an owner, an epoch and an expiry; the epoch rises whenever the owner
//! changes. Work done under a lease runs in a fenced transaction, which first re-reads the lease row
//! `FOR SHARE`: a process that lost its lease sees that and stops, or, if it still holds the row lock, holds
//! up the takeover until its transaction ends. Never session advisory locks: PgBouncer would break them.

use std::sync::OnceLock;
use std::time::Duration;

use crate::clock::ClockAnchor;
use crate::db::{Db, Tx, TxOptions};
use crate::error::{Error, Result};
use crate::sql;

/// A lease's time to live and how often its owner renews it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    pub ttl: Duration,
    pub renew_every: Duration,
}

impl LeaseConfig {
    /// Shard, pool and site leases: 15 s, renewed every 5 s.
    pub const SHARD: LeaseConfig = LeaseConfig { ttl: Duration::from_secs(15), renew_every: Duration::from_secs(5) };
    /// Gateway leases: 20 s, renewed every 5 s.
    pub const GATEWAY: LeaseConfig = LeaseConfig { ttl: Duration::from_secs(20), renew_every: Duration::from_secs(5) };

    /// A fenced transaction must finish within this, or the lease may lapse under it.
    pub fn max_fenced_transaction(&self) -> Duration {
        self.ttl.saturating_sub(self.renew_every)
    }
}

/// This process incarnation's owner id: a ULID made at start, never a host name, so a restarted process is
/// a new owner and its predecessor's leases are not mistaken for its own.
pub fn process_owner_id() -> &'static str {
    static OWNER: OnceLock<String> = OnceLock::new();
    OWNER.get_or_init(|| bc_domain::id::new_id("prc"))
}

/// A lease held at a given epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub name: String,
    pub owner: String,
    pub epoch: i64,
    pub ttl: Duration,
}

/// Takes the lease if it is free, expired, or already ours; creates it if it does not exist. Returns `None`
/// while another owner holds it unexpired.
pub async fn acquire(db: &Db, name: &str, owner: &str, ttl: Duration) -> Result<Option<Lease>> {
    if name.is_empty() || owner.is_empty() {
        return Err(Error::InvalidArgument("a lease needs a name and an owner".to_owned()));
    }
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    let epoch: Option<i64> = sql::query_scalar(
        "INSERT INTO leases AS l (name, owner, epoch, expires_at)
         VALUES ($1, $2, 1, compute_now() + make_interval(secs => $3))
         ON CONFLICT (name) DO UPDATE
             SET owner = excluded.owner,
                 epoch = CASE WHEN l.owner = excluded.owner THEN l.epoch ELSE l.epoch + 1 END,
                 expires_at = excluded.expires_at,
                 acquired_at = CASE WHEN l.owner = excluded.owner THEN l.acquired_at ELSE compute_now() END
             WHERE l.owner = excluded.owner OR l.expires_at < compute_now()
         RETURNING epoch",
    )
    .bind(name)
    .bind(owner)
    .bind(ttl.as_secs_f64())
    .fetch_optional(tx.conn())
    .await?;
    tx.commit().await?;
    Ok(epoch.map(|epoch| Lease { name: name.to_owned(), owner: owner.to_owned(), epoch, ttl }))
}

/// Extends a lease still held at its epoch. [`Error::LeaseLost`] when another owner took it over.
pub async fn renew(db: &Db, lease: &Lease) -> Result<()> {
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    let renewed = sql::query(
        "UPDATE leases SET expires_at = compute_now() + make_interval(secs => $4)
         WHERE name = $1 AND owner = $2 AND epoch = $3",
    )
    .bind(&lease.name)
    .bind(&lease.owner)
    .bind(lease.epoch)
    .bind(lease.ttl.as_secs_f64())
    .execute(tx.conn())
    .await?
    .rows_affected();
    tx.commit().await?;
    if renewed == 1 { Ok(()) } else { Err(lost(lease)) }
}

/// Gives a lease up at once, so another process can take it without waiting for it to expire. The row stays
/// (with its epoch), so the next owner's epoch is higher.
pub async fn release(db: &Db, lease: &Lease) -> Result<()> {
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    sql::query("UPDATE leases SET expires_at = '-infinity' WHERE name = $1 AND owner = $2 AND epoch = $3")
        .bind(&lease.name)
        .bind(&lease.owner)
        .bind(lease.epoch)
        .execute(tx.conn())
        .await?;
    tx.commit().await
}

/// The fencing read that starts every transaction doing work under `lease`: it checks the lease is still ours
/// at this epoch and unexpired, and locks its row `FOR SHARE` until the transaction ends, so a takeover
/// waits for this transaction. [`Error::LeaseLost`] otherwise.
pub async fn fence(tx: &mut Tx, lease: &Lease) -> Result<()> {
    let held = sql::query(
        "SELECT 1 FROM leases
         WHERE name = $1 AND owner = $2 AND epoch = $3 AND expires_at > compute_now()
         FOR SHARE",
    )
    .bind(&lease.name)
    .bind(&lease.owner)
    .bind(lease.epoch)
    .fetch_optional(tx.conn())
    .await?;
    if held.is_some() { Ok(()) } else { Err(lost(lease)) }
}

/// Opens a transaction fenced by `lease`.
pub async fn begin_fenced(db: &Db, lease: &Lease, options: TxOptions) -> Result<Tx> {
    let mut tx = db.begin(options).await?;
    fence(&mut tx, lease).await?;
    Ok(tx)
}

fn lost(lease: &Lease) -> Error {
    Error::LeaseLost { name: lease.name.clone(), epoch: lease.epoch }
}

/// What a [`LeaseKeeper`] holds right now.
#[derive(Debug, Clone)]
pub struct KeptLease {
    /// The lease, while this process holds it.
    pub lease: Option<Lease>,
    /// Business time, re-anchored to the database at each successful renewal.
    pub clock: Option<ClockAnchor>,
}

/// Keeps one lease: acquires it when it is free, renews it every `renew_every`, re-anchors the process's clock
/// at each renewal, and gives it up at once on [`LeaseKeeper::stop`]. If renewals fail for longer than
/// [`LeaseConfig::max_fenced_transaction`] (the database is unreachable, say), it stops claiming the lease
/// before the lease can lapse; fencing keeps a late transaction from doing harm in any case.
#[derive(Debug)]
pub struct LeaseKeeper {
    state: tokio::sync::watch::Receiver<KeptLease>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl LeaseKeeper {
    /// Starts keeping `name` for `owner` (usually [`process_owner_id`]).
    pub fn start(db: Db, name: String, owner: String, config: LeaseConfig) -> Self {
        let (publish, state) = tokio::sync::watch::channel(KeptLease { lease: None, clock: None });
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(keep(db, name, owner, config, publish, stopped));
        Self { state, stop: Some(stop), task }
    }

    /// The lease, if this process holds it now.
    pub fn current(&self) -> Option<Lease> {
        self.state.borrow().lease.clone()
    }

    /// The clock anchor from the last renewal.
    pub fn clock(&self) -> Option<ClockAnchor> {
        self.state.borrow().clock
    }

    /// Waits until the lease is held (or the keeper stopped, then `None`).
    pub async fn held(&mut self) -> Option<Lease> {
        let state = self.state.wait_for(|kept| kept.lease.is_some()).await.ok()?;
        state.lease.clone()
    }

    /// Waits until the lease is not held.
    pub async fn lost(&mut self) {
        let _ = self.state.wait_for(|kept| kept.lease.is_none()).await;
    }

    /// Stops renewing and releases the lease, so another process can take it over at once.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        if self.stop.is_some() {
            // Dropped without stop(): the lease is left to expire.
            self.task.abort();
        }
    }
}

async fn keep(
    db: Db,
    name: String,
    owner: String,
    config: LeaseConfig,
    publish: tokio::sync::watch::Sender<KeptLease>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let mut held: Option<(Lease, tokio::time::Instant)> = None;
    loop {
        let now = tokio::time::Instant::now();
        held = match held {
            None => match acquire(&db, &name, &owner, config.ttl).await {
                Ok(Some(lease)) => {
                    tracing::info!(lease = %name, epoch = lease.epoch, "acquired lease");
                    Some((lease, now))
                }
                Ok(None) => None,
                Err(err) => {
                    tracing::warn!(lease = %name, error = %err, "could not try to acquire lease");
                    None
                }
            },
            Some((lease, renewed_at)) => match renew(&db, &lease).await {
                Ok(()) => Some((lease, now)),
                Err(Error::LeaseLost { .. }) => {
                    tracing::warn!(lease = %name, epoch = lease.epoch, "lost lease to another owner");
                    None
                }
                Err(err) if now.duration_since(renewed_at) >= config.max_fenced_transaction() => {
                    tracing::warn!(lease = %name, error = %err, "could not renew lease in time; no longer claiming it");
                    None
                }
                Err(err) => {
                    tracing::warn!(lease = %name, error = %err, "could not renew lease; will retry");
                    Some((lease, renewed_at))
                }
            },
        };
        let clock = match &held {
            Some(_) => ClockAnchor::sample(&db).await.ok(),
            None => None,
        };
        let lease = held.as_ref().map(|(lease, _)| lease.clone());
        publish.send_if_modified(|kept| {
            let changed = kept.lease != lease;
            kept.lease = lease;
            if clock.is_some() {
                kept.clock = clock;
            }
            changed
        });
        tokio::select! {
            _ = &mut stopped => break,
            () = tokio::time::sleep(config.renew_every) => {}
        }
    }
    if let Some((lease, _)) = held {
        if let Err(err) = release(&db, &lease).await {
            tracing::warn!(lease = %lease.name, error = %err, "could not release lease; it will expire");
        }
        tracing::info!(lease = %lease.name, epoch = lease.epoch, "released lease");
    }
    publish.send_modify(|kept| kept.lease = None);
}
