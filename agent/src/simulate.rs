//! `--simulate 8xH100`: the inventory of a machine with GPUs that are not there, so that everything runs on a
//! machine without one. The same host name gives the same document (identifiers are derived from it).
//! A MIG layout follows a colon: `8xH100:1g.10gb*7` partitions every GPU into seven `1g.10gb` instances,
//! `4xA100-SXM4-80GB:3g.40gb*2` into two `3g.40gb` ones.

use bc_domain::device::{GpuInfo, MigInstance};
use bc_domain::gpu;
use bc_domain::inventory::{DiskSection, GpuSection, NicSection, NodeInventory, SystemSection};

/// What `--simulate` was given: `<count>x<gpuModel or gpuProduct>[:<profile>*<n>,...]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Simulated {
    pub count: u32,
    pub nvml_name: &'static str,
    pub memory_mib: u64,
    /// Each GPU's MIG instances, as (profile, count); empty when MIG is off.
    pub mig: Vec<(String, u32)>,
}

/// A MIG profile's memory: `1g.10gb` has about 10 GB (NVML reports a little less).
fn profile_memory_mib(profile: &str) -> Option<u64> {
    let (slices, memory) = profile.split_once('.')?;
    slices.strip_suffix('g')?.parse::<u32>().ok().filter(|s| (1..=8).contains(s))?;
    let gb: u64 = memory.strip_suffix("gb")?.parse().ok()?;
    Some(gb * 1024 - 384)
}

impl std::str::FromStr for Simulated {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (machine, layout) = match text.split_once(':') {
            Some((machine, layout)) => (machine, Some(layout)),
            None => (text, None),
        };
        let mut mig = Vec::new();
        for part in layout.into_iter().flat_map(|l| l.split(',')) {
            let (profile, n) = part.split_once('*').unwrap_or((part, "1"));
            let n: u32 = n.trim().parse().map_err(|_| format!("{text:?}: {n:?} is not a MIG instance count"))?;
            if profile_memory_mib(profile.trim()).is_none() || !(1..=7).contains(&n) {
                return Err(format!("{text:?}: {part:?} is not <profile>*<1 to 7>, such as 1g.10gb*7"));
            }
            mig.push((profile.trim().to_owned(), n));
        }
        if mig.iter().map(|(_, n)| n).sum::<u32>() > 7 {
            return Err(format!("{text:?}: a GPU holds at most seven MIG instances"));
        }
        let text = machine;
        let (count, label) =
            text.split_once(['x', 'X']).ok_or_else(|| format!("{text:?}: expected <count>x<model>, such as 8xH100"))?;
        let count: u32 = count.trim().parse().map_err(|_| format!("{text:?}: {count:?} is not a GPU count"))?;
        if !(1..=64).contains(&count) {
            return Err(format!("{text:?}: a machine has 1 to 64 GPUs"));
        }
        let nvml_name = gpu::nvml_name_for(label.trim())
            .ok_or_else(|| format!("{text:?}: {label:?} is no GPU model or product in gpu-models.json"))?;
        let product = gpu::classify(nvml_name).gpu_product;
        // The product names its memory (`H100-SXM5-80GB`); NVML reports a little less than the label.
        let gb = product
            .split('-')
            .find_map(|part| part.strip_suffix("GB").and_then(|n| n.parse::<u64>().ok()))
            .unwrap_or(16);
        Ok(Simulated { count, nvml_name, memory_mib: gb * 1024 - 365, mig })
    }
}

fn derived(host: &str, what: &str) -> String {
    bc_domain::sha256_hex(format!("{host}/{what}"))
}

/// A GPU's MIG instances for a layout: GPU instances numbered from 1, one compute instance each.
fn mig_instances(layout: &[(String, u32)]) -> Vec<MigInstance> {
    let mut instances = Vec::new();
    for (profile, n) in layout {
        for _ in 0..*n {
            instances.push(MigInstance {
                gpu_instance: instances.len() as u32 + 1,
                compute_instance: 0,
                profile: profile.clone(),
                memory_mib: profile_memory_mib(profile).unwrap_or_default(),
            });
        }
    }
    instances
}

/// The inventory of simulated machine `host` with the GPUs of `spec`.
pub fn inventory(host: &str, spec: &Simulated) -> NodeInventory {
    let id = derived(host, "machine");
    let uuid = |what: &str| {
        let h = derived(host, what);
        format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
    };
    let mut doc = NodeInventory::new(SystemSection {
        hostname: host.to_owned(),
        machine_id: Some(id[..32].to_owned()),
        product_uuid: Some(uuid("product")),
        board_serial: Some(format!("SIM{}", &id[32..44]).to_uppercase()),
        os: "simulated".into(),
        kernel: "simulated".into(),
        cpu_model: "simulated CPU".into(),
        cpu_cores: 16 * spec.count.max(1),
        memory_mib: 256 * 1024 * u64::from(spec.count.max(1)),
        driver_version: Some("simulated".into()),
        cuda_version: None,
    });
    let bus = |i: u32| format!("00000000:{:02x}:00.0", 0x18 + i * 0x10);
    for i in 0..spec.count {
        doc.gpus.push(GpuSection {
            info: GpuInfo {
                uuid: format!("GPU-{}", uuid(&format!("gpu{i}"))).parse().expect("a derived GPU uuid is valid"),
                name: spec.nvml_name.to_owned(),
                memory_mib: spec.memory_mib,
                pci_bus_id: Some(bus(i)),
                mig_instances: mig_instances(&spec.mig),
            },
            serial: Some(format!("SIM{}", &derived(host, &format!("serial{i}"))[..13]).to_uppercase()),
            mig_enabled: !spec.mig.is_empty(),
            nvlink_peers: (0..spec.count).filter(|&p| p != i).map(bus).collect(),
        });
    }
    let mac = &id[44..54];
    doc.nics.push(NicSection {
        name: "eth0".into(),
        mac: format!("02:{}:{}:{}:{}:{}", &mac[0..2], &mac[2..4], &mac[4..6], &mac[6..8], &mac[8..10]),
        speed_mbps: Some(100_000),
        pci_bus_id: None,
    });
    doc.disks.push(DiskSection {
        name: "nvme0n1".into(),
        serial: Some(format!("SIM{}", &id[54..64]).to_uppercase()),
        size_bytes: 3_840_000_000_000,
    });
    doc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_names_a_count_and_a_known_model() {
        let spec: Simulated = "8xH100".parse().expect("parses");
        assert_eq!(spec.count, 8);
        assert_eq!(gpu::classify(spec.nvml_name).gpu_model, "H100");
        assert!(spec.memory_mib > 80_000 && spec.memory_mib < 81_920);
        let mig: Simulated = "8xH100:1g.10gb*7".parse().expect("a MIG layout");
        assert_eq!(mig.mig, vec![("1g.10gb".to_owned(), 7)]);
        let document = inventory("m", &mig);
        assert!(document.gpus.iter().all(|g| g.mig_enabled && g.info.mig_instances.len() == 7));
        let mixed: Simulated = "4xA100-SXM4-80GB:3g.40gb,2g.20gb*2".parse().expect("mixed");
        assert_eq!(inventory("n", &mixed).gpus[0].info.mig_instances.len(), 3);
        for bad in [
            "8",
            "0xH100",
            "65xH100",
            "eightxH100",
            "8xZ9000",
            "8xH100:1g.10gb*8",
            "8xH100:huge",
            "8xH100:1g.10gb*4,2g.20gb*4",
        ] {
            assert!(bad.parse::<Simulated>().is_err(), "{bad}");
        }
    }

    #[test]
    fn one_host_always_gets_the_same_document_and_two_hosts_different_gpus() {
        let spec: Simulated = "4xA100-SXM4-80GB".parse().expect("parses");
        let a = inventory("sim-a", &spec);
        assert_eq!(a, inventory("sim-a", &spec));
        assert_eq!(a.gpus.len(), 4);
        assert_eq!(gpu::classify(&a.gpus[0].info.name).gpu_product, "A100-SXM4-80GB");
        let b = inventory("sim-b", &spec);
        assert!(a.gpus.iter().all(|g| b.gpus.iter().all(|h| h.info.uuid != g.info.uuid)));
        assert_ne!(a.hashes(), b.hashes());
    }
}
