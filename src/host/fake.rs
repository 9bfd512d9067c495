//! An in-memory host for unit tests: a handful of objects, the write
//! capability, a settable clock, injectable failures, and a log of calls.

use crate::model::object::ObjectExt;
use std::cell::RefCell;
use std::collections::HashMap;

use serde_json::{json, Value};

use crate::host::host_error::{Code, HostError};
use crate::host::operation::CONFIG_SNAPSHOT;
use crate::host::{CallError, Host};

#[derive(Default)]
pub struct FakeHost {
    pub objects: RefCell<Vec<Value>>,
    pub calls: RefCell<Vec<(String, Value)>>,
    /// operation → the error the next calls of it answer.
    pub failures: RefCell<HashMap<String, HostError>>,
    /// kind → the error lists of that kind answer.
    pub list_failures: RefCell<HashMap<String, HostError>>,
    /// No write capability at all, like stock Kubewarden: our binding
    /// answers foreign text, and a missing object is foreign text too.
    pub stock: bool,
    /// Answers `create_snapshots` as our hosts do (one `create_snapshot`
    /// per item, each recorded and each open to injected failures);
    /// without it the call is `Unsupported` and the policy creates one by
    /// one.
    pub batches: bool,
    /// Answers a created snapshot as our hosts do: the host sweeps its
    /// source after the admission, so the policy need not.
    pub sweeps: bool,
    pub now: i64,
    next_uid: RefCell<u64>,
}

impl FakeHost {
    /// The name this host gives the snapshot of `source` whose content has
    /// the hash `content_hash`: keyed (by a fixed test key), as our hosts
    /// key every snapshot's name.
    pub fn keyed_name(source: &str, content_hash: &str) -> String {
        use sha2::Digest as _;
        let keyed = sha2::Sha256::digest(format!("fake key:{content_hash}"));
        crate::model::content::snapshot_name(source, &crate::model::content::hex(&keyed))
    }

    pub fn with(objects: Vec<Value>) -> Self {
        FakeHost {
            objects: RefCell::new(objects),
            now: 1_800_000_000,
            ..Default::default()
        }
    }

    /// The next calls of `operation` fail as an API server outage would.
    pub fn fail(&self, operation: &str, message: &str) {
        self.fail_with(operation, HostError::new(Code::Unavailable, message));
    }

    pub fn fail_with(&self, operation: &str, error: HostError) {
        self.failures.borrow_mut().insert(operation.into(), error);
    }

    /// Fails every list of `kind`, and only those.
    pub fn fail_list_of(&self, kind: &str, message: &str) {
        self.fail_list_of_with(kind, HostError::new(Code::Unavailable, message));
    }

    /// Fails every list of `kind`, and only those, with `error`.
    pub fn fail_list_of_with(&self, kind: &str, error: HostError) {
        self.list_failures.borrow_mut().insert(kind.into(), error);
    }

    pub fn find(&self, kind: &str, name: &str) -> Option<Value> {
        self.objects
            .borrow()
            .iter()
            .find(|o| o["kind"] == kind && o.meta_str("name") == Some(name))
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

    /// A list item as a host answers it with `masks` (dotted paths): only
    /// those fields, and, as in the API server's lists, no `kind` or
    /// `apiVersion` of its own unless a mask names them.
    fn masked(object: &Value, masks: &Value) -> Value {
        let Some(masks) = masks.as_array().filter(|m| !m.is_empty()) else {
            let mut item = object.clone();
            if let Some(map) = item.as_object_mut() {
                map.remove("kind");
                map.remove("apiVersion");
            }
            return item;
        };
        let paths: Vec<Vec<&str>> = masks
            .iter()
            .filter_map(Value::as_str)
            .map(|m| m.split('.').collect())
            .collect();
        Self::prune(object, &paths).unwrap_or_else(|| json!({}))
    }

    /// The parts of `value` the `paths` reach, through arrays element by
    /// element, as field masks do.
    fn prune(value: &Value, paths: &[Vec<&str>]) -> Option<Value> {
        if paths.iter().any(Vec::is_empty) {
            return Some(value.clone());
        }
        match value {
            Value::Array(items) => Some(Value::Array(
                items
                    .iter()
                    .map(|i| Self::prune(i, paths).unwrap_or_else(|| json!({})))
                    .collect(),
            )),
            Value::Object(map) => {
                let mut out = serde_json::Map::new();
                for (key, child) in map {
                    let rest: Vec<Vec<&str>> = paths.iter().filter(|p| p[0] == key).map(|p| p[1..].to_vec()).collect();
                    if rest.is_empty() {
                        continue;
                    }
                    if let Some(kept) = Self::prune(child, &rest) {
                        out.insert(key.clone(), kept);
                    }
                }
                (!out.is_empty()).then_some(Value::Object(out))
            }
            _ => None,
        }
    }

    /// The revocation, in the record among its objects, of the content
    /// of `source` that has had `names`: as `snapshot_name` answers it.
    fn revoked<'a>(&self, kind: &str, source: &str, names: impl IntoIterator<Item = &'a str>) -> Value {
        use crate::model::revocation::{Revocations, RECORD};
        let (Some(kind), Some(record)) = (
            crate::model::source::SourceKind::from_kind(kind),
            self.find("ConfigMap", RECORD),
        ) else {
            return Value::Null;
        };
        let id = crate::model::source::SourceId::new(kind, source);
        let record = Revocations::of(&record).expect("the tests write records that read");
        record
            .revoking_any(&id, names)
            .map_or(Value::Null, |(name, revocation)| {
                json!(crate::host::contract::Revoked::of(name, revocation))
            })
    }

    fn matches_selector(object: &Value, selector: Option<&str>) -> bool {
        selector.is_none_or(|s| {
            s.split(',').all(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                object.label(k) == Some(v)
            })
        })
    }
}

impl Host for FakeHost {
    #[expect(clippy::too_many_lines, reason = "a table: the fake host's operations")]
    fn call(&self, binding: &str, _ns: &str, operation: &str, payload: &[u8]) -> Result<Vec<u8>, CallError> {
        let fail = |code: Code, message: String| Err(CallError::Host(HostError::new(code, message)));
        let req: Value = match serde_json::from_slice(payload) {
            Ok(v) => v,
            Err(e) => return fail(Code::BadRequest, e.to_string()),
        };
        self.calls.borrow_mut().push((operation.to_string(), req.clone()));
        if let Some(e) = self.failures.borrow().get(operation) {
            return Err(CallError::Host(e.clone()));
        }
        if operation == "list_resources_by_namespace" || operation == "list_referencing" {
            if let Some(e) = req["kind"]
                .as_str()
                .and_then(|k| self.list_failures.borrow().get(k).cloned())
            {
                return Err(CallError::Host(e));
            }
        }
        if binding == "config-snapshot" && self.stock {
            return Err(CallError::Foreign(format!("unknown binding: {binding}")));
        }
        let answer = match operation {
            "get_resource" => {
                let found = self
                    .objects
                    .borrow()
                    .iter()
                    .find(|o| {
                        o["kind"] == req["kind"]
                            && o.meta_str("name") == req["name"].as_str()
                            && o.namespace() == req["namespace"].as_str()
                    })
                    .cloned();
                match found {
                    Some(found) => found,
                    None if self.stock => {
                        return Err(CallError::Foreign(format!("{} {} not found", req["kind"], req["name"])))
                    }
                    None => return fail(Code::NotFound, format!("{} {} not found", req["kind"], req["name"])),
                }
            }
            "list_resources_by_namespace" => {
                let items: Vec<Value> = self
                    .objects
                    .borrow()
                    .iter()
                    .filter(|o| {
                        o["kind"] == req["kind"]
                            && o["apiVersion"] == req["api_version"]
                            && o.namespace() == req["namespace"].as_str()
                            && Self::matches_selector(o, req["label_selector"].as_str())
                            && req["field_selector"]
                                .as_str()
                                .and_then(|f| f.strip_prefix("metadata.name="))
                                .is_none_or(|name| o.meta_str("name") == Some(name))
                    })
                    .map(|o| Self::masked(o, &req["field_masks"]))
                    .collect();
                json!({"apiVersion": "v1", "kind": "List", "items": items})
            }
            "list_referencing" => {
                let source = crate::model::source::SourceKind::from_kind(
                    req["source_kind"].as_str().unwrap_or_default(),
                )
                .map(|k| crate::model::source::SourceId::new(k, req["source_name"].as_str().unwrap_or_default()));
                let items: Vec<Value> = self
                    .objects
                    .borrow()
                    .iter()
                    .filter(|o| o["kind"] == req["kind"] && o.namespace() == req["namespace"].as_str())
                    .filter(|o| {
                        source.as_ref().is_some_and(|id| {
                            crate::model::kinds::template_of(o)
                                .is_some_and(|t| crate::model::template::own_group(t, id).is_some())
                        })
                    })
                    .cloned()
                    .collect();
                json!({"items": items})
            }
            "now" => json!({"unix": self.now}),
            // A snapshot's name, keyed as a host keys it (here by a fixed
            // test key): not the plain content hash's. A snapshot of the
            // content under the plain name (an earlier scheme's) is an alias.
            "snapshot_name" => {
                let source = req["source"]["name"].as_str().unwrap_or_default();
                let hash = req["contentHash"].as_str().unwrap_or_default();
                let kind = req["source"]["kind"].as_str().unwrap_or_default();
                let plain = crate::model::content::snapshot_name(source, hash);
                let keyed = FakeHost::keyed_name(source, hash);
                // As our hosts judge it: revoked under any name it has had.
                let revoked = self.revoked(kind, source, [keyed.as_str(), plain.as_str()]);
                let aliases: Vec<String> = self.find(kind, &plain).map(|_| plain).into_iter().collect();
                json!({"name": keyed, "aliases": aliases, "revoked": revoked})
            }
            "create_snapshot" => {
                let mut object = req["object"].clone();
                let name = object.name().to_string();
                if let Some(existing) = self.find(object["kind"].as_str().unwrap_or(""), &name) {
                    if existing["data"] != object["data"] {
                        return fail(Code::Refused, format!("snapshot {name} exists with different content"));
                    }
                    json!({"created": false})
                } else {
                    *self.next_uid.borrow_mut() += 1;
                    object.set_meta("uid", json!(format!("uid-{}", self.next_uid.borrow())));
                    object.set_meta(
                        "creationTimestamp",
                        json!(crate::model::duration::format_rfc3339(self.now)),
                    );
                    self.objects.borrow_mut().push(object);
                    json!({"created": true, "sweeps": self.sweeps})
                }
            }
            "delete_snapshot" => {
                let rv = &req["resourceVersion"];
                self.objects.borrow_mut().retain(|o| {
                    o.uid() != req["uid"].as_str() || (!rv.is_null() && o.meta("resourceVersion") != Some(rv))
                });
                json!({})
            }
            "create_snapshots" if self.batches => {
                let results: Vec<Value> = req["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|item| {
                        let bytes = serde_json::to_vec(item).unwrap_or_default();
                        match self.call(CONFIG_SNAPSHOT.0, CONFIG_SNAPSHOT.1, "create_snapshot", &bytes) {
                            Ok(answer) => serde_json::from_slice(&answer).unwrap_or_default(),
                            Err(CallError::Host(e)) => json!({ "error": e }),
                            Err(e) => json!({ "error": HostError::new(Code::Unavailable, e.to_string()) }),
                        }
                    })
                    .collect();
                json!({ "results": results })
            }
            "adopt" => json!({"queued": true}),
            "patch_workload" => json!({"queued": true}),
            other => return fail(Code::Unsupported, format!("unknown operation {other}")),
        };
        Ok(serde_json::to_vec(&answer).unwrap())
    }
}
