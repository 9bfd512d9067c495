//! serve meets the real Kubernetes control plane: etcd, kube-apiserver and
//! kube-controller-manager built from their Go modules and run on loopback
//! (e2e-tests/cluster/control-plane.sh), serve registered from the shipped
//! webhook configuration and running with the shipped RBAC under its own
//! service account, and the user stories driven with the real `kubectl`.
//!
//! Without Go (and without binaries built before), the test says so and
//! skips; under `CI=true` it must run.
#![allow(clippy::too_many_lines, reason = "a test or benchmark is a story read top to bottom")]

mod support;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use config_snapshot::replay;
use config_snapshot::replay::invariants;
use config_snapshot::replay::scenario::{EffectiveConfig, Step};
use config_snapshot::replay::simulator::Admission;
use config_snapshot::replay::view::{Objects, View};
use config_snapshot_policy::model::kinds::WorkloadKind;
use serde_json::{json, Value};
use support::paths::root;
use support::process::ServeProcess;

/// Planted in a Secret; must never leave it.
const CANARY: &str = "canary-real-cluster-51c2-do-not-log";
const INTERVAL_SECS: u64 = 3;

struct ControlPlane {
    dir: PathBuf,
    kubeconfig: PathBuf,
    bin: PathBuf,
    /// The helm CLI, cached beside the binaries (control-plane.sh).
    helm: PathBuf,
    /// Argo Rollouts' controller, kubectl plugin and CRDs (not installed
    /// until the Rollout story installs them).
    argo: PathBuf,
    /// promtool, for the alerts (monitoring.rs).
    promtool: PathBuf,
    url: String,
    /// With `--node`: the local registry (HOST:PORT) and the images built
    /// for the node, by name.
    registry: Option<String>,
    images: std::collections::BTreeMap<String, String>,
}

fn script() -> PathBuf {
    root().join("e2e-tests/cluster/control-plane.sh")
}

impl ControlPlane {
    /// Starts a control plane, building its binaries first if needed.
    /// `None`: no way to, and not under CI.
    fn start(name: &str) -> Option<ControlPlane> {
        ControlPlane::start_with(name, &[])
    }

    /// [`ControlPlane::start`] with `up`'s extra arguments (`--node`). Its
    /// state is in a directory of its own, named for `name`: two control
    /// planes may run side by side in one test process.
    fn start_with(name: &str, extra: &[&str]) -> Option<ControlPlane> {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true");
        let go = Command::new("go")
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success());
        let built = Command::new(script())
            .arg("cached")
            .output()
            .is_ok_and(|o| o.status.success());
        if !go && !built {
            assert!(!ci, "CI=true: the real-cluster tests must run, and Go is not installed");
            eprintln!("SKIPPED: no Go toolchain to build the control plane (see e2e-tests/cluster/control-plane.sh)");
            return None;
        }
        let dir = std::env::temp_dir().join(format!("config-snapshot-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // Killed rather than unwound, this process still leaves nothing
        // running: control-plane.sh's reaper takes the cluster down.
        let status = Command::new(script())
            .arg("up")
            .arg(&dir)
            .args(extra)
            .env("CONTROL_PLANE_OWNER", std::process::id().to_string())
            .status()
            .expect("control-plane.sh runs");
        if !status.success() {
            let logs: String = [
                "etcd.log",
                "kube-apiserver.log",
                "kube-controller-manager.log",
                "containerd.log",
                "kubelet.log",
                "kube-proxy.log",
            ]
            .iter()
            .map(|f| format!("--- {f}\n{}", tail(&dir.join(f), 40)))
            .collect();
            let _ = Command::new(script()).arg("down").arg(&dir).status();
            panic!("the control plane did not start:\n{logs}");
        }
        let env = std::fs::read_to_string(dir.join("env")).unwrap();
        let optional = |name: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("export {name}=")))
                .map(|v| v.trim_matches('"').to_string())
        };
        let var = |name: &str| optional(name).unwrap();
        Some(ControlPlane {
            kubeconfig: PathBuf::from(var("KUBECONFIG")),
            bin: PathBuf::from(var("BIN")),
            helm: PathBuf::from(var("HELM")),
            argo: PathBuf::from(var("ARGO_ROLLOUTS")),
            promtool: PathBuf::from(var("PROMTOOL")),
            url: var("APISERVER"),
            registry: optional("REGISTRY"),
            images: optional("NODE_IMAGES")
                .unwrap_or_default()
                .split(',')
                .filter_map(|i| i.split_once('='))
                .map(|(name, reference)| (name.to_string(), reference.to_string()))
                .collect(),
            dir,
        })
    }

    /// Runs a verb of control-plane.sh on this control plane (the faults:
    /// `restart-apiserver`, `pause-etcd SECONDS`).
    fn control(&self, args: &[&str]) {
        let status = Command::new(script())
            .arg(args[0])
            .arg(&self.dir)
            .args(&args[1..])
            .status()
            .expect("control-plane.sh runs");
        assert!(status.success(), "control-plane.sh {args:?} failed");
    }

    /// Runs kubectl as the cluster admin; `Err` carries its output.
    fn try_kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
        self.kubectl_warned(args, stdin)
            .map(|(stdout, _)| stdout)
            .map_err(|e| format!("kubectl {args:?}: {e}"))
    }

    fn kubectl(&self, args: &[&str]) -> String {
        self.try_kubectl(args, None).unwrap_or_else(|e| panic!("{e}"))
    }

    fn apply(&self, ns: &str, object: &Value) -> String {
        self.try_kubectl(&["apply", "-n", ns, "-f", "-"], Some(&object.to_string()))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn namespace(&self, ns: &str) {
        self.kubectl(&["create", "namespace", ns]);
        // Wait for the default service account, or pods cannot be created.
        eventually(&format!("namespace {ns}"), 30, || {
            self.try_kubectl(&["-n", ns, "get", "serviceaccount", "default"], None)
                .ok()
        });
    }

    fn get(&self, ns: &str, kind: &str, name: &str) -> Option<Value> {
        let out = self
            .try_kubectl(&["-n", ns, "get", kind, name, "-o", "json"], None)
            .ok()?;
        serde_json::from_str(&out).ok()
    }

    /// Every object of the kinds config-snapshot touches, in `ns`.
    fn objects(&self, ns: &str) -> Objects {
        let kinds = |optional: bool| -> String {
            let names: Vec<String> = config_snapshot_policy::model::kinds::KINDS
                .iter()
                .filter(|k| optional || !k.optional)
                .map(|k| match k.group() {
                    "" => k.plural.to_string(),
                    group => format!("{}.{group}", k.plural),
                })
                .collect();
            names.join(",")
        };
        // A CRD's kind (Argo Rollouts) is listed once it is installed.
        let out = self
            .try_kubectl(&["-n", ns, "get", &kinds(true), "-o", "json"], None)
            .unwrap_or_else(|_| self.kubectl(&["-n", ns, "get", &kinds(false), "-o", "json"]));
        let list: Value = serde_json::from_str(&out).unwrap();
        Objects(list["items"].as_array().cloned().unwrap_or_default())
    }

    /// A kubeconfig for serve's service account, with a fresh token.
    fn serve_kubeconfig(&self) -> PathBuf {
        self.token_kubeconfig("config-snapshot", "config-snapshot")
    }

    /// A kubeconfig that acts as ServiceAccount `account` of `namespace`,
    /// with a token of its own, as a pod of that account would.
    fn token_kubeconfig(&self, namespace: &str, account: &str) -> PathBuf {
        let token = self.kubectl(&["-n", namespace, "create", "token", account, "--duration=2h"]);
        let path = self.dir.join(format!("{account}.kubeconfig"));
        let config = format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: e2e, cluster: {{server: \"{}\", certificate-authority: \"{}\"}}}}]\n\
             users: [{{name: serve, user: {{token: \"{}\"}}}}]\ncontexts: [{{name: e2e, context: {{cluster: e2e, user: serve}}}}]\ncurrent-context: e2e\n",
            self.url,
            self.dir.join("ca.crt").display(),
            token.trim()
        );
        std::fs::write(&path, config).unwrap();
        path
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = Command::new(script()).arg("down").arg(&self.dir).status();
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// [`eventually`], printing `state()` when it times out.
fn eventually_or<T>(what: &str, secs: u64, state: impl Fn() -> String, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {secs}s waiting for {what}:\n{}",
            state()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Polls `check` every 200 ms until it answers, for at most `secs`.
fn eventually<T>(what: &str, secs: u64, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {secs}s waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn yaml(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(root().join(path)).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// serve with the shipped RBAC, guards and settings (so every story runs
/// under the identity guard: a write of serve's the guard refused would
/// fail it), registered from the shipped webhook configuration with only
/// its clientConfig pointed at loopback.
fn start_serve(cp: &ControlPlane) -> (ServeProcess, PathBuf) {
    for object in yaml("deploy/serve/namespace.yaml")
        .into_iter()
        .chain(yaml("deploy/serve/rbac.yaml"))
        .chain(yaml("deploy/serve/keyguard.yaml"))
        .chain(yaml("deploy/serve/webhookguard.yaml"))
        .chain(yaml("deploy/serve/identityguard.yaml"))
        .chain(yaml("deploy/serve/settings.yaml"))
    {
        cp.apply("config-snapshot", &object);
    }
    let settings = yaml("deploy/serve/settings.yaml")[0]["data"]["settings.json"]
        .as_str()
        .unwrap()
        .to_string();
    let kubeconfig = cp.serve_kubeconfig();
    let mut serve = ServeProcess::start(&kubeconfig, &serve_flags(&settings));
    serve.wait_ready();
    register(cp, &serve, yaml("deploy/serve/webhook.yaml").remove(0));
    (serve, kubeconfig)
}

/// Registers `webhook` (a shipped MutatingWebhookConfiguration) with only
/// its clientConfig pointed at serve on loopback.
fn register(cp: &ControlPlane, serve: &ServeProcess, webhook: Value) {
    register_at(cp, serve.webhook, &serve.cert_pem, webhook);
}

/// The door's path (docs/security.md, "The door") of the serve that keeps
/// its key in the Secret of its namespace, as the cluster admin derives
/// it; `/mutate` before there is a key (serve then moves the configuration
/// to its path itself).
fn door_path(cp: &ControlPlane) -> String {
    door_paths(cp).get(1).cloned().unwrap_or_else(|| "/mutate".to_string())
}

/// The door's paths of the hour before, this hour and the next (each
/// opens the door now), for the current key of serve's Secret; none before
/// there is a key.
fn door_paths(cp: &ControlPlane) -> Vec<String> {
    let Some(secret) = cp.get("config-snapshot", "secret", "config-snapshot-signing-key") else {
        return Vec::new();
    };
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret["data"]["key"].as_str().unwrap())
        .unwrap();
    let ring = config_snapshot::cluster::proof::Keyring::of(&key).unwrap();
    let now = config_snapshot_policy::model::duration::unix_now();
    let hour = config_snapshot::serve::intake::door::PERIOD_SECS;
    [now - hour, now, now + hour]
        .iter()
        .map(|t| config_snapshot::serve::intake::door::path_of(&ring, *t).to_string())
        .collect()
}

/// [`register`] at `address`, trusting the certificates in `ca_pem`, at the
/// door's path: what serve itself would write into the configuration.
fn register_at(cp: &ControlPlane, address: std::net::SocketAddr, ca_pem: &str, mut webhook: Value) {
    webhook["metadata"].as_object_mut().unwrap().remove("annotations");
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let path = door_path(cp);
    for hook in webhook["webhooks"].as_array_mut().unwrap() {
        hook["clientConfig"] = json!({"url": format!("https://{address}{path}"), "caBundle": ca});
    }
    cp.try_kubectl(&["apply", "-f", "-"], Some(&webhook.to_string()))
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Waits until kube-apiserver calls the webhook as last registered: it
/// picks a configuration up asynchronously.
fn webhook_answers(cp: &ControlPlane) {
    if cp.try_kubectl(&["get", "namespace", "probe"], None).is_err() {
        cp.namespace("probe");
    }
    cp.apply("probe", &config_map("app", json!({"k": "v"})));
    eventually("the webhook to be called", 30, || {
        let d = workload(
            "Deployment",
            "probe",
            json!({"config-snapshot.io/snapshot": "*"}),
            "x:1",
            json!([{"configMapRef": {"name": "app"}}]),
            1,
        );
        cp.apply("probe", &d);
        let got = env_ref(&cp.get("probe", "deployment", "probe")?);
        cp.kubectl(&["-n", "probe", "delete", "deployment", "probe"]);
        (got != "app").then_some(())
    });
}

fn serve_flags(settings: &str) -> Vec<&'static str> {
    serve_flags_with(settings, "3s")
}

fn serve_flags_with(settings: &str, interval: &str) -> Vec<&'static str> {
    let settings: &'static str = Box::leak(settings.to_string().into_boxed_str());
    let interval: &'static str = Box::leak(interval.to_string().into_boxed_str());
    vec![
        "--settings-json",
        settings,
        "--watch-min-interval",
        interval,
        "--resync-interval",
        "5s",
        "--effect-wait",
        "10s",
        // As deployed: its own namespace (excluded from review), where it
        // keeps its signing key in a Secret it makes on first start, and
        // its webhook configuration on the door's path.
        "--namespace",
        "config-snapshot",
        "--signing-key-secret",
        "config-snapshot-signing-key",
        "--webhook-configuration",
        "config-snapshot",
    ]
}

fn config_map(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})
}

fn workload(kind: &str, name: &str, annotations: Value, image: &str, env_from: Value, history: u32) -> Value {
    let mut spec = json!({
        "revisionHistoryLimit": history,
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}},
                     "spec": {"containers": [{"name": "main", "image": image, "envFrom": env_from}]}},
    });
    if kind == "StatefulSet" {
        spec["serviceName"] = json!(name);
        spec["replicas"] = json!(1);
    }
    if kind == "Deployment" {
        spec["replicas"] = json!(1);
    }
    json!({"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "annotations": annotations}, "spec": spec})
}

fn env_ref(workload: &Value) -> String {
    workload["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn snapshots(view: &Objects) -> BTreeSet<String> {
    view.0
        .iter()
        .filter(|o| config_snapshot_policy::model::keys::is_snapshot(o))
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

fn count(view: &Objects, kind: &str) -> usize {
    view.0.iter().filter(|o| o["kind"] == kind).count()
}

fn effective(view: &Objects, kind: &str, name: &str, ns: &str, source: &str) -> Value {
    let ec = EffectiveConfig {
        kind: kind.into(),
        name: name.into(),
        namespace: ns.into(),
        source: source.into(),
        data: json!({}),
    };
    match replay::effective_config(view, &ec) {
        Ok((_, data)) => json!(data),
        Err(e) => json!(e.to_string()),
    }
}

fn no_dangling(view: &Objects, when: &str) {
    let broken = invariants::nothing_dangles(&view.objects());
    assert!(broken.is_empty(), "{when}: {broken:?}");
}

/// `kubectl patch configmap NAME --type merge` setting `data`: a user's
/// edit of a source.
/// An opted-in Deployment `name` reading ConfigMap `app`, applied with
/// kubectl: whether serve pinned it (one that is not was let through:
/// failurePolicy Ignore).
fn applied_pinned(cp: &ControlPlane, ns: &str, name: &str) -> bool {
    let d = workload(
        "Deployment",
        name,
        json!({"config-snapshot.io/snapshot": "*"}),
        "x:1",
        json!([{"configMapRef": {"name": "app"}}]),
        1,
    );
    cp.apply(ns, &d);
    cp.get(ns, "deployment", name)
        .is_some_and(|made| env_ref(&made).starts_with("app-"))
}

fn set_data(cp: &ControlPlane, ns: &str, name: &str, data: Value) {
    let patch = json!({ "data": data }).to_string();
    cp.kubectl(&["-n", ns, "patch", "configmap", name, "--type", "merge", "-p", &patch]);
}

/// Edits ConfigMap `app` to `mode: green` and waits for the watch to roll
/// Deployment `web` off the snapshot `from`; the snapshot it rolled to.
fn edit_and_roll(cp: &ControlPlane, ns: &str, from: &str) -> String {
    set_data(cp, ns, "app", json!({"mode": "green"}));
    eventually("the watch rollout", 30, || {
        let name = env_ref(&cp.get(ns, "deployment", "web")?);
        (name != from).then_some(name)
    })
}

/// The KEP story on the Deployment controller: snapshots owned by the real
/// ReplicaSets, a watch rollout (once), `rollout undo` with no new snapshot,
/// pruning past revisionHistoryLimit, server-side dry run.
fn deployment_story(cp: &ControlPlane) {
    let ns = "story-deployment";
    cp.namespace(ns);
    cp.apply(ns, &config_map("app", json!({"mode": "blue"})));
    let annotations = json!({"config-snapshot.io/watch": "app"});
    let env = json!([{"configMapRef": {"name": "app"}}]);
    cp.apply(
        ns,
        &workload("Deployment", "web", annotations.clone(), "nginx:1", env.clone(), 2),
    );
    let web = cp.get(ns, "deployment", "web").unwrap();
    let blue = env_ref(&web);
    assert!(
        blue.starts_with("app-") && blue.len() == 14,
        "the Deployment was admitted with a snapshot: {web}"
    );
    // The ReplicaSet the real controller made owns the snapshot.
    eventually("adoption by the ReplicaSet", 30, || {
        let snap = cp.get(ns, "configmap", &blue)?;
        let owners = snap["metadata"]["ownerReferences"].as_array()?;
        owners.iter().any(|o| o["kind"] == "ReplicaSet").then_some(())
    });
    let view = cp.objects(ns);
    assert_eq!(
        effective(&view, "Deployment", "web", ns, "configmap/app"),
        json!({"mode": "blue"})
    );

    // A source edit rolls out a new ReplicaSet, once.
    let green = edit_and_roll(cp, ns, &blue);
    assert!(green.starts_with("app-"), "{green}");
    std::thread::sleep(Duration::from_secs(2 * INTERVAL_SECS + 6));
    let view = cp.objects(ns);
    assert_eq!(count(&view, "ReplicaSet"), 2, "one rollout, not more");
    assert_eq!(
        effective(&view, "Deployment", "web", ns, "configmap/app"),
        json!({"mode": "green"})
    );

    // `kubectl rollout undo` brings back the old snapshot and makes none.
    let before = snapshots(&view);
    cp.kubectl(&["-n", ns, "rollout", "undo", "deployment/web"]);
    eventually("the rollback", 30, || {
        (env_ref(&cp.get(ns, "deployment", "web")?) == blue).then_some(())
    });
    // Longer than the storm guard and a resync: nothing rolls it forward.
    std::thread::sleep(Duration::from_secs(INTERVAL_SECS + 8));
    let view = cp.objects(ns);
    assert_eq!(
        effective(&view, "Deployment", "web", ns, "configmap/app"),
        json!({"mode": "blue"})
    );
    assert_eq!(snapshots(&view), before, "a rollback makes no snapshot");
    assert_eq!(
        count(&view, "ReplicaSet"),
        2,
        "revision 1's ReplicaSet is current again"
    );
    let history = cp.kubectl(&["-n", ns, "rollout", "history", "deployment/web"]);
    assert!(history.contains('3'), "rollout history shows revision 3: {history}");
    let web = cp.get(ns, "deployment", "web").unwrap();
    assert!(
        web["metadata"]["annotations"]["config-snapshot.io/rollback"].is_string(),
        "the rollback is recorded: {}",
        web["metadata"]["annotations"]
    );

    // Server-side dry run: the same answer, nothing written.
    let view = cp.objects(ns);
    let mut preview = workload("Deployment", "preview", annotations.clone(), "nginx:9", env.clone(), 2);
    preview["metadata"]["namespace"] = json!(ns);
    let printed = cp
        .try_kubectl(
            &["apply", "-n", ns, "--dry-run=server", "-o", "json", "-f", "-"],
            Some(&preview.to_string()),
        )
        .unwrap();
    let printed: Value = serde_json::from_str(&printed).unwrap();
    assert!(
        env_ref(&printed).starts_with("app-"),
        "the dry run shows the mutation: {printed}"
    );
    std::thread::sleep(Duration::from_secs(2));
    let after = cp.objects(ns);
    assert_eq!(snapshots(&after), snapshots(&view), "a dry run created a snapshot");
    assert!(cp.get(ns, "deployment", "preview").is_none());

    // Past revisionHistoryLimit (2) the controller deletes old ReplicaSets
    // and the garbage collector the snapshots no revision uses. Without a
    // kubelet no pod becomes ready and a rolling update never completes, so
    // the controller keeps old ReplicaSets up; scaled to 0, each update
    // completes at once and the old ones are pruned.
    cp.kubectl(&["-n", ns, "scale", "deployment/web", "--replicas=0"]);
    for (i, mode) in ["red", "yellow", "purple"].iter().enumerate() {
        cp.kubectl(&[
            "-n",
            ns,
            "patch",
            "configmap",
            "app",
            "--type",
            "merge",
            "-p",
            &format!(r#"{{"data":{{"mode":"{mode}"}}}}"#),
        ]);
        eventually("a rollout", 30, || {
            let view = cp.objects(ns);
            (effective(&view, "Deployment", "web", ns, "configmap/app") == json!({"mode": mode})).then_some(())
        });
        std::thread::sleep(Duration::from_secs(INTERVAL_SECS + 1 + i as u64));
    }
    let view = eventually_or(
        "pruning and garbage collection",
        60,
        || cp.kubectl(&["-n", ns, "get", "rs,cm", "-o", "wide"]),
        || {
            let view = cp.objects(ns);
            let used: BTreeSet<String> = view
                .0
                .iter()
                .filter(|o| matches!(o["kind"].as_str(), Some("ReplicaSet" | "Deployment" | "Pod")))
                .flat_map(|o| {
                    let t = if o["kind"] == "Pod" {
                        o.clone()
                    } else {
                        o["spec"]["template"].clone()
                    };
                    config_snapshot_policy::model::references::collect(&t)
                        .into_iter()
                        .map(|r| r.name)
                })
                .collect();
            let kept = snapshots(&view);
            (count(&view, "ReplicaSet") <= 3 && kept.iter().all(|s| used.contains(s))).then_some(view)
        },
    );
    no_dangling(&view, "after pruning");
}

/// `kubectl rollout undo` to a revision from before the Deployment opted
/// in puts back that ReplicaSet's annotations: the opt-in goes, and so would
/// the record of the last watch rollout, which the storm guard counts from.
/// serve keeps the record (docs/design.md, "Deferred effects").
fn undo_to_before_opt_in_story(cp: &ControlPlane) {
    let ns = "story-undo-opt-in";
    cp.namespace(ns);
    cp.apply(ns, &config_map("app", json!({"mode": "blue"})));
    let env = json!([{"configMapRef": {"name": "app"}}]);
    cp.apply(ns, &workload("Deployment", "web", json!({}), "nginx:1", env.clone(), 5));
    assert_eq!(
        env_ref(&cp.get(ns, "deployment", "web").unwrap()),
        "app",
        "not opted in"
    );
    let watching = json!({"config-snapshot.io/watch": "app"});
    cp.apply(ns, &workload("Deployment", "web", watching, "nginx:2", env, 5));
    let blue = env_ref(&cp.get(ns, "deployment", "web").unwrap());
    assert!(blue.starts_with("app-"), "{blue}");
    edit_and_roll(cp, ns, &blue);
    let record = |web: &Value| web["metadata"]["annotations"]["config-snapshot.io/watch-rollout"].clone();
    let recorded = record(&cp.get(ns, "deployment", "web").unwrap());
    assert!(recorded.is_string(), "the rollout is recorded");

    cp.kubectl(&["-n", ns, "rollout", "undo", "deployment/web", "--to-revision=1"]);
    let web = eventually("the undo to revision 1", 30, || {
        let web = cp.get(ns, "deployment", "web")?;
        (web["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1").then_some(web)
    });
    let annotations = &web["metadata"]["annotations"];
    assert!(
        annotations["config-snapshot.io/watch"].is_null(),
        "kubectl put back revision 1's annotations: {annotations}"
    );
    assert_eq!(
        record(&web),
        recorded,
        "the storm guard's record is kept: {annotations}"
    );
}

/// StatefulSet and DaemonSet: the same through ControllerRevisions.
fn revision_story(cp: &ControlPlane, kind: &str) {
    let ns = &format!("story-{}", kind.to_lowercase());
    cp.namespace(ns);
    cp.apply(ns, &config_map("app", json!({"mode": "blue"})));
    let env = json!([{"configMapRef": {"name": "app"}}]);
    cp.apply(
        ns,
        &workload(kind, "db", json!({"config-snapshot.io/watch": "app"}), "db:1", env, 10),
    );
    let resource = kind.to_lowercase();
    let blue = env_ref(&cp.get(ns, &resource, "db").unwrap());
    assert!(blue.starts_with("app-"), "{kind} admitted with a snapshot");
    eventually("adoption by the ControllerRevision", 30, || {
        let snap = cp.get(ns, "configmap", &blue)?;
        let owners = snap["metadata"]["ownerReferences"].as_array()?;
        owners.iter().any(|o| o["kind"] == "ControllerRevision").then_some(())
    });
    cp.kubectl(&[
        "-n",
        ns,
        "patch",
        "configmap",
        "app",
        "--type",
        "merge",
        "-p",
        r#"{"data":{"mode":"green"}}"#,
    ]);
    eventually("the watch rollout", 30, || {
        let view = cp.objects(ns);
        (effective(&view, kind, "db", ns, "configmap/app") == json!({"mode": "green"})).then_some(())
    });
    let before = snapshots(&cp.objects(ns));
    cp.kubectl(&["-n", ns, "rollout", "undo", &format!("{resource}/db")]);
    eventually("the rollback", 30, || {
        let view = cp.objects(ns);
        (effective(&view, kind, "db", ns, "configmap/app") == json!({"mode": "blue"})).then_some(())
    });
    std::thread::sleep(Duration::from_secs(INTERVAL_SECS + 8));
    let view = cp.objects(ns);
    assert_eq!(
        effective(&view, kind, "db", ns, "configmap/app"),
        json!({"mode": "blue"}),
        "{kind}: rolled forward again"
    );
    assert_eq!(snapshots(&view), before, "{kind}: a rollback makes no snapshot");
    assert_eq!(
        count(&view, "ControllerRevision"),
        2,
        "{kind}: revision 1 is current again"
    );
    no_dangling(&view, kind);
}

/// A Secret's value never reaches serve's log, an Event, or a message.
fn secret_story(cp: &ControlPlane, serve: &ServeProcess) {
    let ns = "story-secret";
    cp.namespace(ns);
    let secret =
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"}, "stringData": {"token": CANARY}});
    cp.apply(ns, &secret);
    let env = json!([{"secretRef": {"name": "creds"}}]);
    cp.apply(
        ns,
        &workload(
            "Deployment",
            "api",
            json!({"config-snapshot.io/watch": "secret/creds"}),
            "api:1",
            env,
            10,
        ),
    );
    let mut edited = secret.clone();
    edited["stringData"]["token"] = json!(format!("{CANARY}-2"));
    cp.apply(ns, &edited);
    eventually("the Secret's watch rollout", 30, || {
        let view = cp.objects(ns);
        (count(&view, "ReplicaSet") == 2).then_some(())
    });
    let events = cp.kubectl(&["get", "events", "-A", "-o", "json"]);
    let logs = serve.logs();
    let b64 = base64::engine::general_purpose::STANDARD.encode(CANARY);
    for (what, text) in [("serve's log", &logs), ("the Events", &events)] {
        for needle in [CANARY, b64.as_str(), &b64[..16]] {
            assert!(!text.contains(needle), "the Secret's value ({needle}) is in {what}");
        }
    }
    assert!(logs.contains("creds"), "the log does mention the Secret by name");
}

/// serve stopped, with the shipped failurePolicy (Ignore): deploys go on
/// unmutated, nothing dangles; once serve is back, its resync rolls the
/// watchers out.
fn outage_story(cp: &ControlPlane, serve: &mut ServeProcess, kubeconfig: &Path) {
    let ns = "story-outage";
    cp.namespace(ns);
    cp.apply(ns, &config_map("app", json!({"mode": "blue"})));
    let env = json!([{"configMapRef": {"name": "app"}}]);
    cp.apply(
        ns,
        &workload(
            "Deployment",
            "web",
            json!({"config-snapshot.io/watch": "app"}),
            "nginx:1",
            env.clone(),
            10,
        ),
    );
    let blue = env_ref(&cp.get(ns, "deployment", "web").unwrap());
    // A workload a GitOps tool keeps in sync: applied as in git, pinned.
    let synced = |image: &str| {
        workload(
            "Deployment",
            "synced",
            json!({"config-snapshot.io/watch": "app"}),
            image,
            json!([{"configMapRef": {"name": "app"}}]),
            10,
        )
    };
    cp.apply(ns, &synced("nginx:1"));
    let replica_sets = |name: &str| {
        cp.objects(ns)
            .0
            .iter()
            .filter(|o| o["kind"] == "ReplicaSet" && o["metadata"]["ownerReferences"][0]["name"] == name)
            .count()
    };
    assert_eq!(replica_sets("synced"), 1);
    serve.stop();
    cp.kubectl(&[
        "-n",
        ns,
        "patch",
        "configmap",
        "app",
        "--type",
        "merge",
        "-p",
        r#"{"data":{"mode":"green"}}"#,
    ]);
    cp.apply(
        ns,
        &workload(
            "Deployment",
            "late",
            json!({"config-snapshot.io/watch": "app"}),
            "nginx:1",
            env,
            10,
        ),
    );
    let late = cp.get(ns, "deployment", "late").unwrap();
    assert_eq!(
        env_ref(&late),
        "app",
        "admitted unmutated while serve is down (failurePolicy Ignore)"
    );
    // git moves on to a new image meanwhile: the sync rolls it, unpinned.
    cp.apply(ns, &synced("nginx:2"));
    assert_eq!(env_ref(&cp.get(ns, "deployment", "synced").unwrap()), "app");
    eventually("the synced rollout", 30, || (replica_sets("synced") == 2).then_some(()));
    std::thread::sleep(Duration::from_secs(3));
    let view = cp.objects(ns);
    assert_eq!(
        env_ref(&cp.get(ns, "deployment", "web").unwrap()),
        blue,
        "no rollout while serve is down"
    );
    no_dangling(&view, "during the outage");
    serve.restart(kubeconfig, &serve_flags("{}"));
    serve.wait_ready();
    eventually("the resync after the outage", 60, || {
        let view = cp.objects(ns);
        let green = json!({"mode": "green"});
        (effective(&view, "Deployment", "web", ns, "configmap/app") == green
            && effective(&view, "Deployment", "late", ns, "configmap/app") == green
            && env_ref(&cp.get(ns, "deployment", "late")?).starts_with("app-"))
        .then_some(())
    });
    // serve pins what was written meanwhile: the synced workload rolls
    // once more, to the same image and config. A self-heal that applies
    // git's manifest again (its template names `app`, the live one the
    // snapshot) is pinned to that same snapshot: nothing rolls again.
    eventually("the synced workload pinned", 60, || {
        env_ref(&cp.get(ns, "deployment", "synced")?)
            .starts_with("app-")
            .then_some(())
    });
    let pinned = cp.get(ns, "deployment", "synced").unwrap()["spec"]["template"].clone();
    eventually("the pinned rollout", 30, || (replica_sets("synced") == 3).then_some(()));
    cp.apply(ns, &synced("nginx:2"));
    std::thread::sleep(Duration::from_secs(2 * INTERVAL_SECS + 2));
    assert_eq!(cp.get(ns, "deployment", "synced").unwrap()["spec"]["template"], pinned);
    assert_eq!(replica_sets("synced"), 3, "a self-heal after the outage rolls nothing");
    no_dangling(&cp.objects(ns), "after the outage");
}

/// A stand-in for the kubelet's one duty the control plane alone needs:
/// pods become Ready, so rolling updates complete and the Deployment
/// controller scales old ReplicaSets down and prunes them, as it would on
/// real nodes (and as replay's controller does at once). It runs nothing:
/// what containers read, and Jobs running to completion, are proven on the
/// real node (`pods_on_a_real_node`). A Job's pods stay Pending here.
/// Stops the kubelet stand-in when dropped: at the story's end, and on a
/// panic's unwinding, so that it never outlives its control plane (the next
/// one, the node's, reuses its directory and kubeconfig).
struct KubeletStandIn(Arc<AtomicBool>);

impl KubeletStandIn {
    fn store(&self, stop: bool, order: Ordering) {
        self.0.store(stop, order);
    }
}

impl Drop for KubeletStandIn {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn start_kubelet_stand_in(cp: &ControlPlane) -> KubeletStandIn {
    let stop = Arc::new(AtomicBool::new(false));
    let (kubectl, kubeconfig, flag) = (cp.bin.join("kubectl"), cp.kubeconfig.clone(), stop.clone());
    std::thread::spawn(move || {
        let run = |args: &[&str]| {
            Command::new(&kubectl)
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(args)
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        };
        while !flag.load(Ordering::SeqCst) {
            if let Some(out) = run(&["get", "pods", "-A", "-o", "json"]) {
                let pods: Value = serde_json::from_str(&out).unwrap_or_default();
                for pod in pods["items"].as_array().into_iter().flatten() {
                    let ready = pod["status"]["conditions"]
                        .as_array()
                        .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
                    let of_a_job = pod["metadata"]["ownerReferences"]
                        .as_array()
                        .is_some_and(|refs| refs.iter().any(|r| r["kind"] == "Job"));
                    if ready || of_a_job || pod["metadata"]["deletionTimestamp"].is_string() {
                        continue;
                    }
                    let (ns, name) = (
                        pod["metadata"]["namespace"].as_str().unwrap_or_default(),
                        pod["metadata"]["name"].as_str().unwrap_or_default(),
                    );
                    let now = "2026-01-01T00:00:00Z";
                    let status = json!({"status": {"phase": "Running", "conditions": [
                        {"type": "Ready", "status": "True", "lastTransitionTime": now},
                        {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                    ]}});
                    let _ = run(&[
                        "-n",
                        ns,
                        "patch",
                        "pod",
                        name,
                        "--subresource=status",
                        "--type=merge",
                        "-p",
                        &status.to_string(),
                    ]);
                }
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    KubeletStandIn(stop)
}

/// Waits until nothing in `ns` changes for a while: serve's deferred
/// effects and the controllers have done what this step set off.
fn settle(cp: &ControlPlane, ns: &str) {
    let versions = || -> Vec<String> {
        let mut v: Vec<String> = cp
            .objects(ns)
            .0
            .iter()
            .map(|o| {
                format!(
                    "{}/{}@{}",
                    o["kind"], o["metadata"]["name"], o["metadata"]["resourceVersion"]
                )
            })
            .collect();
        v.sort();
        v
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = versions();
    let mut calm = Instant::now();
    while calm.elapsed() < Duration::from_millis(2500) {
        std::thread::sleep(Duration::from_millis(300));
        let now = versions();
        if now != last {
            last = now;
            calm = Instant::now();
        }
        assert!(Instant::now() < deadline, "{ns} never settled");
    }
}

/// Objects as the scenario's checks name them: in `default`.
fn as_default(view: Objects) -> Objects {
    let renamed = default_names(&view);
    Objects(
        view.0
            .into_iter()
            .map(|mut o| {
                o["metadata"]["namespace"] = json!("default");
                if renamed.is_empty() {
                    return o;
                }
                let mut text = o.to_string();
                for (here, there) in &renamed {
                    text = text.replace(here.as_str(), there);
                }
                serde_json::from_str(&text).unwrap()
            })
            .collect(),
    )
}

/// A snapshot's name is keyed per namespace (docs/hash-spec.md): the name
/// each snapshot of `view`, and each snapshot a live source's content (of
/// any of its keys) would get, has here → the name it has in `default`,
/// where replay runs the scenario and its checks name them. Both names are
/// replay's key's, which serve is given for the scenarios.
fn default_names(view: &Objects) -> Vec<(String, String)> {
    use config_snapshot::cluster::proof::Prover;
    use config_snapshot_policy::model::content::Content;
    use config_snapshot_policy::model::keys;
    use config_snapshot_policy::model::source::SourceKind;
    let prover = Prover::replay();
    let mut renamed = std::collections::BTreeMap::new();
    for o in &view.0 {
        let Some(kind) = o["kind"].as_str().and_then(SourceKind::from_kind) else {
            continue;
        };
        let Some(ns) = o["metadata"]["namespace"].as_str() else {
            continue;
        };
        let Ok(content) = Content::from_object(kind, o) else {
            continue;
        };
        if keys::is_snapshot(o) {
            let Some(source) = keys::snapshot_source(o) else {
                continue;
            };
            renamed.insert(
                o["metadata"]["name"].as_str().unwrap_or_default().to_string(),
                prover.snapshot_name("default", source, &content),
            );
            continue;
        }
        let source = o["metadata"]["name"].as_str().unwrap_or_default();
        let names: Vec<String> = content.data.keys().chain(content.binary_data.keys()).cloned().collect();
        if names.len() > 8 {
            continue;
        }
        for mask in 0..(1u32 << names.len()) {
            let subset: std::collections::BTreeSet<String> = names
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, k)| k.clone())
                .collect();
            let part = content.subset(Some(&subset));
            renamed.insert(
                prover.snapshot_name(ns, source, &part),
                prover.snapshot_name("default", source, &part),
            );
        }
    }
    renamed.into_iter().filter(|(here, there)| here != there).collect()
}

/// Runs one write through kubectl, as the admission outcome a scenario's
/// `expect` judges.
fn admission(result: Result<(String, String), String>) -> Admission {
    match result {
        Ok((_, stderr)) => Admission {
            allowed: true,
            warnings: stderr
                .lines()
                .filter_map(|l| l.strip_prefix("Warning: "))
                .map(str::to_string)
                .collect(),
            ..Default::default()
        },
        Err(e) => Admission {
            allowed: false,
            message: Some(e),
            ..Default::default()
        },
    }
}

impl ControlPlane {
    /// kubectl with its stderr (warnings) on success.
    fn kubectl_warned(&self, args: &[&str], stdin: Option<&str>) -> Result<(String, String), String> {
        let mut child = Command::new(self.bin.join("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl runs");
        if let Some(input) = stdin {
            child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        );
        if out.status.success() {
            Ok((stdout, stderr))
        } else {
            Err(format!("{stderr}{stdout}"))
        }
    }
}

/// Runs a scenario's steps with kubectl in namespace `ns`; returns the
/// failed checks and the objects left (as in `default`).
/// `flags` with replay's public key instead of the key Secret: the
/// scenarios pin Secret snapshots' names under that key, so serve names
/// and signs with it for them.
fn with_replay_key(mut flags: Vec<&'static str>) -> Vec<&'static str> {
    let key = std::env::temp_dir().join(format!("cs-replay-key-{}", std::process::id()));
    std::fs::write(&key, config_snapshot::cluster::proof::Prover::REPLAY_KEY).unwrap();
    let key: &'static str = Box::leak(key.display().to_string().into_boxed_str());
    let at = flags.iter().position(|f| *f == "--signing-key-secret").unwrap();
    flags.drain(at..at + 2);
    flags.extend(["--signing-key-file", key]);
    flags
}

fn run_on_cluster(
    cp: &ControlPlane,
    serve: &mut ServeProcess,
    kubeconfig: &Path,
    path: &Path,
    ns: &str,
) -> (Vec<String>, Objects) {
    let scenario = replay::load(path).unwrap();
    cp.namespace(ns);
    // A scenario's objects predate the policy. With the shipped
    // failurePolicy (Ignore), objects created while serve is down are
    // exactly that.
    let predating = scenario
        .objects
        .iter()
        .any(|o| WorkloadKind::from_kind(o["kind"].as_str().unwrap_or_default()).is_some());
    // serve runs with the scenario's settings and storm guard.
    let settings = if scenario.settings.is_null() {
        json!({})
    } else {
        scenario.settings.clone()
    };
    let flags = with_replay_key(serve_flags_with(
        &settings.to_string(),
        scenario.watch_min_interval.as_deref().unwrap_or("30s"),
    ));
    if predating {
        serve.stop();
    } else {
        serve.restart(kubeconfig, &flags);
        serve.wait_ready();
    }
    for object in &scenario.objects {
        let mut o = object.clone();
        o["metadata"].as_object_mut().unwrap().remove("namespace");
        cp.apply(ns, &o);
    }
    if predating {
        settle(cp, ns);
        serve.restart(kubeconfig, &flags);
        serve.wait_ready();
    }
    settle(cp, ns);
    let mut failures = Vec::new();
    let mut last: Option<Admission> = None;
    let steps: Vec<Step> = scenario.steps.clone();
    let mut queue: std::collections::VecDeque<(usize, Step)> =
        steps.into_iter().enumerate().map(|(i, s)| (i + 1, s)).collect();
    while let Some((index, step)) = queue.pop_front() {
        let kind = |k: &str| k.to_lowercase();
        match &step {
            Step::Apply(o) | Step::DryRunApply(o) => {
                let mut o = o.clone();
                o["metadata"].as_object_mut().unwrap().remove("namespace");
                let mut args = vec!["apply", "-n", ns, "-f", "-"];
                if matches!(step, Step::DryRunApply(_)) {
                    args.push("--dry-run=server");
                }
                last = Some(admission(cp.kubectl_warned(&args, Some(&o.to_string()))));
            }
            Step::Edit(e) => {
                let set = e.set.to_string();
                last = Some(admission(cp.kubectl_warned(
                    &[
                        "-n",
                        ns,
                        "patch",
                        &kind(&e.kind),
                        &e.name,
                        "--type",
                        "merge",
                        "-p",
                        &set,
                    ],
                    None,
                )));
            }
            Step::Delete(d) => {
                match (&d.name, &d.selector) {
                    (Some(name), _) => cp.kubectl(&["-n", ns, "delete", &kind(&d.kind), name]),
                    (None, selector) => cp.kubectl(&[
                        "-n",
                        ns,
                        "delete",
                        &kind(&d.kind),
                        "-l",
                        selector.as_deref().unwrap_or(""),
                    ]),
                };
                last = None;
            }
            Step::RolloutUndo(u) => {
                let target = format!("{}/{}", kind(&u.kind), u.name);
                let mut args = vec!["-n", ns, "rollout", "undo", target.as_str()];
                let to = u.to_revision.map(|n| format!("--to-revision={n}"));
                if let Some(to) = &to {
                    args.push(to);
                }
                last = Some(admission(cp.kubectl_warned(&args, None)));
            }
            Step::RolloutRestart(r) => {
                let target = format!("{}/{}", kind(&r.kind), r.name);
                last = Some(admission(
                    cp.kubectl_warned(&["-n", ns, "rollout", "restart", &target], None),
                ));
            }
            Step::CreateJob(j) => {
                let from = format!("--from=cronjob/{}", j.from);
                last = Some(admission(
                    cp.kubectl_warned(&["-n", ns, "create", "job", &j.name, &from], None),
                ));
            }
            Step::Repeat(r) => {
                let mut expanded = Vec::new();
                for i in 1..=r.times {
                    for raw in &r.steps {
                        let text = raw.to_string().replace("{{i}}", &i.to_string());
                        expanded.push((index, serde_json::from_str::<Step>(&text).unwrap()));
                    }
                }
                for s in expanded.into_iter().rev() {
                    queue.push_front(s);
                }
                continue;
            }
            Step::Expect(e) => {
                let mut checks = Vec::new();
                replay::expect(last.as_ref(), e, &mut checks);
                failures.extend(
                    checks
                        .into_iter()
                        .filter(|c| !c.ok)
                        .map(|c| format!("step {index}: {}: {}", c.check, c.detail)),
                );
                continue;
            }
            Step::Assert(list) => {
                settle(cp, ns);
                let view = as_default(cp.objects(ns));
                for check in list {
                    let c = replay::assert(&view, check);
                    if !c.ok {
                        failures.push(format!("step {index}: {}: {}", c.check, c.detail));
                    }
                }
                continue;
            }
            other => panic!("{}: step {index} cannot run on a cluster: {other:?}", path.display()),
        }
        settle(cp, ns);
    }
    (failures, as_default(cp.objects(ns)))
}

/// What a user compares between two clusters: each workload's references,
/// the snapshots there are, and what each revision runs (by number; a
/// CronJob's Jobs, which have none, by name).
fn outcome(view: &Objects) -> Value {
    // A Secret snapshot's name is keyed per namespace (docs/hash-spec.md):
    // the scenario runs in a namespace of its own here and in `default`
    // under replay, so a Secret snapshot stands for its source and content.
    let secret_snapshots: std::collections::HashMap<String, String> = view
        .0
        .iter()
        .filter(|o| o["kind"] == "Secret" && config_snapshot_policy::model::keys::is_snapshot(o))
        .map(|o| {
            let content = config_snapshot_policy::model::content::Content::from_object(
                config_snapshot_policy::model::source::SourceKind::Secret,
                o,
            )
            .map(|c| c.hash()[..10].to_string())
            .unwrap_or_default();
            let source = config_snapshot_policy::model::keys::snapshot_source(o).unwrap_or_default();
            (
                o["metadata"]["name"].as_str().unwrap().to_string(),
                format!("{source}@{content}"),
            )
        })
        .collect();
    let alias = |name: String| secret_snapshots.get(&name).cloned().unwrap_or(name);
    let mut out = serde_json::Map::new();
    for w in &view.0 {
        let Some(kind) = WorkloadKind::from_kind(w["kind"].as_str().unwrap_or_default()) else {
            continue;
        };
        let name = format!("{}/{}", kind.kind(), w["metadata"]["name"].as_str().unwrap());
        let names = |template: Option<&Value>| -> Vec<String> {
            template
                .map(|t| {
                    config_snapshot_policy::model::references::collect(t)
                        .into_iter()
                        .map(|r| alias(r.name))
                        .collect()
                })
                .unwrap_or_default()
        };
        let refs = names(w.pointer(kind.template()));
        let uid = &w["metadata"]["uid"];
        let revisions = kind.revisions();
        let mut kept: Vec<(Value, Vec<String>)> = view
            .0
            .iter()
            .filter(|o| o["kind"] == revisions.kind)
            .filter(|o| {
                o["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|r| r["uid"] == *uid))
            })
            .map(|r| {
                let number = match revisions.kind {
                    "ReplicaSet" => json!(r["metadata"]["annotations"]["deployment.kubernetes.io/revision"]
                        .as_str()
                        .and_then(|n| n.parse::<i64>().ok())),
                    "ControllerRevision" => r["revision"].clone(),
                    _ => r["metadata"]["name"].clone(),
                };
                (number, names(revisions.template_of(r)))
            })
            .collect();
        kept.sort_by(|(a, _), (b, _)| (a.as_i64(), a.as_str()).cmp(&(b.as_i64(), b.as_str())));
        out.insert(name, json!({"references": refs, "revisions": kept}));
    }
    let snapshots: BTreeSet<String> = snapshots(view).into_iter().map(alias).collect();
    out.insert("snapshots".into(), json!(snapshots));
    Value::Object(out)
}

/// The e2e scenarios that need no clock jump and reach into nothing but
/// the API, run on the control plane and under replay: each scenario's
/// assertions hold on both, and the outcomes agree.
fn scenarios_agree_with_replay(cp: &ControlPlane, serve: &mut ServeProcess, kubeconfig: &Path) {
    let engine = Arc::new(config_snapshot::kubewarden::engine::Engine::load(&support::paths::policy()).unwrap());
    let mut compared = Vec::new();
    let mut scenarios = support::paths::scenario_files();
    // REAL_CLUSTER_SCENARIOS=controller- runs only the scenarios whose file
    // name contains it (while working on one).
    let only = std::env::var("REAL_CLUSTER_SCENARIOS").ok();
    let everything = only.is_none();
    scenarios.retain(|p| only.as_deref().is_none_or(|o| p.to_string_lossy().contains(o)));
    for path in scenarios {
        let scenario = replay::load(&path).unwrap();
        let runnable = scenario.steps.iter().all(|s| match s {
            Step::AdvanceTime(_) | Step::Fault(_) | Step::Together(_) | Step::Review(_) => false,
            Step::Repeat(r) => r.steps.iter().all(|v| {
                ["edit", "apply", "expect", "assert"]
                    .iter()
                    .any(|k| v.get(*k).is_some())
            }),
            _ => true,
        });
        if !runnable {
            continue;
        }
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        let ns = format!("scenario-{stem}");
        let (failures, real) = run_on_cluster(cp, serve, kubeconfig, &path, &ns);
        assert!(
            failures.is_empty(),
            "{stem} on the control plane:\n{}",
            failures.join("\n")
        );
        let mut session =
            replay::Session::new(engine.clone(), &scenario, path.parent().unwrap().to_path_buf()).unwrap();
        session.load(&scenario.objects);
        for (i, step) in scenario.steps.iter().enumerate() {
            session.step(i + 1, step);
        }
        let replayed = Objects(session.sim.objects());
        assert_eq!(
            outcome(&real),
            outcome(&replayed),
            "{stem}: the control plane and replay disagree"
        );
        compared.push(stem);
    }
    eprintln!("scenarios that agree on the control plane and under replay: {compared:?}");
    assert!(!everything || compared.len() >= 10, "{compared:?}");
}

#[path = "real_cluster/bench.rs"]
mod bench;
#[path = "real_cluster/cached.rs"]
mod cached;
#[path = "real_cluster/contained.rs"]
mod contained;
#[path = "real_cluster/door.rs"]
mod door;
#[path = "real_cluster/drift.rs"]
mod drift;
#[path = "real_cluster/fleet.rs"]
mod fleet;
#[path = "real_cluster/forged.rs"]
mod forged;
#[path = "real_cluster/fresh.rs"]
mod fresh;
#[path = "real_cluster/held.rs"]
mod held;
#[path = "real_cluster/helm.rs"]
mod helm;
#[path = "real_cluster/histories.rs"]
mod histories;
#[path = "real_cluster/identity.rs"]
mod identity;
#[path = "real_cluster/install.rs"]
mod install;
#[path = "real_cluster/intake.rs"]
mod intake;
#[path = "real_cluster/jobs.rs"]
mod jobs;
#[path = "real_cluster/keys.rs"]
mod keys;
#[path = "real_cluster/memory.rs"]
mod memory;
#[path = "real_cluster/monitoring.rs"]
mod monitoring;
#[path = "real_cluster/node.rs"]
mod node;
#[path = "real_cluster/plan.rs"]
mod plan;
#[path = "real_cluster/policy_server.rs"]
mod policy_server;
#[path = "real_cluster/recipe.rs"]
mod recipe;
#[path = "real_cluster/revoke.rs"]
mod revoke;
#[path = "real_cluster/rollouts.rs"]
mod rollouts;
#[path = "real_cluster/security.rs"]
mod security;

/// The tools users drive: docs/serve.md's recipe as documented, GitOps
/// drift as kubectl diff computes it, and helm (config-snapshot's chart
/// against its kustomize install, a user's chart with serve answering, the
/// chart's own life cycle, last: its webhook is registered while it is
/// installed).
fn tool_stories(cp: &ControlPlane, serve: &ServeProcess) {
    recipe::documented_recipe(cp, serve);
    drift::gitops_drift_story(cp);
    helm::chart_renders_what_kustomize_does(cp);
    helm::user_chart_story(cp);
    helm::chart_installs_upgrades_and_uninstalls(cp);
}

/// The node's test and the control planes' test one after the other: the
/// node's pods, beside two control planes on two cores, would miss their
/// deadlines. The control planes' two halves run side by side: they wait
/// on Kubernetes far more than they compute.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A real node: serve in pods from its chart, and the user stories read
/// from the containers (real_cluster/node.rs). Runs as root (the node makes
/// a bridge, network namespaces and iptables rules); elsewhere it says so
/// and skips, but not under CI. `REAL_CLUSTER_PART=node` runs it alone.
#[test]
fn pods_on_a_real_node() {
    let part = std::env::var("REAL_CLUSTER_PART").unwrap_or_default();
    if !part.is_empty() && part != "node" {
        return;
    }
    let root_user = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout == b"0\n");
    if !root_user {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true");
        assert!(!ci, "CI=true: the node stories must run, as root");
        eprintln!("SKIPPED: the node needs root (a bridge, network namespaces, iptables)");
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let netns_before = node::pod_netns();
    let Some(cp) = ControlPlane::start_with("node", &["--node"]) else {
        return;
    };
    node::node_stories(&cp);
    // Nothing is left behind: after `down` (the test's own, as on a
    // failure's unwinding), and after a run killed mid-way.
    let dir = cp.dir.clone();
    drop(cp);
    let left = node::left_behind(&dir, &netns_before);
    assert!(left.is_empty(), "the node's down left {left:?}");
    node::a_killed_run_leaves_nothing(&netns_before);
}

#[test]
fn serve_on_a_real_control_plane() {
    let part = std::env::var("REAL_CLUSTER_PART").unwrap_or_default();
    if part == "node" {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    match part.as_str() {
        // The two halves wait on Kubernetes far more than they compute:
        // each runs on a control plane of its own, side by side (the
        // scope joins both; a panic in either fails the test).
        "" => std::thread::scope(|s| {
            // Dropped when the stories' half ends, or unwinds: the latency
            // guard waits for it (scenario_half).
            let (stories_running, stories_ended) = std::sync::mpsc::channel::<()>();
            std::thread::Builder::new()
                .name("scenarios".into())
                .spawn_scoped(s, move || {
                    on_a_control_plane("scenarios", |cp, serve, kubeconfig| {
                        scenario_half(cp, serve, kubeconfig, Some(&stories_ended))
                    })
                })
                .expect("a thread for the scenarios' half");
            let _running = stories_running;
            on_a_control_plane("control-plane", story_half);
        }),
        // One half alone, while working on it.
        "stories" => on_a_control_plane("control-plane", story_half),
        "scenarios" => on_a_control_plane("scenarios", |cp, serve, kubeconfig| {
            scenario_half(cp, serve, kubeconfig, None)
        }),
        part => on_a_control_plane("control-plane", |cp, serve, kubeconfig| {
            one_part(part, cp, serve, kubeconfig)
        }),
    }
}

/// A control plane of its own, named `name`, with serve answering its
/// webhook; then `run` on it. Both are taken down when it returns or
/// panics.
fn on_a_control_plane(name: &str, run: impl FnOnce(&ControlPlane, &mut ServeProcess, &Path)) {
    let Some(cp) = ControlPlane::start(name) else { return };
    let (mut serve, kubeconfig) = start_serve(&cp);
    webhook_answers(&cp);
    run(&cp, &mut serve, &kubeconfig);
}

/// Each story's time, printed as it ends (`half` names whose): where the
/// run's time goes.
fn laps(half: &'static str) -> impl FnMut(&str) {
    let mut lap = Instant::now();
    move |name: &str| {
        eprintln!("real control plane ({half}): {name} in {:?}", lap.elapsed());
        lap = Instant::now();
    }
}

/// The user stories, the tools, the outage, the attacks and a tenant's
/// work: one half of the control plane's stories.
fn story_half(cp: &ControlPlane, serve: &mut ServeProcess, kubeconfig: &Path) {
    let started = Instant::now();
    let mut timed = laps("stories");
    // First: the alerts' quiet baseline needs a cluster no story has
    // forged in yet.
    monitoring::alerts_story(cp, serve, kubeconfig);
    timed("monitoring");
    deployment_story(cp);
    undo_to_before_opt_in_story(cp);
    revision_story(cp, "StatefulSet");
    revision_story(cp, "DaemonSet");
    secret_story(cp, serve);
    timed("the user stories");
    tool_stories(cp, serve);
    plan::plan_story(cp);
    fresh::fresh_as_the_request_story(cp);
    held::held_stories(cp);
    revoke::revoke_story(cp, serve);
    timed("the tools");
    outage_story(cp, serve, kubeconfig);
    timed("the outage");
    security::attack_stories(cp, serve, kubeconfig);
    serve.restart(kubeconfig, &serve_flags("{}"));
    serve.wait_ready();
    timed("the attacks");
    intake::tenant_story(cp, serve);
    timed("a tenant's large reviews");
    contained::stories(cp, serve, kubeconfig);
    timed("contained");
    eprintln!(
        "real control plane (stories): every story held in {:?}",
        started.elapsed()
    );
}

/// The scenarios against replay, the bare Pod, Argo Rollouts, the random
/// histories, the latency guard (alone, once `stories` says the other
/// half ended) and the namespaced install: the other half.
fn scenario_half(
    cp: &ControlPlane,
    serve: &mut ServeProcess,
    kubeconfig: &Path,
    stories: Option<&std::sync::mpsc::Receiver<()>>,
) {
    let started = Instant::now();
    let mut timed = laps("scenarios");
    let kubelet = start_kubelet_stand_in(cp);
    scenarios_agree_with_replay(cp, serve, kubeconfig);
    // The shipped settings again (the last scenario's may shorten the
    // orphan grace period, which would hide a snapshot no Job owns).
    serve.restart(kubeconfig, &serve_flags("{}"));
    serve.wait_ready();
    timed("the scenarios");
    // The Jobs' stories run on the real node (pods_on_a_real_node), where
    // their pods run to completion.
    jobs::bare_pod_story(cp);
    // After every other story of this half: serve ran them without the CRD.
    rollouts::rollout_story(cp);
    timed("the bare pod and Argo Rollouts");
    histories::random_histories(cp, serve, kubeconfig);
    timed("the random histories");
    // The latency regression guard, the cluster benchmark short, once the
    // stories' half has ended (it ends first: 828 s against 986 s here on
    // 2026-12-02): its ratios compare rows of one run, which only a quiet
    // neighbour slows alike.
    if let Some(stories) = stories {
        let _ = stories.recv();
    }
    timed("waiting for the stories' half");
    bench::webhook_latency(cp, serve, kubeconfig, true);
    timed("the latency guard");
    kubelet.store(true, Ordering::SeqCst);
    // Last: it takes the cluster-wide binding away.
    security::namespaced_story(cp, serve, kubeconfig);
    timed("the namespaced install");
    eprintln!(
        "real control plane (scenarios): every story held in {:?}",
        started.elapsed()
    );
}

/// `REAL_CLUSTER_PART=PART`: one part alone (`make story STORY=PART`).
fn one_part(part: &str, cp: &ControlPlane, serve: &mut ServeProcess, kubeconfig: &Path) {
    match part {
        "bench" => bench::webhook_latency(cp, serve, kubeconfig, false),
        // The latency regression guard alone, as CI runs it (short).
        "latency" => bench::webhook_latency(cp, serve, kubeconfig, true),
        "memory" => memory::memory_table(cp, serve, kubeconfig),
        "policy-server" => policy_server::checksum_story(cp, serve),
        "fleet" => fleet::leader_killed_mid_storm(cp, serve, kubeconfig, "fleet"),
        "histories" => {
            histories::random_histories(cp, serve, kubeconfig);
        }
        "plan" => {
            plan::plan_story(cp);
            fresh::fresh_as_the_request_story(cp);
            held::held_stories(cp);
        }
        "tools" => {
            tool_stories(cp, serve);
            plan::plan_story(cp);
        }
        "monitoring" => monitoring::alerts_story(cp, serve, kubeconfig),
        "jobs" => {
            // With REAL_CLUSTER_SCENARIOS=job: the Job scenarios too.
            let kubelet = start_kubelet_stand_in(cp);
            if std::env::var("REAL_CLUSTER_SCENARIOS").is_ok() {
                scenarios_agree_with_replay(cp, serve, kubeconfig);
                serve.restart(kubeconfig, &serve_flags("{}"));
                serve.wait_ready();
            }
            jobs::bare_pod_story(cp);
            kubelet.store(true, Ordering::SeqCst);
        }
        "undo" => undo_to_before_opt_in_story(cp),
        "revoke" => revoke::revoke_story(cp, serve),
        "rollouts" => {
            let kubelet = start_kubelet_stand_in(cp);
            rollouts::rollout_story(cp);
            kubelet.store(true, Ordering::SeqCst);
        }
        "outage" => outage_story(cp, serve, kubeconfig),
        "identity" => identity::stolen_token_story(cp),
        "trust" => {
            cached::cached_secret_story(cp);
            keys::unguarded_key_story(cp, serve);
        }
        "attacks" => {
            security::attack_stories(cp, serve, kubeconfig);
            security::namespaced_story(cp, serve, kubeconfig);
        }
        "intake" => intake::tenant_story(cp, serve),
        "contained" => contained::stories(cp, serve, kubeconfig),
        other => panic!("REAL_CLUSTER_PART={other}: no such part (make story lists them)"),
    }
}
