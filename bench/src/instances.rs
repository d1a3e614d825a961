//! `better-compute-bench instances`: instances created and deleted per second through the command layer with 1, 4
//! and 16 clients, beside pgbench's one-row INSERT on the same cluster in the same run. Each cycle makes an
//! instance (its `binding: instance` reservation of one GPU with the flavor's vCPUs, memory and disk, in one
//! transaction) and deletes it (its reservation, not begun yet, is cancelled, and the instance ends with it): the
//! control plane's side, as if the runtime started instantly. The time from create to `running` with QEMU is the
//! slow instance test's (`api/tests/it/runtime.rs`), which prints it.

use std::path::PathBuf;
use std::time::Duration;

use bc_commands::App;
use bc_commands::images::UploadImage;
use bc_commands::instances::CreateInstance;
use bc_domain::flavor::FlavorSizes;
use bc_domain::id::{FlavorId, ImageId, PoolId};
use bc_domain::image::{ImageFormat, Visibility};
use bc_domain::instance::DesiredState;
use bc_domain::pool::PoolClass;
use bc_eventstore::TxOptions;
use sha2::Digest as _;

use super::reserve::{bench_caller, bench_site, bulk_fleet, h100_pool};
use super::{BenchCluster, PgbenchRun, drive, pgbench};

/// What `bench instances` measures.
#[derive(Debug, Clone)]
pub struct InstancesBenchConfig {
    /// How long each throughput run lasts.
    pub run_for: Duration,
    pub data_dir: Option<PathBuf>,
    pub keep: bool,
}

/// Create-then-delete cycles from `clients` tasks for `run_for`; returns cycles per second.
async fn cycles(
    app: &App,
    pool: &PoolId,
    flavor: &FlavorId,
    image: &ImageId,
    clients: usize,
    run_for: Duration,
) -> anyhow::Result<f64> {
    let (app, pool, flavor, image) = (app.clone(), pool.clone(), flavor.clone(), image.clone());
    drive(clients, run_for, move |client, n| {
        let (app, pool, flavor, image) = (app.clone(), pool.clone(), flavor.clone(), image.clone());
        async move {
            let who = bench_caller(&format!("instances-{clients}-{client}"))?;
            let input = CreateInstance {
                idempotency_key: format!("i{n}"),
                name: format!("bench-{n}"),
                pool_id: pool,
                flavor_id: flavor,
                image_id: image,
                project_id: None,
                user_data: String::new(),
                duration_s: 3600,
                desired: DesiredState::Running,
            };
            let made = app.create_instance(&who, input).await?;
            let id = made.value.instance.created.instance_id;
            app.change_instance(&who, &id, DesiredState::Deleted).await?;
            Ok(())
        }
    })
    .await
}

/// Runs the instances benchmark and prints its figures.
pub async fn instances(config: InstancesBenchConfig) -> anyhow::Result<()> {
    let bench = BenchCluster::start_with(config.data_dir.as_deref(), config.keep, &[]).await?;
    let db = bench.db.clone();
    let narrow = bench.one_row_insert_script().await?;
    let app = App::new(db.clone());
    let owner = bench_caller("operator@bench")?;
    let site = bench_site(&app, &owner).await?;
    let pool = app
        .create_pool(&owner, bc_commands::fleet::CreatePool { class: PoolClass::VpsHost, ..h100_pool(&site, "vps") })
        .await?
        .value;
    bulk_fleet(&db, &pool, &site, 0, 64, 8, 0).await?;
    // Each node lends 128 vCPUs, 1,024 GiB of memory and 8,000 GiB of disk: room for every GPU's instance.
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await?;
    sqlx::query(
        "INSERT INTO node_resources (node_id, resource, capacity)
         SELECT n.id, r.resource, r.capacity FROM nodes AS n,
                (VALUES ('vcpu', 128::bigint), ('memoryGiB', 1024::bigint), ('disk', 8000::bigint))
                    AS r(resource, capacity)
         WHERE n.pool_id = $1",
    )
    .bind(pool.as_str())
    .persistent(false)
    .execute(tx.conn())
    .await?;
    sqlx::raw_sql("ANALYZE").execute(tx.conn()).await?;
    tx.commit().await?;
    let sizes = FlavorSizes { vcpu: 16, memory_gib: 128, gpus: 1, disk: 200 };
    let flavor = app.create_flavor(&owner, "bench", sizes, Visibility::Private).await?.value.id;
    let data: &'static [u8] = b"a guest's disk for the benchmark";
    let upload = UploadImage {
        name: "bench".into(),
        version: "1".into(),
        format: ImageFormat::Raw,
        visibility: Visibility::Private,
        sha256: hex::encode(sha2::Sha256::digest(data)),
        size_bytes: Some(data.len() as u64),
        signer: None,
        signature: None,
    };
    let body = futures_util::stream::iter([Ok::<_, std::io::Error>(data)]);
    let image = app.upload_image(&owner, upload, body).await?.image.id;

    let seconds = config.run_for.as_secs().max(1);
    println!(
        "instances benchmark: PostgreSQL {}, durable cluster in {}, {} CPUs, {seconds} s per run",
        bench.version,
        bench.root.display(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    );
    println!();
    for clients in [1usize, 4, 16] {
        let rust = cycles(&app, &pool, &flavor, &image, clients, config.run_for).await?;
        let run = PgbenchRun::one_row_inserts(&narrow, clients, seconds);
        let inserts = pgbench(&bench.bins, &bench.guard.cluster, run)?;
        println!(
            "  {clients:>2} clients: {rust:>7.1} create-then-delete instance cycles/s   pgbench 1-row INSERT \
             {inserts:>8.0} tx/s (ratio {:.4})",
            rust / inserts,
        );
    }
    db.close().await;
    drop(bench);
    Ok(())
}
