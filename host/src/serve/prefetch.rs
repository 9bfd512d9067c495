//! The fresh source reads an opted-in workload admission is about to make,
//! started together before the policy runs.
//!
//! The policy reads each source it snapshots fresh (`disable_cache`), one
//! host call after another: wasm is single-threaded. With eight sources
//! that is eight API round trips in a row. serve knows the request before
//! the policy does, so it reads those sources at once and answers the
//! policy's reads from what came back (docs/serve.md, "How a request is
//! answered").
//!
//! Freshness is unchanged: every prefetched read starts after the request
//! arrived, as the policy's own read would, and each answers one read only
//! (a second read of the same object goes to the API server). A prefetch the
//! policy does not use costs one GET and nothing else; a read the prefetch
//! did not foresee goes to the API server as before.
//!
//! Which sources: those of the request's template that the workload opts in
//! and that the template names by their own name (not a snapshot). That is
//! every source of a CREATE and of a re-applied manifest, where the policy
//! takes snapshots. A template that already names snapshots (a scale, a
//! label edit) usually needs no read at all, so nothing is fetched for it.

use std::collections::HashMap;

use config_snapshot_policy::keys;
use config_snapshot_policy::kind::SourceKind;
use config_snapshot_policy::optin::OptIn;
use config_snapshot_policy::settings::Settings;
use config_snapshot_policy::template;
use config_snapshot_policy::workload::WorkloadKind;
use serde_json::value::RawValue;
use serde_json::Value;

use super::admission::ObjectOnly;
use super::cluster::KubeCluster;
use crate::backend;

/// A source to read: its kind and name, in the request's namespace.
pub type Wanted = (SourceKind, String);

/// What the prefetch read, by (kind, name), each taken at most once.
pub type Fetched = HashMap<Wanted, backend::Result<Option<Value>>>;

/// The sources worth reading ahead for this AdmissionRequest (raw JSON),
/// whose `kind` and `operation` the caller has already parsed. A request
/// that cannot opt in costs string compares, or at most a substring
/// search, and no parse.
pub fn wanted(kind: &str, operation: &str, request: &RawValue, settings: &Settings) -> Vec<Wanted> {
    if !matches!(operation, "CREATE" | "UPDATE") || WorkloadKind::from_kind(kind).is_none() {
        return Vec::new();
    }
    // Every opt-in annotation carries the prefix; most requests do not.
    if !request.get().contains(keys::PREFIX) {
        return Vec::new();
    }
    let Ok(ObjectOnly { object }) = serde_json::from_str(request.get()) else {
        return Vec::new();
    };
    let annotations = object.pointer("/metadata/annotations").and_then(Value::as_object);
    let Ok(optin) = OptIn::from_annotations(annotations, settings) else {
        return Vec::new();
    };
    // One group per source: no source is read twice.
    template::own_groups(&object["spec"]["template"])
        .into_iter()
        .filter(|g| optin.snapshots(&g.id, settings) && g.refs.iter().any(|r| r.name == g.id.name))
        .map(|g| (g.id.kind, g.id.name))
        .collect()
}

/// Reads every wanted source of `namespace` at once.
pub async fn fetch(cluster: &KubeCluster, namespace: &str, wanted: Vec<Wanted>) -> Fetched {
    let reads = wanted.into_iter().map(|(kind, name)| async move {
        let read = cluster.fetch(kind.kind(), namespace, &name).await;
        ((kind, name), read)
    });
    futures::future::join_all(reads).await.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(kind: &str, operation: &str, annotations: Value, env: Value) -> Box<RawValue> {
        let text = json!({
            "uid": "u", "kind": {"group": "apps", "version": "v1", "kind": kind},
            "operation": operation, "namespace": "shop",
            "object": {"metadata": {"name": "web", "annotations": annotations},
                       "spec": {"template": {"spec": {"containers": [{"name": "c", "env": env}]}}}}
        })
        .to_string();
        RawValue::from_string(text).unwrap()
    }

    fn env(names: &[(&str, &str)]) -> Value {
        Value::Array(
            names
                .iter()
                .map(|(var, cm)| json!({"name": var, "valueFrom": {"configMapKeyRef": {"name": cm, "key": "k"}}}))
                .collect(),
        )
    }

    /// `wanted`, given the header fields as `admit` parses them.
    fn ahead(request: &RawValue, settings: &Settings) -> Vec<Wanted> {
        let head: Value = serde_json::from_str(request.get()).unwrap();
        let (kind, operation) = (
            head["kind"]["kind"].as_str().unwrap(),
            head["operation"].as_str().unwrap(),
        );
        wanted(kind, operation, request, settings)
    }

    fn names(wanted: &[Wanted]) -> Vec<&str> {
        wanted.iter().map(|(_, n)| n.as_str()).collect()
    }

    #[test]
    fn an_opted_in_create_reads_each_selected_source_once() {
        let settings = Settings::default();
        let r = request(
            "Deployment",
            "CREATE",
            json!({"config-snapshot.io/snapshot": "configmap/a,configmap/b"}),
            env(&[("A", "a"), ("A2", "a"), ("B", "b"), ("C", "c")]),
        );
        assert_eq!(names(&ahead(&r, &settings)), ["a", "b"]);
    }

    #[test]
    fn nothing_for_requests_the_policy_reads_no_source_for() {
        let settings = Settings::default();
        let plain = request("Deployment", "CREATE", json!({}), env(&[("A", "a")]));
        assert!(ahead(&plain, &settings).is_empty(), "no opt-in");
        let cm = request(
            "ConfigMap",
            "UPDATE",
            json!({"config-snapshot.io/snapshot": "*"}),
            env(&[("A", "a")]),
        );
        assert!(ahead(&cm, &settings).is_empty(), "not a workload");
        let delete = request(
            "Deployment",
            "DELETE",
            json!({"config-snapshot.io/snapshot": "*"}),
            env(&[("A", "a")]),
        );
        assert!(ahead(&delete, &settings).is_empty(), "a delete");
        let bad = request(
            "Deployment",
            "CREATE",
            json!({"config-snapshot.io/snapshot": "nonsense/kind"}),
            env(&[("A", "a")]),
        );
        assert!(ahead(&bad, &settings).is_empty(), "an annotation the policy refuses");
    }

    #[test]
    fn a_template_that_names_snapshots_reads_ahead_only_what_the_policy_will_read() {
        let settings = Settings::default();
        let pinned = request(
            "Deployment",
            "UPDATE",
            json!({"config-snapshot.io/snapshot": "*"}),
            env(&[("A", "a-0123456789"), ("B", "b")]),
        );
        // `a-0123456789` is snapshot-shaped but unmapped: the policy reads it
        // fresh to learn its source, so it is read ahead too.
        assert_eq!(names(&ahead(&pinned, &settings)), ["a-0123456789", "b"]);
        // Mapped in the template's annotation, it stands for `a`, which
        // the policy need not read: nothing ahead but `b`.
        let mut object: Value = serde_json::from_str(pinned.get()).unwrap();
        object["object"]["spec"]["template"]["metadata"] =
            json!({"annotations": {"config-snapshot.io/snapshots": r#"{"configmap/a":"a-0123456789"}"#}});
        let mapped = RawValue::from_string(object.to_string()).unwrap();
        assert_eq!(names(&ahead(&mapped, &settings)), ["b"]);
    }
}
