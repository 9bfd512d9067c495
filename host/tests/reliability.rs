//! Reliability: faults on every write, Secret hygiene, bad input, and
//! concurrency, against the release policy wasm.
#![allow(clippy::too_many_lines, reason = "a test or benchmark is a story read top to bottom")]

use std::collections::{BTreeMap, HashMap};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use config_snapshot::capability::{Caller, Capability};
use config_snapshot::cluster::proof::Prover;
use config_snapshot::cluster::Cluster;
use config_snapshot::kubewarden::engine::Engine;
use config_snapshot::lifecycle::{Rules, Silent};
use config_snapshot::replay;
use config_snapshot::replay::simulator::{Shared, Simulator};
use config_snapshot_policy::model::content::Content;
use config_snapshot_policy::model::settings::Settings;
use config_snapshot_policy::model::source::SourceKind;
use config_snapshot_policy::model::{keys, references, template};
use serde_json::{json, Value};

mod support;
use support::paths::policy;

/// The capability of one request in `namespace` over `cluster`.
fn capability(cluster: Arc<dyn Cluster>, uid: &str, namespace: &str, dry_run: bool) -> Capability {
    let caller = Caller {
        uid: uid.into(),
        namespace: namespace.into(),
        dry_run,
        subject: Default::default(),
    };
    let rules = Rules::new(Settings::default(), Arc::new(Prover::replay()));
    Capability::new(cluster, caller, Arc::new(rules), Arc::default(), Arc::new(Silent))
}

fn engine() -> Arc<Engine> {
    Arc::new(Engine::load(&policy()).unwrap())
}

fn run_scenario(engine: &Arc<Engine>, name: &str, yaml: &str) -> replay::ScenarioResult {
    let dir = std::env::temp_dir().join(format!("cs-rel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    replay::run(engine.clone(), &path).unwrap()
}

/// Each failure kind a host reports, as (code, message): the policy
/// decides by the code, so each is injected with the one a host gives it.
/// `Unsupported` plays a host without the capability.
const ERRORS: [(&str, &str); 5] = [
    ("Forbidden", "configmaps is forbidden: User cannot create resource"),
    (
        "Conflict",
        "Operation cannot be fulfilled: the object has been modified",
    ),
    ("Timeout", "context deadline exceeded"),
    ("Forbidden", "exceeded quota: compute-resources"),
    ("Unsupported", "unknown binding: config-snapshot"),
];

const THREE_REFS: &str = r#"
objects:
  - {apiVersion: v1, kind: ConfigMap, metadata: {name: one}, data: {k: "1"}}
  - {apiVersion: v1, kind: ConfigMap, metadata: {name: two}, data: {k: "2"}}
  - {apiVersion: v1, kind: ConfigMap, metadata: {name: three}, data: {k: "3"}}
"#;

fn web(settings: &str) -> String {
    format!(
        r#"
  - apply:
      apiVersion: apps/v1
      kind: Deployment
      metadata: {{name: web, annotations: {{config-snapshot.io/watch: "*"}}}}
      spec:
        selector: {{matchLabels: {{app: web}}}}
        template:
          metadata: {{labels: {{app: web}}}}
          spec: {{containers: [{{name: c, image: "i:1", envFrom: [{{configMapRef: {{name: one}}}}, {{configMapRef: {{name: two}}}}, {{configMapRef: {{name: three}}}}]}}]}}{settings}"#
    )
}

/// Every write operation × every failure kind: the configured behaviour
/// holds, nothing is half done, and no reference dangles.
#[test]
fn faults_on_every_write_leave_nothing_half_done() {
    let engine = engine();
    for (i, (code, error)) in ERRORS.iter().enumerate() {
        let unknown = *code == "Unsupported";
        // create_snapshot: the 2nd of 3 creates fails. The three go to the
        // host as one batch (create_snapshots), whose items do not wait on
        // each other: the 1st and 3rd are made, unowned, and the sweep takes
        // them after orphanGracePeriod; no reference names any of them.
        let expect = if unknown {
            // Unsupported only counts on the first write; a later one is a plain failure.
            "{allowed: false, messageContains: \"could not create snapshot\"}".to_string()
        } else {
            format!("{{allowed: false, messageContains: {:?}}}", error)
        };
        let yaml = format!(
            "settings: {{orphanGracePeriod: 10m}}\nwatchMinInterval: 0s\n{THREE_REFS}steps:\n  - fault: {{operation: create_snapshot, code: {code}, error: {error:?}, times: 1, after: 1}}{}\n  - expect: {expect}\n  - assert:\n      - absent: {{kind: Deployment, name: web}}\n      - count: {{kind: ConfigMap, selector: app.kubernetes.io/managed-by=config-snapshot, equals: 2}}\n  - edit: {{kind: ConfigMap, name: one, set: {{data: {{k: \"1b\"}}}}}}\n  - advanceTime: 11m\n{}\n  - expect: {{allowed: true}}\n  - assert:\n      - effectiveConfig: {{kind: Deployment, name: web, source: configmap/one, data: {{k: \"1b\"}}}}\n      - effectiveConfig: {{kind: Deployment, name: web, source: configmap/two, data: {{k: \"2\"}}}}\n      - count: {{kind: ConfigMap, selector: app.kubernetes.io/managed-by=config-snapshot, equals: 3}}\n",
            web(""),
            web("")
        );
        let result = run_scenario(&engine, &format!("create-{i}"), &yaml);
        assert!(result.passed, "create_snapshot × {error}: {:?}", result.failure());

        // create_snapshot failing from the first call, with onSnapshotFailure: warn.
        let warn = if unknown {
            "rollout undo will not restore"
        } else {
            "left the reference to the source"
        };
        let yaml = format!(
            "settings: {{onSnapshotFailure: warn}}\n{THREE_REFS}steps:\n  - fault: {{operation: create_snapshot, code: {code}, error: {error:?}}}{}\n  - expect: {{allowed: true, warnings: [{warn:?}]}}\n  - assert:\n      - jsonPath: {{kind: Deployment, name: web, path: \"spec.template.spec.containers[0].envFrom[*].configMapRef.name\", equals: [one, two, three]}}\n      - count: {{kind: ConfigMap, selector: app.kubernetes.io/managed-by=config-snapshot, equals: 0}}\n",
            web("")
        );
        let result = run_scenario(&engine, &format!("create-warn-{i}"), &yaml);
        assert!(result.passed, "create_snapshot warn × {error}: {:?}", result.failure());

        // adopt fails once: the ReplicaSet is refused (admitting it could let
        // the garbage collector take its snapshots when an older revision is
        // pruned), the controller retries, and then it owns them.
        let yaml = format!(
            "watchMinInterval: 0s\n{THREE_REFS}steps:\n  - fault: {{operation: adopt, code: {code}, error: {error:?}, times: 1}}{}\n  - expect: {{allowed: true}}\n  - advanceTime: 1m\n  - assert:\n      - effectiveConfig: {{kind: Deployment, name: web, source: configmap/one, data: {{k: \"1\"}}}}\n      - count: {{kind: ReplicaSet, equals: 1}}\n      - jsonPath: {{kind: ConfigMap, name: one-0c2d435361, path: \"metadata.ownerReferences[*].kind\", equals: [Deployment, ReplicaSet]}}\n",
            web("")
        );
        let result = run_scenario(&engine, &format!("adopt-once-{i}"), &yaml);
        assert!(result.passed, "adopt once × {error}: {:?}", result.failure());
        let refused = result.steps.iter().flat_map(|s| &s.events).any(|e| {
            if unknown {
                e.contains("cannot adopt")
            } else {
                e.contains("refused; the Deployment controller retries")
            }
        });
        assert!(refused, "adopt once × {error}: the first ReplicaSet was not refused");

        // adopt fails for good: no revision is admitted, the workload keeps
        // its snapshots (referenced, so no sweep takes them), nothing
        // dangles. patch_workload fails: the source change is stored (no
        // review of it waits on the host), the host's watch says why the
        // watcher was not rolled, and the workload keeps what it runs.
        let yaml = format!(
            "watchMinInterval: 0s\n{THREE_REFS}steps:\n  - fault: {{operation: adopt, code: {code}, error: {error:?}}}{}\n  - expect: {{allowed: true}}\n  - advanceTime: 11m\n  - assert:\n      - count: {{kind: ReplicaSet, equals: {}}}\n      - exists: {{kind: ConfigMap, name: one-0c2d435361}}\n      - invariants: [nothingDangles]\n  - fault: {{operation: patch_workload, code: {code}, error: {error:?}}}\n  - edit: {{kind: ConfigMap, name: one, set: {{data: {{k: \"1b\"}}}}}}\n  - expect: {{allowed: true}}\n  - assert:\n      - jsonPath: {{kind: Deployment, name: web, path: \"spec.template.spec.containers[0].envFrom[0].configMapRef.name\", equals: one-0c2d435361}}\n      - invariants: [nothingDangles]\n",
            web(""),
            // Stock Kubewarden adopts nothing, and refuses nothing for it.
            if unknown { 1 } else { 0 }
        );
        let result = run_scenario(&engine, &format!("adopt-patch-{i}"), &yaml);
        assert!(result.passed, "adopt/patch × {error}: {:?}", result.failure());
        let told = result
            .steps
            .iter()
            .flat_map(|s| &s.events)
            .any(|e| e.contains("could not roll out Deployment web"));
        assert!(
            told || unknown,
            "adopt/patch × {error}: the failed rollout was not told"
        );

        // delete_snapshot fails during a sweep: the orphan stays, the admission succeeds.
        let yaml = format!(
            "{THREE_REFS}steps:\n  - fault: {{operation: create_snapshot, error: boom, times: 1, after: 1}}{}\n  - fault: {{operation: delete_snapshot, code: {code}, error: {error:?}}}\n  - edit: {{kind: ConfigMap, name: one, set: {{data: {{k: \"1b\"}}}}}}\n  - advanceTime: 11m\n{}\n  - expect: {{allowed: true}}\n  - assert:\n      - count: {{kind: ConfigMap, selector: app.kubernetes.io/managed-by=config-snapshot, equals: 4}}\n",
            web(""),
            web("")
        );
        let result = run_scenario(&engine, &format!("delete-{i}"), &yaml);
        assert!(result.passed, "delete_snapshot × {error}: {:?}", result.failure());
    }
}

/// A canary in a Secret never reaches stdout, stderr or --json output, even
/// through failures and failing assertions.
#[test]
fn secret_data_never_leaves_the_cluster() {
    const CANARY: &str = "CANARY-9f27c1-do-not-print";
    let b64 = base64::engine::general_purpose::STANDARD.encode(CANARY);
    let yaml = format!(
        r#"
objects:
  - {{apiVersion: v1, kind: Secret, metadata: {{name: creds}}, stringData: {{password: {CANARY}}}}}
steps:
  - fault: {{operation: create_snapshot, error: "forbidden", times: 1}}
  - apply:
      apiVersion: apps/v1
      kind: Deployment
      metadata: {{name: web, annotations: {{config-snapshot.io/watch: "*"}}}}
      spec:
        selector: {{matchLabels: {{app: web}}}}
        template:
          metadata: {{labels: {{app: web}}}}
          spec: {{containers: [{{name: c, image: i, envFrom: [{{secretRef: {{name: creds}}}}]}}]}}
  - apply:
      apiVersion: apps/v1
      kind: Deployment
      metadata: {{name: web, annotations: {{config-snapshot.io/watch: "*"}}}}
      spec:
        selector: {{matchLabels: {{app: web}}}}
        template:
          metadata: {{labels: {{app: web}}}}
          spec: {{containers: [{{name: c, image: i, envFrom: [{{secretRef: {{name: creds}}}}]}}]}}
  - edit: {{kind: Secret, name: creds, set: {{stringData: {{password: {CANARY}-2}}}}}}
  - assert:
      - effectiveConfig: {{kind: Deployment, name: web, source: secret/creds, data: {{password: wrong}}}}
      - jsonPath: {{kind: Secret, name: creds, path: data.password, equals: wrong}}
"#
    );
    let dir = std::env::temp_dir().join(format!("cs-canary-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("canary.yaml");
    std::fs::write(&path, yaml).unwrap();
    for json_flag in [false, true] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_config-snapshot"));
        cmd.arg("replay").arg("--policy").arg(policy()).arg(&path);
        if json_flag {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        assert!(!out.status.success(), "the scenario has failing checks on purpose");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("creds"), "the output mentions the Secret by name");
        let b64_2 = base64::engine::general_purpose::STANDARD.encode(format!("{CANARY}-2"));
        for needle in [CANARY, b64.as_str(), b64_2.as_str(), &b64[..16]] {
            assert!(!text.contains(needle), "Secret data leaked ({needle}) in:\n{text}");
        }
    }
}

fn admission(kind: &str, group: &str, object: Value) -> Value {
    json!({"uid": "r", "kind": {"group": group, "version": "v1", "kind": kind}, "operation": "CREATE",
           "namespace": "default", "name": "x", "object": object, "dryRun": false})
}

/// Bad input never traps the policy: each gets a clear answer in time.
#[test]
fn bad_input_gets_a_clear_answer_within_the_deadline() {
    let engine = engine();
    let shared = Arc::new(Shared::default());
    let handler = || Arc::new(capability(shared.clone(), "r", "default", false));
    let opted = json!({"config-snapshot.io/snapshot": "*"});
    let big = "x".repeat(1536 * 1024);
    let long = "a".repeat(253);
    let many: Vec<Value> = (0..10_000)
        .map(|i| json!({"configMapRef": {"name": format!("cm-{i}"), "optional": true}}))
        .collect();
    let mut deep = String::new();
    for _ in 0..10_000 {
        deep.push_str("{\"a\":");
    }
    deep.push('1');
    deep.push_str(&"}".repeat(10_000));
    let deep_payload = format!(
        r#"{{"settings":{{}},"request":{{"uid":"r","kind":{{"group":"apps","version":"v1","kind":"Deployment"}},"operation":"CREATE","namespace":"default","object":{deep}}}}}"#
    );

    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("non-JSON", b"this is not json".to_vec()),
        ("invalid UTF-8", vec![0xff, 0xfe, b'{', 0x80]),
        ("empty", vec![]),
        ("wrong kind", serde_json::to_vec(&json!({"request": admission("Pod", "", json!({"metadata": {"name": "p"}})), "settings": {}})).unwrap()),
        ("missing metadata", serde_json::to_vec(&json!({"request": admission("Deployment", "apps", json!({"spec": {"template": {}}})), "settings": {}})).unwrap()),
        ("1.5 MiB object", serde_json::to_vec(&json!({"request": admission("Deployment", "apps", json!({"metadata": {"name": "big", "annotations": opted},
            "spec": {"template": {"metadata": {"annotations": {"blob": big}}, "spec": {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "missing", "optional": true}}]}]}}}})), "settings": {}})).unwrap()),
        ("253-character names", serde_json::to_vec(&json!({"request": admission("Deployment", "apps", json!({"metadata": {"name": long, "annotations": opted},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": long}}]}]}}}})), "settings": {}})).unwrap()),
        ("10,000 references", serde_json::to_vec(&json!({"request": admission("Deployment", "apps", json!({"metadata": {"name": "many", "annotations": opted},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "envFrom": many}]}}}})), "settings": {}})).unwrap()),
        ("JSON nested 10,000 deep", deep_payload.into_bytes()),
        ("bad settings", serde_json::to_vec(&json!({"request": admission("Deployment", "apps", json!({"metadata": {"name": "d"}})), "settings": {"nope": 1}})).unwrap()),
    ];
    for (name, payload) in cases {
        let started = Instant::now();
        let answer = engine.call("validate", &payload, handler());
        let elapsed = started.elapsed();
        let answer = answer.unwrap_or_else(|e| panic!("{name}: the policy trapped: {e}"));
        let v: Value = serde_json::from_slice(&answer).unwrap_or_else(|e| panic!("{name}: invalid response: {e}"));
        assert!(elapsed < Engine::DEFAULT_TIMEOUT, "{name}: took {elapsed:?}");
        if v["accepted"] == false {
            let msg = v["message"].as_str().unwrap_or_default();
            assert!(
                msg.starts_with("config-snapshot: ") && msg.len() < 2_000,
                "{name}: unclear message {msg:?}"
            );
        }
        eprintln!("{name}: accepted={} in {elapsed:?}", v["accepted"]);
    }
}

/// Review "Contained", finding 2: a Deployment naming 64 large ConfigMaps,
/// past what one request may hold of its sources, is answered with the
/// host's refusal in a clear message, and the policy does not trap.
#[test]
fn a_request_whose_sources_hold_too_much_is_answered_clearly() {
    let engine = engine();
    let shared = Arc::new(Shared::default());
    let data: serde_json::Map<String, Value> = (0..500).map(|i| (format!("k{i}"), json!("v"))).collect();
    for i in 0..references::MAX_SOURCES {
        shared.store().persist(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("big-{i}"), "namespace": "default"}, "data": data}));
    }
    let env_from: Vec<Value> = (0..references::MAX_SOURCES)
        .map(|i| json!({"configMapRef": {"name": format!("big-{i}")}}))
        .collect();
    let d = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default", "annotations": {"config-snapshot.io/snapshot": "*"}},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "envFrom": env_from}]}}}});
    let cap = Arc::new(capability(shared.clone(), "r", "default", false).holding_at_most(10_000));
    let answer = engine
        .validate(&admission("Deployment", "apps", d), &json!({}), cap)
        .expect("answered, not trapped");
    let said = format!("{} {}", answer["message"], answer["warnings"]);
    assert!(said.contains("more than the 10000 JSON values"), "{answer}");
    assert_eq!(answer["accepted"], false, "{answer}");
}

/// A runaway policy is stopped by the epoch deadline with a clear error.
#[test]
fn the_deadline_stops_a_runaway_guest() {
    // A waPC-shaped module whose guest call never returns.
    let wat = r#"(module
        (import "wapc" "__guest_request" (func $req (param i32 i32)))
        (memory (export "memory") 1)
        (func (export "wapc_init"))
        (func (export "__guest_call") (param i32 i32) (result i32) (loop $l (br $l)) (i32.const 0)))"#;
    let engine = Engine::from_bytes(wat.as_bytes(), Duration::from_millis(200)).unwrap();
    let started = Instant::now();
    let err = engine
        .call(
            "validate",
            b"{}",
            Arc::new(capability(Arc::new(Shared::default()), "r", "default", false)),
        )
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(err.to_string().contains("deadline"), "{err}");
}

/// Two admissions of the same Deployment race to create one snapshot. A
/// barrier holds both until each has seen that the snapshot does not exist
/// yet, so both try to create it: one create lands, the other gets
/// AlreadyExists and must answer `created: false` (content addressing makes
/// it the same snapshot), not refuse the Deployment.
#[test]
fn racing_admissions_of_the_same_deployment_make_one_snapshot() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Barrier;

    use config_snapshot::cluster::{self, ApiError, Preconditions, Selector};

    struct Racing {
        inner: Arc<Shared>,
        /// The snapshot both race to create.
        name: String,
        barrier: Barrier,
        /// The existence checks held at the barrier so far (the first two).
        held: AtomicUsize,
        landed: AtomicUsize,
        refused: AtomicUsize,
    }
    impl Cluster for Racing {
        fn following(&self, kind: &str, namespace: &str) -> bool {
            self.inner.following(kind, namespace)
        }
        fn get(&self, kind: &str, ns: &str, name: &str) -> cluster::Result<Option<Value>> {
            let found = self.inner.get(kind, ns, name)?;
            if kind == "ConfigMap" && name == self.name && self.held.fetch_add(1, Ordering::SeqCst) < 2 {
                self.barrier.wait();
            }
            Ok(found)
        }
        fn list(&self, k: &str, n: Option<&str>, s: &Selector, v: &mut dyn FnMut(&Value)) -> cluster::Result<()> {
            self.inner.list(k, n, s, v)
        }
        fn create(&self, object: Value) -> cluster::Result<()> {
            let result = self.inner.create(object);
            match &result {
                Ok(()) => self.landed.fetch_add(1, Ordering::SeqCst),
                Err(ApiError::AlreadyExists(_)) => self.refused.fetch_add(1, Ordering::SeqCst),
                Err(_) => 0,
            };
            result
        }
        fn delete(&self, k: &str, n: &str, m: &str, pre: &Preconditions) -> cluster::Result<()> {
            self.inner.delete(k, n, m, pre)
        }
        fn patch(&self, k: &str, n: &str, m: &str, rv: &str, ops: Vec<Value>) -> cluster::Result<()> {
            self.inner.patch(k, n, m, rv, ops)
        }
        fn now(&self) -> i64 {
            self.inner.now()
        }
        fn namespace_uid(&self, ns: &str) -> cluster::Result<Option<String>> {
            self.inner.namespace_uid(ns)
        }
    }

    let engine = engine();
    let shared = Arc::new(Shared::default());
    shared.store().persist(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app", "namespace": "default"}, "data": {"k": "v"}}));
    let content = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"k": "v"}})).unwrap();
    let racing = Arc::new(Racing {
        inner: shared.clone(),
        name: Prover::replay().snapshot_name("default", "app", &content),
        barrier: Barrier::new(2),
        held: AtomicUsize::new(0),
        landed: AtomicUsize::new(0),
        refused: AtomicUsize::new(0),
    });
    let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "default", "annotations": {"config-snapshot.io/snapshot": "*"}},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "app"}}]}]}}}});
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let (engine, racing, d) = (engine.clone(), racing.clone(), d.clone());
            std::thread::spawn(move || {
                let cap = Arc::new(capability(racing, &format!("r{t}"), "default", false));
                let mut request = admission("Deployment", "apps", d);
                request["uid"] = json!(format!("r{t}"));
                engine.validate(&request, &json!({}), cap).unwrap()
            })
        })
        .collect();
    let answers: Vec<Value> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for a in &answers {
        assert_eq!(a["accepted"], true, "the loser of the race was refused: {a}");
    }
    assert_eq!(answers[0]["mutated_object"], answers[1]["mutated_object"]);
    assert_eq!(
        (
            racing.landed.load(Ordering::SeqCst),
            racing.refused.load(Ordering::SeqCst)
        ),
        (1, 1),
        "both raced to create; exactly one landed"
    );
    let snapshots = shared.store().all().filter(|o| keys::is_snapshot(o)).count();
    assert_eq!(snapshots, 1);
}

/// A tiny deterministic generator, so a failing walk can be replayed.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// 1,000 interleaved edits, rollouts and undos end with every revision
/// reading the content it was made from, no dangling reference, and no
/// stale orphan.
#[test]
fn a_seeded_random_walk_keeps_every_invariant() {
    let engine = engine();
    let mut sim = Simulator::new(engine, json!({"orphanGracePeriod": "10m"}), 1_800_000_000);
    sim.effect_rules.watch_min_interval = 0;
    let sources = ["alpha", "beta"];
    // Source content by resourceVersion, to check what each snapshot captured.
    let mut history: HashMap<(String, String), BTreeMap<String, String>> = HashMap::new();
    let record = |sim: &Simulator, history: &mut HashMap<(String, String), BTreeMap<String, String>>| {
        for s in sources {
            let o = sim.get("ConfigMap", "default", s).unwrap();
            let data: BTreeMap<String, String> = serde_json::from_value(o["data"].clone()).unwrap_or_default();
            history.insert(
                (
                    s.to_string(),
                    o["metadata"]["resourceVersion"].as_str().unwrap().to_string(),
                ),
                data,
            );
        }
    };
    for s in sources {
        sim.load(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": s}, "data": {"k": "0", "other": "0"}}),
        )
        .unwrap();
    }
    record(&sim, &mut history);
    let workloads = [
        ("Deployment", "web", "*", "snapshot"),
        ("StatefulSet", "db", "alpha", "watch"),
        ("Deployment", "api", "*", "watch"),
    ];
    for (kind, name, which, mode) in workloads {
        let mut spec = json!({"selector": {"matchLabels": {"app": name}}, "revisionHistoryLimit": 3,
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "img:0",
                "env": [{"name": "K", "valueFrom": {"configMapKeyRef": {"name": "alpha", "key": "k"}}}],
                "envFrom": [{"configMapRef": {"name": "beta"}}]}]}}});
        if kind == "StatefulSet" {
            spec["serviceName"] = json!(name);
        }
        let a = sim.apply(json!({"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "annotations": {format!("config-snapshot.io/{mode}"): which}}, "spec": spec}), false, "test").unwrap();
        assert!(a.allowed);
    }
    let mut rng = Lcg(0x5eed);
    for step in 0..1_000 {
        let (kind, name, _, _) = workloads[rng.next(3) as usize];
        let result = match rng.next(6) {
            0 | 1 => {
                let s = sources[rng.next(2) as usize];
                let key = if rng.next(3) == 0 { "other" } else { "k" };
                sim.edit("ConfigMap", "default", s, &json!({"data": {key: format!("{step}")}}), "test").map(drop)
            }
            2 => sim.edit(kind, "default", name, &json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": format!("img:{step}"),
                "env": [{"name": "K", "valueFrom": {"configMapKeyRef": {"name": "alpha", "key": "k"}}}], "envFrom": [{"configMapRef": {"name": "beta"}}]}]}}}}), "test").map(drop),
            3 => sim.rollout_undo(kind, "default", name, None).map(drop),
            4 => sim.rollout_restart(kind, "default", name).map(drop),
            _ => sim.advance(rng.next(300) as i64 + 1),
        };
        // An undo without history is the only expected error.
        if let Err(e) = result {
            assert!(e.to_string().contains("no rollout history"), "step {step}: {e}");
        }
        record(&sim, &mut history);
    }
    // Let every orphan age past the grace period, then make each source's
    // next snapshot run the sweep.
    sim.advance(11 * 60).unwrap();
    for s in sources {
        sim.edit(
            "ConfigMap",
            "default",
            s,
            &json!({"data": {"k": "final", "other": "final"}}),
            "test",
        )
        .unwrap();
        record(&sim, &mut history);
    }
    sim.advance(11 * 60).unwrap();
    for s in sources {
        sim.edit("ConfigMap", "default", s, &json!({"data": {"k": "final2"}}), "test")
            .unwrap();
        record(&sim, &mut history);
    }

    let objects = sim.objects();
    let exists = |kind: &str, name: &str| {
        objects
            .iter()
            .any(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    };
    let mut templates: Vec<(String, Value)> = Vec::new();
    for o in &objects {
        let t = match o["kind"].as_str().unwrap() {
            "Deployment" | "StatefulSet" | "ReplicaSet" => o["spec"]["template"].clone(),
            "ControllerRevision" => o["data"]["spec"]["template"].clone(),
            _ => continue,
        };
        templates.push((
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            ),
            t,
        ));
    }
    let mut referenced = std::collections::HashSet::new();
    for (holder, t) in &templates {
        let mapping = template::Mapping::of(t);
        for r in references::collect(t) {
            let Some(snapshot) = mapping.0.iter().find(|(_, s)| **s == r.name).map(|(_, s)| s.clone()) else {
                continue;
            };
            assert!(
                exists(r.kind.kind(), &snapshot),
                "{holder} references missing {snapshot}"
            );
            referenced.insert(snapshot.clone());
            let snap = objects
                .iter()
                .find(|o| o["metadata"]["name"] == snapshot.as_str())
                .unwrap();
            let source = snap["metadata"]["annotations"][keys::SOURCE_NAME].as_str().unwrap();
            let rv = snap["metadata"]["annotations"][keys::SOURCE_RESOURCE_VERSION]
                .as_str()
                .unwrap();
            let data: BTreeMap<String, String> = serde_json::from_value(snap["data"].clone()).unwrap_or_default();
            let matches = |at: &BTreeMap<String, String>| data.iter().all(|(k, v)| at.get(k) == Some(v));
            if rv.is_empty() {
                // Taken by the watch from the admitted change: some version the source really had.
                assert!(
                    history.iter().any(|((s, _), at)| s == source && matches(at)),
                    "{snapshot} holds content {source} never had"
                );
            } else {
                let at_the_time = history
                    .get(&(source.to_string(), rv.to_string()))
                    .unwrap_or_else(|| panic!("no history for {source}@{rv}"));
                assert!(matches(at_the_time), "{snapshot} differs from {source}@{rv}");
            }
            let content = Content::from_object(SourceKind::ConfigMap, snap).unwrap();
            assert_eq!(snap["metadata"]["annotations"][keys::CONTENT_HASH], content.hash());
        }
    }
    let now = sim.now();
    for o in &objects {
        if o["metadata"]["labels"][keys::MANAGED_BY] != keys::MANAGED_BY_VALUE {
            continue;
        }
        let unowned = o["metadata"]["ownerReferences"].as_array().is_none_or(|r| r.is_empty());
        let created = config_snapshot_policy::model::duration::parse_rfc3339(
            o["metadata"]["creationTimestamp"].as_str().unwrap(),
        )
        .unwrap();
        let name = o["metadata"]["name"].as_str().unwrap();
        assert!(
            !(unowned && now - created > 600 && !referenced.contains(name)),
            "stale orphan {name}"
        );
    }
}

/// A hostile guest compiled to wasm: it calls `config-snapshot/v1` through
/// the real waPC transport with a payload of our choosing. A valid create
/// (the control) lands; every hostile call leaves the store unchanged.
#[test]
fn a_hostile_wasm_guest_cannot_break_the_host_invariants() {
    use config_snapshot_policy::model::source::SourceId;

    fn guest(operation: &str, payload: &Value) -> String {
        let body = payload.to_string().replace('\\', "\\\\").replace('"', "\\\"");
        let len = payload.to_string().len();
        format!(
            r#"(module
  (import "wapc" "__host_call" (func $hc (param i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "wapc" "__guest_response" (func $resp (param i32 i32)))
  (memory (export "memory") 2)
  (data (i32.const 0) "config-snapshot")
  (data (i32.const 16) "v1")
  (data (i32.const 32) "{operation}")
  (data (i32.const 64) "ok")
  (data (i32.const 128) "{body}")
  (func (export "wapc_init"))
  (func (export "__guest_call") (param i32 i32) (result i32)
    (drop (call $hc (i32.const 0) (i32.const 15) (i32.const 16) (i32.const 2) (i32.const 32) (i32.const {op_len}) (i32.const 128) (i32.const {len})))
    (call $resp (i32.const 64) (i32.const 2))
    (i32.const 1)))"#,
            op_len = operation.len()
        )
    }

    let content = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"k": "v"}})).unwrap();
    let proposed = |content: &Content| {
        let name = Prover::replay().snapshot_name("team-a", "app", content);
        config_snapshot_policy::model::content::snapshot_object(
            &SourceId::new(SourceKind::ConfigMap, "app"),
            "team-a",
            &name,
            "1",
            content,
        )
    };
    let good = proposed(&content);
    let mut other_ns = good.clone();
    other_ns["metadata"]["namespace"] = json!("kube-system");
    let token = {
        let content = Content::from_object(
            SourceKind::Secret,
            &json!({"type": "kubernetes.io/service-account-token", "data": {"k": "dg=="}}),
        )
        .unwrap();
        let name = Prover::replay().snapshot_name("team-a", "app", &content);
        config_snapshot_policy::model::content::snapshot_object(
            &SourceId::new(SourceKind::Secret, "app"),
            "team-a",
            &name,
            "1",
            &content,
        )
    };
    let mut wrong_hash = good.clone();
    wrong_hash["data"]["k"] = json!("tampered");
    let never_stored = {
        let content = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"k": "never written"}})).unwrap();
        proposed(&content)
    };
    let plain = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "plain", "namespace": "team-a"}, "data": {"a": "1"}});
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "team-a"}, "spec": {"replicas": 1}});
    // The control's source, as stored: a snapshot is made only of that.
    let source = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app", "namespace": "team-a"}, "data": {"k": "v"}});

    let run = |operation: &str, payload: Value, dry_run: bool| -> (Vec<Value>, usize) {
        let shared = Arc::new(Shared::default());
        shared.store.lock().unwrap().persist(plain.clone());
        shared.store.lock().unwrap().persist(deployment.clone());
        shared.store.lock().unwrap().persist(source.clone());
        let engine = Engine::from_bytes(guest(operation, &payload).as_bytes(), Duration::from_secs(2)).unwrap();
        let cap = Arc::new(capability(shared.clone(), "r", "team-a", dry_run));
        engine.call("validate", b"{}", cap.clone()).unwrap();
        let objects: Vec<Value> = shared.store.lock().unwrap().all().cloned().collect();
        (objects, cap.take_staged().len())
    };

    let (control, _) = run("create_snapshot", json!({"object": good}), false);
    assert_eq!(control.len(), 4, "the control create must land: the transport works");

    let hostile = [
        (
            "create_snapshot",
            json!({"object": other_ns}),
            false,
            "create in another namespace",
        ),
        (
            "create_snapshot",
            json!({"object": token}),
            false,
            "create a Secret of a type the API server mints a token into",
        ),
        (
            "create_snapshot",
            json!({"object": wrong_hash}),
            false,
            "create with a name that does not match the content",
        ),
        (
            "create_snapshot",
            json!({"object": never_stored}),
            false,
            "create a snapshot of content its source does not hold",
        ),
        (
            "delete_snapshot",
            json!({"kind": "ConfigMap", "name": "plain", "uid": "x"}),
            false,
            "delete an unlabelled object",
        ),
        (
            "create_snapshot",
            json!({"object": good}),
            true,
            "write during a dry run",
        ),
    ];
    for (operation, payload, dry_run, what) in hostile {
        let (objects, queued) = run(operation, payload, dry_run);
        assert_eq!(objects.len(), 3, "{what}: the store changed");
        assert_eq!(queued, 0, "{what}: an effect was queued");
        assert!(objects.iter().any(|o| o["metadata"]["name"] == "plain"), "{what}");
        assert!(
            !objects
                .iter()
                .any(|o| o["metadata"]["labels"][keys::MANAGED_BY] == keys::MANAGED_BY_VALUE),
            "{what}"
        );
    }
    // Patching outside the pod template, in a request well formed but for
    // that: refused before anything is queued.
    let patch = |op: Value| {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "resourceVersion": "2",
               "patch": [op], "snapshot": "app-0123456789", "keys": null,
               "source": {"kind": "ConfigMap", "name": "app", "contentHash": "0".repeat(64)}})
    };
    let (objects, queued) = run(
        "patch_workload",
        patch(json!({"op": "replace", "path": "/spec/replicas", "value": 99})),
        false,
    );
    assert_eq!(queued, 0, "a patch outside /spec/template was queued");
    let web = objects.iter().find(|o| o["metadata"]["name"] == "web").unwrap();
    assert_eq!(web["spec"]["replicas"], 1);
    // Control: a patch inside the template is queued.
    let (_, queued) = run(
        "patch_workload",
        patch(json!({"op": "add", "path": "/spec/template/x", "value": 1})),
        false,
    );
    assert_eq!(queued, 1);
}
