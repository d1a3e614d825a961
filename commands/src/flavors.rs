//! Flavors: creating one (a public one is published by the platform), reading the ones a tenant may use, and
//! deleting one.

use bc_domain::Rejection;
use bc_domain::flavor::{self, FlavorSizes};
use bc_domain::id::{FlavorId, TenantId};
use bc_domain::image::Visibility;
use bc_eventstore::events::ExpectedVersion;
use bc_eventstore::{ScopedFutureExt as _, TxOptions, clock};

use crate::reads::{Listed, Page};
use crate::store::{self, flavors::FlavorRow};
use crate::{App, AppError, AppResult, Caller, Committed, record};

/// A flavor as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlavorView {
    pub id: FlavorId,
    pub tenant_id: TenantId,
    pub name: String,
    pub sizes: FlavorSizes,
    pub visibility: Visibility,
    pub created_at_ms: i64,
}

impl FlavorView {
    /// The sizes a `flavors` row holds.
    pub(crate) fn sizes_of(row: &FlavorRow) -> AppResult<FlavorSizes> {
        let size = |value: i64| u32::try_from(value).map_err(|err| store::corrupt("a flavors row", err));
        Ok(FlavorSizes {
            vcpu: size(row.vcpu)?,
            memory_gib: size(row.memory_gib)?,
            gpus: size(row.gpus)?,
            disk: size(row.disk_gib)?,
        })
    }

    fn of_row(row: FlavorRow) -> AppResult<FlavorView> {
        let bad = |err: String| store::corrupt("a flavors row", err);
        let sizes = FlavorView::sizes_of(&row)?;
        Ok(FlavorView {
            id: row.id.parse().map_err(|err: bc_domain::id::IdError| bad(err.to_string()))?,
            tenant_id: row.tenant_id.parse().map_err(|err: bc_domain::id::IdError| bad(err.to_string()))?,
            name: row.name,
            sizes,
            visibility: match row.visibility.as_str() {
                "public" => Visibility::Public,
                "private" => Visibility::Private,
                other => return Err(bad(format!("visibility {other:?}"))),
            },
            created_at_ms: row.created_at_ms,
        })
    }
}

impl App {
    /// Creates a flavor in the caller's tenant (the door has decided whether it may be public).
    pub async fn create_flavor(
        &self,
        caller: &Caller,
        name: &str,
        sizes: FlavorSizes,
        visibility: Visibility,
    ) -> AppResult<Committed<FlavorView>> {
        // Checked before a query reads with them: PostgreSQL refuses a NUL in text.
        bc_domain::site::check_name("name", name)?;
        sizes.check()?;
        let flavor_id = FlavorId::generate();
        let result = self
            .db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let flavor_id = &flavor_id;
                async move {
                    let tenant = &caller.tenant_id;
                    let taken = store::flavors::name_taken(tx, tenant.as_str(), name).await?;
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = flavor::create_flavor(flavor_id, tenant, name, sizes, visibility, taken, now_ms)?;
                    let position =
                        record(tx, caller, flavor_id.as_str(), tenant, ExpectedVersion::NO_STREAM, events).await?;
                    let view = FlavorView {
                        id: flavor_id.clone(),
                        tenant_id: tenant.clone(),
                        name: name.to_owned(),
                        sizes,
                        visibility,
                        created_at_ms: now_ms,
                    };
                    Ok(Committed { value: view, position })
                }
                .scope_boxed()
            })
            .await;
        result.map_err(|err: AppError| {
            err.on_unique_violation(|| format!("a flavor named {name:?} was created at the same moment"))
        })
    }

    /// The flavors the caller's tenant may use: its own and the public ones, by id.
    pub async fn list_flavors(&self, caller: &Caller, page: &Page) -> AppResult<Listed<FlavorView>> {
        let after = match page.after_key.as_deref() {
            Some(key) => Some(
                key.parse::<FlavorId>()
                    .map_err(|_| Rejection::invalid("cursor", "is not a cursor of this list"))?
                    .to_string(),
            ),
            None => None,
        };
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let limit = i64::from(page.limit) + 1;
        let rows = store::flavors::list(&mut tx, caller.tenant_id.as_str(), after.as_deref(), limit).await?;
        tx.commit().await?;
        let found =
            rows.into_iter().map(|row| Ok((row.id.clone(), FlavorView::of_row(row)?))).collect::<AppResult<_>>()?;
        Ok(crate::reads::paged(found, page))
    }

    /// One flavor the caller's tenant may use: its own, or a public one.
    pub async fn flavor(&self, caller: &Caller, id: &FlavorId) -> AppResult<FlavorView> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let row = store::flavors::flavor(&mut tx, id.as_str()).await?;
        tx.commit().await?;
        let usable = row.filter(|r| r.tenant_id == caller.tenant_id.as_str() || r.visibility == "public");
        FlavorView::of_row(usable.ok_or_else(|| Rejection::NotFound { kind: "flavor", id: id.to_string() })?)
    }

    /// Deletes a flavor of the caller's tenant.
    pub async fn delete_flavor(&self, caller: &Caller, id: &FlavorId) -> AppResult<Committed<()>> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                async move {
                    let (found, version) = match store::flavor_aggregate(tx, id).await? {
                        Some((f, version)) if f.created.tenant_id == caller.tenant_id => (Some(f), version),
                        _ => (None, 0),
                    };
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = flavor::delete_flavor(found.as_ref(), id, now_ms)?;
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
