//! Serve's driver of the deferred effects (`adopt`, `patch_workload`): a
//! bounded queue with workers, retries and backoff. What each effect does
//! is decided by [`crate::lifecycle::effects`], the rules replay runs too;
//! this module only reads the objects it is judged against, writes, and
//! schedules the next look.
//!
//! Nothing here trusts timing: an adoption waits until its owner exists, a
//! patch until the source content it was computed for is visible, and every
//! write carries a resourceVersion precondition. The storm guard is the
//! rollout recorded on the workload itself, so every replica and a
//! restarted one see the same guard. The queue lives in memory; what a
//! restart or a full queue loses is re-derived by the resync (watch
//! patches, adoptions) or collected by the sweep (snapshots), see
//! docs/serve.md.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use config_snapshot_policy::keys;
use serde_json::Value;
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tracing::Instrument as _;

use super::cluster::KubeCluster;
use super::events::Reason;
use crate::backend::{BackendError, Selector};
use crate::capability::delete_guarded;
use crate::lifecycle::effects::{adopt_ops, decide_patch, Observed, Rules};
use crate::lifecycle::resync::{bridges, controller_of, orphans, Key};
use crate::lifecycle::{Effect, PatchIntent, Verdict};

#[derive(Debug, Clone)]
pub struct QueueSettings {
    pub capacity: usize,
    /// How long a patch waits for its source change to become visible (or
    /// an adoption for its owner) before it is dropped.
    pub wait_for: Duration,
    pub workers: usize,
}

impl Default for QueueSettings {
    fn default() -> Self {
        QueueSettings {
            capacity: 1024,
            wait_for: Duration::from_secs(30),
            workers: 4,
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
enum Attempt {
    Done,
    /// Nothing to do any more (superseded, a rollback came first, target
    /// gone); logged, not retried. `collect`: the snapshot made for it, to
    /// delete if nothing else uses it.
    Dropped {
        why: String,
        collect: Option<Key>,
    },
    /// A precondition does not hold yet (owner not created, source change
    /// not visible): look again; past the wait it was superseded or never
    /// persisted, and is dropped.
    Wait(String),
    /// A read or write failed: try again; past the wait it has failed.
    Retry(String),
    /// Held back by the storm guard until this time (the cluster's clock).
    Later(i64),
}

#[derive(Clone)]
pub struct Queue {
    tx: mpsc::Sender<Job>,
    cluster: Arc<KubeCluster>,
    /// Jobs the storm guard holds, with when to look again.
    parked: Arc<Mutex<Vec<(i64, Job)>>>,
}

pub struct Worker {
    rx: mpsc::Receiver<Job>,
    queue: Queue,
    settings: QueueSettings,
    rules: Arc<Rules>,
}

/// How often parked jobs are checked against the clock.
const TICK: Duration = Duration::from_millis(200);

impl Queue {
    pub fn new(cluster: Arc<KubeCluster>, settings: QueueSettings, rules: Rules) -> (Queue, Worker) {
        let (tx, rx) = mpsc::channel(settings.capacity);
        let queue = Queue {
            tx,
            cluster,
            parked: Arc::default(),
        };
        let worker = Worker {
            rx,
            queue: queue.clone(),
            settings,
            rules: Arc::new(rules),
        };
        (queue, worker)
    }

    /// Queues `effect`, unless one doing the same work is already on its
    /// way ([`Effect::same_work`]): a resync pass re-derives the rollouts
    /// and adoptions it finds undone, and one still retrying is undone too.
    /// Running both would write once and report a failure twice; a
    /// controller's work queue holds an item once, too.
    pub fn submit(&self, effect: Effect) {
        if !self.cluster.begin(&effect) {
            self.cluster.metrics.effect(effect.label(), "coalesced");
            tracing::debug!(effect = effect.label(), "the same work is on its way; not queued twice");
            return;
        }
        self.send(Job {
            effect,
            attempts: 0,
            since: Instant::now(),
        });
    }

    /// Whether every job submitted is over or held by the storm guard:
    /// nothing more happens until the clock moves.
    pub fn quiet(&self) -> bool {
        self.cluster.pending_count() == self.parked().len()
    }

    /// When the earliest job the storm guard holds may run.
    pub fn next_due(&self) -> Option<i64> {
        self.parked().iter().map(|(at, _)| *at).min()
    }

    fn parked(&self) -> std::sync::MutexGuard<'_, Vec<(i64, Job)>> {
        self.parked.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn send(&self, job: Job) {
        let metrics = &self.cluster.metrics;
        let name = job.effect.label();
        let effect = job.effect.clone();
        match self.tx.try_send(job) {
            Ok(()) => {
                metrics.queue_depth.inc();
            }
            Err(_) => {
                self.cluster.end(&effect);
                metrics.effect(name, "dropped");
                tracing::warn!(
                    effect = name,
                    "deferred-effect queue full; dropped (the resync re-derives patches and adoptions, the sweep collects snapshots)"
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

    /// The job is over, whatever came of it.
    fn finish(&self, job: &Job) {
        self.cluster.end(&job.effect);
    }

    /// Sends on the parked jobs whose time has come.
    fn release_due(&self) {
        let now = self.cluster.now();
        let due: Vec<Job> = {
            let mut parked = self.parked();
            let (due, rest): (Vec<_>, Vec<_>) = parked.drain(..).partition(|(at, _)| *at <= now);
            *parked = rest;
            due.into_iter().map(|(_, job)| job).collect()
        };
        for mut job in due {
            // The wait for preconditions starts when the guard lets go.
            job.since = Instant::now();
            self.send(job);
        }
    }
}

impl Worker {
    /// Runs effects until the queue closes, a few at a time.
    pub async fn run(mut self) {
        let permits = Arc::new(Semaphore::new(self.settings.workers.max(1)));
        let ticker = {
            let queue = self.queue.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(TICK).await;
                    queue.release_due();
                }
            })
        };
        while let Some(job) = self.rx.recv().await {
            self.queue.cluster.metrics.queue_depth.dec();
            let Ok(permit) = permits.clone().acquire_owned().await else {
                break;
            };
            let runner = Runner {
                cluster: self.queue.cluster.clone(),
                settings: self.settings.clone(),
                rules: self.rules.clone(),
            };
            let queue = self.queue.clone();
            let span = tracing::info_span!(
                "effect",
                effect = job.effect.label(),
                namespace = job.effect.namespace(),
                attempt = job.attempts
            );
            tokio::spawn(
                async move {
                    runner.handle(job, &queue).await;
                    drop(permit);
                }
                .instrument(span),
            );
        }
        ticker.abort();
    }
}

struct Runner {
    cluster: Arc<KubeCluster>,
    settings: QueueSettings,
    rules: Arc<Rules>,
}

impl Runner {
    async fn handle(&self, mut job: Job, queue: &Queue) {
        let name = job.effect.label();
        let metrics = &self.cluster.metrics;
        let step = self.run(&job.effect).await;
        // From enqueue to an end (done, dropped or given up): how long a
        // user waits for a watch rollout or an adoption.
        let waited = || metrics.effect_wait.observe(job.since.elapsed().as_secs_f64());
        match &step {
            Attempt::Done => {
                metrics.effect(name, "done");
                waited();
                queue.finish(&job);
            }
            Attempt::Dropped { why, collect } => {
                metrics.effect(name, "dropped");
                waited();
                tracing::info!(effect = name, "{why}");
                queue.finish(&job);
                if let Some(key) = collect {
                    self.collect_unused(key.clone());
                }
            }
            Attempt::Later(at) => {
                tracing::info!(effect = name, "held by the storm guard until {at} (unix seconds)");
                queue.parked().push((*at, job));
            }
            Attempt::Wait(why) | Attempt::Retry(why) if job.since.elapsed() >= self.settings.wait_for => {
                waited();
                if matches!(step, Attempt::Wait(_)) {
                    metrics.effect(name, "dropped");
                    tracing::info!(effect = name, "dropped after {:?}: {why}", self.settings.wait_for);
                } else {
                    metrics.effect(name, "failed");
                    tracing::warn!(effect = name, attempts = job.attempts, "gave up: {why}");
                    if let Some(subject) = self.subject(&job.effect).await {
                        self.cluster.events.publish(
                            &subject,
                            Reason::EffectFailed,
                            format!("gave up on {name} after {} attempts: {why}", job.attempts + 1),
                        );
                    }
                }
                queue.finish(&job);
                // Its source change never landed (or landed and went): the
                // snapshot made for it is garbage, unless something uses it.
                if let Some(key) = job.effect.target() {
                    self.collect_unused(key);
                }
            }
            Attempt::Wait(why) | Attempt::Retry(why) => {
                job.attempts += 1;
                metrics.effect(name, "retried");
                tracing::debug!(effect = name, attempts = job.attempts, "will retry: {why}");
                let delay = backoff(job.attempts);
                queue.send_after(job, delay);
            }
        }
    }

    async fn run(&self, effect: &Effect) -> Attempt {
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

    async fn adopt(&self, ns: &str, owner_kind: &str, owner_name: &str, snapshots: &[(String, String)]) -> Attempt {
        let owner = match self.read(owner_kind, ns, owner_name).await {
            Ok(Some(owner)) => owner,
            Ok(None) => return Attempt::Wait(format!("{owner_kind}/{owner_name} is not visible yet")),
            Err(e) => return Attempt::Retry(e.to_string()),
        };
        for (kind, name) in snapshots {
            let snapshot = match self.cluster.fetch(kind, ns, name).await {
                Ok(Some(s)) => s,
                Ok(None) => continue,
                Err(e) => return Attempt::Retry(e.to_string()),
            };
            let Some(ops) = adopt_ops(&owner, &snapshot) else {
                continue;
            };
            match self.cluster.patch(kind, ns, name, ops).await {
                Ok(()) => {
                    self.cluster.metrics.adoptions.inc();
                    tracing::info!("{kind}/{name} adopted by {owner_kind}/{owner_name}");
                }
                Err(e) => return Attempt::Retry(e.to_string()),
            }
        }
        self.release_unnamed(&owner, ns).await;
        Attempt::Done
    }

    /// A new revision is the moment its workload's template moved on: the
    /// workload stops owning the snapshots it no longer names, so that
    /// pruning their revisions collects them at once. Best effort: the
    /// periodic pass makes the same decisions.
    async fn release_unnamed(&self, revision: &Value, ns: &str) {
        let Some((kind, name, uid)) = controller_of(revision) else {
            return;
        };
        let workload = match self.cluster.fetch(&kind, ns, &name).await {
            Ok(Some(w)) if w["metadata"]["uid"] == uid.as_str() => w,
            _ => return,
        };
        let mut snapshots = Vec::new();
        for k in ["ConfigMap", "Secret"] {
            let selector =
                Selector::parse(&format!("{}={}", keys::MANAGED_BY, keys::MANAGED_BY_VALUE)).expect("a valid selector");
            let _ = self
                .cluster
                .cache
                .list(k, ns, &selector, &mut |o| snapshots.push(o.clone()));
        }
        let objects: Vec<&Value> = std::iter::once(&workload).chain(&snapshots).collect();
        for ((k, ns, n), ops) in bridges(&objects) {
            match self.cluster.patch(&k, &ns, &n, ops).await {
                Ok(()) => tracing::info!("{k}/{n}'s owners brought up to date for {kind}/{name}"),
                Err(e) => tracing::debug!("{k}/{n}: {e}; the periodic pass will"),
            }
        }
    }

    /// `patch_workload`, judged by the shared rules on the workload and the
    /// source as the API server has them now.
    async fn patch(&self, ns: &str, request: &Value) -> Attempt {
        let intent = match PatchIntent::parse(ns, request) {
            Ok(i) => i,
            Err(e) => {
                return Attempt::Dropped {
                    why: format!("dropped a patch: {e}"),
                    collect: None,
                }
            }
        };
        let source_kind = intent.source.kind.kind();
        let (workload, source, snapshot) = match tokio::try_join!(
            self.cluster.fetch(&intent.kind, ns, &intent.name),
            self.cluster.fetch(source_kind, ns, &intent.source.name),
            self.read(source_kind, ns, &intent.snapshot),
        ) {
            Ok(read) => read,
            Err(e) => return Attempt::Retry(e.to_string()),
        };
        let seen = Observed {
            workload: workload.as_ref(),
            source: source.as_ref(),
            snapshot_exists: snapshot.is_some(),
        };
        match decide_patch(&intent, &seen, self.cluster.now(), &self.rules) {
            Verdict::Apply(ops) => match self.cluster.patch(&intent.kind, ns, &intent.name, ops).await {
                Ok(()) => {
                    self.cluster.metrics.rollouts.inc();
                    tracing::info!(
                        "watch: rolled out {}/{} to {}",
                        intent.kind,
                        intent.name,
                        intent.snapshot
                    );
                    if let Some(w) = &workload {
                        self.cluster.events.publish(
                            w,
                            Reason::ConfigRolledOut,
                            format!(
                                "{} changed: rolling out with snapshot {}",
                                intent.source, intent.snapshot
                            ),
                        );
                    }
                    Attempt::Done
                }
                // The workload moved since it was read: judge it again.
                Err(BackendError::Conflict(e)) => Attempt::Retry(format!("conflict: {e}")),
                Err(e) => Attempt::Retry(format!("patching {}/{}: {e}", intent.kind, intent.name)),
            },
            Verdict::Done(_) => Attempt::Done,
            Verdict::Wait(why) => Attempt::Wait(why),
            Verdict::Later(at) => Attempt::Later(at),
            Verdict::Drop {
                reason,
                collect,
                notable,
            } => {
                if let Some(w) = workload.as_ref().filter(|_| notable) {
                    self.cluster.events.publish(
                        w,
                        Reason::RolloutDropped,
                        format!(
                            "not rolling out {}'s change (snapshot {}): {reason}",
                            intent.source, intent.snapshot
                        ),
                    );
                }
                Attempt::Dropped {
                    why: reason,
                    collect: collect.then(|| (source_kind.to_string(), ns.to_string(), intent.snapshot.clone())),
                }
            }
        }
    }

    /// The object an effect's Event is about: the workload a patch moves,
    /// the revision an adoption waits for.
    async fn subject(&self, effect: &Effect) -> Option<Value> {
        let (kind, ns, name) = match effect {
            Effect::Patch { namespace, request } => {
                let intent = PatchIntent::parse(namespace, request).ok()?;
                (intent.kind, namespace.clone(), intent.name)
            }
            Effect::Adopt {
                namespace,
                owner_kind,
                owner_name,
                ..
            } => (owner_kind.clone(), namespace.clone(), owner_name.clone()),
        };
        self.cluster.fetch(&kind, &ns, &name).await.ok().flatten()
    }

    /// Deletes a snapshot made for a patch that was dropped, at once, if
    /// nothing owns, references or awaits it.
    fn collect_unused(&self, (kind, ns, name): Key) {
        let mut objects = Vec::new();
        for (_, holder, _) in config_snapshot_policy::kinds::holders() {
            let _ = self
                .cluster
                .cache
                .list(holder, &ns, &Default::default(), &mut |o| objects.push(o.clone()));
        }
        let Ok(Some(snapshot)) = self.cluster.cache.get(&kind, &ns, &name) else {
            return;
        };
        objects.push(snapshot.clone());
        let all: Vec<&Value> = objects.iter().collect();
        let doomed = orphans(&all, &self.cluster.awaited_targets(), self.cluster.now(), 0);
        let Some(d) = doomed.into_iter().find(|d| d.name == name) else {
            return;
        };
        let cluster = self.cluster.clone();
        // The backend blocks on the runtime: off the async workers.
        tokio::task::spawn_blocking(move || {
            match delete_guarded(cluster.as_ref(), &snapshot, &d.uid, Some(&d.resource_version)) {
                Ok(()) => tracing::info!("{kind}/{name} collected: made for a rollout that did not happen"),
                Err(e) => tracing::debug!("kept {kind}/{name}: {e}"),
            }
        });
    }

    async fn read(&self, kind: &str, ns: &str, name: &str) -> Result<Option<Value>, BackendError> {
        match self.cluster.cache.get(kind, ns, name).map_err(BackendError::NotFound)? {
            Some(o) => Ok(Some(o)),
            None => self.cluster.fetch(kind, ns, name).await,
        }
    }
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
}
