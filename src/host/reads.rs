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

use crate::host::{CallError, HostApi, Names};
use crate::model::content::Content;
use crate::model::kinds::Kind;
use crate::model::revocation::{RecordError, Revocations, RECORD};
use crate::model::source::{SourceId, SourceKind};

/// A read's outcome: the object, `None` if it does not exist, or the error.
pub(crate) type Read = Result<Option<Rc<Value>>, CallError>;

/// Why the namespace's revocation record could not be read: no answer
/// is taken as no revocation (docs/design.md, "Revocation").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RecordUnread {
    #[error("could not read configmap/{RECORD}: {0}")]
    Read(CallError),
    #[error(transparent)]
    Broken(#[from] RecordError),
}

/// What planning reads, asked for only when a decision needs it: an
/// admission's host reads, or plain data in a test.
pub(crate) trait Lookup {
    /// The ConfigMap or Secret `name` of the request's namespace, as fresh
    /// as the request.
    fn source(&self, kind: SourceKind, name: &str) -> Read;
    /// The objects of the revision kind `kind` in the request's namespace
    /// that match `selector`, pruned to `masks`.
    fn revisions(&self, kind: &Kind, selector: Option<String>, masks: &[&str]) -> Result<Vec<Value>, CallError>;
    /// The name the snapshot of `content` from `id` gets (keyed by the
    /// host), and whether that content was revoked.
    fn snapshot_name(&self, id: &SourceId, content: &Content) -> Result<Names, CallError>;
    /// The revocations recorded in the request's namespace (none without
    /// a record).
    fn revocations(&self) -> Result<Rc<Revocations>, RecordUnread>;
}

/// The host's answers, each read at most once per admission.
pub(crate) struct Reads<'a> {
    host: &'a HostApi<'a>,
    namespace: &'a str,
    seen: RefCell<BTreeMap<(SourceKind, String), Read>>,
    record: RefCell<Option<Result<Rc<Revocations>, RecordUnread>>>,
}

impl<'a> Reads<'a> {
    pub(crate) fn new(host: &'a HostApi<'a>, namespace: &'a str) -> Self {
        Reads {
            host,
            namespace,
            seen: RefCell::default(),
            record: RefCell::default(),
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

    fn snapshot_name(&self, id: &SourceId, content: &Content) -> Result<Names, CallError> {
        self.host.snapshot_names(id, content, &[])
    }

    /// From the host's cache (`get_cached`), once per admission.
    fn revocations(&self) -> Result<Rc<Revocations>, RecordUnread> {
        if let Some(read) = self.record.borrow().as_ref() {
            return read.clone();
        }
        let read = match self
            .host
            .get_cached("v1", SourceKind::ConfigMap.kind(), self.namespace, RECORD)
        {
            Ok(Some(record)) => Revocations::of(&record).map(Rc::new).map_err(RecordUnread::from),
            Ok(None) => Ok(Rc::default()),
            Err(e) => Err(RecordUnread::Read(e)),
        };
        *self.record.borrow_mut() = Some(read.clone());
        read
    }
}
