//! What the tests that run the real `gateway` binary share.
#![allow(dead_code)] // each test binary uses a part of it

use serde_json::Value;
use sqlx::{Connection, Executor};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::net::{TcpListener, TcpStream};

/// The binary on the store at `url`, with `args` and `env`; compiled policy modules
/// are cached across tests, outside the source tree.
pub fn gateway(url: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gateway"));
    command.arg("--database-url").arg(url).args(args).env_remove("GATEWAY_DATABASE_URL");
    command.env("GATEWAY_POLICIES__CACHE_DIR", std::env::temp_dir().join("gateway-test-wasm-cache"));
    for (k, v) in env {
        command.env(k, v);
    }
    command
}

/// Runs a CLI command that must succeed; its JSON output.
pub fn run_json(mut command: Command) -> Value {
    let out = command.output().expect("gateway runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

/// A gateway process a test started: killed when dropped, so a test that fails (a
/// panic before its own kill) leaves no server running behind it.
pub struct Served(pub Child);

impl std::ops::Deref for Served {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Served {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A process a test stops (kill, then reap).
pub trait Stop {
    fn stop(self);
}

impl Stop for Child {
    fn stop(mut self) {
        let _ = self.kill();
        let _ = self.wait();
    }
}

impl Stop for Served {
    fn stop(self) {
        drop(self);
    }
}

/// `gateway serve` on 127.0.0.1:`port` with `env` (stdout and stderr discarded: give
/// `GATEWAY_LOG_FILE` to keep the log), once it accepts connections.
pub async fn serve(command: Command, port: u16) -> Served {
    let mut command = command;
    command.arg("serve").arg("--listen").arg(format!("127.0.0.1:{port}"));
    let mut child = command.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("the gateway starts");
    for _ in 0..400 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return Served(child);
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("the gateway did not start");
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A store for one test: a SQLite file, or a fresh PostgreSQL database.
pub struct Db {
    pub url: String,
    /// (admin URL, database name) on PostgreSQL.
    pub postgres: Option<(String, String)>,
    _dir: tempfile::TempDir,
}

impl Db {
    pub async fn new(name: &str) -> Db {
        let dir = tempfile::Builder::new().prefix(&format!("gw-{name}-")).tempdir().unwrap();
        match std::env::var("GATEWAY_TEST_DATABASE_URL") {
            Ok(admin) if !admin.is_empty() => {
                let db = format!("gw_{name}_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
                sqlx::any::install_default_drivers();
                let mut conn = sqlx::AnyConnection::connect(&admin).await.unwrap();
                conn.execute(format!("CREATE DATABASE {db}").as_str()).await.unwrap();
                conn.close().await.ok();
                let (base, _) = admin.rsplit_once('/').unwrap();
                Db { url: format!("{base}/{db}"), postgres: Some((admin, db)), _dir: dir }
            }
            _ => {
                let url = format!("sqlite://{}?mode=rwc", dir.path().join("g.db").display());
                Db { url, postgres: None, _dir: dir }
            }
        }
    }

    pub async fn drop_it(self) {
        if let Some((admin, db)) = &self.postgres
            && let Ok(mut conn) = sqlx::AnyConnection::connect(admin).await
        {
            let _ = conn.execute(format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)").as_str()).await;
        }
    }
}

/// A TCP proxy to PostgreSQL that the test can cut (every connection closed, new ones
/// closed at once) and restore.
pub struct Proxy {
    pub port: u16,
    cut: Arc<AtomicBool>,
    connections: Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Proxy {
    pub async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (c, conns) = (cut.clone(), connections.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if c.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let upstream = upstream.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                conns.lock().unwrap().push(task.abort_handle());
            }
        });
        Proxy { port, cut, connections }
    }

    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for c in self.connections.lock().unwrap().drain(..) {
            c.abort();
        }
    }

    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Db {
    /// The store's URL, through a `Proxy` the test can cut on PostgreSQL; on SQLite the
    /// file itself (no proxy: another connection's lock makes it unavailable).
    pub async fn through_proxy(&self) -> (String, Option<Proxy>) {
        match &self.postgres {
            Some(_) => {
                let (_, rest) = self.url.split_once("@").unwrap();
                let (hostport, name) = rest.split_once('/').unwrap();
                let proxy = Proxy::start(hostport.to_string()).await;
                let url =
                    self.url.replace(&format!("@{hostport}/{name}"), &format!("@127.0.0.1:{}/{name}", proxy.port));
                (url, Some(proxy))
            }
            None => (self.url.clone(), None),
        }
    }
}

/// A text send as the demo tenant made by `gateway demo` (instance `demo`), to the
/// gateway on 127.0.0.1:`port`: its status and JSON answer.
pub async fn send_text(http: &reqwest::Client, port: u16, key: &str, phone: &str, text: &str) -> (u16, Value) {
    let body = serde_json::json!({"instance_id": "demo", "phone": phone, "message_purpose": "transactional",
                                  "message": text});
    let r = http
        .post(format!("http://127.0.0.1:{port}/api/send-message"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .expect("the gateway answers");
    (r.status().as_u16(), r.json().await.unwrap())
}
