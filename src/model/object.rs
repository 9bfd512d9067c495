//! Typed reads of an object's metadata, in the spirit of kube's
//! `ResourceExt`. Objects cross the host boundary and the AdmissionReview
//! as JSON, so the policy and the host hold them as [`Value`]; reading
//! `metadata` through one trait says which fields a function uses, and a
//! typo is a compile error rather than a read of `""`.
//!
//! Absent or mistyped fields read as absent (`""` for the name, `None`
//! elsewhere): an object the API server stored always has them, and a
//! forged one must not panic the reader.

use serde_json::{Map, Value};

/// Metadata accessors on a Kubernetes object held as JSON.
pub trait ObjectExt {
    /// `metadata`, if it is an object.
    fn metadata(&self) -> Option<&Map<String, Value>>;

    /// `metadata.name` (`""` when absent: a `generateName` CREATE's).
    fn name(&self) -> &str {
        self.meta_str("name").unwrap_or_default()
    }

    /// `metadata.namespace`.
    fn namespace(&self) -> Option<&str> {
        self.meta_str("namespace")
    }

    /// `metadata.uid` (absent on a CREATE).
    fn uid(&self) -> Option<&str> {
        self.meta_str("uid")
    }

    /// `metadata.resourceVersion` (`""` when absent: a write on it is not
    /// pinned).
    fn resource_version(&self) -> &str {
        self.meta_str("resourceVersion").unwrap_or_default()
    }

    /// `metadata.creationTimestamp` (RFC 3339).
    fn creation_timestamp(&self) -> Option<&str> {
        self.meta_str("creationTimestamp")
    }

    /// `metadata.annotations`.
    fn annotations(&self) -> Option<&Map<String, Value>> {
        self.metadata()?.get("annotations")?.as_object()
    }

    /// One annotation's value, if it is a string.
    fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations()?.get(key)?.as_str()
    }

    /// Whether the annotation is there, whatever its value.
    fn has_annotation(&self, key: &str) -> bool {
        self.annotations().is_some_and(|a| a.contains_key(key))
    }

    /// `metadata.labels`.
    fn labels(&self) -> Option<&Map<String, Value>> {
        self.metadata()?.get("labels")?.as_object()
    }

    /// One label's value, if it is a string.
    fn label(&self, key: &str) -> Option<&str> {
        self.labels()?.get(key)?.as_str()
    }

    /// `metadata.ownerReferences` (empty when absent).
    fn owner_references(&self) -> &[Value] {
        self.metadata()
            .and_then(|m| m.get("ownerReferences"))
            .and_then(Value::as_array)
            .map_or(&[], Vec::as_slice)
    }

    /// The owner reference marked `controller: true`: the one owner that
    /// manages the object (a ReplicaSet's Deployment, a Pod's ReplicaSet).
    fn controller(&self) -> Option<&Value> {
        self.owner_references().iter().find(|r| r["controller"] == true)
    }

    /// `metadata.generation`.
    fn generation(&self) -> Option<i64> {
        self.metadata()?.get("generation")?.as_i64()
    }

    /// Whether `metadata.deletionTimestamp` is set: the object is going.
    fn is_deleting(&self) -> bool {
        self.metadata()
            .and_then(|m| m.get("deletionTimestamp"))
            .is_some_and(|t| !t.is_null())
    }

    /// A field of `metadata` as it is, to copy it whole.
    fn meta(&self, field: &str) -> Option<&Value> {
        self.metadata()?.get(field)
    }

    /// A string field of `metadata`.
    fn meta_str(&self, field: &str) -> Option<&str> {
        self.metadata()?.get(field)?.as_str()
    }

    /// `metadata`, to write: made an object if it is absent or is not one.
    /// `None` only when the object itself is not a JSON object.
    fn metadata_mut(&mut self) -> Option<&mut Map<String, Value>>;

    /// Sets one field of `metadata`.
    fn set_meta(&mut self, field: &str, value: Value) {
        if let Some(meta) = self.metadata_mut() {
            meta.insert(field.to_string(), value);
        }
    }

    /// Takes one field of `metadata` away, and returns it. An object with
    /// no metadata is left as it is.
    fn remove_meta(&mut self, field: &str) -> Option<Value> {
        self.metadata()?;
        self.metadata_mut()?.remove(field)
    }

    /// `metadata.annotations`, to write: made an object if absent.
    fn annotations_mut(&mut self) -> Option<&mut Map<String, Value>> {
        map_field(self.metadata_mut()?, "annotations")
    }

    /// `metadata.labels`, to write: made an object if absent.
    fn labels_mut(&mut self) -> Option<&mut Map<String, Value>> {
        map_field(self.metadata_mut()?, "labels")
    }

    /// Sets one annotation.
    fn set_annotation(&mut self, key: &str, value: Value) {
        if let Some(a) = self.annotations_mut() {
            a.insert(key.to_string(), value);
        }
    }
}

/// A field of `map` that holds a map, made one if it is absent or is not.
fn map_field<'a>(map: &'a mut Map<String, Value>, field: &str) -> Option<&'a mut Map<String, Value>> {
    let slot = map.entry(field).or_insert_with(|| Value::Object(Map::new()));
    if !slot.is_object() {
        *slot = Value::Object(Map::new());
    }
    slot.as_object_mut()
}

impl ObjectExt for Value {
    fn metadata(&self) -> Option<&Map<String, Value>> {
        self.get("metadata")?.as_object()
    }

    fn metadata_mut(&mut self) -> Option<&mut Map<String, Value>> {
        map_field(self.as_object_mut()?, "metadata")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_what_is_there_and_nothing_else() {
        let o = json!({"metadata": {
            "name": "web", "namespace": "team-a", "uid": "u1", "resourceVersion": "7",
            "annotations": {"a": "1", "n": 2}, "labels": {"app": "web"},
            "ownerReferences": [{"uid": "o1"}]}});
        assert_eq!(o.name(), "web");
        assert_eq!(o.namespace(), Some("team-a"));
        assert_eq!(o.uid(), Some("u1"));
        assert_eq!(o.resource_version(), "7");
        assert_eq!(o.annotation("a"), Some("1"));
        assert_eq!(o.annotation("n"), None, "not a string");
        assert_eq!(o.label("app"), Some("web"));
        assert_eq!(o.owner_references().len(), 1);

        for forged in [
            json!(null),
            json!([]),
            json!({"metadata": "x"}),
            json!({"metadata": {"name": 3}}),
        ] {
            assert_eq!(forged.name(), "");
            assert_eq!(forged.namespace(), None);
            assert_eq!(forged.resource_version(), "");
            assert!(forged.annotations().is_none());
            assert!(forged.owner_references().is_empty());
        }
    }

    #[test]
    fn writes_make_what_is_missing_and_keep_the_rest() {
        let mut o = json!({"kind": "ConfigMap"});
        o.set_annotation("a", json!("1"));
        o.labels_mut().unwrap().insert("app".into(), json!("web"));
        o.set_meta("name", json!("x"));
        assert_eq!(
            o,
            json!({"kind": "ConfigMap", "metadata": {"annotations": {"a": "1"}, "labels": {"app": "web"}, "name": "x"}})
        );
        o.set_annotation("b", json!("2"));
        assert_eq!(o.annotation("a"), Some("1"), "kept");
        assert_eq!(o.remove_meta("labels"), Some(json!({"app": "web"})));
        assert_eq!(o.labels(), None);
        let mut bare = json!({"kind": "ConfigMap"});
        assert_eq!(bare.remove_meta("annotations"), None);
        assert_eq!(bare, json!({"kind": "ConfigMap"}), "nothing made to take nothing away");

        let mut forged = json!({"metadata": {"annotations": "x"}});
        forged.set_annotation("a", json!("1"));
        assert_eq!(
            forged.annotation("a"),
            Some("1"),
            "a non-map is replaced, not panicked on"
        );
        let mut not_an_object = json!([1]);
        not_an_object.set_annotation("a", json!("1"));
        assert_eq!(not_an_object, json!([1]));
    }
}
