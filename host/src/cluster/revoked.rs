//! The namespace's revocation record as the host reads it (docs/design.md,
//! "Revocation"): what `config-snapshot revoke` deleted is never made again,
//! under any name the installation may give that content.
//!
//! The record is read through [`Cluster::get`]: serve's cache of ConfigMaps
//! keeps its label and annotations (config-snapshot's own), so the read
//! costs no request; a namespace without a record costs a lookup in memory.

use config_snapshot_policy::host::contract::Revoked;
use config_snapshot_policy::model::revocation::{RecordError, Revocations, RECORD};
use config_snapshot_policy::model::source::{SourceId, SourceKind};

use super::proof::Prover;
use super::{ApiError, Cluster};

/// Why the record could not be read: its read failed, or it was edited by
/// hand into something that is not a record. Either way nothing that it
/// could forbid is made: a revocation the host cannot read is not taken
/// as none.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordUnread {
    #[error("reading configmap/{RECORD}: {0}")]
    Read(#[from] ApiError),
    #[error(transparent)]
    Broken(#[from] RecordError),
}

/// The revocations recorded in `namespace` (none without a record).
pub fn revocations<C: Cluster + ?Sized>(cluster: &C, namespace: &str) -> Result<Revocations, RecordUnread> {
    match cluster.get(SourceKind::ConfigMap.kind(), namespace, RECORD)? {
        Some(record) => Ok(Revocations::of(&record)?),
        None => Ok(Revocations::default()),
    }
}

/// Whether the content whose hash is `content_hash`, of `source` in
/// `namespace`, was revoked there: whether one of the names this
/// installation may have given it (its current key's, every key of the
/// ring's, the earlier schemes': [`Prover::names_for`]) is recorded. So a
/// source set back to a revoked value is recognised after a key rotation
/// too, although its snapshot would now get another name.
pub fn revocation_of(
    revocations: &Revocations,
    prover: &Prover,
    namespace: &str,
    source: &SourceId,
    content_hash: &str,
) -> Option<Revoked> {
    if revocations.is_empty() {
        return None;
    }
    let names = prover.names_for(source.kind, namespace, &source.name, content_hash);
    revocations
        .revoking_any(source, names.iter().map(String::as_str))
        .map(|(name, revocation)| Revoked::of(name, revocation))
}

#[cfg(test)]
mod tests {
    use super::*;
    use config_snapshot_policy::model::content::Content;
    use config_snapshot_policy::model::revocation::Revocation;
    use serde_json::json;

    /// A content revoked under the key of its day is recognised once the
    /// ring has a new current key, under which it would get another name.
    #[test]
    fn a_revoked_content_is_known_under_every_key_of_the_ring() {
        use crate::cluster::proof::Keyring;
        let old = Keyring::of(&[1u8; 32]).unwrap();
        let prover = Prover::with(&old);
        let db = SourceId::new(SourceKind::Secret, "db");
        let leaked = Content::from_object(SourceKind::Secret, &json!({"data": {"password": "bGVha2Vk"}})).unwrap();
        let revoked_name = prover.snapshot_name("shop", "db", &leaked);
        let record = Revocations(vec![Revocation {
            source: db.clone(),
            at: 1_800_000_000,
            by: "alice".into(),
            snapshots: vec![revoked_name.clone()],
        }]);
        let rotated = old.rotated(zeroize::Zeroizing::new(vec![2u8; 32])).unwrap();
        let prover = Prover::with(&rotated);
        assert_ne!(
            prover.snapshot_name("shop", "db", &leaked),
            revoked_name,
            "a new key, a new name"
        );
        let found = revocation_of(&record, &prover, "shop", &db, &leaked.hash()).expect("still revoked");
        assert_eq!(
            (found.snapshot.as_str(), found.by.as_str()),
            (revoked_name.as_str(), "alice")
        );
        let fresh = Content::from_object(SourceKind::Secret, &json!({"data": {"password": "bmV3"}})).unwrap();
        assert_eq!(revocation_of(&record, &prover, "shop", &db, &fresh.hash()), None);
        assert_eq!(
            revocation_of(&record, &prover, "other", &db, &leaked.hash()),
            None,
            "a name is keyed per namespace: another namespace's content is another's"
        );
    }
}
