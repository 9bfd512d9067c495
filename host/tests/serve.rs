//! `config-snapshot serve` end to end: the real binary, on loopback, with a
//! test certificate, against the in-process API server stand-in. The test
//! plays the API server's part around the webhook: it sends the
//! AdmissionReviews, persists what was admitted, and creates the ReplicaSet
//! the Deployment controller would.
#![allow(clippy::too_many_lines, reason = "a test or benchmark is a story read top to bottom")]

mod support;

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use config_snapshot_testing::standin::ApiServer;
use serde_json::{json, Value};
use support::webhook::Webhook;

const NS: &str = "shop";
/// Planted in a Secret; must never leave it.
const CANARY: &str = "canary-7f3a9c-do-not-log";

use support::process::ServeProcess;

/// One serve process at a time in this file: the tests run in parallel
/// threads, and two of them once disagreed about objects neither made
/// (picked-free ports are not reserved between the pick and serve's bind).
static SERIAL: Mutex<()> = Mutex::new(());

struct Serve {
    /// The process, from the shared test support (certificate, ports, logs).
    process: ServeProcess,
    /// The webhook's HTTPS client; its `responses` feed the canary check.
    hook: Webhook,
    /// Last, so the process is killed before the next test may start one.
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Serve {
    fn start(api: &ApiServer, extra: &[&str]) -> Serve {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let kubeconfig = api.kubeconfig();
        // A short storm guard unless the test sets its own.
        let guard: &[&str] = if extra.contains(&"--watch-min-interval") {
            &[]
        } else {
            &["--watch-min-interval", "1s"]
        };
        let flags: Vec<&str> = guard.iter().chain(extra).copied().collect();
        let process = ServeProcess::start(&kubeconfig, &flags);
        Serve {
            hook: Webhook::to(&process),
            process,
            _serial: serial,
        }
    }

    fn ops_get(&self, path: &str) -> Option<(u16, String)> {
        self.process.ops_get(path)
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some((200, _)) = self.ops_get("/readyz") {
                return;
            }
            if let Some(status) = self.process.child.try_wait().unwrap() {
                panic!("serve exited with {status}:\n{}", self.logs());
            }
            assert!(Instant::now() < deadline, "serve never became ready:\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn post(&mut self, body: Vec<u8>) -> (u16, String) {
        self.hook.post(body).await
    }

    /// Sends an AdmissionRequest; returns the response and the object as
    /// the API server would persist it (with the JSON Patch applied).
    async fn admit(
        &mut self,
        uid: &str,
        operation: &str,
        object: &Value,
        old: Option<&Value>,
        dry_run: bool,
    ) -> (Value, Value) {
        match self.hook.admit(NS, uid, operation, object, old, dry_run).await {
            Ok(answer) => answer,
            Err(e) => panic!("{e}\n{}", self.logs()),
        }
    }

    fn logs(&self) -> String {
        self.process.logs()
    }

    fn metric(&self, name: &str) -> f64 {
        self.process.metric(name)
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.process.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.process.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "serve did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

async fn eventually<T>(what: &str, serve: &Serve, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n{}",
            serve.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The Secret holding the canary, as a user would have it.
fn canary_secret() -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "app-secret", "namespace": NS},
        "data": {"token": base64::engine::general_purpose::STANDARD.encode(CANARY)}})
}

/// Neither the canary nor a prefix of its base64 appears in any of `haystacks`.
fn assert_canary_absent(haystacks: &[&str]) {
    let encoded = base64::engine::general_purpose::STANDARD.encode(CANARY);
    for haystack in haystacks {
        assert!(!haystack.contains(CANARY), "the Secret canary leaked");
        assert!(!haystack.contains(&encoded[..16]), "the Secret canary leaked in base64");
    }
}

fn config_map(mode: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app-config", "namespace": NS},
           "data": {"mode": mode}})
}

fn deployment() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": NS, "annotations": {
            "config-snapshot.io/watch": "app-config",
            "config-snapshot.io/snapshot": "secret/app-secret"}},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "nginx:1.25", "env": [
                {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "app-config", "key": "mode"}}},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "app-secret", "key": "token"}}}]}]}}}
    })
}

fn env_ref<'a>(workload: &'a Value, var: &str, ref_kind: &str) -> &'a str {
    workload["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == var)
        .and_then(|e| e["valueFrom"][ref_kind]["name"].as_str())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_admits_snapshots_adopts_and_rolls_out_over_https() {
    let api = ApiServer::start().await;
    api.put(config_map("blue"));
    let secret = canary_secret();
    api.put(secret.clone());
    let mut serve = Serve::start(&api, &[]);
    serve.wait_ready().await;
    assert_eq!(serve.ops_get("/healthz").map(|r| r.0), Some(200));

    // 1. A Deployment is admitted with its references pinned to snapshots.
    let (response, web) = serve.admit("create-web", "CREATE", &deployment(), None, false).await;
    assert_eq!(response["allowed"], true, "{response}");
    let blue = env_ref(&web, "MODE", "configMapKeyRef").to_string();
    let secret_snapshot = env_ref(&web, "TOKEN", "secretKeyRef").to_string();
    assert!(blue.starts_with("app-config-"), "{blue}");
    assert!(secret_snapshot.starts_with("app-secret-"), "{secret_snapshot}");
    let snapshot = api
        .get("ConfigMap", NS, &blue)
        .expect("the ConfigMap snapshot exists in the API server");
    assert_eq!(snapshot["immutable"], true);
    assert_eq!(snapshot["data"]["mode"], "blue");
    assert_eq!(
        snapshot["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "config-snapshot"
    );
    let copy = api
        .get("Secret", NS, &secret_snapshot)
        .expect("the Secret snapshot exists");
    assert_eq!(copy["data"], secret["data"]);
    let web = api.put(web);

    // 2. A dry run writes nothing.
    let names = || -> BTreeSet<String> {
        api.list("ConfigMap")
            .iter()
            .chain(api.list("Secret").iter())
            .map(|o| {
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap_or_default(),
                    o["metadata"]["name"].as_str().unwrap_or_default()
                )
            })
            .collect()
    };
    let before_names = names();
    let before = api.list("ConfigMap").len() + api.list("Secret").len();
    let mut preview_config = config_map("preview");
    preview_config["metadata"]["name"] = json!("preview-config");
    api.put(preview_config);
    let other: Value = serde_json::from_str(&deployment().to_string().replace("app-config", "preview-config")).unwrap();
    let (response, _) = serve.admit("dry-run", "CREATE", &other, None, true).await;
    assert_eq!(response["allowed"], true, "{response}");
    let before = before + 1;
    assert_eq!(
        api.list("ConfigMap").len() + api.list("Secret").len(),
        before,
        "a dry run created objects: before {before_names:?}, after {:?}; serve's log:\n{}",
        names(),
        serve.logs()
    );

    // 3. The controller's ReplicaSet is admitted; serve adopts the snapshots.
    let rs = json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "web-1", "namespace": NS,
            "annotations": {"deployment.kubernetes.io/revision": "1"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                                 "uid": web["metadata"]["uid"], "controller": true}]},
        "spec": {"selector": web["spec"]["selector"], "template": web["spec"]["template"]}
    });
    let (response, rs) = serve.admit("create-rs", "CREATE", &rs, None, false).await;
    assert_eq!(response["allowed"], true, "{response}");
    let rs = api.put(rs);
    let rs_uid = rs["metadata"]["uid"].clone();
    for (kind, name) in [("ConfigMap", &blue), ("Secret", &secret_snapshot)] {
        eventually("adoption by the ReplicaSet", &serve, || {
            let s = api.get(kind, NS, name)?;
            s["metadata"]["ownerReferences"]
                .as_array()?
                .iter()
                .any(|r| r["uid"] == rs_uid && r["kind"] == "ReplicaSet")
                .then_some(())
        })
        .await;
    }

    // 4. Editing the watched ConfigMap: the webhook is not asked (its
    //    rules leave sources out), and a review of the edit sent anyway is
    //    answered untouched and decides nothing. Once the edit is stored,
    //    serve's watch sees it: the rollout makes the snapshot from the
    //    stored source and patches.
    let stored = api.get("ConfigMap", NS, "app-config").unwrap();
    let mut edit = stored.clone();
    edit["data"] = config_map("green")["data"].clone();
    let (response, green_cm) = serve.admit("edit-cm", "UPDATE", &edit, Some(&stored), false).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(
        response.get("patch").is_none(),
        "a source's review is answered untouched: {response}"
    );
    let green = snapshot_of("green");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let unchanged = api.get("Deployment", NS, "web").unwrap();
    assert_eq!(
        env_ref(&unchanged, "MODE", "configMapKeyRef"),
        blue,
        "rolled out before the edit was persisted"
    );
    assert!(
        api.get("ConfigMap", NS, &green).is_none(),
        "a snapshot of content not stored yet"
    );
    api.put(green_cm);
    let rolled = eventually("the watch rollout", &serve, || {
        let w = api.get("Deployment", NS, "web")?;
        (env_ref(&w, "MODE", "configMapKeyRef") == green).then_some(w)
    })
    .await;
    assert_eq!(
        env_ref(&rolled, "TOKEN", "secretKeyRef"),
        secret_snapshot,
        "the Secret reference moved"
    );
    assert_eq!(
        rolled["spec"]["template"]["spec"]["containers"][0]["image"],
        "nginx:1.25"
    );
    assert!(
        api.log()
            .iter()
            .any(|l| l == &format!("PATCH /apis/apps/v1/namespaces/{NS}/deployments/web")),
        "{:?}",
        api.log()
    );

    // 5. A Secret edit's review, carrying the canary, is answered untouched.
    let mut edited = secret.clone();
    edited["data"]["token"] = json!(base64::engine::general_purpose::STANDARD.encode(format!("{CANARY}-2")));
    let (response, _) = serve
        .admit("edit-secret", "UPDATE", &edited, Some(&secret), false)
        .await;
    assert_eq!(response["allowed"], true, "{response}");

    // 6. Bad input is answered, not crashed on.
    let (code, text) = serve.post(b"{not json".to_vec()).await;
    assert_eq!(code, 400, "{text}");
    let (code, text) = serve
        .post(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec())
        .await;
    assert_eq!(code, 400, "{text}");
    let garbage = json!({"request": {"uid": "g", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "operation": "CREATE", "namespace": NS, "object": "garbage"}});
    let (code, text) = serve.post(serde_json::to_vec(&garbage).unwrap()).await;
    assert_eq!(code, 200, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["response"]["uid"], "g");

    // 7. The counters moved.
    assert!(serve.metric("config_snapshot_snapshots_created_total") >= 3.0);
    assert!(serve.metric("config_snapshot_snapshot_adoptions_total") >= 2.0);
    assert_eq!(serve.metric("config_snapshot_watch_rollouts_total"), 1.0);
    assert!(serve.metric("config_snapshot_admission_decisions_total{decision=\"mutated\"") >= 2.0);
    assert!(serve.metric("config_snapshot_admission_duration_seconds_count") >= 6.0);
    assert!(serve.metric("config_snapshot_deferred_effects_total{effect=\"patch_workload\",outcome=\"done\"") >= 1.0);
    assert!(serve.metric("config_snapshot_effect_wait_seconds_count") >= 1.0);
    assert_eq!(serve.metric("config_snapshot_leader "), 1.0, "one replica leads alone");

    // `kubectl describe` tells the story: an Event on the Deployment names
    // the source that changed and the snapshot it rolled out.
    let rolled = eventually("the rollout Event", &serve, || event_on(&api, "ConfigRolledOut", "web")).await;
    assert_eq!(rolled["regarding"]["kind"], "Deployment");
    assert_eq!(rolled["type"], "Normal");
    assert_eq!(rolled["reportingController"], "config-snapshot.io/serve");
    let note = rolled["note"].as_str().unwrap();
    assert!(
        note.starts_with("configmap/app-config changed: rolling out with snapshot app-config-"),
        "{note}"
    );

    let metrics = serve.ops_get("/metrics").expect("metrics").1;
    // Where the admissions' time went: the snapshots they made, timed per
    // host call.
    assert!(
        metrics.lines().any(|l| l
            .starts_with("config_snapshot_host_call_duration_seconds_count{operation=\"create_snapshots\"}")
            && !l.ends_with(" 0")),
        "{metrics}"
    );

    // 8. Graceful shutdown on SIGTERM.
    let status = serve.terminate();
    assert!(status.success(), "exit status {status}\n{}", serve.logs());

    if std::env::var_os("DUMP_SERVE_LOGS").is_some() {
        eprintln!("{}", serve.logs());
    }
    // 9. The Secret's data never left it: not in logs, metrics or answers.
    let logs = serve.logs();
    assert!(
        logs.contains("\"admission\""),
        "the logs are JSON lines with admissions:\n{logs}"
    );
    // Each admission and each deferred effect is a span its lines carry.
    for span in ["admission", "effect"] {
        assert!(
            logs.lines()
                .any(|l| l.contains("\"span\":{") && l.contains(&format!("\"name\":\"{span}\""))),
            "no line inside a {span} span:\n{logs}"
        );
    }
    assert_canary_absent(&[&logs, &metrics, &serve.hook.responses.join("\n")]);
}

/// A pod whose credentials the API server refuses, as one left over from
/// an uninstalled release (its ServiceAccount deleted) is refused, reports
/// itself not ready, so its Service sends it no more admissions; its
/// readiness probe asks again, and it is ready once they are accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_whose_credentials_are_refused_is_not_ready_until_they_are_accepted() {
    let api = ApiServer::start().await;
    api.put(config_map("blue"));
    let mut serve = Serve::start(&api, &[]);
    serve.wait_ready().await;

    api.refuse_credentials(true);
    let (response, _) = serve.admit("refused", "CREATE", &deployment(), None, false).await;
    assert_eq!(response["allowed"], false, "nothing read, nothing pinned: {response}");
    for _ in 0..3 {
        let (code, body) = serve.ops_get("/readyz").expect("readyz answers");
        assert_eq!(code, 503, "{body}");
        assert!(body.contains("refuses serve's credentials"), "{body}");
    }
    assert!(
        serve.logs().contains("refuses serve's credentials"),
        "said in the log:\n{}",
        serve.logs()
    );
    // Probed in a loop, it asks the API server at most once a second.
    let asked = |api: &ApiServer| api.log().iter().filter(|r| r.contains("kube-root-ca.crt")).count();
    let before = asked(&api);
    let started = Instant::now();
    for _ in 0..200 {
        serve.ops_get("/readyz").expect("readyz answers");
    }
    let seconds = started.elapsed().as_secs() as usize;
    assert!(
        asked(&api) - before <= seconds + 1,
        "{} asks in {seconds} s",
        asked(&api) - before
    );

    api.refuse_credentials(false);
    eventually("ready again", &serve, || {
        matches!(serve.ops_get("/readyz"), Some((200, _))).then_some(())
    })
    .await;
    let (response, web) = serve.admit("accepted", "CREATE", &deployment(), None, false).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(env_ref(&web, "MODE", "configMapKeyRef").starts_with("app-config-"));
    assert!(serve.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_invalid_settings_at_start() {
    let api = ApiServer::start().await;
    let mut serve = Serve::start(&api, &["--settings-json", r#"{"noSuchSetting": 1}"#]);
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = serve.process.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "serve kept running with invalid settings");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!status.success());
    std::thread::sleep(Duration::from_millis(200));
    assert!(serve.logs().contains("invalid settings"), "{}", serve.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resync_renews_a_workload_whose_renewal_is_due() {
    let api = ApiServer::start().await;
    let secret = |cert: &str| {
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
               "metadata": {"name": "tls", "namespace": NS},
               "data": {"tls.crt": base64::engine::general_purpose::STANDARD.encode(cert),
                        "tls.key": base64::engine::general_purpose::STANDARD.encode("key")}})
    };
    api.put(secret("cert-v1"));
    let mut serve = Serve::start(&api, &["--resync-interval", "1s"]);
    serve.wait_ready().await;
    let edge = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "edge", "namespace": NS, "annotations": {
            "config-snapshot.io/snapshot": "secret/tls", "config-snapshot.io/renew-duration": "24h"}},
        "spec": {"selector": {"matchLabels": {"app": "edge"}}, "template": {
            "metadata": {"labels": {"app": "edge"}},
            "spec": {"containers": [{"name": "edge", "image": "envoy:1",
                                     "volumeMounts": [{"name": "tls", "mountPath": "/tls"}]}],
                     "volumes": [{"name": "tls", "secret": {"secretName": "tls"}}]}}}
    });
    let (response, mut edge) = serve.admit("create-edge", "CREATE", &edge, None, false).await;
    assert_eq!(response["allowed"], true, "{response}");
    let volume = |w: &Value| {
        w["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let first = volume(&edge);
    assert!(first.starts_with("tls-"), "{first}");
    // A day later (the last renewal is old), and cert-manager has rotated
    // the Secret in place.
    edge["spec"]["template"]["metadata"]["annotations"]["config-snapshot.io/renewed-at"] =
        json!("2026-01-01T00:00:00Z");
    api.put(edge);
    api.put(secret("cert-v2"));
    let renewed = eventually("the resync's renewal", &serve, || {
        let w = api.get("Deployment", NS, "edge")?;
        (volume(&w) != first).then_some(w)
    })
    .await;
    let snapshot = api
        .get("Secret", NS, &volume(&renewed))
        .expect("the renewed snapshot exists");
    assert_eq!(snapshot["type"], "kubernetes.io/tls");
    assert_eq!(
        snapshot["data"]["tls.crt"],
        base64::engine::general_purpose::STANDARD.encode("cert-v2")
    );
    let stamp = renewed["spec"]["template"]["metadata"]["annotations"]["config-snapshot.io/renewed-at"].clone();
    assert_ne!(stamp, "2026-01-01T00:00:00Z");
    // Renewed once: the next passes find it current and leave it alone.
    let version = renewed["metadata"]["resourceVersion"].clone();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        api.get("Deployment", NS, "edge").unwrap()["metadata"]["resourceVersion"],
        version,
        "renewed again"
    );
    assert!(serve.logs().contains("renew: Deployment/edge renewed its snapshots"));
    let renewed_event = eventually("the renewal Event", &serve, || event_on(&api, "ConfigRenewed", "edge")).await;
    assert_eq!(renewed_event["action"], "Renew");
}

/// RBAC that lost `create` on Secrets: the Deployment is refused with the
/// API server's status (its message is not kept of a Secret's write), no reference points at a snapshot that was never
/// made, the error is counted, and the Secret's data appears nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_secret_snapshot_is_refused_clearly_and_leaks_nothing() {
    let api = ApiServer::start().await;
    api.put(config_map("blue"));
    api.put(canary_secret());
    api.forbid(axum::http::Method::POST, "Secret");
    let mut serve = Serve::start(&api, &[]);
    serve.wait_ready().await;

    // Default onSnapshotFailure: reject.
    let (response, _) = serve.admit("create-web", "CREATE", &deployment(), None, false).await;
    assert_eq!(response["allowed"], false, "{response}");
    let message = response["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("could not create snapshot")
            && message.contains("app-secret")
            && message.contains("403 Forbidden"),
        "{message}"
    );
    // Of a Secret's failed write the status alone: the API server's message
    // may quote what an admission denied (eff3694's review, finding 9).
    assert!(!message.contains("cannot create"), "{message}");
    assert!(response.get("patch").is_none(), "{response}");
    assert!(
        api.list("Secret").iter().all(|s| s["metadata"]["name"] == "app-secret"),
        "a Secret snapshot appeared"
    );
    assert!(serve.metric("config_snapshot_host_call_errors_total{operation=\"create_snapshot\"") >= 1.0);
    assert!(serve.metric("config_snapshot_admission_decisions_total{decision=\"denied\"") >= 1.0);
    let metrics = serve.ops_get("/metrics").expect("metrics").1;

    // With onSnapshotFailure: warn, the reference stays on the source.
    drop(serve);
    let mut serve = Serve::start(&api, &["--settings-json", r#"{"onSnapshotFailure": "warn"}"#]);
    serve.wait_ready().await;
    let (response, web) = serve
        .admit("create-web-warn", "CREATE", &deployment(), None, false)
        .await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(env_ref(&web, "TOKEN", "secretKeyRef"), "app-secret");
    assert!(env_ref(&web, "MODE", "configMapKeyRef").starts_with("app-config-"));
    let warnings = response["warnings"].to_string();
    assert!(warnings.contains("left the reference to the source"), "{warnings}");

    let logs = serve.logs();
    assert!(serve.terminate().success());
    assert_canary_absent(&[&logs, &metrics, &serve.hook.responses.join("\n")]);
}

/// The Event with `reason` on the workload `name`, once it is there.
fn event_on(api: &ApiServer, reason: &str, name: &str) -> Option<Value> {
    api.list("Event")
        .into_iter()
        .find(|e| e["reason"] == reason && e["regarding"]["name"] == name)
}

/// serve with `extra` flags, app-config at `blue` and the canary Secret,
/// and `web` admitted and persisted. Returns web and its blue snapshot.
async fn web_on_blue(api: &ApiServer, extra: &[&str]) -> (Serve, Value, String) {
    api.put(config_map("blue"));
    api.put(canary_secret());
    let mut serve = Serve::start(api, extra);
    serve.wait_ready().await;
    let (_, web) = serve.admit("create-web", "CREATE", &deployment(), None, false).await;
    let web = api.put(web);
    cache_sees(&serve, &web).await;
    let blue = env_ref(&web, "MODE", "configMapKeyRef").to_string();
    (serve, web, blue)
}

/// Waits for serve's cache to hold `object` as stored. Admissions find
/// watchers in that cache, and a watch can lag a write by some
/// milliseconds: an edit admitted before it catches up rolls nothing out
/// until the resync, as on a real cluster.
async fn cache_sees(serve: &Serve, object: &Value) {
    let meta = &object["metadata"];
    let line = format!(
        r#""message":"cache applied","kind":"{}","namespace":"{}","name":"{}","resource_version":"{}""#,
        object["kind"].as_str().unwrap(),
        meta["namespace"].as_str().unwrap(),
        meta["name"].as_str().unwrap(),
        meta["resourceVersion"].as_str().unwrap(),
    );
    eventually("serve's cache to see the write", serve, || {
        serve.logs().contains(&line).then_some(())
    })
    .await;
}

/// The ReplicaSet the Deployment controller makes for `web`'s current
/// template, as revision `revision`.
fn replica_set(web: &Value, revision: u32) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": format!("web-{revision}"), "namespace": NS,
            "labels": web["spec"]["template"]["metadata"]["labels"],
            "annotations": {"deployment.kubernetes.io/revision": revision.to_string()},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                                 "uid": web["metadata"]["uid"], "controller": true}]},
        "spec": {"selector": web["spec"]["selector"], "template": web["spec"]["template"]}
    })
}

/// The name of app-config's snapshot holding `mode`.
fn snapshot_of(mode: &str) -> String {
    let content = config_snapshot_policy::model::content::Content::from_object(
        config_snapshot_policy::model::source::SourceKind::ConfigMap,
        &config_map(mode),
    )
    .unwrap();
    config_snapshot::cluster::proof::Prover::new(&support::process::HARNESS_KEY).snapshot_name(
        NS,
        "app-config",
        &content,
    )
}

/// Edits app-config to `mode` as a user would: admitted, then persisted.
/// Returns the name of the snapshot a watch rollout makes of the new
/// content: not at the admission (nothing is stored yet), but once the
/// rollout runs.
async fn edit_config(serve: &mut Serve, api: &ApiServer, mode: &str) -> String {
    let stored = api.get("ConfigMap", NS, "app-config").unwrap();
    let mut edit = stored.clone();
    edit["data"] = config_map(mode)["data"].clone();
    let (response, persisted) = serve
        .admit(&format!("edit-{mode}"), "UPDATE", &edit, Some(&stored), false)
        .await;
    assert_eq!(response["allowed"], true, "{response}");
    api.put(persisted);
    snapshot_of(mode)
}

/// `kubectl rollout undo` while a watch rollout waits out the storm guard:
/// the rollback wins. When the guard lets go, the held rollout is dropped
/// with a RolloutDropped Event saying why; later passes do not bring the
/// content back, and the snapshot made for it is collected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_drops_the_rollout_the_storm_guard_held_and_says_so() {
    let api = ApiServer::start().await;
    let (mut serve, web, blue) = web_on_blue(&api, &["--watch-min-interval", "5s", "--resync-interval", "1s"]).await;
    let (_, rs1) = serve
        .admit("create-rs-1", "CREATE", &replica_set(&web, 1), None, false)
        .await;
    let rs1 = api.put(rs1);

    // green rolls out at once: the guard is free.
    let green = edit_config(&mut serve, &api, "green").await;
    let web = eventually("the green rollout", &serve, || {
        let w = api.get("Deployment", NS, "web")?;
        (env_ref(&w, "MODE", "configMapKeyRef") == green).then_some(w)
    })
    .await;
    let (_, rs2) = serve
        .admit("create-rs-2", "CREATE", &replica_set(&web, 2), None, false)
        .await;
    api.put(rs2);

    // red comes within the interval: the guard holds its rollout back.
    let red = edit_config(&mut serve, &api, "red").await;
    eventually("the guard to hold the red rollout", &serve, || {
        serve.logs().contains("held by the storm guard").then_some(())
    })
    .await;

    // The user rolls back to revision 1: the controller copies its template.
    let current = api.get("Deployment", NS, "web").unwrap();
    let mut undo = current.clone();
    undo["spec"]["template"] = rs1["spec"]["template"].clone();
    let (response, undone) = serve.admit("undo", "UPDATE", &undo, Some(&current), false).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(
        undone["metadata"]["annotations"]["config-snapshot.io/rollback"].is_string(),
        "the rollback was not recognised: {undone}"
    );
    api.put(undone);

    let dropped = eventually("the RolloutDropped Event", &serve, || {
        event_on(&api, "RolloutDropped", "web")
    })
    .await;
    assert_eq!(dropped["type"], "Normal");
    assert_eq!(dropped["action"], "Drop");
    let note = dropped["note"].as_str().unwrap();
    assert!(
        note.contains("configmap/app-config") && note.contains(&red) && note.contains("a rollback came first"),
        "{note}"
    );
    // The Event is told while the effect runs; the worker counts its ending
    // after: wait for the count rather than race it.
    eventually("the dropped rollout to be counted", &serve, || {
        (serve.metric("config_snapshot_deferred_effects_total{effect=\"patch_workload\",outcome=\"dropped\"") >= 1.0)
            .then_some(())
    })
    .await;
    // Three passes later the workload still runs what the user rolled back to.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let web = api.get("Deployment", NS, "web").unwrap();
    assert_eq!(env_ref(&web, "MODE", "configMapKeyRef"), blue, "{}", serve.logs());
    eventually("red's snapshot to be collected", &serve, || {
        api.get("ConfigMap", NS, &red).is_none().then_some(())
    })
    .await;
}

/// RBAC without `patch` on Deployments: the watch rollout is retried for
/// `--effect-wait`, then given up with a Warning Event on the workload that
/// `kubectl describe` shows, and the snapshot made for it is collected once
/// it is older than the orphan grace period (the API server's clock reads
/// an hour ago here, so at once). Resync passes that find the rollout
/// undone while it retries do not queue it again: it fails once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effect_given_up_is_a_warning_event_and_leaves_no_snapshot() {
    let api = ApiServer::start().await;
    let (mut serve, _, blue) = web_on_blue(&api, &["--effect-wait", "3s", "--resync-interval", "1s"]).await;
    api.forbid(axum::http::Method::PATCH, "Deployment");
    api.fix_clock(config_snapshot_policy::model::duration::unix_now() - 3600);

    let green = edit_config(&mut serve, &api, "green").await;
    let failed = eventually("the EffectFailed Event", &serve, || {
        event_on(&api, "EffectFailed", "web")
    })
    .await;
    assert_eq!(failed["type"], "Warning");
    assert_eq!(failed["action"], "GiveUp");
    let note = failed["note"].as_str().unwrap();
    assert!(
        note.starts_with("gave up on patch_workload after ") && note.contains("403 Forbidden"),
        "{note}"
    );
    // Finding 9 of eff3694's review: the Event relayed the API server's
    // message, which an admission that denies a write fills as it likes.
    // It says what failed and the status; the log keeps the message.
    assert!(!note.contains("cannot patch"), "the API server's words: {note}");
    assert!(serve.logs().contains("cannot patch"), "{}", serve.logs());
    // The worker counts the ending after the Event is told.
    const FAILED: &str = "config_snapshot_deferred_effects_total{effect=\"patch_workload\",outcome=\"failed\"";
    eventually("the failure to be counted", &serve, || {
        (serve.metric(FAILED) >= 1.0).then_some(())
    })
    .await;
    assert_eq!(serve.metric(FAILED), 1.0, "{}", serve.logs());
    assert!(
        serve.metric("config_snapshot_deferred_effects_total{effect=\"patch_workload\",outcome=\"coalesced\"") >= 1.0
    );
    let web = api.get("Deployment", NS, "web").unwrap();
    assert_eq!(env_ref(&web, "MODE", "configMapKeyRef"), blue);
    eventually("the unused snapshot to be collected", &serve, || {
        api.get("ConfigMap", NS, &green).is_none().then_some(())
    })
    .await;
    assert_canary_absent(&[&serve.logs(), &failed.to_string()]);
}

/// ConfigMap `src-{i}` of the test namespace, holding `k: {v}-{i}`.
fn numbered_source(i: usize, v: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("src-{i}"), "namespace": NS},
           "data": {"k": format!("{v}-{i}")}})
}

/// Whether a line of the stand-in's log is a GET of one of the test
/// namespace's ConfigMaps (a source or a snapshot).
fn configmap_get(line: &str) -> bool {
    line.starts_with(&format!("GET /api/v1/namespaces/{NS}/configmaps/"))
}

/// A Deployment `name` that snapshots everything and reads key `k` of
/// `src-0` … `src-{n-1}` as `E0` … through env.
fn reading_sources(name: &str, n: usize) -> Value {
    let env: Vec<Value> = (0..n)
        .map(|i| json!({"name": format!("E{i}"), "valueFrom": {"configMapKeyRef": {"name": format!("src-{i}"), "key": "k"}}}))
        .collect();
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS, "annotations": {"config-snapshot.io/snapshot": "*"}},
        "spec": {"selector": {"matchLabels": {"app": name}}, "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{"name": "app", "image": "nginx:1.25", "env": env}]}}}
    })
}

/// What the snapshots `workload` pins hold, under key `k`, for its env
/// entries `E0` … `E{n-1}` (as [`reading_sources`] names them).
fn snapshot_values(api: &ApiServer, workload: &Value, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let name = env_ref(workload, &format!("E{i}"), "configMapKeyRef");
            let snapshot = api.get("ConfigMap", NS, name).expect("the snapshot exists");
            snapshot["data"]["k"].as_str().unwrap().to_string()
        })
        .collect()
}

/// The values `n` sources numbered by [`numbered_source`] hold at version `v`.
fn numbered_values(v: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{v}-{i}")).collect()
}

/// An opted-in Deployment's sources are read together before the policy
/// runs, not one after another: against a slow API server its eight fresh
/// reads overlap. Each snapshot still holds the content the API server had
/// when the request came, and a later request reads afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_opted_in_admission_reads_its_sources_together_and_fresh() {
    const N: usize = 8;
    let api = ApiServer::start().await;
    let source = numbered_source;
    for i in 0..N {
        api.put(source(i, "old"));
    }
    let mut serve = Serve::start(&api, &[]);
    serve.wait_ready().await;
    // Edited after serve's cache has seen the old content: only a fresh
    // read finds the new one.
    for i in 0..N {
        api.put(source(i, "new"));
    }
    api.latency(Duration::from_millis(150));
    let workload = |name: &str| reading_sources(name, N);
    let (response, web) = serve.admit("create-web", "CREATE", &workload("web"), None, false).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(snapshot_values(&api, &web, N), numbered_values("new", N));
    assert!(
        api.peak_gets_in_flight() >= N,
        "the sources were read one at a time (at most {} at once)",
        api.peak_gets_in_flight()
    );
    // Its eight new snapshots were created together too (create_snapshots):
    // about one round trip, not eight.
    assert!(
        api.peak_creates_in_flight() >= N,
        "the snapshots were created one at a time (at most {} at once)",
        api.peak_creates_in_flight()
    );
    // And the sweep of their sources' older versions is serve's, after the
    // admission: the policy listed nothing while the request waited.
    let metrics = serve.ops_get("/metrics").expect("metrics").1;
    let listed = metrics.lines().find(|l| {
        l.starts_with("config_snapshot_host_call_duration_seconds_count{operation=\"list_resources_by_namespace\"}")
            && !l.ends_with(" 0")
    });
    assert!(listed.is_none(), "the admission listed: {listed:?}");

    // A second Deployment of the same sources reuses the snapshots just
    // made. Each is read ahead with its source, as fresh, and none is
    // written: no sweep can judge one unused before this request is stored
    // (docs/design.md, "Garbage collection").
    let seen = api.log().len();
    let (response, blue) = serve
        .admit("create-blue", "CREATE", &workload("blue"), None, false)
        .await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(
        blue["spec"]["template"]["spec"], web["spec"]["template"]["spec"],
        "the same snapshots"
    );
    let during = api.log()[seen..].to_vec();
    let reads = during.iter().filter(|l| configmap_get(l)).count();
    assert_eq!(reads, 2 * N, "each source and its snapshot, once: {during:?}");
    assert!(
        during.iter().all(|l| l.starts_with("GET")),
        "reusing the snapshots wrote: {during:?}"
    );

    // Once revisions own the snapshots (as a ReplicaSet's adoption makes
    // them), a third Deployment reads only its sources: create_snapshot
    // reuses an owned snapshot from serve's cache, so it is not read ahead
    // (a snapshot many workloads share carries an owner for each).
    for i in 0..N {
        let name = env_ref(&web, &format!("E{i}"), "configMapKeyRef");
        let mut snapshot = api.get("ConfigMap", NS, name).unwrap();
        snapshot["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "rs-uid"}]);
        api.put(snapshot);
    }
    let mut reads = Vec::new();
    for attempt in 0..20 {
        // serve's cache sees the owners through its watch, a moment later.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let seen = api.log().len();
        let name = format!("owned-{attempt}");
        let (response, owned) = serve.admit(&name, "CREATE", &workload(&name), None, false).await;
        assert_eq!(response["allowed"], true, "{response}");
        assert_eq!(owned["spec"]["template"]["spec"], web["spec"]["template"]["spec"]);
        reads = api.log()[seen..].iter().filter(|l| configmap_get(l)).cloned().collect();
        if reads.len() == N {
            break;
        }
    }
    assert_eq!(
        reads.len(),
        N,
        "the sources alone, not their owned snapshots: {reads:?}"
    );

    // That reuse anchored each snapshot in its namespace and marked it
    // used (docs/design.md, "Garbage collection", Anchors). From then on a
    // create reuses them on serve's cache: its sources are its only reads,
    // and it writes nothing.
    let mut during = Vec::new();
    for attempt in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let seen = api.log().len();
        let name = format!("anchored-{attempt}");
        let (response, anchored) = serve.admit(&name, "CREATE", &workload(&name), None, false).await;
        assert_eq!(response["allowed"], true, "{response}");
        assert_eq!(anchored["spec"]["template"]["spec"], web["spec"]["template"]["spec"]);
        during = api.log()[seen..].to_vec();
        let reads = during.iter().filter(|l| configmap_get(l)).count();
        if reads == N && during.iter().all(|l| l.starts_with("GET")) {
            break;
        }
    }
    assert_eq!(
        during.len(),
        N,
        "anchored and marked: the sources alone, and no write: {during:?}"
    );
    assert!(
        during.iter().all(|l| l.starts_with("GET /api/v1/namespaces/")),
        "{during:?}"
    );

    // The next request reads again: nothing is kept between requests.
    api.put(source(3, "newer"));
    let (_, api_web) = serve.admit("create-api", "CREATE", &workload("api"), None, false).await;
    assert_eq!(snapshot_values(&api, &api_web, N)[3], "newer-3");
}

/// The other ways to read sources ahead (`serve --source-reads`) keep the
/// same freshness and do what their names say. `sequential` and `none`
/// make one GET at a time against a slow API server, and each snapshot
/// holds the content a source was edited to after serve's cache saw it.
/// `list` falls back to a GET per source in a namespace serve's cache shows
/// bigger than its bound: no LIST, and as fresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_way_to_read_ahead_is_as_fresh_as_the_request() {
    const N: usize = 4;
    let workload = |name: &str| reading_sources(name, N);
    for (way, crowd) in [("sequential", 0), ("none", 0), ("list", 40)] {
        let api = ApiServer::start().await;
        for i in 0..N {
            api.put(numbered_source(i, "old"));
        }
        // Other ConfigMaps of the namespace, beyond the LIST's bound.
        for i in 0..crowd {
            api.put(json!({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": format!("other-{i}"), "namespace": NS}, "data": {}}));
        }
        let mut serve = Serve::start(&api, &["--source-reads", way]);
        serve.wait_ready().await;
        for i in 0..N {
            api.put(numbered_source(i, "new"));
        }
        api.latency(Duration::from_millis(50));
        let seen = api.log().len();
        let (response, web) = serve.admit("create-web", "CREATE", &workload("web"), None, false).await;
        assert_eq!(response["allowed"], true, "{way}: {response}");
        assert_eq!(
            snapshot_values(&api, &web, N),
            numbered_values("new", N),
            "{way}: read as fresh as the request"
        );
        let during = api.log()[seen..].to_vec();
        let list = format!("GET /api/v1/namespaces/{NS}/configmaps");
        let gets = |i: usize| during.iter().filter(|l| **l == format!("{list}/src-{i}")).count();
        assert!(!during.contains(&list), "{way}: listed {during:?}");
        assert!((0..N).all(|i| gets(i) == 1), "{way}: a GET per source: {during:?}");
        if way != "list" {
            assert_eq!(api.peak_gets_in_flight(), 1, "{way}: reads overlapped");
        }
        serve.terminate();
    }
}

/// With `--source-reads list`, an opted-in Deployment's sources and their
/// snapshots come in one consistent LIST of the namespace's ConfigMaps:
/// one round trip instead of a GET each, and as fresh (a source edited
/// after serve's cache saw it is snapshotted as edited). A second
/// Deployment of the same sources reuses the snapshots the LIST showed,
/// and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_list_reads_every_source_and_snapshot_as_fresh_as_gets() {
    const N: usize = 4;
    let api = ApiServer::start().await;
    let source = numbered_source;
    for i in 0..N {
        api.put(source(i, "old"));
    }
    let mut serve = Serve::start(&api, &["--source-reads", "list"]);
    serve.wait_ready().await;
    for i in 0..N {
        api.put(source(i, "new"));
    }
    let workload = |name: &str| reading_sources(name, N);
    let list = format!("GET /api/v1/namespaces/{NS}/configmaps");
    let reads_of = |lines: &[String]| -> (usize, usize) {
        let lists = lines.iter().filter(|l| **l == list).count();
        let gets = lines.iter().filter(|l| l.starts_with(&format!("{list}/"))).count();
        (lists, gets)
    };

    let seen = api.log().len();
    let (response, web) = serve.admit("create-web", "CREATE", &workload("web"), None, false).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(
        snapshot_values(&api, &web, N),
        numbered_values("new", N),
        "read as fresh as the request"
    );
    let during = api.log()[seen..].to_vec();
    assert_eq!(reads_of(&during), (1, 0), "one LIST, no GET: {during:?}");

    let seen = api.log().len();
    let (response, blue) = serve
        .admit("create-blue", "CREATE", &workload("blue"), None, false)
        .await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(
        blue["spec"]["template"]["spec"], web["spec"]["template"]["spec"],
        "the same snapshots"
    );
    let during = api.log()[seen..].to_vec();
    assert_eq!(
        reads_of(&during),
        (1, 0),
        "sources and snapshots from one LIST: {during:?}"
    );
    assert!(
        during.iter().all(|l| l.starts_with("GET")),
        "reusing the snapshots wrote: {during:?}"
    );
    serve.terminate();
}

/// Every answer serve gives is timed, the ones the policy never sees too:
/// a request in an excluded namespace and one naming no valid namespace
/// each add one observation to the admission histogram, and one answer
/// to their decision's count. An answer left out of the histogram would
/// make serve look faster than the API server finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untouched_answers_are_timed_like_the_rest() {
    let api = ApiServer::start().await;
    let mut serve = Serve::start(&api, &[]);
    serve.wait_ready().await;
    let timed = "config_snapshot_admission_duration_seconds_count{kind=\"Deployment\",operation=\"CREATE\"}";
    let decided = |d: &str| format!("config_snapshot_admission_decisions_total{{decision=\"{d}\"}}");
    let (timed_before, excluded_before, unnamed_before) = (
        serve.metric(timed),
        serve.metric(&decided("excluded")),
        serve.metric(&decided("unnamed")),
    );
    let workload = deployment();
    for (uid, namespace) in [("in-kube-system", "kube-system"), ("bad-namespace", "Not_A_Namespace")] {
        let (response, _) = serve
            .hook
            .admit(namespace, uid, "CREATE", &workload, None, false)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", serve.logs()));
        assert_eq!(response["allowed"], true, "{response}");
        assert!(response.get("patch").is_none(), "untouched: {response}");
    }
    assert_eq!(serve.metric(timed) - timed_before, 2.0, "both answers timed");
    assert_eq!(serve.metric(&decided("excluded")) - excluded_before, 1.0);
    assert_eq!(serve.metric(&decided("unnamed")) - unnamed_before, 1.0);
    serve.terminate();
}
