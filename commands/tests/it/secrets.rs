//! Sealed secrets against real PostgreSQL: what the table holds is never the secret, and it opens only for
//! the row it was sealed for, with the bundle it was sealed with.

use std::sync::Arc;

use bc_commands::testing::Fleet;
use bc_eventstore::{TxOptions, sql};

fn bundle(name: &str) -> Arc<bc_pki::Bundle> {
    let dir = bc_eventstore::testing::server().scratch_dir(name);
    let _ = std::fs::remove_dir_all(&dir);
    Arc::new(bc_pki::Bundle::init(&dir, &bc_pki::InitOptions::default()).expect("bundle"))
}

#[tokio::test]
async fn a_sealed_secret_is_stored_encrypted_and_opens_only_for_its_row_with_its_bundle() {
    let fleet = Fleet::new().await;
    let app = fleet.app.clone().with_pki(bundle("secrets-a"));
    app.seal_secret("bmc-password", "node_1", b"hunter2-hunter2").await.expect("seal");
    let mut tx = fleet.t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let stored: Vec<u8> = sql::query_scalar("SELECT sealed FROM sealed_secrets WHERE kind = 'bmc-password'")
        .fetch_one(tx.conn())
        .await
        .expect("row");
    let in_events: i64 = sql::query_scalar(
        "SELECT count(*) FROM events WHERE position('hunter2' in encode(payload, 'escape')) > 0
                                        OR position('hunter2' in encode(metadata, 'escape')) > 0",
    )
    .fetch_one(tx.conn())
    .await
    .expect("events");
    tx.commit().await.expect("commit");
    assert!(!stored.windows(7).any(|w| w == b"hunter2"), "the table must not hold the secret in the clear");
    assert_eq!(in_events, 0, "no event carries the secret");
    assert_eq!(
        app.open_secret("bmc-password", "node_1").await.expect("open").as_deref(),
        Some(&b"hunter2-hunter2"[..])
    );
    assert_eq!(app.open_secret("bmc-password", "node_2").await.expect("none"), None);
    // Replacing keeps one row; the new value opens.
    app.seal_secret("bmc-password", "node_1", b"another").await.expect("replace");
    assert_eq!(app.open_secret("bmc-password", "node_1").await.expect("open").as_deref(), Some(&b"another"[..]));

    // Copied onto another row, it does not open there.
    let mut tx = fleet.t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    sql::query("INSERT INTO sealed_secrets (kind, owner_id, sealed) SELECT kind, 'node_2', sealed FROM sealed_secrets")
        .execute(tx.conn())
        .await
        .expect("copy");
    tx.commit().await.expect("commit");
    assert!(app.open_secret("bmc-password", "node_2").await.is_err(), "a copied secret must not open");
    // Another bundle cannot open it; without a bundle nothing is sealed or opened.
    let other = fleet.app.clone().with_pki(bundle("secrets-b"));
    assert!(other.open_secret("bmc-password", "node_1").await.is_err());
    assert!(fleet.app.seal_secret("bmc-password", "node_3", b"x").await.is_err());
}
