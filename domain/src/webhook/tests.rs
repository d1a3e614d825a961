//! The subscription's checks and decisions.

use super::*;
use crate::stream::parse_type_filter;

fn spec(url: &str, types: &[&str]) -> WebhookSpec {
    WebhookSpec {
        url: url.to_owned(),
        event_types: types.iter().map(|t| (*t).to_owned()).collect(),
        description: String::new(),
    }
}

fn field(rejection: Rejection) -> String {
    match rejection {
        Rejection::InvalidArgument { field, .. } => field,
        other => panic!("not an invalid argument: {other:?}"),
    }
}

#[test]
fn a_subscription_takes_https_or_loopback_http_and_known_types_and_names_what_it_refuses() {
    let checked = spec("https://hooks.example.com/bc", &["reservation.*", "node.cordoned", "reservation.*"])
        .check(parse_type_filter)
        .expect("valid");
    assert_eq!(checked.event_types, ["reservation.*", "node.cordoned"], "duplicates go");
    spec("http://127.0.0.1:8080/hook", &["pool.created"]).check(parse_type_filter).expect("loopback http");
    for (bad, at) in [
        (spec("http://hooks.example.com", &["pool.*"]), "url"),
        (spec("ftp://hooks.example.com", &["pool.*"]), "url"),
        (spec("https://u:p@hooks.example.com", &["pool.*"]), "url"),
        (spec("https://hooks.example.com", &[]), "eventTypes"),
        (spec("https://hooks.example.com", &["pool.*", "reservation.plaecd"]), "eventTypes[1]"),
        (spec("https://hooks.example.com", &["nothing.*"]), "eventTypes[0]"),
        (spec("https://hooks.example.com", &["pool.created,pool.deleted"]), "eventTypes[0]"),
        (WebhookSpec { description: "x\u{7}".into(), ..spec("https://h.example", &["pool.*"]) }, "description"),
    ] {
        assert_eq!(field(bad.clone().check(parse_type_filter).expect_err("refused")), at, "{bad:?}");
    }
}

#[test]
fn a_deleted_subscription_is_not_found_and_an_empty_replay_records_nothing() {
    let id = WebhookId::generate();
    let tenant: TenantId = "acme".parse().expect("tenant");
    let created = create_webhook(&id, &tenant, spec("https://h.example", &["pool.*"]), 1).expect("created");
    let hook = created.iter().fold(None, evolve_webhook).expect("a webhook");
    assert_eq!(replay_dead_letters(&hook, 0, 2).expect("nothing to replay"), Vec::new());
    let deleted = delete_webhook(&hook, 3).expect("deleted");
    let hook = deleted.iter().fold(Some(hook), evolve_webhook).expect("still folded");
    assert_eq!(hook.deleted_at_ms, Some(3));
    assert!(matches!(rotate_secret(&hook, 4), Err(Rejection::NotFound { .. })));
    assert!(matches!(delete_webhook(&hook, 4), Err(Rejection::NotFound { .. })));
}
