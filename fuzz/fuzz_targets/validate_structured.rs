#![no_main]
//! Structure-aware AdmissionRequests: arbitrary workloads, references,
//! annotations and settings. Beyond not panicking, a mutation must never
//! reference a snapshot that does not exist, and must be stable when
//! evaluated again.

use arbitrary::Arbitrary;
use config_snapshot_policy::{references, template};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

#[path = "common.rs"]
mod common;

#[derive(Arbitrary, Debug)]
struct Input {
    kind: u8,
    update: bool,
    dry_run: bool,
    snapshot: String,
    watch: Option<String>,
    renew: Option<String>,
    refs: Vec<(u8, u8, bool)>,
    settings: u8,
    image: u8,
}

const NAMES: [&str; 4] = ["app", "creds", "tok", "missing"];

fn workload(input: &Input, image: u8) -> Value {
    let kind = ["Deployment", "StatefulSet", "DaemonSet"][input.kind as usize % 3];
    let mut volumes = Vec::new();
    let mut env_from = Vec::new();
    let mut env = Vec::new();
    for (i, (k, n, optional)) in input.refs.iter().take(16).enumerate() {
        let name = NAMES[*n as usize % NAMES.len()];
        match k % 6 {
            0 => volumes.push(json!({"name": format!("v{i}"), "configMap": {"name": name, "optional": optional}})),
            1 => volumes.push(json!({"name": format!("v{i}"), "secret": {"secretName": name, "items": [{"key": "p", "path": "p"}]}})),
            2 => volumes.push(json!({"name": format!("v{i}"), "projected": {"sources": [{"configMap": {"name": name}}, {"secret": {"name": name}}]}})),
            3 => env.push(json!({"name": format!("E{i}"), "valueFrom": {"configMapKeyRef": {"name": name, "key": "a", "optional": optional}}})),
            4 => env_from.push(json!({"secretRef": {"name": name, "optional": optional}})),
            _ => env_from.push(json!({"configMapRef": {"name": name}})),
        }
    }
    let mut annotations = json!({"config-snapshot.io/snapshot": input.snapshot});
    if let Some(w) = &input.watch {
        annotations["config-snapshot.io/watch"] = json!(w);
    }
    if let Some(r) = &input.renew {
        annotations["config-snapshot.io/renew-duration"] = json!(r);
    }
    json!({"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": "w", "namespace": "default", "uid": "u", "annotations": annotations},
           "spec": {"selector": {"matchLabels": {"app": "w"}}, "template": {"metadata": {"labels": {"app": "w"}},
           "spec": {"containers": [{"name": "c", "image": format!("i:{image}"), "env": env, "envFrom": env_from}], "volumes": volumes}}}})
}

fn payload(object: &Value, old: Option<&Value>, dry_run: bool, settings: &Value) -> Vec<u8> {
    let kind = object["kind"].clone();
    serde_json::to_vec(
        &json!({"settings": settings, "request": {"uid": "r", "kind": {"group": "apps", "version": "v1", "kind": kind},
        "operation": if old.is_some() { "UPDATE" } else { "CREATE" }, "namespace": "default", "name": "w",
        "object": object, "oldObject": old, "dryRun": dry_run}}),
    )
    .unwrap()
}

fuzz_target!(|input: Input| {
    let host = common::host();
    let settings = json!({
        "snapshotByDefault": input.settings & 1 == 1,
        "onMissingSource": if input.settings & 2 == 2 { "reject" } else { "warn" },
        "onSnapshotFailure": if input.settings & 4 == 4 { "warn" } else { "reject" },
    });
    if input.settings & 8 == 8 {
        host.fail("create_snapshot", "forbidden");
    }
    let object = workload(&input, input.image);
    let old = input.update.then(|| workload(&input, input.image.wrapping_add(1)));
    let out = config_snapshot_policy::evaluate(&payload(&object, old.as_ref(), input.dry_run, &settings), &host);
    common::check(&out);
    let Some(mutated) = out.mutated else { return };
    if !input.dry_run {
        let t = &mutated["spec"]["template"];
        let mapping = template::Mapping::of(t);
        for r in references::collect(t) {
            if mapping.0.values().any(|s| *s == r.name) {
                assert!(
                    host.find(r.kind.kind(), &r.name).is_some(),
                    "dangling reference to {}",
                    r.name
                );
            }
        }
    }
    let again = config_snapshot_policy::evaluate(&payload(&mutated, None, input.dry_run, &settings), &host);
    assert!(
        again.mutated.is_none() || again.mutated.as_ref() == Some(&mutated),
        "not idempotent"
    );
});
