//! serve's wasm pool, shared by the API server's reviews and serve's own
//! evaluations (the finding "the wasm pool is overcommitted"): the real
//! binary, the stand-in API server slow to answer, a tenant whose watched
//! ConfigMaps change in a loop and keep serve's judges of changed sources
//! evaluating, and the API server's reviews of another namespace sent
//! meanwhile. Each review gets its answer: none is a 500, which the API
//! server (failurePolicy Ignore) would take to let the write through
//! unpinned.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use config_snapshot_testing::standin::ApiServer;
use serde_json::{json, Value};
use support::process::ServeProcess;
use support::webhook::Webhook;

/// The tenant's watched ConfigMaps: more than the judges, so that both
/// always have one to judge.
const SOURCES: [&str; 8] = ["c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7"];

/// A source's content in `round`: large enough that each judgement takes
/// its instance for a while.
fn source(name: &str, round: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "tenant"}, "data": {"k": format!("v{round}-{}", "x".repeat(256 << 10))}})
}

/// A Deployment of the tenant's that reads and watches every source.
fn watcher() -> Value {
    let from: Vec<Value> = SOURCES.iter().map(|s| json!({"configMapRef": {"name": s}})).collect();
    let watch: Vec<String> = SOURCES.iter().map(|s| format!("configmap/{s}")).collect();
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "busy", "namespace": "tenant", "uid": "busy-uid",
            "annotations": {"config-snapshot.io/watch": watch.join(",")}},
        "spec": {"selector": {"matchLabels": {"app": "busy"}}, "template": {"metadata": {"labels": {"app": "busy"}},
            "spec": {"containers": [{"name": "busy", "image": "x:1", "envFrom": from}]}}}})
}

/// A dry run of an opted-in Deployment of shop's reading ConfigMap `app`:
/// its evaluation waits for that read of the API server.
fn shops_review() -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop", "annotations": {"config-snapshot.io/snapshot": "*"}},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "x:1", "envFrom": [{"configMapRef": {"name": "app"}}]}]}}}})
}

/// Two instances: one kept for the pass, one shared by the API server's
/// reviews and the two judges. Before the engine counted its instances,
/// the API server's review had its slot while both judges evaluated
/// without one, and the pool refused it: a 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reviews_are_answered_while_the_judges_of_changed_sources_are_busy() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let api = ApiServer::start().await;
    api.put(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "app", "namespace": "shop"}, "data": {"k": "v"}}));
    for name in SOURCES {
        api.put(source(name, 0));
    }
    api.put(watcher());
    let mut serve = ServeProcess::start_logging(&api.kubeconfig(), &["--policy-instances", "2"], "info");
    serve.wait_ready();
    let api = Arc::new(api);
    let editing = Arc::new(AtomicBool::new(true));
    let editor = {
        let (api, editing) = (api.clone(), editing.clone());
        tokio::spawn(async move {
            let mut round = 1;
            while editing.load(Ordering::SeqCst) {
                for name in SOURCES {
                    api.put(source(name, round));
                }
                round += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    // The judges at work before the reviews come.
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Four connections, as the API server keeps a few, ten reviews each.
    let callers: Vec<_> = (0..4)
        .map(|caller| {
            let mut hook = Webhook::to(&serve);
            tokio::spawn(async move {
                let mut failed = Vec::new();
                for i in 0..10 {
                    let uid = format!("shop-{caller}-{i}");
                    if let Err(e) = hook.admit("shop", &uid, "CREATE", &shops_review(), None, true).await {
                        failed.push(e);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                failed
            })
        })
        .collect();
    let mut failed = Vec::new();
    for caller in callers {
        failed.extend(caller.await.unwrap());
    }
    editing.store(false, Ordering::SeqCst);
    editor.await.unwrap();
    let judged = serve.metric("config_snapshot_admission_duration_seconds_count{kind=\"ConfigMap\"");
    eprintln!("{judged} judgements; {} of 40 reviews refused", failed.len());
    let logs = serve.logs();
    serve.stop();
    assert!(judged >= 20.0, "the judges were at work: {judged} judgements");
    assert!(
        failed.is_empty(),
        "every review answered, none refused for want of an instance: {failed:?}"
    );
    assert!(
        !logs.contains("instantiating the policy"),
        "no evaluation was refused an instance"
    );
}
