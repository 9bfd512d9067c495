//! The in-memory cluster behind `replay`: just enough Kubernetes to watch
//! config roll forward and back. Every write a step or a simulated
//! controller makes is first an admission request to the policy, when the
//! metadata's rules say the policy handles it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Result};
use base64::Engine as _;
use config_snapshot_policy::content::Content;
use config_snapshot_policy::kind::{SourceId, SourceKind};
use config_snapshot_policy::{keys, references, template, watch};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::capability::{api_version_of, plural, Backend, Capability, Effect, Scope, Selector};
use crate::engine::Engine;
use crate::rules::Rules;
use crate::store::{key_of, Store};

pub const REVISION_ANNOTATION: &str = "deployment.kubernetes.io/revision";
const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";
const WORKLOADS: [&str; 3] = ["Deployment", "StatefulSet", "DaemonSet"];

/// An injected host failure.
#[derive(Debug, Clone)]
pub struct Fault {
    pub operation: String,
    pub error: String,
    /// How many more calls fail; `None` for all.
    pub remaining: Option<u32>,
    /// Calls that still succeed before the failures start.
    pub after: u32,
}

/// One admission as replay evaluated it, with the cluster it saw: lets a
/// test put another backend (serve's, against an API server) in the same
/// state and check it answers the same.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub request: Value,
    pub settings: Value,
    pub now: i64,
    pub before: Vec<Value>,
    pub after: Vec<Value>,
    /// The Kubewarden ValidationResponse.
    pub response: Value,
    /// An injected fault was armed: the answer depends on it.
    pub faulted: bool,
}

/// A deferred effect and the admission it waits for.
#[derive(Debug, Clone)]
struct Pending {
    admission: String,
    /// Set once the admitted write is persisted; dropped if it never is.
    released: bool,
    effect: Effect,
    attempts: u32,
}

/// State the policy's host calls reach, shared with the capability.
#[derive(Default)]
pub struct Shared {
    pub store: Mutex<Store>,
    pending: Mutex<Vec<Pending>>,
    faults: Mutex<Vec<Fault>>,
    events: Mutex<Vec<String>>,
}

impl Shared {
    /// Deferred effects queued and not yet run or dropped.
    pub fn pending_effects(&self) -> usize {
        self.pending.lock().unwrap().len()
    }
}

impl Backend for Shared {
    fn get(&self, kind: &str, namespace: &str, name: &str) -> Result<Option<Value>, String> {
        Ok(self.store.lock().unwrap().get(kind, namespace, name).cloned())
    }

    fn list(
        &self,
        kind: &str,
        namespace: &str,
        selector: &Selector,
        visit: &mut dyn FnMut(&Value),
    ) -> Result<(), String> {
        self.store
            .lock()
            .unwrap()
            .list(kind, namespace)
            .filter(|o| selector.matches(o))
            .for_each(visit);
        Ok(())
    }

    fn create(&self, object: Value) -> Result<(), String> {
        self.store.lock().unwrap().persist(object);
        Ok(())
    }

    fn delete(&self, kind: &str, namespace: &str, name: &str, _uid: &str) -> Result<(), String> {
        self.store.lock().unwrap().remove(kind, namespace, name);
        Ok(())
    }

    fn defer(&self, admission_uid: &str, effect: Effect) {
        self.pending.lock().unwrap().push(Pending {
            admission: admission_uid.to_string(),
            released: false,
            effect,
            attempts: 0,
        });
    }

    fn now(&self) -> i64 {
        self.store.lock().unwrap().now
    }

    fn fault(&self, operation: &str) -> Option<String> {
        let mut faults = self.faults.lock().unwrap();
        let fault = faults
            .iter_mut()
            .find(|f| f.operation == operation && f.remaining != Some(0))?;
        if fault.after > 0 {
            fault.after -= 1;
            return None;
        }
        if let Some(n) = fault.remaining.as_mut() {
            *n -= 1;
        }
        Some(fault.error.clone())
    }

    fn note(&self, event: String) {
        self.events.lock().unwrap().push(event);
    }
}

/// What admission said about one write.
#[derive(Debug, Clone, Default)]
pub struct Admission {
    pub allowed: bool,
    pub message: Option<String>,
    pub warnings: Vec<String>,
    /// The response's patch, as the API server would receive it.
    pub response: Value,
}

pub struct Simulator {
    pub shared: Arc<Shared>,
    engine: Arc<Engine>,
    settings: Value,
    rules: Rules,
    /// Storm guard: the least time between two watch rollouts of one workload.
    pub watch_min_interval: i64,
    last_watch_rollout: HashMap<(String, String, String), i64>,
    requests: u64,
    /// While set, deferred effects wait: models writes that land before the
    /// host gets to their effects (replay's `together` step).
    pub hold_effects: bool,
    /// When set, every admission is recorded here.
    pub recorder: Option<Vec<Recorded>>,
}

impl Simulator {
    pub fn new(engine: Arc<Engine>, settings: Value, now: i64) -> Simulator {
        let shared = Arc::new(Shared::default());
        shared.store.lock().unwrap().now = now;
        Simulator {
            shared,
            engine,
            settings,
            rules: Rules::embedded(),
            watch_min_interval: 30,
            last_watch_rollout: HashMap::new(),
            requests: 0,
            hold_effects: false,
            recorder: None,
        }
    }

    pub fn note(&self, event: impl Into<String>) {
        self.shared.note(event.into());
    }

    pub fn take_events(&self) -> Vec<String> {
        std::mem::take(&mut *self.shared.events.lock().unwrap())
    }

    pub fn now(&self) -> i64 {
        self.shared.now()
    }

    pub fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        self.shared.store.lock().unwrap().get(kind, namespace, name).cloned()
    }

    pub fn objects(&self) -> Vec<Value> {
        self.shared.store.lock().unwrap().all().cloned().collect()
    }

    pub fn add_fault(&self, fault: Fault) {
        self.shared.faults.lock().unwrap().push(fault);
    }

    /// Loads an initial object as-is (it predates the policy), then lets the
    /// controllers catch up.
    pub fn load(&mut self, object: Value) -> Result<()> {
        let object = prepare(object, None)?;
        let stored = self.shared.store.lock().unwrap().persist(object);
        self.reconcile(&stored)?;
        self.settle()
    }

    /// Creates or updates an object, through admission.
    pub fn apply(&mut self, object: Value, dry_run: bool, actor: &str) -> Result<Admission> {
        let (kind, ns, name) = key_of(&object);
        let old = self.get(&kind, &ns, &name);
        let mut object = prepare(object, old.as_ref())?;
        if let Some(old) = &old {
            // As an apply would: server-owned fields come from the live object.
            object["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
            object["metadata"]["uid"] = old["metadata"]["uid"].clone();
            object["metadata"]["creationTimestamp"] = old["metadata"]["creationTimestamp"].clone();
            if object.get("status").is_none() {
                if let Some(status) = old.get("status") {
                    object["status"] = status.clone();
                }
            }
        }
        self.write(object, old, dry_run, actor)
    }

    /// `kubectl patch --type merge`.
    pub fn edit(&mut self, kind: &str, namespace: &str, name: &str, merge: &Value, actor: &str) -> Result<Admission> {
        let mut object = self
            .get(kind, namespace, name)
            .ok_or_else(|| anyhow!("{kind}/{name} does not exist"))?;
        let old = object.clone();
        json_patch::merge(&mut object, merge);
        let object = prepare(object, Some(&old))?;
        self.write(object, Some(old), false, actor)
    }

    pub fn delete(&mut self, kind: &str, namespace: &str, name: &str) -> Result<()> {
        if self
            .shared
            .store
            .lock()
            .unwrap()
            .remove(kind, namespace, name)
            .is_none()
        {
            bail!("{kind}/{name} does not exist");
        }
        self.note(format!("{kind}/{name} deleted"));
        self.collect_garbage();
        self.settle()
    }

    fn next_request_uid(&mut self) -> String {
        self.requests += 1;
        format!("req-{:04}", self.requests)
    }

    /// Builds the AdmissionRequest the API server would send.
    pub fn admission_request(
        &mut self,
        operation: &str,
        object: &Value,
        old: Option<&Value>,
        dry_run: bool,
        actor: &str,
    ) -> Value {
        let kind = object["kind"].as_str().unwrap_or_default();
        let api_version = object["apiVersion"].as_str().unwrap_or("v1");
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = json!({"group": group, "version": version, "kind": kind});
        let gvr = json!({"group": group, "version": version, "resource": plural(kind)});
        json!({
            "uid": self.next_request_uid(),
            "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
            "name": object["metadata"]["name"],
            "namespace": object["metadata"]["namespace"].as_str().unwrap_or("default"),
            "operation": operation,
            "userInfo": {"username": actor},
            "object": object,
            "oldObject": old,
            "dryRun": dry_run,
            "options": {},
        })
    }

    /// Evaluates a request that will not be persisted (`review`): its
    /// deferred effects are dropped, as the API server never stores it.
    pub fn review_only(&mut self, request: &Value) -> Result<(Admission, Option<Value>)> {
        let result = self.review(request);
        self.drop_pending(request["uid"].as_str());
        result
    }

    /// Sends one AdmissionRequest to the policy, with this cluster as host.
    pub fn review(&mut self, request: &Value) -> Result<(Admission, Option<Value>)> {
        let scope = Scope {
            uid: request["uid"].as_str().unwrap_or_default().to_string(),
            namespace: request["namespace"].as_str().unwrap_or("default").to_string(),
            dry_run: request["dryRun"].as_bool().unwrap_or(false),
        };
        let handler = Arc::new(Capability {
            backend: self.shared.clone(),
            scope,
        });
        let before = self.recorder.as_ref().map(|_| (self.objects(), self.now()));
        let faulted = !self.shared.faults.lock().unwrap().is_empty();
        let response = self.engine.validate(request, &self.settings, handler)?;
        if let Some((before, now)) = before {
            let after = self.objects();
            self.recorder.as_mut().expect("set").push(Recorded {
                request: request.clone(),
                settings: self.settings.clone(),
                now,
                before,
                after,
                response: response.clone(),
                faulted,
            });
        }
        let allowed = response["accepted"].as_bool().unwrap_or(false);
        let mutated = response.get("mutated_object").filter(|v| !v.is_null()).cloned();
        let admission = Admission {
            allowed,
            message: response["message"].as_str().map(str::to_string),
            warnings: response["warnings"]
                .as_array()
                .map(|w| w.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
                .unwrap_or_default(),
            response,
        };
        Ok((admission, mutated))
    }

    fn write(&mut self, object: Value, old: Option<Value>, dry_run: bool, actor: &str) -> Result<Admission> {
        let (kind, _, name) = key_of(&object);
        let operation = if old.is_some() { "UPDATE" } else { "CREATE" };
        if old
            .as_ref()
            .is_some_and(|o| o["immutable"] == true && content_fields(o) != content_fields(&object))
        {
            let message =
                format!("{kind} {name:?} is invalid: data: Forbidden: field is immutable when `immutable` is set");
            self.note(format!(
                "{operation} {kind}/{name} refused by the API server: field is immutable"
            ));
            return Ok(Admission {
                allowed: false,
                message: Some(message),
                ..Default::default()
            });
        }
        let api_version = object["apiVersion"].as_str().unwrap_or("v1").to_string();
        let mut admission = Admission {
            allowed: true,
            ..Default::default()
        };
        let mut object = object;
        let mut uid = None;
        if self.rules.matches(&api_version, &plural(&kind), operation) {
            let request = self.admission_request(operation, &object, old.as_ref(), dry_run, actor);
            uid = request["uid"].as_str().map(str::to_string);
            let (a, mutated) = self.review(&request)?;
            admission = a;
            for w in &admission.warnings {
                self.note(format!("warning: {w}"));
            }
            if !admission.allowed {
                self.note(format!(
                    "{operation} {kind}/{name} refused: {}",
                    admission.message.as_deref().unwrap_or("no message")
                ));
                self.drop_pending(uid.as_deref());
                return Ok(admission);
            }
            if let Some(m) = mutated {
                self.note(format!(
                    "{operation} {kind}/{name} admitted and mutated: {}",
                    describe_rewrite(&object, &m)
                ));
                object = m;
            } else {
                self.note(format!("{operation} {kind}/{name} admitted"));
            }
        } else {
            self.note(format!("{operation} {kind}/{name}"));
        }
        if dry_run {
            self.note(format!("dry run: {kind}/{name} not persisted"));
            self.drop_pending(uid.as_deref());
            return Ok(admission);
        }
        let stored = self.shared.store.lock().unwrap().persist(object);
        if let Some(uid) = uid {
            for p in self
                .shared
                .pending
                .lock()
                .unwrap()
                .iter_mut()
                .filter(|p| p.admission == uid)
            {
                p.released = true;
            }
        }
        self.reconcile(&stored)?;
        self.settle()?;
        Ok(admission)
    }

    fn drop_pending(&self, uid: Option<&str>) {
        if let Some(uid) = uid {
            self.shared.pending.lock().unwrap().retain(|p| p.admission != uid);
        }
    }

    /// Runs the controller of a workload after it changed.
    fn reconcile(&mut self, object: &Value) -> Result<()> {
        match object["kind"].as_str() {
            Some("Deployment") => self.reconcile_deployment(object),
            Some("StatefulSet") | Some("DaemonSet") => self.reconcile_revisions(object),
            _ => Ok(()),
        }
    }

    fn owned(&self, kind: &str, owner: &Value) -> Vec<Value> {
        let ns = owner["metadata"]["namespace"].as_str().unwrap_or("default");
        let uid = &owner["metadata"]["uid"];
        let store = self.shared.store.lock().unwrap();
        store
            .list(kind, ns)
            .filter(|o| {
                o["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|r| r["uid"] == *uid))
            })
            .cloned()
            .collect()
    }

    /// The Deployment controller: one ReplicaSet per distinct template, the
    /// newest scaled up, old ones scaled to 0 and pruned past the limit.
    fn reconcile_deployment(&mut self, deployment: &Value) -> Result<()> {
        let ns = deployment["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        let name = deployment["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let template = deployment["spec"]["template"].clone();
        let replicas = deployment["spec"]["replicas"].as_i64().unwrap_or(1);
        let sets = self.owned("ReplicaSet", deployment);
        let revision = |rs: &Value| -> i64 {
            rs["metadata"]["annotations"][REVISION_ANNOTATION]
                .as_str()
                .and_then(|r| r.parse().ok())
                .unwrap_or(0)
        };
        let max_revision = sets.iter().map(revision).max().unwrap_or(0);
        let current = sets
            .iter()
            .find(|rs| without_hash_label(&rs["spec"]["template"]) == template)
            .cloned();
        let current_name = match current {
            Some(rs) => {
                let rs_name = rs["metadata"]["name"].as_str().unwrap_or_default().to_string();
                if revision(&rs) != max_revision || rs["spec"]["replicas"] != replicas {
                    let mut rs = rs.clone();
                    if revision(&rs) != max_revision {
                        rs["metadata"]["annotations"][REVISION_ANNOTATION] = json!((max_revision + 1).to_string());
                        self.note(format!(
                            "ReplicaSet/{rs_name} is current again (revision {})",
                            max_revision + 1
                        ));
                    }
                    rs["spec"]["replicas"] = json!(replicas);
                    self.shared.store.lock().unwrap().persist(rs);
                }
                rs_name
            }
            None => {
                let hash = &template_hash(&template)[..10];
                let rs_name = format!("{name}-{hash}");
                let mut rs_template = template.clone();
                rs_template["metadata"]["labels"]["pod-template-hash"] = json!(hash);
                let mut selector = deployment["spec"]["selector"].clone();
                selector["matchLabels"]["pod-template-hash"] = json!(hash);
                let rs = json!({
                    "apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "metadata": {
                        "name": rs_name, "namespace": ns,
                        "labels": rs_template["metadata"]["labels"].clone(),
                        "annotations": {REVISION_ANNOTATION: (max_revision + 1).to_string()},
                        "ownerReferences": [owner_ref(deployment, true)],
                    },
                    "spec": {"replicas": replicas, "selector": selector, "template": rs_template},
                });
                let a = self.write(
                    rs,
                    None,
                    false,
                    "system:serviceaccount:kube-system:deployment-controller",
                )?;
                if !a.allowed {
                    bail!("ReplicaSet {rs_name} was refused: {}", a.message.unwrap_or_default());
                }
                self.note(format!("ReplicaSet/{rs_name} created (revision {})", max_revision + 1));
                rs_name
            }
        };
        // Scale the others down and prune past revisionHistoryLimit.
        let limit = deployment["spec"]["revisionHistoryLimit"].as_i64().unwrap_or(10).max(0) as usize;
        let mut old: Vec<Value> = self
            .owned("ReplicaSet", deployment)
            .into_iter()
            .filter(|rs| rs["metadata"]["name"] != current_name.as_str())
            .collect();
        for rs in &mut old {
            if rs["spec"]["replicas"] != 0 {
                rs["spec"]["replicas"] = json!(0);
                *rs = self.shared.store.lock().unwrap().persist(rs.clone());
            }
        }
        self.prune_history("ReplicaSet", &ns, old, limit, revision);
        Ok(())
    }

    /// The StatefulSet and DaemonSet controllers' ControllerRevisions.
    fn reconcile_revisions(&mut self, workload: &Value) -> Result<()> {
        let ns = workload["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        let name = workload["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let template = workload["spec"]["template"].clone();
        let revisions = self.owned("ControllerRevision", workload);
        let max_revision = revisions
            .iter()
            .filter_map(|r| r["revision"].as_i64())
            .max()
            .unwrap_or(0);
        let current = revisions.iter().find(|r| revision_template(r) == template).cloned();
        let current_name = match current {
            Some(mut cr) => {
                let cr_name = cr["metadata"]["name"].as_str().unwrap_or_default().to_string();
                if cr["revision"].as_i64() != Some(max_revision) {
                    cr["revision"] = json!(max_revision + 1);
                    self.shared.store.lock().unwrap().persist(cr);
                    self.note(format!(
                        "ControllerRevision/{cr_name} is current again (revision {})",
                        max_revision + 1
                    ));
                }
                cr_name
            }
            None => {
                let hash = &template_hash(&template)[..10];
                let cr_name = format!("{name}-{hash}");
                let mut data_template = template.clone();
                data_template["$patch"] = json!("replace");
                let mut labels = workload["spec"]["selector"]["matchLabels"].clone();
                if !labels.is_object() {
                    labels = json!({});
                }
                labels["controller-revision-hash"] = json!(hash);
                let cr = json!({
                    "apiVersion": "apps/v1", "kind": "ControllerRevision",
                    "metadata": {"name": cr_name, "namespace": ns, "labels": labels, "ownerReferences": [owner_ref(workload, true)]},
                    "data": {"spec": {"template": data_template}},
                    "revision": max_revision + 1,
                });
                let controller = format!(
                    "system:serviceaccount:kube-system:{}-controller",
                    workload["kind"].as_str().unwrap_or("").to_lowercase()
                );
                let a = self.write(cr, None, false, &controller)?;
                if !a.allowed {
                    bail!(
                        "ControllerRevision {cr_name} was refused: {}",
                        a.message.unwrap_or_default()
                    );
                }
                self.note(format!(
                    "ControllerRevision/{cr_name} created (revision {})",
                    max_revision + 1
                ));
                cr_name
            }
        };
        let limit = workload["spec"]["revisionHistoryLimit"].as_i64().unwrap_or(10).max(0) as usize;
        let old: Vec<Value> = self
            .owned("ControllerRevision", workload)
            .into_iter()
            .filter(|r| r["metadata"]["name"] != current_name.as_str())
            .collect();
        self.prune_history("ControllerRevision", &ns, old, limit, |r| {
            r["revision"].as_i64().unwrap_or(0)
        });
        Ok(())
    }

    /// Deletes the oldest of a workload's past revisions beyond
    /// `revisionHistoryLimit`, then lets the garbage collector take what
    /// they owned (their snapshots).
    fn prune_history(&self, kind: &str, ns: &str, mut old: Vec<Value>, limit: usize, revision: impl Fn(&Value) -> i64) {
        old.sort_by_key(|r| revision(r));
        let excess = old.len().saturating_sub(limit);
        for r in old.iter().take(excess) {
            let name = r["metadata"]["name"].as_str().unwrap_or_default();
            self.shared.store.lock().unwrap().remove(kind, ns, name);
            self.note(format!("{kind}/{name} pruned (revisionHistoryLimit {limit})"));
        }
        if excess > 0 {
            self.collect_garbage();
        }
    }

    /// The ownerReference garbage collector: deletes what has owners none of
    /// which exists any more, until nothing changes.
    pub fn collect_garbage(&self) {
        loop {
            let mut store = self.shared.store.lock().unwrap();
            let orphans: Vec<(String, String, String)> = store
                .all()
                .filter(|o| {
                    o["metadata"]["ownerReferences"].as_array().is_some_and(|refs| {
                        !refs.is_empty()
                            && refs
                                .iter()
                                .all(|r| !store.contains_uid(r["uid"].as_str().unwrap_or_default()))
                    })
                })
                .map(key_of)
                .collect();
            if orphans.is_empty() {
                return;
            }
            for (kind, ns, name) in orphans {
                store.remove(&kind, &ns, &name);
                drop(store);
                self.note(format!("{kind}/{name} garbage-collected"));
                store = self.shared.store.lock().unwrap();
            }
        }
    }

    /// Runs released deferred effects until none can make progress.
    pub fn settle(&mut self) -> Result<()> {
        if self.hold_effects {
            return Ok(());
        }
        for _ in 0..100 {
            let ready: Vec<Pending> = {
                let mut pending = self.shared.pending.lock().unwrap();
                let (ready, rest): (Vec<_>, Vec<_>) = pending.drain(..).partition(|p| p.released);
                *pending = rest;
                ready
            };
            if ready.is_empty() {
                return Ok(());
            }
            let mut progressed = false;
            let mut keep = Vec::new();
            for mut p in ready {
                match self.run_effect(&p.effect)? {
                    Progress::Done => progressed = true,
                    Progress::Wait => {
                        p.attempts += 1;
                        if p.attempts < 5 {
                            keep.push(p);
                        } else {
                            self.note(format!("gave up on {}", describe_effect(&p.effect)));
                        }
                    }
                    Progress::Later => keep.push(p),
                }
            }
            let waiting_only = keep.iter().all(|p| matches!(p.effect, Effect::Patch { .. }));
            self.shared.pending.lock().unwrap().extend(keep);
            if !progressed && waiting_only {
                return Ok(());
            }
        }
        Ok(())
    }

    fn run_effect(&mut self, effect: &Effect) -> Result<Progress> {
        match effect {
            Effect::Adopt {
                namespace,
                owner_kind,
                owner_name,
                snapshots,
            } => {
                let Some(owner) = self.get(owner_kind, namespace, owner_name) else {
                    return Ok(Progress::Wait);
                };
                let mut store = self.shared.store.lock().unwrap();
                for (kind, name) in snapshots {
                    let Some(mut snap) = store.get(kind, namespace, name).cloned() else {
                        continue;
                    };
                    if !keys::is_snapshot(&snap) {
                        continue;
                    }
                    let refs = snap["metadata"]["ownerReferences"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    if refs.iter().any(|r| r["uid"] == owner["metadata"]["uid"]) {
                        continue;
                    }
                    let mut refs = refs;
                    refs.push(owner_ref(&owner, false));
                    snap["metadata"]["ownerReferences"] = json!(refs);
                    store.persist(snap);
                    drop(store);
                    self.note(format!("{kind}/{name} adopted by {owner_kind}/{owner_name}"));
                    store = self.shared.store.lock().unwrap();
                }
                Ok(Progress::Done)
            }
            Effect::Patch { namespace, request } => self.apply_patch(namespace, request),
        }
    }

    /// `patch_workload`: only once the source change it was computed for is
    /// persisted, at most once per storm-guard interval per workload, with the
    /// resourceVersion precondition and a re-read on conflict.
    fn apply_patch(&mut self, namespace: &str, request: &Value) -> Result<Progress> {
        let kind = request["kind"].as_str().unwrap_or_default().to_string();
        let name = request["name"].as_str().unwrap_or_default().to_string();
        let source_kind = request["source"]["kind"].as_str().and_then(SourceKind::from_kind);
        let source_name = request["source"]["name"].as_str().unwrap_or_default();
        let (Some(source_kind), Some(snapshot)) = (source_kind, request["snapshot"].as_str()) else {
            self.note(format!("dropped a patch of {kind}/{name}: no source recorded"));
            return Ok(Progress::Done);
        };
        let source_now = self.get(source_kind.kind(), namespace, source_name);
        let landed = source_now
            .as_ref()
            .and_then(|s| Content::from_object(source_kind, s).ok())
            .is_some_and(|c| c.hash() == request["source"]["contentHash"].as_str().unwrap_or_default());
        if !landed {
            self.note(format!(
                "patch of {kind}/{name} to {snapshot} superseded: {source_name} changed again"
            ));
            return Ok(Progress::Done);
        }
        let key = (kind.clone(), namespace.to_string(), name.clone());
        let now = self.now();
        if let Some(last) = self.last_watch_rollout.get(&key) {
            if now - last < self.watch_min_interval {
                return Ok(Progress::Later);
            }
        }
        let Some(workload) = self.get(&kind, namespace, &name) else {
            self.note(format!("patch of {kind}/{name} dropped: it no longer exists"));
            return Ok(Progress::Done);
        };
        let ops = if workload["metadata"]["resourceVersion"] == request["resourceVersion"] {
            request["patch"].clone()
        } else {
            // Conflict: recompute the same intent on the fresh object.
            let id = SourceId::new(source_kind, source_name);
            self.note(format!(
                "conflict on {kind}/{name}: resourceVersion moved, re-read and recomputed the patch"
            ));
            match watch::retarget_ops(&workload["spec"]["template"], &id, snapshot) {
                Some(ops) => json!(ops),
                None => {
                    self.note(format!("patch of {kind}/{name} dropped: it no longer uses {id}"));
                    return Ok(Progress::Done);
                }
            }
        };
        let patch: json_patch::Patch = serde_json::from_value(ops)?;
        let mut patched = workload.clone();
        if let Err(e) = json_patch::patch(&mut patched, &patch) {
            self.note(format!("patch of {kind}/{name} failed: {e}"));
            return Ok(Progress::Done);
        }
        if patched == workload {
            return Ok(Progress::Done);
        }
        self.note(format!("watch: rolling out {kind}/{name} to {snapshot}"));
        self.last_watch_rollout.insert(key, now);
        let a = self.write(
            patched,
            Some(workload),
            false,
            "system:serviceaccount:config-snapshot:config-snapshot",
        )?;
        if !a.allowed {
            self.note(format!(
                "watch rollout of {kind}/{name} refused: {}",
                a.message.unwrap_or_default()
            ));
        }
        Ok(Progress::Done)
    }

    /// `kubectl rollout undo [--to-revision]`: put back a revision's template.
    pub fn rollout_undo(
        &mut self,
        kind: &str,
        namespace: &str,
        name: &str,
        to_revision: Option<i64>,
    ) -> Result<Admission> {
        let workload = self
            .get(kind, namespace, name)
            .ok_or_else(|| anyhow!("{kind}/{name} does not exist"))?;
        let mut revisions: Vec<(i64, Value)> = self.revisions(&workload);
        revisions.sort_by_key(|(r, _)| *r);
        let target = match to_revision {
            Some(0) | None => {
                if revisions.len() < 2 {
                    bail!("no rollout history found for {kind}/{name}");
                }
                revisions[revisions.len() - 2].clone()
            }
            Some(n) => revisions
                .iter()
                .find(|(r, _)| *r == n)
                .cloned()
                .ok_or_else(|| anyhow!("unable to find specified revision {n} in history"))?,
        };
        let mut updated = workload.clone();
        updated["spec"]["template"] = target.1;
        self.note(format!("kubectl rollout undo {kind}/{name} to revision {}", target.0));
        self.write(updated, Some(workload), false, "kubectl")
    }

    /// `kubectl rollout restart`.
    pub fn rollout_restart(&mut self, kind: &str, namespace: &str, name: &str) -> Result<Admission> {
        let workload = self
            .get(kind, namespace, name)
            .ok_or_else(|| anyhow!("{kind}/{name} does not exist"))?;
        let mut updated = workload.clone();
        let stamp = config_snapshot_policy::duration::format_rfc3339(self.now());
        json_patch::merge(
            &mut updated,
            &json!({"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: stamp}}}}}),
        );
        self.write(updated, Some(workload), false, "kubectl")
    }

    /// (revision number, template as kubectl would restore it) per revision.
    pub fn revisions(&self, workload: &Value) -> Vec<(i64, Value)> {
        if workload["kind"] == "Deployment" {
            self.owned("ReplicaSet", workload)
                .iter()
                .map(|rs| {
                    let r = rs["metadata"]["annotations"][REVISION_ANNOTATION]
                        .as_str()
                        .and_then(|r| r.parse().ok())
                        .unwrap_or(0);
                    (r, without_hash_label(&rs["spec"]["template"]))
                })
                .collect()
        } else {
            self.owned("ControllerRevision", workload)
                .iter()
                .map(|cr| (cr["revision"].as_i64().unwrap_or(0), revision_template(cr)))
                .collect()
        }
    }

    /// The pod template of the workload's current revision: what its pods run.
    pub fn current_revision_template(&self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let workload = self.get(kind, namespace, name)?;
        self.revisions(&workload)
            .into_iter()
            .max_by_key(|(r, _)| *r)
            .map(|(_, t)| t)
    }

    /// Moves the clock; then runs what time unblocks: storm-guarded patches,
    /// and the periodic resync that lets renew-duration fire.
    pub fn advance(&mut self, secs: i64) -> Result<()> {
        self.shared.store.lock().unwrap().now += secs;
        self.settle()?;
        self.resync_renewals()
    }

    /// Re-admits every workload with renew-duration, as `serve`'s resync does.
    pub fn resync_renewals(&mut self) -> Result<()> {
        let due: Vec<Value> = {
            let store = self.shared.store.lock().unwrap();
            store
                .all()
                .filter(|o| WORKLOADS.contains(&o["kind"].as_str().unwrap_or_default()))
                .filter(|o| o["metadata"]["annotations"].get(keys::RENEW_DURATION).is_some())
                .cloned()
                .collect()
        };
        for w in due {
            let before = w["spec"]["template"].clone();
            let a = self.write(
                w.clone(),
                Some(w.clone()),
                false,
                "system:serviceaccount:config-snapshot:resync",
            )?;
            let (kind, ns, name) = key_of(&w);
            if a.allowed
                && self
                    .get(&kind, &ns, &name)
                    .is_some_and(|now| now["spec"]["template"] != before)
            {
                self.note(format!("renew: {kind}/{name} renewed its snapshots"));
            }
        }
        Ok(())
    }
}

enum Progress {
    Done,
    /// Precondition not met yet (owner missing): retry a bounded number of times.
    Wait,
    /// Held back by the storm guard until the clock moves.
    Later,
}

fn describe_effect(effect: &Effect) -> String {
    match effect {
        Effect::Adopt {
            owner_kind, owner_name, ..
        } => format!("adoption by {owner_kind}/{owner_name}"),
        Effect::Patch { request, .. } => format!(
            "patch of {}/{}",
            request["kind"].as_str().unwrap_or(""),
            request["name"].as_str().unwrap_or("")
        ),
    }
}

/// Which references a mutation rewrote, for the timeline.
fn describe_rewrite(before: &Value, after: &Value) -> String {
    let (Some(b), Some(a)) = (before.pointer("/spec/template"), after.pointer("/spec/template")) else {
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
    let checksums = template::template_annotation(a, keys::SNAPSHOTS).is_none()
        && a.pointer("/metadata/annotations")
            .and_then(Value::as_object)
            .is_some_and(|m| m.keys().any(|k| k.starts_with(keys::CHECKSUM_PREFIX)));
    if checksums {
        parts.push("config checksums stamped".into());
    }
    if parts.is_empty() {
        "policy annotations updated".into()
    } else {
        parts.join("; ")
    }
}

/// What the API server does to an object before admission: fill in the
/// namespace, and fold a Secret's `stringData` into `data`.
fn prepare(mut object: Value, old: Option<&Value>) -> Result<Value> {
    if !object.is_object() || object["kind"].as_str().is_none() || object["metadata"]["name"].as_str().is_none() {
        bail!("an object needs kind and metadata.name");
    }
    if object["apiVersion"].as_str().is_none() {
        object["apiVersion"] = json!(api_version_of(object["kind"].as_str().unwrap_or_default()));
    }
    if object["metadata"]["namespace"].as_str().is_none() {
        object["metadata"]["namespace"] = json!(old
            .and_then(|o| o["metadata"]["namespace"].as_str())
            .unwrap_or("default"));
    }
    if object["kind"] == "Secret" {
        if let Some(Value::Object(string_data)) = object.as_object_mut().and_then(|o| o.remove("stringData")) {
            if !object["data"].is_object() {
                object["data"] = json!({});
            }
            for (k, v) in string_data {
                let encoded = base64::engine::general_purpose::STANDARD.encode(v.as_str().unwrap_or_default());
                object["data"][k] = json!(encoded);
            }
        }
        if object.get("type").is_none() {
            object["type"] = json!("Opaque");
        }
    }
    Ok(object)
}

fn content_fields(object: &Value) -> (Value, Value) {
    (
        object.get("data").cloned().unwrap_or(Value::Null),
        object.get("binaryData").cloned().unwrap_or(Value::Null),
    )
}

fn owner_ref(owner: &Value, controller: bool) -> Value {
    let mut r = json!({
        "apiVersion": owner["apiVersion"], "kind": owner["kind"],
        "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
    });
    if controller {
        r["controller"] = json!(true);
        r["blockOwnerDeletion"] = json!(true);
    }
    r
}

fn without_hash_label(template: &Value) -> Value {
    let mut t = template.clone();
    if let Some(labels) = t.pointer_mut("/metadata/labels").and_then(Value::as_object_mut) {
        labels.remove("pod-template-hash");
    }
    t
}

fn revision_template(cr: &Value) -> Value {
    let mut t = cr["data"]["spec"]["template"].clone();
    if let Some(o) = t.as_object_mut() {
        o.remove("$patch");
    }
    t
}

/// A stable hash of a template: keys sorted, so field order never matters.
pub fn template_hash(template: &Value) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                Value::Object(keys.into_iter().map(|k| (k.clone(), sorted(&m[k]))).collect())
            }
            Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    config_snapshot_policy::content::hex(&Sha256::digest(sorted(template).to_string().as_bytes()))
}
