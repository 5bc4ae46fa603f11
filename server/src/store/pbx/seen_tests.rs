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

/// A write of one replay check, as an admission makes it.
struct Remember(i64, i64, &'static str);

impl crate::store::writer::Write for Remember {
    type Output = bool;

    fn sqlite(&self, tx: &rusqlite::Transaction<'_>) -> Result<bool, StoreError> {
        sqlite_remember(tx, self.0, self.1, self.2)
    }

    fn postgres(&self) -> crate::store::writer::Postgres {
        unreachable!("SQLite's replay check")
    }

    fn read_postgres(&self, _answer: crate::store::writer::PgAnswer) -> Result<bool, StoreError> {
        unreachable!("SQLite's replay check")
    }
}

/// Runs `checks` as one batch of the writer on `conn`, on this thread (whose memory it
/// uses), with a write that fails after them if `fail`: what each check answered, or
/// `None` for a batch that failed.
fn batch(conn: &mut rusqlite::Connection, checks: &[Remember], fail: bool) -> Option<Vec<bool>> {
    use crate::store::writer::{Exec, Pending, Queued, Statement};
    let (mut units, mut answers) = (Vec::<Queued>::new(), Vec::new());
    for check in checks {
        let (reply, answer) = tokio::sync::oneshot::channel();
        units.push(Box::new(Pending { write: Remember(check.0, check.1, check.2), output: None, reply }));
        answers.push(answer);
    }
    if fail {
        let write = Exec(vec![Statement { sql: "INSERT INTO no_such_table VALUES (1)", params: vec![] }]);
        units.push(Box::new(Pending { write, output: None, reply: tokio::sync::oneshot::channel().0 }));
    }
    let failed = crate::store::writer::sqlite_batch(conn, &mut units).is_err();
    units.into_iter().for_each(|unit| unit.reply(failed.then(|| StoreError::Conflict("failed".into()))));
    let answers: Vec<bool> = answers.into_iter().filter_map(|mut a| a.try_recv().unwrap().ok()).collect();
    (!failed).then_some(answers)
}

#[tokio::test]
async fn a_batch_rolled_back_forgets_the_signatures_it_remembered() {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = writer_connection(&dir).await;
    let ts = now_ms() / 1000;
    assert_eq!(batch(&mut conn, &[Remember(ts, 1, "s0")], false), Some(vec![true]));
    assert_eq!(remembered(), 1);
    // A batch that fails after its checks: rolled back, as the writer does with it. Its
    // two appends moved the last id read twice; both moves are undone, last first.
    let lost = [Remember(ts, 1, "s1"), Remember(ts, 1, "s1"), Remember(ts, 1, "s3")];
    assert_eq!(batch(&mut conn, &lost, true), None);
    assert_eq!(remembered(), 1, "s1 and s3 forgotten with the batch's rows, s0 kept");
    let logged: i64 = conn.query_row("SELECT count(*) FROM pbx_signature_log", [], |r| r.get(0)).unwrap();
    assert_eq!(logged, 1);
    // Another process appends in the meantime, at the ids the lost batch had taken.
    let other = rusqlite::Connection::open(dir.path().join("seen.db")).unwrap();
    other.execute("INSERT INTO pbx_signature_log (ts, integration_id, signature) VALUES (?1, 1, 's2')", [ts]).unwrap();
    // And one past the memory's window, which stays out of it.
    let past = ts - SIGNATURE_MEMORY_SECONDS - 1;
    other
        .execute("INSERT INTO pbx_signature_log (ts, integration_id, signature) VALUES (?1, 1, 'past')", [past])
        .unwrap();
    let run = [Remember(ts, 1, "s1"), Remember(ts, 1, "s2"), Remember(ts, 1, "s3"), Remember(ts, 1, "s1")];
    let run = batch(&mut conn, &run, false);
    assert_eq!(run, Some(vec![true, false, true, false]), "s1 and s3 admitted again; s2, the other process's, read");
    assert_eq!(remembered(), 4, "s0 to s3, not the past one");
    let run = batch(&mut conn, &[Remember(ts, 2, "s1"), Remember(ts + 1, 1, "s1"), Remember(ts, 1, "s0")], false);
    assert_eq!(run, Some(vec![true, true, false]), "another integration, another timestamp, a replay");
    assert_eq!(remembered(), 6);
    // Outside the writer's transactions the check refuses to run: nothing there would
    // undo what it remembered.
    let tx = conn.transaction().unwrap();
    assert!(matches!(sqlite_remember(&tx, ts, 1, "s4"), Err(StoreError::Conflict(_))));
    drop(tx);
    // Forgotten by timestamp, older first.
    forget_signatures_before(ts + 1);
    assert_eq!(remembered(), 1);
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
