//! Why a reservation was placed where it was, why it waits, or why it was refused: recorded as data with the
//! decision (in its `placed` or `requested` event, or the refusal's error), so the answer is the log's and a
//! replay to that position gives it again.
//!
//! The hot path records only what it already holds (the tiers it asked, the nodes it chose, the quota arithmetic).
//! The reasons each node was passed over are read only when the request does not fit now: one read of the pool's
//! nodes, folded by [`diagnose`].

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::id::NodeId;

/// How many passed-over nodes an explanation names; the rest are only counted in `excludedBy`.
pub const MAX_NAMED: usize = 16;

/// What was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Decision {
    /// Booked now (or for its future window).
    Placed,
    /// Recorded, waiting for capacity.
    Pending,
    /// Refused: nothing recorded.
    Refused,
    /// Refused by the authorizer: recorded as `denied`.
    Denied,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Placed => "placed",
            Decision::Pending => "pending",
            Decision::Refused => "refused",
            Decision::Denied => "denied",
        }
    }
}

/// One read of the search, in the order the placement asked them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    /// The free-capacity summary: the nodes with the fewest free atoms that still fit, read in index order.
    Summary,
    /// The exact read of every atom free over the window (what the summary cannot see: atoms booked only after it).
    Exact,
    /// Whole machines, read from their node atoms' bookings.
    WholeNodes,
    /// Atoms with scalar amounts (memory, CPU) lent at the window's busiest instant.
    Scalars,
    /// The devices of a quote, booked as quoted.
    Quote,
}

/// What one tier answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TierLook {
    pub tier: Tier,
    /// The fitting nodes it offered.
    pub candidates: u32,
    /// Whether a placement was planned from them.
    pub fits: bool,
}

/// The quota line and its arithmetic at the window's worst instant: `peak + requested <= limit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QuotaLine {
    pub resource: String,
    /// The quota the governing offering grants.
    pub limit: u32,
    /// What the tenant already holds at the busiest instant of the window.
    pub peak: i64,
    /// That instant, when known (read when the quota refuses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_at_ms: Option<i64>,
    pub requested: u32,
}

impl QuotaLine {
    pub fn admits(&self) -> bool {
        self.peak + i64::from(self.requested) <= i64::from(self.limit)
    }
}

impl fmt::Display for QuotaLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (peak, requested, limit) = (self.peak, self.requested, self.limit);
        let verdict = if self.admits() { "<=" } else { ">" };
        write!(
            f,
            "quota {}: {peak} held + {requested} requested = {} {verdict} {limit}",
            self.resource,
            peak + i64::from(requested)
        )?;
        if let Some(at) = self.peak_at_ms {
            write!(f, " (busiest at {at})")?;
        }
        Ok(())
    }
}

/// Why one node was passed over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Exclusion {
    /// The scheduler may not use it now; its failed conditions.
    #[serde(rename_all = "camelCase")]
    Unschedulable { reasons: Vec<String> },
    /// It never has enough atoms matching the request's class and selector for one node's share (topology).
    #[serde(rename_all = "camelCase")]
    TooFewMatching { matching: u32, needed: u32 },
    /// Enough matching atoms, but bookings overlap the window on too many of them.
    #[serde(rename_all = "camelCase")]
    Busy {
        free: u32,
        needed: u32,
        /// The bookings overlapping the window on its matching atoms.
        overlapping: u32,
        /// When the first of those ends.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        first_frees_at_ms: Option<i64>,
    },
    /// It fits, but the placement chose better-fitting nodes (or the request was refused for another reason).
    #[serde(rename_all = "camelCase")]
    NotNeeded { free: u32 },
}

impl Exclusion {
    /// The name of its kind, as `excludedBy` counts it.
    pub fn kind(&self) -> &'static str {
        match self {
            Exclusion::Unschedulable { .. } => "unschedulable",
            Exclusion::TooFewMatching { .. } => "too-few-matching",
            Exclusion::Busy { .. } => "busy",
            Exclusion::NotNeeded { .. } => "not-needed",
        }
    }
}

impl fmt::Display for Exclusion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exclusion::Unschedulable { reasons } => write!(f, "not schedulable: {}", reasons.join("; ")),
            Exclusion::TooFewMatching { matching, needed } => {
                write!(f, "{matching} matching atoms, fewer than the {needed} one node must hold")
            }
            Exclusion::Busy { free, needed, overlapping, first_frees_at_ms } => {
                write!(
                    f,
                    "{free} of the {needed} atoms needed free over the window; {overlapping} bookings overlap it"
                )?;
                if let Some(at) = first_frees_at_ms {
                    write!(f, ", the first ends at {at}")?;
                }
                Ok(())
            }
            Exclusion::NotNeeded { free } => write!(f, "fits ({free} free) but was not chosen"),
        }
    }
}

/// One passed-over node and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeExcluded {
    pub node_id: NodeId,
    pub reason: Exclusion,
}

/// The explanation of one decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub decision: Decision,
    /// The window the decision was about.
    pub start_ms: i64,
    pub end_ms: i64,
    /// The reads of the search, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tiers: Vec<TierLook>,
    /// The quota that limits the tenant, when one does (not the pool's owner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaLine>,
    /// The nodes placed on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chosen: Vec<NodeId>,
    /// The passed-over nodes, closest to fitting first, at most [`MAX_NAMED`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excluded: Vec<NodeExcluded>,
    /// How many of the pool's nodes each kind of exclusion covered.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub excluded_by: BTreeMap<String, u32>,
    /// The pool-policy rule that decided, when one did (the pending queue's bound, `wait: false`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// The decision and its main reason, in one line.
    pub summary: String,
}

/// What the pool's nodes looked like to a request that did not fit: one row per node (see [`diagnose`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLook {
    pub node_id: NodeId,
    /// Its failed schedulability conditions (empty: schedulable).
    pub unschedulable: Vec<String>,
    /// Its bookable atoms of the request's class that match the selector.
    pub matching: u32,
    /// Of those, the ones free over the whole window.
    pub free: u32,
    /// The bookings overlapping the window on its matching atoms.
    pub overlapping: u32,
    pub first_frees_at_ms: Option<i64>,
}

/// Each node's reason, from what it looked like: the nodes closest to fitting first (most free atoms), at most
/// [`MAX_NAMED`] named, and every node counted by its reason's kind.
pub fn diagnose(mut looks: Vec<NodeLook>, per_node: u32) -> (Vec<NodeExcluded>, BTreeMap<String, u32>) {
    looks.sort_by(|a, b| {
        let a_ok = a.unschedulable.is_empty();
        let b_ok = b.unschedulable.is_empty();
        b_ok.cmp(&a_ok).then(b.free.cmp(&a.free)).then(b.matching.cmp(&a.matching)).then(a.node_id.cmp(&b.node_id))
    });
    let mut counts = BTreeMap::new();
    let mut named = Vec::new();
    for look in looks {
        let reason = if !look.unschedulable.is_empty() {
            Exclusion::Unschedulable { reasons: look.unschedulable }
        } else if look.matching < per_node {
            Exclusion::TooFewMatching { matching: look.matching, needed: per_node }
        } else if look.free < per_node {
            Exclusion::Busy {
                free: look.free,
                needed: per_node,
                overlapping: look.overlapping,
                first_frees_at_ms: look.first_frees_at_ms,
            }
        } else {
            Exclusion::NotNeeded { free: look.free }
        };
        *counts.entry(reason.kind().to_owned()).or_insert(0) += 1;
        if named.len() < MAX_NAMED {
            named.push(NodeExcluded { node_id: look.node_id, reason });
        }
    }
    (named, counts)
}

/// The most a tenant holds at once over a window, and the first instant it holds that much, from the intervals
/// `[from, to)` of its holdings (each with its atoms) clipped to the window: the sweep the quota check makes.
pub fn peak_instant(intervals: &[(i64, i64, i64)]) -> (i64, Option<i64>) {
    let mut steps: Vec<(i64, i64)> = Vec::with_capacity(intervals.len() * 2);
    for &(from, to, atoms) in intervals {
        if to > from {
            steps.push((from, atoms));
            steps.push((to, -atoms));
        }
    }
    // An interval ending at an instant does not overlap one starting at it: ends first.
    steps.sort_unstable();
    let (mut running, mut peak, mut at) = (0, 0, None);
    for (instant, delta) in steps {
        running += delta;
        if running > peak {
            (peak, at) = (running, Some(instant));
        }
    }
    (peak, at)
}

impl Explanation {
    /// A placement: the tiers asked, the nodes chosen, and the quota line it was within.
    pub fn placed(window: (i64, i64), tiers: Vec<TierLook>, quota: Option<QuotaLine>, chosen: Vec<NodeId>) -> Self {
        let how = match tiers.iter().rev().find(|t| t.fits) {
            Some(TierLook { tier: Tier::Quote, .. }) => "as quoted".to_owned(),
            Some(look) => format!("from the {} read", tier_name(look.tier)),
            None => "as planned".to_owned(),
        };
        let mut summary = format!("placed on {} {how}", join_nodes(&chosen));
        if let Some(quota) = &quota {
            summary.push_str(&format!("; {quota}"));
        }
        Explanation {
            decision: Decision::Placed,
            start_ms: window.0,
            end_ms: window.1,
            tiers,
            quota,
            chosen,
            excluded: Vec::new(),
            excluded_by: BTreeMap::new(),
            policy: None,
            summary,
        }
    }

    /// A request that did not fit now: pending or refused, with the reason that decided (`policy`: a pool rule's
    /// refusal, which decides over the nodes' reasons).
    pub fn not_placed(
        decision: Decision,
        window: (i64, i64),
        tiers: Vec<TierLook>,
        quota: Option<QuotaLine>,
        (excluded, excluded_by): (Vec<NodeExcluded>, BTreeMap<String, u32>),
        policy: Option<String>,
    ) -> Self {
        let verb = match decision {
            Decision::Pending => "waits",
            _ => "refused",
        };
        let reason = if let Some(policy) = &policy {
            policy.clone()
        } else if let Some(quota) = quota.as_ref().filter(|q| !q.admits()) {
            quota.to_string()
        } else if excluded_by.is_empty() {
            "the pool has no nodes".to_owned()
        } else {
            let kinds: Vec<String> = excluded_by.iter().map(|(kind, n)| format!("{n} {kind}")).collect();
            format!("no nodes fit: {}", kinds.join(", "))
        };
        Explanation {
            decision,
            start_ms: window.0,
            end_ms: window.1,
            tiers,
            quota,
            chosen: Vec::new(),
            excluded,
            excluded_by,
            policy,
            summary: format!("{verb}: {reason}"),
        }
    }

    /// A request that did not fit now, explained without reading its pool's nodes (a refusal past the caller's
    /// budget of such reads): the pool rule or the quota line when one decided, and `unread`, why no node is named.
    pub fn not_placed_unread(
        decision: Decision,
        window: (i64, i64),
        tiers: Vec<TierLook>,
        quota: Option<QuotaLine>,
        policy: Option<String>,
        unread: &str,
    ) -> Self {
        let decided_by_rule = policy.is_some() || quota.as_ref().is_some_and(|q| !q.admits());
        let mut explanation = Self::not_placed(decision, window, tiers, quota, Default::default(), policy);
        explanation.summary = if decided_by_rule {
            format!("{}; the nodes were not read ({unread})", explanation.summary)
        } else {
            let verb = if decision == Decision::Pending { "waits" } else { "refused" };
            format!("{verb}: it does not fit now; the nodes were not read ({unread})")
        };
        explanation
    }

    /// The authorizer's refusal.
    pub fn denied(window: (i64, i64), reason: &str) -> Self {
        Explanation {
            decision: Decision::Denied,
            start_ms: window.0,
            end_ms: window.1,
            tiers: Vec::new(),
            quota: None,
            chosen: Vec::new(),
            excluded: Vec::new(),
            excluded_by: BTreeMap::new(),
            policy: Some(reason.to_owned()),
            summary: format!("denied: {reason}"),
        }
    }
}

fn tier_name(tier: Tier) -> &'static str {
    match tier {
        Tier::Summary => "free-capacity summary",
        Tier::Exact => "exact",
        Tier::WholeNodes => "whole-machine",
        Tier::Scalars => "scalar",
        Tier::Quote => "quote",
    }
}

fn join_nodes(nodes: &[NodeId]) -> String {
    match nodes {
        [] => "no node".to_owned(),
        many => many.iter().map(NodeId::as_str).collect::<Vec<_>>().join(", "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn look(id: &str, unschedulable: &[&str], matching: u32, free: u32) -> NodeLook {
        NodeLook {
            node_id: id.parse().expect("a node id"),
            unschedulable: unschedulable.iter().map(|s| (*s).to_owned()).collect(),
            matching,
            free,
            overlapping: matching - free,
            first_frees_at_ms: (free < matching).then_some(5_000),
        }
    }

    #[test]
    fn each_node_gets_the_first_failed_reason_and_the_closest_to_fitting_come_first() {
        let ids =
            ["node_01j0000000000000000000000a", "node_01j0000000000000000000000b", "node_01j0000000000000000000000c"];
        let looks = vec![look(ids[0], &["cordoned"], 8, 8), look(ids[1], &[], 8, 2), look(ids[2], &[], 2, 2)];
        let (named, counts) = diagnose(looks, 4);
        let kinds: Vec<(&str, &str)> = named.iter().map(|n| (n.node_id.as_str(), n.reason.kind())).collect();
        assert_eq!(kinds, [(ids[1], "busy"), (ids[2], "too-few-matching"), (ids[0], "unschedulable")]);
        assert_eq!(counts.get("busy"), Some(&1));
        assert_eq!(counts.get("unschedulable"), Some(&1));
        assert_eq!(
            named[0].reason,
            Exclusion::Busy { free: 2, needed: 4, overlapping: 6, first_frees_at_ms: Some(5_000) }
        );
    }

    #[test]
    fn only_the_first_nodes_are_named_but_every_node_is_counted() {
        let looks: Vec<NodeLook> =
            (0..40).map(|i| look(&format!("node_01j00000000000000000000{i:03}"), &[], 8, 1)).collect();
        let (named, counts) = diagnose(looks, 2);
        assert_eq!(named.len(), MAX_NAMED);
        assert_eq!(counts.get("busy"), Some(&40));
    }

    #[test]
    fn the_peak_instant_is_the_first_at_the_busiest_and_touching_intervals_do_not_overlap() {
        assert_eq!(peak_instant(&[]), (0, None));
        assert_eq!(peak_instant(&[(0, 10, 2), (10, 20, 3)]), (3, Some(10)));
        assert_eq!(peak_instant(&[(0, 10, 2), (5, 20, 3), (6, 7, 1)]), (6, Some(6)));
    }

    #[test]
    fn a_quota_line_reads_as_its_arithmetic() {
        let line = QuotaLine { resource: "gpu".into(), limit: 8, peak: 6, peak_at_ms: Some(1_000), requested: 4 };
        assert!(!line.admits());
        assert_eq!(line.to_string(), "quota gpu: 6 held + 4 requested = 10 > 8 (busiest at 1000)");
    }

    #[test]
    fn an_explanation_survives_messagepack_as_events_are_stored() {
        let (excluded, by) = diagnose(vec![look("node_01j0000000000000000000000a", &["cordoned"], 8, 8)], 1);
        let quota = QuotaLine { resource: "gpu".into(), limit: 8, peak: 2, peak_at_ms: None, requested: 1 };
        let explained = Explanation::not_placed(
            Decision::Pending,
            (0, 1000),
            vec![TierLook { tier: Tier::Summary, candidates: 0, fits: false }],
            Some(quota),
            (excluded, by),
            None,
        );
        let bytes = rmp_serde::to_vec_named(&explained).expect("encodes");
        let back: Explanation = rmp_serde::from_slice(&bytes).expect("decodes");
        assert_eq!(back, explained);
        assert_eq!(back.summary, "waits: no nodes fit: 1 unschedulable");
    }

    #[test]
    fn a_refusal_whose_nodes_were_not_read_says_so_after_the_rule_or_quota_that_decided() {
        let tiers = vec![TierLook { tier: Tier::Summary, candidates: 0, fits: false }];
        let unread = "too many refusals";
        let plain = Explanation::not_placed_unread(Decision::Refused, (0, 1000), tiers.clone(), None, None, unread);
        assert_eq!(plain.summary, "refused: it does not fit now; the nodes were not read (too many refusals)");
        assert!(plain.excluded.is_empty() && plain.excluded_by.is_empty());
        let over = QuotaLine { resource: "gpu".into(), limit: 8, peak: 6, peak_at_ms: None, requested: 4 };
        let by_quota =
            Explanation::not_placed_unread(Decision::Refused, (0, 1000), tiers.clone(), Some(over), None, unread);
        assert_eq!(
            by_quota.summary,
            "refused: quota gpu: 6 held + 4 requested = 10 > 8; the nodes were not read (too many refusals)"
        );
        let rule = Some("the pool does not let requests wait".to_owned());
        let by_rule = Explanation::not_placed_unread(Decision::Refused, (0, 1000), tiers, None, rule, unread);
        assert_eq!(
            by_rule.summary,
            "refused: the pool does not let requests wait; the nodes were not read (too many refusals)"
        );
    }
}
