//! The site and project aggregates: given events, when a create, then events or a rejection.

use super::*;
use crate::Rejection;
use crate::testing::{Projects, Sites, given};

const T0: i64 = 1_893_456_000_000;

fn command(name: &str, region: &str) -> CreateSite {
    CreateSite {
        site_id: "site_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("site"),
        owner_tenant_id: "root".parse().expect("tenant"),
        name: name.into(),
        iam_region: region.into(),
        kind: SiteKind::Shared,
        now_ms: T0,
    }
}

#[test]
fn a_site_is_created_once_under_a_free_name_in_a_valid_region() {
    let create = command("fra1", "eu-central-1");
    let expected = SiteEvent::Created(SiteCreated {
        site_id: create.site_id.clone(),
        owner_tenant_id: create.owner_tenant_id.clone(),
        name: "fra1".into(),
        iam_region: "eu-central-1".parse().expect("region"),
        kind: SiteKind::Shared,
        at_ms: T0,
    });
    let site = given::<Sites>([]).when(|_| create_site(&create, false)).then([expected.clone()]).expect("a site");
    assert_eq!(site.created.name, "fra1");
    given::<Sites>([])
        .when(|_| create_site(&create, true))
        .then_rejected(|r| matches!(r, Rejection::Conflict(m) if m.contains("fra1")));
    given::<Sites>([])
        .when(|_| create_site(&command("fra1", "Mars"), false))
        .then_rejected(|r| matches!(r, Rejection::InvalidArgument { field, .. } if field == "iamRegion"));
    given::<Sites>([])
        .when(|_| create_site(&command(" ", "eu-central-1"), false))
        .then_rejected(|r| matches!(r, Rejection::InvalidArgument { field, .. } if field == "name"));
    // A second created event (which no command decides) does not replace the site.
    let again = given::<Sites>([expected.clone(), expected]).state().cloned().expect("a site");
    assert_eq!(again, site);
}

#[test]
fn a_project_is_created_under_a_free_name_of_its_tenant() {
    let id: ProjectId = "prj_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("project");
    let tenant: TenantId = "acme".parse().expect("tenant");
    let project = given::<Projects>([])
        .when(|_| create_project(&id, &tenant, "research", false, T0))
        .then([ProjectEvent::Created(ProjectCreated {
            project_id: id.clone(),
            tenant_id: tenant.clone(),
            name: "research".into(),
            at_ms: T0,
        })])
        .expect("a project");
    assert_eq!(project.tenant_id, tenant);
    given::<Projects>([])
        .when(|_| create_project(&id, &tenant, "research", true, T0))
        .then_rejected(|r| matches!(r, Rejection::Conflict(_)));
}

#[test]
fn a_project_is_deleted_once_its_reservations_have_ended() {
    let id: ProjectId = "prj_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("project");
    let tenant: TenantId = "acme".parse().expect("tenant");
    let created = ProjectEvent::Created(ProjectCreated {
        project_id: id.clone(),
        tenant_id: tenant,
        name: "research".into(),
        at_ms: T0,
    });
    given::<Projects>([created.clone()])
        .when(|p| delete_project(p, 2, T0 + 1, &id))
        .then_rejected(|r| matches!(r, Rejection::Conflict(m) if m.contains("2 reservations")));
    let deleted = ProjectEvent::Deleted(ProjectDeleted { project_id: id.clone(), at_ms: T0 + 1 });
    let project = given::<Projects>([created.clone()])
        .when(|p| delete_project(p, 0, T0 + 1, &id))
        .then([deleted.clone()])
        .expect("still folded");
    assert_eq!(project.deleted_at_ms, Some(T0 + 1));
    given::<Projects>([created, deleted])
        .when(|p| delete_project(p, 0, T0 + 2, &id))
        .then_rejected(|r| matches!(r, Rejection::NotFound { kind: "project", .. }));
    given::<Projects>([])
        .when(|p| delete_project(p, 0, T0, &id))
        .then_rejected(|r| matches!(r, Rejection::NotFound { .. }));
}

#[test]
fn a_site_is_deleted_only_without_pools() {
    let id: SiteId = "site_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("site");
    let created = SiteEvent::Created(SiteCreated {
        site_id: id.clone(),
        owner_tenant_id: "root".parse().expect("tenant"),
        name: "fra1".into(),
        iam_region: "eu-central-1".parse().expect("region"),
        kind: SiteKind::Shared,
        at_ms: T0,
    });
    given::<Sites>([created.clone()])
        .when(|s| delete_site(s, 1, T0 + 1, &id))
        .then_rejected(|r| matches!(r, Rejection::Conflict(m) if m.contains("1 pools")));
    let deleted = SiteEvent::Deleted(SiteDeleted { site_id: id.clone(), at_ms: T0 + 1 });
    let site = given::<Sites>([created.clone()])
        .when(|s| delete_site(s, 0, T0 + 1, &id))
        .then([deleted.clone()])
        .expect("folded");
    assert_eq!(site.deleted_at_ms, Some(T0 + 1));
    given::<Sites>([created, deleted])
        .when(|s| delete_site(s, 0, T0 + 2, &id))
        .then_rejected(|r| matches!(r, Rejection::NotFound { kind: "site", .. }));
}
