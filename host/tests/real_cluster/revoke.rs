//! A leaked Secret revoked on the real control plane, driven as a
//! namespace's editor would (docs/security.md, "A leaked credential"): the
//! Secret rotated and the watch rolling every kind on; `config-snapshot
//! revoke` with the editor's own kubeconfig, refused while a workload still
//! runs the leaked snapshot and told how to roll it forward; then the
//! record, and `kubectl rollout undo` of each kind refused naming the
//! revocation, `history` saying it, the Secret set back to the leaked value
//! rolling nothing, and the record deleted still letting nothing dangle.
//! The Argo Rollout's undo is `rollouts::revoked_rollout_story` (it needs
//! the CRD), a ConfigMap's revocation.

use super::*;

/// The leaked value, and the rotated ones: never in a message, an Event
/// or the command's output (the API server's base64 of them either).
const LEAKED: &str = "leaked-7f3a-do-not-log";
const ROTATED: &str = "rotated-91c2-do-not-log";
const ROTATED_AGAIN: &str = "rotated-again-4b6e";

const NS: &str = "story-revoke";
/// The editor, a ServiceAccount with `edit` in the namespace.
const EDITOR: &str = "system:serviceaccount:story-revoke:alice";

fn set_password(cp: &ControlPlane, password: &str) {
    cp.apply(
        NS,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"}, "stringData": {"password": password}}),
    );
}

/// Runs the binary with `kubeconfig`: (success, stdout and stderr).
pub(crate) fn cli_as(kubeconfig: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_config-snapshot"))
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The Secret a workload's (or a Job's) template names for `db`.
fn secret_of(object: &Value) -> String {
    let kind = config_snapshot_policy::model::kinds::find(object["kind"].as_str().unwrap_or_default()).unwrap();
    config_snapshot_policy::model::references::collect(kind.template_of(object).unwrap())
        .into_iter()
        .find(|r| r.kind == config_snapshot_policy::model::source::SourceKind::Secret)
        .map(|r| r.name)
        .unwrap_or_default()
}

fn runs(cp: &ControlPlane, kind: &str, name: &str) -> String {
    secret_of(&cp.get(NS, kind, name).unwrap())
}

/// The workloads of the story, each reading Secret `db`, with no pods
/// (nothing runs on this control plane: their old revisions are history
/// at once): four that watch it, and `legacy`, which only snapshots it.
fn workloads(cp: &ControlPlane) {
    let env = json!([{"secretRef": {"name": "db"}}]);
    let watching = json!({"config-snapshot.io/watch": "secret/db"});
    for (kind, name) in [("Deployment", "web"), ("StatefulSet", "db"), ("DaemonSet", "agent")] {
        let mut w = workload(kind, name, watching.clone(), "app:1", env.clone(), 10);
        if kind != "DaemonSet" {
            w["spec"]["replicas"] = json!(0);
        }
        cp.apply(NS, &w);
    }
    let mut legacy = workload(
        "Deployment",
        "legacy",
        json!({"config-snapshot.io/snapshot": "secret/db"}),
        "app:1",
        env.clone(),
        10,
    );
    legacy["spec"]["replicas"] = json!(0);
    cp.apply(NS, &legacy);
    // A Job fails at once without a kubelet (its deadline): history too.
    cp.apply(
        NS,
        &json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly", "annotations": watching},
        "spec": {"schedule": "0 0 1 1 *", "jobTemplate": {"spec": {"activeDeadlineSeconds": 1, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "app:1", "envFrom": env}]}}}}}}),
    );
}

/// The editor: `edit` in the namespace, and a kubeconfig of its own.
fn editor(cp: &ControlPlane) -> PathBuf {
    cp.kubectl(&["-n", NS, "create", "serviceaccount", "alice"]);
    cp.kubectl(&[
        "-n",
        NS,
        "create",
        "rolebinding",
        "alice-edit",
        "--clusterrole=edit",
        "--serviceaccount=story-revoke:alice",
    ]);
    cp.token_kubeconfig(NS, "alice")
}

/// An undo (or a CronJob's job template put back) refused, naming the
/// revocation: what kubectl printed.
fn refused(cp: &ControlPlane, args: &[&str], stdin: Option<&str>) -> String {
    let denied = cp
        .try_kubectl(args, stdin)
        .expect_err("a revision naming a revoked snapshot was put back");
    assert!(
        denied.contains("was revoked at") && denied.contains(&format!("by {EDITOR}")),
        "{args:?}: {denied}"
    );
    denied
}

pub fn revoke_story(cp: &ControlPlane, serve: &ServeProcess) {
    cp.namespace(NS);
    let kubeconfig = editor(cp);
    set_password(cp, LEAKED);
    workloads(cp);
    let leaked = runs(cp, "deployment", "web");
    assert!(leaked.starts_with("db-"), "pinned: {leaked}");
    cp.kubectl(&["-n", NS, "create", "job", "nightly-leaked", "--from=cronjob/nightly"]);
    eventually("the Job's deadline", 60, || {
        let job = cp.get(NS, "job", "nightly-leaked")?;
        job["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Failed" && c["status"] == "True")
            .then_some(())
    });
    assert_eq!(secret_of(&cp.get(NS, "job", "nightly-leaked").unwrap()), leaked);

    // The Secret rotated: every watcher rolls on; `legacy` does not watch.
    set_password(cp, ROTATED);
    let rotated = eventually("the watch rollouts", 60, || {
        let now = runs(cp, "deployment", "web");
        let all = [("statefulset", "db"), ("daemonset", "agent"), ("cronjob", "nightly")]
            .iter()
            .all(|(k, n)| runs(cp, k, n) == now);
        (now != leaked && all).then_some(now)
    });
    eventually("the second revisions", 60, || {
        let view = cp.objects(NS);
        (count(&view, "ReplicaSet") >= 3 && count(&view, "ControllerRevision") >= 4).then_some(())
    });
    assert_eq!(runs(cp, "deployment", "legacy"), leaked);

    // Refused while `legacy` runs the leaked snapshot: its next pod would
    // not start. Nothing is written.
    let (ok, out) = cli_as(&kubeconfig, &["revoke", "secret/db", "-n", NS]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("deployment/legacy  runs on") && out.contains("roll it forward first"),
        "{out}"
    );
    assert!(cp.get(NS, "secret", &leaked).is_some(), "refused, yet deleted");
    assert!(cp.get(NS, "configmap", RECORD).is_none(), "refused, yet recorded");
    // A dry run says what would go, and writes nothing either.
    cp.kubectl(&["-n", NS, "rollout", "restart", "deployment/legacy"]);
    eventually("legacy rolled forward", 30, || {
        (runs(cp, "deployment", "legacy") == rotated).then_some(())
    });
    let (ok, out) = cli_as(&kubeconfig, &["revoke", "secret/db", "-n", NS, "--dry-run"]);
    assert!(
        ok && out.contains(&format!("{leaked}  revoked")) && out.contains("dry run"),
        "{out}"
    );
    assert!(cp.get(NS, "secret", &leaked).is_some(), "a dry run deleted");

    // Revoked, by the editor with their own rights.
    let (ok, out) = cli_as(&kubeconfig, &["revoke", "secret/db", "-n", NS]);
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("{rotated}  kept")) && out.contains("revoked 1 snapshots of secret/db"),
        "{out}"
    );
    for secret in [LEAKED, ROTATED] {
        let b64 = base64::engine::general_purpose::STANDARD.encode(secret);
        assert!(
            !out.contains(secret) && !out.contains(&b64),
            "a value in the output: {out}"
        );
    }
    assert!(cp.get(NS, "secret", &leaked).is_none(), "the leaked snapshot is gone");
    assert!(cp.get(NS, "secret", &rotated).is_some(), "the current one stays");
    let record = cp.get(NS, "configmap", RECORD).expect("the record");
    let entries: Value =
        serde_json::from_str(record["metadata"]["annotations"][REVOCATIONS].as_str().unwrap()).unwrap();
    assert_eq!(entries[0]["source"], "secret/db");
    assert_eq!(entries[0]["by"], EDITOR);
    assert_eq!(entries[0]["snapshots"], json!([leaked]));

    // Every kind's undo to the leaked revision is refused, naming it; each
    // keeps what it runs.
    for target in ["deployment/web", "statefulset/db", "daemonset/agent"] {
        refused(cp, &["-n", NS, "rollout", "undo", target], None);
    }
    let mut template = cp.get(NS, "job", "nightly-leaked").unwrap()["spec"]["template"].clone();
    let labels = template["metadata"]["labels"].as_object_mut().unwrap();
    labels.retain(|k, _| !k.contains("controller-uid") && !k.contains("job-name"));
    let put_back = json!([{"op": "replace", "path": "/spec/jobTemplate/spec/template", "value": template}]);
    refused(
        cp,
        &[
            "-n",
            NS,
            "patch",
            "cronjob",
            "nightly",
            "--type=json",
            "-p",
            &put_back.to_string(),
        ],
        None,
    );
    for (kind, name) in [
        ("deployment", "web"),
        ("statefulset", "db"),
        ("daemonset", "agent"),
        ("cronjob", "nightly"),
    ] {
        assert_eq!(runs(cp, kind, name), rotated, "{kind}/{name}");
    }
    let (ok, out) = cli_as(&kubeconfig, &["history", "deploy/web", "-n", NS]);
    assert!(ok && out.contains(&format!("snapshot {leaked} revoked at")), "{out}");

    // The Secret set back to the leaked value: nothing rolls to it, nothing
    // makes it again, and a roll forward is refused until it is rotated.
    set_password(cp, LEAKED);
    std::thread::sleep(Duration::from_secs(2 * INTERVAL_SECS + 6));
    assert!(
        cp.get(NS, "secret", &leaked).is_none(),
        "the revoked snapshot made again"
    );
    assert_eq!(runs(cp, "deployment", "web"), rotated, "rolled to revoked content");
    let denied = cp
        .try_kubectl(&["-n", NS, "rollout", "restart", "deployment/web"], None)
        .expect_err("a roll forward onto revoked content");
    assert!(denied.contains("secret/db holds content revoked at"), "{denied}");
    assert!(
        serve
            .logs()
            .contains("Deployment web not rolled out: secret/db holds content revoked at"),
        "the watch says why it did not roll"
    );
    set_password(cp, ROTATED_AGAIN);
    let again = eventually("the watch rolling on to new content", 60, || {
        let now = runs(cp, "deployment", "web");
        (now != rotated && now != leaked).then_some(now)
    });

    // The record deleted, as an editor may: the snapshot is gone all the
    // same, and the undo to it is still refused.
    cp.kubectl(&["-n", NS, "delete", "configmap", RECORD]);
    let denied = cp
        .try_kubectl(
            &["-n", NS, "rollout", "undo", "deployment/web", "--to-revision=1"],
            None,
        )
        .expect_err("an undo to a snapshot that no longer exists");
    assert!(
        denied.contains(&format!("snapshot {leaked} of secret/db no longer exists")),
        "{denied}"
    );
    assert_eq!(runs(cp, "deployment", "web"), again);

    let events = cp.kubectl(&["get", "events", "-A", "-o", "json"]);
    let logs = serve.logs();
    for secret in [LEAKED, ROTATED, ROTATED_AGAIN] {
        let b64 = base64::engine::general_purpose::STANDARD.encode(secret);
        for (what, text) in [("serve's log", &logs), ("the Events", &events)] {
            assert!(!text.contains(secret) && !text.contains(&b64), "{secret} in {what}");
        }
    }
    eprintln!("revoke story: {leaked} revoked by {EDITOR}; undo refused for every kind; {rotated}, then {again}, run");
}

use config_snapshot_policy::model::keys::REVOCATIONS;
use config_snapshot_policy::model::revocation::RECORD;
