//! The message log's indexes, as both stores' migrations leave them.
//!
//! Every send enters its row in each of these indexes, and on SQLite each index a commit
//! touches is at least one more page of WAL (BENCHMARKS.md, issue 22: the message
//! log's pages a commit). So the list is held here: an index is added only with a
//! reader that needs it, and on both stores.

use super::Store;
use super::test_postgres::{drop_database, postgres_store};

/// The message log's secondary indexes, and who reads by each.
const MESSAGE_LOG_INDEXES: &[&str] = &[
    // Retention, the time filters, the fleet's sends a minute, the delivery watchdog.
    "message_log_created",
    // A customer's log, newest first (keyset pages).
    "message_log_customer",
    // An instance's log and its pages.
    "message_log_instance",
    // Attempts left pending by a process that stopped (partial: pending rows only).
    "message_log_pending",
    // Status reports and echoes, by the provider's id (partial: rows that have one).
    "message_log_provider_id",
    // The fleet's refusals (partial: refused rows only).
    "message_log_refused",
];

#[tokio::test]
async fn the_message_log_has_the_same_indexes_on_both_stores_and_no_more() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("schema.db");
    Store::open(&format!("sqlite://{}?mode=rwc", path.display()), 2, None).await.unwrap().close().await;
    let conn = rusqlite::Connection::open(&path).unwrap();
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
