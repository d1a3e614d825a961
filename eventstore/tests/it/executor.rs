//! The transaction executor: commit, rollback, a COMMIT turned ROLLBACK, savepoints, retries.

use std::sync::atomic::{AtomicU32, Ordering};

use bc_eventstore::testing::TestDb;
use bc_eventstore::{Error, RetryPolicy, RetryReason, ScopedFutureExt as _, TxOptions, sql, sql_state};

async fn count(t: &TestDb) -> i64 {
    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let n: i64 = sql::query_scalar("SELECT count(*) FROM scratch").fetch_one(tx.conn()).await.expect("count");
    tx.commit().await.expect("commit");
    n
}

async fn with_scratch_table() -> TestDb {
    let t = TestDb::new().await;
    let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    sql::query("CREATE TABLE scratch (id int PRIMARY KEY)").execute(tx.conn()).await.expect("create");
    tx.commit().await.expect("commit");
    t
}

#[tokio::test]
async fn a_caught_statement_error_followed_by_commit_is_an_internal_error() {
    let t = with_scratch_table().await;
    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    sql::query("INSERT INTO scratch VALUES (1)").execute(tx.conn()).await.expect("insert");
    let caught = sql::query("INSERT INTO scratch VALUES (1)").execute(tx.conn()).await.expect_err("duplicate");
    assert_eq!(sql_state(&caught).as_deref(), Some("23505"));
    let err = tx.commit().await.expect_err("the commit must not report success");
    assert!(matches!(err, Error::Internal(_)), "{err}");
    assert_eq!(err.code(), "INTERNAL_ERROR");
    assert_eq!(count(&t).await, 0, "nothing was committed");

    // With a call deferred to the commit's message (which then stands in for the guard before COMMIT), the same.
    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    sql::query("INSERT INTO scratch VALUES (1)").execute(tx.conn()).await.expect("insert");
    sql::query("INSERT INTO scratch VALUES (1)").execute(tx.conn()).await.expect_err("duplicate");
    tx.defer(&sql::Call::new("version"));
    let err = tx.commit().await.expect_err("the commit must not report success");
    assert!(matches!(err, Error::Internal(_)), "{err}");
    assert_eq!(count(&t).await, 0, "nothing was committed");
}

#[tokio::test]
async fn the_closure_form_commits_on_ok_and_rolls_back_on_err() {
    let t = with_scratch_table().await;
    let id = 7;
    let value: i32 =
        t.db.transaction(TxOptions::COMMAND, |tx| {
            async move {
                sql::query("INSERT INTO scratch VALUES ($1)").bind(id).execute(tx.conn()).await?;
                Ok::<_, Error>(id)
            }
            .scope_boxed()
        })
        .await
        .expect("commit");
    assert_eq!(value, 7);
    let err =
        t.db.transaction(TxOptions::COMMAND, |tx| {
            async move {
                sql::query("INSERT INTO scratch VALUES (8)").execute(tx.conn()).await?;
                Err::<(), _>(Error::InvalidArgument("changed my mind".into()))
            }
            .scope_boxed()
        })
        .await
        .expect_err("rolled back");
    assert!(matches!(err, Error::InvalidArgument(_)));
    assert_eq!(count(&t).await, 1);
}

#[tokio::test]
async fn a_failed_savepoint_leaves_the_outer_transaction_usable() {
    let t = with_scratch_table().await;
    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    sql::query("INSERT INTO scratch VALUES (1)").execute(tx.conn()).await.expect("insert");
    let err = tx
        .savepoint(|tx| {
            async move {
                sql::query("INSERT INTO scratch VALUES (2)").execute(tx.conn()).await?;
                sql::query("INSERT INTO scratch VALUES (1)").execute(tx.conn()).await?;
                Ok::<_, Error>(())
            }
            .scope_boxed()
        })
        .await
        .expect_err("the savepoint fails");
    assert_eq!(err.sql_state().as_deref(), Some("23505"));
    // The outer transaction goes on and commits what it did outside the savepoint.
    sql::query("INSERT INTO scratch VALUES (3)").execute(tx.conn()).await.expect("insert after the savepoint");
    tx.savepoint(|tx| {
        async move {
            sql::query("INSERT INTO scratch VALUES (4)").execute(tx.conn()).await?;
            Ok::<_, Error>(())
        }
        .scope_boxed()
    })
    .await
    .expect("a nested savepoint that succeeds is kept");
    tx.commit().await.expect("commit");
    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let ids: Vec<i32> =
        sql::query_scalar("SELECT id FROM scratch ORDER BY id").fetch_all(tx.conn()).await.expect("ids");
    tx.commit().await.expect("commit");
    assert_eq!(ids, vec![1, 3, 4]);
}

#[tokio::test]
async fn a_dropped_transaction_is_rolled_back() {
    let t = with_scratch_table().await;
    {
        let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
        sql::query("INSERT INTO scratch VALUES (1)").execute(tx.conn()).await.expect("insert");
    }
    assert_eq!(count(&t).await, 0);
}

#[tokio::test]
async fn the_statement_timeout_is_set_per_transaction() {
    let t = TestDb::new().await;
    let db = t.pool(&bc_eventstore::DbConfig {
        statement_timeout: std::time::Duration::from_millis(1234),
        ..bc_eventstore::testing::test_db_config()
    });
    let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let timeout: String = sql::query_scalar("SHOW statement_timeout").fetch_one(tx.conn()).await.expect("show");
    tx.commit().await.expect("commit");
    assert_eq!(timeout, "1234ms");
    let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let err = sql::query("SELECT pg_sleep(5)").execute(tx.conn()).await.expect_err("times out");
    assert_eq!(sql_state(&err).as_deref(), Some("57014"));
    tx.rollback().await;
    // Outside a transaction the session keeps the server default: SET LOCAL left no session state.
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect_with(&t.connect_options()).await.expect("connect");
    let session: String = sql::query_scalar("SHOW statement_timeout").fetch_one(&mut conn).await.expect("show");
    assert_eq!(session, "0");
}

#[tokio::test]
async fn isolation_and_access_modes_are_applied() {
    let t = TestDb::new().await;
    for (options, isolation, read_only) in [
        (TxOptions::COMMAND, "repeatable read", "off"),
        (TxOptions::READ_ONLY, "read committed", "on"),
        (TxOptions::READ_COMMITTED, "read committed", "off"),
    ] {
        let mut tx = t.db.begin(options).await.expect("begin");
        let level: String = sql::query_scalar("SHOW transaction_isolation").fetch_one(tx.conn()).await.expect("iso");
        let ro: String = sql::query_scalar("SHOW transaction_read_only").fetch_one(tx.conn()).await.expect("ro");
        tx.commit().await.expect("commit");
        assert_eq!((level.as_str(), ro.as_str()), (isolation, read_only));
    }
}

#[tokio::test]
async fn retryable_failures_are_retried_and_others_are_not() {
    let t = with_scratch_table().await;
    // The counters are the process's: other tests may add to them meanwhile, never take away.
    let retried =
        |reason: RetryReason| bc_eventstore::retries().into_iter().find(|(r, _)| *r == reason).map_or(0, |(_, n)| n);
    let (serialization, exclusion) = (retried(RetryReason::Serialization), retried(RetryReason::Exclusion));
    let tries = AtomicU32::new(0);
    let policy = RetryPolicy { max_attempts: 5, ..RetryPolicy::default() };
    let result: Result<(), Error> =
        t.db.transaction_with_retry(TxOptions::COMMAND, &policy, |tx| {
            let attempt = tries.fetch_add(1, Ordering::SeqCst);
            async move {
                if attempt < 2 {
                    // A real serialization failure, raised by the server with its SQLSTATE.
                    sql::query("DO $$ BEGIN RAISE EXCEPTION 'try again' USING ERRCODE = '40001'; END $$")
                        .execute(tx.conn())
                        .await?;
                }
                sql::query("INSERT INTO scratch VALUES (1)").execute(tx.conn()).await?;
                Ok(())
            }
            .scope_boxed()
        })
        .await;
    result.expect("succeeds on the third try");
    assert_eq!(tries.load(Ordering::SeqCst), 3);
    assert!(retried(RetryReason::Serialization) >= serialization + 2, "each retry is counted by its reason");

    let tries = AtomicU32::new(0);
    let err =
        t.db.transaction_with_retry(TxOptions::COMMAND, &policy, |tx| {
            tries.fetch_add(1, Ordering::SeqCst);
            async move {
                sql::query("INSERT INTO scratch VALUES (1)").execute(tx.conn()).await?;
                Ok::<_, Error>(())
            }
            .scope_boxed()
        })
        .await
        .expect_err("a unique violation is not retryable");
    assert_eq!(err.sql_state().as_deref(), Some("23505"));
    assert_eq!(tries.load(Ordering::SeqCst), 1);

    let tries = AtomicU32::new(0);
    let err =
        t.db.transaction_with_retry(TxOptions::COMMAND, &policy, |tx| {
            tries.fetch_add(1, Ordering::SeqCst);
            async move {
                sql::query("DO $$ BEGIN RAISE EXCEPTION 'overlap' USING ERRCODE = '23P01'; END $$")
                    .execute(tx.conn())
                    .await?;
                Ok::<_, Error>(())
            }
            .scope_boxed()
        })
        .await
        .expect_err("gives up");
    assert_eq!(err.sql_state().as_deref(), Some("23P01"));
    assert_eq!(tries.load(Ordering::SeqCst), 5, "bounded");
    assert_eq!(err.code(), "CONFLICT", "a race that outlasted its retries is a conflict, not an internal error");
    assert!(retried(RetryReason::Exclusion) >= exclusion + 4, "four retries after the first try");
}

#[tokio::test]
async fn a_call_carries_any_text_unchanged_and_shares_begin_s_and_commit_s_round_trip() {
    use bc_eventstore::sql::Call;
    let t = with_scratch_table().await;
    let hostile = "x'); DROP TABLE scratch; -- $$ \\ é 🚀";
    let (mut tx, echoed) =
        t.db.begin_with(TxOptions::COMMAND, &Call::new("concat").text(hostile).text("!")).await.expect("begin");
    assert_eq!(echoed.as_deref(), Some(format!("{hostile}!").as_str()));
    sql::query("INSERT INTO scratch VALUES (1)").execute(tx.conn()).await.expect("insert");
    let quoted = tx.call(&Call::new("quote_literal").text(hostile)).await.expect("call");
    assert_eq!(quoted.as_deref(), Some("E'x''); DROP TABLE scratch; -- $$ \\\\ é 🚀'"));
    let answer = tx.commit_with(&Call::new("int8pl").int8(40).int8(2)).await.expect("commit");
    assert_eq!(answer.as_deref(), Some("42"));
    assert_eq!(count(&t).await, 1, "committed with the last call, and the table is still there");

    // A last call that fails commits nothing: COMMIT, after it in the same message, never runs.
    let (mut tx, _) = t.db.begin_with(TxOptions::COMMAND, &Call::new("version")).await.expect("begin");
    sql::query("INSERT INTO scratch VALUES (2)").execute(tx.conn()).await.expect("insert");
    let err = tx.commit_with(&Call::new("div").int8(1).int8(0)).await.expect_err("the call fails");
    assert_eq!(err.sql_state().as_deref(), Some("22012"), "{err}");
    assert_eq!(count(&t).await, 1, "the failed call's transaction was rolled back");

    // A first call that fails leaves no transaction open: the connection goes back to the pool, usable.
    let err = t.db.begin_with(TxOptions::COMMAND, &Call::new("div").int8(1).int8(0)).await.expect_err("fails");
    assert_eq!(err.sql_state().as_deref(), Some("22012"));
    let (tx, _) = t.db.begin_with(TxOptions::READ_ONLY, &Call::new("version")).await.expect("begin again");
    tx.commit().await.expect("commit");
}

#[tokio::test]
async fn a_call_s_literals_reach_the_server_byte_for_byte_whatever_the_connection_s_encoding() {
    use bc_eventstore::sql::Call;
    let t = TestDb::new().await;
    let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    for function in [
        "CREATE FUNCTION hex_of(t text) RETURNS text LANGUAGE sql AS $$ SELECT encode(convert_to(t, 'UTF8'), 'hex') $$",
        "CREATE FUNCTION hex_of_all(t text[]) RETURNS text LANGUAGE sql AS $$
             SELECT string_agg(encode(convert_to(x, 'UTF8'), 'hex'), ',' ORDER BY i) FROM unnest(t) WITH ORDINALITY AS u(x, i) $$",
        "CREATE FUNCTION hex_of_first(j jsonb) RETURNS text LANGUAGE sql
             AS $$ SELECT encode(convert_to(j ->> 0, 'UTF8'), 'hex') $$",
        "CREATE FUNCTION hex_of_bytes(b bytea[]) RETURNS text LANGUAGE sql AS $$ SELECT encode(b[1], 'hex') $$",
    ] {
        sql::query(function).execute(tx.conn()).await.expect("function");
    }
    tx.commit().await.expect("commit");

    let hostile = [
        "",
        "x'); DROP TABLE events; --",
        r"\",
        r"\'",
        r"'\",
        r"ends with a backslash \",
        "あ\\",
        "あ'",
        "\u{7f}\u{1}\t\r\n",
        "\u{ffff}",
        "😀\u{10ffff}",
        "$$ $tag$ E' U&'",
        r"\u0041 \x41 \\ \n",
    ];
    // Under Shift JIS a byte after a lead byte is read as the second half of one character, backslash and quote
    // included: a statement carrying raw UTF-8 could then end its literal early. A call's statement is ASCII.
    for encoding in ["UTF8", "SJIS"] {
        for value in hostile {
            let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
            sql::query(if encoding == "SJIS" { "SET LOCAL client_encoding = 'SJIS'" } else { "SELECT 1" })
                .execute(tx.conn())
                .await
                .expect("encoding");
            let answers = tx
                .calls(&[
                    Call::new("hex_of").text(value),
                    Call::new("hex_of_all").texts(&[value, "after"]),
                    Call::new("hex_of_first").jsonb(&serde_json::json!([value]).to_string()),
                ])
                .await
                .expect("calls");
            tx.commit().await.expect("commit");
            let want = hex::encode(value);
            assert_eq!(answers[0].as_deref(), Some(want.as_str()), "{value:?} as text under {encoding}");
            assert_eq!(answers[1].as_deref(), Some(format!("{want},{}", hex::encode("after")).as_str()), "{value:?}");
            assert_eq!(answers[2].as_deref(), Some(want.as_str()), "{value:?} inside JSON under {encoding}");
        }
    }

    let every_byte: Vec<u8> = (0..=255).collect();
    let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    let bytes = tx.call(&Call::new("hex_of_bytes").byteas(&[&every_byte])).await.expect("bytes");
    assert_eq!(bytes.as_deref(), Some(hex::encode(&every_byte).as_str()));
    tx.commit().await.expect("commit");

    // PostgreSQL stores no NUL in a text: the server refuses it, as it always did.
    let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    let err = tx.call(&Call::new("hex_of").text("a\0b")).await.expect_err("a NUL is refused");
    assert_eq!(err.sql_state().as_deref(), Some("22021"), "{err}");
}

#[tokio::test]
async fn calls_after_commit_run_in_order_outside_the_transaction_and_only_when_it_committed() {
    use bc_eventstore::sql::Call;
    let t = with_scratch_table().await;
    let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    sql::query("CREATE TABLE noted (v int, isolation text, in_writer boolean)")
        .execute(tx.conn())
        .await
        .expect("table");
    sql::query(
        "CREATE FUNCTION note(p int) RETURNS void LANGUAGE sql AS $$
             INSERT INTO noted SELECT p, current_setting('transaction_isolation'), EXISTS (SELECT 1 FROM scratch)
         $$",
    )
    .execute(tx.conn())
    .await
    .expect("function");
    tx.commit().await.expect("commit");

    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    sql::query("INSERT INTO scratch VALUES (1)").execute(tx.conn()).await.expect("insert");
    tx.after_commit(&Call::new("note").int4(1));
    tx.after_commit(&Call::new("note").int4(2));
    tx.commit().await.expect("commit");

    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    tx.after_commit(&Call::new("note").int4(3));
    tx.rollback().await;

    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let noted: Vec<(i32, String, bool)> = sql::query_as("SELECT v, isolation, in_writer FROM noted ORDER BY ctid")
        .fetch_all(tx.conn())
        .await
        .expect("read");
    tx.commit().await.expect("commit");
    assert_eq!(
        noted,
        vec![(1, "read committed".to_owned(), true), (2, "read committed".to_owned(), true)],
        "in order, after the commit (they see the committed row) at read committed, and never for a rollback"
    );
}

#[tokio::test]
async fn follow_ups_queued_behind_a_write_are_merged_into_the_next_one_and_never_written_for_a_rollback() {
    let t = with_scratch_table().await;
    let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    for statement in
        ["CREATE SEQUENCE writes", "CREATE TABLE followed (write bigint, v int, committed boolean, timeout text)"]
    {
        sql::query(statement).execute(tx.conn()).await.expect("create");
    }
    sql::query(
        "CREATE FUNCTION follow(p jsonb) RETURNS void LANGUAGE sql AS $$
             WITH w AS (SELECT nextval('writes') AS n)
             INSERT INTO followed
             SELECT w.n, (e #>> '{}')::int, EXISTS (SELECT 1 FROM scratch WHERE id = (e #>> '{}')::int),
                    current_setting('statement_timeout')
             FROM w, jsonb_array_elements(p) WITH ORDINALITY AS a(e, i) ORDER BY a.i
         $$",
    )
    .execute(tx.conn())
    .await
    .expect("function");
    tx.commit().await.expect("commit");
    let commit = |v: i32| {
        let db = t.db.clone();
        async move {
            let mut tx = db.begin(TxOptions::COMMAND).await.expect("begin");
            sql::query("INSERT INTO scratch VALUES ($1)").bind(v).execute(tx.conn()).await.expect("insert");
            tx.follow_up("follow", &format!("[{v}]"));
            tx.commit().await.expect("commit");
        }
    };

    // The first follow-up's write waits behind a lock, while five more commits hand theirs over.
    let mut holder = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    sql::query("LOCK TABLE followed").execute(holder.conn()).await.expect("lock");
    commit(1).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let waiting: i64 = sql::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()",
        )
        .fetch_one(holder.conn())
        .await
        .expect("activity");
        if waiting == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the first write never waited at the lock");
        tokio::task::yield_now().await;
    }
    for v in 2..=6 {
        commit(v).await;
    }
    // A rolled back transaction's follow-up, and one of a rolled back savepoint, are never written.
    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    tx.follow_up("follow", "[99]");
    tx.rollback().await;
    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    sql::query("INSERT INTO scratch VALUES (7)").execute(tx.conn()).await.expect("insert");
    tx.savepoint(|tx| {
        async move {
            tx.follow_up("follow", "[98]");
            Err::<(), _>(Error::Internal("changed my mind".to_owned()))
        }
        .scope_boxed()
    })
    .await
    .expect_err("rolled back");
    tx.follow_up("follow", "[7]");
    tx.commit().await.expect("commit");
    let sent = t.db.follow_up_figures();
    holder.rollback().await;
    assert_eq!(sent.writes, 1, "only the first write was sent: {sent:?}");

    t.db.follow_ups_written().await;
    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let followed: Vec<(i64, i32, bool, String)> =
        sql::query_as("SELECT write, v, committed, timeout FROM followed ORDER BY write, ctid")
            .fetch_all(tx.conn())
            .await
            .expect("read");
    tx.commit().await.expect("commit");
    // Each write runs under the pool's statement timeout (30 s in tests), like every transaction.
    let timeout = || "30s".to_owned();
    let merged: Vec<_> = [2, 3, 4, 5, 6, 7].into_iter().map(|v| (2, v, true, timeout())).collect();
    assert_eq!(
        followed,
        [vec![(1, 1, true, timeout())], merged].concat(),
        "the first alone, the six queued behind it in one write, in order, each after its commit"
    );
    let figures = t.db.follow_up_figures();
    assert_eq!((figures.commits, figures.writes, figures.failed), (7, 2, 0));
}

#[tokio::test]
async fn while_commits_outpace_the_writes_the_writer_pauses_between_them_and_a_wait_for_them_ends_the_pause() {
    let t = with_scratch_table().await;
    let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    for statement in [
        "CREATE SEQUENCE writes",
        "CREATE TABLE followed (write bigint, v int)",
        "CREATE FUNCTION follow(p jsonb) RETURNS void LANGUAGE sql AS $$
             WITH w AS (SELECT nextval('writes') AS n)
             INSERT INTO followed SELECT w.n, (e #>> '{}')::int
             FROM w, jsonb_array_elements(p) WITH ORDINALITY AS a(e, i) ORDER BY a.i
         $$",
    ] {
        sql::query(statement).execute(tx.conn()).await.expect("create");
    }
    tx.commit().await.expect("commit");
    // A pause no test outlasts: only a wait for the follow-ups ends it.
    let db = t.pool(&bc_eventstore::DbConfig {
        follow_up_pause: std::time::Duration::from_secs(3600),
        ..bc_eventstore::testing::test_db_config()
    });
    let commit = |v: i32| {
        let db = db.clone();
        async move {
            let mut tx = db.begin(TxOptions::COMMAND).await.expect("begin");
            sql::query("INSERT INTO scratch VALUES ($1)").bind(v).execute(tx.conn()).await.expect("insert");
            tx.follow_up("follow", &format!("[{v}]"));
            tx.commit().await.expect("commit");
        }
    };
    let written = |v: i32| {
        let db = t.db.clone();
        async move {
            let mut tx = db.begin(TxOptions::READ_ONLY).await.expect("begin");
            let found: bool = sql::query_scalar("SELECT EXISTS (SELECT 1 FROM followed WHERE v = $1)")
                .bind(v)
                .fetch_one(tx.conn())
                .await
                .expect("read");
            tx.commit().await.expect("commit");
            found
        }
    };

    // The first write waits behind a lock while two more commits queue: once it is through, those two go in one
    // write, right away (the write before it carried one commit).
    let mut holder = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    sql::query("LOCK TABLE followed").execute(holder.conn()).await.expect("lock");
    commit(1).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while db.follow_up_figures().writes < 1 {
        assert!(std::time::Instant::now() < deadline, "the first write was never sent");
        tokio::task::yield_now().await;
    }
    commit(2).await;
    commit(3).await;
    holder.rollback().await;
    while !written(3).await {
        assert!(std::time::Instant::now() < deadline, "the queued commits were not written without a wait");
        tokio::task::yield_now().await;
    }
    // That write carried two commits: the next waits out the pause.
    commit(4).await;
    commit(5).await;
    assert!(!written(4).await, "a commit right after a write of several is written after the pause");
    assert_eq!(db.follow_up_figures().writes, 2);

    // A wait for the follow-ups ends the pause: both go in one write.
    db.follow_ups_written().await;
    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let followed: Vec<(i64, i32)> =
        sql::query_as("SELECT write, v FROM followed ORDER BY write, ctid").fetch_all(tx.conn()).await.expect("read");
    tx.commit().await.expect("commit");
    assert_eq!(followed, [(1, 1), (2, 2), (2, 3), (3, 4), (3, 5)]);
    let figures = db.follow_up_figures();
    assert_eq!((figures.commits, figures.writes, figures.failed), (5, 3, 0));
}

#[tokio::test]
async fn deferred_calls_run_with_the_commit_inside_the_transaction_and_an_error_there_rolls_it_all_back() {
    use bc_eventstore::sql::Call;
    let t = with_scratch_table().await;
    let mut tx = t.db.begin(TxOptions::READ_COMMITTED).await.expect("begin");
    sql::query(
        "CREATE FUNCTION put(p int) RETURNS int LANGUAGE sql AS $$ INSERT INTO scratch VALUES (p) RETURNING p $$",
    )
    .execute(tx.conn())
    .await
    .expect("function");
    tx.commit().await.expect("commit");

    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    tx.defer(&Call::new("put").int4(1));
    tx.defer(&Call::new("put").int4(2));
    let seen: i64 = sql::query_scalar("SELECT count(*) FROM scratch").fetch_one(tx.conn()).await.expect("count");
    assert_eq!(seen, 0, "a deferred call waits for the commit");
    let answer = tx.commit_with(&Call::new("int8pl").int8(40).int8(2)).await.expect("commit");
    assert_eq!(answer.as_deref(), Some("42"), "the last call's answer, not a deferred one's");
    assert_eq!(count(&t).await, 2);

    // A deferred call that fails fails the commit, and what the transaction wrote before it is rolled back.
    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    sql::query("INSERT INTO scratch VALUES (3)").execute(tx.conn()).await.expect("insert");
    tx.defer(&Call::new("put").int4(1));
    let err = tx.commit().await.expect_err("the key is taken");
    assert_eq!(err.sql_state().as_deref(), Some("23505"), "{err}");
    assert_eq!(count(&t).await, 2);

    // What a rolled-back savepoint deferred goes with it.
    let mut tx = t.db.begin(TxOptions::COMMAND).await.expect("begin");
    let _ = tx
        .savepoint(|tx| {
            async move {
                tx.defer(&Call::new("put").int4(4));
                Err::<(), _>(Error::Internal("changed my mind".to_owned()))
            }
            .scope_boxed()
        })
        .await;
    tx.defer(&Call::new("put").int4(5));
    tx.commit().await.expect("commit");
    let mut tx = t.db.begin(TxOptions::READ_ONLY).await.expect("begin");
    let ids: Vec<i32> =
        sql::query_scalar("SELECT id FROM scratch ORDER BY id").fetch_all(tx.conn()).await.expect("read");
    tx.commit().await.expect("commit");
    assert_eq!(ids, vec![1, 2, 5]);
}

#[tokio::test]
async fn a_call_s_text_arguments_carry_the_default_collation_so_indexes_on_text_columns_serve_them() {
    use bc_eventstore::sql::Call;
    let t = TestDb::new().await;
    let (tx, collation) =
        t.db.begin_with(TxOptions::READ_ONLY, &Call::new("pg_collation_for").text("pool_1")).await.expect("call");
    tx.commit().await.expect("commit");
    // A value whose collation were "C" (as `convert_from`'s, whose encoding argument is a `name`, once was) would
    // not be compared by a column's index of the default collation.
    assert_eq!(collation.as_deref(), Some("\"default\""));
}
