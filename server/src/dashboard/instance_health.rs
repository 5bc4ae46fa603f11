//! The ban-risk signals of an instance, in one card: over the last 7 days its reply
//! rate, refusal rate, share of new recipients and messages to people who never
//! replied; its warm-up day; and today's headroom under the pacing policy's caps (the
//! caps of `docs/responsible-messaging.md`, which the bundled pacing module applies).
//! Each signal is a meter that turns to warning or danger past a threshold taken from
//! what is known of bans (reference: cold sends with no replies, a new number's burst).

use super::charts::{self, Meter, MeterState};
use super::{Ctx, DashError};
use crate::store::Instance;
use maud::{Markup, html};

const DAY_MS: i64 = 24 * 3_600_000;

/// Messages a day a number younger than 7 days may send (day 0 to day 6).
pub const WARMUP_DAILY: [u64; 7] = [50, 75, 100, 150, 200, 300, 400];
/// New recipients a day a number younger than 7 days may message.
pub const WARMUP_NEW_RECIPIENTS: [u64; 7] = [10, 15, 20, 30, 40, 50, 60];
/// New recipients a day afterwards.
pub const NEW_RECIPIENTS: u64 = 200;

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 { 0.0 } else { part as f64 / whole as f64 }
}

/// A percentage meter; `warn` and `danger` are the ratios from which it turns.
fn share(label: &str, part: u64, whole: u64, warn: f64, danger: f64, low_is_bad: bool) -> Meter {
    let r = ratio(part, whole);
    let state = match (whole, low_is_bad) {
        (0, _) => MeterState::Ok,
        (_, false) if r >= danger => MeterState::Danger,
        (_, false) if r >= warn => MeterState::Warn,
        (_, true) if r <= danger => MeterState::Danger,
        (_, true) if r <= warn => MeterState::Warn,
        _ => MeterState::Ok,
    };
    let display = format!("{} ({} of {})", charts::percent(r), charts::thousands(part), charts::thousands(whole));
    Meter { label: label.to_string(), value: r * 100.0, max: 100.0, display, state, words: ["watch", "high risk"] }
}

/// The card of an instance's signals.
pub async fn risk_card(rqctx: &Ctx, instance: &Instance, now: i64) -> Result<Markup, DashError> {
    let s = rqctx.context().store.risk_signals(&instance.id, now).await?;
    let age = (now.saturating_sub(instance.created_at).max(0) / DAY_MS) as usize;
    let warming = age < 7;
    let attempts = s.sends + s.refused;
    let mut meters = vec![
        // Too few people answering is the strongest ban signal; only meaningful with a
        // few recipients.
        share("Reply rate", s.replied, s.recipients, 0.15, 0.05, true),
        share("Refusal rate", s.refused, attempts, 0.05, 0.2, false),
        share("New recipients", s.new_recipients, s.recipients, 0.5, 0.8, false),
        share("Messages to people who never replied", s.to_never_replied, s.sends, 0.6, 0.9, false),
        Meter {
            label: "Warm-up".into(),
            value: (age.min(7) + usize::from(warming)) as f64,
            max: 7.0,
            display: if warming { format!("day {} of 7", age + 1) } else { "done".into() },
            state: MeterState::Ok,
            words: charts::LIMIT_WORDS,
        },
    ];
    if s.recipients < 20 {
        meters[0].state = MeterState::Ok;
    }
    if warming {
        meters.push(Meter::usage("Messages today (warm-up cap)", s.sent_today, WARMUP_DAILY[age]));
        meters.push(Meter::usage("New recipients today (warm-up cap)", s.new_today, WARMUP_NEW_RECIPIENTS[age]));
    } else {
        meters.push(Meter::usage("New recipients today (pacing cap)", s.new_today, NEW_RECIPIENTS));
    }
    Ok(html! {
        section.card #risk {
            (charts::meters("ban-risk", "Ban-risk signals",
                &format!("Over the last 7 days: {} sends to {} recipients, {} refused; and today's headroom under the pacing caps.",
                         charts::thousands(s.sends), charts::thousands(s.recipients), charts::thousands(s.refused)),
                &meters))
            p.hint { "Numbers get restricted when few people answer, when most recipients are new, and when a new number sends in bursts. Warnings start at a reply rate under 15 %, refusals over 5 %, new recipients over half; see the " a href="/docs/responsible-messaging" { "guide" } "." }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The caps shown are the ones the guide states for the pacing module.
    #[test]
    fn the_caps_are_those_of_the_guide() {
        let guide = include_str!("../../../docs/responsible-messaging.md");
        let list = |caps: &[u64]| caps.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", ");
        assert!(guide.contains(&list(&WARMUP_DAILY)), "warm-up daily caps");
        assert!(guide.contains(&list(&WARMUP_NEW_RECIPIENTS)), "warm-up new-recipient caps");
        assert!(guide.contains(&format!("at most {NEW_RECIPIENTS} new recipients a day")));
    }

    #[test]
    fn meters_turn_past_their_thresholds() {
        assert_eq!(share("r", 1, 100, 0.15, 0.05, true).state, MeterState::Danger);
        assert_eq!(share("r", 10, 100, 0.15, 0.05, true).state, MeterState::Warn);
        assert_eq!(share("r", 50, 100, 0.15, 0.05, true).state, MeterState::Ok);
        assert_eq!(share("n", 9, 10, 0.5, 0.8, false).state, MeterState::Danger);
        assert_eq!(share("n", 0, 0, 0.5, 0.8, false).state, MeterState::Ok);
    }
}
