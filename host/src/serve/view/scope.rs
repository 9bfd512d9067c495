//! The cluster as one admission sees it: serve's cluster, with the fresh
//! reads it started when the request arrived (`prefetch`) answering the
//! policy's fresh reads of the same objects. The scope leads: it starts the
//! reads ahead, and each of the policy's reads takes its own or goes to
//! the cluster.

use std::sync::{Arc, Mutex};

use config_snapshot_policy::model::source::{SourceId, SourceKind};
use serde_json::Value;

use super::apiserver::KubeCluster;
use super::prefetch::{self, Fetched, Wanted};
use super::source_reads::SourceReads;
use crate::cluster::{self, ApiError, Cluster, Preconditions, Selector};

pub(crate) struct RequestScope {
    pub cluster: Arc<KubeCluster>,
    /// The request's namespace, and the sources read ahead in it: each
    /// answers one fresh read.
    namespace: String,
    prefetched: Arc<Mutex<Fetched>>,
    /// This admission's share of the reads ahead.
    permits: Arc<tokio::sync::Semaphore>,
}

impl RequestScope {
    pub fn new(cluster: Arc<KubeCluster>, namespace: &str) -> RequestScope {
        let at_once = cluster.source_reads.at_once();
        RequestScope {
            cluster,
            namespace: namespace.to_string(),
            prefetched: Arc::default(),
            permits: Arc::new(tokio::sync::Semaphore::new(at_once)),
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
            let mut pending = self.prefetched.lock().unwrap_or_else(|e| e.into_inner());
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
                    self.prefetched.clone(),
                    self.permits.clone(),
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
                self.prefetched.clone(),
                self.permits.clone(),
                grace,
            ));
        }
    }

    /// A read made ahead for this very object, if one is left: waits for it
    /// to end.
    fn take_prefetched(&self, kind: &str, namespace: &str, name: &str) -> Option<cluster::Result<Option<Value>>> {
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
                .unwrap_or_else(|_| Err(ApiError::Timeout(format!("the read ahead of {name} was lost")))),
        )
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
