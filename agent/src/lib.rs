//! `bcd`, the node agent, as a library: the `bcd` binary and the control plane's tests and demo fleet run the
//! same code. It joins the control plane, reports the machine's `NodeInventory v1` (GPUs through NVML, or
//! simulated ones), holds a session whose heartbeats keep the node connected, applies its NodeSpec and carries
//! out commands, writing CDI spec files for bound reservations; with a runtime, it runs the node's instances as
//! QEMU virtual machines.
//!
//! The agent links `bc-domain` for the protocol's types, never sqlx. The site agent serves its boot path (iPXE
//! scripts, the ramdisk, images by hash) with axum; `bcd ramdisk` is the machine's side of that path.

pub mod boot;
pub mod cdi;
pub mod client;
pub mod drivers;
#[cfg(test)]
mod fixture;
pub mod host;
pub mod mig;
pub mod nvml;
pub mod ramdisk;
pub mod run;
pub mod runtime;
pub mod simulate;
pub mod site;

/// The agent's version, as it reports it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
