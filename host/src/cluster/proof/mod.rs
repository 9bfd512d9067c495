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
//! A snapshot's name is keyed too (docs/hash-spec.md): its hash part is an
//! HMAC of the kind, the namespace, the source's name and the content hash,
//! so a name reveals nothing about the content to someone without the key
//! (a reader of pod templates, whoever learned the door's path), and a
//! name read in one namespace is no oracle in another. Names given by
//! earlier schemes (unkeyed, then for a Secret keyed without the namespace)
//! stay valid for what carries them: upgrading renames nothing.
//!
//! Nothing is ours because of when it was made: an unsigned object is
//! unproven, whatever its age. An installation upgraded from a version
//! that did not sign signs its earlier snapshots once, by a command an
//! operator runs (`config-snapshot keys sign-unsigned`).

use config_snapshot_policy::model::object::ObjectExt;
use std::fmt;
use std::sync::{Arc, RwLock};

use config_snapshot_policy::model::content::{hex, snapshot_name, Content};
use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::source::SourceKind;
use ring::hmac;
use serde_json::Value;
use zeroize::Zeroizing;

mod cached;
mod keyring;
pub mod proven;

pub use keyring::Keyring;
use keyring::Ring;
pub(crate) use keyring::MIN_KEY_BYTES;

/// The annotation that carries a snapshot's signature.
pub const SIGNATURE: &str = "config-snapshot.io/signature";

/// The field in place of a source's data in serve's cache
/// ([`Prover::digested`], with what else the cache keeps of a source).
/// Only the cache writes it: the API server stores
/// no such field (it drops unknown fields of a ConfigMap or Secret), and
/// no review of a source is judged (docs/design.md, "Watch").
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

/// The purpose of a ConfigMap snapshot name's MAC (before it, ConfigMap
/// snapshots had the plain hash's name).
const CONFIGMAP_NAME_V1: &str = "config-snapshot/configmap-name/v1";

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
    pub(crate) fn key_ids(&self) -> Vec<String> {
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

    /// The hash part of a snapshot's name under `key`: keyed, per kind,
    /// namespace and source, so that the same content of a source of the
    /// same name in two namespaces gets two unrelated names, and a name
    /// tells nothing of the content to whoever lacks the key.
    fn name_digest(key: &hmac::Key, kind: SourceKind, namespace: &str, source: &str, content_hash: &str) -> String {
        let purpose = match kind {
            SourceKind::ConfigMap => CONFIGMAP_NAME_V1,
            SourceKind::Secret => SECRET_NAME_V2,
        };
        mac_with(key, &[purpose, namespace, source, content_hash])
    }

    /// The name the snapshot of `content` from `source` in `namespace`
    /// gets.
    pub fn snapshot_name(&self, namespace: &str, source: &str, content: &Content) -> String {
        self.name_for(content.kind, namespace, source, &content.hash())
    }

    /// The name a snapshot of `kind` from `source` in `namespace` gets for
    /// content whose hash is `content_hash`: keyed under the current key
    /// (docs/hash-spec.md). A ConfigMap's too: whoever learned the door's
    /// path can have serve name the snapshot of any namespace's ConfigMap,
    /// and anyone may be allowed to read Deployments but not ConfigMaps; a
    /// plain hash would let either test guesses of the content.
    pub(crate) fn name_for(&self, kind: SourceKind, namespace: &str, source: &str, content_hash: &str) -> String {
        let digest = Prover::name_digest(self.ring().current(), kind, namespace, source, content_hash);
        snapshot_name(source, &digest)
    }

    /// Every name this installation may have given the snapshot of this
    /// content: [`Prover::name_for`]'s first, then the names under every
    /// key of the ring and of the earlier schemes (for a Secret keyed
    /// without the namespace; for both kinds the plain hash's, from before
    /// names were keyed). A snapshot keeps the name it was made with:
    /// upgrading or rotating renames nothing.
    pub(crate) fn names_for(&self, kind: SourceKind, namespace: &str, source: &str, content_hash: &str) -> Vec<String> {
        let mut names = vec![self.name_for(kind, namespace, source, content_hash)];
        let ring = self.ring();
        for key in &ring.macs {
            names.push(snapshot_name(
                source,
                &Prover::name_digest(key, kind, namespace, source, content_hash),
            ));
            if kind == SourceKind::Secret {
                names.push(snapshot_name(
                    source,
                    &mac_with(key, &[SECRET_NAME_V1, source, content_hash]),
                ));
            }
        }
        names.push(snapshot_name(source, content_hash));
        let mut seen = std::collections::HashSet::new();
        names.retain(|n| seen.insert(n.clone()));
        names
    }

    /// A keyed digest of a content, under the current key: what serve's
    /// cache keeps of a Secret instead of its data. Equal contents have
    /// equal digests; the digest tells nothing to whoever lacks the key.
    pub(crate) fn content_digest(&self, content_hash: &str) -> String {
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
    pub(crate) fn why_unproven(&self, object: &Value) -> String {
        match object.get(DIGESTED).map(|d| &d["unproven"]) {
            Some(Value::String(why)) => why.clone(),
            _ => self.verify(object).err().map(|e| e.to_string()).unwrap_or_default(),
        }
    }

    pub fn proves(&self, object: &Value) -> bool {
        self.verify(object).is_ok()
    }

    /// Whether `object`, as read or as the cache keeps it, holds `content`.
    pub fn holds(&self, object: &Value, content: &Content) -> bool {
        self.holds_hash(object, content.kind, &content.hash())
    }

    /// Whether `object`, a `kind` as read or as the cache keeps it, holds
    /// the content whose hash is `content_hash`.
    pub(crate) fn holds_hash(&self, object: &Value, kind: SourceKind, content_hash: &str) -> bool {
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

impl fmt::Debug for Prover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never a key: their ids.
        f.debug_struct("Prover").field("keys", &self.key_ids()).finish()
    }
}

#[cfg(test)]
mod tests;
