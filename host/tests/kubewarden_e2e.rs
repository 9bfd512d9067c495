//! Stock-Kubewarden mode, the way Kubewarden's policies test with kwctl:
//! each case under `e2e-tests/kubewarden/` holds a request, the settings,
//! the host interactions in kwctl's format and the expected answer. Every
//! case runs through `config-snapshot review
//! --replay-host-capabilities-interactions`, and also through `kwctl run`
//! when kwctl is installed (`KWCTL=/path/to/kwctl`, or `kwctl` on PATH), so
//! one fixture holds both hosts to one answer. `configmap-checksum`'s
//! expected answer was produced by kwctl 1.31.0 (e2e-tests/kubewarden/README.md).

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use serde_json::{json, Value};

mod support;
use support::paths::{policy, root};

fn cases() -> Vec<PathBuf> {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(root().join("e2e-tests/kubewarden"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("request.json").exists())
        .collect();
    cases.sort();
    cases
}

fn read(case: &Path, file: &str) -> String {
    std::fs::read_to_string(case.join(file)).unwrap_or_else(|e| panic!("{}/{file}: {e}", case.display()))
}

/// What a user sees of an AdmissionResponse: the patch decoded, nulls and
/// fields neither host sets left out.
fn observed(response: &Value) -> Value {
    let patch = response["patch"].as_str().map(|p| {
        serde_json::from_slice::<Value>(&base64::engine::general_purpose::STANDARD.decode(p).unwrap()).unwrap()
    });
    json!({
        "uid": response["uid"],
        "allowed": response["allowed"],
        "patch": patch,
        "warnings": response["warnings"].as_array().cloned().unwrap_or_default(),
        "message": response["status"]["message"],
    })
}

fn ours(case: &Path) -> (Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_config-snapshot"))
        .arg("review")
        .arg("--policy")
        .arg(policy())
        .arg("--settings-json")
        .arg(read(case, "settings.json"))
        .arg("--replay-host-capabilities-interactions")
        .arg(case.join("interactions.yml"))
        .arg(case.join("request.json"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{}: {stderr}", case.display());
    let review: Value = serde_json::from_slice(&out.stdout).unwrap();
    (review["response"].clone(), stderr)
}

fn kwctl() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("KWCTL") {
        return Some(PathBuf::from(path));
    }
    let found = Command::new("kwctl").arg("--version").output().ok()?;
    found.status.success().then(|| PathBuf::from("kwctl"))
}

fn theirs(kwctl: &Path, case: &Path) -> Value {
    let annotated = root().join("annotated-policy.wasm");
    assert!(
        annotated.exists(),
        "kwctl needs the annotated policy: make annotated-policy.wasm"
    );
    let out = Command::new(kwctl)
        .args(["run", "--allow-context-aware", "--settings-json"])
        .arg(read(case, "settings.json"))
        .arg("--replay-host-capabilities-interactions")
        .arg(case.join("interactions.yml"))
        .arg("-r")
        .arg(case.join("request.json"))
        .arg(&annotated)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kwctl on {}: {}",
        case.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn every_case_gets_the_recorded_answer() {
    let cases = cases();
    assert!(cases.len() >= 5, "cases went missing: {cases:?}");
    let kwctl = kwctl();
    if kwctl.is_none() {
        eprintln!("kwctl is not installed: checking config-snapshot review only (set KWCTL to check both)");
    }
    for case in &cases {
        let expected: Value = serde_json::from_str(&read(case, "response.json")).unwrap();
        let (response, stderr) = ours(case);
        assert_eq!(observed(&response), observed(&expected), "{}", case.display());
        // Every recorded exchange was asked for: the policy made exactly
        // the calls the recording holds, no fewer.
        assert!(!stderr.contains("not replayed"), "{}: {stderr}", case.display());
        if let Some(kwctl) = &kwctl {
            assert_eq!(
                observed(&theirs(kwctl, case)),
                observed(&expected),
                "kwctl on {}",
                case.display()
            );
        }
    }
}

/// A Secret's checksum in a pod template is keyed (docs/hash-spec.md):
/// not the SHA-256 of its content, which anyone who may read Deployments
/// could test guesses against, and another key gives another checksum.
#[test]
fn secret_checksums_are_keyed() {
    use config_snapshot::kubewarden::interactions::Response;
    use config_snapshot_policy::model::content::Content;
    use config_snapshot_policy::model::source::SourceKind;
    let checksum = |case: &str| {
        let (response, _) = ours(&root().join("e2e-tests/kubewarden").join(case));
        let patch = observed(&response)["patch"].clone();
        patch[0]["value"]["config-snapshot.io/checksum-secret-db-credentials"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let exchanges = config_snapshot::kubewarden::interactions::read(
        &root().join("e2e-tests/kubewarden/secret-checksum/interactions.yml"),
    )
    .unwrap();
    let Response::Success { payload } = &exchanges[0].response else {
        panic!("the recorded read succeeds");
    };
    let secret: Value = serde_json::from_str(payload).unwrap();
    let plain = Content::from_object(SourceKind::Secret, &secret).unwrap().hash();
    let (by_uid, by_key) = (checksum("secret-checksum"), checksum("secret-checksum-keyed"));
    assert_ne!(by_uid, plain);
    assert_ne!(by_key, plain);
    assert_ne!(by_uid, by_key);
}

/// Stock Kubewarden has no write capability, so each source is read once,
/// before and after the fallback alike: with one recorded read per
/// source, a second read would find the recording exhausted and warn.
#[test]
fn each_source_is_read_once_per_admission() {
    let case = root().join("e2e-tests/kubewarden/configmap-checksum");
    let exchanges = config_snapshot::kubewarden::interactions::read(&case.join("interactions.yml")).unwrap();
    assert_eq!(exchanges.len(), 1);
    let (response, _) = ours(&case);
    assert_eq!(response["allowed"], true);
    let warnings = response["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(response["patch"].is_string(), "{response}");
}

/// Secret data reaches the policy through a recorded read and must not
/// come back out in the answer.
#[test]
fn a_secrets_value_stays_out_of_the_answer() {
    let case = root().join("e2e-tests/kubewarden/secret-checksum");
    let canary = "S0VXQVJERU4tQ0FOQVJZLTcxMzM="; // base64 of the planted value
    assert!(
        read(&case, "interactions.yml").contains(canary),
        "the canary is planted"
    );
    let (response, stderr) = ours(&case);
    let decoded_canary = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(canary).unwrap()).unwrap();
    let everything = format!("{} {}", observed(&response), stderr);
    assert!(
        !everything.contains(canary) && !everything.contains(&decoded_canary),
        "{everything}"
    );
}

/// A recording made by `review --record-host-capabilities-interactions`
/// over a cluster replays to the same answer.
#[test]
fn a_recording_replays_to_the_answer_it_recorded() {
    let dir = std::env::temp_dir().join(format!("cs-kw-record-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let recording = dir.join("interactions.yml");
    let request = root().join("e2e-tests/kubewarden/optional-missing/request.json");
    let cluster = dir.join("cluster.yaml");
    std::fs::write(
        &cluster,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app-config, namespace: default}\ndata: {mode: green}\n",
    )
    .unwrap();
    let run = |args: &[&std::ffi::OsStr]| -> Value {
        let out = Command::new(env!("CARGO_BIN_EXE_config-snapshot"))
            .arg("review")
            .arg("--policy")
            .arg(policy())
            .args(args)
            .arg(&request)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["response"].clone()
    };
    let recorded = run(&[
        "--objects".as_ref(),
        cluster.as_os_str(),
        "--record-host-capabilities-interactions".as_ref(),
        recording.as_os_str(),
    ]);
    let exchanges = config_snapshot::kubewarden::interactions::read(&recording).unwrap();
    // app-config, then the optional feature-flags, which is not there:
    // Kubewarden says so in text, which the policy does not read, so it
    // lists that one name to learn it.
    assert_eq!(exchanges.len(), 3, "{exchanges:?}");
    assert!(
        exchanges[2]
            .request
            .contains("field_selector: metadata.name=feature-flags"),
        "{exchanges:?}"
    );
    let replayed = run(&[
        "--replay-host-capabilities-interactions".as_ref(),
        recording.as_os_str(),
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(observed(&recorded), observed(&replayed));
    // green, not the blue of the checked-in case: the cluster decided.
    let checked_in: Value = serde_json::from_str(&read(request.parent().unwrap(), "response.json")).unwrap();
    assert_ne!(observed(&recorded)["patch"], observed(&checked_in)["patch"]);
}
