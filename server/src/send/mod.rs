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
//! A request with an idempotency key is decided by its key's state first (read with
//! the send's own read; see `idempotency`), takes the key in the write of its attempt
//! row (or of its refusal's row), and its final answer, rendered by the caller's
//! `render`, is kept in the transaction that settles the row (see `store::attempts`).
//!
//! Each stage is a room of its own: `schema`, `verdicts` (the policy stages), `limits`
//! (velocity and quota counters), `outcome` (the row, the event and the settle),
//! `settle` (the guard of a written attempt), `idempotency`, `error`, and `answer` (the
//! wire answers, kept for idempotency keys too).

pub mod answer;
mod error;
pub mod idempotency;
mod limits;
mod outcome;
mod schema;
pub mod settle;
mod verdicts;

pub use error::{OUTCOMES, SendError};
pub use schema::MAX_TEXT_CHARS;

use crate::config::Config;
use crate::media;
use crate::metrics::{self, Stage};
use crate::policy::{Decision, PolicyEngine, Stage as PolicyStage, TraceEntry};
use crate::provider::{OutboundMessage, Provider, ProviderError, SendingInstance};
use crate::store::{
    Answer, Began, Begin, Finish, IdemOwner, Instance, KeySnapshot, PacingScopes, PlanStatus, Reservation, ReviewItem,
    SendContext, Store, now_ms,
};
use gateway_api::{MessagePurpose, SendMessageRequest};
use limits::{exact_counters, limit_error};
use schema::Checked;
use settle::{Armed, Progress, Settling};
use std::sync::Arc;
use verdicts::{policy_context, raced};

/// How long past the provider timeout a pending attempt is presumed orphaned (its
/// process stopped mid-call).
pub const ORPHAN_MARGIN_MS: i64 = 10_000;
/// The reason an attempt is logged with when its request went away while the provider
/// call was in flight (the handler's backstop): it may have been sent.
pub const CANCELLED_REASON: &str = "the request ended while the provider call was in flight; it may have been sent";

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
    /// The key is this request's already, claimed in a write of its own (the PBX path's
    /// `Store::claim_idempotency`); else the pipeline decides by the key's state.
    pub claimed: bool,
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
    /// Where what the policies saw of each send is kept for backtests, when it is.
    inputs: Option<crate::policy::inputs::Inputs>,
    log: slog::Logger,
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
    /// What the policies were first asked with, to keep once the row is written.
    policy_input: Option<gateway_policy_model::Context>,
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
        Sender { store, provider, policy, config, fetcher, settling: Arc::default(), inputs: None, log }
    }

    /// Keeps what the policies saw of each send that reached them (for backtests).
    pub fn keep_inputs(&mut self, inputs: crate::policy::inputs::Inputs) {
        self.inputs = Some(inputs);
    }

    /// Hands the attempt's policy input over, once its row `log_id` is written.
    fn keep_input(&self, a: &mut Attempt<'_>, log_id: i64) {
        if let (Some(inputs), Some(ctx)) = (&self.inputs, a.policy_input.take()) {
            inputs.keep(log_id, ctx);
        }
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

    /// Runs every check, sends, and writes the attempt's log row (and event). A request
    /// whose idempotency key decides its answer fails with `SendError::Keyed`, having
    /// written and counted nothing.
    pub async fn send(&self, input: &SendInput) -> Result<Sent, SendError> {
        let result = self.attempt(input).await;
        let (decision, error) = match &result {
            Ok(_) => ("allowed", ""),
            Err(SendError::Keyed(_)) => return result,
            Err(e) => e.outcome(),
        };
        crate::metrics::send_outcome(decision, error);
        result
    }

    /// Fails with `SendError::Keyed` when the request's key decides its answer
    /// (`snapshot`: its state, when read already).
    async fn decide_key(&self, key: &Idempotency, snapshot: Option<KeySnapshot>) -> Result<(), SendError> {
        match idempotency::decide(&self.store, &key.owner, snapshot, answer::orphan_answer()).await? {
            Some(decided) => Err(SendError::Keyed(decided)),
            None => Ok(()),
        }
    }

    async fn run(&self, a: &mut Attempt<'_>) -> Result<crate::provider::ProviderReceipt, SendError> {
        let t = std::time::Instant::now();
        // The key decides before any check can refuse or write: with the send's own
        // read below, unless the schema check fetches media first (or refuses).
        let mut undecided = a.input.idempotency.as_ref().filter(|k| !k.claimed);
        if let Some(key) = undecided.take_if(|_| a.input.body.media.is_some()) {
            self.decide_key(key, None).await?;
        }
        let checked = match self.check_schema(&a.input.body).await {
            Ok(checked) => checked,
            Err(refused) => {
                if let Some(key) = undecided {
                    self.decide_key(key, None).await?;
                }
                return Err(refused);
            }
        };
        let checked = a.checked.insert(checked);
        let t = metrics::stage(Stage::Schema, t);
        let now = now_ms();
        let input = a.input;
        let SendContext { customer, instance, suppressed, counters, to_recipient_hour, key_revoked, key } = self
            .store
            .send_context(
                &input.customer_id,
                &checked.instance_ref,
                &checked.phone.e164,
                input.api_key_id.as_deref(),
                undecided.map(|k| k.owner.key.as_str()),
                now,
            )
            .await?;
        let t = metrics::stage(Stage::Read, t);
        if key_revoked {
            return Err(SendError::KeyRevoked);
        }
        if let Some(undecided) = undecided {
            self.decide_key(undecided, Some(key)).await?;
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
        if self.inputs.is_some() {
            a.policy_input = Some(ctx.clone());
        }
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
        let seen = ctx.counters.clone();
        let (reservations, counts) = loop {
            let reservations = self.reservations(&customer, &instance, &phone, new_recipient, now);
            // The pending row, made for each try: a second try (a first contact claimed
            // by a concurrent send) is rare, and a copy kept for it cost every send a
            // dozen allocations (BENCHMARKS.md, issue 22).
            let mut pending = self.entry(a, now);
            pending.decision = "allowed".into();
            pending.status = "pending".into();
            let begin = Begin {
                reservations: reservations.clone(),
                entry: pending,
                deadline_at: now + timeout.as_millis() as i64 + ORPHAN_MARGIN_MS,
                idem: a.input.idempotency.as_ref().map(|i| i.owner.clone()),
                owner_lease: None, // the store's own
            };
            match self.store.begin_attempt(begin).await? {
                Began::Written { log_id, counts } => {
                    a.log_id = Some(log_id);
                    self.keep_input(a, log_id);
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
}
