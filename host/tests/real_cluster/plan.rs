//! `config-snapshot plan` against a real API server, as a user runs it
//! (kube-rs, the admin's kubeconfig): what it says would roll does roll
//! once the manifest is applied, to the snapshot it named; what it says
//! stays, stays; a Secret's value never shows.

use super::*;

/// `plan -f FILE -n NS -o json`, as the cluster admin.
fn plan(cp: &ControlPlane, ns: &str, manifest: &Value) -> Value {
    let file = cp
        .dir
        .join(format!("plan-{}.json", manifest["metadata"]["name"].as_str().unwrap()));
    std::fs::write(&file, manifest.to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_config-snapshot"))
        .args(["plan", "-n", ns, "-o", "json", "--watch-min-interval"])
        .arg(format!("{INTERVAL_SECS}s"))
        .arg("-f")
        .arg(&file)
        .env("KUBECONFIG", &cp.kubeconfig)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "plan: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("plan's JSON: {e}: {text}"))
}

fn rolls(planned: &Value) -> Vec<(String, Option<String>)> {
    planned["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["rolls"] == true)
        .map(|w| {
            (
                w["workload"].as_str().unwrap().to_string(),
                w["snapshot"].as_str().map(str::to_string),
            )
        })
        .collect()
}

fn template(cp: &ControlPlane, ns: &str, name: &str) -> Value {
    cp.get(ns, "deployment", name).unwrap()["spec"]["template"]["spec"].clone()
}

pub fn plan_story(cp: &ControlPlane) {
    let ns = "story-plan";
    cp.namespace(ns);
    cp.apply(
        ns,
        &config_map(
            "ui",
            json!({"mode": "light", "theme": "solarized", "experimental": "off"}),
        ),
    );
    cp.apply(
        ns,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
                "stringData": {"password": "first-c4n4ry"}}),
    );
    let ui = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "ui", "annotations": {"config-snapshot.io/watch": "ui,secret/creds"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "ui"}},
                 "template": {"metadata": {"labels": {"app": "ui"}}, "spec": {
                     "containers": [{"name": "ui", "image": "ui:1",
                         "env": [{"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "ui", "key": "mode"}}},
                                 {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}}],
                         "volumeMounts": [{"name": "theme", "mountPath": "/theme"}]}],
                     "volumes": [{"name": "theme", "configMap": {"name": "ui", "items": [{"key": "theme", "path": "theme.css"}]}}]}}}
    });
    cp.apply(ns, &ui);
    cp.apply(
        ns,
        &workload(
            "Deployment",
            "plain",
            json!({}),
            "app:1",
            json!([{"configMapRef": {"name": "ui"}}]),
            2,
        ),
    );
    let admitted = template(cp, ns, "ui");
    assert!(admitted.to_string().contains("\"ui-"), "ui runs a snapshot: {admitted}");

    // A key the watcher reads: plan names the rollout, and it happens.
    let theme = config_map(
        "ui",
        json!({"mode": "light", "theme": "dracula", "experimental": "off"}),
    );
    let planned = plan(cp, ns, &theme);
    let said = rolls(&planned);
    assert_eq!(said.len(), 1, "{planned:#}");
    let (workload, snapshot) = &said[0];
    assert_eq!(workload, "deployment/ui");
    // A snapshot's name is keyed by serve's key, which plan does not hold.
    assert_eq!(snapshot, &None, "plan names no snapshot: {planned:#}");
    let plain = planned["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["workload"] == "deployment/plain")
        .unwrap_or_else(|| panic!("plan lists every referencing workload: {planned:#}"));
    assert!(plain["why"].as_str().unwrap().contains("does not watch"), "{plain}");
    let plain_before = template(cp, ns, "plain");
    let ui_before = template(cp, ns, "ui");
    cp.apply(ns, &theme);
    eventually("the rollout plan said", 60, || {
        (template(cp, ns, "ui") != ui_before).then_some(())
    });
    assert_eq!(template(cp, ns, "plain"), plain_before, "plan said plain stays");

    // A key no watcher reads: plan says nothing rolls, and nothing does.
    std::thread::sleep(Duration::from_secs(INTERVAL_SECS + 1));
    let experimental = config_map("ui", json!({"mode": "light", "theme": "dracula", "experimental": "on"}));
    let planned = plan(cp, ns, &experimental);
    assert!(rolls(&planned).is_empty(), "{planned:#}");
    let ui_before = template(cp, ns, "ui");
    cp.apply(ns, &experimental);
    std::thread::sleep(Duration::from_secs(2 * INTERVAL_SECS + 4));
    assert_eq!(template(cp, ns, "ui"), ui_before, "plan said nothing rolls");

    // A Secret: it rolls, and neither the value nor its base64 shows.
    let rotated = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
                         "stringData": {"password": "second-c4n4ry"}});
    let planned = plan(cp, ns, &rotated);
    assert_eq!(
        rolls(&planned),
        vec![("deployment/ui".to_string(), None)],
        "{planned:#}"
    );
    let text = planned.to_string();
    for value in ["second-c4n4ry", "first-c4n4ry"] {
        let encoded = base64::engine::general_purpose::STANDARD.encode(value);
        assert!(
            !text.contains(value) && !text.contains(&encoded),
            "plan shows a Secret value: {text}"
        );
    }
    let ui_before = template(cp, ns, "ui");
    cp.apply(ns, &rotated);
    eventually("the Secret's rollout", 60, || {
        (template(cp, ns, "ui") != ui_before).then_some(())
    });

    // plan judges by serve's settings as installed (its settings
    // ConfigMap), not by the defaults: with watchByDefault there, `plain`
    // watches too.
    let installed = yaml("deploy/serve/settings.yaml").remove(0);
    let mut by_default = installed.clone();
    by_default["data"]["settings.json"] = json!(r#"{"settle": "5s", "watchByDefault": true}"#);
    cp.apply("config-snapshot", &by_default);
    let dark = config_map("ui", json!({"mode": "dark", "theme": "dracula", "experimental": "on"}));
    let planned = plan(cp, ns, &dark);
    let mut rolled: Vec<String> = rolls(&planned).into_iter().map(|(w, _)| w).collect();
    rolled.sort();
    assert_eq!(rolled, ["deployment/plain", "deployment/ui"], "{planned:#}");
    cp.apply("config-snapshot", &installed);
    let planned = plan(cp, ns, &dark);
    assert_eq!(
        rolls(&planned),
        vec![("deployment/ui".to_string(), None)],
        "{planned:#}"
    );
}
