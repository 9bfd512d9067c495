//! Round 5, finding 3, on the real control plane, as a tenant tries it: a
//! user with `edit` in one namespace sends, through the real
//! kube-apiserver, dry runs of Deployments whose annotation holds 1.3 MiB
//! of `<` (sent raw, which the API server decodes and escapes into a review
//! of nearly 8 MiB), ten loops at once, while another namespace's opted-in
//! Deployments are applied. Every one of those is pinned: the tenant's
//! reviews fill the tenant's share of serve's body budget, never the API
//! server's (one address) as a whole. On eff3694 the API server's address
//! held half the budget, two of the tenant's reviews filled it, and 10 of
//! the other namespace's 20 creates were refused and went through
//! unmutated (`failurePolicy: Ignore`).
//!
//! It also holds the field-order claim of serve/intake/review_namespace.rs to the
//! real API server: no review it sent, 7.5 MiB or small, lacked its
//! namespace in its first 4 KiB (`webhook_reviews_unsorted_total` stays 0).

use super::*;

const TENANT: &str = "intake-tenant";
const SHOP: &str = "intake-shop";

/// serve's counter of requests refused for `reason`.
fn refused(serve: &ServeProcess, reason: &str) -> f64 {
    serve.metric(&format!(
        "config_snapshot_webhook_requests_refused_total{{reason=\"{reason}\"}}"
    ))
}

/// The tenant's Deployment: opted in (the policy reads it whole, and reads
/// its source from the API server), with one annotation of `bytes` of `<`,
/// as JSON with the `<` unescaped (serde_json writes it so; the API
/// server, in Go, escapes each into six bytes).
fn large_deployment(bytes: usize) -> String {
    let value = "<".repeat(bytes);
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "big", "namespace": TENANT,
            "annotations": {"config-snapshot.io/snapshot": "*", "note": value}},
        "spec": {"selector": {"matchLabels": {"app": "big"}},
            "template": {"metadata": {"labels": {"app": "big"}},
                "spec": {"containers": [{"name": "main", "image": "x:1",
                    "envFrom": [{"configMapRef": {"name": "app"}}]}]}}}})
    .to_string()
}

pub fn tenant_story(cp: &ControlPlane, serve: &ServeProcess) {
    cp.namespace(TENANT);
    cp.namespace(SHOP);
    cp.kubectl(&[
        "-n",
        TENANT,
        "create",
        "rolebinding",
        "tenant-edit",
        "--clusterrole=edit",
        "--user=tenant",
    ]);
    cp.apply(SHOP, &config_map("app", json!({"DB_HOST": "db.shop"})));
    cp.apply(TENANT, &config_map("app", json!({"DB_HOST": "db.tenant"})));
    // Reviews just under 8 MiB (the most serve takes), of ten sizes a
    // fifth of a KiB apart: whatever the API server adds around the object,
    // some come within a few KiB of 8 MiB, and two of those fill half of
    // serve's budget to within less than one small review.
    let sizes: Vec<usize> = (0..10).map(|i| 1_396_200 + 200 * i).collect();
    let files: Vec<String> = sizes
        .iter()
        .map(|&bytes| {
            let file = cp.dir.join(format!("intake-{bytes}.json"));
            std::fs::write(&file, large_deployment(bytes)).unwrap();
            file.display().to_string()
        })
        .collect();
    let path = format!("/apis/apps/v1/namespaces/{TENANT}/deployments?dryRun=All");
    let (namespace_before, budget_before) = (refused(serve, "namespace"), refused(serve, "budget"));
    let started = Instant::now();
    let stop = AtomicBool::new(false);
    let (sent, let_through) = std::thread::scope(|scope| {
        let loops: Vec<_> = files
            .iter()
            .map(|file| {
                let (stop, path) = (&stop, &path);
                scope.spawn(move || {
                    let mut sent = 0;
                    while !stop.load(Ordering::SeqCst) {
                        // Refused by validation (the annotation is past
                        // 256 KiB) after the webhooks saw it: the review
                        // is what counts.
                        let _ = cp.try_kubectl(&["--as=tenant", "create", "--raw", path, "-f", file], None);
                        sent += 1;
                    }
                    sent
                })
            })
            .collect();
        // The tenant's loops under way before the others' writes.
        std::thread::sleep(Duration::from_secs(2));
        let let_through: Vec<String> = (0..20)
            .map(|i| format!("shop-{i}"))
            .filter(|name| !applied_pinned(cp, SHOP, name))
            .collect();
        stop.store(true, Ordering::SeqCst);
        let sent: usize = loops.into_iter().map(|l| l.join().unwrap()).sum();
        (sent, let_through)
    });
    let tenants_refused = refused(serve, "namespace") - namespace_before;
    eprintln!(
        "intake: refused by serve: {}",
        ["door", "namespace", "too_large", "budget", "deadline"]
            .map(|r| format!("{r} {}", refused(serve, r)))
            .join(", ")
    );
    eprintln!(
        "intake: {sent} large dry runs as the tenant in {:?}, {tenants_refused} of them refused at the \
         tenant's share; the other namespace's 20 creates: {} let through",
        started.elapsed(),
        let_through.len()
    );
    assert!(
        let_through.is_empty(),
        "let through unpinned while the tenant's large reviews ran: {let_through:?}"
    );
    assert!(
        tenants_refused > 0.0,
        "the tenant's reviews never reached its share: the story did not load serve"
    );
    assert_eq!(
        refused(serve, "budget"),
        budget_before,
        "the budget as a whole was never full"
    );
    assert_eq!(
        serve.metric("config_snapshot_webhook_reviews_unsorted_total"),
        0.0,
        "a review of the real API server did not name its namespace in its first 4 KiB"
    );
    cp.kubectl(&["delete", "namespace", TENANT, SHOP, "--wait=false"]);
}
