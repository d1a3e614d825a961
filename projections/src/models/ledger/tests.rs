//! The ledger's fold, given a reservation's events as the domain decides them: what each ending, extension and
//! activation leaves of the booked and bound intervals.

use bc_domain::device::DeviceClass;
use bc_domain::id::{AllocationId, DeviceId, Identity, NodeId, PoolId, ReservationId, TenantId};
use bc_domain::reservation::{
    self, Allocation, Command, ExpiryCause, FailureReason, NewRequest, Reservation, ReservationRequest,
};

use super::{Booking, evolve, gpus_of};

const T0: i64 = 1_893_456_000_000;
const MIN: i64 = 60_000;

/// A reservation's life: the domain's fold beside the ledger's.
struct Life {
    r: Reservation,
    b: Option<Booking>,
}

impl Life {
    /// Requested at T0 for `count` GPUs of `duration_s`, starting at `start_ms` (or when placed).
    fn requested(count: u32, start_ms: Option<i64>, duration_s: u64) -> Life {
        let tenant: TenantId = "acme".parse().expect("tenant");
        let identity: Identity = "alice@acme".parse().expect("identity");
        let pool: PoolId = "pool_01m8q000000000000000000000".parse().expect("pool");
        let mut request = ReservationRequest::hold(pool, DeviceClass::Gpu, count);
        request.start_ms = start_ms;
        request.duration_s = duration_s;
        let events = reservation::request(
            None,
            NewRequest {
                reservation_id: ReservationId::derive(&tenant, &identity, "k"),
                tenant_id: tenant,
                identity,
                request,
                priority: 0,
                quota_holder: None,
                now_ms: T0,
            },
        )
        .expect("request");
        let mut life = Life { r: reservation::fold(&events).expect("a reservation"), b: None };
        for event in &events {
            life.b = evolve(life.b.take(), event);
        }
        life
    }

    fn then(mut self, command: Command) -> Life {
        for event in reservation::decide(&self.r, &command).expect("the command applies") {
            self.r = reservation::evolve(Some(self.r), &event).expect("a reservation");
            self.b = evolve(self.b.take(), &event);
        }
        self
    }

    fn placed(self, now_ms: i64) -> Life {
        let node = NodeId::generate();
        let devices: Vec<DeviceId> =
            (0..self.r.request.devices.count).map(|g| format!("GPU-{g}").parse().expect("device")).collect();
        let allocations = vec![Allocation {
            allocation_id: AllocationId::generate(),
            node_id: node,
            devices,
            resources: Default::default(),
        }];
        self.then(Command::Place { allocations, now_ms })
    }

    fn running(self, now_ms: i64) -> Life {
        self.then(Command::StartBinding { now_ms, awaiting: Vec::new() }).then(Command::Activate { now_ms })
    }

    fn booking(&self) -> &Booking {
        self.b.as_ref().expect("the ledger keeps it")
    }
}

#[test]
fn a_request_books_nothing_until_placed_and_a_cancel_before_placement_leaves_no_row() {
    let life = Life::requested(2, None, 3600);
    assert_eq!(life.booking().atoms, 2);
    assert_eq!(life.booking().booked, None);
    let life = life.then(Command::Cancel { now_ms: T0 + MIN, reason: None });
    assert_eq!(life.b, None, "a reservation never placed has nothing in the ledger");
    let failed = Life::requested(1, None, 3600).then(Command::Fail { reason: FailureReason::MaxPending, now_ms: T0 });
    assert_eq!(failed.b, None);
}

#[test]
fn a_release_ends_booked_and_bound_at_the_release_request() {
    let life = Life::requested(2, None, 3600).placed(T0).running(T0 + 5_000);
    assert_eq!(life.booking().booked, Some((T0, T0 + 3_600_000)));
    assert_eq!((life.booking().bound_from, life.booking().bound_to), (Some(T0 + 5_000), None));
    let life = life.then(Command::Release { now_ms: T0 + 30 * MIN, awaiting: Vec::new() });
    assert_eq!(life.booking().bound_to, Some(T0 + 30 * MIN), "no longer bound once a release is asked for");
    assert_eq!(life.booking().booked, Some((T0, T0 + 3_600_000)), "still booked until the release completes");
    let life = life.then(Command::CompleteRelease { now_ms: T0 + 31 * MIN, unconfirmed: false });
    assert_eq!(life.booking().booked, Some((T0, T0 + 30 * MIN)), "booked until the release was asked for");
    assert_eq!(life.booking().bound_to, Some(T0 + 30 * MIN));
}

#[test]
fn a_cancel_before_the_window_leaves_an_empty_booking_and_an_extension_moves_its_end() {
    let later = Life::requested(1, Some(T0 + 120 * MIN), 3600).placed(T0);
    assert_eq!(later.booking().booked, Some((T0 + 120 * MIN, T0 + 180 * MIN)));
    let cancelled = later.then(Command::Cancel { now_ms: T0 + MIN, reason: None });
    assert_eq!(cancelled.booking().booked, Some((T0 + 120 * MIN, T0 + 120 * MIN)), "empty: it began after the cancel");

    let life = Life::requested(1, None, 3600).placed(T0).running(T0);
    let life = life.then(Command::Extend { end_ms: T0 + 150 * MIN, now_ms: T0 + 10 * MIN });
    assert_eq!(life.booking().booked, Some((T0, T0 + 150 * MIN)));
    let life = life.then(Command::Expire { cause: ExpiryCause::WindowEnded, now_ms: T0 + 151 * MIN });
    assert_eq!(life.booking().booked, Some((T0, T0 + 150 * MIN)), "the expiry ends it at the window's end");
    assert_eq!((life.booking().bound_from, life.booking().bound_to), (Some(T0), Some(T0 + 150 * MIN)));
}

#[test]
fn a_binding_that_fails_was_booked_until_the_failure_and_never_bound() {
    let life = Life::requested(1, None, 3600).placed(T0);
    let life = life
        .then(Command::StartBinding { now_ms: T0, awaiting: vec![NodeId::generate()] })
        .then(Command::Fail { reason: FailureReason::BindingTimedOut, now_ms: T0 + 2 * MIN });
    assert_eq!(life.booking().booked, Some((T0, T0 + 2 * MIN)));
    assert_eq!((life.booking().bound_from, life.booking().bound_to), (None, None));
}

#[test]
fn an_atoms_gpu_is_its_ids_first_part_and_a_whole_machine_is_every_gpu_of_its_node() {
    let node = NodeId::generate();
    let allocation = |devices: &[&str]| Allocation {
        allocation_id: AllocationId::generate(),
        node_id: node.clone(),
        devices: devices.iter().map(|d| d.parse().expect("device")).collect(),
        resources: Default::default(),
    };
    assert_eq!(
        gpus_of(&[allocation(&["GPU-a/gi1/ci0", "GPU-a/gi2/ci0", "GPU-b/s3"])]),
        vec![format!("{node}/GPU-a"), format!("{node}/GPU-b")]
    );
    assert_eq!(gpus_of(&[allocation(&[DeviceId::whole_node(&node).as_str()])]), vec![format!("{node}/*")]);
}
