//! Instants as callers send them: epoch milliseconds, UTC.
//!
//! Every time field a caller sets (a window's start, a deadline, a new end, the bounds of a query) is checked
//! against one range before anything computes with it or sends it to the database: from 1970 to the end of the
//! year 9999. A window's length (at most 366 days) added to any instant in it stays far inside both `i64` and
//! PostgreSQL's timestamps, so no sum overflows and no conversion fails; the rules that need the clock (in the
//! past, too far ahead) are applied after, where the transaction's now is known.

use crate::Rejection;

/// The last instant a caller may name: 9999-12-31T23:59:59.999Z.
pub const MAX_EPOCH_MS: i64 = 253_402_300_799_999;

/// Refuses an instant before 1970 or after the year 9999, naming `field`.
pub fn check_epoch_ms(field: &str, ms: i64) -> Result<(), Rejection> {
    if (0..=MAX_EPOCH_MS).contains(&ms) {
        Ok(())
    } else {
        Err(Rejection::invalid(field, "must be epoch milliseconds from 0 to the end of the year 9999"))
    }
}

/// [`check_epoch_ms`] for a field that may be left out.
pub fn check_opt_epoch_ms(field: &str, ms: Option<i64>) -> Result<(), Rejection> {
    ms.map_or(Ok(()), |ms| check_epoch_ms(field, ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_from_1970_to_the_end_of_9999_pass_and_the_rest_are_refused_by_name() {
        assert!(check_epoch_ms("start", 0).is_ok());
        assert!(check_epoch_ms("start", MAX_EPOCH_MS).is_ok());
        for ms in [-1, MAX_EPOCH_MS + 1, i64::MIN, i64::MAX] {
            let refused = Rejection::invalid("start", "must be epoch milliseconds from 0 to the end of the year 9999");
            assert_eq!(check_epoch_ms("start", ms), Err(refused), "{ms}");
        }
        assert!(check_opt_epoch_ms("deadline", None).is_ok());
        assert!(check_opt_epoch_ms("deadline", Some(-5)).is_err());
        // Years: 9999-12-31T23:59:59.999Z is the last millisecond before 10000-01-01.
        assert_eq!(MAX_EPOCH_MS + 1, 253_402_300_800_000);
    }
}
