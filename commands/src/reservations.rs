//! Reservations: reserve (placement, quota at every instant, bookings through the exclusion constraint),
//! read, cancel, release, renew and extend.

use bc_domain::Rejection;
use bc_domain::id::{NodeId, ReservationId, TenantId};
use bc_domain::instance::{self, Instance, NewInstance};
use bc_domain::placement::{self, NodeCandidate, PlannedAllocation};
use bc_domain::pool::PoolOffered;
use bc_domain::reservation::explanation::{Decision, Explanation, Tier};
use bc_domain::reservation::{
    self, AdmissionFacts, Allocation, Binding, Command, DeviceRequest, ExpiryCause, NewRequest, Reservation,
    ReservationEvent, ReservationRequest, Waiting, placed_start,
};
use bc_eventstore::events::{self, ExpectedVersion};
use bc_eventstore::{Position, Retryable as _, ScopedFutureExt as _, Tx, TxOptions, clock, sql};

use super::explain::{self, Trace};
use super::gate::{Call, Subject, draft};
use super::store::facts::{Placing, ReserveAnswer, ReserveFacts};
use super::store::{self, PoolRow};
use super::work::{self, WorkKey};
use super::{App, AppError, AppResult, Caller, Committed, record, record_and_commit};

/// `reservations.create`.
#[derive(Debug, Clone)]
pub struct Reserve {
    /// The `Idempotency-Key`: with the tenant and the caller's identity, it names the reservation.
    pub idempotency_key: String,
    pub request: ReservationRequest,
}

/// What `reserve` answers: the reservation (`placed` or `pending` when new) and whether this call created it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserved {
    pub reservation: Reservation,
    pub created: bool,
    /// The instance made with it, for a `binding: instance` reservation.
    pub instance: Option<Instance>,
}

/// Whether a reserve attempt may place, or must record the request as pending (after its conflict retries
/// ran out, a request is left pending rather than failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    /// Place, drawing from the best `spread` more fitting nodes than it needs (0: best fit).
    Try {
        spread: usize,
    },
    Skip,
}

/// Whether reserves have lately lost races for the atoms they chose: while they have not, a reserve's first try
/// locks its chosen atoms in the message of its events and COMMIT (`lock_chosen_or_refuse`), one round trip fewer;
/// once one loses such a race, the next [`LockRaces::LOCK_FIRST`] first tries lock first (`lock_chosen`, where a
/// lost race costs a plan again, not the whole command), and every race lost there starts the count again. A
/// process-wide hint: it never decides what is placed, only in which message the lock goes.
#[derive(Debug, Default)]
pub(crate) struct LockRaces {
    lock_first: std::sync::atomic::AtomicU32,
}

impl LockRaces {
    /// First tries that lock first after a lost race.
    const LOCK_FIRST: u32 = 64;

    /// Whether this first try may lock its atoms with its COMMIT.
    fn lock_with_commit(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.lock_first.fetch_update(Relaxed, Relaxed, |left| left.checked_sub(1)).is_err()
    }

    /// A reserve lost a race for its chosen atoms.
    fn lost(&self) {
        self.lock_first.store(Self::LOCK_FIRST, std::sync::atomic::Ordering::Relaxed);
    }
}

/// How much wider than best fit try number `tries` (from 1) of a reserve draws its nodes: a request that lost the
/// race for the best fit to a concurrent one spreads out instead of racing the other losers again.
fn spread_for(tries: u32) -> usize {
    if tries <= 1 { 0 } else { 1usize << tries.min(6) }
}

pub(crate) fn check_idempotency_key(key: &str) -> Result<(), Rejection> {
    if key.is_empty() || key.len() > 255 || key.chars().any(char::is_control) {
        return Err(Rejection::invalid("Idempotency-Key", "must be 1 to 255 printable characters"));
    }
    Ok(())
}

/// The quota that limits `holder` in the pool for `resource`, or `None` when the holder is the pool's owner.
/// `known` is the pool's offers when the caller has already read them in this transaction.
async fn quota_limit(
    tx: &mut Tx,
    pool: &PoolRow,
    holder: Option<&TenantId>,
    resource: &str,
    known: Option<&[PoolOffered]>,
) -> AppResult<Option<u32>> {
    let Some(holder) = holder else { return Ok(None) };
    let read;
    let offers = match known {
        Some(offers) => offers,
        None => {
            read = store::offers(tx, &pool.id).await?;
            &read
        }
    };
    let quota =
        offers.iter().find(|offer| &offer.tenant_id == holder).map(|offer| reservation::quota_of(offer, resource));
    Ok(Some(quota.unwrap_or(0)))
}

/// The quotas that limit a reservation's holder in its pool: for its atoms, and for each of its scalars (with the
/// request's total of it). `None` and nothing when the holder is the pool's owner.
struct Quotas<'a> {
    atoms: Option<u32>,
    scalars: Vec<(&'a str, u64, u32)>,
}

/// Reads a reservation's [`Quotas`] (`offers`, when the caller already read them) and locks their rows first in the
/// lock order, every transaction taking them in the resources' order.
async fn lock_quotas<'a>(
    tx: &mut Tx,
    r: &'a Reservation,
    pool: &PoolRow,
    offers: Option<&[PoolOffered]>,
) -> AppResult<Quotas<'a>> {
    let request = &r.request;
    let holder = r.quota_holder.as_ref();
    let read;
    let offers = match (offers, holder) {
        (None, Some(_)) if !request.resources.is_empty() => {
            read = store::offers(tx, &pool.id).await?;
            Some(read.as_slice())
        }
        _ => offers,
    };
    let atoms = quota_limit(tx, pool, holder, request.resource(), offers).await?;
    let mut scalars = Vec::new();
    for (scalar, total) in request.scalar_totals() {
        if let Some(limit) = quota_limit(tx, pool, holder, scalar, offers).await? {
            scalars.push((scalar, total, limit));
        }
    }
    let mut limited: Vec<&str> = scalars.iter().map(|(scalar, ..)| *scalar).collect();
    if atoms.is_some() {
        limited.push(request.resource());
    }
    limited.sort_unstable();
    for limited in limited {
        store::lock_quota(tx, &r.tenant_id, &pool.id, limited).await?;
    }
    Ok(Quotas { atoms, scalars })
}

/// How many choices a placement makes, skipping the atoms concurrent commands hold, before it waits for them.
const LOCK_ROUNDS: u32 = 4;

/// Tries to place a pending reservation now: chooses atoms free over its whole window on schedulable nodes and
/// checks the tenant's quota at every instant of the window. Takes its locks in the lock order. `None` when it
/// does not fit now. `spread` widens the choice past best fit (see `placement::plan_spread`); `offers` are the
/// pool's offers when the caller already read them.
pub(crate) async fn try_place(
    tx: &mut Tx,
    r: &Reservation,
    pool: &PoolRow,
    now_ms: i64,
    spread: usize,
    offers: Option<&[PoolOffered]>,
    trace: &mut Trace,
) -> AppResult<Option<Vec<Allocation>>> {
    let request = &r.request;
    let resource = request.resource();
    let start_ms = placed_start(request, now_ms);
    let end_ms = start_ms + request.duration_s as i64 * 1000;
    let Quotas { atoms: quota, scalars: scalar_quotas } = lock_quotas(tx, r, pool, offers).await?;
    store::lock_pool(tx, &pool.id).await?;
    if request.binding == Binding::Node {
        // Whole machines: few, slow to hand over, and mostly not schedulable (a `ready` machine runs no agent), so
        // they are read straight from their node atoms' bookings rather than from the free-capacity summary.
        let candidates = store::whole_nodes::candidates(tx, &pool.id, &request.devices, start_ms, end_ms).await?;
        let plan = placement::plan_spread(&r.id, &request.devices, &candidates, spread);
        trace.look(Tier::WholeNodes, &candidates, plan.is_some());
        let Some(plan) = plan else {
            return Ok(None);
        };
        let nodes: Vec<&str> = plan.iter().map(|a| a.node_id.as_str()).collect();
        let atoms: Vec<&str> = plan.iter().flat_map(|a| a.devices.iter().map(|d| d.as_str())).collect();
        if !store::whole_nodes::lock(tx, &pool.id, &nodes, &atoms).await? {
            return Ok(None);
        }
        if let Some(quota) = quota {
            let peak = store::peak_usage(tx, &r.tenant_id, &pool.id, resource, start_ms, end_ms).await?;
            trace.quota(resource, quota, peak, request.devices.count);
            if !reservation::within_quota(peak, request.devices.count, quota) {
                return Ok(None);
            }
        }
        return Ok(Some(allocations(plan, request)));
    }
    if !request.resources.is_empty() {
        let window = (start_ms, end_ms);
        return place_with_scalars(tx, r, pool, window, spread, (quota, &scalar_quotas), trace).await;
    }
    // The summary answers most requests from the first nodes it reads; the exact query (the nodes that can hold the
    // atoms until the window's end, then the atoms free over the window) finds what the summary cannot see, atoms
    // booked only after the window.
    let mut candidates = store::summary_candidates(tx, &pool.id, &request.devices, start_ms, spread).await?;
    let mut plan = placement::plan_spread(&r.id, &request.devices, &candidates, spread);
    trace.look(Tier::Summary, &candidates, plan.is_some());
    if plan.is_none() {
        candidates = store::candidates(tx, &pool.id, &request.devices, (start_ms, end_ms), spread).await?;
        plan = placement::plan_spread(&r.id, &request.devices, &candidates, spread);
        trace.look(Tier::Exact, &candidates, plan.is_some());
    }
    let Some(plan) = plan else {
        return Ok(None);
    };
    let Some(plan) = lock_plan(tx, &r.id, &request.devices, candidates, plan, spread, None).await? else {
        return Ok(None);
    };
    if let Some(quota) = quota {
        let peak = store::peak_usage(tx, &r.tenant_id, &pool.id, resource, start_ms, end_ms).await?;
        trace.quota(resource, quota, peak, request.devices.count);
        if !reservation::within_quota(peak, request.devices.count, quota) {
            return Ok(None);
        }
    }
    Ok(Some(allocations(plan, request)))
}

/// Places a request that holds scalar amounts beside its atoms: among every node with the atoms free over the
/// window, those that lend the amounts at the window's busiest instant (the pool's overcommit applied); the
/// choice locked as any other, then the chosen nodes' scalar rows (last in the lock order), then the tenant's
/// quota checked at every instant for the atoms and for each scalar. The quota rows are already locked.
async fn place_with_scalars(
    tx: &mut Tx,
    r: &Reservation,
    pool: &PoolRow,
    (start_ms, end_ms): (i64, i64),
    spread: usize,
    (quota, scalar_quotas): (Option<u32>, &[(&str, u64, u32)]),
    trace: &mut Trace,
) -> AppResult<Option<Vec<Allocation>>> {
    let request = &r.request;
    let resources: Vec<&str> = request.resources.keys().map(String::as_str).collect();
    // The first nodes the exact read offers (as many as a placement without scalars draws from), then, only when
    // the scalars rule out too many of them and that read did not already see them all, every node with the atoms
    // free: a request fits when any node can hold it, so the read must not stop short of the whole pool before it
    // has found one.
    let mut limit = Some(store::scalars::first_read_limit(request.devices.nodes(), spread));
    let (candidates, plan) = loop {
        let mut candidates =
            store::scalars::atom_candidates(tx, &pool.id, &request.devices, start_ms, end_ms, limit).await?;
        let whole = limit.is_none_or(|limit| store::scalars::read_whole(candidates.len(), limit));
        let nodes: Vec<&str> = candidates.iter().map(|c| c.node_id.as_str()).collect();
        let held = store::scalars::node_peaks(tx, &nodes, &resources, start_ms, end_ms, Some(&r.id)).await?;
        candidates.retain(|c| placement::scalars_fit(&pool.policy, &request.resources, &c.node_id, &held));
        let plan = placement::plan_spread(&r.id, &request.devices, &candidates, spread);
        trace.look(Tier::Scalars, &candidates, plan.is_some());
        match plan {
            Some(plan) => break (candidates, plan),
            None if whole => return Ok(None),
            None => limit = None,
        }
    };
    let Some(plan) = lock_plan(tx, &r.id, &request.devices, candidates, plan, spread, None).await? else {
        return Ok(None);
    };
    let mut chosen: Vec<&str> = plan.iter().map(|a| a.node_id.as_str()).collect();
    chosen.sort_unstable();
    store::scalars::lock_nodes(tx, &chosen, &resources).await?;
    if let Some(quota) = quota {
        let peak = store::peak_usage(tx, &r.tenant_id, &pool.id, request.resource(), start_ms, end_ms).await?;
        trace.quota(request.resource(), quota, peak, request.devices.count);
        if !reservation::within_quota(peak, request.devices.count, quota) {
            return Ok(None);
        }
    }
    for &(scalar, total, limit) in scalar_quotas {
        let peak =
            store::scalars::tenant_peak(tx, &r.tenant_id, &pool.id, scalar, start_ms, end_ms, Some(&r.id)).await?;
        if !reservation::within_limit(peak, total, u64::from(limit)) {
            return Ok(None);
        }
    }
    Ok(Some(allocations(plan, request)))
}

fn allocations(plan: Vec<PlannedAllocation>, request: &ReservationRequest) -> Vec<Allocation> {
    plan.into_iter()
        .map(|planned| Allocation {
            allocation_id: bc_domain::id::AllocationId::generate(),
            node_id: planned.node_id,
            devices: planned.devices,
            resources: request.resources.clone(),
        })
        .collect()
}

/// Locks what `plan` chose (the nodes in share mode, the atoms for update, one round trip). Concurrent requests that
/// chose the same atoms find out here: the atoms other commands hold, or booked since this transaction's snapshot, are
/// skipped and the rest of the candidates planned again (spread over the best few fitting nodes), in this
/// transaction, without reading anything twice. A request that keeps losing (or has nothing
/// else left) waits for the holders like any lock. `None` when a chosen node is gone or no longer schedulable.
async fn lock_plan(
    tx: &mut Tx,
    id: &ReservationId,
    request: &DeviceRequest,
    mut candidates: Vec<NodeCandidate>,
    mut plan: Vec<PlannedAllocation>,
    spread: usize,
    races: Option<&LockRaces>,
) -> AppResult<Option<Vec<PlannedAllocation>>> {
    let mut rounds = 1;
    loop {
        let nodes: Vec<&str> = plan.iter().map(|a| a.node_id.as_str()).collect();
        let atoms: Vec<&str> = plan.iter().flat_map(|a| a.devices.iter().map(|d| d.as_str())).collect();
        let how = if rounds < LOCK_ROUNDS { store::AtomLock::SkipHeld } else { store::AtomLock::Wait };
        let locked = match store::lock_chosen(tx, &nodes, &atoms, how).await? {
            store::Chosen::NodeGone => return Ok(None),
            store::Chosen::Locked(locked) => locked,
        };
        if locked.len() == atoms.len() {
            return Ok(Some(plan));
        }
        if how == store::AtomLock::Wait {
            // A waiting lock only comes back short when chosen atoms are gone: as when a chosen node is.
            return Ok(None);
        }
        if let Some(races) = races {
            races.lost();
        }
        let held: Vec<&str> = atoms.iter().copied().filter(|atom| !locked.iter().any(|l| l == atom)).collect();
        for candidate in &mut candidates {
            candidate.free_atoms.retain(|atom| !held.contains(&atom.as_str()));
        }
        rounds += 1;
        // The requests that lost this race chose from the same summary: each draws its next choice from the best few
        // fitting nodes, wider every round (as a retry does), instead of all meeting again on the next best fit.
        match placement::plan_spread(id, request, &candidates, spread.max(spread_for(rounds))) {
            Some(next) => plan = next,
            // What is left cannot hold it: wait for the holders of the last choice instead.
            None => rounds = LOCK_ROUNDS,
        }
    }
}

/// The position of a stream's last event: what a command that appended nothing answers.
async fn stream_head(tx: &mut Tx, stream_id: &str) -> AppResult<Option<Position>> {
    let version = events::stream_version(tx, stream_id).await?;
    if version == 0 {
        return Ok(None);
    }
    let last = events::read_stream(tx, stream_id, version - 1, 1).await?;
    Ok(last.first().map(|event| event.position))
}

impl App {
    /// Reserves GPUs in a pool. A new reservation is `placed` when it fits now, or `pending` until capacity
    /// frees; `CAPACITY_UNAVAILABLE` only when it can never fit the pool, the pool's pending queue is full, or
    /// the request asked not to wait. A retry with the same key and body answers the same reservation.
    pub async fn reserve(&self, caller: &Caller, input: Reserve) -> AppResult<Committed<Reserved>> {
        self.reserve_gated(caller, input, None).await
    }

    /// [`App::reserve`], decided first on the draft by the door when `gate` names the call from outside (in the
    /// same transaction, on the facts the reserve reads anyway). The authorizer's refusal is `FORBIDDEN`: no
    /// reservation decision answers that.
    pub(crate) async fn reserve_gated(
        &self,
        caller: &Caller,
        input: Reserve,
        gate: Option<&Call>,
    ) -> AppResult<Committed<Reserved>> {
        check_idempotency_key(&input.idempotency_key)?;
        if input.request.binding == Binding::Instance {
            return Err(Rejection::invalid(
                "binding",
                "an instance's allocation is reserved by creating the instance (POST /v1/instances)",
            )
            .into());
        }
        let id = ReservationId::derive(&caller.tenant_id, &caller.identity, &input.idempotency_key);
        self.reserve_derived(caller, &id, &input.request, gate, None).await
    }

    /// Reserves as reservation `id` (derived from the request by the caller), recording `instance` in the same
    /// transaction when the reservation is an instance's.
    pub(crate) async fn reserve_derived(
        &self,
        caller: &Caller,
        id: &ReservationId,
        request: &ReservationRequest,
        gate: Option<&Call>,
        instance: Option<&NewInstance>,
    ) -> AppResult<Committed<Reserved>> {
        // Before the first statement: the facts call computes with the window it names.
        request.check_bounds()?;
        let id = id.clone();
        let mut tries = 1;
        let mut lock_first = false;
        loop {
            let placement = if tries <= self.retry.max_attempts {
                Placement::Try { spread: spread_for(tries) }
            } else {
                Placement::Skip
            };
            // Only a first try locks with its COMMIT, and only while no race was lost lately.
            let with_commit = tries == 1 && !lock_first && self.lock_races.lock_with_commit();
            let lock = AtomsLock { with_commit, races: &self.lock_races };
            let attempt = self.reserve_once(caller, &id, request, (placement, lock), gate, instance).await;
            match attempt {
                // The atoms it chose went to another command first: plan again at once, locking first (the lock
                // then skips what others hold and plans around it, as a lost race always did).
                Err(err) if with_commit && store::chosen_taken(&err) => {
                    self.lock_races.lost();
                    lock_first = true;
                }
                Err(err) if err.is_retryable() && tries < self.retry.max_attempts + 3 => {
                    self.retry.pause(tries, &err).await;
                    tries += 1;
                }
                Err(err) => {
                    // The claim an attempt committed outlives its rolled-back transaction: drop it now (a claim left
                    // by a process that died here is swept after a minute; until then it only makes checks stricter).
                    let drop = store::facts::drop_quota_claim_call(&id);
                    if let Err(dropping) = self.db.call(TxOptions::READ_COMMITTED, &drop).await {
                        tracing::warn!(error = %dropping, reservation = %id, "could not drop a quota claim");
                    }
                    return Err(err);
                }
                result => return result,
            }
        }
    }

    /// Records a request the authorizer refused as one `reservation.denied` event: it books and charges nothing,
    /// and the audit trail keeps it. A retry with the same key and body answers the recorded reservation (the
    /// denial, or whatever an earlier allowed request became) without recording anything.
    pub async fn deny_reservation(
        &self,
        caller: &Caller,
        input: Reserve,
        reason: String,
    ) -> AppResult<Committed<Reservation>> {
        check_idempotency_key(&input.idempotency_key)?;
        let id = ReservationId::derive(&caller.tenant_id, &caller.identity, &input.idempotency_key);
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let (id, request, reason) = (&id, &input.request, &reason);
                async move {
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let existing = store::reservation(tx, id).await?;
                    let new = NewRequest {
                        reservation_id: id.clone(),
                        tenant_id: caller.tenant_id.clone(),
                        identity: caller.identity.clone(),
                        request: request.clone(),
                        priority: 0,
                        quota_holder: None,
                        now_ms,
                    };
                    let requested = reservation::request(existing.as_ref(), new)?;
                    if let Some(existing) = existing {
                        let position = stream_head(tx, id.as_str()).await?;
                        return Ok(Committed { value: existing, position });
                    }
                    let Some(ReservationEvent::Requested(r)) = requested.into_iter().next() else {
                        return Err(AppError::Store(bc_eventstore::Error::Internal(
                            "a new request decided no requested event".into(),
                        )));
                    };
                    let denied = ReservationEvent::Denied(reservation::Denied {
                        reservation_id: r.reservation_id,
                        tenant_id: r.tenant_id,
                        identity: r.identity,
                        request: r.request,
                        request_hash: r.request_hash,
                        reason: reason.clone(),
                        at_ms: now_ms,
                    });
                    let state = reservation::evolve(None, &denied).ok_or_else(|| {
                        AppError::Store(bc_eventstore::Error::Internal("a denial folded to nothing".into()))
                    })?;
                    let stream = id.as_str();
                    let position =
                        record(tx, caller, stream, &caller.tenant_id, ExpectedVersion::NO_STREAM, vec![denied]).await?;
                    Ok(Committed { value: state, position })
                }
                .scope_boxed()
            })
            .await
    }

    /// A reservation of the caller's tenant, read from its stream (so a created one is never answered 404).
    pub async fn reservation(&self, caller: &Caller, id: &ReservationId) -> AppResult<Committed<Reservation>> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let found = store::reservation(&mut tx, id).await?;
        let position = stream_head(&mut tx, id.as_str()).await?;
        tx.commit().await?;
        match found {
            Some(r) if r.tenant_id == caller.tenant_id => Ok(Committed { value: r, position }),
            _ => Err(Rejection::NotFound { kind: "reservation", id: id.to_string() }.into()),
        }
    }

    /// Cancels a reservation before its start (`pending`, `placed`, `awaiting-confirmation`).
    pub async fn cancel_reservation(
        &self,
        caller: &Caller,
        id: &ReservationId,
        reason: Option<String>,
    ) -> AppResult<Committed<Reservation>> {
        self.reservation_command(caller, id, None, |now_ms| Command::Cancel { now_ms, reason: reason.clone() }).await
    }

    /// Releases a reservation after its start (`binding`, `active`).
    pub async fn release_reservation(&self, caller: &Caller, id: &ReservationId) -> AppResult<Committed<Reservation>> {
        self.reservation_command(caller, id, None, |now_ms| Command::Release { now_ms, awaiting: Vec::new() }).await
    }

    /// Renews a reservation's allocation lease (`reservations.renew`); after the deadline it is refused.
    pub async fn renew_reservation(&self, caller: &Caller, id: &ReservationId) -> AppResult<Committed<Reservation>> {
        self.reservation_command(caller, id, None, |now_ms| Command::Renew { now_ms }).await
    }

    /// Lengthens a live reservation's window to `end_ms` on the same atoms. Refused with `CONFLICT` when another
    /// booking holds one of its atoms after the current end, and with `QUOTA_EXCEEDED` when the tenant's quota
    /// does not admit the extra time.
    pub async fn extend_reservation(
        &self,
        caller: &Caller,
        id: &ReservationId,
        end_ms: i64,
    ) -> AppResult<Committed<Reservation>> {
        let mut tries = 1;
        loop {
            let attempt = self
                .db
                .transaction(TxOptions::COMMAND, |tx| {
                    async move { extend_once(tx, caller, id, end_ms).await }.scope_boxed()
                })
                .await;
            match attempt {
                // An exclusion violation here is a lasting answer about someone else's booking, not a race.
                Err(AppError::Store(err))
                    if err.sql_state().as_deref() == Some(bc_eventstore::error::EXCLUSION_VIOLATION) =>
                {
                    return Err(Rejection::Conflict(format!(
                        "cannot extend {id}: another reservation holds some of its atoms after the current end"
                    ))
                    .into());
                }
                Err(err) if err.is_retryable() && tries < self.retry.max_attempts => {
                    self.retry.pause(tries, &err).await;
                    tries += 1;
                }
                result => return result,
            }
        }
    }

    /// A command on an existing reservation in three round trips: BEGIN with the facts it decides on
    /// (`reservation_facts`), its events with every inline write they make, and COMMIT with the wakes it queues.
    /// `gate`: the call from outside and its method, which the door decides on the reservation first, on the facts
    /// the command reads anyway.
    pub(crate) async fn reservation_command(
        &self,
        caller: &Caller,
        id: &ReservationId,
        gate: Option<(&Call, &'static str)>,
        command: impl Fn(i64) -> Command + Send + Sync,
    ) -> AppResult<Committed<Reservation>> {
        bc_eventstore::retry(&self.retry, || async {
            let (tx, answer) =
                self.db.begin_with(TxOptions::COMMAND, &store::facts::reservation_facts_call(id)).await?;
            let decided = async {
                let mut facts = store::facts::reservation_facts(id, answer)?;
                if let Some((call, method)) = gate {
                    self.decide(call, method, facts.resource.as_ref(), Subject::Reservation(id)).await?;
                }
                let r = match facts.reservation.take() {
                    Some((r, _)) if r.tenant_id == caller.tenant_id => r,
                    _ => return Err(Rejection::NotFound { kind: "reservation", id: id.to_string() }.into()),
                };
                let agents = match r.request.binding {
                    Binding::Node => super::node_commands::whole_nodes(&r),
                    Binding::Hold | Binding::Instance => facts.agents.clone(),
                };
                let command = super::node_commands::with_agents(command(facts.now_ms), agents);
                let events = reservation::decide(&r, &command)?;
                Ok((r, events, facts))
            }
            .await;
            let (r, events, facts) = match decided {
                Ok(decided) => decided,
                Err(err) => return tx.end(Err(err)).await,
            };
            let known = Known { agents: Some(&facts.agents), draining: Some(&facts.draining), with_commit: true };
            apply_schedule_and_commit(tx, caller, r, events, facts.now_ms, &known).await
        })
        .await
    }

    /// One try of a reserve in three round trips: BEGIN with the facts it decides on (`reserve_facts`: the stream,
    /// the pool, its offers, and for a placement the locks, the candidates and the quota sweep), the lock of the
    /// chosen atoms, and the events with every inline write they make, the wakes it queues and COMMIT. Two when the
    /// lock of the chosen atoms goes with the events (`lock.with_commit`).
    async fn reserve_once(
        &self,
        caller: &Caller,
        id: &ReservationId,
        request: &ReservationRequest,
        (placement, lock): (Placement, AtomsLock<'_>),
        gate: Option<&Call>,
        instance: Option<&NewInstance>,
    ) -> AppResult<Committed<Reserved>> {
        let (place, spread) = match placement {
            // Whole machines, and requests that hold scalar amounts, are placed statement by statement
            // (`try_place`), not from the facts' summary read.
            Placement::Try { spread } => (request.binding != Binding::Node && request.resources.is_empty(), spread),
            Placement::Skip => (false, 0),
        };
        let call = store::facts::reserve_facts_call(id, &caller.tenant_id, request, place, spread)?;
        let claim = store::facts::claim_quota_call(id, &caller.tenant_id, request, place);
        let (mut tx, answer) = self.db.begin_after(TxOptions::COMMAND, &claim, &call).await?;
        let decided = async {
            let answer = store::facts::reserve_facts(&request.pool_id, answer)?;
            if answer.claimed {
                // With the bookings it makes, or with whatever else the command commits.
                tx.defer(&store::facts::drop_quota_claim_call(id));
            }
            if let Some(call) = gate {
                let resource = answer.pool.clone().map(|facts| draft(call, id, request, facts));
                let subject = Subject::Pool(&request.pool_id);
                self.decide(call, "reservations.create", resource.as_ref(), subject).await?;
            }
            let how = Decide { placement, explain: self.explain, diagnoses: &self.diagnosis_budget, lock };
            reserve_decided(&mut tx, caller, id, request, how, answer, instance).await
        }
        .await;
        match decided {
            Ok(Decided::Record { events, state, lock }) => {
                let stream = (id.as_str(), &caller.tenant_id, ExpectedVersion::NO_STREAM);
                let position = record_and_commit(tx, caller, stream, lock.as_ref(), events).await?;
                Ok(Committed { value: Reserved { reservation: *state, created: true, instance: None }, position })
            }
            Ok(Decided::Answered(answered)) => tx.end(Ok(*answered)).await,
            Err(err) => tx.end(Err(err)).await,
        }
    }
}

async fn owned_reservation(tx: &mut Tx, caller: &Caller, id: &ReservationId) -> AppResult<Reservation> {
    match store::reservation(tx, id).await? {
        Some(r) if r.tenant_id == caller.tenant_id => Ok(r),
        _ => Err(Rejection::NotFound { kind: "reservation", id: id.to_string() }.into()),
    }
}

/// Records decided events on a reservation and wakes the pool's pending reservations when they freed capacity.
/// Returns the new state and the position of the last event.
pub(crate) async fn record_reservation(
    tx: &mut Tx,
    caller: &Caller,
    r: Reservation,
    events: Vec<ReservationEvent>,
) -> AppResult<(Reservation, Option<Position>)> {
    record_reservation_known(tx, caller, r, events, &Known::default()).await
}

/// What a command read with its facts, so recording its decision need not read it again, and whether its wakes go
/// with the COMMIT.
#[derive(Debug, Default)]
pub(crate) struct Known<'a> {
    /// The nodes of the reservation's allocations that run an agent.
    pub agents: Option<&'a [NodeId]>,
    /// The nodes of the reservation's allocations that are draining.
    pub draining: Option<&'a [NodeId]>,
    /// Queue the wakes with the COMMIT ([`Tx::defer`]): nothing later in the transaction reads the work queue.
    pub with_commit: bool,
}

impl Known<'_> {
    async fn wake(&self, tx: &mut Tx, key: &WorkKey) -> AppResult<()> {
        if self.with_commit {
            work::wake_with_commit(tx, key);
            Ok(())
        } else {
            work::wake_now(tx, key).await
        }
    }
}

/// [`record_reservation`] with what the caller already knows.
pub(crate) async fn record_reservation_known(
    tx: &mut Tx,
    caller: &Caller,
    r: Reservation,
    events: Vec<ReservationEvent>,
    known: &Known<'_>,
) -> AppResult<(Reservation, Option<Position>)> {
    let frees_capacity = frees_capacity(&events);
    let ended_at_ms = events.iter().find_map(ReservationEvent::ends_bookings_at);
    super::node_commands::follow_hand_overs(tx, caller, &r, &events, known.agents).await?;
    let state = events.iter().fold(Some(r.clone()), reservation::evolve).unwrap_or_else(|| r.clone());
    let mut position =
        record(tx, caller, r.id.as_str(), &r.tenant_id, ExpectedVersion::Exact(r.version), events).await?;
    if let Some(at_ms) = ended_at_ms
        && state.request.binding == Binding::Instance
    {
        // An instance's allocation ended: so did the instance, at the same time.
        position = end_instance_of(tx, caller, &state, at_ms).await?.or(position);
    }
    if frees_capacity {
        wake_for_freed(tx, &state, known).await?;
    }
    Ok((state, position))
}

/// Whether `events` free capacity (end bookings, or move them).
fn frees_capacity(events: &[ReservationEvent]) -> bool {
    events.iter().any(|e| e.ends_bookings_at().is_some() || matches!(e, ReservationEvent::Replaced(_)))
}

/// Wakes what a reservation that freed capacity may unblock: its pool's pending reservations, and, once it ended,
/// the drains of its nodes (a drain completes once its node holds nothing running).
async fn wake_for_freed(tx: &mut Tx, state: &Reservation, known: &Known<'_>) -> AppResult<()> {
    known.wake(tx, &WorkKey::pool_pending(&state.request.pool_id)).await?;
    if state.state.is_terminal() {
        let draining = match known.draining {
            Some(draining) => draining.to_vec(),
            None => {
                let nodes: Vec<&str> = state.allocations.iter().map(|a| a.node_id.as_str()).collect();
                store::draining_nodes(tx, &nodes).await?
            }
        };
        for node in draining {
            known.wake(tx, &WorkKey::NodeReplace(node)).await?;
        }
    }
    Ok(())
}

/// [`apply_and_schedule_known`], ending `tx`. When nothing after the events reads the transaction (what the
/// reservation's events wake, and its next look, go with the COMMIT; no instance ends with it), the append, its
/// inline writes, those wakes and COMMIT travel in one message ([`record_and_commit`]).
pub(crate) async fn apply_schedule_and_commit(
    mut tx: Tx,
    caller: &Caller,
    r: Reservation,
    events: Vec<ReservationEvent>,
    now_ms: i64,
    known: &Known<'_>,
) -> AppResult<Committed<Reservation>> {
    let ends_instance = r.request.binding == Binding::Instance && events.iter().any(|e| e.ends_bookings_at().is_some());
    if !known.with_commit || known.draining.is_none() || ends_instance {
        let done = apply_and_schedule_known(&mut tx, caller, r, events, now_ms, known).await;
        return tx.end(done).await;
    }
    let queued = async {
        super::node_commands::follow_hand_overs(&mut tx, caller, &r, &events, known.agents).await?;
        let state = events.iter().fold(Some(r.clone()), reservation::evolve).unwrap_or_else(|| r.clone());
        if frees_capacity(&events) {
            wake_for_freed(&mut tx, &state, known).await?;
        }
        let key = WorkKey::Reservation(state.id.clone());
        work::schedule_with_commit(&mut tx, &key, reservation::next_look(&state, now_ms));
        Ok(state)
    }
    .await;
    let state = match queued {
        Ok(state) => state,
        Err(err) => return tx.end(Err(err)).await,
    };
    let stream = (r.id.as_str(), &r.tenant_id, ExpectedVersion::Exact(r.version));
    let position = record_and_commit(tx, caller, stream, None, events).await?;
    Ok(Committed { value: state, position })
}

/// Records decided events on a reservation (see [`record_reservation`]) and schedules its next look.
pub(crate) async fn apply_and_schedule(
    tx: &mut Tx,
    caller: &Caller,
    r: Reservation,
    events: Vec<ReservationEvent>,
    now_ms: i64,
) -> AppResult<Committed<Reservation>> {
    apply_and_schedule_known(tx, caller, r, events, now_ms, &Known::default()).await
}

/// [`apply_and_schedule`] with what the caller already knows.
pub(crate) async fn apply_and_schedule_known(
    tx: &mut Tx,
    caller: &Caller,
    r: Reservation,
    events: Vec<ReservationEvent>,
    now_ms: i64,
    known: &Known<'_>,
) -> AppResult<Committed<Reservation>> {
    let (state, position) = record_reservation_known(tx, caller, r, events, known).await?;
    let key = WorkKey::Reservation(state.id.clone());
    let next = reservation::next_look(&state, now_ms);
    if known.with_commit {
        work::schedule_with_commit(tx, &key, next);
    } else {
        work::schedule(tx, &key, next).await?;
    }
    Ok(Committed { value: state, position })
}

/// The events that place `r` on `allocations` at `now_ms`, explained by `trace` when the explanation is kept.
pub(crate) fn place_events(
    r: &Reservation,
    allocations: Vec<Allocation>,
    now_ms: i64,
    trace: Option<Trace>,
) -> AppResult<Vec<ReservationEvent>> {
    let window = reservation::placed_window(&r.request, now_ms);
    let explained = trace.map(|trace| trace.placed(window, &allocations));
    let mut events = reservation::decide(r, &Command::Place { allocations, now_ms })?;
    if let Some(explained) = explained {
        reservation::explain(&mut events, explained);
    }
    Ok(events)
}

/// The request `caller` makes as reservation `id` at `now_ms`, with the priority and quota holder its admission
/// gives it.
pub(crate) fn new_request<'a>(
    caller: &'a Caller,
    id: &'a ReservationId,
    request: &'a ReservationRequest,
    now_ms: i64,
) -> impl Fn(i32, Option<TenantId>) -> NewRequest + 'a {
    move |priority, quota_holder| NewRequest {
        reservation_id: id.clone(),
        tenant_id: caller.tenant_id.clone(),
        identity: caller.identity.clone(),
        request: request.clone(),
        priority,
        quota_holder,
        now_ms,
    }
}

/// What admission decides a new request on: the pool, its offers and the caller.
pub(crate) fn admission<'a>(
    pool: &'a PoolRow,
    offers: &'a [PoolOffered],
    caller: &'a Caller,
    project_in_tenant: bool,
) -> AdmissionFacts<'a> {
    AdmissionFacts {
        pool_id: &pool.id,
        pool_owner: &pool.owner_tenant_id,
        sharing: pool.sharing,
        tenant_root: pool.policy.tenant_root,
        gpu_model: &pool.gpu_model,
        offers,
        tenant: &caller.tenant_id,
        ancestors: &caller.ancestors,
        project_in_tenant,
    }
}

/// How a reserve attempt decides: whether it may place, whether it records why, and the callers' budget of
/// refusals explained node by node.
#[derive(Debug, Clone, Copy)]
struct Decide<'a> {
    placement: Placement,
    explain: bool,
    diagnoses: &'a crate::auth::IdentityBudget,
    /// Where a placement from the facts locks its atoms.
    lock: AtomsLock<'a>,
}

/// A reserve's decision on the facts `reserve_facts` answered, in the transaction that read them.
async fn reserve_decided(
    tx: &mut Tx,
    caller: &Caller,
    id: &ReservationId,
    request: &ReservationRequest,
    Decide { placement, explain, diagnoses, lock }: Decide<'_>,
    answer: ReserveAnswer,
    with_instance: Option<&NewInstance>,
) -> AppResult<Decided> {
    // An instance's reservation records the instance after its events, so its lock cannot wait for the COMMIT.
    let lock = AtomsLock { with_commit: lock.with_commit && with_instance.is_none(), ..lock };
    let ReserveAnswer { now_ms, facts, .. } = answer;
    let new = new_request(caller, id, request, now_ms);
    let facts = match facts {
        ReserveFacts::Existing(existing, position) => {
            reservation::request(Some(&existing), new(0, None))?;
            let instance = match with_instance {
                // A retry: the same instance, or the key reused for another body.
                Some(new) => {
                    let found = store::instance_aggregate(tx, &new.instance_id).await?.map(|(i, _)| i);
                    let Some(found) = found else {
                        return Err(store::corrupt("an instance's reservation", "it has no instance"));
                    };
                    instance::create(Some(&found), NewInstance { now_ms, ..new.clone() })?;
                    Some(found)
                }
                None => None,
            };
            let existing = Reserved { reservation: *existing, created: false, instance };
            return Ok(Decided::Answered(Box::new(Committed { value: existing, position })));
        }
        ReserveFacts::NoPool => {
            return Err(Rejection::NotFound { kind: "pool", id: request.pool_id.to_string() }.into());
        }
        ReserveFacts::New(facts) => *facts,
    };
    let pool = &facts.pool;
    let admission = admission(pool, &facts.offers, caller, facts.project_in_tenant);
    let window = reservation::placed_window(request, now_ms);
    let admitted = reservation::admit(request, &admission).map_err(|rejection| match rejection {
        // The pool's rules refused it before any placement: its explanation is the rule.
        Rejection::QuotaExceeded(_) | Rejection::CapacityUnavailable(_) if explain => {
            let rule = Some(rejection.to_string());
            let explanation = Box::new(Explanation::not_placed(
                Decision::Refused,
                window,
                Vec::new(),
                None,
                Default::default(),
                rule,
            ));
            AppError::Explained(Box::new(explain::Explained { rejection, explanation }))
        }
        rejection => rejection.into(),
    })?;
    if let Some(profile_id) = &request.profile_id {
        // The profile its machines will be deployed with: a live metal profile of the caller's tenant.
        crate::profiles::deploy_steps(tx, profile_id, &caller.tenant_id, bc_domain::workflow::WorkflowKind::Deploy)
            .await?;
    }
    let mut events = reservation::request(None, new(admitted.priority, admitted.quota_holder))?;
    let mut state = reservation::fold(&events)
        .ok_or_else(|| AppError::Store(bc_eventstore::Error::Internal("no state after a request".into())))?;
    let mut waiting = None;
    let mut trace = Trace::default();
    let start_ms = window.0;
    let mut lock_with_commit = None;
    let placed = match (placement, facts.placing) {
        (Placement::Skip, _) => None,
        (Placement::Try { spread }, Some(placing)) if placing.start_ms == start_ms => {
            waiting = placing.waiting;
            let offers = &facts.offers;
            let placed = place_from_facts(tx, &state, pool, offers, placing, (spread, lock), &mut trace).await?;
            placed.map(|(allocations, with_commit)| {
                lock_with_commit = with_commit;
                allocations
            })
        }
        // The facts call read nothing for placing (it always does for a valid request): place statement by statement.
        (Placement::Try { spread }, _) => {
            let known = (pool.owner_tenant_id != caller.tenant_id).then_some(facts.offers.as_slice());
            try_place(tx, &state, pool, now_ms, spread, known, &mut trace).await?
        }
    };
    match placed {
        Some(allocations) => {
            let more = place_events(&state, allocations, now_ms, explain.then_some(trace))?;
            for event in &more {
                state = reservation::evolve(Some(state), event).unwrap_or_else(|| unreachable!("evolve keeps a state"));
            }
            events.extend(more);
        }
        None => {
            // Whether it could ever fit is only worth asking when it does not fit now.
            let (holders, pending) = match waiting {
                Some(known) => known,
                None => (
                    match request.binding {
                        Binding::Node => store::whole_nodes::holders(tx, &pool.id, &request.devices).await?,
                        Binding::Hold | Binding::Instance if request.resources.is_empty() => {
                            store::nodes_that_could_hold(tx, &pool.id, &request.devices).await?
                        }
                        // The nodes that lend the amounts, and of those the ones with the atoms.
                        Binding::Hold | Binding::Instance => {
                            let ratios = &pool.policy.overcommit;
                            let lenders =
                                store::scalars::nodes_that_could_hold(tx, &pool.id, &request.resources, ratios).await?;
                            store::scalars::atom_holders_among(tx, &pool.id, &request.devices, &lenders).await?
                        }
                    },
                    store::pending_count(tx, &pool.id).await?,
                ),
            };
            // A provider pool borrows what it lacks: a request may wait for a machine to be acquired for it.
            let borrows = store::provider_machines::is_provider_pool(tx, &pool.id).await?;
            let holders = if borrows { holders.max(i64::from(request.devices.nodes())) } else { holders };
            let waiting = Waiting { pool_id: &pool.id, holders, pending, max_pending: pool.policy.max_pending };
            let may_wait = reservation::may_wait(request, &waiting);
            if explain {
                let quota_limit =
                    quota_limit(tx, pool, state.quota_holder.as_ref(), request.resource(), Some(&facts.offers));
                let (decision, policy) = match &may_wait {
                    Ok(()) if placement == Placement::Skip => (
                        Decision::Pending,
                        Some("concurrent requests took the fitting atoms first on every try; it is placed as capacity frees".to_owned()),
                    ),
                    Ok(()) => (Decision::Pending, None),
                    Err(rejection) => (Decision::Refused, policy_refusal(request, &waiting, rejection)),
                };
                // A refusal writes nothing, so only a budget keeps a caller from reading the whole pool at will.
                let nodes_unread =
                    (may_wait.is_err() && !diagnoses.take(&caller.tenant_id, &caller.identity)).then(|| {
                        format!(
                            "they are read for at most {} refusals of one identity a minute, and {} has had them",
                            diagnoses.limit(),
                            caller.identity
                        )
                    });
                let what = explain::NotPlaced {
                    reservation: id,
                    tenant: &caller.tenant_id,
                    pool_id: &pool.id,
                    request,
                    window,
                    quota_limit: quota_limit.await?,
                    decision,
                    policy,
                    nodes_unread,
                };
                let explained = explain::not_placed(tx, trace, what).await?;
                match may_wait {
                    Ok(()) => reservation::explain(&mut events, explained),
                    Err(rejection) => {
                        let explanation = Box::new(explained);
                        return Err(AppError::Explained(Box::new(explain::Explained { rejection, explanation })));
                    }
                }
            } else {
                may_wait?;
            }
            if borrows {
                work::wake_with_commit(tx, &WorkKey::PoolProvider(pool.id.clone()));
            }
        }
    }
    work::schedule_with_commit(tx, &WorkKey::Reservation(id.clone()), reservation::next_look(&state, now_ms));
    let Some(new) = with_instance else {
        return Ok(Decided::Record { events, state: Box::new(state), lock: lock_with_commit });
    };
    // An instance's reservation: its events, then the instance's, each appended in the transaction.
    record(tx, caller, id.as_str(), &caller.tenant_id, ExpectedVersion::NO_STREAM, events).await?;
    let events = instance::create(None, NewInstance { now_ms, ..new.clone() })?;
    let instance = events.iter().fold(None, instance::evolve_instance);
    let stream = new.instance_id.as_str();
    let position = record(tx, caller, stream, &caller.tenant_id, ExpectedVersion::NO_STREAM, events).await?;
    let value = Reserved { reservation: state, created: true, instance };
    Ok(Decided::Answered(Box::new(Committed { value, position })))
}

/// What a reserve decided in its transaction: an answer already (a retry found its reservation, or an instance's
/// reservation was recorded with its instance), or the new reservation's events, recorded as the transaction's last
/// writes with its COMMIT.
enum Decided {
    Answered(Box<Committed<Reserved>>),
    /// `lock`: the lock of the chosen atoms, when it goes with the events (`lock_chosen_or_refuse`).
    Record {
        events: Vec<ReservationEvent>,
        state: Box<Reservation>,
        lock: Option<sql::Call>,
    },
}

/// The pool rule a refusal to wait comes from, in words; `None` when the request can never fit (then the nodes'
/// reasons explain it).
fn policy_refusal(request: &ReservationRequest, waiting: &Waiting<'_>, rejection: &Rejection) -> Option<String> {
    if waiting.holders < i64::from(request.devices.nodes()) {
        return None;
    }
    Some(if !request.wait {
        "the request asked not to wait (wait: false)".to_owned()
    } else if waiting.pending >= i64::from(waiting.max_pending) {
        format!(
            "the pool's pending queue is full: {} waiting, policy.maxPending {}",
            waiting.pending, waiting.max_pending
        )
    } else {
        rejection.to_string()
    })
}

/// Places a new reservation from what `reserve_facts` read and locked: plans on its candidates (the exact query
/// when the summary's cannot hold it), locks the choice, and checks the quota against the peak it read.
async fn place_from_facts(
    tx: &mut Tx,
    r: &Reservation,
    pool: &PoolRow,
    offers: &[PoolOffered],
    placing: Placing,
    (spread, lock): (usize, AtomsLock<'_>),
    trace: &mut Trace,
) -> AppResult<Option<(Vec<Allocation>, Option<sql::Call>)>> {
    let request = &r.request;
    let resource = request.resource();
    let quota = quota_limit(tx, pool, r.quota_holder.as_ref(), resource, Some(offers)).await?;
    let mut candidates = placing.candidates;
    let mut plan = placement::plan_spread(&r.id, &request.devices, &candidates, spread);
    trace.look(if placing.exact { Tier::Exact } else { Tier::Summary }, &candidates, plan.is_some());
    if plan.is_none() && !placing.exact {
        candidates =
            store::candidates(tx, &pool.id, &request.devices, (placing.start_ms, placing.end_ms), spread).await?;
        plan = placement::plan_spread(&r.id, &request.devices, &candidates, spread);
        trace.look(Tier::Exact, &candidates, plan.is_some());
    }
    let Some(plan) = plan else { return Ok(None) };
    // With no race lost lately, and the quota's peak already read, nothing more is read before the events: the lock
    // of the chosen atoms goes with them and the COMMIT.
    if lock.with_commit && (quota.is_none() || placing.peak.is_some()) {
        if let (Some(quota), Some(peak)) = (quota, placing.peak) {
            trace.quota(resource, quota, peak, request.devices.count);
            if !reservation::within_quota(peak, request.devices.count, quota) {
                return Ok(None);
            }
        }
        let nodes: Vec<&str> = plan.iter().map(|a| a.node_id.as_str()).collect();
        let atoms: Vec<&str> = plan.iter().flat_map(|a| a.devices.iter().map(|d| d.as_str())).collect();
        let with_commit = store::lock_chosen_with_commit_call(&nodes, &atoms);
        return Ok(Some((allocations(plan, request), Some(with_commit))));
    }
    let Some(plan) = lock_plan(tx, &r.id, &request.devices, candidates, plan, spread, Some(lock.races)).await? else {
        return Ok(None);
    };
    if let Some(quota) = quota {
        let peak = match placing.peak {
            Some(peak) => peak,
            None => {
                store::lock_quota(tx, &r.tenant_id, &pool.id, resource).await?;
                store::peak_usage(tx, &r.tenant_id, &pool.id, resource, placing.start_ms, placing.end_ms).await?
            }
        };
        trace.quota(resource, quota, peak, request.devices.count);
        if !reservation::within_quota(peak, request.devices.count, quota) {
            return Ok(None);
        }
    }
    Ok(Some((allocations(plan, request), None)))
}

/// Where a placement from the facts locks its chosen atoms: in a round trip of its own before the events (and how
/// the races it loses there are counted), or with the events and COMMIT.
#[derive(Debug, Clone, Copy)]
struct AtomsLock<'a> {
    with_commit: bool,
    races: &'a LockRaces,
}

async fn extend_once(
    tx: &mut Tx,
    caller: &Caller,
    id: &ReservationId,
    end_ms: i64,
) -> AppResult<Committed<Reservation>> {
    let now_ms = clock::compute_now_ms(tx).await?;
    let r = owned_reservation(tx, caller, id).await?;
    let events = reservation::decide(&r, &Command::Extend { end_ms, now_ms })?;
    let pool = store::pool(tx, &r.request.pool_id)
        .await?
        .ok_or_else(|| Rejection::NotFound { kind: "pool", id: r.request.pool_id.to_string() })?;
    let resource = r.request.resource();
    let Some(current_end) = r.end_ms else { return apply_and_schedule(tx, caller, r, events, now_ms).await };
    let Quotas { atoms: quota, scalars } = lock_quotas(tx, &r, &pool, None).await?;
    let scalar_quotas: Vec<(String, u32)> =
        scalars.into_iter().map(|(scalar, _, limit)| (scalar.to_owned(), limit)).collect();
    if let Some(quota) = quota {
        let peak = store::peak_usage(tx, &r.tenant_id, &pool.id, resource, current_end, end_ms).await?;
        if !reservation::within_quota(peak, r.request.devices.count, quota) {
            return Err(quota_refusal(end_ms, quota, resource, &pool.id));
        }
    }
    let scalars = r.request.resources.clone();
    let nodes: Vec<String> = r.allocations.iter().map(|a| a.node_id.to_string()).collect();
    let tenant = r.tenant_id.clone();
    // The atoms' longer bookings first (the exclusion constraint refuses them onto another's time), then what the
    // extended window holds of each scalar, on its nodes and for the tenant, with the nodes' rows locked last.
    let committed = apply_and_schedule(tx, caller, r, events, now_ms).await?;
    if !scalars.is_empty() {
        let resources: Vec<&str> = scalars.keys().map(String::as_str).collect();
        let mut nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
        nodes.sort_unstable();
        store::scalars::lock_nodes(tx, &nodes, &resources).await?;
        let held = store::scalars::node_peaks(tx, &nodes, &resources, current_end, end_ms, None).await?;
        let over = held
            .iter()
            .find(|h| !reservation::within_limit(h.peak, 0, pool.policy.allocatable(&h.resource, h.capacity)));
        if let Some(over) = over {
            return Err(Rejection::CapacityUnavailable(format!(
                "extending to {end_ms} would hold more {} on node {} than it lends",
                over.resource, over.node_id
            ))
            .into());
        }
        for (scalar, limit) in &scalar_quotas {
            let peak = store::scalars::tenant_peak(tx, &tenant, &pool.id, scalar, current_end, end_ms, None).await?;
            if !reservation::within_limit(peak, 0, u64::from(*limit)) {
                return Err(quota_refusal(end_ms, *limit, scalar, &pool.id));
            }
        }
    }
    Ok(committed)
}

fn quota_refusal(end_ms: i64, quota: u32, resource: &str, pool_id: &bc_domain::id::PoolId) -> AppError {
    Rejection::QuotaExceeded(format!(
        "extending to {end_ms} would hold more than the quota of {quota} {resource} in pool {pool_id}"
    ))
    .into()
}

/// Ends a reservation still active on a node drained or deleted with force (`expired`, `preempted`), in the
/// caller's transaction.
pub(crate) async fn preempt(tx: &mut Tx, caller: &Caller, id: &ReservationId) -> AppResult<()> {
    let now_ms = clock::compute_now_ms(tx).await?;
    let Some(r) = store::reservation(tx, id).await? else { return Ok(()) };
    if r.state != reservation::ReservationState::Active {
        return Ok(());
    }
    let events = reservation::decide(&r, &Command::Expire { cause: ExpiryCause::Preempted, now_ms })?;
    apply_and_schedule(tx, caller, r, events, now_ms).await?;
    Ok(())
}

/// The end of an instance's allocation (its reservation's event `ended`): the instance ends, `failed` when the
/// allocation failed. Called where a reservation's ending events are recorded.
async fn end_instance_of(tx: &mut Tx, caller: &Caller, r: &Reservation, at_ms: i64) -> AppResult<Option<Position>> {
    let Some(id) = store::instances::of_reservation(tx, &r.id).await? else {
        // The reservation's own transaction records its instance after it: nothing to end yet.
        return Ok(None);
    };
    let Some((i, version)) = store::instance_aggregate(tx, &id).await? else { return Ok(None) };
    let reason = format!("its allocation ended: reservation {} is {}", r.id, r.state.as_str());
    let failed = r.state == reservation::ReservationState::Failed;
    let events = instance::end(&i, failed, reason, at_ms);
    record(tx, caller, id.as_str(), &i.created.tenant_id, ExpectedVersion::Exact(version), events).await
}
