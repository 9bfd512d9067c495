//! The policy through a real OCI registry: the CNCF Distribution registry
//! (Debian's `docker-registry`), started on loopback for each test. Push,
//! pull by tag and by digest, cosign signatures, a tampered module, and
//! `serve --policy registry://…`. Where the registry is not installed the
//! tests say so and skip, except under CI, which installs it
//! (`.ci/run`) and must run them.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sigstore::crypto::signing_key::ecdsa::{ECDSAKeys, EllipticCurve};
use sigstore::crypto::signing_key::SigStoreKeyPair;

mod support;
use config_snapshot_testing::standin::ApiServer;
use support::paths::policy;
use support::process::{free_port, ServeProcess};

struct Registry {
    child: Child,
    dir: PathBuf,
    host: String,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("DOCKER_REGISTRY") {
        return Some(path.into());
    }
    ["/usr/bin/docker-registry", "/usr/local/bin/docker-registry"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// A registry of its own on a free loopback port, or None (with a note)
/// where none is installed and this is not CI.
fn registry() -> Option<Registry> {
    let Some(binary) = binary() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the registry tests: apt-get install docker-registry"
        );
        eprintln!("docker-registry is not installed: skipping (apt-get install docker-registry)");
        return None;
    };
    let host = format!("127.0.0.1:{}", free_port());
    let dir = std::env::temp_dir().join(format!("cs-registry-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("config.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog: {{level: warn}}\nstorage:\n  filesystem: {{rootdirectory: {}}}\nhttp:\n  addr: {host}\n",
            dir.join("data").display()
        ),
    )
    .unwrap();
    let child = Command::new(binary)
        .arg("serve")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("docker-registry starts");
    let registry = Registry { child, dir, host };
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(&registry.host, "/v2/", "*/*").is_none() {
        assert!(
            Instant::now() < deadline,
            "the registry did not come up on {}",
            registry.host
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(registry)
}

/// A plain HTTP GET: the body of a 200, else None.
fn get(host: &str, path: &str, accept: &str) -> Option<String> {
    let mut stream = TcpStream::connect(host).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {host}\r\nAccept: {accept}\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?;
    (status == "200").then(|| body.to_string())
}

fn cli(registry: &Registry, args: &[&str], envs: &[(&str, &str)]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_config-snapshot"))
        .args(args)
        .args(["--insecure-registry", &registry.host])
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// Pushes a module; answers the digest push printed.
fn push(registry: &Registry, module: &Path, tag: &str, sign_key: Option<&Path>) -> String {
    let target = format!("registry://{}/policies/config-snapshot:{tag}", registry.host);
    let mut args = vec!["push".to_string(), module.display().to_string(), target.clone()];
    if let Some(key) = sign_key {
        args.extend(["--sign-key".to_string(), key.display().to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, stdout, stderr) = cli(registry, &args, &[("COSIGN_PASSWORD", "correct horse")]);
    assert!(ok, "push: {stderr}");
    let (_, digest) = stdout.rsplit_once('@').expect("push prints REF@DIGEST");
    assert!(digest.starts_with("sha256:") && digest.len() == 71, "{stdout}");
    digest.to_string()
}

fn pull(registry: &Registry, reference: &str, extra: &[&str]) -> (bool, Vec<u8>, String) {
    let out = tempfile(registry, "pulled.wasm");
    let _ = std::fs::remove_file(&out);
    let mut args = vec!["pull", reference, "-o", out.to_str().unwrap()];
    args.extend(extra);
    let (ok, _, stderr) = cli(registry, &args, &[]);
    (ok, std::fs::read(&out).unwrap_or_default(), stderr)
}

fn tempfile(registry: &Registry, name: &str) -> PathBuf {
    registry.dir.join(name)
}

/// A cosign key pair: (encrypted private key, public key), as
/// `cosign generate-key-pair` writes them.
fn key_pair(registry: &Registry, name: &str) -> (PathBuf, PathBuf) {
    let keys = SigStoreKeyPair::ECDSA(ECDSAKeys::new(EllipticCurve::P256).unwrap());
    let private = tempfile(registry, &format!("{name}.key"));
    let public = tempfile(registry, &format!("{name}.pub"));
    std::fs::write(
        &private,
        keys.private_key_to_encrypted_pem(b"correct horse").unwrap().as_bytes(),
    )
    .unwrap();
    std::fs::write(&public, keys.public_key_to_pem().unwrap()).unwrap();
    (private, public)
}

/// A module other than the policy (one byte more), written to a file.
fn another_module(registry: &Registry) -> PathBuf {
    let other = tempfile(registry, "other.wasm");
    let mut bytes = module();
    bytes.extend_from_slice(b"\0");
    std::fs::write(&other, &bytes).unwrap();
    other
}

fn module() -> Vec<u8> {
    std::fs::read(policy()).unwrap()
}

#[test]
fn push_then_pull_by_tag_and_by_digest_in_kubewardens_layout() {
    let Some(registry) = registry() else { return };
    let digest = push(&registry, &policy(), "v1", None);
    let repo = format!("{}/policies/config-snapshot", registry.host);

    let (ok, pulled, stderr) = pull(&registry, &format!("{repo}:v1"), &[]);
    assert!(ok, "{stderr}");
    assert_eq!(pulled, module());
    let (ok, pulled, stderr) = pull(&registry, &format!("registry://{repo}@{digest}"), &[]);
    assert!(ok, "{stderr}");
    assert_eq!(pulled, module());

    // What kwctl pulls: one wasm layer and the wasm config media type.
    let manifest: Value = serde_json::from_str(
        &get(
            &registry.host,
            &format!("/v2/policies/config-snapshot/manifests/{digest}"),
            "application/vnd.oci.image.manifest.v1+json",
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["config"]["mediaType"], "application/vnd.wasm.config.v1+json");
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    assert_eq!(layers[0]["mediaType"], "application/vnd.wasm.content.layer.v1+wasm");
    assert_eq!(layers[0]["size"], module().len());
}

#[test]
fn a_tampered_or_moved_module_is_refused() {
    let Some(registry) = registry() else { return };
    let digest = push(&registry, &policy(), "v1", None);
    let repo = format!("{}/policies/config-snapshot", registry.host);

    // The tag moves to another module: pinned to the first digest, pull
    // refuses it.
    let other = another_module(&registry);
    let moved = push(&registry, &other, "v1", None);
    assert_ne!(moved, digest);
    let (ok, _, stderr) = pull(&registry, &format!("{repo}:v1"), &["--digest", &digest]);
    assert!(!ok && stderr.contains("not the pinned"), "{stderr}");

    // The stored module changed behind the registry's back: the bytes no
    // longer match the digest the manifest names.
    let manifest: Value = serde_json::from_str(
        &get(
            &registry.host,
            &format!("/v2/policies/config-snapshot/manifests/{digest}"),
            "application/vnd.oci.image.manifest.v1+json",
        )
        .unwrap(),
    )
    .unwrap();
    let layer = manifest["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:");
    let blob = registry.dir.join(format!(
        "data/docker/registry/v2/blobs/sha256/{}/{layer}/data",
        &layer[..2]
    ));
    let mut stored = std::fs::read(&blob).unwrap();
    let last = stored.len() - 1;
    stored[last] ^= 0xff;
    std::fs::write(&blob, stored).unwrap();
    let (ok, pulled, stderr) = pull(&registry, &format!("{repo}@{digest}"), &[]);
    assert!(!ok, "a tampered module was pulled");
    assert!(pulled.is_empty(), "nothing is written when the module is refused");
    assert!(stderr.to_lowercase().contains("digest"), "{stderr}");
}

#[test]
fn a_module_runs_only_with_a_signature_by_the_trusted_key() {
    let Some(registry) = registry() else { return };
    let (signing, trusted) = key_pair(&registry, "release");
    let (_, stranger) = key_pair(&registry, "stranger");
    push(&registry, &policy(), "signed", Some(&signing));
    push(&registry, &policy(), "unsigned-copy", None);
    let other = another_module(&registry);
    push(&registry, &other, "unsigned", None);
    let repo = format!("{}/policies/config-snapshot", registry.host);
    let verify = |tag: &str, key: &Path| {
        pull(
            &registry,
            &format!("{repo}:{tag}"),
            &["--verify-key", key.to_str().unwrap()],
        )
    };

    let (ok, pulled, stderr) = verify("signed", &trusted);
    assert!(ok, "{stderr}");
    assert_eq!(pulled, module());
    // Same bytes, so same digest: the signature covers the module, not the tag.
    assert!(verify("unsigned-copy", &trusted).0);

    let (ok, pulled, stderr) = verify("signed", &stranger);
    assert!(!ok && pulled.is_empty(), "a stranger's key was accepted");
    assert!(
        stderr.contains("is not signed by") && stderr.contains("stranger.pub"),
        "{stderr}"
    );
    let (ok, _, stderr) = verify("unsigned", &trusted);
    assert!(!ok, "an unsigned module was accepted");
    assert!(stderr.contains("has no signature"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_pulls_pins_and_verifies_its_policy() {
    let Some(registry) = registry() else { return };
    let (signing, trusted) = key_pair(&registry, "release");
    let (_, stranger) = key_pair(&registry, "stranger");
    let digest = push(&registry, &policy(), "v1", Some(&signing));
    let api = ApiServer::start().await;
    let kubeconfig = api.kubeconfig();
    let source = format!("registry://{}/policies/config-snapshot:v1", registry.host);
    let trusted = trusted.display().to_string();
    let stranger = stranger.display().to_string();
    let host = registry.host.clone();
    // The API server stand-in runs on this runtime's workers; the blocking
    // waits below hold only the test's own thread.
    let serve = |extra: &[&str]| {
        let mut flags = vec!["--policy", source.as_str(), "--insecure-registry", host.as_str()];
        flags.extend(extra);
        ServeProcess::start(&kubeconfig, &flags)
    };

    let mut running = serve(&["--verify-key", &trusted, "--policy-digest", &digest]);
    running.wait_ready();
    let logs = running.logs();
    assert!(
        logs.contains(&format!("@{digest}")),
        "serve logs the digest it runs:\n{logs}"
    );
    running.stop();

    let zeros = format!("sha256:{}", "0".repeat(64));
    for (flags, why) in [
        (["--policy-digest", zeros.as_str()], "not the pinned"),
        (["--verify-key", stranger.as_str()], "is not signed by"),
    ] {
        let mut refused = serve(&flags);
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = refused.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "serve ran a module it should refuse:\n{}",
                refused.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        // The reader threads may still be draining the last lines.
        std::thread::sleep(Duration::from_millis(200));
        assert!(!status.success());
        let logs = refused.logs();
        assert!(logs.contains(why), "serve's refusal names why ({why}):\n{logs}");
        refused.stop();
    }
}
