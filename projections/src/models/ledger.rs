//! `ledger`: the GPU-hour ledger. Per pool, tenant and UTC hour: the atom-hours booked, the part of them bound
//! (the reservation active) and idle (booked, not bound); per pool and hour the capacity (the atoms its nodes had,
//! for the part of the hour they were in the pool) and what is free (capacity less every tenant's booked).
//!
//! The model keeps intervals, not hours: one row per reservation (its atoms, the interval they were booked and the
//! part of it bound) and one per stretch of a node's atoms, so each event changes one row and a rebuild writes
//! about one row per reservation. [`read`] sums them into hours when asked, in one statement per kind of row.
//! Everything comes from the events' own times (`atMs`, the window's `startMs` and `endMs`), never the clock, so
//! an hour's figures change only through events: a booking placed for next week counts in next week's hours, and
//! an active reservation's bound part runs to its booked end until an event says otherwise.

use std::collections::BTreeMap;

use bc_domain::device::Device;
use bc_domain::node::NodeEvent;
use bc_domain::reservation::{Allocation, ReservationEvent};
use bc_domain::stream::AnyEvent;
use bc_eventstore::{Result, Tx, sql};
use foldhash::{HashMap, HashMapExt, HashSet};
use futures_util::future::BoxFuture;
use sqlx::{AssertSqlSafe, Row as _};

use crate::framework::{Envelope, Projection};

/// An hour, in milliseconds.
pub const HOUR_MS: i64 = 3_600_000;

/// Version 1 of the ledger.
#[derive(Debug, Clone, Copy)]
pub struct LedgerV1;

const EVENT_TYPES: &[&str] = &[
    "node.registered",
    "node.joined",
    "node.hardware_changed",
    "node.deleted",
    "reservation.requested",
    "reservation.placed",
    "reservation.replaced",
    "reservation.extended",
    "reservation.activated",
    "reservation.release_requested",
    "reservation.released",
    "reservation.cancelled",
    "reservation.expired",
    "reservation.failed",
];

impl Projection for LedgerV1 {
    fn name(&self) -> &'static str {
        "ledger"
    }

    fn version(&self) -> u32 {
        1
    }

    fn event_types(&self) -> &'static [&'static str] {
        EVENT_TYPES
    }

    fn tables(&self) -> &'static [&'static str] {
        &["ledger_bookings_v1", "ledger_capacity_v1"]
    }

    fn apply<'a>(&'a self, tx: &'a mut Tx, events: &'a [Envelope]) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            // Node events are rare: one by one. Reservation events are most of a log: folded in one pass.
            for envelope in events {
                if let Some(AnyEvent::Node(event)) = &envelope.event {
                    apply_node(tx, event).await?;
                }
            }
            let reservations: Vec<(&str, &ReservationEvent)> = events
                .iter()
                .filter_map(|envelope| match &envelope.event {
                    Some(AnyEvent::Reservation(event)) => Some((envelope.recorded.stream_id.as_str(), event)),
                    _ => None,
                })
                .collect();
            apply_bookings(tx, &reservations).await
        })
    }
}

/// One reservation as the ledger keeps it: what it books, for how long, and how much of that it was bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Booking {
    pub pool_id: String,
    pub tenant_id: String,
    /// Its atoms (GPUs, MIG slices, slots or whole machines, whatever its pool books).
    pub atoms: i32,
    /// The interval its atoms were booked, `[from, to)` in epoch milliseconds; `None` until placed.
    pub booked: Option<(i64, i64)>,
    /// When it became active (bound to its workload).
    pub bound_from: Option<i64>,
    /// When it stopped being active (a release asked for, or its end); `None` while it is: until its booked end.
    pub bound_to: Option<i64>,
    /// The GPUs its atoms are on, as `<node>/<gpu uuid>` (`<node>/*` for a whole machine), sorted.
    pub gpus: Vec<String>,
}

/// Applies one event of a reservation's stream to what the ledger keeps of it. `None`: nothing to keep (a denial,
/// or a reservation that ended without ever being placed, which booked nothing).
pub fn evolve(state: Option<Booking>, event: &ReservationEvent) -> Option<Booking> {
    let mut b = match (state, event) {
        (None, ReservationEvent::Requested(e)) => {
            return Some(Booking {
                pool_id: e.request.pool_id.to_string(),
                tenant_id: e.tenant_id.to_string(),
                atoms: i32::try_from(e.request.devices.count).unwrap_or(i32::MAX),
                booked: None,
                bound_from: None,
                bound_to: None,
                gpus: Vec::new(),
            });
        }
        (None, _) => return None,
        (Some(b), _) => b,
    };
    match event {
        ReservationEvent::Requested(_) | ReservationEvent::Denied(_) => {}
        ReservationEvent::Placed(e) => {
            b.booked = Some((e.start_ms, e.end_ms.max(e.start_ms)));
            b.gpus = gpus_of(&e.allocations);
        }
        ReservationEvent::Replaced(e) => b.gpus = gpus_of(&e.allocations),
        ReservationEvent::Extended(e) => {
            if let Some((from, _)) = b.booked {
                b.booked = Some((from, e.end_ms.max(from)));
            }
        }
        ReservationEvent::Activated(e) => b.bound_from = Some(e.at_ms),
        ReservationEvent::ReleaseRequested(e) => {
            if b.bound_from.is_some() && b.bound_to.is_none() {
                b.bound_to = Some(e.at_ms);
            }
        }
        ReservationEvent::BindingStarted(_) | ReservationEvent::Renewed(_) => {}
        ReservationEvent::Cancelled(_)
        | ReservationEvent::Released(_)
        | ReservationEvent::Expired(_)
        | ReservationEvent::Failed(_) => {}
    }
    if let Some(at) = event.ends_bookings_at() {
        let (from, to) = b.booked?;
        b.booked = Some((from, at.clamp(from, to)));
        if b.bound_from.is_some() {
            b.bound_to = Some(b.bound_to.map_or(at, |to| to.min(at)));
        }
    }
    Some(b)
}

/// The GPUs of a reservation's allocations, as `<node>/<gpu uuid>`: an atom's GPU is its id's first part (a MIG
/// slice is `<uuid>/gi<g>/ci<c>`, a slot `<uuid>/s<k>`); a whole machine (`<node>/node`) is every GPU of its node.
fn gpus_of(allocations: &[Allocation]) -> Vec<String> {
    let mut gpus: Vec<String> = allocations
        .iter()
        .flat_map(|a| {
            let node = a.node_id.as_str();
            a.devices.iter().map(move |device| {
                let id = device.as_str();
                if id == format!("{node}/node") {
                    format!("{node}/*")
                } else {
                    format!("{node}/{}", id.split('/').next().unwrap_or(id))
                }
            })
        })
        .collect();
    gpus.sort_unstable();
    gpus.dedup();
    gpus
}

/// A text array as PostgreSQL reads it (`{"a","b"}`): every item quoted, its quotes and backslashes escaped.
fn array_literal(items: &[String]) -> String {
    let quoted: Vec<String> =
        items.iter().map(|item| format!("\"{}\"", item.replace('\\', "\\\\").replace('"', "\\\""))).collect();
    format!("{{{}}}", quoted.join(","))
}

/// Folds the batch's reservation events onto the rows they continue (read in one statement), then writes the rows
/// the batch started with one `COPY`, the ones it continued with one `UPDATE`, and deletes the ones left with
/// nothing to keep.
async fn apply_bookings(tx: &mut Tx, events: &[(&str, &ReservationEvent)]) -> Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let ids = super::continued(events, |event| event.opens_stream());
    let mut rows = load(tx, &ids).await?;
    let existing: HashSet<String> = rows.keys().cloned().collect();
    let mut touched: Vec<&str> = Vec::new();
    for (id, event) in events {
        super::evolve_in(&mut rows, id, |state| evolve(state, event));
        touched.push(id);
    }
    touched.sort_unstable();
    touched.dedup();
    let (mut new, mut continued, mut gone) = (Vec::new(), Vec::new(), Vec::new());
    for id in touched {
        match (rows.get(id), existing.contains(id)) {
            (Some(row), false) => new.push((id, row)),
            (Some(row), true) => continued.push((id, row)),
            (None, true) => gone.push(id),
            (None, false) => {}
        }
    }
    copy_new(tx, &new).await?;
    update(tx, &continued).await?;
    if !gone.is_empty() {
        sql::query("DELETE FROM ledger_bookings_v1 WHERE reservation_id = ANY($1::text[])")
            .bind(&gone)
            .execute(tx.conn())
            .await?;
    }
    Ok(())
}

/// The rows of `ids`, by reservation id.
async fn load(tx: &mut Tx, ids: &[&str]) -> Result<HashMap<String, Booking>> {
    let mut rows = HashMap::with_capacity(ids.len());
    if ids.is_empty() {
        return Ok(rows);
    }
    let found = sql::query(
        "SELECT reservation_id, pool_id, tenant_id, atoms, booked_from, booked_to, bound_from, bound_to, gpus
         FROM ledger_bookings_v1 WHERE reservation_id = ANY($1::text[])",
    )
    .bind(ids)
    .fetch_all(tx.conn())
    .await?;
    for row in found {
        let from: Option<i64> = row.try_get("booked_from")?;
        let to: Option<i64> = row.try_get("booked_to")?;
        rows.insert(
            row.try_get("reservation_id")?,
            Booking {
                pool_id: row.try_get("pool_id")?,
                tenant_id: row.try_get("tenant_id")?,
                atoms: row.try_get("atoms")?,
                booked: from.zip(to),
                bound_from: row.try_get("bound_from")?,
                bound_to: row.try_get("bound_to")?,
                gpus: row.try_get("gpus")?,
            },
        );
    }
    Ok(rows)
}

/// Writes the rows of the reservations the batch started (none has a row yet) with one `COPY`.
async fn copy_new(tx: &mut Tx, new: &[(&str, &Booking)]) -> Result<()> {
    let mut rows = sql::CopyRows::new();
    for (id, b) in new {
        rows.text(Some(id)).text(Some(&b.pool_id)).text(Some(&b.tenant_id)).int4(b.atoms);
        rows.opt_int8(b.booked.map(|(from, _)| from))
            .opt_int8(b.booked.map(|(_, to)| to))
            .opt_int8(b.bound_from)
            .opt_int8(b.bound_to)
            .text_array(&b.gpus);
        rows.end_row();
    }
    rows.copy_in(
        tx,
        "COPY ledger_bookings_v1 (reservation_id, pool_id, tenant_id, atoms, booked_from, booked_to, bound_from,
                                  bound_to, gpus) FROM STDIN (FORMAT binary)",
    )
    .await?;
    Ok(())
}

/// Writes the rows the batch continued back, in one statement.
async fn update(tx: &mut Tx, continued: &[(&str, &Booking)]) -> Result<()> {
    if continued.is_empty() {
        return Ok(());
    }
    let ids: Vec<&str> = continued.iter().map(|(id, _)| *id).collect();
    let from: Vec<Option<i64>> = continued.iter().map(|(_, b)| b.booked.map(|(from, _)| from)).collect();
    let to: Vec<Option<i64>> = continued.iter().map(|(_, b)| b.booked.map(|(_, to)| to)).collect();
    let bound_from: Vec<Option<i64>> = continued.iter().map(|(_, b)| b.bound_from).collect();
    let bound_to: Vec<Option<i64>> = continued.iter().map(|(_, b)| b.bound_to).collect();
    let gpus: Vec<String> = continued.iter().map(|(_, b)| array_literal(&b.gpus)).collect();
    sql::query(
        "UPDATE ledger_bookings_v1 AS l
            SET booked_from = u.booked_from, booked_to = u.booked_to, bound_from = u.bound_from,
                bound_to = u.bound_to, gpus = u.gpus::text[]
           FROM unnest($1::text[], $2::int8[], $3::int8[], $4::int8[], $5::int8[], $6::text[])
                AS u(reservation_id, booked_from, booked_to, bound_from, bound_to, gpus)
          WHERE l.reservation_id = u.reservation_id",
    )
    .bind(&ids)
    .bind(&from)
    .bind(&to)
    .bind(&bound_from)
    .bind(&bound_to)
    .bind(&gpus)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// A node's bookable atoms.
fn atoms(devices: &[Device]) -> i32 {
    i32::try_from(devices.iter().filter(|d| d.bookable).count()).unwrap_or(i32::MAX)
}

/// Opens, changes or closes the node's stretch of atoms.
async fn apply_node(tx: &mut Tx, event: &NodeEvent) -> Result<()> {
    match event {
        NodeEvent::Registered(e) => open(tx, e.node_id.as_str(), e.pool_id.as_str(), atoms(&e.devices), e.at_ms).await,
        NodeEvent::Joined(e) => open(tx, e.node_id.as_str(), e.pool_id.as_str(), atoms(&e.devices), e.at_ms).await,
        NodeEvent::HardwareChanged(e) => change(tx, e.node_id.as_str(), atoms(&e.devices), e.at_ms).await,
        NodeEvent::Deleted(e) => close(tx, e.node_id.as_str(), e.at_ms).await,
        _ => Ok(()),
    }
}

async fn open(tx: &mut Tx, node: &str, pool: &str, atoms: i32, at_ms: i64) -> Result<()> {
    sql::query(
        "INSERT INTO ledger_capacity_v1 (node_id, pool_id, atoms, from_ms) VALUES ($1, $2, $3, $4)
         ON CONFLICT (node_id, from_ms) DO UPDATE SET pool_id = excluded.pool_id, atoms = excluded.atoms, to_ms = NULL",
    )
    .bind(node)
    .bind(pool)
    .bind(atoms)
    .bind(at_ms)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// A new number of atoms from `at_ms` on: the open stretch ends there and a new one begins (or, when the open one
/// began at that instant, or after it, it takes the new number itself).
async fn change(tx: &mut Tx, node: &str, atoms: i32, at_ms: i64) -> Result<()> {
    let row = sql::query("SELECT pool_id, atoms, from_ms FROM ledger_capacity_v1 WHERE node_id = $1 AND to_ms IS NULL")
        .bind(node)
        .fetch_optional(tx.conn())
        .await?;
    let Some(row) = row else { return Ok(()) };
    let (pool, held, from): (String, i32, i64) =
        (row.try_get("pool_id")?, row.try_get("atoms")?, row.try_get("from_ms")?);
    if held == atoms {
        return Ok(());
    }
    if at_ms <= from {
        sql::query("UPDATE ledger_capacity_v1 SET atoms = $3 WHERE node_id = $1 AND from_ms = $2")
            .bind(node)
            .bind(from)
            .bind(atoms)
            .execute(tx.conn())
            .await?;
        return Ok(());
    }
    close(tx, node, at_ms).await?;
    open(tx, node, &pool, atoms, at_ms).await
}

/// The node's open stretch ends at `at_ms` (one that would end before it began is dropped).
async fn close(tx: &mut Tx, node: &str, at_ms: i64) -> Result<()> {
    sql::query(
        "WITH dropped AS (DELETE FROM ledger_capacity_v1 WHERE node_id = $1 AND to_ms IS NULL AND from_ms >= $2)
         UPDATE ledger_capacity_v1 SET to_ms = $2 WHERE node_id = $1 AND to_ms IS NULL AND from_ms < $2",
    )
    .bind(node)
    .bind(at_ms)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// Whose rows a read may show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every pool's and every tenant's (the metrics scrape, the platform's tools).
    Fleet,
    /// A tenant's view: every tenant's rows of the pools it owns, its own rows in any pool, and the pool rows
    /// (capacity, booked, free) of the pools it can see (those it owns or is offered).
    Tenant { tenant_id: String, owned: Vec<String>, visible: Vec<String> },
}

/// What to read: the hours `[from_ms, to_ms)` (whole UTC hours), of one pool or all, as `scope` may see them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerQuery<'a> {
    pub from_ms: i64,
    pub to_ms: i64,
    pub pool_id: Option<&'a str>,
    pub scope: &'a Scope,
}

/// One pool's hour, in atom-milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolHour {
    pub pool_id: String,
    /// The hour's start, epoch milliseconds.
    pub hour_ms: i64,
    pub capacity: i64,
    /// Every tenant's booked atom-time.
    pub booked: i64,
}

impl PoolHour {
    /// Capacity no booking holds (negative only if bookings outlived their atoms).
    pub fn free(&self) -> i64 {
        self.capacity - self.booked
    }
}

/// One tenant's hour in one pool, in atom-milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantHour {
    pub pool_id: String,
    pub tenant_id: String,
    pub hour_ms: i64,
    pub booked: i64,
    /// The part of `booked` its reservations were active.
    pub bound: i64,
    /// The mean utilization (0 to 100) its agents sampled on the GPUs of its reservations bound in the hour;
    /// `None` where none was sampled.
    pub utilization: Option<f64>,
}

impl TenantHour {
    /// Booked, not bound.
    pub fn idle(&self) -> i64 {
        self.booked - self.bound
    }
}

/// A read of the ledger.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LedgerHours {
    /// By pool, then hour.
    pub pools: Vec<PoolHour>,
    /// By pool, then hour, then tenant.
    pub tenants: Vec<TenantHour>,
}

/// The hours of the booking aliased `b` that overlap `[$1, $2)`: from its first hour (or the range's) to its last
/// (or the range's).
const BOOKED_HOURS: &str = "generate_series(greatest($1, b.booked_from - b.booked_from % 3600000),
                                  least($2 - 3600000, (b.booked_to - 1) - (b.booked_to - 1) % 3600000), 3600000)";

/// Reads the ledger's hours from version `version`'s tables (two statements; call it in a repeatable-read
/// transaction for one snapshot; it turns JIT compilation off for the rest of it). Each booking is cut into the
/// hours it overlaps; each hour's figures are sums of atoms times the milliseconds they overlap it. A tenant's
/// utilization in an hour is the mean of the samples taken in that hour of each GPU it held bound in it (a GPU
/// shared by several of its reservations counts once).
pub async fn read(tx: &mut Tx, version: u32, query: &LedgerQuery<'_>) -> Result<LedgerHours> {
    let (fleet, tenant, owned, visible) = match query.scope {
        Scope::Fleet => (true, "", &[][..], &[][..]),
        Scope::Tenant { tenant_id, owned, visible } => (false, tenant_id.as_str(), &owned[..], &visible[..]),
    };
    // The planner takes each booking to span a thousand hours (generate_series), and would compile the
    // statements (JIT) for millions of rows that are a few thousand: a quarter of a second lost to each read.
    sql::query("SET LOCAL jit = off").execute(tx.conn()).await?;
    // The table names come from the version number alone, never from input.
    let bookings = format!("ledger_bookings_v{version}");
    let capacity = format!("ledger_capacity_v{version}");
    // Each booking cut into its hours (`cut`); the GPUs each tenant held bound in each hour, each once (`held`),
    // and their samples in that hour (`used`); the cut summed per pool, tenant and hour beside them.
    let tenants_query = format!(
        "WITH cut AS (
             SELECT b.pool_id, b.tenant_id, h.hour, b.gpus,
                    b.atoms::int8 * (least(b.booked_to, h.hour + 3600000) - greatest(b.booked_from, h.hour)) AS booked,
                    CASE WHEN b.bound_from IS NULL THEN 0
                         ELSE b.atoms::int8 * greatest(0, least(coalesce(b.bound_to, b.booked_to), b.booked_to,
                                                                h.hour + 3600000)
                                                          - greatest(b.bound_from, b.booked_from, h.hour)) END AS bound
             FROM {bookings} AS b
             CROSS JOIN LATERAL {BOOKED_HOURS} AS h(hour)
             WHERE b.booked_from IS NOT NULL AND int8range(b.booked_from, b.booked_to) && int8range($1, $2)
               AND ($3::text IS NULL OR b.pool_id = $3)
               AND ($4 OR b.pool_id = ANY($6::text[]) OR b.tenant_id = $5)
         ), held AS (
             SELECT DISTINCT c.pool_id, c.tenant_id, c.hour, k.gpu
             FROM cut AS c CROSS JOIN LATERAL unnest(c.gpus) AS k(gpu)
             WHERE c.bound > 0
         ), used AS (
             SELECT h.pool_id, h.tenant_id, h.hour, sum(g.percent_sum) AS percent_sum, sum(g.samples) AS samples
             FROM held AS h
             JOIN gpu_utilization AS g
               ON g.node_id = split_part(h.gpu, '/', 1) AND g.hour_ms = h.hour
              AND (split_part(h.gpu, '/', 2) = '*' OR g.gpu = split_part(h.gpu, '/', 2))
             GROUP BY 1, 2, 3
         )
         SELECT c.pool_id, c.tenant_id, c.hour, sum(c.booked)::int8 AS booked, sum(c.bound)::int8 AS bound,
                max(u.percent_sum)::int8 AS percent_sum, max(u.samples)::int8 AS samples
         FROM cut AS c
         LEFT JOIN used AS u ON u.pool_id = c.pool_id AND u.tenant_id = c.tenant_id AND u.hour = c.hour
         GROUP BY 1, 2, 3
         ORDER BY 1, 3, 2"
    );
    let rows = sqlx::query(AssertSqlSafe(tenants_query))
        .persistent(false)
        .bind(query.from_ms)
        .bind(query.to_ms)
        .bind(query.pool_id)
        .bind(fleet)
        .bind(tenant)
        .bind(owned)
        .fetch_all(tx.conn())
        .await?;
    let mut tenants = Vec::with_capacity(rows.len());
    for row in rows {
        let percent_sum: Option<i64> = row.try_get("percent_sum")?;
        let samples: Option<i64> = row.try_get("samples")?;
        tenants.push(TenantHour {
            pool_id: row.try_get("pool_id")?,
            tenant_id: row.try_get("tenant_id")?,
            hour_ms: row.try_get("hour")?,
            booked: row.try_get("booked")?,
            bound: row.try_get("bound")?,
            utilization: match (percent_sum, samples) {
                (Some(sum), Some(n)) if n > 0 => Some(sum as f64 / n as f64),
                _ => None,
            },
        });
    }
    let pools_query = format!(
        "WITH capacity AS (
             SELECT c.pool_id, h.hour,
                    sum(c.atoms::int8 * (least(coalesce(c.to_ms, h.hour + 3600000), h.hour + 3600000)
                                         - greatest(c.from_ms, h.hour)))::int8 AS capacity
             FROM {capacity} AS c
             CROSS JOIN LATERAL generate_series(
                 greatest($1, c.from_ms - c.from_ms % 3600000),
                 least($2 - 3600000, coalesce((c.to_ms - 1) - (c.to_ms - 1) % 3600000, $2)), 3600000) AS h(hour)
             WHERE c.from_ms < $2 AND (c.to_ms IS NULL OR c.to_ms > $1)
               AND ($3::text IS NULL OR c.pool_id = $3) AND ($4 OR c.pool_id = ANY($5::text[]))
             GROUP BY 1, 2
         ), booked AS (
             SELECT b.pool_id, h.hour,
                    sum(b.atoms::int8 * (least(b.booked_to, h.hour + 3600000) - greatest(b.booked_from, h.hour)))::int8
                        AS booked
             FROM {bookings} AS b
             CROSS JOIN LATERAL {BOOKED_HOURS} AS h(hour)
             WHERE b.booked_from IS NOT NULL AND int8range(b.booked_from, b.booked_to) && int8range($1, $2)
               AND ($3::text IS NULL OR b.pool_id = $3) AND ($4 OR b.pool_id = ANY($5::text[]))
             GROUP BY 1, 2
         )
         SELECT coalesce(c.pool_id, k.pool_id) AS pool_id, coalesce(c.hour, k.hour) AS hour,
                coalesce(c.capacity, 0)::int8 AS capacity, coalesce(k.booked, 0)::int8 AS booked
         FROM capacity AS c FULL JOIN booked AS k ON k.pool_id = c.pool_id AND k.hour = c.hour
         ORDER BY 1, 2"
    );
    let rows = sqlx::query(AssertSqlSafe(pools_query))
        .persistent(false)
        .bind(query.from_ms)
        .bind(query.to_ms)
        .bind(query.pool_id)
        .bind(fleet)
        .bind(visible)
        .fetch_all(tx.conn())
        .await?;
    let mut pools = Vec::with_capacity(rows.len());
    for row in rows {
        pools.push(PoolHour {
            pool_id: row.try_get("pool_id")?,
            hour_ms: row.try_get("hour")?,
            capacity: row.try_get("capacity")?,
            booked: row.try_get("booked")?,
        });
    }
    Ok(LedgerHours { pools, tenants })
}

/// Every pool's figures over the hours of `[from_ms, to_ms)`, summed over its tenants: (capacity, booked,
/// bound), in atom-milliseconds, by pool and hour. What the metrics scrape reports.
pub fn pool_totals(hours: &LedgerHours) -> BTreeMap<(String, i64), (i64, i64, i64)> {
    let mut totals: BTreeMap<(String, i64), (i64, i64, i64)> = BTreeMap::new();
    for p in &hours.pools {
        let entry = totals.entry((p.pool_id.clone(), p.hour_ms)).or_default();
        entry.0 += p.capacity;
        entry.1 += p.booked;
    }
    for t in &hours.tenants {
        totals.entry((t.pool_id.clone(), t.hour_ms)).or_default().2 += t.bound;
    }
    totals
}

#[cfg(test)]
mod tests;
