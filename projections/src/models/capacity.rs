//! `pool_capacity_rollup`: per pool and resource, allocatable (atoms on schedulable nodes), allocated (atoms of
//! reservations binding, active or releasing), reserved (atoms of placed reservations not yet started) and
//! available (allocatable - allocated). Defined by state, not by the clock: starts and ends are events, so the
//! rollup changes only through events. What is free for a given window is a query on the bookings instead.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bc_domain::node::NodeEvent;
use bc_domain::reservation::{Requested, ReservationEvent, ReservationState};
use bc_domain::stream::AnyEvent;
use bc_eventstore::{Result, Tx, sql};
use futures_util::future::BoxFuture;
use sqlx::Row as _;

use super::axes::{Axes, NewNode, change_axes, schedulable};
use crate::framework::{Envelope, Projection};

/// Version 1 of the capacity rollup.
#[derive(Debug, Clone, Copy)]
pub struct CapacityRollupV1;

/// The node events the rollup handles, followed by `$more`: one list for the types it handles and for those whose
/// payload it reads.
macro_rules! with_node_types {
    ($($more:literal),* $(,)?) => {
        &[
            "node.registered",
            "node.cordoned",
            "node.uncordoned",
            "node.maintenance_started",
            "node.maintenance_ended",
            "node.joined",
            "node.adopted",
            "node.hardware_changed",
            "node.connectivity_changed",
            "node.condition_raised",
            "node.condition_cleared",
            "node.spec_observed",
            "node.drain_started",
            "node.deleted",
            // A move of the lifecycle changes whether the node is schedulable (it was never in a log before this
            // version's first rebuild, so following it changes no existing rollup).
            "node.provision_changed",
            $($more),*
        ]
    };
}

const EVENT_TYPES: &[&str] = with_node_types!(
    "reservation.requested",
    "reservation.placed",
    "reservation.binding_started",
    "reservation.activated",
    "reservation.release_requested",
    "reservation.released",
    "reservation.cancelled",
    "reservation.expired",
    "reservation.failed",
);

/// The types whose payload the rollup reads: the node events, and a reservation's request (its pool, resource and
/// count). Every other reservation event moves a hold's state, which its type alone says.
const PAYLOAD_TYPES: &[&str] = with_node_types!("reservation.requested");

/// A reservation event as the holds read it.
#[derive(Debug, Clone, Copy)]
enum HoldEvent<'a> {
    /// A new hold, pending.
    Requested(&'a Requested),
    /// A hold moved to this state.
    Moved(ReservationState),
}

impl Projection for CapacityRollupV1 {
    fn name(&self) -> &'static str {
        "pool_capacity_rollup"
    }

    fn version(&self) -> u32 {
        1
    }

    fn event_types(&self) -> &'static [&'static str] {
        EVENT_TYPES
    }

    fn tables(&self) -> &'static [&'static str] {
        &["pool_capacity_rollup_v1", "pool_capacity_nodes_v1", "pool_capacity_holds_v1"]
    }

    fn payload_types(&self) -> Option<&'static [&'static str]> {
        Some(PAYLOAD_TYPES)
    }

    fn apply<'a>(&'a self, tx: &'a mut Tx, events: &'a [Envelope]) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            // Node events touch only the node rows, reservation events only the holds: apply the rare node
            // events one by one and fold the reservation events in one pass.
            // A pool whose nodes changed has its rollup row computed again from the node rows and the holds; one
            // whose holds changed only has the holds' differences added, so a batch costs what it changed, not
            // what the pool holds.
            let mut nodes_changed: BTreeSet<Key> = BTreeSet::new();
            for envelope in events {
                if let Some(key) = apply_node(tx, envelope).await? {
                    nodes_changed.insert(key);
                }
            }
            let holds: Vec<(&str, HoldEvent<'_>)> = events
                .iter()
                .filter_map(|envelope| {
                    let stream = envelope.recorded.stream_id.as_str();
                    match &envelope.event {
                        Some(AnyEvent::Reservation(ReservationEvent::Requested(e))) => {
                            Some((stream, HoldEvent::Requested(e)))
                        }
                        _ => ReservationEvent::state_after_type(&envelope.recorded.event_type)
                            .map(|state| (stream, HoldEvent::Moved(state))),
                    }
                })
                .collect();
            let deltas = apply_holds(tx, &holds).await?;
            add_deltas(tx, nodes_changed, &deltas).await
        })
    }
}

/// Applies one node event to the rollup's node rows; returns the (pool, resource) it touched.
async fn apply_node(tx: &mut Tx, envelope: &Envelope) -> Result<Option<(String, String)>> {
    let Some(AnyEvent::Node(event)) = &envelope.event else { return Ok(None) };
    let pool_owner = envelope.recorded.tenant_id.clone().unwrap_or_default();
    if let Some(node) = NewNode::of(event, &pool_owner)? {
        let (Some(resource), atoms) = node.atoms() else { return Ok(None) };
        let axes = &node.axes;
        sql::query(
            "INSERT INTO pool_capacity_nodes_v1 (node_id, pool_id, pool_owner_tenant_id, resource, atoms, role, trust,
                                                 owner_tenant_id, provision_state, connectivity, no_schedule_reasons,
                                                 observed_generation, maintenance, cordoned, schedulable)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, false, false, $13)",
        )
        .bind(node.node_id.as_str())
        .bind(node.pool_id.as_str())
        .bind(&pool_owner)
        .bind(resource)
        .bind(atoms as i32)
        .bind(&axes.role)
        .bind(&axes.trust)
        .bind(&axes.owner_tenant_id)
        .bind(&axes.provision_state)
        .bind(&axes.connectivity)
        .bind(&axes.no_schedule_reasons)
        .bind(axes.observed_generation)
        .bind(schedulable(axes)?)
        .execute(tx.conn())
        .await?;
        return Ok(Some((node.pool_id.to_string(), resource.to_owned())));
    }
    let node_id = event.node_id().as_str();
    let row = sql::query(
        "SELECT pool_id, resource, role, trust, owner_tenant_id, pool_owner_tenant_id, provision_state, connectivity,
                no_schedule_reasons, observed_generation, maintenance, cordoned
         FROM pool_capacity_nodes_v1 WHERE node_id = $1",
    )
    .bind(node_id)
    .fetch_optional(tx.conn())
    .await?;
    let Some(row) = row else { return Ok(None) };
    let touched = (row.try_get("pool_id")?, row.try_get("resource")?);
    match event {
        NodeEvent::Deleted(_) => {
            sql::query("DELETE FROM pool_capacity_nodes_v1 WHERE node_id = $1")
                .bind(node_id)
                .execute(tx.conn())
                .await?;
            return Ok(Some(touched));
        }
        NodeEvent::HardwareChanged(e) => {
            let atoms = e.devices.iter().filter(|d| d.bookable).count();
            sql::query("UPDATE pool_capacity_nodes_v1 SET atoms = $2 WHERE node_id = $1")
                .bind(node_id)
                .bind(atoms as i32)
                .execute(tx.conn())
                .await?;
            return Ok(Some(touched));
        }
        _ => {}
    }
    let mut axes = Axes::from_row(&row)?;
    if !change_axes(&mut axes, event)? {
        return Ok(None);
    }
    sql::query(
        "UPDATE pool_capacity_nodes_v1
            SET provision_state = $2, connectivity = $3, no_schedule_reasons = $4, observed_generation = $5,
                maintenance = $6, cordoned = $7, schedulable = $8
          WHERE node_id = $1",
    )
    .bind(node_id)
    .bind(&axes.provision_state)
    .bind(&axes.connectivity)
    .bind(&axes.no_schedule_reasons)
    .bind(axes.observed_generation)
    .bind(axes.maintenance)
    .bind(axes.cordoned)
    .bind(schedulable(&axes)?)
    .execute(tx.conn())
    .await?;
    Ok(Some(touched))
}

/// One reservation's hold on its pool's atoms.
#[derive(Debug, Clone)]
struct Hold {
    pool_id: String,
    resource: String,
    count: i32,
    state: ReservationState,
}

/// A rollup row's key: (pool, resource).
type Key = (String, String);

/// What holds changed in a rollup row: atoms allocated and reserved, added (or taken away when negative).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Delta {
    allocated: i64,
    reserved: i64,
}

impl Hold {
    /// What this hold counts in its rollup row: a reservation binding, active or releasing has its atoms allocated,
    /// a placed one reserved; any other state counts nothing.
    fn counts(&self) -> Delta {
        let count = i64::from(self.count);
        match self.state {
            ReservationState::Binding | ReservationState::Active | ReservationState::Releasing => {
                Delta { allocated: count, reserved: 0 }
            }
            ReservationState::Placed => Delta { allocated: 0, reserved: count },
            _ => Delta::default(),
        }
    }

    fn key(&self) -> Key {
        (self.pool_id.clone(), self.resource.clone())
    }
}

/// Folds the batch's reservation events onto their holds (loaded in one statement), then writes the live holds
/// back in one upsert and deletes the ended ones: an ended reservation holds nothing. Returns, for every rollup row
/// a changed hold belongs to, what the batch added to it (zero when a hold changed without counting differently).
async fn apply_holds(tx: &mut Tx, events: &[(&str, HoldEvent<'_>)]) -> Result<BTreeMap<Key, Delta>> {
    let mut deltas: BTreeMap<Key, Delta> = BTreeMap::new();
    if events.is_empty() {
        return Ok(deltas);
    }
    let ids = super::continued(events, |event| matches!(event, HoldEvent::Requested(_)));
    let mut holds: HashMap<String, Hold> = HashMap::with_capacity(events.len());
    if !ids.is_empty() {
        let rows = sql::query(
            "SELECT reservation_id, pool_id, resource, count, state FROM pool_capacity_holds_v1
             WHERE reservation_id = ANY($1::text[])",
        )
        .bind(&ids)
        .fetch_all(tx.conn())
        .await?;
        for row in rows {
            let state: String = row.try_get("state")?;
            let state = ReservationState::ALL
                .into_iter()
                .find(|known| known.as_str() == state)
                .ok_or_else(|| bc_eventstore::Error::Internal(format!("a stored hold's state {state:?} is unknown")))?;
            holds.insert(
                row.try_get("reservation_id")?,
                Hold {
                    pool_id: row.try_get("pool_id")?,
                    resource: row.try_get("resource")?,
                    count: row.try_get("count")?,
                    state,
                },
            );
        }
    }
    // What the stored holds counted before the batch; a hold the batch creates counted nothing.
    let before: HashMap<String, (Key, Delta)> =
        holds.iter().map(|(id, hold)| (id.clone(), (hold.key(), hold.counts()))).collect();
    let mut changed: BTreeSet<&str> = BTreeSet::new();
    for (id, event) in events {
        match event {
            HoldEvent::Requested(e) => {
                let hold = Hold {
                    pool_id: e.request.pool_id.to_string(),
                    resource: e.request.resource().to_owned(),
                    count: e.request.devices.count as i32,
                    state: ReservationState::Pending,
                };
                holds.insert((*id).to_owned(), hold);
            }
            HoldEvent::Moved(state) => {
                let Some(hold) = holds.get_mut(*id) else { continue };
                hold.state = *state;
            }
        }
        changed.insert(id);
    }
    let (mut live, mut ended): (Vec<&str>, Vec<&str>) = (Vec::new(), Vec::new());
    for id in &changed {
        let hold = &holds[*id];
        if let Some((key, counted)) = before.get(*id) {
            let delta = deltas.entry(key.clone()).or_default();
            delta.allocated -= counted.allocated;
            delta.reserved -= counted.reserved;
        }
        // An ended hold counts nothing (`counts` of a terminal state), and its row, if it had one before the batch, is
        // deleted below: one the batch both opened and ended was never written.
        let counts = hold.counts();
        let delta = deltas.entry(hold.key()).or_default();
        delta.allocated += counts.allocated;
        delta.reserved += counts.reserved;
        if !hold.state.is_terminal() {
            live.push(id);
        } else if before.contains_key(*id) {
            ended.push(id);
        }
    }
    let pools: Vec<&str> = live.iter().map(|id| holds[*id].pool_id.as_str()).collect();
    let resources: Vec<&str> = live.iter().map(|id| holds[*id].resource.as_str()).collect();
    let counts: Vec<i32> = live.iter().map(|id| holds[*id].count).collect();
    let states: Vec<&str> = live.iter().map(|id| holds[*id].state.as_str()).collect();
    if !live.is_empty() {
        sql::query(
            "INSERT INTO pool_capacity_holds_v1 (reservation_id, pool_id, resource, count, state)
             SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::int4[], $5::text[])
             ON CONFLICT (reservation_id) DO UPDATE SET state = excluded.state",
        )
        .bind(&live)
        .bind(&pools)
        .bind(&resources)
        .bind(&counts)
        .bind(&states)
        .execute(tx.conn())
        .await?;
    }
    if !ended.is_empty() {
        sql::query("DELETE FROM pool_capacity_holds_v1 WHERE reservation_id = ANY($1::text[])")
            .bind(&ended)
            .execute(tx.conn())
            .await?;
    }
    Ok(deltas)
}

/// Adds the holds' differences to their rollup rows, and computes again from the rollup's own state the rows of
/// `recompute` (pools whose nodes changed) and the rows that do not exist yet.
async fn add_deltas(tx: &mut Tx, mut recompute: BTreeSet<Key>, deltas: &BTreeMap<Key, Delta>) -> Result<()> {
    let added: Vec<(&Key, &Delta)> = deltas.iter().filter(|(key, _)| !recompute.contains(*key)).collect();
    if !added.is_empty() {
        let pools: Vec<&str> = added.iter().map(|(key, _)| key.0.as_str()).collect();
        let resources: Vec<&str> = added.iter().map(|(key, _)| key.1.as_str()).collect();
        let allocated: Vec<i32> = added.iter().map(|(_, d)| d.allocated as i32).collect();
        let reserved: Vec<i32> = added.iter().map(|(_, d)| d.reserved as i32).collect();
        let rows = sql::query(
            "UPDATE pool_capacity_rollup_v1 AS r
                SET allocated = r.allocated + d.allocated, reserved = r.reserved + d.reserved,
                    available = r.allocatable - (r.allocated + d.allocated)
               FROM unnest($1::text[], $2::text[], $3::int4[], $4::int4[]) AS d(pool_id, resource, allocated, reserved)
              WHERE r.pool_id = d.pool_id AND r.resource = d.resource
             RETURNING r.pool_id, r.resource",
        )
        .bind(&pools)
        .bind(&resources)
        .bind(&allocated)
        .bind(&reserved)
        .fetch_all(tx.conn())
        .await?;
        let mut updated: BTreeSet<Key> = BTreeSet::new();
        for row in rows {
            updated.insert((row.try_get("pool_id")?, row.try_get("resource")?));
        }
        recompute.extend(added.into_iter().map(|(key, _)| key.clone()).filter(|key| !updated.contains(key)));
    }
    refresh(tx, &recompute).await
}

/// Recomputes the rollup rows of the touched (pool, resource) pairs from the rollup's own state.
async fn refresh(tx: &mut Tx, touched: &BTreeSet<Key>) -> Result<()> {
    if touched.is_empty() {
        return Ok(());
    }
    let (pools, resources): (Vec<String>, Vec<String>) = touched.iter().cloned().unzip();
    sql::query(
        "INSERT INTO pool_capacity_rollup_v1 (pool_id, resource, allocatable, allocated, reserved, available)
         SELECT t.pool_id, t.resource, c.allocatable, c.allocated, c.reserved, c.allocatable - c.allocated
         FROM unnest($1::text[], $2::text[]) AS t(pool_id, resource)
         CROSS JOIN LATERAL (
             SELECT coalesce((SELECT sum(n.atoms) FROM pool_capacity_nodes_v1 AS n
                              WHERE n.pool_id = t.pool_id AND n.resource = t.resource AND n.schedulable), 0)::int
                        AS allocatable,
                    coalesce((SELECT sum(h.count) FROM pool_capacity_holds_v1 AS h
                              WHERE h.pool_id = t.pool_id AND h.resource = t.resource
                                AND h.state IN ('binding', 'active', 'releasing')), 0)::int AS allocated,
                    coalesce((SELECT sum(h.count) FROM pool_capacity_holds_v1 AS h
                              WHERE h.pool_id = t.pool_id AND h.resource = t.resource AND h.state = 'placed'), 0)::int
                        AS reserved
         ) AS c
         ON CONFLICT (pool_id, resource) DO UPDATE
             SET allocatable = excluded.allocatable, allocated = excluded.allocated, reserved = excluded.reserved,
                 available = excluded.available",
    )
    .bind(&pools)
    .bind(&resources)
    .execute(tx.conn())
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{EVENT_TYPES, PAYLOAD_TYPES};

    #[test]
    fn the_payloads_read_are_every_node_event_handled_and_the_request() {
        let expected: Vec<&str> = EVENT_TYPES
            .iter()
            .copied()
            .filter(|event_type| !event_type.starts_with("reservation.") || *event_type == "reservation.requested")
            .collect();
        assert_eq!(PAYLOAD_TYPES, expected.as_slice());
    }
}
