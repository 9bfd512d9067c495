//! Serve's scheduling of the deferred effects (`adopt`, `patch_workload`):
//! a bounded queue with workers, backoff, and the jobs the storm guard
//! holds. What an effect does, when it is over, what is then collected
//! and what users are told is [`crate::lifecycle::Driver`]'s, as for
//! replay; this module only decides when to look again.
//!
//! The storm guard is the rollout recorded on the workload itself, so every
//! replica and a restarted one see the same guard. The queue lives in
//! memory; what a restart loses is re-derived by the resync (watch
//! patches, adoptions) or collected by the sweep (snapshots), see
//! docs/serve.md.
//!
//! Its places are held per namespace (docs/security.md, "A tenant's work
//! stays theirs"): adoptions and sweeps are refused past `capacity` in all,
//! or past a quarter of it in one namespace, so that one namespace's
//! revisions cannot crowd out another's. A watch rollout is never refused
//! for a full queue: each comes from a source write the API server stored,
//! one per watcher and content (the same work is queued once), and one
//! that a newer edit superseded ends at its next look.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;
use tracing::Instrument as _;

use super::apiserver::KubeCluster;
use super::report::Report;
use crate::cluster::Key;
use crate::lifecycle::{Driver, Effect, Hold, InFlight, Next, Rules};

#[derive(Debug, Clone)]
pub struct QueueSettings {
    pub capacity: usize,
    /// How long an effect may wait for its precondition (the source change
    /// persisted, the owner created) or keep failing before it is over.
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
    /// When it was first held, and what holds it now (for the
    /// held-rollout gauges, by reason).
    held_since: Option<Instant>,
    held_by: &'static str,
    /// Held for what its workload's users write: a stored write of that
    /// workload wakes it ([`Hold::pends`]).
    pends: bool,
}

/// What carrying out an effect needs, shared by the workers.
pub struct WorkerContext {
    pub cluster: Arc<KubeCluster>,
    pub rules: Arc<Rules>,
    pub in_flight: Arc<InFlight>,
    pub report: Arc<Report>,
    /// What a watch rollout's snapshot is taken from, as an admission's is.
    pub budget: Arc<crate::lifecycle::Budget>,
}

impl WorkerContext {
    pub fn driver(&self) -> Driver<'_> {
        Driver::new(
            self.cluster.as_ref(),
            &self.rules,
            &self.in_flight,
            self.report.as_ref(),
        )
        .with_budget(&self.budget)
    }
}

#[derive(Clone)]
pub struct Queue {
    tx: mpsc::UnboundedSender<Job>,
    /// Adoptions and sweeps on their way, at most: in all, and of one
    /// namespace.
    capacity: usize,
    per_namespace: usize,
    carry: Arc<WorkerContext>,
    /// Jobs the storm guard holds, with when to look again.
    parked: Arc<Mutex<Vec<(i64, Job)>>>,
    /// The workloads a watch rollout is running for now: the storm guard
    /// lets one of a workload's held rollouts go at a time, the one held
    /// first, as replay does; run together, whichever wrote first would
    /// win and the other wait an interval.
    running: Arc<Mutex<HashSet<Key>>>,
}

pub struct Worker {
    rx: mpsc::UnboundedReceiver<Job>,
    queue: Queue,
    settings: QueueSettings,
}

/// How often parked jobs are checked against the clock.
const TICK: Duration = Duration::from_millis(200);

impl Queue {
    pub fn new(carry: Arc<WorkerContext>, settings: QueueSettings) -> (Queue, Worker) {
        let (tx, rx) = mpsc::unbounded_channel();
        let capacity = settings.capacity.max(1);
        let queue = Queue {
            tx,
            capacity,
            per_namespace: (capacity / 4).max(1),
            carry,
            parked: Arc::default(),
            running: Arc::default(),
        };
        let worker = Worker {
            rx,
            queue: queue.clone(),
            settings,
        };
        (queue, worker)
    }

    /// Queues `effect`, unless one doing the same work is already on its
    /// way ([`Effect::same_work`]): a resync pass re-derives the rollouts
    /// and adoptions it finds undone, and one still retrying is undone too.
    /// Running both would write once and report a failure twice; a
    /// controller's work queue holds an item once, too.
    pub fn submit(&self, effect: Effect) {
        let metrics = &self.carry.report.metrics;
        if !matches!(effect, Effect::Patch { .. }) {
            let (all, mine) = self.carry.in_flight.places_taken(effect.namespace());
            if all >= self.capacity || mine >= self.per_namespace {
                metrics.effect(effect.label(), "dropped");
                tracing::warn!(
                    effect = effect.label(),
                    namespace = effect.namespace(),
                    "deferred-effect queue full{}; dropped (the resync re-derives adoptions, the sweep collects snapshots)",
                    if all >= self.capacity { "" } else { " for this namespace" }
                );
                return;
            }
        }
        if !self.carry.in_flight.begin(&effect) {
            metrics.effect(effect.label(), "coalesced");
            tracing::debug!(effect = effect.label(), "the same work is on its way; not queued twice");
            return;
        }
        self.send(Job {
            effect,
            attempts: 0,
            since: Instant::now(),
            held_since: None,
            held_by: "",
            pends: false,
        });
    }

    /// Whether every job submitted is over or held, and none held is due
    /// (a woken one waits for the workload's running rollout, then the next
    /// tick): nothing more happens until the clock moves.
    pub fn quiet(&self) -> bool {
        let now = self.carry.cluster.now();
        let parked = self.parked();
        self.carry.in_flight.len() == parked.len() && parked.iter().all(|(at, _)| *at > now)
    }

    /// A write of `workload` is stored: its held rollouts that wait for
    /// what its users write (an approval, a window, a mode) are judged
    /// again now ([`Hold::pends`]).
    pub(crate) fn wake(&self, workload: &crate::cluster::Key) {
        let woke = {
            let mut parked = self.parked();
            let mut woke = false;
            for (at, job) in parked.iter_mut() {
                if job.pends && job.effect.rolls(workload) {
                    *at = i64::MIN;
                    woke = true;
                }
            }
            woke
        };
        if woke {
            self.release_due();
        }
    }

    /// When the earliest job the storm guard holds may run.
    pub fn next_due(&self) -> Option<i64> {
        self.parked().iter().map(|(at, _)| *at).min()
    }

    fn parked(&self) -> std::sync::MutexGuard<'_, Vec<(i64, Job)>> {
        self.parked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands `job` to the workers. Its place was taken at [`Queue::submit`]:
    /// a retry or a release keeps it.
    fn send(&self, job: Job) {
        let metrics = &self.carry.report.metrics;
        let effect = job.effect.clone();
        match self.tx.send(job) {
            Ok(()) => {
                metrics.queue_depth.inc();
            }
            // The workers are gone: serve is stopping.
            Err(_) => self.carry.in_flight.end(&effect),
        }
    }

    fn send_after(&self, job: Job, delay: Duration) {
        let queue = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            queue.send(job);
        });
    }

    /// Sends on the parked jobs whose time has come: of a workload's watch
    /// rollouts, the one held first, and only while none of its others
    /// runs.
    fn release_due(&self) {
        let now = self.carry.cluster.now();
        let due: Vec<Job> = {
            let mut parked = self.parked();
            let mut busy = self.running.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let mut due = Vec::new();
            let mut rest = Vec::new();
            // The one held first goes first, however often the others were
            // woken and parked again meanwhile.
            parked.sort_by_key(|(_, job)| job.held_since);
            for (at, job) in parked.drain(..) {
                let subject = matches!(job.effect, Effect::Patch { .. }).then(|| job.effect.subject());
                if at > now || subject.as_ref().is_some_and(|s| busy.contains(s)) {
                    rest.push((at, job));
                    continue;
                }
                busy.extend(subject);
                due.push(job);
            }
            *parked = rest;
            let metrics = &self.carry.report.metrics;
            for reason in Hold::LABELS {
                let held: Vec<&Job> = parked
                    .iter()
                    .map(|(_, job)| job)
                    .filter(|j| j.held_by == reason)
                    .collect();
                let label = crate::serve::metrics::HeldLabels { reason };
                metrics.held.get_or_create(&label).set(held.len() as i64);
                let oldest = held
                    .iter()
                    .filter_map(|job| Some(job.held_since?.elapsed().as_secs()))
                    .max()
                    .unwrap_or(0);
                metrics.oldest_held.get_or_create(&label).set(oldest as i64);
            }
            due
        };
        for mut job in due {
            // The wait for preconditions starts when the guard lets go.
            job.since = Instant::now();
            self.send(job);
        }
    }

    /// Runs one job and schedules what comes next.
    async fn handle(&self, job: Job, wait_for: Duration) {
        let subject = matches!(job.effect, Effect::Patch { .. }).then(|| job.effect.subject());
        if let Some(subject) = &subject {
            self.running
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(subject.clone());
        }
        self.run_one(job, wait_for).await;
        if let Some(subject) = &subject {
            self.running.lock().unwrap_or_else(|e| e.into_inner()).remove(subject);
        }
    }

    async fn run_one(&self, mut job: Job, wait_for: Duration) {
        let carry = self.carry.clone();
        let (effect, attempts) = (job.effect.clone(), job.attempts);
        let patient = job.since.elapsed() < wait_for;
        // The driver blocks on the runtime for each API call: off the
        // async workers, inside the effect's span.
        let span = tracing::Span::current();
        let next = tokio::task::spawn_blocking(move || {
            let _in = span.enter();
            carry.driver().step(&effect, patient, attempts)
        })
        .await;
        let metrics = &self.carry.report.metrics;
        let name = job.effect.label();
        match next {
            Ok(Next::Over(ending)) => {
                metrics.effect(name, ending.label());
                // From enqueue to an end: how long a user waits for a watch
                // rollout or an adoption.
                metrics.effect_wait.observe(job.since.elapsed().as_secs_f64());
            }
            Ok(Next::Park(at, hold)) => {
                job.held_since.get_or_insert_with(Instant::now);
                job.held_by = hold.label();
                job.pends = hold.pends();
                self.parked().push((at, job))
            }
            Ok(Next::Again) => {
                job.attempts += 1;
                metrics.effect(name, "retried");
                let delay = backoff(job.attempts);
                self.send_after(job, delay);
            }
            Err(e) => {
                tracing::error!(effect = name, "an effect's run panicked: {e}");
                self.carry.in_flight.end(&job.effect);
                metrics.effect(name, "failed");
            }
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
            self.queue.carry.report.metrics.queue_depth.dec();
            let Ok(permit) = permits.clone().acquire_owned().await else {
                break;
            };
            let queue = self.queue.clone();
            let wait_for = self.settings.wait_for;
            let span = tracing::info_span!(
                "effect",
                effect = job.effect.label(),
                namespace = job.effect.namespace(),
                attempt = job.attempts
            );
            tokio::spawn(
                async move {
                    queue.handle(job, wait_for).await;
                    drop(permit);
                }
                .instrument(span),
            );
        }
        ticker.abort();
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
