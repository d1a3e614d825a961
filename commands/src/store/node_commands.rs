//! The `node_commands` table: each node's commands numbered from 1, delivered in that order, acknowledged by id.

use bc_domain::Rejection;
use bc_domain::agent::{AgentCommand, CommandKind};
use bc_domain::id::{CommandId, NodeId, ReservationId};
use bc_eventstore::{Tx, sql};
use sqlx::Row as _;

use super::corrupt;
use crate::AppResult;

/// When and under which condition a command may be delivered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delivery {
    /// Not before this time (epoch ms); `None`: at once.
    pub not_before_ms: Option<i64>,
    /// Expired if still undelivered after this time.
    pub not_after_ms: Option<i64>,
    /// Held until the node's observed generation reaches this.
    pub min_generation: Option<u64>,
}

/// A command as stored, for operators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandRecord {
    pub id: CommandId,
    pub node_id: NodeId,
    pub seq: u64,
    pub kind: String,
    pub body: CommandKind,
    /// `queued`, `succeeded`, `failed` or `expired`.
    pub state: String,
    pub not_before: i64,
    pub not_after: Option<i64>,
    pub min_generation: Option<u64>,
    pub deliveries: i32,
    pub created_at: i64,
    pub finished_at: Option<i64>,
    pub message: Option<String>,
}

/// Queues a command for a node, in the caller's transaction: the node's next `seq`.
pub async fn enqueue(
    tx: &mut Tx,
    node_id: &NodeId,
    kind: &CommandKind,
    reservation: Option<&ReservationId>,
    delivery: &Delivery,
) -> AppResult<(CommandId, u64)> {
    let seq: i64 = sql::query_scalar(
        "INSERT INTO node_command_seqs (node_id, last_seq) VALUES ($1, 1)
         ON CONFLICT (node_id) DO UPDATE SET last_seq = node_command_seqs.last_seq + 1
         RETURNING last_seq",
    )
    .bind(node_id.as_str())
    .fetch_one(tx.conn())
    .await?;
    let id = CommandId::generate();
    let body = serde_json::to_string(kind).map_err(|err| corrupt("node_commands.body", err))?;
    sql::query(
        "INSERT INTO node_commands (id, node_id, seq, kind, body, reservation_id, not_before, not_after, min_generation)
         VALUES ($1, $2, $3, $4, $5::jsonb, $6, coalesce(ms_ts($7), compute_now()), ms_ts($8), $9)",
    )
    .bind(id.as_str())
    .bind(node_id.as_str())
    .bind(seq)
    .bind(kind.name())
    .bind(&body)
    .bind(reservation.map(|r| r.as_str()))
    .bind(delivery.not_before_ms)
    .bind(delivery.not_after_ms)
    .bind(delivery.min_generation.map(|g| g as i64))
    .execute(tx.conn())
    .await?;
    Ok((id, seq as u64))
}

/// The commands deliverable to a node now, in `seq` order: first the undelivered ones past their `not_after`
/// become `expired`; then delivery runs from the lowest queued `seq` and stops at the first command that must
/// still wait (for its `not_before` or its `min_generation`), so nothing overtakes it.
pub async fn deliverable(tx: &mut Tx, node_id: &NodeId, limit: i64) -> AppResult<Vec<AgentCommand>> {
    sql::query(
        "UPDATE node_commands SET state = 'expired', finished_at = compute_now(),
                                  message = 'not delivered before its notAfter'
         WHERE node_id = $1 AND state = 'queued' AND deliveries = 0 AND not_after < compute_now()",
    )
    .bind(node_id.as_str())
    .execute(tx.conn())
    .await?;
    let rows = sql::query(
        "SELECT c.id, c.seq, c.body::text AS body,
                c.not_before <= compute_now() AND coalesce(c.min_generation <= n.observed_generation, true) AS ready
         FROM node_commands AS c JOIN nodes AS n ON n.id = c.node_id
         WHERE c.node_id = $1 AND c.state = 'queued'
         ORDER BY c.seq
         LIMIT $2",
    )
    .bind(node_id.as_str())
    .bind(limit)
    .fetch_all(tx.conn())
    .await?;
    let mut commands = Vec::new();
    for row in rows {
        if !row.try_get::<bool, _>("ready")? {
            break;
        }
        let id: String = row.try_get("id")?;
        let body: String = row.try_get("body")?;
        commands.push(AgentCommand {
            id: id.parse().map_err(|err| corrupt("node_commands.id", err))?,
            seq: row.try_get::<i64, _>("seq")? as u64,
            kind: serde_json::from_str(&body).map_err(|err| corrupt("node_commands.body", err))?,
        });
    }
    if !commands.is_empty() {
        let ids: Vec<&str> = commands.iter().map(|c| c.id.as_str()).collect();
        sql::query(
            "UPDATE node_commands SET deliveries = deliveries + 1, first_delivered_at = coalesce(first_delivered_at, compute_now())
             WHERE id = ANY($1)",
        )
        .bind(&ids)
        .execute(tx.conn())
        .await?;
    }
    Ok(commands)
}

/// A command acknowledged: its kind and reservation, and whether this acknowledgement changed it.
#[derive(Debug, Clone)]
pub struct Acked {
    pub kind: String,
    pub reservation_id: Option<ReservationId>,
    pub state: String,
    pub changed: bool,
}

/// Records the agent's acknowledgement of a command of its own node. A second acknowledgement answers the
/// first one's outcome and changes nothing.
pub async fn acknowledge(
    tx: &mut Tx,
    node_id: &NodeId,
    command_id: &CommandId,
    ok: bool,
    message: Option<&str>,
) -> AppResult<Acked> {
    let row =
        sql::query("SELECT kind, reservation_id, state FROM node_commands WHERE id = $1 AND node_id = $2 FOR UPDATE")
            .bind(command_id.as_str())
            .bind(node_id.as_str())
            .fetch_optional(tx.conn())
            .await?;
    let Some(row) = row else {
        return Err(Rejection::NotFound { kind: "command", id: command_id.to_string() }.into());
    };
    let kind: String = row.try_get("kind")?;
    let reservation_id: Option<String> = row.try_get("reservation_id")?;
    let reservation_id =
        reservation_id.map(|r| r.parse()).transpose().map_err(|err| corrupt("node_commands.reservation_id", err))?;
    let state: String = row.try_get("state")?;
    if state != "queued" {
        return Ok(Acked { kind, reservation_id, state, changed: false });
    }
    let state = if ok { "succeeded" } else { "failed" };
    sql::query("UPDATE node_commands SET state = $2, finished_at = compute_now(), message = $3 WHERE id = $1")
        .bind(command_id.as_str())
        .bind(state)
        .bind(message)
        .execute(tx.conn())
        .await?;
    Ok(Acked { kind, reservation_id, state: state.to_owned(), changed: true })
}

/// Whether every command of `kind` for a reservation has succeeded.
pub async fn all_succeeded(tx: &mut Tx, reservation_id: &ReservationId, kind: &str) -> AppResult<bool> {
    let open: i64 = sql::query_scalar(
        "SELECT count(*) FROM node_commands WHERE reservation_id = $1 AND kind = $2 AND state <> 'succeeded'",
    )
    .bind(reservation_id.as_str())
    .bind(kind)
    .fetch_one(tx.conn())
    .await?;
    Ok(open == 0)
}

/// A node's commands, newest first, for operators.
pub async fn list(tx: &mut Tx, node_id: &NodeId, limit: i64) -> AppResult<Vec<CommandRecord>> {
    let rows = sql::query(
        "SELECT id, seq, kind, body::text AS body, state, ts_ms(not_before) AS not_before, ts_ms(not_after) AS not_after,
                min_generation, deliveries, ts_ms(created_at) AS created_at, ts_ms(finished_at) AS finished_at, message
         FROM node_commands WHERE node_id = $1 ORDER BY seq DESC LIMIT $2",
    )
    .bind(node_id.as_str())
    .bind(limit)
    .fetch_all(tx.conn())
    .await?;
    rows.iter()
        .map(|row| {
            let id: String = row.try_get("id")?;
            let body: String = row.try_get("body")?;
            Ok(CommandRecord {
                id: id.parse().map_err(|err| corrupt("node_commands.id", err))?,
                node_id: node_id.clone(),
                seq: row.try_get::<i64, _>("seq")? as u64,
                kind: row.try_get("kind")?,
                body: serde_json::from_str(&body).map_err(|err| corrupt("node_commands.body", err))?,
                state: row.try_get("state")?,
                not_before: row.try_get("not_before")?,
                not_after: row.try_get("not_after")?,
                min_generation: row.try_get::<Option<i64>, _>("min_generation")?.map(|g| g as u64),
                deliveries: row.try_get("deliveries")?,
                created_at: row.try_get("created_at")?,
                finished_at: row.try_get("finished_at")?,
                message: row.try_get("message")?,
            })
        })
        .collect()
}

/// The nodes among `nodes` that run an agent (they joined with a join token and hold a credential): hand-overs
/// on them wait for the agent's acknowledgement; on the others (registered without an agent) they complete at
/// once.
pub async fn agent_nodes(tx: &mut Tx, nodes: &[&NodeId]) -> AppResult<Vec<NodeId>> {
    let ids: Vec<&str> = nodes.iter().map(|n| n.as_str()).collect();
    let rows: Vec<String> =
        sql::query_scalar("SELECT DISTINCT node_id FROM node_credentials WHERE node_id = ANY($1) ORDER BY node_id")
            .bind(&ids)
            .fetch_all(tx.conn())
            .await?;
    rows.into_iter().map(|id| id.parse().map_err(|err| corrupt("node_credentials.node_id", err))).collect()
}
