//! Nodes through the command layer, on real PostgreSQL with the simulated clock: join tokens, node credentials,
//! the inventory's sections and snapshots, rejoining after a GPU swap, commands and their delivery rules, the
//! NodeSpec generation, drains within the disruption budget, deletes, and future bookings placed again when a
//! node can no longer hold them.

use bc_agent::simulate::{self, Simulated};
use bc_commands::AppError;
use bc_commands::agents::NodeAuth;
use bc_commands::node_commands::Delivery;
use bc_commands::nodes::OperatorCommand;
use bc_domain::Rejection;
use bc_domain::agent::{Ack, CommandKind, Heartbeat, JoinRequest, Joined};
use bc_domain::device::DeviceClass;
use bc_domain::id::{CommandId, NodeId, PoolId};
use bc_domain::inventory::{NodeInventory, Section, SectionHashes};
use bc_domain::pool::{PoolPolicy, Sharing};
use bc_eventstore::{TxOptions, sql};

use bc_commands::testing::{Fleet, HOUR, T0, request};

/// A simulated machine with `gpus` H100s.
fn machine(host: &str, gpus: u32) -> NodeInventory {
    let spec: Simulated = format!("{gpus}xH100").parse().expect("spec");
    simulate::inventory(host, &spec)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as i64
}

async fn token(fleet: &Fleet, pool: &PoolId) -> String {
    fleet.app.create_join_token(&fleet.owner, pool, 3600).await.expect("token").value.token
}

async fn join_with(fleet: &Fleet, token: &str, document: &NodeInventory) -> Result<Joined, AppError> {
    fleet
        .app
        .join(JoinRequest {
            join_token: token.to_owned(),
            agent_version: "test".into(),
            inventory: document.report(&SectionHashes::new()),
            csr: None,
            role: None,
        })
        .await
}

/// Joins `document` into `pool` with a fresh token; answers the join and the node's authentication.
async fn join(fleet: &Fleet, pool: &PoolId, document: &NodeInventory) -> (Joined, NodeAuth) {
    let token = token(fleet, pool).await;
    let joined = join_with(fleet, &token, document).await.expect("join");
    let auth = fleet.app.authenticate_node(&joined.credential).await.expect("credential");
    (joined, auth)
}

/// A heartbeat that reports `observed` as applied.
async fn beat(fleet: &Fleet, auth: &NodeAuth, joined: &Joined, observed: u64) {
    let beat = Heartbeat {
        session_id: joined.session.session_id.clone(),
        observed_generation: observed,
        clock_ms: now_ms(),
        gpu_utilization: Vec::new(),
    };
    fleet.app.heartbeat(auth, &beat).await.expect("heartbeat");
}

fn code(err: &AppError) -> &'static str {
    err.code()
}

async fn scalar_i64(fleet: &Fleet, query: &'static str, id: &str) -> i64 {
    let mut tx = fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let n: i64 = sql::query_scalar(query).bind(id).fetch_one(tx.conn()).await.expect("query");
    tx.commit().await.expect("commit");
    n
}

async fn node_text(fleet: &Fleet, column_query: &'static str, node: &NodeId) -> String {
    let mut tx = fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let text: String = sql::query_scalar(column_query).bind(node.as_str()).fetch_one(tx.conn()).await.expect("query");
    tx.commit().await.expect("commit");
    text
}

#[tokio::test]
async fn a_joined_node_is_adopted_and_schedulable_once_it_observed_its_spec() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("h100", Sharing::Exclusive, None).await;
    let (joined, auth) = join(&fleet, &pool, &machine("gpu-a", 4)).await;
    assert!(!joined.rejoined);
    assert_eq!(joined.session.generation, 1);
    let node = &joined.node_id;
    assert_eq!(node_text(&fleet, "SELECT provision_state FROM nodes WHERE id = $1", node).await, "adopted");
    assert_eq!(
        scalar_i64(&fleet, "SELECT count(*) FROM nodes WHERE id = $1 AND schedulable", node.as_str()).await,
        0,
        "not schedulable before the agent observed generation 1"
    );
    beat(&fleet, &auth, &joined, 1).await;
    assert_eq!(scalar_i64(&fleet, "SELECT count(*) FROM nodes WHERE id = $1 AND schedulable", node.as_str()).await, 1);
    assert_eq!(
        scalar_i64(&fleet, "SELECT count(*) FROM devices WHERE node_id = $1 AND bookable", node.as_str()).await,
        4
    );
    // A second heartbeat changes nothing in the log: heartbeats are runtime rows.
    let before = scalar_i64(&fleet, "SELECT count(*) FROM events WHERE stream_id = $1", node.as_str()).await;
    beat(&fleet, &auth, &joined, 1).await;
    assert_eq!(scalar_i64(&fleet, "SELECT count(*) FROM events WHERE stream_id = $1", node.as_str()).await, before);
    assert_eq!(scalar_i64(&fleet, "SELECT heartbeats FROM agent_sessions WHERE node_id = $1", node.as_str()).await, 2);
}

#[tokio::test]
async fn a_join_token_admits_one_machine_and_expires() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("h100", Sharing::Exclusive, None).await;
    let token = token(&fleet, &pool).await;
    join_with(&fleet, &token, &machine("gpu-a", 2)).await.expect("the first join");
    let again = join_with(&fleet, &token, &machine("gpu-b", 2)).await.expect_err("a used token");
    assert_eq!(code(&again), "UNAUTHENTICATED");
    assert!(again.to_string().contains("already used"), "{again}");
    let unknown = join_with(&fleet, "jt_nobodyknowsthisone", &machine("gpu-b", 2)).await.expect_err("unknown");
    assert_eq!(code(&unknown), "UNAUTHENTICATED");
    let late = self::token(&fleet, &pool).await;
    fleet.advance_to(T0 + 3_601_000).await;
    let expired = join_with(&fleet, &late, &machine("gpu-b", 2)).await.expect_err("expired");
    assert!(expired.to_string().contains("expired"), "{expired}");
    assert_eq!(scalar_i64(&fleet, "SELECT count(*) FROM nodes WHERE pool_id = $1", pool.as_str()).await, 1);
    // Bad input names what is wrong and writes nothing.
    let fresh = self::token(&fleet, &pool).await;
    let mut wrong = machine("gpu-c", 2);
    wrong.gpus[1].info.name = "NVIDIA A100-SXM4-80GB".into();
    let refused = join_with(&fleet, &fresh, &wrong).await.expect_err("an A100 in an H100 pool");
    assert!(
        matches!(&refused, AppError::Rejected(Rejection::InvalidArgument { field, .. }) if field == "inventory.gpus[1].name"),
        "{refused:?}"
    );
    // Found by fuzzing: a GPU UUID too long for the device ids made from it (`<uuid>/s0` in a timeslice pool
    // would not read back), and a NUL character that PostgreSQL's jsonb cannot hold, are bad input.
    let slots = fleet.pool("slots", Sharing::Timeslice, Some(2)).await;
    let slots_token = self::token(&fleet, &slots).await;
    let mut long = machine("gpu-d", 2);
    long.gpus[0].info.uuid = format!("GPU-{}", "a".repeat(196)).parse().expect("a device id");
    let refused = join_with(&fleet, &slots_token, &long).await.expect_err("a 200-character GPU UUID");
    assert!(
        matches!(&refused, AppError::Rejected(Rejection::InvalidArgument { field, .. }) if field == "inventory.gpus[0].uuid"),
        "{refused:?}"
    );
    let mut nul = machine("gpu-d", 2);
    nul.system.kernel = "6.1\0evil".into();
    let refused = join_with(&fleet, &slots_token, &nul).await.expect_err("a NUL character");
    assert!(
        matches!(&refused, AppError::Rejected(Rejection::InvalidArgument { field, .. }) if field == "inventory.system.kernel"),
        "{refused:?}"
    );
    assert_eq!(scalar_i64(&fleet, "SELECT count(*) FROM nodes WHERE pool_id = $1", slots.as_str()).await, 0);
    join_with(&fleet, &slots_token, &machine("gpu-d", 2)).await.expect("the token was not used by the refused joins");
}

#[tokio::test]
async fn one_nodes_credential_cannot_speak_for_another() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("h100", Sharing::Exclusive, None).await;
    let (a, a_auth) = join(&fleet, &pool, &machine("gpu-a", 2)).await;
    let (b, b_auth) = join(&fleet, &pool, &machine("gpu-b", 2)).await;
    assert_eq!(a_auth.node_id, a.node_id);
    let probe = OperatorCommand { kind: CommandKind::Probe { note: None }, delivery: Delivery::default() };
    let (command, _) = fleet.app.queue_node_command(&fleet.owner, &a.node_id, probe).await.expect("queue");
    // B acknowledging A's command: not found, and A's command stays queued.
    let err = fleet.app.acknowledge_command(&b_auth, &command, &Ack { ok: true, message: None }).await.expect_err("B");
    assert_eq!(code(&err), "NOT_FOUND");
    assert_eq!(fleet.app.agent_commands(&a_auth, 10).await.expect("A's commands").len(), 1);
    // B heartbeating with A's session: refused, and A's lease is untouched.
    let stolen = Heartbeat {
        session_id: a.session.session_id.clone(),
        observed_generation: 1,
        clock_ms: now_ms(),
        gpu_utilization: Vec::new(),
    };
    let err = fleet.app.heartbeat(&b_auth, &stolen).await.expect_err("B with A's session");
    assert_eq!(code(&err), "CONFLICT");
    assert_eq!(
        scalar_i64(&fleet, "SELECT heartbeats FROM agent_sessions WHERE node_id = $1", a.node_id.as_str()).await,
        0
    );
    // Deleting A revokes its credential.
    fleet.app.delete_node(&fleet.owner, &a.node_id, false, None).await.expect("delete");
    let err = fleet.app.authenticate_node(&a.credential).await.expect_err("revoked");
    assert_eq!(code(&err), "UNAUTHENTICATED");
    fleet.app.authenticate_node(&b.credential).await.expect("B's credential still works");
}

#[tokio::test]
async fn an_unchanged_section_is_not_resent_and_each_change_is_a_snapshot() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("h100", Sharing::Exclusive, None).await;
    let mut document = machine("gpu-a", 2);
    let (joined, auth) = join(&fleet, &pool, &document).await;
    let known = joined.session.inventory_hashes.clone();
    assert_eq!(known, document.hashes());
    // Nothing changed: the report carries hashes only, and no snapshot is added.
    let report = document.report(&known);
    assert!(report.system.is_none() && report.gpus.is_none() && report.nics.is_none() && report.disks.is_none());
    let accepted = fleet.app.report_inventory(&auth, report).await.expect("report");
    assert_eq!((accepted.snapshot, accepted.changed.len()), (1, 0));
    // A new disk: only the disks section travels, and the snapshot holds the whole document.
    document.disks[0].size_bytes += 1;
    let report = document.report(&known);
    assert!(report.disks.is_some() && report.gpus.is_none() && report.system.is_none());
    let accepted = fleet.app.report_inventory(&auth, report).await.expect("report");
    assert_eq!((accepted.snapshot, accepted.changed.clone()), (2, vec![Section::Disks]));
    let stored = fleet.app.node_inventory(&fleet.owner, &joined.node_id).await.expect("inventory");
    assert_eq!(stored.snapshot, 2);
    assert_eq!(stored.document, document);
    // A report leaving out a section the control plane does not hold is refused: the agent sends it whole.
    document.nics[0].speed_mbps = Some(200_000);
    let mut partial = document.report(&document.hashes());
    partial.hashes = document.hashes();
    let refused = fleet.app.report_inventory(&auth, partial).await.expect_err("missing nics");
    assert_eq!(code(&refused), "CONFLICT");
    assert!(refused.to_string().contains("nics"), "{refused}");
    // Snapshots are append-only.
    let mut tx = fleet.t.db.begin(TxOptions::COMMAND).await.expect("begin");
    let rewrite = sql::query("UPDATE node_inventory_snapshots SET hashes = '{}' WHERE node_id = $1")
        .bind(joined.node_id.as_str())
        .execute(tx.conn())
        .await;
    assert!(rewrite.is_err(), "a snapshot was rewritten");
}

#[tokio::test]
async fn a_machine_that_rejoins_after_a_gpu_swap_is_the_same_node_with_a_condition() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("h100", Sharing::Exclusive, None).await;
    let document = machine("gpu-a", 2);
    let (first, _) = join(&fleet, &pool, &document).await;
    let old_gpu = document.gpus[1].info.uuid.clone();
    let mut swapped = document.clone();
    swapped.gpus[1].info.uuid = "GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0".parse().expect("uuid");
    // The reinstalled machine joins with a new token: product UUID, serial, MAC and one GPU survive.
    let (again, _) = join(&fleet, &pool, &swapped).await;
    assert!(again.rejoined);
    assert_eq!(again.node_id, first.node_id, "matched on its surviving identifiers, not a second node");
    assert_eq!(scalar_i64(&fleet, "SELECT count(*) FROM nodes WHERE pool_id = $1", pool.as_str()).await, 1);
    let conditions = node_text(&fleet, "SELECT conditions::text FROM nodes WHERE id = $1", &first.node_id).await;
    assert!(conditions.contains("HardwareChanged"), "{conditions}");
    assert_eq!(scalar_i64(&fleet, "SELECT count(*) FROM devices WHERE id = $1", old_gpu.as_str()).await, 0);
    assert_eq!(
        scalar_i64(&fleet, "SELECT count(*) FROM devices WHERE id = $1", "GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0")
            .await,
        1
    );
    // The old credential was replaced by the new one.
    assert_eq!(code(&fleet.app.authenticate_node(&first.credential).await.expect_err("old")), "UNAUTHENTICATED");
    // Another machine is another node.
    let (other, _) = join(&fleet, &pool, &machine("gpu-b", 2)).await;
    assert!(!other.rejoined);
    assert_ne!(other.node_id, first.node_id);
}

#[tokio::test]
async fn placeholder_identifiers_make_an_untrusted_key_and_never_match() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("h100", Sharing::Exclusive, None).await;
    let mut document = machine("gpu-a", 1);
    document.system.product_uuid = Some("00000000-0000-0000-0000-000000000000".into());
    document.system.board_serial = Some("To Be Filled By O.E.M.".into());
    document.nics[0].mac = "ff:ff:ff:ff:ff:ff".into();
    let (joined, _) = join(&fleet, &pool, &document).await;
    let trusted = scalar_i64(
        &fleet,
        "SELECT count(*) FROM nodes WHERE id = $1 AND NOT hardware_trusted",
        joined.node_id.as_str(),
    )
    .await;
    assert_eq!(trusted, 1, "one surviving identifier (the GPU) is not enough to trust the key");
    // Another board with the same placeholders is not taken for this one.
    let mut other = machine("gpu-b", 1);
    other.system = document.system.clone();
    other.system.hostname = "gpu-b".into();
    other.nics = document.nics.clone();
    let (second, _) = join(&fleet, &pool, &other).await;
    assert!(!second.rejoined);
    assert_ne!(second.node_id, joined.node_id);
}

#[tokio::test]
async fn commands_are_delivered_in_seq_order_expire_past_not_after_and_wait_for_min_generation() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("h100", Sharing::Exclusive, None).await;
    let (joined, auth) = join(&fleet, &pool, &machine("gpu-a", 2)).await;
    beat(&fleet, &auth, &joined, 1).await;
    let node = &joined.node_id;
    let queue = |note: &str, delivery: Delivery| OperatorCommand {
        kind: CommandKind::Probe { note: Some(note.to_owned()) },
        delivery,
    };
    let app = &fleet.app;
    let c1 = app.queue_node_command(&fleet.owner, node, queue("c1", Delivery::default())).await.expect("c1");
    let c2 = app
        .queue_node_command(
            &fleet.owner,
            node,
            queue("c2", Delivery { not_after_ms: Some(T0 + 1_000), ..Delivery::default() }),
        )
        .await
        .expect("c2");
    let c3 = app
        .queue_node_command(
            &fleet.owner,
            node,
            queue("c3", Delivery { not_before_ms: Some(T0 + 10_000), ..Delivery::default() }),
        )
        .await
        .expect("c3");
    let c4 = app.queue_node_command(&fleet.owner, node, queue("c4", Delivery::default())).await.expect("c4");
    assert_eq!((c1.1, c2.1, c3.1, c4.1), (1, 2, 3, 4), "seq runs per node from 1");
    fleet.advance_to(T0 + 2_000).await;
    let ids = |commands: Vec<bc_domain::agent::AgentCommand>| -> Vec<CommandId> {
        commands.into_iter().map(|c| c.id).collect()
    };
    // c2 expired undelivered; c3 waits for its notBefore and holds c4 behind it.
    assert_eq!(ids(app.agent_commands(&auth, 10).await.expect("commands")), vec![c1.0.clone()]);
    let listed = app.node_commands(&fleet.owner, node).await.expect("list");
    let state_of = |id: &CommandId| listed.iter().find(|c| &c.id == id).map(|c| c.state.clone()).expect("listed");
    assert_eq!(state_of(&c2.0), "expired");
    assert_eq!(state_of(&c4.0), "queued");
    let ok = Ack { ok: true, message: None };
    app.acknowledge_command(&auth, &c1.0, &ok).await.expect("ack");
    assert_eq!(app.acknowledge_command(&auth, &c1.0, &ok).await.expect("again"), "succeeded", "idempotent");
    fleet.advance_to(T0 + 11_000).await;
    assert_eq!(ids(app.agent_commands(&auth, 10).await.expect("commands")), vec![c3.0.clone(), c4.0.clone()]);
    app.acknowledge_command(&auth, &c3.0, &ok).await.expect("ack");
    app.acknowledge_command(&auth, &c4.0, &ok).await.expect("ack");
    // A command for generation 2 waits until the agent observed it, and holds the next one.
    let c5 = app
        .queue_node_command(
            &fleet.owner,
            node,
            queue("c5", Delivery { min_generation: Some(2), ..Delivery::default() }),
        )
        .await
        .expect("c5");
    let c6 = app.queue_node_command(&fleet.owner, node, queue("c6", Delivery::default())).await.expect("c6");
    assert!(app.agent_commands(&auth, 10).await.expect("commands").is_empty());
    let generation = app
        .set_node_spec(&fleet.owner, node, [("rack".to_owned(), "r12".to_owned())].into(), None)
        .await
        .expect("spec")
        .value;
    assert_eq!(generation, 2);
    assert!(app.agent_commands(&auth, 10).await.expect("commands").is_empty(), "generation 2 not observed yet");
    beat(&fleet, &auth, &joined, 2).await;
    assert_eq!(ids(app.agent_commands(&auth, 10).await.expect("commands")), vec![c5.0, c6.0]);
}

#[tokio::test]
async fn a_drain_stays_within_the_disruption_budget_and_moves_future_bookings() {
    let fleet = Fleet::new().await;
    // Three nodes and a 5% budget: one node at a time.
    let pool = fleet.pool_with("h100", Sharing::Exclusive, PoolPolicy::default()).await;
    let mut nodes = Vec::new();
    for host in ["gpu-a", "gpu-b", "gpu-c"] {
        let (joined, auth) = join(&fleet, &pool, &machine(host, 2)).await;
        beat(&fleet, &auth, &joined, 1).await;
        nodes.push(joined.node_id);
    }
    let later = T0 + HOUR;
    let mut future = request(&pool, DeviceClass::Gpu, 2);
    future.start_ms = Some(later);
    let placed = fleet.reserve(&fleet.owner, "future", future).await.expect("reserve").reservation;
    let on = placed.allocations[0].node_id.clone();
    fleet.app.drain_node(&fleet.owner, &on, false, Some("firmware".into())).await.expect("drain");
    let other = nodes.iter().find(|n| **n != on).expect("another node").clone();
    let refused = fleet.app.drain_node(&fleet.owner, &other, false, None).await.expect_err("over budget");
    assert!(refused.to_string().contains("disruption budget"), "{refused}");
    let refused = fleet
        .app
        .node_verb(&fleet.owner, &other, bc_commands::nodes::NodeVerb::StartMaintenance, None)
        .await
        .expect_err("maintenance counts against the same budget");
    assert_eq!(code(&refused), "CONFLICT");
    fleet.worker().run_until_idle().await.expect("worker");
    let moved = fleet.app.reservation(&fleet.owner, &placed.id).await.expect("read").value;
    assert_eq!(moved.state, bc_domain::reservation::ReservationState::Placed);
    assert_ne!(moved.allocations[0].node_id, on, "placed again before its start");
    assert_eq!(moved.start_ms, Some(later), "the same window");
    // Nothing runs on the drained node any more: the drain completed.
    assert_eq!(scalar_i64(&fleet, "SELECT count(*) FROM nodes WHERE id = $1 AND draining", on.as_str()).await, 0);
    assert_eq!(
        scalar_i64(
            &fleet,
            "SELECT count(*) FROM events WHERE stream_id = $1 AND event_type = 'node.drained'",
            on.as_str()
        )
        .await,
        1
    );
}

#[tokio::test]
async fn a_lost_node_fails_the_future_bookings_nothing_else_can_hold_and_delete_needs_force() {
    let fleet = Fleet::new().await;
    let pool =
        fleet.pool_with("h100", Sharing::Exclusive, PoolPolicy { lost_after: 120, ..PoolPolicy::default() }).await;
    let (a, a_auth) = join(&fleet, &pool, &machine("gpu-a", 2)).await;
    beat(&fleet, &a_auth, &a, 1).await;
    let mut future = request(&pool, DeviceClass::Gpu, 2);
    future.start_ms = Some(T0 + HOUR);
    let placed = fleet.reserve(&fleet.owner, "future", future).await.expect("reserve").reservation;
    let refused = fleet.app.delete_node(&fleet.owner, &a.node_id, false, None).await.expect_err("bookings remain");
    assert!(refused.to_string().contains(placed.id.as_str()), "{refused}");
    // Silent past lostAfter: the sweep marks it lost and the reconciler fails what nothing else can hold.
    clock_to(&fleet, T0 + 121_000).await;
    let worker = fleet.worker();
    assert_eq!(worker.sweep_liveness().await.expect("sweep"), 1);
    worker.run_until_idle().await.expect("worker");
    assert_eq!(node_text(&fleet, "SELECT connectivity FROM nodes WHERE id = $1", &a.node_id).await, "lost");
    let failed = fleet.app.reservation(&fleet.owner, &placed.id).await.expect("read").value;
    assert_eq!(failed.state, bc_domain::reservation::ReservationState::Failed);
    assert_eq!(failed.failure_reason, Some(bc_domain::reservation::FailureReason::NodeLost));
    assert!(fleet.bookings(placed.id.as_str()).await.is_empty(), "its bookings ended");
    fleet.app.delete_node(&fleet.owner, &a.node_id, true, Some("decommissioned".into())).await.expect("forced delete");
    fleet.worker().run_until_idle().await.expect("worker");
    assert_eq!(scalar_i64(&fleet, "SELECT count(*) FROM nodes WHERE id = $1", a.node_id.as_str()).await, 0);
}

/// Moves the simulated clock without running the worker.
async fn clock_to(fleet: &Fleet, at_ms: i64) {
    bc_eventstore::clock::set_sim_clock(&fleet.t.db, at_ms).await.expect("clock");
}

#[tokio::test]
async fn a_skewed_clock_and_a_missing_gpu_raise_conditions_that_keep_the_node_off_the_scheduler() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("h100", Sharing::Exclusive, None).await;
    let mut document = machine("gpu-a", 2);
    let (joined, auth) = join(&fleet, &pool, &document).await;
    let node = &joined.node_id;
    let schedulable = |fleet: &Fleet| {
        let node = node.clone();
        let db = fleet.t.db.clone();
        async move {
            let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
            let row: (bool, Vec<String>) =
                sql::query_as("SELECT schedulable, no_schedule_reasons FROM nodes WHERE id = $1")
                    .bind(node.as_str())
                    .fetch_one(tx.conn())
                    .await
                    .expect("node");
            tx.commit().await.expect("commit");
            row
        }
    };
    // Five seconds ahead of the database server's clock.
    let skewed = Heartbeat {
        session_id: joined.session.session_id.clone(),
        observed_generation: 1,
        clock_ms: now_ms() + 5_000,
        gpu_utilization: Vec::new(),
    };
    fleet.app.heartbeat(&auth, &skewed).await.expect("heartbeat");
    assert_eq!(schedulable(&fleet).await, (false, vec!["ClockSkew".to_owned()]));
    beat(&fleet, &auth, &joined, 1).await;
    assert_eq!(schedulable(&fleet).await, (true, vec![]), "cleared once the clock is right");
    // A GPU fell off the bus: the count no longer matches, and the node keeps its devices until it does.
    let gone = document.gpus.pop().expect("a GPU");
    fleet.app.report_inventory(&auth, document.report(&joined.session.inventory_hashes)).await.expect("report");
    assert_eq!(schedulable(&fleet).await, (false, vec!["GpuCountMismatch".to_owned()]));
    assert_eq!(scalar_i64(&fleet, "SELECT count(*) FROM devices WHERE node_id = $1", node.as_str()).await, 2);
    document.gpus.push(gone);
    let known = fleet.app.node_inventory(&fleet.owner, node).await.expect("inventory").document;
    fleet.app.report_inventory(&auth, document.report(&known.hashes())).await.expect("report");
    assert_eq!(schedulable(&fleet).await, (true, vec![]));
}

#[tokio::test]
async fn a_machine_that_fails_the_pools_acceptance_checks_is_refused_naming_the_check() {
    let fleet = Fleet::new().await;
    let policy = PoolPolicy { acceptance: vec!["gpu-count=8".into()], ..PoolPolicy::default() };
    let pool = fleet.pool_with("h100", Sharing::Exclusive, policy).await;
    let token = token(&fleet, &pool).await;
    let refused = join_with(&fleet, &token, &machine("gpu-a", 4)).await.expect_err("four GPUs");
    assert!(refused.to_string().contains("gpu-count=8: the machine has 4"), "{refused}");
    let joined = join_with(&fleet, &token, &machine("gpu-b", 8)).await.expect("eight GPUs");
    let mut tx = fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let recorded: i64 =
        sql::query_scalar("SELECT count(*) FROM events WHERE stream_id = $1 AND event_type = 'node.adopted'")
            .bind(joined.node_id.as_str())
            .fetch_one(tx.conn())
            .await
            .expect("events");
    tx.commit().await.expect("commit");
    assert_eq!(recorded, 1);
    let bad = PoolPolicy { acceptance: vec!["colour=red".into()], ..PoolPolicy::default() };
    let err = fleet
        .app
        .create_pool(
            &fleet.owner,
            bc_commands::fleet::CreatePool {
                site_id: fleet.site.clone(),
                name: "bad".into(),
                class: bc_domain::pool::PoolClass::MetalHost,
                gpu_model: "H100".into(),
                sharing: Sharing::Exclusive,
                agent: bc_domain::pool::PoolAgent::Bcd,
                policy: bad,
                provider_account_id: None,
            },
        )
        .await
        .expect_err("an unknown check");
    assert!(
        matches!(&err, AppError::Rejected(Rejection::InvalidArgument { field, .. }) if field == "policy.acceptance[0]"),
        "{err:?}"
    );
}

/// Carries out every command waiting for `auth`'s node, acknowledging each as its agent would.
async fn ack_all(fleet: &Fleet, auth: &NodeAuth) -> Vec<String> {
    let mut kinds = Vec::new();
    for command in fleet.app.agent_commands(auth, 100).await.expect("commands") {
        kinds.push(command.kind.name().to_owned());
        fleet.app.acknowledge_command(auth, &command.id, &Ack { ok: true, message: None }).await.expect("ack");
    }
    kinds
}

#[tokio::test]
async fn a_forced_drain_ends_what_runs_and_a_plain_one_lets_it_finish() {
    let fleet = Fleet::new().await;
    let pool = fleet
        .pool_with("h100", Sharing::Exclusive, PoolPolicy { disruption_budget: 1.0, ..PoolPolicy::default() })
        .await;
    let mut agents = Vec::new();
    for host in ["gpu-a", "gpu-b"] {
        let (joined, auth) = join(&fleet, &pool, &machine(host, 2)).await;
        beat(&fleet, &auth, &joined, 1).await;
        agents.push((joined, auth));
    }
    let mut running = Vec::new();
    for key in ["one", "two"] {
        let placed = fleet.reserve(&fleet.owner, key, request(&pool, DeviceClass::Gpu, 2)).await.expect("reserve");
        running.push(placed.reservation.id);
    }
    fleet.worker().run_until_idle().await.expect("worker");
    for (_, auth) in &agents {
        assert_eq!(ack_all(&fleet, auth).await, vec!["bind"]);
    }
    for id in &running {
        let r = fleet.app.reservation(&fleet.owner, id).await.expect("read").value;
        assert_eq!(r.state, bc_domain::reservation::ReservationState::Active, "active once its agent confirmed");
    }
    let (a, b) = (&agents[0].0.node_id, &agents[1].0.node_id);
    fleet.app.drain_node(&fleet.owner, a, false, None).await.expect("drain");
    fleet.app.drain_node(&fleet.owner, b, true, Some("rack power".into())).await.expect("forced drain");
    fleet.worker().run_until_idle().await.expect("worker");
    let state_on = |node: NodeId| {
        let fleet = &fleet;
        let running = &running;
        async move {
            for id in running {
                let r = fleet.app.reservation(&fleet.owner, id).await.expect("read").value;
                if r.allocations[0].node_id == node {
                    return (r.state, r.expiry_cause);
                }
            }
            panic!("no reservation on {node}");
        }
    };
    assert_eq!(
        state_on(a.clone()).await,
        (bc_domain::reservation::ReservationState::Active, None),
        "a drain never preempts unless forced"
    );
    assert_eq!(
        state_on(b.clone()).await,
        (bc_domain::reservation::ReservationState::Expired, Some(bc_domain::reservation::ExpiryCause::Preempted))
    );
    // The preempted devices are taken back from the agent, and that drain is complete.
    assert_eq!(ack_all(&fleet, &agents[1].1).await, vec!["unbind"]);
    assert_eq!(scalar_i64(&fleet, "SELECT count(*) FROM nodes WHERE id = $1 AND draining", b.as_str()).await, 0);
    assert_eq!(scalar_i64(&fleet, "SELECT count(*) FROM nodes WHERE id = $1 AND draining", a.as_str()).await, 1);
    // Deleting that node with force ends what still runs there in the same command.
    fleet.app.delete_node(&fleet.owner, a, true, Some("retired".into())).await.expect("forced delete");
    assert_eq!(
        state_on(a.clone()).await,
        (bc_domain::reservation::ReservationState::Expired, Some(bc_domain::reservation::ExpiryCause::Preempted))
    );
}

#[tokio::test]
async fn maintenance_moves_future_bookings_to_another_node_before_their_start() {
    let fleet = Fleet::new().await;
    let pool = fleet
        .pool_with("h100", Sharing::Exclusive, PoolPolicy { disruption_budget: 1.0, ..PoolPolicy::default() })
        .await;
    for host in ["gpu-a", "gpu-b"] {
        let (joined, auth) = join(&fleet, &pool, &machine(host, 2)).await;
        beat(&fleet, &auth, &joined, 1).await;
    }
    let mut future = request(&pool, DeviceClass::Gpu, 2);
    future.start_ms = Some(T0 + HOUR);
    let placed = fleet.reserve(&fleet.owner, "later", future).await.expect("reserve").reservation;
    let from = placed.allocations[0].node_id.clone();
    fleet
        .app
        .node_verb(&fleet.owner, &from, bc_commands::nodes::NodeVerb::StartMaintenance, None)
        .await
        .expect("maintenance");
    fleet.worker().run_until_idle().await.expect("worker");
    let moved = fleet.app.reservation(&fleet.owner, &placed.id).await.expect("read").value;
    assert_ne!(moved.allocations[0].node_id, from);
    let booked: Vec<String> = fleet.bookings(placed.id.as_str()).await.into_iter().map(|(d, _, _)| d).collect();
    let expected: Vec<String> = moved.allocations[0].devices.iter().map(|d| d.to_string()).collect();
    assert_eq!(booked, expected, "the bookings moved with it");
}

#[tokio::test]
async fn a_rotated_credential_replaces_the_old_one_at_its_first_use() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("h100", Sharing::Exclusive, None).await;
    let (joined, auth) = join(&fleet, &pool, &machine("gpu-a", 1)).await;
    let rotated = fleet.app.rotate_credential(&auth).await.expect("rotate");
    assert_ne!(rotated, joined.credential);
    // Until the new one is used, the old one still works: a rotation whose answer was lost locks nobody out.
    fleet.app.authenticate_node(&joined.credential).await.expect("the old one, before the new one is used");
    assert_eq!(fleet.app.authenticate_node(&rotated).await.expect("the new one").node_id, joined.node_id);
    let err = fleet.app.authenticate_node(&joined.credential).await.expect_err("the old one, after");
    assert_eq!(code(&err), "UNAUTHENTICATED");
    assert_eq!(
        scalar_i64(&fleet, "SELECT count(*) FROM node_credentials WHERE node_id = $1", joined.node_id.as_str()).await,
        1,
        "stored as one SHA-256"
    );
}

#[tokio::test]
async fn a_simulated_mig_machine_joins_a_mig_pool_with_its_instances_as_atoms() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("h100-mig", Sharing::Mig, None).await;
    let spec: Simulated = "2xH100:1g.10gb*7".parse().expect("spec");
    let (joined, auth) = join(&fleet, &pool, &simulate::inventory("gpu-m", &spec)).await;
    beat(&fleet, &auth, &joined, 1).await;
    let node = joined.node_id.as_str();
    assert_eq!(
        scalar_i64(&fleet, "SELECT count(*) FROM devices WHERE node_id = $1 AND bookable AND class = 'gpu.mig'", node)
            .await,
        14
    );
    assert_eq!(
        scalar_i64(&fleet, "SELECT count(*) FROM devices WHERE node_id = $1 AND bookable AND class = 'gpu'", node)
            .await,
        0,
        "a partitioned GPU is not an atom"
    );
    let placed = fleet.reserve(&fleet.owner, "mig", request(&pool, DeviceClass::GpuMig, 3)).await.expect("reserve");
    assert_eq!(placed.reservation.allocations[0].devices.len(), 3);
}

#[tokio::test]
async fn a_gpu_in_mig_mode_without_instances_is_never_an_atom() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("h100", Sharing::Exclusive, None).await;
    let mut document = machine("gpu-a", 2);
    document.gpus[0].mig_enabled = true;
    let (joined, _) = join(&fleet, &pool, &document).await;
    let node = joined.node_id.as_str();
    assert_eq!(scalar_i64(&fleet, "SELECT count(*) FROM devices WHERE node_id = $1 AND bookable", node).await, 1);
    let idle = document.gpus[0].info.uuid.to_string();
    assert_eq!(scalar_i64(&fleet, "SELECT count(*) FROM devices WHERE id = $1 AND NOT bookable", &idle).await, 1);
}

#[tokio::test]
async fn a_heartbeat_by_credential_renews_in_one_call_and_says_what_is_wrong_otherwise() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("h100", Sharing::Exclusive, None).await;
    let (a, _) = join(&fleet, &pool, &machine("gpu-a", 1)).await;
    let (b, _) = join(&fleet, &pool, &machine("gpu-b", 1)).await;
    let beat = |session: &Joined| Heartbeat {
        session_id: session.session.session_id.clone(),
        observed_generation: 1,
        clock_ms: now_ms(),
        gpu_utilization: Vec::new(),
    };
    let reply = fleet.app.heartbeat_with_credential(&a.credential, &beat(&a), None).await.expect("heartbeat");
    assert_eq!((reply.generation, reply.spec.is_none()), (1, true));
    assert_eq!(
        scalar_i64(&fleet, "SELECT count(*) FROM nodes WHERE id = $1 AND schedulable", a.node_id.as_str()).await,
        1
    );
    // A's credential with B's session: refused, B untouched.
    let err = fleet.app.heartbeat_with_credential(&a.credential, &beat(&b), None).await.expect_err("B's session");
    assert_eq!(code(&err), "CONFLICT");
    assert_eq!(
        scalar_i64(&fleet, "SELECT heartbeats FROM agent_sessions WHERE node_id = $1", b.node_id.as_str()).await,
        0
    );
    let err = fleet.app.heartbeat_with_credential("nc_unknown", &beat(&a), None).await.expect_err("unknown");
    assert_eq!(code(&err), "UNAUTHENTICATED");
    // A rotated credential's first heartbeat confirms it.
    let auth = fleet.app.authenticate_node(&a.credential).await.expect("auth");
    let rotated = fleet.app.rotate_credential(&auth).await.expect("rotate");
    fleet.app.heartbeat_with_credential(&rotated, &beat(&a), None).await.expect("with the new credential");
    assert_eq!(code(&fleet.app.authenticate_node(&a.credential).await.expect_err("old")), "UNAUTHENTICATED");
}

#[tokio::test]
async fn join_tokens_for_one_pool_can_be_issued_at_once() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("h100", Sharing::Exclusive, None).await;
    let issues = (0..16).map(|_| fleet.app.create_join_token(&fleet.owner, &pool, 3600));
    let tokens = futures_util::future::try_join_all(issues).await.expect("every token");
    let distinct: std::collections::BTreeSet<_> = tokens.iter().map(|t| t.value.token.clone()).collect();
    assert_eq!(distinct.len(), 16);
}

#[tokio::test]
async fn a_steady_heartbeat_is_one_round_trip_by_node_and_by_credential() {
    use bc_eventstore::Db;
    use bc_eventstore::testing::{RoundTrips, test_db_config};
    let fleet = Fleet::new().await;
    let pool = fleet.pool("agents", Sharing::Exclusive, None).await;
    let (joined, auth) = join(&fleet, &pool, &machine("host-a", 2)).await;
    // The first heartbeat records the generation the agent observed; the ones after it change nothing in the log.
    beat(&fleet, &auth, &joined, 1).await;
    let trips = RoundTrips::start(fleet.t.connect_options());
    let app = bc_commands::App::new(Db::connect_lazy_with(trips.connect_options(), &test_db_config()));
    let steady = Heartbeat {
        session_id: joined.session.session_id.clone(),
        observed_generation: 1,
        clock_ms: now_ms(),
        gpu_utilization: Vec::new(),
    };
    trips.take();
    let reply = app.heartbeat(&auth, &steady).await.expect("heartbeat by node");
    assert_eq!(trips.take(), 1);
    assert!(reply.lease_expires_ms > 0);
    let reply = app.heartbeat_with_credential(&joined.credential, &steady, None).await.expect("by credential");
    assert_eq!(trips.take(), 1);
    assert!(reply.lease_expires_ms > 0);
    // A session that is not current is refused, in the same one round trip.
    let stale = Heartbeat { session_id: "ses_00000000000000000000000000".parse().expect("session"), ..steady };
    let err = app.heartbeat(&auth, &stale).await.expect_err("not current");
    assert_eq!(code(&err), "CONFLICT");
}

#[tokio::test]
async fn heartbeats_sent_together_share_one_transaction_and_each_gets_its_own_answer() {
    use bc_eventstore::Db;
    use bc_eventstore::testing::{RoundTrips, test_db_config};
    let fleet = Fleet::new().await;
    let pool = fleet.pool("agents", Sharing::Exclusive, None).await;
    let mut nodes = Vec::new();
    for i in 0..12 {
        let (joined, auth) = join(&fleet, &pool, &machine(&format!("host-{i:02}"), 1)).await;
        beat(&fleet, &auth, &joined, 1).await;
        nodes.push((joined, auth));
    }
    let count = |node: &NodeAuth| {
        let node = node.node_id.to_string();
        let fleet = &fleet;
        async move { scalar_i64(fleet, "SELECT heartbeats FROM agent_sessions WHERE node_id = $1", &node).await }
    };
    let mut before = Vec::new();
    for (_, auth) in &nodes {
        before.push(count(auth).await);
    }
    let trips = RoundTrips::start(fleet.t.connect_options());
    let app = bc_commands::App::new(Db::connect_lazy_with(trips.connect_options(), &test_db_config()));
    let steady = |joined: &Joined| Heartbeat {
        session_id: joined.session.session_id.clone(),
        observed_generation: 1,
        clock_ms: now_ms(),
        gpu_utilization: Vec::new(),
    };
    let stale =
        Heartbeat { session_id: "ses_00000000000000000000000000".parse().expect("session"), ..steady(&nodes[1].0) };
    let beats: Vec<Heartbeat> = nodes.iter().map(|(joined, _)| steady(joined)).collect();
    let figures = bc_commands::heartbeat_batch_figures();
    trips.take();
    // Every node by its credential, the first node once more by its id, and the second with a session not its own,
    // all at once.
    let (by_credential, again, refused) = tokio::join!(
        futures_util::future::join_all(
            nodes.iter().zip(&beats).map(|((joined, _), beat)| app.heartbeat_with_credential(
                &joined.credential,
                beat,
                None
            ))
        ),
        app.heartbeat(&nodes[0].1, &beats[0]),
        app.heartbeat(&nodes[1].1, &stale),
    );
    let round_trips = trips.take();
    assert!(round_trips <= 2, "14 heartbeats at once took {round_trips} round trips");
    // The process's figures count them (other tests of this process may add their own).
    let after = bc_commands::heartbeat_batch_figures();
    assert!(after.heartbeats >= figures.heartbeats + 14, "{figures:?} then {after:?}");
    assert!(after.transactions > figures.transactions);
    for reply in by_credential.iter().chain([&again]) {
        assert!(reply.as_ref().expect("renewed").lease_expires_ms > now_ms());
    }
    assert_eq!(code(&refused.expect_err("not the current session")), "CONFLICT");
    for (i, (_, auth)) in nodes.iter().enumerate() {
        let wanted = before[i] + if i == 0 { 2 } else { 1 };
        assert_eq!(count(auth).await, wanted, "heartbeats counted for node {i}");
    }
}
