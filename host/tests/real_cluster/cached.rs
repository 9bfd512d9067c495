//! Finding 6 of eff3694's review on the real control plane: a Secret
//! applied client-side (`kubectl apply`, Argo CD's default sync) carries its
//! whole manifest, `stringData` in plain text, in
//! `kubectl.kubernetes.io/last-applied-configuration`, which serve's cache
//! kept with the rest of its metadata. serve's own `Cache`, run here against
//! the real kube-apiserver, holds nothing of its value.

use std::sync::Arc;

use config_snapshot::cluster::proof::Prover;
use config_snapshot::serve::view::cache::{Cache, KINDS};

use super::*;

pub fn cached_secret_story(cp: &ControlPlane) {
    let ns = "trust-cache";
    cp.namespace(ns);
    config_snapshot::use_ring_for_tls();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let cache = runtime.block_on(async {
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&cp.kubeconfig).unwrap(),
            &Default::default(),
        )
        .await
        .unwrap();
        let client = kube::Client::try_from(config).unwrap();
        let prover = Arc::new(Prover::new(&Prover::generate_key()));
        let cache = Arc::new(Cache::within(vec![ns.to_string()]).digesting(prover));
        cache.start(client);
        cache
    });
    eventually("the cache to list its namespace", 60, || cache.synced().then_some(()));
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"},
                        "stringData": {"password": CANARY}});
    cp.apply(ns, &secret);
    // What the API server stores, and so what the watch brings: the
    // canary, in plain text, in the last-applied annotation.
    let stored = cp.get(ns, "secret", "db").unwrap();
    let applied = stored["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
        .as_str()
        .unwrap_or_default();
    assert!(
        applied.contains(CANARY),
        "a client-side apply keeps its manifest: {stored}"
    );
    let web = workload(
        "Deployment",
        "web",
        json!({"team": "shop"}),
        "x:1",
        json!([{"secretRef": {"name": "db"}}]),
        1,
    );
    cp.apply(ns, &web);
    eventually("the cache to hold both", 30, || {
        let held = |kind: &str, name: &str| cache.get(kind, ns, name).ok().flatten();
        (held("Secret", "db").is_some() && held("Deployment", "web").is_some()).then_some(())
    });
    let encoded = base64::engine::general_purpose::STANDARD.encode(CANARY);
    let everything: Vec<Value> = KINDS.iter().flat_map(|k| cache.all(k.kind)).collect();
    let text = serde_json::to_string(&everything).unwrap();
    assert!(
        !text.contains(CANARY) && !text.contains(&encoded),
        "serve's cache holds the Secret's value:\n{text}"
    );
    assert!(!text.contains("last-applied-configuration"), "{text}");
    let kept = cache.get("Deployment", ns, "web").unwrap().unwrap();
    assert_eq!(
        kept["metadata"]["annotations"]["team"], "shop",
        "a workload's own annotations stay"
    );
    drop(runtime);
    cp.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}
