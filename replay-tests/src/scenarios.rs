//! The scenarios the recorded logs come from, run through the real command handlers and the worker on the
//! simulated clock.

use bc_commands::fleet::{CreatePool, CreateSite, OfferPool};
use bc_commands::nodes::{NodeVerb, RegisterNode};
use bc_commands::reservations::Reserve;
use bc_commands::worker::{Worker, WorkerConfig};
use bc_commands::{App, Caller};
use bc_domain::device::{DeviceClass, GpuInfo, MigInstance};
use bc_domain::id::{NodeId, PoolId, SiteId};
use bc_domain::node::{Role, Trust};
use bc_domain::pool::{PoolAgent, PoolClass, PoolPolicy, Sharing, SharingPolicy};
use bc_domain::reservation::{ReservationRequest, Topology};
use bc_domain::site::SiteKind;
use bc_eventstore::clock;

/// 2030-01-01T00:00:00Z: every scenario starts here.
pub const T0: i64 = 1_893_456_000_000;
const HOUR: i64 = 3_600_000;

/// The scenarios by name.
pub const NAMES: &[&str] = &[
    "fleet_basics",
    "reservation_lifecycle",
    "reservation_endings",
    "agent_life",
    "tenancy",
    "images",
    "instances",
    "webhooks",
];

fn caller(tenant: &str, identity: &str) -> anyhow::Result<Caller> {
    Ok(Caller {
        request_id: Some(format!("req-{identity}")),
        ..Caller::new(tenant.parse()?, identity.parse()?, "user")
    })
}

fn gpu(name: &str, mig: u32) -> anyhow::Result<GpuInfo> {
    Ok(GpuInfo {
        uuid: format!("GPU-{name}").parse()?,
        name: "NVIDIA H100 80GB HBM3".into(),
        memory_mib: 81_559,
        pci_bus_id: None,
        mig_instances: (1..=mig)
            .map(|g| MigInstance { gpu_instance: g, compute_instance: 0, profile: "1g.10gb".into(), memory_mib: 9_856 })
            .collect(),
    })
}

fn request(pool: &PoolId, class: DeviceClass, count: u32) -> ReservationRequest {
    ReservationRequest::hold(pool.clone(), class, count)
}

async fn pool(
    app: &App,
    owner: &Caller,
    site: &SiteId,
    name: &str,
    sharing: Sharing,
    replicas: Option<u32>,
) -> anyhow::Result<PoolId> {
    let policy = PoolPolicy { sharing: SharingPolicy { replicas }, ..PoolPolicy::default() };
    let create = CreatePool {
        site_id: site.clone(),
        name: name.into(),
        class: PoolClass::MetalHost,
        gpu_model: "H100".into(),
        sharing,
        agent: PoolAgent::Bcd,
        policy,
        provider_account_id: None,
    };
    Ok(app.create_pool(owner, create).await?.value)
}

async fn node(app: &App, owner: &Caller, pool: &PoolId, name: &str, gpus: usize, mig: u32) -> anyhow::Result<NodeId> {
    let gpus = (0..gpus).map(|g| gpu(&format!("{name}-{g}"), mig)).collect::<anyhow::Result<Vec<_>>>()?;
    let register = RegisterNode {
        pool_id: pool.clone(),
        name: name.into(),
        role: Role::Host,
        trust: Trust::Platform,
        owner_tenant_id: None,
        gpus,
        resources: Default::default(),
    };
    Ok(app.register_node(owner, register).await?.value)
}

/// Runs a scenario by name on a fresh migrated database.
pub async fn run(name: &str, app: &App) -> anyhow::Result<()> {
    clock::use_sim_clock(app.db(), T0).await?;
    match name {
        "fleet_basics" => fleet_basics(app).await,
        "reservation_lifecycle" => reservation_lifecycle(app).await,
        "reservation_endings" => reservation_endings(app).await,
        "agent_life" => agent_life(app).await,
        "tenancy" => tenancy(app).await,
        "images" => images(app).await,
        "instances" => instances(app).await,
        "webhooks" => webhooks(app).await,
        other => anyhow::bail!("no scenario named {other}"),
    }
}

async fn fleet_basics(app: &App) -> anyhow::Result<()> {
    let owner = caller("root", "operator@platform")?;
    let site = app
        .create_site(
            &owner,
            CreateSite { name: "fra1".into(), iam_region: "eu-central-1".into(), kind: SiteKind::Shared },
        )
        .await?
        .value;
    let whole = pool(app, &owner, &site, "h100", Sharing::Exclusive, None).await?;
    let mig = pool(app, &owner, &site, "h100-mig", Sharing::Mig, None).await?;
    let slots = pool(app, &owner, &site, "h100-slots", Sharing::Timeslice, Some(4)).await?;
    let a = node(app, &owner, &whole, "a", 8, 0).await?;
    node(app, &owner, &mig, "m", 2, 7).await?;
    node(app, &owner, &slots, "s", 2, 0).await?;
    for (tenant, gpus, priority) in [("acme", 8, 10), ("globex", 4, 0)] {
        let quota = [("gpu".to_owned(), gpus), ("gpu.mig".to_owned(), gpus * 2)].into();
        let offer = OfferPool { tenant_id: tenant.parse()?, quota, priority, include_descendants: false };
        app.offer_pool(&owner, &whole, offer.clone()).await?;
        app.offer_pool(&owner, &mig, offer).await?;
    }
    app.set_quota(&owner, &whole, &"globex".parse()?, [("gpu".to_owned(), 6)].into()).await?;
    app.create_project(&caller("acme", "admin@acme")?, "research".into()).await?;
    clock::set_sim_clock(app.db(), T0 + 60_000).await?;
    app.node_verb(&owner, &a, NodeVerb::Cordon, Some("firmware update".into())).await?;
    app.node_verb(&owner, &a, NodeVerb::StartMaintenance, None).await?;
    clock::set_sim_clock(app.db(), T0 + 120_000).await?;
    app.node_verb(&owner, &a, NodeVerb::EndMaintenance, None).await?;
    app.node_verb(&owner, &a, NodeVerb::Uncordon, None).await?;
    // A second project, deleted: the projects table keeps the first only.
    let admin = caller("acme", "admin@acme")?;
    let scratch = app.create_project(&admin, "scratch".into()).await?.value;
    app.delete_project(&admin, &scratch).await?;
    // globex's offering of the MIG pool withdrawn.
    app.revoke_offer(&owner, &mig, &"globex".parse()?).await?;
    // A site and a pool that were tried and taken down: renamed, re-policied, deleted, and the site after it.
    let trial = app
        .create_site(
            &owner,
            CreateSite { name: "trial".into(), iam_region: "eu-west-1".into(), kind: SiteKind::Shared },
        )
        .await?
        .value;
    let tried = pool(app, &owner, &trial, "tried", Sharing::Exclusive, None).await?;
    let policy = PoolPolicy { disruption_budget: 0.5, ..PoolPolicy::default() };
    let change = bc_domain::pool::PoolChange { name: Some("tried-b".into()), policy: Some(policy), sharing: None };
    app.update_pool(&owner, &tried, change).await?;
    app.delete_pool(&owner, &tried).await?;
    app.delete_site(&owner, &trial).await?;

    // Provider accounts (their credentials sealed with a bundle of the scenario's own): one that backs a provider
    // pool, its credential replaced; one deleted.
    let dir = std::env::temp_dir().join(format!("bc-scenario-providers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    bc_pki::Bundle::init(&dir, &bc_pki::InitOptions::default())?;
    let sealing = app.clone().with_pki(std::sync::Arc::new(bc_pki::Bundle::load(&dir)?));
    let _ = std::fs::remove_dir_all(&dir);
    let spec = |name: &str| bc_domain::provider::ProviderAccountSpec {
        name: name.into(),
        provider: bc_domain::provider::ProviderKind::BetterCompute,
        endpoint: "https://compute.partner.example".into(),
        settings: [("poolId".to_owned(), "pool_01jd8w2k3m4n5p6q7r8s9t0v1w".to_owned())].into(),
    };
    let partner = sealing.create_provider_account(&owner, spec("partner"), "token-1").await?.value;
    sealing.rotate_provider_credential(&owner, &partner.id, "token-2").await?;
    let spare = sealing.create_provider_account(&owner, spec("spare"), "token-3").await?.value;
    sealing.delete_provider_account(&owner, &spare.id).await?;
    let borrowed = CreatePool {
        site_id: site.clone(),
        name: "borrowed".into(),
        class: PoolClass::Provider,
        gpu_model: "H100".into(),
        sharing: Sharing::Exclusive,
        agent: PoolAgent::None,
        policy: PoolPolicy::default(),
        provider_account_id: Some(partner.id.to_string()),
    };
    app.create_pool(&owner, borrowed).await?;

    // Flavors: a public one kept, a private one deleted.
    let sizes = bc_domain::flavor::FlavorSizes { vcpu: 16, memory_gib: 128, gpus: 1, disk: 200 };
    app.create_flavor(&owner, "g1.large", sizes, bc_domain::image::Visibility::Public).await?;
    let scratch = app.create_flavor(&owner, "scratch", sizes, bc_domain::image::Visibility::Private).await?.value;
    app.delete_flavor(&owner, &scratch.id).await?;
    Ok(())
}

/// A customer onboarded through the API: its tenant and a child, identities with tokens (one revoked, one
/// identity deleted), grants (one revoked), a limit on a pool (one deleted), and a suspension lifted.
/// Images (a private one, the same bytes published signed, another version, a deletion) and the profile
/// versions that deploy one.
async fn images(app: &App) -> anyhow::Result<()> {
    use bc_commands::images::{ImagePolicy, ImageSigners, UploadImage};
    use bc_domain::image::{ImageFormat, Visibility};
    use ed25519_dalek::Signer as _;
    use sha2::Digest as _;
    let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
    let policy = ImagePolicy { signers: ImageSigners::none().with("release", key.verifying_key()), max_bytes: 1 << 20 };
    let app = app.clone().with_image_policy(policy);
    let owner = caller("root", "operator@platform")?;
    let acme = caller("acme", "boss@acme")?;
    let upload = |name: &str, version: &str, visibility, data: &[u8], signed: bool| {
        let digest = sha2::Sha256::digest(data);
        UploadImage {
            name: name.into(),
            version: version.into(),
            format: ImageFormat::Raw,
            visibility,
            sha256: hex::encode(digest),
            size_bytes: Some(data.len() as u64),
            signer: signed.then(|| "release".to_owned()),
            signature: signed.then(|| hex::encode(key.sign(&digest).to_bytes())),
        }
    };
    let body = |data: &'static [u8]| futures_util::stream::iter([Ok::<_, std::io::Error>(data)]);
    let first: &'static [u8] = b"an operating system, byte for byte";
    let second: &'static [u8] = b"the next release of it";
    app.upload_image(&acme, upload("app", "1", Visibility::Private, first, false), body(first)).await?;
    clock::set_sim_clock(app.db(), T0 + 60_000).await?;
    app.upload_image(&owner, upload("base", "1", Visibility::Public, first, true), body(first)).await?;
    let old = app.upload_image(&owner, upload("base", "0", Visibility::Public, second, false), body(second)).await?;
    clock::set_sim_clock(app.db(), T0 + 120_000).await?;
    app.delete_image(&owner, &old.image.id).await?;
    let base = app.list_images(&owner, &bc_commands::reads::Page::first(10)).await?.items;
    let base = base.iter().find(|i| i.name == "base").ok_or_else(|| anyhow::anyhow!("no base image"))?;
    let spec = bc_domain::profile::ProfileSpec {
        target: bc_domain::profile::ProfileTarget::Metal,
        drivers: [
            (bc_domain::profile::Concern::Power, "redfish".to_owned()),
            (bc_domain::profile::Concern::Boot, "redfish".to_owned()),
            (bc_domain::profile::Concern::Deploy, "bcd".to_owned()),
        ]
        .into(),
        image_id: Some(base.id.clone()),
        allow_unverified_image: false,
        user_data: Some("#cloud-config\n".into()),
        steps: Vec::new(),
        host_config: [("hostname".to_owned(), "gpu-1".to_owned())].into(),
        acceptance: vec!["gpu-count=8".into()],
    };
    let first = app.create_profile(&owner, "gpu-node", spec.clone()).await?.value;
    clock::set_sim_clock(app.db(), T0 + 180_000).await?;
    app.create_profile(&owner, "gpu-node", spec).await?;
    app.delete_profile(&owner, &first.id).await?;
    enrolled_machine(&app, &owner).await
}

/// A machine enrolled from its BMC, taken through its lifecycle, and failed by the controller when stuck.
async fn enrolled_machine(app: &App, owner: &Caller) -> anyhow::Result<()> {
    use bc_domain::node::lifecycle::default_drivers;
    use bc_domain::node::{BmcDriver, NodeBmc, ProvisionState};
    use bc_domain::workflow::{Report, StepState, WorkflowKind};
    let dir = std::env::temp_dir().join(format!("bc-scenario-pki-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    bc_pki::Bundle::init(&dir, &bc_pki::InitOptions::default())?;
    let app = app.clone().with_pki(std::sync::Arc::new(bc_pki::Bundle::load(&dir)?));
    let _ = std::fs::remove_dir_all(&dir);
    let site = app
        .create_site(owner, CreateSite { name: "ams1".into(), iam_region: "eu-west-1".into(), kind: SiteKind::Shared })
        .await?
        .value;
    let metal = pool(&app, owner, &site, "metal", Sharing::Exclusive, None).await?;
    let enrol = bc_commands::lifecycle::EnrolNode {
        pool_id: metal,
        name: "metal-1".into(),
        bmc: NodeBmc {
            driver: BmcDriver::Redfish,
            address: "https://10.0.0.10".into(),
            system_id: Some("1".into()),
            insecure_tls: false,
            drivers: default_drivers(BmcDriver::Redfish, &Default::default()),
            boot_mac: None,
        },
        username: "admin".into(),
        password: "secret".into(),
    };
    let node = app.enrol_node(owner, enrol).await?.value;
    let worker = Worker::new(app.clone(), WorkerConfig::default());
    let mut now = T0 + 240_000;
    clock::set_sim_clock(app.db(), now).await?;
    // An inspection whose first step times out once, then runs to the end: the machine is ready.
    let inspect = app.start_workflow(owner, &node, WorkflowKind::Inspect, None).await?.value;
    worker.run_until_idle().await?;
    now += 121_000;
    clock::set_sim_clock(app.db(), now).await?;
    worker.run_until_idle().await?;
    for _ in 0..8 {
        let wf = app.workflow(&inspect).await?;
        let Some((index, step, StepState::Running { attempt, .. })) = wf.current() else { break };
        let detail = Some(format!("{} done", step.name));
        app.report_step(owner, &inspect, index, *attempt, step.runs_on, Report::Succeeded { detail }).await?;
        worker.run_until_idle().await?;
    }
    // The site agent reported the machine off after the inspection's last step.
    app.observe_power(owner, &node, bc_domain::node::Power::Off).await?;
    // Rescued, then a release that the operator cancels: the machine is failed.
    app.change_provision_state(owner, &node, ProvisionState::Rescue, Some("scenario".into())).await?;
    let release = app.start_workflow(owner, &node, WorkflowKind::Release, None).await?.value;
    worker.run_until_idle().await?;
    app.cancel_workflow(owner, &release, Some("scenario".into())).await?;
    // Inspected again, nobody answers: every attempt of the first step runs out, and the workflow fails.
    app.start_workflow(owner, &node, WorkflowKind::Inspect, None).await?;
    for _ in 0..4 {
        worker.run_until_idle().await?;
        now += 121_000;
        clock::set_sim_clock(app.db(), now).await?;
    }
    worker.run_until_idle().await?;
    // Taken out of failure by hand and left in commissioning: the lifecycle controller fails it after an hour.
    app.change_provision_state(owner, &node, ProvisionState::Inspecting, Some("scenario".into())).await?;
    app.change_provision_state(owner, &node, ProvisionState::Commissioning, Some("scenario".into())).await?;
    clock::set_sim_clock(app.db(), now + 3_600_000).await?;
    worker.run_until_idle().await?;
    Ok(())
}

async fn tenancy(app: &App) -> anyhow::Result<()> {
    use bc_domain::tenancy::{Relation, SessionKind};
    let owner = caller("root", "operator@platform")?;
    let site = app
        .create_site(
            &owner,
            CreateSite { name: "fra1".into(), iam_region: "eu-central-1".into(), kind: SiteKind::Shared },
        )
        .await?
        .value;
    let whole = pool(app, &owner, &site, "h100", Sharing::Exclusive, None).await?;
    let (initech, ml) = ("initech".parse()?, "initech-ml".parse()?);
    app.create_tenant(&owner, &initech, &"root".parse()?, "Initech").await?;
    app.create_tenant(&owner, &ml, &initech, "Initech ML").await?;
    let boss = app.create_identity(&owner, &initech, "boss@initech", SessionKind::User, true).await?.value;
    let ci = app.create_identity(&owner, &initech, "ci@initech", SessionKind::Service, false).await?.value;
    clock::set_sim_clock(app.db(), T0 + 60_000).await?;
    app.issue_token(&owner, &initech, &boss.id, None).await?;
    let old = app.issue_token(&owner, &initech, &ci.id, None).await?.value;
    app.revoke_token(&owner, &initech, &ci.id, &old.id).await?;
    app.delete_identity(&owner, &initech, &ci.id).await?;
    app.offer_pool(
        &owner,
        &whole,
        OfferPool {
            tenant_id: initech.clone(),
            quota: [("gpu".to_owned(), 8)].into(),
            priority: 0,
            include_descendants: true,
        },
    )
    .await?;
    app.create_grant(&owner, &initech, "*", "*", Relation::User).await?;
    let scratch = app.create_grant(&owner, &initech, "boss@initech", whole.as_str(), Relation::Operator).await?.value;
    app.revoke_grant(&owner, &initech, &scratch.id).await?;
    app.create_limit(&owner, &whole, Relation::User, Some(8), Some(72)).await?;
    let loose = app.create_limit(&owner, &whole, Relation::Viewer, Some(1), None).await?.value;
    app.delete_limit(&owner, &whole, &loose.id).await?;
    clock::set_sim_clock(app.db(), T0 + 120_000).await?;
    app.set_tenant_suspended(&owner, &ml, Some("invoice overdue")).await?;
    app.set_tenant_suspended(&owner, &ml, None).await?;
    app.set_tenant_suspended(&owner, &initech, Some("audit")).await?;
    Ok(())
}

async fn reservation_lifecycle(app: &App) -> anyhow::Result<()> {
    let owner = caller("root", "operator@platform")?;
    let site = app
        .create_site(
            &owner,
            CreateSite { name: "fra1".into(), iam_region: "eu-central-1".into(), kind: SiteKind::Shared },
        )
        .await?
        .value;
    let whole = pool(app, &owner, &site, "h100", Sharing::Exclusive, None).await?;
    node(app, &owner, &whole, "a", 4, 0).await?;
    node(app, &owner, &whole, "b", 4, 0).await?;
    let offer = OfferPool {
        tenant_id: "acme".parse()?,
        quota: [("gpu".to_owned(), 4)].into(),
        priority: 0,
        include_descendants: false,
    };
    app.offer_pool(&owner, &whole, offer).await?;
    let acme = caller("acme", "alice@acme")?;
    let worker = Worker::new(app.clone(), WorkerConfig::default());
    let advance = |at: i64| {
        let (app, worker) = (app.clone(), worker.clone());
        async move {
            clock::set_sim_clock(app.db(), at).await?;
            worker.run_until_idle().await?;
            anyhow::Ok(())
        }
    };

    // Placed now and active; placed for later; a gang; one that waits for quota.
    let now = app
        .reserve(&acme, Reserve { idempotency_key: "now".into(), request: request(&whole, DeviceClass::Gpu, 2) })
        .await?
        .value;
    let mut later = request(&whole, DeviceClass::Gpu, 2);
    later.start_ms = Some(T0 + 2 * HOUR);
    later.lease_seconds = Some(1800);
    let later = app.reserve(&acme, Reserve { idempotency_key: "later".into(), request: later }).await?.value;
    let mut gang = request(&whole, DeviceClass::Gpu, 4);
    gang.devices.topology = Topology::Gang { nodes: 2 };
    let gang = app.reserve(&owner, Reserve { idempotency_key: "gang".into(), request: gang }).await?.value;
    let waiting = app
        .reserve(&acme, Reserve { idempotency_key: "waiting".into(), request: request(&whole, DeviceClass::Gpu, 2) })
        .await?
        .value;
    advance(T0 + 1_000).await?;

    // Renew the later one's lease, extend the active one, cancel the waiting one, release the gang.
    advance(T0 + 20 * 60_000).await?;
    app.renew_reservation(&acme, &later.reservation.id).await?;
    app.extend_reservation(&acme, &now.reservation.id, T0 + 90 * 60_000).await?;
    if app.reservation(&acme, &waiting.reservation.id).await?.value.state
        == bc_domain::reservation::ReservationState::Pending
    {
        app.cancel_reservation(&acme, &waiting.reservation.id, Some("not needed".into())).await?;
    }
    app.release_reservation(&owner, &gang.reservation.id).await?;
    advance(T0 + 30 * 60_000).await?;
    // The later one's lease lapses before its start; the active one's window ends.
    advance(T0 + 2 * HOUR).await?;
    advance(T0 + 3 * HOUR).await?;

    // A pool whose reservations hold vCPUs and memory beside their GPUs, lent twice over: booked, extended, ended.
    let create = CreatePool {
        site_id: site.clone(),
        name: "vps".into(),
        class: PoolClass::VpsHost,
        gpu_model: "H100".into(),
        sharing: Sharing::Exclusive,
        agent: PoolAgent::Bcd,
        policy: PoolPolicy { overcommit: [("vcpu".to_owned(), 2.0)].into(), ..PoolPolicy::default() },
        provider_account_id: None,
    };
    let vps = app.create_pool(&owner, create).await?.value;
    let gpus = vec![gpu("v-0", 0)?, gpu("v-1", 0)?];
    let resources = [("vcpu".to_owned(), 8), ("memoryGiB".to_owned(), 32)].into();
    let register = RegisterNode {
        pool_id: vps.clone(),
        name: "v".into(),
        role: Role::Host,
        trust: Trust::Platform,
        owner_tenant_id: None,
        gpus,
        resources,
    };
    app.register_node(&owner, register).await?;
    let mut scalars = request(&vps, DeviceClass::Gpu, 1);
    scalars.resources = [("vcpu".to_owned(), 12), ("memoryGiB".to_owned(), 16)].into();
    let held = app.reserve(&owner, Reserve { idempotency_key: "scalars".into(), request: scalars }).await?.value;
    advance(T0 + 3 * HOUR + 1_000).await?;
    app.extend_reservation(&owner, &held.reservation.id, T0 + 5 * HOUR).await?;
    advance(T0 + 5 * HOUR).await?;
    Ok(())
}

/// A site with one exclusive pool of `nodes` registered 2-GPU nodes, offered to acme with a quota of `gpus`.
async fn small_fleet(app: &App, owner: &Caller, nodes: &[&str], gpus: u32) -> anyhow::Result<(PoolId, Vec<NodeId>)> {
    let create = CreateSite { name: "fra1".into(), iam_region: "eu-central-1".into(), kind: SiteKind::Shared };
    let site = app.create_site(owner, create).await?.value;
    let pool_id = pool(app, owner, &site, "h100", Sharing::Exclusive, None).await?;
    let mut ids = Vec::new();
    for name in nodes {
        ids.push(node(app, owner, &pool_id, name, 2, 0).await?);
    }
    let offer = OfferPool {
        tenant_id: "acme".parse()?,
        quota: [("gpu".to_owned(), gpus)].into(),
        priority: 0,
        include_descendants: false,
    };
    app.offer_pool(owner, &pool_id, offer).await?;
    Ok((pool_id, ids))
}

/// Every way a reservation ends early: denied, cancelled with a reason, placed again off a drained node,
/// failed at its deadline; and a node drained and deleted with force.
async fn reservation_endings(app: &App) -> anyhow::Result<()> {
    let owner = caller("root", "operator@platform")?;
    let acme = caller("acme", "alice@acme")?;
    let worker = Worker::new(app.clone(), WorkerConfig::default());
    let (pool_id, nodes) = small_fleet(app, &owner, &["a", "b"], 4).await?;
    let reserve = |key: &str, request: ReservationRequest| Reserve { idempotency_key: key.into(), request };

    let refused = reserve("too-big", request(&pool_id, DeviceClass::Gpu, 2));
    app.deny_reservation(&acme, refused, "users of this pool may reserve up to 1 H100".into()).await?;

    let mut later = request(&pool_id, DeviceClass::Gpu, 2);
    later.start_ms = Some(T0 + HOUR);
    let cancelled = app.reserve(&acme, reserve("cancelled", later.clone())).await?.value.reservation;
    app.cancel_reservation(&acme, &cancelled.id, Some("plans changed".into())).await?;

    // A future reservation on a node that is drained moves to the other node before its start.
    let moved = app.reserve(&acme, reserve("moved", later)).await?.value.reservation;
    let from = moved.allocations.first().map(|a| a.node_id.clone()).ok_or_else(|| anyhow::anyhow!("placed"))?;
    app.drain_node(&owner, &from, false, Some("fans".into())).await?;
    worker.run_until_idle().await?;

    // The other node is held for the next hour: a request that must be placed within a minute fails.
    let remaining = nodes.iter().find(|n| **n != from).ok_or_else(|| anyhow::anyhow!("two nodes"))?;
    let mut waiting = request(&pool_id, DeviceClass::Gpu, 2);
    waiting.deadline_ms = Some(T0 + 60_000);
    app.reserve(&owner, reserve("holds-the-rest", request(&pool_id, DeviceClass::Gpu, 2))).await?;
    app.reserve(&acme, reserve("waits", waiting)).await?;
    clock::set_sim_clock(app.db(), T0 + 61_000).await?;
    worker.run_until_idle().await?;

    app.delete_node(&owner, remaining, true, Some("decommissioned".into())).await?;
    worker.run_until_idle().await?;
    Ok(())
}

/// A machine's life through its agent: a join token, the join and adoption, heartbeats that observe its spec,
/// a new spec, an inventory that lost a GPU and found it again, a rejoin after a GPU swap, and silence until
/// the node is lost.
async fn agent_life(app: &App) -> anyhow::Result<()> {
    use bc_agent::simulate::{self, Simulated};
    use bc_domain::agent::{Heartbeat, JoinRequest};
    use bc_domain::inventory::SectionHashes;

    let owner = caller("root", "operator@platform")?;
    let create = CreateSite { name: "fra1".into(), iam_region: "eu-central-1".into(), kind: SiteKind::Shared };
    let site = app.create_site(&owner, create).await?.value;
    let lost_after = PoolPolicy { lost_after: 120, ..PoolPolicy::default() };
    let create = CreatePool {
        site_id: site,
        name: "h100".into(),
        class: PoolClass::MetalHost,
        gpu_model: "H100".into(),
        sharing: Sharing::Exclusive,
        agent: PoolAgent::Bcd,
        policy: lost_after,
        provider_account_id: None,
    };
    let pool_id = app.create_pool(&owner, create).await?.value;
    let spec: Simulated = "2xH100".parse().map_err(anyhow::Error::msg)?;
    let mut document = simulate::inventory("gpu-a", &spec);
    let join = |token: String, document: &bc_domain::inventory::NodeInventory| JoinRequest {
        join_token: token,
        agent_version: "replay".into(),
        inventory: document.report(&SectionHashes::new()),
        csr: None,
        role: None,
    };

    let token = app.create_join_token(&owner, &pool_id, 3600).await?.value.token;
    let joined = app.join(join(token, &document)).await?;
    let auth = app.authenticate_node(&joined.credential).await?;
    // The agent's clock is read from the machine: the database server's clock, so no skew is raised.
    let server_ms = || {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
    };
    let beat = |observed: u64| Heartbeat {
        session_id: joined.session.session_id.clone(),
        observed_generation: observed,
        clock_ms: server_ms(),
        gpu_utilization: Vec::new(),
    };
    app.heartbeat(&auth, &beat(joined.session.generation)).await?;
    let labels = [("rack".to_owned(), "r12".to_owned())].into();
    let generation = app.set_node_spec(&owner, &joined.node_id, labels, None).await?.value;
    app.heartbeat(&auth, &beat(generation)).await?;

    // A GPU falls off the bus, then comes back.
    let gone = document.gpus.pop().ok_or_else(|| anyhow::anyhow!("a GPU"))?;
    app.report_inventory(&auth, document.report(&joined.session.inventory_hashes)).await?;
    document.gpus.push(gone);
    let held = app.node_inventory(&owner, &joined.node_id).await?.document;
    app.report_inventory(&auth, document.report(&held.hashes())).await?;

    // Reinstalled with a GPU swapped, it joins again with a new token and is the same node.
    let mut swapped = document.clone();
    swapped.gpus[1].info.uuid = "GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0".parse()?;
    let token = app.create_join_token(&owner, &pool_id, 3600).await?.value.token;
    app.join(join(token, &swapped)).await?;

    // Then silence: disconnected, unreachable, lost.
    let worker = Worker::new(app.clone(), WorkerConfig::default());
    for at in [T0 + 45_000, T0 + 90_000, T0 + 130_000] {
        clock::set_sim_clock(app.db(), at).await?;
        worker.sweep_liveness().await?;
        worker.run_until_idle().await?;
    }

    // A token issued and revoked before any machine used it.
    let unused = app.create_join_token(&owner, &pool_id, 3600).await?.value.id;
    app.revoke_join_token(&owner, &pool_id, &unused).await?;
    Ok(())
}

/// An instance's whole life on a vps-host pool's node: made with its reservation, bound and run by the node's
/// agent, stopped, deleted; its allocation released once the node stopped it, and the instance ended with it.
async fn instances(app: &App) -> anyhow::Result<()> {
    use bc_agent::simulate::{self, Simulated};
    use bc_commands::images::UploadImage;
    use bc_commands::instances::{CreateInstance, InstanceReport};
    use bc_domain::agent::{Ack, Heartbeat, JoinRequest};
    use bc_domain::image::{ImageFormat, Visibility};
    use bc_domain::instance::{DesiredState, InstanceState};
    use bc_domain::inventory::SectionHashes;
    use sha2::Digest as _;

    let owner = caller("root", "operator@platform")?;
    let acme = caller("acme", "alice@acme")?;
    let create = CreateSite { name: "vps1".into(), iam_region: "eu-west-1".into(), kind: SiteKind::Shared };
    let site = app.create_site(&owner, create).await?.value;
    let create = CreatePool {
        site_id: site,
        name: "vps".into(),
        class: PoolClass::VpsHost,
        gpu_model: "H100".into(),
        sharing: Sharing::Exclusive,
        agent: PoolAgent::Bcd,
        policy: PoolPolicy::default(),
        provider_account_id: None,
    };
    let pool_id = app.create_pool(&owner, create).await?.value;
    let quota = [("gpu", 2), ("vcpu", 32), ("memoryGiB", 256), ("disk", 1000)].map(|(r, n)| (r.to_owned(), n)).into();
    let offer = OfferPool { tenant_id: acme.tenant_id.clone(), quota, priority: 0, include_descendants: false };
    app.offer_pool(&owner, &pool_id, offer).await?;

    let spec: Simulated = "2xH100".parse().map_err(anyhow::Error::msg)?;
    let document = simulate::inventory("vps-a", &spec);
    let token = app.create_join_token(&owner, &pool_id, 3600).await?.value.token;
    let join = JoinRequest {
        join_token: token,
        agent_version: "replay".into(),
        inventory: document.report(&SectionHashes::new()),
        csr: None,
        role: None,
    };
    let joined = app.join(join).await?;
    let auth = app.authenticate_node(&joined.credential).await?;
    let server_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
    let beat = Heartbeat {
        session_id: joined.session.session_id.clone(),
        observed_generation: joined.session.generation,
        clock_ms: server_ms,
        gpu_utilization: Vec::new(),
    };
    app.heartbeat(&auth, &beat).await?;

    let data: &'static [u8] = b"a guest's disk, byte for byte";
    let upload = UploadImage {
        name: "guest".into(),
        version: "1".into(),
        format: ImageFormat::Raw,
        visibility: Visibility::Public,
        sha256: hex::encode(sha2::Sha256::digest(data)),
        size_bytes: Some(data.len() as u64),
        signer: None,
        signature: None,
    };
    let body = futures_util::stream::iter([Ok::<_, std::io::Error>(data)]);
    let image = app.upload_image(&owner, upload, body).await?.image;
    let sizes = bc_domain::flavor::FlavorSizes { vcpu: 8, memory_gib: 64, gpus: 1, disk: 100 };
    let flavor = app.create_flavor(&owner, "g1.small", sizes, Visibility::Public).await?.value;

    let made = app
        .create_instance(
            &acme,
            CreateInstance {
                idempotency_key: "trainer".into(),
                name: "trainer".into(),
                pool_id: pool_id.clone(),
                flavor_id: flavor.id,
                image_id: image.id,
                project_id: None,
                user_data: "#cloud-config\n".into(),
                duration_s: 3600,
                desired: DesiredState::Running,
            },
        )
        .await?
        .value;
    let id = made.instance.created.instance_id.clone();
    let worker = Worker::new(app.clone(), WorkerConfig::default());
    let ack_all = || async {
        worker.run_until_idle().await?;
        for command in app.agent_commands(&auth, 10).await? {
            app.acknowledge_command(&auth, &command.id, &Ack { ok: true, message: None }).await?;
        }
        worker.run_until_idle().await?;
        anyhow::Ok(())
    };
    ack_all().await?;
    let report = |state, generation| InstanceReport { state, generation, message: None };
    clock::set_sim_clock(app.db(), T0 + 60_000).await?;
    app.report_instance(&auth.node_id, &auth.caller(), &id, &report(InstanceState::Running, 1)).await?;
    clock::set_sim_clock(app.db(), T0 + 120_000).await?;
    app.change_instance(&acme, &id, DesiredState::Stopped).await?;
    app.report_instance(&auth.node_id, &auth.caller(), &id, &report(InstanceState::Stopped, 2)).await?;
    clock::set_sim_clock(app.db(), T0 + 180_000).await?;
    app.change_instance(&acme, &id, DesiredState::Deleted).await?;
    ack_all().await?;
    Ok(())
}

/// A tenant's webhook subscription: created, its secret rotated, a dead letter (written as the deliverer would,
/// under the subscription's lease) replayed, and deleted.
async fn webhooks(app: &App) -> anyhow::Result<()> {
    use bc_commands::webhooks::{Buried, Settled};
    use bc_domain::webhook::WebhookSpec;
    let dir = std::env::temp_dir().join(format!("bc-scenario-webhooks-pki-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    bc_pki::Bundle::init(&dir, &bc_pki::InitOptions::default())?;
    let app = app.clone().with_pki(std::sync::Arc::new(bc_pki::Bundle::load(&dir)?));
    let _ = std::fs::remove_dir_all(&dir);
    let acme = caller("acme", "alice@acme")?;
    let spec = WebhookSpec {
        url: "https://hooks.acme.example/better-compute".into(),
        event_types: vec!["reservation.*".into(), "webhook.deleted".into()],
        description: "acme's operations".into(),
    };
    let made = app.create_webhook(&acme, spec).await?.value.webhook;
    app.rotate_webhook_secret(&acme, &made.id).await?;
    let name = format!("webhook:{}", made.id);
    let lease = bc_eventstore::lease::acquire(app.db(), &name, "scenario", std::time::Duration::from_secs(15))
        .await?
        .ok_or_else(|| anyhow::anyhow!("the subscription's lease is free"))?;
    let position = made.position.clone().ok_or_else(|| anyhow::anyhow!("a cursor"))?.parse()?;
    let buried = Buried { position, event_type: "webhook.created".into(), attempts: 8, error: "answered 500".into() };
    app.settle_webhook(&lease, &made.id, &Settled { buried: vec![buried], ..Settled::default() }).await?;
    app.replay_webhook_dead_letters(&acme, &made.id).await?;
    app.delete_webhook(&acme, &made.id).await?;
    Ok(())
}
