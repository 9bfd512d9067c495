//! A snapshot is proven, not labelled (docs/security.md): the host signs
//! what it creates with an HMAC under a per-installation key that only it
//! reads, and acts on a labelled object (sweeps, adopts, deletes, reuses
//! it, skips it as its own write) only once it verifies.
//!
//! The signature covers the snapshot's kind, namespace, name, source and
//! content hash; verification recomputes the content hash from the data,
//! checks the name is the one that content gets, and that the object is
//! immutable. The same key makes Secret snapshots' names: their hash part
//! is an HMAC of the content hash, so a name reveals nothing about a
//! Secret's value to someone without the key (ConfigMaps keep the plain
//! SHA-256: anyone who can read the name can read the ConfigMap).
//!
//! Snapshots made before the key existed (an upgrade from a version that
//! trusted the label) are legacy: immutable, named for their content, and
//! created before the key. The periodic pass signs them; anything labelled
//! after the key was made and not signed is a forgery, left alone.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use config_snapshot_policy::content::{hex, snapshot_name, Content};
use config_snapshot_policy::duration::parse_rfc3339;
use config_snapshot_policy::keys;
use config_snapshot_policy::source::SourceKind;
use ring::hmac;
use serde_json::Value;
use zeroize::Zeroizing;

use crate::cluster::{self, Cluster, Preconditions, Selector};

/// The annotation that carries a snapshot's signature.
pub const SIGNATURE: &str = "config-snapshot.io/signature";

/// The purpose a snapshot's signature is made for: a MAC made for another
/// (a Secret's name) is never one.
const SIGNED: &str = "config-snapshot/snapshot/v1";

/// Lowercase or uppercase hex to bytes; `None` if it is not hex.
fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || text.len() > 128 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// A key's length: HMAC-SHA256's block-sized key.
pub const KEY_BYTES: usize = 32;

/// The installation's key, and when it came to be.
pub struct Prover {
    key: hmac::Key,
    /// Unix seconds: snapshots created before are legacy.
    since: i64,
}

/// Why a labelled object is not a proven snapshot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unproven {
    #[error("it lacks config-snapshot's label")]
    Unlabelled,
    #[error("it is not a ConfigMap or a Secret")]
    Kind,
    #[error("it is not immutable")]
    Mutable,
    #[error("it names no source")]
    NoSource,
    #[error("its content does not match its content hash")]
    Content,
    #[error("its name is not the one its content gets")]
    Name,
    #[error("it carries no signature")]
    Unsigned,
    #[error("its signature does not verify")]
    Signature,
}

fn annotation<'a>(object: &'a Value, key: &str) -> Option<&'a str> {
    object["metadata"]["annotations"][key].as_str()
}

impl Prover {
    /// A prover with `key` (at least 16 bytes; [`KEY_BYTES`] made here)
    /// that came to be at `since` (unix seconds).
    pub fn new(key: &[u8], since: i64) -> Prover {
        Prover {
            key: hmac::Key::new(hmac::HMAC_SHA256, key),
            since,
        }
    }

    /// A fresh random key.
    pub fn generate_key() -> Zeroizing<Vec<u8>> {
        use ring::rand::SecureRandom;
        let mut key = Zeroizing::new(vec![0u8; KEY_BYTES]);
        ring::rand::SystemRandom::new()
            .fill(&mut key)
            .expect("the system's random source works");
        key
    }

    /// Replay's prover: a fixed, public key, so that a scenario's names
    /// are the same on every run. Never a cluster's.
    pub fn replay() -> Prover {
        Prover::new(Prover::REPLAY_KEY, i64::MIN)
    }

    /// Replay's public key: a serve given it (`--signing-key-file`) names
    /// Secret snapshots as the scenarios pin them. Never a cluster's.
    pub const REPLAY_KEY: &'static [u8] = b"config-snapshot replay: a public key for offline scenarios";

    /// What a MAC covers: the parts, each ended by a NUL (no part holds
    /// one: names, hashes and a fixed purpose), so no two lists of parts
    /// make the same message.
    fn message(parts: &[&str]) -> Vec<u8> {
        let mut message = Vec::with_capacity(parts.iter().map(|p| p.len() + 1).sum());
        for part in parts {
            message.extend_from_slice(part.as_bytes());
            message.push(0);
        }
        message
    }

    fn mac(&self, parts: &[&str]) -> String {
        hex(hmac::sign(&self.key, &Prover::message(parts)).as_ref())
    }

    /// The hash part of a Secret snapshot's name: keyed, per source. Not
    /// per namespace, so that a scenario names its snapshots the same in
    /// any namespace (as a ConfigMap's plain name does); equal Secrets of
    /// one name in two namespaces share a name, which tells only that.
    pub fn secret_digest(&self, source: &str, content_hash: &str) -> String {
        self.mac(&["config-snapshot/secret-name/v1", source, content_hash])
    }

    /// The name the snapshot of `content` from `source` gets.
    pub fn snapshot_name(&self, source: &str, content: &Content) -> String {
        self.name_for(content.kind, source, &content.hash())
    }

    /// The name a snapshot of `kind` from `source` gets for content whose
    /// hash is `content_hash`: plain for a ConfigMap, keyed for a Secret
    /// (docs/hash-spec.md).
    pub fn name_for(&self, kind: SourceKind, source: &str, content_hash: &str) -> String {
        match kind {
            SourceKind::ConfigMap => snapshot_name(source, content_hash),
            SourceKind::Secret => snapshot_name(source, &self.secret_digest(source, content_hash)),
        }
    }

    fn signature_of(&self, kind: &str, namespace: &str, name: &str, source: &str, content_hash: &str) -> String {
        self.mac(&[SIGNED, kind, namespace, name, source, content_hash])
    }

    /// Signs a snapshot object the host is about to create (or found
    /// legacy): the signature annotation over what it is.
    pub fn sign(&self, snapshot: &mut Value) {
        let meta = &snapshot["metadata"];
        let signature = self.signature_of(
            snapshot["kind"].as_str().unwrap_or_default(),
            meta["namespace"].as_str().unwrap_or_default(),
            meta["name"].as_str().unwrap_or_default(),
            annotation(snapshot, keys::SOURCE_NAME).unwrap_or_default(),
            annotation(snapshot, keys::CONTENT_HASH).unwrap_or_default(),
        );
        if !snapshot["metadata"]["annotations"].is_object() {
            snapshot["metadata"]["annotations"] = serde_json::json!({});
        }
        snapshot["metadata"]["annotations"][SIGNATURE] = Value::String(signature);
    }

    /// What the object is, signature aside: labelled, a ConfigMap or
    /// Secret, immutable, naming its source, its content what its hash
    /// says and its name what that content gets.
    fn well_formed(&self, object: &Value) -> Result<(), Unproven> {
        if !keys::is_snapshot(object) {
            return Err(Unproven::Unlabelled);
        }
        let kind = object["kind"]
            .as_str()
            .and_then(SourceKind::from_kind)
            .ok_or(Unproven::Kind)?;
        if object["immutable"] != true {
            return Err(Unproven::Mutable);
        }
        let source = annotation(object, keys::SOURCE_NAME)
            .filter(|s| !s.is_empty())
            .ok_or(Unproven::NoSource)?;
        let content = Content::from_object(kind, object).map_err(|_| Unproven::Content)?;
        let hash = content.hash();
        if annotation(object, keys::CONTENT_HASH) != Some(hash.as_str()) {
            return Err(Unproven::Content);
        }
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        // A Secret snapshot made before names were keyed has the plain
        // name; its signature (given at migration) covers it.
        let plain = snapshot_name(source, &hash);
        if name != self.snapshot_name(source, &content) && name != plain {
            return Err(Unproven::Name);
        }
        Ok(())
    }

    /// `Ok` when `object` is a snapshot this installation made.
    pub fn verify(&self, object: &Value) -> Result<(), Unproven> {
        self.well_formed(object)?;
        let given = annotation(object, SIGNATURE).ok_or(Unproven::Unsigned)?;
        let tag = unhex(given).ok_or(Unproven::Signature)?;
        let meta = &object["metadata"];
        let message = Prover::message(&[
            SIGNED,
            object["kind"].as_str().unwrap_or_default(),
            meta["namespace"].as_str().unwrap_or_default(),
            meta["name"].as_str().unwrap_or_default(),
            annotation(object, keys::SOURCE_NAME).unwrap_or_default(),
            annotation(object, keys::CONTENT_HASH).unwrap_or_default(),
        ]);
        // ring compares the tags in constant time.
        hmac::verify(&self.key, &message, &tag).map_err(|_| Unproven::Signature)
    }

    pub fn proves(&self, object: &Value) -> bool {
        self.verify(object).is_ok()
    }

    /// Whether the host may act on `object` as its snapshot: proven, or
    /// legacy (made before the key; the periodic pass signs it).
    pub fn ours(&self, object: &Value) -> bool {
        self.proves(object) || self.legacy(object)
    }

    /// Whether `object` carries our label without being ours: a forgery,
    /// left alone, counted and reported.
    pub fn forged(&self, object: &Value) -> bool {
        keys::is_snapshot(object) && !self.ours(object)
    }

    /// `object` as the guest may see it: our label only on what is ours.
    /// The policy decides "a snapshot" by the label; a label is not proof,
    /// so the host shows it only where it is.
    pub fn shown(&self, object: &Value) -> Option<Value> {
        if !self.forged(object) {
            return None;
        }
        let mut shown = object.clone();
        if let Some(labels) = shown["metadata"]["labels"].as_object_mut() {
            labels.remove(keys::MANAGED_BY);
        }
        Some(shown)
    }

    /// Whether `object` is a snapshot made before this key existed, by a
    /// version that trusted the label: well formed, unsigned, and created
    /// before the key. The periodic pass signs it.
    pub fn legacy(&self, object: &Value) -> bool {
        annotation(object, SIGNATURE).is_none()
            && self.well_formed(object).is_ok()
            && object["metadata"]["creationTimestamp"]
                .as_str()
                .and_then(parse_rfc3339)
                .is_some_and(|created| created < self.since)
    }
}

/// What a host does with an admitted write of a ConfigMap or Secret that
/// carries our label.
#[derive(Debug, PartialEq)]
pub enum Screen {
    /// Not labelled, or not a source: the policy decides as usual.
    Policy,
    /// A write of a proven snapshot (the host's own, or metadata on one):
    /// nothing to decide, allowed untouched.
    Ours,
    /// Labelled but not ours: the policy sees it as the plain ConfigMap or
    /// Secret it is, without the label that would make it skip it.
    Unlabel(Value),
}

impl Prover {
    /// How an admission request (JSON) for a write of `object` is
    /// screened: the webhook's "skip our own writes", on proof rather than
    /// on the label (an objectSelector would let anyone's labelled write
    /// through unreviewed).
    pub fn screen(&self, request: &Value) -> Screen {
        let object = &request["object"];
        if !keys::is_snapshot(object) {
            return Screen::Policy;
        }
        if self.ours(object) {
            return Screen::Ours;
        }
        let mut request = request.clone();
        for field in ["object", "oldObject"] {
            if let Some(shown) = self.shown(&request[field]) {
                request[field] = shown;
            }
        }
        Screen::Unlabel(request)
    }
}

/// A cluster as the host acts on it: objects that carry our label without
/// proof are seen without it, so no decision of the host (sweep, adopt,
/// bridge, reuse, delete, watch) ever takes one for a snapshot. Writes
/// pass through.
pub struct Proven<C> {
    inner: C,
    prover: Arc<Prover>,
}

impl<C> Proven<C> {
    pub fn new(inner: C, prover: Arc<Prover>) -> Proven<C> {
        Proven { inner, prover }
    }

    pub fn prover(&self) -> &Prover {
        &self.prover
    }

    /// The cluster as it is, labels and all: for the one step that looks
    /// at what carries the label (signing legacy snapshots, reporting
    /// forged ones).
    pub fn raw(&self) -> &C {
        &self.inner
    }

    fn seen(&self, object: Value) -> Value {
        self.prover.shown(&object).unwrap_or(object)
    }
}

impl<C, D> Cluster for Proven<C>
where
    C: Deref<Target = D> + Send + Sync,
    D: Cluster + ?Sized,
{
    fn get(&self, kind: &str, namespace: &str, name: &str) -> cluster::Result<Option<Value>> {
        Ok(self.inner.get(kind, namespace, name)?.map(|o| self.seen(o)))
    }

    fn get_fresh(&self, kind: &str, namespace: &str, name: &str) -> cluster::Result<Option<Value>> {
        Ok(self.inner.get_fresh(kind, namespace, name)?.map(|o| self.seen(o)))
    }

    fn list(
        &self,
        kind: &str,
        namespace: Option<&str>,
        selector: &Selector,
        visit: &mut dyn FnMut(&Value),
    ) -> cluster::Result<()> {
        // Listing is the hot path: only a forgery is copied. A selector on
        // our label is judged on the object as seen, label removed.
        if !selector.mentions(keys::MANAGED_BY) {
            return self
                .inner
                .list(kind, namespace, selector, &mut |o| match self.prover.shown(o) {
                    None => visit(o),
                    Some(shown) => visit(&shown),
                });
        }
        let wider = selector.without(keys::MANAGED_BY);
        self.inner
            .list(kind, namespace, &wider, &mut |o| match self.prover.shown(o) {
                None if selector.matches(o) => visit(o),
                None => {}
                Some(shown) if selector.matches(&shown) => visit(&shown),
                Some(_) => {}
            })
    }

    fn list_referencing(
        &self,
        kind: &str,
        namespace: &str,
        source: &config_snapshot_policy::source::SourceId,
        visit: &mut dyn FnMut(&Value),
    ) -> cluster::Result<()> {
        // Workloads: never labelled snapshots.
        self.inner.list_referencing(kind, namespace, source, visit)
    }

    fn create(&self, object: Value) -> cluster::Result<()> {
        self.inner.create(object)
    }

    fn concurrent_writes(&self) -> bool {
        self.inner.concurrent_writes()
    }

    fn patch(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
        resource_version: &str,
        ops: Vec<Value>,
    ) -> cluster::Result<()> {
        self.inner.patch(kind, namespace, name, resource_version, ops)
    }

    fn delete(&self, kind: &str, namespace: &str, name: &str, preconditions: &Preconditions) -> cluster::Result<()> {
        self.inner.delete(kind, namespace, name, preconditions)
    }

    fn now(&self) -> i64 {
        self.inner.now()
    }
}

impl fmt::Debug for Prover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.debug_struct("Prover")
            .field("since", &self.since)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use config_snapshot_policy::content::snapshot_object;
    use config_snapshot_policy::duration::format_rfc3339;
    use config_snapshot_policy::source::SourceId;
    use serde_json::json;

    const SINCE: i64 = 1_800_000_000;

    fn prover() -> Prover {
        Prover::new(b"a test key of thirty-two bytes!!", SINCE)
    }

    fn made(p: &Prover, kind: SourceKind, data: Value) -> Value {
        let content = Content::from_object(kind, &json!({ "data": data })).unwrap();
        let name = p.snapshot_name("app", &content);
        let mut object = snapshot_object(&SourceId::new(kind, "app"), "shop", &name, "7", &content);
        object["metadata"]["creationTimestamp"] = json!(format_rfc3339(SINCE + 10));
        p.sign(&mut object);
        object
    }

    #[test]
    fn what_the_host_signed_verifies_and_nothing_forged_does() {
        let p = prover();
        let good = made(&p, SourceKind::ConfigMap, json!({"mode": "blue"}));
        assert_eq!(p.verify(&good), Ok(()));
        let mut relabelled = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kube-proxy", "namespace": "kube-system",
                         "labels": {keys::MANAGED_BY: keys::MANAGED_BY_VALUE}},
            "data": {"config": "x"}});
        assert_eq!(
            p.verify(&relabelled),
            Err(Unproven::Mutable),
            "a labelled real ConfigMap"
        );
        relabelled["immutable"] = json!(true);
        assert_eq!(p.verify(&relabelled), Err(Unproven::NoSource));
        // Another key's signature does not verify.
        let other = Prover::new(b"another key, also thirty-two by!", SINCE);
        assert_eq!(
            other.verify(&good),
            Err(Unproven::Signature),
            "another installation's snapshot"
        );
        let mut copied = good.clone();
        copied["metadata"]["annotations"][SIGNATURE] = json!(other.signature_of("ConfigMap", "shop", "x", "app", "y"));
        assert_eq!(p.verify(&copied), Err(Unproven::Signature));
        // The signature bound to one namespace fails in another.
        let mut moved = good.clone();
        moved["metadata"]["namespace"] = json!("kube-system");
        assert_eq!(p.verify(&moved), Err(Unproven::Signature));
        // Data that is not what the hash says.
        let mut tampered = good.clone();
        tampered["data"]["mode"] = json!("green");
        assert_eq!(p.verify(&tampered), Err(Unproven::Content));
        let mut unsigned = good.clone();
        unsigned["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(SIGNATURE);
        assert_eq!(p.verify(&unsigned), Err(Unproven::Unsigned));
    }

    /// A Secret snapshot's name is keyed: the same content gets another
    /// name under another key or in another namespace, and the plain
    /// SHA-256 of its content appears nowhere in it.
    #[test]
    fn secret_names_are_keyed() {
        let p = prover();
        let content = Content::from_object(SourceKind::Secret, &json!({"data": {"pw": "aHVudGVyMg=="}})).unwrap();
        let name = p.snapshot_name("db", &content);
        assert!(!name.contains(&content.hash()[..10]), "{name}");
        let other = Prover::new(b"another key, also thirty-two by!", SINCE);
        assert_ne!(other.snapshot_name("db", &content), name);
        assert_ne!(p.snapshot_name("other-db", &content), name);
        assert_eq!(p.snapshot_name("db", &content), name, "deterministic");
        let secret = made(&p, SourceKind::Secret, json!({"pw": "aHVudGVyMg=="}));
        assert_eq!(p.verify(&secret), Ok(()));
        // ConfigMaps keep the plain, reproducible name.
        let cm = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"a": "1"}})).unwrap();
        assert_eq!(p.snapshot_name("app", &cm), snapshot_name("app", &cm.hash()));
    }

    #[test]
    fn only_well_formed_unsigned_snapshots_older_than_the_key_are_legacy() {
        let p = prover();
        let mut old = made(&p, SourceKind::ConfigMap, json!({"mode": "blue"}));
        old["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(SIGNATURE);
        old["metadata"]["creationTimestamp"] = json!(format_rfc3339(SINCE - 3600));
        assert!(p.legacy(&old));
        let mut after = old.clone();
        after["metadata"]["creationTimestamp"] = json!(format_rfc3339(SINCE + 1));
        assert!(!p.legacy(&after), "labelled after the key: a forgery");
        let mut mutable = old.clone();
        mutable["immutable"] = json!(false);
        assert!(!p.legacy(&mutable));
        let mut undated = old.clone();
        undated["metadata"].as_object_mut().unwrap().remove("creationTimestamp");
        assert!(!p.legacy(&undated));
        p.sign(&mut old);
        assert!(p.proves(&old) && !p.legacy(&old), "signed at migration");
    }

    #[test]
    fn the_key_never_prints() {
        assert!(!format!("{:?}", prover()).contains("thirty"));
    }
}
