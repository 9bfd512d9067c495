//! The user's verbs, as `kubectl` performs them against the API server:
//! apply, merge-patch edits, delete, `rollout undo` and `rollout restart`.

use anyhow::{anyhow, bail, Result};
use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::object::ObjectExt;
use serde_json::{json, Map, Value};

use super::controllers::NOT_COPIED;
use super::store::key_of;
use super::{prepare, Admission, Simulator};

const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";

impl Simulator {
    /// Creates or updates an object, through admission.
    pub fn apply(&self, object: Value, dry_run: bool, actor: &str) -> Result<Admission> {
        let (kind, ns, name) = key_of(&object);
        let old = self.get(&kind, &ns, &name);
        let mut object = prepare(object, old.as_ref())?;
        if let Some(old) = &old {
            // As an apply would: server-owned fields come from the live object.
            for field in ["resourceVersion", "uid", "creationTimestamp", "generation"] {
                object.set_meta(field, old.meta(field).cloned().unwrap_or_default());
            }
            if object.get("status").is_none() {
                if let Some(status) = old.get("status") {
                    object["status"] = status.clone();
                }
            }
            // The records config-snapshot keeps on the workload are in no
            // manifest; an apply's three-way merge leaves them alone.
            for key in [keys::ROLLBACK, keys::WATCH_ROLLOUT] {
                if let Some(v) = old.annotations().and_then(|a| a.get(key)) {
                    if !object.has_annotation(key) {
                        object.set_annotation(key, v.clone());
                    }
                }
            }
        }
        self.write(object, old, dry_run, actor)
    }

    /// `kubectl patch --type merge`.
    pub fn edit(&self, kind: &str, namespace: &str, name: &str, merge: &Value, actor: &str) -> Result<Admission> {
        let mut object = self
            .get(kind, namespace, name)
            .ok_or_else(|| anyhow!("{kind}/{name} does not exist"))?;
        let old = object.clone();
        json_patch::merge(&mut object, merge);
        let object = prepare(object, Some(&old))?;
        self.write(object, Some(old), false, actor)
    }

    pub fn delete(&self, kind: &str, namespace: &str, name: &str) -> Result<()> {
        if self.shared.store().remove(kind, namespace, name).is_none() {
            bail!("{kind}/{name} does not exist");
        }
        self.note(format!("{kind}/{name} deleted"));
        self.collect_garbage();
        self.settle()
    }

    /// `kubectl rollout undo [--to-revision]`: put back a revision's
    /// template. For a Deployment kubectl also puts back the ReplicaSet's
    /// annotations, keeping only the few it never copies.
    pub fn rollout_undo(&self, kind: &str, namespace: &str, name: &str, to_revision: Option<i64>) -> Result<Admission> {
        let workload = self
            .get(kind, namespace, name)
            .ok_or_else(|| anyhow!("{kind}/{name} does not exist"))?;
        if workload["spec"]["paused"] == true {
            bail!(
                "you cannot rollback a paused deployment; resume it first with 'kubectl rollout resume' and try again"
            );
        }
        let mut revisions = self.revision_objects(&workload);
        revisions.sort_by_key(|(r, _)| *r);
        let (number, revision) = match to_revision {
            Some(0) | None => {
                if revisions.len() < 2 {
                    bail!("no rollout history found for {kind}/{name}");
                }
                revisions[revisions.len() - 2].clone()
            }
            Some(n) => revisions
                .iter()
                .find(|(r, _)| *r == n)
                .cloned()
                .ok_or_else(|| anyhow!("unable to find specified revision {n} in history"))?,
        };
        let template = self
            .revisions(&workload)
            .into_iter()
            .find(|(r, _)| *r == number)
            .map(|(_, t)| t)
            .expect("the same revisions");
        if template == workload["spec"]["template"] {
            self.note(format!(
                "kubectl rollout undo {kind}/{name}: skipped rollback (current template already matches revision {number})"
            ));
            return Ok(Admission {
                allowed: true,
                ..Default::default()
            });
        }
        let mut updated = workload.clone();
        updated["spec"]["template"] = template;
        if kind == "Deployment" {
            let mut annotations = Map::new();
            for k in NOT_COPIED {
                if let Some(v) = workload.annotations().and_then(|a| a.get(k)) {
                    annotations.insert(k.to_string(), v.clone());
                }
            }
            for (k, v) in revision.annotations().into_iter().flatten() {
                if !NOT_COPIED.contains(&k.as_str()) {
                    annotations.insert(k.clone(), v.clone());
                }
            }
            updated.set_meta("annotations", Value::Object(annotations));
        }
        self.note(format!("kubectl rollout undo {kind}/{name} to revision {number}"));
        self.write(updated, Some(workload), false, "kubectl")
    }

    /// `kubectl rollout restart`.
    pub fn rollout_restart(&self, kind: &str, namespace: &str, name: &str) -> Result<Admission> {
        let workload = self
            .get(kind, namespace, name)
            .ok_or_else(|| anyhow!("{kind}/{name} does not exist"))?;
        let mut updated = workload.clone();
        let stamp = config_snapshot_policy::model::duration::format_rfc3339(self.now());
        json_patch::merge(
            &mut updated,
            &json!({"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: stamp}}}}}),
        );
        self.write(updated, Some(workload), false, "kubectl")
    }

    /// `kubectl create job NAME --from=cronjob/FROM`: a Job with the
    /// CronJob's job template, owned by it as the cronjob controller's own
    /// Jobs are, admitted as a CREATE.
    pub(crate) fn create_job(&self, namespace: &str, from: &str, name: &str) -> Result<Admission> {
        let cronjob = self
            .get("CronJob", namespace, from)
            .ok_or_else(|| anyhow!("CronJob/{from} does not exist"))?;
        let template = &cronjob["spec"]["jobTemplate"];
        let mut metadata = json!({
            "name": name,
            "namespace": namespace,
            "annotations": {"cronjob.kubernetes.io/instantiate": "manual"},
            "ownerReferences": [super::controllers::owner_ref(&cronjob, true)],
        });
        for key in ["labels", "annotations"] {
            if let Some(extra) = template.meta(key).and_then(Value::as_object) {
                for (k, v) in extra {
                    metadata[key][k] = v.clone();
                }
            }
        }
        let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": template["spec"]});
        self.write(job, None, false, "kubectl")
    }
}
