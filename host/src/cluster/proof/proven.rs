//! What a host does with what carries our label: a cluster that shows the
//! host's decisions only what is proven (`Proven`). No review of a
//! ConfigMap or Secret is judged any more: the host learns of sources from
//! its watch of what the API server stored (docs/design.md, "Watch"), and
//! sees them through this cluster.

use std::ops::Deref;
use std::sync::Arc;

use config_snapshot_policy::model::keys;
use serde_json::Value;

use super::Prover;
use crate::cluster::{self, Cluster, Preconditions, Selector};

/// A cluster as the host acts on it: objects that carry our label without
/// proof are seen without it, so no decision of the host (sweep, adopt,
/// bridge, reuse, delete, watch) ever takes one for a snapshot. Writes
/// pass through.
pub struct Proven<C> {
    inner: C,
    prover: Arc<Prover>,
}

impl<C> Proven<C> {
    pub fn new(inner: C, prover: Arc<Prover>) -> Proven<C> {
        Proven { inner, prover }
    }

    pub fn prover(&self) -> &Prover {
        &self.prover
    }

    /// The cluster as it is, labels and all: for the one step that looks
    /// at what carries the label (signing legacy snapshots, reporting
    /// forged ones).
    pub fn raw(&self) -> &C {
        &self.inner
    }

    fn seen(&self, object: Value) -> Value {
        self.prover.shown(&object).unwrap_or(object)
    }
}

impl<C, D> Cluster for Proven<C>
where
    C: Deref<Target = D> + Send + Sync,
    D: Cluster + ?Sized,
{
    fn get(&self, kind: &str, namespace: &str, name: &str) -> cluster::Result<Option<Value>> {
        Ok(self.inner.get(kind, namespace, name)?.map(|o| self.seen(o)))
    }

    fn get_fresh(&self, kind: &str, namespace: &str, name: &str) -> cluster::Result<Option<Value>> {
        Ok(self.inner.get_fresh(kind, namespace, name)?.map(|o| self.seen(o)))
    }

    fn following(&self, kind: &str, namespace: &str) -> bool {
        self.inner.following(kind, namespace)
    }

    fn list(
        &self,
        kind: &str,
        namespace: Option<&str>,
        selector: &Selector,
        visit: &mut dyn FnMut(&Value),
    ) -> cluster::Result<()> {
        // Listing is the hot path: only a forgery is copied. A selector on
        // our label is judged on the object as seen, label removed.
        if !selector.mentions(keys::MANAGED_BY) {
            return self
                .inner
                .list(kind, namespace, selector, &mut |o| match self.prover.shown(o) {
                    None => visit(o),
                    Some(shown) => visit(&shown),
                });
        }
        let wider = selector.without(keys::MANAGED_BY);
        self.inner
            .list(kind, namespace, &wider, &mut |o| match self.prover.shown(o) {
                None if selector.matches(o) => visit(o),
                None => {}
                Some(shown) if selector.matches(&shown) => visit(&shown),
                Some(_) => {}
            })
    }

    fn list_referencing(
        &self,
        kind: &str,
        namespace: &str,
        source: &config_snapshot_policy::model::source::SourceId,
        visit: &mut dyn FnMut(&Value),
    ) -> cluster::Result<()> {
        // Workloads: never labelled snapshots.
        self.inner.list_referencing(kind, namespace, source, visit)
    }

    fn create(&self, object: Value) -> cluster::Result<()> {
        self.inner.create(object)
    }

    fn concurrent_writes(&self) -> bool {
        self.inner.concurrent_writes()
    }

    fn patch(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
        resource_version: &str,
        ops: Vec<Value>,
    ) -> cluster::Result<()> {
        self.inner.patch(kind, namespace, name, resource_version, ops)
    }

    fn delete(&self, kind: &str, namespace: &str, name: &str, preconditions: &Preconditions) -> cluster::Result<()> {
        self.inner.delete(kind, namespace, name, preconditions)
    }

    fn now(&self) -> i64 {
        self.inner.now()
    }

    fn namespace_uid(&self, namespace: &str) -> cluster::Result<Option<String>> {
        self.inner.namespace_uid(namespace)
    }
}
