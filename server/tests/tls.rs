//! A bad certificate never stops the real binary: a SIGHUP with a key that does not
//! match, a half-written certificate or an empty key file is refused (logged and
//! counted in `gateway_tls_reload_failures_total`), the current pair keeps serving and
//! `/health/ready` keeps answering; the next good pair is picked up. Started with a
//! bad pair, the binary exits 1 with one line naming the file and the fault, never a
//! panic. On SQLite, and on PostgreSQL when `GATEWAY_TEST_DATABASE_URL` is set.

mod common;

use common::{Db, free_port, gateway, run_json};
use gateway_sdk_tests::tls::{TestCert, self_signed};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn kill(child: impl common::Stop) {
    child.stop();
}

fn der(cert: &TestCert) -> Vec<u8> {
    CertificateDer::from_pem_slice(cert.pem.as_bytes()).unwrap().to_vec()
}

/// Over a new connection: the leaf certificate the gateway served, and the status of
/// `/health/ready`. The client trusts every certificate the test made, so it reports
/// whichever one is served.
async fn served(port: u16, trusted: &[&TestCert]) -> (Vec<u8>, u16) {
    let roots = trusted.iter().map(|c| reqwest::Certificate::from_pem(c.pem.as_bytes()).unwrap());
    let client = reqwest::Client::builder().tls_certs_only(roots).tls_info(true).build().unwrap();
    let response = client.get(format!("https://localhost:{port}/health/ready")).send().await.unwrap();
    let info = response.extensions().get::<reqwest::tls::TlsInfo>().expect("the TLS information");
    let leaf = info.peer_certificate().expect("a peer certificate").to_vec();
    (leaf, response.status().as_u16())
}

/// `gateway_tls_reload_failures_total` as the metrics listener reports it.
async fn failures(metrics: &str) -> Option<u64> {
    let text = reqwest::get(format!("http://{metrics}/metrics")).await.ok()?.text().await.ok()?;
    text.lines().find_map(|l| l.strip_prefix("gateway_tls_reload_failures_total ")).map(|v| v.trim().parse().unwrap())
}

fn hup(server: &Child) {
    let status = Command::new("kill").args(["-HUP", &server.id().to_string()]).status().unwrap();
    assert!(status.success());
}

/// Sends SIGHUP and waits until the refusal is counted (`expected` in all).
async fn hup_refused(server: &mut Child, metrics: &str, expected: u64, what: &str) {
    hup(server);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(status) = server.try_wait().unwrap() {
            panic!("{what}: the gateway exited on SIGHUP ({status})");
        }
        match failures(metrics).await {
            Some(n) if n == expected => break,
            Some(n) if n > expected => panic!("{what}: {n} failures counted, {expected} expected"),
            other => assert!(Instant::now() < deadline, "{what}: the refusal was not counted: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(server.try_wait().unwrap().is_none(), "{what}: the gateway is still running");
}

fn write(path: &Path, contents: impl AsRef<[u8]>) {
    std::fs::write(path, contents).unwrap();
}

#[tokio::test]
async fn a_bad_pair_on_sighup_is_refused_and_counted_while_the_current_one_keeps_serving() {
    let db = Db::new("tlsbad").await;
    run_json(gateway(&db.url, &["migrate"], &[]));
    let dir = tempfile::tempdir().unwrap();
    let live = self_signed(dir.path(), "live");
    let other = self_signed(dir.path(), "other");
    let renewed = self_signed(dir.path(), "renewed");
    let next = self_signed(dir.path(), "next");
    let all = [&live, &other, &renewed, &next];
    let (port, metrics_port) = (free_port(), free_port());
    let metrics = format!("127.0.0.1:{metrics_port}");
    let log_file = dir.path().join("gateway.log");
    let (cert, key, log) =
        (live.cert_file.display().to_string(), live.key_file.display().to_string(), log_file.display().to_string());
    let env = [
        ("GATEWAY_TLS__CERT_FILE", cert.as_str()),
        ("GATEWAY_TLS__KEY_FILE", key.as_str()),
        ("GATEWAY_METRICS_LISTEN", metrics.as_str()),
        ("GATEWAY_LOG_FILE", log.as_str()),
        ("GATEWAY_WEBHOOKS__DISPATCH", "false"),
    ];
    let mut server = common::serve(gateway(&db.url, &[], &env), port).await;
    assert_eq!(served(port, &all).await, (der(&live), 200));
    assert_eq!(failures(&metrics).await, Some(0), "the counter is there from the start");

    // (a) A key from another pair.
    write(&live.key_file, std::fs::read(&other.key_file).unwrap());
    hup_refused(&mut server, &metrics, 1, "a key that does not match").await;
    assert_eq!(served(port, &all).await, (der(&live), 200), "the current pair still serves");

    // (b) A renewal half written: the new key, half of the new certificate.
    write(&live.key_file, std::fs::read(&renewed.key_file).unwrap());
    write(&live.cert_file, &renewed.pem.as_bytes()[..renewed.pem.len() / 2]);
    hup_refused(&mut server, &metrics, 2, "a truncated certificate").await;
    assert_eq!(served(port, &all).await, (der(&live), 200), "the current pair still serves");

    // (c) The whole certificate, and an empty key file.
    write(&live.cert_file, &renewed.pem);
    write(&live.key_file, "");
    hup_refused(&mut server, &metrics, 3, "an empty key file").await;
    assert_eq!(served(port, &all).await, (der(&live), 200), "the current pair still serves");

    // A good pair is picked up on the next SIGHUP.
    write(&live.cert_file, &next.pem);
    write(&live.key_file, std::fs::read(&next.key_file).unwrap());
    hup(&server);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (leaf, status) = served(port, &all).await;
        assert_eq!(status, 200);
        if leaf == der(&next) {
            break;
        }
        assert!(Instant::now() < deadline, "the good pair was not picked up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(failures(&metrics).await, Some(3), "a good pair is not a failure");
    assert!(server.try_wait().unwrap().is_none());

    // Each refusal was logged with its reason, and no key material (the log is
    // written by a thread of its own: read until the lines are there).
    let mut log = String::new();
    for _ in 0..100 {
        log = std::fs::read_to_string(&log_file).unwrap();
        if log.lines().filter(|l| l.contains("the current one stays")).count() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let refusals: Vec<&str> = log.lines().filter(|l| l.contains("the current one stays")).collect();
    assert_eq!(refusals.len(), 3, "{log}");
    assert!(refusals[0].contains("does not match"), "{}", refusals[0]);
    assert!(refusals[1].contains("END line"), "{}", refusals[1]);
    assert!(refusals[2].contains("is empty"), "{}", refusals[2]);
    for key in all.map(|c| std::fs::read_to_string(&c.key_file).unwrap()) {
        for line in key.lines().filter(|l| !l.starts_with("-----")) {
            assert!(!log.contains(line), "key material in the log");
        }
    }
    kill(server);
    db.drop_it().await;
}

/// `gateway serve` with `cert_file` and `key_file`: it must exit by itself (status,
/// stderr).
fn serve_exits(db: &Db, cert_file: &Path, key_file: &Path) -> (std::process::ExitStatus, String) {
    let (cert, key) = (cert_file.display().to_string(), key_file.display().to_string());
    let env = [("GATEWAY_TLS__CERT_FILE", cert.as_str()), ("GATEWAY_TLS__KEY_FILE", key.as_str())];
    let port = free_port().to_string();
    let mut child = gateway(&db.url, &["serve", "--listen", &format!("127.0.0.1:{port}")], &env)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            kill(child);
            panic!("the gateway started with a bad pair");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (status, stderr)
}

#[tokio::test]
async fn start_up_with_a_bad_pair_exits_with_one_clear_line_and_no_panic() {
    let db = Db::new("tlsstart").await;
    run_json(gateway(&db.url, &["migrate"], &[]));
    let dir = tempfile::tempdir().unwrap();
    let good = self_signed(dir.path(), "good");
    let other = self_signed(dir.path(), "other");
    let half = dir.path().join("half.crt");
    write(&half, &good.pem.as_bytes()[..good.pem.len() / 2]);
    let empty = dir.path().join("empty.key");
    write(&empty, "");
    let missing = dir.path().join("missing.key");
    let cases: [(&Path, &Path, &Path, &str); 5] = [
        (&good.cert_file, &other.key_file, &other.key_file, "does not match the certificate"),
        (&half, &good.key_file, &half, "END line"),
        (&good.cert_file, &empty, &empty, "is empty"),
        (&good.key_file, &good.key_file, &good.key_file, "holds no certificate"),
        (&good.cert_file, &missing, &missing, "cannot read"),
    ];
    for (cert, key, named, fault) in cases {
        let (status, stderr) = serve_exits(&db, cert, key);
        assert_eq!(status.code(), Some(1), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        let last = stderr.lines().last().unwrap_or_default();
        let error: serde_json::Value = serde_json::from_str(last).expect("one JSON line last");
        let message = error["error"].as_str().unwrap();
        assert!(message.contains(&named.display().to_string()), "names the file: {message}");
        assert!(message.contains(fault), "{fault:?} in {message}");
    }
    db.drop_it().await;
}
