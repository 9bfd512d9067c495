//! The cluster against a real API server: reads from the watch caches (or
//! straight from the API server when a read must be fresh), writes through
//! kube-rs. The invariants of docs/design.md ("Host capability contract")
//! are enforced above this, in [`crate::capability::Capability`], and the
//! orchestration in [`crate::lifecycle`], the same as replay's.
//!
//! Host calls arrive synchronously from the wasm instance, and the
//! lifecycle's driver runs synchronously too, both on blocking threads;
//! each API call is driven to completion on the runtime from there, with a
//! deadline well inside the webhook timeout.

use config_snapshot_policy::model::object::ObjectExt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use config_snapshot_policy::model::selection::{is_dns_label, is_dns_subdomain};
use config_snapshot_policy::model::source::{SourceId, SourceKind};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::Value;
use tokio::runtime::Handle;

use super::cache::{api_resource, trim, Cache};
use super::source_reads::{self, SourceReads};
use crate::cluster::{self, pin, shown, ApiError, Cluster, Preconditions, Selector};
use crate::serve::tell::metrics::Metrics;

/// One API call's deadline. The webhook answers within `timeoutSeconds`
/// (10 s in deploy/serve), and an admission makes a few calls at most.
pub(crate) const API_TIMEOUT: Duration = Duration::from_secs(3);

/// A fresh listing of one kind in one namespace.
pub(crate) struct Listed {
    pub objects: Vec<Value>,
    /// Whether it holds every object (not cut at its limit).
    pub complete: bool,
}

pub struct KubeCluster {
    client: Client,
    pub cache: Arc<Cache>,
    pub(super) runtime: Handle,
    pub metrics: Arc<Metrics>,
    /// The reads ahead of every admission together
    /// ([`source_reads::IN_FLIGHT`]).
    pub reads_ahead: tokio::sync::Semaphore,
    /// Unix seconds to answer `now` with instead of the system clock (0:
    /// the system clock). Replaying a recorded admission needs the clock
    /// it was recorded at.
    fixed_now: AtomicI64,
    /// How an admission's fresh source reads are made ahead of the policy.
    pub(crate) source_reads: SourceReads,
    /// Whether the API server's last answer refused serve's own
    /// credentials (401). A pod left over from an uninstalled release holds
    /// a token of its deleted ServiceAccount: it can answer no admission,
    /// so it reports itself not ready and its Service stops sending it any.
    credentials_refused: AtomicBool,
    /// When [`KubeCluster::ask_about_credentials`] last asked (ms since
    /// `started`, a monotonic clock a wall-clock step cannot move): at most
    /// once a second, however often it is probed.
    credentials_asked_ms: AtomicI64,
    started: std::time::Instant,
}

impl KubeCluster {
    pub fn new(client: Client, cache: Arc<Cache>, runtime: Handle, metrics: Arc<Metrics>) -> KubeCluster {
        KubeCluster {
            client,
            cache,
            runtime,
            metrics,
            reads_ahead: tokio::sync::Semaphore::new(source_reads::IN_FLIGHT),
            fixed_now: AtomicI64::new(0),
            source_reads: SourceReads::default(),
            credentials_refused: AtomicBool::new(false),
            credentials_asked_ms: AtomicI64::new(i64::MIN / 2),
            started: std::time::Instant::now(),
        }
    }

    /// Whether the API server refused serve's credentials in its last
    /// answer (see [`KubeCluster::credentials_refused`]'s field).
    pub fn credentials_refused(&self) -> bool {
        self.credentials_refused.load(Ordering::SeqCst)
    }

    /// While the credentials are refused, asks the API server again with
    /// one read that any authenticated caller gets an answer to (a 403 is
    /// one): an unready pod gets no admission that would. At most once a
    /// second, so that probing `/readyz` costs the API server nothing more.
    pub async fn ask_about_credentials(&self) {
        if !self.credentials_refused() {
            return;
        }
        let now = i64::try_from(self.started.elapsed().as_millis()).unwrap_or(i64::MAX);
        let last = self.credentials_asked_ms.load(Ordering::SeqCst);
        if now - last < 1000
            || self
                .credentials_asked_ms
                .compare_exchange(last, now, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
        {
            return;
        }
        let _ = self.fetch("ConfigMap", "kube-system", "kube-root-ca.crt").await;
    }

    /// Counts one request of serve's own to the API server.
    fn counted(&self, verb: &'static str) {
        self.metrics
            .api_requests
            .get_or_create(&crate::serve::tell::metrics::VerbLabels { verb })
            .inc();
    }

    /// Notes what a read's answer says of serve's credentials: a 401
    /// refuses them, any other answer from the server accepted them, and no
    /// answer (a timeout, a transport failure) says nothing.
    fn heard<T>(&self, result: cluster::Result<T>) -> cluster::Result<T> {
        self.noted(result, true)
    }

    /// [`Self::heard`] for a write: its answer accepts the credentials, but
    /// its 401 refuses nothing. A write passes admission, whose webhooks
    /// and policies (the guest's own answer to serve's watch rollout
    /// among them) may deny it with any code, 401 too; the next read
    /// tells.
    fn heard_write<T>(&self, result: cluster::Result<T>) -> cluster::Result<T> {
        self.noted(result, false)
    }

    fn noted<T>(&self, result: cluster::Result<T>, read: bool) -> cluster::Result<T> {
        let refused = match &result {
            Err(ApiError::Unauthorized(_)) if read => Some(true),
            Err(ApiError::Unauthorized(_)) => None,
            Err(ApiError::Timeout(_) | ApiError::Unavailable(_)) => None,
            _ => Some(false),
        };
        if let Some(refused) = refused {
            if refused && !self.credentials_refused.swap(true, Ordering::SeqCst) {
                tracing::error!("the API server refuses serve's credentials: not ready until it accepts them");
            } else if !refused {
                self.credentials_refused.store(false, Ordering::SeqCst);
            }
        }
        result
    }

    /// The same cluster, reading sources ahead as `reads` says.
    pub fn reading(mut self, reads: SourceReads) -> KubeCluster {
        self.source_reads = reads;
        self
    }

    pub fn client(&self) -> &Client {
        &self.client
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
        config_snapshot_policy::model::duration::unix_now()
    }

    /// The API of `kind` in `namespace`, for the object `name`. kube-rs
    /// puts both into the request path as they are, without encoding, so
    /// each is checked to be a name first: a namespace a DNS-1123 label, an
    /// object's name a DNS-1123 subdomain, as the API server itself
    /// validates them. Such names are made of `[a-z0-9.-]` only, which a
    /// path carries unencoded; anything that would need encoding (`/`, `?`,
    /// `%`) is no name, and is refused before a path is built.
    fn api(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> cluster::Result<(Api<DynamicObject>, kube::core::ApiResource)> {
        if !is_dns_subdomain(name) {
            return Err(ApiError::Invalid(format!("{} is not an object's name", shown(name))));
        }
        self.namespaced(kind, namespace)
    }

    /// The API of `kind` in `namespace` (see [`Self::api`]).
    fn namespaced(
        &self,
        kind: &str,
        namespace: &str,
    ) -> cluster::Result<(Api<DynamicObject>, kube::core::ApiResource)> {
        if !is_dns_label(namespace) {
            return Err(ApiError::Invalid(format!(
                "{} is not a namespace's name",
                shown(namespace)
            )));
        }
        let ar = api_resource(kind)
            .ok_or_else(|| ApiError::NotFound(format!("the server could not find the requested resource: {kind}")))?;
        Ok((Api::namespaced_with(self.client.clone(), namespace, &ar), ar))
    }

    /// Reads one object from the API server, not the cache.
    pub async fn fetch(&self, kind: &str, namespace: &str, name: &str) -> cluster::Result<Option<Value>> {
        let (api, ar) = self.api(kind, namespace, name)?;
        self.counted("get");
        self.heard(match tokio::time::timeout(API_TIMEOUT, api.get_opt(name)).await {
            Ok(Ok(object)) => Ok(object.map(|o| trim(o, &ar))),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(ApiError::Timeout(format!("timeout reading {kind} {name}"))),
        })
    }

    /// Lists `kind` in `namespace` from the API server, as fresh as a
    /// read of one object: a list without a resourceVersion is a
    /// consistent read (served from the API server's watch cache once it
    /// has caught up with etcd, Kubernetes 1.31 and later). At most
    /// `limit` objects: `complete` is false when there were more.
    pub(crate) async fn list_fresh(&self, kind: &str, namespace: &str, limit: u32) -> cluster::Result<Listed> {
        let (api, ar) = self.namespaced(kind, namespace)?;
        let params = kube::api::ListParams::default().limit(limit);
        self.counted("list");
        self.heard(match tokio::time::timeout(API_TIMEOUT, api.list(&params)).await {
            Ok(Ok(list)) => Ok(Listed {
                complete: list.metadata.continue_.as_deref().is_none_or(str::is_empty),
                objects: list.items.into_iter().map(|o| trim(o, &ar)).collect(),
            }),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(ApiError::Timeout(format!("timeout listing {kind} in {namespace}"))),
        })
    }

    fn block<T>(&self, what: &str, call: impl Future<Output = cluster::Result<T>>) -> cluster::Result<T> {
        // The timer is made inside the runtime: callers may be plain threads.
        let answer = self
            .runtime
            .block_on(async { tokio::time::timeout(API_TIMEOUT, call).await })
            .map_err(|_| ApiError::Timeout(format!("timeout: {what} took longer than {API_TIMEOUT:?}")))
            .and_then(|answer| answer);
        self.heard_write(answer)
    }
}

/// A failed write of `kind` as serve keeps it, and so as its logs, its
/// Events and the guest read it: the API server's message, but of a
/// Secret's write its status alone ([`ApiError::without_message`]). A write
/// passes admission, and a webhook or a ValidatingAdmissionPolicy that
/// denies it may quote the object in its message; a Secret's object is its
/// data. (Reads pass no admission: their messages are the API server's own,
/// and name only the object.)
fn written(kind: &str, error: kube::Error) -> ApiError {
    let error = ApiError::from(error);
    if kind == SourceKind::Secret.kind() {
        error.without_message()
    } else {
        error
    }
}

impl Cluster for KubeCluster {
    fn get(&self, kind: &str, namespace: &str, name: &str) -> cluster::Result<Option<Value>> {
        self.cache.get(kind, namespace, name)
    }

    fn get_fresh(&self, kind: &str, namespace: &str, name: &str) -> cluster::Result<Option<Value>> {
        self.runtime.block_on(self.fetch(kind, namespace, name))
    }

    fn following(&self, kind: &str, namespace: &str) -> bool {
        self.cache.following(kind, namespace)
    }

    fn list_referencing(
        &self,
        kind: &str,
        namespace: &str,
        source: &SourceId,
        visit: &mut dyn FnMut(&Value),
    ) -> cluster::Result<()> {
        self.cache.list_referencing(kind, namespace, source, visit)
    }

    fn list(
        &self,
        kind: &str,
        namespace: Option<&str>,
        selector: &Selector,
        visit: &mut dyn FnMut(&Value),
    ) -> cluster::Result<()> {
        self.cache.list(kind, namespace, selector, visit)
    }

    fn create(&self, object: Value) -> cluster::Result<()> {
        let kind = object["kind"].as_str().unwrap_or_default().to_string();
        let ns = object.namespace().unwrap_or_default().to_string();
        let name = object.name().to_string();
        let (api, ar) = self.api(&kind, &ns, &name)?;
        let typed: DynamicObject =
            serde_json::from_value(object).map_err(|e| ApiError::Invalid(format!("invalid object: {e}")))?;
        self.counted("create");
        let created = self.block("create", async {
            api.create(&PostParams::default(), &typed)
                .await
                .map_err(|e| written(&kind, e))
        })?;
        self.metrics.snapshots_created.inc();
        self.cache.observe(trim(created, &ar));
        Ok(())
    }

    fn concurrent_writes(&self) -> bool {
        true
    }

    fn delete(&self, kind: &str, namespace: &str, name: &str, pre: &Preconditions) -> cluster::Result<()> {
        let (api, _) = self.api(kind, namespace, name)?;
        let params = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: Some(pre.uid.clone()),
                resource_version: pre.resource_version.clone(),
            }),
            ..DeleteParams::default()
        };
        self.counted("delete");
        self.block("delete", async {
            api.delete(name, &params).await.map_err(|e| written(kind, e))
        })?;
        self.metrics.deletions.inc();
        self.cache.forget(kind, namespace, name);
        Ok(())
    }

    /// A JSON Patch whose first op pins the resourceVersion: the API
    /// server answers 409 if the object moved since it was read. The
    /// result goes in the cache at once.
    fn patch(&self, kind: &str, namespace: &str, name: &str, rv: &str, ops: Vec<Value>) -> cluster::Result<()> {
        let (api, ar) = self.api(kind, namespace, name)?;
        let mut pinned = vec![pin(rv)];
        pinned.extend(ops);
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(pinned))
            .map_err(|e| ApiError::Invalid(format!("invalid JSON Patch: {e}")))?;
        self.counted("patch");
        let patched = self.block("patch", async {
            api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
                .await
                .map_err(|e| written(kind, e))
        })?;
        self.cache.observe(trim(patched, &ar));
        Ok(())
    }

    fn now(&self) -> i64 {
        KubeCluster::now(self)
    }

    /// One GET of the Namespace: anchoring is once in a snapshot's life,
    /// so serve keeps no cache of namespaces (nor the right to list them).
    fn namespace_uid(&self, namespace: &str) -> cluster::Result<Option<String>> {
        if !is_dns_label(namespace) {
            return Err(ApiError::Invalid(format!(
                "{} is not a namespace's name",
                shown(namespace)
            )));
        }
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        self.counted("get");
        let read = self.block("read the namespace", async {
            api.get_opt(namespace).await.map_err(ApiError::from)
        })?;
        Ok(read.and_then(|ns| ns.metadata.uid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A denial as another admission policy may write it, quoting the
    /// object it denied.
    fn denied(message: &str) -> kube::Error {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": 403, "reason": "Forbidden", "message": message
        }))
        .unwrap();
        kube::Error::Api(Box::new(status))
    }

    /// Finding 9 of eff3694's review: a failed write's message went to the
    /// logs, the Events and the guest as the API server gave it, and an
    /// admission denying a Secret's write may quote its data. Of a Secret's
    /// write serve keeps the status alone; of anything else, the message.
    #[test]
    fn a_failed_write_of_a_secret_keeps_its_status_alone() {
        let quoted = r#"ValidatingAdmissionPolicy 'audit' denied request: data {"password":"aHVudGVyMg=="}"#;
        let secret = written("Secret", denied(quoted));
        assert_eq!(secret, ApiError::Forbidden("403 Forbidden".into()));
        assert_eq!(secret.code(), config_snapshot_policy::host::host_error::Code::Forbidden);
        let other = written("ConfigMap", denied(quoted));
        assert_eq!(
            other,
            ApiError::Forbidden(quoted.into()),
            "a ConfigMap holds no Secret data"
        );
    }
}
