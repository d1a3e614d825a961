//! The control plane's side: calls a driver over mutual TLS and reads its refusals.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::protocol::{
    AcquireRequest, BootAnswer, BootDevice, BootRequest, Describe, DriverError, ErrorBody, ErrorCode, ListRequest,
    Machine, Machines, PowerAnswer, PowerRequest, PowerState, PowerStateRequest, ReleaseRequest,
};

/// Why a call to a driver failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The driver answered a refusal.
    #[error("the driver refused: {0}")]
    Refused(DriverError),
    /// The driver could not be reached, or its answer was cut.
    #[error("the driver could not be reached: {0}")]
    Unreachable(String),
    /// The driver answered something the protocol does not allow.
    #[error("the driver broke the protocol: {0}")]
    Protocol(String),
}

impl CallError {
    /// The refusal's code, when the driver refused.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            CallError::Refused(err) => Some(err.code),
            _ => None,
        }
    }
}

/// A driver at `url` (`https://host:port`), called with this side's identity.
#[derive(Debug, Clone)]
pub struct DriverClient {
    url: String,
    http: reqwest::Client,
}

/// How long one call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The largest answer read from a driver.
const ANSWER_LIMIT: usize = 4 * 1024 * 1024;

impl DriverClient {
    pub fn new(url: &str, identity: &crate::tls::Identity) -> anyhow::Result<DriverClient> {
        Self::with_timeout(url, identity, CALL_TIMEOUT)
    }

    /// [`DriverClient::new`] with calls cut after `timeout` (a driver that hangs is unreachable).
    pub fn with_timeout(url: &str, identity: &crate::tls::Identity, timeout: Duration) -> anyhow::Result<DriverClient> {
        let http =
            reqwest::Client::builder().tls_backend_preconfigured(identity.client_config()?).timeout(timeout).build()?;
        Ok(DriverClient { url: url.trim_end_matches('/').to_owned(), http })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    async fn call<B: Serialize, R: DeserializeOwned>(&self, path: &str, body: Option<&B>) -> Result<R, CallError> {
        let url = format!("{}{path}", self.url);
        let request = match body {
            Some(body) => self.http.post(&url).json(body),
            None => self.http.get(&url),
        };
        let response = request.send().await.map_err(|err| CallError::Unreachable(format!("{path}: {err}")))?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|err| CallError::Unreachable(format!("{path}: {err}")))?;
        if bytes.len() > ANSWER_LIMIT {
            return Err(CallError::Protocol(format!("{path}: an answer of {} bytes", bytes.len())));
        }
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|err| CallError::Protocol(format!("{path}: {err}")));
        }
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(body) => Err(CallError::Refused(DriverError::new(body.error.code, body.error.message))),
            Err(_) => Err(CallError::Protocol(format!("{path}: {status} without an error body"))),
        }
    }

    pub async fn describe(&self) -> Result<Describe, CallError> {
        self.call::<(), _>("/bcx/v1/describe", None).await
    }

    pub async fn acquire(&self, request: &AcquireRequest) -> Result<Machine, CallError> {
        self.call("/bcx/v1/provider/acquire", Some(request)).await
    }

    pub async fn list(&self, request: &ListRequest) -> Result<Vec<Machine>, CallError> {
        Ok(self.call::<_, Machines>("/bcx/v1/provider/list", Some(request)).await?.machines)
    }

    pub async fn release(&self, request: &ReleaseRequest) -> Result<Machine, CallError> {
        self.call("/bcx/v1/provider/release", Some(request)).await
    }

    pub async fn power_state(&self, request: &PowerStateRequest) -> Result<PowerState, CallError> {
        Ok(self.call::<_, PowerAnswer>("/bcx/v1/power/state", Some(request)).await?.power)
    }

    pub async fn set_power(&self, request: &PowerRequest) -> Result<PowerState, CallError> {
        Ok(self.call::<_, PowerAnswer>("/bcx/v1/power/set", Some(request)).await?.power)
    }

    pub async fn set_boot(&self, request: &BootRequest) -> Result<BootDevice, CallError> {
        Ok(self.call::<_, BootAnswer>("/bcx/v1/boot/set", Some(request)).await?.device)
    }
}
