//! Images on the wire.

#[cfg(feature = "server")]
use bc_commands::images::ImageView;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// An image: a signed, content-addressed artifact, immutable once stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageDto {
    pub id: String,
    pub tenant_id: String,
    pub name: String,
    pub version: String,
    /// `raw`, `qcow2` or `iso`.
    pub format: String,
    /// The SHA-256 of its bytes, lower-case hex: what its content is addressed by.
    pub sha256: String,
    pub size_bytes: u64,
    /// `private` (its tenant's) or `public` (every tenant's, published by the platform).
    pub visibility: String,
    /// Whether an allow-listed signer's signature over its SHA-256 checked out.
    pub verified: bool,
    /// The signer whose signature verified it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
    pub created_at: i64,
}

#[cfg(feature = "server")]
impl From<&ImageView> for ImageDto {
    fn from(image: &ImageView) -> Self {
        ImageDto {
            id: image.id.to_string(),
            tenant_id: image.tenant_id.to_string(),
            name: image.name.clone(),
            version: image.version.clone(),
            format: image.format.as_str().to_owned(),
            sha256: image.sha256.clone(),
            size_bytes: image.size_bytes,
            visibility: image.visibility.as_str().to_owned(),
            verified: image.verified(),
            signer: image.signer.clone(),
            created_at: image.created_at_ms,
        }
    }
}

/// `POST /v1/images?...`: what the upload's body is. The body itself is the image's bytes
/// (`application/octet-stream`).
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UploadParams {
    /// 1 to 64 of a-z, 0-9, `.`, `_` and `-`, starting with a letter or a digit.
    #[param(min_length = 1, max_length = 64, pattern = "^[a-z0-9][a-z0-9._-]*$")]
    pub name: String,
    /// 1 to 64 of letters, digits, `.`, `_`, `+` and `-`, starting with a letter or a digit.
    #[param(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9][A-Za-z0-9._+-]*$")]
    pub version: String,
    /// `raw`, `qcow2` or `iso`.
    #[param(value_type = String, pattern = "^(raw|qcow2|iso)$")]
    pub format: bc_domain::image::ImageFormat,
    /// `private` (the default) or `public` (every tenant's: needs `images.publish`).
    #[param(value_type = Option<String>, pattern = "^(private|public)$")]
    pub visibility: Option<bc_domain::image::Visibility>,
    /// The SHA-256 the bytes must have, 64 lower-case hex digits; other bytes are refused and nothing is kept.
    #[param(pattern = "^[0-9a-f]{64}$")]
    pub sha256: String,
    /// The size the bytes must have (taken from `Content-Length` when absent).
    #[param(minimum = 1)]
    pub size: Option<u64>,
    /// The allow-listed signer of `signature` (any signer in the allowlist is tried when absent).
    #[param(max_length = 64)]
    pub signer: Option<String>,
    /// A detached Ed25519 signature over the 32-byte SHA-256, 128 hex digits. The image is `verified` when it
    /// checks out; one that does not is refused.
    #[param(pattern = "^[0-9a-fA-F]{128}$")]
    pub signature: Option<String>,
}
