//! GPUs through NVML (`libnvidia-ml.so.1`, loaded at run time by `nvml-wrapper`), and this machine's whole
//! inventory. A machine without the library, the driver or a GPU is normal: [`gpus`] says why, and the inventory
//! then has no GPUs. A query that fails for one GPU leaves that detail empty and says so in a warning.

use std::collections::BTreeSet;

use bc_domain::inventory::{GpuSection, NodeInventory};

use crate::host;

#[cfg(feature = "nvml")]
mod device;

/// What NVML reported.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Gpus {
    /// The GPUs, ordered by PCI bus id.
    pub sections: Vec<GpuSection>,
    pub driver_version: Option<String>,
    /// The CUDA version the driver supports, such as `12.4`.
    pub cuda_version: Option<String>,
    /// What could not be read: a GPU skipped, a detail left empty. One sentence each.
    pub warnings: Vec<String>,
}

/// Why NVML cannot tell this machine's GPUs: no library, no driver, no permission, or no GPU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("NVML is not available: {reason}")]
pub struct NvmlUnavailable {
    pub reason: String,
}

impl NvmlUnavailable {
    fn new(reason: impl Into<String>) -> Self {
        NvmlUnavailable { reason: reason.into() }
    }
}

/// This machine's GPUs, as NVML reports them.
pub fn gpus() -> Result<Gpus, NvmlUnavailable> {
    #[cfg(feature = "nvml")]
    return device::gpus();
    #[cfg(not(feature = "nvml"))]
    Err(NvmlUnavailable::new("this build of the agent has no NVML support (the `nvml` feature is off)"))
}

/// Each GPU's utilization now, as NVML samples it (`utilization.gpu`); none where NVML is not available.
pub fn utilization() -> Vec<bc_domain::agent::GpuSample> {
    #[cfg(feature = "nvml")]
    return device::utilization();
    #[cfg(not(feature = "nvml"))]
    Vec::new()
}

/// This machine's inventory: the host's facts and NVML's GPUs, with the warnings of both reads (including why
/// there are no GPUs, when NVML is not available).
pub fn local_inventory(hostname: Option<&str>) -> (NodeInventory, Vec<String>) {
    let mut system = host::system_section(hostname);
    let mut warnings = Vec::new();
    let gpus = match gpus() {
        Ok(found) => {
            system.driver_version = found.driver_version;
            system.cuda_version = found.cuda_version;
            warnings.extend(found.warnings);
            found.sections
        }
        Err(unavailable) => {
            warnings.push(unavailable.to_string());
            Vec::new()
        }
    };
    let mut document = NodeInventory::new(system);
    document.gpus = gpus;
    document.nics = host::nics();
    document.disks = host::disks();
    (document, warnings)
}

/// Each GPU's NVLink peers, given each GPU's PCI bus id and the far ends of its active links: the GPUs of this
/// machine its links reach directly, and, on an NVSwitch system (where links end at switches), the GPUs that
/// reach one of the same switches. An all-zero address is no endpoint. Peers are sorted and never the GPU itself.
///
/// NVML's `nvmlDeviceGetNvLinkRemoteDeviceType` would say whether a link ends at a GPU or a switch, but
/// nvml-wrapper 0.13 always answers `Unknown` for it, so an endpoint that is not a GPU of this machine counts as
/// a switch.
#[cfg_attr(not(feature = "nvml"), allow(dead_code))]
fn nvlink_peers(gpus: &[(Option<String>, Vec<String>)]) -> Vec<Vec<String>> {
    const NO_ENDPOINT: &str = "00000000:00:00.0";
    let local: BTreeSet<&str> = gpus.iter().filter_map(|(bus, _)| bus.as_deref()).collect();
    let switches: Vec<BTreeSet<&str>> = gpus
        .iter()
        .map(|(_, remotes)| {
            remotes.iter().map(String::as_str).filter(|r| *r != NO_ENDPOINT && !local.contains(r)).collect()
        })
        .collect();
    gpus.iter()
        .enumerate()
        .map(|(i, (own, remotes))| {
            let direct = remotes.iter().map(String::as_str).filter(|r| local.contains(r));
            let shared = gpus.iter().enumerate().filter_map(|(j, (other, _))| {
                (j != i && !switches[i].is_disjoint(&switches[j])).then_some(other.as_deref()).flatten()
            });
            let peers: BTreeSet<&str> = direct.chain(shared).filter(|peer| Some(*peer) != own.as_deref()).collect();
            peers.into_iter().map(str::to_owned).collect()
        })
        .collect()
}

/// A PCI bus id in the form the inventory uses, `00000000:18:00.0`: lower case, an 8-digit domain. NVML spells
/// it in upper case, and some of its fields with a 4-digit domain. Anything else is only lower-cased.
#[cfg_attr(not(feature = "nvml"), allow(dead_code))]
fn normalize_pci_bus_id(bus_id: &str) -> String {
    let bus_id = bus_id.trim().to_ascii_lowercase();
    let parsed = (|| {
        let (domain, rest) = bus_id.split_once(':')?;
        let (bus, slot) = rest.split_once(':')?;
        let (device, function) = slot.split_once('.')?;
        let domain = u32::from_str_radix(domain, 16).ok()?;
        let bus = u8::from_str_radix(bus, 16).ok()?;
        let device = u8::from_str_radix(device, 16).ok()?;
        let function = u8::from_str_radix(function, 16).ok()?;
        Some(format!("{domain:08x}:{bus:02x}:{device:02x}.{function:x}"))
    })();
    parsed.unwrap_or(bus_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_bus_ids_take_the_inventory_form() {
        assert_eq!(normalize_pci_bus_id("00000000:18:00.0"), "00000000:18:00.0");
        assert_eq!(normalize_pci_bus_id("00000000:AF:00.0"), "00000000:af:00.0");
        assert_eq!(normalize_pci_bus_id("0000:3B:00.0 "), "00000000:3b:00.0");
        assert_eq!(normalize_pci_bus_id("not-a-bus-id"), "not-a-bus-id");
    }

    fn gpu(bus: &str, remotes: &[&str]) -> (Option<String>, Vec<String>) {
        (Some(bus.to_owned()), remotes.iter().map(|r| (*r).to_owned()).collect())
    }

    #[test]
    fn direct_links_make_peers_of_the_gpus_at_either_end() {
        let (a, b, c) = ("00000000:18:00.0", "00000000:2a:00.0", "00000000:3a:00.0");
        // A and B are bridged by two links; C has none.
        let peers = nvlink_peers(&[gpu(a, &[b, b]), gpu(b, &[a, a]), gpu(c, &[])]);
        assert_eq!(peers, vec![vec![b.to_owned()], vec![a.to_owned()], Vec::<String>::new()]);
    }

    #[test]
    fn gpus_that_reach_a_common_nvswitch_are_peers() {
        let (a, b, c, d) = ("00000000:18:00.0", "00000000:2a:00.0", "00000000:3a:00.0", "00000000:5d:00.0");
        let (switch1, switch2) = ("00000000:05:00.0", "00000000:06:00.0");
        let peers = nvlink_peers(&[
            gpu(a, &[switch1, switch2]),
            gpu(b, &[switch2]),
            gpu(c, &[switch1, "00000000:00:00.0"]),
            // D's links end at no endpoint: it shares no switch with anyone.
            gpu(d, &["00000000:00:00.0"]),
            (None, vec![switch1.to_owned()]),
        ]);
        assert_eq!(peers[0], vec![b.to_owned(), c.to_owned()]);
        assert_eq!(peers[1], vec![a.to_owned()]);
        assert_eq!(peers[2], vec![a.to_owned()]);
        assert!(peers[3].is_empty());
        // A GPU whose bus id is unknown still has peers, though none can name it.
        assert_eq!(peers[4], vec![a.to_owned(), c.to_owned()]);
    }

    #[test]
    fn without_nvml_gpus_say_why_and_with_it_every_gpu_has_a_uuid() {
        match gpus() {
            Err(unavailable) => {
                let message = unavailable.to_string();
                assert!(message.contains("NVML"), "{message}");
                assert!(!unavailable.reason.is_empty());
            }
            Ok(found) => {
                assert!(!found.sections.is_empty() || !found.warnings.is_empty(), "{found:?}");
                assert!(found.sections.iter().all(|g| g.info.uuid.as_str().starts_with("GPU-")), "{found:?}");
            }
        }
    }

    #[test]
    fn without_nvml_nothing_is_sampled_and_with_it_each_sample_is_one_of_its_gpus() {
        let samples = utilization();
        match gpus() {
            Err(_) => assert!(samples.is_empty(), "{samples:?}"),
            Ok(found) => {
                assert!(samples.len() <= found.sections.len(), "{samples:?}");
                for sample in &samples {
                    assert!(found.sections.iter().any(|g| g.info.uuid == sample.gpu), "{sample:?} is not a GPU here");
                }
            }
        }
        assert_eq!(bc_domain::agent::check_gpu_samples(&samples), Ok(()), "the control plane takes them");
    }

    #[test]
    fn the_local_inventory_has_gpus_or_a_warning_saying_why_not() {
        let (document, warnings) = local_inventory(Some("t"));
        assert_eq!(document.schema, bc_domain::inventory::SCHEMA);
        assert_eq!(document.system.hostname, "t");
        assert!(document.system.memory_mib > 0);
        if document.gpus.is_empty() {
            assert!(!warnings.is_empty(), "no GPUs, and no warning saying why");
        }
        if let Err(unavailable) = gpus() {
            assert!(document.gpus.is_empty());
            assert!(warnings.contains(&unavailable.to_string()), "{warnings:?}");
            assert_eq!(document.system.driver_version, None);
        }
        // Every section hashes, whatever the machine has.
        assert_eq!(document.hashes().len(), 4);
    }
}
