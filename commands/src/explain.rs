//! Explained decisions: what a reserve records about why it placed, waits or was refused, and the explanation
//! read back from a reservation's stream at a position (so the answer is the log's: a replay to that position
//! folds the same one).

use bc_domain::Rejection;
use bc_domain::event::DomainEvent as _;
use bc_domain::id::{PoolId, ReservationId, TenantId};
use bc_domain::placement::NodeCandidate;
use bc_domain::reservation::explanation::{self, Decision, QuotaLine, Tier, TierLook};
use bc_domain::reservation::{self, Allocation, Explanation, ReservationEvent, ReservationRequest};
use bc_eventstore::{Position, Tx, TxOptions, events};

use super::store;
use super::{App, AppError, AppResult, Caller};

/// What one placement attempt saw, gathered as it goes: the tiers it read and the quota line it checked.
#[derive(Debug, Default, Clone)]
pub(crate) struct Trace {
    pub tiers: Vec<TierLook>,
    pub quota: Option<QuotaLine>,
}

impl Trace {
    /// One tier read: the fitting nodes it offered, and whether a plan came of them.
    pub fn look(&mut self, tier: Tier, candidates: &[NodeCandidate], fits: bool) {
        let candidates = u32::try_from(candidates.len()).unwrap_or(u32::MAX);
        self.tiers.push(TierLook { tier, candidates, fits });
    }

    /// The quota check: `peak` held at the window's busiest instant, `requested` more, against `limit`.
    pub fn quota(&mut self, resource: &str, limit: u32, peak: i64, requested: u32) {
        self.quota = Some(QuotaLine { resource: resource.to_owned(), limit, peak, peak_at_ms: None, requested });
    }

    /// The explanation of a placement onto `allocations` for `window`.
    pub fn placed(self, window: (i64, i64), allocations: &[Allocation]) -> Explanation {
        let mut chosen: Vec<_> = allocations.iter().map(|a| a.node_id.clone()).collect();
        chosen.dedup();
        Explanation::placed(window, self.tiers, self.quota, chosen)
    }
}

/// What explaining a request that did not fit needs to know.
pub(crate) struct NotPlaced<'a> {
    pub reservation: &'a ReservationId,
    pub tenant: &'a TenantId,
    pub pool_id: &'a PoolId,
    pub request: &'a ReservationRequest,
    pub window: (i64, i64),
    /// The quota that limits the tenant (`None`: the pool's owner).
    pub quota_limit: Option<u32>,
    pub decision: Decision,
    /// The pool rule that refused it, in words, when one did.
    pub policy: Option<String>,
    /// Why the pool's nodes are not read for it, when they are not (a refusal past its caller's budget).
    pub nodes_unread: Option<String>,
}

/// Explains a request that did not fit now: the pool's nodes as it saw them (unless `nodes_unread` says why not),
/// and the quota line with its busiest instant. Reads the pool once: only on the way to `pending` or a refusal,
/// never on a placement's path.
pub(crate) async fn not_placed(tx: &mut Tx, trace: Trace, what: NotPlaced<'_>) -> AppResult<Explanation> {
    let NotPlaced { reservation, tenant, pool_id, request, window, quota_limit, decision, policy, nodes_unread } = what;
    let (start, end) = window;
    let resource = request.resource();
    let quota = match (quota_limit, trace.quota) {
        (None, _) => None,
        (Some(limit), seen) => {
            let held = store::explain::holdings(tx, reservation, tenant, pool_id, resource, start, end).await?;
            let (peak, peak_at_ms) = explanation::peak_instant(&held);
            // The check's own peak when it made one (it also counts this command's claim's neighbours the same way).
            let peak = seen.as_ref().map_or(peak, |line| line.peak.max(peak));
            Some(QuotaLine { resource: resource.to_owned(), limit, peak, peak_at_ms, requested: request.devices.count })
        }
    };
    if let Some(unread) = nodes_unread {
        return Ok(Explanation::not_placed_unread(decision, window, trace.tiers, quota, policy, &unread));
    }
    let looks = store::explain::node_looks(tx, pool_id, &request.devices, start, end).await?;
    let diagnosis = explanation::diagnose(looks, request.devices.per_node());
    Ok(Explanation::not_placed(decision, window, trace.tiers, quota, diagnosis, policy))
}

/// A refusal with its explanation: the rejection as ever, and why, for the error's details.
#[derive(Debug)]
pub struct Explained {
    pub rejection: Rejection,
    pub explanation: Box<Explanation>,
}

impl App {
    /// The explanation of a reservation's last placement decision as the log stood at `at` (now when `None`):
    /// the fold of its stream up to that position. `NOT_FOUND` for another tenant's reservation, and for one
    /// whose decisions were recorded before explanations were.
    pub async fn explanation(
        &self,
        caller: &Caller,
        id: &ReservationId,
        at: Option<Position>,
    ) -> AppResult<(Explanation, Position)> {
        let not_found = || AppError::from(Rejection::NotFound { kind: "reservation", id: id.to_string() });
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let recorded = events::read_stream(&mut tx, id.as_str(), 0, 10_000).await?;
        tx.commit().await?;
        let mut folded = None;
        let mut position = None;
        for event in recorded.iter().take_while(|e| at.is_none_or(|at| e.position <= at)) {
            let decoded = ReservationEvent::decode(&event.event_type, event.schema_version, &event.payload)?;
            let explains = match &decoded {
                ReservationEvent::Placed(e) => e.explanation.is_some(),
                ReservationEvent::Requested(e) => e.explanation.is_some(),
                ReservationEvent::Denied(_) => true,
                _ => false,
            };
            if explains {
                position = Some(event.position);
            }
            folded = reservation::evolve(folded, &decoded);
        }
        let r = folded.filter(|r| r.tenant_id == caller.tenant_id).ok_or_else(not_found)?;
        match (r.explanation, position) {
            (Some(explanation), Some(position)) => Ok((*explanation, position)),
            _ => Err(Rejection::NotFound { kind: "explanation", id: id.to_string() }.into()),
        }
    }
}
