//! The agent protocol's answers as the OpenAPI document describes them. The bodies themselves are
//! `bc_domain::agent`'s types, which `bcd` shares so that both sides parse the same protocol; these are their
//! described twins, converted field by field, and a test validates every served body against them.

use std::collections::BTreeMap;

use bc_domain::agent::{AgentCommand, HeartbeatReply, InventoryAccepted, Joined, NodeCertificate, Session};
use bc_domain::inventory::SectionHashes;
use bc_domain::node::NodeSpec;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::nodes::CommandBodyDto;
use super::spelling;

/// A node's desired state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSpecDto {
    /// How the node's GPUs are shared, as the pool says.
    pub sharing: String,
    /// Slots per GPU for `timeslice` and `mps`.
    pub replicas: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig_layout: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl From<&NodeSpec> for NodeSpecDto {
    fn from(s: &NodeSpec) -> Self {
        NodeSpecDto {
            sharing: s.sharing.clone(),
            replicas: s.replicas,
            mig_layout: s.mig_layout.clone(),
            labels: s.labels.clone(),
        }
    }
}

/// Each inventory section's hash (`system`, `gpus`, `nics`, `disks`), `sha256:` and the hex digest.
fn hashes(h: &SectionHashes) -> BTreeMap<String, String> {
    h.iter().map(|(section, hash)| (spelling(section), hash.clone())).collect()
}

/// A session and how to keep it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionDto {
    pub session_id: String,
    pub node_id: String,
    /// How often to heartbeat.
    pub heartbeat_ms: u64,
    /// The liveness lease each heartbeat renews.
    pub lease_ms: u64,
    pub generation: u64,
    pub spec: NodeSpecDto,
    /// The section hashes of the inventory the control plane holds.
    pub inventory_hashes: BTreeMap<String, String>,
}

impl From<&Session> for SessionDto {
    fn from(s: &Session) -> Self {
        SessionDto {
            session_id: s.session_id.to_string(),
            node_id: s.node_id.to_string(),
            heartbeat_ms: s.heartbeat_ms,
            lease_ms: s.lease_ms,
            generation: s.generation,
            spec: (&s.spec).into(),
            inventory_hashes: hashes(&s.inventory_hashes),
        }
    }
}

/// What a join answers: the node, its credential (shown once), and a first session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JoinedDto {
    pub node_id: String,
    /// The node credential (`nc_...`): every later call carries it.
    pub credential: String,
    /// True when the machine was recognised as a node that already existed.
    pub rejoined: bool,
    pub session: SessionDto,
    /// The node's certificate (PEM) for the join's `csr`, signed by the control plane's CA.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub certificate: Option<String>,
}

impl From<&Joined> for JoinedDto {
    fn from(j: &Joined) -> Self {
        JoinedDto {
            node_id: j.node_id.to_string(),
            credential: j.credential.clone(),
            rejoined: j.rejoined,
            session: (&j.session).into(),
            certificate: j.certificate.clone(),
        }
    }
}

/// A request for the node's next certificate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CertificateRequestDto {
    /// A PKCS#10 certificate signing request, PEM, at most 4,096 characters (a P-256 request is about 500).
    #[schema(max_length = 4096)]
    pub csr: String,
}

/// A node certificate the control plane's CA signed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeCertificateDto {
    pub node_id: String,
    /// PEM.
    pub certificate: String,
    /// The serial number, lowercase hex.
    pub serial: String,
    /// When it expires, in seconds since the epoch.
    pub not_after: i64,
}

impl From<&NodeCertificate> for NodeCertificateDto {
    fn from(c: &NodeCertificate) -> Self {
        NodeCertificateDto {
            node_id: c.node_id.to_string(),
            certificate: c.certificate.clone(),
            serial: c.serial.clone(),
            not_after: c.not_after,
        }
    }
}

/// A rotated node credential.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialDto {
    pub node_id: String,
    /// The new credential: it replaces the old one at its first use.
    pub credential: String,
}

/// What a heartbeat answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatReplyDto {
    /// When the liveness lease now runs out (the control plane's clock).
    pub lease_expires_ms: i64,
    pub generation: u64,
    /// The spec, when `generation` is newer than what the agent observed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec: Option<NodeSpecDto>,
    /// Whether commands wait for the agent.
    pub commands_waiting: bool,
}

impl From<&HeartbeatReply> for HeartbeatReplyDto {
    fn from(h: &HeartbeatReply) -> Self {
        HeartbeatReplyDto {
            lease_expires_ms: h.lease_expires_ms,
            generation: h.generation,
            spec: h.spec.as_ref().map(Into::into),
            commands_waiting: h.commands_waiting,
        }
    }
}

/// An inventory report accepted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct InventoryAcceptedDto {
    /// The snapshot now current (unchanged when nothing changed).
    pub snapshot: u64,
    /// The sections that changed.
    pub changed: Vec<String>,
    pub hashes: BTreeMap<String, String>,
}

impl From<&InventoryAccepted> for InventoryAcceptedDto {
    fn from(i: &InventoryAccepted) -> Self {
        InventoryAcceptedDto {
            snapshot: i.snapshot,
            changed: i.changed.iter().map(spelling).collect(),
            hashes: hashes(&i.hashes),
        }
    }
}

/// One command as delivered: its id, `seq`, and its kind's fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentCommandDto {
    pub id: String,
    pub seq: u64,
    #[serde(flatten)]
    pub body: CommandBodyDto,
}

/// The commands deliverable now, in `seq` order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommandsDto {
    pub commands: Vec<AgentCommandDto>,
}

impl From<&[AgentCommand]> for CommandsDto {
    fn from(commands: &[AgentCommand]) -> Self {
        CommandsDto {
            commands: commands
                .iter()
                .map(|c| AgentCommandDto { id: c.id.to_string(), seq: c.seq, body: (&c.kind).into() })
                .collect(),
        }
    }
}

/// An acknowledged command's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AckedDto {
    pub id: String,
    /// `succeeded` or `failed`.
    pub state: String,
}

/// What a site agent should run now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SiteWorkDto {
    /// Whether this agent serves its site now (it holds the site's lease); a standby gets no steps.
    pub serving: bool,
    pub steps: Vec<SiteStepDto>,
}

/// A running site step: a call to a machine's BMC, with the credentials to make it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SiteStepDto {
    pub workflow_id: String,
    pub index: u32,
    pub attempt: u32,
    /// Such as `power-reset` or `boot-from-network`.
    pub action: String,
    pub node_id: String,
    pub deadline_ms: i64,
    /// The BMC: driver, address, systemId, insecureTls and the driver of each concern.
    #[schema(value_type = Object)]
    pub bmc: serde_json::Value,
    pub username: String,
    pub password: String,
    /// For `insert-virtual-media`: the profile's `iso` image (imageId, sha256, size, format), which the BMC fetches
    /// from the site agent by hash.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub media: Option<serde_json::Value>,
}

impl From<&bc_domain::agent::SiteStep> for SiteStepDto {
    fn from(s: &bc_domain::agent::SiteStep) -> Self {
        SiteStepDto {
            workflow_id: s.workflow_id.to_string(),
            index: s.index,
            attempt: s.attempt,
            action: bc_domain::workflow::action_name(s.action),
            node_id: s.node_id.to_string(),
            deadline_ms: s.deadline_ms,
            bmc: serde_json::to_value(&s.bmc).unwrap_or_default(),
            username: s.username.clone(),
            password: s.password.clone(),
            media: s.media.as_ref().map(|m| serde_json::to_value(m).unwrap_or_default()),
        }
    }
}

/// A step's report, recorded (or recorded before: the same report twice is recorded once).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepReportedDto {
    pub workflow_id: String,
    pub index: u32,
}

/// What a machine booting from the network boots, as the site agent asks for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BootAnswerDto {
    /// The enrolled machine the MAC or UUID belongs to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// The workflow the machine boots the ramdisk for; none: it boots from its own disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow_id: Option<String>,
    /// The single-use credential (`rbt_...`) the ramdisk claims its session with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_token: Option<String>,
}

impl From<&bc_domain::agent::BootAnswer> for BootAnswerDto {
    fn from(a: &bc_domain::agent::BootAnswer) -> Self {
        BootAnswerDto {
            node_id: a.node_id.as_ref().map(ToString::to_string),
            workflow_id: a.workflow_id.as_ref().map(ToString::to_string),
            boot_token: a.boot_token.clone(),
        }
    }
}

/// A ramdisk's session: a bearer credential (`rds_...`) for one workflow of one machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RamdiskSessionDto {
    pub workflow_id: String,
    pub node_id: String,
    pub token: String,
}

impl From<&bc_domain::agent::RamdiskSession> for RamdiskSessionDto {
    fn from(s: &bc_domain::agent::RamdiskSession) -> Self {
        RamdiskSessionDto {
            workflow_id: s.workflow_id.to_string(),
            node_id: s.node_id.to_string(),
            token: s.token.clone(),
        }
    }
}

/// Where a ramdisk's workflow is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RamdiskWorkDto {
    pub workflow_id: String,
    pub node_id: String,
    /// The workflow has ended: nothing more to do.
    pub ended: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<RamdiskStepDto>,
}

/// A running ramdisk step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RamdiskStepDto {
    pub index: u32,
    pub attempt: u32,
    /// `inspect`, `wipe-disks`, `write-image` or `write-config`.
    pub action: String,
    pub deadline_ms: i64,
    /// For `write-image`: imageId, sha256, size and format.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub image: Option<serde_json::Value>,
    /// For `write-config`: hostname, hostConfig, userData and the deployed agent's joinToken.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub config: Option<serde_json::Value>,
}

impl From<&bc_domain::agent::RamdiskWork> for RamdiskWorkDto {
    fn from(w: &bc_domain::agent::RamdiskWork) -> Self {
        RamdiskWorkDto {
            workflow_id: w.workflow_id.to_string(),
            node_id: w.node_id.to_string(),
            ended: w.ended,
            step: w.step.as_ref().map(|s| RamdiskStepDto {
                index: s.index,
                attempt: s.attempt,
                action: bc_domain::workflow::action_name(s.action),
                deadline_ms: s.deadline_ms,
                image: s.image.as_ref().map(|i| serde_json::to_value(i).unwrap_or_default()),
                config: s.config.as_ref().map(|c| serde_json::to_value(c).unwrap_or_default()),
            }),
        }
    }
}

/// An instance's boot image, as the node fetches it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceImageDto {
    pub image_id: String,
    /// Lowercase hex: the bytes fetched must hash to it.
    pub sha256: String,
    pub size: u64,
    /// `raw`, `qcow2` or `iso`.
    pub format: String,
}

/// An instance this node is to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentInstanceDto {
    pub instance_id: String,
    /// The reservation that holds its allocation: its release waits for the instance to be stopped.
    pub reservation_id: String,
    pub name: String,
    /// `running`, `stopped` or `deleted`.
    pub desired: String,
    /// The generation of `desired`, which a report names.
    pub generation: u64,
    /// What the node last reported: `pending`, `running`, `stopped`.
    pub state: String,
    pub sizes: crate::instances::InstanceSizesDto,
    /// The atoms of its allocation on this node.
    pub devices: Vec<String>,
    /// Absent when the image was deleted before the node fetched it.
    pub image: Option<InstanceImageDto>,
    /// Cloud-init user data for the guest; empty when none.
    pub user_data: String,
}

/// The instances this node is to run; any other instance it runs is to be stopped and removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentInstancesDto {
    pub instances: Vec<AgentInstanceDto>,
}

impl From<&[bc_domain::agent::AgentInstance]> for AgentInstancesDto {
    fn from(instances: &[bc_domain::agent::AgentInstance]) -> Self {
        let one = |i: &bc_domain::agent::AgentInstance| AgentInstanceDto {
            instance_id: i.instance_id.to_string(),
            reservation_id: i.reservation_id.to_string(),
            name: i.name.clone(),
            desired: i.desired.as_str().to_owned(),
            generation: i.generation,
            state: i.state.as_str().to_owned(),
            sizes: crate::instances::InstanceSizesDto {
                vcpu: i.sizes.vcpu,
                memory_gib: i.sizes.memory_gib,
                gpus: i.sizes.gpus,
                disk: i.sizes.disk,
            },
            devices: i.devices.iter().map(ToString::to_string).collect(),
            image: i.image.as_ref().map(|image| InstanceImageDto {
                image_id: image.image_id.to_string(),
                sha256: image.sha256.clone(),
                size: image.size,
                format: image.format.as_str().to_owned(),
            }),
            user_data: i.user_data.clone(),
        };
        AgentInstancesDto { instances: instances.iter().map(one).collect() }
    }
}
