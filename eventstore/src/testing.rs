//! The test database harness (feature `testing`): one private PostgreSQL cluster per test process, and a
//! fresh database per test cloned from a migrated template.
//!
//! The cluster is created with durability off and `pg_resetwal -e 3`, so every test runs with transaction
//! ids above 2^32, where 32-bit mistakes show. Rust's test runner has no global teardown, so a small
//! supervisor process (a shell reading a pipe from the test process) stops and removes the cluster when the
//! test process ends, however it ends. `BETTER_COMPUTE_TEST_DATABASE_URL` points the harness at an existing
//! server instead; the supervisor then drops the databases of passed tests and the template.
//! `BETTER_COMPUTE_TEST_KEEP=1` keeps everything for inspection.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, ConnectOptions as _, Connection as _};

use crate::cluster::{Cluster, Durability, InitOptions, PgBinaries, RunAs};
use crate::db::{Db, DbConfig};
use crate::migrate::Migrator;

/// Points the harness at an existing server (a URL to a database the harness may create databases from).
pub const TEST_DATABASE_URL_VAR: &str = "BETTER_COMPUTE_TEST_DATABASE_URL";
/// Keeps the private cluster (or the databases on the existing server) after the process ends.
pub const KEEP_VAR: &str = "BETTER_COMPUTE_TEST_KEEP";

/// Stops the cluster and removes its folder, or drops the run's databases, once the test process is gone
/// (its end of the pipe closes). Signals are ignored: a Ctrl-C on the test run must not skip the cleanup.
const SUPERVISOR_SCRIPT: &str = r#"
trap '' INT TERM HUP QUIT
lists="$(mktemp -d)"
while IFS= read -r line; do
    case "$line" in
        drop\ *) printf '%s\n' "${line#drop }" >>"$lists/drop" ;;
        stop\ *) printf '%s\n' "${line#stop }" >>"$lists/stop" ;;
        kill\ *) printf '%s\n' "${line#kill }" >>"$lists/kill" ;;
    esac
done
pg_stop() {
    if [ -n "$BC_RUNAS" ]; then
        runuser -u "$BC_RUNAS" -- "$BC_PG_CTL" stop -D "$1" -m immediate -w >/dev/null 2>&1
    else
        "$BC_PG_CTL" stop -D "$1" -m immediate -w >/dev/null 2>&1
    fi
}
if [ -f "$lists/kill" ]; then
    while IFS= read -r pid; do kill "$pid" 2>/dev/null; done <"$lists/kill"
fi
if [ -f "$lists/stop" ]; then
    while IFS= read -r root; do
        pg_stop "$root/pgdata"
        [ -n "$BC_KEEP" ] || rm -rf "$root"
    done <"$lists/stop"
fi
if [ -n "$BC_ROOT" ]; then
    # A server that crashed mid-run (a full disk, the OOM killer, a signal) fails every test still running with
    # an error that does not say why: its own log does, so what it said of the crash goes to the run's output.
    log="$BC_ROOT/postgres.log"
    crash='PANIC|terminated by signal|No space left on device|out of memory'
    if [ -f "$log" ] && grep -qE "$crash" "$log"; then
        printf '\n%s\n' "the tests' PostgreSQL server failed during the run; from its log ($log):" >&2
        grep -E -A2 "$crash" "$log" | tail -n 40 >&2
    fi
    pg_stop "$BC_ROOT/pgdata"
    [ -n "$BC_KEEP" ] || rm -rf "$BC_ROOT"
elif [ -z "$BC_KEEP" ]; then
    printf '%s\n' "$BC_TEMPLATE" >>"$lists/drop"
    while IFS= read -r db; do
        psql "$BC_ADMIN_URL" -X -q -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1
    done <"$lists/drop"
fi
rm -rf "$lists"
"#;

/// The server the tests of this process use.
pub struct TestServer {
    bins: Option<PgBinaries>,
    run_as: Option<RunAs>,
    scratch_count: AtomicU32,
    admin: PgConnectOptions,
    admin_url: String,
    template: String,
    cluster: Option<Cluster>,
    run_id: String,
    supervisor: Mutex<ChildStdin>,
    keep: bool,
    /// With [`VIA_PGBOUNCER_VAR`] set: the PgBouncer the tests' own pools connect through (its socket folder).
    bouncer: Option<PathBuf>,
}

/// Set to 1 to run the tests' databases through a PgBouncer in transaction mode in front of the private cluster
/// (the admin connections that create and drop databases stay direct). `.ci/run` runs the API suite this way.
pub const VIA_PGBOUNCER_VAR: &str = "BETTER_COMPUTE_TEST_VIA_PGBOUNCER";

/// The port PgBouncer listens on (a Unix socket in its own folder).
pub const BOUNCER_PORT: u16 = 6432;

/// Debian's PgBouncer, if installed.
pub fn pgbouncer_binary() -> Option<PathBuf> {
    ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer", "/usr/local/bin/pgbouncer"]
        .iter()
        .map(PathBuf::from)
        .find(|path| path.is_file())
}

/// A PgBouncer in transaction mode in front of the server whose socket is in `backend_socket_dir`, listening on
/// a socket in `dir`, with `pool_size` server connections per database; killed when the test process ends.
pub fn start_pgbouncer(
    bins_run_as: &RunAs,
    dir: &Path,
    backend_socket_dir: &Path,
    pool_size: u32,
) -> std::process::Child {
    let binary = pgbouncer_binary()
        .unwrap_or_else(|| harness_failure("find pgbouncer", "apt-get install pgbouncer (.ci/run does)"));
    std::fs::create_dir_all(dir).unwrap_or_else(|err| harness_failure("create pgbouncer's folder", err));
    std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n")
        .unwrap_or_else(|err| harness_failure("auth file", err));
    let ini = format!(
        "[databases]\n* = host={backend} port=5432 user=postgres\n\n[pgbouncer]\nlisten_addr =\n\
         unix_socket_dir = {dir}\nlisten_port = {BOUNCER_PORT}\nauth_type = trust\nauth_file = {dir}/users.txt\n\
         pool_mode = transaction\nmax_client_conn = 2000\ndefault_pool_size = {pool_size}\nreserve_pool_size = 0\n\
         server_reset_query =\nlogfile = {dir}/pgbouncer.log\npidfile = {dir}/pgbouncer.pid\n",
        backend = backend_socket_dir.display(),
        dir = dir.display(),
    );
    std::fs::write(dir.join("pgbouncer.ini"), ini).unwrap_or_else(|err| harness_failure("pgbouncer.ini", err));
    if let RunAs::User { uid, gid, .. } = bins_run_as {
        for file in ["users.txt", "pgbouncer.ini"] {
            std::os::unix::fs::chown(dir.join(file), Some(*uid), Some(*gid))
                .unwrap_or_else(|err| harness_failure("chown pgbouncer's files", err));
        }
        std::os::unix::fs::chown(dir, Some(*uid), Some(*gid)).unwrap_or_else(|err| harness_failure("chown", err));
    }
    bins_run_as
        .command(binary)
        .arg(dir.join("pgbouncer.ini"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|err| harness_failure("start pgbouncer", err))
}

impl std::fmt::Debug for TestServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestServer").field("admin_url", &self.admin_url).field("template", &self.template).finish()
    }
}

fn harness_failure(what: &str, err: impl std::fmt::Display) -> ! {
    panic!("test database harness: {what}: {err}")
}

/// The process's test server, started (and its template migrated) on first use.
pub fn server() -> &'static TestServer {
    static SERVER: OnceLock<TestServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        // Migrating needs a runtime; the caller may be inside one, so use a thread of our own.
        std::thread::spawn(start_server)
            .join()
            .unwrap_or_else(|_| harness_failure("start", "the start-up thread panicked"))
    })
}

fn start_server() -> TestServer {
    let keep = std::env::var_os(KEEP_VAR).is_some_and(|v| !v.is_empty() && v != "0");
    let run_id = bc_domain::id::new_ulid().to_string().to_ascii_lowercase();
    let template = format!("bc_tmpl_{}", &run_id[16..]);
    let mut supervisor = Command::new("sh");
    supervisor
        .args(["-c", SUPERVISOR_SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        // Inherited, for the server's crash report (above); everything else it runs is quiet.
        .stderr(Stdio::inherit())
        .env("BC_TEMPLATE", &template);
    std::os::unix::process::CommandExt::process_group(&mut supervisor, 0);
    if keep {
        supervisor.env("BC_KEEP", "1");
    }

    // Scratch clusters (restore and PgBouncer tests) need the binaries even with an existing server.
    let bins = PgBinaries::find(&crate::cluster::PgSearch::from_env()).ok();
    let run_as = RunAs::for_this_process().ok();
    if let Some(bins) = &bins {
        supervisor.env("BC_PG_CTL", bins.tool("pg_ctl"));
    }
    if let Some(RunAs::User { name, .. }) = &run_as {
        supervisor.env("BC_RUNAS", name);
    }
    let (admin, admin_url, cluster) = match std::env::var(TEST_DATABASE_URL_VAR) {
        Ok(url) if !url.is_empty() => {
            let admin: PgConnectOptions =
                url.parse().unwrap_or_else(|err| harness_failure(&format!("parse {TEST_DATABASE_URL_VAR}"), err));
            supervisor.env("BC_ADMIN_URL", &url);
            (admin, url, None)
        }
        _ => {
            let bins = bins.clone().unwrap_or_else(|| {
                harness_failure(
                    "find PostgreSQL",
                    PgBinaries::find(&crate::cluster::PgSearch::from_env())
                        .err()
                        .map(|e| e.to_string())
                        .unwrap_or_default(),
                )
            });
            let run_as = run_as.clone().unwrap_or_else(|| {
                harness_failure(
                    "choose the account",
                    RunAs::for_this_process().err().map(|e| e.to_string()).unwrap_or_default(),
                )
            });
            let root = std::env::temp_dir().join(format!("bc-test-{}-{}", std::process::id(), &run_id[16..]));
            let cluster = Cluster::new(bins, root, run_as);
            supervisor.env("BC_ROOT", cluster.root());
            let admin = cluster.connect_options("postgres");
            let admin_url = cluster.url("postgres");
            (admin, admin_url, Some(cluster))
        }
    };

    // The supervisor starts before the cluster exists, so a failure half-way still cleans up.
    let mut child = supervisor.spawn().unwrap_or_else(|err| harness_failure("start the supervisor", err));
    let mut stdin = child.stdin.take().unwrap_or_else(|| harness_failure("start the supervisor", "no stdin pipe"));
    // The child is reaped by nobody: it outlives this process on purpose.
    std::mem::forget(child);

    if let Some(cluster) = &cluster {
        let options = InitOptions {
            durability: Durability::Throwaway,
            xid_epoch: Some(3),
            max_connections: 300,
            settings: vec![
                ("shared_buffers".into(), "128MB".into()),
                // A stuck test must not hold the cluster-wide horizon back for long.
                ("idle_in_transaction_session_timeout".into(), "'60s'".into()),
                ("log_min_messages".into(), "warning".into()),
            ],
        };
        cluster.init(&options).unwrap_or_else(|err| harness_failure("initdb", err));
        cluster.start().unwrap_or_else(|err| harness_failure("start the cluster", err));
    }

    let via_bouncer = std::env::var_os(VIA_PGBOUNCER_VAR).is_some_and(|v| !v.is_empty() && v != "0");
    let bouncer = match (&cluster, &run_as) {
        (Some(cluster), Some(run_as)) if via_bouncer => {
            let dir = cluster.root().join("pgbouncer");
            let child = start_pgbouncer(run_as, &dir, &cluster.socket_dir(), 8);
            // The supervisor kills it when this process ends.
            let _ = writeln!(stdin, "kill {}", child.id());
            std::mem::forget(child);
            Some(dir)
        }
        (None, _) if via_bouncer => harness_failure(VIA_PGBOUNCER_VAR, "needs the harness's private cluster"),
        _ => None,
    };
    let server = TestServer {
        bins,
        run_as,
        scratch_count: AtomicU32::new(0),
        admin,
        admin_url,
        template,
        cluster,
        run_id,
        supervisor: Mutex::new(stdin),
        keep,
        bouncer,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|err| harness_failure("build a runtime", err));
    runtime.block_on(server.create_template());
    server
}

impl TestServer {
    async fn admin_exec(&self, sql: String) -> Result<(), sqlx::Error> {
        let mut conn = self.admin.connect().await?;
        sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut conn).await?;
        conn.close().await
    }

    async fn create_template(&self) {
        self.admin_exec(format!("CREATE DATABASE \"{}\"", self.template))
            .await
            .unwrap_or_else(|err| harness_failure("create the template database", err));
        let db = Db::connect_lazy_with(self.admin.clone().database(&self.template), &DbConfig::default());
        Migrator::embedded().run(&db).await.unwrap_or_else(|err| harness_failure("migrate the template database", err));
        db.close().await;
    }

    /// The private cluster, unless the harness uses an existing server.
    pub fn cluster(&self) -> Option<&Cluster> {
        self.cluster.as_ref()
    }

    /// Connect options for `database` with the harness's credentials.
    pub fn connect_options(&self, database: &str) -> PgConnectOptions {
        match &self.bouncer {
            Some(dir) => PgConnectOptions::new().socket(dir).port(BOUNCER_PORT).username("postgres").database(database),
            None => self.admin.clone().database(database),
        }
    }

    /// A URL for `database`.
    pub fn url(&self, database: &str) -> String {
        match (&self.bouncer, &self.cluster) {
            (Some(dir), _) => format!("postgres://postgres@localhost:{BOUNCER_PORT}/{database}?host={}", dir.display()),
            (None, Some(cluster)) => cluster.url(database),
            (None, None) => replace_url_database(&self.admin_url, database),
        }
    }

    /// Whether the tests' databases are reached through PgBouncer ([`VIA_PGBOUNCER_VAR`]).
    pub fn via_pgbouncer(&self) -> bool {
        self.bouncer.is_some()
    }

    fn next_name(&self, prefix: &str) -> String {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let thread = std::thread::current();
        let test: String = thread
            .name()
            .unwrap_or("test")
            .rsplit("::")
            .next()
            .unwrap_or("test")
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' })
            .take(36)
            .collect();
        format!("{prefix}_{}_{test}_{n}", &self.run_id[20..])
    }

    /// Creates a database cloned from the migrated template.
    pub async fn create_migrated_database(&self) -> String {
        let name = self.next_name("t");
        self.admin_exec(format!("CREATE DATABASE \"{name}\" TEMPLATE \"{}\"", self.template))
            .await
            .unwrap_or_else(|err| harness_failure(&format!("create database {name}"), err));
        name
    }

    /// Creates an empty database with no migrations applied.
    pub async fn create_empty_database(&self) -> String {
        self.create_from_template0("e", "").await
    }

    /// Creates an empty database in the SQL_ASCII encoding (bytes stored as given, no conversion): one this
    /// build refuses to migrate.
    pub async fn create_sql_ascii_database(&self) -> String {
        self.create_from_template0("a", " ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C'").await
    }

    /// Creates a database named with `prefix` from `template0`, with `options` after the template.
    async fn create_from_template0(&self, prefix: &str, options: &str) -> String {
        let name = self.next_name(prefix);
        self.admin_exec(format!("CREATE DATABASE \"{name}\" TEMPLATE template0{options}"))
            .await
            .unwrap_or_else(|err| harness_failure(&format!("create database {name}"), err));
        name
    }

    /// Tells the supervisor what to clean up when the process ends: `drop <database>`, `stop <cluster root>`
    /// or `kill <pid>`.
    fn tell_supervisor(&self, line: &str) {
        if let Ok(mut pipe) = self.supervisor.lock() {
            let _ = writeln!(pipe, "{line}");
        }
    }

    /// The folder for a new scratch cluster (or other private files), owned by the PostgreSQL account:
    /// inside the harness's cluster folder, or in the temp folder with an existing server.
    pub fn scratch_dir(&self, what: &str) -> PathBuf {
        let n = self.scratch_count.fetch_add(1, Ordering::Relaxed);
        let dir = match &self.cluster {
            Some(cluster) => cluster.root().join(format!("{what}-{n}")),
            None => std::env::temp_dir().join(format!("bc-{what}-{}-{}-{n}", std::process::id(), &self.run_id[16..])),
        };
        self.run_as().make_private_dir(&dir).unwrap_or_else(|err| harness_failure("create a scratch folder", err));
        dir
    }

    /// The PostgreSQL binaries on this machine.
    pub fn bins(&self) -> &PgBinaries {
        self.bins.as_ref().unwrap_or_else(|| harness_failure("find PostgreSQL", "no server binaries on this machine"))
    }

    /// The account PostgreSQL programs run as.
    pub fn run_as(&self) -> &RunAs {
        self.run_as.as_ref().unwrap_or_else(|| harness_failure("choose the account", "no postgres account"))
    }

    /// Makes the supervisor stop the private cluster in `root` (a `Cluster` folder) when the process ends, for
    /// clusters that programs under test create themselves.
    pub fn stop_cluster_at_exit(&self, root: &Path) {
        self.tell_supervisor(&format!("stop {}", root.display()));
    }

    /// Makes the supervisor kill `pid` (a helper server such as PgBouncer) when the process ends.
    pub fn kill_at_exit(&self, pid: u32) {
        self.tell_supervisor(&format!("kill {pid}"));
    }
}

fn replace_url_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[scheme_end..].find('/').map_or(base.len(), |i| scheme_end + i);
    let mut out = format!("{}/{}", &base[..path_start], database);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

/// A fresh migrated database for one test, and a pool on it.
#[derive(Debug)]
pub struct TestDb {
    pub db: Db,
    pub name: String,
}

impl TestDb {
    /// A fresh database cloned from the migrated template, with a pool of the default configuration.
    pub async fn new() -> TestDb {
        let server = server();
        let name = server.create_migrated_database().await;
        let db = Db::connect_lazy_with(server.connect_options(&name), &test_db_config());
        TestDb { db, name }
    }

    /// A fresh database with nothing in it: for migration tests.
    pub async fn empty() -> TestDb {
        let server = server();
        let name = server.create_empty_database().await;
        let db = Db::connect_lazy_with(server.connect_options(&name), &test_db_config());
        TestDb { db, name }
    }

    /// A fresh, empty database in the SQL_ASCII encoding: for the migrator's refusal of it.
    pub async fn empty_sql_ascii() -> TestDb {
        let server = server();
        let name = server.create_sql_ascii_database().await;
        let db = Db::connect_lazy_with(server.connect_options(&name), &test_db_config());
        TestDb { db, name }
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Another pool on the same database, configured as given.
    pub fn pool(&self, config: &DbConfig) -> Db {
        Db::connect_lazy_with(self.connect_options(), config)
    }

    pub fn connect_options(&self) -> PgConnectOptions {
        server().connect_options(&self.name)
    }

    pub fn url(&self) -> String {
        server().url(&self.name)
    }

    /// The private cluster's folder, if the harness runs one.
    pub fn cluster_root(&self) -> Option<PathBuf> {
        server().cluster().map(|c| c.root().to_path_buf())
    }
}

/// The pool configuration tests use: a small pool and a short statement timeout, so a test that hangs
/// on a lock fails instead of stalling the run.
pub fn test_db_config() -> DbConfig {
    DbConfig {
        max_connections: 10,
        statement_timeout: std::time::Duration::from_secs(30),
        acquire_timeout: std::time::Duration::from_secs(30),
        application_name: Some("bc-test".to_owned()),
        ..DbConfig::default()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let server = server();
        if std::thread::panicking() {
            let hint = match (&server.cluster, server.keep) {
                (Some(_), false) => {
                    format!(" (the private cluster is removed when the tests end; set {KEEP_VAR}=1 to keep it)")
                }
                _ => String::new(),
            };
            eprintln!("test database left behind: {} at {}{hint}", self.name, server.url(&self.name));
        } else {
            server.tell_supervisor(&format!("drop {}", self.name));
        }
    }
}

/// A second private cluster for one test (a restore target, a server behind PgBouncer), started on creation and
/// stopped and removed on drop, or by the supervisor if the process dies first.
#[derive(Debug)]
pub struct ScratchCluster {
    pub cluster: Cluster,
}

impl ScratchCluster {
    /// Creates and starts a throwaway cluster. Without `xid_epoch` its transaction ids start low, like a
    /// freshly installed server's.
    pub fn start(xid_epoch: Option<u32>) -> ScratchCluster {
        let server = server();
        let root = server.scratch_dir("cluster");
        let cluster = Cluster::new(server.bins().clone(), root.clone(), server.run_as().clone());
        server.tell_supervisor(&format!("stop {}", root.display()));
        let options = InitOptions {
            durability: Durability::Throwaway,
            xid_epoch,
            max_connections: 100,
            settings: vec![("log_min_messages".into(), "warning".into())],
        };
        cluster.init(&options).unwrap_or_else(|err| harness_failure("initdb a scratch cluster", err));
        cluster.start().unwrap_or_else(|err| harness_failure("start a scratch cluster", err));
        ScratchCluster { cluster }
    }

    /// Creates an empty database in the scratch cluster.
    pub async fn create_database(&self, name: &str) {
        let mut conn = self
            .cluster
            .connect_options("postgres")
            .connect()
            .await
            .unwrap_or_else(|err| harness_failure("connect to a scratch cluster", err));
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|err| harness_failure("create a database in a scratch cluster", err));
        let _ = conn.close().await;
    }
}

impl Drop for ScratchCluster {
    fn drop(&mut self) {
        let _ = self.cluster.stop(crate::cluster::StopMode::Immediate);
        if !server().keep {
            let _ = std::fs::remove_dir_all(self.cluster.root());
        }
    }
}

/// A proxy in front of a test database that counts the round trips its clients make: every message after which a
/// client waits for the server to be ready again (a simple-protocol Query, or the Sync that ends an extended-protocol
/// exchange). Connect through [`RoundTrips::connect_options`]; [`RoundTrips::take`] reads and resets the count.
#[derive(Debug)]
pub struct RoundTrips {
    dir: PathBuf,
    count: std::sync::Arc<std::sync::atomic::AtomicU64>,
    target: PgConnectOptions,
}

/// The port number the proxy's socket file is named after.
const PROXY_PORT: u16 = 5439;

impl RoundTrips {
    /// Starts the proxy in front of `target` (a Unix-socket connection, as the harness gives).
    pub fn start(target: PgConnectOptions) -> RoundTrips {
        let socket = target.get_socket().expect("the test server is reached through a Unix socket").clone();
        let upstream = socket.join(format!(".s.PGSQL.{}", target.get_port()));
        let dir = server().scratch_dir("round-trips");
        let listener = tokio::net::UnixListener::bind(dir.join(format!(".s.PGSQL.{PROXY_PORT}"))).expect("bind");
        let count = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = std::sync::Arc::clone(&count);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::UnixStream::connect(&upstream).await else { continue };
                tokio::spawn(relay(client, server, std::sync::Arc::clone(&counted)));
            }
        });
        RoundTrips { dir, count, target }
    }

    /// The target's options, through the proxy.
    pub fn connect_options(&self) -> PgConnectOptions {
        self.target.clone().socket(&self.dir).port(PROXY_PORT)
    }

    /// The round trips counted since the last call.
    pub fn take(&self) -> u64 {
        self.count.swap(0, Ordering::SeqCst)
    }
}

/// Copies the server's answers back as they come, and the client's messages on, counting those that end a round
/// trip. The startup phase (an SSL or GSS request, then the startup message) has no type byte.
async fn relay(
    client: tokio::net::UnixStream,
    server: tokio::net::UnixStream,
    count: std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    tokio::spawn(async move { tokio::io::copy(&mut from_server, &mut to_client).await });
    let mut started = false;
    loop {
        let mut head = [0u8; 5];
        let head_len = if started { 5 } else { 4 };
        if from_client.read_exact(&mut head[..head_len]).await.is_err() {
            return;
        }
        let len_bytes = if started { &head[1..5] } else { &head[0..4] };
        let len = u32::from_be_bytes([len_bytes[0], len_bytes[1], len_bytes[2], len_bytes[3]]) as usize;
        let mut body = vec![0u8; len.saturating_sub(4)];
        if from_client.read_exact(&mut body).await.is_err() {
            return;
        }
        if started {
            if std::env::var("BC_TRIPS_DEBUG").is_ok() {
                eprintln!("{} {}", head[0] as char, String::from_utf8_lossy(&body[..body.len().min(120)]));
            }
            if matches!(head[0], b'Q' | b'S') {
                count.fetch_add(1, Ordering::SeqCst);
            }
        } else {
            // An SSL or GSS encryption request (answered with one byte) comes before the startup message.
            let code = body.get(0..4).map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
            started = !matches!(code, Some(80_877_103 | 80_877_104));
        }
        if to_server.write_all(&head[..head_len]).await.is_err() || to_server.write_all(&body).await.is_err() {
            return;
        }
    }
}
