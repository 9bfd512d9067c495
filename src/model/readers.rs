//! What a ConfigMap or Secret says of its readers' rollouts: its own
//! annotation `config-snapshot.io/readers` (docs/design.md, "The source
//! decides"). `watch`: every workload that snapshots it without naming it
//! watches it; `ignore`: its edits roll none of them but a workload that
//! names it in `watch`. How that meets the workload's own words is
//! [`crate::model::optin::OptIn::standing`], the one rule.
//!
//! No write of a source is reviewed (docs/design.md, "What the webhook is
//! called for"), so a bad value cannot be refused when it is written: it
//! is read as no word at all, and said where a person looks (`plan`,
//! `status`, the warnings of the source's re-admission).

use serde_json::Value;

use crate::model::keys;
use crate::model::object::ObjectExt;
use crate::model::request::SAY;
use crate::model::source::SourceId;

/// A source's word about its readers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Readers {
    /// No annotation (or one that does not parse): each reader's own
    /// annotations decide.
    #[default]
    Unsaid,
    /// `watch`: its edits roll out every reader that snapshots it, as if
    /// each listed it in `config-snapshot.io/watch`.
    Watch,
    /// `ignore`: its edits roll out only the readers that name it in
    /// `config-snapshot.io/watch`.
    Ignore,
}

/// A `config-snapshot.io/readers` value that is neither word.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{annotation}: bad token {value:?}: \"watch\" or \"ignore\"", annotation = keys::READERS)]
pub struct ReadersError {
    /// The value, cut to 64 characters: it comes from whoever may edit
    /// the source.
    pub value: String,
}

impl Readers {
    /// The word `value` says (`None`: no annotation).
    pub fn parse(value: Option<&str>) -> Result<Readers, ReadersError> {
        match value {
            None => Ok(Readers::Unsaid),
            Some("watch") => Ok(Readers::Watch),
            Some("ignore") => Ok(Readers::Ignore),
            Some(other) => Err(ReadersError {
                value: other.chars().take(64).collect(),
            }),
        }
    }

    /// What `source` (a ConfigMap or Secret, whole or as a cache keeps its
    /// metadata) says.
    pub fn of(source: &Value) -> Result<Readers, ReadersError> {
        Readers::parse(source.annotation(keys::READERS))
    }

    /// What `source` says, a bad value read as no word: for the host's
    /// judgements, which are not where a person reads the error.
    pub fn said_by(source: &Value) -> Readers {
        Readers::of(source).unwrap_or_default()
    }

    /// What `source` says, for an admission that answers with warnings
    /// (a source's re-admission, checksum mode): a bad value is read as no
    /// word, and said in `warnings`.
    pub(crate) fn judged(source: &Value, id: &SourceId, warnings: &mut Vec<String>) -> Readers {
        Readers::judged_from(source.annotation(keys::READERS), id, warnings)
    }

    /// [`Self::judged`] of the annotation's value.
    pub(crate) fn judged_from(value: Option<&str>, id: &SourceId, warnings: &mut Vec<String>) -> Readers {
        Readers::parse(value).unwrap_or_else(|e| {
            warnings.push(format!("{SAY}{id}: {e}; read as no word"));
            Readers::Unsaid
        })
    }

    /// The annotation's value (`None`: no word).
    pub fn name(self) -> Option<&'static str> {
        match self {
            Readers::Unsaid => None,
            Readers::Watch => Some("watch"),
            Readers::Ignore => Some("ignore"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn two_words_and_nothing_else() {
        let source = |value: Value| json!({"metadata": {"name": "app", "annotations": {keys::READERS: value}}});
        assert_eq!(Readers::of(&source(json!("watch"))), Ok(Readers::Watch));
        assert_eq!(Readers::of(&source(json!("ignore"))), Ok(Readers::Ignore));
        assert_eq!(Readers::of(&json!({"metadata": {"name": "app"}})), Ok(Readers::Unsaid));
        // Reloader's words, a case or a space off: refused by name, read as
        // no word where the host judges.
        for bad in ["true", "false", "Watch", " ignore", ""] {
            let e = Readers::of(&source(json!(bad))).unwrap_err();
            assert_eq!(e.value, bad);
            assert!(e.to_string().starts_with(keys::READERS), "{e}");
            assert_eq!(Readers::said_by(&source(json!(bad))), Readers::Unsaid);
        }
        let long = "x".repeat(500);
        assert_eq!(Readers::of(&source(json!(long))).unwrap_err().value.len(), 64);
        for word in [Readers::Watch, Readers::Ignore] {
            assert_eq!(Readers::parse(word.name()), Ok(word));
        }
        assert_eq!(Readers::Unsaid.name(), None);
    }
}
