//! Every number of the configuration with its range: `Config::validate` refuses a
//! value outside it (naming the key and the range), and a test checks that
//! `server/examples/config.toml` states each range beside its key. The ranges the CLI
//! and the dashboard share with the configuration come from `crate::bounds`.

use super::Config;
use crate::bounds;

/// One number: its key as written in the TOML file, its value, its range.
pub struct Number {
    pub key: String,
    pub value: i128,
    pub lowest: i128,
    pub highest: i128,
}

fn number<T: Into<i128>, R: Into<i128> + Copy>(key: &str, value: T, range: &std::ops::RangeInclusive<R>) -> Number {
    Number {
        key: key.to_string(),
        value: value.into(),
        lowest: (*range.start()).into(),
        highest: (*range.end()).into(),
    }
}

/// Every number of `config` (the optional ones that are set) with its range.
pub fn all(config: &Config) -> Vec<Number> {
    let c = config;
    let (l, m, x, w, p, d, r) = (&c.limits, &c.media, &c.pbx, &c.webhooks, &c.policies, &c.dashboard, &c.retention);
    let mut all = vec![
        number("database_max_connections", c.database_max_connections, &(1u32..=1_000)),
        number("database_timeout_ms", c.database_timeout_ms, &(100u64..=600_000)),
        number("provider_timeout_ms", c.provider_timeout_ms, &(1_000u64..=600_000)),
        number("connection_debounce_ms", c.connection_debounce_ms, &(0u64..=3_600_000)),
        number("simulator_status_delay_ms", c.simulator_status_delay_ms, &(0u64..=600_000)),
        number("delivery_ack_timeout_ms", c.delivery_ack_timeout_ms, &(1_000u64..=86_400_000)),
        number("limits.instance_per_minute", l.instance_per_minute, &bounds::INSTANCE_PER_MINUTE),
        number("limits.recipient_per_minute", l.recipient_per_minute, &bounds::RECIPIENT_PER_MINUTE),
        number("media.max_image_bytes", m.max_image_bytes as u64, &(1_024u64..=16_777_216)),
        number("media.max_document_bytes", m.max_document_bytes as u64, &(1_024u64..=16_777_216)),
        number("media.max_audio_bytes", m.max_audio_bytes as u64, &(1_024u64..=16_777_216)),
        number("media.fetch_timeout_ms", m.fetch_timeout_ms, &(1_000u64..=60_000)),
        number("pbx.rate_per_minute", x.rate_per_minute, &bounds::PBX_RATE_PER_MINUTE),
        number("pbx.burst", x.burst, &bounds::PBX_BURST),
        number("pbx.cooldown_minutes", x.cooldown_minutes, &bounds::PBX_COOLDOWN_MINUTES),
        number("pbx.event_retention_days", x.event_retention_days, &bounds::RETENTION_DAYS),
        number("webhooks.schedule_ms (attempts)", w.schedule_ms.len() as u64, &(1u64..=20)),
        number("webhooks.timeout_ms", w.timeout_ms, &(1_000u64..=300_000)),
        number("webhooks.concurrency", w.concurrency as u64, &(1u64..=1_024)),
        number("webhooks.poll_interval_ms", w.poll_interval_ms, &(10u64..=60_000)),
        number("webhooks.disable_after_hours", w.disable_after_hours, &(1i64..=2_160)),
        number("webhooks.retention_days", w.retention_days, &bounds::RETENTION_DAYS),
        number("webhooks.shutdown_grace_ms", w.shutdown_grace_ms, &(0u64..=600_000)),
        number("policies.fuel", p.fuel, &(10_000u64..=1_000_000_000)),
        number("policies.memory_bytes", p.memory_bytes as u64, &(65_536u64..=67_108_864)),
        number("policies.max_module_bytes", p.max_module_bytes as u64, &(4_096u64..=16_777_216)),
        number("policies.workers", p.workers as u64, &(0u64..=256)),
        number("policies.poll_interval_ms", p.poll_interval_ms, &(10u64..=60_000)),
        number("policies.debounce_ms", p.debounce_ms, &(0u64..=600_000)),
        number("policies.review_pause_threshold", p.review_pause_threshold, &(1i64..=1_000)),
        number("policies.review_window_hours", p.review_window_hours, &(1i64..=720)),
        number("policies.input_retention_days", p.input_retention_days, &(0i64..=90)),
        number("dashboard.signin_per_minute", d.signin_per_minute, &bounds::SIGNIN_PER_MINUTE),
        number("dashboard.signin_burst", d.signin_burst, &bounds::SIGNIN_BURST),
        number("dashboard.password_slots", d.password_slots, &bounds::PASSWORD_SLOTS),
        number("dashboard.password_queue", d.password_queue, &bounds::PASSWORD_QUEUE),
        number("retention.message_log_days", r.message_log_days, &bounds::RETENTION_DAYS),
        number("retention.inbound_days", r.inbound_days, &bounds::RETENTION_DAYS),
        number("retention.provider_events_hours", r.provider_events_hours, &(1i64..=720)),
        number("retention.failed_provider_events_days", r.failed_provider_events_days, &bounds::RETENTION_DAYS),
        number("retention.review_days", r.review_days, &bounds::RETENTION_DAYS),
        number("retention.contacts_days", r.contacts_days, &bounds::RETENTION_DAYS),
    ];
    for (name, plan) in [("starter", &c.plans.starter), ("scale", &c.plans.scale)] {
        all.push(number(&format!("plans.{name}.instances"), plan.instances, &bounds::PLAN_INSTANCES));
        all.push(number(&format!("plans.{name}.daily_messages"), plan.daily_messages, &bounds::DAILY_MESSAGES));
        all.push(number(&format!("plans.{name}.monthly_messages"), plan.monthly_messages, &bounds::MONTHLY_MESSAGES));
        if let Some(n) = plan.instance_per_minute {
            all.push(number(&format!("plans.{name}.instance_per_minute"), n, &bounds::INSTANCE_PER_MINUTE));
        }
        if let Some(n) = plan.recipient_per_minute {
            all.push(number(&format!("plans.{name}.recipient_per_minute"), n, &bounds::RECIPIENT_PER_MINUTE));
        }
    }
    for (i, delay) in w.schedule_ms.iter().enumerate() {
        all.push(number(&format!("webhooks.schedule_ms[{i}]"), *delay, &(0u64..=86_400_000)));
    }
    all
}

/// Refuses the first number outside its range, and a jitter that is not a fraction.
pub fn check(config: &Config) -> Result<(), String> {
    for n in all(config) {
        if n.value < n.lowest || n.value > n.highest {
            return Err(format!("{} must be between {} and {}", n.key, n.lowest, n.highest));
        }
    }
    let jitter = config.webhooks.jitter;
    if !(jitter.is_finite() && (0.0..=1.0).contains(&jitter)) {
        return Err("webhooks.jitter must be between 0 and 1".to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each number's line in the example states its range: `key = value  # LO to HI`.
    #[test]
    fn the_example_states_every_range() {
        let text = include_str!("../../examples/config.toml");
        let config = Config::from_toml(text).unwrap();
        for n in all(&config) {
            if n.key.contains('[') || n.key.contains('(') {
                continue;
            }
            let leaf = n.key.rsplit('.').next().unwrap();
            let range = format!("{} to {}", n.lowest, n.highest);
            let lines: Vec<&str> = text.lines().filter(|l| l.starts_with(&format!("{leaf} ="))).collect();
            assert!(!lines.is_empty(), "examples/config.toml has no line for {}", n.key);
            assert!(lines.iter().all(|l| l.contains(&range)), "examples/config.toml: {} should say {range}", n.key);
        }
        assert!(text.contains("schedule_ms = ") && text.contains("1 to 20 attempts, each 0 to 86400000"));
        assert!(text.contains("jitter = 0.2") && text.contains("0 to 1"));
    }

    #[test]
    fn a_number_outside_its_range_is_refused_with_its_key_and_range() {
        let refused = |toml: &str| Config::from_toml(toml).unwrap_err().to_string();
        assert_eq!(
            refused("[pbx]\ncooldown_minutes = 153722867280912930"),
            "invalid configuration: pbx.cooldown_minutes must be between 0 and 10080"
        );
        assert!(refused("[pbx]\nrate_per_minute = 60001").contains("pbx.rate_per_minute must be between 1 and 60000"));
        assert!(refused("[webhooks]\nschedule_ms = []").contains("webhooks.schedule_ms (attempts)"));
        assert!(refused("[webhooks]\nschedule_ms = [0, 9000000000000]").contains("webhooks.schedule_ms[1]"));
        assert!(refused("[webhooks]\njitter = nan").contains("webhooks.jitter"));
        assert!(
            refused("[plans.scale]\ninstances = 0\ndaily_messages = 1\nmonthly_messages = 1").contains("instances")
        );
        assert!(refused("[policies]\nmax_module_bytes = 9000000000").contains("max_module_bytes"));
        assert!(refused("database_max_connections = 0").contains("database_max_connections"));
        assert!(Config::from_toml("[pbx]\ncooldown_minutes = 10080").is_ok());
    }
}
