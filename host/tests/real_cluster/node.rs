//! config-snapshot on a real node (control-plane.sh up --node): serve runs
//! in pods, installed from its chart as docs/serve.md shows, and every
//! promise ends in what a running container reads. Each app container
//! prints, every second, the config it reads from a volume and from
//! environment variables; the test reads those lines (`kubectl logs`) and
//! checks them against the snapshot its revision names.

use std::collections::BTreeMap;

use super::*;

/// What each app container prints, every second: `mode=<volume>
/// env=<env var> key=<env from a Secret key>`.
const PRINTER: &str = "while true; do echo \"mode=$(cat /cfg/mode 2>/dev/null) env=$MODE key=$KEY\"; sleep 1; done";

impl ControlPlane {
    fn image(&self, name: &str) -> String {
        self.images
            .get(name)
            .cloned()
            .unwrap_or_else(|| panic!("no node image {name}"))
    }

    /// The running, not terminating, pods of `ns` with label `app=<app>`.
    fn running_pods(&self, ns: &str, app: &str) -> Vec<Value> {
        let out = self.kubectl(&["-n", ns, "get", "pods", "-l", &format!("app={app}"), "-o", "json"]);
        let list: Value = serde_json::from_str(&out).unwrap();
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| {
                p["status"]["phase"] == "Running"
                    && p["metadata"]["deletionTimestamp"].is_null()
                    && p["status"]["containerStatuses"][0]["ready"] == true
            })
            .cloned()
            .collect()
    }

    /// The last line pod `name` printed.
    fn printed(&self, ns: &str, name: &str) -> Option<String> {
        let out = self.try_kubectl(&["-n", ns, "logs", name, "--tail=1"], None).ok()?;
        out.lines().last().map(str::to_string).filter(|l| !l.is_empty())
    }
}

/// `mode=blue env=blue key=one` as a map.
fn fields(line: &str) -> BTreeMap<String, String> {
    line.split_whitespace()
        .filter_map(|f| f.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// An app of `kind` whose pods print their config: `mode` from a volume of
/// ConfigMap `app`, `env` from its key `mode`, `key` from Secret `db`'s key
/// `password`; watching both.
fn app(cp: &ControlPlane, kind: &str, name: &str, replicas: u32) -> Value {
    let mut spec = json!({
        "revisionHistoryLimit": 10,
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": cp.image("busybox"), "command": ["sh", "-c", PRINTER],
                "env": [
                    {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "mode"}}},
                    {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}],
                "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}],
            "volumes": [{"name": "cfg", "configMap": {"name": "app"}}]}},
    });
    match kind {
        "Deployment" => {
            spec["replicas"] = json!(replicas);
            spec["strategy"] = json!({"rollingUpdate": {"maxUnavailable": 1, "maxSurge": 1}});
        }
        "StatefulSet" => {
            spec["replicas"] = json!(replicas);
            spec["serviceName"] = json!(name);
        }
        _ => {}
    }
    json!({"apiVersion": "apps/v1", "kind": kind,
        "metadata": {"name": name, "annotations": {"config-snapshot.io/watch": "*"}}, "spec": spec})
}

fn sources(cp: &ControlPlane, ns: &str, mode: &str, password: &str) {
    cp.apply(ns, &config_map("app", json!({"mode": mode})));
    cp.apply(
        ns,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"}, "stringData": {"password": password}}),
    );
}

/// The config a pod's own template names: what its revision pins.
fn pinned(cp: &ControlPlane, ns: &str, pod: &Value) -> (String, String) {
    let spec = &pod["spec"];
    let cm = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "cfg")
        .map(|v| v["configMap"]["name"].as_str().unwrap().to_string())
        .unwrap();
    let secret = spec["containers"][0]["env"][1]["valueFrom"]["secretKeyRef"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let mode = cp.get(ns, "configmap", &cm).expect("the pinned ConfigMap exists")["data"]["mode"]
        .as_str()
        .unwrap()
        .to_string();
    let password = cp.get(ns, "secret", &secret).expect("the pinned Secret exists")["data"]["password"]
        .as_str()
        .map(|b| String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b).unwrap()).unwrap())
        .unwrap();
    (mode, password)
}

/// Waits until every running pod of `app` prints `mode` and `password`,
/// and each reads exactly what its own revision pins: the snapshots its
/// template names hold what it prints.
fn pods_read(cp: &ControlPlane, ns: &str, app: &str, replicas: usize, mode: &str, password: &str) {
    eventually_or(
        &format!("{app}'s pods to read mode={mode} key={password}"),
        180,
        || {
            cp.running_pods(ns, app)
                .iter()
                .map(|p| {
                    let name = p["metadata"]["name"].as_str().unwrap();
                    format!("{name}: {:?}", cp.printed(ns, name))
                })
                .collect::<Vec<_>>()
                .join("\n")
        },
        || {
            let pods = cp.running_pods(ns, app);
            if pods.len() != replicas {
                return None;
            }
            for pod in &pods {
                let line = fields(&cp.printed(ns, pod["metadata"]["name"].as_str().unwrap())?);
                let wanted = (mode.to_string(), password.to_string());
                if (line.get("mode")?, line.get("env")?, line.get("key")?) != (&wanted.0, &wanted.0, &wanted.1) {
                    return None;
                }
                // What it reads is what its revision pins.
                assert_eq!(pinned(cp, ns, pod), wanted, "{}", pod["metadata"]["name"]);
            }
            Some(())
        },
    );
}

/// Installs serve as docs/serve.md's "Try it on a real node" shows: its
/// shell block, with this control plane (already up), and the image built
/// from the tests' binary by the same script `make image` runs.
fn install_as_documented(cp: &ControlPlane) {
    let doc = std::fs::read_to_string(root().join("docs/serve.md")).unwrap();
    let block = doc
        .split("## Try it on a real node, without Docker")
        .nth(1)
        .and_then(|s| s.split("```sh\n").nth(1))
        .and_then(|b| b.split("```").next())
        .expect("docs/serve.md has the node recipe");
    let binary = env!("CARGO_BIN_EXE_config-snapshot");
    let mut script = format!("set -euo pipefail\nsource {}\n", cp.dir.join("env").display());
    let mut built = false;
    for line in block.lines() {
        if line.contains("control-plane.sh up") || line.starts_with("source ") {
            continue;
        }
        let line = if line.starts_with("make image") {
            built = true;
            format!(
                "deploy/image/build.sh {} $REGISTRY/config-snapshot:{} linux/{}={binary}",
                root().join("policy.wasm").display(),
                env!("CARGO_PKG_VERSION"),
                if cfg!(target_arch = "aarch64") {
                    "arm64"
                } else {
                    "amd64"
                }
            )
        } else {
            line.replace("/tmp/node", cp.dir.to_str().unwrap())
        };
        script.push_str(&line);
        script.push('\n');
    }
    assert!(built, "the recipe builds the image");
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the documented node recipe failed:\n{script}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Two replicas, in pods, from the chart and the image built here.
    let pods = serve_pods(cp);
    let pods = &pods;
    assert_eq!(pods.len(), 2, "{pods:?}");
    let registry = cp.registry.as_deref().unwrap();
    for pod in pods {
        assert!(
            pod["spec"]["containers"][0]["image"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{registry}/config-snapshot:")),
            "{pod}"
        );
        assert_eq!(pod["status"]["containerStatuses"][0]["ready"], true, "{pod}");
        // The chart's security context holds: non-root, a read-only root.
        let security = &pod["spec"]["containers"][0]["securityContext"];
        assert_eq!(security["readOnlyRootFilesystem"], true);
        assert_eq!(pod["spec"]["securityContext"]["runAsNonRoot"], true);
    }
    // One of them leads (the Lease names a pod).
    let holder = leader(cp);
    assert!(
        pods.iter().any(|p| p["metadata"]["name"] == holder.as_str()),
        "{holder}"
    );
}

/// The pod that holds serve's Lease.
/// The pod holding serve's Lease, once that is a running pod: right after
/// a `helm upgrade`, the Lease may still name a pod of the old ReplicaSet
/// that is going or gone.
fn leader(cp: &ControlPlane) -> String {
    eventually("a running pod to lead", 120, || {
        let lease = cp.get("config-snapshot", "lease", "config-snapshot")?;
        let holder = lease["spec"]["holderIdentity"].as_str()?;
        let pod = cp.get("config-snapshot", "pod", holder)?;
        (pod["metadata"]["deletionTimestamp"].is_null() && pod["status"]["phase"] == "Running")
            .then(|| holder.to_string())
    })
}

/// A Deployment: edit a watched ConfigMap and the new pods read the new
/// value; `rollout undo` and the running pods read the old one again.
fn deployment_story(cp: &ControlPlane) {
    let ns = "node-web";
    cp.namespace(ns);
    sources(cp, ns, "blue", "one");
    cp.apply(ns, &app(cp, "Deployment", "web", 2));
    pods_read(cp, ns, "web", 2, "blue", "one");
    set_data(cp, ns, "app", json!({"mode": "green"}));
    pods_read(cp, ns, "web", 2, "green", "one");
    cp.kubectl(&["-n", ns, "rollout", "undo", "deployment/web"]);
    pods_read(cp, ns, "web", 2, "blue", "one");
    // The Secret too: an edit rolls out; the pods read it.
    cp.apply(
        ns,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"}, "stringData": {"password": "two"}}),
    );
    pods_read(cp, ns, "web", 2, "blue", "two");
    no_dangling(&cp.objects(ns), "the node's Deployment story");
}

/// A StatefulSet undone and a DaemonSet rolled out, read from their pods.
fn revision_stories(cp: &ControlPlane) {
    let ns = "node-revisions";
    cp.namespace(ns);
    sources(cp, ns, "blue", "one");
    cp.apply(ns, &app(cp, "StatefulSet", "db", 1));
    cp.apply(ns, &app(cp, "DaemonSet", "agent", 1));
    pods_read(cp, ns, "db", 1, "blue", "one");
    pods_read(cp, ns, "agent", 1, "blue", "one");
    set_data(cp, ns, "app", json!({"mode": "green"}));
    pods_read(cp, ns, "db", 1, "green", "one");
    pods_read(cp, ns, "agent", 1, "green", "one");
    cp.kubectl(&["-n", ns, "rollout", "undo", "statefulset/db"]);
    pods_read(cp, ns, "db", 1, "blue", "one");
    cp.kubectl(&["-n", ns, "rollout", "undo", "daemonset/agent"]);
    pods_read(cp, ns, "agent", 1, "blue", "one");
}

/// `helm upgrade` then `helm rollback` of a user's chart: the pods read
/// revision 1's value again.
/// A user's chart on the node, with serve installed as shipped (`settle:
/// 5s`): every `helm upgrade` that changes the config rolls the workload
/// once, whether the chart also changes the pod template (the usual
/// `checksum/config` annotation, or another change) or not; `helm
/// rollback` brings the old config back.
fn helm_story(cp: &ControlPlane) {
    let ns = "node-helm";
    cp.namespace(ns);
    let chart = root().join("e2e-tests/helm/app");
    let image = cp.image("busybox");
    let install = |verb: &str, greeting: &str, checksum: bool| {
        cp.helm(&[
            verb,
            "app",
            chart.to_str().unwrap(),
            "-n",
            ns,
            "--set",
            &format!("greeting={greeting}"),
            "--set",
            &format!("checksum={checksum}"),
            "--set",
            &format!("image={image}"),
            "--set-json",
            r#"command=["sh","-c","while true; do echo \"greeting=$greeting\"; sleep 1; done"]"#,
            "--wait",
            "--timeout",
            "3m",
        ])
    };
    let reads = |greeting: &str| {
        eventually_or(
            &format!("the app's pods to read greeting={greeting}"),
            180,
            || format!("{:?}", cp.running_pods(ns, "web").len()),
            || {
                let pods = cp.running_pods(ns, "web");
                (pods.len() == 1
                    && cp.printed(ns, pods[0]["metadata"]["name"].as_str()?)? == format!("greeting={greeting}"))
                .then_some(())
            },
        )
    };
    // The ReplicaSets of `web`, once nothing more rolls: longer than the
    // settle time and the storm guard.
    let rollouts = || {
        std::thread::sleep(Duration::from_secs(15));
        let list: Value =
            serde_json::from_str(&cp.kubectl(&["-n", ns, "get", "replicasets", "-l", "app=web", "-o", "json"]))
                .unwrap();
        list["items"].as_array().unwrap().len()
    };
    install("install", "hello", true);
    reads("hello");
    assert_eq!(rollouts(), 1);
    // The config and the template's checksum change together.
    install("upgrade", "bonjour", true);
    reads("bonjour");
    assert_eq!(rollouts(), 2, "a helm upgrade with the checksum pattern rolls once");
    // The config changes, and the template loses its checksum.
    install("upgrade", "hallo", false);
    reads("hallo");
    assert_eq!(rollouts(), 3, "a helm upgrade that drops the checksum rolls once");
    // The config changes, the template does not.
    install("upgrade", "ciao", false);
    reads("ciao");
    assert_eq!(
        rollouts(),
        4,
        "a helm upgrade of the config alone rolls once (the watch)"
    );
    cp.helm(&["rollback", "app", "1", "-n", ns, "--wait", "--timeout", "3m"]);
    reads("hello");
    cp.helm(&["uninstall", "app", "-n", ns]);
}

/// serve's leader killed in the middle of an edit storm: the other replica
/// rolls out the last edit, and the app's pods read it.
fn leader_killed_story(cp: &ControlPlane) {
    // A review the dying replica was sent is lost (the webhook's
    // failurePolicy is Ignore): the other's periodic pass re-derives the
    // rollout. A pass every 15 s rather than the chart's 5 minutes, for the
    // test's sake.
    let chart = format!("oci://{}/charts/config-snapshot", cp.registry.as_deref().unwrap());
    cp.helm(&[
        "upgrade",
        "config-snapshot",
        &chart,
        "--version",
        env!("CARGO_PKG_VERSION"),
        "--plain-http",
        "-n",
        "config-snapshot",
        "--reuse-values",
        "--set",
        "resyncInterval=15s",
        "--wait",
        "--timeout",
        "5m",
    ]);
    let ns = "node-storm";
    cp.namespace(ns);
    sources(cp, ns, "v0", "one");
    cp.apply(ns, &app(cp, "Deployment", "web", 1));
    pods_read(cp, ns, "web", 1, "v0", "one");
    let holder = leader(cp);
    for i in 1..=5 {
        set_data(cp, ns, "app", json!({"mode": format!("v{i}")}));
        if i == 3 {
            cp.kubectl(&[
                "-n",
                "config-snapshot",
                "delete",
                "pod",
                &holder,
                "--grace-period=0",
                "--force",
            ]);
        }
    }
    let started = Instant::now();
    pods_read(cp, ns, "web", 1, "v5", "one");
    eprintln!(
        "node: the last edit of the storm read by the app's pod {:?} after the leader was killed",
        started.elapsed()
    );
    let survivor = leader(cp);
    assert_ne!(survivor, holder, "another replica leads");
}

/// A pod on a snapshot keeps reading it after its source is edited and
/// deleted, and so does a pod made again from its template.
fn snapshot_outlives_source_story(cp: &ControlPlane) {
    let ns = "node-outlive";
    cp.namespace(ns);
    sources(cp, ns, "blue", "one");
    let mut pinned_only = app(cp, "Deployment", "web", 1);
    pinned_only["metadata"]["annotations"] = json!({"config-snapshot.io/snapshot": "*"});
    cp.apply(ns, &pinned_only);
    pods_read(cp, ns, "web", 1, "blue", "one");
    set_data(cp, ns, "app", json!({"mode": "green"}));
    cp.kubectl(&["-n", ns, "delete", "configmap", "app"]);
    cp.kubectl(&["-n", ns, "delete", "secret", "db"]);
    std::thread::sleep(std::time::Duration::from_secs(3));
    pods_read(cp, ns, "web", 1, "blue", "one");
    cp.kubectl(&["-n", ns, "delete", "pods", "-l", "app=web", "--wait=false"]);
    pods_read(cp, ns, "web", 1, "blue", "one");
}

/// A leaked Secret revoked with pods running (docs/security.md, "A leaked
/// credential"), read from inside the containers: revoking what they run
/// is refused (their restarts would fail); the Secret rotated, the pods
/// read the new value; `revoke` deletes the leaked snapshot while they run,
/// `rollout undo` to it is refused and they go on reading the rotated
/// value; a pod deleted starts again on it; the Secret set back to the
/// leaked value rolls nothing.
fn revoke_story(cp: &ControlPlane) {
    let ns = "node-revoke";
    cp.namespace(ns);
    let (leaked, rotated) = ("leaked-node-5e1d", "rotated-node-8a2f");
    sources(cp, ns, "blue", leaked);
    cp.apply(ns, &app(cp, "Deployment", "web", 2));
    pods_read(cp, ns, "web", 2, "blue", leaked);
    let secret_of = || {
        let web = cp.get(ns, "deployment", "web").unwrap();
        web["spec"]["template"]["spec"]["containers"][0]["env"][1]["valueFrom"]["secretKeyRef"]["name"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let leaked_snapshot = secret_of();
    let (ok, out, err) = super::held::cli(cp, &["revoke", "secret/db", "-n", ns, "--current"]);
    assert!(!ok && out.contains("deployment/web  runs on"), "{out}{err}");
    assert!(cp.get(ns, "secret", &leaked_snapshot).is_some(), "refused, yet deleted");

    let secret = |password: &str| json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"}, "stringData": {"password": password}});
    cp.apply(ns, &secret(rotated));
    pods_read(cp, ns, "web", 2, "blue", rotated);
    let rotated_snapshot = secret_of();
    let (ok, out, err) = super::held::cli(cp, &["revoke", "secret/db", "-n", ns]);
    assert!(ok && out.contains(&format!("{leaked_snapshot}  revoked")), "{out}{err}");
    assert!(
        !out.contains(leaked) && !out.contains(rotated),
        "a value in the output: {out}"
    );
    assert!(cp.get(ns, "secret", &leaked_snapshot).is_none());

    let denied = cp
        .try_kubectl(&["-n", ns, "rollout", "undo", "deployment/web"], None)
        .expect_err("an undo to the revoked snapshot");
    assert!(denied.contains("was revoked at"), "{denied}");
    pods_read(cp, ns, "web", 2, "blue", rotated);
    cp.kubectl(&["-n", ns, "delete", "pods", "-l", "app=web", "--wait=false"]);
    pods_read(cp, ns, "web", 2, "blue", rotated);

    cp.apply(ns, &secret(leaked));
    std::thread::sleep(std::time::Duration::from_secs(40));
    assert_eq!(secret_of(), rotated_snapshot, "rolled to the revoked value");
    assert!(cp.get(ns, "secret", &leaked_snapshot).is_none(), "made again");
    pods_read(cp, ns, "web", 2, "blue", rotated);
}

/// The kubelet does not watch immutable ConfigMaps and Secrets: 50 pods
/// each mounting a ConfigMap and a Secret of their own cost kube-apiserver
/// a watch on each; the same pods on snapshots (immutable) cost none.
/// Measured with kube-apiserver's own gauge of long-running WATCH
/// requests, per resource.
fn watch_cost_story(cp: &ControlPlane) -> String {
    let watches = |resource: &str| -> f64 {
        cp.kubectl(&["get", "--raw", "/metrics"])
            .lines()
            .filter(|l| {
                l.starts_with("apiserver_longrunning_requests{")
                    && l.contains(&format!("resource=\"{resource}\""))
                    && l.contains("verb=\"WATCH\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let resources = ["configmaps", "secrets"];
    let now = || resources.map(watches);
    let baseline = now();
    let mut measured = Vec::new();
    for (ns, annotations) in [
        ("node-watch-direct", json!({})),
        ("node-watch-snapshots", json!({"config-snapshot.io/snapshot": "*"})),
    ] {
        cp.namespace(ns);
        let before = now();
        let mut items = Vec::new();
        for i in 0..50 {
            items.push(config_map(&format!("cm-{i}"), json!({"mode": format!("m{i}")})));
            items.push(
                json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("s-{i}")},
                "stringData": {"password": format!("p{i}")}}),
            );
            items.push(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("p-{i}"), "labels": {"app": "watch"}, "annotations": annotations},
                "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "c", "image": cp.image("busybox"),
                    "command": ["sleep", "3600"], "volumeMounts": [
                        {"name": "cfg", "mountPath": "/cfg"}, {"name": "secret", "mountPath": "/secret"}]}],
                    "volumes": [{"name": "cfg", "configMap": {"name": format!("cm-{i}")}},
                        {"name": "secret", "secret": {"secretName": format!("s-{i}")}}]}}));
        }
        cp.try_kubectl(
            &["apply", "-n", ns, "-f", "-"],
            Some(&json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        eventually("50 pods running", 300, || {
            (cp.running_pods(ns, "watch").len() == 50).then_some(())
        });
        std::thread::sleep(std::time::Duration::from_secs(5));
        let after = now();
        measured.push([after[0] - before[0], after[1] - before[1]]);
        cp.kubectl(&["delete", "namespace", ns, "--wait=false"]);
        eventually("the pods to go", 300, || {
            cp.try_kubectl(&["get", "namespace", ns], None).is_err().then_some(())
        });
        // The kubelet drops its watches as it forgets the pods: measure
        // the next from where this one started.
        eventually("the kubelet's watches to go", 300, || {
            let now = now();
            (now[0] <= baseline[0] + 2.0 && now[1] <= baseline[1] + 2.0).then_some(())
        });
    }
    let ([direct_cm, direct_secret], [snap_cm, snap_secret]) = (measured[0], measured[1]);
    eprintln!(
        "watches added by 50 pods: direct {direct_cm} on ConfigMaps, {direct_secret} on Secrets; \
         on snapshots {snap_cm} and {snap_secret}"
    );
    assert!(
        direct_cm >= 45.0 && direct_secret >= 45.0,
        "the kubelet watches mutable sources"
    );
    // The namespace's kube-root-ca.crt, which every pod's token volume
    // projects and config-snapshot leaves alone, may cost one.
    assert!(
        snap_cm.abs() <= 2.0 && snap_secret.abs() <= 2.0,
        "nor immutable snapshots"
    );
    format!(
        "| 50 pods, each mounting a ConfigMap and a Secret of their own | WATCHes on configmaps | on secrets |\n\
         |---|---|---|\n\
         | mounting the sources | {direct_cm:.0} | {direct_secret:.0} |\n\
         | opted in: mounting snapshots (immutable) | {snap_cm:.0} | {snap_secret:.0} |\n"
    )
}

/// The kustomize install (deploy/serve) on the node: the chart's release
/// uninstalled first, the same image, the webhook's Secret made by hand as
/// for the chart; one admission pinned through it. The signing key moves
/// as docs/security.md ("Reinstall") says: backed up, then restored under
/// the new guard, which is younger than the Secret serve refuses until then.
fn kustomize_story(cp: &ControlPlane) {
    let before = super::keys::keys(cp, &["list"]);
    // In the foreground: helm returns once serve's pods are gone. A pod
    // left over holds a token of the ServiceAccount helm deleted, and the
    // new Service would send it admissions it can only refuse.
    cp.helm(&[
        "uninstall",
        "config-snapshot",
        "-n",
        "config-snapshot",
        "--cascade",
        "foreground",
        "--wait",
    ]);
    let registry = cp.registry.clone().unwrap();
    let rendered = cp.kubectl(&["kustomize", root().join("deploy/serve").to_str().unwrap()]);
    let image = format!("{registry}/config-snapshot:{}", env!("CARGO_PKG_VERSION"));
    let rendered = rendered.replace(
        &format!("ghcr.io/config-snapshot/config-snapshot:{}", env!("CARGO_PKG_VERSION")),
        &image,
    );
    // `kubectl apply -k deploy/serve`, with this node's image, and serve
    // rolled out.
    let apply_kustomized = || {
        cp.try_kubectl(&["apply", "-f", "-"], Some(&rendered))
            .unwrap_or_else(|e| panic!("{e}"));
        cp.kubectl(&[
            "-n",
            "config-snapshot",
            "rollout",
            "status",
            "deployment/config-snapshot",
            "--timeout=300s",
        ]);
    };
    // Nothing else to install first (serve makes its certificate), and the
    // key helm's uninstall kept is trusted (it kept its guard too).
    apply_kustomized();
    assert_eq!(
        super::keys::keys(cp, &["list"]),
        before,
        "the same keys, the same current one"
    );
    let ns = "node-kustomize";
    cp.namespace(ns);
    sources(cp, ns, "blue", "one");
    eventually("the kustomize install's webhook", 120, || {
        cp.apply(ns, &app(cp, "Deployment", "web", 1));
        let w = cp.get(ns, "deployment", "web")?;
        let volume = w["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"]
            .as_str()?
            .to_string();
        (volume != "app").then_some(())
    });
    pods_read(cp, ns, "web", 1, "blue", "one");
    // Stopped as docs/install.md says, keeping the key, and applied again:
    // serve trusts its key, and the workload keeps its snapshot.
    let pinned = cp.get(ns, "deployment", "web").unwrap()["spec"]["template"].clone();
    cp.kubectl(&["delete", "mutatingwebhookconfiguration", "config-snapshot"]);
    cp.kubectl(&[
        "-n",
        "config-snapshot",
        "delete",
        "deployment",
        "config-snapshot",
        "--wait=true",
    ]);
    apply_kustomized();
    assert_eq!(
        super::keys::keys(cp, &["list"]),
        before,
        "the key kept across the reinstall"
    );
    // `rollout status` returns once the new pod is ready, which can be
    // before the API server sends it admissions (its webhook configuration
    // made again, its endpoints updated); until then the webhook fails
    // open. So the re-apply is retried until it is pinned as before, as
    // the install's first admission is above.
    eventually("the reinstalled webhook to pin the re-apply as before", 120, || {
        cp.apply(ns, &app(cp, "Deployment", "web", 1));
        (cp.get(ns, "deployment", "web")?["spec"]["template"] == pinned).then_some(())
    });
}

/// `to` as a path relative to the directory `from` (kustomize takes a base
/// only by a relative path).
fn relative_to(from: &Path, to: &Path) -> String {
    let (from, to) = (from.canonicalize().unwrap(), to.canonicalize().unwrap());
    let up = "../".repeat(from.components().count() - 1);
    format!("{up}{}", to.strip_prefix("/").unwrap().display())
}

/// After `release`, everything removed as docs/install.md says (`kubectl
/// delete -k deploy/serve`), then serve installed in another namespace
/// from a copy of deploy/overlays/namespace: the guards' CEL names that
/// namespace's ServiceAccount, so serve trusts the key it makes there,
/// and pins what it reviews.
fn elsewhere_story(cp: &ControlPlane) {
    let image = format!(
        "{}/config-snapshot:{}",
        cp.registry.clone().unwrap(),
        env!("CARGO_PKG_VERSION")
    );
    let rendered = |dir: &str| {
        cp.kubectl(&["kustomize", root().join(dir).to_str().unwrap()]).replace(
            &format!("ghcr.io/config-snapshot/config-snapshot:{}", env!("CARGO_PKG_VERSION")),
            &image,
        )
    };
    cp.try_kubectl(
        &["delete", "--ignore-not-found", "--wait=true", "-f", "-"],
        Some(&rendered("deploy/serve")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    eventually("serve's namespace to go", 300, || {
        cp.try_kubectl(&["get", "namespace", "config-snapshot"], None)
            .is_err()
            .then_some(())
    });
    let copy = cp.dir.join("overlay-elsewhere");
    std::fs::create_dir_all(&copy).unwrap();
    let overlay = std::fs::read_to_string(root().join("deploy/overlays/namespace/kustomization.yaml"))
        .unwrap()
        .replace("namespace: platform-system", "namespace: cs-elsewhere")
        .replace("../../serve", &relative_to(&copy, &root().join("deploy/serve")));
    std::fs::write(copy.join("kustomization.yaml"), overlay).unwrap();
    let rendered = cp
        .kubectl(&[
            "kustomize",
            "--load-restrictor",
            "LoadRestrictionsNone",
            copy.to_str().unwrap(),
        ])
        .replace(
            &format!("ghcr.io/config-snapshot/config-snapshot:{}", env!("CARGO_PKG_VERSION")),
            &image,
        );
    cp.try_kubectl(&["apply", "-f", "-"], Some(&rendered))
        .unwrap_or_else(|e| panic!("{e}"));
    cp.kubectl(&[
        "-n",
        "cs-elsewhere",
        "rollout",
        "status",
        "deployment/config-snapshot",
        "--timeout=300s",
    ]);
    assert!(
        cp.get("cs-elsewhere", "secret", "config-snapshot-signing-key")
            .is_some(),
        "serve made its key there"
    );
    let ns = "node-elsewhere";
    cp.namespace(ns);
    sources(cp, ns, "blue", "one");
    eventually("the webhook of serve in cs-elsewhere", 120, || {
        cp.apply(ns, &app(cp, "Deployment", "web", 1));
        let w = cp.get(ns, "deployment", "web")?;
        (w["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"] != "app").then_some(())
    });
    pods_read(cp, ns, "web", 1, "blue", "one");
}

/// Leaving, as docs/install.md ("Uninstall") says, on the install the
/// kustomize story left: a Deployment and a StatefulSet reading a ConfigMap
/// and a Secret, and a CronJob, rolled and undone; then serve's webhook and
/// Deployment deleted (its namespace and key stay until release), and
/// `config-snapshot release`: a dry run changes nothing; without `--roll`
/// nothing rolls and only the CronJob is pointed back; with `--roll
/// --prune-history` each workload rolls once, to its sources, its pods read
/// them, and no snapshot, no key and no dangling name is left anywhere.
fn release_story(cp: &ControlPlane) {
    // The other stories' namespaces go first: this one is the cluster.
    let others: Vec<String> = cp
        .kubectl(&["get", "namespaces", "-o", "jsonpath={.items[*].metadata.name}"])
        .split_whitespace()
        .filter(|n| n.starts_with("node-"))
        .map(str::to_string)
        .collect();
    // A story's own `--wait=false` delete may still be under way: one
    // that has finished in between is not an error.
    for ns in &others {
        cp.kubectl(&["delete", "namespace", ns, "--wait=false", "--ignore-not-found"]);
    }
    for ns in &others {
        eventually("the other stories' namespaces to go", 300, || {
            cp.try_kubectl(&["get", "namespace", ns], None).is_err().then_some(())
        });
    }
    let ns = "node-leave";
    cp.namespace(ns);
    sources(cp, ns, "blue", "one");
    cp.apply(ns, &config_map("report", json!({"mode": "daily"})));
    cp.apply(ns, &app(cp, "Deployment", "web", 2));
    cp.apply(ns, &app(cp, "StatefulSet", "db", 1));
    let cronjob = json!({"apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": "nightly", "annotations": {"config-snapshot.io/watch": "report"}},
        "spec": {"schedule": "0 3 * * *", "suspend": true, "jobTemplate": {"spec": {"template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "report", "image": cp.image("busybox"),
                "command": ["sh", "-c", "echo mode=$mode"], "envFrom": [{"configMapRef": {"name": "report"}}]}]}}}}}});
    cp.apply(ns, &cronjob);
    pods_read(cp, ns, "web", 2, "blue", "one");
    pods_read(cp, ns, "db", 1, "blue", "one");
    set_data(cp, ns, "app", json!({"mode": "green"}));
    pods_read(cp, ns, "web", 2, "green", "one");
    pods_read(cp, ns, "db", 1, "green", "one");
    cp.kubectl(&["-n", ns, "rollout", "undo", "deployment/web"]);
    pods_read(cp, ns, "web", 2, "blue", "one");
    let cron_config = |cp: &ControlPlane| -> String {
        cp.get(ns, "cronjob", "nightly").unwrap()["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
            ["envFrom"][0]["configMapRef"]["name"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_ne!(cron_config(cp), "report", "the CronJob is pinned");

    // The first way out, while serve runs: drop the opt-in. The update that
    // drops it points the template back at its sources (one rollout); its
    // old revisions keep their snapshots until the history limit, or
    // release --prune-history, takes them.
    cp.apply(ns, &app(cp, "Deployment", "optout", 1));
    pods_read(cp, ns, "optout", 1, "green", "one");
    cp.kubectl(&[
        "-n",
        ns,
        "annotate",
        "deployment",
        "optout",
        "config-snapshot.io/watch-",
    ]);
    let template = cp.get(ns, "deployment", "optout").unwrap()["spec"]["template"].clone();
    assert_eq!(template["spec"]["volumes"][0]["configMap"]["name"], "app", "{template}");
    assert_eq!(
        template["spec"]["containers"][0]["env"][1]["valueFrom"]["secretKeyRef"]["name"],
        "db"
    );
    assert!(
        template["metadata"]["annotations"]
            .get("config-snapshot.io/snapshots")
            .is_none(),
        "{template}"
    );
    pods_read(cp, ns, "optout", 1, "green", "one");

    // Refused while serve's webhook is registered: it would pin them again.
    let refused = Command::new(env!("CARGO_BIN_EXE_config-snapshot"))
        .args(["release", "--dry-run"])
        .env("KUBECONFIG", &cp.kubeconfig)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("still registered"), "{said}");

    // Uninstall: the webhook and serve; its namespace and key stay.
    cp.kubectl(&["delete", "mutatingwebhookconfiguration", "config-snapshot"]);
    cp.kubectl(&[
        "-n",
        "config-snapshot",
        "delete",
        "deployment",
        "config-snapshot",
        "--wait=true",
    ]);

    let release = |args: &[&str]| -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_config-snapshot"))
            .arg("release")
            .args(args)
            .env("KUBECONFIG", &cp.kubeconfig)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "config-snapshot release {args:?}:\n{text}");
        eprintln!("config-snapshot release {args:?}:\n{text}");
        text
    };
    // Revisions by owner, and every object's version, cluster-wide.
    let revisions = || -> BTreeMap<String, std::collections::BTreeSet<String>> {
        let list: Value =
            serde_json::from_str(&cp.kubectl(&["get", "replicasets,controllerrevisions", "-A", "-o", "json"])).unwrap();
        let mut by_owner: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
        for item in list["items"].as_array().unwrap() {
            let owner = item["metadata"]["ownerReferences"][0]["name"]
                .as_str()
                .unwrap_or_default();
            let key = format!("{}/{owner}", item["metadata"]["namespace"].as_str().unwrap());
            by_owner
                .entry(key)
                .or_default()
                .insert(item["metadata"]["name"].as_str().unwrap().to_string());
        }
        by_owner
    };
    let versions = || -> std::collections::BTreeSet<String> {
        let list: Value = serde_json::from_str(&cp.kubectl(&[
            "get",
            "deployments,statefulsets,cronjobs,replicasets,controllerrevisions,configmaps,secrets",
            "-A",
            "-o",
            "json",
        ]))
        .unwrap();
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                format!(
                    "{} {}/{} {}",
                    i["kind"], i["metadata"]["namespace"], i["metadata"]["name"], i["metadata"]["resourceVersion"]
                )
            })
            .collect()
    };
    let labelled = || {
        cp.kubectl(&[
            "get",
            "configmaps,secrets",
            "-A",
            "-l",
            "app.kubernetes.io/managed-by=config-snapshot",
            "-o",
            "name",
        ])
    };
    let key = || cp.get("config-snapshot", "secret", "config-snapshot-signing-key");

    let before = versions();
    let said = release(&["--dry-run", "--roll", "--prune-history"]);
    assert!(said.contains("would be pointed back"), "{said}");
    assert_eq!(versions(), before, "a dry run changes nothing");

    // Without --roll: nothing rolls; the CronJob, which rolls nothing, is
    // pointed back.
    let history = revisions();
    let web_template = cp.get(ns, "deployment", "web").unwrap()["spec"]["template"].clone();
    release(&[]);
    assert_eq!(revisions(), history, "no workload rolled");
    assert_eq!(
        cp.get(ns, "deployment", "web").unwrap()["spec"]["template"],
        web_template
    );
    assert_eq!(cron_config(cp), "report", "the CronJob points at its source");
    assert!(key().is_some(), "snapshots are left: the key stays");

    // With --roll and --prune-history: each rolls once, to its sources.
    release(&["--roll", "--prune-history", "--timeout", "5m"]);
    pods_read(cp, ns, "web", 2, "green", "one");
    pods_read(cp, ns, "db", 1, "green", "one");
    let after = revisions();
    for workload in ["web", "db"] {
        let owner = format!("{ns}/{workload}");
        let (old, new) = (&history[&owner], &after[&owner]);
        assert_eq!(new.len(), 1, "{workload}: one revision, the new one: {new:?}");
        assert!(new.is_disjoint(old), "{workload} rolled once: {old:?} -> {new:?}");
    }
    assert_eq!(labelled().trim(), "", "no snapshot is left");
    assert!(key().is_none(), "nor the key");
    for namespace in cp
        .kubectl(&["get", "namespaces", "-o", "jsonpath={.items[*].metadata.name}"])
        .split_whitespace()
    {
        no_dangling(&cp.objects(namespace), &format!("{namespace} after release"));
    }
    // Run again: nothing left to do.
    let again = release(&["--roll", "--prune-history"]);
    assert!(
        again.contains("0 workloads pointed back, 0 revisions pruned, 0 snapshots deleted"),
        "{again}"
    );
}

/// serve's pods, as the API server has them.
fn serve_pods(cp: &ControlPlane) -> Vec<Value> {
    let pods: Value = serde_json::from_str(&cp.kubectl(&[
        "-n",
        "config-snapshot",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=config-snapshot",
        "-o",
        "json",
    ]))
    .unwrap();
    pods["items"].as_array().cloned().unwrap_or_default()
}

/// serve's pods: name → (restarts, whether the last one ended OOMKilled).
fn serve_restarts(cp: &ControlPlane) -> BTreeMap<String, (u64, bool)> {
    serve_pods(cp)
        .iter()
        .map(|p| {
            let status = &p["status"]["containerStatuses"][0];
            (
                p["metadata"]["name"].as_str().unwrap().to_string(),
                (
                    status["restartCount"].as_u64().unwrap_or(0),
                    status["lastState"]["terminated"]["reason"] == "OOMKilled",
                ),
            )
        })
        .collect()
}

/// Round 3, finding 1 (docs/security.md), from a pod, against serve in its
/// pods with the chart's memory limit: 64 connections, each declaring an
/// 8 MiB body and sending all of it but the last KiB, then a byte every 3 s
/// (e2e-tests/cluster/attack). On cd11c64 forty such bodies took serve from
/// 69 to 311 MiB; sixty-four pass the chart's 512 Mi. Without the door's
/// path every one gets a 404 at once; with it (a leak), every one is cut
/// off or refused. serve is not restarted, and kubectl's writes are pinned
/// throughout.
fn trickle_story(cp: &ControlPlane) {
    let ns = "node-attack";
    cp.namespace(ns);
    cp.apply(ns, &config_map("app", json!({"mode": "blue"})));
    let before = serve_restarts(cp);
    let service = cp.kubectl(&[
        "-n",
        "config-snapshot",
        "get",
        "service",
        "config-snapshot",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ]);
    let config: Value =
        serde_json::from_str(&cp.kubectl(&["get", "mutatingwebhookconfiguration", "config-snapshot", "-o", "json"]))
            .unwrap();
    let door = config["webhooks"][0]["clientConfig"]["service"]["path"]
        .as_str()
        .expect("serve wrote the door's path into its configuration")
        .to_string();
    assert!(door.starts_with("/mutate/"), "{door}");
    let attacker = |name: &str, path: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "attack", "image": cp.image("attack"),
                "args": ["-url", format!("https://{service}:443{path}"), "-n", "64",
                         "-sent", ((8 << 20) - 1024).to_string(), "-for", "40s"]}]}})
    };
    cp.apply(ns, &attacker("outside", "/mutate"));
    cp.apply(ns, &attacker("leaked", &door));
    // While they trickle, kubectl's writes are answered by serve.
    let mut let_through = Vec::new();
    for i in 0..10 {
        std::thread::sleep(Duration::from_secs(2));
        let name = format!("during-{i}");
        if !applied_pinned(cp, ns, &name) {
            let_through.push(name);
        }
    }
    let summary = |pod: &str| {
        eventually(&format!("attacker {pod} done"), 120, || {
            let out = cp.try_kubectl(&["-n", ns, "logs", pod], None).ok()?;
            out.lines().find(|l| l.starts_with("statuses ")).map(str::to_string)
        })
    };
    let (outside, leaked) = (summary("outside"), summary("leaked"));
    eprintln!("node: attack without the door's path: {outside}; with it: {leaked}");
    // Each outcome and its count ("404=60 refused=4": refused, the
    // connection or its handshake was, past an address's share).
    let outcomes = |summary: &str| -> BTreeMap<String, u64> {
        summary
            .split_whitespace()
            .skip(1)
            .filter_map(|c| c.split_once('='))
            .map(|(k, n)| (k.to_string(), n.parse().unwrap()))
            .collect()
    };
    let log = |pod: &str| cp.try_kubectl(&["-n", ns, "logs", pod], None).unwrap_or_default();
    let outside_outcomes = outcomes(&outside);
    assert!(
        outside_outcomes.keys().all(|k| k == "404" || k == "refused") && outside_outcomes.contains_key("404"),
        "without the path, every body refused at once:\n{}",
        log("outside")
    );
    assert!(
        outcomes(&leaked)
            .keys()
            .all(|k| ["408", "503", "refused"].contains(&k.as_str())),
        "with the path, every body cut off or refused, none held:\n{}",
        log("leaked")
    );
    let after = serve_restarts(cp);
    assert_eq!(after, before, "serve restarted (OOMKilled?) under the attack");
    assert!(
        let_through.is_empty(),
        "let through unpinned during the attack: {let_through:?}"
    );
    cp.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}

/// The shell blocks of docs/quickstart.md, each with the expected output
/// that follows it (a fence with no language), in order.
fn quickstart_blocks() -> Vec<(String, Option<String>)> {
    let doc = std::fs::read_to_string(root().join("docs/quickstart.md")).unwrap();
    let mut blocks: Vec<(String, Option<String>)> = Vec::new();
    let mut rest = doc.as_str();
    while let Some(at) = rest.find("```") {
        let after = &rest[at + 3..];
        let (lang, body) = after.split_once('\n').unwrap();
        let end = body.find("```").unwrap();
        let text = body[..end].to_string();
        match lang.trim() {
            "sh" => blocks.push((text, None)),
            "" => blocks.last_mut().expect("output follows a command block").1 = Some(text),
            other => panic!("docs/quickstart.md: a block of {other:?}"),
        }
        rest = &body[end + 3..];
    }
    blocks
}

/// The block's commands, a command's continued lines joined.
fn commands(block: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut continued = false;
    let mut heredoc: Option<String> = None;
    for line in block.lines() {
        if let Some(end) = &heredoc {
            let last = out.last_mut().unwrap();
            last.push('\n');
            last.push_str(line);
            if line.trim() == end {
                heredoc = None;
            }
            continue;
        }
        if continued {
            let last = out.last_mut().unwrap();
            last.push('\n');
            last.push_str(line);
        } else if !line.trim().is_empty() {
            out.push(line.to_string());
        }
        continued = line.ends_with('\\');
        if let Some((_, tag)) = line.split_once("<<'") {
            heredoc = tag.split('\'').next().map(str::to_string);
        }
    }
    out
}

/// docs/quickstart.md run as written, on this node, after serve was
/// installed as docs/serve.md's node recipe shows (the quick start's own
/// install names ghcr.io, which is not reachable here; that step alone is
/// left out): every command block runs in a shell, with `kubectl` and the
/// node's busybox image in the place of `busybox:1.36`, and each expected
/// output is what the commands print at the end. A read that a rollout
/// still moves (`kubectl logs` of a pod going away) is read again, as a
/// user would, up to a minute; nothing else is run twice.
fn quickstart_story(cp: &ControlPlane) {
    let blocks = quickstart_blocks();
    assert!(
        blocks[0].0.contains("helm install config-snapshot"),
        "the first step installs"
    );
    let prelude = format!(
        "set -euo pipefail\nsource {}\nexport PATH=\"$BIN:$PATH\"\n",
        cp.dir.join("env").display()
    );
    let run = |script: &str| -> String {
        let out = Command::new("timeout")
            .args(["300", "bash", "-c", &format!("{prelude}{script}")])
            .current_dir(root())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "docs/quickstart.md failed:\n{script}\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let image = cp.image("busybox");
    for (block, expected) in blocks.iter().skip(1) {
        let block = block.replace("busybox:1.36", &image);
        let output = run(&block);
        let Some(expected) = expected else { continue };
        let expected: Vec<&str> = expected.lines().collect();
        // `…` in an expected line stands for what the doc cannot know (a
        // snapshot's name is keyed by the installation's own key).
        let same = |line: &str, want: &str| match want.split_once('…') {
            Some((before, after)) => {
                line.len() > before.len() + after.len() && line.starts_with(before) && line.ends_with(after)
            }
            None => line == want,
        };
        let ends_as_expected = |output: &str| {
            let lines: Vec<&str> = output.lines().collect();
            lines.len() >= expected.len()
                && lines[lines.len() - expected.len()..]
                    .iter()
                    .zip(&expected)
                    .all(|(line, want)| same(line, want))
        };
        if ends_as_expected(&output) {
            continue;
        }
        // The reads at the end of the block, again.
        let all = commands(&block);
        let reads: Vec<&String> = all
            .iter()
            .rev()
            .take_while(|c| c.starts_with("kubectl") && (c.contains(" get ") || c.contains(" logs ")))
            .collect();
        let again: String = reads.iter().rev().map(|c| format!("{c}\n")).collect();
        assert!(
            !again.is_empty(),
            "docs/quickstart.md printed {output:?}, expected {expected:?}"
        );
        eventually_or(
            &format!("docs/quickstart.md's output {expected:?}"),
            60,
            || run(&again),
            || ends_as_expected(&run(&again)).then_some(()),
        );
    }
}

pub fn node_stories(cp: &ControlPlane) {
    let started = Instant::now();
    install_as_documented(cp);
    eprintln!("node: serve installed from its chart in {:?}", started.elapsed());
    // NODE_STORIES=storm,watch runs only those (while working on them).
    let only = std::env::var("NODE_STORIES").ok();
    let run = |name: &str| only.as_deref().is_none_or(|o| o.split(',').any(|s| s == name));
    if run("quickstart") {
        quickstart_story(cp);
    }
    if run("deployment") {
        deployment_story(cp);
    }
    if run("trickle") {
        trickle_story(cp);
    }
    if run("revisions") {
        revision_stories(cp);
    }
    if run("jobs") {
        super::jobs::history_limit_story(cp, &cp.image("busybox"));
        super::jobs::bare_job_ttl_story(cp, &cp.image("busybox"));
    }
    if run("helm") {
        helm_story(cp);
    }
    if run("storm") {
        leader_killed_story(cp);
    }
    if run("outlive") {
        snapshot_outlives_source_story(cp);
    }
    if run("revoke") {
        revoke_story(cp);
    }
    if run("watch") {
        let table = watch_cost_story(cp);
        super::bench::publish("bench-node-watches", &table);
    }
    // The chart's life: certificates renewed under load, an uninstall
    // and an install again.
    if run("rotation") {
        super::install::rotation_story(cp);
    }
    if run("reinstall") {
        super::install::reinstall_story(cp);
    }
    // From here on, serve is installed with kustomize.
    if run("kustomize") {
        kustomize_story(cp);
    }
    // Last: it uninstalls serve.
    if run("release") {
        release_story(cp);
    }
    // After release: everything removed, and serve in another namespace.
    if run("elsewhere") {
        elsewhere_story(cp);
    }
    eprintln!("node: every story held in {:?}", started.elapsed());
}

/// What a node in `dir` left on this machine: its processes, mounts under
/// `dir`, the bridge, pod network namespaces not in `netns_before`, and
/// kube-proxy's iptables chains.
pub fn left_behind(dir: &Path, netns_before: &[String]) -> Vec<String> {
    let dir = dir.to_str().unwrap();
    let mut left = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        // The reaper waits on its owner and names the directory: it is
        // no node process, and it ends with the owner.
        if cmdline.contains(dir) && !cmdline.contains(" reaper ") {
            left.push(format!(
                "process {}: {}",
                entry.file_name().to_string_lossy(),
                cmdline.trim()
            ));
        }
    }
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    left.extend(
        mounts
            .lines()
            .filter(|l| l.contains(&format!(" {dir}/")))
            .map(|l| format!("mount {l}")),
    );
    if Command::new("ip")
        .args(["link", "show", "csbr0"])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        left.push("the bridge csbr0".into());
    }
    left.extend(
        pod_netns()
            .into_iter()
            .filter(|n| !netns_before.contains(n))
            .map(|n| format!("network namespace {n}")),
    );
    for table in ["filter", "nat", "mangle"] {
        let out = Command::new("iptables").args(["-t", table, "-S"]).output().unwrap();
        left.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.starts_with("-N KUBE-"))
                .map(|l| format!("iptables {table}: {l}")),
        );
    }
    left
}

/// The pods' network namespaces on this machine (the CNI plugins name them
/// `cni-…`).
pub fn pod_netns() -> Vec<String> {
    std::fs::read_dir("/var/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|n| n.starts_with("cni-"))
                .collect()
        })
        .unwrap_or_default()
}

/// A run killed rather than unwound (its process gone, no `down`) leaves
/// nothing behind either: control-plane.sh's reaper takes the node down
/// once the process that owns it is gone.
pub fn a_killed_run_leaves_nothing(netns_before: &[String]) {
    let dir = std::env::temp_dir().join(format!("config-snapshot-node-killed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut owner = Command::new("sleep").arg("3600").spawn().unwrap();
    let status = Command::new(script())
        .args(["up", dir.to_str().unwrap(), "--node"])
        .env("CONTROL_PLANE_OWNER", owner.id().to_string())
        .status()
        .unwrap();
    assert!(status.success(), "the second node came up");
    // Something to leave: a pod on the bridge, its mounts and namespace.
    let env = std::fs::read_to_string(dir.join("env")).unwrap();
    let var = |name: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("export {name}=")))
            .map(|v| v.trim_matches('"').to_string())
            .unwrap()
    };
    let images = var("NODE_IMAGES");
    let busybox = images
        .split(',')
        .find_map(|i| i.strip_prefix("busybox="))
        .unwrap()
        .to_string();
    let kubectl = Path::new(&var("BIN")).join("kubectl");
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "left", "namespace": "default"},
        "spec": {"terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": busybox, "command": ["sleep", "3600"]}]}});
    let mut apply = Command::new(&kubectl)
        .args(["apply", "-f", "-"])
        .env("KUBECONFIG", var("KUBECONFIG"))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    apply
        .stdin
        .take()
        .unwrap()
        .write_all(pod.to_string().as_bytes())
        .unwrap();
    assert!(apply.wait().unwrap().success());
    eventually("the pod on the second node to run", 120, || {
        let out = Command::new(&kubectl)
            .args(["get", "pod", "left", "-o", "jsonpath={.status.phase}"])
            .env("KUBECONFIG", var("KUBECONFIG"))
            .output()
            .ok()?;
        (out.stdout == b"Running").then_some(())
    });
    assert!(!left_behind(&dir, netns_before).is_empty(), "a running node is seen");
    owner.kill().unwrap();
    owner.wait().unwrap();
    eventually_or(
        "the reaper to take the killed run's node down",
        60,
        || format!("{:?}", left_behind(&dir, netns_before)),
        || left_behind(&dir, netns_before).is_empty().then_some(()),
    );
    let _ = std::fs::remove_dir_all(&dir);
}
