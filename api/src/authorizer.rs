//! An authorizer that asks an external decision service over HTTP (a deployment that runs Better IAM, or its
//! own policy engine), chosen with `serve --authorizer-url`. Two calls, both `POST` with JSON:
//!
//! - `{url}/authenticate` with `{"token": "..."}`: `200` with the principal (`tenantId`, `identity`,
//!   `sessionKind`, and optionally `agent`, `delegation`, `ancestors`), or `401` for a token it does not know.
//! - `{url}/decide` with `{"principal", "method", "action", "resource"}` (the resource as Better Compute resolved
//!   it from its own tables: `type`, `id`, `tenantId`, `attributes`, and for nodes and reservations the parent
//!   pool with its owner, offerings and attributes): `200` with `{"decision": "allow" | "deny" | "not_found" |
//!   "suspended", "reason": "..."}`.
//!
//! It fails closed: an answer that does not come within two seconds, or that is not one of these, is a refusal
//! that says the decision service did not answer, logged with the cause. Tenants are administered there, not
//! through this API.

use std::collections::BTreeMap;
use std::time::Duration;

use bc_commands::auth::{Attribute, Authorizer, Decision, MethodSpec, PoolFacts, Principal, Resource};
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// How long one call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The external authorizer.
#[derive(Debug, Clone)]
pub struct HttpAuthorizer {
    url: String,
    client: reqwest::Client,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PrincipalDto {
    tenant_id: String,
    identity: String,
    #[serde(default = "user")]
    session_kind: String,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    delegation: Option<String>,
    #[serde(default)]
    ancestors: Vec<String>,
}

fn user() -> String {
    "user".to_owned()
}

#[derive(Debug, Deserialize)]
struct DecisionDto {
    decision: String,
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PrincipalOut<'a> {
    tenant_id: &'a str,
    identity: &'a str,
    session_kind: &'a str,
    agent: Option<&'a str>,
    delegation: Option<&'a str>,
    ancestors: Vec<&'a str>,
}

fn attributes(attributes: &BTreeMap<String, Attribute>) -> Value {
    attributes
        .iter()
        .map(|(name, value)| {
            let value = match value {
                Attribute::Absent => Value::Null,
                Attribute::Bool(b) => json!(b),
                Attribute::Number(n) => json!(n),
                Attribute::Text(t) => json!(t),
            };
            (name.clone(), value)
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn pool(prefix: &str, facts: &PoolFacts) -> Value {
    json!({
        "type": format!("{prefix}pool"),
        "id": facts.id.as_str(),
        "ownerTenantId": facts.owner_tenant_id.as_str(),
        "offers": facts.offers.iter().map(|(t, d)| json!({ "tenantId": t.as_str(), "includeDescendants": d })).collect::<Vec<_>>(),
        "attributes": attributes(&facts.attributes),
    })
}

impl HttpAuthorizer {
    /// An authorizer calling `url` (`http://` for a sidecar on the same host, or `https://` trusting the CA in
    /// `ca_pem`).
    pub fn new(url: &str, ca_pem: Option<&str>) -> anyhow::Result<Self> {
        let url = url.trim_end_matches('/').to_owned();
        let tls = match (url.split_once("://").map(|(scheme, _)| scheme), ca_pem) {
            (Some("https"), Some(ca)) => bc_pki::tls::client_config(ca, None)?,
            (Some("https"), None) => {
                anyhow::bail!("--authorizer-url {url} is https: give the CA it chains to with --authorizer-ca")
            }
            (Some("http"), _) => bc_pki::tls::plain_http_client_config()?,
            _ => anyhow::bail!("--authorizer-url {url:?} must start with http:// or https://"),
        };
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .timeout(CALL_TIMEOUT)
            .connect_timeout(CALL_TIMEOUT)
            .build()?;
        Ok(HttpAuthorizer { url, client })
    }

    async fn post(&self, path: &str, body: &impl Serialize) -> Result<(u16, Value), String> {
        let response = self
            .client
            .post(format!("{}{path}", self.url))
            .json(body)
            .send()
            .await
            .map_err(|err| format!("{path}: {err}"))?;
        let status = response.status().as_u16();
        let body = response.json::<Value>().await.unwrap_or(Value::Null);
        Ok((status, body))
    }

    async fn authenticate_now(&self, token: &str) -> Option<Principal> {
        match self.post("/authenticate", &json!({ "token": token })).await {
            Ok((200, body)) => match serde_json::from_value::<PrincipalDto>(body) {
                Ok(p) => {
                    let ancestors = p.ancestors.iter().map(|t| t.parse()).collect::<Result<Vec<_>, _>>();
                    match (p.tenant_id.parse(), p.identity.parse(), ancestors) {
                        (Ok(tenant_id), Ok(identity), Ok(ancestors)) => Some(Principal {
                            tenant_id,
                            identity,
                            session_kind: p.session_kind,
                            agent: p.agent,
                            delegation: p.delegation,
                            ancestors,
                        }),
                        _ => {
                            tracing::warn!("the decision service answered a principal with a malformed id");
                            None
                        }
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, "the decision service answered /authenticate with another shape");
                    None
                }
            },
            Ok((401 | 403 | 404, _)) => None,
            Ok((status, _)) => {
                tracing::warn!(status, "the decision service did not authenticate; refusing");
                None
            }
            Err(err) => {
                tracing::warn!(error = %err, "the decision service did not answer; refusing");
                None
            }
        }
    }

    async fn decide_now(&self, principal: &Principal, method: &MethodSpec, resource: &Resource) -> Decision {
        let prefix = self.prefix();
        let mut out = json!({
            "type": format!("{prefix}{}", resource.target.type_name()),
            "id": resource.id,
            "tenantId": resource.tenant_id.as_str(),
            "attributes": attributes(&resource.attributes),
        });
        if let Some(facts) = &resource.pool {
            out["parent"] = pool(prefix, facts);
        }
        let principal_out = PrincipalOut {
            tenant_id: principal.tenant_id.as_str(),
            identity: principal.identity.as_str(),
            session_kind: &principal.session_kind,
            agent: principal.agent.as_deref(),
            delegation: principal.delegation.as_deref(),
            ancestors: principal.ancestors.iter().map(|t| t.as_str()).collect(),
        };
        let body =
            json!({ "principal": principal_out, "method": method.method, "action": method.action, "resource": out });
        let unanswered = |why: String| {
            tracing::warn!(method = method.method, why, "the decision service did not decide; refusing");
            Decision::Deny(format!("the decision service did not decide {}: refused", method.method))
        };
        match self.post("/decide", &body).await {
            Ok((200, body)) => match serde_json::from_value::<DecisionDto>(body) {
                Ok(d) => {
                    let reason = d.reason.unwrap_or_else(|| format!("{} was refused", method.method));
                    match d.decision.as_str() {
                        "allow" => Decision::Allow,
                        "not_found" => Decision::NotFound,
                        "deny" => Decision::Deny(reason),
                        "suspended" => Decision::Suspended(reason),
                        other => unanswered(format!("an unknown decision {other:?}")),
                    }
                }
                Err(err) => unanswered(err.to_string()),
            },
            Ok((status, _)) => unanswered(format!("status {status}")),
            Err(err) => unanswered(err),
        }
    }
}

impl Authorizer for HttpAuthorizer {
    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Option<Principal>> {
        Box::pin(self.authenticate_now(token))
    }

    fn decide<'a>(
        &'a self,
        principal: &'a Principal,
        method: &'a MethodSpec,
        resource: &'a Resource,
    ) -> BoxFuture<'a, Decision> {
        Box::pin(self.decide_now(principal, method, resource))
    }
}
