//! Every request body type the API reads (`bc-wire`), from any bytes, parsed the way the API parses JSON
//! bodies (`serde_path_to_error`, then nothing but whitespace), then checked the way its handler checks it before
//! anything is written: a reservation's request and a quote's, a pool's fields and policy, a site's region, names, ids,
//! quotas, a tenant, an identity, a grant, a limit, a provider account. Nothing may panic, and what a check accepts must satisfy
//! the bounds the OpenAPI document states.

#![no_main]

use bc_wire::{agent, flavors, fleet, instances, nodes, providers, quotes, reservations, tenancy};
use bc_domain::id::{GrantId, IdentityId, LimitId, PoolId, TenantId};
use bc_domain::pool::{PoolCreated, PoolPolicy};
use bc_domain::tenancy as t;
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;

const T0: i64 = 1_893_456_000_000;

fuzz_target!(|data: &[u8]| {
    if let Some(body) = parse::<reservations::ReserveBody>(data)
        && let Ok(request) = body.request()
        && request.check(T0).is_ok()
    {
        assert!(request.devices.count >= 1, "an accepted request asks for a device");
        assert!(request.duration_s >= 1, "an accepted request lasts");
        for amount in request.resources.values() {
            assert!((1..=1_000_000).contains(amount), "an accepted scalar amount is within its bounds");
        }
    }
    if let Some(body) = parse::<quotes::QuoteBody>(data)
        && let Ok((request, _)) = body.request(&PoolId::generate())
        && request.check(T0).is_ok()
    {
        assert!(
            request.devices.count >= 1 && request.duration_s >= 1,
            "an accepted quote asks for a device that lasts"
        );
    }
    if let Some(body) = parse::<providers::ProviderAccountBody>(data)
        && let Ok((spec, credential)) = body.spec()
        && spec.check().is_ok()
        && bc_domain::provider::check_credential(&credential).is_ok()
    {
        assert!(!credential.is_empty() && credential.len() <= bc_domain::provider::MAX_CREDENTIAL);
        assert!(spec.settings.len() <= bc_domain::provider::MAX_SETTINGS);
        assert!(spec.endpoint.starts_with("https://") || spec.endpoint.starts_with("http://"));
    }
    let _ = parse::<providers::CredentialBody>(data);
    if let Some(body) = parse::<flavors::FlavorBody>(data) {
        let sizes = bc_domain::flavor::FlavorSizes {
            vcpu: body.vcpu,
            memory_gib: body.memory_gib,
            gpus: body.gpus,
            disk: body.disk,
        };
        if sizes.check().is_ok() {
            assert!(sizes.vcpu >= 1 && sizes.gpus >= 1 && sizes.memory_gib >= 1 && sizes.disk >= 1);
            assert!(sizes.gpus <= bc_domain::flavor::MAX_GPUS, "the document says at most 64 GPUs");
        }
    }
    if let Some(body) = parse::<instances::InstanceBody>(data) {
        // The handler's checks of an instance that need no lookup: its spec with any valid sizes.
        if let (Ok(pool_id), Ok(flavor_id), Ok(image_id)) =
            (body.pool_id.parse(), body.flavor_id.parse(), body.image_id.parse())
        {
            let spec = bc_domain::instance::InstanceSpec {
                name: body.name,
                pool_id,
                flavor_id,
                sizes: bc_domain::flavor::FlavorSizes { vcpu: 1, memory_gib: 1, gpus: 1, disk: 1 },
                image_id,
                project_id: None,
                user_data: body.user_data,
                duration_s: body.duration,
            };
            if spec.check().is_ok() {
                assert!(spec.duration_s >= 1 && spec.duration_s <= 31_622_400, "the document's duration bounds");
                assert!(spec.user_data.len() <= bc_domain::instance::MAX_USER_DATA);
            }
        }
    }
    let _ = parse::<bc_domain::agent::InstanceStateReport>(data);
    let _ = parse::<reservations::CancelBody>(data);
    let _ = parse::<reservations::ExtendBody>(data);
    let _ = parse::<reservations::EmptyBody>(data);
    if let Some(body) = parse::<fleet::SiteBody>(data) {
        let create = bc_domain::site::CreateSite {
            site_id: bc_domain::id::SiteId::generate(),
            owner_tenant_id: root(),
            name: body.name,
            iam_region: body.iam_region,
            kind: body.kind,
            now_ms: T0,
        };
        let _ = bc_domain::site::create_site(&create, false);
    }
    if let Some(body) = parse::<fleet::ProjectBody>(data) {
        let _ = bc_domain::site::create_project(&bc_domain::id::ProjectId::generate(), &root(), &body.name, false, T0);
    }
    if let Some(body) = parse::<fleet::PoolBody>(data) {
        let created = PoolCreated {
            pool_id: PoolId::generate(),
            site_id: bc_domain::id::SiteId::generate(),
            owner_tenant_id: root(),
            name: body.name,
            class: body.class,
            gpu_model: body.gpu_model,
            sharing: body.sharing,
            agent: body.agent,
            policy: PoolPolicy::from(body.policy),
            provider_account_id: body.provider_account_id,
            at_ms: T0,
        };
        let _ = created.check();
    }
    if let Some(body) = parse::<fleet::PoolUpdateBody>(data) {
        let _ = body.policy.map(PoolPolicy::from);
    }
    if let Some(body) = parse::<fleet::OfferBody>(data) {
        let _ = body.tenant_id.parse::<TenantId>();
        let _ = bc_domain::pool::check_quota("quota", &body.quota);
    }
    if let Some(body) = parse::<fleet::QuotaBody>(data) {
        let _ = bc_domain::pool::check_quota("quota", &body.quota);
    }
    let _ = parse::<nodes::RegisterBody>(data);
    let _ = parse::<nodes::VerbBody>(data);
    let _ = parse::<nodes::ForceBody>(data);
    let _ = parse::<nodes::SpecBody>(data);
    let _ = parse::<nodes::CommandBody>(data);
    let _ = parse::<nodes::JoinTokenBody>(data);
    let _ = parse::<agent::CertificateRequestDto>(data);
    if let Some(body) = parse::<tenancy::TenantBody>(data)
        && let Ok(id) = body.tenant_id.parse::<TenantId>()
    {
        let facts = t::TenantFacts { id_taken: false, parent_depth: Some(0) };
        if t::create_tenant(&id, &root(), &body.name, facts, T0).is_ok() {
            assert!((1..=128).contains(&body.name.chars().count()), "name {:?}", body.name);
            assert!(!body.name.contains('\0'));
        }
    }
    if let Some(body) = parse::<tenancy::SuspendBody>(data) {
        let tenant = t::Tenant {
            tenant_id: root(),
            parent_id: root(),
            name: "x".into(),
            state: t::TenantState::Active,
            suspended_reason: None,
            at_ms: T0,
        };
        if t::suspend_tenant(Some(&tenant), &root(), &body.reason, T0).is_ok() {
            assert!(body.reason.chars().count() <= 512 && !body.reason.contains('\0'), "{:?}", body.reason);
        }
    }
    if let Some(body) = parse::<tenancy::IdentityBody>(data)
        && t::create_identity(&IdentityId::generate(), &root(), &body.name, body.kind, body.admin, false, T0).is_ok()
    {
        assert!((3..=256).contains(&body.name.chars().count()), "name {:?}", body.name);
        assert!(!body.name.chars().any(char::is_control), "{:?}", body.name);
    }
    if let Some(body) = parse::<tenancy::GrantBody>(data) {
        let _ =
            t::create_grant(&GrantId::generate(), &root(), &body.identity, &body.pool, body.relation, true, true, T0);
    }
    if let Some(body) = parse::<tenancy::LimitBody>(data) {
        let pool = PoolId::generate();
        if t::create_limit(&LimitId::generate(), &pool, &root(), body.relation, body.max_gpus, body.max_hours, T0)
            .is_ok()
        {
            assert!(body.max_gpus.is_none_or(|n| n <= t::MAX_LIMIT_GPUS));
            assert!(body.max_hours.is_none_or(|n| n <= t::MAX_LIMIT_HOURS));
        }
    }
});

fn root() -> TenantId {
    "root".parse().expect("the root tenant id")
}

/// How the API reads a JSON body: through `serde_path_to_error`, then nothing but whitespace may follow.
fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = match serde_path_to_error::deserialize(&mut deserializer) {
        Ok(value) => value,
        Err(err) => {
            let _ = (err.path().to_string(), err.inner().to_string());
            return None;
        }
    };
    deserializer.end().ok()?;
    Some(value)
}
