//! `adopt` and `patch_workload`, checked and staged for after the
//! admission, and `delete_snapshot`, carried out under the host's guard.

use config_snapshot_policy::host_error::{Code, HostError};
use config_snapshot_policy::kinds::{self, WorkloadKind};
use config_snapshot_policy::selection::is_dns_subdomain;
use config_snapshot_policy::source::SourceKind;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{failed, refused, Capability};

/// The most keys a watch rollout's snapshot selects.
const MAX_KEYS: usize = 1024;
use crate::cluster::Cluster;
use crate::cluster::Preconditions;
use crate::lifecycle::{guard, Effect};

impl Capability {
    pub(super) fn adopt(&self, request: Value) -> Result<Value, HostError> {
        let owner_kind = request["owner"]["kind"].as_str().unwrap_or_default().to_string();
        if kinds::find(&owner_kind).is_none_or(|k| !k.is_revision() && k.role != kinds::Role::Run) {
            return Err(refused(format!(
                "refused: adopt owner must be a revision (ReplicaSet, ControllerRevision, Job) or a Pod, not {owner_kind:?}"
            )));
        }
        let owner_name = request["owner"]["name"]
            .as_str()
            .ok_or_else(|| refused("refused: adopt needs owner.name"))?
            .to_string();
        let mut snapshots = Vec::new();
        for s in request["snapshots"]
            .as_array()
            .ok_or_else(|| refused("refused: adopt needs snapshots"))?
        {
            let (Some(kind), Some(name)) = (s["kind"].as_str(), s["name"].as_str()) else {
                return Err(refused("refused: each snapshot needs kind and name"));
            };
            if SourceKind::from_kind(kind).is_none() {
                return Err(refused(format!("refused: cannot adopt a {kind}")));
            }
            snapshots.push((kind.to_string(), name.to_string()));
        }
        let subject = &self.caller.subject;
        if !subject.kind.is_empty() && (subject.kind != owner_kind || subject.name != owner_name) {
            return Err(refused(format!(
                "refused: adopt acts on the object the request writes, {}/{}, not {owner_kind}/{owner_name}",
                subject.kind, subject.name
            )));
        }
        // Only snapshots that exist are worth a place in the queue: a
        // revision naming made-up ones (a tenant's, by hand) stages nothing
        // and reads nothing. What the host's cache shows: one another replica
        // made a moment ago and this one's watch has not brought yet is
        // adopted by the periodic pass, and kept meanwhile because its
        // workload names it.
        let ns = &self.caller.namespace;
        let mut existing = Vec::with_capacity(snapshots.len());
        for (kind, name) in snapshots {
            let found = self.cluster.get(&kind, ns, &name).map_err(failed)?;
            if found.is_some_and(|o| config_snapshot_policy::keys::is_snapshot(&o)) {
                existing.push((kind, name));
            }
        }
        if existing.is_empty() {
            return Ok(json!({"queued": false}));
        }
        let snapshots = existing;
        self.stage(Effect::Adopt {
            namespace: self.caller.namespace.clone(),
            owner_kind,
            owner_name,
            snapshots,
            stored_as: Some(self.stored_as()),
        });
        Ok(json!({"queued": true}))
    }

    pub(super) fn delete_snapshot(&self, request: Value) -> Result<Value, HostError> {
        let (Some(kind), Some(name), Some(uid)) = (
            request["kind"].as_str(),
            request["name"].as_str(),
            request["uid"].as_str(),
        ) else {
            return Err(refused("refused: delete_snapshot needs kind, name and uid"));
        };
        let rv = request["resourceVersion"].as_str();
        if SourceKind::from_kind(kind).is_none() {
            return Err(refused(format!("refused: cannot delete a {kind}")));
        }
        let ns = &self.caller.namespace;
        let existing = self
            .cluster
            .get(kind, ns, name)
            .map_err(failed)?
            .ok_or_else(|| HostError::new(Code::NotFound, format!("{kind} {name:?} not found")))?;
        let preconditions = Preconditions {
            uid: uid.to_string(),
            resource_version: rv.map(str::to_string),
        };
        guard::delete_snapshot(&self.cluster, &self.in_flight, self.prover(), &existing, &preconditions)?;
        self.observer.note(format!("snapshot {kind}/{name} swept"));
        Ok(json!({"deleted": true}))
    }

    pub(super) fn patch_workload(&self, request: Value) -> Result<Value, HostError> {
        let kind = request["kind"].as_str().unwrap_or_default();
        let Some(workload) = WorkloadKind::from_kind(kind).filter(|w| w.watches()) else {
            return Err(refused(format!(
                "refused: patch_workload applies to workloads that watch, not {kind:?}"
            )));
        };
        if request["apiVersion"] != workload.api_version() {
            return Err(refused(format!(
                "refused: patch_workload applies to {} {kind}, not {}",
                workload.api_version(),
                request["apiVersion"]
            )));
        }
        let ops = request["patch"]
            .as_array()
            .ok_or_else(|| refused("refused: patch_workload needs a patch"))?;
        let template = workload.template();
        let inside = format!("{template}/");
        for op in ops {
            for field in ["path", "from"] {
                if let Some(path) = op.get(field).and_then(Value::as_str) {
                    if !path.starts_with(&inside) {
                        return Err(refused(format!(
                            "refused: patch_workload may touch only {template}/..., not {path}"
                        )));
                    }
                }
            }
        }
        json_patch::Patch::deserialize(&request["patch"])
            .map_err(|e| refused(format!("refused: invalid JSON Patch: {e}")))?;
        // The snapshot the rollout makes: named as an object is, of keys a
        // ConfigMap or Secret can have, for content given by its hash.
        let snapshot = request["snapshot"].as_str().unwrap_or_default();
        if !is_dns_subdomain(snapshot) || !is_dns_subdomain(request["name"].as_str().unwrap_or_default()) {
            return Err(refused("refused: patch_workload names a workload and a snapshot"));
        }
        let hash = request["source"]["contentHash"].as_str().unwrap_or_default();
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(refused("refused: patch_workload needs the content's hash"));
        }
        match &request["keys"] {
            Value::Null => {}
            Value::Array(keys)
                if keys.len() <= MAX_KEYS
                    && keys
                        .iter()
                        .all(|k| k.as_str().is_some_and(|k| !k.is_empty() && k.len() <= 253)) => {}
            _ => {
                return Err(refused(format!(
                    "refused: patch_workload's keys: at most {MAX_KEYS} names"
                )))
            }
        }
        self.stage(Effect::Patch {
            namespace: self.caller.namespace.clone(),
            request,
        });
        Ok(json!({"queued": true}))
    }
}
