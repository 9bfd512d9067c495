//! `config-snapshot plan` says what applying a source would roll, and the
//! replay of that very apply agrees: each workload it says rolls does, to
//! the snapshot it names, and no other does. Secret values never show.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use config_snapshot::kubewarden::engine::Engine;
use config_snapshot::replay;
use serde_json::{json, Value};

mod support;
use support::paths::{policy, root};

/// A scratch folder of this test's own.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cs-plan-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn base() -> PathBuf {
    root().join("e2e-tests/plan/namespace.yaml")
}

fn write(dir: &Path, name: &str, value: &Value) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, serde_yaml_ng::to_string(value).unwrap()).unwrap();
    path
}

/// `plan -o json` of `manifest` on the base scenario.
fn plan(manifest: &Path, output: &str) -> (bool, String) {
    plan_on(manifest, &base(), output)
}

/// `plan` of `manifest` on the cluster `scenario` leaves.
fn plan_on(manifest: &Path, scenario: &Path, output: &str) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_config-snapshot"))
        .args(["plan", "-f"])
        .arg(manifest)
        .arg("--scenario")
        .arg(scenario)
        .args(["--policy", policy().to_str().unwrap(), "-o", output])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// The workloads whose pod template names another snapshot once
/// `manifest` is applied in the base scenario and the storm guard is past:
/// workload → the snapshots its template names now.
fn rolled(dir: &Path, manifest: &Value) -> Vec<(String, Vec<String>)> {
    let engine = Arc::new(Engine::load(&policy()).unwrap());
    let templates = |sim: &config_snapshot::replay::simulator::Simulator| -> Vec<(String, Value)> {
        sim.objects()
            .into_iter()
            .filter(|o| matches!(o["kind"].as_str(), Some("Deployment" | "StatefulSet")))
            .map(|o| {
                let name = format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap().to_lowercase(),
                    o["metadata"]["name"].as_str().unwrap()
                );
                (name, o["spec"]["template"]["spec"].clone())
            })
            .collect()
    };
    let (result, before) = replay::run_to_end(engine.clone(), &base()).unwrap();
    assert!(result.failure().is_none(), "{:?}", result.failure());
    let mut scenario: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(base()).unwrap()).unwrap();
    let steps = scenario["steps"].as_array_mut().unwrap();
    steps.push(json!({"apply": manifest}));
    steps.push(json!({"advanceTime": "31s"}));
    let (result, after) = replay::run_to_end(engine, &write(dir, "applied.yaml", &scenario)).unwrap();
    assert!(result.failure().is_none(), "{:?}", result.failure());
    let before = templates(&before);
    templates(&after)
        .into_iter()
        .filter(|(name, spec)| before.iter().any(|(n, s)| n == name && s != spec))
        .map(|(name, spec)| {
            let text = spec.to_string();
            let names = ["ui-", "creds-"]
                .iter()
                .flat_map(|p| {
                    text.match_indices(p)
                        .map(|(i, _)| text[i..i + p.len() + 10].to_string())
                })
                .collect();
            (name, names)
        })
        .collect()
}

#[test]
fn plan_says_what_the_apply_then_rolls() {
    let dir = scratch("agrees");
    let cases = [
        // A key the watcher reads: it rolls; the others say why not.
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ui"},
               "data": {"mode": "light", "theme": "dracula", "experimental": "off"}}),
        // A key nobody watching reads: nothing rolls.
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ui"},
               "data": {"mode": "light", "theme": "solarized", "experimental": "on"}}),
        // A Secret whose watcher rolled a moment ago: it rolls, after the
        // storm guard.
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
               "stringData": {"password": "third-c4n4ry", "user": "app"}}),
    ];
    for (i, manifest) in cases.iter().enumerate() {
        let file = write(&dir, &format!("manifest-{i}.yaml"), manifest);
        let (ok, text) = plan(&file, "json");
        assert!(ok, "{text}");
        let planned: Value = serde_json::from_str(&text).unwrap();
        let says: Vec<(String, Option<String>)> = planned["workloads"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| w["rolls"] == true)
            .map(|w| {
                let snapshot = w["snapshot"].as_str().map(str::to_string);
                (w["workload"].as_str().unwrap().to_string(), snapshot)
            })
            .collect();
        let did = rolled(&dir, manifest);
        assert_eq!(
            says.iter().map(|(w, _)| w.clone()).collect::<Vec<_>>(),
            did.iter().map(|(w, _)| w.clone()).collect::<Vec<_>>(),
            "case {i}: plan said {text}"
        );
        for ((workload, snapshot), (_, names)) in says.iter().zip(&did) {
            // A snapshot's name is keyed by the installation's key, which
            // plan does not hold: it names none.
            assert_eq!(snapshot, &None, "case {i}: {workload}: plan named a snapshot");
            assert!(!names.is_empty(), "case {i}: {workload} names no snapshot");
        }
        assert_eq!(
            planned["workloads"].as_array().unwrap().len(),
            if i < 2 { 6 } else { 1 },
            "{text}"
        );
    }
    assert_eq!(rolled(&dir, &cases[1]).len(), 0, "the second case rolls nothing");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn plan_explains_and_never_shows_a_secret() {
    let dir = scratch("explains");
    let ui = write(
        &dir,
        "ui.yaml",
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ui"},
                "data": {"mode": "light", "theme": "dracula", "experimental": "off"}}),
    );
    let (ok, text) = plan(&ui, "text");
    assert!(ok, "{text}");
    for expected in [
        "ROLLS  deployment/ui: rolls to a new snapshot of configmap/ui",
        "through volume theme (key theme), env ui/MODE (key mode)",
        "- theme: solarized\n",
        "+ theme: dracula\n",
        "stays  deployment/excluding: configmap/ui is excluded",
        "stays  deployment/pinned: it does not watch configmap/ui: it keeps the snapshot it pinned",
        "stays  deployment/plain: it does not watch configmap/ui: it reads the live object",
        "stays  deployment/careful1: its watch mode is approve: it would roll to a new snapshot of configmap/ui",
        "stays  deployment/careful2: its watch mode is notify: it is told it would roll to a new snapshot of configmap/ui",
        "1 of 6 referencing workloads would roll",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
    let creds = write(
        &dir,
        "creds.yaml",
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
                "stringData": {"password": "third-c4n4ry", "user": "app"}}),
    );
    for output in ["text", "json"] {
        let (ok, text) = plan(&creds, output);
        assert!(ok, "{text}");
        assert!(text.contains("after the storm guard"), "{text}");
        assert!(
            text.contains("password: <hidden, changed>") || output == "json",
            "{text}"
        );
        let encoded = "dGhpcmQtYzRuNHJ5"; // base64 of the value
        for secret in ["third-c4n4ry", encoded, "second", "c2Vjb25k"] {
            assert!(!text.contains(secret), "{output} shows a Secret value:\n{text}");
        }
    }
    let deployment = write(
        &dir,
        "deploy.yaml",
        &json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}}),
    );
    let (ok, text) = plan(&deployment, "text");
    assert!(!ok && text.contains("plan reads a ConfigMap or a Secret"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A workload that still runs the content applied (its change since is
/// held for an approval) already runs it: plan says so from the content
/// hash its snapshot carries, as it cannot compute a keyed name.
#[test]
fn plan_knows_a_workload_already_runs_the_content_applied() {
    let dir = scratch("already");
    let original = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ui"},
                          "data": {"mode": "light", "theme": "solarized", "experimental": "off"}});
    let mut scenario: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(base()).unwrap()).unwrap();
    let steps = scenario["steps"].as_array_mut().unwrap();
    steps.push(json!({"edit": {"kind": "ConfigMap", "name": "ui", "set": {"data": {"theme": "dracula"}}}}));
    steps.push(json!({"advanceTime": "31s"}));
    let changed = write(&dir, "changed.yaml", &scenario);
    let (ok, text) = plan_on(&write(&dir, "ui.yaml", &original), &changed, "text");
    assert!(ok, "{text}");
    assert!(
        text.contains("stays  deployment/careful1: it already runs this content (ui-"),
        "the approver still runs the original:\n{text}"
    );
    assert!(text.contains("ROLLS  deployment/ui: rolls to a new snapshot"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// plan reads what the manifest says of its readers, as the host will
/// judge its change: `readers: watch` rolls the workload that snapshots
/// the source through `*` (and the replay of that very apply agrees),
/// `ignore` rolls only the workloads that name it, and a word that is
/// neither is said and read as none.
#[test]
fn plan_follows_what_the_source_says_of_its_readers() {
    let dir = scratch("readers");
    let ui = |word: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "ui", "annotations": {"config-snapshot.io/readers": word}},
               "data": {"mode": "dark", "theme": "solarized", "experimental": "off"}})
    };
    let rolls = |text: &str| -> Vec<String> {
        let planned: Value = serde_json::from_str(text).unwrap();
        planned["workloads"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| w["rolls"] == true)
            .map(|w| w["workload"].as_str().unwrap().to_string())
            .collect()
    };
    for (word, expected) in [
        ("watch", vec!["deployment/pinned", "deployment/ui"]),
        ("ignore", vec!["deployment/ui"]),
    ] {
        let manifest = ui(word);
        let (ok, text) = plan(&write(&dir, &format!("{word}.yaml"), &manifest), "json");
        assert!(ok, "{text}");
        assert_eq!(rolls(&text), expected, "{word}: {text}");
        let did: Vec<String> = rolled(&dir, &manifest).into_iter().map(|(w, _)| w).collect();
        assert_eq!(did, expected, "{word}: the apply rolled otherwise than plan said");
    }
    let (ok, text) = plan(&write(&dir, "watch.yaml", &ui("watch")), "text");
    assert!(ok, "{text}");
    for expected in [
        "it says config-snapshot.io/readers: watch",
        "ROLLS  deployment/pinned: rolls to a new snapshot of configmap/ui (it watches configmap/ui on its config-snapshot.io/readers: watch)",
        "stays  deployment/plain: it does not watch configmap/ui: it reads the live object",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
    let (ok, text) = plan(&write(&dir, "typo.yaml", &ui("true")), "text");
    assert!(ok, "{text}");
    assert!(
        text.contains(
            "warning: config-snapshot.io/readers: bad token \"true\": \"watch\" or \"ignore\"; read as no word"
        ),
        "{text}"
    );
    assert!(
        text.contains("stays  deployment/pinned: it does not watch configmap/ui: it keeps the snapshot"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
