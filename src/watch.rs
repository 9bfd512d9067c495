//! Source admission (docs/design.md, "Watch"): a changed ConfigMap or Secret
//! rolls out the workloads that watch it, through a new snapshot and a
//! deferred patch.
//!
//! Every ConfigMap and Secret write in the cluster passes through here, so
//! the common cases (a snapshot, an excluded source, a metadata-only edit)
//! return before anything beyond the content is parsed.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::content::{self, Content};
use crate::host::WriteError;
use crate::keys;
use crate::kind::{SourceId, SourceKind};
use crate::operation::Operation;
use crate::optin::OptIn;
use crate::plan::SA_TOKEN;
use crate::records::Rollback;
use crate::references;
use crate::request::{Outcome, SAY};
use crate::template::{self, Mapping};
use crate::workload::{escape, Context, WorkloadKind};

/// The parts of a source the watch needs; everything else is skipped unparsed.
#[derive(Deserialize, Default, PartialEq)]
#[serde(default)]
struct SourceView {
    metadata: Meta,
    data: Option<BTreeMap<String, String>>,
    #[serde(rename = "binaryData")]
    binary_data: Option<BTreeMap<String, String>>,
    #[serde(rename = "type")]
    type_: Option<String>,
}

#[derive(Deserialize, Default, PartialEq)]
#[serde(default, rename_all = "camelCase")]
struct Meta {
    name: String,
    labels: Option<BTreeMap<String, String>>,
    resource_version: String,
}

impl SourceView {
    /// Absent and empty maps are the same content, as in the hash.
    fn same_content(&self, other: &SourceView) -> bool {
        fn filled(m: &Option<BTreeMap<String, String>>) -> Option<&BTreeMap<String, String>> {
            m.as_ref().filter(|d| !d.is_empty())
        }
        filled(&self.data) == filled(&other.data)
            && filled(&self.binary_data) == filled(&other.binary_data)
            && self.type_ == other.type_
    }
}

pub fn admit(ctx: &Context, kind: SourceKind, operation: &str, raw: &RawValue, old_raw: Option<&RawValue>) -> Outcome {
    let Ok(new) = serde_json::from_str::<SourceView>(raw.get()) else {
        // Not ours to judge: the API server validates sources.
        return Outcome::accept();
    };
    let is_snapshot = new
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(keys::MANAGED_BY))
        .is_some_and(|v| v == keys::MANAGED_BY_VALUE);
    let id = SourceId::new(kind, new.metadata.name.clone());
    if is_snapshot || ctx.settings.is_excluded(&id) || new.type_.as_deref() == Some(SA_TOKEN) {
        return Outcome::accept();
    }
    let old = match operation {
        "UPDATE" => old_raw.and_then(|o| serde_json::from_str::<SourceView>(o.get()).ok()),
        _ => None,
    };
    if old.as_ref().is_some_and(|old| old.same_content(&new)) {
        return Outcome::accept();
    }
    // Built from the fields already parsed. The snapshot's
    // source-resource-version stays empty: during admission the object still
    // carries the previous version's resourceVersion, and the new one is
    // assigned only after the write; recording the old one would point at
    // the wrong content. That old version is still useful to the host: while
    // the source has it, the change is not persisted yet.
    let change = Change {
        operation,
        resource_version: old.map(|o| o.metadata.resource_version).unwrap_or_default(),
    };
    let content = Content {
        data: new.data.unwrap_or_default(),
        binary_data: new.binary_data.unwrap_or_default(),
        kind,
        type_: match kind {
            SourceKind::ConfigMap => String::new(),
            SourceKind::Secret => new.type_.unwrap_or_else(|| "Opaque".to_string()),
        },
    };
    Outcome::accept_with(roll_out(ctx, &id, &content, &change))
}

/// The source write being admitted, as the host needs to recognise it.
struct Change<'a> {
    operation: &'a str,
    /// The source's resourceVersion before this write (empty on CREATE).
    resource_version: String,
}

/// Finds the watchers of `id` and moves each to a snapshot of `content`.
/// Returns warnings; the source write itself is never refused.
fn roll_out(ctx: &Context, id: &SourceId, content: &Content, change: &Change) -> Vec<String> {
    let mut warnings = Vec::new();
    let masks = watcher_masks();
    let masks: Vec<&str> = masks.iter().map(String::as_str).collect();
    // Whether the host has the reverse index; asked once per admission.
    let mut indexed = true;
    for kind in WorkloadKind::ALL {
        let workloads = match candidates(ctx, kind, id, &masks, &mut indexed) {
            Ok(w) => w,
            Err(e) => {
                warnings.push(format!(
                    "{SAY}could not list {}s to roll out watchers of {id}: {e}",
                    kind.kind()
                ));
                continue;
            }
        };
        for workload in &workloads {
            if let Err(w) = roll_out_one(ctx, id, content, change, kind, workload) {
                warnings.push(w);
            }
        }
    }
    warnings
}

/// The workloads of `kind` that may watch `id`: those whose template
/// references it, from our host's index; on a host without one (stock
/// Kubewarden), every workload of the kind. `roll_out_one` decides either
/// way, so both give the same rollouts.
fn candidates(
    ctx: &Context,
    kind: WorkloadKind,
    id: &SourceId,
    masks: &[&str],
    indexed: &mut bool,
) -> Result<Vec<Value>, String> {
    if *indexed {
        match ctx.cluster.list_referencing(kind.kind(), ctx.namespace, id, masks) {
            Ok(items) => return Ok(items),
            Err(WriteError::Unsupported(_)) => *indexed = false,
            Err(WriteError::Failed(e)) => return Err(e),
        }
    }
    ctx.cluster.list("apps/v1", kind.kind(), ctx.namespace, None, masks)
}

fn watcher_masks() -> Vec<String> {
    let mut masks = references::masks("spec.template.");
    masks.extend(
        [
            "metadata.name",
            "metadata.uid",
            "metadata.resourceVersion",
            "metadata.annotations",
            "spec.template.metadata.annotations",
        ]
        .map(String::from),
    );
    masks
}

fn roll_out_one(
    ctx: &Context,
    id: &SourceId,
    content: &Content,
    change: &Change,
    kind: WorkloadKind,
    workload: &Value,
) -> Result<(), String> {
    let annotations = workload.pointer("/metadata/annotations").and_then(Value::as_object);
    let Ok(optin) = OptIn::from_annotations(annotations, ctx.settings) else {
        return Ok(());
    };
    if !optin.watches(id, ctx.settings) {
        return Ok(());
    }
    let Some(template) = workload.pointer("/spec/template") else {
        return Ok(());
    };
    let Some(group) = template::own_group(template, id) else {
        return Ok(());
    };
    let subset = content.subset(group.key_subset().as_ref());
    let (name, snapshot) = content::snapshot_object(id, ctx.namespace, "", &subset);
    if group.refs.iter().all(|r| r.name == name) {
        // An edit outside this workload's keys: nothing to roll.
        return Ok(());
    }
    if change.operation == "CREATE" && declined_by_rollback(workload, id, &name) {
        // A re-admission (the resync's) or a re-created source with the
        // content a rollback turned down: the rollback stands until the
        // source changes again.
        return Ok(());
    }
    if ctx.dry_run {
        return Ok(());
    }
    let workload_name = workload
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let fail = |what: &str, e: &str| {
        format!(
            "{SAY}could not roll out {} {workload_name} to {name}: {what}: {e}",
            kind.kind()
        )
    };
    let created = ctx
        .cluster
        .create_snapshot(&snapshot, &crate::records::owner_of(kind.kind(), workload))
        .map_err(|e| fail(Operation::CreateSnapshot.name(), e.message()))?;
    let Some(patch) = retarget_ops(template, id, &name) else {
        return Ok(());
    };
    let request = json!({
        "apiVersion": "apps/v1",
        "kind": kind.kind(),
        "name": workload_name,
        "resourceVersion": workload.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or_default(),
        // The rollbacks this was decided after: one more voids it.
        "rollbacks": Rollback::count_of(workload),
        "patch": patch,
        // Lets the host hold the patch until this very content is persisted,
        // and drop it once the source has moved on (a newer patch supersedes it).
        "source": {
            "kind": id.kind.kind(),
            "name": id.name,
            "contentHash": content.hash(),
            "resourceVersion": change.resource_version,
        },
        "snapshot": name,
    });
    ctx.cluster
        .patch_workload(request)
        .map_err(|e| fail(Operation::PatchWorkload.name(), e.message()))?;
    if created {
        crate::sweep::sweep(ctx, id, &name);
    }
    Ok(())
}

/// Whether `workload`'s last rollback declined this very content of `id`
/// (`""`: the rollback could not read it, so it declines any).
fn declined_by_rollback(workload: &Value, id: &SourceId, snapshot: &str) -> bool {
    Rollback::of(workload).is_some_and(|r| {
        r.declined(id)
            .is_some_and(|declined| declined.is_empty() || declined == snapshot)
    })
}

/// The JSON Patch that points every reference of `id` in a workload's pod
/// `template` at `snapshot` and records it in the mapping. `None` if the
/// template does not reference the source. Shared with the host, which
/// recomputes it on the fresh object after a conflict.
pub fn retarget_ops(template: &Value, id: &SourceId, snapshot: &str) -> Option<Vec<Value>> {
    let mut mapping = Mapping::of(template);
    let group = template::own_group(template, id)?;
    let mut patch: Vec<Value> = group
        .refs
        .iter()
        .map(|r| json!({"op": "replace", "path": format!("/spec/template{}", r.pointer), "value": snapshot}))
        .collect();
    mapping.0.insert(id.clone(), snapshot.to_string());
    let annotation = mapping.to_annotation();
    let op = if template.pointer("/metadata/annotations").is_some_and(Value::is_object) {
        let path = format!("/spec/template/metadata/annotations/{}", escape(keys::SNAPSHOTS));
        json!({"op": "add", "path": path, "value": annotation})
    } else if template.get("metadata").is_some_and(Value::is_object) {
        json!({"op": "add", "path": "/spec/template/metadata/annotations", "value": {keys::SNAPSHOTS: annotation}})
    } else {
        json!({"op": "add", "path": "/spec/template/metadata", "value": {"annotations": {keys::SNAPSHOTS: annotation}}})
    };
    patch.push(op);
    Some(patch)
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::fake::FakeHost;
    use crate::keys;
    use crate::workload::tests::{cm, deployment, payload, run};

    /// A cluster with a watcher of `app`, created through the policy so its
    /// template already names a snapshot.
    fn cluster(watch: &str, spec: Value) -> (FakeHost, Value) {
        let host = FakeHost::with(vec![
            cm("app", json!({"mode": "blue", "other": "x"})),
            cm("unrelated", json!({"a": "1"})),
        ]);
        let mut d = deployment(json!({ keys::WATCH: watch }), spec);
        d = run(&host, &payload("Deployment", "CREATE", &d, None, false, json!({})))
            .mutated
            .unwrap_or(d);
        d["metadata"]["resourceVersion"] = json!("41");
        host.objects.borrow_mut().push(d.clone());
        host.calls.borrow_mut().clear();
        (host, d)
    }

    fn env_from(name: &str) -> Value {
        json!({"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": name}}]}]})
    }

    fn edit(host: &FakeHost, data: Value, dry_run: bool) -> crate::request::Outcome {
        let old = cm("app", json!({"mode": "blue", "other": "x"}));
        let mut new = cm("app", data);
        new["metadata"]["resourceVersion"] = json!("8");
        run(
            host,
            &payload("ConfigMap", "UPDATE", &new, Some(&old), dry_run, json!({})),
        )
    }

    #[test]
    fn a_content_change_rolls_out_every_watcher_through_a_snapshot_and_a_patch() {
        let (host, _) = cluster("app", env_from("app"));
        let out = edit(&host, json!({"mode": "green", "other": "x"}), false);
        assert!(
            out.accepted && out.mutated.is_none() && out.warnings.is_empty(),
            "{out:?}"
        );
        let created = host.ops("create_snapshot");
        assert_eq!(created.len(), 1);
        let snap = created[0]["object"]["metadata"]["name"].as_str().unwrap().to_string();
        assert_eq!(created[0]["object"]["data"], json!({"mode": "green", "other": "x"}));
        let patches = host.ops("patch_workload");
        assert_eq!(patches.len(), 1);
        let p = &patches[0];
        assert_eq!(p["kind"], "Deployment");
        assert_eq!(p["name"], "web");
        assert_eq!(p["resourceVersion"], "41");
        assert_eq!(p["snapshot"], snap.as_str());
        assert_eq!(
            p["patch"][0],
            json!({"op": "replace", "path": "/spec/template/spec/containers/0/envFrom/0/configMapRef/name", "value": snap})
        );
        // The mapping annotation is rewritten to name the new snapshot.
        let last = p["patch"].as_array().unwrap().last().unwrap();
        assert_eq!(
            last["path"],
            "/spec/template/metadata/annotations/config-snapshot.io~1snapshots"
        );
        assert_eq!(last["value"], json!({"configmap/app": snap}).to_string());
        assert_eq!(p["source"]["name"], "app");
        // Only the workloads that reference the source were asked for,
        // with field masks; nothing listed the namespace.
        let list = &host.ops("list_referencing")[0];
        assert_eq!(
            (&list["source_kind"], &list["source_name"]),
            (&json!("ConfigMap"), &json!("app"))
        );
        assert!(list["field_masks"]
            .as_array()
            .unwrap()
            .contains(&json!("spec.template.spec.containers.envFrom")));
        assert_eq!(workload_lists(&host), 0);
    }

    /// Lists of whole workload kinds (the sweep lists snapshots too).
    fn workload_lists(host: &FakeHost) -> usize {
        host.ops("list_resources_by_namespace")
            .iter()
            .filter(|l| super::WorkloadKind::from_kind(l["kind"].as_str().unwrap_or_default()).is_some())
            .count()
    }

    #[test]
    fn without_the_hosts_index_every_workload_is_listed_and_the_rollout_is_the_same() {
        let (host, _) = cluster("app", env_from("app"));
        host.failures.borrow_mut().insert(
            "list_referencing".into(),
            "unknown operation config-snapshot/v1/list_referencing".into(),
        );
        let out = edit(&host, json!({"mode": "green", "other": "x"}), false);
        assert!(out.accepted && out.warnings.is_empty(), "{out:?}");
        assert_eq!(host.ops("patch_workload").len(), 1);
        // Asked once, then the three kinds are listed whole.
        assert_eq!(host.ops("list_referencing").len(), 1);
        assert_eq!(workload_lists(&host), 3);
    }

    #[test]
    fn a_failing_index_is_a_warning_not_a_silent_fallback() {
        let (host, _) = cluster("app", env_from("app"));
        host.failures
            .borrow_mut()
            .insert("list_referencing".into(), "the server timed out (Timeout)".into());
        let out = edit(&host, json!({"mode": "green", "other": "x"}), false);
        assert!(out.accepted, "{out:?}");
        assert!(
            out.warnings
                .iter()
                .any(|w| w.contains("could not list") && w.contains("timed out")),
            "{out:?}"
        );
        assert!(host.ops("patch_workload").is_empty());
    }

    #[test]
    fn metadata_only_edits_are_a_no_op_without_host_calls() {
        let (host, _) = cluster("app", env_from("app"));
        let out = edit(&host, json!({"other": "x", "mode": "blue"}), false);
        assert_eq!(out, crate::request::Outcome::accept());
        assert!(host.calls.borrow().is_empty(), "{:?}", host.calls.borrow());
    }

    #[test]
    fn snapshots_and_excluded_sources_are_passed_through_without_host_calls() {
        let host = FakeHost::with(vec![]);
        let mut snap = cm("app-0123456789", json!({"a": "1"}));
        snap["metadata"]["labels"] = json!({keys::MANAGED_BY: keys::MANAGED_BY_VALUE});
        run(&host, &payload("ConfigMap", "CREATE", &snap, None, false, json!({})));
        let ca = cm("kube-root-ca.crt", json!({"ca.crt": "x"}));
        run(&host, &payload("ConfigMap", "CREATE", &ca, None, false, json!({})));
        assert!(host.calls.borrow().is_empty());
    }

    #[test]
    fn snapshot_only_and_unrelated_workloads_are_not_rolled() {
        let (host, _) = cluster("unrelated", env_from("app"));
        edit(&host, json!({"mode": "green", "other": "x"}), false);
        assert!(host.ops("patch_workload").is_empty());
        let mut d = deployment(json!({ keys::SNAPSHOT: "app" }), env_from("app"));
        d["metadata"]["name"] = json!("snap-only");
        host.objects.borrow_mut().push(d);
        edit(&host, json!({"mode": "red", "other": "x"}), false);
        assert!(host.ops("patch_workload").is_empty());
    }

    #[test]
    fn an_edit_outside_the_key_subset_rolls_nothing() {
        let spec = json!({"containers": [{"name": "c", "env": [{"name": "M", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "mode"}}}]}]});
        let (host, _) = cluster("app", spec);
        edit(&host, json!({"mode": "blue", "other": "CHANGED"}), false);
        assert!(host.ops("create_snapshot").is_empty());
        assert!(host.ops("patch_workload").is_empty());
        edit(&host, json!({"mode": "green", "other": "CHANGED"}), false);
        assert_eq!(host.ops("patch_workload").len(), 1);
        assert_eq!(
            host.ops("create_snapshot")[0]["object"]["data"],
            json!({"mode": "green"})
        );
    }

    #[test]
    fn a_source_created_after_its_watcher_moves_the_watcher_to_a_snapshot() {
        let host = FakeHost::with(vec![]);
        let d = deployment(json!({ keys::WATCH: "late" }), env_from("late"));
        let out = run(&host, &payload("Deployment", "CREATE", &d, None, false, json!({})));
        assert!(out.mutated.is_none());
        host.objects.borrow_mut().push(d);
        run(
            &host,
            &payload(
                "ConfigMap",
                "CREATE",
                &cm("late", json!({"a": "1"})),
                None,
                false,
                json!({}),
            ),
        );
        assert_eq!(host.ops("patch_workload").len(), 1);
    }

    #[test]
    fn dry_runs_write_nothing_and_failures_only_warn() {
        let (host, _) = cluster("app", env_from("app"));
        edit(&host, json!({"mode": "green", "other": "x"}), true);
        assert!(host.ops("create_snapshot").is_empty() && host.ops("patch_workload").is_empty());
        host.fail("patch_workload", "forbidden");
        let out = edit(&host, json!({"mode": "green", "other": "x"}), false);
        assert!(out.accepted, "a source is never rejected for a watch failure");
        assert!(
            out.warnings[0].contains("could not roll out Deployment web"),
            "{:?}",
            out.warnings
        );
    }
}

#[cfg(test)]
mod rollback_tests {
    use serde_json::{json, Value};

    use crate::fake::FakeHost;
    use crate::keys;
    use crate::workload::tests::{cm, deployment, payload, run};

    fn watcher(host: &FakeHost, rollback: Option<&str>) -> Value {
        let spec = json!({"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "app"}}]}]});
        let mut d = deployment(json!({ keys::WATCH: "app" }), spec);
        d = run(host, &payload("Deployment", "CREATE", &d, None, false, json!({})))
            .mutated
            .unwrap();
        d["metadata"]["generation"] = json!(6);
        if let Some(r) = rollback {
            d["metadata"]["annotations"][keys::ROLLBACK] = json!(r);
        }
        host.objects.borrow_mut().push(d.clone());
        host.calls.borrow_mut().clear();
        d
    }

    fn name_of(data: Value) -> String {
        let c =
            crate::content::Content::from_object(crate::kind::SourceKind::ConfigMap, &json!({ "data": data })).unwrap();
        crate::content::snapshot_name("app", &c.hash())
    }

    #[test]
    fn a_readmitted_source_does_not_undo_a_rollback_that_declined_its_content() {
        let host = FakeHost::with(vec![cm("app", json!({"mode": "blue"}))]);
        let declined = name_of(json!({"mode": "green"}));
        let record =
            format!(r#"{{"generation":6,"at":"2026-01-01T00:00:00Z","sources":{{"configmap/app":"{declined}"}}}}"#);
        watcher(&host, Some(&record));
        // The resync re-admits the source, which holds what was declined.
        let green = cm("app", json!({"mode": "green"}));
        run(&host, &payload("ConfigMap", "CREATE", &green, None, false, json!({})));
        assert!(host.ops("patch_workload").is_empty(), "the rollback stands");
        assert!(host.ops("create_snapshot").is_empty(), "and no garbage is made");
        // A content the rollback never saw rolls out.
        let red = cm("app", json!({"mode": "red"}));
        run(&host, &payload("ConfigMap", "CREATE", &red, None, false, json!({})));
        assert_eq!(host.ops("patch_workload").len(), 1);
        // So does a real edit, even back to the declined content: it is a
        // change made after the rollback.
        host.calls.borrow_mut().clear();
        let old = cm("app", json!({"mode": "red"}));
        run(
            &host,
            &payload("ConfigMap", "UPDATE", &green, Some(&old), false, json!({})),
        );
        assert_eq!(host.ops("patch_workload").len(), 1);
    }

    #[test]
    fn the_patch_says_when_it_was_decided_and_what_the_source_was() {
        let host = FakeHost::with(vec![cm("app", json!({"mode": "blue"}))]);
        watcher(&host, Some(r#"{"generation":5,"count":3,"at":"2026-01-01T00:00:00Z"}"#));
        let old = cm("app", json!({"mode": "blue"}));
        let new = cm("app", json!({"mode": "green"}));
        run(
            &host,
            &payload("ConfigMap", "UPDATE", &new, Some(&old), false, json!({})),
        );
        let p = &host.ops("patch_workload")[0];
        assert_eq!(p["rollbacks"], 3, "the rollbacks it was decided after");
        assert_eq!(p["source"]["resourceVersion"], "7");
        assert_eq!(p["snapshot"], name_of(json!({"mode": "green"})).as_str());
    }
}
