//! The tamper-evident audit trail on the wire: checkpoints and their leaves, inclusion proofs, the audit key,
//! and the bundle an auditor exports (`better-compute audit export`) and checks offline (`audit verify`).

use bc_domain::audit::{self, AuditRecord, CheckpointBody, CheckpointClaim, Hash, ProofClaim};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::fleet::AuditDto;

/// A signed Merkle checkpoint over one tenant's audit entries of one hour, chained to its previous one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointDto {
    /// `ckp_` and the first 16 bytes of its hash, hex.
    pub id: String,
    pub tenant_id: String,
    /// Its place in the tenant's chain, from 1.
    pub sequence: i64,
    /// The start of the hour it closed (epoch milliseconds, UTC).
    pub hour: i64,
    /// The position of its first entry.
    pub first_position: String,
    /// The position of its last entry.
    pub last_position: String,
    pub leaf_count: i64,
    /// The Merkle root (RFC 6962) of its entries' leaves, hex.
    pub root: String,
    /// The hash of the tenant's previous checkpoint (64 zeros for the first), hex.
    pub previous_hash: String,
    /// SHA-256 of its signed message, hex.
    pub hash: String,
    /// The Ed25519 public key that signed it, hex.
    pub public_key: String,
    /// The Ed25519 signature of its message, hex.
    pub signature: String,
    pub made_at: i64,
    /// Its leaves in order (a read of one checkpoint; empty in lists).
    #[serde(default)]
    pub leaves: Vec<LeafDto>,
}

/// One leaf: an entry's position and its leaf hash (SHA-256 of 0x00 and the entry's canonical encoding).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeafDto {
    pub position: String,
    pub leaf_hash: String,
}

/// An audit entry, its leaf index in its checkpoint and the audit path (RFC 9162) to the checkpoint's root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditProofDto {
    /// The entry as the trail holds it now.
    pub entry: AuditDto,
    pub leaf_index: i64,
    /// The checkpoint that holds it (without its leaves).
    pub checkpoint: CheckpointDto,
    /// Sibling hashes from the leaf up, hex.
    pub audit_path: Vec<String>,
}

/// The key that signs the audit checkpoints: what verifiers pin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditKeyDto {
    /// `ed25519`.
    pub algorithm: String,
    /// The public key, 32 bytes, hex.
    pub public_key: String,
}

/// What `better-compute audit verify` checks offline: checkpoints (with their leaves, to name a changed entry),
/// the entries of the audit trail, and inclusion proofs. Every part may be empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuditBundleDto {
    /// The audit key the server said it signs with (informative: the verifier pins its own).
    #[serde(default)]
    pub public_key: Option<String>,
    #[serde(default)]
    pub checkpoints: Vec<CheckpointDto>,
    #[serde(default)]
    pub entries: Vec<AuditDto>,
    #[serde(default)]
    pub proofs: Vec<AuditProofDto>,
}

fn hash(field: &str, id: &str, text: &str) -> Result<Hash, String> {
    audit::hash_from_hex(text).ok_or_else(|| format!("checkpoint {id}: {field} is not 64 hex digits"))
}

fn hex_bytes(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok()).collect()
}

impl CheckpointDto {
    /// What it claims, to verify; an error names the field that does not read.
    pub fn claim(&self) -> Result<CheckpointClaim, String> {
        let id = &self.id;
        let leaves = if self.leaves.is_empty() {
            None
        } else {
            Some(
                self.leaves
                    .iter()
                    .map(|l| Ok((l.position.clone(), hash("a leaf hash", id, &l.leaf_hash)?)))
                    .collect::<Result<Vec<_>, String>>()?,
            )
        };
        Ok(CheckpointClaim {
            id: id.clone(),
            body: CheckpointBody {
                tenant_id: self.tenant_id.clone(),
                sequence: self.sequence,
                hour_ms: self.hour,
                first_position: self.first_position.clone(),
                last_position: self.last_position.clone(),
                leaf_count: self.leaf_count,
                root: hash("root", id, &self.root)?,
                previous_hash: hash("previousHash", id, &self.previous_hash)?,
            },
            hash: hash("hash", id, &self.hash)?,
            public_key: self.public_key.clone(),
            signature: hex_bytes(&self.signature).ok_or_else(|| format!("checkpoint {id}: signature is not hex"))?,
            leaves,
        })
    }
}

impl From<&AuditDto> for AuditRecord {
    fn from(a: &AuditDto) -> Self {
        AuditRecord {
            position: a.position.clone(),
            stream_id: a.stream_id.clone(),
            stream_version: a.stream_version,
            event_type: a.event_type.clone(),
            tenant_id: a.tenant_id.clone(),
            decision: a.decision.clone(),
            reason: a.reason.clone(),
            identity: a.identity.clone(),
            session_kind: a.session_kind.clone(),
            agent: a.agent.clone(),
            delegation: a.delegation.clone(),
            request_id: a.request_id.clone(),
            admission_tenant_id: a.admission_tenant_id.clone(),
            recorded_at_ms: a.recorded_at,
        }
    }
}

impl AuditProofDto {
    /// What it claims, to verify.
    pub fn claim(&self) -> Result<ProofClaim, String> {
        let id = &self.checkpoint.id;
        Ok(ProofClaim {
            entry: (&self.entry).into(),
            leaf_index: u64::try_from(self.leaf_index).map_err(|_| format!("proof in {id}: a negative leaf index"))?,
            checkpoint: self.checkpoint.claim()?,
            audit_path: self.audit_path.iter().map(|p| hash("an audit path hash", id, p)).collect::<Result<_, _>>()?,
        })
    }
}

#[cfg(feature = "server")]
mod server {
    use bc_commands::audit::{AuditProof, CheckpointView};

    use super::{AuditProofDto, CheckpointDto, LeafDto};
    use crate::fleet::AuditDto;

    impl From<&CheckpointView> for CheckpointDto {
        fn from(c: &CheckpointView) -> Self {
            CheckpointDto {
                id: c.id.clone(),
                tenant_id: c.tenant_id.clone(),
                sequence: c.sequence,
                hour: c.hour_ms,
                first_position: c.first_position.clone(),
                last_position: c.last_position.clone(),
                leaf_count: c.leaf_count,
                root: c.root.clone(),
                previous_hash: c.previous_hash.clone(),
                hash: c.hash.clone(),
                public_key: c.public_key.clone(),
                signature: c.signature.clone(),
                made_at: c.made_at_ms,
                leaves: c
                    .leaves
                    .iter()
                    .map(|l| LeafDto { position: l.position.clone(), leaf_hash: l.leaf_hash.clone() })
                    .collect(),
            }
        }
    }

    impl From<&AuditProof> for AuditProofDto {
        fn from(p: &AuditProof) -> Self {
            AuditProofDto {
                entry: AuditDto::from(&p.entry),
                leaf_index: p.leaf_index,
                checkpoint: CheckpointDto::from(&p.checkpoint),
                audit_path: p.audit_path.clone(),
            }
        }
    }
}
