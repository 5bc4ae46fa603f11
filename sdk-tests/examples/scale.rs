//! A store as big as a busy operator's, and the dashboard's pages timed on it (issue 22,
//! item 3: "flat as the data grows"). Used by `bench/scale.sh`.
//!
//! ```sh
//! scale seed  DATABASE_URL MESSAGES CUSTOMERS   # adds MESSAGES log rows over 90 days
//! scale pages DATABASE_URL BASE_URL [RUNS]      # signs in, prints each page's median
//! ```
//!
//! `seed` migrates the store, then writes in bulk, in chunks of 100,000 rows, with the
//! SQL both databases speak: CUSTOMERS customers on the Scale plan with one simulator
//! instance each (`cus_seed_N`, `ins_seed_N`, created once), and MESSAGES message-log
//! rows spread evenly over them and over the last 90 days, oldest first, with what comes
//! with them: a `message.sent` event per sent row (delivered), the provider's delivery
//! and read reports for most of them, the contacts, a webhook attempt per tenth event,
//! and one inbound message per tenth row. Refusals carry a policy trace. Run it again to
//! add more. Every webhook endpoint points at loopback port 9
//! and every seeded event is already delivered, so nothing is ever sent anywhere.
//!
//! `pages` signs in (through the real invitation, password and authenticator steps) as
//! an owner of `cus_seed_0` and as an operator, and GETs each page RUNS times (default
//! 5), printing the median and the slowest in milliseconds; for the CSV export, the time
//! to its first byte. `queries` times the store calls behind the slowest pages alone.

use gateway_sdk_tests::dashboard::{DashClient, signed_in};
use gateway_server::config::Config;
use gateway_server::dashboard::roles::Role;
use gateway_server::store::Store;
use sqlx::Row;
use std::time::Instant;

const DAY_MS: i64 = 86_400_000;
const CHUNK: i64 = 100_000;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["seed", url, messages, customers] => {
            seed(url, messages.parse().expect("MESSAGES"), customers.parse().expect("CUSTOMERS")).await
        }
        ["pages", url, base] => pages(url, base, 5).await,
        ["queries", url] => queries(url).await,
        ["pages", url, base, runs] => pages(url, base, runs.parse().expect("RUNS")).await,
        _ => {
            eprintln!("usage: scale seed URL MESSAGES CUSTOMERS | scale pages URL BASE_URL [RUNS]");
            std::process::exit(2);
        }
    }
}

async fn pool(url: &str) -> sqlx::AnyPool {
    Store::open(url, 2, None).await.expect("the store opens and migrates");
    sqlx::any::install_default_drivers();
    sqlx::any::AnyPoolOptions::new().max_connections(1).connect(url).await.expect("connect")
}

async fn exec(pool: &sqlx::AnyPool, sql: &str, values: &[i64]) -> u64 {
    let mut query = sqlx::query(sql);
    for v in values {
        query = query.bind(*v);
    }
    query.execute(pool).await.unwrap_or_else(|e| panic!("{e}: {sql}")).rows_affected()
}

async fn scalar(pool: &sqlx::AnyPool, sql: &str) -> i64 {
    sqlx::query(sql)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{e}: {sql}"))
        .try_get::<Option<i64>, _>(0)
        .expect("a number")
        .unwrap_or(0)
}

/// `n` from `$1` to `$2`, as a table both databases read.
const SEQ: &str = "WITH RECURSIVE seq(n) AS (SELECT CAST($1 AS BIGINT) UNION ALL SELECT n + 1 FROM seq WHERE n < $2)";

async fn seed(url: &str, messages: i64, customers: i64) {
    let pool = pool(url).await;
    let now = chrono::Utc::now().timestamp_millis();
    let have = scalar(&pool, "SELECT COUNT(*) FROM customers WHERE id LIKE 'cus_seed_%'").await;
    if have < customers {
        let sql = format!(
            "{SEQ} INSERT INTO customers (id, name, plan, plan_status, plan_period_start, plan_period_end, \
             module_api, module_pbx, created_at) SELECT 'cus_seed_' || CAST(n AS TEXT), 'Seeded ' || CAST(n AS TEXT), \
             'scale', 'active', $3, $4, 1, 0, $5 FROM seq"
        );
        exec(&pool, &sql, &[have, customers - 1, now - DAY_MS, now + 29 * DAY_MS, now - 91 * DAY_MS]).await;
        let sql = format!(
            "{SEQ} INSERT INTO instances (id, customer_id, name, provider, connection_state, paused, created_at) \
             SELECT 'ins_seed_' || CAST(n AS TEXT), 'cus_seed_' || CAST(n AS TEXT), 'main', 'simulator', 'open', 0, $3 \
             FROM seq"
        );
        exec(&pool, &sql, &[have, customers - 1, now - 91 * DAY_MS]).await;
        let sql = format!(
            "{SEQ} INSERT INTO webhook_endpoints (instance_id, customer_id, url, events, secret, created_at, updated_at) \
             SELECT 'ins_seed_' || CAST(n AS TEXT), 'cus_seed_' || CAST(n AS TEXT), 'http://127.0.0.1:9/hook', \
             'message.sent,message.failed', 'whsec_seed', $3, $3 FROM seq"
        );
        exec(&pool, &sql, &[have, customers - 1, now - 91 * DAY_MS]).await;
    }
    let customers = customers.max(have);
    // Spread evenly from 90 days ago to a minute ago (a second seed interleaves in time
    // with the first).
    let start = now - 90 * DAY_MS;
    let step = ((now - 60_000 - start) / messages.max(1)).max(1);
    let base = scalar(&pool, "SELECT MAX(id) FROM message_log").await;
    let started = Instant::now();
    let mut done = 0;
    while done < messages {
        let n = CHUNK.min(messages - done);
        let first = scalar(&pool, "SELECT MAX(id) FROM message_log").await;
        // The provider's ids and request ids: unique across seeds (`base` + n).
        let t0 = start + done * step;
        // Row n (0-based in this seed): customer n % C; one in 19 refused by the content
        // policy, one in 53 failed at the provider, one in 101 unknown (primes, so that
        // every customer has some of each).
        let log = format!(
            "{SEQ} INSERT INTO message_log (customer_id, instance_id, source, purpose, recipient, message_type, \
             decision, error_code, policy, reason, provider_message_id, status, created_at, policy_trace, request_id) \
             SELECT 'cus_seed_' || CAST(n % $3 AS TEXT), 'ins_seed_' || CAST(n % $3 AS TEXT), 'api', 'transactional', \
             '+1415555' || CAST(1000 + (n * 7919) % 9000 AS TEXT), 'text', \
             CASE WHEN n % 19 = 7 THEN 'refused' ELSE 'allowed' END, \
             CASE WHEN n % 19 = 7 THEN 'policy_violation' WHEN n % 53 = 3 OR n % 101 = 11 THEN 'gateway_send_failed' END, \
             CASE WHEN n % 19 = 7 THEN 'content' WHEN n % 53 = 3 OR n % 101 = 11 THEN 'gateway/provider' END, \
             CASE WHEN n % 19 = 7 THEN 'marketing content in a transactional message' \
                  WHEN n % 53 = 3 THEN 'the provider refused the message' WHEN n % 101 = 11 THEN 'no answer in time' END, \
             CASE WHEN n % 19 = 7 THEN NULL ELSE 'sim_seed_' || CAST($6 + n AS TEXT) END, \
             CASE WHEN n % 19 = 7 THEN 'refused' WHEN n % 53 = 3 THEN 'failed' WHEN n % 101 = 11 THEN 'unknown' \
                  ELSE 'sent' END, \
             $4 + (n - $1) * $5, \
             CASE WHEN n % 19 = 7 THEN '[{{\"module\":\"purpose\",\"decision\":\"allow\"}},{{\"module\":\"content\",\
\"decision\":\"deny\",\"code\":\"marketing_content\"}}]' \
                  ELSE '[{{\"module\":\"purpose\",\"decision\":\"allow\"}},{{\"module\":\"content\",\"decision\":\"allow\"}}]' END, \
             'req_seed_' || CAST($6 + n AS TEXT) FROM seq"
        );
        exec(&pool, &log, &[done, done + n - 1, customers, t0, step, base]).await;
        let event = "INSERT INTO outbox (customer_id, instance_id, event_type, payload, created_at, available_at, attempts, \
             delivered_at, outcome, log_id) SELECT customer_id, instance_id, 'message.sent', \
             '{\"type\":\"message.sent\",\"message_id\":\"' || provider_message_id || '\",\"to\":\"' || recipient || '\"}', \
             created_at, created_at, 1, created_at + 40, 'delivered', id FROM message_log WHERE id > $1 AND status = 'sent'";
        exec(&pool, event, &[first]).await;
        let reports = "INSERT INTO message_status (instance_id, external_message_id, status, status_rank, updated_at, \
             delivered_at, read_at) SELECT instance_id, provider_message_id, \
             CASE WHEN id % 2 = 0 THEN 'READ' ELSE 'DELIVERY_ACK' END, CASE WHEN id % 2 = 0 THEN 3 ELSE 2 END, \
             created_at + 2000, created_at + 1000, CASE WHEN id % 2 = 0 THEN created_at + 2000 END \
             FROM message_log WHERE id > $1 AND status = 'sent' AND id % 5 <> 0";
        exec(&pool, reports, &[first]).await;
        let attempts = "INSERT INTO webhook_attempts (outbox_id, customer_id, instance_id, event_type, url, trigger_kind, \
             attempt, attempted_at, status_code, latency_ms, succeeded) SELECT id, customer_id, instance_id, event_type, \
             'http://127.0.0.1:9/hook', 'scheduled', 1, created_at + 40, 200, 20 + id % 60, 1 \
             FROM outbox WHERE log_id > $1 AND id % 10 = 0";
        exec(&pool, attempts, &[first]).await;
        let contacts = "INSERT INTO contacts (instance_id, phone, first_sent_at, last_sent_at, sent_total, replies_total) \
             SELECT instance_id, recipient, MIN(created_at), MAX(created_at), COUNT(*), 0 FROM message_log \
             WHERE id > $1 AND status IN ('sent', 'unknown') GROUP BY instance_id, recipient \
             ON CONFLICT (instance_id, phone) DO UPDATE SET last_sent_at = excluded.last_sent_at, \
             sent_total = contacts.sent_total + excluded.sent_total";
        exec(&pool, contacts, &[first]).await;
        let inbound = "INSERT INTO inbound_messages (customer_id, instance_id, sender, message_type, text, \
             external_message_id, message_at, received_at) SELECT customer_id, instance_id, recipient, 'text', 'Thanks!', \
             'in_' || provider_message_id, created_at + 60000, created_at + 60000 FROM message_log \
             WHERE id > $1 AND status = 'sent' AND id % 10 = 1";
        exec(&pool, inbound, &[first]).await;
        done += n;
        eprintln!("seeded {done} of {messages} rows ({:.0} s)", started.elapsed().as_secs_f64());
    }
    exec(&pool, "ANALYZE", &[]).await;
    let total = scalar(&pool, "SELECT COUNT(*) FROM message_log").await;
    println!("{{\"message_log\": {total}, \"customers\": {customers}}}");
}

/// The median and the slowest of `took` (ms).
fn median(mut took: Vec<f64>) -> (f64, f64) {
    took.sort_by(f64::total_cmp);
    (took[took.len() / 2], took[took.len() - 1])
}

/// The median and the slowest of `runs` GETs of `path`, in ms; the status of the last.
async fn time(client: &DashClient, path: &str, runs: usize) -> (f64, f64, u16) {
    let mut took = Vec::with_capacity(runs);
    let mut status = 0;
    for _ in 0..runs {
        let t = Instant::now();
        status = client.get(path).await.status;
        took.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let (median, max) = median(took);
    (median, max, status)
}

/// The time to the first byte of `path`'s body, in ms (median of `runs`).
async fn first_byte(client: &DashClient, path: &str, runs: usize) -> (f64, u16) {
    let mut took = Vec::with_capacity(runs);
    let mut status = 0;
    for _ in 0..runs {
        let t = Instant::now();
        let mut answer = client.get_response(path).await;
        status = answer.status().as_u16();
        let _ = answer.chunk().await;
        took.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    (median(took).0, status)
}

async fn pages(url: &str, base: &str, runs: usize) {
    let store = Store::open(url, 2, None).await.expect("the store opens");
    let pool = pool(url).await;
    let config = Config::default();
    let stamp = chrono::Utc::now().timestamp_millis();
    let owner =
        signed_in(&store, &config, base, Some("cus_seed_0"), &format!("owner{stamp}@seed.test"), Role::Owner).await;
    let operator = signed_in(&store, &config, base, None, &format!("ops{stamp}@seed.test"), Role::Operator).await;
    let rows = scalar(&pool, "SELECT COUNT(*) FROM message_log").await;
    let oldest = scalar(&pool, "SELECT MIN(id) FROM message_log WHERE customer_id = 'cus_seed_0'").await;
    // The log's last page: the 50 oldest rows (the page below the 51st oldest).
    let last_page = scalar(
        &pool,
        "SELECT MAX(id) FROM (SELECT id FROM message_log WHERE customer_id = 'cus_seed_0' ORDER BY id LIMIT 51) t",
    )
    .await;
    println!("rows in the message log: {rows}; the owner's customer cus_seed_0; {runs} runs each");
    println!("{:<48} {:>9} {:>9} {:>6}", "page", "median ms", "max ms", "status");
    let owner_pages = [
        "/dashboard".to_string(),
        "/messages".into(),
        "/messages?state=failed".into(),
        "/messages?state=sent".into(),
        "/messages?state=pending".into(),
        "/messages?state=unknown".into(),
        "/messages?instance=ins_seed_0".into(),
        format!("/messages?before={last_page}"),
        format!("/messages/{oldest}"),
        "/inbound-logs".into(),
        "/instances/ins_seed_0/manage".into(),
        "/instances/ins_seed_0/manage?tab=webhook".into(),
    ];
    for path in &owner_pages {
        let (median, max, status) = time(&owner, path, runs).await;
        println!("{:<48} {median:>9.1} {max:>9.1} {status:>6}", format!("owner {path}"));
    }
    for path in ["/operator", "/operator/fleet", "/operator/instances"] {
        let (median, max, status) = time(&operator, path, runs).await;
        println!("{:<48} {median:>9.1} {max:>9.1} {status:>6}", format!("operator {path}"));
    }
    let (median, status) = first_byte(&owner, "/exports/messages.csv", runs).await;
    println!("{:<48} {median:>9.1} {:>9} {status:>6}", "owner /exports/messages.csv (first byte)", "");
}

/// Times one store call (median of 5), in ms.
macro_rules! timed {
    ($name:expr, $call:expr) => {{
        let mut took = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            $call.await.expect($name);
            took.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        println!("{:<40} {:>9.1}", $name, median(took).0);
    }};
}

async fn queries(url: &str) {
    let store = Store::open(url, 2, None).await.expect("the store opens");
    let now = chrono::Utc::now().timestamp_millis();
    let month = now - 30 * DAY_MS;
    timed!("sends_per_day (a customer, 30 days)", store.sends_per_day(Some("cus_seed_0"), month));
    timed!("delivery_counts (a customer, 30 days)", store.delivery_counts("cus_seed_0", month));
    timed!("refusals_by_rule (a customer, 30 days)", store.refusals_by_rule(Some("cus_seed_0"), month, 10));
    // The overview's three answers from kept days (`store::customer_days`): at a first
    // view, which counts the 30 days and keeps the closed ones (each run from none kept),
    // and at the views after it.
    let since = now - now % DAY_MS - 29 * DAY_MS;
    let forget = || async {
        let pool = sqlx::AnyPool::connect(url).await?;
        sqlx::query("DELETE FROM customer_days WHERE customer_id = 'cus_seed_0'").execute(&pool).await?;
        pool.close().await;
        Ok::<(), sqlx::Error>(())
    };
    let mut took = Vec::new();
    for _ in 0..5 {
        forget().await.expect("the kept days go");
        let t = Instant::now();
        store.activity("cus_seed_0", since, now, since, 10).await.expect("activity, first view");
        took.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    println!("{:<40} {:>9.1}", "activity, first view (keeps 29 days)", median(took).0);
    timed!("activity (29 kept days and today)", store.activity("cus_seed_0", since, now, since, 10));
    timed!("usage", store.usage("cus_seed_0", now - now % DAY_MS, now - DAY_MS));
    timed!("risk_signals (an instance, 7 days)", store.risk_signals("ins_seed_0", now));
    timed!("webhook_hours (an instance)", store.webhook_hours("ins_seed_0", now - 2 * DAY_MS));
    timed!("instance_backlog", store.instance_backlog("ins_seed_0"));
    timed!("fleet", store.fleet(now));
    timed!("refusals_by_rule (everyone, 24 h)", store.refusals_by_rule(None, now - DAY_MS, 12));
    timed!("policy_gateways", store.policy_gateways(now - 3_600_000));
}
