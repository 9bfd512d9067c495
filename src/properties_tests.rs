//! Properties of workload admission over arbitrary workloads, sources and
//! settings, against the in-memory fake host.

use crate::evaluate;
use crate::host::fake::FakeHost;
use crate::model::content::Content;
use crate::model::source::SourceKind;
use crate::model::{keys, references, template};
use proptest::prelude::*;
use serde_json::{json, Value};

const NAMES: [&str; 4] = ["alpha", "beta", "gamma", "delta"];

/// One reference: (kind index 0..8, source index, optional).
fn reference() -> impl Strategy<Value = (usize, usize, bool)> {
    (0usize..8, 0usize..NAMES.len(), any::<bool>())
}

fn template_spec(refs: &[(usize, usize, bool)]) -> Value {
    let mut volumes = Vec::new();
    let mut env = Vec::new();
    let mut env_from = Vec::new();
    for (i, (kind, src, optional)) in refs.iter().enumerate() {
        let name = NAMES[*src];
        match kind {
            0 => volumes.push(json!({"name": format!("v{i}"), "configMap": {"name": name, "optional": optional}})),
            1 => volumes.push(json!({"name": format!("v{i}"), "secret": {"secretName": name, "optional": optional}})),
            2 => volumes.push(json!({"name": format!("v{i}"), "projected": {"sources": [{"configMap": {"name": name, "items": [{"key": "a", "path": "a"}]}}]}})),
            3 => volumes.push(json!({"name": format!("v{i}"), "projected": {"sources": [{"secret": {"name": name}}]}})),
            4 => env.push(json!({"name": format!("E{i}"), "valueFrom": {"configMapKeyRef": {"name": name, "key": "a", "optional": optional}}})),
            5 => env.push(json!({"name": format!("E{i}"), "valueFrom": {"secretKeyRef": {"name": name, "key": "b"}}})),
            6 => env_from.push(json!({"configMapRef": {"name": name, "optional": optional}})),
            _ => env_from.push(json!({"secretRef": {"name": name}})),
        }
    }
    json!({"containers": [{"name": "c", "image": "i", "env": env, "envFrom": env_from, "unknownFutureField": {"x": 1}}],
           "initContainers": [{"name": "init", "envFrom": [{"configMapRef": {"name": "alpha"}}]}],
           "volumes": volumes})
}

fn deployment(refs: &[(usize, usize, bool)], snapshot: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "web", "namespace": "default", "uid": "u", "annotations": {keys::SNAPSHOT: snapshot}},
           "spec": {"selector": {"matchLabels": {"app": "web"}}, "someNewField": [1, 2],
                    "template": {"metadata": {"labels": {"app": "web"}}, "spec": template_spec(refs)}}})
}

/// Sources: each name exists as a ConfigMap and/or Secret per the mask.
fn host(present: &[bool], data: &[(String, String)]) -> FakeHost {
    let mut objects = Vec::new();
    for (i, name) in NAMES.iter().enumerate() {
        let map: serde_json::Map<String, Value> = data.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
        if present[i * 2] {
            objects.push(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default", "resourceVersion": "1"}, "data": map}));
        }
        if present[i * 2 + 1] {
            let b64: serde_json::Map<String, Value> =
                data.iter().map(|(k, _)| (k.clone(), json!("dmFsdWU="))).collect();
            objects.push(json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": {"name": name, "namespace": "default", "resourceVersion": "1"}, "data": b64}));
        }
    }
    FakeHost::with(objects)
}

fn payload(object: &Value, old: Option<&Value>, settings: &Value) -> Vec<u8> {
    let op = if old.is_some() { "UPDATE" } else { "CREATE" };
    serde_json::to_vec(&json!({"settings": settings, "request": {"uid": "r", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "operation": op, "namespace": "default", "name": "web", "object": object, "oldObject": old}})).unwrap()
}

fn settings() -> impl Strategy<Value = Value> {
    (any::<bool>(), prop_oneof![Just("warn"), Just("reject")], prop_oneof![Just("warn"), Just("reject")])
        .prop_map(|(by_default, missing, failure)| json!({"snapshotByDefault": by_default, "onMissingSource": missing, "onSnapshotFailure": failure}))
}

fn data() -> impl Strategy<Value = Vec<(String, String)>> {
    prop::collection::vec(("[a-c]", "[a-z0-9 ]{0,8}"), 0..4)
}

/// Removes what the policy may change: reference names and its annotations.
fn strip(mut object: Value) -> Value {
    let t = object.pointer_mut("/spec/template").unwrap();
    for r in references::collect(t) {
        references::set_name(t, &r.pointer, "X");
    }
    if let Some(ann) = t.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) {
        ann.retain(|k, _| !keys::is_policy_template_annotation(k));
        if ann.is_empty() {
            t["metadata"].as_object_mut().unwrap().remove("annotations");
        }
    }
    object
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn admission_is_idempotent_and_changes_only_names_and_annotations(
        refs in prop::collection::vec(reference(), 0..10),
        present in prop::collection::vec(any::<bool>(), 8),
        data in data(),
        settings in settings(),
        snapshot in prop_oneof![Just("*"), Just("alpha,secret/beta"), Just("configmap/gamma")],
        fail in any::<bool>(),
    ) {
        let host = host(&present, &data);
        if fail {
            host.fail("create_snapshot", "forbidden");
        }
        let object = deployment(&refs, snapshot);
        let out = evaluate(&payload(&object, None, &settings), &host);
        if !out.accepted {
            prop_assert!(out.message.unwrap().starts_with("config-snapshot: "));
            return Ok(());
        }
        let mutated = out.mutated.clone().unwrap_or(object.clone());
        // Only reference names and the policy's annotations changed; unknown fields survive.
        prop_assert_eq!(strip(mutated.clone()), strip(object.clone()));
        // Every reference that names a snapshot names one that exists.
        let t = &mutated["spec"]["template"];
        let mapping = template::Mapping::of(t);
        for r in references::collect(t) {
            if mapping.0.values().any(|s| *s == r.name) {
                prop_assert!(host.find(r.kind.kind(), &r.name).is_some(), "dangling reference {}", r.name);
            }
        }
        // Reinvocation with the mutated object changes nothing more.
        let again = evaluate(&payload(&mutated, None, &settings), &host);
        prop_assert!(again.accepted);
        prop_assert!(again.mutated.is_none() || again.mutated.as_ref() == Some(&mutated));
        // And a no-op UPDATE keeps it too.
        let noop = evaluate(&payload(&mutated, Some(&mutated), &settings), &host);
        prop_assert!(noop.mutated.is_none() || noop.mutated.as_ref() == Some(&mutated));
    }

    #[test]
    fn the_normalised_template_is_stable_under_rewrite(
        refs in prop::collection::vec(reference(), 1..10),
        data in data(),
    ) {
        let host = host(&[true; 8], &data);
        let object = deployment(&refs, "*");
        let out = evaluate(&payload(&object, None, &json!({})), &host);
        let mutated = out.mutated.unwrap_or(object.clone());
        let n1 = template::normalise(&mutated["spec"]["template"]);
        prop_assert_eq!(&n1, &template::normalise(&object["spec"]["template"]));
        prop_assert_eq!(&template::normalise(&n1), &n1);
    }

    #[test]
    fn the_hash_is_independent_of_key_order(mut pairs in prop::collection::vec(("[a-z]{1,5}", ".{0,10}"), 0..8)) {
        pairs.sort();
        pairs.dedup_by(|a, b| a.0 == b.0);
        let forward: serde_json::Map<String, Value> = pairs.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
        let backward: serde_json::Map<String, Value> = pairs.iter().rev().map(|(k, v)| (k.clone(), json!(v))).collect();
        let a = Content::from_object(SourceKind::ConfigMap, &json!({"data": forward})).unwrap();
        let b = Content::from_object(SourceKind::ConfigMap, &json!({"data": backward})).unwrap();
        prop_assert_eq!(a.hash(), b.hash());
    }
}
