//! Stored event payloads (`bc_domain::stream::AnyEvent::decode`): payload bytes of any shape, under any event
//! type and schema version, decode or are refused without a panic; whatever decodes encodes again
//! (`encode_payload`), and those bytes decode to the same event and encode to the same bytes. The payload bytes
//! are also read as event metadata (`EventMetadata::decode`), which must round-trip the same way.
//!
//! Input: byte 0 picks the event type (every type of every family, then a type of a known family that does
//! not exist, then one of no family), bytes 1-2 are the schema version (little-endian `i16`), the rest is the
//! payload.

#![no_main]

use std::sync::OnceLock;

use bc_domain::event::{DomainEvent as _, EventMetadata};
use bc_domain::stream::AnyEvent;
use libfuzzer_sys::fuzz_target;

fn every_type() -> &'static [&'static str] {
    static TYPES: OnceLock<Vec<&'static str>> = OnceLock::new();
    TYPES.get_or_init(|| {
        let mut types = [
            bc_domain::site::SiteEvent::event_types(),
            bc_domain::site::ProjectEvent::event_types(),
            bc_domain::pool::PoolEvent::event_types(),
            bc_domain::node::NodeEvent::event_types(),
            bc_domain::reservation::ReservationEvent::event_types(),
        ]
        .concat();
        types.extend(["node.no-such-event", "nosuchfamily.created"]);
        types
    })
}

fuzz_target!(|data: &[u8]| {
    let [index, v0, v1, payload @ ..] = data else { return };
    let types = every_type();
    let event_type = types[usize::from(*index) % types.len()];
    let version = i16::from_le_bytes([*v0, *v1]);

    if let Ok(Some(event)) = AnyEvent::decode(event_type, version, payload) {
        assert_eq!(event.event_type(), event_type, "decoded as another type");
        let bytes = event.encode_payload().expect("a decoded event encodes");
        let again = match AnyEvent::decode(event_type, event.schema_version(), &bytes) {
            Ok(Some(again)) => again,
            other => {
                panic!("{event_type} v{} re-encoded as {bytes:?} does not decode: {other:?}", event.schema_version())
            }
        };
        assert_eq!(again.encode_payload().expect("encodes"), bytes, "{event_type}: encoding is not stable");
        // Values holding a NaN float are not equal to themselves; their Debug forms still are.
        assert!(again == event || format!("{again:?}") == format!("{event:?}"), "{event:?} came back as {again:?}");
    }

    if let Ok(metadata) = EventMetadata::decode(payload) {
        let bytes = metadata.encode().expect("decoded metadata encodes");
        assert_eq!(EventMetadata::decode(&bytes).ok(), Some(metadata), "metadata round trip");
    }
});
