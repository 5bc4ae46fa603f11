//! The default pacing policy: keeps a number's sending pattern one a messaging network
//! trusts. Asked at the content stage; a denial is 403 `policy_violation`.
//!
//! Unofficial-client networks ban numbers that message many strangers, message people
//! who never answer, or go from silence to volume overnight (reports collected in
//! `../shared/reference/security.md` §8.3: 15 to 20 messages a day to contacts with no
//! prior chat brought 24-hour restrictions). The gateway's plan limits count messages;
//! this policy looks at who they go to and how old the number is. Its thresholds
//! (documented on the responsible-messaging page; change them here and rebuild):
//!
//! | rule | code | limit |
//! |---|---|---|
//! | warm-up: messages a day while the instance is younger than 7 days | `warmup_daily_limit` | [`WARMUP_DAILY`] by age in days: 50, 75, 100, 150, 200, 300, 400 |
//! | new recipients a day while younger than 7 days | `warmup_new_recipient_limit` | [`WARMUP_NEW_RECIPIENTS`]: 10, 15, 20, 30, 40, 50, 60 |
//! | new recipients a day afterwards | `new_recipient_limit` | [`NEW_RECIPIENTS_PER_DAY`] = 200 |
//! | messages in 24 h to a recipient who never replied | `unreplied_recipient_limit` | [`UNREPLIED_PER_24H`] = 10 (authentication: [`UNREPLIED_AUTH_PER_24H`] = 15) |
//!
//! A recipient who has ever written to the instance is exempt from the last rule;
//! internal-team messages are exempt from the new-recipient rules (staff numbers).

use gateway_policy::{Decision, MessageContext, Policy, Stage, export_policy};

/// Days an instance is warming up.
pub const WARMUP_DAYS: u32 = 7;
/// Messages a day during warm-up, by age in days (0 to 6).
pub const WARMUP_DAILY: [u32; WARMUP_DAYS as usize] = [50, 75, 100, 150, 200, 300, 400];
/// New recipients a day during warm-up, by age in days (0 to 6).
pub const WARMUP_NEW_RECIPIENTS: [u32; WARMUP_DAYS as usize] = [10, 15, 20, 30, 40, 50, 60];
/// New recipients a day after warm-up.
pub const NEW_RECIPIENTS_PER_DAY: u32 = 200;
/// Messages in 24 hours to a recipient who never replied.
pub const UNREPLIED_PER_24H: u32 = 10;
/// The same for authentication messages (people ask for a code again).
pub const UNREPLIED_AUTH_PER_24H: u32 = 15;

/// The pacing rules.
pub struct PacingPolicy;

impl Policy for PacingPolicy {
    fn evaluate(ctx: MessageContext) -> Decision {
        decide(&ctx)
    }
}

export_policy!(PacingPolicy, name = "pacing", stages = "content");

/// The decision for one send (plain function, tested natively).
pub fn decide(ctx: &MessageContext) -> Decision {
    if ctx.stage != Stage::Content {
        return Decision::Allow;
    }
    let c = &ctx.counters;
    let age = ctx.instance.age_days;
    let warming = age < WARMUP_DAYS;
    if warming {
        let cap = WARMUP_DAILY[age as usize];
        if c.sent_today >= cap {
            return Decision::deny(
                "warmup_daily_limit",
                format!(
                    "this number is {age} day(s) old and warming up: at most {cap} messages today (the limit rises \
                     each day for {WARMUP_DAYS} days)"
                ),
                45,
            );
        }
    }
    let is_new = c.to_recipient_total == 0 && c.replies_from_recipient == 0;
    if is_new && ctx.purpose != "internal_team" {
        let (cap, code) = if warming {
            (WARMUP_NEW_RECIPIENTS[age as usize], "warmup_new_recipient_limit")
        } else {
            (NEW_RECIPIENTS_PER_DAY, "new_recipient_limit")
        };
        if c.new_recipients_today >= cap {
            return Decision::deny(
                code,
                format!(
                    "this number already messaged {} new recipients today (limit {cap}); messaging many strangers \
                     gets numbers banned. Try again tomorrow",
                    c.new_recipients_today
                ),
                55,
            );
        }
    }
    if c.replies_from_recipient == 0 {
        let cap = if ctx.purpose == "authentication" { UNREPLIED_AUTH_PER_24H } else { UNREPLIED_PER_24H };
        if c.to_recipient_24h >= cap {
            return Decision::deny(
                "unreplied_recipient_limit",
                format!(
                    "this recipient has never replied and already got {} messages in the last 24 hours (limit {cap})",
                    c.to_recipient_24h
                ),
                50,
            );
        }
    }
    Decision::Allow
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_policy::testing;

    #[test]
    fn fixtures() {
        testing::assert_fixtures::<PacingPolicy>("fixtures.json");
    }

    #[test]
    fn warmup_limits_rise_every_day_and_end_after_seven_days() {
        assert!(WARMUP_DAILY.windows(2).all(|w| w[0] < w[1]));
        assert!(WARMUP_NEW_RECIPIENTS.windows(2).all(|w| w[0] < w[1]));
        let mut ctx = testing::text(Stage::Content, "transactional", "Order shipped");
        ctx.counters.to_recipient_total = 1;
        ctx.counters.sent_today = 10_000;
        ctx.instance.age_days = WARMUP_DAYS;
        assert_eq!(decide(&ctx), Decision::Allow);
        ctx.instance.age_days = WARMUP_DAYS - 1;
        assert!(matches!(decide(&ctx), Decision::Deny(d) if d.code == "warmup_daily_limit"));
    }
}
