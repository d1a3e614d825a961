//! A machine from bare metal to a deployed host and back, end to end: a machine on sushy-tools' Redfish
//! emulator is enrolled; the site agent (`bcd site`, in process) runs its BMC steps and serves its boot path;
//! a small machine simulator stands for the firmware, following the emulator's power and boot changes (its
//! external notifier): powered on with a network boot, it fetches its iPXE script from the site agent and
//! starts `bcd ramdisk` with the script's kernel command line; powered on from disk, it starts the deployed
//! system's `bcd` with the configuration the ramdisk wrote. The inspection, the deployment (the image written to
//! a file standing for the disk, its SHA-256 checked), a reservation bound on the deployed host, and the release
//! that wipes it all run through the real services. The site agent that serves the site is killed during the
//! release: its standby takes the site over and the release ends once. In a second run the control plane is a real
//! `better-compute serve` process, SIGKILLed twice during a deployment and started again, and the ramdisk dies
//! and is started again in the same boot: the deployment ends once, with no step tried twice. Slow tests: they
//! need `sushy-emulator`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use bc_agent::run::{AgentConfig, InventorySource, ServerTrust};
use bc_agent::{cdi, simulate};
use serde_json::{Value, json};
use sha2::Digest as _;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::agents::Cluster;
use crate::site::{MAC, MACHINE, PASSWORD, Sushy, USER};

/// How long one workflow may take: each power change on the emulator takes up to 11 s to show.
const WORKFLOW_PATIENCE: Duration = Duration::from_secs(180);

/// What runs on the simulated machine.
#[derive(Default)]
struct Running {
    /// `ramdisk` or `disk`, and its task (aborted when the power goes off, as a power cut would).
    system: Option<(&'static str, JoinHandle<()>)>,
    /// Every system booted, in order.
    boots: Vec<&'static str>,
    /// The kernel command line of the last network boot.
    cmdline: Option<String>,
}

/// A real virtual machine for the network boot: QEMU with an e1000 NIC (its iPXE ROM), the disk on virtio and
/// the configuration partition shared over 9p.
#[derive(Clone)]
struct Vm {
    /// `kvm` or `tcg`.
    accel: &'static str,
    /// The iPXE script's URL as the VM reaches the site agent (the host is 10.0.2.2 in QEMU's user network).
    bootfile: String,
    /// Where each boot's serial console goes (`console-<n>.log`).
    consoles: PathBuf,
}

/// The simulated machine: its disk and configuration partition, and what runs on it.
#[derive(Clone)]
struct Machine {
    disk: PathBuf,
    config: PathBuf,
    /// The site agents' boot servers, tried in order (as a DHCP server with two next servers would).
    boot_urls: Vec<String>,
    server: String,
    ca: String,
    state: PathBuf,
    running: Arc<Mutex<Running>>,
    /// Boots from the network in a real VM rather than in process.
    vm: Option<Vm>,
}

fn inventory() -> InventorySource {
    let spec: simulate::Simulated = "2xH100".parse().expect("spec");
    InventorySource::simulated(simulate::inventory("metal-1", &spec)).0
}

impl Machine {
    fn power_off(&self) {
        let mut running = self.running.lock().expect("lock");
        if let Some((_, task)) = running.system.take() {
            task.abort();
        }
    }

    /// The firmware: boots from the network or from the disk, as the BMC set it.
    async fn power_on(&self, boot_device: &str) {
        self.power_off();
        let (name, task) = match (boot_device, &self.vm) {
            ("Pxe", Some(vm)) => ("vm", self.vm_boot(vm)),
            ("Pxe", None) => self.network_boot().await,
            _ => self.disk_boot(),
        };
        let mut running = self.running.lock().expect("lock");
        running.boots.push(name);
        running.system = Some((name, task));
    }

    /// Powers the VM on: its firmware boots from the network (iPXE asks the site agent for its script) into the
    /// ramdisk, which writes the VM's disk. Powering off kills the VM.
    fn vm_boot(&self, vm: &Vm) -> JoinHandle<()> {
        let boots = self.running.lock().expect("lock").boots.len();
        let console = vm.consoles.join(format!("console-{boots}.log"));
        let mut qemu = tokio::process::Command::new("qemu-system-x86_64");
        qemu.args(["-machine", &format!("pc,accel={}", vm.accel), "-m", "1024", "-display", "none", "-no-reboot"])
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
            .args(["-netdev", &format!("user,id=n0,bootfile={}", vm.bootfile)])
            .args(["-device", &format!("e1000,netdev=n0,mac={MAC},romfile=/usr/lib/ipxe/qemu/pxe-e1000.rom")])
            .args(["-drive", &format!("file={},format=raw,if=virtio", self.disk.display())])
            .arg("-virtfs")
            .arg(format!("local,path={},mount_tag=config,security_model=none,id=config", self.config.display()))
            .args(["-boot", "order=n"])
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        tokio::spawn(async move {
            let mut child = qemu.spawn().expect("qemu-system-x86_64");
            let status = child.wait().await;
            eprintln!("simulated machine: the VM stopped: {status:?} (console: {})", console.display());
        })
    }

    /// Fetches the iPXE script and starts the kernel it names: the ramdisk, with the script's command line.
    async fn network_boot(&self) -> (&'static str, JoinHandle<()>) {
        let mut script = None;
        for base in &self.boot_urls {
            let url = format!("{base}/boot/ipxe?mac={MAC}&uuid={MACHINE}");
            if let Ok(answer) = reqwest::get(&url).await.and_then(reqwest::Response::error_for_status) {
                script = Some(answer.text().await.expect("the iPXE script"));
                break;
            }
        }
        let script = script.expect("a boot server answers");
        let Some(kernel) = script.lines().find(|l| l.starts_with("kernel ")) else {
            // `exit`: the firmware goes on to the disk.
            return self.disk_boot();
        };
        let cmdline = kernel.split_whitespace().skip(2).collect::<Vec<_>>().join(" ");
        self.running.lock().expect("lock").cmdline = Some(cmdline.clone());
        ("ramdisk", self.ramdisk(&cmdline))
    }

    /// Starts `bcd ramdisk` with a kernel command line, keeping its session in the boot's `/run`.
    fn ramdisk(&self, cmdline: &str) -> JoinHandle<()> {
        let config = bc_agent::ramdisk::RamdiskConfig {
            cmdline: bc_agent::ramdisk::Cmdline::parse(cmdline).expect("the ramdisk's command line"),
            disk: self.disk.clone(),
            config_dir: self.config.clone(),
            inventory: inventory(),
            poll: Duration::from_millis(100),
            state_dir: Some(self.state.join("run")),
        };
        tokio::spawn(async move {
            if let Err(err) = bc_agent::ramdisk::run(config, std::future::pending()).await {
                eprintln!("simulated machine: the ramdisk stopped: {err:#}");
            }
        })
    }

    /// Kills the running ramdisk (as SIGKILL would) and starts it again in the same boot, as the ramdisk's init
    /// restarts a service that died.
    fn restart_ramdisk(&self) {
        let mut running = self.running.lock().expect("lock");
        let cmdline = running.cmdline.clone().expect("a network boot");
        if let Some(("ramdisk", task)) = running.system.take() {
            task.abort();
        }
        running.system = Some(("ramdisk", self.ramdisk(&cmdline)));
    }

    /// Boots what the disk holds: the deployed system's `bcd`, configured from `bcd.env`, if it was deployed.
    fn disk_boot(&self) -> (&'static str, JoinHandle<()>) {
        let env = std::fs::read_to_string(self.config.join("bcd.env")).unwrap_or_default();
        let value = |key: &str| env.lines().find_map(|l| l.strip_prefix(&format!("{key}="))).map(str::to_owned);
        let Some(join_token) = value("BCD_JOIN_TOKEN") else {
            return ("nothing to boot", tokio::spawn(async {}));
        };
        assert_eq!(value("BCD_SERVER").as_deref(), Some(self.server.as_str()), "{env}");
        let ca = std::fs::read_to_string(self.config.join("ca.pem")).expect("the CA the ramdisk wrote");
        assert_eq!(ca, self.ca, "the ramdisk trusts the control plane's CA and hands it on");
        let config = AgentConfig {
            server: self.server.clone(),
            trust: ServerTrust::PinnedCa(ca),
            join_token: Some(join_token),
            state_dir: self.state.join("bcd"),
            cdi_dir: self.state.join("cdi"),
            inventory: inventory(),
            inventory_every: 5,
            site: None,
            runtime: None,
        };
        let task = tokio::spawn(async move {
            if let Err(err) = bc_agent::run::run(config, std::future::pending()).await {
                eprintln!("simulated machine: the deployed agent stopped: {err:#}");
            }
        });
        ("disk", task)
    }

    fn boots(&self) -> Vec<&'static str> {
        self.running.lock().expect("lock").boots.clone()
    }
}

/// Follows the emulator's notifications: a machine that goes from off to on boots.
async fn follow(machine: Machine, mut changes: mpsc::UnboundedReceiver<Value>) {
    let mut power = "Off".to_owned();
    while let Some(system) = changes.recv().await {
        let now = system["power_state"].as_str().unwrap_or("Off").to_owned();
        match (power.as_str(), now.as_str()) {
            ("Off", "On") => machine.power_on(system["boot_device"].as_str().unwrap_or("Hdd")).await,
            ("On", "Off") => machine.power_off(),
            _ => {}
        }
        power = now;
    }
}

async fn notified(State(sender): State<mpsc::UnboundedSender<Value>>, axum::Json(system): axum::Json<Value>) {
    let _ = sender.send(system);
}

async fn await_workflow(cluster: &Cluster, id: &str) -> Value {
    let deadline = tokio::time::Instant::now() + WORKFLOW_PATIENCE;
    loop {
        let wf = cluster.call(reqwest::Method::GET, &format!("/v1/workflows/{id}"), None).await.1;
        if wf["state"] != "running" {
            return wf;
        }
        assert!(tokio::time::Instant::now() < deadline, "workflow {id} still runs: {wf}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn start_workflow(cluster: &Cluster, node: &str, body: Value) -> String {
    let (status, started) =
        cluster.call(reqwest::Method::POST, &format!("/v1/nodes/{node}/workflows"), Some(body)).await;
    assert_eq!(status, 201, "{started}");
    started["id"].as_str().expect("id").to_owned()
}

async fn node(cluster: &Cluster, node: &str) -> Value {
    bc_projections::testing::catch_up(cluster.db()).await;
    cluster.call(reqwest::Method::GET, &format!("/v1/nodes/{node}"), None).await.1
}

fn sha256_of(path: &Path, len: usize) -> String {
    let bytes = std::fs::read(path).expect("the disk");
    hex::encode(sha2::Sha256::digest(&bytes[..len.min(bytes.len())]))
}

/// A machine on the emulator with its simulator following the emulator's changes, and the boot servers two site
/// agents would run.
struct Rig {
    sushy: Sushy,
    machine: Machine,
    scratch: PathBuf,
    /// The machine's 4 MiB disk, full of old data.
    disk: PathBuf,
    boot: [bc_agent::boot::BootConfig; 2],
}

async fn rig(cluster: &Cluster) -> Rig {
    rig_with(cluster, None).await
}

/// The ramdisk's kernel and initramfs, and how the VM runs, for a machine that boots in a real VM.
struct VmBoot {
    kernel: PathBuf,
    initrd: PathBuf,
    accel: &'static str,
}

async fn rig_with(cluster: &Cluster, vm: Option<VmBoot>) -> Rig {
    // The machine simulator listens for the emulator's notifications.
    let (changes, follow_changes) = mpsc::unbounded_channel::<Value>();
    let notifications = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let notify_url = format!("http://{}/notify", notifications.local_addr().expect("addr"));
    let app = axum::Router::new().route("/notify", axum::routing::put(notified)).with_state(changes);
    tokio::spawn(async move { axum::serve(notifications, app).await });
    let sushy = Sushy::start_notifying(Some(&notify_url));
    let bmc = sushy.client();
    let system = bc_agent::drivers::redfish::SystemRef::Id(MACHINE.to_owned());
    crate::agents::eventually("sushy-emulator to answer", || {
        let (bmc, system) = (&bmc, &system);
        async move { bmc.power_state(system).await.ok() }
    })
    .await;
    let scratch = cluster.root.path().join("machine");
    std::fs::create_dir_all(scratch.join("config")).expect("scratch");
    let (kernel, initrd) = match &vm {
        Some(vm) => (vm.kernel.clone(), vm.initrd.clone()),
        None => {
            std::fs::write(scratch.join("vmlinuz"), b"a kernel").expect("kernel");
            std::fs::write(scratch.join("initrd"), b"an initramfs").expect("initrd");
            (scratch.join("vmlinuz"), scratch.join("initrd"))
        }
    };
    // A VM reaches the host's loopback as 10.0.2.2.
    let host = if vm.is_some() { "10.0.2.2" } else { "127.0.0.1" };
    let boot = |name: &str| {
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
        bc_agent::boot::BootConfig {
            listen: format!("127.0.0.1:{port}").parse().expect("addr"),
            url: format!("http://{host}:{port}"),
            kernel: Some(kernel.clone()),
            initrd: Some(initrd.clone()),
            cache_dir: scratch.join(name).join("cache"),
        }
    };
    let boot = [boot("site-1"), boot("site-2")];
    let disk = scratch.join("disk.img");
    std::fs::write(&disk, vec![0x5a; 4 << 20]).expect("disk");
    let machine = Machine {
        disk: disk.clone(),
        config: scratch.join("config"),
        boot_urls: boot.iter().map(|b| b.url.clone()).collect(),
        server: cluster.base.clone(),
        ca: cluster.ca.clone(),
        state: scratch.clone(),
        running: Arc::default(),
        vm: vm.map(|vm| Vm {
            accel: vm.accel,
            bootfile: format!("{}/boot/ipxe?mac={MAC}", boot[0].url),
            consoles: scratch.clone(),
        }),
    };
    tokio::spawn(follow(machine.clone(), follow_changes));
    Rig { sushy, machine, scratch, disk, boot }
}

fn site_config(boot: &bc_agent::boot::BootConfig) -> bc_agent::site::SiteConfig {
    bc_agent::site::SiteConfig { boot: Some(boot.clone()), ..Default::default() }
}

/// Enrols the emulator's machine with its boot MAC; answers its node id.
async fn enrol(cluster: &Cluster, sushy: &Sushy) -> String {
    let (status, enrolled) = cluster
        .call(
            reqwest::Method::POST,
            "/v1/nodes/enrol",
            Some(json!({
                "poolId": cluster.pool.to_string(), "name": "metal-1", "bootMac": MAC,
                "bmc": { "driver": "redfish", "address": sushy.base_url, "systemId": MACHINE,
                         "username": USER, "password": PASSWORD }
            })),
        )
        .await;
    assert_eq!(status, 201, "{enrolled}");
    enrolled["id"].as_str().expect("id").to_owned()
}

/// Uploads a 3 MiB image and makes a profile that deploys it: the image, its SHA-256 and the profile.
async fn image_and_profile(cluster: &Cluster) -> (Vec<u8>, String, Value) {
    let image: Vec<u8> = (0..(3 << 20) + 12_345).map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let sha = hex::encode(sha2::Sha256::digest(&image));
    let uploaded = cluster
        .http
        .post(format!("{}/v1/images?name=gpu-os&version=1&format=raw&sha256={sha}", cluster.base))
        .bearer_auth(crate::http_api::ROOT)
        .header("content-type", "application/octet-stream")
        .body(image.clone())
        .send()
        .await
        .expect("upload");
    assert_eq!(uploaded.status().as_u16(), 201);
    let image_id = uploaded.json::<Value>().await.expect("body")["id"].clone();
    let (status, profile) = cluster
        .call(
            reqwest::Method::POST,
            "/v1/profiles",
            Some(json!({
                "name": "gpu-node", "target": "metal", "imageId": image_id, "allowUnverifiedImage": true,
                "drivers": { "power": "redfish", "boot": "redfish", "deploy": "bcd" },
                "userData": "#cloud-config\n", "hostConfig": { "hostname": "metal-1" }
            })),
        )
        .await;
    assert_eq!(status, 201, "{profile}");
    (image, sha, profile)
}

/// How many times workflow `id` ended (its stream's end events).
async fn ends_of(cluster: &Cluster, id: &str) -> i64 {
    let mut tx = cluster.db().begin(bc_eventstore::TxOptions::READ_ONLY).await.expect("begin");
    let n = bc_eventstore::sql::query_scalar(
        "SELECT count(*) FROM events WHERE stream_id = $1 AND event_type LIKE 'workflow.%' \
         AND event_type NOT LIKE 'workflow.step_%' AND event_type <> 'workflow.created'",
    )
    .bind(id)
    .fetch_one(tx.conn())
    .await
    .expect("count");
    tx.commit().await.expect("commit");
    n
}

#[tokio::test]
async fn a_machine_is_inspected_deployed_from_its_image_runs_a_reservation_and_is_wiped_at_release() {
    if !crate::hostile::slow_tests_enabled("bare metal end to end against sushy-emulator") {
        return;
    }
    bc_pki::tls::install_default_provider();
    let cluster = Cluster::start("metal-e2e").await;
    let Rig { sushy, machine, scratch, disk, boot: [boot_1, boot_2] } = rig(&cluster).await;
    let mut site_1 = cluster.site_agent("site-1", site_config(&boot_1)).await;
    let node_id = enrol(&cluster, &sushy).await;
    // Inspection: boot from the network into the ramdisk, which reports the machine's inventory.
    let inspect = start_workflow(&cluster, &node_id, json!({ "kind": "inspect" })).await;
    let done = await_workflow(&cluster, &inspect).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert!(done["steps"][2]["detail"].as_str().unwrap_or("").contains("2 GPUs"), "{done}");
    // A standby site agent, once the first serves the site.
    let mut site_2 = cluster.site_agent("site-2", site_config(&boot_2)).await;
    let inspected = node(&cluster, &node_id).await;
    assert_eq!(
        (&inspected["provisionState"], &inspected["gpuCount"], &inspected["power"]),
        (&json!("ready"), &json!(2), &json!("off")),
        "{inspected}"
    );

    // Deployment of a profile's image.
    let (image, sha, profile) = image_and_profile(&cluster).await;
    let deploy = start_workflow(&cluster, &node_id, json!({ "kind": "deploy", "profileId": profile["id"] })).await;
    let done = await_workflow(&cluster, &deploy).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(sha256_of(&disk, image.len()), sha, "the disk holds the image");
    assert!(
        std::fs::read(&disk).expect("disk")[image.len()..].iter().all(|&b| b == 0x5a),
        "nothing past the image was written"
    );
    assert_eq!(
        std::fs::read_to_string(scratch.join("config").join("user-data")).expect("user data"),
        "#cloud-config\n"
    );
    let cached = scratch.join("site-1").join("cache").join("sha256").join(&sha);
    assert_eq!(sha256_of(&cached, usize::MAX), sha, "the site agent's cache holds the image by its hash");
    let deployed = node(&cluster, &node_id).await;
    assert_eq!(
        (&deployed["provisionState"], &deployed["connectivity"], &deployed["schedulable"]),
        (&json!("deployed"), &json!("connected"), &json!(true)),
        "{deployed}"
    );
    assert_eq!(machine.boots(), vec!["ramdisk", "ramdisk", "disk"], "inspect, deploy, then the deployed disk");

    // A reservation runs on the deployed host: its agent binds it.
    let (reservation, on) = cluster.reserve("metal-1", 2).await;
    assert_eq!(on, vec![node_id.clone()]);
    cluster.await_reservation(&reservation, "active").await;
    crate::agents::eventually("the bound reservation's CDI spec", || {
        let (dir, id) = (scratch.join("cdi"), reservation.clone());
        async move { cdi::read_spec(&dir, &id).ok() }
    })
    .await;
    let (status, body) =
        cluster.call(reqwest::Method::POST, &format!("/v1/reservations/{reservation}/release"), Some(json!({}))).await;
    assert_eq!(status, 200, "{body}");
    cluster.await_reservation(&reservation, "released").await;

    // Release: back into the ramdisk, which wipes the disk; the machine ends off and ready.
    // The serving site agent dies once the machine was reset into the ramdisk: the standby takes the site over
    // when its lease lapses, and the release ends once.
    // The ramdisk must have taken its first step (so it fetched the CA from the serving agent): a ramdisk that
    // boots from an agent that died before it answered waits for that agent (see docs/provisioning.md).
    let release = start_workflow(&cluster, &node_id, json!({ "kind": "release" })).await;
    crate::agents::eventually("the release's ramdisk at work", || {
        let (cluster, path) = (&cluster, format!("/v1/workflows/{release}"));
        async move {
            let wf = cluster.call(reqwest::Method::GET, &path, None).await.1;
            (wf["steps"][1]["state"] == "succeeded" && wf["steps"][2]["state"] != "pending").then_some(())
        }
    })
    .await;
    site_1.kill();
    let done = await_workflow(&cluster, &release).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    let ends = ends_of(&cluster, &release).await;
    assert_eq!(ends, 1, "the release ended exactly once");
    let wiped = std::fs::read(&disk).expect("disk");
    assert!(wiped[..1 << 20].iter().all(|&b| b == 0), "the start of the disk is wiped");
    assert!(wiped[wiped.len() - (1 << 20)..].iter().all(|&b| b == 0), "the end of the disk is wiped");
    assert_eq!(std::fs::read_dir(scratch.join("config")).expect("config").count(), 0, "the configuration is gone");
    let released = node(&cluster, &node_id).await;
    assert_eq!((&released["provisionState"], &released["power"]), (&json!("ready"), &json!("off")), "{released}");

    // An installer ISO through virtual media: the BMC fetches it from the serving site agent (the standby that
    // took over), which serves it from its cache by hash.
    let iso = vec![0x42u8; 64 << 10];
    let iso_sha = hex::encode(sha2::Sha256::digest(&iso));
    let uploaded = cluster
        .http
        .post(format!("{}/v1/images?name=installer&version=1&format=iso&sha256={iso_sha}", cluster.base))
        .bearer_auth(crate::http_api::ROOT)
        .header("content-type", "application/octet-stream")
        .body(iso)
        .send()
        .await
        .expect("upload");
    assert_eq!(uploaded.status().as_u16(), 201);
    let iso_id = uploaded.json::<Value>().await.expect("body")["id"].clone();
    let (status, installer) = cluster
        .call(
            reqwest::Method::POST,
            "/v1/profiles",
            Some(json!({
                "name": "installer", "target": "metal", "imageId": iso_id, "allowUnverifiedImage": true,
                "drivers": { "power": "redfish", "boot": "redfish", "deploy": "bcd", "virtual-media": "redfish" },
                "steps": [
                    { "name": "insert", "action": "insert-virtual-media" },
                    { "name": "boot-cd", "action": "boot-from-virtual-media" },
                    { "name": "install", "action": "power-reset" },
                    { "name": "done", "action": "power-off" },
                    { "name": "eject", "action": "eject-virtual-media" }
                ]
            })),
        )
        .await;
    assert_eq!(status, 201, "{installer}");
    let install = start_workflow(&cluster, &node_id, json!({ "kind": "deploy", "profileId": installer["id"] })).await;
    let done = await_workflow(&cluster, &install).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    let inserted = done["steps"][0]["detail"].as_str().unwrap_or("");
    assert!(inserted.contains(&format!("{}/images/sha256/{iso_sha}", boot_2.url)), "{done}");
    let cached = scratch.join("site-2").join("cache").join("sha256").join(&iso_sha);
    assert_eq!(sha256_of(&cached, usize::MAX), iso_sha, "the BMC fetched the ISO through the site agent's cache");
    machine.power_off();
    site_2.stop().await;
}

/// Waits until step `index` of workflow `id` runs (or the workflow ended).
async fn await_step(cluster: &Cluster, id: &str, index: usize) {
    crate::agents::eventually(&format!("step {index} of {id} running"), || {
        let path = format!("/v1/workflows/{id}");
        async move {
            let (status, wf) = cluster.call(reqwest::Method::GET, &path, None).await;
            (status == 200 && (wf["steps"][index]["state"] == "running" || wf["state"] != "running")).then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_finishes_once_when_the_control_plane_process_and_the_ramdisk_are_killed_during_it() {
    if !crate::hostile::slow_tests_enabled("a control plane killed during a deployment, against sushy-emulator") {
        return;
    }
    bc_pki::tls::install_default_provider();
    let mut cluster = Cluster::start_process("metal-crash").await;
    let Rig { sushy, machine, disk, boot: [boot, _], .. } = rig(&cluster).await;
    let mut site = cluster.site_agent("site-1", site_config(&boot)).await;
    let node_id = enrol(&cluster, &sushy).await;
    let inspect = start_workflow(&cluster, &node_id, json!({ "kind": "inspect" })).await;
    assert_eq!(await_workflow(&cluster, &inspect).await["state"], "succeeded");
    let (image, sha, profile) = image_and_profile(&cluster).await;

    // SIGKILL while the ramdisk writes the image (the site agent fetching it through the control plane), and again
    // while the deployed machine's agent joins: each time the process starts again on the same database.
    let deploy = start_workflow(&cluster, &node_id, json!({ "kind": "deploy", "profileId": profile["id"] })).await;
    for (step, what) in [(2, "write-image"), (6, "await-join")] {
        await_step(&cluster, &deploy, step).await;
        if step == 2 {
            // The ramdisk dies too, and its init starts it again: it goes on with the session this boot claimed.
            machine.restart_ramdisk();
        }
        cluster.kill_server();
        eprintln!("killed the control plane during {what}");
        cluster.start_server();
    }
    let done = await_workflow(&cluster, &deploy).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(ends_of(&cluster, &deploy).await, 1, "the deployment ended exactly once");
    let started: Vec<&Value> = done["steps"].as_array().expect("steps").iter().filter(|s| s["attempt"] != 1).collect();
    assert!(started.is_empty(), "no step needed a second attempt: {started:?}");
    assert_eq!(sha256_of(&disk, image.len()), sha, "the disk holds the image");
    // The read models are the process's own: they catch up by themselves.
    crate::agents::eventually("the node deployed and connected", || {
        let path = format!("/v1/nodes/{node_id}");
        let cluster = &cluster;
        async move {
            let (_, found) = cluster.call(reqwest::Method::GET, &path, None).await;
            (found["provisionState"] == "deployed" && found["connectivity"] == "connected").then_some(())
        }
    })
    .await;
    machine.power_off();
    site.stop().await;
}

/// The workspace's `target/<profile>` folder this test binary runs from.
pub(crate) fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary");
    exe.parent().and_then(Path::parent).expect("target/<profile>/deps").to_owned()
}

/// Whether KVM runs a guest here: `/dev/kvm` can exist where a guest never starts (nested virtualization turned
/// off: QEMU then spins in the kernel, a core busy for nothing), so a kernel is booted with it once per test run
/// and must print its banner within 5 seconds (under KVM it takes well under one).
pub(crate) fn kvm_works(kernel: &Path) -> bool {
    static WORKS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WORKS.get_or_init(|| kvm_boots(kernel))
}

fn kvm_boots(kernel: &Path) -> bool {
    use std::io::Read as _;
    if !Path::new("/dev/kvm").exists() {
        return false;
    }
    let child = std::process::Command::new("qemu-system-x86_64")
        .args(["-machine", "pc,accel=kvm", "-m", "256", "-display", "none", "-no-reboot", "-serial", "stdio"])
        .arg("-kernel")
        .arg(kernel)
        .args(["-append", "console=ttyS0 panic=-1"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn();
    let Ok(mut child) = child else { return false };
    let mut stdout = child.stdout.take().expect("stdout");
    let (seen, saw) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = Vec::new();
        let mut buffer = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buffer) {
            if n == 0 {
                break;
            }
            text.extend_from_slice(&buffer[..n]);
            if String::from_utf8_lossy(&text).contains("Linux version") {
                let _ = seen.send(());
                break;
            }
        }
    });
    let works = saw.recv_timeout(Duration::from_secs(5)).is_ok();
    let _ = child.kill();
    let _ = child.wait();
    works
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_vm_boots_from_the_network_into_the_ramdisk_and_is_inspected_and_deployed() {
    if !crate::hostile::slow_tests_enabled("a QEMU virtual machine booted from the network") {
        return;
    }
    let tools = ["qemu-system-x86_64", "busybox", "depmod", "cpio"];
    if let Some(missing) = tools.iter().find(|tool| which(tool).is_none()) {
        eprintln!("skipped: {missing} is not installed (.ci/run installs qemu-system-x86, ipxe-qemu, ...)");
        return;
    }
    if !Path::new("/usr/lib/ipxe/qemu/pxe-e1000.rom").exists() {
        eprintln!("skipped: the ipxe-qemu package is not installed");
        return;
    }
    bc_pki::tls::install_default_provider();
    let bcd = target_dir().join("bcd");
    assert!(bcd.exists(), "{} is missing: build it first (cargo build -p bc-agent)", bcd.display());

    // The ramdisk: Debian's kernel and an initramfs with this build's `bcd ramdisk` (two simulated H100s).
    let mut cluster = Cluster::start("metal-vm").await;
    let images = cluster.root.path().join("ramdisk");
    let built = std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/ramdisk-image"))
        .arg("--bcd")
        .arg(&bcd)
        .arg("--out")
        .arg(&images)
        .arg("--cache")
        .arg(target_dir().join("ramdisk-cache"))
        .args(["--network", "qemu-user", "--", "--simulate", "2xH100", "--hostname", "metal-1", "--poll-ms", "200"])
        .output()
        .expect("scripts/ramdisk-image");
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let kernel = images.join("vmlinuz");
    let accel = if kvm_works(&kernel) { "kvm" } else { "tcg" };
    eprintln!("the VM runs with {accel}");
    // The VM knows the control plane as `localhost` (its /etc/hosts maps it to the host, 10.0.2.2), a name the
    // server's certificate holds.
    cluster.base = cluster.base.replace("127.0.0.1", "localhost");
    let vm = VmBoot { kernel, initrd: images.join("initrd.img"), accel };
    let Rig { sushy, machine, disk, boot: [boot, _], scratch } = rig_with(&cluster, Some(vm)).await;
    let mut site = cluster.site_agent("site-1", site_config(&boot)).await;
    let node_id = enrol(&cluster, &sushy).await;

    let inspect = start_workflow(&cluster, &node_id, json!({ "kind": "inspect" })).await;
    let done = await_workflow(&cluster, &inspect).await;
    assert_eq!(done["state"], "succeeded", "{done}\n{}", consoles(&scratch));
    assert!(done["steps"][2]["detail"].as_str().unwrap_or("").contains("2 GPUs"), "{done}");

    let (image, sha, profile) = image_and_profile(&cluster).await;
    let deploy = start_workflow(&cluster, &node_id, json!({ "kind": "deploy", "profileId": profile["id"] })).await;
    let done = await_workflow(&cluster, &deploy).await;
    assert_eq!(done["state"], "succeeded", "{done}\n{}", consoles(&scratch));
    assert_eq!(sha256_of(&disk, image.len()), sha, "the VM's disk holds the image");
    assert_eq!(machine.boots(), vec!["vm", "vm", "disk"], "inspect and deploy in the VM, then the deployed disk");
    let deployed = node(&cluster, &node_id).await;
    assert_eq!(
        (&deployed["provisionState"], &deployed["connectivity"]),
        (&json!("deployed"), &json!("connected")),
        "{deployed}"
    );
    machine.power_off();
    site.stop().await;
}

/// The VM's serial consoles, for a failure's message.
fn consoles(scratch: &Path) -> String {
    let mut text = String::new();
    for n in 0..4 {
        if let Ok(console) = std::fs::read_to_string(scratch.join(format!("console-{n}.log"))) {
            let tail: Vec<&str> = console.lines().rev().take(30).collect();
            text += &format!("--- console {n} ---\n{}\n", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
        }
    }
    text
}

pub(crate) fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).map(|dir| dir.join(tool)).find(|candidate| candidate.exists()))
}
