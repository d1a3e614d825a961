//! The one door to the write side from outside. A call is authenticated to a [`Principal`]; the method it
//! names is decided on its subject, resolved from the inline tables in a short read-only transaction of its
//! own; only an allowed call gets the [`Caller`] a command runs as, whose admission context its events
//! record. Denials are logged and counted here, so the HTTP layer holds no database and decides nothing.

use std::collections::BTreeMap;

use bc_domain::Rejection;
use bc_domain::id::{NodeId, PoolId, ReservationId, SiteId, TenantId};
use bc_domain::reservation::{Reservation, ReservationRequest, ReservationState};
use bc_eventstore::TxOptions;

use crate::auth::{Attribute, Decision, PoolFacts, Principal, Resource, Target, catalog, resolve};
use crate::reservations::{Reserve, Reserved};
use crate::{App, AppError, AppResult, Caller, Committed};

/// A call from outside: who it speaks for, as the authorizer authenticated it, and the request's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub principal: Principal,
    pub request_id: String,
}

impl Call {
    /// The caller a command runs as, had it been allowed (tools that decide for themselves use this).
    fn caller(&self) -> Caller {
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
}

impl Subject<'_> {
    /// The kind and id a `NOT_FOUND` names.
    fn named(&self, call: &Call) -> (&'static str, String) {
        match self {
            Subject::OwnTenant => ("tenant", call.principal.tenant_id.to_string()),
            Subject::Fleet => ("fleet", "global".to_owned()),
            Subject::Tenant(id) => ("tenant", id.to_string()),
            Subject::Site(id) => ("site", id.to_string()),
            Subject::Pool(id) => ("pool", id.to_string()),
            Subject::Node(id) => ("node", id.to_string()),
            Subject::Reservation(id) => ("reservation", id.to_string()),
        }
    }
}

/// A reservation request the authorizer refused: it is recorded (`denied`, or the state an earlier allowed
/// request with the same key reached), and the answer names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    pub reason: String,
    pub reservation_id: ReservationId,
    pub state: ReservationState,
}

/// The draft a create is decided on: the caller's, under its pool, with the attributes policies read.
fn draft(call: &Call, id: &ReservationId, request: &ReservationRequest, pool: PoolFacts) -> Resource {
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

impl App {
    /// Who a bearer token speaks for (`None`: no token was sent). Unknown tokens and missing ones are
    /// `UNAUTHENTICATED`, logged and counted.
    pub async fn authenticate(&self, token: Option<&str>, request_id: &str) -> AppResult<Call> {
        let Some(token) = token else {
            self.denials.count("any", "unauthenticated");
            return Err(Rejection::Unauthenticated(
                "send the bearer token as `Authorization: Bearer <token>`".to_owned(),
            )
            .into());
        };
        match self.auth.authenticate(token.trim()).await {
            Some(principal) => Ok(Call { principal, request_id: request_id.to_owned() }),
            None => {
                self.denials.count("any", "unauthenticated");
                tracing::info!(request_id, "denied: unknown bearer token");
                Err(Rejection::Unauthenticated("the bearer token is not known".to_owned()).into())
            }
        }
    }

    /// Decides `method` on `subject` for `call`: the caller to run the command as when allowed, `NOT_FOUND`
    /// when the subject does not resolve for the caller (exactly as when it does not exist), `FORBIDDEN`
    /// with the reason otherwise.
    pub async fn authorize(&self, call: &Call, method: &'static str, subject: Subject<'_>) -> AppResult<Caller> {
        let resource = self.resolve(call, subject).await?;
        self.decide(call, method, resource.as_ref(), subject).await?;
        Ok(call.caller())
    }

    /// Reserves as `call` (`reservations.create`), deciding on the draft first. A request the authorizer
    /// refuses is recorded as one `reservation.denied` event and answered [`AppError::Denied`].
    pub async fn reserve_as(&self, call: &Call, input: Reserve) -> AppResult<Committed<Reserved>> {
        let id = ReservationId::derive(&call.principal.tenant_id, &call.principal.identity, &input.idempotency_key);
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let pool = resolve::pool(&mut tx, &input.request.pool_id).await?;
        tx.commit().await?;
        let resource = pool.map(|facts| draft(call, &id, &input.request, facts));
        let subject = Subject::Pool(&input.request.pool_id);
        match self.decide(call, "reservations.create", resource.as_ref(), subject).await {
            Ok(()) => self.reserve(&call.caller(), input).await,
            Err(AppError::Rejected(Rejection::Forbidden(reason)))
                if !self.denial_budget.take(&call.principal.tenant_id, &call.principal.identity) =>
            {
                self.denials.count("reservations.create", "unrecorded");
                Err(Rejection::Forbidden(format!(
                    "{reason} (not recorded: {} has had more than {} denials recorded this minute)",
                    call.principal.identity,
                    crate::auth::RECORDED_DENIALS_PER_MINUTE
                ))
                .into())
            }
            Err(AppError::Rejected(Rejection::Forbidden(reason))) => {
                let recorded = self.deny_reservation(&call.caller(), input, reason.clone()).await?;
                Err(AppError::Denied(Denied { reason, reservation_id: recorded.value.id, state: recorded.value.state }))
            }
            Err(other) => Err(other),
        }
    }

    /// Extends as `call` (`reservations.extend`): decided like a create for the new length, so the attribute
    /// limits apply to the extended window.
    pub async fn extend_as(&self, call: &Call, id: &ReservationId, end_ms: i64) -> AppResult<Committed<Reservation>> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let mut resource = resolve::reservation_resource(&mut tx, id).await?;
        let start = resolve::reservation_start(&mut tx, id).await?;
        tx.commit().await?;
        if let (Some(resource), Some(start)) = (resource.as_mut(), start) {
            let hours = (end_ms - start) as f64 / 3_600_000.0;
            resource.attributes.insert("durationHours".into(), Attribute::Number(hours));
        }
        self.decide(call, "reservations.extend", resource.as_ref(), Subject::Reservation(id)).await?;
        self.extend_reservation(&call.caller(), id, end_ms).await
    }

    /// The resource `subject` names, resolved in one short read-only transaction; `None` when it does not exist.
    async fn resolve(&self, call: &Call, subject: Subject<'_>) -> AppResult<Option<Resource>> {
        let tenant = &call.principal.tenant_id;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let resource = match subject {
            Subject::OwnTenant => Some(Resource::scope(Target::Tenant, tenant)),
            Subject::Fleet => Some(Resource::scope(Target::Fleet, tenant)),
            Subject::Tenant(id) => self.auth.tenant(id).map(|t| Resource::scope(Target::Tenant, &t.id)),
            Subject::Site(id) => resolve::site_resource(&mut tx, id).await?,
            Subject::Pool(id) => resolve::pool_resource(&mut tx, id).await?,
            Subject::Node(id) => resolve::node_resource(&mut tx, id).await?,
            Subject::Reservation(id) => resolve::reservation_resource(&mut tx, id).await?,
        };
        tx.commit().await?;
        Ok(resource)
    }

    /// Asks the authorizer; a denial is logged and counted.
    async fn decide(
        &self,
        call: &Call,
        method: &'static str,
        resource: Option<&Resource>,
        subject: Subject<'_>,
    ) -> AppResult<()> {
        let Some(spec) = catalog::method(method) else {
            return Err(
                bc_eventstore::Error::InvalidConfig(format!("method {method} is not in the method table")).into()
            );
        };
        let decision = match resource {
            Some(resource) => self.auth.decide(&call.principal, spec, resource).await,
            None => Decision::NotFound,
        };
        let (p, request_id) = (&call.principal, call.request_id.as_str());
        match decision {
            Decision::Allow => Ok(()),
            Decision::NotFound => {
                self.denials.count(spec.method, "not_found");
                let (kind, id) = subject.named(call);
                tracing::info!(method, identity = %p.identity, tenant = %p.tenant_id, request_id, kind, id, "denied: not found");
                Err(Rejection::NotFound { kind, id }.into())
            }
            Decision::Suspended(reason) => {
                self.denials.count(spec.method, "suspended");
                tracing::info!(method, identity = %p.identity, tenant = %p.tenant_id, request_id, reason, "denied: suspended");
                Err(Rejection::TenantSuspended(reason).into())
            }
            Decision::Deny(reason) => {
                self.denials.count(spec.method, "forbidden");
                tracing::info!(method, identity = %p.identity, tenant = %p.tenant_id, request_id, reason, "denied");
                Err(Rejection::Forbidden(reason).into())
            }
        }
    }
}
