//! A cluster as scenario checks see it: the simulator, or the objects
//! read back from a real API server. The checks (`effectiveConfig`, `count`,
//! `invariants`, …) are the same either way, so a scenario's assertions
//! judge replay and a real control plane alike.

use config_snapshot_policy::model::object::ObjectExt;
use std::collections::HashSet;

use serde_json::Value;

use config_snapshot_policy::model::kinds::WorkloadKind;

use crate::cluster::Key;
use crate::replay::simulator::Simulator;

pub trait View {
    fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<Value>;
    fn objects(&self) -> Vec<Value>;
    /// The pod template of the workload's current revision: what its pods run.
    fn current_revision_template(&self, kind: &str, namespace: &str, name: &str) -> Option<Value>;
    /// Snapshots pending effects are about to use.
    fn awaited(&self) -> HashSet<Key> {
        HashSet::new()
    }
}

impl View for Simulator {
    fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        Simulator::get(self, kind, namespace, name)
    }
    fn objects(&self) -> Vec<Value> {
        Simulator::objects(self)
    }
    fn current_revision_template(&self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        Simulator::current_revision_template(self, kind, namespace, name)
    }
    fn awaited(&self) -> HashSet<Key> {
        self.awaited_snapshots()
    }
}

/// Objects read from somewhere else (a real API server).
pub struct Objects(pub Vec<Value>);

impl View for Objects {
    fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        self.0
            .iter()
            .find(|o| o["kind"] == kind && o.namespace() == Some(namespace) && o.meta_str("name") == Some(name))
            .cloned()
    }
    fn objects(&self) -> Vec<Value> {
        self.0.clone()
    }
    fn current_revision_template(&self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let workload = self.get(kind, namespace, name)?;
        let uid = workload.uid();
        let workload_kind = WorkloadKind::from_kind(kind)?;
        let revisions = workload_kind.revisions();
        let number = |r: &Value| -> i64 {
            match workload_kind.revision_annotation() {
                Some(annotation) => r.annotation(annotation).and_then(|n| n.parse().ok()).unwrap_or(0),
                None => r["revision"].as_i64().unwrap_or(0),
            }
        };
        let current = self
            .0
            .iter()
            .filter(|o| o["kind"] == revisions.kind && o.namespace() == Some(namespace))
            .filter(|o| o.owner_references().iter().any(|r| r["uid"].as_str() == uid))
            .max_by_key(|r| number(r))?;
        let mut template = revisions.template_of(current)?.clone();
        if let Some(t) = template.as_object_mut() {
            t.remove("$patch");
        }
        if let Some(labels) = template.pointer_mut("/metadata/labels").and_then(Value::as_object_mut) {
            labels.remove("pod-template-hash");
        }
        Some(template)
    }
}
