//! The one door to the write side from outside. A call is authenticated to a [`Principal`]; the method it
//! names is decided on its subject, resolved from the inline tables: in a short read-only transaction of its own,
//! or, for the reservation commands on the hot path (create, cancel, release, renew), in the command's own
//! transaction, on the facts its first round trip reads anyway. Only an allowed call gets the [`Caller`] a
//! command runs as, whose admission context its events record. Denials are logged and counted here, so the HTTP
//! layer holds no database and decides nothing.
//!
//! [`Principal`]: crate::auth::Principal

use bc_domain::Rejection;
use bc_domain::id::ReservationId;
use bc_domain::reservation::{Command, Reservation, ReservationState};
use bc_eventstore::TxOptions;

use crate::auth::{Attribute, Decision, Resource, Target, catalog, resolve};
pub use crate::gate::{Call, Subject};
use crate::reservations::{Reserve, Reserved};
use crate::{App, AppError, AppResult, Caller, Committed};

/// A reservation request the authorizer refused: it is recorded (`denied`, or the state an earlier allowed
/// request with the same key reached), and the answer names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    pub reason: String,
    pub reservation_id: ReservationId,
    pub state: ReservationState,
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
        // The draft is decided in the reserve's own transaction, on the pool facts its first read brings; no
        // reservation decision answers FORBIDDEN, so that is the authorizer's refusal.
        match self.reserve_gated(&call.caller(), input.clone(), Some(call)).await {
            Err(AppError::Rejected(Rejection::Forbidden(reason))) => {
                Err(self.refused_reserve(call, input, reason).await)
            }
            other => other,
        }
    }

    /// The answer to a reserve the authorizer refused: recorded as `denied` ([`App::deny_reservation`]) within
    /// the caller's budget of recorded denials, refused unrecorded beyond it.
    pub(crate) async fn refused_reserve(&self, call: &Call, input: Reserve, reason: String) -> AppError {
        if !self.denial_budget.take(&call.principal.tenant_id, &call.principal.identity) {
            self.denials.count("reservations.create", "unrecorded");
            return Rejection::Forbidden(format!(
                "{reason} (not recorded: {} has had more than {} denials recorded this minute)",
                call.principal.identity,
                crate::auth::RECORDED_DENIALS_PER_MINUTE
            ))
            .into();
        }
        match self.deny_reservation(&call.caller(), input, reason.clone()).await {
            Ok(recorded) => {
                AppError::Denied(Denied { reason, reservation_id: recorded.value.id, state: recorded.value.state })
            }
            Err(err) => err,
        }
    }

    /// Cancels as `call` (`reservations.cancel`), decided on the reservation in the command's own transaction.
    pub async fn cancel_as(
        &self,
        call: &Call,
        id: &ReservationId,
        reason: Option<String>,
    ) -> AppResult<Committed<Reservation>> {
        let gate = Some((call, "reservations.cancel"));
        self.reservation_command(&call.caller(), id, gate, |now_ms| Command::Cancel { now_ms, reason: reason.clone() })
            .await
    }

    /// Releases as `call` (`reservations.release`), decided as [`App::cancel_as`] is.
    pub async fn release_as(&self, call: &Call, id: &ReservationId) -> AppResult<Committed<Reservation>> {
        let gate = Some((call, "reservations.release"));
        self.reservation_command(&call.caller(), id, gate, |now_ms| Command::Release { now_ms, awaiting: Vec::new() })
            .await
    }

    /// Renews as `call` (`reservations.renew`), decided as [`App::cancel_as`] is.
    pub async fn renew_as(&self, call: &Call, id: &ReservationId) -> AppResult<Committed<Reservation>> {
        let gate = Some((call, "reservations.renew"));
        self.reservation_command(&call.caller(), id, gate, |now_ms| Command::Renew { now_ms }).await
    }

    /// Extends as `call` (`reservations.extend`): decided like a create for the new length, so the attribute
    /// limits apply to the extended window.
    pub async fn extend_as(&self, call: &Call, id: &ReservationId, end_ms: i64) -> AppResult<Committed<Reservation>> {
        bc_domain::instant::check_epoch_ms("end", end_ms)?;
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
            Subject::Instance(id) => resolve::instance_resource(&mut tx, id).await?,
            Subject::Image(id) => resolve::image_resource(&mut tx, id).await?,
            Subject::Profile(id) => resolve::profile_resource(&mut tx, id).await?,
            Subject::ProviderAccount(id) => resolve::provider_account_resource(&mut tx, id).await?,
            Subject::Workflow(id) => resolve::workflow_resource(&mut tx, id).await?,
        };
        tx.commit().await?;
        Ok(resource)
    }

    /// Asks the authorizer; a denial is logged and counted.
    pub(crate) async fn decide(
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
