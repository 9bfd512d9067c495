//! A source's values in one revision, and what changed between two.
//! Secret values never leave here: a Secret's keys are compared by a
//! digest of their values and shown by name only.

use std::collections::{BTreeMap, BTreeSet};

use config_snapshot_policy::model::content::hex;
use config_snapshot_policy::model::source::SourceKind;
use serde::Serialize;
use serde_json::Value;
use sha2::Digest as _;

/// A source's values in one revision: a ConfigMap's as they are, a
/// Secret's as digests (never shown).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Values {
    Plain(BTreeMap<String, String>),
    Hidden(BTreeMap<String, String>),
}

impl Values {
    pub(crate) fn of(kind: SourceKind, object: &Value) -> Values {
        let mut out = BTreeMap::new();
        for field in ["data", "binaryData", "stringData"] {
            if let Some(map) = object[field].as_object() {
                for (k, v) in map {
                    let text = v.as_str().unwrap_or_default();
                    let shown = if field == "binaryData" {
                        format!("<{} bytes, base64>", text.len())
                    } else {
                        text.to_string()
                    };
                    out.insert(k.clone(), shown);
                }
            }
        }
        match kind {
            SourceKind::ConfigMap => Values::Plain(out),
            SourceKind::Secret => Values::Hidden(
                out.into_iter()
                    .map(|(k, v)| (k, hex(&sha2::Sha256::digest(v.as_bytes()))))
                    .collect(),
            ),
        }
    }

    pub(crate) fn map(&self) -> &BTreeMap<String, String> {
        match self {
            Values::Plain(m) | Values::Hidden(m) => m,
        }
    }

    /// The text a diff compares: a ConfigMap's values; a Secret's key
    /// names, marked where the value differs from `before`'s (pass the
    /// older side as `before` when rendering the newer, None for the older).
    pub(crate) fn render(&self, before: Option<&Values>) -> String {
        let mut out = String::new();
        for (key, value) in self.map() {
            match self {
                Values::Plain(_) => {
                    let mut lines = value.lines();
                    let first = lines.next().unwrap_or_default();
                    out.push_str(&format!("{key}: {first}\n"));
                    for line in lines {
                        out.push_str(&format!("{:width$}  {line}\n", "", width = key.len()));
                    }
                }
                Values::Hidden(_) => {
                    let changed = before.and_then(|o| o.map().get(key)).is_some_and(|v| v != value);
                    let marker = if changed { "<hidden, changed>" } else { "<hidden>" };
                    out.push_str(&format!("{key}: {marker}\n"));
                }
            }
        }
        out
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyChanges {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
}

impl KeyChanges {
    pub(crate) fn between(before: Option<&Values>, after: Option<&Values>) -> Option<KeyChanges> {
        let (before, after) = (before?.map(), after?.map());
        let keys: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
        let mut changes = KeyChanges {
            added: vec![],
            removed: vec![],
            changed: vec![],
        };
        for key in keys {
            match (before.get(key), after.get(key)) {
                (None, Some(_)) => changes.added.push(key.clone()),
                (Some(_), None) => changes.removed.push(key.clone()),
                (Some(a), Some(b)) if a != b => changes.changed.push(key.clone()),
                _ => {}
            }
        }
        Some(changes)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }

    pub(crate) fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (what, keys) in [
            ("changed", &self.changed),
            ("added", &self.added),
            ("removed", &self.removed),
        ] {
            if !keys.is_empty() {
                parts.push(format!("{what} {}", keys.join(", ")));
            }
        }
        if parts.is_empty() {
            "unchanged".to_string()
        } else {
            parts.join("; ")
        }
    }
}
