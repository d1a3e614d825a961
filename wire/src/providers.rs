//! Provider accounts.

use std::collections::BTreeMap;

#[cfg(feature = "server")]
use bc_commands::providers::ProviderAccountView;
use bc_domain::Rejection;
use bc_domain::provider::ProviderAccountSpec;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The body of `POST /v1/provider-accounts`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProviderAccountBody {
    /// Unique in the tenant: 1 to 128 printable characters.
    pub name: String,
    /// The provider's kind: `better-compute` (another Better Compute deployment).
    #[schema(example = "better-compute")]
    pub provider: String,
    /// Where the provider's API answers: an `https://` URL (`http://` only on a loopback address).
    #[schema(example = "https://compute.partner.example")]
    pub endpoint: String,
    /// The secret the driver presents to the provider (for `better-compute`, a bearer token of a tenant there).
    /// Sealed with the PKI bundle's key, never shown again.
    #[schema(example = "bc_...")]
    pub credential: String,
    /// What the driver reads besides the credential (for `better-compute`: `poolId`, the remote pool to borrow
    /// from), at most 32.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
}

impl ProviderAccountBody {
    /// The account's spec and credential, naming the field that is wrong.
    pub fn spec(self) -> Result<(ProviderAccountSpec, String), Rejection> {
        let provider = self.provider.parse()?;
        let spec = ProviderAccountSpec { name: self.name, provider, endpoint: self.endpoint, settings: self.settings };
        Ok((spec, self.credential))
    }
}

/// The body of `POST /v1/provider-accounts/{id}/credential`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CredentialBody {
    /// The new secret; the old one is gone once this answers.
    pub credential: String,
}

/// A provider account: everything but its credential.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderAccountDto {
    pub id: String,
    pub tenant_id: String,
    pub name: String,
    pub provider: String,
    pub endpoint: String,
    pub settings: BTreeMap<String, String>,
    pub created_at: i64,
    /// When its credential was last set (epoch milliseconds).
    pub credential_set_at: i64,
}

#[cfg(feature = "server")]
impl From<&ProviderAccountView> for ProviderAccountDto {
    fn from(a: &ProviderAccountView) -> Self {
        ProviderAccountDto {
            id: a.id.to_string(),
            tenant_id: a.tenant_id.to_string(),
            name: a.name.clone(),
            provider: a.provider.as_str().to_owned(),
            endpoint: a.endpoint.clone(),
            settings: a.settings.clone(),
            created_at: a.created_at_ms,
            credential_set_at: a.credential_at_ms,
        }
    }
}
