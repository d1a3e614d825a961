//! The `better-compute` binary as a real process: `migrate`, `serve` and `dev`, their health endpoint and their
//! shutdown on a signal.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bc_eventstore::cluster::Cluster;
use bc_eventstore::testing::{self, TestDb};
use bc_eventstore::{TxOptions, sql};

const BINARY: &str = env!("CARGO_BIN_EXE_better-compute");
const WAIT: Duration = Duration::from_secs(120);

/// The binary with `args`; a `serve` presents the tests' PKI bundle ([`test_pki`]).
pub(crate) fn command(args: &[&str]) -> Command {
    let mut command = Command::new(BINARY);
    command
        .args(args)
        .env_remove("BETTER_COMPUTE_DATABASE_URL")
        .env_remove("BETTER_COMPUTE_PKI_DIR")
        .env("BETTER_COMPUTE_LOG", "warn");
    if args.first() == Some(&"serve") {
        command.env("BETTER_COMPUTE_PKI_DIR", test_pki());
    }
    command
}

/// The PKI bundle every `serve` of these tests presents, made once per test process.
pub(crate) fn test_pki() -> &'static Path {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("bc-it-pki-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        bc_pki::Bundle::init(&dir, &bc_pki::InitOptions::default()).expect("the tests' PKI bundle");
        dir
    })
}

/// An HTTPS client trusting only the CA in `ca_file`.
pub(crate) fn https_trusting(ca_file: &Path) -> reqwest::ClientBuilder {
    let ca = std::fs::read_to_string(ca_file).expect("the CA certificate");
    reqwest::Client::builder().tls_backend_preconfigured(bc_pki::tls::client_config(&ca, None).expect("client TLS"))
}

/// An HTTPS client trusting only the tests' CA.
pub(crate) fn https() -> reqwest::ClientBuilder {
    https_trusting(&test_pki().join("ca.crt"))
}

/// A running server process, killed on drop if a test fails half-way.
pub(crate) struct Server {
    child: Child,
    pub(crate) base_url: String,
    /// The CA certificate its TLS certificate chains to.
    pub(crate) ca_file: std::path::PathBuf,
    /// Its later standard output lines (kept open, so the process can go on writing).
    lines: mpsc::Receiver<String>,
    /// The lines it printed before it said where it serves.
    earlier: Vec<String>,
}

impl Server {
    /// Starts the process and waits for the line that says where it serves.
    pub(crate) fn start(mut command: Command) -> Server {
        let mut child = command.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("spawn");
        let stdout = child.stdout.take().expect("stdout");
        let (lines, received) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + WAIT;
        let mut earlier = Vec::new();
        loop {
            let line = received
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| panic!("the server never said where it serves: {:?}", child.try_wait()));
            if let Some(url) = line.strip_prefix("better-compute: serving ") {
                let ca_file = test_pki().join("ca.crt");
                return Server { child, base_url: url.trim().to_owned(), ca_file, lines: received, earlier };
            }
            earlier.push(line);
        }
    }

    /// The next standard output line containing `needle`.
    pub(crate) fn line_containing(&mut self, needle: &str) -> String {
        if let Some(at) = self.earlier.iter().position(|line| line.contains(needle)) {
            return self.earlier.remove(at);
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let line = self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| panic!("the server never printed {needle:?}"));
            if line.contains(needle) {
                return line;
            }
        }
    }

    /// A client trusting the server's CA.
    pub(crate) fn client(&self) -> reqwest::Client {
        https_trusting(&self.ca_file).build().expect("client")
    }

    pub(crate) fn signal(&self, name: &str) {
        let status = Command::new("kill").args([&format!("-{name}"), &self.child.id().to_string()]).status();
        assert!(status.expect("kill").success());
    }

    pub(crate) fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "the server did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn healthz(server: &Server) -> (u16, serde_json::Value) {
    let response = server.client().get(format!("{}/v1/healthz", server.base_url)).send().await.expect("request");
    let status = response.status().as_u16();
    (status, response.json().await.expect("json"))
}

#[test]
fn help_lists_the_commands() {
    let output = command(&["--help"]).output().expect("run");
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    for word in ["serve", "migrate", "dev"] {
        assert!(text.contains(word), "{word} missing from --help:\n{text}");
    }
}

/// Writes the tests' authorization file into a scratch folder and returns its path.
pub(crate) fn auth_file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = testing::server().scratch_dir(name);
    std::fs::create_dir_all(&dir).expect("scratch folder");
    let path = dir.join("auth.toml");
    std::fs::write(&path, text).expect("write the auth file");
    path
}

#[test]
fn serve_without_a_database_url_says_what_is_missing() {
    let auth = auth_file("serve-no-url", crate::http_api::AUTH);
    let output = command(&["serve", "--listen", "127.0.0.1:0", "--auth-config"]).arg(&auth).output().expect("run");
    assert!(!output.status.success());
    let text = String::from_utf8_lossy(&output.stderr);
    assert!(text.contains("BETTER_COMPUTE_DATABASE_URL"), "{text}");
}

#[test]
fn serve_without_a_pki_bundle_or_insecure_http_refuses_to_serve_in_the_clear() {
    let auth = auth_file("serve-no-tls", crate::http_api::AUTH);
    let url = "postgres://nobody@127.0.0.1:1/nothing";
    let mut plain = command(&["serve", "--listen", "127.0.0.1:0", "--auth-config"]);
    plain.arg(&auth).env("BETTER_COMPUTE_DATABASE_URL", url).env_remove("BETTER_COMPUTE_PKI_DIR");
    let output = plain.output().expect("run");
    assert!(!output.status.success());
    let text = String::from_utf8_lossy(&output.stderr);
    assert!(text.contains("--pki-dir") && text.contains("--insecure-http"), "{text}");
    // A folder without a bundle: the refusal says how to make one or restore it.
    let empty = testing::server().scratch_dir("no-bundle");
    let mut missing = command(&["serve", "--listen", "127.0.0.1:0", "--auth-config"]);
    missing.arg(&auth).env("BETTER_COMPUTE_DATABASE_URL", url).env("BETTER_COMPUTE_PKI_DIR", &empty);
    let output = missing.output().expect("run");
    assert!(!output.status.success());
    let text = String::from_utf8_lossy(&output.stderr);
    assert!(text.contains("no PKI bundle") && text.contains("pki init") && text.contains("restore"), "{text}");
}

#[test]
fn pki_init_makes_a_bundle_once_and_show_prints_the_ca_fingerprint() {
    let dir = testing::server().scratch_dir("pki-cli").join("bundle");
    let _ = std::fs::remove_dir_all(&dir);
    let init = |names: &[&str]| {
        let mut c = command(&["pki", "init", "--dir"]);
        c.arg(&dir);
        for name in names {
            c.args(["--name", name]);
        }
        c.output().expect("pki init")
    };
    let made = init(&["control.example", "10.0.0.5"]);
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let bundle = bc_pki::Bundle::load(&dir).expect("the bundle it made");
    let text = String::from_utf8_lossy(&made.stdout);
    assert!(text.contains(&bundle.ca_fingerprint()) && text.contains("control.example, 10.0.0.5"), "{text}");
    let again = init(&[]);
    assert!(!again.status.success(), "a second init must refuse");
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    assert_eq!(bc_pki::Bundle::load(&dir).expect("still there").ca_fingerprint(), bundle.ca_fingerprint());
    let show = command(&["pki", "show", "--dir"]).arg(&dir).output().expect("pki show");
    assert!(show.status.success());
    assert!(String::from_utf8_lossy(&show.stdout).contains(&bundle.ca_fingerprint()));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serve_refuses_a_bad_authorization_file_with_invalid_config_before_touching_the_store() {
    // The database URL names a server that does not exist: the refusal comes first, so it never tries it.
    let url = "postgres://nobody@127.0.0.1:1/nothing";
    for (name, text, expected) in [
        ("auth-prefix", "prefix = \"Not A Prefix \"\n", "not a valid, unreserved type name"),
        ("auth-field", "colour = \"blue\"\n", "unknown field"),
    ] {
        let auth = auth_file(name, text);
        let output = command(&["serve", "--listen", "127.0.0.1:0", "--auth-config"])
            .arg(&auth)
            .env("BETTER_COMPUTE_DATABASE_URL", url)
            .output()
            .expect("run");
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("INVALID_CONFIG") && stderr.contains(expected), "{name}: {stderr}");
        assert!(!stderr.contains("127.0.0.1:1"), "{name}: it never connected: {stderr}");
    }
}

#[tokio::test]
async fn migrate_then_serve_answers_healthz_and_stops_on_sigterm() {
    let t = TestDb::empty().await;
    let output = command(&["migrate"]).env("BETTER_COMPUTE_DATABASE_URL", t.url()).output().expect("migrate");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let applied: i64 =
        sql::query_scalar("SELECT count(*) FROM compute_migrations").fetch_one(tx.conn()).await.expect("ledger");
    tx.commit().await.expect("commit");
    assert_eq!(applied as usize, bc_eventstore::migrate::EMBEDDED.len());

    // Started the way many systems start a service, with a soft limit of 512 open files.
    let mut server = Server::start(with_soft_open_files_limit(512, {
        let mut c = command(&["serve", "--no-migrate", "--listen", "127.0.0.1:0", "--auth-config"]);
        c.arg(auth_file("serve", crate::http_api::AUTH)).env("BETTER_COMPUTE_DATABASE_URL", t.url());
        c
    }));
    let (status, body) = healthz(&server).await;
    assert_eq!(status, 200, "{body}");
    // It raised its soft limit on open files to the hard limit.
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", server.child.id())).expect("its limits");
    let open_files: Vec<&str> = limits
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))
        .expect("a limit on open files")
        .split_whitespace()
        .collect();
    assert!(open_files[0] != "512" && open_files[0] == open_files[1], "soft and hard: {open_files:?}");
    // An open event stream does not hold the shutdown: it ends with where to resume and when to reconnect.
    assert!(server.base_url.starts_with("https://"), "serve speaks TLS: {}", server.base_url);
    let mut stream = server
        .client()
        .get(format!("{}/v1/events", server.base_url))
        .bearer_auth(crate::http_api::ROOT)
        .send()
        .await
        .expect("the event stream");
    assert_eq!(stream.status().as_u16(), 200);
    server.signal("TERM");
    let mut text = String::new();
    while let Some(chunk) = tokio::time::timeout(WAIT, stream.chunk()).await.expect("the stream ends").expect("read") {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(text.contains("event: closing") && text.contains("retry: 1000"), "{text}");
    assert!(text.contains("resumeAfter"), "{text}");
    assert!(server.wait().success(), "a clean exit on SIGTERM");
    // Its leases were given up at once, for another process to take without waiting for them to expire.
    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let held: i64 = sql::query_scalar("SELECT count(*) FROM leases WHERE expires_at > compute_now()")
        .fetch_one(tx.conn())
        .await
        .expect("leases");
    tx.commit().await.expect("commit");
    assert_eq!(held, 0, "no lease is still held after a graceful shutdown");
}

/// `command` run with its soft limit on open files lowered to `soft`, through the shell's `ulimit`.
fn with_soft_open_files_limit(soft: u32, command: Command) -> Command {
    let mut wrapped = Command::new("sh");
    wrapped.arg("-c").arg(format!("ulimit -S -n {soft} && exec \"$0\" \"$@\"")).arg(command.get_program());
    wrapped.args(command.get_args());
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => wrapped.env(key, value),
            None => wrapped.env_remove(key),
        };
    }
    wrapped
}

/// Lists `path` as `token` until `done` holds for its items (the read models catch up in the background).
async fn list_until(
    server: &Server,
    path: &str,
    token: &str,
    done: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let response =
            server.client().get(format!("{}{path}", server.base_url)).bearer_auth(token).send().await.expect("request");
        assert_eq!(response.status().as_u16(), 200);
        let listed: serde_json::Value = response.json().await.expect("json");
        let mut items = listed["items"].as_array().cloned().unwrap_or_default();
        if done(&items) {
            items.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
            return items;
        }
        assert!(Instant::now() < deadline, "{path} never reached what was awaited: {listed}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn dev_cluster(data_dir: &Path) -> Cluster {
    let server = testing::server();
    Cluster::new(server.bins().clone(), data_dir.to_path_buf(), server.run_as().clone())
}

#[tokio::test]
async fn dev_runs_on_an_embedded_database_and_stops_it_on_ctrl_c() {
    let server = testing::server();
    let data_dir = server.scratch_dir("dev");
    server.stop_cluster_at_exit(&data_dir);
    // dev adds its servers to the CLI's configuration: this test's own file, not the user's.
    let cli_config = server.scratch_dir("dev-cli").join("config.toml");
    let dev = || {
        let mut c = command(&["dev", "--listen", "127.0.0.1:0", "--data-dir"]);
        c.arg(&data_dir).env("BETTER_COMPUTE_CONFIG", &cli_config);
        c
    };

    let mut first = Server::start(dev());
    // dev made its own PKI bundle in its data folder, and speaks TLS with it.
    first.ca_file = data_dir.join("pki").join("ca.crt");
    assert!(first.base_url.starts_with("https://"), "{}", first.base_url);
    let (status, body) = healthz(&first).await;
    assert_eq!(status, 200, "{body}");
    // It prints ready-to-use tokens; the demo customer sees the two demo pools offered to it.
    let admin = first.line_containing("platform administrator");
    let admin = admin.split("Bearer ").nth(1).expect("a bearer token").trim().to_owned();
    let line = first.line_containing("demo customer");
    let token = line.split("Bearer ").nth(1).expect("a bearer token").trim().to_owned();
    first.line_containing("curl");
    // It says which database URL the other commands take, and they work with it.
    let url_line = first.line_containing("BETTER_COMPUTE_DATABASE_URL='");
    let url = url_line.split('\'').nth(1).expect("a quoted URL").to_owned();
    let status = command(&["projections", "status"]).env("BETTER_COMPUTE_DATABASE_URL", &url).output().expect("run");
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    let names = list_until(&first, "/v1/pools", &token, |items| items.len() == 2).await;
    assert_eq!(names.iter().map(|p| p["name"].as_str().unwrap_or("")).collect::<Vec<_>>(), ["a100", "h100"]);
    // Its simulated machines joined through their agents and are live.
    let nodes = list_until(&first, "/v1/nodes", &admin, |items| {
        items.len() == 5 && items.iter().all(|n| n["connectivity"] == "connected" && n["schedulable"] == true)
    })
    .await;
    assert!(nodes.iter().all(|n| n["provisionState"] == "adopted"), "{nodes:?}");
    first.line_containing("the CLI: better-compute get nodes");
    crate::cli::the_cli_lists_reserves_describes_and_drains_through_the_api(&cli_config).await;
    assert!(dev_cluster(&data_dir).is_running());
    let demo = bc_eventstore::Db::connect_lazy_with(
        dev_cluster(&data_dir).connect_options(bc_api::dev::DEV_DATABASE),
        &testing::test_db_config(),
    );
    let mut tx = demo.begin(TxOptions::READ_ONLY).await.expect("begin");
    let atoms: i64 =
        sql::query_scalar("SELECT count(*) FROM devices WHERE bookable").fetch_one(tx.conn()).await.expect("atoms");
    tx.commit().await.expect("commit");
    demo.close().await;
    assert_eq!(atoms, 32, "three machines of eight simulated H100s and two of four A100s");
    first.signal("INT");
    assert!(first.wait().success(), "a clean exit on Ctrl-C");
    assert!(!dev_cluster(&data_dir).is_running(), "Ctrl-C stops the embedded cluster too");

    // A second start reuses the cluster and its data: the machines come back as the same nodes.
    let ca_before = std::fs::read(data_dir.join("pki").join("ca.crt")).expect("the CA");
    let mut second = Server::start(dev());
    second.ca_file = data_dir.join("pki").join("ca.crt");
    assert_eq!(std::fs::read(&second.ca_file).expect("the CA"), ca_before, "a restart keeps the bundle");
    let (status, _) = healthz(&second).await;
    assert_eq!(status, 200);
    second.line_containing("curl");
    let demo = bc_eventstore::Db::connect_lazy_with(
        dev_cluster(&data_dir).connect_options(bc_api::dev::DEV_DATABASE),
        &testing::test_db_config(),
    );
    let mut tx = demo.begin(TxOptions::READ_ONLY).await.expect("begin");
    let (nodes, connected): (i64, i64) =
        sql::query_as("SELECT count(*), count(*) FILTER (WHERE connectivity = 'connected' AND schedulable) FROM nodes")
            .fetch_one(tx.conn())
            .await
            .expect("nodes");
    tx.commit().await.expect("commit");
    demo.close().await;
    assert_eq!((nodes, connected), (5, 5), "no second node for a machine that came back");
    // A third start while the second runs refuses, naming the folder, and leaves the second serving.
    let auth_before = std::fs::read(data_dir.join("auth.toml")).expect("the authorization file");
    let mut third = dev().stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("start a third dev");
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = third.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = third.kill();
            panic!("a third dev kept running beside the second");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut third.stderr.take().expect("stderr"), &mut stderr).expect("read stderr");
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("another `better-compute dev` is running on"), "{stderr}");
    assert_eq!(std::fs::read(data_dir.join("auth.toml")).expect("the authorization file"), auth_before);
    assert_eq!(healthz(&second).await.0, 200);
    second.signal("INT");
    assert!(second.wait().success());
    assert!(!dev_cluster(&data_dir).is_running());

    // A dev killed outright leaves its cluster running; the next dev adopts it, and its Ctrl-C stops it.
    let mut crashed = Server::start(dev());
    crashed.signal("KILL");
    let _ = crashed.wait();
    assert!(dev_cluster(&data_dir).is_running(), "a killed dev cannot stop its cluster");
    let mut after = Server::start(dev());
    after.ca_file = data_dir.join("pki").join("ca.crt");
    assert_eq!(healthz(&after).await.0, 200);
    after.signal("INT");
    assert!(after.wait().success());
    assert!(!dev_cluster(&data_dir).is_running(), "Ctrl-C stops the cluster it adopted too");
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// A call to the server as the platform: its status and error code.
async fn call(server: &Server, method: reqwest::Method, path: &str, body: Option<serde_json::Value>) -> (u16, String) {
    let mut request = server
        .client()
        .request(method, format!("{}{path}", server.base_url))
        .bearer_auth(crate::http_api::ROOT)
        .header("idempotency-key", bc_domain::id::new_id("k"));
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("the server answers");
    let status = response.status().as_u16();
    let body: serde_json::Value = response.json().await.unwrap_or_default();
    (status, body["error"]["code"].as_str().unwrap_or_default().to_owned())
}

#[tokio::test]
async fn serve_answers_unavailable_while_its_database_restarts_and_recovers_by_itself() {
    let scratch = testing::ScratchCluster::start(None);
    scratch.create_database("bc").await;
    let mut server = Server::start({
        let mut c = command(&["serve", "--listen", "127.0.0.1:0", "--auth-config"]);
        c.arg(auth_file("restart", crate::http_api::AUTH))
            .env("BETTER_COMPUTE_DATABASE_URL", scratch.cluster.url("bc"));
        c
    });
    let site = |name: &str| serde_json::json!({ "name": name, "iamRegion": "eu-central-1" });
    assert_eq!(call(&server, reqwest::Method::POST, "/v1/sites", Some(site("before"))).await.0, 201);

    scratch.cluster.stop(bc_eventstore::cluster::StopMode::Fast).expect("stop the database");
    for path in ["/v1/sites", "/v1/healthz"] {
        let (status, code) = call(&server, reqwest::Method::GET, path, None).await;
        assert_eq!((status, code.as_str()), (503, "UNAVAILABLE"), "{path} while the database is down");
    }
    let (status, code) = call(&server, reqwest::Method::POST, "/v1/sites", Some(site("during"))).await;
    assert_eq!((status, code.as_str()), (503, "UNAVAILABLE"), "a command while the database is down");

    scratch.cluster.start().expect("start the database again");
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, code) = call(&server, reqwest::Method::POST, "/v1/sites", Some(site("after"))).await;
        if status == 201 {
            break;
        }
        assert_eq!((status, code.as_str()), (503, "UNAVAILABLE"), "only a clear 503 until the pool reconnects");
        assert!(Instant::now() < deadline, "the service never resumed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, _) = call(&server, reqwest::Method::GET, "/v1/sites", None).await;
    assert_eq!(status, 200);
    server.signal("TERM");
    assert!(server.wait().success(), "it never crashed, and stops cleanly");
}

#[tokio::test]
async fn a_backup_restored_into_a_younger_cluster_serves_new_events_to_read_models_and_resuming_streams() {
    // The source: a fleet, a reservation, the read models caught up, and the position a client holds.
    let api = crate::http_api::Api::new().await;
    let pool = api.pool().await;
    let body = serde_json::json!({ "poolId": pool, "devices": { "class": "gpu", "count": 1 }, "duration": 3600 });
    let made = api.reserve(crate::http_api::ALICE, "before", body).await;
    assert_eq!(made.status.as_u16(), 201, "{:?}", made.body);
    bc_projections::testing::catch_up(&api.fleet.t.db).await;
    let held: String = made.header("x-position").expect("a position").to_owned();

    // pg_dump, then pg_restore into a cluster whose transaction ids start lower, then migrate (which raises the
    // log's epoch), then serve: the procedure of docs/operations.md.
    let server = testing::server();
    let dump = server.scratch_dir("backup").join("bc.dump");
    std::fs::create_dir_all(dump.parent().expect("folder")).expect("folder");
    let status = Command::new(server.bins().tool("pg_dump"))
        .args(["-Fc", "-f"])
        .arg(&dump)
        .arg(api.fleet.t.url())
        .status()
        .expect("pg_dump");
    assert!(status.success());
    let target = testing::ScratchCluster::start(None);
    target.create_database("restored").await;
    let status = Command::new(server.bins().tool("pg_restore"))
        .args(["--no-owner", "-d"])
        .arg(target.cluster.url("restored"))
        .arg(&dump)
        .status()
        .expect("pg_restore");
    assert!(status.success());
    let url = target.cluster.url("restored");
    let migrated = command(&["migrate"]).env("BETTER_COMPUTE_DATABASE_URL", &url).output().expect("migrate");
    assert!(migrated.status.success(), "{}", String::from_utf8_lossy(&migrated.stderr));
    let mut serve = Server::start({
        let mut c = command(&["serve", "--no-migrate", "--listen", "127.0.0.1:0", "--auth-config"]);
        c.arg(auth_file("restored", crate::http_api::AUTH)).env("BETTER_COMPUTE_DATABASE_URL", &url);
        c
    });
    let client = serve.client();
    // A stream resumed from the position handed out before the restore gets exactly what comes after it.
    let mut stream = client
        .get(format!("{}/v1/events?types=reservation.*", serve.base_url))
        .bearer_auth(crate::http_api::ALICE)
        .header("last-event-id", &held)
        .send()
        .await
        .expect("stream");
    assert_eq!(stream.status().as_u16(), 200);
    let created = client
        .post(format!("{}/v1/reservations", serve.base_url))
        .bearer_auth(crate::http_api::ALICE)
        .header("idempotency-key", "after")
        .json(&serde_json::json!({ "poolId": pool, "devices": { "class": "gpu", "count": 1 }, "duration": 3600 }))
        .send()
        .await
        .expect("reserve");
    assert_eq!(created.status().as_u16(), 201);
    let position = created.headers()["x-position"].to_str().expect("position").to_owned();
    let id = created.json::<serde_json::Value>().await.expect("json")["id"].as_str().expect("id").to_owned();
    assert!(position.starts_with("2-"), "new events carry the raised epoch: {position}");
    let mut text = String::new();
    while !text.contains(&position) {
        let chunk = tokio::time::timeout(WAIT, stream.chunk()).await.expect("the new event arrives").expect("read");
        text.push_str(&String::from_utf8_lossy(&chunk.expect("the stream stays open")));
    }
    assert!(text.contains(&id), "the new reservation streamed: {text}");
    assert!(!text.contains(&format!("id: {held}\n")), "nothing at or before the held position again: {text}");
    // The read models follow the new events: reading after the new position shows the new reservation.
    let listed: serde_json::Value = client
        .get(format!("{}/v1/reservations?after={position}", serve.base_url))
        .bearer_auth(crate::http_api::ALICE)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    let ids: Vec<&str> = listed["items"].as_array().expect("items").iter().filter_map(|r| r["id"].as_str()).collect();
    assert!(ids.contains(&id.as_str()) && ids.len() == 2, "both reservations, old and new: {listed}");
    drop(stream);
    serve.signal("TERM");
    let status = serve.wait();
    assert!(status.success(), "after SIGTERM serve exited with {status}");
}

/// The positions of every event in the log, in log order.
async fn log_positions(db: &bc_eventstore::Db) -> Vec<String> {
    let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let rows: Vec<(i32, String, i64)> =
        sql::query_as("SELECT e.log_epoch, e.txid::text, e.seq FROM events AS e ORDER BY e.log_epoch, e.txid, e.seq")
            .fetch_all(tx.conn())
            .await
            .expect("events");
    tx.commit().await.expect("commit");
    rows.into_iter().map(|(epoch, txid, seq)| format!("{epoch}-{txid}-{seq}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_server_killed_under_load_loses_no_acknowledged_command_and_streams_resume_without_gaps() {
    use std::sync::{Arc, Mutex};
    let seed: u64 =
        std::env::var("BC_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| fastrand::u64(..));
    println!("crash test seed {seed} (BC_CRASH_SEED={seed} replays it)");
    let mut rng = fastrand::Rng::with_seed(seed);

    // A fleet on the real clock: a killed server's leases lapse as time passes.
    let t = TestDb::new().await;
    let app = bc_commands::App::new(t.db.clone());
    let owner = bc_commands::testing::caller("root", "operator@platform");
    let site = app
        .create_site(
            &owner,
            bc_commands::fleet::CreateSite {
                name: "fra1".into(),
                iam_region: "eu-central-1".into(),
                kind: bc_domain::site::SiteKind::Shared,
            },
        )
        .await
        .expect("site")
        .value;
    let pool = app
        .create_pool(
            &owner,
            bc_commands::fleet::CreatePool {
                site_id: site,
                name: "h100".into(),
                class: bc_domain::pool::PoolClass::MetalHost,
                gpu_model: "H100".into(),
                sharing: bc_domain::pool::Sharing::Exclusive,
                agent: bc_domain::pool::PoolAgent::Bcd,
                policy: bc_domain::pool::PoolPolicy::default(),
                provider_account_id: None,
            },
        )
        .await
        .expect("pool")
        .value;
    for name in ["a", "b"] {
        let gpus = (0..8).map(|g| bc_commands::testing::gpu(&format!("{name}-{g}"), 0)).collect();
        let node = bc_commands::nodes::RegisterNode {
            pool_id: pool.clone(),
            name: name.into(),
            role: bc_domain::node::Role::Host,
            trust: bc_domain::node::Trust::Platform,
            owner_tenant_id: None,
            gpus,
            resources: Default::default(),
        };
        app.register_node(&owner, node).await.expect("node");
    }
    let start = log_positions(&t.db).await.last().cloned().expect("some events");

    let auth = auth_file("crash", crate::http_api::AUTH);
    let url = t.url();
    let serve = move || {
        let mut c = command(&["serve", "--no-migrate", "--listen", "127.0.0.1:0", "--auth-config"]);
        c.arg(&auth).env("BETTER_COMPUTE_DATABASE_URL", &url);
        tokio::task::block_in_place(|| Server::start(c))
    };
    let mut server = serve();
    let base = Arc::new(Mutex::new(server.base_url.clone()));
    let current = |base: &Arc<Mutex<String>>| base.lock().expect("base").clone();

    // Clients reserving with idempotency keys, retrying a key until it is answered; what was answered 2xx.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let answered = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut clients = Vec::new();
    for c in 0..4 {
        let (base, answered, pool) = (base.clone(), answered.clone(), pool.to_string());
        clients.push(tokio::spawn(async move {
            let http = https().timeout(Duration::from_secs(10)).build().expect("client");
            for i in 0..30 {
                let key = format!("c{c}-{i}");
                loop {
                    let body = serde_json::json!({ "poolId": pool, "devices": { "class": "gpu", "count": 1 }, "duration": 600 });
                    let sent = http
                        .post(format!("{}/v1/reservations", current(&base)))
                        .bearer_auth(crate::http_api::ROOT)
                        .header("idempotency-key", &key)
                        .json(&body)
                        .send()
                        .await;
                    if let Ok(response) = sent
                        && response.status().is_success()
                    {
                        let reply: serde_json::Value = response.json().await.unwrap_or_default();
                        if let Some(id) = reply["id"].as_str() {
                            answered.lock().expect("answered").push(id.to_owned());
                            break;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }));
    }
    // A subscriber that resumes with Last-Event-ID whenever its stream breaks.
    let received = Arc::new(Mutex::new(Vec::<String>::new()));
    let subscriber = {
        let (base, received, done, start) = (base.clone(), received.clone(), done.clone(), start.clone());
        tokio::spawn(async move {
            let http = https().build().expect("client");
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let last = received.lock().expect("received").last().cloned().unwrap_or_else(|| start.clone());
                let Ok(mut response) = http
                    .get(format!("{}/v1/events", current(&base)))
                    .bearer_auth(crate::http_api::ROOT)
                    .header("last-event-id", last)
                    .send()
                    .await
                else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let mut buffer = String::new();
                while let Ok(Some(chunk)) = response.chunk().await {
                    buffer.push_str(&String::from_utf8_lossy(&chunk));
                    while let Some(end) = buffer.find("\n\n") {
                        let block: String = buffer.drain(..end + 2).collect();
                        for line in block.lines() {
                            if let Some(id) = line.strip_prefix("id: ").or_else(|| line.strip_prefix("id:")) {
                                received.lock().expect("received").push(id.trim().to_owned());
                            }
                        }
                    }
                    if done.load(std::sync::atomic::Ordering::SeqCst) {
                        break;
                    }
                }
            }
        })
    };

    // Kill the server at seeded random moments, three times, and start it again each time.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(rng.u64(300..1500))).await;
        server.signal("KILL");
        let _ = server.wait();
        server = serve();
        *base.lock().expect("base") = server.base_url.clone();
    }
    for client in clients {
        client.await.expect("client");
    }
    // The subscriber catches up to the log's head.
    let head = log_positions(&t.db).await.last().cloned().expect("events");
    let deadline = Instant::now() + WAIT;
    while received.lock().expect("received").last() != Some(&head) {
        assert!(Instant::now() < deadline, "the subscriber never reached {head} (seed {seed})");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    server.signal("TERM");
    let status = server.wait();
    assert!(status.success(), "after SIGTERM the server exited with {status} (seed {seed})");
    let _ = subscriber.await;

    // Every command answered 2xx has its events.
    let answered = answered.lock().expect("answered").clone();
    assert_eq!(answered.len(), 120);
    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let recorded: i64 = sql::query_scalar(
        "SELECT count(DISTINCT stream_id) FROM events WHERE stream_id = ANY($1) AND event_type = 'reservation.requested'",
    )
    .bind(&answered)
    .fetch_one(tx.conn())
    .await
    .expect("recorded");
    tx.commit().await.expect("commit");
    assert_eq!(recorded, 120, "every acknowledged reservation is in the log (seed {seed})");
    // The subscriber got every event after where it started, once each, in log order.
    let log = log_positions(&t.db).await;
    let after: Vec<String> = log.iter().skip_while(|p| **p != start).skip(1).cloned().collect();
    assert_eq!(*received.lock().expect("received"), after, "no gap, no duplicate (seed {seed})");
    // Every read model equals its rebuild: nothing applied twice or skipped. The killed processes' projection
    // leases lapse first (the last server gave its own up when it stopped).
    let deadline = Instant::now() + WAIT;
    loop {
        let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
        let held: i64 = sql::query_scalar("SELECT count(*) FROM leases WHERE expires_at > compute_now()")
            .fetch_one(tx.conn())
            .await
            .expect("leases");
        tx.commit().await.expect("commit");
        if held == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the killed processes' leases never lapsed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bc_projections::testing::catch_up(&t.db).await;
    crate::investigate::assert_models_equal_rebuilds(&t.db, &format!("after three kills (seed {seed})")).await;
}

#[tokio::test]
async fn migrate_refuses_a_ledger_it_cannot_account_for_with_invalid_config_naming_the_entries() {
    let t = TestDb::new().await;
    let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    sql::query(
        "INSERT INTO compute_migrations (name, applied_at) VALUES ('nodes/9999_from_the_future', compute_now())",
    )
    .execute(tx.conn())
    .await
    .expect("a ledger entry of a newer release");
    tx.commit().await.expect("commit");
    let output = command(&["migrate"]).env("BETTER_COMPUTE_DATABASE_URL", t.url()).output().expect("migrate");
    assert!(!output.status.success());
    let text = String::from_utf8_lossy(&output.stderr);
    assert!(text.contains("INVALID_CONFIG") && text.contains("nodes/9999_from_the_future"), "{text}");
    assert_eq!(text.trim_end().lines().count(), 1, "one line, no backtrace: {text}");
}

#[tokio::test]
async fn tenants_made_through_the_real_service_over_tls_keep_working_across_a_restart() {
    let t = TestDb::empty().await;
    let output = command(&["migrate"]).env("BETTER_COMPUTE_DATABASE_URL", t.url()).output().expect("migrate");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let start = || {
        Server::start({
            let mut c = command(&["serve", "--no-migrate", "--listen", "127.0.0.1:0", "--auth-config"]);
            c.arg(auth_file("tenancy", crate::http_api::AUTH)).env("BETTER_COMPUTE_DATABASE_URL", t.url());
            c
        })
    };
    let send = |server: &Server, method: reqwest::Method, path: &str, token: &str, body: serde_json::Value| {
        let request = server.client().request(method, format!("{}{path}", server.base_url)).bearer_auth(token);
        let request = if body.is_null() { request } else { request.json(&body) };
        async move {
            let response = request.send().await.expect("the server answers");
            let status = response.status().as_u16();
            (status, response.json::<serde_json::Value>().await.unwrap_or_default())
        }
    };
    let root = crate::http_api::ROOT;
    let mut server = start();
    let post = reqwest::Method::POST;
    let (status, body) =
        send(&server, post.clone(), "/v1/tenants", root, serde_json::json!({ "tenantId": "cyberdyne", "name": "C" }))
            .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = send(
        &server,
        post.clone(),
        "/v1/tenants/cyberdyne/identities",
        root,
        serde_json::json!({ "name": "miles@cyberdyne", "admin": true }),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let path = format!("/v1/tenants/cyberdyne/identities/{}/tokens", body["id"].as_str().expect("id"));
    let issue = || {
        server
            .client()
            .post(format!("{}{path}", server.base_url))
            .bearer_auth(root)
            .header("idempotency-key", "miles-1")
            .send()
    };
    let first: serde_json::Value = issue().await.expect("issue").json().await.expect("json");
    let again: serde_json::Value = issue().await.expect("retry").json().await.expect("json");
    assert_eq!(first["token"], again["token"], "a retry over the wire is the same token");
    let token = first["token"].as_str().expect("token").to_owned();
    assert_eq!(send(&server, reqwest::Method::GET, "/v1/pools", &token, serde_json::Value::Null).await.0, 200);
    let (status, ticket) = send(&server, post.clone(), "/v1/events/tickets", &token, serde_json::Value::Null).await;
    assert_eq!(status, 201, "{ticket}");
    let ticket = ticket["ticket"].as_str().expect("ticket").to_owned();

    // Restarted, the service knows the tenant, the token and the ticket from the database and the bundle.
    server.signal("TERM");
    assert!(server.wait().success());
    let server = start();
    assert_eq!(send(&server, reqwest::Method::GET, "/v1/pools", &token, serde_json::Value::Null).await.0, 200);
    let stream = server
        .client()
        .get(format!("{}/v1/events?ticket={ticket}&eventName=message", server.base_url))
        .send()
        .await
        .expect("the event stream");
    assert_eq!(stream.status().as_u16(), 200, "the page's reconnection is taken");
    drop(stream);
    let (status, body) =
        send(&server, post.clone(), "/v1/tenants/cyberdyne/suspend", root, serde_json::json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = send(&server, post, "/v1/projects", &token, serde_json::json!({ "name": "skynet" })).await;
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("TENANT_SUSPENDED")), "{body}");
}
