//! The sandbox every policy evaluation runs in: one wasmtime `Engine` for the host, a
//! fresh `Store` and instance per evaluation, a fuel budget, a memory cap, and no
//! imports. A module can only compute: it cannot read a clock, a file or the network,
//! cannot keep state between sends (state would leak between tenants, and a trap
//! would poison a reused instance), and cannot run or grow without bound.
//!
//! Choices, measured in `../shared/reference/wasm-policies.md`:
//! - fuel rather than epochs: deterministic (CI counts the fuel production counts, so a
//!   fixture can assert a budget) and no ticker thread; about the same cost;
//! - the pooling allocator with 2 MiB kept resident and `PAGEMAP_SCAN` (Linux ≥ 6.7,
//!   `Auto` elsewhere): instantiation in a few µs, and only dirty pages reset;
//! - `parallel_compilation(false)`: a reload must not take both cores from requests;
//! - the wasmtime cache, so a restart loads compiled code instead of recompiling.

use std::path::Path;
use wasmtime::{
    Cache, CacheConfig, Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ResourceLimiter,
    Store, Trap,
};

/// Upper bound of a module's linear memory slot; a module declaring more is refused at
/// load (the per-evaluation cap, `memory_bytes`, is lower).
pub const MAX_MEMORY_SLOT: usize = 64 << 20;

/// Limits of one evaluation.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub fuel: u64,
    pub memory_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { fuel: 10_000_000, memory_bytes: 16 << 20 }
    }
}

/// Why an evaluation produced no verdict. Each is contained: the host carries on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Fault {
    #[error("ran out of fuel (budget {0})")]
    OutOfFuel(u64),
    #[error("tried to grow its memory past {0} bytes")]
    OutOfMemory(usize),
    #[error("trapped: {0}")]
    Trap(String),
    #[error("could not be instantiated: {0}")]
    Instantiate(String),
    #[error("answered an invalid decision: {0}")]
    BadAnswer(String),
}

impl Fault {
    /// Short name for logs and traces.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::OutOfFuel(_) => "out_of_fuel",
            Fault::OutOfMemory(_) => "out_of_memory",
            Fault::Trap(_) => "trap",
            Fault::Instantiate(_) => "instantiate",
            Fault::BadAnswer(_) => "bad_answer",
        }
    }
}

/// The data of one evaluation's store: its memory limit, and whether it was hit.
pub struct Sandbox {
    memory_bytes: usize,
    memory_refused: bool,
}

impl Sandbox {
    fn new(memory_bytes: usize) -> Sandbox {
        Sandbox { memory_bytes, memory_refused: false }
    }
}

impl ResourceLimiter for Sandbox {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes {
            self.memory_refused = true;
            // An error (not `Ok(false)`) traps at once instead of handing the guest a -1.
            return Err(wasmtime::Error::msg(format!("memory limit of {} bytes", self.memory_bytes)));
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 10_000)
    }

    fn instances(&self) -> usize {
        16
    }

    fn tables(&self) -> usize {
        16
    }

    fn memories(&self) -> usize {
        4
    }
}

/// The engine of a policy host: component model, fuel, pooling with `slots` instance
/// slots (at least the evaluations that can run at once), and the compiled-code cache
/// in `cache_dir` when given.
pub fn engine(slots: u32, cache_dir: Option<&Path>) -> Result<Engine, String> {
    let mut config = Config::new();
    config.wasm_component_model(true).consume_fuel(true).parallel_compilation(false);
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(slots)
        .total_core_instances(slots * 2)
        .total_memories(slots)
        .total_tables(slots * 2)
        .max_memory_size(MAX_MEMORY_SLOT)
        .linear_memory_keep_resident(2 << 20)
        .table_keep_resident(2 << 20)
        .pagemap_scan(Enabled::Auto);
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    if let Some(dir) = cache_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating the module cache {}: {e}", dir.display()))?;
        let dir = dir.canonicalize().map_err(|e| format!("module cache {}: {e}", dir.display()))?;
        let mut cache = CacheConfig::new();
        cache.with_directory(&dir);
        let cache = Cache::new(cache).map_err(|e| format!("module cache {}: {e:#}", dir.display()))?;
        config.cache(Some(cache));
    }
    Engine::new(&config).map_err(|e| format!("creating the policy engine: {e:#}"))
}

/// A fresh store with `limits`.
pub fn store(engine: &Engine, limits: Limits) -> Result<Store<Sandbox>, Fault> {
    let mut store = Store::new(engine, Sandbox::new(limits.memory_bytes));
    store.limiter(|s| s);
    store.set_fuel(limits.fuel).map_err(|e| Fault::Instantiate(format!("{e:#}")))?;
    Ok(store)
}

/// Fuel used so far in `store`.
pub fn fuel_used(store: &Store<Sandbox>, limits: Limits) -> u64 {
    limits.fuel.saturating_sub(store.get_fuel().unwrap_or(0))
}

/// The fault behind an error of `call`, given the store it ran in.
pub fn classify(error: &wasmtime::Error, store: &Store<Sandbox>, limits: Limits, instantiated: bool) -> Fault {
    if store.data().memory_refused {
        return Fault::OutOfMemory(limits.memory_bytes);
    }
    match error.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => Fault::OutOfFuel(limits.fuel),
        Some(trap) => Fault::Trap(trap.to_string()),
        None if !instantiated => Fault::Instantiate(format!("{error:#}")),
        None => Fault::Trap(format!("{error:#}")),
    }
}
