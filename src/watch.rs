//! Source admission (SPEC §5.4): a changed ConfigMap or Secret rolls out the
//! workloads that watch it, through a new snapshot and a deferred patch.
//!
//! Every ConfigMap and Secret write in the cluster passes through here, so
//! the common cases (a snapshot, an excluded source, a metadata-only edit)
//! return before anything beyond the content is parsed.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::content::{self, Content};
use crate::keys;
use crate::kind::{SourceId, SourceKind};
use crate::optin::OptIn;
use crate::references;
use crate::request::{Outcome, SAY};
use crate::sweep::reference_masks;
use crate::template::{self, Mapping};
use crate::workload::{Context, WorkloadKind, SA_TOKEN};

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
#[serde(default)]
struct Meta {
    name: String,
    labels: Option<BTreeMap<String, String>>,
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
    if operation == "UPDATE" {
        if let Some(old) = old_raw.and_then(|o| serde_json::from_str::<SourceView>(o.get()).ok()) {
            if old.same_content(&new) {
                return Outcome::accept();
            }
        }
    }
    let content = match serde_json::from_str::<Value>(raw.get())
        .map_err(|e| e.to_string())
        .and_then(|v| {
            let rv = v
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            Content::from_object(kind, &v).map(|c| (c, rv))
        }) {
        Ok(c) => c,
        Err(_) => return Outcome::accept(),
    };
    Outcome::accept_with(roll_out(ctx, &id, &content.0, &content.1))
}

/// Finds the watchers of `id` and moves each to a snapshot of `content`.
/// Returns warnings; the source write itself is never refused.
fn roll_out(ctx: &Context, id: &SourceId, content: &Content, source_rv: &str) -> Vec<String> {
    let mut warnings = Vec::new();
    let masks = watcher_masks();
    let masks: Vec<&str> = masks.iter().map(String::as_str).collect();
    for kind in WorkloadKind::ALL {
        let workloads = match ctx.cluster.list("apps/v1", kind.kind(), ctx.namespace, None, &masks) {
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
            if let Err(w) = roll_out_one(ctx, id, content, source_rv, kind, workload) {
                warnings.push(w);
            }
        }
    }
    warnings
}

fn watcher_masks() -> Vec<String> {
    let mut masks = reference_masks("spec.template.");
    masks.extend(
        [
            "metadata.name",
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
    source_rv: &str,
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
    let mapping = Mapping::of(template);
    let refs = references::collect(template);
    let Some(group) = template::group_by_source(&refs, &mapping)
        .into_iter()
        .find(|g| g.id == *id)
    else {
        return Ok(());
    };
    let subset = content.subset(group.key_subset().as_ref());
    let (name, snapshot) = content::snapshot_object(id, ctx.namespace, source_rv, &subset);
    if group.refs.iter().all(|r| r.name == name) {
        // An edit outside this workload's keys: nothing to roll.
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
        .create_snapshot(&snapshot)
        .map_err(|e| fail("create_snapshot", e.message()))?;
    let Some(patch) = retarget_ops(template, id, &name) else {
        return Ok(());
    };
    let request = json!({
        "apiVersion": "apps/v1",
        "kind": kind.kind(),
        "name": workload_name,
        "resourceVersion": workload.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or_default(),
        "patch": patch,
        // Lets the host hold the patch until this very content is persisted,
        // and drop it once the source has moved on (a newer patch supersedes it).
        "source": {"kind": id.kind.kind(), "name": id.name, "contentHash": content.hash()},
        "snapshot": name,
    });
    ctx.cluster
        .patch_workload(request)
        .map_err(|e| fail("patch_workload", e.message()))?;
    if created {
        crate::sweep::sweep(ctx, id, &name);
    }
    Ok(())
}

/// The JSON Patch that points every reference of `id` in a workload's pod
/// `template` at `snapshot` and records it in the mapping. `None` if the
/// template does not reference the source. Shared with the host, which
/// recomputes it on the fresh object after a conflict.
pub fn retarget_ops(template: &Value, id: &SourceId, snapshot: &str) -> Option<Vec<Value>> {
    let mut mapping = Mapping::of(template);
    let refs = references::collect(template);
    let group = template::group_by_source(&refs, &mapping)
        .into_iter()
        .find(|g| g.id == *id)?;
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

/// JSON Pointer escaping (RFC 6901).
fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}
