//! Replay's scheduling of deferred effects and of the periodic pass. What
//! each effect does, when it is over and what is then collected is
//! [`crate::lifecycle::Driver`]'s, as for serve; replay decides only when
//! to look: effects run in order once the write that asked for them is
//! persisted, and replay's clock moves only between steps (`advanceTime`
//! stops at each moment the storm guard releases one).
//!
//! An effect that waits for a precondition, or whose write failed, gets
//! one look here, where serve looks again for `--effect-wait`. Both then
//! drop it the same way (and collect the snapshot made for it). The
//! difference is what each host can know: replay releases an effect only
//! once the write that asked for it is persisted, and nothing happens
//! between two looks but more writes, so a precondition that does not hold
//! now was overtaken (a source deleted, a revision refused), where serve
//! queues an effect before the API server has stored the request, and must
//! give that write time to land.

use config_snapshot_policy::model::object::ObjectExt;
use std::sync::atomic::Ordering;

use anyhow::Result;
use serde_json::Value;

use super::shared::lock;
use super::{Job, Simulator, HOST_USER};
use crate::lifecycle::resync::{PassHost, ReadmitError};
use crate::lifecycle::{Begun, Driver, Effect, Next, Slot};

impl Simulator {
    pub(super) fn driver(&self) -> Driver<'_> {
        Driver::new(self, &self.effect_rules, &self.in_flight, self.shared.as_ref())
    }

    /// Queues an effect whose admission is persisted, unless the same work
    /// is on its way already. A watch rollout for newer content takes the
    /// place of the one its workload and source have waiting, and is judged
    /// as a change that just came, behind what was queued before it (as in
    /// serve's queue).
    pub(crate) fn submit(&self, effect: Effect) {
        let slot = Slot::of(&effect);
        let seq = self.queued.fetch_add(1, Ordering::SeqCst);
        match self.in_flight.begin(&effect) {
            Begun::New => lock(&self.jobs).push(Job {
                slot,
                ran: None,
                attempts: 0,
                not_before: i64::MIN,
                pends: false,
                seq,
            }),
            Begun::Same => {}
            Begun::Replaced => {
                if let Some(job) = lock(&self.jobs).iter_mut().find(|j| j.slot == slot) {
                    job.not_before = i64::MIN;
                    job.pends = false;
                    job.seq = seq;
                }
            }
        }
    }

    /// The admitted write with this request uid is persisted: its effects
    /// may run.
    pub(crate) fn release(&self, uid: &str) {
        let released: Vec<Effect> = {
            let mut staged = lock(&self.staged);
            let (mine, rest) = staged.drain(..).partition(|(u, _)| u == uid);
            *staged = rest;
            mine.into_iter().map(|(_, e)| e).collect()
        };
        for effect in released {
            self.submit(effect);
        }
    }

    /// A write of `stored` is persisted: if it is a workload, its held
    /// rollouts that wait for what its users write are judged again at the
    /// next settle, as serve's queue does on the watch event.
    pub(crate) fn wake(&self, stored: &Value) {
        let kind = stored["kind"].as_str().unwrap_or_default();
        if config_snapshot_policy::model::kinds::WorkloadKind::from_kind(kind).is_none() {
            return;
        }
        let text = |p: &str| {
            stored
                .pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let workload = (kind.to_string(), text("/metadata/namespace"), text("/metadata/name"));
        for job in lock(&self.jobs).iter_mut() {
            if job.pends && matches!(&job.slot, Slot::Patch(rolled, _) if *rolled == workload) {
                job.not_before = i64::MIN;
            }
        }
    }

    /// The host restarts (replay's `restartHost`): every effect queued or
    /// staged is lost, as serve's queue is. Nothing the cluster stores is.
    pub fn restart_host(&self) {
        lock(&self.jobs).clear();
        lock(&self.staged).clear();
        self.in_flight.forget_all();
    }

    /// The admitted write with this request uid was refused or not
    /// persisted: its effects never run.
    pub(crate) fn drop_staged(&self, uid: Option<&str>) {
        if let Some(uid) = uid {
            lock(&self.staged).retain(|(u, _)| u != uid);
        }
    }

    /// Runs queued effects until none can make progress now. A write an
    /// effect makes goes through the write path, which settles too: only
    /// the outermost settle runs, the loop picks up what the inner ones
    /// queued.
    pub fn settle(&self) -> Result<()> {
        if self.hold_effects.load(Ordering::SeqCst) || self.settling.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let driver = self.driver();
        for _ in 0..100 {
            let now = self.now();
            let ready: Vec<Job> = {
                let mut jobs = lock(&self.jobs);
                let (ready, rest) = jobs.drain(..).partition(|j| j.not_before <= now);
                *jobs = rest;
                ready
            };
            if ready.is_empty() {
                break;
            }
            let mut progressed = false;
            let mut keep = Vec::new();
            for mut job in ready {
                // Nothing waits in its slot: another job of it ran it.
                let Some(effect) = self.in_flight.take(&job.slot) else {
                    continue;
                };
                if job.ran.as_ref() != Some(&effect) {
                    job.attempts = 0;
                    job.ran = Some(effect.clone());
                }
                match driver.step(&effect, false, job.attempts) {
                    Next::Over(_) => {
                        progressed = true;
                        if self.in_flight.waiting(&job.slot) {
                            job.not_before = i64::MIN;
                            keep.push(job);
                        }
                    }
                    Next::Again => {
                        if !self.in_flight.put_back(&effect) {
                            job.attempts += 1;
                        }
                        keep.push(job);
                    }
                    Next::Park(at, hold) => {
                        if self.in_flight.put_back(&effect) {
                            job.not_before = i64::MIN;
                        } else {
                            job.not_before = at;
                            job.pends = hold.pends();
                        }
                        keep.push(job);
                    }
                }
            }
            {
                let mut jobs = lock(&self.jobs);
                jobs.extend(keep);
                jobs.sort_by_key(|j| j.seq);
            }
            if !progressed {
                break;
            }
        }
        self.settling.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Lets the controllers retry what was refused, then the effects run.
    pub fn catch_up(&self) -> Result<()> {
        self.reconcile_pending()?;
        self.settle()
    }

    /// Moves the clock, stopping at each moment the storm guard releases a
    /// held effect, then runs the periodic pass once.
    pub fn advance(&self, secs: i64) -> Result<()> {
        let target = self.now() + secs;
        loop {
            let now = self.now();
            let next = lock(&self.jobs)
                .iter()
                .filter(|j| j.not_before > now)
                .map(|j| j.not_before)
                .min();
            match next {
                Some(t) if t <= target => {
                    self.shared.store().now = t;
                    self.settle()?;
                }
                _ => break,
            }
        }
        self.shared.store().now = target;
        self.catch_up()?;
        self.resync()
    }

    /// The periodic pass, as serve's resync runs it.
    pub fn resync(&self) -> Result<()> {
        self.driver().resync(self);
        Ok(())
    }
}

impl PassHost for Simulator {
    fn readmit(&self, operation: &str, object: &Value, old: Option<&Value>) -> Result<Option<Value>, ReadmitError> {
        let request = self.admission_request(operation, object, old, false, HOST_USER);
        let failed = |reason: String| ReadmitError {
            what: format!("{}/{}", object["kind"].as_str().unwrap_or_default(), object.name()),
            reason,
        };
        let (admission, mutated) = self.review(&request).map_err(|e| failed(format!("{e:#}")))?;
        for w in &admission.warnings {
            self.note(format!("warning: {w}"));
        }
        let uid = request["uid"].as_str().unwrap_or_default();
        if !admission.allowed {
            self.drop_staged(Some(uid));
            return Ok(None);
        }
        // The object is persisted already: the effects may run.
        self.release(uid);
        Ok(mutated.filter(|m| m != object))
    }

    fn submit(&self, effect: Effect) {
        Simulator::submit(self, effect)
    }

    fn settle(&self) {
        if let Err(e) = Simulator::settle(self) {
            self.note(format!("resync: {e:#}"));
        }
    }
}
