//! Carrying out deferred effects, once for both hosts: read what an effect
//! is judged against, ask [`super::verdict`], write, and say what comes
//! next. `replay` and `serve` differ only in how they schedule (replay's
//! clock stands still between steps, serve's queue has workers and
//! backoff); what an attempt means, when an effect is over, what is then
//! collected and what users are told is decided here.

use config_snapshot_policy::model::approval::{Entries, WatchMode};
use config_snapshot_policy::model::content::{snapshot_object, Content};
use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::kinds;
use config_snapshot_policy::model::object::ObjectExt;
use config_snapshot_policy::model::optin::OptIn;
use config_snapshot_policy::model::records::Rollback;
use config_snapshot_policy::model::references;
use config_snapshot_policy::model::source::SourceId;
use config_snapshot_policy::model::template::{self, Snapshots};
use config_snapshot_policy::rollout;
use config_snapshot_policy::rollout::annotation_path;
use config_snapshot_policy::snapshot::{self, owned};
use std::collections::HashSet;

use serde_json::{json, Value};

use super::budget::{written_size, Budget};
use super::effect::{Effect, PatchIntent, StoredAs};
use super::guard;
use super::in_flight::InFlight;
use super::observe::{Observer, Reason};
use super::pass::{add_references, bridges, controller_of, doomed, orphans, Doomed};
use super::verdict::{adopt_ops, apply_ops, decide_patch, Hold, Observed, Rules, Verdict};
use crate::cluster::proof::Proven;
use crate::cluster::{self, ApiError, Cluster, Judged, Key, Preconditions, Selector};

/// The most often a source is swept after its new snapshots (seconds).
pub(crate) const SWEEP_EVERY_SECS: i64 = 60;

/// What one run of an effect came to.
#[derive(Debug, PartialEq)]
pub enum Attempt {
    Done,
    /// Nothing to do any more (superseded, a rollback came first, target
    /// gone): not retried. `collect`: the snapshot made for it, deleted if
    /// nothing else uses it.
    Dropped {
        why: String,
        collect: Option<Key>,
    },
    /// A precondition does not hold yet (owner not created, source change
    /// not persisted): look again; past the host's patience it was
    /// superseded or never persisted, and is dropped.
    Wait(String),
    /// A read or write failed: try again; past the host's patience it has
    /// failed.
    Retry(String),
    /// Held back until this time (the cluster's clock), by `Hold`.
    Later(i64, Hold),
}

/// Why one of a watch rollout's preparatory writes did not land: it is
/// retried ([`Attempt::Retry`], with this as its reason).
#[derive(Debug, thiserror::Error)]
pub enum WriteFailed {
    /// The held change could not be recorded on its workload.
    #[error("recording the pending change on {who}: {source}")]
    Pending { who: String, source: ApiError },
    /// The workload could not be made an owner of the snapshot.
    #[error("bridging {snapshot}: {source}")]
    Bridge { snapshot: String, source: ApiError },
    /// The snapshot went before the workload could own it.
    #[error("{0} is gone")]
    Gone(String),
    /// Every write was refused for a version that had moved on.
    #[error("{0} kept changing while it was bridged")]
    KeptChanging(String),
}

/// What the host's scheduler does with the effect next.
#[derive(Debug, PartialEq)]
pub enum Next {
    /// Over: how it ended, for metrics.
    Over(Ending),
    /// Held until this time (unix seconds), by `Hold`.
    Park(i64, Hold),
    /// Look again later (with backoff).
    Again,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Done,
    Dropped,
    Failed,
}

impl Ending {
    pub fn label(self) -> &'static str {
        match self {
            Ending::Done => "done",
            Ending::Dropped => "dropped",
            Ending::Failed => "failed",
        }
    }
}

/// Everything carrying out an effect needs.
pub struct Driver<'a> {
    /// The cluster as the host acts on it: an object carrying our label
    /// without proof is seen without it ([`Proven`]).
    pub cluster: Proven<&'a dyn Cluster>,
    pub rules: &'a Rules,
    pub in_flight: &'a InFlight,
    pub observer: &'a dyn Observer,
    /// What a watch rollout's snapshot is taken from (serve's; replay has
    /// none).
    pub budget: Option<&'a Budget>,
}

impl<'a> Driver<'a> {
    pub fn new(
        cluster: &'a dyn Cluster,
        rules: &'a Rules,
        in_flight: &'a InFlight,
        observer: &'a dyn Observer,
    ) -> Self {
        Driver {
            cluster: Proven::new(cluster, rules.prover.clone()),
            rules,
            in_flight,
            observer,
            budget: None,
        }
    }

    /// The same driver, its snapshots counted against `budget`.
    pub fn with_budget(self, budget: &'a Budget) -> Self {
        Driver {
            budget: Some(budget),
            ..self
        }
    }
}

impl Driver<'_> {
    /// Runs `effect` once and decides what comes next. `patient`: whether
    /// the host still lets it wait or retry; `attempts`: how many runs came
    /// before this one.
    pub fn step(&self, effect: &Effect, patient: bool, attempts: u32) -> Next {
        let attempt = self.run(effect);
        let label = effect.label();
        match attempt {
            Attempt::Done => self.over(effect, Ending::Done),
            Attempt::Dropped { why, collect } => {
                self.observer.note(why);
                let ending = self.over(effect, Ending::Dropped);
                if let Some(key) = collect {
                    self.collect_unused(&key);
                }
                ending
            }
            Attempt::Later(at, hold) => {
                let said = match &hold {
                    Hold::StormGuard => Some(format!("held by the storm guard until {at} (unix seconds)")),
                    // Told once, when it is recorded as pending: its looks
                    // every few seconds say nothing new.
                    Hold::Window(_) | Hold::Notify | Hold::Approval { .. } | Hold::Settle { .. } => None,
                };
                if let Some(said) = said {
                    self.observer.note(format!("{} {said}", effect.describe()));
                }
                Next::Park(at, hold)
            }
            Attempt::Wait(_) | Attempt::Retry(_) if patient => Next::Again,
            Attempt::Wait(why) => {
                self.observer
                    .note(format!("{} dropped after waiting: {why}", effect.describe()));
                self.give_up(effect, Ending::Dropped)
            }
            Attempt::Retry(why) => {
                let message = format!("gave up on {label} after {} attempts: {why}", attempts + 1);
                let (kind, ns, name) = effect.subject();
                match self.cluster.get_fresh(&kind, &ns, &name) {
                    Ok(Some(subject)) => self.observer.tell(&subject, Reason::EffectFailed, message),
                    _ => self.observer.note(message),
                }
                self.give_up(effect, Ending::Failed)
            }
        }
    }

    fn over(&self, effect: &Effect, ending: Ending) -> Next {
        self.in_flight.end(effect);
        Next::Over(ending)
    }

    /// Its source change never landed (or landed and went): the snapshot
    /// made for it is garbage, unless something uses it.
    fn give_up(&self, effect: &Effect, ending: Ending) -> Next {
        let next = self.over(effect, ending);
        if let Some(key) = effect.target() {
            self.collect_unused(&key);
        }
        next
    }

    pub fn run(&self, effect: &Effect) -> Attempt {
        match effect {
            Effect::Adopt {
                namespace,
                owner_kind,
                owner_name,
                snapshots,
                stored_as,
            } => self.adopt(namespace, owner_kind, owner_name, snapshots, stored_as.as_ref()),
            Effect::Patch(intent) => self.patch(intent),
            Effect::Sweep {
                namespace,
                source,
                keep,
            } => self.sweep_source(namespace, source, keep),
        }
    }

    /// The sweep after a new snapshot of `source`: every other snapshot of
    /// it that nothing owns, references or awaits, unused for the grace
    /// period, deleted under the guard (uid and the version judged). Best
    /// effort: if anything cannot be listed, nothing goes, and the periodic
    /// pass sweeps later.
    fn sweep_source(&self, ns: &str, source: &SourceId, keep: &str) -> Attempt {
        let grace = self.rules.settings.orphan_grace_period_secs;
        let now = self.cluster.now();
        // The candidates first, copied only if they could go: most versions
        // of a busy source are young or owned, and then nothing else is
        // read.
        let mut candidates = Vec::new();
        let mut listed = self
            .cluster
            .list(source.kind.kind(), Some(ns), &Selector::managed(), &mut |o| {
                if keys::snapshot_source(o) == Some(source.name.as_str())
                    && o.meta_str("name") != Some(keep)
                    && snapshot::is_orphan(o, now, grace)
                {
                    candidates.push(o.clone())
                }
            });
        if candidates.is_empty() && listed.is_ok() {
            return Attempt::Done;
        }
        // What the namespace's holders reference, read in place.
        let mut referenced = HashSet::new();
        for holder in kinds::holders() {
            listed = listed.and_then(|()| {
                self.cluster
                    .list(holder.kind, Some(ns), &Selector::default(), &mut |o| {
                        add_references(&mut referenced, o)
                    })
            });
        }
        if let Err(e) = listed {
            return Attempt::Dropped {
                why: format!("not sweeping {source}'s snapshots, could not list: {e}"),
                collect: None,
            };
        }
        let candidates: Vec<&Value> = candidates.iter().collect();
        let doomed = doomed(&candidates, &referenced, &self.in_flight.targets(), now, grace);
        self.delete_doomed(&doomed, grace);
        Attempt::Done
    }

    /// After a new snapshot of `source` is named: its older versions are
    /// swept, at most once a minute per source (half the grace period if
    /// shorter; see [`InFlight::sweep_due`]).
    pub fn sweep_after_new(&self, ns: &str, source: &SourceId, keep: &str) {
        let grace = self.rules.settings.orphan_grace_period_secs as i64;
        let every = SWEEP_EVERY_SECS.min(grace / 2);
        if self.in_flight.sweep_due(ns, source, self.cluster.now(), every) {
            self.sweep_source(ns, source, keep);
        }
    }

    /// Deletes what a sweep judged, unused for `grace` seconds, each under
    /// the guard with the uid and version it was judged at: a snapshot
    /// reused since is kept. How many went.
    pub fn delete_doomed(&self, doomed: &[Doomed], grace: u64) -> usize {
        let mut deleted = 0;
        for d in doomed {
            let preconditions = Preconditions {
                uid: d.uid.clone(),
                resource_version: Some(d.resource_version.clone()),
            };
            match guard::delete_snapshot(
                &self.cluster,
                self.in_flight,
                &self.rules.prover,
                d.snapshot,
                &preconditions,
            ) {
                Ok(()) => {
                    deleted += 1;
                    self.observer
                        .note(format!("{}/{} swept: unowned, unused for {grace}s", d.kind, d.name));
                }
                Err(e) => self.observer.note(format!("kept {}/{}: {e}", d.kind, d.name)),
            }
        }
        deleted
    }

    /// A read from the cache, or the API server when the cache does not
    /// have it yet (an object made a moment ago).
    fn read(&self, kind: &str, ns: &str, name: &str) -> cluster::Result<Option<Value>> {
        match self.cluster.get(kind, ns, name)? {
            Some(found) => Ok(Some(found)),
            None => self.cluster.get_fresh(kind, ns, name),
        }
    }

    /// Makes the live `owner_kind/owner_name` an owner of `snapshots`:
    /// only if it is the object the admission reviewed (`stored_as`), and
    /// only of the snapshots its stored template names. A review that was
    /// never stored (forged, or refused by a later webhook) names an object
    /// that either never appears or is another request's.
    ///
    /// Each snapshot is read fresh before its write, although serve's cache
    /// holds it: writing on the cached copy, pinned to its version, saves
    /// the GET but measured slower for the admissions that follow
    /// (docs/BENCHMARKS.md, "Adoptions from the cache").
    fn adopt(
        &self,
        ns: &str,
        owner_kind: &str,
        owner_name: &str,
        snapshots: &[(String, String)],
        stored_as: Option<&StoredAs>,
    ) -> Attempt {
        let owner = match self.read(owner_kind, ns, owner_name) {
            Ok(Some(owner)) => owner,
            Ok(None) => return Attempt::Wait(format!("{owner_kind}/{owner_name} is not visible yet")),
            Err(e) => return Attempt::Retry(e.to_string()),
        };
        if let Some(why) = stored_as.and_then(|s| s.mismatch(&owner)) {
            return Attempt::Dropped {
                why: format!("adoption by {owner_kind}/{owner_name} dropped: not the object reviewed ({why})"),
                collect: None,
            };
        }
        let named: HashSet<(String, String)> = kinds::template_of(&owner)
            .map(|t| {
                references::collect(t)
                    .into_iter()
                    .map(|r| (r.kind.kind().to_string(), r.name))
                    .collect()
            })
            .unwrap_or_default();
        for (kind, name) in snapshots.iter().filter(|s| named.contains(*s)) {
            let snapshot = match self.cluster.get_fresh(kind, ns, name) {
                Ok(Some(s)) => s,
                Ok(None) => continue,
                Err(e) => return Attempt::Retry(e.to_string()),
            };
            let Some(ops) = adopt_ops(&owner, &snapshot) else {
                continue;
            };
            match self.cluster.patch(kind, ns, name, snapshot.resource_version(), ops) {
                Ok(()) => self
                    .observer
                    .adopted(format!("{kind}/{name} adopted by {owner_kind}/{owner_name}")),
                Err(e) => return Attempt::Retry(e.to_string()),
            }
        }
        self.release_unnamed(&owner, ns);
        Attempt::Done
    }

    /// The snapshots of a namespace, recognised the one way both hosts
    /// recognise them.
    pub fn snapshots(&self, ns: &str) -> cluster::Result<Vec<Value>> {
        let mut out = Vec::new();
        for kind in ["ConfigMap", "Secret"] {
            self.cluster.list(kind, Some(ns), &Selector::managed(), &mut |o| {
                if keys::is_snapshot(o) {
                    out.push(o.clone())
                }
            })?;
        }
        Ok(out)
    }

    /// A new revision is the moment its workload's template moved on: the
    /// workload stops owning the snapshots it no longer names, so that
    /// pruning their revisions collects them at once. Best effort: the
    /// periodic pass makes the same decisions.
    fn release_unnamed(&self, revision: &Value, ns: &str) {
        let Some((kind, name, uid)) = controller_of(revision) else {
            return;
        };
        let workload = match self.cluster.get_fresh(&kind, ns, &name) {
            Ok(Some(w)) if w.uid() == Some(uid.as_str()) => w,
            _ => return,
        };
        let Ok(snapshots) = self.snapshots(ns) else {
            return;
        };
        let objects: Vec<&Value> = std::iter::once(&workload).chain(&snapshots).collect();
        for ((k, ns, n), rv, ops) in bridges(&objects, &self.in_flight.targets()) {
            match self.cluster.patch(&k, &ns, &n, &rv, ops) {
                Ok(()) => self
                    .observer
                    .note(format!("{k}/{n}'s owners brought up to date for {kind}/{name}")),
                Err(e) => self.observer.note(format!("{k}/{n}: {e}; the periodic pass will")),
            }
        }
    }

    /// `patch_workload`, judged by the rules on the workload and the source
    /// as the API server has them now (both read fresh), then carried out.
    fn patch(&self, intent: &PatchIntent) -> Attempt {
        let ns = intent.namespace.as_str();
        let read = (|| {
            Ok::<_, ApiError>((
                self.cluster.get_fresh(intent.kind.kind(), ns, &intent.name)?,
                self.cluster
                    .get_fresh(intent.source.kind.kind(), ns, &intent.source.name)?,
            ))
        })();
        let (workload, source) = match read {
            Ok(read) => read,
            Err(e) => return Attempt::Retry(e.to_string()),
        };
        let seen = Observed {
            workload: workload.as_ref(),
            source: source.as_ref(),
        };
        match decide_patch(intent, &seen, self.cluster.now(), self.rules) {
            Verdict::Apply { resource_version, ops } => match (&workload, &source) {
                (Some(w), Some(stored)) => self.roll(ns, intent, (w, stored), &resource_version, ops),
                _ => Attempt::Retry("the workload or its source went while it was judged".into()),
            },
            Verdict::Done(_) => Attempt::Done,
            Verdict::Wait(why) => Attempt::Wait(why),
            Verdict::Later(at, hold) => {
                if let (true, Some(w)) = (hold.pends(), &workload) {
                    // Not recorded (the workload moved, or a policy refuses
                    // serve's write): looked at again soon, and given up
                    // past the effect's wait as any write that keeps
                    // failing, so that a hold no write can record is an
                    // EffectFailed, not a change held for ever.
                    if let Err(why) = self.record_pending(ns, intent, w, &hold) {
                        return Attempt::Retry(why.to_string());
                    }
                }
                Attempt::Later(at, hold)
            }
            Verdict::Drop {
                reason,
                collect,
                notable,
            } => self.drop_patch(ns, intent, workload.as_ref(), reason, (collect, notable)),
        }
    }

    /// Rolls the workload (as read, and `stored`, its source) to the
    /// intent's snapshot, made now from the stored content, with every
    /// settled change alongside.
    fn roll(
        &self,
        ns: &str,
        intent: &PatchIntent,
        (workload, stored): (&Value, &Value),
        resource_version: &str,
        mut ops: Vec<Value>,
    ) -> Attempt {
        let snapshot = match self.snapshot_of_stored(ns, intent, stored) {
            Ok(snapshot) => snapshot,
            Err(attempt) => return attempt,
        };
        if let Err(why) = self.bridge(workload, &snapshot) {
            return Attempt::Retry(why.to_string());
        }
        if let Err(attempt) = self.settled_together(ns, intent, workload, &mut ops) {
            return attempt;
        }
        match self
            .cluster
            .patch(intent.kind.kind(), ns, &intent.name, resource_version, ops)
        {
            Ok(()) => {
                self.observer
                    .note(format!("watch: rolling out {} to {}", intent.who(), intent.snapshot));
                self.sweep_after_new(ns, &intent.source, &intent.snapshot);
                self.observer.tell(
                    workload,
                    Reason::ConfigRolledOut,
                    format!(
                        "{} changed: rolling out with snapshot {}",
                        intent.source, intent.snapshot
                    ),
                );
                Attempt::Done
            }
            // The workload moved since it was read: judge it again.
            Err(ApiError::Conflict(e)) => Attempt::Retry(format!("conflict: {e}")),
            Err(e) => Attempt::Retry(format!("patching {}: {e}", intent.who())),
        }
    }

    /// Drops a patch: its pending record goes with it, and a notable drop
    /// (a rollback came first) is told to the workload's users.
    fn drop_patch(
        &self,
        ns: &str,
        intent: &PatchIntent,
        workload: Option<&Value>,
        reason: String,
        (collect, notable): (bool, bool),
    ) -> Attempt {
        if let Some(w) = workload {
            if let Some(ops) = super::verdict::unpend_ops(w, &intent.source, &intent.snapshot) {
                // Best effort: a record left behind names content that
                // changed or was declined, which `approve` refuses.
                if let Err(e) = self
                    .cluster
                    .patch(intent.kind.kind(), ns, &intent.name, w.resource_version(), ops)
                {
                    self.observer
                        .note(format!("clearing the pending record of {}: {e}", intent.who()));
                }
            }
            if notable {
                self.observer.tell(
                    w,
                    Reason::RolloutDropped,
                    format!(
                        "not rolling out {}'s change (snapshot {}): {reason}",
                        intent.source, intent.snapshot
                    ),
                );
            }
        }
        Attempt::Dropped {
            why: reason,
            collect: collect.then(|| intent.target()),
        }
    }

    /// A settling workload rolls once for every change recorded as pending
    /// on it: the other sources' changes join `ops`, each from its source
    /// as stored now (which must still hold the content recorded; one that
    /// moved on is left to its own patch, which records it again), and the
    /// record goes. Their own patches then find the workload on their
    /// snapshots, and end.
    fn settled_together(
        &self,
        ns: &str,
        intent: &PatchIntent,
        workload: &Value,
        ops: &mut Vec<Value>,
    ) -> Result<(), Attempt> {
        let annotations = workload.annotations();
        let settings = &self.rules.settings;
        let Some(optin) = OptIn::from_annotations(annotations, settings)
            .ok()
            .filter(|o| o.settle_in(WatchMode::of(annotations)).is_some())
        else {
            return Ok(());
        };
        let mut patched = workload.clone();
        apply_ops(&mut patched, ops).map_err(|e| Attempt::Retry(e.to_string()))?;
        let template = patched.pointer(intent.kind.template()).cloned().unwrap_or_default();
        let groups = template::group_by_source(&references::collect(&template), &Snapshots::of(&template));
        let declined = Rollback::of(workload);
        // What stays pending: the changes not rolled here (moved on, or
        // unreadable now), which their own patches settle anew.
        let mut remaining = Entries::on(annotations, keys::PENDING);
        remaining.remove(&intent.source);
        for (id, snapshot) in Entries::on(annotations, keys::PENDING).iter() {
            if *id == intent.source {
                continue;
            }
            if !optin.watches(id, settings) {
                // No longer watched: its record is stale, and nothing rolls it.
                remaining.remove(id);
                continue;
            }
            let Some(group) = groups.iter().find(|g| &g.id == id) else {
                remaining.remove(id);
                continue;
            };
            if declined.as_ref().and_then(|r| r.declined(id)) == Some(snapshot) {
                continue;
            }
            let Ok(Some(stored)) = self.cluster.get_fresh(id.kind.kind(), ns, &id.name) else {
                continue;
            };
            let companion = PatchIntent {
                source: id.clone(),
                snapshot: snapshot.to_string(),
                keys: group.key_subset(),
                ..intent.clone()
            };
            // Not a name of its content as stored: it changed again.
            let Ok(made) = self.snapshot_of_stored(ns, &companion, &stored) else {
                continue;
            };
            self.bridge(workload, &made)
                .map_err(|why| Attempt::Retry(why.to_string()))?;
            if let Some(more) = rollout::retarget_ops(intent.kind, &patched, id, snapshot) {
                apply_ops(&mut patched, &more).map_err(|e| Attempt::Retry(e.to_string()))?;
                ops.extend(more);
                self.observer.note(format!(
                    "settled: {} rolls {id} to {snapshot} in the same rollout",
                    intent.who()
                ));
            }
            remaining.remove(id);
        }
        if Entries::on(patched.annotations(), keys::PENDING) != remaining {
            ops.push(super::verdict::set_entries(&patched, keys::PENDING, &remaining));
        }
        if remaining.is_empty() && patched.pointer(&annotation_path(keys::SETTLE_UNTIL)).is_some() {
            ops.push(json!({"op": "remove", "path": annotation_path(keys::SETTLE_UNTIL)}));
        }
        Ok(())
    }

    /// Records a held change on its workload (`config-snapshot.io/pending`)
    /// and tells its users, once per content: the record is what
    /// `config-snapshot status` and `approve` read. An
    /// approval of content the source has since moved on from is taken off
    /// in the same write, and the user is told it was refused.
    fn record_pending(&self, ns: &str, intent: &PatchIntent, workload: &Value, hold: &Hold) -> Result<(), WriteFailed> {
        let Some(ops) = super::verdict::pending_ops(workload, &intent.source, &intent.snapshot, hold) else {
            return Ok(());
        };
        self.cluster
            .patch(intent.kind.kind(), ns, &intent.name, workload.resource_version(), ops)
            .map_err(|source| WriteFailed::Pending {
                who: intent.who(),
                source,
            })?;
        let (id, snapshot) = (&intent.source, &intent.snapshot);
        let target = format!("{}/{}", intent.kind.kind().to_lowercase(), intent.name);
        let message = match hold {
            Hold::Approval { refused: Some(old) } => format!(
                "{id} changed again: the approval of snapshot {old} is refused; snapshot {snapshot} waits for approval (config-snapshot approve {target})"
            ),
            Hold::Approval { refused: None } => format!(
                "{id} changed: snapshot {snapshot} waits for approval (config-snapshot approve {target})"
            ),
            Hold::Window(why) => format!(
                "{id} changed: snapshot {snapshot} waits for the rollout window: {why}"
            ),
            Hold::Settle { until } => format!(
                "{id} changed: settling; it rolls out with snapshot {snapshot} once its sources are quiet, at {until} (unix seconds) at the earliest, with every change made by then"
            ),
            _ => format!(
                "{id} changed: it would roll out with snapshot {snapshot}; its watch mode is notify, so nothing rolls"
            ),
        };
        let reason = match hold {
            Hold::Window(_) => Reason::RolloutHeld,
            _ => Reason::RolloutPending,
        };
        self.observer.tell(workload, reason, message);
        Ok(())
    }

    /// The snapshot a watch rollout moves its workload to, made now from
    /// the source as the API server stores it (`stored`, which the verdict
    /// found holds the content the patch was decided for): never from an
    /// admission request, which a forged review or a write refused later
    /// would make of content never stored (docs/security.md). The name the
    /// policy chose must be one this content gets. An existing snapshot of
    /// that name is used if it is ours and holds this content.
    fn snapshot_of_stored(&self, ns: &str, intent: &PatchIntent, stored: &Value) -> Result<Value, Attempt> {
        let id = &intent.source;
        let dropped = |why: String| Attempt::Dropped { why, collect: None };
        let existing = self
            .read(id.kind.kind(), ns, &intent.snapshot)
            .map_err(|e| Attempt::Retry(e.to_string()))?;
        if let Some(existing) = existing.filter(|e| keys::snapshot_source(e) == Some(id.name.as_str())) {
            // Shown labelled only if proven: ours, and its name is its
            // content's.
            return Ok(existing);
        }
        let content = Content::from_object(id.kind, stored)
            .map_err(|e| {
                dropped(format!(
                    "patch of {} dropped: {id} holds malformed content: {e}",
                    intent.who()
                ))
            })?
            .subset(intent.keys.as_ref());
        let prover = self.cluster.prover();
        if !prover
            .names_for(id.kind, ns, &id.name, &content.hash())
            .contains(&intent.snapshot)
        {
            return Err(dropped(format!(
                "patch of {} dropped: {} is not a name of {id}'s content as stored",
                intent.who(),
                intent.snapshot
            )));
        }
        let version = stored.resource_version();
        let mut object = snapshot_object(id, ns, &intent.snapshot, version, &content);
        prover.sign(&mut object);
        if let Some(budget) = self.budget {
            budget
                .take(ns, written_size(&object))
                .map_err(|e| Attempt::Retry(e.message))?;
        }
        match self.cluster.create(object.clone()) {
            Ok(()) => {
                self.observer
                    .note(format!("snapshot {}/{} created", id.kind.kind(), intent.snapshot));
                Ok(object)
            }
            // Another replica, or an admission, made it first: content
            // addressing makes it the same snapshot, if it is ours.
            Err(ApiError::AlreadyExists(_)) => match self.cluster.get_fresh(id.kind.kind(), ns, &intent.snapshot) {
                Ok(Some(found)) if keys::snapshot_source(&found) == Some(id.name.as_str()) => Ok(found),
                Ok(Some(_)) => Err(dropped(format!(
                    "patch of {} dropped: {} exists and is not config-snapshot's",
                    intent.who(),
                    intent.snapshot
                ))),
                Ok(None) => Err(Attempt::Retry(format!("{} came and went", intent.snapshot))),
                Err(e) => Err(Attempt::Retry(e.to_string())),
            },
            Err(e) => Err(Attempt::Retry(format!("creating {}: {e}", intent.snapshot))),
        }
    }

    /// Before a watch rollout makes `workload` name `snapshot`: if revisions
    /// own the snapshot (the workload's own older ones, after a rollback
    /// and a change back, or another workload's), the workload becomes an
    /// owner first, as an admission's bridge does. Otherwise the controller
    /// could prune those revisions as it makes the workload's new one, and
    /// the garbage collector take the snapshot before that revision adopts
    /// it. An unowned snapshot needs nothing: the garbage collector leaves
    /// it alone, and the sweep spares what the effect awaits.
    fn bridge(&self, workload: &Value, snapshot: &Value) -> Result<(), WriteFailed> {
        let (kind, ns, name) = cluster::key(snapshot);
        let bridged = cluster::patch_judged(
            &self.cluster,
            (&kind, &ns, &name),
            Some(snapshot.clone()),
            |found| {
                let Some(found) = found else {
                    return Err(WriteFailed::Gone(format!("{kind}/{name}")));
                };
                Ok(match adopt_ops(workload, &found).filter(|_| owned(&found)) {
                    None => Judged::Done(false),
                    Some(ops) => Judged::Patch {
                        ops,
                        version: found.resource_version().to_string(),
                        then: true,
                    },
                })
            },
            |source| WriteFailed::Bridge {
                snapshot: format!("{kind}/{name}"),
                source,
            },
        )?;
        match bridged {
            Some(true) => {
                let who = format!("{}/{}", workload["kind"].as_str().unwrap_or_default(), workload.name());
                self.observer.note(format!("{kind}/{name} bridged to {who}"));
                Ok(())
            }
            Some(false) => Ok(()),
            None => Err(WriteFailed::KeptChanging(format!("{kind}/{name}"))),
        }
    }

    /// Deletes a snapshot made for a patch that was dropped, if nothing
    /// owns, references or awaits it and it is older than the orphan grace
    /// period: younger, an admission may be reusing it this moment, its
    /// answer not yet stored, and the periodic sweep takes it later.
    /// Nothing is deleted when the holders of references cannot all be
    /// listed.
    pub fn collect_unused(&self, target: &Key) {
        let (kind, ns, name) = target;
        let mut objects = Vec::new();
        for holder in kinds::holders() {
            let listed = self
                .cluster
                .list(holder.kind, Some(ns), &Selector::default(), &mut |o| {
                    objects.push(o.clone())
                });
            if listed.is_err() {
                return;
            }
        }
        let Ok(Some(snapshot)) = self.cluster.get_fresh(kind, ns, name) else {
            return;
        };
        if !keys::is_snapshot(&snapshot) {
            return;
        }
        objects.push(snapshot.clone());
        let all: Vec<&Value> = objects.iter().collect();
        let grace = self.rules.settings.orphan_grace_period_secs;
        let doomed = orphans(&all, &self.in_flight.targets(), self.cluster.now(), grace);
        let Some(d) = doomed
            .into_iter()
            .find(|d| (&d.kind, &d.namespace, &d.name) == (kind, ns, name))
        else {
            return;
        };
        let preconditions = Preconditions {
            uid: d.uid,
            resource_version: Some(d.resource_version),
        };
        match guard::delete_snapshot(
            &self.cluster,
            self.in_flight,
            &self.rules.prover,
            &snapshot,
            &preconditions,
        ) {
            Ok(()) => self.observer.note(format!(
                "{kind}/{name} collected: made for a rollout that did not happen"
            )),
            Err(e) => self.observer.note(format!("kept {kind}/{name}: {e}")),
        }
    }
}
