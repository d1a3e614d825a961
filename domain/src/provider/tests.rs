use super::*;

const T0: i64 = 1_893_456_000_000;

fn spec() -> ProviderAccountSpec {
    ProviderAccountSpec {
        name: "partner-eu".into(),
        provider: ProviderKind::BetterCompute,
        endpoint: "https://compute.partner.example:8443/".into(),
        settings: [("poolId".to_owned(), "pool_01jd8w2k3m4n5p6q7r8s9t0v1w".to_owned())].into(),
    }
}

fn ids() -> (ProviderAccountId, TenantId) {
    ("pacct_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("id"), "acme".parse().expect("tenant"))
}

#[test]
fn an_account_is_created_once_per_name_and_its_credential_never_travels_in_an_event() {
    let (id, tenant) = ids();
    let events = create_provider_account(&id, &tenant, spec(), "bc_secret_token", false, T0).expect("created");
    let encoded = serde_json::to_string(&events).expect("json");
    assert!(!encoded.contains("bc_secret_token"), "{encoded}");
    let account = events.iter().fold(None, evolve_provider_account).expect("an account");
    assert_eq!((account.created_at_ms, account.credential_at_ms, account.deleted_at_ms), (T0, T0, None));
    let taken = create_provider_account(&id, &tenant, spec(), "token", true, T0).expect_err("taken");
    assert!(matches!(taken, Rejection::Conflict(m) if m.contains("partner-eu")));

    let rotated = rotate_credential(&account, "another", T0 + 5).expect("rotated");
    let account = rotated.iter().fold(Some(account), evolve_provider_account).expect("still");
    assert_eq!(account.credential_at_ms, T0 + 5);
}

#[test]
fn every_field_is_checked_naming_it() {
    let (id, tenant) = ids();
    let with = |f: &dyn Fn(&mut ProviderAccountSpec)| {
        let mut s = spec();
        f(&mut s);
        s
    };
    let cases: Vec<(ProviderAccountSpec, &str, &str)> = vec![
        (with(&|s| s.name = String::new()), "token", "name"),
        (with(&|s| s.endpoint = "ftp://partner.example".into()), "token", "endpoint"),
        (with(&|s| s.endpoint = "http://partner.example".into()), "token", "endpoint"),
        (with(&|s| s.endpoint = "https://user:pw@partner.example".into()), "token", "endpoint"),
        (with(&|s| s.endpoint = "https://".into()), "token", "endpoint"),
        (with(&|s| s.endpoint = "https://partner.example/a b".into()), "token", "endpoint"),
        (with(&|s| s.settings = [("bad key".to_owned(), "v".to_owned())].into()), "token", "settings"),
        (with(&|s| s.settings = [("k".to_owned(), "a\u{0}b".to_owned())].into()), "token", "settings.k"),
        (with(&|s| s.settings = [("poolId".to_owned(), "gpu-pool".to_owned())].into()), "token", "settings.poolId"),
        (
            with(&|s| s.settings = (0..=MAX_SETTINGS).map(|i| (format!("k{i}"), String::new())).collect()),
            "token",
            "settings",
        ),
        (spec(), "", "credential"),
        (spec(), "a\u{7}b", "credential"),
    ];
    for (spec, credential, field) in cases {
        match create_provider_account(&id, &tenant, spec.clone(), credential, false, T0) {
            Err(Rejection::InvalidArgument { field: named, .. }) => assert_eq!(named, field, "{spec:?}"),
            other => panic!("expected {field} to be refused, got {other:?}"),
        }
    }
    for endpoint in ["https://10.0.0.1", "http://127.0.0.1:8080", "http://localhost:3000/api", "https://[::1]:9/"] {
        assert_eq!(check_endpoint(endpoint), Ok(()), "{endpoint}");
    }
    assert!(
        matches!("aws".parse::<ProviderKind>(), Err(Rejection::InvalidArgument { field, .. }) if field == "provider")
    );
    assert_eq!("better-compute".parse::<ProviderKind>(), Ok(ProviderKind::BetterCompute));
}

#[test]
fn an_account_that_backs_a_pool_is_not_deleted() {
    let (id, tenant) = ids();
    let events = create_provider_account(&id, &tenant, spec(), "token", false, T0).expect("created");
    let account = events.iter().fold(None, evolve_provider_account).expect("an account");
    let refused = delete_provider_account(&account, &["pool_x".to_owned()], T0).expect_err("backs a pool");
    assert!(matches!(refused, Rejection::Conflict(m) if m.contains("pool_x")));
    let deleted = delete_provider_account(&account, &[], T0 + 1).expect("deleted");
    let account = deleted.iter().fold(Some(account), evolve_provider_account).expect("kept");
    assert_eq!(account.deleted_at_ms, Some(T0 + 1));
    assert!(matches!(delete_provider_account(&account, &[], T0 + 2), Err(Rejection::NotFound { .. })));
    assert!(matches!(rotate_credential(&account, "x", T0 + 2), Err(Rejection::NotFound { .. })));
}
