//! What a module would have done, and what a shadow did: `gateway policy backtest` asks
//! a module about the sends of the recent past exactly as the live modules were asked
//! (their kept inputs, `store::policy_inputs`), and `gateway policy shadow` reads the
//! verdicts a shadow left in the message log's traces. Both print one report
//! ([`Tally::report`]); the console's policy page shows the same.
//!
//! Per send: "before" is the verdict of the live module of the module's name (its
//! first deny, review or fault across the stages the send reached, from the trace), or,
//! when the send met no module of that name, the send's final decision. "After" is the
//! module's verdict at the stages the send reached (purpose, then content; the first
//! deny or review ends it, as in the pipeline); a module under a new name decides in
//! addition, so its "after" is the stricter of its verdict and "before".

use super::host::{PolicyHost, stricter};
use super::module::LoadedModule;
use super::tools::ToolError;
use crate::store::{KeptInput, PolicyInputQuery, Store, now_ms};
use gateway_policy_model::{Context, Stage, Verdict};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Sends read per page.
const PAGE: i64 = 1_000;
/// Changed sends shown as examples.
const EXAMPLES: usize = 20;

/// Which sends a report reads.
#[derive(Clone, Debug)]
pub struct Window {
    /// From this long ago (ms).
    pub since_ms: i64,
    pub customer: Option<String>,
    /// The newest this many at most.
    pub limit: u64,
}

/// One send's verdicts, before and after.
struct Compared {
    log_id: i64,
    before: &'static str,
    /// `None`: the module failed (an error).
    after: Option<&'static str>,
    rule: Option<String>,
    reason: Option<String>,
    fuel: u64,
}

/// The report's numbers, added up send by send.
#[derive(Default)]
pub struct Tally {
    evaluated: u64,
    same: u64,
    changes: BTreeMap<String, u64>,
    examples: Vec<Value>,
    errors: u64,
    fuel: Vec<u64>,
}

impl Tally {
    fn add(&mut self, c: Compared) {
        self.evaluated += 1;
        self.fuel.push(c.fuel);
        let Some(after) = c.after else {
            self.errors += 1;
            return;
        };
        if after == c.before {
            self.same += 1;
            return;
        }
        *self.changes.entry(format!("{}->{after}", c.before)).or_default() += 1;
        if self.examples.len() < EXAMPLES {
            self.examples.push(json!({"log_id": c.log_id, "before": c.before, "after": after, "rule": c.rule,
                                      "reason": c.reason}));
        }
    }

    /// Sends compared so far.
    pub fn evaluated(&self) -> u64 {
        self.evaluated
    }

    /// The report: `{"module", "evaluated", "same", "changed", "changes", "examples",
    /// "errors", "fuel": {"p50", "max"}}`.
    pub fn report(mut self, module: &str) -> Value {
        self.fuel.sort_unstable();
        let p50 = self.fuel.get(self.fuel.len().saturating_sub(1) / 2).copied().unwrap_or(0);
        let changed: u64 = self.changes.values().sum();
        json!({
            "module": module, "evaluated": self.evaluated, "same": self.same, "changed": changed,
            "changes": self.changes, "examples": self.examples, "errors": self.errors,
            "fuel": {"p50": p50, "max": self.fuel.last().copied().unwrap_or(0)},
        })
    }
}

/// A trace entry as the message log keeps it (`TraceEntry`).
struct Traced {
    stage: String,
    module: String,
    version: String,
    sha256: String,
    decision: String,
    code: Option<String>,
    shadow: bool,
    fuel: u64,
}

fn traced(trace: Option<&str>) -> Vec<Traced> {
    let Some(Ok(Value::Array(entries))) = trace.map(serde_json::from_str::<Value>) else {
        return Vec::new();
    };
    entries
        .iter()
        .map(|e| Traced {
            stage: e["stage"].as_str().unwrap_or_default().to_string(),
            module: e["module"].as_str().unwrap_or_default().to_string(),
            version: e["version"].as_str().unwrap_or("?").to_string(),
            sha256: e["sha256"].as_str().unwrap_or_default().to_string(),
            decision: e["decision"].as_str().unwrap_or_default().to_string(),
            code: e["code"].as_str().map(str::to_string),
            shadow: e["mode"] == "shadow",
            fuel: e["fuel"].as_u64().unwrap_or(0),
        })
        .collect()
}

fn verdict_name(decision: &str) -> &'static str {
    match decision {
        "deny" => "deny",
        "review" => "review",
        _ => "allow",
    }
}

/// What the send became: `allow`, `review` (held by a policy), or `deny`.
fn final_decision(row: &KeptInput, trace: &[Traced]) -> &'static str {
    if row.decision == "allowed" && row.status != "refused" {
        return "allow";
    }
    let deciding = trace.iter().filter(|e| !e.shadow);
    let review = row.error_code.as_deref() == Some("policy_violation")
        && deciding.clone().any(|e| e.decision == "review")
        && !deciding.clone().any(|e| e.decision == "deny");
    if review { "review" } else { "deny" }
}

/// "Before" for a module named `name`, and whether the send met a module of that name.
fn before(row: &KeptInput, trace: &[Traced], name: &str) -> (&'static str, bool) {
    let mine: Vec<&Traced> = trace.iter().filter(|e| !e.shadow && e.module == name).collect();
    if mine.is_empty() {
        return (final_decision(row, trace), false);
    }
    let first = mine.iter().map(|e| e.decision.as_str()).find(|d| *d != "allow");
    let verdict = match first {
        None => "allow",
        // A fault decided by the fail mode: what the send became.
        Some("fault") => final_decision(row, trace),
        Some(d) => verdict_name(d),
    };
    (verdict, true)
}

/// Whether the send reached the content stage.
fn reached_content(row: &KeptInput, trace: &[Traced]) -> bool {
    trace.iter().any(|e| e.stage == "content") || (row.decision == "allowed" && row.status != "refused")
}

/// Asks `module` about one kept send.
fn backtest_one(module: &LoadedModule, limits: super::sandbox::Limits, row: &KeptInput) -> Option<Compared> {
    let mut ctx = Context::from_json(&row.context).ok()?;
    let trace = traced(row.policy_trace.as_deref());
    let (before, met) = before(row, &trace, &module.metadata.name);
    let mut stages = vec![Stage::Purpose];
    if reached_content(row, &trace) {
        stages.push(Stage::Content);
    }
    let mut fuel = 0;
    let mut verdict = Verdict::Allow;
    for stage in stages.into_iter().filter(|s| module.at_stage(*s)) {
        ctx.stage = stage;
        let evaluation = module.evaluate(&module.convert(&ctx), limits);
        fuel += evaluation.fuel;
        match evaluation.outcome {
            Ok(Verdict::Allow) => {}
            Ok(v) => {
                verdict = v;
                break;
            }
            Err(_) => {
                return Some(Compared { log_id: row.log_id, before, after: None, rule: None, reason: None, fuel });
            }
        }
    }
    let mine = verdict_name(verdict.name());
    let after = if met { mine } else { stricter(before, mine) };
    let (rule, reason) = match &verdict {
        Verdict::Allow => (None, None),
        Verdict::Deny { code, reason, .. } => (Some(code.clone()), Some(reason.clone())),
        Verdict::Review { reason, .. } => (None, Some(reason.clone())),
    };
    Some(Compared { log_id: row.log_id, before, after: Some(after), rule, reason, fuel })
}

/// Backtests `module` on the kept inputs of `window`; `progress` hears the count after
/// each page.
pub async fn backtest(
    store: &Store,
    host: &Arc<PolicyHost>,
    module: Arc<LoadedModule>,
    window: &Window,
    mut progress: impl FnMut(u64),
) -> Result<Value, ToolError> {
    let mut query = PolicyInputQuery {
        from: store.first_log_id_since(now_ms().saturating_sub(window.since_ms)).await?,
        before: i64::MAX,
        customer_id: window.customer.clone(),
        limit: PAGE,
    };
    let mut tally = Tally::default();
    let limits = host.limits();
    while tally.evaluated() < window.limit {
        query.limit = PAGE.min((window.limit - tally.evaluated()) as i64);
        let rows = store.policy_inputs_page(&query).await?;
        let Some(last) = rows.last() else { break };
        query.before = last.log_id;
        let module = module.clone();
        let compared = tokio::task::spawn_blocking(move || {
            rows.iter().filter_map(|row| backtest_one(&module, limits, row)).collect::<Vec<_>>()
        })
        .await
        .map_err(|e| ToolError::Invalid(format!("the backtest panicked: {e}")))?;
        compared.into_iter().for_each(|c| tally.add(c));
        progress(tally.evaluated());
    }
    Ok(tally.report(&module.label()))
}

/// Compares the shadow verdicts of `name` in the traces of `window` with what decided.
/// Only the running shadow's verdicts count when one runs (`sha256`: its hash).
pub async fn shadow(store: &Store, name: &str, window: &Window) -> Result<Value, ToolError> {
    let trial = store.policy_trial(name).await?;
    let sha = trial.as_ref().map(|t| t.sha256[..12].to_string());
    let mut label = trial.as_ref().map(|t| format!("{}@{}", t.name, t.version));
    // Nothing before the running shadow was installed carries its verdicts.
    let since = now_ms().saturating_sub(window.since_ms).max(trial.as_ref().map_or(0, |t| t.installed_at));
    let mut query = PolicyInputQuery {
        from: store.first_log_id_since(since).await?,
        before: i64::MAX,
        customer_id: window.customer.clone(),
        limit: PAGE,
    };
    let mut tally = Tally::default();
    'pages: loop {
        let rows = store.shadow_traced_page(&query).await?;
        let Some(last) = rows.last() else { break };
        query.before = last.log_id;
        for row in &rows {
            let trace = traced(row.policy_trace.as_deref());
            let shadows: Vec<&Traced> = trace
                .iter()
                .filter(|e| e.shadow && e.module == name && sha.as_ref().is_none_or(|s| *s == e.sha256))
                .collect();
            if shadows.is_empty() {
                continue;
            }
            if label.is_none() {
                label = shadows.last().map(|e| format!("{name}@{}", e.version));
            }
            let (before, met) = before(row, &trace, name);
            let fuel = shadows.iter().map(|e| e.fuel).sum();
            let first = shadows.iter().find(|e| e.decision != "allow");
            let compared = match first {
                Some(e) if e.decision == "fault" => {
                    Compared { log_id: row.log_id, before, after: None, rule: None, reason: None, fuel }
                }
                _ => {
                    let mine = first.map_or("allow", |e| verdict_name(&e.decision));
                    let after = if met { mine } else { stricter(before, mine) };
                    let rule = first.and_then(|e| e.code.clone());
                    Compared { log_id: row.log_id, before, after: Some(after), rule, reason: None, fuel }
                }
            };
            tally.add(compared);
            if tally.evaluated() >= window.limit {
                break 'pages;
            }
        }
    }
    Ok(tally.report(label.as_deref().unwrap_or(name)))
}
