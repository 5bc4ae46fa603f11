//! Host bindings, one module per interface version the gateway supports (Zed's
//! `since_v0_x` pattern): a policy built against any listed version keeps loading
//! after the interface moves on. Each version converts the gateway's context
//! ([`Context`]) into its own record types, dropping what it does not know, and its
//! decision back into a [`Verdict`].
//!
//! To add a version: freeze `policies/wit/vX.Y.Z/`, add `mod vX_Y_Z` with its
//! `bindgen!` and conversions, list it in [`SUPPORTED`] and [`Pre`].

use gateway_policy_model::{Context, MediaKind, Source, Stage, Verdict};
use wasmtime::Store;
use wasmtime::component::{Component, Linker};

use super::sandbox::Sandbox;

/// Interface versions this gateway loads, oldest first.
pub const SUPPORTED: [&str; 1] = ["0.1.0"];

/// The export a module of interface `version` must have.
pub fn evaluator_export(version: &str) -> String {
    format!("gateway:policy/evaluator@{version}")
}

/// Interface 0.1.0 (`policies/wit/v0.1.0/policy.wit`).
pub mod v0_1_0 {
    wasmtime::component::bindgen!({
        world: "policy",
        path: "../policies/wit/v0.1.0",
    });

    use super::*;
    pub use gateway::policy::types as t;

    /// The context as this version's record.
    pub fn context(c: &Context) -> t::MessageContext {
        t::MessageContext {
            stage: match c.stage {
                Stage::Purpose => t::Stage::Purpose,
                Stage::Content => t::Stage::Content,
            },
            purpose: c.purpose.clone(),
            text: c.text.clone(),
            caption: c.caption.clone(),
            media: c.media.as_ref().map(|m| t::Media {
                kind: match m.kind {
                    MediaKind::Image => t::MediaKind::Image,
                    MediaKind::Document => t::MediaKind::Document,
                    MediaKind::Audio => t::MediaKind::Audio,
                },
                mime_type: m.mime_type.clone(),
                file_name: m.file_name.clone(),
                size_bytes: m.size_bytes,
            }),
            recipient: t::Recipient { phone: c.recipient.phone.clone(), country_code: c.recipient.country_code },
            instance: t::Instance {
                id: c.instance.id.clone(),
                name: c.instance.name.clone(),
                age_days: c.instance.age_days,
                connection_state: c.instance.connection_state.clone(),
            },
            customer: t::Customer {
                id: c.customer.id.clone(),
                plan: c.customer.plan.clone(),
                approved_purposes: c.customer.approved_purposes.clone(),
            },
            source: match c.source {
                Source::Api => t::Source::Api,
                Source::Pbx => t::Source::Pbx,
                Source::Dashboard => t::Source::Dashboard,
            },
            counters: t::Counters {
                to_recipient_24h: c.counters.to_recipient_24h,
                to_recipient_total: c.counters.to_recipient_total,
                replies_from_recipient: c.counters.replies_from_recipient,
                new_recipients_today: c.counters.new_recipients_today,
                sent_today: c.counters.sent_today,
            },
        }
    }

    /// Counters that say nothing: what a module that does not read them is given.
    pub fn zero_counters() -> t::Counters {
        t::Counters {
            to_recipient_24h: 0,
            to_recipient_total: 0,
            replies_from_recipient: 0,
            new_recipients_today: 0,
            sent_today: 0,
        }
    }

    /// This version's decision as a verdict.
    pub fn verdict(d: t::Decision) -> Verdict {
        match d {
            t::Decision::Allow => Verdict::Allow,
            t::Decision::Deny(i) => Verdict::Deny { code: i.code, reason: i.reason, risk_score: i.risk_score },
            t::Decision::Review(i) => Verdict::Review { reason: i.reason, risk_score: i.risk_score },
        }
    }
}

/// A component pre-instantiated with the bindings of its interface version.
#[derive(Clone)]
pub enum Pre {
    V0_1_0(v0_1_0::PolicyPre<Sandbox>),
}

/// A context converted once for every module of one version.
pub enum Converted {
    V0_1_0(v0_1_0::t::MessageContext),
}

impl Pre {
    /// Type-checks `component` against the bindings of `version` (an empty linker: the
    /// module gets no imports).
    pub fn new(version: &str, component: &Component, linker: &Linker<Sandbox>) -> Result<Pre, String> {
        let instance_pre = linker.instantiate_pre(component).map_err(|e| format!("{e:#}"))?;
        match version {
            "0.1.0" => v0_1_0::PolicyPre::new(instance_pre).map(Pre::V0_1_0).map_err(|e| format!("{e:#}")),
            other => Err(format!("interface {other} has no bindings in this gateway")),
        }
    }

    /// Instantiates once without calling anything: the bindings look up and type-check
    /// the exported functions on instantiation, so a changed record fails here, at
    /// load, rather than at the first evaluation.
    pub fn check(&self, store: &mut Store<Sandbox>) -> Result<(), String> {
        match self {
            Pre::V0_1_0(pre) => pre.instantiate(&mut *store).map(drop).map_err(|e| format!("{e:#}")),
        }
    }

    /// The interface version of these bindings.
    pub fn version(&self) -> &'static str {
        match self {
            Pre::V0_1_0(_) => "0.1.0",
        }
    }

    /// Converts `ctx` for this version; without `counters`, they are all zero.
    pub fn convert(&self, ctx: &Context, counters: bool) -> Converted {
        match self {
            Pre::V0_1_0(_) => {
                let mut ctx = v0_1_0::context(ctx);
                if !counters {
                    ctx.counters = v0_1_0::zero_counters();
                }
                Converted::V0_1_0(ctx)
            }
        }
    }

    /// Instantiates afresh in `store` and calls `evaluate`. An error says whether the
    /// instance was created before it happened.
    pub fn call(&self, store: &mut Store<Sandbox>, ctx: &Converted) -> Result<Verdict, (wasmtime::Error, bool)> {
        match (self, ctx) {
            (Pre::V0_1_0(pre), Converted::V0_1_0(ctx)) => {
                let policy = pre.instantiate(&mut *store).map_err(|e| (e, false))?;
                let decision =
                    policy.gateway_policy_evaluator().call_evaluate(&mut *store, ctx).map_err(|e| (e, true))?;
                Ok(v0_1_0::verdict(decision))
            }
        }
    }
}
