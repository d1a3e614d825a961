//! `NodeInventory v1`: what a node has, in four sections (system, GPUs, NICs, disks). Each section has its own
//! hash, so an agent sends only the sections whose hash the control plane does not have yet, and the control
//! plane keeps every accepted document as an append-only snapshot.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::device::GpuInfo;

/// The value of a document's `schema` field.
pub const SCHEMA: &str = "NodeInventory/v1";

/// The machine itself: where its identifiers and software versions are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SystemSection {
    pub hostname: String,
    /// `/etc/machine-id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_id: Option<String>,
    /// SMBIOS product UUID and board serial: identifiers that survive a reinstall.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product_uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub board_serial: Option<String>,
    pub os: String,
    pub kernel: String,
    pub cpu_model: String,
    pub cpu_cores: u32,
    pub memory_mib: u64,
    /// The NVIDIA driver and its CUDA version, when NVML answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_version: Option<String>,
}

/// One GPU: what [`GpuInfo`] carries for capacity, and what only the inventory keeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuSection {
    #[serde(flatten)]
    pub info: GpuInfo,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(default)]
    pub mig_enabled: bool,
    /// The PCI bus ids of the GPUs it has NVLink to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nvlink_peers: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NicSection {
    pub name: String,
    pub mac: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_mbps: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskSection {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    pub size_bytes: u64,
}

/// The whole document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeInventory {
    pub schema: String,
    pub system: SystemSection,
    pub gpus: Vec<GpuSection>,
    pub nics: Vec<NicSection>,
    pub disks: Vec<DiskSection>,
}

/// The document's sections, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Section {
    System,
    Gpus,
    Nics,
    Disks,
}

impl Section {
    pub const ALL: [Section; 4] = [Section::System, Section::Gpus, Section::Nics, Section::Disks];
}

/// Each section's hash: `sha256:` and the hex digest of the section's JSON.
pub type SectionHashes = BTreeMap<Section, String>;

/// What an agent sends: every section's hash, and the sections the control plane does not have.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InventoryReport {
    pub schema: String,
    pub hashes: SectionHashes,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<SystemSection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<Vec<GpuSection>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nics: Option<Vec<NicSection>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disks: Option<Vec<DiskSection>>,
}

fn digest<T: Serialize>(section: &T) -> String {
    // Structs serialize their fields in declaration order and lists keep theirs, so the JSON is canonical.
    let bytes = serde_json::to_vec(section).expect("an inventory section serializes");
    format!("sha256:{}", crate::sha256_hex(bytes))
}

impl NodeInventory {
    /// What the document says identifies the machine, for its hardware key.
    pub fn hardware_identity(&self) -> crate::hardware::HardwareIdentity {
        crate::hardware::HardwareIdentity {
            product_uuid: self.system.product_uuid.clone(),
            serial_number: self.system.board_serial.clone(),
            permanent_macs: self.nics.iter().map(|n| n.mac.clone()).collect(),
            gpu_uuids: self.gpus.iter().map(|g| g.info.uuid.to_string()).collect(),
        }
    }

    /// An empty document of this schema.
    pub fn new(system: SystemSection) -> Self {
        NodeInventory { schema: SCHEMA.to_owned(), system, gpus: Vec::new(), nics: Vec::new(), disks: Vec::new() }
    }

    /// One section's hash.
    pub fn hash(&self, section: Section) -> String {
        match section {
            Section::System => digest(&self.system),
            Section::Gpus => digest(&self.gpus),
            Section::Nics => digest(&self.nics),
            Section::Disks => digest(&self.disks),
        }
    }

    pub fn hashes(&self) -> SectionHashes {
        Section::ALL.into_iter().map(|s| (s, self.hash(s))).collect()
    }

    /// The report for a control plane that holds the sections hashed `known`: every hash, and only the sections
    /// whose hash differs.
    pub fn report(&self, known: &SectionHashes) -> InventoryReport {
        let hashes = self.hashes();
        let changed = |s: Section| known.get(&s) != hashes.get(&s);
        InventoryReport {
            schema: self.schema.clone(),
            system: changed(Section::System).then(|| self.system.clone()),
            gpus: changed(Section::Gpus).then(|| self.gpus.clone()),
            nics: changed(Section::Nics).then(|| self.nics.clone()),
            disks: changed(Section::Disks).then(|| self.disks.clone()),
            hashes,
        }
    }
}

/// Why a report cannot be applied to the document the control plane holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    #[error("schema: {0:?} is not {SCHEMA}")]
    Schema(String),
    #[error("{0:?}: the report neither sends this section nor names the hash held for it")]
    Missing(Section),
    #[error("{0:?}: the section sent does not have the hash the report names")]
    HashMismatch(Section),
}

impl InventoryReport {
    /// The document this report describes, given the one held before (`None` for a node's first report):
    /// sections not sent must have the hash of the held ones, and sections sent must match their hashes.
    pub fn apply(self, held: Option<&NodeInventory>) -> Result<NodeInventory, ReportError> {
        if self.schema != SCHEMA {
            return Err(ReportError::Schema(self.schema));
        }
        // A section not sent is the held one, if the report names the held one's hash.
        let held_section = |section: Section| match held {
            Some(held) if self.hashes.get(&section) == Some(&held.hash(section)) => Ok(held),
            _ => Err(ReportError::Missing(section)),
        };
        let document = NodeInventory {
            schema: SCHEMA.to_owned(),
            system: match self.system {
                Some(s) => s,
                None => held_section(Section::System)?.system.clone(),
            },
            gpus: match self.gpus {
                Some(g) => g,
                None => held_section(Section::Gpus)?.gpus.clone(),
            },
            nics: match self.nics {
                Some(n) => n,
                None => held_section(Section::Nics)?.nics.clone(),
            },
            disks: match self.disks {
                Some(d) => d,
                None => held_section(Section::Disks)?.disks.clone(),
            },
        };
        for section in Section::ALL {
            if self.hashes.get(&section) != Some(&document.hash(section)) {
                return Err(ReportError::HashMismatch(section));
            }
        }
        Ok(document)
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;
    use crate::device::GpuInfo;

    fn document() -> impl Strategy<Value = NodeInventory> {
        let gpu = ("[0-9a-f]{8}", 0u64..200_000, proptest::option::of("[0-9A-Z]{6}"), any::<bool>()).prop_map(
            |(id, memory_mib, serial, mig_enabled)| GpuSection {
                info: GpuInfo {
                    uuid: format!("GPU-{id}").parse().expect("a GPU id"),
                    name: "NVIDIA H100 80GB HBM3".into(),
                    memory_mib,
                    pci_bus_id: None,
                    mig_instances: Vec::new(),
                },
                serial,
                mig_enabled,
                nvlink_peers: Vec::new(),
            },
        );
        let nic = ("[a-z]{2,5}[0-9]", "[0-9a-f]{2}(:[0-9a-f]{2}){5}").prop_map(|(name, mac)| NicSection {
            name,
            mac,
            speed_mbps: None,
            pci_bus_id: None,
        });
        let disk = ("[a-z]{3}[0-9]", any::<u64>()).prop_map(|(name, size_bytes)| DiskSection {
            name,
            serial: None,
            size_bytes,
        });
        (
            "[a-z][a-z0-9-]{0,12}",
            proptest::collection::vec(gpu, 0..4),
            proptest::collection::vec(nic, 0..3),
            proptest::collection::vec(disk, 0..3),
        )
            .prop_map(|(hostname, gpus, nics, disks)| {
                let mut document = NodeInventory::new(SystemSection { hostname, ..SystemSection::default() });
                document.gpus = gpus;
                document.nics = nics;
                document.disks = disks;
                document
            })
    }

    proptest! {
        /// Whatever the control plane holds and whatever the machine has now, a report built against the held
        /// hashes carries only the sections that differ, and applying it rebuilds exactly the new document.
        #[test]
        fn a_report_against_the_held_document_rebuilds_the_new_one(held in document(), now in document()) {
            let report = now.report(&held.hashes());
            for section in Section::ALL {
                let sent = match section {
                    Section::System => report.system.is_some(),
                    Section::Gpus => report.gpus.is_some(),
                    Section::Nics => report.nics.is_some(),
                    Section::Disks => report.disks.is_some(),
                };
                prop_assert_eq!(sent, held.hash(section) != now.hash(section), "{:?}", section);
            }
            prop_assert_eq!(report.apply(Some(&held)).expect("applies"), now);
        }

        /// Any JSON body is either refused or applied, never a panic.
        #[test]
        fn any_report_body_is_refused_or_applied(body in "\\PC{0,200}") {
            if let Ok(report) = serde_json::from_str::<InventoryReport>(&body) {
                let _ = report.apply(None);
            }
        }
    }
}
