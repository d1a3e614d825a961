//! What the door decides a call on, shared by the door and the commands that decide it in their own transaction
//! (on the facts they read anyway): the call, the subject it names, and a reservation's draft.

use std::collections::BTreeMap;

use bc_domain::id::{
    ImageId, InstanceId, NodeId, PoolId, ProfileId, ProviderAccountId, ReservationId, SiteId, TenantId, WorkflowId,
};
use bc_domain::reservation::ReservationRequest;

use crate::Caller;
use crate::auth::{Attribute, PoolFacts, Principal, Resource, Target};

/// A call from outside: who it speaks for, as the authorizer authenticated it, and the request's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub principal: Principal,
    pub request_id: String,
}

impl Call {
    /// The caller a command runs as, had it been allowed (tools that decide for themselves use this).
    pub(crate) fn caller(&self) -> Caller {
        self.principal.caller(&self.request_id)
    }
}

/// What a method is decided on, as the call names it; the door resolves it from the tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject<'a> {
    /// The caller's own tenant scope (`compute-tenant/{t}`), for methods on a whole scope.
    OwnTenant,
    /// The platform's fleet (`compute-fleet/global`), which resolves only in the root tenant.
    Fleet,
    /// A tenant's scope (`compute-tenant/{t}`), for administering it: it resolves when the tenant exists.
    Tenant(&'a TenantId),
    Site(&'a SiteId),
    Pool(&'a PoolId),
    Node(&'a NodeId),
    Reservation(&'a ReservationId),
    Instance(&'a InstanceId),
    Image(&'a ImageId),
    Profile(&'a ProfileId),
    Workflow(&'a WorkflowId),
    ProviderAccount(&'a ProviderAccountId),
}

impl Subject<'_> {
    /// The kind and id a `NOT_FOUND` names.
    pub(crate) fn named(&self, call: &Call) -> (&'static str, String) {
        match self {
            Subject::OwnTenant => ("tenant", call.principal.tenant_id.to_string()),
            Subject::Fleet => ("fleet", "global".to_owned()),
            Subject::Tenant(id) => ("tenant", id.to_string()),
            Subject::Site(id) => ("site", id.to_string()),
            Subject::Pool(id) => ("pool", id.to_string()),
            Subject::Node(id) => ("node", id.to_string()),
            Subject::Reservation(id) => ("reservation", id.to_string()),
            Subject::Instance(id) => ("instance", id.to_string()),
            Subject::Image(id) => ("image", id.to_string()),
            Subject::Profile(id) => ("profile", id.to_string()),
            Subject::Workflow(id) => ("workflow", id.to_string()),
            Subject::ProviderAccount(id) => ("provider account", id.to_string()),
        }
    }
}

/// The draft a create is decided on: the caller's, under its pool, with the attributes policies read.
pub(crate) fn draft(call: &Call, id: &ReservationId, request: &ReservationRequest, pool: PoolFacts) -> Resource {
    let mut attributes = BTreeMap::from([
        ("gpuCount".to_owned(), Attribute::Number(f64::from(request.devices.count))),
        ("durationHours".to_owned(), Attribute::Number(request.duration_s as f64 / 3600.0)),
        ("binding".to_owned(), Attribute::Text(request.binding.as_str().to_owned())),
        ("spot".to_owned(), Attribute::Bool(false)),
        ("projectId".to_owned(), Attribute::from(request.project_id.as_ref().map(|p| p.to_string()))),
    ]);
    for key in ["gpuModel", "region"] {
        if let Some(value) = pool.attributes.get(key) {
            attributes.insert(key.to_owned(), value.clone());
        }
    }
    Resource {
        target: Target::Reservation,
        id: id.to_string(),
        tenant_id: call.principal.tenant_id.clone(),
        pool: Some(pool),
        attributes,
    }
}
