//! The policy host: the live set of modules and the evaluation of a stage.
//!
//! The set is an `ArcSwap<PolicySet>`: an evaluation takes an `Arc` of the set at its
//! start and finishes on it, so a reload that swaps the set never changes a decision
//! half-way, and the old modules are freed when their last evaluation ends.
//!
//! Where an evaluation runs: an evaluation takes tens of µs, and handing it to another
//! thread and back (`spawn_blocking`, or `block_in_place`, which moves the worker's
//! other tasks away) cost more than the evaluations themselves (BENCHMARKS.md), so it
//! runs on the request's own task. A module that was once slow (over
//! `module::SLOW_FUEL`, or out of fuel: a runaway loop costs milliseconds) is from
//! then on run inside `block_in_place` on the server's multi-thread runtime (the
//! blocking pool on a current-thread runtime), so it can never hold up other
//! requests. At most `workers` evaluations run at once (a semaphore); the pooling
//! allocator has a few slots more, for fixture runs during a reload.

use super::module::{LoadError, LoadedModule};
use super::rollout::{self, Plan, Role, Variant};
use super::sandbox::{self, Fault, Limits};
use super::wit::Converted;
use super::{Context, Decision, PolicyEngine, StageOutcome, TraceEntry, Verdict};
use crate::config::PolicySettings;
use arc_swap::ArcSwap;
use slog::{Logger, warn};
use std::path::Path;
use std::sync::Arc;
use tokio::sync::Semaphore;
use wasmtime::Engine;

/// Instance slots beyond the workers (fixture runs of a reload, `policy test`).
const SPARE_SLOTS: u32 = 8;

/// The modules live at one moment, in evaluation order.
#[derive(Debug, Default)]
pub struct PolicySet {
    pub modules: Vec<Arc<LoadedModule>>,
    /// Stored modules running as a shadow, a canary or for some customers (`rollout`).
    pub variants: Vec<Variant>,
    /// Counts swaps since the host started.
    pub generation: u64,
}

/// What a module fault decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailMode {
    Deny,
    Review,
    Allow,
}

impl FailMode {
    fn parse(s: &str) -> FailMode {
        match s {
            "review" => FailMode::Review,
            "allow" => FailMode::Allow,
            _ => FailMode::Deny,
        }
    }
}

/// The engine, the live set, and the limits every evaluation runs under.
pub struct PolicyHost {
    engine: Engine,
    limits: Limits,
    max_module_bytes: usize,
    fail_mode: FailMode,
    set: ArcSwap<PolicySet>,
    permits: Semaphore,
    log: Logger,
}

/// A host could not be created.
#[derive(Debug, thiserror::Error)]
#[error("policy host: {0}")]
pub struct HostError(pub String);

impl PolicyHost {
    /// A host with no modules yet; `cache_dir` overrides the settings' cache directory.
    pub fn new(settings: &PolicySettings, log: Logger) -> Result<PolicyHost, HostError> {
        let workers = match settings.workers {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        };
        let cache = Some(settings.cache_dir.as_str()).filter(|d| !d.is_empty()).map(Path::new);
        let engine = sandbox::engine(workers as u32 + SPARE_SLOTS, cache).map_err(HostError)?;
        Ok(PolicyHost {
            engine,
            limits: Limits { fuel: settings.fuel, memory_bytes: settings.memory_bytes },
            max_module_bytes: settings.max_module_bytes,
            fail_mode: FailMode::parse(&settings.fail_mode),
            set: ArcSwap::from_pointee(PolicySet::default()),
            permits: Semaphore::new(workers),
            log,
        })
    }

    /// The sandbox limits of one evaluation.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The largest module it loads, in bytes.
    pub fn max_module_bytes(&self) -> usize {
        self.max_module_bytes
    }

    /// Compiles and checks a module (blocking: call off the request path). Modules to
    /// serve must carry fixtures and pass them.
    pub fn load(&self, bytes: &[u8], source: &str, require_fixtures: bool) -> Result<LoadedModule, LoadError> {
        LoadedModule::load(&self.engine, bytes, source, self.limits, self.max_module_bytes, require_fixtures)
    }

    /// The live set.
    pub fn current(&self) -> Arc<PolicySet> {
        self.set.load_full()
    }

    /// Makes `modules` the live set, atomically; evaluations already running finish on
    /// the set they started with. Returns the new generation.
    pub fn install(&self, modules: Vec<Arc<LoadedModule>>) -> u64 {
        self.install_with(modules, Vec::new())
    }

    /// `install`, with the shadows, canaries and scoped installs beside the live set.
    pub fn install_with(&self, modules: Vec<Arc<LoadedModule>>, variants: Vec<Variant>) -> u64 {
        let generation = self.set.load().generation + 1;
        self.set.store(Arc::new(PolicySet { modules, variants, generation }));
        generation
    }

    /// Evaluates every module of the live set asked at `ctx.stage`, on this thread.
    pub fn evaluate_blocking(&self, ctx: &Context, set: &PolicySet) -> StageOutcome {
        self.evaluate_plan(ctx, &rollout::plan(set, ctx, false))
    }

    /// Evaluates what decides one send at one stage (see `rollout`): the first deny
    /// decides, else the first review, else allow; then the shadows, which are traced
    /// and counted and never change the outcome.
    fn evaluate_plan(&self, ctx: &Context, plan: &Plan) -> StageOutcome {
        let stage = ctx.stage;
        let mut converted: Vec<((&'static str, bool), Converted)> = Vec::new();
        let mut trace = Vec::with_capacity(plan.deciders.len() + plan.shadows.len());
        let mut deny = None;
        let mut review = None;
        for (module, role) in &plan.deciders {
            let index = converted_for(&mut converted, module, ctx);
            let (mut entry, outcome) = self.run(module, &converted[index].1, stage, *role);
            let verdict = match outcome {
                Ok(verdict) => verdict,
                Err(fault) => {
                    warn!(self.log, "policy module failed"; "module" => module.label(), "sha256" => module.short_hash(),
                          "stage" => stage.as_str(), "fault" => fault.kind(), "detail" => fault.to_string(),
                          "fail_mode" => ?self.fail_mode);
                    trace.push(entry);
                    let (policy, reason) = (module.label(), fault_reason(module, &fault));
                    match self.fail_mode {
                        FailMode::Deny if deny.is_none() => {
                            deny = Some(Decision::Deny {
                                policy,
                                code: "policy_error".into(),
                                reason,
                                risk_score: 100,
                                fault: true,
                            })
                        }
                        FailMode::Review if review.is_none() => {
                            review = Some(Decision::Review { policy, reason, risk_score: 100 })
                        }
                        _ => {}
                    }
                    continue;
                }
            };
            match verdict {
                Verdict::Allow => {}
                Verdict::Deny { code, reason, risk_score } => {
                    entry.code = Some(code.clone());
                    entry.risk = Some(risk_score);
                    if deny.is_none() {
                        deny = Some(Decision::Deny { policy: module.label(), code, reason, risk_score, fault: false });
                    }
                }
                Verdict::Review { reason, risk_score } => {
                    entry.risk = Some(risk_score);
                    if review.is_none() {
                        review = Some(Decision::Review { policy: module.label(), reason, risk_score });
                    }
                }
            }
            trace.push(entry);
        }
        let decision = deny.or(review).unwrap_or(Decision::Allow);
        for module in &plan.shadows {
            let index = converted_for(&mut converted, module, ctx);
            let (mut entry, outcome) = self.run(module, &converted[index].1, stage, Role::Shadow);
            if let Ok(Verdict::Deny { code, risk_score, .. }) = &outcome {
                (entry.code, entry.risk) = (Some(code.clone()), Some(*risk_score));
            } else if let Ok(Verdict::Review { risk_score, .. }) = &outcome {
                entry.risk = Some(*risk_score);
            }
            // Against what decided for the shadow's name at this stage; a shadow under
            // a new name would decide in addition, so against the stricter of its
            // verdict and the stage's decision (as `policy shadow` compares).
            let mut mine = trace.iter().filter(|e| e.mode != Some("shadow") && e.module == module.metadata.name);
            let met = mine.clone().next().is_some();
            let stage_decision = match &decision {
                Decision::Allow => "allow",
                Decision::Deny { .. } => "deny",
                Decision::Review { .. } => "review",
            };
            let decided = mine.find(|e| e.decision != "allow").map_or("allow", |e| e.decision);
            let (before, after) = if entry.decision == "fault" {
                (stage_decision, "fault")
            } else if !met {
                (stage_decision, stricter(stage_decision, entry.decision))
            } else {
                (decided, entry.decision)
            };
            let change = shadow_change(before, after);
            crate::metrics::get()
                .policy_shadow_changes
                .with_label_values(&[module.metadata.name.as_str(), change.as_str()])
                .inc();
            trace.push(entry);
        }
        StageOutcome { decision, trace }
    }

    /// One evaluation, timed, with its trace entry (decision set; code and risk not).
    fn run(
        &self,
        module: &LoadedModule,
        ctx: &Converted,
        stage: super::Stage,
        role: Role,
    ) -> (TraceEntry, Result<Verdict, Fault>) {
        let evaluation = module.evaluate(ctx, self.limits);
        crate::metrics::get()
            .policy_evaluation
            .with_label_values(&[module.metadata.name.as_str()])
            .observe(evaluation.micros as f64 / 1e6);
        let entry = TraceEntry {
            stage: stage.as_str(),
            module: module.metadata.name.clone(),
            version: module.metadata.version.clone(),
            sha256: module.short_hash().to_string(),
            decision: match &evaluation.outcome {
                Ok(verdict) => verdict.name(),
                Err(_) => "fault",
            },
            code: None,
            risk: None,
            fault: evaluation.outcome.as_ref().err().map(Fault::kind),
            fuel: evaluation.fuel,
            us: evaluation.micros,
            mode: role.mark(),
        };
        (entry, evaluation.outcome)
    }
}

/// The context as `module` reads it, converted once per interface version and counter
/// access: its index in `converted`.
fn converted_for(
    converted: &mut Vec<((&'static str, bool), Converted)>,
    module: &LoadedModule,
    ctx: &Context,
) -> usize {
    let version = (module.interface(), module.reads_counters());
    match converted.iter().position(|(v, _)| *v == version) {
        Some(i) => i,
        None => {
            converted.push((version, module.convert(ctx)));
            converted.len() - 1
        }
    }
}

/// The stricter of two verdicts: deny, then review, then allow (as the pipeline
/// combines modules).
pub(super) fn stricter(a: &'static str, b: &'static str) -> &'static str {
    let rank = |v: &str| match v {
        "deny" => 2,
        "review" => 1,
        _ => 0,
    };
    if rank(b) > rank(a) { b } else { a }
}

/// The label of a shadow's verdict against what decided: `same`, `allow->deny`, ...,
/// or `error` when the shadow failed (`metrics::SHADOW_CHANGES`).
pub fn shadow_change(before: &str, after: &str) -> String {
    match (before, after) {
        (_, "fault") => "error".into(),
        (b, a) if b == a => "same".into(),
        (b, a) => format!("{b}->{a}"),
    }
}

fn fault_reason(module: &LoadedModule, fault: &Fault) -> String {
    format!("the {} policy could not decide ({}); the send was refused to be safe", module.label(), fault.kind())
}

#[async_trait::async_trait]
impl PolicyEngine for Arc<PolicyHost> {
    async fn evaluate(&self, ctx: &Context) -> StageOutcome {
        evaluate_set(self, ctx, self.current(), false).await
    }

    async fn recheck(&self, ctx: &Context) -> StageOutcome {
        evaluate_set(self, ctx, self.current(), true).await
    }
}

/// Evaluates what decides `ctx` at its stage under `set` (with `recheck`, only the
/// modules that read the counters, and no shadows).
async fn evaluate_set(host: &Arc<PolicyHost>, ctx: &Context, set: Arc<PolicySet>, recheck: bool) -> StageOutcome {
    let plan = rollout::plan(&set, ctx, recheck);
    if plan.is_empty() {
        return StageOutcome::allow();
    }
    // The semaphore is never closed.
    let _permit = host.permits.acquire().await.ok();
    let slow = plan.modules().any(|m| m.is_slow());
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    let outcome = if !slow {
        // Tens of µs: right here, as any computation of a request.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| host.evaluate_plan(ctx, &plan)))
            .map_err(|_| "panicked".to_string())
    } else if multi_thread {
        // A module that was slow once: this thread, while the runtime moves this
        // worker's other tasks elsewhere, so a long evaluation holds up nobody.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            tokio::task::block_in_place(|| host.evaluate_plan(ctx, &plan))
        }))
        .map_err(|_| "panicked".to_string())
    } else {
        // A current-thread runtime cannot lend its only thread: the blocking pool.
        let (host, ctx) = (host.clone(), ctx.clone());
        tokio::task::spawn_blocking(move || host.evaluate_plan(&ctx, &plan)).await.map_err(|e| e.to_string())
    };
    outcome.unwrap_or_else(|e| {
        // A panic in the host's own code (not a module trap, which is a value).
        slog::error!(host.log, "policy evaluation panicked"; "error" => e);
        StageOutcome {
            decision: Decision::Deny {
                policy: "gateway/policy-host".into(),
                code: "policy_error".into(),
                reason: "the policy host failed; the send was refused to be safe".into(),
                risk_score: 100,
                fault: true,
            },
            trace: Vec::new(),
        }
    })
}
