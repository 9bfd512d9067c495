//! What a host does with what carries our label: a write of a ConfigMap
//! or Secret judged by its proof (`Provenance`), and a cluster that shows
//! the host's decisions only what is proven (`Proven`).

use std::ops::Deref;
use std::sync::Arc;

use config_snapshot_policy::model::keys;
use serde_json::Value;

use super::{Prover, DIGESTED};
use crate::cluster::{self, Cluster, Preconditions, Selector};

/// Whose a write of a ConfigMap or Secret is, as its proof says, and so
/// what a host does with it. `T` is the request the policy then reviews:
/// JSON here, raw text in serve (`serve::admission`).
#[derive(Debug, PartialEq)]
pub(crate) enum Provenance<T = Value> {
    /// Not labelled, or not a source: the policy decides as usual.
    Policy,
    /// A write of a proven snapshot (the host's own, or metadata on one):
    /// nothing to decide, allowed untouched.
    Ours,
    /// Labelled but not ours: the policy sees it as the plain ConfigMap or
    /// Secret it is, without the label that would make it skip it.
    Unlabel(T),
}

impl Prover {
    /// Whose write an admission request (JSON) is: the webhook's "skip our
    /// own writes", on proof rather than on the label (an objectSelector
    /// would let anyone's labelled write through unreviewed).
    pub(crate) fn provenance(&self, request: &Value) -> Provenance {
        // A review's objects never speak for the cache.
        if ["object", "oldObject"]
            .iter()
            .any(|f| request[f].get(DIGESTED).is_some())
        {
            let mut cleared = request.clone();
            for field in ["object", "oldObject"] {
                if let Some(object) = cleared.get_mut(field).and_then(Value::as_object_mut) {
                    object.remove(DIGESTED);
                }
            }
            return match self.provenance(&cleared) {
                Provenance::Policy => Provenance::Unlabel(cleared),
                other => other,
            };
        }
        let object = &request["object"];
        if !keys::is_snapshot(object) {
            return Provenance::Policy;
        }
        if self.ours(object) {
            return Provenance::Ours;
        }
        let mut request = request.clone();
        for field in ["object", "oldObject"] {
            if let Some(shown) = self.shown(&request[field]) {
                request[field] = shown;
            }
        }
        Provenance::Unlabel(request)
    }
}

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
