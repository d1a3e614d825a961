//! Quotes: the exact devices and window a request would get now, and booking exactly those later.
//!
//! A quote is placement's own answer (the earliest start at which the request fits, the atoms best fit would
//! choose, within the caller's quota at every instant of the window), handed out as a token signed with the
//! bundle's quote key (`bc_pki::quote`): nothing is stored, so asking writes nothing and the token alone says
//! what was quoted, to whom, for which request, until when. Booking it (`reservations.create` with the token) runs
//! in one transaction: the quoted atoms are locked, then checked still free over the window on nodes still
//! schedulable, with the quota still admitting them; otherwise `QUOTE_STALE` names what changed and nothing is
//! written. A quoted booking never waits in `pending`.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bc_domain::Rejection;
use bc_domain::id::{AllocationId, DeviceId, Identity, NodeId, PoolId, ReservationId, TenantId};
use bc_domain::pool::PoolOffered;
use bc_domain::reservation::explanation::{Tier, TierLook};
use bc_domain::reservation::{self, Allocation, Binding, MAX_AHEAD_MS, Reservation, ReservationRequest, placed_start};
use bc_eventstore::events::ExpectedVersion;
use bc_eventstore::{Retryable as _, Tx, TxOptions, clock};
use bc_pki::quote::QuoteKey;
use serde::{Deserialize, Serialize};

use crate::availability::{Ask, MAX_CANDIDATE_STARTS, round_up_to_second};
use crate::explain::Trace;
use crate::gate::{Call, Subject, draft};
use crate::reservations::{Reserve, Reserved, admission, check_idempotency_key, new_request, place_events};
use crate::store::facts::{self, ReserveAnswer, ReserveFacts};
use crate::store::{self, AtomLock, Chosen, PoolRow};
use crate::work::{self, WorkKey};
use crate::{App, AppError, AppResult, Caller, Committed, record};

/// How long a quote can be booked: long enough to decide, short enough that what it promises is still likely.
pub const QUOTE_LIFETIME_MS: i64 = 5 * 60 * 1000;

/// What every token starts with: the format's version.
const PREFIX: &str = "bcq1.";

/// The longest token read: a quote of the largest request (4096 atoms) fits well within it.
const MAX_TOKEN: usize = 60 * 1024;

/// `pools.quote`: the request to quote, as a reservation would make it, and how early it may start.
#[derive(Debug, Clone)]
pub struct AskQuote {
    /// The reservation request. With `start_ms`, only that start is quoted; without it, the earliest.
    pub request: ReservationRequest,
    /// Not before this time (epoch milliseconds); now when absent.
    pub not_before_ms: Option<i64>,
}

/// One node's share of a quote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QuotedAllocation {
    pub node_id: NodeId,
    /// Its atoms, in device id order.
    pub devices: Vec<DeviceId>,
}

/// A quote: the window, the devices, the request that books them and the token to send with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quote {
    pub pool_id: PoolId,
    pub start_ms: i64,
    pub end_ms: i64,
    pub allocations: Vec<QuotedAllocation>,
    /// The request to book it with: the asked one with the quoted start (none when the window starts when booked)
    /// and `wait: false`. The token holds its hash, so it must be sent unchanged.
    pub request: ReservationRequest,
    pub token: String,
    pub expires_at_ms: i64,
}

/// What a token says, under its signature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QuoteClaims {
    pub tenant_id: TenantId,
    pub identity: Identity,
    pub pool_id: PoolId,
    /// [`ReservationRequest::hash`] of the request that books it.
    pub request_hash: String,
    pub start_ms: i64,
    pub end_ms: i64,
    pub allocations: Vec<QuotedAllocation>,
    pub expires_at_ms: i64,
}

/// `reservations.create` with a quote: book exactly the quoted devices.
#[derive(Debug, Clone)]
pub struct BookQuote {
    /// The `Idempotency-Key`, as for any reserve: a retry with the same key and body answers the same reservation.
    pub idempotency_key: String,
    /// The quote's request, unchanged.
    pub request: ReservationRequest,
    /// The token the quote answered.
    pub quote: String,
}

/// A refusal naming the token: nothing was written.
fn bad_quote(why: impl std::fmt::Display) -> AppError {
    Rejection::invalid("quote", format!("{why}; ask for a new quote")).into()
}

/// A booking refused because the quote no longer holds: nothing was written.
fn stale(what: impl std::fmt::Display) -> AppError {
    Rejection::QuoteStale(format!("the quote no longer holds: {what}; nothing was booked, ask for a new quote")).into()
}

/// The token of `claims`: `bcq1.<claims>.<tag>`, both parts base64url, the tag over everything before it.
fn sign(key: &QuoteKey, claims: &QuoteClaims) -> AppResult<String> {
    let json = serde_json::to_vec(claims).map_err(|err| store::corrupt("a quote's claims", err))?;
    let signed = format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(json));
    let tag = URL_SAFE_NO_PAD.encode(key.sign(signed.as_bytes()));
    Ok(format!("{signed}.{tag}"))
}

/// The claims of a token this service signed; `INVALID_ARGUMENT` naming `quote` for anything else.
fn open(key: &QuoteKey, token: &str) -> AppResult<QuoteClaims> {
    if token.len() > MAX_TOKEN {
        return Err(bad_quote("the quote token is longer than any this service signs"));
    }
    let malformed = || bad_quote("the quote token is malformed");
    let (signed, tag) = token.rsplit_once('.').ok_or_else(malformed)?;
    let payload = signed.strip_prefix(PREFIX).ok_or_else(malformed)?;
    let tag = URL_SAFE_NO_PAD.decode(tag).map_err(|_| malformed())?;
    if !key.verify(signed.as_bytes(), &tag) {
        return Err(bad_quote("the quote token is not one this service signed (forged or altered)"));
    }
    let json = URL_SAFE_NO_PAD.decode(payload).map_err(|_| malformed())?;
    serde_json::from_slice(&json).map_err(|_| malformed())
}

impl QuoteClaims {
    /// Whether the token is `caller`'s, for this very request: refused naming `quote` otherwise.
    fn check_for(&self, caller: &Caller, request: &ReservationRequest) -> AppResult<()> {
        if self.tenant_id != caller.tenant_id || self.identity != caller.identity {
            return Err(bad_quote("the quote was given to another caller: only the caller it quoted may book it"));
        }
        if self.pool_id != request.pool_id || self.request_hash != request.hash() {
            return Err(bad_quote(
                "the quote was made for another request: send the request it answered (its `reserve` body) unchanged",
            ));
        }
        Ok(())
    }
}

/// Only atoms held on nodes (`binding: hold`), without scalar amounts, are quoted for now.
fn check_quotable(request: &ReservationRequest) -> AppResult<()> {
    if request.binding != Binding::Hold {
        return Err(Rejection::invalid("binding", "quotes are given for held devices only (binding hold)").into());
    }
    if !request.resources.is_empty() {
        return Err(Rejection::invalid("resources", "quotes are not given for scalar amounts yet").into());
    }
    Ok(())
}

/// The quota that limits the reservation's holder in the pool (`None` for the pool's owner).
fn quota_of(offers: &[PoolOffered], holder: Option<&TenantId>, resource: &str) -> Option<u32> {
    let holder = holder?;
    let offer = offers.iter().find(|offer| &offer.tenant_id == holder);
    Some(offer.map_or(0, |offer| reservation::quota_of(offer, resource)))
}

impl App {
    /// The key quotes are signed with: the bundle's, or without a bundle this process's own (then only this
    /// process can book what it quoted).
    fn quote_key(&self) -> QuoteKey {
        QuoteKey::from_sealer(self.pki.as_ref().map_or(&self.process_sealer, |bundle| bundle.sealer()))
    }

    /// Quotes as `call`: decided as `pools.quote` on the pool, then as `reservations.create` on the draft of the
    /// reservation it quotes, so a quote is only given for what the caller could book (the attribute limits
    /// included).
    pub async fn quote_as(&self, call: &Call, ask: &AskQuote) -> AppResult<Quote> {
        let caller = self.authorize(call, "pools.quote", Subject::Pool(&ask.request.pool_id)).await?;
        self.quote_gated(&caller, ask, Some(call)).await
    }

    /// The quote of `ask` for `caller`: the earliest start at which the request fits the pool within the
    /// caller's quota (at every instant of its window), the atoms placement chooses then, and the token that books
    /// them. Reads only. `CAPACITY_UNAVAILABLE` when it fits nowhere within 366 days (or not at the start asked),
    /// `QUOTA_EXCEEDED` when the quota can never admit it.
    pub async fn quote(&self, caller: &Caller, ask: &AskQuote) -> AppResult<Quote> {
        self.quote_gated(caller, ask, None).await
    }

    async fn quote_gated(&self, caller: &Caller, ask: &AskQuote, gate: Option<&Call>) -> AppResult<Quote> {
        let request = &ask.request;
        check_quotable(request)?;
        request.check_bounds()?;
        bc_domain::instant::check_opt_epoch_ms("notBefore", ask.not_before_ms)?;
        if request.start_ms.is_some() && ask.not_before_ms.is_some() {
            return Err(Rejection::invalid("notBefore", "give start (exactly then) or notBefore, not both").into());
        }
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let quoted = async {
            let now_ms = clock::compute_now_ms(&mut tx).await?;
            request.check(now_ms)?;
            if ask.not_before_ms.is_some_and(|at| at > now_ms + MAX_AHEAD_MS) {
                return Err(Rejection::invalid("notBefore", "is more than 366 days ahead").into());
            }
            let probe = ReservationId::derive(&caller.tenant_id, &caller.identity, "quote");
            if let Some(call) = gate {
                let facts = crate::auth::resolve::pool(&mut tx, &request.pool_id).await?;
                let resource = facts.map(|facts| draft(call, &probe, request, facts));
                self.decide(call, "reservations.create", resource.as_ref(), Subject::Pool(&request.pool_id)).await?;
            }
            let not_found = || Rejection::NotFound { kind: "pool", id: request.pool_id.to_string() };
            let pool = store::pool(&mut tx, &request.pool_id).await?.ok_or_else(not_found)?;
            let offers = match pool.owner_tenant_id == caller.tenant_id {
                true => Vec::new(),
                false => store::offers(&mut tx, &pool.id).await?,
            };
            let project_in_tenant = match &request.project_id {
                Some(project) => store::quotes::project_in_tenant(&mut tx, project, &caller.tenant_id).await?,
                None => true,
            };
            let admitted = reservation::admit(request, &admission(&pool, &offers, caller, project_in_tenant))?;
            let quota = quota_of(&offers, admitted.quota_holder.as_ref(), request.resource());
            let duration_ms = request.duration_s as i64 * 1000;
            let devices = &request.devices;
            let ask_at = Ask { tenant: &caller.tenant_id, pool: &pool, devices, quota, duration_ms, probe: &probe };
            let first = round_up_to_second(ask.not_before_ms.unwrap_or(now_ms).max(now_ms));
            let found = match request.start_ms {
                Some(start) => ask_at.plan_at(&mut tx, start).await?.map(|plan| (start, plan)),
                None => ask_at.earliest(&mut tx, first, now_ms + MAX_AHEAD_MS).await?,
            };
            let Some((start_ms, plan)) = found else {
                let holders = store::nodes_that_could_hold(&mut tx, &pool.id, devices).await?;
                return Err(nowhere(request, &pool, holders).into());
            };
            // A window that starts now starts when it is booked; a later one starts exactly where it was quoted.
            let starts_when_booked = request.start_ms.is_none() && start_ms == round_up_to_second(now_ms);
            let booking = ReservationRequest {
                start_ms: (!starts_when_booked).then_some(start_ms),
                deadline_ms: None,
                wait: false,
                ..request.clone()
            };
            let allocations: Vec<QuotedAllocation> = plan
                .into_iter()
                .map(|planned| QuotedAllocation { node_id: planned.node_id, devices: planned.devices })
                .collect();
            let claims = QuoteClaims {
                tenant_id: caller.tenant_id.clone(),
                identity: caller.identity.clone(),
                pool_id: pool.id.clone(),
                request_hash: booking.hash(),
                start_ms,
                end_ms: start_ms + duration_ms,
                allocations,
                expires_at_ms: now_ms + QUOTE_LIFETIME_MS,
            };
            Ok::<_, AppError>((booking, claims))
        }
        .await;
        let (booking, claims) = tx.end(quoted).await?;
        Ok(Quote {
            token: sign(&self.quote_key(), &claims)?,
            pool_id: claims.pool_id,
            start_ms: claims.start_ms,
            end_ms: claims.end_ms,
            allocations: claims.allocations,
            request: booking,
            expires_at_ms: claims.expires_at_ms,
        })
    }

    /// Books a quote as `call`: decided as `reservations.create` on the draft, in the booking's transaction; a
    /// refusal is recorded as `denied` as any reserve's is.
    pub async fn book_quote_as(&self, call: &Call, input: BookQuote) -> AppResult<Committed<Reserved>> {
        match self.book_quote_gated(&call.caller(), &input, Some(call)).await {
            Err(AppError::Rejected(Rejection::Forbidden(reason))) => {
                let reserve = Reserve { idempotency_key: input.idempotency_key, request: input.request };
                Err(self.refused_reserve(call, reserve, reason).await)
            }
            other => other,
        }
    }

    /// Books exactly the quoted devices for `caller`, in one transaction, if they are still free over the window on
    /// nodes still schedulable and the quota still admits them; otherwise `QUOTE_STALE` naming what changed, and
    /// nothing is written. A bad token (forged, altered, expired, another caller's or another request's) is
    /// `INVALID_ARGUMENT` naming `quote`. A retry with the same key and body answers the same reservation.
    pub async fn book_quote(&self, caller: &Caller, input: BookQuote) -> AppResult<Committed<Reserved>> {
        self.book_quote_gated(caller, &input, None).await
    }

    async fn book_quote_gated(
        &self,
        caller: &Caller,
        input: &BookQuote,
        gate: Option<&Call>,
    ) -> AppResult<Committed<Reserved>> {
        check_idempotency_key(&input.idempotency_key)?;
        let claims = open(&self.quote_key(), &input.quote)?;
        claims.check_for(caller, &input.request)?;
        let id = ReservationId::derive(&caller.tenant_id, &caller.identity, &input.idempotency_key);
        let mut tries = 1;
        loop {
            match self.book_once(caller, &id, &input.request, &claims, gate).await {
                Err(err) if err.is_retryable() && tries < self.retry.max_attempts => {
                    // A booking that raced this one: the next try's snapshot sees it and names it.
                    self.retry.pause(tries, &err).await;
                    tries += 1;
                }
                // The exclusion constraint refused a booking the checks could not see: still the quote's answer.
                Err(AppError::Store(err))
                    if err.sql_state().as_deref() == Some(bc_eventstore::error::EXCLUSION_VIOLATION) =>
                {
                    return Err(stale("a quoted atom was booked over the window by another request meanwhile"));
                }
                result => return result,
            }
        }
    }

    /// One try: BEGIN with the reserve's facts (read only, no placement read), the door's decision, then
    /// [`book_decided`], and COMMIT.
    async fn book_once(
        &self,
        caller: &Caller,
        id: &ReservationId,
        request: &ReservationRequest,
        claims: &QuoteClaims,
        gate: Option<&Call>,
    ) -> AppResult<Committed<Reserved>> {
        let call = facts::reserve_facts_call(id, &caller.tenant_id, request, false, 0)?;
        let (mut tx, answer) = self.db.begin_with(TxOptions::COMMAND, &call).await?;
        let decided = async {
            let answer = facts::reserve_facts(&request.pool_id, answer)?;
            if answer.claimed {
                // A claim left by an earlier unquoted try with this key: it goes with whatever this one commits.
                tx.defer(&facts::drop_quota_claim_call(id));
            }
            if let Some(call) = gate {
                let resource = answer.pool.clone().map(|facts| draft(call, id, request, facts));
                self.decide(call, "reservations.create", resource.as_ref(), Subject::Pool(&request.pool_id)).await?;
            }
            book_decided(&mut tx, caller, id, request, claims, answer, self.explain).await
        }
        .await;
        tx.end(decided).await
    }
}

/// Why no quote: the request can never fit the pool, or not at the start asked, or nowhere within 366 days.
fn nowhere(request: &ReservationRequest, pool: &PoolRow, holders: i64) -> Rejection {
    let devices = &request.devices;
    if holders < i64::from(devices.nodes()) {
        return Rejection::CapacityUnavailable(format!(
            "the request can never fit pool {}: it needs {} node(s) with {} matching {} atoms, and the pool has {holders}",
            pool.id,
            devices.nodes(),
            devices.per_node(),
            devices.class
        ));
    }
    Rejection::CapacityUnavailable(match request.start_ms {
        Some(start) => format!(
            "the request does not fit pool {} (or the quota) over the window from {start}; leave out start for the \
             earliest that fits",
            pool.id
        ),
        None => format!(
            "the request fits pool {} (within the quota) at none of the first {MAX_CANDIDATE_STARTS} possible starts \
             within 366 days",
            pool.id
        ),
    })
}

/// A quoted booking's decision on the facts `reserve_facts` answered: a retry answers the existing reservation;
/// a new one is admitted, its quoted devices booked ([`place_quoted`]) and both events recorded.
async fn book_decided(
    tx: &mut Tx,
    caller: &Caller,
    id: &ReservationId,
    request: &ReservationRequest,
    claims: &QuoteClaims,
    answer: ReserveAnswer,
    explain: bool,
) -> AppResult<Committed<Reserved>> {
    let ReserveAnswer { now_ms, facts, .. } = answer;
    let new = new_request(caller, id, request, now_ms);
    let facts = match facts {
        ReserveFacts::Existing(existing, position) => {
            reservation::request(Some(&existing), new(0, None))?;
            let reserved = Reserved { reservation: *existing, created: false, instance: None };
            return Ok(Committed { value: reserved, position });
        }
        ReserveFacts::NoPool => {
            return Err(Rejection::NotFound { kind: "pool", id: request.pool_id.to_string() }.into());
        }
        ReserveFacts::New(facts) => *facts,
    };
    if claims.expires_at_ms < now_ms {
        return Err(bad_quote(format!("the quote expired at {}", claims.expires_at_ms)));
    }
    let pool = &facts.pool;
    let admitted = reservation::admit(request, &admission(pool, &facts.offers, caller, facts.project_in_tenant))?;
    let mut events = reservation::request(None, new(admitted.priority, admitted.quota_holder))?;
    let mut state = reservation::fold(&events)
        .ok_or_else(|| AppError::Store(bc_eventstore::Error::Internal("no state after a request".into())))?;
    let mut trace = Trace::default();
    let allocations = place_quoted(tx, &state, pool, &facts.offers, claims, now_ms, &mut trace).await?;
    let placed = place_events(&state, allocations, now_ms, explain.then_some(trace))?;
    for event in &placed {
        state = reservation::evolve(Some(state), event).unwrap_or_else(|| unreachable!("evolve keeps a state"));
    }
    events.extend(placed);
    let position = record(tx, caller, id.as_str(), &caller.tenant_id, ExpectedVersion::NO_STREAM, events).await?;
    work::schedule_with_commit(tx, &WorkKey::Reservation(id.clone()), reservation::next_look(&state, now_ms));
    Ok(Committed { value: Reserved { reservation: state, created: true, instance: None }, position })
}

/// The quoted devices as allocations of the new reservation `r`, once locked and checked in the lock order:
/// the quota row, the pool, the quoted nodes (still schedulable, in the pool) and atoms (still bookable there),
/// then no live booking of them overlapping the window, and the quota admitting them at every instant of it.
/// `QUOTE_STALE` names the first thing that changed: an atom's overlapping booking (the atom, its node and the
/// part of the window, never whose booking), a node no longer schedulable and why, or the quota line.
pub(crate) async fn place_quoted(
    tx: &mut Tx,
    r: &Reservation,
    pool: &PoolRow,
    offers: &[PoolOffered],
    claims: &QuoteClaims,
    now_ms: i64,
    trace: &mut Trace,
) -> AppResult<Vec<Allocation>> {
    let request = &r.request;
    let resource = request.resource();
    let start_ms = placed_start(request, now_ms);
    let end_ms = start_ms + request.duration_s as i64 * 1000;
    let quota = quota_of(offers, r.quota_holder.as_ref(), resource);
    if quota.is_some() {
        store::lock_quota(tx, &r.tenant_id, &pool.id, resource).await?;
    }
    store::lock_pool(tx, &pool.id).await?;
    let nodes: Vec<&str> = claims.allocations.iter().map(|a| a.node_id.as_str()).collect();
    let atoms: Vec<&str> = claims.allocations.iter().flat_map(|a| a.devices.iter().map(|d| d.as_str())).collect();
    let locked = match store::lock_chosen(tx, &nodes, &atoms, AtomLock::Wait).await? {
        Chosen::NodeGone => None,
        Chosen::Locked(locked) => Some(locked),
    };
    let seen = store::quotes::nodes(tx, &nodes).await?;
    for node in &nodes {
        let why = match seen.iter().find(|seen| seen.id == *node) {
            None => "was deleted".to_owned(),
            Some(seen) if seen.pool_id != pool.id.as_str() => format!("left pool {}", pool.id),
            Some(seen) if !seen.schedulable => format!("is no longer schedulable ({})", unschedulable(seen)),
            Some(_) => continue,
        };
        return Err(stale(format!("node {node} {why}")));
    }
    let Some(locked) = locked else { return Err(stale("a quoted node is no longer schedulable")) };
    let rows = store::quotes::atoms(tx, &atoms).await?;
    for allocation in &claims.allocations {
        for atom in &allocation.devices {
            let row = rows.iter().find(|row| row.id == atom.as_str());
            let gone = match row {
                None => true,
                Some(row) => {
                    row.node_id != allocation.node_id.as_str()
                        || row.pool_id != pool.id.as_str()
                        || row.class != request.devices.class.as_str()
                        || !row.bookable
                }
            };
            if gone || !locked.iter().any(|l| l == atom.as_str()) {
                return Err(stale(format!(
                    "{} {atom} on node {} is no longer a bookable atom there",
                    request.devices.class, allocation.node_id
                )));
            }
        }
    }
    if let Some(overlap) = store::quotes::overlaps(tx, &atoms, start_ms, end_ms).await?.first() {
        let node = claims
            .allocations
            .iter()
            .find(|a| a.devices.iter().any(|d| d.as_str() == overlap.device_id))
            .map_or("?", |a| a.node_id.as_str());
        return Err(stale(format!(
            "{} {} on node {node} is now booked from {} to {}, within the window from {start_ms} to {end_ms}",
            request.devices.class, overlap.device_id, overlap.from_ms, overlap.to_ms
        )));
    }
    if let Some(quota) = quota {
        let peak = store::peak_usage(tx, &r.tenant_id, &pool.id, resource, start_ms, end_ms).await?;
        trace.quota(resource, quota, peak, request.devices.count);
        if !reservation::within_quota(peak, request.devices.count, quota) {
            return Err(stale(format!(
                "the quota of {quota} {resource} in pool {} would be exceeded: the tenant already holds up to {peak} \
                 during the window, and the quote asks for {} more",
                pool.id, request.devices.count
            )));
        }
    }
    trace.tiers.push(TierLook { tier: Tier::Quote, candidates: nodes.len() as u32, fits: true });
    Ok(claims
        .allocations
        .iter()
        .map(|quoted| Allocation {
            allocation_id: AllocationId::generate(),
            node_id: quoted.node_id.clone(),
            devices: quoted.devices.clone(),
            resources: request.resources.clone(),
        })
        .collect())
}

/// Why a node is not schedulable, in the words of its flags.
fn unschedulable(node: &store::quotes::QuotedNode) -> String {
    let mut why = Vec::new();
    if node.cordoned {
        why.push("cordoned".to_owned());
    }
    if node.draining {
        why.push("draining".to_owned());
    }
    if node.maintenance {
        why.push("in maintenance".to_owned());
    }
    if node.connectivity != "connected" {
        why.push(format!("connectivity {}", node.connectivity));
    }
    if !node.no_schedule_reasons.is_empty() {
        why.push(format!("noScheduleReasons {}", node.no_schedule_reasons.join(", ")));
    }
    if why.is_empty() {
        why.push(format!("provisionState {}, or its role, trust or observed generation", node.provision_state));
    }
    why.join(", ")
}
