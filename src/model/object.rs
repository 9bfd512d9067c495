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

    /// A string field of `metadata`.
    fn meta_str(&self, field: &str) -> Option<&str> {
        self.metadata()?.get(field)?.as_str()
    }
}

impl ObjectExt for Value {
    fn metadata(&self) -> Option<&Map<String, Value>> {
        self.get("metadata")?.as_object()
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
}
