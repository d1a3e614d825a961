//! Helpers for other crates' tests (feature `testing`): running the read models until they caught up.

use std::time::Duration;

use bc_eventstore::{Db, TxOptions, lease, sql};

use crate::{framework, models};

/// Runs every read model until it has passed every event in the log.
pub async fn catch_up(db: &Db) {
    catch_up_in(db, 200).await;
}

/// [`catch_up`] in batches of `batch` events.
pub async fn catch_up_in(db: &Db, batch: u32) {
    let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let total: i64 = sql::query_scalar("SELECT count(*) FROM events").fetch_one(tx.conn()).await.expect("count");
    tx.commit().await.expect("commit");
    for projection in models::read_models() {
        let held = lease::acquire(db, &projection.lease_name(), "prc_test", Duration::from_secs(60))
            .await
            .expect("acquire")
            .expect("free");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            framework::step(db, projection.as_ref(), &held, batch).await.expect("step");
            let mut tx = db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
            let checkpoint =
                framework::lock_checkpoint(&mut tx, projection.name(), projection.version()).await.expect("checkpoint");
            tx.commit().await.expect("commit");
            if checkpoint.events_passed >= total {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{} never caught up", projection.name());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        lease::release(db, &held).await.expect("release");
    }
}
