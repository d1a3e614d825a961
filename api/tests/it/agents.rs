//! Nodes and their agents end to end: the server on a real port with its worker, and three `bcd` agents (the
//! agent library, in process, with simulated GPUs) that join with join tokens, report inventories, heartbeat
//! and carry out commands, on real PostgreSQL with the real clock and a 2-second liveness lease.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bc_agent::run::{AgentConfig, InventorySource, ServerTrust};
use bc_agent::{cdi, simulate};
use bc_api::http::{AppState, router};
use bc_api::tls::{Peer, TlsListener};
use bc_commands::App;
use bc_commands::agents::LivenessConfig;
use bc_commands::auth::BuiltinAuthorizer;
use bc_commands::fleet::{CreatePool, CreateSite};
use bc_commands::worker::{Worker, WorkerConfig};
use bc_domain::id::{NodeId, PoolId};
use bc_domain::inventory::NodeInventory;
use bc_domain::pool::{PoolAgent, PoolClass, PoolPolicy, Sharing};
use bc_domain::site::SiteKind;
use bc_eventstore::testing::TestDb;
use bc_eventstore::{Db, TxOptions, sql};
use serde_json::{Value, json};
use tokio::sync::{oneshot, watch};

use crate::http_api::{AUTH, ROOT};
use bc_commands::testing::caller;

/// How long any awaited condition may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(60);

/// Polls `check` until it answers `Some`, or fails the test after [`PATIENCE`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A running agent: stop it to make its node go silent.
pub(crate) struct RunningAgent {
    host: String,
    state_dir: PathBuf,
    cdi_dir: PathBuf,
    machine: Arc<Mutex<NodeInventory>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl RunningAgent {
    /// Ends the agent at once, as a SIGKILL would: nothing of its own shutdown runs.
    pub(crate) fn kill(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    pub(crate) async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("the agent task").expect("the agent ends cleanly");
        }
    }
}

/// The server, its worker, and the agents started against it.
pub(crate) struct Cluster {
    pub(crate) t: TestDb,
    pub(crate) base: String,
    pub(crate) pool: PoolId,
    pub(crate) http: reqwest::Client,
    /// The CA the agents pin.
    pub(crate) ca: String,
    pub(crate) root: tempdir::Dir,
    shutdown: watch::Sender<bool>,
    /// The control plane as a real process, when it runs as one ([`Cluster::start_process`]).
    process: Option<ServerProcess>,
}

/// `better-compute serve` as a real process on a fixed port, so it can be killed and started again where the
/// agents look for it.
struct ServerProcess {
    server: Option<crate::process::Server>,
    command: Box<dyn Fn() -> std::process::Command + Send + Sync>,
}

pub(crate) mod tempdir {
    use std::path::{Path, PathBuf};

    /// A temporary folder removed on drop.
    pub struct Dir(PathBuf);

    impl Dir {
        pub fn new(name: &str) -> Dir {
            let path = std::env::temp_dir().join(format!("bc-agents-{name}-{}", bc_domain::id::new_id("t")));
            std::fs::create_dir_all(&path).expect("temp dir");
            Dir(path)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl Cluster {
    pub(crate) async fn start(name: &str) -> Cluster {
        let t = TestDb::new().await;
        let auth = Arc::new(BuiltinAuthorizer::from_toml(AUTH).expect("auth config"));
        // Through TLS, as in production: the server presents the bundle's certificate, clients pin its CA, and
        // the nodes get certificates at their join and speak mutual TLS.
        let root = tempdir::Dir::new(name);
        let bundle = bc_pki::Bundle::init(&root.path().join("pki"), &bc_pki::InitOptions::default()).expect("pki");
        let ca = bundle.ca_pem().to_owned();
        let pki = bc_api::service::Pki { bundle: Arc::new(bundle), certificate: None };
        let app = App::new(t.db.clone()).with_authorizer(auth).with_pki(Arc::clone(&pki.bundle));
        let mut state = AppState::new(app).expect("state");
        state.app.liveness = LivenessConfig { lease: Duration::from_secs(2), heartbeat: Duration::from_millis(150) };
        let app: App = state.app.clone();
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let listener = TlsListener::new(tcp, pki.server_config(None).expect("tls")).expect("tls");
        let base = format!("https://{}", listener.address());
        let (shutdown, mut stopped) = watch::channel(false);
        tokio::spawn(bc_api::service::keep_revocations(app.clone(), pki, listener.config(), shutdown.subscribe()));
        let mut serving = shutdown.subscribe();
        tokio::spawn(async move {
            axum::serve(listener, router(state).into_make_service_with_connect_info::<Peer>())
                .with_graceful_shutdown(async move {
                    let _ = serving.changed().await;
                })
                .await
                .expect("serve");
        });
        let worker = Worker::new(
            app.clone(),
            WorkerConfig {
                idle_poll: Duration::from_millis(50),
                liveness_sweep: Duration::from_millis(100),
                ..WorkerConfig::default()
            },
        );
        let worker_stop = shutdown.subscribe();
        tokio::spawn(worker.run(worker_stop));
        let _ = stopped.borrow_and_update();
        let (_, pool) = fleet(&app).await;
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(bc_pki::tls::client_config(&ca, None).expect("client tls"))
            .build()
            .expect("client");
        Cluster { t, base, pool, http, ca, root, shutdown, process: None }
    }

    /// The same fleet with the control plane as a real `better-compute serve` process (the tests' PKI bundle, the
    /// tests' authorization file), which [`Cluster::kill_server`] kills with SIGKILL and [`Cluster::start_server`]
    /// starts again on the same port and database.
    pub(crate) async fn start_process(name: &str) -> Cluster {
        Self::start_process_with(name, Vec::new()).await
    }

    /// [`Cluster::start_process`] with more arguments to `serve`.
    pub(crate) async fn start_process_with(name: &str, extra: Vec<String>) -> Cluster {
        let t = TestDb::new().await;
        let root = tempdir::Dir::new(name);
        let app = App::new(t.db.clone());
        let (_, pool) = fleet(&app).await;
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").port();
        let auth = crate::process::auth_file(name, AUTH);
        let url = t.url();
        let command = move || {
            let listen = format!("127.0.0.1:{port}");
            let mut c = crate::process::command(&["serve", "--no-migrate", "--listen", &listen, "--auth-config"]);
            c.arg(&auth).args(&extra).env("BETTER_COMPUTE_DATABASE_URL", &url);
            c
        };
        let server = tokio::task::block_in_place(|| crate::process::Server::start(command()));
        let base = server.base_url.clone();
        let ca = std::fs::read_to_string(crate::process::test_pki().join("ca.crt")).expect("the tests' CA");
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(bc_pki::tls::client_config(&ca, None).expect("client tls"))
            .build()
            .expect("client");
        let (shutdown, _) = watch::channel(false);
        let process = ServerProcess { server: Some(server), command: Box::new(command) };
        Cluster { t, base, pool, http, ca, root, shutdown, process: Some(process) }
    }

    /// Kills the control plane's process with SIGKILL and waits until it is gone.
    pub(crate) fn kill_server(&mut self) {
        let process = self.process.as_mut().expect("a control plane process");
        let mut server = process.server.take().expect("a running server");
        server.signal("KILL");
        tokio::task::block_in_place(|| server.wait());
    }

    /// Starts the control plane's process again, on the same port and database.
    pub(crate) fn start_server(&mut self) {
        let process = self.process.as_mut().expect("a control plane process");
        let server = tokio::task::block_in_place(|| crate::process::Server::start((process.command)()));
        assert_eq!(server.base_url, self.base, "the same address");
        process.server = Some(server);
    }

    /// Starts the agents of three machines and waits until their nodes are adopted, connected and schedulable.
    async fn three_agents(&self) -> (Vec<RunningAgent>, Vec<NodeId>) {
        let mut agents = Vec::new();
        for host in ["gpu-a", "gpu-b", "gpu-c"] {
            agents.push(self.agent(host).await);
        }
        let mut nodes = Vec::new();
        for agent in &agents {
            let node = self.node_of(agent).await;
            self.await_node(&node, "an adopted, connected, schedulable node", schedulable_and_connected).await;
            nodes.push(node);
        }
        (agents, nodes)
    }

    pub(crate) fn db(&self) -> &Db {
        &self.t.db
    }

    pub(crate) async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base)).bearer_auth(ROOT);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("send");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn join_token(&self) -> String {
        let (status, body) =
            self.call(reqwest::Method::POST, &format!("/v1/pools/{}/join-tokens", self.pool), None).await;
        assert_eq!(status, 201, "{body}");
        body["token"].as_str().expect("token").to_owned()
    }

    /// Starts an agent for simulated machine `host` (two H100s), joining with a fresh token when it has no
    /// credential yet.
    async fn agent(&self, host: &str) -> RunningAgent {
        let spec: simulate::Simulated = "2xH100".parse().expect("spec");
        let (source, machine) = InventorySource::simulated(simulate::inventory(host, &spec));
        let state_dir = self.root.path().join(host).join("state");
        let cdi_dir = self.root.path().join(host).join("cdi");
        self.start_agent_with(host, state_dir, cdi_dir, source, machine, Some(self.join_token().await), None)
    }

    /// Starts the agent of `vps-host` machine `host` (two simulated H100s), which runs its instances with
    /// `runtime`; it joins with `join_token` when it has no credential yet.
    pub(crate) fn instance_host(
        &self,
        host: &str,
        join_token: Option<String>,
        runtime: bc_agent::runtime::RuntimeConfig,
    ) -> RunningAgent {
        let spec: simulate::Simulated = "2xH100".parse().expect("spec");
        let (source, machine) = InventorySource::simulated(simulate::inventory(host, &spec));
        let state_dir = self.root.path().join(host).join("state");
        let cdi_dir = self.root.path().join(host).join("cdi");
        self.start_agent_with(host, state_dir, cdi_dir, source, machine, join_token, Some(runtime))
    }

    #[allow(clippy::too_many_arguments)]
    fn start_agent_with(
        &self,
        host: &str,
        state_dir: PathBuf,
        cdi_dir: PathBuf,
        source: InventorySource,
        machine: Arc<Mutex<NodeInventory>>,
        join_token: Option<String>,
        runtime: Option<bc_agent::runtime::RuntimeConfig>,
    ) -> RunningAgent {
        let config = AgentConfig {
            server: self.base.clone(),
            trust: ServerTrust::PinnedCa(self.ca.clone()),
            join_token,
            state_dir: state_dir.clone(),
            cdi_dir: cdi_dir.clone(),
            inventory: source,
            inventory_every: 5,
            site: None,
            runtime,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(bc_agent::run::run(config, async move {
            let _ = stopped.await;
        }));
        RunningAgent { host: host.to_owned(), state_dir, cdi_dir, machine, stop: Some(stop), task: Some(task) }
    }

    /// Starts a site agent (`bcd site`) for machine `host`, joining with a fresh token.
    pub(crate) async fn site_agent(&self, host: &str, site: bc_agent::site::SiteConfig) -> RunningAgent {
        let spec: simulate::Simulated = "1xH100".parse().expect("spec");
        let (source, machine) = InventorySource::simulated(simulate::inventory(host, &spec));
        let state_dir = self.root.path().join(host).join("state");
        let cdi_dir = self.root.path().join(host).join("cdi");
        let config = AgentConfig {
            server: self.base.clone(),
            trust: ServerTrust::PinnedCa(self.ca.clone()),
            join_token: Some(self.join_token().await),
            state_dir: state_dir.clone(),
            cdi_dir: cdi_dir.clone(),
            inventory: source,
            inventory_every: 5,
            site: Some(site),
            runtime: None,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(bc_agent::run::run(config, async move {
            let _ = stopped.await;
        }));
        RunningAgent { host: host.to_owned(), state_dir, cdi_dir, machine, stop: Some(stop), task: Some(task) }
    }

    /// Starts the agent again from its state folder (no join token: it must use its credential).
    fn restart(&self, agent: &RunningAgent) -> RunningAgent {
        let source = InventorySource::Simulated(agent.machine.clone());
        self.start_agent_with(
            &agent.host,
            agent.state_dir.clone(),
            agent.cdi_dir.clone(),
            source,
            agent.machine.clone(),
            None,
            None,
        )
    }

    async fn node_of(&self, agent: &RunningAgent) -> NodeId {
        let dir = agent.state_dir.clone();
        eventually("the agent's credential", || {
            let dir = dir.clone();
            async move { bc_agent::run::saved_node(&dir).ok().flatten() }
        })
        .await
    }

    /// A node's row in the capacity tables: (connectivity, schedulable, provision state, reasons).
    async fn node_row(&self, node: &NodeId) -> Option<(String, bool, String, Vec<String>)> {
        let mut tx = self.db().begin(TxOptions::READ_ONLY).await.expect("begin");
        let row: Option<(String, bool, String, Vec<String>)> = sql::query_as(
            "SELECT connectivity, schedulable, provision_state, no_schedule_reasons FROM nodes WHERE id = $1",
        )
        .bind(node.as_str())
        .fetch_optional(tx.conn())
        .await
        .expect("node");
        tx.commit().await.expect("commit");
        row
    }

    async fn await_node(
        &self,
        node: &NodeId,
        what: &str,
        wanted: impl Fn(&(String, bool, String, Vec<String>)) -> bool,
    ) {
        eventually(what, || async { self.node_row(node).await.filter(|row| wanted(row)) }).await;
    }

    async fn reservation_state(&self, id: &str) -> String {
        let mut tx = self.db().begin(TxOptions::READ_ONLY).await.expect("begin");
        let state: String = sql::query_scalar("SELECT state FROM reservations WHERE id = $1")
            .bind(id)
            .fetch_one(tx.conn())
            .await
            .expect("state");
        tx.commit().await.expect("commit");
        state
    }

    pub(crate) async fn await_reservation(&self, id: &str, state: &str) {
        eventually(&format!("reservation {id} {state}"), || async {
            (self.reservation_state(id).await == state).then_some(())
        })
        .await;
    }

    /// Reserves `count` GPUs over HTTP now, for an hour; returns the reservation's id and its nodes.
    pub(crate) async fn reserve(&self, key: &str, count: u32) -> (String, Vec<String>) {
        let body = json!({
            "poolId": self.pool, "devices": { "class": "gpu", "count": count }, "duration": 3600,
        });
        let response = self
            .http
            .post(format!("{}/v1/reservations", self.base))
            .bearer_auth(ROOT)
            .header("idempotency-key", key)
            .json(&body)
            .send()
            .await
            .expect("reserve");
        let status = response.status().as_u16();
        let body: Value = response.json().await.expect("body");
        assert_eq!(status, 201, "{body}");
        let id = body["id"].as_str().expect("id").to_owned();
        let mut tx = self.db().begin(TxOptions::READ_ONLY).await.expect("begin");
        let nodes: Vec<String> =
            sql::query_scalar("SELECT node_id FROM allocations WHERE reservation_id = $1 ORDER BY node_id")
                .bind(&id)
                .fetch_all(tx.conn())
                .await
                .expect("allocations");
        tx.commit().await.expect("commit");
        (id, nodes)
    }

    async fn count(&self, query: &'static str, node: &NodeId) -> i64 {
        let mut tx = self.db().begin(TxOptions::READ_ONLY).await.expect("begin");
        let n: i64 = sql::query_scalar(query).bind(node.as_str()).fetch_one(tx.conn()).await.expect("count");
        tx.commit().await.expect("commit");
        n
    }
}

/// The connectivity a node's events moved it to, in order.
async fn connectivity_path(db: &Db, node: &NodeId) -> Vec<String> {
    use bc_domain::event::DomainEvent as _;
    use bc_domain::node::NodeEvent;
    let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let recorded = bc_eventstore::events::read_stream(&mut tx, node.as_str(), 0, 10_000).await.expect("stream");
    tx.commit().await.expect("commit");
    recorded
        .iter()
        .filter_map(|e| match NodeEvent::decode(&e.event_type, e.schema_version, &e.payload).expect("decode") {
            NodeEvent::ConnectivityChanged(c) => {
                Some(serde_json::to_value(c.to).expect("json").as_str().expect("text").to_owned())
            }
            _ => None,
        })
        .collect()
}

/// The fleet the cluster's agents join: site `fra1` and its pool `h100` (nodes lost after 5 s).
async fn fleet(app: &App) -> (bc_domain::id::SiteId, PoolId) {
    let owner = caller("root", "operator@platform");
    let site = app
        .create_site(
            &owner,
            CreateSite { name: "fra1".into(), iam_region: "eu-central-1".into(), kind: SiteKind::Shared },
        )
        .await
        .expect("site")
        .value;
    let policy = PoolPolicy { lost_after: 5, ..PoolPolicy::default() };
    let pool = app
        .create_pool(
            &owner,
            CreatePool {
                site_id: site.clone(),
                name: "h100".into(),
                class: PoolClass::MetalHost,
                gpu_model: "H100".into(),
                sharing: Sharing::Exclusive,
                agent: PoolAgent::Bcd,
                policy,
                provider_account_id: None,
            },
        )
        .await
        .expect("pool")
        .value;
    (site, pool)
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

fn schedulable_and_connected(row: &(String, bool, String, Vec<String>)) -> bool {
    row.0 == "connected" && row.1 && row.2 == "adopted"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_agents_join_and_a_reservation_is_bound_through_its_agent_cdi_file() {
    let cluster = Cluster::start("bind").await;
    let (mut agents, nodes) = cluster.three_agents().await;
    for node in &nodes {
        assert_eq!(
            cluster.count("SELECT count(*) FROM node_inventory_snapshots WHERE node_id = $1", node).await,
            1,
            "the join stored the first snapshot and an unchanged inventory adds none"
        );
    }
    // The operator sees them connected and schedulable through the API.
    bc_projections::testing::catch_up(cluster.db()).await;
    let (status, listed) =
        cluster.call(reqwest::Method::GET, &format!("/v1/nodes?poolId={}", cluster.pool), None).await;
    assert_eq!(status, 200, "{listed}");
    let items = listed["items"].as_array().expect("items");
    assert_eq!(items.len(), 3, "{listed}");
    assert!(items.iter().all(|n| n["connectivity"] == "connected" && n["schedulable"] == true), "{listed}");

    let (id, on) = cluster.reserve("bind-1", 2).await;
    assert_eq!(on.len(), 1, "two GPUs of one node");
    cluster.await_reservation(&id, "active").await;
    let agent = agents.iter().zip(&nodes).find(|(_, n)| n.as_str() == on[0]).map(|(a, _)| a).expect("the agent");
    let written = cdi::read_spec(&agent.cdi_dir, &id).expect("the CDI spec of the bound reservation");
    let mut tx = cluster.db().begin(TxOptions::READ_ONLY).await.expect("begin");
    let booked: Vec<String> =
        sql::query_scalar("SELECT device_id FROM device_bookings WHERE reservation_id = $1 ORDER BY device_id")
            .bind(&id)
            .fetch_all(tx.conn())
            .await
            .expect("bookings");
    tx.commit().await.expect("commit");
    let mut in_file: Vec<String> = written.iter().map(|d| d.id.clone()).collect();
    in_file.sort();
    assert_eq!(in_file, booked, "the CDI spec names exactly the booked devices");

    let (status, body) =
        cluster.call(reqwest::Method::POST, &format!("/v1/reservations/{id}/release"), Some(json!({}))).await;
    assert_eq!(status, 200, "{body}");
    cluster.await_reservation(&id, "released").await;
    assert!(!cdi::spec_path(&agent.cdi_dir, &id).exists(), "the release removed the CDI spec");
    let (status, commands) = cluster.call(reqwest::Method::GET, &format!("/v1/nodes/{}/commands", on[0]), None).await;
    assert_eq!(status, 200, "{commands}");
    let kinds: Vec<(&str, &str)> = commands["items"]
        .as_array()
        .expect("items")
        .iter()
        .rev()
        .map(|c| (c["kind"].as_str().unwrap_or(""), c["state"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(kinds, vec![("bind", "succeeded"), ("unbind", "succeeded")]);
    for agent in &mut agents {
        agent.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_agent_makes_its_node_unschedulable_and_new_reservations_avoid_it_until_it_comes_back() {
    let cluster = Cluster::start("liveness").await;
    let (mut agents, nodes) = cluster.three_agents().await;
    agents[0].stop().await;
    let silent = nodes[0].clone();
    cluster.await_node(&silent, "the silent node disconnected", |row| row.0 != "connected" && !row.1).await;
    // The others keep heartbeating: new reservations land on them only.
    for key in ["avoid-1", "avoid-2"] {
        let (_, on) = cluster.reserve(key, 2).await;
        assert!(!on.contains(&silent.to_string()), "placed on the silent node {silent}");
    }
    // Past twice the lease it is unreachable, with the condition; past the pool's lostAfter, lost.
    cluster
        .await_node(&silent, "the node lost with NodeUnreachable", |row| {
            row.0 == "lost" && row.3.contains(&"NodeUnreachable".to_owned())
        })
        .await;
    let path = connectivity_path(cluster.db(), &silent).await;
    let order = ["disconnected", "unreachable", "lost"];
    let ranks: Vec<usize> = path.iter().map(|p| order.iter().position(|o| o == p).expect("a silent state")).collect();
    assert!(ranks.windows(2).all(|w| w[0] < w[1]), "only changes, each further: {path:?}");
    assert_eq!(
        (path.first().map(String::as_str), path.last().map(String::as_str)),
        (Some("disconnected"), Some("lost"))
    );
    let heartbeats_are_not_events = cluster
        .count("SELECT count(*) FROM events WHERE stream_id = $1 AND event_type LIKE '%heartbeat%'", &silent)
        .await;
    assert_eq!(heartbeats_are_not_events, 0);

    // The restarted agent comes back as the same node, with its credential and no join token.
    let mut back = cluster.restart(&agents[0]);
    cluster
        .await_node(&silent, "the node connected again", |row| schedulable_and_connected(row) && row.3.is_empty())
        .await;
    assert_eq!(cluster.node_of(&back).await, silent);
    let mut tx = cluster.db().begin(TxOptions::READ_ONLY).await.expect("begin");
    let total: i64 = sql::query_scalar("SELECT count(*) FROM nodes").fetch_one(tx.conn()).await.expect("count");
    tx.commit().await.expect("commit");
    assert_eq!(total, 3, "no second node");
    back.stop().await;
    for agent in &mut agents[1..] {
        agent.stop().await;
    }
}

/// The credential, certificate and key an agent saved.
fn saved_identity(agent: &RunningAgent) -> (String, String, String) {
    let credential: Value =
        serde_json::from_slice(&std::fs::read(agent.state_dir.join("credential.json")).expect("credential"))
            .expect("json");
    let cert = std::fs::read_to_string(agent.state_dir.join("node.crt")).expect("node.crt");
    let key = std::fs::read_to_string(agent.state_dir.join("node.key")).expect("node.key");
    (credential["credential"].as_str().expect("credential").to_owned(), cert, key)
}

impl Cluster {
    /// An HTTPS client pinning the CA and presenting `identity` (certificate and key, PEM), if any.
    fn client_with(&self, identity: Option<(&str, &str)>) -> reqwest::Client {
        reqwest::Client::builder()
            .tls_backend_preconfigured(bc_pki::tls::client_config(&self.ca, identity).expect("client tls"))
            .build()
            .expect("client")
    }
}

/// A node's call with `credential`, through `client`: its status and error message, or `None` when the TLS
/// handshake itself was refused.
async fn node_call(
    client: &reqwest::Client,
    base: &str,
    path: &str,
    credential: &str,
    body: Value,
) -> Option<(u16, Value)> {
    let response = client.post(format!("{base}{path}")).bearer_auth(credential).json(&body).send().await.ok()?;
    let status = response.status().as_u16();
    Some((status, response.json().await.unwrap_or(Value::Null)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_speak_mutual_tls_with_the_certificate_of_their_join_and_a_deleted_nodes_is_refused_at_the_handshake() {
    let cluster = Cluster::start("mtls").await;
    let (mut a, mut b) = (cluster.agent("gpu-a").await, cluster.agent("gpu-b").await);
    let (node_a, node_b) = (cluster.node_of(&a).await, cluster.node_of(&b).await);
    for node in [&node_a, &node_b] {
        cluster.await_node(node, "an adopted, connected, schedulable node", schedulable_and_connected).await;
    }
    // The join answered a certificate for the key the agent made: it names the node, and the CA signed it.
    let (credential_a, cert_a, key_a) = saved_identity(&a);
    let (_, cert_b, key_b) = saved_identity(&b);
    let peer = bc_pki::PeerCertificate::parse_pem(&cert_a).expect("node.crt");
    assert_eq!(peer.common_name, node_a.to_string());
    let issued = cluster
        .count("SELECT count(*) FROM node_certificates WHERE node_id = $1 AND revoked_at IS NULL", &node_a)
        .await;
    assert!(issued >= 1, "the certificate is recorded");
    let body = json!({ "agentVersion": "test" });
    // The credential alone is refused: a node route needs the node's certificate.
    let anonymous = cluster.client_with(None);
    let (status, answer) =
        node_call(&anonymous, &cluster.base, "/v1/agent/sessions", &credential_a, body.clone()).await.expect("answer");
    assert_eq!(status, 401, "{answer}");
    assert!(answer.to_string().contains("mutual TLS"), "{answer}");
    // Another node's certificate with this node's credential is refused too.
    let as_b = cluster.client_with(Some((&cert_b, &key_b)));
    let (status, answer) =
        node_call(&as_b, &cluster.base, "/v1/agent/sessions", &credential_a, body.clone()).await.expect("answer");
    assert_eq!(status, 401, "{answer}");
    assert!(answer.to_string().contains(&format!("node {node_b}'s")), "{answer}");
    // A node holding a live certificate must present it to get the next one; presenting it, it does.
    let csr = bc_pki::NodeKey::generate("gpu-a").expect("key").csr_pem;
    let (status, _) =
        node_call(&anonymous, &cluster.base, "/v1/agent/certificate", &credential_a, json!({ "csr": csr }))
            .await
            .expect("answer");
    assert_eq!(status, 401);
    let as_a = cluster.client_with(Some((&cert_a, &key_a)));
    let (status, next) = node_call(&as_a, &cluster.base, "/v1/agent/certificate", &credential_a, json!({ "csr": csr }))
        .await
        .expect("answer");
    assert_eq!(status, 201, "{next}");
    assert_eq!(next["nodeId"], node_a.to_string());
    assert_ne!(next["serial"].as_str(), Some(peer.serial.as_str()), "a new certificate");
    let (status, bad) =
        node_call(&as_a, &cluster.base, "/v1/agent/certificate", &credential_a, json!({ "csr": "not a request" }))
            .await
            .expect("answer");
    assert_eq!((status, bad["error"]["details"]["field"].as_str()), (400, Some("csr")), "{bad}");

    // Its read model shows the machine's hardware key, and its devices.
    let node = eventually("the node in the read model", || async {
        bc_projections::testing::catch_up(cluster.db()).await;
        let (status, node) = cluster.call(reqwest::Method::GET, &format!("/v1/nodes/{node_a}"), None).await;
        (status == 200 && node["hardwareKey"].is_string()).then_some(node)
    })
    .await;
    assert_eq!(node["hardwareKey"].as_str().map(str::len), Some(64), "{node}");
    assert_eq!(node["hardwareTrusted"], true, "{node}");
    let (status, devices) = cluster.call(reqwest::Method::GET, &format!("/v1/nodes/{node_a}/devices"), None).await;
    assert_eq!(status, 200, "{devices}");
    let gpus: Vec<&Value> =
        devices["items"].as_array().expect("items").iter().filter(|d| d["class"] == "gpu").collect();
    assert_eq!(gpus.len(), 2, "{devices}");
    assert!(gpus.iter().all(|g| g["gpuModel"] == "H100" && g["bookable"] == true), "{devices}");

    // Deleting the node revokes its certificates: new handshakes with them are refused, while the other node's
    // still pass.
    a.stop().await;
    let (status, deleted) =
        cluster.call(reqwest::Method::DELETE, &format!("/v1/nodes/{node_a}?force=true"), None).await;
    assert!(status < 300, "{deleted}");
    eventually("the deleted node's certificate refused at the handshake", || async {
        let fresh = cluster.client_with(Some((&cert_a, &key_a)));
        fresh.get(format!("{}/v1/healthz", cluster.base)).send().await.is_err().then_some(())
    })
    .await;
    let fresh_b = cluster.client_with(Some((&cert_b, &key_b)));
    let healthy = fresh_b.get(format!("{}/v1/healthz", cluster.base)).send().await.expect("b still connects");
    assert_eq!(healthy.status().as_u16(), 200);
    let crl = anonymous.get(format!("{}/v1/pki/crl", cluster.base)).send().await.expect("crl");
    assert_eq!(crl.headers()["content-type"], "application/pkix-crl");
    let ca = anonymous.get(format!("{}/v1/pki/ca.crt", cluster.base)).send().await.expect("ca");
    assert_eq!(ca.text().await.expect("pem"), cluster.ca);
    b.stop().await;
}

/// The node's (generation, observed generation).
async fn generations(cluster: &Cluster, node: &NodeId) -> (i64, i64) {
    let mut tx = cluster.db().begin(TxOptions::READ_ONLY).await.expect("begin");
    let row: (i64, i64) = sql::query_as("SELECT generation, observed_generation FROM nodes WHERE id = $1")
        .bind(node.as_str())
        .fetch_one(tx.conn())
        .await
        .expect("node");
    tx.commit().await.expect("commit");
    row
}

#[tokio::test]
async fn the_agent_reports_a_spec_observed_only_once_it_applied_it() {
    let cluster = Cluster::start("spec-observed").await;
    let agent = cluster.agent("gpu-s").await;
    let node = cluster.node_of(&agent).await;
    cluster.await_node(&node, "an adopted, connected node", schedulable_and_connected).await;
    let path = format!("/v1/nodes/{node}/spec");
    let (status, body) = cluster.call(reqwest::Method::PUT, &path, Some(json!({ "labels": { "rack": "r7" } }))).await;
    assert_eq!(status, 200, "{body}");
    let generation = body["generation"].as_i64().expect("generation");
    eventually("the labels applied and observed", || async {
        (generations(&cluster, &node).await.1 == generation).then_some(())
    })
    .await;
    let labels: Value =
        serde_json::from_slice(&std::fs::read(agent.state_dir.join("labels.json")).expect("labels.json"))
            .expect("json");
    assert_eq!(labels, json!({ "rack": "r7" }));
    // A MIG layout this agent cannot make stays unobserved: the node shows the spec as not applied.
    let (status, body) =
        cluster.call(reqwest::Method::PUT, &path, Some(json!({ "labels": {}, "migLayout": "all-1g.10gb" }))).await;
    assert_eq!(status, 200, "{body}");
    let wanted = body["generation"].as_i64().expect("generation");
    // Five more heartbeats come (each carries the observed generation, and hands the new spec over) without it
    // being observed.
    let beats = || async {
        let mut tx = cluster.db().begin(TxOptions::READ_ONLY).await.expect("begin");
        let n: i64 = sql::query_scalar("SELECT heartbeats FROM agent_sessions WHERE node_id = $1")
            .bind(node.as_str())
            .fetch_one(tx.conn())
            .await
            .expect("session");
        tx.commit().await.expect("commit");
        n
    };
    let from = beats().await;
    eventually("five more heartbeats", || async { (beats().await >= from + 5).then_some(()) }).await;
    assert_eq!(generations(&cluster, &node).await, (wanted, generation), "the layout is never reported as applied");
}
