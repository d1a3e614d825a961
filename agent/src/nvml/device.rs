//! The calls into NVML itself (nvml-wrapper), compiled with the `nvml` feature only.

use std::path::Path;
use std::sync::OnceLock;

use bc_domain::agent::GpuSample;
use bc_domain::device::{GpuInfo, MigInstance};
use bc_domain::id::DeviceId;
use bc_domain::inventory::GpuSection;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::{Gpus, NvmlUnavailable, normalize_pci_bus_id, nvlink_peers};
use crate::mig;

/// How many NVLink links a GPU can have (`NVML_NVLINK_MAX_LINKS`).
const NVLINK_MAX_LINKS: u32 = 18;

/// `NVML_DEVICE_MIG_ENABLE`: the MIG mode of a GPU whose MIG mode is on.
const MIG_ENABLE: u32 = 1;

const MIB: u64 = 1024 * 1024;

/// This machine's GPUs, as NVML reports them.
pub(super) fn gpus() -> Result<Gpus, NvmlUnavailable> {
    let nvml = Nvml::init().map_err(|error| NvmlUnavailable::new(init_failure(&error)))?;
    let count =
        nvml.device_count().map_err(|e| NvmlUnavailable::new(format!("the GPU count could not be read ({e})")))?;
    if count == 0 {
        return Err(NvmlUnavailable::new("the NVIDIA driver reports no GPU"));
    }
    let mut warnings = Vec::new();
    let mut read = Vec::new();
    for index in 0..count {
        match nvml.device_by_index(index) {
            Ok(device) => read.extend(read_gpu(index, &device, &mut warnings)),
            Err(e) => warnings.push(format!("GPU {index}: skipped, NVML gave no handle for it ({e})")),
        }
    }
    let endpoints: Vec<(Option<String>, Vec<String>)> =
        read.iter().map(|gpu| (gpu.section.info.pci_bus_id.clone(), gpu.nvlink_remotes.clone())).collect();
    let mut sections: Vec<GpuSection> = read
        .into_iter()
        .zip(nvlink_peers(&endpoints))
        .map(|(gpu, peers)| GpuSection { nvlink_peers: peers, ..gpu.section })
        .collect();
    sections.sort_by(|a, b| (&a.info.pci_bus_id, &a.info.uuid).cmp(&(&b.info.pci_bus_id, &b.info.uuid)));
    let cuda_version = nvml.sys_cuda_driver_version().ok().map(|version| {
        format!(
            "{}.{}",
            nvml_wrapper::cuda_driver_version_major(version),
            nvml_wrapper::cuda_driver_version_minor(version)
        )
    });
    Ok(Gpus { sections, driver_version: nvml.sys_driver_version().ok(), cuda_version, warnings })
}

/// NVML, initialized once for the agent's life (`nvmlInit` loads the library and opens the driver: too slow to
/// repeat every heartbeat); `None` where it cannot be.
fn shared() -> Option<&'static Nvml> {
    static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
    NVML.get_or_init(|| Nvml::init().ok()).as_ref()
}

/// Each GPU's utilization now. A GPU whose UUID or utilization NVML cannot read (a GPU in MIG mode answers
/// NotSupported) is left out.
pub(super) fn utilization() -> Vec<GpuSample> {
    let Some(nvml) = shared() else { return Vec::new() };
    let count = nvml.device_count().unwrap_or(0);
    (0..count)
        .filter_map(|index| {
            let device = nvml.device_by_index(index).ok()?;
            let gpu = device.uuid().ok()?.parse().ok()?;
            let rates = device.utilization_rates().ok()?;
            Some(GpuSample { gpu, percent: rates.gpu.min(100) })
        })
        .collect()
}

/// Why `nvmlInit` failed, in words.
fn init_failure(error: &NvmlError) -> String {
    match error {
        NvmlError::LibloadingError(e) => format!("libnvidia-ml.so.1 could not be loaded ({e})"),
        NvmlError::DriverNotLoaded => "the NVIDIA driver is not loaded".to_owned(),
        NvmlError::NoPermission => "this process may not talk to the NVIDIA driver".to_owned(),
        other => format!("NVML could not be initialized ({other})"),
    }
}

/// One GPU as read, before its NVLink endpoints are resolved into peers.
struct ReadGpu {
    section: GpuSection,
    /// The PCI bus ids at the far end of its active NVLinks: GPUs or NVSwitches.
    nvlink_remotes: Vec<String>,
}

/// Reads GPU `index`; `None`, with a warning, when it has no readable UUID (its device id).
fn read_gpu(index: u32, device: &Device<'_>, warnings: &mut Vec<String>) -> Option<ReadGpu> {
    let uuid = match device.uuid().map(|uuid| uuid.parse::<DeviceId>()) {
        Ok(Ok(uuid)) => uuid,
        Ok(Err(e)) => {
            warnings.push(format!("GPU {index}: skipped, {e}"));
            return None;
        }
        Err(e) => {
            warnings.push(format!("GPU {index}: skipped, its UUID could not be read ({e})"));
            return None;
        }
    };
    let mut warn = |what: &str, e: NvmlError| warnings.push(format!("GPU {uuid}: its {what} could not be read ({e})"));
    let name = device.name().unwrap_or_else(|e| {
        warn("name", e);
        String::new()
    });
    let memory_mib = device.memory_info().map(|memory| memory.total / MIB).unwrap_or_else(|e| {
        warn("memory size", e);
        0
    });
    let pci_bus_id = match device.pci_info() {
        Ok(pci) => Some(normalize_pci_bus_id(&pci.bus_id)),
        Err(e) => {
            warn("PCI bus id", e);
            None
        }
    };
    // Many boards have no serial number (NotSupported): that is not worth a warning.
    let serial = device.serial().ok().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty());
    let mig_enabled = matches!(device.mig_mode(), Ok(mode) if mode.current == MIG_ENABLE);
    let mig_instances = if mig_enabled {
        match read_mig_instances(device, Path::new(mig::CAPABILITIES_ROOT)) {
            Ok(instances) if instances.is_empty() => {
                warnings.push(format!("GPU {uuid}: MIG mode is on, but it has no MIG instances"));
                instances
            }
            Ok(instances) => instances,
            Err(reason) => {
                warnings.push(format!("GPU {uuid}: MIG mode is on, but its MIG instances are not reported ({reason})"));
                Vec::new()
            }
        }
    } else {
        Vec::new()
    };
    Some(ReadGpu {
        section: GpuSection {
            info: GpuInfo { uuid, name, memory_mib, pci_bus_id, mig_instances },
            serial,
            mig_enabled,
            nvlink_peers: Vec::new(),
        },
        nvlink_remotes: nvlink_remotes(device),
    })
}

/// The MIG instances of a GPU whose MIG mode is on: NVML's MIG devices (every index up to the maximum, an index
/// without a device answering NotFound), their ids from the driver's capability directories under `root` (see
/// [`mig`]). An error says what could not be read; then no instance is reported.
fn read_mig_instances(device: &Device<'_>, root: &Path) -> Result<Vec<MigInstance>, String> {
    // nvml-wrapper's `mig_device_count` is nvmlDeviceGetMaxMigDeviceCount: how many there can be, not how many
    // there are.
    let max = device.mig_device_count().map_err(|e| format!("the MIG device count could not be read ({e})"))?;
    let mut devices = Vec::new();
    for index in 0..max {
        let handle = match device.mig_device_by_index(index) {
            Ok(handle) => handle,
            Err(NvmlError::NotFound) => continue,
            Err(e) => return Err(format!("MIG device {index} could not be read ({e})")),
        };
        let read = |what: &str, e: NvmlError| format!("the {what} of MIG device {index} could not be read ({e})");
        devices.push(mig::MigDevice {
            name: handle.name().map_err(|e| read("name", e))?,
            uuid: handle.uuid().map_err(|e| read("UUID", e))?,
            memory_mib: handle.memory_info().map_err(|e| read("memory size", e))?.total / MIB,
        });
    }
    mig::instances(&devices, || mig::compute_instances(root, minor_number(device)?))
}

/// The GPU's NVML minor number, that of `/dev/nvidia<minor>`, which names its capability directory.
#[cfg(target_os = "linux")]
fn minor_number(device: &Device<'_>) -> Result<u32, String> {
    device.minor_number().map_err(|e| format!("the GPU's minor number could not be read ({e})"))
}

/// MIG and the driver's capability directories are Linux's only.
#[cfg(not(target_os = "linux"))]
fn minor_number(_device: &Device<'_>) -> Result<u32, String> {
    Err("MIG instance ids are read from /proc, which this system does not have".to_owned())
}

/// The far ends of a GPU's active NVLinks. A GPU without NVLink answers NotSupported for every link, and one with
/// fewer links than the maximum InvalidArg for the others: both mean no link.
fn nvlink_remotes(device: &Device<'_>) -> Vec<String> {
    (0..NVLINK_MAX_LINKS)
        .filter_map(|link| {
            let link = device.link_wrapper_for(link);
            match link.is_active() {
                Ok(true) => link.remote_pci_info().ok().map(|pci| normalize_pci_bus_id(&pci.bus_id)),
                _ => None,
            }
        })
        .collect()
}
