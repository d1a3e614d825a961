//! SSE fan-out, shared by `bench http` and `bench fleet`: subscribers on `GET /v1/events` while reservations are
//! made through the command layer, and the time from each reservation's commit to its `reservation.placed`
//! reaching every subscriber.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use bc_domain::id::PoolId;

use super::percentile;
use super::reserve::gpu_request;
use bc_commands::reservations::Reserve;
use bc_commands::{App, Caller};

/// What one SSE subscriber saw: each `reservation.placed`'s stream id and when it arrived; whether it was cut off.
#[derive(Debug, Default)]
struct Seen {
    arrivals: Vec<(String, Instant)>,
    cut_off: bool,
}

/// Follows `url` with `token` until the task is aborted or the stream ends.
async fn subscribe(
    client: reqwest::Client,
    url: String,
    token: String,
    connected: tokio::sync::mpsc::Sender<()>,
    seen: Arc<std::sync::Mutex<Seen>>,
) -> anyhow::Result<()> {
    let mut reply = client.get(url).bearer_auth(token).send().await?;
    ensure!(reply.status().is_success(), "the event stream answered {}", reply.status());
    connected.send(()).await.ok();
    let mut buffer = String::new();
    while let Some(chunk) = reply.chunk().await? {
        let arrived = Instant::now();
        buffer.push_str(std::str::from_utf8(&chunk).context("the stream is UTF-8")?);
        while let Some(end) = buffer.find("\n\n") {
            let message: String = buffer.drain(..end + 2).collect();
            let mut seen = seen.lock().expect("not poisoned");
            if message.contains("event: cut-off") {
                seen.cut_off = true;
            }
            let Some(start) = message.find("\"streamId\":\"").map(|i| i + 12) else { continue };
            if let Some(len) = message[start..].find('"') {
                seen.arrivals.push((message[start..start + len].to_owned(), arrived));
            }
        }
    }
    Ok(())
}

/// What a fan-out run measured.
pub(crate) struct FanOut {
    pub reservations: usize,
    pub deliveries: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    pub missing: usize,
    pub cut_off: usize,
}

/// How a fan-out run goes: who subscribes and who writes, how many, how fast and for how long.
pub(crate) struct FanOutSpec<'a> {
    /// The server's base URL.
    pub base: &'a str,
    /// The subscribers' bearer token; `who` must see the events it lets through.
    pub token: &'a str,
    pub who: &'a Caller,
    pub pool: &'a PoolId,
    pub subscribers: usize,
    /// Reservations a second, over [`WRITERS`] writers.
    pub rate: u32,
    pub run_for: Duration,
}

/// Writers of a fan-out run.
pub(crate) const WRITERS: usize = 8;

/// The event stream of a server under a fan-out run: every subscriber has the one bench identity, so the limits on
/// open streams are raised past any run's count (the limits themselves are tested in the API's suite).
pub(crate) fn events_config() -> bc_api::http::events::EventsConfig {
    let unlimited = bc_api::http::events::StreamLimits { process: 1_000_000, tenant: 1_000_000, identity: 1_000_000 };
    bc_api::http::events::EventsConfig { limits: unlimited, ..Default::default() }
}

/// `spec.subscribers` streams of `reservation.placed`, while [`WRITERS`] writers reserve one GPU of the pool as
/// `who` (cancelling each at once) at `spec.rate` a second for `spec.run_for`: the time from each `reserve`
/// returning to each subscriber reading its `reservation.placed`. The writers start once every subscriber's
/// response has started, so every one is registered with the server's hub.
pub(crate) async fn fan_out(app: &App, spec: &FanOutSpec<'_>) -> anyhow::Result<FanOut> {
    let subscribers = spec.subscribers;
    let (connected_tx, mut connected_rx) = tokio::sync::mpsc::channel(subscribers.max(1));
    let sse_client = reqwest::Client::builder().pool_max_idle_per_host(0).build()?;
    let mut streams = tokio::task::JoinSet::new();
    let mut seen = Vec::with_capacity(subscribers);
    for _ in 0..subscribers {
        let record = Arc::new(std::sync::Mutex::new(Seen::default()));
        seen.push(Arc::clone(&record));
        let url = format!("{}/v1/events?types=reservation.placed", spec.base);
        streams.spawn(subscribe(sse_client.clone(), url, spec.token.to_owned(), connected_tx.clone(), record));
    }
    drop(connected_tx);
    for _ in 0..subscribers {
        tokio::time::timeout(Duration::from_secs(60), connected_rx.recv())
            .await
            .context("the subscribers did not connect within a minute")?
            .context("a subscriber failed to connect")?;
    }
    let per_writer = Duration::from_secs_f64(WRITERS as f64 / f64::from(spec.rate.max(1)));
    let deadline = Instant::now() + spec.run_for;
    let mut writers = tokio::task::JoinSet::new();
    for writer in 0..WRITERS {
        let (app, pool, who) = (app.clone(), spec.pool.clone(), spec.who.clone());
        let prefix = format!("sse-{}-{writer}", ulid::Ulid::new());
        writers.spawn(async move {
            let mut committed = Vec::new();
            let mut ticks = tokio::time::interval(per_writer);
            let mut n = 0u64;
            while Instant::now() < deadline {
                ticks.tick().await;
                let key = format!("{prefix}-{n}");
                let reserved =
                    app.reserve(&who, Reserve { idempotency_key: key, request: gpu_request(&pool, 1) }).await?;
                let returned = Instant::now();
                if !reserved.value.reservation.allocations.is_empty() {
                    committed.push((reserved.value.reservation.id.to_string(), returned));
                }
                app.cancel_reservation(&who, &reserved.value.reservation.id, None).await?;
                n += 1;
            }
            anyhow::Ok(committed)
        });
    }
    let mut committed: HashMap<String, Instant> = HashMap::new();
    while let Some(done) = writers.join_next().await {
        committed.extend(done.context("join a writer")??);
    }
    let expected = committed.len();
    let waited = Instant::now();
    while waited.elapsed() < Duration::from_secs(30)
        && seen.iter().any(|s| {
            let s = s.lock().expect("not poisoned");
            !s.cut_off && s.arrivals.len() < expected
        })
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    streams.abort_all();
    let mut latencies = Vec::with_capacity(expected * subscribers);
    let (mut missing, mut cut_off) = (0usize, 0usize);
    for record in &seen {
        let record = record.lock().expect("not poisoned");
        cut_off += usize::from(record.cut_off);
        let mut got = 0;
        for (stream, arrived) in &record.arrivals {
            if let Some(at) = committed.get(stream) {
                latencies.push(arrived.saturating_duration_since(*at));
                got += 1;
            }
        }
        missing += expected.saturating_sub(got);
    }
    latencies.sort();
    Ok(FanOut {
        reservations: expected,
        deliveries: latencies.len(),
        p50: percentile(&latencies, 0.5),
        p99: percentile(&latencies, 0.99),
        max: latencies.last().copied().unwrap_or_default(),
        missing,
        cut_off,
    })
}
