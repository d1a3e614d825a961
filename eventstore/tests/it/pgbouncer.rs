//! The event log, migrations, leases and the work queue through Debian's PgBouncer in transaction mode, with
//! fewer server connections than clients, so consecutive transactions of one client land on different server
//! connections. Session state, named prepared statements or startup parameters PgBouncer rejects would
//! fail here.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use bc_eventstore::events::{self, ExpectedVersion, SubscribeOptions};
use bc_eventstore::migrate::Migrator;
use bc_eventstore::queue::{self, Enqueue};
use bc_eventstore::testing::{self, ScratchCluster};
use bc_eventstore::{Db, DbConfig, Position, TxOptions, clock, lease};
use futures_util::StreamExt as _;
use sqlx::postgres::PgConnectOptions;

use crate::support::{self, event};

use bc_eventstore::testing::BOUNCER_PORT;

struct Bouncer {
    child: Child,
    dir: PathBuf,
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The harness's PgBouncer with three server connections, in front of `backend_socket_dir`.
fn start_bouncer(backend_socket_dir: &Path) -> Bouncer {
    let server = testing::server();
    let dir = server.scratch_dir("pgbouncer");
    let child = testing::start_pgbouncer(server.run_as(), &dir, backend_socket_dir, 3);
    server.kill_at_exit(child.id());
    Bouncer { child, dir }
}

async fn wait_until_accepting(options: &PgConnectOptions, bouncer: &Bouncer) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    // The same startup parameters the pool sends: sqlx's defaults include one PgBouncer refuses.
    let options = bc_eventstore::db::pgbouncer_safe(options.clone());
    loop {
        let error = match <sqlx::PgConnection as sqlx::Connection>::connect_with(&options).await {
            Ok(_) => return,
            Err(err) => err,
        };
        assert!(
            tokio::time::Instant::now() < deadline,
            "pgbouncer never accepted connections ({error}): {}",
            std::fs::read_to_string(bouncer.dir.join("pgbouncer.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_event_log_works_through_pgbouncer_in_transaction_mode() {
    let backend = ScratchCluster::start(Some(3));
    backend.create_database("through_bouncer").await;
    let bouncer = start_bouncer(&backend.cluster.socket_dir());
    let options = PgConnectOptions::new()
        .socket(&bouncer.dir)
        .port(BOUNCER_PORT)
        .username("postgres")
        .database("through_bouncer");
    wait_until_accepting(&options, &bouncer).await;

    // Twelve client connections share three server connections.
    let config = DbConfig { max_connections: 12, ..testing::test_db_config() };
    let db = Db::connect_lazy_with(options, &config);
    Migrator::embedded().run(&db).await.expect("migrate through pgbouncer");

    const WRITERS: u64 = 6;
    const APPENDS: u64 = 40;
    let subscription = events::subscribe(
        db.clone(),
        Position::START,
        SubscribeOptions { batch_size: 50, poll_interval: Duration::from_millis(5) },
    );
    let collector = tokio::spawn(async move {
        let mut subscription = std::pin::pin!(subscription);
        let mut received = Vec::new();
        while received.len() < (WRITERS * APPENDS) as usize {
            let next = tokio::time::timeout(Duration::from_secs(60), subscription.next()).await;
            received.push(next.expect("an event in time").expect("open").expect("read through pgbouncer"));
        }
        received
    });
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let db = db.clone();
        writers.push(tokio::spawn(async move {
            for n in 0..APPENDS {
                support::append(&db, &format!("w-{w}"), ExpectedVersion::Exact(n as u32), &[event(n)])
                    .await
                    .expect("append through pgbouncer");
            }
        }));
    }
    for writer in writers {
        writer.await.expect("writer");
    }
    let received = collector.await.expect("subscriber");
    assert!(received.windows(2).all(|w| w[0].position < w[1].position));

    // The rest of the store's statements take the same path.
    clock::use_sim_clock(&db, 1_893_456_000_000).await.expect("sim clock");
    assert_eq!(clock::compute_now_mode(&db).await.expect("mode"), clock::ClockMode::Sim);
    let held = lease::acquire(&db, "shard:0", "prc_x", Duration::from_secs(15)).await.expect("lease").expect("free");
    let mut tx = lease::begin_fenced(&db, &held, TxOptions::COMMAND).await.expect("fenced");
    queue::enqueue(&mut tx, &[Enqueue { key: "k", shard: 0, not_before_ms: None }]).await.expect("enqueue");
    tx.commit().await.expect("commit");
    let mut tx = db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    let items = queue::claim(&mut tx, &[0], 10, Duration::from_secs(30)).await.expect("claim");
    assert!(queue::complete(&mut tx, &items[0]).await.expect("complete"));
    tx.commit().await.expect("commit");
    db.close().await;
}
