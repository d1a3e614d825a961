//! What operators and probes read: the health check, the read models' status, the event stream's events, the
//! OpenAPI document's own outline.

#[cfg(feature = "server")]
use bc_eventstore::events::RecordedEvent;
#[cfg(feature = "server")]
use bc_projections::status::VersionStatus;
use serde::{Deserialize, Serialize};
use serde_json::Value;
#[cfg(feature = "server")]
use serde_json::json;
use utoipa::ToSchema;

/// `GET /v1/healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthDto {
    /// `ok`.
    pub status: String,
    /// `reachable`.
    pub database: String,
}

/// One read model version's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectionStatusDto {
    pub name: String,
    pub version: u32,
    /// `building`, `live`, `retired` or `not started`.
    pub state: String,
    /// Whether reads use this version.
    pub active: bool,
    pub position: String,
    pub events_applied: i64,
    /// Events in the log after its position.
    pub lag_events: i64,
    /// How long the oldest event it has not passed has been in the log (`null`: unknown).
    #[schema(required = true)]
    pub lag_seconds: Option<f64>,
}

#[cfg(feature = "server")]
impl From<&VersionStatus> for ProjectionStatusDto {
    fn from(v: &VersionStatus) -> Self {
        ProjectionStatusDto {
            name: v.name.clone(),
            version: v.version,
            state: v.state.clone(),
            active: v.active,
            position: v.position.to_string(),
            events_applied: v.events_applied,
            lag_events: v.lag_events,
            lag_seconds: v.lag_seconds.is_finite().then_some(v.lag_seconds),
        }
    }
}

/// `GET /v1/projections`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectionsDto {
    pub items: Vec<ProjectionStatusDto>,
}

/// An event of the log, as the event stream (`data:`) and `events tail` show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventDto {
    /// `<epoch>-<txid>-<seq>`: also the SSE `id:`, to resume after.
    pub position: String,
    pub stream_id: String,
    pub stream_version: u32,
    /// `<aggregate>.<past tense>`, such as `reservation.placed`.
    pub event_type: String,
    pub schema_version: i16,
    pub tenant_id: Option<String>,
    pub recorded_at: i64,
    /// The event's fields, as recorded at its schema version (a JSON object).
    #[schema(value_type = Object)]
    pub payload: Value,
    /// Its admission context (identity, session kind, agent, delegation, request id, tenant), causation and
    /// correlation (a JSON object).
    #[schema(value_type = Object)]
    pub metadata: Value,
}

#[cfg(feature = "server")]
impl From<&RecordedEvent> for EventDto {
    fn from(event: &RecordedEvent) -> Self {
        let decode = |bytes: &[u8]| {
            rmp_serde::from_slice::<Value>(bytes).unwrap_or_else(|err| json!({ "undecodable": err.to_string() }))
        };
        EventDto {
            position: event.position.to_string(),
            stream_id: event.stream_id.clone(),
            stream_version: event.stream_version,
            event_type: event.event_type.clone(),
            schema_version: event.schema_version,
            tenant_id: event.tenant_id.clone(),
            recorded_at: event.recorded_at_ms,
            payload: decode(&event.payload),
            metadata: decode(&event.metadata),
        }
    }
}

/// The OpenAPI document's outline (`GET /v1/openapi.json`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct OpenApiDto {
    /// `3.1.0`.
    pub openapi: String,
    #[schema(value_type = Object)]
    pub info: Value,
    #[schema(value_type = Object)]
    pub paths: Value,
    #[schema(value_type = Object)]
    pub components: Value,
}
