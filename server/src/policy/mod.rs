//! Policy engine seam: the send pipeline asks it for a decision at two stages,
//! `purpose` (before suppression) and `content` (after it).
//!
//! The built-in engine carries the specification's purpose rule: the five allowed
//! purposes. It has no content rules; the WebAssembly policy host (its own issue)
//! implements this trait with sandboxed modules and bundles the content rules.

use gateway_api::MessagePurpose;

/// Where in the pipeline a decision is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Purpose,
    Content,
}

/// What a policy sees of a send.
#[derive(Clone, Debug)]
pub struct PolicyContext<'a> {
    pub stage: Stage,
    pub purpose: &'a str,
    pub text: Option<&'a str>,
    pub recipient: &'a str,
    pub country_code: u16,
    pub customer_id: &'a str,
    pub instance_id: &'a str,
    /// `api`, `pbx` or `dashboard`.
    pub source: &'a str,
}

/// A policy's answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    Allow,
    Deny { policy: String, code: String, reason: String, risk_score: u8 },
    Review { policy: String, reason: String, risk_score: u8 },
}

/// Decides sends.
pub trait PolicyEngine: Send + Sync + 'static {
    fn evaluate(&self, ctx: &PolicyContext<'_>) -> Decision;
}

/// Name of the built-in purpose rule, as logged.
pub const BUILTIN_PURPOSE: &str = "builtin/purpose@1.0.0";

/// The built-in rules.
#[derive(Clone, Debug, Default)]
pub struct Builtin;

impl PolicyEngine for Builtin {
    fn evaluate(&self, ctx: &PolicyContext<'_>) -> Decision {
        match ctx.stage {
            Stage::Purpose if MessagePurpose::parse(ctx.purpose).is_none() => Decision::Deny {
                policy: BUILTIN_PURPOSE.to_string(),
                code: "message_purpose_not_allowed".to_string(),
                reason: format!(
                    "{:?} is not an allowed purpose; use transactional, operational, support, internal_team or authentication",
                    ctx.purpose
                ),
                risk_score: 100,
            },
            _ => Decision::Allow,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(stage: Stage, purpose: &str) -> PolicyContext<'_> {
        PolicyContext {
            stage,
            purpose,
            text: Some("hi"),
            recipient: "+14155550123",
            country_code: 1,
            customer_id: "c",
            instance_id: "i",
            source: "api",
        }
    }

    #[test]
    fn purpose_rule_allows_the_five_and_denies_others() {
        for p in MessagePurpose::ALL {
            assert_eq!(Builtin.evaluate(&ctx(Stage::Purpose, p.as_str())), Decision::Allow);
        }
        for p in ["marketing", "political", "Transactional", ""] {
            assert!(matches!(Builtin.evaluate(&ctx(Stage::Purpose, p)), Decision::Deny { .. }), "{p}");
        }
        assert_eq!(Builtin.evaluate(&ctx(Stage::Content, "marketing")), Decision::Allow);
    }
}
