//! Tests of `placement`.

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
    NodeCandidate { node_id, free_atoms: (0..free).map(|g| format!("GPU-{n}-{g}").parse().expect("device")).collect() }
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

#[test]
fn a_wider_spread_draws_from_the_best_few_fitting_nodes_only() {
    // Free atoms 1..=12 on nodes 1..=12: best fit for one atom is node 1.
    let candidates: Vec<NodeCandidate> = (1..=12).map(|n| node(n, n)).collect();
    let one = request(1, Topology::SameNode);
    for k in 0..50 {
        let r = rsv(&format!("k{k}"));
        assert_eq!(plan_spread(&r, &one, &candidates, 0), plan(&r, &one, &candidates), "spread 0 is best fit");
        assert_eq!(plan(&r, &one, &candidates).expect("fits")[0].node_id, candidates[0].node_id);
    }
    let chosen: std::collections::HashSet<NodeId> = (0..50)
        .map(|k| plan_spread(&rsv(&format!("k{k}")), &one, &candidates, 3).expect("fits")[0].node_id.clone())
        .collect();
    let best_four: std::collections::HashSet<NodeId> = candidates[..4].iter().map(|c| c.node_id.clone()).collect();
    assert!(chosen.is_subset(&best_four), "only the best 1 + 3 nodes: {chosen:?}");
    assert!(chosen.len() > 1, "50 requests with spread 3 all landed on one node");
    // A node that cannot hold the share is never drawn, however wide the spread.
    let four = request(4, Topology::SameNode);
    let wide = plan_spread(&rsv("w"), &four, &candidates, 100).expect("fits");
    assert!(wide[0].devices.len() == 4 && candidates[3..].iter().any(|c| c.node_id == wide[0].node_id));
}

#[test]
fn scalars_fit_what_a_node_lends_over_its_busiest_instant_with_the_pools_overcommit() {
    let n = node(1, 8).node_id;
    let held = |resource: &str, capacity: u64, peak: i64| ScalarHeld {
        node_id: n.clone(),
        resource: resource.to_owned(),
        capacity,
        peak,
    };
    let wanted: BTreeMap<String, u64> = [("vcpu".to_owned(), 16), ("memoryGiB".to_owned(), 64)].into();
    let plain = PoolPolicy::default();
    let doubled = PoolPolicy { overcommit: [("vcpu".to_owned(), 2.0)].into(), ..PoolPolicy::default() };
    let busy = [held("vcpu", 32, 20), held("memoryGiB", 256, 0)];
    assert!(!scalars_fit(&plain, &wanted, &n, &busy), "20 of 32 vCPUs held: 16 more is 36");
    assert!(scalars_fit(&doubled, &wanted, &n, &busy), "twice 32 lends 64");
    let exact = [held("vcpu", 32, 16), held("memoryGiB", 64, 0)];
    assert!(scalars_fit(&plain, &wanted, &n, &exact), "a node filled exactly");
    assert!(!scalars_fit(&plain, &wanted, &n, &exact[..1]), "a node that reports no memory lends none");
    assert!(!scalars_fit(&plain, &wanted, &node(2, 8).node_id, &exact), "another node's rows are not this one's");
}
