//! Evaluates the policy wasm the way Kubewarden's policy-server does: one
//! module compiled once, and a fresh instance for every request, so a
//! trapped or timed-out evaluation cannot leak state (or locks) into the
//! next. An epoch ticker stops a runaway policy.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _, Result};
use config_snapshot_policy::host_error::{Code, HostError};
use serde_json::Value;
use wapc::WapcHost;
use wasmtime_provider::wasmtime;
use wasmtime_provider::{EpochDeadlines, WasmtimeEngineProviderBuilder, WasmtimeEngineProviderPre};

/// Answers the guest's host calls for one request.
pub trait CallHandler: Send + Sync {
    fn call(&self, binding: &str, namespace: &str, operation: &str, payload: &[u8]) -> Result<Vec<u8>, CallFailure>;
}

/// What a failed host call hands the guest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallFailure {
    /// Our hosts' answer: a code and a message, as JSON.
    #[error("{0}")]
    Ours(#[from] HostError),
    /// Another host's text, as it writes it: stock Kubewarden, which
    /// `interactions` plays.
    #[error("{0}")]
    Foreign(String),
}

/// Why a call of the policy gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("instantiating the policy: {0}")]
    Instantiate(String),
    #[error("initialising the policy: {0}")]
    Init(String),
    /// Stopped by the epoch deadline: its instance is discarded.
    #[error("policy {function} ran past its deadline of {deadline:?} and was stopped")]
    Deadline { function: String, deadline: Duration },
    #[error("policy {function} failed: {message}")]
    Guest { function: String, message: String },
}

/// A host error on its way to the guest: waPC carries its `Display`, so
/// ours is the JSON the guest reads its code from.
#[derive(Debug)]
struct Wire(CallFailure);

impl fmt::Display for Wire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            CallFailure::Ours(e) => f.write_str(&String::from_utf8_lossy(&e.to_bytes())),
            CallFailure::Foreign(text) => f.write_str(text),
        }
    }
}

impl std::error::Error for Wire {}

/// Instances alive at once per engine (concurrent requests).
pub const MAX_CONCURRENT_INSTANCES: u32 = 64;
/// A policy instance's memory cap: far above what a 1.5 MiB object needs.
const MAX_MEMORY_BYTES: usize = 256 << 20;

/// Memory kept resident per pool slot between instances.
const KEEP_RESIDENT_BYTES: usize = 4 << 20;

/// Length of one epoch tick.
const TICK: Duration = Duration::from_millis(10);

pub struct Engine {
    pre: WasmtimeEngineProviderPre,
    deadlines: EpochDeadlines,
    timeout: Duration,
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
        let engine = new_wasmtime_engine()?;
        let module = wasmtime::Module::new(&engine, bytes).map_err(|e| anyhow!("compiling the policy: {e}"))?;
        Engine::from_module(engine, module, timeout)
    }

    /// Loads a module precompiled by [`Engine::precompile`] (trusted input:
    /// our own cache, never user-supplied bytes).
    pub fn from_precompiled(bytes: &[u8], timeout: Duration) -> Result<Engine> {
        let engine = new_wasmtime_engine()?;
        // SAFETY: the bytes come from `Module::serialize` with the same
        // wasmtime version and config, which wasmtime checks on load.
        let module = unsafe { wasmtime::Module::deserialize(&engine, bytes) }
            .map_err(|e| anyhow!("loading the precompiled policy: {e}"))?;
        Engine::from_module(engine, module, timeout)
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
    pub fn load_prepared(module: &[u8], precompiled: Option<&[u8]>, timeout: Duration) -> Result<(Engine, String)> {
        let why = match precompiled.map(|file| file.strip_prefix(precompiled_header(module).as_bytes())) {
            None => "compiled at start".to_string(),
            Some(None) => "compiled at start: the precompiled module was made for another policy".to_string(),
            Some(Some(body)) => match Engine::from_precompiled(body, timeout) {
                Ok(engine) => return Ok((engine, "precompiled".into())),
                Err(e) => format!("compiled at start: the precompiled module does not fit this engine ({e})"),
            },
        };
        Ok((Engine::from_bytes(module, timeout)?, why))
    }

    pub fn precompile(bytes: &[u8]) -> Result<Vec<u8>> {
        let engine = new_wasmtime_engine()?;
        let module = wasmtime::Module::new(&engine, bytes).map_err(|e| anyhow!("compiling the policy: {e}"))?;
        module.serialize().map_err(|e| anyhow!("serialising the module: {e}"))
    }

    fn from_module(engine: wasmtime::Engine, module: wasmtime::Module, timeout: Duration) -> Result<Engine> {
        start_ticker(&engine);
        let ticks = (timeout.as_millis() / TICK.as_millis()).max(1) as u64;
        let deadlines = EpochDeadlines {
            wapc_init: ticks,
            wapc_func: ticks,
        };
        let pre = WasmtimeEngineProviderBuilder::new()
            .engine(engine)
            .module(module)
            .enable_epoch_interruptions(deadlines)
            .build_pre()
            .map_err(|e| anyhow!("preparing the policy: {e}"))?;
        Ok(Engine {
            pre,
            deadlines,
            timeout,
        })
    }

    /// Calls one guest function on a fresh instance. A call that ends in
    /// an error once its deadline has passed was stopped by it: the epoch
    /// ticker is the only thing that interrupts a guest.
    pub fn call(&self, function: &str, payload: &[u8], handler: Arc<dyn CallHandler>) -> Result<Vec<u8>, EngineError> {
        let provider = self
            .pre
            .rehydrate(Some(self.deadlines))
            .map_err(|e| EngineError::Instantiate(e.to_string()))?;
        let callback = move |_id: u64, binding: &str, ns: &str, op: &str, payload: &[u8]| {
            handler
                .call(binding, ns, op, payload)
                .map_err(|e| -> Box<dyn std::error::Error + Send + Sync> { Box::new(Wire(e)) })
        };
        let started = Instant::now();
        let stopped = |message: String| {
            if started.elapsed() >= self.timeout {
                EngineError::Deadline {
                    function: function.to_string(),
                    deadline: self.timeout,
                }
            } else {
                EngineError::Guest {
                    function: function.to_string(),
                    message,
                }
            }
        };
        let host =
            WapcHost::new(Box::new(provider), Some(Box::new(callback))).map_err(|e| match stopped(e.to_string()) {
                EngineError::Guest { message, .. } => EngineError::Init(message),
                deadline => deadline,
            })?;
        host.call(function, payload).map_err(|e| stopped(e.to_string()))
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

/// The first line of a precompiled-module file: what it was made from.
fn precompiled_header(module: &[u8]) -> String {
    use sha2::Digest as _;
    format!(
        "config-snapshot precompiled sha256:{}\n",
        config_snapshot_policy::content::hex(&sha2::Sha256::digest(module))
    )
}

fn new_wasmtime_engine() -> Result<wasmtime::Engine> {
    let mut config = wasmtime::Config::new();
    config.epoch_interruption(true);
    // A fresh instance per request is the hot path: the pooling allocator
    // reuses pre-reserved memory slots instead of mapping new ones.
    let mut pooling = wasmtime::PoolingAllocationConfig::default();
    pooling
        .total_core_instances(MAX_CONCURRENT_INSTANCES)
        .total_memories(MAX_CONCURRENT_INSTANCES)
        .total_tables(MAX_CONCURRENT_INSTANCES)
        .max_memory_size(MAX_MEMORY_BYTES)
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
