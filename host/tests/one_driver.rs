//! One driver, two clusters: the lifecycle's driver carries the same
//! deferred effects and the same periodic pass out once over replay's
//! simulator and once over serve's kube-rs cluster, which talks
//! HTTP to the stand-in API server. Both start from the same objects and
//! must leave the same objects, resourceVersions included: the same writes,
//! in the same order.

use std::sync::Arc;
use std::time::Duration;

use config_snapshot::cluster::proof::Prover;
use config_snapshot::cluster::Cluster;
use config_snapshot::lifecycle::resync::{PassHost, ReadmitError};
use config_snapshot::lifecycle::{Begun, Driver, Effect, Ending, InFlight, Next, PatchIntent, Rules, Silent};
use config_snapshot::replay::simulator::Shared;
use config_snapshot::serve::tell::metrics::Metrics;
use config_snapshot::serve::view::apiserver::KubeCluster;
use config_snapshot::serve::view::cache::Cache;
use config_snapshot_policy::host::contract::SnapshotRef;
use config_snapshot_policy::model::content::{plain_snapshot, Content};
use config_snapshot_policy::model::duration::format_rfc3339;
use config_snapshot_policy::model::kinds::KINDS;
use config_snapshot_policy::model::settings::Settings;
use config_snapshot_policy::model::source::{SourceId, SourceKind};
use config_snapshot_testing::standin::ApiServer;
use serde_json::{json, Value};

const NOW: i64 = 1_800_000_000;

fn snapshot(data: &str, uid: &str, rv: &str, age: i64) -> (String, Value) {
    let content = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"mode": data}})).unwrap();
    let (name, mut object) = plain_snapshot(&SourceId::new(SourceKind::ConfigMap, "app"), "shop", "", &content);
    object["metadata"]["uid"] = json!(uid);
    object["metadata"]["resourceVersion"] = json!(rv);
    object["metadata"]["creationTimestamp"] = json!(format_rfc3339(NOW - age));
    Prover::replay().sign(&mut object);
    (name, object)
}

fn hash(data: &str) -> String {
    Content::from_object(SourceKind::ConfigMap, &json!({"data": {"mode": data}}))
        .unwrap()
        .hash()
}

/// A watcher of `app` on blue, its ReplicaSet, blue's snapshot, the source
/// now green with green's snapshot made by its admission, and a snapshot
/// nothing has used for an hour.
fn cluster() -> (Vec<Value>, Vec<Effect>) {
    let (blue, blue_snap) = snapshot("blue", "u-blue", "3", 7200);
    let (green, green_snap) = snapshot("green", "u-green", "6", 10);
    let (red, _) = snapshot("red", "u-red", "0", 0);
    let (_, old_snap) = snapshot("old", "u-old", "2", 3600);
    let template = json!({
        "metadata": {"labels": {"app": "web"},
                     "annotations": {"config-snapshot.io/snapshots": json!({"configmap/app": blue}).to_string()}},
        "spec": {"containers": [{"name": "c", "image": "app:1", "envFrom": [{"configMapRef": {"name": blue}}]}]},
    });
    let web = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "shop", "uid": "u-web", "resourceVersion": "4", "generation": 1,
                     "annotations": {"config-snapshot.io/watch": "app"}},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": template}});
    let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "web-1", "namespace": "shop", "uid": "u-rs", "resourceVersion": "5",
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "u-web", "controller": true}]},
        "spec": {"template": template}});
    let source = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "app", "namespace": "shop", "uid": "u-app", "resourceVersion": "7"},
        "data": {"mode": "green"}});
    let patch = |snapshot: &str, data: &str, source_version: &str| {
        let request = json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "resourceVersion": "4",
            "rollbacks": 0, "patch": [], "snapshot": snapshot,
            "source": {"kind": "ConfigMap", "name": "app", "contentHash": hash(data), "resourceVersion": source_version}});
        Effect::Patch(PatchIntent::new("shop", serde_json::from_value(request).unwrap()))
    };
    let effects = vec![
        // The ReplicaSet adopts blue.
        Effect::Adopt {
            namespace: "shop".into(),
            owner_kind: "ReplicaSet".into(),
            owner_name: "web-1".into(),
            snapshots: vec![SnapshotRef {
                kind: SourceKind::ConfigMap,
                name: blue.clone(),
            }],
            stored_as: None,
        },
        // The edit to green landed: the watcher rolls out to green.
        patch(&green, "green", "1"),
        // An edit to red, overtaken by green: dropped, nothing to collect
        // (red's snapshot was never made).
        patch(&red, "red", "1"),
    ];
    (vec![web, rs, source, blue_snap, green_snap, old_snap], effects)
}

/// The rules both clusters are driven by: the shipped grace period and
/// replay's key.
fn rules() -> Rules {
    Rules::new(
        Settings::from_json(br#"{"orphanGracePeriod": "10m"}"#).unwrap(),
        Arc::new(Prover::replay()),
    )
}

/// The pass's host where nothing is admitted again: this test is about
/// what the driver writes, and effects queued by the pass run at once.
struct Pass<'a>(&'a Driver<'a>);

impl PassHost for Pass<'_> {
    fn readmit(&self, _: &str, _: &Value, _: Option<&Value>) -> Result<Option<Value>, ReadmitError> {
        Ok(None)
    }
    fn submit(&self, effect: Effect) {
        if self.0.in_flight.begin(&effect) == Begun::New {
            self.0.step(&effect, false, 0);
        }
    }
}

/// Every effect, then one periodic pass; how each effect ended.
fn drive(cluster: &dyn Cluster, effects: &[Effect]) -> Vec<Next> {
    let rules = Rules {
        watch_min_interval: 30,
        ..rules()
    };
    let in_flight = InFlight::default();
    let driver = Driver::new(cluster, &rules, &in_flight, &Silent);
    let endings = effects
        .iter()
        .map(|e| {
            assert_eq!(in_flight.begin(e), Begun::New);
            driver.step(e, false, 0)
        })
        .collect();
    driver.resync(&Pass(&driver));
    endings
}

fn everything(cluster: &dyn Cluster) -> Vec<Value> {
    let mut out = Vec::new();
    for k in &KINDS {
        cluster
            .list(k.kind, None, &Default::default(), &mut |o| out.push(o.clone()))
            .unwrap();
    }
    out.sort_by_key(config_snapshot::cluster::key);
    out
}

/// `run` over replay's simulator and over serve's kube-rs cluster
/// (to the stand-in API server), each starting from `objects`: what each
/// run answered, and every object each left.
async fn on_both<R: Send + 'static>(
    objects: &[Value],
    run: fn(&dyn Cluster) -> R,
) -> ((R, Vec<Value>), (R, Vec<Value>)) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let memory = Arc::new(Shared::default());
    memory.store().reset(objects);
    memory.store().now = NOW;
    let in_memory = {
        let memory = memory.clone();
        tokio::task::spawn_blocking(move || run(memory.as_ref())).await.unwrap()
    };

    let api = ApiServer::start().await;
    api.reset(objects);
    api.fix_clock(NOW);
    let client = kube::Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    let cache = Arc::new(Cache::new());
    let watchers = cache.start(client.clone());
    while !cache.synced() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let kube = Arc::new(KubeCluster::new(
        client,
        cache,
        tokio::runtime::Handle::current(),
        Arc::new(Metrics::default()),
    ));
    kube.fix_clock(NOW);
    let over_http = {
        let kube = kube.clone();
        tokio::task::spawn_blocking(move || run(kube.as_ref())).await.unwrap()
    };
    for w in watchers {
        w.abort();
    }
    (
        (in_memory, everything(memory.as_ref())),
        (over_http, everything(kube.as_ref())),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_effects_leave_the_same_objects_in_memory_and_over_http() {
    let (objects, _) = cluster();
    let ((in_memory, left), (over_http, right)) = on_both(&objects, |c| drive(c, &cluster().1)).await;

    // The effects ended the same way, and as the rules say.
    assert_eq!(in_memory, over_http);
    assert_eq!(
        in_memory,
        [
            Next::Over(Ending::Done),
            Next::Over(Ending::Done),
            Next::Over(Ending::Dropped)
        ]
    );
    // The same objects, version for version.
    let names = |v: &[Value]| v.iter().map(config_snapshot::cluster::key).collect::<Vec<_>>();
    assert_eq!(names(&left), names(&right));
    for (a, b) in left.iter().zip(&right) {
        assert_eq!(a, b, "{:?} differs", config_snapshot::cluster::key(a));
    }
    // And what was written is what the rules decide: blue adopted by the
    // ReplicaSet (and, for the while the Deployment named it, by the
    // Deployment, which the pass then released), the watcher on green, the
    // hour-old unused snapshot swept.
    let web = left.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let env = &web["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"];
    assert!(env.as_str().unwrap().starts_with("app-") && *env != objects[3]["metadata"]["name"]);
    assert_eq!(*env, objects[4]["metadata"]["name"], "rolled out to green");
    let blue = left.iter().find(|o| o["metadata"]["uid"] == "u-blue").unwrap();
    let owners: Vec<&str> = blue["metadata"]["ownerReferences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    assert_eq!(owners, ["ReplicaSet"]);
    assert!(
        !left.iter().any(|o| o["metadata"]["uid"] == "u-old"),
        "the unused snapshot was swept"
    );
}

/// A watch rollout onto a snapshot that revisions own (here the watcher's
/// own older ReplicaSet, as after a change back) makes the workload an
/// owner before it moves the workload there (its own history: owned, not
/// anchored, so that its history limit still collects it): the controller
/// may prune that ReplicaSet as it makes the rollout's new one, before the
/// new one adopts the snapshot, and the garbage collector must not take it
/// meanwhile (docs/design.md, "Garbage collection", Anchors). Another
/// workload's revision's snapshot is anchored instead. The same on both
/// clusters, with no pass to mend it afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_rollout_keeps_the_snapshot_before_it_names_it() {
    let (mut objects, effects) = cluster();
    let green = objects[4]["metadata"]["name"].as_str().unwrap().to_string();
    objects[4]["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "name": "web-0", "uid": "u-rs0"}]);
    objects.push(json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "web-0", "namespace": "shop", "uid": "u-rs0", "resourceVersion": "2",
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "u-web", "controller": true}]},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "app:0"}]}}}}));
    let rollout = effects[1].clone();
    assert_eq!(rollout.target().unwrap().2, green);
    let ((a, left), (b, right)) = on_both(&objects, |c| {
        let rules = rules();
        let in_flight = InFlight::default();
        let driver = Driver::new(c, &rules, &in_flight, &Silent);
        let (_, effects) = cluster();
        assert_eq!(in_flight.begin(&effects[1]), Begun::New);
        driver.step(&effects[1], false, 0)
    })
    .await;
    assert_eq!((&a, &b), (&Next::Over(Ending::Done), &Next::Over(Ending::Done)));
    for objects in [&left, &right] {
        let web = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
        let env = &web["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"];
        assert_eq!(*env, json!(green), "rolled out to green");
        let snapshot = objects
            .iter()
            .find(|o| o["metadata"]["name"] == green.as_str())
            .unwrap();
        let owners: Vec<&str> = snapshot["metadata"]["ownerReferences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["uid"].as_str().unwrap())
            .collect();
        assert_eq!(owners, ["u-rs0", "u-web"]);
    }
    assert_eq!(left, right);
}

/// The sweep after a new snapshot, the host's own effect: of `app`'s other
/// versions, the hour-old one nothing owns, uses or references goes; blue
/// (referenced) and the one just made (`keep`) stay. The same on both
/// clusters, under the guard's preconditions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_after_a_new_snapshot_takes_only_the_sources_unused_versions() {
    let (objects, _) = cluster();
    let ((a, left), (b, right)) = on_both(&objects, |c| {
        let rules = rules();
        let in_flight = InFlight::default();
        let driver = Driver::new(c, &rules, &in_flight, &Silent);
        let (objects, _) = cluster();
        let sweep = |keep: &Value| Effect::Sweep {
            namespace: "shop".into(),
            source: SourceId::new(SourceKind::ConfigMap, "app"),
            keep: keep["metadata"]["name"].as_str().unwrap().to_string(),
        };
        // Kept as the one just made, the hour-old version stays.
        let spared = sweep(&objects[5]);
        assert_eq!(in_flight.begin(&spared), Begun::New);
        let first = driver.step(&spared, false, 0);
        let kept = c.get("ConfigMap", "shop", objects[5]["metadata"]["name"].as_str().unwrap());
        assert!(kept.unwrap().is_some(), "the snapshot kept is never swept");
        let swept = sweep(&objects[4]);
        assert_eq!(in_flight.begin(&swept), Begun::New);
        (first, driver.step(&swept, false, 0))
    })
    .await;
    assert_eq!(a, (Next::Over(Ending::Done), Next::Over(Ending::Done)));
    assert_eq!(a, b);
    let snapshots: std::collections::BTreeSet<&str> = left
        .iter()
        .filter(|o| config_snapshot_policy::model::keys::is_snapshot(o))
        .map(|o| o["metadata"]["uid"].as_str().unwrap())
        .collect();
    assert_eq!(snapshots, ["u-blue", "u-green"].into(), "only the unused version went");
    assert_eq!(left, right);
}

/// A watch rollout decided before its content was revoked: when it runs,
/// the namespace's record (read through each cluster's `get`: serve's
/// cache keeps it, label and annotation) names that content's snapshot,
/// so the rollout is dropped, nothing is made, and the watcher stays where
/// it is (docs/design.md, "Revocation"). The same on both clusters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_rollout_to_content_revoked_since_is_dropped() {
    use config_snapshot_policy::model::revocation::{Revocation, Revocations};
    let (mut objects, _) = cluster();
    let green = objects[4]["metadata"]["name"].as_str().unwrap().to_string();
    // Revoked: recorded, and its snapshot deleted.
    objects.remove(4);
    let record = Revocations(vec![Revocation {
        source: SourceId::new(SourceKind::ConfigMap, "app"),
        at: NOW - 60,
        by: "alice".into(),
        snapshots: vec![green.clone()],
    }]);
    let mut record = record.record_object("shop");
    record["metadata"]["uid"] = json!("u-record");
    record["metadata"]["resourceVersion"] = json!("8");
    objects.push(record);
    let ((a, left), (b, right)) = on_both(&objects, |c| {
        let rules = rules();
        let in_flight = InFlight::default();
        let driver = Driver::new(c, &rules, &in_flight, &Silent);
        let (_, effects) = cluster();
        assert_eq!(in_flight.begin(&effects[1]), Begun::New);
        driver.step(&effects[1], false, 0)
    })
    .await;
    assert_eq!((&a, &b), (&Next::Over(Ending::Dropped), &Next::Over(Ending::Dropped)));
    for objects in [&left, &right] {
        assert!(
            !objects.iter().any(|o| o["metadata"]["name"] == green.as_str()),
            "the revoked snapshot was made again"
        );
        let web = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
        let env = &web["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"];
        assert_ne!(*env, json!(green), "rolled to revoked content");
    }
    assert_eq!(left, right);
}
