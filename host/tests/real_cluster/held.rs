//! Held changes on a real API server, driven as a user would: `kubectl
//! apply` and `annotate`, `config-snapshot status` and `approve` with the
//! admin's kubeconfig, and the Events `kubectl` shows.
//!
//! - approve and notify: a change held for approval is recorded and told,
//!   and does not roll; an approval of content the ConfigMap has since
//!   moved on from is refused; the approval of what is pending rolls it,
//!   once; a notifying workload never rolls;
//! - settle: a ConfigMap and a Secret applied seconds apart roll out once,
//!   together;
//! - rollout windows: an edit outside the window is held, recorded and
//!   told; widening the window lets it go.

use super::*;

/// Runs the binary as the cluster admin: (success, stdout, stderr).
pub(crate) fn cli(cp: &ControlPlane, args: &[&str]) -> (bool, String, String) {
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

pub fn held_stories(cp: &ControlPlane) {
    approval_story(cp);
    approval_with_settle_story(cp);
    settle_story(cp);
    window_story(cp);
}

fn approval_story(cp: &ControlPlane) {
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

/// Round 3, finding 2: approve mode with a settle time rolls what was
/// approved and nothing else. Two watched ConfigMaps change; approving one
/// rolls that one alone, and the other stays pending, awaiting its own
/// approval (it rolled too, unapproved, before the fix).
fn approval_with_settle_story(cp: &ControlPlane) {
    let ns = "story-approve-settle";
    cp.namespace(ns);
    cp.apply(ns, &config_map("app", json!({"mode": "v1"})));
    cp.apply(ns, &config_map("flags", json!({"beta": "off"})));
    let annotations = json!({
        "config-snapshot.io/watch": "configmap/app, configmap/flags",
        "config-snapshot.io/watch-mode": "approve",
        "config-snapshot.io/settle": "5s",
    });
    let env = json!([{"configMapRef": {"name": "app"}}, {"configMapRef": {"name": "flags"}}]);
    cp.apply(ns, &workload("Deployment", "web", annotations, "web:1", env, 5));
    let refs = || {
        let w = cp.get(ns, "deployment", "web").unwrap();
        let env = &w["spec"]["template"]["spec"]["containers"][0]["envFrom"];
        (
            env[0]["configMapRef"]["name"].as_str().unwrap().to_string(),
            env[1]["configMapRef"]["name"].as_str().unwrap().to_string(),
        )
    };
    let (app_before, flags_before) = refs();
    cp.apply(ns, &config_map("app", json!({"mode": "v2"})));
    cp.apply(ns, &config_map("flags", json!({"beta": "on"})));
    let pending = || annotation(cp, ns, "web", "config-snapshot.io/pending").unwrap_or_default();
    let (app_v2, flags_on) = eventually("both changes pending", 60, || {
        let p = pending();
        let entry = |id: &str| {
            p.split(',')
                .find_map(|e| e.trim().strip_prefix(&format!("{id}=")).map(str::to_string))
        };
        Some((entry("configmap/app")?, entry("configmap/flags")?))
    });
    // Past the settle time: nothing rolls without an approval.
    std::thread::sleep(Duration::from_secs(7));
    assert_eq!(refs(), (app_before.clone(), flags_before.clone()), "rolled unapproved");

    let (ok, out, err) = cli(cp, &["approve", "deploy/web", "-n", ns, "--snapshot", &app_v2]);
    assert!(ok, "{out}{err}");
    eventually("the approved rollout", 60, || (refs().0 == app_v2).then_some(()));
    std::thread::sleep(Duration::from_secs(INTERVAL_SECS + 3));
    let (app_now, flags_now) = refs();
    assert_eq!(app_now, app_v2);
    assert_eq!(
        flags_now, flags_before,
        "the unapproved change rolled with the approved one"
    );
    assert!(
        pending().contains(&format!("configmap/flags={flags_on}")),
        "the unapproved change still awaits its approval: {}",
        pending()
    );
    assert_eq!(told(cp, ns, "web", "ConfigRolledOut").len(), 1);
    cp.kubectl(&["-n", ns, "delete", "deployment", "web"]);
}

/// The ReplicaSets of Deployment `name`.
fn replica_sets(cp: &ControlPlane, ns: &str, name: &str) -> usize {
    let list: Value = serde_json::from_str(&cp.kubectl(&[
        "-n",
        ns,
        "get",
        "replicasets",
        "-l",
        &format!("app={name}"),
        "-o",
        "json",
    ]))
    .unwrap();
    list["items"].as_array().map_or(0, Vec::len)
}

fn settle_story(cp: &ControlPlane) {
    let ns = "story-settle";
    cp.namespace(ns);
    let secret = |password: &str| json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"}, "stringData": {"password": password}});
    cp.apply(ns, &config_map("app", json!({"mode": "v1"})));
    cp.apply(ns, &secret("first-c4n4ry"));
    let annotations =
        json!({"config-snapshot.io/watch": "configmap/app, secret/db", "config-snapshot.io/settle": "8s"});
    let env = json!([{"configMapRef": {"name": "app"}}, {"secretRef": {"name": "db"}}]);
    cp.apply(ns, &workload("Deployment", "web", annotations, "web:1", env, 5));
    eventually("the first ReplicaSet", 60, || {
        (replica_sets(cp, ns, "web") == 1).then_some(())
    });
    let before = cp.get(ns, "deployment", "web").unwrap()["spec"]["template"].clone();

    // Two applies a few seconds apart, as GitOps makes them.
    cp.apply(ns, &config_map("app", json!({"mode": "v2"})));
    std::thread::sleep(Duration::from_secs(3));
    cp.apply(ns, &secret("second-c4n4ry"));
    std::thread::sleep(Duration::from_secs(3));
    let template = |cp: &ControlPlane| cp.get(ns, "deployment", "web").unwrap()["spec"]["template"].clone();
    assert_eq!(template(cp), before, "rolled while its sources were settling");
    let (ok, out, _) = cli(cp, &["status", "deploy/web", "-n", ns]);
    assert!(ok && out.contains("settle             8s: settling"), "{out}");
    let after = eventually("the settled rollout", 60, || {
        let t = template(cp);
        (t != before && annotation(cp, ns, "web", "config-snapshot.io/pending").is_none()).then_some(t)
    });
    // Both sources moved in that one template; one new ReplicaSet.
    let refs = |t: &Value| {
        let c = &t["spec"]["containers"][0]["envFrom"];
        (c[0]["configMapRef"]["name"].clone(), c[1]["secretRef"]["name"].clone())
    };
    let (cm_before, secret_before) = refs(&before);
    let (cm_after, secret_after) = refs(&after);
    assert!(
        cm_after != cm_before && secret_after != secret_before,
        "one rollout took both: {after}"
    );
    std::thread::sleep(Duration::from_secs(INTERVAL_SECS + 3));
    assert_eq!(replica_sets(cp, ns, "web"), 2, "one rollout for the two changes");
    assert_eq!(told(cp, ns, "web", "ConfigRolledOut").len(), 1);
    let events = cp.kubectl(&["-n", ns, "get", "events.events.k8s.io", "-o", "json"]);
    assert!(!events.contains("c4n4ry"), "a Secret value in an Event");
    cp.kubectl(&["-n", ns, "delete", "deployment", "web"]);
}

fn window_story(cp: &ControlPlane) {
    let ns = "story-window";
    cp.namespace(ns);
    cp.apply(ns, &config_map("app", json!({"mode": "v1"})));
    // A window twelve hours from now, in UTC: closed for the whole story.
    let hour = (config_snapshot_policy::model::duration::unix_now() / 3600 + 12) % 24;
    let closed = format!("0 {hour} * * * for 1h");
    let annotations = json!({"config-snapshot.io/watch": "configmap/app", "config-snapshot.io/rollout-window": closed});
    cp.apply(
        ns,
        &workload(
            "Deployment",
            "web",
            annotations,
            "web:1",
            json!([{"configMapRef": {"name": "app"}}]),
            5,
        ),
    );
    let first = runs(cp, ns, "web");
    cp.apply(ns, &config_map("app", json!({"mode": "v2"})));
    let pending = eventually("the held change recorded", 60, || {
        annotation(cp, ns, "web", "config-snapshot.io/pending")
    });
    let held = eventually("the RolloutHeld Event", 30, || {
        let notes = told(cp, ns, "web", "RolloutHeld");
        (!notes.is_empty()).then_some(notes)
    });
    assert!(held[0].contains("it opens at"), "{held:?}");
    let (ok, out, _) = cli(cp, &["status", "deploy/web", "-n", ns]);
    assert!(
        ok && out.contains("closed; it opens at") && out.contains("waits for its rollout window"),
        "{out}"
    );
    std::thread::sleep(Duration::from_secs(INTERVAL_SECS + 3));
    assert_eq!(runs(cp, ns, "web"), first, "rolled outside its window");

    // The user widens the window: the held change goes within a minute.
    cp.kubectl(&[
        "-n",
        ns,
        "annotate",
        "--overwrite",
        "deployment/web",
        "config-snapshot.io/rollout-window=* * * * * for 1h",
    ]);
    let snapshot = pending.strip_prefix("configmap/app=").unwrap().to_string();
    eventually("the rollout once the window is open", 90, || {
        (runs(cp, ns, "web") == snapshot).then_some(())
    });
    assert_eq!(annotation(cp, ns, "web", "config-snapshot.io/pending"), None);
    cp.kubectl(&["-n", ns, "delete", "deployment", "web"]);
}
