//! What a reservation command decides on, read by one server-side call that shares its round trip with BEGIN
//! ([`bc_eventstore::Db::begin_with`]): `reserve_facts` and `reservation_facts` (`capacity/0005`). The calls are built
//! and their answers read here; the decisions stay in `reservations`.

use bc_domain::event::DomainEvent as _;
use bc_domain::id::{NodeId, PoolId, ReservationId, TenantId};
use bc_domain::placement::NodeCandidate;
use bc_domain::pool::{PoolOffered, PoolPolicy, Quota, Sharing};
use bc_domain::reservation::{self, Reservation, ReservationEvent, ReservationRequest};
use bc_eventstore::Position;
use bc_eventstore::sql::Call;
use serde::Deserialize;

use super::{PoolRow, corrupt, exact_limit, selector_params, summary_limit};
use crate::AppResult;
use crate::auth::resolve::{PoolParts, ReservationParts};
use crate::auth::{PoolFacts, Resource};

/// An event as `stream_json` gives it: type, schema version, payload in hexadecimal, position.
type StoredEvent = (String, i16, String, String);

/// A reservation folded from its stream's events, with the position of the last one (`None`: no such stream).
fn fold(events: &[StoredEvent]) -> AppResult<Option<(Reservation, Option<Position>)>> {
    let mut decoded = Vec::with_capacity(events.len());
    for (event_type, schema_version, payload, _) in events {
        let payload = hex::decode(payload).map_err(|err| corrupt("an event payload", err))?;
        decoded.push(ReservationEvent::decode(event_type, *schema_version, &payload)?);
    }
    let position = match events.last() {
        Some((_, _, _, position)) => {
            Some(position.parse::<Position>().map_err(|err| corrupt("an event position", err))?)
        }
        None => None,
    };
    Ok(reservation::fold(&decoded).map(|r| (r, position)))
}

fn parse<T: serde::de::DeserializeOwned>(what: &str, answer: Option<String>) -> AppResult<T> {
    let text = answer.ok_or_else(|| corrupt(what, "the call answered NULL"))?;
    serde_json::from_str(&text).map_err(|err| corrupt(what, err))
}

fn node_ids(what: &str, ids: Vec<String>) -> AppResult<Vec<NodeId>> {
    ids.into_iter().map(|id| id.parse().map_err(|err| corrupt(what, err))).collect()
}

#[derive(Debug, Deserialize)]
struct RawReservationFacts {
    now_ms: i64,
    events: Vec<StoredEvent>,
    agents: Vec<String>,
    draining: Vec<String>,
    authz: Option<ReservationParts>,
}

/// What a command on an existing reservation decides on.
#[derive(Debug)]
pub struct ReservationFacts {
    pub now_ms: i64,
    /// The reservation and the position of its last event, when it exists.
    pub reservation: Option<(Reservation, Option<Position>)>,
    /// The nodes of its allocations that run an agent.
    pub agents: Vec<NodeId>,
    /// The nodes of its allocations that are draining.
    pub draining: Vec<NodeId>,
    /// What the authorizer decides on (`None`: there is no such reservation in the tables).
    pub resource: Option<Resource>,
}

/// The call that reads a reservation's facts.
pub fn reservation_facts_call(id: &ReservationId) -> Call {
    Call::new("reservation_facts").text(id.as_str())
}

/// Reads what [`reservation_facts_call`] answered for reservation `id`.
pub fn reservation_facts(id: &ReservationId, answer: Option<String>) -> AppResult<ReservationFacts> {
    let raw: RawReservationFacts = parse("reservation_facts", answer)?;
    let resource = raw.authz.map(|parts| parts.resource(id)).transpose()?;
    Ok(ReservationFacts {
        resource,
        now_ms: raw.now_ms,
        reservation: fold(&raw.events)?,
        agents: node_ids("node_credentials.node_id", raw.agents)?,
        draining: node_ids("nodes.id", raw.draining)?,
    })
}

#[derive(Debug, Deserialize)]
struct RawPool {
    owner_tenant_id: String,
    gpu_model: String,
    sharing: Sharing,
    policy: PoolPolicy,
}

#[derive(Debug, Deserialize)]
struct RawOffer {
    tenant_id: String,
    quota: Quota,
    priority: i32,
    include_descendants: bool,
    at_ms: i64,
}

#[derive(Debug, Deserialize)]
struct RawCandidate {
    node_id: String,
    free: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct RawReserveFacts {
    now_ms: i64,
    events: Vec<StoredEvent>,
    authz: Option<PoolParts>,
    pool: Option<RawPool>,
    #[serde(default)]
    offers: Vec<RawOffer>,
    #[serde(default)]
    project_in_tenant: bool,
    start_ms: Option<i64>,
    end_ms: Option<i64>,
    #[serde(default)]
    exact: bool,
    candidates: Option<Vec<RawCandidate>>,
    peak: Option<i64>,
    holders: Option<i64>,
    pending: Option<i64>,
    #[serde(default)]
    claimed: bool,
}

/// What a reserve decides on.
#[derive(Debug)]
pub enum ReserveFacts {
    /// The reservation exists already (a retry), with the position of its last event.
    Existing(Box<Reservation>, Option<Position>),
    /// No such pool.
    NoPool,
    New(Box<NewReserveFacts>),
}

/// What a new reservation request decides on.
#[derive(Debug)]
pub struct NewReserveFacts {
    pub pool: PoolRow,
    /// The pool's offers; empty when the tenant owns the pool (it is not quota-limited).
    pub offers: Vec<PoolOffered>,
    pub project_in_tenant: bool,
    /// What was read for placing it now, when it may place.
    pub placing: Option<Placing>,
}

/// What was read, with its locks taken, to place a request now.
#[derive(Debug)]
pub struct Placing {
    pub start_ms: i64,
    pub end_ms: i64,
    /// Fitting nodes, best fit first.
    pub candidates: Vec<NodeCandidate>,
    /// Whether the candidates came from the exact query (the summary had too few).
    pub exact: bool,
    /// The tenant's peak holding over the window, when it is quota-limited.
    pub peak: Option<i64>,
    /// How many nodes could ever hold it and how many reservations wait in the pool, when too few fit now.
    pub waiting: Option<(i64, i64)>,
}

/// The call that reads a reserve's facts: `place` says whether it may place now, drawing from the best `spread`
/// more nodes than it needs.
pub fn reserve_facts_call(
    id: &ReservationId,
    tenant: &TenantId,
    request: &ReservationRequest,
    place: bool,
    spread: usize,
) -> AppResult<Call> {
    let devices = &request.devices;
    let (model, product, attributes) = selector_params(devices)?;
    let duration_ms = i64::try_from(request.duration_s).unwrap_or(i64::MAX).saturating_mul(1000);
    Ok(Call::new("reserve_facts")
        .text(id.as_str())
        .text(tenant.as_str())
        .text(request.pool_id.as_str())
        .opt_text(request.project_id.as_ref().map(|p| p.as_str()))
        .text(request.resource())
        .text(devices.class.as_str())
        .opt_text(model)
        .opt_text(product)
        .jsonb(&attributes)
        .opt_int8(request.start_ms)
        .int8(duration_ms)
        .int4(devices.per_node() as i32)
        .int4(devices.nodes() as i32)
        .int8(summary_limit(devices.nodes(), spread))
        .int8(exact_limit(devices.nodes()))
        .boolean(place))
}

/// The claim a quota-limited reserve commits before its transaction (`claim_quota`, `capacity/0006`), so that one
/// tenant's reserves in one pool need not queue on its quota row. The function claims nothing when there is nothing
/// to claim (the tenant owns the pool, the reservation exists, it will not place now).
pub fn claim_quota_call(id: &ReservationId, tenant: &TenantId, request: &ReservationRequest, place: bool) -> Call {
    let duration_ms = i64::try_from(request.duration_s).unwrap_or(i64::MAX).saturating_mul(1000);
    Call::new("claim_quota")
        .text(id.as_str())
        .text(tenant.as_str())
        .text(request.pool_id.as_str())
        .text(request.resource())
        .int8(i64::from(request.devices.count))
        .opt_int8(request.start_ms)
        .int8(duration_ms)
        .boolean(place)
}

/// Drops a reservation's quota claim: with its command's COMMIT, or on its own once the command failed.
pub fn drop_quota_claim_call(id: &ReservationId) -> Call {
    Call::new("drop_quota_claim").text(id.as_str())
}

/// What [`reserve_facts_call`] answered: the transaction's now, what the authorizer decides a create on (the pool's
/// facts; `None`: no such pool), and what the reserve decides on.
#[derive(Debug)]
pub struct ReserveAnswer {
    pub now_ms: i64,
    /// Whether the reservation's quota claim was seen (the command drops it when it commits).
    pub claimed: bool,
    pub pool: Option<PoolFacts>,
    pub facts: ReserveFacts,
}

/// Reads what [`reserve_facts_call`] answered.
pub fn reserve_facts(pool_id: &PoolId, answer: Option<String>) -> AppResult<ReserveAnswer> {
    let raw: RawReserveFacts = parse("reserve_facts", answer)?;
    let now_ms = raw.now_ms;
    let pool_facts = raw.authz.map(PoolParts::facts).transpose()?;
    let claimed = raw.claimed;
    let answer = |facts| Ok(ReserveAnswer { now_ms, pool: pool_facts.clone(), facts, claimed });
    if let Some((r, position)) = fold(&raw.events)? {
        return answer(ReserveFacts::Existing(Box::new(r), position));
    }
    let Some(pool) = raw.pool else { return answer(ReserveFacts::NoPool) };
    let offers = raw
        .offers
        .into_iter()
        .map(|o| {
            Ok(PoolOffered {
                pool_id: pool_id.clone(),
                tenant_id: o.tenant_id.parse().map_err(|err| corrupt("pool_offers.tenant_id", err))?,
                quota: o.quota,
                priority: o.priority,
                include_descendants: o.include_descendants,
                at_ms: o.at_ms,
            })
        })
        .collect::<AppResult<Vec<_>>>()?;
    let placing = match (raw.start_ms, raw.end_ms, raw.candidates) {
        (Some(start_ms), Some(end_ms), Some(candidates)) => Some(Placing {
            start_ms,
            end_ms,
            candidates: candidates
                .into_iter()
                .map(|c| {
                    Ok(NodeCandidate {
                        node_id: c.node_id.parse().map_err(|err| corrupt("devices.node_id", err))?,
                        free_atoms: c
                            .free
                            .into_iter()
                            .map(|id| id.parse().map_err(|err| corrupt("devices.id", err)))
                            .collect::<AppResult<_>>()?,
                    })
                })
                .collect::<AppResult<_>>()?,
            exact: raw.exact,
            peak: raw.peak,
            waiting: raw.holders.zip(raw.pending),
        }),
        _ => None,
    };
    let pool = PoolRow {
        id: pool_id.clone(),
        owner_tenant_id: pool.owner_tenant_id.parse().map_err(|err| corrupt("pools.owner_tenant_id", err))?,
        gpu_model: pool.gpu_model,
        sharing: pool.sharing,
        policy: pool.policy,
    };
    let project_in_tenant = raw.project_in_tenant;
    answer(ReserveFacts::New(Box::new(NewReserveFacts { pool, offers, project_in_tenant, placing })))
}
