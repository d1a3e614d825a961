//! `bcd ramdisk`: the machine's side of the network boot path. A machine the site agent boots over iPXE starts
//! this with a single-use boot credential on its kernel command line; it claims a session with it, then runs
//! the workflow's ramdisk steps (inspect, wipe the disk, write an image, write the deployed configuration) one
//! by one and reports each, until the workflow ends or a later boot takes the session over.
//!
//! Images and the control plane's CA come from the site agent in plain HTTP; each is checked against the hash
//! the kernel command line or the step names before it is trusted. An image write that fails or is stopped
//! zeroes the disk's first MiB, so nothing half-written can boot.

use std::collections::HashSet;
use std::io::{Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use bc_domain::agent::{
    DeployedConfig, ImageToWrite, RamdiskClaim, RamdiskReport, RamdiskSession, RamdiskStep, RamdiskWork,
};
use bc_domain::image::ImageFormat;
use bc_domain::inventory::SectionHashes;
use bc_domain::profile::StepAction;
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt as _;

use crate::client::{Client, ServerTrust, status_of};
use crate::run::InventorySource;

/// A mebibyte: how much of each end of the disk a wipe zeroes.
const MIB: u64 = 1 << 20;

/// What the boot path put on the kernel command line.
#[derive(Clone, PartialEq, Eq)]
pub struct Cmdline {
    /// The control plane's base URL (`bc.server`).
    pub server: String,
    /// The single-use boot credential (`bc.token`, `rbt_...`).
    pub boot_token: String,
    /// The site agent's boot server (`bc.site`), an `http://` base URL.
    pub site: String,
    /// The SHA-256 (lowercase hex) of the control plane's CA, which the site agent serves (`bc.ca_sha256`);
    /// none when the control plane speaks plain HTTP.
    pub ca_sha256: Option<String>,
}

/// Keeps the boot credential out of logs.
impl std::fmt::Debug for Cmdline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cmdline")
            .field("server", &self.server)
            .field("boot_token", &"<redacted>")
            .field("site", &self.site)
            .field("ca_sha256", &self.ca_sha256)
            .finish()
    }
}

/// Why a kernel command line cannot start the ramdisk.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmdlineError {
    #[error("the kernel command line has no {0}= (the boot path sets bc.server, bc.token and bc.site)")]
    Missing(&'static str),
    #[error("{key}={value} on the kernel command line: {reason}")]
    Invalid { key: &'static str, value: String, reason: &'static str },
}

impl Cmdline {
    /// Reads the `bc.*` keys of a kernel command line (whitespace-separated `key=value`; everything else is
    /// ignored, and the last of a repeated key wins, as with the kernel's own parameters).
    pub fn parse(text: &str) -> Result<Cmdline, CmdlineError> {
        let (mut server, mut boot_token, mut site, mut ca_sha256) = (None, None, None, None);
        for word in text.split_whitespace() {
            let Some((key, value)) = word.split_once('=') else { continue };
            let slot = match key {
                "bc.server" => &mut server,
                "bc.token" => &mut boot_token,
                "bc.site" => &mut site,
                "bc.ca_sha256" => &mut ca_sha256,
                _ => continue,
            };
            *slot = Some(value.to_owned()).filter(|v| !v.is_empty());
        }
        let server = server.ok_or(CmdlineError::Missing("bc.server"))?;
        let boot_token = boot_token.ok_or(CmdlineError::Missing("bc.token"))?;
        let site = site.ok_or(CmdlineError::Missing("bc.site"))?;
        let invalid = |key, value: &str, reason| CmdlineError::Invalid { key, value: value.to_owned(), reason };
        if !site.starts_with("http://") {
            return Err(invalid("bc.site", &site, "the site agent's boot server is an http:// URL"));
        }
        let ca_sha256 = ca_sha256.map(|hash| hash.to_ascii_lowercase());
        if let Some(hash) = &ca_sha256
            && !is_sha256(hash)
        {
            return Err(invalid("bc.ca_sha256", hash, "a SHA-256 is 64 hex digits"));
        }
        match (server.split_once("://").map(|(scheme, _)| scheme), &ca_sha256) {
            (Some("https"), Some(_)) | (Some("http"), None) => {}
            (Some("https"), None) => {
                return Err(invalid(
                    "bc.server",
                    &server,
                    "an https:// server needs bc.ca_sha256 to say which CA to trust",
                ));
            }
            (Some("http"), Some(_)) => {
                return Err(invalid("bc.server", &server, "bc.ca_sha256 pins a CA, which needs an https:// server"));
            }
            _ => return Err(invalid("bc.server", &server, "the control plane's base URL is http:// or https://")),
        }
        Ok(Cmdline { server, boot_token, site: site.trim_end_matches('/').to_owned(), ca_sha256 })
    }
}

fn is_sha256(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// How to run the ramdisk.
#[derive(Debug, Clone)]
pub struct RamdiskConfig {
    pub cmdline: Cmdline,
    /// The disk to wipe and write: a block device, or a plain file standing for one.
    pub disk: PathBuf,
    /// The deployed system's configuration partition, mounted.
    pub config_dir: PathBuf,
    pub inventory: InventorySource,
    /// How long to wait before asking again when the workflow is not at a ramdisk step.
    pub poll: Duration,
    /// Where the claimed session is kept (a tmpfs, `/run/bcd-ramdisk`), so a `bcd ramdisk` that crashed and is
    /// started again in the same boot goes on with it: the boot credential can be claimed only once. `None`:
    /// nowhere.
    pub state_dir: Option<PathBuf>,
}

/// Runs the ramdisk until its workflow ends, a later boot takes its session over, or `shutdown` resolves.
/// Unreachable servers are retried; a refused boot credential or an untrustworthy CA ends it with an error.
/// When `shutdown` comes in the middle of an image write, the disk's first MiB is zeroed before it returns.
pub async fn run(config: RamdiskConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let writing = AtomicBool::new(false);
    tokio::select! {
        () = shutdown => {
            if writing.load(Ordering::SeqCst) {
                eprintln!("bcd ramdisk: stopped while writing an image; zeroing the first MiB of {}", config.disk.display());
                if let Err(err) = blocking(zero_head, config.disk.clone()).await {
                    eprintln!("bcd ramdisk: {err}");
                }
            }
            eprintln!("bcd ramdisk: stopping");
            Ok(())
        }
        done = serve(&config, &writing) => done,
    }
}

/// What the steps work on.
struct Machine<'a> {
    config: &'a RamdiskConfig,
    trust: ServerTrust,
    site: Site,
}

/// The site agent's boot server, spoken to in plain HTTP.
struct Site {
    base: String,
    http: reqwest::Client,
}

async fn serve(config: &RamdiskConfig, writing: &AtomicBool) -> anyhow::Result<()> {
    let site = Site { base: config.cmdline.site.clone(), http: site_client()? };
    let trust = match &config.cmdline.ca_sha256 {
        Some(hash) => ServerTrust::PinnedCa(retry("fetch the control plane's CA", || fetch_ca(&site, hash)).await?),
        None => ServerTrust::InsecureHttp,
    };
    let client = Client::new(&config.cmdline.server, &trust)?;
    let session = match saved_session(config) {
        Some(session) => {
            eprintln!("bcd ramdisk: going on with this boot's session");
            session
        }
        None => {
            let claim = RamdiskClaim { boot_token: config.cmdline.boot_token.clone() };
            let session: RamdiskSession = match retry("claim the ramdisk session", || {
                client.call(reqwest::Method::POST, "/v1/ramdisk/sessions", Some(&claim))
            })
            .await
            {
                Ok(session) => session,
                Err(err) if status_of(&err) == Some(401) => {
                    bail!("the boot token was refused (unknown, already used or expired): {err}")
                }
                Err(err) => return Err(err.context("claim the ramdisk session")),
            };
            save_session(config, &session)?;
            session
        }
    };
    eprintln!("bcd ramdisk: session for workflow {} of node {}", session.workflow_id, session.node_id);
    let client = client.with_credential(&session.token);
    let machine = Machine { config, trust, site };
    let mut ran = HashSet::new();
    loop {
        match client.call::<(), RamdiskWork>(reqwest::Method::GET, "/v1/ramdisk/work", None).await {
            Ok(work) if work.ended => {
                eprintln!("bcd ramdisk: workflow {} has ended: nothing more to do", work.workflow_id);
                return Ok(());
            }
            Ok(RamdiskWork { step: Some(step), .. }) if ran.insert((step.index, step.attempt)) => {
                let action = action_name(step.action);
                eprintln!("bcd ramdisk: step {} ({action}), attempt {}", step.index, step.attempt);
                writing.store(step.action == StepAction::WriteImage, Ordering::SeqCst);
                let report = machine.run_step(&step).await;
                writing.store(false, Ordering::SeqCst);
                let outcome = if report.ok { "done" } else { "failed" };
                eprintln!("bcd ramdisk: step {} {outcome}: {}", step.index, report.message.as_deref().unwrap_or(""));
                if deliver(&client, &step, &report).await == Delivery::SessionOver {
                    eprintln!("bcd ramdisk: the session is over (the workflow ended or another boot took over)");
                    return Ok(());
                }
                // The workflow may be at its next step already.
                continue;
            }
            // Not at a ramdisk step, or still showing the one this ramdisk ran.
            Ok(_) => {}
            Err(err) if status_of(&err) == Some(401) => {
                eprintln!("bcd ramdisk: the session is over (the workflow ended or another boot took over)");
                return Ok(());
            }
            Err(err) => eprintln!("bcd ramdisk: asking for work failed: {err:#}"),
        }
        tokio::time::sleep(config.poll).await;
    }
}

/// The session file: the session, and the SHA-256 of the boot credential that claimed it (a later boot's
/// credential claims its own).
#[derive(serde::Serialize, serde::Deserialize)]
struct SavedSession {
    boot_sha256: String,
    session: RamdiskSession,
}

fn session_file(config: &RamdiskConfig) -> Option<PathBuf> {
    config.state_dir.as_ref().map(|dir| dir.join("session.json"))
}

/// The session this boot's credential claimed, if a `bcd ramdisk` of this boot saved one.
fn saved_session(config: &RamdiskConfig) -> Option<RamdiskSession> {
    let text = std::fs::read_to_string(session_file(config)?).ok()?;
    let saved: SavedSession = serde_json::from_str(&text).ok()?;
    (saved.boot_sha256 == hex::encode(Sha256::digest(config.cmdline.boot_token.as_bytes()))).then_some(saved.session)
}

/// Keeps the claimed session where a restarted `bcd ramdisk` finds it, readable by its owner only.
fn save_session(config: &RamdiskConfig, session: &RamdiskSession) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let Some(path) = session_file(config) else { return Ok(()) };
    let saved = SavedSession {
        boot_sha256: hex::encode(Sha256::digest(config.cmdline.boot_token.as_bytes())),
        session: session.clone(),
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let partial = path.with_extension("json.part");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&partial)
        .with_context(|| format!("write {}", partial.display()))?;
    file.write_all(&serde_json::to_vec(&saved)?).with_context(|| format!("write {}", partial.display()))?;
    std::fs::rename(&partial, &path).with_context(|| format!("write {}", path.display()))?;
    Ok(())
}

/// How sending a report ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    Accepted,
    Refused,
    /// 401: the session no longer holds.
    SessionOver,
    /// The step's deadline passed with the control plane unreachable.
    GaveUp,
}

/// Sends a step's report, retrying while the control plane cannot be reached, until the step's deadline.
async fn deliver(client: &Client, step: &RamdiskStep, report: &RamdiskReport) -> Delivery {
    let path = format!("/v1/ramdisk/steps/{}", step.index);
    let mut backoff = Duration::from_millis(200);
    loop {
        let err = match client.call::<_, serde_json::Value>(reqwest::Method::POST, &path, Some(report)).await {
            Ok(_) => return Delivery::Accepted,
            Err(err) => err,
        };
        match status_of(&err) {
            Some(401) => return Delivery::SessionOver,
            Some(status) if status < 500 => {
                eprintln!("bcd ramdisk: the report of step {} was refused: {err}", step.index);
                return Delivery::Refused;
            }
            // The control plane took it but answered something other than JSON.
            None if !transient(&err) => return Delivery::Accepted,
            _ => {}
        }
        if now_ms().saturating_add(backoff.as_millis() as i64) >= step.deadline_ms {
            eprintln!("bcd ramdisk: gave up reporting step {} at its deadline: {err:#}", step.index);
            return Delivery::GaveUp;
        }
        eprintln!("bcd ramdisk: reporting step {} failed, retrying: {err:#}", step.index);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(10));
    }
}

/// Runs `attempt` until it succeeds or fails for good, waiting longer after each failure to reach a server.
async fn retry<T, F: Future<Output = anyhow::Result<T>>>(
    what: &str,
    mut attempt: impl FnMut() -> F,
) -> anyhow::Result<T> {
    let mut backoff = Duration::from_millis(200);
    loop {
        match attempt().await {
            Err(err) if transient(&err) => {
                eprintln!("bcd ramdisk: cannot {what} yet: {err:#}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
            done => return done,
        }
    }
}

/// Whether an error is a server out of reach (or failing with 5xx), which trying again may cure.
fn transient(err: &anyhow::Error) -> bool {
    if let Some(status) = status_of(err) {
        return status >= 500;
    }
    err.chain()
        .filter_map(|cause| cause.downcast_ref::<reqwest::Error>())
        .any(|cause| !cause.is_builder() && cause.status().is_none_or(|status| status.is_server_error()))
}

/// The client of the site agent's boot server: plain HTTP only, and no limit on a whole transfer (images are
/// large), only on connecting and on silence.
fn site_client() -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .tls_backend_preconfigured(bc_pki::tls::plain_http_client_config()?)
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(60))
        .build()
        .context("build the site agent's HTTP client")
}

/// The control plane's CA (PEM) from the site agent, trusted only when it hashes to `sha256`.
async fn fetch_ca(site: &Site, sha256: &str) -> anyhow::Result<String> {
    let url = format!("{}/boot/ca.pem", site.base);
    let response = site.http.get(&url).timeout(Duration::from_secs(30)).send().await?.error_for_status()?;
    let bytes = response.bytes().await?;
    let actual = hex::encode(Sha256::digest(&bytes));
    if actual != sha256 {
        bail!("the CA at {url} has sha256 {actual}, but bc.ca_sha256 is {sha256}: it is not trusted");
    }
    String::from_utf8(bytes.to_vec()).with_context(|| format!("the CA at {url} is not PEM text"))
}

impl Machine<'_> {
    async fn run_step(&self, step: &RamdiskStep) -> RamdiskReport {
        let disk = &self.config.disk;
        let config_dir = &self.config.config_dir;
        let mut inventory = None;
        let outcome = match step.action {
            StepAction::Inspect => {
                let source = self.config.inventory.clone();
                blocking(|source: InventorySource| Ok(source.read()), source).await.map(|document| {
                    let message = format!("inspected: {} GPUs, host {}", document.gpus.len(), document.system.hostname);
                    inventory = Some(document.report(&SectionHashes::new()));
                    message
                })
            }
            StepAction::WipeDisks => blocking(|(d, c)| wipe(&d, &c), (disk.clone(), config_dir.clone())).await,
            StepAction::WriteImage => match &step.image {
                Some(image) => write_image(&self.site, image, disk, step.deadline_ms).await,
                None => Err("the write-image step came without an image".to_owned()),
            },
            StepAction::WriteConfig => match &step.config {
                Some(deployed) => {
                    let files = ConfigFiles::new(&self.config.cmdline.server, &self.trust, config_dir, deployed);
                    blocking(|(files, dir): (ConfigFiles, PathBuf)| files.write(&dir), (files, config_dir.clone()))
                        .await
                }
                None => Err("the write-config step came without a configuration".to_owned()),
            },
            other => Err(format!("{} does not run in the ramdisk", action_name(other))),
        };
        let (ok, message) = match outcome {
            Ok(message) => (true, message),
            Err(message) => (false, message),
        };
        RamdiskReport { attempt: step.attempt, ok, message: Some(message), inventory }
    }
}

/// The action's name as the wire spells it (`write-image`).
fn action_name(action: StepAction) -> String {
    match serde_json::to_value(action) {
        Ok(serde_json::Value::String(name)) => name,
        _ => format!("{action:?}"),
    }
}

/// Runs blocking file work off the async threads.
async fn blocking<A: Send + 'static, T: Send + 'static>(
    work: impl FnOnce(A) -> Result<T, String> + Send + 'static,
    input: A,
) -> Result<T, String> {
    tokio::task::spawn_blocking(move || work(input)).await.unwrap_or_else(|err| Err(format!("the work failed: {err}")))
}

/// The byte ranges `(offset, length)` a wipe zeroes on a disk of `size` bytes: the first and the last MiB,
/// where partition tables (GPT keeps a copy at the end) and most filesystem and RAID signatures live.
fn wipe_ranges(size: u64) -> Vec<(u64, u64)> {
    if size <= 2 * MIB { vec![(0, size)] } else { vec![(0, MIB), (size - MIB, MIB)] }
}

/// Writes `length` zero bytes at `offset`.
fn zero(file: &mut std::fs::File, offset: u64, length: u64) -> std::io::Result<()> {
    let zeros = vec![0u8; MIB as usize];
    file.seek(SeekFrom::Start(offset))?;
    let mut left = length;
    while left > 0 {
        let n = left.min(MIB);
        file.write_all(&zeros[..n as usize])?;
        left -= n;
    }
    Ok(())
}

/// Opens the disk for writing and finds its size (a block device's length shows only by seeking to its end).
fn open_disk(disk: &Path) -> Result<(std::fs::File, u64), String> {
    let mut file =
        std::fs::OpenOptions::new().write(true).open(disk).map_err(|err| format!("open {}: {err}", disk.display()))?;
    let size = file.seek(SeekFrom::End(0)).map_err(|err| format!("find the size of {}: {err}", disk.display()))?;
    Ok((file, size))
}

/// Zeroes the first MiB of the disk, so that a half-written image cannot boot.
fn zero_head(disk: PathBuf) -> Result<(), String> {
    let (mut file, size) = open_disk(&disk)?;
    zero(&mut file, 0, size.min(MIB))
        .and_then(|()| file.sync_all())
        .map_err(|err| format!("zero the first MiB of {}: {err}", disk.display()))
}

/// Erases the disk's partition tables and signatures, and empties the configuration folder.
fn wipe(disk: &Path, config_dir: &Path) -> Result<String, String> {
    let (mut file, size) = open_disk(disk)?;
    for (offset, length) in wipe_ranges(size) {
        zero(&mut file, offset, length).map_err(|err| format!("zero {}: {err}", disk.display()))?;
    }
    file.sync_all().map_err(|err| format!("flush {}: {err}", disk.display()))?;
    empty_dir(config_dir).map_err(|err| format!("empty {}: {err}", config_dir.display()))?;
    Ok(format!("wiped {}: partition tables and signatures", disk.display()))
}

/// Removes everything in `dir`; a folder that does not exist is empty.
fn empty_dir(dir: &Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err),
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())?;
        } else {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// Why writing an image stopped: a fault that may pass (the site agent or the control plane behind it cannot be
/// reached for now, the transfer broke off) or one that will not (a wrong hash or size, a disk error).
#[derive(Debug)]
enum Failed {
    Transient(String),
    Permanent(String),
}

impl From<String> for Failed {
    fn from(message: String) -> Failed {
        Failed::Permanent(message)
    }
}

/// Writes an image to the disk from the site agent, checked against its size and hash. A transient fault starts
/// the write again from the first byte, after a growing pause, while the step's deadline leaves time; on failure
/// the disk's first MiB is zeroed.
async fn write_image(site: &Site, image: &ImageToWrite, disk: &Path, deadline_ms: i64) -> Result<String, String> {
    let mut backoff = Duration::from_secs(1);
    let failed = loop {
        let written = match image.format {
            ImageFormat::Raw | ImageFormat::Iso => write_in_place(site, image, disk).await,
            ImageFormat::Qcow2 => write_converted(site, image, disk).await,
        };
        match written {
            Ok(hash) => {
                return Ok(format!(
                    "wrote {} ({} bytes, sha256 {hash}) to {}",
                    image.image_id,
                    image.size,
                    disk.display()
                ));
            }
            Err(Failed::Transient(message)) if now_ms().saturating_add(backoff.as_millis() as i64) < deadline_ms => {
                eprintln!("bcd ramdisk: writing {} failed, starting again: {message}", image.image_id);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(15));
            }
            Err(Failed::Transient(message) | Failed::Permanent(message)) => break message,
        }
    };
    match blocking(zero_head, disk.to_owned()).await {
        Ok(()) => Err(failed),
        Err(also) => Err(format!("{failed}; {also}")),
    }
}

/// Streams the image onto the disk from its first byte.
async fn write_in_place(site: &Site, image: &ImageToWrite, disk: &Path) -> Result<String, Failed> {
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .open(disk)
        .await
        .map_err(|err| format!("open {}: {err}", disk.display()))?;
    let downloaded = download(site, image, &mut file).await;
    // A tokio file writes on a blocking thread, behind the caller: every write must land before anything else
    // touches the disk (a refused image's head is zeroed next, and a late write would put it back).
    let flushed = file.flush().await;
    let hash = downloaded?;
    flushed.map_err(|err| format!("flush {}: {err}", disk.display()))?;
    file.sync_all().await.map_err(|err| format!("flush {}: {err}", disk.display()))?;
    Ok(hash)
}

/// Downloads a qcow2 image beside the disk, checks it, and converts it onto the disk with `qemu-img`.
async fn write_converted(site: &Site, image: &ImageToWrite, disk: &Path) -> Result<String, Failed> {
    let qemu_img = tokio::process::Command::new("qemu-img")
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await;
    if qemu_img.is_err() {
        return Err(Failed::Permanent("qcow2 needs qemu-img in the ramdisk".to_owned()));
    }
    let name = disk.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "disk".to_owned());
    let temporary = disk.with_file_name(format!(".{name}.{}.qcow2", image.sha256));
    let converted = async {
        let mut file = tokio::fs::File::create(&temporary)
            .await
            .map_err(|err| format!("create {}: {err}", temporary.display()))?;
        let hash = download(site, image, &mut file).await?;
        drop(file);
        let output = tokio::process::Command::new("qemu-img")
            .args(["convert", "-O", "raw"])
            .arg(&temporary)
            .arg(disk)
            .output()
            .await
            .map_err(|err| format!("run qemu-img: {err}"))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(Failed::Permanent(format!("qemu-img convert failed ({}): {}", output.status, stderr.trim())));
        }
        blocking(
            |disk: PathBuf| std::fs::File::open(&disk).and_then(|f| f.sync_all()).map_err(|e| e.to_string()),
            disk.to_owned(),
        )
        .await
        .map_err(|err| format!("flush {}: {err}", disk.display()))?;
        Ok(hash)
    }
    .await;
    let _ = tokio::fs::remove_file(&temporary).await;
    converted
}

/// Streams the image's bytes into `out` while hashing them; answers the hash once the size and the hash are
/// the image's. Stops as soon as more bytes arrive than the image has.
async fn download(site: &Site, image: &ImageToWrite, out: &mut tokio::fs::File) -> Result<String, Failed> {
    let expected = image.sha256.to_ascii_lowercase();
    if !is_sha256(&expected) {
        return Err(Failed::Permanent(format!("the image's sha256 {:?} is not 64 hex digits", image.sha256)));
    }
    let url = format!("{}/images/sha256/{expected}", site.base);
    let mut response =
        site.http.get(&url).send().await.map_err(|err| Failed::Transient(format!("fetch {url}: {err}")))?;
    if response.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE {
        return Err(Failed::Transient(format!("fetch {url}: the site agent answered {}", response.status())));
    }
    if !response.status().is_success() {
        return Err(Failed::Permanent(format!("fetch {url}: the site agent answered {}", response.status())));
    }
    if let Some(offered) = response.content_length()
        && offered != image.size
    {
        return Err(Failed::Permanent(format!(
            "{}: expected {} bytes, the site agent offers {offered}",
            image.image_id, image.size
        )));
    }
    let mut hasher = Sha256::new();
    let mut received: u64 = 0;
    loop {
        let chunk = match response.chunk().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(err) => {
                return Err(Failed::Transient(format!("fetch {url}: {err} after {received} of {} bytes", image.size)));
            }
        };
        received += chunk.len() as u64;
        if received > image.size {
            return Err(Failed::Permanent(format!(
                "{}: expected {} bytes, the site agent sent more",
                image.image_id, image.size
            )));
        }
        hasher.update(&chunk);
        out.write_all(&chunk).await.map_err(|err| format!("write the image: {err}"))?;
    }
    out.flush().await.map_err(|err| format!("write the image: {err}"))?;
    let actual = hex::encode(hasher.finalize());
    if received != image.size || actual != expected {
        return Err(Failed::Permanent(format!(
            "{}: expected {} bytes with sha256 {expected}, got {received} bytes with sha256 {actual}",
            image.image_id, image.size
        )));
    }
    Ok(actual)
}

/// The files of the deployed machine's configuration, as they are written.
#[derive(Debug, Clone)]
struct ConfigFiles {
    /// `bcd.env`: how the deployed `bcd` joins. Holds the join token.
    env: String,
    /// `ca.pem`: the control plane's CA, when it is trusted through one.
    ca: Option<String>,
    /// `host-config.json`.
    host_config: std::collections::BTreeMap<String, String>,
    /// `user-data`.
    user_data: Option<String>,
    /// Set when a value would break `bcd.env`'s lines.
    unsafe_value: Option<&'static str>,
}

impl ConfigFiles {
    fn new(server: &str, trust: &ServerTrust, config_dir: &Path, deployed: &DeployedConfig) -> ConfigFiles {
        let unsafe_value =
            [("the server", server), ("the join token", &deployed.join_token), ("the hostname", &deployed.hostname)]
                .into_iter()
                .find(|(_, value)| value.chars().any(|c| c.is_control() || c.is_whitespace()))
                .map(|(name, _)| name);
        let mut env = format!(
            "BCD_SERVER={server}\nBCD_JOIN_TOKEN={}\nBCD_HOSTNAME={}\n",
            deployed.join_token, deployed.hostname
        );
        let ca = match trust {
            ServerTrust::PinnedCa(pem) => {
                env.push_str(&format!("BCD_CA={}\n", config_dir.join("ca.pem").display()));
                Some(pem.clone())
            }
            ServerTrust::InsecureHttp => {
                env.push_str("BCD_INSECURE_HTTP=1\n");
                None
            }
        };
        ConfigFiles {
            env,
            ca,
            host_config: deployed.host_config.clone(),
            user_data: deployed.user_data.clone(),
            unsafe_value,
        }
    }

    /// Writes the files into `dir`, each atomically; `bcd.env` last, so that its presence means the rest is
    /// there. Files this configuration lacks (`ca.pem`, `user-data`) are removed.
    fn write(&self, dir: &Path) -> Result<String, String> {
        if let Some(name) = self.unsafe_value {
            return Err(format!("{name} holds whitespace or control characters, which bcd.env cannot carry"));
        }
        if !dir.is_dir() {
            return Err(format!("{} is not a folder (is the configuration partition mounted?)", dir.display()));
        }
        let host_config = serde_json::to_vec_pretty(&self.host_config).map_err(|err| err.to_string())?;
        write_file(dir, "host-config.json", &host_config, 0o644)?;
        match &self.user_data {
            // User data often carries secrets of its own.
            Some(text) => write_file(dir, "user-data", text.as_bytes(), 0o600)?,
            None => remove_file(dir, "user-data")?,
        }
        match &self.ca {
            Some(pem) => write_file(dir, "ca.pem", pem.as_bytes(), 0o644)?,
            None => remove_file(dir, "ca.pem")?,
        }
        write_file(dir, "bcd.env", self.env.as_bytes(), 0o600)?;
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|err| format!("flush {}: {err}", dir.display()))?;
        Ok("wrote the deployed machine's configuration".to_owned())
    }
}

/// Writes `dir/name` with `mode` through a temporary file and a rename, so that a reader never sees half of it.
fn write_file(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> Result<(), String> {
    let path = dir.join(name);
    let temporary = dir.join(format!(".{name}.tmp"));
    let written = (|| {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
        let mut file = options.open(&temporary)?;
        // The mode given at creation is masked by the umask, and an old temporary file keeps its own.
        std::fs::set_permissions(&temporary, std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, &path)
    })();
    written.map_err(|err| format!("write {}: {err}", path.display()))
}

fn remove_file(dir: &Path, name: &str) -> Result<(), String> {
    let path = dir.join(name);
    match std::fs::remove_file(&path) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => Err(format!("remove {}: {err}", path.display())),
        _ => Ok(()),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use axum::Json;
    use axum::body::{Body, Bytes};
    use axum::extract::{Path as UrlPath, State};
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::{IntoResponse, Response};
    use axum::routing::{get, post};
    use bc_domain::id::{ImageId, NodeId, WorkflowId};

    use super::*;
    use crate::fixture::Fixture;

    const CMDLINE: &str = "BOOT_IMAGE=/vmlinuz quiet bc.server=https://cp.example:8443 bc.token=rbt_abc \
                           bc.site=http://10.0.0.2:8089/ bc.ca_sha256=ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789";

    #[test]
    fn cmdline_reads_the_bc_keys_and_ignores_the_rest() {
        let cmdline = Cmdline::parse(CMDLINE).expect("parses");
        assert_eq!(cmdline.server, "https://cp.example:8443");
        assert_eq!(cmdline.boot_token, "rbt_abc");
        assert_eq!(cmdline.site, "http://10.0.0.2:8089");
        assert_eq!(
            cmdline.ca_sha256.as_deref(),
            Some("abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789")
        );
        assert!(!format!("{cmdline:?}").contains("rbt_abc"), "the boot token stays out of Debug");
        let plain =
            Cmdline::parse("bc.server=http://cp:8080 bc.token=rbt_x bc.site=http://site:8089\n").expect("parses");
        assert_eq!(plain.ca_sha256, None);
    }

    #[test]
    fn cmdline_names_what_is_missing_or_wrong() {
        let without = |key: &str| {
            CMDLINE
                .split_whitespace()
                .filter(|word| !word.starts_with(&format!("{key}=")))
                .collect::<Vec<_>>()
                .join(" ")
        };
        for key in ["bc.server", "bc.token", "bc.site"] {
            let err = Cmdline::parse(&without(key)).expect_err("a key is missing");
            assert_eq!(err, CmdlineError::Missing(key));
            assert!(err.to_string().contains(&format!("no {key}=")), "{err}");
        }
        let empty_token = CMDLINE.replace("bc.token=rbt_abc", "bc.token=");
        assert_eq!(Cmdline::parse(&empty_token), Err(CmdlineError::Missing("bc.token")));
        let https_without_ca = without("bc.ca_sha256");
        let err = Cmdline::parse(&https_without_ca).expect_err("https needs a CA");
        assert!(err.to_string().contains("bc.ca_sha256"), "{err}");
        let bad_hash = "bc.server=https://cp bc.token=rbt_x bc.site=http://s bc.ca_sha256=1234";
        assert!(matches!(Cmdline::parse(bad_hash), Err(CmdlineError::Invalid { key: "bc.ca_sha256", .. })));
        let https_site = "bc.server=http://cp bc.token=rbt_x bc.site=https://s";
        assert!(matches!(Cmdline::parse(https_site), Err(CmdlineError::Invalid { key: "bc.site", .. })));
        let ca_over_http =
            format!("bc.server=http://cp bc.token=rbt_x bc.site=http://s bc.ca_sha256={}", "a".repeat(64));
        assert!(matches!(Cmdline::parse(&ca_over_http), Err(CmdlineError::Invalid { key: "bc.server", .. })));
    }

    #[test]
    fn wipe_ranges_cover_both_ends_or_a_small_disk_whole() {
        assert_eq!(wipe_ranges(0), vec![(0, 0)]);
        assert_eq!(wipe_ranges(100), vec![(0, 100)]);
        assert_eq!(wipe_ranges(2 * MIB), vec![(0, 2 * MIB)]);
        assert_eq!(wipe_ranges(10 * MIB), vec![(0, MIB), (9 * MIB, MIB)]);
    }

    #[test]
    fn wipe_zeroes_both_ends_and_empties_the_config_dir() {
        let fixture = Fixture::new("ramdisk-wipe");
        let disk = fixture.0.join("disk");
        std::fs::write(&disk, vec![0xAA; 4 * MIB as usize]).expect("write the disk");
        let small = fixture.0.join("small");
        std::fs::write(&small, vec![0xAA; 100]).expect("write the small disk");
        fixture.file("config/bcd.env", "BCD_SERVER=x\n");
        fixture.file("config/nested/file", "x");
        let config = fixture.0.join("config");

        let message = wipe(&disk, &config).expect("wipes");
        assert_eq!(message, format!("wiped {}: partition tables and signatures", disk.display()));
        let bytes = std::fs::read(&disk).expect("read the disk");
        let mib = MIB as usize;
        assert_eq!(bytes.len(), 4 * mib, "the disk keeps its size");
        assert!(bytes[..mib].iter().all(|&b| b == 0), "the first MiB is zero");
        assert!(bytes[3 * mib..].iter().all(|&b| b == 0), "the last MiB is zero");
        assert!(bytes[mib..3 * mib].iter().all(|&b| b == 0xAA), "the middle is untouched");
        assert_eq!(std::fs::read_dir(&config).expect("the config dir stays").count(), 0);

        wipe(&small, &config).expect("wipes a small disk");
        assert_eq!(std::fs::read(&small).expect("read"), vec![0; 100]);
        assert!(wipe(&fixture.0.join("absent"), &config).is_err(), "a missing disk is an error");
    }

    fn image(bytes: &[u8], format: ImageFormat) -> ImageToWrite {
        ImageToWrite {
            image_id: ImageId::generate(),
            sha256: hex::encode(Sha256::digest(bytes)),
            size: bytes.len() as u64,
            format,
        }
    }

    /// Serves `router` on a new port of 127.0.0.1; answers its base URL.
    async fn serve(router: axum::Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind a test server");
        let base = format!("http://{}", listener.local_addr().expect("its address"));
        tokio::spawn(async move { axum::serve(listener, router).await });
        base
    }

    /// A site agent serving `bytes` as the image of any hash at `/images/sha256/{hash}`, and the same bytes
    /// with no length announced (chunked) at `/chunked/images/sha256/{hash}`.
    async fn site_serving(bytes: Vec<u8>) -> String {
        let chunked = bytes.clone();
        let router =
            axum::Router::new().route("/images/sha256/{hash}", get(move || async move { bytes.clone() })).route(
                "/chunked/images/sha256/{hash}",
                get(move || async move {
                    let parts: Vec<Result<Bytes, std::io::Error>> =
                        chunked.chunks(1000).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
                    Body::from_stream(tokio_stream::iter(parts))
                }),
            );
        serve(router).await
    }

    fn site(base: &str) -> Site {
        Site { base: base.to_owned(), http: site_client().expect("a client") }
    }

    /// A step deadline a minute ahead.
    fn later() -> i64 {
        now_ms() + 60_000
    }

    #[tokio::test]
    async fn write_image_starts_again_while_the_site_agent_cannot_reach_the_control_plane() {
        let fixture = Fixture::new("ramdisk-write-retry");
        let disk = fixture.0.join("disk");
        std::fs::write(&disk, vec![0xAA; 2 * MIB as usize]).expect("write the disk");
        let bytes = payload(300_000);
        let asked = Arc::new(AtomicUsize::new(0));
        let (served, count) = (bytes.clone(), Arc::clone(&asked));
        let router = axum::Router::new().route(
            "/images/sha256/{hash}",
            get(move || {
                let (served, count) = (served.clone(), Arc::clone(&count));
                async move {
                    match count.fetch_add(1, Ordering::SeqCst) {
                        0 | 1 => (StatusCode::SERVICE_UNAVAILABLE, "the control plane did not answer").into_response(),
                        _ => served.into_response(),
                    }
                }
            }),
        );
        let base = serve(router).await;
        let image = image(&bytes, ImageFormat::Raw);
        write_image(&site(&base), &image, &disk, later()).await.expect("written once the site agent serves it");
        assert_eq!(asked.load(Ordering::SeqCst), 3);
        assert_eq!(&std::fs::read(&disk).expect("read the disk")[..bytes.len()], &bytes[..]);

        // Past the step's deadline it stops, leaving nothing bootable.
        let never = serve(axum::Router::new().route(
            "/images/sha256/{hash}",
            get(|| async { (StatusCode::SERVICE_UNAVAILABLE, "the control plane did not answer") }),
        ))
        .await;
        let message = write_image(&site(&never), &image, &disk, now_ms() + 500).await.expect_err("gives up");
        assert!(message.contains("503"), "{message}");
        assert!(std::fs::read(&disk).expect("read the disk")[..MIB as usize].iter().all(|&b| b == 0));
    }

    fn payload(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8 + 1).collect()
    }

    #[tokio::test]
    async fn write_image_streams_checked_bytes_onto_the_disk() {
        let fixture = Fixture::new("ramdisk-write-ok");
        let disk = fixture.0.join("disk");
        std::fs::write(&disk, vec![0xAA; 3 * MIB as usize]).expect("write the disk");
        let bytes = payload(MIB as usize + 12_345);
        let base = site_serving(bytes.clone()).await;
        let image = image(&bytes, ImageFormat::Raw);

        let message = write_image(&site(&base), &image, &disk, later()).await.expect("writes");
        assert_eq!(
            message,
            format!("wrote {} ({} bytes, sha256 {}) to {}", image.image_id, bytes.len(), image.sha256, disk.display())
        );
        let written = std::fs::read(&disk).expect("read the disk");
        assert_eq!(&written[..bytes.len()], &bytes[..], "the disk starts with the image");

        let chunked = site(&format!("{base}/chunked"));
        std::fs::write(&disk, b"").expect("empty the disk");
        write_image(&chunked, &image, &disk, later()).await.expect("writes a chunked answer");
        assert_eq!(std::fs::read(&disk).expect("read the disk"), bytes);
    }

    #[tokio::test]
    async fn write_image_with_a_wrong_hash_fails_and_zeroes_the_first_mib() {
        let fixture = Fixture::new("ramdisk-write-bad-hash");
        let disk = fixture.0.join("disk");
        std::fs::write(&disk, vec![0xAA; 3 * MIB as usize]).expect("write the disk");
        let bytes = payload(2 * MIB as usize);
        let base = site_serving(bytes.clone()).await;
        let mut wrong = image(&bytes, ImageFormat::Iso);
        wrong.sha256 = hex::encode(Sha256::digest(b"something else"));

        let message = write_image(&site(&base), &wrong, &disk, later()).await.expect_err("the hash does not match");
        let actual = hex::encode(Sha256::digest(&bytes));
        assert!(message.contains(&wrong.sha256) && message.contains(&actual), "names both hashes: {message}");
        let written = std::fs::read(&disk).expect("read the disk");
        let mib = MIB as usize;
        assert!(written[..mib].iter().all(|&b| b == 0), "nothing half-written may boot");
        assert_eq!(&written[mib..2 * mib], &bytes[mib..], "the rest was written before the check");
    }

    #[tokio::test]
    async fn write_image_refuses_more_bytes_than_the_image_has() {
        let fixture = Fixture::new("ramdisk-write-too-many");
        let disk = fixture.0.join("disk");
        let bytes = payload(50_000);
        let base = site_serving(bytes.clone()).await;
        let short = image(&bytes[..40_000], ImageFormat::Raw);

        for site in [site(&base), site(&format!("{base}/chunked"))] {
            std::fs::write(&disk, vec![0xAA; 2 * MIB as usize]).expect("write the disk");
            let message = write_image(&site, &short, &disk, later()).await.expect_err("too many bytes");
            assert!(message.contains("40000 bytes"), "{message}");
            let written = std::fs::read(&disk).expect("read the disk");
            assert!(written[..MIB as usize].iter().all(|&b| b == 0), "the first MiB is zeroed");
        }

        let missing =
            write_image(&site("http://127.0.0.1:1"), &short, &disk, now_ms()).await.expect_err("no site agent");
        assert!(missing.contains("fetch"), "{missing}");
    }

    #[test]
    fn write_config_writes_the_env_file_private_and_the_rest() {
        use std::os::unix::fs::PermissionsExt as _;
        let fixture = Fixture::new("ramdisk-write-config");
        fixture.file("config/ca.pem", "stale");
        let dir = fixture.0.join("config");
        let deployed = DeployedConfig {
            hostname: "gpu-7".to_owned(),
            host_config: [("ntp".to_owned(), "10.0.0.1".to_owned())].into_iter().collect(),
            user_data: Some("#cloud-config\n".to_owned()),
            join_token: "jt_secret".to_owned(),
        };
        let mode = |name: &str| std::fs::metadata(dir.join(name)).expect("written").permissions().mode() & 0o777;

        let pinned = ServerTrust::PinnedCa("-----BEGIN CERTIFICATE-----\n".to_owned());
        let files = ConfigFiles::new("https://cp:8443", &pinned, &dir, &deployed);
        assert_eq!(files.write(&dir), Ok("wrote the deployed machine's configuration".to_owned()));
        let env = std::fs::read_to_string(dir.join("bcd.env")).expect("bcd.env");
        assert_eq!(
            env,
            format!(
                "BCD_SERVER=https://cp:8443\nBCD_JOIN_TOKEN=jt_secret\nBCD_HOSTNAME=gpu-7\nBCD_CA={}\n",
                dir.join("ca.pem").display()
            )
        );
        assert_eq!(mode("bcd.env"), 0o600);
        assert_eq!(mode("user-data"), 0o600);
        assert_eq!(std::fs::read_to_string(dir.join("ca.pem")).expect("ca.pem"), "-----BEGIN CERTIFICATE-----\n");
        let host_config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("host-config.json")).expect("host-config.json"))
                .expect("JSON");
        assert_eq!(host_config, serde_json::json!({ "ntp": "10.0.0.1" }));

        let plain = ConfigFiles::new(
            "http://cp:8080",
            &ServerTrust::InsecureHttp,
            &dir,
            &DeployedConfig { user_data: None, ..deployed.clone() },
        );
        plain.write(&dir).expect("writes");
        let env = std::fs::read_to_string(dir.join("bcd.env")).expect("bcd.env");
        assert!(env.ends_with("BCD_INSECURE_HTTP=1\n"), "{env}");
        assert!(!dir.join("ca.pem").exists() && !dir.join("user-data").exists(), "what the config lacks is removed");
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
            .collect();
        names.sort();
        assert_eq!(names, ["bcd.env", "host-config.json"], "no temporary file is left");

        let injected = DeployedConfig { hostname: "gpu-7\nBCD_SERVER=http://evil".to_owned(), ..deployed };
        let err = ConfigFiles::new("http://cp:8080", &ServerTrust::InsecureHttp, &dir, &injected).write(&dir);
        assert!(err.is_err_and(|e| e.contains("hostname")));
        let err = plain.write(&fixture.0.join("unmounted"));
        assert!(err.is_err_and(|e| e.contains("not a folder")));
    }

    /// A control plane that hands out `steps` in order (showing each once more right after its report, as a
    /// lagging server would) and records the reports.
    #[derive(Clone)]
    struct FakeControlPlane {
        steps: Arc<Vec<RamdiskStep>>,
        reports: Arc<Mutex<Vec<(u32, RamdiskReport)>>>,
        echo: Arc<Mutex<bool>>,
        workflow_id: WorkflowId,
        node_id: NodeId,
        /// The boot credential claims once.
        claimed: Arc<AtomicBool>,
    }

    fn error(status: StatusCode) -> Response {
        (status, Json(serde_json::json!({ "error": { "code": "UNAUTHENTICATED", "message": "no" } }))).into_response()
    }

    async fn claim(State(cp): State<FakeControlPlane>, Json(claim): Json<RamdiskClaim>) -> Response {
        if claim.boot_token != "rbt_good" || cp.claimed.swap(true, Ordering::SeqCst) {
            return error(StatusCode::UNAUTHORIZED);
        }
        let session = RamdiskSession { workflow_id: cp.workflow_id, node_id: cp.node_id, token: "rds_1".to_owned() };
        (StatusCode::CREATED, Json(session)).into_response()
    }

    async fn work(State(cp): State<FakeControlPlane>, headers: HeaderMap) -> Response {
        if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some("Bearer rds_1") {
            return error(StatusCode::UNAUTHORIZED);
        }
        let reports = cp.reports.lock().expect("lock").len();
        let echo = std::mem::take(&mut *cp.echo.lock().expect("lock"));
        let shown = if echo { reports - 1 } else { reports };
        let step = cp.steps.get(shown).cloned();
        let work = RamdiskWork { workflow_id: cp.workflow_id, node_id: cp.node_id, ended: step.is_none(), step };
        Json(work).into_response()
    }

    async fn report(
        State(cp): State<FakeControlPlane>,
        UrlPath(index): UrlPath<u32>,
        Json(report): Json<RamdiskReport>,
    ) -> Response {
        cp.reports.lock().expect("lock").push((index, report));
        *cp.echo.lock().expect("lock") = true;
        Json(serde_json::json!({})).into_response()
    }

    fn step(index: u32, action: StepAction) -> RamdiskStep {
        RamdiskStep { index, attempt: 1, action, deadline_ms: i64::MAX, image: None, config: None }
    }

    #[tokio::test]
    async fn run_carries_out_each_step_once_and_stops_when_the_workflow_ends() {
        let fixture = Fixture::new("ramdisk-run");
        let disk = fixture.0.join("disk");
        std::fs::write(&disk, vec![0xAA; 3 * MIB as usize]).expect("write the disk");
        fixture.file("config/old", "x");
        let bytes = payload(70_000);
        let image = image(&bytes, ImageFormat::Raw);
        let deployed = DeployedConfig {
            hostname: "gpu-7".to_owned(),
            host_config: Default::default(),
            user_data: None,
            join_token: "jt_1".to_owned(),
        };
        let steps = vec![
            step(0, StepAction::Inspect),
            step(1, StepAction::WipeDisks),
            RamdiskStep { image: Some(image.clone()), ..step(2, StepAction::WriteImage) },
            RamdiskStep { config: Some(deployed), ..step(3, StepAction::WriteConfig) },
            step(4, StepAction::PowerOn),
        ];
        let cp = FakeControlPlane {
            steps: Arc::new(steps),
            reports: Default::default(),
            echo: Default::default(),
            workflow_id: WorkflowId::generate(),
            node_id: NodeId::generate(),
            claimed: Default::default(),
        };
        let images = bytes.clone();
        let router = axum::Router::new()
            .route("/v1/ramdisk/sessions", post(claim))
            .route("/v1/ramdisk/work", get(work))
            .route("/v1/ramdisk/steps/{index}", post(report))
            .route("/images/sha256/{hash}", get(move || async move { images.clone() }))
            .with_state(cp.clone());
        let base = serve(router).await;
        let text = format!("bc.server={base} bc.token=rbt_good bc.site={base}");
        let (inventory, _) = InventorySource::simulated(crate::simulate::inventory(
            "gpu-7",
            &"2xH100".parse().expect("a simulated machine"),
        ));
        let config = RamdiskConfig {
            cmdline: Cmdline::parse(&text).expect("parses"),
            disk: disk.clone(),
            config_dir: fixture.0.join("config"),
            inventory,
            poll: Duration::from_millis(1),
            state_dir: Some(fixture.0.join("run")),
        };

        // The process dies after two steps (as a crash would) and is started again in the same boot: it goes on
        // with the session it saved, since the boot credential cannot be claimed twice.
        let first = tokio::spawn(run(config.clone(), std::future::pending()));
        while cp.reports.lock().expect("lock").len() < 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        first.abort();
        let _ = first.await;
        run(config.clone(), std::future::pending()).await.expect("runs to the workflow's end");

        // The restarted process does not know what the first one ran: the step the workflow still shows when it
        // starts (this fake shows each step once more after its report) runs again, and nothing else does.
        let mut reports = cp.reports.lock().expect("lock").clone();
        let indexes: Vec<u32> = reports.iter().map(|(index, _)| *index).collect();
        assert!(indexes.len() <= 6, "at most the step shown across the restart ran twice: {indexes:?}");
        reports.dedup_by_key(|(index, _)| *index);
        let indexes: Vec<u32> = reports.iter().map(|(index, _)| *index).collect();
        assert_eq!(indexes, [0, 1, 2, 3, 4], "each step ran, in order");
        let (_, inspect) = &reports[0];
        assert!(inspect.ok && inspect.message.as_deref() == Some("inspected: 2 GPUs, host gpu-7"), "{inspect:?}");
        let inventory = inspect.inventory.as_ref().expect("the inventory");
        assert!(
            inventory.system.is_some()
                && inventory.gpus.is_some()
                && inventory.nics.is_some()
                && inventory.disks.is_some()
        );
        assert!(reports[1].1.ok && reports[2].1.ok && reports[3].1.ok, "{reports:?}");
        assert_eq!(
            reports[4].1,
            RamdiskReport {
                attempt: 1,
                ok: false,
                message: Some("power-on does not run in the ramdisk".to_owned()),
                inventory: None,
            }
        );
        assert_eq!(&std::fs::read(&disk).expect("read the disk")[..bytes.len()], &bytes[..]);
        let env = std::fs::read_to_string(fixture.0.join("config/bcd.env")).expect("bcd.env");
        assert!(env.contains("BCD_JOIN_TOKEN=jt_1\n") && env.contains("BCD_INSECURE_HTTP=1\n"), "{env}");
        assert!(!fixture.0.join("config/old").exists(), "the wipe emptied the config dir");

        let session = std::fs::metadata(fixture.0.join("run/session.json")).expect("the saved session");
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&session.permissions()) & 0o777, 0o600);
        // Another boot's credential is its own: it claims, and this one was never handed out.
        let refused = RamdiskConfig {
            cmdline: Cmdline::parse(&format!("bc.server={base} bc.token=rbt_used bc.site={base}")).expect("parses"),
            ..config
        };
        let err = run(refused, std::future::pending()).await.expect_err("a used boot token is fatal");
        assert!(err.to_string().contains("boot token was refused"), "{err}");
    }
}
