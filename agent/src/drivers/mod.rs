//! Drivers for machines' BMCs, which take a bare-metal machine from power-off to a booted installer: Redfish
//! over HTTP(S) (`redfish`) and IPMI through `ipmitool` (`ipmi`), with the types and the error they share.
//!
//! A site agent makes these calls, so a BMC's credentials never leave the site. No error message carries a
//! password: each names the BMC's address and what was asked.

pub mod ipmi;
pub mod redfish;

use serde::{Deserialize, Serialize};

/// Whether a machine is powered, as its BMC says: the node's `power` axis itself (`unknown` is neither on nor
/// off: on its way, paused, or not reported).
pub use bc_domain::node::Power;

/// What to do with a machine's power (Redfish `On`/`ForceOff`/`GracefulShutdown`/`ForceRestart`, IPMI `power
/// on`/`off`/`soft`/`reset`), and the device a machine boots from next, once: the driver protocol's own, so an
/// out-of-process driver is asked in the same words.
pub use bcx::protocol::{BootDevice, PowerAction};

/// What a BMC says about its machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    pub uuid: Option<String>,
    pub serial: Option<String>,
    pub manufacturer: Option<String>,
    pub model: Option<String>,
    pub cpu_count: Option<u32>,
    pub memory_gib: Option<f64>,
    /// The network interfaces' MAC addresses, lower case, sorted, each once.
    pub macs: Vec<String>,
    pub power_state: Power,
}

/// Why a BMC call failed, in the kinds a caller acts on differently. Every message names the BMC and what
/// was asked of it, never a password.
#[derive(Debug, thiserror::Error)]
pub enum BmcError {
    /// No answer: the connection was refused, or nothing came back in time. Worth trying again later.
    #[error("the BMC is unreachable: {0}")]
    Unreachable(String),
    /// The BMC refused the credentials (HTTP 401 or 403, an IPMI session refused): retrying will not help.
    #[error("the BMC refused the credentials: {0}")]
    Unauthorized(String),
    /// The BMC is busy (HTTP 503); it may say when to ask again.
    #[error("the BMC is unavailable{}: {message}", retry_hint(*.retry_after_s))]
    Unavailable { retry_after_s: Option<u64>, message: String },
    /// What was asked for does not exist: no such system, no virtual CD slot.
    #[error("not found: {0}")]
    NotFound(String),
    /// The TLS handshake failed: the BMC's certificate is not trusted through the configured CA.
    #[error("TLS: {0}")]
    Tls(String),
    /// An answer the driver did not expect, naming what.
    #[error("unexpected answer: {0}")]
    Protocol(String),
    /// The driver cannot work as configured: a bad address or CA, `ipmitool` not installed.
    #[error("cannot call the BMC: {0}")]
    Config(String),
}

fn retry_hint(retry_after_s: Option<u64>) -> String {
    retry_after_s.map(|s| format!(" (retry after {s} s)")).unwrap_or_default()
}

/// `text` with `secret` blanked out: answers are quoted in errors, and a BMC could echo what it was sent.
fn scrub(text: &str, secret: &str) -> String {
    if secret.is_empty() { text.to_owned() } else { text.replace(secret, "***") }
}

/// At most `max` characters of `text`, for quoting an answer in an error.
fn excerpt(text: &str, max: usize) -> String {
    let text = text.trim();
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_enums_use_kebab_case_on_the_wire() {
        assert_eq!(serde_json::to_string(&Power::Unknown).expect("json"), "\"unknown\"");
        assert_eq!(serde_json::to_string(&PowerAction::GracefulOff).expect("json"), "\"graceful-off\"");
        assert_eq!(serde_json::from_str::<BootDevice>("\"pxe\"").expect("json"), BootDevice::Pxe);
    }

    #[test]
    fn an_unavailable_bmc_says_when_to_retry_when_it_knows() {
        let busy = BmcError::Unavailable { retry_after_s: Some(5), message: "GET x".into() };
        assert_eq!(busy.to_string(), "the BMC is unavailable (retry after 5 s): GET x");
        let busy = BmcError::Unavailable { retry_after_s: None, message: "GET x".into() };
        assert_eq!(busy.to_string(), "the BMC is unavailable: GET x");
    }

    #[test]
    fn quoted_answers_are_scrubbed_and_cut() {
        assert_eq!(scrub("user root password hunter2", "hunter2"), "user root password ***");
        assert_eq!(scrub("anything", ""), "anything");
        assert_eq!(excerpt("  héllo world ", 5), "héllo...");
        assert_eq!(excerpt("short", 5), "short");
    }
}
