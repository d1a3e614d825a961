//! The conformance suites: what every provider driver ([`provider`]: acquires one machine of one GPU with a real
//! account, and gives it back) and every BMC driver ([`bmc`]: powers a real machine on and off, sets its next
//! boot) must do, checked through the protocol against a running driver (`bcx conformance`, or from a test).

use std::time::Duration;

use crate::client::{CallError, DriverClient};
use crate::protocol::{
    Account, AcquireRequest, BmcTarget, BootDevice, BootRequest, Concern, ErrorCode, ListRequest, Machine,
    MachineState, PROTOCOL, PowerAction, PowerRequest, PowerState, PowerStateRequest, ReleaseRequest,
};

/// What the suite needs besides the driver: a real account to act for, and the GPU model its provider lends.
#[derive(Debug, Clone)]
pub struct Setup {
    pub account: Account,
    pub gpu_model: String,
    /// A key no earlier run used: it names the machine the suite acquires.
    pub key: String,
    /// How long a machine may stay `acquiring`.
    pub patience: Duration,
}

/// A check that failed, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{check}: {why}")]
pub struct Failure {
    pub check: &'static str,
    pub why: String,
}

fn fail(check: &'static str, why: impl Into<String>) -> Failure {
    Failure { check, why: why.into() }
}

fn call<T>(check: &'static str, result: Result<T, CallError>) -> Result<T, Failure> {
    result.map_err(|err| fail(check, err.to_string()))
}

/// Runs every check of a provider driver in order; answers the checks that passed, or the first that failed.
pub async fn provider(client: &DriverClient, setup: &Setup) -> Result<Vec<&'static str>, Failure> {
    let mut passed = Vec::new();
    let described = call("describe", client.describe().await)?;
    if described.protocol != PROTOCOL || described.name.is_empty() || !described.concerns.contains(&Concern::Provider) {
        return Err(fail("describe", format!("expected {PROTOCOL} and the provider concern, got {described:?}")));
    }
    passed.push("describe names the protocol and the provider concern");

    let account = setup.account.clone();
    let acquire = AcquireRequest {
        account: account.clone(),
        key: setup.key.clone(),
        gpus: 1,
        gpu_model: setup.gpu_model.clone(),
        duration_s: 3600,
    };
    let invalid = AcquireRequest { gpus: 0, ..acquire.clone() };
    match client.acquire(&invalid).await {
        Err(err) if err.code() == Some(ErrorCode::InvalidArgument) => {}
        other => return Err(fail("invalid acquire", format!("expected INVALID_ARGUMENT, got {other:?}"))),
    }
    passed.push("an acquire of 0 GPUs is refused INVALID_ARGUMENT");

    let first = call("acquire", client.acquire(&acquire).await)?;
    if matches!(first.state, MachineState::Released | MachineState::Failed) {
        return Err(fail("acquire", format!("a new machine is {:?}: {:?}", first.state, first.detail)));
    }
    passed.push("acquire answers a machine");
    let again = call("acquire again", client.acquire(&acquire).await)?;
    if again.id != first.id {
        return Err(fail("acquire again", format!("the same key acquired {} and {}", first.id, again.id)));
    }
    passed.push("the same key acquires the same machine");

    let ready = until_ready(client, &account, &first.id, setup.patience).await?;
    if ready.gpus.len() != 1 {
        return Err(fail("ready", format!("a machine of 1 GPU has {}", ready.gpus.len())));
    }
    passed.push("the machine becomes ready with the GPUs asked for");

    let released = call(
        "release",
        client.release(&ReleaseRequest { account: account.clone(), machine_id: first.id.clone() }).await,
    )?;
    if released.state != MachineState::Released || released.id != first.id {
        return Err(fail("release", format!("expected {} released, got {released:?}", first.id)));
    }
    passed.push("release gives the machine back");
    let twice = call(
        "release again",
        client.release(&ReleaseRequest { account: account.clone(), machine_id: first.id.clone() }).await,
    )?;
    if twice.state != MachineState::Released {
        return Err(fail("release again", format!("expected released, got {twice:?}")));
    }
    passed.push("releasing twice is one release");
    let deadline = tokio::time::Instant::now() + setup.patience;
    loop {
        let listed = call("list", client.list(&ListRequest { account: account.clone() }).await)?;
        if !listed.iter().any(|m| m.id == first.id && m.state != MachineState::Released) {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(fail("list", format!("{} is still listed as held after {:?}", first.id, setup.patience)));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    passed.push("a released machine is no longer held");

    let unknown = ReleaseRequest { account, machine_id: "no-such-machine".to_owned() };
    match client.release(&unknown).await {
        Err(err) if err.code() == Some(ErrorCode::NotFound) || err.code() == Some(ErrorCode::InvalidArgument) => {}
        other => return Err(fail("release unknown", format!("expected NOT_FOUND, got {other:?}"))),
    }
    passed.push("releasing an unknown machine is NOT_FOUND");
    Ok(passed)
}

/// Lists until the machine is `ready`, failing when it fails, goes, or stays `acquiring` past `patience`.
async fn until_ready(
    client: &DriverClient,
    account: &Account,
    id: &str,
    patience: Duration,
) -> Result<Machine, Failure> {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let listed = call("list", client.list(&ListRequest { account: account.clone() }).await)?;
        match listed.into_iter().find(|m| m.id == id) {
            Some(machine) if machine.state == MachineState::Ready => return Ok(machine),
            Some(machine) if machine.state != MachineState::Acquiring => {
                return Err(fail("ready", format!("the machine went {:?}: {:?}", machine.state, machine.detail)));
            }
            Some(_) => {}
            // A provider's list may lag its acquire (the lender's read side): absence is waited out like
            // `acquiring`, within the same patience.
            None if tokio::time::Instant::now() >= deadline => {
                return Err(fail("list", format!("the acquired machine {id} is not listed after {patience:?}")));
            }
            None => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(fail("ready", format!("still acquiring after {patience:?}")));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs every check of a BMC driver (the power and boot concerns) against a real BMC `bmc`: powers the machine
/// on, then off, and sets its next boot; answers the checks that passed, or the first that failed.
pub async fn bmc(client: &DriverClient, bmc: &BmcTarget) -> Result<Vec<&'static str>, Failure> {
    let mut passed = Vec::new();
    let described = call("describe", client.describe().await)?;
    let carries = described.concerns.contains(&Concern::Power) && described.concerns.contains(&Concern::Boot);
    if described.protocol != PROTOCOL || !carries {
        return Err(fail("describe", format!("expected {PROTOCOL} with power and boot, got {described:?}")));
    }
    passed.push("describe names the protocol and the power and boot concerns");
    let blank = BmcTarget { address: String::new(), ..bmc.clone() };
    match client.power_state(&PowerStateRequest { bmc: blank }).await {
        Err(err) if err.code() == Some(ErrorCode::InvalidArgument) => {}
        other => return Err(fail("invalid target", format!("expected INVALID_ARGUMENT, got {other:?}"))),
    }
    passed.push("a BMC without an address is refused INVALID_ARGUMENT");
    for (action, wanted) in [(PowerAction::On, PowerState::On), (PowerAction::Off, PowerState::Off)] {
        let set = call("set power", client.set_power(&PowerRequest { bmc: bmc.clone(), action }).await)?;
        let read = call("power state", client.power_state(&PowerStateRequest { bmc: bmc.clone() }).await)?;
        if set != wanted || read != wanted {
            return Err(fail("set power", format!("asked {action:?}: answered {set:?}, then read {read:?}")));
        }
    }
    passed.push("power on and off are what the BMC then shows");
    let device = call("set boot", client.set_boot(&BootRequest { bmc: bmc.clone(), device: BootDevice::Pxe }).await)?;
    if device != BootDevice::Pxe {
        return Err(fail("set boot", format!("asked pxe, answered {device:?}")));
    }
    passed.push("the next boot device is set");
    Ok(passed)
}
