//! The audit signing key: the Ed25519 key that signs the audit trail's checkpoints, derived from the bundle's
//! sealing key with a context of its own (`Sealer::derive`), so every bundle has one, old bundles included,
//! nothing new needs backing up, and the sealing key itself never signs. Verifiers pin its public key (shown by
//! `better-compute pki show`, served at `/v1/pki/audit-key`).

use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};

use crate::Bundle;
use crate::seal::Sealer;

/// The derivation context: a new context is a new key.
const CONTEXT: &str = "audit-checkpoint-signing-key/v1";

/// Signs checkpoints. Never prints its key.
#[derive(Clone)]
pub struct AuditSigner {
    key: SigningKey,
}

impl std::fmt::Debug for AuditSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditSigner").field("public_key", &self.public_key_hex()).finish_non_exhaustive()
    }
}

impl AuditSigner {
    /// The signer derived from `sealer`'s key.
    pub fn from_sealer(sealer: &Sealer) -> AuditSigner {
        AuditSigner { key: SigningKey::from_bytes(&sealer.derive(CONTEXT)) }
    }

    /// The public key, 32 bytes as lowercase hex: what verifiers pin.
    pub fn public_key_hex(&self) -> String {
        crate::hex(self.key.verifying_key().as_bytes())
    }

    /// The Ed25519 signature of `message`.
    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        self.key.sign(message).to_bytes()
    }
}

impl Bundle {
    /// The key that signs the audit trail's checkpoints.
    pub fn audit_signer(&self) -> AuditSigner {
        AuditSigner::from_sealer(self.sealer())
    }
}

/// Whether `signature` is the signature of `message` by the Ed25519 public key `public_key_hex` (strictly: no
/// weak keys, no malleable signatures).
pub fn verify_signature(public_key_hex: &str, message: &[u8], signature: &[u8]) -> bool {
    let Some(key) = crate::from_hex(public_key_hex).and_then(|bytes| <[u8; 32]>::try_from(bytes).ok()) else {
        return false;
    };
    let Ok(key) = VerifyingKey::from_bytes(&key) else {
        return false;
    };
    let Ok(signature) = Signature::from_slice(signature) else {
        return false;
    };
    key.verify_strict(message, &signature).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_audit_key_is_the_same_for_the_same_sealing_key_and_its_signatures_verify_only_as_signed() {
        let sealer = Sealer::new(&[9; 32]);
        let signer = AuditSigner::from_sealer(&sealer);
        assert_eq!(signer.public_key_hex(), AuditSigner::from_sealer(&Sealer::new(&[9; 32])).public_key_hex());
        assert_ne!(signer.public_key_hex(), AuditSigner::from_sealer(&Sealer::new(&[8; 32])).public_key_hex());
        let signature = signer.sign(b"checkpoint");
        assert!(verify_signature(&signer.public_key_hex(), b"checkpoint", &signature));
        assert!(!verify_signature(&signer.public_key_hex(), b"checkpoinT", &signature));
        let other = AuditSigner::from_sealer(&Sealer::new(&[8; 32]));
        assert!(!verify_signature(&other.public_key_hex(), b"checkpoint", &signature));
        assert!(!verify_signature("not hex", b"checkpoint", &signature));
        assert!(!verify_signature(&signer.public_key_hex(), b"checkpoint", &signature[..63]));
    }
}
