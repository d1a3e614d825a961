//! A MIG-enabled GPU's instances, for [`crate::nvml`]. nvml-wrapper 0.13 gives each MIG device (a compute
//! instance) as a handle with a name (`NVIDIA H100 80GB HBM3 MIG 1g.10gb`: the profile) and a memory size, but
//! has no safe call for its GPU and compute instance ids (`nvmlDeviceGetGpuInstanceId`,
//! `nvmlDeviceGetComputeInstanceId`), and this workspace forbids unsafe code. The NVIDIA driver lists the same
//! instances as directories, `/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<g>/ci<c>`, `<minor>` being
//! the GPU's NVML minor number (that of `/dev/nvidia<minor>`): the ids come from there, paired in order with
//! NVML's MIG devices, and the pairing is checked as far as the handles allow.
//!
//! Drivers before R470 named a MIG device `MIG-GPU-<gpu uuid>/<gi>/<ci>`; such a name gives the ids itself.
//! Parsing is kept apart from reading so it is tested on fixtures; nothing here panics.

use std::fs;
use std::path::Path;

use bc_domain::device::MigInstance;

/// Where the NVIDIA driver lists its capabilities, MIG instances among them.
pub const CAPABILITIES_ROOT: &str = "/proc/driver/nvidia/capabilities";

/// One MIG device as NVML reports it, in the order of its index under the parent GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigDevice {
    /// The NVML name, such as `NVIDIA H100 80GB HBM3 MIG 1g.10gb`.
    pub name: String,
    /// The NVML UUID: `MIG-<uuid>`, or `MIG-GPU-<gpu uuid>/<gi>/<ci>` before R470.
    pub uuid: String,
    /// The memory of its GPU instance.
    pub memory_mib: u64,
}

/// The id in a capability directory's name: `3` for `gi3` with prefix `gi`. `None` for any other name.
pub fn instance_id(name: &str, prefix: &str) -> Option<u32> {
    let digits = name.strip_prefix(prefix)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The (GPU instance, compute instance) ids of GPU `minor`'s MIG devices, sorted, as the directories
/// `<root>/gpu<minor>/mig/gi<g>/ci<c>` list them. A GPU instance without a compute instance is no MIG device and
/// is left out; other entries (the `access`, `config` and `monitor` files) are ignored. An error says what could
/// not be read.
pub fn compute_instances(root: &Path, minor: u32) -> Result<Vec<(u32, u32)>, String> {
    let mig = root.join(format!("gpu{minor}")).join("mig");
    let unreadable = |path: &Path, e: std::io::Error| format!("{} could not be read ({e})", path.display());
    let mut pairs = Vec::new();
    for entry in fs::read_dir(&mig).map_err(|e| unreadable(&mig, e))? {
        let entry = entry.map_err(|e| unreadable(&mig, e))?;
        let path = entry.path();
        let Some(gi) = entry.file_name().to_str().and_then(|name| instance_id(name, "gi")) else { continue };
        if !path.is_dir() {
            continue;
        }
        for ci_entry in fs::read_dir(&path).map_err(|e| unreadable(&path, e))? {
            let ci_entry = ci_entry.map_err(|e| unreadable(&path, e))?;
            let Some(ci) = ci_entry.file_name().to_str().and_then(|name| instance_id(name, "ci")) else { continue };
            if ci_entry.path().is_dir() {
                pairs.push((gi, ci));
            }
        }
    }
    pairs.sort_unstable();
    Ok(pairs)
}

/// The MIG profile in a MIG device's NVML name, lower-cased: `1g.10gb` for `NVIDIA H100 80GB HBM3 MIG 1g.10gb`,
/// `1g.10gb+me` for `... MIG 1G.10GB+me`, `1c.3g.20gb` for a compute instance that has part of a `3g.20gb` GPU
/// instance. `None` when the name does not end in `MIG <profile>`.
pub fn profile_from_name(name: &str) -> Option<String> {
    let mut words = name.split_whitespace().rev();
    let profile = words.next()?.to_ascii_lowercase();
    if !words.next()?.eq_ignore_ascii_case("MIG") {
        return None;
    }
    let number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    // `[<n>c.]<n>g.<n>gb[<suffix>]`, the suffix being `+me`, `-me`, `+gfx`, `+me.all` and the like.
    let rest = match profile.split_once('.') {
        Some((compute, rest)) if compute.strip_suffix('c').is_some_and(number) => rest,
        _ => profile.as_str(),
    };
    let (slices, rest) = rest.split_once('.')?;
    let gb_end = rest.find("gb")?;
    let (memory, suffix) = (&rest[..gb_end], &rest[gb_end + 2..]);
    let suffix_ok = suffix.is_empty()
        || (suffix.len() > 1
            && suffix.starts_with(['+', '-'])
            && suffix.bytes().all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b)));
    (slices.strip_suffix('g').is_some_and(number) && number(memory) && suffix_ok).then_some(profile)
}

/// The GPU instance part of a profile: `3g.20gb` for `1c.3g.20gb`; a profile without a compute part is all GPU
/// instance. The compute instances of one GPU instance share it.
fn gpu_instance_profile(profile: &str) -> &str {
    match profile.split_once('.') {
        Some((compute, rest)) if compute.ends_with('c') => rest,
        _ => profile,
    }
}

/// The (GPU instance, compute instance) ids in a MIG device UUID of the form drivers before R470 gave,
/// `MIG-GPU-<gpu uuid>/<gi>/<ci>`; `None` for the current form, `MIG-<uuid>`, which names no ids.
pub fn ids_from_uuid(uuid: &str) -> Option<(u32, u32)> {
    let rest = uuid.trim().strip_prefix("MIG-GPU-")?;
    let mut parts = rest.rsplitn(3, '/');
    let (ci, gi, gpu) = (parts.next()?, parts.next()?, parts.next()?);
    if gpu.is_empty() {
        return None;
    }
    Some((instance_id(gi, "")?, instance_id(ci, "")?))
}

/// A GPU's MIG instances from its MIG devices (in NVML index order) and, when their UUIDs do not name their ids,
/// the capability directories' ids (`capability_ids`, called only then; sorted, as [`compute_instances`] gives
/// them). Sorted by GPU and compute instance.
///
/// The pairing in order assumes that NVML indexes MIG devices by GPU instance id and then compute instance id,
/// as `nvidia-smi` lists them. It is checked as far as the handles allow: there must be as many directories as
/// devices, and the devices paired with one GPU instance must agree on its profile and memory. When the check
/// fails, or anything cannot be read, an error says why and no instance is reported: a wrong id would send work
/// to another tenant's instance.
pub fn instances<F>(devices: &[MigDevice], capability_ids: F) -> Result<Vec<MigInstance>, String>
where
    F: FnOnce() -> Result<Vec<(u32, u32)>, String>,
{
    let profiles = devices
        .iter()
        .map(|device| {
            profile_from_name(&device.name)
                .ok_or_else(|| format!("the MIG device name {:?} names no MIG profile", device.name))
        })
        .collect::<Result<Vec<String>, String>>()?;
    let named: Option<Vec<(u32, u32)>> = devices.iter().map(|device| ids_from_uuid(&device.uuid)).collect();
    let ids = match named {
        Some(ids) => ids,
        None => {
            let ids = capability_ids()?;
            if ids.len() != devices.len() {
                return Err(format!(
                    "NVML reports {} MIG devices, but the driver's capability directories list {} compute instances",
                    devices.len(),
                    ids.len()
                ));
            }
            ids
        }
    };
    let mut found: Vec<MigInstance> = ids
        .iter()
        .zip(devices.iter().zip(profiles))
        .map(|(&(gpu_instance, compute_instance), (device, profile))| MigInstance {
            gpu_instance,
            compute_instance,
            profile,
            memory_mib: device.memory_mib,
        })
        .collect();
    found.sort_by_key(|instance| (instance.gpu_instance, instance.compute_instance));
    for pair in found.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if (a.gpu_instance, a.compute_instance) == (b.gpu_instance, b.compute_instance) {
            return Err(format!(
                "two MIG devices claim GPU instance {} compute instance {}",
                a.gpu_instance, a.compute_instance
            ));
        }
        if a.gpu_instance == b.gpu_instance
            && (gpu_instance_profile(&a.profile) != gpu_instance_profile(&b.profile) || a.memory_mib != b.memory_mib)
        {
            return Err(format!(
                "the MIG devices paired with GPU instance {} disagree on its profile or memory ({} with {} MiB, {} \
                 with {} MiB), so NVML's order is not that of the capability directories",
                a.gpu_instance, a.profile, a.memory_mib, b.profile, b.memory_mib
            ));
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {

    use super::*;

    use crate::fixture::Fixture;

    const ACCESS: &str = "DeviceFileMinor: 66\nDeviceFileMode: 292\nDeviceFileModify: 1\n";

    #[test]
    fn capability_directory_names_give_ids() {
        assert_eq!(instance_id("gi13", "gi"), Some(13));
        assert_eq!(instance_id("ci0", "ci"), Some(0));
        assert_eq!(instance_id("7", ""), Some(7));
        for (name, prefix) in [("gi", "gi"), ("ci1", "gi"), ("gi+1", "gi"), ("gi1a", "gi"), ("access", "ci"), ("", "")]
        {
            assert_eq!(instance_id(name, prefix), None, "{name:?}");
        }
        assert_eq!(instance_id("gi99999999999", "gi"), None, "past u32");
    }

    #[test]
    fn the_capability_tree_lists_each_compute_instance_sorted() {
        let root = Fixture::new("mig-tree");
        // GPU 1 (minor 1): GPU instances 1, 2 and 10; instance 2 has two compute instances, instance 5 none.
        for gi in ["gi1", "gi2", "gi10", "gi5"] {
            root.file(&format!("gpu1/mig/{gi}/access"), ACCESS);
        }
        for ci in ["gi1/ci0", "gi2/ci1", "gi2/ci0", "gi10/ci0"] {
            root.file(&format!("gpu1/mig/{ci}/access"), ACCESS);
        }
        root.file("gpu1/mig/config", ACCESS);
        root.file("gpu1/mig/monitor", ACCESS);
        // A file named like an instance is no instance.
        root.file("gpu1/mig/gi3", "");
        root.file("gpu0/mig/gi4/ci0/access", ACCESS);
        assert_eq!(compute_instances(&root.0, 1), Ok(vec![(1, 0), (2, 0), (2, 1), (10, 0)]));
        assert_eq!(compute_instances(&root.0, 0), Ok(vec![(4, 0)]));
        let missing = compute_instances(&root.0, 2).expect_err("no gpu2");
        assert!(missing.contains("gpu2/mig") && missing.contains("could not be read"), "{missing}");
        // MIG on without instances: an empty list, not an error.
        root.file("gpu3/mig/config", ACCESS);
        assert_eq!(compute_instances(&root.0, 3), Ok(Vec::new()));
    }

    #[test]
    fn mig_device_names_give_profiles() {
        let cases = [
            ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "1g.10gb"),
            ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "3g.20gb"),
            ("NVIDIA A100-PCIE-40GB MIG 3G.20GB", "3g.20gb"),
            ("NVIDIA H100 80GB HBM3 MIG 1G.10GB+me", "1g.10gb+me"),
            ("NVIDIA A30 MIG 1g.6gb+me", "1g.6gb+me"),
            ("NVIDIA H200 MIG 7g.141gb", "7g.141gb"),
            ("NVIDIA RTX PRO 6000 Blackwell Server Edition MIG 1g.24gb+gfx", "1g.24gb+gfx"),
            ("NVIDIA Example GPU MIG 1g.24gb-me", "1g.24gb-me"),
            ("NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb", "1c.3g.20gb"),
        ];
        for (name, profile) in cases {
            assert_eq!(profile_from_name(name).as_deref(), Some(profile), "{name}");
        }
        for name in [
            "NVIDIA H100 80GB HBM3",
            "NVIDIA H100 80GB HBM3 1g.10gb",
            "NVIDIA H100 MIG",
            "NVIDIA H100 MIG 1g",
            "NVIDIA H100 MIG g.10gb",
            "NVIDIA H100 MIG 1g.gb",
            "NVIDIA H100 MIG 1g.10gb+",
            "NVIDIA H100 MIG 1g.10gbx",
            "NVIDIA H100 MIG c.1g.10gb",
            "",
        ] {
            assert_eq!(profile_from_name(name), None, "{name:?}");
        }
        assert_eq!(gpu_instance_profile("1c.3g.20gb"), "3g.20gb");
        assert_eq!(gpu_instance_profile("1g.10gb+me"), "1g.10gb+me");
    }

    #[test]
    fn pre_r470_uuids_name_their_ids() {
        assert_eq!(ids_from_uuid("MIG-GPU-63feeb45-94c6-b9cb-78ea-98e9b7a5be6b/1/0"), Some((1, 0)));
        assert_eq!(ids_from_uuid("MIG-GPU-63feeb45-94c6-b9cb-78ea-98e9b7a5be6b/13/2"), Some((13, 2)));
        for uuid in ["MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f", "MIG-GPU-/1/0", "MIG-GPU-x/1", "MIG-GPU-x/a/0", ""] {
            assert_eq!(ids_from_uuid(uuid), None, "{uuid:?}");
        }
    }

    fn device(profile: &str, memory_mib: u64) -> MigDevice {
        MigDevice {
            name: format!("NVIDIA H100 80GB HBM3 MIG {profile}"),
            uuid: "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f".to_owned(),
            memory_mib,
        }
    }

    fn instance(gpu_instance: u32, compute_instance: u32, profile: &str, memory_mib: u64) -> MigInstance {
        MigInstance { gpu_instance, compute_instance, profile: profile.to_owned(), memory_mib }
    }

    #[test]
    fn devices_pair_in_order_with_the_capability_ids() {
        let devices = [device("3g.40gb", 40_320), device("2g.20gb", 20_096), device("1g.10gb", 9_984)];
        let found = instances(&devices, || Ok(vec![(2, 0), (3, 0), (9, 0)])).expect("pairs");
        assert_eq!(
            found,
            vec![
                instance(2, 0, "3g.40gb", 40_320),
                instance(3, 0, "2g.20gb", 20_096),
                instance(9, 0, "1g.10gb", 9_984)
            ]
        );
        // Two compute instances share one GPU instance's profile and memory.
        let shared = [device("2c.3g.40gb", 40_320), device("1c.3g.40gb", 40_320)];
        let found = instances(&shared, || Ok(vec![(1, 0), (1, 1)])).expect("pairs");
        assert_eq!(found, vec![instance(1, 0, "2c.3g.40gb", 40_320), instance(1, 1, "1c.3g.40gb", 40_320)]);
        // No MIG device: nothing to pair, whatever the directories say.
        assert_eq!(instances(&[], || Ok(Vec::new())), Ok(Vec::new()));
    }

    #[test]
    fn pre_r470_uuids_need_no_capability_directories() {
        let mut devices = [device("1g.10gb", 9_984), device("1g.10gb", 9_984)];
        devices[0].uuid = "MIG-GPU-63feeb45-94c6-b9cb-78ea-98e9b7a5be6b/8/0".to_owned();
        devices[1].uuid = "MIG-GPU-63feeb45-94c6-b9cb-78ea-98e9b7a5be6b/7/0".to_owned();
        let found = instances(&devices, || Err("not to be read".to_owned())).expect("named ids");
        assert_eq!(found, vec![instance(7, 0, "1g.10gb", 9_984), instance(8, 0, "1g.10gb", 9_984)]);
    }

    #[test]
    fn a_pairing_that_does_not_add_up_reports_nothing_and_says_why() {
        let devices = [device("3g.40gb", 40_320), device("1g.10gb", 9_984)];
        let error = instances(&devices, || Ok(vec![(2, 0)])).expect_err("one directory for two devices");
        assert!(error.contains("2 MIG devices") && error.contains("1 compute instances"), "{error}");
        let error = instances(&devices, || Err("gpu0/mig could not be read".to_owned())).expect_err("unreadable");
        assert_eq!(error, "gpu0/mig could not be read");
        // Devices of different GPU instances cannot be compute instances of one.
        let error = instances(&devices, || Ok(vec![(1, 0), (1, 1)])).expect_err("mismatched");
        assert!(error.contains("GPU instance 1"), "{error}");
        let mut odd = [device("1g.10gb", 9_984), device("1g.10gb", 9_984)];
        odd[1].name = "NVIDIA H100 80GB HBM3".to_owned();
        let error = instances(&odd, || Ok(vec![(1, 0), (2, 0)])).expect_err("no profile");
        assert!(error.contains("names no MIG profile"), "{error}");
        let mut twice = [device("1g.10gb", 9_984), device("1g.10gb", 9_984)];
        for d in &mut twice {
            d.uuid = "MIG-GPU-63feeb45-94c6-b9cb-78ea-98e9b7a5be6b/7/0".to_owned();
        }
        let error = instances(&twice, || Ok(Vec::new())).expect_err("duplicate ids");
        assert!(error.contains("two MIG devices claim"), "{error}");
    }
}
