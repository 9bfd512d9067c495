//! The periodic pass (serve's resync, replay's `advanceTime`): what only a
//! timer can do, decided from the objects as they are.
//! - **Adoption repair**: each revision owns the snapshots it references,
//!   even if its adoption was lost (a restart, a full queue).
//! - **Renewals**: renew-duration fires on time, not only when someone edits
//!   the workload: each workload with it is re-admitted as a no-op update.
//! - **Watch re-derivation**: each source some workload in its namespace
//!   watches is re-admitted as a CREATE, which rolls out only the watchers
//!   not on its content and not held by a rollback that declined it.
//! - **The timed sweep**: every unowned snapshot that nothing references and
//!   nothing has used for the grace period goes, whatever its source, so
//!   garbage is bounded by the grace period plus one pass.

use std::collections::{BTreeMap, HashMap, HashSet};

use config_snapshot_policy::keys;
use config_snapshot_policy::kind::{SourceId, SourceKind};
use config_snapshot_policy::kinds;
use config_snapshot_policy::optin::OptIn;
use config_snapshot_policy::references;
use config_snapshot_policy::revision::used_snapshots;
use config_snapshot_policy::settings::Settings;
use config_snapshot_policy::sweep;
use config_snapshot_policy::template::Snapshots;
use config_snapshot_policy::workload::WorkloadKind;
use serde_json::{json, Value};

use super::effects::{precondition, Effect};

/// (kind, namespace, name).
pub type Key = (String, String, String);

pub fn key(object: &Value) -> Key {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (
        text(&object["kind"]),
        text(&object["metadata"]["namespace"]),
        text(&object["metadata"]["name"]),
    )
}

fn kind_of(object: &Value) -> &str {
    object["kind"].as_str().unwrap_or_default()
}

/// Adoptions the revisions among `objects` are missing, as effects for the
/// usual adopt path.
pub fn missing_adoptions(objects: &[&Value]) -> Vec<Effect> {
    let snapshots: HashMap<Key, &Value> = objects
        .iter()
        .filter(|o| keys::is_snapshot(o))
        .map(|o| (key(o), *o))
        .collect();
    let mut out = Vec::new();
    for revision in objects {
        let path = match kind_of(revision) {
            "ReplicaSet" => "/spec/template",
            "ControllerRevision" => "/data/spec/template",
            _ => continue,
        };
        let Some(template) = revision.pointer(path) else {
            continue;
        };
        let (_, ns, name) = key(revision);
        let uid = &revision["metadata"]["uid"];
        let missing: Vec<(String, String)> = used_snapshots(template)
            .iter()
            .filter_map(|s| {
                let (kind, snap) = (s["kind"].as_str()?, s["name"].as_str()?);
                let object = snapshots.get(&(kind.to_string(), ns.clone(), snap.to_string()))?;
                let owned = object["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|r| r["uid"] == *uid));
                (!owned).then(|| (kind.to_string(), snap.to_string()))
            })
            .collect();
        if !missing.is_empty() {
            out.push(Effect::Adopt {
                namespace: ns,
                owner_kind: kind_of(revision).to_string(),
                owner_name: name,
                snapshots: missing,
            });
        }
    }
    out
}

/// Workload ownership upkeep: the patches that make each owned snapshot a
/// workload names owned by that workload too (so the garbage collector
/// cannot take it while it is named, whatever happens to the revisions),
/// and that drop a workload's ownership once it no longer names the
/// snapshot (so its revisions alone decide how long it lives).
pub fn bridges(objects: &[&Value]) -> Vec<(Key, Vec<Value>)> {
    let workloads: Vec<&Value> = objects
        .iter()
        .filter(|o| WorkloadKind::from_kind(kind_of(o)).is_some())
        .copied()
        .collect();
    // A workload's uid → the snapshots its template names.
    let mut named: HashMap<&str, HashSet<Key>> = HashMap::new();
    for w in &workloads {
        let (Some(uid), Some(template)) = (w["metadata"]["uid"].as_str(), w.pointer("/spec/template")) else {
            continue;
        };
        let ns = w["metadata"]["namespace"].as_str().unwrap_or_default();
        let snapshots = Snapshots::of(template);
        let names = named.entry(uid).or_default();
        for r in references::collect(template) {
            if snapshots.contains(r.kind, &r.name) {
                names.insert((r.kind.kind().to_string(), ns.to_string(), r.name));
            }
        }
    }
    let mut out = Vec::new();
    for snapshot in objects.iter().filter(|o| keys::is_snapshot(o)) {
        let k = key(snapshot);
        let current: Vec<Value> = snapshot["metadata"]["ownerReferences"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let names = |workload: &str| named.get(workload).is_some_and(|n| n.contains(&k));
        let mut wanted: Vec<Value> = current
            .iter()
            .filter(|r| {
                let Some(uid) = r["uid"].as_str() else { return true };
                // Owners that are gone are the garbage collector's business.
                if WorkloadKind::from_kind(r["kind"].as_str().unwrap_or_default()).is_none() || !named.contains_key(uid)
                {
                    return true;
                }
                names(uid)
            })
            .cloned()
            .collect();
        if !wanted.is_empty() {
            for w in &workloads {
                let Some(uid) = w["metadata"]["uid"].as_str() else {
                    continue;
                };
                if names(uid) && !wanted.iter().any(|r| r["uid"] == uid) {
                    wanted.push(json!({
                        "apiVersion": "apps/v1", "kind": w["kind"],
                        "name": w["metadata"]["name"], "uid": uid,
                    }));
                }
            }
        }
        if wanted != current {
            out.push((
                k,
                vec![
                    precondition(snapshot),
                    json!({"op": "add", "path": "/metadata/ownerReferences", "value": wanted}),
                ],
            ));
        }
    }
    out
}

/// The workload controlling `revision`: kind, name and uid from its
/// controller ownerReference.
pub fn controller_of(revision: &Value) -> Option<(String, String, String)> {
    let r = revision["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"] == true)?;
    let text = |v: &Value| v.as_str().map(str::to_string);
    Some((text(&r["kind"])?, text(&r["name"])?, text(&r["uid"])?))
}

/// The workloads to re-admit for renew-duration.
pub fn renewals<'a>(objects: &[&'a Value]) -> Vec<&'a Value> {
    objects
        .iter()
        .filter(|o| WorkloadKind::from_kind(kind_of(o)).is_some())
        .filter(|o| o["metadata"]["annotations"].get(keys::RENEW_DURATION).is_some())
        .copied()
        .collect()
}

/// The sources to re-admit: those some workload in their namespace
/// watches, by the policy's own opt-in rules.
pub fn watched_sources<'a>(objects: &[&'a Value], settings: &Settings) -> Vec<&'a Value> {
    let workloads: Vec<&Value> = objects
        .iter()
        .filter(|o| WorkloadKind::from_kind(kind_of(o)).is_some())
        .copied()
        .collect();
    let watchers = Watchers::new(&workloads, settings);
    objects
        .iter()
        .filter(|o| SourceKind::from_kind(kind_of(o)).is_some() && watchers.watch(o))
        .copied()
        .collect()
}

/// A snapshot the timed sweep deletes, with the preconditions that make
/// the delete fail if it was reused since it was judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Doomed {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
}

/// The snapshots among `objects` that nothing owns, nothing references,
/// no pending effect targets (`pending`), and nothing has used for the
/// grace period.
pub fn orphans(objects: &[&Value], pending: &HashSet<Key>, now: i64, grace: u64) -> Vec<Doomed> {
    let mut referenced: HashSet<Key> = HashSet::new();
    for holder in objects {
        let Some(path) = kinds::find(kind_of(holder)).and_then(|k| k.template) else {
            continue;
        };
        let ns = holder["metadata"]["namespace"].as_str().unwrap_or_default();
        for kind in [SourceKind::ConfigMap, SourceKind::Secret] {
            let mut names = std::collections::BTreeSet::new();
            sweep::add_references(&mut names, holder, path, kind);
            referenced.extend(names.into_iter().map(|n| (kind.kind().to_string(), ns.to_string(), n)));
        }
    }
    objects
        .iter()
        .filter(|o| sweep::is_orphan(o, now, grace))
        .filter(|o| {
            let k = key(o);
            !referenced.contains(&k) && !pending.contains(&k)
        })
        .map(|o| {
            let (kind, namespace, name) = key(o);
            let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
            Doomed {
                kind,
                namespace,
                name,
                uid: text(&o["metadata"]["uid"]),
                resource_version: text(&o["metadata"]["resourceVersion"]),
            }
        })
        .collect()
}

/// The watch opt-ins of every workload, by namespace. The resync re-admits
/// only sources one of them watches, with the policy's own predicate, so it
/// skips nothing the policy would roll out and does not re-evaluate every
/// ConfigMap of a namespace because one Deployment there watches one.
pub struct Watchers<'s> {
    settings: &'s Settings,
    by_namespace: BTreeMap<String, Vec<OptIn>>,
}

impl<'s> Watchers<'s> {
    pub fn new(workloads: &[&Value], settings: &'s Settings) -> Self {
        let mut by_namespace: BTreeMap<String, Vec<OptIn>> = BTreeMap::new();
        for workload in workloads {
            let annotations = workload["metadata"]["annotations"].as_object();
            // A workload whose annotations do not parse is refused at its
            // own admission; a watch rollout could not patch it either.
            let Ok(opt_in) = OptIn::from_annotations(annotations, settings) else {
                continue;
            };
            if opt_in.watch.is_empty() {
                continue;
            }
            let ns = workload["metadata"]["namespace"].as_str().unwrap_or_default();
            by_namespace.entry(ns.to_string()).or_default().push(opt_in);
        }
        Watchers { settings, by_namespace }
    }

    pub fn watch(&self, source: &Value) -> bool {
        if keys::is_snapshot(source) {
            return false;
        }
        let metadata = &source["metadata"];
        let (Some(kind), Some(name), Some(ns)) = (
            source["kind"].as_str().and_then(SourceKind::from_kind),
            metadata["name"].as_str(),
            metadata["namespace"].as_str(),
        ) else {
            return false;
        };
        let id = SourceId::new(kind, name);
        self.by_namespace
            .get(ns)
            .is_some_and(|opt_ins| opt_ins.iter().any(|o| o.watches(&id, self.settings)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use config_snapshot_policy::content::{snapshot_object, Content};
    use config_snapshot_policy::duration::format_rfc3339;
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
            Settings::from_json(br#"{"watchByDefault": true, "excludedSources": ["configmap/kube-root-ca.crt"]}"#)
                .unwrap();
        let workloads = [workload("shop", json!({}))];
        let refs: Vec<&Value> = workloads.iter().collect();
        let watchers = Watchers::new(&refs, &settings);
        assert!(watchers.watch(&source("ConfigMap", "shop", "app-config")));
        assert!(!watchers.watch(&source("ConfigMap", "shop", "kube-root-ca.crt")));
        assert!(!watchers.watch(&source("Secret", "empty-ns", "tls")));
    }

    const NOW: i64 = 1_800_000_000;

    fn snap(value: &str, age: i64) -> Value {
        let c = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"v": value}})).unwrap();
        let (_, mut o) = snapshot_object(&SourceId::new(SourceKind::ConfigMap, "app"), "ns", "", &c);
        o["metadata"]["uid"] = json!(format!("uid-{value}"));
        o["metadata"]["resourceVersion"] = json!("3");
        o["metadata"]["creationTimestamp"] = json!(format_rfc3339(NOW - age));
        o
    }

    fn name(o: &Value) -> String {
        o["metadata"]["name"].as_str().unwrap().to_string()
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
    fn a_workload_owns_an_owned_snapshot_while_it_names_it() {
        let mut snap = snap("shared", 0);
        snap["metadata"]["ownerReferences"] =
            json!([{"kind": "ControllerRevision", "name": "agent-1", "uid": "cr-uid"}]);
        let template = json!({"metadata": {"annotations": {"config-snapshot.io/snapshots": json!({"configmap/app": name(&snap)}).to_string()}},
            "spec": {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": name(&snap)}}]}]}});
        let web = json!({"kind": "Deployment", "metadata": {"name": "web", "namespace": "ns", "uid": "web-uid"}, "spec": {"template": template}});
        let apply = |snap: &mut Value, patches: Vec<(Key, Vec<Value>)>| {
            for (_, ops) in patches {
                crate::lifecycle::effects::apply_ops(snap, &ops).unwrap();
            }
        };
        let owners = |snap: &Value| -> Vec<String> {
            snap["metadata"]["ownerReferences"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["uid"].as_str().unwrap().to_string())
                .collect()
        };
        // Named by web, owned only by another workload's revision: bridged.
        let patches = bridges(&[&snap, &web]);
        assert_eq!(patches.len(), 1);
        apply(&mut snap, patches);
        assert_eq!(owners(&snap), ["cr-uid", "web-uid"]);
        assert!(bridges(&[&snap, &web]).is_empty(), "stable");
        // Web's own ReplicaSet owns it too: web stays an owner while it
        // names it, so deleting the ReplicaSet cannot take it.
        let rs = json!({"kind": "ReplicaSet", "metadata": {"name": "web-1", "namespace": "ns", "uid": "rs-uid",
            "ownerReferences": [{"kind": "Deployment", "uid": "web-uid", "controller": true}]}});
        snap["metadata"]["ownerReferences"]
            .as_array_mut()
            .unwrap()
            .push(json!({"kind": "ReplicaSet", "uid": "rs-uid"}));
        assert!(bridges(&[&snap, &web, &rs]).is_empty());
        assert_eq!(owners(&snap), ["cr-uid", "web-uid", "rs-uid"]);
        // A workload that no longer names it stops owning it.
        let mut other = web.clone();
        other["spec"]["template"] = json!({"spec": {"containers": [{"name": "c"}]}});
        snap["metadata"]["ownerReferences"] =
            json!([{"kind": "ControllerRevision", "uid": "cr-uid"}, {"kind": "Deployment", "uid": "web-uid"}]);
        let patches = bridges(&[&snap, &other]);
        apply(&mut snap, patches);
        assert_eq!(owners(&snap), ["cr-uid"]);
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
                snapshots: vec![("ConfigMap".into(), name(&b))],
            }]
        );
    }
}
