//! The dashboard's insight in a real browser (headless Chromium): a message's delivery
//! state after the simulator reports it read, its detail, every chart drawn with its
//! name and numbers, every page at 1280x800 and at phone width without sideways
//! scrolling (long codes, ids and reasons in the data), and the CSV export the page
//! links to. With `GATEWAY_SCREENSHOTS=DIR` the pages are saved for docs/dashboard.md.

use crate::browser::sign_in;
use gateway_sdk_tests::TestContext;
use gateway_sdk_tests::browser::Browser;
use gateway_sdk_tests::dashboard::signed_in;
use gateway_server::dashboard::roles::Role;
use serde_json::json;
use std::time::{Duration, Instant};

/// A correlation id as long as the API keeps, with no place to break it.
const LONG_ID: &str = "support-ticket-4411-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

/// The page's width against the window's: (scrollWidth, clientWidth).
async fn widths(b: &Browser) -> (u64, u64) {
    let v = b
        .client
        .execute("const d = document.documentElement; return [d.scrollWidth, d.clientWidth];", vec![])
        .await
        .unwrap();
    (v[0].as_u64().unwrap(), v[1].as_u64().unwrap())
}

/// Opens each page at this window width and checks nothing scrolls sideways.
async fn fits(b: &Browser, base: &str, pages: &[String], width: u32, height: u32) {
    b.client.set_window_size(width, height).await.unwrap();
    for path in pages {
        b.goto(&format!("{base}{path}")).await;
        b.find("main h1").await;
        let (scroll, client) = widths(b).await;
        assert!(
            client <= width as u64 && client + 40 >= width as u64,
            "{path}: the window is {client} px wide, not {width}"
        );
        assert!(scroll <= client, "{path} scrolls sideways at {width} px: {scroll} px of content in {client}");
    }
}

/// `fetch` a GET from the page, with its session; the body.
async fn fetch_text(b: &Browser, path: &str) -> String {
    let script = r#"
        const [path, done] = arguments;
        fetch(path, { credentials: "same-origin" }).then(r => r.text()).then(done).catch(e => done("ERROR " + e));
    "#;
    b.client.execute_async(script, vec![path.into()]).await.unwrap().as_str().unwrap().to_string()
}

/// Each chart of the page is drawn (a sized picture with a title) and has its table.
async fn charts_drawn(b: &Browser, ids: &[&str]) {
    for id in ids {
        let script = r#"
            const f = document.getElementById(arguments[0]);
            if (!f) return "missing";
            const svg = f.querySelector("svg[role=img]");
            const names = (svg && svg.getAttribute("aria-labelledby") || "").split(" ")
                .map(i => document.getElementById(i)).filter(Boolean).map(e => e.textContent.trim());
            const box = svg ? svg.getBoundingClientRect() : { width: 0, height: 0 };
            const rows = f.querySelectorAll("table.chart-data tbody tr").length;
            return [names.join(" | "), box.width, box.height, rows, f.querySelector("figcaption").textContent];
        "#;
        let v = b.client.execute(script, vec![(*id).into()]).await.unwrap();
        assert!(v.is_array(), "no chart {id}");
        let name = v[0].as_str().unwrap();
        assert!(name.contains(v[4].as_str().unwrap()) && name.len() > v[4].as_str().unwrap().len(), "{id}: {name}");
        assert!(v[1].as_f64().unwrap() > 200.0 && v[2].as_f64().unwrap() > 40.0, "{id} is drawn: {v}");
        assert!(v[3].as_u64().unwrap() >= 1, "{id} has its numbers: {v}");
    }
}

#[tokio::test]
async fn browser_delivery_state_charts_narrow_pages_and_the_export() {
    let cx = TestContext::with("browser_insight", |c| c.simulator_status_delay_ms = 50, None).await;
    let store = cx.store();
    cx.lift_velocity(&cx.tenant.customer_id).await;
    // Traffic: allowed sends the simulator reports delivered and read, refusals with long
    // codes and reasons, a suppressed recipient, a message held for review.
    for i in 0..3 {
        let body = json!({"instance_id": "main", "phone": format!("+1415555040{i}"), "message_purpose": "transactional",
                          "message": "Your order has shipped and will arrive on Tuesday."});
        let sent = cx
            .http
            .post(format!("{}/api/send-message", cx.base_url))
            .bearer_auth(&cx.tenant.api_key)
            .header("X-Correlation-Id", LONG_ID)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(sent.status(), 200);
    }
    let refused = json!({"instance_id": "main", "phone": "+14155550410", "message_purpose": "transactional",
                         "message": "Flash sale! 70% off everything, shop now before midnight"});
    assert_eq!(cx.send_json(&refused).await.0, 403);
    let ticket = format!("https://support.example.com/tickets/4411/{}", "x".repeat(140)); // no place to break
    store.add_suppression(&cx.tenant.customer_id, "+14155550411", &ticket, "manual").await.unwrap();
    let suppressed = json!({"instance_id": "main", "phone": "+14155550411", "message_purpose": "support",
                            "message": "Following up on your ticket"});
    assert_eq!(cx.send_json(&suppressed).await.0, 403);
    let held = json!({"instance_id": "main", "phone": "+14155550412", "message_purpose": "authentication",
                      "message": "Your code is 123456. Use coupon SAVE10"});
    assert_eq!(cx.send_json(&held).await.0, 403);
    let owner =
        signed_in(store, &cx.config, &cx.base_url, Some(&cx.tenant.customer_id), "owner@insight.example", Role::Owner)
            .await;
    let b = Browser::start().await;
    sign_in(&b, &cx, &owner).await;
    // The simulator reports delivered, then read: the log shows it and filters by it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        b.goto(&format!("{}/messages?state=read", cx.base_url)).await;
        let rows = b.client.find_all(fantoccini::Locator::Css("#message-log tbody tr")).await.unwrap();
        if rows.len() == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "the log never showed 3 read messages ({} rows)", rows.len());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let read = b.text_of("#message-log tbody").await;
    assert!(read.contains("+14155550400") && read.contains("read") && !read.contains("+14155550410"), "{read}");
    b.goto(&format!("{}/messages", cx.base_url)).await;
    let all = b.text_of("#message-log tbody").await;
    assert!(
        all.contains("refused") && all.contains("marketing_content") && all.contains("recipient_suppressed"),
        "{all}"
    );
    b.screenshot("13-message-log-states").await;
    // The export the page links to: the filters in force, every row.
    let csv = fetch_text(&b, "/exports/messages.csv?state=read").await;
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 4, "{csv}");
    assert!(lines[0].starts_with("id,time,instance") && lines[1..].iter().all(|l| l.contains(",read,")), "{csv}");
    assert_eq!(fetch_text(&b, "/exports/messages.csv").await.lines().count(), 7);
    // A message's detail: its steps with their times.
    b.click("#message-log tbody tr:last-child a").await;
    b.wait_for_text("Steps").await;
    let steps = b.text_of("#steps").await;
    assert!(steps.contains("attempted") && steps.contains("delivered") && steps.contains("read"), "{steps}");
    assert!(b.text().await.contains(LONG_ID));
    b.screenshot("14-message-detail").await;
    let detail = b.path().await;
    // The charts, drawn.
    let id = &cx.tenant.instance_id;
    b.goto(&format!("{}/dashboard", cx.base_url)).await;
    charts_drawn(&b, &["sends-per-day", "delivery-rates", "refusals-by-rule", "usage-meters"]).await;
    b.screenshot("03-overview").await;
    b.goto(&format!("{}/instances/{id}/manage", cx.base_url)).await;
    charts_drawn(&b, &["ban-risk"]).await;
    b.screenshot("15-instance-risk").await;
    b.goto(&format!("{}/instances/{id}/manage?tab=webhook", cx.base_url)).await;
    charts_drawn(&b, &["webhook-attempts", "webhook-latency"]).await;
    b.find("#backlog").await;
    // Every page of the customer's side, at a laptop's size and a phone's.
    let pages: Vec<String> = [
        "/dashboard",
        "/instances",
        &format!("/instances/{id}/manage"),
        &format!("/instances/{id}/manage?tab=webhook"),
        "/messages",
        "/messages?decision=refused",
        &detail,
        "/inbound-logs",
        "/suppressed-recipients",
        "/api-keys",
        "/integrations/pbx",
        "/users",
        "/docs/responsible-messaging",
    ]
    .iter()
    .map(|p| p.to_string())
    .collect();
    fits(&b, &cx.base_url, &pages, 1280, 800).await;
    fits(&b, &cx.base_url, &pages, 400, 860).await;
    b.goto(&format!("{}/messages", cx.base_url)).await;
    b.screenshot("16-message-log-phone").await;
    // The operator's side: the fleet, and every console page.
    b.client.set_window_size(1280, 800).await.unwrap();
    b.click("header form[action=\"/logout\"] button").await;
    b.find("#email").await;
    let operator = signed_in(store, &cx.config, &cx.base_url, None, "ops@insight.example", Role::Operator).await;
    sign_in(&b, &cx, &operator).await;
    b.goto(&format!("{}/operator/fleet", cx.base_url)).await;
    charts_drawn(&b, &["sends-per-minute", "fleet-refusals"]).await;
    let replicas = b.text_of("#replicas").await;
    assert!(replicas.contains("content"), "the modules each replica runs: {replicas}");
    b.screenshot("17-operator-fleet").await;
    let console: Vec<String> =
        ["/operator", "/operator/fleet", "/operator/instances", "/operator/reviews", "/operator/policies"]
            .iter()
            .map(|p| p.to_string())
            .collect();
    fits(&b, &cx.base_url, &console, 1280, 800).await;
    fits(&b, &cx.base_url, &console, 400, 860).await;
    b.close().await;
    cx.teardown().await;
}
