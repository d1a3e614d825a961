//! The node's end: its key and signing request, and reading a certificate someone presents.

use rcgen::{CertificateParams, DnType, KeyPair};

use crate::error::PkiError;

/// A node's private key and its certificate signing request, both PEM. The key never leaves the node.
pub struct NodeKey {
    pub key_pem: String,
    pub csr_pem: String,
}

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeKey").field("csr_pem", &self.csr_pem).finish_non_exhaustive()
    }
}

impl NodeKey {
    /// A new key, and a request naming `hostname` (the CA replaces the subject with the node's id).
    pub fn generate(hostname: &str) -> Result<NodeKey, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, hostname);
        let csr = params.serialize_request(&key)?;
        Ok(NodeKey { key_pem: key.serialize_pem(), csr_pem: csr.pem()? })
    }

    /// A new request for the same key, for a rotation.
    pub fn request_for(key_pem: &str, hostname: &str) -> Result<String, PkiError> {
        let key = KeyPair::from_pem(key_pem).map_err(|err| PkiError::InvalidCertificate(format!("node key: {err}")))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, hostname);
        Ok(params.serialize_request(&key)?.pem()?)
    }
}

/// What the server reads of a client certificate that rustls already verified against the CA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCertificate {
    /// The subject's common name: the node's id for node certificates.
    pub common_name: String,
    /// The serial number, lowercase hex.
    pub serial: String,
    /// The start and the end of its validity, in seconds since the Unix epoch.
    pub not_before: i64,
    pub not_after: i64,
}

impl PeerCertificate {
    /// Reads a DER certificate.
    pub fn parse(der: &[u8]) -> Result<PeerCertificate, PkiError> {
        let (_, cert) =
            x509_parser::parse_x509_certificate(der).map_err(|err| PkiError::InvalidCertificate(err.to_string()))?;
        let common_name =
            cert.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok()).unwrap_or_default().to_owned();
        Ok(PeerCertificate {
            common_name,
            serial: crate::hex(cert.raw_serial()),
            not_before: cert.validity().not_before.timestamp(),
            not_after: cert.validity().not_after.timestamp(),
        })
    }

    /// Reads the first certificate of a PEM text.
    pub fn parse_pem(pem: &str) -> Result<PeerCertificate, PkiError> {
        let certs = crate::tls::certificates(pem)?;
        let first = certs.first().ok_or_else(|| PkiError::InvalidCertificate("no PEM certificate".into()))?;
        PeerCertificate::parse(first)
    }

    /// Whether less than a third of its validity is left at `now` (seconds since the epoch): the point where a
    /// node asks for the next one.
    pub fn due_for_renewal(&self, now: i64) -> bool {
        let lifetime = (self.not_after - self.not_before).max(1);
        self.not_after - now < lifetime / 3
    }
}

/// The validity of a PEM certificate: (not before, not after), seconds since the epoch.
pub fn certificate_validity(pem: &str) -> Result<(i64, i64), PkiError> {
    let peer = PeerCertificate::parse_pem(pem)?;
    Ok((peer.not_before, peer.not_after))
}
