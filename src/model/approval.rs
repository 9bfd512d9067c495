//! Notify and approve (docs/design.md, "Notify and approve"): whether a
//! watched change rolls by itself, and the two lists that carry a held
//! change between the host and the user.
//!
//! `config-snapshot.io/watch-mode` is `roll` (the default), `notify` (the
//! change is snapshotted and announced, and nothing rolls) or `approve`
//! (the same, and it rolls once someone approves that very content). The
//! host writes what waits in `config-snapshot.io/pending`; a user approves
//! by copying an entry into `config-snapshot.io/approve`, which
//! `config-snapshot approve deploy/web` does. Both hold entries
//! `KIND/NAME=SNAPSHOT`, separated by commas:
//!
//! ```text
//! configmap/app=app-6d1f2c3a9b, secret/db=db-k-0e4f…
//! ```
//!
//! An approval names the snapshot, not the source: content that changed
//! again after the user looked has another snapshot, so an approval of what
//! they saw never rolls what they did not.

use std::fmt;

use crate::model::keys;
use crate::model::references::MAX_SOURCES;
use crate::model::selection::is_dns_subdomain;
use crate::model::source::{SourceId, SourceKind};

/// How a workload takes a watched change.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WatchMode {
    /// Rolls at once (after the storm guard and inside its window).
    #[default]
    Roll,
    /// Snapshots and announces it; never rolls by itself.
    Notify,
    /// Snapshots and announces it; rolls when that content is approved.
    Approve,
}

impl WatchMode {
    pub(crate) const NAMES: [&'static str; 3] = ["roll", "notify", "approve"];

    pub(crate) fn parse(text: &str) -> Result<WatchMode, ApprovalError> {
        match text {
            "roll" => Ok(WatchMode::Roll),
            "notify" => Ok(WatchMode::Notify),
            "approve" => Ok(WatchMode::Approve),
            other => Err(ApprovalError::Mode {
                value: other.chars().take(64).collect(),
            }),
        }
    }

    /// A workload's mode; one that does not parse reads as `notify`, the
    /// mode that rolls nothing (the policy refuses it at admission, so only
    /// an object written around the webhook carries one).
    pub fn of(annotations: Option<&serde_json::Map<String, serde_json::Value>>) -> WatchMode {
        annotations
            .and_then(|a| a.get(keys::WATCH_MODE))
            .and_then(serde_json::Value::as_str)
            .map_or(WatchMode::Roll, |text| {
                WatchMode::parse(text).unwrap_or(WatchMode::Notify)
            })
    }

    pub fn name(self) -> &'static str {
        match self {
            WatchMode::Roll => Self::NAMES[0],
            WatchMode::Notify => Self::NAMES[1],
            WatchMode::Approve => Self::NAMES[2],
        }
    }
}

/// The most bytes a pending or approve annotation may hold.
pub(crate) const MAX_TEXT: usize = 32 * 1024;

/// Why a watch-mode, pending or approve annotation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApprovalError {
    #[error("{annotation}: bad token {value:?}: one of roll, notify, approve", annotation = keys::WATCH_MODE)]
    Mode { value: String },
    #[error("{annotation}: {len} bytes, at most {MAX_TEXT}")]
    TooLong { annotation: &'static str, len: usize },
    #[error("{annotation}: {count} entries, at most {MAX_SOURCES}")]
    TooMany { annotation: &'static str, count: usize },
    #[error("{annotation}: bad entry {entry:?}: write KIND/NAME=SNAPSHOT, e.g. configmap/app=app-6d1f2c3a9b")]
    Entry { annotation: &'static str, entry: String },
}

/// The entries of a pending or approve annotation, one per source, in the
/// order written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entries(Vec<(SourceId, String)>);

impl Entries {
    /// Parses `text`, the value of `annotation` (named in errors).
    pub fn parse(annotation: &'static str, text: &str) -> Result<Entries, ApprovalError> {
        if text.len() > MAX_TEXT {
            return Err(ApprovalError::TooLong {
                annotation,
                len: text.len(),
            });
        }
        let mut entries = Entries::default();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = || ApprovalError::Entry {
                annotation,
                entry: entry.chars().take(128).collect(),
            };
            let (id, snapshot) = entry.split_once('=').ok_or_else(bad)?;
            let (tag, name) = id.trim().split_once('/').ok_or_else(bad)?;
            let kind = SourceKind::from_tag(tag).ok_or_else(bad)?;
            let snapshot = snapshot.trim();
            if !is_dns_subdomain(name) || !is_dns_subdomain(snapshot) {
                return Err(bad());
            }
            entries.set(SourceId::new(kind, name), snapshot);
            if entries.0.len() > MAX_SOURCES {
                return Err(ApprovalError::TooMany {
                    annotation,
                    count: text.split(',').count(),
                });
            }
        }
        Ok(entries)
    }

    /// The entries `annotation` holds on an object's annotations; none if
    /// it is absent or does not parse.
    pub fn on(annotations: Option<&serde_json::Map<String, serde_json::Value>>, annotation: &'static str) -> Entries {
        annotations
            .and_then(|a| a.get(annotation))
            .and_then(serde_json::Value::as_str)
            .and_then(|text| Entries::parse(annotation, text).ok())
            .unwrap_or_default()
    }

    /// The snapshot entered for `id`.
    pub fn get(&self, id: &SourceId) -> Option<&str> {
        self.0.iter().find(|(i, _)| i == id).map(|(_, s)| s.as_str())
    }

    /// Enters `snapshot` for `id`, in place of what was there.
    pub fn set(&mut self, id: SourceId, snapshot: &str) {
        match self.0.iter_mut().find(|(i, _)| *i == id) {
            Some(entry) => entry.1 = snapshot.to_string(),
            None => self.0.push((id, snapshot.to_string())),
        }
    }

    /// Takes `id`'s entry out.
    pub fn remove(&mut self, id: &SourceId) {
        self.0.retain(|(i, _)| i != id);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&SourceId, &str)> {
        self.0.iter().map(|(i, s)| (i, s.as_str()))
    }
}

impl fmt::Display for Entries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, (id, snapshot)) in self.0.iter().enumerate() {
            if n > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{id}={snapshot}")?;
        }
        Ok(())
    }
}

/// Checks the watch-mode and approve annotations a user writes (the host
/// writes pending; a user who edits it only misleads themselves, and the
/// host writes it again).
pub(crate) fn check(annotations: Option<&serde_json::Map<String, serde_json::Value>>) -> Result<(), ApprovalError> {
    let get = |key: &str| annotations.and_then(|a| a.get(key)).and_then(serde_json::Value::as_str);
    if let Some(mode) = get(keys::WATCH_MODE) {
        WatchMode::parse(mode)?;
    }
    if let Some(approved) = get(keys::APPROVE) {
        Entries::parse(keys::APPROVE, approved)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cm(name: &str) -> SourceId {
        SourceId::new(SourceKind::ConfigMap, name)
    }

    #[test]
    fn entries_round_trip_and_replace_per_source() {
        let mut e = Entries::parse(keys::PENDING, "configmap/app=app-1, secret/db=db-k-2").unwrap();
        assert_eq!(e.get(&cm("app")), Some("app-1"));
        e.set(cm("app"), "app-3");
        e.remove(&SourceId::new(SourceKind::Secret, "db"));
        assert_eq!(e.to_string(), "configmap/app=app-3");
        assert_eq!(Entries::parse(keys::PENDING, &e.to_string()).unwrap(), e);
        assert!(Entries::parse(keys::PENDING, " , ").unwrap().is_empty());
    }

    #[test]
    fn bad_entries_are_refused_naming_the_annotation_and_token() {
        for bad in [
            "app=app-1",
            "pod/app=x",
            "configmap/app",
            "configmap/App=x",
            "configmap/app=A B",
        ] {
            let e = Entries::parse(keys::APPROVE, bad).unwrap_err();
            assert!(
                matches!(
                    e,
                    ApprovalError::Entry {
                        annotation: keys::APPROVE,
                        ..
                    }
                ),
                "{bad}: {e}"
            );
        }
        let long = "configmap/a=b,".repeat(MAX_TEXT / 14 + 1);
        assert!(matches!(
            Entries::parse(keys::APPROVE, &long),
            Err(ApprovalError::TooLong { .. })
        ));
        let many: Vec<String> = (0..=MAX_SOURCES).map(|n| format!("configmap/c{n}=s{n}")).collect();
        assert!(matches!(
            Entries::parse(keys::APPROVE, &many.join(",")),
            Err(ApprovalError::TooMany { .. })
        ));
    }

    #[test]
    fn modes_parse_and_an_unreadable_one_rolls_nothing() {
        assert_eq!(WatchMode::parse("approve"), Ok(WatchMode::Approve));
        assert!(WatchMode::parse("yes").is_err());
        let of = |v: Value| WatchMode::of(v.as_object());
        use serde_json::Value;
        assert_eq!(of(json!({})), WatchMode::Roll);
        assert_eq!(of(json!({keys::WATCH_MODE: "notify"})), WatchMode::Notify);
        assert_eq!(of(json!({keys::WATCH_MODE: "sometimes"})), WatchMode::Notify);
        assert!(check(json!({keys::WATCH_MODE: "sometimes"}).as_object()).is_err());
        assert!(check(json!({keys::APPROVE: "configmap/app"}).as_object()).is_err());
        assert!(check(json!({keys::WATCH_MODE: "approve", keys::APPROVE: "configmap/app=app-1"}).as_object()).is_ok());
    }
}
