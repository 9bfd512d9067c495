//! The verdicts on deferred effects.

use super::*;
use config_snapshot_policy::model::content::plain_snapshot;
use config_snapshot_policy::model::kinds::WorkloadKind;
use config_snapshot_policy::model::source::{SourceId, SourceKind};

const NOW: i64 = 1_800_000_000;

fn rules(interval: i64) -> Rules {
    Rules {
        watch_min_interval: interval,
        ..Rules::new(Settings::default(), Arc::new(Prover::replay()))
    }
}

fn source(data: Value, rv: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app", "namespace": "ns", "resourceVersion": rv}, "data": data})
}

fn snapshot_name(data: Value) -> String {
    let c = Content::from_object(SourceKind::ConfigMap, &json!({ "data": data })).unwrap();
    plain_snapshot(&SourceId::new(SourceKind::ConfigMap, "app"), "ns", "", &c).0
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
        kind: WorkloadKind::from_kind("Deployment").unwrap(),
        namespace: "ns".into(),
        name: "web".into(),
        source: SourceId::new(SourceKind::ConfigMap, "app"),
        content_hash: c.hash(),
        source_version: "7".into(),
        snapshot: snapshot_name(data),
        keys: None,
        rollbacks,
    }
}

fn judge(intent: &PatchIntent, workload: Option<&Value>, source: Option<&Value>, interval: i64) -> Verdict {
    decide_patch(intent, &Observed { workload, source }, NOW, &rules(interval))
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
    let Verdict::Apply { resource_version, ops } = judge(&i, Some(&w), Some(&source(json!({"v": "2"}), "8")), 30)
    else {
        panic!("expected Apply")
    };
    assert_eq!(resource_version, "41", "pinned to the workload as read");
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
        Verdict::Apply { .. }
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
}

/// A patch is judged by what the source says of its readers when it runs,
/// not when it was decided: a source that says `ignore` since drops what a
/// workload watching it through `*` waits for (a held change included),
/// one that names it still rolls; `watch` makes a workload that only
/// snapshots it (through `*`) a watcher.
#[test]
fn the_source_word_as_it_is_when_the_patch_runs_decides() {
    let old = snapshot_name(json!({"v": "1"}));
    let i = intent(json!({"v": "2"}), 3);
    let said = |word: &str| {
        let mut s = source(json!({"v": "2"}), "8");
        s["metadata"]["annotations"] = json!({"config-snapshot.io/readers": word});
        s
    };
    let through = |key: &str, value: &str| {
        let mut w = workload(&old, 3, json!({}));
        w["metadata"]["annotations"] = json!({ key: value });
        w
    };
    let all = through("config-snapshot.io/watch", "*");
    assert!(
        matches!(judge(&i, Some(&all), Some(&said("ignore")), 0), Verdict::Drop { reason, .. } if reason.contains("no longer watches"))
    );
    assert!(matches!(
        judge(&i, Some(&all), Some(&said("watch")), 0),
        Verdict::Apply { .. }
    ));
    let named = through("config-snapshot.io/watch", "configmap/app");
    assert!(matches!(
        judge(&i, Some(&named), Some(&said("ignore")), 0),
        Verdict::Apply { .. }
    ));
    let pinned = through("config-snapshot.io/snapshot", "*");
    assert!(matches!(
        judge(&i, Some(&pinned), Some(&said("watch")), 0),
        Verdict::Apply { .. }
    ));
    assert!(matches!(
        judge(&i, Some(&pinned), Some(&source(json!({"v": "2"}), "8")), 0),
        Verdict::Drop { .. }
    ));
    // The word decides whether it is watched, never the workload's mode.
    let mut gated = pinned.clone();
    gated["metadata"]["annotations"]["config-snapshot.io/watch-mode"] = json!("notify");
    assert!(matches!(
        judge(&i, Some(&gated), Some(&said("watch")), 0),
        Verdict::Later(_, Hold::Notify)
    ));
}

/// A rollback that declined this very content voids the patch even when
/// it came before the patch was decided: a review of the source carrying
/// that content (a forged one, or an UPDATE raced by the rollback) must not
/// roll the rollback back out.
#[test]
fn a_patch_to_the_content_a_rollback_declined_is_dropped() {
    let old = snapshot_name(json!({"v": "1"}));
    let i = intent(json!({"v": "2"}), 1);
    let record = format!(
        r#"{{"generation":4,"count":1,"at":"2027-01-15T08:00:00Z","sources":{{"configmap/app":"{}"}}}}"#,
        i.snapshot
    );
    let w = workload(&old, 4, json!({"config-snapshot.io/rollback": record}));
    let landed = source(json!({"v": "2"}), "8");
    let verdict = judge(&i, Some(&w), Some(&landed), 0);
    assert!(matches!(verdict, Verdict::Drop { notable: true, .. }), "{verdict:?}");
    let other = intent(json!({"v": "3"}), 1);
    assert!(matches!(
        judge(&other, Some(&w), Some(&source(json!({"v": "3"}), "9")), 0),
        Verdict::Apply { .. }
    ));
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
    assert_eq!(
        judge(&i, Some(&w), Some(&landed), 30),
        Verdict::Later(NOW + 20, Hold::StormGuard)
    );
    assert!(matches!(judge(&i, Some(&w), Some(&landed), 10), Verdict::Apply { .. }));
}

#[test]
fn adoption_adds_the_owner_once_and_only_to_snapshots() {
    let owner = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "web-1", "uid": "u1"}});
    let c = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"a": "1"}})).unwrap();
    let (_, mut snap) = plain_snapshot(&SourceId::new(SourceKind::ConfigMap, "app"), "ns", "", &c);
    snap["metadata"]["resourceVersion"] = json!("5");
    let ops = adopt_ops(&owner, &snap).unwrap();
    assert!(
        ops.iter().all(|op| op["path"] != "/metadata/resourceVersion"),
        "the caller pins the version"
    );
    apply_ops(&mut snap, &ops).unwrap();
    assert_eq!(snap["metadata"]["ownerReferences"][0]["uid"], "u1");
    assert!(adopt_ops(&owner, &snap).is_none());
    let plain = json!({"metadata": {"name": "x"}});
    assert!(adopt_ops(&owner, &plain).is_none());
}

#[test]
fn a_revision_adopts_for_its_workload_too() {
    let c = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"a": "1"}})).unwrap();
    let (_, mut snap) = plain_snapshot(&SourceId::new(SourceKind::ConfigMap, "app"), "ns", "", &c);
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

/// A namespaced install acts only in its list, and never in an excluded
/// namespace even if it is listed; a cluster-wide one everywhere but the
/// excluded ones.
#[test]
fn the_host_acts_only_where_its_install_reaches() {
    let mut rules = Rules::new(Settings::default(), Arc::new(Prover::replay()));
    rules.excluded_namespaces = vec!["kube-system".into(), "config-snapshot".into()];
    assert!(!rules.excludes("team-a"));
    assert!(rules.excludes("kube-system"));
    rules.only_namespaces = Some(vec!["team-a".into(), "team-b".into(), "kube-system".into()]);
    assert!(!rules.excludes("team-a"));
    assert!(!rules.excludes("team-b"));
    assert!(rules.excludes("team-c"), "a namespace outside the list");
    assert!(rules.excludes(""), "no namespace at all");
    assert!(rules.excludes("kube-system"), "listed, but excluded");
    assert!(rules.excludes("config-snapshot"));
}

#[test]
fn notify_never_rolls_and_approve_rolls_only_the_approved_snapshot_at_once() {
    let old = snapshot_name(json!({"v": "1"}));
    let new = snapshot_name(json!({"v": "2"}));
    let i = intent(json!({"v": "2"}), 3);
    let landed = source(json!({"v": "2"}), "8");
    // A recent rollout: the storm guard holds approvals too.
    let recent = WatchRollout {
        generation: 3,
        at: NOW - 10,
        source: SourceId::new(SourceKind::ConfigMap, "app"),
        snapshot: old.clone(),
    }
    .to_annotation();
    let notify = workload(
        &old,
        3,
        json!({"config-snapshot.io/watch-mode": "notify", "config-snapshot.io/approve": format!("configmap/app={new}")}),
    );
    assert_eq!(
        judge(&i, Some(&notify), Some(&landed), 3600),
        Verdict::Later(NOW + NOTIFY_RECHECK_SECS, Hold::Notify),
        "an approval means nothing in notify mode"
    );
    let waiting = workload(&old, 3, json!({"config-snapshot.io/watch-mode": "approve"}));
    assert_eq!(
        judge(&i, Some(&waiting), Some(&landed), 0),
        Verdict::Later(NOW + APPROVAL_RECHECK_SECS, Hold::Approval { refused: None })
    );
    let stale = format!("configmap/app={old}");
    let approved_other = workload(
        &old,
        3,
        json!({"config-snapshot.io/watch-mode": "approve", "config-snapshot.io/approve": stale}),
    );
    assert_eq!(
        judge(&i, Some(&approved_other), Some(&landed), 0),
        Verdict::Later(
            NOW + APPROVAL_RECHECK_SECS,
            Hold::Approval {
                refused: Some(old.clone())
            }
        ),
        "an approval of other content is refused"
    );
    let approved = workload(
        &old,
        3,
        json!({
            "config-snapshot.io/watch-mode": "approve",
            "config-snapshot.io/watch-rollout": recent,
            "config-snapshot.io/approve": format!("configmap/app={new}, secret/db=db-1"),
            "config-snapshot.io/pending": format!("configmap/app={new}"),
        }),
    );
    assert_eq!(
        judge(&i, Some(&approved), Some(&landed), 3600),
        Verdict::Later(NOW - 10 + 3600, Hold::StormGuard),
        "the storm guard still spaces approved rollouts"
    );
    let Verdict::Apply { ops, .. } = judge(&i, Some(&approved), Some(&landed), 0) else {
        panic!("an approval of this snapshot rolls")
    };
    let mut patched = approved.clone();
    apply_ops(&mut patched, &ops).unwrap();
    let annotations = &patched["metadata"]["annotations"];
    assert!(annotations.get(keys::PENDING).is_none(), "no longer pending");
    assert_eq!(
        annotations[keys::APPROVE],
        "secret/db=db-1",
        "the approval is spent, others stay"
    );
}

#[test]
fn a_pending_record_is_written_once_and_takes_off_a_refused_approval() {
    let old = snapshot_name(json!({"v": "1"}));
    let new = snapshot_name(json!({"v": "2"}));
    let id = SourceId::new(SourceKind::ConfigMap, "app");
    let bare = json!({"metadata": {"name": "web"}});
    let ops = pending_ops(&bare, &id, &new, &Hold::Notify).unwrap();
    let mut recorded = bare.clone();
    apply_ops(&mut recorded, &ops).unwrap();
    assert_eq!(
        recorded["metadata"]["annotations"][keys::PENDING],
        format!("configmap/app={new}")
    );
    assert_eq!(
        pending_ops(&recorded, &id, &new, &Hold::Notify),
        None,
        "already recorded"
    );
    recorded["metadata"]["annotations"][keys::APPROVE] = json!(format!("configmap/app={old}"));
    let ops = pending_ops(&recorded, &id, &new, &Hold::Notify).unwrap();
    apply_ops(&mut recorded, &ops).unwrap();
    assert!(!recorded.has_annotation(keys::APPROVE));
    // Dropped: the record goes; a record of other content stays.
    assert_eq!(unpend_ops(&recorded, &id, &old), None);
    let ops = unpend_ops(&recorded, &id, &new).unwrap();
    apply_ops(&mut recorded, &ops).unwrap();
    assert!(!recorded.has_annotation(keys::PENDING));
}

#[test]
fn a_settling_change_waits_until_its_sources_are_quiet() {
    let old = snapshot_name(json!({"v": "1"}));
    let new = snapshot_name(json!({"v": "2"}));
    let i = intent(json!({"v": "2"}), 3);
    let landed = source(json!({"v": "2"}), "8");
    let unrecorded = workload(&old, 3, json!({"config-snapshot.io/settle": "10s"}));
    let until = NOW + 10;
    assert_eq!(
        judge(&i, Some(&unrecorded), Some(&landed), 0),
        Verdict::Later(until, Hold::Settle { until }),
        "a new change is recorded and settles from now"
    );
    let id = SourceId::new(SourceKind::ConfigMap, "app");
    let mut recorded = unrecorded.clone();
    apply_ops(
        &mut recorded,
        &pending_ops(&unrecorded, &id, &new, &Hold::Settle { until }).unwrap(),
    )
    .unwrap();
    assert_eq!(settle_until(&recorded), until);
    // A later change of another source moved the deadline on.
    recorded["metadata"]["annotations"][keys::SETTLE_UNTIL] = json!((NOW + 7).to_string());
    assert_eq!(
        judge(&i, Some(&recorded), Some(&landed), 0),
        Verdict::Later(NOW + 7, Hold::Settle { until: NOW + 7 })
    );
    // A deadline written by hand holds no longer than a change now would.
    recorded["metadata"]["annotations"][keys::SETTLE_UNTIL] = json!(i64::MAX.to_string());
    assert_eq!(
        judge(&i, Some(&recorded), Some(&landed), 0),
        Verdict::Later(NOW + 10, Hold::Settle { until: NOW + 10 })
    );
    recorded["metadata"]["annotations"][keys::SETTLE_UNTIL] = json!((NOW - 1).to_string());
    assert!(matches!(
        judge(&i, Some(&recorded), Some(&landed), 0),
        Verdict::Apply { .. }
    ));
}

/// A settled change that a closed window then holds is written again: the
/// settle's mark goes, so the driver tells users it now waits for the
/// window (the real control plane's window story, under the shipped
/// settle, found only "settling" told). Once so, nothing more is written.
#[test]
fn a_settled_change_held_by_a_window_is_recorded_as_held() {
    let new = snapshot_name(json!({"v": "2"}));
    let id = SourceId::new(SourceKind::ConfigMap, "app");
    let old = snapshot_name(json!({"v": "1"}));
    let unrecorded = workload(&old, 3, json!({"config-snapshot.io/settle": "10s"}));
    let settling = Hold::Settle { until: NOW - 1 };
    let mut recorded = unrecorded.clone();
    apply_ops(&mut recorded, &pending_ops(&unrecorded, &id, &new, &settling).unwrap()).unwrap();
    assert_eq!(
        pending_ops(&recorded, &id, &new, &settling),
        None,
        "settling again writes nothing"
    );
    let window = Hold::Window("closed".into());
    let ops = pending_ops(&recorded, &id, &new, &window).expect("the window's hold is written");
    apply_ops(&mut recorded, &ops).unwrap();
    assert_eq!(settle_until(&recorded), 0, "the settle's mark is gone");
    assert_eq!(
        Entries::on(recorded.annotations(), keys::PENDING).get(&id),
        Some(new.as_str()),
        "the change is still recorded"
    );
    assert_eq!(pending_ops(&recorded, &id, &new, &window), None, "and told once");
}
