//! Whole nodes of `policy.tenantRoot` pools: the machines a `binding: node` reservation may get, their atoms'
//! locks, and what its hand-over reads of their workflows (`provisioning/0005`).

use bc_domain::id::{DeviceId, PoolId, ReservationId};
use bc_domain::placement::NodeCandidate;
use bc_domain::reservation::DeviceRequest;
use bc_domain::reservation::whole_nodes::{MachineFacts, Run, RunningWorkflow};
use bc_eventstore::{Tx, sql};

use super::{corrupt, selector_params};
use crate::AppResult;

/// The machines a tenant may get whole: enrolled from a BMC, with their node atom, neither cordoned, draining nor
/// in maintenance, and either `ready` or going through a workflow that a reservation started (deployed for a
/// tenant, or being wiped after one). An operator's own deployment is not handed out.
macro_rules! in_service {
    () => {
        "
    FROM nodes AS n
    JOIN node_bmcs AS b ON b.node_id = n.id
    JOIN devices AS d ON d.node_id = n.id AND d.class = 'node' AND d.bookable
    WHERE n.pool_id = $1 AND NOT n.cordoned AND NOT n.maintenance AND NOT n.draining
      AND ($2::text IS NULL OR d.gpu_model = $2) AND ($3::text IS NULL OR d.gpu_product = $3)
      AND d.attributes @> $4::jsonb
      AND (n.provision_state = 'ready'
           OR (n.provision_state IN ('deploying', 'deployed', 'releasing')
               AND (SELECT w.reservation_id IS NOT NULL FROM workflows AS w
                    WHERE w.node_id = n.id ORDER BY w.id DESC LIMIT 1)))"
    };
}

/// The machines in service whose node atom has no booking overlapping `[start, end)`, in node id order.
pub async fn candidates(
    tx: &mut Tx,
    pool_id: &PoolId,
    request: &DeviceRequest,
    start_ms: i64,
    end_ms: i64,
) -> AppResult<Vec<NodeCandidate>> {
    let (model, product, attributes) = selector_params(request)?;
    let rows: Vec<(String, String)> = sql::query_as(concat!(
        "SELECT n.id, d.id ",
        in_service!(),
        " AND NOT EXISTS (SELECT 1 FROM device_bookings AS k
                          WHERE k.device_id = d.id AND k.during && tstzrange(ms_ts($5), ms_ts($6)))
          ORDER BY n.id"
    ))
    .bind(pool_id.as_str())
    .bind(model)
    .bind(product)
    .bind(&attributes)
    .bind(start_ms)
    .bind(end_ms)
    .fetch_all(tx.conn())
    .await?;
    rows.into_iter()
        .map(|(node, atom)| {
            Ok(NodeCandidate {
                node_id: node.parse().map_err(|err| corrupt("nodes.id", err))?,
                free_atoms: vec![atom.parse::<DeviceId>().map_err(|err| corrupt("devices.id", err))?],
            })
        })
        .collect()
}

/// How many machines in service could ever hold one node of the request, bookings aside.
pub async fn holders(tx: &mut Tx, pool_id: &PoolId, request: &DeviceRequest) -> AppResult<i64> {
    let (model, product, attributes) = selector_params(request)?;
    Ok(sql::query_scalar(concat!("SELECT count(*) ", in_service!()))
        .bind(pool_id.as_str())
        .bind(model)
        .bind(product)
        .bind(&attributes)
        .fetch_one(tx.conn())
        .await?)
}

/// Whether the machine is still one a tenant may get whole (see [`candidates`]), bookings aside.
pub async fn in_service(tx: &mut Tx, pool_id: &PoolId, node_id: &str) -> AppResult<bool> {
    Ok(sql::query_scalar(concat!("SELECT EXISTS (SELECT 1 ", in_service!(), " AND n.id = $5)"))
        .bind(pool_id.as_str())
        .bind(None::<&str>)
        .bind(None::<&str>)
        .bind("{}")
        .bind(node_id)
        .fetch_one(tx.conn())
        .await?)
}

/// Locks the chosen machines (in share mode, still in service) and their node atoms (for update), in id order.
/// `false` when one of them left service since it was read.
pub async fn lock(tx: &mut Tx, pool_id: &PoolId, nodes: &[&str], atoms: &[&str]) -> AppResult<bool> {
    let found: i64 = sql::query_scalar(concat!(
        "WITH chosen AS (SELECT n.id ",
        in_service!(),
        " AND n.id = ANY($5) ORDER BY n.id FOR SHARE OF n) SELECT count(*) FROM chosen"
    ))
    .bind(pool_id.as_str())
    .bind(None::<&str>)
    .bind(None::<&str>)
    .bind("{}")
    .bind(nodes)
    .fetch_one(tx.conn())
    .await?;
    if found != nodes.len() as i64 {
        return Ok(false);
    }
    let locked: i64 = sql::query_scalar(
        "WITH l AS (SELECT id FROM devices WHERE id = ANY($1) ORDER BY id FOR UPDATE) SELECT count(*) FROM l",
    )
    .bind(atoms)
    .fetch_one(tx.conn())
    .await?;
    Ok(locked == atoms.len() as i64)
}

/// A machine's id and lifecycle state, the workflow running on it and whether the reservation started it, and the
/// outcomes of the reservation's latest deployment and wipe of it (`running` while one runs).
type MachineRow = (String, String, Option<String>, Option<bool>, Option<String>, Option<String>);

/// The reservation's machines (those of `nodes` that still exist), with their workflows.
pub async fn hand_over(tx: &mut Tx, reservation: &ReservationId, nodes: &[&str]) -> AppResult<Vec<MachineFacts>> {
    let rows: Vec<MachineRow> = sql::query_as(
        "SELECT n.id, n.provision_state, r.id, r.reservation_id IS NOT DISTINCT FROM $1,
                (SELECT coalesce(w.outcome, 'running') FROM workflows AS w
                 WHERE w.reservation_id = $1 AND w.node_id = n.id AND w.kind = 'deploy' ORDER BY w.id DESC LIMIT 1),
                (SELECT coalesce(w.outcome, 'running') FROM workflows AS w
                 WHERE w.reservation_id = $1 AND w.node_id = n.id AND w.kind = 'release' ORDER BY w.id DESC LIMIT 1)
         FROM nodes AS n
         LEFT JOIN workflows AS r ON r.node_id = n.id AND r.outcome IS NULL
         WHERE n.id = ANY($2)
         ORDER BY n.id",
    )
    .bind(reservation.as_str())
    .bind(nodes)
    .fetch_all(tx.conn())
    .await?;
    let run = |outcome: Option<String>| -> AppResult<Option<Run>> {
        Ok(match outcome {
            None => None,
            Some(running) if running == "running" => Some(None),
            Some(outcome) => Some(Some(
                serde_json::from_value(serde_json::Value::String(outcome))
                    .map_err(|err| corrupt("workflows.outcome", err))?,
            )),
        })
    };
    rows.into_iter()
        .map(|(node, provision_state, running, mine, deploy, release)| {
            Ok(MachineFacts {
                node_id: node.parse().map_err(|err| corrupt("nodes.id", err))?,
                provision_state: serde_json::from_value(serde_json::Value::String(provision_state))
                    .map_err(|err| corrupt("nodes.provision_state", err))?,
                running: running.map(|workflow_id| RunningWorkflow { workflow_id, mine: mine.unwrap_or(false) }),
                deploy: run(deploy)?,
                release: run(release)?,
            })
        })
        .collect()
}
