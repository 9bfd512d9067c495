//! The controllers replay simulates, as Kubernetes runs them: the
//! Deployment controller (a ReplicaSet per distinct template, the revision
//! annotation, old ones scaled to 0 and pruned past `revisionHistoryLimit`),
//! the StatefulSet and DaemonSet controllers' ControllerRevisions, and the
//! ownerReference garbage collector.
//!
//! A refused write of a revision is not an error: the real controller
//! retries, so the next reconcile does too, and nothing is pruned until the
//! current template has its revision.

use anyhow::Result;
use config_snapshot_policy::kinds::WorkloadKind;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::store::key_of;
use super::Simulator;

pub const REVISION_ANNOTATION: &str = "deployment.kubernetes.io/revision";
/// The revisions a ReplicaSet had before it became current again (a
/// rollback), comma-separated, as the Deployment controller keeps them.
pub const REVISION_HISTORY_ANNOTATION: &str = "deployment.kubernetes.io/revision-history";

/// Deployment annotations the controller does not copy to its ReplicaSets,
/// and `kubectl rollout undo` does not copy back (kubectl's
/// `annotationsToSkip`, the controller's `skipCopyAnnotation`).
pub const NOT_COPIED: [&str; 6] = [
    "kubectl.kubernetes.io/last-applied-configuration",
    REVISION_ANNOTATION,
    REVISION_HISTORY_ANNOTATION,
    "deployment.kubernetes.io/desired-replicas",
    "deployment.kubernetes.io/max-replicas",
    "deprecated.deployment.rollback.to",
];

fn revision_of_rs(rs: &Value) -> i64 {
    rs["metadata"]["annotations"][REVISION_ANNOTATION]
        .as_str()
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
        let ns = owner["metadata"]["namespace"].as_str().unwrap_or("default");
        let uid = &owner["metadata"]["uid"];
        self.shared
            .store()
            .list(kind, ns)
            .filter(|o| {
                o["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|r| r["uid"] == *uid))
            })
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
            .and_then(|r| r["metadata"]["name"].as_str().map(str::to_string))
    }

    /// The Deployment controller: one ReplicaSet per distinct template, the
    /// newest scaled up, old ones scaled to 0 and pruned past the limit.
    /// Paused (`spec.paused`), it makes no ReplicaSet and scales nothing: a
    /// template that matches an existing ReplicaSet makes it current again,
    /// but the pods stay where they are until the Deployment is resumed.
    fn reconcile_deployment(&self, deployment: &Value) -> Result<()> {
        let ns = deployment["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        let name = deployment["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let template = deployment["spec"]["template"].clone();
        let replicas = deployment["spec"]["replicas"].as_i64().unwrap_or(1);
        let paused = deployment["spec"]["paused"].as_bool().unwrap_or(false);
        let sets = self.owned("ReplicaSet", deployment);
        let max_revision = sets.iter().map(revision_of_rs).max().unwrap_or(0);
        let current = sets
            .iter()
            .find(|rs| controller_template(&rs["spec"]["template"]) == template)
            .cloned();
        let current_name = match current {
            Some(mut rs) => {
                let rs_name = rs["metadata"]["name"].as_str().unwrap_or_default().to_string();
                let before = rs.clone();
                if revision_of_rs(&rs) != max_revision {
                    let old = revision_of_rs(&rs).to_string();
                    let history = match rs["metadata"]["annotations"][REVISION_HISTORY_ANNOTATION].as_str() {
                        Some(h) if !h.is_empty() => format!("{h},{old}"),
                        _ => old,
                    };
                    rs["metadata"]["annotations"][REVISION_HISTORY_ANNOTATION] = json!(history);
                    rs["metadata"]["annotations"][REVISION_ANNOTATION] = json!((max_revision + 1).to_string());
                    self.note(format!(
                        "ReplicaSet/{rs_name} is current again (revision {})",
                        max_revision + 1
                    ));
                }
                copy_annotations(deployment, &mut rs);
                if !paused {
                    rs["spec"]["replicas"] = json!(replicas);
                }
                if rs != before {
                    self.shared.store().persist(rs);
                }
                rs_name
            }
            None if paused => String::new(),
            None => {
                let hash = &template_hash(&template)[..10];
                let rs_name = format!("{name}-{hash}");
                let mut rs_template = template.clone();
                rs_template["metadata"]["labels"]["pod-template-hash"] = json!(hash);
                let mut selector = deployment["spec"]["selector"].clone();
                selector["matchLabels"]["pod-template-hash"] = json!(hash);
                let mut rs = json!({
                    "apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "metadata": {
                        "name": rs_name, "namespace": ns,
                        "labels": rs_template["metadata"]["labels"].clone(),
                        "annotations": {REVISION_ANNOTATION: (max_revision + 1).to_string()},
                        "ownerReferences": [owner_ref(deployment, true)],
                    },
                    "spec": {"replicas": replicas, "selector": selector, "template": rs_template},
                });
                copy_annotations(deployment, &mut rs);
                let a = self.write(
                    rs,
                    None,
                    false,
                    "system:serviceaccount:kube-system:deployment-controller",
                )?;
                if !a.allowed {
                    self.note(format!(
                        "ReplicaSet/{rs_name} refused; the Deployment controller retries: {}",
                        a.message.unwrap_or_default()
                    ));
                    return Ok(());
                }
                self.note(format!("ReplicaSet/{rs_name} created (revision {})", max_revision + 1));
                rs_name
            }
        };
        // Scale the others down and prune past revisionHistoryLimit; only a
        // ReplicaSet scaled to 0 counts as history.
        let limit = deployment["spec"]["revisionHistoryLimit"].as_i64().unwrap_or(10).max(0) as usize;
        let mut old: Vec<Value> = self
            .owned("ReplicaSet", deployment)
            .into_iter()
            .filter(|rs| rs["metadata"]["name"] != current_name.as_str())
            .collect();
        for rs in &mut old {
            if !paused && rs["spec"]["replicas"] != 0 {
                rs["spec"]["replicas"] = json!(0);
                *rs = self.shared.store().persist(rs.clone());
            }
        }
        old.retain(|rs| rs["spec"]["replicas"] == 0);
        self.prune_history("ReplicaSet", &ns, old, limit, revision_of_rs);
        Ok(())
    }

    /// The StatefulSet and DaemonSet controllers' ControllerRevisions.
    fn reconcile_revisions(&self, workload: &Value) -> Result<()> {
        let ns = workload["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        let name = workload["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let template = workload["spec"]["template"].clone();
        let revisions = self.owned("ControllerRevision", workload);
        let max_revision = revisions
            .iter()
            .filter_map(|r| r["revision"].as_i64())
            .max()
            .unwrap_or(0);
        let current = revisions
            .iter()
            .find(|r| controller_template(&r["data"]["spec"]["template"]) == template)
            .cloned();
        let current_name = match current {
            Some(mut cr) => {
                let cr_name = cr["metadata"]["name"].as_str().unwrap_or_default().to_string();
                if cr["revision"].as_i64() != Some(max_revision) {
                    cr["revision"] = json!(max_revision + 1);
                    self.shared.store().persist(cr);
                    self.note(format!(
                        "ControllerRevision/{cr_name} is current again (revision {})",
                        max_revision + 1
                    ));
                }
                cr_name
            }
            None => {
                let hash = &template_hash(&template)[..10];
                let cr_name = format!("{name}-{hash}");
                let mut data_template = template.clone();
                data_template["$patch"] = json!("replace");
                let mut labels = workload["spec"]["selector"]["matchLabels"].clone();
                if !labels.is_object() {
                    labels = json!({});
                }
                labels["controller-revision-hash"] = json!(hash);
                let cr = json!({
                    "apiVersion": "apps/v1", "kind": "ControllerRevision",
                    "metadata": {"name": cr_name, "namespace": ns, "labels": labels, "ownerReferences": [owner_ref(workload, true)]},
                    "data": {"spec": {"template": data_template}},
                    "revision": max_revision + 1,
                });
                let controller = format!(
                    "system:serviceaccount:kube-system:{}-controller",
                    workload["kind"].as_str().unwrap_or("").to_lowercase()
                );
                let a = self.write(cr, None, false, &controller)?;
                if !a.allowed {
                    self.note(format!(
                        "ControllerRevision/{cr_name} refused; the controller retries: {}",
                        a.message.unwrap_or_default()
                    ));
                    return Ok(());
                }
                self.note(format!(
                    "ControllerRevision/{cr_name} created (revision {})",
                    max_revision + 1
                ));
                cr_name
            }
        };
        let running = self.statefulset_status(workload, &current_name);
        let limit = workload["spec"]["revisionHistoryLimit"].as_i64().unwrap_or(10).max(0) as usize;
        let old: Vec<Value> = self
            .owned("ControllerRevision", workload)
            .into_iter()
            .filter(|r| r["metadata"]["name"] != current_name.as_str())
            .filter(|r| running.as_deref() != r["metadata"]["name"].as_str())
            .collect();
        self.prune_history("ControllerRevision", &ns, old, limit, |r| {
            r["revision"].as_i64().unwrap_or(0)
        });
        Ok(())
    }

    /// A StatefulSet's `status.currentRevision`: the revision its pods not
    /// yet updated run, which its controller never truncates. A rolling
    /// update moves every pod, and then the current revision, to the update
    /// revision; a partition keeps the pods below it (and the current
    /// revision) where they are, and so does `OnDelete`. Pods are not
    /// simulated: they are taken to become ready. Returns the current
    /// revision when it is not the update revision.
    fn statefulset_status(&self, workload: &Value, update: &str) -> Option<String> {
        if workload["kind"] != "StatefulSet" || update.is_empty() {
            return None;
        }
        let strategy = &workload["spec"]["updateStrategy"];
        let partition = strategy["rollingUpdate"]["partition"].as_i64().unwrap_or(0);
        let replicas = workload["spec"]["replicas"].as_i64().unwrap_or(1);
        let rolls_all = strategy["type"] != "OnDelete" && (partition == 0 || replicas == 0);
        let (kind, ns, name) = super::store::key_of(workload);
        let live = self.get(&kind, &ns, &name)?;
        let previous = live["status"]["currentRevision"]
            .as_str()
            .filter(|p| self.get("ControllerRevision", &ns, p).is_some())
            .map(str::to_string);
        let current = match previous {
            Some(p) if !rolls_all => p,
            _ => update.to_string(),
        };
        if live["status"]["currentRevision"] != current.as_str() || live["status"]["updateRevision"] != update {
            let mut written = live.clone();
            written["status"]["currentRevision"] = json!(current);
            written["status"]["updateRevision"] = json!(update);
            self.shared.store().persist(written);
        }
        (current != update).then_some(current)
    }

    /// Deletes the oldest of a workload's past revisions beyond
    /// `revisionHistoryLimit`, then lets the garbage collector take what
    /// they owned (their snapshots).
    fn prune_history(&self, kind: &str, ns: &str, mut old: Vec<Value>, limit: usize, revision: impl Fn(&Value) -> i64) {
        old.sort_by_key(|r| revision(r));
        let excess = old.len().saturating_sub(limit);
        for r in old.iter().take(excess) {
            let name = r["metadata"]["name"].as_str().unwrap_or_default();
            self.shared.store().remove(kind, ns, name);
            self.note(format!("{kind}/{name} pruned (revisionHistoryLimit {limit})"));
        }
        if excess > 0 {
            self.collect_garbage();
        }
    }

    /// The ownerReference garbage collector, as Kubernetes runs it: an
    /// object whose owners are all gone is deleted; an object that keeps a
    /// live owner loses its references to the owners that are gone.
    /// Repeats until nothing changes (deletions cascade).
    pub fn collect_garbage(&self) {
        loop {
            let mut store = self.shared.store();
            let mut doomed = Vec::new();
            let mut pruned = Vec::new();
            for o in store.all() {
                let Some(refs) = o["metadata"]["ownerReferences"].as_array().filter(|r| !r.is_empty()) else {
                    continue;
                };
                let live: Vec<&Value> = refs
                    .iter()
                    .filter(|r| store.contains_uid(r["uid"].as_str().unwrap_or_default()))
                    .collect();
                if live.is_empty() {
                    doomed.push(key_of(o));
                } else if live.len() < refs.len() {
                    let mut kept = o.clone();
                    kept["metadata"]["ownerReferences"] = json!(live);
                    pruned.push(kept);
                }
            }
            if doomed.is_empty() && pruned.is_empty() {
                return;
            }
            for o in pruned {
                store.persist(o);
            }
            drop(store);
            for (kind, ns, name) in doomed {
                self.shared.store().remove(&kind, &ns, &name);
                self.note(format!("{kind}/{name} garbage-collected"));
            }
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
    let Some(from) = deployment["metadata"]["annotations"].as_object() else {
        return;
    };
    if !rs["metadata"]["annotations"].is_object() {
        rs["metadata"]["annotations"] = json!({});
    }
    for (k, v) in from {
        if !NOT_COPIED.contains(&k.as_str()) {
            rs["metadata"]["annotations"][k] = v.clone();
        }
    }
}

pub(crate) fn owner_ref(owner: &Value, controller: bool) -> Value {
    let mut r = json!({
        "apiVersion": owner["apiVersion"], "kind": owner["kind"],
        "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
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
pub fn template_hash(template: &Value) -> String {
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
    config_snapshot_policy::content::hex(&Sha256::digest(sorted(template).to_string().as_bytes()))
}
