//! Velocity and quota: boundaries, details, and concurrency (no overshoot).

use crate::{expect_error, retryable, text};
use gateway_sdk_tests::TestContext;
use gateway_server::ops;
use gateway_server::store::LimitOverrides;

#[tokio::test]
async fn sixth_send_to_one_recipient_in_a_minute_is_throttled() {
    let cx = TestContext::new("recipient_velocity").await;
    // The window is a calendar minute: the six sends must fall in one, and take well
    // under ten seconds.
    gateway_sdk_tests::room_in_the_minute(10).await;
    let phone = "+14155550100";
    let mut results = Vec::new();
    for i in 0..6 {
        results.push(cx.client.message_send(&text("main", phone, &format!("n{i}"))).await);
    }
    let sixth = results.pop().unwrap();
    for (i, r) in results.iter().enumerate() {
        assert!(r.is_ok(), "send {i}: {r:?}");
    }
    assert!(retryable(sixth.as_ref().unwrap_err()));
    let e = expect_error(sixth, 429, "sending_throttled");
    let retry = e.details["retry_after_seconds"].as_i64().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(e.details["scope"], "recipient");
    assert_eq!(e.details["limit"], 5);
    // Another recipient is not throttled.
    cx.client.message_send(&text("main", "+14155550999", "other")).await.expect("other recipient");
    cx.teardown().await;
}

#[tokio::test]
async fn instance_velocity_applies_across_recipients() {
    let cx = TestContext::new("instance_velocity").await;
    let limits = LimitOverrides { instance_per_minute: Some(3), ..Default::default() };
    ops::set_limits(cx.store(), &cx.tenant.customer_id, &limits).await.unwrap();
    let mut statuses = Vec::new();
    for i in 0..4 {
        let r = cx.client.message_send(&text("main", &format!("+1415555{:04}", 200 + i), "x")).await;
        statuses.push(r.map(|_| 200).unwrap_or_else(|e| e.status().map_or(0, |s| s.as_u16())));
    }
    // Within one minute the fourth is refused; across a minute boundary all may pass.
    assert!(statuses == [200, 200, 200, 429] || statuses.iter().filter(|s| **s == 429).count() == 0, "{statuses:?}");
    cx.teardown().await;
}

#[tokio::test]
async fn the_100th_message_of_a_starter_day_passes_and_the_101st_is_429() {
    let cx = TestContext::new("daily_boundary").await;
    cx.lift_velocity(&cx.tenant.customer_id).await;
    // Ten recipients, ten messages each: within the pacing policy's ten a day to a
    // recipient who never replied.
    for i in 0..100 {
        cx.client
            .message_send(&text("main", &format!("+141555501{:02}", i % 10), &format!("message {i}")))
            .await
            .unwrap_or_else(|e| panic!("message {} of 100: {e:?}", i + 1));
    }
    let e = expect_error(
        cx.client.message_send(&text("main", "+14155550199", "101")).await,
        429,
        "daily_message_limit_exceeded",
    );
    assert_eq!(e.details["limit"], 100);
    assert_eq!(e.details["used"], 100);
    assert!(e.details["resets_at"].as_str().unwrap().ends_with("T00:00:00Z"), "{:?}", e.details);
    assert!(e.details["retry_after_seconds"].as_i64().unwrap() > 0);
    cx.teardown().await;
}

#[tokio::test]
async fn monthly_quota_is_the_plan_period() {
    let cx = TestContext::new("monthly").await;
    cx.lift_velocity(&cx.tenant.customer_id).await;
    let limits = LimitOverrides { monthly: Some(3), ..Default::default() };
    ops::set_limits(cx.store(), &cx.tenant.customer_id, &limits).await.unwrap();
    for i in 0..3 {
        cx.client.message_send(&text("main", "+14155550123", &format!("{i}"))).await.expect("within the month");
    }
    let e = expect_error(
        cx.client.message_send(&text("main", "+14155550123", "x")).await,
        429,
        "monthly_message_limit_exceeded",
    );
    assert_eq!((e.details["limit"].as_i64(), e.details["used"].as_i64()), (Some(3), Some(3)));
    let customer = cx.store().customer(&cx.tenant.customer_id).await.unwrap();
    let end = chrono::DateTime::from_timestamp_millis(customer.plan_period_end.unwrap()).unwrap();
    assert_eq!(e.details["resets_at"], end.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
    // The refused send took the day's counter before the month's was found full; that
    // increment is undone, so the day still counts exactly the three sent.
    let now = gateway_server::store::now_ms();
    let day = now - now.rem_euclid(86_400_000);
    assert_eq!(cx.store().counter(&format!("day:{}", cx.tenant.customer_id), day).await.unwrap(), 3);
    cx.teardown().await;
}

#[tokio::test]
async fn parallel_sends_never_exceed_the_quota() {
    let cx = TestContext::new("concurrency").await;
    cx.lift_velocity(&cx.tenant.customer_id).await;
    let limits = LimitOverrides { daily: Some(20), ..Default::default() };
    ops::set_limits(cx.store(), &cx.tenant.customer_id, &limits).await.unwrap();
    let sends = (0..60).map(|i| {
        let client = cx.client.clone();
        async move { client.message_send(&text("main", &format!("+1415555{:04}", 300 + i), "x")).await }
    });
    let results = futures::future::join_all(sends).await;
    let ok = results.iter().filter(|r| r.is_ok()).count();
    let refused = results
        .iter()
        .filter(|r| matches!(r, Err(gateway_client::Error::ErrorResponse(rv)) if rv.error == "daily_message_limit_exceeded"))
        .count();
    assert_eq!((ok, refused), (20, 40));
    let now = gateway_server::store::now_ms();
    let day = now - now.rem_euclid(86_400_000);
    assert_eq!(cx.store().counter(&format!("day:{}", cx.tenant.customer_id), day).await.unwrap(), 20);
    cx.teardown().await;
}

#[tokio::test]
async fn two_gateways_on_one_store_share_the_quota() {
    // Two servers over one database, as two replicas would run.
    let cx = TestContext::new("replicas").await;
    cx.lift_velocity(&cx.tenant.customer_id).await;
    let limits = LimitOverrides { daily: Some(10), ..Default::default() };
    ops::set_limits(cx.store(), &cx.tenant.customer_id, &limits).await.unwrap();
    let mut config = cx.config.clone();
    config.listen = "127.0.0.1:0".parse().unwrap();
    let log = slog::Logger::root(slog::Discard, slog::o!());
    let second = gateway_server::start_server(log, &config).await.unwrap();
    let other = gateway_client::Client::with_api_key(&format!("http://{}", second.local_addr()), &cx.tenant.api_key);
    let sends = (0..30).map(|i| {
        let client = if i % 2 == 0 { cx.client.clone() } else { other.clone() };
        async move { client.message_send(&text("main", &format!("+1415555{:04}", 400 + i), "x")).await }
    });
    let ok = futures::future::join_all(sends).await.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ok, 10);
    second.close().await.unwrap();
    cx.teardown().await;
}
