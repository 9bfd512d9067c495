//! Installing serve and running it for a year, on the real node: its own
//! certificate renewed and its CA replaced while writes go on, and the
//! chart uninstalled and installed again as docs/install.md says.

use super::*;

/// The webhook's name in every configuration.
const WEBHOOK: &str = "config-snapshot.config-snapshot.io";

/// How many calls to serve's webhook kube-apiserver let through without
/// an answer (failurePolicy Ignore: a handshake that failed, a timeout),
/// by its own counter.
fn failed_open(cp: &ControlPlane) -> u64 {
    cp.kubectl(&["get", "--raw", "/metrics"])
        .lines()
        .filter(|l| l.starts_with("apiserver_admission_webhook_fail_open_count{") && l.contains(WEBHOOK))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// serve's certificate Secret: its CA id, how many CAs its bundle holds,
/// and when its serving certificate was made.
fn certificate_state(cp: &ControlPlane) -> Option<(String, usize, i64)> {
    let secret = cp.get("config-snapshot", "secret", "config-snapshot-webhook-ca")?;
    let state: Value =
        serde_json::from_str(secret["metadata"]["annotations"]["config-snapshot.io/webhook-certificate"].as_str()?)
            .ok()?;
    let bundle = base64::engine::general_purpose::STANDARD
        .decode(secret["data"]["ca.crt"].as_str()?)
        .ok()?;
    let cas = String::from_utf8_lossy(&bundle).matches("BEGIN CERTIFICATE").count();
    Some((state["caId"].as_str()?.to_string(), cas, state["leafAt"].as_i64()?))
}

/// `helm upgrade` of the installed release with the chart of this
/// checkout, keeping its values but for `set`.
fn upgrade(cp: &ControlPlane, set: &[&str]) {
    let mut args = vec![
        "upgrade",
        "config-snapshot",
        "deploy/helm/config-snapshot",
        "--namespace",
        "config-snapshot",
        "--reuse-values",
        "--wait",
        "--timeout",
        "5m",
    ];
    for s in set {
        args.extend(["--set", s]);
    }
    cp.helm(&args);
}

/// serve's own certificate under load: with lifetimes shortened to
/// minutes (`helm upgrade`), the serving certificate is renewed and the CA
/// replaced (both trusted, then the new one serving, then alone) while a
/// Deployment is written every second. Every one of them is pinned, and
/// kube-apiserver let no call through unanswered: no handshake failed.
pub fn rotation_story(cp: &ControlPlane) {
    let ns = "node-rotation";
    cp.namespace(ns);
    cp.apply(ns, &config_map("app", json!({"mode": "blue"})));
    upgrade(cp, &["certificate.caLifetime=150s", "certificate.lifetime=60s"]);
    let started = Instant::now();
    let (first_ca, _, _) = certificate_state(cp).expect("serve keeps its certificate in its Secret");
    let failed_before = failed_open(cp);
    let mut written = 0;
    let mut let_through = Vec::new();
    let (mut seen_two, mut renewals, mut last_leaf) = (false, 0, 0);
    let mut cas_seen = BTreeSet::from([first_ca.clone()]);
    // Until the CA has been replaced and stands alone, and the serving
    // certificate renewed under it besides.
    while started.elapsed() < Duration::from_secs(400) {
        let name = format!("w-{written}");
        written += 1;
        if !applied_pinned(cp, ns, &name) {
            let_through.push(name);
        }
        if let Some((ca, cas, leaf_at)) = certificate_state(cp) {
            seen_two |= cas == 2;
            if leaf_at != last_leaf {
                renewals += 1;
                last_leaf = leaf_at;
            }
            cas_seen.insert(ca);
            if seen_two && cas == 1 && cas_seen.len() >= 2 && renewals >= 3 {
                break;
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let failed = failed_open(cp) - failed_before;
    eprintln!(
        "node: certificates rotated in {:?}: {} CAs, {renewals} serving certificates, {written} writes, {} let through, {failed} calls failed open",
        started.elapsed(),
        cas_seen.len(),
        let_through.len()
    );
    assert!(
        seen_two && cas_seen.len() >= 2,
        "the CA was replaced with both trusted meanwhile"
    );
    assert!(renewals >= 3, "the serving certificate was renewed ({renewals})");
    assert!(let_through.is_empty(), "writes let through unpinned: {let_through:?}");
    assert_eq!(failed, 0, "kube-apiserver let calls through unanswered");
    // The webhook trusts exactly serve's bundle.
    let bundle = cp
        .get("config-snapshot", "secret", "config-snapshot-webhook-ca")
        .unwrap()["data"]["ca.crt"]
        .clone();
    let config = cp.get("", "mutatingwebhookconfiguration", "config-snapshot").unwrap();
    assert_eq!(config["webhooks"][0]["clientConfig"]["caBundle"], bundle);
    // Back to the chart's lifetimes: the minutes-long CA is replaced by a
    // ten-year one the same way, while the next stories run.
    upgrade(cp, &["certificate.caLifetime=87600h", "certificate.lifetime=2160h"]);
    cp.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}

/// `helm uninstall`, then `helm install` again, as docs/install.md says:
/// the uninstall keeps the signing key and its guard, so the new install
/// trusts the key at once (no `keys restore`), serves the CA the webhook
/// trusted before, and pins with the same key: a workload pinned before
/// is re-applied to the same snapshot.
pub fn reinstall_story(cp: &ControlPlane) {
    let ns = "node-reinstall";
    cp.namespace(ns);
    cp.apply(ns, &config_map("app", json!({"mode": "blue"})));
    assert!(applied_pinned(cp, ns, "before"), "pinned before the uninstall");
    let pinned = env_ref(&cp.get(ns, "deployment", "before").unwrap());
    let key = cp
        .get("config-snapshot", "secret", "config-snapshot-signing-key")
        .unwrap();
    let (ca, _, _) = certificate_state(cp).unwrap();
    let values = cp.helm(&[
        "get",
        "values",
        "config-snapshot",
        "--namespace",
        "config-snapshot",
        "-o",
        "json",
    ]);
    let values: Value = serde_json::from_str(&values).unwrap();
    let repository = values["image"]["repository"].as_str().unwrap().to_string();
    cp.helm(&[
        "uninstall",
        "config-snapshot",
        "--namespace",
        "config-snapshot",
        "--cascade",
        "foreground",
        "--wait",
    ]);
    // Kept: the key, its guard, serve's CA.
    for (kind, name) in [
        ("validatingadmissionpolicy", "config-snapshot-signing-key"),
        ("validatingadmissionpolicybinding", "config-snapshot-signing-key"),
    ] {
        assert!(
            cp.get("default", kind, name).is_some(),
            "helm uninstall kept the {kind}"
        );
    }
    assert!(cp
        .get("default", "mutatingwebhookconfiguration", "config-snapshot")
        .is_none());
    let kept = cp
        .get("config-snapshot", "secret", "config-snapshot-signing-key")
        .expect("the key is kept");
    assert_eq!(kept["metadata"]["uid"], key["metadata"]["uid"]);
    // Installed again, as the quick start does (with this node's image).
    let started = Instant::now();
    cp.helm(&[
        "install",
        "config-snapshot",
        "deploy/helm/config-snapshot",
        "--namespace",
        "config-snapshot",
        "--wait",
        "--timeout",
        "3m",
        "--set",
        &format!("image.repository={repository}"),
    ]);
    eprintln!("node: reinstalled and ready in {:?}", started.elapsed());
    let logs = cp
        .try_kubectl(
            &[
                "-n",
                "config-snapshot",
                "logs",
                "-l",
                "app.kubernetes.io/name=config-snapshot",
                "--tail=-1",
            ],
            None,
        )
        .unwrap_or_default();
    assert!(!logs.contains("not trusted"), "serve trusted its key: {logs}");
    let same = cp
        .get("config-snapshot", "secret", "config-snapshot-signing-key")
        .unwrap();
    assert_eq!(same["metadata"]["uid"], key["metadata"]["uid"], "the same key");
    assert_eq!(certificate_state(cp).unwrap().0, ca, "the same CA");
    // The same key names the same snapshot: the workload applied again
    // as it was written is pinned where it was.
    assert!(applied_pinned(cp, ns, "before"));
    assert_eq!(env_ref(&cp.get(ns, "deployment", "before").unwrap()), pinned);
    assert!(applied_pinned(cp, ns, "after"), "pinned after the reinstall");
    cp.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}
