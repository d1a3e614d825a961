//! Nodes on the wire: registration, the operator verbs' bodies and answers, commands, the inventory, join
//! tokens.

use std::collections::BTreeMap;

#[cfg(feature = "server")]
use bc_commands::agents::{IssuedJoinToken, JoinTokenInfo};
#[cfg(feature = "server")]
use bc_commands::node_commands::CommandRecord;
#[cfg(feature = "server")]
use bc_commands::nodes::InventorySnapshot;
#[cfg(feature = "server")]
use bc_commands::reads::NodeView;
use bc_domain::device::MigInstance;
use bc_domain::inventory::NodeInventory;
use bc_domain::node::{Condition, Role, Trust};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[cfg(feature = "server")]
use super::spelling;

/// A MIG instance of a registered GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigInstanceBody {
    pub gpu_instance: u32,
    pub compute_instance: u32,
    /// The profile, such as `1g.10gb`.
    pub profile: String,
    #[serde(default)]
    pub memory_mib: u64,
}

impl From<MigInstanceBody> for MigInstance {
    fn from(m: MigInstanceBody) -> Self {
        MigInstance {
            gpu_instance: m.gpu_instance,
            compute_instance: m.compute_instance,
            profile: m.profile,
            memory_mib: m.memory_mib,
        }
    }
}

/// One GPU of a registration.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuBody {
    pub uuid: String,
    pub name: String,
    #[serde(default)]
    pub memory_mib: u64,
    pub pci_bus_id: Option<String>,
    #[serde(default)]
    pub mig_instances: Vec<MigInstanceBody>,
}

/// The body of `POST /v1/nodes`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterBody {
    pub pool_id: String,
    pub name: String,
    /// `unassigned`, `host`, `dedicated` or `site`.
    #[schema(value_type = String, example = "host")]
    pub role: Role,
    /// `platform`, `tenant-owned` or `tenant-controlled`.
    #[schema(value_type = String, example = "platform")]
    pub trust: Trust,
    pub owner_tenant_id: Option<String>,
    pub gpus: Vec<GpuBody>,
    /// Its scalar resources, for a node whose agent reports no inventory: `vcpu` (logical CPUs), `memoryGiB` and
    /// `disk` (GiB). A node running `bcd` reports its own, which replace these.
    #[serde(default)]
    #[schema(example = json!({"vcpu": 128, "memoryGiB": 1024}))]
    pub resources: BTreeMap<String, u64>,
}

/// A condition a node carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConditionDto {
    /// `GpuCountMismatch`, `NodeUnreachable`, `ClockSkew`, `GpuModelUnknown`, `HardwareChanged`, ...
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
    pub since: i64,
}

impl From<&Condition> for ConditionDto {
    fn from(c: &Condition) -> Self {
        ConditionDto { kind: c.kind.as_str().to_owned(), message: c.message.clone(), since: c.since_ms }
    }
}

/// A node: each axis of its state on its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeDto {
    pub id: String,
    pub pool_id: String,
    pub site_id: String,
    /// The tenant a dedicated node belongs to.
    pub owner_tenant_id: Option<String>,
    pub name: String,
    pub role: String,
    pub trust: String,
    /// `bcd/v1` or `provider-api/v1`.
    pub adapter: String,
    pub provision_state: String,
    pub maintenance: bool,
    pub cordoned: bool,
    /// `on`, `off` or `unknown`, as the machine's BMC last reported it to the site agent; `unknown` for a node
    /// without a BMC (one that joined by running `bcd`).
    pub power: String,
    /// Its scalar resources as its inventory last reported them (`vcpu`, `memoryGiB`, `disk`), before the pool's
    /// overcommit.
    pub resources: BTreeMap<String, u64>,
    /// `connected`, `disconnected`, `unreachable` or `lost`.
    pub connectivity: String,
    pub conditions: Vec<ConditionDto>,
    pub no_schedule_reasons: Vec<String>,
    pub observed_generation: u64,
    pub schedulable: bool,
    pub gpu_count: u32,
    /// The class of the atoms it holds in its pool (`gpu`, `gpu.mig`, `gpu.slot`).
    pub atom_class: Option<String>,
    pub atom_count: u32,
    /// A drain began and has not completed (the node is cordoned meanwhile).
    pub draining: bool,
    /// The generation of its desired state (`observedGeneration` is what its agent applied).
    pub generation: u64,
    pub registered_at: i64,
    /// The hash of the machine's surviving identifiers (its product UUID, serial, MACs and GPU UUIDs), which
    /// recognises it when it joins again; `null` for a node registered without an agent.
    pub hardware_key: Option<String>,
    /// Whether enough identifier kinds survived for the key to be trusted.
    pub hardware_trusted: bool,
    /// The BMC of a machine enrolled from it (its credentials are sealed and never shown).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bmc: Option<BmcDto>,
    /// Since when it is in a transitional `provisionState`; it goes to `failed` if it stays past the state's limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provision_since: Option<i64>,
}

/// A machine's BMC as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BmcDto {
    /// `redfish` or `ipmi`.
    pub driver: String,
    pub address: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_id: Option<String>,
    pub insecure_tls: bool,
    /// The driver carrying each concern.
    pub drivers: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_mac: Option<String>,
}

impl From<&bc_domain::node::NodeBmc> for BmcDto {
    fn from(b: &bc_domain::node::NodeBmc) -> Self {
        BmcDto {
            driver: b.driver.as_str().to_owned(),
            address: b.address.clone(),
            system_id: b.system_id.clone(),
            insecure_tls: b.insecure_tls,
            drivers: b.drivers.iter().map(|(c, d)| (c.as_str().to_owned(), d.clone())).collect(),
            boot_mac: b.boot_mac.clone(),
        }
    }
}

/// The body of `POST /v1/nodes/enrol`: a machine known by its BMC.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnrolBody {
    pub pool_id: String,
    pub name: String,
    pub bmc: BmcBody,
    /// The driver of a concern, where the default does not fit (the BMC's own driver for power, management and
    /// boot, and virtual media with Redfish; `bcd` for deploy and inspect).
    #[schema(value_type = BTreeMap<String, String>)]
    #[serde(default)]
    pub drivers: BTreeMap<bc_domain::profile::Concern, String>,
    /// The MAC address the machine boots from the network with (`aa:bb:cc:dd:ee:ff`): the site agent answers
    /// its boot script by it. Unique among the enrolled machines.
    #[serde(default)]
    pub boot_mac: Option<String>,
}

/// A BMC and its credentials.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BmcBody {
    /// `redfish` or `ipmi`.
    #[schema(value_type = String)]
    pub driver: bc_domain::node::BmcDriver,
    /// `https://host[:port]` for Redfish, `host[:port]` for IPMI.
    pub address: String,
    /// The Redfish system's id or UUID, when the BMC has several.
    #[serde(default)]
    pub system_id: Option<String>,
    /// Accept the BMC's certificate unchecked (self-signed BMCs).
    #[serde(default)]
    pub insecure_tls: bool,
    pub username: String,
    /// Sealed with the control plane's key; never shown, never in an event.
    pub password: String,
}

/// The body of `POST /v1/nodes/{id}/provision-state`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProvisionBody {
    /// The state to go to: `inspecting`, `commissioning`, `ready`, `deploying`, `deployed`, `releasing`,
    /// `rescue`, `failed`, `retiring`, `retired` (as the lifecycle allows from where the node is).
    #[schema(value_type = String)]
    pub state: bc_domain::node::ProvisionState,
    #[serde(default)]
    pub reason: Option<String>,
}

#[cfg(feature = "server")]
impl From<&NodeView> for NodeDto {
    fn from(n: &NodeView) -> Self {
        NodeDto {
            id: n.id.to_string(),
            pool_id: n.pool_id.to_string(),
            site_id: n.site_id.to_string(),
            owner_tenant_id: n.owner_tenant_id.as_ref().map(ToString::to_string),
            name: n.name.clone(),
            role: spelling(&n.role),
            trust: spelling(&n.trust),
            adapter: spelling(&n.adapter),
            provision_state: spelling(&n.provision_state),
            power: n.power.as_str().to_owned(),
            resources: n.resources.clone(),
            maintenance: n.maintenance,
            cordoned: n.cordoned,
            connectivity: spelling(&n.connectivity),
            conditions: n.conditions.iter().map(Into::into).collect(),
            no_schedule_reasons: n.no_schedule_reasons.clone(),
            observed_generation: n.observed_generation,
            schedulable: n.schedulable,
            gpu_count: n.gpu_count,
            atom_class: n.atom_class.map(|c| c.as_str().to_owned()),
            atom_count: n.atom_count,
            draining: n.draining,
            generation: n.generation,
            registered_at: n.registered_at_ms,
            hardware_key: n.hardware_key.clone(),
            hardware_trusted: n.hardware_trusted,
            bmc: n.bmc.as_ref().map(Into::into),
            provision_since: n.provision_since_ms,
        }
    }
}

/// One device of a node: a GPU, or an atom below it (a MIG instance, a time-slice slot).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceDto {
    pub id: String,
    /// `gpu`, `gpu.mig` or `gpu.slot`.
    pub class: String,
    /// The GPU an atom belongs to.
    pub parent: Option<String>,
    /// Whether the pool books it (only atoms are booked).
    pub bookable: bool,
    pub gpu_model: String,
    pub gpu_product: String,
    /// Such as `memoryMiB`.
    #[schema(value_type = Object)]
    pub attributes: BTreeMap<String, serde_json::Value>,
}

impl From<&bc_domain::device::Device> for DeviceDto {
    fn from(d: &bc_domain::device::Device) -> Self {
        use bc_domain::device::AttrValue;
        DeviceDto {
            id: d.id.to_string(),
            class: d.class.as_str().to_owned(),
            parent: d.parent.as_ref().map(ToString::to_string),
            bookable: d.bookable,
            gpu_model: d.gpu_model.clone(),
            gpu_product: d.gpu_product.clone(),
            attributes: d
                .attributes
                .iter()
                .map(|(k, v)| {
                    let value = match v {
                        AttrValue::Bool(b) => serde_json::Value::from(*b),
                        AttrValue::Int(i) => serde_json::Value::from(*i),
                        AttrValue::String(s) => serde_json::Value::from(s.clone()),
                    };
                    (k.clone(), value)
                })
                .collect(),
        }
    }
}

/// A node's devices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeDevicesDto {
    pub node_id: String,
    pub items: Vec<DeviceDto>,
}

/// Body of the verbs (cordon, uncordon, maintenance): an optional reason, recorded with the event.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VerbBody {
    /// Why, for the audit trail: at most 1024 characters.
    #[schema(max_length = 1024)]
    pub reason: Option<String>,
}

/// Body of `POST /v1/nodes/{node_id}/drain`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ForceBody {
    /// End the reservations running on the node instead of letting them finish.
    #[serde(default)]
    pub force: bool,
    /// Why, for the audit trail: at most 1024 characters.
    #[schema(max_length = 1024)]
    pub reason: Option<String>,
}

/// What a verb answers: the node it changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeChangedDto {
    pub id: String,
}

/// What `DELETE /v1/nodes/{node_id}` answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeDeletedDto {
    pub id: String,
    pub deleted: bool,
}

/// Body of `PUT /v1/nodes/{node_id}/spec`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpecBody {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub mig_layout: Option<String>,
}

/// What a spec change answers: the new generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpecSetDto {
    pub id: String,
    pub generation: u64,
}

/// Body of `POST /v1/nodes/{node_id}/commands`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandBody {
    /// `probe` or `refresh-inventory`.
    pub kind: String,
    pub note: Option<String>,
    /// Epoch ms before which it is not delivered.
    pub not_before: Option<i64>,
    /// Epoch ms after which, still undelivered, it expires.
    pub not_after: Option<i64>,
    /// Held until the node has observed this generation.
    pub min_generation: Option<u64>,
}

/// A command queued for a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommandQueuedDto {
    pub id: String,
    pub node_id: String,
    pub seq: u64,
}

/// What a command asks the agent to do, as it travels: its `kind` and the kind's fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommandBodyDto {
    /// `bind`, `unbind`, `refresh-inventory` or `probe`.
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocation_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub devices: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl From<&bc_domain::agent::CommandKind> for CommandBodyDto {
    fn from(kind: &bc_domain::agent::CommandKind) -> Self {
        use bc_domain::agent::CommandKind as K;
        let mut dto = CommandBodyDto {
            kind: kind.name().to_owned(),
            reservation_id: None,
            allocation_id: None,
            devices: None,
            note: None,
        };
        match kind {
            K::Bind { reservation_id, allocation_id, devices }
            | K::Unbind { reservation_id, allocation_id, devices } => {
                dto.reservation_id = Some(reservation_id.to_string());
                dto.allocation_id = Some(allocation_id.to_string());
                dto.devices = Some(devices.iter().map(ToString::to_string).collect());
            }
            K::Probe { note } => dto.note = note.clone(),
            K::RefreshInventory => {}
        }
        dto
    }
}

/// A command as stored, for operators.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommandDto {
    pub id: String,
    pub node_id: String,
    pub seq: u64,
    pub kind: String,
    pub body: CommandBodyDto,
    /// `queued`, `succeeded`, `failed` or `expired`.
    pub state: String,
    pub not_before: i64,
    pub not_after: Option<i64>,
    pub min_generation: Option<u64>,
    pub deliveries: i32,
    pub created_at: i64,
    pub finished_at: Option<i64>,
    pub message: Option<String>,
}

#[cfg(feature = "server")]
impl From<&CommandRecord> for CommandDto {
    fn from(c: &CommandRecord) -> Self {
        CommandDto {
            id: c.id.to_string(),
            node_id: c.node_id.to_string(),
            seq: c.seq,
            kind: c.kind.clone(),
            body: (&c.body).into(),
            state: c.state.clone(),
            not_before: c.not_before,
            not_after: c.not_after,
            min_generation: c.min_generation,
            deliveries: c.deliveries,
            created_at: c.created_at,
            finished_at: c.finished_at,
            message: c.message.clone(),
        }
    }
}

/// `GET /v1/nodes/{node_id}/commands`: the latest commands, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommandListDto {
    pub items: Vec<CommandDto>,
}

/// A node's latest inventory snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct InventoryDto {
    pub node_id: String,
    pub snapshot: u64,
    pub received_at: i64,
    /// The `NodeInventory v1` document as the agent reported it: `version`, and the `system`, `gpus`, `nics`
    /// and `disks` sections.
    #[schema(value_type = Object)]
    pub document: NodeInventory,
}

#[cfg(feature = "server")]
impl InventoryDto {
    pub fn new(node_id: String, snapshot: InventorySnapshot) -> Self {
        InventoryDto {
            node_id,
            snapshot: snapshot.snapshot,
            received_at: snapshot.received_at_ms,
            document: snapshot.document,
        }
    }
}

/// Body of `POST /v1/pools/{pool_id}/join-tokens`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinTokenBody {
    /// How long the token admits a machine, in seconds (60 to 604800; default 3600).
    #[schema(minimum = 60, maximum = 604_800)]
    pub ttl_seconds: Option<u64>,
}

/// A join token, shown once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JoinTokenDto {
    pub id: String,
    /// The secret (`jt_...`): it admits one machine into the pool until it expires.
    pub token: String,
    pub pool_id: String,
    pub expires_at: i64,
}

#[cfg(feature = "server")]
impl From<&IssuedJoinToken> for JoinTokenDto {
    fn from(t: &IssuedJoinToken) -> Self {
        JoinTokenDto {
            id: t.id.to_string(),
            token: t.token.clone(),
            pool_id: t.pool_id.to_string(),
            expires_at: t.expires_at_ms,
        }
    }
}

/// A join token as an operator lists it: never its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JoinTokenInfoDto {
    pub id: String,
    pub pool_id: String,
    /// `unused`, `used`, `expired` or `revoked`.
    pub state: String,
    pub created_by: String,
    pub created_at: i64,
    pub expires_at: i64,
    /// When a machine joined with it, and the node it became.
    pub used_at: Option<i64>,
    pub node_id: Option<String>,
    pub revoked_at: Option<i64>,
}

#[cfg(feature = "server")]
impl From<&JoinTokenInfo> for JoinTokenInfoDto {
    fn from(t: &JoinTokenInfo) -> Self {
        let state = if t.used_at_ms.is_some() {
            "used"
        } else if t.revoked_at_ms.is_some() {
            "revoked"
        } else if t.expired {
            "expired"
        } else {
            "unused"
        };
        JoinTokenInfoDto {
            id: t.id.to_string(),
            pool_id: t.pool_id.to_string(),
            state: state.to_owned(),
            created_by: t.created_by.clone(),
            created_at: t.created_at_ms,
            expires_at: t.expires_at_ms,
            used_at: t.used_at_ms,
            node_id: t.node_id.as_ref().map(ToString::to_string),
            revoked_at: t.revoked_at_ms,
        }
    }
}
