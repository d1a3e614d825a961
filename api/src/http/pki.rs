//! `/v1/pki/*`: what anyone may fetch of the control plane's PKI: the CA certificate (what nodes and clients
//! pin), the revocation list of node certificates (signed by that CA) and the public key that signs the audit
//! checkpoints (what auditors pin). All are public by nature.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::error::ErrorBody;
use super::{ApiError, AppState};
use crate::wire::audit::AuditKeyDto;

fn no_pki() -> ApiError {
    ApiError::not_found("pki", "bundle")
        .with_details(serde_json::json!({ "reason": "this control plane serves without a PKI bundle" }))
}

/// `GET /v1/pki/ca.crt`: the CA certificate, PEM.
#[utoipa::path(
    get,
    path = "/v1/pki/ca.crt",
    tag = "pki",
    summary = "The CA certificate that signs the server's and every node's certificate (PEM)",
    responses((status = 200, description = "The CA certificate", content_type = "application/x-pem-file", body = String), (status = 404, description = "The control plane serves without a PKI bundle", body = ErrorBody)),
)]
pub async fn ca_certificate(State(state): State<AppState>) -> Result<Response, ApiError> {
    let bundle = state.app.pki().ok_or_else(no_pki)?;
    Ok(([(header::CONTENT_TYPE, "application/x-pem-file")], bundle.ca_pem().to_owned()).into_response())
}

/// `GET /v1/pki/crl`: the node certificates revoked and not yet expired, as a revocation list the CA signed.
#[utoipa::path(
    get,
    path = "/v1/pki/crl",
    tag = "pki",
    summary = "The revocation list of node certificates (DER, signed by the CA); TLS handshakes refuse what it names",
    responses((status = 200, description = "The revocation list", content_type = "application/pkix-crl", body = String), (status = 404, description = "The control plane serves without a PKI bundle", body = ErrorBody)),
)]
pub async fn revocation_list(State(state): State<AppState>) -> Result<Response, ApiError> {
    let crl = state.app.revocation_list().await?.ok_or_else(no_pki)?;
    Ok(([(header::CONTENT_TYPE, "application/pkix-crl")], crl).into_response())
}

/// `GET /v1/pki/audit-key`: the Ed25519 public key that signs the audit checkpoints.
#[utoipa::path(
    get,
    path = "/v1/pki/audit-key",
    tag = "pki",
    summary = "The Ed25519 public key that signs the audit checkpoints (what `better-compute audit verify` pins)",
    responses((status = 200, description = "The audit key", body = AuditKeyDto), (status = 404, description = "The control plane serves without a PKI bundle", body = ErrorBody)),
)]
pub async fn audit_key(State(state): State<AppState>) -> Result<Json<AuditKeyDto>, ApiError> {
    let signer = state.app.audit_signer().ok_or_else(no_pki)?;
    Ok(Json(AuditKeyDto { algorithm: "ed25519".into(), public_key: signer.public_key_hex() }))
}
