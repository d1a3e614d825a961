//! The boot path's side of workflows: what a machine that boots from the network gets (the site agent asks on
//! its behalf: the ramdisk with a single-use boot credential when its workflow is at a ramdisk step, its own
//! disk otherwise), the ramdisk's claim of a session with that credential, its steps (with the image to write
//! and the deployed machine's configuration, a fresh join token included), and its reports (an inspection's
//! inventory becomes the node's hardware in the same transaction as the step's end).
//!
//! A boot credential is claimed once; a claim ends the earlier sessions of the workflow, so only the latest
//! boot of a machine speaks for it. A session is bound to one workflow of one machine: it reads that
//! workflow's steps and reports on them, nothing else.

use bc_domain::Rejection;
use bc_domain::agent::{
    BootAnswer, DeployedConfig, ImageToWrite, RamdiskReport, RamdiskSession, RamdiskStep, RamdiskWork,
};
use bc_domain::id::{JoinTokenId, NodeId, WorkflowId};
use bc_domain::node::lifecycle::normalize_mac;
use bc_domain::profile::{ProfileSpec, RunsOn, StepAction};
use bc_domain::workflow::{self, Report, StepState, Workflow};
use bc_eventstore::events::ExpectedVersion;
use bc_eventstore::{ScopedFutureExt as _, Tx, TxOptions, clock};

use crate::agents::{NodeAuth, new_secret, node_caller, record_inspection, record_join_token};
use crate::store::site::{self, RamdiskCredential};
use crate::store::{self, corrupt};
use crate::work::{self, WorkKey};
use crate::{App, AppResult, Committed, record};

/// How a boot credential starts.
pub const BOOT_TOKEN_PREFIX: &str = "rbt_";
/// How a ramdisk session credential starts.
pub const SESSION_PREFIX: &str = "rds_";
/// How long a boot credential waits to be claimed.
pub const BOOT_TOKEN_TTL_MS: i64 = 30 * 60 * 1000;
/// The longest a ramdisk session lasts (it ends with its workflow before).
pub const SESSION_TTL_MS: i64 = 24 * 60 * 60 * 1000;
/// How long the join token handed to a deployed machine is valid.
pub const DEPLOY_JOIN_TOKEN_TTL_S: u64 = 2 * 60 * 60;

/// A ramdisk session: the workflow and machine it speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RamdiskAuth {
    pub workflow_id: WorkflowId,
    pub node_id: NodeId,
}

fn unauthenticated(message: impl Into<String>) -> Rejection {
    Rejection::Unauthenticated(message.into())
}

/// Whether the machine should boot the ramdisk for `wf`: the workflow runs and a ramdisk step is still ahead
/// of it (or running).
fn boots_ramdisk(wf: &Workflow) -> bool {
    let Some((current, _, _)) = wf.current() else { return false };
    wf.outcome.is_none() && wf.created.steps.iter().skip(current as usize).any(|step| step.runs_on == RunsOn::Ramdisk)
}

fn workflow_id(text: &str) -> AppResult<WorkflowId> {
    text.parse().map_err(|err| corrupt("a workflow id", err))
}

fn node_id(text: &str) -> AppResult<NodeId> {
    text.parse().map_err(|err| corrupt("a node id", err))
}

impl App {
    /// What the machine of the agent's site with boot MAC `mac` (or Redfish system `uuid`) boots: the ramdisk,
    /// with a fresh single-use boot credential, when its workflow is at or before a ramdisk step; its own disk
    /// otherwise (an answer with no workflow).
    pub async fn site_boot(&self, agent: &NodeAuth, mac: Option<&str>, uuid: Option<&str>) -> AppResult<BootAnswer> {
        let mac = mac.map(normalize_mac).transpose()?;
        if let Some(uuid) = uuid
            && (uuid.is_empty() || uuid.len() > 255 || !uuid.chars().all(|c| c.is_ascii_graphic()))
        {
            return Err(Rejection::invalid("uuid", "1 to 255 printable characters").into());
        }
        if mac.is_none() && uuid.is_none() {
            return Err(Rejection::invalid("mac", "name the booting machine by its MAC address or its UUID").into());
        }
        let site = self.agent_site(agent).await?;
        let (token, hash) = new_secret(BOOT_TOKEN_PREFIX)?;
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let (site, mac, hash, token) = (&site, &mac, &hash, &token);
                async move {
                    let Some(node) = site::machine_booting(tx, site, mac.as_deref(), uuid).await? else {
                        return Ok(BootAnswer { node_id: None, workflow_id: None, boot_token: None });
                    };
                    let node = node_id(&node)?;
                    let running = store::workflows::running_on(tx, node.as_str()).await?;
                    let wf = match running {
                        Some(id) => store::workflow_aggregate(tx, &workflow_id(&id)?).await?.map(|(wf, _)| wf),
                        None => None,
                    };
                    let Some(wf) = wf.filter(boots_ramdisk) else {
                        return Ok(BootAnswer { node_id: Some(node), workflow_id: None, boot_token: None });
                    };
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let id = wf.created.workflow_id.clone();
                    site::insert_ramdisk_credential(
                        tx,
                        hash,
                        RamdiskCredential::Boot,
                        id.as_str(),
                        node.as_str(),
                        now_ms + BOOT_TOKEN_TTL_MS,
                        None,
                    )
                    .await?;
                    Ok(BootAnswer { node_id: Some(node), workflow_id: Some(id), boot_token: Some(token.clone()) })
                }
                .scope_boxed()
            })
            .await
    }

    /// The bytes of an image by hash, for the agent's site: only an image a running deployment on a machine of
    /// the site writes.
    pub async fn site_image(&self, agent: &NodeAuth, sha256: &str) -> AppResult<crate::images::ImageContent> {
        let site = self.agent_site(agent).await?;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let image = site::image_deployed_at(&mut tx, &site, sha256).await?;
        tx.commit().await?;
        let Some(image) = image else {
            return Err(Rejection::NotFound { kind: "image being deployed at this site", id: sha256.to_owned() }.into());
        };
        self.image_content(&image.parse().map_err(|err| corrupt("an image id", err))?).await
    }

    /// A ramdisk claims its session with the boot credential of its iPXE script: once, while the workflow runs.
    pub async fn claim_ramdisk_session(&self, boot_token: &str) -> AppResult<RamdiskSession> {
        if !boot_token.starts_with(BOOT_TOKEN_PREFIX) {
            return Err(unauthenticated(format!("a boot credential starts with {BOOT_TOKEN_PREFIX}")).into());
        }
        let hash = bc_domain::sha256_hex(boot_token);
        let (session, session_hash) = new_secret(SESSION_PREFIX)?;
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let (hash, session, session_hash) = (&hash, &session, &session_hash);
                async move {
                    let Some(row) = site::lock_ramdisk_credential(tx, hash, RamdiskCredential::Boot).await? else {
                        return Err(unauthenticated("the boot credential is unknown").into());
                    };
                    // Claimed before, its session never used: the answer to that claim was lost on its way, and
                    // this claim replaces the session it made.
                    if row.claimed && !site::unused_session_of(tx, hash).await? {
                        return Err(unauthenticated(
                            "the boot credential was already claimed: each boot of the ramdisk gets its own",
                        )
                        .into());
                    }
                    if row.expired {
                        return Err(unauthenticated("the boot credential expired").into());
                    }
                    if store::workflows::running_on(tx, &row.node_id).await?.as_deref() != Some(&row.workflow_id) {
                        return Err(unauthenticated(format!("workflow {} has ended", row.workflow_id)).into());
                    }
                    site::claim_boot_credential(tx, hash, &row.workflow_id).await?;
                    let now_ms = clock::compute_now_ms(tx).await?;
                    site::insert_ramdisk_credential(
                        tx,
                        session_hash,
                        RamdiskCredential::Session,
                        &row.workflow_id,
                        &row.node_id,
                        now_ms + SESSION_TTL_MS,
                        Some(hash),
                    )
                    .await?;
                    Ok(RamdiskSession {
                        workflow_id: workflow_id(&row.workflow_id)?,
                        node_id: node_id(&row.node_id)?,
                        token: session.clone(),
                    })
                }
                .scope_boxed()
            })
            .await
    }

    /// The session a ramdisk's bearer credential names.
    pub async fn ramdisk_auth(&self, token: &str) -> AppResult<RamdiskAuth> {
        if !token.starts_with(SESSION_PREFIX) {
            return Err(unauthenticated(format!("a ramdisk session credential starts with {SESSION_PREFIX}")).into());
        }
        let hash = bc_domain::sha256_hex(token);
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let found = site::ramdisk_session(&mut tx, &hash).await?;
        tx.commit().await?;
        let Some((wf, node, used)) = found else {
            return Err(unauthenticated(
                "the ramdisk session is unknown or over (a later boot of the machine claimed another)",
            )
            .into());
        };
        if !used {
            // From its first use on, the boot credential that claimed it cannot claim again.
            let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
            site::mark_session_used(&mut tx, &hash).await?;
            tx.commit().await?;
        }
        Ok(RamdiskAuth { workflow_id: workflow_id(&wf)?, node_id: node_id(&node)? })
    }

    /// Where the session's workflow is: the running ramdisk step, with the image it writes or the configuration
    /// of the deployed machine (and a fresh join token for it).
    pub async fn ramdisk_work(&self, auth: &RamdiskAuth) -> AppResult<RamdiskWork> {
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                async move {
                    let Some((wf, _)) = store::workflow_aggregate(tx, &auth.workflow_id).await? else {
                        return Err(corrupt("a ramdisk session's workflow", "missing"));
                    };
                    let mut work = RamdiskWork {
                        workflow_id: auth.workflow_id.clone(),
                        node_id: auth.node_id.clone(),
                        ended: wf.outcome.is_some(),
                        step: None,
                    };
                    let Some((index, spec, StepState::Running { attempt, deadline_ms, .. })) = wf.current() else {
                        return Ok(work);
                    };
                    if wf.outcome.is_some() || spec.runs_on != RunsOn::Ramdisk {
                        return Ok(work);
                    }
                    let mut step = RamdiskStep {
                        index,
                        attempt: *attempt,
                        action: spec.action,
                        deadline_ms: *deadline_ms,
                        image: None,
                        config: None,
                    };
                    match spec.action {
                        StepAction::WriteImage => step.image = Some(image_to_write(tx, &wf).await?),
                        StepAction::WriteConfig => step.config = Some(self.deployed_config(tx, &wf).await?),
                        _ => {}
                    }
                    work.step = Some(step);
                    Ok(work)
                }
                .scope_boxed()
            })
            .await
    }

    /// The configuration of a machine being deployed, with a fresh single-use join token for its pool.
    async fn deployed_config(&self, tx: &mut Tx, wf: &Workflow) -> AppResult<DeployedConfig> {
        let node = &wf.created.node_id;
        let Some((state, _)) = store::node_aggregate(tx, node).await? else {
            return Err(corrupt("a workflow's node", "missing"));
        };
        let spec = profile_of(tx, wf).await?;
        let (token, hash) = new_secret(bc_domain::agent::JOIN_TOKEN_PREFIX)?;
        let caller = node_caller(node, &wf.created.tenant_id);
        let id = JoinTokenId::generate();
        record_join_token(tx, &caller, &state.pool_id, &wf.created.tenant_id, &id, &hash, DEPLOY_JOIN_TOKEN_TTL_S)
            .await?;
        Ok(DeployedConfig {
            hostname: spec.as_ref().and_then(|s| s.host_config.get("hostname").cloned()).unwrap_or(state.name),
            host_config: spec.as_ref().map(|s| s.host_config.clone()).unwrap_or_default(),
            user_data: spec.and_then(|s| s.user_data),
            join_token: token,
        })
    }

    /// A ramdisk's report on attempt `report.attempt` of step `index` of its workflow. An inspection's report
    /// carries the machine's inventory, recorded as the node's hardware in the same transaction. The same
    /// report again is answered without a change.
    pub async fn report_ramdisk_step(
        &self,
        auth: &RamdiskAuth,
        index: u32,
        report: &RamdiskReport,
    ) -> AppResult<Committed<()>> {
        let document = report.inventory.as_ref().map(crate::agents::inspected_document).transpose()?;
        let outcome = if report.ok {
            Report::Succeeded { detail: report.message.clone() }
        } else {
            Report::Failed { error: report.message.clone().unwrap_or_else(|| "failed".to_owned()) }
        };
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let (outcome, document) = (outcome.clone(), &document);
                async move {
                    let Some((wf, version)) = store::workflow_aggregate(tx, &auth.workflow_id).await? else {
                        return Err(corrupt("a ramdisk session's workflow", "missing"));
                    };
                    let caller = &node_caller(&auth.node_id, &wf.created.tenant_id);
                    let action = wf.created.steps.get(index as usize).map(|s| s.action);
                    let inspection = action == Some(StepAction::Inspect) && report.ok;
                    match (inspection, document.is_some()) {
                        (true, false) => {
                            return Err(Rejection::invalid(
                                "inventory",
                                "an inspection reports the machine's inventory",
                            )
                            .into());
                        }
                        (false, true) => {
                            return Err(
                                Rejection::invalid("inventory", "only an inspection reports an inventory").into()
                            );
                        }
                        _ => {}
                    }
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let events = workflow::report(&wf, index, report.attempt, RunsOn::Ramdisk, outcome, now_ms)?;
                    if events.is_empty() {
                        return Ok(Committed { value: (), position: None });
                    }
                    if inspection && let Some(document) = document {
                        record_inspection(tx, caller, &auth.node_id, document).await?;
                    }
                    let tenant = &wf.created.tenant_id;
                    let stream = auth.workflow_id.as_str();
                    let position = record(tx, caller, stream, tenant, ExpectedVersion::Exact(version), events).await?;
                    work::wake_now(tx, &WorkKey::Workflow(auth.workflow_id.clone())).await?;
                    Ok(Committed { value: (), position })
                }
                .scope_boxed()
            })
            .await
    }
}

/// The profile a deployment runs, if it has one.
async fn profile_of(tx: &mut Tx, wf: &Workflow) -> AppResult<Option<ProfileSpec>> {
    let Some(profile_id) = &wf.created.profile_id else { return Ok(None) };
    let Some(row) = store::profiles::profile(tx, profile_id.as_str()).await? else {
        return Err(corrupt("a workflow's profile", "missing"));
    };
    Ok(Some(serde_json::from_str(&row.spec).map_err(|err| corrupt("a profile's spec", err))?))
}

/// The image a deployment's profile writes.
async fn image_to_write(tx: &mut Tx, wf: &Workflow) -> AppResult<ImageToWrite> {
    let image_id = profile_of(tx, wf).await?.and_then(|spec| spec.image_id);
    let Some(image_id) = image_id else {
        return Err(Rejection::Conflict(format!(
            "workflow {} writes an image, and its profile names none",
            wf.created.workflow_id
        ))
        .into());
    };
    let Some(row) = store::images::image(tx, image_id.as_str()).await? else {
        return Err(Rejection::Conflict(format!("image {image_id} of the profile is gone")).into());
    };
    Ok(ImageToWrite {
        image_id,
        sha256: row.sha256,
        size: u64::try_from(row.size_bytes).map_err(|err| corrupt("an image's size", err))?,
        format: serde_json::from_value(serde_json::Value::String(row.format))
            .map_err(|err| corrupt("an image's format", err))?,
    })
}
