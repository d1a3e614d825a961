//! `GET /v1/ledger`: the GPU-hour ledger, per pool, tenant and UTC hour, as JSON or (with `?format=csv` or
//! `Accept: text/csv`) as CSV with a header line.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bc_commands::door::Subject;
use bc_commands::ledger::LedgerRange;
use bc_domain::id::PoolId;
use serde::Deserialize;

use super::consistency::MinPosition;
use super::error::{CommonErrors, ErrorBody};
use super::request::{Authed, QueryParams, path_id};
use super::{ApiError, AppState};
use crate::wire::ledger::LedgerDto;

/// The forms the ledger is answered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LedgerFormat {
    Json,
    Csv,
}

/// The query of `GET /v1/ledger`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LedgerParams {
    /// Only this pool's rows.
    pub pool: Option<String>,
    /// The first hour, epoch milliseconds (rounded down to a whole UTC hour); by default 24 hours before `to`.
    #[param(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub from: Option<i64>,
    /// The end, epoch milliseconds (rounded up to a whole UTC hour; at most 31 days after `from`); by default 24
    /// hours after `from`, or the end of the current hour.
    #[param(minimum = 0, maximum = 253_402_300_799_999_i64)]
    pub to: Option<i64>,
    /// `json` (the default) or `csv` (the same as `Accept: text/csv`).
    #[param(inline)]
    pub format: Option<LedgerFormat>,
    /// A consistency token: answer once the read models have passed this position (as `X-Min-Position`).
    #[allow(dead_code)]
    pub after: Option<String>,
}

/// `GET /v1/ledger`.
#[utoipa::path(
    get,
    path = "/v1/ledger",
    tag = "ledger",
    summary = "The GPU-hour ledger: per pool and UTC hour the capacity, booked and free atom-hours; per tenant the booked, bound and idle ones (every tenant's in the caller's own pools, its own elsewhere)",
    params(LedgerParams, ("X-Min-Position" = Option<String>, Header, description = "A consistency token, as ?after=")),
    responses(
        CommonErrors,
        (status = 200, description = "The hours, as JSON or CSV", content(
            (LedgerDto = "application/json"),
            (String = "text/csv"),
        )),
        (status = 503, description = "NOT_YET_CONSISTENT", body = ErrorBody),
    ),
    security(("bearer" = [])),
)]
pub async fn get_ledger(
    State(state): State<AppState>,
    who: Authed,
    MinPosition(after): MinPosition,
    headers: HeaderMap,
    QueryParams(params): QueryParams<LedgerParams>,
) -> Result<Response, ApiError> {
    let caller = state.app.authorize(&who.0, "ledger.get", Subject::OwnTenant).await?;
    let pool_id = params.pool.as_deref().map(|pool| path_id::<PoolId>("pool", pool)).transpose()?;
    let range = LedgerRange { from_ms: params.from, to_ms: params.to, pool_id };
    let ledger = LedgerDto::from(&state.app.ledger(&caller, &range, after).await?);
    let csv = match params.format {
        Some(format) => format == LedgerFormat::Csv,
        None => headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("text/csv")),
    };
    if !csv {
        return Ok(Json(ledger).into_response());
    }
    let mut response = ledger.to_csv().into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/csv; charset=utf-8"));
    Ok(response)
}
