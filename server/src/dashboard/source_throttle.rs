//! The sign-in throttle per source address, beside the one per email (`auth`).
//!
//! The email throttle (in the store, shared by replicas) bounds guessing on one
//! account; it gives every new email its free attempts, so alone it does not bound
//! the work of a flood that tries a new email each time. This one bounds what one
//! address (an IPv6 /64) may ask for: a burst, then a steady rate (GCRA), answered
//! 429 with `Retry-After` before any store write or hashing. It is held in memory per
//! replica on purpose: a flood is refused without touching the database (N replicas
//! allow N times the rate; the hashing slots bound each one's work anyway).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Addresses remembered at most; past it the map starts over (a flood from many
/// addresses costs no memory, and each address only regains its burst).
const MAX_SOURCES: usize = 100_000;

/// Per-source GCRA: `burst` attempts at once, then one every `interval`.
pub struct SourceThrottle {
    interval: Duration,
    burst: u32,
    /// Theoretical arrival time of each source's next attempt.
    tat: Mutex<HashMap<String, Instant>>,
}

impl SourceThrottle {
    /// `per_minute` sustained attempts (at least 1), `burst` at once (at least 1).
    pub fn new(per_minute: u32, burst: u32) -> SourceThrottle {
        SourceThrottle {
            interval: Duration::from_secs(60) / per_minute.max(1),
            burst: burst.max(1),
            tat: Mutex::new(HashMap::new()),
        }
    }

    /// Admits one attempt from `source` at `now`, or says how long to wait.
    pub fn admit(&self, source: &str, now: Instant) -> Result<(), Duration> {
        let mut tat = self.tat.lock().unwrap_or_else(|e| e.into_inner());
        if tat.len() >= MAX_SOURCES && !tat.contains_key(source) {
            tat.retain(|_, t| *t > now);
            if tat.len() >= MAX_SOURCES {
                tat.clear();
            }
        }
        let tolerance = self.interval * (self.burst - 1);
        let current = tat.get(source).copied().unwrap_or(now).max(now);
        let allowed_at = current.checked_sub(tolerance).unwrap_or(now);
        if allowed_at > now {
            return Err(allowed_at - now);
        }
        tat.insert(source.to_string(), current + self.interval);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_steady_rate_per_source() {
        let throttle = SourceThrottle::new(10, 3);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(throttle.admit("a", t0).is_ok());
        }
        let wait = throttle.admit("a", t0).unwrap_err();
        assert_eq!(wait, Duration::from_secs(6), "one every 6 s after the burst");
        assert!(throttle.admit("b", t0).is_ok(), "another source has its own burst");
        assert!(throttle.admit("a", t0 + Duration::from_secs(6)).is_ok());
        assert!(throttle.admit("a", t0 + Duration::from_secs(6)).is_err());
        // Idle long enough, the whole burst is back.
        let later = t0 + Duration::from_secs(60);
        assert!((0..3).all(|_| throttle.admit("a", later).is_ok()));
    }
}
