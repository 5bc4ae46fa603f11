//! A policy module: the artifact, loading it, evaluating it, running its fixtures.
//!
//! The artifact is one file: a WebAssembly component whose top-level custom section
//! `gateway-policy` holds its metadata (name, version, stages, interface version) and
//! its fixtures, as JSON. `gateway policy build` makes it from the core module cargo
//! builds: it reads the metadata the SDK's macro stamped into the core module,
//! componentizes it in-process (wit-component, so authors need no other tool), and
//! appends the section. One file is what an author drops into the policies directory
//! or uploads, and it carries the tests that gate it.
//!
//! Loading checks, in order, and stops at the first failure: size; a component, not a
//! core module; metadata; the declared interface version is one this gateway supports
//! (before compiling, as Zed does); compile; imports are types only (no functions: no
//! WASI, no host calls); the evaluator export matches the declared version; the
//! bindings type-check; every embedded fixture passes in the sandbox. Only then is the
//! module live.

use super::sandbox::{self, Fault, Limits, Sandbox};
use super::wit::{self, Converted, Pre};
use gateway_policy_model::{Context, Fixture, FixtureResult, Report, Stage, Verdict, parse_fixtures};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::time::Instant;
use wasmtime::Engine;
use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, Linker};

/// Name of the custom section with a module's metadata and fixtures.
pub const METADATA_SECTION: &str = "gateway-policy";

/// What a module says about itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    /// Lowercase letters, digits, `-` and `_`; a module of the same name replaces it.
    pub name: String,
    pub version: String,
    /// Comma-separated stages it is asked at: `purpose`, `content`.
    pub stages: String,
    /// The interface version it was built against.
    pub interface: String,
    /// Whether its decisions read the pacing counters. A module that says no is given
    /// none (zeros), so its verdict cannot depend on them, and is not asked again once
    /// a send's place among concurrent sends is known (see `PolicyEngine::recheck`).
    /// Absent in a module built before it existed: yes.
    #[serde(default = "yes", skip_serializing_if = "is_yes")]
    pub reads_counters: bool,
    /// Its fixtures (only in a built artifact).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fixtures: Vec<Fixture>,
}

fn yes() -> bool {
    true
}

fn is_yes(b: &bool) -> bool {
    *b
}

impl Metadata {
    /// Metadata for a module that carries none: version 0.0.0, both stages, the
    /// newest interface this gateway supports, no fixtures.
    pub fn unstamped(name: String) -> Metadata {
        Metadata {
            name,
            version: "0.0.0".into(),
            stages: "purpose,content".into(),
            interface: wit::SUPPORTED[wit::SUPPORTED.len() - 1].to_string(),
            reads_counters: true,
            fixtures: Vec::new(),
        }
    }

    /// The stages, parsed.
    pub fn stage_list(&self) -> Result<Vec<Stage>, String> {
        let stages: Vec<Stage> = self
            .stages
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| Stage::parse(s).ok_or_else(|| format!("unknown stage {s:?} (purpose or content)")))
            .collect::<Result<_, _>>()?;
        if stages.is_empty() {
            return Err("the module names no stage".into());
        }
        Ok(stages)
    }

    /// Checks the fields that need no compiling.
    pub fn check(&self) -> Result<(), LoadError> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !name_ok {
            return Err(LoadError::Metadata(format!(
                "name {:?} must be 1 to 64 lowercase letters, digits, '-' or '_'",
                self.name
            )));
        }
        if self.version.is_empty() || self.version.len() > 32 || self.version.contains(char::is_whitespace) {
            return Err(LoadError::Metadata(format!("version {:?} is not a version", self.version)));
        }
        self.stage_list().map_err(LoadError::Metadata)?;
        if !wit::SUPPORTED.contains(&self.interface.as_str()) {
            return Err(LoadError::UnsupportedInterface {
                found: self.interface.clone(),
                supported: wit::SUPPORTED.join(", "),
            });
        }
        Ok(())
    }
}

/// Why a module was refused.
#[derive(Clone, Debug, thiserror::Error)]
pub enum LoadError {
    #[error("the module is {size} bytes; the limit is {max}")]
    TooLarge { size: usize, max: usize },
    #[error("not a WebAssembly component or module")]
    NotWasm,
    #[error("a core module, not a component: build it with `gateway policy build IN.wasm -o OUT.wasm`")]
    CoreModule,
    #[error("the module carries no `gateway-policy` metadata: build it with `gateway policy build`")]
    NoMetadata,
    #[error("bad metadata: {0}")]
    Metadata(String),
    #[error("interface version {found} is not supported by this gateway (supported: {supported})")]
    UnsupportedInterface { found: String, supported: String },
    #[error("does not compile: {0}")]
    Compile(String),
    #[error("imports functions, which policies may not: {0} (a policy imports only the interface's types)")]
    Imports(String),
    #[error("exports no evaluator of interface {declared} (it exports: {found})")]
    NoEvaluator { declared: String, found: String },
    #[error("does not match interface {version}, or the sandbox's limits: {reason}")]
    TypeCheck { version: String, reason: String },
    #[error("carries no fixtures: build it with `gateway policy build --fixtures FILE`")]
    NoFixtures,
    #[error("fails its fixtures ({summary}): {first}")]
    Fixtures { summary: String, first: String },
    #[error("building the component: {0}")]
    Componentize(String),
}

/// The result of one evaluation.
#[derive(Clone, Debug)]
pub struct Evaluation {
    pub outcome: Result<Verdict, Fault>,
    pub fuel: u64,
    pub micros: u64,
}

/// A compiled, checked module, ready to evaluate.
pub struct LoadedModule {
    pub metadata: Metadata,
    pub stages: Vec<Stage>,
    /// Hex SHA-256 of the artifact's bytes.
    pub sha256: String,
    pub size: usize,
    /// Where it came from: `bundled`, or the file's path.
    pub source: String,
    /// Milliseconds the compile (or cache load) took.
    pub compile_ms: u64,
    /// An evaluation of it used more than [`SLOW_FUEL`] (or ran out): from then on the
    /// host runs it where a long evaluation cannot hold up other requests.
    slow: std::sync::atomic::AtomicBool,
    engine: Engine,
    pre: Pre,
}

/// Fuel above which an evaluation counts as slow (about a millisecond; the default
/// policies use under 600,000 on the longest message the gateway accepts).
pub const SLOW_FUEL: u64 = 1_000_000;

impl std::fmt::Debug for LoadedModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{} ({})", self.metadata.name, self.metadata.version, self.short_hash())
    }
}

impl LoadedModule {
    /// Compiles and checks `bytes`. With `require_fixtures`, the module must carry
    /// fixtures and pass every one before it is returned.
    pub fn load(
        engine: &Engine,
        bytes: &[u8],
        source: &str,
        limits: Limits,
        max_bytes: usize,
        require_fixtures: bool,
    ) -> Result<LoadedModule, LoadError> {
        if bytes.len() > max_bytes {
            return Err(LoadError::TooLarge { size: bytes.len(), max: max_bytes });
        }
        if wasmparser::Parser::is_core_wasm(bytes) {
            return Err(LoadError::CoreModule);
        }
        if !wasmparser::Parser::is_component(bytes) {
            return Err(LoadError::NotWasm);
        }
        let metadata = read_metadata(bytes)?.ok_or(LoadError::NoMetadata)?;
        metadata.check()?;
        let started = Instant::now();
        let component = Component::new(engine, bytes).map_err(|e| LoadError::Compile(format!("{e:#}")))?;
        let compile_ms = started.elapsed().as_millis() as u64;
        check_imports(engine, &component)?;
        let exports: Vec<String> = component.component_type().exports(engine).map(|(n, _)| n.to_string()).collect();
        if !exports.contains(&wit::evaluator_export(&metadata.interface)) {
            return Err(LoadError::NoEvaluator { declared: metadata.interface.clone(), found: exports.join(", ") });
        }
        let linker = Linker::<Sandbox>::new(engine);
        let pre = Pre::new(&metadata.interface, &component, &linker)
            .map_err(|reason| LoadError::TypeCheck { version: metadata.interface.clone(), reason })?;
        let mut store = sandbox::store(engine, limits).map_err(|f| LoadError::Compile(f.to_string()))?;
        pre.check(&mut store).map_err(|reason| LoadError::TypeCheck { version: metadata.interface.clone(), reason })?;
        drop(store);
        let module = LoadedModule {
            stages: metadata.stage_list().map_err(LoadError::Metadata)?,
            metadata,
            sha256: hex::encode(Sha256::digest(bytes)),
            size: bytes.len(),
            source: source.to_string(),
            compile_ms,
            slow: std::sync::atomic::AtomicBool::new(false),
            engine: engine.clone(),
            pre,
        };
        if require_fixtures {
            if module.metadata.fixtures.is_empty() {
                return Err(LoadError::NoFixtures);
            }
            let report = module.run_fixtures(&module.metadata.fixtures, limits);
            if report.failed() > 0 {
                let first = report.results.iter().find(|r| r.outcome.is_err()).map(|r| r.to_string());
                return Err(LoadError::Fixtures { summary: report.summary(), first: first.unwrap_or_default() });
            }
        }
        Ok(module)
    }

    /// `name@version`, as named in decisions and logs.
    pub fn label(&self) -> String {
        format!("{}@{}", self.metadata.name, self.metadata.version)
    }

    /// The first 12 hex digits of the hash.
    pub fn short_hash(&self) -> &str {
        &self.sha256[..12]
    }

    /// Whether the module is asked at `stage`.
    pub fn at_stage(&self, stage: Stage) -> bool {
        self.stages.contains(&stage)
    }

    /// The context converted for this module's interface version (its counters zero
    /// when the module does not read them).
    pub fn convert(&self, ctx: &Context) -> Converted {
        self.pre.convert(ctx, self.metadata.reads_counters)
    }

    /// Whether it is given the pacing counters (`Metadata::reads_counters`).
    pub fn reads_counters(&self) -> bool {
        self.metadata.reads_counters
    }

    /// The interface version of its bindings.
    pub fn interface(&self) -> &'static str {
        self.pre.version()
    }

    /// Evaluates one context on a fresh instance.
    pub fn evaluate(&self, ctx: &Converted, limits: Limits) -> Evaluation {
        let started = Instant::now();
        let mut store = match sandbox::store(&self.engine, limits) {
            Ok(store) => store,
            Err(fault) => return Evaluation { outcome: Err(fault), fuel: 0, micros: 0 },
        };
        let outcome = match self.pre.call(&mut store, ctx) {
            Ok(verdict) => check_verdict(verdict),
            Err((error, instantiated)) => Err(sandbox::classify(&error, &store, limits, instantiated)),
        };
        let fuel = sandbox::fuel_used(&store, limits);
        drop(store);
        if fuel > SLOW_FUEL {
            self.slow.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        Evaluation { outcome, fuel, micros: started.elapsed().as_micros() as u64 }
    }

    /// Whether an evaluation of it has been slow.
    pub fn is_slow(&self) -> bool {
        self.slow.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Runs fixtures in the sandbox (each within its own `max_fuel`, if it has one).
    pub fn run_fixtures(&self, fixtures: &[Fixture], limits: Limits) -> Report {
        let results = fixtures
            .iter()
            .map(|f| {
                let e = self.evaluate(&self.convert(&f.context), limits);
                let outcome = match &e.outcome {
                    Ok(verdict) => f.expect.check(verdict).and_then(|()| match f.max_fuel {
                        Some(max) if e.fuel > max => Err(format!("used {} fuel, more than its max_fuel {max}", e.fuel)),
                        _ => Ok(()),
                    }),
                    Err(fault) => Err(format!("the module {fault}")),
                };
                FixtureResult { name: f.name.clone(), outcome, fuel: Some(e.fuel) }
            })
            .collect();
        Report { results }
    }
}

/// A verdict the gateway can pass on: a deny code of 1 to 64 of `[a-z0-9_.-]`, a
/// reason of 1 to 1,000 characters, a risk score of at most 100.
fn check_verdict(verdict: Verdict) -> Result<Verdict, Fault> {
    let (code, reason, risk) = match &verdict {
        Verdict::Allow => return Ok(verdict),
        Verdict::Deny { code, reason, risk_score } => (Some(code), reason, *risk_score),
        Verdict::Review { reason, risk_score } => (None, reason, *risk_score),
    };
    if let Some(code) = code {
        let ok = !code.is_empty()
            && code.len() <= 64
            && code.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b));
        if !ok {
            return Err(Fault::BadAnswer(format!("deny code {:?}", code.chars().take(80).collect::<String>())));
        }
    }
    if reason.trim().is_empty() || reason.chars().count() > 1000 {
        return Err(Fault::BadAnswer("the reason must be 1 to 1000 characters".into()));
    }
    if risk > 100 {
        return Err(Fault::BadAnswer(format!("risk score {risk} is over 100")));
    }
    Ok(verdict)
}

/// Refuses any import that is not an instance of types only (a world's `use` of the
/// interface's types imports `gateway:policy/types`, which holds no functions).
fn check_imports(engine: &Engine, component: &Component) -> Result<(), LoadError> {
    let refused: Vec<String> = component
        .component_type()
        .imports(engine)
        .filter(|(_, item)| match &item.ty {
            ComponentItem::ComponentInstance(instance) => {
                !instance.exports(engine).all(|(_, e)| matches!(e.ty, ComponentItem::Type(_)))
            }
            ComponentItem::Type(_) => false,
            _ => true,
        })
        .map(|(name, _)| name.to_string())
        .collect();
    if refused.is_empty() { Ok(()) } else { Err(LoadError::Imports(refused.join(", "))) }
}

/// A custom section: its bytes' range (header included) and its data.
type Section<'a> = (std::ops::Range<usize>, &'a [u8]);

/// The top-level custom sections named `name` of a module or component.
fn top_level_sections<'a>(bytes: &'a [u8], name: &str) -> Result<Vec<Section<'a>>, String> {
    let mut found = Vec::new();
    let mut depth = 0usize;
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        match payload.map_err(|e| format!("unreadable WebAssembly: {e}"))? {
            wasmparser::Payload::ModuleSection { .. } | wasmparser::Payload::ComponentSection { .. } => depth += 1,
            wasmparser::Payload::End(_) => depth = depth.saturating_sub(1),
            wasmparser::Payload::CustomSection(reader) if depth == 0 && reader.name() == name => {
                let body = reader.range();
                let start = body.start - 1 - leb128_len(body.len());
                found.push((start..body.end, reader.data()));
            }
            _ => {}
        }
    }
    Ok(found)
}

fn leb128_len(mut n: usize) -> usize {
    let mut len = 1;
    while n >= 0x80 {
        n >>= 7;
        len += 1;
    }
    len
}

/// The metadata of a module or component, if it has the section.
pub fn read_metadata(bytes: &[u8]) -> Result<Option<Metadata>, LoadError> {
    let sections = top_level_sections(bytes, METADATA_SECTION).map_err(LoadError::Metadata)?;
    let Some((_, data)) = sections.last() else {
        return Ok(None);
    };
    serde_json::from_slice(data).map(Some).map_err(|e| LoadError::Metadata(format!("not valid JSON: {e}")))
}

/// `bytes` with every top-level `gateway-policy` section replaced by one holding
/// `metadata` (appended at the end).
pub fn with_metadata(bytes: &[u8], metadata: &Metadata) -> Result<Vec<u8>, LoadError> {
    let sections = top_level_sections(bytes, METADATA_SECTION).map_err(LoadError::Metadata)?;
    let mut out = Vec::with_capacity(bytes.len() + 1024);
    let mut at = 0;
    for (range, _) in sections {
        out.extend_from_slice(&bytes[at..range.start]);
        at = range.end;
    }
    out.extend_from_slice(&bytes[at..]);
    let data = serde_json::to_vec(metadata).map_err(|e| LoadError::Metadata(e.to_string()))?;
    let mut body = Vec::with_capacity(data.len() + 32);
    leb128(&mut body, METADATA_SECTION.len());
    body.extend_from_slice(METADATA_SECTION.as_bytes());
    body.extend_from_slice(&data);
    out.push(0);
    leb128(&mut out, body.len());
    out.extend_from_slice(&body);
    Ok(out)
}

fn leb128(out: &mut Vec<u8>, mut n: usize) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// A component from a core module built with the SDK (or an existing component), with
/// its metadata read from the SDK's section unless `overrides` say otherwise.
pub fn componentize(bytes: &[u8]) -> Result<(Vec<u8>, Option<Metadata>), LoadError> {
    if wasmparser::Parser::is_component(bytes) {
        return Ok((bytes.to_vec(), read_metadata(bytes)?));
    }
    if !wasmparser::Parser::is_core_wasm(bytes) {
        return Err(LoadError::NotWasm);
    }
    let metadata = read_metadata(bytes)?;
    let component = wit_component::ComponentEncoder::default()
        .module(bytes)
        .and_then(|e| e.validate(true).encode())
        .map_err(|e| LoadError::Componentize(format!("{e:#}")))?;
    Ok((component, metadata))
}

/// Reads a fixture file's text.
pub fn fixtures_from_json(json: &str) -> Result<Vec<Fixture>, LoadError> {
    parse_fixtures(json).map_err(LoadError::Metadata)
}
