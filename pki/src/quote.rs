//! The quote key: the HMAC-SHA256 key that signs reservation quotes (the exact devices and window a request would
//! get, handed to the caller to book later). It is derived from the bundle's sealing key with a context of its own
//! (`Sealer::derive`), so every process of a deployment verifies what another signed, a restart keeps it, nothing
//! new needs backing up, and no other use of the sealing key ever produces the same tag.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::Bundle;
use crate::seal::Sealer;

/// The derivation context: a new context is a new key (and every quote signed under the old one stops verifying).
const CONTEXT: &str = "reservation-quote-signing-key/v1";

/// Signs and checks quotes. Never prints its key.
#[derive(Clone)]
pub struct QuoteKey {
    mac: Hmac<Sha256>,
}

impl std::fmt::Debug for QuoteKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("QuoteKey(..)")
    }
}

impl QuoteKey {
    /// The key derived from `sealer`'s.
    pub fn from_sealer(sealer: &Sealer) -> QuoteKey {
        let key = sealer.derive(CONTEXT);
        QuoteKey { mac: <Hmac<Sha256> as Mac>::new_from_slice(&key).expect("HMAC takes a key of any length") }
    }

    /// The tag of `message`.
    pub fn sign(&self, message: &[u8]) -> [u8; 32] {
        let mut mac = self.mac.clone();
        mac.update(message);
        mac.finalize().into_bytes().into()
    }

    /// Whether `tag` is the tag of `message`, compared in constant time.
    pub fn verify(&self, message: &[u8], tag: &[u8]) -> bool {
        let mut mac = self.mac.clone();
        mac.update(message);
        mac.verify_slice(tag).is_ok()
    }
}

impl Bundle {
    /// The key that signs reservation quotes.
    pub fn quote_key(&self) -> QuoteKey {
        QuoteKey::from_sealer(self.sealer())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quote_tag_verifies_only_for_its_message_under_the_same_sealing_key() {
        let key = QuoteKey::from_sealer(&Sealer::new(&[7; 32]));
        let tag = key.sign(b"quote");
        assert!(key.verify(b"quote", &tag));
        assert!(QuoteKey::from_sealer(&Sealer::new(&[7; 32])).verify(b"quote", &tag), "derived again, the same key");
        assert!(!key.verify(b"quotE", &tag));
        assert!(!key.verify(b"quote", &tag[..31]));
        assert!(!QuoteKey::from_sealer(&Sealer::new(&[8; 32])).verify(b"quote", &tag), "another bundle's key");
        // Its own context: no other derivation of the sealing key makes the quote key's tags.
        let sealer = Sealer::new(&[7; 32]);
        assert_ne!(sealer.derive("stream-ticket:quote"), tag);
        assert_ne!(sealer.derive("audit-checkpoint-signing-key/v1"), sealer.derive(CONTEXT));
    }
}
