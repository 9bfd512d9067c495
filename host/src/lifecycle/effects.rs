//! Deferred effects and what each one does now.
//!
//! A watch patch was decided when its source change was admitted, but it
//! lands later: after the change is persisted, after the storm guard lets it
//! through, after a retry. By then a rollback may have come, the source may
//! have moved on, the workload may be gone. [`decide_patch`] judges it
//! against the workload and the source as they are now:
//!
//! 1. the workload must exist, still reference and watch the source;
//! 2. the source must hold the content the patch was made for; while it
//!    still has the version it had at admission, the change is not
//!    persisted yet (wait); once it has another, the patch is superseded;
//! 3. a rollback admitted after the patch was decided voids it (the
//!    workload's rollback record counts more rollbacks than the patch saw):
//!    a rollback always wins;
//! 4. at most one watch rollout per workload per interval, counted from the
//!    rollout recorded on the workload itself (so replicas and restarts
//!    share the guard);
//! 5. the patch is recomputed on the workload as it is, pinned to its
//!    resourceVersion, and records the rollout and the generation it makes.

use config_snapshot_policy::content::Content;
use config_snapshot_policy::keys;
use config_snapshot_policy::kind::{SourceId, SourceKind};
use config_snapshot_policy::optin::OptIn;
use config_snapshot_policy::records::{generation, Rollback, WatchRollout};
use config_snapshot_policy::settings::Settings;
use config_snapshot_policy::watch;
use config_snapshot_policy::workload::escape;
use serde_json::{json, Value};

/// A deferred write: run after the admission, once its preconditions hold.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    Adopt {
        namespace: String,
        owner_kind: String,
        owner_name: String,
        snapshots: Vec<(String, String)>,
    },
    Patch {
        namespace: String,
        request: Value,
    },
}

impl Effect {
    /// The snapshot a watch patch will make its workload reference: it must
    /// not be swept while the patch waits.
    pub fn target(&self) -> Option<(String, String, String)> {
        match self {
            Effect::Patch { namespace, request } => Some((
                request["source"]["kind"].as_str()?.to_string(),
                namespace.clone(),
                request["snapshot"].as_str()?.to_string(),
            )),
            Effect::Adopt { .. } => None,
        }
    }

    pub fn label(&self) -> &'static str {
        match self {
            Effect::Adopt { .. } => "adopt",
            Effect::Patch { .. } => "patch_workload",
        }
    }

    pub fn namespace(&self) -> &str {
        match self {
            Effect::Adopt { namespace, .. } | Effect::Patch { namespace, .. } => namespace,
        }
    }

    /// Whether running `self` after `other` could change nothing `other`
    /// will not: the same adoption, or a patch of the same workload to the
    /// same snapshot. Two such patches differ at most in the source
    /// version they wait to see persisted, and a resync derives one only
    /// from a source already persisted with that content, so the one
    /// already on its way sees it too.
    pub fn same_work(&self, other: &Effect) -> bool {
        match (self, other) {
            (
                Effect::Patch { namespace, request },
                Effect::Patch {
                    namespace: ns,
                    request: r,
                },
            ) => namespace == ns && ["kind", "name", "snapshot"].iter().all(|f| request[f] == r[f]),
            _ => self == other,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Effect::Adopt {
                owner_kind, owner_name, ..
            } => format!("adoption by {owner_kind}/{owner_name}"),
            Effect::Patch { request, .. } => format!(
                "patch of {}/{}",
                request["kind"].as_str().unwrap_or(""),
                request["name"].as_str().unwrap_or("")
            ),
        }
    }
}

/// A `patch_workload` request, as the policy decided it.
#[derive(Debug, Clone, PartialEq)]
pub struct PatchIntent {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub source: SourceId,
    /// sha256 of the source content the patch was made for.
    pub content_hash: String,
    /// The source's resourceVersion before the admitted change ("" for a
    /// source created by it).
    pub source_version: String,
    pub snapshot: String,
    /// How many rollbacks the workload had had when the patch was decided.
    pub rollbacks: u64,
}

impl PatchIntent {
    pub fn parse(namespace: &str, request: &Value) -> Result<PatchIntent, String> {
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let source_kind = request["source"]["kind"]
            .as_str()
            .and_then(SourceKind::from_kind)
            .ok_or("no source recorded")?;
        let snapshot = request["snapshot"].as_str().ok_or("no snapshot recorded")?;
        Ok(PatchIntent {
            kind: text(&request["kind"]),
            namespace: namespace.to_string(),
            name: text(&request["name"]),
            source: SourceId::new(source_kind, text(&request["source"]["name"])),
            content_hash: text(&request["source"]["contentHash"]),
            source_version: text(&request["source"]["resourceVersion"]),
            snapshot: snapshot.to_string(),
            rollbacks: request["rollbacks"].as_u64().unwrap_or(0),
        })
    }
}

/// What the rules need besides the objects.
#[derive(Debug, Clone)]
pub struct Rules {
    pub settings: Settings,
    /// Storm guard: the least time between two watch rollouts of a workload.
    pub watch_min_interval: i64,
}

/// The objects a patch is judged against, as they are now.
pub struct Observed<'a> {
    pub workload: Option<&'a Value>,
    pub source: Option<&'a Value>,
    pub snapshot_exists: bool,
}

/// What a deferred effect does now.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Send this JSON Patch; its first op pins the resourceVersion.
    Apply(Vec<Value>),
    /// Nothing left to do: already there.
    Done(String),
    /// A precondition does not hold yet: look again later.
    Wait(String),
    /// Held back by the storm guard until this time (unix seconds).
    Later(i64),
    /// Void. `collect`: the snapshot was made for this patch alone; delete
    /// it if nothing else references it. `notable`: the user would not
    /// expect it (a rollback came first, the snapshot went), so serve tells
    /// them with an Event; a change superseded by the next one, or a
    /// workload that stopped watching, is the ordinary course of things and
    /// would only flood `kubectl describe` during a storm.
    Drop {
        reason: String,
        collect: bool,
        notable: bool,
    },
}

fn void(reason: String) -> Verdict {
    Verdict::Drop {
        reason,
        collect: true,
        notable: false,
    }
}

/// Judges a watch patch against the objects as they are now.
pub fn decide_patch(intent: &PatchIntent, seen: &Observed, now: i64, rules: &Rules) -> Verdict {
    let who = format!("{}/{}", intent.kind, intent.name);
    let id = &intent.source;
    let Some(workload) = seen.workload else {
        return void(format!("patch of {who} dropped: it no longer exists"));
    };
    let landed = seen
        .source
        .and_then(|s| Content::from_object(id.kind, s).ok())
        .is_some_and(|c| c.hash() == intent.content_hash);
    if !landed {
        let version = seen
            .source
            .and_then(|s| s.pointer("/metadata/resourceVersion"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        return if version == intent.source_version {
            Verdict::Wait(format!(
                "patch of {who} to {}: the change of {id} is not persisted yet",
                intent.snapshot
            ))
        } else {
            void(format!(
                "patch of {who} to {} superseded: {id} changed again",
                intent.snapshot
            ))
        };
    }
    let annotations = workload.pointer("/metadata/annotations").and_then(Value::as_object);
    let watches = OptIn::from_annotations(annotations, &rules.settings).is_ok_and(|o| o.watches(id, &rules.settings));
    if !watches {
        return void(format!("patch of {who} dropped: it no longer watches {id}"));
    }
    if let Some(rollback) = Rollback::of(workload).filter(|r| r.count > intent.rollbacks) {
        return Verdict::Drop {
            reason: format!(
                "patch of {who} to {} dropped: a rollback came first (rollback {} after the patch saw {})",
                intent.snapshot, rollback.count, intent.rollbacks
            ),
            collect: true,
            notable: true,
        };
    }
    let template = &workload["spec"]["template"];
    let Some(ops) = watch::retarget_ops(template, id, &intent.snapshot) else {
        return void(format!("patch of {who} dropped: it no longer uses {id}"));
    };
    let mut patched = workload.clone();
    if let Err(e) = apply_ops(&mut patched, &ops) {
        return void(format!("patch of {who} dropped: {e}"));
    }
    if patched == *workload {
        return Verdict::Done(format!("{who} already uses {}", intent.snapshot));
    }
    if !seen.snapshot_exists {
        return Verdict::Drop {
            reason: format!("patch of {who} dropped: snapshot {} is gone", intent.snapshot),
            collect: false,
            notable: true,
        };
    }
    if let Some(last) = WatchRollout::of(workload) {
        let free = last.at + rules.watch_min_interval;
        if now < free {
            return Verdict::Later(free);
        }
    }
    let record = WatchRollout {
        generation: generation(workload) + 1,
        at: now,
        source: id.clone(),
        snapshot: intent.snapshot.clone(),
    };
    let mut out = vec![precondition(workload)];
    out.extend(ops);
    out.push(annotate(workload, keys::WATCH_ROLLOUT, &record.to_annotation()));
    Verdict::Apply(out)
}

/// Applies JSON Patch `ops` to a local copy of an object.
pub fn apply_ops(target: &mut Value, ops: &[Value]) -> Result<(), String> {
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops.to_vec())).map_err(|e| e.to_string())?;
    json_patch::patch(target, &patch).map_err(|e| e.to_string())
}

/// The JSON Patch op that makes the write conditional on `object`'s version.
pub fn precondition(object: &Value) -> Value {
    json!({"op": "replace", "path": "/metadata/resourceVersion", "value": object["metadata"]["resourceVersion"]})
}

/// The op that sets one metadata annotation, creating the map if needed.
fn annotate(object: &Value, key: &str, value: &str) -> Value {
    if object.pointer("/metadata/annotations").is_some_and(Value::is_object) {
        json!({"op": "add", "path": format!("/metadata/annotations/{}", escape(key)), "value": value})
    } else {
        json!({"op": "add", "path": "/metadata/annotations", "value": {key: value}})
    }
}

/// The JSON Patch that makes `owner` an owner of `snapshot`, or `None` if
/// it already is one or `snapshot` is not ours. Pinned to the snapshot's
/// resourceVersion. A revision that adopts a snapshot makes its workload
/// (its controller) an owner too, in the same write: a user who deletes the
/// revision (`kubectl delete rs` to force new pods) leaves the workload
/// naming the snapshot, and its controller re-creates the revision; with
/// the revision as the only owner, the garbage collector would take the
/// snapshot first. The periodic pass drops the workload's ownership once
/// its template no longer names the snapshot.
pub fn adopt_ops(owner: &Value, snapshot: &Value) -> Option<Vec<Value>> {
    if !keys::is_snapshot(snapshot) {
        return None;
    }
    let reference = json!({
        "apiVersion": owner["apiVersion"], "kind": owner["kind"],
        "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
    });
    let controller = owner["metadata"]["ownerReferences"]
        .as_array()
        .and_then(|refs| refs.iter().find(|r| r["controller"] == true))
        .map(|r| json!({"apiVersion": r["apiVersion"], "kind": r["kind"], "name": r["name"], "uid": r["uid"]}));
    let current: Vec<Value> = snapshot["metadata"]["ownerReferences"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut wanted = current.clone();
    for r in controller.into_iter().chain([reference]) {
        if !wanted.iter().any(|w| w["uid"] == r["uid"]) {
            wanted.push(r);
        }
    }
    if wanted == current {
        return None;
    }
    Some(vec![
        precondition(snapshot),
        json!({"op": "add", "path": "/metadata/ownerReferences", "value": wanted}),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use config_snapshot_policy::content::snapshot_object;

    const NOW: i64 = 1_800_000_000;

    fn rules(interval: i64) -> Rules {
        Rules {
            settings: Settings::default(),
            watch_min_interval: interval,
        }
    }

    fn source(data: Value, rv: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app", "namespace": "ns", "resourceVersion": rv}, "data": data})
    }

    fn snapshot_name(data: Value) -> String {
        let c = Content::from_object(SourceKind::ConfigMap, &json!({ "data": data })).unwrap();
        snapshot_object(&SourceId::new(SourceKind::ConfigMap, "app"), "ns", "", &c).0
    }

    fn workload(on: &str, generation: i64, annotations: Value) -> Value {
        let mut ann = json!({"config-snapshot.io/watch": "app"});
        ann.as_object_mut()
            .unwrap()
            .extend(annotations.as_object().unwrap().clone());
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "ns", "resourceVersion": "41", "generation": generation, "annotations": ann},
            "spec": {"template": {"metadata": {"annotations": {"config-snapshot.io/snapshots": json!({"configmap/app": on}).to_string()}},
                "spec": {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": on}}]}]}}}})
    }

    fn intent(data: Value, rollbacks: u64) -> PatchIntent {
        let c = Content::from_object(SourceKind::ConfigMap, &json!({ "data": data.clone() })).unwrap();
        PatchIntent {
            kind: "Deployment".into(),
            namespace: "ns".into(),
            name: "web".into(),
            source: SourceId::new(SourceKind::ConfigMap, "app"),
            content_hash: c.hash(),
            source_version: "7".into(),
            snapshot: snapshot_name(data),
            rollbacks,
        }
    }

    #[test]
    fn a_patch_to_the_same_snapshot_is_the_same_work_whatever_source_version_it_waits_for() {
        let patch = |name: &str, snapshot: &str, source_version: &str| Effect::Patch {
            namespace: "ns".into(),
            request: json!({"kind": "Deployment", "name": name, "snapshot": snapshot,
                            "source": {"kind": "ConfigMap", "name": "app", "resourceVersion": source_version}}),
        };
        let admitted = patch("web", "app-green", "7");
        assert!(patch("web", "app-green", "8").same_work(&admitted));
        assert!(!patch("web", "app-blue", "7").same_work(&admitted));
        assert!(!patch("api", "app-green", "7").same_work(&admitted));
        let adopt = |owner: &str| Effect::Adopt {
            namespace: "ns".into(),
            owner_kind: "ReplicaSet".into(),
            owner_name: owner.into(),
            snapshots: vec![("ConfigMap".into(), "app-green".into())],
        };
        assert!(adopt("web-1").same_work(&adopt("web-1")));
        assert!(!adopt("web-2").same_work(&adopt("web-1")));
        assert!(!adopt("web-1").same_work(&admitted));
    }

    fn judge(intent: &PatchIntent, workload: Option<&Value>, source: Option<&Value>, interval: i64) -> Verdict {
        decide_patch(
            intent,
            &Observed {
                workload,
                source,
                snapshot_exists: true,
            },
            NOW,
            &rules(interval),
        )
    }

    #[test]
    fn applies_once_the_change_is_persisted_and_records_the_rollout() {
        let old = snapshot_name(json!({"v": "1"}));
        let w = workload(&old, 3, json!({}));
        let i = intent(json!({"v": "2"}), 3);
        // Still the version the admission saw: not persisted yet.
        assert!(matches!(
            judge(&i, Some(&w), Some(&source(json!({"v": "1"}), "7")), 30),
            Verdict::Wait(_)
        ));
        let Verdict::Apply(ops) = judge(&i, Some(&w), Some(&source(json!({"v": "2"}), "8")), 30) else {
            panic!("expected Apply")
        };
        assert_eq!(
            ops[0],
            json!({"op": "replace", "path": "/metadata/resourceVersion", "value": "41"})
        );
        let record = ops.last().unwrap();
        assert_eq!(
            record["path"],
            "/metadata/annotations/config-snapshot.io~1watch-rollout"
        );
        let mut patched = w.clone();
        apply_ops(&mut patched, &ops).unwrap();
        assert!(
            WatchRollout::made(&patched, &w),
            "records the generation the patch makes"
        );
        assert_eq!(
            patched["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"],
            i.snapshot.as_str()
        );
    }

    #[test]
    fn a_rollback_after_the_decision_voids_the_patch() {
        let old = snapshot_name(json!({"v": "1"}));
        let i = intent(json!({"v": "2"}), 3);
        let landed = source(json!({"v": "2"}), "8");
        // The generation does not order them: an undo to a template equal
        // to the running one bumps none.
        let rolled = |count: u64| {
            workload(
                &old,
                7,
                json!({"config-snapshot.io/rollback": format!(r#"{{"generation":7,"count":{count},"at":"2026-01-01T00:00:00Z"}}"#)}),
            )
        };
        let verdict = judge(&i, Some(&rolled(4)), Some(&landed), 0);
        assert!(
            matches!(&verdict, Verdict::Drop { reason, collect: true, notable: true } if reason.contains("rollback came first")),
            "{verdict:?}"
        );
        // A rollback the decision already saw does not.
        assert!(matches!(
            judge(&i, Some(&rolled(3)), Some(&landed), 0),
            Verdict::Apply(_)
        ));
    }

    #[test]
    fn superseded_gone_unwatched_and_done_patches() {
        let old = snapshot_name(json!({"v": "1"}));
        let w = workload(&old, 3, json!({}));
        let i = intent(json!({"v": "2"}), 3);
        let moved_on = source(json!({"v": "3"}), "9");
        assert!(matches!(
            judge(&i, Some(&w), Some(&moved_on), 0),
            Verdict::Drop {
                collect: true,
                notable: false,
                ..
            }
        ));
        assert!(matches!(
            judge(&i, None, Some(&moved_on), 0),
            Verdict::Drop { collect: true, .. }
        ));
        let landed = source(json!({"v": "2"}), "8");
        let mut unwatched = w.clone();
        unwatched["metadata"]["annotations"] = json!({});
        assert!(matches!(
            judge(&i, Some(&unwatched), Some(&landed), 0),
            Verdict::Drop { notable: false, .. }
        ));
        let there = workload(&i.snapshot, 4, json!({}));
        assert!(matches!(judge(&i, Some(&there), Some(&landed), 0), Verdict::Done(_)));
        let gone = decide_patch(
            &i,
            &Observed {
                workload: Some(&w),
                source: Some(&landed),
                snapshot_exists: false,
            },
            NOW,
            &rules(0),
        );
        assert!(
            matches!(
                gone,
                Verdict::Drop {
                    collect: false,
                    notable: true,
                    ..
                }
            ),
            "{gone:?}"
        );
    }

    #[test]
    fn the_storm_guard_counts_from_the_rollout_recorded_on_the_workload() {
        let old = snapshot_name(json!({"v": "1"}));
        let last = WatchRollout {
            generation: 3,
            at: NOW - 10,
            source: SourceId::new(SourceKind::ConfigMap, "app"),
            snapshot: old.clone(),
        };
        let w = workload(
            &old,
            3,
            json!({"config-snapshot.io/watch-rollout": last.to_annotation()}),
        );
        let i = intent(json!({"v": "2"}), 3);
        let landed = source(json!({"v": "2"}), "8");
        assert_eq!(judge(&i, Some(&w), Some(&landed), 30), Verdict::Later(NOW + 20));
        assert!(matches!(judge(&i, Some(&w), Some(&landed), 10), Verdict::Apply(_)));
    }

    #[test]
    fn adoption_adds_the_owner_once_and_only_to_snapshots() {
        let owner = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "web-1", "uid": "u1"}});
        let c = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"a": "1"}})).unwrap();
        let (_, mut snap) = snapshot_object(&SourceId::new(SourceKind::ConfigMap, "app"), "ns", "", &c);
        snap["metadata"]["resourceVersion"] = json!("5");
        let ops = adopt_ops(&owner, &snap).unwrap();
        apply_ops(&mut snap, &ops).unwrap();
        assert_eq!(snap["metadata"]["ownerReferences"][0]["uid"], "u1");
        assert!(adopt_ops(&owner, &snap).is_none());
        let plain = json!({"metadata": {"name": "x"}});
        assert!(adopt_ops(&owner, &plain).is_none());
    }

    #[test]
    fn a_revision_adopts_for_its_workload_too() {
        let c = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"a": "1"}})).unwrap();
        let (_, mut snap) = snapshot_object(&SourceId::new(SourceKind::ConfigMap, "app"), "ns", "", &c);
        snap["metadata"]["resourceVersion"] = json!("5");
        snap["metadata"]["ownerReferences"] = json!([
            {"apiVersion": "apps/v1", "kind": "ControllerRevision", "name": "agent-1", "uid": "other"},
            {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "web-uid"},
        ]);
        let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "web-1", "uid": "rs-uid",
                         "ownerReferences": [{"kind": "Deployment", "name": "web", "uid": "web-uid", "controller": true}]}});
        let ops = adopt_ops(&rs, &snap).unwrap();
        apply_ops(&mut snap, &ops).unwrap();
        let uids: Vec<&str> = snap["metadata"]["ownerReferences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["uid"].as_str().unwrap())
            .collect();
        assert_eq!(uids, ["other", "web-uid", "rs-uid"], "the workload stays an owner");
        // A snapshot adopted afresh gets the workload as well.
        snap["metadata"]["ownerReferences"] = json!([]);
        let ops = adopt_ops(&rs, &snap).unwrap();
        apply_ops(&mut snap, &ops).unwrap();
        let kinds: Vec<&str> = snap["metadata"]["ownerReferences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["Deployment", "ReplicaSet"]);
    }
}
