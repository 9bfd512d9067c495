//! Admission benchmarks B1–B6 (issue 7, docs/BENCHMARKS.md).
//!
//! B1 runs the policy natively; the others run the release wasm through the
//! host exactly as `replay` and `serve` do: a fresh instance per request
//! from a precompiled module, answering host calls from an in-memory store.
#![allow(clippy::too_many_lines, reason = "a test or benchmark is a story read top to bottom")]

#[path = "../tests/support/paths.rs"]
mod paths;

use std::sync::Arc;
use std::time::Duration;

use config_snapshot::capability::{Caller, Capability};
use config_snapshot::cluster::proof::Prover;
use config_snapshot::kubewarden::engine::{CallFailure, CallHandler, Engine};
use config_snapshot::lifecycle::{Rules, Silent};
use config_snapshot::replay::simulator::Shared;
use config_snapshot_policy::host::CallError;
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use serde_json::{json, Value};

/// The simulator's store. Deferred effects stay staged in each
/// request's capability and are never run: a bench must not accumulate
/// state across iterations.
fn store_with(objects: Vec<Value>) -> Arc<Shared> {
    let shared = Shared::default();
    shared.store().now = 1_800_000_000;
    for o in objects {
        shared.store().persist(o);
    }
    Arc::new(shared)
}

/// The policy's Host trait over the host's capability: B1 pays the same
/// payload encoding as the wasm, minus wasm.
struct Native(Capability);
impl config_snapshot_policy::host::Host for Native {
    fn call(&self, b: &str, n: &str, o: &str, p: &[u8]) -> Result<Vec<u8>, CallError> {
        self.0.answer(b, n, o, p).map_err(CallError::Host)
    }
}

fn capability(store: &Arc<Shared>) -> Capability {
    Capability::new(
        store.clone(),
        Caller {
            uid: "bench".into(),
            namespace: "default".into(),
            dry_run: false,
            subject: Default::default(),
        },
        Arc::new(Rules::new(
            config_snapshot_policy::model::settings::Settings::default(),
            Arc::new(Prover::replay()),
        )),
        Arc::default(),
        Arc::new(Silent),
    )
}

fn cm(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default", "resourceVersion": "1"}, "data": data})
}

fn secret(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": {"name": name, "namespace": "default", "resourceVersion": "1"}, "data": {"k": "dmFsdWU=", "other": "eA=="}})
}

/// A Deployment with `n` references cycling through all eight kinds, and the
/// sources it reads.
fn deployment(n: usize, annotations: Value) -> (Value, Vec<Value>) {
    let mut volumes = Vec::new();
    let mut env = Vec::new();
    let mut env_from = Vec::new();
    let mut sources = Vec::new();
    for i in 0..n {
        let name = format!("src-{i}");
        match i % 8 {
            0 => volumes.push(json!({"name": format!("v{i}"), "configMap": {"name": name}})),
            1 => volumes.push(json!({"name": format!("v{i}"), "secret": {"secretName": name}})),
            2 => volumes.push(json!({"name": format!("v{i}"), "projected": {"sources": [{"configMap": {"name": name, "items": [{"key": "k", "path": "k"}]}}]}})),
            3 => volumes.push(json!({"name": format!("v{i}"), "projected": {"sources": [{"secret": {"name": name}}]}})),
            4 => env.push(json!({"name": format!("E{i}"), "valueFrom": {"configMapKeyRef": {"name": name, "key": "k"}}})),
            5 => env.push(json!({"name": format!("E{i}"), "valueFrom": {"secretKeyRef": {"name": name, "key": "k"}}})),
            6 => env_from.push(json!({"configMapRef": {"name": name}})),
            _ => env_from.push(json!({"secretRef": {"name": name}})),
        }
        sources.push(if matches!(i % 8, 1 | 3 | 5 | 7) {
            secret(&name)
        } else {
            cm(&name, json!({"k": "v", "other": "x"}))
        });
    }
    let d = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default", "annotations": annotations},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}, "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "app", "image": "nginx:1.25", "env": env, "envFrom": env_from,
                     "resources": {"limits": {"cpu": "1", "memory": "512Mi"}}, "ports": [{"containerPort": 80}]}],
                     "volumes": volumes}}}
    });
    (d, sources)
}

fn request(kind: &str, group: &str, op: &str, object: &Value, old: Option<&Value>) -> Value {
    json!({"uid": "u", "kind": {"group": group, "version": "v1", "kind": kind}, "operation": op, "namespace": "default",
           "name": object["metadata"]["name"], "object": object, "oldObject": old, "dryRun": false})
}

fn payload(req: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"request": req, "settings": {}})).unwrap()
}

fn engine() -> Engine {
    let path = paths::policy();
    let bytes = std::fs::read(path).expect("make policy.wasm first");
    let precompiled = Engine::precompile(&bytes).unwrap();
    Engine::from_precompiled(&precompiled, BENCH_TIMEOUT).unwrap()
}

/// Far above any measured figure: the suite also runs every bench once,
/// unoptimised (`cargo test --benches`), so that none rots unnoticed.
const BENCH_TIMEOUT: Duration = Duration::from_secs(120);

/// A store where the Deployment's snapshots already exist.
fn warmed(n: usize) -> (Arc<Shared>, Value) {
    let (d, sources) = deployment(n, json!({"config-snapshot.io/snapshot": "*"}));
    let store = store_with(sources);
    let native = Native(capability(&store));
    let out = config_snapshot_policy::evaluate(&payload(&request("Deployment", "apps", "CREATE", &d, None)), &native);
    assert!(out.accepted && out.mutated.is_some(), "{out:?}");
    (store, d)
}

fn b1_b2(c: &mut Criterion) {
    let engine = engine();
    let mut group = c.benchmark_group("admission");
    for n in [1usize, 8, 64] {
        let (store, d) = warmed(n);
        let p = payload(&request("Deployment", "apps", "CREATE", &d, None));
        if n == 8 {
            let native = Native(capability(&store));
            group.bench_function("B1 native plan, 8 refs", |b| {
                b.iter(|| config_snapshot_policy::evaluate(&p, &native))
            });
        }
        let handler: Arc<dyn CallHandler> = Arc::new(capability(&store));
        group.bench_with_input(BenchmarkId::new("B2 wasm admission, refs", n), &p, |b, p| {
            b.iter(|| engine.call("validate", p, handler.clone()).unwrap())
        });
    }
    group.finish();
}

fn b3(c: &mut Criterion) {
    let engine = engine();
    let store = store_with(vec![]);
    let handler: Arc<dyn CallHandler> = Arc::new(capability(&store));
    let native = Native(capability(&store));
    let (d, _) = deployment(8, json!({}));
    let plain = payload(&request("Deployment", "apps", "UPDATE", &d, Some(&d)));
    let old = cm("app", json!({"k": "v"}));
    let mut new = old.clone();
    new["metadata"]["labels"] = json!({"team": "web"});
    let meta_only = payload(&request("ConfigMap", "", "UPDATE", &new, Some(&old)));
    let mut group = c.benchmark_group("pass-through");
    group.bench_function("B3 wasm, Deployment without opt-in", |b| {
        b.iter(|| engine.call("validate", &plain, handler.clone()).unwrap())
    });
    group.bench_function("B3 wasm, metadata-only ConfigMap update", |b| {
        b.iter(|| engine.call("validate", &meta_only, handler.clone()).unwrap())
    });
    group.bench_function("B3 native, Deployment without opt-in", |b| {
        b.iter(|| config_snapshot_policy::evaluate(&plain, &native))
    });
    group.bench_function("B3 native, metadata-only ConfigMap update", |b| {
        b.iter(|| config_snapshot_policy::evaluate(&meta_only, &native))
    });
    group.finish();
}

fn b4(c: &mut Criterion) {
    let engine = engine();
    let mut group = c.benchmark_group("watch fan-out");
    group.sample_size(10).measurement_time(Duration::from_secs(10));
    for total in [200usize, 2_000, 20_000] {
        let watching = 50;
        let mut objects = vec![cm("shared", json!({"k": "v0"}))];
        for i in 0..total {
            let ann = if i < watching {
                json!({"config-snapshot.io/watch": "shared"})
            } else {
                json!({})
            };
            let (mut d, _) = deployment(0, ann);
            d["metadata"]["name"] = json!(format!("d{i}"));
            d["spec"]["template"]["spec"]["containers"][0]["envFrom"] =
                json!([{"configMapRef": {"name": if i < watching { "shared" } else { "other" }}}]);
            objects.push(d);
        }
        let store = store_with(objects);
        let handler: Arc<dyn CallHandler> = Arc::new(capability(&store));
        let old = cm("shared", json!({"k": "v0"}));
        let new = cm("shared", json!({"k": "v1"}));
        let p = payload(&request("ConfigMap", "", "UPDATE", &new, Some(&old)));
        group.bench_with_input(
            BenchmarkId::new("B4 ConfigMap update, 50 watchers, deployments", total),
            &p,
            |b, p| b.iter(|| engine.call("validate", p, handler.clone()).unwrap()),
        );
    }
    group.finish();
}

fn b5(c: &mut Criterion) {
    let engine = engine();
    let mut objects = vec![cm("app", json!({"k": "v"}))];
    // An old, unowned snapshot of `app`, referenced by one ReplicaSet: a sweep
    // candidate that must be kept, so the sweep lists everything every time.
    let content = config_snapshot_policy::model::content::Content::from_object(
        config_snapshot_policy::model::source::SourceKind::ConfigMap,
        &json!({"data": {"k": "old"}}),
    )
    .unwrap();
    let (old_name, mut old_snap) = config_snapshot_policy::model::content::plain_snapshot(
        &config_snapshot_policy::model::source::SourceId::new(
            config_snapshot_policy::model::source::SourceKind::ConfigMap,
            "app",
        ),
        "default",
        "1",
        &content,
    );
    old_snap["metadata"]["uid"] = json!("old");
    old_snap["metadata"]["creationTimestamp"] = json!("2020-01-01T00:00:00Z");
    // The host's own (signed): a label alone would not make it a candidate.
    Prover::replay().sign(&mut old_snap);
    objects.push(old_snap);
    for i in 0..10_000 {
        let name = if i == 0 {
            old_name.clone()
        } else {
            format!("app-{i:010}")
        };
        objects.push(json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": format!("rs-{i}"), "namespace": "default"},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x", "envFrom": [{"configMapRef": {"name": name}}]}]}}}}));
    }
    let store = store_with(objects);
    // The store stamps creation times with its clock: a quarter later, the
    // old snapshot is past any grace period, so every admission sweeps.
    store.store().now += 90 * 24 * 3600;
    /// A host that leaves the sweep to the policy, as one without
    /// `"sweeps": true` does: our hosts sweep after the admission
    /// (docs/design.md, "Garbage collection"), so B5 is the policy's
    /// inline sweep, what such a host's admissions pay.
    struct InlineSweep(Capability);
    impl CallHandler for InlineSweep {
        fn call(&self, b: &str, n: &str, o: &str, p: &[u8]) -> Result<Vec<u8>, CallFailure> {
            let answer = self.0.call(b, n, o, p)?;
            if o != "create_snapshot" {
                return Ok(answer);
            }
            let mut value: serde_json::Value = serde_json::from_slice(&answer).unwrap();
            value.as_object_mut().unwrap().remove("sweeps");
            Ok(serde_json::to_vec(&value).unwrap())
        }
    }
    let handler: Arc<dyn CallHandler> = Arc::new(InlineSweep(capability(&store)));
    let (mut d, _) = deployment(0, json!({"config-snapshot.io/snapshot": "app"}));
    d["spec"]["template"]["spec"]["containers"][0]["envFrom"] = json!([{"configMapRef": {"name": "app"}}]);
    let p = payload(&request("Deployment", "apps", "CREATE", &d, None));
    let made = config_snapshot_policy::model::content::plain_snapshot(
        &config_snapshot_policy::model::source::SourceId::new(
            config_snapshot_policy::model::source::SourceKind::ConfigMap,
            "app",
        ),
        "default",
        "1",
        &config_snapshot_policy::model::content::Content::from_object(
            config_snapshot_policy::model::source::SourceKind::ConfigMap,
            &json!({"data": {"k": "v"}}),
        )
        .unwrap(),
    )
    .0;
    let mut group = c.benchmark_group("gc sweep");
    group.sample_size(10).measurement_time(Duration::from_secs(10));
    // Each admission creates the snapshot anew, so each one sweeps.
    // What is measured is a sweep that lists everything and keeps the
    // snapshot a ReplicaSet still uses; if a change made it skip, the
    // figure would be a lie.
    struct ListsReplicaSets(InlineSweep, std::sync::atomic::AtomicBool);
    impl CallHandler for ListsReplicaSets {
        fn call(&self, b: &str, n: &str, o: &str, p: &[u8]) -> Result<Vec<u8>, CallFailure> {
            if o == "list_resources_by_namespace" && String::from_utf8_lossy(p).contains("\"ReplicaSet\"") {
                self.1.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            self.0.call(b, n, o, p)
        }
    }
    let counting = Arc::new(ListsReplicaSets(InlineSweep(capability(&store)), Default::default()));
    let check = engine.call("validate", &p, counting.clone()).unwrap();
    assert!(String::from_utf8_lossy(&check).contains("mutated_object"));
    assert!(
        counting.1.load(std::sync::atomic::Ordering::SeqCst),
        "the admission did not sweep"
    );
    assert!(store.store().get("ConfigMap", "default", &old_name).is_some());
    drop(store.store().remove("ConfigMap", "default", &made));
    group.bench_function("B5 admission with sweep, 10000 ReplicaSets", |b| {
        b.iter_batched(
            || drop(store.store().remove("ConfigMap", "default", &made)),
            |()| engine.call("validate", &p, handler.clone()).unwrap(),
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

fn b6(c: &mut Criterion) {
    let path = paths::policy();
    let bytes = std::fs::read(path).unwrap();
    let precompiled = Engine::precompile(&bytes).unwrap();
    let mut group = c.benchmark_group("cold start");
    group.sample_size(10);
    group.bench_function("B6 compile the module", |b| {
        b.iter(|| Engine::from_bytes(&bytes, Engine::DEFAULT_TIMEOUT).unwrap())
    });
    group.bench_function("B6 load the precompiled module", |b| {
        b.iter(|| Engine::from_precompiled(&precompiled, Engine::DEFAULT_TIMEOUT).unwrap())
    });
    group.finish();
}

/// The floor every figure is divided by (docs/BENCHMARKS.md, "Floors"): the
/// least a waPC module can cost on this engine, with the same configuration
/// (pooling, epoch deadlines, WASI) and the policy's initial memory
/// (17 pages), measured in the same run. Machines differ by 2x or more;
/// ratios to this floor travel between them.
const FLOOR_WAT: &str = r#"
(module
  (import "wapc" "__guest_request" (func $request (param i32 i32)))
  (import "wapc" "__guest_response" (func $respond (param i32 i32)))
  (memory (export "memory") 17)
  (data (i32.const 1024) "{\"accepted\":true}")
  (func (export "wapc_init"))
  ;; F1: copies the operation and the request in, as any policy must.
  (func (export "__guest_call") (param $op_len i32) (param $msg_len i32) (result i32)
    (call $request (i32.const 4096) (i32.add (i32.const 4096) (local.get $op_len)))
    (call $respond (i32.const 1024) (i32.const 17))
    (i32.const 1)))
"#;

fn floor(c: &mut Criterion) {
    let floor_bytes = wat::parse_str(FLOOR_WAT).unwrap();
    let floor = Engine::from_precompiled(&Engine::precompile(&floor_bytes).unwrap(), BENCH_TIMEOUT).unwrap();
    let store = store_with(vec![]);
    let handler: Arc<dyn CallHandler> = Arc::new(capability(&store));
    let (d, _) = deployment(8, json!({}));
    let plain = payload(&request("Deployment", "apps", "UPDATE", &d, Some(&d)));
    let mut group = c.benchmark_group("floor");
    group.bench_function("F1 empty waPC module, same request", |b| {
        b.iter(|| floor.call("validate", &plain, handler.clone()).unwrap())
    });
    group.finish();
}

criterion_group!(benches, floor, b1_b2, b3, b4, b5, b6);
criterion_main!(benches);
