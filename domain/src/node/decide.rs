//! The operator's decisions on a node: cordon, uncordon, maintenance, drain, delete, a new NodeSpec. Pure: the
//! facts that need a lookup (how many of the pool's nodes are already out, what still runs on the node) come
//! in with the command.

use std::collections::BTreeMap;

use super::{Node, NodeAt, NodeDeleted, NodeDrainStarted, NodeEvent, NodeFlagChanged, NodeSpec, NodeSpecChanged};
use crate::Rejection;
use crate::id::{NodeId, PoolId};

/// What the operator's decisions read of a node. The command layer builds it from the inline row; tests from
/// the fold of events ([`Node::verb_state`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerbState {
    pub id: NodeId,
    pub pool_id: PoolId,
    pub cordoned: bool,
    pub maintenance: bool,
    pub draining: bool,
    pub generation: u64,
    pub spec: NodeSpec,
}

impl Node {
    /// What the operator's decisions read of this node.
    pub fn verb_state(&self) -> VerbState {
        VerbState {
            id: self.id.clone(),
            pool_id: self.pool_id.clone(),
            cordoned: self.cordoned,
            maintenance: self.maintenance,
            draining: self.draining,
            generation: self.generation,
            spec: self.spec.clone(),
        }
    }
}

/// The pool's disruption budget and how much of it is spent, for a node about to go out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Disruption {
    /// The share of the pool's nodes that may be draining or in maintenance at once.
    pub budget: f64,
    /// The pool's nodes.
    pub nodes: i64,
    /// The pool's other nodes already draining or in maintenance.
    pub disrupted: i64,
}

/// How many of a pool's `nodes` may be draining or in maintenance at once: the `budget` share, at least one.
pub fn disruption_allowance(budget: f64, nodes: i64) -> i64 {
    ((budget * nodes as f64).floor() as i64).max(1)
}

impl Disruption {
    fn admits_one_more(&self, pool_id: &PoolId) -> Result<(), Rejection> {
        let allowed = disruption_allowance(self.budget, self.nodes);
        if self.disrupted + 1 > allowed {
            return Err(Rejection::Conflict(format!(
                "pool {pool_id}'s disruption budget ({}) allows {allowed} of its {} nodes draining or in maintenance \
                 at once, and {} already are",
                self.budget, self.nodes, self.disrupted
            )));
        }
        Ok(())
    }
}

/// An operator's command on a node.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeCommand {
    Cordon {
        reason: Option<String>,
        now_ms: i64,
    },
    Uncordon {
        reason: Option<String>,
        now_ms: i64,
    },
    StartMaintenance {
        reason: Option<String>,
        disruption: Disruption,
        now_ms: i64,
    },
    EndMaintenance {
        reason: Option<String>,
        now_ms: i64,
    },
    /// Cordon it and move its future bookings elsewhere; running reservations finish, or with `force` end.
    Drain {
        force: bool,
        reason: Option<String>,
        disruption: Disruption,
        now_ms: i64,
    },
    /// A drain whose node holds nothing running any more.
    CompleteDrain {
        now_ms: i64,
    },
    /// Remove it; `held` names the reservations placed or running on it (refused unless `force`).
    Delete {
        force: bool,
        reason: Option<String>,
        held: Vec<String>,
        now_ms: i64,
    },
    /// A new desired state: these labels, and a MIG layout when given.
    SetSpec {
        labels: BTreeMap<String, String>,
        mig_layout: Option<String>,
        now_ms: i64,
    },
}

/// The longest label key and value.
const MAX_LABEL_KEY: usize = 63;
const MAX_LABEL_VALUE: usize = 253;

/// Decides an operator's command: the events it causes (none when the node is already so), or why not.
pub fn decide(node: &VerbState, command: &NodeCommand) -> Result<Vec<NodeEvent>, Rejection> {
    let flag = |reason: &Option<String>, now_ms: i64| NodeFlagChanged {
        node_id: node.id.clone(),
        reason: reason.clone(),
        at_ms: now_ms,
    };
    Ok(match command {
        NodeCommand::Cordon { .. } if node.cordoned => Vec::new(),
        NodeCommand::Cordon { reason, now_ms } => vec![NodeEvent::Cordoned(flag(reason, *now_ms))],
        NodeCommand::Uncordon { .. } if !node.cordoned => Vec::new(),
        NodeCommand::Uncordon { reason, now_ms } => vec![NodeEvent::Uncordoned(flag(reason, *now_ms))],
        NodeCommand::StartMaintenance { .. } if node.maintenance => Vec::new(),
        NodeCommand::StartMaintenance { reason, disruption, now_ms } => {
            // A draining node already counts against the budget.
            if !node.draining {
                disruption.admits_one_more(&node.pool_id)?;
            }
            vec![NodeEvent::MaintenanceStarted(flag(reason, *now_ms))]
        }
        NodeCommand::EndMaintenance { .. } if !node.maintenance => Vec::new(),
        NodeCommand::EndMaintenance { reason, now_ms } => vec![NodeEvent::MaintenanceEnded(flag(reason, *now_ms))],
        NodeCommand::Drain { force: false, .. } if node.draining => Vec::new(),
        NodeCommand::Drain { force, reason, disruption, now_ms } => {
            if !node.draining && !node.maintenance {
                disruption.admits_one_more(&node.pool_id)?;
            }
            vec![NodeEvent::DrainStarted(NodeDrainStarted {
                node_id: node.id.clone(),
                force: *force,
                reason: reason.clone(),
                at_ms: *now_ms,
            })]
        }
        NodeCommand::CompleteDrain { .. } if !node.draining => Vec::new(),
        NodeCommand::CompleteDrain { now_ms } => {
            vec![NodeEvent::Drained(NodeAt { node_id: node.id.clone(), reason: None, at_ms: *now_ms })]
        }
        NodeCommand::Delete { force, reason, held, now_ms } => {
            if !held.is_empty() && !force {
                return Err(Rejection::Conflict(format!(
                    "node {} still holds reservations ({}); drain it first, or delete with force",
                    node.id,
                    held.join(", ")
                )));
            }
            vec![NodeEvent::Deleted(NodeDeleted {
                node_id: node.id.clone(),
                pool_id: node.pool_id.clone(),
                force: *force,
                reason: reason.clone(),
                at_ms: *now_ms,
            })]
        }
        NodeCommand::SetSpec { labels, mig_layout, now_ms } => {
            for (key, value) in labels {
                if key.is_empty()
                    || key.len() > MAX_LABEL_KEY
                    || value.len() > MAX_LABEL_VALUE
                    || key.chars().any(char::is_control)
                {
                    return Err(Rejection::invalid(
                        format!("labels.{key}"),
                        format!("keys are 1 to {MAX_LABEL_KEY} characters, values at most {MAX_LABEL_VALUE}"),
                    ));
                }
            }
            let mut spec = node.spec.clone();
            spec.labels = labels.clone();
            if mig_layout.is_some() {
                spec.mig_layout = mig_layout.clone();
            }
            vec![NodeEvent::SpecChanged(NodeSpecChanged {
                node_id: node.id.clone(),
                generation: node.generation + 1,
                spec,
                at_ms: *now_ms,
            })]
        }
    })
}
