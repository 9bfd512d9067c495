//! What a deferred effect does now, decided from the objects as they are
//! and a clock, without I/O (docs/design.md, "Deferred effects").
//!
//! A watch patch was decided when its source change was admitted, but it
//! lands later: after the change is persisted, after the storm guard lets it
//! through, after a retry. By then a rollback may have come, the source may
//! have moved on, the workload may be gone. [`decide_patch`] judges it
//! against the workload and the source as they are now:
//!
//! 1. the workload must exist, still reference and watch the source;
//! 2. the source must hold the content the patch was made for; while it
//!    still has the version it had at admission, the change is not
//!    persisted yet (wait); once it has another, the patch is superseded;
//! 3. a rollback admitted after the patch was decided voids it (the
//!    workload's rollback record counts more rollbacks than the patch saw):
//!    a rollback always wins;
//! 4. a workload in `notify` mode never rolls by itself, and one in
//!    `approve` mode rolls only once its approve annotation names this
//!    very snapshot (which then goes whatever the window: the user asked);
//! 5. a closed rollout window holds the rollout until it opens, and at
//!    most one watch rollout per workload per interval, counted from the
//!    rollout recorded on the workload itself (so replicas and restarts
//!    share the guard);
//! 6. the patch is recomputed on the workload as it is, pinned to its
//!    resourceVersion, and records the rollout and the generation it makes.

use config_snapshot_policy::model::object::ObjectExt;
use std::collections::BTreeSet;
use std::sync::Arc;

use config_snapshot_policy::model::approval::{Entries, WatchMode};
use config_snapshot_policy::model::content::Content;
use config_snapshot_policy::model::duration::format_rfc3339;
use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::optin::OptIn;
use config_snapshot_policy::model::readers::Readers;
use config_snapshot_policy::model::records::{generation, Rollback, WatchRollout};
use config_snapshot_policy::model::references;
use config_snapshot_policy::model::settings::Settings;
use config_snapshot_policy::model::source::SourceId;
use config_snapshot_policy::model::template::{self, Snapshots};
use config_snapshot_policy::rollout;
use config_snapshot_policy::rollout::annotation_path;
use config_snapshot_policy::snapshot::{anchor_reference, anchored, must_mark_reuse};

use serde_json::{json, Value};

use super::effect::PatchIntent;
use crate::cluster::proof::Prover;

/// What the rules need besides the objects.
#[derive(Debug, Clone)]
pub struct Rules {
    pub settings: Settings,
    /// Storm guard: the least time between two watch rollouts of a workload.
    pub watch_min_interval: i64,
    /// Tells the host's snapshots from objects that only carry its label.
    pub prover: Arc<Prover>,
    /// Namespaces the webhook excludes: the host writes nothing there,
    /// whoever asks, and its periodic pass does not look in them.
    pub excluded_namespaces: Vec<String>,
    /// A namespaced install's namespaces: the host acts in these only
    /// (`None`: in every namespace not excluded).
    pub only_namespaces: Option<Vec<String>>,
}

impl Rules {
    /// Rules with the policy's `settings`, no storm guard and nothing
    /// excluded.
    pub fn new(settings: Settings, prover: Arc<Prover>) -> Rules {
        Rules {
            settings,
            watch_min_interval: 0,
            prover,
            excluded_namespaces: Vec::new(),
            only_namespaces: None,
        }
    }

    /// Whether the host must not act in `namespace`: excluded, or outside
    /// a namespaced install's list.
    pub fn excludes(&self, namespace: &str) -> bool {
        self.excluded_namespaces.iter().any(|n| n == namespace)
            || self
                .only_namespaces
                .as_ref()
                .is_some_and(|only| !only.iter().any(|n| n == namespace))
    }
}

/// The objects a patch is judged against, as they are now. The snapshot
/// is not among them: the driver makes it from the source as stored, once
/// the verdict is to apply.
pub(crate) struct Observed<'a> {
    pub workload: Option<&'a Value>,
    pub source: Option<&'a Value>,
}

/// What a deferred effect does now.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Verdict {
    /// Send this JSON Patch, pinned to the workload's `resource_version`.
    Apply { resource_version: String, ops: Vec<Value> },
    /// Nothing left to do: already there.
    Done(String),
    /// A precondition does not hold yet: look again later.
    Wait(String),
    /// Held back until this time (unix seconds), by `Hold`.
    Later(i64, Hold),
    /// Void. `collect`: the snapshot was made for this patch alone; delete
    /// it if nothing else references it. `notable`: the user would not
    /// expect it (a rollback came first, the snapshot went), so the host
    /// tells them with an Event; a change superseded by the next one, or a
    /// workload that stopped watching, is the ordinary course of things and
    /// would only flood `kubectl describe` during a storm.
    Drop {
        reason: String,
        collect: bool,
        notable: bool,
    },
}

/// What holds a watch rollout back.
#[derive(Debug, Clone, PartialEq)]
pub enum Hold {
    /// The storm guard: the workload's last watch rollout is too recent.
    StormGuard,
    /// Its rollout window is closed: why, for the user (when it opens, or
    /// what is wrong with it).
    Window(String),
    /// Its watch mode is `notify`: it never rolls by itself.
    Notify,
    /// Its sources have not been quiet for its settle time: it may roll at
    /// `until` (unix seconds), with the changes recorded by then.
    Settle { until: i64 },
    /// Its watch mode is `approve` and this content is not approved yet.
    /// `refused`: what the approve annotation names for the source instead
    /// (content it has since moved on from).
    Approval { refused: Option<String> },
}

impl Hold {
    /// Every `reason` label of serve's held-rollout gauges, one per kind of
    /// hold.
    pub(crate) const LABELS: [&'static str; 5] = ["storm_guard", "rollout_window", "notify", "approval", "settle"];

    /// The `reason` label of serve's held-rollout gauges.
    pub fn label(&self) -> &'static str {
        match self {
            Hold::StormGuard => Self::LABELS[0],
            Hold::Window(_) => Self::LABELS[1],
            Hold::Notify => Self::LABELS[2],
            Hold::Approval { .. } => Self::LABELS[3],
            Hold::Settle { .. } => Self::LABELS[4],
        }
    }

    /// Whether the change is recorded on the workload as pending: it waits
    /// for a person, for its sources to settle or for its window (all
    /// longer than the storm guard's seconds). Such a hold is also woken by
    /// a stored write of its workload (an approval, a widened window,
    /// another mode), which both hosts see; a storm guard's hold is about
    /// time alone.
    pub(crate) fn pends(&self) -> bool {
        !matches!(self, Hold::StormGuard)
    }
}

/// How soon a change held for an approval is judged again (seconds) if no
/// write of its workload wakes it first. An approval is such a write, so
/// this only bounds a wake that was missed (a watch event lost, a restart).
pub(crate) const APPROVAL_RECHECK_SECS: i64 = 300;
/// The same for a change held by a closed window, if the window does not
/// open sooner: a widened window is a write of the workload, and wakes it.
pub(crate) const WINDOW_RECHECK_SECS: i64 = 3600;
/// The same for a change announced in notify mode: it rolls only if the
/// user switches the mode, which is a write of the workload.
pub(crate) const NOTIFY_RECHECK_SECS: i64 = 3600;

fn void(reason: String) -> Verdict {
    Verdict::Drop {
        reason,
        collect: true,
        notable: false,
    }
}

/// The keys of `intent`'s source the workload's template uses now (`None`
/// inside: all of them); `None` when the template does not use the source.
fn keys_used(intent: &PatchIntent, workload: &Value) -> Option<Option<BTreeSet<String>>> {
    let template = workload.pointer(intent.kind.template())?;
    template::group_by_source(&references::collect(template), &Snapshots::of(template))
        .into_iter()
        .find(|g| g.id == intent.source)
        .map(|g| g.key_subset())
}

/// A verdict reached before the last phase of [`decide_patch`].
type Judged<T> = Result<T, Verdict>;

/// Judges a watch patch against the objects as they are now: the change
/// landed → the workload still wants it → nothing holds it → apply.
pub(crate) fn decide_patch(intent: &PatchIntent, seen: &Observed, now: i64, rules: &Rules) -> Verdict {
    let judged = || -> Judged<Verdict> {
        let Some(workload) = seen.workload else {
            return Err(void(format!("patch of {} dropped: it no longer exists", intent.who())));
        };
        let source = landed(intent, seen.source)?;
        let (optin, ops) = wanted(intent, workload, source, rules)?;
        held(intent, workload, &optin, now, rules)?;
        Ok(apply(intent, workload, now, ops))
    };
    judged().unwrap_or_else(|verdict| verdict)
}

/// The source holds the content the patch was made for: not yet (the
/// API server has not persisted the change), or no longer. The source
/// that does, when it does.
fn landed<'a>(intent: &PatchIntent, source: Option<&'a Value>) -> Judged<&'a Value> {
    let (who, id) = (intent.who(), &intent.source);
    if let Some(landed) = source.filter(|s| {
        Content::from_object(id.kind, s)
            .ok()
            .is_some_and(|c| c.hash() == intent.content_hash)
    }) {
        return Ok(landed);
    }
    let version = source.map(|s| s.resource_version()).unwrap_or_default();
    Err(if version == intent.source_version {
        Verdict::Wait(format!(
            "patch of {who} to {}: the change of {id} is not persisted yet",
            intent.snapshot
        ))
    } else {
        void(format!(
            "patch of {who} to {} superseded: {id} changed again",
            intent.snapshot
        ))
    })
}

/// The ops that retarget the workload, if it still wants this snapshot:
/// it watches the source (by its own words and the source's, as they are
/// now: a source that says `ignore` since drops what it held), reads the
/// same keys of it, no rollback came since or declined this content, and
/// it does not run it already.
fn wanted(intent: &PatchIntent, workload: &Value, source: &Value, rules: &Rules) -> Judged<(OptIn, Vec<Value>)> {
    let (who, id) = (intent.who(), &intent.source);
    let annotations = workload.annotations();
    let readers = Readers::said_by(source);
    let Some(optin) = OptIn::from_annotations(annotations, &rules.settings)
        .ok()
        .filter(|o| o.watches(id, readers, &rules.settings))
    else {
        return Err(void(format!("patch of {who} dropped: it no longer watches {id}")));
    };
    let declined = |why: String| Verdict::Drop {
        reason: format!("patch of {who} to {} dropped: {why}", intent.snapshot),
        collect: true,
        notable: true,
    };
    if let Some(rollback) = Rollback::of(workload).filter(|r| r.count > intent.rollbacks) {
        return Err(declined(format!(
            "a rollback came first (rollback {} after the patch saw {})",
            rollback.count, intent.rollbacks
        )));
    }
    if Rollback::of(workload).is_some_and(|r| r.declined(id) == Some(intent.snapshot.as_str())) {
        // The policy checks the same at the admission, under every name of
        // the content; this catches a review that raced the rollback.
        return Err(declined(format!("a rollback declined this content of {id}")));
    }
    // The snapshot holds the keys the workload used when the change was
    // seen. A workload since rewritten to use other keys of the source was
    // pinned to them by its own admission: this snapshot would take keys
    // from its containers (a held change outlives such a rewrite).
    if keys_used(intent, workload).is_some_and(|used| used != intent.keys) {
        return Err(void(format!(
            "patch of {who} to {} dropped: {who} uses other keys of {id} since",
            intent.snapshot
        )));
    }
    let Some(ops) = rollout::retarget_ops(intent.kind, workload, id, &intent.snapshot) else {
        return Err(void(format!("patch of {who} dropped: it no longer uses {id}")));
    };
    let mut patched = workload.clone();
    if let Err(e) = apply_ops(&mut patched, &ops) {
        return Err(void(format!("patch of {who} dropped: {e}")));
    }
    if patched == *workload {
        return Err(Verdict::Done(format!("{who} already uses {}", intent.snapshot)));
    }
    Ok((optin, ops))
}

/// What holds a wanted rollout, in order: its watch mode (notify, or
/// approve without this snapshot approved), its settle time, a closed
/// window (unless approved), the storm guard (always).
fn held(intent: &PatchIntent, workload: &Value, optin: &OptIn, now: i64, rules: &Rules) -> Judged<()> {
    let id = &intent.source;
    let annotations = workload.annotations();
    let mode = WatchMode::of(annotations);
    let approved = match mode {
        WatchMode::Roll => false,
        WatchMode::Notify => return Err(Verdict::Later(now + NOTIFY_RECHECK_SECS, Hold::Notify)),
        WatchMode::Approve => match Entries::on(annotations, keys::APPROVE).get(id) {
            Some(snapshot) if snapshot == intent.snapshot => true,
            other => {
                let refused = other.map(str::to_string);
                return Err(Verdict::Later(now + APPROVAL_RECHECK_SECS, Hold::Approval { refused }));
            }
        },
    };
    // Settling: a change rolls once its workload's watched sources have
    // been quiet for the settle time, together with every other change
    // recorded by then (the driver adds them to this patch).
    if let Some(settle) = optin.settle_in(mode) {
        let settle = i64::try_from(settle).unwrap_or(i64::MAX);
        if Entries::on(annotations, keys::PENDING).get(id) != Some(intent.snapshot.as_str()) {
            return Err(Verdict::Later(now + settle, Hold::Settle { until: now + settle }));
        }
        // Never later than a change now would settle: the record is on
        // an object its users write, and must not hold a rollout longer.
        let until = settle_until(workload).min(now + settle);
        if now < until {
            return Err(Verdict::Later(until, Hold::Settle { until }));
        }
    }
    // A closed window holds the rollout until it opens, unless a person
    // approved it; the storm guard then still spaces it from the last one,
    // approved or not: approvals of two sources' changes are two rollouts,
    // and a controller that rewrites a source must not roll faster because
    // someone approves in a loop.
    if !approved {
        if let Some((opens, why)) = super::window_clock::held(workload, now) {
            // A widened window is a write of the workload, which wakes
            // the hold; the hourly look only bounds a wake that was missed.
            return Err(Verdict::Later(opens.min(now + WINDOW_RECHECK_SECS), Hold::Window(why)));
        }
    }
    if let Some(last) = WatchRollout::of(workload) {
        let free = last.at + rules.watch_min_interval;
        if now < free {
            return Err(Verdict::Later(free, Hold::StormGuard));
        }
    }
    Ok(())
}

/// The rollout: the retargeting `ops`, the watch-rollout record, and the
/// change taken off the pending record, its approval spent. (A settling
/// rollout's other changes are taken off by the driver, which adds them.)
fn apply(intent: &PatchIntent, workload: &Value, now: i64, mut ops: Vec<Value>) -> Verdict {
    let id = &intent.source;
    let annotations = workload.annotations();
    let record = WatchRollout {
        generation: generation(workload) + 1,
        at: now,
        source: id.clone(),
        snapshot: intent.snapshot.clone(),
    };
    ops.push(annotate(workload, keys::WATCH_ROLLOUT, &record.to_annotation()));
    for key in [keys::PENDING, keys::APPROVE] {
        let mut entries = Entries::on(annotations, key);
        if entries.get(id).is_some() {
            entries.remove(id);
            ops.push(set_entries(workload, key, &entries));
        }
    }
    Verdict::Apply {
        resource_version: workload.resource_version().to_string(),
        ops,
    }
}

/// The JSON Patch that records `snapshot` as the change of `id` pending on
/// `workload`, and takes out an approval the workload carries for other
/// content of `id` (refused: it changed since); `None` when both are so
/// already.
pub(crate) fn pending_ops(workload: &Value, id: &SourceId, snapshot: &str, hold: &Hold) -> Option<Vec<Value>> {
    let annotations = workload.annotations();
    // Each op is made on the object as the ones before leave it: the
    // first may create the annotations map the next ones write into.
    let mut ops = Vec::new();
    let mut working = workload.clone();
    let mut push = |make: &dyn Fn(&Value) -> Value| -> Option<()> {
        let op = make(&working);
        apply_ops(&mut working, std::slice::from_ref(&op)).ok()?;
        ops.push(op);
        Some(())
    };
    let mut pending = Entries::on(annotations, keys::PENDING);
    if pending.get(id) != Some(snapshot) {
        pending.set(id.clone(), snapshot);
        push(&|w| set_entries(w, keys::PENDING, &pending))?;
    }
    let mut approved = Entries::on(annotations, keys::APPROVE);
    if approved.get(id).is_some_and(|a| a != snapshot) {
        approved.remove(id);
        push(&|w| set_entries(w, keys::APPROVE, &approved))?;
    }
    match hold {
        Hold::Settle { until } => {
            if *until > settle_until(workload) {
                push(&|w| annotate(w, keys::SETTLE_UNTIL, &until.to_string()))?;
            }
        }
        // Settled, and now held for another reason (a closed window, a
        // mode changed to approve): the settle's mark goes, and with the
        // write the user is told why the change waits now. Without it the
        // record is already there, nothing is written, and the last word
        // users had was "settling".
        _ if workload.pointer(&annotation_path(keys::SETTLE_UNTIL)).is_some() => {
            push(&|_| json!({"op": "remove", "path": annotation_path(keys::SETTLE_UNTIL)}))?;
        }
        _ => {}
    }
    (!ops.is_empty()).then_some(ops)
}

/// The JSON Patch that takes `snapshot` out of `workload`'s pending
/// record, when the change it names was dropped (a rollback came first,
/// the workload stopped watching): a record of what will never roll must
/// not stay for `approve` to act on. `None` if it is not there.
pub(crate) fn unpend_ops(workload: &Value, id: &SourceId, snapshot: &str) -> Option<Vec<Value>> {
    let annotations = workload.annotations();
    let mut pending = Entries::on(annotations, keys::PENDING);
    (pending.get(id) == Some(snapshot)).then(|| {
        pending.remove(id);
        vec![set_entries(workload, keys::PENDING, &pending)]
    })
}

/// When a settling workload's recorded changes may roll (unix seconds; 0
/// when it records none).
pub(crate) fn settle_until(workload: &Value) -> i64 {
    workload
        .pointer(&annotation_path(keys::SETTLE_UNTIL))
        .and_then(Value::as_str)
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

/// The op that sets `key` to `entries`, or takes it out when they are none.
pub(super) fn set_entries(object: &Value, key: &str, entries: &Entries) -> Value {
    if entries.is_empty() {
        json!({"op": "remove", "path": annotation_path(key)})
    } else {
        annotate(object, key, &entries.to_string())
    }
}

/// Why a JSON Patch could not be applied to a local copy.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    #[error("not a JSON Patch: {0}")]
    Form(#[from] serde_json::Error),
    #[error(transparent)]
    Apply(#[from] json_patch::PatchError),
}

/// Applies JSON Patch `ops` to a local copy of an object.
pub(crate) fn apply_ops(target: &mut Value, ops: &[Value]) -> Result<(), PatchError> {
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops.to_vec()))?;
    json_patch::patch(target, &patch)?;
    Ok(())
}

/// The op that sets one metadata annotation, creating the map if needed.
fn annotate(object: &Value, key: &str, value: &str) -> Value {
    if object.pointer("/metadata/annotations").is_some_and(Value::is_object) {
        json!({"op": "add", "path": annotation_path(key), "value": value})
    } else {
        json!({"op": "add", "path": "/metadata/annotations", "value": {key: value}})
    }
}

/// The JSON Patch that makes `owner` an owner of `snapshot` (to be pinned
/// to the snapshot's resourceVersion), or `None` if it already is one or
/// `snapshot` is not ours. A revision that adopts a snapshot makes its
/// workload (its controller) an owner too, in the same write: a user who
/// deletes the revision (`kubectl delete rs` to force new pods) leaves the
/// workload naming the snapshot, and its controller re-creates the
/// revision; with the revision as the only owner, the garbage collector
/// would take the snapshot first. The periodic pass drops the workload's
/// ownership once its template no longer names the snapshot.
pub(crate) fn adopt_ops(owner: &Value, snapshot: &Value) -> Option<Vec<Value>> {
    if !keys::is_snapshot(snapshot) {
        return None;
    }
    let reference = json!({
        "apiVersion": owner["apiVersion"], "kind": owner["kind"],
        "name": owner.meta("name"), "uid": owner.meta("uid"),
    });
    let controller = owner
        .controller()
        .map(|r| json!({"apiVersion": r["apiVersion"], "kind": r["kind"], "name": r["name"], "uid": r["uid"]}));
    let current: Vec<Value> = snapshot.owner_references().to_vec();
    let mut wanted = current.clone();
    for r in controller.into_iter().chain([reference]) {
        if !wanted.iter().any(|w| w["uid"] == r["uid"]) {
            wanted.push(r);
        }
    }
    if wanted == current {
        return None;
    }
    Some(vec![
        json!({"op": "add", "path": "/metadata/ownerReferences", "value": wanted}),
    ])
}

/// Whether one of `snapshot`'s owners is a revision of the workload whose
/// uid is `workload`: a rollback, or a change back, names the workload's
/// own history, which it owns again (a bridge, once) so that the history
/// limit still collects it; a snapshot other workloads' revisions own is
/// anchored instead (docs/design.md, "Garbage collection", Anchors).
/// `revision` finds a revision by kind and name, from a cache or a list.
pub(crate) fn own_history(snapshot: &Value, workload: &str, revision: &dyn Fn(&str, &str) -> Option<Value>) -> bool {
    snapshot.owner_references().iter().any(|r| {
        let (Some(kind), Some(name), Some(uid)) = (r["kind"].as_str(), r["name"].as_str(), r["uid"].as_str()) else {
            return false;
        };
        config_snapshot_policy::model::kinds::find(kind).is_some_and(|k| k.is_revision())
            && revision(kind, name).is_some_and(|rev| {
                rev.uid() == Some(uid) && rev.controller().and_then(|c| c["uid"].as_str()) == Some(workload)
            })
    })
}

/// The mark a reuse of a snapshot the sweep may judge (unowned or
/// anchored) writes, if the grace period has too little left to skip it
/// (`must_mark_reuse`; docs/design.md, "Garbage collection", Reuse).
pub(crate) fn mark_ops(snapshot: &Value, now: i64, grace: u64) -> Option<Vec<Value>> {
    must_mark_reuse(snapshot, now, grace)
        .then(|| vec![json!({"op": "add", "path": annotation_path(keys::LAST_USED_AT), "value": format_rfc3339(now)})])
}

/// The patch that anchors a shared snapshot in its namespace
/// (docs/design.md, "Garbage collection", Anchors), or `None` if it is
/// anchored already. It marks the snapshot used in the same write: once
/// anchored, the sweep judges it as it judges an unowned one, and the
/// reference that asked for the anchor may not be stored yet.
pub(crate) fn anchor_ops(snapshot: &Value, namespace_uid: &str, now: i64) -> Option<Vec<Value>> {
    if !keys::is_snapshot(snapshot) || anchored(snapshot) {
        return None;
    }
    let mut owners: Vec<Value> = snapshot.owner_references().to_vec();
    owners.push(anchor_reference(
        snapshot.namespace().unwrap_or_default(),
        namespace_uid,
    ));
    Some(vec![
        json!({"op": "add", "path": "/metadata/ownerReferences", "value": owners}),
        json!({"op": "add", "path": annotation_path(keys::LAST_USED_AT), "value": format_rfc3339(now)}),
    ])
}

#[cfg(test)]
#[path = "verdict_tests.rs"]
mod tests;
