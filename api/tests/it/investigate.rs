//! The projection daemon as a real process under crashes, and the investigator's commands: `projections status`,
//! `projections rebuild`, `events show`, `events replay`, `events tail`.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bc_domain::device::DeviceClass;
use bc_domain::pool::Sharing;
use bc_eventstore::{Db, TxOptions, sql};
use bc_projections::{models, rebuild};

use bc_commands::testing::{Fleet, T0, request};
use bc_projections::testing::catch_up;

const BINARY: &str = env!("CARGO_BIN_EXE_better-compute");

fn command(fleet: &Fleet, args: &[&str]) -> Command {
    let mut command = Command::new(BINARY);
    command.args(args).env("BETTER_COMPUTE_DATABASE_URL", fleet.t.url()).env("BETTER_COMPUTE_LOG", "warn");
    command
}

fn run(fleet: &Fleet, args: &[&str]) -> String {
    let output = command(fleet, args).output().expect("run");
    assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

async fn total_events(db: &Db) -> i64 {
    let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let n: i64 = sql::query_scalar("SELECT count(*) FROM events").fetch_one(tx.conn()).await.expect("count");
    tx.commit().await.expect("commit");
    n
}

async fn slowest_checkpoint(db: &Db) -> i64 {
    let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let models = models::read_models();
    let names: Vec<&str> = models.iter().map(|p| p.name()).collect();
    let versions: Vec<i32> = models.iter().map(|p| p.version() as i32).collect();
    let n: Option<i64> = sql::query_scalar(
        "SELECT min(coalesce(c.events_passed, 0)) FROM unnest($1::text[], $2::int4[]) AS m(name, version)
         LEFT JOIN projection_checkpoints AS c ON c.name = m.name AND c.version = m.version",
    )
    .bind(&names)
    .bind(&versions)
    .fetch_one(tx.conn())
    .await
    .expect("checkpoints");
    tx.commit().await.expect("commit");
    n.unwrap_or(0)
}

pub(crate) async fn assert_models_equal_rebuilds(db: &Db, when: &str) {
    for projection in models::read_models() {
        for (table, differences) in rebuild::verify(db, projection.as_ref()).await.expect("verify") {
            assert_eq!(differences, 0, "{when}: {table} differs from its rebuild");
        }
    }
}

async fn some_history(fleet: &Fleet, tag: &str) {
    let pool = fleet.pool(&format!("pool-{tag}"), Sharing::Exclusive, None).await;
    fleet.node(&pool, &format!("node-{tag}"), 4, 0).await;
    for n in 0..6 {
        let r = fleet
            .reserve(&fleet.owner, &format!("{tag}-{n}"), request(&pool, DeviceClass::Gpu, 1))
            .await
            .expect("reserve");
        if n % 2 == 0 {
            fleet.app.cancel_reservation(&fleet.owner, &r.reservation.id, None).await.expect("cancel");
        }
    }
}

/// A daemon process, killed if a test fails before it stops it.
struct Daemon(std::process::Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_daemon(fleet: &Fleet, abort_mid_batch: Option<u64>) -> Daemon {
    let mut command = command(fleet, &["projections", "run", "--batch", "3"]);
    if let Some(n) = abort_mid_batch {
        command.env("BETTER_COMPUTE_FAILPOINT_ABORT_MID_BATCH", n.to_string());
    }
    Daemon(command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("spawn the daemon"))
}

/// Simulated time passes beyond the projection leases' TTL, as it would while a crashed daemon stays dead.
async fn let_the_leases_lapse(fleet: &Fleet, at_ms: i64) {
    bc_eventstore::clock::set_sim_clock(&fleet.t.db, at_ms).await.expect("move the clock");
}

fn wait_for_exit(child: &mut std::process::Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        assert!(Instant::now() < deadline, "the daemon did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn the_daemon_killed_in_and_between_batches_resumes_to_models_equal_to_their_rebuilds() {
    let fleet = Fleet::new().await;
    some_history(&fleet, "a").await;

    // Killed in the middle of its second batch that applies anything (after applying, before committing).
    let mut crashing = spawn_daemon(&fleet, Some(2));
    let status = wait_for_exit(&mut crashing.0);
    assert!(!status.success(), "the daemon aborted");
    assert!(slowest_checkpoint(&fleet.t.db).await < total_events(&fleet.t.db).await, "it stopped part way");
    assert_models_equal_rebuilds(&fleet.t.db, "after a crash mid-batch").await;

    // Restarted once the dead daemon's leases lapsed, it catches up; killed between batches (while idle), it
    // loses nothing.
    let_the_leases_lapse(&fleet, T0 + 60_000).await;
    let mut daemon = spawn_daemon(&fleet, None);
    let total = total_events(&fleet.t.db).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while slowest_checkpoint(&fleet.t.db).await < total {
        assert!(Instant::now() < deadline, "the restarted daemon never caught up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    daemon.0.kill().expect("SIGKILL");
    wait_for_exit(&mut daemon.0);
    assert_models_equal_rebuilds(&fleet.t.db, "after a kill between batches").await;

    // More history while no daemon runs; the next one picks it up.
    some_history(&fleet, "b").await;
    let_the_leases_lapse(&fleet, T0 + 120_000).await;
    let mut daemon = spawn_daemon(&fleet, None);
    let total = total_events(&fleet.t.db).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while slowest_checkpoint(&fleet.t.db).await < total {
        assert!(Instant::now() < deadline, "the daemon never caught up again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = daemon.0.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().expect("SIGTERM");
    assert!(wait_for_exit(&mut daemon.0).success(), "a clean stop on SIGTERM");
    assert_models_equal_rebuilds(&fleet.t.db, "at the end").await;
}

#[tokio::test]
async fn status_rebuild_show_replay_and_tail_answer_an_investigator() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    fleet.node(&pool, "a", 4, 0).await;
    let committed = fleet
        .app
        .reserve(
            &fleet.owner,
            bc_commands::reservations::Reserve {
                idempotency_key: "k".into(),
                request: {
                    let mut r = request(&pool, DeviceClass::Gpu, 2);
                    r.start_ms = Some(T0 + 3_600_000);
                    r
                },
            },
        )
        .await
        .expect("reserve");
    let placed_at = committed.position.expect("a position");
    let id = committed.value.reservation.id;
    fleet.app.cancel_reservation(&fleet.owner, &id, Some("plans changed".into())).await.expect("cancel");
    catch_up(&fleet.t.db).await;

    let status = run(&fleet, &["projections", "status"]);
    for projection in models::read_models() {
        assert!(status.lines().any(|l| l.starts_with(projection.name()) && l.contains("live")), "{status}");
    }

    let rebuilt = command(&fleet, &["projections", "rebuild", "pools"]).output().expect("rebuild");
    assert!(rebuilt.status.success(), "{}", String::from_utf8_lossy(&rebuilt.stderr));
    // Its result line is printed when its output is not a terminal too.
    let said = String::from_utf8_lossy(&rebuilt.stdout);
    assert!(said.contains("rebuilt pools v2:") && said.contains("events applied"), "{said}");
    let pools = models::read_models().into_iter().find(|p| p.name() == "pools").expect("pools");
    assert_eq!(rebuild::verify(&fleet.t.db, pools.as_ref()).await.expect("verify"), vec![("pools_v2".to_owned(), 0)]);
    let unknown = command(&fleet, &["projections", "rebuild", "nope"]).output().expect("rebuild");
    assert!(!unknown.status.success());
    let refused = String::from_utf8_lossy(&unknown.stderr);
    assert!(refused.contains("pools"), "names the read models");
    // A user's mistake is one line, never a backtrace.
    assert_eq!(refused.trim_end().lines().count(), 1, "{refused}");
    assert!(!refused.contains("backtrace") && !refused.contains("Caused by"), "{refused}");

    let history = run(&fleet, &["events", "show", id.as_str()]);
    let lines: Vec<serde_json::Value> = history.lines().map(|l| serde_json::from_str(l).expect("json")).collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0]["eventType"], "reservation.requested");
    assert_eq!(lines[0]["metadata"]["admission"]["identity"], "operator@platform");
    assert_eq!(lines[2]["payload"]["reason"], "plans changed");

    let then = run(&fleet, &["events", "replay", "--until", &placed_at.to_string(), "--stream", id.as_str()]);
    let then: serde_json::Value = serde_json::from_str(&then).expect("json");
    assert_eq!(then["state"], "placed", "the state as of the placement");
    let head = lines[2]["position"].as_str().expect("position").to_owned();
    let now: serde_json::Value =
        serde_json::from_str(&run(&fleet, &["events", "replay", "--until", &head, "--stream", id.as_str()]))
            .expect("json");
    assert_eq!(now["state"], "cancelled");

    let capacity_then: serde_json::Value = serde_json::from_str(&run(
        &fleet,
        &["events", "replay", "--until", &placed_at.to_string(), "--pool", pool.as_str()],
    ))
    .expect("json");
    assert_eq!(capacity_then["capacity"][0]["reserved"], 2, "two atoms placed ahead at that position");
    let capacity_now: serde_json::Value =
        serde_json::from_str(&run(&fleet, &["events", "replay", "--until", &head, "--pool", pool.as_str()]))
            .expect("json");
    let mut tx = fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let (allocatable, reserved): (i32, i32) =
        sql::query_as("SELECT allocatable, reserved FROM pool_capacity_rollup_v1 WHERE pool_id = $1")
            .bind(pool.as_str())
            .fetch_one(tx.conn())
            .await
            .expect("rollup");
    tx.commit().await.expect("commit");
    assert_eq!(capacity_now["capacity"][0]["allocatable"], allocatable, "the replayed fold equals the read model");
    assert_eq!(capacity_now["capacity"][0]["reserved"], reserved);

    // Positions beyond the log and type filters the API refuses are refused here the same way.
    for args in [
        vec!["events", "replay", "--until", "999-1-0", "--stream", id.as_str()],
        vec!["events", "tail", "--type", "reservation.plaecd"],
        vec!["events", "tail", "--type", "reserv*"],
        vec!["events", "tail", "--after", "999-1-0"],
    ] {
        let refused = command(&fleet, &args).stdin(Stdio::null()).output().expect("run");
        let text = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{args:?}");
        assert!(text.contains("INVALID_ARGUMENT"), "{args:?}: {text}");
    }
    let mut tail = command(&fleet, &["events", "tail", "--after", "0-0-0", "--type", "reservation.*"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("tail");
    let mut reader = BufReader::new(tail.stdout.take().expect("stdout")).lines();
    let first: serde_json::Value = serde_json::from_str(&reader.next().expect("a line").expect("read")).expect("json");
    let second: serde_json::Value = serde_json::from_str(&reader.next().expect("a line").expect("read")).expect("json");
    tail.kill().expect("kill");
    let _ = tail.wait();
    assert_eq!(first["eventType"], "reservation.requested");
    assert_eq!(second["eventType"], "reservation.placed");
}

/// The owners of the projection leases.
async fn lease_owners(db: &Db) -> Vec<(String, i64)> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let owners: Vec<(String, i64)> =
        sql::query_as("SELECT owner, epoch FROM leases WHERE name LIKE 'singleton:projection:%' ORDER BY name")
            .fetch_all(tx.conn())
            .await
            .expect("leases");
    tx.commit().await.expect("commit");
    owners
}

/// Whether a transaction of this database has been open for a while (a stopped process's, not a running one's).
async fn a_transaction_is_held_open(db: &Db) -> bool {
    let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let held: i64 = sql::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
           AND xact_start < compute_db_clock() - interval '300 milliseconds'",
    )
    .fetch_one(tx.conn())
    .await
    .expect("activity");
    tx.commit().await.expect("commit");
    held > 0
}

fn signal(child: &std::process::Child, name: &str) {
    let status = Command::new("kill").args([&format!("-{name}"), &child.id().to_string()]).status();
    assert!(status.expect("kill").success());
}

#[tokio::test]
async fn a_daemon_paused_past_its_lease_is_fenced_out_and_nothing_is_applied_twice() {
    let fleet = Fleet::new().await;
    some_history(&fleet, "a").await;
    let daemon = |fleet: &Fleet| {
        let args = ["projections", "run", "--batch", "3", "--lease-ttl-ms", "2000", "--lease-renew-ms", "200"];
        Daemon(
            command(fleet, &args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn"),
        )
    };
    let first = daemon(&fleet);
    let total = total_events(&fleet.t.db).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while slowest_checkpoint(&fleet.t.db).await < total {
        assert!(Instant::now() < deadline, "the first daemon never caught up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held_by_first = lease_owners(&fleet.t.db).await;
    assert!(!held_by_first.is_empty());
    let second = daemon(&fleet);

    // Pause the owner between transactions: a pause inside one would hold the takeover up until it resumes,
    // which is the fence working, but not what this test is after.
    loop {
        signal(&first.0, "STOP");
        tokio::time::sleep(Duration::from_millis(400)).await;
        if !a_transaction_is_held_open(&fleet.t.db).await {
            break;
        }
        signal(&first.0, "CONT");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Its leases lapse (the simulated clock moves past them); the second daemon takes every one over.
    bc_eventstore::clock::set_sim_clock(&fleet.t.db, T0 + 60_000).await.expect("move the clock");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let owners = lease_owners(&fleet.t.db).await;
        let taken = owners
            .iter()
            .zip(&held_by_first)
            .all(|((owner, epoch), (old, old_epoch))| owner != old && epoch > old_epoch);
        if taken {
            break;
        }
        assert!(Instant::now() < deadline, "the second daemon never took over: {owners:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    some_history(&fleet, "b").await;
    // The stale owner resumes: its next transaction is refused, and it cannot take the leases back.
    signal(&first.0, "CONT");
    let total = total_events(&fleet.t.db).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while slowest_checkpoint(&fleet.t.db).await < total {
        assert!(Instant::now() < deadline, "the second daemon never caught up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A few of the stale owner's renewal periods later, the second still holds every lease.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let owners = lease_owners(&fleet.t.db).await;
    assert!(owners.iter().zip(&held_by_first).all(|((owner, _), (old, _))| owner != old), "{owners:?}");
    drop(first);
    drop(second);
    assert_models_equal_rebuilds(&fleet.t.db, "after the takeover").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_passes_a_healthy_database_and_names_each_problem_with_what_to_do() {
    let fleet = Fleet::new().await;
    // Healthy: migrated, on the server's clock, nothing behind, nothing due.
    bc_eventstore::clock::restore_system_clock(&fleet.t.db).await.expect("system clock");
    catch_up(&fleet.t.db).await;
    let output =
        command(&fleet, &["doctor", "--pki-dir"]).arg(crate::process::test_pki()).output().expect("run doctor");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "a healthy database passes:\n{text}");
    for line in [
        "migrations: all",
        "btree_gist",
        "business time follows the database server's clock",
        "ok    PKI bundle in",
        "WARN  no worker runs",
        // The test clusters keep PostgreSQL's default of a minute.
        "WARN  autovacuum looks for work every 60 s",
        "do: ALTER SYSTEM SET autovacuum_naptime = '5s'",
        "0 problems",
    ] {
        assert!(text.contains(line), "{line:?} missing:\n{text}");
    }

    // Problems: a simulated clock, history no projection daemon has read, and a writing transaction left open.
    bc_eventstore::clock::use_sim_clock(&fleet.t.db, T0).await.expect("sim clock");
    some_history(&fleet, "doctor").await;
    let mut open = fleet.t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    sql::query("SELECT pg_current_xact_id()::text").execute(open.conn()).await.expect("a transaction id");
    let pid: i32 = sql::query_scalar("SELECT pg_backend_pid()").fetch_one(open.conn()).await.expect("pid");
    let damaged = bc_eventstore::testing::server().scratch_dir("doctor-pki");
    let _ = std::fs::remove_dir_all(&damaged);
    bc_pki::Bundle::init(&damaged, &bc_pki::InitOptions::default()).expect("bundle");
    std::fs::write(damaged.join("sealing.key"), "not a key").expect("damage it");
    let output =
        command(&fleet, &["doctor", "--threshold-secs", "0", "--pki-dir"]).arg(&damaged).output().expect("run doctor");
    open.commit().await.expect("commit");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(output.status.code(), Some(1), "problems fail the run:\n{text}");
    for line in [
        "WARN  business time runs on a simulated clock",
        "do: unless this is a test or simulation database: SELECT restore_system_clock();",
        "FAIL  no process runs the projections",
        &format!("FAIL  transaction of pid {pid}"),
        &format!("do: end it if nobody is waiting on it: SELECT pg_terminate_backend({pid});"),
        "FAIL  the PKI bundle cannot be used: cannot read",
        "sealing.key",
        "from the backup taken with the database; do not make a new one",
    ] {
        assert!(text.contains(line), "{line:?} missing:\n{text}");
    }
}

#[tokio::test]
async fn a_pool_replayed_at_two_positions_says_what_changed_in_its_capacity_bookings_and_quotas() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("diffs", Sharing::Exclusive, None).await;
    fleet.node(&pool, "a", 4, 0).await;
    fleet.offer(&pool, "acme", 4).await;
    let reserve = |key: &'static str, count: u32, start_in_h: i64| {
        let (app, owner, pool) = (fleet.app.clone(), fleet.owner.clone(), pool.clone());
        async move {
            let mut r = request(&pool, DeviceClass::Gpu, count);
            r.start_ms = Some(T0 + start_in_h * 3_600_000);
            app.reserve(&owner, bc_commands::reservations::Reserve { idempotency_key: key.into(), request: r })
                .await
                .expect("reserve")
        }
    };
    let first = reserve("first", 2, 1).await;
    let at = first.position.expect("a position").to_string();
    let first = first.value.reservation.id;

    // Between the two positions: a second machine, the first reservation cancelled, the quota raised, and a
    // second reservation placed.
    fleet.node(&pool, "b", 4, 0).await;
    fleet.app.cancel_reservation(&fleet.owner, &first, None).await.expect("cancel");
    fleet.offer(&pool, "acme", 8).await;
    let second = reserve("second", 1, 2).await;
    let to = second.position.expect("a position").to_string();
    let second = second.value.reservation.id;

    let said = run(&fleet, &["events", "replay", "--pool", pool.as_str(), "--at", &at, "--diff", &to]);
    let lines: Vec<&str> = said.lines().map(str::trim).collect();
    assert_eq!(lines[0], format!("pool {pool} from {at} to {to}:"));
    let has = |prefix: &str, needle: &str| lines.iter().any(|l| l.starts_with(prefix) && l.contains(needle));
    assert!(has("~ capacity gpu:", "allocatable 4 → 8 (+4)"), "{said}");
    assert!(has(&format!("~ booking {first}:"), "placed → cancelled"), "{said}");
    assert!(has(&format!("+ booking {second}:"), "1 gpu, placed"), "{said}");
    assert!(has("~ quota of acme:", "\"gpu\":8"), "{said}");
    assert!(!said.contains("policy"), "the policy did not change: {said}");

    let same = run(&fleet, &["events", "replay", "--pool", pool.as_str(), "--at", &to, "--diff", &to]);
    assert!(same.contains("no change in its capacity, bookings, quotas or policy"), "{same}");
    let refused = command(&fleet, &["events", "replay", "--stream", first.as_str(), "--at", &at, "--diff", &to])
        .output()
        .expect("run");
    assert!(!refused.status.success(), "--diff is for a pool");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("give --pool"), "{refused:?}");
}
