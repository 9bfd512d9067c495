//! Which workloads reference which source: the reverse index behind
//! `list_referencing` (docs/design.md, "Host capability contract"). A
//! source update looks up its watchers here instead of listing every
//! workload of the namespace, so its cost follows the watchers, not the
//! namespace.
//!
//! A workload's sources are grouped by the policy's own function for it
//! (`template::own_groups`, which its watch rollout uses too), so the index
//! returns every workload the policy would have found in a full list. It may return more (a workload referencing the
//! source without watching it): the policy decides.

use config_snapshot_policy::model::object::ObjectExt;
use std::collections::{BTreeSet, HashMap};

use config_snapshot_policy::model::kinds::WorkloadKind;
use config_snapshot_policy::model::source::SourceId;
use config_snapshot_policy::model::template;
use serde_json::Value;

/// (kind, namespace, name) of a workload.
type Workload = (String, String, String);

#[derive(Default)]
pub(crate) struct Referrers {
    /// (workload kind, namespace, source) → the workloads' names.
    by_source: HashMap<(String, String, SourceId), BTreeSet<String>>,
    /// What each indexed workload references, to undo its entries.
    sources: HashMap<Workload, Vec<SourceId>>,
}

impl Referrers {
    /// Indexes `object` as it is now (anything but a workload is ignored).
    pub fn observe(&mut self, object: &Value) {
        let Some(kind) = object["kind"].as_str().filter(|k| WorkloadKind::from_kind(k).is_some()) else {
            return;
        };
        let ns = object.namespace().unwrap_or("default");
        let name = object.name();
        self.forget(kind, ns, name);
        let sources = sources_of(object);
        for id in &sources {
            self.by_source
                .entry((kind.to_string(), ns.to_string(), id.clone()))
                .or_default()
                .insert(name.to_string());
        }
        if !sources.is_empty() {
            self.sources
                .insert((kind.to_string(), ns.to_string(), name.to_string()), sources);
        }
    }

    pub(crate) fn forget(&mut self, kind: &str, namespace: &str, name: &str) {
        let key = (kind.to_string(), namespace.to_string(), name.to_string());
        let Some(sources) = self.sources.remove(&key) else {
            return;
        };
        for id in sources {
            let slot = (key.0.clone(), key.1.clone(), id);
            if let Some(names) = self.by_source.get_mut(&slot) {
                names.remove(name);
                if names.is_empty() {
                    self.by_source.remove(&slot);
                }
            }
        }
    }

    /// The names of the `kind` workloads in `namespace` referencing `source`.
    pub fn names(&self, kind: &str, namespace: &str, source: &SourceId) -> impl Iterator<Item = &str> {
        self.by_source
            .get(&(kind.to_string(), namespace.to_string(), source.clone()))
            .into_iter()
            .flatten()
            .map(String::as_str)
    }
}

/// The sources a workload's pod template references, one per source.
fn sources_of(object: &Value) -> Vec<SourceId> {
    let Some(template) = config_snapshot_policy::model::kinds::template_of(object) else {
        return Vec::new();
    };
    template::own_groups(template).into_iter().map(|g| g.id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use config_snapshot_policy::model::source::SourceKind;
    use serde_json::json;

    fn deployment(name: &str, env_from: Value, annotations: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": name, "namespace": "shop"},
               "spec": {"template": {"metadata": {"annotations": annotations},
                        "spec": {"containers": [{"name": "c", "envFrom": env_from}]}}}})
    }

    fn names(index: &Referrers, kind: &str, ns: &str, source: &SourceId) -> Vec<String> {
        index.names(kind, ns, source).map(String::from).collect()
    }

    fn cm(name: &str) -> SourceId {
        SourceId::new(SourceKind::ConfigMap, name)
    }

    #[test]
    fn follows_each_workload_through_edits_snapshots_and_deletion() {
        let mut index = Referrers::default();
        index.observe(&deployment(
            "web",
            json!([{"configMapRef": {"name": "app"}}]),
            json!({}),
        ));
        index.observe(&deployment(
            "api",
            json!([{"configMapRef": {"name": "other"}}]),
            json!({}),
        ));
        assert_eq!(names(&index, "Deployment", "shop", &cm("app")), ["web"]);
        assert!(names(&index, "StatefulSet", "shop", &cm("app")).is_empty());
        assert!(names(&index, "Deployment", "else", &cm("app")).is_empty());

        // Pinned to a snapshot the template maps back to `app`: still found.
        let pinned = deployment(
            "web",
            json!([{"configMapRef": {"name": "app-0123456789"}}]),
            json!({"config-snapshot.io/snapshots": r#"{"configmap/app":"app-0123456789"}"#}),
        );
        index.observe(&pinned);
        assert_eq!(names(&index, "Deployment", "shop", &cm("app")), ["web"]);

        // Edited to reference another source: gone from `app`.
        index.observe(&deployment(
            "web",
            json!([{"configMapRef": {"name": "other"}}]),
            json!({}),
        ));
        assert!(names(&index, "Deployment", "shop", &cm("app")).is_empty());
        assert_eq!(names(&index, "Deployment", "shop", &cm("other")), ["api", "web"]);

        index.forget("Deployment", "shop", "api");
        assert_eq!(names(&index, "Deployment", "shop", &cm("other")), ["web"]);
        index.forget("Deployment", "shop", "web");
        assert!(index.by_source.is_empty() && index.sources.is_empty());
    }

    proptest::proptest! {
        /// Over any history of writes and deletes, the index answers what a
        /// full scan of the surviving workloads would.
        #[test]
        fn answers_what_a_full_scan_would(history in proptest::collection::vec(
            (0usize..4, proptest::option::of(proptest::collection::vec(0usize..4, 0..3))),
            0..40,
        )) {
            let sources = ["a", "b", "c", "a-0123456789"];
            let mut index = Referrers::default();
            let mut live: std::collections::BTreeMap<String, Value> = Default::default();
            for (w, refs) in history {
                let name = format!("w{w}");
                match refs {
                    Some(refs) => {
                        let env: Vec<Value> = refs.iter().map(|r| json!({"configMapRef": {"name": sources[*r]}})).collect();
                        // Half the workloads map the snapshot-shaped name to `a`.
                        let mapping = if w % 2 == 0 {
                            json!({"config-snapshot.io/snapshots": r#"{"configmap/a":"a-0123456789"}"#})
                        } else {
                            json!({})
                        };
                        let d = deployment(&name, Value::Array(env), mapping);
                        index.observe(&d);
                        live.insert(name, d);
                    }
                    None => {
                        index.forget("Deployment", "shop", &name);
                        live.remove(&name);
                    }
                }
            }
            for source in ["a", "b", "c", "a-0123456789"] {
                let scan: Vec<String> = live
                    .iter()
                    .filter(|(_, d)| sources_of(d).contains(&cm(source)))
                    .map(|(n, _)| n.clone())
                    .collect();
                proptest::prop_assert_eq!(names(&index, "Deployment", "shop", &cm(source)), scan);
            }
        }
    }

    #[test]
    fn ignores_what_is_not_a_workload() {
        let mut index = Referrers::default();
        let mut rs = deployment("web-1", json!([{"configMapRef": {"name": "app"}}]), json!({}));
        rs["kind"] = json!("ReplicaSet");
        index.observe(&rs);
        assert!(index.sources.is_empty());
    }
}
