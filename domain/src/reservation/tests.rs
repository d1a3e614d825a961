//! The reservation aggregate without IO: given events, when a command, then events or a rejection.

use super::*;
use crate::event::DomainEvent;

const T0: i64 = 1_893_456_000_000;
const HOUR_MS: i64 = 3_600_000;

fn tenant() -> TenantId {
    "acme".parse().expect("tenant")
}

fn identity() -> Identity {
    "alice@acme".parse().expect("identity")
}

fn pool() -> PoolId {
    "pool_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("pool")
}

fn request_with(start_ms: Option<i64>, lease_seconds: Option<u64>) -> ReservationRequest {
    ReservationRequest {
        pool_id: pool(),
        devices: DeviceRequest {
            class: DeviceClass::Gpu,
            count: 2,
            selector: Selector::default(),
            topology: Topology::SameNode,
        },
        start_ms,
        duration_s: 3600,
        binding: Binding::Hold,
        lease_seconds,
        project_id: None,
        deadline_ms: None,
        wait: true,
        profile_id: None,
        resources: BTreeMap::new(),
    }
}

fn allocation(devices: &[&str]) -> Allocation {
    Allocation {
        allocation_id: "alloc_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("alloc"),
        node_id: "node_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("node"),
        devices: devices.iter().map(|d| d.parse().expect("device")).collect(),
        resources: BTreeMap::new(),
    }
}

/// Given these commands from an empty stream, the events they caused (each decided on the state so far).
fn given(request: ReservationRequest, commands: &[Command]) -> (Reservation, Vec<ReservationEvent>) {
    let new = NewRequest {
        reservation_id: ReservationId::derive(&tenant(), &identity(), "k"),
        tenant_id: tenant(),
        identity: identity(),
        request,
        priority: 0,
        quota_holder: None,
        now_ms: T0,
    };
    let mut events = super::request(None, new).expect("request");
    let mut state = fold(&events).expect("state");
    for command in commands {
        let more = decide(&state, command).unwrap_or_else(|err| panic!("given {command:?}: {err}"));
        for event in &more {
            state = evolve(Some(state), event).expect("evolve");
        }
        events.extend(more);
    }
    (state, events)
}

fn place(now_ms: i64) -> Command {
    Command::Place { allocations: vec![allocation(&["GPU-a", "GPU-b"])], now_ms }
}

/// A reservation in `state` whose every time condition lets the legal commands through: placed at T0 for
/// [T0 + 10 s, T0 + 10 s + 1 h) with a 10-minute lease.
fn in_state(state: ReservationState) -> Reservation {
    let (mut r, _) = given(request_with(Some(T0 + 10_000), Some(600)), &[place(T0)]);
    r.state = state;
    if state == ReservationState::Releasing {
        r.release_requested_at_ms = Some(T0 + 20_000);
    }
    r
}

/// Every command, with times at which its conditions hold for `in_state`.
fn every_command() -> Vec<Command> {
    let start = T0 + 10_000;
    vec![
        place(T0),
        Command::StartBinding { now_ms: start, awaiting: Vec::new() },
        Command::Activate { now_ms: start },
        Command::Cancel { now_ms: T0 + 1_000, reason: None },
        Command::Release { now_ms: start + 5_000, awaiting: Vec::new() },
        Command::CompleteRelease { now_ms: start + 6_000, unconfirmed: false },
        Command::Expire { cause: ExpiryCause::LeaseLapsed, now_ms: T0 + 600_001 },
        Command::Expire { cause: ExpiryCause::WindowEnded, now_ms: start + HOUR_MS },
        Command::Expire { cause: ExpiryCause::Preempted, now_ms: start + 1_000 },
        Command::Fail { reason: FailureReason::DeadlinePassed, now_ms: start },
        Command::Fail { reason: FailureReason::MaxPending, now_ms: T0 },
        Command::Fail { reason: FailureReason::ProviderRefused, now_ms: T0 + 1_000 },
        Command::Fail { reason: FailureReason::NodeLost, now_ms: T0 + 5_000 },
        Command::Fail { reason: FailureReason::BindingTimedOut, now_ms: start + 60_000 },
        Command::Fail { reason: FailureReason::BindingFailed, now_ms: start + 1_000 },
        Command::Replace {
            allocations: vec![allocation(&["GPU-c", "GPU-d"])],
            from_node: allocation(&["GPU-a"]).node_id,
            reason: "node lost".into(),
            now_ms: T0 + 5_000,
        },
        Command::Renew { now_ms: T0 + 300_000 },
        Command::Extend { end_ms: start + 2 * HOUR_MS, now_ms: T0 + 300_000 },
    ]
}

/// The legal transitions of DESIGN section 10, as (state, command) pairs.
fn is_legal(state: ReservationState, command: &Command) -> bool {
    use ReservationState as S;
    match command {
        Command::Place { .. } => state == S::Pending,
        Command::StartBinding { .. } => state == S::Placed,
        Command::Activate { .. } => state == S::Binding,
        Command::Cancel { .. } => matches!(state, S::Pending | S::Placed | S::AwaitingConfirmation),
        Command::Release { .. } => matches!(state, S::Binding | S::Active),
        Command::CompleteRelease { .. } => state == S::Releasing,
        Command::Expire { cause: ExpiryCause::LeaseLapsed, .. } => matches!(state, S::Placed | S::Active),
        Command::Expire { cause: ExpiryCause::WindowEnded | ExpiryCause::Preempted, .. } => state == S::Active,
        Command::Fail {
            reason: FailureReason::DeadlinePassed | FailureReason::MaxPending | FailureReason::ProviderRefused,
            ..
        } => state == S::Pending,
        Command::Fail { reason: FailureReason::NodeLost, .. } => state == S::Placed,
        Command::Fail { reason: FailureReason::BindingTimedOut | FailureReason::BindingFailed, .. } => {
            state == S::Binding
        }
        Command::Replace { .. } => state == S::Placed,
        Command::Renew { .. } | Command::Extend { .. } => matches!(state, S::Placed | S::Binding | S::Active),
    }
}

fn resulting_state(state: ReservationState, events: &[ReservationEvent]) -> ReservationState {
    let mut r = Some(in_state(state));
    for event in events {
        r = evolve(r, event);
    }
    r.expect("state").state
}

#[test]
fn every_transition_legal_and_illegal() {
    for state in ReservationState::ALL {
        for command in every_command() {
            let result = decide(&in_state(state), &command);
            if is_legal(state, &command) {
                let events = result.unwrap_or_else(|err| panic!("{state} + {command:?} must be legal: {err}"));
                assert_eq!(events.len(), 1, "{state} + {command:?}");
                let after = resulting_state(state, &events);
                let expected = match &command {
                    Command::Place { .. } => ReservationState::Placed,
                    Command::StartBinding { .. } => ReservationState::Binding,
                    Command::Activate { .. } => ReservationState::Active,
                    Command::Cancel { .. } => ReservationState::Cancelled,
                    Command::Release { .. } => ReservationState::Releasing,
                    Command::CompleteRelease { .. } => ReservationState::Released,
                    Command::Expire { .. } => ReservationState::Expired,
                    Command::Fail { .. } => ReservationState::Failed,
                    Command::Renew { .. } | Command::Extend { .. } | Command::Replace { .. } => state,
                };
                assert_eq!(after, expected, "{state} + {command:?}");
            } else {
                match result {
                    Err(Rejection::WrongState { state: named, verb }) => {
                        assert_eq!(named, state, "the rejection names the current state");
                        assert_eq!(verb, command.verb());
                    }
                    other => panic!("{state} + {command:?} must be refused with the state named, got {other:?}"),
                }
            }
        }
    }
}

#[test]
fn terminal_states_accept_nothing() {
    for state in ReservationState::ALL.into_iter().filter(|s| s.is_terminal()) {
        for command in every_command() {
            assert!(decide(&in_state(state), &command).is_err(), "{state} + {command:?}");
        }
    }
}

#[test]
fn a_request_is_checked_field_by_field() {
    let base = request_with(None, None);
    let whole = |count| DeviceRequest { class: DeviceClass::Node, count, ..base.devices.clone() };
    let profile = || "prof_01jd8w2k3m4n5p6q7r8s9t0v1w".parse::<ProfileId>().expect("profile");
    let node =
        ReservationRequest { binding: Binding::Node, devices: whole(3), profile_id: Some(profile()), ..base.clone() };
    let cases: Vec<(&str, ReservationRequest)> = vec![
        (
            "devices.class",
            ReservationRequest {
                devices: DeviceRequest { class: DeviceClass::Disk, ..base.devices.clone() },
                ..base.clone()
            },
        ),
        (
            "devices.count",
            ReservationRequest { devices: DeviceRequest { count: 0, ..base.devices.clone() }, ..base.clone() },
        ),
        (
            "devices.topology.nodes",
            ReservationRequest {
                devices: DeviceRequest { count: 3, topology: Topology::Gang { nodes: 2 }, ..base.devices.clone() },
                ..base.clone()
            },
        ),
        (
            "devices.topology.nodes",
            ReservationRequest {
                devices: DeviceRequest { topology: Topology::Gang { nodes: 1 }, ..base.devices.clone() },
                ..base.clone()
            },
        ),
        ("binding", ReservationRequest { binding: Binding::Instance, devices: whole(1), ..base.clone() }),
        ("devices.class", ReservationRequest { binding: Binding::Node, ..base.clone() }),
        ("binding", ReservationRequest { devices: whole(1), ..base.clone() }),
        ("profileId", ReservationRequest { binding: Binding::Node, devices: whole(1), ..base.clone() }),
        ("profileId", ReservationRequest { profile_id: Some(profile()), ..base.clone() }),
        ("devices.count", ReservationRequest { devices: whole(MAX_NODES + 1), ..node.clone() }),
        (
            "devices.topology",
            ReservationRequest {
                devices: DeviceRequest { topology: Topology::Gang { nodes: 2 }, ..whole(2) },
                ..node.clone()
            },
        ),
        ("resources.gpu", ReservationRequest { resources: scalars(&[("gpu", 1)]), ..base.clone() }),
        ("resources.vcpu", ReservationRequest { resources: scalars(&[("vcpu", 0)]), ..base.clone() }),
        (
            "resources.memoryGiB",
            ReservationRequest { resources: scalars(&[("memoryGiB", MAX_SCALAR + 1)]), ..base.clone() },
        ),
        ("resources", ReservationRequest { resources: scalars(&[("vcpu", 8)]), ..node.clone() }),
        ("duration", ReservationRequest { duration_s: 0, ..base.clone() }),
        ("duration", ReservationRequest { duration_s: 367 * 86_400, ..base.clone() }),
        // Above i64's range: read as an unsigned number, never wrapped into a small one.
        ("duration", ReservationRequest { duration_s: u64::MAX, ..base.clone() }),
        ("start", ReservationRequest { start_ms: Some(T0 + 1_500), ..base.clone() }),
        ("start", ReservationRequest { start_ms: Some(T0 - 60_000), ..base.clone() }),
        ("start", ReservationRequest { start_ms: Some(T0 + MAX_AHEAD_MS + 1_000), ..base.clone() }),
        ("leaseSeconds", ReservationRequest { lease_seconds: Some(0), ..base.clone() }),
        ("leaseSeconds", ReservationRequest { lease_seconds: Some(u64::MAX), ..base.clone() }),
        ("deadline", ReservationRequest { deadline_ms: Some(T0 - 1), ..base.clone() }),
        (
            "deadline",
            ReservationRequest { start_ms: Some(T0 + 10_000), deadline_ms: Some(T0 + 20_000), ..base.clone() },
        ),
    ];
    for (field, request) in cases {
        match request.check(T0) {
            Err(Rejection::InvalidArgument { field: named, .. }) => assert_eq!(named, field, "{request:?}"),
            other => panic!("expected {field} to be refused, got {other:?}"),
        }
    }
    assert!(base.check(T0).is_ok());
    assert_eq!(node.check(T0), Ok(()));
    assert_eq!((node.devices.nodes(), node.devices.per_node()), (3, 1), "each whole machine is one atom");
    let gang = ReservationRequest {
        devices: DeviceRequest { count: 16, topology: Topology::Gang { nodes: 2 }, ..base.devices.clone() },
        ..base.clone()
    };
    assert!(gang.check(T0).is_ok());
    assert_eq!(gang.devices.per_node(), 8);
    let scalar_gang = ReservationRequest { resources: scalars(&[("vcpu", 16), ("memoryGiB", 64)]), ..gang };
    assert_eq!(scalar_gang.check(T0), Ok(()));
    let totals: Vec<(&str, u64)> = scalar_gang.scalar_totals().collect();
    assert_eq!(totals, [("memoryGiB", 128), ("vcpu", 32)], "each allocation's amounts, times its nodes");
}

fn scalars(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(r, n)| ((*r).to_owned(), *n)).collect()
}

#[test]
fn a_request_without_scalars_hashes_as_before_they_existed() {
    // Requests recorded before scalar resources keep their digest, so their retries are still retries.
    let request = request_with(None, None);
    let bytes = rmp_serde::to_vec_named(&request).expect("encode");
    let value: rmpv::Value = rmp_serde::from_slice(&bytes).expect("decode");
    assert!(!value.to_string().contains("resources"), "{value}");
}

#[test]
fn the_same_key_and_body_is_a_retry_and_another_body_is_a_reuse() {
    let (existing, _) = given(request_with(None, None), &[]);
    let retry = NewRequest {
        reservation_id: existing.id.clone(),
        tenant_id: tenant(),
        identity: identity(),
        request: request_with(None, None),
        priority: 0,
        quota_holder: None,
        now_ms: T0 + 5_000,
    };
    assert_eq!(request(Some(&existing), retry.clone()), Ok(vec![]), "a retry records nothing new");
    let reuse = NewRequest { request: request_with(None, Some(60)), ..retry };
    assert_eq!(
        request(Some(&existing), reuse),
        Err(Rejection::IdempotencyKeyReused { reservation_id: existing.id.to_string() })
    );
}

#[test]
fn placing_without_a_start_starts_at_the_next_whole_second_and_keeps_the_duration() {
    let (r, events) = given(request_with(None, Some(60)), &[place(T0 + 1_234)]);
    assert_eq!(r.state, ReservationState::Placed);
    assert_eq!(r.start_ms, Some(T0 + 2_000));
    assert_eq!(r.end_ms, Some(T0 + 2_000 + HOUR_MS));
    assert_eq!(r.lease_deadline_ms, Some(T0 + 1_234 + 60_000));
    assert_eq!(events.len(), 2);
    let (r, _) = given(request_with(None, None), &[place(T0)]);
    assert_eq!(r.start_ms, Some(T0), "a whole second stays");
    let (r, _) = given(request_with(Some(T0 + 3_600_000), None), &[place(T0)]);
    assert_eq!(r.start_ms, Some(T0 + 3_600_000), "a requested start is kept");
}

#[test]
fn a_placement_must_match_the_request() {
    let (r, _) = given(request_with(None, None), &[]);
    let short = Command::Place { allocations: vec![allocation(&["GPU-a"])], now_ms: T0 };
    assert!(matches!(decide(&r, &short), Err(Rejection::InvalidArgument { .. })));
}

#[test]
fn the_full_life_of_a_reservation_and_when_its_bookings_end() {
    let start = T0 + 10_000;
    let (r, events) = given(
        request_with(Some(start), None),
        &[
            place(T0),
            Command::StartBinding { now_ms: start, awaiting: Vec::new() },
            Command::Activate { now_ms: start + 100 },
            Command::Release { now_ms: start + 60_000, awaiting: Vec::new() },
            Command::CompleteRelease { now_ms: start + 90_000, unconfirmed: false },
        ],
    );
    assert_eq!(r.state, ReservationState::Released);
    let types: Vec<&str> = events.iter().map(DomainEvent::event_type).collect();
    assert_eq!(
        types,
        vec![
            "reservation.requested",
            "reservation.placed",
            "reservation.binding_started",
            "reservation.activated",
            "reservation.release_requested",
            "reservation.released"
        ]
    );
    assert_eq!(r.ended_at_ms, Some(start + 60_000), "bookings end when the tenant released, not when it completed");
    assert_eq!(events.last().and_then(ReservationEvent::ends_bookings_at), Some(start + 60_000));
}

#[test]
fn the_window_end_and_a_lapsed_lease_expire_at_their_recorded_times() {
    let start = T0 + 10_000;
    let (r, _) = given(
        request_with(Some(start), None),
        &[
            place(T0),
            Command::StartBinding { now_ms: start, awaiting: Vec::new() },
            Command::Activate { now_ms: start },
            Command::Expire { cause: ExpiryCause::WindowEnded, now_ms: start + HOUR_MS + 42_000 },
        ],
    );
    assert_eq!((r.state, r.ended_at_ms), (ReservationState::Expired, Some(start + HOUR_MS)));

    let (r, _) = given(
        request_with(Some(T0 + HOUR_MS), Some(60)),
        &[place(T0), Command::Expire { cause: ExpiryCause::LeaseLapsed, now_ms: T0 + 300_000 }],
    );
    assert_eq!((r.state, r.ended_at_ms), (ReservationState::Expired, Some(T0 + 60_000)), "lapsed before its start");
    let (r, _) = given(request_with(None, Some(60)), &[place(T0)]);
    let early = Command::Expire { cause: ExpiryCause::LeaseLapsed, now_ms: T0 + 60_000 };
    assert!(matches!(decide(&r, &early), Err(Rejection::Conflict(_))), "not lapsed at the deadline itself");
}

#[test]
fn renewing_pushes_the_deadline_and_a_renew_after_it_is_refused() {
    let (r, _) = given(request_with(None, Some(60)), &[place(T0), Command::Renew { now_ms: T0 + 50_000 }]);
    assert_eq!(r.lease_deadline_ms, Some(T0 + 110_000));
    assert!(decide(&r, &Command::Renew { now_ms: T0 + 110_000 }).is_ok(), "at the deadline itself is in time");
    let late = decide(&r, &Command::Renew { now_ms: T0 + 110_001 });
    assert!(matches!(&late, Err(Rejection::Conflict(message)) if message.contains("lapsed")), "{late:?}");
    let (unleased, _) = given(request_with(None, None), &[place(T0)]);
    assert!(matches!(decide(&unleased, &Command::Renew { now_ms: T0 }), Err(Rejection::Conflict(_))));
}

#[test]
fn extending_moves_the_end_later_only() {
    let (r, _) = given(request_with(None, None), &[place(T0)]);
    let end = r.end_ms.expect("end");
    let (r2, events) =
        given(request_with(None, None), &[place(T0), Command::Extend { end_ms: end + HOUR_MS, now_ms: T0 }]);
    assert_eq!(r2.end_ms, Some(end + HOUR_MS));
    assert!(matches!(&events[2], ReservationEvent::Extended(e) if e.previous_end_ms == end));
    for bad in [end, end - 1_000, end + 1_500] {
        assert!(
            matches!(decide(&r, &Command::Extend { end_ms: bad, now_ms: T0 }), Err(Rejection::InvalidArgument { .. })),
            "{bad}"
        );
    }
    assert!(
        decide(&r, &Command::Extend { end_ms: r.start_ms.unwrap_or_default() + MAX_AHEAD_MS + 1_000, now_ms: T0 })
            .is_err()
    );
}

#[test]
fn failing_a_pending_reservation_at_its_deadline_records_the_deadline() {
    let (r, _) = given(request_with(Some(T0 + 60_000), None), &[]);
    assert_eq!(r.pending_deadline_ms, T0 + 60_000, "without a deadline, the start is the deadline");
    assert_eq!(due(&r, T0 + 30_000), Due::TryPlace { wake_at_ms: T0 + 60_000 });
    let Due::Apply(command) = due(&r, T0 + 61_000) else { panic!("due to fail") };
    let events = decide(&r, &command).expect("fail");
    assert_eq!(
        events,
        vec![ReservationEvent::Failed(Failed { at_ms: T0 + 60_000, reason: FailureReason::DeadlinePassed })]
    );
    let (open_ended, _) = given(request_with(None, None), &[]);
    assert_eq!(open_ended.pending_deadline_ms, T0 + DEFAULT_PENDING_WAIT_MS);
}

#[test]
fn due_work_follows_the_recorded_times() {
    let start = T0 + 60_000;
    let (placed, _) = given(request_with(Some(start), None), &[place(T0)]);
    assert_eq!(due(&placed, T0 + 1_000), Due::WakeAt(start));
    assert_eq!(due(&placed, start), Due::Apply(Command::StartBinding { now_ms: start, awaiting: Vec::new() }));
    let (leased, _) = given(request_with(Some(start), Some(30)), &[place(T0)]);
    assert_eq!(due(&leased, T0 + 1_000), Due::WakeAt(T0 + 30_001));
    assert_eq!(
        due(&leased, T0 + 30_001),
        Due::Apply(Command::Expire { cause: ExpiryCause::LeaseLapsed, now_ms: T0 + 30_001 })
    );
    let (active, _) = given(
        request_with(Some(start), None),
        &[
            place(T0),
            Command::StartBinding { now_ms: start, awaiting: Vec::new() },
            Command::Activate { now_ms: start },
        ],
    );
    assert_eq!(due(&active, start + 5), Due::WakeAt(start + HOUR_MS));
    assert_eq!(
        due(&active, start + HOUR_MS),
        Due::Apply(Command::Expire { cause: ExpiryCause::WindowEnded, now_ms: start + HOUR_MS })
    );
    let (binding, _) = given(
        request_with(Some(start), None),
        &[place(T0), Command::StartBinding { now_ms: start, awaiting: Vec::new() }],
    );
    assert_eq!(due(&binding, start), Due::Apply(Command::Activate { now_ms: start }));
    let (cancelled, _) = given(request_with(None, None), &[Command::Cancel { now_ms: T0, reason: None }]);
    assert_eq!(due(&cancelled, T0), Due::Done);
}

#[test]
fn events_round_trip_through_their_encoding() {
    let (_, events) = given(
        request_with(None, Some(60)),
        &[
            place(T0),
            Command::Renew { now_ms: T0 + 1_000 },
            Command::Cancel { now_ms: T0 + 2_000, reason: Some("changed plans".into()) },
        ],
    );
    let opening: Vec<bool> = events.iter().map(ReservationEvent::opens_stream).collect();
    assert!(opening[0], "the request opens the stream");
    assert!(opening[1..].iter().all(|opens| !opens), "no later event of the stream opens it: {opening:?}");
    for event in &events {
        let bytes = event.encode_payload().expect("encode");
        let back = ReservationEvent::decode(event.event_type(), event.schema_version(), &bytes).expect("decode");
        assert_eq!(&back, event);
    }
    assert!(ReservationEvent::event_types().contains(&"reservation.denied"));
    assert!(matches!(
        ReservationEvent::decode("node.cordoned", 1, &[0x80]),
        Err(crate::event::DecodeError::UnknownType { .. })
    ));
}

#[test]
fn every_event_type_but_renewals_extensions_and_replacements_names_the_state_it_moves_to() {
    let keeping: Vec<&str> = ReservationEvent::event_types()
        .iter()
        .copied()
        .filter(|event_type| ReservationEvent::state_after_type(event_type).is_none())
        .collect();
    assert_eq!(keeping, ["reservation.renewed", "reservation.extended", "reservation.replaced"]);
    assert_eq!(ReservationEvent::state_after_type("reservation.placed"), Some(ReservationState::Placed));
    assert_eq!(ReservationEvent::state_after_type("node.cordoned"), None);
}

#[test]
fn wire_spellings_are_the_seeds() {
    assert_eq!(
        serde_json::to_string(&ReservationState::AwaitingConfirmation).expect("json"),
        "\"awaiting-confirmation\""
    );
    assert_eq!(
        serde_json::to_value(Topology::Gang { nodes: 2 }).expect("json"),
        serde_json::json!({"kind": "gang", "nodes": 2})
    );
    assert_eq!(serde_json::to_value(Topology::SameNode).expect("json"), serde_json::json!({"kind": "same-node"}));
    assert_eq!(ReservationState::ALL.iter().filter(|s| s.is_terminal()).count(), 5);
    for cause in [ExpiryCause::WindowEnded, ExpiryCause::LeaseLapsed, ExpiryCause::Preempted] {
        assert_eq!(serde_json::to_value(cause).expect("json"), serde_json::json!(cause.as_str()));
    }
    for reason in [
        FailureReason::DeadlinePassed,
        FailureReason::MaxPending,
        FailureReason::NodeLost,
        FailureReason::BindingTimedOut,
        FailureReason::BindingFailed,
        FailureReason::ProviderRefused,
    ] {
        assert_eq!(serde_json::to_value(reason).expect("json"), serde_json::json!(reason.as_str()));
    }
}

#[test]
fn the_outcome_is_set_by_the_event_that_ends_it_and_only_then() {
    let (placed, _) = given(request_with(None, None), &[place(T0)]);
    assert_eq!(placed.outcome, None);
    let ended = |command: Command| {
        let events = decide(&placed, &command).expect("decided");
        events.iter().fold(Some(placed.clone()), evolve).expect("state").outcome
    };
    let cancel = |reason: Option<&str>| Command::Cancel { now_ms: T0 + 1, reason: reason.map(str::to_owned) };
    assert_eq!(ended(cancel(Some("plans changed"))).as_deref(), Some("plans changed"));
    assert_eq!(ended(cancel(None)), None);
    let lost = Command::Fail { reason: FailureReason::NodeLost, now_ms: T0 + 1 };
    assert_eq!(ended(lost).as_deref(), Some("node-lost"));
    let (active, _) = given(
        request_with(None, None),
        &[
            place(T0),
            Command::StartBinding { now_ms: T0 + 1000, awaiting: Vec::new() },
            Command::Activate { now_ms: T0 + 1000 },
        ],
    );
    let events = decide(&active, &Command::Expire { cause: ExpiryCause::WindowEnded, now_ms: T0 + 2 * HOUR_MS })
        .expect("expired");
    let expired = events.iter().fold(Some(active.clone()), evolve).expect("state");
    assert_eq!(expired.outcome.as_deref(), Some("window-ended"));
    // A renewal or an extension after the end would be refused; an event that does not end it keeps none.
    assert_eq!(ReservationEvent::Renewed(Renewed { lease_deadline_ms: T0, at_ms: T0 }).outcome(), None);
}

#[test]
fn denied_is_recorded_with_no_booking() {
    let denied = ReservationEvent::Denied(Denied {
        reservation_id: ReservationId::derive(&tenant(), &identity(), "d"),
        tenant_id: tenant(),
        identity: identity(),
        request: request_with(None, None),
        request_hash: request_with(None, None).hash(),
        reason: "users of this pool may reserve up to 1 H100".into(),
        at_ms: T0,
    });
    assert!(denied.opens_stream(), "a denial is recorded in place of the request, as its stream's first event");
    let r = fold([&denied]).expect("state");
    assert_eq!(r.state, ReservationState::Denied);
    assert!(r.allocations.is_empty());
    assert!(r.state.is_terminal() && !r.state.holds_atoms());
}

#[test]
fn the_harness_walks_a_reservation_from_its_request_to_its_release() {
    use crate::testing::{Reservations, given as from};

    let (placed, history) = given(request_with(None, None), &[place(T0)]);
    let state = from::<Reservations>(history.clone()).state().cloned().expect("placed");
    assert_eq!(state, placed);
    let mut history = history;
    history.push(ReservationEvent::BindingStarted(HandOver { at_ms: T0 + 1000, awaiting: Vec::new() }));
    history.push(ReservationEvent::Activated(At { at_ms: T0 + 1000 }));
    let released = from::<Reservations>(history.clone())
        .when(|r| decide(r.expect("a reservation"), &Command::Release { now_ms: T0 + 2000, awaiting: Vec::new() }))
        .then([ReservationEvent::ReleaseRequested(HandOver { at_ms: T0 + 2000, awaiting: Vec::new() })])
        .expect("releasing");
    assert_eq!(released.state, ReservationState::Releasing);
    from::<Reservations>(history)
        .when(|r| decide(r.expect("a reservation"), &Command::Cancel { now_ms: T0 + 2000, reason: None }))
        .then_rejected(|r| matches!(r, Rejection::WrongState { verb: "cancel", state: ReservationState::Active }));
}

mod admission {
    //! Admission as a pure decision over the pool's facts, the governing offer and the tenant tree.

    use super::*;
    use crate::device::Sharing;
    use crate::pool::PoolOffered;

    fn offer(tenant_id: &str, gpus: u32, priority: i32, include_descendants: bool) -> PoolOffered {
        PoolOffered {
            pool_id: pool(),
            tenant_id: tenant_id.parse().expect("tenant"),
            quota: [("gpu".to_owned(), gpus)].into(),
            priority,
            include_descendants,
            at_ms: T0,
        }
    }

    /// The pool every test asks of, owned by the platform.
    static POOL: std::sync::LazyLock<(PoolId, TenantId)> =
        std::sync::LazyLock::new(|| (pool(), "root".parse().expect("tenant")));

    fn facts<'a>(offers: &'a [PoolOffered], tenant: &'a TenantId, ancestors: &'a [TenantId]) -> AdmissionFacts<'a> {
        AdmissionFacts {
            pool_id: &POOL.0,
            pool_owner: &POOL.1,
            sharing: Sharing::Exclusive,
            tenant_root: false,
            gpu_model: "H100",
            offers,
            tenant,
            ancestors,
            project_in_tenant: true,
        }
    }

    #[test]
    fn the_owner_is_not_quota_limited_and_a_tenant_is_charged_to_its_governing_offer() {
        let owner: TenantId = "root".parse().expect("tenant");
        let admitted = admit(&request_with(None, None), &facts(&[], &owner, &[])).expect("the owner");
        assert_eq!(admitted, Admitted { priority: 0, quota_holder: None });
        let offers = [offer("acme", 4, 10, false), offer("corp", 8, 1, true)];
        let acme = tenant();
        let admitted = admit(&request_with(None, None), &facts(&offers, &acme, &[])).expect("acme's own offer");
        assert_eq!(admitted, Admitted { priority: 10, quota_holder: Some(acme.clone()) });
        // A child of corp is reached by corp's offer, and charged to corp's quota.
        let child: TenantId = "corp-eu".parse().expect("tenant");
        let ancestors: [TenantId; 1] = ["corp".parse().expect("tenant")];
        let admitted = admit(&request_with(None, None), &facts(&offers, &child, &ancestors)).expect("inherited");
        assert_eq!(admitted.quota_holder, Some("corp".parse().expect("tenant")));
    }

    #[test]
    fn a_pool_not_offered_does_not_exist_and_a_count_beyond_the_quota_never_fits() {
        let offers = [offer("acme", 1, 0, false)];
        let globex: TenantId = "globex".parse().expect("tenant");
        let refused = admit(&request_with(None, None), &facts(&offers, &globex, &[])).expect_err("not offered");
        assert!(matches!(refused, Rejection::NotFound { kind: "pool", .. }));
        let acme = tenant();
        let refused = admit(&request_with(None, None), &facts(&offers, &acme, &[])).expect_err("two of one");
        assert!(matches!(refused, Rejection::QuotaExceeded(m) if m.contains("quota for gpu") && m.contains("is 1")));
        let mut slots = request_with(None, None);
        slots.devices.class = DeviceClass::GpuSlot;
        let offers = [offer("acme", 4, 0, false)];
        let refused = admit(&slots, &facts(&offers, &acme, &[])).expect_err("no gpu.slot quota");
        assert!(matches!(refused, Rejection::QuotaExceeded(_)), "a resource the quota does not name grants none");
    }

    #[test]
    fn scalar_totals_beyond_the_quota_never_fit_and_a_scalar_the_quota_does_not_name_grants_none() {
        let acme = tenant();
        let quota = |pairs: &[(&str, u32)]| PoolOffered {
            quota: pairs.iter().map(|(r, n)| ((*r).to_owned(), *n)).collect(),
            ..offer("acme", 8, 0, false)
        };
        let mut request = request_with(None, None);
        request.devices = DeviceRequest { count: 4, topology: Topology::Gang { nodes: 2 }, ..request.devices };
        request.resources = scalars(&[("vcpu", 16)]);
        let offers = [quota(&[("gpu", 8), ("vcpu", 32)])];
        assert!(admit(&request, &facts(&offers, &acme, &[])).is_ok(), "16 vCPUs on each of 2 nodes is 32");
        let offers = [quota(&[("gpu", 8), ("vcpu", 31)])];
        let refused = admit(&request, &facts(&offers, &acme, &[])).expect_err("32 of 31");
        assert!(
            matches!(&refused, Rejection::QuotaExceeded(m) if m.contains("quota for vcpu") && m.contains("asks for 32")),
            "{refused:?}"
        );
        let offers = [quota(&[("gpu", 8)])];
        assert!(matches!(admit(&request, &facts(&offers, &acme, &[])), Err(Rejection::QuotaExceeded(_))));
        assert!(within_limit(24, 8, 32) && !within_limit(25, 8, 32));
    }

    #[test]
    fn the_atoms_model_and_project_must_be_the_pools_and_the_callers() {
        let offers = [offer("acme", 8, 0, false)];
        let acme = tenant();
        let mut mig = request_with(None, None);
        mig.devices.class = DeviceClass::GpuMig;
        let mig_offers = [PoolOffered { quota: [("gpu.mig".to_owned(), 8)].into(), ..offer("acme", 8, 0, false) }];
        let refused = admit(&mig, &facts(&mig_offers, &acme, &[])).expect_err("mig atoms of an exclusive pool");
        assert!(matches!(refused, Rejection::CapacityUnavailable(m) if m.contains("books gpu atoms")));
        let mut a100 = request_with(None, None);
        a100.devices.selector.gpu_model = Some("A100".into());
        let refused = admit(&a100, &facts(&offers, &acme, &[])).expect_err("an A100 of an H100 pool");
        assert!(matches!(refused, Rejection::CapacityUnavailable(m) if m.contains("holds H100 GPUs only")));
        let mut elsewhere = request_with(None, None);
        elsewhere.project_id = Some("prj_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("project"));
        let foreign = AdmissionFacts { project_in_tenant: false, ..facts(&offers, &acme, &[]) };
        let refused = admit(&elsewhere, &foreign).expect_err("another tenant's project");
        assert!(matches!(refused, Rejection::InvalidArgument { field, .. } if field == "projectId"));
    }

    #[test]
    fn quota_holds_at_every_instant_and_a_request_that_does_not_fit_now_waits_when_it_may() {
        assert!(within_quota(2, 2, 4));
        assert!(!within_quota(3, 2, 4));
        let pool_id = pool();
        let room = Waiting { pool_id: &pool_id, holders: 1, pending: 0, max_pending: 10 };
        assert_eq!(may_wait(&request_with(None, None), &room), Ok(()));
        let never = Waiting { holders: 0, ..room };
        assert!(
            matches!(may_wait(&request_with(None, None), &never), Err(Rejection::CapacityUnavailable(m)) if m.contains("can never fit"))
        );
        let full = Waiting { pending: 10, ..room };
        assert!(
            matches!(may_wait(&request_with(None, None), &full), Err(Rejection::CapacityUnavailable(m)) if m.contains("maxPending 10"))
        );
        let impatient = ReservationRequest { wait: false, ..request_with(None, None) };
        assert!(
            matches!(may_wait(&impatient, &room), Err(Rejection::CapacityUnavailable(m)) if m.contains("not to wait"))
        );
    }
}
