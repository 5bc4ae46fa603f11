//! The one place where internal errors become wire errors: status, the
//! specification's code, an external message, and `details`. Internal detail (database
//! errors, provider messages) goes to the log, never to the caller.

use crate::send::SendError;
use crate::store::StoreError;
use gateway_api::ApiError;

impl From<SendError> for ApiError {
    fn from(e: SendError) -> ApiError {
        let code = e.code();
        match e {
            SendError::Validation { field, reason } => ApiError::new(422, code, reason).with_detail("field", field),
            SendError::MissingPhone => ApiError::new(422, code, "phone is required").with_detail("field", "phone"),
            SendError::MissingMessageText => {
                ApiError::new(422, code, "message is required for a text send").with_detail("field", "message")
            }
            SendError::PurposeRequired => {
                ApiError::new(422, code, "message_purpose is required").with_detail("field", "message_purpose")
            }
            SendError::InvalidInstance => ApiError::new(404, code, "instance not found for this customer"),
            SendError::ActivePlanRequired { plan_status } => {
                ApiError::new(403, code, "an active plan is required to send")
                    .with_detail("plan_status", plan_status.as_str())
            }
            SendError::ModuleNotEnabled { module } => {
                ApiError::new(403, code, format!("the {module} module is not enabled")).with_detail("module", module)
            }
            SendError::Paused { .. } => {
                ApiError::new(423, code, "the instance is paused for responsible-messaging review")
            }
            SendError::PurposeNotAllowed { policy, rule, reason, risk_score } => {
                ApiError::new(422, code, reason.clone())
                    .with_detail("risk_score", risk_score)
                    .with_detail("field", "message_purpose")
                    .with_detail("policy", policy)
                    .with_detail("rule", rule)
                    .with_detail("reason", reason)
                    .with_detail("action", "block")
            }
            SendError::PolicyViolation { policy, rule, reason, action, risk_score } => {
                let message = match action {
                    "review" => "the message was held for a responsible-messaging review and not sent",
                    _ => "the message was refused by a responsible-messaging policy",
                };
                let e = ApiError::new(403, code, message)
                    .with_detail("policy", policy)
                    .with_detail("reason", reason)
                    .with_detail("action", action)
                    .with_detail("risk_score", risk_score);
                match rule {
                    Some(rule) => e.with_detail("rule", rule),
                    None => e,
                }
            }
            SendError::Suppressed => ApiError::new(403, code, "the recipient has opted out or is suppressed"),
            SendError::Throttled { scope, limit, retry_after_seconds } => {
                ApiError::new(429, code, format!("too many sends a minute for this {scope}"))
                    .with_detail("scope", scope)
                    .with_detail("limit", limit)
                    .with_detail("retry_after_seconds", retry_after_seconds)
            }
            SendError::DailyLimit { limit, used, resets_at } => {
                limit_error(ApiError::new(429, code, "the daily message limit is reached"), limit, used, resets_at)
            }
            SendError::MonthlyLimit { limit, used, resets_at } => {
                limit_error(ApiError::new(429, code, "the monthly message limit is reached"), limit, used, resets_at)
            }
            SendError::Provider(p) => ApiError::new(502, code, "the message could not be delivered")
                .with_detail("reason", p.code())
                .with_internal(p.to_string()),
            SendError::Store(s) => s.into(),
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

fn limit_error(e: ApiError, limit: i64, used: i64, resets_at: i64) -> ApiError {
    let resets = chrono::DateTime::from_timestamp_millis(resets_at).unwrap_or_default();
    let now = chrono::Utc::now();
    e.with_detail("limit", limit)
        .with_detail("used", used)
        .with_detail("resets_at", resets.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .with_detail("retry_after_seconds", (resets - now).num_seconds().max(1))
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        ApiError::internal(e.to_string())
    }
}
