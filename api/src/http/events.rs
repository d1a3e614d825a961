//! `GET /v1/events`: the event log as Server-Sent Events.
//!
//! One poller per process (the [`EventHub`]) reads the log past the horizon, woken at once by this process's own
//! commits (and polling for other processes'), and fans each event out, rendered
//! once, over a broadcast channel. A subscriber first catches up from its own position (`Last-Event-ID` or
//! `?after=`) with its own reads, then follows the hub, skipping what it already sent: every event once, in log
//! order. The channel never waits for anyone: a subscriber that falls a whole buffer behind is cut off with a
//! `cut-off` event naming the position to resume from, so a slow reader never slows the others or the writers.

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use bc_domain::stream::type_matches;
use bc_eventstore::Position;
use bc_eventstore::events::RecordedEvent;
use futures_util::Stream;
use serde::Deserialize;
use serde_json::json;

use crate::wire::ops::EventDto;
use tokio::sync::broadcast;

use super::consistency::check_within_log;
use super::error::{CommonErrors, ErrorBody};
use super::request::{Authed, QueryParams, RequestId, path_id};
use super::{ApiError, AppState};
use bc_commands::App;
use bc_commands::door::Subject;
use bc_commands::log::CatchUpRead;

/// How the stream reads and fans out.
#[derive(Debug, Clone)]
pub struct EventsConfig {
    /// The hub's pause after a read that came back short, unless this process commits events sooner.
    pub poll: Duration,
    /// Events read per query.
    pub batch: u32,
    /// Events the broadcast holds for the slowest subscriber before it is cut off.
    pub buffer: usize,
    /// The interval of heartbeat comments on an idle stream.
    pub heartbeat: Duration,
    /// The limits on open streams: a stream past one is refused with `429 TOO_MANY_STREAMS`.
    pub limits: StreamLimits,
    /// Reads of the log made for subscribers (catch-ups and gap fills) that run at once; the others wait their
    /// turn, so many streams resumed from far back share a few database connections instead of taking them all.
    pub log_readers: usize,
}

impl Default for EventsConfig {
    fn default() -> Self {
        Self {
            poll: Duration::from_millis(50),
            batch: 500,
            buffer: 4096,
            heartbeat: Duration::from_secs(15),
            limits: StreamLimits::default(),
            log_readers: 4,
        }
    }
}

/// How many event streams a process serves at once: in all, to one tenant's identities together, and to one
/// identity. A stream counts from the moment it is admitted until its connection is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    pub process: usize,
    pub tenant: usize,
    pub identity: usize,
}

impl Default for StreamLimits {
    fn default() -> Self {
        Self { process: 4096, tenant: 256, identity: 64 }
    }
}

/// A stream refused because a limit is reached: which one, and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamsFull {
    /// `process`, `tenant` or `identity`.
    pub scope: &'static str,
    pub limit: usize,
}

impl std::fmt::Display for StreamsFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.scope {
            "process" => write!(f, "this server already serves its limit of {} event streams", self.limit),
            scope => write!(f, "this {scope} already holds its limit of {} open event streams", self.limit),
        }
    }
}

/// The streams open now, counted by who holds them.
#[derive(Debug, Default)]
struct OpenStreams {
    total: usize,
    by_tenant: std::collections::HashMap<String, usize>,
    by_identity: std::collections::HashMap<(String, String), usize>,
}

/// One admitted stream's place in the counts, given back when it is dropped (the connection closed).
#[derive(Debug)]
pub struct StreamSlot {
    hub: Arc<EventHub>,
    /// (tenant, identity).
    holder: (String, String),
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.hub.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        open.total = open.total.saturating_sub(1);
        release(&mut open.by_tenant, &self.holder.0);
        release(&mut open.by_identity, &self.holder);
    }
}

/// One fewer under `key`; the entry goes at zero, so the maps hold only who has streams open.
fn release<K: std::hash::Hash + Eq>(counts: &mut std::collections::HashMap<K, usize>, key: &K) {
    if let Some(count) = counts.get_mut(key) {
        *count = count.saturating_sub(1);
        if *count == 0 {
            counts.remove(key);
        }
    }
}

/// One event as the hub fans it out: rendered once for every subscriber.
#[derive(Debug)]
pub struct Delivered {
    pub position: Position,
    /// The hub's position before this event: it had published everything up to here (or started here).
    pub prev: Position,
    pub event_type: String,
    pub stream_id: String,
    pub tenant_id: Option<String>,
    pub data: String,
}

impl Delivered {
    fn new(event: &RecordedEvent, prev: Position) -> Self {
        Delivered {
            position: event.position,
            prev,
            event_type: event.event_type.clone(),
            stream_id: event.stream_id.clone(),
            tenant_id: event.tenant_id.clone(),
            data: event_json(event),
        }
    }
}

/// The process's one log poller, started by the first subscriber.
#[derive(Debug)]
pub struct EventHub {
    app: App,
    config: EventsConfig,
    sender: broadcast::Sender<Arc<Delivered>>,
    /// Where the hub started following the log, once it has.
    started: OnceLock<Position>,
    /// The position of the last event published (or where the hub started).
    published: std::sync::Mutex<Option<Position>>,
    /// Set when the server shuts down: every stream ends, telling its client when to come back.
    closing: tokio::sync::watch::Sender<bool>,
    /// The streams admitted and not yet dropped.
    open: std::sync::Mutex<OpenStreams>,
    /// Permits for subscribers' own reads of the log.
    log_readers: tokio::sync::Semaphore,
}

impl EventHub {
    pub fn new(app: App, config: EventsConfig) -> Self {
        let (sender, _) = broadcast::channel(config.buffer.max(1));
        let (closing, _) = tokio::sync::watch::channel(false);
        let log_readers = tokio::sync::Semaphore::new(config.log_readers.max(1));
        EventHub {
            app,
            config,
            sender,
            started: OnceLock::new(),
            published: std::sync::Mutex::new(None),
            closing,
            open: std::sync::Mutex::default(),
            log_readers,
        }
    }

    /// Admits one more stream for `identity` of `tenant`, or says which limit it would pass (the identity's,
    /// the tenant's, then the process's). The slot counts until it is dropped.
    pub fn admit(self: &Arc<Self>, tenant: &str, identity: &str) -> Result<StreamSlot, StreamsFull> {
        let limits = self.config.limits;
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let holder = (tenant.to_owned(), identity.to_owned());
        // The caller's own limit is named first: it is the one the caller can do something about.
        if open.by_identity.get(&holder).copied().unwrap_or(0) >= limits.identity {
            return Err(StreamsFull { scope: "identity", limit: limits.identity });
        }
        if open.by_tenant.get(tenant).copied().unwrap_or(0) >= limits.tenant {
            return Err(StreamsFull { scope: "tenant", limit: limits.tenant });
        }
        if open.total >= limits.process {
            return Err(StreamsFull { scope: "process", limit: limits.process });
        }
        open.total += 1;
        *open.by_tenant.entry(holder.0.clone()).or_default() += 1;
        *open.by_identity.entry(holder.clone()).or_default() += 1;
        drop(open);
        Ok(StreamSlot { hub: Arc::clone(self), holder })
    }

    /// How many admitted streams are open now: in all, and for `tenant`.
    pub fn open_streams(&self, tenant: &str) -> (usize, usize) {
        let open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        (open.total, open.by_tenant.get(tenant).copied().unwrap_or(0))
    }

    /// A subscriber's own read of the log after `after` and up to `until`, once a reader's permit is free: the
    /// gap between its catch-up and the hub's fan-out.
    async fn gap_read(&self, after: Position, until: Position) -> bc_commands::AppResult<Vec<RecordedEvent>> {
        // The semaphore is never closed, so this always holds a permit.
        let _permit = self.log_readers.acquire().await.ok();
        self.app.log_range(after, until, self.config.batch).await
    }

    /// One read of a subscriber's catch-up after `after` ([`App::catch_up_after`]), once a reader's permit is free.
    async fn catch_up_read(&self, after: Position, tenant: Option<&str>) -> bc_commands::AppResult<CatchUpRead> {
        // The semaphore is never closed, so this always holds a permit.
        let _permit = self.log_readers.acquire().await.ok();
        self.app.catch_up_after(after, self.config.batch, tenant).await
    }

    /// Ends every stream (the server is shutting down): each tells its client where to resume and when to
    /// reconnect, so a graceful shutdown does not wait for subscribers to leave.
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    /// How far the hub has published; `None` before it started.
    pub fn published(&self) -> Option<Position> {
        *self.published.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn set_published(&self, position: Position) {
        *self.published.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(position);
    }

    pub fn config(&self) -> &EventsConfig {
        &self.config
    }

    /// How many event streams this process serves now.
    pub fn subscribers(&self) -> usize {
        self.sender.receiver_count()
    }

    /// A receiver of everything the hub publishes from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Delivered>> {
        self.sender.subscribe()
    }

    /// Starts the hub after `position` if it has not started yet, and answers where it started. Its first
    /// subscriber starts it where that subscriber's catch-up from the log ended, so nothing the subscriber has
    /// not seen is ever behind the hub's start without the subscriber knowing.
    pub fn start(self: &Arc<Self>, position: Position) -> Position {
        *self.started.get_or_init(|| {
            self.set_published(position);
            let hub = Arc::clone(self);
            tokio::spawn(async move { hub.run(position).await });
            position
        })
    }

    /// Follows the log after `cursor`, publishing each event once, in order, for as long as anyone holds the hub.
    async fn run(self: Arc<Self>, mut cursor: Position) {
        // This process's own commits wake the hub at once; the poll is for the other processes'.
        let mut appends = self.app.db().appends();
        let mut chase = Duration::ZERO;
        // The hub holds itself through this task; it stops once the router's state is gone.
        while Arc::strong_count(&self) > 1 {
            match self.app.log_after(cursor, self.config.batch).await {
                Ok(batch) => {
                    let short = batch.len() < self.config.batch as usize;
                    for event in &batch {
                        let prev = std::mem::replace(&mut cursor, event.position);
                        // No receivers is not an error: the events are in the log for whoever comes.
                        let _ = self.sender.send(Arc::new(Delivered::new(event, prev)));
                    }
                    self.set_published(cursor);
                    if !short {
                        continue;
                    }
                    if *appends.borrow_and_update() > cursor {
                        // This process committed past the cursor, but an older transaction (of any database of
                        // the cluster) still holds the horizon back: look again soon, then less often.
                        chase = (chase * 2).clamp(Duration::from_millis(1), self.config.poll);
                        tokio::time::sleep(chase).await;
                        continue;
                    }
                    chase = Duration::ZERO;
                    tokio::select! {
                        () = tokio::time::sleep(self.config.poll) => {}
                        Ok(()) = appends.changed() => {}
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, "event stream: reading the log failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}

/// What a subscriber receives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// `None`: every tenant's events (the root tenant); otherwise only this tenant's.
    pub tenant: Option<String>,
    /// Exact types or `family.*`; empty: every type.
    pub types: Vec<String>,
    pub stream: Option<String>,
}

impl Filter {
    pub(crate) fn admits(&self, tenant: Option<&str>, event_type: &str, stream_id: &str) -> bool {
        self.tenant.as_deref().is_none_or(|wanted| tenant == Some(wanted))
            && self.stream.as_deref().is_none_or(|wanted| wanted == stream_id)
            && (self.types.is_empty() || self.types.iter().any(|t| type_matches(t, event_type)))
    }
}

/// One item of a subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// An event: its position (the SSE `id:`), type and JSON.
    Event { position: Position, event_type: String, data: String },
    /// The subscriber fell too far behind and is cut off; it may resume after `resume_after`.
    CutOff { resume_after: Position },
    /// Reading the log failed; the subscriber may resume after `resume_after`.
    Failed { resume_after: Position },
    /// The server is shutting down; the subscriber may resume after `resume_after` (on another process, or
    /// this one once it is back).
    Closing { resume_after: Position },
}

/// Every event after `after` that `filter` admits, once each, in log order: a catch-up from the log, then the
/// hub's fan-out.
pub fn subscription(hub: Arc<EventHub>, after: Position, filter: Filter) -> impl Stream<Item = Item> + Send {
    async_stream::stream! {
        let mut live = hub.subscribe();
        let mut closing = hub.closing.subscribe();
        let mut last = after;
        loop {
            let read = match hub.catch_up_read(last, filter.tenant.as_deref()).await {
                Ok(read) => read,
                Err(err) => {
                    tracing::warn!(error = %err, "event stream: a subscriber's catch-up failed");
                    yield Item::Failed { resume_after: last };
                    return;
                }
            };
            for event in read.events {
                if filter.admits(event.tenant_id.as_deref(), &event.event_type, &event.stream_id) {
                    let data = event_json(&event);
                    yield Item::Event { position: event.position, event_type: event.event_type, data };
                }
            }
            last = read.covered;
            if !read.more {
                break;
            }
        }
        // Whatever lies between this catch-up's end and where the hub started (a hub started earlier by another
        // subscriber), and later between this subscriber's last event and each delivered event's predecessor,
        // comes from the log: every event is visible by then, so none is skipped.
        let mut fill_to = hub.start(last);
        let mut pending: Option<Arc<Delivered>> = None;
        loop {
            while fill_to > last {
                let batch = match hub.gap_read(last, fill_to).await {
                    Ok(batch) if !batch.is_empty() => batch,
                    Ok(_) => break,
                    Err(err) => {
                        tracing::warn!(error = %err, "event stream: filling a subscriber's gap failed");
                        yield Item::Failed { resume_after: last };
                        return;
                    }
                };
                for event in batch {
                    last = event.position;
                    if filter.admits(event.tenant_id.as_deref(), &event.event_type, &event.stream_id) {
                        let data = event_json(&event);
                        yield Item::Event { position: event.position, event_type: event.event_type, data };
                    }
                }
            }
            if let Some(delivered) = pending.take() {
                last = delivered.position;
                if filter.admits(delivered.tenant_id.as_deref(), &delivered.event_type, &delivered.stream_id) {
                    yield Item::Event {
                        position: delivered.position,
                        event_type: delivered.event_type.clone(),
                        data: delivered.data.clone(),
                    };
                }
            }
            let received = tokio::select! {
                biased;
                _ = closing.wait_for(|closed| *closed) => None,
                received = live.recv() => Some(received),
            };
            let Some(received) = received else {
                yield Item::Closing { resume_after: last };
                return;
            };
            match received {
                Ok(delivered) if delivered.position <= last => {}
                Ok(delivered) => {
                    fill_to = delivered.prev;
                    pending = Some(delivered);
                }
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::info!(missed, resume_after = %last, "event stream: cut off a subscriber that fell behind");
                    yield Item::CutOff { resume_after: last };
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}

/// The `retry:` a stream ends with when the server shuts down: when an EventSource client reconnects.
pub const CLOSING_RETRY: Duration = Duration::from_secs(1);

/// The `Retry-After` of a stream refused for a full limit: streams are long-lived, so one frees up slowly.
pub const STREAMS_FULL_RETRY_SECONDS: u32 = 5;

/// Query of `GET /v1/events`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsParams {
    /// Resume after this position (as `Last-Event-ID` does).
    pub after: Option<String>,
    /// Comma-separated event types; `reservation.*` matches a family. Each must be a type (or family) the
    /// service knows: a misspelled one is refused with 400 rather than matching nothing.
    pub types: Option<String>,
    pub stream: Option<String>,
    /// A stream ticket (`POST /v1/events/tickets`) instead of the `Authorization` header, for a browser's
    /// `EventSource`, which cannot send one.
    pub ticket: Option<String>,
    /// `type` (the default): each event is named by its type (`event: reservation.placed`), for
    /// `addEventListener`; `message`: events are unnamed, so `EventSource.onmessage` receives every one (the
    /// type is in the data's `eventType`). The stream's own notices (`cut-off`, `closing`, `error`) keep their
    /// names.
    #[param(pattern = "^(type|message)$")]
    pub event_name: Option<String>,
}

/// `GET /v1/events`.
#[utoipa::path(
    get,
    path = "/v1/events",
    tag = "events",
    summary = "The event log as Server-Sent Events: `id:` is the position",
    params(EventsParams, ("Last-Event-ID" = Option<String>, Header, description = "Resume after this position")),
    responses(
        CommonErrors,
        (status = 200, description = "text/event-stream", content_type = "text/event-stream", body = String),
        (status = 429, description = "`TOO_MANY_STREAMS`: the caller's identity or tenant, or the whole server, already holds its limit of open streams (`details.scope`, `details.limit`); `Retry-After` says when to try again", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn event_stream(
    State(state): State<AppState>,
    who: Result<Authed, ApiError>,
    RequestId(request_id): RequestId,
    headers: HeaderMap,
    QueryParams(params): QueryParams<EventsParams>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let who = match (&params.ticket, who) {
        (Some(ticket), _) if !headers.contains_key("authorization") => {
            Authed(state.app.authenticate_ticket(ticket, &request_id)?)
        }
        (_, who) => who?,
    };
    let named = match params.event_name.as_deref() {
        None | Some("type") => true,
        Some("message") => false,
        Some(_) => return Err(ApiError::invalid_argument("eventName", "must be `type` or `message`")),
    };
    state.app.authorize(&who.0, "events.stream", Subject::OwnTenant).await?;
    let from_header = headers.get("last-event-id").map(|v| {
        v.to_str()
            .map_err(|_| ApiError::invalid_argument("Last-Event-ID", "is not text"))
            .and_then(|text| path_id::<Position>("Last-Event-ID", text.trim()))
    });
    // Both forms are checked when both are sent; the header wins, as browsers send it on reconnecting.
    let from_query = params.after.as_deref().map(|text| path_id::<Position>("after", text)).transpose()?;
    let after = match (from_header.transpose()?, from_query) {
        (Some(position), _) => {
            check_within_log(&state.app, "Last-Event-ID", position).await?;
            position
        }
        (None, Some(position)) => {
            check_within_log(&state.app, "after", position).await?;
            position
        }
        // Without a position the stream starts at the log's head as of this request, fixed before the
        // response starts, so whatever commits after the subscriber has its headers is delivered.
        (None, None) => state.app.log_head().await?,
    };
    let types = bc_domain::stream::parse_type_filter(params.types.as_deref().unwrap_or_default())
        .map_err(|reason| ApiError::invalid_argument("types", reason))?;
    let filter = Filter {
        tenant: if who.0.principal.is_root() { None } else { Some(who.0.principal.tenant_id.to_string()) },
        types,
        stream: params.stream,
    };
    // Admitted last, once everything else about the request is known to be good; the slot is held by the
    // response's stream and given back when the connection is gone.
    let principal = &who.0.principal;
    let slot = state.events.admit(principal.tenant_id.as_str(), principal.identity.as_str()).map_err(|full| {
        ApiError::new(axum::http::StatusCode::TOO_MANY_REQUESTS, "TOO_MANY_STREAMS", full.to_string())
            .with_details(json!({ "scope": full.scope, "limit": full.limit }))
            .with_retry_after(STREAMS_FULL_RETRY_SECONDS)
    })?;
    let heartbeat = state.events.config().heartbeat;
    let items = subscription(Arc::clone(&state.events), after, filter);
    let sse = futures_util::StreamExt::map(items, move |item| {
        let _held = &slot;
        Ok(match item {
            Item::Event { position, event_type, data } if named => {
                Event::default().id(position.to_string()).event(event_type).data(data)
            }
            Item::Event { position, data, .. } => Event::default().id(position.to_string()).data(data),
            Item::CutOff { resume_after } => Event::default().event("cut-off").data(
                json!({ "reason": "the subscriber fell too far behind", "resumeAfter": resume_after.to_string() })
                    .to_string(),
            ),
            Item::Failed { resume_after } => Event::default().event("error").data(
                json!({ "reason": "reading the event log failed", "resumeAfter": resume_after.to_string() })
                    .to_string(),
            ),
            Item::Closing { resume_after } => Event::default().event("closing").retry(CLOSING_RETRY).data(
                json!({ "reason": "the server is shutting down", "resumeAfter": resume_after.to_string() }).to_string(),
            ),
        })
    });
    Ok(Sse::new(sse).keep_alive(KeepAlive::new().interval(heartbeat).text("heartbeat")))
}

/// `POST /v1/events/tickets`.
#[utoipa::path(
    post,
    path = "/v1/events/tickets",
    tag = "events",
    summary = "A short-lived stream ticket: open the event stream as `GET /v1/events?ticket=...` where no Authorization header can be sent (a browser's EventSource)",
    responses(CommonErrors, (status = 201, description = "The ticket: it speaks for the caller for five minutes, reconnections included", body = StreamTicketDto)),
    security(("bearer" = [])),
)]
pub async fn issue_ticket(
    State(state): State<AppState>,
    who: Authed,
) -> Result<(axum::http::StatusCode, axum::Json<StreamTicketDto>), ApiError> {
    state.app.authorize(&who.0, "events.tickets.create", Subject::OwnTenant).await?;
    let issued = state.app.issue_stream_ticket(&who.0);
    Ok((
        axum::http::StatusCode::CREATED,
        axum::Json(StreamTicketDto { ticket: issued.ticket, expires_at: issued.expires_at_ms }),
    ))
}

/// A stream ticket.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StreamTicketDto {
    /// Pass as `?ticket=` to `GET /v1/events`.
    pub ticket: String,
    /// Epoch milliseconds.
    pub expires_at: i64,
}

/// An event as the stream's `data:` and `events tail` show it: its position and identity, the payload and
/// metadata decoded (see [`EventDto`]).
pub fn event_json(event: &RecordedEvent) -> String {
    serde_json::to_string(&EventDto::from(event)).unwrap_or_else(|err| format!("{{\"undecodable\": \"{err}\"}}"))
}
