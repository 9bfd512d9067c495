//! The simulator as the lifecycle's [`Cluster`]: reads from the store, and
//! writes the way the API server takes them. A snapshot's write persists
//! as it is (the webhook's objectSelector skips snapshots); any other goes
//! through the write path: admission by the policy, persistence, the
//! controllers. A watch rollout or a renewal is then admitted twice, once
//! by the host that decides it and once by the API server's webhook call,
//! exactly as it is on a real cluster.

use config_snapshot_policy::model::keys;
use config_snapshot_policy::model::object::ObjectExt;
use config_snapshot_policy::model::source::SourceId;
use serde_json::Value;

use super::shared::patched;
use super::{Simulator, HOST_USER};
use crate::cluster::{self, ApiError, Cluster, Preconditions, Selector};

/// An admission's refusal, as the API server answers the client.
fn refused(admission: super::Admission) -> ApiError {
    ApiError::Invalid(format!(
        "admission webhook denied the request: {}",
        admission.message.unwrap_or_default()
    ))
}

fn internal(e: anyhow::Error) -> ApiError {
    ApiError::Unavailable(format!("{e:#}"))
}

impl Cluster for Simulator {
    /// The simulator is read as it is: it has no cache to lag.
    fn following(&self, _kind: &str, _namespace: &str) -> bool {
        true
    }

    fn get(&self, kind: &str, namespace: &str, name: &str) -> cluster::Result<Option<Value>> {
        self.shared.get(kind, namespace, name)
    }

    fn list(
        &self,
        kind: &str,
        namespace: Option<&str>,
        selector: &Selector,
        visit: &mut dyn FnMut(&Value),
    ) -> cluster::Result<()> {
        self.shared.list(kind, namespace, selector, visit)
    }

    fn list_referencing(
        &self,
        kind: &str,
        namespace: &str,
        source: &SourceId,
        visit: &mut dyn FnMut(&Value),
    ) -> cluster::Result<()> {
        self.shared.list_referencing(kind, namespace, source, visit)
    }

    fn create(&self, object: Value) -> cluster::Result<()> {
        if keys::is_snapshot(&object) {
            return self.shared.create(object);
        }
        let (kind, ns, name) = super::store::key_of(&object);
        if self.shared.get(&kind, &ns, &name)?.is_some() {
            return Err(ApiError::AlreadyExists(format!("{kind} {name:?} already exists")));
        }
        let admission = self.write(object, None, false, HOST_USER).map_err(internal)?;
        if admission.allowed {
            Ok(())
        } else {
            Err(refused(admission))
        }
    }

    fn patch(&self, kind: &str, namespace: &str, name: &str, rv: &str, ops: Vec<Value>) -> cluster::Result<()> {
        let current = self
            .shared
            .get(kind, namespace, name)?
            .ok_or_else(|| ApiError::NotFound(format!("{kind} {name:?} not found")))?;
        if keys::is_snapshot(&current) {
            return self.shared.patch(kind, namespace, name, rv, ops);
        }
        let object = patched(&current, rv, &ops)?;
        let admission = self.write(object, Some(current), false, HOST_USER).map_err(internal)?;
        if admission.allowed {
            Ok(())
        } else {
            Err(refused(admission))
        }
    }

    fn delete(&self, kind: &str, namespace: &str, name: &str, pre: &Preconditions) -> cluster::Result<()> {
        let current = self
            .shared
            .get(kind, namespace, name)?
            .ok_or_else(|| ApiError::NotFound(format!("{kind} {name:?} not found")))?;
        if keys::is_snapshot(&current) {
            return self.shared.delete(kind, namespace, name, pre);
        }
        if current.uid() != Some(pre.uid.as_str()) {
            return Err(ApiError::Conflict(format!(
                "Precondition failed: {kind} {name} has another uid"
            )));
        }
        Simulator::delete(self, kind, namespace, name).map_err(internal)
    }

    fn now(&self) -> i64 {
        Simulator::now(self)
    }

    fn namespace_uid(&self, namespace: &str) -> cluster::Result<Option<String>> {
        self.shared.namespace_uid(namespace)
    }
}
