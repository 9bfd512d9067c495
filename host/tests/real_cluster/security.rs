//! The attacks of docs/security.md, tried on the real control plane as an
//! attacker would: a label forged on config serve must not delete, reviews
//! forged by a caller without the API server's certificate, and a
//! namespaced install that `kubectl auth can-i` shows holds no rights
//! outside its namespaces.

use std::process::{Command, Stdio};

use super::*;

/// serve's service account, as RBAC names it.
const SERVE_SA: &str = "system:serviceaccount:config-snapshot:config-snapshot";

/// A ConfigMap that carries our label and nothing else of ours.
fn labelled(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "config-snapshot"}},
           "data": {"k": "v"}})
}

/// Waits for `passes` more periodic passes of serve's.
fn passes(serve: &ServeProcess, passes: f64) {
    let start = serve.metric("config_snapshot_resync_passes_total");
    eventually("serve's periodic passes", 60, || {
        (serve.metric("config_snapshot_resync_passes_total") >= start + passes).then_some(())
    });
}

/// Config that only carries our label is never deleted: unused, used only
/// by a CronJob, in an excluded namespace, or with a made-up signature.
/// Each is counted and reported instead. On c7d6a24 the sweep deleted the
/// first three.
/// serve runs with the shortest orphan grace period accepted (1 m), and
/// the story waits it out, so that only the proof stands between the
/// forgeries and the sweep.
fn forged_label_story(cp: &ControlPlane, serve: &mut ServeProcess, kubeconfig: &Path) {
    serve.restart(kubeconfig, &serve_flags(r#"{"orphanGracePeriod": "1m"}"#));
    serve.wait_ready();
    let ns = "attack-label";
    cp.namespace(ns);
    cp.apply(ns, &labelled("unused"));
    cp.apply(ns, &labelled("cron-only"));
    let mut signed = labelled("app-0123456789");
    signed["immutable"] = json!(true);
    signed["metadata"]["annotations"] = json!({
        "config-snapshot.io/source": "configmap/app",
        "config-snapshot.io/signature": "v1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
    });
    cp.apply(ns, &signed);
    cp.apply("kube-system", &labelled("attack-kube-system"));
    let cron = json!({
        "apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "nightly"},
        "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox:1",
                            "envFrom": [{"configMapRef": {"name": "cron-only"}}]}]}}}}}
    });
    cp.apply(ns, &cron);
    // Past the grace period, then three passes that judge them.
    std::thread::sleep(std::time::Duration::from_secs(61));
    passes(serve, 3.0);
    for (namespace, name) in [
        (ns, "unused"),
        (ns, "cron-only"),
        (ns, "app-0123456789"),
        ("kube-system", "attack-kube-system"),
    ] {
        assert!(
            cp.get(namespace, "configmap", name).is_some(),
            "{namespace}/{name}: a forged label got config deleted"
        );
    }
    assert!(
        serve.metric("config_snapshot_unproven_snapshots") >= 3.0,
        "the forgeries are counted:\n{}",
        serve.ops_get("/metrics").map(|m| m.1).unwrap_or_default()
    );
    let events: Value =
        serde_json::from_str(&cp.kubectl(&["-n", ns, "get", "events.events.k8s.io", "-o", "json"])).unwrap();
    let warned: BTreeSet<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "UnprovenSnapshot" && e["type"] == "Warning")
        .filter_map(|e| e["regarding"]["name"].as_str())
        .collect();
    for name in ["unused", "cron-only", "app-0123456789"] {
        assert!(
            warned.contains(name),
            "no UnprovenSnapshot Event for {name}: {warned:?}"
        );
    }
    // Nothing is reported in the excluded namespace: serve does not look.
    let system = cp.kubectl(&["-n", "kube-system", "get", "events.events.k8s.io", "-o", "json"]);
    assert!(!system.contains("UnprovenSnapshot"));
    // Nor does it hold anything of it: its watches leave excluded
    // namespaces out (field selector), so kube-system's objects never
    // reach its cache.
    let logs = serve.logs();
    let held = logs
        .lines()
        .find(|l| l.contains("cache applied") && l.contains("\"kube-system\""));
    assert!(held.is_none(), "serve cached an object of kube-system: {held:?}");
    cp.kubectl(&["-n", "kube-system", "delete", "configmap", "attack-kube-system"]);
}

/// A forged review for kube-system that would make serve write a snapshot
/// of a Secret there and answer with a name derived from its content.
fn forged_review() -> String {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "forged-1",
            "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
            "name": "oracle", "namespace": "kube-system", "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:attack:curl"},
            "object": workload(
                "Deployment",
                "oracle",
                json!({"config-snapshot.io/snapshot": "*"}),
                "x:1",
                json!([{"secretRef": {"name": "planted"}}]),
                1,
            ),
            "dryRun": false, "options": {}
        }
    })
    .to_string()
}

/// POSTs `body` to serve's webhook with curl, showing `cert` (a name in the
/// control plane's directory: `<name>.crt` and `<name>.key`) if given;
/// `Err`: the call got no HTTP answer.
/// The caller knows the door's path (a leak, or the API server's stolen
/// certificate): what is behind the door is tried.
pub(crate) fn post(cp: &ControlPlane, serve: &ServeProcess, body: &str, cert: Option<&str>) -> Result<String, String> {
    post_to(cp, serve, &super::door_path(cp), body, cert)
}

/// [`post`] to `path`.
pub(crate) fn post_to(
    cp: &ControlPlane,
    serve: &ServeProcess,
    path: &str,
    body: &str,
    cert: Option<&str>,
) -> Result<String, String> {
    let url = format!("https://{}{path}", serve.webhook);
    let mut args: Vec<String> = ["-sS", "-k", "--max-time", "10", "-H", "Content-Type: application/json"]
        .map(String::from)
        .to_vec();
    if let Some(name) = cert {
        args.push("--cert".into());
        args.push(cp.dir.join(format!("{name}.crt")).display().to_string());
        args.push("--key".into());
        args.push(cp.dir.join(format!("{name}.key")).display().to_string());
    }
    args.extend(["--data-binary".into(), "@-".into(), url]);
    let mut child = Command::new("curl")
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("curl");
    use std::io::Write as _;
    child.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

/// With the mTLS component's `--client-ca` (the CA of the certificate
/// kube-apiserver shows webhooks, e2e-tests/cluster/control-plane.sh): the
/// API server's admissions go on; a forged review without a certificate,
/// or with another certificate of this cluster, gets no answer; and even
/// with the API server's certificate, a review for an excluded namespace
/// writes nothing. On c7d6a24 the first forged review wrote a snapshot
/// Secret in kube-system and answered with its content-derived name.
fn forged_review_story(cp: &ControlPlane, serve: &mut ServeProcess, kubeconfig: &Path) {
    let ca = cp.dir.join("webhook-ca.crt").display().to_string();
    let mut flags = serve_flags("{}");
    flags.push("--client-ca");
    flags.push(Box::leak(ca.into_boxed_str()));
    serve.restart(kubeconfig, &flags);
    serve.wait_ready();
    let planted = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "planted"},
                         "stringData": {"password": CANARY}});
    cp.apply("kube-system", &planted);

    let ns = "attack-review";
    cp.namespace(ns);
    cp.apply(ns, &config_map("app", json!({"k": "v"})));
    // The API server shows its certificate: admissions go on.
    eventually("an admission through mTLS", 60, || {
        let d = workload(
            "Deployment",
            "web",
            json!({"config-snapshot.io/snapshot": "*"}),
            "x:1",
            json!([{"configMapRef": {"name": "app"}}]),
            1,
        );
        cp.apply(ns, &d);
        env_ref(&cp.get(ns, "deployment", "web")?)
            .starts_with("app-")
            .then_some(())
    });

    let body = forged_review();
    let refused = post(cp, serve, &body, None);
    assert!(refused.is_err(), "answered a caller without a certificate: {refused:?}");
    let refused = post(cp, serve, &body, Some("admin"));
    assert!(
        refused.is_err(),
        "answered a certificate kube-apiserver does not show: {refused:?}"
    );
    // The API server's own certificate, stolen: still nothing written.
    let answer: Value = serde_json::from_str(&post(cp, serve, &body, Some("webhook-client")).expect("an answer"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(answer["response"]["allowed"], true);
    assert!(answer["response"].get("patch").is_none(), "{answer}");
    let text = answer.to_string();
    assert!(!text.contains("planted-"), "a snapshot name is in the answer: {text}");
    let labelled = cp.kubectl(&[
        "-n",
        "kube-system",
        "get",
        "secrets,configmaps",
        "-l",
        "app.kubernetes.io/managed-by=config-snapshot",
        "-o",
        "name",
    ]);
    assert_eq!(labelled.trim(), "", "serve wrote in kube-system");
    cp.kubectl(&["-n", "kube-system", "delete", "secret", "planted"]);
    serve.restart(kubeconfig, &serve_flags("{}"));
    serve.wait_ready();
}

pub fn attack_stories(cp: &ControlPlane, serve: &mut ServeProcess, kubeconfig: &Path) {
    forged_label_story(cp, serve, kubeconfig);
    forged_review_story(cp, serve, kubeconfig);
    // The second round (docs/security.md), as most installs run: no mTLS,
    // for a caller that learned the door's path.
    super::forged::stories(cp, serve);
    // The third: the door, and what it leaves bounded; it rotates the key.
    super::door::door_story(cp, serve, kubeconfig);
    super::keys::key_lifecycle_story(cp, serve, kubeconfig);
    // eff3694's review: what the cache holds of a Secret, and a key planted
    // while its guard is away.
    super::cached::cached_secret_story(cp);
    super::keys::unguarded_key_story(cp, serve);
    // The fourth: serve's own token, stolen (the identity guard).
    super::identity::stolen_token_story(cp);
}

/// The objects `kubectl kustomize` renders from a directory of deploy/.
fn rendered(cp: &ControlPlane, dir: &str) -> Vec<Value> {
    let text = cp.kubectl(&["kustomize", &root().join(dir).display().to_string()]);
    let path = cp.dir.join("rendered.yaml");
    std::fs::write(&path, text).unwrap();
    config_snapshot::kubewarden::admission_review::read_objects(&path).unwrap()
}

/// `kubectl auth can-i` as serve: whether it may.
fn can(cp: &ControlPlane, args: &[&str]) -> bool {
    let mut all = vec!["auth", "can-i", "--as", SERVE_SA];
    all.extend_from_slice(args);
    match cp.try_kubectl(&all, None) {
        Ok(out) => out.trim() == "yes",
        Err(e) if e.contains("no") => false,
        Err(e) => panic!("{e}"),
    }
}

/// The namespaced install (deploy/overlays/namespaced, rendered by kubectl's
/// kustomize): serve holds no rights outside team-a and team-b, as
/// `kubectl auth can-i` shows, and works there. Runs last: it takes the
/// cluster-wide binding away.
pub fn namespaced_story(cp: &ControlPlane, serve: &mut ServeProcess, kubeconfig: &Path) {
    let objects = rendered(cp, "deploy/overlays/namespaced");
    // Cluster-wide: the signing key's guard, read by name, and its own
    // webhook configuration, kept on the door's path, by name; nothing else.
    let cluster_wide: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "ClusterRole").collect();
    assert_eq!(cluster_wide.len(), 1, "{cluster_wide:?}");
    assert_eq!(
        cluster_wide[0]["rules"],
        json!([{"apiGroups": ["admissionregistration.k8s.io"],
                "resources": ["validatingadmissionpolicies", "validatingadmissionpolicybindings"],
                "resourceNames": ["config-snapshot-signing-key"], "verbs": ["get"]},
               {"apiGroups": ["admissionregistration.k8s.io"],
                "resources": ["mutatingwebhookconfigurations"],
                "resourceNames": ["config-snapshot"], "verbs": ["get", "patch"]}]),
        "the namespaced install grants nothing cluster-wide but the guard's read and its webhook's path"
    );
    for ns in ["team-a", "team-b", "team-c"] {
        cp.namespace(ns);
    }
    for object in objects.iter().filter(|o| {
        ["Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"].contains(&o["kind"].as_str().unwrap_or_default())
    }) {
        let ns = object["metadata"]["namespace"].as_str().unwrap_or("default");
        cp.apply(ns, object);
    }
    // Its identity guard, for these namespaces only: tried while the
    // cluster-wide grant still stands, so that the guard alone refuses.
    let guard = objects
        .iter()
        .find(|o| o["kind"] == "ValidatingAdmissionPolicy" && o["metadata"]["name"] == "config-snapshot-identity")
        .expect("the identity guard");
    super::identity::namespaced_guard_story(cp, guard);
    cp.kubectl(&["delete", "clusterrolebinding", "config-snapshot"]);
    for (verb, resource, ns, expected) in [
        ("delete", "configmaps", "team-a", true),
        ("list", "secrets", "team-b", true),
        ("list", "secrets", "team-c", false),
        ("delete", "configmaps", "team-c", false),
        ("list", "secrets", "kube-system", false),
        ("get", "secrets/other", "config-snapshot", false),
        ("get", "secrets/config-snapshot-signing-key", "config-snapshot", true),
    ] {
        assert_eq!(
            can(cp, &[verb, resource, "-n", ns]),
            expected,
            "can serve {verb} {resource} in {ns}?"
        );
    }
    // Its Namespace, for the uid that anchors shared snapshots: a Role
    // grants the read of its own namespace only, as the API server
    // authorizes the real request (not only as `can-i` asks).
    let get_namespace = |ns: &str| cp.try_kubectl(&["get", "namespace", ns, "--as", SERVE_SA], None);
    assert!(get_namespace("team-a").is_ok(), "serve reads team-a's Namespace");
    let refused = get_namespace("team-c").expect_err("nor team-c's");
    assert!(refused.contains("forbidden"), "{refused}");
    assert!(!can(cp, &["list", "namespaces"]));
    assert!(!can(cp, &["list", "secrets", "--all-namespaces"]));
    assert!(!can(cp, &["list", "configmaps", "--all-namespaces"]));
    assert!(can(
        cp,
        &["get", "validatingadmissionpolicies/config-snapshot-signing-key"]
    ));
    assert!(!can(cp, &["get", "validatingadmissionpolicies/another"]));
    assert!(can(cp, &["patch", "mutatingwebhookconfigurations/config-snapshot"]));
    assert!(!can(cp, &["patch", "mutatingwebhookconfigurations/another"]));
    assert!(!can(cp, &["create", "mutatingwebhookconfigurations"]));

    // serve as the overlay runs it: watching team-a and team-b only (a
    // cluster-wide watch would be refused and it would never be ready).
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let namespaces = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|a| a.as_str()?.strip_prefix("--namespaces="))
        .expect("--namespaces")
        .to_string();
    let mut flags = serve_flags("{}");
    flags.push("--namespaces");
    flags.push(Box::leak(namespaces.into_boxed_str()));
    serve.restart(kubeconfig, &flags);
    serve.wait_ready();
    let webhook = objects
        .iter()
        .find(|o| o["kind"] == "MutatingWebhookConfiguration")
        .unwrap()
        .clone();
    register(cp, serve, webhook);

    for ns in ["team-a", "team-c"] {
        cp.apply(ns, &config_map("app", json!({"mode": "blue"})));
    }
    let web = workload(
        "Deployment",
        "web",
        json!({"config-snapshot.io/watch": "app"}),
        "nginx:1",
        json!([{"configMapRef": {"name": "app"}}]),
        10,
    );
    let blue = eventually("the namespaced webhook", 60, || {
        cp.apply("team-a", &web);
        let got = env_ref(&cp.get("team-a", "deployment", "web")?);
        got.starts_with("app-").then_some(got)
    });
    cp.apply("team-a", &config_map("app", json!({"mode": "green"})));
    eventually("the watch rollout in team-a", 60, || {
        let got = env_ref(&cp.get("team-a", "deployment", "web")?);
        (got.starts_with("app-") && got != blue).then_some(())
    });
    cp.apply("team-c", &web);
    cp.apply("team-c", &labelled("unused"));
    passes(serve, 2.0);
    assert_eq!(
        env_ref(&cp.get("team-c", "deployment", "web").unwrap()),
        "app",
        "team-c is not serve's"
    );
    assert!(cp.get("team-c", "configmap", "unused").is_some());
    let logs = serve.logs();
    assert!(!logs.contains("watch failed"), "a watch was refused:\n{logs}");
    no_dangling(&cp.objects("team-a"), "in the namespaced install");
}
