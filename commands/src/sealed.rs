//! Secrets sealed with the PKI bundle's key: what each is bound to, and what a failure to open one means.

use crate::AppError;

/// What a sealed secret is bound to: a secret copied onto another row does not open there.
pub(crate) fn secret_context(kind: &str, owner_id: &str) -> String {
    format!("{kind}:{owner_id}")
}

/// A PKI failure where there is nothing the caller can fix: the bundle's key does not open what it sealed.
pub(crate) fn pki_failure(err: bc_pki::PkiError) -> AppError {
    AppError::Store(bc_eventstore::Error::Internal(format!("sealed secret: {err}")))
}
