//! Exactly-once sending for SDK users: an idempotency key per logical message, and a
//! send that retries with it.
//!
//! The gateway keeps the final answer of the first request with a key for 24 hours and
//! replays it for a retry with the same key and body (header `Idempotent-Replayed:
//! true`), so retrying a send whose answer was lost never sends it twice. A retry
//! while the first is still running is 409 `idempotency_request_in_progress`; a
//! throttled or over-quota send (429) and a provider failure that proved nothing was
//! sent (502 other than `provider_outcome_unknown`) leave the key free, so a later
//! retry runs again.

use crate::{Client, Error, ResponseValue, types};
use std::time::Duration;

/// The request header that carries the key.
pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";
/// The answer header of a replayed answer.
pub const REPLAYED_HEADER: &str = "Idempotent-Replayed";

/// How `message_send_exactly_once` retries.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// The first backoff; each later one doubles, with full jitter.
    pub base_delay: Duration,
    /// No wait is longer: an answer asking for longer (`Retry-After`, for example a
    /// daily quota) ends the retries with that answer.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { max_attempts: 6, base_delay: Duration::from_millis(200), max_delay: Duration::from_secs(30) }
    }
}

/// A fresh key for one logical message.
pub fn new_idempotency_key() -> String {
    format!("gw-{}", uuid::Uuid::new_v4().simple())
}

/// Whether an answer was replayed by the gateway (the key's first request answered it).
pub fn was_replayed<T>(response: &ResponseValue<T>) -> bool {
    response.headers().get(REPLAYED_HEADER).is_some_and(|v| v.as_bytes() == b"true")
}

impl Client {
    /// `message_send` with an `Idempotency-Key`: the same key with the same body gets
    /// the first answer again and sends nothing.
    pub async fn message_send_with_key(
        &self,
        idempotency_key: &str,
        body: &types::SendMessageRequest,
    ) -> Result<ResponseValue<types::SendMessageResponse>, Error<types::ErrorBody>> {
        use progenitor_client::{ClientHooks, ClientInfo};
        let url = format!("{}/api/send-message", self.baseurl());
        let mut request = self
            .client()
            .post(url)
            .header(reqwest::header::ACCEPT, "application/json")
            .header("api-version", <Client as ClientInfo<crate::Auth>>::api_version())
            .header(IDEMPOTENCY_KEY_HEADER, idempotency_key)
            .json(body)
            .build()
            .map_err(|e| Error::InvalidRequest(e.to_string()))?;
        let info = progenitor_client::OperationInfo { operation_id: "message_send" };
        self.pre(&mut request, &info).await?;
        let result = self.exec(request, &info).await;
        self.post(&result, &info).await?;
        let response = result?;
        match response.status().as_u16() {
            200 => ResponseValue::from_response(response).await,
            400..=599 => Err(Error::ErrorResponse(ResponseValue::from_response(response).await?)),
            _ => Err(Error::UnexpectedResponse(response)),
        }
    }

    /// Sends one logical message exactly once: a fresh idempotency key, and retries
    /// with it on a lost answer (transport failure, or a proxy's own 502, 503 or 504
    /// without the gateway's error body), 409 (the first still running),
    /// 429, 500, 503 and a 502 that proved nothing was sent, waiting `Retry-After` (or
    /// `details.retry_after_seconds`) when given, else an exponential backoff with
    /// full jitter. A 502 `provider_outcome_unknown` is final: the message may be out,
    /// and the gateway settles it later (its log and events say which).
    pub async fn message_send_exactly_once(
        &self,
        body: &types::SendMessageRequest,
        policy: &RetryPolicy,
    ) -> Result<ResponseValue<types::SendMessageResponse>, Error<types::ErrorBody>> {
        let key = new_idempotency_key();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = self.message_send_with_key(&key, body).await;
            let error = match result {
                Ok(sent) => return Ok(sent),
                Err(e) => e,
            };
            let Some(asked) = retry_wait(&error) else { return Err(error) };
            if attempt >= policy.max_attempts {
                return Err(error);
            }
            let backoff = policy.base_delay.saturating_mul(1 << (attempt - 1).min(16)).min(policy.max_delay);
            let wait = match asked {
                Some(asked) if asked > policy.max_delay => return Err(error),
                Some(asked) => asked,
                None => backoff.mul_f64(rand::random::<f64>()),
            };
            tokio::time::sleep(wait).await;
        }
    }
}

/// Whether a send that failed with `error` may be sent again *without* an idempotency
/// key: only when the answer proves that nothing was sent. That is 429 (throttled or
/// over a quota), 503 `service_unavailable` (the database was out of reach before the
/// provider was called) and a 502 whose `details.reason` is not
/// `provider_outcome_unknown` (the provider refused the message). A lost answer (a
/// broken connection, a timeout, a load balancer's own 502, 503 or 504), a 500 and a
/// 502 `provider_outcome_unknown` are not: the message may be out, and only a retry
/// with the same key (`message_send_exactly_once`) is safe.
pub fn retry_without_key_is_safe(error: &Error<types::ErrorBody>) -> bool {
    match error {
        Error::ErrorResponse(rv) => match rv.status().as_u16() {
            429 => true,
            503 => rv.error == "service_unavailable",
            502 => {
                rv.error == "gateway_send_failed"
                    && rv.details.get("reason").and_then(|r| r.as_str()) != Some("provider_outcome_unknown")
            }
            _ => false,
        },
        _ => false,
    }
}

/// Whether an error is worth a retry with the same key (`Some`), and the wait the
/// gateway asked for, if it did.
fn retry_wait(error: &Error<types::ErrorBody>) -> Option<Option<Duration>> {
    match error {
        Error::CommunicationError(_) | Error::ResponseBodyError(_) => Some(None),
        // A load balancer or proxy in front of the gateway answered for it (no gateway
        // error body): the gateway's answer, if any, was lost.
        Error::InvalidResponsePayload(..) => Some(None),
        Error::UnexpectedResponse(r) if (502..=504).contains(&r.status().as_u16()) => Some(None),
        Error::ErrorResponse(rv) => {
            let retryable = match rv.status().as_u16() {
                409 | 429 | 500 | 503 => true,
                502 => rv.details.get("reason").and_then(|r| r.as_str()) != Some("provider_outcome_unknown"),
                _ => false,
            };
            if !retryable {
                return None;
            }
            let header = rv
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok());
            let detail = rv.details.get("retry_after_seconds").and_then(|v| v.as_u64());
            Some(header.or(detail).map(Duration::from_secs))
        }
        _ => None,
    }
}
