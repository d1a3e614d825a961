//! The driver's side: implement [`ProviderDriver`], wrap it in a [`Driver`], and [`serve`] it over mutual TLS.
//!
//! ```no_run
//! # use bcx::protocol::*;
//! # use bcx::server::*;
//! struct Mine;
//! impl ProviderDriver for Mine {
//!     fn acquire(&self, r: AcquireRequest) -> DriverFuture<'_, Machine> {
//!         Box::pin(async move { Err(DriverError::new(ErrorCode::CapacityUnavailable, "none today")) })
//!     }
//!     fn list(&self, _: ListRequest) -> DriverFuture<'_, Vec<Machine>> {
//!         Box::pin(async { Ok(Vec::new()) })
//!     }
//!     fn release(&self, r: ReleaseRequest) -> DriverFuture<'_, Machine> {
//!         Box::pin(async move { Err(DriverError::new(ErrorCode::NotFound, r.machine_id)) })
//!     }
//! }
//! # async fn run(tls: bcx::tls::Identity) -> anyhow::Result<()> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:7443").await?;
//! serve(listener, &tls, Driver::provider("mine", "1.0", Mine), std::future::pending()).await
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::de::DeserializeOwned;

use crate::protocol::{
    AcquireRequest, BmcTarget, BootAnswer, BootRequest, Concern, Describe, DriverError, ErrorBody, ErrorCode,
    ErrorDetail, ListRequest, Machine, Machines, PROTOCOL, PowerAnswer, PowerRequest, PowerState, PowerStateRequest,
    ReleaseRequest, check_acquire,
};

/// What a driver's call returns.
pub type DriverFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, DriverError>> + Send + 'a>>;

/// A provider driver: acquires, lists and releases an external provider's machines for an account.
pub trait ProviderDriver: Send + Sync + 'static {
    /// A machine for the request; the same key answers the same machine.
    fn acquire(&self, request: AcquireRequest) -> DriverFuture<'_, Machine>;
    /// The machines the account holds.
    fn list(&self, request: ListRequest) -> DriverFuture<'_, Vec<Machine>>;
    /// Gives a machine back; one already released answers itself, released.
    fn release(&self, request: ReleaseRequest) -> DriverFuture<'_, Machine>;
}

/// A BMC driver: a machine's power and its one-time boot device, through its BMC.
pub trait BmcDriver: Send + Sync + 'static {
    fn power_state(&self, request: PowerStateRequest) -> DriverFuture<'_, PowerState>;
    /// Carries out the action; answers the power the BMC shows afterwards.
    fn set_power(&self, request: PowerRequest) -> DriverFuture<'_, PowerState>;
    fn set_boot(&self, request: BootRequest) -> DriverFuture<'_, ()>;
}

/// A driver as it is served: its name and version, and the concerns it implements.
#[derive(Clone)]
pub struct Driver {
    pub name: String,
    pub version: String,
    pub provider: Option<Arc<dyn ProviderDriver>>,
    pub bmc: Option<Arc<dyn BmcDriver>>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").field("name", &self.name).field("version", &self.version).finish()
    }
}

impl Driver {
    /// A provider driver.
    pub fn provider(name: &str, version: &str, driver: impl ProviderDriver) -> Driver {
        Driver { name: name.to_owned(), version: version.to_owned(), provider: Some(Arc::new(driver)), bmc: None }
    }

    /// A BMC driver (the power and boot concerns).
    pub fn bmc(name: &str, version: &str, driver: impl BmcDriver) -> Driver {
        Driver { name: name.to_owned(), version: version.to_owned(), provider: None, bmc: Some(Arc::new(driver)) }
    }

    /// What `describe` answers.
    pub fn describe(&self) -> Describe {
        let mut concerns = Vec::new();
        if self.provider.is_some() {
            concerns.push(Concern::Provider);
        }
        if self.bmc.is_some() {
            concerns.extend([Concern::Power, Concern::Boot]);
        }
        Describe { protocol: PROTOCOL.to_owned(), name: self.name.clone(), version: self.version.clone(), concerns }
    }
}

/// A refusal as an HTTP answer.
pub struct Refusal(pub DriverError);

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = ErrorBody { error: ErrorDetail { code: self.0.code, message: self.0.message } };
        (status, Json(body)).into_response()
    }
}

impl From<DriverError> for Refusal {
    fn from(err: DriverError) -> Self {
        Refusal(err)
    }
}

/// The largest request body a driver reads.
const BODY_LIMIT: usize = 64 * 1024;

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, Refusal> {
    serde_json::from_slice(body).map_err(|err| Refusal(DriverError::invalid(format!("the body: {err}"))))
}

fn provider(driver: &Driver) -> Result<&Arc<dyn ProviderDriver>, Refusal> {
    driver
        .provider
        .as_ref()
        .ok_or_else(|| Refusal(DriverError::new(ErrorCode::Unimplemented, "this driver is no provider driver")))
}

async fn describe(State(driver): State<Driver>) -> Json<Describe> {
    Json(driver.describe())
}

async fn acquire(State(driver): State<Driver>, body: axum::body::Bytes) -> Result<Json<Machine>, Refusal> {
    let request: AcquireRequest = parse(&body)?;
    check_acquire(&request)?;
    Ok(Json(provider(&driver)?.acquire(request).await?))
}

async fn list(State(driver): State<Driver>, body: axum::body::Bytes) -> Result<Json<Machines>, Refusal> {
    let request: ListRequest = parse(&body)?;
    Ok(Json(Machines { machines: provider(&driver)?.list(request).await? }))
}

async fn release(State(driver): State<Driver>, body: axum::body::Bytes) -> Result<Json<Machine>, Refusal> {
    let request: ReleaseRequest = parse(&body)?;
    if request.machine_id.is_empty() || request.machine_id.len() > 256 {
        return Err(Refusal(DriverError::invalid("machineId: 1 to 256 characters")));
    }
    Ok(Json(provider(&driver)?.release(request).await?))
}

fn bmc(driver: &Driver) -> Result<&Arc<dyn BmcDriver>, Refusal> {
    driver
        .bmc
        .as_ref()
        .ok_or_else(|| Refusal(DriverError::new(ErrorCode::Unimplemented, "this driver carries no power or boot")))
}

fn check_bmc(target: &BmcTarget) -> Result<(), Refusal> {
    if target.address.is_empty() || target.address.len() > 2048 {
        return Err(Refusal(DriverError::invalid("bmc.address: 1 to 2048 characters")));
    }
    Ok(())
}

async fn power_state(State(driver): State<Driver>, body: axum::body::Bytes) -> Result<Json<PowerAnswer>, Refusal> {
    let request: PowerStateRequest = parse(&body)?;
    check_bmc(&request.bmc)?;
    Ok(Json(PowerAnswer { power: bmc(&driver)?.power_state(request).await? }))
}

async fn set_power(State(driver): State<Driver>, body: axum::body::Bytes) -> Result<Json<PowerAnswer>, Refusal> {
    let request: PowerRequest = parse(&body)?;
    check_bmc(&request.bmc)?;
    Ok(Json(PowerAnswer { power: bmc(&driver)?.set_power(request).await? }))
}

async fn set_boot(State(driver): State<Driver>, body: axum::body::Bytes) -> Result<Json<BootAnswer>, Refusal> {
    let request: BootRequest = parse(&body)?;
    check_bmc(&request.bmc)?;
    let device = request.device;
    bmc(&driver)?.set_boot(request).await?;
    Ok(Json(BootAnswer { device }))
}

/// The protocol's routes over `driver`.
pub fn router(driver: Driver) -> Router {
    Router::new()
        .route("/bcx/v1/describe", get(describe))
        .route("/bcx/v1/provider/acquire", post(acquire))
        .route("/bcx/v1/provider/list", post(list))
        .route("/bcx/v1/provider/release", post(release))
        .route("/bcx/v1/power/state", post(power_state))
        .route("/bcx/v1/power/set", post(set_power))
        .route("/bcx/v1/boot/set", post(set_boot))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(driver)
}

/// Serves `driver` on `listener` over mutual TLS (`tls`: the driver's certificate, and the CA whose certificates
/// it accepts from callers) until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: &crate::tls::Identity,
    driver: Driver,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = crate::tls::TlsListener::new(listener, tls.mutual_server_config()?)?;
    crate::tls::serve_http(listener, router(driver), crate::tls::REQUEST_HEAD_TIMEOUT, shutdown).await?;
    Ok(())
}
