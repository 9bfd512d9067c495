//! Source admission (docs/design.md, "Watch"): a changed ConfigMap or Secret
//! rolls out the workloads that watch it, through a new snapshot and a
//! deferred patch.
//!
//! Every ConfigMap and Secret write in the cluster passes through here, so
//! the common cases (a snapshot, an excluded source, a metadata-only edit)
//! return before anything beyond the content is parsed.

use crate::model::object::ObjectExt;
use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::admit::context::Context;
use crate::host::contract::{PatchWorkload, Revoked, SourceContent};
use crate::host::operation::Operation;
use crate::host::{CallError, Names};
use crate::model::content::Content;
use crate::model::keys;
use crate::model::kinds::WorkloadKind;
use crate::model::optin::OptIn;
use crate::model::readers::Readers;
use crate::model::records::Rollback;
use crate::model::references;
use crate::model::request::{Outcome, SAY};
use crate::model::source::SA_TOKEN;
use crate::model::source::{SourceId, SourceKind};
use crate::model::template::{self, Mapping};
use crate::plan::rewrite::escape;

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
    /// For the source's word about its readers (`config-snapshot.io/readers`).
    annotations: Option<serde_json::Map<String, Value>>,
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
    // What the source says of its readers, as stored with this content:
    // a word that does not parse is no word, and said.
    let mut warnings = Vec::new();
    let said = new.metadata.annotations.as_ref().and_then(|a| a.get(keys::READERS));
    let readers = Readers::judged_from(said.map(|v| v.as_str().unwrap_or_default()), &id, &mut warnings);
    let change = Change {
        operation,
        resource_version: old.map(|o| o.metadata.resource_version).unwrap_or_default(),
        readers,
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
    warnings.extend(roll_out(ctx, &id, &content, &change));
    Outcome::accept_with(warnings)
}

/// The source write being admitted, as the host needs to recognise it.
struct Change<'a> {
    operation: &'a str,
    /// The source's resourceVersion before this write (empty on CREATE).
    resource_version: String,
    /// What the source says of its readers.
    readers: Readers,
}

/// Finds the watchers of `id` and moves each to a snapshot of `content`.
/// Returns warnings; the source write itself is never refused.
fn roll_out(ctx: &Context, id: &SourceId, content: &Content, change: &Change) -> Vec<String> {
    let mut warnings = Vec::new();
    // Whether the host has the reverse index; asked once per admission.
    let mut indexed = true;
    for kind in WorkloadKind::all().filter(|k| k.watches()) {
        let masks = watcher_masks(kind);
        let masks: Vec<&str> = masks.iter().map(String::as_str).collect();
        let workloads = match candidates(ctx, kind, id, &masks, &mut indexed) {
            Ok(w) => w,
            Err(CallError::Foreign(_)) => return warnings,
            // A CRD's kind (Argo Rollouts) where it is not installed: there
            // is nothing of it to roll out.
            Err(e) if kind.row().optional && e.code() == Some(crate::host::host_error::Code::NotFound) => continue,
            Err(e) => {
                warnings.push(format!(
                    "{SAY}could not list {}s to roll out watchers of {id}: {e}",
                    kind.kind()
                ));
                continue;
            }
        };
        for workload in &workloads {
            if let Err(not_rolled) = roll_out_one(ctx, id, content, change, kind, workload) {
                warnings.push(not_rolled.warning(id));
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
) -> Result<Vec<Value>, CallError> {
    if *indexed {
        match ctx.host.list_referencing(kind, ctx.namespace, id, masks) {
            Ok(items) => return Ok(items),
            // A host that does not know our capability at all (stock
            // Kubewarden) can make no watch rollout: listing every workload
            // would be reads, and a capability to declare, for nothing.
            Err(e @ CallError::Foreign(_)) => return Err(e),
            Err(e) if e.unsupported() => *indexed = false,
            Err(e) => return Err(e),
        }
    }
    ctx.host
        .list(kind.api_version(), kind.kind(), ctx.namespace, None, masks)
}

/// The fields of a workload a watch decides on: its identity, opt-in and
/// records, and its template's references and annotations.
fn watcher_masks(kind: WorkloadKind) -> Vec<String> {
    let template = kind.template().trim_start_matches('/').replace('/', ".");
    let mut masks = references::masks(&format!("{template}."));
    masks.extend(
        [
            "metadata.name",
            "metadata.uid",
            "metadata.resourceVersion",
            "metadata.annotations",
        ]
        .map(String::from),
    );
    masks.push(format!("{template}.metadata.annotations"));
    masks
}

/// Why one watcher was not rolled out: a warning on the source's admission,
/// which itself is never refused.
enum NotRolled {
    /// A host call failed.
    Failed {
        kind: WorkloadKind,
        workload: String,
        snapshot: String,
        step: Operation,
        error: CallError,
    },
    /// The source holds content that was revoked: no snapshot of it is
    /// made again, and the workload stays on what it runs
    /// (docs/design.md, "Revocation").
    Revoked {
        kind: WorkloadKind,
        workload: String,
        revoked: Revoked,
    },
}

impl NotRolled {
    fn warning(&self, id: &SourceId) -> String {
        match self {
            NotRolled::Failed {
                kind,
                workload,
                snapshot,
                step,
                error,
            } => {
                let (kind, step) = (kind.kind(), step.name());
                format!("{SAY}could not roll out {kind} {workload} to {snapshot}: {step}: {error}")
            }
            NotRolled::Revoked {
                kind,
                workload,
                revoked,
            } => {
                let kind = kind.kind();
                format!("{SAY}{kind} {workload} not rolled out: {id} holds content {revoked}")
            }
        }
    }
}

/// How one workload stands towards a source: the first half of the rule
/// a change of the source is judged by ([`roll_out_one`]), shared with the
/// host's `plan`, which explains it before anything is applied.
#[derive(Debug, Clone)]
pub enum Watcher {
    /// Its template does not reference the source.
    Unreferenced,
    /// It references the source but does not watch it (no opt-in, an
    /// exclusion, the source's `ignore`, or annotations the policy cannot
    /// read).
    NotWatched(references::SourceRefs),
    /// It watches the source, through these references.
    Watches(references::SourceRefs),
}

/// How `workload` stands towards `id`, which says `readers` of its readers.
pub fn watcher(
    kind: WorkloadKind,
    workload: &Value,
    id: &SourceId,
    readers: Readers,
    settings: &crate::model::settings::Settings,
) -> Watcher {
    let Some(group) = workload
        .pointer(kind.template())
        .and_then(|template| template::own_group(template, id))
    else {
        return Watcher::Unreferenced;
    };
    let annotations = workload.annotations();
    match OptIn::from_annotations(annotations, settings) {
        Ok(optin) if optin.watches(id, readers, settings) => Watcher::Watches(group),
        _ => Watcher::NotWatched(group),
    }
}

fn roll_out_one(
    ctx: &Context,
    id: &SourceId,
    content: &Content,
    change: &Change,
    kind: WorkloadKind,
    workload: &Value,
) -> Result<(), NotRolled> {
    let Watcher::Watches(group) = watcher(kind, workload, id, change.readers, ctx.settings) else {
        return Ok(());
    };
    let keys = group.key_subset();
    let subset = content.subset(keys.as_ref());
    let workload_name = workload.name();
    let mut current: Vec<&str> = group
        .refs
        .iter()
        .map(|r| r.name.as_str())
        .filter(|n| *n != id.name)
        .collect();
    current.dedup();
    let names = ctx
        .host
        .snapshot_names(id, &subset, &current)
        .map_err(|error| NotRolled::Failed {
            kind,
            workload: workload_name.to_string(),
            snapshot: String::new(),
            step: Operation::SnapshotName,
            error,
        })?;
    if group.refs.iter().all(|r| names.include(&r.name)) {
        // An edit outside this workload's keys, or a snapshot it runs that
        // holds this content under an earlier name: nothing to roll.
        return Ok(());
    }
    if let Some(revoked) = names.revoked {
        return Err(NotRolled::Revoked {
            kind,
            workload: workload_name.to_string(),
            revoked,
        });
    }
    if declined_by_rollback(workload, id, &names, change.operation) {
        // The content a rollback turned down: the rollback stands until
        // the source changes to something else.
        return Ok(());
    }
    if ctx.dry_run {
        return Ok(());
    }
    let name = names.name;
    let Some(patch) = retarget_ops(kind, workload, id, &name) else {
        return Ok(());
    };
    // No snapshot is made here: this content is the request's, which the
    // API server has not stored yet (and a forged or later refused request
    // never stores). The host makes the snapshot from the source as stored,
    // once it holds this content, and only then patches (docs/design.md,
    // "Deferred effects").
    let request = PatchWorkload {
        api_version: kind.api_version().to_string(),
        kind,
        name: workload_name.to_string(),
        resource_version: workload.resource_version().to_string(),
        // The rollbacks this was decided after: one more voids it.
        rollbacks: Rollback::count_of(workload),
        patch,
        // Lets the host hold the patch until this very content is persisted,
        // and drop it once the source has moved on (a newer patch supersedes it).
        source: SourceContent {
            kind: id.kind,
            name: id.name.clone(),
            content_hash: content.hash(),
            resource_version: change.resource_version.clone(),
        },
        snapshot: name.clone(),
        keys: keys.map(|keys| keys.into_iter().collect()),
    };
    ctx.host.patch_workload(&request).map_err(|error| NotRolled::Failed {
        kind,
        workload: workload_name.to_string(),
        snapshot: name.clone(),
        step: Operation::PatchWorkload,
        error,
    })?;
    Ok(())
}

/// Whether `workload`'s last rollback declined this very content of `id`,
/// under any name it has. On every write of the source, not only on the
/// periodic pass's re-admission (a CREATE): a review of an UPDATE carrying
/// the content the rollback turned down would otherwise roll it back in,
/// and a forged one can carry anything. `""` (the rollback could not read
/// the source) declines any content re-admitted, but not a real change.
fn declined_by_rollback(workload: &Value, id: &SourceId, names: &Names, operation: &str) -> bool {
    Rollback::of(workload).is_some_and(|r| {
        r.declined(id)
            .is_some_and(|declined| (declined.is_empty() && operation == "CREATE") || names.include(declined))
    })
}

/// The JSON Patch that points every reference of `id` in a `kind`
/// workload's pod template at `snapshot` and records it in the mapping.
/// `None` if the template does not reference the source. Shared with the
/// host, which recomputes it on the fresh object after a conflict.
pub fn retarget_ops(kind: WorkloadKind, workload: &Value, id: &SourceId, snapshot: &str) -> Option<Vec<Value>> {
    let at = kind.template();
    let template = workload.pointer(at)?;
    let mut mapping = Mapping::of(template);
    let group = template::own_group(template, id)?;
    let mut patch: Vec<Value> = group
        .refs
        .iter()
        .map(|r| json!({"op": "replace", "path": format!("{at}{}", r.pointer), "value": snapshot}))
        .collect();
    mapping.0.insert(id.clone(), snapshot.to_string());
    let annotation = mapping.to_annotation();
    let op = if template.pointer("/metadata/annotations").is_some_and(Value::is_object) {
        let path = format!("{at}/metadata/annotations/{}", escape(keys::SNAPSHOTS));
        json!({"op": "add", "path": path, "value": annotation})
    } else if template.get("metadata").is_some_and(Value::is_object) {
        json!({"op": "add", "path": format!("{at}/metadata/annotations"), "value": {keys::SNAPSHOTS: annotation}})
    } else {
        json!({"op": "add", "path": format!("{at}/metadata"), "value": {"annotations": {keys::SNAPSHOTS: annotation}}})
    };
    patch.push(op);
    Some(patch)
}

#[cfg(test)]
#[path = "watch_tests.rs"]
mod tests;
