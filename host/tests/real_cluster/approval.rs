//! Notify and approve on a real API server, driven as a user would:
//! `kubectl apply` of a ConfigMap, `config-snapshot status` and `approve`
//! with the admin's kubeconfig, and the Events `kubectl` shows. A change
//! held for approval is recorded and told, and does not roll; an approval
//! of content the ConfigMap has since moved on from is refused; the
//! approval of what is pending rolls it, once; a notifying workload never
//! rolls.

use super::*;

/// Runs the binary as the cluster admin: (success, stdout, stderr).
fn cli(cp: &ControlPlane, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_config-snapshot"))
        .args(args)
        .env("KUBECONFIG", &cp.kubeconfig)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn annotation(cp: &ControlPlane, ns: &str, name: &str, key: &str) -> Option<String> {
    cp.get(ns, "deployment", name)?["metadata"]["annotations"][key]
        .as_str()
        .map(str::to_string)
}

fn runs(cp: &ControlPlane, ns: &str, name: &str) -> String {
    env_ref(&cp.get(ns, "deployment", name).unwrap())
}

/// The notes of the Events of `reason` on Deployment `name`.
fn told(cp: &ControlPlane, ns: &str, name: &str, reason: &str) -> Vec<String> {
    let events: Value =
        serde_json::from_str(&cp.kubectl(&["-n", ns, "get", "events.events.k8s.io", "-o", "json"])).unwrap();
    events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == reason && e["regarding"]["name"] == name)
        .filter_map(|e| e["note"].as_str().map(str::to_string))
        .collect()
}

pub fn approval_story(cp: &ControlPlane) {
    let ns = "story-approve";
    cp.namespace(ns);
    cp.apply(ns, &config_map("app", json!({"mode": "v1"})));
    let watching =
        |mode: &str| json!({"config-snapshot.io/watch": "configmap/app", "config-snapshot.io/watch-mode": mode});
    let env = json!([{"configMapRef": {"name": "app"}}]);
    cp.apply(
        ns,
        &workload("Deployment", "web", watching("approve"), "web:1", env.clone(), 5),
    );
    cp.apply(ns, &workload("Deployment", "told", watching("notify"), "web:1", env, 5));
    let first = runs(cp, ns, "web");
    assert!(first.starts_with("app-"), "web runs a snapshot: {first}");
    let (ok, out, err) = cli(cp, &["status", "deploy/web", "-n", ns]);
    assert!(
        ok && out.contains("watch mode         approve") && out.contains("pending            nothing"),
        "{out}{err}"
    );

    // An edit: recorded as pending on both, told, and nothing rolls.
    cp.apply(ns, &config_map("app", json!({"mode": "v2"})));
    let pending = |name: &str| annotation(cp, ns, name, "config-snapshot.io/pending");
    let v2 = eventually("the change recorded as pending", 60, || {
        pending("web").and_then(|p| p.strip_prefix("configmap/app=").map(str::to_string))
    });
    eventually("the notifying workload's record", 60, || pending("told"));
    std::thread::sleep(Duration::from_secs(INTERVAL_SECS + 3));
    assert_eq!(runs(cp, ns, "web"), first, "approve mode rolled without an approval");
    assert_eq!(runs(cp, ns, "told"), first, "notify mode rolled");
    let events = eventually("the RolloutPending Event", 30, || {
        let notes = told(cp, ns, "web", "RolloutPending");
        (!notes.is_empty()).then_some(notes)
    });
    assert!(
        events
            .iter()
            .any(|n| n.contains(&v2) && n.contains("config-snapshot approve")),
        "{events:?}"
    );
    let (ok, out, _) = cli(cp, &["status", "deploy/web", "-n", ns]);
    assert!(ok && out.contains(&format!("configmap/app -> {v2} (awaits")), "{out}");

    // The ConfigMap moves on before the approval: approving what the user
    // saw is refused, and rolls nothing.
    cp.apply(ns, &config_map("app", json!({"mode": "v3"})));
    let v3 = eventually("the newer change pending", 60, || {
        pending("web")
            .and_then(|p| p.strip_prefix("configmap/app=").map(str::to_string))
            .filter(|s| *s != v2)
    });
    let (ok, _, err) = cli(cp, &["approve", "deploy/web", "-n", ns, "--snapshot", &v2]);
    assert!(!ok && err.contains("changed since"), "a stale approval: {err}");
    assert_eq!(annotation(cp, ns, "web", "config-snapshot.io/approve"), None);

    // Approving what is pending rolls it, once, and spends the approval.
    let (ok, out, err) = cli(cp, &["approve", "deploy/web", "-n", ns]);
    assert!(ok, "{out}{err}");
    eventually("the approved rollout", 60, || (runs(cp, ns, "web") == v3).then_some(()));
    eventually("the record cleared", 30, || {
        (pending("web").is_none() && annotation(cp, ns, "web", "config-snapshot.io/approve").is_none()).then_some(())
    });
    let rolled = told(cp, ns, "web", "ConfigRolledOut");
    assert_eq!(rolled.len(), 1, "one rollout: {rolled:?}");

    // Notify mode never rolls, and approve refuses it.
    assert_eq!(runs(cp, ns, "told"), first, "notify mode rolled");
    let (ok, _, err) = cli(cp, &["approve", "deploy/told", "-n", ns]);
    assert!(!ok && err.contains("watch mode is notify"), "{err}");
    cp.kubectl(&["-n", ns, "delete", "deployment", "web", "told"]);
}
