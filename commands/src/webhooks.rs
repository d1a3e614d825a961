//! Webhook subscriptions: creating one with its signing secret sealed in the same transaction (the secret is
//! answered once, `whsec_<base64>`), reading, rotating the secret, deleting, and replaying dead letters; and the
//! delivery bookkeeping of the process holding a subscription's `webhook:<id>` lease: where its cursor stands,
//! the secret opened, and each round's attempts, dead letters and cursor committed in one fenced transaction.

use base64::Engine as _;
use bc_domain::Rejection;
use bc_domain::id::{TenantId, WebhookId};
use bc_domain::webhook::{self, WebhookSpec};
use bc_eventstore::events::ExpectedVersion;
use bc_eventstore::lease::{self, Lease};
use bc_eventstore::{Position, ScopedFutureExt as _, TxOptions, clock};

use crate::reads::{Listed, Page};
use crate::sealed::{pki_failure, secret_context};
use crate::store::{self, certificates, webhooks::WebhookRow};
use crate::{App, AppResult, Caller, Committed, record};

pub use crate::store::webhooks::{AttemptRow, DeadLetterRow};

/// The kind of the sealed secret that holds a subscription's signing key.
pub const WEBHOOK_SECRET: &str = "webhook-secret";
/// The prefix of a signing secret as it is shown: the rest is the key's bytes in base64.
pub const SECRET_PREFIX: &str = "whsec_";
/// Bytes of a signing key.
const KEY_BYTES: usize = 32;
/// How many attempts and dead letters a read of a subscription's deliveries answers.
const DELIVERIES_SHOWN: i64 = 100;

/// A subscription as the API shows it: everything but its secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookView {
    pub id: WebhookId,
    pub tenant_id: TenantId,
    pub spec: WebhookSpec,
    pub created_at_ms: i64,
    /// When its secret was last set.
    pub secret_at_ms: i64,
    /// Deliveries acknowledged so far.
    pub delivered: i64,
    /// Dead letters waiting for a replay.
    pub dead_letters: i64,
    /// The last event its deliveries have dealt with.
    pub position: Option<String>,
}

impl WebhookView {
    fn of_row(row: WebhookRow) -> AppResult<WebhookView> {
        let bad = |err: String| store::corrupt("a webhooks row", err);
        Ok(WebhookView {
            id: row.id.parse().map_err(|err: bc_domain::id::IdError| bad(err.to_string()))?,
            tenant_id: row.tenant_id.parse().map_err(|err: bc_domain::id::IdError| bad(err.to_string()))?,
            spec: WebhookSpec {
                url: row.url,
                event_types: serde_json::from_str(&row.event_types).map_err(|err| bad(err.to_string()))?,
                description: row.description,
            },
            created_at_ms: row.created_at_ms,
            secret_at_ms: row.secret_at_ms,
            delivered: row.delivered,
            dead_letters: row.dead_letters,
            position: row.position,
        })
    }
}

/// A subscription with its signing secret, answered once: at its creation and at each rotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookWithSecret {
    pub webhook: WebhookView,
    /// `whsec_<base64 of the key>`.
    pub secret: String,
}

/// A subscription's recent deliveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deliveries {
    /// The most recent attempts, newest first.
    pub attempts: Vec<AttemptRow>,
    /// Dead letters, oldest first (queued ones included).
    pub dead_letters: Vec<DeadLetterRow>,
}

/// What the deliverer of a subscription works from.
#[derive(Debug, Clone)]
pub struct DeliveryTarget {
    pub id: WebhookId,
    pub tenant_id: TenantId,
    pub spec: WebhookSpec,
    /// The signing key's bytes.
    pub key: Vec<u8>,
    /// Every event up to here is dealt with.
    pub cursor: Position,
}

/// An event whose every attempt failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Buried {
    pub position: Position,
    pub event_type: String,
    pub attempts: i32,
    pub error: String,
}

/// What one round of a deliverer commits at once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settled {
    /// The cursor's new position, if it moved.
    pub cursor: Option<Position>,
    /// Deliveries acknowledged in this round.
    pub delivered: i64,
    pub attempts: Vec<AttemptRow>,
    pub buried: Vec<Buried>,
    /// Dead letters a replay delivered.
    pub unburied: Vec<Position>,
}

impl App {
    /// Creates a subscription in the caller's tenant, its signing key drawn at random and sealed with the PKI
    /// bundle's key in the same transaction; its deliveries start after its own creation.
    pub async fn create_webhook(&self, caller: &Caller, spec: WebhookSpec) -> AppResult<Committed<WebhookWithSecret>> {
        // Checked before a query reads with it: PostgreSQL refuses a NUL in text.
        let spec = spec.check(bc_domain::stream::parse_type_filter)?;
        let id = WebhookId::generate();
        let key = new_key()?;
        let sealed = self.seal_key(&id, &key)?;
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let (spec, id, sealed, key) = (&spec, &id, &sealed, &key);
                async move {
                    let tenant = &caller.tenant_id;
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = webhook::create_webhook(id, tenant, spec.clone(), now_ms)?;
                    certificates::put_secret(tx, WEBHOOK_SECRET, id.as_str(), sealed).await?;
                    let position = record(tx, caller, id.as_str(), tenant, ExpectedVersion::NO_STREAM, events).await?;
                    let start = position.ok_or_else(|| store::corrupt("a webhook's creation", "no position"))?;
                    store::webhooks::start_cursor(tx, id.as_str(), &start.to_string()).await?;
                    let webhook = WebhookView {
                        id: id.clone(),
                        tenant_id: tenant.clone(),
                        spec: spec.clone(),
                        created_at_ms: now_ms,
                        secret_at_ms: now_ms,
                        delivered: 0,
                        dead_letters: 0,
                        position: Some(start.to_string()),
                    };
                    Ok(Committed { value: WebhookWithSecret { webhook, secret: shown(key) }, position })
                }
                .scope_boxed()
            })
            .await
    }

    /// The caller's tenant's subscriptions, by id.
    pub async fn list_webhooks(&self, caller: &Caller, page: &Page) -> AppResult<Listed<WebhookView>> {
        let after = page.after_key.as_deref();
        if let Some(after) = after {
            after.parse::<WebhookId>().map_err(|err| Rejection::invalid("cursor", err.to_string()))?;
        }
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let rows = store::webhooks::list(&mut tx, caller.tenant_id.as_str(), after, i64::from(page.limit) + 1).await?;
        tx.commit().await?;
        let found =
            rows.into_iter().map(|row| Ok((row.id.clone(), WebhookView::of_row(row)?))).collect::<AppResult<_>>()?;
        Ok(crate::reads::paged(found, page))
    }

    /// One subscription of the caller's tenant (another tenant's is not found).
    pub async fn webhook(&self, caller: &Caller, id: &WebhookId) -> AppResult<WebhookView> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let row = store::webhooks::webhook(&mut tx, id.as_str()).await?;
        tx.commit().await?;
        match row {
            Some(row) if row.tenant_id == caller.tenant_id.as_str() => WebhookView::of_row(row),
            _ => Err(not_found(id)),
        }
    }

    /// A subscription's recent attempts and its dead letters.
    pub async fn webhook_deliveries(&self, caller: &Caller, id: &WebhookId) -> AppResult<Deliveries> {
        self.webhook(caller, id).await?;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let attempts = store::webhooks::recent_attempts(&mut tx, id.as_str(), DELIVERIES_SHOWN).await?;
        let dead_letters = store::webhooks::dead_letters(&mut tx, id.as_str(), DELIVERIES_SHOWN).await?;
        tx.commit().await?;
        Ok(Deliveries { attempts, dead_letters })
    }

    /// Replaces a subscription's signing key; the old one signs nothing from the commit on.
    pub async fn rotate_webhook_secret(
        &self,
        caller: &Caller,
        id: &WebhookId,
    ) -> AppResult<Committed<WebhookWithSecret>> {
        let key = new_key()?;
        let sealed = self.seal_key(id, &key)?;
        let done: Committed<()> = self
            .db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let sealed = &sealed;
                async move {
                    let (hook, version) = owned_webhook(tx, caller, id).await?;
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = webhook::rotate_secret(&hook, now_ms)?;
                    certificates::put_secret(tx, WEBHOOK_SECRET, id.as_str(), sealed).await?;
                    let position =
                        record(tx, caller, id.as_str(), &caller.tenant_id, ExpectedVersion::Exact(version), events)
                            .await?;
                    Ok::<_, crate::AppError>(Committed { value: (), position })
                }
                .scope_boxed()
            })
            .await?;
        let webhook = self.webhook(caller, id).await?;
        Ok(Committed { value: WebhookWithSecret { webhook, secret: shown(&key) }, position: done.position })
    }

    /// Deletes a subscription of the caller's tenant, its secret and its delivery rows; a delivery in flight
    /// commits nothing more once this commits.
    pub async fn delete_webhook(&self, caller: &Caller, id: &WebhookId) -> AppResult<Committed<()>> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                async move {
                    let (hook, version) = owned_webhook(tx, caller, id).await?;
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = webhook::delete_webhook(&hook, now_ms)?;
                    certificates::delete_secret(tx, WEBHOOK_SECRET, id.as_str()).await?;
                    store::webhooks::forget(tx, id.as_str()).await?;
                    let position =
                        record(tx, caller, id.as_str(), &caller.tenant_id, ExpectedVersion::Exact(version), events)
                            .await?;
                    Ok(Committed { value: (), position })
                }
                .scope_boxed()
            })
            .await
    }

    /// Queues a subscription's dead letters for delivery again (before the events after its cursor); answers how
    /// many.
    pub async fn replay_webhook_dead_letters(&self, caller: &Caller, id: &WebhookId) -> AppResult<Committed<u32>> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                async move {
                    let (hook, version) = owned_webhook(tx, caller, id).await?;
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let queued = store::webhooks::queue_dead_letters(tx, id.as_str()).await?;
                    let count = u32::try_from(queued).unwrap_or(u32::MAX);
                    let events = webhook::replay_dead_letters(&hook, count, now_ms)?;
                    let position =
                        record(tx, caller, id.as_str(), &caller.tenant_id, ExpectedVersion::Exact(version), events)
                            .await?;
                    Ok(Committed { value: count, position })
                }
                .scope_boxed()
            })
            .await
    }

    /// Every live subscription, for the deliverers.
    pub async fn webhook_ids(&self) -> AppResult<Vec<WebhookId>> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let ids = store::webhooks::ids(&mut tx).await?;
        tx.commit().await?;
        ids.iter().map(|id| id.parse().map_err(|err| store::corrupt("webhooks.id", err))).collect()
    }

    /// What a deliverer of `id` works from, its key opened; `None` once the subscription is gone.
    pub async fn delivery_target(&self, id: &WebhookId) -> AppResult<Option<DeliveryTarget>> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let row = store::webhooks::webhook(&mut tx, id.as_str()).await?;
        tx.commit().await?;
        let Some(row) = row else { return Ok(None) };
        let Some(cursor) = row.position.clone() else { return Ok(None) };
        let cursor: Position = cursor.parse().map_err(|err| store::corrupt("webhook_cursors.position", err))?;
        let view = WebhookView::of_row(row)?;
        let Some(key) = self.open_secret(WEBHOOK_SECRET, id.as_str()).await? else { return Ok(None) };
        Ok(Some(DeliveryTarget { id: view.id, tenant_id: view.tenant_id, spec: view.spec, key, cursor }))
    }

    /// The dead letters of `id` queued for a replay, oldest first.
    pub async fn queued_dead_letters(&self, id: &WebhookId, limit: i64) -> AppResult<Vec<DeadLetterRow>> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let queued = store::webhooks::queued_dead_letters(&mut tx, id.as_str(), limit).await?;
        tx.commit().await?;
        Ok(queued)
    }

    /// Commits a deliverer's round under its lease: the attempts, the dead letters buried and unburied, and the
    /// cursor. Refused ([`bc_eventstore::Error::LeaseLost`]) once another process holds the subscription.
    pub async fn settle_webhook(&self, lease: &Lease, id: &WebhookId, settled: &Settled) -> AppResult<()> {
        let mut tx = lease::begin_fenced(&self.db, lease, TxOptions::READ_COMMITTED).await?;
        let id = id.as_str();
        store::webhooks::record_attempts(&mut tx, id, &settled.attempts).await?;
        for dead in &settled.buried {
            let position = dead.position.to_string();
            store::webhooks::bury(&mut tx, id, &position, &dead.event_type, dead.attempts, &dead.error).await?;
        }
        for position in &settled.unburied {
            store::webhooks::unbury(&mut tx, id, &position.to_string()).await?;
        }
        if settled.cursor.is_some() || settled.delivered > 0 {
            let cursor = settled.cursor.map(|cursor| cursor.to_string());
            store::webhooks::advance(&mut tx, id, cursor.as_deref(), settled.delivered).await?;
            store::webhooks::prune_attempts(&mut tx, id).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    fn seal_key(&self, id: &WebhookId, key: &[u8]) -> AppResult<Vec<u8>> {
        self.sealer()?.seal(key, &secret_context(WEBHOOK_SECRET, id.as_str())).map_err(pki_failure)
    }
}

/// A fresh signing key.
fn new_key() -> AppResult<Vec<u8>> {
    let mut key = vec![0u8; KEY_BYTES];
    getrandom::fill(&mut key)
        .map_err(|err| crate::AppError::Store(bc_eventstore::Error::Internal(format!("draw a key: {err}"))))?;
    Ok(key)
}

/// A key as its subscriber is shown it.
fn shown(key: &[u8]) -> String {
    format!("{SECRET_PREFIX}{}", base64::engine::general_purpose::STANDARD.encode(key))
}

fn not_found(id: &WebhookId) -> crate::AppError {
    Rejection::NotFound { kind: "webhook", id: id.to_string() }.into()
}

/// A live subscription of the caller's tenant, folded from its stream, with the stream's version.
async fn owned_webhook(
    tx: &mut bc_eventstore::Tx,
    caller: &Caller,
    id: &WebhookId,
) -> AppResult<(webhook::Webhook, u32)> {
    match store::webhook_aggregate(tx, id).await? {
        Some((hook, version)) if hook.tenant_id == caller.tenant_id && hook.deleted_at_ms.is_none() => {
            Ok((hook, version))
        }
        _ => Err(not_found(id)),
    }
}
