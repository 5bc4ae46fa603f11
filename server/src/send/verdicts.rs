//! The policy stages: what the modules see of a send, and the refusal each verdict
//! gives (a review is also queued for the operator with the attempt's row).

use super::limits::DAY_MS;
use super::schema::Checked;
use super::{Attempt, SendError, Sender};
use crate::policy::{Decision, Stage as PolicyStage};
use crate::store::{Customer, Instance, ReviewItem};
use gateway_api::MediaType;
use gateway_policy_model as model;

impl Sender {
    /// The error of a policy refusal (a deny at the content stage, a module fault
    /// under the `deny` fail mode, or a review at either stage); a review is also
    /// queued for the operator with the attempt's log row.
    pub(super) fn refusal(&self, a: &mut Attempt<'_>, decision: Decision) -> SendError {
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
}

/// What the policies see of a send.
pub(super) fn policy_context(
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

/// A policy decision that did not hold once the send's place was known: the refusal
/// its stage gives, except that a review becomes a block (the message was not queued
/// for review, its row being the attempt's).
pub(super) fn raced(stage: PolicyStage, decision: Decision) -> SendError {
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
