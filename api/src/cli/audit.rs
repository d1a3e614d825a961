//! `better-compute audit export` and `audit verify`: an auditor's copy of the tamper-evident audit trail (the
//! checkpoints with their leaves, the entries, inclusion proofs) fetched through the API, and its verification
//! offline against a pinned audit key, or on the server against the database as it is now.

use std::path::Path;

use anyhow::Context as _;
use bc_domain::audit::{self, AuditRecord, Failure};
use bc_wire::audit::AuditBundleDto;
use clap::Args;

use super::Connection;

/// `audit export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Another tenant's trail (for the root tenant's administrators); the caller's own by default.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Also export the inclusion proof of the entry at this position (repeat for each).
    #[arg(long = "proof")]
    pub proofs: Vec<String>,
    #[command(flatten)]
    pub connection: Connection,
}

/// Fetches the checkpoints (each with its leaves), the entries and the asked proofs into one bundle.
pub async fn export(args: &ExportArgs) -> anyhow::Result<AuditBundleDto> {
    let client = args.connection.client()?;
    let listed = client.audit_checkpoints(args.tenant.as_deref()).await.context("list the audit checkpoints")?;
    let mut checkpoints = Vec::with_capacity(listed.len());
    for checkpoint in &listed {
        checkpoints
            .push(client.audit_checkpoint(&checkpoint.id).await.with_context(|| format!("read {}", checkpoint.id))?);
    }
    let entries = match &args.tenant {
        Some(tenant) => client.fleet_audit(tenant).await,
        None => client.audit().await,
    }
    .context("read the audit trail")?;
    let mut proofs = Vec::with_capacity(args.proofs.len());
    for position in &args.proofs {
        proofs.push(client.audit_proof(position).await.with_context(|| format!("read the proof of {position}"))?);
    }
    // The key the server says it signs with travels along for reference; verify pins its own.
    let public_key = client.audit_key().await.ok().map(|key| key.public_key);
    Ok(AuditBundleDto { public_key, checkpoints, entries, proofs })
}

/// Every failure of `bundle` against `pinned_key`: the checkpoints' chains and signatures, each checkpoint
/// against the bundle's entries (when it holds any), and each proof. Empty when everything holds.
pub fn verify_bundle(bundle: &AuditBundleDto, pinned_key: &str) -> Vec<Failure> {
    let unreadable = |message: String| Failure { checkpoint_id: None, position: None, message };
    let signed = &bc_pki::audit::verify_signature;
    let mut found = Vec::new();
    let mut claims = Vec::with_capacity(bundle.checkpoints.len());
    for checkpoint in &bundle.checkpoints {
        match checkpoint.claim() {
            Ok(claim) => claims.push(claim),
            Err(message) => found.push(unreadable(message)),
        }
    }
    found.extend(audit::verify_chain(&claims, pinned_key, signed));
    if !bundle.entries.is_empty() {
        let records: Vec<AuditRecord> = bundle.entries.iter().map(AuditRecord::from).collect();
        for claim in &claims {
            found.extend(audit::verify_entries(claim, &records));
        }
    }
    for proof in &bundle.proofs {
        match proof.claim() {
            Ok(claim) => found.extend(audit::verify_proof(&claim, pinned_key, signed)),
            Err(message) => found.push(unreadable(message)),
        }
    }
    found
}

/// Reads a bundle from `path` (`-` for standard input).
pub fn read_bundle(path: &Path) -> anyhow::Result<AuditBundleDto> {
    let text = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("read the bundle from standard input")?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("read the bundle {}", path.display()))?
    };
    serde_json::from_str(&text).with_context(|| format!("parse the bundle {}", path.display()))
}

/// Prints every failure to standard error and fails naming the first, or says what was checked.
pub fn report(failures: &[Failure], checked: &str) -> anyhow::Result<()> {
    let Some(first) = failures.first() else {
        println!("ok: {checked}");
        return Ok(());
    };
    for failure in failures {
        eprintln!("FAILED: {failure}");
    }
    match failures.len() {
        1 => anyhow::bail!("audit verification failed: {first}"),
        n => anyhow::bail!("audit verification failed: {first} (and {} more)", n - 1),
    }
}
