//! Helm, the real CLI, on the real control plane: config-snapshot's own
//! chart (deploy/helm/config-snapshot) renders what the kustomize install
//! does and installs, upgrades and uninstalls cleanly; and a user's chart
//! (e2e-tests/helm/app) is installed, upgraded, rolled back and uninstalled
//! with serve answering, as a team that ships with helm would.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use super::{count, effective, eventually, no_dangling, root, snapshots, ControlPlane, INTERVAL_SECS};

impl ControlPlane {
    /// Runs helm against this control plane as the cluster admin, with its
    /// caches and release store under the control plane's directory.
    pub(crate) fn try_helm(&self, args: &[&str]) -> Result<String, String> {
        let home = self.dir.join("helm");
        let out = std::process::Command::new(&self.helm)
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .current_dir(root())
            .output()
            .map_err(|e| format!("helm {args:?} did not run: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(format!(
                "helm {args:?}: {}\n{stdout}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    pub(crate) fn helm(&self, args: &[&str]) -> String {
        self.try_helm(args).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// Objects by `kind namespace/name`. A cluster-scoped object has no
/// namespace: the API server drops one given (kustomize's namespace
/// transformer sets it on kinds it does not know to be cluster-scoped,
/// such as ValidatingAdmissionPolicy).
fn by_identity(text: &str) -> BTreeMap<String, Value> {
    const CLUSTER_SCOPED: [&str; 6] = [
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ];
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .map(|mut o: Value| {
            if CLUSTER_SCOPED.contains(&o["kind"].as_str().unwrap_or_default()) {
                o["metadata"].as_object_mut().unwrap().remove("namespace");
            }
            let key = format!(
                "{} {}/{}",
                o["kind"].as_str().unwrap_or_default(),
                o["metadata"]["namespace"].as_str().unwrap_or_default(),
                o["metadata"]["name"].as_str().unwrap_or_default()
            );
            (key, o)
        })
        .collect()
}

/// `helm template` of the chart agrees with `kubectl kustomize` of the
/// install it stands for, object for object and field for field; the
/// additions are the settings checksum on serve's pod template (so that
/// `helm upgrade` of settings restarts serve, which reads them at start)
/// and helm's `keep` on the signing key's guard (so that `helm uninstall`
/// leaves it with the key it guards). A release in another namespace
/// renders what the namespace overlay does.
pub fn chart_renders_what_kustomize_does(cp: &ControlPlane) {
    let ca = format!("clientCA={}", root().join("deploy/overlays/mtls/ca.crt").display());
    let cases: [(&str, &str, Vec<&str>); 6] = [
        ("deploy/serve", "config-snapshot", vec![]),
        (
            "deploy/overlays/namespaced",
            "config-snapshot",
            vec!["--set", "namespaces={team-a,team-b}"],
        ),
        ("deploy/overlays/mtls", "config-snapshot", vec!["--set-file", &ca]),
        (
            "deploy/overlays/monitoring",
            "config-snapshot",
            vec![
                "--set",
                "monitoring.serviceMonitor.enabled=true",
                "--set",
                "monitoring.prometheusRule.enabled=true",
                "--set",
                "monitoring.dashboard.enabled=true",
            ],
        ),
        (
            "deploy/overlays/cert-manager",
            "config-snapshot",
            vec!["--set", "certificate.certManager=true"],
        ),
        ("deploy/overlays/namespace", "platform-system", vec![]),
    ];
    for (dir, namespace, extra) in cases {
        let kustomized = by_identity(&cp.kubectl(&["kustomize", root().join(dir).to_str().unwrap()]));
        // helm template assumes Kubernetes 1.20 unless told; the chart
        // needs 1.30.
        let mut args = vec![
            "template",
            "config-snapshot",
            "deploy/helm/config-snapshot",
            "--namespace",
            namespace,
            "--kube-version",
            "1.34.0",
            "--set",
            "createNamespace=true",
        ];
        args.extend(extra.iter().copied());
        let mut rendered = by_identity(&cp.helm(&args));
        let deployment = rendered
            .get_mut(&format!("Deployment {namespace}/config-snapshot"))
            .expect("the chart renders serve's Deployment");
        let annotations = deployment["spec"]["template"]["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("annotations")
            .unwrap_or_default();
        assert!(
            annotations["checksum/settings"].is_string() && annotations.as_object().unwrap().len() == 1,
            "{dir}: the chart's only addition is the settings checksum: {annotations}"
        );
        let mut kept = Vec::new();
        for (key, object) in rendered.iter_mut() {
            // get_mut, not indexing: `value["annotations"]` on a mutable
            // object inserts a null where there was none.
            let Some(annotations) = object["metadata"]
                .get_mut("annotations")
                .and_then(|a| a.as_object_mut())
            else {
                continue;
            };
            if annotations.remove("helm.sh/resource-policy").is_some() {
                kept.push(key.clone());
            }
            if annotations.is_empty() {
                object["metadata"].as_object_mut().unwrap().remove("annotations");
            }
        }
        assert_eq!(
            kept,
            [
                format!("Namespace /{namespace}"),
                "ValidatingAdmissionPolicy /config-snapshot-signing-key".to_string(),
                "ValidatingAdmissionPolicyBinding /config-snapshot-signing-key".to_string()
            ],
            "{dir}: helm uninstall keeps the key's namespace and guard, and nothing else"
        );
        let (only_kustomize, only_helm): (Vec<_>, Vec<_>) = (
            kustomized.keys().filter(|k| !rendered.contains_key(*k)).collect(),
            rendered.keys().filter(|k| !kustomized.contains_key(*k)).collect(),
        );
        assert!(
            only_kustomize.is_empty() && only_helm.is_empty(),
            "{dir}: objects only kustomize renders {only_kustomize:?}, only the chart {only_helm:?}"
        );
        for (key, object) in &kustomized {
            assert_eq!(
                &rendered[key], object,
                "{dir}: the chart renders {key} differently (left: helm template, right: kubectl kustomize)"
            );
        }
        eprintln!(
            "helm template agrees with kubectl kustomize {dir}: {} objects",
            kustomized.len()
        );
    }
    // values.schema.json refuses a value of the wrong type and a key the
    // chart does not have (a typo would otherwise be ignored); the chart
    // refuses a cluster older than 1.30.
    let template = |extra: &[&str]| {
        let mut args = vec![
            "template",
            "config-snapshot",
            "deploy/helm/config-snapshot",
            "--kube-version",
            "1.34.0",
        ];
        args.extend(extra);
        cp.try_helm(&args)
    };
    for (bad, says) in [
        (vec!["--set", "replicas=two"], "want integer"),
        (
            vec!["--set", "replica=3"],
            "additional properties 'replica' not allowed",
        ),
        (vec!["--set", "failurePolicy=Sometimes"], "failurePolicy"),
        (vec!["--set", "resyncInterval=5 minutes"], "resyncInterval"),
        (vec!["--set", "networkPolicy.apiServerPorts={0}"], "apiServerPorts"),
        // A misspelt setting, or a word the parser does not take: refused by
        // helm, before serve could crash-loop on it at the upgrade.
        (
            vec!["--set", "settings.watchByDefalut=true"],
            "additional properties 'watchByDefalut' not allowed",
        ),
        (vec!["--set", "settings.onMissingSource=sometimes"], "onMissingSource"),
    ] {
        let e = template(&bad).expect_err("the schema refuses it");
        assert!(e.contains(says), "{bad:?}: {e}");
    }
    // `excludedSources`: helm takes exactly the tokens serve's parser does.
    for token in [
        "app",
        "configmap/app",
        "secret/db.creds-1",
        "configmap/*",
        "secret/*",
        "*",
        "App",
        "deployment/app",
        "configmap/",
        "-app",
        "a..b",
        "configmap/app/x",
        "secret/**",
    ] {
        let value = format!("settings.excludedSources=[{}]", serde_json::json!(token));
        let helm_takes = template(&["--set-json", &value]).is_ok();
        let parser_takes = config_snapshot_policy::model::settings::Settings::from_json(
            serde_json::json!({"excludedSources": [token]}).to_string().as_bytes(),
        )
        .is_ok();
        assert_eq!(helm_takes, parser_takes, "excludedSources {token:?}");
    }
    // The NetworkPolicy can be left out, and let serve reach the API server
    // on the port a cluster uses (minikube's 8443); the server takes it.
    let objects = |extra: &[&str]| by_identity(&template(extra).unwrap());
    let policy = "NetworkPolicy config-snapshot/config-snapshot";
    assert!(objects(&["-n", "config-snapshot"]).contains_key(policy));
    assert!(!objects(&["-n", "config-snapshot", "--set", "networkPolicy.enabled=false"]).contains_key(policy));
    let minikube = objects(&["-n", "config-snapshot", "--set", "networkPolicy.apiServerPorts={8443}"]);
    assert_eq!(
        minikube[policy]["spec"]["egress"][0]["ports"],
        json!([{"port": 8443, "protocol": "TCP"}]),
        "{}",
        minikube[policy]
    );
    cp.namespace("netpol-check");
    let mut dry = minikube[policy].clone();
    dry["metadata"]["namespace"] = json!("netpol-check");
    cp.try_kubectl(&["apply", "--dry-run=server", "-f", "-"], Some(&dry.to_string()))
        .expect("the API server takes the NetworkPolicy with the port given");
    let old = cp
        .try_helm(&[
            "template",
            "config-snapshot",
            "deploy/helm/config-snapshot",
            "--kube-version",
            "1.29.0",
        ])
        .expect_err("the chart refuses Kubernetes 1.29");
    assert!(old.contains("kubeVersion"), "{old}");
}

/// The chart installs, upgrades and uninstalls with the real helm: a
/// namespaced install under its own release name (beside the install the
/// other tests use), its rights as `kubectl auth can-i` sees them, an
/// upgrade of settings restarting serve and an upgrade of nothing
/// changing nothing, and nothing left after `helm uninstall`.
pub fn chart_installs_upgrades_and_uninstalls(cp: &ControlPlane) {
    let (release, ns, apps) = ("cs-helm", "cs-helm", "cs-helm-apps");
    let fullname = "cs-helm-config-snapshot";
    cp.namespace(apps);
    // The chart's default: serve makes its own certificate (no serve runs
    // on this control plane, so the webhook's caBundle stays empty).
    let apps_value = format!("namespaces={{{apps}}}");
    let install = ["--namespace", ns, "--set", &apps_value];
    let mut args = vec!["install", release, "deploy/helm/config-snapshot", "--create-namespace"];
    args.extend(install);
    cp.helm(&args);
    let sa = format!("system:serviceaccount:{ns}:{fullname}");
    let can = |verb: &str, resource: &str, namespace: &str| {
        cp.try_kubectl(&["auth", "can-i", verb, resource, "-n", namespace, "--as", &sa], None)
            .is_ok_and(|out| out.trim() == "yes")
    };
    assert!(
        can("delete", "secrets", apps),
        "serve may collect snapshots where it acts"
    );
    assert!(can("patch", "deployments.apps", apps));
    assert!(!can("delete", "secrets", "default"), "and nowhere else");
    assert!(!can("get", "secrets", "kube-system"));
    // Its Lease, by name (`create` cannot be).
    let lease = format!("leases.coordination.k8s.io/{fullname}");
    assert!(can("patch", &lease, ns), "its Lease");
    assert!(can("create", "leases.coordination.k8s.io", ns));
    assert!(
        !can("patch", "leases.coordination.k8s.io/another", ns),
        "no other Lease"
    );
    let webhook: Value =
        serde_json::from_str(&cp.kubectl(&["get", "mutatingwebhookconfiguration", fullname, "-o", "json"])).unwrap();
    assert_eq!(
        webhook["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]["values"],
        json!([apps])
    );
    assert_eq!(webhook["webhooks"][0]["clientConfig"]["service"]["namespace"], ns);

    // serve's ReplicaSets, by the real Deployment controller.
    let replica_sets = || -> usize {
        let out = cp.kubectl(&["-n", ns, "get", "replicasets", "-o", "json"]);
        serde_json::from_str::<Value>(&out).unwrap()["items"]
            .as_array()
            .unwrap()
            .len()
    };
    eventually("serve's first ReplicaSet", 30, || (replica_sets() == 1).then_some(()));

    // New settings restart serve (it reads them at start): one rollout.
    let mut args = vec!["upgrade", release, "deploy/helm/config-snapshot"];
    args.extend(install);
    args.extend(["--set", "settings.onSnapshotFailure=warn"]);
    cp.helm(&args);
    let settings = cp.get(ns, "configmap", &format!("{fullname}-settings")).unwrap();
    let parsed: Value = serde_json::from_str(settings["data"]["settings.json"].as_str().unwrap()).unwrap();
    // The value set, beside the chart's default settle.
    assert_eq!(parsed, json!({"onSnapshotFailure": "warn", "settle": "5s"}));
    eventually("serve restarted on its new settings", 30, || {
        (replica_sets() == 2).then_some(())
    });
    // The same values again: nothing rolls.
    cp.helm(&args);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(replica_sets(), 2, "an upgrade that changes nothing rolls nothing");

    cp.helm(&["uninstall", release, "--namespace", ns, "--wait"]);
    assert!(cp
        .try_kubectl(&["get", "mutatingwebhookconfiguration", fullname], None)
        .is_err());
    let left = cp.kubectl(&[
        "-n",
        apps,
        "get",
        "roles,rolebindings",
        "-l",
        "app.kubernetes.io/name=config-snapshot",
        "-o",
        "name",
    ]);
    assert!(left.trim().is_empty(), "helm uninstall leaves no grant behind: {left}");
    assert!(!can("delete", "secrets", apps));
    eventually("serve's Deployment and its ReplicaSets gone", 60, || {
        (replica_sets() == 0 && cp.get(ns, "deployment", fullname).is_none()).then_some(())
    });
}

/// A user's chart with a ConfigMap, a Secret and a watched Deployment,
/// driven with helm as its team would, serve answering: install pins the
/// config; an upgrade with a changed value rolls once; `helm rollback`
/// brings the old config back and makes no snapshot; an upgrade with the
/// same values changes nothing; `helm uninstall` leaves no snapshot.
pub fn user_chart_story(cp: &ControlPlane) {
    let ns = "story-helm";
    cp.namespace(ns);
    let chart = "e2e-tests/helm/app";
    let greeting = |view: &config_snapshot::replay::view::Objects| {
        effective(view, "Deployment", "web", ns, "configmap/app-config")["greeting"].clone()
    };
    let revisions = |view: &config_snapshot::replay::view::Objects| count(view, "ReplicaSet");
    let settled = |what: &str, replica_sets: usize| {
        eventually(what, 30, || (revisions(&cp.objects(ns)) == replica_sets).then_some(()));
        // Longer than the storm guard and a resync: nothing more rolls.
        std::thread::sleep(Duration::from_secs(2 * INTERVAL_SECS + 6));
        cp.objects(ns)
    };

    cp.helm(&["install", "app", chart, "--namespace", ns]);
    let view = settled("the first ReplicaSet", 1);
    let web = cp.get(ns, "deployment", "web").unwrap();
    let first = super::env_ref(&web);
    assert!(
        first.starts_with("app-config-"),
        "the Deployment helm installed runs a snapshot: {web}"
    );
    assert_eq!(greeting(&view), json!("hello"));
    let installed = snapshots(&view);
    assert_eq!(installed.len(), 2, "one snapshot per source: {installed:?}");

    cp.helm(&["upgrade", "app", chart, "--namespace", ns, "--set", "greeting=bonjour"]);
    let view = settled("the upgrade's rollout", 2);
    assert_eq!(revisions(&view), 2, "an upgrade with a changed value rolls once");
    assert_eq!(greeting(&view), json!("bonjour"));
    let upgraded = snapshots(&view);
    assert_eq!(
        upgraded.len(),
        3,
        "one new snapshot, of the changed source: {upgraded:?}"
    );
    no_dangling(&view, "after helm upgrade");

    cp.helm(&["rollback", "app", "1", "--namespace", ns]);
    let view = eventually("helm rollback's config", 30, || {
        let view = cp.objects(ns);
        (greeting(&view) == json!("hello")).then_some(view)
    });
    assert_eq!(
        super::env_ref(&cp.get(ns, "deployment", "web").unwrap()),
        first,
        "helm rollback runs revision 1's snapshot again"
    );
    std::thread::sleep(Duration::from_secs(2 * INTERVAL_SECS + 6));
    let view_later = cp.objects(ns);
    assert_eq!(greeting(&view_later), json!("hello"), "nothing rolls it forward again");
    assert_eq!(snapshots(&view), upgraded, "helm rollback makes no snapshot");
    assert_eq!(snapshots(&view_later), upgraded);
    assert_eq!(revisions(&view_later), 2, "revision 1's ReplicaSet is current again");

    // Re-applying what is deployed: no new ReplicaSet, no new snapshot.
    cp.helm(&["upgrade", "app", chart, "--namespace", ns, "--reuse-values"]);
    std::thread::sleep(Duration::from_secs(2 * INTERVAL_SECS + 6));
    let view = cp.objects(ns);
    assert_eq!(revisions(&view), 2, "an upgrade with the same values rolls nothing");
    assert_eq!(snapshots(&view), upgraded);
    assert_eq!(greeting(&view), json!("hello"));

    cp.helm(&["uninstall", "app", "--namespace", ns, "--wait"]);
    eventually("no snapshot left after helm uninstall", 60, || {
        snapshots(&cp.objects(ns)).is_empty().then_some(())
    });
    let left = cp.kubectl(&["-n", ns, "get", "configmaps,secrets", "-o", "name"]);
    assert!(
        !left.contains("app-config") && !left.contains("app-secret"),
        "helm uninstall leaves neither source nor snapshot: {left}"
    );
}
