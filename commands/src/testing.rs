//! Helpers for tests (feature `testing`). A small fleet for the capacity tests: a site, pools of each sharing mode, nodes with simulated GPUs, an
//! owner and a customer tenant, and the simulated clock.

use crate::fleet::{CreatePool, CreateSite, OfferPool};
use crate::nodes::RegisterNode;
use crate::reservations::{Reserve, Reserved};
use crate::worker::{Worker, WorkerConfig};
use crate::{App, AppResult, Caller};
use bc_domain::device::{DeviceClass, GpuInfo, MigInstance};
use bc_domain::id::{NodeId, PoolId, SiteId};
use bc_domain::node::{Role, Trust};
use bc_domain::pool::{PoolAgent, PoolClass, PoolPolicy, Sharing, SharingPolicy};
use bc_domain::reservation::ReservationRequest;
use bc_domain::site::SiteKind;
use bc_eventstore::testing::TestDb;
use bc_eventstore::{TxOptions, clock, sql};

/// What every reservation held, ended ones included (an ending deletes its bookings), as the text of a CTE named
/// `held`: one row per atom of its allocations, from its start to its end, or to when it ended if that came first
/// (`during`, empty when it ended before it began; `from_at` and `to_at` its bounds). The torture test checks its
/// invariants over it and [`Fleet::held`] reads one reservation's. A macro, so that `concat!` can build `'static`
/// queries from it.
#[macro_export]
macro_rules! held_cte {
    () => {
        "held AS (
             SELECT r.id AS reservation_id, d.device_id, a.id AS allocation_id, r.tenant_id, r.pool_id, r.resource,
                    r.start_at AS from_at, w.to_at, tstzrange(r.start_at, w.to_at) AS during
             FROM reservations AS r
             JOIN allocations AS a ON a.reservation_id = r.id
             CROSS JOIN LATERAL unnest(a.devices) AS d(device_id)
             CROSS JOIN LATERAL (SELECT greatest(r.start_at, least(r.end_at, coalesce(r.ended_at, r.end_at))) AS to_at)
                 AS w
             WHERE r.start_at IS NOT NULL
         )"
    };
}

/// 2030-01-01T00:00:00Z.
pub const T0: i64 = 1_893_456_000_000;
pub const HOUR: i64 = 3_600_000;

pub fn caller(tenant: &str, identity: &str) -> Caller {
    Caller::new(tenant.parse().expect("tenant"), identity.parse().expect("identity"), "user")
}

pub struct Fleet {
    pub t: TestDb,
    pub app: App,
    pub owner: Caller,
    pub site: SiteId,
}

impl Fleet {
    /// A fresh database with the simulated clock at T0 and one site owned by the platform.
    pub async fn new() -> Fleet {
        let t = TestDb::new().await;
        clock::use_sim_clock(&t.db, T0).await.expect("sim clock");
        let app = App::new(t.db.clone());
        let owner = caller("root", "operator@platform");
        let site = app
            .create_site(
                &owner,
                CreateSite { name: "fra1".into(), iam_region: "eu-central-1".into(), kind: SiteKind::Shared },
            )
            .await
            .expect("site")
            .value;
        Fleet { t, app, owner, site }
    }

    pub fn worker(&self) -> Worker {
        Worker::new(self.app.clone(), WorkerConfig::default())
    }

    /// Moves the simulated clock and runs the worker until nothing is due.
    pub async fn advance_to(&self, at_ms: i64) {
        clock::set_sim_clock(&self.t.db, at_ms).await.expect("move the clock");
        self.worker().run_until_idle().await.expect("worker");
    }

    pub async fn pool(&self, name: &str, sharing: Sharing, replicas: Option<u32>) -> PoolId {
        let policy = PoolPolicy { sharing: SharingPolicy { replicas }, ..PoolPolicy::default() };
        self.pool_with(name, sharing, policy).await
    }

    pub async fn pool_with(&self, name: &str, sharing: Sharing, policy: PoolPolicy) -> PoolId {
        self.pool_of(name, PoolClass::MetalHost, sharing, policy).await
    }

    /// A pool of `class` (`vps-host` pools hold instances).
    pub async fn pool_of(&self, name: &str, class: PoolClass, sharing: Sharing, policy: PoolPolicy) -> PoolId {
        self.app
            .create_pool(
                &self.owner,
                CreatePool {
                    site_id: self.site.clone(),
                    name: name.into(),
                    class,
                    gpu_model: "H100".into(),
                    sharing,
                    agent: PoolAgent::Bcd,
                    policy,
                    provider_account_id: None,
                },
            )
            .await
            .expect("pool")
            .value
    }

    pub async fn offer(&self, pool: &PoolId, tenant: &str, gpus: u32) {
        let quota = [("gpu".to_owned(), gpus), ("gpu.mig".to_owned(), gpus), ("gpu.slot".to_owned(), gpus)].into();
        self.app
            .offer_pool(
                &self.owner,
                pool,
                OfferPool {
                    tenant_id: tenant.parse().expect("tenant"),
                    quota,
                    priority: 0,
                    include_descendants: false,
                },
            )
            .await
            .expect("offer");
    }

    /// Registers a node with `gpus` simulated H100s (with `mig` instances each, if any).
    pub async fn node(&self, pool: &PoolId, name: &str, gpus: usize, mig: u32) -> NodeId {
        self.node_with(pool, name, gpus, mig, &[]).await
    }

    /// [`Fleet::node`] with scalar resources, such as `[("vcpu", 64), ("memoryGiB", 512)]`.
    pub async fn node_with(
        &self,
        pool: &PoolId,
        name: &str,
        gpus: usize,
        mig: u32,
        resources: &[(&str, u64)],
    ) -> NodeId {
        let gpus = (0..gpus).map(|g| gpu(&format!("{name}-{g}"), mig)).collect();
        self.node_of(pool, name, gpus, resources).await
    }

    /// A node registered by the pool's owner with these GPUs (and scalar resources).
    pub async fn node_of(&self, pool: &PoolId, name: &str, gpus: Vec<GpuInfo>, resources: &[(&str, u64)]) -> NodeId {
        self.app
            .register_node(
                &self.owner,
                RegisterNode {
                    pool_id: pool.clone(),
                    name: name.into(),
                    role: Role::Host,
                    trust: Trust::Platform,
                    owner_tenant_id: None,
                    gpus,
                    resources: resources.iter().map(|(r, n)| ((*r).to_owned(), *n)).collect(),
                },
            )
            .await
            .expect("node")
            .value
    }

    pub async fn reserve(&self, who: &Caller, key: &str, request: ReservationRequest) -> AppResult<Reserved> {
        Ok(self.app.reserve(who, Reserve { idempotency_key: key.into(), request }).await?.value)
    }

    /// A node's free-capacity summary for GPUs, (atoms, atoms without a live booking), and the ends of its atoms'
    /// live bookings in device id order (`None`: no live booking), once every command's change has reached the hints.
    pub async fn free_capacity(&self, node: &NodeId) -> ((i32, i32), Vec<Option<i64>>) {
        self.app.db().follow_ups_written().await;
        let mut tx = self.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
        let summary: (i32, i32) =
            sql::query_as("SELECT atoms, free FROM node_free WHERE node_id = $1 AND class = 'gpu'")
                .bind(node.as_str())
                .fetch_one(tx.conn())
                .await
                .expect("the node's summary row");
        let ends: Vec<Option<i64>> = sql::query_scalar(
            "SELECT ts_ms(booked_until) FROM devices WHERE node_id = $1 AND class = 'gpu' ORDER BY id",
        )
        .bind(node.as_str())
        .fetch_all(tx.conn())
        .await
        .expect("the node's devices");
        tx.commit().await.expect("commit");
        (summary, ends)
    }

    /// A node's GPU atoms' free time (`atom_gaps`) as (device, from, until) in epoch ms, `None` for unbounded, in
    /// device and time order; and how many rows differ from the complement of the live bookings, both ways.
    pub async fn free_time(&self, node: &NodeId) -> (Vec<(String, Option<i64>, Option<i64>)>, i64) {
        let mut tx = self.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
        let gaps: Vec<(String, Option<i64>, Option<i64>)> = sql::query_as(
            "SELECT device_id, ts_ms(lower(gap)), ts_ms(upper(gap)) FROM atom_gaps
             WHERE node_id = $1 AND class = 'gpu' ORDER BY device_id, lower(gap) NULLS FIRST",
        )
        .bind(node.as_str())
        .fetch_all(tx.conn())
        .await
        .expect("the node's gaps");
        let drift: i64 = sql::query_scalar(
            "SELECT count(*) FROM ((TABLE atom_gaps EXCEPT ALL SELECT * FROM atom_gaps_from_bookings())
                                   UNION ALL (SELECT * FROM atom_gaps_from_bookings() EXCEPT ALL TABLE atom_gaps)) AS d",
        )
        .fetch_one(tx.conn())
        .await
        .expect("compare the gaps");
        tx.commit().await.expect("commit");
        (gaps, drift)
    }

    /// The bookings a reservation has as (device, start, end) in epoch ms: what it holds now (an ended
    /// reservation's are gone).
    pub async fn bookings(&self, reservation: &str) -> Vec<(String, i64, i64)> {
        self.windows(
            "SELECT device_id, ts_ms(lower(during)), ts_ms(upper(during)) FROM device_bookings
             WHERE reservation_id = $1 ORDER BY device_id",
            reservation,
        )
        .await
    }

    /// What a reservation held, ended or not, as (device, start, end) in epoch ms: each atom of its allocations
    /// from its start to its end, or to when it ended if that came first.
    pub async fn held(&self, reservation: &str) -> Vec<(String, i64, i64)> {
        self.windows(
            concat!(
                "WITH ",
                held_cte!(),
                " SELECT device_id, ts_ms(from_at), ts_ms(to_at) FROM held
                  WHERE reservation_id = $1 ORDER BY device_id"
            ),
            reservation,
        )
        .await
    }

    async fn windows(&self, query: &'static str, reservation: &str) -> Vec<(String, i64, i64)> {
        let mut tx = self.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
        let rows: Vec<(String, i64, i64)> =
            sql::query_as(query).bind(reservation).fetch_all(tx.conn()).await.expect("windows");
        tx.commit().await.expect("commit");
        rows
    }
}

pub fn gpu(uuid_suffix: &str, mig: u32) -> GpuInfo {
    GpuInfo {
        uuid: format!("GPU-{uuid_suffix}").parse().expect("uuid"),
        name: "NVIDIA H100 80GB HBM3".into(),
        memory_mib: 81_559,
        pci_bus_id: None,
        mig_instances: (1..=mig)
            .map(|g| MigInstance { gpu_instance: g, compute_instance: 0, profile: "1g.10gb".into(), memory_mib: 9_856 })
            .collect(),
    }
}

pub fn request(pool: &PoolId, class: DeviceClass, count: u32) -> ReservationRequest {
    ReservationRequest::hold(pool.clone(), class, count)
}
