//! Positions in the event log: `(log_epoch, txid, seq)`, written `<epoch>-<txid>-<seq>` in decimal. A pure value:
//! the API reads and prints them, the event store binds them and reads them back (`bc_eventstore` re-exports it).

use std::fmt;
use std::str::FromStr;

/// A place in the event log. Positions order exactly as the log does; `0-0-0` is before every event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// Rises when the log moved into a cluster whose transaction ids start lower.
    pub epoch: u32,
    /// The 64-bit transaction id (`xid8`) of the transaction that appended the event.
    pub txid: u64,
    /// The event's place within its transaction's appends.
    pub seq: u64,
}

impl Position {
    /// The beginning of the log, before every event.
    pub const START: Position = Position { epoch: 0, txid: 0, seq: 0 };
    /// The written form as a regular expression (for schemas that describe it): three decimal parts, of at
    /// most the digits each part's range allows.
    pub const PATTERN: &'static str = "^[0-9]{1,10}-[0-9]{1,20}-[0-9]{1,19}$";

    pub fn new(epoch: u32, txid: u64, seq: u64) -> Self {
        Self { epoch, txid, seq }
    }

    /// The event log's three key columns as they are typed there: epoch as `int4`, txid as `xid8` (unsigned),
    /// seq as `int8`.
    pub fn columns(&self) -> (i32, u64, i64) {
        // Parsing caps epoch at i32::MAX and seq at i64::MAX, and rows never hold larger values.
        (i32::try_from(self.epoch).unwrap_or(i32::MAX), self.txid, i64::try_from(self.seq).unwrap_or(i64::MAX))
    }

    /// The values the event store binds for a query: [`Position::columns`], with txid as text (cast with
    /// `::text::xid8`, since xid8 has no cast from bigint).
    pub fn binds(&self) -> (i32, String, i64) {
        let (epoch, txid, seq) = self.columns();
        (epoch, txid.to_string(), seq)
    }

    /// A position from the event log's columns, as `binds` gives them; a value out of range is an error.
    pub fn from_row(epoch: i32, txid: &str, seq: i64) -> Result<Self, PositionError> {
        let invalid =
            || PositionError::new(&format!("{epoch}-{txid}-{seq}"), "the database returned a position out of range");
        Ok(Self {
            epoch: u32::try_from(epoch).map_err(|_| invalid())?,
            txid: txid.parse().map_err(|_| invalid())?,
            seq: u64::try_from(seq).map_err(|_| invalid())?,
        })
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.epoch, self.txid, self.seq)
    }
}

/// A text that is not a position.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid position {input:?}: {reason}; a position is <epoch>-<txid>-<seq> in decimal, such as 1-12884901890-17"
)]
pub struct PositionError {
    pub input: String,
    pub reason: String,
}

impl PositionError {
    fn new(input: &str, reason: &str) -> Self {
        // Keep the echo short: inputs can come from the network.
        let input: String = input.chars().take(64).collect();
        Self { input, reason: reason.to_owned() }
    }
}

/// Parses one decimal part: digits only, no sign, no leading zero (so each position has one spelling).
fn parse_part<T: FromStr>(input: &str, part: &str, name: &str, max: u64) -> Result<T, PositionError> {
    if part.is_empty() {
        return Err(PositionError::new(input, &format!("the {name} is empty")));
    }
    if !part.bytes().all(|b| b.is_ascii_digit()) {
        return Err(PositionError::new(input, &format!("the {name} {part:?} is not a decimal number")));
    }
    if part.len() > 1 && part.starts_with('0') {
        return Err(PositionError::new(input, &format!("the {name} {part:?} has a leading zero")));
    }
    let value: u64 =
        part.parse().map_err(|_| PositionError::new(input, &format!("the {name} {part:?} is too large")))?;
    if value > max {
        return Err(PositionError::new(input, &format!("the {name} {part:?} is too large (at most {max})")));
    }
    part.parse().map_err(|_| PositionError::new(input, &format!("the {name} {part:?} is too large")))
}

impl FromStr for Position {
    type Err = PositionError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let mut parts = input.split('-');
        let (Some(epoch), Some(txid), Some(seq), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(PositionError::new(input, "expected three parts separated by '-'"));
        };
        Ok(Position {
            epoch: parse_part(input, epoch, "epoch", i32::MAX as u64)?,
            txid: parse_part(input, txid, "txid", u64::MAX)?,
            seq: parse_part(input, seq, "seq", i64::MAX as u64)?,
        })
    }
}

impl serde::Serialize for Position {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Position {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_text() {
        for text in ["0-0-0", "1-12884901890-17", "2147483647-18446744073709551615-9223372036854775807"] {
            let position: Position = text.parse().expect(text);
            assert_eq!(position.to_string(), text);
        }
    }

    #[test]
    fn orders_by_epoch_then_txid_then_seq() {
        let a: Position = "1-20-5".parse().expect("a");
        let b: Position = "1-100-1".parse().expect("b");
        let c: Position = "2-3-1".parse().expect("c");
        assert!(Position::START < a && a < b && b < c);
    }

    #[test]
    fn rejects_anything_else_with_a_reason() {
        let cases = [
            ("", "three parts"),
            ("1-2", "three parts"),
            ("1-2-3-4", "three parts"),
            ("1--3", "txid is empty"),
            ("a-2-3", "not a decimal"),
            ("+1-2-3", "not a decimal"),
            (" 1-2-3", "not a decimal"),
            ("1-2-3 ", "not a decimal"),
            ("01-2-3", "leading zero"),
            ("1-2-0x3", "not a decimal"),
            ("2147483648-1-1", "too large"),
            ("1-18446744073709551616-1", "too large"),
            ("1-1-9223372036854775808", "too large"),
            ("1_2_3", "three parts"),
        ];
        for (input, reason) in cases {
            let err = input.parse::<Position>().expect_err(input);
            assert!(err.to_string().contains(reason), "{input:?}: {err}");
            assert!(err.to_string().contains("<epoch>-<txid>-<seq>"), "{input:?}: {err}");
        }
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::Position;

    proptest! {
        /// Every position a reader can hand out parses back to itself.
        #[test]
        fn a_position_round_trips_through_its_text(epoch in 0..=i32::MAX as u32, txid: u64, seq in 0..=i64::MAX as u64) {
            let position = Position { epoch, txid, seq };
            prop_assert_eq!(position.to_string().parse::<Position>().expect("parses"), position);
        }

        /// Any text is answered, never a panic; what parses prints back to the same text.
        #[test]
        fn any_text_parses_or_is_refused(text in "\\PC{0,40}") {
            if let Ok(position) = text.parse::<Position>() {
                prop_assert_eq!(position.to_string(), text);
            }
        }

        /// Texts shaped like positions, with leading zeros, signs and huge numbers, never panic either.
        #[test]
        fn near_misses_are_refused_cleanly(text in "[-+0-9]{0,25}(-[-+0-9]{0,25}){0,3}") {
            let _ = text.parse::<Position>();
        }
    }
}
