//! Retention (rows past their time go, and only those) and erasure of one person's data
//! for a data-subject request (every table; the message log redacted, an opt-out kept).

use crate::{expect_error, text};
use gateway_sdk_tests::TestContext;
use gateway_server::store::retention::tables;
use gateway_server::store::{Store, now_ms};
use serde_json::json;
use sqlx::{Connection, Executor, Row};

const DAY_MS: i64 = 24 * 3_600_000;
const PERSON: &str = "+5511999990002";
const DIGITS: &str = "5511999990002";

async fn connect(cx: &TestContext) -> sqlx::AnyConnection {
    sqlx::any::install_default_drivers();
    sqlx::AnyConnection::connect(&cx.config.database_url).await.unwrap()
}

async fn count(conn: &mut sqlx::AnyConnection, sql: &str) -> i64 {
    sqlx::query(sql).fetch_one(&mut *conn).await.unwrap().try_get::<i64, _>(0).unwrap()
}

/// The provider posts an inbound message from `phone` to the instance's ingress.
async fn inbound(cx: &TestContext, secret: &str, phone_digits: &str, id: &str, text: &str) {
    let body = json!({"event": "messages.upsert", "instance": "x", "data": {
        "key": {"remoteJid": format!("{phone_digits}@s.whatsapp.net"), "fromMe": false, "id": id},
        "message": {"conversation": text}, "messageType": "conversation", "messageTimestamp": now_ms() / 1000}});
    let answer = cx
        .http
        .post(format!("{}/internal/provider/evolution/{}", cx.base_url, cx.tenant.instance_id))
        .header("x-gateway-ingress", secret)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
}

async fn with_ingress(cx: &TestContext) -> String {
    let secret = "ing_test_secret_for_privacy";
    let hash = gateway_server::pbx::auth::hash_secret(secret);
    cx.store().set_ingress_secret_hash(&cx.tenant.instance_id, &hash).await.unwrap();
    secret.to_string()
}

#[tokio::test]
async fn retention_deletes_rows_past_their_time_and_nothing_else() {
    let cx = TestContext::new("retention").await;
    cx.lift_velocity(&cx.tenant.customer_id).await;
    let secret = with_ingress(&cx).await;
    for n in 0..3 {
        cx.client.message_send(&text("main", &format!("+1415555010{n}"), "Your code is 1")).await.unwrap();
    }
    inbound(&cx, &secret, "14155550100", "IN-1", "Thanks").await;
    inbound(&cx, &secret, "14155550101", "IN-2", "Thanks").await;
    let store = cx.store();
    let failed = store.store_provider_event(&cx.tenant.instance_id, "bad", "{").await.unwrap();
    store.finish_provider_event(failed, Some("not JSON")).await.unwrap();
    let mut conn = connect(&cx).await;
    // The sends' policy inputs are kept by a job of their own (on PostgreSQL a tenth of a
    // second later, `policy::inputs`): waited for, so that none is written between the
    // count and the delete below with the back-dated time of its send.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while count(&mut conn, "SELECT COUNT(*) FROM policy_inputs").await < 3 {
        assert!(std::time::Instant::now() < deadline, "the three sends' policy inputs were not kept");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let old = now_ms() - 100 * DAY_MS;
    // Two sends and one inbound message are 100 days old; one of the old sends is
    // still pending (never deleted before it settles).
    let ids: Vec<i64> = sqlx::query("SELECT id FROM message_log ORDER BY id")
        .fetch_all(&mut conn)
        .await
        .unwrap()
        .iter()
        .map(|r| r.try_get::<i64, _>(0).unwrap())
        .collect();
    conn.execute(format!("UPDATE message_log SET created_at = {old} WHERE id IN ({}, {})", ids[0], ids[1]).as_str())
        .await
        .unwrap();
    conn.execute(format!("UPDATE message_log SET status = 'pending' WHERE id = {}", ids[1]).as_str()).await.unwrap();
    conn.execute(
        format!("UPDATE inbound_messages SET received_at = {old} WHERE external_message_id = 'IN-1'").as_str(),
    )
    .await
    .unwrap();
    // Provider events: the applied ones are 2 days old (kept 24 hours), the failed one
    // too (kept 7 days).
    conn.execute(format!("UPDATE provider_events SET received_at = {}", now_ms() - 2 * DAY_MS).as_str()).await.unwrap();
    // A contact last messaged 400 days ago is forgotten; a sign-in throttle row of
    // yesterday goes.
    conn.execute(
        format!(
            "UPDATE contacts SET last_sent_at = {}, first_sent_at = 0 WHERE phone = '+14155550102'",
            old - 300 * DAY_MS
        )
        .as_str(),
    )
    .await
    .unwrap();
    conn.execute(
        format!(
            "INSERT INTO dashboard_login_throttle (bucket, failures, window_start, next_allowed_at) VALUES ('b', 4, {0}, {0})",
            now_ms() - DAY_MS
        )
        .as_str(),
    )
    .await
    .unwrap();

    // 1,500 lapsed rate-limit rows and one that is not: on SQLite they go in many
    // batches (each sized to hold the write lock about 2 ms), and every one goes.
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1500) \
         INSERT INTO rate_limits (key, tat, expires_at) SELECT 'lapsed-' || i, 0, 1 FROM n",
    )
    .await
    .unwrap();
    conn.execute(
        format!("INSERT INTO rate_limits (key, tat, expires_at) VALUES ('live', 0, {})", now_ms() + DAY_MS).as_str(),
    )
    .await
    .unwrap();

    // SQLite's log of PBX signatures: one past the window goes, one inside it stays.
    let sqlite = store.backend() == gateway_server::store::Backend::Sqlite;
    if sqlite {
        let now_s = now_ms() / 1000;
        conn.execute(
            format!(
                "INSERT INTO pbx_signature_log (ts, integration_id, signature) VALUES ({}, 1, 'past'), ({now_s}, 1, 'now')",
                now_s - 601
            )
            .as_str(),
        )
        .await
        .unwrap();
    }
    let plan = gateway_server::retention_plan(&cx.config, now_ms());
    // What a run counts before it deletes (to choose its pace) is what it then deletes.
    let backlog = store.retention_backlog(&plan).await.unwrap();
    let report = store.run_retention(&plan).await.unwrap();
    assert_eq!(backlog, report, "the rows counted past their time, against the rows deleted");
    let pruned = |table: &str| report.iter().find(|p| p.table == table).map(|p| p.rows).unwrap();
    assert_eq!(pruned("rate_limits"), 1500);
    assert_eq!(count(&mut conn, "SELECT COUNT(*) FROM rate_limits WHERE key = 'live'").await, 1);
    assert_eq!(pruned("message_log"), 1, "the old settled send; the old pending one stays");
    assert_eq!(pruned("inbound_messages"), 1);
    assert_eq!(pruned("provider_events"), 2, "the applied raw bodies; the failed one is kept to reprocess");
    assert_eq!(pruned("contacts"), 1);
    assert_eq!(pruned("dashboard_login_throttle"), 1);
    if sqlite {
        assert_eq!(pruned("pbx_signature_log"), 1);
        assert_eq!(count(&mut conn, "SELECT COUNT(*) FROM pbx_signature_log").await, 1);
    }
    assert_eq!(count(&mut conn, "SELECT COUNT(*) FROM message_log").await, 2);
    assert_eq!(count(&mut conn, "SELECT COUNT(*) FROM provider_events WHERE error IS NOT NULL").await, 1);
    // Every table the job keeps short is in its report, once.
    let named: Vec<&str> = report.iter().map(|p| p.table).collect();
    assert_eq!(named, tables(store.backend()));
    // A second run finds nothing more.
    let again = store.run_retention(&gateway_server::retention_plan(&cx.config, now_ms())).await.unwrap();
    assert!(again.iter().all(|p| p.rows == 0), "{again:?}");
    conn.close().await.ok();
    cx.teardown().await;
}

#[tokio::test]
async fn erasure_removes_or_redacts_a_person_in_every_table_and_keeps_the_opt_out() {
    let cx = TestContext::new("erase").await;
    cx.lift_velocity(&cx.tenant.customer_id).await;
    let secret = with_ingress(&cx).await;
    let store: &Store = cx.store();
    cx.client.message_send(&text("main", PERSON, "Your code is 1")).await.unwrap();
    cx.client.message_send(&text("main", PERSON, "Your code is 2")).await.unwrap();
    cx.client.message_send(&text("main", "+5511999990003", "Your code is 3")).await.unwrap();
    inbound(&cx, &secret, DIGITS, "IN-1", "Is my order ready?").await;
    inbound(&cx, &secret, DIGITS, "IN-2", "STOP").await;
    // Another customer's record of the same person is not this customer's to erase.
    let other = gateway_sdk_tests::create_tenant(store, &cx.config, "Other", Some("starter")).await;
    cx.client_with_key(&other.api_key).message_send(&text("main", PERSON, "Your code is 4")).await.unwrap();

    let report = store.erase_person(&cx.tenant.customer_id, PERSON).await.unwrap();
    let rows = |table: &str| report.iter().find(|e| e.table == table).map(|e| (e.action, e.rows)).unwrap();
    assert_eq!(rows("message_log"), ("redacted", 2));
    assert_eq!(rows("inbound_messages"), ("deleted", 2));
    assert_eq!(rows("suppressed_recipients"), ("kept", 1), "the STOP is honoured after the erasure");
    assert!(rows("outbox").1 >= 3, "message.sent twice, message.received, recipient.opted_out: {report:?}");
    assert!(rows("contacts").1 >= 1 && rows("provider_events").1 >= 2, "{report:?}");

    // Nothing of this customer's names the person any more, in any table.
    let mut conn = connect(&cx).await;
    let customer = &cx.tenant.customer_id;
    let instance = &cx.tenant.instance_id;
    for (table, column, scope) in [
        ("message_log", "recipient", format!("customer_id = '{customer}'")),
        ("inbound_messages", "sender", format!("customer_id = '{customer}'")),
        ("outbox", "payload", format!("customer_id = '{customer}'")),
        ("review_queue", "recipient", format!("customer_id = '{customer}'")),
        ("contacts", "phone", format!("instance_id = '{instance}'")),
        ("contact_activity", "phone", format!("instance_id = '{instance}'")),
        ("lid_map", "phone", format!("instance_id = '{instance}'")),
        ("provider_events", "payload", format!("instance_id = '{instance}'")),
        ("pbx_events", "phone", format!("customer_id = '{customer}'")),
        ("usage_counters", "scope", format!("scope LIKE '%{instance}%'")),
    ] {
        let sql = format!("SELECT COUNT(*) FROM {table} WHERE {scope} AND {column} LIKE '%{DIGITS}%'");
        assert_eq!(count(&mut conn, &sql).await, 0, "{table}.{column} still names the person");
    }
    assert_eq!(
        count(&mut conn, &format!("SELECT COUNT(*) FROM message_log WHERE customer_id = '{customer}'")).await,
        3
    );
    // The other customer's row is untouched.
    let others = format!(
        "SELECT COUNT(*) FROM message_log WHERE customer_id = '{}' AND recipient = '{PERSON}'",
        other.customer_id
    );
    assert_eq!(count(&mut conn, &others).await, 1);
    // The opt-out still refuses a send.
    expect_error(cx.client.message_send(&text("main", PERSON, "Your code is 5")).await, 403, "recipient_suppressed");
    conn.close().await.ok();
    cx.teardown().await;
}

/// A request refused before its number was checked logs the number in E.164, and rows
/// logged before that with the number as given (`+1 415 555 0111`, ...) are erased
/// with it: erasure matches every stored spelling that reads as the same number, and
/// no other number.
#[tokio::test]
async fn erasure_finds_every_spelling_of_the_number() {
    use gateway_server::store::LogEntry;
    let cx = TestContext::new("erase_spellings").await;
    let store: &Store = cx.store();
    let customer = &cx.tenant.customer_id;
    // No purpose: refused before the number's turn, logged in E.164 all the same.
    let (status, body) =
        cx.send_json(&json!({"instance_id": "main", "phone": "+1 415 555 0111", "message": "Hi"})).await;
    assert_eq!((status, body["error"].as_str()), (422, Some("message_purpose_required")), "{body}");
    let logged = store.recent_log(customer, 1).await.unwrap();
    assert_eq!(logged[0].1.recipient.as_deref(), Some("+14155550111"));
    // Rows logged as given, before the log normalised refused numbers.
    let spellings = ["+1 415 555 0111", "1-415-555-0111", "001 (415) 555.0111", "+1\u{a0}415\u{a0}555\u{a0}0111"];
    let others = ["+1 415 555 0112", "(415) 555-0111", "0111", "not a number"];
    for raw in spellings.iter().chain(&others) {
        let entry = LogEntry {
            customer_id: customer.clone(),
            source: "api".into(),
            recipient: Some(raw.to_string()),
            decision: "refused".into(),
            error_code: Some("message_purpose_required".into()),
            policy: Some("gateway/schema".into()),
            reason: Some("message_purpose is required".into()),
            status: "refused".into(),
            created_at: now_ms(),
            ..LogEntry::default()
        };
        store.record_attempt(&entry, None).await.unwrap();
    }

    let report = store.erase_person(customer, "+14155550111").await.unwrap();
    let rows = |table: &str| report.iter().find(|e| e.table == table).map(|e| (e.action, e.rows)).unwrap();
    assert_eq!(rows("message_log"), ("redacted", 1 + spellings.len() as u64), "{report:?}");
    let mut conn = connect(&cx).await;
    let left: Vec<String> = sqlx::query_scalar(
        "SELECT recipient FROM message_log WHERE customer_id = $1 AND recipient <> '(erased)' ORDER BY id",
    )
    .bind(customer)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(left, others, "every spelling of the number is gone, and only those");
    let kept_reasons = count(
        &mut conn,
        &format!("SELECT COUNT(*) FROM message_log WHERE customer_id = '{customer}' AND reason IS NOT NULL"),
    )
    .await;
    assert_eq!(kept_reasons, others.len() as i64, "the erased rows' reasons are dropped");
    conn.close().await.ok();
    cx.teardown().await;
}
