//! SQLite's replay check (see the module's documentation): the signatures the writer
//! keeps in memory, brought up to date from `pbx_signature_log`. These tests open
//! SQLite files of their own, whichever store the suite runs on.

use super::*;

/// A migrated SQLite file in `dir`, its URL.
fn file(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}?mode=rwc", dir.path().join("seen.db").display())
}

async fn world(store: &Store) -> PbxIntegration {
    let customer = store.create_customer("seen", None, true).await.unwrap();
    let instance = store.create_instance(&customer.id, "main", "simulator", true, None).await.unwrap();
    let id = store.create_pbx_integration(&customer.id, &instance.id, "hash", "pbx_", Some("key"), None).await.unwrap();
    store.pbx_integration(id).await.unwrap().unwrap()
}

/// The signature's timestamp, one for the whole test: it is part of what a replay
/// repeats, so a timestamp read at each call would make "s2" a new signature whenever
/// a second ends between two calls.
fn signed_at() -> i64 {
    static AT: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *AT.get_or_init(|| now_ms() / 1000)
}

fn admit(used: &PbxIntegration, signature: &str) -> PbxAdmit {
    PbxAdmit {
        used: Arc::new(used.clone()),
        signature: Some(signature.to_string()),
        signature_ts: signed_at(),
        rate: None,
        log: None,
    }
}

async fn admitted(store: &Store, used: &PbxIntegration, signature: &str) -> bool {
    match store.pbx_admit(admit(used, signature)).await.unwrap() {
        Admission::Admitted { .. } => true,
        Admission::Replayed => false,
        Admission::Stale => panic!("the integration did not change"),
    }
}

#[tokio::test]
async fn a_signature_is_refused_again_by_another_replica_of_the_file_and_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let url = file(&dir);
    let (a, b) = (Store::open(&url, 2, None).await.unwrap(), Store::open(&url, 2, None).await.unwrap());
    let used = world(&a).await;
    assert!(admitted(&a, &used, "s1").await);
    // b's writer never saw s1 in memory: it reads a's row from the log.
    assert!(!admitted(&b, &used, "s1").await, "a replay through another replica");
    assert!(admitted(&b, &used, "s2").await);
    assert!(!admitted(&a, &used, "s2").await);
    assert!(!admitted(&a, &used, "s1").await, "a replay through the same replica");
    a.close().await;
    b.close().await;
    // A restarted gateway has nothing in memory: it reads the whole log.
    let c = Store::open(&url, 2, None).await.unwrap();
    assert!(!admitted(&c, &used, "s1").await);
    assert!(!admitted(&c, &used, "s2").await);
    assert!(admitted(&c, &used, "s3").await);
    // One row per signature accepted, none for a replay.
    let logged: i64 = sqlx::query_scalar("SELECT count(*) FROM pbx_signature_log").fetch_one(&c.read).await.unwrap();
    assert_eq!(logged, 3);
    c.close().await;
}

/// The writer's connection on a migrated file, opened as the writer opens it.
async fn writer_connection(dir: &tempfile::TempDir) -> rusqlite::Connection {
    Store::open(&file(dir), 1, None).await.unwrap().close().await;
    let path = dir.path().join("seen.db");
    crate::store::writer::sqlite_writer_connection(&path, crate::store::StoreOptions::default()).unwrap()
}

fn in_memory(conn: &rusqlite::Connection) -> i64 {
    conn.query_row("SELECT count(*) FROM temp.pbx_seen", [], |r| r.get(0)).unwrap()
}

#[tokio::test]
async fn a_batch_rolled_back_forgets_the_signatures_it_remembered() {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = writer_connection(&dir).await;
    let ts = now_ms() / 1000;
    let tx = conn.transaction().unwrap();
    assert!(sqlite_remember(&tx, ts, 1, "s1").unwrap());
    assert!(!sqlite_remember(&tx, ts, 1, "s1").unwrap(), "a replay within the batch");
    drop(tx); // rolled back, as the writer does with a batch that failed
    assert_eq!(in_memory(&conn), 0);
    // Another process appends in the meantime, at the id the lost batch had taken.
    let other = rusqlite::Connection::open(dir.path().join("seen.db")).unwrap();
    other.execute("INSERT INTO pbx_signature_log (ts, integration_id, signature) VALUES (?1, 1, 's2')", [ts]).unwrap();
    // And one past the memory's window, which stays out of it.
    let past = ts - SIGNATURE_MEMORY_SECONDS - 1;
    other
        .execute("INSERT INTO pbx_signature_log (ts, integration_id, signature) VALUES (?1, 1, 'past')", [past])
        .unwrap();
    let tx = conn.transaction().unwrap();
    assert!(sqlite_remember(&tx, ts, 1, "s1").unwrap(), "the batch run again admits it");
    assert!(!sqlite_remember(&tx, ts, 1, "s2").unwrap(), "the other process's row was read");
    tx.commit().unwrap();
    assert_eq!(in_memory(&conn), 2, "s1 and s2, not the past one");
    let tx = conn.transaction().unwrap();
    assert!(!sqlite_remember(&tx, ts, 1, "s1").unwrap());
    assert!(sqlite_remember(&tx, ts, 2, "s1").unwrap(), "another integration's signature");
    assert!(sqlite_remember(&tx, ts + 1, 1, "s1").unwrap(), "another timestamp");
    tx.commit().unwrap();
    // Forgotten by timestamp, older first.
    let tx = conn.transaction().unwrap();
    forget_signatures_before(&tx, ts + 1).unwrap();
    tx.commit().unwrap();
    assert_eq!(in_memory(&conn), 1);
}

#[test]
fn the_migration_keeps_the_signatures_seen_and_those_a_replica_of_the_last_version_records() {
    let conn = rusqlite::Connection::open_in_memory().unwrap();
    conn.execute_batch(
        "CREATE TABLE pbx_seen_signatures (ts BIGINT NOT NULL, integration_id BIGINT NOT NULL, \
         signature TEXT NOT NULL, PRIMARY KEY (ts, integration_id, signature)) WITHOUT ROWID; \
         INSERT INTO pbx_seen_signatures VALUES (20, 1, 'later'), (10, 1, 'earlier');",
    )
    .unwrap();
    conn.execute_batch(include_str!("../../../migrations/sqlite/0015_pbx_signature_log.sql")).unwrap();
    // What the previous version writes, during a rolling upgrade: a new signature is
    // copied into the log; one this version accepted changes no row, which the previous
    // version answers as a replay.
    let previous = "INSERT INTO pbx_seen_signatures (ts, integration_id, signature) VALUES (?1, ?2, ?3) \
                    ON CONFLICT (ts, integration_id, signature) DO NOTHING";
    assert_eq!(conn.execute(previous, rusqlite::params![30, 2, "old replica"]).unwrap(), 1);
    conn.execute("INSERT INTO pbx_signature_log (ts, integration_id, signature) VALUES (40, 1, 'this version')", [])
        .unwrap();
    assert_eq!(conn.execute(previous, rusqlite::params![40, 1, "this version"]).unwrap(), 0, "a replay");
    assert_eq!(conn.execute(previous, rusqlite::params![40, 2, "this version"]).unwrap(), 1, "another integration");
    let log: Vec<(i64, i64, i64, String)> = conn
        .prepare("SELECT id, ts, integration_id, signature FROM pbx_signature_log ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let want = [
        (1, 10, 1, "earlier"),
        (2, 20, 1, "later"),
        (3, 30, 2, "old replica"),
        (4, 40, 1, "this version"),
        (5, 40, 2, "this version"),
    ];
    assert_eq!(log, want.map(|(i, t, n, s)| (i, t, n, s.to_string())));
}
