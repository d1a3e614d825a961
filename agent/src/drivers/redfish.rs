//! A Redfish client for one BMC: its systems (`/redfish/v1/Systems`, each addressed by its id or its UUID),
//! power through `#ComputerSystem.Reset`, a one-time boot device through the system's `Boot` object, the
//! manager's virtual CD (`InsertMedia`, `EjectMedia`) and the system's inventory.
//!
//! Calls use HTTP basic authentication; answers larger than [`MAX_BODY_BYTES`] are refused. TLS trusts only
//! the configured CA, or, where asked for, anything (BMCs ship self-signed certificates).
//!
//! The calls that change the machine (`power`, `set_one_time_boot`, `insert_virtual_media`,
//! `eject_virtual_media`) are not cancel-safe: dropped midway, the BMC may or may not have acted; read the
//! state back before asking again.

use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use reqwest::header::{ACCEPT, ETAG, IF_MATCH, RETRY_AFTER};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{BmcError, BootDevice, Inventory, Power, PowerAction, excerpt, scrub};

/// The most bytes one answer may take: Redfish resources weigh a few KiB, so more is a BMC gone wrong.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// Where a Redfish service lists its computer systems.
const SYSTEMS: &str = "/redfish/v1/Systems";

/// The most pages of one collection the client follows (`Members@odata.nextLink`).
const MAX_PAGES: usize = 64;

/// How to reach one BMC.
#[derive(Clone)]
pub struct RedfishConfig {
    /// `https://host[:port]` (or `http://` with [`RedfishTls::Insecure`]), without a path or credentials.
    pub base_url: String,
    pub username: String,
    pub password: String,
    pub tls: RedfishTls,
    /// The limit on each HTTP call, connecting included.
    pub timeout: Duration,
}

impl std::fmt::Debug for RedfishConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedfishConfig")
            .field("base_url", &self.base_url)
            .field("username", &self.username)
            .field("password", &"***")
            .field("tls", &self.tls)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Which certificates the client accepts from the BMC.
#[derive(Debug, Clone)]
pub enum RedfishTls {
    /// Only certificates this CA (PEM) signed; the address must be `https://`.
    CaPem(String),
    /// Any certificate, or plain `http://`: for BMCs with their factory's self-signed certificate.
    Insecure,
}

/// One computer system of the BMC: by its Redfish `Id` or by its `UUID`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SystemRef {
    Id(String),
    Uuid(String),
}

impl std::fmt::Display for SystemRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SystemRef::Id(id) => write!(f, "system {id}"),
            SystemRef::Uuid(uuid) => write!(f, "the system with UUID {uuid}"),
        }
    }
}

/// A system as the collection lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SystemSummary {
    pub id: String,
    pub uuid: Option<String>,
    pub name: Option<String>,
    pub power_state: Power,
}

/// A system's boot override, in Redfish's spellings (`Pxe`, `Cd`, `Hdd`; `Once`, `Continuous`, `Disabled`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootOverride {
    pub target: Option<String>,
    pub enabled: Option<String>,
}

/// The virtual CD slot of a system's manager.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMedia {
    /// The slot's resource path.
    pub slot: String,
    /// The image's URL, when one is set.
    pub image: Option<String>,
    pub inserted: bool,
}

/// The client of one BMC. Cloning shares its connections.
#[derive(Clone)]
pub struct Redfish {
    http: reqwest::Client,
    base: String,
    username: String,
    password: String,
    timeout: Duration,
}

impl std::fmt::Debug for Redfish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redfish").field("base", &self.base).field("username", &self.username).finish_non_exhaustive()
    }
}

/// A resource as read: where it is, what it says, and its ETag for a conditional change.
#[derive(Debug)]
struct Resource {
    path: String,
    body: Value,
    etag: Option<String>,
}

/// An answer's body and ETag.
#[derive(Debug)]
struct Answer {
    body: Vec<u8>,
    etag: Option<String>,
}

impl Redfish {
    /// A client for the BMC at `config.base_url`. Fails on an address that is not `http(s)://host[:port]`,
    /// one that carries credentials, a CA that does not parse, or a CA given for a plain `http://` address.
    pub fn new(config: RedfishConfig) -> Result<Redfish, BmcError> {
        let base = config.base_url.trim_end_matches('/').to_owned();
        let url = reqwest::Url::parse(&base)
            .map_err(|err| BmcError::Config(format!("the BMC address {base:?} is not a URL: {err}")))?;
        let host = url.host_str().unwrap_or_default().to_owned();
        if !url.username().is_empty() || url.password().is_some() {
            // The address is not quoted: it holds a password.
            return Err(BmcError::Config(format!(
                "the address of the BMC at {host} carries credentials: give them as username and password"
            )));
        }
        if host.is_empty() || url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
            return Err(BmcError::Config(format!("the BMC address {base:?} must be scheme://host[:port], no more")));
        }
        let tls = match (&config.tls, url.scheme()) {
            (RedfishTls::CaPem(ca), "https") => bc_pki::tls::client_config(ca, None)
                .map_err(|err| BmcError::Config(format!("the CA for the BMC at {base}: {err}")))?,
            (RedfishTls::CaPem(_), "http") => {
                return Err(BmcError::Config(format!(
                    "the BMC address {base} is plain http://, but a CA was given: a pinned CA needs https://"
                )));
            }
            (RedfishTls::Insecure, "https" | "http") => accept_any_certificate()
                .map_err(|err| BmcError::Config(format!("the TLS configuration for {base}: {err}")))?,
            (_, scheme) => {
                return Err(BmcError::Config(format!("the BMC address {base} is {scheme}://, not http(s)://")));
            }
        };
        let http = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .tls_backend_preconfigured(tls)
            .build()
            .map_err(|err| BmcError::Config(format!("build the HTTP client for {base}: {err}")))?;
        Ok(Redfish { http, base, username: config.username, password: config.password, timeout: config.timeout })
    }

    /// The BMC's address, as configured.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// Every system the BMC manages.
    pub async fn systems(&self) -> Result<Vec<SystemSummary>, BmcError> {
        let what = "list the systems";
        let mut systems = Vec::new();
        for path in self.members(SYSTEMS, what).await? {
            let system = self.get(&path, what).await?;
            let id = text(&system.body["Id"]).unwrap_or_else(|| last_segment(&path).to_owned());
            systems.push(SystemSummary {
                id,
                uuid: text(&system.body["UUID"]),
                name: text(&system.body["Name"]),
                power_state: power_state(&system.body["PowerState"]),
            });
        }
        Ok(systems)
    }

    /// The system's power state.
    pub async fn power_state(&self, system: &SystemRef) -> Result<Power, BmcError> {
        let resource = self.system(system, &format!("read the power state of {system}")).await?;
        Ok(power_state(&resource.body["PowerState"]))
    }

    /// Switches the system's power through `#ComputerSystem.Reset`, with the first reset type the system
    /// allows of those that do `action`. The BMC may take a while to get there: read [`Self::power_state`].
    pub async fn power(&self, system: &SystemRef, action: PowerAction) -> Result<(), BmcError> {
        let what = format!("{} {system}", power_words(action));
        let resource = self.system(system, &what).await?;
        let reset = &resource.body["Actions"]["#ComputerSystem.Reset"];
        let Some(target) = reset["target"].as_str() else {
            return Err(BmcError::Protocol(format!(
                "{what}: {}{} offers no #ComputerSystem.Reset action",
                self.base, resource.path
            )));
        };
        let target = self.link_path(target, &what)?;
        let allowed: Option<Vec<&str>> = reset["ResetType@Redfish.AllowableValues"]
            .as_array()
            .map(|values| values.iter().filter_map(Value::as_str).collect());
        let wanted = reset_types(action);
        let Some(reset_type) = wanted.iter().find(|t| allowed.as_ref().is_none_or(|allowed| allowed.contains(t)))
        else {
            return Err(BmcError::Protocol(format!(
                "{what}: {}{} allows the reset types {allowed:?}, none of {wanted:?}",
                self.base, resource.path
            )));
        };
        self.call(Method::POST, &target, Some(&json!({ "ResetType": reset_type })), None, &what).await?;
        Ok(())
    }

    /// Makes the system boot from `device` once, at its next boot (`BootSourceOverrideEnabled: Once`).
    pub async fn set_one_time_boot(&self, system: &SystemRef, device: BootDevice) -> Result<(), BmcError> {
        let target = match device {
            BootDevice::Pxe => "Pxe",
            BootDevice::Cd => "Cd",
            BootDevice::Disk => "Hdd",
        };
        let what = format!("boot {system} from {target} once");
        let resource = self.system(system, &what).await?;
        if let Some(allowed) = resource.body["Boot"]["BootSourceOverrideTarget@Redfish.AllowableValues"].as_array()
            && !allowed.iter().any(|value| value.as_str() == Some(target))
        {
            return Err(BmcError::Protocol(format!(
                "{what}: {}{} allows the boot targets {allowed:?}, not {target}",
                self.base, resource.path
            )));
        }
        let body = json!({ "Boot": { "BootSourceOverrideTarget": target, "BootSourceOverrideEnabled": "Once" } });
        self.call(Method::PATCH, &resource.path, Some(&body), resource.etag.as_deref(), &what).await?;
        Ok(())
    }

    /// The system's boot override as the BMC reports it.
    pub async fn boot_override(&self, system: &SystemRef) -> Result<BootOverride, BmcError> {
        let resource = self.system(system, &format!("read the boot override of {system}")).await?;
        let boot = &resource.body["Boot"];
        Ok(BootOverride {
            target: text(&boot["BootSourceOverrideTarget"]),
            enabled: text(&boot["BootSourceOverrideEnabled"]),
        })
    }

    /// The state of the system's virtual CD slot.
    pub async fn virtual_media(&self, system: &SystemRef) -> Result<VirtualMedia, BmcError> {
        let what = format!("read the virtual CD of {system}");
        let resource = self.system(system, &what).await?;
        let slot = self.cd_slot(&resource, &what).await?;
        Ok(media_state(&slot))
    }

    /// Puts the image at `image_url` in the system's virtual CD slot (the BMC fetches it from there), ejecting
    /// another image first. The same image already inserted is left as it is.
    pub async fn insert_virtual_media(&self, system: &SystemRef, image_url: &str) -> Result<(), BmcError> {
        let what = format!("insert {image_url} in the virtual CD of {system}");
        let resource = self.system(system, &what).await?;
        let slot = self.cd_slot(&resource, &what).await?;
        let state = media_state(&slot);
        if state.inserted && state.image.as_deref() == Some(image_url) {
            return Ok(());
        }
        if state.inserted {
            self.eject(&slot, &what).await?;
        }
        let target = self.action_target(&slot, "VirtualMedia.InsertMedia", &what)?;
        let body = json!({ "Image": image_url, "Inserted": true, "WriteProtected": true });
        self.call(Method::POST, &target, Some(&body), None, &what).await?;
        Ok(())
    }

    /// Empties the system's virtual CD slot; an empty slot is left as it is.
    pub async fn eject_virtual_media(&self, system: &SystemRef) -> Result<(), BmcError> {
        let what = format!("eject the virtual CD of {system}");
        let resource = self.system(system, &what).await?;
        let slot = self.cd_slot(&resource, &what).await?;
        let state = media_state(&slot);
        if !state.inserted && state.image.is_none() {
            return Ok(());
        }
        self.eject(&slot, &what).await
    }

    /// What the BMC says about the system: identity, processors, memory, MAC addresses and power.
    pub async fn inventory(&self, system: &SystemRef) -> Result<Inventory, BmcError> {
        let what = format!("read the inventory of {system}");
        let resource = self.system(system, &what).await?;
        let body = &resource.body;
        let mut macs = Vec::new();
        if let Some(interfaces) = body["EthernetInterfaces"]["@odata.id"].as_str() {
            let interfaces = self.link_path(interfaces, &what)?;
            for path in self.members(&interfaces, &what).await? {
                let interface = self.get(&path, &what).await?;
                let mac = text(&interface.body["MACAddress"]).or_else(|| text(&interface.body["PermanentMACAddress"]));
                macs.extend(mac.map(|mac| mac.to_ascii_lowercase()));
            }
        }
        macs.sort();
        macs.dedup();
        Ok(Inventory {
            uuid: text(&body["UUID"]),
            serial: text(&body["SerialNumber"]),
            manufacturer: text(&body["Manufacturer"]),
            model: text(&body["Model"]),
            cpu_count: body["ProcessorSummary"]["Count"].as_u64().and_then(|n| u32::try_from(n).ok()),
            memory_gib: body["MemorySummary"]["TotalSystemMemoryGiB"].as_f64(),
            macs,
            power_state: power_state(&body["PowerState"]),
        })
    }

    /// The system `system` refers to, read. Its id is looked for first as the last segment of a member's
    /// path (one read), then in each member's `Id`; a UUID in each member's `UUID`, in any case.
    async fn system(&self, system: &SystemRef, what: &str) -> Result<Resource, BmcError> {
        let members = self.members(SYSTEMS, what).await?;
        if let SystemRef::Id(id) = system
            && let Some(path) = members.iter().find(|path| last_segment(path) == id)
        {
            return self.get(path, what).await;
        }
        for path in &members {
            let resource = self.get(path, what).await?;
            let found = match system {
                SystemRef::Id(id) => resource.body["Id"].as_str() == Some(id),
                SystemRef::Uuid(uuid) => resource.body["UUID"].as_str().is_some_and(|u| u.eq_ignore_ascii_case(uuid)),
            };
            if found {
                return Ok(resource);
            }
        }
        Err(BmcError::NotFound(format!(
            "{what}: {}{SYSTEMS} lists no {system} ({} systems listed)",
            self.base,
            members.len()
        )))
    }

    /// The CD/DVD slot of the system's virtual media: its manager's (`Links.ManagedBy`), else its own.
    async fn cd_slot(&self, system: &Resource, what: &str) -> Result<Resource, BmcError> {
        let mut collection = None;
        if let Some(manager) = system.body["Links"]["ManagedBy"].get(0).and_then(|m| m["@odata.id"].as_str()) {
            let manager = self.get(&self.link_path(manager, what)?, what).await?;
            collection = manager.body["VirtualMedia"]["@odata.id"].as_str().map(str::to_owned);
        }
        let collection = collection.or_else(|| system.body["VirtualMedia"]["@odata.id"].as_str().map(str::to_owned));
        let Some(collection) = collection else {
            return Err(BmcError::NotFound(format!(
                "{what}: neither the manager of {}{} nor the system has virtual media",
                self.base, system.path
            )));
        };
        let collection = self.link_path(&collection, what)?;
        for path in self.members(&collection, what).await? {
            let slot = self.get(&path, what).await?;
            let is_cd = slot.body["MediaTypes"].as_array().is_some_and(|types| {
                types
                    .iter()
                    .filter_map(Value::as_str)
                    .any(|t| t.eq_ignore_ascii_case("CD") || t.eq_ignore_ascii_case("DVD"))
            });
            if is_cd {
                return Ok(slot);
            }
        }
        Err(BmcError::NotFound(format!("{what}: {}{collection} has no CD or DVD slot", self.base)))
    }

    async fn eject(&self, slot: &Resource, what: &str) -> Result<(), BmcError> {
        let target = self.action_target(slot, "VirtualMedia.EjectMedia", what)?;
        self.call(Method::POST, &target, Some(&json!({})), None, what).await?;
        Ok(())
    }

    /// The target of the resource's action `#{action}`.
    fn action_target(&self, resource: &Resource, action: &str, what: &str) -> Result<String, BmcError> {
        match resource.body["Actions"][format!("#{action}")]["target"].as_str() {
            Some(target) => self.link_path(target, what),
            None => {
                Err(BmcError::Protocol(format!("{what}: {}{} offers no #{action} action", self.base, resource.path)))
            }
        }
    }

    /// The paths of a collection's members, following its pages.
    async fn members(&self, collection: &str, what: &str) -> Result<Vec<String>, BmcError> {
        let mut paths = Vec::new();
        let mut next = Some(collection.to_owned());
        let mut pages = 0;
        while let Some(page) = next.take() {
            pages += 1;
            if pages > MAX_PAGES {
                return Err(BmcError::Protocol(format!(
                    "{what}: {}{collection} has more than {MAX_PAGES} pages",
                    self.base
                )));
            }
            let resource = self.get(&page, what).await?;
            let Some(members) = resource.body["Members"].as_array() else {
                return Err(BmcError::Protocol(format!(
                    "{what}: {}{page} is not a collection (no Members)",
                    self.base
                )));
            };
            for member in members {
                let Some(id) = member["@odata.id"].as_str() else {
                    return Err(BmcError::Protocol(format!(
                        "{what}: a member of {}{page} has no @odata.id",
                        self.base
                    )));
                };
                paths.push(self.link_path(id, what)?);
            }
            if let Some(link) = resource.body["Members@odata.nextLink"].as_str() {
                next = Some(self.link_path(link, what)?);
            }
        }
        Ok(paths)
    }

    /// A link the BMC gave, as a path on this BMC: links are paths, or URLs on the same address.
    fn link_path(&self, link: &str, what: &str) -> Result<String, BmcError> {
        if link.starts_with('/') {
            return Ok(link.to_owned());
        }
        match link.strip_prefix(&self.base) {
            Some(path) if path.starts_with('/') => Ok(path.to_owned()),
            _ => Err(BmcError::Protocol(format!("{what}: {} links to {link:?}, outside itself", self.base))),
        }
    }

    async fn get(&self, path: &str, what: &str) -> Result<Resource, BmcError> {
        let answer = self.call(Method::GET, path, None, None, what).await?;
        let body: Value = serde_json::from_slice(&answer.body).map_err(|err| {
            BmcError::Protocol(format!("{what}: GET {}{path}: the answer is not JSON: {err}", self.base))
        })?;
        let etag = answer.etag.or_else(|| text(&body["@odata.etag"]));
        Ok(Resource { path: path.to_owned(), body, etag })
    }

    /// One HTTP call, its status mapped to the errors callers tell apart.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        if_match: Option<&str>,
        what: &str,
    ) -> Result<Answer, BmcError> {
        let url = format!("{}{path}", self.base);
        let context = format!("{what}: {method} {url}");
        let mut request = self
            .http
            .request(method, &url)
            .basic_auth(&self.username, Some(&self.password))
            .header(ACCEPT, "application/json");
        if let Some(body) = body {
            request = request.json(body);
        }
        if let Some(etag) = if_match {
            request = request.header(IF_MATCH, etag);
        }
        let response = request.send().await.map_err(|err| self.transport_error(&err, &context))?;
        let status = response.status();
        let headers = response.headers();
        let etag = headers.get(ETAG).and_then(|v| v.to_str().ok()).map(str::to_owned);
        // Retry-After in seconds; its HTTP-date form is rare on BMCs and read as no hint.
        let retry_after_s = headers.get(RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse().ok());
        let body = self.read_bounded(response, &context).await?;
        if status.is_success() {
            return Ok(Answer { body, etag });
        }
        let detail = match redfish_message(&body) {
            Some(message) => format!(": {}", scrub(&message, &self.password)),
            None => String::new(),
        };
        Err(match status.as_u16() {
            401 | 403 => {
                BmcError::Unauthorized(format!("{context}: HTTP {status} for user {:?}{detail}", self.username))
            }
            404 => BmcError::NotFound(format!("{context}: HTTP {status}{detail}")),
            503 => BmcError::Unavailable { retry_after_s, message: format!("{context}: HTTP {status}{detail}") },
            _ => BmcError::Protocol(format!("{context}: HTTP {status}{detail}")),
        })
    }

    /// The answer's body, refused past [`MAX_BODY_BYTES`].
    async fn read_bounded(&self, mut response: reqwest::Response, context: &str) -> Result<Vec<u8>, BmcError> {
        let too_big =
            || BmcError::Protocol(format!("{context}: the answer takes more than {MAX_BODY_BYTES} bytes, refused"));
        if response.content_length().is_some_and(|length| length > MAX_BODY_BYTES as u64) {
            return Err(too_big());
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|err| self.transport_error(&err, context))? {
            if body.len() + chunk.len() > MAX_BODY_BYTES {
                return Err(too_big());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    fn transport_error(&self, err: &reqwest::Error, context: &str) -> BmcError {
        let causes = scrub(&causes(err), &self.password);
        if let Some(tls) = tls_error(err) {
            BmcError::Tls(format!("{context}: {tls}"))
        } else if err.is_timeout() {
            BmcError::Unreachable(format!("{context}: no answer within {:?}", self.timeout))
        } else if err.is_builder() {
            BmcError::Config(format!("{context}: {causes}"))
        } else if err.is_redirect() || err.is_decode() {
            BmcError::Protocol(format!("{context}: {causes}"))
        } else {
            BmcError::Unreachable(format!("{context}: {causes}"))
        }
    }
}

fn power_words(action: PowerAction) -> &'static str {
    match action {
        PowerAction::On => "power on",
        PowerAction::Off => "power off",
        PowerAction::GracefulOff => "shut down",
        PowerAction::Reset => "reset",
    }
}

/// The Redfish reset types that do `action`, preferred first.
fn reset_types(action: PowerAction) -> &'static [&'static str] {
    match action {
        PowerAction::On => &["On", "ForceOn"],
        PowerAction::Off => &["ForceOff"],
        PowerAction::GracefulOff => &["GracefulShutdown"],
        PowerAction::Reset => &["ForceRestart", "PowerCycle"],
    }
}

fn power_state(value: &Value) -> Power {
    match value.as_str() {
        Some("On") => Power::On,
        Some("Off") => Power::Off,
        _ => Power::Unknown,
    }
}

fn media_state(slot: &Resource) -> VirtualMedia {
    VirtualMedia {
        slot: slot.path.clone(),
        image: text(&slot.body["Image"]),
        inserted: slot.body["Inserted"].as_bool().unwrap_or(false),
    }
}

/// A non-empty string value, trimmed.
fn text(value: &Value) -> Option<String> {
    value.as_str().map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned)
}

fn last_segment(path: &str) -> &str {
    path.trim_end_matches('/').rsplit('/').next().unwrap_or(path)
}

/// The message of a Redfish error answer (`error.message`, else its first extended message), else the start
/// of the answer's text.
fn redfish_message(body: &[u8]) -> Option<String> {
    if let Ok(value) = serde_json::from_slice::<Value>(body) {
        let error = &value["error"];
        let extended = error["@Message.ExtendedInfo"].get(0).and_then(|info| info["Message"].as_str());
        if let Some(message) = error["message"].as_str().or(extended) {
            return Some(excerpt(message, 300));
        }
    }
    let text = String::from_utf8_lossy(body);
    (!text.trim().is_empty()).then(|| excerpt(&text, 300))
}

/// The error's causes, joined: reqwest's own message says little.
fn causes(err: &reqwest::Error) -> String {
    let mut parts = vec![err.to_string()];
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        parts.push(cause.to_string());
        source = cause.source();
    }
    parts.join(": ")
}

/// The TLS error under `err`, if the handshake is what failed. rustls' error reaches reqwest wrapped in
/// `io::Error`s, whose `source` skips what they wrap, so each is opened instead.
fn tls_error(err: &reqwest::Error) -> Option<String> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(current) = cause {
        if let Some(tls) = current.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        cause = match current.downcast_ref::<std::io::Error>() {
            Some(io) => io.get_ref().map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => current.source(),
        };
    }
    None
}

/// A TLS configuration that accepts any server certificate (signatures are still checked, so the handshake
/// is sound; who the server is, is not).
fn accept_any_certificate() -> Result<rustls::ClientConfig, rustls::Error> {
    let provider = bc_pki::tls::provider();
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(base_url: &str, tls: RedfishTls) -> RedfishConfig {
        RedfishConfig {
            base_url: base_url.into(),
            username: "admin".into(),
            password: "hunter2".into(),
            tls,
            timeout: Duration::from_secs(5),
        }
    }

    #[test]
    fn an_address_must_be_a_bare_http_or_https_origin_without_credentials() {
        assert!(Redfish::new(config("https://10.0.0.5/", RedfishTls::Insecure)).is_ok());
        assert!(Redfish::new(config("http://10.0.0.5:8000", RedfishTls::Insecure)).is_ok());
        for bad in ["10.0.0.5", "https://10.0.0.5/redfish/v1", "ftp://10.0.0.5", "https://10.0.0.5/?a=b"] {
            let err = Redfish::new(config(bad, RedfishTls::Insecure)).expect_err(bad);
            assert!(matches!(err, BmcError::Config(_)), "{bad}: {err}");
        }
        let err = Redfish::new(config("https://root:hunter2@10.0.0.5", RedfishTls::Insecure)).expect_err("userinfo");
        assert!(err.to_string().contains("credentials") && !err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn a_pinned_ca_needs_https_and_must_parse() {
        let err = Redfish::new(config("http://10.0.0.5", RedfishTls::CaPem("x".into()))).expect_err("http");
        assert!(err.to_string().contains("https://"), "{err}");
        let err = Redfish::new(config("https://10.0.0.5", RedfishTls::CaPem("no PEM".into()))).expect_err("bad");
        assert!(matches!(err, BmcError::Config(_)), "{err}");
    }

    #[test]
    fn the_config_and_the_client_never_show_the_password() {
        let config = config("https://10.0.0.5", RedfishTls::Insecure);
        assert!(!format!("{config:?}").contains("hunter2"));
        let client = Redfish::new(config).expect("client");
        assert!(!format!("{client:?}").contains("hunter2"));
    }

    #[test]
    fn each_power_action_prefers_the_plain_reset_type() {
        assert_eq!(reset_types(PowerAction::On)[0], "On");
        assert_eq!(reset_types(PowerAction::Off), ["ForceOff"]);
        assert_eq!(reset_types(PowerAction::GracefulOff), ["GracefulShutdown"]);
        assert_eq!(reset_types(PowerAction::Reset)[0], "ForceRestart");
    }

    #[test]
    fn power_states_other_than_on_and_off_are_unknown() {
        assert_eq!(power_state(&json!("On")), Power::On);
        assert_eq!(power_state(&json!("Off")), Power::Off);
        assert_eq!(power_state(&json!("PoweringOn")), Power::Unknown);
        assert_eq!(power_state(&Value::Null), Power::Unknown);
    }

    #[test]
    fn an_error_answer_is_quoted_by_its_redfish_message() {
        let body = br#"{"error":{"code":"Base.1.0.GeneralError","message":"Fake system x was not found"}}"#;
        assert_eq!(redfish_message(body).as_deref(), Some("Fake system x was not found"));
        let body = br#"{"error":{"@Message.ExtendedInfo":[{"Message":"Busy"}]}}"#;
        assert_eq!(redfish_message(body).as_deref(), Some("Busy"));
        assert_eq!(redfish_message(b"<html>oops</html>").as_deref(), Some("<html>oops</html>"));
        assert_eq!(redfish_message(b""), None);
    }

    #[test]
    fn links_are_paths_on_the_same_bmc() {
        let client = Redfish::new(config("https://10.0.0.5", RedfishTls::Insecure)).expect("client");
        assert_eq!(client.link_path("/redfish/v1/Systems/1", "x").expect("path"), "/redfish/v1/Systems/1");
        assert_eq!(
            client.link_path("https://10.0.0.5/redfish/v1/Systems/1", "x").expect("url"),
            "/redfish/v1/Systems/1"
        );
        assert!(client.link_path("https://evil.example/redfish/v1", "x").is_err());
        assert_eq!(last_segment("/redfish/v1/Systems/abc/"), "abc");
    }
}
