//! The outcome of an attempt: the row it leaves (an allowed send's settle, a refusal's
//! row), the event it emits, the guard armed once its row is written, and the
//! simulator's status reports.

use super::error::SendError;
use super::schema::{Checked, truncate};
use super::settle::Armed;
use super::{Attempt, CANCELLED_REASON, SendInput, Sender, Sent};
use crate::metrics::{self, Stage};
use crate::phone;
use crate::store::{Finish, Instance, KeyFate, LogEntry, OutboxEvent, StoreError, now_ms};
use gateway_api::events;

impl Sender {
    pub(super) async fn attempt(&self, input: &SendInput) -> Result<Sent, SendError> {
        let mut attempt = Attempt {
            input,
            instance: None,
            checked: None,
            reservations: Vec::new(),
            trace: Vec::new(),
            review: None,
            log_id: None,
            armed: None,
            policy_input: None,
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
                    serde_json::to_string(&events::MessageSent { base, to, message_purpose, message_id })
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
                            serde_json::to_string(&events::MessageFailed { base, to, message_purpose, error })
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
            // Answered by the request's key before any check: not an attempt either.
            (Err(error @ SendError::Keyed(_)), _) => Err(error),
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
                self.keep_input(&mut attempt, recorded.log_id);
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
    pub(super) fn entry(&self, a: &Attempt<'_>, now: i64) -> LogEntry {
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
    pub(super) fn arm(&self, a: &Attempt<'_>, log_id: i64, now: i64) -> Armed {
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

    /// The outbox event of an attempt that reached the provider: the typed body (see
    /// `gateway_api::events`) built from the base fields, recipient and purpose.
    fn event(
        &self,
        a: &Attempt<'_>,
        now: i64,
        name: &str,
        body: impl FnOnce(events::EventBase, String, String) -> serde_json::Result<String>,
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
