//! The read models, each an asynchronous projection with versioned tables.

pub mod audit;
mod axes;
pub mod capacity;
pub mod folded;
pub mod ledger;
pub mod nodes;
pub mod pools;
pub mod reservations;

use std::collections::HashMap;
use std::hash::BuildHasher;
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

/// Folds one event onto the state `folded` keeps for `id` (none before the stream's first), through `evolve`: the
/// state it answers is kept, and one it ends (`None`) leaves the map. The key's string comes back out with its
/// state, so a stream's later events in the batch reuse it. Whether a state is kept.
pub(crate) fn evolve_in<S, H: BuildHasher>(
    folded: &mut HashMap<String, S, H>,
    id: &str,
    evolve: impl FnOnce(Option<S>) -> Option<S>,
) -> bool {
    let (key, state) = match folded.remove_entry(id) {
        Some((key, state)) => (key, Some(state)),
        None => (id.to_owned(), None),
    };
    match evolve(state) {
        Some(next) => {
            folded.insert(key, next);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::{continued, evolve_in};
    use std::collections::HashMap;

    #[test]
    fn a_fold_keeps_what_evolve_answers_and_drops_what_it_ends() {
        let mut folded: HashMap<String, u32> = HashMap::new();
        assert!(evolve_in(&mut folded, "a", |state| Some(state.unwrap_or(0) + 1)), "a stream's first event");
        assert!(evolve_in(&mut folded, "a", |state| Some(state.unwrap_or(0) + 1)));
        assert!(!evolve_in(&mut folded, "b", |_| None), "an event that starts nothing");
        assert_eq!(folded, HashMap::from([("a".to_owned(), 2)]));
        let mut seen = None;
        assert!(!evolve_in(&mut folded, "a", |state| {
            seen = state;
            None
        }));
        assert_eq!(seen, Some(2), "evolve is handed the state kept");
        assert!(folded.is_empty(), "a state evolve ends leaves the map");
    }

    #[test]
    fn a_stream_the_batch_opens_is_not_loaded_and_one_it_continues_is() {
        let events = [("b", "requested"), ("a", "placed"), ("b", "placed"), ("c", "cancelled"), ("a", "cancelled")];
        assert_eq!(continued(&events, |event: &&str| *event == "requested"), vec!["a", "c"]);
    }
}
