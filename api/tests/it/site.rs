//! The site agent end to end: a machine on OpenStack's sushy-tools Redfish emulator is enrolled, a site agent
//! (`bcd site`, in process) joins, and an inspection workflow's site steps are carried out on the emulated BMC
//! (the next boot from the network, power on, power off) while the test stands in for the ramdisk. A slow test:
//! it needs `sushy-emulator` (`.ci/run` installs it).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bc_agent::drivers::Power;
use bc_agent::drivers::redfish::{Redfish, RedfishConfig, RedfishTls, SystemRef};
use bc_domain::profile::RunsOn;
use bc_domain::workflow::Report;
use serde_json::{Value, json};

use crate::agents::{Cluster, eventually};

pub(crate) const MACHINE: &str = "5c1a2b3d-0000-4e5f-8a9b-00000000e2e1";
/// The MAC address the emulated machine boots from the network with.
pub(crate) const MAC: &str = "52:54:00:e2:e1:01";
pub(crate) const USER: &str = "admin";
pub(crate) const PASSWORD: &str = "sushy-test-password";
/// `PASSWORD` under bcrypt (sushy's auth file takes bcrypt only), as `python3 -c "import bcrypt;
/// print(bcrypt.hashpw(b'sushy-test-password', bcrypt.gensalt(4)).decode())"` made it.
const PASSWORD_BCRYPT: &str = "$2b$04$4xv75.tnge7e.fYqcSRwGO.ZTwGv1hl8ldma0yb23yl.IFFF/xvM6";

/// A sushy-emulator with one fake machine, switched off; killed on drop.
pub(crate) struct Sushy {
    child: Child,
    pub(crate) base_url: String,
    dir: std::path::PathBuf,
}

impl Drop for Sushy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Sushy {
    fn start() -> Sushy {
        Sushy::start_notifying(None)
    }

    /// The emulator with the machine's power and boot changes sent to `notify` (sushy's external notifier: a
    /// PUT of the system's state on each change), which a machine simulator follows.
    pub(crate) fn start_notifying(notify: Option<&str>) -> Sushy {
        let notifier = match notify {
            Some(url) => format!("EXTERNAL_NOTIFICATION_URL = '{url}'\n"),
            None => String::new(),
        };
        let dir = std::env::temp_dir().join(format!("bc-site-e2e-{}", bc_domain::id::new_id("t")));
        std::fs::create_dir_all(&dir).expect("scratch");
        let auth = dir.join("htpasswd");
        std::fs::write(&auth, format!("{USER}:{PASSWORD_BCRYPT}\n")).expect("htpasswd");
        let config = dir.join("sushy.conf");
        let state = dir.join("state");
        std::fs::write(
            &config,
            format!(
                "SUSHY_EMULATOR_FAKE_DRIVER = True\nSUSHY_EMULATOR_STATE_DIR = {state:?}\nSUSHY_EMULATOR_AUTH_FILE = {auth:?}\n\
                 SUSHY_EMULATOR_FAKE_SYSTEMS = [{{'uuid': '{MACHINE}', 'name': 'metal-1', 'power_state': 'Off', \
                 'external_notifier': {}, 'nics': [{{'mac': '{MAC}', 'ip': '10.0.0.9'}}]}}]\n{notifier}",
                if notify.is_some() { "True" } else { "False" }
            ),
        )
        .expect("config");
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a port").local_addr().expect("addr").port();
        let program = std::env::var("BETTER_COMPUTE_SUSHY_EMULATOR").unwrap_or_else(|_| "sushy-emulator".to_owned());
        let log = std::fs::File::create(dir.join("sushy.log")).expect("log");
        let child = Command::new(&program)
            .arg("--config")
            .arg(&config)
            .args(["--interface", "127.0.0.1", "--port", &port.to_string()])
            .env("TMPDIR", &dir)
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|err| {
                panic!("cannot start {program}: {err}; install it with `python3 -m pip install sushy-tools==2.2.0`")
            });
        Sushy { child, base_url: format!("http://127.0.0.1:{port}"), dir }
    }

    pub(crate) fn client(&self) -> Redfish {
        Redfish::new(RedfishConfig {
            base_url: self.base_url.clone(),
            username: USER.to_owned(),
            password: PASSWORD.to_owned(),
            tls: RedfishTls::Insecure,
            timeout: Duration::from_secs(20),
        })
        .expect("a Redfish client")
    }
}

/// Enrols a machine of the emulator with the BMC `address` and `password`, and starts its inspection: the node and
/// the workflow.
async fn enrol_and_inspect(cluster: &Cluster, name: &str, address: &str, password: &str) -> (String, String) {
    let (status, enrolled) = cluster
        .call(
            reqwest::Method::POST,
            "/v1/nodes/enrol",
            Some(json!({
                "poolId": cluster.pool.to_string(), "name": name,
                "bmc": { "driver": "redfish", "address": address, "systemId": MACHINE,
                         "username": USER, "password": password }
            })),
        )
        .await;
    assert_eq!(status, 201, "{enrolled}");
    let node = enrolled["id"].as_str().expect("id").to_owned();
    let (status, started) = cluster
        .call(reqwest::Method::POST, &format!("/v1/nodes/{node}/workflows"), Some(json!({ "kind": "inspect" })))
        .await;
    assert_eq!(status, 201, "{started}");
    (node, started["id"].as_str().expect("id").to_owned())
}

/// The workflow once it ended.
async fn ended(cluster: &Cluster, id: &str) -> Value {
    eventually("the workflow's end", || {
        let path = format!("/v1/workflows/{id}");
        async move {
            let wf = cluster.call(reqwest::Method::GET, &path, None).await.1;
            (wf["state"] != "running").then_some(wf)
        }
    })
    .await
}

#[tokio::test]
async fn a_site_agent_runs_an_inspection_s_bmc_steps_on_the_emulated_machine() {
    if !crate::hostile::slow_tests_enabled("site agent against sushy-emulator") {
        return;
    }
    let sushy = Sushy::start();
    let bmc = sushy.client();
    let system = SystemRef::Id(MACHINE.to_owned());
    eventually("sushy-emulator to answer", || {
        let bmc = &bmc;
        let system = &system;
        async move { bmc.power_state(system).await.ok() }
    })
    .await;

    let cluster = Cluster::start("site-e2e").await;
    let mut site = cluster.site_agent("site-1", bc_agent::site::SiteConfig::default()).await;
    let (node, id) = enrol_and_inspect(&cluster, "metal-1", &sushy.base_url, PASSWORD).await;

    // The site agent sets the next boot from the network and powers the machine on.
    let at_inspect: Value = eventually("the site steps before the inspection", || {
        let (cluster, path) = (&cluster, format!("/v1/workflows/{id}"));
        async move {
            let wf = cluster.call(reqwest::Method::GET, &path, None).await.1;
            (wf["steps"][2]["state"] == "running" || wf["state"] != "running").then_some(wf)
        }
    })
    .await;
    assert_eq!(at_inspect["state"], "running", "{at_inspect}");
    assert_eq!(at_inspect["steps"][0]["detail"], "next boot from the network", "{at_inspect}");
    assert_eq!(at_inspect["steps"][1]["detail"], "was off: powered on", "{at_inspect}");
    assert_eq!(bmc.boot_override(&system).await.expect("boot override").target.as_deref(), Some("Pxe"));
    eventually("the machine to be on", || {
        let (bmc, system) = (&bmc, &system);
        async move { (bmc.power_state(system).await.ok() == Some(Power::On)).then_some(()) }
    })
    .await;

    // The test stands in for the ramdisk's inspection; the site agent then powers the machine off.
    let app = bc_commands::App::new(cluster.t.db.clone());
    let owner = bc_commands::Caller::new("root".parse().expect("t"), "ramdisk@test".parse().expect("i"), "agent");
    let attempt = at_inspect["steps"][2]["attempt"].as_u64().expect("attempt") as u32;
    app.report_step(
        &owner,
        &id.parse().expect("id"),
        2,
        attempt,
        RunsOn::Ramdisk,
        Report::Succeeded { detail: Some("inspected".into()) },
    )
    .await
    .expect("report the inspection");
    let done = ended(&cluster, &id).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["steps"][3]["detail"], "powered off", "{done}");
    eventually("the machine to be off", || {
        let (bmc, system) = (&bmc, &system);
        async move { (bmc.power_state(system).await.ok() == Some(Power::Off)).then_some(()) }
    })
    .await;
    bc_projections::testing::catch_up(&cluster.t.db).await;
    let (_, read) = cluster.call(reqwest::Method::GET, &format!("/v1/nodes/{node}"), None).await;
    assert_eq!(read["provisionState"], "ready", "{read}");
    assert_eq!(read["power"], "off", "the power the BMC last reported: {read}");
    site.stop().await;
}

#[tokio::test]
async fn wrong_bmc_credentials_and_an_unreachable_bmc_fail_the_workflow_and_the_machine_naming_the_problem() {
    if !crate::hostile::slow_tests_enabled("site agent against sushy-emulator") {
        return;
    }
    let sushy = Sushy::start();
    let bmc = sushy.client();
    let system = SystemRef::Id(MACHINE.to_owned());
    eventually("sushy-emulator to answer", || {
        let (bmc, system) = (&bmc, &system);
        async move { bmc.power_state(system).await.ok() }
    })
    .await;
    let cluster = Cluster::start("site-bad-bmc").await;
    let mut site = cluster.site_agent("site-1", bc_agent::site::SiteConfig::default()).await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("a port").local_addr().expect("addr").port();
    let mut workflows = Vec::new();
    for (name, address, password, problem) in [
        ("wrong-password", sushy.base_url.clone(), "not-the-password", "refused the credentials"),
        ("unreachable", format!("http://127.0.0.1:{closed}"), PASSWORD, "unreachable"),
    ] {
        let (node, id) = enrol_and_inspect(&cluster, name, &address, password).await;
        workflows.push((node, id, problem));
    }
    for (node, id, problem) in workflows {
        let failed = ended(&cluster, &id).await;
        assert_eq!(failed["state"], "failed", "{failed}");
        let reason = failed["reason"].as_str().unwrap_or("");
        assert!(reason.contains("after 3 attempt") && reason.contains(problem), "{problem}: {failed}");
        bc_projections::testing::catch_up(&cluster.t.db).await;
        let (_, read) = cluster.call(reqwest::Method::GET, &format!("/v1/nodes/{node}"), None).await;
        assert_eq!(read["provisionState"], "failed", "{read}");
    }
    // The machine behind the refused credentials was never touched.
    assert_eq!(bmc.power_state(&system).await.expect("power"), Power::Off);
    site.stop().await;
}
