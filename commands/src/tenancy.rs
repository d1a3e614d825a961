//! Tenancy through the API: tenants and their suspension, identities and their bearer tokens, grants of pool
//! relations, attribute limits. Each change is an event with its inline table row; the authorizer takes the
//! tables again after every change this process commits, and [`App::follow_tenancy`] brings it every change
//! any process commits, within a second.

use std::time::Duration;

use bc_domain::Rejection;
use bc_domain::id::{GrantId, IdentityId, LimitId, PoolId, TenantId, TokenId};
use bc_domain::tenancy::{self, Relation, SessionKind, TenantFacts};
use bc_eventstore::events::{self, ExpectedVersion};
use bc_eventstore::{Position, ScopedFutureExt as _, TxOptions, clock};

use crate::auth::TenantView;
use crate::reads::{Listed, Page};
use crate::store::tenancy as rows;
use crate::{App, AppError, AppResult, Caller, Committed, record};

/// The event families the authorizer decides from.
pub const FAMILIES: &[&str] = &["tenant", "identity", "grant", "limit"];

/// How often [`App::follow_tenancy`] looks for changes.
pub const FOLLOW_EVERY: Duration = Duration::from_millis(250);

/// The most grants one tenant may hold, and limits one pool.
pub const MAX_GRANTS_PER_TENANT: i64 = 1_000;
pub const MAX_LIMITS_PER_POOL: i64 = 100;

/// An identity as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityInfo {
    pub id: IdentityId,
    pub tenant_id: TenantId,
    pub name: String,
    pub kind: String,
    pub admin: bool,
    pub tokens: i64,
    pub created_at_ms: i64,
}

/// A bearer token as issued: the secret is shown here only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedToken {
    pub id: TokenId,
    pub identity_id: IdentityId,
    pub token: String,
    pub created_at_ms: i64,
}

/// A live token, without its secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    pub id: TokenId,
    pub created_at_ms: i64,
}

/// A grant as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantInfo {
    pub id: GrantId,
    pub tenant_id: TenantId,
    pub identity: String,
    pub pool: String,
    pub relation: Relation,
    pub created_at_ms: i64,
}

/// An attribute limit as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitInfo {
    pub id: LimitId,
    pub pool_id: PoolId,
    pub relation: Relation,
    pub max_gpus: Option<u32>,
    pub max_hours: Option<u32>,
    pub created_at_ms: i64,
}

/// The bearer token a token id stands for, made from the bundle's key: the same id always gives the same token.
fn derived_token(sealer: &bc_pki::seal::Sealer, token_id: &TokenId) -> String {
    let bytes = sealer.derive(&format!("bearer-token:{token_id}"));
    format!("bct_{}", bc_domain::id::crockford_base32(&bytes))
}

impl App {
    fn needs_tenancy(&self) -> AppResult<()> {
        if self.auth.administers_tenancy() {
            Ok(())
        } else {
            Err(Rejection::Conflict("tenants are administered by the external authorizer, not this API".into()).into())
        }
    }

    /// Whether `id` names a tenant the authorizer knows (an external authorizer's tenants are its own: taken
    /// as known).
    pub fn tenant_known(&self, id: &TenantId) -> bool {
        !self.auth.administers_tenancy() || self.auth.tenant(id).is_some()
    }

    /// Gives the authorizer the tenancy tables as they are now. One refresh at a time: a command's own refresh
    /// and the follower's ([`App::follow_tenancy`]) could otherwise read in one order and reload in the other,
    /// and a tenant whose create was answered would be unknown to the next request until the follower's next
    /// look.
    pub async fn refresh_tenancy(&self) -> AppResult<()> {
        let _one_at_a_time = self.tenancy_refresh.lock().await;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let directory = rows::directory(&mut tx).await?;
        tx.commit().await?;
        self.auth.reload(&directory);
        Ok(())
    }

    /// Keeps the authorizer current until `stop`: loads the tables, then follows the log and loads them again
    /// whenever an event of [`FAMILIES`] passes the horizon (any process's: a token revoked anywhere stops
    /// working here within a second).
    pub async fn follow_tenancy(&self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut cursor: Option<Position> = None;
        loop {
            match self.tenancy_step(cursor).await {
                Ok(next) => cursor = Some(next),
                Err(err) => tracing::warn!(error = %err, "cannot follow the tenancy changes; retrying"),
            }
            tokio::select! {
                _ = tokio::time::sleep(FOLLOW_EVERY) => {}
                _ = stop.changed() => return,
            }
        }
    }

    /// One look: the position reached, after loading the tables if anything changed since `cursor` (always, on
    /// the first look).
    async fn tenancy_step(&self, cursor: Option<Position>) -> AppResult<Position> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let (head, changed) = match cursor {
            Some(after) => events::changed_since(&mut tx, after, FAMILIES).await?,
            None => (events::horizon_head(&mut tx).await?, true),
        };
        tx.commit().await?;
        // The tables are read after the head: whatever the head covers is in them.
        if changed {
            self.refresh_tenancy().await?;
        }
        Ok(head)
    }

    /// Records tenancy events, then brings the authorizer the change.
    async fn tenancy_recorded<T>(&self, result: AppResult<Committed<T>>) -> AppResult<Committed<T>> {
        let committed = result?;
        self.refresh_tenancy().await?;
        Ok(committed)
    }

    /// Creates tenant `id` under `parent`.
    pub async fn create_tenant(
        &self,
        caller: &Caller,
        id: &TenantId,
        parent: &TenantId,
        name: &str,
    ) -> AppResult<Committed<TenantView>> {
        self.needs_tenancy()?;
        bc_domain::site::check_name("name", name)?;
        let parent_view = self.auth.tenant(parent);
        if parent_view.as_ref().is_some_and(|p| p.state != "active") {
            return Err(Rejection::invalid("parentId", format!("tenant {parent} is not active")).into());
        }
        let in_file = self.auth.tenant(id).is_some_and(|t| !t.in_log);
        let result = self
            .db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let parent_depth = parent_view.as_ref().map(|p| p.ancestors.len());
                async move {
                    let id_taken = in_file || rows::tenant_exists(tx, id).await?;
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let facts = TenantFacts { id_taken, parent_depth };
                    let events = tenancy::create_tenant(id, parent, name, facts, now_ms)?;
                    let stream = tenancy::tenant_stream(id);
                    let position = record(tx, caller, &stream, parent, ExpectedVersion::NO_STREAM, events).await?;
                    Ok(Committed { value: (), position })
                }
                .scope_boxed()
            })
            .await
            .map_err(|err: AppError| err.on_unique_violation(|| format!("tenant {id} already exists")));
        let done = self.tenancy_recorded(result).await?;
        let view = self.auth.tenant(id).ok_or_else(|| Rejection::NotFound { kind: "tenant", id: id.to_string() })?;
        Ok(Committed { value: view, position: done.position })
    }

    /// One tenant.
    pub fn get_tenant(&self, id: &TenantId) -> AppResult<TenantView> {
        self.needs_tenancy()?;
        self.auth.tenant(id).ok_or_else(|| Rejection::NotFound { kind: "tenant", id: id.to_string() }.into())
    }

    /// The tenants directly below `parent`, by id.
    pub fn list_tenants(&self, parent: &TenantId) -> AppResult<Vec<TenantView>> {
        self.needs_tenancy()?;
        Ok(self.auth.tenants().into_iter().filter(|t| t.parent_id.as_ref() == Some(parent)).collect())
    }

    /// Suspends (`Some(reason)`) or resumes (`None`) a tenant made through the API. A tenant never suspends
    /// itself or an ancestor.
    pub async fn set_tenant_suspended(
        &self,
        caller: &Caller,
        id: &TenantId,
        reason: Option<&str>,
    ) -> AppResult<Committed<TenantView>> {
        self.needs_tenancy()?;
        let Some(view) = self.auth.tenant(id) else {
            return Err(Rejection::NotFound { kind: "tenant", id: id.to_string() }.into());
        };
        if caller.tenant_id == *id || caller.ancestors.contains(id) {
            return Err(Rejection::Forbidden(format!(
                "tenant {id} is the caller's own or an ancestor: its parent's administrators suspend and resume it"
            ))
            .into());
        }
        if !view.in_log {
            return Err(Rejection::Conflict(format!(
                "tenant {id} is defined in the bootstrap file: change its status there"
            ))
            .into());
        }
        let parent = view.parent_id.clone().unwrap_or_else(crate::auth::root_tenant);
        let result = self
            .db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let parent = &parent;
                async move {
                    let (tenant, version) = match rows::tenant_aggregate(tx, id).await? {
                        Some((tenant, version)) => (Some(tenant), version),
                        None => (None, 0),
                    };
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = match reason {
                        Some(reason) => tenancy::suspend_tenant(tenant.as_ref(), id, reason, now_ms)?,
                        None => tenancy::resume_tenant(tenant.as_ref(), id, now_ms)?,
                    };
                    let stream = tenancy::tenant_stream(id);
                    let position = record(tx, caller, &stream, parent, ExpectedVersion::Exact(version), events).await?;
                    Ok(Committed { value: (), position })
                }
                .scope_boxed()
            })
            .await;
        let done = self.tenancy_recorded(result).await?;
        Ok(Committed { value: self.get_tenant(id)?, position: done.position })
    }

    /// Creates an identity in `tenant`.
    pub async fn create_identity(
        &self,
        caller: &Caller,
        tenant: &TenantId,
        name: &str,
        kind: SessionKind,
        admin: bool,
    ) -> AppResult<Committed<IdentityInfo>> {
        self.needs_tenancy()?;
        let checked = tenancy::check_identity_name(name)?;
        let in_file = self.auth.file_identity(tenant, &checked);
        let identity_id = IdentityId::generate();
        let result = self
            .db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let identity_id = &identity_id;
                async move {
                    let taken = in_file || rows::identity_named(tx, tenant, name).await?;
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = tenancy::create_identity(identity_id, tenant, name, kind, admin, taken, now_ms)?;
                    let position =
                        record(tx, caller, identity_id.as_str(), tenant, ExpectedVersion::NO_STREAM, events).await?;
                    let info = IdentityInfo {
                        id: identity_id.clone(),
                        tenant_id: tenant.clone(),
                        name: name.to_owned(),
                        kind: kind.as_str().to_owned(),
                        admin,
                        tokens: 0,
                        created_at_ms: now_ms,
                    };
                    Ok(Committed { value: info, position })
                }
                .scope_boxed()
            })
            .await
            .map_err(|err: AppError| {
                err.on_unique_violation(|| format!("tenant {tenant} already has an identity named {name}"))
            });
        self.tenancy_recorded(result).await
    }

    /// A page of a tenant's identities made through the API, by id.
    pub async fn list_identities(&self, tenant: &TenantId, page: &Page) -> AppResult<Listed<IdentityInfo>> {
        self.needs_tenancy()?;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let found = rows::identities(&mut tx, tenant, page.after_key.as_deref(), i64::from(page.limit) + 1).await?;
        tx.commit().await?;
        let items = found
            .into_iter()
            .map(|(id, name, kind, admin, created_at_ms, tokens)| {
                let info = IdentityInfo {
                    id: rows::parse("identities.id", &id)?,
                    tenant_id: tenant.clone(),
                    name,
                    kind,
                    admin,
                    tokens,
                    created_at_ms,
                };
                Ok((id, info))
            })
            .collect::<AppResult<Vec<_>>>()?;
        Ok(crate::reads::paged(items, page))
    }

    /// Folds an identity of `tenant`, deciding `decide` on it and recording what it decided.
    async fn identity_command<T: Send>(
        &self,
        caller: &Caller,
        tenant: &TenantId,
        id: &IdentityId,
        decide: impl Fn(Option<&tenancy::IdentityRecord>, i64) -> Result<(Vec<tenancy::IdentityEvent>, T), Rejection>
        + Send
        + Sync,
    ) -> AppResult<Committed<T>> {
        let result = self
            .db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let decide = &decide;
                async move {
                    let (identity, version) = match rows::identity_aggregate(tx, id).await? {
                        Some((identity, version)) if identity.tenant_id == *tenant => (Some(identity), version),
                        _ => (None, 0),
                    };
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let (events, value) = decide(identity.as_ref(), now_ms)?;
                    let position =
                        record(tx, caller, id.as_str(), tenant, ExpectedVersion::Exact(version), events).await?;
                    Ok(Committed { value, position })
                }
                .scope_boxed()
            })
            .await;
        self.tenancy_recorded(result).await
    }

    /// Deletes an identity of `tenant`; its tokens stop working with it.
    pub async fn delete_identity(
        &self,
        caller: &Caller,
        tenant: &TenantId,
        id: &IdentityId,
    ) -> AppResult<Committed<()>> {
        self.needs_tenancy()?;
        self.identity_command(caller, tenant, id, |identity, now_ms| {
            Ok((tenancy::delete_identity(identity, id, now_ms)?, ()))
        })
        .await
    }

    /// Issues a bearer token to an identity of `tenant`; only its SHA-256 is kept. With an idempotency key
    /// the token's id is derived from it, and a retry is answered the same token, made again from the PKI
    /// bundle's key (without a bundle a retry is refused: the secret was shown once).
    pub async fn issue_token(
        &self,
        caller: &Caller,
        tenant: &TenantId,
        id: &IdentityId,
        idempotency_key: Option<&str>,
    ) -> AppResult<Committed<IssuedToken>> {
        self.needs_tenancy()?;
        let sealer = self.pki.as_ref().map(|bundle| bundle.sealer());
        let (token_id, secret) = match (idempotency_key, sealer) {
            (Some(key), Some(sealer)) => {
                let token_id = derived_token_id(tenant, id, key);
                let secret = derived_token(sealer, &token_id);
                (token_id, secret)
            }
            (Some(key), None) => (derived_token_id(tenant, id, key), crate::agents::new_secret("bct_")?.0),
            (None, _) => (TokenId::generate(), crate::agents::new_secret("bct_")?.0),
        };
        let sha256 = bc_domain::sha256_hex(&secret);
        let retry_answerable = sealer.is_some();
        self.identity_command(caller, tenant, id, |identity, now_ms| {
            if let Some(held) = identity.and_then(|i| i.tokens.iter().find(|t| t.token_id == token_id)) {
                if !retry_answerable || held.sha256 != sha256 {
                    return Err(Rejection::Conflict(format!(
                        "token {token_id} was already issued for this idempotency key, and its secret was shown once"
                    )));
                }
                let issued = IssuedToken {
                    id: token_id.clone(),
                    identity_id: id.clone(),
                    token: secret.clone(),
                    created_at_ms: held.at_ms,
                };
                return Ok((vec![], issued));
            }
            let events = tenancy::issue_token(identity, id, &token_id, &sha256, now_ms)?;
            let issued = IssuedToken {
                id: token_id.clone(),
                identity_id: id.clone(),
                token: secret.clone(),
                created_at_ms: now_ms,
            };
            Ok((events, issued))
        })
        .await
    }

    /// An identity's live tokens, without their secrets.
    pub async fn list_tokens(&self, tenant: &TenantId, id: &IdentityId) -> AppResult<Vec<TokenInfo>> {
        self.needs_tenancy()?;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let found = rows::identity_aggregate(&mut tx, id).await?;
        tx.commit().await?;
        match found {
            Some((identity, _)) if identity.tenant_id == *tenant && identity.deleted_at_ms.is_none() => {
                Ok(identity.tokens.into_iter().map(|t| TokenInfo { id: t.token_id, created_at_ms: t.at_ms }).collect())
            }
            _ => Err(Rejection::NotFound { kind: "identity", id: id.to_string() }.into()),
        }
    }

    /// Revokes one token of an identity of `tenant`.
    pub async fn revoke_token(
        &self,
        caller: &Caller,
        tenant: &TenantId,
        id: &IdentityId,
        token_id: &TokenId,
    ) -> AppResult<Committed<()>> {
        self.needs_tenancy()?;
        self.identity_command(caller, tenant, id, |identity, now_ms| {
            Ok((tenancy::revoke_token(identity, id, token_id, now_ms)?, ()))
        })
        .await
    }

    /// Grants `relation` on `pool` (or `*`) to `identity` (or `*`) of `tenant`.
    pub async fn create_grant(
        &self,
        caller: &Caller,
        tenant: &TenantId,
        identity: &str,
        pool: &str,
        relation: Relation,
    ) -> AppResult<Committed<GrantInfo>> {
        self.needs_tenancy()?;
        let ancestors = self.auth.tenant(tenant).map(|t| t.ancestors).unwrap_or_default();
        let grant_id = GrantId::generate();
        let identity_in_file = identity != "*"
            && tenancy::check_identity_name(identity).is_ok_and(|name| self.auth.file_identity(tenant, &name));
        let result = self
            .db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let (grant_id, ancestors) = (&grant_id, &ancestors);
                async move {
                    if rows::grant_count(tx, tenant).await? >= MAX_GRANTS_PER_TENANT {
                        return Err(Rejection::Conflict(format!(
                            "tenant {tenant} already holds {MAX_GRANTS_PER_TENANT} grants: revoke one first"
                        ))
                        .into());
                    }
                    let identity_known = identity_in_file
                        || (tenancy::check_identity_name(identity).is_ok()
                            && rows::identity_named(tx, tenant, identity).await?);
                    let pool_known = match pool.parse::<PoolId>() {
                        Ok(pool_id) => crate::auth::resolve::pool(tx, &pool_id).await?.is_some_and(|facts| {
                            facts.owner_tenant_id == *tenant
                                || facts
                                    .offers
                                    .iter()
                                    .any(|(t, descendants)| t == tenant || (*descendants && ancestors.contains(t)))
                        }),
                        Err(_) => false,
                    };
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = tenancy::create_grant(
                        grant_id,
                        tenant,
                        identity,
                        pool,
                        relation,
                        identity_known,
                        pool_known,
                        now_ms,
                    )?;
                    let position =
                        record(tx, caller, grant_id.as_str(), tenant, ExpectedVersion::NO_STREAM, events).await?;
                    let info = GrantInfo {
                        id: grant_id.clone(),
                        tenant_id: tenant.clone(),
                        identity: identity.to_owned(),
                        pool: pool.to_owned(),
                        relation,
                        created_at_ms: now_ms,
                    };
                    Ok(Committed { value: info, position })
                }
                .scope_boxed()
            })
            .await;
        self.tenancy_recorded(result).await
    }

    /// A page of a tenant's grants made through the API, by id.
    pub async fn list_grants(&self, tenant: &TenantId, page: &Page) -> AppResult<Listed<GrantInfo>> {
        self.needs_tenancy()?;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let found = rows::grants(&mut tx, tenant, page.after_key.as_deref(), i64::from(page.limit) + 1).await?;
        tx.commit().await?;
        let items = found
            .into_iter()
            .map(|(id, identity, pool, relation, created_at_ms)| {
                let info = GrantInfo {
                    id: rows::parse("pool_grants.id", &id)?,
                    tenant_id: tenant.clone(),
                    identity,
                    pool,
                    relation: rows::relation(&relation)?,
                    created_at_ms,
                };
                Ok((id, info))
            })
            .collect::<AppResult<Vec<_>>>()?;
        Ok(crate::reads::paged(items, page))
    }

    /// Revokes a grant of `tenant`.
    pub async fn revoke_grant(&self, caller: &Caller, tenant: &TenantId, id: &GrantId) -> AppResult<Committed<()>> {
        self.needs_tenancy()?;
        let result = self
            .db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                async move {
                    let (grant, version) = match rows::grant_aggregate(tx, id).await? {
                        Some((grant, version)) if grant.created.tenant_id == *tenant => (Some(grant), version),
                        _ => (None, 0),
                    };
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = tenancy::revoke_grant(grant.as_ref(), id, now_ms)?;
                    let position =
                        record(tx, caller, id.as_str(), tenant, ExpectedVersion::Exact(version), events).await?;
                    Ok(Committed { value: (), position })
                }
                .scope_boxed()
            })
            .await;
        self.tenancy_recorded(result).await
    }

    /// Sets an attribute limit on reservations in a pool the caller's tenant owns.
    pub async fn create_limit(
        &self,
        caller: &Caller,
        pool_id: &PoolId,
        relation: Relation,
        max_gpus: Option<u32>,
        max_hours: Option<u32>,
    ) -> AppResult<Committed<LimitInfo>> {
        self.needs_tenancy()?;
        let limit_id = LimitId::generate();
        let result = self
            .db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let limit_id = &limit_id;
                async move {
                    let pool = crate::fleet::owned_pool(tx, caller, pool_id).await?;
                    if rows::limit_count(tx, pool_id).await? >= MAX_LIMITS_PER_POOL {
                        return Err(Rejection::Conflict(format!(
                            "pool {pool_id} already has {MAX_LIMITS_PER_POOL} limits: delete one first"
                        ))
                        .into());
                    }
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let owner = &pool.owner_tenant_id;
                    let events =
                        tenancy::create_limit(limit_id, pool_id, owner, relation, max_gpus, max_hours, now_ms)?;
                    let position =
                        record(tx, caller, limit_id.as_str(), owner, ExpectedVersion::NO_STREAM, events).await?;
                    let info = LimitInfo {
                        id: limit_id.clone(),
                        pool_id: pool_id.clone(),
                        relation,
                        max_gpus,
                        max_hours,
                        created_at_ms: now_ms,
                    };
                    Ok(Committed { value: info, position })
                }
                .scope_boxed()
            })
            .await;
        self.tenancy_recorded(result).await
    }

    /// A page of a pool's limits made through the API, by id.
    pub async fn list_limits(&self, pool_id: &PoolId, page: &Page) -> AppResult<Listed<LimitInfo>> {
        self.needs_tenancy()?;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let found = rows::limits(&mut tx, pool_id, page.after_key.as_deref(), i64::from(page.limit) + 1).await?;
        tx.commit().await?;
        let items = found
            .into_iter()
            .map(|(id, relation, max_gpus, max_hours, created_at_ms)| {
                let info = LimitInfo {
                    id: rows::parse("attribute_limits.id", &id)?,
                    pool_id: pool_id.clone(),
                    relation: rows::relation(&relation)?,
                    max_gpus: max_gpus.map(|n| n.max(0) as u32),
                    max_hours: max_hours.map(|n| n.max(0) as u32),
                    created_at_ms,
                };
                Ok((id, info))
            })
            .collect::<AppResult<Vec<_>>>()?;
        Ok(crate::reads::paged(items, page))
    }

    /// Deletes a limit of a pool the caller's tenant owns.
    pub async fn delete_limit(&self, caller: &Caller, pool_id: &PoolId, id: &LimitId) -> AppResult<Committed<()>> {
        self.needs_tenancy()?;
        let result = self
            .db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                async move {
                    let pool = crate::fleet::owned_pool(tx, caller, pool_id).await?;
                    let (limit, version) = match rows::limit_aggregate(tx, id).await? {
                        Some((limit, version)) => (Some(limit), version),
                        None => (None, 0),
                    };
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = tenancy::delete_limit(limit.as_ref(), id, pool_id, now_ms)?;
                    let position =
                        record(tx, caller, id.as_str(), &pool.owner_tenant_id, ExpectedVersion::Exact(version), events)
                            .await?;
                    Ok(Committed { value: (), position })
                }
                .scope_boxed()
            })
            .await;
        self.tenancy_recorded(result).await
    }
}

/// A token's id for a request with an idempotency key: the same tenant, identity and key give the same id.
fn derived_token_id(tenant: &TenantId, identity: &IdentityId, key: &str) -> TokenId {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(format!("{tenant}\0{identity}\0{key}"));
    let mut first = [0u8; 16];
    first.copy_from_slice(&digest[..16]);
    let body = ulid::Ulid::from_bytes(first).to_string().to_ascii_lowercase();
    format!("tok_{body}").parse().expect("a ULID body is a valid token id")
}
