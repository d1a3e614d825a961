//! Flavors: the shapes instances are made in. A flavor names how many vCPUs, GiB of memory, GPUs and GiB of disk
//! an instance of it holds; it never changes once created (an instance keeps the sizes it was made with), and it
//! is its tenant's, or every tenant's once the platform publishes it.

use serde::{Deserialize, Serialize};

use crate::Rejection;
use crate::domain_events;
use crate::id::{FlavorId, TenantId};
use crate::image::Visibility;

/// The largest sizes a flavor may name.
pub const MAX_VCPU: u32 = 4096;
pub const MAX_MEMORY_GIB: u32 = 65_536;
pub const MAX_GPUS: u32 = 64;
pub const MAX_DISK_GIB: u32 = 1_000_000;

/// What one instance of the flavor holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FlavorSizes {
    pub vcpu: u32,
    #[serde(rename = "memoryGiB")]
    pub memory_gib: u32,
    pub gpus: u32,
    /// GiB of the node's disk.
    pub disk: u32,
}

impl FlavorSizes {
    /// Checks each size against its bounds, naming the field.
    pub fn check(&self) -> Result<(), Rejection> {
        for (field, value, max) in [
            ("vcpu", self.vcpu, MAX_VCPU),
            ("memoryGiB", self.memory_gib, MAX_MEMORY_GIB),
            ("gpus", self.gpus, MAX_GPUS),
            ("disk", self.disk, MAX_DISK_GIB),
        ] {
            if value == 0 || value > max {
                return Err(Rejection::invalid(field, format!("must be from 1 to {max}")));
            }
        }
        Ok(())
    }

    /// The scalar amounts an allocation of this flavor holds on its node.
    pub fn scalars(&self) -> std::collections::BTreeMap<String, u64> {
        [("vcpu", self.vcpu), ("memoryGiB", self.memory_gib), ("disk", self.disk)]
            .into_iter()
            .map(|(resource, amount)| (resource.to_owned(), u64::from(amount)))
            .collect()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FlavorCreated {
    pub flavor_id: FlavorId,
    pub tenant_id: TenantId,
    pub name: String,
    pub sizes: FlavorSizes,
    pub visibility: Visibility,
    pub at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FlavorDeleted {
    pub flavor_id: FlavorId,
    pub at_ms: i64,
}

domain_events! {
    /// Events of a flavor's stream.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub enum FlavorEvent {
        Created(FlavorCreated) = "flavor.created",
        Deleted(FlavorDeleted) = "flavor.deleted",
    }
}

/// A flavor as its events left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Flavor {
    #[serde(flatten)]
    pub created: FlavorCreated,
    pub deleted_at_ms: Option<i64>,
}

pub fn evolve_flavor(state: Option<Flavor>, event: &FlavorEvent) -> Option<Flavor> {
    match (state, event) {
        (None, FlavorEvent::Created(e)) => Some(Flavor { created: e.clone(), deleted_at_ms: None }),
        (Some(flavor), FlavorEvent::Deleted(e)) => Some(Flavor { deleted_at_ms: Some(e.at_ms), ..flavor }),
        (state, _) => state,
    }
}

/// `flavors.create`: a flavor whose name is free in its tenant (`name_taken`).
pub fn create_flavor(
    flavor_id: &FlavorId,
    tenant_id: &TenantId,
    name: &str,
    sizes: FlavorSizes,
    visibility: Visibility,
    name_taken: bool,
    now_ms: i64,
) -> Result<Vec<FlavorEvent>, Rejection> {
    crate::site::check_name("name", name)?;
    sizes.check()?;
    if name_taken {
        return Err(Rejection::Conflict(format!("tenant {tenant_id} already has a flavor named {name:?}")));
    }
    Ok(vec![FlavorEvent::Created(FlavorCreated {
        flavor_id: flavor_id.clone(),
        tenant_id: tenant_id.clone(),
        name: name.to_owned(),
        sizes,
        visibility,
        at_ms: now_ms,
    })])
}

/// `flavors.delete`: a live flavor goes; instances made from it keep their sizes.
pub fn delete_flavor(flavor: Option<&Flavor>, id: &FlavorId, now_ms: i64) -> Result<Vec<FlavorEvent>, Rejection> {
    match flavor {
        Some(flavor) if flavor.deleted_at_ms.is_none() => {
            Ok(vec![FlavorEvent::Deleted(FlavorDeleted { flavor_id: flavor.created.flavor_id.clone(), at_ms: now_ms })])
        }
        _ => Err(Rejection::NotFound { kind: "flavor", id: id.to_string() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_893_456_000_000;

    fn sizes() -> FlavorSizes {
        FlavorSizes { vcpu: 16, memory_gib: 128, gpus: 1, disk: 200 }
    }

    #[test]
    fn a_flavor_is_checked_size_by_size_and_its_name_is_free_in_its_tenant() {
        let id: FlavorId = "flv_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("id");
        let tenant: TenantId = "acme".parse().expect("tenant");
        let events = create_flavor(&id, &tenant, "g1.large", sizes(), Visibility::Private, false, T0).expect("made");
        let flavor = events.iter().fold(None, evolve_flavor).expect("a flavor");
        assert_eq!(
            flavor.created.sizes.scalars(),
            [("disk".to_owned(), 200), ("memoryGiB".to_owned(), 128), ("vcpu".to_owned(), 16)].into()
        );
        for (bad, field) in [
            (FlavorSizes { vcpu: 0, ..sizes() }, "vcpu"),
            (FlavorSizes { memory_gib: MAX_MEMORY_GIB + 1, ..sizes() }, "memoryGiB"),
            (FlavorSizes { gpus: 0, ..sizes() }, "gpus"),
            (FlavorSizes { disk: 0, ..sizes() }, "disk"),
        ] {
            let err = create_flavor(&id, &tenant, "x", bad, Visibility::Private, false, T0).expect_err(field);
            assert!(matches!(&err, Rejection::InvalidArgument { field: f, .. } if f == field), "{err:?}");
        }
        let taken = create_flavor(&id, &tenant, "g1.large", sizes(), Visibility::Private, true, T0);
        assert!(matches!(taken, Err(Rejection::Conflict(m)) if m.contains("g1.large")));
        let deleted = delete_flavor(Some(&flavor), &id, T0 + 1).expect("deleted");
        let flavor = deleted.iter().fold(Some(flavor), evolve_flavor).expect("kept");
        assert!(matches!(delete_flavor(Some(&flavor), &id, T0 + 2), Err(Rejection::NotFound { .. })));
        assert!(matches!(delete_flavor(None, &id, T0 + 2), Err(Rejection::NotFound { kind: "flavor", .. })));
    }
}
