//! GitOps drift, as the tools compute it: `kubectl diff` (client-side and
//! `--server-side`) runs the apply as a server-side dry run, which calls
//! the webhook as the real write would: that is what Argo CD's
//! ServerSideDiff with IncludeMutationWebhook and Flux's dry-run compare.
//! An applied manifest must show no diff after admission, after a watch
//! rollout, and after `rollout undo` followed by a re-sync. A second field
//! manager's server-side apply conflicts on the rewritten reference unless
//! forced (Kubernetes judges conflicts before admission webhooks run);
//! forced, as the GitOps tools apply, it keeps the snapshot reference.

use std::process::Command;

use serde_json::{json, Value};

use super::{config_map, env_ref, eventually, workload, ControlPlane, INTERVAL_SECS};

/// `kubectl diff` of `manifest`: `None` when it shows no difference, the
/// diff otherwise (exit code 1); any other exit fails the test.
fn diff(cp: &ControlPlane, ns: &str, manifest: &Value, server_side: bool) -> Option<String> {
    let mut args = vec![
        "--kubeconfig",
        cp.kubeconfig.to_str().unwrap(),
        "-n",
        ns,
        "diff",
        "-f",
        "-",
    ];
    if server_side {
        // As the GitOps tool's own field manager, forcing as its sync
        // does (a dry run is judged for conflicts like the apply).
        args.extend([
            "--server-side",
            "--field-manager=argocd-controller",
            "--force-conflicts",
        ]);
    }
    let mut child = Command::new(cp.bin.join("kubectl"))
        .args(&args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), manifest.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    match out.status.code() {
        Some(0) => None,
        Some(1) => Some(String::from_utf8_lossy(&out.stdout).into_owned()),
        _ => panic!(
            "kubectl diff {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

fn no_drift(cp: &ControlPlane, ns: &str, manifests: &[&Value], when: &str) {
    for manifest in manifests {
        for server_side in [false, true] {
            if let Some(shown) = diff(cp, ns, manifest, server_side) {
                panic!(
                    "{when}: kubectl diff{} shows drift for {}:\n{shown}",
                    if server_side { " --server-side" } else { "" },
                    manifest["kind"]
                );
            }
        }
    }
}

pub fn gitops_drift_story(cp: &ControlPlane) {
    let ns = "story-drift";
    cp.namespace(ns);
    let source = config_map("app", json!({"mode": "blue"}));
    let web = workload(
        "Deployment",
        "web",
        json!({"config-snapshot.io/watch": "app"}),
        "nginx:1",
        json!([{"configMapRef": {"name": "app"}}]),
        3,
    );
    // Argo CD and Flux apply server-side with --force-conflicts: Git wins
    // over in-cluster edits of the fields it holds.
    let try_sync = |manager: &str, force: bool| -> Result<(), String> {
        for manifest in [&source, &web] {
            let manager = format!("--field-manager={manager}");
            let mut args = vec!["apply", "-n", ns, "--server-side", manager.as_str(), "-f", "-"];
            if force {
                args.push("--force-conflicts");
            }
            cp.try_kubectl(&args, Some(&manifest.to_string()))?;
        }
        Ok(())
    };
    let sync =
        |manager: &str| try_sync(manager, true).unwrap_or_else(|e| panic!("server-side apply by {manager}: {e}"));
    sync("argocd-controller");
    let blue = env_ref(&cp.get(ns, "deployment", "web").unwrap());
    assert!(blue.starts_with("app-"), "admitted with a snapshot: {blue}");
    no_drift(cp, ns, &[&source, &web], "after admission");

    // A second field manager applies the same manifest. Kubernetes judges
    // conflicts before admission, against the stored (rewritten) value:
    // without --force-conflicts the one conflict is the reference the
    // webhook rewrote, held by the first manager. Forced, as Argo CD and
    // Flux apply, the reference stays the snapshot.
    let refused = try_sync("flux-kustomize-controller", false)
        .expect_err("a second manager's apply of a rewritten reference conflicts (Kubernetes judges before admission)");
    assert!(
        refused.contains("Apply failed with 1 conflict")
            && refused
                .contains(r#"conflict with "argocd-controller": .spec.template.spec.containers[name="main"].envFrom"#),
        "the only conflict is the rewritten reference: {refused}"
    );
    sync("flux-kustomize-controller");
    assert_eq!(env_ref(&cp.get(ns, "deployment", "web").unwrap()), blue);
    no_drift(cp, ns, &[&source, &web], "after a second manager's forced apply");

    // An in-cluster edit rolls the Deployment; the Git manifest of the
    // Deployment still shows no drift (the ConfigMap's does: it changed).
    let green = super::edit_and_roll(cp, ns, &blue);
    std::thread::sleep(std::time::Duration::from_secs(INTERVAL_SECS + 3));
    no_drift(cp, ns, &[&web], "after a watch rollout");

    // `rollout undo`, then the GitOps tool re-syncs what Git holds (the
    // ConfigMap back to blue): no drift, and the Deployment runs blue.
    cp.kubectl(&["-n", ns, "rollout", "undo", "deployment/web"]);
    eventually("the rollback", 30, || {
        (env_ref(&cp.get(ns, "deployment", "web")?) == blue).then_some(())
    });
    sync("argocd-controller");
    std::thread::sleep(std::time::Duration::from_secs(INTERVAL_SECS + 3));
    no_drift(cp, ns, &[&source, &web], "after rollout undo and a re-sync");
    let now = env_ref(&cp.get(ns, "deployment", "web").unwrap());
    assert_eq!(
        now, blue,
        "re-synced to blue, it runs blue's snapshot (green was {green})"
    );
}
