//! The periodic pass, carried out once for both hosts (serve's resync
//! every `--resync-interval`, replay's `advanceTime`): adoption repair,
//! anchors and releases, renewals, watch re-derivation and the timed sweep, as
//! [`super::pass`] decides them (docs/design.md, "The periodic pass").

use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::kinds::KINDS;
use config_snapshot_policy::model::object::ObjectExt;
use config_snapshot_policy::rollout::annotation_path;
use serde_json::{json, Value};

use super::driver::Driver;
use super::effect::Effect;
use super::observe::Reason;
use super::pass::{missing_adoptions, orphans, releases, renewals, unkept, watched_sources, Keep};
use super::verdict::{adopt_ops, anchor_ops};
use crate::cluster::proof::digested;
use crate::cluster::{self, key, Cluster, Selector};

/// Why a synthetic admission gave no answer.
#[derive(Debug, Clone, thiserror::Error)]
#[error("re-admitting {what}: {reason}")]
pub struct ReadmitError {
    pub what: String,
    pub reason: String,
}

/// What the pass needs from its host besides the cluster.
pub trait PassHost {
    /// Admits `object` through the policy as the host's own request, the
    /// way the API server would send it (`old` on UPDATE). When it is
    /// allowed, its deferred effects go to the host's scheduler. Answers
    /// the mutated object, if allowed and changed.
    fn readmit(&self, operation: &str, object: &Value, old: Option<&Value>) -> Result<Option<Value>, ReadmitError>;
    /// Queues an effect the pass found undone.
    fn submit(&self, effect: Effect);
    /// Lets what the pass queued run before the sweep judges: replay runs
    /// it now; serve's workers run beside the pass.
    fn settle(&self) {}
}

/// What one pass did, for logs and tests.
#[derive(Debug, Default, PartialEq)]
pub struct Pass {
    pub adoptions: usize,
    pub renewed: usize,
    pub sources_checked: usize,
    pub swept: usize,
    /// Secret snapshots whose unkeyed content hash was taken off.
    pub unhashed: usize,
    /// Objects that carry our label without proof: left alone.
    pub unproven: usize,
}

impl Driver<'_> {
    /// Every object of every kind the policy reads, outside the excluded
    /// namespaces, as the host acts on them (forgeries unlabelled).
    fn everything(&self) -> cluster::Result<Vec<Value>> {
        let mut out = Vec::new();
        for k in &KINDS {
            self.cluster.list(k.kind, None, &Selector::default(), &mut |o| {
                if !self.rules.excludes(o.namespace().unwrap_or_default()) {
                    out.push(o.clone())
                }
            })?;
        }
        Ok(out)
    }

    /// Looks at everything that carries our label: reports what the host
    /// cannot prove, which it leaves alone, and takes the unkeyed content
    /// hash off the Secret snapshots an earlier version wrote it on
    /// (docs/security.md: a hash of a Secret's value is a guessing oracle).
    fn prove(&self, pass: &mut Pass) {
        let prover = self.cluster.prover();
        let mut unproven = Vec::new();
        let mut hashed = Vec::new();
        for kind in ["ConfigMap", "Secret"] {
            let listed = self.cluster.raw().list(kind, None, &Selector::managed(), &mut |o| {
                if self.rules.excludes(o.namespace().unwrap_or_default()) {
                    return;
                }
                if !prover.proves(o) {
                    unproven.push(o.clone())
                } else if kind == "Secret" && o.has_annotation(keys::CONTENT_HASH) {
                    hashed.push((cluster::key(o), o.resource_version().to_string()));
                }
            });
            if let Err(e) = listed {
                self.observer
                    .note(format!("resync: could not list labelled {kind}s: {e}"));
            }
        }
        for ((kind, ns, name), rv) in hashed {
            let op = json!({"op": "remove", "path": annotation_path(keys::CONTENT_HASH)});
            match self.cluster.patch(&kind, &ns, &name, &rv, vec![op]) {
                Ok(()) => {
                    pass.unhashed += 1;
                    self.observer
                        .note(format!("resync: {kind}/{name}: took off its unkeyed content hash"));
                }
                Err(e) => self.observer.note(format!("resync: {kind}/{name}: {e}")),
            }
        }
        for object in unproven {
            pass.unproven += 1;
            let why = prover.why_unproven(&object);
            self.observer.tell(
                &object,
                Reason::Unproven,
                format!(
                    "carries the label {}={} but is not a snapshot config-snapshot made ({why}): left alone, never swept",
                    keys::MANAGED_BY,
                    keys::MANAGED_BY_VALUE
                ),
            );
        }
    }

    /// One periodic pass.
    pub fn resync(&self, host: &dyn PassHost) -> Pass {
        let mut pass = Pass::default();
        self.prove(&mut pass);
        let objects = match self.everything() {
            Ok(o) => o,
            Err(e) => {
                self.observer.note(format!("resync: could not list the cluster: {e}"));
                return pass;
            }
        };
        let all: Vec<&Value> = objects.iter().collect();
        for effect in missing_adoptions(&all) {
            self.observer.note(format!("resync: {} was missing", effect.describe()));
            host.submit(effect);
            pass.adoptions += 1;
        }
        self.keep_unkept(&all);
        for ((kind, ns, name), rv, ops) in releases(&all, &self.in_flight.targets()) {
            match self.cluster.patch(&kind, &ns, &name, &rv, ops) {
                Ok(()) => self
                    .observer
                    .note(format!("resync: {kind}/{name}'s owners brought up to date")),
                Err(e) => self.observer.note(format!("resync: {kind}/{name}: {e}")),
            }
        }
        for workload in renewals(&all) {
            match self.renew(host, workload) {
                Ok(true) => pass.renewed += 1,
                Ok(false) => {}
                Err(e) => self.observer.note(format!("resync: {e}")),
            }
        }
        for source in watched_sources(&all, &self.rules.settings) {
            pass.sources_checked += 1;
            // serve's cache keeps sources without their data: the policy
            // judges the source as stored, read now.
            let fresh;
            let source = if digested(source) {
                let (kind, ns, name) = key(source);
                match self.cluster.get_fresh(&kind, &ns, &name) {
                    Ok(Some(read)) => {
                        fresh = read;
                        &fresh
                    }
                    Ok(None) => continue,
                    Err(e) => {
                        self.observer.note(format!("resync: reading {kind}/{name}: {e}"));
                        continue;
                    }
                }
            } else {
                source
            };
            if let Err(e) = host.readmit("CREATE", source, None) {
                self.observer.note(format!("resync: {e}"));
            }
        }
        host.settle();
        pass.swept = self.sweep();
        pass
    }

    /// Keeps what workloads name without owning it ([`unkept`]): anchored,
    /// with one namespace read per namespace that has any, or owned again
    /// by the workload whose own history it is.
    fn keep_unkept(&self, all: &[&Value]) {
        let mut uids: std::collections::HashMap<String, Option<String>> = std::collections::HashMap::new();
        for need in unkept(all) {
            let (snapshot, ops) = match need {
                Keep::Own { snapshot, workload } => (snapshot, adopt_ops(workload, snapshot)),
                Keep::Anchor(snapshot) => {
                    let ns = snapshot.namespace().unwrap_or_default().to_string();
                    let uid = match uids.get(&ns) {
                        Some(uid) => uid.clone(),
                        None => match self.cluster.namespace_uid(&ns) {
                            Ok(uid) => uids.entry(ns.clone()).or_insert(uid).clone(),
                            Err(e) => {
                                self.observer.note(format!("resync: namespace {ns}: {e}"));
                                continue;
                            }
                        },
                    };
                    (
                        snapshot,
                        uid.and_then(|uid| anchor_ops(snapshot, &uid, self.cluster.now())),
                    )
                }
            };
            let Some(ops) = ops else {
                continue;
            };
            let (kind, ns, name) = key(snapshot);
            match self.cluster.patch(&kind, &ns, &name, snapshot.resource_version(), ops) {
                Ok(()) => self
                    .observer
                    .note(format!("resync: {kind}/{name} kept (anchored or owned)")),
                Err(e) => self.observer.note(format!("resync: {kind}/{name}: {e}")),
            }
        }
    }

    /// Re-admits a workload unchanged; writes back what the policy renewed,
    /// pinned to the version it was read at.
    fn renew(&self, host: &dyn PassHost, workload: &Value) -> Result<bool, ReadmitError> {
        let (kind, ns, name) = key(workload);
        let Some(mutated) = host.readmit("UPDATE", workload, Some(workload))? else {
            return Ok(false);
        };
        let diff = json_patch::diff(workload, &mutated);
        if diff.0.is_empty() {
            return Ok(false);
        }
        let failed = |reason: String| ReadmitError {
            what: format!("{kind}/{name}"),
            reason,
        };
        let ops = match serde_json::to_value(&diff) {
            Ok(Value::Array(ops)) => ops,
            Ok(_) => return Err(failed("the renewal is not a JSON Patch".into())),
            Err(e) => return Err(failed(e.to_string())),
        };
        self.cluster
            .patch(&kind, &ns, &name, workload.resource_version(), ops)
            .map_err(|e| failed(format!("writing the renewal: {e}")))?;
        self.observer
            .note(format!("renew: {kind}/{name} renewed its snapshots"));
        self.observer.tell(
            workload,
            Reason::ConfigRenewed,
            "renew-duration passed: re-admitted, so its pods take its sources' current config".into(),
        );
        Ok(true)
    }

    /// The timed sweep: every snapshot nothing owns, nothing references and
    /// nothing awaits, unused for the grace period. Its deletes carry the
    /// version judged, so a snapshot reused meanwhile is kept.
    fn sweep(&self) -> usize {
        let objects = match self.everything() {
            Ok(o) => o,
            Err(e) => {
                self.observer.note(format!("resync: not sweeping, could not list: {e}"));
                return 0;
            }
        };
        let all: Vec<&Value> = objects.iter().collect();
        let grace = self.rules.settings.orphan_grace_period_secs;
        let doomed = orphans(&all, &self.in_flight.targets(), self.cluster.now(), grace);
        // What the holders name is listed again, namespace by namespace,
        // just before their deletes: the listing above may hold a
        // namespace's snapshots but not its workloads, when serve's cache
        // stopped holding it in between (past its budget: docs/serve.md,
        // "The cache"). A namespace whose holders cannot be listed whole
        // now keeps its snapshots.
        let mut by_namespace: std::collections::BTreeMap<String, Vec<super::pass::Doomed>> = Default::default();
        for d in doomed {
            by_namespace.entry(d.namespace.clone()).or_default().push(d);
        }
        let mut swept = 0;
        for (ns, doomed) in by_namespace {
            match super::guard::Named::listed(&self.cluster, &ns) {
                Ok(named) => swept += self.delete_doomed(&doomed, grace, &named),
                Err(e) => self.observer.note(format!(
                    "resync: not sweeping namespace {ns}, could not list its holders: {e}"
                )),
            }
        }
        swept
    }
}

#[cfg(test)]
#[path = "resync_tests.rs"]
mod tests;
