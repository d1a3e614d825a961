//! Provider accounts: creating one with its credential sealed in the same transaction, reading them (never the
//! credential), replacing the credential, deleting one no pool names, and opening the credential for a driver.

use std::collections::BTreeMap;

use bc_domain::Rejection;
use bc_domain::id::{ProviderAccountId, TenantId};
use bc_domain::provider::{self, ProviderAccountSpec, ProviderKind};
use bc_eventstore::events::ExpectedVersion;
use bc_eventstore::{ScopedFutureExt as _, TxOptions, clock};

use crate::reads::{Listed, Page};
use crate::sealed::{pki_failure, secret_context};
use crate::store::{self, certificates, providers::AccountRow};
use crate::{App, AppError, AppResult, Caller, Committed, record};

/// The kind of the sealed secret that holds a provider account's credential.
pub const PROVIDER_CREDENTIAL: &str = "provider-credential";

/// A provider account as the API shows it: everything but its credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderAccountView {
    pub id: ProviderAccountId,
    pub tenant_id: TenantId,
    pub name: String,
    pub provider: ProviderKind,
    pub endpoint: String,
    pub settings: BTreeMap<String, String>,
    pub created_at_ms: i64,
    /// When its credential was last set.
    pub credential_at_ms: i64,
}

impl ProviderAccountView {
    fn of_row(row: AccountRow) -> AppResult<ProviderAccountView> {
        let bad = |err: String| store::corrupt("a provider_accounts row", err);
        Ok(ProviderAccountView {
            id: row.id.parse().map_err(|err: bc_domain::id::IdError| bad(err.to_string()))?,
            tenant_id: row.tenant_id.parse().map_err(|err: bc_domain::id::IdError| bad(err.to_string()))?,
            name: row.name,
            provider: row.provider.parse().map_err(|err: Rejection| bad(err.to_string()))?,
            endpoint: row.endpoint,
            settings: serde_json::from_str(&row.settings).map_err(|err| bad(err.to_string()))?,
            created_at_ms: row.created_at_ms,
            credential_at_ms: row.credential_at_ms,
        })
    }

    fn of_spec(id: &ProviderAccountId, tenant_id: &TenantId, spec: ProviderAccountSpec, at_ms: i64) -> Self {
        ProviderAccountView {
            id: id.clone(),
            tenant_id: tenant_id.clone(),
            name: spec.name,
            provider: spec.provider,
            endpoint: spec.endpoint,
            settings: spec.settings,
            created_at_ms: at_ms,
            credential_at_ms: at_ms,
        }
    }
}

impl App {
    /// Creates a provider account in the caller's tenant, its credential sealed with the PKI bundle's key in the
    /// same transaction.
    pub async fn create_provider_account(
        &self,
        caller: &Caller,
        spec: ProviderAccountSpec,
        credential: &str,
    ) -> AppResult<Committed<ProviderAccountView>> {
        // Checked before a query reads with them: PostgreSQL refuses a NUL in text.
        spec.check()?;
        provider::check_credential(credential)?;
        let account_id = ProviderAccountId::generate();
        let sealed = self.seal_credential(&account_id, credential)?;
        let result = self
            .db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let (spec, account_id, sealed) = (&spec, &account_id, &sealed);
                async move {
                    let tenant = &caller.tenant_id;
                    let taken = store::providers::name_taken(tx, tenant.as_str(), &spec.name).await?;
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events =
                        provider::create_provider_account(account_id, tenant, spec.clone(), credential, taken, now_ms)?;
                    let stream = account_id.as_str();
                    certificates::put_secret(tx, PROVIDER_CREDENTIAL, stream, sealed).await?;
                    let position = record(tx, caller, stream, tenant, ExpectedVersion::NO_STREAM, events).await?;
                    let view = ProviderAccountView::of_spec(account_id, tenant, spec.clone(), now_ms);
                    Ok(Committed { value: view, position })
                }
                .scope_boxed()
            })
            .await;
        // Two creates of one name at once: the loser says so.
        result.map_err(|err: AppError| {
            err.on_unique_violation(|| {
                format!("a provider account named {:?} was created at the same moment", spec.name)
            })
        })
    }

    /// The caller's tenant's provider accounts, by name.
    pub async fn list_provider_accounts(&self, caller: &Caller, page: &Page) -> AppResult<Listed<ProviderAccountView>> {
        let after = page.after_key.as_deref();
        if let Some(after) = after {
            bc_domain::site::check_name("cursor", after)?;
        }
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let rows = store::providers::list(&mut tx, caller.tenant_id.as_str(), after, i64::from(page.limit) + 1).await?;
        tx.commit().await?;
        let found = rows
            .into_iter()
            .map(|row| Ok((row.name.clone(), ProviderAccountView::of_row(row)?)))
            .collect::<AppResult<_>>()?;
        Ok(crate::reads::paged(found, page))
    }

    /// One provider account (the door has decided the caller may see it).
    pub async fn provider_account(&self, id: &ProviderAccountId) -> AppResult<ProviderAccountView> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let row = store::providers::account(&mut tx, id.as_str()).await?;
        tx.commit().await?;
        ProviderAccountView::of_row(
            row.ok_or_else(|| Rejection::NotFound { kind: "provider account", id: id.to_string() })?,
        )
    }

    /// Replaces a provider account's credential of the caller's tenant.
    pub async fn rotate_provider_credential(
        &self,
        caller: &Caller,
        id: &ProviderAccountId,
        credential: &str,
    ) -> AppResult<Committed<ProviderAccountView>> {
        provider::check_credential(credential)?;
        let sealed = self.seal_credential(id, credential)?;
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let sealed = &sealed;
                async move {
                    let (account, version) = owned_account(tx, caller, id).await?;
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = provider::rotate_credential(&account, credential, now_ms)?;
                    certificates::put_secret(tx, PROVIDER_CREDENTIAL, id.as_str(), sealed).await?;
                    let position =
                        record(tx, caller, id.as_str(), &caller.tenant_id, ExpectedVersion::Exact(version), events)
                            .await?;
                    let mut view = ProviderAccountView::of_spec(id, &account.tenant_id, account.spec, now_ms);
                    view.created_at_ms = account.created_at_ms;
                    Ok(Committed { value: view, position })
                }
                .scope_boxed()
            })
            .await
    }

    /// Deletes a provider account of the caller's tenant that no pool names, and its credential.
    pub async fn delete_provider_account(&self, caller: &Caller, id: &ProviderAccountId) -> AppResult<Committed<()>> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                async move {
                    let (account, version) = owned_account(tx, caller, id).await?;
                    let pools = store::providers::pools_naming(tx, id.as_str()).await?;
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = provider::delete_provider_account(&account, &pools, now_ms)?;
                    certificates::delete_secret(tx, PROVIDER_CREDENTIAL, id.as_str()).await?;
                    let position =
                        record(tx, caller, id.as_str(), &caller.tenant_id, ExpectedVersion::Exact(version), events)
                            .await?;
                    Ok(Committed { value: (), position })
                }
                .scope_boxed()
            })
            .await
    }

    /// A provider account's credential, opened with the PKI bundle's key: what its driver presents to the
    /// provider. `None` when the account has none (it was deleted).
    pub async fn provider_credential(&self, id: &ProviderAccountId) -> AppResult<Option<String>> {
        let opened = self.open_secret(PROVIDER_CREDENTIAL, id.as_str()).await?;
        opened
            .map(|bytes| String::from_utf8(bytes).map_err(|err| store::corrupt("a provider credential", err)))
            .transpose()
    }

    fn seal_credential(&self, id: &ProviderAccountId, credential: &str) -> AppResult<Vec<u8>> {
        self.sealer()?
            .seal(credential.as_bytes(), &secret_context(PROVIDER_CREDENTIAL, id.as_str()))
            .map_err(pki_failure)
    }
}

/// A live account of the caller's tenant, folded from its stream, with the stream's version.
async fn owned_account(
    tx: &mut bc_eventstore::Tx,
    caller: &Caller,
    id: &ProviderAccountId,
) -> AppResult<(provider::ProviderAccount, u32)> {
    match store::provider_account_aggregate(tx, id).await? {
        Some((account, version)) if account.tenant_id == caller.tenant_id && account.deleted_at_ms.is_none() => {
            Ok((account, version))
        }
        _ => Err(Rejection::NotFound { kind: "provider account", id: id.to_string() }.into()),
    }
}
