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
use foldhash::{HashSet, HashSetExt};

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

/// The streams of a batch that began before it, sorted: those whose first event in the batch is not one that opens a
/// stream (`opens`). Only these can have a row to load. A stream the batch opens has none yet, and asking for it
/// anyway made the load's list nearly as long as the batch: against a table without statistics yet (a version
/// being built), the planner then scanned the whole table for every batch.
pub(crate) fn continued<'a, E>(events: &[(&'a str, E)], opens: impl Fn(&E) -> bool) -> Vec<&'a str> {
    let mut seen = HashSet::with_capacity(events.len());
    let mut ids: Vec<&'a str> =
        events.iter().filter(|(id, event)| seen.insert(*id) && !opens(event)).map(|(id, _)| *id).collect();
    ids.sort_unstable();
    ids
}

#[cfg(test)]
mod tests {
    use super::continued;

    #[test]
    fn a_stream_the_batch_opens_is_not_loaded_and_one_it_continues_is() {
        let events = [("b", "requested"), ("a", "placed"), ("b", "placed"), ("c", "cancelled"), ("a", "cancelled")];
        assert_eq!(continued(&events, |event: &&str| *event == "requested"), vec!["a", "c"]);
    }
}
