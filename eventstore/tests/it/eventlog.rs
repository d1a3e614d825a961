//! The event log: appends, conflicts, stream reads, decoding and upcasting.

use bc_domain::event::{EventMetadata, Upcasters};
use bc_eventstore::events::{self, AppendBatch, ExpectedVersion, NewEvent};
use bc_eventstore::testing::TestDb;
use bc_eventstore::{Error, Position, TxOptions};

use crate::support::{self, Counted, event};

#[tokio::test]
async fn append_then_read_back_in_order() {
    let t = TestDb::new().await;
    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    let batch = [event(1), event(2), event(3)];
    let appended = events::append(
        &mut tx,
        AppendBatch {
            stream_id: "s-1",
            tenant_id: Some("ten_a"),
            expected: ExpectedVersion::NO_STREAM,
            events: &batch,
        },
    )
    .await
    .expect("append");
    tx.commit().await.expect("commit");
    assert_eq!((appended.first_version, appended.last_version), (1, 3));
    assert!(appended.position.txid > 1 << 32, "the harness runs with txids above 2^32: {}", appended.position);
    assert_eq!(appended.position.epoch, 1);

    let read = support::read_until(&t.db, Position::START, 3).await;
    assert_eq!(read.len(), 3);
    assert_eq!(read.iter().map(|e| e.stream_version).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert!(read.windows(2).all(|w| w[0].position < w[1].position));
    assert_eq!(read[2].position, appended.position);
    assert_eq!(read[0].tenant_id.as_deref(), Some("ten_a"));
    let decoded: Counted = read[1].decode(&Upcasters::new()).expect("decode");
    assert_eq!(decoded, Counted { n: 2 });

    // Reading after a position returns only what follows it.
    let rest = support::read_after(&t.db, read[0].position).await;
    assert_eq!(rest.iter().map(|e| e.stream_version).collect::<Vec<_>>(), vec![2, 3]);
}

#[tokio::test]
async fn a_wrong_expected_version_is_a_conflict_and_writes_nothing() {
    let t = TestDb::new().await;
    support::append(&t.db, "s", ExpectedVersion::NO_STREAM, &[event(1)]).await.expect("first");
    let err = support::append(&t.db, "s", ExpectedVersion::Exact(5), &[event(2)]).await.expect_err("conflict");
    assert!(matches!(err, Error::Conflict { expected: 5, actual: Some(1), .. }), "{err}");
    assert_eq!(err.code(), "CONFLICT");
    let err = support::append(&t.db, "s", ExpectedVersion::NO_STREAM, &[event(2)]).await.expect_err("conflict");
    assert!(matches!(err, Error::Conflict { expected: 0, actual: Some(1), .. }), "{err}");

    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    assert_eq!(events::stream_version(&mut tx, "s").await.expect("version"), 1);
    let all = events::read_stream(&mut tx, "s", 0, 100).await.expect("read");
    tx.commit().await.expect("commit");
    assert_eq!(all.len(), 1);
}

#[tokio::test]
async fn two_appends_with_the_same_expected_version_one_commits_the_other_conflicts() {
    let t = TestDb::new().await;
    support::append(&t.db, "race", ExpectedVersion::NO_STREAM, &[event(0)]).await.expect("seed");

    // The first transaction appends version 2 and stays open; the second appends version 2 too and waits
    // on the unique key until the first commits, then fails.
    let mut first = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    let batch = [event(1)];
    events::append(
        &mut first,
        AppendBatch { stream_id: "race", tenant_id: None, expected: ExpectedVersion::Exact(1), events: &batch },
    )
    .await
    .expect("first append");
    let db = t.db.clone();
    let second =
        tokio::spawn(async move { support::append(&db, "race", ExpectedVersion::Exact(1), &[event(2)]).await });
    first.commit().await.expect("first commit");
    let err = second.await.expect("join").expect_err("the second must conflict");
    assert!(matches!(err, Error::Conflict { expected: 1, .. }), "{err}");
    assert!(err.is_retryable());

    // Many at once: exactly one wins.
    let mut handles = Vec::new();
    for n in 0..8 {
        let db = t.db.clone();
        handles.push(tokio::spawn(async move {
            support::append(&db, "race", ExpectedVersion::Exact(2), &[event(100 + n)]).await
        }));
    }
    let mut won = 0;
    for handle in handles {
        match handle.await.expect("join") {
            Ok(_) => won += 1,
            Err(Error::Conflict { .. }) => {}
            Err(other) => panic!("unexpected error: {other}"),
        }
    }
    assert_eq!(won, 1);
    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    assert_eq!(events::stream_version(&mut tx, "race").await.expect("version"), 3);
    tx.commit().await.expect("commit");
}

#[tokio::test]
async fn expected_any_appends_after_the_head() {
    let t = TestDb::new().await;
    support::append(&t.db, "any", ExpectedVersion::Any, &[event(1)]).await.expect("first");
    let appended = support::append(&t.db, "any", ExpectedVersion::Any, &[event(2), event(3)]).await.expect("second");
    assert_eq!((appended.first_version, appended.last_version), (2, 3));
}

#[tokio::test]
async fn an_empty_batch_is_refused() {
    let t = TestDb::new().await;
    let err = support::append(&t.db, "s", ExpectedVersion::Any, &[]).await.expect_err("empty");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
}

#[tokio::test]
async fn an_old_schema_version_is_upcast_on_read() {
    #[derive(serde::Serialize)]
    struct PlacedV1 {
        gpus: u32,
    }
    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct PlacedV2 {
        count: u32,
        unit: String,
    }
    fn v1_to_v2(value: rmpv::Value) -> Result<rmpv::Value, String> {
        let map = value.as_map().ok_or("not a map")?;
        let gpus = map.iter().find(|(k, _)| k.as_str() == Some("gpus")).and_then(|(_, v)| v.as_u64()).ok_or("gpus")?;
        Ok(rmpv::Value::Map(vec![("count".into(), rmpv::Value::from(gpus)), ("unit".into(), rmpv::Value::from("gpu"))]))
    }
    let t = TestDb::new().await;
    let old =
        NewEvent::encode("reservation.placed", 1, &PlacedV1 { gpus: 8 }, &EventMetadata::default()).expect("encode");
    support::append(&t.db, "rsv_1", ExpectedVersion::NO_STREAM, &[old]).await.expect("append");
    let read = support::read_until(&t.db, Position::START, 1).await;
    assert_eq!(read[0].schema_version, 1);
    let upcasters = Upcasters::new().register("reservation.placed", 1, v1_to_v2);
    let placed: PlacedV2 = read[0].decode(&upcasters).expect("upcast and decode");
    assert_eq!(placed, PlacedV2 { count: 8, unit: "gpu".into() });
}

#[tokio::test]
async fn metadata_travels_with_the_event() {
    let t = TestDb::new().await;
    let meta = EventMetadata { request_id: Some("req_42".into()), ..Default::default() };
    let with_meta = NewEvent::encode("test.counted", 1, &Counted { n: 1 }, &meta).expect("encode");
    support::append(&t.db, "m", ExpectedVersion::NO_STREAM, &[with_meta]).await.expect("append");
    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let read = events::read_stream(&mut tx, "m", 0, 10).await.expect("read");
    tx.commit().await.expect("commit");
    assert_eq!(read[0].metadata().expect("metadata"), meta);
}

#[tokio::test]
async fn the_horizon_head_is_the_last_event_a_reader_can_see() {
    let t = TestDb::new().await;
    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    assert_eq!(events::horizon_head(&mut tx).await.expect("head"), Position::START);
    tx.commit().await.expect("commit");
    support::append(&t.db, "a", ExpectedVersion::NO_STREAM, &[event(1)]).await.expect("append");
    let last = support::append(&t.db, "b", ExpectedVersion::NO_STREAM, &[event(2), event(3)]).await.expect("append");
    support::read_until(&t.db, Position::START, 3).await;
    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    assert_eq!(events::horizon_head(&mut tx).await.expect("head"), last.position);
    tx.commit().await.expect("commit");
}

#[tokio::test]
async fn waiting_for_the_horizon_ends_when_the_older_transactions_do() {
    let t = TestDb::new().await;
    // A transaction that took an id before the event was appended, and is still running.
    let mut older = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    let _: String = bc_eventstore::sql::query_scalar("SELECT pg_current_xact_id()::text")
        .fetch_one(older.conn())
        .await
        .expect("take an id");
    support::append(&t.db, "a", ExpectedVersion::NO_STREAM, &[event(1)]).await.expect("append");

    let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    let err = events::wait_for_horizon(&mut tx, std::time::Duration::from_millis(50)).await.expect_err("held back");
    assert!(matches!(&err, Error::Internal(m) if m.contains("beyond the horizon")), "{err}");
    assert!(events::read_after(&mut tx, Position::START, 10).await.expect("read").is_empty());
    older.commit().await.expect("commit the older one");
    events::wait_for_horizon(&mut tx, std::time::Duration::from_secs(60)).await.expect("the older one ended");
    assert_eq!(events::read_after(&mut tx, Position::START, 10).await.expect("read").len(), 1);
    tx.commit().await.expect("commit");

    let mut fixed = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    let err = events::wait_for_horizon(&mut fixed, std::time::Duration::from_secs(1)).await.expect_err("refused");
    assert!(matches!(&err, Error::InvalidArgument(m) if m.contains("READ COMMITTED")), "{err}");
    fixed.rollback().await;
}

#[tokio::test]
async fn an_append_with_its_inline_calls_lands_as_append_does_and_a_moved_head_runs_none_of_them() {
    use bc_eventstore::sql::{self as sql, Call};
    let t = TestDb::new().await;
    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    sql::query("CREATE TABLE written (v int)").execute(tx.conn()).await.expect("table");
    sql::query("CREATE FUNCTION write_one(p int) RETURNS int LANGUAGE sql AS $$ INSERT INTO written VALUES (p) RETURNING p * 10 $$")
        .execute(tx.conn())
        .await
        .expect("function");
    tx.commit().await.expect("commit");

    let batch = [event(1), event(2)];
    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    let then = [Call::new("write_one").int4(1), Call::new("write_one").int4(2)];
    let (appended, answers) = events::append_with(
        &mut tx,
        AppendBatch {
            stream_id: "s-1",
            tenant_id: Some("ten_a"),
            expected: ExpectedVersion::NO_STREAM,
            events: &batch,
        },
        &then,
    )
    .await
    .expect("append");
    tx.commit().await.expect("commit");
    assert_eq!((appended.first_version, appended.last_version), (1, 2));
    assert_eq!(answers, vec![Some("10".to_owned()), Some("20".to_owned())], "each call's answer, in order");
    let read = support::read_until(&t.db, Position::START, 2).await;
    assert_eq!(read[1].position, appended.position, "the position of the batch's last event");
    assert_eq!(read[0].tenant_id.as_deref(), Some("ten_a"));

    // A head elsewhere than expected is a conflict, and the calls after the append never ran.
    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    let err = events::append_with(
        &mut tx,
        AppendBatch { stream_id: "s-1", tenant_id: None, expected: ExpectedVersion::Exact(1), events: &batch },
        &[Call::new("write_one").int4(3)],
    )
    .await
    .expect_err("the head is at 2");
    assert!(matches!(err, Error::Conflict { ref stream_id, expected: 1, .. } if stream_id == "s-1"), "{err:?}");
    assert!(err.is_retryable());
    tx.rollback().await;
    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let written: Vec<i32> =
        sql::query_scalar("SELECT v FROM written ORDER BY v").fetch_all(tx.conn()).await.expect("read");
    tx.commit().await.expect("commit");
    assert_eq!(written, vec![1, 2]);
}

#[tokio::test]
async fn an_append_that_leads_the_commit_lands_with_its_calls_and_the_deferred_ones_and_a_moved_head_writes_nothing() {
    use bc_eventstore::sql::{self as sql, Call};
    let t = TestDb::new().await;
    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    for statement in [
        "CREATE TABLE written (v int, events_seen bigint)",
        "CREATE TABLE followed (v int)",
        // What a call wrote, with how many events of the stream its transaction saw then.
        "CREATE FUNCTION write_one(p int) RETURNS text LANGUAGE sql AS $$
             INSERT INTO written SELECT p, count(*) FROM events WHERE stream_id = 's-1'
             RETURNING CASE WHEN p = 2 THEN jsonb_build_array(p * 10)::text ELSE (p * 10)::text END $$",
        "CREATE FUNCTION follow(p jsonb) RETURNS void LANGUAGE sql AS $$
             INSERT INTO followed SELECT (e #>> '{}')::int FROM jsonb_array_elements(p) AS e $$",
        "CREATE FUNCTION refuse() RETURNS text LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'gone' USING ERRCODE = 'BC423'; END $$",
    ] {
        sql::query(statement).execute(tx.conn()).await.expect("create");
    }
    tx.commit().await.expect("commit");
    let written = |db: bc_eventstore::Db| async move {
        let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
        let rows: Vec<(i32, i64)> =
            sql::query_as("SELECT v, events_seen FROM written ORDER BY v").fetch_all(tx.conn()).await.expect("read");
        let followed: Vec<i32> =
            sql::query_scalar("SELECT v FROM followed ORDER BY v").fetch_all(tx.conn()).await.expect("read");
        tx.commit().await.expect("commit");
        (rows, followed)
    };

    let batch = [event(1), event(2)];
    let mut appends = t.db.appends();
    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    // Queued before the append, sent after it: the deferred calls follow the lead in the message.
    tx.defer(&Call::new("write_one").int4(5));
    let then = [Call::new("write_one").int4(1), Call::new("write_one").int4(2)];
    let (appended, answers) = events::append_and_commit(
        tx,
        AppendBatch {
            stream_id: "s-1",
            tenant_id: Some("ten_a"),
            expected: ExpectedVersion::NO_STREAM,
            events: &batch,
        },
        Some(&Call::new("write_one").int4(0)),
        &then,
        &[None, Some("follow")],
    )
    .await
    .expect("append and commit");
    assert_eq!((appended.first_version, appended.last_version), (1, 2));
    assert_eq!(answers, vec![Some("10".to_owned()), Some("[20]".to_owned())], "each call's answer, in order");
    let read = support::read_until(&t.db, Position::START, 2).await;
    assert_eq!(read[1].position, appended.position, "the position of the batch's last event");
    assert_eq!(*appends.borrow_and_update(), appended.position, "the commit is signalled at its position");
    t.db.follow_ups_written().await;
    let (rows, followed) = written(t.db.clone()).await;
    assert_eq!(
        rows,
        vec![(0, 0), (1, 2), (2, 2), (5, 2)],
        "the first call ran before the append, the others after it, and all of it committed"
    );
    assert_eq!(followed, vec![20], "the answer named for a follow-up was handed to it after the commit");

    // A head elsewhere than expected is a conflict; neither the calls nor the deferred ones wrote anything.
    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    tx.defer(&Call::new("write_one").int4(6));
    let err = events::append_and_commit(
        tx,
        AppendBatch { stream_id: "s-1", tenant_id: None, expected: ExpectedVersion::Exact(1), events: &batch },
        None,
        &[Call::new("write_one").int4(3)],
        &[None],
    )
    .await
    .expect_err("the head is at 2");
    assert!(matches!(err, Error::Conflict { ref stream_id, expected: 1, .. } if stream_id == "s-1"), "{err:?}");
    assert!(err.is_retryable());
    let kept = (vec![(0, 0), (1, 2), (2, 2), (5, 2)], vec![20]);
    // The connection went back clean: the next transaction on the pool works.
    assert_eq!(written(t.db.clone()).await, kept);

    // A first call that raises stops the message there: its error is the answer, and nothing is appended.
    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    tx.defer(&Call::new("write_one").int4(7));
    let err = events::append_and_commit(
        tx,
        AppendBatch { stream_id: "s-1", tenant_id: None, expected: ExpectedVersion::Exact(2), events: &batch },
        Some(&Call::new("refuse")),
        &[Call::new("write_one").int4(4)],
        &[None],
    )
    .await
    .expect_err("refused");
    assert_eq!(err.sql_state().as_deref(), Some("BC423"), "{err:?}");
    assert_eq!(written(t.db.clone()).await, kept);
    assert_eq!(support::read_until(&t.db, Position::START, 2).await.len(), 2, "the stream is still at 2");
}

#[tokio::test]
async fn a_selected_read_sends_only_the_parts_asked_for_and_the_same_events() {
    let t = TestDb::new().await;
    let metadata = EventMetadata { request_id: Some("req_selected".into()), ..EventMetadata::default() };
    let typed = |event_type: &str, n: u64| NewEvent::encode(event_type, 1, &Counted { n }, &metadata).expect("encode");
    let batch = [typed("test.kept", 1), typed("test.metadata-only", 2), typed("test.skipped", 3)];
    support::append(&t.db, "s", ExpectedVersion::NO_STREAM, &batch).await.expect("append");

    let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    // The horizon is the cluster's: other tests' open transactions may hold the events back for a moment.
    events::wait_for_horizon(&mut tx, std::time::Duration::from_secs(60)).await.expect("past the horizon");
    let whole = events::read_after(&mut tx, Position::START, 10).await.expect("read");
    let selection = events::Selection {
        metadata_of: Some(&["test.kept", "test.metadata-only"]),
        payload_of: Some(&["test.kept", "test.skipped"]),
        tenant: None,
    };
    let selected = events::read_after_selected(&mut tx, Position::START, 10, selection).await.expect("read");
    tx.commit().await.expect("commit");

    assert_eq!(whole.len(), 3);
    assert!(whole.iter().all(|e| !e.payload.is_empty() && !e.metadata.is_empty()));
    let same =
        |e: &bc_eventstore::RecordedEvent| (e.position, e.stream_id.clone(), e.stream_version, e.event_type.clone());
    assert_eq!(selected.iter().map(same).collect::<Vec<_>>(), whole.iter().map(same).collect::<Vec<_>>());
    // The kept event comes whole; the second without its payload; the third (its metadata not asked for) with
    // neither, though its payload was named: a payload is read only with the metadata.
    assert_eq!((&selected[0].payload, &selected[0].metadata), (&whole[0].payload, &whole[0].metadata));
    assert_eq!(selected[0].metadata().expect("metadata").request_id.as_deref(), Some("req_selected"));
    assert!(selected[1].payload.is_empty());
    assert_eq!(selected[1].metadata, whole[1].metadata);
    assert!(selected[2].payload.is_empty() && selected[2].metadata.is_empty());
}

#[tokio::test]
async fn a_read_for_one_tenant_sends_the_others_events_without_payload_or_metadata() {
    let t = TestDb::new().await;
    let metadata = EventMetadata { request_id: Some("req_tenant".into()), ..EventMetadata::default() };
    for (stream, tenant) in [("a", Some("acme")), ("g", Some("globex")), ("p", None), ("a2", Some("acme"))] {
        let batch = [NewEvent::encode("test.tenanted", 1, &Counted { n: 1 }, &metadata).expect("encode")];
        let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
        let appended =
            AppendBatch { stream_id: stream, tenant_id: tenant, expected: ExpectedVersion::NO_STREAM, events: &batch };
        events::append(&mut tx, appended).await.expect("append");
        tx.commit().await.expect("commit");
    }

    let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    events::wait_for_horizon(&mut tx, std::time::Duration::from_secs(60)).await.expect("past the horizon");
    let whole = events::read_after(&mut tx, Position::START, 10).await.expect("read");
    let selection = events::Selection { tenant: Some("acme"), ..events::Selection::EVERYTHING };
    let selected = events::read_after_selected(&mut tx, Position::START, 10, selection).await.expect("read");
    tx.commit().await.expect("commit");

    // The same events, in the same order, with their tenants: the reader knows how far it has read.
    let same = |e: &bc_eventstore::RecordedEvent| (e.position, e.stream_id.clone(), e.tenant_id.clone());
    assert_eq!(whole.len(), 4);
    assert_eq!(selected.iter().map(same).collect::<Vec<_>>(), whole.iter().map(same).collect::<Vec<_>>());
    for (read, full) in selected.iter().zip(&whole) {
        if read.tenant_id.as_deref() == Some("acme") {
            assert_eq!((&read.payload, &read.metadata), (&full.payload, &full.metadata), "{}", read.stream_id);
        } else {
            assert!(read.payload.is_empty() && read.metadata.is_empty(), "{} was sent whole", read.stream_id);
        }
    }
}

#[tokio::test]
async fn copied_rows_come_back_exactly_whatever_their_values_hold() {
    let t = TestDb::new().await;
    let awkward = ["tab\there", "line\nbreak\r\nand return", "back\\slash \\N \\t", "", "plain ünïcödé"];
    let mut rows = bc_eventstore::sql::CopyRows::new();
    for (n, text) in awkward.iter().enumerate() {
        rows.int8(n as i64 - 2)
            .int4(-(n as i32))
            .xid8(u64::MAX - n as u64)
            .text(Some(text))
            .json(&format!(r#"{{"n": {n}, "text": {}}}"#, serde_json::json!(text)))
            .text_array(&awkward[..n])
            .timestamp_ms(1_893_456_000_123 + n as i64)
            .expect("instant");
        rows.end_row();
    }
    rows.int8(99).null().null().text(None).null().text_array(&[] as &[&str]).timestamp_ms(-1).expect("instant");
    rows.end_row();
    assert_eq!(rows.rows(), 6);
    let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    bc_eventstore::sql::query(
        "CREATE TEMPORARY TABLE copied (n int8, small int4, txid xid8, body text, doc json, items text[], at timestamptz)",
    )
    .execute(tx.conn())
    .await
    .expect("create");
    let copy = "COPY copied (n, small, txid, body, doc, items, at) FROM STDIN (FORMAT binary)";
    assert_eq!(rows.copy_in(&mut tx, copy).await.expect("copy"), 6);
    type Row = (i64, Option<i32>, Option<String>, Option<String>, Option<String>, Vec<String>, i64);
    let back: Vec<Row> = bc_eventstore::sql::query_as(
        "SELECT n, small, txid::text, body, doc::text, items, (extract(epoch FROM at) * 1000)::int8 FROM copied
         ORDER BY n",
    )
    .fetch_all(tx.conn())
    .await
    .expect("read");

    let mut unfinished = bc_eventstore::sql::CopyRows::new();
    unfinished.int8(1);
    let err = unfinished.copy_in(&mut tx, "COPY copied (n) FROM STDIN (FORMAT binary)").await.expect_err("unfinished");
    assert!(matches!(&err, Error::Internal(m) if m.contains("unfinished")), "{err}");
    tx.commit().await.expect("commit");

    let mut expected: Vec<Row> = awkward
        .iter()
        .enumerate()
        .map(|(n, text)| {
            (
                n as i64 - 2,
                Some(-(n as i32)),
                Some((u64::MAX - n as u64).to_string()),
                Some((*text).to_owned()),
                Some(format!(r#"{{"n": {n}, "text": {}}}"#, serde_json::json!(text))),
                awkward[..n].iter().map(|item| (*item).to_owned()).collect(),
                1_893_456_000_123 + n as i64,
            )
        })
        .collect();
    expected.push((99, None, None, None, None, Vec::new(), -1));
    assert_eq!(back, expected);
}

#[tokio::test]
async fn a_copied_field_of_another_width_or_a_nul_in_a_text_is_refused_and_nothing_is_written() {
    let t = TestDb::new().await;
    let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    bc_eventstore::sql::query("CREATE TABLE copied (n int8, body text)").execute(tx.conn()).await.expect("create");
    tx.commit().await.expect("commit");
    let copy = "COPY copied (n, body) FROM STDIN (FORMAT binary)";

    let mut narrow = bc_eventstore::sql::CopyRows::new();
    narrow.int4(1).text(Some("one"));
    narrow.end_row();
    let mut nul = bc_eventstore::sql::CopyRows::new();
    nul.int8(2).text(Some("a\0b"));
    nul.end_row();
    for (rows, why) in [(narrow, "insufficient data left in message"), (nul, "0x00")] {
        let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
        let err = rows.copy_in(&mut tx, copy).await.expect_err("refused");
        assert!(err.to_string().contains(why), "{err}");
        tx.rollback().await;
    }
    let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    let count: i64 =
        bc_eventstore::sql::query_scalar("SELECT count(*) FROM copied").fetch_one(tx.conn()).await.expect("count");
    assert_eq!(count, 0);
}
