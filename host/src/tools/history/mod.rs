//! `history` and `diff`: which config each revision of a workload runs,
//! read from the cluster alone. Every revision the controller keeps
//! (ReplicaSets, ControllerRevisions) names its snapshots in its template,
//! and a snapshot is immutable, so the config of revision 3 is still there
//! to read while revision 3 is.
//!
//! Secret values never leave this module: a Secret's keys are compared by
//! a digest of their values and shown by name only.
//!
//! - this module: which revisions a workload keeps, and what each pins;
//! - [`values`]: a source's values in one revision, and what changed;
//! - [`diff`]: two revisions compared; [`render`]: the text users read;
//! - [`fetch`]: the objects a history needs, from a real API server.

mod diff;
mod fetch;
mod kept;
mod render;
mod values;

use anyhow::{anyhow, bail, Result};
use config_snapshot_policy::model::duration::format_rfc3339;
use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::object::ObjectExt;
use config_snapshot_policy::model::references;
use config_snapshot_policy::model::revocation::{Revocations, RECORD};
use config_snapshot_policy::model::template::{self, Snapshots};
use config_snapshot_policy::rollout::checksum_key;
use serde_json::Value;

use crate::replay::simulator::controllers::REVISION_HISTORY_ANNOTATION;
use crate::replay::view::View;
pub use diff::{diff, Diff};
pub use fetch::fetch;
pub use kept::{History, State, Target};
pub(crate) use kept::{Revision, SourceConfig};
pub use render::{render_diff, render_history, Style};
pub(crate) use values::{KeyChanges, Values};

/// The revisions of `target` the cluster still keeps, oldest first.
pub fn history(cluster: &dyn View, target: &Target, namespace: &str, now: i64) -> Result<History> {
    let workload = cluster
        .get(target.kind.kind(), namespace, &target.name)
        .ok_or_else(|| anyhow!("{target} not found in namespace {namespace}"))?;
    let uid = workload.uid();
    let kept: Vec<Value> = cluster
        .objects()
        .into_iter()
        .filter(|o| o["kind"] == target.revision_kind() && o.namespace() == Some(namespace))
        .filter(|o| o.owner_references().iter().any(|r| r["uid"].as_str() == uid))
        .collect();
    if kept.is_empty() {
        bail!("{target} has no revisions yet (its controller has not made one)");
    }
    let numbered = numbered(target, kept);
    let newest = numbered.last().map(|(n, _)| *n);
    // A record that does not read names no revocation here: `history`
    // only shows, and says so of a snapshot that is gone either way.
    let revocations = cluster
        .get("ConfigMap", namespace, RECORD)
        .and_then(|record| Revocations::of(&record).ok())
        .unwrap_or_default();
    let mut revisions: Vec<Revision> = Vec::new();
    for (number, object) in &numbered {
        let number = *number;
        let template = object.pointer(target.template_path()).cloned().unwrap_or(Value::Null);
        let mut sources = sources_of(cluster, namespace, &template, &revocations);
        if let Some(previous) = revisions.last() {
            for source in &mut sources {
                let before = previous.sources.iter().find(|s| s.source == source.source);
                source.keys = KeyChanges::between(before.and_then(|b| b.values.as_ref()), source.values.as_ref());
            }
        }
        revisions.push(Revision {
            revision: number,
            name: object.name().to_string(),
            age_seconds: object
                .creation_timestamp()
                .and_then(config_snapshot_policy::model::duration::parse_rfc3339)
                .map(|t| (now - t).max(0)),
            current: Some(number) == newest,
            rollback_of: object
                .annotation(REVISION_HISTORY_ANNOTATION)
                .map(|h| h.split(',').filter_map(|n| n.trim().parse().ok()).collect())
                .unwrap_or_default(),
            images: template["spec"]["containers"]
                .as_array()
                .map(|cs| {
                    cs.iter()
                        .filter_map(|c| c["image"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
            sources,
            template,
        });
    }
    Ok(History {
        workload: target.to_string(),
        namespace: namespace.to_string(),
        revisions,
    })
}

/// The revisions with their numbers, oldest first: a ReplicaSet's revision
/// annotation, a ControllerRevision's `revision`, and for a CronJob's Jobs,
/// which have no number, their order of creation (1 the oldest kept).
fn numbered(target: &Target, mut kept: Vec<Value>) -> Vec<(i64, Value)> {
    let number = |revision: &Value| match (target.kind.revision_annotation(), target.revision_kind()) {
        (Some(annotation), _) => revision
            .annotation(annotation)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0),
        (None, "ControllerRevision") => revision["revision"].as_i64().unwrap_or(0),
        _ => 0,
    };
    let created = |r: &Value| {
        (
            r.creation_timestamp().unwrap_or_default().to_string(),
            r.name().to_string(),
        )
    };
    kept.sort_by_cached_key(|r| (number(r), created(r)));
    let ordinal = !target.kind.rolls();
    kept.into_iter()
        .enumerate()
        .map(|(i, r)| (if ordinal { i as i64 + 1 } else { number(&r) }, r))
        .collect()
}

/// Each source a revision's template reads, and where its config comes from.
fn sources_of(cluster: &dyn View, namespace: &str, template: &Value, revocations: &Revocations) -> Vec<SourceConfig> {
    let refs = references::collect(template);
    let mut known = Snapshots::of(template);
    // A snapshot the mapping does not name is still recognised by its labels.
    for r in &refs {
        if known.contains(r.kind, &r.name) || !template::looks_like_snapshot(&r.name) {
            continue;
        }
        if let Some(object) = cluster.get(r.kind.kind(), namespace, &r.name) {
            if keys::is_snapshot(&object) {
                if let Some(source) = object.annotation(keys::SOURCE_NAME) {
                    known.insert(r.kind, &r.name, source);
                }
            }
        }
    }
    template::group_by_source(&refs, &known)
        .into_iter()
        .map(|group| {
            let id = group.id.clone();
            let named = &group.refs[0].name;
            let object = cluster.get(id.kind.kind(), namespace, named);
            let (state, values) = if known.contains(id.kind, named) {
                match &object {
                    Some(o) => (
                        State::Snapshot {
                            snapshot: named.clone(),
                        },
                        Some(Values::of(id.kind, o)),
                    ),
                    None => match revocations.revoking(&id, named) {
                        Some(revocation) => (
                            State::Revoked {
                                snapshot: named.clone(),
                                at: format_rfc3339(revocation.at),
                                by: revocation.by.clone(),
                            },
                            None,
                        ),
                        None => (
                            State::Collected {
                                snapshot: named.clone(),
                            },
                            None,
                        ),
                    },
                }
            } else if template.annotation(&checksum_key(&id)).is_some() {
                (State::Checksum, None)
            } else if object.is_none() && group.all_optional() {
                (State::OptionalMissing, None)
            } else {
                (State::Live, None)
            };
            SourceConfig {
                source: id.to_string(),
                state,
                keys: None,
                values,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use config_snapshot_policy::model::source::SourceKind;

    #[test]
    fn workloads_are_named_as_kubectl_names_them() {
        assert_eq!(Target::parse("deploy/web").unwrap().kind.kind(), "Deployment");
        assert_eq!(Target::parse("StatefulSets/db").unwrap().kind.kind(), "StatefulSet");
        assert_eq!(Target::parse("ds/agent").unwrap().revision_kind(), "ControllerRevision");
        assert!(Target::parse("web").unwrap_err().to_string().contains("KIND/NAME"));
        assert!(Target::parse("pod/web")
            .unwrap_err()
            .to_string()
            .contains("keep revisions"));
    }

    /// A revision naming a snapshot `revoke` deleted says so, with when
    /// and by whom; one naming a snapshot gone otherwise says that.
    #[test]
    fn a_revoked_snapshot_is_told_from_a_collected_one() {
        use config_snapshot_policy::model::revocation::{Revocation, Revocations};
        use config_snapshot_policy::model::source::SourceId;
        use serde_json::json;
        let template = |secret: &str| {
            json!({"metadata": {"annotations": {keys::SNAPSHOTS: json!({"secret/db": secret}).to_string()}},
                   "spec": {"containers": [{"name": "c", "image": "api:1", "envFrom": [{"secretRef": {"name": secret}}]}]}})
        };
        let rs = |n: i64, secret: &str| {
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                   "metadata": {"name": format!("web-{n}"), "namespace": "shop",
                                "annotations": {"deployment.kubernetes.io/revision": n.to_string()},
                                "ownerReferences": [{"uid": "uid-web", "controller": true}]},
                   "spec": {"template": template(secret)}})
        };
        let record = Revocations(vec![Revocation {
            source: SourceId::new(SourceKind::Secret, "db"),
            at: 1_800_000_000,
            by: "alice".into(),
            snapshots: vec!["db-leaked".into()],
        }]);
        let objects = crate::replay::view::Objects(vec![
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                   "metadata": {"name": "web", "namespace": "shop", "uid": "uid-web"},
                   "spec": {"template": template("db-other")}}),
            rs(1, "db-leaked"),
            rs(2, "db-other"),
            record.record_object("shop"),
        ]);
        let history = history(&objects, &Target::parse("deploy/web").unwrap(), "shop", 1_800_000_000).unwrap();
        let said: Vec<String> = history
            .revisions
            .iter()
            .map(|r| r.sources[0].state.to_string())
            .collect();
        assert_eq!(
            said,
            [
                "snapshot db-leaked revoked at 2027-01-15T08:00:00Z by alice: cannot run again",
                "snapshot db-other no longer exists (collected or deleted)",
            ]
        );
    }

    #[test]
    fn secret_values_are_compared_but_never_rendered() {
        let a = Values::of(
            SourceKind::Secret,
            &serde_json::json!({"data": {"password": "Y2FuYXJ5"}}),
        );
        let b = Values::of(
            SourceKind::Secret,
            &serde_json::json!({"data": {"password": "b3RoZXI="}}),
        );
        let text = a.render(None) + &b.render(Some(&a));
        assert!(!text.contains("Y2FuYXJ5") && !text.contains("b3RoZXI="), "{text}");
        assert!(text.contains("password: <hidden, changed>"), "{text}");
        let changes = KeyChanges::between(Some(&a), Some(&b)).unwrap();
        assert_eq!(changes.changed, ["password"]);
    }
}
