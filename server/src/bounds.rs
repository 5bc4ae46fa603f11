//! The documented range of every number an operator or customer can set, in one
//! place: configuration (`Config::validate`), the CLI and the dashboard (`ops`) check
//! against these, and the dashboard's inputs take their `min`/`max` from them. A value
//! outside its range is refused with a message naming the setting and the range, never
//! clamped in silence. Arithmetic on stored values saturates as a second guard (a value
//! stored before a range existed cannot wrap a time).

use std::fmt::Display;
use std::ops::RangeInclusive;

/// `value` if it lies in `range`, else why not: "`name` must be between LO and HI".
pub fn within<T: PartialOrd + Display + Copy>(name: &str, value: T, range: &RangeInclusive<T>) -> Result<T, String> {
    if range.contains(&value) {
        Ok(value)
    } else {
        Err(format!("{name} must be between {} and {}", range.start(), range.end()))
    }
}

// ---- limits (configuration, `gateway customer limits`, the operator console) ----
// Limits are only compared, never multiplied, so their ceiling is "no limit in
// practice" (a billion), which load tests use to lift them out of the way.

/// Messages a day.
pub const DAILY_MESSAGES: RangeInclusive<i64> = 1..=1_000_000_000;
/// Messages a plan period (30 days).
pub const MONTHLY_MESSAGES: RangeInclusive<i64> = 1..=1_000_000_000;
/// Sends a minute per instance.
pub const INSTANCE_PER_MINUTE: RangeInclusive<i64> = 1..=1_000_000_000;
/// Sends a minute per (instance, recipient).
pub const RECIPIENT_PER_MINUTE: RangeInclusive<i64> = 1..=1_000_000_000;
/// Instances a plan allows.
pub const PLAN_INSTANCES: RangeInclusive<i64> = 1..=10_000;

// ---- PBX (configuration, `gateway pbx set`, the PBX settings page) ----

/// PBX webhook requests a minute per integration (at most one a millisecond: the
/// limiter's interval is whole milliseconds and never 0).
pub const PBX_RATE_PER_MINUTE: RangeInclusive<i64> = 1..=60_000;
/// PBX webhook requests at once (a billion: no limit in practice, for load tests).
pub const PBX_BURST: RangeInclusive<i64> = 1..=1_000_000_000;
/// Minutes between templated messages to one caller for one event type (a week; 0: none).
pub const PBX_COOLDOWN_MINUTES: RangeInclusive<i64> = 0..=10_080;
/// Hours of the strict conversation window (30 days).
pub const PBX_STRICT_WINDOW_HOURS: RangeInclusive<i64> = 1..=720;

// ---- instances and commands ----

/// Days an instance's number has been in use (`gateway instance age`).
pub const INSTANCE_AGE_DAYS: RangeInclusive<i64> = 0..=36_500;
/// Seconds a CLI command waits for the gateways (`--wait`).
pub const WAIT_SECONDS: RangeInclusive<u64> = 0..=3_600;
/// Rows a CLI listing prints (`--limit`).
pub const LIST_LIMIT: RangeInclusive<i64> = 1..=1_000;

// ---- days kept (retention) ----

/// Days a table's rows are kept.
pub const RETENTION_DAYS: RangeInclusive<i64> = 1..=3_650;

// ---- the dashboard's sign-in ----

/// Sign-in attempts a minute one source address may make after its burst.
pub const SIGNIN_PER_MINUTE: RangeInclusive<i64> = 1..=600;
/// Sign-in attempts one source address may make at once.
pub const SIGNIN_BURST: RangeInclusive<i64> = 1..=1_000;
/// Threads hashing passwords (0: one per core).
pub const PASSWORD_SLOTS: RangeInclusive<i64> = 0..=64;
/// Password jobs waiting for a thread (0: twice the slots).
pub const PASSWORD_QUEUE: RangeInclusive<i64> = 0..=1_024;

/// Milliseconds `now` plus `minutes`, never wrapping.
pub fn after_minutes(now: i64, minutes: i64) -> i64 {
    now.saturating_add(minutes.saturating_mul(60_000))
}

/// Milliseconds in `hours`, never wrapping.
pub fn hours_ms(hours: i64) -> i64 {
    hours.saturating_mul(3_600_000)
}

/// Milliseconds in `days`, never wrapping.
pub fn days_ms(days: i64) -> i64 {
    days.saturating_mul(24 * 3_600_000)
}

/// A look-back of `policy backtest` and `policy shadow`: at most 90 days.
pub const LOOKBACK_MS: RangeInclusive<i64> = 1_000..=90 * 86_400_000;
/// Sends one backtest or shadow report reads at most.
pub const REPORT_LIMIT: RangeInclusive<u64> = 1..=10_000_000;

/// A duration such as `90s`, `30m`, `24h` or `7d`, in milliseconds, within
/// [`LOOKBACK_MS`].
pub fn duration_ms(name: &str, raw: &str) -> Result<i64, String> {
    let raw = raw.trim();
    let split = raw.find(|c: char| !c.is_ascii_digit()).unwrap_or(raw.len());
    let (digits, unit) = raw.split_at(split);
    let unit_ms = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{name} {raw:?}: a number and s, m, h or d (24h, 7d)")),
    };
    let n: i64 = digits.parse().map_err(|_| format!("{name} {raw:?}: a number and s, m, h or d (24h, 7d)"))?;
    let ms = n.saturating_mul(unit_ms);
    if !LOOKBACK_MS.contains(&ms) {
        return Err(format!("{name} {raw:?} must be between 1s and 90d"));
    }
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_names_the_setting_and_its_range() {
        assert_eq!(within("x", 5, &(1..=10)), Ok(5));
        assert_eq!(
            within("cooldown_minutes", 153_722_867_280_912_930i64, &PBX_COOLDOWN_MINUTES).unwrap_err(),
            "cooldown_minutes must be between 0 and 10080"
        );
    }

    #[test]
    fn time_arithmetic_saturates() {
        assert_eq!(after_minutes(1_000, 153_722_867_280_912_930), i64::MAX);
        assert_eq!(hours_ms(i64::MAX / 2), i64::MAX);
        assert_eq!(days_ms(2), 172_800_000);
    }

    #[test]
    fn durations_read_their_unit_and_stay_within_90_days() {
        assert_eq!(duration_ms("--since", "90s"), Ok(90_000));
        assert_eq!(duration_ms("--since", " 24h "), Ok(86_400_000));
        assert_eq!(duration_ms("--since", "90d"), Ok(90 * 86_400_000));
        assert_eq!(duration_ms("--since", "91d").unwrap_err(), "--since \"91d\" must be between 1s and 90d");
        assert_eq!(duration_ms("--since", "0s").unwrap_err(), "--since \"0s\" must be between 1s and 90d");
        for bad in ["", "7", "d", "7w", "-1d", "1.5h", "99999999999999999999d"] {
            assert!(duration_ms("--since", bad).is_err(), "{bad}");
        }
    }
}
