//! Explained decisions on the wire: why a reservation was placed where it was, why it waits, or why it was
//! refused (`GET /v1/reservations/{id}/explanation`, and a refusal's `details.explanation`).

use std::collections::BTreeMap;

use bc_domain::reservation::Explanation;
use bc_domain::reservation::explanation::{Exclusion, NodeExcluded, QuotaLine, Tier, TierLook};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The explanation of one decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExplanationDto {
    /// `placed`, `pending`, `refused` or `denied`.
    pub decision: String,
    /// The decision and its main reason, in one line.
    pub summary: String,
    /// The window decided about (epoch milliseconds).
    pub start: i64,
    pub end: i64,
    /// The reads the placement made, in order.
    pub tiers: Vec<TierLookDto>,
    /// The quota line and its arithmetic, when a quota limits the tenant.
    pub quota: Option<QuotaLineDto>,
    /// The nodes placed on.
    pub chosen: Vec<String>,
    /// Passed-over nodes, the closest to fitting first (at most 16).
    pub excluded: Vec<NodeExcludedDto>,
    /// How many of the pool's nodes each kind of exclusion covered.
    pub excluded_by: BTreeMap<String, u32>,
    /// The pool rule that decided, when one did.
    pub policy: Option<String>,
}

/// What one read of the search offered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TierLookDto {
    /// `summary`, `exact`, `whole-nodes`, `scalars` or `quote`.
    pub tier: String,
    /// The fitting nodes it offered.
    pub candidates: u32,
    /// Whether a placement was planned from them.
    pub fits: bool,
}

/// `peak + requested <= limit` at the window's busiest instant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaLineDto {
    pub resource: String,
    pub limit: u32,
    /// Held at the busiest instant of the window.
    pub peak: i64,
    /// That instant (epoch milliseconds), when read.
    pub peak_at: Option<i64>,
    pub requested: u32,
    pub admits: bool,
    /// The arithmetic in words.
    pub arithmetic: String,
}

/// One passed-over node and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeExcludedDto {
    pub node_id: String,
    /// `unschedulable`, `too-few-matching`, `busy` or `not-needed`.
    pub kind: String,
    /// The reason in words.
    pub reason: String,
    /// The failed schedulability conditions (`unschedulable`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<String>,
    /// Atoms matching the request's class and selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matching: Option<u32>,
    /// Of those, free over the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free: Option<u32>,
    /// What one node's share of the request needs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needed: Option<u32>,
    /// Bookings overlapping the window on its matching atoms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlapping: Option<u32>,
    /// When the first of those ends (epoch milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_frees_at: Option<i64>,
}

/// `GET /v1/reservations/{id}/explanation`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReservationExplanationDto {
    pub reservation_id: String,
    /// The position of the event that recorded it: a replay to there folds the same explanation.
    pub position: String,
    pub explanation: ExplanationDto,
}

impl From<&Explanation> for ExplanationDto {
    fn from(e: &Explanation) -> Self {
        ExplanationDto {
            decision: e.decision.as_str().to_owned(),
            summary: e.summary.clone(),
            start: e.start_ms,
            end: e.end_ms,
            tiers: e.tiers.iter().map(Into::into).collect(),
            quota: e.quota.as_ref().map(Into::into),
            chosen: e.chosen.iter().map(ToString::to_string).collect(),
            excluded: e.excluded.iter().map(Into::into).collect(),
            excluded_by: e.excluded_by.clone(),
            policy: e.policy.clone(),
        }
    }
}

impl From<&TierLook> for TierLookDto {
    fn from(look: &TierLook) -> Self {
        let tier = match look.tier {
            Tier::Summary => "summary",
            Tier::Exact => "exact",
            Tier::WholeNodes => "whole-nodes",
            Tier::Scalars => "scalars",
            Tier::Quote => "quote",
        };
        TierLookDto { tier: tier.to_owned(), candidates: look.candidates, fits: look.fits }
    }
}

impl From<&QuotaLine> for QuotaLineDto {
    fn from(q: &QuotaLine) -> Self {
        QuotaLineDto {
            resource: q.resource.clone(),
            limit: q.limit,
            peak: q.peak,
            peak_at: q.peak_at_ms,
            requested: q.requested,
            admits: q.admits(),
            arithmetic: q.to_string(),
        }
    }
}

impl From<&NodeExcluded> for NodeExcludedDto {
    fn from(n: &NodeExcluded) -> Self {
        let mut dto = NodeExcludedDto {
            node_id: n.node_id.to_string(),
            kind: n.reason.kind().to_owned(),
            reason: n.reason.to_string(),
            conditions: Vec::new(),
            matching: None,
            free: None,
            needed: None,
            overlapping: None,
            first_frees_at: None,
        };
        match &n.reason {
            Exclusion::Unschedulable { reasons } => dto.conditions = reasons.clone(),
            Exclusion::TooFewMatching { matching, needed } => {
                (dto.matching, dto.needed) = (Some(*matching), Some(*needed))
            }
            Exclusion::Busy { free, needed, overlapping, first_frees_at_ms } => {
                (dto.free, dto.needed, dto.overlapping) = (Some(*free), Some(*needed), Some(*overlapping));
                dto.first_frees_at = *first_frees_at_ms;
            }
            Exclusion::NotNeeded { free } => dto.free = Some(*free),
        }
        dto
    }
}
