//! An in-memory host for unit tests: a handful of objects, the write
//! capability, a settable clock, injectable failures, and a log of calls.

use std::cell::RefCell;
use std::collections::HashMap;

use serde_json::{json, Value};

use crate::host::Host;

#[derive(Default)]
pub struct FakeHost {
    pub objects: RefCell<Vec<Value>>,
    pub calls: RefCell<Vec<(String, Value)>>,
    /// operation → error text returned by the next calls of it.
    pub failures: RefCell<HashMap<String, String>>,
    /// kind → error text returned by lists of that kind.
    pub list_failures: RefCell<HashMap<String, String>>,
    /// No write capability at all, like stock Kubewarden.
    pub stock: bool,
    pub now: i64,
    next_uid: RefCell<u64>,
}

impl FakeHost {
    pub fn with(objects: Vec<Value>) -> Self {
        FakeHost {
            objects: RefCell::new(objects),
            now: 1_800_000_000,
            ..Default::default()
        }
    }

    pub fn fail(&self, operation: &str, error: &str) {
        self.failures.borrow_mut().insert(operation.into(), error.into());
    }

    /// Fails every list of `kind`, and only those.
    pub fn fail_list_of(&self, kind: &str, error: &str) {
        self.list_failures.borrow_mut().insert(kind.into(), error.into());
    }

    pub fn find(&self, kind: &str, name: &str) -> Option<Value> {
        self.objects
            .borrow()
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .cloned()
    }

    pub fn count(&self, kind: &str) -> usize {
        self.objects.borrow().iter().filter(|o| o["kind"] == kind).count()
    }

    pub fn ops(&self, operation: &str) -> Vec<Value> {
        self.calls
            .borrow()
            .iter()
            .filter(|(op, _)| op == operation)
            .map(|(_, p)| p.clone())
            .collect()
    }

    fn matches_selector(object: &Value, selector: Option<&str>) -> bool {
        selector.is_none_or(|s| {
            s.split(',').all(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                object["metadata"]["labels"][k].as_str() == Some(v)
            })
        })
    }
}

impl Host for FakeHost {
    fn call(&self, binding: &str, _ns: &str, operation: &str, payload: &[u8]) -> Result<Vec<u8>, String> {
        let req: Value = serde_json::from_slice(payload).map_err(|e| e.to_string())?;
        self.calls.borrow_mut().push((operation.to_string(), req.clone()));
        if let Some(e) = self.failures.borrow().get(operation) {
            return Err(e.clone());
        }
        if operation == "list_resources_by_namespace" || operation == "list_referencing" {
            if let Some(e) = req["kind"]
                .as_str()
                .and_then(|k| self.list_failures.borrow().get(k).cloned())
            {
                return Err(e);
            }
        }
        if binding == "config-snapshot" && self.stock {
            return Err(format!("unknown binding: {binding}"));
        }
        let answer = match operation {
            "get_resource" => {
                let found = self
                    .objects
                    .borrow()
                    .iter()
                    .find(|o| {
                        o["kind"] == req["kind"]
                            && o["metadata"]["name"] == req["name"]
                            && o["metadata"]["namespace"] == req["namespace"]
                    })
                    .cloned();
                found.ok_or_else(|| format!("{} {:?} not found", req["kind"], req["name"]))?
            }
            "list_resources_by_namespace" => {
                let items: Vec<Value> = self
                    .objects
                    .borrow()
                    .iter()
                    .filter(|o| {
                        o["kind"] == req["kind"]
                            && o["apiVersion"] == req["api_version"]
                            && o["metadata"]["namespace"] == req["namespace"]
                            && Self::matches_selector(o, req["label_selector"].as_str())
                    })
                    .cloned()
                    .collect();
                json!({"apiVersion": "v1", "kind": "List", "items": items})
            }
            "list_referencing" => {
                let source = crate::kind::SourceKind::from_kind(req["source_kind"].as_str().unwrap_or_default())
                    .map(|k| crate::kind::SourceId::new(k, req["source_name"].as_str().unwrap_or_default()));
                let items: Vec<Value> = self
                    .objects
                    .borrow()
                    .iter()
                    .filter(|o| o["kind"] == req["kind"] && o["metadata"]["namespace"] == req["namespace"])
                    .filter(|o| {
                        source
                            .as_ref()
                            .is_some_and(|id| crate::template::own_group(&o["spec"]["template"], id).is_some())
                    })
                    .cloned()
                    .collect();
                json!({"items": items})
            }
            "now" => json!({"unix": self.now}),
            "create_snapshot" => {
                let mut object = req["object"].clone();
                let name = object["metadata"]["name"].clone();
                if let Some(existing) = self.find(object["kind"].as_str().unwrap_or(""), name.as_str().unwrap_or("")) {
                    if existing["data"] != object["data"] {
                        return Err(format!("snapshot {name} exists with different content"));
                    }
                    json!({"created": false})
                } else {
                    *self.next_uid.borrow_mut() += 1;
                    object["metadata"]["uid"] = json!(format!("uid-{}", self.next_uid.borrow()));
                    object["metadata"]["creationTimestamp"] = json!(crate::duration::format_rfc3339(self.now));
                    self.objects.borrow_mut().push(object);
                    json!({"created": true})
                }
            }
            "delete_snapshot" => {
                let rv = &req["resourceVersion"];
                self.objects.borrow_mut().retain(|o| {
                    o["metadata"]["uid"] != req["uid"] || (!rv.is_null() && o["metadata"]["resourceVersion"] != *rv)
                });
                json!({})
            }
            "adopt" => json!({"queued": true}),
            "patch_workload" => json!({"queued": true}),
            other => return Err(format!("unknown operation {other}")),
        };
        Ok(serde_json::to_vec(&answer).unwrap())
    }
}
