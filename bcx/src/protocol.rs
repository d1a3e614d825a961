//! The protocol's messages, version `bcx/v1`: JSON bodies over HTTP with mutual TLS, one route per call under
//! `/bcx/v1/`. A later version is served beside this one under its own path; a driver answers `describe` with
//! the version it speaks, and the control plane refuses a driver that speaks none it knows.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The protocol version this crate speaks.
pub const PROTOCOL: &str = "bcx/v1";

/// What a driver can be bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Concern {
    /// Acquires, lists and releases machines of an external capacity provider.
    Provider,
    /// Reads and changes a machine's power through its BMC.
    Power,
    /// Sets the device a machine boots from next, once.
    Boot,
}

/// `GET /bcx/v1/describe`: who the driver is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Describe {
    /// [`PROTOCOL`].
    pub protocol: String,
    /// The driver's name, as provider accounts and profiles bind it (`better-compute`).
    pub name: String,
    pub version: String,
    pub concerns: Vec<Concern>,
}

/// The provider account a call acts for: its endpoint and settings, and its credential, opened from its seal
/// by the control plane for this call only (a driver keeps none).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Account {
    pub account_id: String,
    pub endpoint: String,
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    pub credential: String,
}

impl std::fmt::Debug for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Account")
            .field("account_id", &self.account_id)
            .field("endpoint", &self.endpoint)
            .field("settings", &self.settings)
            .field("credential", &"<hidden>")
            .finish()
    }
}

/// `POST /bcx/v1/provider/acquire`: a machine with `gpus` GPUs for `duration_s`. The same `key` acquires the same
/// machine: a retry never acquires twice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AcquireRequest {
    pub account: Account,
    /// 1 to 128 printable characters.
    pub key: String,
    pub gpus: u32,
    /// The GPU model the borrowing pool holds (`H100`).
    pub gpu_model: String,
    pub duration_s: u64,
}

/// `POST /bcx/v1/provider/list`: the machines the account holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListRequest {
    pub account: Account,
}

/// `POST /bcx/v1/provider/release`: gives a machine back; releasing one already released is no error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseRequest {
    pub account: Account,
    pub machine_id: String,
}

/// Where a provider's machine is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MachineState {
    /// Asked for; not usable yet.
    Acquiring,
    /// Usable: its GPUs are the account's until it is released or its time runs out.
    Ready,
    /// Given back, or its time ran out.
    Released,
    /// The provider could not give it.
    Failed,
}

/// One GPU of a provider's machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineGpu {
    /// Unique at the provider.
    pub id: String,
    /// The GPU's model or product (`H100`, `H100-SXM5-80GB`).
    pub model: String,
    #[serde(default)]
    pub memory_mib: u64,
}

/// A provider's machine, as a driver describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Machine {
    /// Unique at the provider.
    pub id: String,
    pub state: MachineState,
    pub gpus: Vec<MachineGpu>,
    /// Until when the provider lends it, epoch milliseconds, when known.
    #[serde(default)]
    pub until_ms: Option<i64>,
    /// Why, for `failed`; what the provider said.
    #[serde(default)]
    pub detail: Option<String>,
}

/// `POST /bcx/v1/provider/list`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Machines {
    pub machines: Vec<Machine>,
}

/// The BMC a power or boot call acts on, as the machine was enrolled: its address, the credentials the control
/// plane opened from their seal for this call, and the system behind it when the BMC holds several.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BmcTarget {
    pub address: String,
    pub username: String,
    pub password: String,
    #[serde(default)]
    pub system_id: Option<String>,
}

impl std::fmt::Debug for BmcTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BmcTarget")
            .field("address", &self.address)
            .field("username", &self.username)
            .field("password", &"<hidden>")
            .field("system_id", &self.system_id)
            .finish()
    }
}

/// A machine's power, as its BMC says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PowerState {
    On,
    Off,
    /// Neither: on its way, or not said.
    Unknown,
}

/// What to do with a machine's power.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PowerAction {
    On,
    /// Off now, as pulling the plug.
    Off,
    /// Asks the operating system to shut down.
    GracefulOff,
    /// A hard reset.
    Reset,
}

/// The device a machine boots from next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BootDevice {
    Pxe,
    Cd,
    Disk,
}

/// `POST /bcx/v1/power/state`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PowerStateRequest {
    pub bmc: BmcTarget,
}

/// `POST /bcx/v1/power/set`: the action asked; the answer is the power the BMC shows afterwards.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PowerRequest {
    pub bmc: BmcTarget,
    pub action: PowerAction,
}

/// What the power routes answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PowerAnswer {
    pub power: PowerState,
}

/// `POST /bcx/v1/boot/set`: boot from `device` next, once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootRequest {
    pub bmc: BmcTarget,
    pub device: BootDevice,
}

/// What `boot/set` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootAnswer {
    pub device: BootDevice,
}

/// A refusal, as every route answers one: `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    pub message: String,
}

/// Why a call failed, which tells the control plane what to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// The request is wrong (HTTP 400): retrying it changes nothing.
    InvalidArgument,
    /// The provider refused the account's credential (HTTP 401).
    Unauthenticated,
    /// The provider has no capacity for it now (HTTP 409): ask again later.
    CapacityUnavailable,
    /// No such machine (HTTP 404).
    NotFound,
    /// The provider could not be reached or failed (HTTP 503): retry with backoff.
    Unavailable,
    /// The driver does not serve this concern (HTTP 501).
    Unimplemented,
}

impl ErrorCode {
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::InvalidArgument => 400,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::NotFound => 404,
            ErrorCode::CapacityUnavailable => 409,
            ErrorCode::Unimplemented => 501,
            ErrorCode::Unavailable => 503,
        }
    }
}

/// A driver's refusal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct DriverError {
    pub code: ErrorCode,
    pub message: String,
}

impl DriverError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> DriverError {
        DriverError { code, message: message.into() }
    }

    pub fn invalid(message: impl Into<String>) -> DriverError {
        DriverError::new(ErrorCode::InvalidArgument, message)
    }

    pub fn unavailable(message: impl Into<String>) -> DriverError {
        DriverError::new(ErrorCode::Unavailable, message)
    }
}

/// Checks what every acquire must satisfy, before a driver sees it.
pub fn check_acquire(request: &AcquireRequest) -> Result<(), DriverError> {
    if request.key.is_empty() || request.key.len() > 128 || request.key.chars().any(char::is_control) {
        return Err(DriverError::invalid("key: 1 to 128 printable characters"));
    }
    if request.gpus == 0 || request.gpus > 1024 {
        return Err(DriverError::invalid("gpus: from 1 to 1024"));
    }
    if request.duration_s == 0 || request.duration_s > 31_622_400 {
        return Err(DriverError::invalid("durationS: from 1 second to 366 days"));
    }
    Ok(())
}
