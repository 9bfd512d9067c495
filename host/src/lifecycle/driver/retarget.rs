//! A watch rollout carried out: the patch that points a workload at a new
//! snapshot, held changes recorded on it, and the patch dropped when the
//! change it would make is no longer the one asked for.

use super::{Attempt, Driver, Retry, WriteFailed};
use crate::cluster::revoked::{self, RecordUnread};
use crate::cluster::{ApiError, Cluster};
use crate::lifecycle::budget::written_size;
use crate::lifecycle::effect::PatchIntent;
use crate::lifecycle::observe::Reason;
use crate::lifecycle::verdict::{apply_ops, decide_patch, Hold, Observed, Verdict};
use config_snapshot_policy::model::approval::{Entries, WatchMode};
use config_snapshot_policy::model::content::{snapshot_object, Content};
use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::object::ObjectExt;
use config_snapshot_policy::model::optin::OptIn;
use config_snapshot_policy::model::readers::Readers;
use config_snapshot_policy::model::records::Rollback;
use config_snapshot_policy::model::references;
use config_snapshot_policy::model::template::{self, Snapshots};
use config_snapshot_policy::rollout;
use config_snapshot_policy::rollout::annotation_path;
use serde_json::{json, Value};

impl Driver<'_> {
    /// `patch_workload`, judged by the rules on the workload and the source
    /// as the API server has them now (both read fresh), then carried out.
    pub(super) fn patch(&self, intent: &PatchIntent) -> Attempt {
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
            Err(e) => return Attempt::Retry(e.into()),
        };
        let seen = Observed {
            workload: workload.as_ref(),
            source: source.as_ref(),
        };
        match decide_patch(intent, &seen, self.cluster.now(), self.rules) {
            Verdict::Apply { resource_version, ops } => match (&workload, &source) {
                (Some(w), Some(stored)) => self.roll(ns, intent, (w, stored), &resource_version, ops),
                _ => Attempt::Retry(Retry::WentWhileJudged),
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
                        return Attempt::Retry(why.into());
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
    pub(super) fn roll(
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
        if let Err(why) = self.anchor(workload, &snapshot) {
            return Attempt::Retry(why.into());
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
            Err(e @ ApiError::Conflict(_)) => Attempt::Retry(Retry::Conflict(e)),
            Err(source) => Attempt::Retry(Retry::Patch {
                who: intent.who(),
                source,
            }),
        }
    }

    /// Drops a patch: its pending record goes with it, and a notable drop
    /// (a rollback came first) is told to the workload's users.
    pub(super) fn drop_patch(
        &self,
        ns: &str,
        intent: &PatchIntent,
        workload: Option<&Value>,
        reason: String,
        (collect, notable): (bool, bool),
    ) -> Attempt {
        if let Some(w) = workload {
            if let Some(ops) = crate::lifecycle::verdict::unpend_ops(w, &intent.source, &intent.snapshot) {
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
    pub(super) fn settled_together(
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
        apply_ops(&mut patched, ops).map_err(|e| Attempt::Retry(e.into()))?;
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
            // No longer watched (whatever its source says: `watch` is the
            // word that makes the most watchers): its record is stale, and
            // nothing rolls it.
            if !optin.watches(id, Readers::Watch, settings) {
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
            // Not watched on what the source says now (`ignore` since).
            if !optin.watches(id, Readers::said_by(&stored), settings) {
                remaining.remove(id);
                continue;
            }
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
            self.anchor(workload, &made).map_err(|why| Attempt::Retry(why.into()))?;
            if let Some(more) = rollout::retarget_ops(intent.kind, &patched, id, snapshot) {
                apply_ops(&mut patched, &more).map_err(|e| Attempt::Retry(e.into()))?;
                ops.extend(more);
                self.observer.note(format!(
                    "settled: {} rolls {id} to {snapshot} in the same rollout",
                    intent.who()
                ));
            }
            remaining.remove(id);
        }
        if Entries::on(patched.annotations(), keys::PENDING) != remaining {
            ops.push(crate::lifecycle::verdict::set_entries(
                &patched,
                keys::PENDING,
                &remaining,
            ));
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
    pub(super) fn record_pending(
        &self,
        ns: &str,
        intent: &PatchIntent,
        workload: &Value,
        hold: &Hold,
    ) -> Result<(), WriteFailed> {
        let Some(ops) = crate::lifecycle::verdict::pending_ops(workload, &intent.source, &intent.snapshot, hold) else {
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
    pub(super) fn snapshot_of_stored(&self, ns: &str, intent: &PatchIntent, stored: &Value) -> Result<Value, Attempt> {
        let id = &intent.source;
        let dropped = |why: String| Attempt::Dropped { why, collect: None };
        let content = Content::from_object(id.kind, stored)
            .map_err(|e| {
                dropped(format!(
                    "patch of {} dropped: {id} holds malformed content: {e}",
                    intent.who()
                ))
            })?
            .subset(intent.keys.as_ref());
        let prover = self.cluster.prover();
        // Revoked since the policy decided the rollout: never made, nor
        // rolled to, again (docs/design.md, "Revocation").
        match revoked::revocations(&self.cluster, ns) {
            Ok(record) => {
                if let Some(revoked) = revoked::revocation_of(&record, prover, ns, id, &content.hash()) {
                    return Err(dropped(format!(
                        "patch of {} dropped: {id}'s content as stored was {revoked} (snapshot {})",
                        intent.who(),
                        revoked.snapshot
                    )));
                }
            }
            Err(RecordUnread::Read(e)) => return Err(Attempt::Retry(e.into())),
            Err(RecordUnread::Broken(e)) => {
                return Err(dropped(format!("patch of {} dropped: {e}", intent.who())));
            }
        }
        let existing = self
            .read(id.kind.kind(), ns, &intent.snapshot)
            .map_err(|e| Attempt::Retry(e.into()))?;
        if let Some(existing) = existing.filter(|e| keys::snapshot_source(e) == Some(id.name.as_str())) {
            // Shown labelled only if proven: ours, and its name is its
            // content's.
            return Ok(existing);
        }
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
                .map_err(|e| Attempt::Retry(Retry::Budget(e)))?;
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
                Ok(None) => Err(Attempt::Retry(Retry::CameAndWent(intent.snapshot.clone()))),
                Err(e) => Err(Attempt::Retry(e.into())),
            },
            Err(source) => Err(Attempt::Retry(Retry::Create {
                snapshot: intent.snapshot.clone(),
                source,
            })),
        }
    }
}
