use super::*;

const T0: i64 = 1_893_456_000_000;

fn node(n: u8) -> NodeId {
    format!("node_01jd8w2k3m4n5p6q7r8s9t0v{n:02}").parse().expect("node")
}

fn spec() -> InstanceSpec {
    InstanceSpec {
        name: "trainer".into(),
        pool_id: "pool_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("pool"),
        flavor_id: "flv_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("flavor"),
        sizes: FlavorSizes { vcpu: 16, memory_gib: 128, gpus: 1, disk: 200 },
        image_id: "img_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("image"),
        project_id: None,
        user_data: "#cloud-config\n".into(),
        duration_s: 86_400,
    }
}

fn new(desired: DesiredState) -> NewInstance {
    let tenant: TenantId = "acme".parse().expect("tenant");
    let identity: Identity = "alice@acme".parse().expect("identity");
    let instance_id = InstanceId::derive(&tenant, &identity, "k1");
    NewInstance {
        reservation_id: instance_id.reservation_id(&tenant, &identity),
        instance_id,
        tenant_id: tenant,
        identity,
        spec: spec(),
        image_verified: true,
        desired,
        now_ms: T0,
    }
}

fn made() -> Instance {
    let events = create(None, new(DesiredState::Running)).expect("created");
    events.iter().fold(None, evolve_instance).expect("an instance")
}

fn apply(i: Instance, events: &[InstanceEvent]) -> Instance {
    events.iter().fold(Some(i), evolve_instance).expect("still an instance")
}

#[test]
fn an_instance_id_is_derived_like_a_reservations_and_its_reservation_cannot_be_made_by_a_key() {
    let tenant: TenantId = "acme".parse().expect("tenant");
    let identity: Identity = "alice@acme".parse().expect("identity");
    let id = InstanceId::derive(&tenant, &identity, "k1");
    assert_eq!(id, InstanceId::derive(&tenant, &identity, "k1"), "a retry finds the same instance");
    assert_ne!(id, InstanceId::derive(&tenant, &identity, "k2"));
    assert!(id.as_str().starts_with("inst_") && id.as_str().parse::<InstanceId>().is_ok());
    let reservation = id.reservation_id(&tenant, &identity);
    assert_ne!(reservation, ReservationId::derive(&tenant, &identity, "k1"));
    assert_ne!(reservation, ReservationId::derive(&tenant, &identity, &format!("instance:{}", id.as_str())));
}

#[test]
fn a_retry_is_the_same_instance_and_another_body_with_the_key_is_refused() {
    let i = made();
    assert_eq!((i.state, i.desired, i.generation), (InstanceState::Pending, DesiredState::Running, 1));
    assert_eq!(create(Some(&i), new(DesiredState::Running)), Ok(Vec::new()), "a retry records nothing");
    let other = create(Some(&i), new(DesiredState::Stopped)).expect_err("another body");
    assert_eq!(other.code(), "IDEMPOTENCY_KEY_REUSED");
    let deleted = create(None, new(DesiredState::Deleted)).expect_err("made deleted");
    assert!(matches!(deleted, Rejection::InvalidArgument { field, .. } if field == "desiredState"));
    let mut big = new(DesiredState::Running);
    big.spec.user_data = "x".repeat(MAX_USER_DATA + 1);
    assert!(matches!(create(None, big), Err(Rejection::InvalidArgument { field, .. }) if field == "userData"));
    let mut none = new(DesiredState::Running);
    none.spec.sizes.gpus = 0;
    assert!(matches!(create(None, none), Err(Rejection::InvalidArgument { field, .. }) if field == "gpus"));
}

#[test]
fn desired_states_change_in_order_and_a_deleted_instance_stays_deleted() {
    let i = made();
    assert_eq!(change_desired(&i, DesiredState::Running, T0), Ok(Vec::new()), "already running");
    let stop = change_desired(&i, DesiredState::Stopped, T0 + 1).expect("stop");
    let i = apply(i, &stop);
    assert_eq!((i.desired, i.generation), (DesiredState::Stopped, 2));
    let delete = change_desired(&i, DesiredState::Deleted, T0 + 2).expect("delete");
    let i = apply(i, &delete);
    let start = change_desired(&i, DesiredState::Running, T0 + 3).expect_err("started while being deleted");
    assert!(matches!(&start, Rejection::Conflict(m) if m.contains("cannot start") && m.contains("being deleted")));
    assert_eq!(change_desired(&i, DesiredState::Deleted, T0 + 3), Ok(Vec::new()), "deleting twice is one delete");
}

#[test]
fn only_the_allocations_node_reports_and_a_report_names_a_generation_asked_for() {
    let i = made();
    let here = node(1);
    let running = observe(&i, &here, Some(&here), InstanceState::Running, 1, None, T0 + 5).expect("running");
    let i = apply(i, &running);
    assert_eq!((i.state, i.observed_generation, i.node_id.as_ref()), (InstanceState::Running, 1, Some(&here)));
    assert_eq!(observe(&i, &here, Some(&here), InstanceState::Running, 1, None, T0 + 6), Ok(Vec::new()), "again");
    let elsewhere = observe(&i, &node(2), Some(&here), InstanceState::Running, 1, None, T0 + 6);
    assert!(matches!(elsewhere, Err(Rejection::NotFound { kind: "instance", .. })), "another node's report");
    let ahead = observe(&i, &here, Some(&here), InstanceState::Stopped, 2, None, T0 + 6);
    assert!(matches!(ahead, Err(Rejection::InvalidArgument { field, .. }) if field == "generation"));
    let pending = observe(&i, &here, Some(&here), InstanceState::Pending, 1, None, T0 + 6);
    assert!(matches!(pending, Err(Rejection::InvalidArgument { field, .. }) if field == "state"));
    let gone = observe(&i, &here, Some(&here), InstanceState::Deleted, 1, None, T0 + 6);
    assert!(matches!(gone, Err(Rejection::Conflict(m)) if m.contains("running")), "not asked to delete it");

    // Deleted as asked: final, and later reports change nothing.
    let i = apply(i.clone(), &change_desired(&i, DesiredState::Deleted, T0 + 7).expect("delete"));
    let done = observe(&i, &here, Some(&here), InstanceState::Deleted, 2, None, T0 + 8).expect("deleted");
    let i = apply(i, &done);
    assert!(i.state.is_final());
    assert_eq!(observe(&i, &here, Some(&here), InstanceState::Running, 2, None, T0 + 9), Ok(Vec::new()));
    let late = change_desired(&i, DesiredState::Running, T0 + 9).expect_err("deleted for good");
    assert!(matches!(late, Rejection::Conflict(m) if m.contains("is deleted")));
}

#[test]
fn the_end_of_its_allocation_ends_an_instance_once_as_deleted_or_failed() {
    let i = made();
    let ended = end(&i, false, "reservation rsv_x expired".into(), T0 + 10);
    let over = apply(i.clone(), &ended);
    assert_eq!((over.state, over.message.as_deref()), (InstanceState::Deleted, Some("reservation rsv_x expired")));
    assert_eq!(end(&over, true, "again".into(), T0 + 11), Vec::new(), "an instance over ends once");
    let failed = apply(i.clone(), &end(&i, true, "its node was lost".into(), T0 + 10));
    assert_eq!(failed.state, InstanceState::Failed);
    let late = change_desired(&failed, DesiredState::Running, T0 + 12).expect_err("over");
    assert!(matches!(late, Rejection::Conflict(m) if m.contains("is failed")));
    let report = observe(&failed, &node(1), Some(&node(1)), InstanceState::Running, 1, None, T0 + 12);
    assert_eq!(report, Ok(Vec::new()), "a node's late report changes nothing");
}

#[test]
fn an_instance_reads_back_what_it_writes() {
    let i = made();
    let i = apply(i.clone(), &change_desired(&i, DesiredState::Stopped, T0 + 1).expect("stop"));
    let json = serde_json::to_string(&i).expect("json");
    assert_eq!(serde_json::from_str::<Instance>(&json).expect("back"), i, "{json}");
}

#[test]
fn a_duration_past_366_days_is_refused_however_large() {
    for duration_s in [0, 366 * 86_400 + 1, u64::MAX, i64::MAX as u64 + 1] {
        let spec = InstanceSpec { duration_s, ..spec() };
        let refused = spec.check().expect_err("out of bounds");
        assert!(matches!(refused, Rejection::InvalidArgument { ref field, .. } if field == "duration"), "{duration_s}");
    }
}
