//! The Deployment controller.

use anyhow::Result;
use config_snapshot_policy::model::object::ObjectExt;
use serde_json::{json, Value};

use super::{
    controller_template, copy_annotations, owner_ref, revision_of_rs, template_hash, REVISION_ANNOTATION,
    REVISION_HISTORY_ANNOTATION,
};
use crate::replay::simulator::Simulator;

impl Simulator {
    /// The Deployment controller: one ReplicaSet per distinct template, the
    /// newest scaled up, old ones scaled to 0 and pruned past the limit.
    /// Paused (`spec.paused`), it makes no ReplicaSet and scales nothing: a
    /// template that matches an existing ReplicaSet makes it current again,
    /// but the pods stay where they are until the Deployment is resumed.
    pub(super) fn reconcile_deployment(&self, deployment: &Value) -> Result<()> {
        let ns = deployment.namespace().unwrap_or("default").to_string();
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
                let rs_name = rs.name().to_string();
                let before = rs.clone();
                if revision_of_rs(&rs) != max_revision {
                    let old = revision_of_rs(&rs).to_string();
                    let history = match rs.annotation(REVISION_HISTORY_ANNOTATION) {
                        Some(h) if !h.is_empty() => format!("{h},{old}"),
                        _ => old,
                    };
                    rs.set_annotation(REVISION_HISTORY_ANNOTATION, json!(history));
                    rs.set_annotation(REVISION_ANNOTATION, json!((max_revision + 1).to_string()));
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
            None => match self.create_replica_set(deployment, &template, max_revision + 1)? {
                Some(rs_name) => rs_name,
                // Refused: the controller retries.
                None => return Ok(()),
            },
        };
        // Scale the others down and prune past revisionHistoryLimit; only a
        // ReplicaSet scaled to 0 counts as history.
        let limit = deployment["spec"]["revisionHistoryLimit"].as_i64().unwrap_or(10).max(0) as usize;
        let mut old: Vec<Value> = self
            .owned("ReplicaSet", deployment)
            .into_iter()
            .filter(|rs| rs.meta_str("name") != Some(current_name.as_str()))
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

    /// A new ReplicaSet for `template`, at `revision`: its name (`None`
    /// when the API server refused it).
    fn create_replica_set(&self, deployment: &Value, template: &Value, revision: i64) -> Result<Option<String>> {
        let hash = &template_hash(template)[..10];
        let rs_name = format!("{}-{hash}", deployment.name());
        let mut rs_template = template.clone();
        if let Some(labels) = rs_template.labels_mut() {
            labels.insert("pod-template-hash".into(), json!(hash));
        }
        let mut selector = deployment["spec"]["selector"].clone();
        selector["matchLabels"]["pod-template-hash"] = json!(hash);
        let mut rs = json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {
                "name": rs_name, "namespace": deployment.namespace().unwrap_or("default"),
                "labels": rs_template.labels(),
                "annotations": {REVISION_ANNOTATION: revision.to_string()},
                "ownerReferences": [owner_ref(deployment, true)],
            },
            "spec": {"replicas": deployment["spec"]["replicas"].as_i64().unwrap_or(1), "selector": selector, "template": rs_template},
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
            return Ok(None);
        }
        self.note(format!("ReplicaSet/{rs_name} created (revision {revision})"));
        Ok(Some(rs_name))
    }
}
