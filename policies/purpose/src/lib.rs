//! The default purpose policy: is this purpose allowed for this customer and this
//! message? Asked at the purpose stage, before suppression; a denial is 422
//! `message_purpose_not_allowed`.
//!
//! Rules, in order (the first that applies decides):
//! 1. `unknown_purpose`: the purpose is not one of the five the gateway allows
//!    (transactional, operational, support, internal_team, authentication). Marketing,
//!    promotional, political and campaign purposes do not exist here on purpose.
//! 2. `purpose_not_approved`: the operator has not approved the customer for it.
//! 3. `media_in_authentication`: authentication messages are text only (a code or a
//!    sign-in link), never an image, document or audio.
//! 4. `authentication_too_long`: an authentication message is short (at most
//!    [`MAX_AUTHENTICATION_CHARS`] characters); a long one carries something else.
//! 5. `authentication_without_code`: an authentication message carries a code (a run
//!    of 4 to 10 digits or of code-like letters and digits) or a link; otherwise it is
//!    not authentication.

use gateway_policy::{Decision, MessageContext, PURPOSES, Policy, export_policy};

/// Longest authentication message, in characters.
pub const MAX_AUTHENTICATION_CHARS: usize = 320;

/// The purpose rules.
pub struct PurposePolicy;

impl Policy for PurposePolicy {
    fn evaluate(ctx: MessageContext) -> Decision {
        decide(&ctx)
    }
}

export_policy!(PurposePolicy, name = "purpose", stages = "purpose", reads_counters = false);

/// The decision for one send (plain function, tested natively).
pub fn decide(ctx: &MessageContext) -> Decision {
    if !ctx.purpose_known() {
        return Decision::deny(
            "unknown_purpose",
            format!(
                "{:?} is not an allowed purpose; use one of {}. Marketing, promotional, political and bulk \
                 campaign messages are not allowed",
                ctx.purpose,
                PURPOSES.join(", ")
            ),
            90,
        );
    }
    if !ctx.purpose_approved() {
        return Decision::deny(
            "purpose_not_approved",
            format!(
                "this account is not approved for {} messages (approved: {}); ask the operator to review it",
                ctx.purpose,
                if ctx.customer.approved_purposes.is_empty() {
                    "none".to_string()
                } else {
                    ctx.customer.approved_purposes.join(", ")
                }
            ),
            60,
        );
    }
    if ctx.purpose != "authentication" {
        return Decision::Allow;
    }
    if ctx.media.is_some() {
        return Decision::deny(
            "media_in_authentication",
            "authentication messages are text only: send the code or link as a text message",
            80,
        );
    }
    let body = ctx.body();
    if body.chars().count() > MAX_AUTHENTICATION_CHARS {
        return Decision::deny(
            "authentication_too_long",
            format!("authentication messages are at most {MAX_AUTHENTICATION_CHARS} characters: send only the code"),
            70,
        );
    }
    if !has_code(body) && !has_link(body) {
        return Decision::deny(
            "authentication_without_code",
            "an authentication message carries a code or a sign-in link; use another purpose for other messages",
            60,
        );
    }
    Decision::Allow
}

/// Whether the text holds a one-time code: 4 to 10 digits in a row (spaces or dashes
/// inside allowed, as in "123 456" or "123-456"), or a 6 to 10 character token mixing
/// capital letters and digits ("A7K2P9").
pub fn has_code(text: &str) -> bool {
    let mut digits = 0;
    let mut run_ok = false;
    let chars: Vec<char> = text.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if c.is_ascii_digit() {
            digits += 1;
        } else if (c == ' ' || c == '-')
            && digits > 0
            && chars.get(i + 1).is_some_and(|n| n.is_ascii_digit())
            && chars.get(i.wrapping_sub(1)).is_some_and(|p| p.is_ascii_digit())
        {
            continue;
        } else {
            run_ok |= (4..=10).contains(&digits);
            digits = 0;
        }
    }
    run_ok |= (4..=10).contains(&digits);
    run_ok
        || text.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| {
            (6..=10).contains(&w.len())
                && w.bytes().any(|b| b.is_ascii_digit())
                && w.bytes().any(|b| b.is_ascii_uppercase())
                && w.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
        })
}

/// Whether the text holds an https link (a sign-in or verification link).
pub fn has_link(text: &str) -> bool {
    text.to_ascii_lowercase().contains("https://")
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_policy::testing;

    #[test]
    fn fixtures() {
        testing::assert_fixtures::<PurposePolicy>("fixtures.json");
    }

    #[test]
    fn codes_are_found_in_their_usual_shapes() {
        for yes in ["Your code is 123456", "Code: 123 456", "use 12-34-56 to sign in", "4821", "Token A7K2P9Z"] {
            assert!(has_code(yes), "{yes}");
        }
        for no in ["Your code is 12", "Order shipped", "call 12345678901 now", "ABCDEFG", "abc123x"] {
            assert!(!has_code(no), "{no}");
        }
    }
}
