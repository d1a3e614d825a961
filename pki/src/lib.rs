//! The control plane's own PKI.
//!
//! A [`Bundle`] is a folder of five files the operator keeps and backs up with the database: the CA that signs
//! every node certificate (`ca.crt`, `ca.key`), the server certificate the API presents (`server.crt`,
//! `server.key`, signed by that CA), and the sealing key (`sealing.key`) that encrypts the secrets the control
//! plane must keep. Losing the bundle means every node has to join again, so it is made once
//! ([`Bundle::init`]) and then only read ([`Bundle::load`]).
//!
//! Nodes make their own key and send a certificate signing request at join ([`NodeKey`]); the CA signs it
//! ([`Bundle::sign_node_csr`]) and the node speaks mutual TLS from then on. [`tls`] builds the rustls
//! configurations of both ends, each trusting only this CA; [`seal`] is the AEAD around stored secrets.
//!
//! [`audit`] is the Ed25519 key that signs the audit trail's checkpoints, derived from the sealing key; [`quote`]
//! the HMAC key that signs reservation quotes, derived the same way under a context of its own.
//!
//! The crate does no network or database IO: it reads and writes the bundle's files, nothing else.

pub mod audit;
mod bundle;
mod error;
mod node;
pub mod quote;
pub mod seal;
pub mod tls;

pub use bundle::{Bundle, InitOptions, IssuedCertificate, RevokedCertificate};
pub use error::PkiError;
pub use node::{NodeKey, PeerCertificate, certificate_validity};

pub use seal::from_hex;

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// The SHA-256 of a certificate's DER, as lowercase hex: what an operator compares, or passes to `bcd
/// --ca-sha256`, to pin a CA.
pub fn fingerprint(der: &[u8]) -> String {
    use sha2::Digest as _;
    hex(&sha2::Sha256::digest(der))
}

/// Seconds since the Unix epoch, now.
#[cfg(test)]
pub(crate) fn unix_now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

#[cfg(test)]
mod tests;

/// Seconds since the Unix epoch as an RFC 3339 date, for people.
pub fn date(seconds: i64) -> String {
    use time::format_description::well_known::Rfc3339;
    time::OffsetDateTime::from_unix_timestamp(seconds)
        .ok()
        .and_then(|at| at.format(&Rfc3339).ok())
        .unwrap_or_else(|| format!("{seconds} s after the epoch"))
}
