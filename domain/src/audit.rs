//! The tamper-evident audit trail's pure part: the canonical encoding of an audit entry (a Merkle leaf), the
//! Merkle tree of RFC 6962 / RFC 9162 over a checkpoint's entries (roots, inclusion proofs and their
//! verification), and the signed body of a checkpoint, whose hash the next checkpoint of its tenant names.
//!
//! Everything here is the same on both sides: the service makes checkpoints with it, and an auditor's offline
//! `better-compute audit verify` checks them with it.

use sha2::{Digest as _, Sha256};

/// A SHA-256 value: a leaf, a node, a root or a checkpoint's hash.
pub type Hash = [u8; 32];

/// The previous hash of a tenant's first checkpoint.
pub const GENESIS: Hash = [0; 32];

/// How long after an hour ends its checkpoints are made: commits that began before the hour's end and the audit
/// trail's projection get this long to land in their own hour.
pub const CLOSE_AFTER_MS: i64 = 5 * 60 * 1000;

/// One hour, in milliseconds.
pub const HOUR_MS: i64 = 3_600_000;

/// The hour (its start, in epoch milliseconds, UTC) that `at_ms` falls in.
pub fn hour_of(at_ms: i64) -> i64 {
    at_ms.div_euclid(HOUR_MS) * HOUR_MS
}

/// One entry of the audit trail, field for field as the API shows it: what a leaf is made of. The write side
/// reads it from the audit read model's rows as it is (`bc_commands::reads::AuditEntry`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    pub position: String,
    pub stream_id: String,
    pub stream_version: i64,
    pub event_type: String,
    pub tenant_id: Option<String>,
    pub decision: String,
    pub reason: Option<String>,
    pub identity: Option<String>,
    pub session_kind: Option<String>,
    pub agent: Option<String>,
    pub delegation: Option<String>,
    pub request_id: Option<String>,
    pub admission_tenant_id: Option<String>,
    #[serde(rename = "recordedAt")]
    pub recorded_at_ms: i64,
}

/// A canonical, unambiguous byte encoding: each text is a presence byte and its length (u32, big-endian) before
/// its UTF-8 bytes, each integer eight big-endian bytes. No two different values encode alike.
#[derive(Debug, Default)]
struct Canonical(Vec<u8>);

impl Canonical {
    fn text(&mut self, value: &str) -> &mut Self {
        self.0.push(1);
        self.bytes(value.as_bytes())
    }

    fn opt_text(&mut self, value: Option<&str>) -> &mut Self {
        match value {
            Some(value) => self.text(value),
            None => {
                self.0.push(0);
                self
            }
        }
    }

    fn bytes(&mut self, value: &[u8]) -> &mut Self {
        // An entry's texts are far below 4 GiB: the log's rows are bounded long before.
        let len = u32::try_from(value.len()).unwrap_or(u32::MAX);
        self.0.extend_from_slice(&len.to_be_bytes());
        self.0.extend_from_slice(value);
        self
    }

    fn int(&mut self, value: i64) -> &mut Self {
        self.0.extend_from_slice(&value.to_be_bytes());
        self
    }
}

impl AuditRecord {
    /// The leaf's data: the tag `bc-audit-entry/v1`, then every field in the order of the struct.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Canonical::default();
        out.text("bc-audit-entry/v1")
            .text(&self.position)
            .text(&self.stream_id)
            .int(self.stream_version)
            .text(&self.event_type)
            .opt_text(self.tenant_id.as_deref())
            .text(&self.decision)
            .opt_text(self.reason.as_deref())
            .opt_text(self.identity.as_deref())
            .opt_text(self.session_kind.as_deref())
            .opt_text(self.agent.as_deref())
            .opt_text(self.delegation.as_deref())
            .opt_text(self.request_id.as_deref())
            .opt_text(self.admission_tenant_id.as_deref())
            .int(self.recorded_at_ms);
        out.0
    }

    /// The entry's Merkle leaf hash.
    pub fn leaf_hash(&self) -> Hash {
        leaf_hash(&self.encode())
    }
}

/// RFC 6962's leaf hash: SHA-256(0x00 || data).
pub fn leaf_hash(data: &[u8]) -> Hash {
    let mut hasher = Sha256::new();
    hasher.update([0u8]);
    hasher.update(data);
    hasher.finalize().into()
}

/// RFC 6962's interior node: SHA-256(0x01 || left || right).
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut hasher = Sha256::new();
    hasher.update([1u8]);
    hasher.update(left);
    hasher.update(right);
    hasher.finalize().into()
}

/// The largest power of two below `n` (for `n >= 2`): where RFC 6962 splits a tree of `n` leaves.
fn split(n: usize) -> usize {
    let mut k = 1;
    while k * 2 < n {
        k *= 2;
    }
    k
}

/// The Merkle tree hash of `leaves` (leaf hashes, in order); the empty tree's is SHA-256 of nothing.
pub fn root(leaves: &[Hash]) -> Hash {
    match leaves.len() {
        0 => Sha256::digest([]).into(),
        1 => leaves[0],
        n => {
            let k = split(n);
            node_hash(&root(&leaves[..k]), &root(&leaves[k..]))
        }
    }
}

/// The audit path of leaf `index` (RFC 6962 section 2.1.1), nearest the leaf first; `None` past the end.
pub fn inclusion_proof(leaves: &[Hash], index: usize) -> Option<Vec<Hash>> {
    if index >= leaves.len() {
        return None;
    }
    let mut path = Vec::new();
    path_into(leaves, index, &mut path);
    Some(path)
}

fn path_into(leaves: &[Hash], index: usize, path: &mut Vec<Hash>) {
    let n = leaves.len();
    if n <= 1 {
        return;
    }
    let k = split(n);
    if index < k {
        path_into(&leaves[..k], index, path);
        path.push(root(&leaves[k..]));
    } else {
        path_into(&leaves[k..], index - k, path);
        path.push(root(&leaves[..k]));
    }
}

/// The root that leaf `leaf` at `index` of a tree of `size` leaves gives with `proof` (RFC 9162 section
/// 2.1.3.2), or `None` when the proof cannot be one of that tree (wrong length, index past the end).
pub fn root_from_inclusion_proof(index: u64, size: u64, leaf: &Hash, proof: &[Hash]) -> Option<Hash> {
    if index >= size {
        return None;
    }
    let (mut f, mut s) = (index, size - 1);
    let mut r = *leaf;
    for p in proof {
        if s == 0 {
            return None;
        }
        if f & 1 == 1 || f == s {
            r = node_hash(p, &r);
            while f & 1 == 0 && f != 0 {
                f >>= 1;
                s >>= 1;
            }
        } else {
            r = node_hash(&r, p);
        }
        f >>= 1;
        s >>= 1;
    }
    (s == 0).then_some(r)
}

/// What a checkpoint signs: its tenant, its place in the tenant's chain, the hour it closed, the positions and
/// number of the entries it covers, their Merkle root, and the hash of the tenant's previous checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointBody {
    pub tenant_id: String,
    /// 1 for the tenant's first checkpoint, then one more each.
    pub sequence: i64,
    /// The start of the hour (epoch milliseconds, UTC).
    pub hour_ms: i64,
    pub first_position: String,
    pub last_position: String,
    pub leaf_count: i64,
    pub root: Hash,
    /// [`GENESIS`] for the first.
    pub previous_hash: Hash,
}

impl CheckpointBody {
    /// The signed message: the tag `bc-audit-checkpoint/v1`, then every field in the order of the struct.
    pub fn message(&self) -> Vec<u8> {
        let mut out = Canonical::default();
        out.text("bc-audit-checkpoint/v1")
            .text(&self.tenant_id)
            .int(self.sequence)
            .int(self.hour_ms)
            .text(&self.first_position)
            .text(&self.last_position)
            .int(self.leaf_count)
            .bytes(&self.root)
            .bytes(&self.previous_hash);
        out.0
    }

    /// SHA-256 of the message: what the next checkpoint names as its previous.
    pub fn hash(&self) -> Hash {
        Sha256::digest(self.message()).into()
    }

    /// The checkpoint's id, `ckp_` and the first 16 bytes of its hash in hex.
    pub fn id(&self) -> String {
        format!("ckp_{}", &to_hex(&self.hash())[..32])
    }
}

/// A position as a key that sorts as the log does: `(epoch, txid, seq)`.
pub type PositionKey = (i64, u64, i64);

/// A position `<epoch>-<txid>-<seq>` as a key that sorts as the log does, or `None` when it is not one.
pub fn position_key(position: &str) -> Option<PositionKey> {
    let mut parts = position.split('-');
    let key = (parts.next()?.parse().ok()?, parts.next()?.parse().ok()?, parts.next()?.parse().ok()?);
    parts.next().is_none().then_some(key)
}

/// Lower-case hex.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut hex, byte| {
        use std::fmt::Write as _;
        let _ = write!(hex, "{byte:02x}");
        hex
    })
}

/// A hash from 64 hex digits, or `None`.
pub fn hash_from_hex(text: &str) -> Option<Hash> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// A checkpoint as a verifier received it: what it claims, to be checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointClaim {
    pub id: String,
    pub body: CheckpointBody,
    /// The hash it claims (the next checkpoint's previous hash).
    pub hash: Hash,
    pub public_key: String,
    pub signature: Vec<u8>,
    /// Its leaves, position and leaf hash in order, when they came with it.
    pub leaves: Option<Vec<(String, Hash)>>,
}

/// An inclusion proof as a verifier received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProofClaim {
    pub entry: AuditRecord,
    pub leaf_index: u64,
    pub checkpoint: CheckpointClaim,
    pub audit_path: Vec<Hash>,
}

/// One thing a verification found wrong, naming the checkpoint and the entry where it knows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub checkpoint_id: Option<String>,
    pub position: Option<String>,
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn failure(checkpoint: &str, position: Option<&str>, message: String) -> Failure {
    Failure { checkpoint_id: Some(checkpoint.to_owned()), position: position.map(str::to_owned), message }
}

/// Checks an Ed25519 signature: `(public key hex, message, signature) -> valid`. The domain holds no signature
/// code; the caller passes the check (`bc_pki::audit::verify_signature`).
pub type SignatureCheck<'a> = &'a dyn Fn(&str, &[u8], &[u8]) -> bool;

/// Checks one checkpoint on its own: its id and hash are its body's, it is signed by `pinned_key`, and its
/// leaves (when given) make its root.
pub fn verify_checkpoint(claim: &CheckpointClaim, pinned_key: &str, signed: SignatureCheck<'_>) -> Vec<Failure> {
    let mut found = Vec::new();
    let id = claim.id.as_str();
    if claim.body.hash() != claim.hash || claim.body.id() != claim.id {
        found.push(failure(
            id,
            None,
            format!("checkpoint {id} does not hash to what it claims: its fields were changed"),
        ));
    }
    if claim.public_key != pinned_key {
        found.push(failure(
            id,
            None,
            format!("checkpoint {id} is signed by key {}, not the pinned {pinned_key}", claim.public_key),
        ));
    } else if !signed(pinned_key, &claim.body.message(), &claim.signature) {
        found.push(failure(id, None, format!("checkpoint {id} signature invalid")));
    }
    if let Some(leaves) = &claim.leaves {
        let hashes: Vec<Hash> = leaves.iter().map(|(_, hash)| *hash).collect();
        if hashes.len() as i64 != claim.body.leaf_count || root(&hashes) != claim.body.root {
            found.push(failure(
                id,
                None,
                format!("checkpoint {id}: its {} leaves do not make its signed root", hashes.len()),
            ));
        }
    }
    found
}

/// Checks checkpoints (any tenants, any order) and the chain each tenant's make: each signed and whole
/// ([`verify_checkpoint`]), numbered one after another, each naming the hash of the one before (the first, number
/// 1, names [`GENESIS`]) and starting after its last entry. A tenant's chain may start later than number 1 (a
/// partial export); then its first checkpoint's previous hash is taken as given.
pub fn verify_chain(checkpoints: &[CheckpointClaim], pinned_key: &str, signed: SignatureCheck<'_>) -> Vec<Failure> {
    let mut sorted: Vec<&CheckpointClaim> = checkpoints.iter().collect();
    sorted.sort_by(|a, b| (&a.body.tenant_id, a.body.sequence).cmp(&(&b.body.tenant_id, b.body.sequence)));
    let mut found = Vec::new();
    let mut previous: Option<&CheckpointClaim> = None;
    for claim in sorted {
        found.extend(verify_checkpoint(claim, pinned_key, signed));
        let body = &claim.body;
        let before = previous.filter(|p| p.body.tenant_id == body.tenant_id);
        match before {
            None if body.sequence == 1 && body.previous_hash != GENESIS => found.push(failure(
                &claim.id,
                None,
                format!(
                    "chain broken before {}: the first checkpoint of tenant {} names a previous one",
                    claim.id, body.tenant_id
                ),
            )),
            None => {}
            Some(p) => {
                let follows = p.body.sequence + 1 == body.sequence
                    && body.previous_hash == p.hash
                    && position_key(&p.body.last_position) < position_key(&body.first_position);
                if !follows {
                    found.push(failure(&claim.id, None, format!("chain broken between {} and {}", p.id, claim.id)));
                }
            }
        }
        if position_key(&body.first_position).is_none()
            || position_key(&body.first_position) > position_key(&body.last_position)
        {
            found.push(failure(&claim.id, None, format!("checkpoint {} names positions out of order", claim.id)));
        }
        previous = Some(claim);
    }
    found
}

/// Checks a checkpoint against the audit trail's entries: of `entries` (any tenants, any order), those of its
/// tenant from its first to its last position must be exactly its leaves. With its leaves, each entry is held to
/// its own leaf, so a changed, missing or added entry is named; without them, only the root can be compared.
pub fn verify_entries(claim: &CheckpointClaim, entries: &[AuditRecord]) -> Vec<Failure> {
    let (first, last) = (position_key(&claim.body.first_position), position_key(&claim.body.last_position));
    let mut covered: Vec<(Option<PositionKey>, &AuditRecord)> = entries
        .iter()
        .filter(|e| e.tenant_id.as_deref() == Some(claim.body.tenant_id.as_str()))
        .map(|e| (position_key(&e.position), e))
        .filter(|(key, _)| key.is_some() && *key >= first && *key <= last)
        .collect();
    covered.sort_by_key(|a| a.0);
    let id = claim.id.as_str();
    let Some(leaves) = &claim.leaves else {
        let hashes: Vec<Hash> = covered.iter().map(|(_, e)| e.leaf_hash()).collect();
        if hashes.len() as i64 != claim.body.leaf_count {
            return vec![failure(
                id,
                None,
                format!(
                    "checkpoint {id} covers {} entries, the trail holds {} of them",
                    claim.body.leaf_count,
                    hashes.len()
                ),
            )];
        }
        if root(&hashes) != claim.body.root {
            return vec![failure(id, None, format!("the entries of checkpoint {id} do not match its root"))];
        }
        return Vec::new();
    };
    let mut found = Vec::new();
    let (mut l, mut e) = (0, 0);
    while l < leaves.len() || e < covered.len() {
        let leaf_key = leaves.get(l).map(|(p, _)| position_key(p));
        let entry_key = covered.get(e).map(|(k, _)| *k);
        match (leaf_key, entry_key) {
            (Some(lk), Some(ek)) if lk == ek => {
                let (position, hash) = &leaves[l];
                if covered[e].1.leaf_hash() != *hash {
                    found.push(failure(
                        id,
                        Some(position),
                        format!("entry {position} does not match checkpoint {id} (leaf {l})"),
                    ));
                }
                l += 1;
                e += 1;
            }
            (Some(lk), Some(ek)) if lk > ek => {
                let position = &covered[e].1.position;
                found.push(failure(
                    id,
                    Some(position),
                    format!("entry {position} is not in checkpoint {id}, which covers its position"),
                ));
                e += 1;
            }
            (Some(_), _) => {
                let position = &leaves[l].0;
                found.push(failure(
                    id,
                    Some(position),
                    format!("entry {position} of checkpoint {id} is missing (leaf {l})"),
                ));
                l += 1;
            }
            (None, _) => {
                let position = &covered[e].1.position;
                found.push(failure(
                    id,
                    Some(position),
                    format!("entry {position} is not in checkpoint {id}, which covers its position"),
                ));
                e += 1;
            }
        }
    }
    found
}

/// Checks an inclusion proof: its checkpoint is signed by `pinned_key` and whole, and the entry's leaf with the
/// audit path makes the checkpoint's root.
pub fn verify_proof(proof: &ProofClaim, pinned_key: &str, signed: SignatureCheck<'_>) -> Vec<Failure> {
    let mut found = verify_checkpoint(&proof.checkpoint, pinned_key, signed);
    let id = proof.checkpoint.id.as_str();
    let position = proof.entry.position.as_str();
    let size = u64::try_from(proof.checkpoint.body.leaf_count).unwrap_or(0);
    let made = root_from_inclusion_proof(proof.leaf_index, size, &proof.entry.leaf_hash(), &proof.audit_path);
    if proof.entry.tenant_id.as_deref() != Some(proof.checkpoint.body.tenant_id.as_str())
        || made != Some(proof.checkpoint.body.root)
    {
        found.push(failure(id, Some(position), format!("entry {position} does not match checkpoint {id} root")));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(text: &str) -> Hash {
        hash_from_hex(text).expect("a hash")
    }

    fn bytes(text: &str) -> Vec<u8> {
        (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex")).collect()
    }

    /// The leaves of certificate-transparency's Merkle tree tests (RFC 6962), and the root of each prefix.
    const CT_LEAVES: [&str; 8] =
        ["", "00", "10", "2021", "3031", "40414243", "5051525354555657", "606162636465666768696a6b6c6d6e6f"];
    const CT_ROOTS: [&str; 9] = [
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
        "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
        "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
        "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
        "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
    ];

    fn ct_leaves() -> Vec<Hash> {
        CT_LEAVES.iter().map(|leaf| leaf_hash(&bytes(leaf))).collect()
    }

    #[test]
    fn roots_match_the_rfc_6962_test_vectors_for_every_size() {
        let leaves = ct_leaves();
        for (size, expected) in CT_ROOTS.iter().enumerate() {
            assert_eq!(to_hex(&root(&leaves[..size])), *expected, "size {size}");
        }
    }

    #[test]
    fn inclusion_proofs_match_the_rfc_6962_test_vectors() {
        let leaves = ct_leaves();
        let cases: [(usize, usize, &[&str]); 4] = [
            (0, 1, &[]),
            (
                0,
                8,
                &[
                    "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
                    "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                    "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
                ],
            ),
            (
                5,
                8,
                &[
                    "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
                    "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
                    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
                ],
            ),
            (2, 3, &["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"]),
        ];
        for (index, size, expected) in cases {
            let proof = inclusion_proof(&leaves[..size], index).expect("a proof");
            let expected: Vec<Hash> = expected.iter().map(|p| h(p)).collect();
            assert_eq!(proof, expected, "leaf {index} of {size}");
            let got = root_from_inclusion_proof(index as u64, size as u64, &leaves[index], &proof);
            assert_eq!(got, Some(h(CT_ROOTS[size])), "leaf {index} of {size} verifies");
        }
    }

    #[test]
    fn every_proof_of_every_tree_size_verifies_and_a_wrong_leaf_or_index_does_not() {
        let leaves: Vec<Hash> = (0u8..37).map(|i| leaf_hash(&[i, i.wrapping_mul(7)])).collect();
        for n in 1..=leaves.len() {
            let tree = &leaves[..n];
            let r = root(tree);
            for i in 0..n {
                let proof = inclusion_proof(tree, i).expect("proof");
                assert_eq!(root_from_inclusion_proof(i as u64, n as u64, &tree[i], &proof), Some(r), "{i} of {n}");
                let other = leaf_hash(b"other");
                assert_ne!(root_from_inclusion_proof(i as u64, n as u64, &other, &proof), Some(r));
                if n > 1 {
                    let j = (i + 1) % n;
                    assert_ne!(root_from_inclusion_proof(j as u64, n as u64, &tree[i], &proof), Some(r), "{i}→{j}");
                }
            }
            assert_eq!(inclusion_proof(tree, n), None);
            assert_eq!(root_from_inclusion_proof(n as u64, n as u64, &tree[0], &[]), None);
        }
    }

    fn record() -> AuditRecord {
        AuditRecord {
            position: "1-900-3".into(),
            stream_id: "rsv_1".into(),
            stream_version: 1,
            event_type: "reservation.placed".into(),
            tenant_id: Some("acme".into()),
            decision: "allowed".into(),
            reason: None,
            identity: Some("alice@acme".into()),
            session_kind: Some("user".into()),
            agent: None,
            delegation: None,
            request_id: Some("req_1".into()),
            admission_tenant_id: Some("acme".into()),
            recorded_at_ms: 1_893_456_000_000,
        }
    }

    #[test]
    fn every_field_of_an_entry_changes_its_leaf_and_an_absent_text_is_not_an_empty_one() {
        let base = record().leaf_hash();
        type Change = Box<dyn Fn(&mut AuditRecord)>;
        let changes: Vec<Change> = vec![
            Box::new(|r| r.position = "1-900-4".into()),
            Box::new(|r| r.stream_id = "rsv_2".into()),
            Box::new(|r| r.stream_version = 2),
            Box::new(|r| r.event_type = "reservation.denied".into()),
            Box::new(|r| r.tenant_id = None),
            Box::new(|r| r.decision = "denied".into()),
            Box::new(|r| r.reason = Some(String::new())),
            Box::new(|r| r.identity = Some("mallory@acme".into())),
            Box::new(|r| r.session_kind = None),
            Box::new(|r| r.agent = Some("a".into())),
            Box::new(|r| r.delegation = Some("d".into())),
            Box::new(|r| r.request_id = None),
            Box::new(|r| r.admission_tenant_id = Some("globex".into())),
            Box::new(|r| r.recorded_at_ms += 1),
        ];
        for (i, change) in changes.iter().enumerate() {
            let mut changed = record();
            change(&mut changed);
            assert_ne!(changed.leaf_hash(), base, "change {i}");
        }
        // Moving a character between neighbouring texts changes the encoding too.
        let mut a = record();
        a.stream_id = "rsv_1r".into();
        a.event_type = "eservation.placed".into();
        assert_ne!(a.encode(), record().encode());
    }

    #[test]
    fn a_checkpoint_hash_covers_every_field_and_its_id_is_a_prefix_of_it() {
        let body = CheckpointBody {
            tenant_id: "acme".into(),
            sequence: 1,
            hour_ms: hour_of(1_893_456_000_000 + 5),
            first_position: "1-900-3".into(),
            last_position: "1-950-1".into(),
            leaf_count: 4,
            root: [7; 32],
            previous_hash: GENESIS,
        };
        assert_eq!(body.hour_ms, 1_893_456_000_000);
        assert!(body.id().starts_with("ckp_") && to_hex(&body.hash()).starts_with(&body.id()[4..]));
        let mut other = body.clone();
        other.previous_hash = [1; 32];
        assert_ne!(other.hash(), body.hash());
        let mut other = body.clone();
        other.leaf_count = 5;
        assert_ne!(other.hash(), body.hash());
        assert_eq!(position_key("1-900-3"), Some((1, 900, 3)));
        assert_eq!(position_key("1-900"), None);
        assert!(position_key("1-2-3") < position_key("1-10-1"), "txids compare as numbers");
    }

    fn signed_claims(records: &[AuditRecord], per: usize) -> Vec<CheckpointClaim> {
        let mut claims: Vec<CheckpointClaim> = Vec::new();
        for (i, chunk) in records.chunks(per).enumerate() {
            let leaves: Vec<(String, Hash)> = chunk.iter().map(|r| (r.position.clone(), r.leaf_hash())).collect();
            let hashes: Vec<Hash> = leaves.iter().map(|(_, h)| *h).collect();
            let body = CheckpointBody {
                tenant_id: "acme".into(),
                sequence: i as i64 + 1,
                hour_ms: i as i64 * HOUR_MS,
                first_position: chunk[0].position.clone(),
                last_position: chunk[chunk.len() - 1].position.clone(),
                leaf_count: chunk.len() as i64,
                root: root(&hashes),
                previous_hash: claims.last().map_or(GENESIS, |c| c.hash),
            };
            claims.push(CheckpointClaim {
                id: body.id(),
                hash: body.hash(),
                body,
                public_key: "k".into(),
                signature: b"ok".to_vec(),
                leaves: Some(leaves),
            });
        }
        claims
    }

    /// A stand-in signature check: "ok" by key "k" is the only valid signature.
    fn signed(key: &str, _: &[u8], signature: &[u8]) -> bool {
        key == "k" && signature == b"ok"
    }

    #[test]
    fn verification_names_a_changed_a_missing_and_an_added_entry_and_a_broken_chain() {
        let records: Vec<AuditRecord> =
            (1..=6).map(|i| AuditRecord { position: format!("1-{}-1", 100 + i), ..record() }).collect();
        let claims = signed_claims(&records, 3);
        assert_eq!(verify_chain(&claims, "k", &signed), vec![]);
        assert!(claims.iter().all(|c| verify_entries(c, &records).is_empty()));

        let mut changed = records.clone();
        changed[1].identity = Some("mallory@acme".into());
        let found = verify_entries(&claims[0], &changed);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].message, format!("entry 1-102-1 does not match checkpoint {} (leaf 1)", claims[0].id));

        let mut missing = records.clone();
        missing.remove(4);
        let found = verify_entries(&claims[1], &missing);
        assert_eq!(found.iter().map(|f| f.position.as_deref()).collect::<Vec<_>>(), [Some("1-105-1")]);
        assert!(found[0].message.contains("is missing"));

        let mut added = records.clone();
        added.push(AuditRecord { position: "1-104-9".into(), ..record() });
        let found = verify_entries(&claims[1], &added);
        assert_eq!(found.iter().map(|f| f.position.as_deref()).collect::<Vec<_>>(), [Some("1-104-9")]);

        let mut without_leaves = claims[0].clone();
        without_leaves.leaves = None;
        assert_eq!(verify_entries(&without_leaves, &records), vec![]);
        assert!(verify_entries(&without_leaves, &changed)[0].message.contains("do not match its root"));

        let mut broken = claims.clone();
        broken[1].body.previous_hash = [9; 32];
        let found = verify_chain(&broken, "k", &signed);
        assert!(
            found.iter().any(|f| f.message == format!("chain broken between {} and {}", claims[0].id, claims[1].id))
        );
        assert!(found.iter().any(|f| f.message.contains("does not hash to what it claims")), "{found:?}");
        let mut forged = claims[0].clone();
        forged.signature = b"no".to_vec();
        assert_eq!(
            verify_checkpoint(&forged, "k", &signed)[0].message,
            format!("checkpoint {} signature invalid", forged.id)
        );
        assert!(verify_checkpoint(&claims[0], "other", &signed)[0].message.contains("not the pinned other"));

        let leaves: Vec<Hash> = records[..3].iter().map(AuditRecord::leaf_hash).collect();
        let proof = ProofClaim {
            entry: changed[1].clone(),
            leaf_index: 1,
            checkpoint: claims[0].clone(),
            audit_path: inclusion_proof(&leaves, 1).expect("proof"),
        };
        let found = verify_proof(&proof, "k", &signed);
        assert_eq!(found[0].message, format!("entry 1-102-1 does not match checkpoint {} root", claims[0].id));
        let proof = ProofClaim { entry: records[1].clone(), ..proof };
        assert_eq!(verify_proof(&proof, "k", &signed), vec![]);
    }
}
