//! Webhook subscriptions: a tenant asks for the events of some types to be POSTed to a URL of its own, signed with
//! a secret only it and the control plane know (sealed beside the subscription, never in an event). The
//! subscription's events are its creation, its secret's rotations, the replays of its dead letters and its
//! deletion; what was delivered is runtime bookkeeping, not events.

use serde::{Deserialize, Serialize};

use crate::Rejection;
use crate::domain_events;
use crate::id::{TenantId, WebhookId};

/// The most event types (or families) one subscription names.
pub const MAX_EVENT_TYPES: usize = 32;
/// The longest description.
pub const MAX_DESCRIPTION: usize = 256;

/// What a subscription asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookSpec {
    /// Where deliveries are POSTed: `https://`, or `http://` on a loopback address only.
    pub url: String,
    /// Exact event types (`reservation.placed`) or whole families (`reservation.*`), each one this build knows.
    pub event_types: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
}

impl WebhookSpec {
    /// Checks every field, naming the first that is wrong; the event types come back without duplicates.
    /// `parse_types` reads one entry as the event stream's type filter does (`stream::parse_type_filter`, which
    /// knows every event type, this module's included: it is passed in rather than imported).
    pub fn check(
        mut self,
        parse_types: impl Fn(&str) -> Result<Vec<String>, String>,
    ) -> Result<WebhookSpec, Rejection> {
        check_url(&self.url)?;
        if self.event_types.is_empty() || self.event_types.len() > MAX_EVENT_TYPES {
            return Err(Rejection::invalid(
                "eventTypes",
                format!("names 1 to {MAX_EVENT_TYPES} event types or families (`reservation.*`)"),
            ));
        }
        let mut types: Vec<String> = Vec::with_capacity(self.event_types.len());
        for (i, entry) in self.event_types.iter().enumerate() {
            let field = format!("eventTypes[{i}]");
            if entry.contains(',') || entry.trim() != entry || entry.is_empty() {
                return Err(Rejection::invalid(field, "one event type or family, without spaces or commas"));
            }
            parse_types(entry).map_err(|reason| Rejection::invalid(field, reason))?;
            if !types.contains(entry) {
                types.push(entry.clone());
            }
        }
        self.event_types = types;
        if self.description.chars().count() > MAX_DESCRIPTION || self.description.chars().any(char::is_control) {
            return Err(Rejection::invalid(
                "description",
                format!("must be at most {MAX_DESCRIPTION} characters without control characters"),
            ));
        }
        Ok(self)
    }
}

/// A subscription's URL: `https://host[:port][/path]`, or `http://` on a loopback host (a receiver on the same
/// machine). Plain HTTP elsewhere would hand the signed events to anyone on the path.
pub fn check_url(url: &str) -> Result<(), Rejection> {
    crate::provider::check_endpoint(url).map_err(|rejection| match rejection {
        Rejection::InvalidArgument { message, .. } => Rejection::invalid("url", message),
        other => other,
    })
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookCreated {
    pub webhook_id: WebhookId,
    pub tenant_id: TenantId,
    pub spec: WebhookSpec,
    pub at_ms: i64,
}

/// The signing secret was replaced (the sealed secret changed with this event's transaction).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookSecretRotated {
    pub webhook_id: WebhookId,
    pub at_ms: i64,
}

/// The subscription's dead letters were queued for delivery again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookDeadLettersReplayed {
    pub webhook_id: WebhookId,
    /// How many were queued.
    pub count: u32,
    pub at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WebhookDeleted {
    pub webhook_id: WebhookId,
    pub at_ms: i64,
}

domain_events! {
    /// Events of a webhook subscription's stream.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub enum WebhookEvent {
        Created(WebhookCreated) = "webhook.created",
        SecretRotated(WebhookSecretRotated) = "webhook.secret_rotated",
        DeadLettersReplayed(WebhookDeadLettersReplayed) = "webhook.dead_letters_replayed",
        Deleted(WebhookDeleted) = "webhook.deleted",
    }
}

impl WebhookEvent {
    pub fn webhook_id(&self) -> &WebhookId {
        match self {
            WebhookEvent::Created(e) => &e.webhook_id,
            WebhookEvent::SecretRotated(e) => &e.webhook_id,
            WebhookEvent::DeadLettersReplayed(e) => &e.webhook_id,
            WebhookEvent::Deleted(e) => &e.webhook_id,
        }
    }
}

/// A subscription as its events left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Webhook {
    pub id: WebhookId,
    pub tenant_id: TenantId,
    pub spec: WebhookSpec,
    pub created_at_ms: i64,
    /// When its secret was last set (its creation, at first).
    pub secret_at_ms: i64,
    pub deleted_at_ms: Option<i64>,
}

pub fn evolve_webhook(state: Option<Webhook>, event: &WebhookEvent) -> Option<Webhook> {
    match (state, event) {
        (None, WebhookEvent::Created(e)) => Some(Webhook {
            id: e.webhook_id.clone(),
            tenant_id: e.tenant_id.clone(),
            spec: e.spec.clone(),
            created_at_ms: e.at_ms,
            secret_at_ms: e.at_ms,
            deleted_at_ms: None,
        }),
        (Some(hook), WebhookEvent::SecretRotated(e)) => Some(Webhook { secret_at_ms: e.at_ms, ..hook }),
        (Some(hook), WebhookEvent::Deleted(e)) => Some(Webhook { deleted_at_ms: Some(e.at_ms), ..hook }),
        (state, _) => state,
    }
}

/// `webhooks.create`: a new subscription of `tenant_id`, its spec as [`WebhookSpec::check`] answered it.
pub fn create_webhook(
    webhook_id: &WebhookId,
    tenant_id: &TenantId,
    spec: WebhookSpec,
    now_ms: i64,
) -> Result<Vec<WebhookEvent>, Rejection> {
    Ok(vec![WebhookEvent::Created(WebhookCreated {
        webhook_id: webhook_id.clone(),
        tenant_id: tenant_id.clone(),
        spec,
        at_ms: now_ms,
    })])
}

fn live(hook: &Webhook) -> Result<(), Rejection> {
    match hook.deleted_at_ms {
        Some(_) => Err(Rejection::NotFound { kind: "webhook", id: hook.id.to_string() }),
        None => Ok(()),
    }
}

/// `webhooks.rotate_secret`: a live subscription's secret replaced.
pub fn rotate_secret(hook: &Webhook, now_ms: i64) -> Result<Vec<WebhookEvent>, Rejection> {
    live(hook)?;
    Ok(vec![WebhookEvent::SecretRotated(WebhookSecretRotated { webhook_id: hook.id.clone(), at_ms: now_ms })])
}

/// `webhooks.dead_letters.replay`: `count` dead letters queued again; nothing to record when there are none.
pub fn replay_dead_letters(hook: &Webhook, count: u32, now_ms: i64) -> Result<Vec<WebhookEvent>, Rejection> {
    live(hook)?;
    if count == 0 {
        return Ok(Vec::new());
    }
    Ok(vec![WebhookEvent::DeadLettersReplayed(WebhookDeadLettersReplayed {
        webhook_id: hook.id.clone(),
        count,
        at_ms: now_ms,
    })])
}

/// `webhooks.delete`.
pub fn delete_webhook(hook: &Webhook, now_ms: i64) -> Result<Vec<WebhookEvent>, Rejection> {
    live(hook)?;
    Ok(vec![WebhookEvent::Deleted(WebhookDeleted { webhook_id: hook.id.clone(), at_ms: now_ms })])
}

#[cfg(test)]
mod tests;
