//! Commands on the fleet's structure: sites, pools, projects, offerings and quotas.

use bc_domain::Rejection;
use bc_domain::id::{PoolId, ProjectId, SiteId, TenantId};
use bc_domain::pool::{self, PoolAgent, PoolClass, PoolCommand, PoolCreated, PoolEvent, PoolPolicy, Quota, Sharing};
use bc_domain::site::{self, SiteKind};
use bc_eventstore::events::ExpectedVersion;
use bc_eventstore::{ScopedFutureExt as _, TxOptions, clock};

use super::store::{self, NamedTable};
use super::work::{self, WorkKey};
use super::{App, AppError, AppResult, Caller, Committed, record};

/// `sites.create`.
#[derive(Debug, Clone)]
pub struct CreateSite {
    pub name: String,
    pub iam_region: String,
    pub kind: SiteKind,
}

/// `pools.create`.
#[derive(Debug, Clone)]
pub struct CreatePool {
    pub site_id: SiteId,
    pub name: String,
    pub class: PoolClass,
    pub gpu_model: String,
    pub sharing: Sharing,
    pub agent: PoolAgent,
    pub policy: PoolPolicy,
    pub provider_account_id: Option<String>,
}

/// `pools.offer`: make the pool visible to a tenant with a quota per resource.
#[derive(Debug, Clone)]
pub struct OfferPool {
    pub tenant_id: TenantId,
    pub quota: Quota,
    pub priority: i32,
    pub include_descendants: bool,
}

/// A unique violation on a name is someone else creating the same name at the same moment.
fn name_race(err: AppError, what: &str, name: &str) -> AppError {
    err.on_unique_violation(|| format!("a {what} named {name:?} already exists"))
}

impl App {
    /// Creates a site owned by the caller's tenant.
    pub async fn create_site(&self, caller: &Caller, input: CreateSite) -> AppResult<Committed<SiteId>> {
        let site_id = SiteId::generate();
        let command = site::CreateSite {
            site_id: site_id.clone(),
            owner_tenant_id: caller.tenant_id.clone(),
            name: input.name.clone(),
            iam_region: input.iam_region.clone(),
            kind: input.kind,
            now_ms: 0,
        };
        // The input is checked before a query reads with it: PostgreSQL refuses a NUL in text.
        command.check()?;
        let result = self
            .db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let (input, site_id, command) = (&input, &site_id, &command);
                async move {
                    let name_taken =
                        store::name_taken(tx, NamedTable::Sites, caller.tenant_id.as_str(), &input.name).await?;
                    let command = site::CreateSite { now_ms: clock::compute_now_ms(tx).await?, ..command.clone() };
                    let events = site::create_site(&command, name_taken)?;
                    let stream = site_id.as_str();
                    let position =
                        record(tx, caller, stream, &caller.tenant_id, ExpectedVersion::NO_STREAM, events).await?;
                    Ok(Committed { value: site_id.clone(), position })
                }
                .scope_boxed()
            })
            .await;
        result.map_err(|err| name_race(err, "site", &input.name))
    }

    /// Creates a pool in one of the caller's sites.
    pub async fn create_pool(&self, caller: &Caller, input: CreatePool) -> AppResult<Committed<PoolId>> {
        let created = PoolCreated {
            pool_id: PoolId::generate(),
            site_id: input.site_id.clone(),
            owner_tenant_id: caller.tenant_id.clone(),
            name: input.name.clone(),
            class: input.class,
            gpu_model: input.gpu_model.clone(),
            sharing: input.sharing,
            agent: input.agent,
            policy: input.policy.clone(),
            provider_account_id: input.provider_account_id.clone(),
            at_ms: 0,
        };
        // The input is checked before a query reads with it: PostgreSQL refuses a NUL in text.
        created.check()?;
        let result = self
            .db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let (input, created) = (&input, &created);
                async move {
                    let created = PoolCreated { at_ms: clock::compute_now_ms(tx).await?, ..created.clone() };
                    let site_owner = store::site_owner(tx, input.site_id.as_str()).await?;
                    let provider_account_owned = match &input.provider_account_id {
                        Some(account) => store::providers::lock_owned(tx, caller.tenant_id.as_str(), account).await?,
                        None => false,
                    };
                    let facts = pool::CreationFacts {
                        site_owned: site_owner.as_deref() == Some(caller.tenant_id.as_str()),
                        name_taken: store::name_taken(tx, NamedTable::Pools, caller.tenant_id.as_str(), &input.name)
                            .await?,
                        provider_account_owned,
                    };
                    let events = pool::create(&created, facts)?;
                    let stream = created.pool_id.as_str();
                    let position =
                        record(tx, caller, stream, &caller.tenant_id, ExpectedVersion::NO_STREAM, events).await?;
                    Ok(Committed { value: created.pool_id, position })
                }
                .scope_boxed()
            })
            .await;
        result.map_err(|err| name_race(err, "pool", &input.name))
    }

    /// Creates a project in the caller's tenant.
    pub async fn create_project(&self, caller: &Caller, name: String) -> AppResult<Committed<ProjectId>> {
        let project_id = ProjectId::generate();
        // The name is checked before a query reads with it: PostgreSQL refuses a NUL in text.
        site::check_name("name", &name)?;
        let result = self
            .db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let (name, project_id) = (&name, &project_id);
                async move {
                    let name_taken =
                        store::name_taken(tx, NamedTable::Projects, caller.tenant_id.as_str(), name).await?;
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = site::create_project(project_id, &caller.tenant_id, name, name_taken, now_ms)?;
                    let stream = project_id.as_str();
                    let position =
                        record(tx, caller, stream, &caller.tenant_id, ExpectedVersion::NO_STREAM, events).await?;
                    Ok(Committed { value: project_id.clone(), position })
                }
                .scope_boxed()
            })
            .await;
        result.map_err(|err| name_race(err, "project", &name))
    }

    /// Deletes a site of the caller's tenant that holds no pools.
    pub async fn delete_site(&self, caller: &Caller, id: &SiteId) -> AppResult<Committed<()>> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                async move {
                    let (site, version) = match store::site_aggregate(tx, id).await? {
                        Some((site, version)) if site.created.owner_tenant_id == caller.tenant_id => {
                            (Some(site), version)
                        }
                        _ => (None, 0),
                    };
                    let pools = store::site_pool_count(tx, id).await?;
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = site::delete_site(site.as_ref(), pools.max(0) as u64, now_ms, id)?;
                    let position =
                        record(tx, caller, id.as_str(), &caller.tenant_id, ExpectedVersion::Exact(version), events)
                            .await?;
                    Ok(Committed { value: (), position })
                }
                .scope_boxed()
            })
            .await
    }

    /// A page of the caller's tenant's projects, by id.
    pub async fn list_projects(
        &self,
        caller: &Caller,
        page: &crate::reads::Page,
    ) -> AppResult<crate::reads::Listed<ProjectInfo>> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let rows =
            store::projects(&mut tx, &caller.tenant_id, page.after_key.as_deref(), i64::from(page.limit) + 1).await?;
        tx.commit().await?;
        let projects = rows
            .into_iter()
            .map(|(id, name, created_at_ms)| {
                let info = ProjectInfo {
                    id: id.parse().map_err(|err| store::corrupt("projects.id", err))?,
                    name,
                    created_at_ms,
                };
                Ok((id, info))
            })
            .collect::<AppResult<Vec<_>>>()?;
        Ok(crate::reads::paged(projects, page))
    }

    /// One project of the caller's tenant.
    pub async fn get_project(&self, caller: &Caller, id: &ProjectId) -> AppResult<ProjectInfo> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let found = store::project_aggregate(&mut tx, id).await?;
        tx.commit().await?;
        match found {
            Some((project, _)) if project.tenant_id == caller.tenant_id && project.deleted_at_ms.is_none() => {
                Ok(ProjectInfo { id: project.project_id, name: project.name, created_at_ms: project.at_ms })
            }
            _ => Err(Rejection::NotFound { kind: "project", id: id.to_string() }.into()),
        }
    }

    /// Deletes a project of the caller's tenant whose reservations have all ended; answers it as it was.
    pub async fn delete_project(&self, caller: &Caller, id: &ProjectId) -> AppResult<Committed<ProjectInfo>> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                async move {
                    let found = store::project_aggregate(tx, id).await?;
                    let (project, version) = match found {
                        Some((project, version)) if project.tenant_id == caller.tenant_id => (Some(project), version),
                        _ => (None, 0),
                    };
                    let live = store::live_reservations_of_project(tx, id).await?;
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = site::delete_project(project.as_ref(), live.max(0) as u64, now_ms, id)?;
                    let position =
                        record(tx, caller, id.as_str(), &caller.tenant_id, ExpectedVersion::Exact(version), events)
                            .await?;
                    // The decision above refused a missing or deleted project.
                    let project = project.ok_or_else(|| Rejection::NotFound { kind: "project", id: id.to_string() })?;
                    let value =
                        ProjectInfo { id: project.project_id, name: project.name, created_at_ms: project.at_ms };
                    Ok(Committed { value, position })
                }
                .scope_boxed()
            })
            .await
    }

    /// Offers a pool the caller owns to another tenant (or replaces the offer), with a quota per resource.
    pub async fn offer_pool(&self, caller: &Caller, pool_id: &PoolId, offer: OfferPool) -> AppResult<Committed<()>> {
        self.pool_command(caller, pool_id, |now_ms| PoolCommand::Offer {
            tenant_id: offer.tenant_id.clone(),
            quota: offer.quota.clone(),
            priority: offer.priority,
            include_descendants: offer.include_descendants,
            now_ms,
        })
        .await
    }

    /// Changes a pool's name, policy or (while it has no nodes) sharing mode.
    pub async fn update_pool(
        &self,
        caller: &Caller,
        pool_id: &PoolId,
        change: pool::PoolChange,
    ) -> AppResult<Committed<()>> {
        if let Some(name) = &change.name {
            // Checked before a query reads with it: PostgreSQL refuses a NUL in text.
            site::check_name("name", name)?;
        }
        self.pool_command(caller, pool_id, |now_ms| PoolCommand::Update {
            change: change.clone(),
            facts: pool::UpdateFacts::default(),
            now_ms,
        })
        .await
        .map_err(|err| name_race(err, "pool", change.name.as_deref().unwrap_or_default()))
    }

    /// Deletes a pool with no nodes and no reservations that have not ended.
    pub async fn delete_pool(&self, caller: &Caller, pool_id: &PoolId) -> AppResult<Committed<()>> {
        self.pool_command(caller, pool_id, |now_ms| PoolCommand::Delete { facts: pool::UpdateFacts::default(), now_ms })
            .await
    }

    /// Withdraws an offering: the tenant no longer sees the pool or reserves in it; what it reserved already
    /// keeps running.
    pub async fn revoke_offer(
        &self,
        caller: &Caller,
        pool_id: &PoolId,
        tenant_id: &TenantId,
    ) -> AppResult<Committed<()>> {
        self.pool_command(caller, pool_id, |now_ms| PoolCommand::RevokeOffer { tenant_id: tenant_id.clone(), now_ms })
            .await
    }

    /// Replaces the quota of an existing offering. Lowering it keeps existing reservations.
    pub async fn set_quota(
        &self,
        caller: &Caller,
        pool_id: &PoolId,
        tenant_id: &TenantId,
        quota: Quota,
    ) -> AppResult<Committed<()>> {
        self.pool_command(caller, pool_id, |now_ms| PoolCommand::SetQuota {
            tenant_id: tenant_id.clone(),
            quota: quota.clone(),
            now_ms,
        })
        .await
    }

    /// Decides a command on a pool the caller owns, on the fold of its stream, and records what it decided.
    async fn pool_command(
        &self,
        caller: &Caller,
        pool_id: &PoolId,
        command: impl Fn(i64) -> PoolCommand + Send + Sync,
    ) -> AppResult<Committed<()>> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let command = &command;
                async move {
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let (pool, version) = match store::pool_aggregate(tx, pool_id).await? {
                        Some((pool, version))
                            if pool.owner_tenant_id == caller.tenant_id && pool.deleted_at_ms.is_none() =>
                        {
                            (pool, version)
                        }
                        _ => return Err(Rejection::NotFound { kind: "pool", id: pool_id.to_string() }.into()),
                    };
                    let command = with_facts(tx, caller, pool_id, command(now_ms)).await?;
                    let events = pool::decide(&pool, &command)?;
                    record_quota_change(tx, caller, &pool, version, events).await
                }
                .scope_boxed()
            })
            .await
    }
}

/// The command with the facts read for it: only updates and deletions need them, so offers and quota changes
/// read nothing more.
async fn with_facts(
    tx: &mut bc_eventstore::Tx,
    caller: &Caller,
    pool_id: &PoolId,
    command: PoolCommand,
) -> AppResult<PoolCommand> {
    let (change, now_ms, delete) = match command {
        PoolCommand::Update { change, now_ms, .. } => (change, now_ms, false),
        PoolCommand::Delete { now_ms, .. } => (pool::PoolChange::default(), now_ms, true),
        other => return Ok(other),
    };
    let name_taken = match &change.name {
        Some(name) => store::name_taken(tx, NamedTable::Pools, caller.tenant_id.as_str(), name).await?,
        None => false,
    };
    let nodes = if delete || change.sharing.is_some() || change.policy.is_some() {
        store::pool_node_count(tx, pool_id).await?.max(0)
    } else {
        0
    };
    let live = if delete { store::live_reservations_of_pool(tx, pool_id).await?.max(0) } else { 0 };
    let facts = pool::UpdateFacts { name_taken, nodes: nodes as u64, live_reservations: live as u64 };
    Ok(if delete { PoolCommand::Delete { facts, now_ms } } else { PoolCommand::Update { change, facts, now_ms } })
}

/// Records an offering or quota change on the pool's stream, and wakes the pool's pending reservations, which a
/// raised quota may let through.
async fn record_quota_change(
    tx: &mut bc_eventstore::Tx,
    caller: &Caller,
    pool: &pool::Pool,
    version: u32,
    events: Vec<PoolEvent>,
) -> AppResult<Committed<()>> {
    let expected = ExpectedVersion::Exact(version);
    let position = record(tx, caller, pool.id.as_str(), &pool.owner_tenant_id, expected, events).await?;
    work::wake_now(tx, &WorkKey::pool_pending(&pool.id)).await?;
    Ok(Committed { value: (), position })
}

/// The pool, if the caller's tenant owns it; `NOT_FOUND` otherwise, revealing nothing about other tenants' pools.
pub(crate) async fn owned_pool(
    tx: &mut bc_eventstore::Tx,
    caller: &Caller,
    pool_id: &PoolId,
) -> AppResult<store::PoolRow> {
    match store::pool(tx, pool_id).await? {
        Some(pool) if pool.owner_tenant_id == caller.tenant_id => Ok(pool),
        _ => Err(Rejection::NotFound { kind: "pool", id: pool_id.to_string() }.into()),
    }
}

/// A project as its tenant lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectInfo {
    pub id: ProjectId,
    pub name: String,
    pub created_at_ms: i64,
}
