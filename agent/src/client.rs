//! The agent's client of the control plane: how it is trusted (a pinned CA, or plain HTTP where asked), the
//! calls of the agent protocol, and the error answers they turn into. `bcd run`, `bcd site` (its boot server
//! too) and `bcd ramdisk` speak through it.

use std::time::Duration;

use anyhow::{Context as _, bail};
use bc_domain::agent::{
    Ack, AgentCommand, BootAnswer, CertificateRequest, Commands, Heartbeat, HeartbeatReply, InventoryAccepted,
    JoinRequest, Joined, NodeCertificate, Session, SessionRequest,
};
use serde::{Deserialize, Serialize};

/// How the agent trusts the control plane.
#[derive(Debug, Clone)]
pub enum ServerTrust {
    /// HTTPS, trusting only this CA certificate (PEM): the `ca.crt` of the control plane's PKI bundle. The
    /// system's roots are not used, so nothing else can pose as the control plane.
    PinnedCa(String),
    /// Plain HTTP (`--insecure-http`): join tokens and credentials cross the network in the clear.
    InsecureHttp,
}

/// An error answer of the control plane.
#[derive(Debug, thiserror::Error)]
#[error("{status}: {code}: {message}")]
pub struct ApiError {
    pub status: u16,
    pub code: String,
    pub message: String,
}

/// The agent's client of the control plane: the API's typed client ([`bc_client::Client`]) with the agent
/// protocol's calls, its errors turned into [`ApiError`]s.
#[derive(Debug, Clone)]
pub struct Client {
    api: bc_client::Client,
    trust: ServerTrust,
}

impl Client {
    pub fn new(base: &str, trust: &ServerTrust) -> anyhow::Result<Client> {
        let base = base.trim_end_matches('/');
        let api = match trust {
            ServerTrust::PinnedCa(ca) => {
                if !base.starts_with("https://") {
                    bail!("the server {base:?} is not https://: a pinned CA needs TLS (or run with --insecure-http)");
                }
                bc_client::Client::new(base, None, Some(ca)).context("the pinned CA")?
            }
            ServerTrust::InsecureHttp => {
                if !base.starts_with("http://") {
                    bail!("--insecure-http talks plain HTTP, but the server {base:?} is not http://");
                }
                bc_client::Client::new(base, None, None)?
            }
        };
        Ok(Client { api, trust: trust.clone() })
    }

    /// The same client presenting the node's certificate (chain and key, PEM) to the control plane.
    pub fn with_identity(&self, cert_pem: &str, key_pem: &str) -> anyhow::Result<Client> {
        let api = self.api.with_identity(cert_pem, key_pem).context("the node certificate")?;
        Ok(Client { api, ..self.clone() })
    }

    /// Whether the control plane is reached through TLS with a pinned CA (and so signs node certificates).
    pub(crate) fn pins_ca(&self) -> bool {
        matches!(self.trust, ServerTrust::PinnedCa(_))
    }

    /// The same client speaking with a node credential.
    pub fn with_credential(&self, credential: &str) -> Client {
        Client { api: self.api.with_token(credential), ..self.clone() }
    }

    /// The control plane's base URL.
    pub fn base(&self) -> &str {
        self.api.base()
    }

    /// How the control plane is trusted.
    pub fn trust(&self) -> &ServerTrust {
        &self.trust
    }

    /// A GET whose answer is read as a stream by the caller (image bytes): an error answer becomes an
    /// [`ApiError`].
    pub(crate) async fn get_raw(&self, path: &str) -> anyhow::Result<reqwest::Response> {
        self.api.get_stream(path, Duration::from_secs(3600)).await.map_err(|err| agent_error(err, path))
    }

    pub(crate) async fn call<B: Serialize, R: for<'de> Deserialize<'de>>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&B>,
    ) -> anyhow::Result<R> {
        self.api.call(method, path, body).await.map_err(|err| agent_error(err, path))
    }

    pub async fn join(&self, request: &JoinRequest) -> anyhow::Result<Joined> {
        self.call(reqwest::Method::POST, "/v1/agent/join", Some(request)).await
    }

    pub async fn open_session(&self) -> anyhow::Result<Session> {
        let body = SessionRequest { agent_version: crate::VERSION.to_owned() };
        self.call(reqwest::Method::POST, "/v1/agent/sessions", Some(&body)).await
    }

    /// A new credential for this node; the current one works until the new one is first used.
    pub async fn rotate_credential(&self) -> anyhow::Result<String> {
        let answer: serde_json::Value = self.call::<(), _>(reqwest::Method::POST, "/v1/agent/credential", None).await?;
        answer["credential"].as_str().map(str::to_owned).context("the rotation answered no credential")
    }

    pub async fn certificate(&self, request: &CertificateRequest) -> anyhow::Result<NodeCertificate> {
        self.call(reqwest::Method::POST, "/v1/agent/certificate", Some(request)).await
    }

    pub async fn heartbeat(&self, beat: &Heartbeat) -> anyhow::Result<HeartbeatReply> {
        self.call(reqwest::Method::POST, "/v1/agent/heartbeat", Some(beat)).await
    }

    pub async fn report(&self, report: &bc_domain::inventory::InventoryReport) -> anyhow::Result<InventoryAccepted> {
        self.call(reqwest::Method::POST, "/v1/agent/inventory", Some(report)).await
    }

    pub async fn commands(&self) -> anyhow::Result<Vec<AgentCommand>> {
        let commands: Commands = self.call::<(), _>(reqwest::Method::GET, "/v1/agent/commands", None).await?;
        Ok(commands.commands)
    }

    /// The instances this node is to run.
    pub async fn instances(&self) -> anyhow::Result<Vec<bc_domain::agent::AgentInstance>> {
        let listed: bc_domain::agent::AgentInstances =
            self.call::<(), _>(reqwest::Method::GET, "/v1/agent/instances", None).await?;
        Ok(listed.instances)
    }

    /// The bytes of an instance's image, as a stream the caller reads.
    pub async fn instance_image(&self, id: &bc_domain::id::InstanceId) -> anyhow::Result<reqwest::Response> {
        self.get_raw(&format!("/v1/agent/instances/{id}/image")).await
    }

    /// Reports what the node did with an instance.
    pub async fn report_instance(
        &self,
        id: &bc_domain::id::InstanceId,
        report: &bc_domain::agent::InstanceStateReport,
    ) -> anyhow::Result<serde_json::Value> {
        self.call(reqwest::Method::POST, &format!("/v1/agent/instances/{id}/state"), Some(report)).await
    }

    pub async fn ack(&self, command: &AgentCommand, ack: &Ack) -> anyhow::Result<serde_json::Value> {
        self.call(reqwest::Method::POST, &format!("/v1/agent/commands/{}/ack", command.id), Some(ack)).await
    }

    /// The site steps this site agent should run now.
    pub async fn site_steps(&self) -> anyhow::Result<bc_domain::agent::SiteWork> {
        self.call::<(), _>(reqwest::Method::GET, "/v1/agent/site/steps", None).await
    }

    /// What a machine of the site that boots from the network should boot, asked on its behalf by its MAC
    /// address or SMBIOS UUID.
    pub async fn site_boot(&self, mac: Option<&str>, uuid: Option<&str>) -> anyhow::Result<BootAnswer> {
        let query: Vec<String> = [("mac", mac), ("uuid", uuid)]
            .into_iter()
            .filter_map(|(name, value)| value.map(|value| format!("{name}={}", query_component(value))))
            .collect();
        let path = format!("/v1/agent/site/boot?{}", query.join("&"));
        self.call::<(), _>(reqwest::Method::GET, &path, None).await
    }

    /// The image whose SHA-256 is `sha256` (lower-case hex), to be read as a stream; an unknown hash is a 404
    /// [`ApiError`].
    pub async fn site_image(&self, sha256: &str) -> anyhow::Result<reqwest::Response> {
        self.get_raw(&format!("/v1/agent/site/images/{sha256}")).await
    }

    /// Reports how an attempt of a site step ended.
    pub async fn report_site_step(
        &self,
        step: &bc_domain::agent::SiteStep,
        report: &bc_domain::agent::StepReport,
    ) -> anyhow::Result<serde_json::Value> {
        let path = format!("/v1/agent/site/steps/{}/{}", step.workflow_id, step.index);
        self.call(reqwest::Method::POST, &path, Some(report)).await
    }
}

/// `value` percent-encoded for a URL's query: everything but letters, digits and `-._~`.
fn query_component(value: &str) -> String {
    let mut encoded = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// The API client's error as the agent's: an error answer is an [`ApiError`] (which [`status_of`] reads); a
/// transport failure keeps its cause (the reqwest error), with the path it was calling.
fn agent_error(err: bc_client::Error, path: &str) -> anyhow::Error {
    match err {
        bc_client::Error::Api { status, code, message, .. } => ApiError { status, code, message }.into(),
        other => anyhow::Error::new(other).context(format!("call {path}")),
    }
}

/// The status of an error answer, if it was one.
pub fn status_of(err: &anyhow::Error) -> Option<u16> {
    err.downcast_ref::<ApiError>().map(|e| e.status)
}
