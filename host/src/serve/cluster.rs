//! The policy's host calls answered against a real API server: reads from
//! the watch caches (or straight from the API server when the policy asks
//! for `disable_cache`), writes through kube-rs. The SPEC §6 invariants are
//! enforced above this, in [`crate::capability::Capability`].
//!
//! Host calls arrive synchronously from the wasm instance, which runs on a
//! blocking thread; each API call is driven to completion on the runtime
//! from there, with a deadline well inside the webhook timeout.

use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kube::api::{Api, DeleteParams, DynamicObject, PostParams, Preconditions};
use kube::Client;
use serde_json::Value;
use tokio::runtime::Handle;

use super::cache::{api_resource, trim, Cache};
use super::effects::Queue;
use super::metrics::Metrics;
use crate::capability::{Backend, Effect, Selector};

/// One API call's deadline. The webhook answers within `timeoutSeconds`
/// (10 s in deploy/serve), and an admission makes a few calls at most.
pub const API_TIMEOUT: Duration = Duration::from_secs(3);

pub struct KubeCluster {
    client: Client,
    pub cache: Arc<Cache>,
    runtime: Handle,
    pub metrics: Arc<Metrics>,
    /// Unix seconds to answer `now` with instead of the system clock (0:
    /// the system clock). Replaying a recorded admission needs the clock
    /// it was recorded at.
    fixed_now: AtomicI64,
}

/// An API error as text the policy can classify: the API server's message
/// and its reason (`NotFound`, `AlreadyExists`, `Conflict`, `Forbidden`…).
pub fn describe(error: kube::Error) -> String {
    match error {
        kube::Error::Api(status) => format!("{} ({}, {})", status.message, status.reason, status.code),
        other => other.to_string(),
    }
}

pub fn is_status(error: &kube::Error, code: u16) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == code)
}

impl KubeCluster {
    pub fn new(client: Client, cache: Arc<Cache>, runtime: Handle, metrics: Arc<Metrics>) -> KubeCluster {
        KubeCluster {
            client,
            cache,
            runtime,
            metrics,
            fixed_now: AtomicI64::new(0),
        }
    }

    pub fn fix_clock(&self, unix: i64) {
        self.fixed_now.store(unix, Ordering::SeqCst);
    }

    pub fn api(&self, kind: &str, namespace: &str) -> Result<Api<DynamicObject>, String> {
        let ar =
            api_resource(kind).ok_or_else(|| format!("the server could not find the requested resource: {kind}"))?;
        Ok(Api::namespaced_with(self.client.clone(), namespace, &ar))
    }

    /// Reads one object from the API server, not the cache.
    pub async fn fetch(&self, kind: &str, namespace: &str, name: &str) -> Result<Option<Value>, String> {
        let api = self.api(kind, namespace)?;
        let ar = api_resource(kind).expect("checked by api()");
        match tokio::time::timeout(API_TIMEOUT, api.get_opt(name)).await {
            Ok(Ok(object)) => Ok(object.map(|o| trim(o, &ar))),
            Ok(Err(e)) => Err(describe(e)),
            Err(_) => Err(format!("timeout reading {kind} {name}")),
        }
    }

    fn block<T>(&self, what: &str, call: impl Future<Output = Result<T, kube::Error>>) -> Result<T, String> {
        // The timer is made inside the runtime: callers may be plain threads.
        self.runtime
            .block_on(async { tokio::time::timeout(API_TIMEOUT, call).await })
            .map_err(|_| format!("timeout: {what} took longer than {API_TIMEOUT:?}"))?
            .map_err(describe)
    }
}

impl Backend for KubeCluster {
    fn get(&self, kind: &str, namespace: &str, name: &str) -> Result<Option<Value>, String> {
        self.cache.get(kind, namespace, name)
    }

    fn get_fresh(&self, kind: &str, namespace: &str, name: &str) -> Result<Option<Value>, String> {
        self.runtime.block_on(self.fetch(kind, namespace, name))
    }

    fn list(
        &self,
        kind: &str,
        namespace: &str,
        selector: &Selector,
        visit: &mut dyn FnMut(&Value),
    ) -> Result<(), String> {
        self.cache.list(kind, namespace, selector, visit)
    }

    fn create(&self, object: Value) -> Result<(), String> {
        let kind = object["kind"].as_str().unwrap_or_default().to_string();
        let ns = object["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
        let api = self.api(&kind, &ns)?;
        let typed: DynamicObject = serde_json::from_value(object).map_err(|e| format!("invalid object: {e}"))?;
        let created = self.block("create", api.create(&PostParams::default(), &typed))?;
        self.metrics.snapshots_created.inc();
        if let Some(ar) = api_resource(&kind) {
            self.cache.observe(trim(created, &ar));
        }
        Ok(())
    }

    fn delete(&self, kind: &str, namespace: &str, name: &str, uid: &str) -> Result<(), String> {
        let api = self.api(kind, namespace)?;
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        self.block("delete", api.delete(name, &params))?;
        self.metrics.deletions.inc();
        self.cache.forget(kind, namespace, name);
        Ok(())
    }

    fn defer(&self, _admission_uid: &str, _effect: Effect) {
        // Effects are staged per request by `RequestScope` and queued only
        // once the webhook allows the request.
        tracing::error!("an effect reached the shared backend unstaged; dropped");
    }

    fn now(&self) -> i64 {
        let fixed = self.fixed_now.load(Ordering::SeqCst);
        if fixed != 0 {
            return fixed;
        }
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0)
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
}

impl RequestScope {
    pub fn new(cluster: Arc<KubeCluster>) -> RequestScope {
        RequestScope {
            cluster,
            staged: Mutex::new(Vec::new()),
        }
    }

    /// Hands the staged effects to the queue (the request was allowed).
    pub fn release(&self, queue: &Queue) {
        for effect in self.staged.lock().unwrap().drain(..) {
            queue.submit(effect);
        }
    }

    pub fn staged(&self) -> usize {
        self.staged.lock().unwrap().len()
    }
}

impl Backend for RequestScope {
    fn get(&self, kind: &str, namespace: &str, name: &str) -> Result<Option<Value>, String> {
        self.cluster.get(kind, namespace, name)
    }
    fn get_fresh(&self, kind: &str, namespace: &str, name: &str) -> Result<Option<Value>, String> {
        self.cluster.get_fresh(kind, namespace, name)
    }
    fn list(
        &self,
        kind: &str,
        namespace: &str,
        selector: &Selector,
        visit: &mut dyn FnMut(&Value),
    ) -> Result<(), String> {
        self.cluster.list(kind, namespace, selector, visit)
    }
    fn create(&self, object: Value) -> Result<(), String> {
        self.cluster.create(object)
    }
    fn delete(&self, kind: &str, namespace: &str, name: &str, uid: &str) -> Result<(), String> {
        self.cluster.delete(kind, namespace, name, uid)
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
