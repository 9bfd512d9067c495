//! The in-memory object store: what etcd and the API server's bookkeeping
//! (uids, resourceVersions, generations, timestamps) are to a real cluster.

use config_snapshot_policy::model::object::ObjectExt;
use std::collections::BTreeMap;

use serde_json::{json, Value};

pub(crate) type Key = (String, String, String); // kind, namespace, name

/// One change, as a watch would report it.
#[derive(Debug, Clone)]
pub struct Change {
    pub resource_version: u64,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub kind: &'static str,
    pub object: Value,
}

#[derive(Default)]
pub struct Store {
    objects: BTreeMap<Key, Value>,
    counter: u64,
    pub now: i64,
    /// Every change, when something watches the store (the stand-in API
    /// server's watches, testing/src/standin/http.rs).
    log: Option<Vec<Change>>,
    /// Which workloads reference which source (`list_referencing`).
    referrers: crate::cluster::referrers::Referrers,
}

pub(crate) fn key_of(object: &Value) -> Key {
    (
        object["kind"].as_str().unwrap_or_default().to_string(),
        object.namespace().unwrap_or("default").to_string(),
        object.name().to_string(),
    )
}

impl Store {
    pub fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(&(kind.to_string(), namespace.to_string(), name.to_string()))
    }

    /// The objects of one kind in one namespace: a range of the ordered
    /// keys, so listing costs the size of the answer, not of the store.
    pub fn list<'a>(&'a self, kind: &'a str, namespace: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        let start = (kind.to_string(), namespace.to_string(), String::new());
        self.objects
            .range(start..)
            .take_while(move |((k, ns, _), _)| k == kind && ns == namespace)
            .map(|(_, v)| v)
    }

    /// The `kind` workloads of `namespace` whose template references
    /// `source`, from the reverse index: the size of the answer, not of the
    /// namespace.
    pub fn referencing<'a>(
        &'a self,
        kind: &'a str,
        namespace: &'a str,
        source: &config_snapshot_policy::model::source::SourceId,
    ) -> impl Iterator<Item = &'a Value> + 'a {
        self.referrers
            .names(kind, namespace, source)
            .filter_map(move |name| self.get(kind, namespace, name))
    }

    pub fn all(&self) -> impl Iterator<Item = &Value> {
        self.objects.values()
    }

    /// The uid of the Namespace `namespace`. Every namespace exists in
    /// the simulator, and none is ever deleted, so it is a function of the
    /// name.
    pub fn namespace_uid(namespace: &str) -> String {
        format!("namespace-{namespace}")
    }

    /// Whether the owner an ownerReference names exists: an object of
    /// the store with that uid, or the Namespace of that name and uid.
    pub(crate) fn owner_exists(&self, reference: &Value) -> bool {
        let uid = reference["uid"].as_str().unwrap_or_default();
        if reference["kind"] == "Namespace" && reference["apiVersion"] == "v1" {
            return reference["name"]
                .as_str()
                .is_some_and(|ns| Store::namespace_uid(ns) == uid);
        }
        self.contains_uid(uid)
    }

    pub(crate) fn contains_uid(&self, uid: &str) -> bool {
        self.objects.values().any(|o| o.uid() == Some(uid))
    }

    /// The latest resourceVersion handed out.
    pub fn resource_version(&self) -> u64 {
        self.counter
    }

    /// Starts keeping a log of changes, for watches.
    pub fn keep_log(&mut self) {
        self.log.get_or_insert_with(Vec::new);
    }

    /// The changes after `since`, in order. The log is in version order,
    /// so a watch that has caught up costs a binary search.
    pub fn changes_since(&self, since: u64) -> Vec<Change> {
        let Some(log) = self.log.as_ref() else {
            return Vec::new();
        };
        let from = log.partition_point(|c| c.resource_version <= since);
        log[from..].to_vec()
    }

    /// Replaces every object with `objects`, kept exactly as given (uids,
    /// resourceVersions): the state another cluster was in. Versions
    /// handed out later are above all of theirs.
    pub fn reset(&mut self, objects: &[Value]) {
        self.objects.clear();
        self.referrers = Default::default();
        for object in objects {
            let rv = object
                .meta_str("resourceVersion")
                .and_then(|r| r.parse().ok())
                .unwrap_or(0);
            self.counter = self.counter.max(rv);
            self.referrers.observe(object);
            self.objects.insert(key_of(object), object.clone());
        }
    }

    fn record(&mut self, kind: &'static str, object: &Value) {
        let resource_version = self.counter;
        if let Some(log) = self.log.as_mut() {
            log.push(Change {
                resource_version,
                kind,
                object: object.clone(),
            });
        }
    }

    /// Stores an object, filling in what the API server would: namespace,
    /// uid and creationTimestamp on create, a new resourceVersion always.
    pub fn persist(&mut self, mut object: Value) -> Value {
        self.counter += 1;
        // As the API server drops fields a kind does not have: only serve's
        // cache writes this one (proof::DIGESTED).
        if let Some(fields) = object.as_object_mut() {
            fields.remove(crate::cluster::proof::DIGESTED);
        }
        let key = key_of(&object);
        let meta = object.metadata_mut().expect("a stored object is a JSON object");
        meta.insert("namespace".into(), json!(key.1));
        let existed = self.objects.contains_key(&key);
        match self.objects.get(&key) {
            Some(old) => {
                meta.insert("uid".into(), old.meta("uid").cloned().unwrap_or_default());
                if let Some(created) = old.meta("creationTimestamp") {
                    meta.insert("creationTimestamp".into(), created.clone());
                }
                let generation = old.generation().unwrap_or(1);
                let spec_changed = old.get("spec") != object.get("spec");
                object.set_meta("generation", json!(generation + i64::from(spec_changed)));
                // Status is a subresource: a write of the object without it
                // (an apply, an edit) keeps what the controller wrote.
                if object.get("status").is_none() {
                    if let Some(status) = old.get("status") {
                        object["status"] = status.clone();
                    }
                }
            }
            None => {
                meta.entry("uid")
                    .or_insert_with(|| json!(format!("{:08x}-0000-4000-8000-{:012x}", self.counter, self.counter)));
                meta.insert(
                    "creationTimestamp".into(),
                    json!(config_snapshot_policy::model::duration::format_rfc3339(self.now)),
                );
                meta.insert("generation".into(), json!(1));
            }
        }
        object.set_meta("resourceVersion", json!(self.counter.to_string()));
        self.referrers.observe(&object);
        self.objects.insert(key, object.clone());
        self.record(if existed { "MODIFIED" } else { "ADDED" }, &object);
        object
    }

    pub fn remove(&mut self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let removed = self
            .objects
            .remove(&(kind.to_string(), namespace.to_string(), name.to_string()))?;
        self.referrers.forget(kind, namespace, name);
        self.counter += 1;
        self.record("DELETED", &removed);
        Some(removed)
    }
}
