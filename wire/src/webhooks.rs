//! Webhook subscriptions and their deliveries.

#[cfg(feature = "server")]
use bc_commands::webhooks::{AttemptRow, DeadLetterRow, Deliveries, WebhookView, WebhookWithSecret};
use bc_domain::webhook::WebhookSpec;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The body of `POST /v1/webhooks`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookBody {
    /// Where deliveries are POSTed: an `https://` URL (`http://` only on a loopback address: 127.0.0.1,
    /// localhost, ::1).
    #[schema(example = "https://hooks.example.com/better-compute")]
    pub url: String,
    /// 1 to 32 event types (`reservation.placed`) or families (`reservation.*`), each one the service knows.
    #[schema(example = json!(["reservation.*", "node.cordoned"]))]
    pub event_types: Vec<String>,
    /// At most 256 characters.
    #[serde(default)]
    pub description: String,
}

impl WebhookBody {
    pub fn spec(self) -> WebhookSpec {
        WebhookSpec { url: self.url, event_types: self.event_types, description: self.description }
    }
}

/// A subscription: everything but its signing secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookDto {
    pub id: String,
    pub tenant_id: String,
    pub url: String,
    pub event_types: Vec<String>,
    pub description: String,
    /// Epoch milliseconds.
    pub created_at: i64,
    /// When its signing secret was last set (epoch milliseconds).
    pub secret_set_at: i64,
    /// Deliveries acknowledged (2xx) so far.
    pub delivered: i64,
    /// Dead letters waiting for a replay.
    pub dead_letters: i64,
    /// The last event of the log its deliveries have dealt with (delivered, dead-lettered or not wanted).
    pub position: Option<String>,
}

/// A subscription with its signing secret, which is shown only here: at its creation and at each rotation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookCreatedDto {
    #[serde(flatten)]
    pub webhook: WebhookDto,
    /// `whsec_` and the key's bytes in base64: verify `webhook-signature` with HMAC-SHA256 keyed with the
    /// decoded bytes (Standard Webhooks).
    #[schema(example = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")]
    pub secret: String,
}

/// One attempt of a delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookAttemptDto {
    /// The `webhook-id` header: the same on every attempt of one event.
    pub message_id: String,
    /// The event's position.
    pub position: String,
    pub event_type: String,
    /// 1 for the first attempt.
    pub attempt: i32,
    /// Epoch milliseconds.
    pub at: i64,
    /// The receiver's HTTP status; `null` when it did not answer.
    pub status: Option<i32>,
    /// Why the attempt failed, if it did.
    pub error: Option<String>,
    /// `delivered`, `failed` (tried again later) or `dead` (the last attempt: now a dead letter).
    pub outcome: String,
}

/// An event whose every attempt failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookDeadLetterDto {
    pub position: String,
    pub event_type: String,
    pub attempts: i32,
    pub last_error: String,
    /// Epoch milliseconds.
    pub dead_at: i64,
    /// Queued by a replay and not yet delivered.
    pub queued: bool,
}

/// A subscription's recent attempts (newest first, up to 100) and its dead letters (oldest first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookDeliveriesDto {
    pub attempts: Vec<WebhookAttemptDto>,
    pub dead_letters: Vec<WebhookDeadLetterDto>,
}

/// What a replay queued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookReplayDto {
    /// Dead letters queued for delivery again.
    pub queued: u32,
}

#[cfg(feature = "server")]
impl From<&WebhookView> for WebhookDto {
    fn from(w: &WebhookView) -> Self {
        WebhookDto {
            id: w.id.to_string(),
            tenant_id: w.tenant_id.to_string(),
            url: w.spec.url.clone(),
            event_types: w.spec.event_types.clone(),
            description: w.spec.description.clone(),
            created_at: w.created_at_ms,
            secret_set_at: w.secret_at_ms,
            delivered: w.delivered,
            dead_letters: w.dead_letters,
            position: w.position.clone(),
        }
    }
}

#[cfg(feature = "server")]
impl From<&WebhookWithSecret> for WebhookCreatedDto {
    fn from(w: &WebhookWithSecret) -> Self {
        WebhookCreatedDto { webhook: (&w.webhook).into(), secret: w.secret.clone() }
    }
}

#[cfg(feature = "server")]
impl From<&AttemptRow> for WebhookAttemptDto {
    fn from(a: &AttemptRow) -> Self {
        WebhookAttemptDto {
            message_id: a.message_id.clone(),
            position: a.position.clone(),
            event_type: a.event_type.clone(),
            attempt: a.attempt,
            at: a.at_ms,
            status: a.status,
            error: a.error.clone(),
            outcome: a.outcome.clone(),
        }
    }
}

#[cfg(feature = "server")]
impl From<&DeadLetterRow> for WebhookDeadLetterDto {
    fn from(d: &DeadLetterRow) -> Self {
        WebhookDeadLetterDto {
            position: d.position.clone(),
            event_type: d.event_type.clone(),
            attempts: d.attempts,
            last_error: d.last_error.clone(),
            dead_at: d.dead_at_ms,
            queued: d.queued,
        }
    }
}

#[cfg(feature = "server")]
impl From<&Deliveries> for WebhookDeliveriesDto {
    fn from(d: &Deliveries) -> Self {
        WebhookDeliveriesDto {
            attempts: d.attempts.iter().map(Into::into).collect(),
            dead_letters: d.dead_letters.iter().map(Into::into).collect(),
        }
    }
}
