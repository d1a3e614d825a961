//! A typed client of Better Compute's API, over the API's own wire types ([`bc_wire`]): what the service
//! answers is decoded into the same structs it encoded, so a change of the API is a compile error here, not a
//! surprise at run time.
//!
//! ```no_run
//! # async fn run() -> Result<(), bc_client::Error> {
//! let client = bc_client::Client::new("https://cp.example:8443", Some("bct_...".into()), Some("-----BEGIN..."))?;
//! for pool in client.pools().await? {
//!     println!("{} {}", pool.id, pool.name);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Every call answers either the decoded body or an [`Error`]: the API's own error (`code`, `message` and the
//! field it names), a transport failure, or an answer that does not decode.

use std::time::Duration;

use bc_wire::ErrorBody;
use bc_wire::audit::{AuditKeyDto, AuditProofDto, CheckpointDto};
use bc_wire::explanations::ReservationExplanationDto;
use bc_wire::fleet::{AuditDto, AvailabilityDto, PoolDto, SiteDto};
use bc_wire::nodes::{CommandDto, CommandListDto, ForceBody, InventoryDto, NodeChangedDto, NodeDto, VerbBody};
use bc_wire::ops::EventDto;
use bc_wire::quotes::{QuoteBody, QuoteDto};
use bc_wire::reservations::{CancelBody, ReservationDto, ReserveBody};
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub mod sse;

/// The longest a single request may take; the event stream has no such limit.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How many times a call the server refused as one too many in flight for its token (`429 TOO_MANY_REQUESTS`,
/// refused before anything ran) is sent again, each time after the `Retry-After` the server asked for.
const BUSY_RETRIES: u32 = 5;

/// The longest `Retry-After` a call waits out; a server asking for longer is answered as the error.
const BUSY_WAIT_MAX: Duration = Duration::from_secs(10);

/// What went wrong with a call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API refused the request: its status, error code, message, and the field it names (if any).
    #[error("{code}: {message}{}", field.as_ref().map(|f| format!(" (field {f})")).unwrap_or_default())]
    Api { status: u16, code: String, message: String, field: Option<String> },
    /// The server could not be reached, or the connection broke.
    #[error("cannot reach {server}: {source}")]
    Transport {
        server: String,
        #[source]
        source: reqwest::Error,
    },
    /// The answer was not what the API's types say it is.
    #[error("the answer to {what} does not decode: {reason}")]
    Decode { what: String, reason: String },
    /// The client's own settings are wrong (the server's URL, its CA).
    #[error("{0}")]
    Config(String),
}

impl Error {
    /// The API's error code (`NOT_FOUND`, `CAPACITY_UNAVAILABLE`, ...), when the API answered one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The HTTP status, when the API answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A page of a list, as every list endpoint answers it.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Page<T> {
    items: Vec<T>,
    next_cursor: Option<String>,
}

/// The question `GET /v1/pools/{id}/availability` answers: the earliest start of `count` atoms for
/// `duration_s` seconds, not before `not_before_ms`.
#[derive(Debug, Clone, Default)]
pub struct EarliestStartQuery {
    pub count: u32,
    pub duration_s: u64,
    pub not_before_ms: Option<i64>,
    /// `gpu`, `mig`, `slot` or `node`; the pool's own atom when left out.
    pub class: Option<String>,
}

/// The hours `GET /v1/ledger` answers: `[from_ms, to_ms)` rounded out to whole UTC hours (the last 24 by
/// default), of one pool or of every pool the caller sees.
#[derive(Debug, Clone, Default)]
pub struct LedgerQuery {
    pub pool: Option<String>,
    pub from_ms: Option<i64>,
    pub to_ms: Option<i64>,
}

/// A client of one server, with one bearer token.
///
/// A client reads its own writes: the position each write answers (`X-Position`) is sent with every later read
/// (`X-Min-Position`), so a read after a write waits until the read models show it.
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    http: reqwest::Client,
    token: Option<String>,
    /// The CA an `https://` server is checked against, kept to build the client again with an identity.
    ca_pem: Option<String>,
    written: std::sync::Arc<std::sync::Mutex<Option<String>>>,
}

impl Client {
    /// A client of `server` (`https://...` trusting only `ca_pem`, or `http://...` without TLS), sending
    /// `token` as its bearer token.
    pub fn new(server: &str, token: Option<String>, ca_pem: Option<&str>) -> Result<Self, Error> {
        let base = server.trim_end_matches('/').to_owned();
        let http = http_client(&base, ca_pem, None)?;
        Ok(Self { base, http, token, ca_pem: ca_pem.map(str::to_owned), written: Default::default() })
    }

    /// The same client presenting a certificate (chain and key, PEM) to the server, for mutual TLS (a node's
    /// identity); only over `https://`.
    pub fn with_identity(&self, cert_pem: &str, key_pem: &str) -> Result<Self, Error> {
        if self.ca_pem.is_none() {
            return Err(Error::Config(format!(
                "{} is not reached over TLS: a certificate cannot be presented",
                self.base
            )));
        }
        let http = http_client(&self.base, self.ca_pem.as_deref(), Some((cert_pem, key_pem)))?;
        Ok(Self { http, ..self.clone() })
    }

    /// The same client with another bearer token.
    pub fn with_token(&self, token: &str) -> Self {
        Self { token: Some(token.to_owned()), ..self.clone() }
    }

    /// The server's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let reading = method == Method::GET;
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        match self.last_write() {
            Some(position) if reading => request.header("X-Min-Position", position),
            _ => request,
        }
    }

    /// The position of this client's latest write, which its reads wait for.
    pub fn last_write(&self) -> Option<String> {
        self.written.lock().map(|position| position.clone()).unwrap_or_default()
    }

    fn transport(&self, source: reqwest::Error) -> Error {
        Error::Transport { server: self.base.clone(), source }
    }

    /// Sends `request`, allowed `timeout`, and sends it again after the server's `Retry-After` while it is
    /// refused as one too many in flight for the token (`429 TOO_MANY_REQUESTS`), a few times. Any other answer,
    /// a refusal past the retries, or one asking for too long a wait is returned as it came (a refusal read as
    /// the API's error).
    async fn send_when_not_busy(
        &self,
        request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<reqwest::Response, Error> {
        let mut request = request;
        let mut retries = 0;
        loop {
            let again = request.try_clone();
            let response = request.timeout(timeout).send().await.map_err(|err| self.transport(err))?;
            let wait = busy_wait(&response).filter(|_| retries < BUSY_RETRIES);
            let (Some(wait), Some(again)) = (wait, again) else {
                return Ok(response);
            };
            let bytes = response.bytes().await.map_err(|err| self.transport(err))?;
            let refused = api_error(StatusCode::TOO_MANY_REQUESTS.as_u16(), &bytes);
            if refused.code() != Some("TOO_MANY_REQUESTS") {
                return Err(refused);
            }
            tokio::time::sleep(wait).await;
            retries += 1;
            request = again;
        }
    }

    /// Sends `request` and decodes a successful answer as `T`, or the API's error. A call refused as one too many
    /// in flight for the token is sent again after the server's `Retry-After`, a few times.
    async fn exchange<T: DeserializeOwned>(&self, what: &str, request: reqwest::RequestBuilder) -> Result<T, Error> {
        let response = self.send_when_not_busy(request, REQUEST_TIMEOUT).await?;
        let status = response.status();
        if status.is_success()
            && let Some(position) = response.headers().get("x-position").and_then(|v| v.to_str().ok())
            && let Ok(mut written) = self.written.lock()
        {
            *written = Some(position.to_owned());
        }
        let bytes = response.bytes().await.map_err(|err| self.transport(err))?;
        if !status.is_success() {
            return Err(api_error(status.as_u16(), &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|err| Error::Decode { what: what.to_owned(), reason: err.to_string() })
    }

    /// `GET path`, decoded as `T`.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, Error> {
        self.exchange(&format!("GET {path}"), self.request(Method::GET, path)).await
    }

    /// `method path` with a JSON body, decoded as `T`; `idempotency_key` makes a retry answer the first
    /// call's result.
    pub async fn send<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: &B,
        idempotency_key: Option<&str>,
    ) -> Result<T, Error> {
        let what = format!("{method} {path}");
        let mut request = self.request(method, path).json(body);
        if let Some(key) = idempotency_key {
            request = request.header("Idempotency-Key", key);
        }
        self.exchange(&what, request).await
    }

    /// `method path` with an optional JSON body, decoded as `T`.
    pub async fn call<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, Error> {
        let what = format!("{method} {path}");
        let mut request = self.request(method, path);
        if let Some(body) = body {
            request = request.json(body);
        }
        self.exchange(&what, request).await
    }

    /// `GET path` answered as a stream the caller reads (image bytes), each try allowed `timeout`; an error
    /// answer is the API's [`Error`]. Like every call, it is sent again while refused as one too many in flight.
    pub async fn get_stream(&self, path: &str, timeout: Duration) -> Result<reqwest::Response, Error> {
        let response = self.send_when_not_busy(self.request(Method::GET, path), timeout).await?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let bytes = response.bytes().await.unwrap_or_default();
        Err(api_error(status.as_u16(), &bytes))
    }

    /// Every item of a list, page after page.
    pub async fn all<T: DeserializeOwned>(&self, path: &str) -> Result<Vec<T>, Error> {
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let separator = if path.contains('?') { '&' } else { '?' };
            let page_path = match &cursor {
                Some(cursor) => format!("{path}{separator}limit=500&cursor={}", encode(cursor)),
                None => format!("{path}{separator}limit=500"),
            };
            let page: Page<T> = self.get(&page_path).await?;
            items.extend(page.items);
            match page.next_cursor {
                Some(next) if Some(&next) != cursor.as_ref() => cursor = Some(next),
                _ => return Ok(items),
            }
        }
    }

    /// Who this client's token speaks for.
    pub async fn whoami(&self) -> Result<bc_wire::tenancy::WhoAmIDto, Error> {
        self.get("/v1/whoami").await
    }

    pub async fn sites(&self) -> Result<Vec<SiteDto>, Error> {
        self.all("/v1/sites").await
    }

    pub async fn pools(&self) -> Result<Vec<PoolDto>, Error> {
        self.all("/v1/pools").await
    }

    pub async fn pool(&self, id: &str) -> Result<PoolDto, Error> {
        self.get(&format!("/v1/pools/{}", encode(id))).await
    }

    /// The nodes the caller may see, of one pool when `pool` is given.
    pub async fn nodes(&self, pool: Option<&str>) -> Result<Vec<NodeDto>, Error> {
        match pool {
            Some(pool) => self.all(&format!("/v1/nodes?poolId={}", encode(pool))).await,
            None => self.all("/v1/nodes").await,
        }
    }

    pub async fn node(&self, id: &str) -> Result<NodeDto, Error> {
        self.get(&format!("/v1/nodes/{}", encode(id))).await
    }

    pub async fn node_inventory(&self, id: &str) -> Result<InventoryDto, Error> {
        self.get(&format!("/v1/nodes/{}/inventory", encode(id))).await
    }

    /// A node's latest commands, newest first.
    pub async fn node_commands(&self, id: &str) -> Result<Vec<CommandDto>, Error> {
        Ok(self.get::<CommandListDto>(&format!("/v1/nodes/{}/commands", encode(id))).await?.items)
    }

    /// The caller's reservations.
    pub async fn reservations(&self) -> Result<Vec<ReservationDto>, Error> {
        self.all("/v1/reservations").await
    }

    pub async fn reservation(&self, id: &str) -> Result<ReservationDto, Error> {
        self.get(&format!("/v1/reservations/{}", encode(id))).await
    }

    /// Why a reservation's last placement decision went as it did (`at`: as the log stood at that position).
    pub async fn explanation(&self, id: &str, at: Option<&str>) -> Result<ReservationExplanationDto, Error> {
        let mut path = format!("/v1/reservations/{}/explanation", encode(id));
        if let Some(at) = at {
            path.push_str(&format!("?at={}", encode(at)));
        }
        self.get(&path).await
    }

    /// The audit trail of the caller's tenant, oldest first.
    pub async fn audit(&self) -> Result<Vec<AuditDto>, Error> {
        self.all("/v1/audit").await
    }

    /// Another tenant's audit trail, oldest first (for the root tenant's administrators).
    pub async fn fleet_audit(&self, tenant: &str) -> Result<Vec<AuditDto>, Error> {
        self.all(&format!("/v1/fleet/audit?tenant={}", encode(tenant))).await
    }

    /// The signed audit checkpoints of the caller's tenant (or `tenant`'s), oldest first, without their leaves.
    pub async fn audit_checkpoints(&self, tenant: Option<&str>) -> Result<Vec<CheckpointDto>, Error> {
        match tenant {
            Some(tenant) => self.all(&format!("/v1/audit/checkpoints?tenant={}", encode(tenant))).await,
            None => self.all("/v1/audit/checkpoints").await,
        }
    }

    /// One audit checkpoint with its leaves.
    pub async fn audit_checkpoint(&self, id: &str) -> Result<CheckpointDto, Error> {
        self.get(&format!("/v1/audit/checkpoints/{}", encode(id))).await
    }

    /// The audit entry at `position`, its checkpoint and its inclusion proof.
    pub async fn audit_proof(&self, position: &str) -> Result<AuditProofDto, Error> {
        self.get(&format!("/v1/audit/proof?position={}", encode(position))).await
    }

    /// The public key the server signs audit checkpoints with (pin your own copy; this is what it says).
    pub async fn audit_key(&self) -> Result<AuditKeyDto, Error> {
        self.get("/v1/pki/audit-key").await
    }

    /// When a request could start in `pool`.
    pub async fn earliest_start(&self, pool: &str, query: &EarliestStartQuery) -> Result<Option<i64>, Error> {
        let mut path =
            format!("/v1/pools/{}/availability?count={}&duration={}", encode(pool), query.count, query.duration_s);
        if let Some(not_before) = query.not_before_ms {
            path.push_str(&format!("&notBefore={not_before}"));
        }
        if let Some(class) = &query.class {
            path.push_str(&format!("&class={}", encode(class)));
        }
        match self.get::<AvailabilityDto>(&path).await? {
            AvailabilityDto::EarliestStart(answer) => Ok(answer.earliest_start),
            AvailabilityDto::FreeAtoms(_) => {
                Err(Error::Decode { what: format!("GET {path}"), reason: "free atoms, not an earliest start".into() })
            }
        }
    }

    /// The atoms of `pool` free over all of `[start_ms, end_ms)`, node by node.
    pub async fn free_atoms(
        &self,
        pool: &str,
        start_ms: i64,
        end_ms: i64,
    ) -> Result<Vec<bc_wire::fleet::NodeAtomsDto>, Error> {
        let path = format!("/v1/pools/{}/availability?start={start_ms}&end={end_ms}", encode(pool));
        match self.get::<AvailabilityDto>(&path).await? {
            AvailabilityDto::FreeAtoms(answer) => Ok(answer.nodes),
            AvailabilityDto::EarliestStart(_) => {
                Err(Error::Decode { what: format!("GET {path}"), reason: "an earliest start, not free atoms".into() })
            }
        }
    }

    /// The GPU-hour ledger: per pool and hour its capacity, booked and free atom-hours; per tenant its booked,
    /// bound and idle ones.
    pub async fn ledger(&self, query: &LedgerQuery) -> Result<bc_wire::ledger::LedgerDto, Error> {
        let mut params = form_urlencoded::Serializer::new(String::new());
        if let Some(pool) = &query.pool {
            params.append_pair("pool", pool);
        }
        if let Some(from) = query.from_ms {
            params.append_pair("from", &from.to_string());
        }
        if let Some(to) = query.to_ms {
            params.append_pair("to", &to.to_string());
        }
        let params = params.finish();
        self.get(&if params.is_empty() { "/v1/ledger".to_owned() } else { format!("/v1/ledger?{params}") }).await
    }

    /// Makes a reservation; `idempotency_key` makes a retry answer the same one.
    pub async fn reserve(&self, body: &ReserveBody, idempotency_key: &str) -> Result<ReservationDto, Error> {
        self.send(Method::POST, "/v1/reservations", body, Some(idempotency_key)).await
    }

    /// The quote of a request in `pool`: the exact devices and window it would get now, and the token that books
    /// them ([`Client::book`]). Writes nothing.
    pub async fn quote(&self, pool: &str, body: &QuoteBody) -> Result<QuoteDto, Error> {
        self.send(Method::POST, &format!("/v1/pools/{}/quotes", encode(pool)), body, None).await
    }

    /// Books exactly what `quote` quoted (its `reserve` body, unchanged), or fails with `QUOTE_STALE` naming what
    /// changed; `idempotency_key` makes a retry answer the same reservation.
    pub async fn book(&self, quote: &QuoteDto, idempotency_key: &str) -> Result<ReservationDto, Error> {
        self.reserve(&quote.reserve, idempotency_key).await
    }

    pub async fn cancel(&self, id: &str, reason: Option<String>) -> Result<ReservationDto, Error> {
        self.send(Method::POST, &format!("/v1/reservations/{}/cancel", encode(id)), &CancelBody { reason }, None).await
    }

    pub async fn release(&self, id: &str) -> Result<ReservationDto, Error> {
        let empty = serde_json::json!({});
        self.send(Method::POST, &format!("/v1/reservations/{}/release", encode(id)), &empty, None).await
    }

    /// Cordons a node (no new placements), with a reason.
    pub async fn cordon(&self, id: &str, reason: Option<String>) -> Result<NodeChangedDto, Error> {
        self.send(Method::POST, &format!("/v1/nodes/{}/cordon", encode(id)), &VerbBody { reason }, None).await
    }

    pub async fn uncordon(&self, id: &str, reason: Option<String>) -> Result<NodeChangedDto, Error> {
        self.send(Method::POST, &format!("/v1/nodes/{}/uncordon", encode(id)), &VerbBody { reason }, None).await
    }

    /// Drains a node: no new placements, and what runs there finishes (or ends now with `force`).
    pub async fn drain(&self, id: &str, force: bool, reason: Option<String>) -> Result<NodeChangedDto, Error> {
        self.send(Method::POST, &format!("/v1/nodes/{}/drain", encode(id)), &ForceBody { force, reason }, None).await
    }

    /// The event stream from after `after` (from the start of the log when `None`), of one stream or event
    /// type family when given.
    pub async fn events(&self, query: &sse::StreamQuery) -> Result<sse::EventStream, Error> {
        let path = query.path();
        let response = self
            .request(Method::GET, &path)
            .header("Accept", "text/event-stream")
            .send()
            .await
            .map_err(|err| self.transport(err))?;
        let status = response.status();
        if !status.is_success() {
            let bytes = response.bytes().await.map_err(|err| self.transport(err))?;
            return Err(api_error(status.as_u16(), &bytes));
        }
        Ok(sse::EventStream::new(response, self.base.clone()))
    }

    /// The events of one stream (a reservation, a node, ...) up to its version `through`, in order.
    pub async fn stream_history(&self, stream: &str, through: u32) -> Result<Vec<EventDto>, Error> {
        let mut events = Vec::new();
        if through == 0 {
            return Ok(events);
        }
        let query = sse::StreamQuery { stream: Some(stream.to_owned()), ..sse::StreamQuery::from_start() };
        let mut stream = self.events(&query).await?;
        while let Some(item) = stream.next().await? {
            if let sse::Item::Event(event) = item {
                let version = event.stream_version;
                events.push(*event);
                if version >= through {
                    break;
                }
            }
        }
        Ok(events)
    }
}

/// The HTTP client for `base`: TLS trusting only `ca_pem` (presenting `identity` when given), or plain HTTP.
fn http_client(base: &str, ca_pem: Option<&str>, identity: Option<(&str, &str)>) -> Result<reqwest::Client, Error> {
    let config = if base.starts_with("https://") {
        let Some(ca) = ca_pem else {
            return Err(Error::Config(format!(
                "{base} speaks TLS: give the CA that signed its certificate (better-compute pki show prints it)"
            )));
        };
        bc_pki::tls::client_config(ca, identity)
            .map_err(|err| Error::Config(format!("the CA or the client certificate: {err}")))?
    } else if base.starts_with("http://") {
        bc_pki::tls::plain_http_client_config().map_err(|err| Error::Config(err.to_string()))?
    } else {
        return Err(Error::Config(format!("the server {base:?} is not an http:// or https:// URL")));
    };
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .tls_backend_preconfigured(config)
        .build()
        .map_err(|err| Error::Config(format!("cannot build the HTTP client: {err}")))
}

/// How long to wait before sending a call again, when `response` refused it as one too many in flight: its
/// `Retry-After` in seconds, when that is no longer than [`BUSY_WAIT_MAX`].
fn busy_wait(response: &reqwest::Response) -> Option<Duration> {
    if response.status() != StatusCode::TOO_MANY_REQUESTS {
        return None;
    }
    let seconds: u64 = response.headers().get("retry-after")?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds)).filter(|wait| *wait <= BUSY_WAIT_MAX)
}

/// The API's error answer as an [`Error`]; an answer that is not the API's error shape still names its
/// status and what it said.
fn api_error(status: u16, bytes: &[u8]) -> Error {
    match serde_json::from_slice::<ErrorBody>(bytes) {
        Ok(body) => Error::Api {
            status,
            code: body.error.code,
            message: body.error.message,
            field: body.error.details.get("field").and_then(|f| f.as_str()).map(str::to_owned),
        },
        Err(_) => {
            let text: String = String::from_utf8_lossy(bytes).chars().take(200).collect();
            Error::Api { status, code: format!("HTTP_{status}"), message: text.trim().to_owned(), field: None }
        }
    }
}

/// Percent-encodes one path segment or query value (a space as `%20`, which both read as a space).
pub fn encode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect::<String>().replace('+', "%20")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_answer_names_its_code_message_and_field() {
        let body =
            br#"{"error":{"code":"INVALID_ARGUMENT","message":"must be at least 1","details":{"field":"duration"}}}"#;
        let err = api_error(400, body);
        assert_eq!((err.status(), err.code()), (Some(400), Some("INVALID_ARGUMENT")));
        assert_eq!(err.to_string(), "INVALID_ARGUMENT: must be at least 1 (field duration)");
        let proxy = api_error(502, b"<html>Bad Gateway</html>\n");
        assert_eq!(proxy.to_string(), "HTTP_502: <html>Bad Gateway</html>");
    }

    #[test]
    fn a_server_must_be_an_http_url_and_tls_needs_its_ca() {
        for (server, says) in [("ftp://x", "is not an http:// or https:// URL"), ("https://x", "give the CA")] {
            let err = Client::new(server, None, None).expect_err(server);
            assert!(err.to_string().contains(says), "{err}");
        }
        let plain = Client::new("http://127.0.0.1:1/", Some("t".into()), None).expect("plain HTTP");
        assert_eq!(plain.base(), "http://127.0.0.1:1");
        let err = plain.with_identity("cert", "key").expect_err("no TLS");
        assert!(err.to_string().contains("not reached over TLS"), "{err}");
    }

    #[test]
    fn values_are_encoded_for_paths_and_queries() {
        assert_eq!(encode("a b+/c?d&e"), "a%20b%2B%2Fc%3Fd%26e");
        assert_eq!(encode("rsv_01abc"), "rsv_01abc");
    }
}
