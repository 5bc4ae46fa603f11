//! HTTPS served by the gateway itself: the operator's certificate, the dashboard's
//! `__Host-` cookies over it, and a renewed certificate swapped in without dropping
//! open connections.

use gateway_sdk_tests::TestContext;
use gateway_sdk_tests::dashboard::DashClient;
use gateway_sdk_tests::tls::{replace, self_signed};
use gateway_server::config::TlsSettings;
use gateway_server::dashboard::accounts;
use gateway_server::dashboard::roles::Role;

fn trusting(pem: &str) -> reqwest::Client {
    let root = reqwest::Certificate::from_pem(pem.as_bytes()).unwrap();
    reqwest::Client::builder().tls_certs_only([root]).build().unwrap()
}

#[tokio::test]
async fn the_gateway_serves_https_its_cookies_work_and_a_renewed_certificate_is_swapped_in() {
    let dir = tempfile::tempdir().unwrap();
    let first = self_signed(dir.path(), "live");
    let tls = TlsSettings {
        cert_file: Some(first.cert_file.display().to_string()),
        key_file: Some(first.key_file.display().to_string()),
    };
    let cx = TestContext::with("https", |c| c.tls = tls, None).await;
    let base = format!("https://localhost:{}", cx.server.local_addr().port());
    assert!(cx.base_url.starts_with("https://"));
    let old = trusting(&first.pem);
    let ready = old.get(format!("{base}/health/ready")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    // Plain HTTP on the same port gets no answer a client could read as one.
    let plain = reqwest::get(format!("http://localhost:{}/health/live", cx.server.local_addr().port())).await;
    assert!(plain.is_err() || plain.unwrap().status() != 200);

    // A dashboard user signs in over HTTPS: the `__Host-` session cookie is set Secure
    // and carries the session.
    let mut config = cx.config.clone();
    config.public_url = Some(base.clone());
    let (_, link) =
        accounts::create(cx.store(), &config, Some(&cx.tenant.customer_id), "owner@tls.example", Role::Owner, "test")
            .await
            .unwrap();
    let mut owner = DashClient::trusting(&base, &first.pem);
    owner.email = "owner@tls.example".into();
    owner.accept_link(&link).await;
    let session = owner.cookie("__Host-gw_session").expect("the session cookie");
    assert!(!session.is_empty());
    let overview = owner.get("/messages").await;
    assert_eq!(overview.status, 200, "{}", overview.body);
    let stranger = DashClient::trusting(&base, &first.pem).get("/messages").await;
    assert_eq!(stranger.status, 303, "without the cookie, the sign-in page");

    // Renewed: new connections get the new certificate, the open one keeps working.
    let renewed = self_signed(dir.path(), "renewed");
    replace(&first, &renewed);
    cx.server.reload_tls().await.expect("the renewed pair loads");
    let fresh = trusting(&renewed.pem).get(format!("{base}/health/live")).send().await.unwrap();
    assert_eq!(fresh.status(), 200, "a new connection is served the renewed certificate");
    let refused = trusting(&first.pem).get(format!("{base}/health/live")).send().await;
    assert!(refused.is_err(), "the old certificate is no longer served to new connections");
    let reused = old.get(format!("{base}/health/live")).send().await.unwrap();
    assert_eq!(reused.status(), 200, "the connection opened before the swap still answers");

    // A broken pair is refused and the renewed one stays.
    std::fs::write(&first.key_file, "not a key").unwrap();
    assert!(cx.server.reload_tls().await.is_err());
    let still = trusting(&renewed.pem).get(format!("{base}/health/live")).send().await.unwrap();
    assert_eq!(still.status(), 200);
    cx.teardown().await;
}
