//! Sealed secrets: XChaCha20-Poly1305 under the bundle's sealing key.
//!
//! A sealed value is `1 || nonce (24 bytes) || ciphertext and tag`. The `context` (what the secret is, and of
//! what: `bmc-password:node_01...`) is authenticated but not stored, so a sealed value copied onto another
//! row does not open there.

use chacha20poly1305::aead::{Aead as _, KeyInit as _, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hmac::{Hmac, Mac};
use sha2::{Digest as _, Sha256};

use crate::error::PkiError;

const VERSION: u8 = 1;
const NONCE: usize = 24;

/// Seals and opens secrets with one key.
#[derive(Clone)]
pub struct Sealer {
    cipher: XChaCha20Poly1305,
    /// HMAC-SHA256 keyed with a key derived from the sealing key, for secrets that must be made again.
    derive: Hmac<Sha256>,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(..)")
    }
}

impl Sealer {
    /// A new random key.
    pub fn generate_key() -> Result<[u8; 32], PkiError> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|err| PkiError::Generate(format!("no randomness: {err}")))?;
        Ok(key)
    }

    pub fn new(key: &[u8; 32]) -> Sealer {
        // The derivation key is not the sealing key itself: one use of the key never meets the other.
        let mut derivation = Sha256::new();
        derivation.update(b"better-compute derive\0");
        derivation.update(key);
        let derive =
            <Hmac<Sha256> as Mac>::new_from_slice(&derivation.finalize()).expect("HMAC takes a key of any length");
        Sealer { cipher: XChaCha20Poly1305::new(key.into()), derive }
    }

    /// A secret made from the key and `context`: the same context always gives the same 32 bytes, and nobody
    /// without the bundle can make them (so a retried request can be answered the secret it was first given,
    /// with nothing but its SHA-256 stored).
    pub fn derive(&self, context: &str) -> [u8; 32] {
        let mut mac = self.derive.clone();
        mac.update(context.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// Whether `secret` is what [`Sealer::derive`] makes for `context`, compared in constant time (a signature
    /// over `context`, checked).
    pub fn verify_derived(&self, context: &str, secret: &[u8]) -> bool {
        let mut mac = self.derive.clone();
        mac.update(context.as_bytes());
        mac.verify_slice(secret).is_ok()
    }

    /// A sealer from 64 hex digits.
    pub fn from_hex(text: &str) -> Option<Sealer> {
        let bytes: [u8; 32] = from_hex(text)?.try_into().ok()?;
        Some(Sealer::new(&bytes))
    }

    /// Encrypts `secret` for `context`.
    pub fn seal(&self, secret: &[u8], context: &str) -> Result<Vec<u8>, PkiError> {
        let mut nonce = [0u8; NONCE];
        getrandom::fill(&mut nonce).map_err(|err| PkiError::Generate(format!("no randomness: {err}")))?;
        let sealed = self
            .cipher
            .encrypt(XNonce::from_slice(&nonce), Payload { msg: secret, aad: context.as_bytes() })
            .map_err(|_| PkiError::Generate("cannot seal the secret".into()))?;
        let mut out = Vec::with_capacity(1 + NONCE + sealed.len());
        out.push(VERSION);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// Decrypts what [`Sealer::seal`] made for the same `context`.
    pub fn open(&self, sealed: &[u8], context: &str) -> Result<Vec<u8>, PkiError> {
        if sealed.len() < 1 + NONCE || sealed[0] != VERSION {
            return Err(PkiError::Unsealable);
        }
        let (nonce, body) = sealed[1..].split_at(NONCE);
        self.cipher
            .decrypt(XNonce::from_slice(nonce), Payload { msg: body, aad: context.as_bytes() })
            .map_err(|_| PkiError::Unsealable)
    }
}

/// Bytes from lowercase or uppercase hex with an even number of digits.
pub fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok()).collect()
}
