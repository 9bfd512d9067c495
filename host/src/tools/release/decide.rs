//! What `config-snapshot release` does in one namespace, decided from the
//! objects alone (no API calls), so that a dry run, a real run and the
//! tests all see the same plan.
//!
//! Only snapshots this installation proves (signed by its key) are
//! released: a template naming an unproven object is left as it is, since
//! the source that object claims could be anyone's choice.

use config_snapshot_policy::model::object::ObjectExt;
use std::collections::{BTreeMap, BTreeSet};

use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::kinds::{self, Kind, Role};
use config_snapshot_policy::model::references;
use config_snapshot_policy::model::source::SourceKind;
use serde_json::Value;

use crate::cluster::proof::Prover;

/// What the user asked for.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Point back workloads whose template change rolls their pods.
    pub roll: bool,
    /// Delete the revisions of pointed-back workloads that still name
    /// snapshots (ReplicaSets with no pods, ControllerRevisions not in
    /// use), so their snapshots can go too. `rollout undo` to them is lost.
    pub prune_history: bool,
}

/// An object by kind and name (in the plan's namespace).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Named {
    pub kind: &'static str,
    pub name: String,
}

impl std::fmt::Display for Named {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.kind.to_ascii_lowercase(), self.name)
    }
}

/// A write guarded by the object's identity and version: a plan made from
/// a read never overwrites or deletes what changed since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guard {
    pub uid: String,
    pub resource_version: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Its template points back at its sources; `rolls`: that rolls its pods
    /// (a Deployment's does; a CronJob's, or an `OnDelete` StatefulSet's,
    /// does not).
    PointBack { rolls: bool, template: Value },
    /// Left on its snapshots: pointing it back would roll its pods, and
    /// `--roll` was not given.
    WouldRoll,
    /// Left on its snapshots: the source of one is gone, and pointing it
    /// back would name a missing object.
    SourceGone(String),
}

/// A workload the plan changes.
#[derive(Debug, Clone)]
pub struct Step {
    pub workload: Named,
    pub guard: Guard,
    /// Where its template is (a JSON pointer).
    pub template_path: &'static str,
    /// `None`: only its record annotations go.
    pub action: Option<Action>,
    /// config-snapshot's bookkeeping on it (`config-snapshot.io/rollback`,
    /// `watch-rollout`), removed: it changes no template.
    pub records: Vec<&'static str>,
}

/// A snapshot the plan keeps, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    pub snapshot: Named,
    pub why: String,
}

#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub steps: Vec<Step>,
    /// Revisions deleted (`--prune-history`).
    pub prune: Vec<(Named, Guard)>,
    /// Revisions `--prune-history` would delete but for their pods: the
    /// rollout is not done.
    pub busy: Vec<Named>,
    /// Pods and revisions of pointed-back workloads whose template change
    /// rolls them, still on snapshots: their rollout is not done. A run
    /// with `--roll` waits for this to empty before it collects.
    pub waiting: Vec<Named>,
    /// Proven snapshots nothing names once the plan is carried out.
    pub delete: Vec<(Named, Guard)>,
    pub keep: Vec<Kept>,
    /// Objects labelled as snapshots that this installation did not sign:
    /// never touched.
    pub unproven: Vec<Named>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty() && self.prune.is_empty() && self.delete.is_empty()
    }
}

fn guard(object: &Value) -> Guard {
    Guard {
        uid: object.uid().unwrap_or_default().to_string(),
        resource_version: object.resource_version().to_string(),
    }
}

fn named(kind: &'static Kind, object: &Value) -> Named {
    Named {
        kind: kind.kind,
        name: object.name().to_string(),
    }
}

/// The names a template references, by source kind.
fn names(template: &Value) -> BTreeSet<(SourceKind, String)> {
    references::collect(template)
        .into_iter()
        .map(|r| (r.kind, r.name))
        .collect()
}

/// `template` pointing at the sources of the proven snapshots it names,
/// without the policy's annotations: what the user wrote.
pub fn released(template: &Value, proven: &BTreeMap<(SourceKind, String), String>) -> Value {
    let mut out = template.clone();
    for r in references::collect(template) {
        if let Some(source) = proven.get(&(r.kind, r.name.clone())) {
            references::set_name(&mut out, &r.pointer, source);
        }
    }
    if let Some(annotations) = out.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) {
        annotations.retain(|k, _| !keys::is_policy_template_annotation(k));
        if annotations.is_empty() {
            out.remove_meta("annotations");
        }
    }
    out
}

/// Whether changing `workload`'s template rolls its pods.
fn rolls(kind: &Kind, workload: &Value) -> bool {
    match kind.role {
        Role::Workload { rolls, .. } => {
            rolls && workload.pointer("/spec/updateStrategy/type") != Some(&Value::from("OnDelete"))
        }
        _ => false,
    }
}

/// The controller's uid of `object`, if a controller owns it.
fn controller(object: &Value) -> Option<&str> {
    object.controller()?["uid"].as_str()
}

/// Whether revision `object` of `owner` is in use: a ReplicaSet with pods,
/// a StatefulSet's current or update revision, a DaemonSet's newest. Also
/// what `revoke` will not take from under running pods.
pub(crate) fn in_use(kind: &Kind, object: &Value, owner: &Value, siblings: &[&Value]) -> bool {
    match kind.kind {
        "ReplicaSet" => {
            object["spec"]["replicas"].as_i64().unwrap_or(1) > 0
                || object["status"]["replicas"].as_i64().unwrap_or(0) > 0
        }
        "ControllerRevision" => {
            let name = object.meta_str("name");
            let status = &owner["status"];
            if owner["kind"] == "StatefulSet" {
                name == status["currentRevision"].as_str() || name == status["updateRevision"].as_str()
            } else {
                let newest = siblings.iter().filter_map(|s| s["revision"].as_i64()).max();
                object["revision"].as_i64() == newest
            }
        }
        _ => true,
    }
}

/// The plan for one namespace's `objects` (as read: workloads, revisions,
/// Jobs, Pods and the objects labelled as snapshots, each with `kind`);
/// `sources`: the ConfigMaps and Secrets that exist there, by name. Four
/// passes: the proven snapshots, the workloads, what still names snapshots
/// below them, and what becomes of each snapshot.
pub fn plan(objects: &[Value], sources: &BTreeSet<(SourceKind, String)>, prover: &Prover, options: Options) -> Plan {
    let mut walk = Walk::over(objects, prover, options);
    walk.workloads(sources);
    walk.below_workloads();
    walk.snapshots()
}

/// What the passes of [`plan`] find, for the passes after them.
struct Walk<'a> {
    objects: &'a [Value],
    options: Options,
    plan: Plan,
    /// The proven snapshots: (kind, name) → source.
    proven: BTreeMap<(SourceKind, String), String>,
    snapshot_objects: Vec<(SourceKind, &'a Value)>,
    /// The uids of the workloads released (pointed back, or never pinned).
    released_owners: BTreeSet<String>,
    /// Every template as it will be once the plan is carried out.
    templates_after: Vec<(Named, Value)>,
}

fn kind_of(object: &Value) -> Option<&'static Kind> {
    kinds::find(object["kind"].as_str().unwrap_or_default())
}

impl<'a> Walk<'a> {
    /// The first pass: which objects labelled as snapshots are proven ours.
    fn over(objects: &'a [Value], prover: &Prover, options: Options) -> Self {
        let mut walk = Walk {
            objects,
            options,
            plan: Plan::default(),
            proven: BTreeMap::new(),
            snapshot_objects: Vec::new(),
            released_owners: BTreeSet::new(),
            templates_after: Vec::new(),
        };
        for object in objects.iter().filter(|o| keys::is_snapshot(o)) {
            let Some(Role::Source(source_kind)) = kind_of(object).map(|k| k.role) else {
                continue;
            };
            let name = object.name().to_string();
            match (prover.proves(object), keys::snapshot_source(object)) {
                (true, Some(source)) => {
                    walk.proven.insert((source_kind, name), source.to_string());
                    walk.snapshot_objects.push((source_kind, object));
                }
                _ => walk.plan.unproven.push(Named {
                    kind: source_kind.kind(),
                    name,
                }),
            }
        }
        walk
    }

    fn names_proven(&self, template: &Value) -> bool {
        names(template).iter().any(|n| self.proven.contains_key(n))
    }

    /// Workloads: point back, or say why not; their records go either way.
    fn workloads(&mut self, sources: &BTreeSet<(SourceKind, String)>) {
        for object in self.objects {
            let Some(kind) = kind_of(object) else { continue };
            let (Role::Workload { .. }, Some(path)) = (kind.role, kind.template) else {
                continue;
            };
            let Some(template) = object.pointer(path) else { continue };
            let records: Vec<&'static str> = keys::RECORDS.into_iter().filter(|k| object.has_annotation(k)).collect();
            let action = self.workload_action(kind, object, template, sources);
            if action.is_some() || !records.is_empty() {
                self.plan.steps.push(Step {
                    workload: named(kind, object),
                    guard: guard(object),
                    template_path: path,
                    action,
                    records,
                });
            }
        }
    }

    /// What becomes of one workload's template (`None`: already on its
    /// sources, released before or never pinned).
    fn workload_action(
        &mut self,
        kind: &'static Kind,
        object: &Value,
        template: &Value,
        sources: &BTreeSet<(SourceKind, String)>,
    ) -> Option<Action> {
        let uid = object.uid().unwrap_or_default().to_string();
        // A required reference whose source is gone stays on its snapshot.
        let gone = references::collect(template).into_iter().find_map(|r| {
            let source = self.proven.get(&(r.kind, r.name.clone()))?;
            let missing = !r.optional && !sources.contains(&(r.kind, source.clone()));
            missing.then(|| format!("{}/{source}", r.kind.tag()))
        });
        if let Some(source) = gone {
            self.templates_after.push((named(kind, object), template.clone()));
            return Some(Action::SourceGone(source));
        }
        if !self.names_proven(template) {
            self.released_owners.insert(uid);
            return None;
        }
        let rolls = rolls(kind, object);
        if rolls && !self.options.roll {
            self.templates_after.push((named(kind, object), template.clone()));
            return Some(Action::WouldRoll);
        }
        self.released_owners.insert(uid);
        let template = released(template, &self.proven);
        self.templates_after.push((named(kind, object), template.clone()));
        Some(Action::PointBack { rolls, template })
    }

    /// Revisions, Jobs and Pods: what still names snapshots.
    fn below_workloads(&mut self) {
        let objects = self.objects;
        let owners: BTreeMap<&str, &Value> = objects.iter().filter_map(|o| Some((o.uid()?, o))).collect();
        for object in objects {
            let Some(kind) = kind_of(object) else { continue };
            if matches!(kind.role, Role::Workload { .. } | Role::Source(_)) {
                continue;
            }
            let Some(template) = kind.template_of(object) else {
                continue;
            };
            if !self.names_proven(template) {
                continue;
            }
            let owner = controller(object).and_then(|uid| owners.get(uid).map(|o| (uid, *o)));
            // The workload above it: its controller, or its controller's.
            let workload = owner.and_then(|(uid, o)| match kind_of(o).map(|k| k.role) {
                Some(Role::Workload { .. }) => Some((uid, o)),
                _ => controller(o).and_then(|up| owners.get(up).map(|w| (up, *w))),
            });
            let rolling = workload
                .is_some_and(|(uid, w)| self.released_owners.contains(uid) && kind_of(w).is_some_and(|k| rolls(k, w)));
            let has_pods = kind.kind == "Pod"
                || (kind.kind == "ReplicaSet" && object["status"]["replicas"].as_i64().unwrap_or(0) > 0);
            if rolling && has_pods {
                self.plan.waiting.push(named(kind, object));
            }
            let prunable = kind.is_revision()
                && kind.kind != "Job"
                && self.options.prune_history
                && owner.is_some_and(|(uid, _)| self.released_owners.contains(uid));
            if let (true, Some((uid, owner))) = (prunable, owner) {
                let siblings: Vec<&Value> = objects
                    .iter()
                    .filter(|o| o["kind"] == object["kind"] && controller(o) == Some(uid))
                    .collect();
                if !in_use(kind, object, owner, &siblings) {
                    self.plan.prune.push((named(kind, object), guard(object)));
                    continue;
                }
                if kind.kind == "ReplicaSet" {
                    self.plan.busy.push(named(kind, object));
                }
            }
            self.templates_after.push((named(kind, object), template.clone()));
        }
    }

    /// Snapshots: kept while something still names them, else deleted.
    fn snapshots(self) -> Plan {
        let Walk {
            mut plan,
            templates_after,
            snapshot_objects,
            ..
        } = self;
        let mut named_by: BTreeMap<(SourceKind, String), &Named> = BTreeMap::new();
        for (holder, template) in &templates_after {
            for name in names(template) {
                named_by.entry(name).or_insert(holder);
            }
        }
        for (source_kind, object) in snapshot_objects {
            let name = object.name().to_string();
            let snapshot = Named {
                kind: source_kind.kind(),
                name: name.clone(),
            };
            match named_by.get(&(source_kind, name)) {
                None => plan.delete.push((snapshot, guard(object))),
                Some(holder) => {
                    let why = why_kept(&plan, holder);
                    plan.keep.push(Kept { snapshot, why });
                }
            }
        }
        plan
    }
}

/// Why a snapshot stays: what `holder`, which names it, is.
fn why_kept(plan: &Plan, holder: &Named) -> String {
    let action = plan
        .steps
        .iter()
        .find(|s| &s.workload == holder)
        .and_then(|s| s.action.as_ref());
    match (holder.kind, action) {
        (_, Some(Action::WouldRoll)) => format!("{holder} runs it (pointing it back rolls it: --roll)"),
        (_, Some(Action::SourceGone(source))) => format!("{holder} runs it, and its source {source} is gone"),
        ("ReplicaSet" | "ControllerRevision", _) if plan.busy.contains(holder) => {
            format!("{holder} still has pods (run release again once its rollout is done)")
        }
        ("ReplicaSet" | "ControllerRevision", _) => {
            format!("{holder} is revision history (--prune-history; it goes with the revision)")
        }
        ("Job" | "Pod", _) => format!("{holder} runs it (it goes with it)"),
        _ => format!("named by {holder}"),
    }
}

/// `objects` as they will be once the rollouts `plan` causes are done:
/// each workload pointed back with a rollout runs its new template, its
/// old pods are gone and its old revisions out of use. What a dry run
/// shows as the outcome of `--roll`.
pub(crate) fn after_rollouts(objects: &[Value], plan: &Plan) -> Vec<Value> {
    let rolled: BTreeMap<&Named, &Value> = plan
        .steps
        .iter()
        .filter_map(|s| match &s.action {
            Some(Action::PointBack { rolls: true, template }) => Some((&s.workload, template)),
            _ => None,
        })
        .collect();
    let kind_of = |o: &Value| kinds::find(o["kind"].as_str().unwrap_or_default());
    let uid = |o: &Value| o.uid().unwrap_or_default().to_string();
    let mut rolled_uids = BTreeSet::new();
    let mut out = Vec::new();
    let mut new_revisions = Vec::new();
    for object in objects {
        let Some(kind) = kind_of(object) else {
            out.push(object.clone());
            continue;
        };
        let Some(template) = rolled.get(&named(kind, object)) else {
            out.push(object.clone());
            continue;
        };
        let mut object = object.clone();
        if let Some(slot) = kind.template.and_then(|p| object.pointer_mut(p)) {
            *slot = (*template).clone();
        }
        if kind.kind == "StatefulSet" {
            // Its revisions: none is the current one any more.
            object["status"]["currentRevision"] = Value::from("(after the rollout)");
            object["status"]["updateRevision"] = Value::from("(after the rollout)");
        }
        if kind.kind == "DaemonSet" {
            new_revisions.push(
                serde_json::json!({"apiVersion": "apps/v1", "kind": "ControllerRevision",
                "metadata": {"name": "(after the rollout)", "uid": "(after the rollout)",
                    "ownerReferences": [{"uid": uid(&object), "controller": true}]},
                "revision": i64::MAX,
                "data": {"spec": {"template": template}}}),
            );
        }
        rolled_uids.insert(uid(&object));
        out.push(object);
    }
    // Their ReplicaSets scaled down, and the pods of both gone.
    let mut old_sets = BTreeSet::new();
    for object in &mut out {
        if object["kind"] == "ReplicaSet" && controller(object).is_some_and(|u| rolled_uids.contains(u)) {
            object["spec"]["replicas"] = Value::from(0);
            object["status"]["replicas"] = Value::from(0);
            old_sets.insert(uid(object));
        }
    }
    out.retain(|o| {
        !(o["kind"] == "Pod" && controller(o).is_some_and(|u| rolled_uids.contains(u) || old_sets.contains(u)))
    });
    out.extend(new_revisions);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn prover() -> Prover {
        Prover::new(&[9u8; 32])
    }

    /// A snapshot of `source` holding `mode`, signed by `prover`: its name
    /// and the object.
    fn snapshot(prover: &Prover, source: &str, mode: &str) -> (String, Value) {
        use config_snapshot_policy::model::content::{self, Content};
        use config_snapshot_policy::model::source::SourceId;
        let content = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"mode": mode}})).unwrap();
        let name = content::snapshot_name(source, &content.hash());
        let id = SourceId::new(SourceKind::ConfigMap, source);
        let mut object = content::snapshot_object(&id, "shop", &name, "1", &content);
        object["metadata"]["uid"] = json!(format!("uid-{name}"));
        object["metadata"]["resourceVersion"] = json!("1");
        prover.sign(&mut object);
        (name, object)
    }

    fn workload(kind: &str, name: &str, config: &str, extra: Value) -> Value {
        let template = json!({"metadata": {"annotations": {keys::SNAPSHOTS: "{}"}},
            "spec": {"containers": [{"name": "c", "image": "x:1", "envFrom": [{"configMapRef": {"name": config}}]}]}});
        let mut w = json!({"apiVersion": "apps/v1", "kind": kind,
            "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": "7",
                "annotations": {keys::ROLLBACK: "{}"}},
            "spec": {"template": template}});
        if kind == "CronJob" {
            let t = w["spec"]["template"].take();
            w["spec"] = json!({"jobTemplate": {"spec": {"template": t}}});
        }
        merge(&mut w, extra);
        w
    }

    fn merge(into: &mut Value, extra: Value) {
        if let (Some(a), Value::Object(b)) = (into.as_object_mut(), extra) {
            for (k, v) in b {
                match a.get_mut(&k) {
                    Some(slot @ Value::Object(_)) if v.is_object() => merge(slot, v),
                    _ => {
                        a.insert(k, v);
                    }
                }
            }
        }
    }

    fn revision(name: &str, owner: &str, config: &str, replicas: i64) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": "3",
                "ownerReferences": [{"uid": format!("uid-{owner}"), "controller": true, "kind": "Deployment", "name": owner}]},
            "spec": {"replicas": replicas, "template": {"spec": {"containers": [{"name": "c",
                "envFrom": [{"configMapRef": {"name": config}}]}]}}},
            "status": {"replicas": replicas}})
    }

    /// The sources the tests' namespace holds.
    fn present() -> BTreeSet<(SourceKind, String)> {
        ["app", "report"]
            .into_iter()
            .map(|n| (SourceKind::ConfigMap, n.to_string()))
            .collect()
    }

    fn deleted(plan: &Plan) -> Vec<&str> {
        plan.delete.iter().map(|(n, _)| n.name.as_str()).collect()
    }

    /// Without --roll, a Deployment stays on its snapshots (pointing it
    /// back would roll it) and keeps them; a CronJob, whose template change
    /// rolls nothing, is pointed back and its snapshot goes. Records go
    /// from both, and no template keeps the policy's annotations.
    #[test]
    fn without_roll_only_what_rolls_nothing_is_pointed_back() {
        let p = prover();
        let (app, app_object) = snapshot(&p, "app", "blue");
        let (report, report_object) = snapshot(&p, "report", "daily");
        let objects = vec![
            app_object,
            report_object,
            workload("Deployment", "web", &app, json!({})),
            revision("web-1", "web", &app, 2),
            workload("CronJob", "nightly", &report, json!({})),
        ];
        let plan = plan(&objects, &present(), &p, Options::default());
        let web = plan.steps.iter().find(|s| s.workload.name == "web").unwrap();
        assert_eq!(web.action, Some(Action::WouldRoll));
        assert_eq!(web.records, vec![keys::ROLLBACK]);
        let nightly = plan.steps.iter().find(|s| s.workload.name == "nightly").unwrap();
        let Some(Action::PointBack { rolls: false, template }) = &nightly.action else {
            panic!("{:?}", nightly.action)
        };
        assert_eq!(
            template["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"],
            "report"
        );
        assert!(template["metadata"].get("annotations").is_none(), "{template}");
        assert_eq!(deleted(&plan), vec![report.as_str()]);
        assert_eq!(plan.keep.len(), 1);
        assert!(plan.keep[0].why.contains("--roll"), "{:?}", plan.keep);
    }

    /// With --roll the Deployment is pointed back, but its ReplicaSets
    /// still name the snapshots: kept as history, unless --prune-history,
    /// which deletes the revisions without pods (and not one with pods).
    #[test]
    fn history_keeps_snapshots_until_pruned() {
        let p = prover();
        let (blue, blue_object) = snapshot(&p, "app", "blue");
        let (green, green_object) = snapshot(&p, "app", "green");
        let objects = vec![
            blue_object,
            green_object,
            workload("Deployment", "web", &green, json!({})),
            revision("web-1", "web", &blue, 0),
            revision("web-2", "web", &green, 1),
        ];
        let rolled = plan(
            &objects,
            &present(),
            &p,
            Options {
                roll: true,
                prune_history: false,
            },
        );
        assert!(matches!(
            rolled.steps[0].action,
            Some(Action::PointBack { rolls: true, .. })
        ));
        assert!(deleted(&rolled).is_empty(), "history names both");
        assert!(rolled.prune.is_empty());
        let pruned = plan(
            &objects,
            &present(),
            &p,
            Options {
                roll: true,
                prune_history: true,
            },
        );
        assert_eq!(
            pruned.prune.iter().map(|(n, _)| n.name.as_str()).collect::<Vec<_>>(),
            vec!["web-1"]
        );
        assert_eq!(
            pruned.busy,
            vec![Named {
                kind: "ReplicaSet",
                name: "web-2".into()
            }]
        );
        assert_eq!(deleted(&pruned), vec![blue.as_str()]);
        assert!(pruned.keep[0].why.contains("still has pods"), "{:?}", pruned.keep);
    }

    /// An object that carries the label but not this installation's
    /// signature is never repointed to the source it claims, nor deleted.
    #[test]
    fn unproven_snapshots_are_left_alone() {
        let p = prover();
        let (name, forged) = snapshot(&Prover::new(&[1u8; 32]), "someone-elses", "x");
        let objects = vec![forged, workload("CronJob", "nightly", &name, json!({}))];
        let plan = plan(
            &objects,
            &present(),
            &p,
            Options {
                roll: true,
                prune_history: true,
            },
        );
        assert_eq!(
            plan.unproven,
            vec![Named {
                kind: "ConfigMap",
                name
            }]
        );
        assert!(plan.delete.is_empty());
        let step = &plan.steps[0];
        assert_eq!(step.action, None, "not pointed at a source a forger chose");
        assert_eq!(step.records, vec![keys::ROLLBACK]);
    }

    /// An `OnDelete` StatefulSet's template change rolls nothing: it is
    /// pointed back without --roll, and its running pod keeps the
    /// snapshot it mounts.
    #[test]
    fn on_delete_statefulsets_roll_nothing() {
        let p = prover();
        let (app, app_object) = snapshot(&p, "app", "blue");
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "db-0", "uid": "uid-db-0", "ownerReferences": [{"uid": "uid-db", "controller": true}]},
            "spec": {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": app}}]}]}});
        let objects = vec![
            app_object,
            workload(
                "StatefulSet",
                "db",
                &app,
                json!({"spec": {"updateStrategy": {"type": "OnDelete"}}}),
            ),
            pod,
        ];
        let plan = plan(&objects, &present(), &p, Options::default());
        assert!(matches!(
            plan.steps[0].action,
            Some(Action::PointBack { rolls: false, .. })
        ));
        assert!(plan.delete.is_empty());
        assert!(plan.keep[0].why.contains("pod/db-0 runs it"), "{:?}", plan.keep);
    }

    /// A workload whose source was deleted stays on its snapshot: pointed
    /// back, it would name a missing ConfigMap.
    #[test]
    fn a_workload_whose_source_is_gone_keeps_its_snapshot() {
        let p = prover();
        let (app, app_object) = snapshot(&p, "app", "blue");
        let objects = vec![app_object, workload("CronJob", "nightly", &app, json!({}))];
        let plan = plan(
            &objects,
            &BTreeSet::new(),
            &p,
            Options {
                roll: true,
                prune_history: true,
            },
        );
        assert_eq!(plan.steps[0].action, Some(Action::SourceGone("configmap/app".into())));
        assert!(plan.delete.is_empty());
        assert!(plan.keep[0].why.contains("is gone"), "{:?}", plan.keep);
    }

    /// A dry run of `--roll --prune-history` shows the end: once the
    /// rollout is done, every old revision and every snapshot goes.
    #[test]
    fn after_the_rollouts_everything_goes() {
        let p = prover();
        let (blue, blue_object) = snapshot(&p, "app", "blue");
        let (green, green_object) = snapshot(&p, "app", "green");
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-2-x", "uid": "uid-pod", "ownerReferences": [{"uid": "uid-web-2", "controller": true}]},
            "spec": {"containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": green}}]}]}});
        let objects = vec![
            blue_object,
            green_object,
            workload("Deployment", "web", &green, json!({})),
            revision("web-1", "web", &blue, 0),
            revision("web-2", "web", &green, 1),
            pod,
        ];
        let options = Options {
            roll: true,
            prune_history: true,
        };
        let now = plan(&objects, &present(), &p, options);
        assert_eq!(
            now.waiting.len(),
            2,
            "the ReplicaSet with pods and its pod: {:?}",
            now.waiting
        );
        let then = plan(&after_rollouts(&objects, &now), &present(), &p, options);
        assert!(then.waiting.is_empty() && then.keep.is_empty(), "{then:?}");
        assert_eq!(then.prune.len(), 2);
        let mut gone = deleted(&then);
        gone.sort();
        let mut both = vec![blue.as_str(), green.as_str()];
        both.sort();
        assert_eq!(gone, both);
    }
}
