//! Finds every place a pod template names a ConfigMap or Secret (docs/design.md, "Vocabulary").
//!
//! Works on the raw JSON so that a rewrite touches only the name field and
//! leaves every other byte of the object as the API server sent it.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::model::source::{SourceId, SourceKind};

/// One reference: where it is and what it selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub kind: SourceKind,
    /// The name as written in the template (a source or a snapshot).
    pub name: String,
    /// JSON pointer to the name field, relative to the pod template.
    pub pointer: String,
    pub optional: bool,
    /// The keys this reference reads, or `None` for the whole source.
    pub keys: Option<BTreeSet<String>>,
}

/// Every field of a pod spec that can hold a reference: `volumes`, and
/// `env` and `envFrom` of each container list. [`collect`] reads only these
/// and [`masks`] asks for exactly these, so a list pruned to the masks (the
/// watch's and the sweep's) can never hide a reference: a hidden one would
/// let the sweep delete a snapshot that is in use.
const VOLUMES: &str = "volumes";
const CONTAINER_LISTS: [&str; 3] = ["containers", "initContainers", "ephemeralContainers"];
const ENV: &str = "env";
const ENV_FROM: &str = "envFrom";

/// Kubewarden field masks covering every reference field of a pod spec
/// whose template sits at `prefix` (`spec.template.`, or `` for a Pod).
pub(crate) fn masks(prefix: &str) -> Vec<String> {
    let mut masks = vec![format!("{prefix}spec.{VOLUMES}")];
    for list in CONTAINER_LISTS {
        for field in [ENV, ENV_FROM] {
            masks.push(format!("{prefix}spec.{list}.{field}"));
        }
    }
    masks
}

/// The most distinct ConfigMaps and Secrets (by kind and name) an
/// opted-in pod template may name, counted before anything is read
/// (docs/design.md, "Limits"). Each may cost a read, a snapshot and a
/// write; a forged review of a template naming thousands would otherwise
/// make the host read thousands of objects for one request.
pub const MAX_SOURCES: usize = 64;

/// How many distinct objects (by kind and name) `refs` name.
pub(crate) fn distinct(refs: &[Reference]) -> usize {
    refs.iter()
        .map(|r| (r.kind, r.name.as_str()))
        .collect::<BTreeSet<_>>()
        .len()
}

/// Collects the references of a pod template (`{metadata, spec}`).
pub fn collect(template: &Value) -> Vec<Reference> {
    let mut out = Vec::new();
    let Some(spec) = template.get("spec") else {
        return out;
    };
    for (i, volume) in spec
        .get(VOLUMES)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        collect_volume(&mut out, volume, &format!("/spec/volumes/{i}"));
    }
    for list in CONTAINER_LISTS {
        for (c, container) in spec
            .get(list)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            collect_container(&mut out, container, &format!("/spec/{list}/{c}"));
        }
    }
    out
}

/// A volume's references: `configMap`, `secret`, and those a `projected`
/// volume's sources name.
fn collect_volume(out: &mut Vec<Reference>, volume: &Value, base: &str) {
    if let Some(cm) = volume.get("configMap") {
        push_volume_source(out, SourceKind::ConfigMap, cm, "name", &format!("{base}/configMap"));
    }
    if let Some(secret) = volume.get("secret") {
        push_volume_source(out, SourceKind::Secret, secret, "secretName", &format!("{base}/secret"));
    }
    let sources = volume
        .get("projected")
        .and_then(|p| p.get("sources"))
        .and_then(Value::as_array);
    for (j, source) in sources.into_iter().flatten().enumerate() {
        let sbase = format!("{base}/projected/sources/{j}");
        if let Some(cm) = source.get("configMap") {
            push_volume_source(out, SourceKind::ConfigMap, cm, "name", &format!("{sbase}/configMap"));
        }
        if let Some(secret) = source.get("secret") {
            push_volume_source(out, SourceKind::Secret, secret, "name", &format!("{sbase}/secret"));
        }
    }
}

/// A container's references: one key each from `env[].valueFrom`, every
/// key from `envFrom`.
fn collect_container(out: &mut Vec<Reference>, container: &Value, base: &str) {
    for (e, var) in container
        .get(ENV)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let Some(value_from) = var.get("valueFrom") else {
            continue;
        };
        for (field, kind) in [
            ("configMapKeyRef", SourceKind::ConfigMap),
            ("secretKeyRef", SourceKind::Secret),
        ] {
            if let Some(sel) = value_from.get(field) {
                let key = sel.get("key").and_then(Value::as_str).map(str::to_string);
                let path = format!("{base}/{ENV}/{e}/valueFrom/{field}");
                push(out, kind, sel, "name", path, Some(key.into_iter().collect()));
            }
        }
    }
    for (e, source) in container
        .get(ENV_FROM)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        for (field, kind) in [
            ("configMapRef", SourceKind::ConfigMap),
            ("secretRef", SourceKind::Secret),
        ] {
            if let Some(sel) = source.get(field) {
                push(out, kind, sel, "name", format!("{base}/{ENV_FROM}/{e}/{field}"), None);
            }
        }
    }
}

fn push_volume_source(out: &mut Vec<Reference>, kind: SourceKind, source: &Value, name_field: &str, base: &str) {
    // A volume with `items` projects only those keys; without, all of them.
    let keys = source.get("items").and_then(Value::as_array).and_then(|items| {
        let keys: BTreeSet<String> = items
            .iter()
            .filter_map(|item| item.get("key").and_then(Value::as_str))
            .map(str::to_string)
            .collect();
        (!keys.is_empty()).then_some(keys)
    });
    push(out, kind, source, name_field, base.to_string(), keys);
}

fn push(
    out: &mut Vec<Reference>,
    kind: SourceKind,
    selector: &Value,
    name_field: &str,
    base: String,
    keys: Option<BTreeSet<String>>,
) {
    let Some(name) = selector.get(name_field).and_then(Value::as_str) else {
        return;
    };
    // The API server refuses a template naming anything else; a review
    // carrying one is forged (or refused later): such a name is no source,
    // and nothing is read or written for it.
    if !crate::model::selection::is_dns_subdomain(name) {
        return;
    }
    out.push(Reference {
        kind,
        name: name.to_string(),
        pointer: format!("{base}/{name_field}"),
        optional: selector.get("optional").and_then(Value::as_bool).unwrap_or(false),
        keys,
    });
}

/// All references of one source in a template, after normalisation.
#[derive(Debug, Clone)]
pub struct SourceRefs {
    pub id: SourceId,
    pub refs: Vec<Reference>,
}

impl SourceRefs {
    /// The keys a snapshot must hold: the union of every reference's keys, or
    /// `None` (the whole source) as soon as one reference reads everything.
    pub fn key_subset(&self) -> Option<BTreeSet<String>> {
        let mut union = BTreeSet::new();
        for r in &self.refs {
            union.extend(r.keys.as_ref()?.iter().cloned());
        }
        Some(union)
    }

    /// A missing source is harmless only if every reference tolerates it.
    pub fn all_optional(&self) -> bool {
        self.refs.iter().all(|r| r.optional)
    }
}

/// Sets the string at `pointer` (relative to `template`). Returns false if the
/// pointer no longer resolves, which would mean the template changed under us.
pub fn set_name(template: &mut Value, pointer: &str, name: &str) -> bool {
    match template.pointer_mut(pointer) {
        Some(slot) => {
            *slot = Value::String(name.to_string());
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A template with one reference of every kind docs/design.md lists
    /// ("Vocabulary"); the host's tests use the same fixture.
    pub fn every_kind() -> Value {
        serde_json::from_str(include_str!("../../test_data/every-reference-kind.json")).unwrap()
    }

    #[test]
    fn finds_every_reference_kind() {
        let t = every_kind();
        let refs = collect(&t);
        let found: Vec<(SourceKind, &str, bool)> = refs.iter().map(|r| (r.kind, r.name.as_str(), r.optional)).collect();
        use SourceKind::*;
        assert_eq!(
            found,
            vec![
                (ConfigMap, "cm-vol", false),
                (Secret, "sec-vol", false),
                (ConfigMap, "cm-proj", false),
                (Secret, "sec-proj", true),
                (ConfigMap, "cm-env", false),
                (Secret, "sec-env", true),
                (Secret, "sec-envfrom", false),
                (ConfigMap, "cm-init", false),
                (ConfigMap, "cm-eph", false),
            ]
        );
        for r in &refs {
            assert_eq!(
                t.pointer(&r.pointer).and_then(Value::as_str),
                Some(r.name.as_str()),
                "{}",
                r.pointer
            );
        }
    }

    #[test]
    fn keys_come_from_items_and_key_refs() {
        let refs = collect(&every_kind());
        let keys = |name: &str| refs.iter().find(|r| r.name == name).unwrap().keys.clone();
        assert_eq!(keys("cm-vol"), None);
        assert_eq!(keys("sec-vol"), Some(["tls.crt".to_string()].into()));
        assert_eq!(keys("cm-proj"), Some(["a".to_string()].into()));
        assert_eq!(keys("cm-env"), Some(["k1".to_string()].into()));
        assert_eq!(keys("sec-envfrom"), None);
    }

    #[test]
    fn subset_is_whole_as_soon_as_one_ref_reads_everything() {
        let r = |keys: Option<&[&str]>| Reference {
            kind: SourceKind::ConfigMap,
            name: "x".into(),
            pointer: String::new(),
            optional: false,
            keys: keys.map(|k| k.iter().map(|s| s.to_string()).collect()),
        };
        let id = SourceId::new(SourceKind::ConfigMap, "x");
        let both = SourceRefs {
            id: id.clone(),
            refs: vec![r(Some(&["a"])), r(Some(&["b"]))],
        };
        assert_eq!(both.key_subset(), Some(["a".to_string(), "b".to_string()].into()));
        let whole = SourceRefs {
            id,
            refs: vec![r(Some(&["a"])), r(None)],
        };
        assert_eq!(whole.key_subset(), None);
    }

    #[test]
    fn set_name_rewrites_only_the_name() {
        let mut t = every_kind();
        let before = t.clone();
        assert!(set_name(&mut t, "/spec/volumes/0/configMap/name", "cm-vol-0123456789"));
        assert_eq!(t["spec"]["volumes"][0]["configMap"]["name"], "cm-vol-0123456789");
        t["spec"]["volumes"][0]["configMap"]["name"] = json!("cm-vol");
        assert_eq!(t, before);
        assert!(!set_name(&mut t, "/spec/volumes/9/configMap/name", "x"));
    }
}
