//! The PBX webhook: call events from a customer's phone system turned into actions.
//!
//! Check order (docs/architecture.md, Life of a PBX call): body size (413, in the HTTP layer) → integration, secret and
//! signature (401, one generic answer) → JSON (400) → event payload (400
//! `validation_error`) → PBX module (403) → rate limit (429) → action.
//!
//! The steps from JSON to module have no side effect, so they run first and the
//! admission write (`Store::pbx_admit`) then does, in the order of the checks, what
//! must be stored: remember the signature (a replay is the 401 of the auth step even
//! if the body is also bad), take the rate-limit token (only for a request that got
//! that far), and log an event whose answer is already known. One write per request,
//! batched with the others by the store's writer, and no read: the integration comes
//! from the cache, and the admission checks it is unchanged (`admission`).
//!
//! Actions that send go through the send pipeline with source `pbx` (plan, module,
//! pause, purpose, suppression, content policy, velocity, quota, provider), after the
//! optional strict conversation window, the idempotency claim of
//! `external_message_id` and, for templated messages, the cooldown.

mod admission;
pub mod auth;
pub mod template;

use crate::config::PbxSettings;
use crate::phone;
use crate::provider::ProviderError;
use crate::send::{SendError, SendInput, Sender};
use crate::store::{Claim, IdemOwner, PbxEvent, PbxIntegration, RateCheck, Store, now_ms};
use admission::{Admitted, Phase};
use gateway_api::{ApiError, ErrorBody, MessagePurpose, PbxEventType, PbxWebhookRequest, PbxWebhookResponse};
use http::HeaderMap;
use slog::{Logger, error, info, warn};
use std::net::IpAddr;
use std::time::Duration;

/// Longest `message_text` (the messaging network's limit).
const MAX_TEXT_CHARS: usize = crate::send::MAX_TEXT_CHARS;
/// Longest value of a field that goes into a template or the log.
const MAX_FIELD_CHARS: usize = 128;

/// A webhook request as the HTTP layer read it.
pub struct WebhookRequest<'a> {
    pub integration_id: &'a str,
    pub headers: &'a HeaderMap,
    pub body: &'a [u8],
    pub remote: IpAddr,
}

/// The PBX webhook over the store and the send pipeline.
pub struct Webhook<'a> {
    pub store: &'a Store,
    pub sender: &'a Sender,
    pub settings: &'a PbxSettings,
    /// How long a first request claimed by a process without a lease may still be
    /// running (a serving process always holds one; see `store::leases`).
    pub pending_wait: Duration,
    pub log: &'a Logger,
    /// The request's ids, kept in the log row of the send it makes.
    pub trace: crate::trace::Trace,
}

/// The generic answer to every authentication failure.
pub fn unauthorized() -> ApiError {
    ApiError::new(401, "invalid_pbx_webhook", "the PBX webhook request could not be authenticated")
}

fn payload_error(field: &'static str, reason: impl Into<String>) -> ApiError {
    let reason = reason.into();
    ApiError::new(400, "validation_error", format!("invalid event payload: {reason}"))
        .with_detail("field", field)
        .with_detail("reason", reason)
}

/// What the PBX events counter is labelled with, made at 0 at start: every action,
/// then every error code in the order the webhook checks (the list in docs/pbx.md).
pub const OUTCOMES: &[&str] = &[
    "received",
    "ignored",
    "message_sent",
    "cooldown",
    "outside_conversation_window",
    "payload_too_large",
    "invalid_pbx_webhook",
    "invalid_json",
    "validation_error",
    "module_not_enabled",
    "webhook_rate_limited",
    "idempotency_request_in_progress",
    "policy_violation",
    "recipient_suppressed",
    "message_purpose_not_allowed",
    "instance_paused_for_review",
    "active_plan_required",
    "sending_throttled",
    "daily_message_limit_exceeded",
    "monthly_message_limit_exceeded",
    "gateway_send_failed",
    "internal_error",
];

/// What an event asks for, decided before anything is written.
enum Plan {
    /// Answer with this action; nothing is sent.
    Respond(&'static str),
    /// Send a message.
    Send(Outgoing),
}

struct Outgoing {
    /// E.164.
    phone: String,
    phone_field: &'static str,
    text: String,
    purpose: String,
    /// A templated message (subject to the cooldown).
    templated: bool,
    external_id: Option<String>,
}

impl Webhook<'_> {
    /// Handles one authenticated-or-not request to the end.
    pub async fn handle(&self, req: &WebhookRequest<'_>) -> Result<PbxWebhookResponse, ApiError> {
        let now = now_ms();
        let mut tries = 0;
        let Admitted { integration, log, event_name, base, outgoing } = loop {
            tries += 1;
            match self.admit(req, now, tries > 1).await? {
                Phase::Done(answer) => return answer,
                Phase::Send(admitted) => break *admitted,
                Phase::Stale if tries < admission::TRIES => {}
                Phase::Stale => return Err(admission::changed_meanwhile()),
            }
        };
        let (claim, attempt_key) = match &outgoing.external_id {
            None => (None, None),
            Some(external) => {
                let pending = PbxEvent {
                    action: "pending".into(),
                    phone: Some(outgoing.phone.clone()),
                    external_message_id: Some(external.clone()),
                    ..base.clone()
                };
                let row_id = self.claim_external_id(&pending, &event_name, &outgoing, &log).await?;
                let row_id = match row_id {
                    Ok(row_id) => row_id,
                    Err(answer) => return answer,
                };
                // The attempt's key: how a repeat finds whether a crashed first request
                // reached the provider (see `repeat`).
                let key = attempt_key(&integration, external);
                let claimed = self.store.claim_idempotency(&key, now).await?;
                (Some(row_id), (claimed == Claim::Claimed).then_some(key))
            }
        };
        let result = self.send(&integration, &event_name, &outgoing, attempt_key, now, &log).await;
        let result = result.map(|(action, message_id)| processed(&event_name, action, message_id));
        let row = PbxEvent {
            phone: Some(outgoing.phone.clone()),
            external_message_id: outgoing.external_id.clone(),
            ..outcome_row(&base, result.as_ref().map_or("refused", |r| r.action.as_str()), result.as_ref())
        };
        match claim {
            // An unexpected failure is not the event's answer: a repeat may try again.
            Some(row_id) if matches!(&result, Err(e) if e.status.as_u16() == 500) => {
                self.store.release_pbx_event(row_id).await?;
            }
            Some(row_id) => self.store.finish_pbx_event(row_id, &row).await?,
            None => {
                self.store.insert_pbx_event(&row).await?;
            }
        }
        match &result {
            Ok(r) => info!(log, "pbx event"; "event_type" => &event_name, "action" => &r.action,
                           "message_id" => r.message_id.as_deref().unwrap_or("")),
            Err(e) if e.status.as_u16() >= 500 => error!(log, "pbx event failed"; "event_type" => &event_name,
                "error" => e.code, "internal" => e.internal.as_deref().unwrap_or("")),
            Err(e) => info!(log, "pbx event refused"; "event_type" => &event_name, "error" => e.code),
        }
        result
    }

    /// Validates the event and decides what it asks for (payload 400, module 403).
    async fn plan(&self, integration: &PbxIntegration, r: &PbxWebhookRequest) -> Result<Plan, ApiError> {
        // Exactly one of the contract's names (not trimmed: " test " is not `test`).
        let name = r.event_type.as_deref().filter(|s| !s.is_empty());
        let name = name.ok_or_else(|| payload_error("event_type", "event_type is required"))?;
        let event = PbxEventType::parse(name).ok_or_else(|| {
            let all: Vec<&str> = PbxEventType::ALL.iter().map(|e| e.as_str()).collect();
            payload_error("event_type", format!("event_type must be one of {}", all.join(", ")))
        })?;
        for (field, value) in [
            ("agent_extension", &r.agent_extension),
            ("queue", &r.queue),
            ("call_time", &r.call_time),
            ("conversation_id", &r.conversation_id),
            ("external_message_id", &r.external_message_id),
        ] {
            if value.as_ref().is_some_and(|v| v.chars().count() > MAX_FIELD_CHARS) {
                return Err(payload_error(field, format!("{field} is longer than {MAX_FIELD_CHARS} characters")));
            }
        }
        // A purpose, when given, is one of the contract's, whatever the event type.
        let purpose = match r.message_purpose.as_deref() {
            None => MessagePurpose::Support,
            Some(p) => MessagePurpose::parse(p).ok_or_else(|| {
                let all: Vec<&str> = MessagePurpose::ALL.iter().map(|p| p.as_str()).collect();
                payload_error("message_purpose", format!("message_purpose must be one of {}", all.join(", ")))
            })?,
        };
        let external_id = r.external_message_id.as_deref().map(str::trim).filter(|s| !s.is_empty()).map(String::from);
        let plan = match event {
            PbxEventType::Test => Plan::Respond("received"),
            PbxEventType::OutboundMessage => {
                let to = required_phone("to", &r.to)?;
                let text = r.message_text.as_deref().filter(|t| !t.trim().is_empty());
                let text = text.ok_or_else(|| payload_error("message_text", "message_text is required"))?;
                if text.chars().count() > MAX_TEXT_CHARS {
                    return Err(payload_error("message_text", format!("longer than {MAX_TEXT_CHARS} characters")));
                }
                Plan::Send(Outgoing {
                    phone: to,
                    phone_field: "to",
                    text: text.to_string(),
                    purpose: purpose.as_str().to_string(),
                    templated: false,
                    external_id,
                })
            }
            _ => {
                // A caller's number, when given, is a number, template or not.
                if r.customer_phone.as_deref().is_some_and(|p| !p.is_empty()) {
                    required_phone("customer_phone", &r.customer_phone)?;
                }
                match self.store.pbx_template(integration.id, event.as_str()).await? {
                    None => Plan::Respond("ignored"),
                    Some(t) => {
                        let phone = required_phone("customer_phone", &r.customer_phone)?;
                        let values = template::Values {
                            customer_phone: Some(&phone),
                            agent_extension: r.agent_extension.as_deref(),
                            queue: r.queue.as_deref(),
                            call_time: r.call_time.as_deref(),
                            business_name: integration.business_name.as_deref(),
                        };
                        let text = template::render(&t.body, &values);
                        Plan::Send(Outgoing {
                            phone,
                            phone_field: "customer_phone",
                            text,
                            purpose: t.purpose,
                            templated: true,
                            external_id,
                        })
                    }
                }
            }
        };
        if !integration.module_pbx {
            return Err(
                ApiError::new(403, "module_not_enabled", "the pbx module is not enabled").with_detail("module", "pbx")
            );
        }
        Ok(plan)
    }

    fn rate_check(&self, integration: &PbxIntegration) -> RateCheck {
        // Clamped as a second guard: a value stored before its range existed cannot
        // turn the limiter off (an interval of 0) or make the burst unbounded.
        let (rate, most) = (&crate::bounds::PBX_RATE_PER_MINUTE, &crate::bounds::PBX_BURST);
        let per_minute =
            integration.rate_per_minute.unwrap_or(self.settings.rate_per_minute).clamp(*rate.start(), *rate.end());
        let burst = integration.burst.unwrap_or(self.settings.burst).clamp(*most.start(), *most.end());
        let interval_ms = 60_000 / per_minute;
        RateCheck {
            key: format!("pbx:{}", integration.id),
            interval_ms,
            tolerance_ms: interval_ms.saturating_mul(burst - 1),
        }
    }

    /// Claims an `external_message_id` for this request: `Ok(Ok(row))`, or the answer
    /// of the first request with it (`Ok(Err(answer))`). A first request orphaned
    /// before it reached the provider is cleared once, and the id claimed again.
    async fn claim_external_id(
        &self,
        pending: &PbxEvent,
        event_name: &str,
        outgoing: &Outgoing,
        log: &Logger,
    ) -> Result<Result<i64, Result<PbxWebhookResponse, ApiError>>, ApiError> {
        for _ in 0..2 {
            match self.store.claim_pbx_external_id(pending).await? {
                Ok(row_id) => return Ok(Ok(row_id)),
                Err(first) => {
                    info!(log, "pbx event repeated"; "event_type" => event_name, "first_event" => first.id);
                    match self.repeat(first, outgoing.phone_field).await? {
                        Repeat::Answer(answer) => return Ok(Err(answer)),
                        Repeat::Cleared => continue,
                    }
                }
            }
        }
        Err(ApiError::internal("the external_message_id could not be claimed"))
    }

    /// Window, cooldown and the send pipeline; the action and the message id.
    async fn send(
        &self,
        integration: &PbxIntegration,
        event: &str,
        out: &Outgoing,
        attempt_key: Option<IdemOwner>,
        now: i64,
        log: &Logger,
    ) -> Result<(&'static str, Option<String>), ApiError> {
        if let Some(hours) = integration.strict_window_hours.filter(|h| *h > 0) {
            let last = self.store.last_inbound_at(&integration.instance_id, &out.phone).await?;
            if last.is_none_or(|at| at < now.saturating_sub(crate::bounds::hours_ms(hours))) {
                return Ok(("outside_conversation_window", None));
            }
        }
        // Saturating: a huge stored cooldown means "not again", never a wrap to "off".
        let cooldown_seconds =
            integration.cooldown_seconds.unwrap_or(self.settings.cooldown_minutes.saturating_mul(60)).max(0);
        let cooldown_ms = cooldown_seconds.saturating_mul(1000);
        let cooldown_until = now.saturating_add(cooldown_ms);
        let cooling = out.templated && cooldown_ms > 0;
        if cooling && !self.store.claim_pbx_cooldown(integration.id, event, &out.phone, now, cooldown_until).await? {
            return Ok(("cooldown", None));
        }
        let input = SendInput {
            customer_id: integration.customer_id.clone(),
            api_key_id: None,
            source: "pbx",
            body: gateway_api::SendMessageRequest {
                instance_id: Some(integration.instance_id.clone()),
                phone: Some(out.phone.clone()),
                message_purpose: Some(out.purpose.clone()),
                message: Some(out.text.clone()),
                ..Default::default()
            },
            idempotency: attempt_key.map(|owner| crate::send::Idempotency {
                owner,
                render: crate::send::answer::send_answer,
                claimed: true,
            }),
            trace: self.trace.clone(),
            progress: Default::default(),
        };
        match self.sender.send(&input).await {
            Ok(sent) => Ok(("message_sent", Some(sent.message_id))),
            Err(e) => {
                // A message that may have gone out keeps its cooldown.
                let maybe_sent = matches!(&e, crate::send::SendError::Provider(p) if p.outcome_unknown());
                if cooling
                    && !maybe_sent
                    && let Err(release) =
                        self.store.release_pbx_cooldown(integration.id, event, &out.phone, cooldown_until).await
                {
                    warn!(log, "ending a cooldown after a failed send failed"; "error" => %release);
                }
                Err(crate::send::answer::pbx_send_error(e, out.phone_field))
            }
        }
    }

    /// The answer of the first request with this `external_message_id`, at once: its
    /// stored answer when it has one; 409 `idempotency_request_in_progress` (with
    /// `Retry-After`, as send-message) while its process is alive; and when its process
    /// stopped (its lease lapsed: see `store::leases`), the orphan resolved with its
    /// attempt. If the attempt reached the provider, the answer is an unknown outcome
    /// (502 `provider_outcome_unknown`, kept for later repeats); if it never got there,
    /// nothing was sent and the id is cleared for this request to run. No repeat ever
    /// waits on the first request.
    async fn repeat(&self, first: PbxEvent, phone_field: &'static str) -> Result<Repeat, ApiError> {
        if first.status_code == 0 {
            let orphaned = match first.owner_lease {
                Some(lease) => self.store.lease() != Some(lease) && !self.store.lease_alive(lease).await?,
                // Claimed by a process without a lease: the clock rule.
                None => {
                    now_ms() - first.created_at > self.pending_wait.as_millis() as i64 + crate::send::ORPHAN_MARGIN_MS
                }
            };
            if orphaned {
                return self.resolve_orphan(&first, phone_field).await;
            }
            let e = crate::send::answer::pbx_send_error(SendError::IdempotencyInProgress, phone_field);
            return Ok(Repeat::Answer(Err(e)));
        }
        let stored = first.response.as_deref().unwrap_or("{}");
        Ok(Repeat::Answer(if first.status_code == 200 {
            serde_json::from_str(stored).map_err(|e| ApiError::internal(format!("stored PBX answer: {e}")))
        } else {
            let body: ErrorBody =
                serde_json::from_str(stored).map_err(|e| ApiError::internal(format!("stored PBX answer: {e}")))?;
            Err(ApiError::from_stored(first.status_code as u16, body))
        }))
    }

    /// Settles a PBX event whose request's process stopped (see `repeat`).
    async fn resolve_orphan(&self, event: &PbxEvent, phone_field: &'static str) -> Result<Repeat, ApiError> {
        let external = event.external_message_id.clone().unwrap_or_default();
        let key = format!("pbx:{}:{external}", event.integration_id);
        let attempt = self.store.idempotency_attempt(&event.customer_id, &key).await?;
        if attempt.is_none() {
            warn!(self.log, "pbx event orphaned before its send; running it again"; "first_event" => event.id);
            self.store.release_pbx_event(event.id).await?;
            self.store.release_idempotency(&event.customer_id, &key).await?;
            return Ok(Repeat::Cleared);
        }
        warn!(self.log, "pbx event orphaned at the provider; its outcome is unknown"; "first_event" => event.id);
        self.store.sweep_orphans(now_ms(), crate::send::answer::orphan_answer()).await?;
        let unknown = ProviderError::OutcomeUnknown(crate::store::ORPHAN_REASON.into());
        let e = crate::send::answer::pbx_send_error(SendError::Provider(unknown), phone_field);
        let row = PbxEvent { external_message_id: Some(external), ..outcome_row(event, "refused", Err(&e)) };
        self.store.finish_pbx_event(event.id, &row).await?;
        Ok(Repeat::Answer(Err(e)))
    }
}

/// What a repeat of an `external_message_id` found.
enum Repeat {
    /// The first request's answer.
    Answer(Result<PbxWebhookResponse, ApiError>),
    /// The first request is gone and sent nothing: claim the id again.
    Cleared,
}

/// The idempotency key of the send an `external_message_id` causes.
fn attempt_key(integration: &PbxIntegration, external: &str) -> IdemOwner {
    IdemOwner {
        customer_id: integration.customer_id.clone(),
        key: format!("pbx:{}:{external}", integration.id),
        owner: crate::store::new_id("req"),
        request_hash: "pbx".into(),
    }
}

/// A validated phone or the payload error naming `field`.
fn required_phone(field: &'static str, value: &Option<String>) -> Result<String, ApiError> {
    let raw = value.as_deref().map(str::trim).filter(|s| !s.is_empty());
    let raw = raw.ok_or_else(|| payload_error(field, format!("{field} is required for this event")))?;
    phone::normalize(raw)
        .map(|p| p.e164)
        .ok_or_else(|| payload_error(field, format!("{field} is not a valid number in international format")))
}

/// The body parser answers a wrong field type with 422; the PBX contract says 400.
fn as_payload_error(e: ApiError) -> ApiError {
    if e.status.as_u16() == 422 { ApiError { status: dropshot::ErrorStatusCode::BAD_REQUEST, ..e } } else { e }
}

/// The log row of an answered event.
/// The answer to an event that was processed.
fn processed(event_name: &str, action: &str, message_id: Option<String>) -> PbxWebhookResponse {
    PbxWebhookResponse {
        success: true,
        status: "processed".into(),
        event_type: event_name.to_string(),
        action: action.into(),
        message_id,
    }
}

fn outcome_row(base: &PbxEvent, action: &str, result: Result<&PbxWebhookResponse, &ApiError>) -> PbxEvent {
    match result {
        Ok(r) => PbxEvent {
            action: action.to_string(),
            status_code: 200,
            message_id: r.message_id.clone(),
            response: serde_json::to_string(r).ok(),
            ..base.clone()
        },
        Err(e) => PbxEvent {
            action: "refused".into(),
            status_code: i64::from(e.status.as_u16()),
            error_code: Some(e.code.to_string()),
            response: serde_json::to_string(&e.body()).ok(),
            ..base.clone()
        },
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the bytes, the PBX body parser answers with the webhook's statuses:
        /// a request, or 400 (`invalid_json`, or `validation_error` naming a field);
        /// never the send endpoint's 422.
        #[test]
        fn any_bytes_get_a_400_or_a_request(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Err(e) = gateway_api::parse_json::<PbxWebhookRequest>(&bytes).map_err(as_payload_error) {
                prop_assert_eq!(e.status.as_u16(), 400);
                prop_assert!(matches!(e.code, "invalid_json" | "validation_error"), "{:?}", e);
            }
        }

        /// A phone system's extra properties never make a known event invalid.
        #[test]
        fn extra_properties_are_ignored(name in "[a-z]{1,12}_x", value in ".{0,20}") {
            let body = serde_json::json!({"event_type": "test", name: value}).to_string();
            let parsed = gateway_api::parse_json::<PbxWebhookRequest>(body.as_bytes()).unwrap();
            prop_assert_eq!(parsed.event_type.as_deref(), Some("test"));
        }
    }

    #[test]
    fn templates_render_into_the_payload_of_every_templatable_event() {
        for event in PbxEventType::ALL {
            assert_eq!(event.is_templatable(), !matches!(event, PbxEventType::Test | PbxEventType::OutboundMessage));
            assert_eq!(PbxEventType::parse(event.as_str()), Some(event));
        }
        assert_eq!(PbxEventType::parse("Missed_Call"), None);
    }
}
