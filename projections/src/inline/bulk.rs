//! The inline tables written in bulk, for generators of large fleets (the benchmarks): the rows that the
//! events of many nodes and reservations would have left, computed from the domain's own fold of those events
//! and inserted a batch per statement. Never used by a command: commands apply events one by one
//! ([`super::apply`]). The rows are the same, so a rebuild from the generated log equals them.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use bc_domain::id::TenantId;
use bc_domain::node::{self, NodeEvent, NodeRegistered};
use bc_domain::reservation::Reservation;
use bc_eventstore::{Result, Tx, sql};

use super::{json, text};

/// Inserts the nodes (and their devices) that `node.registered` events in a pool owned by `pool_owner` make.
pub async fn load_registered_nodes(tx: &mut Tx, pool_owner: &TenantId, nodes: &[NodeRegistered]) -> Result<()> {
    let mut rows: NodeColumns = NodeColumns::default();
    let mut devices: DeviceColumns = DeviceColumns::default();
    for registered in nodes {
        let event = NodeEvent::Registered(registered.clone());
        let Some(folded) = node::evolve(None, &event) else { continue };
        rows.ids.push(registered.node_id.to_string());
        rows.pools.push(registered.pool_id.to_string());
        rows.sites.push(registered.site_id.to_string());
        rows.owners.push(registered.owner_tenant_id.as_ref().map(ToString::to_string));
        rows.names.push(registered.name.clone());
        rows.roles.push(text(&registered.role)?);
        rows.trusts.push(text(&registered.trust)?);
        rows.adapters.push(text(&registered.adapter)?);
        rows.states.push(text(&registered.provision_state)?);
        rows.connectivity.push(text(&registered.connectivity)?);
        rows.conditions.push(json(&registered.conditions)?);
        rows.reasons.push(json(&folded.no_schedule_reasons())?);
        rows.generations.push(registered.generation as i64);
        rows.observed.push(registered.observed_generation as i64);
        rows.schedulable.push(folded.unschedulable(pool_owner).is_empty());
        rows.at.push(registered.at_ms);
        for device in &registered.devices {
            devices.ids.push(device.id.to_string());
            devices.nodes.push(registered.node_id.to_string());
            devices.pools.push(registered.pool_id.to_string());
            devices.classes.push(device.class.as_str());
            devices.parents.push(device.parent.as_ref().map(ToString::to_string));
            devices.bookable.push(device.bookable);
            devices.models.push(device.gpu_model.clone());
            devices.products.push(device.gpu_product.clone());
            devices.attributes.push(json(&device.attributes)?);
        }
    }
    sql::query(
        "INSERT INTO nodes (id, pool_id, site_id, owner_tenant_id, name, role, trust, adapter, provision_state,
                            connectivity, conditions, no_schedule_reasons, generation, observed_generation,
                            schedulable, registered_at)
         SELECT u.id, u.pool_id, u.site_id, u.owner, u.name, u.role, u.trust, u.adapter, u.state, u.connectivity,
                u.conditions::jsonb, ARRAY(SELECT jsonb_array_elements_text(u.reasons::jsonb)), u.generation,
                u.observed, u.schedulable, ms_ts(u.at)
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
                     $9::text[], $10::text[], $11::text[], $12::text[], $13::int8[], $14::int8[], $15::bool[],
                     $16::int8[])
              AS u(id, pool_id, site_id, owner, name, role, trust, adapter, state, connectivity, conditions, reasons,
                   generation, observed, schedulable, at)",
    )
    .bind(&rows.ids)
    .bind(&rows.pools)
    .bind(&rows.sites)
    .bind(&rows.owners)
    .bind(&rows.names)
    .bind(&rows.roles)
    .bind(&rows.trusts)
    .bind(&rows.adapters)
    .bind(&rows.states)
    .bind(&rows.connectivity)
    .bind(&rows.conditions)
    .bind(&rows.reasons)
    .bind(&rows.generations)
    .bind(&rows.observed)
    .bind(&rows.schedulable)
    .bind(&rows.at)
    .execute(tx.conn())
    .await?;
    sql::query(
        "INSERT INTO devices (id, node_id, pool_id, class, parent_id, bookable, gpu_model, gpu_product, attributes)
         SELECT u.id, u.node_id, u.pool_id, u.class, u.parent_id, u.bookable, u.model, u.product, u.attributes::jsonb
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bool[], $7::text[], $8::text[],
                     $9::text[])
              AS u(id, node_id, pool_id, class, parent_id, bookable, model, product, attributes)",
    )
    .bind(&devices.ids)
    .bind(&devices.nodes)
    .bind(&devices.pools)
    .bind(&devices.classes)
    .bind(&devices.parents)
    .bind(&devices.bookable)
    .bind(&devices.models)
    .bind(&devices.products)
    .bind(&devices.attributes)
    .execute(tx.conn())
    .await?;
    Ok(())
}

#[derive(Default)]
struct NodeColumns {
    ids: Vec<String>,
    pools: Vec<String>,
    sites: Vec<String>,
    owners: Vec<Option<String>>,
    names: Vec<String>,
    roles: Vec<String>,
    trusts: Vec<String>,
    adapters: Vec<String>,
    states: Vec<String>,
    connectivity: Vec<String>,
    conditions: Vec<String>,
    reasons: Vec<String>,
    generations: Vec<i64>,
    observed: Vec<i64>,
    schedulable: Vec<bool>,
    at: Vec<i64>,
}

#[derive(Default)]
struct DeviceColumns {
    ids: Vec<String>,
    nodes: Vec<String>,
    pools: Vec<String>,
    classes: Vec<&'static str>,
    parents: Vec<Option<String>>,
    bookable: Vec<bool>,
    models: Vec<String>,
    products: Vec<String>,
    attributes: Vec<String>,
}

/// What the reservations of a generated fleet leave besides their own rows: each device's `booking_changes`
/// (one per placement, one more per ending that cut its booking short) and each tenant's quota checks per
/// pool (one per placement). Written once at the end, by [`finish`].
#[derive(Debug, Default, Clone)]
pub struct Counters {
    pub booking_changes: HashMap<String, i64>,
    pub quota_checks: BTreeMap<(String, String, String), i64>,
    pub bookings: u64,
}

/// The inline rows of a batch of reservations, from each one's fold: its row, its allocations, its bookings
/// (cut at its recorded end when it ended early).
#[derive(Debug, Default)]
pub struct Reservations {
    ids: Vec<String>,
    tenants: Vec<String>,
    identities: Vec<String>,
    pools: Vec<String>,
    projects: Vec<Option<String>>,
    states: Vec<&'static str>,
    resources: Vec<&'static str>,
    counts: Vec<i32>,
    requests: Vec<String>,
    hashes: Vec<String>,
    priorities: Vec<i32>,
    requested: Vec<i64>,
    deadlines: Vec<i64>,
    starts: Vec<Option<i64>>,
    ends: Vec<Option<i64>>,
    leases: Vec<Option<i64>>,
    release_requested: Vec<Option<i64>>,
    ended: Vec<Option<i64>>,
    outcomes: Vec<Option<String>>,
    versions: Vec<i32>,
    allocation_ids: Vec<String>,
    allocation_reservations: Vec<String>,
    allocation_nodes: Vec<String>,
    allocation_devices: Vec<String>,
    booking_devices: Vec<String>,
    booking_allocations: Vec<String>,
    booking_reservations: Vec<String>,
    booking_tenants: Vec<String>,
    booking_pools: Vec<String>,
    booking_resources: Vec<&'static str>,
    booking_from: Vec<i64>,
    booking_to: Vec<i64>,
}

impl Reservations {
    /// Adds the rows of `r` (the fold of its events), counting what it leaves in `counters`.
    pub fn push(&mut self, r: &Reservation, counters: &mut Counters) -> Result<()> {
        let id = r.id.to_string();
        let pool = r.request.pool_id.to_string();
        let tenant = r.tenant_id.to_string();
        let resource = r.request.resource();
        self.ids.push(id.clone());
        self.tenants.push(tenant.clone());
        self.identities.push(r.identity.to_string());
        self.pools.push(pool.clone());
        self.projects.push(r.request.project_id.as_ref().map(ToString::to_string));
        self.states.push(r.state.as_str());
        self.resources.push(resource);
        self.counts.push(r.request.devices.count as i32);
        self.requests.push(json(&r.request)?);
        self.hashes.push(r.request_hash.clone());
        self.priorities.push(r.priority);
        self.requested.push(r.requested_at_ms);
        self.deadlines.push(r.pending_deadline_ms);
        self.starts.push(r.start_ms);
        self.ends.push(r.end_ms);
        self.leases.push(r.lease_deadline_ms);
        self.release_requested.push(r.release_requested_at_ms);
        self.ended.push(r.ended_at_ms);
        self.outcomes.push(r.outcome.clone());
        self.versions.push(r.version as i32);
        let (Some(start), Some(end)) = (r.start_ms, r.end_ms) else { return Ok(()) };
        let cut = r.ended_at_ms.filter(|ended| *ended < end);
        *counters.quota_checks.entry((tenant.clone(), pool.clone(), resource.to_owned())).or_default() += 1;
        for allocation in &r.allocations {
            self.allocation_ids.push(allocation.allocation_id.to_string());
            self.allocation_reservations.push(id.clone());
            self.allocation_nodes.push(allocation.node_id.to_string());
            let devices: Vec<&str> = allocation.devices.iter().map(|d| d.as_str()).collect();
            self.allocation_devices.push(json(&devices)?);
            for device in &allocation.devices {
                *counters.booking_changes.entry(device.to_string()).or_default() += 1 + i64::from(cut.is_some());
                // An ended reservation's bookings are gone: its ending deleted them.
                if r.ended_at_ms.is_some() {
                    continue;
                }
                self.booking_devices.push(device.to_string());
                self.booking_allocations.push(allocation.allocation_id.to_string());
                self.booking_reservations.push(id.clone());
                self.booking_tenants.push(tenant.clone());
                self.booking_pools.push(pool.clone());
                self.booking_resources.push(resource);
                self.booking_from.push(start);
                self.booking_to.push(end);
                counters.bookings += 1;
            }
        }
        Ok(())
    }

    /// The reservations in the batch.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// How long each table of a batch took to write.
#[derive(Debug, Default, Clone, Copy)]
pub struct LoadTimes {
    pub reservations: Duration,
    pub allocations: Duration,
    pub bookings: Duration,
}

/// Inserts a batch's reservations, allocations and bookings (bookings in the order given; the exclusion
/// constraint checks them unless the caller dropped it for the load).
pub async fn load_reservations(tx: &mut Tx, batch: &Reservations) -> Result<LoadTimes> {
    let mut times = LoadTimes::default();
    let mut step = Instant::now();
    sql::query(
        "INSERT INTO reservations (id, tenant_id, identity, pool_id, project_id, state, resource, count, request,
                                   request_hash, priority, requested_at, pending_deadline, start_at, end_at,
                                   lease_deadline, release_requested_at, ended_at, outcome, version)
         SELECT u.id, u.tenant_id, u.identity, u.pool_id, u.project_id, u.state, u.resource, u.count, u.request::jsonb,
                u.hash, u.priority, ms_ts(u.requested), ms_ts(u.deadline), ms_ts(u.start_ms), ms_ts(u.end_ms),
                ms_ts(u.lease_ms), ms_ts(u.release_ms), ms_ts(u.ended_ms), u.outcome, u.version
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::int4[],
                     $9::text[], $10::text[], $11::int4[], $12::int8[], $13::int8[], $14::int8[], $15::int8[],
                     $16::int8[], $17::int8[], $18::int8[], $19::text[], $20::int4[])
              AS u(id, tenant_id, identity, pool_id, project_id, state, resource, count, request, hash, priority,
                   requested, deadline, start_ms, end_ms, lease_ms, release_ms, ended_ms, outcome, version)",
    )
    .bind(&batch.ids)
    .bind(&batch.tenants)
    .bind(&batch.identities)
    .bind(&batch.pools)
    .bind(&batch.projects)
    .bind(&batch.states)
    .bind(&batch.resources)
    .bind(&batch.counts)
    .bind(&batch.requests)
    .bind(&batch.hashes)
    .bind(&batch.priorities)
    .bind(&batch.requested)
    .bind(&batch.deadlines)
    .bind(&batch.starts)
    .bind(&batch.ends)
    .bind(&batch.leases)
    .bind(&batch.release_requested)
    .bind(&batch.ended)
    .bind(&batch.outcomes)
    .bind(&batch.versions)
    .execute(tx.conn())
    .await?;
    times.reservations = step.elapsed();
    step = Instant::now();
    sql::query(
        "INSERT INTO allocations (id, reservation_id, node_id, devices)
         SELECT u.id, u.reservation_id, u.node_id, ARRAY(SELECT jsonb_array_elements_text(u.devices::jsonb))
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS u(id, reservation_id, node_id, devices)",
    )
    .bind(&batch.allocation_ids)
    .bind(&batch.allocation_reservations)
    .bind(&batch.allocation_nodes)
    .bind(&batch.allocation_devices)
    .execute(tx.conn())
    .await?;
    times.allocations = step.elapsed();
    step = Instant::now();
    sql::query(
        "INSERT INTO device_bookings (device_id, allocation_id, reservation_id, tenant_id, pool_id, resource, during)
         SELECT u.device_id, u.allocation_id, u.reservation_id, u.tenant_id, u.pool_id, u.resource,
                tstzrange(ms_ts(u.from_ms), ms_ts(u.to_ms))
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int8[], $8::int8[])
              AS u(device_id, allocation_id, reservation_id, tenant_id, pool_id, resource, from_ms, to_ms)",
    )
    .bind(&batch.booking_devices)
    .bind(&batch.booking_allocations)
    .bind(&batch.booking_reservations)
    .bind(&batch.booking_tenants)
    .bind(&batch.booking_pools)
    .bind(&batch.booking_resources)
    .bind(&batch.booking_from)
    .bind(&batch.booking_to)
    .execute(tx.conn())
    .await?;
    times.bookings = step.elapsed();
    Ok(times)
}

/// Writes what the reservations' counters say (each device's `booking_changes` and each quota row's checks), every
/// atom's free time (`atom_gaps`, whose trigger the load turned off: see [`drop_booking_indexes`]) and the
/// free-capacity hints of the whole fleet (after the gaps, which `node_fit` is counted from).
pub async fn finish(tx: &mut Tx, counters: &Counters) -> Result<()> {
    sql::query("SELECT rebuild_atom_gaps()").execute(tx.conn()).await?;
    sql::query("SELECT rebuild_free_capacity()").execute(tx.conn()).await?;
    sql::query("SELECT rebuild_node_fit()").execute(tx.conn()).await?;
    let (devices, changes): (Vec<&str>, Vec<i64>) =
        counters.booking_changes.iter().map(|(device, n)| (device.as_str(), *n)).unzip();
    sql::query(
        "UPDATE devices AS d SET booking_changes = u.n
         FROM unnest($1::text[], $2::int8[]) AS u(id, n) WHERE d.id = u.id",
    )
    .bind(&devices)
    .bind(&changes)
    .execute(tx.conn())
    .await?;
    let mut tenants = Vec::new();
    let mut pools = Vec::new();
    let mut resources = Vec::new();
    let mut checks = Vec::new();
    for ((tenant, pool, resource), n) in &counters.quota_checks {
        tenants.push(tenant.as_str());
        pools.push(pool.as_str());
        resources.push(resource.as_str());
        checks.push(*n);
    }
    sql::query(
        "INSERT INTO quota_usage (tenant_id, pool_id, resource, checks)
         SELECT u.tenant_id, u.pool_id, u.resource, u.checks
         FROM unnest($1::text[], $2::text[], $3::text[], $4::int8[]) AS u(tenant_id, pool_id, resource, checks)
         ON CONFLICT (tenant_id, pool_id, resource) DO UPDATE SET checks = quota_usage.checks + excluded.checks",
    )
    .bind(&tenants)
    .bind(&pools)
    .bind(&resources)
    .bind(&checks)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// The GiST indexes of `device_bookings` (the exclusion constraint's among them), as the catalog defines them:
/// (name, the statement that makes it again), the constraint first.
pub async fn booking_indexes(tx: &mut Tx) -> Result<Vec<(String, String)>> {
    let rows: Vec<(String, String)> = sql::query_as(
        "SELECT i.indexrelid::regclass::text AS name,
                coalesce('ALTER TABLE device_bookings ADD CONSTRAINT ' || quote_ident(c.conname) || ' '
                             || pg_get_constraintdef(c.oid),
                         pg_get_indexdef(i.indexrelid)) AS make
         FROM pg_index AS i
         JOIN pg_class AS x ON x.oid = i.indexrelid
         JOIN pg_am AS am ON am.oid = x.relam
         LEFT JOIN pg_constraint AS c ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid
         WHERE i.indrelid = 'device_bookings'::regclass AND am.amname = 'gist'
         ORDER BY c.conname IS NOT NULL DESC, name",
    )
    .fetch_all(tx.conn())
    .await?;
    Ok(rows)
}

/// Drops `indexes` of `device_bookings` for a bulk load; [`restore_booking_indexes`] makes them again from the
/// same definitions, the exclusion constraint then checking every booking at once. The trigger that keeps
/// `atom_gaps` after each insert is off until then too (each batch would read every earlier booking of its
/// atoms again): [`finish`] makes the table whole.
pub async fn drop_booking_indexes(tx: &mut Tx, indexes: &[(String, String)]) -> Result<()> {
    sqlx::raw_sql("ALTER TABLE device_bookings DISABLE TRIGGER atom_gaps_booking_insert").execute(tx.conn()).await?;
    for (name, make) in indexes {
        let drop = if make.starts_with("ALTER TABLE") {
            format!("ALTER TABLE device_bookings DROP CONSTRAINT {name}")
        } else {
            format!("DROP INDEX {name}")
        };
        sqlx::raw_sql(sqlx::AssertSqlSafe(drop)).execute(tx.conn()).await?;
    }
    Ok(())
}

/// Makes `device_bookings`' `indexes` again (see [`drop_booking_indexes`]).
pub async fn restore_booking_indexes(tx: &mut Tx, indexes: &[(String, String)]) -> Result<()> {
    sqlx::raw_sql("SET LOCAL maintenance_work_mem = '1GB'").execute(tx.conn()).await?;
    sqlx::raw_sql("ALTER TABLE device_bookings ENABLE TRIGGER atom_gaps_booking_insert").execute(tx.conn()).await?;
    for (_, make) in indexes {
        sqlx::raw_sql(sqlx::AssertSqlSafe(make.clone())).execute(tx.conn()).await?;
    }
    Ok(())
}

/// A synthetic fleet for placement benchmarks: `nodes` schedulable hosts of `gpus` H100s each in `pool`
/// (numbered after `offset`), the first `booked` of them booked whole from an hour ago for 30 days. Its rows
/// have no events behind them: it measures the placement query, not a history.
pub async fn synthetic_fleet(
    tx: &mut Tx,
    pool: &str,
    site: &str,
    offset: i64,
    nodes: i64,
    gpus: i64,
    booked: i64,
) -> Result<()> {
    sql::query(
        "INSERT INTO nodes (id, pool_id, site_id, name, role, trust, adapter, provision_state, connectivity,
                            generation, observed_generation, schedulable, registered_at)
         SELECT 'node_' || lpad(($3 + n)::text, 26, '0'), $1, $2, 'bench-' || ($3 + n), 'host', 'platform', 'bcd/v1',
                'adopted', 'connected', 1, 1, true, compute_now()
         FROM generate_series(1, $4::int8) AS n",
    )
    .bind(pool)
    .bind(site)
    .bind(offset)
    .bind(nodes)
    .execute(tx.conn())
    .await?;
    sql::query(
        "INSERT INTO devices (id, node_id, pool_id, class, bookable, gpu_model, gpu_product)
         SELECT 'GPU-' || ($2 + n) || '-' || g, 'node_' || lpad(($2 + n)::text, 26, '0'), $1, 'gpu', true, 'H100',
                'H100-SXM5-80GB'
         FROM generate_series(1, $3::int8) AS n, generate_series(0, $4::int8 - 1) AS g",
    )
    .bind(pool)
    .bind(offset)
    .bind(nodes)
    .bind(gpus)
    .execute(tx.conn())
    .await?;
    sql::query(
        "INSERT INTO device_bookings (device_id, allocation_id, reservation_id, tenant_id, pool_id, resource, during)
         SELECT 'GPU-' || ($2 + n) || '-' || g, 'alloc_bench_' || ($2 + n), 'rsv_bench_' || ($2 + n), 'root', $1, 'gpu',
                tstzrange(compute_now() - interval '1 hour', compute_now() + interval '30 days')
         FROM generate_series(1, $3::int8) AS n, generate_series(0, $4::int8 - 1) AS g",
    )
    .bind(pool)
    .bind(offset)
    .bind(booked)
    .bind(gpus)
    .execute(tx.conn())
    .await?;
    sql::query("SELECT rebuild_free_capacity()").execute(tx.conn()).await?;
    sql::query("SELECT rebuild_node_fit()").execute(tx.conn()).await?;
    Ok(())
}
