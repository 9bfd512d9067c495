//! Deferred effects (`adopt`, `patch_workload`) run after the admission that
//! asked for them, from a bounded queue with retries and backoff.
//!
//! Nothing here trusts timing: an adoption waits until its owner exists, a
//! patch until the source content it was computed for is visible, and every
//! write carries a resourceVersion precondition, recomputed after a
//! conflict. The queue lives in memory; what a restart or a full queue loses
//! is re-derived by the resync (watch patches) or collected by the sweep
//! (unadopted snapshots), see docs/serve.md.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use config_snapshot_policy::content::Content;
use config_snapshot_policy::keys;
use config_snapshot_policy::kind::{SourceId, SourceKind};
use config_snapshot_policy::watch;
use kube::api::{Patch, PatchParams};
use serde_json::{json, Value};
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;

use super::cluster::{describe, is_status, KubeCluster};
use crate::capability::Effect;

#[derive(Debug, Clone)]
pub struct QueueSettings {
    pub capacity: usize,
    /// How long a patch waits for its source change to become visible (or
    /// an adoption for its owner) before it is dropped.
    pub wait_for: Duration,
    /// Storm guard: at most one watch rollout per workload per interval.
    pub watch_min_interval: Duration,
    pub workers: usize,
}

impl Default for QueueSettings {
    fn default() -> Self {
        QueueSettings {
            capacity: 1024,
            wait_for: Duration::from_secs(30),
            watch_min_interval: Duration::from_secs(30),
            workers: 4,
        }
    }
}

/// A workload: kind, namespace, name.
type WorkloadKey = (String, String, String);

/// The storm guard: at most one watch rollout per workload per interval,
/// across the queue's workers. A worker reserves the workload's slot before
/// it reads and patches, so two workers holding patches for the same
/// workload cannot both pass; the reservation is given back if the rollout
/// does not happen.
struct StormGuard {
    interval: Duration,
    last: Mutex<HashMap<WorkloadKey, Instant>>,
}

/// A slot held while a rollout is attempted. Dropped without `commit`, it
/// frees the slot (any earlier rollout is already past the interval, or the
/// reservation would not have been given).
struct Reservation<'g> {
    guard: &'g StormGuard,
    key: WorkloadKey,
    committed: bool,
}

impl StormGuard {
    fn new(interval: Duration) -> Self {
        StormGuard {
            interval,
            last: Mutex::default(),
        }
    }

    /// A poisoned lock still holds valid instants: a panicking worker
    /// cannot leave a half-written one.
    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<WorkloadKey, Instant>> {
        self.last.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The slot, or how long until it frees.
    fn reserve(&self, key: WorkloadKey) -> Result<Reservation<'_>, Duration> {
        let mut last = self.slots();
        if let Some(at) = last.get(&key) {
            let since = at.elapsed();
            if since < self.interval {
                return Err(self.interval - since);
            }
        }
        last.insert(key.clone(), Instant::now());
        Ok(Reservation {
            guard: self,
            key,
            committed: false,
        })
    }
}

impl Reservation<'_> {
    /// The rollout happened: the interval runs from now.
    fn commit(mut self) {
        self.guard.slots().insert(self.key.clone(), Instant::now());
        self.committed = true;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.committed {
            self.guard.slots().remove(&self.key);
        }
    }
}

struct Job {
    effect: Effect,
    attempts: u32,
    since: Instant,
}

/// What one run of an effect came to.
#[derive(Debug, PartialEq)]
enum Step {
    Done,
    /// Nothing to do any more (superseded, target gone); logged, not retried.
    Dropped(String),
    /// A precondition does not hold yet (owner not created, source change
    /// not visible): look again; past the wait it was superseded or never
    /// persisted, and is dropped.
    Wait(String),
    /// A read or write failed: try again; past the wait it has failed.
    Retry(String),
    /// Held back by the storm guard for this long.
    Later(Duration),
}

#[derive(Clone)]
pub struct Queue {
    tx: mpsc::Sender<Job>,
    cluster: Arc<KubeCluster>,
}

pub struct Worker {
    rx: mpsc::Receiver<Job>,
    queue: Queue,
    settings: QueueSettings,
    storm_guard: Arc<StormGuard>,
}

fn label(effect: &Effect) -> &'static str {
    match effect {
        Effect::Adopt { .. } => "adopt",
        Effect::Patch { .. } => "patch_workload",
    }
}

impl Queue {
    pub fn new(cluster: Arc<KubeCluster>, settings: QueueSettings) -> (Queue, Worker) {
        let (tx, rx) = mpsc::channel(settings.capacity);
        let queue = Queue { tx, cluster };
        let worker = Worker {
            rx,
            queue: queue.clone(),
            storm_guard: Arc::new(StormGuard::new(settings.watch_min_interval)),
            settings,
        };
        (queue, worker)
    }

    pub fn submit(&self, effect: Effect) {
        self.send(Job {
            effect,
            attempts: 0,
            since: Instant::now(),
        });
    }

    fn send(&self, job: Job) {
        let metrics = &self.cluster.metrics;
        let name = label(&job.effect);
        match self.tx.try_send(job) {
            Ok(()) => {
                metrics.queue_depth.inc();
            }
            Err(_) => {
                metrics.effect(name, "dropped");
                tracing::warn!(
                    effect = name,
                    "deferred-effect queue full; dropped (the resync re-derives patches, the sweep collects snapshots)"
                );
            }
        };
    }

    fn send_after(&self, job: Job, delay: Duration) {
        let queue = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            queue.send(job);
        });
    }
}

impl Worker {
    /// Runs effects until the queue closes, a few at a time.
    pub async fn run(mut self) {
        let permits = Arc::new(Semaphore::new(self.settings.workers.max(1)));
        while let Some(job) = self.rx.recv().await {
            self.queue.cluster.metrics.queue_depth.dec();
            let Ok(permit) = permits.clone().acquire_owned().await else {
                break;
            };
            let runner = Runner {
                cluster: self.queue.cluster.clone(),
                settings: self.settings.clone(),
                storm_guard: self.storm_guard.clone(),
            };
            let queue = self.queue.clone();
            tokio::spawn(async move {
                runner.handle(job, &queue).await;
                drop(permit);
            });
        }
    }
}

struct Runner {
    cluster: Arc<KubeCluster>,
    settings: QueueSettings,
    storm_guard: Arc<StormGuard>,
}

impl Runner {
    async fn handle(&self, mut job: Job, queue: &Queue) {
        let name = label(&job.effect);
        let metrics = &self.cluster.metrics;
        let step = self.run(&job.effect).await;
        match &step {
            Step::Done => metrics.effect(name, "done"),
            Step::Dropped(why) => {
                metrics.effect(name, "dropped");
                tracing::info!(effect = name, "{why}");
            }
            Step::Later(delay) => {
                // The wait for preconditions starts when the guard lets go.
                job.since = Instant::now() + *delay;
                queue.send_after(job, *delay);
            }
            Step::Wait(why) | Step::Retry(why) if job.since.elapsed() >= self.settings.wait_for => {
                if matches!(step, Step::Wait(_)) {
                    metrics.effect(name, "dropped");
                    tracing::info!(effect = name, "dropped after {:?}: {why}", self.settings.wait_for);
                } else {
                    metrics.effect(name, "failed");
                    tracing::warn!(effect = name, attempts = job.attempts, "gave up: {why}");
                }
            }
            Step::Wait(why) | Step::Retry(why) => {
                job.attempts += 1;
                {
                    metrics.effect(name, "retried");
                    tracing::debug!(effect = name, attempts = job.attempts, "will retry: {why}");
                    let delay = backoff(job.attempts);
                    queue.send_after(job, delay);
                }
            }
        }
    }

    async fn run(&self, effect: &Effect) -> Step {
        match effect {
            Effect::Adopt {
                namespace,
                owner_kind,
                owner_name,
                snapshots,
            } => self.adopt(namespace, owner_kind, owner_name, snapshots).await,
            Effect::Patch { namespace, request } => self.patch(namespace, request).await,
        }
    }

    async fn adopt(&self, ns: &str, owner_kind: &str, owner_name: &str, snapshots: &[(String, String)]) -> Step {
        let owner = match self.read(owner_kind, ns, owner_name).await {
            Ok(Some(owner)) => owner,
            Ok(None) => return Step::Wait(format!("{owner_kind}/{owner_name} is not visible yet")),
            Err(e) => return Step::Retry(e),
        };
        let reference = json!({
            "apiVersion": owner["apiVersion"], "kind": owner["kind"],
            "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
        });
        for (kind, name) in snapshots {
            let snapshot = match self.cluster.fetch(kind, ns, name).await {
                Ok(Some(s)) => s,
                Ok(None) => continue,
                Err(e) => return Step::Retry(e),
            };
            if !keys::is_snapshot(&snapshot) {
                continue;
            }
            let refs = snapshot["metadata"]["ownerReferences"].as_array();
            if refs.is_some_and(|r| r.iter().any(|r| r["uid"] == reference["uid"])) {
                continue;
            }
            let add = match refs {
                Some(_) => json!({"op": "add", "path": "/metadata/ownerReferences/-", "value": reference}),
                None => json!({"op": "add", "path": "/metadata/ownerReferences", "value": [reference]}),
            };
            let ops = vec![precondition(&snapshot), add];
            match self.send_patch(kind, ns, name, ops).await {
                Ok(()) => {
                    self.cluster.metrics.adoptions.inc();
                    tracing::info!("{kind}/{name} adopted by {owner_kind}/{owner_name}");
                }
                Err(e) => return Step::Retry(e),
            }
        }
        Step::Done
    }

    /// `patch_workload`, as the replay cluster runs it: once the source
    /// content is visible, at most once per storm-guard interval, with the
    /// resourceVersion precondition and a recompute after a conflict.
    async fn patch(&self, ns: &str, request: &Value) -> Step {
        let kind = request["kind"].as_str().unwrap_or_default();
        let name = request["name"].as_str().unwrap_or_default();
        let source_kind = request["source"]["kind"].as_str().and_then(SourceKind::from_kind);
        let source_name = request["source"]["name"].as_str().unwrap_or_default();
        let (Some(source_kind), Some(snapshot)) = (source_kind, request["snapshot"].as_str()) else {
            return Step::Dropped(format!("dropped a patch of {kind}/{name}: no source recorded"));
        };
        let want = request["source"]["contentHash"].as_str().unwrap_or_default();
        let visible = |s: &Option<Value>| {
            s.as_ref()
                .and_then(|s| Content::from_object(source_kind, s).ok())
                .is_some_and(|c| c.hash() == want)
        };
        if !visible(
            &self
                .cluster
                .cache
                .get(source_kind.kind(), ns, source_name)
                .unwrap_or(None),
        ) {
            match self.cluster.fetch(source_kind.kind(), ns, source_name).await {
                Ok(s) if visible(&s) => {}
                Ok(_) => {
                    return Step::Wait(format!(
                        "patch of {kind}/{name} to {snapshot}: {source_name} does not hold that content (yet)"
                    ))
                }
                Err(e) => return Step::Retry(e),
            }
        }
        let key = (kind.to_string(), ns.to_string(), name.to_string());
        let reservation = match self.storm_guard.reserve(key) {
            Ok(r) => r,
            Err(wait) => return Step::Later(wait),
        };
        let workload = match self.cluster.fetch(kind, ns, name).await {
            Ok(Some(w)) => w,
            Ok(None) => return Step::Dropped(format!("patch of {kind}/{name} dropped: it no longer exists")),
            Err(e) => return Step::Retry(e),
        };
        let ops: Vec<Value> = if workload["metadata"]["resourceVersion"] == request["resourceVersion"] {
            request["patch"].as_array().cloned().unwrap_or_default()
        } else {
            let id = SourceId::new(source_kind, source_name);
            match watch::retarget_ops(&workload["spec"]["template"], &id, snapshot) {
                Some(ops) => ops,
                None => return Step::Dropped(format!("patch of {kind}/{name} dropped: it no longer uses {id}")),
            }
        };
        let Ok(parsed) = serde_json::from_value::<json_patch::Patch>(json!(ops)) else {
            return Step::Dropped(format!("patch of {kind}/{name} dropped: not a JSON Patch"));
        };
        let mut patched = workload.clone();
        if let Err(e) = json_patch::patch(&mut patched, &parsed) {
            return Step::Dropped(format!("patch of {kind}/{name} dropped: {e}"));
        }
        if patched == workload {
            return Step::Done;
        }
        let mut with_precondition = vec![precondition(&workload)];
        with_precondition.extend(ops);
        match self.send_patch(kind, ns, name, with_precondition).await {
            Ok(()) => {
                reservation.commit();
                self.cluster.metrics.rollouts.inc();
                tracing::info!("watch: rolled out {kind}/{name} to {snapshot}");
                Step::Done
            }
            Err(e) => Step::Retry(e),
        }
    }

    async fn read(&self, kind: &str, ns: &str, name: &str) -> Result<Option<Value>, String> {
        match self.cluster.cache.get(kind, ns, name)? {
            Some(o) => Ok(Some(o)),
            None => self.cluster.fetch(kind, ns, name).await,
        }
    }

    async fn send_patch(&self, kind: &str, ns: &str, name: &str, ops: Vec<Value>) -> Result<(), String> {
        send_json_patch(&self.cluster, kind, ns, name, ops).await
    }
}

/// Applies a JSON Patch whose first op pins the resourceVersion: the API
/// server answers 409 if the object moved since it was read.
pub async fn send_json_patch(
    cluster: &KubeCluster,
    kind: &str,
    ns: &str,
    name: &str,
    ops: Vec<Value>,
) -> Result<(), String> {
    let api = cluster.api(kind, ns)?;
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).map_err(|e| e.to_string())?;
    let params = PatchParams::default();
    match tokio::time::timeout(
        super::cluster::API_TIMEOUT,
        api.patch(name, &params, &Patch::Json::<()>(patch)),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) if is_status(&e, 409) => Err(format!("conflict on {kind}/{name}: re-read and recompute")),
        Ok(Err(e)) => Err(format!("patching {kind}/{name}: {}", describe(e))),
        Err(_) => Err(format!("timeout patching {kind}/{name}")),
    }
}

/// The JSON Patch op that makes the write conditional on `object`'s version.
pub fn precondition(object: &Value) -> Value {
    json!({"op": "replace", "path": "/metadata/resourceVersion", "value": object["metadata"]["resourceVersion"]})
}

/// 100 ms doubling to 5 s.
fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(100u64.saturating_mul(1 << attempt.min(6))).min(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff(0), Duration::from_millis(100));
        assert_eq!(backoff(1), Duration::from_millis(200));
        assert_eq!(backoff(3), Duration::from_millis(800));
        assert_eq!(backoff(30), Duration::from_secs(5));
    }

    fn key(name: &str) -> WorkloadKey {
        ("Deployment".into(), "shop".into(), name.into())
    }

    #[test]
    fn the_storm_guard_lets_one_rollout_through_per_interval() {
        let guard = StormGuard::new(Duration::from_secs(30));
        let first = guard.reserve(key("web")).expect("a free slot");
        // A second worker, while the first is still patching.
        let wait = guard.reserve(key("web")).err().expect("held");
        assert!(
            wait > Duration::from_secs(29) && wait <= Duration::from_secs(30),
            "{wait:?}"
        );
        assert!(guard.reserve(key("api")).is_ok(), "other workloads are not held");
        first.commit();
        assert!(guard.reserve(key("web")).is_err(), "rolled out: held for the interval");
    }

    #[test]
    fn a_rollout_that_did_not_happen_gives_its_slot_back() {
        let guard = StormGuard::new(Duration::from_secs(30));
        drop(guard.reserve(key("web")).unwrap());
        let again = guard.reserve(key("web")).expect("the failed attempt freed the slot");
        again.commit();
        assert!(guard.reserve(key("web")).is_err());
    }

    #[test]
    fn the_precondition_pins_the_version_read() {
        let op = precondition(&json!({"metadata": {"resourceVersion": "42"}}));
        assert_eq!(
            op,
            json!({"op": "replace", "path": "/metadata/resourceVersion", "value": "42"})
        );
    }
}
