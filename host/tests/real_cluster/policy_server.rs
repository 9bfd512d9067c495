//! The real Kubewarden policy-server beside serve (issue "Fast where users
//! measure it"; docs/kubewarden.md). policy-server is not in the crate
//! registry: it builds from its repositories (docs/kubewarden.md, "The real
//! policy-server"), outside this project, so this part runs only when
//! `POLICY_SERVER` names the binary and says so when it does not.
//!
//! policy-server runs standalone, as its own documentation shows: a
//! `policies.yml` that loads `annotated-policy.wasm` from a file with the
//! shipped settings and context-aware resources
//! (deploy/kubewarden/policy.yaml), a kubeconfig for its reads, and a
//! mutating webhook on the real control plane that calls it.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::process::Child;
use std::sync::Mutex;

use support::process::{capture_logs, free_port};

use super::*;

/// The webhook's name, as kube-apiserver's histogram labels it.
pub const WEBHOOK: &str = "config-snapshot.policy-server.kubewarden.io";
/// Its MutatingWebhookConfiguration.
const CONFIGURATION: &str = "config-snapshot-policy-server";
/// The policy's id in `policies.yml`: the path is `/validate/<id>`.
const POLICY_ID: &str = "config-snapshot";

/// The policy-server binary `POLICY_SERVER` names; `None`, with a message
/// saying how to run this part, when it names none.
pub fn binary() -> Option<PathBuf> {
    match std::env::var_os("POLICY_SERVER") {
        Some(path) => {
            let path = PathBuf::from(path);
            assert!(
                path.is_file(),
                "POLICY_SERVER names {}, which is not a file (docs/kubewarden.md says how to build it)",
                path.display()
            );
            Some(path)
        }
        None => {
            eprintln!(
                "policy-server: skipped. Set POLICY_SERVER to a policy-server binary (built as \
                 docs/kubewarden.md, \"The real policy-server\", shows) to run config-snapshot on \
                 the real Kubewarden engine beside serve"
            );
            None
        }
    }
}

/// policy-server as a process, on loopback, with a throwaway certificate.
pub struct PolicyServer {
    child: Child,
    pub address: SocketAddr,
    readiness: SocketAddr,
    pub cert_pem: String,
    logs: Arc<Mutex<String>>,
    dir: PathBuf,
}

impl PolicyServer {
    /// Starts `binary` with the annotated policy and the shipped settings,
    /// reading the cluster through `kubeconfig`, and waits until it is ready.
    pub fn start(binary: &Path, kubeconfig: &Path) -> PolicyServer {
        let dir = std::env::temp_dir().join(format!(
            "config-snapshot-policy-server-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(dir.join("downloads")).unwrap();
        // The module as Kubewarden distributes it: metadata embedded.
        let module = dir.join("annotated-policy.wasm");
        let annotated = Command::new(env!("CARGO_BIN_EXE_config-snapshot"))
            .current_dir(root())
            .args(["annotate", "-m", "policy-metadata.yml", "-u", "README.md", "-o"])
            .arg(&module)
            .arg(support::paths::policy())
            .status()
            .expect("config-snapshot annotate runs");
        assert!(annotated.success(), "config-snapshot annotate failed");
        // The shipped ClusterAdmissionPolicy's settings and context-aware
        // resources, as policy-server's own configuration.
        let shipped = yaml("deploy/kubewarden/policy.yaml").remove(0);
        let policies = json!({
            POLICY_ID: {
                "module": format!("file://{}", module.display()),
                "allowedToMutate": true,
                "contextAwareResources": shipped["spec"]["contextAwareResources"],
                "settings": shipped["spec"]["settings"],
            }
        });
        std::fs::write(
            dir.join("policies.yml"),
            serde_json::to_string_pretty(&policies).unwrap(),
        )
        .unwrap();
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
        let cert_pem = cert.cert.pem();
        std::fs::write(dir.join("tls.crt"), &cert_pem).unwrap();
        std::fs::write(dir.join("tls.key"), cert.signing_key.serialize_pem()).unwrap();
        let (port, readiness) = (free_port(), free_port());
        let mut child = Command::new(binary)
            .arg("--policies")
            .arg(dir.join("policies.yml"))
            .arg("--policies-download-dir")
            .arg(dir.join("downloads"))
            .arg("--cert-file")
            .arg(dir.join("tls.crt"))
            .arg("--key-file")
            .arg(dir.join("tls.key"))
            .args(["--addr", "127.0.0.1", "--port", &port.to_string()])
            .args(["--readiness-probe-port", &readiness.to_string()])
            .args(["--log-level", "info", "--log-no-color"])
            .env("KUBECONFIG", kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("policy-server starts");
        let logs = capture_logs(&mut child);
        let mut server = PolicyServer {
            child,
            address: format!("127.0.0.1:{port}").parse().unwrap(),
            readiness: format!("127.0.0.1:{readiness}").parse().unwrap(),
            cert_pem,
            logs,
            dir,
        };
        server.wait_ready();
        server
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("policy-server exited ({status}):\n{}", self.logs());
            }
            let ready = TcpStream::connect(self.readiness).ok().and_then(|mut s| {
                write!(s, "GET /readiness HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
                let mut text = String::new();
                s.read_to_string(&mut text).ok()?;
                (text.split_whitespace().nth(1) == Some("200")).then_some(())
            });
            if ready.is_some() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "policy-server not ready in 120 s:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    pub fn logs(&self) -> String {
        self.logs.lock().unwrap().clone()
    }
}

impl Drop for PolicyServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A kubeconfig for policy-server's reads: the ServiceAccount of
/// config-snapshot's own PolicyServer, with the shipped read-only RBAC
/// (deploy/kubewarden/rbac.yaml), as the controller runs it.
pub fn reader_kubeconfig(cp: &ControlPlane) -> PathBuf {
    if cp.try_kubectl(&["get", "namespace", "kubewarden"], None).is_err() {
        cp.namespace("kubewarden");
    }
    for object in yaml("deploy/kubewarden/rbac.yaml") {
        cp.apply("kubewarden", &object);
    }
    cp.token_kubeconfig("kubewarden", "config-snapshot-policy-server")
}

/// Registers policy-server as the mutating webhook for workloads and their
/// sources in `namespaces`, as the shipped ClusterAdmissionPolicy's rules
/// say, and waits until kube-apiserver calls it.
pub fn register(cp: &ControlPlane, server: &PolicyServer, namespaces: &[&str]) {
    let shipped = yaml("deploy/kubewarden/policy.yaml").remove(0);
    let ca = base64::engine::general_purpose::STANDARD.encode(&server.cert_pem);
    let webhook = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION},
        "webhooks": [{
            "name": WEBHOOK,
            "clientConfig": {"url": format!("https://{}/validate/{POLICY_ID}", server.address), "caBundle": ca},
            "rules": shipped["spec"]["rules"],
            "namespaceSelector": {"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}]},
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "failurePolicy": "Fail",
            "timeoutSeconds": 10,
            "reinvocationPolicy": "Never",
        }]
    });
    cp.try_kubectl(&["apply", "-f", "-"], Some(&webhook.to_string()))
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Waits until kube-apiserver calls policy-server for namespace `ns`
/// (which this makes): an opted-in Deployment there gets its checksums.
pub fn answers(cp: &ControlPlane, ns: &str) {
    cp.namespace(ns);
    cp.apply(ns, &config_map("app", json!({"k": "v"})));
    let probe = workload(
        "Deployment",
        "probe",
        json!({"config-snapshot.io/snapshot": "*"}),
        "x:1",
        json!([{"configMapRef": {"name": "app"}}]),
        1,
    );
    eventually("policy-server to be called", 30, || {
        cp.apply(ns, &probe);
        let stamped = !checksums(&cp.get(ns, "deployment", "probe")?).is_empty();
        cp.kubectl(&["-n", ns, "delete", "deployment", "probe"]);
        stamped.then_some(())
    });
}

pub fn unregister(cp: &ControlPlane) {
    let _ = cp.try_kubectl(
        &[
            "delete",
            "mutatingwebhookconfiguration",
            CONFIGURATION,
            "--ignore-not-found",
        ],
        None,
    );
}

/// The checksum stamps on a workload's pod template.
fn checksums(workload: &Value) -> BTreeMap<String, String> {
    workload["spec"]["template"]["metadata"]["annotations"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.starts_with("config-snapshot.io/checksum-"))
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect()
}

/// What docs/design.md ("Without the write capability") and
/// docs/kubewarden.md promise on stock Kubewarden, on the real engine:
/// an opted-in Deployment gets the checksum-mode mutation and the one
/// warning; a source edit rolls nothing (no watch); a client-side apply of
/// the unchanged manifest sends nothing, and a server-side apply of it
/// rolls out; no snapshot is made; Secret data never leaves the Secret.
pub fn checksum_story(cp: &ControlPlane, serve: &ServeProcess) {
    let Some(binary) = binary() else { return };
    let ns = "policy-server-story";
    cp.namespace(ns);
    // serve's webhook is out of the way: policy-server alone answers here.
    let _ = cp.try_kubectl(
        &[
            "delete",
            "mutatingwebhookconfiguration",
            "config-snapshot",
            "--ignore-not-found",
        ],
        None,
    );
    let server = PolicyServer::start(&binary, &reader_kubeconfig(cp));
    register(cp, &server, &[ns]);

    const CANARY: &str = "policy-server-canary-4f1d";
    cp.apply(ns, &config_map("app", json!({"k": "v1"})));
    cp.apply(
        ns,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
                "stringData": {"password": CANARY}}),
    );
    let mut web = workload(
        "Deployment",
        "web",
        json!({"config-snapshot.io/snapshot": "*"}),
        "app:1",
        json!([{"configMapRef": {"name": "app"}}, {"secretRef": {"name": "creds"}}]),
        3,
    );
    web["spec"]["replicas"] = json!(0);
    let manifest = web.to_string();
    // kube-apiserver picks the new configuration up asynchronously.
    let (warnings, stamped) = eventually("policy-server to mutate the opted-in Deployment", 30, || {
        let (_, stderr) = cp
            .kubectl_warned(&["apply", "-n", ns, "-f", "-"], Some(&manifest))
            .unwrap_or_else(|e| panic!("{e}\n{}", server.logs()));
        let live = cp.get(ns, "deployment", "web")?;
        let stamps = checksums(&live);
        if stamps.is_empty() {
            cp.kubectl(&["-n", ns, "delete", "deployment", "web"]);
            return None;
        }
        Some((
            stderr
                .lines()
                .filter_map(|l| l.strip_prefix("Warning: "))
                .map(str::to_string)
                .collect::<Vec<_>>(),
            live,
        ))
    });
    let stamps = checksums(&stamped);
    assert_eq!(
        stamps.keys().cloned().collect::<Vec<_>>(),
        [
            "config-snapshot.io/checksum-configmap-app",
            "config-snapshot.io/checksum-secret-creds"
        ],
        "one checksum per opted-in source: {stamped}"
    );
    assert_eq!(
        warnings.len(),
        1,
        "the one warning docs/design.md promises: {warnings:?}"
    );
    assert!(
        warnings[0].contains("rollout undo will not restore old config"),
        "{warnings:?}"
    );
    // The references are the sources themselves: no snapshot on this host.
    assert_eq!(env_ref(&stamped), "app");
    assert!(
        snapshots(&cp.objects(ns)).is_empty(),
        "stock Kubewarden makes no snapshot"
    );
    let generation = stamped["metadata"]["generation"].clone();

    // A source edit rolls nothing: stock Kubewarden has no watch.
    set_data(cp, ns, "app", json!({"k": "v2"}));
    std::thread::sleep(Duration::from_secs(5));
    let after_edit = cp.get(ns, "deployment", "web").unwrap();
    assert_eq!(
        after_edit["metadata"]["generation"], generation,
        "a source edit rolled the Deployment out"
    );
    assert_eq!(checksums(&after_edit), stamps);

    // A client-side `kubectl apply` of the unchanged manifest sends
    // nothing (its three-way merge finds no change), so nothing is
    // stamped and nothing rolls.
    let (unchanged, _) = cp
        .kubectl_warned(&["apply", "-n", ns, "-f", "-"], Some(&manifest))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(unchanged.contains("unchanged"), "{unchanged}");
    assert_eq!(checksums(&cp.get(ns, "deployment", "web").unwrap()), stamps);

    // A write that reaches the API server does: a server-side apply of the
    // same manifest. The ConfigMap's checksum changes, the Secret's does not.
    cp.kubectl_warned(
        &["apply", "--server-side", "--force-conflicts", "-n", ns, "-f", "-"],
        Some(&manifest),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let reapplied = cp.get(ns, "deployment", "web").unwrap();
    let restamped = checksums(&reapplied);
    assert_ne!(
        restamped["config-snapshot.io/checksum-configmap-app"],
        stamps["config-snapshot.io/checksum-configmap-app"]
    );
    assert_eq!(
        restamped["config-snapshot.io/checksum-secret-creds"],
        stamps["config-snapshot.io/checksum-secret-creds"]
    );
    assert_ne!(
        reapplied["metadata"]["generation"], generation,
        "the re-apply did not roll out"
    );

    // Secret data stays in the Secret: not in the workload, not in the
    // engine's logs.
    assert!(!reapplied.to_string().contains(CANARY));
    assert!(!server.logs().contains(CANARY));

    unregister(cp);
    drop(server);
    super::register(cp, serve, yaml("deploy/serve/webhook.yaml").remove(0));
    webhook_answers(cp);
    let _ = cp.try_kubectl(&["delete", "namespace", ns, "--wait=false"], None);
    eprintln!("policy-server: checksum mode on the real Kubewarden engine held");
}
