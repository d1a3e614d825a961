//! Provider accounts: how a tenant reaches an external capacity API that lends it machines. An account names the
//! provider's kind, where it answers and the settings its driver reads; its credential is a sealed secret of the
//! account (never in an event). `provider` pools name the account that backs them.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::Rejection;
use crate::domain_events;
use crate::id::{ProviderAccountId, TenantId};

/// The providers this build has a driver for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderKind {
    /// Another Better Compute deployment, reached through its API with one of its tenants' tokens.
    BetterCompute,
}

impl ProviderKind {
    pub const ALL: [ProviderKind; 1] = [ProviderKind::BetterCompute];

    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::BetterCompute => "better-compute",
        }
    }
}

impl fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ProviderKind {
    type Err = Rejection;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ProviderKind::ALL.into_iter().find(|k| k.as_str() == s).ok_or_else(|| {
            let known: Vec<&str> = ProviderKind::ALL.iter().map(|k| k.as_str()).collect();
            Rejection::invalid("provider", format!("{s:?} is not a provider this build drives ({})", known.join(", ")))
        })
    }
}

/// The most settings an account may carry, and their sizes.
pub const MAX_SETTINGS: usize = 32;
pub const MAX_SETTING_KEY: usize = 64;
pub const MAX_SETTING_VALUE: usize = 1024;
/// The longest endpoint URL and credential.
pub const MAX_ENDPOINT: usize = 2048;
pub const MAX_CREDENTIAL: usize = 8192;

/// What an account is, apart from its credential.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderAccountSpec {
    pub name: String,
    pub provider: ProviderKind,
    /// Where the provider's API answers: an `https://` URL (`http://` only on a loopback address).
    pub endpoint: String,
    /// What the provider's driver reads besides the credential (for `better-compute`, the remote pool to borrow
    /// from: `poolId`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub settings: BTreeMap<String, String>,
}

impl ProviderAccountSpec {
    /// Checks every field, naming the first that is wrong.
    pub fn check(&self) -> Result<(), Rejection> {
        crate::site::check_name("name", &self.name)?;
        check_endpoint(&self.endpoint)?;
        if self.settings.len() > MAX_SETTINGS {
            return Err(Rejection::invalid("settings", format!("at most {MAX_SETTINGS} settings")));
        }
        for (key, value) in &self.settings {
            let key_ok = !key.is_empty()
                && key.len() <= MAX_SETTING_KEY
                && key.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !key_ok {
                return Err(Rejection::invalid(
                    "settings",
                    format!("keys are 1 to {MAX_SETTING_KEY} letters, digits, '-', '_' or '.'"),
                ));
            }
            if value.len() > MAX_SETTING_VALUE || value.chars().any(char::is_control) {
                return Err(Rejection::invalid(
                    format!("settings.{key}"),
                    format!("must be at most {MAX_SETTING_VALUE} bytes without control characters"),
                ));
            }
        }
        match self.provider {
            ProviderKind::BetterCompute => {
                if let Some(pool) = self.settings.get("poolId")
                    && !pool.starts_with("pool_")
                {
                    return Err(Rejection::invalid(
                        "settings.poolId",
                        "names the remote pool to borrow from (pool_...)",
                    ));
                }
            }
        }
        Ok(())
    }
}

/// An endpoint: `https://host[:port][/path]`, or `http://` on a loopback host (a deployment on the same machine).
pub fn check_endpoint(endpoint: &str) -> Result<(), Rejection> {
    let bad = |why: &str| Err(Rejection::invalid("endpoint", why.to_owned()));
    if endpoint.len() > MAX_ENDPOINT || endpoint.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return bad("must be a URL of at most 2048 characters, without spaces");
    }
    let (scheme, rest) = match endpoint.split_once("://") {
        Some(parts) => parts,
        None => return bad("must be an https:// URL"),
    };
    let host_port = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if host_port.is_empty() || host_port.contains('@') {
        return bad("must name a host (and no user information)");
    }
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host_port.rsplit_once(':').map_or(host_port, |(host, _)| host),
    };
    match scheme {
        "https" => Ok(()),
        "http" if matches!(host, "127.0.0.1" | "localhost" | "::1") => Ok(()),
        "http" => bad("must be https:// (plain http only to a loopback address)"),
        _ => bad("must be an https:// URL"),
    }
}

/// An account as created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderAccountCreated {
    pub account_id: ProviderAccountId,
    pub tenant_id: TenantId,
    pub spec: ProviderAccountSpec,
    pub at_ms: i64,
}

/// The account's credential was replaced (the sealed secret changed with this event's transaction).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderAccountCredentialRotated {
    pub account_id: ProviderAccountId,
    pub at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderAccountDeleted {
    pub account_id: ProviderAccountId,
    pub at_ms: i64,
}

domain_events! {
    /// Events of a provider account's stream.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub enum ProviderAccountEvent {
        Created(ProviderAccountCreated) = "provider_account.created",
        CredentialRotated(ProviderAccountCredentialRotated) = "provider_account.credential_rotated",
        Deleted(ProviderAccountDeleted) = "provider_account.deleted",
    }
}

impl ProviderAccountEvent {
    pub fn account_id(&self) -> &ProviderAccountId {
        match self {
            ProviderAccountEvent::Created(e) => &e.account_id,
            ProviderAccountEvent::CredentialRotated(e) => &e.account_id,
            ProviderAccountEvent::Deleted(e) => &e.account_id,
        }
    }
}

/// An account as its events left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderAccount {
    pub id: ProviderAccountId,
    pub tenant_id: TenantId,
    pub spec: ProviderAccountSpec,
    pub created_at_ms: i64,
    /// When its credential was last replaced (its creation, at first).
    pub credential_at_ms: i64,
    pub deleted_at_ms: Option<i64>,
}

pub fn evolve_provider_account(
    state: Option<ProviderAccount>,
    event: &ProviderAccountEvent,
) -> Option<ProviderAccount> {
    match (state, event) {
        (None, ProviderAccountEvent::Created(e)) => Some(ProviderAccount {
            id: e.account_id.clone(),
            tenant_id: e.tenant_id.clone(),
            spec: e.spec.clone(),
            created_at_ms: e.at_ms,
            credential_at_ms: e.at_ms,
            deleted_at_ms: None,
        }),
        (Some(account), ProviderAccountEvent::CredentialRotated(e)) => {
            Some(ProviderAccount { credential_at_ms: e.at_ms, ..account })
        }
        (Some(account), ProviderAccountEvent::Deleted(e)) => {
            Some(ProviderAccount { deleted_at_ms: Some(e.at_ms), ..account })
        }
        (state, _) => state,
    }
}

/// Checks a credential: non-empty, bounded, printable (a token, or a key in PEM).
pub fn check_credential(credential: &str) -> Result<(), Rejection> {
    if credential.is_empty()
        || credential.len() > MAX_CREDENTIAL
        || credential.chars().any(|c| c.is_control() && c != '\n' && c != '\r')
    {
        return Err(Rejection::invalid("credential", format!("must be 1 to {MAX_CREDENTIAL} bytes of printable text")));
    }
    Ok(())
}

/// `provider_accounts.create`: a new account, its name free in its tenant (`name_taken`).
pub fn create_provider_account(
    account_id: &ProviderAccountId,
    tenant_id: &TenantId,
    spec: ProviderAccountSpec,
    credential: &str,
    name_taken: bool,
    now_ms: i64,
) -> Result<Vec<ProviderAccountEvent>, Rejection> {
    spec.check()?;
    check_credential(credential)?;
    if name_taken {
        return Err(Rejection::Conflict(format!(
            "tenant {tenant_id} already has a provider account named {:?}",
            spec.name
        )));
    }
    Ok(vec![ProviderAccountEvent::Created(ProviderAccountCreated {
        account_id: account_id.clone(),
        tenant_id: tenant_id.clone(),
        spec,
        at_ms: now_ms,
    })])
}

/// `provider_accounts.credential.rotate`: a live account's credential replaced.
pub fn rotate_credential(
    account: &ProviderAccount,
    credential: &str,
    now_ms: i64,
) -> Result<Vec<ProviderAccountEvent>, Rejection> {
    check_credential(credential)?;
    if account.deleted_at_ms.is_some() {
        return Err(Rejection::NotFound { kind: "provider account", id: account.id.to_string() });
    }
    Ok(vec![ProviderAccountEvent::CredentialRotated(ProviderAccountCredentialRotated {
        account_id: account.id.clone(),
        at_ms: now_ms,
    })])
}

/// `provider_accounts.delete`: refused while pools name the account (`pools`, the first few).
pub fn delete_provider_account(
    account: &ProviderAccount,
    pools: &[String],
    now_ms: i64,
) -> Result<Vec<ProviderAccountEvent>, Rejection> {
    if account.deleted_at_ms.is_some() {
        return Err(Rejection::NotFound { kind: "provider account", id: account.id.to_string() });
    }
    if !pools.is_empty() {
        return Err(Rejection::Conflict(format!(
            "provider account {} backs pool(s) {}: delete them first",
            account.id,
            pools.join(", ")
        )));
    }
    Ok(vec![ProviderAccountEvent::Deleted(ProviderAccountDeleted { account_id: account.id.clone(), at_ms: now_ms })])
}

#[cfg(test)]
mod tests;
