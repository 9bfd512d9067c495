//! serve as a fleet: several replicas against one API server (the
//! stand-in), competing for one Lease. All of them answer admissions; only
//! the holder runs the periodic pass, and when it dies another takes over
//! within the lease duration.

use std::time::{Duration, Instant};

mod support;
use support::apiserver::ApiServer;
use support::process::ServeProcess;

const LEADER: &str = "config_snapshot_leader ";
const PASSES: &str = "config_snapshot_resync_passes_total";

fn replica(kubeconfig: &std::path::Path) -> ServeProcess {
    let mut p = ServeProcess::start(
        kubeconfig,
        &[
            "--leader-elect",
            "--lease-duration",
            "2s",
            "--resync-interval",
            "1s",
            "--lease-namespace",
            "config-snapshot",
        ],
    );
    // The holder name comes from POD_NAME in a cluster; here each process
    // is named by host and pid, which differ.
    p.wait_ready();
    p
}

fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn one_replica_runs_the_passes_and_another_takes_over_when_it_dies() {
    let api = ApiServer::start().await;
    let kubeconfig = api.kubeconfig();
    let mut replicas = [replica(&kubeconfig), replica(&kubeconfig)];

    wait_for("one leader", Duration::from_secs(20), || {
        replicas.iter().map(|r| r.metric(LEADER)).sum::<f64>() == 1.0
    });
    let leader = if replicas[0].metric(LEADER) == 1.0 { 0 } else { 1 };
    let follower = 1 - leader;
    wait_for("the leader's passes", Duration::from_secs(20), || {
        replicas[leader].metric(PASSES) >= 2.0
    });
    // Several resync intervals later the follower has run none, and both
    // still answer (ready) all the while.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(replicas[follower].metric(PASSES), 0.0, "a follower ran the pass");
    assert_eq!(replicas[leader].metric(LEADER) + replicas[follower].metric(LEADER), 1.0);
    for r in &replicas {
        assert_eq!(
            r.ops_get("/readyz").map(|(code, _)| code),
            Some(200),
            "readiness ignores leadership"
        );
    }
    let lease = api
        .get("Lease", "config-snapshot", "config-snapshot")
        .expect("the Lease exists in the lease namespace");
    assert!(lease["spec"]["holderIdentity"].is_string(), "{lease}");

    // The leader dies without stepping down: the follower takes the Lease
    // once it has gone unrenewed for the lease duration.
    let died = Instant::now();
    replicas[leader].stop();
    wait_for("the follower to lead", Duration::from_secs(15), || {
        replicas[follower].metric(LEADER) == 1.0
    });
    let took = died.elapsed();
    wait_for("the new leader's passes", Duration::from_secs(15), || {
        replicas[follower].metric(PASSES) >= 1.0
    });
    assert!(took < Duration::from_secs(2 + 5), "failover took {took:?}");
}

/// A storm of source edits, admitted by two replicas in turn: the storm
/// guard lives on the workload, so the replicas together roll it out at
/// most once per interval, not once per interval each, and once the storm
/// is over the workload runs the last content.
#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_share_one_storm_guard() {
    use serde_json::json;
    use support::webhook::Webhook;
    const NS: &str = "shop";
    const INTERVAL: u64 = 4;
    let api = ApiServer::start().await;
    let kubeconfig = api.kubeconfig();
    let interval = format!("{INTERVAL}s");
    let replicas: Vec<ServeProcess> = (0..2)
        .map(|_| {
            let mut p = ServeProcess::start(&kubeconfig, &["--watch-min-interval", &interval]);
            p.wait_ready();
            p
        })
        .collect();
    let mut hooks: Vec<Webhook> = replicas.iter().map(Webhook::to).collect();

    let source = |n: usize| {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app-config", "namespace": NS},
               "data": {"edit": n.to_string()}})
    };
    let mut live = api.put(source(0));
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": NS, "annotations": {"config-snapshot.io/watch": "app-config"}},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "nginx:1.25",
                "envFrom": [{"configMapRef": {"name": "app-config"}}]}]}}}
    });
    let (_, persisted) = hooks[0]
        .admit(NS, "create", "CREATE", &deployment, None, false)
        .await
        .unwrap();
    api.put(persisted);

    // The storm: each edit admitted by one replica, then persisted, as the
    // API server does.
    const EDITS: usize = 100;
    let started = Instant::now();
    for n in 1..=EDITS {
        let edited = source(n);
        let hook = &mut hooks[n % 2];
        let (response, persisted) = hook
            .admit(NS, &format!("edit-{n}"), "UPDATE", &edited, Some(&live), false)
            .await
            .unwrap();
        assert_eq!(response["allowed"], true, "{response}");
        live = api.put(persisted);
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let storm = started.elapsed();

    // After the storm, within one interval (and a margin for the queue),
    // the workload runs the last edit's snapshot.
    let last = EDITS.to_string();
    let runs_last = || {
        let web = api.get("Deployment", NS, "web")?;
        let name = web["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"]
            .as_str()?
            .to_string();
        let snapshot = api.get("ConfigMap", NS, &name)?;
        (snapshot["data"]["edit"] == last.as_str()).then_some(())
    };
    let deadline = Instant::now() + Duration::from_secs(INTERVAL * 2 + 10);
    while runs_last().is_none() {
        assert!(
            Instant::now() < deadline,
            "the workload was left on stale config after the storm"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let total = started.elapsed();

    let rollouts: f64 = replicas
        .iter()
        .map(|r| r.metric("config_snapshot_watch_rollouts_total"))
        .sum();
    // One at once, then at most one per interval for as long as it lasted.
    // The guard records rollout times in whole seconds (RFC 3339), so two
    // rollouts can be as little as INTERVAL - 1 seconds apart. A guard per
    // replica would allow twice this; no guard, one per edit.
    let allowed = (total.as_secs_f64() / (INTERVAL - 1) as f64).floor() + 1.0;
    assert!(rollouts >= 2.0, "the storm rolled out {rollouts} times");
    assert!(
        rollouts <= allowed,
        "{rollouts} rollouts by two replicas in {total:?} (storm {storm:?}); the guard allows {allowed}"
    );
}
