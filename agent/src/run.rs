//! The agent's life: join once with a join token (or start a session with the saved credential), report the
//! inventory, heartbeat, apply the NodeSpec, and carry out commands in order, acknowledging each.
//!
//! The credential is kept in `<state dir>/credential.json` (mode 0600), so a restarted agent comes back as the
//! same node without the join token. Losing the control plane for a while is normal: the loop keeps trying.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail};
use bc_domain::agent::{Ack, CertificateRequest, CommandKind, Heartbeat, JoinRequest, Session};
use bc_domain::id::NodeId;
use bc_domain::inventory::{NodeInventory, SectionHashes};
use bc_domain::node::NodeSpec;
use serde::{Deserialize, Serialize};

use crate::cdi;
pub use crate::client::{ApiError, Client, ServerTrust, status_of};

/// Where the agent's inventory comes from: the machine (NVML and /sys), or a simulated one that tests and
/// demos may change while the agent runs.
#[derive(Clone)]
pub enum InventorySource {
    Local { hostname: Option<String> },
    Simulated(Arc<Mutex<NodeInventory>>),
}

impl std::fmt::Debug for InventorySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InventorySource::Local { hostname } => f.debug_struct("Local").field("hostname", hostname).finish(),
            InventorySource::Simulated(_) => f.write_str("Simulated"),
        }
    }
}

impl InventorySource {
    /// A simulated machine, and the handle to change it.
    pub fn simulated(document: NodeInventory) -> (Self, Arc<Mutex<NodeInventory>>) {
        let shared = Arc::new(Mutex::new(document));
        (InventorySource::Simulated(shared.clone()), shared)
    }

    /// Each GPU's utilization now: NVML's samples on a real machine, none on a simulated one.
    pub fn utilization(&self) -> Vec<bc_domain::agent::GpuSample> {
        match self {
            InventorySource::Local { .. } => crate::nvml::utilization(),
            InventorySource::Simulated(_) => Vec::new(),
        }
    }

    /// Reads the inventory now.
    pub fn read(&self) -> NodeInventory {
        match self {
            InventorySource::Local { hostname } => {
                let (document, warnings) = crate::nvml::local_inventory(hostname.as_deref());
                for warning in warnings {
                    eprintln!("bcd: {warning}");
                }
                document
            }
            InventorySource::Simulated(shared) => match shared.lock() {
                Ok(document) => document.clone(),
                Err(poisoned) => poisoned.into_inner().clone(),
            },
        }
    }
}

/// How to run the agent.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The control plane's base URL, such as `https://control.example:8443`.
    pub server: String,
    pub trust: ServerTrust,
    /// Used only when the state folder holds no credential yet.
    pub join_token: Option<String>,
    /// Where the credential is kept.
    pub state_dir: PathBuf,
    /// Where CDI spec files for bound reservations are written.
    pub cdi_dir: PathBuf,
    pub inventory: InventorySource,
    /// How often the inventory is read again and reported when it changed, in heartbeats.
    pub inventory_every: u32,
    /// Run as the site agent (`bcd site`): join with role `site`, and run the site's BMC steps.
    pub site: Option<crate::site::SiteConfig>,
    /// Run the node's instances (a `vps-host` pool's node): QEMU virtual machines.
    pub runtime: Option<crate::runtime::RuntimeConfig>,
}

/// The credential file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Saved {
    node_id: NodeId,
    credential: String,
}

fn credential_path(dir: &Path) -> PathBuf {
    dir.join("credential.json")
}

fn load(dir: &Path) -> anyhow::Result<Option<Saved>> {
    match std::fs::read(credential_path(dir)) {
        Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes).context("credential.json is unreadable")?)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err).context("read credential.json"),
    }
}

fn save(dir: &Path, saved: &Saved) -> anyhow::Result<()> {
    write_private(dir, "credential.json", &serde_json::to_vec_pretty(saved)?)
}

/// The node's certificate and its key, as saved in the state folder (`node.crt`, `node.key`).
#[derive(Debug, Clone)]
struct Identity {
    cert_pem: String,
    key_pem: String,
    peer: bc_pki::PeerCertificate,
}

fn load_identity(dir: &Path) -> anyhow::Result<Option<Identity>> {
    let read = |name: &str| match std::fs::read_to_string(dir.join(name)) {
        Ok(text) => Ok(Some(text)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err).with_context(|| format!("read {name}")),
    };
    let (Some(cert_pem), Some(key_pem)) = (read("node.crt")?, read("node.key")?) else { return Ok(None) };
    let peer = bc_pki::PeerCertificate::parse_pem(&cert_pem).context("node.crt is unreadable")?;
    Ok(Some(Identity { cert_pem, key_pem, peer }))
}

/// Saves the key first: a crash between the two leaves a certificate that does not match, which the next
/// start replaces, never a certificate without its key.
fn save_identity(dir: &Path, cert_pem: &str, key_pem: &str) -> anyhow::Result<Identity> {
    let peer = bc_pki::PeerCertificate::parse_pem(cert_pem).context("the certificate the control plane answered")?;
    write_private(dir, "node.key", key_pem.as_bytes())?;
    write_private(dir, "node.crt", cert_pem.as_bytes())?;
    Ok(Identity { cert_pem: cert_pem.to_owned(), key_pem: key_pem.to_owned(), peer })
}

/// Writes `bytes` to `dir/name`, readable by its owner only, through a temporary file and a rename.
fn write_private(dir: &Path, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let path = dir.join(name);
    let temporary = dir.join(format!(".{name}.tmp"));
    {
        use std::io::Write as _;
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&temporary).with_context(|| format!("write {}", temporary.display()))?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&temporary, &path).with_context(|| format!("write {}", path.display()))?;
    Ok(())
}

/// What the agent knows while it runs.
#[derive(Debug)]
struct State {
    client: Client,
    node_id: NodeId,
    session: Session,
    observed_generation: u64,
    spec: NodeSpec,
    /// The hashes of the inventory the control plane holds.
    known: SectionHashes,
}

/// Joins with the token (when no credential is saved) or opens a session with the saved credential.
async fn connect(config: &AgentConfig, client: &Client) -> anyhow::Result<State> {
    if let Some(saved) = load(&config.state_dir)? {
        let mut client = client.with_credential(&saved.credential);
        // The saved certificate, unless it expired (the handshake would fail; the node asks for a new one).
        if client.pins_ca()
            && let Some(identity) = load_identity(&config.state_dir)?
            && identity.peer.not_after > now_ms() / 1000 + 60
        {
            client = client.with_identity(&identity.cert_pem, &identity.key_pem)?;
        }
        match client.open_session().await {
            Ok(session) => {
                let client = rotate(config, client, &saved.node_id).await;
                let client = renew_certificate(config, client, false).await;
                return Ok(fresh(client, saved.node_id, session));
            }
            // The credential was revoked (the node deleted): join again if a token was given.
            Err(err) if status_of(&err) == Some(401) && config.join_token.is_some() => {
                eprintln!("bcd: the saved credential of {} was refused; joining again", saved.node_id);
            }
            Err(err) => return Err(err),
        }
    }
    let Some(token) = &config.join_token else {
        bail!("no credential in {} and no join token to join with", config.state_dir.display());
    };
    let document = config.inventory.read();
    // Through TLS the node makes its key here and sends a request for its certificate with the join.
    let key = if client.pins_ca() { Some(bc_pki::NodeKey::generate(&document.system.hostname)?) } else { None };
    let request = JoinRequest {
        join_token: token.clone(),
        agent_version: crate::VERSION.to_owned(),
        inventory: document.report(&SectionHashes::new()),
        csr: key.as_ref().map(|key| key.csr_pem.clone()),
        role: config.site.as_ref().map(|_| bc_domain::node::Role::Site),
    };
    let joined = client.join(&request).await?;
    save(&config.state_dir, &Saved { node_id: joined.node_id.clone(), credential: joined.credential.clone() })?;
    let mut client = client.with_credential(&joined.credential);
    if let (Some(key), Some(certificate)) = (&key, &joined.certificate) {
        save_identity(&config.state_dir, certificate, &key.key_pem)?;
        client = client.with_identity(certificate, &key.key_pem)?;
    }
    Ok(fresh(client, joined.node_id, joined.session))
}

/// Asks for the node's next certificate when it has none, when a third of its validity is left, or when
/// `force`d, with a new key; saves it and answers a client presenting it. Keeps the current client when that
/// fails (the current certificate keeps working until it expires).
async fn renew_certificate(config: &AgentConfig, client: Client, force: bool) -> Client {
    if !client.pins_ca() {
        return client;
    }
    let renewed = async {
        let current = load_identity(&config.state_dir)?;
        let due = match &current {
            Some(identity) => force || identity.peer.due_for_renewal(now_ms() / 1000),
            None => true,
        };
        if !due {
            return anyhow::Ok(None);
        }
        let hostname = config.inventory.read().system.hostname;
        let key = bc_pki::NodeKey::generate(&hostname)?;
        let issued = client.certificate(&CertificateRequest { csr: key.csr_pem.clone() }).await?;
        save_identity(&config.state_dir, &issued.certificate, &key.key_pem)?;
        Ok(Some(client.with_identity(&issued.certificate, &key.key_pem)?))
    };
    match renewed.await {
        Ok(Some(renewed)) => renewed,
        Ok(None) => client,
        Err(err) => {
            eprintln!("bcd: could not renew the node certificate (keeping the current one): {err:#}");
            client
        }
    }
}

/// Rotates the credential at each start: the new secret is saved before it is used, and the old one keeps
/// working until then, so a failure anywhere leaves a credential that works. Keeps the current client when the
/// rotation fails.
async fn rotate(config: &AgentConfig, client: Client, node_id: &NodeId) -> Client {
    let rotated = async {
        let credential = client.rotate_credential().await?;
        save(&config.state_dir, &Saved { node_id: node_id.clone(), credential: credential.clone() })?;
        anyhow::Ok(client.with_credential(&credential))
    };
    match rotated.await {
        Ok(rotated) => rotated,
        Err(err) => {
            eprintln!("bcd: could not rotate the node credential (keeping the current one): {err:#}");
            client
        }
    }
}

fn fresh(client: Client, node_id: NodeId, session: Session) -> State {
    State {
        client,
        node_id,
        known: session.inventory_hashes.clone(),
        observed_generation: 0,
        spec: NodeSpec::default(),
        session,
    }
}

impl State {
    /// Applies a spec, and reports its generation as observed only once it is applied: the labels are written
    /// to `labels.json` in the state folder (where the host's own tools read them); a MIG layout this agent
    /// cannot make (it never repartitions GPUs) leaves the generation unobserved, so the node shows the spec as
    /// not applied instead of pretending.
    fn apply_spec(&mut self, state_dir: &Path, generation: u64, spec: NodeSpec) {
        if generation <= self.observed_generation && spec == self.spec {
            return;
        }
        if let Some(layout) = &spec.mig_layout {
            eprintln!(
                "bcd: spec generation {generation} asks for MIG layout {layout:?}, which this agent cannot make; \
                 it stays unobserved"
            );
            self.spec = spec;
            return;
        }
        let labels = match serde_json::to_vec_pretty(&spec.labels) {
            Ok(labels) => labels,
            Err(err) => {
                eprintln!("bcd: cannot write the labels of spec generation {generation}: {err}");
                return;
            }
        };
        if let Err(err) = write_private(state_dir, "labels.json", &labels) {
            eprintln!("bcd: cannot write the labels of spec generation {generation}: {err:#}");
            return;
        }
        self.spec = spec;
        self.observed_generation = generation;
    }

    /// Reports the inventory if it changed: only the changed sections, or all of them when the control plane
    /// says it lacks one.
    async fn report_inventory(&mut self, source: &InventorySource) -> anyhow::Result<()> {
        let document = source.read();
        if document.hashes() == self.known {
            return Ok(());
        }
        let accepted = match self.client.report(&document.report(&self.known)).await {
            Err(err) if status_of(&err) == Some(409) => {
                self.client.report(&document.report(&SectionHashes::new())).await?
            }
            other => other?,
        };
        self.known = accepted.hashes;
        Ok(())
    }

    /// Runs the commands deliverable now, in order, acknowledging each; stops at the first that cannot be
    /// acknowledged so that none is overtaken.
    async fn run_commands(&mut self, config: &AgentConfig) -> anyhow::Result<usize> {
        let commands = self.client.commands().await?;
        let count = commands.len();
        for command in commands {
            let outcome = match &command.kind {
                CommandKind::Bind { reservation_id, devices, .. } => {
                    let devices: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
                    cdi::write_spec(&config.cdi_dir, reservation_id.as_str(), &devices)
                        .map(|path| format!("wrote {}", path.display()))
                        .map_err(|err| format!("could not write the CDI spec: {err}"))
                }
                CommandKind::Unbind { reservation_id, .. } => {
                    // An instance on the allocation is stopped and removed before the release is confirmed.
                    let stopped = match &config.runtime {
                        Some(runtime) => crate::runtime::release(runtime, reservation_id)
                            .await
                            .map_err(|err| format!("could not stop the allocation's instances: {err:#}")),
                        None => Ok(0),
                    };
                    stopped.and_then(|_| {
                        cdi::remove_spec(&config.cdi_dir, reservation_id.as_str())
                            .map(|existed| {
                                if existed { "removed the CDI spec" } else { "no CDI spec to remove" }.to_owned()
                            })
                            .map_err(|err| format!("could not remove the CDI spec: {err}"))
                    })
                }
                CommandKind::RefreshInventory => self
                    .report_inventory(&config.inventory)
                    .await
                    .map(|()| "reported".to_owned())
                    .map_err(|e| e.to_string()),
                CommandKind::Probe { .. } => Ok("alive".to_owned()),
            };
            let ack = match outcome {
                Ok(message) => Ack { ok: true, message: Some(message) },
                Err(message) => Ack { ok: false, message: Some(message) },
            };
            self.client.ack(&command, &ack).await?;
        }
        Ok(count)
    }
}

/// How often, in heartbeats, the agent looks at its certificate's expiry.
const CERTIFICATE_CHECK_EVERY: u32 = 20;

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or_default()
}

/// Runs the agent until `shutdown` resolves. Errors talking to the control plane are retried; only a
/// configuration that can never work (no credential and no token, a refused join token) ends it.
pub async fn run(config: AgentConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let client = Client::new(&config.server, &config.trust)?;
    // The site's steps and boot server ask the control plane through the agent's current client, which changes
    // at each connection and renewal.
    let (clients, _) = tokio::sync::watch::channel(None::<Client>);
    // The site agent's own tasks (its steps, its boot server) run until this function returns.
    let mut site_tasks = tokio::task::JoinSet::new();
    if let Some(site) = &config.site {
        site_tasks.spawn(crate::site::serve_steps(clients.subscribe(), site.clone()));
    }
    if let Some(boot) = config.site.as_ref().and_then(|site| site.boot.clone()) {
        let listener = tokio::net::TcpListener::bind(boot.listen)
            .await
            .with_context(|| format!("listen for booting machines on {} (--boot-listen)", boot.listen))?;
        eprintln!("bcd site: boot server on {}, reached as {}", boot.listen, boot.url);
        let server = crate::boot::BootServer::new(boot, clients.subscribe());
        site_tasks.spawn(async move {
            if let Err(err) = crate::boot::serve(listener, server).await {
                eprintln!("bcd site: the boot server stopped: {err}");
            }
        });
    }
    if let Some(runtime) = &config.runtime {
        let source = config.inventory.clone();
        site_tasks.spawn(crate::runtime::serve(clients.subscribe(), runtime.clone(), move || source.read()));
    }
    tokio::pin!(shutdown);
    let mut backoff = Duration::from_millis(200);
    'connect: loop {
        let mut state = tokio::select! {
            () = &mut shutdown => return Ok(()),
            connected = connect(&config, &client) => match connected {
                Ok(state) => state,
                Err(err) if matches!(status_of(&err), Some(400 | 401 | 409)) => return Err(err),
                Err(err) if status_of(&err).is_none() && load(&config.state_dir)?.is_none() && config.join_token.is_none() => return Err(err),
                Err(err) => {
                    eprintln!("bcd: cannot reach the control plane yet: {err:#}");
                    tokio::select! {
                        () = &mut shutdown => return Ok(()),
                        () = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    continue;
                }
            },
        };
        backoff = Duration::from_millis(200);
        clients.send_replace(Some(state.client.clone()));
        eprintln!("bcd: node {} connected, session {}", state.node_id, state.session.session_id);
        let (generation, spec) = (state.session.generation, state.session.spec.clone());
        state.apply_spec(&config.state_dir, generation, spec);
        if let Err(err) = state.report_inventory(&config.inventory).await {
            eprintln!("bcd: inventory report failed: {err:#}");
        }
        let every = Duration::from_millis(state.session.heartbeat_ms.max(50));
        let mut beats: u32 = 0;
        loop {
            let beat = Heartbeat {
                session_id: state.session.session_id.clone(),
                observed_generation: state.observed_generation,
                clock_ms: now_ms(),
                gpu_utilization: config.inventory.utilization(),
            };
            match state.client.heartbeat(&beat).await {
                Ok(reply) => {
                    if let Some(spec) = reply.spec {
                        state.apply_spec(&config.state_dir, reply.generation, spec);
                    }
                    if reply.commands_waiting
                        && let Err(err) = state.run_commands(&config).await
                    {
                        eprintln!("bcd: commands failed: {err:#}");
                    }
                }
                // The session was replaced or the credential revoked: connect again.
                Err(err) if matches!(status_of(&err), Some(401 | 404 | 409)) => {
                    eprintln!("bcd: {err:#}; connecting again");
                    continue 'connect;
                }
                Err(err) => eprintln!("bcd: heartbeat failed: {err:#}"),
            }
            beats = beats.wrapping_add(1);
            if beats.is_multiple_of(CERTIFICATE_CHECK_EVERY) {
                state.client = renew_certificate(&config, state.client.clone(), false).await;
                clients.send_replace(Some(state.client.clone()));
            }
            if config.inventory_every > 0
                && beats.is_multiple_of(config.inventory_every)
                && let Err(err) = state.report_inventory(&config.inventory).await
            {
                eprintln!("bcd: inventory report failed: {err:#}");
            }
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                () = tokio::time::sleep(every) => {}
            }
        }
    }
}

/// The node id the saved credential belongs to, if the agent joined already.
pub fn saved_node(state_dir: &Path) -> anyhow::Result<Option<NodeId>> {
    Ok(load(state_dir)?.map(|saved| saved.node_id))
}
