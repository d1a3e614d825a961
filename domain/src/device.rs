//! Devices and atoms. A device is a unit with typed attributes; atoms are the bookable devices, which depend on
//! the pool's sharing mode: a `gpu` per GPU, a `gpu.mig` per MIG instance (`<uuid>/gi<g>/ci<c>`), or
//! `sharing.replicas` `gpu.slot`s per GPU (`<uuid>/s<k>`). A partitioned GPU is never bookable itself.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::gpu;
use crate::id::DeviceId;

/// A device's class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum DeviceClass {
    #[serde(rename = "gpu")]
    Gpu,
    #[serde(rename = "gpu.mig")]
    GpuMig,
    #[serde(rename = "gpu.slot")]
    GpuSlot,
    #[serde(rename = "nic.vf")]
    NicVf,
    #[serde(rename = "disk")]
    Disk,
    #[serde(rename = "node")]
    Node,
}

impl DeviceClass {
    pub const ALL: [DeviceClass; 6] = [
        DeviceClass::Gpu,
        DeviceClass::GpuMig,
        DeviceClass::GpuSlot,
        DeviceClass::NicVf,
        DeviceClass::Disk,
        DeviceClass::Node,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DeviceClass::Gpu => "gpu",
            DeviceClass::GpuMig => "gpu.mig",
            DeviceClass::GpuSlot => "gpu.slot",
            DeviceClass::NicVf => "nic.vf",
            DeviceClass::Disk => "disk",
            DeviceClass::Node => "node",
        }
    }
}

impl fmt::Display for DeviceClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DeviceClass {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DeviceClass::ALL
            .into_iter()
            .find(|class| class.as_str() == s)
            .ok_or_else(|| format!("{s:?} is not a device class (gpu, gpu.mig, gpu.slot, nic.vf, disk, node)"))
    }
}

/// A typed attribute value, for selectors.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum AttrValue {
    Bool(bool),
    Int(i64),
    String(String),
}

/// A MIG instance a GPU reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigInstance {
    pub gpu_instance: u32,
    pub compute_instance: u32,
    /// The profile, such as `1g.10gb`.
    pub profile: String,
    #[serde(default)]
    pub memory_mib: u64,
}

/// A GPU as a node's inventory reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuInfo {
    /// The GPU UUID, such as `GPU-5b1d9c2e-...`: the device id.
    pub uuid: DeviceId,
    /// The NVML name, such as `NVIDIA H100 80GB HBM3`.
    pub name: String,
    #[serde(default)]
    pub memory_mib: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// MIG instances, when MIG mode is on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_instances: Vec<MigInstance>,
}

/// The longest GPU UUID accepted from an agent or an operator. Real ones are 40 characters; the limit leaves room
/// within a device id's 200 for the longest MIG or slot suffix (`/gi<n>/ci<n>`, `/s<n>`), so every device id
/// made from a GPU reads back.
pub const MAX_GPU_UUID: usize = 128;

/// Checks GPUs reported by an agent or registered by an operator, naming the field under `field` (`gpus`): each
/// UUID listed once and at most [`MAX_GPU_UUID`] characters.
pub fn check_gpus<'a>(field: &str, gpus: impl IntoIterator<Item = &'a GpuInfo>) -> Result<(), crate::Rejection> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, gpu) in gpus.into_iter().enumerate() {
        let uuid = gpu.uuid.as_str();
        if uuid.chars().count() > MAX_GPU_UUID {
            return Err(crate::Rejection::invalid(
                format!("{field}[{i}].uuid"),
                format!("is {} characters long; a GPU UUID has at most {MAX_GPU_UUID}", uuid.chars().count()),
            ));
        }
        if !seen.insert(uuid) {
            return Err(crate::Rejection::invalid(format!("{field}[{i}].uuid"), format!("{uuid} is listed twice")));
        }
    }
    Ok(())
}

/// The path of the first text in `value` holding a NUL character, which PostgreSQL cannot store as text or
/// `jsonb`: such input is refused as bad input, never failed on in the database.
pub fn first_nul(value: &serde_json::Value, path: &str) -> Option<String> {
    match value {
        serde_json::Value::String(text) => text.contains('\0').then(|| path.to_owned()),
        serde_json::Value::Array(items) => {
            items.iter().enumerate().find_map(|(i, item)| first_nul(item, &format!("{path}[{i}]")))
        }
        serde_json::Value::Object(fields) => fields.iter().find_map(|(key, item)| {
            if key.contains('\0') { Some(path.to_owned()) } else { first_nul(item, &format!("{path}.{key}")) }
        }),
        _ => None,
    }
}

/// Refuses input holding a NUL character anywhere, naming where.
pub fn check_no_nul<T: Serialize>(field: &str, input: &T) -> Result<(), crate::Rejection> {
    let value = serde_json::to_value(input).map_err(|err| crate::Rejection::invalid(field, err.to_string()))?;
    match first_nul(&value, field) {
        Some(path) => Err(crate::Rejection::invalid(path, "contains a NUL character")),
        None => Ok(()),
    }
}

/// A device of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub id: DeviceId,
    pub class: DeviceClass,
    /// The GPU a MIG instance or slot belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<DeviceId>,
    /// Whether it is an atom: only atoms are ever booked.
    pub bookable: bool,
    pub gpu_model: String,
    pub gpu_product: String,
    #[serde(default)]
    pub attributes: BTreeMap<String, AttrValue>,
}

/// How a pool shares its GPUs, and so which atoms it books.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sharing {
    /// One `gpu` atom per GPU.
    #[default]
    Exclusive,
    /// One `gpu.mig` atom per MIG instance; the partitioned GPU itself is never bookable.
    Mig,
    /// `sharing.replicas` `gpu.slot` atoms per GPU.
    Timeslice,
    /// `sharing.replicas` `gpu.slot` atoms per GPU, shared through MPS.
    Mps,
}

impl Sharing {
    /// The class of the atoms this sharing mode books.
    pub fn atom_class(self) -> DeviceClass {
        match self {
            Sharing::Exclusive => DeviceClass::Gpu,
            Sharing::Mig => DeviceClass::GpuMig,
            Sharing::Timeslice | Sharing::Mps => DeviceClass::GpuSlot,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Sharing::Exclusive => "exclusive",
            Sharing::Mig => "mig",
            Sharing::Timeslice => "timeslice",
            Sharing::Mps => "mps",
        }
    }
}

/// Turns a node's devices into those of a pool that hands out whole machines (`policy.tenantRoot`): its GPUs
/// stay listed but are never booked on their own, and the node itself becomes the one atom, of class `node`,
/// with its GPUs' model and product (the pool's model when it has none) and their count as `gpus`.
pub fn whole_node(node_id: &crate::id::NodeId, devices: &mut Vec<Device>, pool_gpu_model: &str) {
    let gpus: Vec<&Device> = devices.iter().filter(|d| d.class == DeviceClass::Gpu).collect();
    let (gpu_model, gpu_product) = match gpus.first() {
        Some(first) => (first.gpu_model.clone(), first.gpu_product.clone()),
        None => (pool_gpu_model.to_owned(), String::new()),
    };
    let atom = Device {
        id: DeviceId::whole_node(node_id),
        class: DeviceClass::Node,
        parent: None,
        bookable: true,
        gpu_model,
        gpu_product,
        attributes: BTreeMap::from([("gpus".to_owned(), AttrValue::Int(gpus.len() as i64))]),
    };
    for device in devices.iter_mut() {
        device.bookable = false;
    }
    devices.push(atom);
}

/// The devices of a node's GPUs under a pool's sharing mode, and the NVML names this build does not know
/// (their GPUs get `gpuModel: other`, and the node the `GpuModelUnknown` condition).
pub fn devices_for(gpus: &[GpuInfo], sharing: Sharing, replicas: u32) -> (Vec<Device>, Vec<String>) {
    let mut devices = Vec::new();
    let mut unknown = Vec::new();
    for info in gpus {
        let name = gpu::classify(&info.name);
        if !name.known && !unknown.contains(&info.name) {
            unknown.push(info.name.clone());
        }
        let mut attributes = BTreeMap::from([("memoryMiB".to_owned(), AttrValue::Int(info.memory_mib as i64))]);
        if let Some(bus) = &info.pci_bus_id {
            attributes.insert("pciBusId".to_owned(), AttrValue::String(bus.clone()));
        }
        let partitioned = !info.mig_instances.is_empty();
        let whole_gpu_is_atom = sharing == Sharing::Exclusive && !partitioned;
        devices.push(Device {
            id: info.uuid.clone(),
            class: DeviceClass::Gpu,
            parent: None,
            bookable: whole_gpu_is_atom,
            gpu_model: name.gpu_model.clone(),
            gpu_product: name.gpu_product.clone(),
            attributes: attributes.clone(),
        });
        match sharing {
            Sharing::Exclusive => {}
            Sharing::Mig => {
                for instance in &info.mig_instances {
                    let mut attributes = attributes.clone();
                    attributes.insert("migProfile".to_owned(), AttrValue::String(instance.profile.clone()));
                    attributes.insert("memoryMiB".to_owned(), AttrValue::Int(instance.memory_mib as i64));
                    devices.push(Device {
                        id: DeviceId::mig(&info.uuid, instance.gpu_instance, instance.compute_instance),
                        class: DeviceClass::GpuMig,
                        parent: Some(info.uuid.clone()),
                        bookable: true,
                        gpu_model: name.gpu_model.clone(),
                        gpu_product: name.gpu_product.clone(),
                        attributes,
                    });
                }
            }
            Sharing::Timeslice | Sharing::Mps => {
                for slot in 0..replicas.max(1) {
                    devices.push(Device {
                        id: DeviceId::slot(&info.uuid, slot),
                        class: DeviceClass::GpuSlot,
                        parent: Some(info.uuid.clone()),
                        bookable: !partitioned,
                        gpu_model: name.gpu_model.clone(),
                        gpu_product: name.gpu_product.clone(),
                        attributes: attributes.clone(),
                    });
                }
            }
        }
    }
    (devices, unknown)
}

#[cfg(test)]
mod tests;
