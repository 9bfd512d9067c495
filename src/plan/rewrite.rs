//! Rewriting a workload in place: its references and the policy's template
//! annotations (the mapping, `renewed-at`, checksums), and the records on
//! its metadata. Workload admission and checksum mode both write through
//! here; the host's watch rollout builds the same edits as a JSON Patch
//! (`watch::retarget_ops`).

use crate::model::object::ObjectExt;
use serde_json::Value;

use crate::model::duration::format_rfc3339;
use crate::model::keys;
use crate::model::optin::OptIn;
use crate::model::records::Rollback;
use crate::model::references::{self, SourceRefs};
use crate::model::template::{self, Mapping};
use crate::plan::Target;

/// JSON Pointer escaping (RFC 6901).
pub(crate) fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// The JSON Pointer of one metadata annotation.
pub fn annotation_path(key: &str) -> String {
    format!("/metadata/annotations/{}", escape(key))
}

/// Rewrites names and the policy's annotations in place.
pub fn apply(template: &mut Value, groups: &[SourceRefs], targets: &[Target], optin: &OptIn, renewed_at: Option<i64>) {
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
            template.remove_meta("annotations");
        }
    }
}

/// Writes (or removes) the rollback record on the workload's metadata.
pub(crate) fn set_rollback(object: &mut Value, record: Option<&Rollback>) {
    let has = object.pointer(&annotation_path(keys::ROLLBACK)).is_some();
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

/// Sets (or removes) one annotation of the workload's metadata to `value`.
pub(crate) fn set_annotation(object: &mut Value, key: &str, value: Option<Value>) {
    if let Some(ann) = metadata_annotations_mut(object) {
        match value {
            Some(v) => ann.insert(key.to_string(), v),
            None => ann.remove(key),
        };
    }
}

fn metadata_annotations_mut(object: &mut Value) -> Option<&mut serde_json::Map<String, Value>> {
    let meta = object.get_mut("metadata")?.as_object_mut()?;
    meta.entry("annotations")
        .or_insert_with(|| Value::Object(Default::default()))
        .as_object_mut()
}
