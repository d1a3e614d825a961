//! Instances' rows (`capacity/0022_instances`): the fold of each instance's events in `doc`.

use bc_domain::id::{InstanceId, NodeId, ReservationId};
use bc_domain::instance::Instance;
use bc_eventstore::{Tx, sql};
use sqlx::Row as _;

use crate::AppResult;
use crate::store::corrupt;

fn instance_of(doc: &str) -> AppResult<Instance> {
    serde_json::from_str(doc).map_err(|err| corrupt("instances.doc", err))
}

/// A page of a tenant's instances, by id, after `after`.
pub async fn list(tx: &mut Tx, tenant: &str, after: Option<&str>, limit: i64) -> AppResult<Vec<Instance>> {
    let docs: Vec<String> = sql::query_scalar(
        "SELECT doc::text FROM instances WHERE tenant_id = $1 AND ($2::text IS NULL OR id > $2) ORDER BY id LIMIT $3",
    )
    .bind(tenant)
    .bind(after)
    .bind(limit)
    .fetch_all(tx.conn())
    .await?;
    docs.iter().map(|doc| instance_of(doc)).collect()
}

/// The instance a `binding: instance` reservation holds the allocation of.
pub async fn of_reservation(tx: &mut Tx, reservation: &ReservationId) -> AppResult<Option<InstanceId>> {
    let id: Option<String> = sql::query_scalar("SELECT id FROM instances WHERE reservation_id = $1")
        .bind(reservation.as_str())
        .fetch_optional(tx.conn())
        .await?;
    id.map(|id| id.parse().map_err(|err| corrupt("instances.id", err))).transpose()
}

/// The node a reservation's allocation is on (an instance's reservation has one allocation), if it is placed.
pub async fn allocated_node(tx: &mut Tx, reservation: &ReservationId) -> AppResult<Option<NodeId>> {
    let node: Option<String> =
        sql::query_scalar("SELECT node_id FROM allocations WHERE reservation_id = $1 ORDER BY id LIMIT 1")
            .bind(reservation.as_str())
            .fetch_optional(tx.conn())
            .await?;
    node.map(|node| node.parse().map_err(|err| corrupt("allocations.node_id", err))).transpose()
}

/// An instance a node is to run: its allocation there has begun (its reservation is `binding` or `active`) and it
/// is not over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeInstance {
    pub instance: Instance,
    /// The atoms of its allocation on the node.
    pub devices: Vec<String>,
    pub image_sha256: String,
    pub image_format: String,
    pub image_size: i64,
}

/// The instances node `node` is to run, by id.
pub async fn on_node(tx: &mut Tx, node: &NodeId) -> AppResult<Vec<NodeInstance>> {
    let rows = sql::query(
        "SELECT i.doc::text AS doc, a.devices, im.sha256, im.format, im.size_bytes
         FROM allocations AS a
         JOIN instances AS i ON i.reservation_id = a.reservation_id AND i.state NOT IN ('deleted', 'failed')
         JOIN reservations AS r ON r.id = a.reservation_id AND r.state IN ('binding', 'active')
         LEFT JOIN images AS im ON im.id = i.doc->'spec'->>'imageId'
         WHERE a.node_id = $1
         ORDER BY i.id",
    )
    .bind(node.as_str())
    .fetch_all(tx.conn())
    .await?;
    rows.iter()
        .map(|row| {
            let doc: String = row.try_get("doc")?;
            Ok(NodeInstance {
                instance: instance_of(&doc)?,
                devices: row.try_get("devices")?,
                // An image deleted since: the node cannot start the instance, and reports so.
                image_sha256: row.try_get::<Option<String>, _>("sha256")?.unwrap_or_default(),
                image_format: row.try_get::<Option<String>, _>("format")?.unwrap_or_default(),
                image_size: row.try_get::<Option<i64>, _>("size_bytes")?.unwrap_or_default(),
            })
        })
        .collect()
}
