//! Sites (boot and failure domains, each in one region) and projects (application-owned groupings inside a
//! tenant), with their events.

use serde::{Deserialize, Serialize};

use crate::domain_events;
use crate::id::{ProjectId, SiteId, TenantId};
use crate::region::IamRegion;

/// Whose hardware a site holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SiteKind {
    /// The platform's hardware, shared between tenants.
    Shared,
    /// The platform's hardware, dedicated to one tenant.
    Dedicated,
    /// A tenant's own hardware.
    Custom,
}

impl SiteKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SiteKind::Shared => "shared",
            SiteKind::Dedicated => "dedicated",
            SiteKind::Custom => "custom",
        }
    }
}

/// A site as created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SiteCreated {
    pub site_id: SiteId,
    pub owner_tenant_id: TenantId,
    pub name: String,
    /// The region, in Better IAM's region-name grammar.
    pub iam_region: IamRegion,
    pub kind: SiteKind,
    pub at_ms: i64,
}

domain_events! {
    /// Events of a site's stream.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub enum SiteEvent {
        /// Version 2: the region is `iamRegion` (version 1 called it `region`).
        Created(SiteCreated) = "site.created" @ 2,
    }
}

/// A project as created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProjectCreated {
    pub project_id: ProjectId,
    pub tenant_id: TenantId,
    pub name: String,
    pub at_ms: i64,
}

domain_events! {
    /// Events of a project's stream.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub enum ProjectEvent {
        Created(ProjectCreated) = "project.created",
    }
}

/// Checks a display name: 1 to 128 printable characters, not only spaces.
pub fn check_name(field: &'static str, name: &str) -> Result<(), crate::Rejection> {
    if name.trim().is_empty() || name.chars().count() > 128 || name.chars().any(char::is_control) {
        return Err(crate::Rejection::invalid(field, "must be 1 to 128 printable characters"));
    }
    Ok(())
}
