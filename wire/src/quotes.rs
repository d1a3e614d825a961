//! Quotes on the wire: the request to quote (`POST /v1/pools/{id}/quotes`) and the quote, whose `reserve` body
//! books exactly the quoted devices through `POST /v1/reservations`.

use bc_domain::Rejection;
use bc_domain::id::{PoolId, ProjectId};
use bc_domain::reservation::{Binding, ReservationRequest};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::reservations::{DevicesDto, ReserveBody};

/// The body of `POST /v1/pools/{id}/quotes`: what a reservation would ask for (held devices), and from when.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QuoteBody {
    pub devices: DevicesDto,
    /// Quote exactly this start (epoch milliseconds, on a whole second, from now to 366 days ahead); without it,
    /// the earliest start that fits.
    #[schema(multiple_of = 1000, minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub start: Option<i64>,
    /// The earliest start to consider (epoch milliseconds); now when left out. Not with `start`.
    #[schema(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub not_before: Option<i64>,
    /// The window's length in whole seconds, 1 to 31622400 (366 days).
    #[schema(minimum = 1, maximum = 31_622_400)]
    pub duration: u64,
    pub lease_seconds: Option<u64>,
    pub project_id: Option<String>,
}

impl QuoteBody {
    /// The domain's request in `pool_id` and the earliest start asked for, ids parsed (naming the field when one
    /// is not).
    pub fn request(self, pool_id: &PoolId) -> Result<(ReservationRequest, Option<i64>), Rejection> {
        let project_id = self
            .project_id
            .as_deref()
            .map(|p| p.parse::<ProjectId>().map_err(|err| Rejection::invalid("projectId", err.to_string())))
            .transpose()?;
        let request = ReservationRequest {
            pool_id: pool_id.clone(),
            devices: self.devices.into(),
            start_ms: self.start,
            duration_s: self.duration,
            binding: Binding::Hold,
            lease_seconds: self.lease_seconds,
            project_id,
            deadline_ms: None,
            wait: false,
            profile_id: None,
            resources: Default::default(),
        };
        Ok((request, self.not_before))
    }
}

/// One node's share of a quote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotedAllocationDto {
    pub node_id: String,
    /// Its atoms, in device id order.
    pub devices: Vec<String>,
}

/// A quote: the exact devices and window the request gets if booked before `expiresAt`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuoteDto {
    pub pool_id: String,
    /// The window's start (epoch milliseconds). When `reserve.start` is absent the window starts when booked (now,
    /// at the quote) and lasts `duration`; otherwise it is exactly `start` to `end`.
    pub start: i64,
    pub end: i64,
    pub allocations: Vec<QuotedAllocationDto>,
    /// The body that books it: send it unchanged to `POST /v1/reservations` (with an `Idempotency-Key`). It carries
    /// the token as `quote`.
    pub reserve: ReserveBody,
    /// The signed token (base64url text), bound to the caller, this request, the window and the devices.
    pub quote: String,
    /// Until when it can be booked (epoch milliseconds).
    pub expires_at: i64,
}

#[cfg(feature = "server")]
impl From<&bc_commands::quotes::Quote> for QuoteDto {
    fn from(q: &bc_commands::quotes::Quote) -> Self {
        QuoteDto {
            pool_id: q.pool_id.to_string(),
            start: q.start_ms,
            end: q.end_ms,
            allocations: q
                .allocations
                .iter()
                .map(|a| QuotedAllocationDto {
                    node_id: a.node_id.to_string(),
                    devices: a.devices.iter().map(ToString::to_string).collect(),
                })
                .collect(),
            reserve: ReserveBody::of(&q.request, Some(q.token.clone())),
            quote: q.token.clone(),
            expires_at: q.expires_at_ms,
        }
    }
}
