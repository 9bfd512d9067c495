//! The controllers replay simulates, as Kubernetes runs them: the
//! Deployment controller (a ReplicaSet per distinct template, the revision
//! annotation, old ones scaled to 0 and pruned past `revisionHistoryLimit`),
//! the StatefulSet and DaemonSet controllers' ControllerRevisions, and the
//! ownerReference garbage collector.
//!
//! A refused write of a revision is not an error: the real controller
//! retries, so the next reconcile does too, and nothing is pruned until the
//! current template has its revision.
//!
//! - this module: dispatch, what the controllers share, and the revision
//!   lookups replay's checks use;
//! - [`deployment`]: the Deployment controller;
//! - [`revisions`]: the StatefulSet and DaemonSet controllers;
//! - [`gc`]: the garbage collector.

mod deployment;
mod gc;
mod revisions;

use anyhow::Result;
use config_snapshot_policy::model::kinds::WorkloadKind;
use config_snapshot_policy::model::object::ObjectExt;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::Simulator;

pub(crate) const REVISION_ANNOTATION: &str = "deployment.kubernetes.io/revision";
/// The revisions a ReplicaSet had before it became current again (a
/// rollback), comma-separated, as the Deployment controller keeps them.
pub(crate) const REVISION_HISTORY_ANNOTATION: &str = "deployment.kubernetes.io/revision-history";

/// Deployment annotations the controller does not copy to its ReplicaSets,
/// and `kubectl rollout undo` does not copy back (kubectl's
/// `annotationsToSkip`, the controller's `skipCopyAnnotation`).
pub(crate) const NOT_COPIED: [&str; 6] = [
    config_snapshot_policy::model::keys::LAST_APPLIED,
    REVISION_ANNOTATION,
    REVISION_HISTORY_ANNOTATION,
    "deployment.kubernetes.io/desired-replicas",
    "deployment.kubernetes.io/max-replicas",
    "deprecated.deployment.rollback.to",
];

fn revision_of_rs(rs: &Value) -> i64 {
    rs.annotation(REVISION_ANNOTATION)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

impl Simulator {
    /// Runs the controller of a workload after it changed.
    pub(crate) fn reconcile(&self, object: &Value) -> Result<()> {
        match object["kind"].as_str() {
            Some("Deployment") => self.reconcile_deployment(object),
            Some("StatefulSet") | Some("DaemonSet") => self.reconcile_revisions(object),
            _ => Ok(()),
        }
    }

    /// Re-runs the controllers of every workload whose template has no
    /// revision yet: a refused revision is retried, as controllers requeue.
    pub(crate) fn reconcile_pending(&self) -> Result<()> {
        let workloads: Vec<Value> = self
            .shared
            .store()
            .all()
            .filter(|o| WorkloadKind::from_kind(o["kind"].as_str().unwrap_or_default()).is_some())
            .cloned()
            .collect();
        for w in workloads {
            if self.current_revision_name(&w).is_none() {
                self.reconcile(&w)?;
            }
        }
        Ok(())
    }

    pub(crate) fn owned(&self, kind: &str, owner: &Value) -> Vec<Value> {
        let ns = owner.namespace().unwrap_or("default");
        let uid = owner.uid();
        self.shared
            .store()
            .list(kind, ns)
            .filter(|o| o.owner_references().iter().any(|r| r["uid"].as_str() == uid))
            .cloned()
            .collect()
    }

    /// The revision object whose template the workload runs, if it exists.
    fn current_revision_name(&self, workload: &Value) -> Option<String> {
        let kind = WorkloadKind::from_kind(workload["kind"].as_str()?)?;
        let template = workload.pointer(kind.template())?;
        let revisions = kind.revisions();
        self.owned(revisions.kind, workload)
            .into_iter()
            .find(|r| {
                revisions
                    .template_of(r)
                    .is_some_and(|t| controller_template(t) == *template)
            })
            .and_then(|r| r.meta_str("name").map(str::to_string))
    }

    /// Deletes the oldest of a workload's past revisions beyond
    /// `revisionHistoryLimit`, then lets the garbage collector take what
    /// they owned (their snapshots).
    fn prune_history(&self, kind: &str, ns: &str, mut old: Vec<Value>, limit: usize, revision: impl Fn(&Value) -> i64) {
        old.sort_by_key(|r| revision(r));
        let excess = old.len().saturating_sub(limit);
        for r in old.iter().take(excess) {
            let name = r.name();
            self.shared.store().remove(kind, ns, name);
            self.note(format!("{kind}/{name} pruned (revisionHistoryLimit {limit})"));
        }
        if excess > 0 {
            self.collect_garbage();
        }
    }

    /// (revision number, template as kubectl would restore it) per revision.
    pub fn revisions(&self, workload: &Value) -> Vec<(i64, Value)> {
        if workload["kind"] == "Deployment" {
            self.owned("ReplicaSet", workload)
                .iter()
                .map(|rs| (revision_of_rs(rs), controller_template(&rs["spec"]["template"])))
                .collect()
        } else {
            self.owned("ControllerRevision", workload)
                .iter()
                .map(|cr| {
                    (
                        cr["revision"].as_i64().unwrap_or(0),
                        controller_template(&cr["data"]["spec"]["template"]),
                    )
                })
                .collect()
        }
    }

    /// The revision objects of a workload with their numbers.
    pub fn revision_objects(&self, workload: &Value) -> Vec<(i64, Value)> {
        if workload["kind"] == "Deployment" {
            self.owned("ReplicaSet", workload)
                .into_iter()
                .map(|rs| (revision_of_rs(&rs), rs))
                .collect()
        } else {
            self.owned("ControllerRevision", workload)
                .into_iter()
                .map(|cr| (cr["revision"].as_i64().unwrap_or(0), cr))
                .collect()
        }
    }

    /// The pod template of the workload's current revision: what its pods run.
    pub fn current_revision_template(&self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let workload = self.get(kind, namespace, name)?;
        self.revisions(&workload)
            .into_iter()
            .max_by_key(|(r, _)| *r)
            .map(|(_, t)| t)
    }
}

/// Copies a Deployment's annotations onto its current ReplicaSet, adding
/// and updating only, as the controller does.
fn copy_annotations(deployment: &Value, rs: &mut Value) {
    let Some(from) = deployment.annotations() else {
        return;
    };
    let Some(to) = rs.annotations_mut() else {
        return;
    };
    for (k, v) in from {
        if !NOT_COPIED.contains(&k.as_str()) {
            to.insert(k.clone(), v.clone());
        }
    }
}

pub(crate) fn owner_ref(owner: &Value, controller: bool) -> Value {
    let mut r = json!({
        "apiVersion": owner["apiVersion"], "kind": owner["kind"],
        "name": owner.meta("name"), "uid": owner.meta("uid"),
    });
    if controller {
        r["controller"] = json!(true);
        r["blockOwnerDeletion"] = json!(true);
    }
    r
}

/// A revision's template as the workload would carry it: without the
/// `pod-template-hash` label and the `$patch` marker.
fn controller_template(template: &Value) -> Value {
    let mut t = template.clone();
    if let Some(o) = t.as_object_mut() {
        o.remove("$patch");
    }
    if let Some(labels) = t.pointer_mut("/metadata/labels").and_then(Value::as_object_mut) {
        labels.remove("pod-template-hash");
    }
    t
}

/// A stable hash of a template: keys sorted, so field order never matters.
pub(crate) fn template_hash(template: &Value) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                Value::Object(keys.into_iter().map(|k| (k.clone(), sorted(&m[k]))).collect())
            }
            Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    config_snapshot_policy::model::content::hex(&Sha256::digest(sorted(template).to_string().as_bytes()))
}
