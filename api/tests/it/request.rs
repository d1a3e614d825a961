//! The request parsing every handler shares: a JSON body's error names the field at fault, and a page's cursor
//! comes back as the key it was made from while one made elsewhere is refused.

use bc_api::http::request::{PageParams, encode_cursor, parse_json};

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
struct Inner {
    count: u32,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
struct Outer {
    pool_id: String,
    devices: Inner,
}

fn field(body: &str) -> String {
    let err = parse_json::<Outer>(body.as_bytes()).expect_err("invalid");
    err.details["field"].as_str().expect("a field").to_owned()
}

#[test]
fn json_errors_name_the_field() {
    assert_eq!(field(r#"{"poolId": "p", "devices": {"count": "two"}}"#), "devices.count");
    assert_eq!(field(r#"{"poolId": "p", "devices": {"count": 2, "colour": 1}}"#), "devices.colour");
    assert_eq!(field(r#"{"poolId": "p"}"#), "devices");
    assert_eq!(field(r#"{"poolId": 7, "devices": {"count": 1}}"#), "poolId");
    assert_eq!(field(r#"{"poolId": "p", "#), "body");
    assert_eq!(field(""), "body");
    assert_eq!(field(r#"{"poolId": "p", "devices": {"count": 1}} trailing"#), "body");
    assert!(parse_json::<Outer>(br#"{"poolId": "p", "devices": {"count": 1}}"#).is_ok());
}

#[test]
fn cursors_round_trip_and_foreign_ones_are_refused() {
    let cursor = encode_cursor("rsv_abc");
    let params = PageParams { cursor: Some(cursor), ..PageParams::default() };
    assert_eq!(params.page().expect("page").after_key.as_deref(), Some("rsv_abc"));
    let foreign = PageParams { cursor: Some("bm9wZQ".into()), ..PageParams::default() };
    assert_eq!(foreign.page().expect_err("foreign").details["field"], "cursor");
    let zero = PageParams { limit: Some(0), ..PageParams::default() };
    assert_eq!(zero.page().expect_err("zero").details["field"], "limit");
}
