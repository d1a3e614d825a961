//! The event-log position parser (`bc_domain::position::Position`, `<epoch>-<txid>-<seq>` in decimal): any text is
//! parsed or refused without a panic, and whatever parses prints back to the very text it came from (one
//! spelling per position), parses again to the same position, fits the part ranges and the pattern the API
//! schemas give, and survives the JSON string form the API uses.

#![no_main]

use bc_domain::position::{Position, PositionError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match text.parse::<Position>() {
        Ok(position) => {
            let printed = position.to_string();
            assert_eq!(printed, text, "a position has one spelling");
            assert_eq!(printed.parse::<Position>(), Ok(position), "{printed:?} parses back");
            assert!(position.epoch <= i32::MAX as u32, "epoch {} is beyond int4", position.epoch);
            assert!(position.seq <= i64::MAX as u64, "seq {} is beyond int8", position.seq);
            assert!(matches_pattern(&printed), "{printed:?} does not match {PATTERN}");
            let json = serde_json::to_string(&position).expect("a position serializes");
            assert_eq!(json, format!("\"{printed}\""));
            assert_eq!(serde_json::from_str::<Position>(&json).ok(), Some(position), "{json} deserializes back");
        }
        Err(err) => refused(&text, &err),
    }
    // The serde form (query parameters, JSON bodies) agrees with `FromStr`.
    let json = serde_json::to_string(&text).expect("a string serializes");
    assert_eq!(serde_json::from_str::<Position>(&json).ok(), text.parse::<Position>().ok(), "{json}");
    // Any JSON at all is refused or read as a position, never a panic.
    let _ = serde_json::from_slice::<Position>(data);
});

/// A refusal names the rule and echoes at most 64 characters of the input.
fn refused(text: &str, err: &PositionError) {
    assert!(err.input.chars().count() <= 64, "the echo is {} characters", err.input.chars().count());
    assert!(text.starts_with(&err.input), "the echo {:?} is not the input's start", err.input);
    assert!(err.to_string().contains("<epoch>-<txid>-<seq>"), "{err}");
}

/// The written form as the API schemas describe it (`Position::PATTERN`).
const PATTERN: &str = "^[0-9]{1,10}-[0-9]{1,20}-[0-9]{1,19}$";

/// Whether `text` matches [`PATTERN`], without a regex engine.
fn matches_pattern(text: &str) -> bool {
    let parts: Vec<&str> = text.split('-').collect();
    parts.len() == 3
        && parts
            .iter()
            .zip([10, 20, 19])
            .all(|(part, max)| (1..=max).contains(&part.len()) && part.bytes().all(|b| b.is_ascii_digit()))
}
