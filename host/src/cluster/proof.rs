//! A snapshot is proven, not labelled (docs/security.md): the host signs
//! what it creates with an HMAC under a per-installation keyring that only
//! it reads, and acts on a labelled object (sweeps, adopts, deletes, reuses
//! it, skips it as its own write) only once it verifies.
//!
//! The signature covers the snapshot's kind, namespace, name, source and
//! content hash, recomputed from its data; verification also checks the
//! name is one that content gets and that the object is immutable. The
//! current key signs and names; every key of the ring still verifies, so a
//! rotated or restored key leaves what it signed proven.
//!
//! A Secret snapshot's name is keyed too (docs/hash-spec.md): its hash part
//! is an HMAC of the namespace, the source's name and the content hash, so
//! a name reveals nothing about a Secret's value to someone without the
//! key, and a name read in one namespace is no oracle in another. Names
//! given by earlier schemes (unkeyed, then keyed without the namespace)
//! stay valid for what carries them: upgrading renames nothing.
//! ConfigMaps keep the plain SHA-256: anyone who can read the name can
//! read the ConfigMap.
//!
//! Nothing is ours because of when it was made: an unsigned object is
//! unproven, whatever its age. An installation upgraded from a version
//! that did not sign signs its earlier snapshots once, by a command an
//! operator runs (`config-snapshot keys sign-unsigned`).

use config_snapshot_policy::model::object::ObjectExt;
use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, RwLock};

use config_snapshot_policy::model::content::{hex, snapshot_name, Content};
use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::source::SourceKind;
use ring::hmac;
use serde_json::Value;
use sha2::Digest as _;
use zeroize::Zeroizing;

use crate::cluster::{self, Cluster, Preconditions, Selector};

/// The annotation that carries a snapshot's signature.
pub const SIGNATURE: &str = "config-snapshot.io/signature";

/// The field in place of a source's data in serve's cache
/// ([`Prover::digested`]). Only the cache writes it: the API server stores
/// no such field, and a review's objects are cleared of it before they are
/// judged ([`Prover::screen`]).
pub(crate) const DIGESTED: &str = "$config-snapshot-digested";

/// Whether `object` is a source as serve's cache keeps it, without its
/// data: whoever needs the data reads it fresh.
pub(crate) fn digested(object: &Value) -> bool {
    object.get(DIGESTED).is_some()
}

/// The purpose a snapshot's signature is made for: a MAC made for another
/// (a Secret's name) is never one.
const SIGNED: &str = "config-snapshot/snapshot/v1";

/// The purposes of a Secret snapshot name's MAC: with the namespace (v2),
/// and without it (v1, the names made until it was added).
const SECRET_NAME_V2: &str = "config-snapshot/secret-name/v2";
const SECRET_NAME_V1: &str = "config-snapshot/secret-name/v1";

/// The purpose of a content's keyed digest, which serve's cache keeps of a
/// Secret instead of its data.
const CONTENT_DIGEST: &str = "config-snapshot/content-digest/v1";

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
pub(crate) const KEY_BYTES: usize = 32;

/// The least key length accepted: below, a key could be guessed.
pub(crate) const MIN_KEY_BYTES: usize = 16;

/// The keys of an installation: the first signs and names, every one
/// verifies. Never printed.
#[derive(Clone)]
pub struct Keyring {
    keys: Vec<Zeroizing<Vec<u8>>>,
}

/// Why a keyring cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyringError {
    #[error("a keyring has at least one key")]
    Empty,
    #[error("a key has at least {MIN_KEY_BYTES} bytes, not {0}")]
    Short(usize),
    #[error("a keyring holds at most {MAX_KEYS} keys, not {0}")]
    TooMany(usize),
}

/// The most keys a ring holds: each costs a MAC per verification.
pub(crate) const MAX_KEYS: usize = 16;

impl Keyring {
    /// A ring of `keys`, the current one first.
    pub fn new(keys: Vec<Zeroizing<Vec<u8>>>) -> Result<Keyring, KeyringError> {
        if keys.is_empty() {
            return Err(KeyringError::Empty);
        }
        if keys.len() > MAX_KEYS {
            return Err(KeyringError::TooMany(keys.len()));
        }
        if let Some(short) = keys.iter().find(|k| k.len() < MIN_KEY_BYTES) {
            return Err(KeyringError::Short(short.len()));
        }
        let mut unique: Vec<Zeroizing<Vec<u8>>> = Vec::with_capacity(keys.len());
        for key in keys {
            if !unique.iter().any(|k| **k == *key) {
                unique.push(key);
            }
        }
        Ok(Keyring { keys: unique })
    }

    /// A ring of one key.
    pub fn of(key: &[u8]) -> Result<Keyring, KeyringError> {
        Keyring::new(vec![Zeroizing::new(key.to_vec())])
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

    /// The keys, the current one first.
    pub fn keys(&self) -> &[Zeroizing<Vec<u8>>] {
        &self.keys
    }

    /// The same ring with `key` current, and the current one kept to
    /// verify.
    pub fn rotated(&self, key: Zeroizing<Vec<u8>>) -> Result<Keyring, KeyringError> {
        let mut keys = vec![key];
        keys.extend(self.keys.iter().cloned());
        Keyring::new(keys)
    }

    /// The same ring with `other`'s keys added to verify (a restore: what
    /// the backup's keys signed is proven again, and the current key
    /// stays current).
    pub fn merged(&self, other: &Keyring) -> Result<Keyring, KeyringError> {
        let mut keys = self.keys.clone();
        keys.extend(other.keys.iter().cloned());
        Keyring::new(keys)
    }

    /// A key's public name: the start of a hash of it, for logs and for
    /// `config-snapshot keys list`. Tells nothing of the key.
    pub fn id(key: &[u8]) -> String {
        let mut hash = sha2::Sha256::new();
        hash.update(b"config-snapshot/key-id/v1\0");
        hash.update(key);
        hex(&hash.finalize())[..12].to_string()
    }

    /// The ids of the keys, the current one first.
    pub fn ids(&self) -> Vec<String> {
        self.keys.iter().map(|k| Keyring::id(k)).collect()
    }
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never a key: their ids.
        f.debug_struct("Keyring").field("ids", &self.ids()).finish()
    }
}

/// The keyring as the MACs use it.
struct Ring {
    macs: Vec<hmac::Key>,
    ids: Vec<String>,
}

impl Ring {
    fn of(keyring: &Keyring) -> Ring {
        Ring {
            macs: keyring
                .keys
                .iter()
                .map(|k| hmac::Key::new(hmac::HMAC_SHA256, k))
                .collect(),
            ids: keyring.ids(),
        }
    }

    fn current(&self) -> &hmac::Key {
        &self.macs[0]
    }
}

/// The installation's keyring, which a running host may be given anew
/// ([`Prover::replace`]): replicas pick up a rotated or restored ring
/// without a restart.
pub struct Prover {
    ring: RwLock<Arc<Ring>>,
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

/// What a MAC covers: the parts, each ended by a NUL (no part holds one:
/// names, hashes and a fixed purpose), so no two lists of parts make the
/// same message.
fn message(parts: &[&str]) -> Vec<u8> {
    let mut message = Vec::with_capacity(parts.iter().map(|p| p.len() + 1).sum());
    for part in parts {
        message.extend_from_slice(part.as_bytes());
        message.push(0);
    }
    message
}

fn mac_with(key: &hmac::Key, parts: &[&str]) -> String {
    hex(hmac::sign(key, &message(parts)).as_ref())
}

impl Prover {
    /// A prover with the one key `key` (at least [`MIN_KEY_BYTES`]).
    ///
    /// # Panics
    /// On a shorter key: a fixed key of the code's own (tests, replay).
    pub fn new(key: &[u8]) -> Prover {
        Prover::with(&Keyring::of(key).expect("a key of at least 16 bytes"))
    }

    /// A prover with `keyring`.
    pub fn with(keyring: &Keyring) -> Prover {
        Prover {
            ring: RwLock::new(Arc::new(Ring::of(keyring))),
        }
    }

    /// Uses `keyring` from now on: the host was given a rotated or restored
    /// ring.
    pub fn replace(&self, keyring: &Keyring) {
        *self.ring.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Ring::of(keyring));
    }

    fn ring(&self) -> Arc<Ring> {
        self.ring.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The ids of the keys in use, the current one first.
    pub fn key_ids(&self) -> Vec<String> {
        self.ring().ids.clone()
    }

    /// A fresh random key.
    pub fn generate_key() -> Zeroizing<Vec<u8>> {
        Keyring::generate_key()
    }

    /// Replay's prover: a fixed, public key, so that a scenario's names
    /// are the same on every run. Never a cluster's.
    pub fn replay() -> Prover {
        Prover::new(Prover::REPLAY_KEY)
    }

    /// Replay's public key: a serve given it (`--signing-key-file`) names
    /// Secret snapshots as the scenarios pin them. Never a cluster's.
    pub const REPLAY_KEY: &'static [u8] = b"config-snapshot replay: a public key for offline scenarios";

    /// The hash part of a Secret snapshot's name: keyed, per namespace and
    /// source, so that the same value of a Secret of the same name in two
    /// namespaces gets two unrelated names.
    pub fn secret_digest(&self, namespace: &str, source: &str, content_hash: &str) -> String {
        mac_with(
            self.ring().current(),
            &[SECRET_NAME_V2, namespace, source, content_hash],
        )
    }

    /// The name the snapshot of `content` from `source` in `namespace`
    /// gets.
    pub fn snapshot_name(&self, namespace: &str, source: &str, content: &Content) -> String {
        self.name_for(content.kind, namespace, source, &content.hash())
    }

    /// The name a snapshot of `kind` from `source` in `namespace` gets for
    /// content whose hash is `content_hash`: plain for a ConfigMap, keyed
    /// for a Secret (docs/hash-spec.md).
    pub fn name_for(&self, kind: SourceKind, namespace: &str, source: &str, content_hash: &str) -> String {
        match kind {
            SourceKind::ConfigMap => snapshot_name(source, content_hash),
            SourceKind::Secret => snapshot_name(source, &self.secret_digest(namespace, source, content_hash)),
        }
    }

    /// Every name this installation may have given the snapshot of this
    /// content: [`Prover::name_for`]'s first, then for a Secret the names
    /// of every key of the ring and of the earlier schemes (keyed without
    /// the namespace, and unkeyed, from before names were keyed). A
    /// snapshot keeps the name it was made with: upgrading or rotating
    /// renames nothing.
    pub fn names_for(&self, kind: SourceKind, namespace: &str, source: &str, content_hash: &str) -> Vec<String> {
        let mut names = vec![self.name_for(kind, namespace, source, content_hash)];
        if kind == SourceKind::Secret {
            let ring = self.ring();
            for key in &ring.macs {
                for digest in [
                    mac_with(key, &[SECRET_NAME_V2, namespace, source, content_hash]),
                    mac_with(key, &[SECRET_NAME_V1, source, content_hash]),
                ] {
                    names.push(snapshot_name(source, &digest));
                }
            }
            names.push(snapshot_name(source, content_hash));
        }
        let mut seen = std::collections::HashSet::new();
        names.retain(|n| seen.insert(n.clone()));
        names
    }

    /// A keyed digest of a content, under the current key: what serve's
    /// cache keeps of a Secret instead of its data. Equal contents have
    /// equal digests; the digest tells nothing to whoever lacks the key.
    pub fn content_digest(&self, content_hash: &str) -> String {
        mac_with(self.ring().current(), &[CONTENT_DIGEST, content_hash])
    }

    fn signature_of(&self, kind: &str, namespace: &str, name: &str, source: &str, content_hash: &str) -> String {
        mac_with(
            self.ring().current(),
            &[SIGNED, kind, namespace, name, source, content_hash],
        )
    }

    /// Signs a snapshot object the host is about to create: the signature
    /// annotation over what it is, its content hash computed from its data.
    pub fn sign(&self, snapshot: &mut Value) {
        let kind = snapshot["kind"].as_str().and_then(SourceKind::from_kind);
        let hash = kind
            .and_then(|k| Content::from_object(k, snapshot).ok())
            .map(|c| c.hash())
            .unwrap_or_default();
        let signature = self.signature_of(
            snapshot["kind"].as_str().unwrap_or_default(),
            snapshot.namespace().unwrap_or_default(),
            snapshot.name(),
            snapshot.annotation(keys::SOURCE_NAME).unwrap_or_default(),
            &hash,
        );
        snapshot.set_annotation(SIGNATURE, Value::String(signature));
    }

    /// What the object is, signature aside: labelled, a ConfigMap or
    /// Secret, immutable, naming its source, its content what its content
    /// hash annotation says (a ConfigMap's; a Secret snapshot carries none
    /// since the hash is unkeyed, or did before and says it right) and its
    /// name one that content gets. The content's hash, if so.
    fn well_formed(&self, object: &Value) -> Result<String, Unproven> {
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
        let source = object
            .annotation(keys::SOURCE_NAME)
            .filter(|s| !s.is_empty())
            .ok_or(Unproven::NoSource)?;
        let content = Content::from_object(kind, object).map_err(|_| Unproven::Content)?;
        let hash = content.hash();
        match (kind, object.annotation(keys::CONTENT_HASH)) {
            (_, Some(said)) if said != hash => return Err(Unproven::Content),
            (SourceKind::ConfigMap, None) => return Err(Unproven::Content),
            _ => {}
        }
        let name = object.name();
        let namespace = object.namespace().unwrap_or_default();
        if !self.names_for(kind, namespace, source, &hash).iter().any(|n| n == name) {
            return Err(Unproven::Name);
        }
        Ok(hash)
    }

    /// `Ok` when `object` is a snapshot this installation made: well
    /// formed, and signed by a key of the ring. A source as serve's cache
    /// keeps it ([`Prover::digested`]) was judged when it was cached.
    pub fn verify(&self, object: &Value) -> Result<(), Unproven> {
        if let Some(cached) = object.get(DIGESTED) {
            return match cached["unproven"].as_str() {
                None if keys::is_snapshot(object) => Ok(()),
                None => Err(Unproven::Unlabelled),
                Some(_) => Err(Unproven::Signature),
            };
        }
        let hash = self.well_formed(object)?;
        let given = object.annotation(SIGNATURE).ok_or(Unproven::Unsigned)?;
        let tag = unhex(given).ok_or(Unproven::Signature)?;
        let message = message(&[
            SIGNED,
            object["kind"].as_str().unwrap_or_default(),
            object.namespace().unwrap_or_default(),
            object.name(),
            object.annotation(keys::SOURCE_NAME).unwrap_or_default(),
            &hash,
        ]);
        // ring compares the tags in constant time.
        let ring = self.ring();
        if ring.macs.iter().any(|key| hmac::verify(key, &message, &tag).is_ok()) {
            Ok(())
        } else {
            Err(Unproven::Signature)
        }
    }

    /// Why `object` is not a proven snapshot, in words (`""` if it is): as
    /// serve's cache judged it, or judged now.
    pub fn why_unproven(&self, object: &Value) -> String {
        match object.get(DIGESTED).map(|d| &d["unproven"]) {
            Some(Value::String(why)) => why.clone(),
            _ => self.verify(object).err().map(|e| e.to_string()).unwrap_or_default(),
        }
    }

    pub fn proves(&self, object: &Value) -> bool {
        self.verify(object).is_ok()
    }

    /// `object` (a ConfigMap or Secret as read) as serve's cache keeps it:
    /// its metadata, its type, and in place of its data a keyed digest of
    /// its content and the verdict on its proof, both made now. A cache of
    /// every Secret's data would hold the cluster's credentials in serve's
    /// memory for nothing: the policy reads sources fresh, a rollout's
    /// snapshot is made from a fresh read, and a reuse compares digests.
    /// A changed keyring makes both stale: the cache lists sources again.
    pub fn digested(&self, object: &Value) -> Value {
        let kind = object["kind"].as_str().and_then(SourceKind::from_kind);
        let digest = kind
            .and_then(|k| Content::from_object(k, object).ok())
            .map(|c| self.content_digest(&c.hash()))
            .unwrap_or_default();
        let unproven = match self.verify(object) {
            Ok(()) => Value::Null,
            Err(why) => Value::String(why.to_string()),
        };
        let mut kept = serde_json::Map::new();
        for field in ["apiVersion", "kind", "metadata", "type", "immutable"] {
            if let Some(value) = object.get(field) {
                kept.insert(field.to_string(), value.clone());
            }
        }
        kept.insert(
            DIGESTED.to_string(),
            serde_json::json!({"digest": digest, "unproven": unproven}),
        );
        Value::Object(kept)
    }

    /// Whether `object`, as read or as the cache keeps it, holds `content`.
    pub fn holds(&self, object: &Value, content: &Content) -> bool {
        self.holds_hash(object, content.kind, &content.hash())
    }

    /// Whether `object`, a `kind` as read or as the cache keeps it, holds
    /// the content whose hash is `content_hash`.
    pub fn holds_hash(&self, object: &Value, kind: SourceKind, content_hash: &str) -> bool {
        match object.get(DIGESTED) {
            Some(cached) => cached["digest"].as_str() == Some(self.content_digest(content_hash).as_str()),
            None => Content::from_object(kind, object).is_ok_and(|c| c.hash() == content_hash),
        }
    }

    /// Whether the host may act on `object` as its snapshot: proven.
    pub fn ours(&self, object: &Value) -> bool {
        self.proves(object)
    }

    /// Whether `object` carries our label without being ours: a forgery,
    /// or a snapshot signed by a key the ring no longer holds; left alone,
    /// counted and reported.
    pub fn forged(&self, object: &Value) -> bool {
        keys::is_snapshot(object) && !self.ours(object)
    }

    /// Whether `object` is well formed and unsigned: a snapshot made by a
    /// version that did not sign, or a forgery of one. Only an operator
    /// can tell them apart (`config-snapshot keys sign-unsigned` lists and
    /// signs them); the host never does.
    pub fn unsigned(&self, object: &Value) -> bool {
        object.annotation(SIGNATURE).is_none() && self.well_formed(object).is_ok()
    }

    /// `object` as the guest may see it: our label only on what is ours.
    /// The policy decides "a snapshot" by the label; a label is not proof,
    /// so the host shows it only where it is.
    pub fn shown(&self, object: &Value) -> Option<Value> {
        if !self.forged(object) {
            return None;
        }
        let mut shown = object.clone();
        if let Some(labels) = shown.labels_mut() {
            labels.remove(keys::MANAGED_BY);
        }
        Some(shown)
    }
}

/// Whose a write of a ConfigMap or Secret is, as its proof says, and so
/// what a host does with it. `T` is the request the policy then reviews:
/// JSON here, raw text in serve (`serve::admission`).
#[derive(Debug, PartialEq)]
pub enum Provenance<T = Value> {
    /// Not labelled, or not a source: the policy decides as usual.
    Policy,
    /// A write of a proven snapshot (the host's own, or metadata on one):
    /// nothing to decide, allowed untouched.
    Ours,
    /// Labelled but not ours: the policy sees it as the plain ConfigMap or
    /// Secret it is, without the label that would make it skip it.
    Unlabel(T),
}

impl Prover {
    /// Whose write an admission request (JSON) is: the webhook's "skip our
    /// own writes", on proof rather than on the label (an objectSelector
    /// would let anyone's labelled write through unreviewed).
    pub fn provenance(&self, request: &Value) -> Provenance {
        // A review's objects never speak for the cache.
        if ["object", "oldObject"]
            .iter()
            .any(|f| request[f].get(DIGESTED).is_some())
        {
            let mut cleared = request.clone();
            for field in ["object", "oldObject"] {
                if let Some(object) = cleared.get_mut(field).and_then(Value::as_object_mut) {
                    object.remove(DIGESTED);
                }
            }
            return match self.provenance(&cleared) {
                Provenance::Policy => Provenance::Unlabel(cleared),
                other => other,
            };
        }
        let object = &request["object"];
        if !keys::is_snapshot(object) {
            return Provenance::Policy;
        }
        if self.ours(object) {
            return Provenance::Ours;
        }
        let mut request = request.clone();
        for field in ["object", "oldObject"] {
            if let Some(shown) = self.shown(&request[field]) {
                request[field] = shown;
            }
        }
        Provenance::Unlabel(request)
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
        source: &config_snapshot_policy::model::source::SourceId,
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
        // Never a key: their ids.
        f.debug_struct("Prover").field("keys", &self.key_ids()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use config_snapshot_policy::model::content::snapshot_object;
    use config_snapshot_policy::model::source::SourceId;
    use serde_json::json;

    const KEY: &[u8] = b"a test key of thirty-two bytes!!";
    const OTHER: &[u8] = b"another key, also thirty-two by!";

    fn prover() -> Prover {
        Prover::new(KEY)
    }

    fn made_in(p: &Prover, namespace: &str, kind: SourceKind, data: Value) -> Value {
        let content = Content::from_object(kind, &json!({ "data": data })).unwrap();
        let name = p.snapshot_name(namespace, "app", &content);
        let mut object = snapshot_object(&SourceId::new(kind, "app"), namespace, &name, "7", &content);
        p.sign(&mut object);
        object
    }

    fn made(p: &Prover, kind: SourceKind, data: Value) -> Value {
        made_in(p, "shop", kind, data)
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
        let other = Prover::new(OTHER);
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
    /// name under another key, for another source, or in another
    /// namespace (a name read in `prod` is no oracle in `dev`), and the
    /// plain SHA-256 of its content appears nowhere on it.
    #[test]
    fn secret_names_are_keyed_per_namespace_and_carry_no_plain_hash() {
        let p = prover();
        let content = Content::from_object(SourceKind::Secret, &json!({"data": {"pw": "aHVudGVyMg=="}})).unwrap();
        let name = p.snapshot_name("prod", "db", &content);
        assert!(!name.contains(&content.hash()[..10]), "{name}");
        assert_ne!(Prover::new(OTHER).snapshot_name("prod", "db", &content), name);
        assert_ne!(p.snapshot_name("prod", "other-db", &content), name);
        assert_ne!(p.snapshot_name("dev", "db", &content), name, "per namespace");
        assert_eq!(p.snapshot_name("prod", "db", &content), name, "deterministic");
        let secret = made_in(&p, "prod", SourceKind::Secret, json!({"pw": "aHVudGVyMg=="}));
        assert_eq!(p.verify(&secret), Ok(()));
        let text = secret.to_string();
        assert!(!text.contains(&content.hash()), "no unkeyed hash on it: {text}");
        assert!(!secret.has_annotation(keys::CONTENT_HASH));
        // ConfigMaps keep the plain, reproducible name and hash.
        let cm = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"a": "1"}})).unwrap();
        assert_eq!(p.snapshot_name("prod", "app", &cm), snapshot_name("app", &cm.hash()));
        assert_eq!(p.snapshot_name("dev", "app", &cm), snapshot_name("app", &cm.hash()));
    }

    /// Secret snapshots named by earlier schemes stay proven: keyed without
    /// the namespace (c7d6a24's), and unkeyed (before names were keyed).
    /// Upgrading renames nothing, so no template changes.
    #[test]
    fn names_of_earlier_schemes_stay_valid() {
        let p = prover();
        let content = Content::from_object(SourceKind::Secret, &json!({"data": {"pw": "aHVudGVyMg=="}})).unwrap();
        let hash = content.hash();
        let v1 = snapshot_name("app", &mac_with(p.ring().current(), &[SECRET_NAME_V1, "app", &hash]));
        let plain = snapshot_name("app", &hash);
        let names = p.names_for(SourceKind::Secret, "shop", "app", &hash);
        assert_eq!(names[0], p.snapshot_name("shop", "app", &content));
        assert!(names.contains(&v1) && names.contains(&plain), "{names:?}");
        for name in [v1, plain] {
            let mut old = snapshot_object(&SourceId::new(SourceKind::Secret, "app"), "shop", &name, "7", &content);
            // As those versions made them: with the content hash.
            old["metadata"]["annotations"][keys::CONTENT_HASH] = json!(hash);
            p.sign(&mut old);
            assert_eq!(p.verify(&old), Ok(()), "{name}");
            let mut lying = old.clone();
            lying["metadata"]["annotations"][keys::CONTENT_HASH] = json!("0".repeat(64));
            assert_eq!(p.verify(&lying), Err(Unproven::Content));
        }
    }

    /// After a rotation the new key signs and names, and what the old one
    /// signed still verifies; a ring that lost the old key no longer
    /// proves it.
    #[test]
    fn a_rotated_ring_still_proves_what_its_older_keys_signed() {
        let old = Keyring::of(KEY).unwrap();
        let p = Prover::with(&old);
        let before = made(&p, SourceKind::Secret, json!({"pw": "b2xk"}));
        let rotated = old.rotated(Zeroizing::new(OTHER.to_vec())).unwrap();
        p.replace(&rotated);
        assert_eq!(p.key_ids(), vec![Keyring::id(OTHER), Keyring::id(KEY)]);
        assert_eq!(p.verify(&before), Ok(()), "signed and named by the old key");
        let after = made(&p, SourceKind::Secret, json!({"pw": "b2xk"}));
        assert_ne!(
            after["metadata"]["name"], before["metadata"]["name"],
            "the new key names"
        );
        assert_eq!(p.verify(&after), Ok(()));
        assert!(Prover::new(KEY).verify(&after).is_err(), "another installation's");
        p.replace(&Keyring::of(OTHER).unwrap());
        assert!(p.verify(&before).is_err(), "the old key gone: unproven, left alone");
        assert_eq!(Keyring::of(b"short").err(), Some(KeyringError::Short(5)));
        assert_eq!(
            rotated.merged(&old).unwrap().ids(),
            rotated.ids(),
            "a restore adds no key twice"
        );
    }

    /// Nothing is ours because of when it was made: an unsigned snapshot
    /// is unproven, whatever its age, and only listed as unsigned.
    #[test]
    fn an_unsigned_snapshot_is_never_ours() {
        let p = prover();
        let mut old = made(&p, SourceKind::ConfigMap, json!({"mode": "blue"}));
        old["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(SIGNATURE);
        old["metadata"]["creationTimestamp"] = json!("2000-01-01T00:00:00Z");
        assert!(!p.ours(&old) && p.forged(&old));
        assert!(p.unsigned(&old));
        let mut mutable = old.clone();
        mutable["immutable"] = json!(false);
        assert!(!p.unsigned(&mutable));
        p.sign(&mut old);
        assert!(p.proves(&old) && !p.unsigned(&old));
    }

    /// serve's cache keeps a source without its data: a keyed digest in
    /// its place, and the verdict on its proof, which stand for them.
    #[test]
    fn a_digested_source_keeps_no_data_and_stands_for_it() {
        let p = prover();
        let ours = made(&p, SourceKind::Secret, json!({"pw": "aHVudGVyMg=="}));
        let kept = p.digested(&ours);
        assert!(kept.get("data").is_none() && digested(&kept), "{kept}");
        assert!(!kept.to_string().contains("aHVudGVyMg=="));
        assert_eq!(p.verify(&kept), Ok(()), "proven as it was cached");
        let content = Content::from_object(SourceKind::Secret, &ours).unwrap();
        assert!(p.holds(&kept, &content) && p.holds(&ours, &content));
        let other = Content::from_object(SourceKind::Secret, &json!({"data": {"pw": "eA=="}})).unwrap();
        assert!(!p.holds(&kept, &other));
        let mut forged = ours.clone();
        forged["metadata"]["annotations"][SIGNATURE] = json!("00");
        assert!(p.forged(&p.digested(&forged)), "a forgery stays one");
        let plain = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"}, "data": {"pw": "eA=="}});
        assert!(!keys::is_snapshot(&p.digested(&plain)) && p.verify(&p.digested(&plain)).is_err());
        // A review cannot pass a forgery off as the cache's verdict.
        let mut pretend = forged.clone();
        pretend[DIGESTED] = json!({"digest": "", "unproven": null});
        let review = json!({"object": pretend, "oldObject": null});
        assert!(matches!(p.provenance(&review), Provenance::Unlabel(_)));
    }

    #[test]
    fn the_key_never_prints() {
        let p = prover();
        let printed = format!("{p:?} {:?}", Keyring::of(KEY).unwrap());
        assert!(!printed.contains("thirty"), "{printed}");
        assert!(printed.contains(&Keyring::id(KEY)), "{printed}");
    }
}
