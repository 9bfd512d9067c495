//! The policy's host calls answered against a real API server: reads from
//! the watch caches (or straight from the API server when the policy asks
//! for `disable_cache`), writes through kube-rs. The invariants of
//! docs/design.md ("Host capability contract") are enforced above this, in
//! [`crate::capability::Capability`].
//!
//! Host calls arrive synchronously from the wasm instance, which runs on a
//! blocking thread; each API call is driven to completion on the runtime
//! from there, with a deadline well inside the webhook timeout.

use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use config_snapshot_policy::kind::{SourceId, SourceKind};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
use kube::Client;
use serde_json::Value;
use tokio::runtime::Handle;

use super::cache::{api_resource, trim, Cache};
use super::effects::Queue;
use super::metrics::Metrics;
use crate::backend::{self, Backend, BackendError, Selector};
use crate::lifecycle::resync::Key;
use crate::lifecycle::Effect;

/// One API call's deadline. The webhook answers within `timeoutSeconds`
/// (10 s in deploy/serve), and an admission makes a few calls at most.
pub const API_TIMEOUT: Duration = Duration::from_secs(3);

pub struct KubeCluster {
    client: Client,
    pub cache: Arc<Cache>,
    runtime: Handle,
    pub metrics: Arc<Metrics>,
    /// Events on the workloads serve changes.
    pub events: super::events::Events,
    /// Unix seconds to answer `now` with instead of the system clock (0:
    /// the system clock). Replaying a recorded admission needs the clock
    /// it was recorded at.
    fixed_now: AtomicI64,
    /// The deferred effects on their way (queued, running, retrying or
    /// held), each piece of work once: the snapshots their watch rollouts
    /// will reference may not be deleted meanwhile.
    pending: Mutex<Vec<Effect>>,
}

impl KubeCluster {
    pub fn new(client: Client, cache: Arc<Cache>, runtime: Handle, metrics: Arc<Metrics>) -> KubeCluster {
        KubeCluster {
            events: super::events::Events::new(client.clone(), runtime.clone()),
            client,
            cache,
            runtime,
            metrics,
            fixed_now: AtomicI64::new(0),
            pending: Mutex::default(),
        }
    }

    pub fn fix_clock(&self, unix: i64) {
        self.fixed_now.store(unix, Ordering::SeqCst);
    }

    /// Unix seconds: the system clock, or the one fixed for a test.
    pub fn now(&self) -> i64 {
        let fixed = self.fixed_now.load(Ordering::SeqCst);
        if fixed != 0 {
            return fixed;
        }
        config_snapshot_policy::duration::unix_now()
    }

    pub fn api(&self, kind: &str, namespace: &str) -> backend::Result<Api<DynamicObject>> {
        let ar = api_resource(kind).ok_or_else(|| {
            BackendError::NotFound(format!("the server could not find the requested resource: {kind}"))
        })?;
        Ok(Api::namespaced_with(self.client.clone(), namespace, &ar))
    }

    /// Reads one object from the API server, not the cache.
    pub async fn fetch(&self, kind: &str, namespace: &str, name: &str) -> backend::Result<Option<Value>> {
        let api = self.api(kind, namespace)?;
        let ar = api_resource(kind).expect("checked by api()");
        match tokio::time::timeout(API_TIMEOUT, api.get_opt(name)).await {
            Ok(Ok(object)) => Ok(object.map(|o| trim(o, &ar))),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(BackendError::Timeout(format!("timeout reading {kind} {name}"))),
        }
    }

    /// Applies a JSON Patch (its first op should pin the resourceVersion:
    /// the API server then answers 409 if the object moved since it was
    /// read) and puts the result in the cache.
    pub async fn patch(&self, kind: &str, namespace: &str, name: &str, ops: Vec<Value>) -> backend::Result<()> {
        let api = self.api(kind, namespace)?;
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops))
            .map_err(|e| BackendError::Refused(format!("invalid JSON Patch: {e}")))?;
        let params = PatchParams::default();
        match tokio::time::timeout(API_TIMEOUT, api.patch(name, &params, &Patch::Json::<()>(patch))).await {
            Ok(Ok(patched)) => {
                if let Some(ar) = api_resource(kind) {
                    self.cache.observe(trim(patched, &ar));
                }
                Ok(())
            }
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(BackendError::Timeout(format!("timeout patching {kind} {name}"))),
        }
    }

    fn block<T>(&self, what: &str, call: impl Future<Output = backend::Result<T>>) -> backend::Result<T> {
        // The timer is made inside the runtime: callers may be plain threads.
        self.runtime
            .block_on(async { tokio::time::timeout(API_TIMEOUT, call).await })
            .map_err(|_| BackendError::Timeout(format!("timeout: {what} took longer than {API_TIMEOUT:?}")))?
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Vec<Effect>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `effect` as on its way; `false` when one doing the same work
    /// ([`Effect::same_work`]) already is, and this one need not run.
    pub fn begin(&self, effect: &Effect) -> bool {
        let mut pending = self.pending();
        if pending.iter().any(|e| e.same_work(effect)) {
            return false;
        }
        pending.push(effect.clone());
        true
    }

    /// `effect` is over, whatever came of it: its target is no longer
    /// awaited by it, and the same work may be queued again.
    pub fn end(&self, effect: &Effect) {
        let mut pending = self.pending();
        if let Some(i) = pending.iter().position(|e| e == effect) {
            pending.swap_remove(i);
        }
    }

    /// How many effects are on their way.
    pub fn pending_count(&self) -> usize {
        self.pending().len()
    }

    /// Every snapshot an effect on its way awaits.
    pub fn awaited_targets(&self) -> std::collections::HashSet<Key> {
        self.pending().iter().filter_map(Effect::target).collect()
    }
}

impl Backend for KubeCluster {
    fn get(&self, kind: &str, namespace: &str, name: &str) -> backend::Result<Option<Value>> {
        self.cache.get(kind, namespace, name).map_err(BackendError::NotFound)
    }

    fn get_fresh(&self, kind: &str, namespace: &str, name: &str) -> backend::Result<Option<Value>> {
        self.runtime.block_on(self.fetch(kind, namespace, name))
    }

    fn list_referencing(
        &self,
        kind: &str,
        namespace: &str,
        source: &SourceId,
        visit: &mut dyn FnMut(&Value),
    ) -> backend::Result<()> {
        self.cache
            .list_referencing(kind, namespace, source, visit)
            .map_err(BackendError::NotFound)
    }

    fn list(
        &self,
        kind: &str,
        namespace: &str,
        selector: &Selector,
        visit: &mut dyn FnMut(&Value),
    ) -> backend::Result<()> {
        self.cache
            .list(kind, namespace, selector, visit)
            .map_err(BackendError::NotFound)
    }

    fn create(&self, object: Value) -> backend::Result<()> {
        let kind = object["kind"].as_str().unwrap_or_default().to_string();
        let ns = object["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
        let api = self.api(&kind, &ns)?;
        let typed: DynamicObject =
            serde_json::from_value(object).map_err(|e| BackendError::Refused(format!("invalid object: {e}")))?;
        let created = self.block("create", async {
            api.create(&PostParams::default(), &typed)
                .await
                .map_err(BackendError::from)
        })?;
        self.metrics.snapshots_created.inc();
        if let Some(ar) = api_resource(&kind) {
            self.cache.observe(trim(created, &ar));
        }
        Ok(())
    }

    fn delete(&self, kind: &str, namespace: &str, name: &str, uid: &str, rv: Option<&str>) -> backend::Result<()> {
        let api = self.api(kind, namespace)?;
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: rv.map(str::to_string),
            }),
            ..DeleteParams::default()
        };
        self.block("delete", async {
            api.delete(name, &params).await.map_err(BackendError::from)
        })?;
        self.metrics.deletions.inc();
        self.cache.forget(kind, namespace, name);
        Ok(())
    }

    fn patch(&self, kind: &str, namespace: &str, name: &str, ops: Vec<Value>) -> backend::Result<()> {
        self.block("patch", KubeCluster::patch(self, kind, namespace, name, ops))
    }

    fn defer(&self, _admission_uid: &str, _effect: Effect) {
        // Effects are staged per request by `RequestScope` and queued only
        // once the webhook allows the request.
        tracing::error!("an effect reached the shared backend unstaged; dropped");
    }

    fn awaited(&self, kind: &str, namespace: &str, name: &str) -> bool {
        self.pending()
            .iter()
            .filter_map(Effect::target)
            .any(|(k, ns, n)| (k.as_str(), ns.as_str(), n.as_str()) == (kind, namespace, name))
    }

    fn now(&self) -> i64 {
        KubeCluster::now(self)
    }

    fn note(&self, event: String) {
        tracing::info!(target: "config_snapshot::host", "{event}");
    }
}

/// The backend as one admission sees it: effects wait here until the
/// webhook's answer is known, so a refused request leaves none behind.
pub struct RequestScope {
    pub cluster: Arc<KubeCluster>,
    staged: Mutex<Vec<Effect>>,
    /// The request's namespace, and the sources read ahead in it
    /// (`prefetch`): each answers one fresh read.
    namespace: String,
    prefetched: Arc<Mutex<super::prefetch::Fetched>>,
}

impl RequestScope {
    pub fn new(cluster: Arc<KubeCluster>, namespace: &str) -> RequestScope {
        RequestScope {
            cluster,
            staged: Mutex::new(Vec::new()),
            namespace: namespace.to_string(),
            prefetched: Arc::default(),
        }
    }

    /// Starts reading `wanted` sources of the request's namespace, and then
    /// their snapshots, all at once and beside the policy: a read the
    /// policy takes waits for its own GET only.
    pub fn prefetch(&self, wanted: Vec<super::prefetch::Wanted>) {
        let mut pending = self.prefetched.lock().unwrap_or_else(|e| e.into_inner());
        for w in wanted {
            let (tx, rx) = tokio::sync::oneshot::channel();
            pending.insert((w.kind, w.name.clone()), rx);
            self.cluster.runtime.spawn(super::prefetch::read_ahead(
                self.cluster.clone(),
                self.namespace.clone(),
                w,
                tx,
                self.prefetched.clone(),
            ));
        }
    }

    /// A read made ahead for this very object, if one is left: waits for it
    /// to end.
    fn take_prefetched(&self, kind: &str, namespace: &str, name: &str) -> Option<backend::Result<Option<Value>>> {
        let kind = SourceKind::from_kind(kind).filter(|_| namespace == self.namespace)?;
        let pending = self
            .prefetched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(kind, name.to_string()))?;
        Some(
            self.cluster
                .runtime
                .block_on(pending)
                .unwrap_or_else(|_| Err(BackendError::Timeout(format!("the read ahead of {name} was lost")))),
        )
    }

    /// Hands the staged effects to the queue (the request was allowed).
    pub fn release(&self, queue: &Queue) {
        for effect in self.staged.lock().unwrap().drain(..) {
            queue.submit(effect);
        }
    }
}

impl Backend for RequestScope {
    fn get(&self, kind: &str, namespace: &str, name: &str) -> backend::Result<Option<Value>> {
        self.cluster.get(kind, namespace, name)
    }
    fn get_fresh(&self, kind: &str, namespace: &str, name: &str) -> backend::Result<Option<Value>> {
        match self.take_prefetched(kind, namespace, name) {
            Some(read) => read,
            None => self.cluster.get_fresh(kind, namespace, name),
        }
    }
    fn list(
        &self,
        kind: &str,
        namespace: &str,
        selector: &Selector,
        visit: &mut dyn FnMut(&Value),
    ) -> backend::Result<()> {
        self.cluster.list(kind, namespace, selector, visit)
    }
    fn list_referencing(
        &self,
        kind: &str,
        namespace: &str,
        source: &SourceId,
        visit: &mut dyn FnMut(&Value),
    ) -> backend::Result<()> {
        self.cluster.list_referencing(kind, namespace, source, visit)
    }
    fn create(&self, object: Value) -> backend::Result<()> {
        self.cluster.create(object)
    }
    fn delete(&self, kind: &str, namespace: &str, name: &str, uid: &str, rv: Option<&str>) -> backend::Result<()> {
        self.cluster.delete(kind, namespace, name, uid, rv)
    }
    fn patch(&self, kind: &str, namespace: &str, name: &str, ops: Vec<Value>) -> backend::Result<()> {
        Backend::patch(self.cluster.as_ref(), kind, namespace, name, ops)
    }
    fn awaited(&self, kind: &str, namespace: &str, name: &str) -> bool {
        self.cluster.awaited(kind, namespace, name)
    }
    fn defer(&self, _admission_uid: &str, effect: Effect) {
        self.staged.lock().unwrap().push(effect);
    }
    fn now(&self) -> i64 {
        self.cluster.now()
    }
    fn note(&self, event: String) {
        self.cluster.note(event)
    }
}
