//! The kustomize components of deploy/components fit the install they
//! change: the namespaced one grants in each namespace no more than the
//! cluster-wide ClusterRole, and names the same namespaces in serve's
//! arguments, the webhook's selector, the identity guard and its Roles; the mTLS one points
//! serve's `--client-ca` at the CA it mounts. The real control plane
//! renders and applies both (host/tests/real_cluster.rs).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::Parser;
use serde_json::Value;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Sub,
}

#[derive(clap::Subcommand)]
enum Sub {
    Serve(config_snapshot::serve::Options),
}

fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn objects(path: &Path) -> Vec<Value> {
    config_snapshot::kubewarden::admission_review::read_objects(path).unwrap_or_else(|e| panic!("{e:#}"))
}

fn kustomization(component: &str) -> Value {
    objects(&deploy().join(component).join("kustomization.yaml")).remove(0)
}

/// The JSON Patch ops a component applies to objects of `kind`.
fn ops(component: &Value, kind: &str) -> Vec<Value> {
    component["patches"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["target"]["kind"] == kind)
        .flat_map(|p| {
            let parsed: Value = serde_yaml_ng::from_str(p["patch"].as_str().unwrap()).unwrap();
            parsed.as_array().cloned().unwrap_or_default()
        })
        .collect()
}

/// serve's options from the install's arguments plus those a component adds.
fn options_with(added: &[Value]) -> config_snapshot::serve::Options {
    let deployment = objects(&deploy().join("serve/deployment.yaml"))
        .into_iter()
        .find(|o| o["kind"] == "Deployment")
        .unwrap();
    let mut argv = vec!["config-snapshot".to_string()];
    for arg in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .chain(
            added
                .iter()
                .filter(|op| op["path"].as_str().unwrap().ends_with("/args/-"))
                .map(|op| &op["value"]),
        )
    {
        argv.push(arg.as_str().unwrap().to_string());
    }
    let Sub::Serve(options) = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{e}")).command;
    options
}

/// The ClusterRole's one rule by name: the signing key's guard, read.
fn reads_the_guard(rule: &Value) -> bool {
    rule["apiGroups"] == serde_json::json!(["admissionregistration.k8s.io"])
        && rule["resourceNames"] == serde_json::json!(["config-snapshot-signing-key"])
        && rule["verbs"] == serde_json::json!(["get"])
}

/// The right to keep its own webhook configuration on the door's path.
fn keeps_its_webhook(rule: &Value) -> bool {
    rule["apiGroups"] == serde_json::json!(["admissionregistration.k8s.io"])
        && rule["resources"] == serde_json::json!(["mutatingwebhookconfigurations"])
        && rule["resourceNames"] == serde_json::json!(["config-snapshot"])
        && rule["verbs"] == serde_json::json!(["get", "patch"])
}

/// Each (group, resource, verb) a rule list grants in a namespace (the
/// cluster-scoped ones, the guard's read and the webhook's path, apart).
fn grants(rules: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for rule in rules
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| !reads_the_guard(r) && !keeps_its_webhook(r))
    {
        assert!(rule.get("resourceNames").is_none(), "{rule}");
        for group in rule["apiGroups"].as_array().unwrap() {
            for resource in rule["resources"].as_array().unwrap() {
                for verb in rule["verbs"].as_array().unwrap() {
                    out.insert(format!(
                        "{}/{}:{}",
                        group.as_str().unwrap(),
                        resource.as_str().unwrap(),
                        verb.as_str().unwrap()
                    ));
                }
            }
        }
    }
    out
}

/// The namespaces a component's identity guard lets serve's account write
/// in: its replacement of the guard's `only` (deploy/serve/identityguard.yaml),
/// checked to be that variable.
fn guarded_namespaces(component: &Value) -> BTreeSet<String> {
    let guard = ops(component, "ValidatingAdmissionPolicy");
    assert_eq!(
        guard[0],
        serde_json::json!({"op": "test", "path": "/spec/variables/4/name", "value": "only"})
    );
    assert_eq!(guard[1]["op"], "replace");
    assert_eq!(guard[1]["path"], "/spec/variables/4/expression");
    let identity = objects(&deploy().join("serve/identityguard.yaml")).remove(0);
    assert_eq!(identity["spec"]["variables"][4]["name"], "only");
    guard[1]["value"]
        .as_str()
        .unwrap()
        .trim_matches(['[', ']'])
        .split(',')
        .map(|n| n.trim().trim_matches('\'').to_string())
        .collect()
}

#[test]
fn the_namespaced_component_names_one_list_and_grants_no_more_than_the_cluster_role() {
    let component = kustomization("components/namespaced");
    assert_eq!(component["kind"], "Component");
    // serve's own arguments.
    let options = options_with(&ops(&component, "Deployment"));
    let listed: BTreeSet<String> = options.only_namespaces().unwrap().unwrap().into_iter().collect();
    assert!(!listed.is_empty());
    // The webhook's selector: exactly those namespaces.
    let selector = ops(&component, "MutatingWebhookConfiguration")
        .into_iter()
        .find(|op| op["path"] == "/webhooks/0/namespaceSelector")
        .unwrap();
    let expression = &selector["value"]["matchExpressions"][0];
    assert_eq!(expression["key"], "kubernetes.io/metadata.name");
    assert_eq!(expression["operator"], "In");
    let selected: BTreeSet<String> = expression["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(selected, listed);
    // The identity guard's: serve's account writes in those alone.
    assert_eq!(guarded_namespaces(&component), listed);
    // One Role and RoleBinding per namespace, with the ClusterRole's rules.
    let cluster_role = objects(&deploy().join("serve/rbac.yaml"))
        .into_iter()
        .find(|o| o["kind"] == "ClusterRole")
        .unwrap();
    let roles = objects(&deploy().join("components/namespaced/roles.yaml"));
    let own = options.own_namespace.clone();
    let mut granted = BTreeSet::new();
    for role in roles.iter().filter(|o| o["kind"] == "Role") {
        let ns = role["metadata"]["namespace"].as_str().unwrap().to_string();
        if ns == own {
            // Only the signing key and serve's webhook CA: read them by
            // name, create them once, renew and replace the CA alone.
            assert_eq!(role["metadata"]["name"], "config-snapshot-signing-key");
            let rules = role["rules"].as_array().unwrap();
            let ca = config_snapshot::serve::trust::certificates::SECRET;
            assert_eq!(
                rules[0]["resourceNames"],
                serde_json::json!([options.signing_key_secret.as_str(), ca])
            );
            assert_eq!(rules[0]["verbs"], serde_json::json!(["get", "list", "watch"]));
            assert_eq!(rules[1]["verbs"], serde_json::json!(["create"]));
            assert_eq!(rules[2]["resourceNames"], serde_json::json!([ca]));
            assert_eq!(rules[2]["verbs"], serde_json::json!(["patch", "delete"]));
            assert_eq!(rules.len(), 3);
            continue;
        }
        assert_eq!(grants(&role["rules"]), grants(&cluster_role["rules"]), "Role in {ns}");
        granted.insert(ns);
    }
    assert_eq!(granted, listed);
    let bound: BTreeSet<String> = roles
        .iter()
        .filter(|o| o["kind"] == "RoleBinding" && o["metadata"]["namespace"] != own.as_str())
        .map(|b| {
            assert_eq!(b["subjects"][0]["namespace"], own.as_str());
            b["metadata"]["namespace"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(bound, listed);
    // And the cluster-wide grant is removed.
    let deleted: Vec<&str> = component["patches"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["patch"].as_str().filter(|t| t.contains("$patch: delete")))
        .collect();
    assert!(deleted.iter().any(|t| t.contains("kind: ClusterRole\n")));
    assert!(deleted.iter().any(|t| t.contains("kind: ClusterRoleBinding")));
    // But for the guard's read and its webhook's path, by name, which are
    // cluster-scoped.
    let cluster_wide: Vec<&Value> = roles.iter().filter(|o| o["kind"] == "ClusterRole").collect();
    assert_eq!(cluster_wide.len(), 1);
    let rules = cluster_wide[0]["rules"].as_array().unwrap();
    assert!(
        rules.len() == 2 && reads_the_guard(&rules[0]) && keeps_its_webhook(&rules[1]),
        "{rules:?}"
    );
}

/// The strategic merge patch a component applies to serve's Deployment:
/// its one container's volume mounts and its volumes.
fn merged_volumes(component: &Value) -> (Vec<Value>, Vec<Value>) {
    let patch = component["patches"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p.get("target").is_none())
        .map(|p| serde_yaml_ng::from_str::<Value>(p["patch"].as_str().unwrap()).unwrap())
        .find(|p| p["kind"] == "Deployment")
        .expect("a strategic merge patch of the Deployment");
    let spec = &patch["spec"]["template"]["spec"];
    (
        spec["containers"][0]["volumeMounts"].as_array().unwrap().clone(),
        spec["volumes"].as_array().unwrap().clone(),
    )
}

#[test]
fn the_mtls_component_points_client_ca_at_the_ca_it_mounts() {
    let component = kustomization("components/mtls");
    assert_eq!(component["kind"], "Component");
    let options = options_with(&ops(&component, "Deployment"));
    let ca = options.client_ca.expect("--client-ca");
    let (mounts, volumes) = merged_volumes(&component);
    let (mount, volume) = (&mounts[0], &volumes[0]);
    assert_eq!(mount["name"], volume["name"]);
    assert_eq!(Path::new(mount["mountPath"].as_str().unwrap()).join("ca.crt"), ca);
    // The overlay makes the ConfigMap the volume names, with that key.
    let overlay = kustomization("overlays/mtls");
    let generated = &overlay["configMapGenerator"][0];
    assert_eq!(generated["name"], volume["configMap"]["name"]);
    assert_eq!(generated["files"][0], "ca.crt");
}

/// The cert-manager component: serve serves the Secret cert-manager
/// writes, for the Service's names, issued by a CA of cert-manager's whose
/// certificate the injector puts in the webhook configuration: a renewal
/// of the serving certificate changes nothing the API server trusts.
#[test]
fn the_cert_manager_component_serves_a_certificate_of_a_ca_the_webhook_trusts() {
    let component = kustomization("components/cert-manager");
    assert_eq!(component["kind"], "Component");
    let options = options_with(&ops(&component, "Deployment"));
    let (cert, key) = (
        options.tls_cert.expect("--tls-cert"),
        options.tls_key.expect("--tls-key"),
    );
    let (mounts, volumes) = merged_volumes(&component);
    assert_eq!(mounts[0]["name"], volumes[0]["name"]);
    let dir = Path::new(mounts[0]["mountPath"].as_str().unwrap());
    assert_eq!((dir.join("tls.crt"), dir.join("tls.key")), (cert, key));
    let made = objects(&deploy().join("components/cert-manager/certificate.yaml"));
    let named = |kind: &str, name: &str| {
        made.iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
            .clone()
    };
    let certificates: Vec<&Value> = made.iter().filter(|o| o["kind"] == "Certificate").collect();
    let serving = certificates.iter().find(|c| c["spec"]["isCA"] != true).unwrap();
    assert_eq!(serving["spec"]["secretName"], volumes[0]["secret"]["secretName"]);
    assert!(serving["spec"]["dnsNames"]
        .as_array()
        .unwrap()
        .contains(&serde_json::json!(format!("{}.config-snapshot.svc", options.service))));
    // Issued by a CA Issuer whose CA is a Certificate of its own, which the
    // injector reads.
    let issuer = named("Issuer", serving["spec"]["issuerRef"]["name"].as_str().unwrap());
    let ca_secret = issuer["spec"]["ca"]["secretName"].as_str().expect("a CA Issuer");
    let ca = certificates
        .iter()
        .find(|c| c["spec"]["secretName"] == ca_secret)
        .unwrap();
    assert_eq!(ca["spec"]["isCA"], true);
    let injected =
        ops(&component, "MutatingWebhookConfiguration")[0]["value"]["cert-manager.io/inject-ca-from"].clone();
    assert_eq!(
        injected,
        format!("config-snapshot/{}", ca["metadata"]["name"].as_str().unwrap())
    );
    // The CA lives ten years, the serving certificate 90 days.
    assert_eq!(ca["spec"]["duration"], "87600h");
    assert_eq!(serving["spec"]["duration"], "2160h");
}

/// With `snapshotByDefault` or `watchByDefault` every workload is serve's:
/// the component takes away the matchCondition that sends only workloads
/// carrying config-snapshot's annotations, and opens the identity guard to
/// such workloads (its `byDefault`), and nothing else.
#[test]
fn by_default_sends_every_workload_and_changes_nothing_else() {
    let component = kustomization("components/by-default");
    let webhook = objects(&deploy().join("serve/webhook.yaml")).remove(0);
    let mut patched = webhook.clone();
    let hook_ops: json_patch::Patch =
        serde_json::from_value(Value::Array(ops(&component, "MutatingWebhookConfiguration"))).unwrap();
    json_patch::patch(&mut patched, &hook_ops).expect("the component's patch applies to the shipped webhook");
    let names = |o: &Value| -> Vec<String> {
        o["webhooks"][0]["matchConditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        names(&webhook),
        [config_snapshot::kubewarden::rules::MARKED, "not-a-controllers-pod"]
    );
    assert_eq!(names(&patched), ["not-a-controllers-pod"]);
    let mut without = webhook.clone();
    without["webhooks"][0]["matchConditions"]
        .as_array_mut()
        .unwrap()
        .remove(0);
    assert_eq!(patched, without, "only the condition goes");

    // The identity guard: its `byDefault`, and nothing else, made true.
    let guard = objects(&deploy().join("serve/identityguard.yaml")).remove(0);
    let mut opened = guard.clone();
    let guard_ops: json_patch::Patch =
        serde_json::from_value(Value::Array(ops(&component, "ValidatingAdmissionPolicy"))).unwrap();
    json_patch::patch(&mut opened, &guard_ops).expect("the component's patch applies to the shipped guard");
    assert_eq!(guard["spec"]["variables"][5]["expression"], "false");
    let mut expected = guard.clone();
    expected["spec"]["variables"][5]["expression"] = Value::from("true");
    assert_eq!(opened, expected, "only byDefault changes");
}
