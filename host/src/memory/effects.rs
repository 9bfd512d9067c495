//! Replay's driver of the deferred effects: it runs them in order once the
//! admission that asked for them is persisted, and moves the clock through
//! the moments the storm guard releases them. The decisions are
//! [`crate::lifecycle::effects`], the same ones `serve` drives.

use anyhow::Result;
use config_snapshot_policy::keys;
use serde_json::Value;

use super::{Simulator, HOST_USER};
use crate::backend::Backend;
use crate::lifecycle::effects::{adopt_ops, apply_ops, decide_patch, Observed};
use crate::lifecycle::resync::{bridges, controller_of, orphans};
use crate::lifecycle::{Effect, PatchIntent, Verdict};

/// A deferred effect and the admission it waits for.
#[derive(Debug, Clone)]
pub struct Pending {
    pub admission: String,
    /// Set once the admitted write is persisted; dropped if it never is.
    pub released: bool,
    pub effect: Effect,
    pub attempts: u32,
    /// Held back (storm guard) until this time.
    pub not_before: i64,
}

impl Pending {
    pub fn new(admission: &str, effect: Effect) -> Pending {
        Pending {
            admission: admission.to_string(),
            released: false,
            effect,
            attempts: 0,
            not_before: i64::MIN,
        }
    }
}

/// How many times an effect waiting for a precondition is looked at before
/// it is given up (serve waits a while instead; replay's time stands still).
const ATTEMPTS: u32 = 5;

enum Progress {
    Done,
    Wait,
    Later(i64),
}

impl Simulator {
    /// Runs released deferred effects until none can make progress now.
    pub fn settle(&mut self) -> Result<()> {
        if self.hold_effects {
            return Ok(());
        }
        for _ in 0..100 {
            let now = self.now();
            let ready: Vec<_> = {
                let mut pending = self.shared.pending();
                let (ready, rest): (Vec<_>, Vec<_>) =
                    pending.drain(..).partition(|p| p.released && p.not_before <= now);
                *pending = rest;
                ready
            };
            if ready.is_empty() {
                return Ok(());
            }
            let mut progressed = false;
            let mut keep = Vec::new();
            for mut p in ready {
                match self.run_effect(&p.effect)? {
                    Progress::Done => progressed = true,
                    Progress::Wait => {
                        p.attempts += 1;
                        if p.attempts < ATTEMPTS {
                            keep.push(p);
                        } else {
                            self.note(format!("gave up on {}", p.effect.describe()));
                        }
                    }
                    Progress::Later(at) => {
                        p.not_before = at;
                        keep.push(p);
                    }
                }
            }
            self.shared.pending().extend(keep);
            if !progressed {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Lets the controllers retry what was refused, then the effects run.
    pub fn catch_up(&mut self) -> Result<()> {
        self.reconcile_pending()?;
        self.settle()
    }

    /// Moves the clock, stopping at each moment the storm guard releases a
    /// held patch, then runs the periodic resync once.
    pub fn advance(&mut self, secs: i64) -> Result<()> {
        let target = self.now() + secs;
        loop {
            let now = self.now();
            let next = self
                .shared
                .pending()
                .iter()
                .filter(|p| p.released && p.not_before > now)
                .map(|p| p.not_before)
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

    /// Runs one effect now, whatever it is waiting for (the resync's repairs).
    pub(crate) fn run_effect_now(&mut self, effect: &Effect) -> Result<()> {
        self.run_effect(effect).map(drop)
    }

    fn run_effect(&mut self, effect: &Effect) -> Result<Progress> {
        match effect {
            Effect::Adopt {
                namespace,
                owner_kind,
                owner_name,
                snapshots,
            } => {
                let Some(owner) = self.get(owner_kind, namespace, owner_name) else {
                    return Ok(Progress::Wait);
                };
                for (kind, name) in snapshots {
                    let Some(snapshot) = self.get(kind, namespace, name) else {
                        continue;
                    };
                    if let Some(ops) = adopt_ops(&owner, &snapshot) {
                        let mut adopted = snapshot.clone();
                        apply_ops(&mut adopted, &ops).map_err(anyhow::Error::msg)?;
                        // A snapshot is ours: its writes skip the webhook.
                        self.shared.store().persist(adopted);
                        self.note(format!("{kind}/{name} adopted by {owner_kind}/{owner_name}"));
                    }
                }
                self.release_unnamed(&owner, namespace);
                Ok(Progress::Done)
            }
            Effect::Patch { namespace, request } => self.run_patch(namespace, request),
        }
    }

    /// A new revision is the moment its workload's template moved on: the
    /// workload stops owning the snapshots it no longer names, so that
    /// pruning their revisions collects them at once, not a pass later.
    fn release_unnamed(&self, revision: &Value, namespace: &str) {
        let Some((kind, name, uid)) = controller_of(revision) else {
            return;
        };
        let Some(workload) = self
            .get(&kind, namespace, &name)
            .filter(|w| w["metadata"]["uid"] == uid.as_str())
        else {
            return;
        };
        let snapshots: Vec<Value> = {
            let store = self.shared.store();
            ["ConfigMap", "Secret"]
                .iter()
                .flat_map(|k| {
                    store
                        .list(k, namespace)
                        .filter(|o| keys::is_snapshot(o))
                        .cloned()
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        let objects: Vec<&Value> = std::iter::once(&workload).chain(&snapshots).collect();
        for ((k, ns, n), ops) in bridges(&objects) {
            if Backend::patch(self.shared.as_ref(), &k, &ns, &n, ops).is_ok() {
                self.note(format!("{k}/{n}'s owners brought up to date for {kind}/{name}"));
            }
        }
    }

    fn run_patch(&mut self, namespace: &str, request: &Value) -> Result<Progress> {
        let intent = match PatchIntent::parse(namespace, request) {
            Ok(i) => i,
            Err(e) => {
                self.note(format!("dropped a patch: {e}"));
                return Ok(Progress::Done);
            }
        };
        let workload = self.get(&intent.kind, namespace, &intent.name);
        let source = self.get(intent.source.kind.kind(), namespace, &intent.source.name);
        let snapshot_exists = self
            .get(intent.source.kind.kind(), namespace, &intent.snapshot)
            .is_some();
        let seen = Observed {
            workload: workload.as_ref(),
            source: source.as_ref(),
            snapshot_exists,
        };
        match decide_patch(&intent, &seen, self.now(), &self.effect_rules) {
            Verdict::Apply(ops) => {
                let workload = workload.expect("decided on it");
                let mut patched = workload.clone();
                apply_ops(&mut patched, &ops).map_err(anyhow::Error::msg)?;
                let who = format!("{}/{}", intent.kind, intent.name);
                self.note(format!("watch: rolling out {who} to {}", intent.snapshot));
                let a = self.write(patched, Some(workload), false, HOST_USER)?;
                if a.allowed {
                    self.rollouts.push((
                        intent.kind.clone(),
                        namespace.to_string(),
                        intent.name.clone(),
                        self.now(),
                    ));
                } else {
                    self.note(format!(
                        "watch rollout of {who} refused: {}",
                        a.message.unwrap_or_default()
                    ));
                    self.collect_unused(intent.source.kind.kind(), namespace, &intent.snapshot);
                }
                Ok(Progress::Done)
            }
            Verdict::Done(_) => Ok(Progress::Done),
            // Replay runs a patch only once its source change is persisted:
            // a source that does not hold it any more moved on (or is gone).
            Verdict::Wait(_) => {
                self.note(format!(
                    "patch of {}/{} to {} superseded: {} changed again",
                    intent.kind, intent.name, intent.snapshot, intent.source
                ));
                self.collect_unused(intent.source.kind.kind(), namespace, &intent.snapshot);
                Ok(Progress::Done)
            }
            Verdict::Later(at) => Ok(Progress::Later(at)),
            Verdict::Drop { reason, collect, .. } => {
                self.note(reason);
                if collect {
                    self.collect_unused(intent.source.kind.kind(), namespace, &intent.snapshot);
                }
                Ok(Progress::Done)
            }
        }
    }

    /// Deletes a snapshot made for a patch that was dropped, at once, if
    /// nothing owns, references or awaits it.
    fn collect_unused(&self, kind: &str, namespace: &str, name: &str) {
        let objects = self.objects();
        let in_namespace: Vec<&Value> = objects
            .iter()
            .filter(|o| o["metadata"]["namespace"] == namespace)
            .collect();
        let awaited = self.awaited_snapshots();
        let doomed = orphans(&in_namespace, &awaited, self.now(), 0);
        let Some(d) = doomed.iter().find(|d| d.kind == kind && d.name == name) else {
            return;
        };
        let Some(snapshot) = self.get(kind, namespace, name).filter(keys::is_snapshot) else {
            return;
        };
        if self.delete_snapshot(&snapshot, &d.uid, &d.resource_version) {
            self.note(format!(
                "{kind}/{name} collected: made for a rollout that did not happen"
            ));
        }
    }
}
