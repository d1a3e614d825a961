//! `pools` version 2: every pool as the domain folds its stream ([`pool::evolve`]), with the tenants it is
//! offered to (who, with its owner, sees it) and how many nodes it holds.

use std::collections::{BTreeMap, HashMap};

use bc_domain::node::NodeEvent;
use bc_domain::pool::{self, Pool, PoolEvent};
use bc_domain::stream::AnyEvent;
use bc_eventstore::{Result, Tx, sql};
use futures_util::future::BoxFuture;

use super::folded;
use super::json;
use crate::framework::{Envelope, Projection};

/// Version 2 of the pools read model.
#[derive(Debug, Clone, Copy)]
pub struct PoolsV2;

impl Projection for PoolsV2 {
    fn name(&self) -> &'static str {
        "pools"
    }

    fn version(&self) -> u32 {
        2
    }

    fn event_types(&self) -> &'static [&'static str] {
        &[
            "pool.created",
            "pool.offered",
            "pool.quota_set",
            "pool.offer_revoked",
            "pool.updated",
            "pool.deleted",
            "node.registered",
            "node.joined",
            "node.deleted",
        ]
    }

    fn tables(&self) -> &'static [&'static str] {
        &["pools_v2"]
    }

    fn apply<'a>(&'a self, tx: &'a mut Tx, events: &'a [Envelope]) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let mut pool_events: Vec<&PoolEvent> = Vec::new();
            let mut node_counts: BTreeMap<&str, i32> = BTreeMap::new();
            for envelope in events {
                match &envelope.event {
                    Some(AnyEvent::Pool(
                        event @ (PoolEvent::Created(_)
                        | PoolEvent::Offered(_)
                        | PoolEvent::QuotaSet(_)
                        | PoolEvent::OfferRevoked(_)
                        | PoolEvent::Updated(_)
                        | PoolEvent::Deleted(_)),
                    )) => pool_events.push(event),
                    Some(AnyEvent::Node(NodeEvent::Registered(e))) => {
                        *node_counts.entry(e.pool_id.as_str()).or_default() += 1
                    }
                    Some(AnyEvent::Node(NodeEvent::Joined(e))) => {
                        *node_counts.entry(e.pool_id.as_str()).or_default() += 1
                    }
                    Some(AnyEvent::Node(NodeEvent::Deleted(e))) => {
                        *node_counts.entry(e.pool_id.as_str()).or_default() -= 1
                    }
                    _ => {}
                }
            }
            if !pool_events.is_empty() {
                let mut ids: Vec<&str> = pool_events.iter().map(|e| pool_of(e)).collect();
                ids.sort_unstable();
                ids.dedup();
                let mut folded: HashMap<String, Pool> =
                    folded::load(tx, "pools_v2", "pool_id", &ids).await?.into_iter().collect();
                let mut touched: Vec<&str> = Vec::new();
                for event in pool_events {
                    let id = pool_of(event);
                    if super::evolve_in(&mut folded, id, |state| pool::evolve(state, event)) {
                        touched.push(id);
                    }
                }
                touched.sort_unstable();
                touched.dedup();
                // A deleted pool leaves the read model; the others are written back.
                let (deleted, kept): (Vec<&str>, Vec<&str>) =
                    touched.iter().partition(|id| folded.get(**id).is_some_and(|p| p.deleted_at_ms.is_some()));
                store(tx, kept.iter().filter_map(|id| folded.get(*id))).await?;
                if !deleted.is_empty() {
                    sql::query("DELETE FROM pools_v2 WHERE pool_id = ANY($1)")
                        .bind(&deleted)
                        .execute(tx.conn())
                        .await?;
                }
            }
            if !node_counts.is_empty() {
                let (pools, deltas): (Vec<&str>, Vec<i32>) = node_counts.into_iter().unzip();
                sql::query(
                    "UPDATE pools_v2 AS p SET node_count = p.node_count + u.delta
                     FROM unnest($1::text[], $2::int4[]) AS u(pool_id, delta) WHERE p.pool_id = u.pool_id",
                )
                .bind(&pools)
                .bind(&deltas)
                .execute(tx.conn())
                .await?;
            }
            Ok(())
        })
    }
}

fn pool_of(event: &PoolEvent) -> &str {
    match event {
        PoolEvent::Created(e) => e.pool_id.as_str(),
        PoolEvent::Offered(e) => e.pool_id.as_str(),
        PoolEvent::QuotaSet(e) => e.pool_id.as_str(),
        PoolEvent::OfferRevoked(e) => e.pool_id.as_str(),
        PoolEvent::Updated(e) => e.pool_id.as_str(),
        PoolEvent::Deleted(e) => e.pool_id.as_str(),
        PoolEvent::JoinTokenIssued(e) => e.pool_id.as_str(),
        PoolEvent::JoinTokenRevoked(e) => e.pool_id.as_str(),
    }
}

async fn store<'p>(tx: &mut Tx, pools: impl Iterator<Item = &'p Pool>) -> Result<()> {
    let (mut ids, mut owners, mut offers, mut docs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for pool in pools {
        ids.push(pool.id.as_str());
        owners.push(pool.owner_tenant_id.as_str());
        let tenants: Vec<&str> = pool.offers.iter().map(|o| o.tenant_id.as_str()).collect();
        offers.push(json(&tenants)?);
        docs.push(json(pool)?);
    }
    if ids.is_empty() {
        return Ok(());
    }
    sql::query(
        "INSERT INTO pools_v2 (pool_id, owner_tenant_id, offer_tenants, folded)
         SELECT u.id, u.owner, ARRAY(SELECT jsonb_array_elements_text(u.offers::jsonb)), u.folded::jsonb
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS u(id, owner, offers, folded)
         ON CONFLICT (pool_id) DO UPDATE
             SET owner_tenant_id = excluded.owner_tenant_id, offer_tenants = excluded.offer_tenants,
                 folded = excluded.folded",
    )
    .bind(&ids)
    .bind(&owners)
    .bind(&offers)
    .bind(&docs)
    .execute(tx.conn())
    .await?;
    Ok(())
}
