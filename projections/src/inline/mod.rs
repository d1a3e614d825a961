//! Inline projections: the capacity tables, updated from each event in the transaction that appends it.
//!
//! `apply` is a pure function of the events: it never reads the clock; every time it writes comes from a
//! payload. Statements name tables without a schema, so a rebuild can run the same code against a scratch
//! schema by putting it first on the `search_path`.

pub mod bulk;

use bc_domain::device::Device;
use bc_domain::event::DomainEvent;
use bc_domain::flavor::FlavorEvent;
use bc_domain::hardware::{HardwareKey, Identifier};
use bc_domain::image::ImageEvent;
use bc_domain::instance::{InstanceEvent, evolve_instance};
use bc_domain::node::{
    Adapter, Condition, ConditionType, Connectivity, NodeEvent, ProvisionState, Role, SchedulingView, Trust,
    schedulability,
};
use bc_domain::pool::PoolEvent;
use bc_domain::profile::ProfileEvent;
use bc_domain::provider::ProviderAccountEvent;
use bc_domain::reservation::{Allocation, ReservationEvent, ReservationState};
use bc_domain::site::{ProjectEvent, SiteEvent};
use bc_domain::stream::AnyEvent;
use bc_domain::tenancy::{GrantEvent, IdentityEvent, LimitEvent, TenantEvent};
use bc_domain::webhook::WebhookEvent;
use bc_domain::workflow::WorkflowEvent;
use bc_eventstore::{Error, Result, Tx, sql};
use sqlx::Row as _;

/// The tables the inline projections own, in the order a rebuild creates and compares them.
pub const TABLES: &[&str] = &[
    "sites",
    "projects",
    "pools",
    "pool_offers",
    "nodes",
    "node_identifiers",
    "devices",
    "node_resources",
    "reservations",
    "allocations",
    "device_bookings",
    "scalar_bookings",
    "tenants",
    "identities",
    "identity_tokens",
    "pool_grants",
    "attribute_limits",
    "images",
    "profiles",
    "node_bmcs",
    "workflows",
    "workflow_steps",
    "provider_accounts",
    "flavors",
    "instances",
    "webhooks",
];

fn json(value: &impl serde::Serialize) -> Result<String> {
    serde_json::to_string(value).map_err(|err| Error::Internal(format!("encode a projection column: {err}")))
}

fn text<T: serde::Serialize>(value: &T) -> Result<String> {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => Ok(s),
        other => Err(Error::Internal(format!("expected a string enum, got {other:?}"))),
    }
}

/// Applies one event of stream `stream_id` to the inline tables.
pub async fn apply(tx: &mut Tx, stream_id: &str, event: &AnyEvent) -> Result<()> {
    match event {
        AnyEvent::Site(e) => apply_site(tx, e).await,
        AnyEvent::Project(e) => apply_project(tx, e).await,
        AnyEvent::Pool(e) => apply_pool(tx, e).await,
        AnyEvent::Node(e) => apply_node(tx, e).await,
        AnyEvent::Reservation(e) => apply_reservation(tx, stream_id, e).await,
        AnyEvent::Tenant(e) => apply_tenant(tx, e).await,
        AnyEvent::Identity(e) => apply_identity(tx, e).await,
        AnyEvent::Grant(e) => apply_grant(tx, e).await,
        AnyEvent::Limit(e) => apply_limit(tx, e).await,
        AnyEvent::Image(e) => apply_image(tx, e).await,
        AnyEvent::Profile(e) => apply_profile(tx, e).await,
        AnyEvent::Workflow(e) => apply_workflow(tx, e).await,
        AnyEvent::ProviderAccount(e) => apply_provider_account(tx, e).await,
        AnyEvent::Flavor(e) => apply_flavor(tx, e).await,
        AnyEvent::Instance(e) => apply_instance(tx, e).await,
        AnyEvent::Webhook(e) => apply_webhook(tx, e).await,
    }
}

/// An instance's row holds its fold (`doc`): each later event is folded onto the row's.
async fn apply_instance(tx: &mut Tx, event: &InstanceEvent) -> Result<()> {
    let (before, at_ms) = match event {
        InstanceEvent::Created(e) => (None, e.at_ms),
        InstanceEvent::DesiredChanged(bc_domain::instance::InstanceDesiredChanged { instance_id, at_ms, .. })
        | InstanceEvent::Observed(bc_domain::instance::InstanceObserved { instance_id, at_ms, .. })
        | InstanceEvent::Ended(bc_domain::instance::InstanceEnded { instance_id, at_ms, .. }) => {
            let doc: Option<String> = sql::query_scalar("SELECT doc::text FROM instances WHERE id = $1")
                .bind(instance_id.as_str())
                .fetch_optional(tx.conn())
                .await?;
            let Some(doc) = doc else {
                return Err(Error::Internal(format!(
                    "{} for instance {instance_id}, which has no row",
                    event.event_type()
                )));
            };
            let before = serde_json::from_str(&doc)
                .map_err(|err| Error::Internal(format!("instances.doc of {instance_id}: {err}")))?;
            (Some(before), *at_ms)
        }
    };
    let Some(i) = evolve_instance(before, event) else { return Ok(()) };
    sql::query(
        "INSERT INTO instances (id, tenant_id, reservation_id, pool_id, desired, state, doc, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, ms_ts($8))
         ON CONFLICT (id) DO UPDATE SET desired = EXCLUDED.desired, state = EXCLUDED.state, doc = EXCLUDED.doc,
                                        updated_at = EXCLUDED.updated_at",
    )
    .bind(i.created.instance_id.as_str())
    .bind(i.created.tenant_id.as_str())
    .bind(i.created.reservation_id.as_str())
    .bind(i.created.spec.pool_id.as_str())
    .bind(i.desired.as_str())
    .bind(i.state.as_str())
    .bind(json(&i)?)
    .bind(at_ms)
    .execute(tx.conn())
    .await?;
    Ok(())
}

async fn apply_flavor(tx: &mut Tx, event: &FlavorEvent) -> Result<()> {
    match event {
        FlavorEvent::Created(e) => {
            sql::query(
                "INSERT INTO flavors (id, tenant_id, name, vcpu, memory_gib, gpus, disk_gib, visibility, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, ms_ts($9))",
            )
            .bind(e.flavor_id.as_str())
            .bind(e.tenant_id.as_str())
            .bind(&e.name)
            .bind(i64::from(e.sizes.vcpu))
            .bind(i64::from(e.sizes.memory_gib))
            .bind(i64::from(e.sizes.gpus))
            .bind(i64::from(e.sizes.disk))
            .bind(e.visibility.as_str())
            .bind(e.at_ms)
            .execute(tx.conn())
            .await?;
        }
        FlavorEvent::Deleted(e) => {
            sql::query("DELETE FROM flavors WHERE id = $1").bind(e.flavor_id.as_str()).execute(tx.conn()).await?;
        }
    }
    Ok(())
}

/// A subscription's row: what it asks for; its secret is a sealed secret, its deliveries runtime rows.
async fn apply_webhook(tx: &mut Tx, event: &WebhookEvent) -> Result<()> {
    match event {
        WebhookEvent::Created(e) => {
            sql::query(
                "INSERT INTO webhooks (id, tenant_id, url, event_types, description, created_at, secret_at)
                 VALUES ($1, $2, $3, $4::jsonb, $5, ms_ts($6), ms_ts($6))",
            )
            .bind(e.webhook_id.as_str())
            .bind(e.tenant_id.as_str())
            .bind(&e.spec.url)
            .bind(json(&e.spec.event_types)?)
            .bind(&e.spec.description)
            .bind(e.at_ms)
            .execute(tx.conn())
            .await?;
        }
        WebhookEvent::SecretRotated(e) => {
            sql::query("UPDATE webhooks SET secret_at = ms_ts($2) WHERE id = $1")
                .bind(e.webhook_id.as_str())
                .bind(e.at_ms)
                .execute(tx.conn())
                .await?;
        }
        WebhookEvent::DeadLettersReplayed(_) => {}
        WebhookEvent::Deleted(e) => {
            sql::query("DELETE FROM webhooks WHERE id = $1").bind(e.webhook_id.as_str()).execute(tx.conn()).await?;
        }
    }
    Ok(())
}

async fn apply_provider_account(tx: &mut Tx, event: &ProviderAccountEvent) -> Result<()> {
    match event {
        ProviderAccountEvent::Created(e) => {
            sql::query(
                "INSERT INTO provider_accounts (id, tenant_id, name, provider, endpoint, settings, created_at,
                                                credential_at)
                 VALUES ($1, $2, $3, $4, $5, $6::jsonb, ms_ts($7), ms_ts($7))",
            )
            .bind(e.account_id.as_str())
            .bind(e.tenant_id.as_str())
            .bind(&e.spec.name)
            .bind(e.spec.provider.as_str())
            .bind(&e.spec.endpoint)
            .bind(json(&e.spec.settings)?)
            .bind(e.at_ms)
            .execute(tx.conn())
            .await?;
        }
        ProviderAccountEvent::CredentialRotated(e) => {
            sql::query("UPDATE provider_accounts SET credential_at = ms_ts($2) WHERE id = $1")
                .bind(e.account_id.as_str())
                .bind(e.at_ms)
                .execute(tx.conn())
                .await?;
        }
        ProviderAccountEvent::Deleted(e) => {
            sql::query("DELETE FROM provider_accounts WHERE id = $1")
                .bind(e.account_id.as_str())
                .execute(tx.conn())
                .await?;
        }
    }
    Ok(())
}

async fn apply_tenant(tx: &mut Tx, event: &TenantEvent) -> Result<()> {
    match event {
        TenantEvent::Created(e) => {
            sql::query(
                "INSERT INTO tenants (id, parent_id, name, state, created_at) VALUES ($1, $2, $3, 'active', ms_ts($4))",
            )
            .bind(e.tenant_id.as_str())
            .bind(e.parent_id.as_str())
            .bind(&e.name)
            .bind(e.at_ms)
            .execute(tx.conn())
            .await?;
        }
        TenantEvent::Suspended(e) => {
            sql::query("UPDATE tenants SET state = 'suspended', suspended_reason = $2 WHERE id = $1")
                .bind(e.tenant_id.as_str())
                .bind(&e.reason)
                .execute(tx.conn())
                .await?;
        }
        TenantEvent::Resumed(e) => {
            sql::query("UPDATE tenants SET state = 'active', suspended_reason = NULL WHERE id = $1")
                .bind(e.tenant_id.as_str())
                .execute(tx.conn())
                .await?;
        }
    }
    Ok(())
}

async fn apply_identity(tx: &mut Tx, event: &IdentityEvent) -> Result<()> {
    match event {
        IdentityEvent::Created(e) => {
            sql::query(
                "INSERT INTO identities (id, tenant_id, name, kind, admin, created_at)
                 VALUES ($1, $2, $3, $4, $5, ms_ts($6))",
            )
            .bind(e.identity_id.as_str())
            .bind(e.tenant_id.as_str())
            .bind(e.name.as_str())
            .bind(e.kind.as_str())
            .bind(e.admin)
            .bind(e.at_ms)
            .execute(tx.conn())
            .await?;
        }
        IdentityEvent::TokenIssued(e) => {
            sql::query(
                "INSERT INTO identity_tokens (id, identity_id, tenant_id, sha256, created_at)
                 VALUES ($1, $2, $3, $4, ms_ts($5))",
            )
            .bind(e.token_id.as_str())
            .bind(e.identity_id.as_str())
            .bind(e.tenant_id.as_str())
            .bind(&e.sha256)
            .bind(e.at_ms)
            .execute(tx.conn())
            .await?;
        }
        IdentityEvent::TokenRevoked(e) => {
            sql::query("DELETE FROM identity_tokens WHERE id = $1")
                .bind(e.token_id.as_str())
                .execute(tx.conn())
                .await?;
        }
        IdentityEvent::Deleted(e) => {
            sql::query("DELETE FROM identity_tokens WHERE identity_id = $1")
                .bind(e.identity_id.as_str())
                .execute(tx.conn())
                .await?;
            sql::query("DELETE FROM identities WHERE id = $1").bind(e.identity_id.as_str()).execute(tx.conn()).await?;
        }
    }
    Ok(())
}

async fn apply_grant(tx: &mut Tx, event: &GrantEvent) -> Result<()> {
    match event {
        GrantEvent::Created(e) => {
            sql::query(
                "INSERT INTO pool_grants (id, tenant_id, identity, pool, relation, created_at)
                 VALUES ($1, $2, $3, $4, $5, ms_ts($6))",
            )
            .bind(e.grant_id.as_str())
            .bind(e.tenant_id.as_str())
            .bind(&e.identity)
            .bind(&e.pool)
            .bind(e.relation.as_str())
            .bind(e.at_ms)
            .execute(tx.conn())
            .await?;
        }
        GrantEvent::Revoked(e) => {
            sql::query("DELETE FROM pool_grants WHERE id = $1").bind(e.grant_id.as_str()).execute(tx.conn()).await?;
        }
    }
    Ok(())
}

async fn apply_limit(tx: &mut Tx, event: &LimitEvent) -> Result<()> {
    match event {
        LimitEvent::Created(e) => {
            sql::query(
                "INSERT INTO attribute_limits (id, pool_id, owner_tenant_id, relation, max_gpus, max_hours, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, ms_ts($7))",
            )
            .bind(e.limit_id.as_str())
            .bind(e.pool_id.as_str())
            .bind(e.owner_tenant_id.as_str())
            .bind(e.relation.as_str())
            .bind(e.max_gpus.map(|n| n as i32))
            .bind(e.max_hours.map(|n| n as i32))
            .bind(e.at_ms)
            .execute(tx.conn())
            .await?;
        }
        LimitEvent::Deleted(e) => {
            sql::query("DELETE FROM attribute_limits WHERE id = $1")
                .bind(e.limit_id.as_str())
                .execute(tx.conn())
                .await?;
        }
    }
    Ok(())
}

async fn apply_image(tx: &mut Tx, event: &ImageEvent) -> Result<()> {
    match event {
        ImageEvent::Created(e) => {
            sql::query(
                "INSERT INTO images (id, tenant_id, name, version, format, sha256, size_bytes, visibility, signer,
                                     signature, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, ms_ts($11))",
            )
            .bind(e.image_id.as_str())
            .bind(e.tenant_id.as_str())
            .bind(&e.name)
            .bind(&e.version)
            .bind(e.format.as_str())
            .bind(&e.sha256)
            .bind(i64::try_from(e.size_bytes).map_err(|_| Error::Internal("an image's size overflows".into()))?)
            .bind(e.visibility.as_str())
            .bind(e.signed.as_ref().map(|s| s.signer.as_str()))
            .bind(e.signed.as_ref().map(|s| s.signature.as_str()))
            .bind(e.at_ms)
            .execute(tx.conn())
            .await?;
        }
        ImageEvent::Deleted(e) => {
            sql::query("DELETE FROM images WHERE id = $1").bind(e.image_id.as_str()).execute(tx.conn()).await?;
        }
    }
    Ok(())
}

async fn apply_profile(tx: &mut Tx, event: &ProfileEvent) -> Result<()> {
    match event {
        ProfileEvent::Created(e) => {
            sql::query(
                "INSERT INTO profiles (id, tenant_id, name, version, target, image_id, spec, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, ms_ts($8))",
            )
            .bind(e.profile_id.as_str())
            .bind(e.tenant_id.as_str())
            .bind(&e.name)
            .bind(i32::try_from(e.version).map_err(|_| Error::Internal("a profile's version overflows".into()))?)
            .bind(text(&e.spec.target)?)
            .bind(e.spec.image_id.as_ref().map(|i| i.as_str()))
            .bind(json(&e.spec)?)
            .bind(e.at_ms)
            .execute(tx.conn())
            .await?;
        }
        ProfileEvent::Deleted(e) => {
            sql::query("UPDATE profiles SET deleted_at = ms_ts($2) WHERE id = $1")
                .bind(e.profile_id.as_str())
                .bind(e.at_ms)
                .execute(tx.conn())
                .await?;
        }
    }
    Ok(())
}

/// An attempt of a workflow step ended (`succeeded` or `failed`), with its detail or error.
async fn end_step(
    tx: &mut Tx,
    workflow_id: &str,
    index: u32,
    attempt: u32,
    state: &str,
    detail: Option<&str>,
    at_ms: i64,
) -> Result<()> {
    sql::query(
        "UPDATE workflow_steps SET state = $3, attempt = $4, ended_at = ms_ts($5), deadline = NULL, detail = $6
         WHERE workflow_id = $1 AND index = $2",
    )
    .bind(workflow_id)
    .bind(index as i32)
    .bind(state)
    .bind(attempt as i32)
    .bind(at_ms)
    .bind(detail)
    .execute(tx.conn())
    .await?;
    Ok(())
}

async fn apply_workflow(tx: &mut Tx, event: &WorkflowEvent) -> Result<()> {
    match event {
        WorkflowEvent::Created(e) => {
            sql::query(
                "INSERT INTO workflows (id, tenant_id, node_id, kind, profile_id, created_at, reservation_id)
                 VALUES ($1, $2, $3, $4, $5, ms_ts($6), $7)",
            )
            .bind(e.workflow_id.as_str())
            .bind(e.tenant_id.as_str())
            .bind(e.node_id.as_str())
            .bind(e.kind.as_str())
            .bind(e.profile_id.as_ref().map(|p| p.as_str()))
            .bind(e.at_ms)
            .bind(e.reservation_id.as_ref().map(|r| r.as_str()))
            .execute(tx.conn())
            .await?;
            for (index, s) in e.steps.iter().enumerate() {
                sql::query(
                    "INSERT INTO workflow_steps (workflow_id, index, name, action, runs_on, timeout_s, attempts, state)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending')",
                )
                .bind(e.workflow_id.as_str())
                .bind(index as i32)
                .bind(&s.name)
                .bind(text(&s.action)?)
                .bind(s.runs_on.as_str())
                .bind(s.timeout_s as i32)
                .bind(s.attempts as i32)
                .execute(tx.conn())
                .await?;
            }
        }
        WorkflowEvent::StepStarted(e) => {
            sql::query(
                "UPDATE workflow_steps SET state = 'running', attempt = $3, started_at = ms_ts($4),
                     deadline = ms_ts($5), ended_at = NULL, detail = NULL
                 WHERE workflow_id = $1 AND index = $2",
            )
            .bind(e.workflow_id.as_str())
            .bind(e.index as i32)
            .bind(e.attempt as i32)
            .bind(e.at_ms)
            .bind(e.deadline_ms)
            .execute(tx.conn())
            .await?;
        }
        WorkflowEvent::StepSucceeded(e) => {
            let detail = e.detail.as_deref();
            end_step(tx, e.workflow_id.as_str(), e.index, e.attempt, "succeeded", detail, e.at_ms).await?;
        }
        WorkflowEvent::StepFailed(e) => {
            end_step(tx, e.workflow_id.as_str(), e.index, e.attempt, "failed", Some(&e.error), e.at_ms).await?;
        }
        WorkflowEvent::Succeeded(e) | WorkflowEvent::Failed(e) | WorkflowEvent::Cancelled(e) => {
            let outcome = match event {
                WorkflowEvent::Succeeded(_) => "succeeded",
                WorkflowEvent::Failed(_) => "failed",
                _ => "cancelled",
            };
            sql::query("UPDATE workflows SET outcome = $2, reason = $3, ended_at = ms_ts($4) WHERE id = $1")
                .bind(e.workflow_id.as_str())
                .bind(outcome)
                .bind(e.reason.as_deref())
                .bind(e.at_ms)
                .execute(tx.conn())
                .await?;
        }
    }
    Ok(())
}

async fn apply_site(tx: &mut Tx, event: &SiteEvent) -> Result<()> {
    match event {
        SiteEvent::Created(e) => {
            sql::query(
                "INSERT INTO sites (id, owner_tenant_id, name, iam_region, kind, created_at)
                 VALUES ($1, $2, $3, $4, $5, ms_ts($6))",
            )
            .bind(e.site_id.as_str())
            .bind(e.owner_tenant_id.as_str())
            .bind(&e.name)
            .bind(e.iam_region.as_str())
            .bind(e.kind.as_str())
            .bind(e.at_ms)
            .execute(tx.conn())
            .await?;
        }
        SiteEvent::Deleted(e) => {
            sql::query("DELETE FROM sites WHERE id = $1").bind(e.site_id.as_str()).execute(tx.conn()).await?;
        }
    }
    Ok(())
}

async fn apply_project(tx: &mut Tx, event: &ProjectEvent) -> Result<()> {
    match event {
        ProjectEvent::Created(e) => {
            sql::query("INSERT INTO projects (id, tenant_id, name, created_at) VALUES ($1, $2, $3, ms_ts($4))")
                .bind(e.project_id.as_str())
                .bind(e.tenant_id.as_str())
                .bind(&e.name)
                .bind(e.at_ms)
                .execute(tx.conn())
                .await?;
        }
        ProjectEvent::Deleted(e) => {
            sql::query("DELETE FROM projects WHERE id = $1").bind(e.project_id.as_str()).execute(tx.conn()).await?;
        }
    }
    Ok(())
}

async fn apply_pool(tx: &mut Tx, event: &PoolEvent) -> Result<()> {
    match event {
        PoolEvent::Created(e) => {
            sql::query(
                "INSERT INTO pools (id, site_id, owner_tenant_id, name, class, gpu_model, sharing, agent, policy,
                                    provider_account_id, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10, ms_ts($11))",
            )
            .bind(e.pool_id.as_str())
            .bind(e.site_id.as_str())
            .bind(e.owner_tenant_id.as_str())
            .bind(&e.name)
            .bind(text(&e.class)?)
            .bind(&e.gpu_model)
            .bind(e.sharing.as_str())
            .bind(text(&e.agent)?)
            .bind(json(&e.policy)?)
            .bind(e.provider_account_id.as_deref())
            .bind(e.at_ms)
            .execute(tx.conn())
            .await?;
        }
        PoolEvent::Offered(e) => {
            sql::query(
                "INSERT INTO pool_offers (pool_id, tenant_id, quota, priority, include_descendants, updated_at)
                 VALUES ($1, $2, $3::jsonb, $4, $5, ms_ts($6))
                 ON CONFLICT (pool_id, tenant_id) DO UPDATE
                     SET quota = excluded.quota, priority = excluded.priority,
                         include_descendants = excluded.include_descendants, updated_at = excluded.updated_at",
            )
            .bind(e.pool_id.as_str())
            .bind(e.tenant_id.as_str())
            .bind(json(&e.quota)?)
            .bind(e.priority)
            .bind(e.include_descendants)
            .bind(e.at_ms)
            .execute(tx.conn())
            .await?;
        }
        PoolEvent::JoinTokenIssued(_) | PoolEvent::JoinTokenRevoked(_) => {}
        PoolEvent::Updated(e) => {
            let policy = e.policy.as_ref().map(json).transpose()?;
            sql::query(
                "UPDATE pools SET name = coalesce($2, name), policy = coalesce($3::jsonb, policy),
                                  sharing = coalesce($4, sharing)
                 WHERE id = $1",
            )
            .bind(e.pool_id.as_str())
            .bind(e.name.as_deref())
            .bind(policy)
            .bind(e.sharing.map(|s| s.as_str()))
            .execute(tx.conn())
            .await?;
        }
        PoolEvent::Deleted(e) => {
            for statement in ["DELETE FROM pool_offers WHERE pool_id = $1", "DELETE FROM pools WHERE id = $1"] {
                sql::query(statement).bind(e.pool_id.as_str()).execute(tx.conn()).await?;
            }
        }
        PoolEvent::OfferRevoked(e) => {
            sql::query("DELETE FROM pool_offers WHERE pool_id = $1 AND tenant_id = $2")
                .bind(e.pool_id.as_str())
                .bind(e.tenant_id.as_str())
                .execute(tx.conn())
                .await?;
        }
        PoolEvent::QuotaSet(e) => {
            sql::query(
                "UPDATE pool_offers SET quota = $3::jsonb, updated_at = ms_ts($4) WHERE pool_id = $1 AND tenant_id = $2",
            )
            .bind(e.pool_id.as_str())
            .bind(e.tenant_id.as_str())
            .bind(json(&e.quota)?)
            .bind(e.at_ms)
            .execute(tx.conn())
            .await?;
        }
    }
    Ok(())
}

/// The columns a new node row starts with, from `node.registered` or `node.joined`.
struct NewNode<'a> {
    node_id: &'a str,
    pool_id: &'a str,
    site_id: &'a str,
    owner_tenant_id: Option<&'a str>,
    name: &'a str,
    role: &'a Role,
    trust: &'a Trust,
    adapter: &'a Adapter,
    provision_state: &'a ProvisionState,
    connectivity: &'a Connectivity,
    conditions: &'a [Condition],
    generation: u64,
    observed_generation: u64,
    at_ms: i64,
}

async fn insert_node(tx: &mut Tx, node: NewNode<'_>) -> Result<()> {
    let reasons = bc_domain::node::no_schedule_reasons(node.conditions);
    sql::query(
        "INSERT INTO nodes (id, pool_id, site_id, owner_tenant_id, name, role, trust, adapter, provision_state,
                            connectivity, conditions, no_schedule_reasons, generation, observed_generation,
                            schedulable, registered_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::jsonb, $12, $13, $14, false, ms_ts($15))",
    )
    .bind(node.node_id)
    .bind(node.pool_id)
    .bind(node.site_id)
    .bind(node.owner_tenant_id)
    .bind(node.name)
    .bind(text(node.role)?)
    .bind(text(node.trust)?)
    .bind(text(node.adapter)?)
    .bind(text(node.provision_state)?)
    .bind(text(node.connectivity)?)
    .bind(json(&node.conditions)?)
    .bind(&reasons)
    .bind(node.generation as i64)
    .bind(node.observed_generation as i64)
    .bind(node.at_ms)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// Inserts a node's devices, or updates the ones it already has; the node's free-capacity summary follows.
async fn upsert_devices(tx: &mut Tx, node_id: &str, pool_id: &str, devices: &[Device]) -> Result<()> {
    let mut ids = Vec::with_capacity(devices.len());
    let mut classes = Vec::with_capacity(devices.len());
    let mut parents = Vec::with_capacity(devices.len());
    let mut bookable = Vec::with_capacity(devices.len());
    let mut models = Vec::with_capacity(devices.len());
    let mut products = Vec::with_capacity(devices.len());
    let mut attributes = Vec::with_capacity(devices.len());
    for device in devices {
        ids.push(device.id.as_str());
        classes.push(device.class.as_str());
        parents.push(device.parent.as_ref().map(|p| p.as_str()));
        bookable.push(device.bookable);
        models.push(device.gpu_model.as_str());
        products.push(device.gpu_product.as_str());
        attributes.push(json(&device.attributes)?);
    }
    sql::query(
        "INSERT INTO devices (id, node_id, pool_id, class, parent_id, bookable, gpu_model, gpu_product, attributes)
         SELECT u.id, $1, $2, u.class, u.parent_id, u.bookable, u.gpu_model, u.gpu_product, u.attributes::jsonb
         FROM unnest($3::text[], $4::text[], $5::text[], $6::bool[], $7::text[], $8::text[], $9::text[])
              AS u(id, class, parent_id, bookable, gpu_model, gpu_product, attributes)
         ORDER BY u.id
         ON CONFLICT (id) DO UPDATE
             SET class = excluded.class, parent_id = excluded.parent_id, bookable = excluded.bookable,
                 gpu_model = excluded.gpu_model, gpu_product = excluded.gpu_product, attributes = excluded.attributes",
    )
    .bind(node_id)
    .bind(pool_id)
    .bind(&ids)
    .bind(&classes)
    .bind(&parents)
    .bind(&bookable)
    .bind(&models)
    .bind(&products)
    .bind(&attributes)
    .execute(tx.conn())
    .await?;
    refresh_node_free(tx, node_id).await
}

/// Records a node's hardware key and replaces its stored identifiers.
async fn set_hardware(tx: &mut Tx, node_id: &str, hardware: &HardwareKey) -> Result<()> {
    sql::query("UPDATE nodes SET hardware_key = $2, hardware_trusted = $3 WHERE id = $1")
        .bind(node_id)
        .bind(&hardware.key)
        .bind(hardware.trusted)
        .execute(tx.conn())
        .await?;
    sql::query("DELETE FROM node_identifiers WHERE node_id = $1").bind(node_id).execute(tx.conn()).await?;
    let (kinds, values): (Vec<&str>, Vec<&str>) = hardware.surviving.iter().map(Identifier::parts).unzip();
    sql::query(
        "INSERT INTO node_identifiers (node_id, kind, value)
         SELECT $1, u.kind, u.value FROM unnest($2::text[], $3::text[]) AS u(kind, value)
         ON CONFLICT DO NOTHING",
    )
    .bind(node_id)
    .bind(&kinds)
    .bind(&values)
    .execute(tx.conn())
    .await?;
    Ok(())
}

/// Raises (replacing one of the same type) or clears a condition, and the `noScheduleReasons` that follow.
async fn change_condition(
    tx: &mut Tx,
    node_id: &str,
    raised: Option<&Condition>,
    cleared: ConditionType,
) -> Result<()> {
    let current: Option<String> = sql::query_scalar("SELECT conditions::text FROM nodes WHERE id = $1")
        .bind(node_id)
        .fetch_optional(tx.conn())
        .await?;
    let Some(current) = current else { return Ok(()) };
    let mut conditions: Vec<Condition> = serde_json::from_str(&current)
        .map_err(|err| Error::Internal(format!("nodes.conditions of {node_id} is unreadable: {err}")))?;
    conditions.retain(|c| c.kind != cleared);
    conditions.extend(raised.cloned());
    sql::query("UPDATE nodes SET conditions = $2::jsonb, no_schedule_reasons = $3 WHERE id = $1")
        .bind(node_id)
        .bind(json(&conditions)?)
        .bind(bc_domain::node::no_schedule_reasons(&conditions))
        .execute(tx.conn())
        .await?;
    Ok(())
}

async fn apply_node(tx: &mut Tx, event: &NodeEvent) -> Result<()> {
    let node_id = event.node_id().as_str();
    match event {
        NodeEvent::Registered(e) => {
            insert_node(
                tx,
                NewNode {
                    node_id,
                    pool_id: e.pool_id.as_str(),
                    site_id: e.site_id.as_str(),
                    owner_tenant_id: e.owner_tenant_id.as_ref().map(|t| t.as_str()),
                    name: &e.name,
                    role: &e.role,
                    trust: &e.trust,
                    adapter: &e.adapter,
                    provision_state: &e.provision_state,
                    connectivity: &e.connectivity,
                    conditions: &e.conditions,
                    generation: e.generation,
                    observed_generation: e.observed_generation,
                    at_ms: e.at_ms,
                },
            )
            .await?;
            if e.provision_state.limit_ms().is_some() {
                sql::query("UPDATE nodes SET provision_since = ms_ts($2) WHERE id = $1")
                    .bind(node_id)
                    .bind(e.at_ms)
                    .execute(tx.conn())
                    .await?;
            }
            upsert_devices(tx, node_id, e.pool_id.as_str(), &e.devices).await?;
        }
        NodeEvent::Joined(e) => {
            insert_node(
                tx,
                NewNode {
                    node_id,
                    pool_id: e.pool_id.as_str(),
                    site_id: e.site_id.as_str(),
                    owner_tenant_id: e.owner_tenant_id.as_ref().map(|t| t.as_str()),
                    name: &e.name,
                    role: &e.role,
                    trust: &e.trust,
                    adapter: &Adapter::BcdV1,
                    provision_state: &ProvisionState::Adopting,
                    connectivity: &Connectivity::Connected,
                    conditions: &e.conditions,
                    generation: e.generation,
                    observed_generation: 0,
                    at_ms: e.at_ms,
                },
            )
            .await?;
            sql::query("UPDATE nodes SET spec = $2::jsonb WHERE id = $1")
                .bind(node_id)
                .bind(json(&e.spec)?)
                .execute(tx.conn())
                .await?;
            upsert_devices(tx, node_id, e.pool_id.as_str(), &e.devices).await?;
            set_hardware(tx, node_id, &e.hardware).await?;
        }
        NodeEvent::Cordoned(_) => set_flags(tx, node_id, "UPDATE nodes SET cordoned = true WHERE id = $1").await?,
        NodeEvent::Uncordoned(_) => {
            let statement = "UPDATE nodes SET cordoned = false, draining = false, drain_forced = false WHERE id = $1";
            set_flags(tx, node_id, statement).await?
        }
        NodeEvent::MaintenanceStarted(_) => {
            set_flags(tx, node_id, "UPDATE nodes SET maintenance = true WHERE id = $1").await?
        }
        NodeEvent::MaintenanceEnded(_) => {
            set_flags(tx, node_id, "UPDATE nodes SET maintenance = false WHERE id = $1").await?
        }
        NodeEvent::DrainStarted(e) => {
            sql::query("UPDATE nodes SET cordoned = true, draining = true, drain_forced = $2 WHERE id = $1")
                .bind(node_id)
                .bind(e.force)
                .execute(tx.conn())
                .await?;
        }
        NodeEvent::Drained(_) => {
            set_flags(tx, node_id, "UPDATE nodes SET draining = false, drain_forced = false WHERE id = $1").await?
        }
        NodeEvent::Adopted(_) => {
            set_flags(tx, node_id, "UPDATE nodes SET provision_state = 'adopted' WHERE id = $1").await?
        }
        NodeEvent::Rejoined(_) | NodeEvent::InventoryReported(_) => return Ok(()),
        NodeEvent::HardwareChanged(e) => {
            let removed: Vec<&str> = e.removed_devices.iter().map(|d| d.as_str()).collect();
            sql::query("DELETE FROM devices WHERE node_id = $1 AND id = ANY($2)")
                .bind(node_id)
                .bind(&removed)
                .execute(tx.conn())
                .await?;
            let pool_id: String =
                sql::query_scalar("SELECT pool_id FROM nodes WHERE id = $1").bind(node_id).fetch_one(tx.conn()).await?;
            upsert_devices(tx, node_id, &pool_id, &e.devices).await?;
            set_hardware(tx, node_id, &e.hardware).await?;
        }
        NodeEvent::ConnectivityChanged(e) => {
            sql::query("UPDATE nodes SET connectivity = $2 WHERE id = $1")
                .bind(node_id)
                .bind(text(&e.to)?)
                .execute(tx.conn())
                .await?;
        }
        NodeEvent::ConditionRaised(e) => change_condition(tx, node_id, Some(&e.condition), e.condition.kind).await?,
        NodeEvent::ConditionCleared(e) => change_condition(tx, node_id, None, e.kind).await?,
        NodeEvent::SpecChanged(e) => {
            sql::query("UPDATE nodes SET generation = $2, spec = $3::jsonb WHERE id = $1")
                .bind(node_id)
                .bind(e.generation as i64)
                .bind(json(&e.spec)?)
                .execute(tx.conn())
                .await?;
        }
        NodeEvent::SpecObserved(e) => {
            sql::query("UPDATE nodes SET observed_generation = $2 WHERE id = $1")
                .bind(node_id)
                .bind(e.observed_generation as i64)
                .execute(tx.conn())
                .await?;
        }
        NodeEvent::BmcSet(e) => {
            sql::query(
                "INSERT INTO node_bmcs (node_id, driver, address, system_id, insecure_tls, drivers, boot_mac)
                 VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7)
                 ON CONFLICT (node_id) DO UPDATE SET driver = excluded.driver, address = excluded.address,
                     system_id = excluded.system_id, insecure_tls = excluded.insecure_tls, drivers = excluded.drivers,
                     boot_mac = excluded.boot_mac",
            )
            .bind(node_id)
            .bind(e.bmc.driver.as_str())
            .bind(&e.bmc.address)
            .bind(e.bmc.system_id.as_deref())
            .bind(e.bmc.insecure_tls)
            .bind(json(&e.bmc.drivers)?)
            .bind(e.bmc.boot_mac.as_deref())
            .execute(tx.conn())
            .await?;
            return Ok(());
        }
        NodeEvent::ResourcesChanged(e) => {
            sql::query("SELECT set_node_resources($1, $2::jsonb)")
                .bind(node_id)
                .bind(json(&e.resources)?)
                .execute(tx.conn())
                .await?;
            return Ok(());
        }
        NodeEvent::PowerObserved(e) => {
            sql::query("UPDATE nodes SET power = $2 WHERE id = $1")
                .bind(node_id)
                .bind(e.power.as_str())
                .execute(tx.conn())
                .await?;
            return Ok(());
        }
        NodeEvent::ProvisionChanged(e) => {
            sql::query(
                "UPDATE nodes SET provision_state = $2,
                     provision_since = CASE WHEN $3 THEN ms_ts($4) END
                 WHERE id = $1",
            )
            .bind(node_id)
            .bind(e.to.as_str())
            .bind(e.to.limit_ms().is_some())
            .bind(e.at_ms)
            .execute(tx.conn())
            .await?;
        }
        NodeEvent::Deleted(_) => {
            sql::query("DELETE FROM node_bmcs WHERE node_id = $1").bind(node_id).execute(tx.conn()).await?;
            for table in [
                "DELETE FROM node_identifiers WHERE node_id = $1",
                "DELETE FROM devices WHERE node_id = $1",
                "DELETE FROM node_resources WHERE node_id = $1",
            ] {
                sql::query(table).bind(node_id).execute(tx.conn()).await?;
            }
            sql::query("DELETE FROM nodes WHERE id = $1").bind(node_id).execute(tx.conn()).await?;
            // No devices are left to refresh: only the node's summary rows, which the recount removes.
            summarize_after_commit(tx, &[node_id]);
            return Ok(());
        }
    }
    recompute_schedulable(tx, node_id).await
}

/// Runs one constant update of a node's flags (`$1` is the node).
async fn set_flags(tx: &mut Tx, node_id: &str, statement: &'static str) -> Result<()> {
    sql::query(statement).bind(node_id).execute(tx.conn()).await?;
    Ok(())
}

fn parse_enum<T: serde::de::DeserializeOwned>(column: &str, value: String) -> Result<T> {
    serde_json::from_value(serde_json::Value::String(value))
        .map_err(|err| Error::Internal(format!("nodes.{column} holds an unknown value: {err}")))
}

/// Re-evaluates the schedulability rule for a node after any of its axes changed.
async fn recompute_schedulable(tx: &mut Tx, node_id: &str) -> Result<()> {
    let row = sql::query(
        "SELECT n.provision_state, n.role, n.maintenance, n.cordoned, n.connectivity, n.no_schedule_reasons,
                n.observed_generation, n.trust, n.owner_tenant_id, p.owner_tenant_id AS pool_owner
         FROM nodes AS n JOIN pools AS p ON p.id = n.pool_id
         WHERE n.id = $1",
    )
    .bind(node_id)
    .fetch_one(tx.conn())
    .await?;
    let reasons: Vec<String> = row.try_get("no_schedule_reasons")?;
    let owner: Option<String> = row.try_get("owner_tenant_id")?;
    let pool_owner: String = row.try_get("pool_owner")?;
    let owner = owner.map(|o| o.parse()).transpose().map_err(|err| Error::Internal(format!("{err}")))?;
    let pool_owner = pool_owner.parse().map_err(|err| Error::Internal(format!("{err}")))?;
    let view = SchedulingView {
        provision_state: parse_enum("provision_state", row.try_get("provision_state")?)?,
        role: parse_enum("role", row.try_get("role")?)?,
        maintenance: row.try_get("maintenance")?,
        cordoned: row.try_get("cordoned")?,
        connectivity: parse_enum("connectivity", row.try_get("connectivity")?)?,
        no_schedule_reasons: &reasons,
        observed_generation: row.try_get::<i64, _>("observed_generation")?.max(0) as u64,
        trust: parse_enum("trust", row.try_get("trust")?)?,
        owner_tenant_id: owner.as_ref(),
        pool_owner_tenant_id: &pool_owner,
    };
    let schedulable = schedulability(&view).is_empty();
    sql::query("UPDATE nodes SET schedulable = $2 WHERE id = $1 AND schedulable IS DISTINCT FROM $2")
        .bind(node_id)
        .bind(schedulable)
        .execute(tx.conn())
        .await?;
    Ok(())
}

/// Locks the devices whose bookings this transaction is about to change and bumps their `booking_changes`, in
/// device id order (the lock order: nodes, devices, device_bookings).
async fn touch_for_booking(tx: &mut Tx, devices: &[&str]) -> Result<()> {
    if devices.is_empty() {
        return Ok(());
    }
    sql::query("SELECT touch_for_booking($1, NULL)").bind(devices).execute(tx.conn()).await?;
    Ok(())
}

/// Recounts the free-capacity hints of `nodes` (`node_free` from their devices, `node_fit` from their atoms' gaps)
/// right after this transaction commits.
fn summarize_after_commit(tx: &mut Tx, nodes: &[&str]) {
    if !nodes.is_empty() {
        tx.after_commit(&sql::Call::new("summarize_nodes").texts(nodes));
        tx.after_commit(&sql::Call::new("refit_nodes").texts(nodes));
    }
}

/// A node's devices changed (added, updated or removed): their ends of live bookings, and the node's free-capacity
/// hint after the commit.
async fn refresh_node_free(tx: &mut Tx, node_id: &str) -> Result<()> {
    sql::query("SELECT refresh_booked_until(ARRAY(SELECT id FROM devices WHERE node_id = $1 ORDER BY id))")
        .bind(node_id)
        .execute(tx.conn())
        .await?;
    summarize_after_commit(tx, &[node_id]);
    Ok(())
}

/// What is done with an inline call's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Nothing: the call answers nothing.
    Nothing,
    /// The free-capacity hint's changes (a JSON array of [node, class, change]), sent with `adjust_free` after the
    /// commit (see `node_free`) through the pool's writer of follow-ups, which merges the changes of concurrent
    /// commits into one call.
    FreeDeltas,
}

/// One inline write as a server-side call, and what its answer is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InlineCall {
    pub call: sql::Call,
    pub answer: Answer,
}

impl InlineCall {
    fn writes(call: sql::Call) -> Self {
        Self { call, answer: Answer::Nothing }
    }

    /// The function its answer is handed to after the commit ([`Tx::follow_up`]), if any.
    pub fn follow_up(&self) -> Option<&'static str> {
        match self.answer {
            Answer::Nothing => None,
            Answer::FreeDeltas => Some("adjust_free"),
        }
    }
}

/// The inline writes of a reservation event as server-side calls (`capacity/0004_reservation_calls`), for every
/// event but a replacement and an extension (those read before they write, and are applied statement by
/// statement): a command sends them in the message that appends its events, and a rebuild sends the same calls.
/// `None` for those two.
pub fn reservation_calls(id: &str, event: &ReservationEvent) -> Result<Option<Vec<InlineCall>>> {
    // The first event's row, up to its state.
    let row = |tenant: &str, identity: &str, request: &bc_domain::reservation::ReservationRequest| {
        let call = sql::Call::new("inline_reservation_row")
            .text(id)
            .text(tenant)
            .text(identity)
            .text(request.pool_id.as_str())
            .opt_text(request.project_id.as_ref().map(|p| p.as_str()));
        json(request).map(|request| (call, request))
    };
    let call = match event {
        ReservationEvent::Requested(e) => {
            let (call, request) = row(e.tenant_id.as_str(), e.identity.as_str(), &e.request)?;
            call.text(ReservationState::Pending.as_str())
                .text(e.request.resource())
                .int4(e.request.devices.count as i32)
                .jsonb(&request)
                .text(&e.request_hash)
                .int4(e.priority)
                .int8(e.at_ms)
                .int8(e.pending_deadline_ms)
                .opt_int8(None)
                .opt_text(None)
        }
        ReservationEvent::Denied(e) => {
            let (call, request) = row(e.tenant_id.as_str(), e.identity.as_str(), &e.request)?;
            call.text(ReservationState::Denied.as_str())
                .text(e.request.resource())
                .int4(e.request.devices.count as i32)
                .jsonb(&request)
                .text(&e.request_hash)
                .int4(0)
                .int8(e.at_ms)
                .int8(e.at_ms)
                .opt_int8(Some(e.at_ms))
                .opt_text(event.outcome().as_deref())
        }
        ReservationEvent::Placed(e) => {
            let rows = BookingRows::of(&e.allocations)?;
            let lists: Vec<&str> = rows.device_lists.iter().map(String::as_str).collect();
            let call = sql::Call::new("inline_placed")
                .text(id)
                .int8(e.start_ms)
                .int8(e.end_ms)
                .opt_int8(e.lease_deadline_ms)
                .texts(&rows.allocation_ids)
                .texts(&rows.node_ids)
                .texts(&lists)
                .texts(&rows.devices)
                .texts(&rows.booking_allocations);
            let mut calls = vec![InlineCall { call, answer: Answer::FreeDeltas }];
            if let Some(scalars) = scalar_rows(&e.allocations)? {
                let call = sql::Call::new("book_scalars").text(id).int8(e.start_ms).int8(e.end_ms).jsonb(&scalars);
                calls.push(InlineCall::writes(call));
            }
            return Ok(Some(calls));
        }
        ReservationEvent::BindingStarted(_) => {
            sql::Call::new("inline_reservation_state").text(id).text(ReservationState::Binding.as_str())
        }
        ReservationEvent::Activated(_) => {
            sql::Call::new("inline_reservation_state").text(id).text(ReservationState::Active.as_str())
        }
        ReservationEvent::ReleaseRequested(e) => sql::Call::new("inline_release_requested").text(id).int8(e.at_ms),
        ReservationEvent::Renewed(e) => sql::Call::new("inline_renewed").text(id).int8(e.lease_deadline_ms),
        ReservationEvent::Cancelled(_)
        | ReservationEvent::Released(_)
        | ReservationEvent::Expired(_)
        | ReservationEvent::Failed(_) => {
            let (Some(state), Some(at_ms)) = (event.state_after(), event.ends_bookings_at()) else {
                unreachable!("an ending event has a state and an end")
            };
            // Its state, its end time, and its bookings gone (the events keep what it held).
            let call = sql::Call::new("inline_end")
                .text(id)
                .text(state.as_str())
                .int8(at_ms)
                .opt_text(event.outcome().as_deref());
            return Ok(Some(vec![InlineCall { call, answer: Answer::FreeDeltas }]));
        }
        ReservationEvent::Replaced(_) | ReservationEvent::Extended(_) => return Ok(None),
    };
    Ok(Some(vec![InlineCall::writes(call)]))
}

/// The inline writes of `event` as server-side calls, when it has them (see [`reservation_calls`]); `None` for the
/// events applied statement by statement.
pub fn calls(stream_id: &str, event: &AnyEvent) -> Result<Option<Vec<InlineCall>>> {
    match event {
        AnyEvent::Reservation(e) => reservation_calls(stream_id, e),
        _ => Ok(None),
    }
}

/// Queues what the answers of `calls` (run in this transaction, in order) ask for after the commit.
pub fn follow_answers(tx: &mut Tx, calls: &[InlineCall], answers: &[Option<String>]) -> Result<()> {
    if calls.len() != answers.len() {
        return Err(Error::Internal(format!("{} inline calls, {} answers", calls.len(), answers.len())));
    }
    for (call, answer) in calls.iter().zip(answers) {
        if let (Some(function), Some(array)) = (call.follow_up(), answer)
            && array != "[]"
        {
            tx.follow_up(function, array);
        }
    }
    Ok(())
}

async fn apply_reservation(tx: &mut Tx, id: &str, event: &ReservationEvent) -> Result<()> {
    if let Some(calls) = reservation_calls(id, event)? {
        let sent: Vec<sql::Call> = calls.iter().map(|c| c.call.clone()).collect();
        let answers = tx.calls(&sent).await?;
        return follow_answers(tx, &calls, &answers);
    }
    match event {
        ReservationEvent::Replaced(e) => {
            let row = sql::query(
                "UPDATE reservations SET version = version + 1 WHERE id = $1
                 RETURNING tenant_id, pool_id, resource, ts_ms(start_at) AS start_ms, ts_ms(end_at) AS end_ms,
                           ARRAY(SELECT device_id FROM device_bookings WHERE reservation_id = $1
                                 ORDER BY device_id) AS old_devices,
                           ARRAY(SELECT node_id FROM allocations WHERE reservation_id = $1) AS old_nodes",
            )
            .bind(id)
            .fetch_one(tx.conn())
            .await?;
            let tenant: String = row.try_get("tenant_id")?;
            let pool: String = row.try_get("pool_id")?;
            let resource: String = row.try_get("resource")?;
            let (start_ms, end_ms): (i64, i64) = (row.try_get("start_ms")?, row.try_get("end_ms")?);
            let old_devices: Vec<String> = row.try_get("old_devices")?;
            let old_nodes: Vec<String> = row.try_get("old_nodes")?;
            // The old bookings go and the new ones take the window: every device of both is touched once, in id
            // order.
            let rows = BookingRows::of(&e.allocations)?;
            let mut devices: Vec<&str> = old_devices.iter().map(String::as_str).collect();
            devices.extend(rows.devices.iter().copied());
            devices.sort_unstable();
            devices.dedup();
            let mut nodes: Vec<&str> = old_nodes.iter().map(String::as_str).collect();
            nodes.extend(rows.node_ids.iter().copied());
            nodes.sort_unstable();
            nodes.dedup();
            touch_for_booking(tx, &devices).await?;
            sql::query("DELETE FROM device_bookings WHERE reservation_id = $1").bind(id).execute(tx.conn()).await?;
            sql::query("DELETE FROM allocations WHERE reservation_id = $1").bind(id).execute(tx.conn()).await?;
            sql::query("SELECT book_atoms($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)")
                .bind(id)
                .bind(&tenant)
                .bind(&pool)
                .bind(&resource)
                .bind(start_ms)
                .bind(end_ms)
                .bind(&rows.allocation_ids)
                .bind(&rows.node_ids)
                .bind(&rows.device_lists)
                .bind(&rows.devices)
                .bind(&rows.booking_allocations)
                .execute(tx.conn())
                .await?;
            sql::query("SELECT refresh_booked_until($1)").bind(&devices).execute(tx.conn()).await?;
            sql::query("DELETE FROM scalar_bookings WHERE reservation_id = $1").bind(id).execute(tx.conn()).await?;
            if let Some(scalars) = scalar_rows(&e.allocations)? {
                sql::query("SELECT book_scalars($1, $2, $3, $4::jsonb)")
                    .bind(id)
                    .bind(start_ms)
                    .bind(end_ms)
                    .bind(&scalars)
                    .execute(tx.conn())
                    .await?;
            }
            summarize_after_commit(tx, &nodes);
        }
        ReservationEvent::Extended(e) => {
            // The devices whose bookings end at the current end are bumped, in id order, and booked longer.
            sql::query(
                "WITH locked AS (
                     SELECT id FROM devices
                     WHERE id IN (SELECT device_id FROM device_bookings
                                  WHERE reservation_id = $1 AND upper(during) = ms_ts($2))
                     ORDER BY id FOR UPDATE
                 )
                 UPDATE devices AS d
                    SET booking_changes = d.booking_changes + 1, booked_until = greatest(d.booked_until, ms_ts($3))
                 FROM locked WHERE d.id = locked.id",
            )
            .bind(id)
            .bind(e.previous_end_ms)
            .bind(e.end_ms)
            .execute(tx.conn())
            .await?;
            sql::query("UPDATE reservations SET end_at = ms_ts($2), version = version + 1 WHERE id = $1")
                .bind(id)
                .bind(e.end_ms)
                .execute(tx.conn())
                .await?;
            // The exclusion constraint refuses the longer ranges if another booking holds an atom after the
            // current end: one extend at a time, and never onto someone else's time.
            sql::query(
                "UPDATE device_bookings SET during = tstzrange(lower(during), ms_ts($2))
                 WHERE reservation_id = $1 AND upper(during) = ms_ts($3)",
            )
            .bind(id)
            .bind(e.end_ms)
            .bind(e.previous_end_ms)
            .execute(tx.conn())
            .await?;
            sql::query(
                "UPDATE scalar_bookings SET during = tstzrange(lower(during), ms_ts($2))
                 WHERE reservation_id = $1 AND upper(during) = ms_ts($3)",
            )
            .bind(id)
            .bind(e.end_ms)
            .bind(e.previous_end_ms)
            .execute(tx.conn())
            .await?;
        }
        _ => unreachable!("every other reservation event is applied through its calls"),
    }
    Ok(())
}

/// A reservation's scalar amounts as `book_scalars` takes them (a JSON array of [allocation, node, resource,
/// amount]), or `None` when its allocations hold none.
fn scalar_rows(allocations: &[Allocation]) -> Result<Option<String>> {
    let rows: Vec<(&str, &str, &str, u64)> = allocations
        .iter()
        .flat_map(|a| {
            a.resources
                .iter()
                .map(|(resource, amount)| (a.allocation_id.as_str(), a.node_id.as_str(), resource.as_str(), *amount))
        })
        .collect();
    if rows.is_empty() { Ok(None) } else { json(&rows).map(Some) }
}

/// A reservation's allocations as the columns `book_atoms` takes: each allocation's id, node and devices (a JSON
/// array), and the booked atoms in device id order (the order every transaction books them in) with their
/// allocations.
struct BookingRows<'a> {
    allocation_ids: Vec<&'a str>,
    node_ids: Vec<&'a str>,
    device_lists: Vec<String>,
    devices: Vec<&'a str>,
    booking_allocations: Vec<&'a str>,
}

impl<'a> BookingRows<'a> {
    fn of(allocations: &'a [Allocation]) -> Result<Self> {
        let mut rows = BookingRows {
            allocation_ids: Vec::new(),
            node_ids: Vec::new(),
            device_lists: Vec::new(),
            devices: Vec::new(),
            booking_allocations: Vec::new(),
        };
        let mut booking: Vec<(&str, &str)> = Vec::new();
        for allocation in allocations {
            rows.allocation_ids.push(allocation.allocation_id.as_str());
            rows.node_ids.push(allocation.node_id.as_str());
            rows.device_lists.push(json(&allocation.devices)?);
            for device in &allocation.devices {
                booking.push((device.as_str(), allocation.allocation_id.as_str()));
            }
        }
        booking.sort();
        (rows.devices, rows.booking_allocations) = booking.into_iter().unzip();
        Ok(rows)
    }
}

/// Rebuilds every inline table from the log into `schema` (created here, inside the caller's transaction,
/// with the live tables' constraints, the exclusion constraint included), in log order, up to the horizon,
/// once the horizon has passed every event the transaction can see (waiting up to a minute for older
/// transactions to end; the transaction must be READ COMMITTED). Returns the number of events applied.
/// Afterwards the transaction's `search_path` points at `schema` first.
pub async fn rebuild_into(tx: &mut Tx, schema: &str) -> Result<u64> {
    if schema.is_empty() || !schema.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
        return Err(Error::InvalidArgument(format!(
            "schema name {schema:?} must be lower-case letters, digits and '_'"
        )));
    }
    let mut ddl = format!("CREATE SCHEMA {schema};");
    for table in TABLES {
        ddl.push_str(&format!(" CREATE TABLE {schema}.{table} (LIKE public.{table} INCLUDING ALL);"));
    }
    // A copy has no triggers: the bookings' atom numbers (capacity/0026), which the exclusion constraint compares,
    // are set as in the live table.
    ddl.push_str(&format!(
        " CREATE TRIGGER device_bookings_atom BEFORE INSERT OR UPDATE OF device_id ON {schema}.device_bookings
              FOR EACH ROW EXECUTE FUNCTION public.device_bookings_set_atom();"
    ));
    ddl.push_str(&format!(" SET LOCAL search_path = {schema}, public;"));
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl)).execute(tx.conn()).await?;

    // The log is read as every reader reads it (events::read_after): in (epoch, txid, seq) order, only up to
    // the horizon, so an event a transaction still running could precede is never applied before it.
    bc_eventstore::events::wait_for_horizon(tx, std::time::Duration::from_secs(60)).await?;
    let mut applied = 0;
    let mut after = bc_eventstore::Position::START;
    loop {
        let batch = bc_eventstore::events::read_after(tx, after, 1000).await?;
        let Some(last) = batch.last() else { break };
        after = last.position;
        for recorded in &batch {
            if let Some(event) = AnyEvent::decode(&recorded.event_type, recorded.schema_version, &recorded.payload)? {
                apply(tx, &recorded.stream_id, &event).await?;
                applied += 1;
            }
        }
    }
    // The free-capacity hint is not rebuilt here (it is a hint over the live tables, not an inline table).
    tx.clear_after_commit();
    Ok(applied)
}

/// Rows that differ between the live table and the same table in `schema`, both ways.
pub async fn differences(tx: &mut Tx, schema: &str, table: &str) -> Result<i64> {
    if !TABLES.contains(&table) {
        return Err(Error::InvalidArgument(format!("{table} is not an inline table")));
    }
    let query = format!(
        "SELECT count(*) FROM ((TABLE public.{table} EXCEPT ALL TABLE {schema}.{table})
                               UNION ALL (TABLE {schema}.{table} EXCEPT ALL TABLE public.{table})) AS d"
    );
    let count: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(query)).persistent(false).fetch_one(tx.conn()).await?;
    Ok(count)
}

/// Whether `event_type` is handled by the inline projections.
pub fn handles(event_type: &str) -> bool {
    [
        SiteEvent::event_types(),
        ProjectEvent::event_types(),
        PoolEvent::event_types(),
        NodeEvent::event_types(),
        ReservationEvent::event_types(),
        TenantEvent::event_types(),
        IdentityEvent::event_types(),
        GrantEvent::event_types(),
        LimitEvent::event_types(),
        ImageEvent::event_types(),
        ProfileEvent::event_types(),
        WorkflowEvent::event_types(),
        ProviderAccountEvent::event_types(),
        FlavorEvent::event_types(),
        InstanceEvent::event_types(),
        WebhookEvent::event_types(),
    ]
    .iter()
    .any(|types| types.contains(&event_type))
}
