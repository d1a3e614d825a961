//! `nodes` version 2: every node as the domain folds its stream ([`node::evolve`]), with the tenant that owns
//! its pool (the trust rule reads it, and it is whom the node is shown to). A batch is applied as load, fold,
//! write back: two statements per batch, whatever its size.

use std::collections::HashMap;

use bc_domain::node::{self, Node, NodeEvent};
use bc_domain::stream::AnyEvent;
use bc_eventstore::{Result, Tx, sql};
use futures_util::future::BoxFuture;

use super::folded;
use super::json;
use crate::framework::{Envelope, Projection};

/// Version 2 of the nodes read model.
#[derive(Debug, Clone, Copy)]
pub struct NodesV2;

/// A node's fold and its pool's owner.
struct Row {
    node: Node,
    pool_owner: String,
}

impl Projection for NodesV2 {
    fn name(&self) -> &'static str {
        "nodes"
    }

    fn version(&self) -> u32 {
        2
    }

    fn event_types(&self) -> &'static [&'static str] {
        // Every node event type: the model folds each node whole.
        <NodeEvent as bc_domain::event::DomainEvent>::event_types()
    }

    fn tables(&self) -> &'static [&'static str] {
        &["nodes_v2"]
    }

    fn apply<'a>(&'a self, tx: &'a mut Tx, events: &'a [Envelope]) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let events: Vec<(&NodeEvent, Option<&str>)> = events
                .iter()
                .filter_map(|e| match &e.event {
                    Some(AnyEvent::Node(event)) => Some((event, e.recorded.tenant_id.as_deref())),
                    _ => None,
                })
                .collect();
            if events.is_empty() {
                return Ok(());
            }
            let mut ids: Vec<&str> = events.iter().map(|(e, _)| e.node_id().as_str()).collect();
            ids.sort_unstable();
            ids.dedup();
            let loaded: Vec<(String, Node)> = folded::load(tx, "nodes_v2", "node_id", &ids).await?;
            let owners: Vec<(String, String)> =
                sql::query_as("SELECT node_id, pool_owner_tenant_id FROM nodes_v2 WHERE node_id = ANY($1::text[])")
                    .bind(&ids)
                    .fetch_all(tx.conn())
                    .await?;
            let owners: HashMap<String, String> = owners.into_iter().collect();
            let mut rows: HashMap<String, Row> = loaded
                .into_iter()
                .map(|(id, node)| {
                    let pool_owner = owners.get(&id).cloned().unwrap_or_default();
                    (id, Row { node, pool_owner })
                })
                .collect();
            for (event, tenant) in events {
                let id = event.node_id().as_str();
                let known = rows.remove(id);
                let pool_owner =
                    known.as_ref().map_or_else(|| tenant.unwrap_or_default().to_owned(), |r| r.pool_owner.clone());
                if let Some(node) = node::evolve(known.map(|r| r.node), event) {
                    rows.insert(id.to_owned(), Row { node, pool_owner });
                }
            }
            let (gone, kept): (Vec<&Row>, Vec<&Row>) = rows.values().partition(|r| r.node.deleted_at_ms.is_some());
            let gone: Vec<&str> = gone.iter().map(|r| r.node.id.as_str()).collect();
            folded::delete(tx, "nodes_v2", "node_id", &gone).await?;
            store(tx, &kept).await
        })
    }
}

async fn store(tx: &mut Tx, rows: &[&Row]) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut sorted: Vec<&&Row> = rows.iter().collect();
    sorted.sort_by(|a, b| a.node.id.cmp(&b.node.id));
    let ids: Vec<&str> = sorted.iter().map(|r| r.node.id.as_str()).collect();
    let pools: Vec<&str> = sorted.iter().map(|r| r.node.pool_id.as_str()).collect();
    let owners: Vec<&str> = sorted.iter().map(|r| r.pool_owner.as_str()).collect();
    let docs = sorted.iter().map(|r| json(&r.node)).collect::<Result<Vec<_>>>()?;
    sql::query(
        "INSERT INTO nodes_v2 (node_id, pool_id, pool_owner_tenant_id, folded)
         SELECT u.id, u.pool, u.owner, u.folded::jsonb
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS u(id, pool, owner, folded)
         ON CONFLICT (node_id) DO UPDATE
             SET pool_id = excluded.pool_id, pool_owner_tenant_id = excluded.pool_owner_tenant_id,
                 folded = excluded.folded",
    )
    .bind(&ids)
    .bind(&pools)
    .bind(&owners)
    .bind(&docs)
    .execute(tx.conn())
    .await?;
    Ok(())
}
