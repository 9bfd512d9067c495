//! The host side of the policy's calls: Kubewarden's reads with the SDK's
//! exact payloads, and the `config-snapshot`/`v1` write capability with the
//! invariants of docs/design.md ("Host capability contract") enforced here,
//! whatever the guest asks.
//!
//! It sits on a [`Backend`] (the in-memory cluster for replay, the API
//! server for serve), so every backend gets the same checks.

use std::sync::Arc;

use config_snapshot_policy::content::Content;
use config_snapshot_policy::duration::format_rfc3339;
use config_snapshot_policy::keys;
use config_snapshot_policy::kind::SourceKind;
use config_snapshot_policy::operation::{Operation, CONFIG_SNAPSHOT, KUBEWARDEN};
use config_snapshot_policy::sweep::must_mark_reuse;
use config_snapshot_policy::workload::escape;
use serde::Deserialize;
use serde_json::{json, Value};

pub use crate::backend::{Backend, BackendError, Selector};
use crate::engine::CallHandler;
use crate::lifecycle::effects::{adopt_ops, precondition};
pub use crate::lifecycle::Effect;
use crate::masks;

/// The admission request a set of host calls belongs to: whose namespace
/// they may write in, under which uid effects are deferred, and whether
/// writes are refused (dry run).
#[derive(Debug, Clone)]
pub struct Caller {
    pub uid: String,
    pub namespace: String,
    pub dry_run: bool,
}

impl Caller {
    /// The caller an AdmissionRequest (as JSON) makes.
    pub fn of(request: &Value) -> Caller {
        Caller {
            uid: request["uid"].as_str().unwrap_or_default().to_string(),
            namespace: request["namespace"].as_str().unwrap_or("default").to_string(),
            dry_run: request["dryRun"].as_bool().unwrap_or(false),
        }
    }
}

/// A host call's answer: a value, or bytes already serialised.
enum Reply {
    Json(Value),
    Raw(Vec<u8>),
}

pub struct Capability {
    pub backend: Arc<dyn Backend>,
    pub caller: Caller,
    /// The policy's `orphanGracePeriod`: how long the sweep leaves an unused
    /// snapshot, which decides when a reuse must mark it used.
    pub orphan_grace_secs: u64,
}

impl CallHandler for Capability {
    fn call(&self, binding: &str, namespace: &str, operation: &str, payload: &[u8]) -> Result<Vec<u8>, String> {
        if let Some(error) = self.backend.fault(operation) {
            return Err(error);
        }
        let Some(op) = Operation::parse(binding, namespace, operation) else {
            return Err(if [KUBEWARDEN, CONFIG_SNAPSHOT].contains(&(binding, namespace)) {
                format!("unknown operation {binding}/{namespace}/{operation}")
            } else {
                format!("unknown binding {binding}/{namespace}")
            });
        };
        if op.writes() && self.caller.dry_run {
            return Err(format!("refused {operation}: no writes during a dry-run request"));
        }
        let answer = match op {
            Operation::GetResource => self.get_resource(payload)?,
            Operation::ListResourcesByNamespace => self.list_resources(payload)?,
            // The replay and serve hosts act with their own RBAC; the policy
            // never needs to ask, but a call must not fail.
            Operation::CanI => Reply::Json(json!({"allowed": true, "reason": "config-snapshot host"})),
            Operation::Now => Reply::Json(json!({"unix": self.backend.now()})),
            Operation::CreateSnapshot => Reply::Json(self.create_snapshot(parse(operation, payload)?)?),
            Operation::Adopt => Reply::Json(self.adopt(parse(operation, payload)?)?),
            Operation::DeleteSnapshot => Reply::Json(self.delete_snapshot(parse(operation, payload)?)?),
            Operation::PatchWorkload => Reply::Json(self.patch_workload(parse(operation, payload)?)?),
            Operation::ListReferencing => self.list_referencing(payload)?,
        };
        match answer {
            Reply::Raw(bytes) => Ok(bytes),
            Reply::Json(value) => serde_json::to_vec(&value).map_err(|e| e.to_string()),
        }
    }
}

#[derive(Deserialize)]
struct GetRequest {
    api_version: String,
    kind: String,
    name: String,
    namespace: Option<String>,
    #[serde(default)]
    disable_cache: bool,
    #[serde(default)]
    field_masks: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct ListRequest {
    api_version: String,
    kind: String,
    namespace: String,
    label_selector: Option<String>,
    #[serde(default)]
    field_masks: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct ReferencingRequest {
    kind: String,
    namespace: String,
    source_kind: String,
    source_name: String,
    #[serde(default)]
    field_masks: Option<Vec<String>>,
}

fn parse<'a, T: Deserialize<'a>>(operation: &str, payload: &'a [u8]) -> Result<T, String> {
    serde_json::from_slice(payload).map_err(|e| format!("invalid {operation} request: {e}"))
}

/// A list answer (`{"apiVersion", "kind": "…List", "items"}`) of what
/// `list` visits, each item pruned to `masks`. Written by hand around the
/// items so each is serialised straight from the store, pruned on the fly.
fn masked_list(
    api_version: &str,
    kind: &str,
    masks: Option<Vec<String>>,
    list: impl FnOnce(&mut dyn FnMut(&Value)) -> crate::backend::Result<()>,
) -> Result<Reply, String> {
    let masks = masks.unwrap_or_default();
    let split: Vec<Vec<&str>> = masks.iter().map(|m| m.split('.').collect()).collect();
    let mut out = format!(
        r#"{{"apiVersion":{},"kind":"{kind}List","metadata":{{}},"items":["#,
        json!(api_version)
    )
    .into_bytes();
    let mut first = true;
    let mut failed = None;
    list(&mut |object| {
        if !first {
            out.push(b',');
        }
        first = false;
        if let Err(e) = serde_json::to_writer(&mut out, &masks::Masked::new(object, &split)) {
            failed = Some(e.to_string());
        }
    })
    .map_err(|e| e.to_string())?;
    if let Some(e) = failed {
        return Err(e);
    }
    out.extend_from_slice(b"]}");
    Ok(Reply::Raw(out))
}

/// The API server's plural, for error texts that match kube's.
pub fn plural(kind: &str) -> String {
    format!("{}s", kind.to_ascii_lowercase())
}

pub fn api_version_of(kind: &str) -> &'static str {
    match kind {
        "ConfigMap" | "Secret" | "Pod" => "v1",
        _ => "apps/v1",
    }
}

impl Capability {
    fn get_resource(&self, payload: &[u8]) -> Result<Reply, String> {
        let req: GetRequest = parse(Operation::GetResource.name(), payload)?;
        check_api_version(&req.api_version, &req.kind)?;
        let ns = req.namespace.unwrap_or_default();
        let object = if req.disable_cache {
            self.backend.get_fresh(&req.kind, &ns, &req.name)
        } else {
            self.backend.get(&req.kind, &ns, &req.name)
        }
        .map_err(|e| e.to_string())?;
        let object = object.ok_or_else(|| format!("{} {:?} not found (NotFound)", plural(&req.kind), req.name))?;
        Ok(Reply::Json(masks::prune(&object, &req.field_masks.unwrap_or_default())))
    }

    fn list_resources(&self, payload: &[u8]) -> Result<Reply, String> {
        let req: ListRequest = parse(Operation::ListResourcesByNamespace.name(), payload)?;
        check_api_version(&req.api_version, &req.kind)?;
        let selector = Selector::parse(req.label_selector.as_deref().unwrap_or(""))?;
        masked_list(&req.api_version, &req.kind, req.field_masks, |visit| {
            self.backend.list(&req.kind, &req.namespace, &selector, visit)
        })
    }

    /// The workloads referencing a source, from the backend's index, in the
    /// shape of a list answer (docs/design.md, "Host capability contract").
    fn list_referencing(&self, payload: &[u8]) -> Result<Reply, String> {
        let req: ReferencingRequest = parse(Operation::ListReferencing.name(), payload)?;
        if config_snapshot_policy::workload::WorkloadKind::from_kind(&req.kind).is_none() {
            return Err(format!(
                "refused: list_referencing lists Deployments, StatefulSets or DaemonSets, not {}",
                req.kind
            ));
        }
        let source_kind = SourceKind::from_kind(&req.source_kind)
            .ok_or_else(|| format!("refused: a source is a ConfigMap or a Secret, not {}", req.source_kind))?;
        let source = config_snapshot_policy::kind::SourceId::new(source_kind, &req.source_name);
        masked_list("apps/v1", &req.kind, req.field_masks, |visit| {
            self.backend.list_referencing(&req.kind, &req.namespace, &source, visit)
        })
    }

    fn create_snapshot(&self, request: Value) -> Result<Value, String> {
        let mut object = request
            .get("object")
            .cloned()
            .ok_or("create_snapshot needs an object")?;
        let kind = object["kind"]
            .as_str()
            .and_then(SourceKind::from_kind)
            .ok_or("refused: a snapshot is a ConfigMap or a Secret")?;
        let name = object["metadata"]["name"]
            .as_str()
            .ok_or("refused: a snapshot needs a name")?
            .to_string();
        match object["metadata"]["namespace"].as_str() {
            None => object["metadata"]["namespace"] = json!(self.caller.namespace),
            Some(ns) if ns == self.caller.namespace => {}
            Some(ns) => {
                return Err(format!(
                    "refused: snapshot {name} is in namespace {ns}, the request is in {}",
                    self.caller.namespace
                ))
            }
        }
        require_managed(&object, &name)?;
        if object["immutable"] != true {
            return Err(format!("refused: snapshot {name} must be immutable"));
        }
        let content = Content::from_object(kind, &object).map_err(|e| format!("refused: snapshot {name}: {e}"))?;
        let hash = content.hash();
        if !name.ends_with(&format!("-{}", &hash[..10]))
            || object["metadata"]["annotations"][keys::CONTENT_HASH] != hash.as_str()
        {
            return Err(format!("refused: snapshot {name} does not match its content hash"));
        }
        let owner = self.owner(&request)?;
        let ns = self.caller.namespace.clone();
        // A cached read first: most snapshots made are new, and most reused
        // ones are owned, and neither needs more.
        let existing = self.backend.get(kind.kind(), &ns, &name).map_err(|e| e.to_string())?;
        let mut existing = match existing {
            // Whether an unowned snapshot must be marked is decided on a
            // read as fresh as the request: a cache could show one since
            // deleted (which only the write would catch), or one since
            // marked. serve has read it ahead, beside the policy.
            Some(found) if !owned(&found) => self
                .backend
                .get_fresh(kind.kind(), &ns, &name)
                .map_err(|e| e.to_string())?,
            Some(found) => Some(found),
            None => match self.backend.create(object.clone()) {
                Ok(()) => {
                    self.backend.note(format!("snapshot {}/{name} created", kind.kind()));
                    return Ok(json!({"created": true}));
                }
                // Another replica (or a concurrent admission) created it
                // first: content addressing makes that the same snapshot,
                // if it is ours.
                Err(BackendError::AlreadyExists(_)) => self
                    .backend
                    .get_fresh(kind.kind(), &ns, &name)
                    .map_err(|e| e.to_string())?,
                Err(e) => return Err(e.to_string()),
            },
        };
        // A reused snapshot must outlive this admission's reference to it:
        // - unowned, it is marked used, so a sweep that judged it unused a
        //   moment ago cannot delete it (its delete carries the version it
        //   judged, which this write changes). Unless it was used recently
        //   enough that no sweep may judge it before this request is stored
        //   (`sweep::must_mark_reuse`);
        // - owned by revisions (maybe of another workload), the workload
        //   becomes an owner too (a bridge), so the garbage collector cannot
        //   take it when those revisions go before the workload's own
        //   revision adopts it.
        for _ in 0..3 {
            let Some(found) = existing.take() else {
                return match self.backend.create(object.clone()) {
                    Ok(()) => {
                        self.backend.note(format!("snapshot {}/{name} created", kind.kind()));
                        Ok(json!({"created": true}))
                    }
                    Err(e) => Err(e.to_string()),
                };
            };
            same_snapshot(kind, &found, &content, &name)?;
            let ops = match (&owner, owned(&found)) {
                (None, true) => return Ok(json!({"created": false})),
                (Some(owner), true) if owner["metadata"]["uid"].is_null() => {
                    // A workload being created has no uid yet: it becomes
                    // an owner once it exists.
                    self.backend.defer(
                        &self.caller.uid,
                        Effect::Adopt {
                            namespace: ns.clone(),
                            owner_kind: owner["kind"].as_str().unwrap_or_default().to_string(),
                            owner_name: owner["metadata"]["name"].as_str().unwrap_or_default().to_string(),
                            snapshots: vec![(kind.kind().to_string(), name.clone())],
                        },
                    );
                    return Ok(json!({"created": false}));
                }
                (Some(owner), true) => match adopt_ops(owner, &found) {
                    Some(ops) => ops,
                    None => return Ok(json!({"created": false})),
                },
                (_, false) if !must_mark_reuse(&found, self.backend.now(), self.orphan_grace_secs) => {
                    return Ok(json!({"created": false}));
                }
                (_, false) => {
                    let path = format!("/metadata/annotations/{}", escape(keys::LAST_USED_AT));
                    let now = format_rfc3339(self.backend.now());
                    vec![precondition(&found), json!({"op": "add", "path": path, "value": now})]
                }
            };
            match self.backend.patch(kind.kind(), &ns, &name, ops) {
                Ok(()) => return Ok(json!({"created": false})),
                Err(BackendError::NotFound(_)) => existing = None,
                Err(BackendError::Conflict(_)) => {
                    existing = self
                        .backend
                        .get_fresh(kind.kind(), &ns, &name)
                        .map_err(|e| e.to_string())?;
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        Err(format!(
            "refused: snapshot {name} kept changing while it was reused; try again"
        ))
    }

    /// The workload an admission makes name the snapshot, as an owner
    /// object: a Deployment, StatefulSet or DaemonSet in the request's
    /// namespace, and if it names a uid, the live object with that uid.
    fn owner(&self, request: &Value) -> Result<Option<Value>, String> {
        let Some(owner) = request.get("owner").filter(|o| !o.is_null()) else {
            return Ok(None);
        };
        let kind = owner["kind"].as_str().unwrap_or_default();
        let name = owner["name"].as_str().unwrap_or_default();
        if config_snapshot_policy::workload::WorkloadKind::from_kind(kind).is_none() || name.is_empty() {
            return Err(format!(
                "refused: a snapshot's owner must be a Deployment, StatefulSet or DaemonSet, not {kind:?}"
            ));
        }
        let uid = owner["uid"].as_str().filter(|u| !u.is_empty());
        if let Some(uid) = uid {
            let live = self
                .backend
                .get(kind, &self.caller.namespace, name)
                .map_err(|e| e.to_string())?;
            if live.as_ref().map(|l| &l["metadata"]["uid"]) != Some(&json!(uid)) {
                return Err(format!("refused: owner {kind}/{name} with uid {uid} does not exist"));
            }
        }
        Ok(Some(json!({
            "apiVersion": "apps/v1", "kind": kind,
            "metadata": {"name": name, "uid": uid},
        })))
    }

    fn adopt(&self, request: Value) -> Result<Value, String> {
        let owner_kind = request["owner"]["kind"].as_str().unwrap_or_default().to_string();
        if owner_kind != "ReplicaSet" && owner_kind != "ControllerRevision" {
            return Err(format!(
                "refused: adopt owner must be a ReplicaSet or ControllerRevision, not {owner_kind:?}"
            ));
        }
        let owner_name = request["owner"]["name"]
            .as_str()
            .ok_or("refused: adopt needs owner.name")?
            .to_string();
        let mut snapshots = Vec::new();
        for s in request["snapshots"]
            .as_array()
            .ok_or("refused: adopt needs snapshots")?
        {
            let (Some(kind), Some(name)) = (s["kind"].as_str(), s["name"].as_str()) else {
                return Err("refused: each snapshot needs kind and name".into());
            };
            if SourceKind::from_kind(kind).is_none() {
                return Err(format!("refused: cannot adopt a {kind}"));
            }
            snapshots.push((kind.to_string(), name.to_string()));
        }
        self.backend.defer(
            &self.caller.uid,
            Effect::Adopt {
                namespace: self.caller.namespace.clone(),
                owner_kind,
                owner_name,
                snapshots,
            },
        );
        Ok(json!({"queued": true}))
    }

    fn delete_snapshot(&self, request: Value) -> Result<Value, String> {
        let (Some(kind), Some(name), Some(uid)) = (
            request["kind"].as_str(),
            request["name"].as_str(),
            request["uid"].as_str(),
        ) else {
            return Err("refused: delete_snapshot needs kind, name and uid".into());
        };
        let rv = request["resourceVersion"].as_str();
        if SourceKind::from_kind(kind).is_none() {
            return Err(format!("refused: cannot delete a {kind}"));
        }
        let ns = &self.caller.namespace;
        let existing = self
            .backend
            .get(kind, ns, name)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{} {name:?} not found (NotFound)", plural(kind)))?;
        delete_guarded(self.backend.as_ref(), &existing, uid, rv)?;
        self.backend.note(format!("snapshot {kind}/{name} swept"));
        Ok(json!({"deleted": true}))
    }

    fn patch_workload(&self, request: Value) -> Result<Value, String> {
        let kind = request["kind"].as_str().unwrap_or_default();
        if config_snapshot_policy::workload::WorkloadKind::from_kind(kind).is_none()
            || request["apiVersion"] != "apps/v1"
        {
            return Err(format!(
                "refused: patch_workload applies to apps/v1 workloads, not {kind:?}"
            ));
        }
        let ops = request["patch"]
            .as_array()
            .ok_or("refused: patch_workload needs a patch")?;
        for op in ops {
            for field in ["path", "from"] {
                if let Some(path) = op.get(field).and_then(Value::as_str) {
                    if !path.starts_with("/spec/template/") {
                        return Err(format!(
                            "refused: patch_workload may touch only /spec/template/..., not {path}"
                        ));
                    }
                }
            }
        }
        json_patch::Patch::deserialize(&request["patch"]).map_err(|e| format!("refused: invalid JSON Patch: {e}"))?;
        self.backend.defer(
            &self.caller.uid,
            Effect::Patch {
                namespace: self.caller.namespace.clone(),
                request,
            },
        );
        Ok(json!({"queued": true}))
    }
}

/// `Ok` if `existing` is this very snapshot; refused otherwise.
fn same_snapshot(kind: SourceKind, existing: &Value, content: &Content, name: &str) -> Result<(), String> {
    let same = Content::from_object(kind, existing)
        .map(|c| c == *content)
        .unwrap_or(false);
    if same && keys::is_snapshot(existing) {
        return Ok(());
    }
    Err(format!(
        "refused: a different {} named {name} already exists",
        kind.kind()
    ))
}

fn owned(object: &Value) -> bool {
    object["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|o| !o.is_empty())
}

/// Deletes a snapshot with the host's invariants, whoever asks (the
/// guest's sweep, the timed sweep, a dropped patch's clean-up): only ours,
/// only the very object and version that was judged, never one a queued
/// watch rollout is about to reference.
pub fn delete_guarded(backend: &dyn Backend, snapshot: &Value, uid: &str, rv: Option<&str>) -> Result<(), String> {
    let meta = &snapshot["metadata"];
    let (kind, ns, name) = (
        snapshot["kind"].as_str().unwrap_or_default(),
        meta["namespace"].as_str().unwrap_or_default(),
        meta["name"].as_str().unwrap_or_default(),
    );
    require_managed(snapshot, name)?;
    if meta["uid"] != uid {
        return Err(format!("conflict: {kind} {name} has another uid"));
    }
    if backend.awaited(kind, ns, name) {
        return Err(format!(
            "refused: {kind} {name} is the target of a queued watch rollout"
        ));
    }
    backend.delete(kind, ns, name, uid, rv).map_err(|e| e.to_string())
}

fn check_api_version(api_version: &str, kind: &str) -> Result<(), String> {
    let expected = api_version_of(kind);
    if api_version == expected {
        Ok(())
    } else {
        Err(format!(
            "the server could not find the requested resource: {api_version} {kind}"
        ))
    }
}

fn require_managed(object: &Value, name: &str) -> Result<(), String> {
    if keys::is_snapshot(object) {
        Ok(())
    } else {
        Err(format!(
            "refused: {name} lacks the label {}={}",
            keys::MANAGED_BY,
            keys::MANAGED_BY_VALUE
        ))
    }
}

/// Host invariants, tested at the capability with a hostile caller's
/// payloads: every refused call must leave the backend untouched.
#[cfg(test)]
mod invariant_tests {
    use super::*;
    use config_snapshot_policy::content::snapshot_object;
    use config_snapshot_policy::kind::SourceId;
    use std::sync::Mutex;

    /// The in-memory cluster, with every write that lands written down and
    /// deferred effects kept here instead of queued.
    #[derive(Default)]
    struct Recorder {
        cluster: crate::memory::Shared,
        writes: Mutex<Vec<String>>,
        deferred: Mutex<Vec<Effect>>,
        /// Plays a cache that has not seen another replica's write yet:
        /// `get` misses, `get_fresh` and `create` see the truth.
        stale_cache: bool,
        /// A version `get` keeps answering for its name, as a cache that
        /// missed the object's deletion would.
        pinned: Mutex<Option<Value>>,
    }

    impl Recorder {
        fn put(&self, object: Value) {
            self.cluster.store().persist(object);
        }

        fn landed(&self, result: crate::backend::Result<()>, what: String) -> crate::backend::Result<()> {
            if result.is_ok() {
                self.writes.lock().unwrap().push(what);
            }
            result
        }
    }

    impl Backend for Recorder {
        fn get(&self, kind: &str, ns: &str, name: &str) -> crate::backend::Result<Option<Value>> {
            if self.stale_cache {
                return Ok(None);
            }
            if let Some(pinned) = self
                .pinned
                .lock()
                .unwrap()
                .as_ref()
                .filter(|p| p["metadata"]["name"] == name)
            {
                return Ok(Some(pinned.clone()));
            }
            self.cluster.get(kind, ns, name)
        }
        fn get_fresh(&self, kind: &str, ns: &str, name: &str) -> crate::backend::Result<Option<Value>> {
            self.cluster.get(kind, ns, name)
        }
        fn list(
            &self,
            kind: &str,
            ns: &str,
            selector: &Selector,
            visit: &mut dyn FnMut(&Value),
        ) -> crate::backend::Result<()> {
            self.cluster.list(kind, ns, selector, visit)
        }
        fn list_referencing(
            &self,
            kind: &str,
            ns: &str,
            source: &SourceId,
            visit: &mut dyn FnMut(&Value),
        ) -> crate::backend::Result<()> {
            self.cluster.list_referencing(kind, ns, source, visit)
        }
        fn create(&self, object: Value) -> crate::backend::Result<()> {
            let what = format!("create {}", object["metadata"]["name"]);
            self.landed(self.cluster.create(object), what)
        }
        fn delete(&self, kind: &str, ns: &str, name: &str, uid: &str, rv: Option<&str>) -> crate::backend::Result<()> {
            self.landed(self.cluster.delete(kind, ns, name, uid, rv), format!("delete {name}"))
        }
        fn patch(&self, kind: &str, ns: &str, name: &str, ops: Vec<Value>) -> crate::backend::Result<()> {
            self.landed(self.cluster.patch(kind, ns, name, ops), format!("annotate {name}"))
        }
        fn defer(&self, _: &str, effect: Effect) {
            self.deferred.lock().unwrap().push(effect);
        }
        fn now(&self) -> i64 {
            self.cluster.now()
        }
    }

    fn capability(dry_run: bool) -> (Arc<Recorder>, Capability) {
        let backend = Arc::new(Recorder::default());
        backend.put(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "plain", "namespace": "team-a", "uid": "u1"}, "data": {"a": "1"}}));
        (backend.clone(), capability_on(backend, dry_run))
    }

    fn capability_on(backend: Arc<Recorder>, dry_run: bool) -> Capability {
        Capability {
            backend,
            caller: Caller {
                uid: "r".into(),
                namespace: "team-a".into(),
                dry_run,
            },
            orphan_grace_secs: 600,
        }
    }

    fn good_snapshot(ns: &str) -> Value {
        let content = Content::from_object(SourceKind::ConfigMap, &json!({"data": {"k": "v"}})).unwrap();
        snapshot_object(&SourceId::new(SourceKind::ConfigMap, "app"), ns, "1", &content).1
    }

    fn write(cap: &Capability, op: &str, body: Value) -> Result<Vec<u8>, String> {
        cap.call("config-snapshot", "v1", op, &serde_json::to_vec(&body).unwrap())
    }

    fn assert_refused(result: Result<Vec<u8>, String>, backend: &Recorder, why: &str) {
        let err = result.expect_err(why);
        assert!(err.contains("refused") || err.contains("conflict"), "{why}: {err}");
        assert!(backend.writes.lock().unwrap().is_empty(), "{why}: a write happened");
        assert!(
            backend.deferred.lock().unwrap().is_empty(),
            "{why}: an effect was queued"
        );
    }

    /// `list_referencing` answers, even in a dry run, only the workloads
    /// whose template references the source, pruned to the masks; it
    /// refuses kinds that are not workloads or sources.
    #[test]
    fn list_referencing_answers_the_referrers_only() {
        let (backend, cap) = capability(true);
        for (name, source) in [("web", "app"), ("api", "other")] {
            backend.put(json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "namespace": "team-a", "labels": {"team": "a"}},
                "spec": {"template": {"spec": {"containers": [{"name": "c",
                    "envFrom": [{"configMapRef": {"name": source}}]}]}}}}));
        }
        let ask = |kind: &str, source_kind: &str| {
            write(
                &cap,
                "list_referencing",
                json!({"kind": kind, "namespace": "team-a", "source_kind": source_kind,
                       "source_name": "app", "field_masks": ["metadata.name"]}),
            )
        };
        let answer: Value = serde_json::from_slice(&ask("Deployment", "ConfigMap").unwrap()).unwrap();
        assert_eq!(answer["items"], json!([{"metadata": {"name": "web"}}]));
        let refused = ask("ReplicaSet", "ConfigMap").unwrap_err();
        assert!(refused.starts_with("refused: list_referencing lists"), "{refused}");
        let refused = ask("Deployment", "Pod").unwrap_err();
        assert!(
            refused.starts_with("refused: a source is a ConfigMap or a Secret"),
            "{refused}"
        );
    }

    #[test]
    fn a_good_snapshot_is_created_once() {
        let (backend, cap) = capability(false);
        let answer = write(&cap, "create_snapshot", json!({"object": good_snapshot("team-a")})).unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&answer).unwrap(),
            json!({"created": true})
        );
        let again = write(&cap, "create_snapshot", json!({"object": good_snapshot("team-a")})).unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&again).unwrap(),
            json!({"created": false})
        );
        // Created once; reused a moment later, with no sweep near, it needs
        // no mark (see the next test).
        let writes = backend.writes.lock().unwrap().clone();
        assert_eq!(writes.len(), 1, "{writes:?}");
        assert!(writes[0].starts_with("create"), "{writes:?}");
    }

    /// docs/design.md, "Garbage collection", Reuse: the write that marks a
    /// reused snapshot is skipped only when a read as fresh as the request
    /// leaves the sweep more than the margin away.
    #[test]
    fn a_reuse_is_marked_unless_a_fresh_read_shows_the_sweep_a_margin_away() {
        const T0: i64 = 1_800_000_000;
        let reuse = |cap: &Capability| {
            let answer = write(cap, "create_snapshot", json!({"object": good_snapshot("team-a")})).unwrap();
            assert_eq!(
                serde_json::from_slice::<Value>(&answer).unwrap(),
                json!({"created": false})
            );
        };
        let written = |backend: &Recorder| backend.writes.lock().unwrap().clone();

        let fresh = Arc::new(Recorder::default());
        fresh.cluster.store().now = T0;
        let cap = capability_on(fresh.clone(), false);
        write(&cap, "create_snapshot", json!({"object": good_snapshot("team-a")})).unwrap();
        fresh.cluster.store().now = T0 + 60;
        reuse(&cap);
        assert_eq!(
            written(&fresh).len(),
            1,
            "made a minute ago: nothing to write {:?}",
            written(&fresh)
        );
        let margin = config_snapshot_policy::sweep::REUSE_MARGIN_SECS as i64;
        fresh.cluster.store().now = T0 + 600 - margin;
        reuse(&cap);
        assert_eq!(written(&fresh).len(), 2, "a sweep is within the margin: marked");
        assert!(written(&fresh)[1].starts_with("annotate"));
        let marked = fresh
            .cluster
            .get("ConfigMap", "team-a", &name_of(&good_snapshot("team-a")))
            .unwrap()
            .unwrap();
        assert_eq!(
            marked["metadata"]["annotations"][keys::LAST_USED_AT],
            format_rfc3339(T0 + 600 - margin)
        );
        fresh.cluster.store().now += 1;
        reuse(&cap);
        assert_eq!(written(&fresh).len(), 2, "the mark counts as a use");

        // On a cached read the decision waits for a fresh one: a snapshot
        // the cache still shows after its deletion is made again, not named
        // dangling.
        let cached = Arc::new(Recorder::default());
        cached.cluster.store().now = T0;
        let cap = capability_on(cached.clone(), false);
        write(&cap, "create_snapshot", json!({"object": good_snapshot("team-a")})).unwrap();
        cached.cluster.store().now = T0 + 60;
        reuse(&cap);
        assert_eq!(written(&cached).len(), 1, "{:?}", written(&cached));
        let gone = good_snapshot("team-a");
        let stale = cached
            .cluster
            .get("ConfigMap", "team-a", &name_of(&gone))
            .unwrap()
            .unwrap();
        let uid = stale["metadata"]["uid"].as_str().unwrap().to_string();
        cached
            .cluster
            .delete("ConfigMap", "team-a", &name_of(&gone), &uid, None)
            .unwrap();
        *cached.pinned.lock().unwrap() = Some(stale);
        let answer = write(&cap, "create_snapshot", json!({"object": gone.clone()})).unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&answer).unwrap(),
            json!({"created": true})
        );
        assert!(cached
            .cluster
            .get("ConfigMap", "team-a", &name_of(&gone))
            .unwrap()
            .is_some());
    }

    fn name_of(object: &Value) -> String {
        object["metadata"]["name"].as_str().unwrap().to_string()
    }

    #[test]
    fn losing_a_create_race_to_the_same_snapshot_is_not_an_error() {
        let backend = Arc::new(Recorder {
            stale_cache: true,
            ..Recorder::default()
        });
        backend.put(good_snapshot("team-a"));
        let cap = capability_on(backend.clone(), false);
        let answer = write(&cap, "create_snapshot", json!({"object": good_snapshot("team-a")})).unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&answer).unwrap(),
            json!({"created": false})
        );

        // Another object under the snapshot's name is not ours to reuse.
        let mut other = good_snapshot("team-a");
        other["data"]["k"] = json!("different");
        backend.put(other);
        let err = write(&cap, "create_snapshot", json!({"object": good_snapshot("team-a")})).unwrap_err();
        assert!(err.contains("a different ConfigMap"), "{err}");
    }

    #[test]
    fn refuses_another_namespace() {
        let (backend, cap) = capability(false);
        assert_refused(
            write(&cap, "create_snapshot", json!({"object": good_snapshot("kube-system")})),
            &backend,
            "other namespace",
        );
    }

    #[test]
    fn refuses_a_snapshot_without_the_managed_by_label() {
        let (backend, cap) = capability(false);
        let mut obj = good_snapshot("team-a");
        obj["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove(keys::MANAGED_BY);
        assert_refused(
            write(&cap, "create_snapshot", json!({"object": obj})),
            &backend,
            "unlabelled",
        );
    }

    #[test]
    fn refuses_a_name_that_does_not_match_the_content() {
        let (backend, cap) = capability(false);
        let mut obj = good_snapshot("team-a");
        obj["data"]["k"] = json!("tampered");
        assert_refused(
            write(&cap, "create_snapshot", json!({"object": obj})),
            &backend,
            "hash mismatch",
        );
        let mut mutable = good_snapshot("team-a");
        mutable["immutable"] = json!(false);
        assert_refused(
            write(&cap, "create_snapshot", json!({"object": mutable})),
            &backend,
            "mutable",
        );
    }

    #[test]
    fn refuses_to_overwrite_a_different_object() {
        let (backend, cap) = capability(false);
        let obj = good_snapshot("team-a");
        let mut squatter = obj.clone();
        squatter["metadata"]["labels"] = json!({});
        backend.put(squatter);
        assert_refused(
            write(&cap, "create_snapshot", json!({"object": obj})),
            &backend,
            "squatter",
        );
    }

    #[test]
    fn refuses_to_delete_an_unlabelled_object() {
        let (backend, cap) = capability(false);
        assert_refused(
            write(
                &cap,
                "delete_snapshot",
                json!({"kind": "ConfigMap", "name": "plain", "uid": "u1"}),
            ),
            &backend,
            "unlabelled delete",
        );
    }

    #[test]
    fn refuses_a_patch_outside_the_pod_template() {
        let (backend, cap) = capability(false);
        for path in ["/spec/replicas", "/metadata/labels/x", "/spec/template"] {
            let body = json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "resourceVersion": "1",
                              "patch": [{"op": "replace", "path": path, "value": 0}]});
            assert_refused(write(&cap, "patch_workload", body), &backend, path);
        }
        let moved = json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "resourceVersion": "1",
                           "patch": [{"op": "move", "from": "/spec/selector", "path": "/spec/template/x"}]});
        assert_refused(write(&cap, "patch_workload", moved), &backend, "move from outside");
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "name": "p", "patch": []});
        assert_refused(write(&cap, "patch_workload", pod), &backend, "not a workload");
    }

    #[test]
    fn refuses_every_write_during_a_dry_run() {
        let (backend, cap) = capability(true);
        assert_refused(
            write(&cap, "create_snapshot", json!({"object": good_snapshot("team-a")})),
            &backend,
            "dry create",
        );
        assert_refused(
            write(
                &cap,
                "adopt",
                json!({"owner": {"kind": "ReplicaSet", "name": "x"}, "snapshots": []}),
            ),
            &backend,
            "dry adopt",
        );
        let patch = json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "patch": []});
        assert_refused(write(&cap, "patch_workload", patch), &backend, "dry patch");
    }

    #[test]
    fn missing_objects_read_as_not_found_errors() {
        let (_, cap) = capability(false);
        let req = json!({"api_version": "v1", "kind": "ConfigMap", "name": "nope", "namespace": "team-a", "disable_cache": true});
        let err = cap
            .call(
                "kubewarden",
                "kubernetes",
                "get_resource",
                &serde_json::to_vec(&req).unwrap(),
            )
            .unwrap_err();
        assert!(err.contains("not found"), "{err}");
        let err = cap.call("nope", "v1", "x", b"{}").unwrap_err();
        assert!(err.contains("unknown binding"), "{err}");
    }
}
