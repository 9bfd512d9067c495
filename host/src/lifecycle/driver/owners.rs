//! Who owns a snapshot: adopting it by a new revision, and the anchor that
//! keeps a shared one while a rollout is under way (docs/design.md,
//! "Garbage collection").

use super::{Attempt, Driver, WriteFailed};
use crate::cluster::{self, Cluster, Judged};
use crate::lifecycle::effect::StoredAs;
use crate::lifecycle::verdict::{adopt_ops, anchor_ops, mark_ops, own_history};
use config_snapshot_policy::host::contract::SnapshotRef;
use config_snapshot_policy::model::kinds;
use config_snapshot_policy::model::object::ObjectExt;
use config_snapshot_policy::model::references;
use config_snapshot_policy::snapshot::{anchored, owned};
use serde_json::Value;
use std::collections::HashSet;

impl Driver<'_> {
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
    pub(super) fn adopt(
        &self,
        ns: &str,
        owner_kind: &str,
        owner_name: &str,
        snapshots: &[SnapshotRef],
        stored_as: Option<&StoredAs>,
    ) -> Attempt {
        let owner = match self.read(owner_kind, ns, owner_name) {
            Ok(Some(owner)) => owner,
            Ok(None) => return Attempt::Wait(format!("{owner_kind}/{owner_name} is not visible yet")),
            Err(e) => return Attempt::Retry(e.into()),
        };
        if let Some(why) = stored_as.and_then(|s| s.mismatch(&owner)) {
            return Attempt::Dropped {
                why: format!("adoption by {owner_kind}/{owner_name} dropped: not the object reviewed ({why})"),
                collect: None,
            };
        }
        let named: HashSet<SnapshotRef> = kinds::template_of(&owner)
            .map(|t| {
                references::collect(t)
                    .into_iter()
                    .map(|r| SnapshotRef {
                        kind: r.kind,
                        name: r.name,
                    })
                    .collect()
            })
            .unwrap_or_default();
        for SnapshotRef { kind, name } in snapshots.iter().filter(|s| named.contains(*s)) {
            let kind = kind.kind();
            // An anchored snapshot needs no more owners. Read fresh, not
            // from the cache: one deleted and made again under its name
            // starts without the anchor a stale cache would still show.
            let snapshot = match self.cluster.get_fresh(kind, ns, name) {
                Ok(Some(s)) if !anchored(&s) => s,
                Ok(_) => continue,
                Err(e) => return Attempt::Retry(e.into()),
            };
            let Some(ops) = adopt_ops(&owner, &snapshot) else {
                continue;
            };
            match self.cluster.patch(kind, ns, name, snapshot.resource_version(), ops) {
                Ok(()) => self
                    .observer
                    .adopted(format!("{kind}/{name} adopted by {owner_kind}/{owner_name}")),
                Err(e) => return Attempt::Retry(e.into()),
            }
        }
        self.release_unnamed(&owner, ns);
        Attempt::Done
    }

    /// Before a watch rollout makes `workload` name `snapshot`, what an
    /// admission's reuse does: if others own the snapshot (the workload's
    /// own older revisions, after a rollback and a change back, or another
    /// workload's) and the workload does not, it is anchored first.
    /// Otherwise the controller could prune those revisions as it makes the
    /// workload's new one, and the garbage collector take the snapshot
    /// before that revision names it. An anchored snapshot is marked used
    /// when the grace period has too little left: this replica's sweep
    /// spares what its effect awaits, another's does not know of it.
    pub(super) fn anchor(&self, workload: &Value, snapshot: &Value) -> Result<(), WriteFailed> {
        let (kind, ns, name) = cluster::key(snapshot);
        let failed = |source| WriteFailed::Anchor {
            snapshot: format!("{kind}/{name}"),
            source,
        };
        let mut uid = None;
        let anchored_now = cluster::patch_judged(
            &self.cluster,
            (&kind, &ns, &name),
            Some(snapshot.clone()),
            |found| {
                let Some(found) = found else {
                    return Err(WriteFailed::Gone(format!("{kind}/{name}")));
                };
                let owns = workload
                    .uid()
                    .is_some_and(|w| found.owner_references().iter().any(|r| r["uid"].as_str() == Some(w)));
                if !owned(&found) {
                    // Unowned: the rollout's own new snapshot, as a rule,
                    // which no sweep takes before the grace period has
                    // passed since it was made; one dropped is collected
                    // at once.
                    return Ok(Judged::Done(false));
                }
                if anchored(&found) {
                    let grace = self.rules.settings.orphan_grace_period_secs;
                    return Ok(match mark_ops(&found, self.cluster.now(), grace) {
                        None => Judged::Done(false),
                        Some(ops) => Judged::Patch {
                            ops,
                            version: found.resource_version().to_string(),
                            then: false,
                        },
                    });
                }
                if owns {
                    return Ok(Judged::Done(false));
                }
                let revision = |kind: &str, name: &str| self.cluster.get(kind, &ns, name).ok().flatten();
                if workload.uid().is_some_and(|w| own_history(&found, w, &revision)) {
                    return Ok(match adopt_ops(workload, &found) {
                        None => Judged::Done(false),
                        Some(ops) => Judged::Patch {
                            ops,
                            version: found.resource_version().to_string(),
                            then: false,
                        },
                    });
                }
                if uid.is_none() {
                    uid = Some(
                        self.cluster
                            .namespace_uid(&ns)
                            .map_err(failed)?
                            .ok_or_else(|| WriteFailed::Gone(format!("namespace {ns}")))?,
                    );
                }
                let uid = uid.as_deref().unwrap_or_default();
                Ok(match anchor_ops(&found, uid, self.cluster.now()) {
                    None => Judged::Done(false),
                    Some(ops) => Judged::Patch {
                        ops,
                        version: found.resource_version().to_string(),
                        then: true,
                    },
                })
            },
            failed,
        )?;
        match anchored_now {
            Some(true) => {
                let who = format!("{}/{}", workload["kind"].as_str().unwrap_or_default(), workload.name());
                self.observer.note(format!("{kind}/{name} anchored for {who}"));
                Ok(())
            }
            Some(false) => Ok(()),
            None => Err(WriteFailed::KeptChanging(format!("{kind}/{name}"))),
        }
    }
}
