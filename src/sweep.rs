//! The orphan sweep (SPEC §5.5): a safety net for snapshots that never got
//! an owner, e.g. created for a request that was then rejected.

use std::collections::HashSet;

use serde_json::Value;

use crate::content::source_label;
use crate::duration::parse_rfc3339;
use crate::keys;
use crate::kind::{SourceId, SourceKind};
use crate::references;
use crate::workload::Context;

/// Objects whose pod templates may hold a snapshot name, with where the
/// template sits and the field masks that fetch only the reference fields.
pub const HOLDERS: [(&str, &str, &str); 6] = [
    ("apps/v1", "Deployment", "/spec/template"),
    ("apps/v1", "StatefulSet", "/spec/template"),
    ("apps/v1", "DaemonSet", "/spec/template"),
    ("apps/v1", "ReplicaSet", "/spec/template"),
    ("apps/v1", "ControllerRevision", "/data/spec/template"),
    ("v1", "Pod", ""),
];

/// Field masks covering every reference field of a pod spec under `prefix`.
pub fn reference_masks(prefix: &str) -> Vec<String> {
    let mut masks = vec![format!("{prefix}spec.volumes")];
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        masks.push(format!("{prefix}spec.{list}.env"));
        masks.push(format!("{prefix}spec.{list}.envFrom"));
    }
    masks
}

/// Deletes the unowned, unreferenced snapshots of `source` older than the
/// grace period, except `keep`. Best effort: a failure leaves the orphan
/// for the next sweep, never fails the admission.
pub fn sweep(ctx: &Context, source: &SourceId, keep: &str) {
    let selector = format!(
        "{}={},{}={}",
        keys::MANAGED_BY,
        keys::MANAGED_BY_VALUE,
        keys::SOURCE_LABEL,
        source_label(&source.name)
    );
    let masks = [
        "metadata.name",
        "metadata.uid",
        "metadata.labels",
        "metadata.annotations",
        "metadata.ownerReferences",
        "metadata.creationTimestamp",
    ];
    let Ok(snapshots) = ctx
        .cluster
        .list("v1", source.kind.kind(), ctx.namespace, Some(selector), &masks)
    else {
        return;
    };
    let mut now: Option<i64> = None;
    let candidates: Vec<&Value> = snapshots
        .iter()
        .filter(|s| {
            let meta = &s["metadata"];
            meta["name"].as_str() != Some(keep)
                && keys::is_snapshot(s)
                && meta["annotations"][keys::SOURCE_NAME].as_str() == Some(source.name.as_str())
                && meta["ownerReferences"].as_array().is_none_or(|o| o.is_empty())
                && meta["creationTimestamp"]
                    .as_str()
                    .and_then(parse_rfc3339)
                    .is_some_and(|created| {
                        let now = *now.get_or_insert_with(|| ctx.cluster.now());
                        now - created >= ctx.settings.orphan_grace_period_secs as i64
                    })
        })
        .collect();
    if candidates.is_empty() {
        return;
    }
    let Some(referenced) = referenced_names(ctx, source.kind) else {
        return;
    };
    for snap in candidates {
        let (Some(name), Some(uid)) = (snap["metadata"]["name"].as_str(), snap["metadata"]["uid"].as_str()) else {
            continue;
        };
        if !referenced.contains(name) {
            let _ = ctx.cluster.delete_snapshot(source.kind.kind(), name, uid);
        }
    }
}

/// Every name of `kind` that a workload, revision or Pod in the namespace
/// references. `None` if any list failed: then nothing may be deleted.
fn referenced_names(ctx: &Context, kind: SourceKind) -> Option<HashSet<String>> {
    let mut names = HashSet::new();
    for (api_version, holder, path) in HOLDERS {
        let prefix = match path {
            "" => "",
            "/spec/template" => "spec.template.",
            _ => "data.spec.template.",
        };
        let masks = reference_masks(prefix);
        let masks: Vec<&str> = masks.iter().map(String::as_str).collect();
        let items = ctx
            .cluster
            .list(api_version, holder, ctx.namespace, None, &masks)
            .ok()?;
        for item in &items {
            let template = if path.is_empty() {
                Some(item)
            } else {
                item.pointer(path)
            };
            if let Some(t) = template {
                names.extend(
                    references::collect(t)
                        .into_iter()
                        .filter(|r| r.kind == kind)
                        .map(|r| r.name),
                );
            }
        }
    }
    Some(names)
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::content::{snapshot_object, Content};
    use crate::duration::format_rfc3339;
    use crate::fake::FakeHost;
    use crate::host::Cluster;
    use crate::kind::{SourceId, SourceKind};
    use crate::settings::Settings;
    use crate::workload::Context;

    const NOW: i64 = 1_800_000_000;

    fn snap(value: &str, age_secs: i64, owned: bool) -> Value {
        let content = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"v": value}})).unwrap();
        let (_, mut obj) = snapshot_object(&SourceId::new(SourceKind::ConfigMap, "app"), "default", "1", &content);
        obj["metadata"]["uid"] = json!(format!("uid-{value}"));
        obj["metadata"]["creationTimestamp"] = json!(format_rfc3339(NOW - age_secs));
        if owned {
            obj["metadata"]["ownerReferences"] = json!([{"kind": "ReplicaSet", "name": "rs", "uid": "rs-uid"}]);
        }
        obj
    }

    fn name(obj: &Value) -> String {
        obj["metadata"]["name"].as_str().unwrap().to_string()
    }

    fn sweep(host: &FakeHost, keep: &str) {
        let settings = Settings::default();
        let ctx = Context {
            cluster: Cluster::new(host),
            settings: &settings,
            namespace: "default",
            dry_run: false,
        };
        super::sweep(&ctx, &SourceId::new(SourceKind::ConfigMap, "app"), keep);
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
    }

    #[test]
    fn deletes_nothing_when_references_cannot_be_listed() {
        let mut host = FakeHost::with(vec![snap("orphan", 3600, false)]);
        host.now = NOW;
        host.fail("list_resources_by_namespace", "timeout");
        sweep(&host, "x");
        assert!(host.ops("delete_snapshot").is_empty());
    }
}
