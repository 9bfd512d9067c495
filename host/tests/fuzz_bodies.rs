//! The fuzz targets' bodies (config_snapshot::fuzz; host/fuzz runs them
//! under libFuzzer with `make fuzz-host`) on proptest's inputs: raw bytes,
//! and payloads shaped like the real ones, whose fields take values an
//! attacker would try (other namespaces, our own objects' names, token
//! types, owners, huge and empty strings). Each body panics if a promise of
//! docs/security.md breaks.

use config_snapshot::fuzz;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

fn cases() -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(256)
}

/// Values an attacker puts in a field.
fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!("team-a")),
        Just(json!("team-b")),
        Just(json!("kube-system")),
        Just(json!("app")),
        Just(json!("token")),
        Just(json!("bootstrap")),
        Just(json!("web")),
        Just(json!("ConfigMap")),
        Just(json!("Secret")),
        Just(json!("Deployment")),
        Just(json!("kubernetes.io/service-account-token")),
        Just(json!("Opaque")),
        Just(json!("")),
        Just(json!("1")),
        Just(json!(null)),
        Just(json!({"v": "x"})),
        Just(json!([{"op": "replace", "path": "/metadata/ownerReferences", "value": []}])),
        Just(json!([{"op": "add", "path": "/spec/template/spec/containers/0/image", "value": "evil"}])),
        Just(json!([{"apiVersion": "v1", "kind": "Secret", "name": "x", "uid": "u", "controller": true}])),
        "[a-z0-9-]{0,70}".prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
    ]
}

/// The fields the host's operations read.
fn payload() -> impl Strategy<Value = Vec<u8>> {
    let keys = prop::sample::select(vec![
        "api_version",
        "kind",
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "source_kind",
        "source_name",
        "source_resource_version",
        "content",
        "data",
        "type",
        "owner",
        "owners",
        "ops",
        "labels",
        "annotations",
        "field_selector",
        "label_selector",
        "verb",
        "resource",
    ]);
    prop::collection::vec((keys, value()), 0..8).prop_map(|fields| {
        let object: Map<String, Value> = fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        serde_json::to_vec(&object).unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn capability_call_with_shaped_payloads(operation in any::<u8>(), payload in payload()) {
        fuzz::capability_call(operation, &payload);
    }

    #[test]
    fn capability_call_with_raw_bytes(operation in any::<u8>(), payload in prop::collection::vec(any::<u8>(), 0..256)) {
        fuzz::capability_call(operation, &payload);
    }

    #[test]
    fn admission_requests(
        kind in prop::sample::select(vec!["ConfigMap", "Secret", "Deployment", "StatefulSet", "Pod"]),
        operation in prop::sample::select(vec!["CREATE", "UPDATE", "DELETE", ""]),
        labelled in any::<bool>(),
        signature in prop::option::of("[A-Za-z0-9:=+/]{0,60}"),
        annotation in prop::option::of(value()),
        raw in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut object = json!({"kind": kind, "metadata": {"name": "x", "namespace": "team-a"}, "data": {"v": "1"}});
        if labelled {
            object["metadata"]["labels"] = json!({"app.kubernetes.io/managed-by": "config-snapshot"});
        }
        if let Some(s) = signature {
            object["metadata"]["annotations"] = json!({"config-snapshot.io/signature": s});
        }
        if let Some(a) = annotation {
            object["metadata"]["annotations"]["config-snapshot.io/snapshot"] = a;
        }
        let body = json!({"request": {"uid": "u", "kind": {"kind": kind}, "operation": operation,
                                      "namespace": "team-a", "object": object}});
        fuzz::admission_request(&serde_json::to_vec(&body).unwrap());
        fuzz::admission_request(&raw);
    }

    #[test]
    fn forged_labels(data in prop::collection::vec(any::<u8>(), 0..192)) {
        fuzz::forged_labels(&data);
    }
}
