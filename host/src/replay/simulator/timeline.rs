//! The words of replay's timeline.

use config_snapshot_policy::model::object::ObjectExt;
use config_snapshot_policy::model::{keys, references};
use serde_json::Value;

/// Which references a mutation rewrote, and whether it recorded a rollback
/// (a record that differs from the live object's).
pub(crate) fn describe_rewrite(before: &Value, after: &Value, live: Option<&Value>) -> String {
    let (Some(b), Some(a)) = (
        config_snapshot_policy::model::kinds::template_of(before),
        config_snapshot_policy::model::kinds::template_of(after),
    ) else {
        return "changed".into();
    };
    let old = references::collect(b);
    let new = references::collect(a);
    let moved: Vec<String> = old
        .iter()
        .zip(new.iter())
        .filter(|(o, n)| o.name != n.name)
        .map(|(o, n)| format!("{}/{} -> {}", o.kind.tag(), o.name, n.name))
        .collect();
    let mut parts = Vec::new();
    if !moved.is_empty() {
        let mut unique = moved.clone();
        unique.dedup();
        parts.push(unique.join(", "));
    }
    let checksums = a.annotation(keys::SNAPSHOTS).is_none()
        && a.annotations()
            .is_some_and(|m| m.keys().any(|k| k.starts_with(keys::CHECKSUM_PREFIX)));
    if checksums {
        parts.push("config checksums stamped".into());
    }
    let records = |o: &Value, k: &str| o.annotations().and_then(|a| a.get(k)).cloned();
    let recorded = records(after, keys::ROLLBACK);
    if recorded.is_some() && live.and_then(|l| records(l, keys::ROLLBACK)) != recorded {
        parts.push("rollback recorded".into());
    }
    if parts.is_empty() {
        "policy annotations updated".into()
    } else {
        parts.join("; ")
    }
}
