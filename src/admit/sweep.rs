//! The orphan sweep (docs/design.md, "Garbage collection"): a safety net
//! for snapshots that never got an owner, e.g. created for a request that
//! was then refused, or for a watch content that was superseded.
//!
//! The decisions are plain functions over listed objects, so the host's
//! timed sweep (serve's resync, replay's `advanceTime`) makes exactly the
//! same choices as the sweep the policy runs when it makes a snapshot.

use crate::model::object::ObjectExt;
use std::collections::BTreeSet;

use serde_json::Value;

use crate::admit::context::Context;
use crate::model::content::snapshots_of;
use crate::model::duration::parse_rfc3339;
use crate::model::keys;
use crate::model::kinds::Kind;
use crate::model::references;
use crate::model::source::{SourceId, SourceKind};

/// The field masks that fetch a holder's reference fields and nothing else.
pub fn holder_masks(holder: &Kind) -> Vec<String> {
    let path = holder.template.unwrap_or_default();
    let prefix = if path.is_empty() {
        String::new()
    } else {
        format!("{}.", path.trim_start_matches('/').replace('/', "."))
    };
    references::masks(&prefix)
}

/// The fields of a snapshot the sweep decides on.
pub(crate) const SNAPSHOT_MASKS: [&str; 7] = [
    "metadata.name",
    "metadata.uid",
    "metadata.resourceVersion",
    "metadata.labels",
    "metadata.annotations",
    "metadata.ownerReferences",
    "metadata.creationTimestamp",
];

/// Adds the names of `kind` that `holder`, an object of the holder kind
/// `row`, references. The row is given, not read from the object: items of
/// a list carry no `kind` of their own.
pub fn add_references(names: &mut BTreeSet<String>, row: &Kind, holder: &Value, kind: SourceKind) {
    if let Some(t) = row.template_of(holder) {
        names.extend(
            references::collect(t)
                .into_iter()
                .filter(|r| r.kind == kind)
                .map(|r| r.name),
        );
    }
}

/// When a snapshot was last made or reused (unix seconds), as of `now`:
/// its age for the grace period counts from here. A `last-used-at` later
/// than `now` (past the clock skew replicas may have) is not one the host
/// wrote: anyone who may annotate ConfigMaps in the namespace could set
/// one far in the future to keep a snapshot for ever, so it is ignored.
pub(crate) fn last_used(snapshot: &Value, now: i64) -> Option<i64> {
    let created = snapshot.creation_timestamp().and_then(parse_rfc3339);
    let used = snapshot
        .annotation(keys::LAST_USED_AT)
        .and_then(parse_rfc3339)
        .filter(|t| *t <= now.saturating_add(CLOCK_SKEW_SECS));
    created.max(used)
}

/// How far ahead of a replica's clock another's may be.
const CLOCK_SKEW_SECS: i64 = 300;

/// Whether an object has an owner other than its namespace's anchor: a
/// snapshot with one is the garbage collector's to delete, never the
/// sweep's.
pub fn owned(object: &Value) -> bool {
    object.owner_references().iter().any(|r| !is_anchor(object, r))
}

/// Whether a snapshot is anchored: owned by its own Namespace
/// (docs/design.md, "Garbage collection", Anchors). The garbage collector
/// never takes it while the namespace lives, whatever happens to its
/// other owners; the sweep takes it once nothing else owns it, nothing
/// names it and nothing used it for the grace period, as if it had no
/// owner at all.
pub fn anchored(object: &Value) -> bool {
    object.owner_references().iter().any(|r| is_anchor(object, r))
}

/// Whether only the garbage collector can take the snapshot: it has an
/// owner, and no anchor. The sweep never judges it, so a reuse may be
/// decided on a cached copy of it; any other is read as fresh as the
/// request (docs/design.md, "Garbage collection", Reuse).
pub fn only_owners_collect(object: &Value) -> bool {
    owned(object) && !anchored(object)
}

/// Whether a reuse may be decided on a cached copy of the snapshot, with
/// no fresh read: only the garbage collector can take it
/// ([`only_owners_collect`]), or it is anchored and the copy shows it used
/// recently enough that it needs no mark ([`must_mark_reuse`]). No host
/// takes an anchor off and a mark only moves forward, so a copy that lags
/// can only show the snapshot used earlier than it was: if even that
/// leaves the sweep a margin away, no sweep may have deleted it since, nor
/// may before the reuse is stored. An unanchored, unowned copy is not
/// enough: a revision may have adopted it since, and its reuse would then
/// have to anchor it (docs/design.md, "Garbage collection", Anchors).
pub fn reusable_as_cached(object: &Value, now: i64, grace: u64) -> bool {
    only_owners_collect(object) || (anchored(object) && !must_mark_reuse(object, now, grace))
}

fn is_anchor(object: &Value, reference: &Value) -> bool {
    reference["apiVersion"] == "v1"
        && reference["kind"] == "Namespace"
        && object.namespace().is_some_and(|ns| reference["name"] == ns)
}

/// The ownerReference that anchors a snapshot in `namespace`, whose uid
/// is `uid`. Not `blockOwnerDeletion`: nothing should hold a namespace's
/// deletion up, and setting it needs rights on the Namespace.
pub fn anchor_reference(namespace: &str, uid: &str) -> Value {
    serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "name": namespace, "uid": uid})
}

/// Whether a snapshot may be swept, as far as it alone can tell: ours, with
/// no owner, and unused for at least `grace` seconds. The caller must also
/// know that nothing references it.
pub fn is_orphan(snapshot: &Value, now: i64, grace: u64) -> bool {
    keys::is_snapshot(snapshot) && !owned(snapshot) && last_used(snapshot, now).is_some_and(|t| now - t >= grace as i64)
}

/// How much of the grace period a reused snapshot must have left for its
/// reuse to skip marking it used: longer than an admitted request can take
/// to be stored (the API server's request timeout, 60 s by default), plus
/// clock skew between replicas and the lag of the caches a sweep lists
/// references from.
pub const REUSE_MARGIN_SECS: u64 = 300;

/// Whether an admission that reuses this unowned snapshot must mark it used
/// (docs/design.md, "Garbage collection", Reuse). It need not when, in a
/// read as fresh as the request, the snapshot has more than
/// [`REUSE_MARGIN_SECS`] of its grace left: no sweep may judge it unused
/// before that margin has passed, and by then the request that reuses it
/// is stored, so the sweep sees the reference. Skipping saves one write per
/// source on the re-applies that make up most opted-in admissions.
pub fn must_mark_reuse(snapshot: &Value, now: i64, grace: u64) -> bool {
    let Some(left) = grace.checked_sub(REUSE_MARGIN_SECS) else {
        return true;
    };
    last_used(snapshot, now).is_none_or(|t| now - t >= left as i64)
}

/// Deletes the unowned, unreferenced snapshots of `source` unused for the
/// grace period, except `keep`. Best effort: a failure leaves the orphan
/// for the next sweep, never fails the admission.
pub fn sweep(ctx: &Context, source: &SourceId, keep: &str) {
    let selector = snapshots_of(&source.name);
    let Ok(snapshots) = ctx
        .host
        .list("v1", source.kind.kind(), ctx.namespace, Some(selector), &SNAPSHOT_MASKS)
    else {
        return;
    };
    let mut now: Option<i64> = None;
    let candidates: Vec<&Value> = snapshots
        .iter()
        .filter(|s| {
            s.meta_str("name") != Some(keep)
                && keys::snapshot_source(s) == Some(source.name.as_str())
                && is_orphan(
                    s,
                    *now.get_or_insert_with(|| ctx.host.now()),
                    ctx.settings.orphan_grace_period_secs,
                )
        })
        .collect();
    if candidates.is_empty() {
        return;
    }
    let Some(referenced) = referenced_names(ctx, source.kind) else {
        return;
    };
    for snap in candidates {
        let (Some(name), Some(uid)) = (snap.meta_str("name"), snap.uid()) else {
            continue;
        };
        if !referenced.contains(name) {
            let rv = snap.meta_str("resourceVersion");
            let _ = ctx.host.delete_snapshot(source.kind, name, uid, rv);
        }
    }
}

/// Every name of `kind` that a workload, revision or Pod in the namespace
/// references. `None` if any list failed: then nothing may be deleted.
fn referenced_names(ctx: &Context, kind: SourceKind) -> Option<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    for holder in crate::model::kinds::holders() {
        let masks = holder_masks(holder);
        let masks: Vec<&str> = masks.iter().map(String::as_str).collect();
        let items = ctx
            .host
            .list(holder.api_version, holder.kind, ctx.namespace, None, &masks)
            .ok()?;
        for item in &items {
            add_references(&mut names, holder, item, kind);
        }
    }
    Some(names)
}

#[cfg(test)]
mod tests {
    use crate::model::object::ObjectExt;
    use serde_json::{json, Value};

    use super::{must_mark_reuse, REUSE_MARGIN_SECS};
    use crate::admit::context::Context;
    use crate::host::fake::FakeHost;
    use crate::host::HostApi;
    use crate::model::content::{plain_snapshot, Content};
    use crate::model::duration::format_rfc3339;
    use crate::model::settings::Settings;
    use crate::model::source::{SourceId, SourceKind};

    const NOW: i64 = 1_800_000_000;

    fn snap(value: &str, age_secs: i64, owned: bool) -> Value {
        let content = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"v": value}})).unwrap();
        let (_, mut obj) = plain_snapshot(&SourceId::new(SourceKind::ConfigMap, "app"), "default", "1", &content);
        obj["metadata"]["uid"] = json!(format!("uid-{value}"));
        obj["metadata"]["resourceVersion"] = json!(format!("rv-{value}"));
        obj["metadata"]["creationTimestamp"] = json!(format_rfc3339(NOW - age_secs));
        if owned {
            obj["metadata"]["ownerReferences"] = json!([{"kind": "ReplicaSet", "name": "rs", "uid": "rs-uid"}]);
        }
        obj
    }

    fn name(obj: &Value) -> String {
        obj.meta_str("name").unwrap().to_string()
    }

    fn sweep(host: &FakeHost, keep: &str) {
        let settings = Settings::default();
        let ctx = Context {
            host: HostApi::new(host),
            settings: &settings,
            namespace: "default",
            dry_run: false,
        };
        super::sweep(&ctx, &SourceId::new(SourceKind::ConfigMap, "app"), keep);
    }

    /// The one rule for deciding a reuse on serve's cache: owned and not
    /// anchored, or anchored and used within the grace period less the
    /// margin; never unowned and unanchored, however recent.
    #[test]
    fn a_reuse_is_decided_on_a_cached_copy_only_when_no_sweep_may_judge_it() {
        let grace = 600;
        let left = (grace - REUSE_MARGIN_SECS) as i64;
        let anchored = |age: i64, also_owned: bool| {
            let mut s = snap("a", age, also_owned);
            let anchor = super::anchor_reference("default", "ns-uid");
            match s["metadata"]["ownerReferences"].as_array_mut() {
                Some(owners) => owners.push(anchor),
                None => s["metadata"]["ownerReferences"] = json!([anchor]),
            }
            s
        };
        let cached = |s: &Value| super::reusable_as_cached(s, NOW, grace);
        assert!(cached(&snap("owned", 3600, true)), "owned: only the collector takes it");
        assert!(
            !cached(&snap("unowned", 1, false)),
            "unowned: a revision may have adopted it since"
        );
        assert!(cached(&anchored(1, false)), "anchored, used a second ago");
        assert!(
            cached(&anchored(left - 1, true)),
            "anchored and owned, used within the margin"
        );
        assert!(!cached(&anchored(left, false)), "anchored, the sweep within the margin");
        assert!(!cached(&anchored(3600, true)), "anchored, unused for the grace period");
    }

    #[test]
    fn deletes_only_unowned_old_unreferenced_snapshots() {
        let orphan = snap("orphan", 3600, false);
        let young = snap("young", 60, false);
        let owned = snap("owned", 3600, true);
        let in_pod = snap("in-pod", 3600, false);
        let in_revision = snap("in-revision", 3600, false);
        let kept = snap("just-made", 3600, false);
        let mut unlabelled = snap("unlabelled", 3600, false);
        unlabelled["metadata"]["labels"] = json!({"config-snapshot.io/source": "app"});
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": name(&in_pod)}}]}]}});
        let cr = json!({"apiVersion": "apps/v1", "kind": "ControllerRevision", "metadata": {"name": "db-1", "namespace": "default"},
            "data": {"spec": {"template": {"spec": {"volumes": [{"name": "v", "configMap": {"name": name(&in_revision)}}]}}}}});
        let mut host = FakeHost::with(vec![
            orphan.clone(),
            young.clone(),
            owned.clone(),
            in_pod.clone(),
            in_revision.clone(),
            kept.clone(),
            unlabelled.clone(),
            pod,
            cr,
        ]);
        host.now = NOW;
        sweep(&host, &name(&kept));
        let deleted: Vec<String> = host
            .ops("delete_snapshot")
            .iter()
            .map(|d| d["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(deleted, vec![name(&orphan)]);
        assert_eq!(host.ops("delete_snapshot")[0]["uid"], "uid-orphan");
        assert_eq!(host.ops("delete_snapshot")[0]["resourceVersion"], "rv-orphan");
    }

    #[test]
    fn deletes_nothing_when_references_cannot_be_listed() {
        let orphan = snap("orphan", 3600, false);
        // The control: with every list answered, this orphan goes.
        let mut host = FakeHost::with(vec![orphan.clone()]);
        host.now = NOW;
        sweep(&host, "x");
        assert_eq!(host.ops("delete_snapshot").len(), 1);
        // The snapshots are listed, but one kind of holder is not: a Pod
        // could be using the orphan, so nothing may go.
        for holder in ["Deployment", "ReplicaSet", "Pod"] {
            let mut host = FakeHost::with(vec![orphan.clone()]);
            host.now = NOW;
            host.fail_list_of(holder, "timeout");
            sweep(&host, "x");
            assert!(
                host.ops("list_resources_by_namespace")
                    .iter()
                    .any(|l| l["kind"] == "ConfigMap"),
                "the snapshots were listed"
            );
            assert!(host.ops("delete_snapshot").is_empty(), "{holder} unlisted");
        }
    }

    #[test]
    fn a_reused_snapshot_counts_its_age_from_the_reuse() {
        let mut reused = snap("reused", 3600, false);
        reused["metadata"]["annotations"][crate::model::keys::LAST_USED_AT] = json!(format_rfc3339(NOW - 60));
        let mut host = FakeHost::with(vec![reused]);
        host.now = NOW;
        sweep(&host, "x");
        assert!(host.ops("delete_snapshot").is_empty());
    }

    /// Round 3, lower finding: a `last-used-at` set far in the future (by
    /// anyone who may annotate ConfigMaps there) does not keep an unused
    /// snapshot for ever; one within the clock skew still counts.
    #[test]
    fn a_last_use_in_the_future_is_not_believed() {
        let mut kept = snap("kept", 3600, false);
        kept["metadata"]["annotations"][crate::model::keys::LAST_USED_AT] =
            json!(format_rfc3339(NOW + 100 * 365 * 86400));
        let mut host = FakeHost::with(vec![kept]);
        host.now = NOW;
        sweep(&host, "x");
        assert_eq!(host.ops("delete_snapshot").len(), 1, "swept as made an hour ago");
        let mut skewed = snap("skewed", 3600, false);
        skewed["metadata"]["annotations"][crate::model::keys::LAST_USED_AT] = json!(format_rfc3339(NOW + 60));
        let mut host = FakeHost::with(vec![skewed]);
        host.now = NOW;
        sweep(&host, "x");
        assert!(
            host.ops("delete_snapshot").is_empty(),
            "a replica's clock a minute ahead"
        );
    }

    #[test]
    fn a_reuse_marks_the_snapshot_unless_the_sweep_is_a_margin_away() {
        let grace = 600;
        let fresh = snap("fresh", 0, false);
        assert!(!must_mark_reuse(&fresh, NOW, grace), "made just now");
        let edge = grace - REUSE_MARGIN_SECS;
        assert!(!must_mark_reuse(&snap("young", edge as i64 - 1, false), NOW, grace));
        assert!(
            must_mark_reuse(&snap("margin", edge as i64, false), NOW, grace),
            "within the margin of a sweep"
        );
        assert!(must_mark_reuse(&snap("old", 3600, false), NOW, grace));
        let mut reused = snap("reused", 3600, false);
        reused["metadata"]["annotations"][crate::model::keys::LAST_USED_AT] = json!(format_rfc3339(NOW - 10));
        assert!(!must_mark_reuse(&reused, NOW, grace), "its last reuse counts");
        // A grace period no longer than the margin leaves no room: always mark.
        assert!(must_mark_reuse(&fresh, NOW, REUSE_MARGIN_SECS));
        assert!(must_mark_reuse(&fresh, NOW, 0));
        let mut undated = fresh.clone();
        undated["metadata"].as_object_mut().unwrap().remove("creationTimestamp");
        assert!(must_mark_reuse(&undated, NOW, grace), "no date, no proof");
    }
}
