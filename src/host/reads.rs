//! The sources and snapshots one admission reads, each at most once, and
//! the revisions it looks a rollback up in: what planning may look at
//! besides the request ([`Lookup`]).
//!
//! A snapshot must capture the content being admitted now, so every read
//! bypasses the host's cache (`disable_cache`): on Kubewarden that is an API
//! round trip. Planning, recognising an unmapped snapshot, recording a
//! rollback and checksum mode may all want the same object; they share one
//! answer (and so one view of it).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use serde_json::Value;

use crate::host::{CallError, HostApi};
use crate::model::content::Content;
use crate::model::kinds::Kind;
use crate::model::source::{SourceId, SourceKind};

/// A read's outcome: the object, `None` if it does not exist, or the error.
pub(crate) type Read = Result<Option<Rc<Value>>, CallError>;

/// What planning reads, asked for only when a decision needs it: an
/// admission's host reads, or plain data in a test.
pub(crate) trait Lookup {
    /// The ConfigMap or Secret `name` of the request's namespace, as fresh
    /// as the request.
    fn source(&self, kind: SourceKind, name: &str) -> Read;
    /// The objects of the revision kind `kind` in the request's namespace
    /// that match `selector`, pruned to `masks`.
    fn revisions(&self, kind: &Kind, selector: Option<String>, masks: &[&str]) -> Result<Vec<Value>, CallError>;
    /// The name the snapshot of `content` from `id` gets (a Secret's is
    /// keyed by the host).
    fn snapshot_name(&self, id: &SourceId, content: &Content) -> Result<String, CallError>;
}

/// The host's answers, each read at most once per admission.
pub(crate) struct Reads<'a> {
    host: &'a HostApi<'a>,
    namespace: &'a str,
    seen: RefCell<BTreeMap<(SourceKind, String), Read>>,
}

impl<'a> Reads<'a> {
    pub(crate) fn new(host: &'a HostApi<'a>, namespace: &'a str) -> Self {
        Reads {
            host,
            namespace,
            seen: RefCell::default(),
        }
    }
}

impl Lookup for Reads<'_> {
    /// Fresh from the API server the first time, from this admission's
    /// memory after that.
    fn source(&self, kind: SourceKind, name: &str) -> Read {
        let key = (kind, name.to_string());
        if let Some(read) = self.seen.borrow().get(&key) {
            return read.clone();
        }
        let read = self
            .host
            .get("v1", kind.kind(), self.namespace, name)
            .map(|found| found.map(Rc::new));
        self.seen.borrow_mut().insert(key, read.clone());
        read
    }

    fn revisions(&self, kind: &Kind, selector: Option<String>, masks: &[&str]) -> Result<Vec<Value>, CallError> {
        self.host
            .list(kind.api_version, kind.kind, self.namespace, selector, masks)
    }

    fn snapshot_name(&self, id: &SourceId, content: &Content) -> Result<String, CallError> {
        self.host.snapshot_name(id, content)
    }
}
