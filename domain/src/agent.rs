//! The protocol between `bcd` and the control plane: the bodies of the `/v1/agent/*` routes. Both sides use
//! these types, so the agent links only this crate.
//!
//! A machine joins once with a join token (`jt_...`) and receives a node credential (`nc_...`); every later
//! call carries that credential, which names the node, so no body ever says which node it speaks for.

use serde::{Deserialize, Serialize};

use crate::id::{AllocationId, CommandId, DeviceId, NodeId, ReservationId, SessionId};
use crate::inventory::{InventoryReport, Section, SectionHashes};
use crate::node::NodeSpec;

/// The prefix of join tokens.
pub const JOIN_TOKEN_PREFIX: &str = "jt_";
/// The prefix of node credentials.
pub const CREDENTIAL_PREFIX: &str = "nc_";

/// `POST /v1/agent/join`: a machine asks to join the pool its token is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JoinRequest {
    pub join_token: String,
    pub agent_version: String,
    /// The whole inventory (every section).
    pub inventory: InventoryReport,
    /// A certificate signing request (PEM) for the node's own key: where the control plane has a PKI, the join
    /// answers a certificate for it, and the node speaks mutual TLS with it from then on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csr: Option<String>,
    /// `host` (the default: a machine whose GPUs the pool books) or `site` (the site agent, `bcd site`: it
    /// runs the site's BMC calls and serves its boot path; none of its devices are booked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<crate::node::Role>,
}

/// `GET /v1/agent/site/steps`: what a site agent should run now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SiteWork {
    /// Whether this agent serves its site now (it holds `site:<id>:boot`); a standby gets no steps.
    pub serving: bool,
    pub steps: Vec<SiteStep>,
}

/// A running step of a machine's workflow that the site runs: a call to the machine's BMC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SiteStep {
    pub workflow_id: crate::id::WorkflowId,
    pub index: u32,
    pub attempt: u32,
    pub action: crate::profile::StepAction,
    pub node_id: NodeId,
    /// When the attempt runs out of time.
    pub deadline_ms: i64,
    pub bmc: crate::node::NodeBmc,
    pub username: String,
    pub password: String,
    /// For `insert-virtual-media`: the profile's `iso` image, which the BMC fetches from the site agent by hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media: Option<ImageToWrite>,
}

/// `POST /v1/agent/site/steps/{workflow}/{index}`: how an attempt of a site step ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepReport {
    pub attempt: u32,
    pub ok: bool,
    /// What was done, or what went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The machine's power as the BMC reported it after the step, when the site agent read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<crate::node::Power>,
}

/// What a join answers: the node, its credential (shown once), and a first session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Joined {
    pub node_id: NodeId,
    pub credential: String,
    /// True when the machine was recognised as a node that already existed.
    pub rejoined: bool,
    pub session: Session,
    /// The node's certificate (PEM), signed by the control plane's CA for the join's request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<String>,
}

/// `POST /v1/agent/certificate`: a node asks for its next certificate, before the current one expires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CertificateRequest {
    /// A certificate signing request (PEM) for the key the node will use.
    pub csr: String,
}

/// A certificate the control plane's CA signed for a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCertificate {
    pub node_id: NodeId,
    /// PEM.
    pub certificate: String,
    /// Its serial number, lowercase hex.
    pub serial: String,
    /// When it expires, in seconds since the epoch.
    pub not_after: i64,
}

/// `POST /v1/agent/sessions`: an agent (re)starting with its credential opens a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionRequest {
    pub agent_version: String,
}

/// A session and how to keep it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Session {
    pub session_id: SessionId,
    pub node_id: NodeId,
    /// How often to heartbeat.
    pub heartbeat_ms: u64,
    /// The liveness lease each heartbeat renews.
    pub lease_ms: u64,
    /// The node's desired state and its generation.
    pub generation: u64,
    pub spec: NodeSpec,
    /// The section hashes of the inventory the control plane holds.
    pub inventory_hashes: SectionHashes,
}

/// `POST /v1/agent/heartbeat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Heartbeat {
    pub session_id: SessionId,
    /// The last NodeSpec generation the agent applied.
    pub observed_generation: u64,
    /// The agent's wall clock, epoch milliseconds, when it sent the heartbeat.
    pub clock_ms: i64,
    /// Each GPU's utilization as NVML sampled it just before the heartbeat, where the agent can read it (older
    /// agents, and machines without NVML, send none). The GPU-hour ledger shows their hourly means.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_utilization: Vec<GpuSample>,
}

/// One GPU's utilization: the percent of the last sample period in which a kernel ran on it (NVML's
/// `utilization.gpu`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuSample {
    /// The GPU's UUID, as its inventory names it.
    pub gpu: DeviceId,
    /// 0 to 100.
    pub percent: u32,
}

/// The most GPUs one heartbeat may sample.
pub const MAX_GPU_SAMPLES: usize = 64;

/// Checks a heartbeat's samples: at most [`MAX_GPU_SAMPLES`], each GPU once (a MIG slice or slot is sampled as its
/// GPU), each percent at most 100. A refusal names the sample at fault.
pub fn check_gpu_samples(samples: &[GpuSample]) -> Result<(), crate::Rejection> {
    if samples.len() > MAX_GPU_SAMPLES {
        return Err(crate::Rejection::invalid("gpuUtilization", format!("at most {MAX_GPU_SAMPLES} GPUs")));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, sample) in samples.iter().enumerate() {
        if sample.gpu.as_str().contains('/') {
            return Err(crate::Rejection::invalid(format!("gpuUtilization[{i}].gpu"), "must be a GPU's UUID"));
        }
        if !seen.insert(sample.gpu.as_str()) {
            return Err(crate::Rejection::invalid(format!("gpuUtilization[{i}].gpu"), "is sampled twice"));
        }
        if sample.percent > 100 {
            return Err(crate::Rejection::invalid(format!("gpuUtilization[{i}].percent"), "must be from 0 to 100"));
        }
    }
    Ok(())
}

/// What a heartbeat answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatReply {
    /// When the liveness lease now runs out, epoch milliseconds (the control plane's clock).
    pub lease_expires_ms: i64,
    pub generation: u64,
    /// The spec, when `generation` is newer than what the agent observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<NodeSpec>,
    /// Whether commands wait for the agent.
    pub commands_waiting: bool,
}

/// `POST /v1/agent/inventory`: every section's hash, and the sections the control plane lacks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InventoryAccepted {
    /// The snapshot now current (unchanged when nothing changed).
    pub snapshot: u64,
    pub changed: Vec<Section>,
    pub hashes: SectionHashes,
}

/// What a command asks the agent to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", rename_all_fields = "camelCase")]
pub enum CommandKind {
    /// Hand a reservation's booked devices on this node over: write their CDI spec.
    Bind { reservation_id: ReservationId, allocation_id: AllocationId, devices: Vec<DeviceId> },
    /// Take them back: remove the CDI spec.
    Unbind { reservation_id: ReservationId, allocation_id: AllocationId, devices: Vec<DeviceId> },
    /// Read the machine again and report the inventory.
    RefreshInventory,
    /// Do nothing but acknowledge: an operator's check that the node's command path works.
    Probe {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
}

impl CommandKind {
    /// The kind's name, as the `kind` field spells it.
    pub fn name(&self) -> &'static str {
        match self {
            CommandKind::Bind { .. } => "bind",
            CommandKind::Unbind { .. } => "unbind",
            CommandKind::RefreshInventory => "refresh-inventory",
            CommandKind::Probe { .. } => "probe",
        }
    }
}

/// One command as delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCommand {
    pub id: CommandId,
    pub seq: u64,
    #[serde(flatten)]
    pub kind: CommandKind,
}

/// `GET /v1/agent/commands`: the commands deliverable now, in `seq` order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Commands {
    pub commands: Vec<AgentCommand>,
}

/// `POST /v1/agent/commands/{id}/ack`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ack {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// An instance a node is to run, as `GET /v1/agent/instances` lists it: every instance whose allocation on the
/// node has begun and that is not over. An instance the agent runs that the list no longer holds is to be
/// stopped and removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentInstance {
    pub instance_id: crate::id::InstanceId,
    /// The reservation that holds its allocation: its release waits for the instance to be stopped.
    pub reservation_id: ReservationId,
    pub name: String,
    pub desired: crate::instance::DesiredState,
    /// The generation of `desired`, which a report names.
    pub generation: u64,
    /// What the node last reported.
    pub state: crate::instance::InstanceState,
    pub sizes: crate::flavor::FlavorSizes,
    /// The atoms of its allocation on this node (`<node>/gpu<i>`, ...).
    pub devices: Vec<DeviceId>,
    /// Its boot disk's image, fetched from `GET /v1/agent/instances/{id}/image`; `None` when the image was deleted
    /// before the node fetched it.
    pub image: Option<ImageToWrite>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub user_data: String,
}

/// The body of `GET /v1/agent/instances`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentInstances {
    pub instances: Vec<AgentInstance>,
}

/// `POST /v1/agent/instances/{id}/state`: what the node did with an instance, for the generation it acted on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstanceStateReport {
    /// `running`, `stopped`, `deleted` or `failed`.
    pub state: crate::instance::InstanceState,
    pub generation: u64,
    /// Why, for a failure: at most 4096 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_travels_with_its_kind_flattened() {
        let command = AgentCommand {
            id: "cmd_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("id"),
            seq: 3,
            kind: CommandKind::Bind {
                reservation_id: ReservationId::derive(
                    &"acme".parse().expect("tenant"),
                    &"alice".parse().expect("identity"),
                    "k",
                ),
                allocation_id: "alloc_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("alloc"),
                devices: vec!["GPU-a".parse().expect("device")],
            },
        };
        let json = serde_json::to_value(&command).expect("json");
        assert_eq!(json["kind"], "bind");
        assert_eq!(json["seq"], 3);
        assert_eq!(json["devices"][0], "GPU-a");
        assert!(json["allocationId"].is_string());
        let back: AgentCommand = serde_json::from_value(json).expect("back");
        assert_eq!(back, command);
        let probe: AgentCommand =
            serde_json::from_str(r#"{"id":"cmd_01jd8w2k3m4n5p6q7r8s9t0v1w","seq":1,"kind":"probe"}"#).expect("probe");
        assert_eq!(probe.kind, CommandKind::Probe { note: None });
    }

    #[test]
    fn an_old_agents_heartbeat_has_no_samples_and_bad_samples_are_refused_naming_them() {
        let old: Heartbeat = serde_json::from_str(
            r#"{"sessionId":"ses_00000000000000000000000000","observedGeneration":1,"clockMs":5}"#,
        )
        .expect("a heartbeat without samples");
        assert!(old.gpu_utilization.is_empty());
        assert!(!serde_json::to_string(&old).expect("json").contains("gpuUtilization"), "left out when empty");
        let sample = |gpu: &str, percent| GpuSample { gpu: gpu.parse().expect("gpu"), percent };
        assert_eq!(check_gpu_samples(&[sample("GPU-a", 0), sample("GPU-b", 100)]), Ok(()));
        let field = |samples: &[GpuSample]| match check_gpu_samples(samples) {
            Err(crate::Rejection::InvalidArgument { field, .. }) => field,
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert_eq!(field(&[sample("GPU-a", 101)]), "gpuUtilization[0].percent");
        assert_eq!(field(&[sample("GPU-a", 5), sample("GPU-a", 6)]), "gpuUtilization[1].gpu");
        assert_eq!(field(&[sample("GPU-a/gi1/ci0", 5)]), "gpuUtilization[0].gpu");
        let many: Vec<GpuSample> = (0..=MAX_GPU_SAMPLES).map(|g| sample(&format!("GPU-{g}"), 1)).collect();
        assert_eq!(field(&many), "gpuUtilization");
    }
}

/// `GET /v1/agent/site/boot?mac=&uuid=`: what a machine of the site that boots from the network should boot,
/// as the site agent asks on the machine's behalf.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootAnswer {
    /// The enrolled machine the address belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<NodeId>,
    /// The running workflow whose ramdisk steps the machine boots for; none: it boots from its own disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_id: Option<crate::id::WorkflowId>,
    /// The single-use credential the ramdisk claims its session with (`rbt_...`), for the workflow only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_token: Option<String>,
}

/// `POST /v1/ramdisk/sessions`: a ramdisk claims its session with the boot credential it was started with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RamdiskClaim {
    pub boot_token: String,
}

/// The session a claim answers: a bearer credential (`rds_...`) for one workflow of one machine, valid until
/// that workflow ends or a later boot of the machine claims another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RamdiskSession {
    pub workflow_id: crate::id::WorkflowId,
    pub node_id: NodeId,
    pub token: String,
}

/// `GET /v1/ramdisk/work`: where the ramdisk's workflow is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RamdiskWork {
    pub workflow_id: crate::id::WorkflowId,
    pub node_id: NodeId,
    /// The workflow has ended: the ramdisk has nothing more to do.
    pub ended: bool,
    /// The running `ramdisk` step, if the workflow is at one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<RamdiskStep>,
}

/// A running step for the ramdisk, with what it needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RamdiskStep {
    pub index: u32,
    pub attempt: u32,
    pub action: crate::profile::StepAction,
    pub deadline_ms: i64,
    /// For `write-image`: the image to write, fetched from the site agent by its hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageToWrite>,
    /// For `write-config`: what the deployed machine starts with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<DeployedConfig>,
}

/// An image a ramdisk writes to the machine's disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageToWrite {
    pub image_id: crate::id::ImageId,
    /// Lowercase hex; the bytes written must hash to it.
    pub sha256: String,
    pub size: u64,
    pub format: crate::image::ImageFormat,
}

/// The configuration a deployed machine starts with: its host configuration, the profile's user data, and
/// how its `bcd` joins (a single-use join token for the machine's pool).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeployedConfig {
    pub hostname: String,
    #[serde(default)]
    pub host_config: std::collections::BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    pub join_token: String,
}

/// `POST /v1/ramdisk/steps/{index}`: how an attempt of a ramdisk step ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RamdiskReport {
    pub attempt: u32,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// For `inspect`: the machine's whole inventory (every section), as `bcd` reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inventory: Option<InventoryReport>,
}
