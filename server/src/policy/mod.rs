//! The policy engine: the send pipeline asks it for a decision at two stages, `purpose`
//! (before suppression) and `content` (after it).
//!
//! The engine is a host for sandboxed WebAssembly components ([`host::PolicyHost`]):
//! policy authors write rules against the `gateway-policy` SDK (`policies/sdk`), the
//! gateway bundles three (`purpose`, `content`, `pacing`, built from `policies/`) and
//! loads more, or newer versions, from the policies directory while it runs
//! ([`reload`]). Every module asked at a stage is evaluated on a fresh instance; the
//! first deny decides, else the first review, else allow; every module's verdict,
//! fuel and time go to the message log ([`TraceEntry`]).
//!
//! The trait stays small so the pipeline does not depend on wasmtime, and tests can
//! plug in a plain Rust engine.

pub mod backtest;
pub mod bundled;
pub mod host;
pub mod inputs;
pub mod module;
pub mod reload;
pub mod rollout;
pub mod sandbox;
pub mod status;
mod stored;
pub mod tools;
pub mod wit;

pub use gateway_policy_model::{Context, Stage, Verdict};

use serde::Serialize;

/// A stage's decision.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    Allow,
    /// Refuse. `fault`: no module decided this; a module failed and the fail mode is
    /// `deny` (always 403 `policy_violation`, whatever the stage).
    Deny {
        policy: String,
        code: String,
        reason: String,
        risk_score: u8,
        fault: bool,
    },
    /// Refuse and queue for an operator's review.
    Review {
        policy: String,
        reason: String,
        risk_score: u8,
    },
}

/// One module's part in a decision, as written to the message log.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceEntry {
    pub stage: &'static str,
    pub module: String,
    pub version: String,
    /// The first 12 hex digits of the module's SHA-256.
    pub sha256: String,
    /// `allow`, `deny`, `review`, or `fault`.
    pub decision: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub risk: Option<u8>,
    /// The fault's kind (`out_of_fuel`, `out_of_memory`, `trap`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault: Option<&'static str>,
    pub fuel: u64,
    /// Microseconds the evaluation took (instantiation included).
    pub us: u64,
    /// `shadow` (evaluated beside the live module, never deciding), `canary` or
    /// `scoped` (deciding instead of the live module of its name, or beside the others
    /// under a new name); absent for a live module (see `rollout`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<&'static str>,
}

/// What a stage decided, and how.
#[derive(Clone, Debug, PartialEq)]
pub struct StageOutcome {
    pub decision: Decision,
    pub trace: Vec<TraceEntry>,
}

impl StageOutcome {
    /// Allowed with nobody asked.
    pub fn allow() -> StageOutcome {
        StageOutcome { decision: Decision::Allow, trace: Vec::new() }
    }
}

/// Decides sends.
#[async_trait::async_trait]
pub trait PolicyEngine: Send + Sync + 'static {
    /// Decides `ctx.stage` of one send.
    async fn evaluate(&self, ctx: &Context) -> StageOutcome;

    /// Decides `ctx.stage` again, after the send's place among concurrent sends gave
    /// it other counters. Only a module that reads them can decide otherwise: the
    /// others were given none (`Metadata::reads_counters`), so their verdict stands.
    async fn recheck(&self, ctx: &Context) -> StageOutcome {
        self.evaluate(ctx).await
    }
}
