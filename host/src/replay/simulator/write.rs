//! The API server's write path, as replay runs it: defaulting,
//! immutability, admission by the policy (or serve's webhook), persistence,
//! then the controllers that watch what changed.

use config_snapshot_policy::model::object::ObjectExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::Result;
use config_snapshot_policy::model::content::Content;
use config_snapshot_policy::model::kinds;
use config_snapshot_policy::model::source::SourceKind;
use serde_json::{json, Value};

use super::shared::lock;
use super::store::key_of;
use super::{timeline, Admission, Recorded, Simulator};
use crate::capability::{Caller, Capability};

impl Simulator {
    fn next_request_uid(&self) -> String {
        let n = self.requests.fetch_add(1, Ordering::SeqCst) + 1;
        format!("req-{n:04}")
    }

    /// Builds the AdmissionRequest the API server would send.
    pub fn admission_request(
        &self,
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
        let plural = kinds::find(kind).map_or("", |k| k.plural);
        let gvr = json!({"group": group, "version": version, "resource": plural});
        json!({
            "uid": self.next_request_uid(),
            "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
            "name": object.meta("name"),
            "namespace": object.namespace().unwrap_or("default"),
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
    pub fn review_only(&self, request: &Value) -> Result<(Admission, Option<Value>)> {
        let result = self.review(request);
        self.drop_staged(request["uid"].as_str());
        result
    }

    /// This cluster as the host of one request's calls: its store, its
    /// rules and its effects on their way.
    fn capability(&self, caller: Caller) -> Capability {
        Capability::new(
            self.shared.clone(),
            caller,
            Arc::new(self.effect_rules.clone()),
            self.in_flight.clone(),
            self.shared.clone(),
        )
    }

    /// This project's full host over the simulator's cluster, for a request
    /// whose calls are being recorded (`review --record-…`): the recorder
    /// lets only Kubewarden's reads through, and nothing is written.
    pub fn dry_run_host(&self, request: &Value) -> Arc<Capability> {
        Arc::new(self.capability(Caller {
            dry_run: true,
            ..Caller::of(request, self.now())
        }))
    }

    /// Sends one AdmissionRequest to the policy, with this cluster as host.
    /// Its deferred effects wait under its uid until [`Simulator::release`].
    pub fn review(&self, request: &Value) -> Result<(Admission, Option<Value>)> {
        let capability = Arc::new(
            self.capability(Caller::of(request, self.now()))
                .with_faults(self.shared.clone()),
        );
        let recording = lock(&self.recorder).is_some();
        let before = recording.then(|| (self.objects(), self.now()));
        let faulted = self.shared.faults_armed();
        let webhook = self.webhook.read().unwrap_or_else(|e| e.into_inner()).clone();
        let response = match webhook {
            Some(webhook) => webhook(request)?,
            None => self.engine.validate(request, &self.settings, capability.clone())?,
        };
        let uid = request["uid"].as_str().unwrap_or_default().to_string();
        lock(&self.staged).extend(capability.take_staged().into_iter().map(|e| (uid.clone(), e)));
        if let Some((before, now)) = before {
            let after = self.objects();
            if let Some(recorder) = lock(&self.recorder).as_mut() {
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
    /// persistence, then what watches what changed (the controllers, and
    /// for a source the host's watch). Admission is asked for as the
    /// shipped webhook configuration asks for it: its rules, which leave
    /// sources out, and its matchConditions, which leave out what carries
    /// none of config-snapshot's annotations.
    pub(crate) fn write(&self, object: Value, old: Option<Value>, dry_run: bool, actor: &str) -> Result<Admission> {
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
        let plural = kinds::find(&kind).map_or("", |k| k.plural);
        let called = crate::kubewarden::rules::called_for(&object, old.as_ref(), &self.effect_rules.settings);
        if self.webhook_rules.matches(&api_version, plural, operation) && called {
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
                self.drop_staged(uid.as_deref());
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
            self.drop_staged(uid.as_deref());
            return Ok(admission);
        }
        self.populate_namespace(object.namespace().unwrap_or("default"));
        let stored = self.shared.store().persist(object);
        if let Some(uid) = uid {
            self.release(&uid);
        }
        self.watch_source(old.as_ref(), &stored);
        self.wake(&stored);
        self.reconcile(&stored)?;
        self.settle()?;
        Ok(admission)
    }
}

impl Simulator {
    /// What serve's watch of sources does once a write of one is stored
    /// (docs/design.md, "Watch"): a change of its content is judged, its
    /// watchers rolled. With serve as the webhook, serve's own watch of the
    /// served cluster does it.
    fn watch_source(&self, old: Option<&Value>, stored: &Value) {
        let Some(kind) = stored["kind"].as_str().and_then(SourceKind::from_kind) else {
            return;
        };
        if self.webhook.read().unwrap_or_else(|e| e.into_inner()).is_some() {
            return;
        }
        let content = |o: &Value| Content::from_object(kind, o).ok().map(|c| c.hash());
        if old.is_some_and(|old| content(old) == content(stored)) {
            return;
        }
        self.driver().source_changed(self, &key_of(stored));
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
