//! Argo Rollouts with the real rollouts-controller (v1.10, built from its
//! module by control-plane.sh). serve has run every other story without the
//! CRD; the story installs it while serve runs, and serve's watch of
//! Rollouts starts on its own (a kind the API does not serve is retried
//! with backoff). Then a Rollout is a workload like a Deployment: pinned at
//! admission, its ReplicaSets own the snapshots, a watch rollout makes one
//! new ReplicaSet, `kubectl argo rollouts undo` brings the old config back
//! with no new snapshot, and `revisionHistoryLimit` bounds the garbage.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use serde_json::json;

use super::{config_map, env_ref, eventually_or, no_dangling, set_data, snapshots, ControlPlane};

/// The rollouts-controller, stopped when dropped.
struct Controller(Child);

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_controller(cp: &ControlPlane) -> Controller {
    let log = std::fs::File::create(cp.dir.join("rollouts-controller.log")).unwrap();
    let child = Command::new(cp.argo.join("rollouts-controller"))
        .arg("--kubeconfig")
        .arg(&cp.kubeconfig)
        .args(["--leader-elect=false", "--loglevel=warn"])
        .arg(format!("--healthzPort={}", free_port()))
        .arg(format!("--metricsPort={}", free_port()))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("rollouts-controller starts");
    Controller(child)
}

/// `kubectl argo rollouts ARGS…` in `ns`, as a user runs the plugin.
fn plugin(cp: &ControlPlane, ns: &str, args: &[&str]) -> String {
    let out = Command::new(cp.argo.join("kubectl-argo-rollouts"))
        .arg("--kubeconfig")
        .arg(&cp.kubeconfig)
        .args(["-n", ns])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl argo rollouts {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The ReplicaSets of `ns` with the snapshot each names and whether that
/// snapshot names the ReplicaSet as an owner.
fn replica_sets(cp: &ControlPlane, ns: &str) -> Vec<(String, String, bool)> {
    let view = cp.objects(ns);
    view.0
        .iter()
        .filter(|o| o["kind"] == "ReplicaSet")
        .map(|rs| {
            let snapshot = env_ref(&json!({"spec": {"template": rs["spec"]["template"]}}));
            let owned = view.0.iter().any(|o| {
                o["kind"] == "ConfigMap"
                    && o["metadata"]["name"] == snapshot.as_str()
                    && o["metadata"]["ownerReferences"]
                        .as_array()
                        .is_some_and(|r| r.iter().any(|r| r["uid"] == rs["metadata"]["uid"]))
            });
            (
                rs["metadata"]["name"].as_str().unwrap_or_default().to_string(),
                snapshot,
                owned,
            )
        })
        .collect()
}

pub fn rollout_story(cp: &ControlPlane) {
    let crds: Vec<PathBuf> = std::fs::read_dir(cp.argo.join("crds"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    for crd in &crds {
        // Server-side: the CRDs are too big for the last-applied annotation.
        cp.kubectl(&["apply", "--server-side", "-f", crd.to_str().unwrap()]);
    }
    cp.kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/rollouts.argoproj.io",
    ]);
    let _controller = start_controller(cp);
    let ns = "story-rollout";
    cp.namespace(ns);
    cp.apply(ns, &config_map("app", json!({"mode": "blue"})));
    let rollout = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
        "metadata": {"name": "web", "annotations": {"config-snapshot.io/watch": "app"}},
        "spec": {
            "replicas": 1,
            "revisionHistoryLimit": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": {"canary": {}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx:1.25",
                    "envFrom": [{"configMapRef": {"name": "app"}}]}]}
            }
        }
    });
    cp.apply(ns, &rollout);
    let state = || {
        format!(
            "replica sets: {:?}\nsnapshots: {:?}",
            replica_sets(cp, ns),
            snapshots(&cp.objects(ns))
        )
    };
    let pinned = |cp: &ControlPlane| cp.get(ns, "rollout.argoproj.io", "web").map(|r| env_ref(&r));
    let blue = pinned(cp).unwrap();
    assert!(blue.starts_with("app-"), "the Rollout is pinned at admission: {blue}");
    // Its controller's ReplicaSet names the snapshot and owns it.
    let adopted = |snapshot: &str| replica_sets(cp, ns).iter().any(|(_, s, owned)| s == snapshot && *owned);
    eventually_or("the Rollout's ReplicaSet adopting its snapshot", 90, state, || {
        adopted(&blue).then_some(())
    });

    // A watch rollout: one new snapshot, one new ReplicaSet that owns it.
    // (serve's watch of Rollouts began when the CRD appeared.)
    set_data(cp, ns, "app", json!({"mode": "green"}));
    let green = eventually_or("the watch rolling the Rollout out", 90, state, || {
        pinned(cp).filter(|name| *name != blue)
    });
    eventually_or("the new ReplicaSet adopting the new snapshot", 90, state, || {
        (adopted(&green) && replica_sets(cp, ns).len() == 2).then_some(())
    });

    // `kubectl argo rollouts undo`: the old template and its config, and no
    // new snapshot.
    let before: BTreeSet<String> = snapshots(&cp.objects(ns));
    plugin(cp, ns, &["undo", "web"]);
    eventually_or("undo restoring the old config", 60, state, || {
        (pinned(cp).as_deref() == Some(blue.as_str())).then_some(())
    });
    std::thread::sleep(std::time::Duration::from_secs(5));
    assert_eq!(
        pinned(cp).as_deref(),
        Some(blue.as_str()),
        "nothing rolls the undo forward"
    );
    assert_eq!(snapshots(&cp.objects(ns)), before, "an undo makes no snapshot");

    // revisionHistoryLimit 1: after the next rollout the oldest ReplicaSet
    // goes, and its config with it.
    set_data(cp, ns, "app", json!({"mode": "red"}));
    let red = eventually_or("the next watch rollout", 90, state, || {
        pinned(cp).filter(|name| *name != blue && *name != green)
    });
    eventually_or("the history limit collecting the oldest config", 120, state, || {
        let sets = replica_sets(cp, ns);
        let named: BTreeSet<String> = sets.iter().map(|(_, s, _)| s.clone()).collect();
        let kept = snapshots(&cp.objects(ns));
        (sets.len() == 2 && named.contains(&red) && kept == named).then_some(())
    });
    no_dangling(&cp.objects(ns), "after the Rollout's history limit");

    // Deleting the Rollout takes its ReplicaSets, and they their snapshots.
    cp.kubectl(&["-n", ns, "delete", "rollout.argoproj.io", "web"]);
    eventually_or("the Rollout's config collected with it", 90, state, || {
        snapshots(&cp.objects(ns)).is_empty().then_some(())
    });
    eprintln!("rollout story: pinned {blue}, rolled to {green}, undone to {blue}, rolled to {red}; history limit and delete collected the rest");
    abort_story(cp);
    revoked_rollout_story(cp);
}

/// A ConfigMap's earlier content revoked under a Rollout
/// (docs/design.md, "Revocation"): `kubectl argo rollouts undo` to the
/// revision that names it is refused, naming the revocation, and the
/// Rollout keeps its config.
fn revoked_rollout_story(cp: &ControlPlane) {
    let ns = "story-rollout-revoke";
    cp.namespace(ns);
    cp.apply(ns, &config_map("app", json!({"mode": "old"})));
    let rollout = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
        "metadata": {"name": "web", "annotations": {"config-snapshot.io/watch": "app"}},
        "spec": {
            "replicas": 1,
            "revisionHistoryLimit": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": {"canary": {}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx:1.25",
                    "envFrom": [{"configMapRef": {"name": "app"}}]}]}
            }
        }
    });
    cp.apply(ns, &rollout);
    let state = || format!("replica sets: {:?}", replica_sets(cp, ns));
    let pinned = |cp: &ControlPlane| cp.get(ns, "rollout.argoproj.io", "web").map(|r| env_ref(&r));
    let old = pinned(cp).unwrap();
    set_data(cp, ns, "app", json!({"mode": "new"}));
    let new = eventually_or("the watch rolling the Rollout on", 90, state, || {
        pinned(cp).filter(|name| *name != old)
    });
    // Once the old ReplicaSet is scaled down, it is history.
    eventually_or("the old ReplicaSet scaled down", 90, state, || {
        cp.objects(ns)
            .0
            .iter()
            .filter(|o| o["kind"] == "ReplicaSet")
            .find(|rs| env_ref(&json!({"spec": {"template": rs["spec"]["template"]}})) == old)
            .filter(|rs| rs["spec"]["replicas"] == 0 && rs["status"]["replicas"].as_i64().unwrap_or(0) == 0)
            .map(drop)
    });
    let (ok, out, err) = super::held::cli(cp, &["revoke", "configmap/app", "-n", ns]);
    assert!(ok && out.contains(&format!("{old}  revoked")), "{out}{err}");
    let undo = Command::new(cp.argo.join("kubectl-argo-rollouts"))
        .arg("--kubeconfig")
        .arg(&cp.kubeconfig)
        .args(["-n", ns, "undo", "web"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&undo.stderr).to_string() + &String::from_utf8_lossy(&undo.stdout);
    assert!(
        !undo.status.success() && said.contains(&format!("snapshot {old} of configmap/app was revoked at")),
        "{said}"
    );
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_eq!(
        pinned(cp).as_deref(),
        Some(new.as_str()),
        "the Rollout keeps its config"
    );
    eprintln!("revoked rollout story: {old} revoked, undo refused, {new} runs");
}

/// `kubectl argo rollouts abort` of a canary paused half way: the stable
/// ReplicaSet, which names the old snapshot, takes every replica back, and
/// both configs stay (the Rollout's spec still asks for the new one).
fn abort_story(cp: &ControlPlane) {
    let ns = "story-rollout-abort";
    cp.namespace(ns);
    cp.apply(ns, &config_map("app", json!({"mode": "one"})));
    let rollout = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
        "metadata": {"name": "canary", "annotations": {"config-snapshot.io/watch": "app"}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "canary"}},
            "strategy": {"canary": {"steps": [{"setWeight": 50}, {"pause": {}}]}},
            "template": {
                "metadata": {"labels": {"app": "canary"}},
                "spec": {"containers": [{"name": "web", "image": "nginx:1.25",
                    "envFrom": [{"configMapRef": {"name": "app"}}]}]}
            }
        }
    });
    cp.apply(ns, &rollout);
    let state = || {
        format!(
            "replica sets: {:?}\nsnapshots: {:?}",
            replica_sets(cp, ns),
            snapshots(&cp.objects(ns))
        )
    };
    let pinned = |cp: &ControlPlane| cp.get(ns, "rollout.argoproj.io", "canary").map(|r| env_ref(&r));
    let one = pinned(cp).unwrap();
    let replicas = |snapshot: &str| -> Option<i64> {
        let view = cp.objects(ns);
        view.0
            .iter()
            .find(|o| {
                o["kind"] == "ReplicaSet" && env_ref(&json!({"spec": {"template": o["spec"]["template"]}})) == snapshot
            })
            .and_then(|rs| rs["spec"]["replicas"].as_i64())
    };
    eventually_or("the stable ReplicaSet with both replicas", 90, state, || {
        (replicas(&one) == Some(2)).then_some(())
    });
    set_data(cp, ns, "app", json!({"mode": "two"}));
    let two = eventually_or("the watch starting the canary", 90, state, || {
        pinned(cp).filter(|name| *name != one)
    });
    eventually_or("the canary paused at 50%", 90, state, || {
        (replicas(&two) == Some(1)).then_some(())
    });
    plugin(cp, ns, &["abort", "canary"]);
    eventually_or(
        "the abort giving the stable ReplicaSet every replica",
        90,
        state,
        || (replicas(&one) == Some(2) && replicas(&two) == Some(0)).then_some(()),
    );
    std::thread::sleep(std::time::Duration::from_secs(5));
    let kept = snapshots(&cp.objects(ns));
    assert!(
        kept.contains(&one) && kept.contains(&two),
        "both configs stay: {kept:?}"
    );
    assert_eq!(
        pinned(cp).as_deref(),
        Some(two.as_str()),
        "nothing rewrote the Rollout's spec"
    );
    assert!(
        adopted_by_its_replica_set(cp, ns, &one),
        "the stable ReplicaSet still owns the old config"
    );
    no_dangling(&cp.objects(ns), "after the abort");
    eprintln!("rollout abort story: the stable ReplicaSet runs {one} again at full scale; {two} kept for the canary");
}

fn adopted_by_its_replica_set(cp: &ControlPlane, ns: &str, snapshot: &str) -> bool {
    replica_sets(cp, ns).iter().any(|(_, s, owned)| s == snapshot && *owned)
}
