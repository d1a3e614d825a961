//! `GET /metrics`: the process's figures and the database's, in the Prometheus text format (OpenMetrics, through
//! `prometheus-client`). What the process counts itself: HTTP requests and their latencies by route, event-stream
//! subscribers, the connection pool, transactions run again by reason. What a scrape reads from the database, in
//! one read-only snapshot: the log's appends, each projection's applied events and lag (events and seconds), the
//! horizon (how old the oldest transaction holding it back is, and how many transaction ids it trails), the work
//! queue's depth and the age of its oldest due item, the leases held, by kind, by this process and by any, and the
//! fleet per pool: atoms by resource (all, allocatable, allocated, reserved, available), nodes by state, the
//! agents' sessions with the age of the stalest live heartbeat, and the GPU-hour ledger's last and current hours.
//!
//! Names follow Prometheus's conventions, which `tests/it/dashboard.rs` checks on a real scrape: the `bc_` prefix,
//! snake case, base units at the end (`_seconds`), counters' samples ending in `_total` (the encoder adds it), and
//! a family's labels splitting a whole, so that summing over any of them means something. `docs/grafana/fleet.json`
//! is the dashboard over them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bc_commands::figures::{Connections, DatabaseFigures, FleetFigures, PoolCapacity};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    status: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    method: String,
    route: String,
}

/// What the process counts itself; shared by every request.
#[derive(Debug)]
pub struct Metrics {
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabels, Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            // 1 ms to about 16 s.
            latency: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 15))),
        }
    }
}

impl Metrics {
    /// Counts one answered request under its route's template (`/v1/pools/{pool_id}`), never its raw path, so
    /// ids do not become label values.
    pub fn observe(&self, method: &str, route: &str, status: u16, seconds: f64) {
        let (method, route) = (method.to_owned(), route.to_owned());
        self.requests.get_or_create(&RequestLabels { method: method.clone(), route: route.clone(), status }).inc();
        self.latency.get_or_create(&RouteLabels { method, route }).observe(seconds);
    }
}

/// The middleware that counts every request. Requests no route matched count under `unmatched`.
pub async fn count_requests(State(metrics): State<Arc<Metrics>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().as_str().to_owned();
    let route = request.extensions().get::<MatchedPath>().map_or("unmatched", |p| p.as_str()).to_owned();
    let response = next.run(request).await;
    metrics.observe(&method, &route, response.status().as_u16(), started.elapsed().as_secs_f64());
    response
}

/// What one scrape reports besides the process's own counters, read from the write side.
#[derive(Debug)]
pub struct Scrape {
    pub figures: DatabaseFigures,
    pub connections: Connections,
    /// What the pool's writer of follow-ups (the free-capacity hints after each commit) has done.
    pub follow_ups: bc_eventstore::FollowUpFigures,
    /// Denials since start, by (method, kind).
    pub denials: BTreeMap<(&'static str, &'static str), u64>,
    pub subscribers: usize,
    /// The limit on the API listener's connections, whose figures it reports, when this process serves one.
    pub listener: Option<crate::tls::ConnectionLimit>,
}

/// The exposition `GET /metrics` answers: the process's own counters beside one scrape's figures.
pub fn exposition(metrics: &Metrics, scrape: Scrape) -> Response {
    let process = ProcessFigures {
        pool_size: scrape.connections.size,
        pool_idle: scrape.connections.idle,
        pool_max: scrape.connections.max,
        subscribers: scrape.subscribers as i64,
        denials: scrape.denials,
        follow_ups: scrape.follow_ups,
        listener: scrape.listener,
    };
    let mut registry = Registry::with_prefix("bc");
    registry.register(
        "http_requests",
        "HTTP requests answered, by route template and status",
        metrics.requests.clone(),
    );
    registry.register(
        "http_request_duration_seconds",
        "Time to answer HTTP requests, by route template",
        metrics.latency.clone(),
    );
    registry.register(
        "build",
        "The release this process runs",
        Info::new(vec![("version".to_owned(), env!("CARGO_PKG_VERSION").to_owned())]),
    );
    registry.register_collector(Box::new(process));
    registry.register_collector(Box::new(DatabaseCollector(scrape.figures)));
    let mut text = String::new();
    // Encoding into a String cannot fail: fmt::Write for String never errors.
    let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}

/// Writes one unlabelled figure.
fn one(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    let metric_type = metric.metric_type();
    metric.encode(encoder.encode_descriptor(name, help, None, metric_type)?)
}

#[derive(Debug)]
struct ProcessFigures {
    pool_size: u32,
    pool_idle: u32,
    pool_max: u32,
    subscribers: i64,
    denials: BTreeMap<(&'static str, &'static str), u64>,
    follow_ups: bc_eventstore::FollowUpFigures,
    listener: Option<crate::tls::ConnectionLimit>,
}

impl Collector for ProcessFigures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut pool = encoder.encode_descriptor(
            "db_pool_connections",
            "This process's open database connections, by state (busy, idle)",
            None,
            MetricType::Gauge,
        )?;
        let busy = self.pool_size.saturating_sub(self.pool_idle);
        for (state, n) in [("busy", busy), ("idle", self.pool_idle)] {
            ConstGauge::new(i64::from(n)).encode(pool.encode_family(&[("state", state)])?)?;
        }
        // The limit is a family of its own: as a state beside busy and idle, a sum over states would add it in.
        one(
            &mut encoder,
            "db_pool_max_connections",
            "The most database connections this process opens",
            ConstGauge::new(i64::from(self.pool_max)),
        )?;
        if let Some(listener) = &self.listener {
            let gauge = |n: usize| ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
            one(
                &mut encoder,
                "http_connections",
                "Connections this process's API listener holds open, TLS handshakes included",
                gauge(listener.open()),
            )?;
            one(
                &mut encoder,
                "http_max_connections",
                "The most connections the API listener holds open at once (serve --max-connections)",
                gauge(listener.max()),
            )?;
            one(
                &mut encoder,
                "http_connection_limit_reached",
                "Times since this process started that every connection place was taken, so new clients waited in the kernel's backlog",
                ConstCounter::new(listener.times_full()),
            )?;
        }
        one(
            &mut encoder,
            "sse_subscribers",
            "Event-stream subscribers of this process",
            ConstGauge::new(self.subscribers),
        )?;
        let mut denials = encoder.encode_descriptor(
            "denials",
            "Calls the authorizer refused since this process started, by method and kind (unauthenticated, not_found, forbidden)",
            None,
            MetricType::Counter,
        )?;
        for ((method, kind), count) in &self.denials {
            ConstCounter::new(*count).encode(denials.encode_family(&[("method", *method), ("kind", *kind)])?)?;
        }
        let mut retries = encoder.encode_descriptor(
            "transaction_retries",
            "Transactions this process ran again since it started, by reason (stream_version, serialization, deadlock, exclusion)",
            None,
            MetricType::Counter,
        )?;
        for (reason, count) in bc_eventstore::retries() {
            ConstCounter::new(count).encode(retries.encode_family(&[("reason", reason.as_str())])?)?;
        }
        let beats = bc_commands::heartbeat_batch_figures();
        one(
            &mut encoder,
            "heartbeats_written",
            "Heartbeats this process's heartbeat writers renewed since it started (their mean batch is this over bc_heartbeat_transactions_total)",
            ConstCounter::new(beats.heartbeats),
        )?;
        one(
            &mut encoder,
            "heartbeat_transactions",
            "Transactions in which this process's heartbeat writers renewed sessions since it started",
            ConstCounter::new(beats.transactions),
        )?;
        one(
            &mut encoder,
            "heartbeat_transactions_failed",
            "Batches of heartbeats whose transaction failed since this process started (each heartbeat was then written alone)",
            ConstCounter::new(beats.failed),
        )?;
        one(
            &mut encoder,
            "hint_follow_up_commits",
            "Committed transactions since this process started whose free-capacity hint changes went to its writer of follow-ups",
            ConstCounter::new(self.follow_ups.commits),
        )?;
        one(
            &mut encoder,
            "hint_follow_up_writes",
            "Writes of the free-capacity hints since this process started, each merging the changes of one or more commits",
            ConstCounter::new(self.follow_ups.writes),
        )?;
        one(
            &mut encoder,
            "hint_follow_up_writes_failed",
            "Writes of the free-capacity hints that failed since this process started (their changes are left to the hints' walk)",
            ConstCounter::new(self.follow_ups.failed),
        )?;
        Ok(())
    }
}

/// The database's figures, encoded.
#[derive(Debug)]
struct DatabaseCollector(DatabaseFigures);

impl Collector for DatabaseCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let figures = &self.0;
        one(
            &mut encoder,
            "events_appended",
            "Events appended to the log, by every process (its sequence)",
            ConstCounter::new(figures.log.appended.max(0) as u64),
        )?;
        let families: [(&str, &str, MetricType); 3] = [
            ("projection_events_applied", "Events each projection version has applied", MetricType::Counter),
            ("projection_lag_events", "Events in the log after each projection version's position", MetricType::Gauge),
            (
                "projection_lag_seconds",
                "How much older each projection version's last event is than the log's last",
                MetricType::Gauge,
            ),
        ];
        for (index, (name, help, metric_type)) in families.into_iter().enumerate() {
            let mut family = encoder.encode_descriptor(name, help, None, metric_type)?;
            for p in &figures.projections {
                let version = p.version.to_string();
                let labels = [("projection", p.name.as_str()), ("version", &version), ("active", bool_text(p.active))];
                let metric = family.encode_family(&labels)?;
                match index {
                    0 => ConstCounter::new(p.applied.max(0) as u64).encode(metric)?,
                    1 => ConstGauge::new(p.lag_events).encode(metric)?,
                    _ => ConstGauge::new(p.lag_seconds).encode(metric)?,
                }
            }
        }
        one(
            &mut encoder,
            "horizon_age_seconds",
            "Age of the oldest writing transaction, which holds the log's read horizon back (0: none)",
            ConstGauge::new(figures.log.horizon_age_seconds),
        )?;
        one(
            &mut encoder,
            "horizon_trailing_xids",
            "Transaction ids between the horizon and the next one to be assigned",
            ConstGauge::new(figures.log.horizon_xids),
        )?;
        one(&mut encoder, "work_queue_depth", "Keys in the work queue", ConstGauge::new(figures.log.queue_depth))?;
        one(
            &mut encoder,
            "work_queue_due_keys",
            "Keys in the work queue that are due now",
            ConstGauge::new(figures.log.queue_due),
        )?;
        one(
            &mut encoder,
            "work_queue_claimed_keys",
            "Keys a worker has claimed and not finished",
            ConstGauge::new(figures.log.queue_claimed),
        )?;
        one(
            &mut encoder,
            "work_queue_oldest_due_seconds",
            "How long the oldest due key has been due (0: none)",
            ConstGauge::new(figures.log.queue_oldest_due_seconds),
        )?;
        let mut leases = encoder.encode_descriptor(
            "leases_live",
            "Unexpired leases by kind (shard, singleton, gateway, member), held by this process or another",
            None,
            MetricType::Gauge,
        )?;
        for (kind, mine, count) in &figures.log.leases {
            let holder = if *mine { "this_process" } else { "other" };
            ConstGauge::new(*count).encode(leases.encode_family(&[("kind", kind.as_str()), ("holder", holder)])?)?;
        }
        encode_fleet(&mut encoder, &figures.fleet)
    }
}

/// One capacity column of a pool's resource.
type Column = fn(&PoolCapacity) -> i64;

/// The capacity families: each is one column of the rollup, per pool and resource.
const CAPACITY: [(&str, &str, Column); 5] = [
    ("pool_atoms", "Bookable atoms on the pool's nodes, schedulable or not, by resource", |c| c.atoms),
    ("pool_allocatable_atoms", "Atoms on the pool's schedulable nodes, by resource", |c| c.allocatable),
    (
        "pool_allocated_atoms",
        "Atoms held now by the pool's reservations binding, active or releasing, by resource",
        |c| c.allocated,
    ),
    ("pool_reserved_atoms", "Atoms of the pool's reservations placed and not yet started, by resource", |c| c.reserved),
    ("pool_available_atoms", "Allocatable atoms of the pool not allocated now, by resource", |c| c.available),
];

/// The fleet's figures, labelled by pool id (never by node or reservation, so the series stay few).
fn encode_fleet(encoder: &mut DescriptorEncoder, fleet: &FleetFigures) -> Result<(), std::fmt::Error> {
    for (name, help, value) in CAPACITY {
        let help = format!("{help} (from the capacity rollup, which trails the log by its projection's lag)");
        let mut family = encoder.encode_descriptor(name, &help, None, MetricType::Gauge)?;
        for c in &fleet.capacity {
            let labels = [("pool", c.pool_id.as_str()), ("resource", c.resource.as_str())];
            ConstGauge::new(value(c)).encode(family.encode_family(&labels)?)?;
        }
    }
    let mut nodes = encoder.encode_descriptor(
        "nodes",
        "Nodes by pool, connectivity, provision state and whether they are schedulable",
        None,
        MetricType::Gauge,
    )?;
    for n in &fleet.nodes {
        let labels = [
            ("pool", n.pool_id.as_str()),
            ("connectivity", n.connectivity.as_str()),
            ("provision_state", n.provision_state.as_str()),
            ("schedulable", bool_text(n.schedulable)),
        ];
        ConstGauge::new(n.nodes).encode(nodes.encode_family(&labels)?)?;
    }
    let mut sessions = encoder.encode_descriptor(
        "agent_sessions",
        "Agents' sessions by pool and state (live: its liveness lease runs; expired: it ran out)",
        None,
        MetricType::Gauge,
    )?;
    for s in &fleet.sessions {
        for (state, count) in [("live", s.live), ("expired", s.expired)] {
            ConstGauge::new(count)
                .encode(sessions.encode_family(&[("pool", s.pool_id.as_str()), ("state", state)])?)?;
        }
    }
    let mut oldest = encoder.encode_descriptor(
        "agent_heartbeat_oldest_age_seconds",
        "How long ago the pool's live session heard from least recently had its last heartbeat (0: none live)",
        None,
        MetricType::Gauge,
    )?;
    for s in &fleet.sessions {
        let labels = [("pool", s.pool_id.as_str())];
        ConstGauge::new(s.oldest_heartbeat_age_seconds).encode(oldest.encode_family(&labels)?)?;
    }
    encode_ledger(encoder, fleet)
}

/// The GPU-hour ledger's last and current hours per pool: capacity split into bound, idle and free atom-seconds
/// (summing over `kind` gives the capacity; bound and idle make up what was booked).
fn encode_ledger(encoder: &mut DescriptorEncoder, fleet: &FleetFigures) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(
        "ledger_atom_seconds",
        "The GPU-hour ledger's atom-seconds per pool in the last and the current UTC hour (the current one as booked \
         so far, its later minutes included), by kind: bound (booked and active), idle (booked, not active) and free \
         (not booked); their sum is the pool's capacity (from the ledger read model, which trails the log by its lag)",
        None,
        MetricType::Gauge,
    )?;
    for l in &fleet.ledger {
        let seconds = |atom_ms: i64| atom_ms as f64 / 1000.0;
        let kinds = [
            ("bound", seconds(l.bound)),
            ("idle", seconds(l.booked - l.bound)),
            ("free", seconds(l.capacity - l.booked)),
        ];
        for (kind, value) in kinds {
            let labels = [("pool", l.pool_id.as_str()), ("hour", l.hour), ("kind", kind)];
            ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

fn bool_text(value: bool) -> &'static str {
    if value { "true" } else { "false" }
}

/// Shares the process's metrics with the router state.
pub fn shared() -> Arc<Metrics> {
    Arc::new(Metrics::default())
}
