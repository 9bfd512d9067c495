//! The third round of docs/security.md on the real control plane, tried as
//! an attacker with a pod would (curl and raw connections from other
//! loopback addresses than the API server's), while kubectl's writes go on:
//!
//! - the door: only the path serve keeps in the webhook configuration is
//!   answered; anything else gets a bare 404, and nothing is read for it;
//! - behind it, for a caller that learned the path: bodies trickled from
//!   many connections neither grow serve's memory past its budget nor keep
//!   the API server's calls out (finding 1);
//! - a key rotation moves the path with no call of the API server refused,
//!   and the old path closes within seconds of the move.

use support::connections::{loopback, post_declaring, tls};
use tokio::io::AsyncWriteExt;

use super::security::post_to;
use super::*;

/// The path the webhook configuration calls now.
pub(crate) fn configured_path(cp: &ControlPlane) -> String {
    let config: Value =
        serde_json::from_str(&cp.kubectl(&["get", "mutatingwebhookconfiguration", "config-snapshot", "-o", "json"]))
            .unwrap();
    let url = config["webhooks"][0]["clientConfig"]["url"]
        .as_str()
        .unwrap()
        .to_string();
    let rest = url.strip_prefix("https://").unwrap();
    rest[rest.find('/').unwrap_or(rest.len())..].to_string()
}

/// serve's resident memory, in MiB.
fn rss_mib(serve: &ServeProcess) -> f64 {
    serve.rss_bytes() as f64 / (1 << 20) as f64
}

/// `count` connections from `peers` loopback addresses, each declaring an
/// 8 MiB body to `path` and sending `sent` bytes of it, then a byte every
/// 3 s until `stop`: the trickle of finding 1. How many ended with an
/// answer, and which statuses.
async fn trickle(serve: &ServeProcess, path: &str, peers: u8, count: usize, sent: usize, stop: Instant) -> Vec<u16> {
    let mut tasks = Vec::new();
    for i in 0..count {
        let from = loopback(2 + (i % usize::from(peers)) as u8);
        let mut stream = match tls(serve, from, b"http/1.1").await {
            Ok(s) => s,
            Err(_) => continue,
        };
        let path = path.to_string();
        tasks.push(tokio::spawn(async move {
            if !post_declaring(&mut stream, &path, 8 << 20, sent).await {
                return 0;
            }
            let mut answer = Vec::new();
            let mut buffer = [0u8; 1024];
            while Instant::now() < stop {
                use tokio::io::AsyncReadExt;
                match tokio::time::timeout(Duration::from_secs(3), stream.read(&mut buffer)).await {
                    Ok(Ok(n)) if n > 0 => {
                        answer.extend_from_slice(&buffer[..n]);
                        break;
                    }
                    Ok(_) => break,
                    Err(_) => {
                        let _ = stream.write_all(b" ").await;
                    }
                }
            }
            String::from_utf8_lossy(&answer)
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0)
        }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap_or(0));
    }
    statuses
}

/// Finding 3: the read-ahead of an opted-in admission reads a Secret's
/// snapshot by the name the host gives it, keyed; the plain hash of the
/// Secret's value never appears in a request path (kube-apiserver's audit
/// log keeps every one). On cd11c64 it was read as `db-<10 hex of
/// SHA-256>`.
fn read_ahead_story(cp: &ControlPlane, serve: &ServeProcess) {
    use config_snapshot_policy::model::content::{snapshot_name, Content};
    use config_snapshot_policy::model::source::SourceKind;
    let ns = "attack-audit";
    cp.namespace(ns);
    cp.apply(
        ns,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"}, "stringData": {"password": CANARY}}),
    );
    let stored = cp.get(ns, "secret", "db").unwrap();
    let plain = snapshot_name("db", &Content::from_object(SourceKind::Secret, &stored).unwrap().hash());
    let from = serve.logs().len();
    let web = workload(
        "Deployment",
        "web",
        json!({"config-snapshot.io/snapshot": "*"}),
        "x:1",
        json!([{"secretRef": {"name": "db"}}]),
        1,
    );
    cp.apply(ns, &web);
    let keyed = cp.get(ns, "deployment", "web").unwrap()["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]
        ["secretRef"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(keyed.starts_with("db-") && keyed != plain, "{keyed}");
    let requested: Vec<String> = serve.logs()[from..]
        .lines()
        .filter(|l| l.contains("\"requesting\"") && l.contains(&format!("/namespaces/{ns}/secrets/")))
        .map(str::to_string)
        .collect();
    assert!(
        requested.iter().all(|l| !l.contains(&plain)),
        "a request path named the Secret's plain hash: {requested:?}"
    );
    assert!(
        requested.iter().any(|l| l.contains(&format!("/secrets/{keyed}"))),
        "the snapshot was read ahead by its keyed name: {requested:?}"
    );
    cp.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}

pub fn door_story(cp: &ControlPlane, serve: &ServeProcess, kubeconfig: &Path) {
    read_ahead_story(cp, serve);
    let _ = kubeconfig;
    let ns = "attack-door";
    cp.namespace(ns);
    cp.apply(ns, &config_map("app", json!({"DB_HOST": "db-7.internal.payments"})));

    // serve keeps the configuration on its door's path, derived from its
    // key; the shipped manifest names none.
    let door = eventually("the configuration on the door's path", 30, || {
        let configured = configured_path(cp);
        super::door_paths(cp).contains(&configured).then_some(configured)
    });
    assert!(config_snapshot::serve::intake::door::shaped(&door), "{door}");
    // The path is one kube-apiserver takes for a Service webhook too (as the
    // chart and deploy/serve name it): its segments must be DNS labels.
    let mut shipped = super::yaml("deploy/serve/webhook.yaml").remove(0);
    shipped["metadata"]["name"] = json!("config-snapshot-door-check");
    shipped["webhooks"][0]["clientConfig"]["service"]["path"] = json!(door);
    cp.try_kubectl(&["apply", "--dry-run=server", "-f", "-"], Some(&shipped.to_string()))
        .unwrap_or_else(|e| panic!("the API server refused the door's path for a Service: {e}"));

    // The webhook's guard: serve's own account may move the path and
    // nothing else, whatever a compromised serve would try.
    let as_serve = cp.serve_kubeconfig();
    let serve_patches = |patch: &str| {
        let out = Command::new(cp.bin.join("kubectl"))
            .arg("--kubeconfig")
            .arg(&as_serve)
            .args([
                "patch",
                "mutatingwebhookconfiguration",
                "config-snapshot",
                "--type=json",
                "-p",
                patch,
            ])
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    for (what, patch) in [
        (
            "its rules",
            r#"[{"op":"replace","path":"/webhooks/0/rules/0/resources","value":["pods"]}]"#,
        ),
        (
            "its namespaceSelector",
            r#"[{"op":"remove","path":"/webhooks/0/namespaceSelector"}]"#,
        ),
        (
            "its failure policy",
            r#"[{"op":"replace","path":"/webhooks/0/failurePolicy","value":"Fail"}]"#,
        ),
        (
            "its host",
            r#"[{"op":"replace","path":"/webhooks/0/clientConfig/url","value":"https://attacker.example:443/mutate"}]"#,
        ),
    ] {
        let (ok, err) = serve_patches(patch);
        assert!(
            !ok && err.contains("config-snapshot-webhook"),
            "serve's account changed {what}: {err}"
        );
    }

    // Round 4 (M4): nor does serve's account make a ServiceAccount token,
    // which would hand it another account's rights.
    let token = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "stolen",
        "annotations": {"kubernetes.io/service-account.name": "default"}},
        "type": "kubernetes.io/service-account-token"});
    let out = Command::new(cp.bin.join("kubectl"))
        .arg("--kubeconfig")
        .arg(&as_serve)
        .args(["-n", ns, "create", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            child.stdin.take().unwrap().write_all(token.to_string().as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("config-snapshot-identity"),
        "serve's account made a token: {err}"
    );

    // Finding 4's dry run, forged, without the path: a bare 404, nothing
    // read, no name derived from the ConfigMap.
    let forged = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "forged-door", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "namespace": ns, "name": "oracle", "operation": "CREATE",
        "userInfo": {"username": "system:serviceaccount:attack:curl"},
        "object": workload("Deployment", "oracle", json!({"config-snapshot.io/snapshot": "*"}), "x:1",
            json!([{"configMapRef": {"name": "app"}}]), 1),
        "oldObject": null, "dryRun": true, "options": {}}})
    .to_string();
    let from = serve.logs().len();
    let wrong = format!(
        "/mutate/{}",
        "a".repeat(config_snapshot::serve::intake::door::TOKEN_LEN)
    );
    for path in ["/mutate", "/", "/mutate/", wrong.as_str()] {
        let answer = post_to(cp, serve, path, &forged, None).expect("an HTTP answer");
        assert_eq!(answer.trim(), "not found", "{path}: {answer}");
    }
    // Only reads of the forged request's namespace count: the leader's
    // resync reads the other stories' watched sources at any moment.
    let forged_reads = format!("/namespaces/{ns}/configmaps");
    let reads: Vec<String> = serve.logs()[from..]
        .lines()
        .filter(|l| l.contains("\"requesting\"") && l.contains(&forged_reads))
        .map(str::to_string)
        .collect();
    assert!(reads.is_empty(), "serve read for a caller without the path: {reads:?}");
    // The API server's writes are answered.
    assert!(
        applied_pinned(cp, ns, "web"),
        "kubectl's write was let through unpinned"
    );
    // With the path (a leak): the dry run is answered as before, and only
    // then (the door is the only difference).
    let answer = post_to(cp, serve, &door, &forged, None).expect("an answer at the door's path");
    assert!(answer.contains("\"patch\""), "{answer}");

    // Finding 1, as tried on cd11c64 (40 connections from one address, 6
    // of 8 MiB each, then a byte every 3 s: serve grew from 69 to 311 MiB),
    // without the path and then with it.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let before = rss_mib(serve);
    let stop = Instant::now() + Duration::from_secs(20);
    let refused = runtime.block_on(trickle(serve, "/mutate", 1, 40, 6 << 20, stop));
    assert!(refused.iter().all(|s| *s == 404), "without the path: {refused:?}");
    // With the path: 64 bodies from four addresses. While they trickle,
    // kubectl's writes are still answered, and serve's memory stays within
    // its budget of bodies.
    let (statuses, let_through, peak) = std::thread::scope(|scope| {
        let stop = Instant::now() + Duration::from_secs(25);
        let (runtime, door) = (&runtime, &door);
        let attack = scope.spawn(move || runtime.block_on(trickle(serve, door, 4, 64, 6 << 20, stop)));
        let mut peak = before;
        let mut let_through = Vec::new();
        for i in 0..8 {
            std::thread::sleep(Duration::from_secs(1));
            peak = peak.max(rss_mib(serve));
            let name = format!("during-{i}");
            if !applied_pinned(cp, ns, &name) {
                let_through.push(name);
            }
        }
        let statuses = attack.join().unwrap();
        (statuses, let_through, peak.max(rss_mib(serve)))
    });
    eprintln!(
        "door: 64 bodies of 8 MiB trickled at the door's path: serve {before:.0} -> {peak:.0} MiB; statuses {statuses:?}"
    );
    assert!(
        let_through.is_empty(),
        "let through unpinned while bodies trickled: {let_through:?}"
    );
    assert!(peak - before < 120.0, "serve grew by {:.0} MiB", peak - before);
    assert!(
        statuses.iter().all(|s| [408, 503].contains(s)),
        "every trickled body refused or cut off: {statuses:?}"
    );

    // A rotation moves the path; the API server's calls go on throughout.
    let (ok, out, err) = super::held::cli(cp, &["keys", "rotate"]);
    assert!(ok, "{out}{err}");
    let moved = eventually("the configuration on the rotated key's path", 60, || {
        let now = configured_path(cp);
        (now != door && super::door_paths(cp).contains(&now)).then_some(now)
    });
    assert!(config_snapshot::serve::intake::door::shaped(&moved));
    let mut let_through = Vec::new();
    for i in 0..5 {
        let name = format!("rotated-{i}");
        if !applied_pinned(cp, ns, &name) {
            let_through.push(name);
        }
    }
    assert!(
        let_through.is_empty(),
        "let through around the rotation: {let_through:?}"
    );
    // The old path closes within seconds of the move (finding 8 of
    // round 5: on eff3694 it stayed open for ten minutes).
    let moved_at = Instant::now();
    eventually("the old path closed", 20, || {
        post_to(cp, serve, &door, &forged, None)
            .is_ok_and(|answer| answer.trim() == "not found")
            .then_some(())
    });
    eprintln!("door: the old path closed {:?} after the move", moved_at.elapsed());
    let answer = post_to(cp, serve, &moved, &forged, None).expect("the new path opens");
    assert!(answer.contains("\"allowed\""), "{answer}");
    cp.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}
