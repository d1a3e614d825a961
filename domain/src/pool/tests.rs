//! Tests of `pool`.

use super::*;

fn tenant(name: &str) -> TenantId {
    name.parse().expect("tenant")
}

fn offer(tenant_id: &str, gpus: u32, include_descendants: bool) -> PoolOffered {
    PoolOffered {
        pool_id: "pool_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("pool"),
        tenant_id: tenant(tenant_id),
        quota: [("gpu".to_owned(), gpus)].into(),
        priority: 0,
        include_descendants,
        at_ms: 0,
    }
}

#[test]
fn policy_defaults_and_wire_spelling() {
    let policy: PoolPolicy = serde_json::from_str("{}").expect("defaults");
    assert_eq!(policy.disruption_budget, 0.05);
    let json = serde_json::to_value(&policy).expect("json");
    assert!(
        json.get("disruptionBudget").is_some() && json.get("lostAfter").is_some() && json.get("maxPending").is_some()
    );
    let policy: PoolPolicy =
        serde_json::from_str(r#"{"sharing": {"replicas": 4}, "admission": {"budgetCheck": true}, "tenantRoot": true}"#)
            .expect("parse");
    assert_eq!(policy.replicas(), 4);
    assert!(policy.admission.budget_check && policy.tenant_root);
    assert!(serde_json::from_str::<PoolPolicy>(r#"{"lostAftr": 5}"#).is_err(), "unknown keys are refused");
    assert_eq!(serde_json::to_string(&Sharing::Timeslice).expect("json"), "\"timeslice\"");
    assert_eq!(serde_json::to_string(&PoolClass::MetalDedicated).expect("json"), "\"metal-dedicated\"");
}

#[test]
fn policy_keys_and_quota_resources_not_acted_on_yet_are_refused_naming_them() {
    let refused = |policy: PoolPolicy, wanted: &str| {
        let err = policy.check(Sharing::Exclusive).expect_err(wanted);
        assert!(
            matches!(&err, Rejection::InvalidArgument { field, message } if field == wanted && message.contains("not acted on yet")),
            "{err:?}"
        );
    };
    refused(
        PoolPolicy { admission: AdmissionPolicy { budget_check: true }, ..PoolPolicy::default() },
        "policy.admission.budgetCheck",
    );
    refused(PoolPolicy { hardware_profile: Some("dgx".into()), ..PoolPolicy::default() }, "policy.hardwareProfile");
    let whole = PoolPolicy { tenant_root: true, ..PoolPolicy::default() };
    assert_eq!(whole.check(Sharing::Exclusive), Ok(()), "a pool of whole machines");
    let sliced = whole.check(Sharing::Mig).expect_err("whole machines are handed over with every GPU");
    assert!(matches!(&sliced, Rejection::InvalidArgument { field, .. } if field == "policy.tenantRoot"), "{sliced:?}");
    let err = check_quota("quota", &[("nic.vf".to_owned(), 1)].into()).expect_err("nic.vf");
    assert!(
        matches!(&err, Rejection::InvalidArgument { field, message } if field == "quota.nic.vf" && message.contains("not accounted yet")),
        "{err:?}"
    );
    for resource in ACCOUNTED_RESOURCES {
        assert!(check_quota("quota", &[((*resource).to_owned(), 1)].into()).is_ok(), "{resource}");
    }
}

#[test]
fn overcommit_ratios_apply_to_scalars_only_and_scale_what_a_node_lends() {
    let ratios = |pairs: &[(&str, f64)]| PoolPolicy {
        overcommit: pairs.iter().map(|(r, x)| ((*r).to_owned(), *x)).collect(),
        ..PoolPolicy::default()
    };
    let policy = ratios(&[("vcpu", 4.0), ("memoryGiB", 1.5)]);
    assert_eq!(policy.check(Sharing::Exclusive), Ok(()));
    assert_eq!(policy.allocatable("vcpu", 64), 256);
    assert_eq!(policy.allocatable("memoryGiB", 3), 4, "rounded down");
    assert_eq!(policy.allocatable("disk", 100), 100, "a resource left out is not overcommitted");
    for (bad, field) in [
        (ratios(&[("gpu", 2.0)]), "policy.overcommit.gpu"),
        (ratios(&[("vcpu", 0.5)]), "policy.overcommit.vcpu"),
        (ratios(&[("vcpu", 65.0)]), "policy.overcommit.vcpu"),
        (ratios(&[("disk", f64::NAN)]), "policy.overcommit.disk"),
    ] {
        let err = bad.check(Sharing::Exclusive).expect_err(field);
        assert!(matches!(&err, Rejection::InvalidArgument { field: f, .. } if f == field), "{err:?}");
    }
}

#[test]
fn policy_checks_name_the_field() {
    let mut policy = PoolPolicy { disruption_budget: 0.0, ..PoolPolicy::default() };
    assert!(
        matches!(policy.check(Sharing::Exclusive), Err(Rejection::InvalidArgument { field, .. }) if field == "policy.disruptionBudget")
    );
    policy.disruption_budget = 0.05;
    assert!(
        matches!(policy.check(Sharing::Timeslice), Err(Rejection::InvalidArgument { field, .. }) if field == "policy.sharing.replicas")
    );
    policy.sharing.replicas = Some(4);
    assert!(policy.check(Sharing::Timeslice).is_ok());
    assert!(policy.check(Sharing::Exclusive).is_err());
}

#[test]
fn quota_names_known_resources_only() {
    assert!(check_quota("quota", &[("gpu".to_owned(), 8)].into()).is_ok());
    let err = check_quota("quota", &[("gpus".to_owned(), 8)].into()).expect_err("unknown");
    assert!(matches!(err, Rejection::InvalidArgument { field, .. } if field == "quota.gpus"));
}

#[test]
fn a_direct_offer_wins_over_an_inherited_one() {
    let offers = vec![offer("org", 16, true), offer("team", 4, false)];
    let team = tenant("team");
    let org = tenant("org");
    assert_eq!(governing_offer(&offers, &team, std::slice::from_ref(&org)).map(|o| o.quota["gpu"]), Some(4));
    let other = tenant("other-team");
    assert_eq!(governing_offer(&offers, &other, std::slice::from_ref(&org)).map(|o| o.quota["gpu"]), Some(16));
    let offers = vec![offer("org", 16, false)];
    assert!(governing_offer(&offers, &other, &[org]).is_none(), "without includeDescendants nothing is inherited");
}

mod aggregate {
    //! The pool and join token aggregates: given events, when a command, then events or a rejection.

    use super::super::*;
    use crate::Rejection;
    use crate::id::JoinTokenId;
    use crate::testing::{JoinTokens, Pools, given};

    const T0: i64 = 1_893_456_000_000;

    fn tenant(id: &str) -> TenantId {
        id.parse().expect("tenant")
    }

    fn pool_id() -> PoolId {
        "pool_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("pool")
    }

    fn created() -> PoolCreated {
        PoolCreated {
            pool_id: pool_id(),
            site_id: "site_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("site"),
            owner_tenant_id: tenant("root"),
            name: "h100".into(),
            class: PoolClass::MetalHost,
            gpu_model: "H100".into(),
            sharing: Sharing::Exclusive,
            agent: PoolAgent::Bcd,
            policy: PoolPolicy::default(),
            provider_account_id: None,
            at_ms: T0,
        }
    }

    fn offered(tenant_id: &str, gpus: u32, at_ms: i64) -> PoolEvent {
        PoolEvent::Offered(PoolOffered {
            pool_id: pool_id(),
            tenant_id: tenant(tenant_id),
            quota: Quota::from([("gpu".to_owned(), gpus)]),
            priority: 0,
            include_descendants: false,
            at_ms,
        })
    }

    fn offer(tenant_id: &str, gpus: u32, now_ms: i64) -> PoolCommand {
        PoolCommand::Offer {
            tenant_id: tenant(tenant_id),
            quota: Quota::from([("gpu".to_owned(), gpus)]),
            priority: 0,
            include_descendants: false,
            now_ms,
        }
    }

    fn on(command: PoolCommand) -> impl FnOnce(Option<&Pool>) -> Result<Vec<PoolEvent>, Rejection> {
        move |pool| decide(pool.expect("a pool"), &command)
    }

    #[test]
    fn a_pool_is_created_only_in_the_owners_site_under_a_free_name() {
        let facts = CreationFacts { site_owned: true, name_taken: false, provider_account_owned: false };
        let pool = given::<Pools>([]).when(|_| create(&created(), facts)).then([PoolEvent::Created(created())]);
        assert_eq!(pool.expect("a pool").offers, Vec::new());
        let elsewhere = CreationFacts { site_owned: false, name_taken: false, provider_account_owned: false };
        given::<Pools>([])
            .when(|_| create(&created(), elsewhere))
            .then_rejected(|r| matches!(r, Rejection::NotFound { kind: "site", .. }));
        let taken = CreationFacts { site_owned: true, name_taken: true, provider_account_owned: false };
        given::<Pools>([])
            .when(|_| create(&created(), taken))
            .then_rejected(|r| matches!(r, Rejection::Conflict(m) if m.contains("h100")));
        let bad = PoolCreated { gpu_model: "H100 SXM".into(), ..created() };
        given::<Pools>([])
            .when(|_| create(&bad, facts))
            .then_rejected(|r| matches!(r, Rejection::InvalidArgument { field, .. } if field == "gpuModel"));
    }

    #[test]
    fn a_provider_pool_names_a_live_account_of_its_owner_and_runs_no_agent() {
        let account = "pacct_01jd8w2k3m4n5p6q7r8s9t0v1w".to_owned();
        let provider = PoolCreated {
            class: PoolClass::Provider,
            agent: PoolAgent::None,
            provider_account_id: Some(account.clone()),
            ..created()
        };
        let owned = CreationFacts { site_owned: true, name_taken: false, provider_account_owned: true };
        given::<Pools>([]).when(|_| create(&provider, owned)).then([PoolEvent::Created(provider.clone())]);
        let field_of = |created: &PoolCreated, facts: CreationFacts| match create(created, facts) {
            Err(Rejection::InvalidArgument { field, message }) => (field, message),
            other => panic!("expected a refusal, got {other:?}"),
        };
        let missing = CreationFacts { provider_account_owned: false, ..owned };
        let (field, message) = field_of(&provider, missing);
        assert_eq!(field, "providerAccountId");
        assert!(message.contains(&account) && message.contains("not found"), "{message}");
        let unparsed = PoolCreated { provider_account_id: Some("acct-1".into()), ..provider.clone() };
        assert_eq!(field_of(&unparsed, owned).0, "providerAccountId");
        let with_agent = PoolCreated { agent: PoolAgent::Bcd, ..provider.clone() };
        assert_eq!(field_of(&with_agent, owned).0, "agent");
        let host = PoolCreated { class: PoolClass::VpsHost, ..provider };
        assert_eq!(field_of(&host, owned).0, "providerAccountId", "only provider pools name an account");
    }

    #[test]
    fn an_offer_replaces_the_tenants_earlier_one_and_the_owner_needs_none() {
        let pool = given::<Pools>([PoolEvent::Created(created()), offered("acme", 4, T0)])
            .when(on(offer("acme", 8, T0 + 1)))
            .then([offered("acme", 8, T0 + 1)])
            .expect("a pool");
        assert_eq!(pool.offers.len(), 1);
        assert_eq!(pool.offers[0].quota.get("gpu"), Some(&8));
        given::<Pools>([PoolEvent::Created(created())])
            .when(on(offer("root", 8, T0)))
            .then_rejected(|r| matches!(r, Rejection::InvalidArgument { field, .. } if field == "tenantId"));
        given::<Pools>([PoolEvent::Created(created())])
            .when(on(PoolCommand::Offer {
                tenant_id: tenant("acme"),
                quota: Quota::from([("tpu".to_owned(), 1)]),
                priority: 0,
                include_descendants: false,
                now_ms: T0,
            }))
            .then_rejected(|r| matches!(r, Rejection::InvalidArgument { .. }));
    }

    #[test]
    fn an_offering_is_revoked_only_when_it_exists_and_others_stay() {
        let revoke = |tenant_id: &str| PoolCommand::RevokeOffer { tenant_id: tenant(tenant_id), now_ms: T0 + 1 };
        let pool = given::<Pools>([PoolEvent::Created(created()), offered("acme", 4, T0), offered("globex", 1, T0)])
            .when(on(revoke("acme")))
            .then([PoolEvent::OfferRevoked(PoolOfferRevoked {
                pool_id: pool_id(),
                tenant_id: tenant("acme"),
                at_ms: T0 + 1,
            })])
            .expect("a pool");
        let left: Vec<&str> = pool.offers.iter().map(|o| o.tenant_id.as_str()).collect();
        assert_eq!(left, ["globex"]);
        given::<Pools>([PoolEvent::Created(created()), offered("globex", 1, T0)])
            .when(on(revoke("acme")))
            .then_rejected(|r| matches!(r, Rejection::NotFound { kind: "offering", .. }));
    }

    #[test]
    fn a_pool_is_renamed_and_given_a_policy_and_changes_sharing_only_while_empty() {
        let facts = |nodes| UpdateFacts { name_taken: false, nodes, live_reservations: 0 };
        let change = PoolChange { name: Some("h100-b".into()), ..PoolChange::default() };
        let pool = given::<Pools>([PoolEvent::Created(created())])
            .when(on(PoolCommand::Update { change: change.clone(), facts: facts(3), now_ms: T0 + 1 }))
            .then([PoolEvent::Updated(PoolUpdated {
                pool_id: pool_id(),
                name: Some("h100-b".into()),
                policy: None,
                sharing: None,
                at_ms: T0 + 1,
            })])
            .expect("a pool");
        assert_eq!(pool.name, "h100-b");
        let taken = UpdateFacts { name_taken: true, ..facts(0) };
        given::<Pools>([PoolEvent::Created(created())])
            .when(on(PoolCommand::Update { change, facts: taken, now_ms: T0 + 1 }))
            .then_rejected(|r| matches!(r, Rejection::Conflict(m) if m.contains("h100-b")));
        let mig = PoolChange { sharing: Some(Sharing::Mig), ..PoolChange::default() };
        given::<Pools>([PoolEvent::Created(created())])
            .when(on(PoolCommand::Update { change: mig.clone(), facts: facts(2), now_ms: T0 + 1 }))
            .then_rejected(|r| matches!(r, Rejection::Conflict(m) if m.contains("2 nodes")));
        let pool = given::<Pools>([PoolEvent::Created(created())])
            .when(on(PoolCommand::Update { change: mig, facts: facts(0), now_ms: T0 + 1 }))
            .then([PoolEvent::Updated(PoolUpdated {
                pool_id: pool_id(),
                name: None,
                policy: None,
                sharing: Some(Sharing::Mig),
                at_ms: T0 + 1,
            })])
            .expect("a pool");
        assert_eq!(pool.sharing, Sharing::Mig);
        let bad = PoolPolicy { disruption_budget: 0.0, ..PoolPolicy::default() };
        given::<Pools>([PoolEvent::Created(created())])
            .when(on(PoolCommand::Update {
                change: PoolChange { policy: Some(bad), ..PoolChange::default() },
                facts: facts(0),
                now_ms: T0 + 1,
            }))
            .then_rejected(
                |r| matches!(r, Rejection::InvalidArgument { field, .. } if field == "policy.disruptionBudget"),
            );
        given::<Pools>([PoolEvent::Created(created())])
            .when(on(PoolCommand::Update { change: PoolChange::default(), facts: facts(0), now_ms: T0 + 1 }))
            .then_rejected(|r| matches!(r, Rejection::InvalidArgument { field, .. } if field == "body"));
    }

    #[test]
    fn a_pool_is_deleted_only_without_nodes_or_live_reservations() {
        let delete = |nodes, live| PoolCommand::Delete {
            facts: UpdateFacts { name_taken: false, nodes, live_reservations: live },
            now_ms: T0 + 1,
        };
        given::<Pools>([PoolEvent::Created(created())])
            .when(on(delete(1, 0)))
            .then_rejected(|r| matches!(r, Rejection::Conflict(m) if m.contains("1 nodes")));
        given::<Pools>([PoolEvent::Created(created())])
            .when(on(delete(0, 2)))
            .then_rejected(|r| matches!(r, Rejection::Conflict(m) if m.contains("2 reservations")));
        let pool = given::<Pools>([PoolEvent::Created(created())])
            .when(on(delete(0, 0)))
            .then([PoolEvent::Deleted(PoolDeleted { pool_id: pool_id(), at_ms: T0 + 1 })])
            .expect("folded");
        assert_eq!(pool.deleted_at_ms, Some(T0 + 1));
    }

    #[test]
    fn a_quota_is_set_only_on_an_existing_offering() {
        let set = |tenant_id: &str| PoolCommand::SetQuota {
            tenant_id: tenant(tenant_id),
            quota: Quota::from([("gpu".to_owned(), 2)]),
            now_ms: T0 + 1,
        };
        let pool = given::<Pools>([PoolEvent::Created(created()), offered("acme", 4, T0), offered("globex", 1, T0)])
            .when(on(set("acme")))
            .then([PoolEvent::QuotaSet(PoolQuotaSet {
                pool_id: pool_id(),
                tenant_id: tenant("acme"),
                quota: Quota::from([("gpu".to_owned(), 2)]),
                at_ms: T0 + 1,
            })])
            .expect("a pool");
        let quotas: Vec<(&str, Option<&u32>)> =
            pool.offers.iter().map(|o| (o.tenant_id.as_str(), o.quota.get("gpu"))).collect();
        assert_eq!(quotas, vec![("acme", Some(&2)), ("globex", Some(&1))], "offers stay in tenant order");
        given::<Pools>([PoolEvent::Created(created())])
            .when(on(set("acme")))
            .then_rejected(|r| matches!(r, Rejection::NotFound { kind: "offering", .. }));
    }

    #[test]
    fn a_join_token_lives_between_a_minute_and_its_longest_ttl() {
        let id: JoinTokenId = "jtk_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("token id");
        let token = given::<JoinTokens>([])
            .when(|_| issue_join_token(&pool_id(), &id, 3600, 7 * 24 * 3600, T0))
            .then([PoolEvent::JoinTokenIssued(JoinTokenIssued {
                pool_id: pool_id(),
                token_id: id.clone(),
                expires_at_ms: T0 + 3_600_000,
                at_ms: T0,
            })])
            .expect("a token");
        assert_eq!((token.pool_id, token.expires_at_ms), (pool_id(), T0 + 3_600_000));
        for ttl in [59, 7 * 24 * 3600 + 1] {
            given::<JoinTokens>([])
                .when(|_| issue_join_token(&pool_id(), &id, ttl, 7 * 24 * 3600, T0))
                .then_rejected(|r| matches!(r, Rejection::InvalidArgument { field, .. } if field == "ttlSeconds"));
        }
    }

    #[test]
    fn an_unused_join_token_is_revoked_once_and_a_used_one_is_refused() {
        let id: JoinTokenId = "jtk_01jd8w2k3m4n5p6q7r8s9t0v1w".parse().expect("token id");
        let issued = PoolEvent::JoinTokenIssued(JoinTokenIssued {
            pool_id: pool_id(),
            token_id: id.clone(),
            expires_at_ms: T0 + 3_600_000,
            at_ms: T0,
        });
        let revoked =
            PoolEvent::JoinTokenRevoked(JoinTokenRevoked { pool_id: pool_id(), token_id: id.clone(), at_ms: T0 + 5 });
        let token = given::<JoinTokens>([issued.clone()])
            .when(|token| revoke_join_token(token.expect("issued"), None, T0 + 5))
            .then([revoked.clone()])
            .expect("a token");
        assert_eq!(token.revoked_at_ms, Some(T0 + 5));
        given::<JoinTokens>([issued.clone(), revoked])
            .when(|token| revoke_join_token(token.expect("issued"), None, T0 + 9))
            .then_nothing();
        given::<JoinTokens>([issued])
            .when(|token| revoke_join_token(token.expect("issued"), Some("node_1"), T0 + 5))
            .then_rejected(|r| matches!(r, Rejection::Conflict(m) if m.contains("node_1")));
    }
}
