//! Workload admission (docs/design.md, "Workload admission"): snapshot the
//! opted-in sources and rewrite the pod template to reference the
//! snapshots. [`crate::plan`] decides; this module carries it out.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::checksum;
use crate::duration::format_rfc3339;
use crate::host::{Cluster, WriteError};
use crate::keys;
use crate::kind::SourceId;
use crate::optin::OptIn;
use crate::plan::{Change, Plan, Planner, Target};
use crate::reads::Reads;
use crate::records::{Rollback, WatchRollout};
use crate::references::{self, SourceRefs};
use crate::request::{Outcome, SAY};
use crate::settings::{OnSnapshotFailure, Settings};
use crate::sweep;
use crate::template::{self, Mapping};

/// What every handler needs to know about the request it serves.
pub struct Context<'a> {
    pub cluster: Cluster<'a>,
    pub settings: &'a Settings,
    pub namespace: &'a str,
    pub dry_run: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadKind {
    Deployment,
    StatefulSet,
    DaemonSet,
}

impl WorkloadKind {
    pub const ALL: [WorkloadKind; 3] = [
        WorkloadKind::Deployment,
        WorkloadKind::StatefulSet,
        WorkloadKind::DaemonSet,
    ];

    pub fn from_kind(kind: &str) -> Option<Self> {
        match kind {
            "Deployment" => Some(WorkloadKind::Deployment),
            "StatefulSet" => Some(WorkloadKind::StatefulSet),
            "DaemonSet" => Some(WorkloadKind::DaemonSet),
            _ => None,
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "Deployment",
            WorkloadKind::StatefulSet => "StatefulSet",
            WorkloadKind::DaemonSet => "DaemonSet",
        }
    }
}

/// Just the annotations, for the pass-through check: serde skips the rest of
/// the object without building it.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct Quick {
    metadata: QuickMeta,
    spec: QuickSpec,
}
#[derive(Deserialize, Default)]
#[serde(default)]
struct QuickMeta {
    annotations: Option<BTreeMap<String, String>>,
}
#[derive(Deserialize, Default)]
#[serde(default)]
struct QuickSpec {
    template: QuickTemplate,
}
#[derive(Deserialize, Default)]
#[serde(default)]
struct QuickTemplate {
    metadata: QuickMeta,
}

/// Whether a workload is ours to look at: it opts in (or the settings opt
/// every workload in), or its template carries our marks, which must be
/// kept or cleaned. Anything else passes through untouched.
pub(crate) fn opts_in(quick: &Quick, settings: &Settings) -> bool {
    let marked = quick
        .spec
        .template
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.keys().any(|k| keys::is_policy_template_annotation(k)));
    marked || OptIn::any_opt_in(quick.metadata.annotations.as_ref(), settings)
}

pub fn admit(
    ctx: &Context,
    kind: WorkloadKind,
    operation: &str,
    raw: &RawValue,
    old_raw: Option<&RawValue>,
) -> Outcome {
    let quick: Quick = match serde_json::from_slice(raw.get().as_bytes()) {
        Ok(q) => q,
        Err(e) => return Outcome::reject(format!("{SAY}invalid {}: {e}", kind.kind()), 400),
    };
    if !opts_in(&quick, ctx.settings) {
        return Outcome::accept();
    }

    let mut object: Value = match serde_json::from_str(raw.get()) {
        Ok(v) => v,
        Err(e) => return Outcome::reject(format!("{SAY}invalid {}: {e}", kind.kind()), 400),
    };
    let optin = match OptIn::from_annotations(
        object.pointer("/metadata/annotations").and_then(Value::as_object),
        ctx.settings,
    ) {
        Ok(o) => o,
        Err(e) => return Outcome::reject(format!("{SAY}{e}"), 400),
    };
    if object.pointer("/spec/template").is_none() {
        return Outcome::accept();
    }
    let old: Option<Value> = match (operation, old_raw) {
        ("UPDATE", Some(old)) => serde_json::from_str::<Value>(old.get()).ok(),
        _ => None,
    };

    let reads = Reads::new(&ctx.cluster, ctx.namespace);
    let planner = Planner {
        ctx,
        reads: &reads,
        kind,
        object: &object,
        old: old.as_ref(),
        optin: &optin,
    };
    let plan = match planner.plan() {
        Ok(plan) => plan,
        Err(rejection) => return rejection.into(),
    };
    let Plan {
        groups,
        mut targets,
        writes,
        mut warnings,
        renewed_at,
        rollback,
        change,
    } = plan;

    // Create every snapshot before rewriting anything: a reference to a
    // snapshot that does not exist would break the pods.
    let mut created_sources: Vec<(SourceId, String)> = Vec::new();
    let owner = crate::records::owner_of(kind.kind(), &object);
    if !ctx.dry_run {
        for (i, w) in writes.iter().enumerate() {
            let id = &groups[w.group].id;
            match ctx.cluster.create_snapshot(&w.object, &owner) {
                Ok(true) => created_sources.push((id.clone(), w.name.clone())),
                Ok(false) => {}
                Err(WriteError::Unsupported(m)) if i == 0 => {
                    return checksum::degrade(ctx, &reads, &mut object, &groups, &optin, &m);
                }
                Err(e) => match ctx.settings.on_snapshot_failure {
                    OnSnapshotFailure::Reject => {
                        return Outcome::reject(
                            format!("{SAY}could not create snapshot {} of {id}: {}", w.name, e.message()),
                            500,
                        );
                    }
                    OnSnapshotFailure::Warn => {
                        targets[w.group] = Target::Source;
                        warnings.push(format!(
                            "{SAY}could not create snapshot {} of {id}, left the reference to the source: {}",
                            w.name,
                            e.message()
                        ));
                    }
                },
            }
        }
        for (id, keep) in &created_sources {
            sweep::sweep(ctx, id, keep);
        }
    }

    let original = object.clone();
    let template = object.pointer_mut("/spec/template").expect("checked above");
    apply(template, &groups, &targets, &optin, renewed_at);
    // A record carried from the live object keeps its generation; one this
    // write makes gets the generation the write really produces.
    let rollback = rollback.map(|mut r| {
        if let (Change::Rollback, Some(old)) = (change, &old) {
            r.generation = crate::records::generation_after(old, &object);
        }
        r
    });
    set_rollback(&mut object, rollback.as_ref());
    // The watch-rollout record changes only with the host's own rollout.
    // Copied from another object on CREATE, it speaks of that object's
    // generations; rewound by a rollback, it would reset the storm guard.
    let kept = match &old {
        Some(old) if !WatchRollout::made(&object, old) => old.pointer(&record_path(keys::WATCH_ROLLOUT)).cloned(),
        Some(_) => object.pointer(&record_path(keys::WATCH_ROLLOUT)).cloned(),
        None => None,
    };
    if object.pointer(&record_path(keys::WATCH_ROLLOUT)) != kept.as_ref() {
        if let Some(ann) = metadata_annotations_mut(&mut object) {
            match kept {
                Some(v) => ann.insert(keys::WATCH_ROLLOUT.to_string(), v),
                None => ann.remove(keys::WATCH_ROLLOUT),
            };
        }
    }
    let mutated = (object != original).then_some(object);
    Outcome {
        accepted: true,
        message: None,
        code: None,
        mutated,
        warnings,
    }
}

fn record_path(key: &str) -> String {
    format!("/metadata/annotations/{}", escape(key))
}

/// Writes (or removes) the rollback record on the workload's metadata.
fn set_rollback(object: &mut Value, record: Option<&Rollback>) {
    let has = object
        .pointer(&format!("/metadata/annotations/{}", escape(keys::ROLLBACK)))
        .is_some();
    match record {
        Some(r) => {
            if let Some(ann) = metadata_annotations_mut(object) {
                ann.insert(keys::ROLLBACK.to_string(), Value::String(r.to_annotation()));
            }
        }
        None if has => {
            if let Some(ann) = metadata_annotations_mut(object) {
                ann.remove(keys::ROLLBACK);
            }
        }
        None => {}
    }
}

fn metadata_annotations_mut(object: &mut Value) -> Option<&mut serde_json::Map<String, Value>> {
    let meta = object.get_mut("metadata")?.as_object_mut()?;
    meta.entry("annotations")
        .or_insert_with(|| Value::Object(Default::default()))
        .as_object_mut()
}

/// JSON Pointer escaping (RFC 6901).
pub fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// Rewrites names and the policy's annotations in place.
pub(crate) fn apply(
    template: &mut Value,
    groups: &[SourceRefs],
    targets: &[Target],
    optin: &OptIn,
    renewed_at: Option<i64>,
) {
    let mut mapping = Mapping::default();
    for (group, target) in groups.iter().zip(targets) {
        let name = match target {
            Target::Snapshot(name) => {
                mapping.0.insert(group.id.clone(), name.clone());
                name.as_str()
            }
            Target::Source => group.id.name.as_str(),
        };
        for r in &group.refs {
            references::set_name(template, &r.pointer, name);
        }
    }
    let mut marks: Vec<(&str, String)> = Vec::new();
    if !mapping.0.is_empty() {
        marks.push((keys::SNAPSHOTS, mapping.to_annotation()));
    }
    if let (Some(_), Some(t)) = (optin.renew_secs, renewed_at) {
        marks.push((keys::RENEWED_AT, format_rfc3339(t)));
    }
    set_marks(template, marks);
}

/// Replaces the policy's template annotations with `marks`, leaving the
/// user's alone and not adding an empty map where there was none.
pub(crate) fn set_marks(template: &mut Value, marks: Vec<(&str, String)>) {
    let has_annotations = template.pointer("/metadata/annotations").is_some();
    if !has_annotations && marks.is_empty() {
        return;
    }
    if let Some(ann) = template::annotations_mut(template) {
        ann.retain(|k, _| !keys::is_policy_template_annotation(k));
        for (k, v) in marks {
            ann.insert(k.to_string(), Value::String(v));
        }
        if ann.is_empty() && !has_annotations {
            template["metadata"].as_object_mut().map(|m| m.remove("annotations"));
        }
    }
}

#[cfg(test)]
#[path = "workload_tests.rs"]
pub(crate) mod tests;
