//! Health routes for load balancers: live, and ready (store, migrations, policies).

use gateway_sdk_tests::TestContext;
use serde_json::Value;
use sqlx::{Connection, Executor};

async fn get(cx: &TestContext, path: &str) -> (u16, Value) {
    let response = cx.http.get(format!("{}{path}", cx.base_url)).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

#[tokio::test]
async fn live_and_ready_and_what_is_not_ready_is_named() {
    let cx = TestContext::new("health").await;
    assert_eq!(get(&cx, "/health/live").await, (200, serde_json::json!({"status": "live"})));
    let (status, body) = get(&cx, "/health/ready").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "ready");
    for check in ["store", "migrations", "policies"] {
        assert_eq!(body["checks"][check], "ok", "{body}");
    }
    // A migration this build knows is not applied (as while an older replica migrates).
    let mut conn = sqlx::AnyConnection::connect(&cx.config.database_url).await.unwrap();
    let latest = "(SELECT MAX(version) FROM _sqlx_migrations)";
    conn.execute(format!("UPDATE _sqlx_migrations SET success = false WHERE version = {latest}").as_str())
        .await
        .unwrap();
    let (status, body) = get(&cx, "/health/ready").await;
    assert_eq!((status, body["status"].as_str()), (503, Some("not_ready")), "{body}");
    assert!(body["checks"]["migrations"].as_str().unwrap().starts_with("migrations not applied"), "{body}");
    assert_eq!(body["checks"]["store"], "ok");
    conn.execute(format!("UPDATE _sqlx_migrations SET success = true WHERE version = {latest}").as_str())
        .await
        .unwrap();
    conn.close().await.ok();
    assert_eq!(get(&cx, "/health/ready").await.0, 200);
    cx.teardown().await;
}
