//! Flavors.

#[cfg(feature = "server")]
use bc_commands::flavors::FlavorView;
use bc_domain::image::Visibility;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The body of `POST /v1/flavors`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FlavorBody {
    /// Unique in the tenant: 1 to 128 printable characters.
    #[schema(example = "g1.h100.large")]
    pub name: String,
    /// Logical CPUs, 1 to 4096.
    #[schema(minimum = 1, maximum = 4096)]
    pub vcpu: u32,
    /// GiB of memory, 1 to 65536.
    #[serde(rename = "memoryGiB")]
    #[schema(minimum = 1, maximum = 65536)]
    pub memory_gib: u32,
    /// GPUs (atoms of the pool the instance is made in), 1 to 64.
    #[schema(minimum = 1, maximum = 64)]
    pub gpus: u32,
    /// GiB of the node's disk, 1 to 1000000.
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub disk: u32,
    /// `private` (the default: the tenant's own) or `public` (every tenant's; needs `flavors.publish`).
    #[serde(default)]
    #[schema(value_type = Option<String>, example = "private")]
    pub visibility: Option<Visibility>,
}

/// A flavor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlavorDto {
    pub id: String,
    pub tenant_id: String,
    pub name: String,
    pub vcpu: u32,
    #[serde(rename = "memoryGiB")]
    pub memory_gib: u32,
    pub gpus: u32,
    pub disk: u32,
    /// `private` or `public`.
    pub visibility: String,
    pub created_at: i64,
}

#[cfg(feature = "server")]
impl From<&FlavorView> for FlavorDto {
    fn from(f: &FlavorView) -> Self {
        FlavorDto {
            id: f.id.to_string(),
            tenant_id: f.tenant_id.to_string(),
            name: f.name.clone(),
            vcpu: f.sizes.vcpu,
            memory_gib: f.sizes.memory_gib,
            gpus: f.sizes.gpus,
            disk: f.sizes.disk,
            visibility: f.visibility.as_str().to_owned(),
            created_at: f.created_at_ms,
        }
    }
}
