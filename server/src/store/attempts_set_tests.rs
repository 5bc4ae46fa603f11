//! On PostgreSQL a batch of begins, or of finishes, is written by a few statements over
//! the batch (migration 0021), and anything else by the loop of 0013
//! (`gateway_send_ops_each`). Held here to that loop applied one write at a time: the
//! same batches on two fresh databases, every answer and every row compared.

use super::*;
use crate::store::test_postgres::{drop_database, postgres_store};

fn r(scope: &str, limit: i64, expires_at: i64) -> Reservation {
    Reservation { scope: scope.into(), window_start: 60_000, expires_at, limit }
}

/// A begin of request `n` to `phone`, taking `reservations`.
fn begin(n: i64, phone: &str, reservations: Vec<Reservation>) -> serde_json::Value {
    let entry = LogEntry {
        customer_id: "cus_t".into(),
        instance_id: Some("ins_t".into()),
        api_key_id: Some("key_t".into()),
        source: "api".into(),
        purpose: Some("transactional".into()),
        recipient: Some(phone.into()),
        message_type: Some("text".into()),
        decision: "allowed".into(),
        status: "pending".into(),
        created_at: 1_000 + n,
        request_id: Some(format!("req_{n}")),
        ..LogEntry::default()
    };
    begin_json(&Begin { reservations, entry, deadline_at: 9_000 + n, idem: None, owner_lease: Some(n % 2) })
}

/// A finish of row `id` as `status` (an event for every status but `failed`).
fn finish(id: i64, status: &str, phone: &str, at: i64) -> serde_json::Value {
    let event = (status != "failed").then(|| OutboxEvent {
        customer_id: "cus_t".into(),
        instance_id: Some("ins_t".into()),
        event_type: format!("message.{status}"),
        payload: serde_json::json!({"id": id, "status": status}).to_string(),
        created_at: at,
    });
    finish_json(&Finish {
        log_id: id,
        status: status.into(),
        error_code: (status == "failed").then(|| "provider_error".into()),
        provider_message_id: (status == "sent").then(|| format!("wamid.{id}")),
        instance_id: Some("ins_t".into()),
        recipient: Some(phone.into()),
        at,
        event,
        ..Finish::default()
    })
}

/// A begin of request `n` with the idempotency key `key`, claimed by `owner`.
fn keyed_begin(n: i64, key: &str, owner: &str) -> serde_json::Value {
    let idem =
        IdemOwner { customer_id: "cus_t".into(), key: key.into(), owner: owner.into(), request_hash: "h".into() };
    let entry = LogEntry {
        customer_id: "cus_t".into(),
        recipient: Some("+15550000001".into()),
        source: "api".into(),
        decision: "allowed".into(),
        status: "pending".into(),
        created_at: 1_000 + n,
        ..LogEntry::default()
    };
    begin_json(&Begin {
        reservations: vec![r("day:c", 100, 5), r("rcpt:i:p1", 100, 5)],
        entry,
        deadline_at: 9_000 + n,
        idem: Some(idem),
        owner_lease: None,
    })
}

/// A finish of the keyed row `id` as `sent`, its key answered (or given up).
fn keyed_finish(id: i64, key: &str, answer: KeyFate) -> serde_json::Value {
    let mut f: serde_json::Value = finish(id, "sent", "+15550000001", 3_000 + id);
    f["idem"] = serde_json::json!({"customer_id": "cus_t", "key": key});
    f["answer"] = match answer {
        KeyFate::Keep(a) => serde_json::json!({"status": a.status, "body": a.body}),
        KeyFate::Release => serde_json::json!({"release": true}),
    };
    f
}

/// The batches, in order: each on its own is a batch of the writer.
fn batches() -> Vec<Vec<serde_json::Value>> {
    let released = Finish {
        log_id: 3,
        status: "failed".into(),
        instance_id: Some("ins_t".into()),
        recipient: Some("+15550000001".into()),
        at: 3_000,
        release: vec![r("day:c", 100, 5)],
        ..Finish::default()
    };
    let (p1, p2, p3) = ("+15550000001", "+15550000002", "+15550000003");
    let kept = KeyFate::Keep(Answer { status: 200, body: "{\"status\":\"sent\"}".into() });
    vec![
        // New counters made, stepped and written back once; the third begin finds the
        // recipient's counter full, gives the other two back (their limits changed by
        // it, as the loop's increment changes them), and nothing is written for it; a
        // begin that takes nothing.
        vec![
            begin(1, p1, vec![r("day:c", 100, 5), r("rcpt:i:p1", 2, 6), r("inst:i", 100, 7)]),
            begin(2, p1, vec![r("day:c", 100, 8), r("rcpt:i:p1", 2, 8), r("inst:i", 100, 8)]),
            begin(3, p1, vec![r("day:c", 50, 9), r("rcpt:i:p1", 2, 9), r("inst:i", 60, 9)]),
            begin(4, p2, vec![]),
            begin(5, p2, vec![r("day:c", 100, 5), r("rcpt:i:p2", 1, 6)]),
        ],
        // A full first counter; a new counter taken and given back (left at 0), then
        // taken by the next begin, and full for the ones after (named second by the last,
        // whose first counter holds another count).
        vec![
            begin(6, p3, vec![r("day:c", 3, 5), r("rcpt:i:p3", 1, 6)]),
            begin(7, p3, vec![r("rcpt:i:p3", 1, 6)]),
            begin(8, p3, vec![r("rcpt:i:p3", 1, 6)]),
            begin(9, p3, vec![r("inst:i", 100, 7), r("rcpt:i:p3", 1, 6)]),
        ],
        // Finishes: one contact twice, a failure (no event, no contact), a row that does
        // not exist.
        vec![
            finish(1, "sent", p1, 2_001),
            finish(2, "sent", p1, 2_002),
            finish(4, "failed", p2, 2_004),
            finish(99, "sent", p2, 2_099),
        ],
        // A row finished before (not applied), an unknown outcome (it may have gone out).
        vec![finish(1, "sent", p1, 2_101), finish(5, "unknown", p3, 2_105)],
        // Keys: one claimed, then lost by another owner in the same batch (its counters
        // given back, its id taken all the same), another claimed.
        vec![
            keyed_begin(11, "k1", "o1"),
            begin(12, p1, vec![]),
            keyed_begin(13, "k1", "o2"),
            keyed_begin(14, "k2", "o3"),
        ],
        // One key answered, one given up.
        vec![keyed_finish(6, "k1", kept), keyed_finish(9, "k2", KeyFate::Release), finish(7, "sent", p1, 3_007)],
        // Each of these runs the loop: counters given back; a begin beside a finish; one
        // row finished twice; a write alone.
        vec![finish_json(&released), finish(99, "sent", p2, 3_099)],
        vec![begin(15, p1, vec![r("day:c", 100, 5)]), finish(10, "sent", p3, 2_207)],
        vec![finish(8, "sent", p2, 2_308), finish(8, "failed", p2, 2_309)],
        vec![begin(16, p2, vec![r("day:c", 100, 5)])],
    ]
}

/// Every row the batches write, as text.
async fn rows(store: &Store) -> String {
    let sql = "SELECT json_build_array(
        (SELECT json_agg(t ORDER BY id) FROM (SELECT * FROM message_log) t),
        (SELECT json_agg(t ORDER BY id) FROM (SELECT id, customer_id, instance_id, event_type, payload, created_at,
            available_at, log_id FROM outbox) t),
        (SELECT json_agg(t ORDER BY instance_id, phone) FROM (SELECT * FROM contacts) t),
        (SELECT json_agg(t ORDER BY scope, window_start) FROM (SELECT * FROM usage_counters) t),
        (SELECT json_agg(t ORDER BY idem_key) FROM (SELECT idem_key, request_hash, owner, log_id, response_status,
            response_body, lease_until, expires_at FROM idempotency_keys) t))::text";
    sqlx::query(sql).fetch_one(&store.write).await.unwrap().get::<String, _>(0)
}

async fn call(store: &Store, function: &str, ops: &[serde_json::Value]) -> serde_json::Value {
    let sql = format!("SELECT {function}($1::jsonb)::text");
    let arg = serde_json::to_string(ops).unwrap();
    let text = sqlx::query(&sql).bind(arg).fetch_one(&store.write).await.unwrap().get::<String, _>(0);
    serde_json::from_str(&text).unwrap()
}

#[tokio::test]
async fn a_batch_of_begins_or_finishes_answers_and_writes_what_the_loop_does_one_by_one() {
    let Some((batched, admin, db)) = postgres_store("send_set").await else { return };
    let (one_by_one, _, db2) = postgres_store("send_each").await.unwrap();
    let mut answers = Vec::new();
    for batch in batches() {
        let answer = call(&batched, "gateway_send_ops", &batch).await;
        let mut each = Vec::new();
        for op in &batch {
            each.extend(
                call(&one_by_one, "gateway_send_ops_each", std::slice::from_ref(op)).await.as_array().unwrap().clone(),
            );
        }
        assert_eq!(answer, serde_json::Value::Array(each), "{batch:?}");
        assert_eq!(rows(&batched).await, rows(&one_by_one).await, "{batch:?}");
        answers.push(answer);
    }
    // And the batches did what they say: the third begin refused at its recipient with
    // two taken, the new counter given back and taken again, a contact counted once a
    // send (the last time the last in batch order, not the latest), a key lost.
    let refused = serde_json::json!({"ok": false, "index": 1, "used": 2});
    assert_eq!(answers[0][2], refused);
    assert_eq!(answers[0][4], serde_json::json!({"ok": true, "id": 4, "counts": [3, 1]}));
    assert_eq!(answers[1][0], serde_json::json!({"ok": false, "index": 0, "used": 3}));
    assert_eq!(answers[1][1], serde_json::json!({"ok": true, "id": 5, "counts": [1]}));
    assert_eq!(answers[1][2], serde_json::json!({"ok": false, "index": 0, "used": 1}));
    assert_eq!(answers[1][3], serde_json::json!({"ok": false, "index": 1, "used": 1}));
    assert_eq!(
        answers[2],
        serde_json::json!([{"applied": true}, {"applied": true}, {"applied": true}, {"applied": false}])
    );
    assert_eq!(answers[3], serde_json::json!([{"applied": false}, {"applied": true}]));
    let all = rows(&batched).await;
    assert!(all.contains(r#""phone":"+15550000001","first_sent_at":2001,"last_sent_at":3007,"sent_total":5"#), "{all}");
    assert_eq!(answers[4][2], serde_json::json!({"lost": true}));
    assert_eq!(answers[4][3]["id"], 9);
    assert!(
        all.contains(r#""idem_key":"k1","request_hash":"h","owner":"o1","log_id":6,"response_status":200"#),
        "{all}"
    );
    assert!(!all.contains(r#""idem_key":"k2","request_hash""#), "{all}");
    drop_database(batched, &admin, &db).await;
    drop_database(one_by_one, &admin, &db2).await;
}
