//! The `config-snapshot` binary as a user runs it, against the built policy.

use std::process::Command;

use base64::Engine as _;
use serde_json::Value;

mod support;
use support::paths::{policy, root};

fn cli(args: &[&str]) -> (i32, String, String) {
    let policy = policy();
    let mut with_policy = args.to_vec();
    with_policy.extend(["--policy", policy.to_str().unwrap()]);
    cli_without_policy(&with_policy)
}

/// For the commands that take no `--policy`.
fn cli_without_policy(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_config-snapshot"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn review_prints_an_admission_review_response_with_a_base64_json_patch() {
    let (code, stdout, stderr) = cli(&[
        "review",
        "--objects",
        "e2e-tests/fixtures/cluster.yaml",
        "e2e-tests/fixtures/deployment-create-review.json",
        "e2e-tests/fixtures/deployment-bad-annotation-request.json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    let ok = &lines[0];
    assert_eq!(ok["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(ok["kind"], "AdmissionReview");
    assert_eq!(ok["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_eq!(ok["response"]["allowed"], true);
    assert_eq!(ok["response"]["patchType"], "JSONPatch");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(ok["response"]["patch"].as_str().unwrap())
        .unwrap();
    let patch: Vec<Value> = serde_json::from_slice(&patch).unwrap();
    let paths: Vec<&str> = patch.iter().map(|op| op["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        [
            "/spec/template/metadata/annotations",
            "/spec/template/spec/containers/0/envFrom/0/configMapRef/name"
        ]
    );
    assert!(patch[1]["value"].as_str().unwrap().starts_with("app-config-"));
    let refused = &lines[1];
    assert_eq!(refused["response"]["allowed"], false);
    assert!(refused["response"]["status"]["message"]
        .as_str()
        .unwrap()
        .contains("volume/data"));
}

#[test]
fn a_wrong_expectation_fails_naming_the_step_and_the_check() {
    let dir = std::env::temp_dir().join(format!("cs-wrong-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let original = std::fs::read_to_string(root().join("e2e-tests/kep-story-configmap.yaml")).unwrap();
    // After the rollback the old config is back; claim the new one instead.
    let marker = "      - jsonPath: {kind: Deployment, name: web, path: \"spec.template.spec.containers[0].image\", equals: \"nginx:1.25\"}\n      - effectiveConfig: {kind: Deployment, name: web, source: configmap/app-config, data: {mode: blue, greeting: hello}}";
    assert!(original.contains(marker), "the scenario changed; update this test");
    let wrong = original.replacen(marker, &marker.replace("mode: blue", "mode: green"), 1);
    let path = dir.join("wrong.yaml");
    std::fs::write(&path, wrong).unwrap();
    let (code, stdout, stderr) = cli(&["replay", path.to_str().unwrap()]);
    assert_ne!(code, 0, "{stdout}");
    assert!(stderr.contains("step 11 (assert)"), "{stderr}");
    assert!(
        stderr.contains("check effectiveConfig Deployment/web configmap/app-config"),
        "{stderr}"
    );
    assert!(stdout.contains("0 passed, 1 failed"), "{stdout}");

    let (code, stdout, _) = cli(&["replay", "--json", path.to_str().unwrap()]);
    assert_ne!(code, 0);
    let json: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["passed"], false);
    let failed: Vec<&Value> = json["results"][0]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["checks"].as_array().unwrap().iter())
        .filter(|c| c["ok"] == false)
        .collect();
    assert_eq!(failed.len(), 1);
}

/// `precompile` makes what `serve --precompiled` starts from; a file made
/// for another policy, or one this engine cannot load, falls back to
/// compiling rather than running the wrong module or failing.
#[test]
fn a_precompiled_module_is_used_only_for_its_own_policy() {
    use config_snapshot::kubewarden::engine::Engine;
    let dir = std::env::temp_dir().join(format!("cs-precompile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("policy.cwasm");
    let (code, _, stderr) =
        cli_without_policy(&["precompile", policy().to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    let precompiled = std::fs::read(&out).unwrap();
    let module = std::fs::read(policy()).unwrap();
    let timeout = Engine::DEFAULT_TIMEOUT;

    let (engine, how) = Engine::load_prepared(&module, Some(&precompiled), timeout, Default::default()).unwrap();
    assert_eq!(how, "precompiled");
    assert_eq!(engine.validate_settings(&serde_json::json!({})).unwrap(), Ok(()));

    // Another policy: the same code plus a custom section `x`.
    let mut other = module.clone();
    other.extend_from_slice(&[0x00, 0x02, 0x01, b'x']);
    let (_, how) = Engine::load_prepared(&other, Some(&precompiled), timeout, Default::default()).unwrap();
    assert!(how.contains("made for another policy"), "{how}");

    let mut damaged = precompiled.clone();
    let cut = damaged.len() / 2;
    damaged.truncate(cut);
    let (engine, how) = Engine::load_prepared(&module, Some(&damaged), timeout, Default::default()).unwrap();
    assert!(how.contains("does not fit this engine"), "{how}");
    assert_eq!(engine.validate_settings(&serde_json::json!({})).unwrap(), Ok(()));
    let _ = std::fs::remove_dir_all(&dir);
}
