//! The read models, each an asynchronous projection with versioned tables.

pub mod audit;
mod axes;
pub mod capacity;
pub mod folded;
pub mod ledger;
pub mod nodes;
pub mod pools;
pub mod reservations;

use std::sync::Arc;

use bc_eventstore::{Error, Result};

use crate::framework::Projection;

/// Every read model this build serves, at the versions it builds.
pub fn read_models() -> Vec<Arc<dyn Projection>> {
    vec![
        Arc::new(pools::PoolsV2),
        Arc::new(nodes::NodesV2),
        Arc::new(reservations::ReservationsV3),
        Arc::new(capacity::CapacityRollupV1),
        Arc::new(audit::AuditV1),
        Arc::new(ledger::LedgerV1),
    ]
}

pub(crate) fn json(value: &impl serde::Serialize) -> Result<String> {
    serde_json::to_string(value).map_err(|err| Error::Internal(format!("encode a read-model column: {err}")))
}

/// The wire spelling of a string enum.
pub(crate) fn text<T: serde::Serialize>(value: &T) -> Result<String> {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => Ok(s),
        other => Err(Error::Internal(format!("expected a string enum, got {other:?}"))),
    }
}
