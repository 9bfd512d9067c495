//! Finding 6 of docs/security.md on the real control plane: the signing
//! keyring rotated, deleted while serve runs, lost, and restored from a
//! backup, with a watched Secret's workload going on through all of it; and
//! the guard that keeps anyone else from writing the key Secret.

use super::*;

const KEY_NS: &str = "config-snapshot";
const KEY: &str = "config-snapshot-signing-key";

/// `config-snapshot keys ARGS` as the cluster admin (a key administrator:
/// system:masters).
pub(crate) fn keys(cp: &ControlPlane, args: &[&str]) -> String {
    let (done, text) = keys_as(cp, None, args);
    assert!(done, "config-snapshot keys {args:?}: {text}");
    text
}

fn ids(cp: &ControlPlane) -> Vec<String> {
    keys(cp, &["list"])
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

fn passes(serve: &ServeProcess, passes: f64) {
    let start = serve.metric("config_snapshot_resync_passes_total");
    eventually("serve's periodic passes", 60, || {
        (serve.metric("config_snapshot_resync_passes_total") >= start + passes).then_some(())
    });
}

fn secret_ref(w: &Value) -> String {
    w["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["secretRef"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn replica_sets(cp: &ControlPlane, ns: &str) -> usize {
    count(&cp.objects(ns), "ReplicaSet")
}

/// Round 3, lower finding: `keys sign-unsigned --yes` signed every
/// well-formed look-alike in the cluster. One made after the key Secret
/// (anything unsigned made since is not a signing version's) is named and
/// left alone; `--made-before` reaches further when an operator says so.
fn sign_unsigned_story(cp: &ControlPlane) {
    use config_snapshot_policy::model::content::{snapshot_name, snapshot_object, Content};
    use config_snapshot_policy::model::source::{SourceId, SourceKind};
    let ns = "keys-lookalike";
    cp.namespace(ns);
    let content = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"mode": "planted"}})).unwrap();
    let name = snapshot_name("app", &content.hash());
    let mut lookalike = snapshot_object(&SourceId::new(SourceKind::ConfigMap, "app"), ns, &name, "1", &content);
    lookalike["metadata"].as_object_mut().unwrap().remove("namespace");
    cp.apply(ns, &lookalike);
    let signature = |cp: &ControlPlane| {
        cp.get(ns, "configmap", &name).unwrap()["metadata"]["annotations"]["config-snapshot.io/signature"].clone()
    };
    let said = keys(cp, &["sign-unsigned", "--in", ns, "--yes"]);
    assert!(said.contains(&name) && said.contains("made after the key"), "{said}");
    assert!(signature(cp).is_null(), "a look-alike made after the key was signed");
    // An operator who knows it is theirs says so.
    let later = "2099-01-01T00:00:00Z";
    let said = keys(cp, &["sign-unsigned", "--in", ns, "--made-before", later, "--yes"]);
    assert!(said.contains("signed"), "{said}");
    assert!(signature(cp).is_string());
    cp.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}

pub fn key_lifecycle_story(cp: &ControlPlane, serve: &mut ServeProcess, kubeconfig: &Path) {
    serve.restart(kubeconfig, &serve_flags("{}"));
    serve.wait_ready();
    sign_unsigned_story(cp);
    let ns = "keys";
    cp.namespace(ns);
    cp.apply(
        ns,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"}, "stringData": {"password": "one"}}),
    );
    let web = workload(
        "Deployment",
        "web",
        json!({"config-snapshot.io/watch": "secret/db"}),
        "x:1",
        json!([{"secretRef": {"name": "db"}}]),
        10,
    );
    cp.apply(ns, &web);
    let first = eventually("web on a snapshot", 30, || {
        let name = secret_ref(&cp.get(ns, "deployment", "web")?);
        (name != "db").then_some(name)
    });
    settle(cp, ns);

    // What the other stories left labelled without proof (the forged
    // labels'): the key's story changes it by its own snapshots only.
    passes(serve, 2.0);
    let forgeries = serve.metric("config_snapshot_unproven_snapshots");
    // Rotate: a new key signs; the old one still proves `first`.
    let before = ids(cp);
    keys(cp, &["rotate"]);
    let rotated = ids(cp);
    assert_eq!(rotated.len(), before.len() + 1);
    // The earlier keys, in the Secret's order of ids, all still verify.
    let sorted = |ids: &[String]| {
        let mut ids = ids.to_vec();
        ids.sort();
        ids
    };
    assert_eq!(sorted(&rotated[1..]), sorted(&before), "the earlier keys still verify");
    assert!(!before.contains(&rotated[0]), "a new key signs");
    eventually("serve to use the rotated ring", 30, || {
        serve.logs().contains("the signing keyring changed").then_some(())
    });
    passes(serve, 2.0);
    assert_eq!(
        serve.metric("config_snapshot_unproven_snapshots"),
        forgeries,
        "the rotated ring proves what the old key signed"
    );

    // A backup, as the docs say.
    let backup = cp.dir.join("signing-key-backup.yaml");
    std::fs::write(&backup, cp.kubectl(&["-n", KEY_NS, "get", "secret", KEY, "-o", "yaml"])).unwrap();

    // Deleted while serve runs: written again from the ring it holds.
    cp.kubectl(&["-n", KEY_NS, "delete", "secret", KEY]);
    eventually("the key Secret written again", 30, || {
        cp.get(KEY_NS, "secret", KEY).map(|_| ())
    });
    assert_eq!(ids(cp), rotated, "no key lost");

    // Lost for good: deleted with serve down; serve makes a new key.
    serve.stop();
    cp.kubectl(&["-n", KEY_NS, "delete", "secret", KEY]);
    serve.restart(kubeconfig, &serve_flags("{}"));
    serve.wait_ready();
    let fresh = ids(cp);
    assert_eq!(fresh.len(), 1);
    assert!(!rotated.contains(&fresh[0]));
    passes(serve, 2.0);
    assert!(
        serve.metric("config_snapshot_unproven_snapshots") > forgeries,
        "`first` is unproven under the new key (kept, never swept)"
    );
    // Users' work goes on. An unchanged re-apply rolls nothing.
    let sets = replica_sets(cp, ns);
    cp.try_kubectl(
        &["apply", "--server-side", "--force-conflicts", "-n", ns, "-f", "-"],
        Some(&web.to_string()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    settle(cp, ns);
    assert_eq!(secret_ref(&cp.get(ns, "deployment", "web").unwrap()), first);
    assert_eq!(replica_sets(cp, ns), sets, "a re-apply rolled");
    // An edit of the watched Secret rolls once.
    cp.try_kubectl(
        &[
            "-n",
            ns,
            "patch",
            "secret",
            "db",
            "--type=merge",
            "-p",
            r#"{"stringData":{"password":"two"}}"#,
        ],
        None,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let second = eventually("the edit's rollout", 60, || {
        let name = secret_ref(&cp.get(ns, "deployment", "web")?);
        (name != first).then_some(name)
    });
    settle(cp, ns);
    assert_eq!(replica_sets(cp, ns), sets + 1, "one rollout for one edit");
    // `rollout undo` brings the old config back; nothing dangles.
    cp.kubectl(&["-n", ns, "rollout", "undo", "deployment/web"]);
    eventually("the undo", 30, || {
        (secret_ref(&cp.get(ns, "deployment", "web")?) == first).then_some(())
    });
    assert!(cp.get(ns, "secret", &first).is_some(), "the old snapshot dangles");
    assert!(cp.get(ns, "secret", &second).is_some());
    no_dangling(&cp.objects(ns), "after the key was lost");

    // Restored from the backup: the old keys verify again.
    keys(cp, &["restore", "-f", backup.to_str().unwrap()]);
    let restored = ids(cp);
    assert_eq!(restored[0], fresh[0], "the current key stays current");
    assert!(rotated.iter().all(|k| restored.contains(k)), "{restored:?}");
    eventually("serve to use the restored ring", 30, || {
        (serve.logs().matches("the signing keyring changed").count() >= 1).then_some(())
    });
    passes(serve, 3.0);
    assert_eq!(
        serve.metric("config_snapshot_unproven_snapshots"),
        forgeries,
        "proven again after the restore"
    );

    // The guard: someone with edit rights in serve's namespace cannot plant,
    // change or delete the key; other Secrets are theirs as before.
    cp.kubectl(&[
        "-n",
        KEY_NS,
        "create",
        "rolebinding",
        "mallory-edit",
        "--clusterrole=edit",
        "--user=mallory",
    ]);
    let as_mallory = |args: &[&str]| {
        let mut all = vec!["--as=mallory", "-n", KEY_NS];
        all.extend_from_slice(args);
        cp.try_kubectl(&all, None)
    };
    let denied = as_mallory(&["delete", "secret", KEY]).expect_err("the guard denies");
    assert!(denied.contains("only config-snapshot's ServiceAccount"), "{denied}");
    let denied = as_mallory(&[
        "patch",
        "secret",
        KEY,
        "--type=merge",
        "-p",
        r#"{"data":{"key":"cGxhbnRlZC1rZXktb2YtMzItYnl0ZXMtLS0tLS0tLS0t"}}"#,
    ])
    .expect_err("the guard denies");
    assert!(denied.contains("only config-snapshot's ServiceAccount"), "{denied}");
    as_mallory(&["create", "secret", "generic", "mallorys-own", "--from-literal=a=b"]).expect("other Secrets are hers");
    as_mallory(&["delete", "secret", "mallorys-own"]).unwrap();

    // `keys check` says so, as Kubernetes judges it; a cluster admin may.
    let (may, said) = keys_as(cp, Some("mallory"), &["check"]);
    assert!(!may && said.contains("the guard refuses you"), "{said}");
    assert!(said.contains("you are \"mallory\""), "{said}");
    assert!(keys(cp, &["check"]).contains("you may manage it"));
    // An admin in no group (as on EKS and GKE), named by user in the
    // chart's keyAdministratorUsers: `check` says they may, and they rotate.
    let guard = cp.helm(&[
        "template",
        "config-snapshot",
        "deploy/helm/config-snapshot",
        "--namespace",
        KEY_NS,
        "--kube-version",
        "1.34.0",
        "--show-only",
        "templates/keyguard.yaml",
        "--set",
        "keyAdministratorUsers={mallory}",
    ]);
    cp.try_kubectl(&["apply", "-f", "-"], Some(&guard)).unwrap();
    let (may, said) = eventually("the guard to let mallory by name", 30, || {
        let (may, said) = keys_as(cp, Some("mallory"), &["check"]);
        may.then_some((may, said))
    });
    assert!(may && said.contains("you may manage it"), "{said}");
    let before = ids(cp);
    let (rotated, said) = keys_as(cp, Some("mallory"), &["rotate"]);
    assert!(rotated, "{said}");
    assert_eq!(ids(cp).len(), before.len() + 1, "mallory's rotation took");
    eventually("the webhook to call the path of mallory's key", 60, || {
        door_paths(cp).contains(&super::door::configured_path(cp)).then_some(())
    });
    let shipped = root().join("deploy/serve/keyguard.yaml");
    cp.try_kubectl(&["apply", "-f", shipped.to_str().unwrap()], None)
        .unwrap();
    eventually("the shipped guard to refuse mallory again", 30, || {
        let (may, said) = keys_as(cp, Some("mallory"), &["check"]);
        (!may && said.contains("the guard refuses you")).then_some(())
    });
    cp.kubectl(&["-n", KEY_NS, "delete", "rolebinding", "mallory-edit"]);
}

/// `config-snapshot keys ARGS` as `user` (impersonated by the cluster
/// admin; `None`: the admin): whether it succeeded, and what it said.
fn keys_as(cp: &ControlPlane, user: Option<&str>, args: &[&str]) -> (bool, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_config-snapshot"));
    command.arg("keys").args(args).env("KUBECONFIG", &cp.kubeconfig);
    if let Some(user) = user {
        command.env("KUBE_RS_DEBUG_IMPERSONATE_USER", user);
    }
    let out = command.output().expect("config-snapshot keys");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// Finding 7 of eff3694's review: with the guard's binding deleted, a
/// patch of the key Secret was taken at once, and within 15 s the webhook's
/// path moved to one derived from the planted key. A version written while
/// the guard is away is not taken: serve keeps its ring, the webhook's path
/// stays, and serve says why. The guard made again vouches for nothing
/// written before it; the Secret deleted then, serve writes its own ring
/// again, under the new guard.
pub fn unguarded_key_story(cp: &ControlPlane, serve: &ServeProcess) {
    let held = cp.get(KEY_NS, "secret", KEY).expect("the key Secret");
    // The paths of the hour before, this hour and the next: an hour may
    // turn during the story.
    let paths = door_paths(cp);
    let calls_held = || paths.contains(&super::door::configured_path(cp));
    assert!(calls_held(), "the webhook calls the current key's path");
    let taken = || serve.logs().matches("the signing keyring changed").count();
    let taken_before = taken();
    // The guard's binding is named as the Secret.
    cp.kubectl(&["delete", "validatingadmissionpolicybinding", KEY]);
    cp.kubectl(&[
        "-n",
        KEY_NS,
        "create",
        "rolebinding",
        "mallory-edit",
        "--clusterrole=edit",
        "--user=mallory",
    ]);
    // Mallory, who may edit Secrets in serve's namespace, plants a key she
    // knows once the API server has let go of the guard.
    let planted = r#"{"data":{"key":"cGxhbnRlZC1rZXktb2YtMzItYnl0ZXMtLS0tLS0tLS0t"}}"#;
    eventually("the API server to let the guard go", 30, || {
        cp.try_kubectl(
            &[
                "--as=mallory",
                "-n",
                KEY_NS,
                "patch",
                "secret",
                KEY,
                "--type=merge",
                "-p",
                planted,
            ],
            None,
        )
        .ok()
    });
    let planted_paths = door_paths(cp);
    assert!(planted_paths.iter().all(|p| !paths.contains(p)));
    // `keys check` says the guard is away, even to the cluster admin, and
    // fails: a write anyone with edit may make proves nothing.
    let (may, said) = keys_as(cp, None, &["check"]);
    assert!(
        !may && said.contains("the signing key's guard is not in force: no ValidatingAdmissionPolicyBinding"),
        "{said}"
    );
    // serve judges it: taken (as on eff3694) or not.
    eventually("serve to judge the planted version", 30, || {
        (serve.logs().contains("new version is not trusted") || taken() > taken_before).then_some(())
    });
    // Longer than the registration takes to move the path (5 s).
    std::thread::sleep(Duration::from_secs(15));
    assert!(
        calls_held(),
        "the webhook's path moved to {}",
        super::door::configured_path(cp)
    );
    assert_eq!(
        taken(),
        taken_before,
        "the planted keyring was taken:\n{}",
        serve.logs()
    );
    const UNTRUSTED: &str = "config_snapshot_untrusted_secret_version{secret=\"signing-key\"}";
    assert_eq!(serve.metric(UNTRUSTED), 1.0);
    // The guard made again: the planted version is older than it.
    for object in yaml("deploy/serve/keyguard.yaml") {
        cp.apply(KEY_NS, &object);
    }
    cp.kubectl(&["-n", KEY_NS, "annotate", "secret", KEY, "touched=after-the-guard"]);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(serve.metric(UNTRUSTED), 1.0, "taken under a guard made after it");
    assert_eq!(taken(), taken_before);
    assert!(calls_held());
    // The way back: past the new guard's settling, the Secret deleted;
    // serve writes the ring it held, trusted at its next start.
    std::thread::sleep(Duration::from_secs(7));
    cp.kubectl(&["-n", KEY_NS, "delete", "secret", KEY]);
    let again = eventually("the key Secret written again", 30, || cp.get(KEY_NS, "secret", KEY));
    assert_eq!(again["data"], held["data"], "the ring serve held");
    eventually("serve to trust its Secret again", 30, || {
        (serve.metric(UNTRUSTED) == 0.0).then_some(())
    });
    assert!(calls_held());
    cp.kubectl(&["-n", KEY_NS, "delete", "rolebinding", "mallory-edit"]);
}
