//! Instances.

#[cfg(feature = "server")]
use bc_commands::instances::MadeInstance;
use bc_domain::instance::{DesiredState, Instance};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::reservations::ReservationDto;

/// The body of `POST /v1/instances`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstanceBody {
    /// 1 to 128 printable characters.
    #[schema(example = "trainer-1")]
    pub name: String,
    /// A `vps-host` pool.
    pub pool_id: String,
    /// A flavor the tenant may use (`flv_...`): its vCPUs, memory, GPUs and disk.
    pub flavor_id: String,
    /// An image the tenant may use (`img_...`): its own, or a public one.
    pub image_id: String,
    pub project_id: Option<String>,
    /// Given to the guest as cloud-init user data: at most 16 KiB.
    #[serde(default)]
    pub user_data: String,
    /// How long its allocation holds, in whole seconds, 1 to 31622400 (366 days).
    #[schema(minimum = 1, maximum = 31_622_400)]
    pub duration: u64,
    /// `running` (the default) or `stopped`.
    #[serde(default)]
    #[schema(value_type = Option<String>, example = "running")]
    pub desired_state: Option<DesiredState>,
}

/// An instance's sizes, as its flavor gave them when it was made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceSizesDto {
    pub vcpu: u32,
    #[serde(rename = "memoryGiB")]
    pub memory_gib: u32,
    pub gpus: u32,
    pub disk: u32,
}

/// An instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceDto {
    pub id: String,
    pub tenant_id: String,
    pub identity: String,
    pub name: String,
    pub pool_id: String,
    pub project_id: Option<String>,
    pub flavor_id: String,
    pub sizes: InstanceSizesDto,
    pub image_id: String,
    pub image_verified: bool,
    /// The `binding: instance` reservation that holds its allocation.
    pub reservation_id: String,
    /// `running`, `stopped` or `deleted`: what its owner wants.
    pub desired_state: String,
    /// Counts the changes of `desiredState`.
    pub generation: u64,
    /// `pending`, `running`, `stopped`, `deleted` or `failed`: what its node last reported (`deleted` and
    /// `failed` also when its allocation ended).
    pub state: String,
    /// The generation its node last acted on.
    pub observed_generation: u64,
    /// Where it runs, once its node reported it.
    pub node_id: Option<String>,
    pub message: Option<String>,
    pub created_at: i64,
    /// Events folded so far.
    pub version: u32,
}

impl From<&Instance> for InstanceDto {
    fn from(i: &Instance) -> Self {
        let created = &i.created;
        let spec = &created.spec;
        InstanceDto {
            id: created.instance_id.to_string(),
            tenant_id: created.tenant_id.to_string(),
            identity: created.identity.to_string(),
            name: spec.name.clone(),
            pool_id: spec.pool_id.to_string(),
            project_id: spec.project_id.as_ref().map(ToString::to_string),
            flavor_id: spec.flavor_id.to_string(),
            sizes: InstanceSizesDto {
                vcpu: spec.sizes.vcpu,
                memory_gib: spec.sizes.memory_gib,
                gpus: spec.sizes.gpus,
                disk: spec.sizes.disk,
            },
            image_id: spec.image_id.to_string(),
            image_verified: created.image_verified,
            reservation_id: created.reservation_id.to_string(),
            desired_state: i.desired.as_str().to_owned(),
            generation: i.generation,
            state: i.state.as_str().to_owned(),
            observed_generation: i.observed_generation,
            node_id: i.node_id.as_ref().map(ToString::to_string),
            message: i.message.clone(),
            created_at: created.at_ms,
            version: i.version,
        }
    }
}

/// What `POST /v1/instances` answers: the instance and the reservation that holds its allocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MadeInstanceDto {
    pub instance: InstanceDto,
    pub reservation: ReservationDto,
}

#[cfg(feature = "server")]
impl From<&MadeInstance> for MadeInstanceDto {
    fn from(made: &MadeInstance) -> Self {
        MadeInstanceDto { instance: (&made.instance).into(), reservation: (&made.reservation).into() }
    }
}
