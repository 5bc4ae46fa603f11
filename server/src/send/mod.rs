//! The send pipeline: every check, in its order, then the provider.
//!
//! schema (422) → instance (404) → plan and module (403) → paused (423) → purpose policy
//! (422) → suppression (403) → content policy (403) → velocity (429) → daily and monthly
//! quota (429) → provider (502). Authentication, content type and JSON come before, in
//! the HTTP layer, because they need the raw request.
//!
//! Every attempt leaves exactly one message-log row, allowed or refused, with the check
//! that decided (`policy`) and why (`reason`). An allowed send takes its velocity and
//! quota counters and writes its row as `pending` in one transaction before the
//! provider call (`Store::begin_attempt`); the provider's answer settles the row
//! (`sent`, `failed` with the counters given back, or `unknown`), through a guard that
//! settles it in the background if the store fails or the request goes away
//! (`settle`). A crash between the two leaves a pending row naming the dead process's
//! lease, which the orphan sweep makes `unknown` within seconds (`store::leases`):
//! nothing the provider may have seen is missing from the log, and nothing goes over a
//! limit.
//!
//! A request with an idempotency key takes the key in the write of its attempt row (or
//! of its refusal's row); its final answer, rendered by the caller's `render`, is kept
//! in the transaction that settles the row (see `idempotency` and `store::attempts`).

pub mod idempotency;
pub mod phone;
pub mod settle;

use crate::config::Config;
use crate::media::{self, Media};
use crate::metrics::{self, Stage};
use crate::policy::{Decision, PolicyEngine, Stage as PolicyStage, TraceEntry};
use crate::provider::{OutboundMessage, Provider, ProviderError, SendingInstance};
use crate::store::{
    Answer, Began, Begin, Customer, Finish, IdemOwner, Instance, KeyFate, LimitHit, LogEntry, OutboxEvent,
    PacingScopes, PlanStatus, Reservation, ReviewItem, SendContext, Store, StoreError, now_ms,
};
use gateway_api::{MediaType, MessagePurpose, SendMessageRequest, events};
use gateway_policy_model as model;
use phone::Phone;
use settle::{Armed, Progress, Settling};
use std::sync::Arc;

/// Longest text body accepted (the messaging network's own limit).
pub const MAX_TEXT_CHARS: usize = 4096;

const DAY_MS: i64 = 24 * 60 * 60 * 1000;
const MINUTE_MS: i64 = 60 * 1000;
const HOUR_MS: i64 = 60 * MINUTE_MS;
/// How long past the provider timeout a pending attempt is presumed orphaned (its
/// process stopped mid-call).
pub const ORPHAN_MARGIN_MS: i64 = 10_000;
/// The reason an attempt is logged with when its request went away while the provider
/// call was in flight (the handler's backstop): it may have been sent.
pub const CANCELLED_REASON: &str = "the request ended while the provider call was in flight; it may have been sent";

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

/// Why a send did not go out. Mapped to the wire in `http/error.rs`.
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
            SendError::IdempotencyInProgress => "idempotency_request_in_progress",
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
    fn check(&self) -> String {
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
            SendError::IdempotencyInProgress => "gateway/idempotency".into(),
            SendError::Store(_) => "gateway/store".into(),
        }
    }
}

/// A send as the pipeline receives it.
#[derive(Clone, Debug)]
pub struct SendInput {
    pub customer_id: String,
    pub api_key_id: Option<String>,
    /// `api`, `pbx` or `dashboard`.
    pub source: &'static str,
    pub body: SendMessageRequest,
    /// The idempotency claim this request holds, if it came with a key.
    pub idempotency: Option<Idempotency>,
    /// The request's ids, kept in the log row and passed to the provider.
    pub trace: crate::trace::Trace,
    /// Set once the attempt row is written (the handler's backstop answers by it).
    pub progress: Progress,
}

/// A request's idempotency claim and how its answer is rendered for replay (the HTTP
/// layer's function: the pipeline does not know the wire).
#[derive(Clone, Debug)]
pub struct Idempotency {
    pub owner: IdemOwner,
    pub render: fn(&Result<Sent, SendError>) -> Answer,
}

/// A send that went out.
#[derive(Clone, Debug)]
pub struct Sent {
    pub log_id: i64,
    pub message_id: String,
    pub status: String,
    pub message_type: String,
}

/// The pipeline and what it needs.
pub struct Sender {
    store: Store,
    provider: Arc<dyn Provider>,
    policy: Arc<dyn PolicyEngine>,
    config: Arc<Config>,
    /// Fetches media URLs through the SSRF guard.
    fetcher: media::Fetcher,
    /// Settles still retrying in the background (see `settle`).
    settling: Arc<Settling>,
    log: slog::Logger,
}

/// A request that passed the schema step.
struct Checked {
    instance_ref: String,
    phone: Phone,
    purpose: String,
    text: Option<String>,
    media: Option<Media>,
}

impl Checked {
    fn message_type(&self) -> &'static str {
        self.media.as_ref().map_or("text", |m| m.media_type.as_str())
    }
}

/// What the log row needs to know about the attempt, filled as the checks pass.
struct Attempt<'a> {
    input: &'a SendInput,
    instance: Option<Instance>,
    checked: Option<Checked>,
    reservations: Vec<Reservation>,
    /// Every policy module's verdict, both stages.
    trace: Vec<TraceEntry>,
    /// Set when a policy sent the message to review.
    review: Option<ReviewItem>,
    /// The pending attempt row, once written.
    log_id: Option<i64>,
    /// From the attempt row on: what is written if the request goes away first.
    armed: Option<Armed>,
}

impl Sender {
    /// A pipeline over these parts.
    pub fn new(
        store: Store,
        provider: Arc<dyn Provider>,
        policy: Arc<dyn PolicyEngine>,
        config: Arc<Config>,
        log: slog::Logger,
    ) -> Self {
        let fetcher = media::Fetcher::new(
            config.allow_loopback_targets,
            std::time::Duration::from_millis(config.media.fetch_timeout_ms),
            log.new(slog::o!("component" => "media")),
        );
        Sender { store, provider, policy, config, fetcher, settling: Arc::default(), log }
    }

    /// The settles still retrying in the background (a clean stop waits for them).
    pub fn settling(&self) -> Arc<Settling> {
        self.settling.clone()
    }

    /// Writes an attempt's outcome: through its guard (see `settle`), so that a store
    /// that fails or is slow leaves the settle to the background and never changes the
    /// answer.
    async fn settle(&self, attempt: &mut Attempt<'_>, finish: Finish) -> Result<(), SendError> {
        match attempt.armed.take() {
            Some(armed) => {
                armed.settle(finish, std::time::Duration::from_millis(self.config.database_timeout_ms)).await;
                Ok(())
            }
            None => self.store.settle_attempt(finish).await.map(|_| ()).map_err(SendError::Store),
        }
    }

    /// Runs every check, sends, and writes the attempt's log row (and event).
    pub async fn send(&self, input: &SendInput) -> Result<Sent, SendError> {
        let result = self.attempt(input).await;
        let (decision, error) = match &result {
            Ok(_) => ("allowed", ""),
            Err(e) => e.outcome(),
        };
        crate::metrics::send_outcome(decision, error);
        result
    }

    async fn attempt(&self, input: &SendInput) -> Result<Sent, SendError> {
        let mut attempt = Attempt {
            input,
            instance: None,
            checked: None,
            reservations: Vec::new(),
            trace: Vec::new(),
            review: None,
            log_id: None,
            armed: None,
        };
        let result = self.run(&mut attempt).await;
        let now = now_ms();
        // What becomes of the request's key: the answer kept, or the key given up when
        // the answer says "try again" and nothing was sent.
        let render = |result: &Result<Sent, SendError>| {
            input.idempotency.as_ref().map(|i| match result {
                Err(e) if e.retry_later() => KeyFate::Release,
                result => KeyFate::Keep((i.render)(result)),
            })
        };
        match (result, attempt.log_id) {
            (Ok(receipt), Some(log_id)) => {
                let event = self.event(&attempt, now, events::MessageSent::NAME, |base, to, message_purpose| {
                    let message_id = Some(receipt.message_id.clone());
                    serde_json::to_value(events::MessageSent { base, to, message_purpose, message_id })
                });
                let sent = Sent {
                    log_id,
                    message_id: receipt.message_id.clone(),
                    status: receipt.status,
                    message_type: attempt.checked.as_ref().map_or("text", Checked::message_type).to_string(),
                };
                let result = Ok(sent);
                let finish = Finish {
                    status: "sent".into(),
                    provider_message_id: Some(receipt.message_id.clone()),
                    event,
                    answer: render(&result),
                    ..self.finish(&attempt, log_id, now)
                };
                let t = std::time::Instant::now();
                self.settle(&mut attempt, finish).await?;
                metrics::stage(Stage::Settle, t);
                if let Some(instance) = attempt.instance.as_ref().filter(|i| i.provider == "simulator") {
                    let recipient = attempt.checked.as_ref().map(|c| c.phone.e164.clone()).unwrap_or_default();
                    self.simulate_statuses(instance, &receipt.message_id, &recipient);
                }
                result
            }
            (Err(SendError::Provider(error)), Some(log_id)) => {
                // Unknown: it may have been sent, so it keeps its quota and gets no
                // `message.failed`; the log says `unknown` until the provider's event
                // for it arrives. Failed: proven not taken, so the counters go back.
                let unknown = error.outcome_unknown();
                let event = (!unknown)
                    .then(|| {
                        self.event(&attempt, now, events::MessageFailed::NAME, |base, to, message_purpose| {
                            let error = error.code().to_string();
                            serde_json::to_value(events::MessageFailed { base, to, message_purpose, error })
                        })
                    })
                    .flatten();
                let reason = Some(error.to_string());
                let result = Err(SendError::Provider(error));
                let finish = Finish {
                    status: if unknown { "unknown" } else { "failed" }.into(),
                    error_code: Some("gateway_send_failed".into()),
                    policy: Some("gateway/provider".into()),
                    reason,
                    event,
                    release: if unknown { Vec::new() } else { attempt.reservations.clone() },
                    answer: render(&result),
                    ..self.finish(&attempt, log_id, now)
                };
                self.settle(&mut attempt, finish).await?;
                result
            }
            // Not an attempt of its own: the key's first request answers for it.
            (Err(SendError::IdempotencyInProgress), _) => Err(SendError::IdempotencyInProgress),
            // Not an attempt: the request was not authenticated after all.
            (Err(SendError::KeyRevoked), _) => Err(SendError::KeyRevoked),
            // A policy decision that did not hold against the counters the send took:
            // its row becomes a refusal and the counters go back.
            (Err(error @ (SendError::PolicyViolation { .. } | SendError::PurposeNotAllowed { .. })), Some(log_id)) => {
                let (code, check, reason) = (error.code(), error.check(), truncate(&error.to_string(), 500));
                let result = Err(error);
                let finish = Finish {
                    status: "refused".into(),
                    decision: Some("refused".into()),
                    error_code: Some(code.into()),
                    policy: Some(check),
                    reason: Some(reason),
                    release: attempt.reservations.clone(),
                    answer: render(&result),
                    ..self.finish(&attempt, log_id, now)
                };
                self.settle(&mut attempt, finish).await?;
                result
            }
            (Err(error @ SendError::Store(_)), _) => Err(error),
            (Ok(_), None) => {
                Err(SendError::Store(StoreError::Conflict("a send went out without its attempt row".into())))
            }
            (Err(error), _) => {
                let mut entry = self.entry(&attempt, now);
                entry.decision = "refused".into();
                entry.status = "refused".into();
                entry.error_code = Some(error.code().into());
                entry.policy = Some(error.check());
                entry.reason = Some(truncate(&error.to_string(), 500));
                let result = Err(error);
                let answer = input.idempotency.as_ref().zip(render(&result)).map(|(i, a)| (i.owner.clone(), a));
                let recorded = self.store.record_answered(&entry, None, attempt.review.as_ref(), answer).await?;
                if recorded.paused
                    && let Some(instance) = &attempt.instance
                {
                    slog::warn!(self.log, "instance paused for review";
                                "instance_id" => &instance.id, "customer_id" => &instance.customer_id,
                                "reviews" => self.config.policies.review_pause_threshold,
                                "window_hours" => self.config.policies.review_window_hours);
                }
                result
            }
        }
    }

    /// The log row of an attempt as far as its checks got (decision and status unset).
    fn entry(&self, a: &Attempt<'_>, now: i64) -> LogEntry {
        let input = a.input;
        LogEntry {
            customer_id: input.customer_id.clone(),
            instance_id: a.instance.as_ref().map(|i| i.id.clone()),
            api_key_id: input.api_key_id.clone(),
            source: input.source.to_string(),
            purpose: input.body.message_purpose.as_deref().map(|p| truncate(p, 64)),
            // A request refused before its number was checked (no purpose, a bad
            // instance id, ...) still logs the number in E.164 when it reads as one, so
            // that the recipient filter and erasure find it; else as given.
            recipient: match &a.checked {
                Some(c) => Some(c.phone.e164.clone()),
                None => {
                    input.body.phone.as_deref().map(|p| phone::normalize(p).map_or_else(|| truncate(p, 32), |n| n.e164))
                }
            },
            message_type: a.checked.as_ref().map(|c| c.message_type().to_string()),
            created_at: now,
            policy_trace: (!a.trace.is_empty()).then(|| serde_json::to_string(&a.trace).unwrap_or_default()),
            request_id: input.trace.request_id.clone(),
            correlation_id: input.trace.correlation_id.clone(),
            ..LogEntry::default()
        }
    }

    /// The guard of a just-written attempt row, armed with an unknown outcome: what its
    /// row becomes if the request goes away before the provider answers.
    fn arm(&self, a: &Attempt<'_>, log_id: i64, now: i64) -> Armed {
        let finish = Finish {
            status: "unknown".into(),
            error_code: Some("gateway_send_failed".into()),
            policy: Some("gateway/provider".into()),
            reason: Some(CANCELLED_REASON.into()),
            ..self.finish(a, log_id, now)
        };
        let render = a.input.idempotency.as_ref().map(|i| i.render);
        Armed::new(finish, render, self.store.clone(), self.settling.clone(), self.log.clone())
    }

    /// The parts of an attempt's `Finish` that do not depend on the outcome.
    fn finish(&self, a: &Attempt<'_>, log_id: i64, now: i64) -> Finish {
        Finish {
            log_id,
            instance_id: a.instance.as_ref().map(|i| i.id.clone()),
            recipient: a.checked.as_ref().map(|c| c.phone.e164.clone()),
            at: now,
            idem: a.input.idempotency.as_ref().map(|i| i.owner.clone()),
            ..Finish::default()
        }
    }

    /// The simulator's parity with a real network: a sent message is reported
    /// delivered after `simulator_status_delay_ms`, and read after twice that, through
    /// the same path as a provider's status events (0 turns this off).
    fn simulate_statuses(&self, instance: &Instance, message_id: &str, recipient: &str) {
        let delay = self.config.simulator_status_delay_ms;
        if delay == 0 {
            return;
        }
        let (store, instance) = (self.store.clone(), instance.clone());
        let remote = Some(format!("{}@s.whatsapp.net", recipient.trim_start_matches('+')));
        let id = message_id.to_string();
        tokio::spawn(async move {
            for status in ["DELIVERY_ACK", "READ"] {
                tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
                let fact = crate::ingress::evolution::Fact::Status {
                    external_id: id.clone(),
                    remote_jid: remote.clone(),
                    status: status.into(),
                };
                // A lost simulated status is only a missing event; nothing to retry.
                let _ = store.apply_facts(&instance, &[fact], now_ms()).await;
            }
        });
    }

    /// Logs a request refused before the pipeline could read it (content type, JSON,
    /// schema errors of the body parser).
    pub async fn record_unreadable(
        &self,
        customer_id: &str,
        api_key_id: &str,
        code: &str,
        reason: &str,
        trace: &crate::trace::Trace,
    ) -> Result<(), StoreError> {
        let entry = LogEntry {
            customer_id: customer_id.to_string(),
            api_key_id: Some(api_key_id.to_string()),
            source: "api".into(),
            decision: "refused".into(),
            status: "refused".into(),
            error_code: Some(code.to_string()),
            policy: Some("gateway/request".into()),
            reason: Some(truncate(reason, 500)),
            created_at: now_ms(),
            request_id: trace.request_id.clone(),
            correlation_id: trace.correlation_id.clone(),
            ..LogEntry::default()
        };
        self.store.record_attempt(&entry, None).await.map(|_| ())
    }

    async fn run(&self, a: &mut Attempt<'_>) -> Result<crate::provider::ProviderReceipt, SendError> {
        let t = std::time::Instant::now();
        let checked = self.check_schema(&a.input.body).await?;
        let checked = a.checked.insert(checked);
        let t = metrics::stage(Stage::Schema, t);
        let now = now_ms();
        let input = a.input;
        let SendContext { customer, instance, suppressed, counters, to_recipient_hour, key_revoked } = self
            .store
            .send_context(
                &input.customer_id,
                &checked.instance_ref,
                &checked.phone.e164,
                input.api_key_id.as_deref(),
                now,
            )
            .await?;
        let t = metrics::stage(Stage::Read, t);
        if key_revoked {
            return Err(SendError::KeyRevoked);
        }
        let instance = a.instance.insert(instance.ok_or(SendError::InvalidInstance)?);
        let plan_status = customer.plan_status(now);
        if plan_status != PlanStatus::Active {
            return Err(SendError::ActivePlanRequired { plan_status });
        }
        let module_on = match a.input.source {
            "pbx" => customer.module_pbx,
            _ => customer.module_api,
        };
        if !module_on {
            return Err(SendError::ModuleNotEnabled { module: if a.input.source == "pbx" { "pbx" } else { "api" } });
        }
        if instance.paused {
            return Err(SendError::Paused { reason: instance.paused_reason.clone() });
        }
        let mut new_recipient = counters.to_recipient_total == 0 && counters.replies_from_recipient == 0;
        let mut ctx = policy_context(a.input.source, checked, instance, &customer, counters, now);
        let purpose = self.policy.evaluate(&ctx).await;
        a.trace.extend(purpose.trace);
        match purpose.decision {
            Decision::Allow => {}
            Decision::Deny { policy, code, reason, risk_score, fault: false } => {
                return Err(SendError::PurposeNotAllowed { policy, rule: code, reason, risk_score });
            }
            decision => return Err(self.refusal(a, decision)),
        }
        // The specification's five purposes hold whatever modules are loaded (the
        // bundled purpose policy refuses the others first, with its own rule).
        if MessagePurpose::parse(&checked.purpose).is_none() {
            return Err(SendError::PurposeNotAllowed {
                policy: "gateway/purpose".into(),
                rule: "unknown_purpose".into(),
                reason: format!("{:?} is not one of the allowed purposes", checked.purpose),
                risk_score: 90,
            });
        }
        if suppressed {
            return Err(SendError::Suppressed);
        }
        ctx.stage = PolicyStage::Content;
        let content = self.policy.evaluate(&ctx).await;
        a.trace.extend(content.trace);
        if content.decision != Decision::Allow {
            return Err(self.refusal(a, content.decision));
        }
        let mut policies = t.elapsed();
        let t = std::time::Instant::now();
        let message = OutboundMessage {
            to: checked.phone.e164.clone(),
            text: checked.text.clone(),
            media: checked.media.clone(),
            request_id: a.input.trace.request_id.clone(),
        };
        let sending = SendingInstance {
            id: instance.id.clone(),
            name: instance.name.clone(),
            connection_state: instance.connection_state.clone(),
            provider: instance.provider.clone(),
        };
        let timeout = self.config.provider_timeout();
        let phone = checked.phone.e164.clone();
        let instance = instance.clone();
        // The counters and the pending row, in one write, before the provider is called.
        // A first contact is claimed in the same write: if a concurrent send to the same
        // number claimed it first, this one is not new after all, and goes again as such.
        let mut pending = self.entry(a, now);
        pending.decision = "allowed".into();
        pending.status = "pending".into();
        let seen = ctx.counters.clone();
        let (reservations, counts) = loop {
            let reservations = self.reservations(&customer, &instance, &phone, new_recipient, now);
            let begin = Begin {
                reservations: reservations.clone(),
                entry: pending.clone(),
                deadline_at: now + timeout.as_millis() as i64 + ORPHAN_MARGIN_MS,
                idem: a.input.idempotency.as_ref().map(|i| i.owner.clone()),
                owner_lease: None, // the store's own
            };
            match self.store.begin_attempt(begin).await? {
                Began::Written { log_id, counts } => {
                    a.log_id = Some(log_id);
                    let armed = self.arm(a, log_id, now);
                    a.armed = Some(armed);
                    a.input.progress.mark_begun();
                    break (reservations, counts);
                }
                Began::Limit(hit) if reservations[hit.index].scope.starts_with(PacingScopes::FIRST_CONTACT) => {
                    new_recipient = false;
                    ctx.counters.to_recipient_total = ctx.counters.to_recipient_total.max(1);
                }
                Began::Limit(hit) => return Err(limit_error(&reservations, hit, now)),
                Began::KeyLost => return Err(SendError::IdempotencyInProgress),
            }
        };
        a.reservations = reservations;
        let t = metrics::stage(Stage::Begin, t);
        // The policies decided on a snapshot; the write placed this send among all the
        // sends that took the same counters (on any replica). If other sends came in
        // between, the decision is checked again against what this send really follows,
        // so a pacing cap holds exactly as a quota does.
        let exact = exact_counters(&ctx.counters, to_recipient_hour, &a.reservations, &counts);
        if exact != seen {
            ctx.counters = exact;
            for stage in [PolicyStage::Purpose, PolicyStage::Content] {
                ctx.stage = stage;
                let outcome = self.policy.recheck(&ctx).await;
                a.trace.extend(outcome.trace);
                if outcome.decision != Decision::Allow {
                    return Err(raced(stage, outcome.decision));
                }
            }
            policies += t.elapsed();
        }
        metrics::stage_took(Stage::Policies, policies);
        let started = std::time::Instant::now();
        let result = match tokio::time::timeout(timeout, self.provider.send(&sending, &message)).await {
            Ok(Ok(receipt)) => Ok(receipt),
            Ok(Err(e)) => Err(SendError::Provider(e)),
            Err(_) => Err(SendError::Provider(ProviderError::Timeout(timeout.as_millis() as u64))),
        };
        let outcome = match &result {
            Ok(_) => "sent",
            Err(SendError::Provider(e)) if e.outcome_unknown() => "unknown",
            Err(_) => "failed",
        };
        crate::metrics::get()
            .provider_request
            .with_label_values(&[sending.provider.as_str(), outcome])
            .observe(started.elapsed().as_secs_f64());
        metrics::stage(Stage::Provider, started);
        result
    }

    /// The error of a policy refusal (a deny at the content stage, a module fault
    /// under the `deny` fail mode, or a review at either stage); a review is also
    /// queued for the operator with the attempt's log row.
    fn refusal(&self, a: &mut Attempt<'_>, decision: Decision) -> SendError {
        match decision {
            Decision::Allow => unreachable!("an allowed stage is no refusal"),
            deny @ Decision::Deny { .. } => block(deny),
            Decision::Review { policy, reason, risk_score } => {
                let threshold = self.config.policies.review_pause_threshold;
                a.review = Some(ReviewItem {
                    text: a.checked.as_ref().and_then(|c| c.text.clone()),
                    policy: policy.clone(),
                    reason: reason.clone(),
                    risk_score,
                    pause_threshold: threshold,
                    window_ms: crate::bounds::hours_ms(self.config.policies.review_window_hours.max(1)),
                    pause_reason: format!(
                        "{threshold} messages sent to review within {} hours",
                        self.config.policies.review_window_hours
                    ),
                });
                SendError::PolicyViolation { policy, rule: None, reason, action: "review", risk_score }
            }
        }
    }

    async fn check_schema(&self, body: &SendMessageRequest) -> Result<Checked, SendError> {
        let instance_ref = non_empty(&body.instance_id)
            .ok_or_else(|| validation("instance_id", "instance_id is required"))?
            .to_string();
        let raw_phone = non_empty(&body.phone).ok_or(SendError::MissingPhone)?;
        let phone = phone::normalize(raw_phone)
            .ok_or_else(|| validation("phone", "phone is not a valid number in international format"))?;
        let purpose = non_empty(&body.message_purpose).ok_or(SendError::PurposeRequired)?.to_string();
        let is_media =
            body.media_type.is_some() || body.media.is_some() || body.mime_type.is_some() || body.file_name.is_some();
        let (text, media) = if is_media {
            let media_type = non_empty(&body.media_type)
                .ok_or_else(|| validation("media_type", "media_type is required when sending media"))?;
            let media_type = MediaType::parse(media_type)
                .ok_or_else(|| validation("media_type", "media_type must be image, document or audio"))?;
            let mime_type = non_empty(&body.mime_type)
                .ok_or_else(|| validation("mime_type", "mime_type is required when sending media"))?;
            let file_name = non_empty(&body.file_name)
                .ok_or_else(|| validation("file_name", "file_name is required when sending media"))?;
            if file_name.len() > 255 || file_name.contains(['/', '\\', '\0']) {
                return Err(validation("file_name", "file_name must be a plain name of at most 255 bytes"));
            }
            let content =
                non_empty(&body.media).ok_or_else(|| validation("media", "media is required when sending media"))?;
            let media = media::validate(media_type, mime_type, file_name, content, &self.config.media, &self.fetcher)
                .await
                .map_err(|e| SendError::Validation { field: e.field, reason: e.reason })?;
            let caption = non_empty(&body.caption).or(non_empty(&body.message)).map(str::to_string);
            (caption, Some(media))
        } else {
            if body.caption.is_some() {
                return Err(validation("caption", "caption is only for media sends; use message"));
            }
            let text = non_empty(&body.message).ok_or(SendError::MissingMessageText)?.to_string();
            (Some(text), None)
        };
        if let Some(text) = &text
            && text.chars().count() > MAX_TEXT_CHARS
        {
            let field = if is_media && non_empty(&body.caption).is_some() { "caption" } else { "message" };
            return Err(validation(field, format!("text is longer than {MAX_TEXT_CHARS} characters")));
        }
        Ok(Checked { instance_ref, phone, purpose, text, media })
    }

    /// Velocity (instance, recipient) and quota (day, plan period) counters of a send,
    /// in the order they are checked.
    fn reservations(
        &self,
        customer: &Customer,
        instance: &Instance,
        to: &str,
        new_recipient: bool,
        now: i64,
    ) -> Vec<Reservation> {
        let plan = customer.plan.as_deref().and_then(|p| self.config.plan(p)).unwrap_or(&self.config.plans.starter);
        let o = &customer.overrides;
        let per_instance =
            o.instance_per_minute.or(plan.instance_per_minute).unwrap_or(self.config.limits.instance_per_minute);
        let per_recipient =
            o.recipient_per_minute.or(plan.recipient_per_minute).unwrap_or(self.config.limits.recipient_per_minute);
        let minute = now - now.rem_euclid(MINUTE_MS);
        let hour = now - now.rem_euclid(HOUR_MS);
        let day = now - now.rem_euclid(DAY_MS);
        let period_start = customer.plan_period_start.unwrap_or(day);
        let period_end = customer.plan_period_end.unwrap_or(day + DAY_MS);
        let mut reservations = vec![
            Reservation {
                scope: format!("inst:{}", instance.id),
                window_start: minute,
                expires_at: minute + 2 * MINUTE_MS,
                limit: per_instance.max(1),
            },
            Reservation {
                scope: format!("rcpt:{}:{}", instance.id, to),
                window_start: minute,
                expires_at: minute + 2 * MINUTE_MS,
                limit: per_recipient.max(1),
            },
            Reservation {
                scope: format!("day:{}", customer.id),
                window_start: day,
                expires_at: day + 2 * DAY_MS,
                limit: o.daily.unwrap_or(plan.daily_messages).max(1),
            },
            Reservation {
                scope: format!("month:{}", customer.id),
                window_start: period_start,
                expires_at: period_end + DAY_MS,
                limit: o.monthly.unwrap_or(plan.monthly_messages).max(1),
            },
            // Not limits: what the pacing policy reads (see `PacingScopes`).
            Reservation {
                scope: format!("{}{}", PacingScopes::INSTANCE_DAY, instance.id),
                window_start: day,
                expires_at: day + 2 * DAY_MS,
                limit: i64::MAX,
            },
            Reservation {
                scope: format!("{}{}:{to}", PacingScopes::RECIPIENT_HOUR, instance.id),
                window_start: hour,
                expires_at: hour + DAY_MS + HOUR_MS,
                limit: i64::MAX,
            },
        ];
        if new_recipient {
            reservations.push(Reservation {
                scope: format!("{}{}:{to}", PacingScopes::FIRST_CONTACT, instance.id),
                window_start: day,
                expires_at: day + 2 * DAY_MS,
                limit: 1,
            });
            reservations.push(Reservation {
                scope: format!("{}{}", PacingScopes::NEW_RECIPIENT_DAY, instance.id),
                window_start: day,
                expires_at: day + 2 * DAY_MS,
                limit: i64::MAX,
            });
        }
        reservations
    }

    /// The outbox event of an attempt that reached the provider: the typed body (see
    /// `gateway_api::events`) built from the base fields, recipient and purpose.
    fn event(
        &self,
        a: &Attempt<'_>,
        now: i64,
        name: &str,
        body: impl FnOnce(events::EventBase, String, String) -> serde_json::Result<serde_json::Value>,
    ) -> Option<OutboxEvent> {
        let instance = a.instance.as_ref()?;
        let checked = a.checked.as_ref()?;
        let timestamp = chrono::DateTime::from_timestamp_millis(now).unwrap_or_default();
        let timestamp = timestamp.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let base = events::EventBase {
            event: name.to_string(),
            instance_id: instance.id.clone(),
            instance_name: instance.name.clone(),
            timestamp,
        };
        let payload = body(base, checked.phone.e164.clone(), checked.purpose.clone()).ok()?;
        Some(OutboxEvent {
            customer_id: a.input.customer_id.clone(),
            instance_id: Some(instance.id.clone()),
            event_type: name.to_string(),
            payload,
            created_at: now,
        })
    }
}

/// What the policies see of a send.
fn policy_context(
    source: &str,
    checked: &Checked,
    instance: &Instance,
    customer: &Customer,
    counters: model::Counters,
    now: i64,
) -> model::Context {
    let (text, caption) = match &checked.media {
        Some(_) => (None, checked.text.clone()),
        None => (checked.text.clone(), None),
    };
    model::Context {
        stage: PolicyStage::Purpose,
        purpose: checked.purpose.clone(),
        text,
        caption,
        media: checked.media.as_ref().map(|m| model::Media {
            kind: match m.media_type {
                MediaType::Image => model::MediaKind::Image,
                MediaType::Document => model::MediaKind::Document,
                MediaType::Audio => model::MediaKind::Audio,
            },
            mime_type: m.mime_type.clone(),
            file_name: m.file_name.clone(),
            size_bytes: m.size() as u64,
        }),
        recipient: model::Recipient { phone: checked.phone.e164.clone(), country_code: checked.phone.country_code },
        instance: model::Instance {
            id: instance.id.clone(),
            name: instance.name.clone(),
            age_days: (now.saturating_sub(instance.created_at).max(0) / DAY_MS).min(u32::MAX as i64) as u32,
            connection_state: instance.connection_state.clone(),
        },
        customer: model::Customer {
            id: customer.id.clone(),
            plan: customer.plan.clone().unwrap_or_default(),
            approved_purposes: match &customer.approved_purposes {
                Some(p) => p.clone(),
                None => model::PURPOSES.iter().map(|p| p.to_string()).collect(),
            },
        },
        source: model::Source::parse(source).unwrap_or_default(),
        counters,
    }
}

/// The counters a send really follows, from the values its reservation left (its place
/// among every send that took them): what it would have seen had the sends run one
/// after another.
fn exact_counters(seen: &model::Counters, seen_hour: u32, rs: &[Reservation], counts: &[i64]) -> model::Counters {
    let before = |prefix: &str| {
        rs.iter()
            .position(|r| r.scope.starts_with(prefix))
            .and_then(|i| counts.get(i))
            .map(|c| (c - 1).clamp(0, u32::MAX as i64) as u32)
    };
    let mut exact = seen.clone();
    if let Some(n) = before(PacingScopes::INSTANCE_DAY) {
        exact.sent_today = n;
    }
    if let Some(n) = before(PacingScopes::RECIPIENT_HOUR) {
        exact.to_recipient_24h = seen.to_recipient_24h.saturating_sub(seen_hour).saturating_add(n);
    }
    if let Some(n) = before(PacingScopes::NEW_RECIPIENT_DAY) {
        exact.new_recipients_today = n;
    }
    exact
}

/// A policy decision that did not hold once the send's place was known: the refusal
/// its stage gives, except that a review becomes a block (the message was not queued
/// for review, its row being the attempt's).
fn raced(stage: PolicyStage, decision: Decision) -> SendError {
    match decision {
        Decision::Deny { policy, code, reason, risk_score, fault: false } if stage == PolicyStage::Purpose => {
            SendError::PurposeNotAllowed { policy, rule: code, reason, risk_score }
        }
        Decision::Review { policy, reason, risk_score } => {
            SendError::PolicyViolation { policy, rule: None, reason, action: "block", risk_score }
        }
        decision => block(decision),
    }
}

/// The 403 of a policy's deny.
fn block(decision: Decision) -> SendError {
    match decision {
        Decision::Deny { policy, code, reason, risk_score, .. } => {
            SendError::PolicyViolation { policy, rule: Some(code), reason, action: "block", risk_score }
        }
        _ => unreachable!("only a deny blocks"),
    }
}

fn limit_error(reservations: &[Reservation], hit: LimitHit, now: i64) -> SendError {
    let r = &reservations[hit.index];
    match hit.index {
        0 | 1 => SendError::Throttled {
            scope: if hit.index == 0 { "instance" } else { "recipient" },
            limit: r.limit,
            retry_after_seconds: ((r.window_start + MINUTE_MS - now + 999) / 1000).max(1),
        },
        2 => {
            let resets_at = r.window_start + DAY_MS;
            let retry_after_seconds = ((resets_at - now + 999) / 1000).max(1);
            SendError::DailyLimit { limit: r.limit, used: hit.used, resets_at, retry_after_seconds }
        }
        _ => {
            let resets_at = r.expires_at - DAY_MS;
            let retry_after_seconds = ((resets_at - now + 999) / 1000).max(1);
            SendError::MonthlyLimit { limit: r.limit, used: hit.used, resets_at, retry_after_seconds }
        }
    }
}

fn non_empty(field: &Option<String>) -> Option<&str> {
    field.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

fn validation(field: &'static str, reason: impl Into<String>) -> SendError {
    SendError::Validation { field, reason: reason.into() }
}

fn truncate(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_is_declared_for_the_metrics() {
        let (l, u, r, a) = (1, 1, 0, 1);
        let errors = [
            validation("phone", "bad"),
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

    /// These tests stop at the schema step; no policy is asked.
    struct Unreachable;

    #[async_trait::async_trait]
    impl PolicyEngine for Unreachable {
        async fn evaluate(&self, _: &model::Context) -> crate::policy::StageOutcome {
            unreachable!("the schema tests never reach a policy")
        }
    }

    async fn sender(dir: &tempfile::TempDir) -> Sender {
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("t.db").display());
        let store = Store::open(&url, 1, None).await.unwrap();
        let config = Arc::new(Config::default());
        let log = slog::Logger::root(slog::Discard, slog::o!());
        Sender::new(store, Arc::new(crate::provider::Simulator), Arc::new(Unreachable), config, log)
    }

    fn media_body(caption: Option<&str>, message: Option<&str>) -> SendMessageRequest {
        SendMessageRequest {
            instance_id: Some("main".into()),
            phone: Some("+14155550123".into()),
            message_purpose: Some("support".into()),
            message: message.map(str::to_string),
            caption: caption.map(str::to_string),
            media_type: Some("document".into()),
            mime_type: Some("application/pdf".into()),
            file_name: Some("a.pdf".into()),
            media: Some("JVBERi0xLjcK".into()), // "%PDF-1.7\n"
        }
    }

    #[tokio::test]
    async fn caption_overrides_message_as_the_media_caption() {
        let dir = tempfile::tempdir().unwrap();
        let s = sender(&dir).await;
        let both = s.check_schema(&media_body(Some("Invoice 42"), Some("fallback"))).await.unwrap();
        assert_eq!(both.text.as_deref(), Some("Invoice 42"));
        let message_only = s.check_schema(&media_body(None, Some("fallback"))).await.unwrap();
        assert_eq!(message_only.text.as_deref(), Some("fallback"));
        let neither = s.check_schema(&media_body(None, None)).await.unwrap();
        assert_eq!(neither.text, None);
        assert_eq!(neither.message_type(), "document");
    }

    #[tokio::test]
    async fn text_is_capped_and_caption_needs_media() {
        let dir = tempfile::tempdir().unwrap();
        let s = sender(&dir).await;
        let mut body = SendMessageRequest {
            instance_id: Some("main".into()),
            phone: Some("+14155550123".into()),
            message_purpose: Some("support".into()),
            message: Some("x".repeat(MAX_TEXT_CHARS + 1)),
            ..SendMessageRequest::default()
        };
        assert!(matches!(s.check_schema(&body).await, Err(SendError::Validation { field: "message", .. })));
        body.message = Some("x".repeat(MAX_TEXT_CHARS));
        assert!(s.check_schema(&body).await.is_ok());
        body.caption = Some("c".into());
        assert!(matches!(s.check_schema(&body).await, Err(SendError::Validation { field: "caption", .. })));
    }
}
