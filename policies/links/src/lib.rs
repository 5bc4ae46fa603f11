//! An example policy: a first message to a recipient must not carry a link. Asked at
//! the content stage; a denial is 403 `policy_violation`.
//!
//! A link in the first message a number ever sends someone is what phishing and spam
//! look like, and messaging networks treat it so. The rule: when the message (its text,
//! or the caption of a media message) holds a link and the recipient is new to this
//! instance, the send is denied with `link_to_new_recipient` (risk 80). A recipient is
//! new when the counters say the instance never sent them a message
//! (`to_recipient_total` 0) and they never wrote to it (`replies_from_recipient` 0);
//! once either has happened, links pass. Send the first message without the link.
//!
//! A link is `http://`, `https://` or `www.` in any case, at the start of a word (so
//! `awww.` is not one); a bare domain (`example.com`) is not counted. No purpose is
//! exempt: a sign-in link to a stranger is denied like any other (send a code instead).
//!
//! It reads the counters, so it is exported without `reads_counters = false`.

use gateway_policy::{Decision, MessageContext, Policy, Stage, export_policy};

/// Risk of a link in a first message.
pub const RISK: u8 = 80;

/// What starts a link (compared without regard to ASCII case).
pub const LINK_STARTS: [&[u8]; 3] = [b"http://", b"https://", b"www."];

/// The links rule.
pub struct LinksPolicy;

impl Policy for LinksPolicy {
    fn evaluate(ctx: MessageContext) -> Decision {
        decide(&ctx)
    }
}

export_policy!(LinksPolicy, name = "links", stages = "content");

/// The decision for one send (plain function, tested natively).
pub fn decide(ctx: &MessageContext) -> Decision {
    if ctx.stage != Stage::Content {
        return Decision::Allow;
    }
    let c = &ctx.counters;
    let is_new = c.to_recipient_total == 0 && c.replies_from_recipient == 0;
    if is_new && has_link(ctx.body()) {
        return Decision::deny(
            "link_to_new_recipient",
            "a first message to a recipient must not carry a link: this number has never messaged this recipient \
             and they have never written to it. Send the first message without the link; links are allowed once \
             you have messaged them or they have replied",
            RISK,
        );
    }
    Decision::Allow
}

/// Whether the text holds a link: [`LINK_STARTS`] in any case at the start of a word.
/// One pass over the bytes, no allocation.
pub fn has_link(text: &str) -> bool {
    let bytes = text.as_bytes();
    (0..bytes.len()).any(|i| {
        matches!(bytes[i], b'h' | b'H' | b'w' | b'W')
            && (i == 0 || !bytes[i - 1].is_ascii_alphanumeric())
            && LINK_STARTS
                .iter()
                .any(|start| bytes[i..].get(..start.len()).is_some_and(|b| b.eq_ignore_ascii_case(start)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_policy::testing;

    #[test]
    fn fixtures() {
        testing::assert_fixtures::<LinksPolicy>("fixtures.json");
    }

    #[test]
    fn links_are_found_in_any_case_at_the_start_of_a_word() {
        assert!(has_link("https://example.com/track/1"));
        assert!(has_link("Track it: HTTP://example.com"));
        assert!(has_link("see Www.Example.com today"));
        assert!(has_link("(https://example.com)"));
        assert!(!has_link("Awww. Thanks for the photo!"));
        assert!(!has_link("our website example.com, or https: see below"));
        assert!(!has_link("www"));
        assert!(!has_link(""));
    }

    #[test]
    fn a_new_recipient_gets_no_link_whatever_the_purpose() {
        let mut ctx = testing::text(Stage::Content, "authentication", "Sign in: https://example.com/login?t=9f2a");
        assert!(matches!(decide(&ctx), Decision::Deny(d) if d.code == "link_to_new_recipient" && d.risk_score == RISK));
        ctx.counters.to_recipient_total = 1;
        assert_eq!(decide(&ctx), Decision::Allow);
        ctx.counters.to_recipient_total = 0;
        ctx.counters.replies_from_recipient = 1;
        assert_eq!(decide(&ctx), Decision::Allow);
    }

    #[test]
    fn a_caption_is_read_like_text() {
        let mut ctx = testing::context();
        ctx.caption = Some("Menu: www.example.com/menu".into());
        assert!(matches!(decide(&ctx), Decision::Deny(_)));
        ctx.stage = Stage::Purpose;
        assert_eq!(decide(&ctx), Decision::Allow);
    }
}
