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
