//! A logical backup restored into a cluster whose transaction ids start lower keeps working after `migrate`.

use std::process::Command;

use bc_eventstore::events::{self, ExpectedVersion};
use bc_eventstore::migrate::Migrator;
use bc_eventstore::testing::{self, ScratchCluster, TestDb};
use bc_eventstore::{Db, Error, Position, TxOptions};

use crate::support::{self, event};

fn run(command: &mut Command) {
    let output = command.output().expect("run");
    assert!(output.status.success(), "{command:?}: {}", String::from_utf8_lossy(&output.stderr));
}

#[tokio::test]
async fn a_dump_restored_into_a_younger_cluster_reads_old_events_and_sorts_new_ones_after_them() {
    let t = TestDb::new().await;
    for n in 0..5u64 {
        support::append(&t.db, &format!("s-{}", n % 2), ExpectedVersion::Any, &[event(n)]).await.expect("append");
    }
    let before = support::read_until(&t.db, Position::START, 5).await;
    assert_eq!(before.len(), 5);
    assert!(before[0].position.txid > 3 << 32, "the source runs with txids above 3 * 2^32");

    // pg_dump from the source, pg_restore into a cluster that never had pg_resetwal.
    let server = testing::server();
    let dump_dir = server.scratch_dir("dump");
    let dump = dump_dir.join("events.dump");
    run(Command::new(server.bins().tool("pg_dump")).args(["-Fc", "-f"]).arg(&dump).arg(t.url()));
    let target = ScratchCluster::start(None);
    target.create_database("restored").await;
    run(Command::new(server.bins().tool("pg_restore"))
        .args(["--no-owner", "-d"])
        .arg(target.cluster.url("restored"))
        .arg(&dump));

    let db = Db::connect_lazy_with(target.cluster.connect_options("restored"), &testing::test_db_config());
    // Before migrate, the old events hide behind the horizon and serving is refused.
    assert!(support::read_after(&db, Position::START).await.is_empty());
    let err = events::check_epoch(&db).await.expect_err("serve must refuse");
    assert!(matches!(err, Error::InvalidConfig(_)), "{err}");

    let report = Migrator::embedded().run(&db).await.expect("migrate");
    assert_eq!(report.raised_epoch, Some(2));
    events::check_epoch(&db).await.expect("ready to serve");

    let after = support::read_until(&db, Position::START, 5).await;
    assert_eq!(after, before, "every old event is readable, unchanged, at its old position");

    let appended = support::append(&db, "s-0", ExpectedVersion::Any, &[event(99)]).await.expect("append");
    assert_eq!(appended.position.epoch, 2);
    assert!(appended.position > before[4].position, "new events sort after old ones");
    assert!(appended.position.txid < before[4].position.txid, "although their txids are lower");
    // A reader resuming from a position handed out before the restore gets exactly the new event.
    let resumed = support::read_until(&db, before[4].position, 1).await;
    assert_eq!(resumed.len(), 1);
    assert_eq!(resumed[0].position, appended.position);

    // Migrating again does not raise the epoch again.
    assert_eq!(Migrator::embedded().run(&db).await.expect("migrate").raised_epoch, None);
    let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
    assert_eq!(events::current_epoch(&mut tx).await.expect("epoch"), 2);
    tx.commit().await.expect("commit");
    db.close().await;
}
