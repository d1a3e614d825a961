//! A pool's acceptance checks: what a machine's inventory must show before the machine is adopted into the pool.
//! Each check is a short text in the pool's `policy.acceptance`, parsed when the pool is created:
//!
//! - `gpu-count=<n>`: exactly `n` GPUs;
//! - `min-gpu-memory-mib=<n>`: every GPU has at least `n` MiB;
//! - `driver-prefix=<version>`: the NVIDIA driver's version starts with it (`550.`);
//! - `trusted-hardware-key`: at least two machine identifiers survive the placeholder blocklist.
//!
//! Built-in checks always run besides them: at least one GPU, no GPU listed twice, and GPUs of the pool's model.

use std::fmt;
use std::str::FromStr;

use crate::inventory::NodeInventory;

/// One acceptance check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    GpuCount(u32),
    MinGpuMemoryMib(u64),
    DriverPrefix(String),
    TrustedHardwareKey,
}

impl FromStr for Check {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let number =
            |value: &str| value.trim().parse::<u64>().map_err(|_| format!("{text:?}: {value:?} is not a number"));
        match text.trim().split_once('=') {
            Some(("gpu-count", n)) => Ok(Check::GpuCount(u32::try_from(number(n)?).map_err(|e| e.to_string())?)),
            Some(("min-gpu-memory-mib", n)) => Ok(Check::MinGpuMemoryMib(number(n)?)),
            Some(("driver-prefix", v)) if !v.trim().is_empty() => Ok(Check::DriverPrefix(v.trim().to_owned())),
            None if text.trim() == "trusted-hardware-key" => Ok(Check::TrustedHardwareKey),
            _ => Err(format!(
                "{text:?} is not an acceptance check (gpu-count=<n>, min-gpu-memory-mib=<n>, driver-prefix=<version>, \
                 trusted-hardware-key)"
            )),
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Check::GpuCount(n) => write!(f, "gpu-count={n}"),
            Check::MinGpuMemoryMib(n) => write!(f, "min-gpu-memory-mib={n}"),
            Check::DriverPrefix(v) => write!(f, "driver-prefix={v}"),
            Check::TrustedHardwareKey => f.write_str("trusted-hardware-key"),
        }
    }
}

impl Check {
    /// Why the machine fails this check, or `None` when it passes.
    pub fn failure(&self, document: &NodeInventory, hardware_trusted: bool) -> Option<String> {
        match self {
            Check::GpuCount(n) => {
                (document.gpus.len() != *n as usize).then(|| format!("{self}: the machine has {}", document.gpus.len()))
            }
            Check::MinGpuMemoryMib(n) => document
                .gpus
                .iter()
                .find(|g| g.info.memory_mib < *n)
                .map(|g| format!("{self}: {} has {} MiB", g.info.uuid, g.info.memory_mib)),
            Check::DriverPrefix(prefix) => match &document.system.driver_version {
                Some(version) if version.starts_with(prefix.as_str()) => None,
                Some(version) => Some(format!("{self}: the driver is {version}")),
                None => Some(format!("{self}: no driver version was reported")),
            },
            Check::TrustedHardwareKey => {
                (!hardware_trusted).then(|| format!("{self}: fewer than two machine identifiers are real"))
            }
        }
    }
}

/// Parses a pool's checks; the error names the entry.
pub fn parse(checks: &[String]) -> Result<Vec<Check>, (usize, String)> {
    checks.iter().enumerate().map(|(i, text)| text.parse().map_err(|err| (i, err))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::SystemSection;

    #[test]
    fn checks_parse_print_and_name_what_fails() {
        let checks =
            parse(&["gpu-count=8".into(), "driver-prefix=550.".into(), "trusted-hardware-key".into()]).expect("checks");
        assert_eq!(checks[0].to_string(), "gpu-count=8");
        assert_eq!(parse(&["gpu-count=8".into(), "colour=red".into()]).expect_err("unknown").0, 1);
        let mut document =
            NodeInventory::new(SystemSection { driver_version: Some("550.54.15".into()), ..Default::default() });
        assert!(checks[0].failure(&document, true).is_some_and(|why| why.contains("has 0")));
        assert_eq!(checks[1].failure(&document, true), None);
        document.system.driver_version = Some("535.1".into());
        assert!(checks[1].failure(&document, true).is_some());
        assert!(checks[2].failure(&document, false).is_some());
        assert_eq!(checks[2].failure(&document, true), None);
    }
}
