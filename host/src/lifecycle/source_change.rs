//! A source's stored content changed, as the host's watch of sources saw
//! it (docs/design.md, "Watch"): the host re-admits the source as stored,
//! read fresh, and the policy rolls out its watchers, each through a
//! deferred patch judged as every watch patch is ("Deferred effects").
//!
//! Written once for both hosts: serve's leader calls it for each change its
//! cache's watch brings (`serve::source_changes`), replay for each source
//! write it persists. The API server no longer waits on the host for a
//! ConfigMap or Secret write, and no review of one (forged or real) can
//! make the host roll anything: only what the API server stored does.

use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::kinds::WorkloadKind;
use config_snapshot_policy::model::readers::Readers;
use config_snapshot_policy::model::source::{SourceId, SourceKind};
use serde_json::Value;

use super::driver::Driver;
use super::pass::Watchers;
use super::resync::PassHost;
use crate::cluster::{Cluster, Key};

impl Driver<'_> {
    /// Judges the source `key` (kind, namespace, name) as stored now: when a
    /// workload of its namespace references and watches it, the policy
    /// reviews it as the update that stored it and queues the rollouts of
    /// the watchers not on its content. A source nothing watches costs one
    /// look at the reverse index, no read.
    pub fn source_changed(&self, host: &dyn PassHost, key: &Key) {
        let (kind, namespace, name) = key;
        let Some(kind) = SourceKind::from_kind(kind) else {
            return;
        };
        if self.rules.excludes(namespace) {
            return;
        }
        let id = SourceId::new(kind, name.clone());
        if !self.watched(namespace, &id) {
            return;
        }
        // The change as stored, read fresh: the watch event may be
        // followed by newer ones, and a cache keeps sources digested.
        let source = match self.cluster.get_fresh(kind.kind(), namespace, name) {
            Ok(Some(source)) => source,
            // Deleted since: nothing rolls to a source that is gone.
            Ok(None) => return,
            Err(e) => {
                self.observer
                    .note(format!("watch: reading {}/{name}: {e}", kind.kind()));
                return;
            }
        };
        // A proven snapshot of ours (a forged label is seen without it).
        if keys::is_snapshot(&source) {
            return;
        }
        // An UPDATE with no old object: a change of content, which the
        // watch has already told from a change of metadata.
        if let Err(e) = host.readmit("UPDATE", &source, None) {
            self.observer.note(format!("watch: {e}"));
        }
    }

    /// Whether a workload of `namespace` references `id` and watches it,
    /// by the policy's own predicate and the source's word.
    fn watched(&self, namespace: &str, id: &SourceId) -> bool {
        let mut referencing: Vec<Value> = Vec::new();
        for kind in WorkloadKind::all().filter(|k| k.watches()) {
            let listed = self
                .cluster
                .list_referencing(kind.kind(), namespace, id, &mut |o| referencing.push(o.clone()));
            if let Err(e) = listed {
                // A CRD's kind not served, or a list that failed: judge the
                // source anyway, the policy says what it can.
                let optional = config_snapshot_policy::model::kinds::find(kind.kind()).is_some_and(|k| k.optional);
                if !optional {
                    self.observer
                        .note(format!("watch: listing {}s referencing {id}: {e}", kind.kind()));
                    return true;
                }
            }
        }
        if referencing.is_empty() {
            return false;
        }
        // What the source says of its readers, from the host's own copy
        // (serve's cache keeps a source's config-snapshot annotations; it
        // holds the change the watch just told of, or a newer one). The
        // policy judges again on the fresh read. A copy the host lacks
        // counts as `watch`, the word that makes the most watchers: the
        // fresh read then tells.
        let readers = match self.cluster.get(id.kind.kind(), namespace, &id.name) {
            Ok(Some(source)) => Readers::said_by(&source),
            Ok(None) | Err(_) => Readers::Watch,
        };
        let refs: Vec<&Value> = referencing.iter().collect();
        Watchers::new(&refs, &self.rules.settings).watches(namespace, id, readers)
    }
}
