//! serve's port attacked (docs/security.md, finding 4): the real binary, on
//! loopback, by callers that are not the API server and hold connections
//! instead of sending reviews. Places go to callers who finish their
//! handshake; idle connections, HTTP/1 or HTTP/2, give way or time out;
//! and the API server's calls are answered throughout.
//!
//! Attackers connect from other loopback addresses (127.0.0.2 and up) than
//! the API server's stand-in (127.0.0.1): peers, as serve counts them.
#![allow(clippy::too_many_lines, reason = "a test or benchmark is a story read top to bottom")]

mod support;

use std::time::{Duration, Instant};

use config_snapshot_testing::standin::ApiServer;
use serde_json::json;
use support::connections::{h2_idle, hold_h2, hold_tls, loopback, tcp, tls};
use support::process::ServeProcess;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One serve at a time: ports are picked free, not reserved.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn review() -> String {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "apiserver-1", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "namespace": "shop", "operation": "CREATE", "userInfo": {"username": "alice"},
        "object": {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "plain", "namespace": "shop"}},
        "oldObject": null, "dryRun": false}})
    .to_string()
}

/// The API server's call: a new connection from 127.0.0.1, one review over
/// HTTP/1.1. Its status, and how long it took.
async fn apiserver_call(serve: &ServeProcess) -> Result<(u16, Duration), String> {
    let started = Instant::now();
    let mut stream = tls(serve, loopback(1), b"http/1.1").await.map_err(|e| e.to_string())?;
    let body = review();
    let request = format!(
        "POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.map_err(|e| e.to_string())?;
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no HTTP answer: {answer:?}"))?;
    Ok((status, started.elapsed()))
}

/// 300 idle connections, their TLS done: 150 on HTTP/1.1 and 150 on
/// HTTP/2, from six addresses, past serve's 256 places. The API server's
/// calls are answered throughout, each within a second: an idle
/// connection gives its place to a caller with a request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_idle_connections_leave_the_api_server_answered() {
    let _serial = SERIAL.lock().await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let api = ApiServer::start().await;
    // Long timeouts: what lets the API server in is the eviction, not a
    // timeout that happens to pass.
    let mut serve = ServeProcess::start_logging(
        &api.kubeconfig(),
        &["--first-byte-timeout", "5m", "--idle-timeout", "5m"],
        "info",
    );
    serve.wait_ready();
    let mut h1 = Vec::new();
    let mut h2 = Vec::new();
    for peer in 2..=4 {
        h1.extend(hold_tls(&serve, loopback(peer), 50).await);
    }
    for peer in 5..=7 {
        h2.extend(hold_h2(&serve, loopback(peer), 50).await);
    }
    assert_eq!(h1.len() + h2.len(), 300);
    let opened = serve.metric("config_snapshot_webhook_connections ");
    assert!(opened <= 256.0, "at most --max-connections open: {opened}");
    // Let every held connection count as idle.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut slowest = Duration::ZERO;
    for _ in 0..20 {
        let (status, took) = apiserver_call(&serve).await.expect("the API server's call is answered");
        assert_eq!(status, 200);
        slowest = slowest.max(took);
    }
    assert!(slowest < Duration::from_secs(1), "the slowest call took {slowest:?}");
    assert!(serve.metric("config_snapshot_webhook_connections_evicted_total") > 0.0);
    eprintln!(
        "300 idle connections held; the API server's slowest of 20 calls: {slowest:?}; evicted: {}",
        serve.metric("config_snapshot_webhook_connections_evicted_total")
    );
    drop((h1, h2));
}

/// A connection that sends nothing after its handshake, HTTP/1.1 or
/// HTTP/2, is closed by --first-byte-timeout; one that goes quiet after a
/// request, by --idle-timeout; slow headers and slow bodies are cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_slow_clients_are_cut_off() {
    let _serial = SERIAL.lock().await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let api = ApiServer::start().await;
    let mut serve = ServeProcess::start_logging(
        &api.kubeconfig(),
        &[
            "--first-byte-timeout",
            "1s",
            "--idle-timeout",
            "2s",
            "--header-read-timeout",
            "1s",
            "--body-read-timeout",
            "1s",
        ],
        "info",
    );
    serve.wait_ready();
    let closed_within = |secs: u64| Duration::from_secs(secs);

    // HTTP/1.1, silent: EOF soon after the first-byte timeout.
    let started = Instant::now();
    let mut silent = tls(&serve, loopback(2), b"http/1.1").await.unwrap();
    let mut buffer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), silent.read_to_end(&mut buffer)).await;
    assert!(
        started.elapsed() < closed_within(4),
        "silent HTTP/1.1 held {:?}",
        started.elapsed()
    );

    // HTTP/2, silent after its preface: closed the same way.
    let started = Instant::now();
    let (_sender, driver) = h2_idle(&serve, loopback(3)).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), driver)
        .await
        .expect("serve closes an idle HTTP/2 connection")
        .unwrap();
    assert!(
        started.elapsed() < closed_within(5),
        "silent HTTP/2 held {:?}",
        started.elapsed()
    );

    // HTTP/2 that made one request, then went quiet: closed by the idle
    // timeout.
    let (mut sender, driver) = h2_idle(&serve, loopback(4)).await.unwrap();
    let request = hyper::Request::post("https://127.0.0.1/mutate")
        .header("content-type", "application/json")
        .body(review())
        .unwrap();
    let answer = sender.send_request(request).await.unwrap();
    assert_eq!(answer.status(), 200);
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(20), driver)
        .await
        .expect("serve closes an HTTP/2 connection gone quiet")
        .unwrap();
    assert!(
        started.elapsed() < closed_within(6),
        "quiet HTTP/2 held {:?}",
        started.elapsed()
    );

    // Headers sent slowly: cut off.
    let started = Instant::now();
    let mut slow = tls(&serve, loopback(5), b"http/1.1").await.unwrap();
    slow.write_all(b"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), slow.read_to_end(&mut rest)).await;
    assert!(
        started.elapsed() < closed_within(5),
        "slow headers held {:?}",
        started.elapsed()
    );

    // A body sent slower than the body timeout: an error status, soon.
    let started = Instant::now();
    let mut trickle = tls(&serve, loopback(6), b"http/1.1").await.unwrap();
    trickle
        .write_all(b"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"apiVersion\"")
        .await
        .unwrap();
    let mut answer = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), trickle.read_to_string(&mut answer)).await;
    assert!(
        started.elapsed() < closed_within(5),
        "slow body held {:?}",
        started.elapsed()
    );
    let status: u16 = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    assert!(status == 0 || status >= 400, "{answer}");
}

/// Connections that never finish their TLS handshake take no place: with
/// two places, twenty half-open connections from one address leave the
/// API server answered, and one address gets only a few handshakes at
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_handshakes_take_no_place() {
    let _serial = SERIAL.lock().await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let api = ApiServer::start().await;
    let mut serve = ServeProcess::start_logging(&api.kubeconfig(), &["--max-connections", "2"], "info");
    serve.wait_ready();
    let mut half_open = Vec::new();
    for _ in 0..20 {
        half_open.push(tcp(loopback(9), serve.webhook).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Past the address's handshakes: closed at once, unread.
    let mut closed = 0;
    for stream in &mut half_open {
        let mut byte = [0u8; 1];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(200), stream.read(&mut byte)).await {
            closed += 1;
        }
    }
    assert!(closed >= 4, "{closed} of 20 closed at once");
    for _ in 0..3 {
        let (status, took) = apiserver_call(&serve).await.expect("answered");
        assert_eq!(status, 200);
        assert!(took < Duration::from_secs(1), "{took:?}");
    }
    drop(half_open);
}
