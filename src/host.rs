//! Host calls, behind one small trait so the decisions can be unit-tested
//! natively against an in-memory fake.
//!
//! Reads use Kubewarden's own capabilities with the SDK's exact payloads;
//! writes use this project's `config-snapshot`/`v1` capability
//! (docs/design.md, "Host capability contract").

use std::collections::BTreeSet;

use kubewarden_policy_sdk::host_capabilities::kubernetes::{GetResourceRequest, ListResourcesByNamespaceRequest};
use serde_json::{json, Value};

use crate::operation::Operation;

/// One waPC host call. Errors cross waPC as text only, so that is all a
/// host can give us.
pub trait Host {
    fn call(&self, binding: &str, namespace: &str, operation: &str, payload: &[u8]) -> Result<Vec<u8>, String>;
}

/// Why a call of our capability (its writes, and `list_referencing`)
/// failed, as far as the policy must distinguish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteError {
    /// The host does not offer the capability (stock Kubewarden).
    Unsupported(String),
    /// The capability exists but this call failed (forbidden, conflict, …).
    Failed(String),
}

impl WriteError {
    fn classify(text: String) -> WriteError {
        let lower = text.to_ascii_lowercase();
        let unknown = lower.contains("unknown")
            && (lower.contains("binding") || lower.contains("operation") || lower.contains("namespace"));
        if unknown || lower.contains("not implemented") || lower.contains("unsupported") {
            WriteError::Unsupported(text)
        } else {
            WriteError::Failed(text)
        }
    }

    pub fn message(&self) -> &str {
        match self {
            WriteError::Unsupported(m) | WriteError::Failed(m) => m,
        }
    }
}

/// Kubewarden answers a missing object with an error, not null. Its text
/// carries the API server's NotFound; that is how we tell it from an outage.
fn is_not_found(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    lower.contains("notfound") || lower.contains("not found") || lower.contains("404")
}

/// The `items` of a list answer (`what` names the call in the error).
fn items(mut list: Value, what: &str) -> Result<Vec<Value>, String> {
    match list.get_mut("items").map(Value::take) {
        Some(Value::Array(items)) => Ok(items),
        Some(Value::Null) | None => Ok(Vec::new()),
        Some(_) => Err(format!("{what} answered items that are not an array")),
    }
}

/// Typed access to the host, borrowing the trait object.
pub struct Cluster<'h> {
    host: &'h dyn Host,
}

impl<'h> Cluster<'h> {
    pub fn new(host: &'h dyn Host) -> Self {
        Cluster { host }
    }

    fn call(&self, operation: Operation, payload: &[u8]) -> Result<Vec<u8>, String> {
        let (binding, namespace) = operation.binding();
        self.host.call(binding, namespace, operation.name(), payload)
    }

    /// Reads one object fresh from the API server (`disable_cache`): a
    /// snapshot must capture the content being admitted now, not 5 s ago.
    pub fn get(&self, api_version: &str, kind: &str, namespace: &str, name: &str) -> Result<Option<Value>, String> {
        let req = GetResourceRequest {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            name: name.to_string(),
            namespace: Some(namespace.to_string()),
            disable_cache: true,
            field_masks: None,
        };
        let payload = serde_json::to_vec(&req).map_err(|e| e.to_string())?;
        match self.call(Operation::GetResource, &payload) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| format!("get_resource answered invalid JSON: {e}")),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Lists objects of a kind in a namespace, pruned to `masks`.
    pub fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        label_selector: Option<String>,
        masks: &[&str],
    ) -> Result<Vec<Value>, String> {
        let req = ListResourcesByNamespaceRequest {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            namespace: namespace.to_string(),
            label_selector,
            field_selector: None,
            field_masks: (!masks.is_empty()).then(|| masks.iter().map(|m| m.to_string()).collect::<BTreeSet<_>>()),
        };
        let payload = serde_json::to_vec(&req).map_err(|e| e.to_string())?;
        let bytes = self.call(Operation::ListResourcesByNamespace, &payload)?;
        let list: Value = serde_json::from_slice(&bytes).map_err(|e| format!("list answered invalid JSON: {e}"))?;
        items(list, "list")
    }

    /// Lists the workloads of a kind in a namespace whose pod template
    /// references `source`, pruned to `masks`: a superset of its watchers,
    /// from the host's index. `Unsupported` on a host without it (stock
    /// Kubewarden), which then needs [`Cluster::list`].
    pub fn list_referencing(
        &self,
        kind: &str,
        namespace: &str,
        source: &crate::kind::SourceId,
        masks: &[&str],
    ) -> Result<Vec<Value>, WriteError> {
        let request = json!({
            "kind": kind,
            "namespace": namespace,
            "source_kind": source.kind.kind(),
            "source_name": source.name,
            "field_masks": masks,
        });
        let list = self.own(Operation::ListReferencing, &request)?;
        items(list, Operation::ListReferencing.name()).map_err(WriteError::Failed)
    }

    /// A call of this project's capability (`config-snapshot`/`v1`): JSON
    /// both ways, and a failure classified, so that a host without the
    /// capability (`Unsupported`) is told from a call that failed.
    fn own(&self, operation: Operation, payload: &Value) -> Result<Value, WriteError> {
        let bytes = serde_json::to_vec(payload).map_err(|e| WriteError::Failed(e.to_string()))?;
        let answer = self.call(operation, &bytes).map_err(WriteError::classify)?;
        serde_json::from_slice(&answer)
            .map_err(|e| WriteError::Failed(format!("{} answered invalid JSON: {e}", operation.name())))
    }

    /// Creates a snapshot for the workload `owner` will name it in;
    /// `Ok(true)` if new, `Ok(false)` if it already existed (the host then
    /// makes sure it outlives the reference: see docs/design.md, "Garbage
    /// collection").
    pub fn create_snapshot(&self, object: &Value, owner: &Value) -> Result<bool, WriteError> {
        let answer = self.own(Operation::CreateSnapshot, &json!({ "object": object, "owner": owner }))?;
        Ok(answer.get("created").and_then(Value::as_bool).unwrap_or(false))
    }

    pub fn adopt(&self, owner: Value, snapshots: Vec<Value>) -> Result<(), WriteError> {
        self.own(Operation::Adopt, &json!({ "owner": owner, "snapshots": snapshots }))
            .map(drop)
    }

    /// Deletes a snapshot only if it is still the object (`uid`) and the
    /// version (`resource_version`) the caller judged: a reuse in between
    /// changes the version, and the delete then fails instead of taking a
    /// snapshot someone just started to reference.
    pub fn delete_snapshot(
        &self,
        kind: &str,
        name: &str,
        uid: &str,
        resource_version: Option<&str>,
    ) -> Result<(), WriteError> {
        let mut request = json!({ "kind": kind, "name": name, "uid": uid });
        if let Some(rv) = resource_version {
            request["resourceVersion"] = json!(rv);
        }
        self.own(Operation::DeleteSnapshot, &request).map(drop)
    }

    pub fn patch_workload(&self, request: Value) -> Result<(), WriteError> {
        self.own(Operation::PatchWorkload, &request).map(drop)
    }

    /// The current time in unix seconds. Our host answers `now` so replay can
    /// drive the clock; elsewhere the WASI clock is the truth.
    pub fn now(&self) -> i64 {
        if let Ok(bytes) = self.call(Operation::Now, b"{}") {
            if let Some(t) = serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|v| v.get("unix").and_then(Value::as_i64))
            {
                return t;
            }
        }
        crate::duration::unix_now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_missing_capability() {
        for text in [
            "unknown binding: config-snapshot",
            "Unknown operation create_snapshot",
            "not implemented",
        ] {
            assert!(
                matches!(WriteError::classify(text.into()), WriteError::Unsupported(_)),
                "{text}"
            );
        }
        for text in ["forbidden: quota exceeded", "conflict", "timeout"] {
            assert!(
                matches!(WriteError::classify(text.into()), WriteError::Failed(_)),
                "{text}"
            );
        }
    }

    #[test]
    fn not_found_is_recognised() {
        assert!(is_not_found(r#"configmaps "app" not found"#));
        assert!(is_not_found("NotFound (404)"));
        assert!(!is_not_found("connection refused"));
    }
}
