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
        Deleted(SiteDeleted) = "site.deleted",
    }
}

/// A site without pools was deleted; its name is free again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SiteDeleted {
    pub site_id: SiteId,
    pub at_ms: i64,
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
        Deleted(ProjectDeleted) = "project.deleted",
    }
}

/// A project was deleted; its name is free again, and the reservations it grouped keep their history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProjectDeleted {
    pub project_id: ProjectId,
    pub at_ms: i64,
}

/// Checks a display name: 1 to 128 printable characters, not only spaces.
pub fn check_name(field: &'static str, name: &str) -> Result<(), crate::Rejection> {
    if name.trim().is_empty() || name.chars().count() > 128 || name.chars().any(char::is_control) {
        return Err(crate::Rejection::invalid(field, "must be 1 to 128 printable characters"));
    }
    Ok(())
}

/// A site as its events left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Site {
    #[serde(flatten)]
    pub created: SiteCreated,
    /// When it was deleted, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_at_ms: Option<i64>,
}

/// A project as its events left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Project {
    pub project_id: ProjectId,
    pub tenant_id: TenantId,
    pub name: String,
    pub at_ms: i64,
    /// When it was deleted, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_at_ms: Option<i64>,
}

/// Applies one event of a site's stream.
pub fn evolve_site(state: Option<Site>, event: &SiteEvent) -> Option<Site> {
    match (state, event) {
        (None, SiteEvent::Created(e)) => Some(Site { created: e.clone(), deleted_at_ms: None }),
        (Some(site), SiteEvent::Deleted(e)) if site.deleted_at_ms.is_none() => {
            Some(Site { deleted_at_ms: Some(e.at_ms), ..site })
        }
        (state, _) => state,
    }
}

/// Decides deleting a site: refused while it holds `pools` (delete them first); a deleted site is not found.
pub fn delete_site(
    site: Option<&Site>,
    pools: u64,
    now_ms: i64,
    id: &SiteId,
) -> Result<Vec<SiteEvent>, crate::Rejection> {
    let Some(site) = site.filter(|s| s.deleted_at_ms.is_none()) else {
        return Err(crate::Rejection::NotFound { kind: "site", id: id.to_string() });
    };
    if pools > 0 {
        return Err(crate::Rejection::Conflict(format!(
            "site {} holds {pools} pools: delete them first",
            site.created.site_id
        )));
    }
    Ok(vec![SiteEvent::Deleted(SiteDeleted { site_id: site.created.site_id.clone(), at_ms: now_ms })])
}

/// Applies one event of a project's stream.
pub fn evolve_project(state: Option<Project>, event: &ProjectEvent) -> Option<Project> {
    match (state, event) {
        (None, ProjectEvent::Created(e)) => Some(Project {
            project_id: e.project_id.clone(),
            tenant_id: e.tenant_id.clone(),
            name: e.name.clone(),
            at_ms: e.at_ms,
            deleted_at_ms: None,
        }),
        (Some(project), ProjectEvent::Deleted(e)) if project.deleted_at_ms.is_none() => {
            Some(Project { deleted_at_ms: Some(e.at_ms), ..project })
        }
        (state, _) => state,
    }
}

/// Decides deleting a project: refused while `live_reservations` of it have not ended (cancel or release them
/// first); a deleted project is not found.
pub fn delete_project(
    project: Option<&Project>,
    live_reservations: u64,
    now_ms: i64,
    id: &ProjectId,
) -> Result<Vec<ProjectEvent>, crate::Rejection> {
    let Some(project) = project.filter(|p| p.deleted_at_ms.is_none()) else {
        return Err(crate::Rejection::NotFound { kind: "project", id: id.to_string() });
    };
    if live_reservations > 0 {
        return Err(crate::Rejection::Conflict(format!(
            "project {} still groups {live_reservations} reservations that have not ended: cancel or release them first",
            project.project_id
        )));
    }
    Ok(vec![ProjectEvent::Deleted(ProjectDeleted { project_id: project.project_id.clone(), at_ms: now_ms })])
}

/// `sites.create` as the domain decides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateSite {
    pub site_id: SiteId,
    pub owner_tenant_id: TenantId,
    pub name: String,
    /// As the caller spelled it; checked against the region grammar here.
    pub iam_region: String,
    pub kind: SiteKind,
    pub now_ms: i64,
}

impl CreateSite {
    /// Checks the command's own fields, before any fact is read with them.
    pub fn check(&self) -> Result<IamRegion, crate::Rejection> {
        check_name("name", &self.name)?;
        self.iam_region
            .parse()
            .map_err(|err: crate::region::InvalidRegion| crate::Rejection::invalid("iamRegion", err.to_string()))
    }
}

/// Decides creating a site; `name_taken` says whether its owner already has a site of that name.
pub fn create_site(command: &CreateSite, name_taken: bool) -> Result<Vec<SiteEvent>, crate::Rejection> {
    let iam_region = command.check()?;
    if name_taken {
        return Err(crate::Rejection::Conflict(format!("a site named {:?} already exists", command.name)));
    }
    Ok(vec![SiteEvent::Created(SiteCreated {
        site_id: command.site_id.clone(),
        owner_tenant_id: command.owner_tenant_id.clone(),
        name: command.name.clone(),
        iam_region,
        kind: command.kind,
        at_ms: command.now_ms,
    })])
}

/// Decides creating a project; `name_taken` says whether its tenant already has a project of that name.
pub fn create_project(
    project_id: &ProjectId,
    tenant_id: &TenantId,
    name: &str,
    name_taken: bool,
    now_ms: i64,
) -> Result<Vec<ProjectEvent>, crate::Rejection> {
    check_name("name", name)?;
    if name_taken {
        return Err(crate::Rejection::Conflict(format!("a project named {name:?} already exists")));
    }
    Ok(vec![ProjectEvent::Created(ProjectCreated {
        project_id: project_id.clone(),
        tenant_id: tenant_id.clone(),
        name: name.to_owned(),
        at_ms: now_ms,
    })])
}

#[cfg(test)]
mod tests;
