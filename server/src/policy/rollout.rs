//! Which modules decide a send, when stored modules run as a shadow, a canary or for
//! some customers only (`store::Rollout`; docs/policies.md, "Ship safely").
//!
//! For each live module of the set, in its order, the decider of its name for this
//! send is: a scoped install of that name whose scope holds the send's customer (one
//! naming the customer before one naming the plan, then the newest); else its canary,
//! when the send's bucket falls in the canary's share; else the live module. A scoped
//! install or canary under a name no live module has decides in addition, after them.
//! Shadows are evaluated after the deciders and never decide.

use super::host::PolicySet;
use super::module::LoadedModule;
use crate::store::{Rollout, RolloutMode};
use gateway_policy_model::Context;
use std::sync::Arc;

/// A stored module that is not simply live for everyone.
#[derive(Clone, Debug)]
pub struct Variant {
    pub module: Arc<LoadedModule>,
    pub rollout: Rollout,
}

/// A module's part in deciding one send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Live,
    Canary,
    Scoped,
    Shadow,
}

impl Role {
    /// How the trace marks it (a live module is not marked).
    pub fn mark(self) -> Option<&'static str> {
        match self {
            Role::Live => None,
            Role::Canary => Some("canary"),
            Role::Scoped => Some("scoped"),
            Role::Shadow => Some("shadow"),
        }
    }
}

/// What is evaluated for one send at one stage.
pub struct Plan {
    /// The modules whose verdicts decide, in order.
    pub deciders: Vec<(Arc<LoadedModule>, Role)>,
    /// Evaluated after, traced, never deciding.
    pub shadows: Vec<Arc<LoadedModule>>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.deciders.is_empty() && self.shadows.is_empty()
    }

    pub fn modules(&self) -> impl Iterator<Item = &Arc<LoadedModule>> {
        self.deciders.iter().map(|(m, _)| m).chain(&self.shadows)
    }
}

/// The send's canary bucket, 0 to 99: a stable hash (FNV-1a) of who sends what to whom,
/// so the same send, an idempotent retry included, falls in the same bucket on every
/// replica and every stage.
pub fn bucket(ctx: &Context) -> u8 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for b in bytes.iter().chain(&[0xff]) {
            hash ^= *b as u64;
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    feed(ctx.customer.id.as_bytes());
    feed(ctx.instance.id.as_bytes());
    feed(ctx.recipient.phone.as_bytes());
    feed(ctx.purpose.as_bytes());
    feed(ctx.text.as_deref().unwrap_or("").as_bytes());
    feed(ctx.caption.as_deref().unwrap_or("").as_bytes());
    if let Some(media) = &ctx.media {
        feed(media.mime_type.as_bytes());
        feed(media.file_name.as_bytes());
        feed(&media.size_bytes.to_le_bytes());
    }
    (hash % 100) as u8
}

/// Whether a scoped rollout covers the send's customer: 2 by customer, 1 by plan.
fn covers(rollout: &Rollout, ctx: &Context) -> Option<u8> {
    if rollout.customers.contains(&ctx.customer.id) {
        Some(2)
    } else if rollout.plans.contains(&ctx.customer.plan) {
        Some(1)
    } else {
        None
    }
}

/// The scoped install or canary that decides `name` for this send, if any.
fn stand_in(
    variants: &[Variant],
    name: &str,
    ctx: &Context,
    bucket: &mut Option<u8>,
) -> Option<(Arc<LoadedModule>, Role)> {
    let scoped = variants
        .iter()
        .enumerate()
        .filter(|(_, v)| v.rollout.mode == RolloutMode::Live && v.module.metadata.name == name)
        .filter_map(|(i, v)| covers(&v.rollout, ctx).map(|rank| ((rank, i), v)))
        .max_by_key(|(key, _)| *key);
    if let Some((_, v)) = scoped {
        return Some((v.module.clone(), Role::Scoped));
    }
    variants.iter().find_map(|v| match v.rollout.mode {
        RolloutMode::Canary(percent) if v.module.metadata.name == name => {
            (*bucket.get_or_insert_with(|| self::bucket(ctx)) < percent).then(|| (v.module.clone(), Role::Canary))
        }
        _ => None,
    })
}

/// What decides `ctx` at its stage under `set` (with `recheck`, only the deciders that
/// read the counters, and no shadows).
pub fn plan(set: &PolicySet, ctx: &Context, recheck: bool) -> Plan {
    let stage = ctx.stage;
    let wanted = |m: &LoadedModule| m.at_stage(stage) && (!recheck || m.reads_counters());
    if set.variants.is_empty() {
        let deciders = set.modules.iter().filter(|m| wanted(m)).map(|m| (m.clone(), Role::Live)).collect();
        return Plan { deciders, shadows: Vec::new() };
    }
    let mut bucket = None;
    let mut deciders: Vec<(Arc<LoadedModule>, Role)> = set
        .modules
        .iter()
        .map(|m| stand_in(&set.variants, &m.metadata.name, ctx, &mut bucket).unwrap_or((m.clone(), Role::Live)))
        .collect();
    let mut extra: Vec<&str> = set
        .variants
        .iter()
        .map(|v| v.module.metadata.name.as_str())
        .filter(|name| !set.modules.iter().any(|m| m.metadata.name == *name))
        .collect();
    extra.sort_unstable();
    extra.dedup();
    deciders.extend(extra.into_iter().filter_map(|name| stand_in(&set.variants, name, ctx, &mut bucket)));
    deciders.retain(|(m, _)| wanted(m));
    let shadows = match recheck {
        true => Vec::new(),
        false => set
            .variants
            .iter()
            .filter(|v| v.rollout.mode == RolloutMode::Shadow && v.module.at_stage(stage))
            .map(|v| v.module.clone())
            .collect(),
    };
    Plan { deciders, shadows }
}
