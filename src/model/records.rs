//! What config-snapshot remembers on a workload's own metadata, outside the
//! pod template (so recording it never rolls pods): the last rollback the
//! policy admitted and the last watch rollout the host applied. See
//! docs/design.md, "A rollback always wins".
//!
//! Both carry the `metadata.generation` their write produced. The rollback
//! record also counts the workload's rollbacks: a watch patch remembers the
//! count it saw when it was decided, and is void once the count has grown.
//! A count orders exactly where clocks (whole seconds, several replicas)
//! cannot, and where generations cannot either: an undo whose rewritten
//! template is the running one changes no spec and bumps no generation,
//! yet it is a rollback the user asked for.

use crate::model::object::ObjectExt;
use serde_json::Value;

use crate::model::duration::{format_rfc3339, parse_rfc3339};
use crate::model::keys;
use crate::model::source::SourceId;

/// `config-snapshot.io/rollback`: a rollback and the source contents it
/// declined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollback {
    /// The generation the rollback produced.
    pub generation: i64,
    /// How many rollbacks the workload has had, this one included.
    pub count: u64,
    /// When it was admitted (unix seconds): a fresh renew period starts here.
    pub at: i64,
    /// For each watched source: the snapshot its content had at the
    /// rollback. Until that source's references move again, the resync
    /// must not roll the workload to this content: the user rolled back
    /// away from it. An entry leaves once the source's references move.
    pub sources: Vec<(SourceId, String)>,
}

/// `config-snapshot.io/watch-rollout`: the host's last watch rollout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchRollout {
    /// The generation the rollout's patch produced.
    pub generation: i64,
    /// When it was applied: the storm guard counts from here.
    pub at: i64,
    pub source: SourceId,
    pub snapshot: String,
}

/// A JSON string literal. Written by hand with serde_json's escaping,
/// which the policy links anyway, rather than through `Value`.
fn quote(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_default()
}

/// The `metadata.generation` the API server gives `new` when it replaces
/// `old`: it bumps the generation on a spec change only. A rollback whose
/// rewritten template is the one already running changes no spec, and a
/// record claiming the next generation would void every later watch patch.
pub(crate) fn generation_after(old: &Value, new: &Value) -> i64 {
    generation(old) + i64::from(old.get("spec") != new.get("spec"))
}

/// A workload's `metadata.generation` (0 when absent).
pub fn generation(object: &Value) -> i64 {
    object.generation().unwrap_or(0)
}

impl Rollback {
    /// The record on a workload; a malformed one reads as none, which only
    /// means the workload is not protected from a stale resync rollout.
    pub fn of(object: &Value) -> Option<Rollback> {
        // Read through `Value`, which the policy parses anyway: a derived
        // deserializer per record costs the wasm tens of kilobytes.
        let raw: Value = serde_json::from_str(object.annotation(keys::ROLLBACK)?).ok()?;
        Some(Rollback {
            generation: raw.get("generation")?.as_i64()?,
            count: raw.get("count").and_then(Value::as_u64).unwrap_or(1),
            at: parse_rfc3339(raw.get("at")?.as_str()?)?,
            sources: raw
                .get("sources")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| Some((SourceId::parse(k)?, v.as_str()?.to_string())))
                .collect(),
        })
    }

    /// The snapshot this rollback declined for `id`, if it names one.
    pub fn declined(&self, id: &SourceId) -> Option<&str> {
        self.sources.iter().find(|(s, _)| s == id).map(|(_, d)| d.as_str())
    }

    /// How many rollbacks `workload` has had (0 without a record).
    pub(crate) fn count_of(workload: &Value) -> u64 {
        Rollback::of(workload).map_or(0, |r| r.count)
    }

    pub(crate) fn to_annotation(&self) -> String {
        let mut out = format!(
            r#"{{"generation":{},"count":{},"at":"{}""#,
            self.generation,
            self.count,
            format_rfc3339(self.at)
        );
        if !self.sources.is_empty() {
            let entries: Vec<String> = self
                .sources
                .iter()
                .map(|(k, v)| format!("{}:{}", quote(&k.to_string()), quote(v)))
                .collect();
            out.push_str(&format!(r#","sources":{{{}}}"#, entries.join(",")));
        }
        out.push('}');
        out
    }
}

impl WatchRollout {
    pub fn of(object: &Value) -> Option<WatchRollout> {
        let raw: Value = serde_json::from_str(object.annotation(keys::WATCH_ROLLOUT)?).ok()?;
        Some(WatchRollout {
            generation: raw.get("generation")?.as_i64()?,
            at: parse_rfc3339(raw.get("at")?.as_str()?)?,
            source: SourceId::parse(raw.get("source")?.as_str()?)?,
            snapshot: raw.get("snapshot")?.as_str()?.to_string(),
        })
    }

    pub fn to_annotation(&self) -> String {
        format!(
            r#"{{"generation":{},"at":"{}","source":{},"snapshot":{}}}"#,
            self.generation,
            format_rfc3339(self.at),
            quote(&self.source.to_string()),
            quote(&self.snapshot)
        )
    }

    /// Whether the UPDATE from `old` to `new` is the host's own watch
    /// rollout: it recorded the generation this very write produces. A
    /// `kubectl rollout undo` that restores an older record (it copies a
    /// ReplicaSet's annotations back) does not pass.
    pub fn made(new: &Value, old: &Value) -> bool {
        WatchRollout::of(new).is_some_and(|r| r.generation == generation(old) + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::source::SourceKind;
    use serde_json::json;

    fn with(key: &str, value: String, generation: i64) -> Value {
        json!({"metadata": {"generation": generation, "annotations": {key: value}}})
    }

    #[test]
    fn rollback_round_trips() {
        let r = Rollback {
            generation: 8,
            count: 2,
            at: 1_800_000_000,
            sources: vec![(
                SourceId::new(SourceKind::ConfigMap, "app"),
                "app-0123456789".to_string(),
            )],
        };
        let text = r.to_annotation();
        assert_eq!(
            text,
            r#"{"generation":8,"count":2,"at":"2027-01-15T08:00:00Z","sources":{"configmap/app":"app-0123456789"}}"#
        );
        assert_eq!(Rollback::of(&with(keys::ROLLBACK, text, 8)), Some(r));
        assert_eq!(Rollback::of(&with(keys::ROLLBACK, "garbage".into(), 8)), None);
    }

    #[test]
    fn only_a_spec_change_makes_a_new_generation() {
        let old = json!({"metadata": {"generation": 4}, "spec": {"template": {"a": 1}}});
        let relabelled = json!({"metadata": {"generation": 4, "labels": {"x": "y"}}, "spec": {"template": {"a": 1}}});
        let changed = json!({"metadata": {"generation": 4}, "spec": {"template": {"a": 2}}});
        assert_eq!(generation_after(&old, &relabelled), 4);
        assert_eq!(generation_after(&old, &changed), 5);
    }

    #[test]
    fn only_the_generation_this_write_makes_marks_a_watch_rollout() {
        let record = WatchRollout {
            generation: 5,
            at: 1_800_000_000,
            source: SourceId::new(SourceKind::Secret, "tls"),
            snapshot: "tls-0123456789".into(),
        };
        let new = with(keys::WATCH_ROLLOUT, record.to_annotation(), 4);
        assert_eq!(WatchRollout::of(&new), Some(record));
        assert!(WatchRollout::made(&new, &json!({"metadata": {"generation": 4}})));
        // The same record restored by a rollback later on: not this write's.
        assert!(!WatchRollout::made(&new, &json!({"metadata": {"generation": 9}})));
        assert!(!WatchRollout::made(&json!({}), &json!({"metadata": {"generation": 4}})));
    }
}
