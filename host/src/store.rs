//! The in-memory object store: what etcd and the API server's bookkeeping
//! (uids, resourceVersions, timestamps) are to a real cluster.

use std::collections::BTreeMap;

use serde_json::{json, Value};

pub type Key = (String, String, String); // kind, namespace, name

#[derive(Default)]
pub struct Store {
    objects: BTreeMap<Key, Value>,
    counter: u64,
    pub now: i64,
}

pub fn key_of(object: &Value) -> Key {
    (
        object["kind"].as_str().unwrap_or_default().to_string(),
        object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string(),
        object["metadata"]["name"].as_str().unwrap_or_default().to_string(),
    )
}

impl Store {
    pub fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(&(kind.to_string(), namespace.to_string(), name.to_string()))
    }

    pub fn list<'a>(&'a self, kind: &'a str, namespace: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.objects
            .iter()
            .filter(move |((k, ns, _), _)| k == kind && ns == namespace)
            .map(|(_, v)| v)
    }

    pub fn all(&self) -> impl Iterator<Item = &Value> {
        self.objects.values()
    }

    pub fn contains_uid(&self, uid: &str) -> bool {
        self.objects.values().any(|o| o["metadata"]["uid"] == uid)
    }

    /// Stores an object, filling in what the API server would: namespace,
    /// uid and creationTimestamp on create, a new resourceVersion always.
    pub fn persist(&mut self, mut object: Value) -> Value {
        self.counter += 1;
        let key = key_of(&object);
        let meta = object["metadata"].as_object_mut().expect("objects have metadata");
        meta.insert("namespace".into(), json!(key.1));
        match self.objects.get(&key) {
            Some(old) => {
                meta.insert("uid".into(), old["metadata"]["uid"].clone());
                meta.insert("creationTimestamp".into(), old["metadata"]["creationTimestamp"].clone());
                let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
                let spec_changed = old.get("spec") != object.get("spec");
                object["metadata"]["generation"] = json!(generation + i64::from(spec_changed));
            }
            None => {
                meta.entry("uid")
                    .or_insert_with(|| json!(format!("{:08x}-0000-4000-8000-{:012x}", self.counter, self.counter)));
                meta.insert(
                    "creationTimestamp".into(),
                    json!(config_snapshot_policy::duration::format_rfc3339(self.now)),
                );
                meta.insert("generation".into(), json!(1));
            }
        }
        object["metadata"]["resourceVersion"] = json!(self.counter.to_string());
        self.objects.insert(key, object.clone());
        object
    }

    pub fn remove(&mut self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        self.objects
            .remove(&(kind.to_string(), namespace.to_string(), name.to_string()))
    }
}
