//! The site agent's side of workflows: which running `site` steps it should run now (the BMC calls of its
//! site's machines, with their credentials opened), and its reports. One agent serves a site at a time: it
//! holds the lease `site:<id>:boot`, renewed by each of its polls; a standby gets no steps until the lease
//! lapses.

use std::time::Duration;

use bc_domain::Rejection;
use bc_domain::agent::{ImageToWrite, SiteStep, SiteWork, StepReport};
use bc_domain::id::{NodeId, WorkflowId};
use bc_domain::node::NodeBmc;
use bc_domain::profile::RunsOn;
use bc_domain::workflow::Report;
use bc_eventstore::{TxOptions, lease};

use crate::agents::NodeAuth;
use crate::store;
use crate::{App, AppResult, Committed};

/// How long a site agent holds its site after its last poll.
pub const SITE_LEASE: Duration = Duration::from_secs(20);

/// The site lease's name.
pub fn site_lease(site: &str) -> String {
    format!("site:{site}:boot")
}

impl App {
    /// The site of a `site` agent, or `FORBIDDEN` for any other node.
    pub(crate) async fn agent_site(&self, agent: &NodeAuth) -> AppResult<String> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let found = store::site::role_and_site(&mut tx, agent.node_id.as_str()).await?;
        tx.commit().await?;
        let Some((role, site)) = found else {
            return Err(Rejection::NotFound { kind: "node", id: agent.node_id.to_string() }.into());
        };
        if role != "site" {
            return Err(Rejection::Forbidden(format!(
                "node {} is a {role}, not a site agent: it runs no site steps",
                agent.node_id
            ))
            .into());
        }
        Ok(site)
    }

    /// The running `site` steps of the site's machines, when this agent serves the site.
    pub async fn site_work(&self, agent: &NodeAuth) -> AppResult<SiteWork> {
        let site = self.agent_site(agent).await?;
        let held = lease::acquire(&self.db, &site_lease(&site), agent.node_id.as_str(), SITE_LEASE).await?;
        if held.is_none() {
            return Ok(SiteWork { serving: false, steps: Vec::new() });
        }
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let rows = store::site::running_steps(&mut tx, &site, crate::lifecycle::BMC_CREDENTIALS).await?;
        tx.commit().await?;
        let mut steps = Vec::with_capacity(rows.len());
        for row in rows {
            let corrupt = |what: &str, err: String| store::corrupt(what, err);
            let text = |value: &str| serde_json::Value::String(value.to_owned());
            let node_id: NodeId =
                row.node_id.parse().map_err(|e: bc_domain::id::IdError| corrupt("a node id", e.to_string()))?;
            let bmc = NodeBmc {
                driver: serde_json::from_value(text(&row.driver))
                    .map_err(|e| corrupt("a BMC driver", e.to_string()))?,
                address: row.address,
                system_id: row.system_id,
                insecure_tls: row.insecure_tls,
                drivers: serde_json::from_str(&row.drivers).map_err(|e| corrupt("a node's drivers", e.to_string()))?,
                boot_mac: row.boot_mac,
            };
            let Some(sealed) = &row.sealed else {
                tracing::warn!(node = %node_id, "an enrolled node has no sealed BMC credentials; its site steps wait");
                continue;
            };
            let credentials = self.open_bmc_credentials(&node_id, sealed)?;
            steps.push(SiteStep {
                workflow_id: row
                    .workflow_id
                    .parse()
                    .map_err(|e: bc_domain::id::IdError| corrupt("a workflow id", e.to_string()))?,
                index: u32::try_from(row.index).unwrap_or_default(),
                attempt: u32::try_from(row.attempt).unwrap_or_default(),
                action: serde_json::from_value(text(&row.action))
                    .map_err(|e| corrupt("a step's action", e.to_string()))?,
                node_id,
                deadline_ms: row.deadline_ms.unwrap_or_default(),
                bmc,
                username: credentials.username,
                password: credentials.password,
                media: match row.media {
                    Some((id, sha256, size)) => Some(ImageToWrite {
                        image_id: id
                            .parse()
                            .map_err(|e: bc_domain::id::IdError| corrupt("an image id", e.to_string()))?,
                        sha256,
                        size: u64::try_from(size).unwrap_or_default(),
                        format: bc_domain::image::ImageFormat::Iso,
                    }),
                    None => None,
                },
            });
        }
        Ok(SiteWork { serving: true, steps })
    }

    /// A site agent's report on a site step of one of its site's machines.
    pub async fn report_site_step(
        &self,
        agent: &NodeAuth,
        workflow_id: &WorkflowId,
        index: u32,
        report: &StepReport,
    ) -> AppResult<Committed<()>> {
        let site = self.agent_site(agent).await?;
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let machine = store::site::workflow_machine(&mut tx, workflow_id.as_str()).await?;
        tx.commit().await?;
        let node = match machine {
            Some((node, machine_site)) if machine_site == site => node,
            _ => return Err(Rejection::NotFound { kind: "workflow", id: workflow_id.to_string() }.into()),
        };
        let outcome = if report.ok {
            Report::Succeeded { detail: report.message.clone() }
        } else {
            Report::Failed { error: report.message.clone().unwrap_or_else(|| "failed".to_owned()) }
        };
        let done = self.report_step(&agent.caller(), workflow_id, index, report.attempt, RunsOn::Site, outcome).await?;
        if let Some(power) = report.power {
            let node: NodeId =
                node.parse().map_err(|e: bc_domain::id::IdError| store::corrupt("a node id", e.to_string()))?;
            self.observe_power(&agent.caller(), &node, power).await?;
        }
        Ok(done)
    }
}
