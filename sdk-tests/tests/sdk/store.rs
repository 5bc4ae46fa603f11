//! The group-commit writer: one bad write in a batch fails alone.

use gateway_sdk_tests::TestContext;
use gateway_server::store::{LogEntry, now_ms};

#[tokio::test]
async fn one_bad_write_in_a_batch_fails_alone() {
    let cx = TestContext::new("bad_write").await;
    let entry = |decision: &str| LogEntry {
        customer_id: cx.tenant.customer_id.clone(),
        source: "api".into(),
        decision: decision.into(),
        status: "refused".into(),
        created_at: now_ms(),
        ..LogEntry::default()
    };
    let good = entry("refused");
    let bad = entry("bogus"); // violates the decision CHECK constraint
    // Queued together, these land in one batch (or a few): the batch that holds the bad
    // write fails as a whole and is retried one write at a time.
    let mut writes: Vec<_> = (0..50).map(|_| cx.store().record_attempt(&good, None)).collect();
    writes.insert(25, cx.store().record_attempt(&bad, None));
    let results = futures::future::join_all(writes).await;
    assert!(results[25].is_err(), "the bad write fails");
    let mut ids: Vec<i64> =
        results.iter().enumerate().filter(|(i, _)| *i != 25).map(|(_, r)| *r.as_ref().unwrap()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 50, "every good write has its own row");
    assert_eq!(cx.store().recent_log(&cx.tenant.customer_id, 100).await.unwrap().len(), 50);
    cx.teardown().await;
}

/// Two owners demoting (or removing) each other at the same moment: one of them wins,
/// and the customer always keeps an owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_owners_demoting_each_other_at_once_leave_one_owner() {
    let cx = TestContext::new("last_owner").await;
    let store = cx.store();
    let customer = cx.tenant.customer_id.as_str();
    let a = store.create_dashboard_user(Some(customer), "a@example.com", "owner", "test").await.unwrap();
    let b = store.create_dashboard_user(Some(customer), "b@example.com", "owner", "test").await.unwrap();
    for round in 0..10 {
        let (x, y) = tokio::join!(store.set_user_role(&a.id, "admin"), store.set_user_role(&b.id, "admin"));
        assert_eq!([x.unwrap(), y.unwrap()].iter().filter(|d| **d).count(), 1, "round {round}: one demotion");
        assert_eq!(store.active_owner_count(customer).await.unwrap(), 1);
        assert!(
            store.set_user_role(&a.id, "owner").await.unwrap() && store.set_user_role(&b.id, "owner").await.unwrap()
        );
    }
    let (x, y) = tokio::join!(store.disable_user(&a.id), store.disable_user(&b.id));
    assert_eq!([x.unwrap(), y.unwrap()].iter().filter(|d| **d).count(), 1, "one removal");
    assert_eq!(store.active_owner_count(customer).await.unwrap(), 1);
    cx.teardown().await;
}

/// The batch statements that name their rows in a JSON list find each row by its key,
/// however few rows the tables hold. The planner guesses 100 rows for any set-returning
/// function: written as joins, on PostgreSQL these read the whole message log and the
/// whole outbox (hash joins) until the tables had some tens of thousands of rows, the
/// first cost of a send there (BENCHMARKS.md, issue 22).
#[tokio::test]
async fn batch_statements_find_their_rows_by_key() {
    use gateway_server::store::{Backend, keyed_statements as sql};
    use sqlx::{Connection, Row};
    let cx = TestContext::new("keyed_plans").await;
    let mut conn = sqlx::AnyConnection::connect(&cx.config.database_url).await.unwrap();
    let postgres = cx.store().backend() == Backend::Postgres;
    // 3,000 rows in each: as many as a few seconds of sends leave.
    let numbers = if postgres {
        "SELECT n FROM generate_series(1, 3000) AS n"
    } else {
        "WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 3000) SELECT n FROM s"
    };
    let seed = [
        format!(
            "INSERT INTO message_log (customer_id, source, decision, status, created_at, recipient, policy_trace) \
             SELECT '{}', 'api', 'allowed', 'sent', n, '+14155550100', 'a trace of some length' FROM ({numbers}) AS t",
            cx.tenant.customer_id
        ),
        format!(
            "INSERT INTO outbox (customer_id, event_type, payload, created_at, available_at) \
             SELECT '{}', 'message.sent', '{{\"a\":\"payload of some length\"}}', n, n FROM ({numbers}) AS t",
            cx.tenant.customer_id
        ),
    ];
    for statement in seed {
        sqlx::query(&statement).execute(&mut conn).await.unwrap();
    }
    let ids: Vec<i64> = (1..=12).collect();
    let inputs = serde_json::to_string(
        &ids.iter().map(|id| serde_json::json!({"log_id": id, "context": "{}"})).collect::<Vec<_>>(),
    )
    .unwrap();
    let ids = serde_json::to_string(&ids).unwrap();
    let plans: Vec<(&str, String)> = if postgres {
        sqlx::query("ANALYZE message_log").execute(&mut conn).await.unwrap();
        sqlx::query("ANALYZE outbox").execute(&mut conn).await.unwrap();
        // The plan the gateway runs after five executions of a prepared statement.
        sqlx::query("SET plan_cache_mode = force_generic_plan").execute(&mut conn).await.unwrap();
        let mut plans = Vec::new();
        for (name, statement, args) in [
            ("keep", sql::KEEP_BATCH_POSTGRES, format!("'{inputs}', 'erased'")),
            ("skip", sql::SKIP_POSTGRES, format!("1, 'skipped_no_endpoint', '{ids}'")),
        ] {
            sqlx::query(&format!("PREPARE {name} AS {statement}")).execute(&mut conn).await.unwrap();
            let rows = sqlx::query(&format!("EXPLAIN EXECUTE {name}({args})")).fetch_all(&mut conn).await.unwrap();
            let plan: Vec<String> = rows.iter().map(|r| r.get::<String, _>(0)).collect();
            plans.push((name, plan.join("\n")));
        }
        plans
    } else {
        let mut plans = Vec::new();
        for (name, statement, args) in [
            ("keep", sql::KEEP_SQL, vec!["5".to_string(), "'{}'".into(), "'erased'".into()]),
            ("skip", sql::SKIP_SQLITE, vec!["1".into(), "'skipped_no_endpoint'".into(), format!("'{ids}'")]),
        ] {
            let mut text = statement.to_string();
            for (i, arg) in args.iter().enumerate().rev() {
                text = text.replace(&format!("${}", i + 1), arg);
            }
            let rows = sqlx::query(&format!("EXPLAIN QUERY PLAN {text}")).fetch_all(&mut conn).await.unwrap();
            let plan: Vec<String> = rows.iter().map(|r| r.get::<String, _>("detail")).collect();
            plans.push((name, plan.join("\n")));
        }
        plans
    };
    for (name, plan) in plans {
        let table = if name == "keep" { "message_log" } else { "outbox" };
        let keyed = if postgres {
            !plan.contains("Seq Scan") && plan.contains(&format!("{table}_pkey"))
        } else {
            plan.contains(&format!("SEARCH {table} USING INTEGER PRIMARY KEY"))
                && !plan.contains(&format!("SCAN {table}"))
        };
        assert!(keyed, "{name} must find its {table} rows by key:\n{plan}");
    }
    conn.close().await.unwrap();
    cx.teardown().await;
}

/// The counters a refused or failed send gives back are found by key, however few rows
/// the counters' table holds. On PostgreSQL the batch functions give them back with
/// `UPDATE ... FROM jsonb_array_elements(...)`, which the planner sized at 100 rows and
/// joined by hashing, a sequential scan of the whole table, while it held some thousands
/// of rows (migration 0016 plans those functions with nested loops only).
#[tokio::test]
async fn releases_find_their_counters_by_key() {
    use gateway_server::store::{Backend, keyed_statements as sql};
    use sqlx::{Connection, Row};
    let cx = TestContext::new("keyed_release").await;
    let mut conn = sqlx::AnyConnection::connect(&cx.config.database_url).await.unwrap();
    if cx.store().backend() == Backend::Sqlite {
        // The writer gives each counter back with a statement of its own.
        let text = sql::RELEASE_SQL.replace("$1", "'day:x'").replace("$2", "0");
        let rows = sqlx::query(&format!("EXPLAIN QUERY PLAN {text}")).fetch_all(&mut conn).await.unwrap();
        let plan: Vec<String> = rows.iter().map(|r| r.get::<String, _>("detail")).collect();
        assert!(
            plan.iter()
                .any(|p| p.starts_with("SEARCH usage_counters USING") && p.contains("scope=? AND window_start=?")),
            "{plan:?}"
        );
    } else {
        sqlx::query(
            "INSERT INTO usage_counters (scope, window_start, count, expires_at, lim) \
             SELECT 'rcpt:seed:' || n, 0, 1, 0, 100 FROM generate_series(1, 10000) AS n",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        sqlx::query("ANALYZE usage_counters").execute(&mut conn).await.unwrap();
        let r = serde_json::json!([
            {"scope": "rcpt:seed:5", "window_start": 0, "expires_at": 0, "limit": 100},
            {"scope": "rcpt:seed:6", "window_start": 0, "expires_at": 0, "limit": 100},
        ]);
        let log = serde_json::json!({"customer_id": cx.tenant.customer_id, "source": "api", "decision": "allowed",
                                     "status": "pending", "created_at": 1});
        let call = |ops: serde_json::Value| format!("SELECT gateway_send_ops('{ops}'::jsonb)::text AS a");
        sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
        let before = sequential_scans(&mut conn, "usage_counters").await;
        let begun = sqlx::query(&call(
            serde_json::json!([{"op": "begin", "r": r, "log": log, "deadline_at": 1, "idem": null}]),
        ))
        .fetch_one(&mut conn)
        .await
        .unwrap()
        .get::<String, _>("a");
        let begun: serde_json::Value = serde_json::from_str(&begun).unwrap();
        assert_eq!(begun[0]["counts"], serde_json::json!([2, 2]), "{begun}");
        let finish = serde_json::json!([{"op": "finish", "id": begun[0]["id"], "status": "refused",
                                         "decision": "refused", "release": r, "idem": null}]);
        let finished = sqlx::query(&call(finish)).fetch_one(&mut conn).await.unwrap().get::<String, _>("a");
        assert_eq!(finished, r#"[{"applied": true}]"#);
        assert_eq!(seed_counts(&mut conn).await, [1, 1], "both counters given back");
        // The older batch function gives counters back the same way (its `release`).
        let release = serde_json::json!([{"op": "release", "r": r}]);
        sqlx::query(&format!("SELECT gateway_write_batch('{release}'::jsonb)::text AS a"))
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(seed_counts(&mut conn).await, [0, 0], "given back by gateway_write_batch too");
        assert_eq!(sequential_scans(&mut conn, "usage_counters").await, before, "no counter was looked for by a scan");
        sqlx::query("COMMIT").execute(&mut conn).await.unwrap();
    }
    conn.close().await.unwrap();
    cx.teardown().await;
}

/// The two counters `releases_find_their_counters_by_key` gives back.
async fn seed_counts(conn: &mut sqlx::AnyConnection) -> Vec<i64> {
    sqlx::query_scalar("SELECT count FROM usage_counters WHERE scope IN ('rcpt:seed:5', 'rcpt:seed:6') ORDER BY scope")
        .fetch_all(&mut *conn)
        .await
        .unwrap()
}

/// PostgreSQL's count of sequential scans of `table`, this session's included.
async fn sequential_scans(conn: &mut sqlx::AnyConnection, table: &str) -> i64 {
    // This transaction's own scans. The table-wide count also took the scans of the
    // gateway's own connections, which PostgreSQL adds when it flushes their statistics
    // (up to seconds later): on a loaded machine, two arrived between the reads (CI,
    // 2026-11-28).
    sqlx::query_scalar("SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = $1")
        .bind(table)
        .fetch_one(&mut *conn)
        .await
        .unwrap()
}

/// PostgreSQL drops the gateway's connections (a restart, an administrator's
/// `pg_terminate_backend`) while they sit in the pool. The sends right after answer 200:
/// nothing is lost or sent twice, and they find new connections. The pools no longer ask
/// every connection before handing it out (`store::pool_options`): a read that meets a
/// dropped one is asked again, and a writer's batch that does is run again once its
/// receipt says it did not commit (`store::writer`). It was 503 for a batch before the
/// receipts, and 500 before that. SQLite has no server connections to drop; there the
/// test has nothing to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_after_the_database_dropped_the_connections_answer_200() {
    use gateway_server::store::Backend;
    use sqlx::{Connection, Row};
    let cx = TestContext::new("dropped").await;
    if cx.store().backend() == Backend::Postgres {
        let send = |n: u32| {
            serde_json::json!({"instance_id": "main", "phone": format!("+1415555{n:04}"),
                               "message_purpose": "transactional", "message": "Your order has shipped."})
        };
        assert_eq!(cx.send_json(&send(1)).await.0, 200);
        let mut conn = sqlx::AnyConnection::connect(&cx.config.database_url).await.unwrap();
        let dropped = sqlx::query(
            "SELECT count(*) AS n FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()) AS t",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap()
        .get::<i64, _>("n");
        assert!(dropped > 0, "the gateway's connections were dropped");
        conn.close().await.unwrap();
        let mut answers = Vec::new();
        for n in 2..14 {
            answers.push(cx.send_json(&send(n)).await);
        }
        for (status, body) in &answers {
            assert_eq!(*status, 200, "{body}");
        }
        let sent = answers.len() + 1;
        let log = cx.store().recent_log(&cx.tenant.customer_id, 100).await.unwrap();
        assert_eq!(log.iter().filter(|(_, e)| e.status == "sent").count(), sent, "each 200 once, no other");
    }
    cx.teardown().await;
}
