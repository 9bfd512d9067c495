//! Host calls, behind one small trait so the decisions can be unit-tested
//! natively against an in-memory fake.
//!
//! Reads use Kubewarden's own capabilities with the SDK's exact payloads;
//! writes use this project's `config-snapshot`/`v1` capability
//! (docs/design.md, "Host capability contract"). Failures are decided by
//! structure, never by their text: our hosts answer a [`HostError`] with a
//! code; anything else is a foreign host's text, shown to users as it is.

pub mod contract;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod host_error;
pub mod operation;
pub(crate) mod reads;

use std::collections::BTreeSet;

use serde::de::{DeserializeOwned, IgnoredAny};
use serde::Serialize;
use serde_json::Value;

use crate::host::host_error::{Code, HostError};
use crate::host::operation::{Operation, SNAPSHOTS_PER_CALL};
use crate::model::kinds::WorkloadKind;
use crate::model::source::{SourceId, SourceKind};
pub(crate) use contract::Names;
use contract::{Created, CreatedEach, GetResourceRequest, ListResourcesByNamespaceRequest, Owner, SnapshotRef};

/// One waPC host call.
pub trait Host {
    fn call(&self, binding: &str, namespace: &str, operation: &str, payload: &[u8]) -> Result<Vec<u8>, CallError>;
}

/// Why a host call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// Our host's answer, with its code.
    #[error("{0}")]
    Host(#[from] HostError),
    /// The error text of a host that does not speak our error protocol
    /// (stock Kubewarden's policy-evaluator): shown, never interpreted.
    #[error("{0}")]
    Foreign(String),
    /// The host answered something the operation does not return.
    #[error("{operation} answered {what}")]
    Answer { operation: &'static str, what: String },
}

impl CallError {
    /// The code our host gave, if it is one of ours.
    pub(crate) fn code(&self) -> Option<Code> {
        match self {
            CallError::Host(e) => Some(e.code),
            _ => None,
        }
    }

    /// Whether the host lacks our capability: ours says so with its code,
    /// and a host that answers a call of our binding in a protocol other
    /// than ours cannot know the binding (stock Kubewarden answers
    /// `unknown binding`).
    pub(crate) fn unsupported(&self) -> bool {
        matches!(self, CallError::Foreign(_)) || self.code() == Some(Code::Unsupported)
    }

    /// Reads what a host wrote for a failed call: ours, or foreign text.
    pub fn from_host(bytes: &[u8]) -> CallError {
        match HostError::from_bytes(bytes) {
            Some(e) => CallError::Host(e),
            None => CallError::Foreign(String::from_utf8_lossy(bytes).into_owned()),
        }
    }
}

/// The `items` of a list answer.
fn items(mut list: Value, operation: Operation) -> Result<Vec<Value>, CallError> {
    match list.get_mut("items").map(Value::take) {
        Some(Value::Array(items)) => Ok(items),
        Some(Value::Null) | None => Ok(Vec::new()),
        Some(_) => Err(CallError::Answer {
            operation: operation.name(),
            what: "items that are not an array".into(),
        }),
    }
}

/// An answer, as the operation's type (`Value` for Kubewarden's reads).
fn decode<T: DeserializeOwned>(operation: Operation, bytes: &[u8]) -> Result<T, CallError> {
    serde_json::from_slice(bytes).map_err(|e| CallError::Answer {
        operation: operation.name(),
        what: format!("not its answer: {e}"),
    })
}

/// Typed access to the host, borrowing the trait object: the guest's view
/// of the cluster.
pub(crate) struct HostApi<'h> {
    host: &'h dyn Host,
}

impl<'h> HostApi<'h> {
    pub(crate) fn new(host: &'h dyn Host) -> Self {
        HostApi { host }
    }

    fn call(&self, operation: Operation, payload: &[u8]) -> Result<Vec<u8>, CallError> {
        let (binding, namespace) = operation.binding();
        self.host.call(binding, namespace, operation.name(), payload)
    }

    /// Reads one object fresh from the API server (`disable_cache`): a
    /// snapshot must capture the content being admitted now, not 5 s ago.
    /// [`HostApi::get_cached`] for the one object that may come from a cache.
    ///
    /// A missing object is an error on Kubewarden, not null. Our hosts say
    /// `NotFound` with a code. A foreign host's error text is not ours to
    /// read, so the same question is asked in a form whose answer has a
    /// structure: a list of that one name. Empty, the object does not
    /// exist; failing too, the first error stands (an outage).
    pub(crate) fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, CallError> {
        self.get_with(api_version, kind, namespace, name, true)
    }

    /// [`HostApi::get`] from the host's cache, where it keeps one: for the
    /// revocation record, all of which serve's cache keeps (a label and
    /// config-snapshot's annotation, no data), and which is written before
    /// the snapshots it names are deleted, so that a cache's lag lets
    /// through nothing a fresh read of those snapshots does not catch.
    pub(crate) fn get_cached(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, CallError> {
        self.get_with(api_version, kind, namespace, name, false)
    }

    fn get_with(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
        disable_cache: bool,
    ) -> Result<Option<Value>, CallError> {
        let req = GetResourceRequest {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            name: name.to_string(),
            namespace: Some(namespace.to_string()),
            disable_cache,
            field_masks: None,
        };
        let payload = serde_json::to_vec(&req).unwrap_or_default();
        match self.call(Operation::GetResource, &payload) {
            Ok(bytes) => decode(Operation::GetResource, &bytes).map(Some),
            Err(e) if e.code() == Some(Code::NotFound) => Ok(None),
            Err(e @ CallError::Foreign(_)) => {
                let selector = format!("metadata.name={name}");
                match self.list_selected(api_version, kind, namespace, None, Some(selector), &[]) {
                    Ok(mut found) => Ok(found.pop()),
                    Err(_) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Lists objects of a kind in a namespace, pruned to `masks`.
    pub(crate) fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        label_selector: Option<String>,
        masks: &[&str],
    ) -> Result<Vec<Value>, CallError> {
        self.list_selected(api_version, kind, namespace, label_selector, None, masks)
    }

    fn list_selected(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        label_selector: Option<String>,
        field_selector: Option<String>,
        masks: &[&str],
    ) -> Result<Vec<Value>, CallError> {
        let req = ListResourcesByNamespaceRequest {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            namespace: namespace.to_string(),
            label_selector,
            field_selector,
            field_masks: (!masks.is_empty()).then(|| masks.iter().map(|m| m.to_string()).collect::<BTreeSet<_>>()),
        };
        let payload = serde_json::to_vec(&req).unwrap_or_default();
        let bytes = self.call(Operation::ListResourcesByNamespace, &payload)?;
        items(
            decode(Operation::ListResourcesByNamespace, &bytes)?,
            Operation::ListResourcesByNamespace,
        )
    }

    /// Lists the workloads of a kind in a namespace whose pod template
    /// references `source`, pruned to `masks`: a superset of its watchers,
    /// from the host's index. [`CallError::unsupported`] on a host without
    /// it (stock Kubewarden), which then needs [`HostApi::list`].
    pub(crate) fn list_referencing(
        &self,
        kind: WorkloadKind,
        namespace: &str,
        source: &SourceId,
        masks: &[&str],
    ) -> Result<Vec<Value>, CallError> {
        let request = contract::ListReferencing {
            kind,
            namespace: namespace.to_string(),
            source_kind: source.kind,
            source_name: source.name.clone(),
            field_masks: Some(masks.iter().map(|m| m.to_string()).collect()),
        };
        let list = self.own(Operation::ListReferencing, &request)?;
        items(list, Operation::ListReferencing)
    }

    /// The name the snapshot of `content` from `id` gets: keyed by the host,
    /// so that it reveals nothing about the content to whoever can read a
    /// pod template or learned the host's door. A host without our
    /// capability makes no snapshots (checksum mode): it gets the plain
    /// name, never written anywhere.
    ///
    /// With it, the other names of snapshots of this content that exist in
    /// the namespace: a Secret's snapshot made under an earlier naming
    /// scheme or key keeps its name, and holds the same content. `current`:
    /// snapshots a workload runs now, which the host also names if they
    /// hold this content (one made under a key the host no longer has,
    /// after a key was lost, still holds it). And whether the content was
    /// revoked there (docs/design.md, "Revocation").
    pub(crate) fn snapshot_names(
        &self,
        id: &SourceId,
        content: &crate::model::content::Content,
        current: &[&str],
    ) -> Result<Names, CallError> {
        let hash = content.hash();
        let plain = || Names {
            name: crate::model::content::snapshot_name(&id.name, &hash),
            aliases: Vec::new(),
            revoked: None,
        };
        let request = contract::SnapshotName {
            source: contract::NamedSource {
                kind: id.kind,
                name: id.name.clone(),
            },
            content_hash: hash.clone(),
            current: current.iter().map(|c| c.to_string()).collect(),
        };
        match self.own(Operation::SnapshotName, &request) {
            Ok(names) => Ok(names),
            Err(e) if e.unsupported() => Ok(plain()),
            Err(e) => Err(e),
        }
    }

    /// A call of this project's capability (`config-snapshot`/`v1`): the
    /// operation's request type in, its answer type out, JSON between.
    fn own<T: DeserializeOwned>(&self, operation: Operation, request: &impl Serialize) -> Result<T, CallError> {
        let bytes = serde_json::to_vec(request).unwrap_or_default();
        decode(operation, &self.call(operation, &bytes)?)
    }

    /// Creates a snapshot for the workload `owner` will name it in;
    /// `Ok(true)` if new, `Ok(false)` if it already existed (the host then
    /// makes sure it outlives the reference: see docs/design.md, "Garbage
    /// collection").
    /// `Ok(true)`: the snapshot was made, and sweeping its source's older
    /// versions is the policy's ([`crate::admit::sweep::sweep`]). A host that
    /// sweeps after the admission itself, off its latency, says so
    /// (`"sweeps": true`).
    pub(crate) fn create_snapshot(&self, object: &Value, owner: Option<&Owner>) -> Result<bool, CallError> {
        let request = contract::CreateSnapshot {
            object: object.clone(),
            owner: owner.cloned(),
        };
        let answer: Created = self.own(Operation::CreateSnapshot, &request)?;
        Ok(answer.sweep_due())
    }

    /// [`HostApi::create_snapshot`] for each of `objects`, in one call per
    /// [`SNAPSHOTS_PER_CALL`]: one answer per object, in order. `Err` if the
    /// host cannot take the call at all (a host without it answers
    /// `Unsupported`: then call `create_snapshot` for each).
    pub(crate) fn create_snapshots(
        &self,
        objects: &[&Value],
        owner: Option<&Owner>,
    ) -> Result<Vec<Result<bool, CallError>>, CallError> {
        let mut out = Vec::with_capacity(objects.len());
        for chunk in objects.chunks(SNAPSHOTS_PER_CALL) {
            let items = chunk
                .iter()
                .map(|o| contract::CreateSnapshot {
                    object: (*o).clone(),
                    owner: owner.cloned(),
                })
                .collect();
            let answer: CreatedEach = self.own(Operation::CreateSnapshots, &contract::CreateSnapshots { items })?;
            if answer.results.len() != chunk.len() {
                return Err(CallError::Answer {
                    operation: Operation::CreateSnapshots.name(),
                    what: format!("no result for each of {} snapshots", chunk.len()),
                });
            }
            out.extend(
                answer
                    .results
                    .into_iter()
                    .map(|result| result.outcome().map(Created::sweep_due).map_err(CallError::Host)),
            );
        }
        Ok(out)
    }

    pub(crate) fn adopt(&self, owner: Owner, snapshots: Vec<SnapshotRef>) -> Result<(), CallError> {
        let request = contract::Adopt { owner, snapshots };
        self.own::<IgnoredAny>(Operation::Adopt, &request).map(drop)
    }

    /// Deletes a snapshot only if it is still the object (`uid`) and the
    /// version (`resource_version`) the caller judged: a reuse in between
    /// changes the version, and the delete then fails instead of taking a
    /// snapshot someone just started to reference.
    pub(crate) fn delete_snapshot(
        &self,
        kind: SourceKind,
        name: &str,
        uid: &str,
        resource_version: Option<&str>,
    ) -> Result<(), CallError> {
        let request = contract::DeleteSnapshot {
            kind,
            name: name.to_string(),
            uid: uid.to_string(),
            resource_version: resource_version.map(str::to_string),
        };
        // The answer is not read: the delete happened or the call failed.
        self.own::<IgnoredAny>(Operation::DeleteSnapshot, &request).map(drop)
    }

    pub(crate) fn patch_workload(&self, request: &contract::PatchWorkload) -> Result<(), CallError> {
        self.own::<IgnoredAny>(Operation::PatchWorkload, request).map(drop)
    }

    /// The current time in unix seconds. Our host answers `now` so replay can
    /// drive the clock; elsewhere the WASI clock is the truth.
    pub(crate) fn now(&self) -> i64 {
        self.call(Operation::Now, b"{}")
            .ok()
            .and_then(|bytes| serde_json::from_slice::<contract::Clock>(&bytes).ok())
            .map_or_else(crate::model::duration::unix_now, |clock| clock.unix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host that answers every call with one error, and counts calls.
    struct Failing {
        error: Vec<u8>,
        lists: std::cell::RefCell<Vec<Value>>,
        list_answer: Option<Vec<u8>>,
    }

    impl Host for Failing {
        fn call(&self, _: &str, _: &str, operation: &str, payload: &[u8]) -> Result<Vec<u8>, CallError> {
            if operation == Operation::ListResourcesByNamespace.name() {
                self.lists.borrow_mut().push(serde_json::from_slice(payload).unwrap());
                if let Some(answer) = &self.list_answer {
                    return Ok(answer.clone());
                }
            }
            Err(CallError::from_host(&self.error))
        }
    }

    fn failing(error: &[u8], list_answer: Option<&[u8]>) -> Failing {
        Failing {
            error: error.to_vec(),
            lists: Default::default(),
            list_answer: list_answer.map(<[u8]>::to_vec),
        }
    }

    #[test]
    fn our_host_is_read_by_its_code() {
        let host = failing(&HostError::new(Code::NotFound, "gone").to_bytes(), None);
        assert_eq!(HostApi::new(&host).get("v1", "ConfigMap", "ns", "app"), Ok(None));
        assert!(host.lists.borrow().is_empty(), "a coded NotFound needs no second look");
        let host = failing(&HostError::new(Code::Unavailable, "NotFound").to_bytes(), None);
        let err = HostApi::new(&host).get("v1", "ConfigMap", "ns", "app").unwrap_err();
        assert_eq!(
            err.code(),
            Some(Code::Unavailable),
            "the text says NotFound; the code decides"
        );
        assert!(!err.unsupported());
    }

    /// A foreign host's text is never read: a list of the one name decides.
    #[test]
    fn a_foreign_missing_object_is_told_by_a_list_of_its_name() {
        let host = failing(b"configmaps \"app\" not found", Some(br#"{"items":[]}"#));
        assert_eq!(HostApi::new(&host).get("v1", "ConfigMap", "ns", "app"), Ok(None));
        assert_eq!(host.lists.borrow()[0]["field_selector"], "metadata.name=app");
        // The list failing too is an outage: the first error stands.
        let host = failing(b"connection refused", None);
        let err = HostApi::new(&host).get("v1", "ConfigMap", "ns", "app").unwrap_err();
        assert_eq!(err, CallError::Foreign("connection refused".into()));
    }

    fn sample_patch() -> contract::PatchWorkload {
        serde_json::from_value(
            serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
            "patch": [], "source": {"kind": "ConfigMap", "name": "app", "contentHash": "ab"}, "snapshot": "app-1"}),
        )
        .unwrap()
    }

    #[test]
    fn any_foreign_answer_to_our_binding_means_no_capability() {
        let host = failing(b"unknown binding: config-snapshot", None);
        let err = HostApi::new(&host).patch_workload(&sample_patch()).unwrap_err();
        assert!(err.unsupported());
        let host = failing(&HostError::new(Code::Forbidden, "unknown binding").to_bytes(), None);
        assert!(!HostApi::new(&host)
            .patch_workload(&sample_patch())
            .unwrap_err()
            .unsupported());
    }
}
