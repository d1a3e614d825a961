//! `pools`: every pool with its offerings and its node count.

use bc_domain::node::{NodeEvent, NodeJoined, NodeRegistered};
use bc_domain::pool::PoolEvent;
use bc_domain::stream::AnyEvent;
use bc_eventstore::{Result, Tx, sql};
use futures_util::future::BoxFuture;

use super::{json, text};
use crate::framework::{Envelope, Projection};

/// Version 1 of the pools read model.
#[derive(Debug, Clone, Copy)]
pub struct PoolsV1;

impl Projection for PoolsV1 {
    fn name(&self) -> &'static str {
        "pools"
    }

    fn version(&self) -> u32 {
        1
    }

    fn event_types(&self) -> &'static [&'static str] {
        &["pool.created", "pool.offered", "pool.quota_set", "node.registered", "node.joined", "node.deleted"]
    }

    fn tables(&self) -> &'static [&'static str] {
        &["pools_v1"]
    }

    fn apply<'a>(&'a self, tx: &'a mut Tx, events: &'a [Envelope]) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            for envelope in events {
                apply_one(tx, envelope).await?;
            }
            Ok(())
        })
    }
}

async fn apply_one(tx: &mut Tx, envelope: &Envelope) -> Result<()> {
    match &envelope.event {
        Some(AnyEvent::Pool(PoolEvent::Created(e))) => {
            sql::query(
                "INSERT INTO pools_v1 (pool_id, site_id, owner_tenant_id, name, class, gpu_model, sharing, agent, policy,
                                       created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, timestamptz 'epoch' + $10::int8 * interval '1 millisecond')",
            )
            .bind(e.pool_id.as_str())
            .bind(e.site_id.as_str())
            .bind(e.owner_tenant_id.as_str())
            .bind(&e.name)
            .bind(text(&e.class)?)
            .bind(&e.gpu_model)
            .bind(e.sharing.as_str())
            .bind(text(&e.agent)?)
            .bind(json(&e.policy)?)
            .bind(e.at_ms)
            .execute(tx.conn())
            .await?;
        }
        Some(AnyEvent::Pool(PoolEvent::Offered(e))) => {
            let offer = serde_json::json!({
                "tenantId": e.tenant_id,
                "quota": e.quota,
                "priority": e.priority,
                "includeDescendants": e.include_descendants,
            });
            sql::query(
                "UPDATE pools_v1 SET offers = (
                     SELECT coalesce(jsonb_agg(o ORDER BY o ->> 'tenantId'), '[]'::jsonb)
                     FROM (SELECT o FROM jsonb_array_elements(offers) AS o WHERE o ->> 'tenantId' <> $2
                           UNION ALL SELECT $3::jsonb) AS s(o))
                 WHERE pool_id = $1",
            )
            .bind(e.pool_id.as_str())
            .bind(e.tenant_id.as_str())
            .bind(json(&offer)?)
            .execute(tx.conn())
            .await?;
        }
        Some(AnyEvent::Pool(PoolEvent::QuotaSet(e))) => {
            sql::query(
                "UPDATE pools_v1 SET offers = (
                     SELECT coalesce(jsonb_agg(CASE WHEN o ->> 'tenantId' = $2 THEN jsonb_set(o, '{quota}', $3::jsonb) ELSE o END
                                               ORDER BY o ->> 'tenantId'), '[]'::jsonb)
                     FROM jsonb_array_elements(offers) AS o)
                 WHERE pool_id = $1",
            )
            .bind(e.pool_id.as_str())
            .bind(e.tenant_id.as_str())
            .bind(json(&e.quota)?)
            .execute(tx.conn())
            .await?;
        }
        Some(AnyEvent::Node(NodeEvent::Registered(NodeRegistered { pool_id, .. })))
        | Some(AnyEvent::Node(NodeEvent::Joined(NodeJoined { pool_id, .. }))) => {
            sql::query("UPDATE pools_v1 SET node_count = node_count + 1 WHERE pool_id = $1")
                .bind(pool_id.as_str())
                .execute(tx.conn())
                .await?;
        }
        Some(AnyEvent::Node(NodeEvent::Deleted(e))) => {
            sql::query("UPDATE pools_v1 SET node_count = node_count - 1 WHERE pool_id = $1")
                .bind(e.pool_id.as_str())
                .execute(tx.conn())
                .await?;
        }
        _ => {}
    }
    Ok(())
}
