//! B7: `serve`'s admission path (docs/BENCHMARKS.md): an AdmissionReview
//! body in, the response document out, through the header parse, the wasm
//! policy, and the kube-backed capability. Reads come from the watch cache,
//! except the sources the policy reads fresh (`disable_cache`), which go over
//! loopback HTTP to the in-process API server stand-in. The TLS and HTTP
//! layers in front are not included.

#[path = "../tests/support/paths.rs"]
mod paths;

use std::sync::Arc;
use std::time::Duration;

use config_snapshot::kubewarden::engine::Engine;
use config_snapshot::serve;
use config_snapshot_testing::standin::ApiServer;
use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use serde_json::{json, Value};

fn engine() -> Arc<Engine> {
    let path = paths::policy();
    let bytes = std::fs::read(path).expect("make policy.wasm first");
    let precompiled = Engine::precompile(&bytes).unwrap();
    Arc::new(Engine::from_precompiled(&precompiled, Engine::DEFAULT_TIMEOUT).unwrap())
}

fn options(settings: &Value) -> serve::Options {
    serve::Options {
        settings_json: settings.to_string(),
        queue_capacity: 1 << 20,
        shutdown_grace: std::time::Duration::from_secs(1),
        // A scenario plays hours in seconds: the per-namespace budget of
        // snapshot creations is tested where it is the subject.
        snapshot_rate: std::num::NonZeroU32::MAX,
        ..serve::Options::defaults("unused")
    }
}

/// A Deployment reading `n` ConfigMaps through env, and those ConfigMaps.
fn deployment(n: usize, annotations: Value) -> (Value, Vec<Value>) {
    let env: Vec<Value> = (0..n)
        .map(|i| json!({"name": format!("E{i}"), "valueFrom": {"configMapKeyRef": {"name": format!("src-{i}"), "key": "k"}}}))
        .collect();
    let sources = (0..n)
        .map(|i| json!({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": format!("src-{i}"), "namespace": "default"}, "data": {"k": "v", "other": "x"}}))
        .collect();
    let d = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default", "annotations": annotations},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}, "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "app", "image": "nginx:1.25", "env": env}]}}}
    });
    (d, sources)
}

fn review(object: &Value) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "operation": "CREATE", "namespace": "default", "name": "web", "userInfo": {"username": "bench"},
        "object": object, "oldObject": null, "dryRun": false}}),
    )
    .unwrap()
}

/// How each opted-in run is set up: the API server's latency, and whether
/// every reuse must write its mark.
struct Variant {
    label: &'static str,
    latency: Duration,
    settings: Value,
    /// The writes to the reused snapshots one admission makes, per reference.
    marks: usize,
}

fn b7(c: &mut Criterion) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let api = runtime.block_on(ApiServer::start());
    let client =
        runtime.block_on(async { kube::Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap() });
    let serve_with = |settings: &Value| {
        let (state, worker) = runtime
            .block_on(async {
                serve::build_with_engine(
                    &options(settings),
                    client.clone(),
                    engine(),
                    config_snapshot::cluster::proof::Prover::replay(),
                )
            })
            .unwrap();
        // serve's worker, as `serve` runs it: the effects an admission
        // stages (the sweep after a new snapshot) run in the background,
        // and `queue.quiet()` below waits for them to end.
        runtime.spawn(worker.run());
        state
    };
    let state = serve_with(&json!({}));
    let mut group = c.benchmark_group("serve");

    let (plain, _) = deployment(8, json!({}));
    let body = review(&plain);
    group.bench_function("B7 serve pass-through, Deployment without opt-in", |b| {
        b.iter(|| serve::review(&state, &body).ok().unwrap())
    });

    // A grace period no longer than the reuse margin leaves no room to
    // skip the mark: every reuse writes one (docs/design.md, "Garbage
    // collection"), as every reuse did before the rule.
    let marking = json!({"orphanGracePeriod": "5m"});
    let variants = [
        Variant {
            label: "B7 serve admission, refs",
            latency: Duration::ZERO,
            settings: json!({}),
            marks: 0,
        },
        Variant {
            label: "B7 serve admission, API 1 ms, refs",
            latency: Duration::from_millis(1),
            settings: json!({}),
            marks: 0,
        },
        Variant {
            label: "B7 serve admission, marking, refs",
            latency: Duration::ZERO,
            settings: marking.clone(),
            marks: 1,
        },
        Variant {
            label: "B7 serve admission, marking, API 1 ms, refs",
            latency: Duration::from_millis(1),
            settings: marking,
            marks: 1,
        },
    ];
    for variant in variants {
        let state = serve_with(&variant.settings);
        api.latency(variant.latency);
        for n in [1usize, 8] {
            opted_in(&mut group, &state, &api, &variant, n);
        }
    }
    api.latency(Duration::ZERO);
    group.finish();
}

fn opted_in(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    state: &Arc<serve::State>,
    api: &ApiServer,
    variant: &Variant,
    n: usize,
) {
    let (d, sources) = deployment(n, json!({"config-snapshot.io/snapshot": "*"}));
    for s in sources {
        state.cluster.cache.observe(api.put(s));
    }
    // The Deployment as the API server persists it after the first
    // admission: each one's deferred adoption finds its owner and ends,
    // as in a cluster, instead of piling up retries behind the bench.
    api.put(d.clone());
    let body = review(&d);
    // The first admission creates the snapshots (or, in a later variant,
    // finds them); the measured ones find them.
    let first = serve::review(state, &body).ok().unwrap();
    assert!(first.mutated.is_some(), "{}", first.review);
    // serve's watch would deliver the snapshots to its cache within
    // milliseconds; the bench's cache is fed by hand.
    for snapshot in api.list("ConfigMap") {
        state.cluster.cache.observe(snapshot);
    }
    // Measure what the label says: the reuses write their marks or none.
    let seen = api.log().len();
    serve::review(state, &body).ok().unwrap();
    let during = &api.log()[seen..];
    let marks = during
        .iter()
        .filter(|l| l.starts_with("PATCH /api/v1/namespaces/default/configmaps/"))
        .count();
    assert_eq!(marks, variant.marks * n, "{}: {during:?}", variant.label);
    assert_eq!(
        during.iter().filter(|l| l.starts_with("GET")).count(),
        2 * n,
        "each source and its snapshot read once: {during:?}"
    );
    assert_eq!(during.len(), 2 * n + marks, "nothing else: {during:?}");
    // An admission may stage effects (the sweep after a new snapshot),
    // which serve runs in the background. The setup (not timed) waits for
    // the last admission's to end, so the figure is the admission's
    // latency, not that plus its predecessors' background work competing
    // for the cores; the load test (docs/BENCHMARKS.md, "Load") measures
    // the two together.
    group.bench_with_input(BenchmarkId::new(variant.label, n), &body, |b, body| {
        b.iter_batched(
            || {
                while !state.queue.quiet() {
                    std::thread::sleep(Duration::from_micros(200));
                }
            },
            |()| serve::review(state, body).ok().unwrap(),
            BatchSize::PerIteration,
        )
    });
}

criterion_group!(benches, b7);
criterion_main!(benches);
