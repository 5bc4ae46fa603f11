//! Customer webhooks: the dispatcher that delivers the outbox, signed, retried, logged.
//!
//! Every event is written to the outbox in the transaction of the change that causes
//! it, so nothing is lost between "stored" and "queued": there is no queue. The
//! dispatcher (`dispatcher`) claims due rows with a lease ([`Store::claim_events`]),
//! delivers each to its instance's endpoint, and records the attempt together with the
//! event's next state ([`Store::finish_attempt`]). At least once: an event is retried
//! until a 2xx or the end of the schedule; a crash after a delivery but before its
//! record repeats it, and the stable `X-Gateway-Event-Id` lets the receiver drop the
//! repeat.
//!
//! Policy (the defaults of `[webhooks]`): attempts after 0 s, 5 s, 5 min, 30 min, 2 h,
//! 5 h, 10 h, 10 h, each ±20 %; 15 s to answer; 64 requests in flight per process; only
//! 2xx is success; redirects are never followed; 410 disables the endpoint; 429 and 503
//! honour `Retry-After` within [d, 2d]; an endpoint with only failures for 5 days is
//! disabled (its owner sees why; an operator log line says so). Every connect goes
//! through the SSRF guard (`net::ssrf`): the host is resolved by
//! `net::guarded::GuardedResolver`, which refuses private, loopback, link-local, CGNAT,
//! multicast, documentation and metadata addresses, and the client connects to the
//! addresses it checked (no second lookup).

mod dispatcher;
pub mod schedule;

pub use dispatcher::{Dispatcher, JOB};

use crate::config::WebhookSettings;
use crate::net::{guarded, ssrf};
use crate::store::{ClaimedEvent, EndpointChange, EventState, Store, WebhookAttempt, WebhookEndpoint, now_ms};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::time::{Duration, Instant};

/// How much of a response body the attempt log keeps.
pub const RESPONSE_LOG_BYTES: usize = 4096;
/// How long the previous secret keeps signing after a rotation.
pub const ROTATION_OVERLAP_MS: i64 = 24 * 3_600_000;

/// The HTTP client of deliveries: no redirects, no proxy, the guarded resolver.
pub fn http_client(settings: &WebhookSettings, allow_loopback: bool) -> reqwest::Client {
    guarded::client(
        allow_loopback,
        Duration::from_millis(settings.timeout_ms),
        concat!("gateway-webhooks/", env!("CARGO_PKG_VERSION")),
    )
}

/// Hex HMAC-SHA256 of `timestamp.body` under `secret`.
pub fn sign(secret: &str, timestamp: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// `X-Gateway-Signature`: `sha256=<hex>` per signing secret, newest first.
pub fn signature_header(secrets: &[&str], timestamp: &str, body: &[u8]) -> Option<String> {
    let parts: Vec<String> = secrets.iter().map(|s| format!("sha256={}", sign(s, timestamp, body))).collect();
    (!parts.is_empty()).then(|| parts.join(","))
}

/// A new signing secret: `whsec_` and 43 base62 characters.
pub fn new_secret() -> String {
    format!("whsec_{}", crate::apikey::random_base62(43))
}

/// Checks a destination when it is saved: https (http only to loopback with the
/// development flag), resolvable, every address allowed.
pub async fn check_url(url: &str, allow_loopback: bool) -> Result<(), ssrf::SsrfError> {
    ssrf::resolve(url, allow_loopback).await.map(|_| ())
}

/// What one HTTP attempt gave.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub status: Option<u16>,
    pub latency_ms: i64,
    pub body: Option<String>,
    pub error: Option<String>,
    pub retry_after: Option<Duration>,
}

impl Outcome {
    pub fn succeeded(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

/// An endpoint's URL as the SSRF guard parsed and checked it: its form and literal
/// addresses (names are checked by the resolver at connect). The URL the guard parsed is
/// the one posted to, and the dispatcher checks it once per endpoint per claim, not once
/// per delivery (URL parsing was 5.8 % of the process while delivering, BENCHMARKS.md,
/// issue 22).
pub type CheckedUrl = Result<url::Url, ssrf::SsrfError>;

/// Posts `body` to `endpoint` with the gateway's headers; never follows a redirect.
pub async fn post(
    client: &reqwest::Client,
    endpoint: &WebhookEndpoint,
    event_type: &str,
    event_id: &str,
    body: &[u8],
    allow_loopback: bool,
) -> Outcome {
    let url = guarded::check_url(&endpoint.url, allow_loopback);
    post_checked(client, endpoint, &url, event_type, event_id, body).await
}

/// [`post`] to the URL the guard already checked for `endpoint`.
async fn post_checked(
    client: &reqwest::Client,
    endpoint: &WebhookEndpoint,
    url: &CheckedUrl,
    event_type: &str,
    event_id: &str,
    body: &[u8],
) -> Outcome {
    let started = Instant::now();
    let now = now_ms();
    let timestamp = now.div_euclid(1000).to_string();
    let mut outcome = Outcome::default();
    let url = match url {
        Ok(url) => url.clone(),
        Err(e) => {
            outcome.error = Some(format!("refused by the SSRF guard: {e}"));
            return outcome;
        }
    };
    let mut request = client
        .post(url)
        .header("content-type", "application/json")
        .header("x-gateway-event", event_type)
        .header("x-gateway-event-id", event_id)
        .header("x-gateway-timestamp", &timestamp);
    if let Some(signature) = signature_header(&endpoint.signing_secrets(now), &timestamp, body) {
        request = request.header("x-gateway-signature", signature);
    }
    match request.body(body.to_vec()).send().await {
        Ok(mut response) => {
            outcome.status = Some(response.status().as_u16());
            outcome.retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(schedule::parse_retry_after);
            let mut kept = Vec::new();
            loop {
                match response.chunk().await {
                    Ok(Some(chunk)) => {
                        let room = RESPONSE_LOG_BYTES.saturating_sub(kept.len());
                        kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
                        if kept.len() >= RESPONSE_LOG_BYTES {
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        outcome.error = Some(describe(&e));
                        break;
                    }
                }
            }
            outcome.body = Some(String::from_utf8_lossy(&kept).into_owned());
        }
        Err(e) => outcome.error = Some(describe(&e)),
    }
    outcome.latency_ms = started.elapsed().as_millis() as i64;
    outcome
}

/// A transport error in a few words (for the attempt log and the owner).
fn describe(e: &reqwest::Error) -> String {
    let mut text = if e.is_timeout() {
        "timed out".to_string()
    } else if e.is_connect() {
        "could not connect".to_string()
    } else if e.is_body() || e.is_decode() {
        "the response could not be read".to_string()
    } else {
        "request failed".to_string()
    };
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text.chars().take(500).collect()
}

/// The stable id of an event, the same on every attempt (`X-Gateway-Event-Id`).
pub fn event_id(outbox_id: i64) -> String {
    format!("evt_{outbox_id}")
}

fn attempt_row(
    event: &ClaimedEvent,
    endpoint: &WebhookEndpoint,
    trigger: &str,
    attempt: i64,
    result: &Outcome,
) -> WebhookAttempt {
    WebhookAttempt {
        outbox_id: (event.id > 0).then_some(event.id),
        customer_id: endpoint.customer_id.clone(),
        instance_id: endpoint.instance_id.clone(),
        event_type: event.event_type.clone(),
        url: endpoint.url.clone(),
        trigger: trigger.to_string(),
        attempt,
        attempted_at: now_ms() - result.latency_ms,
        status_code: result.status.map(i64::from),
        latency_ms: result.latency_ms,
        response_body: result.body.clone(),
        error: result.error.clone(),
        succeeded: result.succeeded(),
        ..WebhookAttempt::default()
    }
}

/// One attempt outside the schedule: a manual resend of an event (`manual`), or a test
/// event (`test`, `event` with id 0). The attempt is logged; a successful resend of an
/// undelivered event marks it delivered. A resend never reschedules.
pub async fn deliver_once(
    store: &Store,
    client: &reqwest::Client,
    endpoint: &WebhookEndpoint,
    event: &ClaimedEvent,
    trigger: &str,
    allow_loopback: bool,
) -> Result<WebhookAttempt, crate::store::StoreError> {
    let id = if event.id > 0 { event_id(event.id) } else { format!("evt_test_{}", uuid::Uuid::new_v4().simple()) };
    let result = post(client, endpoint, &event.event_type, &id, event.payload.as_bytes(), allow_loopback).await;
    let attempt = attempt_row(event, endpoint, trigger, event.attempts + 1, &result);
    let state = if result.succeeded() && event.id > 0 && event.outcome.as_deref() != Some("delivered") {
        EventState::Done("delivered")
    } else {
        EventState::Unchanged
    };
    let change = if result.succeeded() { EndpointChange::Succeeded } else { EndpointChange::None };
    store.finish_attempt((event.id > 0).then_some(event.id), Some(&attempt), state, change).await?;
    Ok(attempt)
}

/// The body of a test event for an endpoint.
pub fn test_event(endpoint: &WebhookEndpoint) -> ClaimedEvent {
    let now = now_ms();
    let timestamp = chrono::DateTime::from_timestamp_millis(now).unwrap_or_default();
    let payload = serde_json::json!({
        "event": "webhook.test",
        "instance_id": endpoint.instance_id,
        "instance_name": endpoint.instance_name,
        "timestamp": timestamp.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "test": true,
    });
    ClaimedEvent {
        id: 0,
        customer_id: endpoint.customer_id.clone(),
        instance_id: Some(endpoint.instance_id.clone()),
        event_type: "webhook.test".into(),
        payload: payload.to_string(),
        attempts: 0,
        created_at: now,
        delivered_at: None,
        outcome: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(secret: Option<&str>, previous: Option<(&str, i64)>) -> WebhookEndpoint {
        WebhookEndpoint {
            instance_id: "ins_1".into(),
            instance_name: "main".into(),
            customer_id: "cus_1".into(),
            url: "https://example.com/hook".into(),
            events: vec!["message.sent".into()],
            secret: secret.map(str::to_string),
            previous_secret: previous.map(|(s, _)| s.to_string()),
            previous_secret_until: previous.map(|(_, t)| t),
            disabled_at: None,
            disabled_reason: None,
            failing_since: None,
            created_at: 0,
            updated_at: 0,
        }
    }

    #[test]
    fn the_previous_secret_signs_only_during_its_overlap() {
        let e = endpoint(Some("new"), Some(("old", 1_000)));
        assert_eq!(e.signing_secrets(999), ["new", "old"]);
        assert_eq!(e.signing_secrets(1_000), ["new"]);
        assert!(endpoint(None, None).signing_secrets(0).is_empty());
        let header = signature_header(&["new", "old"], "1700000000", b"{}").unwrap();
        assert_eq!(
            header,
            format!("sha256={},sha256={}", sign("new", "1700000000", b"{}"), sign("old", "1700000000", b"{}"))
        );
        assert_eq!(signature_header(&[], "1", b""), None);
        // python3 -c 'import hmac,hashlib; print(hmac.new(b"whsec_test", b"1700000000.{}", hashlib.sha256).hexdigest())'
        assert_eq!(
            sign("whsec_test", "1700000000", b"{}"),
            "35495024f4ef3f94e5a93e22221544c4b75e9a42300cd965ab81cb85cd994e91"
        );
    }
}
