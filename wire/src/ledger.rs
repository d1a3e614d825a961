//! The GPU-hour ledger (`GET /v1/ledger`): per pool and UTC hour the capacity, what every tenant booked and what
//! is free; per pool, tenant and hour what it booked, the part bound and the part idle. Figures are atom-hours
//! (GPU-hours where the pool books whole GPUs): atoms times the milliseconds they overlap the hour, over
//! 3,600,000. The CSV form ([`LedgerDto::to_csv`]) holds the same rows and numbers.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[cfg(feature = "server")]
use bc_commands::ledger::LedgerView;

/// `GET /v1/ledger`: the hours `[from, to)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LedgerDto {
    /// The first hour's start, epoch milliseconds.
    pub from: i64,
    /// The end of the last hour, epoch milliseconds (exclusive).
    pub to: i64,
    /// Per pool and hour: the pools the caller owns or is offered, in pool then hour order. An hour in which the
    /// pool had no atoms and nothing booked is left out.
    pub pools: Vec<LedgerPoolHourDto>,
    /// Per pool, tenant and hour: every tenant's in the pools the caller owns, its own elsewhere; in pool, hour
    /// then tenant order. An hour in which the tenant booked nothing is left out.
    pub tenants: Vec<LedgerTenantHourDto>,
}

/// One pool's hour. `booked + free = capacity`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LedgerPoolHourDto {
    pub pool_id: String,
    /// The hour's start, epoch milliseconds (a whole UTC hour).
    pub hour: i64,
    /// Atom-hours the pool's nodes had in the hour, for the part of it each belonged to the pool.
    pub capacity: f64,
    /// Atom-hours every tenant's reservations booked in the hour.
    pub booked: f64,
    /// Capacity no reservation booked.
    pub free: f64,
}

/// One tenant's hour in one pool. `bound + idle = booked`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LedgerTenantHourDto {
    pub pool_id: String,
    pub tenant_id: String,
    /// The hour's start, epoch milliseconds (a whole UTC hour).
    pub hour: i64,
    /// Atom-hours its reservations booked: from their windows, ended early by a cancel, release, expiry or
    /// failure, lengthened by extensions.
    pub booked: f64,
    /// The part of `booked` its reservations were active (bound to their workload).
    pub bound: f64,
    /// Booked, not bound: placed and waiting for the window, binding, or releasing.
    pub idle: f64,
    /// The mean GPU utilization (0 to 100) the agents sampled in the hour on the GPUs of its bound reservations;
    /// `null` where no agent sampled one.
    #[schema(required = true)]
    pub utilization: Option<f64>,
}

/// The CSV form's header line.
pub const CSV_HEADER: &str = "pool_id,tenant_id,hour,capacity,booked,bound,idle,free,utilization";

impl LedgerDto {
    /// The ledger as CSV: [`CSV_HEADER`], then per pool and hour its row (no tenant; capacity, booked and free)
    /// followed by its tenants' rows (booked, bound, idle and utilization). Hours in RFC 3339 (UTC), figures in
    /// atom-hours as in the JSON form; an empty cell is a figure the row does not carry.
    pub fn to_csv(&self) -> String {
        // (pool, hour, tenant): a pool's row sorts before its tenants' (an empty tenant first).
        let mut rows: Vec<((&str, i64, &str), String)> = Vec::with_capacity(self.pools.len() + self.tenants.len());
        for p in &self.pools {
            let line = format!("{},,{},{},{},,,{},", cell(&p.pool_id), rfc3339(p.hour), p.capacity, p.booked, p.free);
            rows.push(((&p.pool_id, p.hour, ""), line));
        }
        for t in &self.tenants {
            let utilization = t.utilization.map(|u| u.to_string()).unwrap_or_default();
            let line = format!(
                "{},{},{},,{},{},{},,{utilization}",
                cell(&t.pool_id),
                cell(&t.tenant_id),
                rfc3339(t.hour),
                t.booked,
                t.bound,
                t.idle
            );
            rows.push(((&t.pool_id, t.hour, &t.tenant_id), line));
        }
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out = String::with_capacity(64 * (rows.len() + 1));
        out.push_str(CSV_HEADER);
        out.push('\n');
        for (_, line) in rows {
            out.push_str(&line);
            out.push('\n');
        }
        out
    }
}

/// A text cell: quoted (RFC 4180) only when it holds a comma, a quote or a line break. Ids hold none, but a cell
/// must never split a row.
fn cell(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) { format!("\"{}\"", text.replace('"', "\"\"")) } else { text.to_owned() }
}

/// Epoch milliseconds as `YYYY-MM-DDTHH:MM:SSZ` (UTC; the proleptic Gregorian calendar, days from the epoch turned
/// into a date the way Howard Hinnant's `civil_from_days` does).
fn rfc3339(ms: i64) -> String {
    let seconds = ms.div_euclid(1000);
    let (days, rest) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rest / 3600, rest % 3600 / 60, rest % 60)
}

/// Atom-milliseconds as atom-hours.
#[cfg(feature = "server")]
fn hours(atom_ms: i64) -> f64 {
    atom_ms as f64 / 3_600_000.0
}

#[cfg(feature = "server")]
impl From<&LedgerView> for LedgerDto {
    fn from(view: &LedgerView) -> Self {
        LedgerDto {
            from: view.from_ms,
            to: view.to_ms,
            pools: view
                .hours
                .pools
                .iter()
                .map(|p| LedgerPoolHourDto {
                    pool_id: p.pool_id.clone(),
                    hour: p.hour_ms,
                    capacity: hours(p.capacity),
                    booked: hours(p.booked),
                    free: hours(p.free()),
                })
                .collect(),
            tenants: view
                .hours
                .tenants
                .iter()
                .map(|t| LedgerTenantHourDto {
                    pool_id: t.pool_id.clone(),
                    tenant_id: t.tenant_id.clone(),
                    hour: t.hour_ms,
                    booked: hours(t.booked),
                    bound: hours(t.bound),
                    idle: hours(t.idle()),
                    utilization: t.utilization,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hours_are_written_as_utc_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_893_456_000_000), "2030-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400_000 + 3_723_000), "2000-02-29T01:02:03Z");
        assert_eq!(rfc3339(-1000), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn the_csv_has_its_header_and_a_pools_row_before_its_tenants_rows() {
        let dto = LedgerDto {
            from: 0,
            to: 3_600_000,
            pools: vec![LedgerPoolHourDto { pool_id: "p".into(), hour: 0, capacity: 2.0, booked: 1.5, free: 0.5 }],
            tenants: vec![LedgerTenantHourDto {
                pool_id: "p".into(),
                tenant_id: "a,b".into(),
                hour: 0,
                booked: 1.5,
                bound: 1.0,
                idle: 0.5,
                utilization: None,
            }],
        };
        assert_eq!(
            dto.to_csv(),
            format!(
                "{CSV_HEADER}\np,,1970-01-01T00:00:00Z,2,1.5,,,0.5,\np,\"a,b\",1970-01-01T00:00:00Z,,1.5,1,0.5,,\n"
            )
        );
    }
}
