//! The built-in provider driver `better-compute`: borrows GPUs from another Better Compute deployment. An
//! account's endpoint is the lending deployment's URL, its credential a bearer token of a tenant there, and its
//! setting `poolId` the lending pool. A machine is one reservation there (its GPUs on one node, held from now
//! for the asked duration, binding `hold`); the key is the reservation's idempotency key, so a retry finds it.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde_json::{Value, json};

use crate::protocol::{
    Account, AcquireRequest, DriverError, ErrorCode, ListRequest, Machine, MachineGpu, MachineState, ReleaseRequest,
};
use crate::server::{DriverFuture, ProviderDriver};

/// The driver's name, as provider accounts are bound to it.
pub const NAME: &str = "better-compute";

/// Calls lending deployments; trusts only the CAs it was given (and plain HTTP on loopback addresses, which the
/// account's endpoint check allows).
#[derive(Debug)]
pub struct BetterCompute {
    http: reqwest::Client,
    /// The GPU model of each lending pool, by endpoint and pool.
    models: Mutex<BTreeMap<(String, String), String>>,
}

impl BetterCompute {
    /// A driver trusting the lending deployments whose CA certificates (PEM, one or more) `trusted` holds.
    pub fn new(trusted: Option<&str>) -> anyhow::Result<BetterCompute> {
        let tls = match trusted {
            Some(pem) => bc_pki::tls::client_config(pem, None)?,
            None => bc_pki::tls::plain_http_client_config()?,
        };
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .timeout(std::time::Duration::from_secs(30))
            .build()?;
        Ok(BetterCompute { http, models: Mutex::new(BTreeMap::new()) })
    }

    /// One call to the lending deployment; a refusal says whether it was `409 CONFLICT` (the state changed under
    /// the call), and `?` makes it the driver's error.
    async fn remote(
        &self,
        account: &Account,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> Result<Value, Refused> {
        let url = format!("{}{path}", account.endpoint.trim_end_matches('/'));
        let mut request = self.http.request(method, &url).bearer_auth(&account.credential);
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(|err| Refused {
            conflict: false,
            error: DriverError::unavailable(format!("{}: {err}", account.endpoint)),
        })?;
        let status = response.status().as_u16();
        let answer: Value = response.json().await.unwrap_or(Value::Null);
        if (200..300).contains(&status) {
            return Ok(answer);
        }
        let code = answer["error"]["code"].as_str().unwrap_or_default();
        let message = format!("the lending deployment answered {status} {code}: {}", answer["error"]["message"]);
        let error = DriverError::new(
            match (status, code) {
                (401 | 403, _) => ErrorCode::Unauthenticated,
                (404, _) => ErrorCode::NotFound,
                (409, "CAPACITY_UNAVAILABLE" | "QUOTA_EXCEEDED") => ErrorCode::CapacityUnavailable,
                (400..=499, _) => ErrorCode::InvalidArgument,
                _ => ErrorCode::Unavailable,
            },
            message,
        );
        Err(Refused { conflict: (status, code) == (409, "CONFLICT"), error })
    }

    fn pool(account: &Account) -> Result<&str, DriverError> {
        account
            .settings
            .get("poolId")
            .map(String::as_str)
            .ok_or_else(|| DriverError::invalid("settings.poolId: the lending pool to borrow from"))
    }

    /// The lending pool's GPU model: the account's setting `gpuModel`, or the pool's as the lender shows it (read
    /// once; `other` while the lender cannot show it yet).
    async fn model(&self, account: &Account) -> Result<String, DriverError> {
        if let Some(model) = account.settings.get("gpuModel") {
            return Ok(model.clone());
        }
        let pool = Self::pool(account)?;
        let key = (account.endpoint.clone(), pool.to_owned());
        if let Some(model) = self.models.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(model);
        }
        let path = format!("/v1/pools/{pool}");
        let Ok(answer) = self.remote(account, reqwest::Method::GET, &path, None, None).await else {
            return Ok("other".to_owned());
        };
        let model = answer["gpuModel"].as_str().unwrap_or("other").to_owned();
        if let Ok(mut models) = self.models.lock() {
            models.insert(key, model.clone());
        }
        Ok(model)
    }

    async fn reservation(&self, account: &Account, id: &str) -> Result<Value, DriverError> {
        Ok(self.remote(account, reqwest::Method::GET, &format!("/v1/reservations/{id}"), None, None).await?)
    }
}

/// A lending reservation as a machine.
fn machine(reservation: &Value, model: &str) -> Machine {
    let state = match reservation["state"].as_str().unwrap_or_default() {
        "placed" | "binding" | "active" => MachineState::Ready,
        "releasing" | "released" | "cancelled" | "expired" => MachineState::Released,
        "denied" | "failed" => MachineState::Failed,
        _ => MachineState::Acquiring,
    };
    let gpus = match state {
        MachineState::Ready => reservation["allocations"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|a| a["devices"].as_array().into_iter().flatten())
            .filter_map(Value::as_str)
            .map(|device| MachineGpu { id: device.to_owned(), model: model.to_owned(), memory_mib: 0 })
            .collect(),
        _ => Vec::new(),
    };
    Machine {
        id: reservation["id"].as_str().unwrap_or_default().to_owned(),
        state,
        gpus,
        until_ms: reservation["end"].as_i64(),
        detail: reservation["outcome"].as_str().map(str::to_owned),
    }
}

impl ProviderDriver for BetterCompute {
    fn acquire(&self, request: AcquireRequest) -> DriverFuture<'_, Machine> {
        Box::pin(async move {
            let account = &request.account;
            let pool = Self::pool(account)?;
            let model = account.settings.get("gpuModel").cloned().unwrap_or_else(|| request.gpu_model.clone());
            let body = json!({
                "poolId": pool,
                "devices": { "class": "gpu", "count": request.gpus },
                "duration": request.duration_s,
            });
            let reserved =
                self.remote(account, reqwest::Method::POST, "/v1/reservations", Some(&request.key), Some(body)).await?;
            Ok(machine(&reserved, &model))
        })
    }

    fn list(&self, request: ListRequest) -> DriverFuture<'_, Vec<Machine>> {
        Box::pin(async move {
            let account = &request.account;
            let pool = Self::pool(account)?;
            let model = self.model(account).await?;
            let mut machines = Vec::new();
            let mut cursor: Option<String> = None;
            for _ in 0..20 {
                let mut path = format!("/v1/reservations?poolId={pool}&limit=500");
                if let Some(cursor) = &cursor {
                    path.push_str(&format!("&cursor={cursor}"));
                }
                let page = self.remote(account, reqwest::Method::GET, &path, None, None).await?;
                machines.extend(page["items"].as_array().into_iter().flatten().map(|r| machine(r, &model)));
                match page["nextCursor"].as_str() {
                    Some(next) => cursor = Some(next.to_owned()),
                    None => break,
                }
            }
            Ok(machines)
        })
    }

    fn release(&self, request: ReleaseRequest) -> DriverFuture<'_, Machine> {
        Box::pin(async move {
            let account = &request.account;
            let id = &request.machine_id;
            if !id.starts_with("rsv_") || id.contains(['/', '?', '#']) {
                return Err(DriverError::new(ErrorCode::NotFound, format!("no machine {id}")));
            }
            let model = self.model(account).await?;
            let held = self.reservation(account, id).await?;
            let verb = match held["state"].as_str().unwrap_or_default() {
                "pending" | "placed" | "awaiting-confirmation" => "cancel",
                "binding" | "active" => "release",
                _ => return Ok(machine(&held, &model)),
            };
            let end = |verb: &'static str| {
                let path = format!("/v1/reservations/{id}/{verb}");
                async move { self.remote(account, reqwest::Method::POST, &path, None, Some(json!({}))).await }
            };
            // The state read can be a moment old: a reservation read as placed may have started since (cancel is
            // then refused, release is what ends it), or one read as active may have ended. A conflict means the
            // state moved under the call: the other verb, then what the reservation is now.
            let other = if verb == "cancel" { "release" } else { "cancel" };
            let conflict = match end(verb).await {
                Ok(ended) => return Ok(machine(&ended, &model)),
                Err(refused) if refused.conflict => refused,
                Err(refused) => return Err(refused.error),
            };
            let conflict = match end(other).await {
                Ok(ended) => return Ok(machine(&ended, &model)),
                Err(refused) if refused.conflict => refused,
                Err(_) => conflict,
            };
            let now = machine(&self.reservation(account, id).await?, &model);
            match now.state {
                MachineState::Released => Ok(now),
                _ => Err(conflict.error),
            }
        })
    }
}

/// A call the lender refused: the error the driver answers, and whether it was `409 CONFLICT`.
struct Refused {
    conflict: bool,
    error: DriverError,
}

impl From<Refused> for DriverError {
    fn from(refused: Refused) -> Self {
        refused.error
    }
}
