//! On PostgreSQL a batch of admissions checks each integration once, writes its
//! signatures and its log rows in one statement each, and reads and writes each rate
//! limiter once (migration 0020). Held here to the
//! loop of 0018 (`gateway_pbx_admit_each`) applied one admission at a time: the same
//! batches on two fresh databases, every answer and row compared.

use super::*;
use crate::store::test_postgres::{drop_database, postgres_store};
use serde_json::{Value, json};
use sqlx::Row;

/// A customer, an instance and a PBX integration (id 1), as the webhook would have read it.
async fn world(store: &Store) -> PbxIntegration {
    let customer = store.create_customer("admit", None, true).await.unwrap();
    let instance = store.create_instance(&customer.id, "main", "simulator", true, None).await.unwrap();
    let id = store.create_pbx_integration(&customer.id, &instance.id, "hash", "pbx_", Some("key"), None).await.unwrap();
    store.pbx_integration(id).await.unwrap().unwrap()
}

/// An admission: `signature` (if any), a rate check that admits three and refuses the
/// fourth, and a log row unless `log` is false.
fn admit(used: &PbxIntegration, signature: Option<&str>, rate: bool, log: bool) -> Value {
    let row = PbxEvent {
        integration_id: used.id,
        customer_id: used.customer_id.clone(),
        event_type: "test".into(),
        action: "received".into(),
        status_code: 200,
        phone: Some("+14155550100".into()),
        response: Some(format!(r#"{{"signature":{signature:?}}}"#)),
        created_at: 1_000,
        ..PbxEvent::default()
    };
    let write = PbxAdmit {
        used: Arc::new(used.clone()),
        signature: signature.map(str::to_string),
        signature_ts: 1_764_000_000,
        rate: rate.then(|| RateCheck { key: "pbx:test".into(), interval_ms: 60_000, tolerance_ms: 120_000 }),
        log: log.then_some(row),
    };
    let Postgres::Call { arg, .. } = write.postgres() else { panic!("an admission is a call") };
    arg
}

fn batches(used: &PbxIntegration) -> Vec<Vec<Value>> {
    let changed = PbxIntegration { secret_hash: "rotated".into(), ..used.clone() };
    let mut old_form = admit(used, Some("s8"), false, true);
    old_form.as_object_mut().unwrap().remove("used");
    let mut other_key = admit(used, Some("s10"), true, true);
    other_key["rate"]["key"] = json!("pbx:other");
    // A limiter without tolerance (a burst of one): the first passes, the next waits a
    // whole interval.
    let strict = |signature: &str| {
        let mut op = admit(used, Some(signature), true, true);
        op["rate"] = json!({"key": "pbx:strict", "interval": 60_000, "tolerance": 0});
        op
    };
    vec![
        // Admitted, admitted, the first one's replay within the batch, admitted unlogged.
        vec![
            admit(used, Some("s1"), true, true),
            admit(used, Some("s2"), true, true),
            admit(used, Some("s1"), true, true),
            admit(used, Some("s3"), true, false),
        ],
        // A replay of the last batch, the fourth through the limit (logged as refused),
        // one through a new limiter, and one without a signature.
        vec![
            admit(used, Some("s1"), true, true),
            admit(used, Some("s4"), true, true),
            other_key,
            admit(used, None, false, true),
        ],
        // A stale one between two that are not; a caller of 0003's form (no "used").
        vec![
            admit(used, Some("s5"), false, true),
            admit(&changed, Some("s6"), false, true),
            admit(used, Some("s7"), false, true),
            old_form,
        ],
        // Only stale ones.
        vec![admit(&changed, Some("s9"), false, true)],
        vec![strict("s11"), strict("s12")],
        // Only refusals: the limiter is left as it was.
        vec![strict("s13")],
    ]
}

/// An answer with the time until the limit passes read as whether it refused (the two
/// databases' clocks differ).
fn decided(answer: &Value) -> Value {
    match answer.get("rate_limited_for_ms") {
        Some(ms) => json!({"replay": answer["replay"], "refused": !ms.is_null(), "log_id": answer["log_id"]}),
        None => answer.clone(),
    }
}

/// The function's answers, one an admission.
async fn call(store: &Store, function: &str, ops: &[Value]) -> Vec<Value> {
    let sql = format!("SELECT {function}($1::jsonb)::text");
    let text: String = sqlx::query(&sql)
        .bind(serde_json::to_string(ops).unwrap())
        .fetch_one(&store.write)
        .await
        .unwrap()
        .try_get(0)
        .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Every row an admission writes, as text (the customer's random id left out).
async fn rows(store: &Store) -> String {
    let sql = "SELECT json_build_array(
        (SELECT json_agg(t ORDER BY id) FROM (SELECT id, integration_id, event_type, action, status_code, error_code,
            phone, message_id, external_message_id, response, created_at FROM pbx_events) t),
        (SELECT json_agg(t ORDER BY signature) FROM pbx_seen_signatures t),
        (SELECT json_agg(key ORDER BY key) FROM rate_limits))::text";
    sqlx::query(sql).fetch_one(&store.write).await.unwrap().try_get::<String, _>(0).unwrap()
}

#[tokio::test]
async fn a_batch_of_admissions_answers_and_writes_what_the_loop_does_one_by_one() {
    let Some((batched, admin, db)) = postgres_store("admit_set").await else { return };
    let (one_by_one, _, db2) = postgres_store("admit_each").await.unwrap();
    let (used, used2) = (world(&batched).await, world(&one_by_one).await);
    let (mut answers, mut waits) = (Vec::new(), Vec::new());
    for (batch, batch2) in batches(&used).into_iter().zip(batches(&used2)) {
        let raw = call(&batched, "gateway_pbx_admit", &batch).await;
        waits.extend(raw.iter().filter_map(|a| a["rate_limited_for_ms"].as_i64()));
        let got: Vec<Value> = raw.iter().map(decided).collect();
        let mut want = Vec::new();
        for op in batch2 {
            want.extend(call(&one_by_one, "gateway_pbx_admit_each", &[op]).await.iter().map(decided));
        }
        assert_eq!(got, want);
        assert_eq!(rows(&batched).await, rows(&one_by_one).await);
        answers.extend(got);
    }
    // And the batches decided: the replays, the refusal, the stale ones, the log ids.
    let replay = json!({"replay": true});
    let stale = json!({"stale": true});
    let admitted = |refused: bool, log: Option<i64>| json!({"replay": false, "refused": refused, "log_id": log});
    assert_eq!(
        answers,
        [
            admitted(false, Some(1)),
            admitted(false, Some(2)),
            replay.clone(),
            admitted(false, None),
            replay,
            admitted(true, Some(3)),
            admitted(false, Some(4)),
            admitted(false, Some(5)),
            admitted(false, Some(6)),
            stale.clone(),
            admitted(false, Some(7)),
            admitted(false, Some(8)),
            stale,
            admitted(false, Some(9)),
            admitted(true, Some(10)),
            admitted(true, Some(11)),
        ]
    );
    // How long each refused one was told to wait: a minute less the tolerance's two,
    // less the run's time, on the first limiter; a whole minute on the strict one.
    assert_eq!(waits.len(), 3, "{waits:?}");
    assert!(waits.iter().all(|ms| (55_000..=60_000).contains(ms)), "{waits:?}");
    // The limiters' arrival times (the databases' clocks differ by the run's few ms):
    // three admitted on one, one on each of the others, each written back with its expiry.
    let tats = |store: &Store| {
        let pool = store.write.clone();
        async move {
            let sql = "SELECT key, tat, expires_at FROM rate_limits ORDER BY key";
            let rows = sqlx::query(sql).fetch_all(&pool).await.unwrap();
            rows.iter().map(|r| (r.get::<String, _>(0), r.get::<i64, _>(1), r.get::<i64, _>(2))).collect::<Vec<_>>()
        }
    };
    let (a, b) = (tats(&batched).await, tats(&one_by_one).await);
    assert_eq!(a.len(), 3);
    for ((key, tat, expires), (_, tat2, _)) in a.iter().zip(&b) {
        assert_eq!(tat, expires, "{key}");
        assert!((tat - tat2).abs() < 5_000, "{key}: {tat} against {tat2}");
    }
    let now = chrono::Utc::now().timestamp_millis();
    assert!((a[2].1 - now - 180_000).abs() < 5_000, "three steps of a minute: {a:?}");
    assert!((a[0].1 - now - 60_000).abs() < 5_000, "one step: {a:?}");
    assert!((a[1].1 - now - 60_000).abs() < 5_000, "one step: {a:?}");
    let refused: String =
        sqlx::query("SELECT action FROM pbx_events WHERE id = 3").fetch_one(&batched.write).await.unwrap().get(0);
    assert_eq!(refused, "rate_limited");
    drop_database(batched, &admin, &db).await;
    drop_database(one_by_one, &admin, &db2).await;
}
