//! The sources and snapshots one admission reads, each at most once.
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

use crate::host::Cluster;
use crate::kind::SourceKind;

/// A read's outcome: the object, `None` if it does not exist, or the error.
pub type Read = Result<Option<Rc<Value>>, String>;

pub struct Reads<'a> {
    cluster: &'a Cluster<'a>,
    namespace: &'a str,
    seen: RefCell<BTreeMap<(SourceKind, String), Read>>,
}

impl<'a> Reads<'a> {
    pub fn new(cluster: &'a Cluster<'a>, namespace: &'a str) -> Self {
        Reads {
            cluster,
            namespace,
            seen: RefCell::default(),
        }
    }

    /// The ConfigMap or Secret `name`, fresh from the API server the first
    /// time, from this admission's memory after that.
    pub fn get(&self, kind: SourceKind, name: &str) -> Read {
        let key = (kind, name.to_string());
        if let Some(read) = self.seen.borrow().get(&key) {
            return read.clone();
        }
        let read = self
            .cluster
            .get("v1", kind.kind(), self.namespace, name)
            .map(|found| found.map(Rc::new));
        self.seen.borrow_mut().insert(key, read.clone());
        read
    }
}
