//! The host side of the policy's calls: Kubewarden's reads with the SDK's
//! exact payloads, and the `config-snapshot`/`v1` write capability with the
//! invariants of docs/design.md ("Host capability contract") enforced here,
//! whatever the guest asks.
//!
//! It sits on a [`Cluster`] (the simulator for replay, the API server
//! for serve), so every host gets the same checks. A failed call answers a
//! [`HostError`] with a code, which the guest decides by.
//!
//! - [`reads`]: `get_resource`, `list_resources_by_namespace`,
//!   `list_referencing`;
//! - [`snapshot`]: `create_snapshot`, and the reuse of an existing one;
//! - [`writes`]: `adopt`, `patch_workload` (staged, see below) and
//!   `delete_snapshot`.
//!
//! Deferred effects are staged here, per request, and handed to the host
//! only once it knows the request was allowed and persisted
//! ([`Capability::take_staged`]): a refused request leaves none behind.

mod reads;
mod snapshot;
mod writes;

use config_snapshot_policy::model::object::ObjectExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use config_snapshot_policy::host::contract::{Clock, Revoked};
use config_snapshot_policy::host::host_error::{Code, HostError};
use config_snapshot_policy::host::operation::{Operation, CONFIG_SNAPSHOT, KUBEWARDEN};
use config_snapshot_policy::model::revocation::Revocations;
use config_snapshot_policy::model::source::{SourceId, SourceKind};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::cluster::count::Allowance;
use crate::cluster::proof::proven::Proven;
use crate::cluster::proof::Prover;
use crate::cluster::revoked::{self, RecordUnread};
use crate::cluster::Cluster;
use crate::kubewarden::engine::{CallFailure, CallHandler};
use crate::lifecycle::effect::StoredAs;
use crate::lifecycle::{Budget, Effect, InFlight, Observer, Rules};

/// The admission request a set of host calls belongs to: whose namespace
/// they may write in, whether writes are refused (dry run), and what it
/// writes.
#[derive(Debug, Clone)]
pub struct Caller {
    pub uid: String,
    pub namespace: String,
    pub dry_run: bool,
    pub subject: Subject,
}

/// The object an admission request writes, as the review says: what an
/// effect the request asks for may act on once the API server has stored
/// it (docs/design.md, "Deferred effects").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subject {
    pub kind: String,
    pub name: String,
    pub operation: String,
    /// The object's uid: an UPDATE's; a CREATE's has none yet (the API
    /// server assigns it after the mutating webhooks).
    pub uid: Option<String>,
    /// The uid of the object's controller (a revision's workload), which
    /// the API server stores as the request carries it.
    pub controller_uid: Option<String>,
    /// When the request was reviewed (unix seconds): a CREATE's object is
    /// stored after it.
    pub reviewed_at: i64,
}

impl Subject {
    /// What `request` (an AdmissionRequest as JSON) writes, reviewed at
    /// `now`.
    pub fn of(request: &Value, now: i64) -> Subject {
        let object = &request["object"];
        let text = |v: Option<&str>| v.filter(|s| !s.is_empty()).map(str::to_string);
        Subject {
            kind: request["kind"]["kind"].as_str().unwrap_or_default().to_string(),
            name: text(request["name"].as_str())
                .or_else(|| text(object.meta_str("name")))
                .unwrap_or_default(),
            operation: request["operation"].as_str().unwrap_or_default().to_string(),
            uid: text(object.uid()),
            controller_uid: object.controller().and_then(|r| text(r["uid"].as_str())),
            reviewed_at: now,
        }
    }

    /// Whether the request writes a ConfigMap or a Secret: content the API
    /// server has not stored yet, and a forged review's, never.
    pub(crate) fn is_source(&self) -> bool {
        SourceKind::from_kind(&self.kind).is_some()
    }
}

impl Caller {
    /// The caller an AdmissionRequest (as JSON) makes, reviewed at `now`.
    pub fn of(request: &Value, now: i64) -> Caller {
        Caller {
            uid: request["uid"].as_str().unwrap_or_default().to_string(),
            namespace: request["namespace"].as_str().unwrap_or("default").to_string(),
            dry_run: request["dryRun"].as_bool().unwrap_or(false),
            subject: Subject::of(request, now),
        }
    }
}

/// Failures a host injects into its own calls (replay's `fault:` step).
pub(crate) trait Faults: Send + Sync {
    /// The error the next call of `operation` answers, if one is armed.
    fn fault(&self, operation: &str) -> Option<HostError>;
}

/// A host call's answer: a value, or bytes already serialised.
enum Reply {
    Json(Value),
    Raw(Vec<u8>),
}

/// The capability one admission's host calls reach.
pub struct Capability {
    /// The cluster as the host acts on it: objects carrying our label
    /// without proof are seen without it ([`Proven`]).
    pub cluster: Proven<Arc<dyn Cluster>>,
    pub caller: Caller,
    /// The host's rules: the policy's settings (`orphanGracePeriod` decides
    /// when a reuse must mark a snapshot used), its prover and the
    /// namespaces it stays out of.
    pub rules: Arc<Rules>,
    /// The effects on their way: a snapshot one awaits is never deleted.
    pub in_flight: Arc<InFlight>,
    pub observer: Arc<dyn Observer>,
    faults: Option<Arc<dyn Faults>>,
    budget: Option<Arc<Budget>>,
    staged: Mutex<Vec<Effect>>,
    /// The sources this admission read fresh, as the API server stores
    /// them: a snapshot is made of nothing else.
    stored: Mutex<HashMap<(SourceKind, String), Value>>,
    /// The JSON values `stored` may take in all ([`Capability::holding_at_most`]).
    holding: Allowance,
    /// The request's namespace's uid, once read (it anchors shared
    /// snapshots).
    namespace_uid: Mutex<Option<String>>,
    /// The request's namespace's revocation record, once read.
    revocations: std::sync::OnceLock<Result<Revocations, RecordUnread>>,
}

impl Capability {
    pub fn new(
        cluster: Arc<dyn Cluster>,
        caller: Caller,
        rules: Arc<Rules>,
        in_flight: Arc<InFlight>,
        observer: Arc<dyn Observer>,
    ) -> Capability {
        Capability {
            cluster: Proven::new(cluster, rules.prover.clone()),
            caller,
            rules,
            in_flight,
            observer,
            faults: None,
            budget: None,
            staged: Mutex::default(),
            stored: Mutex::default(),
            holding: Allowance::new(usize::MAX),
            namespace_uid: Mutex::default(),
            revocations: std::sync::OnceLock::new(),
        }
    }

    /// Whether the content `content_hash` of `source` was revoked in the
    /// request's namespace (docs/design.md, "Revocation"), the record read
    /// once per request. A record that cannot be read forbids what it
    /// might: it is not taken as none.
    fn revoked(&self, source: &SourceId, content_hash: &str) -> Result<Option<Revoked>, HostError> {
        let ns = &self.caller.namespace;
        match self.revocations.get_or_init(|| revoked::revocations(&self.cluster, ns)) {
            Ok(record) => Ok(revoked::revocation_of(record, self.prover(), ns, source, content_hash)),
            Err(RecordUnread::Read(e)) => Err(failed(e.clone())),
            Err(RecordUnread::Broken(e)) => Err(refused(format!(
                "refused: {e}: no snapshot is made while the record cannot be read"
            ))),
        }
    }

    fn prover(&self) -> &Prover {
        &self.rules.prover
    }

    /// The same capability, its snapshot creations counted against
    /// `budget` (per namespace).
    pub(crate) fn with_budget(self, budget: Arc<Budget>) -> Capability {
        Capability {
            budget: Some(budget),
            ..self
        }
    }

    /// The same capability, the sources it reads fresh holding at most
    /// `values` JSON values in all: one read past them is refused
    /// (`TooLarge`), and the policy refuses the request that needs it.
    pub fn holding_at_most(self, values: usize) -> Capability {
        Capability {
            holding: Allowance::new(values),
            ..self
        }
    }

    /// The same capability, with failures injected into its calls.
    pub(crate) fn with_faults(self, faults: Arc<dyn Faults>) -> Capability {
        Capability {
            faults: Some(faults),
            ..self
        }
    }

    /// The deferred effects this admission asked for, for the host to queue
    /// once the request is allowed and persisted (or drop).
    pub fn take_staged(&self) -> Vec<Effect> {
        std::mem::take(&mut *self.staged.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn stage(&self, effect: Effect) {
        self.staged.lock().unwrap_or_else(|e| e.into_inner()).push(effect);
    }

    /// What identifies the object this admission reviewed once stored.
    fn stored_as(&self) -> StoredAs {
        let subject = &self.caller.subject;
        StoredAs {
            uid: subject.uid.clone(),
            controller_uid: subject.controller_uid.clone(),
            reviewed_at: subject.reviewed_at,
        }
    }

    /// Remembers a source this admission read fresh, unless it does not
    /// fit in what the admission may still hold: then the read is refused,
    /// by the limit and without a word of the content.
    fn remember(&self, kind: SourceKind, object: Value) -> Result<(), HostError> {
        if !self.holding.take(&object) {
            return Err(HostError::new(
                Code::TooLarge,
                format!(
                    "refused: the sources this request reads hold more than the {} JSON values config-snapshot holds of one request's sources: reference fewer or smaller ConfigMaps and Secrets",
                    self.holding.limit()
                ),
            ));
        }
        let name = object.name().to_string();
        self.stored
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((kind, name), object);
        Ok(())
    }

    /// Source `name` of the request's namespace as the API server stores
    /// it: as this admission read it, or read fresh now.
    fn stored_source(&self, kind: SourceKind, name: &str) -> Result<Option<Value>, HostError> {
        let remembered = self
            .stored
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(kind, name.to_string()))
            .cloned();
        match remembered {
            Some(object) => Ok(Some(object)),
            None => self
                .cluster
                .get_fresh(kind.kind(), &self.caller.namespace, name)
                .map_err(failed),
        }
    }

    fn dispatch(&self, op: Operation, payload: &[u8]) -> Result<Reply, HostError> {
        Ok(match op {
            Operation::GetResource => self.get_resource(parse(op, payload)?)?,
            Operation::ListResourcesByNamespace => self.list_resources(parse(op, payload)?)?,
            // The replay and serve hosts act with their own RBAC; the policy
            // never needs to ask, but a call must not fail.
            Operation::CanI => Reply::Json(json!({"allowed": true, "reason": "config-snapshot host"})),
            Operation::Now => answer(Clock {
                unix: self.cluster.now(),
            })?,
            Operation::CreateSnapshot => answer(self.create_snapshot(&parse(op, payload)?)?)?,
            Operation::CreateSnapshots => answer(self.create_snapshots(parse(op, payload)?)?)?,
            Operation::Adopt => answer(self.adopt(parse(op, payload)?)?)?,
            Operation::DeleteSnapshot => answer(self.delete_snapshot(parse(op, payload)?)?)?,
            Operation::PatchWorkload => answer(self.patch_workload(parse(op, payload)?)?)?,
            Operation::ListReferencing => self.list_referencing(parse(op, payload)?)?,
            Operation::SnapshotName => answer(self.snapshot_name(parse(op, payload)?)?)?,
        })
    }
}

impl CallHandler for Capability {
    fn call(&self, binding: &str, namespace: &str, operation: &str, payload: &[u8]) -> Result<Vec<u8>, CallFailure> {
        self.answer(binding, namespace, operation, payload)
            .map_err(CallFailure::Ours)
    }
}

impl Capability {
    /// One host call's answer, or why it failed.
    pub fn answer(
        &self,
        binding: &str,
        namespace: &str,
        operation: &str,
        payload: &[u8],
    ) -> Result<Vec<u8>, HostError> {
        let Some(op) = Operation::parse(binding, namespace, operation) else {
            let message = if [KUBEWARDEN, CONFIG_SNAPSHOT].contains(&(binding, namespace)) {
                format!("unknown operation {binding}/{namespace}/{operation}")
            } else {
                format!("unknown binding {binding}/{namespace}")
            };
            return Err(HostError::new(Code::Unsupported, message));
        };
        // A delete's fault is the cluster's: it fails the host's own
        // deletes (the sweep) too, once per delete.
        if op != Operation::DeleteSnapshot {
            if let Some(error) = self.faults.as_ref().and_then(|f| f.fault(operation)) {
                return Err(error);
            }
        }
        // serve's admission refuses such a review before the policy runs;
        // this is the second check on purpose (defence in depth): replay,
        // the resync and any future caller meet it too.
        if op.writes() && self.rules.excludes(&self.caller.namespace) {
            return Err(refused(format!(
                "refused {operation}: config-snapshot does not act in namespace {}",
                self.caller.namespace
            )));
        }
        if op.writes() && self.caller.dry_run {
            return Err(HostError::new(
                Code::DryRun,
                format!("refused {operation}: no writes during a dry-run request"),
            ));
        }
        match self.dispatch(op, payload)? {
            Reply::Raw(bytes) => Ok(bytes),
            Reply::Json(value) => {
                serde_json::to_vec(&value).map_err(|e| HostError::new(Code::Unavailable, e.to_string()))
            }
        }
    }
}

/// The request of `op`, as the contract types it (`config_snapshot_policy::host::contract`,
/// or Kubewarden's SDK for its reads): a payload that is not one is a
/// `BadRequest`, and nothing else of the call runs.
///
/// serde's error quotes the offending value, which the guest chose and
/// serve logs: it is cut to [`PARSE_ERROR_CHARS`].
fn parse<'a, T: Deserialize<'a>>(op: Operation, payload: &'a [u8]) -> Result<T, HostError> {
    serde_json::from_slice(payload).map_err(|e| {
        let text = e.to_string();
        let cut: String = text.chars().take(PARSE_ERROR_CHARS).collect();
        let more = if cut.len() < text.len() { "…" } else { "" };
        HostError::new(Code::BadRequest, format!("invalid {} request: {cut}{more}", op.name()))
    })
}

/// The most of serde's error a `BadRequest` message carries.
const PARSE_ERROR_CHARS: usize = 120;

/// An operation's typed answer, as JSON.
fn answer(value: impl serde::Serialize) -> Result<Reply, HostError> {
    serde_json::to_value(value)
        .map(Reply::Json)
        .map_err(|e| HostError::new(Code::Unavailable, e.to_string()))
}

/// Refused unless the guest asks about the request's own namespace: it
/// has no business anywhere else.
fn same_namespace(caller: &Caller, namespace: &str) -> Result<(), HostError> {
    if namespace == caller.namespace {
        Ok(())
    } else {
        Err(refused(format!(
            "refused: the request is in namespace {}, not {namespace}",
            caller.namespace
        )))
    }
}

/// A refusal by the host's invariants.
fn refused(message: impl Into<String>) -> HostError {
    HostError::new(Code::Refused, message)
}

/// A cluster's failure, as the guest sees it.
fn failed(e: crate::cluster::ApiError) -> HostError {
    HostError::new(e.code(), e.to_string())
}

#[cfg(test)]
mod tests;
