//! `[limits]` and `[plans.starter]`, `[plans.scale]`: sends a minute per instance and
//! per recipient, and each plan's instances and message quotas.

use serde::Deserialize;

/// Sends a minute per instance and per (instance, recipient), per plan unless a
/// customer has a reviewed override.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VelocityLimits {
    pub instance_per_minute: i64,
    pub recipient_per_minute: i64,
}

/// Limits of one plan.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanLimits {
    pub instances: i64,
    pub daily_messages: i64,
    pub monthly_messages: i64,
    /// Overrides `limits.instance_per_minute` for this plan.
    #[serde(default)]
    pub instance_per_minute: Option<i64>,
    /// Overrides `limits.recipient_per_minute` for this plan.
    #[serde(default)]
    pub recipient_per_minute: Option<i64>,
}

/// The names of the plans a customer can be on.
pub const PLAN_NAMES: [&str; 2] = ["starter", "scale"];

/// The two plans, `starter` and `scale`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Plans {
    pub starter: PlanLimits,
    pub scale: PlanLimits,
}

impl Default for VelocityLimits {
    fn default() -> Self {
        VelocityLimits { instance_per_minute: 30, recipient_per_minute: 5 }
    }
}

impl Default for Plans {
    fn default() -> Self {
        Plans {
            starter: PlanLimits {
                instances: 1,
                daily_messages: 100,
                monthly_messages: 2_000,
                instance_per_minute: None,
                recipient_per_minute: None,
            },
            scale: PlanLimits {
                instances: 10,
                daily_messages: 1_500,
                monthly_messages: 30_000,
                instance_per_minute: None,
                recipient_per_minute: None,
            },
        }
    }
}
