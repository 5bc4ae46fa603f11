//! A send's answer on the wire: the pipeline's errors as wire errors (status, the
//! specification's code, an external message, and `details`), the answer kept for an
//! idempotency key, and a PBX event's send answered within the PBX webhook's statuses.
//! Internal detail (database errors, provider messages) goes to the log, never to the
//! caller; store errors become wire errors in `http/error.rs`.

use super::idempotency::{Decided, KeyError};
use super::{SendError, Sent};
use crate::provider::ProviderError;
use crate::store::Answer;
use gateway_api::{ApiError, SendMessageResponse};

impl From<SendError> for ApiError {
    fn from(e: SendError) -> ApiError {
        ApiError::from(&e)
    }
}

impl From<&SendError> for ApiError {
    fn from(e: &SendError) -> ApiError {
        let code = e.code();
        match e {
            SendError::Validation { field, reason } => {
                ApiError::new(422, code, reason.clone()).with_detail("field", *field)
            }
            SendError::MissingPhone => ApiError::new(422, code, "phone is required").with_detail("field", "phone"),
            SendError::MissingMessageText => {
                ApiError::new(422, code, "message is required for a text send").with_detail("field", "message")
            }
            SendError::PurposeRequired => {
                ApiError::new(422, code, "message_purpose is required").with_detail("field", "message_purpose")
            }
            SendError::KeyRevoked => ApiError::new(401, code, "this API key has been revoked"),
            SendError::InvalidInstance => ApiError::new(404, code, "instance not found for this customer"),
            SendError::ActivePlanRequired { plan_status } => {
                ApiError::new(403, code, "an active plan is required to send")
                    .with_detail("plan_status", plan_status.as_str())
            }
            SendError::ModuleNotEnabled { module } => {
                ApiError::new(403, code, format!("the {module} module is not enabled")).with_detail("module", *module)
            }
            SendError::Paused { .. } => {
                ApiError::new(423, code, "the instance is paused for responsible-messaging review")
            }
            SendError::PurposeNotAllowed { policy, rule, reason, risk_score } => {
                ApiError::new(422, code, reason.clone())
                    .with_detail("risk_score", *risk_score)
                    .with_detail("field", "message_purpose")
                    .with_detail("policy", policy.clone())
                    .with_detail("rule", rule.clone())
                    .with_detail("reason", reason.clone())
                    .with_detail("action", "block")
            }
            SendError::PolicyViolation { policy, rule, reason, action, risk_score } => {
                let message = match *action {
                    "review" => "the message was held for a responsible-messaging review and not sent",
                    _ => "the message was refused by a responsible-messaging policy",
                };
                let e = ApiError::new(403, code, message)
                    .with_detail("policy", policy.clone())
                    .with_detail("reason", reason.clone())
                    .with_detail("action", *action)
                    .with_detail("risk_score", *risk_score);
                match rule {
                    Some(rule) => e.with_detail("rule", rule.clone()),
                    None => e,
                }
            }
            SendError::Suppressed => ApiError::new(403, code, "the recipient has opted out or is suppressed"),
            SendError::Throttled { scope, limit, retry_after_seconds } => {
                ApiError::new(429, code, format!("too many sends a minute for this {scope}"))
                    .with_detail("scope", *scope)
                    .with_detail("limit", *limit)
                    .with_detail("retry_after_seconds", *retry_after_seconds)
            }
            SendError::DailyLimit { limit, used, resets_at, retry_after_seconds } => limit_error(
                ApiError::new(429, code, "the daily message limit is reached"),
                *limit,
                *used,
                *resets_at,
                *retry_after_seconds,
            ),
            SendError::MonthlyLimit { limit, used, resets_at, retry_after_seconds } => limit_error(
                ApiError::new(429, code, "the monthly message limit is reached"),
                *limit,
                *used,
                *resets_at,
                *retry_after_seconds,
            ),
            // An outcome the gateway cannot know is one reason for the caller
            // (`provider_outcome_unknown`: do not send it again as a new message); the
            // cause (a timeout, a broken connection, a provider 5xx) rides beside it.
            SendError::Provider(p) if p.outcome_unknown() => {
                ApiError::new(502, code, "the provider may have sent the message; its outcome is not known yet")
                    .with_detail("reason", "provider_outcome_unknown")
                    .with_detail("cause", p.code())
                    .with_internal(p.to_string())
            }
            SendError::Provider(p) => ApiError::new(502, code, "the message could not be delivered")
                .with_detail("reason", p.code())
                .with_internal(p.to_string()),
            SendError::IdempotencyInProgress | SendError::Keyed(Decided::InProgress) => {
                ApiError::new(409, code, "a request with this Idempotency-Key is in progress; retry after it finishes")
                    .with_detail("retry_after_seconds", 1)
            }
            SendError::Keyed(Decided::Reused) => key_refusal(code, KeyError::Reused),
            // `send_answer` answers the kept answer itself.
            SendError::Keyed(Decided::Replay(_)) => ApiError::internal("a replay reached the error answers"),
            SendError::Store(s) => ApiError::from(s),
        }
    }
}

/// A send caused by a PBX event, answered within the PBX webhook's statuses: problems
/// of the message itself are 400 `validation_error` naming the event's field
/// (`phone_field` for the recipient, `message_text` for the text); a purpose or pause
/// refusal is a responsible-messaging denial (403, the pipeline's code); an instance
/// that no longer exists is the integration's fault (500); the rest as on the send
/// endpoint (403, 429, 502).
pub fn pbx_send_error(e: SendError, phone_field: &'static str) -> ApiError {
    let code = e.code();
    let payload = |field: &'static str, reason: String| {
        ApiError::new(400, "validation_error", format!("invalid event payload: {reason}"))
            .with_detail("field", field)
            .with_detail("reason", reason)
    };
    match e {
        SendError::Validation { field, reason } => {
            let field = match field {
                "phone" => phone_field,
                "message" | "caption" => "message_text",
                other => other,
            };
            payload(field, reason)
        }
        SendError::MissingPhone => payload(phone_field, format!("{phone_field} is required")),
        SendError::MissingMessageText => payload("message_text", "the message text is empty".into()),
        SendError::PurposeRequired => payload("message_purpose", "message_purpose is required".into()),
        SendError::InvalidInstance => ApiError::internal("the integration's instance does not exist"),
        SendError::Paused { .. } => ApiError::new(403, code, "the instance is paused for responsible-messaging review"),
        e @ SendError::PurposeNotAllowed { .. } => {
            let mut api = ApiError::from(e);
            api.status = dropshot::ErrorStatusCode::FORBIDDEN;
            api
        }
        other => ApiError::from(other),
    }
}

fn limit_error(e: ApiError, limit: i64, used: i64, resets_at: i64, retry_after_seconds: i64) -> ApiError {
    let resets = chrono::DateTime::from_timestamp_millis(resets_at).unwrap_or_default();
    e.with_detail("limit", limit)
        .with_detail("used", used)
        .with_detail("resets_at", resets.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .with_detail("retry_after_seconds", retry_after_seconds)
}

/// The exact answer of send-message for a pipeline result: status and body bytes. A
/// pure function of the result, so the answer sent and the one kept for an
/// idempotency key are the same bytes.
pub fn send_answer(result: &Result<Sent, SendError>) -> Answer {
    match result {
        Ok(sent) => {
            let body = SendMessageResponse {
                success: true,
                status: sent.status.clone(),
                message_id: sent.message_id.clone(),
                log_id: sent.log_id,
                message_type: Some(sent.message_type.clone()),
            };
            Answer { status: 200, body: serde_json::to_string(&body).unwrap_or_default() }
        }
        Err(SendError::Keyed(Decided::Replay(answer))) => answer.clone(),
        Err(e) => error_answer(&ApiError::from(e)),
    }
}

/// 422 naming the `Idempotency-Key` header (a malformed key, or a key reused with
/// another body).
pub fn key_refusal(code: &'static str, e: KeyError) -> ApiError {
    ApiError::new(422, code, e.to_string()).with_detail("field", "Idempotency-Key")
}

/// An error's answer: its status and the error body.
pub fn error_answer(e: &ApiError) -> Answer {
    Answer { status: e.status.as_u16(), body: serde_json::to_string(&e.body()).unwrap_or_default() }
}

/// The answer kept for a request whose attempt was orphaned (its process stopped while
/// the provider call was in flight): an unknown outcome, as a timeout would have been.
/// Rendered once.
pub fn orphan_answer() -> &'static Answer {
    static ORPHAN: std::sync::LazyLock<Answer> = std::sync::LazyLock::new(|| {
        let unknown = ProviderError::OutcomeUnknown(crate::store::ORPHAN_REASON.into());
        send_answer(&Err(SendError::Provider(unknown)))
    });
    &ORPHAN
}
