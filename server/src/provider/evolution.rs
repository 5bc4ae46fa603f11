//! The Evolution-API-compatible provider adapter (reference: evolution-provider.md).
//!
//! Every call carries the `apikey` header with the operator's global key; an instance
//! is named at the provider by the gateway's instance id. Errors come in Evolution's
//! envelope `{"status","error","response":{"message":[...]}}` and are mapped to typed
//! errors: a recipient that is not on the network (a 400 whose message lists
//! `"exists": false`) is its own failure. On a send, a 5xx or a timeout means the
//! provider may already have sent the message, so it is an unknown outcome, never a
//! clean failure.

use super::{OutboundMessage, Provider, ProviderError, ProviderReceipt, SendingInstance};
use async_trait::async_trait;
use base64::Engine;
use serde_json::{Value, json};
use std::time::Duration;

/// Why an Evolution call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EvolutionError {
    #[error("the provider refused the API key")]
    Unauthorized,
    #[error("the provider does not know this instance or route")]
    NotFound,
    #[error("the recipient is not on the messaging network ({0})")]
    NotOnNetwork(String),
    #[error("the provider refused the request ({status}): {message}")]
    Rejected { status: u16, message: String },
    #[error("the provider failed ({status}): {message}")]
    Server { status: u16, message: String },
    #[error("the provider did not answer in time")]
    Timeout,
    /// No connection was made (refused, name not resolved, TLS failure, connect
    /// timeout): the provider cannot have seen the request.
    #[error("the provider could not be reached: {0}")]
    Unreachable(String),
    /// The connection broke after the request may have been written (reset, closed
    /// before an answer): the provider may have acted on it.
    #[error("the connection to the provider broke: {0}")]
    Interrupted(String),
    #[error("the provider's answer could not be read: {0}")]
    BadAnswer(String),
}

/// A QR code (or pairing code) to connect an instance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Qr {
    /// The QR payload (`2@...`).
    pub code: Option<String>,
    /// The QR as an image data URL.
    pub base64: Option<String>,
    /// The 8-character pairing code, when a number was given.
    pub pairing_code: Option<String>,
    /// How many QR codes the provider has issued; 0 means it returned none.
    pub count: i64,
}

impl Qr {
    /// Whether the provider actually returned a code (it sometimes answers `count: 0`).
    pub fn is_present(&self) -> bool {
        self.code.is_some() || self.base64.is_some() || self.pairing_code.is_some()
    }
}

/// What connecting an instance gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Connect {
    /// Scan this (or enter the pairing code).
    Qr(Qr),
    /// Already connected.
    Open,
}

/// An instance created at the provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Created {
    /// The provider's id of the instance.
    pub provider_id: String,
    /// The instance's own token at the provider.
    pub token: Option<String>,
    /// A QR, when the provider returned one with the creation.
    pub qr: Option<Qr>,
}

/// Where the provider posts its events for an instance, and the header it must send.
#[derive(Clone, Debug)]
pub struct WebhookTarget {
    pub url: String,
    pub header: String,
    pub secret: String,
}

/// Client of one Evolution server.
#[derive(Clone)]
pub struct Evolution {
    http: reqwest::Client,
    base: String,
    key: String,
}

/// The largest answer read from the provider (a QR as base64 is about 10 KB): a
/// longer one is a bad answer, never held whole.
pub const MAX_ANSWER_BYTES: usize = 1024 * 1024;

/// The events the gateway subscribes to.
pub const EVENTS: [&str; 8] = [
    "QRCODE_UPDATED",
    "CONNECTION_UPDATE",
    "MESSAGES_UPSERT",
    "MESSAGES_UPDATE",
    "SEND_MESSAGE",
    "CALL",
    "GROUPS_UPSERT",
    "GROUP_PARTICIPANTS_UPDATE",
];

impl Evolution {
    /// The client `config` names, when `evolution_url` and `evolution_api_key` are set.
    pub fn from_config(config: &crate::config::Config) -> Option<Evolution> {
        let url = config.evolution_url.as_deref().filter(|u| !u.is_empty())?;
        let key = config.evolution_api_key.as_deref().filter(|k| !k.is_empty())?;
        Some(Evolution::new(url, key, config.provider_timeout()))
    }

    /// A client for `base_url` with the operator's global key; every call is bounded by
    /// `timeout`.
    pub fn new(base_url: &str, global_key: &str, timeout: Duration) -> Evolution {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("the provider client builds");
        Evolution { http, base: base_url.trim_end_matches('/').to_string(), key: global_key.to_string() }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value, EvolutionError> {
        self.call_traced(method, path, body, None).await
    }

    async fn call_traced(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        request_id: Option<&str>,
    ) -> Result<Value, EvolutionError> {
        let mut request = self.http.request(method, format!("{}{path}", self.base)).header("apikey", &self.key);
        if let Some(id) = request_id {
            request = request.header("x-request-id", id);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(transport_error)?;
        let status = response.status().as_u16();
        let bytes = crate::net::guarded::read_capped(response, MAX_ANSWER_BYTES).await.map_err(|e| match e {
            crate::net::guarded::ReadError::Transport(e) if e.is_timeout() => EvolutionError::Timeout,
            other => EvolutionError::BadAnswer(other.to_string()),
        })?;
        let text = String::from_utf8_lossy(&bytes);
        let value: Value = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|_| Value::String(text.chars().take(2_000).collect()))
        };
        if (200..300).contains(&status) {
            return Ok(value);
        }
        Err(error_from_envelope(status, &value))
    }

    /// Creates the instance `name`, optionally with its webhook; the provider may or
    /// may not return a first QR.
    pub async fn create_instance(
        &self,
        name: &str,
        webhook: Option<&WebhookTarget>,
    ) -> Result<Created, EvolutionError> {
        let mut body = json!({
            "instanceName": name,
            "integration": "WHATSAPP-BAILEYS",
            "qrcode": true,
            // Evolution must not answer calls or messages itself: every reply goes
            // through the gateway's checks.
            "rejectCall": false,
            "groupsIgnore": false,
            "readMessages": false,
            "syncFullHistory": false,
        });
        if let Some(w) = webhook {
            body["webhook"] = webhook_json(w);
        }
        let answer = self.call(reqwest::Method::POST, "/instance/create", Some(body)).await?;
        let provider_id = answer["instance"]["instanceId"].as_str().unwrap_or(name).to_string();
        let token = answer["hash"].as_str().map(str::to_string);
        let qr = answer.get("qrcode").map(qr_from).filter(Qr::is_present);
        Ok(Created { provider_id, token, qr })
    }

    /// Starts or continues pairing: a QR (possibly empty: `count: 0`), or `Open`.
    pub async fn connect(&self, name: &str, number: Option<&str>) -> Result<Connect, EvolutionError> {
        let query = number.map(|n| format!("?number={}", n.trim_start_matches('+'))).unwrap_or_default();
        let answer = self.call(reqwest::Method::GET, &format!("/instance/connect/{name}{query}"), None).await?;
        if answer["instance"]["state"] == "open" {
            return Ok(Connect::Open);
        }
        Ok(Connect::Qr(qr_from(&answer)))
    }

    /// The instance's connection state: `open`, `connecting` or `close`.
    pub async fn connection_state(&self, name: &str) -> Result<String, EvolutionError> {
        let answer = self.call(reqwest::Method::GET, &format!("/instance/connectionState/{name}"), None).await?;
        answer["instance"]["state"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| EvolutionError::BadAnswer(format!("no state in {answer}")))
    }

    /// Logs the instance out of the messaging network.
    pub async fn logout(&self, name: &str) -> Result<(), EvolutionError> {
        self.call(reqwest::Method::DELETE, &format!("/instance/logout/{name}"), None).await.map(|_| ())
    }

    /// Deletes the instance at the provider.
    pub async fn delete(&self, name: &str) -> Result<(), EvolutionError> {
        self.call(reqwest::Method::DELETE, &format!("/instance/delete/{name}"), None).await.map(|_| ())
    }

    /// Points the instance's events at the gateway, with the secret header.
    pub async fn set_webhook(&self, name: &str, webhook: &WebhookTarget) -> Result<(), EvolutionError> {
        let body = json!({"webhook": {"enabled": true, "url": webhook.url, "byEvents": false, "base64": false,
                                      "headers": {webhook.header.clone(): webhook.secret}, "events": EVENTS}});
        self.call(reqwest::Method::POST, &format!("/webhook/set/{name}"), Some(body)).await.map(|_| ())
    }

    /// Sends a message; the provider's message id (`key.id`) and status.
    pub async fn send(&self, name: &str, message: &OutboundMessage) -> Result<ProviderReceipt, EvolutionError> {
        let number = message.to.trim_start_matches('+').to_string();
        let (path, body) = match &message.media {
            None => (
                format!("/message/sendText/{name}"),
                json!({"number": number, "text": message.text.clone().unwrap_or_default(), "linkPreview": false}),
            ),
            Some(media) => {
                // Always the content: a URL was fetched by the gateway through its guard,
                // so the provider never resolves a name the gateway checked.
                let content = base64::engine::general_purpose::STANDARD.encode(&media.bytes);
                let mut body = json!({"number": number, "mediatype": media.media_type.as_str(),
                                      "mimetype": media.mime_type, "media": content, "fileName": media.file_name});
                if let Some(caption) = &message.text {
                    body["caption"] = Value::String(caption.clone());
                }
                (format!("/message/sendMedia/{name}"), body)
            }
        };
        let answer = self.call_traced(reqwest::Method::POST, &path, Some(body), message.request_id.as_deref()).await?;
        let message_id = answer["key"]["id"]
            .as_str()
            .ok_or_else(|| EvolutionError::BadAnswer("the send answer has no key.id".into()))?
            .to_string();
        let status = answer["status"].as_str().unwrap_or("PENDING").to_ascii_lowercase();
        Ok(ProviderReceipt { message_id, status: if status == "pending" { "sent".into() } else { status } })
    }
}

/// What a transport failure proves. Only a failure to connect (refused, name not
/// resolved, TLS handshake, connect timeout) proves the provider never saw the request;
/// a timeout or a broken connection after that may follow a request it acted on.
fn transport_error(e: reqwest::Error) -> EvolutionError {
    let mut why = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        why = format!("{why}: {cause}");
        source = cause.source();
    }
    if e.is_connect() {
        EvolutionError::Unreachable(why)
    } else if e.is_timeout() {
        EvolutionError::Timeout
    } else {
        EvolutionError::Interrupted(why)
    }
}

fn webhook_json(w: &WebhookTarget) -> Value {
    json!({"url": w.url, "byEvents": false, "base64": false, "headers": {w.header.clone(): w.secret}, "events": EVENTS})
}

fn qr_from(v: &Value) -> Qr {
    let text = |k: &str| v[k].as_str().filter(|s| !s.is_empty()).map(str::to_string);
    Qr {
        code: text("code"),
        base64: text("base64"),
        pairing_code: text("pairingCode"),
        count: v["count"].as_i64().unwrap_or(0),
    }
}

/// Maps Evolution's error envelope to a typed error.
pub fn error_from_envelope(status: u16, body: &Value) -> EvolutionError {
    let message = &body["response"]["message"];
    let not_on_network = message.as_array().and_then(|items| {
        items.iter().find(|m| m["exists"] == false).map(|m| m["number"].as_str().unwrap_or_default().to_string())
    });
    let text = match message {
        Value::Array(items) => items
            .iter()
            .map(|m| m.as_str().map(str::to_string).unwrap_or_else(|| m.to_string()))
            .collect::<Vec<_>>()
            .join("; "),
        Value::String(s) => s.clone(),
        Value::Null => body.as_str().map(str::to_string).unwrap_or_else(|| body.to_string()),
        other => other.to_string(),
    };
    let text: String = text.chars().take(300).collect();
    match status {
        401 | 403 if text.contains("Unauthorized") || status == 401 => EvolutionError::Unauthorized,
        404 => EvolutionError::NotFound,
        400 if not_on_network.is_some() => EvolutionError::NotOnNetwork(not_on_network.unwrap_or_default()),
        400..=499 => EvolutionError::Rejected { status, message: text },
        _ => EvolutionError::Server { status, message: text },
    }
}

#[async_trait]
impl Provider for Evolution {
    fn name(&self) -> &'static str {
        "evolution"
    }

    async fn send(
        &self,
        instance: &SendingInstance,
        message: &OutboundMessage,
    ) -> Result<ProviderReceipt, ProviderError> {
        Evolution::send(self, &instance.id, message).await.map_err(|e| match e {
            // Nothing was taken: clean failures.
            EvolutionError::NotOnNetwork(number) => ProviderError::NotOnNetwork(number),
            EvolutionError::Unreachable(why) => ProviderError::Unavailable(why),
            e @ (EvolutionError::Unauthorized | EvolutionError::NotFound | EvolutionError::Rejected { .. }) => {
                ProviderError::Rejected(e.to_string())
            }
            // It took the request and then failed or went silent: it may have sent it.
            e @ (EvolutionError::Server { .. }
            | EvolutionError::Timeout
            | EvolutionError::BadAnswer(_)
            | EvolutionError::Interrupted(_)) => ProviderError::OutcomeUnknown(e.to_string()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_envelopes_map_to_typed_errors() {
        let not_on = json!({"status": 400, "error": "Bad Request",
                            "response": {"message": [{"jid": "5511@s.whatsapp.net", "exists": false, "number": "5511999"}]}});
        assert_eq!(error_from_envelope(400, &not_on), EvolutionError::NotOnNetwork("5511999".into()));
        let closed =
            json!({"status": 400, "error": "Bad Request", "response": {"message": ["Error: Connection Closed"]}});
        assert_eq!(
            error_from_envelope(400, &closed),
            EvolutionError::Rejected { status: 400, message: "Error: Connection Closed".into() }
        );
        let unauthorized = json!({"status": 401, "error": "Unauthorized", "response": {"message": "Unauthorized"}});
        assert_eq!(error_from_envelope(401, &unauthorized), EvolutionError::Unauthorized);
        let missing = json!({"status": 404, "error": "Not Found", "response": {"message": ["Cannot POST /x"]}});
        assert_eq!(error_from_envelope(404, &missing), EvolutionError::NotFound);
        let server = error_from_envelope(500, &Value::String("upstream exploded".into()));
        assert_eq!(server, EvolutionError::Server { status: 500, message: "upstream exploded".into() });
    }

    #[test]
    fn a_qr_of_count_zero_is_no_qr() {
        assert!(!qr_from(&json!({"count": 0})).is_present());
        let qr =
            qr_from(&json!({"pairingCode": null, "code": "2@abc", "base64": "data:image/png;base64,iVBO", "count": 1}));
        assert!(qr.is_present());
        assert_eq!((qr.code.as_deref(), qr.count), (Some("2@abc"), 1));
    }
}
