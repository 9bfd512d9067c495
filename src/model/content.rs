//! Content addressing (docs/design.md, "Content addressing and key subsets"): the canonical form of a source's content,
//! its sha256, the snapshot name, and the snapshot object itself.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use crate::model::keys;
use crate::model::source::{SourceId, SourceKind};

/// Why an object's content cannot be read: the API server would not have
/// stored it, so only a forged or corrupt object gets here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContentError {
    #[error("{field}.{key} is not a string")]
    NotAString { field: &'static str, key: String },
    #[error("{field} is not a map")]
    NotAMap { field: &'static str },
}

/// What a snapshot holds: the part of a source the hash covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Content {
    #[serde(rename = "binaryData")]
    pub binary_data: BTreeMap<String, String>,
    pub data: BTreeMap<String, String>,
    #[serde(serialize_with = "kind_name")]
    pub kind: SourceKind,
    #[serde(rename = "type")]
    pub type_: String,
}

fn kind_name<S: serde::Serializer>(kind: &SourceKind, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(kind.kind())
}

impl Content {
    /// Reads the content of a ConfigMap or Secret object. `data` values are
    /// taken as they appear in the API object (base64 for a Secret). A Secret
    /// without `type` is `Opaque`, as the API server defaults it.
    pub fn from_object(kind: SourceKind, object: &Value) -> Result<Content, ContentError> {
        let data = string_map(object.get("data"), "data")?;
        let binary_data = string_map(object.get("binaryData"), "binaryData")?;
        let type_ = match kind {
            SourceKind::ConfigMap => String::new(),
            SourceKind::Secret => object
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("Opaque")
                .to_string(),
        };
        Ok(Content {
            binary_data,
            data,
            kind,
            type_,
        })
    }

    /// The canonical JSON the hash covers: fields and keys sorted, no
    /// whitespace, an empty map written `{}`. serde_json's string escaping is
    /// deterministic, which makes the form reproducible in any language that
    /// escapes only `"`, `\` and control characters.
    pub(crate) fn canonical_json(&self) -> String {
        serde_json::to_string(self).expect("string maps always serialise")
    }

    /// Full lowercase hex sha256 of the canonical JSON.
    pub fn hash(&self) -> String {
        let digest = Sha256::digest(self.canonical_json().as_bytes());
        hex(&digest)
    }

    /// Keeps only `keys` (when given); used when every reference selects keys.
    pub fn subset(&self, keys: Option<&BTreeSet<String>>) -> Content {
        let Some(keys) = keys else {
            return self.clone();
        };
        let pick = |m: &BTreeMap<String, String>| {
            m.iter()
                .filter(|(k, _)| keys.contains(*k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        Content {
            binary_data: pick(&self.binary_data),
            data: pick(&self.data),
            kind: self.kind,
            type_: self.type_.clone(),
        }
    }
}

fn string_map(value: Option<&Value>, field: &'static str) -> Result<BTreeMap<String, String>, ContentError> {
    match value {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                _ => Err(ContentError::NotAString { field, key: k.clone() }),
            })
            .collect(),
        Some(_) => Err(ContentError::NotAMap { field }),
    }
}

pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// The snapshot of `content` under its plain name: how the host names a
/// ConfigMap's; for tests and tools that make one by hand (a Secret's name
/// is keyed by the host).
pub fn plain_snapshot(source: &SourceId, namespace: &str, rv: &str, content: &Content) -> (String, Value) {
    let name = snapshot_name(&source.name, &content.hash());
    let object = snapshot_object(source, namespace, &name, rv, content);
    (name, object)
}

/// `<source>-<first 10 hex of hash>`, with the source part cut so the name
/// stays a valid DNS subdomain of at most 253 characters.
pub fn snapshot_name(source: &str, hash: &str) -> String {
    const SUFFIX: usize = 11; // '-' + 10 hex
    let mut base = &source[..source.len().min(253 - SUFFIX)];
    // A cut can leave a trailing '-' or '.', which a subdomain may not end in
    // before our '-'; "a.-b" is invalid too.
    base = base.trim_end_matches(['-', '.']);
    format!("{base}-{}", &hash[..10])
}

/// The `config-snapshot.io/source` label value: the name, or a hash of it when
/// the name is longer than a label value may be.
pub(crate) fn source_label(source: &str) -> String {
    if source.len() <= 63 {
        source.to_string()
    } else {
        hex(&Sha256::digest(source.as_bytes()))[..40].to_string()
    }
}

/// The label selector of the snapshots of `source` (of either kind: the
/// kind is the list's): what the sweep and `config-snapshot revoke` list.
/// A selector only narrows the list; the source-name annotation decides.
pub fn snapshots_of(source: &str) -> String {
    format!(
        "{}={},{}={}",
        keys::MANAGED_BY,
        keys::MANAGED_BY_VALUE,
        keys::SOURCE_LABEL,
        source_label(source)
    )
}

/// The snapshot object `name` for `content` taken from `source`
/// (docs/design.md, "What config-snapshot writes"). Only our own labels and
/// annotations: copying GitOps tracking labels would make Argo CD or Flux
/// prune the copy. The name is the caller's: a ConfigMap's is
/// [`snapshot_name`] of the content hash, a Secret's is keyed by the host
/// (`HostApi::snapshot_name`).
pub fn snapshot_object(
    source: &SourceId,
    namespace: &str,
    name: &str,
    source_resource_version: &str,
    content: &Content,
) -> Value {
    let mut annotations = json!({
        keys::SOURCE_NAME: source.name,
        keys::SOURCE_RESOURCE_VERSION: source_resource_version,
    });
    // A Secret's plain content hash would let anyone who reads metadata
    // test guesses of its value: its snapshot carries none (its keyed name
    // says what it holds).
    if source.kind == SourceKind::ConfigMap {
        annotations[keys::CONTENT_HASH] = json!(content.hash());
    }
    let mut object = Map::new();
    object.insert("apiVersion".into(), json!("v1"));
    object.insert("kind".into(), json!(source.kind.kind()));
    object.insert(
        "metadata".into(),
        json!({
            "name": name,
            "namespace": namespace,
            "labels": {
                keys::MANAGED_BY: keys::MANAGED_BY_VALUE,
                keys::SOURCE_LABEL: source_label(&source.name),
            },
            "annotations": annotations,
        }),
    );
    object.insert("immutable".into(), json!(true));
    if source.kind == SourceKind::Secret {
        object.insert("type".into(), json!(content.type_));
    }
    if !content.data.is_empty() {
        object.insert("data".into(), json!(content.data));
    }
    if !content.binary_data.is_empty() {
        object.insert("binaryData".into(), json!(content.binary_data));
    }
    Value::Object(object)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::object::ObjectExt;
    use crate::model::selection::is_dns_subdomain;

    fn cm(data: &[(&str, &str)]) -> Content {
        Content {
            binary_data: BTreeMap::new(),
            data: data.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            kind: SourceKind::ConfigMap,
            type_: String::new(),
        }
    }

    /// Golden vectors: the same table is in docs/hash-spec.md. Changing the
    /// canonical form renames every snapshot in every cluster, so these must
    /// never change silently.
    #[test]
    fn golden_vectors() {
        let empty = cm(&[]);
        assert_eq!(
            empty.canonical_json(),
            r#"{"binaryData":{},"data":{},"kind":"ConfigMap","type":""}"#
        );
        assert_eq!(empty.hash(), GOLDEN[0].1);

        let app = cm(&[("b", "2"), ("a", "1")]);
        assert_eq!(
            app.canonical_json(),
            r#"{"binaryData":{},"data":{"a":"1","b":"2"},"kind":"ConfigMap","type":""}"#
        );
        assert_eq!(app.hash(), GOLDEN[1].1);

        let secret = Content {
            binary_data: BTreeMap::new(),
            data: [("tls.key".to_string(), "c2VjcmV0".to_string())].into(),
            kind: SourceKind::Secret,
            type_: "kubernetes.io/tls".to_string(),
        };
        assert_eq!(
            secret.canonical_json(),
            r#"{"binaryData":{},"data":{"tls.key":"c2VjcmV0"},"kind":"Secret","type":"kubernetes.io/tls"}"#
        );
        assert_eq!(secret.hash(), GOLDEN[2].1);

        let binary = Content {
            binary_data: [("logo.png".to_string(), "iVBORw0K".to_string())].into(),
            data: [("quote".to_string(), "say \"hi\"\n".to_string())].into(),
            kind: SourceKind::ConfigMap,
            type_: String::new(),
        };
        assert_eq!(
            binary.canonical_json(),
            r#"{"binaryData":{"logo.png":"iVBORw0K"},"data":{"quote":"say \"hi\"\n"},"kind":"ConfigMap","type":""}"#
        );
        assert_eq!(binary.hash(), GOLDEN[3].1);
    }

    pub const GOLDEN: [(&str, &str); 4] = [
        (
            "empty ConfigMap",
            "bc400e759f6cb2d211d0eb6ae487a5f49dc8e54667bdcf3c555198900f208a42",
        ),
        (
            "ConfigMap a=1,b=2",
            "a2921f6cd4dadd82b9bc8bde759cd0e853adfe0cdbedc34b56b797cd0da5623d",
        ),
        (
            "Secret tls",
            "50b2bfce9c81793bba72b1e1498cbfe81129f73c6acc72840f77312e0118cd5f",
        ),
        (
            "binaryData and escapes",
            "38d78c6105b4e01ef4e0e0353f1b74503227b4263e7a3df5bac845af16af9422",
        ),
    ];

    #[test]
    fn hash_ignores_key_order_and_kind_matters() {
        let a = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"x": "1", "y": "2"}})).unwrap();
        let b = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"y": "2", "x": "1"}})).unwrap();
        assert_eq!(a.hash(), b.hash());
        let s = Content::from_object(SourceKind::Secret, &json!({"data": {"x": "1", "y": "2"}})).unwrap();
        assert_ne!(a.hash(), s.hash());
        assert_eq!(s.type_, "Opaque");
    }

    #[test]
    fn subset_keeps_selected_keys_of_both_maps() {
        let c = Content::from_object(
            SourceKind::ConfigMap,
            &json!({"data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA==", "d": "AQ=="}}),
        )
        .unwrap();
        let keys: BTreeSet<String> = ["a".to_string(), "d".to_string()].into();
        let sub = c.subset(Some(&keys));
        assert_eq!(sub.data.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(sub.binary_data.keys().collect::<Vec<_>>(), ["d"]);
        assert_eq!(c.subset(None), c);
        let other_keys_changed = Content::from_object(
            SourceKind::ConfigMap,
            &json!({"data": {"a": "1", "b": "CHANGED"}, "binaryData": {"c": "AA==", "d": "AQ=="}}),
        )
        .unwrap();
        assert_eq!(other_keys_changed.subset(Some(&keys)).hash(), sub.hash());
    }

    #[test]
    fn malformed_content_is_an_error() {
        assert!(Content::from_object(SourceKind::ConfigMap, &json!({"data": {"a": 1}})).is_err());
        assert!(Content::from_object(SourceKind::ConfigMap, &json!({"data": []})).is_err());
    }

    #[test]
    fn names_stay_valid_subdomains_of_at_most_253() {
        let hash = cm(&[]).hash();
        assert_eq!(snapshot_name("app", &hash), format!("app-{}", &hash[..10]));
        for len in [1, 60, 241, 242, 243, 253] {
            for filler in ["a", "a-", "a."] {
                let source: String = filler.repeat(len).chars().take(len).collect();
                let source = source.trim_end_matches(['-', '.']).to_string();
                let name = snapshot_name(&source, &hash);
                assert!(name.len() <= 253, "{} chars", name.len());
                assert!(is_dns_subdomain(&name), "{name}");
                assert!(name.ends_with(&hash[..10]));
            }
        }
    }

    #[test]
    fn snapshot_object_carries_only_our_metadata() {
        let id = SourceId::new(SourceKind::Secret, "x".repeat(70));
        let content = Content::from_object(
            SourceKind::Secret,
            &json!({"type": "kubernetes.io/tls", "data": {"k": "dg=="}}),
        )
        .unwrap();
        let obj = snapshot_object(&id, "ns", "x-0123456789", "42", &content);
        assert_eq!(obj["metadata"]["name"], "x-0123456789");
        assert_eq!(obj["immutable"], true);
        assert_eq!(obj["type"], "kubernetes.io/tls");
        assert_eq!(obj.labels().unwrap().len(), 2);
        let label = obj.label(keys::SOURCE_LABEL).unwrap();
        assert!(label.len() <= 63);
        assert!(
            !obj.has_annotation(keys::CONTENT_HASH),
            "a Secret snapshot carries no unkeyed hash of its value"
        );
        assert_eq!(obj["metadata"]["annotations"][keys::SOURCE_RESOURCE_VERSION], "42");
        let cm = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"k": "v"}})).unwrap();
        assert_eq!(Content::from_object(SourceKind::Secret, &obj).unwrap(), content);
        let cm_obj = snapshot_object(&SourceId::new(SourceKind::ConfigMap, "x"), "ns", "x-0", "42", &cm);
        assert_eq!(cm_obj["metadata"]["annotations"][keys::CONTENT_HASH], cm.hash());
    }
}
