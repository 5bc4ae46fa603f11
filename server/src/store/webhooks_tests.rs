//! On PostgreSQL a batch of finished attempts is written by three statements over the
//! batch (migration 0019), unless two of its writes meet, when it runs the loop of 0004
//! (`gateway_webhook_finish_each`). Held here to that loop applied one write at a time:
//! the same batches on two fresh databases, then every row compared.

use super::*;
use crate::store::test_postgres::{drop_database, postgres_store};

/// A customer, an instance with an endpoint, and `events` undelivered events (ids 1 up).
async fn world(store: &Store, events: usize) -> (String, String) {
    let customer = store.create_customer("finish", None, true).await.unwrap();
    let instance = store.create_instance(&customer.id, "main", "simulator", true, None).await.unwrap();
    store.set_webhook(&instance.id, "http://127.0.0.1:9/", &["all".into()], None).await.unwrap();
    for _ in 0..events {
        sqlx::query(
            "INSERT INTO outbox (customer_id, instance_id, event_type, payload, created_at, available_at) \
             VALUES ($1, $2, 'message.sent', '{}', 0, 0)",
        )
        .bind(&customer.id)
        .bind(&instance.id)
        .execute(&store.write)
        .await
        .unwrap();
    }
    (customer.id, instance.id)
}

/// One finished attempt as the writer hands it to the batch function; `event` 0 is a
/// test event (no outbox row).
fn op(
    ids: &(String, String),
    event: i64,
    trigger: &str,
    ok: bool,
    state: EventState,
    change: EndpointChange,
) -> serde_json::Value {
    let at = 1_000 + event * 10 + i64::from(ok);
    let attempt = WebhookAttempt {
        outbox_id: (event > 0).then_some(event),
        customer_id: ids.0.clone(),
        instance_id: ids.1.clone(),
        event_type: "message.sent".into(),
        url: "http://127.0.0.1:9/".into(),
        trigger: trigger.into(),
        attempt: 1,
        attempted_at: at,
        status_code: Some(if ok { 200 } else { 500 }),
        latency_ms: 3,
        response_body: ok.then(|| "ok".into()),
        error: (!ok).then(|| "HTTP 500".into()),
        succeeded: ok,
        ..WebhookAttempt::default()
    };
    finish_json((event > 0).then_some(event), Some(&attempt), &state, &change, at + 1)
}

/// The batches, in order: each on its own is a batch of the writer.
fn batches(ids: &(String, String)) -> Vec<Vec<serde_json::Value>> {
    use EndpointChange::{Disable, Failed, Succeeded};
    use EventState::{Done, Retry, Unchanged};
    vec![
        // Three statements: deliveries, and a manual resend of a delivered event.
        vec![
            op(ids, 1, "scheduled", true, Done("delivered"), Succeeded),
            op(ids, 2, "scheduled", true, Done("delivered"), Succeeded),
            op(ids, 3, "manual", true, Unchanged, Succeeded),
        ],
        // One event finished twice (two replicas after a lease ended): counted twice.
        vec![
            op(ids, 4, "scheduled", true, Done("delivered"), Succeeded),
            op(ids, 4, "scheduled", true, Done("delivered"), Succeeded),
        ],
        // A success, then a failure that starts the failure clock and makes its event due.
        vec![
            op(ids, 6, "scheduled", true, Done("delivered"), Succeeded),
            op(ids, 5, "scheduled", false, Retry { at: 5_000 }, Failed),
        ],
        // Three statements again: a test event's success stops the clock.
        vec![
            op(ids, 0, "test", true, Unchanged, Succeeded),
            op(ids, 7, "scheduled", true, Done("delivered"), Succeeded),
        ],
        // A failure clock started and stopped in one batch, then a disable.
        vec![
            op(ids, 8, "scheduled", false, Retry { at: 6_000 }, Failed),
            op(ids, 9, "scheduled", true, Done("delivered"), Succeeded),
            op(ids, 10, "scheduled", false, Done("gone"), Disable("HTTP 410".into())),
        ],
        // Each alone makes the batch run the loop: a failure after a success (the clock
        // starts), an event made due again (its endpoint left as it is).
        vec![
            op(ids, 11, "scheduled", true, Done("delivered"), Succeeded),
            op(ids, 12, "scheduled", false, Done("failed"), Failed),
        ],
        vec![op(ids, 13, "scheduled", false, Retry { at: 7_000 }, EndpointChange::None)],
    ]
}

/// Every row the batches write, as text (the customer's and instance's random ids left out).
async fn rows(store: &Store) -> String {
    let sql = "SELECT json_build_array(
        (SELECT json_agg(t ORDER BY id) FROM (SELECT id, attempts, delivered_at, outcome, available_at, locked_until
            FROM outbox) t),
        (SELECT json_agg(t ORDER BY id) FROM (SELECT id, outbox_id, event_type, url, trigger_kind, attempt,
            attempted_at, status_code, latency_ms, response_body, error, succeeded FROM webhook_attempts) t),
        (SELECT json_agg(t) FROM (SELECT failing_since, disabled_at, disabled_reason FROM webhook_endpoints) t))::text";
    sqlx::query(sql).fetch_one(&store.write).await.unwrap().get::<String, _>(0)
}

async fn call(store: &Store, function: &str, ops: &[serde_json::Value]) -> String {
    let sql = format!("SELECT {function}($1::jsonb)::text");
    let arg = serde_json::to_string(ops).unwrap();
    sqlx::query(&sql).bind(arg).fetch_one(&store.write).await.unwrap().get::<String, _>(0)
}

#[tokio::test]
async fn a_batch_of_finished_attempts_writes_what_the_loop_writes_one_by_one() {
    let Some((batched, admin, db)) = postgres_store("finish_set").await else { return };
    let (one_by_one, _, db2) = postgres_store("finish_each").await.unwrap();
    let (ids, ids2) = (world(&batched, 13).await, world(&one_by_one, 13).await);
    for (batch, batch2) in batches(&ids).into_iter().zip(batches(&ids2)) {
        let answer = call(&batched, "gateway_webhook_finish", &batch).await;
        let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(answer, serde_json::json!(vec![serde_json::json!({}); batch.len()]));
        for op in batch2 {
            call(&one_by_one, "gateway_webhook_finish_each", &[op]).await;
        }
        assert_eq!(rows(&batched).await, rows(&one_by_one).await);
    }
    // And the batches did write: thirteen events, fifteen attempts, the endpoint
    // disabled and its failure clock started again.
    let all = rows(&batched).await;
    assert!(all.contains(r#""id":4,"attempts":2"#) && all.contains(r#""disabled_reason":"HTTP 410""#), "{all}");
    assert!(all.contains(r#""id":5,"attempts":1,"delivered_at":null,"outcome":null,"available_at":5000"#), "{all}");
    assert!(all.contains(r#""id":13,"attempts":1,"delivered_at":null,"outcome":null,"available_at":7000"#), "{all}");
    assert!(all.contains(r#""failing_since":1120"#), "{all}");
    let attempts: i64 =
        sqlx::query("SELECT count(*) FROM webhook_attempts").fetch_one(&batched.write).await.unwrap().get(0);
    assert_eq!(attempts, 15);
    drop_database(batched, &admin, &db).await;
    drop_database(one_by_one, &admin, &db2).await;
}
