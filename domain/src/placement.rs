//! Placement's pure part: given the free atoms of each candidate node (found with set-based SQL), choose the
//! nodes and atoms for a request. Never enumerates combinations: nodes are ranked once and taken in order.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::id::{DeviceId, NodeId, ReservationId};
use crate::pool::PoolPolicy;
use crate::reservation::DeviceRequest;

/// A node that qualifies for a request, with its atoms free over the whole window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCandidate {
    pub node_id: NodeId,
    pub free_atoms: Vec<DeviceId>,
}

/// The atoms chosen on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedAllocation {
    pub node_id: NodeId,
    /// In device id order (the order bookings are inserted in).
    pub devices: Vec<DeviceId>,
}

fn spread_key(reservation: &ReservationId, item: &str) -> [u8; 8] {
    let digest = Sha256::new().chain_update(reservation.as_str()).chain_update([0]).chain_update(item).finalize();
    let mut key = [0u8; 8];
    key.copy_from_slice(&digest[..8]);
    key
}

/// Chooses atoms for `request`, or `None` when the candidates cannot hold it. Nodes are ranked best fit
/// first (the fewest free atoms that still hold the node's share, to keep large holes for large requests);
/// equal-ranked nodes, and the atoms within a node, are ordered by a hash of the reservation id, so
/// concurrent requests spread instead of colliding.
pub fn plan(
    reservation: &ReservationId,
    request: &DeviceRequest,
    candidates: &[NodeCandidate],
) -> Option<Vec<PlannedAllocation>> {
    plan_spread(reservation, request, candidates, 0)
}

/// As [`plan`], but the nodes are drawn (by the same hash) from the best `nodes + spread` fitting ones rather than
/// taken strictly best first: a request that lost a race for the best fit spreads wider on each try, instead of
/// meeting every other loser on the next-best atoms. `spread` 0 is best fit.
pub fn plan_spread(
    reservation: &ReservationId,
    request: &DeviceRequest,
    candidates: &[NodeCandidate],
    spread: usize,
) -> Option<Vec<PlannedAllocation>> {
    let per_node = request.per_node() as usize;
    let nodes = request.nodes() as usize;
    if per_node == 0 {
        return None;
    }
    let mut fitting: Vec<(&NodeCandidate, usize, [u8; 8])> = candidates
        .iter()
        .filter(|candidate| candidate.free_atoms.len() >= per_node)
        .map(|candidate| (candidate, candidate.free_atoms.len(), spread_key(reservation, candidate.node_id.as_str())))
        .collect();
    if fitting.len() < nodes {
        return None;
    }
    fitting.sort_by(|a, b| a.1.cmp(&b.1).then(a.2.cmp(&b.2)).then(a.0.node_id.cmp(&b.0.node_id)));
    if spread > 0 {
        fitting.truncate(nodes.saturating_add(spread));
        fitting.sort_by(|a, b| a.2.cmp(&b.2).then(a.0.node_id.cmp(&b.0.node_id)));
    }
    let mut chosen: Vec<PlannedAllocation> = fitting
        .into_iter()
        .take(nodes)
        .map(|(candidate, _, _)| {
            let mut atoms: Vec<(&DeviceId, [u8; 8])> =
                candidate.free_atoms.iter().map(|atom| (atom, spread_key(reservation, atom.as_str()))).collect();
            atoms.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(b.0)));
            let mut devices: Vec<DeviceId> = atoms.into_iter().take(per_node).map(|(atom, _)| atom.clone()).collect();
            devices.sort();
            PlannedAllocation { node_id: candidate.node_id.clone(), devices }
        })
        .collect();
    chosen.sort_by(|a, b| a.node_id.cmp(&b.node_id));
    Some(chosen)
}

/// What a node has of one scalar resource and the most its bookings hold at any instant of a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalarHeld {
    pub node_id: NodeId,
    pub resource: String,
    /// What the node reported, before the pool's overcommit.
    pub capacity: u64,
    pub peak: i64,
}

/// Whether a node can hold `wanted` (one allocation's scalar amounts) over the window on top of what it holds at
/// its busiest instant: for each resource, its capacity times the pool's overcommit less that peak. A resource the
/// node does not report (no row in `held`) has nothing to lend.
pub fn scalars_fit(policy: &PoolPolicy, wanted: &BTreeMap<String, u64>, node_id: &NodeId, held: &[ScalarHeld]) -> bool {
    wanted.iter().all(|(resource, amount)| {
        held.iter().find(|h| &h.node_id == node_id && &h.resource == resource).is_some_and(|h| {
            crate::reservation::within_limit(h.peak, *amount, policy.allocatable(resource, h.capacity))
        })
    })
}

#[cfg(test)]
mod tests;
