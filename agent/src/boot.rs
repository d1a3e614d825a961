//! The site agent's boot server (`bcd site --boot-listen`): iPXE scripts for the site's machines that boot
//! from the network, the ramdisk's kernel and initramfs, the CA the agent trusts, and images by hash from a
//! content-addressed cache that is filled from the control plane and never keeps a corrupted image.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bc_domain::agent::BootAnswer;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::watch;

use crate::client::{Client, ServerTrust, status_of};

/// How the boot server is set up.
#[derive(Debug, Clone)]
pub struct BootConfig {
    /// The address the server listens on, such as `0.0.0.0:8089`.
    pub listen: SocketAddr,
    /// How the site's machines reach this server, such as `http://10.0.0.2:8089`.
    pub url: String,
    /// The ramdisk's kernel, served at `/boot/ramdisk/kernel`.
    pub kernel: Option<PathBuf>,
    /// The ramdisk's initramfs, served at `/boot/ramdisk/initrd`.
    pub initrd: Option<PathBuf>,
    /// The image cache: an image is kept at `<cache_dir>/sha256/<hex>`.
    pub cache_dir: PathBuf,
}

/// The boot server's state: its settings, the site agent's current client of the control plane (none until
/// the agent has connected), and one lock per image being downloaded.
#[derive(Clone)]
pub struct BootServer {
    inner: Arc<Inner>,
}

struct Inner {
    config: BootConfig,
    client: watch::Receiver<Option<Client>>,
    downloads: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl BootServer {
    /// A server that asks the control plane through whatever client `client` holds at each request.
    pub fn new(config: BootConfig, client: watch::Receiver<Option<Client>>) -> Self {
        BootServer { inner: Arc::new(Inner { config, client, downloads: Default::default() }) }
    }

    /// The server's routes.
    pub fn router(self) -> Router {
        Router::new()
            .route("/boot/ipxe", get(ipxe))
            .route("/boot/ramdisk/kernel", get(kernel))
            .route("/boot/ramdisk/initrd", get(initrd))
            .route("/boot/ca.pem", get(ca_pem))
            .route("/images/sha256/{hex}", get(image))
            .with_state(self)
    }

    fn client(&self) -> Result<Client, Failure> {
        self.inner.client.borrow().clone().ok_or_else(|| {
            Failure(StatusCode::SERVICE_UNAVAILABLE, "the site agent is not connected to the control plane yet".into())
        })
    }

    /// The per-hash lock that makes concurrent requests for one image download it once.
    fn download_lock(&self, hex: &str) -> DownloadLock {
        let mut downloads = self.inner.downloads.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let lock = downloads.entry(hex.to_owned()).or_default().clone();
        DownloadLock { server: self.clone(), hex: hex.to_owned(), lock }
    }
}

/// A share of an image's download lock; the last share forgets the lock.
struct DownloadLock {
    server: BootServer,
    hex: String,
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for DownloadLock {
    fn drop(&mut self) {
        // The map, this share, and each other share and guard count; new shares are only made under the map's
        // lock, so the count cannot grow meanwhile.
        let mut downloads = self.server.inner.downloads.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if Arc::strong_count(&self.lock) == 2 {
            downloads.remove(&self.hex);
        }
    }
}

/// Serves the boot path on `listener` until the task is dropped or aborted. A client that never finishes a
/// request's head is cut off, as on the API.
pub async fn serve(listener: tokio::net::TcpListener, server: BootServer) -> std::io::Result<()> {
    let listener = bcx::tls::PlainListener::new(listener);
    bcx::tls::serve_http(listener, server.router(), bcx::tls::REQUEST_HEAD_TIMEOUT, std::future::pending()).await
}

/// An answer other than success: a status and a one-line reason, sent as plain text.
#[derive(Debug)]
struct Failure(StatusCode, String);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, format!("{}\n", self.1)).into_response()
    }
}

/// One line of an error and its causes.
fn one_line(err: &anyhow::Error) -> String {
    format!("{err:#}").replace('\n', " ")
}

/// Leaves only printable characters, so that what a request sent cannot start a line of an iPXE script.
fn printable(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).collect()
}

#[derive(Debug, Deserialize)]
struct BootQuery {
    mac: Option<String>,
    uuid: Option<String>,
}

/// `GET /boot/ipxe?mac=&uuid=`: the script that boots the machine into the ramdisk of its workflow, or from
/// its own disk.
async fn ipxe(State(server): State<BootServer>, Query(query): Query<BootQuery>) -> Result<Response, Failure> {
    // iPXE sends an empty value for a setting it does not have.
    let mac = query.mac.filter(|mac| !mac.is_empty());
    let uuid = query.uuid.filter(|uuid| !uuid.is_empty());
    let Some(machine) = mac.as_deref().or(uuid.as_deref()).map(printable) else {
        return Err(Failure(StatusCode::BAD_REQUEST, "give the machine's mac or uuid".into()));
    };
    let client = server.client()?;
    let answer = client.site_boot(mac.as_deref(), uuid.as_deref()).await.map_err(|err| {
        eprintln!("bcd site: boot {machine}: the control plane did not answer: {}", one_line(&err));
        Failure(StatusCode::BAD_GATEWAY, format!("the control plane did not answer: {}", one_line(&err)))
    })?;
    let ca_pem = match client.trust() {
        ServerTrust::PinnedCa(pem) => Some(pem.as_str()),
        ServerTrust::InsecureHttp => None,
    };
    let site = Site { url: &server.inner.config.url, server: client.base(), ca_pem };
    let script = match boot_script(&machine, &answer, &site) {
        Boot::Ramdisk { script, workflow } => {
            eprintln!("bcd site: boot {machine}: ramdisk for {workflow}");
            script
        }
        Boot::LocalDisk { script, reason } => {
            eprintln!("bcd site: boot {machine}: local disk ({reason})");
            script
        }
    };
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8")),
        // The script holds a single-use credential.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
    ];
    Ok((headers, script).into_response())
}

/// Where the script sends the machine.
struct Site<'a> {
    /// This boot server, as the machines reach it.
    url: &'a str,
    /// The control plane's base URL.
    server: &'a str,
    /// The CA the agent trusts the control plane with, if it talks TLS.
    ca_pem: Option<&'a str>,
}

/// The iPXE script for a boot answer.
enum Boot {
    Ramdisk { script: String, workflow: String },
    LocalDisk { script: String, reason: String },
}

fn boot_script(machine: &str, answer: &BootAnswer, site: &Site<'_>) -> Boot {
    let node = answer.node_id.as_ref().map(ToString::to_string);
    let (workflow, token) = match (&answer.workflow_id, &answer.boot_token, &node) {
        (Some(workflow), Some(token), _) => (workflow.to_string(), token),
        (Some(workflow), None, Some(node)) => {
            return local_disk(format!("{node}: workflow {workflow} came without a boot token"));
        }
        (_, _, Some(node)) => return local_disk(format!("{node}: no workflow to boot for")),
        (_, _, None) => return local_disk(format!("{machine}: not a machine of this site")),
    };
    let url = site.url.trim_end_matches('/');
    let ca = site.ca_pem.map(|pem| format!(" bc.ca_sha256={}", hex::encode(Sha256::digest(pem.as_bytes()))));
    let script = format!(
        "#!ipxe\n\
         # {node}: workflow {workflow}\n\
         kernel {url}/boot/ramdisk/kernel initrd=initrd bc.server={server} bc.site={url} bc.token={token}{ca} \
         console=ttyS0\n\
         initrd --name initrd {url}/boot/ramdisk/initrd\n\
         boot\n",
        node = node.as_deref().unwrap_or(machine),
        server = site.server,
        ca = ca.unwrap_or_default(),
    );
    Boot::Ramdisk { script, workflow }
}

fn local_disk(reason: String) -> Boot {
    Boot::LocalDisk { script: format!("#!ipxe\n# {reason}\nexit\n"), reason }
}

/// `GET /boot/ramdisk/kernel`.
async fn kernel(State(server): State<BootServer>) -> Result<Response, Failure> {
    ramdisk_file(server.inner.config.kernel.as_deref(), "kernel", "--ramdisk-kernel").await
}

/// `GET /boot/ramdisk/initrd`.
async fn initrd(State(server): State<BootServer>) -> Result<Response, Failure> {
    ramdisk_file(server.inner.config.initrd.as_deref(), "initramfs", "--ramdisk-initrd").await
}

async fn ramdisk_file(path: Option<&Path>, what: &str, flag: &str) -> Result<Response, Failure> {
    let Some(path) = path else {
        return Err(Failure(StatusCode::NOT_FOUND, format!("this site agent serves no ramdisk {what} ({flag})")));
    };
    stream_file(path).await.map_err(|err| {
        eprintln!("bcd site: cannot serve the ramdisk {what} {}: {err}", path.display());
        Failure(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot read the ramdisk {what}"))
    })
}

/// `GET /boot/ca.pem`: the CA the agent trusts the control plane with.
async fn ca_pem(State(server): State<BootServer>) -> Result<Response, Failure> {
    match server.client()?.trust() {
        ServerTrust::PinnedCa(pem) => {
            Ok(([(header::CONTENT_TYPE, HeaderValue::from_static("application/x-pem-file"))], pem.clone())
                .into_response())
        }
        ServerTrust::InsecureHttp => {
            Err(Failure(StatusCode::NOT_FOUND, "this site agent talks plain HTTP to the control plane: no CA".into()))
        }
    }
}

/// Whether `hex` names a SHA-256 the way the cache spells it: 64 lower-case hex digits.
fn is_sha256_hex(hex: &str) -> bool {
    hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// `GET /images/sha256/{hex}`: the image from the cache, downloaded from the control plane first when the
/// cache lacks it.
async fn image(State(server): State<BootServer>, UrlPath(hex): UrlPath<String>) -> Result<Response, Failure> {
    if !is_sha256_hex(&hex) {
        return Err(Failure(StatusCode::BAD_REQUEST, "an image is named by 64 lower-case hex digits".into()));
    }
    let dir = server.inner.config.cache_dir.join("sha256");
    let path = dir.join(&hex);
    if let Ok(response) = stream_file(&path).await {
        return Ok(response);
    }
    let lock = server.download_lock(&hex);
    let guard = lock.lock.clone().lock_owned().await;
    // Another request may have downloaded it while this one waited.
    if let Ok(response) = stream_file(&path).await {
        return Ok(response);
    }
    let client = server.client()?;
    // The download runs on its own task, so that a requester that goes away leaves no half-written file; the
    // lock is held until it ends.
    let task = tokio::spawn({
        let (hex, dir) = (hex.clone(), dir.clone());
        async move {
            let downloaded = download(&client, &hex, &dir).await;
            drop(guard);
            downloaded
        }
    });
    match task.await {
        Ok(Ok(())) => stream_file(&path)
            .await
            .map_err(|err| Failure(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot read the cached image: {err}"))),
        Ok(Err(failure)) => Err(failure),
        Err(err) => Err(Failure(StatusCode::INTERNAL_SERVER_ERROR, format!("the download failed: {err}"))),
    }
}

/// Downloads the image `hex` into `dir/<hex>` through a temporary file, hashing it on the way; renames it into
/// place only if its SHA-256 is `hex`.
async fn download(client: &Client, hex: &str, dir: &Path) -> Result<(), Failure> {
    let mut response = client.site_image(hex).await.map_err(|err| match status_of(&err) {
        Some(404) => Failure(StatusCode::NOT_FOUND, format!("the control plane has no image {hex}")),
        // The control plane refused the site agent: the ramdisk asking again will not change that.
        Some(status) if status < 500 => {
            eprintln!("bcd site: image {hex}: the control plane refused it: {}", one_line(&err));
            Failure(StatusCode::BAD_GATEWAY, format!("the control plane refused it: {}", one_line(&err)))
        }
        // Unreachable or failing for now (a restart): the machine's ramdisk asks again.
        _ => {
            eprintln!("bcd site: image {hex}: the control plane did not answer: {}", one_line(&err));
            Failure(StatusCode::SERVICE_UNAVAILABLE, format!("the control plane did not answer: {}", one_line(&err)))
        }
    })?;
    let cache_failed = |err: std::io::Error| {
        eprintln!("bcd site: image {hex}: cannot write the image cache {}: {err}", dir.display());
        Failure(StatusCode::INTERNAL_SERVER_ERROR, "cannot write the image cache".into())
    };
    tokio::fs::create_dir_all(dir).await.map_err(cache_failed)?;
    let partial = Partial(dir.join(format!(".{hex}.part")));
    let mut file = tokio::fs::File::create(&partial.0).await.map_err(cache_failed)?;
    let mut hasher = Sha256::new();
    loop {
        let chunk = response.chunk().await.map_err(|err| {
            eprintln!("bcd site: image {hex}: the download broke off: {err}");
            Failure(StatusCode::SERVICE_UNAVAILABLE, format!("the download from the control plane broke off: {err}"))
        })?;
        let Some(chunk) = chunk else { break };
        hasher.update(&chunk);
        file.write_all(&chunk).await.map_err(cache_failed)?;
    }
    file.sync_all().await.map_err(cache_failed)?;
    drop(file);
    let actual = hex::encode(hasher.finalize());
    if actual != hex {
        eprintln!("bcd site: image {hex}: arrived with SHA-256 {actual}; not kept");
        return Err(Failure(
            StatusCode::BAD_GATEWAY,
            format!("the control plane sent an image with SHA-256 {actual} for {hex}; not served, not kept"),
        ));
    }
    tokio::fs::rename(&partial.0, dir.join(hex)).await.map_err(cache_failed)?;
    Ok(())
}

/// A temporary file removed when dropped, unless it was renamed into place.
struct Partial(PathBuf);

impl Drop for Partial {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The file as a streamed answer with its length.
async fn stream_file(path: &Path) -> std::io::Result<Response> {
    let mut file = tokio::fs::File::open(path).await?;
    let length = file.metadata().await?.len();
    let (sender, receiver) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(4);
    tokio::spawn(async move {
        let mut buffer = vec![0; 256 * 1024];
        loop {
            match file.read(&mut buffer).await {
                Ok(0) => break,
                Ok(n) => {
                    // A requester that went away stops the reading.
                    if sender.send(Ok(Bytes::copy_from_slice(&buffer[..n]))).await.is_err() {
                        break;
                    }
                }
                Err(err) => {
                    let _ = sender.send(Err(err)).await;
                    break;
                }
            }
        }
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(receiver));
    Ok((
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream")),
            (header::CONTENT_LENGTH, HeaderValue::from(length)),
        ],
        body,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::http::HeaderMap;
    use bc_domain::id::{NodeId, WorkflowId};

    use super::*;
    use crate::fixture::Fixture;

    const WITH_WORKFLOW: &str = "52:54:00:00:00:01";
    const WITHOUT_WORKFLOW: &str = "52:54:00:00:00:02";
    const UUID_ONLY: &str = "4c4c4544-0042-3510-8052-b4c04f4e3332";
    const CREDENTIAL: &str = "cred_site_test";
    const BOOT_TOKEN: &str = "rbt_single_use";

    /// An image of a few read chunks, so that both the download and the serving go chunk by chunk.
    fn good_image() -> Vec<u8> {
        (0..600_000u32).map(|i| (i * 31 % 251) as u8).collect()
    }

    fn sha256_hex(bytes: &[u8]) -> String {
        hex::encode(Sha256::digest(bytes))
    }

    /// The hash the fake control plane answers wrong bytes for.
    fn corrupted_hash() -> String {
        sha256_hex(b"the image the control plane should have sent")
    }

    /// A fake control plane answering the site agent's boot and image calls, counting the image downloads.
    #[derive(Clone)]
    struct Upstream {
        node: NodeId,
        workflow: WorkflowId,
        image_hits: Arc<AtomicUsize>,
    }

    fn not_found() -> Response {
        let body = serde_json::json!({ "error": { "code": "NOT_FOUND", "message": "no such thing" } });
        (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
    }

    fn authorized(headers: &HeaderMap) -> bool {
        headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {CREDENTIAL}"))
    }

    async fn upstream_boot(
        State(upstream): State<Upstream>,
        headers: HeaderMap,
        Query(query): Query<HashMap<String, String>>,
    ) -> Response {
        if !authorized(&headers) {
            return StatusCode::UNAUTHORIZED.into_response();
        }
        let mut answer = BootAnswer { node_id: None, workflow_id: None, boot_token: None };
        match (query.get("mac").map(String::as_str), query.get("uuid").map(String::as_str)) {
            (Some(WITH_WORKFLOW), _) => {
                answer.node_id = Some(upstream.node.clone());
                answer.workflow_id = Some(upstream.workflow.clone());
                answer.boot_token = Some(BOOT_TOKEN.to_owned());
            }
            (Some(WITHOUT_WORKFLOW), _) | (None, Some(UUID_ONLY)) => answer.node_id = Some(upstream.node.clone()),
            _ => {}
        }
        axum::Json(answer).into_response()
    }

    async fn upstream_image(
        State(upstream): State<Upstream>,
        headers: HeaderMap,
        UrlPath(sha): UrlPath<String>,
    ) -> Response {
        if !authorized(&headers) {
            return StatusCode::UNAUTHORIZED.into_response();
        }
        upstream.image_hits.fetch_add(1, Ordering::SeqCst);
        if sha == sha256_hex(&good_image()) {
            good_image().into_response()
        } else if sha == corrupted_hash() {
            b"bytes that went wrong on the way".to_vec().into_response()
        } else {
            not_found()
        }
    }

    /// A running fake control plane and a boot server in front of it.
    struct Harness {
        upstream: Upstream,
        upstream_url: String,
        boot_url: String,
        http: reqwest::Client,
        clients: watch::Sender<Option<Client>>,
    }

    async fn listen() -> (tokio::net::TcpListener, String) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("local address"));
        (listener, url)
    }

    /// Starts both, the boot server with `kernel` and a cache in `dir`; `connected` says whether the agent has
    /// a client yet.
    async fn start(dir: &Fixture, kernel: Option<PathBuf>, connected: bool) -> Harness {
        let upstream =
            Upstream { node: NodeId::generate(), workflow: WorkflowId::generate(), image_hits: Arc::default() };
        let router = Router::new()
            .route("/v1/agent/site/boot", get(upstream_boot))
            .route("/v1/agent/site/images/{sha}", get(upstream_image))
            .with_state(upstream.clone());
        let (listener, upstream_url) = listen().await;
        tokio::spawn(async move { axum::serve(listener, router).await });

        let client =
            Client::new(&upstream_url, &ServerTrust::InsecureHttp).expect("client").with_credential(CREDENTIAL);
        let (sender, receiver) = watch::channel(connected.then_some(client));
        let (listener, boot_url) = listen().await;
        let config = BootConfig {
            listen: listener.local_addr().expect("local address"),
            url: boot_url.clone(),
            kernel,
            initrd: None,
            cache_dir: dir.0.join("images"),
        };
        tokio::spawn(serve(listener, BootServer::new(config, receiver)));
        let tls = bc_pki::tls::plain_http_client_config().expect("plain HTTP");
        let http = reqwest::Client::builder().tls_backend_preconfigured(tls).build().expect("HTTP client");
        Harness { upstream, upstream_url, boot_url, http, clients: sender }
    }

    impl Harness {
        async fn get(&self, path: &str) -> (StatusCode, HeaderMap, Vec<u8>) {
            let response = self.http.get(format!("{}{path}", self.boot_url)).send().await.expect("request");
            let (status, headers) = (response.status(), response.headers().clone());
            (status, headers, response.bytes().await.expect("body").to_vec())
        }

        async fn text(&self, path: &str) -> (StatusCode, String) {
            let (status, _, body) = self.get(path).await;
            (status, String::from_utf8(body).expect("text"))
        }

        fn image_hits(&self) -> usize {
            self.upstream.image_hits.load(Ordering::SeqCst)
        }
    }

    fn cached_files(dir: &Fixture) -> Vec<String> {
        match std::fs::read_dir(dir.0.join("images/sha256")) {
            Ok(entries) => entries.map(|e| e.expect("entry").file_name().to_string_lossy().into_owned()).collect(),
            Err(_) => Vec::new(),
        }
    }

    #[tokio::test]
    async fn a_machine_with_a_workflow_is_sent_into_the_ramdisk() {
        let dir = Fixture::new("boot-ipxe-ramdisk");
        let h = start(&dir, None, true).await;
        let (status, headers, body) = h.get(&format!("/boot/ipxe?mac={WITH_WORKFLOW}&uuid=")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers[header::CACHE_CONTROL], "no-store");
        assert!(headers[header::CONTENT_TYPE].to_str().expect("type").starts_with("text/plain"));
        let script = String::from_utf8(body).expect("text");
        let boot = &h.boot_url;
        assert_eq!(
            script,
            format!(
                "#!ipxe\n# {}: workflow {}\n\
                 kernel {boot}/boot/ramdisk/kernel initrd=initrd bc.server={} bc.site={boot} bc.token={BOOT_TOKEN} \
                 console=ttyS0\n\
                 initrd --name initrd {boot}/boot/ramdisk/initrd\nboot\n",
                h.upstream.node, h.upstream.workflow, h.upstream_url
            )
        );
    }

    #[test]
    fn a_pinned_ca_is_named_by_its_hash_on_the_kernel_line() {
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let answer = BootAnswer {
            node_id: Some(NodeId::generate()),
            workflow_id: Some(WorkflowId::generate()),
            boot_token: Some(BOOT_TOKEN.to_owned()),
        };
        let site = Site { url: "http://10.0.0.2:8089", server: "https://cp:8443", ca_pem: Some(pem) };
        let Boot::Ramdisk { script, .. } = boot_script(WITH_WORKFLOW, &answer, &site) else {
            panic!("a machine with a workflow boots the ramdisk")
        };
        assert!(script.contains(&format!(" bc.ca_sha256={} console=ttyS0\n", sha256_hex(pem.as_bytes()))), "{script}");
    }

    #[tokio::test]
    async fn a_machine_without_a_workflow_boots_from_its_disk() {
        let dir = Fixture::new("boot-ipxe-local");
        let h = start(&dir, None, true).await;
        for query in [format!("mac={WITHOUT_WORKFLOW}"), format!("uuid={UUID_ONLY}"), "mac=52:54:00:00:00:99".into()] {
            let (status, script) = h.text(&format!("/boot/ipxe?{query}")).await;
            assert_eq!(status, StatusCode::OK, "{query}");
            assert!(script.starts_with("#!ipxe\n# ") && script.ends_with("\nexit\n"), "{query}: {script}");
            assert!(!script.contains("kernel"), "{query}: {script}");
        }
        let (_, script) = h.text(&format!("/boot/ipxe?mac={WITHOUT_WORKFLOW}")).await;
        assert!(script.contains(&format!("# {}: no workflow", h.upstream.node)), "{script}");
    }

    #[tokio::test]
    async fn a_script_needs_the_mac_or_the_uuid() {
        let dir = Fixture::new("boot-ipxe-400");
        let h = start(&dir, None, true).await;
        assert_eq!(h.text("/boot/ipxe").await.0, StatusCode::BAD_REQUEST);
        assert_eq!(h.text("/boot/ipxe?mac=&uuid=").await.0, StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn nothing_is_asked_before_the_agent_is_connected() {
        let dir = Fixture::new("boot-unconnected");
        let h = start(&dir, None, false).await;
        assert_eq!(h.text(&format!("/boot/ipxe?mac={WITH_WORKFLOW}")).await.0, StatusCode::SERVICE_UNAVAILABLE);
        let hash = sha256_hex(&good_image());
        assert_eq!(h.text(&format!("/images/sha256/{hash}")).await.0, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(h.image_hits(), 0);
    }

    #[tokio::test]
    async fn a_refusal_of_the_control_plane_is_a_bad_gateway() {
        let dir = Fixture::new("boot-refused");
        let h = start(&dir, None, true).await;
        // The agent's next client, as after a rotation, with a credential the control plane refuses.
        let refused = Client::new(&h.upstream_url, &ServerTrust::InsecureHttp).expect("client").with_credential("x");
        h.clients.send_replace(Some(refused));
        let (status, reason) = h.text(&format!("/boot/ipxe?mac={WITH_WORKFLOW}")).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY);
        assert_eq!(reason.lines().count(), 1, "{reason}");
        assert_eq!(h.text(&format!("/images/sha256/{}", sha256_hex(&good_image()))).await.0, StatusCode::BAD_GATEWAY);
    }

    #[tokio::test]
    async fn an_unreachable_control_plane_is_unavailable_for_now() {
        let dir = Fixture::new("boot-unreachable");
        let h = start(&dir, None, true).await;
        let gone = Client::new("http://127.0.0.1:1", &ServerTrust::InsecureHttp).expect("client").with_credential("x");
        h.clients.send_replace(Some(gone));
        // The ramdisk asks again for an image while the control plane restarts.
        let (status, reason) = h.text(&format!("/images/sha256/{}", sha256_hex(&good_image()))).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{reason}");
        assert!(reason.contains("did not answer"), "{reason}");
        assert_eq!(cached_files(&dir), Vec::<String>::new());
    }

    #[tokio::test]
    async fn an_image_is_downloaded_once_and_then_served_from_the_cache() {
        let dir = Fixture::new("boot-image-cache");
        let h = start(&dir, None, true).await;
        let hash = sha256_hex(&good_image());
        for _ in 0..2 {
            let (status, headers, body) = h.get(&format!("/images/sha256/{hash}")).await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(headers[header::CONTENT_LENGTH], good_image().len().to_string().as_str());
            assert!(body == good_image(), "the image's bytes");
        }
        assert_eq!(h.image_hits(), 1);
        assert_eq!(cached_files(&dir), vec![hash]);
    }

    #[tokio::test]
    async fn concurrent_requests_download_an_image_once() {
        let dir = Fixture::new("boot-image-concurrent");
        let h = start(&dir, None, true).await;
        let path = format!("/images/sha256/{}", sha256_hex(&good_image()));
        let (a, b, c) = tokio::join!(h.get(&path), h.get(&path), h.get(&path));
        for (status, _, body) in [a, b, c] {
            assert_eq!(status, StatusCode::OK);
            assert!(body == good_image(), "the image's bytes");
        }
        assert_eq!(h.image_hits(), 1);
    }

    #[tokio::test]
    async fn a_corrupted_image_is_neither_served_nor_kept() {
        let dir = Fixture::new("boot-image-corrupted");
        let h = start(&dir, None, true).await;
        let hash = corrupted_hash();
        let (status, reason) = h.text(&format!("/images/sha256/{hash}")).await;
        assert_eq!(status, StatusCode::BAD_GATEWAY);
        let actual = sha256_hex(b"bytes that went wrong on the way");
        assert!(reason.contains(&hash) && reason.contains(&actual), "{reason}");
        assert_eq!(cached_files(&dir), Vec::<String>::new());
        // Nothing was kept, so the next request asks again.
        assert_eq!(h.text(&format!("/images/sha256/{hash}")).await.0, StatusCode::BAD_GATEWAY);
        assert_eq!(h.image_hits(), 2);
    }

    #[tokio::test]
    async fn images_are_named_by_lower_case_sha256_hex() {
        let dir = Fixture::new("boot-image-names");
        let h = start(&dir, None, true).await;
        let upper = sha256_hex(&good_image()).to_uppercase();
        for name in [upper.as_str(), "abc", "..%2F..%2Fetc%2Fpasswd", &"g".repeat(64)] {
            assert_eq!(h.text(&format!("/images/sha256/{name}")).await.0, StatusCode::BAD_REQUEST, "{name}");
        }
        assert_eq!(h.text(&format!("/images/sha256/{}", "0".repeat(64))).await.0, StatusCode::NOT_FOUND);
        assert_eq!(h.image_hits(), 1);
    }

    #[tokio::test]
    async fn the_ramdisk_files_are_served_when_configured() {
        let dir = Fixture::new("boot-ramdisk-files");
        dir.file("vmlinuz", "a kernel");
        let h = start(&dir, Some(dir.0.join("vmlinuz")), true).await;
        assert_eq!(h.text("/boot/ramdisk/kernel").await, (StatusCode::OK, "a kernel".to_owned()));
        assert_eq!(h.text("/boot/ramdisk/initrd").await.0, StatusCode::NOT_FOUND);
        // Plain HTTP to the control plane: there is no CA to hand out.
        assert_eq!(h.text("/boot/ca.pem").await.0, StatusCode::NOT_FOUND);
    }
}
