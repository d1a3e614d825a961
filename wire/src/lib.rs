//! The API's request and response types: one of each per resource, described by `ToSchema` for the OpenAPI
//! document. Domain types and persisted event payloads never go onto the wire themselves; each type here is
//! converted from (or into) the domain's by hand, so a change on either side is a compile error or a test
//! failure, never a silent change of the API.

pub mod agent;
pub mod audit;
pub mod explanations;
pub mod flavors;
pub mod fleet;
pub mod images;
pub mod instances;
pub mod ledger;
pub mod nodes;
pub mod ops;
pub mod profiles;
pub mod providers;
pub mod quotes;
pub mod reservations;
pub mod tenancy;
pub mod webhooks;
pub mod workflows;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The wire spelling of a domain enum: its serde name (`tenant-owned`, `bcd/v1`), which is the seeds'
/// spelling, so the two can never differ.
pub fn spelling<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(text)) => text,
        other => unreachable!("a unit enum serializes as a string, not {other:?}"),
    }
}

/// What a create answers: the new thing's id (with its position as `X-Position`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedDto {
    pub id: String,
}

/// Every error: `{"error": {"code", "message", "details"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// The error itself.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// `INVALID_ARGUMENT`, `UNAUTHENTICATED`, `FORBIDDEN`, `NOT_FOUND`, `CONFLICT`, `CAPACITY_UNAVAILABLE`,
    /// `QUOTA_EXCEEDED`, `QUOTE_STALE`, `IDEMPOTENCY_KEY_REUSED`, `NOT_YET_CONSISTENT`, `UNSUPPORTED_MEDIA_TYPE`,
    /// `UNAVAILABLE`, `INTERNAL_ERROR`.
    pub code: String,
    pub message: String,
    /// Such as `field`, naming what is wrong with the input.
    #[schema(value_type = Object)]
    pub details: serde_json::Value,
}

/// Declares the page type of a list: `{"items": [...], "nextCursor": "..." | null}`.
macro_rules! page {
    ($(#[$doc:meta])* $page:ident of $item:ty) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
        #[serde(rename_all = "camelCase")]
        pub struct $page {
            pub items: Vec<$item>,
            /// Pass as `?cursor=` for the next page; `null` on the last one.
            #[schema(required = true)]
            pub next_cursor: Option<String>,
        }
    };
}

page!(
    /// A page of sites.
    SitePage of fleet::SiteDto
);
page!(
    /// A page of images: the tenant's own and the public ones.
    ImagePage of images::ImageDto
);
page!(
    /// A page of profile versions.
    ProfilePage of profiles::ProfileDto
);
page!(
    /// A page of flavors: the tenant's own and the public ones.
    FlavorPage of flavors::FlavorDto
);
page!(
    /// A page of the tenant's instances.
    InstancePage of instances::InstanceDto
);
page!(
    /// A page of provider accounts.
    ProviderAccountPage of providers::ProviderAccountDto
);
page!(
    /// A page of webhook subscriptions, by id.
    WebhookPage of webhooks::WebhookDto
);
page!(
    /// A page of projects.
    ProjectPage of fleet::ProjectDto
);
page!(
    /// A page of pools.
    PoolPage of fleet::PoolDto
);
page!(
    /// A page of the audit trail, oldest first.
    AuditPage of fleet::AuditDto
);
page!(
    /// A page of a tenant's audit checkpoints, oldest first.
    CheckpointPage of audit::CheckpointDto
);
page!(
    /// A page of a pool's join tokens.
    JoinTokenPage of nodes::JoinTokenInfoDto
);
page!(
    /// A page of nodes.
    NodePage of nodes::NodeDto
);
page!(
    /// A page of reservations, in id order.
    ReservationPage of reservations::ReservationDto
);
page!(
    /// A page of a pool's devices, node by node.
    PoolDevicesPage of nodes::NodeDevicesDto
);
page!(
    /// A page of a tenant's identities.
    IdentityPage of tenancy::IdentityDto
);
page!(
    /// A page of a tenant's grants.
    GrantPage of tenancy::GrantDto
);
page!(
    /// A page of a pool's attribute limits.
    LimitPage of tenancy::LimitDto
);
