//! rustls configurations for both ends, each trusting only the bundle's CA.
//!
//! The server asks every client for a certificate but does not require one: people and programs use bearer
//! tokens, nodes present the certificate the CA signed at their join. Whether a route needs a node
//! certificate is decided above TLS, where the node's credential is checked.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::bundle::Bundle;
use crate::error::PkiError;

/// The crypto provider every configuration uses (ring).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes ring the process's default crypto provider, for TLS clients built without a configuration of their
/// own (reqwest's, when it speaks to an `http://` address). The binaries call it first thing; a second call
/// changes nothing.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client configuration that trusts no server at all: for clients that only ever speak plain HTTP, so that
/// an `https://` address fails instead of trusting the system's roots.
pub fn plain_http_client_config() -> Result<ClientConfig, PkiError> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|err| PkiError::Tls(err.to_string()))?
        .with_root_certificates(RootCertStore::empty())
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Every certificate of a PEM text.
pub fn certificates(pem: &str) -> Result<Vec<CertificateDer<'static>>, PkiError> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| PkiError::InvalidCertificate(format!("PEM: {err}")))
}

/// The private key of a PEM text.
pub fn private_key(pem: &str) -> Result<PrivateKeyDer<'static>, PkiError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes())
        .map_err(|err| PkiError::InvalidCertificate(format!("private key: {err}")))
}

fn roots(ca_pem: &str) -> Result<RootCertStore, PkiError> {
    let mut roots = RootCertStore::empty();
    let certs = certificates(ca_pem)?;
    if certs.is_empty() {
        return Err(PkiError::InvalidCertificate("no CA certificate in the PEM text".into()));
    }
    for cert in certs {
        roots.add(cert).map_err(|err| PkiError::InvalidCertificate(format!("CA certificate: {err}")))?;
    }
    Ok(roots)
}

/// The server's configuration: the bundle's server certificate (or `certificate`, a chain and key in PEM the
/// operator got elsewhere), client certificates verified against the bundle's CA when a client offers one.
/// HTTP/1.1 only, as the API serves.
pub fn server_config(bundle: &Bundle, certificate: Option<(&str, &str)>) -> Result<Arc<ServerConfig>, PkiError> {
    server_config_with_crl(bundle, certificate, None)
}

/// [`server_config`] refusing, at the handshake, the client certificates the revocation list `crl` (DER,
/// signed by the bundle's CA) names.
pub fn server_config_with_crl(
    bundle: &Bundle,
    certificate: Option<(&str, &str)>,
    crl: Option<&[u8]>,
) -> Result<Arc<ServerConfig>, PkiError> {
    let provider = provider();
    let mut verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots(bundle.ca_pem())?), provider.clone())
        .allow_unauthenticated();
    if let Some(crl) = crl {
        verifier = verifier
            .with_crls([rustls_pki_types::CertificateRevocationListDer::from(crl.to_vec())])
            .only_check_end_entity_revocation();
    }
    let verifier = verifier.build().map_err(|err| PkiError::Tls(format!("client verifier: {err}")))?;
    let (chain_pem, key_pem) = certificate.unwrap_or_else(|| bundle.server_certificate());
    let chain = certificates(chain_pem)?;
    if chain.is_empty() {
        return Err(PkiError::InvalidCertificate("no server certificate in the PEM text".into()));
    }
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| PkiError::Tls(err.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, private_key(key_pem)?)
        .map_err(|err| PkiError::Tls(format!("server certificate: {err}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A client's configuration trusting only `ca_pem` (the CA is pinned: the system's roots are not used), with
/// `identity` (a certificate chain and its key, PEM) presented to servers that ask.
pub fn client_config(ca_pem: &str, identity: Option<(&str, &str)>) -> Result<ClientConfig, PkiError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|err| PkiError::Tls(err.to_string()))?
        .with_root_certificates(roots(ca_pem)?);
    let mut config = match identity {
        Some((chain, key)) => builder
            .with_client_auth_cert(certificates(chain)?, private_key(key)?)
            .map_err(|err| PkiError::Tls(format!("client certificate: {err}")))?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
