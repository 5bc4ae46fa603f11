//! A webhook request up to its admission: the integration, its secret and signature
//! (401), the event (400), the module (403), then the admission write (replay, rate
//! limit, and the log row of an event that sends nothing).
//!
//! The integration is taken from the cache when this process read it within
//! `cache::TTL`, so a burst of events costs no read each. That is safe because nothing
//! before the admission writes, and the admission writes only if the integration is
//! still as the request was checked against (`PbxAdmit::used`): otherwise it answers
//! `Stale` and the request is checked again from the start against the integration
//! read anew. A request that a cached integration refuses at authentication is also
//! checked again against a fresh read before it is refused, so a new secret works at
//! once. A rotated secret, a changed allowlist or setting, or the PBX module turned off
//! thus holds for the first request admitted after the command returned, on every
//! replica.

use super::auth::{self, AuthFailure};
use super::{Outgoing, Plan, Webhook, WebhookRequest, as_payload_error, outcome_row, processed, unauthorized};
use crate::store::{Admission, PbxAdmit, PbxEvent, PbxIntegration};
use gateway_api::{ApiError, PbxWebhookRequest, PbxWebhookResponse};
use slog::{Logger, debug, info, warn};
use std::sync::Arc;

/// How often a request is checked again when its integration changed meanwhile
/// (each time against a fresh read) before it is answered 503.
pub(super) const TRIES: u32 = 3;

/// What the admission decided.
pub(super) enum Phase {
    /// The integration changed since it was read; nothing was written.
    Stale,
    /// The request's answer.
    Done(Result<PbxWebhookResponse, ApiError>),
    /// Admitted, with a message to send.
    Send(Box<Admitted>),
}

/// An admitted event that sends.
pub(super) struct Admitted {
    pub integration: Arc<PbxIntegration>,
    pub log: Logger,
    pub event_name: String,
    /// The event's log row as far as it is known.
    pub base: PbxEvent,
    pub outgoing: Outgoing,
}

/// The answer when the integration kept changing while a request was checked.
pub(super) fn changed_meanwhile() -> ApiError {
    ApiError::new(503, "service_unavailable", "the PBX integration changed while the request was checked")
        .with_detail("retry_after_seconds", 1)
}

/// The integration a request was checked against, and its verified signature.
struct Checked {
    integration: Arc<PbxIntegration>,
    signature: Option<(String, i64)>,
}

impl Webhook<'_> {
    /// Checks the request and writes its admission; `fresh` reads the integration
    /// instead of taking it from the cache.
    pub(super) async fn admit(&self, req: &WebhookRequest<'_>, now: i64, fresh: bool) -> Result<Phase, ApiError> {
        let Checked { integration, signature } = match self.authenticate(req, now, fresh).await? {
            Ok(checked) => checked,
            Err((_, true)) => return Ok(Phase::Stale),
            Err((cause, false)) => return Ok(Phase::Done(Err(self.refuse(req, cause)))),
        };
        let log = self.log.new(slog::o!("integration_id" => integration.id,
                                         "customer_id" => integration.customer_id.clone()));
        let parsed = gateway_api::parse_json::<PbxWebhookRequest>(req.body).map_err(as_payload_error);
        let event_name: String = match &parsed {
            Ok(r) => r.event_type.as_deref().map_or("(missing)", |t| t).chars().take(40).collect(),
            Err(_) => "(unreadable)".to_string(),
        };
        let planned = match parsed {
            Ok(request) => self.plan(&integration, &request).await,
            Err(e) => Err(e),
        };
        let base = PbxEvent {
            integration_id: integration.id,
            customer_id: integration.customer_id.clone(),
            event_type: event_name.clone(),
            created_at: now,
            ..PbxEvent::default()
        };
        let mut admit = PbxAdmit {
            used: integration.clone(),
            signature: signature.as_ref().map(|(s, _)| s.clone()),
            signature_ts: signature.as_ref().map_or(0, |(_, ts)| *ts),
            rate: None,
            log: None,
        };
        let plan = match planned {
            Err(e) => {
                admit.log = Some(outcome_row(&base, "refused", Err(&e)));
                return Ok(match self.store.pbx_admit(admit).await? {
                    Admission::Stale => Phase::Stale,
                    Admission::Replayed => Phase::Done(Err(self.refuse(req, AuthFailure::ReplayedSignature))),
                    Admission::Admitted { .. } => {
                        info!(log, "pbx event refused"; "event_type" => &event_name, "error" => e.code);
                        Phase::Done(Err(e))
                    }
                });
            }
            Ok(plan) => plan,
        };
        admit.rate = Some(self.rate_check(&integration));
        if let Plan::Respond(action) = &plan {
            admit.log = Some(outcome_row(&base, action, Ok(&processed(&event_name, action, None))));
        }
        match self.store.pbx_admit(admit).await? {
            Admission::Stale => return Ok(Phase::Stale),
            Admission::Replayed => return Ok(Phase::Done(Err(self.refuse(req, AuthFailure::ReplayedSignature)))),
            Admission::Admitted { rate_limited_for_ms: Some(ms), .. } => {
                let retry_after_seconds = (ms.max(1) + 999) / 1000;
                info!(log, "pbx event rate limited"; "event_type" => &event_name, "retry_after_seconds" => retry_after_seconds);
                return Ok(Phase::Done(Err(ApiError::new(
                    429,
                    "webhook_rate_limited",
                    "too many PBX webhook requests",
                )
                .with_detail("retry_after_seconds", retry_after_seconds))));
            }
            Admission::Admitted { .. } => {}
        }
        match plan {
            Plan::Respond(action) => {
                // The event's row in pbx_events is its record; Dropshot logs the request.
                debug!(log, "pbx event"; "event_type" => &event_name, "action" => action);
                Ok(Phase::Done(Ok(processed(&event_name, action, None))))
            }
            Plan::Send(outgoing) => {
                Ok(Phase::Send(Box::new(Admitted { integration, log, event_name, base, outgoing })))
            }
        }
    }

    /// The integration and, with HMAC on, the verified signature and its timestamp; or
    /// why not, and whether the integration that refused came from the cache.
    async fn authenticate(
        &self,
        req: &WebhookRequest<'_>,
        now: i64,
        fresh: bool,
    ) -> Result<Result<Checked, (AuthFailure, bool)>, ApiError> {
        let id = req.integration_id;
        if id.is_empty() || id.len() > 18 || !id.bytes().all(|b| b.is_ascii_digit()) {
            return Ok(Err((AuthFailure::MalformedId, false)));
        }
        let id: i64 = id.parse().map_err(|_| ApiError::internal("digits that do not parse"))?;
        let Some((integration, from_cache)) = self.store.pbx_integration_for_webhook(id, fresh).await? else {
            return Ok(Err((AuthFailure::UnknownIntegration, false)));
        };
        let refused = |cause| Ok(Err((cause, from_cache)));
        if !auth::allowed(integration.ip_allowlist.as_deref(), req.remote) {
            return refused(AuthFailure::AddressNotAllowed);
        }
        if let Err(cause) = auth::check_secret(req.headers, &integration.secret_hash) {
            return refused(cause);
        }
        let signature = match &integration.hmac_secret {
            None => None,
            Some(key) => match auth::check_signature(req.headers, key, req.body, now.div_euclid(1000)) {
                Ok(signature) => Some(signature),
                Err(cause) => return refused(cause),
            },
        };
        Ok(Ok(Checked { integration, signature }))
    }

    /// Logs why (the caller only learns that it failed) and answers the generic 401.
    fn refuse(&self, req: &WebhookRequest<'_>, cause: AuthFailure) -> ApiError {
        let id: String = req.integration_id.chars().take(24).collect();
        warn!(self.log, "pbx webhook not authenticated"; "cause" => cause.as_str(), "integration_id" => id,
              "remote" => %req.remote);
        unauthorized()
    }
}
