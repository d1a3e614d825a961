//! The harness itself: its cluster runs with transaction ids above 2^32, and its supervisor removes the
//! cluster when the test process dies, even by abort.

use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bc_eventstore::testing::{self, TestDb};
use bc_eventstore::{TxOptions, sql};

const PROBE_VAR: &str = "BC_HARNESS_PROBE";
const PROBE_TEST: &str = "harness::the_supervisor_removes_the_cluster_when_the_test_process_dies";
const CRASH_PROBE_TEST: &str = "harness::a_server_crash_during_the_run_is_reported_from_its_log";

#[tokio::test]
async fn every_test_runs_with_transaction_ids_above_2_pow_32() {
    let t = TestDb::new().await;
    let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    let txid: String = sql::query_scalar("SELECT pg_current_xact_id()::text").fetch_one(tx.conn()).await.expect("q");
    tx.rollback().await;
    assert!(txid.parse::<u64>().expect("number") > 3 << 32, "{txid}");
}

#[tokio::test]
async fn each_test_gets_its_own_migrated_database() {
    let a = TestDb::new().await;
    let b = TestDb::new().await;
    assert_ne!(a.name, b.name);
    let mut tx = a.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    sql::query("CREATE TABLE only_in_a (id int)").execute(tx.conn()).await.expect("create");
    tx.commit().await.expect("commit");
    let mut tx = b.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let in_b: bool =
        sql::query_scalar("SELECT to_regclass('only_in_a') IS NOT NULL").fetch_one(tx.conn()).await.expect("q");
    let migrated: bool =
        sql::query_scalar("SELECT to_regclass('events') IS NOT NULL").fetch_one(tx.conn()).await.expect("q");
    tx.commit().await.expect("commit");
    assert!(!in_b);
    assert!(migrated);
}

#[test]
fn the_supervisor_removes_the_cluster_when_the_test_process_dies() {
    if std::env::var_os(PROBE_VAR).is_some() {
        // The probe: start the harness, say where its cluster is, and die without any cleanup of our own.
        let server = testing::server();
        let cluster = server.cluster().expect("a private cluster");
        let pid = std::fs::read_to_string(cluster.pgdata().join("postmaster.pid")).unwrap_or_default();
        println!("probe-postmaster {}", pid.lines().next().unwrap_or_default());
        println!("probe-cluster {}", cluster.root().display());
        std::process::abort();
    }
    if std::env::var_os(testing::TEST_DATABASE_URL_VAR).is_some() {
        // With an existing server there is no private cluster to remove; the databases are dropped instead.
        return;
    }
    let mut probe = Command::new(std::env::current_exe().expect("test binary"))
        .args([PROBE_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(PROBE_VAR, "1")
        .env_remove(testing::KEEP_VAR)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the probe");
    let mut lines = BufReader::new(probe.stdout.take().expect("stdout")).lines().map_while(Result::ok);
    let mut field = |name: &str| {
        lines
            .find_map(|line| line.split_once(name).map(|(_, value)| value.trim().to_owned()))
            .unwrap_or_else(|| panic!("the probe reports {name}"))
    };
    let postmaster: u32 = field("probe-postmaster ").parse().expect("a pid");
    let root = PathBuf::from(field("probe-cluster "));
    let status = probe.wait().expect("probe exit");
    assert!(!status.success(), "the probe aborted");
    assert!(root.starts_with(std::env::temp_dir()), "{}", root.display());

    let deadline = Instant::now() + Duration::from_secs(60);
    while root.exists() || is_alive(postmaster) {
        assert!(
            Instant::now() < deadline,
            "after the probe died: cluster folder {} exists: {}; postmaster {postmaster} runs: {}",
            root.display(),
            root.exists(),
            is_alive(postmaster)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a process runs: it exists and is not a zombie waiting for a parent that may never reap it.
fn is_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, Some('Z' | 'X') | None)
}

#[tokio::test]
async fn a_server_crash_during_the_run_is_reported_from_its_log() {
    if std::env::var_os(PROBE_VAR).is_some() {
        // The probe: a backend of the harness's server dies by SIGKILL, as the OOM killer would end it; the
        // postmaster restarts every backend, and the probe dies once its log says so.
        let t = TestDb::new().await;
        let log = testing::server().cluster().expect("a private cluster").log_file();
        let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
        let pid: i32 = sql::query_scalar("SELECT pg_backend_pid()").fetch_one(tx.conn()).await.expect("pid");
        let killed = Command::new("kill").args(["-KILL", &pid.to_string()]).status().expect("kill");
        assert!(killed.success());
        let deadline = Instant::now() + Duration::from_secs(60);
        while !std::fs::read_to_string(&log).unwrap_or_default().contains("terminated by signal 9") {
            assert!(Instant::now() < deadline, "the server never logged the crash");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::process::abort();
    }
    if std::env::var_os(testing::TEST_DATABASE_URL_VAR).is_some() {
        // An existing server is not the harness's to crash.
        return;
    }
    let output = Command::new(std::env::current_exe().expect("test binary"))
        .args([CRASH_PROBE_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(PROBE_VAR, "1")
        .env_remove(testing::KEEP_VAR)
        .stdin(Stdio::null())
        .output()
        .expect("run the probe");
    assert!(!output.status.success(), "the probe aborted");
    // The supervisor writes after the probe is gone, to the same stderr, which `output` reads to its end.
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("the tests' PostgreSQL server failed during the run"), "{stderr}");
    assert!(stderr.contains("was terminated by signal 9"), "{stderr}");
}
