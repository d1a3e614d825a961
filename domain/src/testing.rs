//! Given events, when a command, then events or a rejection: every aggregate tested without IO, from the
//! events its stream would hold, never from hand-built states. A failed expectation names the caller's line.

use std::fmt::Debug;

use crate::Rejection;
use crate::node::{self, Node, NodeEvent};
use crate::pool::{self, JoinToken, Pool, PoolEvent};
use crate::reservation::{self, Reservation, ReservationEvent};
use crate::site::{self, Project, ProjectEvent, Site, SiteEvent};
use crate::tenancy::{self, Grant, GrantEvent, IdentityEvent, IdentityRecord, Limit, LimitEvent, Tenant, TenantEvent};

/// An aggregate: its state, its events, and the one `evolve` that folds them.
pub trait Aggregate {
    type State: Clone + Debug;
    type Event: Clone + Debug + PartialEq;
    fn evolve(state: Option<Self::State>, event: &Self::Event) -> Option<Self::State>;
}

macro_rules! aggregate {
    ($(#[$doc:meta])* $name:ident: $state:ty, $event:ty, $evolve:path) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub struct $name;

        impl Aggregate for $name {
            type State = $state;
            type Event = $event;
            fn evolve(state: Option<$state>, event: &$event) -> Option<$state> {
                $evolve(state, event)
            }
        }
    };
}

aggregate!(
    /// A reservation's stream.
    Reservations: Reservation, ReservationEvent, reservation::evolve
);
aggregate!(
    /// A node's stream.
    Nodes: Node, NodeEvent, node::evolve
);
aggregate!(
    /// A pool's stream.
    Pools: Pool, PoolEvent, pool::evolve
);
aggregate!(
    /// A join token's stream.
    JoinTokens: JoinToken, PoolEvent, pool::evolve_join_token
);
aggregate!(
    /// A site's stream.
    Sites: Site, SiteEvent, site::evolve_site
);
aggregate!(
    /// A project's stream.
    Projects: Project, ProjectEvent, site::evolve_project
);
aggregate!(
    /// A tenant's stream.
    Tenants: Tenant, TenantEvent, tenancy::evolve_tenant
);
aggregate!(
    /// An identity's stream.
    Identities: IdentityRecord, IdentityEvent, tenancy::evolve_identity
);
aggregate!(
    /// A grant's stream.
    Grants: Grant, GrantEvent, tenancy::evolve_grant
);
aggregate!(
    /// An attribute limit's stream.
    Limits: Limit, LimitEvent, tenancy::evolve_limit
);

/// A stream's history, folded.
#[derive(Debug, Clone)]
pub struct Given<A: Aggregate> {
    state: Option<A::State>,
}

/// The history of a stream: its events, in order (none for a stream that does not exist yet).
pub fn given<A: Aggregate>(events: impl IntoIterator<Item = A::Event>) -> Given<A> {
    Given { state: events.into_iter().fold(None, |state, event| A::evolve(state, &event)) }
}

impl<A: Aggregate> Given<A> {
    /// The state the history folds to.
    pub fn state(&self) -> Option<&A::State> {
        self.state.as_ref()
    }

    /// The decision a command gets on that state.
    pub fn when(self, decide: impl FnOnce(Option<&A::State>) -> Result<Vec<A::Event>, Rejection>) -> Then<A> {
        let decided = decide(self.state.as_ref());
        Then { state: self.state, decided }
    }
}

/// A decision, to hold against what was expected.
#[derive(Debug)]
pub struct Then<A: Aggregate> {
    state: Option<A::State>,
    decided: Result<Vec<A::Event>, Rejection>,
}

impl<A: Aggregate> Then<A> {
    /// Expects exactly these events, and answers the state they fold to.
    #[track_caller]
    pub fn then(self, expected: impl IntoIterator<Item = A::Event>) -> Option<A::State> {
        let expected: Vec<A::Event> = expected.into_iter().collect();
        match self.decided {
            Ok(events) => {
                assert_eq!(events, expected, "the command decided other events than expected");
                events.iter().fold(self.state, |state, event| A::evolve(state, event))
            }
            Err(rejection) => panic!("expected {expected:?}, the command was refused: {rejection:?}"),
        }
    }

    /// Expects no event at all (the command finds the state already as asked).
    #[track_caller]
    pub fn then_nothing(self) {
        self.then(Vec::new());
    }

    /// Expects a rejection, checked by `is`; answers it.
    #[track_caller]
    pub fn then_rejected(self, is: impl FnOnce(&Rejection) -> bool) -> Rejection {
        match self.decided {
            Ok(events) => panic!("expected a rejection, the command decided {events:?}"),
            Err(rejection) => {
                assert!(is(&rejection), "the command was refused otherwise than expected: {rejection:?}");
                rejection
            }
        }
    }
}
