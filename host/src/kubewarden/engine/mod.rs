//! Evaluates the policy wasm the way Kubewarden's policy-server does: one
//! module compiled once, and a fresh instance for every request, so a
//! trapped or timed-out evaluation cannot leak state (or locks) into the
//! next. An epoch ticker stops a runaway policy.
//!
//! The waPC host is ours ([`wapc`]), on wasmtime directly: the module is
//! linked once into an `InstancePre` (the WASI and waPC imports resolved),
//! so a request costs an instantiation from the pooling allocator and
//! nothing else, and every pointer the guest hands the host is checked.
//! Every call takes one of the pool's instances from the engine's own
//! count of them first ([`instances`]), and waits for one rather than
//! asking the pool for more than it holds.

mod call;
mod instances;
mod wapc;

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use anyhow::{anyhow, Context as _, Result};
use config_snapshot_policy::host::host_error::{Code, HostError};
use serde_json::Value;
use wasmtime::{InstancePre, Linker, Module, Store, Trap};
use wasmtime_wasi::WasiCtxBuilder;

pub use call::{CallFailure, CallHandler};
use instances::Instances;
pub use instances::Lane;
use wapc::{Budget, Guest, OverBudget, ProtocolError};

/// Why a call of the policy gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The pool could not make an instance. Never for want of a slot: a
    /// call waits for one ([`instances`]).
    #[error("instantiating the policy: {0}")]
    Instantiate(String),
    #[error("initialising the policy: {0}")]
    Init(String),
    /// Stopped by the epoch deadline: its instance is discarded.
    #[error("policy {function} ran past its deadline of {deadline:?} and was stopped")]
    Deadline { function: String, deadline: Duration },
    /// Its memory would have grown past the instance's limit.
    #[error("policy {function} needed more than its {limit} bytes of memory and was stopped")]
    Memory { function: String, limit: usize },
    #[error("policy {function} failed: {message}")]
    Guest { function: String, message: String },
}

/// How much one engine may run at once: the instances alive together, and
/// each one's memory. Their product is what the policy can take of the
/// process's memory (serve sizes it to its container's limit). Calls past
/// `instances` wait for one to end; of two or more, one is kept for
/// [`Lane::Kept`] calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub instances: u32,
    pub memory_bytes: usize,
}

impl Default for Limits {
    /// Far above what a 1.5 MiB object needs, and 16 at once: for the CLI
    /// and tests. serve takes its own from its flags.
    fn default() -> Limits {
        Limits {
            instances: 16,
            memory_bytes: 64 << 20,
        }
    }
}

/// Memory kept resident per pool slot between instances.
const KEEP_RESIDENT_BYTES: usize = 4 << 20;

/// Length of one epoch tick.
const TICK: Duration = Duration::from_millis(10);

pub struct Engine {
    engine: wasmtime::Engine,
    pre: InstancePre<Guest>,
    ticks: u64,
    timeout: Duration,
    limits: Limits,
    /// The pool's instances, counted before each is asked for.
    instances: Instances,
}

impl Engine {
    /// Deadline for one `validate` call. The API server's webhook timeout is
    /// 10 s by default; we answer well inside it.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

    pub fn load(path: &Path) -> Result<Engine> {
        let bytes = std::fs::read(path).with_context(|| format!("reading policy {}", path.display()))?;
        Engine::from_bytes(&bytes, Self::DEFAULT_TIMEOUT)
    }

    pub fn from_bytes(bytes: &[u8], timeout: Duration) -> Result<Engine> {
        Engine::compile(bytes, timeout, Limits::default())
    }

    /// Compiles `bytes` for an engine with these limits.
    pub fn compile(bytes: &[u8], timeout: Duration, limits: Limits) -> Result<Engine> {
        let engine = new_wasmtime_engine(limits)?;
        let module = Module::new(&engine, bytes).map_err(|e| anyhow!("compiling the policy: {e}"))?;
        Engine::from_module(engine, module, timeout, limits)
    }

    /// Loads a module precompiled by [`Engine::precompile`] (trusted input:
    /// our own cache, never user-supplied bytes).
    pub fn from_precompiled(bytes: &[u8], timeout: Duration) -> Result<Engine> {
        Engine::deserialize(bytes, timeout, Limits::default())
    }

    fn deserialize(bytes: &[u8], timeout: Duration, limits: Limits) -> Result<Engine> {
        let engine = new_wasmtime_engine(limits)?;
        // SAFETY: the bytes come from `Module::serialize` with the same
        // wasmtime version and config, which wasmtime checks on load.
        let module = unsafe { Module::deserialize(&engine, bytes) }
            .map_err(|e| anyhow!("loading the precompiled policy: {e}"))?;
        Engine::from_module(engine, module, timeout, limits)
    }

    /// A precompiled module for `module`, stamped with the module's digest
    /// so that a stale one (another policy) is never run in its place.
    pub fn precompile_for(module: &[u8]) -> Result<Vec<u8>> {
        let mut out = precompiled_header(module).into_bytes();
        out.extend(Engine::precompile(module)?);
        Ok(out)
    }

    /// The engine for `module`, from `precompiled` when that was made for
    /// this very module by this wasmtime with this configuration (wasmtime
    /// checks the last two on load); else compiled here. Answers which.
    pub fn load_prepared(
        module: &[u8],
        precompiled: Option<&[u8]>,
        timeout: Duration,
        limits: Limits,
    ) -> Result<(Engine, String)> {
        let why = match precompiled.map(|file| file.strip_prefix(precompiled_header(module).as_bytes())) {
            None => "compiled at start".to_string(),
            Some(None) => "compiled at start: the precompiled module was made for another policy".to_string(),
            Some(Some(body)) => match Engine::deserialize(body, timeout, limits) {
                Ok(engine) => return Ok((engine, "precompiled".into())),
                Err(e) => format!("compiled at start: the precompiled module does not fit this engine ({e})"),
            },
        };
        Ok((Engine::compile(module, timeout, limits)?, why))
    }

    pub fn precompile(bytes: &[u8]) -> Result<Vec<u8>> {
        let engine = new_wasmtime_engine(Limits::default())?;
        let module = Module::new(&engine, bytes).map_err(|e| anyhow!("compiling the policy: {e}"))?;
        module.serialize().map_err(|e| anyhow!("serialising the module: {e}"))
    }

    fn from_module(engine: wasmtime::Engine, module: Module, timeout: Duration, limits: Limits) -> Result<Engine> {
        start_ticker(&engine);
        let mut linker: Linker<Guest> = Linker::new(&engine);
        wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |g: &mut Guest| &mut g.wasi)
            .map_err(|e| anyhow!("linking WASI: {e}"))?;
        wapc::add_to_linker(&mut linker).map_err(|e| anyhow!("linking waPC: {e}"))?;
        let pre = linker
            .instantiate_pre(&module)
            .map_err(|e| anyhow!("preparing the policy: {e}"))?;
        Ok(Engine {
            engine,
            pre,
            ticks: (timeout.as_millis() / TICK.as_millis()).max(1) as u64,
            timeout,
            limits,
            instances: Instances::new(limits.instances),
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Calls one guest function on a fresh instance of the shared lane.
    pub fn call(&self, function: &str, payload: &[u8], handler: Arc<dyn CallHandler>) -> Result<Vec<u8>, EngineError> {
        self.call_in(Lane::Shared, function, payload, handler)
    }

    /// Calls one guest function on a fresh instance of `lane`, waiting for
    /// one to be free. Blocking.
    pub fn call_in(
        &self,
        lane: Lane,
        function: &str,
        payload: &[u8],
        handler: Arc<dyn CallHandler>,
    ) -> Result<Vec<u8>, EngineError> {
        // Taken before the store, so given back after it: the store's drop
        // is what frees the pool's slot.
        let _instance = self.instances.take(lane);
        // No environment, no arguments, no files: the policy reads only the
        // clock and randomness (for its hash maps).
        let wasi = WasiCtxBuilder::new().build_p1();
        let budget = Budget {
            memory_bytes: self.limits.memory_bytes,
        };
        let mut store = Store::new(&self.engine, Guest::new(wasi, budget, function, payload, handler));
        store.limiter(|g| &mut g.budget);
        store.set_epoch_deadline(self.ticks);
        let failed = |e: wasmtime::Error, init: bool| self.failure(function, e, init);
        let instance = self
            .pre
            .instantiate(&mut store)
            .map_err(|e| EngineError::Instantiate(e.to_string()))?;
        // waPC's starts, in its order: a TinyGo `_start`, then `wapc_init`.
        for start in ["_start", "wapc_init"] {
            if let Ok(f) = instance.get_typed_func::<(), ()>(&mut store, start) {
                store.set_epoch_deadline(self.ticks);
                if let Err(e) = f.call(&mut store, ()) {
                    let exit = e.downcast_ref::<wasmtime_wasi::I32Exit>().map(|x| x.0);
                    if exit != Some(0) {
                        return Err(failed(e, true));
                    }
                }
            }
        }
        let guest_call = instance
            .get_typed_func::<(i32, i32), i32>(&mut store, "__guest_call")
            .map_err(|e| EngineError::Init(format!("__guest_call: {e}")))?;
        let (op_len, msg_len) = store.data().lengths();
        store.set_epoch_deadline(self.ticks);
        let status = guest_call
            .call(&mut store, (op_len, msg_len))
            .map_err(|e| failed(e, false))?;
        let guest = store.into_data();
        match (status, guest.response, guest.error) {
            (1, Some(response), _) => Ok(response),
            (_, _, Some(message)) => Err(EngineError::Guest {
                function: function.to_string(),
                message,
            }),
            _ => Err(EngineError::Guest {
                function: function.to_string(),
                message: "the policy answered neither a response nor an error".into(),
            }),
        }
    }

    /// What a trap or an error of the guest's call means, by its type.
    fn failure(&self, function: &str, e: wasmtime::Error, init: bool) -> EngineError {
        if e.downcast_ref::<OverBudget>().is_some() {
            return EngineError::Memory {
                function: function.to_string(),
                limit: self.limits.memory_bytes,
            };
        }
        match e.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => EngineError::Deadline {
                function: function.to_string(),
                deadline: self.timeout,
            },
            _ if init => EngineError::Init(e.to_string()),
            _ => EngineError::Guest {
                function: function.to_string(),
                message: e
                    .downcast_ref::<ProtocolError>()
                    .map_or_else(|| e.to_string(), ProtocolError::to_string),
            },
        }
    }

    /// `validate` with a Kubewarden payload; returns the ValidationResponse.
    pub fn validate(&self, request: &Value, settings: &Value, handler: Arc<dyn CallHandler>) -> Result<Value> {
        let payload = serde_json::to_vec(&serde_json::json!({"request": request, "settings": settings}))?;
        let answer = self.call("validate", &payload, handler)?;
        serde_json::from_slice(&answer).context("the policy answered invalid JSON")
    }

    /// `validate_settings`: `Ok(())` or the policy's message.
    pub fn validate_settings(&self, settings: &Value) -> Result<Result<(), InvalidSettings>> {
        let answer = self.call("validate_settings", &serde_json::to_vec(settings)?, Arc::new(NoCalls))?;
        let v: Value = serde_json::from_slice(&answer)?;
        if v["valid"] == true {
            Ok(Ok(()))
        } else {
            Ok(Err(InvalidSettings(
                v["message"].as_str().unwrap_or("invalid settings").to_string(),
            )))
        }
    }
}

/// The policy's refusal of its settings, in its words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidSettings(pub String);

struct NoCalls;
impl CallHandler for NoCalls {
    fn call(&self, binding: &str, _: &str, operation: &str, _: &[u8]) -> Result<Vec<u8>, CallFailure> {
        Err(CallFailure::Ours(HostError::new(
            Code::Unsupported,
            format!("no host calls while validating settings ({binding}/{operation})"),
        )))
    }
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("timeout", &self.timeout)
            .field("limits", &self.limits)
            .finish()
    }
}

/// The first line of a precompiled-module file: what it was made from.
fn precompiled_header(module: &[u8]) -> String {
    use sha2::Digest as _;
    format!(
        "config-snapshot precompiled sha256:{}\n",
        config_snapshot_policy::model::content::hex(&sha2::Sha256::digest(module))
    )
}

fn new_wasmtime_engine(limits: Limits) -> Result<wasmtime::Engine> {
    let mut config = wasmtime::Config::new();
    config.epoch_interruption(true);
    // A fresh instance per request is the hot path: the pooling allocator
    // reuses pre-reserved memory slots instead of mapping new ones.
    let mut pooling = wasmtime::PoolingAllocationConfig::default();
    pooling
        .total_core_instances(limits.instances)
        .total_memories(limits.instances)
        .total_tables(limits.instances)
        .max_memory_size(limits.memory_bytes)
        // Reset the first pages by memset instead of returning them to the
        // kernel: profiling showed the page faults of each fresh instance
        // re-touching its memory at ~14% of an admission.
        .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
        .table_keep_resident(KEEP_RESIDENT_BYTES)
        // Reset only the pages an instance touched (Linux 6.7+, found by
        // the PAGEMAP_SCAN ioctl), not the whole kept-resident prefix: a
        // pass-through request touches a few pages of the policy's 1 MiB.
        .pagemap_scan(wasmtime::Enabled::Auto);
    config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pooling));
    // `perf` cannot name JIT-compiled code on its own; with this set, the
    // policy's functions appear by name in `perf report` (docs/BENCHMARKS.md,
    // "Reproduce"). Off by default: it writes /tmp/perf-<pid>.map.
    if std::env::var_os("CONFIG_SNAPSHOT_PERF_MAP").is_some() {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    wasmtime::Engine::new(&config).map_err(|e| anyhow!("creating the wasm engine: {e}"))
}

/// One ticker thread per engine; it ends when the engine is dropped.
fn start_ticker(engine: &wasmtime::Engine) {
    let weak = engine.weak();
    thread::Builder::new()
        .name("epoch-ticker".into())
        .spawn(move || loop {
            thread::sleep(TICK);
            match weak.upgrade() {
                Some(engine) => engine.increment_epoch(),
                None => break,
            }
        })
        .expect("spawning the epoch ticker");
}

#[cfg(test)]
mod tests;
