//! Kubewarden's field masks: prune an object to the listed dot paths, where
//! a path walks through arrays implicitly (`spec.containers.image` keeps
//! the image of every container).

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

/// Prunes `object` to `masks`. An empty mask list keeps everything.
pub fn prune(object: &Value, masks: &[String]) -> Value {
    if masks.is_empty() {
        return object.clone();
    }
    let paths: Vec<Vec<&str>> = masks.iter().map(|m| m.split('.').collect()).collect();
    let refs: Vec<&[&str]> = paths.iter().map(Vec::as_slice).collect();
    keep(object, &refs).unwrap_or(Value::Object(Map::new()))
}

fn keep(value: &Value, paths: &[&[&str]]) -> Option<Value> {
    if paths.iter().any(|p| p.is_empty()) {
        return Some(value.clone());
    }
    match value {
        Value::Object(map) => {
            let mut out = Map::new();
            for (key, child) in map {
                let rest: Vec<&[&str]> = paths.iter().filter(|p| p[0] == key).map(|p| &p[1..]).collect();
                if !rest.is_empty() {
                    if let Some(kept) = keep(child, &rest) {
                        out.insert(key.clone(), kept);
                    }
                }
            }
            Some(Value::Object(out))
        }
        Value::Array(items) => Some(Value::Array(
            items.iter().map(|i| keep(i, paths).unwrap_or(Value::Null)).collect(),
        )),
        _ => None,
    }
}

/// Serialises `value` pruned to `masks` without copying it: the list path
/// is hot, and cloning every object before pruning dominated its profile.
pub(crate) struct Masked<'a> {
    value: &'a Value,
    paths: Vec<&'a [&'a str]>,
}

impl<'a> Masked<'a> {
    /// `paths` are the masks split on `.`; empty means the whole value.
    pub fn new(value: &'a Value, paths: &'a [Vec<&'a str>]) -> Self {
        let paths: Vec<&[&str]> = paths.iter().map(Vec::as_slice).collect();
        Masked { value, paths }
    }

    fn whole(&self) -> bool {
        self.paths.is_empty() || self.paths.iter().any(|p| p.is_empty())
    }
}

impl Serialize for Masked<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.whole() {
            return self.value.serialize(s);
        }
        match self.value {
            Value::Object(map) => {
                let mut out = s.serialize_map(None)?;
                for (key, child) in map {
                    let rest: Vec<&[&str]> = self.paths.iter().filter(|p| p[0] == key).map(|p| &p[1..]).collect();
                    if rest.is_empty() {
                        continue;
                    }
                    let leaf_only = !child.is_object() && !child.is_array();
                    if leaf_only && !rest.iter().any(|p| p.is_empty()) {
                        continue;
                    }
                    out.serialize_entry(
                        key,
                        &Masked {
                            value: child,
                            paths: rest,
                        },
                    )?;
                }
                out.end()
            }
            Value::Array(items) => {
                let mut out = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    if item.is_object() || item.is_array() {
                        out.serialize_element(&Masked {
                            value: item,
                            paths: self.paths.clone(),
                        })?;
                    } else {
                        out.serialize_element(&Value::Null)?;
                    }
                }
                out.end()
            }
            // A leaf where the mask expects more structure is dropped by the
            // parent; at the top level it stands as an empty object.
            _ => Map::new().serialize(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keeps_only_masked_paths_through_arrays() {
        let obj = json!({"metadata": {"name": "a", "uid": "u"}, "spec": {"containers": [
            {"name": "c1", "image": "i1", "env": [1]}, {"name": "c2", "image": "i2"}]}, "data": {"secret": "x"}});
        let pruned = prune(&obj, &["metadata.name".into(), "spec.containers.image".into()]);
        assert_eq!(
            pruned,
            json!({"metadata": {"name": "a"}, "spec": {"containers": [{"image": "i1"}, {"image": "i2"}]}})
        );
        assert_eq!(prune(&obj, &[]), obj);
        // Array indexes survive, so JSON pointers computed on the pruned
        // object are valid on the full one.
        let p = prune(&obj, &["spec.containers.env".into()]);
        assert_eq!(p["spec"]["containers"][0]["env"], json!([1]));
        assert_eq!(p["spec"]["containers"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn masked_serialisation_equals_prune() {
        let obj = json!({"metadata": {"name": "a", "uid": "u", "labels": {"x": "y"}}, "spec": {"containers": [
            {"name": "c1", "image": "i1", "env": [1, {"a": 2}]}, "leaf", {"name": "c2"}]}, "data": {"secret": "x"}, "n": 5});
        for masks in [
            vec![],
            vec!["metadata.name", "spec.containers.env"],
            vec!["metadata", "n.deeper", "spec.containers.name"],
            vec!["nothing"],
        ] {
            let masks: Vec<String> = masks.into_iter().map(String::from).collect();
            let split: Vec<Vec<&str>> = masks.iter().map(|m| m.split('.').collect()).collect();
            let via_serialise: Value = serde_json::to_value(Masked::new(&obj, &split)).unwrap();
            assert_eq!(via_serialise, prune(&obj, &masks), "{masks:?}");
        }
    }
}

/// The field masks the watch and the sweep list with come from the same
/// field list `references::collect` reads: a template pruned to them keeps
/// every reference, so the sweep never misses one and deletes a snapshot
/// in use.
#[cfg(test)]
mod reference_tests {
    use config_snapshot_policy::model::kinds::holders;
    use config_snapshot_policy::model::references;
    use config_snapshot_policy::snapshot::holder_masks;
    use serde_json::{json, Value};

    fn every_kind() -> Value {
        serde_json::from_str(include_str!("../../../test_data/every-reference-kind.json")).unwrap()
    }

    #[test]
    fn a_template_pruned_to_the_masks_keeps_every_reference() {
        let template = every_kind();
        let all = references::collect(&template);
        assert!(all.len() >= 9, "the fixture has every kind: {all:?}");
        for row in holders() {
            let (kind, path) = (row.kind, row.template.unwrap());
            // The holder as the API server has it, with the template where
            // that kind keeps it, and unrelated fields around it.
            let mut holder = json!({"kind": kind, "metadata": {"name": "h"}, "status": {"x": 1}});
            let mut with_noise = template.clone();
            with_noise["spec"]["containers"][0]["image"] = json!("pruned:away");
            if path.is_empty() {
                holder["spec"] = with_noise["spec"].clone();
            } else {
                let mut at = &mut holder;
                for segment in path.trim_start_matches('/').split('/') {
                    at = &mut at[segment];
                }
                *at = with_noise;
                holder["spec"]["replicas"] = json!(3);
            }
            let pruned = super::prune(&holder, &holder_masks(row));
            let kept = row.template_of(&pruned).unwrap();
            let names = |refs: Vec<references::Reference>| {
                refs.into_iter()
                    .map(|r| (r.kind, r.name, r.pointer))
                    .collect::<Vec<_>>()
            };
            assert_eq!(names(references::collect(kept)), names(all.clone()), "{kind}");
            assert!(
                kept.pointer("/spec/containers/0/image").is_none(),
                "{kind}: masks keep only references"
            );
        }
    }
}
