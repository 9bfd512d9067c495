//! serve under load from a real load generator, `oha`, over TLS on
//! loopback with the API server stand-in behind it: pass-through requests
//! (a Deployment that does not opt in) and opted-in ones (a Deployment
//! whose ConfigMap is snapshotted) at 1, 16 and 64 connections.
//!
//! `make load` installs oha and runs the full table (`load_table`, ignored
//! by default) with an optimised build. The suite runs a short smoke of the
//! same path (`load_smoke`) with four clients of its own at once: a guard
//! (every request answered), not a measurement, so CI needs no oha.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

mod support;
use config_snapshot_testing::standin::ApiServer;
use support::paths::root;
use support::process::ServeProcess;

const NS: &str = "load";

fn oha() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("OHA") {
        return Some(path.into());
    }
    let installed = root().join("target/tools/bin/oha");
    if installed.exists() {
        return Some(installed);
    }
    Command::new("oha")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| PathBuf::from("oha"))
}

fn review(uid: &str, opted_in: bool) -> Value {
    let mut annotations = json!({});
    if opted_in {
        annotations["config-snapshot.io/snapshot"] = json!("configmap/app-config");
    }
    let object = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": NS, "annotations": annotations},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "nginx:1.25",
                "envFrom": [{"configMapRef": {"name": "app-config"}}]}]}}}
    });
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
            "name": "web", "namespace": NS, "operation": "CREATE",
            "userInfo": {"username": "load"}, "object": object, "oldObject": null,
            "dryRun": false, "options": {}
        }
    })
}

/// One oha run: (requests/s, p50 ms, p99 ms, errors).
fn run(oha: &Path, serve: &ServeProcess, body: &Path, connections: u32, seconds: u32) -> (f64, f64, f64, u64) {
    let out = Command::new(oha)
        .args(["--no-tui", "--output-format", "json", "--insecure", "-m", "POST"])
        .args(["-H", "content-type: application/json"])
        .arg("-D")
        .arg(body)
        .args(["-c", &connections.to_string(), "-z", &format!("{seconds}s")])
        .arg(format!("https://{}{}", serve.webhook, serve.door_path()))
        .output()
        .expect("oha runs");
    assert!(out.status.success(), "oha: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("oha's JSON: {e}: {}", String::from_utf8_lossy(&out.stdout)));
    let summary = &report["summary"];
    let percentile = |p: &str| report["latencyPercentiles"][p].as_f64().unwrap_or(f64::NAN) * 1000.0;
    let codes = report["statusCodeDistribution"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let not_ok: u64 = codes
        .iter()
        .filter(|(code, _)| code.as_str() != "200")
        .filter_map(|(_, n)| n.as_u64())
        .sum();
    // Requests cut off by the end of the run (`-z`) are not failures.
    let failed: u64 = report["errorDistribution"]
        .as_object()
        .map(|e| {
            e.iter()
                .filter(|(why, _)| !why.contains("aborted due to deadline"))
                .filter_map(|(_, n)| n.as_u64())
                .sum()
        })
        .unwrap_or(0);
    if not_ok + failed > 0 {
        eprintln!(
            "oha: status codes {}, errors {}",
            report["statusCodeDistribution"], report["errorDistribution"]
        );
    }
    (
        summary["requestsPerSec"].as_f64().unwrap_or(0.0),
        percentile("p50"),
        percentile("p99"),
        not_ok + failed,
    )
}

/// serve with the stand-in behind it, and the two request bodies.
async fn setup() -> (ApiServer, ServeProcess, PathBuf, PathBuf) {
    let api = ApiServer::start().await;
    api.put(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "app-config", "namespace": NS}, "data": {"mode": "blue"}}));
    // The Deployment the requests create, as the API server persists it
    // after the first: each admission's deferred adoption finds its owner
    // and ends, as in a cluster, instead of waiting out --effect-wait.
    api.put(review("first", true)["request"]["object"].clone());
    let mut serve = ServeProcess::start_logging(&api.kubeconfig(), &[], "info");
    serve.wait_ready();
    let dir = serve.dir.clone();
    let plain = dir.join("pass-through.json");
    let opted = dir.join("opted-in.json");
    std::fs::write(&plain, review("load-plain", false).to_string()).unwrap();
    std::fs::write(&opted, review("load-opted", true).to_string()).unwrap();
    (api, serve, plain, opted)
}

#[tokio::test(flavor = "multi_thread")]
async fn load_smoke() {
    // Four clients at once, as oha's smallest row, each with its own
    // connection: every request is answered, none refused. oha itself is
    // `make load`'s (a benchmark, not a guard).
    let (_api, serve, plain, opted) = setup().await;
    for body in [&plain, &opted] {
        let bytes = std::fs::read(body).unwrap();
        let clients: Vec<_> = (0..4)
            .map(|_| {
                let mut hook = support::webhook::Webhook::to(&serve);
                let bytes = bytes.clone();
                tokio::spawn(async move {
                    let mut codes = Vec::new();
                    for _ in 0..25 {
                        codes.push(hook.post(bytes.clone()).await.0);
                    }
                    codes
                })
            })
            .collect();
        let mut answered = 0;
        for client in clients {
            for code in client.await.unwrap() {
                assert_eq!(code, 200, "{}: refused under load\n{}", body.display(), serve.logs());
                answered += 1;
            }
        }
        assert_eq!(answered, 100, "{}", body.display());
    }
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "the full load table: make load"]
async fn load_table() {
    let oha = oha().expect("oha: make load installs it");
    let (_api, serve, plain, opted) = setup().await;
    let seconds: u32 = std::env::var("LOAD_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    println!("| request | connections | requests/s | p50 ms | p99 ms | errors |");
    println!("|---|---|---|---|---|---|");
    for (name, body) in [("pass-through", &plain), ("opted in", &opted)] {
        for connections in [1, 16, 64] {
            let (rps, p50, p99, errors) = run(&oha, &serve, body, connections, seconds);
            println!("| {name} | {connections} | {rps:.0} | {p50:.2} | {p99:.2} | {errors} |");
            assert_eq!(errors, 0, "{name} at {connections}: errors under load");
        }
    }
}
