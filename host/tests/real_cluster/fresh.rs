//! The freshness guarantee of docs/design.md ("Workload admission"): a
//! ConfigMap written just before its workload, in one `kubectl apply`
//! stream as `helm upgrade` and `kubectl apply -f dir/` write them, is the
//! content the workload is pinned to, each time.

use super::*;

pub fn fresh_as_the_request_story(cp: &ControlPlane) {
    let ns = "story-fresh";
    cp.namespace(ns);
    for round in 0..20 {
        let value = format!("v{round}");
        let cm = config_map("app", json!({"value": value}));
        // A new image each round: a roll-forward, which snapshots anew.
        let deployment = workload(
            "Deployment",
            "web",
            json!({"config-snapshot.io/snapshot": "app"}),
            &format!("app:{round}"),
            json!([{"configMapRef": {"name": "app"}}]),
            2,
        );
        let stream = format!("{cm}\n---\n{deployment}");
        cp.try_kubectl(&["apply", "-n", ns, "-f", "-"], Some(&stream))
            .unwrap_or_else(|e| panic!("{e}"));
        let web = cp.get(ns, "deployment", "web").unwrap();
        let snapshot = env_ref(&web);
        assert!(snapshot.starts_with("app-"), "round {round}: {web}");
        let pinned = cp.get(ns, "configmap", &snapshot).unwrap();
        assert_eq!(
            pinned["data"]["value"], value,
            "round {round}: the Deployment is pinned to {snapshot}, not to the ConfigMap written just before it"
        );
    }
}
