//! serve attacked at its port (docs/security.md): the real binary, on
//! loopback, against the API server stand-in, driven by a caller that is
//! not the API server. Each test crosses one bound and checks that serve
//! refuses and writes nothing.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use config_snapshot_testing::standin::ApiServer;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{json, Value};
use support::process::ServeProcess;

/// One serve at a time: ports are picked free, not reserved.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A CA, and a client certificate it signed.
struct Issued {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

fn issue(name: &str) -> Issued {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("{name} CA"));
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kube-apiserver");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    Issued {
        ca_pem: ca.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

/// A TLS client to serve's webhook, trusting its certificate, presenting
/// `client` if given.
fn tls_config(serve: &ServeProcess, client: Option<&Issued>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(serve.cert_pem.as_bytes()).unwrap())
        .unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    Arc::new(match client {
        None => builder.with_no_client_auth(),
        Some(c) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(c.cert_pem.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(c.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
    })
}

/// One HTTP/1.1 request over TLS: the status, or the error that ended it.
fn post(serve: &ServeProcess, client: Option<&Issued>, body: &str) -> Result<(u16, String), String> {
    let config = tls_config(serve, client);
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let connection = rustls::ClientConnection::new(config, name).unwrap();
    let tcp = TcpStream::connect(serve.webhook).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = rustls::StreamOwned::new(connection, tcp);
    let request = format!(
        "POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
    let mut answer = String::new();
    tls.read_to_string(&mut answer).map_err(|e| e.to_string())?;
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no HTTP answer: {answer:?}"))?;
    Ok((
        status,
        answer
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default(),
    ))
}

fn review(namespace: &str, object: Value) -> String {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "forged-1", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "namespace": namespace, "operation": "CREATE", "userInfo": {"username": "mallory"},
        "object": object, "oldObject": null, "dryRun": false}})
    .to_string()
}

fn opted_in(namespace: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": namespace, "annotations": {"config-snapshot.io/snapshot": "*"}},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "x", "envFrom": [{"secretRef": {"name": "bootstrap-token"}}]}]}}}})
}

fn secret(namespace: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "bootstrap-token", "namespace": namespace}, "data": {"token": "aHVudGVyMg=="}})
}

fn snapshots(api: &ApiServer) -> Vec<Value> {
    api.list("Secret")
        .into_iter()
        .filter(|s| s["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "config-snapshot")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_client_ca_only_its_certificates_are_answered() {
    let _serial = SERIAL.lock().await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let api = ApiServer::start().await;
    let apiserver = issue("apiserver");
    let rogue = issue("rogue");
    let dir = std::env::temp_dir().join(format!("cs-mtls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("client-ca.crt");
    std::fs::write(&ca, &apiserver.ca_pem).unwrap();
    let mut serve = ServeProcess::start(&api.kubeconfig(), &["--client-ca", ca.to_str().unwrap()]);
    serve.wait_ready();
    let body = review(
        "shop",
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "plain", "namespace": "shop"}}),
    );
    let (serve, body) = tokio::task::spawn_blocking(move || {
        assert!(post(&serve, None, &body).is_err(), "no client certificate: refused");
        assert!(
            post(&serve, Some(&rogue), &body).is_err(),
            "another CA's certificate: refused"
        );
        let (status, _) = post(&serve, Some(&apiserver), &body).expect("the API server's certificate: answered");
        assert_eq!(status, 200);
        (serve, body)
    })
    .await
    .unwrap();
    drop((serve, body));
}

/// c7d6a24: curl posted a review for kube-system and serve wrote a
/// snapshot Secret there. A namespace the webhook excludes gets nothing
/// written, whoever sends the review; and the same forged review for an
/// ordinary namespace writes only what a real admission would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_review_for_an_excluded_namespace_writes_nothing() {
    let _serial = SERIAL.lock().await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let api = ApiServer::start().await;
    api.put(secret("kube-system"));
    api.put(secret("shop"));
    let mut serve = ServeProcess::start(&api.kubeconfig(), &[]);
    serve.wait_ready();
    let forged = review("kube-system", opted_in("kube-system"));
    let ordinary = review("shop", opted_in("shop"));
    let (serve, answers) = tokio::task::spawn_blocking(move || {
        let answers = (
            post(&serve, None, &forged).unwrap(),
            post(&serve, None, &ordinary).unwrap(),
        );
        (serve, answers)
    })
    .await
    .unwrap();
    let ((status, body), _) = &answers;
    assert_eq!(*status, 200);
    let response: Value = serde_json::from_str(body).unwrap();
    assert_eq!(response["response"]["allowed"], true);
    assert!(response["response"].get("patch").is_none(), "{body}");
    assert!(body.contains("does not act in namespace kube-system"), "{body}");
    let made = snapshots(&api);
    assert!(
        made.iter().all(|s| s["metadata"]["namespace"] != "kube-system"),
        "{made:?}"
    );
    // The name of the snapshot made in shop reveals nothing of the value:
    // it is keyed, not the content's SHA-256.
    assert_eq!(made.len(), 1, "{made:?}");
    let plain = config_snapshot_policy::content::Content::from_object(
        config_snapshot_policy::source::SourceKind::Secret,
        &secret("shop"),
    )
    .unwrap()
    .hash();
    let name = made[0]["metadata"]["name"].as_str().unwrap();
    assert!(!name.ends_with(&plain[..10]), "{name}");
    drop(serve);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_are_closed_and_slow_clients_cut_off() {
    let _serial = SERIAL.lock().await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let api = ApiServer::start().await;
    let mut serve = ServeProcess::start(
        &api.kubeconfig(),
        &[
            "--max-connections",
            "2",
            "--header-read-timeout",
            "1s",
            "--body-read-timeout",
            "1s",
        ],
    );
    serve.wait_ready();
    tokio::task::spawn_blocking(move || {
        // Two idle connections hold both places; a third is closed at once.
        let held: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(serve.webhook).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(300));
        let body = review("shop", json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "plain", "namespace": "shop"}}));
        assert!(post(&serve, None, &body).is_err(), "a third connection is refused");
        drop(held);
        let deadline = Instant::now() + Duration::from_secs(15);
        // The places free up once those connections close (or time out).
        loop {
            match post(&serve, None, &body) {
                Ok((status, _)) => {
                    assert_eq!(status, 200);
                    break;
                }
                Err(e) => assert!(Instant::now() < deadline, "never answered again: {e}"),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        // A client that sends its headers slowly is cut off.
        let started = Instant::now();
        let config = tls_config(&serve, None);
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let tcp = TcpStream::connect(serve.webhook).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut tls = rustls::StreamOwned::new(rustls::ClientConnection::new(config.clone(), name.clone()).unwrap(), tcp);
        tls.write_all(b"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\n").unwrap();
        let mut rest = Vec::new();
        let _ = tls.read_to_end(&mut rest);
        assert!(started.elapsed() < Duration::from_secs(10), "headers: held {:?}", started.elapsed());
        // One that sends a body slower than the body timeout gets no answer
        // from the policy: an error status, soon.
        let started = Instant::now();
        let tcp = TcpStream::connect(serve.webhook).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut tls = rustls::StreamOwned::new(rustls::ClientConnection::new(config, name).unwrap(), tcp);
        tls.write_all(b"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"apiVersion\"")
            .unwrap();
        let mut answer = String::new();
        let _ = tls.read_to_string(&mut answer);
        assert!(started.elapsed() < Duration::from_secs(10), "body: held {:?}", started.elapsed());
        let status: u16 = answer.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        assert!(status == 0 || status >= 400, "{answer}");
    })
    .await
    .unwrap();
}

/// Without --signing-key-file, the first serve makes the key Secret in its
/// own namespace, and a restart (or another replica) reads the same key:
/// the snapshot a second serve makes for the same content has the same
/// keyed name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_signing_key_is_made_once_and_shared() {
    let _serial = SERIAL.lock().await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let api = ApiServer::start().await;
    api.put(secret("shop"));
    let flags = [
        "--signing-key-secret",
        "config-snapshot-signing-key",
        "--namespace",
        "config-snapshot",
    ];
    let mut serve = ServeProcess::start(&api.kubeconfig(), &flags);
    serve.wait_ready();
    let key = api
        .get("Secret", "config-snapshot", "config-snapshot-signing-key")
        .expect("made on first start");
    assert_eq!(key["immutable"], true);
    let ordinary = review("shop", opted_in("shop"));
    let names = |api: &ApiServer| -> Vec<String> {
        snapshots(api)
            .iter()
            .map(|s| s["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    let post_once = |serve: ServeProcess| {
        let body = ordinary.clone();
        std::thread::spawn(move || {
            let answer = post(&serve, None, &body).unwrap();
            (serve, answer)
        })
        .join()
        .unwrap()
    };
    let (s, (status, _)) = post_once(serve);
    assert_eq!(status, 200);
    let first = names(&api);
    assert_eq!(first.len(), 1);
    serve = s;
    serve.restart(&api.kubeconfig(), &flags);
    serve.wait_ready();
    assert_eq!(
        api.get("Secret", "config-snapshot", "config-snapshot-signing-key")
            .unwrap()["data"],
        key["data"],
        "the same key"
    );
    let (_serve, (status, _)) = post_once(serve);
    assert_eq!(status, 200);
    assert_eq!(names(&api), first, "the same keyed name: reused, not made again");
}
