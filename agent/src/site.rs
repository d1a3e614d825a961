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
}

/// One machine's BMC, through the driver its step's concern is bound to.
enum Bmc {
    Redfish(Redfish, SystemRef),
    Ipmi(Ipmi),
}

fn driver_for(step: &SiteStep, config: &SiteConfig) -> Result<Bmc, String> {
    let concern = step.action.concern().ok_or_else(|| format!("{:?} is not a BMC step", step.action))?;
    let bound = step.bmc.drivers.get(&concern).map(String::as_str);
    let timeout = config.bmc_timeout.unwrap_or(Duration::from_secs(30));
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
        }
    }

    async fn power(&self, action: PowerAction) -> Result<(), BmcError> {
        match self {
            Bmc::Redfish(r, system) => r.power(system, action).await,
            Bmc::Ipmi(i) => i.power(action).await,
        }
    }

    async fn boot(&self, device: BootDevice) -> Result<(), BmcError> {
        match self {
            Bmc::Redfish(r, system) => r.set_one_time_boot(system, device).await,
            Bmc::Ipmi(i) => i.set_one_time_boot(device).await,
        }
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

/// Carries out one site step: what was done (with the power the BMC shows afterwards, for a power step), or
/// what went wrong.
pub async fn run_step(step: &SiteStep, config: &SiteConfig) -> Result<(String, Option<Power>), String> {
    let bmc = driver_for(step, config)?;
    let done = carry_out(step, &bmc).await?;
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

async fn carry_out(step: &SiteStep, bmc: &Bmc) -> Result<String, String> {
    let failed = |err: BmcError| err.to_string();
    match step.action {
        StepAction::PowerOn => {
            bmc.power(PowerAction::On).await.map_err(failed)?;
            Ok("powered on".to_owned())
        }
        StepAction::PowerOff => {
            bmc.power(PowerAction::Off).await.map_err(failed)?;
            Ok("powered off".to_owned())
        }
        StepAction::PowerReset => {
            // A machine that is off is switched on: a reset of a machine that is off does nothing on many BMCs.
            if bmc.power_state().await.map_err(failed)? == Power::Off {
                bmc.power(PowerAction::On).await.map_err(failed)?;
                Ok("was off: powered on".to_owned())
            } else {
                bmc.power(PowerAction::Reset).await.map_err(failed)?;
                Ok("reset".to_owned())
            }
        }
        StepAction::BootFromNetwork => {
            bmc.boot(BootDevice::Pxe).await.map_err(failed)?;
            Ok("next boot from the network".to_owned())
        }
        StepAction::BootFromDisk => {
            bmc.boot(BootDevice::Disk).await.map_err(failed)?;
            Ok("next boot from disk".to_owned())
        }
        StepAction::BootFromVirtualMedia => {
            bmc.boot(BootDevice::Cd).await.map_err(failed)?;
            Ok("next boot from virtual media".to_owned())
        }
        StepAction::EjectVirtualMedia => match bmc {
            Bmc::Redfish(r, system) => {
                r.eject_virtual_media(system).await.map_err(failed)?;
                Ok("virtual media ejected".to_owned())
            }
            Bmc::Ipmi(_) => Err("IPMI has no virtual media".to_owned()),
        },
        StepAction::InsertVirtualMedia => {
            Err("no image to insert: the site agent serves the ramdisk over the network, not as virtual media"
                .to_owned())
        }
        other => Err(format!("{other:?} does not run on the site")),
    }
}

/// How often the site agent asks for site steps.
pub const STEPS_POLL: Duration = Duration::from_millis(500);
/// The most site steps carried out at once.
pub const STEPS_AT_ONCE: usize = 64;

/// Serves the site's steps for as long as it runs: each poll (through the agent's current client, once it has
/// one) asks for the running site steps and starts each attempt not already under way here, at most
/// [`STEPS_AT_ONCE`] at a time; each is reported when it ends. A step whose report is lost is still running
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
