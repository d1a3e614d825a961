//! The GPU-hour ledger as a tenant reads it: per pool, tenant and UTC hour, the atom-hours booked, bound and
//! idle, and per pool and hour the capacity and what is free (the `ledger` read model, summed into hours by
//! [`bc_projections::models::ledger::read`]). A pool's owner sees every tenant's rows of its pools; any other
//! tenant its own rows, and the capacity and free figures of the pools it is offered (what availability shows
//! it already).

use bc_domain::id::PoolId;
use bc_domain::{Rejection, instant};
use bc_eventstore::{Access, Isolation, Position, TxOptions, clock};
use bc_projections::framework;
use bc_projections::models::ledger::{self, HOUR_MS, LedgerHours, LedgerQuery, Scope};

use crate::reads::Page;
use crate::{App, AppResult, Caller};

/// The longest range one read covers: 31 days of hours.
pub const MAX_HOURS: i64 = 31 * 24;
/// The hours a read covers when it names no start: the last 24.
pub const DEFAULT_HOURS: i64 = 24;

/// What a caller asks of the ledger: hours (epoch milliseconds; each rounded out to whole UTC hours) and a pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LedgerRange {
    /// The first hour; by default 24 hours before `to_ms`.
    pub from_ms: Option<i64>,
    /// The end (exclusive); by default 24 hours after `from_ms`, or the end of the current hour.
    pub to_ms: Option<i64>,
    pub pool_id: Option<PoolId>,
}

/// The ledger's hours `[from_ms, to_ms)` as the caller may see them.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerView {
    pub from_ms: i64,
    pub to_ms: i64,
    pub hours: LedgerHours,
}

/// The whole hours `[from, to)` that cover a range: the start rounded down, the end up; `now_ms` fills in what the
/// range leaves out. A range that ends before it starts, or spans more than [`MAX_HOURS`], is refused naming the
/// field to change.
pub fn hours_of(range: &LedgerRange, now_ms: i64) -> Result<(i64, i64), Rejection> {
    let floor = |ms: i64| ms.div_euclid(HOUR_MS) * HOUR_MS;
    let ceil = |ms: i64| floor(ms.saturating_add(HOUR_MS - 1));
    instant::check_opt_epoch_ms("from", range.from_ms)?;
    instant::check_opt_epoch_ms("to", range.to_ms)?;
    let (from, to) = match (range.from_ms, range.to_ms) {
        (Some(from), Some(to)) => (floor(from), ceil(to)),
        (Some(from), None) => (floor(from), floor(from) + DEFAULT_HOURS * HOUR_MS),
        (None, Some(to)) => (ceil(to) - DEFAULT_HOURS * HOUR_MS, ceil(to)),
        (None, None) => (floor(now_ms) + HOUR_MS - DEFAULT_HOURS * HOUR_MS, floor(now_ms) + HOUR_MS),
    };
    if to <= from {
        return Err(Rejection::invalid("to", "must be after from"));
    }
    if to - from > MAX_HOURS * HOUR_MS {
        return Err(Rejection::invalid("to", format!("must be at most {MAX_HOURS} hours (31 days) after from")));
    }
    Ok((from.max(0), to))
}

impl App {
    /// The ledger's hours as `caller` may see them, once the read models have passed `after`.
    pub async fn ledger(&self, caller: &Caller, range: &LedgerRange, after: Option<Position>) -> AppResult<LedgerView> {
        self.consistent(&["ledger", "pools"], after).await?;
        let (owned, visible) = self.pool_scope(caller).await?;
        let scope = Scope::Tenant { tenant_id: caller.tenant_id.to_string(), owned, visible };
        let mut tx =
            self.db.begin(TxOptions { isolation: Isolation::RepeatableRead, access: Access::ReadOnly }).await?;
        let now_ms = clock::compute_now_ms(&mut tx).await?;
        let (from_ms, to_ms) = hours_of(range, now_ms)?;
        let version = ledger_version(&mut tx).await?;
        let query = LedgerQuery { from_ms, to_ms, pool_id: range.pool_id.as_ref().map(PoolId::as_str), scope: &scope };
        let hours = ledger::read(&mut tx, version, &query).await?;
        tx.commit().await?;
        Ok(LedgerView { from_ms, to_ms, hours })
    }

    /// The pools `caller` owns, and every pool it can see (owned or offered), from the `pools` read model.
    async fn pool_scope(&self, caller: &Caller) -> AppResult<(Vec<String>, Vec<String>)> {
        let (mut owned, mut visible) = (Vec::new(), Vec::new());
        let mut page = Page::first(500);
        loop {
            let listed = self.list_pools(caller, &page, None).await?;
            for pool in &listed.items {
                if pool.owner_tenant_id == caller.tenant_id {
                    owned.push(pool.id.to_string());
                }
                visible.push(pool.id.to_string());
            }
            match listed.next_key {
                Some(key) => page.after_key = Some(key),
                None => return Ok((owned, visible)),
            }
        }
    }
}

/// The version of the ledger reads use: the active one, or before the daemon first ran, the newest (its tables
/// exist, empty).
async fn ledger_version(tx: &mut bc_eventstore::Tx) -> AppResult<u32> {
    let newest = || {
        bc_projections::models::read_models()
            .iter()
            .filter(|m| m.name() == "ledger")
            .map(|m| m.version())
            .max()
            .unwrap_or(1)
    };
    Ok(framework::active_version(tx, "ledger").await?.unwrap_or_else(newest))
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_893_456_000_000;

    #[test]
    fn a_range_rounds_out_to_whole_hours_and_defaults_to_the_last_24() {
        let range = |from, to| LedgerRange { from_ms: from, to_ms: to, pool_id: None };
        assert_eq!(hours_of(&range(None, None), T0 + 90_000), Ok((T0 + HOUR_MS - 24 * HOUR_MS, T0 + HOUR_MS)));
        assert_eq!(hours_of(&range(Some(T0 + 1), Some(T0 + HOUR_MS + 1)), T0), Ok((T0, T0 + 2 * HOUR_MS)));
        assert_eq!(hours_of(&range(Some(T0), None), 0), Ok((T0, T0 + 24 * HOUR_MS)));
        assert_eq!(hours_of(&range(None, Some(T0)), 0), Ok((T0 - 24 * HOUR_MS, T0)));
        assert_eq!(hours_of(&range(Some(T0), Some(T0 + 744 * HOUR_MS)), 0), Ok((T0, T0 + 744 * HOUR_MS)));
    }

    #[test]
    fn a_backwards_a_too_long_or_an_impossible_range_is_refused_naming_its_field() {
        let field = |from, to| match hours_of(&LedgerRange { from_ms: from, to_ms: to, pool_id: None }, T0) {
            Err(Rejection::InvalidArgument { field, .. }) => field,
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert_eq!(field(Some(T0), Some(T0)), "to");
        assert_eq!(field(Some(T0), Some(T0 - HOUR_MS)), "to");
        assert_eq!(field(Some(T0), Some(T0 + 745 * HOUR_MS)), "to");
        assert_eq!(field(Some(-1), None), "from");
        assert_eq!(field(None, Some(i64::MAX)), "to");
    }
}
