//! The StatefulSet and DaemonSet controllers' ControllerRevisions, and a
//! StatefulSet's current revision.

use anyhow::Result;
use config_snapshot_policy::model::object::ObjectExt;
use serde_json::{json, Value};

use super::{controller_template, owner_ref, template_hash};
use crate::replay::simulator::Simulator;

impl Simulator {
    /// The StatefulSet and DaemonSet controllers' ControllerRevisions.
    pub(super) fn reconcile_revisions(&self, workload: &Value) -> Result<()> {
        let ns = workload.namespace().unwrap_or("default").to_string();
        let name = workload.name().to_string();
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
                let cr_name = cr.name().to_string();
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
            .filter(|r| r.meta_str("name") != Some(current_name.as_str()))
            .filter(|r| running.as_deref() != r.meta_str("name"))
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
        let (kind, ns, name) = crate::replay::simulator::store::key_of(workload);
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
}
