//! The second round of docs/security.md, tried on the real control plane as
//! an attacker would: reviews forged with curl and no client certificate
//! (serve runs as most installs do, without mTLS), a viewer of one
//! namespace guessing from another, idle connections held against the port,
//! and a workload naming ten thousand sources. None of them may leave a
//! trace: a snapshot created, a read made for the attacker, an admission
//! dropped, or a rollout caused.

use super::security::post;
use super::*;

/// Reads serve's kube client made after `from` (a length of its logs) to
/// a path containing `fragment`: its debug log names every request URL.
fn reads_since(serve: &ServeProcess, from: usize, fragment: &str) -> Vec<String> {
    // The request's path, not its query: a cache's relist of every
    // namespace but kube-system names kube-system in its field selector.
    let path_of = |line: &str| {
        let url = line.split("\"http.url\":\"").nth(1)?.split('"').next()?;
        Some(url.split('?').next().unwrap_or_default().to_string())
    };
    serve.logs()[from..]
        .lines()
        .filter(|l| l.contains("\"requesting\"") && path_of(l).is_some_and(|p| p.contains(fragment)))
        .map(str::to_string)
        .collect()
}

/// Snapshots (labelled ConfigMaps and Secrets) in `ns`.
fn labelled(cp: &ControlPlane, ns: &str) -> usize {
    cp.kubectl(&[
        "-n",
        ns,
        "get",
        "configmaps,secrets",
        "-l",
        "app.kubernetes.io/managed-by=config-snapshot",
        "-o",
        "name",
    ])
    .lines()
    .filter(|l| !l.trim().is_empty())
    .count()
}

/// `n` bytes that never repeat a pattern a compressor would see.
fn noise(n: usize, seed: u64) -> String {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            char::from(b'a' + ((x >> 33) % 26) as u8)
        })
        .collect()
}

fn review(
    operation: &str,
    kind: (&str, &str, &str),
    ns: &str,
    object: &Value,
    old: Option<&Value>,
    dry: bool,
) -> String {
    let (group, version, kind) = kind;
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": format!("forged-{}", noise(8, object.to_string().len() as u64)),
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": format!("{}s", kind.to_lowercase())},
        "name": object["metadata"]["name"], "namespace": ns, "operation": operation,
        "userInfo": {"username": "system:serviceaccount:attack:curl"},
        "object": object, "oldObject": old, "dryRun": dry, "options": {}}})
    .to_string()
}

/// Finding 1: ten ConfigMap UPDATE reviews for a watched source, each
/// carrying 192 KiB of random data that was never written. On 64c15b5
/// serve made ten signed snapshots of them. Now: no snapshot, no rollout;
/// and a real edit afterwards rolls out once, to its stored content.
fn forged_source_review_story(cp: &ControlPlane, serve: &ServeProcess) {
    let ns = "attack-source";
    cp.namespace(ns);
    cp.apply(ns, &config_map("app", json!({"k": "v"})));
    let watched = workload(
        "Deployment",
        "web",
        json!({"config-snapshot.io/watch": "configmap/app"}),
        "x:1",
        json!([{"configMapRef": {"name": "app"}}]),
        10,
    );
    cp.apply(ns, &watched);
    eventually("web on a snapshot", 30, || {
        env_ref(&cp.get(ns, "deployment", "web")?)
            .starts_with("app-")
            .then_some(())
    });
    settle(cp, ns);
    let (snapshots, created) = (
        labelled(cp, ns),
        serve.metric("config_snapshot_snapshots_created_total"),
    );
    let template = cp.get(ns, "deployment", "web").unwrap()["spec"]["template"].clone();
    let stored = cp.get(ns, "configmap", "app").unwrap();
    for i in 0..10u64 {
        let mut forged = stored.clone();
        forged["data"] = json!({"k": noise(192 << 10, i)});
        // Half claim the version stored (the change "not persisted yet"),
        // half another (the change "persisted").
        let mut old = stored.clone();
        if i % 2 == 1 {
            old["metadata"]["resourceVersion"] = json!("1");
        }
        let body = review("UPDATE", ("", "v1", "ConfigMap"), ns, &forged, Some(&old), false);
        let answer: Value = serde_json::from_str(&post(cp, serve, &body, None).expect("an answer")).unwrap();
        assert_eq!(answer["response"]["allowed"], true, "{answer}");
        assert!(answer["response"].get("patch").is_none(), "{answer}");
    }
    // Past --effect-wait (10 s): every staged rollout has been judged.
    std::thread::sleep(std::time::Duration::from_secs(13));
    assert_eq!(labelled(cp, ns), snapshots, "a snapshot of content never stored");
    assert_eq!(
        serve.metric("config_snapshot_snapshots_created_total"),
        created,
        "serve created a snapshot"
    );
    let now = cp.get(ns, "deployment", "web").unwrap();
    assert_eq!(now["spec"]["template"], template, "a forged review caused a rollout");
    // A real edit still rolls out, once, to what is stored.
    set_data(cp, ns, "app", json!({"k": "w"}));
    let rolled = eventually("the real edit's rollout", 60, || {
        let name = env_ref(&cp.get(ns, "deployment", "web")?);
        (!template.to_string().contains(&name)).then_some(name)
    });
    let snapshot = cp.get(ns, "configmap", &rolled).expect("its snapshot exists");
    assert_eq!(snapshot["data"]["k"], "w");
    assert_eq!(labelled(cp, ns), snapshots + 1);
}

/// Finding 2: a dry-run review whose namespace is a path into
/// kube-system. On 64c15b5 serve read kube-system's ConfigMap and answered
/// with a name derived from its content. Now: answered untouched, nothing
/// read.
fn forged_names_story(cp: &ControlPlane, serve: &ServeProcess) {
    cp.apply(
        "kube-system",
        &config_map(
            "aws-auth-like",
            json!({"mapRoles": "rolearn: arn:aws:iam::1:role/admin"}),
        ),
    );
    let from = serve.logs().len();
    let ns = "kube-system/configmaps/aws-auth-like?";
    let mut object = workload(
        "Deployment",
        "web",
        json!({"config-snapshot.io/snapshot": "*"}),
        "x:1",
        json!([]),
        1,
    );
    object["spec"]["template"]["spec"]["containers"][0]["env"] =
        json!([{"name": "R", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "mapRoles"}}}]);
    let body = review("CREATE", ("apps", "v1", "Deployment"), ns, &object, None, true);
    let answer: Value = serde_json::from_str(&post(cp, serve, &body, None).expect("an answer")).unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert!(answer["response"].get("patch").is_none(), "{answer}");
    assert!(answer.to_string().contains("not reviewed"), "{answer}");
    let made = reads_since(serve, from, "kube-system");
    assert!(made.is_empty(), "serve read kube-system for a forged review: {made:?}");
    cp.kubectl(&["-n", "kube-system", "delete", "configmap", "aws-auth-like"]);
}

/// Finding 3: someone who can view `prod` and edit `dev` reads a prod
/// Deployment's Secret snapshot name, then tries the right value as a `db`
/// Secret in dev with a server-side dry run of an opted-in Deployment. On
/// 64c15b5 the two names matched, confirming the guess. Now they differ,
/// right guess or not.
fn cross_namespace_guess_story(cp: &ControlPlane) {
    let api = workload(
        "Deployment",
        "api",
        json!({"config-snapshot.io/snapshot": "*"}),
        "x:1",
        json!([{"secretRef": {"name": "db"}}]),
        1,
    );
    let (prod, dev) = ("guess-prod", "guess-dev");
    for ns in [prod, dev] {
        cp.namespace(ns);
        cp.apply(
            ns,
            &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"},
                    "stringData": {"password": "hunter2"}}),
        );
    }
    cp.apply(prod, &api);
    let secret_name = |w: &Value| {
        w["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["secretRef"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let seen = eventually("prod's snapshot", 30, || {
        let name = secret_name(&cp.get(prod, "deployment", "api")?);
        (name != "db").then_some(name)
    });
    // The guess, right, in dev: a dry run answers the name it would make.
    let out = cp.kubectl_warned(
        &["apply", "-n", dev, "--dry-run=server", "-o", "json", "-f", "-"],
        Some(&api.to_string()),
    );
    let answered: Value = serde_json::from_str(&out.expect("the dry run").0).unwrap();
    let guessed = secret_name(&answered);
    assert!(guessed.starts_with("db-"), "the dry run was mutated: {answered}");
    assert_ne!(guessed, seen, "a right guess in dev names prod's snapshot: an oracle");
    assert!(cp.get(dev, "secret", &guessed).is_none(), "a dry run wrote");
}

/// Finding 4: 300 connections held idle against serve's port (TLS done,
/// 150 on HTTP/1.1, 150 on HTTP/2 with no request), from six addresses,
/// while users go on applying Deployments: every admission is made by
/// serve (the Deployment names a snapshot; under `failurePolicy: Ignore` a
/// lost call would admit it unmutated), each within a second.
fn idle_connections_story(cp: &ControlPlane, serve: &ServeProcess) {
    use support::connections::{hold_h2, hold_tls, loopback};
    let ns = "attack-idle";
    cp.namespace(ns);
    cp.apply(ns, &config_map("app", json!({"k": "v"})));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let held = runtime.block_on(async {
        let mut h1 = Vec::new();
        let mut h2 = Vec::new();
        for peer in 2..=4 {
            h1.extend(hold_tls(serve, loopback(peer), 50).await);
        }
        for peer in 5..=7 {
            h2.extend(hold_h2(serve, loopback(peer), 50).await);
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        (h1, h2)
    });
    assert_eq!(held.0.len() + held.1.len(), 300);
    let mut slowest = std::time::Duration::ZERO;
    for i in 0..20 {
        let name = format!("web-{i}");
        let started = Instant::now();
        let pinned = applied_pinned(cp, ns, &name);
        slowest = slowest.max(started.elapsed());
        assert!(pinned, "{name} admitted without serve (failurePolicy: Ignore)");
    }
    eprintln!(
        "300 idle connections held: 20 applies answered by serve, the slowest kubectl apply {slowest:?}; evicted {}",
        serve.metric("config_snapshot_webhook_connections_evicted_total")
    );
    assert!(slowest < std::time::Duration::from_secs(2), "{slowest:?}");
    drop(held);
}

/// Finding 5: a Deployment naming two thousand ConfigMaps. On 64c15b5
/// serve started a GET for each. Now the policy refuses it before anything
/// is read, and says why. (Ten thousand, as the finding had them, are past
/// the count of JSON values serve reviews at all: refused before that.)
fn fan_out_story(cp: &ControlPlane, serve: &ServeProcess) {
    let ns = "attack-fanout";
    cp.namespace(ns);
    let env: Vec<Value> = (0..2_000)
        .map(|i| json!({"name": format!("V{i}"), "valueFrom": {"configMapKeyRef": {"name": format!("c{i}"), "key": "k"}}}))
        .collect();
    let mut d = workload(
        "Deployment",
        "wide",
        json!({"config-snapshot.io/snapshot": "*"}),
        "x:1",
        json!([]),
        1,
    );
    d["spec"]["template"]["spec"]["containers"][0]["env"] = json!(env);
    let from = serve.logs().len();
    let path = cp.dir.join("wide.json");
    std::fs::write(&path, d.to_string()).unwrap();
    for dry in [true, false] {
        let mut args = vec!["apply", "-n", ns, "-f", path.to_str().unwrap()];
        if dry {
            args.push("--dry-run=server");
        }
        let refused = cp.try_kubectl(&args, None).expect_err("refused");
        assert!(refused.contains("takes at most 64 per workload"), "{refused}");
    }
    let made = reads_since(serve, from, &format!("/namespaces/{ns}/configmaps"));
    assert!(made.is_empty(), "serve read for it: {} reads", made.len());
}

/// Finding 8: a ReplicaSet CREATE review forged for a ReplicaSet that
/// exists, its template naming a snapshot that ReplicaSet does not use.
/// On 64c15b5 the staged adoption made the real ReplicaSet an owner of it.
/// Now the adoption finds the live object is not the one reviewed, or does
/// not name the snapshot: nothing changes.
fn forged_adoption_story(cp: &ControlPlane, serve: &ServeProcess) {
    let ns = "attack-adopt";
    cp.namespace(ns);
    cp.apply(ns, &config_map("app", json!({"k": "v"})));
    cp.apply(ns, &config_map("other", json!({"k": "o"})));
    cp.apply(
        ns,
        &workload(
            "Deployment",
            "web",
            json!({"config-snapshot.io/snapshot": "*"}),
            "x:1",
            json!([{"configMapRef": {"name": "app"}}]),
            2,
        ),
    );
    let web = eventually("web's ReplicaSet", 30, || {
        let w = cp.get(ns, "deployment", "web")?;
        env_ref(&w).starts_with("app-").then_some(w)
    });
    settle(cp, ns);
    let list: Value = serde_json::from_str(&cp.kubectl(&["-n", ns, "get", "replicasets", "-o", "json"])).unwrap();
    let rs = list["items"][0].clone();
    // A snapshot the ReplicaSet does not name: made by a forged review of a
    // workload that reads `other` (stored content, unowned).
    let ghost = workload(
        "Deployment",
        "ghost",
        json!({"config-snapshot.io/snapshot": "*"}),
        "x:1",
        json!([{"configMapRef": {"name": "other"}}]),
        1,
    );
    let answer: Value = serde_json::from_str(
        &post(
            cp,
            serve,
            &review("CREATE", ("apps", "v1", "Deployment"), ns, &ghost, None, false),
            None,
        )
        .expect("an answer"),
    )
    .unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    let other = eventually("the ghost's snapshot", 30, || {
        let listed = cp.kubectl(&["-n", ns, "get", "configmaps", "-o", "json"]);
        let listed: Value = serde_json::from_str(&listed).ok()?;
        listed["items"]
            .as_array()?
            .iter()
            .find(|c| c["metadata"]["annotations"]["config-snapshot.io/source-name"] == "other")
            .map(|c| c["metadata"]["name"].as_str().unwrap().to_string())
    });
    // The forged ReplicaSet review: the real one's name and controller,
    // a template naming the ghost's snapshot.
    let mut forged = rs.clone();
    for field in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "generation",
        "managedFields",
    ] {
        forged["metadata"].as_object_mut().unwrap().remove(field);
    }
    forged.as_object_mut().unwrap().remove("status");
    forged["spec"]["template"]["spec"]["containers"][0]["envFrom"] = json!([{"configMapRef": {"name": other}}]);
    forged["spec"]["template"]["metadata"]["annotations"] =
        json!({"config-snapshot.io/snapshots": json!({"configmap/other": other}).to_string()});
    let answer: Value = serde_json::from_str(
        &post(
            cp,
            serve,
            &review("CREATE", ("apps", "v1", "ReplicaSet"), ns, &forged, None, false),
            None,
        )
        .expect("an answer"),
    )
    .unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    std::thread::sleep(std::time::Duration::from_secs(12));
    let snapshot = cp.get(ns, "configmap", &other).expect("the ghost's snapshot");
    let owners = snapshot["metadata"]["ownerReferences"].clone();
    assert!(
        owners
            .as_array()
            .is_none_or(|o| o.iter().all(|r| r["uid"] != rs["metadata"]["uid"])),
        "a forged review made the real ReplicaSet an owner: {owners}"
    );
    let _ = web;
}

pub fn stories(cp: &ControlPlane, serve: &ServeProcess) {
    forged_source_review_story(cp, serve);
    forged_names_story(cp, serve);
    cross_namespace_guess_story(cp);
    idle_connections_story(cp, serve);
    fan_out_story(cp, serve);
    forged_adoption_story(cp, serve);
}
