use std::path::PathBuf;

/// What can go wrong with the bundle, a certificate or a sealed secret. Every variant names the file or the
/// input at fault.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error(
        "no PKI bundle in {dir}: create one with `better-compute pki init --dir {dir}`, or restore it from the backup taken with the database (a new bundle makes every node join again)"
    )]
    Missing { dir: PathBuf },
    #[error("{path} already exists: a PKI bundle is made once; restore or keep the existing one")]
    AlreadyExists { path: PathBuf },
    #[error(
        "cannot read {path}: {reason}; restore the PKI bundle from the backup taken with the database (a new bundle makes every node join again)"
    )]
    Unreadable { path: PathBuf, reason: String },
    #[error("cannot write {path}: {reason}")]
    Unwritable { path: PathBuf, reason: String },
    #[error("invalid certificate signing request: {0}")]
    InvalidCsr(String),
    #[error("invalid certificate: {0}")]
    InvalidCertificate(String),
    #[error("{0}")]
    Tls(String),
    #[error("cannot open the sealed secret: it was sealed with another key, for another purpose, or altered")]
    Unsealable,
    #[error("cannot make a certificate: {0}")]
    Generate(String),
}

impl From<rcgen::Error> for PkiError {
    fn from(err: rcgen::Error) -> Self {
        PkiError::Generate(err.to_string())
    }
}
