//! The connection pool behind [`crate::Db`]: connections opened on demand up to a limit, handed out whole to one
//! transaction at a time, and taken back without a word to the server. sqlx's own pool pings every connection it
//! takes back (a round trip after every transaction, the command waiting or not); here a connection comes back as it
//! is, and one that broke while idle is found by the next BEGIN, which [`crate::Db::begin`] then sends on another.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions as _, Connection as _, PgConnection};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A connection kept longer than this is closed when it comes back, so a long-running process reconnects now and
/// then (server-side memory, a moved DNS name).
const MAX_LIFETIME: Duration = Duration::from_secs(30 * 60);

/// A pool of connections to one database.
#[derive(Debug, Clone)]
pub(crate) struct Pool {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    options: PgConnectOptions,
    max: u32,
    acquire_timeout: Duration,
    /// One permit per connection a caller may hold.
    permits: Arc<Semaphore>,
    /// Connections not in use, the most recently used last.
    idle: Mutex<Vec<Idle>>,
    /// Connections open, in use or idle.
    open: AtomicU32,
    closed: AtomicBool,
}

#[derive(Debug)]
struct Idle {
    conn: PgConnection,
    opened: Instant,
    since: Instant,
}

/// A connection taken from the pool; it goes back when dropped, unless [`Conn::discard`] was called.
#[derive(Debug)]
pub(crate) struct Conn {
    conn: Option<PgConnection>,
    opened: Instant,
    keep: bool,
    pool: Arc<Inner>,
    _permit: OwnedSemaphorePermit,
}

/// How many connections a pool holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Open, in use or idle.
    pub size: u32,
    pub idle: u32,
    pub max: u32,
}

impl Pool {
    pub(crate) fn new(options: PgConnectOptions, max: u32, acquire_timeout: Duration, idle_timeout: Duration) -> Pool {
        let max = max.max(1);
        let inner = Arc::new(Inner {
            options,
            max,
            acquire_timeout,
            permits: Arc::new(Semaphore::new(max as usize)),
            idle: Mutex::new(Vec::new()),
            open: AtomicU32::new(0),
            closed: AtomicBool::new(false),
        });
        // Idle connections past their time are closed in the background, as long as the pool lives.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let weak = Arc::downgrade(&inner);
            runtime.spawn(reap(weak, idle_timeout));
        }
        Pool { inner }
    }

    /// A connection: an idle one, or a new one while fewer than the limit are open; waits up to the acquire timeout
    /// for one to come back.
    pub(crate) async fn acquire(&self) -> Result<Conn, sqlx::Error> {
        let inner = &self.inner;
        if inner.closed.load(Ordering::Acquire) {
            return Err(sqlx::Error::PoolClosed);
        }
        let permit = match tokio::time::timeout(inner.acquire_timeout, Arc::clone(&inner.permits).acquire_owned()).await
        {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => return Err(sqlx::Error::PoolClosed),
            Err(_) => return Err(sqlx::Error::PoolTimedOut),
        };
        let reused = {
            let mut idle = inner.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            idle.pop()
        };
        if let Some(Idle { conn, opened, .. }) = reused {
            return Ok(Conn { conn: Some(conn), opened, keep: true, pool: Arc::clone(inner), _permit: permit });
        }
        let conn = inner.options.connect().await?;
        inner.open.fetch_add(1, Ordering::AcqRel);
        Ok(Conn { conn: Some(conn), opened: Instant::now(), keep: true, pool: Arc::clone(inner), _permit: permit })
    }

    pub(crate) fn stats(&self) -> PoolStats {
        let idle = self.inner.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).len() as u32;
        PoolStats { size: self.inner.open.load(Ordering::Acquire), idle, max: self.inner.max }
    }

    /// Open connections, in use or idle.
    pub(crate) fn size(&self) -> u32 {
        self.inner.open.load(Ordering::Acquire)
    }

    /// Closes the idle connections, and every other one as it comes back; later acquires fail.
    pub(crate) async fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
        self.inner.permits.close();
        let idle: Vec<Idle> =
            std::mem::take(&mut *self.inner.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
        for Idle { conn, .. } in idle {
            self.inner.open.fetch_sub(1, Ordering::AcqRel);
            let _ = conn.close().await;
        }
    }
}

/// Closes idle connections that waited longer than `idle_timeout`, until the pool is gone.
async fn reap(pool: Weak<Inner>, idle_timeout: Duration) {
    let every = (idle_timeout / 4).clamp(Duration::from_secs(1), Duration::from_secs(60));
    loop {
        tokio::time::sleep(every).await;
        let Some(inner) = pool.upgrade() else { return };
        let stale: Vec<Idle> = {
            let mut idle = inner.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let (stale, fresh): (Vec<Idle>, Vec<Idle>) =
                idle.drain(..).partition(|i| i.since.elapsed() >= idle_timeout || i.opened.elapsed() >= MAX_LIFETIME);
            *idle = fresh;
            stale
        };
        for Idle { conn, .. } in stale {
            inner.open.fetch_sub(1, Ordering::AcqRel);
            let _ = conn.close().await;
        }
        if inner.closed.load(Ordering::Acquire) {
            return;
        }
    }
}

impl Conn {
    pub(crate) fn get(&mut self) -> &mut PgConnection {
        self.conn.as_mut().unwrap_or_else(|| unreachable!("a connection is only taken out when it is dropped"))
    }

    /// Closes the connection instead of handing it back (its state is not known: a transaction may be open).
    pub(crate) fn discard(&mut self) {
        self.keep = false;
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        let pool = &self.pool;
        if self.keep && !pool.closed.load(Ordering::Acquire) && self.opened.elapsed() < MAX_LIFETIME {
            let mut idle = pool.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            idle.push(Idle { conn, opened: self.opened, since: Instant::now() });
        } else {
            pool.open.fetch_sub(1, Ordering::AcqRel);
            match tokio::runtime::Handle::try_current() {
                // A clean connection says goodbye.
                Ok(runtime) if self.keep => {
                    runtime.spawn(async move {
                        let _ = conn.close().await;
                    });
                }
                // Dropping one closes its socket: the server ends the session and rolls back what was open.
                _ => drop(conn),
            }
        }
    }
}
