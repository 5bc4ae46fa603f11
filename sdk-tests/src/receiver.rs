//! A webhook receiver double on its own loopback port: it records every request
//! (headers, raw body, arrival time) and answers each with the next scripted behaviour.
//!
//! It speaks just enough HTTP/1.1 by hand to misbehave on purpose: hang past a client's
//! timeout, reset the connection, redirect.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How the receiver answers one request.
#[derive(Clone, Debug)]
pub enum Behaviour {
    /// Status, extra headers, body.
    Answer(u16, Vec<(String, String)>, String),
    /// Read the request, then wait this long before answering 200.
    Hang(Duration),
    /// Read the request, then reset the connection (RST).
    Reset,
}

impl Behaviour {
    pub fn status(code: u16) -> Behaviour {
        Behaviour::Answer(code, Vec::new(), format!("answer {code}"))
    }
}

/// One request as received.
#[derive(Clone, Debug)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
    pub at: Instant,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(&name.to_ascii_lowercase()).map(String::as_str)
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("the body is JSON")
    }
}

#[derive(Default)]
struct State {
    script: VecDeque<Behaviour>,
    received: Vec<Received>,
}

/// The receiver; it runs until dropped.
pub struct Receiver {
    pub port: u16,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Receiver {
    /// Starts on 127.0.0.1 with an empty script (every request answered 200).
    pub async fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the receiver");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serve(socket, shared.clone()));
            }
        });
        Receiver { port, state, task }
    }

    /// `http://127.0.0.1:{port}{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Queues behaviours for the next requests (then 200 again).
    pub fn script(&self, behaviours: impl IntoIterator<Item = Behaviour>) {
        self.state.lock().unwrap().script.extend(behaviours);
    }

    /// Everything received so far.
    pub fn received(&self) -> Vec<Received> {
        self.state.lock().unwrap().received.clone()
    }

    /// Waits until `n` requests arrived (or panics after `limit`).
    pub async fn wait_for(&self, n: usize, limit: Duration) -> Vec<Received> {
        let started = Instant::now();
        loop {
            let received = self.received();
            if received.len() >= n {
                return received;
            }
            assert!(started.elapsed() < limit, "only {} of {n} requests arrived in {limit:?}", received.len());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn serve(mut socket: TcpStream, state: Arc<Mutex<State>>) {
    loop {
        let Some(request) = read_request(&mut socket).await else {
            return;
        };
        let behaviour = {
            let mut state = state.lock().unwrap();
            state.received.push(request);
            state.script.pop_front().unwrap_or_else(|| Behaviour::status(200))
        };
        let (status, headers, body) = match behaviour {
            Behaviour::Answer(status, headers, body) => (status, headers, body),
            Behaviour::Hang(d) => {
                tokio::time::sleep(d).await;
                (200, Vec::new(), "late".into())
            }
            Behaviour::Reset => {
                // A zero linger makes the close a reset (RST); with zero it never blocks,
                // which is what the deprecation warns about.
                #[allow(deprecated)]
                let _ = socket.set_linger(Some(Duration::ZERO));
                return;
            }
        };
        let mut head = format!("HTTP/1.1 {status} X\r\ncontent-length: {}\r\n", body.len());
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        if socket.write_all(head.as_bytes()).await.is_err() || socket.write_all(body.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Answers a request with a status and a JSON body.
pub type JsonHandler = Arc<dyn Fn(&Received) -> (u16, serde_json::Value) + Send + Sync>;

/// Serves `handler` on 127.0.0.1: every request gets the status and JSON body it
/// returns (keep-alive). For doubles that answer, rather than misbehave.
pub async fn serve_json(handler: JsonHandler) -> (u16, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the double");
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let handler = handler.clone();
            tokio::spawn(async move {
                while let Some(request) = read_request(&mut socket).await {
                    let (status, body) = handler(&request);
                    let body = body.to_string();
                    let head = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    );
                    if socket.write_all(head.as_bytes()).await.is_err()
                        || socket.write_all(body.as_bytes()).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (port, task)
}

async fn read_request(socket: &mut TcpStream) -> Option<Received> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next()?.split(' ');
    let method = request_line.next()?.to_string();
    let path = request_line.next()?.to_string();
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < length {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(length);
    Some(Received { method, path, headers, body, at: Instant::now() })
}
