//! Kubewarden's field masks: prune an object to the listed dot paths, where
//! a path walks through arrays implicitly (`spec.containers.image` keeps
//! the image of every container).

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
}
