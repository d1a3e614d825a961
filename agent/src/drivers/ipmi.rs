//! An IPMI driver for one BMC through `ipmitool -I lanplus`: power status, on, off, soft off and reset, and a
//! one-time boot device. The password reaches ipmitool through `IPMI_PASSWORD` (`-E`), never its command line.
//!
//! ipmitool runs with `-v`: only then does it say why a session failed (a wrong password, no answer), which
//! the driver reads to tell those apart.
//!
//! `power` and `set_one_time_boot` are not cancel-safe: a dropped call kills ipmitool, but the BMC may already
//! have acted; read the state back before asking again.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use super::{BmcError, BootDevice, Power, PowerAction, excerpt, scrub};

/// How to reach one BMC over IPMI.
#[derive(Clone)]
pub struct IpmiConfig {
    pub host: String,
    /// The UDP port, 623 on real BMCs.
    pub port: u16,
    pub username: String,
    pub password: String,
    /// The RMCP+ cipher suite (`-C`). 3 (HMAC-SHA1, AES-128) is the one most BMCs offer; naming one also
    /// spares ipmitool asking for the list, a question some BMCs leave unanswered for ten seconds.
    pub cipher_suite: u8,
    /// Whether a boot device is set for a UEFI boot (`options=efiboot`).
    pub efi_boot: bool,
    /// The limit on each ipmitool run; ipmitool itself gives up on a silent host after about 20 s.
    pub timeout: Duration,
    /// The ipmitool program: a path, or a name looked for in `PATH`.
    pub program: PathBuf,
}

impl IpmiConfig {
    /// The BMC at `host`, port 623, cipher suite 3, a legacy boot, 30 s per call, `ipmitool` from `PATH`.
    pub fn new(host: &str, username: &str, password: &str) -> IpmiConfig {
        IpmiConfig {
            host: host.to_owned(),
            port: 623,
            username: username.to_owned(),
            password: password.to_owned(),
            cipher_suite: 3,
            efi_boot: false,
            timeout: Duration::from_secs(30),
            program: PathBuf::from("ipmitool"),
        }
    }
}

impl std::fmt::Debug for IpmiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpmiConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("username", &self.username)
            .field("password", &"***")
            .field("cipher_suite", &self.cipher_suite)
            .field("efi_boot", &self.efi_boot)
            .field("timeout", &self.timeout)
            .field("program", &self.program)
            .finish()
    }
}

/// The driver of one BMC over IPMI.
#[derive(Debug, Clone)]
pub struct Ipmi {
    config: IpmiConfig,
}

/// What ipmitool printed.
#[derive(Debug)]
struct Printed {
    stdout: String,
    stderr: String,
}

impl Ipmi {
    pub fn new(config: IpmiConfig) -> Ipmi {
        Ipmi { config }
    }

    /// The BMC's address as errors name it: `ipmi://user@host:port`.
    pub fn address(&self) -> String {
        format!("ipmi://{}@{}:{}", self.config.username, self.config.host, self.config.port)
    }

    /// The chassis' power state (`power status`).
    pub async fn power_state(&self) -> Result<Power, BmcError> {
        let (context, printed) = self.run(&["power", "status"], "read the power state").await?;
        parse_power_status(&printed.stdout).ok_or_else(|| unconfirmed(&context, &printed))
    }

    /// Switches the chassis' power (`power on|off|soft|reset`). The chassis may take a while to get there:
    /// read [`Self::power_state`].
    pub async fn power(&self, action: PowerAction) -> Result<(), BmcError> {
        let (verb, confirmation, what) = match action {
            PowerAction::On => ("on", "Up/On", "power on"),
            PowerAction::Off => ("off", "Down/Off", "power off"),
            PowerAction::GracefulOff => ("soft", "Soft", "shut down"),
            PowerAction::Reset => ("reset", "Reset", "reset"),
        };
        let (context, printed) = self.run(&["power", verb], what).await?;
        if confirms(&printed.stdout, &format!("Chassis Power Control: {confirmation}")) {
            Ok(())
        } else {
            Err(unconfirmed(&context, &printed))
        }
    }

    /// Makes the machine boot from `device` at its next boot only (`chassis bootdev`).
    pub async fn set_one_time_boot(&self, device: BootDevice) -> Result<(), BmcError> {
        let name = match device {
            BootDevice::Pxe => "pxe",
            BootDevice::Cd => "cdrom",
            BootDevice::Disk => "disk",
        };
        let mut args = vec!["chassis", "bootdev", name];
        if self.config.efi_boot {
            args.push("options=efiboot");
        }
        let (context, printed) = self.run(&args, &format!("boot from {name} once")).await?;
        // A refused boot parameter still exits 0: only the confirmation says it was set.
        if confirms(&printed.stdout, &format!("Set Boot Device to {name}")) {
            Ok(())
        } else {
            Err(unconfirmed(&context, &printed))
        }
    }

    /// Runs ipmitool with `args` after the connection's own, answering the error context and what it
    /// printed. A dropped call, or one past the timeout, kills ipmitool.
    async fn run(&self, args: &[&str], what: &str) -> Result<(String, Printed), BmcError> {
        let config = &self.config;
        let context = format!("{what}: ipmitool {} on {}", args.join(" "), self.address());
        let mut command = tokio::process::Command::new(&config.program);
        command
            .args(["-I", "lanplus", "-H", &config.host, "-p", &config.port.to_string()])
            .args(["-U", &config.username, "-E", "-C", &config.cipher_suite.to_string(), "-v"])
            .args(args)
            .env("IPMI_PASSWORD", &config.password)
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let output = match tokio::time::timeout(config.timeout, command.output()).await {
            Err(_) => {
                return Err(BmcError::Unreachable(format!("{context}: no answer within {:?}", config.timeout)));
            }
            Ok(Err(err)) if err.kind() == std::io::ErrorKind::NotFound => {
                return Err(BmcError::Config(format!(
                    "{context}: {} is not installed (the Debian package ipmitool)",
                    config.program.display()
                )));
            }
            Ok(Err(err)) => {
                return Err(BmcError::Config(format!("{context}: cannot run {}: {err}", config.program.display())));
            }
            Ok(Ok(output)) => output,
        };
        let printed = Printed {
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: scrub(&String::from_utf8_lossy(&output.stderr), &config.password),
        };
        if output.status.success() { Ok((context, printed)) } else { Err(failure(&context, &printed.stderr)) }
    }
}

/// The power state in `power status`'s answer (`Chassis Power is on`).
fn parse_power_status(stdout: &str) -> Option<Power> {
    stdout.lines().find_map(|line| {
        let state = line.trim().strip_prefix("Chassis Power is ")?;
        Some(match state.trim() {
            "on" => Power::On,
            "off" => Power::Off,
            _ => Power::Unknown,
        })
    })
}

fn confirms(stdout: &str, confirmation: &str) -> bool {
    stdout.lines().any(|line| line.trim() == confirmation)
}

/// The error for an answer without the expected confirmation: what stderr says, else what stdout said.
fn unconfirmed(context: &str, printed: &Printed) -> BmcError {
    match failure(context, &printed.stderr) {
        BmcError::Protocol(_) if said(&printed.stderr).is_empty() => BmcError::Protocol(format!(
            "{context}: ipmitool printed {:?}, no confirmation",
            excerpt(&printed.stdout, 300)
        )),
        err => err,
    }
}

/// What ipmitool's stderr says, mapped to the errors callers tell apart.
fn failure(context: &str, stderr: &str) -> BmcError {
    const REFUSED: &[&str] = &[
        "rakp 2 hmac is invalid",
        "unauthorized name",
        "invalid role",
        "rakp 4 hmac is invalid",
        "invalid integrity check value",
        "requested privilege level exceeds limit",
        "insufficient privilege level",
        "invalid user name",
        "password invalid",
    ];
    const BUSY: &[&str] = &["insufficient resources", "node busy"];
    const SILENT: &[&str] = &[
        "get auth capabilities error",
        "no response from remote controller",
        "error issuing get channel authentication capabilities",
        "address lookup for",
        "could not open socket",
    ];
    let said = said(stderr);
    let lower = said.to_ascii_lowercase();
    let message = format!("{context}: {}", excerpt(&said, 400));
    if REFUSED.iter().any(|s| lower.contains(s)) {
        BmcError::Unauthorized(message)
    } else if BUSY.iter().any(|s| lower.contains(s)) {
        BmcError::Unavailable { retry_after_s: None, message }
    } else if SILENT.iter().any(|s| lower.contains(s)) {
        BmcError::Unreachable(message)
    } else {
        BmcError::Protocol(message)
    }
}

/// stderr without what `-v` prints on every run, one line after another.
fn said(stderr: &str) -> String {
    const CHATTER: &[&str] = &[
        "Loading IANA PEN Registry",
        "Running Get VSO Capabilities",
        "Discovered IPMB address",
        "Invalid completion code received: Invalid command",
    ];
    stderr
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !CHATTER.iter().any(|chatter| line.starts_with(chatter)))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    // What ipmitool 1.8.19 prints with `-v` (stderr), captured against OpenIPMI's ipmi_sim 2.0.33.
    const CHATTER: &str = "Loading IANA PEN Registry...\nRunning Get VSO Capabilities my_addr 0x20, transit 0, \
                           target 0x20\nInvalid completion code received: Invalid command\nDiscovered IPMB address 0x0\n";
    const WRONG_PASSWORD: &str =
        "Loading IANA PEN Registry...\n> RAKP 2 HMAC is invalid\nError: Unable to establish IPMI v2 / RMCP+ session\n";
    const WRONG_USER: &str = "Loading IANA PEN Registry...\nRAKP 2 message indicates an error : unauthorized name\n\
                              Error: Unable to establish IPMI v2 / RMCP+ session\n";
    const NO_ANSWER: &str = "Loading IANA PEN Registry...\nGet Auth Capabilities error\nError issuing Get Channel \
                             Authentication Capabilities request\nError: Unable to establish IPMI v2 / RMCP+ session\n";
    const NO_CIPHER: &str = "Error in open session response message : invalid authentication algorithm\n\n\
                             Error: Unable to establish IPMI v2 / RMCP+ session\n";
    const BOOT_REFUSED: &str = "Loading IANA PEN Registry...\nSet Chassis Boot Parameter 5 failed: Unspecified error\n";

    #[test]
    fn power_status_reads_on_and_off() {
        assert_eq!(parse_power_status("Chassis Power is on\n"), Some(Power::On));
        assert_eq!(parse_power_status("Chassis Power is off\n"), Some(Power::Off));
        assert_eq!(parse_power_status("Chassis Power is sideways\n"), Some(Power::Unknown));
        assert_eq!(parse_power_status("Set Boot Device to pxe\n"), None);
    }

    #[test]
    fn confirmations_are_whole_lines() {
        assert!(confirms("Chassis Power Control: Up/On\n", "Chassis Power Control: Up/On"));
        assert!(confirms("Set Boot Device to pxe\n", "Set Boot Device to pxe"));
        assert!(!confirms("Set Boot Device to pxe\n", "Set Boot Device to disk"));
        assert!(!confirms("", "Chassis Power Control: Reset"));
    }

    #[test]
    fn a_refused_session_is_unauthorized() {
        for stderr in [WRONG_PASSWORD, WRONG_USER] {
            let err = failure("read the power state", stderr);
            assert!(matches!(err, BmcError::Unauthorized(_)), "{err}");
            assert!(!err.to_string().contains("IANA"), "chatter is left out: {err}");
        }
    }

    #[test]
    fn a_silent_bmc_is_unreachable_and_a_cipher_mismatch_is_a_protocol_error() {
        assert!(matches!(failure("x", NO_ANSWER), BmcError::Unreachable(_)));
        let err = failure("x", NO_CIPHER);
        assert!(matches!(err, BmcError::Protocol(_)), "{err}");
        assert!(err.to_string().contains("invalid authentication algorithm"), "{err}");
        assert!(matches!(failure("x", "Insufficient resources for session\n"), BmcError::Unavailable { .. }));
    }

    #[test]
    fn a_boot_device_refused_with_exit_status_zero_is_an_error_quoting_ipmitool() {
        let printed = Printed { stdout: String::new(), stderr: format!("{CHATTER}{BOOT_REFUSED}") };
        let err = unconfirmed("boot from pxe once", &printed);
        assert!(err.to_string().contains("Set Chassis Boot Parameter 5 failed"), "{err}");
        let printed = Printed { stdout: "something else\n".into(), stderr: CHATTER.into() };
        let err = unconfirmed("boot from pxe once", &printed);
        assert!(matches!(err, BmcError::Protocol(_)) && err.to_string().contains("something else"), "{err}");
    }

    #[test]
    fn the_config_never_shows_the_password() {
        let config = IpmiConfig::new("10.0.0.7", "admin", "hunter2");
        assert!(!format!("{config:?}").contains("hunter2"));
        assert_eq!(Ipmi::new(config).address(), "ipmi://admin@10.0.0.7:623");
    }

    #[tokio::test]
    async fn a_missing_ipmitool_is_a_configuration_error() {
        let mut config = IpmiConfig::new("127.0.0.1", "admin", "hunter2");
        config.program = PathBuf::from("/nonexistent/ipmitool");
        let err = Ipmi::new(config).power_state().await.expect_err("no ipmitool");
        assert!(matches!(err, BmcError::Config(_)) && err.to_string().contains("not installed"), "{err}");
    }
}
