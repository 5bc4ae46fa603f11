//! Operating the real binary: its metrics scraped by Debian's Prometheus and read back
//! through Prometheus's query API, the alerting rules checked by promtool, and HTTPS
//! whose certificate is renewed with SIGHUP. On SQLite, and on PostgreSQL when
//! `GATEWAY_TEST_DATABASE_URL` is set.

mod common;

use common::{Db, free_port, gateway, run_json};
use gateway_sdk_tests::tls::{replace, self_signed};
use serde_json::{Value, json};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn kill(child: impl common::Stop) {
    child.stop();
}

/// A Debian tool the project's scripts install (scripts/test).
fn tool(name: &str) -> Command {
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .chain(["/usr/bin".into(), "/usr/sbin".into()])
        .map(|dir| dir.join(name))
        .find(|p| p.exists());
    let path = found.unwrap_or_else(|| panic!("{name} is not installed: run scripts/test, which installs it"));
    Command::new(path)
}

async fn send(http: &reqwest::Client, base: &str, key: &str, phone: &str) -> u16 {
    let body = json!({"instance_id": "demo", "phone": phone, "message_purpose": "transactional",
                      "message": "Your code is 123456"});
    let response = http.post(format!("{base}/api/send-message")).bearer_auth(key).json(&body).send().await.unwrap();
    response.status().as_u16()
}

#[tokio::test]
async fn prometheus_scrapes_the_metrics_listener_and_reads_the_send_counter_back() {
    let db = Db::new("metrics").await;
    let demo = run_json(gateway(&db.url, &["demo"], &[]));
    let key = demo["api_key"].as_str().unwrap().to_string();
    let (port, metrics_port) = (free_port(), free_port());
    let metrics_listen = format!("127.0.0.1:{metrics_port}");
    let env = [("GATEWAY_METRICS_LISTEN", metrics_listen.as_str()), ("GATEWAY_WEBHOOKS__DISPATCH", "false")];
    let server = common::serve(gateway(&db.url, &[], &env), port).await;
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    assert_eq!(send(&http, &base, &key, "+14155550101").await, 200);
    assert_eq!(send(&http, &base, &key, "+14155550102").await, 200);
    let body = json!({"instance_id": "nope", "phone": "+14155550103", "message_purpose": "transactional",
                      "message": "x"});
    let refused = http.post(format!("{base}/api/send-message")).bearer_auth(&key).json(&body).send().await.unwrap();
    assert_eq!(refused.status(), 404, "invalid_instance");

    // Never on the public listener.
    assert_eq!(http.get(format!("{base}/metrics")).send().await.unwrap().status(), 404);
    let text = http.get(format!("http://{metrics_listen}/metrics")).send().await.unwrap().text().await.unwrap();
    for line in [
        "gateway_sends_total{decision=\"allowed\",error=\"\"} 2",
        "gateway_sends_total{decision=\"refused\",error=\"invalid_instance\"} 1",
        "gateway_http_requests_total{route=\"/api/send-message\",status=\"200\"} 2",
        "gateway_http_requests_total{route=\"/api/send-message\",status=\"404\"} 1",
        "gateway_http_requests_total{route=\"unmatched\",status=\"404\"} 1",
        "gateway_build_info{version=",
        "gateway_outbox_pending ",
        "gateway_outbox_oldest_age_seconds ",
        "gateway_instances{connection_state=\"open\",paused=\"false\"} 1",
        "gateway_webhook_endpoints{state=\"failing\"} 0",
        "gateway_provider_request_seconds_count{outcome=\"sent\",provider=\"simulator\"} 2",
        "gateway_policy_evaluation_seconds_count{module=\"content\"} 2",
    ] {
        assert!(text.contains(line), "{line} is not in:\n{text}");
    }
    // The writer's batches by how long each took: each send wrote its attempt, then its
    // outcome, one after the other, so at least four batches; and every batch the
    // writer's counter counts (read first, within the same scrape) is in a bucket.
    let batches = sample(&text, "gateway_store_write_batch_seconds_count");
    assert!(batches >= 4, "{batches} batches");
    assert!(batches >= sample(&text, "gateway_store_write_batches_total"), "{text}");
    assert_eq!(sample(&text, "gateway_store_write_batch_seconds_bucket{le=\"+Inf\"}"), batches);
    // PostgreSQL's send path reads through statements that take the reads of concurrent
    // sends together: the first send resolved the instance by its name, alone; the
    // second read by the id the cache kept, through them. SQLite reads locally.
    let statements = sample(&text, "gateway_store_send_read_batches_total");
    let reads = sample(&text, "gateway_store_send_reads_total");
    match db.url.starts_with("postgres") {
        true => assert!(statements >= 1 && reads >= statements, "{statements} statements, {reads} reads"),
        false => assert_eq!((statements, reads), (0, 0)),
    }
    // The exposition passes Prometheus's own linter.
    let mut lint = tool("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(lint.stdin.as_mut().unwrap(), text.as_bytes()).unwrap();
    let linted = lint.wait_with_output().unwrap();
    assert!(
        linted.status.success(),
        "{}{}",
        String::from_utf8_lossy(&linted.stdout),
        String::from_utf8_lossy(&linted.stderr)
    );

    // Debian's Prometheus scrapes it; the counter comes back through the query API.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: gateway\n    static_configs:\n      - targets: [\"{metrics_listen}\"]\n"
        ),
    )
    .unwrap();
    // Its port is found free just before it binds it, and found again if it exits: a
    // port free when the test began may be a gateway's of a test running beside it by
    // now (the query then reached that gateway, which answered 404).
    let mut tries = 0;
    let (prometheus, prometheus_port) = loop {
        let prometheus_port = free_port();
        let mut prometheus = tool("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{prometheus_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus starts");
        let ready = format!("http://127.0.0.1:{prometheus_port}/-/ready");
        let deadline = Instant::now() + Duration::from_secs(30);
        let up = loop {
            if prometheus.try_wait().unwrap().is_some() {
                break false;
            }
            if let Ok(r) = http.get(&ready).send().await
                && r.status().is_success()
                && r.text().await.unwrap_or_default().contains("Prometheus")
            {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        if up {
            break (prometheus, prometheus_port);
        }
        kill(prometheus);
        tries += 1;
        assert!(tries < 5, "Prometheus did not start on a free port in five tries");
    };
    let query = format!(
        "http://127.0.0.1:{prometheus_port}/api/v1/query?query=sum(gateway_sends_total%7Bdecision%3D%22allowed%22%7D)"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let value = loop {
        let answer: Option<Value> = match http.get(&query).send().await {
            Ok(r) => r.json().await.ok(),
            Err(_) => None,
        };
        let value = answer.as_ref().and_then(|a| a["data"]["result"][0]["value"][1].as_str().map(str::to_string));
        if let Some(value) = value {
            break value;
        }
        assert!(Instant::now() < deadline, "Prometheus never had the counter: {answer:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(value, "2");
    kill(prometheus);

    // The example alerting rules are valid.
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/prometheus/alerts.yml");
    let checked = tool("promtool").args(["check", "rules", rules]).output().unwrap();
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stdout));
    assert!(String::from_utf8_lossy(&checked.stdout).contains("SUCCESS: 7 rules found"));
    // And fire as their unit tests say (deploy/prometheus/alerts_test.yml).
    let cases = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/prometheus/alerts_test.yml");
    let tested = tool("promtool").args(["test", "rules", cases]).output().unwrap();
    assert!(
        tested.status.success(),
        "{}{}",
        String::from_utf8_lossy(&tested.stdout),
        String::from_utf8_lossy(&tested.stderr)
    );
    kill(server);
    db.drop_it().await;
}

/// The metric families the Metrics table of the operators' manual (`docs/operations.md`)
/// names.
fn documented_families() -> Vec<String> {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operations.md")).unwrap();
    let section = page.split("\n## Metrics\n").nth(1).unwrap().split("\n## ").next().unwrap();
    let mut families = Vec::new();
    for row in section.lines().filter(|l| l.starts_with("| `gateway_")) {
        let first_cell = row.split(" | ").next().unwrap();
        for name in first_cell.split('`').filter(|s| s.starts_with("gateway_")) {
            families.push(name.split('{').next().unwrap().to_string());
        }
    }
    families
}

/// The value of `series` (its name and labels, exactly) in an exposition, a whole number.
fn sample(text: &str, series: &str) -> u64 {
    let line = text.lines().find(|l| l.rsplit_once(' ').is_some_and(|(s, _)| s == series));
    let line = line.unwrap_or_else(|| panic!("{series} is not in:\n{text}"));
    line.rsplit_once(' ').unwrap().1.parse().unwrap()
}

/// Each series of an exposition (its name and labels), without its value.
fn series(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.rsplit_once(' ').unwrap().0.to_string())
        .collect()
}

/// 60 concurrent sends to one number with the bundled modules: every send is decided by
/// purpose and content once, and only pacing, the one module that reads the counters
/// (purpose and content are built with `reads_counters = false`), is asked again once
/// each send's place among the others is known.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_a_module_that_reads_the_counters_is_asked_again() {
    let db = Db::new("recheck").await;
    let demo = run_json(gateway(&db.url, &["demo"], &[]));
    let key = demo["api_key"].as_str().unwrap().to_string();
    let customer = demo["customer_id"].as_str().unwrap().to_string();
    let lift = ["customer", "limits", "--customer", &customer, "--instance-per-minute", "1000000"];
    let lifted = gateway(&db.url, &[&lift[..], &["--recipient-per-minute", "1000000"]].concat(), &[]).output().unwrap();
    assert!(lifted.status.success(), "{}", String::from_utf8_lossy(&lifted.stderr));
    let (port, metrics_port) = (free_port(), free_port());
    let metrics_listen = format!("127.0.0.1:{metrics_port}");
    let env = [("GATEWAY_METRICS_LISTEN", metrics_listen.as_str()), ("GATEWAY_WEBHOOKS__DISPATCH", "false")];
    let server = common::serve(gateway(&db.url, &[], &env), port).await;
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let answers = futures::future::join_all((0..60).map(|_| send(&http, &base, &key, "+14155550177"))).await;
    assert!(answers.iter().all(|s| *s == 200 || *s == 403), "{answers:?}");
    assert!(answers.contains(&200) && answers.contains(&403), "pacing's caps hold: {answers:?}");
    let text = http.get(format!("http://{metrics_listen}/metrics")).send().await.unwrap().text().await.unwrap();
    let count =
        |module: &str| sample(&text, &format!("gateway_policy_evaluation_seconds_count{{module=\"{module}\"}}"));
    assert_eq!((count("purpose"), count("content")), (60, 60), "asked once per send");
    assert!(count("pacing") > 60, "pacing asked again for sends that raced: {}", count("pacing"));
    kill(server);
    db.drop_it().await;
}

#[tokio::test]
async fn every_family_is_there_from_the_start_and_made_up_paths_add_no_series() {
    let db = Db::new("metrics_bounded").await;
    run_json(gateway(&db.url, &["demo"], &[]));
    let (port, metrics_port) = (free_port(), free_port());
    let metrics_listen = format!("127.0.0.1:{metrics_port}");
    let env = [("GATEWAY_METRICS_LISTEN", metrics_listen.as_str()), ("GATEWAY_WEBHOOKS__DISPATCH", "false")];
    let server = common::serve(gateway(&db.url, &[], &env), port).await;
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let scrape =
        || async { http.get(format!("http://{metrics_listen}/metrics")).send().await.unwrap().text().await.unwrap() };

    // Before any request but the readiness probe: every family docs/operations.md names, and
    // the series an alert reads, at 0.
    let fresh = scrape().await;
    let families = documented_families();
    assert!(families.len() >= 17, "the table of docs/operations.md: {families:?}");
    for family in &families {
        assert!(fresh.contains(&format!("# TYPE {family} ")), "{family} is missing from the first scrape:\n{fresh}");
    }
    for line in [
        "gateway_webhook_attempts_total{outcome=\"delivered\"} 0",
        "gateway_webhook_attempts_total{outcome=\"error\"} 0",
        "gateway_sends_total{decision=\"allowed\",error=\"\"} 0",
        "gateway_sends_total{decision=\"refused\",error=\"revoked_api_key\"} 0",
        "gateway_sends_total{decision=\"allowed\",error=\"gateway_send_failed\"} 0",
        "gateway_http_requests_total{route=\"/api/send-message\",status=\"200\"} 0",
        "gateway_http_request_duration_seconds_count{route=\"/api/send-message\"} 0",
        "gateway_http_requests_total{route=\"/instances/{id}/manage\",status=\"200\"} 0",
        "gateway_pbx_events_total{outcome=\"message_sent\"} 0",
        "gateway_pbx_events_total{outcome=\"webhook_rate_limited\"} 0",
        "gateway_ingress_events_total{outcome=\"unauthorized\"} 0",
        "gateway_provider_request_seconds_count{outcome=\"unknown\",provider=\"evolution\"} 0",
        "gateway_policy_evaluation_seconds_count{module=\"content\"} 0",
        "gateway_signin_refused_total{reason=\"source\"} 0",
        "gateway_tls_reload_failures_total 0",
        "gateway_instances{connection_state=\"close\",paused=\"true\"} 0",
    ] {
        assert!(fresh.contains(line), "{line} is not in the first scrape:\n{fresh}");
    }

    // Made-up ids and paths where a scanner would try them, unauthenticated: labelled
    // by their template or `unmatched`, never by what the request carried. A second
    // round with other values adds nothing.
    let base = format!("http://127.0.0.1:{port}");
    let mut rounds = Vec::new();
    for round in 0..2 {
        for i in 0..150 {
            // Letters only: a digit would have been folded even by a label taken from
            // the path (the old rule), so these are the ids that grew it.
            let letters: String = [round * 150 + i, (round * 150 + i) / 26, (round * 150 + i) / 676]
                .iter()
                .map(|n| char::from(b'a' + (n % 26) as u8))
                .collect();
            let id = format!("zq{letters}");
            let answers = [
                http.get(format!("{base}/instances/{id}/manage")).send().await.unwrap().status(),
                http.get(format!("{base}/messages/{id}")).send().await.unwrap().status(),
                http.post(format!("{base}/integrations/pbx/webhook/{id}")).body("{}").send().await.unwrap().status(),
                http.post(format!("{base}/internal/provider/evolution/{id}")).body("{}").send().await.unwrap().status(),
                http.get(format!("{base}/{id}/{id}?{id}={id}")).send().await.unwrap().status(),
            ];
            assert!(answers.iter().all(|s| !s.is_success()), "{id}: {answers:?}");
        }
        rounds.push(scrape().await);
    }
    assert!(!rounds[1].contains("zq"), "a label took a value from a request:\n{}", rounds[1]);
    assert_eq!(series(&rounds[0]), series(&rounds[1]), "the second round of made-up paths added series");
    let grown = series(&rounds[1]).difference(&series(&fresh)).cloned().collect::<Vec<_>>();
    assert!(grown.len() < 80, "600 made-up requests added {} series: {grown:#?}", grown.len());
    assert!(rounds[1].contains("gateway_http_requests_total{route=\"unmatched\",status=\"404\"} 300"), "{}", rounds[1]);
    kill(server);
    db.drop_it().await;
}

/// `kill -HUP` makes the binary serve a renewed certificate to new connections.
#[tokio::test]
async fn sighup_swaps_in_a_renewed_certificate() {
    let db = Db::new("tls").await;
    run_json(gateway(&db.url, &["migrate"], &[]));
    let dir = tempfile::tempdir().unwrap();
    let live = self_signed(dir.path(), "live");
    let port = free_port();
    let (cert, key) = (live.cert_file.display().to_string(), live.key_file.display().to_string());
    let env = [("GATEWAY_TLS__CERT_FILE", cert.as_str()), ("GATEWAY_TLS__KEY_FILE", key.as_str())];
    let server = common::serve(gateway(&db.url, &[], &env), port).await;
    let trusting = |pem: &str| {
        let root = reqwest::Certificate::from_pem(pem.as_bytes()).unwrap();
        reqwest::Client::builder().tls_certs_only([root]).build().unwrap()
    };
    let url = format!("https://localhost:{port}/health/ready");
    assert_eq!(trusting(&live.pem).get(&url).send().await.unwrap().status(), 200);
    let renewed = self_signed(dir.path(), "renewed");
    replace(&live, &renewed);
    let hup = Command::new("kill").args(["-HUP", &server.id().to_string()]).status().unwrap();
    assert!(hup.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match trusting(&renewed.pem).get(&url).send().await {
            Ok(r) if r.status() == 200 => break,
            other => assert!(Instant::now() < deadline, "the renewed certificate is not served: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(trusting(&live.pem).get(&url).send().await.is_err(), "the old certificate is gone");
    kill(server);
    db.drop_it().await;
}

/// A rolling upgrade: the new build has migrated the shared store, and a replica of the
/// previous build (which does not know the newest migration) restarts meanwhile. It
/// must start, migrate nothing, and report ready.
#[tokio::test]
async fn a_replica_of_the_previous_build_starts_on_a_schema_a_newer_build_migrated() {
    use sqlx::{Connection, Executor};
    let db = Db::new("rolling").await;
    run_json(gateway(&db.url, &["migrate"], &[]));
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(&db.url).await.unwrap();
    // What a newer build's migration leaves in sqlx's table.
    conn.execute(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         SELECT 99990101000000, 'from a newer build', success, checksum, execution_time \
         FROM _sqlx_migrations WHERE version = (SELECT MAX(version) FROM _sqlx_migrations)",
    )
    .await
    .unwrap();
    conn.close().await.unwrap();
    run_json(gateway(&db.url, &["migrate"], &[]));
    let port = free_port();
    let server = common::serve(gateway(&db.url, &[], &[]), port).await;
    let ready = reqwest::get(format!("http://127.0.0.1:{port}/health/ready")).await.unwrap();
    assert_eq!(ready.status(), 200, "{}", ready.text().await.unwrap());
    kill(server);
    db.drop_it().await;
}
