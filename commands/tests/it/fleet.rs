//! Sites, pools, projects, offerings and nodes through the command handlers.

use bc_commands::fleet::{CreatePool, CreateSite, OfferPool};
use bc_commands::nodes::{NodeVerb, RegisterNode};
use bc_domain::node::{Role, Trust};
use bc_domain::pool::{PoolAgent, PoolClass, PoolPolicy, Sharing};
use bc_domain::site::SiteKind;
use bc_eventstore::{TxOptions, sql};

use bc_commands::testing::{Fleet, caller, gpu};

async fn count(fleet: &Fleet, query: &'static str) -> i64 {
    let mut tx = fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let n: i64 = sql::query_scalar(query).fetch_one(tx.conn()).await.expect("count");
    tx.commit().await.expect("commit");
    n
}

#[tokio::test]
async fn bad_input_names_the_field_and_writes_nothing() {
    let fleet = Fleet::new().await;
    let events_before = count(&fleet, "SELECT count(*) FROM events").await;
    let err = fleet
        .app
        .create_site(
            &fleet.owner,
            CreateSite { name: "x".into(), iam_region: "EU_Central".into(), kind: SiteKind::Shared },
        )
        .await
        .expect_err("bad region");
    assert_eq!(err.code(), "INVALID_ARGUMENT");
    assert!(err.to_string().starts_with("iamRegion:"), "{err}");

    let provider = CreatePool {
        site_id: fleet.site.clone(),
        name: "p".into(),
        class: PoolClass::Provider,
        gpu_model: "H100".into(),
        sharing: Sharing::Exclusive,
        agent: PoolAgent::None,
        policy: PoolPolicy::default(),
        provider_account_id: None,
    };
    let err = fleet.app.create_pool(&fleet.owner, provider).await.expect_err("no account");
    assert!(err.to_string().starts_with("providerAccountId:"), "{err}");
    assert_eq!(count(&fleet, "SELECT count(*) FROM events").await, events_before, "nothing written");
}

#[tokio::test]
async fn names_are_unique_within_an_owner_and_sites_are_private() {
    let fleet = Fleet::new().await;
    let err = fleet
        .app
        .create_site(
            &fleet.owner,
            CreateSite { name: "fra1".into(), iam_region: "eu-central-1".into(), kind: SiteKind::Shared },
        )
        .await
        .expect_err("taken");
    assert_eq!(err.code(), "CONFLICT");
    // Another tenant may use the name, and cannot put a pool into the platform's site.
    let acme = caller("acme", "admin@acme");
    fleet
        .app
        .create_site(
            &acme,
            CreateSite { name: "fra1".into(), iam_region: "eu-central-1".into(), kind: SiteKind::Custom },
        )
        .await
        .expect("acme's own fra1");
    let pool = CreatePool {
        site_id: fleet.site.clone(),
        name: "sneaky".into(),
        class: PoolClass::MetalHost,
        gpu_model: "H100".into(),
        sharing: Sharing::Exclusive,
        agent: PoolAgent::Bcd,
        policy: PoolPolicy::default(),
        provider_account_id: None,
    };
    assert_eq!(fleet.app.create_pool(&acme, pool).await.expect_err("not acme's site").code(), "NOT_FOUND");
}

#[tokio::test]
async fn registering_nodes_makes_the_atoms_of_each_sharing_mode() {
    let fleet = Fleet::new().await;
    let exclusive = fleet.pool("whole", Sharing::Exclusive, None).await;
    let mig = fleet.pool("mig", Sharing::Mig, None).await;
    let slots = fleet.pool("slots", Sharing::Timeslice, Some(4)).await;
    fleet.node(&exclusive, "a", 2, 0).await;
    fleet.node(&mig, "b", 1, 3).await;
    fleet.node(&slots, "c", 2, 0).await;

    let mut tx = fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let atoms: Vec<(String, String)> = sql::query_as("SELECT id, class FROM devices WHERE bookable ORDER BY id")
        .fetch_all(tx.conn())
        .await
        .expect("atoms");
    let parents: Vec<String> = sql::query_scalar("SELECT id FROM devices WHERE NOT bookable ORDER BY id")
        .fetch_all(tx.conn())
        .await
        .expect("parents");
    tx.commit().await.expect("commit");
    let atom_ids: Vec<&str> = atoms.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        atom_ids,
        vec![
            "GPU-a-0",
            "GPU-a-1",
            "GPU-b-0/gi1/ci0",
            "GPU-b-0/gi2/ci0",
            "GPU-b-0/gi3/ci0",
            "GPU-c-0/s0",
            "GPU-c-0/s1",
            "GPU-c-0/s2",
            "GPU-c-0/s3",
            "GPU-c-1/s0",
            "GPU-c-1/s1",
            "GPU-c-1/s2",
            "GPU-c-1/s3",
        ]
    );
    assert_eq!(parents, vec!["GPU-b-0", "GPU-c-0", "GPU-c-1"], "partitioned GPUs are never bookable");
    assert_eq!(count(&fleet, "SELECT count(*) FROM nodes WHERE schedulable").await, 3);
}

#[tokio::test]
async fn an_unknown_gpu_model_keeps_the_node_off_the_scheduler_and_a_wrong_one_is_refused() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    let mut odd = gpu("odd-0", 0);
    odd.name = "NVIDIA Imaginary 9000".into();
    fleet
        .app
        .register_node(
            &fleet.owner,
            RegisterNode {
                pool_id: pool.clone(),
                name: "odd".into(),
                role: Role::Host,
                trust: Trust::Platform,
                owner_tenant_id: None,
                gpus: vec![odd],
                resources: Default::default(),
            },
        )
        .await
        .expect("registered");
    let mut tx = fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let (schedulable, reasons): (bool, Vec<String>) =
        sql::query_as("SELECT schedulable, no_schedule_reasons FROM nodes WHERE name = 'odd'")
            .fetch_one(tx.conn())
            .await
            .expect("node");
    tx.commit().await.expect("commit");
    assert!(!schedulable);
    assert_eq!(reasons, vec!["GpuModelUnknown".to_owned()]);

    let mut a100 = gpu("a100-0", 0);
    a100.name = "NVIDIA A100-SXM4-80GB".into();
    let err = fleet
        .app
        .register_node(
            &fleet.owner,
            RegisterNode {
                pool_id: pool,
                name: "a100".into(),
                role: Role::Host,
                trust: Trust::Platform,
                owner_tenant_id: None,
                gpus: vec![a100],
                resources: Default::default(),
            },
        )
        .await
        .expect_err("one model family per pool");
    assert!(err.to_string().starts_with("gpus[0].name:"), "{err}");
}

#[tokio::test]
async fn cordon_and_maintenance_take_a_node_off_the_scheduler_and_back() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    let node = fleet.node(&pool, "a", 1, 0).await;
    let schedulable = || async { count(&fleet, "SELECT count(*) FROM nodes WHERE schedulable").await };
    for (verb, expected) in [
        (NodeVerb::Cordon, 0),
        (NodeVerb::Cordon, 0),
        (NodeVerb::StartMaintenance, 0),
        (NodeVerb::Uncordon, 0),
        (NodeVerb::EndMaintenance, 1),
    ] {
        fleet.app.node_verb(&fleet.owner, &node, verb, Some("test".into())).await.expect("verb");
        assert_eq!(schedulable().await, expected, "after {verb:?}");
    }
    // Cordoning twice recorded one event.
    assert_eq!(count(&fleet, "SELECT count(*) FROM events WHERE event_type = 'node.cordoned'").await, 1);
    let stranger = caller("acme", "eve@acme");
    assert_eq!(
        fleet.app.node_verb(&stranger, &node, NodeVerb::Cordon, None).await.expect_err("not theirs").code(),
        "NOT_FOUND"
    );
}

#[tokio::test]
async fn only_the_owner_offers_a_pool_and_quotas_name_real_resources() {
    let fleet = Fleet::new().await;
    let pool = fleet.pool("whole", Sharing::Exclusive, None).await;
    let acme = caller("acme", "admin@acme");
    let offer = OfferPool {
        tenant_id: "globex".parse().expect("tenant"),
        quota: [("gpu".to_owned(), 4)].into(),
        priority: 0,
        include_descendants: false,
    };
    assert_eq!(fleet.app.offer_pool(&acme, &pool, offer.clone()).await.expect_err("not the owner").code(), "NOT_FOUND");
    fleet.app.offer_pool(&fleet.owner, &pool, offer).await.expect("offer");
    let bad = fleet
        .app
        .set_quota(&fleet.owner, &pool, &"globex".parse().expect("tenant"), [("gpus".to_owned(), 4)].into())
        .await
        .expect_err("unknown resource");
    assert!(bad.to_string().starts_with("quota.gpus:"), "{bad}");
    let missing = fleet
        .app
        .set_quota(&fleet.owner, &pool, &"initech".parse().expect("tenant"), [("gpu".to_owned(), 4)].into())
        .await;
    assert_eq!(missing.expect_err("no offering").code(), "NOT_FOUND");
}
