//! The periodic pass's decisions.

use super::*;
use config_snapshot_policy::model::content::{plain_snapshot, Content};
use config_snapshot_policy::model::duration::format_rfc3339;
use serde_json::json;

fn workload(ns: &str, annotations: Value) -> Value {
    json!({"kind": "Deployment", "metadata": {"name": "w", "namespace": ns, "annotations": annotations}})
}

fn source(kind: &str, ns: &str, name: &str) -> Value {
    json!({"kind": kind, "metadata": {"name": name, "namespace": ns}})
}

#[test]
fn only_sources_a_workload_in_their_namespace_watches_are_readmitted() {
    let settings = Settings::default();
    let workloads = [
        workload("shop", json!({"config-snapshot.io/watch": "app-config,secret/tls"})),
        workload("shop", json!({"config-snapshot.io/snapshot": "*"})),
        workload(
            "bank",
            json!({"config-snapshot.io/watch": "*", "config-snapshot.io/exclude": "noisy"}),
        ),
        workload("broken", json!({"config-snapshot.io/watch": "Not A Name!"})),
    ];
    let refs: Vec<&Value> = workloads.iter().collect();
    let watchers = Watchers::new(&refs, &settings);
    assert!(watchers.watch(&source("ConfigMap", "shop", "app-config")));
    assert!(watchers.watch(&source("Secret", "shop", "tls")));
    assert!(
        !watchers.watch(&source("ConfigMap", "shop", "other")),
        "snapshot-only is not watch"
    );
    assert!(!watchers.watch(&source("ConfigMap", "shop", "tls")), "the kind matters");
    assert!(!watchers.watch(&source("ConfigMap", "other-ns", "app-config")));
    assert!(watchers.watch(&source("ConfigMap", "bank", "anything")));
    assert!(!watchers.watch(&source("ConfigMap", "bank", "noisy")), "excluded");
    assert!(!watchers.watch(&source("ConfigMap", "broken", "x")));
    let mut snapshot = source("ConfigMap", "bank", "anything-5d41402abc");
    snapshot["metadata"]["labels"] = json!({keys::MANAGED_BY: keys::MANAGED_BY_VALUE});
    assert!(!watchers.watch(&snapshot), "snapshots are never sources");
}

#[test]
fn watch_by_default_makes_every_workload_a_watcher() {
    let settings =
        Settings::from_json(br#"{"watchByDefault": true, "excludedSources": ["configmap/kube-root-ca.crt"]}"#).unwrap();
    let workloads = [workload("shop", json!({}))];
    let refs: Vec<&Value> = workloads.iter().collect();
    let watchers = Watchers::new(&refs, &settings);
    assert!(watchers.watch(&source("ConfigMap", "shop", "app-config")));
    assert!(!watchers.watch(&source("ConfigMap", "shop", "kube-root-ca.crt")));
    assert!(!watchers.watch(&source("Secret", "empty-ns", "tls")));
}

/// The pass re-admits a source on its own word too: `readers: watch`
/// makes a workload that only snapshots it (`*`) its watcher, `ignore`
/// takes it out of a `*` watch; a workload that opts nothing in is no
/// watcher whatever a source says.
#[test]
fn a_sources_word_about_its_readers_decides_with_theirs() {
    let settings = Settings::default();
    let workloads = [
        workload("pins", json!({"config-snapshot.io/snapshot": "*"})),
        workload("watches", json!({"config-snapshot.io/watch": "*"})),
        workload("plain", json!({})),
    ];
    let refs: Vec<&Value> = workloads.iter().collect();
    let watchers = Watchers::new(&refs, &settings);
    let said = |ns: &str, word: &str| {
        let mut s = source("ConfigMap", ns, "app");
        s["metadata"]["annotations"] = json!({keys::READERS: word});
        s
    };
    assert!(!watchers.watch(&source("ConfigMap", "pins", "app")));
    assert!(watchers.watch(&said("pins", "watch")));
    assert!(watchers.watch(&source("ConfigMap", "watches", "app")));
    assert!(!watchers.watch(&said("watches", "ignore")));
    assert!(!watchers.watch(&said("plain", "watch")));
    // A word that does not parse is none.
    assert!(!watchers.watch(&said("pins", "yes")));
}

const NOW: i64 = 1_800_000_000;

fn snap(value: &str, age: i64) -> Value {
    let c = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"v": value}})).unwrap();
    let (_, mut o) = plain_snapshot(&SourceId::new(SourceKind::ConfigMap, "app"), "ns", "", &c);
    o["metadata"]["uid"] = json!(format!("uid-{value}"));
    o["metadata"]["resourceVersion"] = json!("3");
    o["metadata"]["creationTimestamp"] = json!(format_rfc3339(NOW - age));
    o
}

fn name(o: &Value) -> String {
    o.meta_str("name").unwrap().to_string()
}

#[test]
fn the_timed_sweep_spares_what_is_owned_used_young_or_awaited() {
    let orphan = snap("orphan", 3600);
    let young = snap("young", 10);
    let awaited = snap("awaited", 3600);
    let in_pod = snap("in-pod", 3600);
    let mut owned = snap("owned", 3600);
    owned["metadata"]["ownerReferences"] = json!([{"uid": "rs"}]);
    let pod = json!({"kind": "Pod", "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": name(&in_pod)}}]}]}});
    let objects = [&orphan, &young, &awaited, &in_pod, &owned, &pod];
    let pending: HashSet<Key> = [key(&awaited)].into();
    let doomed = orphans(&objects, &pending, NOW, 600);
    assert_eq!(doomed.len(), 1, "{doomed:?}");
    assert_eq!(doomed[0].name, name(&orphan));
    assert_eq!(
        (doomed[0].uid.as_str(), doomed[0].resource_version.as_str()),
        ("uid-orphan", "3")
    );
}

#[test]
fn an_owned_snapshot_a_workload_names_without_owning_it_is_anchored() {
    let none = HashSet::new();
    let mut snap = snap("shared", 0);
    snap["metadata"]["ownerReferences"] = json!([{"kind": "ControllerRevision", "name": "agent-1", "uid": "cr-uid"}]);
    let template = json!({"metadata": {"annotations": {"config-snapshot.io/snapshots": json!({"configmap/app": name(&snap)}).to_string()}},
        "spec": {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": name(&snap)}}]}]}});
    let web = json!({"kind": "Deployment", "metadata": {"name": "web", "namespace": "ns", "uid": "web-uid"}, "spec": {"template": template}});
    let owners = |snap: &Value| -> Vec<String> {
        snap["metadata"]["ownerReferences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["uid"].as_str().unwrap().to_string())
            .collect()
    };
    // Named by web, owned only by another workload's revision: anchored,
    // and marked used in the same write.
    let found = unkept(&[&snap, &web]);
    let [Keep::Anchor(found)] = found[..] else {
        panic!("{found:?}");
    };
    let ops = crate::lifecycle::verdict::anchor_ops(found, "ns-uid", 1_000).unwrap();
    crate::lifecycle::verdict::apply_ops(&mut snap, &ops).unwrap();
    assert_eq!(owners(&snap), ["cr-uid", "ns-uid"]);
    assert_eq!(
        snap["metadata"]["annotations"][keys::LAST_USED_AT],
        format_rfc3339(1_000)
    );
    assert!(unkept(&[&snap, &web]).is_empty(), "stable");
    assert!(crate::lifecycle::verdict::anchor_ops(&snap, "ns-uid", 2_000).is_none());
    // Not named, or named by a workload that owns it: nothing to anchor.
    snap["metadata"]["ownerReferences"] = json!([{"kind": "ControllerRevision", "uid": "cr-uid"}]);
    let bare = json!({"kind": "Deployment", "metadata": {"name": "bare", "namespace": "ns", "uid": "bare-uid"},
        "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}});
    assert!(unkept(&[&snap, &bare]).is_empty());
    snap["metadata"]["ownerReferences"]
        .as_array_mut()
        .unwrap()
        .push(json!({"kind": "Deployment", "uid": "web-uid"}));
    assert!(unkept(&[&snap, &web]).is_empty());
    // A workload that no longer names it stops owning it.
    let mut other = web.clone();
    other["spec"]["template"] = json!({"spec": {"containers": [{"name": "c"}]}});
    // Unless a rollout on its way will make it name the snapshot.
    let awaited = HashSet::from([key(&snap)]);
    assert!(releases(&[&snap, &other], &awaited).is_empty());
    for (_, _, ops) in releases(&[&snap, &other], &none) {
        crate::lifecycle::verdict::apply_ops(&mut snap, &ops).unwrap();
    }
    assert_eq!(owners(&snap), ["cr-uid"]);
}

/// Adoption repair reaches a Pod made directly, never a controller's Pod
/// (it carries its ReplicaSet's mapping; the ReplicaSet owns the config).
#[test]
fn a_bare_pod_adopts_what_it_names_and_a_controllers_pod_does_not() {
    let b = snap("b", 0);
    let snapshot = name(&b);
    let pod = |pod: &str, owners: Value| {
        json!({"kind": "Pod", "metadata": {"name": pod, "namespace": "ns", "uid": format!("{pod}-uid"), "ownerReferences": owners,
            "annotations": {"config-snapshot.io/snapshots": json!({"configmap/app": snapshot}).to_string()}},
            "spec": {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": snapshot}}]}]}})
    };
    let bare = pod("debug", json!([]));
    let controlled = pod(
        "web-1-x",
        json!([{"kind": "ReplicaSet", "uid": "rs-uid", "controller": true}]),
    );
    let effects = missing_adoptions(&[&b, &bare, &controlled]);
    assert_eq!(
        effects,
        vec![Effect::Adopt {
            namespace: "ns".into(),
            owner_kind: "Pod".into(),
            owner_name: "debug".into(),
            snapshots: vec![SnapshotRef {
                kind: SourceKind::ConfigMap,
                name: name(&b),
            }],
            stored_as: None,
        }]
    );
}

#[test]
fn a_revision_adopts_what_it_references_and_does_not_own() {
    let mut a = snap("a", 0);
    let b = snap("b", 0);
    a["metadata"]["ownerReferences"] = json!([{"uid": "rs-uid"}]);
    let template = json!({"metadata": {"annotations": {"config-snapshot.io/snapshots": json!({"configmap/app": name(&b)}).to_string()}},
        "spec": {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": name(&b)}}]}]}});
    let rs = json!({"kind": "ReplicaSet", "metadata": {"name": "web-1", "namespace": "ns", "uid": "rs-uid"}, "spec": {"template": template}});
    let effects = missing_adoptions(&[&a, &b, &rs]);
    assert_eq!(
        effects,
        vec![Effect::Adopt {
            namespace: "ns".into(),
            owner_kind: "ReplicaSet".into(),
            owner_name: "web-1".into(),
            snapshots: vec![SnapshotRef {
                kind: SourceKind::ConfigMap,
                name: name(&b),
            }],
            stored_as: None,
        }]
    );
}

/// A snapshot only the workload's own older revision owns (after a
/// rollback, or a change back) is owned by the workload again, not
/// anchored: its history limit still collects it.
#[test]
fn a_workloads_own_history_is_owned_again_not_anchored() {
    let mut snap = snap("mine", 0);
    snap["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "rs-uid"}]);
    let template = json!({"metadata": {"annotations": {"config-snapshot.io/snapshots": json!({"configmap/app": name(&snap)}).to_string()}},
        "spec": {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": name(&snap)}}]}]}});
    let web = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "ns", "uid": "web-uid"},
        "spec": {"template": template}});
    let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "web-1", "namespace": "ns", "uid": "rs-uid",
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "web-uid", "controller": true}]}});
    assert_eq!(
        unkept(&[&snap, &web, &rs]),
        [Keep::Own {
            snapshot: &snap,
            workload: &web
        }]
    );
    // Another workload's revision: anchored.
    let mut theirs = rs.clone();
    theirs["metadata"]["ownerReferences"][0]["uid"] = json!("other-uid");
    assert_eq!(unkept(&[&snap, &web, &theirs]), [Keep::Anchor(&snap)]);
}
