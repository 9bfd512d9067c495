//! serve as a fleet: several replicas against one API server (the
//! stand-in), competing for one Lease. All of them answer admissions; only
//! the holder runs the periodic pass, and when it dies another takes over
//! within the lease duration.

use std::time::{Duration, Instant};

use config_snapshot_policy::model::duration::parse_rfc3339;
use serde_json::{json, Value};

mod support;
use config_snapshot_testing::standin::ApiServer;
use support::process::ServeProcess;
use support::webhook::Webhook;

const NS: &str = "shop";

/// The watched ConfigMap at its `n`th edit.
fn source(n: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app-config", "namespace": NS},
           "data": {"edit": n.to_string()}})
}

fn deployment() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": NS, "annotations": {"config-snapshot.io/watch": "app-config"}},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "nginx:1.25",
                "envFrom": [{"configMapRef": {"name": "app-config"}}]}]}}}
    })
}

/// The snapshot a version of the Deployment runs.
fn pinned(web: &Value) -> Option<&str> {
    web["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"].as_str()
}

/// Which edit the Deployment runs now: the content of the snapshot it pins.
fn runs(api: &ApiServer) -> Option<usize> {
    let web = api.get("Deployment", NS, "web")?;
    let snapshot = api.get("ConfigMap", NS, pinned(&web)?)?;
    snapshot["data"]["edit"].as_str()?.parse().ok()
}

/// Every watch rollout the Deployment has had, from its stored versions
/// (writes by replicas since killed included): the snapshot it moved to and
/// the time the rollout recorded for the storm guard (unix seconds).
fn rollouts(api: &ApiServer) -> Vec<(String, i64)> {
    let versions = api.versions("Deployment", NS, "web");
    versions
        .windows(2)
        .filter(|w| pinned(&w[0]) != pinned(&w[1]))
        .map(|w| {
            let record: Value = serde_json::from_str(
                w[1]["metadata"]["annotations"]["config-snapshot.io/watch-rollout"]
                    .as_str()
                    .expect("a rollout records itself"),
            )
            .unwrap();
            let at = record["at"].as_str().unwrap();
            (pinned(&w[1]).unwrap().to_string(), parse_rfc3339(at).unwrap())
        })
        .collect()
}

/// Rollouts at least `interval` seconds apart, each to a snapshot of its own.
fn assert_guarded(rollouts: &[(String, i64)], interval: i64) {
    for pair in rollouts.windows(2) {
        assert!(
            pair[1].1 - pair[0].1 >= interval,
            "two rollouts within the guard's interval: {rollouts:?}"
        );
    }
    let mut snapshots: Vec<&str> = rollouts.iter().map(|(s, _)| s.as_str()).collect();
    snapshots.sort_unstable();
    snapshots.dedup();
    assert_eq!(
        snapshots.len(),
        rollouts.len(),
        "a content rolled out twice: {rollouts:?}"
    );
}

const LEADER: &str = "config_snapshot_leader ";
const PASSES: &str = "config_snapshot_resync_passes_total";

/// Competing for the Lease, with short periods. The holder name comes from
/// POD_NAME in a cluster; here each process is named by host and pid,
/// which differ.
const ELECTION: [&str; 7] = [
    "--leader-elect",
    "--lease-duration",
    "2s",
    "--resync-interval",
    "1s",
    "--lease-namespace",
    "config-snapshot",
];

/// A serve process with `flags`, ready.
fn started(kubeconfig: &std::path::Path, flags: &[&str]) -> ServeProcess {
    let mut p = ServeProcess::start(kubeconfig, flags);
    p.wait_ready();
    p
}

/// Waits until exactly one of `replicas` leads; answers which.
fn one_leader(replicas: &[ServeProcess]) -> usize {
    wait_for("one leader", Duration::from_secs(20), || {
        replicas.iter().map(|r| r.metric(LEADER)).sum::<f64>() == 1.0
    });
    if replicas[0].metric(LEADER) == 1.0 {
        0
    } else {
        1
    }
}

/// The shop: the watched source at edit 0 and the Deployment watching it,
/// admitted through `hook` and persisted. Returns the stored source.
async fn open_shop(api: &ApiServer, hook: &mut Webhook) -> Value {
    let live = api.put(source(0));
    let (_, web) = hook
        .admit(NS, "create", "CREATE", &deployment(), None, false)
        .await
        .unwrap();
    api.put(web);
    live
}

/// Admits edit `n` of the source through `hook` and persists it, as the API
/// server does; returns the stored source.
async fn edit(api: &ApiServer, hook: &mut Webhook, live: &Value, n: usize) -> Value {
    let (response, persisted) = hook
        .admit(NS, &format!("edit-{n}"), "UPDATE", &source(n), Some(live), false)
        .await
        .unwrap();
    assert_eq!(response["allowed"], true, "{response}");
    api.put(persisted)
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
    let mut replicas = [started(&kubeconfig, &ELECTION), started(&kubeconfig, &ELECTION)];
    let leader = one_leader(&replicas);
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
    const INTERVAL: u64 = 4;
    let api = ApiServer::start().await;
    let kubeconfig = api.kubeconfig();
    let interval = format!("{INTERVAL}s");
    let replicas: Vec<ServeProcess> = (0..2)
        .map(|_| started(&kubeconfig, &["--watch-min-interval", &interval]))
        .collect();
    let mut hooks: Vec<Webhook> = replicas.iter().map(Webhook::to).collect();
    let mut live = open_shop(&api, &mut hooks[0]).await;

    // The storm: each edit admitted by one replica, then persisted, as the
    // API server does.
    const EDITS: usize = 100;
    let started = Instant::now();
    for n in 1..=EDITS {
        live = edit(&api, &mut hooks[n % 2], &live, n).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let storm = started.elapsed();

    // After the storm, within one interval (and a margin for the queue),
    // the workload runs the last edit's snapshot.
    let deadline = Instant::now() + Duration::from_secs(INTERVAL * 2 + 10);
    while runs(&api) != Some(EDITS) {
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

/// A replica is killed (SIGKILL, no goodbye) while the storm guard holds a
/// rollout in its in-memory queue. Restarted, it loses nothing: its resync
/// derives the rollout again from the cluster. The guard lives on the
/// workload, so the restart does not reset it: the rollout still waits out
/// the interval, and happens once.
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_replica_loses_no_held_rollout_and_keeps_the_guard() {
    const INTERVAL: u64 = 8;
    let api = ApiServer::start().await;
    let kubeconfig = api.kubeconfig();
    let flags = ["--watch-min-interval", "8s", "--resync-interval", "1s"];
    let mut replica = started(&kubeconfig, &flags);
    let mut hook = Webhook::to(&replica);
    let live = open_shop(&api, &mut hook).await;

    let live = edit(&api, &mut hook, &live, 1).await;
    wait_for("edit 1 to roll out at once", Duration::from_secs(10), || {
        runs(&api) == Some(1)
    });
    let first = Instant::now();
    edit(&api, &mut hook, &live, 2).await;
    wait_for("the guard to hold edit 2", Duration::from_secs(10), || {
        replica.logs().contains("held by the storm guard")
    });
    replica.restart(&kubeconfig, &flags);
    replica.wait_ready();
    let restarted = first.elapsed();

    // The recorded rollout time is in whole seconds, so the guard may let
    // go up to a second early; two seconds of margin.
    while first.elapsed() < Duration::from_secs(INTERVAL - 2) {
        assert_eq!(
            runs(&api),
            Some(1),
            "rolled out within the interval after a restart:\n{}",
            replica.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // One interval, one resync, and a margin for the queue.
    wait_for(
        "edit 2 to roll out after the restart",
        Duration::from_secs(INTERVAL + 10),
        || runs(&api) == Some(2),
    );
    assert!(
        restarted < Duration::from_secs(INTERVAL - 2),
        "the restart took {restarted:?}, leaving the guard untested"
    );
    // A few passes later: still exactly the two rollouts, far enough apart.
    std::thread::sleep(Duration::from_secs(3));
    let done = rollouts(&api);
    assert_eq!(done.len(), 2, "{done:?}");
    assert_guarded(&done, INTERVAL as i64);
    assert!(
        replica.logs().contains("resync"),
        "the restarted replica's resync did not run:\n{}",
        replica.logs()
    );
}

/// Two replicas share a storm; the leader is killed holding the storm's
/// last edit in its queue. The other replica takes the Lease, its resync
/// derives the lost rollout, and the workload runs the last edit within one
/// interval plus one resync (plus the failover). Over the whole history the
/// guard held across both replicas and no content rolled out twice.
#[tokio::test(flavor = "multi_thread")]
async fn the_leader_killed_mid_storm_loses_no_rollout_and_repeats_none() {
    const INTERVAL: u64 = 4;
    const LEASE: u64 = 2;
    let api = ApiServer::start().await;
    let kubeconfig = api.kubeconfig();
    let flags: Vec<&str> = ELECTION.into_iter().chain(["--watch-min-interval", "4s"]).collect();
    let mut replicas: Vec<ServeProcess> = (0..2).map(|_| started(&kubeconfig, &flags)).collect();
    let leader = one_leader(&replicas);
    let survivor = 1 - leader;
    let mut hooks: Vec<Webhook> = replicas.iter().map(Webhook::to).collect();
    let mut live = open_shop(&api, &mut hooks[survivor]).await;

    // The storm, admitted in turn; the leader admits the last edit.
    const EDITS: usize = 40;
    for n in 1..=EDITS {
        let by = if (EDITS - n).is_multiple_of(2) {
            leader
        } else {
            survivor
        };
        live = edit(&api, &mut hooks[by], &live, n).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    replicas[leader].stop();
    let killed = Instant::now();

    wait_for(
        "the last edit to roll out after the leader died",
        Duration::from_secs(INTERVAL + 1 + LEASE + 10),
        || runs(&api) == Some(EDITS),
    );
    let took = killed.elapsed();
    assert_eq!(replicas[survivor].metric(LEADER), 1.0, "the survivor does not lead");
    assert!(replicas[survivor].metric(PASSES) >= 1.0);
    assert!(
        took <= Duration::from_secs(INTERVAL + 1 + LEASE + 3),
        "the workload stayed on stale content for {took:?} after the leader died"
    );
    // Some passes later nothing more has moved.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(runs(&api), Some(EDITS));
    let done = rollouts(&api);
    assert!(done.len() >= 2, "{done:?}");
    assert_guarded(&done, INTERVAL as i64);
}
