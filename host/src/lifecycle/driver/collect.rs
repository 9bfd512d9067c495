//! What the driver collects: a source's old snapshots after a new one
//! (the sweep), the doomed ones once their grace is over, a revision's
//! snapshots nothing names, and what a deleted workload leaves unused.

use super::{Attempt, Driver, SWEEP_EVERY_SECS};
use crate::cluster::{Cluster, Key, Preconditions, Selector};
use crate::lifecycle::guard::{self, Named};
use crate::lifecycle::pass::{controller_of, doomed, orphans, releases, Doomed};
use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::kinds;
use config_snapshot_policy::model::object::ObjectExt;
use config_snapshot_policy::model::source::SourceId;
use config_snapshot_policy::snapshot::{self};
use serde_json::Value;

impl Driver<'_> {
    /// The sweep after a new snapshot of `source`: every other snapshot of
    /// it that nothing owns, references or awaits, unused for the grace
    /// period, deleted under the guard (uid and the version judged). Best
    /// effort: if anything cannot be listed, nothing goes, and the periodic
    /// pass sweeps later.
    pub(super) fn sweep_source(&self, ns: &str, source: &SourceId, keep: &str) -> Attempt {
        let grace = self.rules.settings.orphan_grace_period_secs;
        let now = self.cluster.now();
        // The candidates first, copied only if they could go: most versions
        // of a busy source are young or owned, and then nothing else is
        // read.
        let mut candidates = Vec::new();
        let listed = self
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
        let named = listed.and_then(|()| Named::listed(&self.cluster, ns));
        let named = match named {
            Ok(named) => named,
            Err(e) => {
                return Attempt::Dropped {
                    why: format!("not sweeping {source}'s snapshots, could not list: {e}"),
                    collect: None,
                }
            }
        };
        let candidates: Vec<&Value> = candidates.iter().collect();
        let doomed = doomed(&candidates, named.keys(), &self.in_flight.targets(), now, grace);
        self.delete_doomed(&doomed, grace, &named);
        Attempt::Done
    }

    /// After a new snapshot of `source` is named: its older versions are
    /// swept, at most once a minute per source (half the grace period if
    /// shorter; see [`InFlight::sweep_due`]).
    pub(crate) fn sweep_after_new(&self, ns: &str, source: &SourceId, keep: &str) {
        let grace = self.rules.settings.orphan_grace_period_secs as i64;
        let every = SWEEP_EVERY_SECS.min(grace / 2);
        if self.in_flight.sweep_due(ns, source, self.cluster.now(), every) {
            self.sweep_source(ns, source, keep);
        }
    }

    /// Deletes what a sweep judged, unused for `grace` seconds, each under
    /// the guard with the uid and version it was judged at: a snapshot
    /// reused since is kept. How many went.
    pub(crate) fn delete_doomed(&self, doomed: &[Doomed], grace: u64, named: &Named) -> usize {
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
                named,
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

    /// A new revision is the moment its workload's template moved on: the
    /// workload stops owning the snapshots it no longer names, so that
    /// pruning their revisions collects them at once. Best effort: the
    /// periodic pass makes the same decisions.
    pub(super) fn release_unnamed(&self, revision: &Value, ns: &str) {
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
        for ((k, ns, n), rv, ops) in releases(&objects, &self.in_flight.targets()) {
            match self.cluster.patch(&k, &ns, &n, &rv, ops) {
                Ok(()) => self
                    .observer
                    .note(format!("{k}/{n}'s owners brought up to date for {kind}/{name}")),
                Err(e) => self.observer.note(format!("{k}/{n}: {e}; the periodic pass will")),
            }
        }
    }

    /// Deletes a snapshot made for a patch that was dropped, if nothing
    /// owns, references or awaits it and it is older than the orphan grace
    /// period: younger, an admission may be reusing it this moment, its
    /// answer not yet stored, and the periodic sweep takes it later.
    /// Nothing is deleted when the holders of references cannot all be
    /// listed.
    pub(crate) fn collect_unused(&self, target: &Key) {
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
        let named = Named::among(&all, Some(ns));
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
            &named,
        ) {
            Ok(()) => self.observer.note(format!(
                "{kind}/{name} collected: made for a rollout that did not happen"
            )),
            Err(e) => self.observer.note(format!("kept {kind}/{name}: {e}")),
        }
    }
}
