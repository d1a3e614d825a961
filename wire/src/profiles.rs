//! Profiles on the wire.

use std::collections::BTreeMap;

#[cfg(feature = "server")]
use bc_commands::profiles::ProfileView;
use bc_domain::profile::{Await, Concern, ProfileSpec, ProfileTarget, RunsOn, StepAction, StepSpec};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One step of a profile's workflow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepDto {
    /// Unique in the profile: 1 to 64 of a-z, 0-9 and `-`.
    pub name: String,
    /// `power-on`, `power-off`, `power-reset`, `boot-from-network`, `boot-from-disk`, `boot-from-virtual-media`,
    /// `insert-virtual-media`, `eject-virtual-media` (on the site), `inspect`, `wipe-disks`, `write-image`,
    /// `write-config` (in the ramdisk), `run-acceptance` (on the node), `await-join` (the control plane).
    #[schema(value_type = String)]
    pub action: StepAction,
    /// `control-plane`, `site`, `node` or `ramdisk`: where the action runs (its own place when absent).
    #[schema(value_type = Option<String>)]
    #[serde(default)]
    pub runs_on: Option<RunsOn>,
    /// Seconds one attempt may take, 1 to 86,400 (600 by default).
    #[serde(default)]
    pub timeout_s: Option<u32>,
    /// Attempts in all, 1 to 10 (1 by default: no retry).
    #[serde(default)]
    pub attempts: Option<u32>,
    /// `rejoin`: the step ends the agent's boot, and the workflow waits for it to come back.
    #[schema(value_type = Option<String>)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for: Option<Await>,
}

impl From<&StepSpec> for StepDto {
    fn from(step: &StepSpec) -> Self {
        StepDto {
            name: step.name.clone(),
            action: step.action,
            runs_on: Some(step.runs_on),
            timeout_s: Some(step.timeout_s),
            attempts: Some(step.attempts),
            wait_for: step.wait_for,
        }
    }
}

/// The body of `POST /v1/profiles`: the next version of the profile `name`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileBody {
    /// 1 to 64 of a-z, 0-9 and `-`: the name every version of the profile shares.
    pub name: String,
    /// `metal` or `vps`.
    #[schema(value_type = String)]
    pub target: ProfileTarget,
    /// The driver carrying each concern (`power`, `management`, `boot`, `deploy`, `inspect`, `console`,
    /// `virtual-media`, `bios`, `raid`, `firmware`, `config`, `runtime`): `redfish`, `ipmi` or `bcd`.
    #[schema(value_type = BTreeMap<String, String>)]
    #[serde(default)]
    pub drivers: BTreeMap<Concern, String>,
    /// The image deployed (a `metal` profile needs one): the tenant's own or a public one.
    #[serde(default)]
    pub image_id: Option<String>,
    /// Deploy the image even when no allowed signer verified it.
    #[serde(default)]
    pub allow_unverified_image: bool,
    /// Handed to the deployed machine, up to 32 KiB.
    #[serde(default)]
    pub user_data: Option<String>,
    #[serde(default)]
    pub steps: Vec<StepDto>,
    /// Host configuration (such as `hostname`), up to 64 entries.
    #[serde(default)]
    pub host_config: BTreeMap<String, String>,
    /// Acceptance checks the deployed machine must pass (`gpu-count=8`, `min-gpu-memory-mib=...`,
    /// `driver-prefix=...`, `trusted-hardware-key`).
    #[serde(default)]
    pub acceptance: Vec<String>,
}

/// The default time an attempt of a step may take.
pub const DEFAULT_STEP_TIMEOUT_S: u32 = 600;

impl ProfileBody {
    /// The profile's content, the steps' defaults filled in; the image id checked.
    pub fn spec(&self) -> Result<ProfileSpec, (String, String)> {
        let image_id = match &self.image_id {
            Some(text) => {
                Some(text.parse().map_err(|err: bc_domain::id::IdError| ("imageId".to_owned(), err.to_string()))?)
            }
            None => None,
        };
        Ok(ProfileSpec {
            target: self.target,
            drivers: self.drivers.clone(),
            image_id,
            allow_unverified_image: self.allow_unverified_image,
            user_data: self.user_data.clone(),
            steps: self
                .steps
                .iter()
                .map(|step| StepSpec {
                    name: step.name.clone(),
                    action: step.action,
                    runs_on: step.runs_on.unwrap_or(step.action.runs_on()),
                    timeout_s: step.timeout_s.unwrap_or(DEFAULT_STEP_TIMEOUT_S),
                    attempts: step.attempts.unwrap_or(1),
                    wait_for: step.wait_for,
                })
                .collect(),
            host_config: self.host_config.clone(),
            acceptance: self.acceptance.clone(),
        })
    }
}

/// A profile version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProfileDto {
    pub id: String,
    pub tenant_id: String,
    pub name: String,
    /// 1, 2, ...: each change of a profile is a new version, and a version never changes.
    pub version: u32,
    /// `metal` or `vps`.
    pub target: String,
    #[schema(value_type = BTreeMap<String, String>)]
    pub drivers: BTreeMap<Concern, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    pub allow_unverified_image: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    pub steps: Vec<StepDto>,
    pub host_config: BTreeMap<String, String>,
    pub acceptance: Vec<String>,
    pub created_at: i64,
}

#[cfg(feature = "server")]
impl From<&ProfileView> for ProfileDto {
    fn from(p: &ProfileView) -> Self {
        let spec = &p.spec;
        ProfileDto {
            id: p.id.to_string(),
            tenant_id: p.tenant_id.to_string(),
            name: p.name.clone(),
            version: p.version,
            target: match spec.target {
                ProfileTarget::Metal => "metal".to_owned(),
                ProfileTarget::Vps => "vps".to_owned(),
            },
            drivers: spec.drivers.clone(),
            image_id: spec.image_id.as_ref().map(ToString::to_string),
            allow_unverified_image: spec.allow_unverified_image,
            user_data: spec.user_data.clone(),
            steps: spec.steps.iter().map(Into::into).collect(),
            host_config: spec.host_config.clone(),
            acceptance: spec.acceptance.clone(),
            created_at: p.created_at_ms,
        }
    }
}
