//! Private PostgreSQL clusters, started from the PostgreSQL binaries on the machine: the embedded database of
//! `better-compute dev`, the durable cluster of the benchmarks and the test harness's throwaway cluster.
//!
//! `initdb` and `postgres` refuse to run as root, so when the caller is root every PostgreSQL program runs as
//! the `postgres` user (through `setpriv`), in a folder that user owns. The cluster listens only on a Unix
//! socket inside its folder, so clusters never compete for a TCP port.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::{fmt, fs};

use sqlx::postgres::PgConnectOptions;

/// The superuser every private cluster is created with.
pub const SUPERUSER: &str = "postgres";
/// The port number in the socket file's name (`.s.PGSQL.<port>`); no TCP port is opened.
pub const SOCKET_PORT: u16 = 5432;

/// A failure to find, create, start or stop a private cluster, with what PostgreSQL printed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ClusterError(String);

impl ClusterError {
    fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

pub type ClusterResult<T> = Result<T, ClusterError>;

/// The folder holding `initdb`, `pg_ctl`, `postgres`, `pg_resetwal`, `pgbench` and friends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgBinaries {
    pub bin_dir: PathBuf,
}

/// Where to look for the PostgreSQL binaries, as the process's configuration says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PgSearch {
    /// A folder named outright (`BETTER_COMPUTE_PG_BINDIR`): it must hold them.
    pub bin_dir: Option<PathBuf>,
    /// The process's `PATH`, searched last.
    pub path: Option<std::ffi::OsString>,
}

impl PgSearch {
    /// The search the environment asks for. Called by the binaries' `main`s and the test harness only: the
    /// library itself never reads the environment.
    pub fn from_env() -> Self {
        PgSearch {
            bin_dir: std::env::var_os("BETTER_COMPUTE_PG_BINDIR").map(PathBuf::from),
            path: std::env::var_os("PATH"),
        }
    }
}

impl PgBinaries {
    /// Finds the binaries: the folder `search` names, then `pg_config --bindir`, then the newest
    /// `/usr/lib/postgresql/<major>/bin` (Debian keeps the server out of PATH), then `initdb` on the `PATH` given.
    pub fn find(search: &PgSearch) -> ClusterResult<Self> {
        let has_initdb = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
        if let Some(dir) = &search.bin_dir {
            let dir = dir.clone();
            if has_initdb(&dir) {
                return Ok(Self { bin_dir: dir });
            }
            return Err(ClusterError::new(format!(
                "BETTER_COMPUTE_PG_BINDIR={} holds no initdb and pg_ctl",
                dir.display()
            )));
        }
        if let Ok(output) = Command::new("pg_config").arg("--bindir").output()
            && output.status.success()
        {
            let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
            if has_initdb(&dir) {
                return Ok(Self { bin_dir: dir });
            }
        }
        let mut versioned: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let major = entry.file_name().to_string_lossy().parse::<u32>().ok()?;
                Some((major, entry.path().join("bin")))
            })
            .filter(|(_, dir)| has_initdb(dir))
            .collect();
        versioned.sort();
        if let Some((_, dir)) = versioned.pop() {
            return Ok(Self { bin_dir: dir });
        }
        if let Some(path) = &search.path {
            for dir in std::env::split_paths(path) {
                if has_initdb(&dir) {
                    return Ok(Self { bin_dir: dir });
                }
            }
        }
        Err(ClusterError::new(
            "no PostgreSQL server binaries found (initdb, pg_ctl): install the PostgreSQL server and contrib \
             packages (on Debian: apt-get install postgresql postgresql-contrib) or set BETTER_COMPUTE_PG_BINDIR",
        ))
    }

    pub fn tool(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }
}

/// Whether this process runs as root.
pub fn running_as_root() -> bool {
    fs::metadata("/proc/self").map(|meta| meta.uid() == 0).unwrap_or(false)
}

/// The account PostgreSQL programs run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunAs {
    CurrentUser,
    /// Another account, reached through `setpriv` (the caller is root).
    User {
        name: String,
        uid: u32,
        gid: u32,
    },
}

impl RunAs {
    /// The current user, or the `postgres` account when the caller is root.
    pub fn for_this_process() -> ClusterResult<Self> {
        if !running_as_root() {
            return Ok(RunAs::CurrentUser);
        }
        let id = |flag: &str| -> ClusterResult<u32> {
            let output = Command::new("id")
                .args([flag, SUPERUSER])
                .output()
                .map_err(|err| ClusterError::new(format!("run `id {flag} {SUPERUSER}`: {err}")))?;
            if !output.status.success() {
                return Err(ClusterError::new(format!(
                    "running as root, PostgreSQL must run as the `{SUPERUSER}` user, which does not exist here \
                     (install the PostgreSQL server package, which creates it)"
                )));
            }
            String::from_utf8_lossy(&output.stdout)
                .trim()
                .parse()
                .map_err(|err| ClusterError::new(format!("`id {flag} {SUPERUSER}` printed no number: {err}")))
        };
        Ok(RunAs::User { name: SUPERUSER.to_owned(), uid: id("-u")?, gid: id("-g")? })
    }

    /// A command that runs `program` as this account. For another account it goes through `setpriv`, which
    /// execs the program in place, so the process id is the program's own (and signals reach it directly).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        match self {
            RunAs::CurrentUser => Command::new(program),
            RunAs::User { uid, gid, .. } => {
                let mut command = Command::new("setpriv");
                command
                    .arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={gid}"))
                    .arg("--init-groups")
                    .arg("--")
                    .arg(program);
                command
            }
        }
    }

    /// Creates `dir` (and its parents) and hands it to this account, mode 0700.
    pub fn make_private_dir(&self, dir: &Path) -> ClusterResult<()> {
        fs::create_dir_all(dir).map_err(|err| ClusterError::new(format!("create {}: {err}", dir.display())))?;
        if let RunAs::User { uid, gid, .. } = self {
            std::os::unix::fs::chown(dir, Some(*uid), Some(*gid))
                .map_err(|err| ClusterError::new(format!("hand {} to the postgres user: {err}", dir.display())))?;
        }
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .map_err(|err| ClusterError::new(format!("restrict {}: {err}", dir.display())))
    }
}

/// Whether a cluster survives a crash of the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// PostgreSQL's defaults: fsync, synchronous commit, full page writes.
    Durable,
    /// fsync, synchronous commit and full page writes off: for throwaway test clusters.
    Throwaway,
}

/// How to create a cluster.
#[derive(Debug, Clone)]
pub struct InitOptions {
    pub durability: Durability,
    /// `pg_resetwal -e <epoch>` after `initdb`, so transaction ids start above `epoch * 2^32`.
    pub xid_epoch: Option<u32>,
    pub max_connections: u32,
    /// Extra `postgresql.conf` lines (`name = value`).
    pub settings: Vec<(String, String)>,
}

impl Default for InitOptions {
    fn default() -> Self {
        Self { durability: Durability::Durable, xid_epoch: None, max_connections: 100, settings: Vec::new() }
    }
}

/// How to stop a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// Disconnect clients and shut down cleanly.
    Fast,
    /// Quit at once; the next start recovers from the WAL.
    Immediate,
}

/// A private cluster in a folder: `pgdata/` (the data directory), `run/` (the socket) and `postgres.log`.
#[derive(Debug, Clone)]
pub struct Cluster {
    bins: PgBinaries,
    root: PathBuf,
    run_as: RunAs,
}

impl fmt::Display for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PostgreSQL cluster in {}", self.root.display())
    }
}

impl Cluster {
    pub fn new(bins: PgBinaries, root: PathBuf, run_as: RunAs) -> Self {
        Self { bins, root, run_as }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn bins(&self) -> &PgBinaries {
        &self.bins
    }

    pub fn run_as(&self) -> &RunAs {
        &self.run_as
    }

    pub fn pgdata(&self) -> PathBuf {
        self.root.join("pgdata")
    }

    pub fn socket_dir(&self) -> PathBuf {
        self.root.join("run")
    }

    pub fn log_file(&self) -> PathBuf {
        self.root.join("postgres.log")
    }

    pub fn is_initialized(&self) -> bool {
        self.pgdata().join("PG_VERSION").is_file()
    }

    /// Connect options for `database` as the superuser, over the cluster's socket.
    pub fn connect_options(&self, database: &str) -> PgConnectOptions {
        PgConnectOptions::new().socket(self.socket_dir()).port(SOCKET_PORT).username(SUPERUSER).database(database)
    }

    /// A URL for `database` that sqlx, psql and pgbench understand.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://{SUPERUSER}@localhost:{SOCKET_PORT}/{database}?host={}", self.socket_dir().display())
    }

    /// Runs a PostgreSQL program as the cluster's account and returns what it printed, or an error that
    /// carries it.
    fn run(&self, tool: &str, args: &[&OsStr]) -> ClusterResult<String> {
        let mut command = self.run_as.command(self.bins.tool(tool));
        command
            .args(args)
            .current_dir(&self.root)
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Keep PostgreSQL out of the terminal's process group, so Ctrl-C reaches only our process,
            // which then stops the cluster itself.
            .process_group(0);
        let output = command.output().map_err(|err| ClusterError::new(format!("run {tool}: {err}")))?;
        let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&output.stderr));
        if output.status.success() {
            Ok(text)
        } else {
            Err(ClusterError::new(format!("{tool} failed ({}): {}", output.status, text.trim())))
        }
    }

    /// Creates the cluster: `initdb`, the settings, and `pg_resetwal -e` when asked.
    pub fn init(&self, options: &InitOptions) -> ClusterResult<()> {
        self.run_as.make_private_dir(&self.root)?;
        self.run_as.make_private_dir(&self.socket_dir())?;
        let pgdata = self.pgdata();
        self.run(
            "initdb",
            &[
                OsStr::new("-D"),
                pgdata.as_os_str(),
                OsStr::new("-U"),
                OsStr::new(SUPERUSER),
                OsStr::new("-A"),
                OsStr::new("trust"),
                OsStr::new("-E"),
                OsStr::new("UTF8"),
                OsStr::new("--locale=C"),
                OsStr::new("--no-instructions"),
            ],
        )?;
        let mut conf = String::from("\n# Written by better-compute for a private cluster.\nlisten_addresses = ''\n");
        let _ = writeln!(conf, "max_connections = {}", options.max_connections);
        if options.durability == Durability::Throwaway {
            conf.push_str("fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n");
        } else {
            // The hot capacity tables ask to be vacuumed once a thousand rows are dead (capacity/0011); look for
            // them every 5 s rather than every minute, so that a busy minute does not leave tens of thousands of
            // dead rows in their indexes. (Throwaway clusters hold a database per test and live minutes.)
            conf.push_str("autovacuum_naptime = 5s\n");
        }
        for (name, value) in &options.settings {
            let _ = writeln!(conf, "{name} = {value}");
        }
        let conf_path = pgdata.join("postgresql.conf");
        let mut existing = fs::read_to_string(&conf_path)
            .map_err(|err| ClusterError::new(format!("read {}: {err}", conf_path.display())))?;
        existing.push_str(&conf);
        fs::write(&conf_path, existing)
            .map_err(|err| ClusterError::new(format!("write {}: {err}", conf_path.display())))?;
        if let Some(epoch) = options.xid_epoch {
            let epoch = epoch.to_string();
            self.run("pg_resetwal", &[OsStr::new("-e"), OsStr::new(&epoch), OsStr::new("-D"), pgdata.as_os_str()])?;
        }
        Ok(())
    }

    /// Whether the cluster's postmaster is running.
    pub fn is_running(&self) -> bool {
        let pgdata = self.pgdata();
        self.run("pg_ctl", &[OsStr::new("status"), OsStr::new("-D"), pgdata.as_os_str()]).is_ok()
    }

    /// Starts the cluster and waits until it accepts connections.
    pub fn start(&self) -> ClusterResult<()> {
        let pgdata = self.pgdata();
        let log = self.log_file();
        let server_options = format!("-k {} -p {SOCKET_PORT}", self.socket_dir().display());
        self.run_as.make_private_dir(&self.socket_dir())?;
        self.run(
            "pg_ctl",
            &[
                OsStr::new("start"),
                OsStr::new("-w"),
                OsStr::new("-t"),
                OsStr::new("120"),
                OsStr::new("-D"),
                pgdata.as_os_str(),
                OsStr::new("-l"),
                log.as_os_str(),
                OsStr::new("-o"),
                OsStr::new(&server_options),
            ],
        )
        .map_err(|err| ClusterError::new(format!("{err}\n{}", self.log_tail())))?;
        Ok(())
    }

    /// Stops the cluster and waits until it is down.
    pub fn stop(&self, mode: StopMode) -> ClusterResult<()> {
        let pgdata = self.pgdata();
        let mode = match mode {
            StopMode::Fast => "fast",
            StopMode::Immediate => "immediate",
        };
        self.run(
            "pg_ctl",
            &[
                OsStr::new("stop"),
                OsStr::new("-w"),
                OsStr::new("-D"),
                pgdata.as_os_str(),
                OsStr::new("-m"),
                OsStr::new(mode),
            ],
        )?;
        Ok(())
    }

    /// The last lines of the server log, to explain a failed start.
    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(self.log_file()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let start = lines.len().saturating_sub(20);
        format!("last lines of {}:\n{}", self.log_file().display(), lines[start..].join("\n"))
    }
}
