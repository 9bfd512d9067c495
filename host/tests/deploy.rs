//! deploy/serve is checked the way the API server would read it: every
//! object must round-trip through its k8s-openapi type unchanged (so a
//! misspelt or misplaced field fails, instead of being dropped silently),
//! and the pieces must fit together: rules equal policy-metadata.yml, the
//! container's arguments parse with the real CLI, probes hit the real
//! endpoints, names and selectors agree, and RBAC is exactly what serve uses.
#![allow(clippy::too_many_lines, reason = "a test or benchmark is a story read top to bottom")]

use std::collections::BTreeSet;
use std::path::PathBuf;

use clap::Parser;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/serve")
}

fn documents() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap() == "kustomization.yaml" {
            continue;
        }
        for object in config_snapshot::kubewarden::admission_review::read_objects(&path).unwrap() {
            out.push((path.file_name().unwrap().to_string_lossy().to_string(), object));
        }
    }
    out
}

fn find(kind: &str) -> Value {
    documents()
        .into_iter()
        .map(|(_, o)| o)
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in deploy/serve"))
}

fn typed<T: DeserializeOwned + Serialize>(object: &Value) -> T {
    let value: T = serde_json::from_value(object.clone()).unwrap_or_else(|e| panic!("{e}: {object}"));
    let back = serde_json::to_value(&value).unwrap();
    assert_eq!(
        &back, object,
        "fields the API server would not recognise (or typed differently)"
    );
    value
}

#[test]
fn every_object_is_valid_for_its_kubernetes_type() {
    let mut kinds = BTreeSet::new();
    for (file, object) in documents() {
        let kind = object["kind"].as_str().unwrap().to_string();
        match kind.as_str() {
            "Namespace" => drop(typed::<Namespace>(&object)),
            "ServiceAccount" => drop(typed::<ServiceAccount>(&object)),
            "ConfigMap" => drop(typed::<ConfigMap>(&object)),
            "Service" => drop(typed::<Service>(&object)),
            "Deployment" => drop(typed::<Deployment>(&object)),
            "PodDisruptionBudget" => drop(typed::<PodDisruptionBudget>(&object)),
            "ClusterRole" => drop(typed::<ClusterRole>(&object)),
            "ClusterRoleBinding" => drop(typed::<ClusterRoleBinding>(&object)),
            "Role" => drop(typed::<Role>(&object)),
            "RoleBinding" => drop(typed::<RoleBinding>(&object)),
            "MutatingWebhookConfiguration" => drop(typed::<MutatingWebhookConfiguration>(&object)),
            "NetworkPolicy" => drop(typed::<k8s_openapi::api::networking::v1::NetworkPolicy>(&object)),
            "ValidatingAdmissionPolicy" => drop(typed::<
                k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy,
            >(&object)),
            "ValidatingAdmissionPolicyBinding" => drop(typed::<
                k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding,
            >(&object)),
            other => panic!("{file}: unexpected kind {other}"),
        }
        kinds.insert(kind);
    }
    assert_eq!(kinds.len(), 14, "{kinds:?}");
}

#[test]
fn the_kustomization_lists_every_manifest() {
    let text = std::fs::read_to_string(dir().join("kustomization.yaml")).unwrap();
    let k: Value = serde_yaml_ng::from_str(&text).unwrap();
    let listed: BTreeSet<String> = k["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    let files: BTreeSet<String> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| p.file_name().unwrap().to_string_lossy().to_string())
        .filter(|f| f != "kustomization.yaml")
        .collect();
    assert_eq!(listed, files);
}

#[test]
fn the_webhook_matches_the_policy_metadata_and_is_safe_to_run() {
    let config: MutatingWebhookConfiguration = typed(&find("MutatingWebhookConfiguration"));
    let webhooks = config.webhooks.unwrap();
    assert_eq!(webhooks.len(), 1);
    let hook = &webhooks[0];
    let metadata: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(dir().join("../../policy-metadata.yml")).unwrap()).unwrap();
    let mut rules = serde_json::to_value(hook.rules.as_ref().unwrap()).unwrap();
    for rule in rules.as_array_mut().unwrap() {
        assert_eq!(rule["scope"], "Namespaced");
        rule.as_object_mut().unwrap().remove("scope");
    }
    assert_eq!(rules, metadata["rules"]);
    assert_eq!(hook.side_effects, "NoneOnDryRun");
    assert_eq!(hook.reinvocation_policy.as_deref(), Some("IfNeeded"));
    assert_eq!(hook.admission_review_versions, ["v1"]);
    let timeout = hook.timeout_seconds.unwrap();
    assert!(
        (5..=30).contains(&timeout),
        "timeoutSeconds {timeout} must leave room for the 2 s policy deadline"
    );
    assert!(matches!(hook.failure_policy.as_deref(), Some("Ignore") | Some("Fail")));

    let excluded = &hook
        .namespace_selector
        .as_ref()
        .unwrap()
        .match_expressions
        .as_ref()
        .unwrap()[0];
    assert_eq!(excluded.key, "kubernetes.io/metadata.name");
    assert_eq!(excluded.operator, "NotIn");
    let deployment: Deployment = typed(&find("Deployment"));
    let own_ns = deployment.metadata.namespace.clone().unwrap();
    // What the webhook excludes is what serve, as deployed, refuses and
    // does not sweep: its --exclude-namespaces and its own namespace.
    let serve = deployed_serve_options();
    let mut by_serve = config_snapshot::serve::Options {
        own_namespace: own_ns.clone(),
        ..serve
    }
    .excluded_namespaces();
    by_serve.sort();
    let mut by_webhook = excluded.values.clone().unwrap();
    by_webhook.sort();
    assert_eq!(by_webhook, by_serve);
    // No objectSelector: a label would let anyone's object through
    // unreviewed. What is sent is decided by the matchCondition on
    // config-snapshot's annotations, exactly the policy's own expression
    // (docs/design.md, "What the webhook is called for"), and no Pod a
    // controller made.
    assert!(hook.object_selector.is_none());
    let conditions = hook.match_conditions.as_ref().expect("matchConditions");
    let names: Vec<&str> = conditions.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [config_snapshot::kubewarden::rules::MARKED, "not-a-controllers-pod"]
    );
    assert_eq!(
        words(&conditions[0].expression),
        words(&config_snapshot_policy::model::kinds::marked_condition())
    );

    let service: Service = typed(&find("Service"));
    let target = hook.client_config.service.as_ref().unwrap();
    assert_eq!(Some(&target.name), service.metadata.name.as_ref());
    assert_eq!(Some(&target.namespace), service.metadata.namespace.as_ref());
    // No path: serve writes the door's (docs/security.md, "The door"), and a
    // path in the manifest would be put back by every apply.
    assert_eq!(target.path, None);
    let ports = service.spec.as_ref().unwrap().ports.as_ref().unwrap();
    assert!(ports.iter().any(|p| Some(p.port) == target.port));

    // No certificate to install first: serve makes its own for the
    // Service's name and keeps the webhook's caBundle on its CA
    // (deploy/components/cert-manager hands it to cert-manager instead).
    let options = deployed_serve_options();
    assert_eq!((options.tls_cert.as_ref(), options.tls_key.as_ref()), (None, None));
    assert_eq!(options.service, target.name);
    assert_eq!(hook.client_config.ca_bundle, None, "serve writes it");
    assert!(config.metadata.annotations.is_none(), "no injector's annotation");
    assert!(documents().iter().all(|(_, o)| o["apiVersion"] != "cert-manager.io/v1"));
}

/// `text` with every run of whitespace one space: a folded YAML scalar
/// and a one-line expression say the same.
fn words(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Sub,
}

#[derive(clap::Subcommand)]
enum Sub {
    Serve(config_snapshot::serve::Options),
}

/// serve's options as the shipped Deployment's args give them.
fn deployed_serve_options() -> config_snapshot::serve::Options {
    let deployment: Deployment = typed(&find("Deployment"));
    let container = &deployment.spec.unwrap().template.spec.unwrap().containers[0];
    let mut argv = vec!["config-snapshot".to_string()];
    argv.extend(container.args.clone().unwrap());
    match Cli::try_parse_from(&argv).unwrap().command {
        Sub::Serve(options) => options,
    }
}

#[test]
fn the_deployment_runs_serve_as_the_cli_parses_it_with_probes_on_real_endpoints() {
    let deployment: Deployment = typed(&find("Deployment"));
    let spec = deployment.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.as_ref().unwrap();
    let container = &pod.containers[0];
    let mut argv = vec!["config-snapshot".to_string()];
    argv.extend(container.args.clone().unwrap());
    let Sub::Serve(options) = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{e}")).command;
    let port = |name: &str| {
        container
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .find(|p| p.name.as_deref() == Some(name))
            .unwrap()
            .container_port
    };
    assert_eq!(options.listen.port() as i32, port("webhook"));
    assert_eq!(options.metrics_listen.port() as i32, port("metrics"));
    let probe_path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        let get = p.as_ref().unwrap().http_get.as_ref().unwrap();
        assert_eq!(serde_json::to_value(&get.port).unwrap(), "metrics");
        get.path.clone().unwrap()
    };
    assert_eq!(probe_path(&container.readiness_probe), "/readyz");
    assert_eq!(probe_path(&container.liveness_probe), "/healthz");
    assert!(container.resources.as_ref().unwrap().requests.is_some());
    assert!(container.resources.as_ref().unwrap().limits.is_some());
    let security = container.security_context.as_ref().unwrap();
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    // Settings come from the ConfigMap the manifests ship.
    let settings = find("ConfigMap");
    let env = container
        .env
        .as_ref()
        .unwrap()
        .iter()
        .find(|e| e.name == "CONFIG_SNAPSHOT_SETTINGS")
        .unwrap();
    assert_eq!(env.name, "CONFIG_SNAPSHOT_SETTINGS");
    let key = env.value_from.as_ref().unwrap().config_map_key_ref.as_ref().unwrap();
    assert_eq!(settings["metadata"]["name"].as_str(), Some(key.name.as_str()));
    let text = settings["data"][&key.key].as_str().unwrap();
    serde_json::from_str::<Value>(text).expect("the settings are JSON");

    let labels = spec.template.metadata.as_ref().unwrap().labels.clone().unwrap();
    let matches =
        |selector: &std::collections::BTreeMap<String, String>| selector.iter().all(|(k, v)| labels.get(k) == Some(v));
    let service: Service = typed(&find("Service"));
    assert!(matches(service.spec.as_ref().unwrap().selector.as_ref().unwrap()));
    let pdb: PodDisruptionBudget = typed(&find("PodDisruptionBudget"));
    let pdb_spec = pdb.spec.unwrap();
    assert!(matches(pdb_spec.selector.unwrap().match_labels.as_ref().unwrap()));
    assert!(pdb_spec.min_available.is_some() || pdb_spec.max_unavailable.is_some());
    assert!(pod.topology_spread_constraints.as_ref().is_some_and(|t| !t.is_empty()));

    // Two replicas elect one to run the periodic pass; the Lease lives in
    // the pod's own namespace, named by the downward API.
    assert!(options.leader_elect);
    let field = |name: &str| {
        container
            .env
            .as_ref()
            .unwrap()
            .iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value_from.as_ref()?.field_ref.as_ref())
            .map(|f| f.field_path.clone())
    };
    assert_eq!(field("POD_NAME").as_deref(), Some("metadata.name"));
    assert_eq!(field("POD_NAMESPACE").as_deref(), Some("metadata.namespace"));
}

#[test]
fn the_lease_is_the_only_namespaced_grant_and_stays_in_serves_namespace() {
    let role: Role = typed(&find("Role"));
    let namespace = find("Namespace")["metadata"]["name"].as_str().unwrap().to_string();
    assert_eq!(role.metadata.namespace.as_deref(), Some(namespace.as_str()));
    let rules = role.rules.unwrap();
    assert_eq!(rules.len(), 2);
    for rule in &rules {
        assert_eq!(
            rule.api_groups.as_deref(),
            Some(&["coordination.k8s.io".to_string()][..])
        );
        assert_eq!(rule.resources.as_deref(), Some(&["leases".to_string()][..]));
    }
    // `create` cannot name its object; what can is the Lease serve holds.
    assert_eq!(rules[0].verbs, ["create"]);
    assert_eq!(rules[0].resource_names, None);
    assert_eq!(rules[1].verbs, ["get", "patch"]);
    assert_eq!(
        rules[1].resource_names.as_deref(),
        Some(&[deployed_serve_options().lease_name][..])
    );
    let binding: RoleBinding = typed(&find("RoleBinding"));
    assert_eq!(binding.metadata.namespace.as_deref(), Some(namespace.as_str()));
    assert_eq!(binding.role_ref.name, role.metadata.name.unwrap());
    let account: ServiceAccount = typed(&find("ServiceAccount"));
    assert_eq!(binding.subjects.unwrap()[0].name, account.metadata.name.unwrap());
}

/// The strings of a CEL list literal of strings (`['a', 'b']`), as the
/// guards write their lists.
fn cel_strings(expression: &str) -> Vec<String> {
    let inner = expression
        .trim()
        .strip_prefix('[')
        .and_then(|e| e.strip_suffix(']'))
        .unwrap_or_else(|| panic!("not a CEL list: {expression}"));
    inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.strip_prefix('\'')
                .and_then(|s| s.strip_suffix('\''))
                .unwrap_or_else(|| panic!("not a quoted string: {s}"))
                .to_string()
        })
        .collect()
}

/// The expression of a guard's variable, by name.
fn variable(policy: &Value, name: &str) -> String {
    policy["spec"]["variables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no variable {name}"))["expression"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The identity guard (identityguard.yaml) is in force for serve's account
/// alone, on every write, and is built from the same lists as the rest:
/// the namespaces it lets serve write in are the webhook's (its own derived
/// from the account the matchCondition names), the Secret types it
/// refuses are the ones the host refuses to snapshot, and the objects it
/// lets serve keep in its own namespace are serve's.
#[test]
fn the_identity_guard_holds_serves_account_to_the_webhooks_namespaces() {
    let policy = documents()
        .into_iter()
        .map(|(_, o)| o)
        .find(|o| o["kind"] == "ValidatingAdmissionPolicy" && o["metadata"]["name"] == "config-snapshot-identity")
        .expect("identityguard.yaml");
    let spec = &policy["spec"];
    assert_eq!(spec["failurePolicy"], "Fail");
    assert_eq!(
        spec["matchConstraints"]["resourceRules"],
        serde_json::json!([{"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*/*"], "operations": ["*"]}]),
        "every write of the account reaches the guard"
    );
    assert!(spec["matchConstraints"].get("namespaceSelector").is_none());
    let binding = documents()
        .into_iter()
        .map(|(_, o)| o)
        .find(|o| {
            o["kind"] == "ValidatingAdmissionPolicyBinding" && o["spec"]["policyName"] == "config-snapshot-identity"
        })
        .expect("its binding");
    assert_eq!(binding["spec"]["validationActions"], serde_json::json!(["Deny"]));

    let account: ServiceAccount = typed(&find("ServiceAccount"));
    let own = account.metadata.namespace.clone().unwrap();
    let user = format!(
        "system:serviceaccount:{own}:{}",
        account.metadata.name.as_deref().unwrap()
    );
    assert_eq!(
        spec["matchConditions"],
        serde_json::json!([{"name": "config-snapshot-writing",
                            "expression": format!("request.userInfo.username == '{user}'")}])
    );
    // serve's own namespace is the account's: the third field of its name.
    assert_eq!(variable(&policy, "own"), "request.userInfo.username.split(':')[2]");
    assert_eq!(user.split(':').nth(2), Some(own.as_str()));

    // What the guard leaves serve is what the webhook reviews and serve
    // acts in: every namespace but its --exclude-namespaces and its own.
    let mut excluded = cel_strings(&variable(&policy, "excluded"));
    excluded.push(own.clone());
    excluded.sort();
    let mut by_serve = config_snapshot::serve::Options {
        own_namespace: own.clone(),
        ..deployed_serve_options()
    }
    .excluded_namespaces();
    by_serve.sort();
    assert_eq!(excluded, by_serve);
    let webhook: MutatingWebhookConfiguration = typed(&find("MutatingWebhookConfiguration"));
    let hook = &webhook.webhooks.as_ref().unwrap()[0];
    let selector = &hook
        .namespace_selector
        .as_ref()
        .unwrap()
        .match_expressions
        .as_ref()
        .unwrap()[0];
    let mut by_webhook = selector.values.clone().unwrap();
    by_webhook.sort();
    assert_eq!(excluded, by_webhook);
    assert!(cel_strings(&variable(&policy, "only")).is_empty(), "cluster-wide");

    // The workloads it lets serve patch: the kinds whose watch rollouts
    // serve makes (src/model/kinds.rs), by group and resource.
    let patched: BTreeSet<String> = config_snapshot_policy::model::kinds::KINDS
        .iter()
        .filter(|k| config_snapshot_policy::model::kinds::WorkloadKind::from_kind(k.kind).is_some_and(|w| w.watches()))
        .map(|k| format!("{}/{}", k.group(), k.plural))
        .collect();
    let listed = variable(&policy, "workload");
    let listed: BTreeSet<String> = cel_strings(listed.strip_prefix("variables.resource in ").expect("a list"))
        .into_iter()
        .collect();
    assert_eq!(listed, patched);

    // The Secret types that mint credentials: one list, the host's.
    let types = cel_strings(&variable(&policy, "tokenTypes"));
    assert_eq!(types, config_snapshot_policy::model::source::TOKEN_TYPES);

    // A workload is serve's to patch if it was marked before the write,
    // by the policy's own test (marked()) of the old object; or, with the
    // defaults off as shipped, not at all.
    assert_eq!(
        words(&variable(&policy, "marked")),
        words(&config_snapshot_policy::model::kinds::marked_before_condition())
    );
    assert_eq!(
        variable(&policy, "byDefault"),
        "false",
        "the shipped settings' defaults are off"
    );
    // The user's annotations it holds equal are the model's list; the
    // approvals it lets serve take off are the approve annotation's.
    assert_eq!(
        cel_strings(&words(&variable(&policy, "userSet"))),
        config_snapshot_policy::model::keys::USER_SET
    );
    assert!(variable(&policy, "approvals").contains(&format!("'{}'", config_snapshot_policy::model::keys::APPROVE)));

    // In its own namespace, its signing key and its CA; cluster-wide, its
    // webhook configuration, by the name serve keeps.
    let options = deployed_serve_options();
    let scope = spec["validations"][0]["expression"].as_str().unwrap();
    let secrets = format!(
        "['{}', '{}']",
        options.signing_key_secret,
        config_snapshot::serve::trust::certificates::SECRET
    );
    assert!(scope.contains(&secrets), "{scope}");
    assert!(
        scope.contains(&format!("variables.name == '{}'", options.webhook_configuration)),
        "{scope}"
    );
    assert_eq!(
        Some(options.webhook_configuration.as_str()),
        webhook.metadata.name.as_deref()
    );
}

#[test]
fn rbac_grants_exactly_what_serve_uses() {
    let role: ClusterRole = typed(&find("ClusterRole"));
    let mut grants = BTreeSet::new();
    for rule in role.rules.clone().unwrap() {
        for group in rule.api_groups.unwrap() {
            for resource in rule.resources.clone().unwrap() {
                for verb in &rule.verbs {
                    assert_ne!(verb, "*");
                    grants.insert(format!("{group}/{resource}:{verb}"));
                }
            }
        }
    }
    let mut expected = BTreeSet::new();
    let read = ["get", "list", "watch"];
    for (group, resource, extra) in [
        ("", "configmaps", &["create", "delete", "patch"][..]),
        ("", "secrets", &["create", "delete", "patch"]),
        ("", "pods", &[]),
        ("apps", "deployments", &["patch"]),
        ("apps", "statefulsets", &["patch"]),
        ("apps", "daemonsets", &["patch"]),
        ("apps", "replicasets", &[]),
        ("apps", "controllerrevisions", &[]),
        ("batch", "cronjobs", &["patch"]),
        ("batch", "jobs", &[]),
        ("argoproj.io", "rollouts", &["patch"]),
    ] {
        for verb in read.iter().chain(extra) {
            expected.insert(format!("{group}/{resource}:{verb}"));
        }
    }
    // A Namespace, read for its uid, which anchors shared snapshots.
    expected.insert("/namespaces:get".to_string());
    // Events on the workloads serve changes: exactly create and patch.
    expected.insert("events.k8s.io/events:create".to_string());
    expected.insert("events.k8s.io/events:patch".to_string());
    // The signing key's guard: read by name, to know it is in force.
    for resource in ["validatingadmissionpolicies", "validatingadmissionpolicybindings"] {
        expected.insert(format!("admissionregistration.k8s.io/{resource}:get"));
    }
    // Its own webhook configuration, kept on the door's path.
    expected.insert("admissionregistration.k8s.io/mutatingwebhookconfigurations:get".to_string());
    expected.insert("admissionregistration.k8s.io/mutatingwebhookconfigurations:patch".to_string());
    assert_eq!(grants, expected);
    // Every cluster-scoped grant of the admissionregistration group is by
    // name: serve reads its guard and keeps its own webhook, nothing else.
    let webhook: MutatingWebhookConfiguration = typed(&find("MutatingWebhookConfiguration"));
    for rule in role.rules.clone().unwrap() {
        if rule
            .api_groups
            .as_ref()
            .unwrap()
            .iter()
            .any(|g| g == "admissionregistration.k8s.io")
        {
            let names = rule.resource_names.clone().expect("by name");
            if rule
                .resources
                .as_ref()
                .unwrap()
                .iter()
                .any(|r| r == "mutatingwebhookconfigurations")
            {
                assert_eq!(names, vec![webhook.metadata.name.clone().unwrap()]);
                assert_eq!(
                    deployed_serve_options().webhook_configuration,
                    webhook.metadata.name.clone().unwrap()
                );
            }
        }
    }
    // The serve cache watches exactly these kinds.
    let cached: BTreeSet<String> = config_snapshot::serve::view::cache::KINDS
        .iter()
        .map(|k| format!("{}/{}:watch", k.group(), k.plural))
        .collect();
    let watched: BTreeSet<String> = grants.iter().filter(|g| g.ends_with(":watch")).cloned().collect();
    assert_eq!(cached, watched);

    let binding: ClusterRoleBinding = typed(&find("ClusterRoleBinding"));
    assert_eq!(binding.role_ref.name, role.metadata.name.unwrap());
    let subject = &binding.subjects.unwrap()[0];
    let account: ServiceAccount = typed(&find("ServiceAccount"));
    let deployment: Deployment = typed(&find("Deployment"));
    assert_eq!(Some(&subject.name), account.metadata.name.as_ref());
    assert_eq!(subject.namespace, account.metadata.namespace);
    assert_eq!(
        deployment.spec.unwrap().template.spec.unwrap().service_account_name,
        account.metadata.name
    );
}

/// deploy/kubewarden: the ClusterAdmissionPolicy asks for what the policy's
/// metadata declares (rules, context-aware kinds, mutating, no background
/// audit), its settings are ones the policy accepts, and the reader RBAC
/// grants exactly read access to the context-aware kinds, to the account
/// it binds.
#[test]
fn the_kubewarden_policy_matches_the_metadata_and_its_rbac() {
    let kubewarden = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubewarden");
    let policy = config_snapshot::kubewarden::admission_review::read_objects(&kubewarden.join("policy.yaml")).unwrap();
    assert_eq!(policy.len(), 1);
    let policy = &policy[0];
    assert_eq!(policy["apiVersion"], "policies.kubewarden.io/v1");
    assert_eq!(policy["kind"], "ClusterAdmissionPolicy");
    let metadata: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(dir().join("../../policy-metadata.yml")).unwrap()).unwrap();
    let spec = &policy["spec"];
    // Only workloads: every other kind's review does nothing on stock
    // Kubewarden (host/tests/kubewarden_gate.rs), and each rule is one of
    // the metadata's.
    let workloads: BTreeSet<String> = config_snapshot_policy::model::kinds::KINDS
        .iter()
        .filter(|k| matches!(k.role, config_snapshot_policy::model::kinds::Role::Workload { .. }))
        .map(|k| k.plural.to_string())
        .collect();
    let mut reviewed = BTreeSet::new();
    for rule in spec["rules"].as_array().unwrap() {
        assert!(
            metadata["rules"].as_array().unwrap().contains(rule),
            "a rule of the metadata: {rule}"
        );
        for r in rule["resources"].as_array().unwrap() {
            reviewed.insert(r.as_str().unwrap().to_string());
        }
    }
    assert_eq!(
        reviewed, workloads,
        "deploy/kubewarden reviews the workloads, and only them"
    );
    assert_eq!(spec["contextAwareResources"], metadata["contextAwareResources"]);
    // On a PolicyServer of its own, which verifies the policy's signature
    // and runs as an account no other policy shares.
    let server =
        config_snapshot::kubewarden::admission_review::read_objects(&kubewarden.join("policyserver.yaml")).unwrap();
    assert_eq!(server[0]["kind"], "PolicyServer");
    assert_eq!(spec["policyServer"], server[0]["metadata"]["name"]);
    let verification =
        config_snapshot::kubewarden::admission_review::read_objects(&kubewarden.join("verification-config.yaml"))
            .unwrap();
    assert_eq!(
        server[0]["spec"]["verificationConfig"],
        verification[0]["metadata"]["name"]
    );
    let config: Value =
        serde_yaml_ng::from_str(verification[0]["data"]["verification-config"].as_str().unwrap()).unwrap();
    assert_eq!(config["apiVersion"], "v1");
    // A signature by the release workflow run for this version's tag, and
    // no other: not another workflow, another ref or another release.
    assert_eq!(
        config["allOf"],
        serde_json::json!([{
            "kind": "genericIssuer",
            "issuer": "https://token.actions.githubusercontent.com",
            "subject": {"equal": format!(
                "https://github.com/config-snapshot/config-snapshot/.github/workflows/release.yml@refs/tags/v{}",
                env!("CARGO_PKG_VERSION")
            )}
        }]),
        "the policy's signature is required, by the release workflow for this tag"
    );
    assert_eq!(spec["mutating"], metadata["mutating"]);
    assert_eq!(spec["backgroundAudit"], metadata["backgroundAudit"]);
    assert_eq!(spec["mode"], "protect");
    let settings = serde_json::to_vec(&spec["settings"]).unwrap();
    config_snapshot_policy::model::settings::Settings::from_json(&settings)
        .unwrap_or_else(|e| panic!("deploy/kubewarden's settings are refused: {e}"));

    let rbac = config_snapshot::kubewarden::admission_review::read_objects(&kubewarden.join("rbac.yaml")).unwrap();
    let role: ClusterRole = typed(rbac.iter().find(|o| o["kind"] == "ClusterRole").unwrap());
    let binding: ClusterRoleBinding = typed(rbac.iter().find(|o| o["kind"] == "ClusterRoleBinding").unwrap());
    assert_eq!(binding.role_ref.name, role.metadata.name.clone().unwrap());
    let account = rbac.iter().find(|o| o["kind"] == "ServiceAccount").unwrap();
    assert_eq!(server[0]["spec"]["serviceAccountName"], account["metadata"]["name"]);
    let subjects = binding.subjects.clone().unwrap();
    assert_eq!(subjects.len(), 1, "bound to its own account alone");
    assert_eq!(Some(subjects[0].name.as_str()), account["metadata"]["name"].as_str());
    let mut granted = BTreeSet::new();
    for rule in role.rules.unwrap() {
        assert_eq!(rule.verbs, ["get", "list", "watch"], "read access only");
        for group in rule.api_groups.unwrap() {
            for resource in rule.resources.clone().unwrap() {
                granted.insert((group.clone(), resource));
            }
        }
    }
    let wanted: BTreeSet<(String, String)> = metadata["contextAwareResources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let group = r["apiVersion"]
                .as_str()
                .unwrap()
                .rsplit_once('/')
                .map_or("", |(g, _)| g);
            let plural = format!("{}s", r["kind"].as_str().unwrap().to_lowercase());
            (group.to_string(), plural)
        })
        .collect();
    assert_eq!(granted, wanted);
}
