//! Profiles: creating a name's next version, reading versions, deleting one, and the steps a deployment of one
//! runs.

use bc_domain::Rejection;
use bc_domain::id::{ProfileId, TenantId};
use bc_domain::profile::{self, ImageFacts, ProfileCreated, ProfileEvent, ProfileSpec, ProfileTarget, StepSpec};
use bc_domain::workflow::WorkflowKind;
use bc_eventstore::events::ExpectedVersion;
use bc_eventstore::{ScopedFutureExt as _, Tx, TxOptions, clock};

use crate::reads::{Listed, Page};
use crate::store::{self, profiles::ProfileRow};
use crate::{App, AppError, AppResult, Caller, Committed, record};

/// A profile version as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileView {
    pub id: ProfileId,
    pub tenant_id: TenantId,
    pub name: String,
    pub version: u32,
    pub spec: ProfileSpec,
    pub created_at_ms: i64,
}

impl ProfileView {
    fn of_created(e: &ProfileCreated) -> ProfileView {
        ProfileView {
            id: e.profile_id.clone(),
            tenant_id: e.tenant_id.clone(),
            name: e.name.clone(),
            version: e.version,
            spec: (*e.spec).clone(),
            created_at_ms: e.at_ms,
        }
    }

    fn of_row(row: ProfileRow) -> AppResult<ProfileView> {
        let bad = |err: String| store::corrupt("a profiles row", err);
        Ok(ProfileView {
            id: row.id.parse().map_err(|err: bc_domain::id::IdError| bad(err.to_string()))?,
            tenant_id: row.tenant_id.parse().map_err(|err: bc_domain::id::IdError| bad(err.to_string()))?,
            name: row.name,
            version: u32::try_from(row.version).map_err(|err| bad(err.to_string()))?,
            spec: serde_json::from_str(&row.spec).map_err(|err| bad(err.to_string()))?,
            created_at_ms: row.created_at_ms,
        })
    }
}

impl App {
    /// Creates the next version of profile `name` in the caller's tenant.
    pub async fn create_profile(
        &self,
        caller: &Caller,
        name: &str,
        spec: ProfileSpec,
    ) -> AppResult<Committed<ProfileView>> {
        // Checked before a query reads with them: PostgreSQL refuses a NUL in text.
        profile::check_name(name)?;
        spec.check()?;
        let profile_id = ProfileId::generate();
        let result = self
            .db
            // Serializable, with the images' deletion (see `App::delete_image`).
            .transaction_with_retry(TxOptions::COMMAND_SERIALIZABLE, &self.retry, |tx| {
                let (spec, profile_id) = (&spec, &profile_id);
                async move {
                    let tenant = caller.tenant_id.as_str();
                    let latest = store::profiles::latest_version(tx, tenant, name).await?;
                    let image = match &spec.image_id {
                        Some(id) => Some(match store::profiles::image_for(tx, tenant, id.as_str()).await? {
                            Some(verified) => ImageFacts::Found { verified },
                            None => ImageFacts::Missing,
                        }),
                        None => None,
                    };
                    let latest = latest.map(|v| u32::try_from(v).unwrap_or(u32::MAX));
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = profile::create_profile(
                        profile_id,
                        &caller.tenant_id,
                        name,
                        spec.clone(),
                        latest,
                        image,
                        now_ms,
                    )?;
                    let view = match events.first() {
                        Some(ProfileEvent::Created(e)) => ProfileView::of_created(e),
                        _ => return Err(store::corrupt("a profile just created", "no creation event")),
                    };
                    let position =
                        record(tx, caller, profile_id.as_str(), &caller.tenant_id, ExpectedVersion::NO_STREAM, events)
                            .await?;
                    Ok(Committed { value: view, position })
                }
                .scope_boxed()
            })
            .await;
        // Two creates of the same name at once both chose the same next version: the loser says so.
        result.map_err(|err: AppError| {
            err.on_unique_violation(|| {
                format!("another version of profile {name} was created at the same moment; retry")
            })
        })
    }

    /// The caller's tenant's live profile versions (of one name when given), by name and version.
    pub async fn list_profiles(
        &self,
        caller: &Caller,
        name: Option<&str>,
        page: &Page,
    ) -> AppResult<Listed<ProfileView>> {
        if let Some(name) = name {
            profile::check_name(name)?;
        }
        let after = match page.after_key.as_deref() {
            Some(key) => {
                let (name, version) = key
                    .rsplit_once('@')
                    .and_then(|(n, v)| Some((n, v.parse::<i32>().ok()?)))
                    .ok_or_else(|| Rejection::invalid("cursor", "is not a cursor of this list"))?;
                Some((name, version))
            }
            None => None,
        };
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let rows = store::profiles::list(&mut tx, caller.tenant_id.as_str(), name, after, page.limit + 1).await?;
        tx.commit().await?;
        let found = rows
            .into_iter()
            .map(|row| Ok((format!("{}@{}", row.name, row.version), ProfileView::of_row(row)?)))
            .collect::<AppResult<_>>()?;
        Ok(crate::reads::paged(found, page))
    }

    /// One live profile version (the door has decided the caller may see it).
    pub async fn profile(&self, id: &ProfileId) -> AppResult<ProfileView> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let row = store::profiles::profile(&mut tx, id.as_str()).await?;
        tx.commit().await?;
        ProfileView::of_row(row.ok_or_else(|| Rejection::NotFound { kind: "profile", id: id.to_string() })?)
    }

    /// Deletes a profile version of the caller's tenant.
    pub async fn delete_profile(&self, caller: &Caller, id: &ProfileId) -> AppResult<Committed<()>> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                async move {
                    let (found, version) = match store::profile_aggregate(tx, id).await? {
                        Some((p, version)) if p.created.tenant_id == caller.tenant_id => (Some(p), version),
                        _ => (None, 0),
                    };
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = profile::delete_profile(found.as_ref(), id, now_ms)?;
                    let position =
                        record(tx, caller, id.as_str(), &caller.tenant_id, ExpectedVersion::Exact(version), events)
                            .await?;
                    Ok(Committed { value: (), position })
                }
                .scope_boxed()
            })
            .await
    }
}

/// The steps a deployment of `profile_id` runs: the profile's own, or the built-in ones when it gives none. The
/// profile must be a live metal profile of `tenant`.
pub(crate) async fn deploy_steps(
    tx: &mut Tx,
    profile_id: &ProfileId,
    tenant: &TenantId,
    kind: WorkflowKind,
) -> AppResult<Vec<StepSpec>> {
    let profile = store::profiles::profile(tx, profile_id.as_str()).await?;
    let profile = profile
        .filter(|p| p.tenant_id == tenant.as_str())
        .ok_or_else(|| Rejection::invalid("profileId", format!("profile {profile_id} was not found")))?;
    let spec: ProfileSpec =
        serde_json::from_str(&profile.spec).map_err(|err| store::corrupt("a profile's spec", err))?;
    if spec.target != ProfileTarget::Metal {
        return Err(Rejection::invalid("profileId", "a machine is deployed with a metal profile").into());
    }
    Ok(if spec.steps.is_empty() { kind.default_steps() } else { spec.steps })
}
