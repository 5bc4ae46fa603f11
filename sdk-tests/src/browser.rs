//! A real browser for the dashboard tests: Debian's headless Chromium driven through
//! its chromedriver (WebDriver) with fantoccini. Each test starts its own chromedriver
//! on a free loopback port and a fresh profile directory; both end with the test.
//!
//! `scripts/test` installs `chromium` and `chromium-driver` when they are missing. The
//! binaries can be named with `CHROMEDRIVER` and `CHROMIUM`. With
//! `GATEWAY_SCREENSHOTS=DIR` the tests save their screenshots of the main pages there
//! (the pictures of docs/dashboard.md come from `GATEWAY_SCREENSHOTS=docs/screenshots`).

use fantoccini::{Client, ClientBuilder, Locator};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// A browser session and the chromedriver behind it.
pub struct Browser {
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session.
    pub async fn start() -> Browser {
        let driver_bin = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
        let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        let port = free_port();
        let driver = Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("{driver_bin} does not start ({e}): install chromium and chromium-driver (scripts/test does)")
            });
        let url = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(20), "chromedriver did not listen on {port} within 20 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile = tempfile::tempdir().unwrap();
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                    "--window-size=1280,900", format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&url)
            .await
            .expect("a Chromium session starts");
        Browser { client, driver, _profile: profile }
    }

    /// Opens a URL.
    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.unwrap_or_else(|e| panic!("opening {url}: {e}"));
    }

    /// Types into the field with this CSS selector (after clearing it). A page that
    /// was still loading is asked again.
    pub async fn fill(&self, css: &str, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let field = self.find(css).await;
            match async {
                field.clear().await?;
                field.send_keys(text).await
            }
            .await
            {
                Ok(()) => return,
                Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => panic!("typing into {css}: {e}"),
            }
        }
    }

    /// The element with this CSS selector (waits up to 10 s).
    pub async fn find(&self, css: &str) -> fantoccini::elements::Element {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.client.find(Locator::Css(css)).await {
                Ok(e) => return e,
                Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => {
                    let url = self.client.current_url().await.map(|u| u.to_string()).unwrap_or_default();
                    panic!("no element {css} on {url}: {e}");
                }
            }
        }
    }

    /// Clicks the element with this CSS selector.
    pub async fn click(&self, css: &str) {
        self.find(css).await.click().await.unwrap_or_else(|e| panic!("clicking {css}: {e}"));
    }

    /// Clicks the submit button of the form whose action is `action` (the first one).
    pub async fn submit(&self, action: &str) {
        self.click(&format!("form[action=\"{action}\"] button[type=submit]")).await;
    }

    /// The text of the page (asked again while the page is being replaced).
    pub async fn text(&self) -> String {
        self.text_of("body").await
    }

    /// The text of the element with this CSS selector.
    pub async fn text_of(&self, css: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.find(css).await.text().await {
                Ok(text) => return text,
                Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => panic!("reading {css}: {e}"),
            }
        }
    }

    /// Waits until the page's text contains `needle` (10 s), saying what it waited for.
    pub async fn wait_for_text(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = self.text().await;
            if text.contains(needle) {
                return;
            }
            if Instant::now() >= deadline {
                let url = self.client.current_url().await.map(|u| u.to_string()).unwrap_or_default();
                panic!("waited 10 s for {needle:?} on {url}; the page says:\n{text}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The path of the current page.
    pub async fn path(&self) -> String {
        self.client.current_url().await.unwrap().path().to_string()
    }

    /// Saves a screenshot as `name.png` when `GATEWAY_SCREENSHOTS` names a directory.
    pub async fn screenshot(&self, name: &str) {
        if let Ok(dir) = std::env::var("GATEWAY_SCREENSHOTS") {
            let png = self.client.screenshot().await.unwrap();
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(std::path::Path::new(&dir).join(format!("{name}.png")), png).unwrap();
        }
    }

    /// Ends the session and the driver.
    pub async fn close(mut self) {
        let _ = self.client.close().await;
        let _ = self.driver.kill().await;
    }
}
