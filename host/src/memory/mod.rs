//! The in-memory cluster behind `replay`: just enough Kubernetes to watch
//! config roll forward and back. Every write a step or a simulated
//! controller makes is first an admission request to the policy, when the
//! metadata's rules say the policy handles it.
//!
//! - [`store`]: objects, versions, generations, the clock;
//! - this module: the API server's write path (defaulting, immutability,
//!   admission, persistence) and [`Shared`], the backend host calls reach;
//! - [`controllers`]: the Deployment, StatefulSet and DaemonSet controllers
//!   and the garbage collector;
//! - [`kubectl`]: the user's verbs (`rollout undo`, `rollout restart`, …);
//! - [`effects`] and [`resync`]: replay's drivers of the shared lifecycle
//!   rules (`crate::lifecycle`), the same ones `serve` drives.

pub mod controllers;
pub mod effects;
pub mod http;
pub mod kubectl;
pub mod resync;
pub mod store;
pub mod timeline;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::{bail, Result};
use base64::Engine as _;
use config_snapshot_policy::settings::Settings;
use serde_json::{json, Value};

use crate::backend::{self, Backend, BackendError, Selector};
use crate::capability::{api_version_of, plural, Caller, Capability};
use crate::engine::Engine;
use crate::lifecycle::effects::{apply_ops, Rules as EffectRules};
use crate::lifecycle::Effect;
use crate::rules::Rules;
use store::{key_of, Store};

pub use effects::Pending;

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

/// State the policy's host calls reach, shared with the capability.
#[derive(Default)]
pub struct Shared {
    pub store: Mutex<Store>,
    pending: Mutex<Vec<Pending>>,
    faults: Mutex<Vec<Fault>>,
    events: Mutex<Vec<String>>,
    /// Drop deferred effects instead of queueing them: for benchmarks that
    /// measure admissions alone, over a store that must not change.
    pub discard_effects: bool,
}

/// A poisoned lock still holds consistent data here: every write to these
/// is a single push or insert.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// A cluster whose deferred effects are dropped, not queued (see
    /// `discard_effects`).
    pub fn discarding_effects() -> Shared {
        Shared {
            discard_effects: true,
            ..Shared::default()
        }
    }

    pub fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.store)
    }

    /// Deferred effects queued and not yet run or dropped.
    pub fn pending_effects(&self) -> usize {
        lock(&self.pending).len()
    }

    fn pending(&self) -> MutexGuard<'_, Vec<Pending>> {
        lock(&self.pending)
    }

    /// Whether an injected fault is still armed.
    pub fn faults_armed(&self) -> bool {
        lock(&self.faults).iter().any(|f| f.remaining != Some(0))
    }
}

impl Backend for Shared {
    fn get(&self, kind: &str, namespace: &str, name: &str) -> backend::Result<Option<Value>> {
        Ok(self.store().get(kind, namespace, name).cloned())
    }

    fn list(
        &self,
        kind: &str,
        namespace: &str,
        selector: &Selector,
        visit: &mut dyn FnMut(&Value),
    ) -> backend::Result<()> {
        self.store()
            .list(kind, namespace)
            .filter(|o| selector.matches(o))
            .for_each(visit);
        Ok(())
    }

    fn list_referencing(
        &self,
        kind: &str,
        namespace: &str,
        source: &config_snapshot_policy::kind::SourceId,
        visit: &mut dyn FnMut(&Value),
    ) -> backend::Result<()> {
        self.store().referencing(kind, namespace, source).for_each(visit);
        Ok(())
    }

    fn create(&self, object: Value) -> backend::Result<()> {
        let mut store = self.store();
        let (kind, ns, name) = key_of(&object);
        if store.get(&kind, &ns, &name).is_some() {
            return Err(BackendError::AlreadyExists(format!(
                "{} {name:?} already exists",
                plural(&kind)
            )));
        }
        store.persist(object);
        Ok(())
    }

    fn delete(&self, kind: &str, namespace: &str, name: &str, uid: &str, rv: Option<&str>) -> backend::Result<()> {
        let mut store = self.store();
        let existing = store
            .get(kind, namespace, name)
            .ok_or_else(|| BackendError::NotFound(format!("{} {name:?} not found", plural(kind))))?;
        let meta = &existing["metadata"];
        if meta["uid"] != uid || rv.is_some_and(|rv| meta["resourceVersion"] != rv) {
            return Err(BackendError::Conflict(format!(
                "Precondition failed: {kind} {name} changed since it was read"
            )));
        }
        store.remove(kind, namespace, name);
        Ok(())
    }

    fn patch(&self, kind: &str, namespace: &str, name: &str, ops: Vec<Value>) -> backend::Result<()> {
        let mut store = self.store();
        let mut object = store
            .get(kind, namespace, name)
            .cloned()
            .ok_or_else(|| BackendError::NotFound(format!("{} {name:?} not found", plural(kind))))?;
        let current = object["metadata"]["resourceVersion"].clone();
        apply_ops(&mut object, &ops).map_err(BackendError::Refused)?;
        // The first op pinned the version the caller read.
        if object["metadata"]["resourceVersion"] != current {
            return Err(BackendError::Conflict(format!(
                "Operation cannot be fulfilled on {} {name:?}: the object has been modified",
                plural(kind)
            )));
        }
        store.persist(object);
        Ok(())
    }

    fn defer(&self, admission_uid: &str, effect: Effect) {
        if self.discard_effects {
            return;
        }
        self.pending().push(Pending::new(admission_uid, effect));
    }

    fn awaited(&self, kind: &str, namespace: &str, name: &str) -> bool {
        let key = (kind.to_string(), namespace.to_string(), name.to_string());
        self.pending().iter().any(|p| p.effect.target().as_ref() == Some(&key))
    }

    fn now(&self) -> i64 {
        self.store().now
    }

    fn fault(&self, operation: &str) -> Option<String> {
        let mut faults = lock(&self.faults);
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
        lock(&self.events).push(event);
    }
}

/// What admission said about one write.
#[derive(Debug, Clone, Default)]
pub struct Admission {
    pub allowed: bool,
    pub message: Option<String>,
    pub warnings: Vec<String>,
    /// The policy's ValidationResponse.
    pub response: Value,
}

const ROOT_CA: &str = "kube-root-ca.crt";

/// The service account the host's own writes (watch rollouts, renewals)
/// are made as.
pub const HOST_USER: &str = "system:serviceaccount:config-snapshot:config-snapshot";

/// An admission webhook other than the in-process policy: takes an
/// AdmissionRequest, answers the policy's ValidationResponse. Serve's
/// admission path plugs in here, so the same cluster runs both.
pub type Webhook = Arc<dyn Fn(&Value) -> Result<Value> + Send + Sync>;

pub struct Simulator {
    pub shared: Arc<Shared>,
    engine: Arc<Engine>,
    /// When set, admissions go here instead of the in-process policy, and
    /// the webhook's host runs the deferred effects.
    pub webhook: Option<Webhook>,
    settings: Value,
    rules: Rules,
    pub effect_rules: EffectRules,
    requests: u64,
    /// While set, deferred effects wait: models writes that land before the
    /// host gets to their effects (replay's `together` step).
    pub hold_effects: bool,
    /// When set, every admission is recorded here.
    pub recorder: Option<Vec<Recorded>>,
    /// Every watch rollout applied: (kind, namespace, name, time).
    pub rollouts: Vec<(String, String, String, i64)>,
}

impl Simulator {
    pub fn new(engine: Arc<Engine>, settings: Value, now: i64) -> Simulator {
        let shared = Arc::new(Shared::default());
        shared.store().now = now;
        let parsed = Settings::from_json(settings.to_string().as_bytes()).unwrap_or_default();
        Simulator {
            shared,
            engine,
            webhook: None,
            settings,
            rules: Rules::embedded(),
            effect_rules: EffectRules {
                settings: parsed,
                watch_min_interval: 30,
            },
            requests: 0,
            hold_effects: false,
            recorder: None,
            rollouts: Vec::new(),
        }
    }

    pub fn note(&self, event: impl Into<String>) {
        self.shared.note(event.into());
    }

    pub fn take_events(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.shared.events))
    }

    pub fn now(&self) -> i64 {
        self.shared.now()
    }

    pub fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        self.shared.store().get(kind, namespace, name).cloned()
    }

    pub fn objects(&self) -> Vec<Value> {
        self.shared.store().all().cloned().collect()
    }

    pub fn add_fault(&self, fault: Fault) {
        lock(&self.shared.faults).push(fault);
    }

    /// What Kubernetes puts in every namespace: the root-CA publisher's
    /// `kube-root-ca.crt` ConfigMap (which `excludedSources` skips by
    /// default).
    fn populate_namespace(&self, namespace: &str) {
        let mut store = self.shared.store();
        if store.list("ConfigMap", namespace).next().is_none() && store.get("ConfigMap", namespace, ROOT_CA).is_none() {
            store.persist(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": ROOT_CA, "namespace": namespace},
                "data": {"ca.crt": "-----BEGIN CERTIFICATE-----\nreplay\n-----END CERTIFICATE-----\n"},
            }));
        }
    }

    /// Loads an initial object as-is (it predates the policy), then lets the
    /// controllers catch up.
    pub fn load(&mut self, object: Value) -> Result<()> {
        let object = prepare(object, None)?;
        self.populate_namespace(object["metadata"]["namespace"].as_str().unwrap_or("default"));
        let stored = self.shared.store().persist(object);
        self.reconcile(&stored)?;
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
        let caller = Caller::of(request);
        let handler = Arc::new(Capability {
            backend: self.shared.clone(),
            caller,
            orphan_grace_secs: self.effect_rules.settings.orphan_grace_period_secs,
        });
        let before = self.recorder.as_ref().map(|_| (self.objects(), self.now()));
        let faulted = self.shared.faults_armed();
        let response = match &self.webhook {
            Some(webhook) => webhook(request)?,
            None => self.engine.validate(request, &self.settings, handler)?,
        };
        if let Some((before, now)) = before {
            let after = self.objects();
            if let Some(recorder) = self.recorder.as_mut() {
                recorder.push(Recorded {
                    request: request.clone(),
                    settings: self.settings.clone(),
                    now,
                    before,
                    after,
                    response: response.clone(),
                    faulted,
                });
            }
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

    /// The API server's write path: validation it does itself, admission,
    /// persistence, then the controllers that watch what changed.
    pub(crate) fn write(&mut self, object: Value, old: Option<Value>, dry_run: bool, actor: &str) -> Result<Admission> {
        let (kind, _, name) = key_of(&object);
        let operation = if old.is_some() { "UPDATE" } else { "CREATE" };
        if let Some(refusal) = refuse_immutable_change(old.as_ref(), &object) {
            self.note(format!(
                "{operation} {kind}/{name} refused by the API server: field is immutable"
            ));
            return Ok(refusal);
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
                    timeline::describe_rewrite(&object, &m, old.as_ref())
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
        self.populate_namespace(object["metadata"]["namespace"].as_str().unwrap_or("default"));
        let stored = self.shared.store().persist(object);
        if let Some(uid) = uid {
            self.release(&uid);
        }
        self.reconcile(&stored)?;
        self.settle()?;
        Ok(admission)
    }

    fn drop_pending(&self, uid: Option<&str>) {
        if let Some(uid) = uid {
            self.shared.pending().retain(|p| p.admission != uid);
        }
    }

    /// The admitted write is persisted: its effects may run.
    pub(crate) fn release(&self, uid: &str) {
        for p in self.shared.pending().iter_mut().filter(|p| p.admission == uid) {
            p.released = true;
        }
    }

    /// The host's own delete of a snapshot (a sweep, a clean-up), with the
    /// host's invariants and replay's injected faults, as a guest's is.
    pub(crate) fn delete_snapshot(&self, snapshot: &Value, uid: &str, rv: &str) -> bool {
        if let Some(error) = self.shared.fault("delete_snapshot") {
            self.note(format!(
                "could not delete {}: {error}",
                snapshot["metadata"]["name"].as_str().unwrap_or_default()
            ));
            return false;
        }
        crate::capability::delete_guarded(self.shared.as_ref(), snapshot, uid, Some(rv)).is_ok()
    }

    /// Snapshots nothing may delete: the targets of pending effects.
    pub fn awaited_snapshots(&self) -> HashSet<(String, String, String)> {
        self.shared.pending().iter().filter_map(|p| p.effect.target()).collect()
    }
}

/// The API server refuses a data change of an immutable ConfigMap or Secret.
fn refuse_immutable_change(old: Option<&Value>, new: &Value) -> Option<Admission> {
    let old = old?;
    let content = |o: &Value| (o.get("data").cloned(), o.get("binaryData").cloned());
    if old["immutable"] != true || content(old) == content(new) {
        return None;
    }
    let (kind, _, name) = key_of(new);
    Some(Admission {
        allowed: false,
        message: Some(format!(
            "{kind} {name:?} is invalid: data: Forbidden: field is immutable when `immutable` is set"
        )),
        ..Default::default()
    })
}

/// What the API server does to an object before admission: fill in the
/// namespace, and fold a Secret's `stringData` into `data`.
pub(crate) fn prepare(mut object: Value, old: Option<&Value>) -> Result<Value> {
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
