//! The tenancy aggregates: given events, when a decision, then events or a rejection.

use super::*;
use crate::testing::{Grants, Identities, Limits, Tenants, given};

const T0: i64 = 1_893_456_000_000;

fn tenant(id: &str) -> TenantId {
    id.parse().expect("tenant")
}

fn created(id: &str, parent: &str) -> TenantEvent {
    TenantEvent::Created(TenantCreated { tenant_id: tenant(id), parent_id: tenant(parent), name: id.into(), at_ms: T0 })
}

#[test]
fn a_tenant_is_created_under_an_existing_parent_within_the_depth_limit() {
    let id = tenant("acme-labs");
    let facts = TenantFacts { id_taken: false, parent_depth: Some(1) };
    let made = given::<Tenants>([])
        .when(|_| create_tenant(&id, &tenant("acme"), "acme-labs", facts, T0))
        .then([created("acme-labs", "acme")])
        .expect("a tenant");
    assert_eq!(made.state, TenantState::Active);
    given::<Tenants>([])
        .when(|_| create_tenant(&id, &tenant("acme"), "x", TenantFacts { id_taken: true, ..facts }, T0))
        .then_rejected(|r| matches!(r, Rejection::Conflict(m) if m.contains("acme-labs")));
    given::<Tenants>([])
        .when(|_| create_tenant(&id, &tenant("nope"), "x", TenantFacts { parent_depth: None, ..facts }, T0))
        .then_rejected(|r| matches!(r, Rejection::InvalidArgument { field, .. } if field == "parentId"));
    let deep = TenantFacts { id_taken: false, parent_depth: Some(MAX_DEPTH) };
    given::<Tenants>([])
        .when(|_| create_tenant(&id, &tenant("acme"), "x", deep, T0))
        .then_rejected(|r| matches!(r, Rejection::InvalidArgument { message, .. } if message.contains("at most 8")));
}

#[test]
fn suspension_and_resumption_change_the_state_once() {
    let id = tenant("acme-labs");
    let suspended =
        TenantEvent::Suspended(TenantSuspended { tenant_id: id.clone(), reason: "unpaid".into(), at_ms: T0 });
    let state = given::<Tenants>([created("acme-labs", "acme")])
        .when(|t| suspend_tenant(t, &id, "unpaid", T0))
        .then([suspended.clone()])
        .expect("a tenant");
    assert_eq!((state.state, state.suspended_reason.as_deref()), (TenantState::Suspended, Some("unpaid")));
    given::<Tenants>([created("acme-labs", "acme"), suspended.clone()])
        .when(|t| suspend_tenant(t, &id, "again", T0))
        .then_nothing();
    let resumed = given::<Tenants>([created("acme-labs", "acme"), suspended])
        .when(|t| resume_tenant(t, &id, T0 + 1))
        .then([TenantEvent::Resumed(TenantResumed { tenant_id: id.clone(), at_ms: T0 + 1 })])
        .expect("a tenant");
    assert_eq!(resumed.state, TenantState::Active);
    given::<Tenants>([created("acme-labs", "acme")]).when(|t| resume_tenant(t, &id, T0)).then_nothing();
    given::<Tenants>([])
        .when(|t| suspend_tenant(t, &id, "x", T0))
        .then_rejected(|r| matches!(r, Rejection::NotFound { kind: "tenant", .. }));
}

fn identity_created(id: &IdentityId) -> IdentityEvent {
    IdentityEvent::Created(IdentityCreated {
        identity_id: id.clone(),
        tenant_id: tenant("acme"),
        name: "ci@acme".parse().expect("identity"),
        kind: SessionKind::Service,
        admin: false,
        at_ms: T0,
    })
}

fn issued(id: &IdentityId, token: &TokenId, sha256: String) -> IdentityEvent {
    IdentityEvent::TokenIssued(TokenIssued {
        identity_id: id.clone(),
        tenant_id: tenant("acme"),
        token_id: token.clone(),
        sha256,
        at_ms: T0,
    })
}

#[test]
fn an_identity_holds_the_tokens_issued_to_it_until_each_is_revoked() {
    let id = IdentityId::generate();
    given::<Identities>([])
        .when(|_| create_identity(&id, &tenant("acme"), "ci@acme", SessionKind::Service, false, false, T0))
        .then([identity_created(&id)]);
    given::<Identities>([])
        .when(|_| create_identity(&id, &tenant("acme"), "ci@acme", SessionKind::Service, false, true, T0))
        .then_rejected(|r| matches!(r, Rejection::Conflict(m) if m.contains("ci@acme")));
    for bad in ["", "a b", "*", "x\0y"] {
        given::<Identities>([])
            .when(|_| create_identity(&id, &tenant("acme"), bad, SessionKind::User, false, false, T0))
            .then_rejected(|r| matches!(r, Rejection::InvalidArgument { field, .. } if field == "name"));
    }
    let token = TokenId::generate();
    let holder = given::<Identities>([identity_created(&id)])
        .when(|i| issue_token(i, &id, &token, &"ab".repeat(32), T0))
        .then([issued(&id, &token, "ab".repeat(32))])
        .expect("an identity");
    assert_eq!(holder.tokens.len(), 1);
    let revoked = given::<Identities>([identity_created(&id), issued(&id, &token, "ab".repeat(32))])
        .when(|i| revoke_token(i, &id, &token, T0))
        .then([IdentityEvent::TokenRevoked(TokenRevoked {
            identity_id: id.clone(),
            tenant_id: tenant("acme"),
            token_id: token.clone(),
            at_ms: T0,
        })])
        .expect("an identity");
    assert!(revoked.tokens.is_empty());
    given::<Identities>([identity_created(&id)])
        .when(|i| revoke_token(i, &id, &token, T0))
        .then_rejected(|r| matches!(r, Rejection::NotFound { kind: "token", .. }));
    // Deleting drops every token; a deleted identity takes no new one.
    let deleted =
        IdentityEvent::Deleted(IdentityDeleted { identity_id: id.clone(), tenant_id: tenant("acme"), at_ms: T0 });
    let gone = given::<Identities>([identity_created(&id), issued(&id, &token, "ab".repeat(32))])
        .when(|i| delete_identity(i, &id, T0))
        .then([deleted.clone()])
        .expect("an identity");
    assert!(gone.tokens.is_empty());
    given::<Identities>([identity_created(&id), deleted])
        .when(|i| issue_token(i, &id, &TokenId::generate(), "cd", T0))
        .then_rejected(|r| matches!(r, Rejection::NotFound { kind: "identity", .. }));
}

#[test]
fn an_identity_holds_a_bounded_number_of_tokens() {
    let id = IdentityId::generate();
    let mut history = vec![identity_created(&id)];
    for n in 0..MAX_TOKENS_PER_IDENTITY {
        history.push(issued(&id, &TokenId::generate(), format!("{n:064}")));
    }
    given::<Identities>(history)
        .when(|i| issue_token(i, &id, &TokenId::generate(), "ff", T0))
        .then_rejected(|r| matches!(r, Rejection::Conflict(m) if m.contains("revoke one first")));
}

#[test]
fn a_grant_names_a_known_identity_and_a_visible_pool_or_every_one() {
    let id = GrantId::generate();
    let pool = "pool_01m8q000000000000000000001";
    let acme = tenant("acme");
    let made = given::<Grants>([])
        .when(|_| create_grant(&id, &acme, "*", pool, Relation::User, false, true, T0))
        .then([GrantEvent::Created(GrantCreated {
            grant_id: id.clone(),
            tenant_id: acme.clone(),
            identity: "*".into(),
            pool: pool.into(),
            relation: Relation::User,
            at_ms: T0,
        })])
        .expect("a grant");
    given::<Grants>([])
        .when(|_| create_grant(&id, &acme, "bob@acme", "*", Relation::User, false, true, T0))
        .then_rejected(|r| matches!(r, Rejection::InvalidArgument { field, .. } if field == "identity"));
    given::<Grants>([])
        .when(|_| create_grant(&id, &acme, "*", pool, Relation::User, true, false, T0))
        .then_rejected(|r| matches!(r, Rejection::InvalidArgument { field, .. } if field == "pool"));
    given::<Grants>([])
        .when(|_| create_grant(&id, &acme, "*", "pool_nope", Relation::User, true, true, T0))
        .then_rejected(|r| matches!(r, Rejection::InvalidArgument { field, .. } if field == "pool"));
    let created = GrantEvent::Created(made.created);
    let revoked = GrantEvent::Revoked(GrantRevoked { grant_id: id.clone(), tenant_id: acme.clone(), at_ms: T0 });
    given::<Grants>([created.clone()]).when(|g| revoke_grant(g, &id, T0)).then([revoked.clone()]);
    given::<Grants>([created, revoked])
        .when(|g| revoke_grant(g, &id, T0))
        .then_rejected(|r| matches!(r, Rejection::NotFound { kind: "grant", .. }));
}

#[test]
fn a_limit_bounds_gpus_or_hours_for_relations_below_admin() {
    let id = LimitId::generate();
    let pool: PoolId = "pool_01m8q000000000000000000001".parse().expect("pool");
    let owner = tenant("root");
    let made = |max_gpus, max_hours| {
        LimitEvent::Created(LimitCreated {
            limit_id: id.clone(),
            pool_id: pool.clone(),
            owner_tenant_id: owner.clone(),
            relation: Relation::User,
            max_gpus,
            max_hours,
            at_ms: T0,
        })
    };
    given::<Limits>([])
        .when(|_| create_limit(&id, &pool, &owner, Relation::User, Some(8), Some(72), T0))
        .then([made(Some(8), Some(72))]);
    let refused = |relation, gpus, hours, field: &'static str| {
        given::<Limits>([])
            .when(|_| create_limit(&id, &pool, &owner, relation, gpus, hours, T0))
            .then_rejected(|r| matches!(r, Rejection::InvalidArgument { field: f, .. } if f == field));
    };
    refused(Relation::User, None, None, "maxGpus");
    refused(Relation::User, Some(MAX_LIMIT_GPUS + 1), None, "maxGpus");
    refused(Relation::User, None, Some(MAX_LIMIT_HOURS + 1), "maxHours");
    refused(Relation::Admin, Some(1), None, "relation");
    let other: PoolId = "pool_01m8q000000000000000000002".parse().expect("pool");
    given::<Limits>([made(Some(8), None)])
        .when(|l| delete_limit(l, &id, &other, T0))
        .then_rejected(|r| matches!(r, Rejection::NotFound { kind: "limit", .. }));
    given::<Limits>([made(Some(8), None)])
        .when(|l| delete_limit(l, &id, &pool, T0))
        .then([LimitEvent::Deleted(LimitDeleted { limit_id: id.clone(), pool_id: pool.clone(), at_ms: T0 })]);
}
