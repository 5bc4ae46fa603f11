//! When the next attempt is due: the schedule, its jitter, and `Retry-After`.
//!
//! Pure functions of their inputs (the random draw and the answer's header are passed
//! in), so the schedule is tested without waiting for it.

use std::time::Duration;

/// The delay before attempt `attempts_made + 1`, or `None` when the schedule is over.
///
/// `schedule_ms[k]` is the delay before attempt `k + 1` (the first is 0: at once);
/// `draw` in [-1, 1] moves it by up to `jitter` of itself either way. A `Retry-After`
/// of a 429 or 503 answer is honoured within [d, 2d] of the jittered delay d, so a
/// receiver can neither pull a retry earlier than the schedule nor push it out
/// indefinitely.
pub fn next_delay(
    schedule_ms: &[u64],
    attempts_made: usize,
    jitter: f64,
    draw: f64,
    retry_after: Option<Duration>,
) -> Option<Duration> {
    let base = *schedule_ms.get(attempts_made)? as f64;
    let factor = 1.0 + jitter.clamp(0.0, 1.0) * draw.clamp(-1.0, 1.0);
    let delay = Duration::from_millis((base * factor).round() as u64);
    Some(match retry_after {
        Some(asked) => asked.clamp(delay, delay * 2),
        None => delay,
    })
}

/// `Retry-After` as seconds or an HTTP date.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let ms = (at.timestamp_millis() - chrono::Utc::now().timestamp_millis()).max(0);
    Some(Duration::from_millis(ms as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEDULE: [u64; 8] = [0, 5_000, 300_000, 1_800_000, 7_200_000, 18_000_000, 36_000_000, 36_000_000];

    fn ms(d: Option<Duration>) -> Option<u64> {
        d.map(|d| d.as_millis() as u64)
    }

    #[test]
    fn the_schedule_without_jitter_is_the_design() {
        let delays: Vec<Option<u64>> = (0..9).map(|n| ms(next_delay(&SCHEDULE, n, 0.2, 0.0, None))).collect();
        let expected: Vec<Option<u64>> = SCHEDULE.iter().map(|d| Some(*d)).chain([None]).collect();
        assert_eq!(delays, expected);
        // 8 attempts over about 27 h 35 min.
        assert_eq!(SCHEDULE.iter().sum::<u64>(), (27 * 60 + 35) * 60_000 + 5_000);
    }

    #[test]
    fn jitter_stays_within_twenty_percent() {
        for (n, &base) in SCHEDULE.iter().enumerate().skip(1) {
            assert_eq!(ms(next_delay(&SCHEDULE, n, 0.2, -1.0, None)), Some(base * 8 / 10));
            assert_eq!(ms(next_delay(&SCHEDULE, n, 0.2, 1.0, None)), Some(base * 12 / 10));
            for i in 0..=20 {
                let draw = i as f64 / 10.0 - 1.0;
                let d = ms(next_delay(&SCHEDULE, n, 0.2, draw, None)).unwrap();
                assert!(d >= base * 8 / 10 && d <= base * 12 / 10, "attempt {n}, draw {draw}: {d}");
            }
        }
        // Out-of-range draws and jitter are clamped.
        assert_eq!(ms(next_delay(&SCHEDULE, 1, 5.0, 3.0, None)), Some(10_000));
    }

    #[test]
    fn retry_after_is_honoured_within_d_and_2d() {
        let d = 300_000; // before the third attempt
        let with = |secs: u64| ms(next_delay(&SCHEDULE, 2, 0.2, 0.0, Some(Duration::from_secs(secs))));
        assert_eq!(with(1), Some(d), "not earlier than the schedule");
        assert_eq!(with(450), Some(450_000), "inside [d, 2d] as asked");
        assert_eq!(with(86_400), Some(2 * d), "not later than twice the schedule");
        // After the schedule, Retry-After does not add attempts.
        assert_eq!(next_delay(&SCHEDULE, 8, 0.2, 0.0, Some(Duration::from_secs(5))), None);
    }

    #[test]
    fn retry_after_forms() {
        assert_eq!(parse_retry_after("120"), Some(Duration::from_secs(120)));
        assert_eq!(parse_retry_after(" 0 "), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), Some(Duration::ZERO), "a past date is now");
        let later = chrono::Utc::now() + chrono::Duration::seconds(90);
        let parsed = parse_retry_after(&later.to_rfc2822()).unwrap();
        assert!(parsed >= Duration::from_secs(88) && parsed <= Duration::from_secs(90), "{parsed:?}");
        assert_eq!(parse_retry_after("soon"), None);
    }
}
