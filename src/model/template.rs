//! The pod template as the policy sees it: the mapping annotation that says
//! which names are snapshots, and the normalised form used to compare
//! templates across edits and revisions (docs/design.md, "Workload
//! admission", step 2).

use crate::model::object::ObjectExt;
use std::collections::BTreeMap;

use serde_json::Value;

use crate::model::keys;
use crate::model::references::{self, Reference, SourceRefs};
use crate::model::source::{SourceId, SourceKind};

/// `config-snapshot.io/snapshots`: source (`configmap/app`) → snapshot name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mapping(pub BTreeMap<SourceId, String>);

impl Mapping {
    /// Reads the mapping of a template. A malformed annotation reads as empty:
    /// every name is then taken at face value, which is safe (it only means a
    /// fresh snapshot), whereas trusting garbage could point at the wrong copy.
    pub fn of(template: &Value) -> Mapping {
        let Some(text) = template.annotation(keys::SNAPSHOTS) else {
            return Mapping::default();
        };
        let Ok(raw) = serde_json::from_str::<BTreeMap<String, String>>(text) else {
            return Mapping::default();
        };
        Mapping(
            raw.into_iter()
                .filter_map(|(k, v)| {
                    let (tag, name) = k.split_once('/')?;
                    Some((SourceId::new(SourceKind::from_tag(tag)?, name), v))
                })
                .collect(),
        )
    }

    /// Compact JSON, keys sorted: the same mapping always gives the same bytes.
    pub(crate) fn to_annotation(&self) -> String {
        let raw: BTreeMap<String, &String> = self.0.iter().map(|(k, v)| (k.to_string(), v)).collect();
        serde_json::to_string(&raw).expect("string map")
    }
}

/// Which names are snapshots, and of which source. Built from mappings
/// (several: the new and the old template's, a revision's) and from
/// snapshots recognised by their labels, so it can say more than one
/// template's mapping: a re-applied export that lost its mapping still
/// names snapshots.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshots(BTreeMap<(SourceKind, String), String>);

impl Snapshots {
    /// The snapshots a template's own mapping names.
    pub fn of(template: &Value) -> Snapshots {
        let mut s = Snapshots::default();
        s.add_mapping(&Mapping::of(template));
        s
    }

    pub(crate) fn add_mapping(&mut self, mapping: &Mapping) {
        for (id, snapshot) in &mapping.0 {
            self.insert(id.kind, snapshot, &id.name);
        }
    }

    /// Records that `snapshot` is a snapshot of `source`.
    pub fn insert(&mut self, kind: SourceKind, snapshot: &str, source: &str) {
        self.0.insert((kind, snapshot.to_string()), source.to_string());
    }

    fn find(&self, kind: SourceKind, name: &str) -> Option<&str> {
        self.0.get(&(kind, name.to_string())).map(String::as_str)
    }

    pub fn contains(&self, kind: SourceKind, name: &str) -> bool {
        self.find(kind, name).is_some()
    }

    /// The source a name stands for: itself, unless it is a known snapshot.
    pub(crate) fn source_of(&self, kind: SourceKind, name: &str) -> String {
        self.find(kind, name).unwrap_or(name).to_string()
    }

    /// Adds what a template's mapping says; `self` wins where both name
    /// the same snapshot.
    fn with_mapping_of(&self, template: &Value) -> Snapshots {
        let mut all = Snapshots::of(template);
        for ((kind, snapshot), source) in &self.0 {
            all.insert(*kind, snapshot, source);
        }
        all
    }
}

/// Whether a name has the shape of a snapshot name (`<source>-<10 hex>`):
/// only such names are worth a read to recognise an unmapped snapshot.
pub fn looks_like_snapshot(name: &str) -> bool {
    name.len() > 11
        && name.as_bytes()[name.len() - 11] == b'-'
        && name[name.len() - 10..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A template's references grouped by source as the template itself says,
/// through its mapping annotation, without reading anything: how a watch
/// rollout, the host's reverse index and serve's prefetch all see it, so
/// they agree on which workloads reference which source.
pub fn own_groups(template: &Value) -> Vec<SourceRefs> {
    group_by_source(&references::collect(template), &Snapshots::of(template))
}

/// The group of `id` in `template` (see [`own_groups`]), if it references it.
pub fn own_group(template: &Value, id: &SourceId) -> Option<SourceRefs> {
    own_groups(template).into_iter().find(|g| g.id == *id)
}

/// The references of a template grouped by the source they stand for.
pub fn group_by_source(refs: &[Reference], snapshots: &Snapshots) -> Vec<SourceRefs> {
    let mut groups: Vec<SourceRefs> = Vec::new();
    let mut index: BTreeMap<SourceId, usize> = BTreeMap::new();
    for r in refs {
        let id = SourceId::new(r.kind, snapshots.source_of(r.kind, &r.name));
        let slot = *index.entry(id.clone()).or_insert_with(|| {
            groups.push(SourceRefs { id, refs: Vec::new() });
            groups.len() - 1
        });
        groups[slot].refs.push(r.clone());
    }
    groups
}

/// The template with every snapshot name replaced by its source name, the
/// policy's own annotations dropped, and the controller's additions removed
/// (`pod-template-hash`, the `$patch` marker of ControllerRevision data), so
/// that two templates a user would call equal compare equal.
pub fn normalise(template: &Value) -> Value {
    normalise_with(template, &Snapshots::default())
}

/// [`normalise`], also knowing the snapshots in `known` (recognised ones,
/// or another template's mapping) besides the template's own mapping.
pub(crate) fn normalise_with(template: &Value, known: &Snapshots) -> Value {
    let mut out = template.clone();
    let snapshots = known.with_mapping_of(template);
    if !snapshots.0.is_empty() {
        for r in references::collect(template) {
            let source = snapshots.source_of(r.kind, &r.name);
            if source != r.name {
                references::set_name(&mut out, &r.pointer, &source);
            }
        }
    }
    if let Some(ann) = out.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) {
        ann.retain(|k, _| !keys::is_policy_template_annotation(k));
    }
    strip_controller_marks(&mut out);
    out
}

/// A template without what controllers add to their copies: the
/// Deployment controller's `pod-template-hash` label (Argo Rollouts' too),
/// the Job controller's labels and the `$patch` marker of ControllerRevision
/// data. `kubectl
/// rollout undo` puts back exactly this.
pub(crate) fn without_controller_marks(template: &Value) -> Value {
    let mut out = template.clone();
    strip_controller_marks(&mut out);
    out
}

/// Removes the controllers' additions, and the maps that leaves empty.
fn strip_controller_marks(template: &mut Value) {
    if let Some(obj) = template.as_object_mut() {
        obj.remove("$patch");
    }
    if let Some(meta) = template.get_mut("metadata").and_then(Value::as_object_mut) {
        if let Some(labels) = meta.get_mut("labels").and_then(Value::as_object_mut) {
            labels.remove(keys::POD_TEMPLATE_HASH);
            for label in keys::CONTROLLER_TEMPLATE_LABELS {
                labels.remove(label);
            }
        }
        for key in ["annotations", "labels"] {
            if meta.get(key).and_then(Value::as_object).is_some_and(|m| m.is_empty()) {
                meta.remove(key);
            }
        }
        if meta.is_empty() {
            template.as_object_mut().map(|o| o.remove("metadata"));
        }
    }
}

/// Mutable access to the template's annotations, creating the map if needed.
pub(crate) fn annotations_mut(template: &mut Value) -> Option<&mut serde_json::Map<String, Value>> {
    let obj = template.as_object_mut()?;
    let meta = obj
        .entry("metadata")
        .or_insert_with(|| Value::Object(Default::default()));
    let meta = meta.as_object_mut()?;
    let ann = meta
        .entry("annotations")
        .or_insert_with(|| Value::Object(Default::default()));
    ann.as_object_mut()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template(cm_name: &str, annotations: Value) -> Value {
        json!({
            "metadata": {"labels": {"app": "web"}, "annotations": annotations},
            "spec": {"containers": [{"name": "c", "image": "nginx:1",
                "envFrom": [{"configMapRef": {"name": cm_name}}]}]}
        })
    }

    #[test]
    fn mapping_round_trips_and_is_sorted() {
        let mut m = Mapping::default();
        m.0.insert(SourceId::new(SourceKind::Secret, "tls"), "tls-9f86d08188".into());
        m.0.insert(SourceId::new(SourceKind::ConfigMap, "app"), "app-2c26b46b68".into());
        let text = m.to_annotation();
        assert_eq!(
            text,
            r#"{"configmap/app":"app-2c26b46b68","secret/tls":"tls-9f86d08188"}"#
        );
        let t = template("app-2c26b46b68", json!({ keys::SNAPSHOTS: text }));
        assert_eq!(Mapping::of(&t), m);
        let s = Snapshots::of(&t);
        assert_eq!(s.source_of(SourceKind::ConfigMap, "app-2c26b46b68"), "app");
        assert_eq!(s.source_of(SourceKind::Secret, "app-2c26b46b68"), "app-2c26b46b68");
    }

    #[test]
    fn a_recognised_snapshot_normalises_like_a_mapped_one() {
        let mapped = template(
            "app-2c26b46b68",
            json!({ keys::SNAPSHOTS: r#"{"configmap/app":"app-2c26b46b68"}"# }),
        );
        let exported = template("app-2c26b46b68", json!({}));
        assert_ne!(normalise(&exported), normalise(&mapped));
        let mut known = Snapshots::default();
        known.insert(SourceKind::ConfigMap, "app-2c26b46b68", "app");
        assert_eq!(normalise_with(&exported, &known), normalise(&mapped));
    }

    #[test]
    fn snapshot_shaped_names() {
        assert!(looks_like_snapshot("app-2c26b46b68"));
        assert!(!looks_like_snapshot("app-2C26B46B68"));
        assert!(!looks_like_snapshot("app-config"));
        assert!(!looks_like_snapshot("-2c26b46b68"));
        assert!(!looks_like_snapshot("app_2c26b46b68"));
    }

    #[test]
    fn malformed_mapping_reads_as_empty() {
        for bad in ["not json", "[1]", r#"{"volume/x":"y"}"#] {
            let t = template("x", json!({ keys::SNAPSHOTS: bad }));
            assert!(Mapping::of(&t).0.is_empty(), "{bad}");
        }
    }

    #[test]
    fn normalise_restores_source_names_and_drops_policy_marks() {
        let snap = template(
            "app-2c26b46b68",
            json!({
                keys::SNAPSHOTS: r#"{"configmap/app":"app-2c26b46b68"}"#,
                keys::RENEWED_AT: "2026-01-01T00:00:00Z",
                "config-snapshot.io/checksum-configmap-app": "abc",
            }),
        );
        let mut with_hash = snap.clone();
        with_hash["metadata"]["labels"]["pod-template-hash"] = json!("5d8f");
        with_hash["metadata"]["labels"]["batch.kubernetes.io/job-name"] = json!("nightly-1");
        with_hash["metadata"]["labels"]["rollouts-pod-template-hash"] = json!("7c9f");
        with_hash["$patch"] = json!("replace");
        let plain = template("app", json!({}));
        assert_eq!(normalise(&snap), normalise(&plain));
        assert_eq!(normalise(&with_hash), normalise(&plain));
        assert_eq!(
            normalise(&plain)["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"],
            "app"
        );
        // A user annotation is part of the template.
        let user = template("app", json!({"team": "a"}));
        assert_ne!(normalise(&user), normalise(&plain));
        // Normalising is stable.
        assert_eq!(normalise(&normalise(&snap)), normalise(&snap));
    }
}
