//! Tamper-evident audit: per tenant and hour, a Merkle checkpoint over the audit trail's entries, chained to the
//! tenant's previous one and signed with the PKI bundle's audit key (`bc_pki::audit`); reads of checkpoints and
//! inclusion proofs; and the database-side verification that recomputes every checkpoint from the current rows.
//!
//! Which entries a checkpoint holds: its tenant's entries in log position order, from just after the tenant's
//! previous checkpoint's last position, up to (and without) the first entry recorded at or after its hour's end.
//! Its hour is the hour of that first entry, or the hour after the previous checkpoint's, whichever is later; it
//! is made once business time (`compute_now()`) is [`CLOSE_AFTER_MS`] past the hour's end. So every entry lands
//! in exactly one checkpoint, entries of an hour never land in an earlier hour's, and an entry that became
//! visible late (a transaction that committed after the hour closed, or one ordered after a later entry) lands in
//! the next checkpoint instead of being left out.

use bc_domain::audit::{self, CLOSE_AFTER_MS, CheckpointBody, CheckpointClaim, Failure, GENESIS, HOUR_MS, Hash};
use bc_domain::id::TenantId;
use bc_eventstore::{Position, TxOptions, clock};

use super::reads::{self, AuditEntry, Listed, Page};
use super::store::audit::{self as rows, CheckpointRow, LeafRow};
use super::{App, AppError, AppResult};

/// A checkpoint as the API shows it (hashes and the signature in hex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointView {
    pub id: String,
    pub tenant_id: String,
    pub sequence: i64,
    pub hour_ms: i64,
    pub first_position: String,
    pub last_position: String,
    pub leaf_count: i64,
    pub root: String,
    pub previous_hash: String,
    pub hash: String,
    pub public_key: String,
    pub signature: String,
    pub made_at_ms: i64,
    /// Its leaves, on a read of one checkpoint; empty in lists.
    pub leaves: Vec<LeafView>,
}

/// One leaf of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafView {
    pub position: String,
    pub leaf_hash: String,
}

/// An entry, its place in its checkpoint and the audit path that proves it is there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditProof {
    /// The entry as the trail holds it now.
    pub entry: AuditEntry,
    pub leaf_index: i64,
    pub checkpoint: CheckpointView,
    /// The sibling hashes from the leaf up (RFC 9162), hex.
    pub audit_path: Vec<String>,
}

/// Whose checkpoints a read may see: the caller's tenant's only, or any tenant's (a caller the door allowed
/// `fleet.audit.list`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditScope {
    OwnTenant,
    Fleet,
}

fn view(row: CheckpointRow, leaves: &[LeafRow]) -> CheckpointView {
    CheckpointView {
        id: row.id,
        tenant_id: row.tenant_id,
        sequence: row.sequence,
        hour_ms: row.hour_ms,
        first_position: row.first_position.to_string(),
        last_position: row.last_position.to_string(),
        leaf_count: row.leaf_count,
        root: audit::to_hex(&row.root),
        previous_hash: audit::to_hex(&row.previous_hash),
        hash: audit::to_hex(&row.hash),
        public_key: row.public_key,
        signature: audit::to_hex(&row.signature),
        made_at_ms: row.made_at_ms,
        leaves: leaves
            .iter()
            .map(|l| LeafView { position: l.position.to_string(), leaf_hash: audit::to_hex(&l.leaf_hash) })
            .collect(),
    }
}

fn hash_of(bytes: &[u8]) -> Hash {
    <Hash>::try_from(bytes).unwrap_or([0; 32])
}

/// What a stored checkpoint claims, for the verification.
fn claim(row: &CheckpointRow, leaves: &[LeafRow]) -> CheckpointClaim {
    CheckpointClaim {
        id: row.id.clone(),
        body: body(row),
        hash: hash_of(&row.hash),
        public_key: row.public_key.clone(),
        signature: row.signature.clone(),
        leaves: Some(leaves.iter().map(|l| (l.position.to_string(), hash_of(&l.leaf_hash))).collect()),
    }
}

fn body(row: &CheckpointRow) -> CheckpointBody {
    CheckpointBody {
        tenant_id: row.tenant_id.clone(),
        sequence: row.sequence,
        hour_ms: row.hour_ms,
        first_position: row.first_position.to_string(),
        last_position: row.last_position.to_string(),
        leaf_count: row.leaf_count,
        root: hash_of(&row.root),
        previous_hash: hash_of(&row.previous_hash),
    }
}

fn position_of(entry: &AuditEntry) -> AppResult<Position> {
    entry.position.parse().map_err(|err| super::store::corrupt("an audit entry's position", err))
}

impl App {
    /// The key that signs checkpoints: the PKI bundle's. Without a bundle no checkpoint is made.
    pub fn audit_signer(&self) -> Option<bc_pki::audit::AuditSigner> {
        self.pki.as_ref().map(|bundle| bundle.audit_signer())
    }

    /// Makes every checkpoint that is due: for each tenant, one per closed hour holding entries, in order. Safe
    /// to run in several processes at once: a checkpoint another process made first is left as it made it.
    /// Answers how many this call made.
    pub async fn make_audit_checkpoints(&self) -> AppResult<usize> {
        let Some(signer) = self.audit_signer() else {
            return Ok(0);
        };
        let mut made = 0;
        // Each pass makes at most one checkpoint per tenant; the next pass sees the new heads.
        loop {
            let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
            let now_ms = clock::compute_now_ms(&mut tx).await?;
            let table = reads::active_table(&mut tx, "audit_events", "audit_events").await?;
            let backlogs = rows::backlogs(&mut tx, &table).await?;
            tx.commit().await?;
            let mut made_now = 0;
            for backlog in backlogs {
                let head = backlog.head.as_ref();
                let first_hour = audit::hour_of(backlog.first_recorded_at_ms);
                let hour = head.map_or(first_hour, |h| first_hour.max(h.hour_ms + HOUR_MS));
                if hour + HOUR_MS + CLOSE_AFTER_MS > now_ms {
                    continue;
                }
                if self.make_checkpoint(&signer, &table, &backlog.tenant_id, head, hour).await? {
                    made_now += 1;
                }
            }
            if made_now == 0 {
                return Ok(made);
            }
            made += made_now;
        }
    }

    /// Makes `tenant`'s checkpoint of `hour` after `head`; `false` when there was nothing to hold or another
    /// process made it first.
    async fn make_checkpoint(
        &self,
        signer: &bc_pki::audit::AuditSigner,
        table: &str,
        tenant: &str,
        head: Option<&CheckpointRow>,
        hour: i64,
    ) -> AppResult<bool> {
        let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
        let entries =
            rows::entries_before(&mut tx, table, tenant, head.map(|h| &h.last_position), hour + HOUR_MS).await?;
        let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
            tx.commit().await?;
            return Ok(false);
        };
        let leaves = entries
            .iter()
            .map(|e| Ok(LeafRow { position: position_of(e)?, leaf_hash: e.leaf_hash().to_vec() }))
            .collect::<AppResult<Vec<_>>>()?;
        let hashes: Vec<Hash> = leaves.iter().map(|l| hash_of(&l.leaf_hash)).collect();
        let body = CheckpointBody {
            tenant_id: tenant.to_owned(),
            sequence: head.map_or(1, |h| h.sequence + 1),
            hour_ms: hour,
            first_position: first.position.clone(),
            last_position: last.position.clone(),
            leaf_count: leaves.len() as i64,
            root: audit::root(&hashes),
            previous_hash: head.map_or(GENESIS, |h| hash_of(&h.hash)),
        };
        let row = CheckpointRow {
            id: body.id(),
            tenant_id: body.tenant_id.clone(),
            sequence: body.sequence,
            hour_ms: body.hour_ms,
            first_position: position_of(first)?,
            last_position: position_of(last)?,
            leaf_count: body.leaf_count,
            root: body.root.to_vec(),
            previous_hash: body.previous_hash.to_vec(),
            hash: body.hash().to_vec(),
            public_key: signer.public_key_hex(),
            signature: signer.sign(&body.message()).to_vec(),
            made_at_ms: 0,
        };
        let inserted = rows::insert(&mut tx, &row, &leaves).await?;
        tx.commit().await?;
        if inserted {
            tracing::info!(tenant, checkpoint = %row.id, sequence = row.sequence, entries = row.leaf_count, "made an audit checkpoint");
        }
        Ok(inserted)
    }

    /// `tenant`'s checkpoints, oldest first (the page key is the sequence number). The caller must have been
    /// allowed to read `tenant`'s audit trail.
    pub async fn audit_checkpoints(&self, tenant: &TenantId, page: &Page) -> AppResult<Listed<CheckpointView>> {
        let after = page
            .after_key
            .as_deref()
            .map(|key| key.parse::<i64>())
            .transpose()
            .map_err(|_| bc_domain::Rejection::invalid("cursor", "not a cursor this list gave"))?;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let mut found = rows::list(&mut tx, tenant.as_str(), after, i64::from(page.limit) + 1).await?;
        tx.commit().await?;
        let next_key = (found.len() > page.limit as usize).then(|| {
            found.truncate(page.limit as usize);
            found.last().map(|c| c.sequence.to_string())
        });
        Ok(Listed { items: found.into_iter().map(|row| view(row, &[])).collect(), next_key: next_key.flatten() })
    }

    /// The checkpoint `id` with its leaves, if `caller`'s tenant may see it (`scope`); another tenant's answers
    /// as one that does not exist.
    pub async fn audit_checkpoint(
        &self,
        caller: &super::Caller,
        scope: AuditScope,
        id: &str,
    ) -> AppResult<CheckpointView> {
        let not_found = || AppError::Rejected(bc_domain::Rejection::NotFound { kind: "checkpoint", id: id.to_owned() });
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let row = rows::get(&mut tx, id).await?.filter(|row| visible(caller, scope, &row.tenant_id));
        let Some(row) = row else {
            tx.commit().await?;
            return Err(not_found());
        };
        let leaves = rows::leaves(&mut tx, id).await?;
        tx.commit().await?;
        Ok(view(row, &leaves))
    }

    /// The entry at `position`, its checkpoint and its inclusion proof, if `caller`'s tenant may see it. An entry
    /// that no checkpoint holds yet answers as not found, and says so.
    pub async fn audit_proof(
        &self,
        caller: &super::Caller,
        scope: AuditScope,
        position: &Position,
    ) -> AppResult<AuditProof> {
        let not_found = |what: &'static str| {
            AppError::Rejected(bc_domain::Rejection::NotFound { kind: what, id: position.to_string() })
        };
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let table = reads::active_table(&mut tx, "audit_events", "audit_events").await?;
        let entry = rows::entry_at(&mut tx, &table, position).await?;
        let Some(entry) = entry.filter(|e| e.tenant_id.as_deref().is_some_and(|t| visible(caller, scope, t))) else {
            tx.commit().await?;
            return Err(not_found("audit entry"));
        };
        let Some((checkpoint_id, leaf_index)) = rows::leaf_of(&mut tx, position).await? else {
            tx.commit().await?;
            return Err(not_found("checkpoint holding the audit entry"));
        };
        let row = rows::get(&mut tx, &checkpoint_id).await?.ok_or_else(|| not_found("checkpoint"))?;
        let leaves = rows::leaves(&mut tx, &checkpoint_id).await?;
        tx.commit().await?;
        let hashes: Vec<Hash> = leaves.iter().map(|l| hash_of(&l.leaf_hash)).collect();
        let path = usize::try_from(leaf_index)
            .ok()
            .and_then(|index| audit::inclusion_proof(&hashes, index))
            .ok_or_else(|| super::store::corrupt("a checkpoint's leaves", "the leaf index is past them"))?;
        Ok(AuditProof {
            entry,
            leaf_index,
            checkpoint: view(row, &[]),
            audit_path: path.iter().map(|h| audit::to_hex(h)).collect(),
        })
    }

    /// Recomputes every checkpoint (or `tenant`'s) from the audit trail as it is now: each checkpoint signed by
    /// `public_key` and chained, its stored leaves making its root, and each entry it covers hashing to its leaf.
    /// Answers what is wrong, naming the checkpoint and the entry; nothing when all holds.
    pub async fn verify_audit_checkpoints(
        &self,
        tenant: Option<&TenantId>,
        public_key: &str,
    ) -> AppResult<Vec<Failure>> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let table = reads::active_table(&mut tx, "audit_events", "audit_events").await?;
        let checkpoints = rows::all(&mut tx, tenant.map(TenantId::as_str)).await?;
        let mut claims = Vec::with_capacity(checkpoints.len());
        let mut found = Vec::new();
        for row in &checkpoints {
            let leaves = rows::leaves(&mut tx, &row.id).await?;
            let claim = claim(row, &leaves);
            let entries =
                rows::entries_between(&mut tx, &table, &row.tenant_id, &row.first_position, &row.last_position).await?;
            found.extend(audit::verify_entries(&claim, &entries));
            claims.push(claim);
        }
        tx.commit().await?;
        let mut chain = audit::verify_chain(&claims, public_key, &bc_pki::audit::verify_signature);
        chain.extend(found);
        Ok(chain)
    }
}

/// Whether a checkpoint or entry of `tenant` is the caller's to see.
fn visible(caller: &super::Caller, scope: AuditScope, tenant: &str) -> bool {
    scope == AuditScope::Fleet || caller.tenant_id.as_str() == tenant
}
