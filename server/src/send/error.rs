//! Why a send did not go out: the pipeline's error, its specification code, and how
//! the send counter labels it. Mapped to the wire in `answer.rs`.

use super::idempotency::Decided;
use crate::provider::ProviderError;
use crate::store::{PlanStatus, StoreError};

/// Every [`SendError::outcome`]: the send counter's series made at 0 at start.
pub const OUTCOMES: &[(&str, &str)] = &[
    ("allowed", "gateway_send_failed"),
    ("error", "internal_error"),
    ("refused", "validation_error"),
    ("refused", "missing_phone"),
    ("refused", "missing_message_text"),
    ("refused", "message_purpose_required"),
    ("refused", "revoked_api_key"),
    ("refused", "invalid_instance"),
    ("refused", "active_plan_required"),
    ("refused", "module_not_enabled"),
    ("refused", "instance_paused_for_review"),
    ("refused", "message_purpose_not_allowed"),
    ("refused", "policy_violation"),
    ("refused", "recipient_suppressed"),
    ("refused", "sending_throttled"),
    ("refused", "daily_message_limit_exceeded"),
    ("refused", "monthly_message_limit_exceeded"),
    ("refused", "idempotency_request_in_progress"),
];

/// Why a send did not go out. Mapped to the wire in `answer.rs`.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("{reason}")]
    Validation { field: &'static str, reason: String },
    #[error("phone is required")]
    MissingPhone,
    #[error("message is required for a text send")]
    MissingMessageText,
    #[error("message_purpose is required")]
    PurposeRequired,
    /// The request's API key was revoked after it was looked up (the cache's record
    /// was older than the revocation; the send's own read is not).
    #[error("the API key has been revoked")]
    KeyRevoked,
    #[error("instance not found for this customer")]
    InvalidInstance,
    #[error("the customer has no active plan")]
    ActivePlanRequired { plan_status: PlanStatus },
    #[error("the {module} module is not enabled")]
    ModuleNotEnabled { module: &'static str },
    #[error("the instance is paused for responsible-messaging review")]
    Paused { reason: Option<String> },
    #[error("{reason}")]
    PurposeNotAllowed { policy: String, rule: String, reason: String, risk_score: u8 },
    /// `action` is `block` or `review`; `rule` is the module's deny code (none for a
    /// review).
    #[error("{reason}")]
    PolicyViolation { policy: String, rule: Option<String>, reason: String, action: &'static str, risk_score: u8 },
    #[error("the recipient is suppressed")]
    Suppressed,
    #[error("sending too fast ({scope})")]
    Throttled { scope: &'static str, limit: i64, retry_after_seconds: i64 },
    #[error("daily message limit reached")]
    DailyLimit { limit: i64, used: i64, resets_at: i64, retry_after_seconds: i64 },
    #[error("monthly message limit reached")]
    MonthlyLimit { limit: i64, used: i64, resets_at: i64, retry_after_seconds: i64 },
    /// Another request with the same idempotency key is running (or took the key over).
    #[error("a request with this idempotency key is in progress")]
    IdempotencyInProgress,
    /// The request's idempotency key decided its answer before any check ran (see
    /// `idempotency::decide`): not an attempt, so nothing is written or counted.
    #[error("answered by its idempotency key")]
    Keyed(Decided),
    #[error("delivery failed: {0}")]
    Provider(#[from] ProviderError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl SendError {
    /// The specification's error code.
    pub fn code(&self) -> &'static str {
        match self {
            SendError::Validation { .. } => "validation_error",
            SendError::MissingPhone => "missing_phone",
            SendError::MissingMessageText => "missing_message_text",
            SendError::PurposeRequired => "message_purpose_required",
            SendError::KeyRevoked => "revoked_api_key",
            SendError::InvalidInstance => "invalid_instance",
            SendError::ActivePlanRequired { .. } => "active_plan_required",
            SendError::ModuleNotEnabled { .. } => "module_not_enabled",
            SendError::Paused { .. } => "instance_paused_for_review",
            SendError::PurposeNotAllowed { .. } => "message_purpose_not_allowed",
            SendError::PolicyViolation { .. } => "policy_violation",
            SendError::Suppressed => "recipient_suppressed",
            SendError::Throttled { .. } => "sending_throttled",
            SendError::DailyLimit { .. } => "daily_message_limit_exceeded",
            SendError::MonthlyLimit { .. } => "monthly_message_limit_exceeded",
            SendError::Provider(_) => "gateway_send_failed",
            SendError::IdempotencyInProgress | SendError::Keyed(Decided::InProgress) => {
                "idempotency_request_in_progress"
            }
            SendError::Keyed(Decided::Reused) => "idempotency_key_reused",
            // Never on the wire: the kept answer is (`answer::send_answer`).
            SendError::Keyed(Decided::Replay(_)) => "idempotent_replayed",
            SendError::Store(_) => "internal_error",
        }
    }

    /// The attempt's `(decision, error code)` as the send counter labels it: `allowed`
    /// when the provider was called, `error` when the store failed, else `refused`.
    pub fn outcome(&self) -> (&'static str, &'static str) {
        let decision = match self {
            SendError::Provider(_) => "allowed",
            SendError::Store(_) => "error",
            _ => "refused",
        };
        (decision, self.code())
    }

    /// Whether the answer means "try again later" with nothing sent: throttling, a
    /// quota, or a provider that proved it did not take the message. Such an answer
    /// is not kept for an idempotency key, so a retry with the key runs again.
    pub fn retry_later(&self) -> bool {
        match self {
            SendError::Throttled { .. } | SendError::DailyLimit { .. } | SendError::MonthlyLimit { .. } => true,
            SendError::Provider(p) => !p.outcome_unknown(),
            _ => false,
        }
    }

    /// The check that decided, as written to the message log.
    pub(super) fn check(&self) -> String {
        match self {
            SendError::PurposeNotAllowed { policy, .. } | SendError::PolicyViolation { policy, .. } => policy.clone(),
            SendError::Validation { .. }
            | SendError::MissingPhone
            | SendError::MissingMessageText
            | SendError::PurposeRequired => "gateway/schema".into(),
            SendError::KeyRevoked => "gateway/auth".into(),
            SendError::InvalidInstance => "gateway/instance".into(),
            SendError::ActivePlanRequired { .. } | SendError::ModuleNotEnabled { .. } => "gateway/plan".into(),
            SendError::Paused { .. } => "gateway/review".into(),
            SendError::Suppressed => "gateway/suppression".into(),
            SendError::Throttled { .. } => "gateway/velocity".into(),
            SendError::DailyLimit { .. } | SendError::MonthlyLimit { .. } => "gateway/quota".into(),
            SendError::Provider(_) => "gateway/provider".into(),
            SendError::IdempotencyInProgress | SendError::Keyed(_) => "gateway/idempotency".into(),
            SendError::Store(_) => "gateway/store".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_is_declared_for_the_metrics() {
        let (l, u, r, a) = (1, 1, 0, 1);
        let errors = [
            SendError::Validation { field: "phone", reason: "bad".into() },
            SendError::MissingPhone,
            SendError::MissingMessageText,
            SendError::PurposeRequired,
            SendError::KeyRevoked,
            SendError::InvalidInstance,
            SendError::ActivePlanRequired { plan_status: PlanStatus::None },
            SendError::ModuleNotEnabled { module: "api" },
            SendError::Paused { reason: None },
            SendError::PurposeNotAllowed { policy: "p".into(), rule: "r".into(), reason: "x".into(), risk_score: 0 },
            SendError::PolicyViolation {
                policy: "p".into(),
                rule: None,
                reason: "x".into(),
                action: "block",
                risk_score: 0,
            },
            SendError::Suppressed,
            SendError::Throttled { scope: "instance", limit: l, retry_after_seconds: a },
            SendError::DailyLimit { limit: l, used: u, resets_at: r, retry_after_seconds: a },
            SendError::MonthlyLimit { limit: l, used: u, resets_at: r, retry_after_seconds: a },
            SendError::IdempotencyInProgress,
            SendError::Provider(ProviderError::Timeout(1)),
            SendError::Store(StoreError::Conflict("x".into())),
        ];
        assert_eq!(errors.len(), OUTCOMES.len());
        for e in &errors {
            assert!(OUTCOMES.contains(&e.outcome()), "{:?} is not in OUTCOMES", e.outcome());
        }
    }
}
