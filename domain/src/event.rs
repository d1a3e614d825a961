//! Event payload encoding (MessagePack maps), event metadata, and upcasting of old payload schema versions.
//!
//! A stored event is `(event_type, schema_version, payload, metadata)`. Payloads are written with
//! `rmp_serde::to_vec_named`, so fields travel by name and an added optional field needs no new version.
//! When a payload's shape changes incompatibly, its type gets a new schema version and an [`Upcasters`]
//! step that turns the old shape into the new one on read; released types and versions never change.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Why a value could not be encoded as MessagePack.
#[derive(Debug, thiserror::Error)]
#[error("cannot encode {what} as MessagePack: {source}")]
pub struct EncodeError {
    what: &'static str,
    #[source]
    source: rmp_serde::encode::Error,
}

/// Why stored bytes could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("cannot decode {event_type} v{schema_version}: {reason}")]
    Payload { event_type: String, schema_version: i16, reason: String },
    #[error("no upcaster brings {event_type} from schema version {from} to {to}")]
    NoUpcaster { event_type: String, from: i16, to: i16 },
    #[error("{event_type} has schema version {found}, newer than this build's {known}")]
    FromTheFuture { event_type: String, found: i16, known: i16 },
    #[error("cannot decode event metadata: {0}")]
    Metadata(String),
    #[error("{event_type} is not an event type of this aggregate")]
    UnknownType { event_type: String },
}

/// Encodes a value as a MessagePack map keyed by field name.
pub fn encode<T: Serialize + ?Sized>(what: &'static str, value: &T) -> Result<Vec<u8>, EncodeError> {
    rmp_serde::to_vec_named(value).map_err(|source| EncodeError { what, source })
}

/// Decodes a MessagePack payload written by [`encode`] (or by an upcaster).
pub fn decode_payload<T: DeserializeOwned>(
    event_type: &str,
    schema_version: i16,
    payload: &[u8],
) -> Result<T, DecodeError> {
    rmp_serde::from_slice(payload).map_err(|err| DecodeError::Payload {
        event_type: event_type.to_owned(),
        schema_version,
        reason: err.to_string(),
    })
}

/// A family of events (one aggregate's), each variant a payload type with its own `event_type` name.
/// Implemented by [`crate::domain_events!`].
pub trait DomainEvent: Sized {
    /// `<aggregate>.<past tense>` of this value.
    fn event_type(&self) -> &'static str;
    /// The schema version this build writes for this value's type.
    fn schema_version(&self) -> i16;
    /// The variant's payload as a MessagePack map (the event type travels beside it, not inside).
    fn encode_payload(&self) -> Result<Vec<u8>, EncodeError>;
    /// Reads a stored payload (already upcast to the current schema version).
    fn decode(event_type: &str, schema_version: i16, payload: &[u8]) -> Result<Self, DecodeError>;
    /// Every event type of the family.
    fn event_types() -> &'static [&'static str];
}

/// Declares an enum of events, one variant per payload type, and implements [`DomainEvent`] for it. A variant
/// whose payload changed shape names its schema version after `@` (1 when absent); decoding brings older
/// versions up to date through [`crate::upcast::registry`]:
///
/// ```text
/// domain_events! {
///     pub enum SiteEvent {
///         Created(SiteCreated) = "site.created" @ 2,
///     }
/// }
/// ```
#[macro_export]
macro_rules! domain_events {
    (@version) => { 1 };
    (@version $version:literal) => { $version };
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident($payload:ty) = $type_name:literal $(@ $version:literal)? ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        pub enum $name {
            $( $(#[$vmeta])* $variant($payload) ),+
        }

        impl $crate::event::DomainEvent for $name {
            fn event_type(&self) -> &'static str {
                match self {
                    $( Self::$variant(_) => $type_name ),+
                }
            }

            fn schema_version(&self) -> i16 {
                match self {
                    $( Self::$variant(_) => $crate::domain_events!(@version $($version)?) ),+
                }
            }

            fn encode_payload(&self) -> Result<Vec<u8>, $crate::event::EncodeError> {
                match self {
                    $( Self::$variant(body) => $crate::event::encode("event payload", body) ),+
                }
            }

            fn decode(
                event_type: &str,
                schema_version: i16,
                payload: &[u8],
            ) -> Result<Self, $crate::event::DecodeError> {
                // Old schema versions are brought up to date first.
                let (schema_version, payload) =
                    $crate::upcast::registry().upcast(event_type, schema_version, payload)?;
                match event_type {
                    $( $type_name => Ok(Self::$variant($crate::event::decode_payload(event_type, schema_version, &payload)?)), )+
                    other => Err($crate::event::DecodeError::UnknownType { event_type: other.to_owned() }),
                }
            }

            fn event_types() -> &'static [&'static str] {
                &[ $( $type_name ),+ ]
            }
        }
    };
}

/// The decision context of the caller whose command appended an event. Later issues fill it from the
/// authorizer; asynchronous work reads it from the log instead of keeping the caller's token.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionContext {
    pub identity: String,
    pub session_kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    pub tenant_id: String,
}

/// What travels beside every payload: who, why, and in answer to what.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventMetadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<AdmissionContext>,
    /// The id of the event or command that caused this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub causation_id: Option<String>,
    /// Shared by every event of one user-visible operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

impl EventMetadata {
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        encode("event metadata", self)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        rmp_serde::from_slice(bytes).map_err(|err| DecodeError::Metadata(err.to_string()))
    }
}

/// One step that rewrites a payload of `schema_version = n` into the shape of `n + 1`.
pub type UpcastStep = fn(rmpv::Value) -> Result<rmpv::Value, String>;

/// The upcasting hook: for each event type, the steps from each old schema version to the next, and the
/// version this build writes.
#[derive(Default, Clone)]
pub struct Upcasters {
    steps: HashMap<(Cow<'static, str>, i16), UpcastStep>,
    current: HashMap<Cow<'static, str>, i16>,
}

impl fmt::Debug for Upcasters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upcasters").field("current", &self.current).finish_non_exhaustive()
    }
}

impl Upcasters {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the step that turns `event_type` at `from_version` into `from_version + 1`.
    pub fn register(mut self, event_type: &'static str, from_version: i16, step: UpcastStep) -> Self {
        self.steps.insert((Cow::Borrowed(event_type), from_version), step);
        let current = self.current.entry(Cow::Borrowed(event_type)).or_insert(from_version + 1);
        *current = (*current).max(from_version + 1);
        self
    }

    /// The schema version this build writes for `event_type`, when it has upcasters for it.
    pub fn current_version(&self, event_type: &str) -> Option<i16> {
        self.current.get(event_type).copied()
    }

    /// Brings a stored payload to the version this build writes. Payloads already current (or of types
    /// without upcasters) come back borrowed and untouched.
    pub fn upcast<'a>(
        &self,
        event_type: &str,
        schema_version: i16,
        payload: &'a [u8],
    ) -> Result<(i16, Cow<'a, [u8]>), DecodeError> {
        let Some(target) = self.current_version(event_type) else {
            return Ok((schema_version, Cow::Borrowed(payload)));
        };
        if schema_version > target {
            return Err(DecodeError::FromTheFuture {
                event_type: event_type.to_owned(),
                found: schema_version,
                known: target,
            });
        }
        if schema_version == target {
            return Ok((schema_version, Cow::Borrowed(payload)));
        }
        let payload_error = |version: i16, reason: String| DecodeError::Payload {
            event_type: event_type.to_owned(),
            schema_version: version,
            reason,
        };
        let mut value: rmpv::Value =
            rmp_serde::from_slice(payload).map_err(|err| payload_error(schema_version, err.to_string()))?;
        let mut version = schema_version;
        while version < target {
            let step = self.steps.get(&(Cow::Owned(event_type.to_owned()), version)).ok_or_else(|| {
                DecodeError::NoUpcaster { event_type: event_type.to_owned(), from: version, to: target }
            })?;
            value = step(value).map_err(|reason| payload_error(version, reason))?;
            version += 1;
        }
        let bytes = rmp_serde::to_vec_named(&value).map_err(|err| payload_error(version, err.to_string()))?;
        Ok((version, Cow::Owned(bytes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct PlacedV1 {
        gpus: u32,
    }

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct PlacedV2 {
        devices: Vec<String>,
        count: u32,
    }

    fn v1_to_v2(value: rmpv::Value) -> Result<rmpv::Value, String> {
        let old: PlacedV1 = rmpv::ext::from_value(value).map_err(|e| e.to_string())?;
        let new = PlacedV2 { devices: vec![], count: old.gpus };
        rmpv::ext::to_value(new).map_err(|e| e.to_string())
    }

    #[test]
    fn payloads_are_maps_keyed_by_field_name() {
        let bytes = encode("test", &PlacedV1 { gpus: 8 }).expect("encode");
        let value: rmpv::Value = rmp_serde::from_slice(&bytes).expect("value");
        let map = value.as_map().expect("a map, not an array");
        assert_eq!(map[0].0.as_str(), Some("gpus"));
    }

    #[test]
    fn an_old_payload_is_upcast_step_by_step_to_the_current_version() {
        let upcasters = Upcasters::new().register("reservation.placed", 1, v1_to_v2);
        let old = encode("test", &PlacedV1 { gpus: 4 }).expect("encode");
        let (version, bytes) = upcasters.upcast("reservation.placed", 1, &old).expect("upcast");
        assert_eq!(version, 2);
        let new: PlacedV2 = decode_payload("reservation.placed", version, &bytes).expect("decode");
        assert_eq!(new, PlacedV2 { devices: vec![], count: 4 });
    }

    #[test]
    fn a_current_payload_is_left_untouched() {
        let upcasters = Upcasters::new().register("reservation.placed", 1, v1_to_v2);
        let current = encode("test", &PlacedV2 { devices: vec!["a".into()], count: 1 }).expect("encode");
        let (version, bytes) = upcasters.upcast("reservation.placed", 2, &current).expect("upcast");
        assert_eq!(version, 2);
        assert!(matches!(bytes, Cow::Borrowed(_)));
    }

    #[test]
    fn a_payload_newer_than_this_build_is_refused() {
        let upcasters = Upcasters::new().register("reservation.placed", 1, v1_to_v2);
        let err = upcasters.upcast("reservation.placed", 3, &[0x80]).expect_err("future version");
        assert!(matches!(err, DecodeError::FromTheFuture { found: 3, known: 2, .. }), "{err}");
    }

    #[test]
    fn metadata_round_trips_and_tolerates_missing_fields() {
        let meta = EventMetadata { request_id: Some("req_1".into()), ..Default::default() };
        let bytes = meta.encode().expect("encode");
        assert_eq!(EventMetadata::decode(&bytes).expect("decode"), meta);
        let empty_map = [0x80u8];
        assert_eq!(EventMetadata::decode(&empty_map).expect("decode"), EventMetadata::default());
    }
}
