//! The cluster as one admission sees it: serve's cluster, with the fresh
//! reads it started when the request arrived (`prefetch`) answering the
//! policy's fresh reads of the same objects. The scope leads: it starts the
//! reads ahead, and each of the policy's reads takes its own or goes to
//! the cluster.

use std::sync::Arc;

use config_snapshot_policy::model::source::{SourceId, SourceKind};
use serde_json::Value;

use super::apiserver::KubeCluster;
use super::prefetch::{self, Share, Wanted};
use super::source_reads::SourceReads;
use crate::cluster::count::Allowance;
use crate::cluster::{self, Cluster, Preconditions, Selector};

pub(crate) struct RequestScope {
    pub cluster: Arc<KubeCluster>,
    /// The request's namespace, and the sources read ahead in it: each
    /// answers one fresh read.
    namespace: String,
    /// Its reads ahead, its share of the reads at once, and the values
    /// they may hold in all: past it, a source is read when the policy
    /// asks.
    share: Share,
}

impl RequestScope {
    /// The scope of an admission in `namespace`, whose reads ahead hold at
    /// most `values` JSON values in all.
    pub fn new(cluster: Arc<KubeCluster>, namespace: &str, values: usize) -> RequestScope {
        let at_once = cluster.source_reads.at_once();
        RequestScope {
            cluster,
            namespace: namespace.to_string(),
            share: Share {
                pending: Arc::default(),
                permits: Arc::new(tokio::sync::Semaphore::new(at_once)),
                allowance: Arc::new(Allowance::new(values)),
            },
        }
    }

    /// Starts reading `wanted` sources of the request's namespace, and then
    /// their snapshots, all at once and beside the policy: a read the
    /// policy takes waits for its own GET only. `grace` is the settings'
    /// orphan grace period, which says which snapshots the cache answers.
    pub fn prefetch(&self, wanted: Vec<Wanted>, grace: u64) {
        let reads = self.cluster.source_reads;
        if reads == SourceReads::None {
            return;
        }
        let mut slots: Vec<_> = {
            let mut pending = self.share.pending.lock().unwrap_or_else(|e| e.into_inner());
            wanted
                .into_iter()
                .map(|w| {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    pending.insert((w.kind, w.name.clone()), rx);
                    (w, tx)
                })
                .collect()
        };
        // Only the list way sorts the sources by kind: the default path
        // spawns one read per source and nothing else.
        if reads == SourceReads::List {
            for kind in [SourceKind::ConfigMap, SourceKind::Secret] {
                let of_kind = slots.iter().filter(|(w, _)| w.kind == kind).count();
                if !prefetch::worth_listing(&self.cluster, kind, &self.namespace, of_kind) {
                    continue;
                }
                let (listed, rest) = slots.into_iter().partition(|(w, _)| w.kind == kind);
                slots = rest;
                self.cluster.runtime.spawn(prefetch::read_listed(
                    self.cluster.clone(),
                    self.namespace.clone(),
                    kind,
                    listed,
                    self.share.clone(),
                    grace,
                ));
            }
        }
        for (w, tx) in slots {
            self.cluster.runtime.spawn(prefetch::read_ahead(
                self.cluster.clone(),
                self.namespace.clone(),
                w,
                tx,
                self.share.clone(),
                grace,
            ));
        }
    }

    /// A read made ahead for this very object, if one is left: waits for it
    /// to end. One that ended without an answer (past the scope's
    /// allowance, or its task gone) is `None`: the object is read now.
    fn take_prefetched(&self, kind: &str, namespace: &str, name: &str) -> Option<cluster::Result<Option<Value>>> {
        let kind = SourceKind::from_kind(kind).filter(|_| namespace == self.namespace)?;
        let pending = self
            .share
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(kind, name.to_string()))?;
        self.cluster.runtime.block_on(pending).ok()
    }
}

impl Cluster for RequestScope {
    fn get(&self, kind: &str, namespace: &str, name: &str) -> cluster::Result<Option<Value>> {
        self.cluster.get(kind, namespace, name)
    }
    fn get_fresh(&self, kind: &str, namespace: &str, name: &str) -> cluster::Result<Option<Value>> {
        match self.take_prefetched(kind, namespace, name) {
            Some(read) => read,
            None => self.cluster.get_fresh(kind, namespace, name),
        }
    }
    fn following(&self, kind: &str, namespace: &str) -> bool {
        self.cluster.following(kind, namespace)
    }
    fn list(
        &self,
        kind: &str,
        namespace: Option<&str>,
        selector: &Selector,
        visit: &mut dyn FnMut(&Value),
    ) -> cluster::Result<()> {
        self.cluster.list(kind, namespace, selector, visit)
    }
    fn list_referencing(
        &self,
        kind: &str,
        namespace: &str,
        source: &SourceId,
        visit: &mut dyn FnMut(&Value),
    ) -> cluster::Result<()> {
        self.cluster.list_referencing(kind, namespace, source, visit)
    }
    fn create(&self, object: Value) -> cluster::Result<()> {
        self.cluster.create(object)
    }
    fn concurrent_writes(&self) -> bool {
        self.cluster.concurrent_writes()
    }
    fn delete(&self, kind: &str, namespace: &str, name: &str, pre: &Preconditions) -> cluster::Result<()> {
        self.cluster.delete(kind, namespace, name, pre)
    }
    fn patch(&self, kind: &str, namespace: &str, name: &str, rv: &str, ops: Vec<Value>) -> cluster::Result<()> {
        self.cluster.patch(kind, namespace, name, rv, ops)
    }
    fn now(&self) -> i64 {
        self.cluster.now()
    }
    fn namespace_uid(&self, namespace: &str) -> cluster::Result<Option<String>> {
        self.cluster.namespace_uid(namespace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::count;
    use crate::serve::tell::metrics::Metrics;
    use crate::serve::view::cache::Cache;
    use serde_json::json;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// serve's cluster over an API server that holds `objects` (of
    /// namespace `shop`) and answers each GET of one, counted in `gets`,
    /// and 404 to the rest (the snapshots read ahead).
    fn serving(objects: &[Value], gets: Arc<AtomicUsize>, runtime: &tokio::runtime::Runtime) -> Arc<KubeCluster> {
        let by_path: Arc<HashMap<String, Vec<u8>>> = Arc::new(
            objects
                .iter()
                .map(|o| {
                    let name = o["metadata"]["name"].as_str().unwrap_or_default();
                    (
                        format!("/api/v1/namespaces/shop/configmaps/{name}"),
                        serde_json::to_vec(o).unwrap(),
                    )
                })
                .collect(),
        );
        let service = tower::service_fn(move |request: hyper::Request<kube::client::Body>| {
            let (by_path, gets) = (by_path.clone(), gets.clone());
            async move {
                let (status, body) = match by_path.get(request.uri().path()) {
                    Some(body) => {
                        gets.fetch_add(1, Ordering::SeqCst);
                        (200, body.clone())
                    }
                    None => (
                        404,
                        serde_json::to_vec(&json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}))
                        .unwrap(),
                    ),
                };
                hyper::Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(body))
            }
        });
        let _entered = runtime.enter();
        let client = kube::Client::new(service, "default");
        Arc::new(KubeCluster::new(
            client,
            Arc::new(Cache::new()),
            runtime.handle().clone(),
            Arc::new(Metrics::default()),
        ))
    }

    /// Review "Contained", finding 2: a template naming 64 large
    /// ConfigMaps had serve read all of them ahead and hold them, many
    /// times the review's own body. What one admission reads ahead now
    /// holds at most its limit of JSON values; a source past it is read
    /// when the policy asks, from the API server, and answered all the
    /// same.
    #[test]
    fn what_an_admission_reads_ahead_stays_within_its_limit() {
        const LIMIT: usize = 10_000;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let data: serde_json::Map<String, Value> = (0..500).map(|i| (format!("k{i}"), json!("v"))).collect();
        let sources: Vec<Value> = (0..64)
            .map(|i| {
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("big-{i}"), "namespace": "shop"}, "data": data})
            })
            .collect();
        let gets = Arc::new(AtomicUsize::new(0));
        let scope = RequestScope::new(serving(&sources, gets.clone(), &runtime), "shop", LIMIT);
        let names: Vec<String> = (0..64).map(|i| format!("big-{i}")).collect();
        let wanted = names
            .iter()
            .map(|name| Wanted {
                kind: SourceKind::ConfigMap,
                name: name.clone(),
                keys: None,
            })
            .collect();
        scope.prefetch(wanted, 0);
        let mut held = 0;
        let mut not_ahead = Vec::new();
        for name in &names {
            match scope.take_prefetched("ConfigMap", "shop", name) {
                Some(read) => held += count::of(&read.unwrap().expect("it exists")),
                None => not_ahead.push(name),
            }
        }
        assert!(held <= LIMIT, "{held} values read ahead");
        assert!(!not_ahead.is_empty(), "64 sources of 500 values and more do not fit");
        for name in not_ahead {
            let before = gets.load(Ordering::SeqCst);
            let read = scope.get_fresh("ConfigMap", "shop", name).unwrap().expect("it exists");
            assert_eq!(read["metadata"]["name"], json!(name));
            assert_eq!(gets.load(Ordering::SeqCst), before + 1, "read from the API server");
        }
    }
}
