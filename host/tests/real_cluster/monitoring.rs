//! The monitoring pack (deploy/components/monitoring) against what a real
//! control plane and serve expose: every series the alerts and the
//! dashboard read exists, `promtool check rules` accepts the rules, and
//! their unit tests pass over series recorded here while each alert's cause
//! really happens:
//!
//! 1. a quiet baseline: no alert;
//! 2. an object labelled as a snapshot without a signature (unproven);
//! 3. a watch rollout the storm guard holds (serve at a 1 h interval);
//! 4. a watch rollout kube-apiserver refuses to serve's patch (a
//!    ValidatingAdmissionPolicy), given up after its retries (effects failing);
//! 5. serve stopped: kube-apiserver lets an opted-in Deployment through
//!    unreviewed (fail-open), and no replica leads.
//!
//! Alerts that must last (`for:`) or grow past a threshold get the recording
//! up to their phase, then each series held at its last value (a gauge stays
//! until its cause goes; a held rollout's age grows one second a second):
//! recorded, then extended as it would go on. The test file is written to
//! target/alerts_test.yaml, and with `BENCH_WRITE_DOCS=1` to
//! deploy/components/monitoring/alerts_test.yaml, which users can run with
//! `promtool test rules`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use super::{
    config_map, eventually, root, serve_flags, serve_flags_with, set_data, webhook_answers, workload, ControlPlane,
    ServeProcess,
};

/// Seconds between samples: the unit tests' interval.
const STEP: u64 = 5;

/// The metric names a PromQL expression reads (ours and kube-apiserver's).
fn metric_names(expr: &str) -> BTreeSet<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|t| t.starts_with("config_snapshot_") || t.starts_with("apiserver_"))
        .map(str::to_string)
        .collect()
}

fn rules() -> Value {
    let text = std::fs::read_to_string(root().join("deploy/components/monitoring/prometheusrule.yaml")).unwrap();
    let object: Value = serde_yaml_ng::from_str(&text).unwrap();
    object["spec"].clone()
}

fn dashboard_exprs() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("deploy/components/monitoring/dashboard.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect()
}

fn alerts() -> Vec<Value> {
    rules()["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// The metric names an exposition holds.
fn names(text: &str) -> impl Iterator<Item = String> + '_ {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next().map(str::to_string))
}

/// `name{labels} value` lines of an exposition, for the metrics in `wanted`.
fn parse(text: &str, wanted: &BTreeSet<String>) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let name = series.split('{').next()?;
            if !wanted.contains(name) {
                return None;
            }
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// Samples every [`STEP`] seconds of serve's /metrics (whichever serve runs
/// now) and kube-apiserver's.
struct Recorder {
    samples: Arc<Mutex<Vec<BTreeMap<String, f64>>>>,
    /// Every metric name seen on serve or kube-apiserver.
    seen: Arc<Mutex<BTreeSet<String>>>,
    stop: Arc<AtomicBool>,
    serve: Arc<Mutex<Option<SocketAddr>>>,
}

impl Recorder {
    fn start(cp: &ControlPlane, wanted: BTreeSet<String>, serve: SocketAddr) -> Recorder {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let ops = Arc::new(Mutex::new(Some(serve)));
        let seen = Arc::new(Mutex::new(BTreeSet::new()));
        let (kubectl, kubeconfig) = (cp.bin.join("kubectl"), cp.kubeconfig.clone());
        let (into, until, at, seeing) = (samples.clone(), stop.clone(), ops.clone(), seen.clone());
        std::thread::spawn(move || {
            let mut next = std::time::Instant::now();
            while !until.load(Ordering::SeqCst) {
                let mut sample = BTreeMap::new();
                if let Some(addr) = *at.lock().unwrap() {
                    if let Some(text) = ops_metrics(addr) {
                        sample.extend(parse(&text, &wanted));
                        seeing.lock().unwrap().extend(names(&text));
                    }
                }
                if let Ok(out) = std::process::Command::new(&kubectl)
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .args(["get", "--raw", "/metrics"])
                    .output()
                {
                    let text = String::from_utf8_lossy(&out.stdout);
                    sample.extend(parse(&text, &wanted));
                    seeing.lock().unwrap().extend(names(&text));
                }
                into.lock().unwrap().push(sample);
                next += Duration::from_secs(STEP);
                std::thread::sleep(next.saturating_duration_since(std::time::Instant::now()));
            }
        });
        Recorder {
            samples,
            seen,
            stop,
            serve: ops,
        }
    }

    /// The index the next sample will have: an event's place in the series.
    fn mark(&self) -> usize {
        self.samples.lock().unwrap().len()
    }

    /// Waits until `n` more samples are taken.
    fn wait(&self, n: usize) {
        let target = self.mark() + n;
        eventually("the recorder's samples", (n as u64 + 2) * STEP + 10, || {
            (self.mark() >= target).then_some(())
        });
    }

    fn finish(self) -> (Vec<BTreeMap<String, f64>>, BTreeSet<String>) {
        self.stop.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_secs(STEP + 1));
        (self.samples.lock().unwrap().clone(), self.seen.lock().unwrap().clone())
    }
}

fn ops_metrics(addr: SocketAddr) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    Some(text.split_once("\r\n\r\n")?.1.to_string())
}

/// How the series go on after the recording stops at a phase.
#[derive(Clone, Copy)]
enum Then {
    /// Each series at its last value (absent stays absent).
    Held,
    /// As `Held`, but `series` grows one second a second (an age).
    Aging(&'static str),
}

/// Samples before the recording: each series as it was first recorded,
/// for six minutes (a cluster that ran before the story; without them a
/// counter that existed already would look new to `offset 5m`).
const BEFORE: usize = 6 * 60 / STEP as usize;

/// promtool's input series: [`BEFORE`], the samples `..end`, then `extra`
/// more samples as `then` says.
fn input_series(samples: &[BTreeMap<String, f64>], end: usize, extra: usize, then: Then) -> Vec<Value> {
    let keys: BTreeSet<&String> = samples[..end].iter().flat_map(|s| s.keys()).collect();
    keys.into_iter()
        .map(|key| {
            let first = samples[0].get(key);
            let mut values = vec![match first {
                Some(v) => format!("{v}+0x{}", BEFORE - 1),
                None => format!("_x{}", BEFORE - 1),
            }];
            // A series that stops being scraped gets a staleness marker,
            // as Prometheus writes when a scrape fails or its target goes;
            // without one the last value would linger for five minutes.
            let mut present = first.is_some();
            for sample in &samples[..end] {
                values.push(match (sample.get(key), present) {
                    (Some(v), _) => format!("{v}"),
                    (None, true) => "stale".to_string(),
                    (None, false) => "_".to_string(),
                });
                present = sample.contains_key(key);
            }
            let last = samples[end - 1].get(key);
            let aging = matches!(then, Then::Aging(name) if key.starts_with(name));
            values.push(match (last, aging) {
                (None, _) => format!("_x{extra}"),
                (Some(v), true) => format!("{v}+{STEP}x{extra}"),
                (Some(v), false) => format!("{v}+0x{extra}"),
            });
            json!({"series": key, "values": values.join(" ")})
        })
        .collect()
}

/// The alert `name` as promtool expects it: its rule's labels and
/// annotations, with `labels` filled in.
fn expected(name: &str, labels: &[(&str, &str)]) -> Value {
    let rule = alerts().into_iter().find(|r| r["alert"] == name).unwrap();
    let mut exp_labels: BTreeMap<String, String> = rule["labels"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .collect();
    let mut annotations = BTreeMap::new();
    for (k, v) in rule["annotations"].as_object().unwrap() {
        let mut text = v.as_str().unwrap().to_string();
        for (label, value) in labels {
            text = text.replace(&format!("{{{{ $labels.{label} }}}}"), value);
        }
        assert!(
            !text.contains("{{"),
            "{name}'s {k} uses a template the test does not fill: {text}"
        );
        annotations.insert(k.clone(), text);
    }
    exp_labels.extend(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    json!({"exp_labels": exp_labels, "exp_annotations": annotations})
}

/// The evaluation time of recorded sample `index` (after [`BEFORE`]).
fn at(index: usize) -> String {
    format!("{}s", (BEFORE + index) as u64 * STEP)
}

fn none_at(index: usize) -> Vec<Value> {
    alerts()
        .iter()
        .map(|r| json!({"eval_time": at(index), "alertname": r["alert"], "exp_alerts": []}))
        .collect()
}

pub fn alerts_story(cp: &ControlPlane, serve: &mut ServeProcess, kubeconfig: &std::path::Path) {
    let ns = "monitoring";
    cp.namespace(ns);
    let promtool = cp.promtool.clone();
    // Every series the pack reads.
    let mut wanted = BTreeSet::new();
    for rule in alerts() {
        wanted.extend(metric_names(rule["expr"].as_str().unwrap()));
    }
    let mut read_by_dashboard = BTreeSet::new();
    for expr in dashboard_exprs() {
        read_by_dashboard.extend(metric_names(&expr));
    }
    let settings = super::yaml("deploy/serve/settings.yaml")[0]["data"]["settings.json"]
        .as_str()
        .unwrap()
        .to_string();
    // A watch rollout after another within the hour is held.
    serve.restart(kubeconfig, &serve_flags_with(&settings, "1h"));
    serve.wait_ready();
    webhook_answers(cp);
    let recorder = Recorder::start(cp, wanted.clone(), serve.ops);

    // 1. Quiet.
    recorder.wait(3);
    let quiet = recorder.mark() - 1;

    // 2. Unproven: labelled as ours, signed by no one.
    let mut forged = config_map("forged", json!({"k": "v"}));
    forged["metadata"]["labels"] = json!({"app.kubernetes.io/managed-by": "config-snapshot"});
    cp.apply(ns, &forged);
    eventually("the pass to find the forged snapshot", 60, || {
        (serve.metric("config_snapshot_unproven_snapshots") >= 1.0).then_some(())
    });
    recorder.wait(2);
    let unproven = recorder.mark() - 1;

    // 3. Held: a second rollout within the storm guard's hour.
    cp.apply(ns, &config_map("held-config", json!({"v": "1"})));
    let env = |name: &str| json!([{"configMapRef": {"name": name}}]);
    cp.apply(
        ns,
        &workload(
            "Deployment",
            "held",
            json!({"config-snapshot.io/watch": "held-config"}),
            "x:1",
            env("held-config"),
            5,
        ),
    );
    set_data(cp, ns, "held-config", json!({"v": "2"}));
    eventually("the first watch rollout", 60, || {
        (serve.metric("config_snapshot_watch_rollouts_total") >= 1.0).then_some(())
    });
    set_data(cp, ns, "held-config", json!({"v": "3"}));
    eventually("the storm guard to hold the second", 60, || {
        (serve.metric("config_snapshot_rollouts_held") >= 1.0).then_some(())
    });
    recorder.wait(3);
    let held = recorder.mark() - 1;

    // 4. Failing: kube-apiserver refuses serve's patch of `blocked`.
    let account = "system:serviceaccount:config-snapshot:config-snapshot";
    let policy = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "monitoring-refuses-serve"},
        "spec": {"failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                "resources": ["deployments"], "operations": ["UPDATE"]}]},
            "matchConditions": [{"name": "serve-on-blocked",
                "expression": format!("request.userInfo.username == '{account}' && request.name == 'blocked'")}],
            "validations": [{"expression": "false", "message": "the monitoring story refuses this patch"}]}});
    let binding = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "monitoring-refuses-serve"},
        "spec": {"policyName": "monitoring-refuses-serve", "validationActions": ["Deny"]}});
    for object in [&policy, &binding] {
        cp.try_kubectl(&["apply", "-f", "-"], Some(&object.to_string()))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    cp.apply(ns, &config_map("blocked-config", json!({"v": "1"})));
    cp.apply(
        ns,
        &workload(
            "Deployment",
            "blocked",
            json!({"config-snapshot.io/watch": "blocked-config"}),
            "x:1",
            env("blocked-config"),
            5,
        ),
    );
    // The policy is in force once kube-apiserver has loaded it.
    std::thread::sleep(Duration::from_secs(3));
    let failed_before =
        serve.metric("config_snapshot_deferred_effects_total{effect=\"patch_workload\",outcome=\"failed\"}");
    set_data(cp, ns, "blocked-config", json!({"v": "2"}));
    eventually("serve to give the refused rollout up", 120, || {
        (serve.metric("config_snapshot_deferred_effects_total{effect=\"patch_workload\",outcome=\"failed\"}")
            > failed_before)
            .then_some(())
    });
    recorder.wait(2);
    let failing = recorder.mark() - 1;

    // 5. serve gone: an opted-in Deployment goes through unreviewed.
    serve.stop();
    *recorder.serve.lock().unwrap() = None;
    cp.apply(ns, &config_map("late-config", json!({"v": "1"})));
    cp.apply(
        ns,
        &workload(
            "Deployment",
            "late",
            json!({"config-snapshot.io/snapshot": "*"}),
            "x:1",
            env("late-config"),
            5,
        ),
    );
    let late = cp.get(ns, "deployment", "late").unwrap();
    assert_eq!(
        late["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"], "late-config",
        "admitted unreviewed (failurePolicy: Ignore)"
    );
    recorder.wait(3);
    let gone = recorder.mark() - 1;
    let (samples, seen) = recorder.finish();
    // serve again, as shipped, for the stories after this one.
    serve.restart(kubeconfig, &serve_flags(&settings));
    serve.wait_ready();
    webhook_answers(cp);

    // Every series the pack reads exists, on serve or kube-apiserver.
    let missing: Vec<&String> = wanted
        .union(&read_by_dashboard)
        .filter(|n| !seen.contains(*n))
        .collect();
    assert!(
        missing.is_empty(),
        "the monitoring pack reads series nothing exposes: {missing:?}"
    );

    // The unit tests, over what was recorded.
    let webhook = "config-snapshot.config-snapshot.io";
    let minutes = |m: usize| m * 60 / STEP as usize;
    let tests = json!({
        "rule_files": ["alerts.yaml"],
        "evaluation_interval": format!("{STEP}s"),
        "tests": [
            {
                "name": "as recorded: quiet, then a rollout given up, then serve gone and a Deployment let through",
                "interval": format!("{STEP}s"),
                "input_series": input_series(&samples, samples.len(), 0, Then::Held),
                "alert_rule_test": none_at(quiet).into_iter().chain([
                    json!({"eval_time": at(failing), "alertname": "ConfigSnapshotEffectsFailing",
                        "exp_alerts": [expected("ConfigSnapshotEffectsFailing", &[("effect", "patch_workload")])]}),
                    json!({"eval_time": at(gone), "alertname": "ConfigSnapshotWebhookFailingOpen",
                        "exp_alerts": [expected("ConfigSnapshotWebhookFailingOpen", &[("name", webhook)])]}),
                ]).collect::<Vec<_>>(),
            },
            {
                "name": "the forged snapshot, recorded, then left in place for 16 minutes",
                "interval": format!("{STEP}s"),
                "input_series": input_series(&samples, unproven + 1, minutes(16), Then::Held),
                "alert_rule_test": [
                    {"eval_time": at(unproven + minutes(10)), "alertname": "ConfigSnapshotUnprovenSnapshots", "exp_alerts": []},
                    {"eval_time": at(unproven + minutes(16)), "alertname": "ConfigSnapshotUnprovenSnapshots",
                        "exp_alerts": [expected("ConfigSnapshotUnprovenSnapshots", &[])]},
                ],
            },
            {
                "name": "the held rollout, recorded, then held on for 21 minutes",
                "interval": format!("{STEP}s"),
                "input_series": input_series(&samples, held + 1, minutes(21), Then::Aging("config_snapshot_oldest_held_rollout_seconds")),
                "alert_rule_test": [
                    {"eval_time": at(held + minutes(10)), "alertname": "ConfigSnapshotRolloutHeldTooLong", "exp_alerts": []},
                    {"eval_time": at(held + minutes(21)), "alertname": "ConfigSnapshotRolloutHeldTooLong",
                        "exp_alerts": [expected("ConfigSnapshotRolloutHeldTooLong", &[])]},
                ],
            },
            {
                "name": "serve gone, recorded, then gone for 6 minutes",
                "interval": format!("{STEP}s"),
                "input_series": input_series(&samples, gone + 1, minutes(6), Then::Held),
                "alert_rule_test": [
                    {"eval_time": at(gone + minutes(6)), "alertname": "ConfigSnapshotNoLeader",
                        "exp_alerts": [expected("ConfigSnapshotNoLeader", &[])]},
                ],
            },
        ],
    });
    let dir = root().join("target/monitoring");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("alerts.yaml"), serde_yaml_ng::to_string(&rules()).unwrap()).unwrap();
    let header = format!(
        "# The alerts' unit tests over series recorded on a real control plane ({}) by\n\
         # host/tests/real_cluster/monitoring.rs, which says how each phase was caused.\n\
         # Run them with the rules as a file: extract the PrometheusRule's spec to\n\
         # alerts.yaml beside this file, then `promtool test rules alerts_test.yaml`.\n",
        super::bench::today()
    );
    let text = header + &serde_yaml_ng::to_string(&tests).unwrap();
    std::fs::write(dir.join("alerts_test.yaml"), &text).unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(&promtool)
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("promtool runs");
        let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "promtool {args:?}:\n{said}");
        said
    };
    eprintln!("{}", run(&["check", "rules", "alerts.yaml"]).trim());
    eprintln!("{}", run(&["test", "rules", "alerts_test.yaml"]).trim());
    if std::env::var("BENCH_WRITE_DOCS").is_ok_and(|v| v == "1") {
        std::fs::write(root().join("deploy/components/monitoring/alerts_test.yaml"), &text).unwrap();
    }
    // The committed recording still passes against the rules as they are.
    std::fs::copy(
        root().join("deploy/components/monitoring/alerts_test.yaml"),
        dir.join("committed_test.yaml"),
    )
    .unwrap();
    run(&["test", "rules", "committed_test.yaml"]);

    // Leave as found.
    for kind in ["validatingadmissionpolicybinding", "validatingadmissionpolicy"] {
        cp.kubectl(&["delete", kind, "monitoring-refuses-serve"]);
    }
    cp.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}
