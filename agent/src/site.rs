//! `bcd site`: the site agent. Besides a node's session and heartbeats, it asks the control plane for the
//! running `site` steps of its site's machines (one agent serves a site at a time; a standby gets none) and
//! carries each out through the machine's BMC driver, then reports how it ended. Steps run side by side (a
//! power change can take many seconds to show), apart from the heartbeats.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bc_domain::agent::{SiteStep, StepReport};
use bc_domain::id::WorkflowId;
use bc_domain::node::BmcDriver;
use bc_domain::profile::StepAction;

use crate::client::Client;
use crate::drivers::ipmi::{Ipmi, IpmiConfig};
use crate::drivers::redfish::{Redfish, RedfishConfig, RedfishTls, SystemRef};
use crate::drivers::{BmcError, BootDevice, Power, PowerAction};

/// How the site agent reaches BMCs.
#[derive(Debug, Clone, Default)]
pub struct SiteConfig {
    /// The CA (PEM) that signs the site's BMC certificates, for BMCs not enrolled with `insecureTls`.
    pub bmc_ca: Option<String>,
    /// The limit on each BMC call.
    pub bmc_timeout: Option<Duration>,
    /// Serve the site's machines that boot from the network (`--boot-listen`).
    pub boot: Option<crate::boot::BootConfig>,
    /// The out-of-process BMC drivers a concern may be bound to (`bcx:<name>`), by name.
    pub external: std::collections::BTreeMap<String, bcx::client::DriverClient>,
}

/// One machine's BMC, through the driver its step's concern is bound to.
enum Bmc {
    Redfish(Redfish, SystemRef),
    Ipmi(Ipmi),
    /// An out-of-process driver, over the driver protocol.
    External(bcx::client::DriverClient, bcx::protocol::BmcTarget),
}

fn driver_for(step: &SiteStep, config: &SiteConfig) -> Result<Bmc, String> {
    let concern = step.action.concern().ok_or_else(|| format!("{:?} is not a BMC step", step.action))?;
    let bound = step.bmc.drivers.get(&concern).map(String::as_str);
    let timeout = config.bmc_timeout.unwrap_or(Duration::from_secs(30));
    if let Some(name) = bound.and_then(|b| b.strip_prefix(bc_domain::profile::EXTERNAL_DRIVER_PREFIX)) {
        let Some(client) = config.external.get(name) else {
            return Err(format!(
                "the {} concern is bound to bcx:{name}, which this site agent was not started with \
                 (bcd site --bcx-driver {name}=https://...)",
                concern.as_str()
            ));
        };
        let target = bcx::protocol::BmcTarget {
            address: step.bmc.address.clone(),
            username: step.username.clone(),
            password: step.password.clone(),
            system_id: step.bmc.system_id.clone(),
        };
        return Ok(Bmc::External(client.clone(), target));
    }
    match (bound, step.bmc.driver) {
        (Some("redfish"), BmcDriver::Redfish) => {
            let plain = step.bmc.address.starts_with("http://");
            let tls = match (&config.bmc_ca, step.bmc.insecure_tls || plain) {
                (_, true) => RedfishTls::Insecure,
                (Some(ca), false) => RedfishTls::CaPem(ca.clone()),
                (None, false) => {
                    return Err(format!(
                        "{} is https and not enrolled with insecureTls, and this site agent has no CA for BMCs \
                         (bcd site --bmc-ca)",
                        step.bmc.address
                    ));
                }
            };
            let redfish = Redfish::new(RedfishConfig {
                base_url: step.bmc.address.clone(),
                username: step.username.clone(),
                password: step.password.clone(),
                tls,
                timeout,
            })
            .map_err(|err| err.to_string())?;
            let system = SystemRef::Id(step.bmc.system_id.clone().unwrap_or_else(|| "1".to_owned()));
            Ok(Bmc::Redfish(redfish, system))
        }
        (Some("ipmi"), BmcDriver::Ipmi) => {
            let (host, port) = match step.bmc.address.rsplit_once(':') {
                Some((host, port)) => {
                    (host, port.parse::<u16>().map_err(|_| format!("{}: not host:port", step.bmc.address))?)
                }
                None => (step.bmc.address.as_str(), 623),
            };
            let mut ipmi = IpmiConfig::new(host, &step.username, &step.password);
            ipmi.port = port;
            ipmi.timeout = timeout;
            Ok(Bmc::Ipmi(Ipmi::new(ipmi)))
        }
        (bound, driver) => Err(format!(
            "the {} concern is bound to {}, which this site agent cannot reach through a {} BMC",
            concern.as_str(),
            bound.unwrap_or("no driver"),
            driver.as_str()
        )),
    }
}

impl Bmc {
    async fn power_state(&self) -> Result<Power, BmcError> {
        match self {
            Bmc::Redfish(r, system) => r.power_state(system).await,
            Bmc::Ipmi(i) => i.power_state().await,
            Bmc::External(client, bmc) => {
                let request = bcx::protocol::PowerStateRequest { bmc: bmc.clone() };
                client.power_state(&request).await.map(power_of).map_err(|err| bmc_error(&bmc.address, err))
            }
        }
    }

    async fn power(&self, action: PowerAction) -> Result<(), BmcError> {
        match self {
            Bmc::Redfish(r, system) => r.power(system, action).await,
            Bmc::Ipmi(i) => i.power(action).await,
            Bmc::External(client, bmc) => {
                let request = bcx::protocol::PowerRequest { bmc: bmc.clone(), action };
                client.set_power(&request).await.map(|_| ()).map_err(|err| bmc_error(&bmc.address, err))
            }
        }
    }

    async fn boot(&self, device: BootDevice) -> Result<(), BmcError> {
        match self {
            Bmc::Redfish(r, system) => r.set_one_time_boot(system, device).await,
            Bmc::Ipmi(i) => i.set_one_time_boot(device).await,
            Bmc::External(client, bmc) => {
                let request = bcx::protocol::BootRequest { bmc: bmc.clone(), device };
                client.set_boot(&request).await.map(|_| ()).map_err(|err| bmc_error(&bmc.address, err))
            }
        }
    }
}

fn power_of(state: bcx::protocol::PowerState) -> Power {
    match state {
        bcx::protocol::PowerState::On => Power::On,
        bcx::protocol::PowerState::Off => Power::Off,
        bcx::protocol::PowerState::Unknown => Power::Unknown,
    }
}

/// An out-of-process driver's failure, in the kinds the site agent acts on (retry, give up, say why).
fn bmc_error(address: &str, err: bcx::client::CallError) -> BmcError {
    use bcx::client::CallError;
    use bcx::protocol::ErrorCode;
    let said = format!("{address} through its driver: {err}");
    match err {
        CallError::Refused(refused) => match refused.code {
            ErrorCode::Unauthenticated => BmcError::Unauthorized(said),
            ErrorCode::NotFound => BmcError::NotFound(said),
            ErrorCode::Unavailable | ErrorCode::CapacityUnavailable => {
                BmcError::Unavailable { retry_after_s: None, message: said }
            }
            ErrorCode::InvalidArgument | ErrorCode::Unimplemented => BmcError::Config(said),
        },
        CallError::Unreachable(_) => BmcError::Unreachable(said),
        CallError::Protocol(_) => BmcError::Protocol(said),
    }
}

/// How long a power step waits for the BMC to show the power it asked for.
const POWER_SETTLES: Duration = Duration::from_secs(20);

/// The power a step leaves the machine in, if it is a power step.
fn power_target(action: StepAction) -> Option<Power> {
    match action {
        StepAction::PowerOn | StepAction::PowerReset => Some(Power::On),
        StepAction::PowerOff => Some(Power::Off),
        _ => None,
    }
}

/// How long the site agent waits before asking a busy BMC (HTTP 503) again, when it does not say.
const BUSY_WAIT: Duration = Duration::from_secs(2);
/// The longest it waits for a busy BMC at a time, whatever the BMC says.
const BUSY_WAIT_MAX: Duration = Duration::from_secs(30);

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or_default()
}

/// Carries out one site step: what was done (with the power the BMC shows afterwards, for a power step), or
/// what went wrong. A BMC that answers it is busy (HTTP 503, as many do while the host powers up or down) is
/// asked again after the wait it names, for as long as the attempt's deadline leaves time; other errors end
/// the attempt at once.
pub async fn run_step(step: &SiteStep, config: &SiteConfig) -> Result<(String, Option<Power>), String> {
    let bmc = driver_for(step, config)?;
    let done = loop {
        match carry_out(step, &bmc, config).await {
            Ok(done) => break done,
            Err(BmcError::Unavailable { retry_after_s, message }) => {
                let wait = retry_after_s.map_or(BUSY_WAIT, Duration::from_secs).min(BUSY_WAIT_MAX);
                if now_ms() + wait.as_millis() as i64 >= step.deadline_ms {
                    return Err(format!("the BMC stayed busy until the step's deadline: {message}"));
                }
                eprintln!("bcd site: {message}; asking again in {} s", wait.as_secs());
                tokio::time::sleep(wait).await;
            }
            Err(err) => return Err(err.to_string()),
        }
    };
    let Some(target) = power_target(step.action) else { return Ok((done, None)) };
    // BMCs apply a power change a little later: wait a while for it to show, then report what is shown.
    let deadline = tokio::time::Instant::now() + POWER_SETTLES;
    let mut seen = bmc.power_state().await.ok();
    while seen != Some(target) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        seen = bmc.power_state().await.ok();
    }
    Ok((done, Some(seen.unwrap_or(Power::Unknown))))
}

async fn carry_out(step: &SiteStep, bmc: &Bmc, config: &SiteConfig) -> Result<String, BmcError> {
    match step.action {
        StepAction::PowerOn => {
            bmc.power(PowerAction::On).await?;
            Ok("powered on".to_owned())
        }
        StepAction::PowerOff => {
            bmc.power(PowerAction::Off).await?;
            Ok("powered off".to_owned())
        }
        StepAction::PowerReset => {
            // A machine that is off is switched on: a reset of a machine that is off does nothing on many BMCs.
            if bmc.power_state().await? == Power::Off {
                bmc.power(PowerAction::On).await?;
                Ok("was off: powered on".to_owned())
            } else {
                bmc.power(PowerAction::Reset).await?;
                Ok("reset".to_owned())
            }
        }
        StepAction::BootFromNetwork => {
            bmc.boot(BootDevice::Pxe).await?;
            Ok("next boot from the network".to_owned())
        }
        StepAction::BootFromDisk => {
            bmc.boot(BootDevice::Disk).await?;
            Ok("next boot from disk".to_owned())
        }
        StepAction::BootFromVirtualMedia => {
            bmc.boot(BootDevice::Cd).await?;
            Ok("next boot from virtual media".to_owned())
        }
        StepAction::EjectVirtualMedia => match bmc {
            Bmc::Redfish(r, system) => {
                r.eject_virtual_media(system).await?;
                Ok("virtual media ejected".to_owned())
            }
            Bmc::Ipmi(_) => Err(BmcError::Config("IPMI has no virtual media".to_owned())),
            Bmc::External(..) => Err(BmcError::Config("out-of-process drivers carry no virtual media".to_owned())),
        },
        StepAction::InsertVirtualMedia => {
            let Some(media) = &step.media else {
                return Err(BmcError::Config(
                    "nothing to insert: the workflow's profile deploys no iso image".to_owned(),
                ));
            };
            let Some(boot) = &config.boot else {
                return Err(BmcError::Config(
                    "the site agent serves no images to BMCs: start it with --boot-listen".to_owned(),
                ));
            };
            // The BMC fetches the image from this agent's content-addressed cache, which checks its hash.
            let url = format!("{}/images/sha256/{}", boot.url.trim_end_matches('/'), media.sha256);
            match bmc {
                Bmc::Redfish(r, system) => {
                    r.insert_virtual_media(system, &url).await?;
                    Ok(format!("inserted {} ({url})", media.image_id))
                }
                Bmc::Ipmi(_) => Err(BmcError::Config("IPMI has no virtual media".to_owned())),
                Bmc::External(..) => Err(BmcError::Config("out-of-process drivers carry no virtual media".to_owned())),
            }
        }
        other => Err(BmcError::Config(format!("{other:?} does not run on the site"))),
    }
}

/// How often the site agent asks for site steps.
pub const STEPS_POLL: Duration = Duration::from_millis(500);
/// The most site steps carried out at once: most of a step is waiting for a BMC, so many fit.
pub const STEPS_AT_ONCE: usize = 256;

/// Serves the site's steps for as long as it runs: each poll (through the agent's current client, once it has
/// one) asks for the running site steps and starts each attempt not already under way here, at most
/// [`STEPS_AT_ONCE`] at a time; each is reported when it ends, and one whose deadline passed while it waited
/// for its turn is left to the worker's retry. A step whose report is lost is still running
/// for the control plane, so a later poll carries it out again: every site step may run twice.
pub async fn serve_steps(clients: tokio::sync::watch::Receiver<Option<Client>>, config: SiteConfig) {
    let under_way: Arc<Mutex<HashSet<(WorkflowId, u32, u32)>>> = Arc::default();
    let limit = Arc::new(tokio::sync::Semaphore::new(STEPS_AT_ONCE));
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let client = clients.borrow().clone();
        if let Some(client) = client {
            match client.site_steps().await {
                Ok(work) if work.serving => {
                    for step in work.steps {
                        let key = (step.workflow_id.clone(), step.index, step.attempt);
                        if !under_way.lock().unwrap_or_else(|e| e.into_inner()).insert(key.clone()) {
                            continue;
                        }
                        let (client, config, limit, under_way) =
                            (client.clone(), config.clone(), limit.clone(), under_way.clone());
                        tasks.spawn(async move {
                            let Ok(_permit) = limit.acquire_owned().await else { return };
                            // An attempt whose time ran out while it waited here is the worker's to retry.
                            if now_ms() >= step.deadline_ms {
                                under_way.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                                return;
                            }
                            let report = match run_step(&step, &config).await {
                                Ok((message, power)) => {
                                    StepReport { attempt: step.attempt, ok: true, message: Some(message), power }
                                }
                                Err(message) => {
                                    StepReport { attempt: step.attempt, ok: false, message: Some(message), power: None }
                                }
                            };
                            if let Err(err) = client.report_site_step(&step, &report).await {
                                eprintln!(
                                    "bcd site: reporting step {} of {} failed: {err:#}",
                                    step.index, step.workflow_id
                                );
                            }
                            under_way.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                        });
                    }
                }
                Ok(_) => {}
                Err(err) => eprintln!("bcd site: asking for site steps failed: {err:#}"),
            }
        }
        while tasks.try_join_next().is_some() {}
        tokio::time::sleep(STEPS_POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::{get, post};
    use bc_domain::node::{BmcDriver, NodeBmc};
    use bc_domain::profile::Concern;
    use serde_json::json;

    use super::*;

    /// A BMC with one system that answers its first reset with 503 and `Retry-After: 1`, then obeys.
    async fn busy_once_bmc() -> (String, Arc<AtomicU32>) {
        let resets = Arc::new(AtomicU32::new(0));
        let power = Arc::new(Mutex::new("On"));
        let (seen, state) = (resets.clone(), power.clone());
        let app = axum::Router::new()
            .route(
                "/redfish/v1/Systems",
                get(|| async { axum::Json(json!({ "Members": [{ "@odata.id": "/redfish/v1/Systems/1" }] })) }),
            )
            .route(
                "/redfish/v1/Systems/1",
                get(move || {
                    let state = state.clone();
                    async move {
                        let power = *state.lock().expect("lock");
                        axum::Json(json!({
                            "Id": "1", "PowerState": power,
                            "Actions": { "#ComputerSystem.Reset": {
                                "target": "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset" } }
                        }))
                    }
                }),
            )
            .route(
                "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
                post(move || {
                    let (seen, power) = (seen.clone(), power.clone());
                    async move {
                        if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                            let mut headers = HeaderMap::new();
                            headers.insert("retry-after", "1".parse().expect("header"));
                            return (StatusCode::SERVICE_UNAVAILABLE, headers);
                        }
                        *power.lock().expect("lock") = "Off";
                        (StatusCode::NO_CONTENT, HeaderMap::new())
                    }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        (base, resets)
    }

    fn power_off(address: &str, deadline_ms: i64) -> SiteStep {
        SiteStep {
            workflow_id: WorkflowId::generate(),
            index: 3,
            attempt: 1,
            action: StepAction::PowerOff,
            node_id: bc_domain::id::NodeId::generate(),
            deadline_ms,
            bmc: NodeBmc {
                driver: BmcDriver::Redfish,
                address: address.to_owned(),
                system_id: Some("1".into()),
                insecure_tls: false,
                drivers: [(Concern::Power, "redfish".to_owned())].into_iter().collect(),
                boot_mac: None,
            },
            username: "admin".into(),
            password: "pw".into(),
            media: None,
        }
    }

    #[tokio::test]
    async fn inserting_virtual_media_needs_an_iso_and_the_boot_server_the_bmc_fetches_it_from() {
        let mut step = power_off("http://127.0.0.1:1", now_ms() + 60_000);
        step.action = StepAction::InsertVirtualMedia;
        step.bmc.drivers.insert(Concern::VirtualMedia, "redfish".to_owned());
        let err = run_step(&step, &SiteConfig::default()).await.expect_err("no image");
        assert!(err.contains("no iso image"), "{err}");
        step.media = Some(bc_domain::agent::ImageToWrite {
            image_id: "img_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("image id"),
            sha256: "ab".repeat(32),
            size: 4096,
            format: bc_domain::image::ImageFormat::Iso,
        });
        let err = run_step(&step, &SiteConfig::default()).await.expect_err("no boot server");
        assert!(err.contains("--boot-listen"), "{err}");
    }

    #[tokio::test]
    async fn a_busy_bmc_is_asked_again_after_the_wait_it_names_within_the_attempts_deadline() {
        let (base, resets) = busy_once_bmc().await;
        let step = power_off(&base, now_ms() + 60_000);
        let done = run_step(&step, &SiteConfig::default()).await.expect("the second try succeeds");
        assert_eq!(done, ("powered off".to_owned(), Some(Power::Off)));
        assert_eq!(resets.load(Ordering::SeqCst), 2, "asked once more after the 503");

        // With no time left before the deadline, the busy answer ends the attempt.
        let (base, resets) = busy_once_bmc().await;
        let step = power_off(&base, now_ms() + 500);
        let err = run_step(&step, &SiteConfig::default()).await.expect_err("no time to wait");
        assert!(err.contains("stayed busy until the step's deadline") && err.contains("503"), "{err}");
        assert_eq!(resets.load(Ordering::SeqCst), 1);
    }

    /// A BMC driver out of process (here in the test's process, behind the driver protocol's mutual TLS): one
    /// machine's power, which a `bcx:` binding reaches.
    struct Switch(Arc<Mutex<bcx::protocol::PowerState>>);

    impl bcx::server::BmcDriver for Switch {
        fn power_state(
            &self,
            _: bcx::protocol::PowerStateRequest,
        ) -> bcx::server::DriverFuture<'_, bcx::protocol::PowerState> {
            Box::pin(async move { Ok(*self.0.lock().expect("lock")) })
        }

        fn set_power(
            &self,
            request: bcx::protocol::PowerRequest,
        ) -> bcx::server::DriverFuture<'_, bcx::protocol::PowerState> {
            Box::pin(async move {
                if request.bmc.password != "pw" {
                    return Err(bcx::protocol::DriverError::new(bcx::protocol::ErrorCode::Unauthenticated, "wrong"));
                }
                let mut power = self.0.lock().expect("lock");
                *power = match request.action {
                    PowerAction::On | PowerAction::Reset => bcx::protocol::PowerState::On,
                    _ => bcx::protocol::PowerState::Off,
                };
                Ok(*power)
            })
        }

        fn set_boot(&self, _: bcx::protocol::BootRequest) -> bcx::server::DriverFuture<'_, ()> {
            Box::pin(async { Ok(()) })
        }
    }

    #[tokio::test]
    async fn a_concern_bound_to_an_out_of_process_driver_is_carried_out_through_the_driver_protocol() {
        bc_pki::tls::install_default_provider();
        let dir = std::env::temp_dir().join(format!("bcd-site-bcx-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let bundle = bc_pki::Bundle::init(&dir, &bc_pki::InitOptions::default()).expect("bundle");
        let hosts = ["127.0.0.1".to_owned()];
        let issue = |name: &str| {
            let (cert_pem, key_pem) = bundle.issue_driver_identity(name, &hosts).expect("identity");
            bcx::tls::Identity { ca_pem: bundle.ca_pem().to_owned(), cert_pem, key_pem }
        };
        let (served, caller) = (issue("switch"), issue("site-agent"));
        let _ = std::fs::remove_dir_all(&dir);
        let power = Arc::new(Mutex::new(bcx::protocol::PowerState::Off));
        let driver = bcx::server::Driver::bmc("switch", "1", Switch(Arc::clone(&power)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("https://127.0.0.1:{}", listener.local_addr().expect("addr").port());
        tokio::spawn(async move { bcx::server::serve(listener, &served, driver, std::future::pending()).await });
        let client = bcx::client::DriverClient::new(&url, &caller).expect("client");
        let config = SiteConfig { external: [("switch".to_owned(), client)].into(), ..SiteConfig::default() };

        let mut step = power_off("ipmi.example:623", now_ms() + 60_000);
        step.action = StepAction::PowerOn;
        step.bmc.driver = BmcDriver::Ipmi;
        step.bmc.drivers = [(Concern::Power, "bcx:switch".to_owned())].into_iter().collect();
        let (done, shown) = run_step(&step, &config).await.expect("powered on through the driver");
        assert_eq!((done.as_str(), shown), ("powered on", Some(Power::On)));
        assert_eq!(*power.lock().expect("lock"), bcx::protocol::PowerState::On);

        let mut refused = step.clone();
        refused.password = "guess".into();
        let err = run_step(&refused, &config).await.expect_err("wrong credentials");
        assert!(err.contains("refused the credentials"), "{err}");
        let mut unknown = step.clone();
        unknown.bmc.drivers = [(Concern::Power, "bcx:other".to_owned())].into_iter().collect();
        let err = run_step(&unknown, &config).await.expect_err("a driver the agent was not started with");
        assert!(err.contains("--bcx-driver other="), "{err}");
    }
}
