//! Shards spread over processes through leases. Every process that does sharded work keeps a membership lease
//! (`member:<group>:<owner>`) and holds a fair share of the `shard:<n>` leases: the shard count divided by the
//! live members, rounded up. It takes free or lapsed shards until it has its share, gives extras up at once when
//! more members arrive, and so takes over a dead process's shards once that process's leases lapse. Work on a
//! shard runs in transactions fenced by its lease ([`crate::lease::fence`]), so a process that lost a shard
//! (paused past its lease, cut off from the database) cannot commit work for it any more.

use std::collections::BTreeMap;

use crate::db::{Db, TxOptions};
use crate::error::{Error, Result};
use crate::lease::{self, Lease, LeaseConfig};
use crate::sql;

/// How a process keeps its shards.
#[derive(Debug, Clone)]
pub struct ShardConfig {
    /// The members' group: processes of one group share its shards.
    pub group: String,
    /// How many shards there are.
    pub shards: u32,
    /// The shard and membership leases' time to live and renewal.
    pub lease: LeaseConfig,
}

impl ShardConfig {
    /// The worker's shards: `count` of them, with the seed's 15 s leases renewed every 5 s.
    pub fn workers(count: u32) -> Self {
        Self { group: "worker".to_owned(), shards: count, lease: LeaseConfig::SHARD }
    }
}

/// The lease name of shard `n`.
pub fn shard_lease_name(shard: i32) -> String {
    format!("shard:{shard}")
}

/// The shards a process holds now, each with its lease.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnedShards {
    pub leases: BTreeMap<i32, Lease>,
}

impl OwnedShards {
    pub fn shards(&self) -> Vec<i32> {
        self.leases.keys().copied().collect()
    }

    pub fn lease(&self, shard: i32) -> Option<&Lease> {
        self.leases.get(&shard)
    }
}

/// Keeps this process's share of the shards until [`ShardKeeper::stop`], which gives them up at once.
#[derive(Debug)]
pub struct ShardKeeper {
    state: tokio::sync::watch::Receiver<OwnedShards>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl ShardKeeper {
    /// Starts keeping shards for `owner` (usually [`lease::process_owner_id`]).
    pub fn start(db: Db, owner: String, config: ShardConfig) -> Self {
        let (publish, state) = tokio::sync::watch::channel(OwnedShards::default());
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(keep(db, owner, config, publish, stopped));
        Self { state, stop: Some(stop), task }
    }

    /// What this process holds now, to follow as it changes.
    pub fn watch(&self) -> tokio::sync::watch::Receiver<OwnedShards> {
        self.state.clone()
    }

    /// Stops, giving every shard and the membership up at once so the other members take them over without
    /// waiting for the leases to lapse.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for ShardKeeper {
    fn drop(&mut self) {
        if self.stop.is_some() {
            self.task.abort();
        }
    }
}

/// The live members of `group`.
pub async fn live_members(db: &Db, group: &str) -> Result<i64> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let members: i64 =
        sql::query_scalar("SELECT count(*) FROM leases WHERE starts_with(name, $1) AND expires_at > compute_now()")
            .bind(format!("member:{group}:"))
            .fetch_one(tx.conn())
            .await?;
    tx.commit().await?;
    Ok(members)
}

/// The shards no live lease holds (absent, lapsed or given up).
async fn free_shards(db: &Db, shards: u32) -> Result<Vec<i32>> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let free: Vec<i32> = sql::query_scalar(
        "SELECT n FROM generate_series(0, $1 - 1) AS n
         WHERE NOT EXISTS (SELECT 1 FROM leases
                           WHERE name = 'shard:' || n AND expires_at > compute_now())
         ORDER BY n",
    )
    .bind(shards as i32)
    .fetch_all(tx.conn())
    .await?;
    tx.commit().await?;
    Ok(free)
}

/// Work claimed on `shard` by whoever held it before is free to claim again: the old owner's transactions are
/// fenced out (taking the lease waited for any still running), so its claims only hold the work back.
async fn release_claims(db: &Db, lease: &Lease, shard: i32) -> Result<u64> {
    let mut tx = lease::begin_fenced(db, lease, TxOptions::READ_COMMITTED).await?;
    let released =
        sql::query("UPDATE work_queue SET claimed_until = NULL WHERE shard = $1 AND claimed_until IS NOT NULL")
            .bind(shard)
            .execute(tx.conn())
            .await?
            .rows_affected();
    tx.commit().await?;
    Ok(released)
}

/// The order in which `owner` tries free shards: from a place of its own, so members starting together do not
/// all reach for the same ones.
fn spread(owner: &str, mut free: Vec<i32>, shards: u32) -> Vec<i32> {
    let start = crate::queue::shard_for(owner, shards.max(1));
    free.sort_by_key(|&n| (n - start).rem_euclid(shards.max(1) as i32));
    free
}

async fn keep(
    db: Db,
    owner: String,
    config: ShardConfig,
    publish: tokio::sync::watch::Sender<OwnedShards>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let member_name = format!("member:{}:{owner}", config.group);
    let mut member: Option<Lease> = None;
    let mut held: BTreeMap<i32, (Lease, tokio::time::Instant)> = BTreeMap::new();
    loop {
        if let Err(err) = round(&db, &owner, &config, &member_name, &mut member, &mut held).await {
            tracing::warn!(error = %err, "shard round failed; will retry");
        }
        let owned = OwnedShards { leases: held.iter().map(|(&n, (lease, _))| (n, lease.clone())).collect() };
        publish.send_if_modified(|current| {
            let changed = *current != owned;
            *current = owned;
            changed
        });
        tokio::select! {
            _ = &mut stopped => break,
            () = tokio::time::sleep(config.lease.renew_every) => {}
        }
    }
    // Nothing is claimed under these leases any more: give them up for the other members at once.
    publish.send_modify(|current| current.leases.clear());
    for (lease, _) in held.values() {
        if let Err(err) = lease::release(&db, lease).await {
            tracing::warn!(lease = %lease.name, error = %err, "could not release shard lease; it will expire");
        }
    }
    if let Some(member) = member
        && let Err(err) = lease::release(&db, &member).await
    {
        tracing::warn!(lease = %member.name, error = %err, "could not release membership; it will expire");
    }
    tracing::info!(shards = held.len(), "released shard leases");
}

/// One round: renew the membership and the shards held, then give up or take shards towards the fair share.
async fn round(
    db: &Db,
    owner: &str,
    config: &ShardConfig,
    member_name: &str,
    member: &mut Option<Lease>,
    held: &mut BTreeMap<i32, (Lease, tokio::time::Instant)>,
) -> Result<()> {
    let now = tokio::time::Instant::now();
    // Renew what is held first: a failed round must not cost a shard its lease.
    let mut lost = Vec::new();
    for (&shard, (lease, renewed_at)) in held.iter_mut() {
        match lease::renew(db, lease).await {
            Ok(()) => *renewed_at = now,
            Err(Error::LeaseLost { .. }) => {
                tracing::warn!(lease = %lease.name, epoch = lease.epoch, "lost shard lease to another owner");
                lost.push(shard);
            }
            Err(err) if now.duration_since(*renewed_at) >= config.lease.max_fenced_transaction() => {
                tracing::warn!(lease = %lease.name, error = %err, "could not renew shard lease in time; giving it up");
                lost.push(shard);
            }
            Err(err) => tracing::warn!(lease = %lease.name, error = %err, "could not renew shard lease; will retry"),
        }
    }
    for shard in lost {
        held.remove(&shard);
    }
    // The membership: acquiring a lease this owner holds renews it.
    *member = lease::acquire(db, member_name, owner, config.lease.ttl).await?;
    if member.is_none() {
        return Err(Error::Internal(format!("membership {member_name} is held by another owner")));
    }
    let members = live_members(db, &config.group).await?.max(1) as u32;
    let share = config.shards.div_ceil(members) as usize;
    // More than the share: give the highest shards up at once, for the members that have fewer.
    while held.len() > share {
        let Some((_, (lease, _))) = held.pop_last() else { break };
        lease::release(db, &lease).await?;
        tracing::info!(lease = %lease.name, members, share, "gave up shard lease for another member");
    }
    if held.len() < share {
        for shard in spread(owner, free_shards(db, config.shards).await?, config.shards) {
            if held.len() >= share {
                break;
            }
            let name = shard_lease_name(shard);
            if let Some(lease) = lease::acquire(db, &name, owner, config.lease.ttl).await? {
                let released = release_claims(db, &lease, shard).await?;
                tracing::info!(lease = %name, epoch = lease.epoch, released_claims = released, members, share, "acquired shard lease");
                held.insert(shard, (lease, now));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_start_their_search_at_different_shards_and_try_every_free_one() {
        let free: Vec<i32> = (0..16).collect();
        let a = spread("prc_a", free.clone(), 16);
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, free, "every free shard is tried once");
        let starts: std::collections::BTreeSet<i32> =
            (0..8).map(|i| spread(&format!("prc_{i}"), free.clone(), 16)[0]).collect();
        assert!(starts.len() > 1, "different owners start at different shards: {starts:?}");
    }
}
