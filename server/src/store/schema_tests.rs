//! The message log's indexes, as both stores' migrations leave them, and the plan of a
//! read inside the write transaction that depends on two of them.
//!
//! A send's row enters every index below whose condition it meets, and on SQLite each
//! index a commit touches is at least one more page of WAL (BENCHMARKS.md, issue 22:
//! the message log's pages a commit). So the list is held here: an index is added only
//! with a reader that needs it, and on both stores.

use super::ingress::LOST_SEND;
use super::test_postgres::{drop_database, migrated_sqlite, postgres_store, prepared_plans};

/// The message log's secondary indexes, and who reads by each.
const MESSAGE_LOG_INDEXES: &[&str] = &[
    // Retention, the time filters, the fleet's sends a minute, the delivery watchdog,
    // the policy inputs' first row since a time.
    "message_log_created",
    // A customer's log, newest first (keyset pages).
    "message_log_customer",
    // A customer's rows whose outcome is unknown, newest first: the log's `state=unknown`
    // filter (partial: unknown rows only).
    "message_log_customer_unknown",
    // An instance's log and its pages.
    "message_log_instance",
    // Recovery of attempts left pending, an echo's pending sends, and the log's
    // `state=pending` filter (partial: pending rows only; a row leaves it when it settles).
    "message_log_pending",
    // Status reports and echoes, by the provider's id (partial: rows that have one).
    "message_log_provider_id",
    // The fleet's refusals (partial: refused rows only).
    "message_log_refused",
    // An echo's sends whose outcome is unknown (partial: unknown rows only).
    "message_log_unknown",
];

#[tokio::test]
async fn the_message_log_has_the_same_indexes_on_both_stores_and_no_more() {
    let (_dir, conn) = migrated_sqlite("schema.db").await;
    let mut list = conn.prepare("SELECT name FROM pragma_index_list('message_log') ORDER BY name").unwrap();
    let sqlite: Vec<String> = list.query_map([], |r| r.get(0)).unwrap().collect::<Result<_, _>>().unwrap();
    assert_eq!(sqlite, MESSAGE_LOG_INDEXES, "SQLite");

    let Some((store, admin, db)) = postgres_store("schema_indexes").await else {
        return;
    };
    let rows = sqlx::query(
        "SELECT indexname::text FROM pg_indexes WHERE tablename = 'message_log' \
         AND indexname <> 'message_log_pkey' ORDER BY indexname",
    )
    .fetch_all(&store.read)
    .await;
    drop_database(store, &admin, &db).await;
    let postgres = rows.unwrap().iter().map(|r| sqlx::Row::try_get(r, 0)).collect::<Result<Vec<String>, _>>();
    assert_eq!(postgres.unwrap(), MESSAGE_LOG_INDEXES, "PostgreSQL");
}

/// The echo of a send whose answer was lost is matched inside the write transaction,
/// so its read must not grow with the sends of its ten-minute window: the pending rows
/// are read by `message_log_pending` and the unknown ones by `message_log_unknown`,
/// never by the time index and never by a scan of the table. On SQLite the store has no
/// statistics (the gateway runs no `ANALYZE`). On PostgreSQL sequential scans are priced
/// out, since an empty table's plan would read it whole, and the statement is prepared
/// as the driver prepares it: both the plan made for its values and the generic plan a
/// prepared statement may keep after five runs are held.
#[tokio::test]
async fn an_echo_of_a_lost_send_reads_only_the_pending_and_unknown_rows() {
    let (_dir, conn) = migrated_sqlite("plan.db").await;
    let mut plan = conn.prepare(&format!("EXPLAIN QUERY PLAN {LOST_SEND}")).unwrap();
    let params = rusqlite::params!["ins", "+1", 0i64, 10i64, 5i64];
    let lines: Vec<String> = plan.query_map(params, |r| r.get(3)).unwrap().collect::<Result<_, _>>().unwrap();
    let reads: Vec<&String> = lines.iter().filter(|l| l.contains("message_log")).collect();
    assert_eq!(reads.len(), 2, "SQLite: {lines:?}");
    assert!(reads[0].contains("USING INDEX message_log_pending"), "SQLite: {lines:?}");
    assert!(
        reads[1].starts_with("SEARCH") && reads[1].contains("USING INDEX message_log_unknown"),
        "SQLite: {lines:?}"
    );

    let Some((store, admin, db)) = postgres_store("lost_send_plan").await else {
        return;
    };
    let plans = prepared_plans(
        store,
        &admin,
        &db,
        &format!("PREPARE lost_send(text, text, bigint, bigint, bigint) AS {LOST_SEND}"),
        "EXECUTE lost_send('ins', '+1', 0, 10, 5)",
    )
    .await;
    for (mode, plan) in plans {
        assert!(!plan.contains("Seq Scan"), "PostgreSQL, {mode}: {plan}");
        assert!(plan.contains("message_log_pending"), "PostgreSQL, {mode}: {plan}");
        assert!(plan.contains("message_log_unknown"), "PostgreSQL, {mode}: {plan}");
        assert!(!plan.contains("message_log_created"), "PostgreSQL, {mode}: {plan}");
    }
}
