//! `better-compute-bench provision`: machines on sushy-tools' Redfish emulator enrolled and inspected at once.
//! The control plane (its API over plain HTTP, its worker), a site agent with its boot server, and one simulated
//! firmware per machine run in this process: the firmware follows the emulator's power and boot changes (its
//! external notifier) and, powered on with a network boot, fetches its iPXE script from the site agent and runs
//! `bcd ramdisk`'s inspection. Prints the time until every machine is `ready`, and what the control plane
//! spent per machine (transactions, events, statements' time in PostgreSQL), beside pgbench's one-row INSERT on
//! the same cluster.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::extract::State;
use bc_agent::boot::BootConfig;
use bc_agent::run::{AgentConfig, InventorySource, ServerTrust};
use bc_agent::site::SiteConfig;
use bc_api::http::AppState;
use bc_commands::App;
use bc_commands::lifecycle::EnrolNode;
use bc_commands::worker::{Worker, WorkerConfig};
use bc_domain::node::BmcDriver;
use bc_domain::node::lifecycle::default_drivers;
use bc_domain::workflow::WorkflowKind;
use bc_eventstore::{Db, DbConfig, TxOptions, sql};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::agents::each;
use super::reserve::{bench_caller, bench_site, h100_pool};
use super::{BenchCluster, PgbenchRun, pgbench};

/// Connections of the control plane's pool.
const APP_CONNECTIONS: u32 = 32;
/// Tasks that enrol machines and start their inspections.
const SETUP_TASKS: usize = 16;
/// How often the ramdisks ask for work.
const RAMDISK_POLL: Duration = Duration::from_secs(1);
/// How long the run may take before it gives up.
const PATIENCE: Duration = Duration::from_secs(3600);

/// What `bench provision` measures.
#[derive(Debug, Clone)]
pub struct ProvisionBenchConfig {
    /// Machines on the emulator.
    pub machines: usize,
    /// `sushy-emulator` to run.
    pub sushy: String,
    pub data_dir: Option<PathBuf>,
    pub keep: bool,
}

/// The emulator, killed on drop.
struct Sushy {
    child: Child,
    dir: PathBuf,
}

impl Drop for Sushy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn uuid(i: usize) -> String {
    format!("00000000-0000-4000-8000-{i:012x}")
}

fn mac(i: usize) -> String {
    format!("52:54:00:{:02x}:{:02x}:{:02x}", (i >> 16) & 0xff, (i >> 8) & 0xff, i & 0xff)
}

/// Machines per emulator process: a site's BMCs are separate machines, and one emulator serving a thousand
/// systems at once runs out of its own resources before the control plane does.
const MACHINES_PER_EMULATOR: usize = 100;

fn start_sushy(
    program: &str,
    dir: &std::path::Path,
    machines: std::ops::Range<usize>,
    notify: &str,
) -> anyhow::Result<(Sushy, String)> {
    std::fs::create_dir_all(dir)?;
    let systems: Vec<String> = machines
        .map(|i| {
            format!(
                "{{'uuid': '{}', 'name': 'm-{i:05}', 'power_state': 'Off', 'external_notifier': True, \
                 'nics': [{{'mac': '{}', 'ip': '10.1.0.1'}}]}}",
                uuid(i),
                mac(i)
            )
        })
        .collect();
    let config = dir.join("sushy.conf");
    std::fs::write(
        &config,
        format!(
            "SUSHY_EMULATOR_FAKE_DRIVER = True\nEXTERNAL_NOTIFICATION_URL = '{notify}'\n\
             SUSHY_EMULATOR_FAKE_SYSTEMS = [{}]\n",
            systems.join(",\n")
        ),
    )?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let log = std::fs::File::create(dir.join("sushy.log"))?;
    let child = Command::new(program)
        .arg("--config")
        .arg(&config)
        .args(["--interface", "127.0.0.1", "--port", &port.to_string()])
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log))
        .spawn()
        .with_context(|| format!("start {program} (python3 -m pip install sushy-tools==2.2.0)"))?;
    Ok((Sushy { child, dir: dir.to_path_buf() }, format!("http://127.0.0.1:{port}")))
}

/// The simulated firmware of every machine: what runs on each, by the system's UUID.
#[derive(Clone)]
struct Firmware {
    boot_url: String,
    /// Each emulator's base URL, by machine number / [`MACHINES_PER_EMULATOR`].
    bmc_urls: Vec<String>,
    scratch: PathBuf,
    running: Arc<Mutex<HashMap<String, JoinHandle<()>>>>,
}

impl Firmware {
    fn power_off(&self, uuid: &str) {
        if let Some(task) = self.running.lock().unwrap_or_else(|e| e.into_inner()).remove(uuid) {
            task.abort();
        }
    }

    /// A network boot: the iPXE script from the site agent, and the ramdisk it names.
    async fn network_boot(&self, uuid: String, mac: String, host: String) {
        self.power_off(&uuid);
        let url = format!("{}/boot/ipxe?mac={mac}&uuid={uuid}", self.boot_url);
        let script = match reqwest::get(&url).await {
            Ok(answer) => answer.text().await.unwrap_or_default(),
            Err(err) => {
                eprintln!("firmware {uuid}: no boot script: {err}");
                return;
            }
        };
        let Some(kernel) = script.lines().find(|l| l.starts_with("kernel ")) else { return };
        let cmdline = kernel.split_whitespace().skip(2).collect::<Vec<_>>().join(" ");
        let Ok(cmdline) = bc_agent::ramdisk::Cmdline::parse(&cmdline) else { return };
        let spec: bc_agent::simulate::Simulated = "8xH100".parse().unwrap_or_else(|_| unreachable!());
        let dir = self.scratch.join(&uuid);
        let _ = std::fs::create_dir_all(dir.join("config"));
        let config = bc_agent::ramdisk::RamdiskConfig {
            cmdline,
            disk: dir.join("disk"),
            config_dir: dir.join("config"),
            inventory: InventorySource::simulated(bc_agent::simulate::inventory(&host, &spec)).0,
            poll: RAMDISK_POLL,
            state_dir: None,
        };
        let task = tokio::spawn(async move {
            if let Err(err) = bc_agent::ramdisk::run(config, std::future::pending()).await {
                eprintln!("ramdisk: {err:#}");
            }
        });
        self.running.lock().unwrap_or_else(|e| e.into_inner()).insert(uuid, task);
    }
}

/// Follows the emulator's notifications: a machine going from off to on with a network boot boots the ramdisk.
async fn follow(firmware: Firmware, mut changes: mpsc::UnboundedReceiver<Value>) {
    let mut power: HashMap<String, String> = HashMap::new();
    while let Some(system) = changes.recv().await {
        let Some(uuid) = system["uuid"].as_str().map(str::to_owned) else { continue };
        // The fake driver applies a power change only when the system is read after it is due; real machines
        // change by themselves, so the firmware reads the system once the change is due.
        if let Some(due) = system["pending_power"]["apply_time"].as_f64() {
            let number = usize::from_str_radix(uuid.rsplit('-').next().unwrap_or("0"), 16).unwrap_or(0);
            let base = firmware.bmc_urls.get(number / MACHINES_PER_EMULATOR).cloned().unwrap_or_default();
            let url = format!("{base}/redfish/v1/Systems/{uuid}");
            tokio::spawn(async move {
                let wait = due
                    - std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_secs_f64();
                tokio::time::sleep(Duration::from_secs_f64(wait.max(0.0) + 0.2)).await;
                let _ = reqwest::get(&url).await;
            });
        }
        let now = system["power_state"].as_str().unwrap_or("Off").to_owned();
        let before = power.insert(uuid.clone(), now.clone()).unwrap_or_else(|| "Off".to_owned());
        match (before.as_str(), now.as_str()) {
            ("Off", "On") if system["boot_device"] == "Pxe" => {
                let mac = system["nics"][0]["mac"].as_str().unwrap_or_default().to_owned();
                let host = system["name"].as_str().unwrap_or("m").to_owned();
                let firmware = firmware.clone();
                tokio::spawn(async move { firmware.network_boot(uuid, mac, host).await });
            }
            ("On", "Off") => firmware.power_off(&uuid),
            _ => {}
        }
    }
}

async fn notified(State(sender): State<mpsc::UnboundedSender<Value>>, axum::Json(system): axum::Json<Value>) {
    let _ = sender.send(system);
}

async fn scalar(db: &Db, query: &'static str) -> anyhow::Result<i64> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let n: i64 = sql::query_scalar(query).fetch_one(tx.conn()).await?;
    tx.commit().await?;
    Ok(n)
}

/// The database's committed transactions, and the statements' total execution time in ms
/// (pg_stat_statements, when loaded).
async fn spent(db: &Db) -> anyhow::Result<(i64, f64)> {
    let commits =
        scalar(db, "SELECT xact_commit::int8 FROM pg_stat_database WHERE datname = current_database()").await?;
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let exec: Option<f64> = sql::query_scalar("SELECT sum(total_exec_time)::float8 FROM pg_stat_statements")
        .fetch_optional(tx.conn())
        .await
        .unwrap_or(None);
    tx.commit().await.ok();
    Ok((commits, exec.unwrap_or(f64::NAN)))
}

pub async fn provision(config: ProvisionBenchConfig) -> anyhow::Result<()> {
    let machines = config.machines.max(1);
    let bench = BenchCluster::start_with(
        config.data_dir.as_deref(),
        config.keep,
        &[("shared_preload_libraries", "pg_stat_statements")],
    )
    .await?;
    let narrow = bench.one_row_insert_script().await?;
    bench.db.close().await;
    let db = Db::connect_lazy_with(
        bench.guard.cluster.connect_options("bench"),
        &DbConfig { max_connections: APP_CONNECTIONS, ..DbConfig::default() },
    );
    {
        let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
        sqlx::raw_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").execute(tx.conn()).await?;
        tx.commit().await?;
    }
    println!(
        "provision benchmark: PostgreSQL {}, durable cluster in {}, {} CPUs, {machines} machines on sushy-tools' \
         fake driver ({MACHINES_PER_EMULATOR} per emulator; power changes show 1-11 s after they are asked for), each \
         inspected by an in-process ramdisk",
        bench.version,
        bench.root.display(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    );
    let run =
        PgbenchRun { script: &narrow, database: "bench", clients: 16, seconds: 10, name: "1-row INSERT", env: &[] };
    let inserts = pgbench(&bench.bins, &bench.guard.cluster, run)?;
    println!("    pgbench 1-row INSERT, 16 clients: {inserts:>8.0} tx/s");

    let scratch = bench.root.join("provision");
    let pki = bc_pki::Bundle::init(&scratch.join("pki"), &bc_pki::InitOptions::default()).context("a PKI bundle")?;
    let app = App::new(db.clone()).with_pki(Arc::new(pki));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let server = format!("http://{}", listener.local_addr()?);
    let state = AppState::new(app.clone()).context("check the method table")?;
    tokio::spawn(async move { axum::serve(listener, bc_api::http::router(state)).await });
    let (stop_worker, worker_stop) = tokio::sync::watch::channel(false);
    let worker =
        Worker::new(app.clone(), WorkerConfig { idle_poll: Duration::from_millis(50), ..WorkerConfig::default() });
    tokio::spawn(worker.run(worker_stop));

    let owner = bench_caller("operator@bench")?;
    let site = bench_site(&app, &owner).await?;
    let pool = app.create_pool(&owner, h100_pool(&site, "metal")).await?.value;

    let (changes, follow_changes) = mpsc::unbounded_channel::<Value>();
    let notifications = TcpListener::bind("127.0.0.1:0").await?;
    let notify = format!("http://{}/notify", notifications.local_addr()?);
    let receiver = axum::Router::new().route("/notify", axum::routing::put(notified)).with_state(changes);
    tokio::spawn(async move { axum::serve(notifications, receiver).await });
    let mut emulators = Vec::new();
    let mut bmc_urls = Vec::new();
    for first in (0..machines).step_by(MACHINES_PER_EMULATOR) {
        let range = first..(first + MACHINES_PER_EMULATOR).min(machines);
        let (emulator, url) = start_sushy(&config.sushy, &scratch.join(format!("sushy-{first}")), range, &notify)?;
        emulators.push(emulator);
        bmc_urls.push(url);
    }

    let boot_port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let boot = BootConfig {
        listen: format!("127.0.0.1:{boot_port}").parse()?,
        url: format!("http://127.0.0.1:{boot_port}"),
        kernel: None,
        initrd: None,
        cache_dir: scratch.join("site").join("images"),
    };
    let token = app.create_join_token(&owner, &pool, 3600).await?.value.token;
    let spec: bc_agent::simulate::Simulated = "1xH100".parse().map_err(|err: String| anyhow::anyhow!(err))?;
    let site_agent = AgentConfig {
        server: server.clone(),
        trust: ServerTrust::InsecureHttp,
        join_token: Some(token),
        state_dir: scratch.join("site").join("state"),
        cdi_dir: scratch.join("site").join("cdi"),
        inventory: InventorySource::simulated(bc_agent::simulate::inventory("site-agent", &spec)).0,
        inventory_every: 0,
        site: Some(SiteConfig { boot: Some(boot.clone()), ..SiteConfig::default() }),
        runtime: None,
    };
    tokio::spawn(async move {
        if let Err(err) = bc_agent::run::run(site_agent, std::future::pending()).await {
            eprintln!("site agent: {err:#}");
        }
    });
    let firmware = Firmware {
        boot_url: boot.url.clone(),
        bmc_urls: bmc_urls.clone(),
        scratch: scratch.join("machines"),
        running: Arc::default(),
    };
    tokio::spawn(follow(firmware, follow_changes));
    // The emulator answers once it has read its 1,000 systems.
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    for url in &bmc_urls {
        while http.get(format!("{url}/redfish/v1/Systems")).send().await.is_err() {
            anyhow::ensure!(Instant::now() < deadline, "sushy-emulator did not answer");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    let (commits_before, exec_before) = spent(&db).await?;
    let events_before = scalar(&db, "SELECT count(*) FROM events").await?;
    let started = Instant::now();
    let nodes = {
        let (app, owner, pool, bmc_urls) = (app.clone(), owner.clone(), pool.clone(), bmc_urls.clone());
        each(machines, SETUP_TASKS, move |i| {
            let (app, owner, pool) = (app.clone(), owner.clone(), pool.clone());
            let bmc_url = bmc_urls[i / MACHINES_PER_EMULATOR].clone();
            async move {
                let bmc = bc_domain::node::NodeBmc {
                    driver: BmcDriver::Redfish,
                    address: bmc_url,
                    system_id: Some(uuid(i)),
                    insecure_tls: false,
                    drivers: default_drivers(BmcDriver::Redfish, &Default::default()),
                    boot_mac: Some(mac(i)),
                };
                let enrol = EnrolNode {
                    pool_id: pool,
                    name: format!("m-{i:05}"),
                    bmc,
                    username: "admin".into(),
                    password: "password".into(),
                };
                let node = app.enrol_node(&owner, enrol).await?.value;
                app.start_workflow(&owner, &node, WorkflowKind::Inspect, None).await?;
                Ok(node)
            }
        })
        .await?
    };
    let enrolled = started.elapsed();
    println!("    enrolled and started {machines} inspections in {:.1} s", enrolled.as_secs_f64());
    let mut last_print = Instant::now();
    loop {
        let ready = scalar(&db, "SELECT count(*) FROM nodes WHERE role = 'host' AND provision_state = 'ready'").await?;
        let failed =
            scalar(&db, "SELECT count(*) FROM nodes WHERE role = 'host' AND provision_state = 'failed'").await?;
        if ready + failed >= nodes.len() as i64 {
            anyhow::ensure!(failed == 0, "{failed} machines failed their inspection");
            break;
        }
        anyhow::ensure!(started.elapsed() < PATIENCE, "only {ready} of {machines} machines are ready");
        if last_print.elapsed() > Duration::from_secs(30) {
            println!("      {:>5.0} s: {ready} ready, {failed} failed", started.elapsed().as_secs_f64());
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = started.elapsed();
    let (commits_after, exec_after) = spent(&db).await?;
    let events = scalar(&db, "SELECT count(*) FROM events").await? - events_before;
    let commits = (commits_after - commits_before) as f64 / machines as f64;
    let exec = (exec_after - exec_before) / machines as f64;
    println!(
        "    all {machines} ready in {:.1} s ({:.2} machines/s; each: 2 power changes on the emulator, a ramdisk boot)",
        took.as_secs_f64(),
        machines as f64 / took.as_secs_f64()
    );
    println!(
        "    per machine: {commits:.0} transactions (= {:.1} ms of 1-row INSERTs at 16 clients), {:.1} events, \
         {exec:.1} ms of statement execution in PostgreSQL",
        commits / inserts * 1000.0,
        events as f64 / machines as f64,
    );
    let _ = stop_worker.send(true);
    drop(emulators);
    Ok(())
}
