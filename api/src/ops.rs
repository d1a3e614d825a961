//! The operator's and investigator's commands: projection status, forced rebuilds, the daemon on its own, and
//! reading the event log (`events tail`, `events show`, `events replay`), and following a workflow
//! (`workflows watch`).

use std::io::Write as _;
use std::time::Duration;

use anyhow::{Context as _, bail};
use bc_eventstore::events::{self, SubscribeOptions};
use bc_eventstore::{Db, Position, TxOptions};
use bc_projections::framework::{self, DaemonConfig};
use bc_projections::{models, rebuild, replay, status};
use futures_util::StreamExt as _;
use serde_json::json;

use crate::http::events::event_json;
use bc_commands::App;
use bc_domain::stream::{parse_type_filter, type_matches};

/// `projections status`: one line per projection version.
pub async fn projections_status(db: &Db) -> anyhow::Result<()> {
    let rows = status::status(db, &models::read_models()).await.context("read the projections' status")?;
    println!(
        "{:<24} {:>7} {:<12} {:<6} {:<28} {:>10} {:>10}",
        "PROJECTION", "VERSION", "STATE", "ACTIVE", "POSITION", "LAG EVENTS", "LAG SECS"
    );
    for row in rows {
        println!(
            "{:<24} {:>7} {:<12} {:<6} {:<28} {:>10} {:>10.1}",
            row.name,
            row.version,
            row.state,
            if row.active { "yes" } else { "no" },
            row.position.to_string(),
            row.lag_events,
            row.lag_seconds
        );
    }
    Ok(())
}

/// `projections rebuild NAME`: rebuilds the named read model's current version from the log while the live one
/// serves, with a progress bar.
pub async fn projections_rebuild(db: &Db, name: &str) -> anyhow::Result<()> {
    let projections = models::read_models();
    let Some(projection) = projections.iter().filter(|p| p.name() == name).max_by_key(|p| p.version()) else {
        let known: Vec<&str> = projections.iter().map(|p| p.name()).collect();
        bail!("INVALID_ARGUMENT: no projection named {name:?}; the read models are {}", known.join(", "));
    };
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} events ({per_sec}, {eta})")
            .context("progress bar template")?
            .progress_chars("=> "),
    );
    bar.set_message(format!("rebuilding {} v{}", projection.name(), projection.version()));
    let applied = rebuild::force_rebuild(db, projection.as_ref(), &|read, total| {
        bar.set_length(total.max(read));
        bar.set_position(read);
    })
    .await
    .with_context(|| format!("rebuild {name}"))?;
    bar.finish_and_clear();
    // Printed as a line of its own, so that it is there also when standard error is not a terminal (the
    // progress bar draws nothing then).
    println!("rebuilt {} v{}: {applied} events applied", projection.name(), projection.version());
    Ok(())
}

/// `projections run`: the projection daemon alone, until Ctrl-C or SIGTERM.
pub async fn projections_run(db: Db, config: DaemonConfig) -> anyhow::Result<()> {
    let shutdown = crate::service::shutdown_signal();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let daemon = tokio::spawn(framework::run_daemon(db, models::read_models(), config, stopped));
    shutdown.await;
    let _ = stop.send(true);
    daemon.await.context("stop the projection daemon")?;
    Ok(())
}

/// `events tail`: follows the log live (from `after`, or from now), one JSON line per event.
pub async fn events_tail(
    db: &Db,
    after: Option<Position>,
    types: &[String],
    stream: Option<&str>,
) -> anyhow::Result<()> {
    // The same filter the event stream takes, refused the same way.
    let types =
        parse_type_filter(&types.join(",")).map_err(|reason| anyhow::anyhow!("INVALID_ARGUMENT: --type {reason}"))?;
    if let Some(after) = after {
        refuse_beyond_log(db, "--after", after).await?;
    }
    let after = match after {
        Some(position) => position,
        None => {
            let mut tx = db.begin(TxOptions::READ_ONLY).await?;
            let head = events::horizon_head(&mut tx).await?;
            tx.commit().await?;
            head
        }
    };
    let subscription = events::subscribe(
        db.clone(),
        after,
        SubscribeOptions { batch_size: 500, poll_interval: Duration::from_millis(200) },
    );
    let mut subscription = std::pin::pin!(subscription);
    let mut stdout = std::io::stdout().lock();
    let shutdown = crate::service::shutdown_signal();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            next = subscription.next() => {
                let Some(event) = next else { return Ok(()) };
                let event = event.context("read the event log")?;
                if stream.is_some_and(|s| s != event.stream_id) {
                    continue;
                }
                if !types.is_empty() && !types.iter().any(|t| type_matches(t, &event.event_type)) {
                    continue;
                }
                writeln!(stdout, "{}", event_json(&event)).context("write to standard output")?;
                stdout.flush().ok();
            }
        }
    }
}

/// `events show STREAM`: a stream's history with the admission context of each event.
pub async fn events_show(db: &Db, stream: &str) -> anyhow::Result<()> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await?;
    let history = events::read_stream(&mut tx, stream, 0, 1_000_000).await?;
    tx.commit().await?;
    if history.is_empty() {
        bail!("stream {stream} has no events");
    }
    for event in &history {
        println!("{}", event_json(event));
    }
    Ok(())
}

/// What `events replay` folds.
#[derive(Debug, Clone)]
pub enum ReplayTarget {
    Stream(String),
    PoolCapacity(String),
    /// What changed in a pool (capacity, bookings, quotas, policy) between `--until` and `to`.
    PoolDiff {
        pool: String,
        to: Position,
    },
}

/// `events replay --until POSITION`: the state of a stream, or a pool's capacity, as the fold of the log up to
/// that position; with `--diff TO`, what changed in the pool from the one position to the other.
pub async fn events_replay(db: &Db, until: Position, target: ReplayTarget) -> anyhow::Result<()> {
    refuse_beyond_log(db, "--until", until).await?;
    let state = match &target {
        ReplayTarget::Stream(stream) => {
            let events = replay::stream_until(db, stream, until).await?;
            if events.is_empty() {
                bail!("stream {stream} has no events at or before {until}");
            }
            replay::stream_state(&events)?
        }
        ReplayTarget::PoolCapacity(pool) => {
            let figures = replay::capacity_until(db, pool, until).await?;
            json!({ "poolId": pool, "until": until.to_string(), "capacity": figures })
        }
        ReplayTarget::PoolDiff { pool, to } => return pool_diff(db, pool, until, *to).await,
    };
    println!("{}", serde_json::to_string_pretty(&state)?);
    Ok(())
}

/// `events replay --pool P --until A --diff B`.
async fn pool_diff(db: &Db, pool: &str, from: Position, to: Position) -> anyhow::Result<()> {
    refuse_beyond_log(db, "--diff", to).await?;
    let snapshots = replay::pool_snapshots(db, pool, &[from, to]).await?;
    let [before, after] = snapshots.as_slice() else { bail!("the replay answered {} snapshots", snapshots.len()) };
    if !before.exists && !after.exists {
        bail!("NOT_FOUND: pool {pool} existed at neither {from} nor {to}");
    }
    println!("pool {pool} from {from} to {to}:");
    let lines = replay::pool_diff(before, after);
    if lines.is_empty() {
        println!("  no change in its capacity, bookings, quotas or policy");
    }
    for line in lines {
        println!("  {line}");
    }
    Ok(())
}

/// Refuses a position this log never handed out (beyond its end), as the API refuses `after` and
/// `Last-Event-ID`.
async fn refuse_beyond_log(db: &Db, flag: &str, position: Position) -> anyhow::Result<()> {
    if App::new(db.clone()).within_log(position).await? {
        Ok(())
    } else {
        bail!("INVALID_ARGUMENT: {flag} {position} is beyond the end of this event log: it was not handed out by it")
    }
}

/// `workflows watch ID`: follows a workflow to its end with a progress bar (a line per step as it ends, also
/// when standard error is not a terminal); an error when it failed or was cancelled.
pub async fn workflows_watch(db: &Db, id: &str) -> anyhow::Result<()> {
    use bc_domain::workflow::{StepState, action_name};
    let id: bc_domain::id::WorkflowId =
        id.parse().map_err(|err| anyhow::anyhow!("INVALID_ARGUMENT: workflow id: {err}"))?;
    let app = App::new(db.clone());
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} steps ({elapsed})")
            .context("progress bar template")?
            .progress_chars("=> "),
    );
    let mut reported: Vec<Option<String>> = Vec::new();
    loop {
        let wf = app.workflow(&id).await.with_context(|| format!("read workflow {id}"))?;
        let steps = &wf.created.steps;
        reported.resize(steps.len(), None);
        bar.set_length(steps.len() as u64);
        bar.set_position(wf.done() as u64);
        for (n, (spec, state)) in steps.iter().zip(&wf.states).enumerate() {
            let line = match state {
                StepState::Succeeded { attempt, detail, .. } => Some(format!(
                    "step {n} {} succeeded (attempt {attempt}){}",
                    spec.name,
                    detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default()
                )),
                StepState::Failed { attempt, error, .. } => {
                    Some(format!("step {n} {} failed (attempt {attempt} of {}): {error}", spec.name, spec.attempts))
                }
                _ => None,
            };
            if line.is_some() && reported[n] != line {
                bar.println(line.clone().unwrap_or_default());
                reported[n] = line;
            }
        }
        if let Some(outcome) = wf.outcome {
            bar.finish_and_clear();
            let reason = wf.reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
            println!(
                "workflow {id} ({} of node {}) {}{reason}",
                wf.created.kind.as_str(),
                wf.created.node_id,
                outcome.as_str()
            );
            if outcome == bc_domain::workflow::Outcome::Succeeded {
                return Ok(());
            }
            bail!("workflow {id} {}{reason}", outcome.as_str());
        }
        if let Some((n, spec, StepState::Running { attempt, .. })) = wf.current() {
            bar.set_message(format!(
                "{} {}: step {n} {} ({} on {}, attempt {attempt})",
                wf.created.kind.as_str(),
                wf.created.node_id,
                spec.name,
                action_name(spec.action),
                spec.runs_on.as_str()
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
