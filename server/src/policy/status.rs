//! What a gateway's policy host reports it runs: written to the store every few
//! seconds (`policy list`, the operator console) and shown by the control handle.

use serde::Serialize;

/// One live module, as `policy list` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct ModuleStatus {
    pub name: String,
    pub version: String,
    pub sha256: String,
    pub stages: Vec<String>,
    pub interface: String,
    /// `bundled`, or the file it was loaded from.
    pub source: String,
    pub size: usize,
    pub fixtures: usize,
    /// The version `policy rollback` would bring back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// Live by a rollback, until its file changes.
    pub pinned: bool,
    /// `live`, `shadow`, or `canary N %` (absent in a report of an older gateway: live).
    #[serde(default = "live")]
    pub mode: String,
    /// The customers it is limited to, if any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub customers: Vec<String>,
    /// The plans it is limited to, if any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plans: Vec<String>,
}

fn live() -> String {
    "live".into()
}

/// A module that was refused, with why.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct Refusal {
    pub source: String,
    pub sha256: String,
    pub error: String,
    pub at: i64,
}

/// What a gateway's policy host runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct HostStatus {
    pub generation: u64,
    pub modules: Vec<ModuleStatus>,
    /// Files in the policies directory that are not live, with why.
    pub refused: Vec<Refusal>,
    pub last_reload_at: Option<i64>,
    /// The last `policy reload`/`rollback` command this gateway carried out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_command: Option<CommandResult>,
}

/// The outcome of a command.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct CommandResult {
    pub id: i64,
    pub command: String,
    pub ok: bool,
    pub message: String,
}
