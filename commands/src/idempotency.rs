//! Idempotency keys for create requests: the first answer to a caller's key is kept, and a retry with the same
//! key and request is answered it without running again; the same key with another request is refused. The
//! answers (which may hold a secret, such as a join token) are sealed with the PKI bundle's key when there is
//! one; without a bundle an answer holding a secret is not kept, and its retry is refused instead.

use bc_domain::Rejection;
use bc_eventstore::TxOptions;

use crate::auth::Principal;
use crate::store::idempotency as rows;
use crate::{App, AppResult};

/// What a create request with an idempotency key should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The key is this request's: run it, then [`App::keep_answer`] or [`App::release_key`].
    Run,
    /// A retry: answer what the first request was answered.
    Replay { status: u16, answer: Vec<u8> },
}

fn context(principal: &Principal, key: &str) -> String {
    format!("idempotent-answer:{}:{}:{key}", principal.tenant_id, principal.identity)
}

impl App {
    /// Claims `key` for a request of `method` whose SHA-256 (method, path and body) is `request_sha256`.
    pub async fn claim_key(
        &self,
        principal: &Principal,
        key: &str,
        method: &str,
        request_sha256: &str,
    ) -> AppResult<Claim> {
        let (tenant, identity) = (principal.tenant_id.as_str(), principal.identity.as_str());
        let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
        let held = rows::claim(&mut tx, tenant, identity, key, method, request_sha256).await?;
        tx.commit().await?;
        let Some((held_method, held_sha256, status, answer, sealed)) = held else { return Ok(Claim::Run) };
        if held_method != method || held_sha256 != request_sha256 {
            return Err(Rejection::KeyReused(format!(
                "Idempotency-Key {key:?} was already used for a different request ({held_method})"
            ))
            .into());
        }
        match (status, answer) {
            (Some(status), Some(answer)) => {
                let answer = if sealed {
                    let sealer = self.sealer()?;
                    sealer.open(&answer, &context(principal, key)).map_err(crate::sealed::pki_failure)?
                } else {
                    answer
                };
                Ok(Claim::Replay { status: u16::try_from(status).unwrap_or(500), answer })
            }
            (Some(_), None) => Err(Rejection::Conflict(format!(
                "the request with Idempotency-Key {key:?} already ran, and its answer held a secret shown once \
                 (the control plane has no PKI bundle to keep it sealed)"
            ))
            .into()),
            _ => Err(Rejection::Conflict(format!(
                "a request with Idempotency-Key {key:?} is still running: retry in a moment"
            ))
            .into()),
        }
    }

    /// Keeps the first answer to `key`. One holding a secret is kept only sealed; without a bundle only that
    /// it ran is.
    pub async fn keep_answer(
        &self,
        principal: &Principal,
        key: &str,
        status: u16,
        answer: &[u8],
        holds_secret: bool,
    ) -> AppResult<()> {
        let (tenant, identity) = (principal.tenant_id.as_str(), principal.identity.as_str());
        let sealed = match self.pki.as_ref() {
            Some(bundle) => {
                Some(bundle.sealer().seal(answer, &context(principal, key)).map_err(crate::sealed::pki_failure)?)
            }
            None => None,
        };
        let (stored, is_sealed): (Option<&[u8]>, bool) = match (&sealed, holds_secret) {
            (Some(sealed), _) => (Some(sealed), true),
            (None, false) => (Some(answer), false),
            (None, true) => (None, false),
        };
        let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
        rows::answer(&mut tx, tenant, identity, key, i32::from(status), stored, is_sealed).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Gives `key` back after a refused or failed request.
    pub async fn release_key(&self, principal: &Principal, key: &str) -> AppResult<()> {
        let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
        rows::release(&mut tx, principal.tenant_id.as_str(), principal.identity.as_str(), key).await?;
        tx.commit().await?;
        Ok(())
    }
}
