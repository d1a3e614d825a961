//! Every event family of the capacity model under one type, for code that handles events of all
//! aggregates: the inline projections, rebuilds and replays.

use crate::event::{DecodeError, DomainEvent, EncodeError};
use crate::flavor::FlavorEvent;
use crate::image::ImageEvent;
use crate::instance::InstanceEvent;
use crate::node::NodeEvent;
use crate::pool::PoolEvent;
use crate::profile::ProfileEvent;
use crate::provider::ProviderAccountEvent;
use crate::reservation::ReservationEvent;
use crate::site::{ProjectEvent, SiteEvent};
use crate::tenancy::{GrantEvent, IdentityEvent, LimitEvent, TenantEvent};
use crate::webhook::WebhookEvent;
use crate::workflow::WorkflowEvent;

/// An event of any aggregate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnyEvent {
    Site(SiteEvent),
    Project(ProjectEvent),
    Pool(PoolEvent),
    Node(NodeEvent),
    Reservation(ReservationEvent),
    Tenant(TenantEvent),
    Identity(IdentityEvent),
    Grant(GrantEvent),
    Limit(LimitEvent),
    Image(ImageEvent),
    Profile(ProfileEvent),
    Workflow(WorkflowEvent),
    ProviderAccount(ProviderAccountEvent),
    Flavor(FlavorEvent),
    Instance(InstanceEvent),
    Webhook(WebhookEvent),
}

impl AnyEvent {
    /// Decodes a stored event. `None` for event types of families this enum does not hold.
    pub fn decode(event_type: &str, schema_version: i16, payload: &[u8]) -> Result<Option<Self>, DecodeError> {
        let family = event_type.split_once('.').map_or(event_type, |(family, _)| family);
        Ok(Some(match family {
            "site" => AnyEvent::Site(SiteEvent::decode(event_type, schema_version, payload)?),
            "project" => AnyEvent::Project(ProjectEvent::decode(event_type, schema_version, payload)?),
            "pool" => AnyEvent::Pool(PoolEvent::decode(event_type, schema_version, payload)?),
            "node" => AnyEvent::Node(NodeEvent::decode(event_type, schema_version, payload)?),
            "reservation" => AnyEvent::Reservation(ReservationEvent::decode(event_type, schema_version, payload)?),
            "tenant" => AnyEvent::Tenant(TenantEvent::decode(event_type, schema_version, payload)?),
            "identity" => AnyEvent::Identity(IdentityEvent::decode(event_type, schema_version, payload)?),
            "grant" => AnyEvent::Grant(GrantEvent::decode(event_type, schema_version, payload)?),
            "limit" => AnyEvent::Limit(LimitEvent::decode(event_type, schema_version, payload)?),
            "image" => AnyEvent::Image(ImageEvent::decode(event_type, schema_version, payload)?),
            "profile" => AnyEvent::Profile(ProfileEvent::decode(event_type, schema_version, payload)?),
            "workflow" => AnyEvent::Workflow(WorkflowEvent::decode(event_type, schema_version, payload)?),
            "flavor" => AnyEvent::Flavor(FlavorEvent::decode(event_type, schema_version, payload)?),
            "instance" => AnyEvent::Instance(InstanceEvent::decode(event_type, schema_version, payload)?),
            "webhook" => AnyEvent::Webhook(WebhookEvent::decode(event_type, schema_version, payload)?),
            "provider_account" => {
                AnyEvent::ProviderAccount(ProviderAccountEvent::decode(event_type, schema_version, payload)?)
            }
            _ => return Ok(None),
        }))
    }

    pub fn event_type(&self) -> &'static str {
        match self {
            AnyEvent::Site(e) => e.event_type(),
            AnyEvent::Project(e) => e.event_type(),
            AnyEvent::Pool(e) => e.event_type(),
            AnyEvent::Node(e) => e.event_type(),
            AnyEvent::Reservation(e) => e.event_type(),
            AnyEvent::Tenant(e) => e.event_type(),
            AnyEvent::Identity(e) => e.event_type(),
            AnyEvent::Grant(e) => e.event_type(),
            AnyEvent::Limit(e) => e.event_type(),
            AnyEvent::Image(e) => e.event_type(),
            AnyEvent::Profile(e) => e.event_type(),
            AnyEvent::Workflow(e) => e.event_type(),
            AnyEvent::ProviderAccount(e) => e.event_type(),
            AnyEvent::Flavor(e) => e.event_type(),
            AnyEvent::Instance(e) => e.event_type(),
            AnyEvent::Webhook(e) => e.event_type(),
        }
    }

    pub fn schema_version(&self) -> i16 {
        match self {
            AnyEvent::Site(e) => e.schema_version(),
            AnyEvent::Project(e) => e.schema_version(),
            AnyEvent::Pool(e) => e.schema_version(),
            AnyEvent::Node(e) => e.schema_version(),
            AnyEvent::Reservation(e) => e.schema_version(),
            AnyEvent::Tenant(e) => e.schema_version(),
            AnyEvent::Identity(e) => e.schema_version(),
            AnyEvent::Grant(e) => e.schema_version(),
            AnyEvent::Limit(e) => e.schema_version(),
            AnyEvent::Image(e) => e.schema_version(),
            AnyEvent::Profile(e) => e.schema_version(),
            AnyEvent::Workflow(e) => e.schema_version(),
            AnyEvent::ProviderAccount(e) => e.schema_version(),
            AnyEvent::Flavor(e) => e.schema_version(),
            AnyEvent::Instance(e) => e.schema_version(),
            AnyEvent::Webhook(e) => e.schema_version(),
        }
    }

    pub fn encode_payload(&self) -> Result<Vec<u8>, EncodeError> {
        match self {
            AnyEvent::Site(e) => e.encode_payload(),
            AnyEvent::Project(e) => e.encode_payload(),
            AnyEvent::Pool(e) => e.encode_payload(),
            AnyEvent::Node(e) => e.encode_payload(),
            AnyEvent::Reservation(e) => e.encode_payload(),
            AnyEvent::Tenant(e) => e.encode_payload(),
            AnyEvent::Identity(e) => e.encode_payload(),
            AnyEvent::Grant(e) => e.encode_payload(),
            AnyEvent::Limit(e) => e.encode_payload(),
            AnyEvent::Image(e) => e.encode_payload(),
            AnyEvent::Profile(e) => e.encode_payload(),
            AnyEvent::Workflow(e) => e.encode_payload(),
            AnyEvent::ProviderAccount(e) => e.encode_payload(),
            AnyEvent::Flavor(e) => e.encode_payload(),
            AnyEvent::Instance(e) => e.encode_payload(),
            AnyEvent::Webhook(e) => e.encode_payload(),
        }
    }
}

macro_rules! into_any {
    ($($family:ty => $variant:ident),+) => {
        $(impl From<$family> for AnyEvent {
            fn from(event: $family) -> Self {
                AnyEvent::$variant(event)
            }
        })+
    };
}

into_any!(SiteEvent => Site, ProjectEvent => Project, PoolEvent => Pool, NodeEvent => Node, ReservationEvent => Reservation,
    TenantEvent => Tenant, IdentityEvent => Identity, GrantEvent => Grant, LimitEvent => Limit, ImageEvent => Image, ProfileEvent => Profile, WorkflowEvent => Workflow,
    ProviderAccountEvent => ProviderAccount, FlavorEvent => Flavor, InstanceEvent => Instance, WebhookEvent => Webhook);

impl AnyEvent {
    /// Every event type this build knows, family by family.
    pub fn event_types() -> Vec<&'static str> {
        [
            SiteEvent::event_types(),
            ProjectEvent::event_types(),
            PoolEvent::event_types(),
            NodeEvent::event_types(),
            ReservationEvent::event_types(),
            TenantEvent::event_types(),
            IdentityEvent::event_types(),
            GrantEvent::event_types(),
            LimitEvent::event_types(),
            ImageEvent::event_types(),
            ProfileEvent::event_types(),
            WorkflowEvent::event_types(),
            ProviderAccountEvent::event_types(),
            FlavorEvent::event_types(),
            InstanceEvent::event_types(),
            WebhookEvent::event_types(),
        ]
        .concat()
    }
}

/// Reads a filter of event types, as the event stream and `events tail` take it: a comma-separated list of
/// exact types (`reservation.placed`) or whole families (`reservation.*`), each one this build knows, so that
/// a misspelled type is refused instead of silently matching nothing. Empty entries are skipped; an empty
/// list matches every type.
pub fn parse_type_filter(text: &str) -> Result<Vec<String>, String> {
    let known = AnyEvent::event_types();
    let mut types = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        if entry.len() > 100 {
            return Err(format!("{:?}...: longer than 100 characters", &entry[..entry.floor_char_boundary(20)]));
        }
        match entry.strip_suffix(".*") {
            Some(family)
                if !family.contains('*')
                    && !known.iter().any(|t| t.split_once('.').is_some_and(|(f, _)| f == family)) =>
            {
                return Err(format!("{entry:?}: no event type of family {family:?}"));
            }
            Some(family) if !family.contains('*') => {}
            _ if entry.contains('*') => return Err(format!("{entry:?}: a wildcard is a whole family, `name.*`")),
            _ if !known.contains(&entry) => return Err(format!("{entry:?}: not an event type")),
            _ => {}
        }
        types.push(entry.to_owned());
    }
    Ok(types)
}

/// Whether `event_type` matches one entry of a type filter (an exact type or `family.*`).
pub fn type_matches(filter: &str, event_type: &str) -> bool {
    match filter.strip_suffix(".*") {
        Some(family) => event_type.split_once('.').is_some_and(|(f, _)| f == family),
        None => filter == event_type,
    }
}

#[cfg(test)]
mod filters {
    use super::{parse_type_filter, type_matches};

    #[test]
    fn a_type_filter_takes_known_types_and_families_and_names_what_it_refuses() {
        assert_eq!(parse_type_filter(" reservation.placed, pool.*,,").expect("ok"), ["reservation.placed", "pool.*"]);
        assert_eq!(parse_type_filter("").expect("empty"), Vec::<String>::new());
        for (bad, says) in [
            ("reservation.plaecd", "not an event type"),
            ("nothing.*", "no event type of family"),
            ("reserv*", "a wildcard is a whole family"),
            ("*.*", "a wildcard is a whole family"),
            ("*", "a wildcard is a whole family"),
        ] {
            let err = parse_type_filter(bad).expect_err(bad);
            assert!(err.contains(says), "{bad}: {err}");
        }
        assert!(parse_type_filter(&"x".repeat(200)).expect_err("long").contains("longer than 100"));
        assert!(type_matches("reservation.*", "reservation.placed"));
        assert!(!type_matches("reservation.*", "reservations.placed"));
        assert!(type_matches("pool.created", "pool.created"));
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::AnyEvent;

    fn every_type() -> Vec<&'static str> {
        AnyEvent::event_types()
    }

    proptest! {
        /// Payload bytes of any shape, under any event type and schema version, decode or are refused: a
        /// corrupt or hostile payload never panics a reader.
        #[test]
        fn any_payload_decodes_or_is_refused(index in 0usize..1000, version in -2i16..4, payload in proptest::collection::vec(any::<u8>(), 0..256)) {
            let types = every_type();
            let event_type = types[index % types.len()];
            let _ = AnyEvent::decode(event_type, version, &payload);
        }

        /// MessagePack maps with the right field names but values of any type are refused cleanly too.
        #[test]
        fn well_formed_maps_with_wrong_values_are_refused_cleanly(index in 0usize..1000, value in any::<i64>(), text in "\\PC{0,20}") {
            let types = every_type();
            let event_type = types[index % types.len()];
            let map = rmpv::Value::Map(vec![
                (rmpv::Value::from("nodeId"), rmpv::Value::from(text.as_str())),
                (rmpv::Value::from("atMs"), rmpv::Value::from(value)),
                (rmpv::Value::from("poolId"), rmpv::Value::from(value)),
            ]);
            let mut bytes = Vec::new();
            rmpv::encode::write_value(&mut bytes, &map).expect("encode");
            let _ = AnyEvent::decode(event_type, 1, &bytes);
        }
    }
}
