//! Placement's pure part: given the free atoms of each candidate node (found with set-based SQL), choose the
//! nodes and atoms for a request. Never enumerates combinations: nodes are ranked once and taken in order.

use sha2::{Digest, Sha256};

use crate::id::{DeviceId, NodeId, ReservationId};
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceClass;
    use crate::id::{Identity, TenantId};
    use crate::reservation::{Selector, Topology};

    fn rsv(key: &str) -> ReservationId {
        let tenant: TenantId = "acme".parse().expect("tenant");
        let identity: Identity = "alice".parse().expect("identity");
        ReservationId::derive(&tenant, &identity, key)
    }

    fn node(n: usize, free: usize) -> NodeCandidate {
        let node_id: NodeId = format!("node_{:026}", n).parse().expect("node");
        NodeCandidate {
            node_id,
            free_atoms: (0..free).map(|g| format!("GPU-{n}-{g}").parse().expect("device")).collect(),
        }
    }

    fn request(count: u32, topology: Topology) -> DeviceRequest {
        DeviceRequest { class: DeviceClass::Gpu, count, selector: Selector::default(), topology }
    }

    #[test]
    fn a_same_node_request_takes_the_best_fitting_node() {
        let candidates = vec![node(1, 8), node(2, 3), node(3, 4), node(4, 2)];
        let planned = plan(&rsv("a"), &request(3, Topology::SameNode), &candidates).expect("fits");
        assert_eq!(planned.len(), 1);
        assert_eq!(planned[0].node_id, candidates[1].node_id, "3 free is the tightest fit for 3");
        assert_eq!(planned[0].devices.len(), 3);
        assert!(planned[0].devices.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_gang_takes_one_allocation_on_each_of_its_nodes() {
        let candidates = vec![node(1, 8), node(2, 8), node(3, 2), node(4, 8)];
        let planned = plan(&rsv("g"), &request(12, Topology::Gang { nodes: 3 }), &candidates).expect("fits");
        assert_eq!(planned.len(), 3);
        assert!(planned.iter().all(|a| a.devices.len() == 4));
        assert!(!planned.iter().any(|a| a.node_id == candidates[2].node_id), "2 free atoms cannot hold a share of 4");
        assert!(plan(&rsv("g"), &request(16, Topology::Gang { nodes: 4 }), &candidates).is_none());
    }

    #[test]
    fn nothing_fits_when_no_node_holds_the_request() {
        let candidates = vec![node(1, 3), node(2, 3)];
        assert!(plan(&rsv("a"), &request(4, Topology::SameNode), &candidates).is_none());
        assert!(plan(&rsv("a"), &request(1, Topology::SameNode), &[]).is_none());
    }

    #[test]
    fn concurrent_requests_spread_over_equal_nodes() {
        let candidates: Vec<NodeCandidate> = (0..20).map(|n| node(n, 8)).collect();
        let chosen: std::collections::HashSet<NodeId> = (0..20)
            .map(|k| {
                plan(&rsv(&format!("key-{k}")), &request(1, Topology::SameNode), &candidates).expect("fits")[0]
                    .node_id
                    .clone()
            })
            .collect();
        assert!(chosen.len() > 5, "20 requests landed on only {} of 20 equal nodes", chosen.len());
        // The same request always gets the same plan.
        let a = plan(&rsv("same"), &request(2, Topology::SameNode), &candidates);
        assert_eq!(a, plan(&rsv("same"), &request(2, Topology::SameNode), &candidates));
    }
}
