//! The webhook deliverer: for each subscription, the process holding its `webhook:<id>` lease reads the log after
//! the subscription's cursor (the same reader as the event stream, behind the horizon, so no event is skipped),
//! keeps what the stream's filter admits for the subscription's tenant and types, and POSTs each event, in log
//! order, as the stream shows it, signed the Standard Webhooks way. A 2xx acknowledges it and the cursor moves
//! past it in a transaction fenced by the lease: at least once, since a process that dies between the answer
//! and that commit leaves the event to be sent again, with the same `webhook-id`. A failure is tried again after
//! an exponential backoff with jitter; once every attempt failed the event becomes a dead letter and the
//! deliveries go on, so one bad event never stops a subscription. A replay queues dead letters, which are sent
//! before the next events.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use bc_commands::App;
use bc_commands::webhooks::{AttemptRow, Buried, DeliveryTarget, Settled};
use bc_domain::id::WebhookId;
use bc_eventstore::Position;
use bc_eventstore::events::RecordedEvent;
use bc_eventstore::lease::{self, Lease, LeaseConfig, LeaseKeeper};
use hmac::{Hmac, Mac as _};
use sha2::Sha256;
use tokio::sync::watch;

use crate::http::events::{Filter, event_json};

/// How deliveries are made.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// The longest one POST may take, from connecting to the end of the answer's headers.
    pub timeout: Duration,
    /// Attempts of one event before it becomes a dead letter.
    pub attempts: u32,
    /// The pause after the first failure; each later one doubles, up to `backoff_max`, and a random part of up
    /// to half of it is added.
    pub backoff: Duration,
    pub backoff_max: Duration,
    /// The pause after reading the log to its end, unless this process commits events sooner.
    pub poll: Duration,
    /// How often the deliverer looks for new and deleted subscriptions.
    pub scan: Duration,
    /// Events read per query.
    pub batch: u32,
    /// Each subscription's lease.
    pub lease: LeaseConfig,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        WebhookConfig {
            timeout: Duration::from_secs(10),
            attempts: 8,
            backoff: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            poll: Duration::from_millis(250),
            scan: Duration::from_secs(1),
            batch: 500,
            lease: LeaseConfig::SHARD,
        }
    }
}

/// The signature of a delivery: `v1,` and the base64 of HMAC-SHA256 over `{id}.{timestamp}.{body}`, keyed with
/// the secret's bytes.
pub fn signature(key: &[u8], message_id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256>>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(message_id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes()))
}

/// The `webhook-id` of an event: the same on every attempt, in every process.
pub fn message_id(position: Position) -> String {
    format!("evt_{position}")
}

/// Runs every subscription's deliveries until `stop` turns true: one task per subscription, each delivering
/// only while it holds the subscription's lease. Not cancel-safe: stop it through `stop`.
pub async fn run(app: App, config: WebhookConfig, mut stop: watch::Receiver<bool>) {
    bc_pki::tls::install_default_provider();
    let client = match reqwest::Client::builder()
        .timeout(config.timeout)
        .connect_timeout(config.timeout)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("better-compute-webhooks/", env!("CARGO_PKG_VERSION")))
        .build()
    {
        Ok(client) => client,
        Err(err) => {
            tracing::error!(error = %err, "webhooks: cannot build the HTTP client; no webhook is delivered");
            return;
        }
    };
    let config = Arc::new(config);
    let mut running: HashMap<WebhookId, tokio::task::JoinHandle<()>> = HashMap::new();
    while !*stop.borrow() {
        running.retain(|_, task| !task.is_finished());
        match app.webhook_ids().await {
            Ok(ids) => {
                for id in ids {
                    if running.contains_key(&id) {
                        continue;
                    }
                    let sink =
                        Sink { app: app.clone(), client: client.clone(), config: Arc::clone(&config), id: id.clone() };
                    running.insert(id, tokio::spawn(sink.keep(stop.clone())));
                }
            }
            Err(err) => tracing::warn!(error = %err, "webhooks: cannot list the subscriptions; retrying"),
        }
        tokio::select! {
            _ = stop.changed() => {}
            () = tokio::time::sleep(config.scan) => {}
        }
    }
    for (_, task) in running {
        let _ = task.await;
    }
}

/// One subscription's deliverer.
struct Sink {
    app: App,
    client: reqwest::Client,
    config: Arc<WebhookConfig>,
    id: WebhookId,
}

/// Why a deliverer stopped delivering.
enum Pause {
    /// The subscription was deleted.
    Gone,
    /// The process is stopping.
    Stopping,
    /// The lease went to another process, or the store failed: try again once the lease is held.
    Interrupted,
}

/// How one event's delivery ended.
enum Sent {
    Delivered,
    Dead { attempts: i32, error: String },
}

impl Sink {
    /// Holds the subscription's lease whenever it can and delivers while it does, until the subscription is gone
    /// or the process stops.
    async fn keep(self, mut stop: watch::Receiver<bool>) {
        let owner = lease::process_owner_id().to_owned();
        let keeper =
            LeaseKeeper::start(self.app.db().clone(), format!("webhook:{}", self.id), owner, self.config.lease);
        loop {
            if *stop.borrow() {
                break;
            }
            let pause = match keeper.current() {
                Some(lease) => self.deliver(&lease, &keeper, &mut stop).await,
                None => match self.app.delivery_target(&self.id).await {
                    Ok(None) => Pause::Gone,
                    _ => Pause::Interrupted,
                },
            };
            match pause {
                Pause::Gone | Pause::Stopping => break,
                Pause::Interrupted => {
                    tokio::select! {
                        _ = stop.changed() => {}
                        () = tokio::time::sleep(self.config.lease.renew_every.min(self.config.scan)) => {}
                    }
                }
            }
        }
        keeper.stop().await;
    }

    /// Delivers while `lease` is held: queued dead letters first, then the log after the cursor. The subscription
    /// (its URL, key, and whether it still exists) is read again whenever the log has moved: its own changes and
    /// a replay are events too, so none goes unnoticed, and an idle subscription costs one log read per poll.
    async fn deliver(&self, lease: &Lease, keeper: &LeaseKeeper, stop: &mut watch::Receiver<bool>) -> Pause {
        let mut appends = self.app.db().appends();
        let mut cursor: Option<Position> = None;
        loop {
            if *stop.borrow() {
                return Pause::Stopping;
            }
            if keeper.current().as_ref() != Some(lease) {
                return Pause::Interrupted;
            }
            let batch = match cursor {
                Some(after) => match self.app.log_after(after, self.config.batch).await {
                    Ok(batch) if batch.is_empty() => {
                        tokio::select! {
                            _ = stop.changed() => {}
                            Ok(()) = appends.changed() => {}
                            () = tokio::time::sleep(self.config.poll) => {}
                        }
                        continue;
                    }
                    Ok(batch) => batch,
                    Err(err) => return self.failed("read the log", &err),
                },
                None => Vec::new(),
            };
            let target = match self.app.delivery_target(&self.id).await {
                Ok(Some(target)) => target,
                Ok(None) => return Pause::Gone,
                Err(err) => return self.failed("read the subscription", &err),
            };
            if let Err(pause) = self.replay(lease, &target, stop).await {
                return pause;
            }
            let Some(last) = batch.last().map(|event| event.position) else {
                // The first round under this lease starts where the subscription's cursor stands.
                cursor = Some(target.cursor);
                continue;
            };
            if let Err(pause) = self.deliver_batch(lease, &target, &batch, stop).await {
                return pause;
            }
            cursor = Some(last);
        }
    }

    /// Delivers the events of `batch` the subscription wants, in order; the cursor moves past each delivered or
    /// dead event in its own commit, and past the unwanted ones with the next commit.
    async fn deliver_batch(
        &self,
        lease: &Lease,
        target: &DeliveryTarget,
        batch: &[RecordedEvent],
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), Pause> {
        let filter = filter_of(target);
        let mut skipped = None;
        for event in batch {
            if !filter.admits(event.tenant_id.as_deref(), &event.event_type, &event.stream_id) {
                skipped = Some(event.position);
                continue;
            }
            let (sent, mut attempts) = self.send(lease, target, event, stop).await?;
            let mut settled = Settled { cursor: Some(event.position), ..Settled::default() };
            match sent {
                Sent::Delivered => settled.delivered = 1,
                Sent::Dead { attempts: tried, error } => settled.buried.push(Buried {
                    position: event.position,
                    event_type: event.event_type.clone(),
                    attempts: tried,
                    error,
                }),
            }
            settled.attempts.append(&mut attempts);
            self.settle(lease, &settled).await?;
            skipped = None;
        }
        if let Some(cursor) = skipped {
            self.settle(lease, &Settled { cursor: Some(cursor), ..Settled::default() }).await?;
        }
        Ok(())
    }

    /// Sends the dead letters a replay queued, oldest first, until none is queued.
    async fn replay(
        &self,
        lease: &Lease,
        target: &DeliveryTarget,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), Pause> {
        loop {
            let queued = self.app.queued_dead_letters(&self.id, 100).await.map_err(|err| self.failed("read", &err))?;
            if queued.is_empty() {
                return Ok(());
            }
            self.replay_letters(lease, target, &queued, stop).await?;
        }
    }

    async fn replay_letters(
        &self,
        lease: &Lease,
        target: &DeliveryTarget,
        queued: &[bc_commands::webhooks::DeadLetterRow],
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), Pause> {
        for letter in queued {
            let position: Position = match letter.position.parse() {
                Ok(position) => position,
                Err(err) => {
                    tracing::error!(webhook = %self.id, error = %err, "webhooks: a dead letter's position is corrupt");
                    return Err(Pause::Interrupted);
                }
            };
            let events = self
                .app
                .log_range(just_before(position), position, 1)
                .await
                .map_err(|err| self.failed("read the log", &err))?;
            let mut settled = Settled::default();
            match events.first().filter(|event| event.position == position) {
                Some(event) => {
                    let (sent, mut attempts) = self.send(lease, target, event, stop).await?;
                    match sent {
                        Sent::Delivered => {
                            settled.unburied.push(position);
                            settled.delivered = 1;
                        }
                        Sent::Dead { attempts: tried, error } => settled.buried.push(Buried {
                            position,
                            event_type: event.event_type.clone(),
                            attempts: tried,
                            error,
                        }),
                    }
                    settled.attempts.append(&mut attempts);
                }
                // Not in the log (it cannot be: events are never deleted): nothing to send.
                None => settled.unburied.push(position),
            }
            self.settle(lease, &settled).await?;
        }
        Ok(())
    }

    /// One event's attempts until one is acknowledged or every one failed. Each failed attempt but the last is
    /// recorded as it happens (under the lease); the last one comes back with the outcome.
    async fn send(
        &self,
        lease: &Lease,
        target: &DeliveryTarget,
        event: &RecordedEvent,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(Sent, Vec<AttemptRow>), Pause> {
        let body = event_json(event);
        let id = message_id(event.position);
        let attempts = self.config.attempts.max(1);
        let mut attempt = 1;
        loop {
            let timestamp = unix_seconds();
            let answer = self
                .client
                .post(&target.spec.url)
                .header("content-type", "application/json")
                .header("webhook-id", &id)
                .header("webhook-timestamp", timestamp.to_string())
                .header("webhook-signature", signature(&target.key, &id, timestamp, body.as_bytes()))
                .body(body.clone())
                .send()
                .await;
            let (status, error) = match answer {
                Ok(answer) if answer.status().is_success() => (Some(answer.status().as_u16()), None),
                Ok(answer) => (Some(answer.status().as_u16()), Some(format!("answered {}", answer.status()))),
                Err(err) => (None, Some(reqwest_failure(&err))),
            };
            let row = |outcome: &str| AttemptRow {
                message_id: id.clone(),
                position: event.position.to_string(),
                event_type: event.event_type.clone(),
                attempt: i32::try_from(attempt).unwrap_or(i32::MAX),
                at_ms: 0,
                status: status.map(i32::from),
                error: error.clone(),
                outcome: outcome.to_owned(),
            };
            let Some(error) = error.clone() else { return Ok((Sent::Delivered, vec![row("delivered")])) };
            if attempt >= attempts {
                let tried = i32::try_from(attempt).unwrap_or(i32::MAX);
                tracing::warn!(webhook = %self.id, position = %event.position, %error, "webhooks: a dead letter");
                return Ok((Sent::Dead { attempts: tried, error }, vec![row("dead")]));
            }
            self.settle(lease, &Settled { attempts: vec![row("failed")], ..Settled::default() }).await?;
            let pause = backoff(&self.config, attempt);
            tokio::select! {
                _ = stop.wait_for(|stopping| *stopping) => return Err(Pause::Stopping),
                () = tokio::time::sleep(pause) => {}
            }
            attempt += 1;
        }
    }

    async fn settle(&self, lease: &Lease, settled: &Settled) -> Result<(), Pause> {
        self.app.settle_webhook(lease, &self.id, settled).await.map_err(|err| self.failed("commit", &err))
    }

    fn failed(&self, what: &str, err: &bc_commands::AppError) -> Pause {
        tracing::warn!(webhook = %self.id, error = %err, "webhooks: could not {what}; delivering again once the lease is held");
        Pause::Interrupted
    }
}

/// What a subscription receives: the event stream's filter for its tenant (every tenant's events for the root
/// tenant, as on the stream) and its types.
fn filter_of(target: &DeliveryTarget) -> Filter {
    let root = target.tenant_id.as_str() == bc_commands::auth::ROOT_TENANT;
    Filter {
        tenant: (!root).then(|| target.tenant_id.to_string()),
        types: target.spec.event_types.clone(),
        stream: None,
    }
}

/// The pause after the `attempt`-th failure: `backoff` doubled per earlier failure, at most `backoff_max`, plus a
/// random part of up to half of it, so that receivers that fail together are not retried together.
pub fn backoff(config: &WebhookConfig, attempt: u32) -> Duration {
    let doubled = config.backoff.saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
    let base = doubled.min(config.backoff_max);
    base + base.mul_f64(fastrand::f64() / 2.0)
}

/// The position right before `position`: a range after it holds `position` first.
fn just_before(position: Position) -> Position {
    match position.seq {
        0 => Position { txid: position.txid.saturating_sub(1), seq: u64::MAX, ..position },
        seq => Position { seq: seq - 1, ..position },
    }
}

fn unix_seconds() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Why a POST got no answer, without the URL (it is the subscription's, shown beside it anyway).
fn reqwest_failure(err: &reqwest::Error) -> String {
    let kind = if err.is_timeout() {
        "timed out"
    } else if err.is_connect() {
        "could not connect"
    } else {
        "no answer"
    };
    let mut reason = kind.to_owned();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        reason = format!("{kind}: {cause}");
        source = cause.source();
    }
    reason
}
