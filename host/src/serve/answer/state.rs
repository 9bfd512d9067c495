//! What serve's handlers, effect worker and resync share, and how it is
//! built from the command line: the engine, the cluster, the queue.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{anyhow, Context as _, Result};
use config_snapshot_policy::model::settings::Settings;
use kube::Client;
use serde_json::Value;

use super::options::Options;
use crate::cluster::proof::Prover;
use crate::kubewarden::engine::Engine;
use crate::lifecycle::{Budget, InFlight, Places, Rules};
use crate::serve::tell::events;
use crate::serve::tell::metrics::Metrics;
use crate::serve::tell::report::Report;
use crate::serve::view::apiserver::KubeCluster;
use crate::serve::view::cache::Cache;
use crate::serve::work::leader;
use crate::serve::work::queue::{self, Queue, QueueSettings, WorkerContext};

/// Shared by the HTTP handlers, the effect worker and the resync.
pub struct State {
    pub engine: Arc<Engine>,
    /// The settings as JSON text, spliced into every validate payload
    /// (parsed, they are the rules' own: `context.rules.settings`).
    pub settings_json: String,
    pub cluster: Arc<KubeCluster>,
    /// What carrying out an effect needs: the queue's workers and the
    /// admissions that stage effects share this one.
    pub context: Arc<WorkerContext>,
    pub queue: Queue,
    pub metrics: Arc<Metrics>,
    pub shutting_down: AtomicBool,
    /// Whether this replica runs the periodic pass (see `leader`).
    pub leadership: Arc<leader::Leadership>,
    /// Snapshot creations per namespace per minute.
    pub budget: Arc<Budget>,
    /// Whether the webhook configuration calls the door's path (or serve
    /// was told to leave it alone, or there is none to call it).
    pub registered: AtomicBool,
    ids: AtomicU64,
}

impl State {
    pub fn ready(&self) -> bool {
        self.cluster.cache.synced()
            && !self.cluster.credentials_refused()
            && self.registered.load(Ordering::SeqCst)
            && !self.shutting_down.load(Ordering::SeqCst)
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }
}

/// Everything `serve` needs that does not involve sockets, for the module
/// `--policy` named (already read or pulled).
pub fn build(options: &Options, client: Client, module: &[u8], prover: Prover) -> Result<(Arc<State>, queue::Worker)> {
    let precompiled = match &options.precompiled {
        Some(path) => Some(std::fs::read(path).with_context(|| format!("reading {}", path.display()))?),
        None => None,
    };
    let started = std::time::Instant::now();
    let (engine, how) = Engine::load_prepared(
        module,
        precompiled.as_deref(),
        options.policy_timeout,
        options.engine_limits()?,
    )?;
    tracing::info!(how = %how, millis = started.elapsed().as_millis() as u64, "policy ready");
    build_with_engine(options, client, Arc::new(engine), prover)
}

/// [`build`] with an engine already compiled (`--policy` is not read).
pub fn build_with_engine(
    options: &Options,
    client: Client,
    engine: Arc<Engine>,
    prover: Prover,
) -> Result<(Arc<State>, queue::Worker)> {
    let settings: Value = serde_json::from_str(&options.settings_json).context("--settings-json is not JSON")?;
    if let Err(message) = engine.validate_settings(&settings)? {
        return Err(anyhow!("invalid settings: {message}"));
    }
    let settings_json = settings.to_string();
    let parsed = Settings::from_json(settings_json.as_bytes()).map_err(|e| anyhow!("invalid settings: {e}"))?;
    let metrics = Arc::new(Metrics::default());
    let only_namespaces = options.only_namespaces()?;
    let prover = Arc::new(prover);
    let cache = Arc::new(
        match &only_namespaces {
            Some(namespaces) => Cache::within(namespaces.clone()),
            None => Cache::excluding(options.excluded_namespaces()),
        }
        .digesting(prover.clone())
        .counting(metrics.cache_objects.clone()),
    );
    let runtime = tokio::runtime::Handle::try_current().context("serve needs a tokio runtime")?;
    let report = Arc::new(Report {
        events: events::Events::new(client.clone(), runtime.clone()),
        metrics: metrics.clone(),
    });
    let cluster =
        Arc::new(KubeCluster::new(client, cache.clone(), runtime, metrics.clone()).reading(options.source_reads));
    let budget = Arc::new(Budget::new(crate::lifecycle::Limits {
        count: options.snapshot_rate,
        namespace_bytes: options.snapshot_bytes_rate,
        total_bytes: options.snapshot_bytes_rate_total,
    }));
    let carry = Arc::new(WorkerContext {
        cluster: cluster.clone(),
        rules: Arc::new(Rules {
            settings: parsed,
            watch_min_interval: options.watch_min_interval.as_secs() as i64,
            prover,
            excluded_namespaces: options.excluded_namespaces(),
            only_namespaces,
        }),
        in_flight: Arc::new(InFlight::bounded(Places::of(options.queue_capacity))),
        report,
        budget: budget.clone(),
    });
    let (queue, worker) = Queue::new(
        carry.clone(),
        QueueSettings {
            wait_for: options.effect_wait,
            ..QueueSettings::default()
        },
    );
    let leadership = Arc::new(if options.leader_elect {
        leader::Leadership::contender(metrics.clone())
    } else {
        leader::Leadership::alone(metrics.clone())
    });
    told_by_the_watch(&cache, &queue, &leadership);
    let state = Arc::new(State {
        leadership,
        engine,
        settings_json,
        cluster,
        context: carry,
        queue,
        metrics,
        shutting_down: AtomicBool::new(false),
        budget,
        registered: AtomicBool::new(true),
        ids: AtomicU64::new(0),
    });
    let judge: Arc<dyn crate::serve::work::source_changes::Judge> = state.clone();
    state.queue.sources.judged_by(Arc::downgrade(&judge));
    Ok((state, worker))
}

/// What the watches tell the queue: a stored write of a workload wakes the
/// rollouts it holds; a stored change of a source's content is judged by
/// the leader, as it runs the pass: one replica's rollouts, not one per
/// replica. A change told while no replica leads is found by the next
/// leader's first pass.
fn told_by_the_watch(cache: &Cache, queue: &Queue, leadership: &Arc<leader::Leadership>) {
    let waker = queue.clone();
    cache.on_workload_change(move |workload| waker.wake(workload));
    let (sources, leading) = (queue.sources.clone(), leadership.clone());
    cache.on_source_change(move |source| {
        if leading.leading() {
            sources.changed(source.clone());
        }
    });
}
