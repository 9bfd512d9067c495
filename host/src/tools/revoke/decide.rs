//! What `config-snapshot revoke` does in one namespace, decided from the
//! objects alone (no API calls), so that a dry run, a real run and the
//! tests all see the same plan (docs/design.md, "Revocation").
//!
//! Snapshots are found by what they say they are (our label, the
//! source-name annotation, `immutable`), never by computing names: names
//! are keyed, and the user holds no key. The user runs this with their own
//! rights, so it can delete nothing they could not delete by hand; no
//! signature is asked for, as `release` asks, because nothing is pointed
//! at a source a forger chose.

use config_snapshot_policy::model::content::Content;
use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::kinds::{self, Kind, Role};
use config_snapshot_policy::model::object::ObjectExt;
use config_snapshot_policy::model::references;
use config_snapshot_policy::model::revocation::Revocations;
use config_snapshot_policy::model::source::SourceId;
use serde_json::Value;
use std::collections::BTreeMap;

use crate::tools::release::decide::{in_use, Guard, Named};

/// What the user asked for.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Revoke the snapshots of the source's current content too.
    pub current: bool,
    /// Revoke although a workload's current template, a revision in use
    /// or a Pod names the snapshot: their pods then fail to start.
    pub running: bool,
}

/// A snapshot to revoke, and the revisions that name it (which can never
/// run again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Doomed {
    pub name: String,
    pub guard: Guard,
    /// Already in the record (a run that did not delete it all).
    pub recorded: bool,
    pub named_by: Vec<Named>,
}

/// Something that starts pods on a snapshot to revoke, and what to do
/// about it first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub snapshot: String,
    pub holder: Named,
    pub advice: String,
}

#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub revoke: Vec<Doomed>,
    /// Kept: they hold the source's current content (without `--current`).
    pub current: Vec<String>,
    /// Why the plan is refused without `--running`.
    pub running: Vec<Running>,
}

impl Plan {
    /// Whether it may be carried out as asked.
    pub fn refused(&self, options: Options) -> bool {
        !self.running.is_empty() && !options.running
    }

    /// The snapshots to revoke that are not in the record yet.
    pub fn to_record(&self) -> Vec<String> {
        self.revoke
            .iter()
            .filter(|d| !d.recorded)
            .map(|d| d.name.clone())
            .collect()
    }
}

/// Whether `snapshot` holds nothing but the source's current content:
/// every key it holds has the value `source` holds now, and (a Secret) its
/// type. A snapshot of a key subset holds the subset; one of a version
/// that lacked a key added since holds no value that is not current.
fn holds_current(source: &SourceId, snapshot: &Value, current: Option<&Value>) -> bool {
    let (Some(current), Ok(held)) = (current, Content::from_object(source.kind, snapshot)) else {
        return false;
    };
    let Ok(now) = Content::from_object(source.kind, current) else {
        return false;
    };
    let keys = held.data.keys().chain(held.binary_data.keys()).cloned().collect();
    now.subset(Some(&keys)) == held
}

fn named(kind: &'static Kind, object: &Value) -> Named {
    Named {
        kind: kind.kind,
        name: object.name().to_string(),
    }
}

fn kind_of(object: &Value) -> Option<&'static Kind> {
    kinds::find(object["kind"].as_str().unwrap_or_default())
}

/// Whether a Job or Pod has ended: no pod of it starts again.
fn ended(object: &Value) -> bool {
    let phase = object["status"]["phase"].as_str();
    let finished = object["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| matches!(c["type"].as_str(), Some("Complete" | "Failed")) && c["status"] == "True")
    });
    matches!(phase, Some("Succeeded" | "Failed")) || finished
}

/// What starts pods on the template of `object`, as read: a workload's own
/// template (what it runs and what it makes next), a revision in use (a
/// ReplicaSet scaled up, a StatefulSet's current revision), a Job or Pod
/// that has not ended. `None`: history only, which `revoke` is for, or on
/// its way out (a Pod terminating starts no container again); else what to
/// do first.
fn starts_pods(kind: &'static Kind, object: &Value, objects: &[Value], source: &SourceId) -> Option<String> {
    let controller = object.controller().and_then(|c| c["uid"].as_str());
    if object.is_deleting() {
        return None;
    }
    match kind.role {
        Role::Source(_) => None,
        Role::Workload { .. } => Some(format!(
            "roll it forward first: a change of its pod template (kubectl rollout restart) takes {source}'s current content"
        )),
        Role::Run | Role::Revision { standalone: true } if ended(object) => None,
        Role::Run | Role::Revision { standalone: true } if controller.is_none() => {
            Some("its template never changes: let it end, or delete it".to_string())
        }
        Role::Run | Role::Revision { standalone: true } => {
            Some("it runs now (a rollout, or a CronJob's Job): wait for it to end".to_string())
        }
        Role::Revision { standalone: false } => {
            let busy = match controller.and_then(|uid| objects.iter().find(|o| o.uid() == Some(uid))) {
                Some(owner) => {
                    let siblings: Vec<&Value> = objects
                        .iter()
                        .filter(|o| o["kind"] == object["kind"] && o.controller().and_then(|c| c["uid"].as_str()) == controller)
                        .collect();
                    in_use(kind, object, owner, &siblings)
                }
                None => object["spec"]["replicas"].as_i64().unwrap_or(0) > 0,
            };
            busy.then(|| "its rollout is under way: wait for it to end (kubectl rollout status)".to_string())
        }
    }
}

/// The plan for revoking `source`: `current` is the source as stored now
/// (`None`: deleted); `snapshots` the objects listed as its snapshots;
/// `holders` every workload, revision, Job and Pod of the namespace, each
/// with its `kind`; `record` what the namespace's record holds.
pub fn plan(
    source: &SourceId,
    current: Option<&Value>,
    snapshots: &[Value],
    holders: &[Value],
    record: &Revocations,
    options: Options,
) -> Plan {
    let mut plan = Plan::default();
    let mut named_by: BTreeMap<String, Vec<(&'static Kind, &Value)>> = BTreeMap::new();
    for holder in holders {
        let Some(template) = kind_of(holder).and_then(|k| Some((k, k.template_of(holder)?))) else {
            continue;
        };
        for r in references::collect(template.1) {
            if r.kind == source.kind {
                named_by.entry(r.name).or_default().push((template.0, holder));
            }
        }
    }
    for snapshot in snapshots {
        let of_source = keys::snapshot_source(snapshot) == Some(source.name.as_str()) && snapshot["immutable"] == true;
        if !of_source || snapshot.is_deleting() {
            continue;
        }
        let name = snapshot.name().to_string();
        if !options.current && holds_current(source, snapshot, current) {
            plan.current.push(name);
            continue;
        }
        let mut history = Vec::new();
        for (kind, holder) in named_by.remove(&name).unwrap_or_default() {
            match starts_pods(kind, holder, holders, source) {
                Some(advice) => plan.running.push(Running {
                    snapshot: name.clone(),
                    holder: named(kind, holder),
                    advice,
                }),
                None => history.push(named(kind, holder)),
            }
        }
        plan.revoke.push(Doomed {
            recorded: record.revoking(source, &name).is_some(),
            guard: Guard {
                uid: snapshot.uid().unwrap_or_default().to_string(),
                resource_version: snapshot.resource_version().to_string(),
            },
            name,
            named_by: history,
        });
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use config_snapshot_policy::model::revocation::Revocation;
    use config_snapshot_policy::model::source::SourceKind;
    use serde_json::json;

    fn db() -> SourceId {
        SourceId::new(SourceKind::Secret, "db")
    }

    fn source(password: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
               "metadata": {"name": "db", "namespace": "shop"}, "data": {"password": password}})
    }

    /// A snapshot of db holding `password` (and the keys in `extra`).
    fn snapshot(name: &str, data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "immutable": true,
               "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}"), "resourceVersion": "5",
                            "labels": {keys::MANAGED_BY: keys::MANAGED_BY_VALUE},
                            "annotations": {keys::SOURCE_NAME: "db"}},
               "data": data})
    }

    fn template(secret: &str) -> Value {
        json!({"spec": {"containers": [{"name": "c", "envFrom": [{"secretRef": {"name": secret}}]}]}})
    }

    fn deployment(secret: &str) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "web", "uid": "uid-web"}, "spec": {"template": template(secret)}})
    }

    fn replica_set(name: &str, secret: &str, replicas: i64) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
               "metadata": {"name": name, "uid": format!("uid-{name}"),
                            "ownerReferences": [{"uid": "uid-web", "controller": true, "kind": "Deployment", "name": "web"}]},
               "spec": {"replicas": replicas, "template": template(secret)}, "status": {"replicas": replicas}})
    }

    fn names(plan: &Plan) -> Vec<&str> {
        plan.revoke.iter().map(|d| d.name.as_str()).collect()
    }

    /// After a rotation the watch rolled: the leaked snapshot goes, and
    /// the ReplicaSet that names it (history, scaled to 0) can never run
    /// again; the snapshot of the current content stays.
    #[test]
    fn the_earlier_contents_go_and_the_current_one_stays() {
        let snapshots = [
            snapshot("db-leaked", json!({"password": "bGVha2Vk"})),
            snapshot("db-current", json!({"password": "bmV3"})),
        ];
        // The old ReplicaSet's last pod, terminating.
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-1-x",
            "deletionTimestamp": "2026-01-01T00:00:00Z", "ownerReferences": [{"uid": "uid-web-1", "controller": true}]},
            "spec": template("db-leaked")["spec"], "status": {"phase": "Running"}});
        let holders = [
            deployment("db-current"),
            replica_set("web-1", "db-leaked", 0),
            replica_set("web-2", "db-current", 1),
            pod,
        ];
        let current = source("bmV3");
        let plan = plan(
            &db(),
            Some(&current),
            &snapshots,
            &holders,
            &Revocations::default(),
            Options::default(),
        );
        assert_eq!(names(&plan), ["db-leaked"]);
        assert_eq!(plan.current, ["db-current"]);
        assert!(plan.running.is_empty() && !plan.refused(Options::default()), "{plan:?}");
        assert_eq!(
            plan.revoke[0].named_by,
            [
                Named {
                    kind: "ReplicaSet",
                    name: "web-1".into()
                },
                Named {
                    kind: "Pod",
                    name: "web-1-x".into()
                }
            ],
            "history, and a pod on its way out"
        );
        assert_eq!(plan.to_record(), ["db-leaked"]);
    }

    /// A workload whose template still names the leaked snapshot (it does
    /// not watch db) would fail to start pods: refused, with the advice
    /// to roll it forward, unless --running. A ReplicaSet still scaled up,
    /// and a Pod, are running too.
    #[test]
    fn what_runs_on_a_snapshot_refuses_the_plan_unless_told() {
        let snapshots = [snapshot("db-leaked", json!({"password": "bGVha2Vk"}))];
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-1-x",
            "ownerReferences": [{"uid": "uid-web-1", "controller": true}]},
            "spec": template("db-leaked")["spec"], "status": {"phase": "Running"}});
        let holders = [deployment("db-leaked"), replica_set("web-1", "db-leaked", 2), pod];
        let current = source("bmV3");
        let plan = plan(
            &db(),
            Some(&current),
            &snapshots,
            &holders,
            &Revocations::default(),
            Options::default(),
        );
        let running: Vec<String> = plan.running.iter().map(|r| r.holder.to_string()).collect();
        assert_eq!(running, ["deployment/web", "replicaset/web-1", "pod/web-1-x"]);
        assert!(
            plan.running[0].advice.contains("roll it forward first"),
            "{:?}",
            plan.running
        );
        assert!(plan.refused(Options::default()));
        assert!(!plan.refused(Options {
            current: false,
            running: true
        }));
    }

    /// The current content is kept unless --current; a key-subset snapshot
    /// of current values is current; an ended Job is history, not running.
    #[test]
    fn current_means_every_held_value_is_the_sources_own() {
        let snapshots = [
            snapshot("db-subset", json!({"password": "bmV3"})),
            snapshot("db-gone-key", json!({"password": "bmV3", "old": "eA=="})),
        ];
        let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "once"},
            "spec": {"template": template("db-gone-key")},
            "status": {"conditions": [{"type": "Complete", "status": "True"}]}});
        let mut current = source("bmV3");
        current["data"]["user"] = json!("YQ==");
        let plan = plan(
            &db(),
            Some(&current),
            &snapshots,
            &[job],
            &Revocations::default(),
            Options::default(),
        );
        assert_eq!(plan.current, ["db-subset"]);
        assert_eq!(names(&plan), ["db-gone-key"]);
        assert!(plan.running.is_empty(), "{plan:?}");
        let all = Options {
            current: true,
            running: false,
        };
        let plan = plan_all(&snapshots, &current, all);
        assert_eq!(names(&plan), ["db-subset", "db-gone-key"]);
        // The source deleted: nothing is current.
        let gone = super::plan(
            &db(),
            None,
            &snapshots,
            &[],
            &Revocations::default(),
            Options::default(),
        );
        assert_eq!(names(&gone).len(), 2);
    }

    fn plan_all(snapshots: &[Value], current: &Value, options: Options) -> Plan {
        plan(&db(), Some(current), snapshots, &[], &Revocations::default(), options)
    }

    /// What a run before recorded is not recorded twice; what claims to be
    /// another source's snapshot, or is not immutable, is not db's.
    #[test]
    fn only_db_s_snapshots_and_only_once_in_the_record() {
        let mut mutable = snapshot("db-mutable", json!({"password": "eA=="}));
        mutable["immutable"] = json!(false);
        let mut other = snapshot("app-x", json!({"password": "eA=="}));
        other["metadata"]["annotations"][keys::SOURCE_NAME] = json!("app");
        let snapshots = [snapshot("db-leaked", json!({"password": "bGVha2Vk"})), mutable, other];
        let record = Revocations(vec![Revocation {
            source: db(),
            at: 1,
            by: "bob".into(),
            snapshots: vec!["db-leaked".into()],
        }]);
        let current = source("bmV3");
        let plan = plan(&db(), Some(&current), &snapshots, &[], &record, Options::default());
        assert_eq!(names(&plan), ["db-leaked"]);
        assert!(plan.revoke[0].recorded);
        assert!(plan.to_record().is_empty());
    }
}
