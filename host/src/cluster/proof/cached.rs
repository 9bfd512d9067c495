//! A source (ConfigMap or Secret) as serve's cache keeps it: what its
//! readers need of it, and nothing that may carry its data
//! (docs/security.md, "What it promises").
//!
//! Its data goes, for a keyed digest of its content and the verdict on its
//! proof, made when it is cached: the policy reads sources fresh, a watch
//! rollout's snapshot is made from a fresh read, and a reuse compares
//! digests. Its metadata is kept by allow-list, not by taking out what is
//! known to carry data: `kubectl apply` (and Argo CD's default sync) writes
//! the whole manifest it applied, a Secret's `stringData` in plain text,
//! into `kubectl.kubernetes.io/last-applied-configuration`, and any other
//! tool may write what it likes into an annotation of its own. So of the
//! annotations only config-snapshot's own are kept.
//!
//! What the cache's readers read of a source, and why each field stays
//! (the sweep, the reuse and the anchor in `src/admit/sweep.rs`, the
//! capability's reads and `snapshot_name`, the lifecycle's pass and
//! collection, each through the Cluster trait's `get` and `list`):
//!
//! - `name`, `namespace`, `uid`, `resourceVersion`: which object, and the
//!   version a write or a delete is pinned to;
//! - `creationTimestamp`: a snapshot's age, for the sweep and the reuse;
//! - `deletionTimestamp`: an object on its way out;
//! - `labels`: the selectors that find snapshots (the managed-by and
//!   source labels) and the user's own. A label's value is at most 63
//!   characters of a restricted alphabet, and no tool writes data there;
//! - `ownerReferences`: who owns a snapshot, and its anchor;
//! - annotations under `config-snapshot.io/`: a snapshot's source, content
//!   hash, source version, last use and signature. Nothing but
//!   config-snapshot (and a user who means to) writes them.
//!
//! `managedFields`, `finalizers`, `generateName` and every other
//! annotation go: no reader needs them.

use config_snapshot_policy::model::content::Content;
use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::source::SourceKind;
use serde_json::{Map, Value};

use super::{Prover, DIGESTED};

/// The fields of a source's metadata its cached copy keeps (annotations
/// apart: [`kept_annotations`]).
const KEPT_METADATA: [&str; 8] = [
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "labels",
    "ownerReferences",
];

/// The top-level fields a source's cached copy keeps besides its metadata
/// and [`DIGESTED`]: never `data`, `binaryData` or `stringData`.
const KEPT_FIELDS: [&str; 4] = ["apiVersion", "kind", "type", "immutable"];

/// The metadata of a source as its cached copy keeps it.
fn kept_metadata(metadata: &Value) -> Map<String, Value> {
    let mut kept: Map<String, Value> = KEPT_METADATA
        .iter()
        .filter_map(|field| Some((field.to_string(), metadata.get(*field)?.clone())))
        .collect();
    if let Some(annotations) = kept_annotations(metadata) {
        kept.insert("annotations".into(), Value::Object(annotations));
    }
    kept
}

/// config-snapshot's own annotations of `metadata`, if it has any.
fn kept_annotations(metadata: &Value) -> Option<Map<String, Value>> {
    let ours: Map<String, Value> = metadata
        .get("annotations")?
        .as_object()?
        .iter()
        .filter(|(name, _)| name.starts_with(keys::PREFIX))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    (!ours.is_empty()).then_some(ours)
}

impl Prover {
    /// `object` (a ConfigMap or Secret as read) as serve's cache keeps it:
    /// the fields and metadata its readers need (the module's list), and in
    /// place of its data a keyed digest of its content and the verdict on
    /// its proof, both made now. A changed keyring makes both stale: the
    /// cache lists sources again.
    pub(crate) fn digested(&self, object: &Value) -> Value {
        let kind = object["kind"].as_str().and_then(SourceKind::from_kind);
        let digest = kind
            .and_then(|k| Content::from_object(k, object).ok())
            .map(|c| self.content_digest(&c.hash()))
            .unwrap_or_default();
        let unproven = match self.verify(object) {
            Ok(()) => Value::Null,
            Err(why) => Value::String(why.to_string()),
        };
        let mut kept: Map<String, Value> = KEPT_FIELDS
            .iter()
            .filter_map(|field| Some((field.to_string(), object.get(*field)?.clone())))
            .collect();
        if let Some(metadata) = object.get("metadata") {
            kept.insert("metadata".into(), Value::Object(kept_metadata(metadata)));
        }
        kept.insert(
            DIGESTED.to_string(),
            serde_json::json!({"digest": digest, "unproven": unproven}),
        );
        Value::Object(kept)
    }
}
