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
//! A tenant's work stays theirs (docs/security.md, "A tenant's work stays
//! theirs"). Jobs ready to run are taken in turn by namespace, so one
//! namespace's storm delays another's rollout by a turn, not by the storm.
//! Adoptions and sweeps have places ([`crate::lifecycle::Places`]): past
//! `capacity` in all, or a quarter of it in one namespace, a revision's
//! adoption is refused at its admission and a pass's is dropped, so that
//! one namespace's revisions cannot crowd out another's. A watch rollout is never refused for a full queue:
//! each is bounded by its slot instead, one per workload and source
//! ([`Slot::Patch`]), which holds the newest content's rollout and the one
//! running, however often the source changes. Every question the queue
//! asks (is this on its way, what is held for this workload, what is due)
//! is a keyed lookup, never a scan of what other namespaces queued.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tracing::Instrument as _;

use super::fair::Turns;
use super::source_changes::SourceChanges;
use crate::cluster::Key;
use crate::lifecycle::{Begun, Driver, Effect, Hold, InFlight, Next, Room, Rules, Slot};
use crate::serve::tell::report::Report;
use crate::serve::view::apiserver::KubeCluster;

#[derive(Debug, Clone)]
pub struct QueueSettings {
    /// How long an effect may wait for its precondition (the source change
    /// persisted, the owner created) or keep failing before it is over.
    pub wait_for: Duration,
    pub workers: usize,
}

impl Default for QueueSettings {
    fn default() -> Self {
        QueueSettings {
            wait_for: Duration::from_secs(30),
            workers: 4,
        }
    }
}

/// One slot's turn in the queue: the effect it runs is the slot's newest,
/// read from the ledger ([`InFlight::take`]) when it runs.
struct Job {
    slot: Slot,
    /// The effect this job ran last: another one taken means a newer
    /// effect took the slot's place, and its count of attempts and its
    /// patience start afresh.
    ran: Option<Effect>,
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

impl Job {
    fn new(slot: Slot) -> Job {
        Job {
            slot,
            ran: None,
            attempts: 0,
            since: Instant::now(),
            held_since: None,
            held_by: "",
            pends: false,
        }
    }

    /// The workload a watch rollout moves: one of its rollouts runs at a
    /// time.
    fn rolls(&self) -> Option<&Key> {
        match &self.slot {
            Slot::Patch(workload, _) => Some(workload),
            Slot::Sweep(..) | Slot::Adopt { .. } => None,
        }
    }
}

/// The jobs held (by the storm guard, a window, settle, notify, an
/// approval), keyed: by slot, by when they are due, by the workload whose
/// writes wake them, by what holds them. Nothing asked of it scans them.
#[derive(Default)]
struct Parked {
    jobs: HashMap<Slot, (i64, u64, Job)>,
    due: BTreeMap<(i64, u64), Slot>,
    by_workload: HashMap<Key, HashSet<Slot>>,
    /// Per reason, when each held job was first held: the gauges.
    held: HashMap<&'static str, BTreeSet<(Instant, u64)>>,
    seq: u64,
}

impl Parked {
    fn park(&mut self, at: i64, job: Job) {
        self.seq += 1;
        let seq = self.seq;
        if let Some(workload) = job.rolls().filter(|_| job.pends) {
            self.by_workload
                .entry(workload.clone())
                .or_default()
                .insert(job.slot.clone());
        }
        if let Some(since) = job.held_since {
            self.held.entry(job.held_by).or_default().insert((since, seq));
        }
        self.due.insert((at, seq), job.slot.clone());
        if let Some((at, seq, earlier)) = self.jobs.insert(job.slot.clone(), (at, seq, job)) {
            // Two jobs of one slot: the later holds it (the earlier found
            // nothing left to run, or will).
            self.due.remove(&(at, seq));
            if let Some(since) = earlier.held_since {
                self.forget_held(earlier.held_by, since, seq);
            }
        }
    }

    fn forget_held(&mut self, reason: &'static str, since: Instant, seq: u64) {
        if let Some(held) = self.held.get_mut(reason) {
            held.remove(&(since, seq));
        }
    }

    fn unpark(&mut self, slot: &Slot) -> Option<Job> {
        let (at, seq, job) = self.jobs.remove(slot)?;
        self.due.remove(&(at, seq));
        if let Some(workload) = job.rolls() {
            if let Some(slots) = self.by_workload.get_mut(workload) {
                slots.remove(slot);
                if slots.is_empty() {
                    self.by_workload.remove(workload);
                }
            }
        }
        if let Some(since) = job.held_since {
            self.forget_held(job.held_by, since, seq);
        }
        Some(job)
    }

    /// Makes `slot`'s job due now; `false` if none is held.
    fn wake(&mut self, slot: &Slot) -> bool {
        let Some((at, seq, _)) = self.jobs.get_mut(slot) else {
            return false;
        };
        self.due.remove(&(*at, *seq));
        *at = i64::MIN;
        self.due.insert((i64::MIN, *seq), slot.clone());
        true
    }

    /// The jobs due at `now`, the one held first first.
    fn take_due(&mut self, now: i64) -> Vec<Job> {
        let slots: Vec<Slot> = self
            .due
            .range(..(now.saturating_add(1), 0))
            .map(|(_, slot)| slot.clone())
            .collect();
        let mut jobs: Vec<Job> = slots.iter().filter_map(|slot| self.unpark(slot)).collect();
        jobs.sort_by_key(|job| job.held_since);
        jobs
    }

    fn next_due(&self) -> Option<i64> {
        self.due.keys().next().map(|(at, _)| *at)
    }
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
    /// The jobs ready to run, in turn by namespace.
    ready: Arc<Mutex<Turns<Job>>>,
    arrived: Arc<Notify>,
    /// Adoptions and sweeps on their way, at most: in all, and of one
    /// namespace.
    carry: Arc<WorkerContext>,
    /// Jobs held, with when to look again.
    parked: Arc<Mutex<Parked>>,
    /// The workloads a watch rollout is running for now: the storm guard
    /// lets one of a workload's held rollouts go at a time, the one held
    /// first, as replay does; run together, whichever wrote first would
    /// win and the other wait an interval.
    running: Arc<Mutex<HashSet<Key>>>,
    /// The sources serve's watch saw change, waiting to be judged: their
    /// watchers' rollouts come from there.
    pub(crate) sources: Arc<SourceChanges>,
}

pub struct Worker {
    queue: Queue,
    settings: QueueSettings,
}

/// How often parked jobs are checked against the clock.
const TICK: Duration = Duration::from_millis(200);

/// How many changed sources are judged at once.
const SOURCE_JUDGES: usize = 2;

impl Queue {
    pub fn new(carry: Arc<WorkerContext>, settings: QueueSettings) -> (Queue, Worker) {
        let queue = Queue {
            ready: Arc::default(),
            arrived: Arc::default(),
            carry,
            parked: Arc::default(),
            running: Arc::default(),
            sources: Arc::default(),
        };
        let worker = Worker {
            queue: queue.clone(),
            settings,
        };
        (queue, worker)
    }

    fn parked(&self) -> MutexGuard<'_, Parked> {
        self.parked.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ready(&self) -> MutexGuard<'_, Turns<Job>> {
        self.ready.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `effect`, unless one doing the same work is already on its
    /// way ([`Effect::same_work`]): a resync pass re-derives the rollouts
    /// and adoptions it finds undone, and one still retrying is undone too.
    /// Running both would write once and report a failure twice; a
    /// controller's work queue holds an item once, too. A watch rollout for
    /// newer content of a source takes the place of the one of that
    /// workload and source still waiting ([`Begun::Replaced`]).
    pub fn submit(&self, effect: Effect) {
        let metrics = &self.carry.report.metrics;
        // An admission's adoption had its place when the admission asked
        // (`InFlight::room`, or the revision was refused): it is kept, even
        // if others took the last places since. That overshoot is bounded
        // by the admissions evaluated at once.
        let promised = matches!(effect, Effect::Patch { .. } | Effect::Adopt { stored_as: Some(_), .. });
        if !promised {
            let room = self.carry.in_flight.room(effect.namespace());
            if room != Room::Free {
                metrics.effect(effect.label(), "dropped");
                tracing::warn!(
                    effect = effect.label(),
                    namespace = effect.namespace(),
                    "deferred-effect queue full{}; dropped (the resync re-derives adoptions, the sweep collects snapshots)",
                    if room == Room::Full { "" } else { " for this namespace" }
                );
                return;
            }
        }
        let slot = Slot::of(&effect);
        // Under the parked lock, as a held job is parked under it: a newer
        // rollout never finds its slot's job between run and hold.
        let mut parked = self.parked();
        match self.carry.in_flight.begin(&effect) {
            Begun::New => {
                drop(parked);
                self.send(Job::new(slot));
            }
            Begun::Same => {
                metrics.effect(effect.label(), "coalesced");
                tracing::debug!(effect = effect.label(), "the same work is on its way; not queued twice");
            }
            Begun::Replaced => {
                metrics.effect(effect.label(), "coalesced");
                // Held for an older content: the newer is judged now, as a
                // change that just came (it may be held for other reasons,
                // and must be recorded as pending at once).
                if let Some(mut job) = parked.unpark(&slot) {
                    drop(parked);
                    job.held_since = None;
                    job.held_by = "";
                    self.send(job);
                }
            }
        }
    }

    /// Whether every job submitted is over or held, none held is due (a
    /// woken one waits for the workload's running rollout, then the next
    /// tick), and no changed source waits to be judged: nothing more
    /// happens until the clock moves.
    pub fn quiet(&self) -> bool {
        let now = self.carry.cluster.now();
        let parked = self.parked();
        self.sources.quiet()
            && self.carry.in_flight.len() == parked.jobs.len()
            && parked.next_due().is_none_or(|at| at > now)
    }

    /// A write of `workload` is stored: its held rollouts that wait for
    /// what its users write (an approval, a window, a mode) are judged
    /// again now ([`Hold::pends`]).
    pub(crate) fn wake(&self, workload: &crate::cluster::Key) {
        let woke = {
            let mut parked = self.parked();
            let slots: Vec<Slot> = parked
                .by_workload
                .get(workload)
                .map(|slots| slots.iter().cloned().collect())
                .unwrap_or_default();
            let mut woke = false;
            for slot in slots {
                woke |= parked.wake(&slot);
            }
            woke
        };
        if woke {
            self.release_due();
        }
    }

    /// When the earliest job held may run.
    pub fn next_due(&self) -> Option<i64> {
        self.parked().next_due()
    }

    /// Hands `job` to the workers. Its place was taken at [`Queue::submit`]:
    /// a retry or a release keeps it.
    fn send(&self, job: Job) {
        let namespace = job.slot.namespace().to_string();
        self.ready().push(&namespace, job);
        self.carry.report.metrics.queue_depth.inc();
        self.arrived.notify_one();
    }

    fn send_after(&self, job: Job, delay: Duration) {
        let queue = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            queue.send(job);
        });
    }

    /// The next job ready, in turn by namespace.
    async fn next_ready(&self) -> Job {
        loop {
            let arrived = self.arrived.notified();
            if let Some(job) = self.ready().pop() {
                self.carry.report.metrics.queue_depth.dec();
                return job;
            }
            arrived.await;
        }
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
            for job in parked.take_due(now) {
                match job.rolls() {
                    Some(workload) if busy.contains(workload) => {
                        // Due, behind its workload's running rollout: looked
                        // at again at the next tick, still first in line.
                        let at = now;
                        parked.park(at, job);
                    }
                    workload => {
                        busy.extend(workload.cloned());
                        due.push(job);
                    }
                }
            }
            self.gauge_held(&parked);
            due
        };
        for mut job in due {
            // The wait for preconditions starts when the guard lets go.
            job.since = Instant::now();
            self.send(job);
        }
    }

    fn gauge_held(&self, parked: &Parked) {
        let metrics = &self.carry.report.metrics;
        for reason in Hold::LABELS {
            let held = parked.held.get(reason);
            let label = crate::serve::tell::metrics::HeldLabels { reason };
            metrics
                .held
                .get_or_create(&label)
                .set(held.map_or(0, BTreeSet::len) as i64);
            let oldest = held
                .and_then(|h| h.first())
                .map_or(0, |(since, _)| since.elapsed().as_secs());
            metrics.oldest_held.get_or_create(&label).set(oldest as i64);
        }
    }

    /// Runs one job and schedules what comes next.
    async fn handle(&self, job: Job, wait_for: Duration) {
        let subject = job.rolls().cloned();
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
        let in_flight = self.carry.in_flight.clone();
        // Nothing waits in the slot: another job of it took the effect.
        let Some(effect) = in_flight.take(&job.slot) else {
            return;
        };
        if job.ran.as_ref() != Some(&effect) {
            // A newer effect took the slot's place: it gets its own
            // attempts and patience.
            job.attempts = 0;
            job.since = Instant::now();
            job.ran = Some(effect.clone());
        }
        let carry = self.carry.clone();
        let attempts = job.attempts;
        let patient = job.since.elapsed() < wait_for;
        // The driver blocks on the runtime for each API call: off the
        // async workers, inside the effect's span.
        let span = tracing::Span::current();
        let running = effect.clone();
        let next = tokio::task::spawn_blocking(move || {
            let _in = span.enter();
            carry.driver().step(&running, patient, attempts)
        })
        .await;
        let metrics = &self.carry.report.metrics;
        let name = effect.label();
        match next {
            Ok(Next::Over(ending)) => {
                metrics.effect(name, ending.label());
                // From enqueue to an end: how long a user waits for a watch
                // rollout or an adoption.
                metrics.effect_wait.observe(job.since.elapsed().as_secs_f64());
                if in_flight.waiting(&job.slot) {
                    self.send(job);
                }
            }
            Ok(Next::Park(at, hold)) => {
                let mut parked = self.parked();
                if in_flight.put_back(&effect) {
                    drop(parked);
                    self.send(job);
                    return;
                }
                job.held_since.get_or_insert_with(Instant::now);
                job.held_by = hold.label();
                job.pends = hold.pends();
                parked.park(at, job);
            }
            Ok(Next::Again) => {
                if in_flight.put_back(&effect) {
                    self.send(job);
                    return;
                }
                job.attempts += 1;
                metrics.effect(name, "retried");
                let delay = backoff(job.attempts);
                self.send_after(job, delay);
            }
            Err(e) => {
                tracing::error!(effect = name, "an effect's run panicked: {e}");
                metrics.effect(name, "failed");
                if in_flight.end(&effect) {
                    self.send(job);
                }
            }
        }
    }
}

impl Worker {
    /// Runs effects until serve stops, a few at a time, and judges the
    /// sources its watch saw change.
    pub async fn run(self) {
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
        let judges: Vec<_> = (0..SOURCE_JUDGES)
            .map(|_| {
                let sources = self.queue.sources.clone();
                tokio::spawn(async move { sources.run().await })
            })
            .collect();
        loop {
            let job = self.queue.next_ready().await;
            let Ok(permit) = permits.clone().acquire_owned().await else {
                break;
            };
            let queue = self.queue.clone();
            let wait_for = self.settings.wait_for;
            let span = tracing::info_span!("effect", namespace = job.slot.namespace(), attempt = job.attempts);
            tokio::spawn(
                async move {
                    queue.handle(job, wait_for).await;
                    drop(permit);
                }
                .instrument(span),
            );
        }
        ticker.abort();
        for judge in judges {
            judge.abort();
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
