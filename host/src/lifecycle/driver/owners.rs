//! Who owns a snapshot: adopting it by a new revision, and the bridge that
//! keeps it owned by its workload while a rollout is under way.

use super::{Attempt, Driver, WriteFailed};
use crate::cluster::{self, Cluster, Judged};
use crate::lifecycle::effect::StoredAs;
use crate::lifecycle::verdict::adopt_ops;
use config_snapshot_policy::host::contract::SnapshotRef;
use config_snapshot_policy::model::kinds;
use config_snapshot_policy::model::object::ObjectExt;
use config_snapshot_policy::model::references;
use config_snapshot_policy::snapshot::owned;
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
            let snapshot = match self.cluster.get_fresh(kind, ns, name) {
                Ok(Some(s)) => s,
                Ok(None) => continue,
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

    /// Before a watch rollout makes `workload` name `snapshot`: if revisions
    /// own the snapshot (the workload's own older ones, after a rollback
    /// and a change back, or another workload's), the workload becomes an
    /// owner first, as an admission's bridge does. Otherwise the controller
    /// could prune those revisions as it makes the workload's new one, and
    /// the garbage collector take the snapshot before that revision adopts
    /// it. An unowned snapshot needs nothing: the garbage collector leaves
    /// it alone, and the sweep spares what the effect awaits.
    pub(super) fn bridge(&self, workload: &Value, snapshot: &Value) -> Result<(), WriteFailed> {
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
}
