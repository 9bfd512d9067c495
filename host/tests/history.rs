//! `history` and `diff` as users run them: on clusters left by replayed
//! scenarios (`--scenario`), through the kubectl plugin name, and against
//! the API server stand-in with kube-rs.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

mod support;
use config_snapshot_testing::standin::ApiServer;
use support::paths::{policy, root};

fn run(binary: &Path, args: &[&str], envs: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(binary)
        .args(args)
        .envs(envs.iter().copied())
        .env_remove("NO_COLOR")
        .current_dir(root())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_config-snapshot"))
}

/// `config-snapshot COMMAND WORKLOAD … --scenario FILE`.
fn on_scenario(args: &[&str], scenario: &str) -> (i32, String, String) {
    let policy = policy();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--scenario", scenario, "--policy", policy.to_str().unwrap()]);
    run(&binary(), &all, &[])
}

fn history_json(workload: &str, scenario: &str) -> Value {
    let (code, stdout, stderr) = on_scenario(&["history", workload, "-o", "json"], scenario);
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).unwrap()
}

fn source<'a>(revision: &'a Value, name: &str) -> &'a Value {
    revision["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["source"] == name)
        .unwrap_or_else(|| panic!("{name} in {revision}"))
}

#[test]
fn a_rollback_shows_whose_template_and_which_config_it_brought_back() {
    let history = history_json("deploy/web", "e2e-tests/kep-story-configmap.yaml");
    let revisions = history["revisions"].as_array().unwrap();
    assert!(revisions.len() >= 2, "{history}");
    let current: Vec<&Value> = revisions.iter().filter(|r| r["current"] == true).collect();
    assert_eq!(current.len(), 1, "exactly one current revision: {history}");
    assert_eq!(
        current[0]["revision"],
        revisions.last().unwrap()["revision"],
        "oldest first"
    );
    // The story's last undo made an older ReplicaSet current again.
    assert!(revisions.iter().any(|r| r["rollbackOf"].is_array()), "{history}");
    let names: Vec<&Value> = revisions
        .iter()
        .map(|r| &source(r, "configmap/app-config")["snapshot"])
        .collect();
    assert_ne!(names[0], names[1], "each revision pins its own snapshot");
    assert_eq!(
        source(&revisions[1], "configmap/app-config")["keys"],
        json!({"added": [], "removed": [], "changed": ["mode"]})
    );

    let (_, text, _) = on_scenario(&["history", "deploy/web"], "e2e-tests/kep-story-configmap.yaml");
    assert!(text.contains("rollback to revision"), "{text}");
    assert!(text.contains("(changed mode)"), "{text}");
    assert!(!text.contains('\x1b'), "no colour when not on a terminal: {text:?}");
}

#[test]
fn statefulsets_and_daemonsets_read_their_controller_revisions() {
    for (workload, scenario) in [
        ("sts/db", "e2e-tests/kep-story-statefulset.yaml"),
        ("daemonset/db", "e2e-tests/kep-story-daemonset.yaml"),
    ] {
        let history = history_json(workload, scenario);
        let revisions = history["revisions"].as_array().unwrap();
        assert!(revisions.len() >= 2, "{workload}: {history}");
        let last = revisions.last().unwrap();
        assert_eq!(last["current"], true);
        let db = source(last, "configmap/db-config");
        assert_eq!(db["state"], "snapshot", "{db}");
        assert_eq!(
            db["keys"]["changed"],
            json!(["max_connections"]),
            "{workload}: {history}"
        );
    }
}

#[test]
fn a_key_subset_reports_only_the_keys_the_workload_reads() {
    let history = history_json("deploy/ui", "e2e-tests/key-subset.yaml");
    let revisions = history["revisions"].as_array().unwrap();
    let ui = source(revisions.last().unwrap(), "configmap/ui");
    // The source also gained `experimental`, which the workload never reads.
    assert_eq!(
        ui["keys"],
        json!({"added": [], "removed": [], "changed": ["mode"]}),
        "{history}"
    );
}

#[test]
fn sources_without_a_snapshot_say_why() {
    let history = history_json("deploy/api", "e2e-tests/optional-missing.yaml");
    let first = &history["revisions"][0];
    assert_eq!(
        source(first, "configmap/feature-flags")["state"],
        "optionalMissing",
        "{history}"
    );
}

#[test]
fn a_collected_snapshot_is_reported_not_fatal() {
    let dir = std::env::temp_dir().join(format!("cs-history-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let story = std::fs::read_to_string(root().join("e2e-tests/kep-story-configmap.yaml")).unwrap();
    let first = history_json("deploy/web", "e2e-tests/kep-story-configmap.yaml");
    let gone = first["revisions"][0]["sources"][0]["snapshot"]
        .as_str()
        .unwrap()
        .to_string();
    let scenario = dir.join("collected.yaml");
    std::fs::write(
        &scenario,
        format!("{story}\n  - delete: {{kind: ConfigMap, name: {gone}}}\n"),
    )
    .unwrap();
    let scenario = scenario.to_str().unwrap();
    let (code, text, stderr) = on_scenario(&["history", "deploy/web"], scenario);
    assert_eq!(code, 0, "{stderr}");
    assert!(text.contains(&format!("snapshot {gone} no longer exists")), "{text}");
    let (code, text, stderr) = on_scenario(&["diff", "deploy/web", "3", "4"], scenario);
    assert!(code == 1, "{stderr}");
    assert!(text.contains("no longer exists"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn diff_shows_values_and_template_and_exits_like_diff() {
    let scenario = "e2e-tests/kep-story-configmap.yaml";
    let (code, text, stderr) = on_scenario(&["diff", "deploy/web", "3", "4"], scenario);
    assert_eq!(code, 1, "{stderr}");
    assert!(text.contains("-mode: blue\n+mode: green"), "{text}");
    assert!(
        text.contains("-    image: nginx:1.25\n+    image: nginx:1.26"),
        "{text}"
    );
    // Snapshot names are not a difference: only the config behind them is.
    assert!(!text.contains("app-config-"), "{text}");

    let (code, text, _) = on_scenario(&["diff", "deploy/web", "4", "4"], scenario);
    assert_eq!(code, 0);
    assert!(text.contains("same config and template"), "{text}");

    let (code, _, stderr) = on_scenario(&["diff", "deploy/web", "1", "4"], scenario);
    assert_eq!(code, 2);
    assert!(stderr.contains("has no revision 1 (kept: 3, 4)"), "{stderr}");
    let (code, _, stderr) = on_scenario(&["history", "deploy/nope"], scenario);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("deployment/nope not found in namespace default"),
        "{stderr}"
    );
}

#[test]
fn a_secrets_values_never_appear() {
    let scenario = "e2e-tests/secret-envfrom-projected.yaml";
    let text = std::fs::read_to_string(root().join(scenario)).unwrap();
    for canary in ["first-token", "rotated-token"] {
        assert!(text.contains(canary), "the canary {canary} is planted");
    }
    let mut outputs = Vec::new();
    for args in [
        vec!["history", "deploy/shop"],
        vec!["history", "deploy/shop", "-o", "json"],
        vec!["diff", "deploy/shop", "2", "3"],
        vec!["diff", "deploy/shop", "2", "3", "-o", "json"],
    ] {
        let (_, stdout, stderr) = on_scenario(&args, scenario);
        outputs.push(stdout + &stderr);
    }
    let all = outputs.join("\n");
    assert!(all.contains("secret/api-credentials"), "{all}");
    assert!(
        all.contains("token: <hidden, changed>"),
        "the change is still reported: {all}"
    );
    for canary in ["first-token", "rotated-token"] {
        use base64::Engine as _;
        let encoded = base64::engine::general_purpose::STANDARD.encode(canary);
        assert!(
            !all.contains(canary) && !all.contains(&encoded),
            "{canary} leaked:\n{all}"
        );
    }
}

#[test]
fn it_answers_as_a_kubectl_plugin() {
    let dir = std::env::temp_dir().join(format!("cs-plugin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plugin = dir.join("kubectl-config_snapshot");
    let _ = std::fs::remove_file(&plugin);
    std::os::unix::fs::symlink(binary(), &plugin).unwrap();
    let policy = policy();
    let args = [
        "history",
        "deploy/web",
        "--scenario",
        "e2e-tests/kep-story-configmap.yaml",
        "--policy",
        policy.to_str().unwrap(),
    ];
    let (code, text, stderr) = run(&plugin, &args, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(text.contains("deployment/web in default"), "{text}");
    // Through kubectl itself, when the control plane's kubectl is built.
    let kubectl = std::fs::read_dir(dirs_cache().join("control-plane"))
        .ok()
        .into_iter()
        .flatten()
        .map(|e| e.unwrap().path().join("kubectl"))
        .find(|p| p.exists());
    if let Some(kubectl) = kubectl {
        let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
        let mut all = vec!["config-snapshot"];
        all.extend(args);
        let (code, text, stderr) = run(&kubectl, &all, &[("PATH", &path)]);
        assert_eq!(code, 0, "{stderr}");
        assert!(text.contains("deployment/web in default"), "{text}");
    } else {
        eprintln!("no kubectl built yet: checked the plugin name only");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn dirs_cache() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache"))
        .join("config-snapshot")
}

/// Against an API server, with the current kubeconfig: what kube-rs reads.
#[tokio::test(flavor = "multi_thread")]
async fn it_reads_a_live_cluster_through_the_kubeconfig() {
    let api = ApiServer::start().await;
    let deployment = api.put(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"template": {"spec": {"containers": [{"name": "web", "image": "web:2"}]}}}
    }));
    let uid = deployment["metadata"]["uid"].clone();
    let owner = json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": uid, "controller": true}]);
    for (revision, image, snapshot, secret) in [
        ("1", "web:1", "app-1111111111", "token-aaaaaaaaaa"),
        ("2", "web:2", "app-2222222222", "token-bbbbbbbbbb"),
    ] {
        let mapping = json!({"configmap/app": snapshot, "secret/token": secret}).to_string();
        api.put(json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": format!("web-{revision}"), "namespace": "default", "ownerReferences": owner,
                         "annotations": {"deployment.kubernetes.io/revision": revision}},
            "spec": {"template": {
                "metadata": {"annotations": {"config-snapshot.io/snapshots": mapping}},
                "spec": {"containers": [{"name": "web", "image": image,
                    "envFrom": [{"configMapRef": {"name": snapshot}}, {"secretRef": {"name": secret}}]}]}}}
        }));
        api.put(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": snapshot, "namespace": "default"},
            "data": {"level": if revision == "1" { "info" } else { "debug" }}
        }));
        api.put(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": secret, "namespace": "default"},
            "data": {"token": if revision == "1" { "Q0FOQVJZLU9ORQ==" } else { "Q0FOQVJZLVRXTw==" }}
        }));
    }
    let kubeconfig = api.kubeconfig();
    let kubeconfig = kubeconfig.to_str().unwrap().to_string();
    let (code, text, stderr) = tokio::task::spawn_blocking(move || {
        run(
            &binary(),
            &["history", "deploy/web", "-o", "json"],
            &[("KUBECONFIG", &kubeconfig)],
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{stderr}");
    let history: Value = serde_json::from_str(&text).unwrap();
    let revisions = history["revisions"].as_array().unwrap();
    assert_eq!(revisions.len(), 2, "{history}");
    assert_eq!(revisions[1]["current"], true);
    assert_eq!(revisions[1]["images"], json!(["web:2"]));
    assert_eq!(
        source(&revisions[1], "configmap/app")["keys"]["changed"],
        json!(["level"])
    );
    assert_eq!(
        source(&revisions[1], "secret/token")["keys"]["changed"],
        json!(["token"])
    );
    assert!(!text.contains("Q0FOQVJZ") && !text.contains("CANARY"), "{text}");
}

/// A CronJob's history is its Jobs, oldest first, numbered in the order
/// they were made, each with the config it runs.
#[test]
fn a_cronjobs_history_is_its_jobs() {
    let dir = std::env::temp_dir().join(format!("cs-history-cron-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let story = std::fs::read_to_string(root().join("e2e-tests/cronjob-story.yaml")).unwrap();
    // The story up to the first Job deletion: report-1 (blue) and report-2 (green) are kept.
    let (kept, _) = story.split_once("  # The history limit").unwrap();
    let scenario = dir.join("cron.yaml");
    std::fs::write(&scenario, kept).unwrap();
    let scenario = scenario.to_str().unwrap();
    let history = history_json("cronjob/report", scenario);
    let revisions = history["revisions"].as_array().unwrap();
    let names: Vec<(&Value, &Value, &Value)> = revisions
        .iter()
        .map(|r| (&r["revision"], &r["name"], &r["current"]))
        .collect();
    assert_eq!(
        names,
        [
            (&json!(1), &json!("report-1"), &json!(false)),
            (&json!(2), &json!("report-2"), &json!(true))
        ]
    );
    let (one, two) = (
        source(&revisions[0], "configmap/report-config"),
        source(&revisions[1], "configmap/report-config"),
    );
    assert_eq!((&one["state"], &two["state"]), (&json!("snapshot"), &json!("snapshot")));
    assert_ne!(one["snapshot"], two["snapshot"]);
    let (code, text, stderr) = on_scenario(&["diff", "cronjob/report", "1", "2"], scenario);
    assert_eq!(code, 1, "{stderr}");
    assert!(text.contains("blue") && text.contains("green"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
