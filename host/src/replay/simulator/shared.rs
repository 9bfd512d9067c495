//! The simulator's state, which the policy's host calls reach: the
//! store, replay's injected faults, the timeline it writes, and the watch
//! rollouts it saw. As a [`Cluster`] it is a plain API server without
//! admission or controllers: every write persists as it is. That is how
//! snapshots are written (the webhook's objectSelector skips them), and
//! what a host call's capability needs.

use config_snapshot_policy::model::object::ObjectExt;
use std::sync::{Mutex, MutexGuard};

use config_snapshot_policy::host::host_error::{Code, HostError};
use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::kinds;
use config_snapshot_policy::model::source::SourceId;
use serde_json::Value;

use super::store::{key_of, Store};
use crate::capability::Faults;
use crate::cluster::{self, pin, ApiError, Cluster, Preconditions, Selector};
use crate::lifecycle::verdict::apply_ops;
use crate::lifecycle::{Observer, Reason};

/// An injected host failure (replay's `fault:` step).
#[derive(Debug, Clone)]
pub struct Fault {
    pub operation: String,
    pub error: HostError,
    /// How many more calls fail; `None` for all.
    pub remaining: Option<u32>,
    /// Calls that still succeed before the failures start.
    pub after: u32,
}

/// One watch rollout applied: (kind, namespace, name, time).
pub type Rollout = (String, String, String, i64);

#[derive(Default)]
pub struct Shared {
    pub store: Mutex<Store>,
    faults: Mutex<Vec<Fault>>,
    events: Mutex<Vec<String>>,
    rollouts: Mutex<Vec<Rollout>>,
}

/// A poisoned lock still holds consistent data here: every write to these
/// is a single push or insert.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn plural(kind: &str) -> &'static str {
    kinds::find(kind).map_or("objects", |k| k.plural)
}

impl Shared {
    /// A cluster holding `objects` at time `now`, each given a uid and a
    /// resourceVersion as the API server would (tests and fuzz bodies).
    pub fn holding(objects: &[Value], now: i64) -> Shared {
        let shared = Shared::default();
        let stored: Vec<Value> = objects
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let mut o = o.clone();
                o.set_meta("uid", serde_json::json!(format!("uid-{i}")));
                o.set_meta("resourceVersion", serde_json::json!((i + 1).to_string()));
                o
            })
            .collect();
        shared.store().reset(&stored);
        shared.store().now = now;
        shared
    }

    pub fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.store)
    }

    pub(crate) fn add_fault(&self, fault: Fault) {
        lock(&self.faults).push(fault);
    }

    /// Whether an injected fault is still armed.
    pub fn faults_armed(&self) -> bool {
        lock(&self.faults).iter().any(|f| f.remaining != Some(0))
    }

    /// The timeline written since the last call.
    pub(crate) fn take_events(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.events))
    }

    /// Every watch rollout applied so far.
    pub fn rollouts(&self) -> Vec<Rollout> {
        lock(&self.rollouts).clone()
    }
}

impl Faults for Shared {
    fn fault(&self, operation: &str) -> Option<HostError> {
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
}

impl Observer for Shared {
    fn note(&self, line: String) {
        lock(&self.events).push(line);
    }

    fn tell(&self, object: &Value, reason: Reason, message: String) {
        let (kind, ns, name) = key_of(object);
        if reason == Reason::ConfigRolledOut {
            let now = self.store().now;
            lock(&self.rollouts).push((kind.clone(), ns, name.clone(), now));
        }
        self.note(format!("event {} on {kind}/{name}: {message}", reason.name()));
    }
}

/// The error an injected fault makes a cluster call fail with.
fn injected(error: HostError) -> ApiError {
    match error.code {
        Code::NotFound => ApiError::NotFound(error.message),
        Code::Conflict => ApiError::Conflict(error.message),
        Code::Forbidden | Code::Refused => ApiError::Forbidden(error.message),
        Code::Timeout => ApiError::Timeout(error.message),
        _ => ApiError::Unavailable(error.message),
    }
}

impl Cluster for Shared {
    /// The simulator is read as it is: it has no cache to lag.
    fn following(&self, _kind: &str, _namespace: &str) -> bool {
        true
    }

    fn get(&self, kind: &str, namespace: &str, name: &str) -> cluster::Result<Option<Value>> {
        Ok(self.store().get(kind, namespace, name).cloned())
    }

    fn list(
        &self,
        kind: &str,
        namespace: Option<&str>,
        selector: &Selector,
        visit: &mut dyn FnMut(&Value),
    ) -> cluster::Result<()> {
        let store = self.store();
        match namespace {
            Some(ns) => store.list(kind, ns).filter(|o| selector.matches(o)).for_each(visit),
            None => store
                .all()
                .filter(|o| o["kind"] == kind && selector.matches(o))
                .for_each(visit),
        }
        Ok(())
    }

    fn list_referencing(
        &self,
        kind: &str,
        namespace: &str,
        source: &SourceId,
        visit: &mut dyn FnMut(&Value),
    ) -> cluster::Result<()> {
        self.store().referencing(kind, namespace, source).for_each(visit);
        Ok(())
    }

    fn create(&self, object: Value) -> cluster::Result<()> {
        let mut store = self.store();
        let (kind, ns, name) = key_of(&object);
        if store.get(&kind, &ns, &name).is_some() {
            return Err(ApiError::AlreadyExists(format!(
                "{} {name:?} already exists",
                plural(&kind)
            )));
        }
        store.persist(object);
        Ok(())
    }

    fn delete(&self, kind: &str, namespace: &str, name: &str, pre: &Preconditions) -> cluster::Result<()> {
        if let Some(error) = self.fault("delete_snapshot") {
            return Err(injected(error));
        }
        let mut store = self.store();
        let existing = store
            .get(kind, namespace, name)
            .ok_or_else(|| ApiError::NotFound(format!("{} {name:?} not found", plural(kind))))?;
        if existing.uid() != Some(pre.uid.as_str())
            || pre
                .resource_version
                .as_ref()
                .is_some_and(|rv| existing.meta_str("resourceVersion") != Some(rv.as_str()))
        {
            return Err(ApiError::Conflict(format!(
                "Precondition failed: {kind} {name} changed since it was read"
            )));
        }
        store.remove(kind, namespace, name);
        Ok(())
    }

    /// A snapshot's patch (a mark, an anchor, an adoption, a release)
    /// fails as `patch_snapshot` faults say: a write lost.
    fn patch(&self, kind: &str, namespace: &str, name: &str, rv: &str, ops: Vec<Value>) -> cluster::Result<()> {
        if self.store().get(kind, namespace, name).is_some_and(keys::is_snapshot) {
            if let Some(error) = self.fault("patch_snapshot") {
                return Err(injected(error));
            }
        }
        let mut store = self.store();
        let current = store
            .get(kind, namespace, name)
            .cloned()
            .ok_or_else(|| ApiError::NotFound(format!("{} {name:?} not found", plural(kind))))?;
        let object = patched(&current, rv, &ops)?;
        store.persist(object);
        Ok(())
    }

    fn now(&self) -> i64 {
        self.store().now
    }

    fn namespace_uid(&self, namespace: &str) -> cluster::Result<Option<String>> {
        Ok(Some(super::store::Store::namespace_uid(namespace)))
    }
}

/// `current` with the JSON Patch `ops` applied, as the API server does it:
/// refused if `current` is no longer at `rv` (409) or the patch does not
/// apply (422), or it changes the data of an immutable object.
pub(super) fn patched(current: &Value, rv: &str, ops: &[Value]) -> cluster::Result<Value> {
    let (kind, _, name) = key_of(current);
    let mut object = current.clone();
    let mut pinned = vec![pin(rv)];
    pinned.extend_from_slice(ops);
    apply_ops(&mut object, &pinned).map_err(|e| ApiError::Invalid(format!("the patch could not be applied: {e}")))?;
    if object.meta("resourceVersion") != current.meta("resourceVersion") {
        return Err(ApiError::Conflict(format!(
            "Operation cannot be fulfilled on {} {name:?}: the object has been modified",
            plural(&kind)
        )));
    }
    let content = |o: &Value| (o.get("data").cloned(), o.get("binaryData").cloned());
    if current["immutable"] == true && content(current) != content(&object) {
        return Err(ApiError::Invalid(format!(
            "{kind} {name:?} is invalid: data: Forbidden: field is immutable when `immutable` is set"
        )));
    }
    Ok(object)
}
