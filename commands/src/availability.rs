//! The availability query: when a request could start, and what is free in a pool over a window. Advance
//! reservations need it: a tenant plans with the answer, then reserves with it.

use bc_domain::device::DeviceClass;
use bc_domain::id::{DeviceId, NodeId, PoolId, ReservationId, TenantId};
use bc_domain::placement::{self, PlannedAllocation};
use bc_domain::pool::governing_offer;
use bc_domain::reservation::{self, DeviceRequest, MAX_AHEAD_MS};
use bc_domain::{Rejection, instant};
use bc_eventstore::{Tx, TxOptions, clock};

pub use super::store::hints::FreeCountSeen;
use super::store::{self, PoolRow, hints};
use super::{App, AppResult, Caller};

/// How many candidate start times the earliest-start search tries before giving up.
pub const MAX_CANDIDATE_STARTS: i64 = 2_000;

/// How many booking ends the earliest-start search reads at a time.
const ENDS_PAGE: i64 = 32;

/// A question about a pool: when could this request start?
#[derive(Debug, Clone)]
pub struct EarliestStart {
    pub pool_id: PoolId,
    pub devices: DeviceRequest,
    pub duration_s: u64,
    /// Not before this time (epoch milliseconds); now when absent.
    pub not_before_ms: Option<i64>,
}

/// Atoms of one node free over a whole window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreeAtoms {
    pub node_id: NodeId,
    pub atoms: Vec<DeviceId>,
}

pub(crate) fn round_up_to_second(ms: i64) -> i64 {
    (ms + 999).div_euclid(1000) * 1000
}

/// One placement question, asked of one candidate start at a time: which atoms the request would get over a window,
/// within the tenant's quota at every instant of it. The earliest-start query and the quotes ask it.
pub(crate) struct Ask<'a> {
    pub tenant: &'a TenantId,
    pub pool: &'a PoolRow,
    pub devices: &'a DeviceRequest,
    pub quota: Option<u32>,
    pub duration_ms: i64,
    /// The id placement's ties are spread by.
    pub probe: &'a ReservationId,
}

impl Ask<'_> {
    /// The atoms the request would get over `[start, start + duration)` (placement's own choice, best fit first),
    /// when it fits the pool then within the tenant's quota; `None` when it does not.
    pub(crate) async fn plan_at(&self, tx: &mut Tx, start: i64) -> AppResult<Option<Vec<PlannedAllocation>>> {
        let end = start + self.duration_ms;
        let plan = if self.devices.class == DeviceClass::Node {
            let machines = store::whole_nodes::candidates(tx, &self.pool.id, self.devices, start, end).await?;
            placement::plan(self.probe, self.devices, &machines)
        } else {
            let summary = store::summary_candidates(tx, &self.pool.id, self.devices, start, 0).await?;
            match placement::plan(self.probe, self.devices, &summary) {
                Some(plan) => Some(plan),
                None => {
                    let candidates = store::candidates(tx, &self.pool.id, self.devices, (start, end), 0).await?;
                    placement::plan(self.probe, self.devices, &candidates)
                }
            }
        };
        let Some(plan) = plan else { return Ok(None) };
        let Some(quota) = self.quota else { return Ok(Some(plan)) };
        let resource = self.devices.class.as_str();
        let peak = store::peak_usage(tx, self.tenant, &self.pool.id, resource, start, end).await?;
        Ok(reservation::within_quota(peak, self.devices.count, quota).then_some(plan))
    }

    /// Whether too few of the pool's nodes have the matching atoms to ever hold the request, bookings aside: nodes
    /// schedulable or not for atoms within a node, machines in service for whole machines.
    async fn never_fits(&self, tx: &mut Tx) -> AppResult<bool> {
        let holders = if self.devices.class == DeviceClass::Node {
            store::whole_nodes::holders(tx, &self.pool.id, self.devices).await?
        } else {
            store::nodes_that_could_hold(tx, &self.pool.id, self.devices).await?
        };
        Ok(holders < i64::from(self.devices.nodes()))
    }

    /// The earliest start at or after `first` (and no later than `horizon`) at which [`Ask::plan_at`] finds a
    /// plan, with that plan. Capacity only frees when a booking ends, so the candidates are `first` and every
    /// booking end after it, read a page at a time in order; the search stops at the first that fits, or after
    /// [`MAX_CANDIDATE_STARTS`].
    pub(crate) async fn earliest(
        &self,
        tx: &mut Tx,
        first: i64,
        horizon: i64,
    ) -> AppResult<Option<(i64, Vec<PlannedAllocation>)>> {
        // Most requests fit at once: the booking ends are read only when they do not.
        if let Some(plan) = self.plan_at(tx, first).await? {
            return Ok(Some((first, plan)));
        }
        // A request too few of the pool's nodes could ever hold (a selector nothing matches, more atoms a node than
        // any has) fits at no later start either: one read of the pool's devices answers it, where the walk would
        // read the pool's free atoms again at each of up to MAX_CANDIDATE_STARTS booking ends.
        if self.never_fits(tx).await? {
            return Ok(None);
        }
        let (mut after, mut tried) = (first, 0);
        while tried < MAX_CANDIDATE_STARTS {
            let page = ENDS_PAGE.min(MAX_CANDIDATE_STARTS - tried);
            let ends = store::booking_ends(tx, &self.pool.id, after, horizon, page).await?;
            for &start in &ends {
                if let Some(plan) = self.plan_at(tx, start).await? {
                    return Ok(Some((start, plan)));
                }
            }
            match ends.last() {
                Some(&last) if ends.len() as i64 == page => (after, tried) = (last, tried + page),
                _ => break,
            }
        }
        Ok(None)
    }
}

impl App {
    /// The pool, if the caller may see it: its owner, or a tenant it is offered to. Also the quota that limits
    /// the caller there (`None` for the owner).
    async fn visible_pool(
        &self,
        tx: &mut Tx,
        caller: &Caller,
        pool_id: &PoolId,
        resource: &str,
    ) -> AppResult<(PoolRow, Option<u32>)> {
        let not_found = || Rejection::NotFound { kind: "pool", id: pool_id.to_string() };
        let pool = store::pool(tx, pool_id).await?.ok_or_else(not_found)?;
        if pool.owner_tenant_id == caller.tenant_id {
            return Ok((pool, None));
        }
        let offers = store::offers(tx, pool_id).await?;
        let offer = governing_offer(&offers, &caller.tenant_id, &caller.ancestors).ok_or_else(not_found)?;
        let quota = offer.quota.get(resource).copied().unwrap_or(0);
        Ok((pool, Some(quota)))
    }

    /// The earliest start at or after `not_before` (or now) at which the request fits the pool for its whole
    /// duration, within the caller's quota; `None` when it fits nowhere in the next 366 days.
    pub async fn earliest_start(&self, caller: &Caller, query: &EarliestStart) -> AppResult<Option<i64>> {
        if query.devices.count == 0 || query.devices.count > reservation::MAX_COUNT {
            let message = format!("must be from 1 to {}", reservation::MAX_COUNT);
            return Err(Rejection::invalid("devices.count", message).into());
        }
        reservation::check_length_s("duration", query.duration_s)?;
        instant::check_opt_epoch_ms("notBefore", query.not_before_ms)?;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let resource = query.devices.class.as_str();
        let (pool, quota) = self.visible_pool(&mut tx, caller, &query.pool_id, resource).await?;
        if quota.is_some_and(|quota| query.devices.count > quota) {
            tx.commit().await?;
            return Ok(None);
        }
        let now_ms = clock::compute_now_ms(&mut tx).await?;
        let first = round_up_to_second(query.not_before_ms.unwrap_or(now_ms).max(now_ms));
        let horizon = now_ms + MAX_AHEAD_MS;
        let probe = ReservationId::derive(&caller.tenant_id, &caller.identity, "availability");
        let duration_ms = query.duration_s as i64 * 1000;
        let ask =
            Ask { tenant: &caller.tenant_id, pool: &pool, devices: &query.devices, quota, duration_ms, probe: &probe };
        let found = ask.earliest(&mut tx, first, horizon).await?;
        tx.commit().await?;
        Ok(found.map(|(start, _)| start))
    }

    /// The atoms of the pool that are free over the whole of `[start, end)` on schedulable nodes.
    pub async fn free_atoms(
        &self,
        caller: &Caller,
        pool_id: &PoolId,
        start_ms: i64,
        end_ms: i64,
    ) -> AppResult<Vec<FreeAtoms>> {
        instant::check_epoch_ms("start", start_ms)?;
        instant::check_epoch_ms("end", end_ms)?;
        if end_ms <= start_ms {
            return Err(Rejection::invalid("end", "must be after start").into());
        }
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let pool = store::pool(&mut tx, pool_id).await?;
        let class = match &pool {
            Some(pool) if pool.policy.tenant_root => DeviceClass::Node,
            Some(pool) => pool.sharing.atom_class(),
            None => DeviceClass::Gpu,
        };
        let (pool, _) = self.visible_pool(&mut tx, caller, pool_id, class.as_str()).await?;
        let candidates = if class == DeviceClass::Node {
            // Whole machines are atoms whether or not they run an agent: every one in service that is free.
            let every = DeviceRequest {
                class,
                count: 1,
                selector: Default::default(),
                topology: reservation::Topology::SameNode,
            };
            store::whole_nodes::candidates(&mut tx, &pool.id, &every, start_ms, end_ms).await?
        } else {
            store::all_free_atoms(&mut tx, &pool.id, class.as_str(), start_ms, end_ms).await?
        };
        tx.commit().await?;
        Ok(candidates.into_iter().map(|c| FreeAtoms { node_id: c.node_id, atoms: c.free_atoms }).collect())
    }
}

/// What one step of the hints' walk did ([`App::walk_free_capacity`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HintWalkStep {
    /// The last node of the step, or `None` once the walk has passed the last node.
    pub last: Option<String>,
    /// Free counts that disagreed with their recount this time (corrected only if seen again the same way).
    pub disagreeing: Vec<FreeCountSeen>,
    /// Free counts corrected: seen disagreeing the same way on the walk before, with no booking change between.
    pub corrected: usize,
}

impl App {
    /// One step of the walk over the free-capacity hints: the next `limit` nodes after `after`, in id order.
    ///
    /// The hints move by the changes each commit reports, shortly after it (the pool's writer of follow-ups merges
    /// those of concurrent commits); one that was lost (the process stopped before the write, or the write failed and
    /// only warned) would stay wrong until the node changes again. The worker walks every node this way, a few at a
    /// time, in the lock order of `adjust_free` (free counts, then each node's fit lock):
    /// - `node_fit` is recounted whole (`refit_nodes` locks each node and reads after the lock, so it never
    ///   writes what a commit it did not see would undo);
    /// - a free count is a running sum, and a commit's change reaches it just after the commit: a recount taken
    ///   in between would count that change twice. So a disagreeing count is only reported, and corrected when the
    ///   next walk finds it disagreeing the same way with the node's `booking_changes` unchanged (checked again in
    ///   the correcting statement): then no change is on its way, as long as the walks are further apart than a
    ///   write of follow-ups can take (it is written or lost within the pool's acquire and statement timeouts).
    pub async fn walk_free_capacity(
        &self,
        after: Option<&str>,
        limit: i64,
        seen_before: &[FreeCountSeen],
    ) -> AppResult<HintWalkStep> {
        let limit = limit.max(1);
        let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
        let nodes = hints::nodes_after(&mut tx, after, limit).await?;
        let mut step = HintWalkStep {
            last: nodes.last().filter(|_| nodes.len() as i64 == limit).cloned(),
            ..HintWalkStep::default()
        };
        if nodes.is_empty() {
            tx.commit().await?;
            return Ok(step);
        }
        for seen in hints::disagreeing_free_counts(&mut tx, &nodes).await? {
            if seen_before.contains(&seen) && hints::correct_free_count(&mut tx, &seen).await? {
                tracing::warn!(node = %seen.node_id, class = %seen.class, held = seen.held, recount = seen.recount,
                    "corrected a free-capacity count that had lost a change");
                step.corrected += 1;
                continue;
            }
            step.disagreeing.push(seen);
        }
        hints::refit(&mut tx, &nodes).await?;
        tx.commit().await?;
        Ok(step)
    }
}
