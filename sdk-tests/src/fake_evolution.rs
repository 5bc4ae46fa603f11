//! A fake Evolution API server on its own loopback port, speaking the shapes of the
//! reference (evolution-provider.md §1.1 to §1.3): the `apikey` guard after the
//! instance-exists guard, the error envelope, instance create / connect / state /
//! logout / delete, webhook set, sendText and sendMedia with their 201 answers. It can
//! reproduce failure modes: a QR of `count: 0`, numbers not on the network, a 5xx on a
//! send that was actually sent, a closed connection.

use crate::receiver::{Received, serve_json};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// An instance as the fake holds it.
#[derive(Clone, Debug)]
pub struct FakeInstance {
    pub state: String,
    pub token: String,
    pub qr_count: i64,
    pub webhook: Option<Value>,
}

#[derive(Default)]
struct State {
    instances: HashMap<String, FakeInstance>,
    /// (instance, route, body) of every send the fake accepted (really "sent").
    sent: Vec<(String, String, Value)>,
    /// The `X-Request-Id` of each of those sends.
    request_ids: Vec<Option<String>>,
    not_on_network: HashSet<String>,
    fail_after_send: HashSet<String>,
    qr_count_zero: bool,
}

/// The fake server; it runs until dropped.
pub struct FakeEvolution {
    pub port: u16,
    pub key: String,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeEvolution {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn envelope(status: u16, error: &str, message: Value) -> (u16, Value) {
    (status, json!({"status": status, "error": error, "response": {"message": message}}))
}

impl FakeEvolution {
    /// Starts with global key `key`.
    pub async fn start(key: &str) -> FakeEvolution {
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let global = key.to_string();
        let (port, task) = serve_json(Arc::new(move |r: &Received| handle(&shared, &global, r))).await;
        FakeEvolution { port, key: key.to_string(), state, task }
    }

    /// `http://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Points a gateway configuration at this fake as its (default) provider.
    pub fn configure(&self, config: &mut gateway_server::config::Config) {
        config.provider = "evolution".into();
        config.evolution_url = Some(self.url());
        config.evolution_api_key = Some(self.key.clone());
    }

    /// The phone scanned the QR: the instance is connected.
    pub fn open(&self, name: &str) {
        if let Some(i) = self.state.lock().unwrap().instances.get_mut(name) {
            i.state = "open".into();
        }
    }

    pub fn instance(&self, name: &str) -> Option<FakeInstance> {
        self.state.lock().unwrap().instances.get(name).cloned()
    }

    /// Every send the fake accepted: (instance, route, body).
    pub fn sent(&self) -> Vec<(String, String, Value)> {
        self.state.lock().unwrap().sent.clone()
    }

    /// The `X-Request-Id` header of every send the fake accepted.
    pub fn request_ids(&self) -> Vec<Option<String>> {
        self.state.lock().unwrap().request_ids.clone()
    }

    /// This number (digits) is not on the network.
    pub fn not_on_network(&self, number: &str) {
        self.state.lock().unwrap().not_on_network.insert(number.to_string());
    }

    /// A send to this number goes out and then the fake answers 500.
    pub fn fail_after_send(&self, number: &str) {
        self.state.lock().unwrap().fail_after_send.insert(number.to_string());
    }

    /// Posts an event for `name` to the webhook the gateway configured for it, with
    /// its header, as Evolution does; the gateway's status code.
    pub async fn emit(&self, name: &str, envelope: &Value) -> u16 {
        let webhook = self.instance(name).and_then(|i| i.webhook).expect("the instance has a webhook");
        let url = webhook["url"].as_str().expect("webhook url").to_string();
        let mut request = reqwest::Client::new().post(url).json(envelope);
        if let Some(headers) = webhook["headers"].as_object() {
            for (k, v) in headers {
                request = request.header(k.as_str(), v.as_str().unwrap_or_default());
            }
        }
        request.send().await.expect("the gateway answers").status().as_u16()
    }

    /// Connect answers `{"count": 0}` (Evolution #2385).
    pub fn qr_count_zero(&self, on: bool) {
        self.state.lock().unwrap().qr_count_zero = on;
    }
}

fn handle(state: &Mutex<State>, key: &str, r: &Received) -> (u16, Value) {
    let (path, query) = r.path.split_once('?').unwrap_or((r.path.as_str(), ""));
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let body: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    let mut st = state.lock().unwrap();
    let authorized = r.header("apikey") == Some(key);
    match (r.method.as_str(), parts.as_slice()) {
        ("POST", ["instance", "create"]) => {
            if !authorized {
                return envelope(401, "Unauthorized", json!("Unauthorized"));
            }
            let Some(name) = body["instanceName"].as_str() else {
                return envelope(400, "Bad Request", json!(["instanceName is required"]));
            };
            if body["integration"] != "WHATSAPP-BAILEYS" {
                return envelope(400, "Bad Request", json!(["Invalid integration"]));
            }
            if st.instances.contains_key(name) {
                return envelope(403, "Forbidden", json!([format!("This name \"{name}\" is already in use.")]));
            }
            let token = uuid::Uuid::new_v4().to_string().to_uppercase();
            st.instances.insert(
                name.to_string(),
                FakeInstance {
                    state: "connecting".into(),
                    token: token.clone(),
                    qr_count: 0,
                    webhook: body.get("webhook").cloned(),
                },
            );
            // As often happens (#1541), no QR with the creation.
            (
                201,
                json!({"instance": {"instanceName": name, "instanceId": uuid::Uuid::new_v4().to_string(),
                                      "integration": "WHATSAPP-BAILEYS", "status": "connecting"},
                         "hash": token, "qrcode": {"count": 0}}),
            )
        }
        (method, [group, action, name]) => {
            let count_zero = st.qr_count_zero;
            let Some(instance) = st.instances.get_mut(*name) else {
                return envelope(404, "Not Found", json!([format!("The \"{name}\" instance does not exist")]));
            };
            if !authorized && r.header("apikey") != Some(instance.token.as_str()) {
                return envelope(401, "Unauthorized", json!("Unauthorized"));
            }
            match (method, *group, *action) {
                ("GET", "instance", "connect") => {
                    if instance.state == "open" {
                        return (200, json!({"instance": {"instanceName": name, "state": "open"}}));
                    }
                    if count_zero {
                        return (200, json!({"count": 0}));
                    }
                    instance.state = "connecting".into();
                    instance.qr_count += 1;
                    let pairing = query.strip_prefix("number=").map(|_| json!("WZYEH1YY")).unwrap_or(Value::Null);
                    (
                        200,
                        json!({"pairingCode": pairing, "code": format!("2@fakeqr{}", instance.qr_count),
                                 "base64": "data:image/png;base64,iVBORw0KGgo=", "count": instance.qr_count}),
                    )
                }
                ("GET", "instance", "connectionState") => {
                    (200, json!({"instance": {"instanceName": name, "state": instance.state}}))
                }
                ("DELETE", "instance", "logout") => {
                    if instance.state == "close" {
                        return envelope(400, "Bad Request", json!(["The \"x\" instance is not connected"]));
                    }
                    instance.state = "close".into();
                    (200, json!({"status": "SUCCESS", "error": false, "response": {"message": "Instance logged out"}}))
                }
                ("DELETE", "instance", "delete") => {
                    st.instances.remove(*name);
                    (200, json!({"status": "SUCCESS", "error": false, "response": {"message": "Instance deleted"}}))
                }
                ("POST", "webhook", "set") => {
                    instance.webhook = Some(body["webhook"].clone());
                    (201, json!({"webhook": {"instanceName": name, "webhook": body["webhook"]}}))
                }
                ("POST", "message", action @ ("sendText" | "sendMedia")) => {
                    if instance.state != "open" {
                        return envelope(400, "Bad Request", json!(["Error: Connection Closed"]));
                    }
                    let number = body["number"].as_str().unwrap_or_default().to_string();
                    if number.is_empty() {
                        return envelope(400, "Bad Request", json!(["number is required"]));
                    }
                    if action == "sendText" && body["text"].as_str().is_none_or(str::is_empty) {
                        return envelope(400, "Bad Request", json!(["Text is required"]));
                    }
                    if action == "sendMedia" && body["mediatype"] == "document" && body["fileName"].is_null() {
                        return envelope(400, "Bad Request", json!(["For base64 the file name must be informed."]));
                    }
                    if st.not_on_network.contains(&number) {
                        let jid = format!("{number}@s.whatsapp.net");
                        return envelope(400, "Bad Request", json!([{"jid": jid, "exists": false, "number": number}]));
                    }
                    st.sent.push((name.to_string(), action.to_string(), body.clone()));
                    st.request_ids.push(r.header("x-request-id").map(str::to_string));
                    if st.fail_after_send.contains(&number) {
                        return envelope(500, "Internal Server Error", json!(["socket hang up"]));
                    }
                    let id = uuid::Uuid::new_v4().simple().to_string().to_uppercase()[..20].to_string();
                    let message = if action == "sendText" {
                        json!({"conversation": body["text"]})
                    } else {
                        json!({"documentMessage": {"caption": body["caption"]}})
                    };
                    (
                        201,
                        json!({"key": {"remoteJid": format!("{number}@s.whatsapp.net"), "fromMe": true, "id": id},
                                 "pushName": "", "status": "PENDING", "message": message,
                                 "messageType": if action == "sendText" { "conversation" } else { "documentMessage" },
                                 "messageTimestamp": chrono::Utc::now().timestamp(), "source": "unknown"}),
                    )
                }
                _ => envelope(404, "Not Found", json!([format!("Cannot {method} {path}")])),
            }
        }
        (method, _) => envelope(404, "Not Found", json!([format!("Cannot {method} {path}")])),
    }
}
