//! The revocation record (docs/design.md, "Revocation"): which snapshots
//! of which source `config-snapshot revoke` deleted, when, and on whose
//! word, so that nothing brings them back.
//!
//! One ConfigMap per namespace, named [`RECORD`] and labelled
//! `config-snapshot.io/record: revocations`, its entries in the annotation
//! `config-snapshot.io/revocations`, a JSON list:
//!
//! ```text
//! [{"source":"secret/db","at":"2026-05-04T09:12:00Z","by":"alice@example.com",
//!   "snapshots":["db-1a2b3c4d5e"]}]
//! ```
//!
//! An annotation, not `data`: serve's cache of ConfigMaps keeps
//! config-snapshot's annotations and never data, so the policy's and the
//! host's reads of the record cost no request. It holds names and times
//! only: a snapshot's name is keyed (docs/hash-spec.md) and tells nothing
//! of its content to whoever lacks the installation's key, and no hash of
//! a Secret's content is ever written here.
//!
//! The record only ever makes config-snapshot refuse more: nothing deletes
//! or writes anything because of it. A namespace's editors may edit it or
//! delete it, as they may delete the snapshots themselves; what a deleted
//! record loses is said in docs/design.md, "Revocation".

use std::fmt;

use serde_json::{json, Value};

use crate::model::duration::{format_rfc3339, parse_rfc3339};
use crate::model::keys;
use crate::model::object::ObjectExt;
use crate::model::selection::is_dns_subdomain;
use crate::model::source::{SourceId, SourceKind};

/// The record's name in each namespace.
pub const RECORD: &str = "config-snapshot-revocations";

/// The most characters of `by` kept: a user name, not an essay.
const MAX_BY: usize = 256;

/// One run of `config-snapshot revoke`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    pub source: SourceId,
    /// When it was revoked (unix seconds, the revoking client's clock).
    pub at: i64,
    /// Who revoked it: the user the API server told the revoking client it
    /// is (a SelfSubjectReview). The client writes it: the API server's
    /// audit log is the authority on who wrote the record.
    pub by: String,
    /// The snapshots of `source` revoked, by name.
    pub snapshots: Vec<String>,
}

/// Every revocation recorded in one namespace, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Revocations(pub Vec<Revocation>);

/// Why a record cannot be read: it was written by hand, not by `revoke`.
/// One message, not a variant each: the module pays for every one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configmap/{RECORD} does not read as revocations: {0}")]
pub struct RecordError(pub &'static str);

/// Whether `object` is the record: our label, on a ConfigMap named
/// [`RECORD`]. Anything else of that name is a user's.
pub fn is_record(object: &Value) -> bool {
    object["kind"]
        .as_str()
        .is_none_or(|k| k == SourceKind::ConfigMap.kind())
        && object.name() == RECORD
        && object.label(keys::RECORD_LABEL) == Some(keys::RECORD_LABEL_VALUE)
}

/// `text` with its control characters replaced and cut to [`MAX_BY`]: a
/// name printed in messages and by the commands, which a namespace's
/// editor could have written anything into.
fn printable(text: &str) -> String {
    text.chars()
        .take(MAX_BY)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

impl Revocation {
    fn parse(raw: &Value) -> Result<Revocation, RecordError> {
        let source = raw["source"]
            .as_str()
            .and_then(SourceId::parse)
            .filter(|id| is_dns_subdomain(&id.name))
            .ok_or(RecordError("an entry has no valid source"))?;
        let at = raw["at"]
            .as_str()
            .and_then(parse_rfc3339)
            .ok_or(RecordError("an entry has no valid time"))?;
        let by = raw["by"]
            .as_str()
            .map(printable)
            .ok_or(RecordError("an entry says not by whom"))?;
        let snapshots = raw["snapshots"]
            .as_array()
            .and_then(|names| {
                names
                    .iter()
                    .map(|n| n.as_str().filter(|n| is_dns_subdomain(n)).map(str::to_string))
                    .collect::<Option<Vec<String>>>()
            })
            .ok_or(RecordError("an entry has no valid list of snapshots"))?;
        Ok(Revocation {
            source,
            at,
            by,
            snapshots,
        })
    }

    fn to_json(&self) -> Value {
        json!({"source": self.source.to_string(), "at": format_rfc3339(self.at), "by": self.by,
               "snapshots": self.snapshots})
    }
}

/// A revocation as the messages and the commands say it.
pub fn said(at: i64, by: &str) -> String {
    format!("revoked at {} by {by}", format_rfc3339(at))
}

impl fmt::Display for Revocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&said(self.at, &self.by))
    }
}

impl Revocations {
    /// The record `object` holds: none when it is not the record (not
    /// labelled as ours) or has no entries yet.
    pub fn of(object: &Value) -> Result<Revocations, RecordError> {
        if !is_record(object) {
            return Ok(Revocations::default());
        }
        let Some(text) = object.annotation(keys::REVOCATIONS) else {
            return Ok(Revocations::default());
        };
        // Read through `Value`, which the policy parses anyway: a derived
        // deserializer costs the wasm tens of kilobytes.
        let not_a_list = RecordError("its annotation is not a JSON list");
        let raw: Value = serde_json::from_str(text).map_err(|_| not_a_list.clone())?;
        let entries = raw.as_array().ok_or(not_a_list)?;
        entries
            .iter()
            .map(Revocation::parse)
            .collect::<Result<Vec<_>, _>>()
            .map(Revocations)
    }

    /// The revocation of snapshot `name` of `source`, if one names it.
    pub fn revoking(&self, source: &SourceId, name: &str) -> Option<&Revocation> {
        self.0
            .iter()
            .find(|r| r.source == *source && r.snapshots.iter().any(|s| s == name))
    }

    /// The first of `names` (the names one content has had) revoked for
    /// `source`, with its revocation.
    pub fn revoking_any<'a>(
        &self,
        source: &SourceId,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Option<(&'a str, &Revocation)> {
        names
            .into_iter()
            .find_map(|name| self.revoking(source, name).map(|r| (name, r)))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The annotation's value: what [`Revocations::of`] reads back.
    pub fn to_annotation(&self) -> String {
        Value::Array(self.0.iter().map(Revocation::to_json).collect()).to_string()
    }

    /// The record object holding these revocations, as `revoke` creates it
    /// in `namespace`.
    pub fn record_object(&self, namespace: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": RECORD, "namespace": namespace,
                            "labels": {keys::RECORD_LABEL: keys::RECORD_LABEL_VALUE},
                            "annotations": {keys::REVOCATIONS: self.to_annotation()}}})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(source: &str, snapshots: &[&str]) -> Revocation {
        Revocation {
            source: SourceId::parse(source).unwrap(),
            at: 1_800_000_000,
            by: "alice@example.com".into(),
            snapshots: snapshots.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn a_record_reads_back_what_revoke_writes() {
        let record = Revocations(vec![entry("secret/db", &["db-1a2b3c4d5e", "db-0f0f0f0f0f"])]);
        let object = record.record_object("shop");
        assert_eq!(Revocations::of(&object).unwrap(), record);
        let db = SourceId::new(SourceKind::Secret, "db");
        assert_eq!(record.revoking(&db, "db-0f0f0f0f0f"), Some(&record.0[0]));
        assert_eq!(record.revoking(&db, "db-ffffffffff"), None);
        let other = SourceId::new(SourceKind::ConfigMap, "db");
        assert_eq!(
            record.revoking(&other, "db-1a2b3c4d5e"),
            None,
            "a revocation is of one source's snapshots"
        );
        assert_eq!(
            record.revoking_any(&db, ["db-x", "db-1a2b3c4d5e"]).map(|(n, _)| n),
            Some("db-1a2b3c4d5e")
        );
        assert_eq!(
            record.0[0].to_string(),
            "revoked at 2027-01-15T08:00:00Z by alice@example.com"
        );
    }

    /// A ConfigMap of the record's name without our label is a user's: it
    /// revokes nothing.
    #[test]
    fn only_the_labelled_object_is_the_record() {
        let mut object = Revocations(vec![entry("secret/db", &["db-1a2b3c4d5e"])]).record_object("shop");
        object["metadata"]["labels"] = json!({});
        assert!(!is_record(&object));
        assert!(Revocations::of(&object).unwrap().is_empty());
    }

    /// A record edited by hand into something else is an error, never read
    /// as no revocation: the caller refuses what it cannot judge.
    #[test]
    fn a_broken_record_is_an_error_not_an_empty_one() {
        let mut object = Revocations::default().record_object("shop");
        for (text, why) in [
            (r#"{"source":"secret/db"}"#, "not a JSON list"),
            (
                r#"[{"source":"pod/db","at":"2026-01-01T00:00:00Z","by":"a","snapshots":[]}]"#,
                "no valid source",
            ),
            (
                r#"[{"source":"secret/db","at":"yesterday","by":"a","snapshots":[]}]"#,
                "no valid time",
            ),
            (
                r#"[{"source":"secret/db","at":"2026-01-01T00:00:00Z","by":"a","snapshots":["Not A Name"]}]"#,
                "no valid list of snapshots",
            ),
        ] {
            object["metadata"]["annotations"][keys::REVOCATIONS] = json!(text);
            let error = Revocations::of(&object).expect_err(text);
            assert!(error.0.contains(why), "{text}: {error}");
        }
    }

    /// `by` is shown in messages: whatever an editor wrote there, no
    /// control character reaches a terminal.
    #[test]
    fn who_revoked_is_printable() {
        let mut object = Revocations::default().record_object("shop");
        object["metadata"]["annotations"][keys::REVOCATIONS] =
            json!(r#"[{"source":"secret/db","at":"2026-01-01T00:00:00Z","by":"eve\u001b[2J","snapshots":[]}]"#);
        assert_eq!(Revocations::of(&object).unwrap().0[0].by, "eve?[2J");
    }
}
