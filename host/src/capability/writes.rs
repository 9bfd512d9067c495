//! `adopt` and `patch_workload`, checked and staged for after the
//! admission, and `delete_snapshot`, carried out under the host's guard.

use config_snapshot_policy::host::contract::{Adopt, DeleteSnapshot, Deleted, PatchWorkload, Queued};
use config_snapshot_policy::host::host_error::{Code, HostError};
use config_snapshot_policy::model::kinds;
use config_snapshot_policy::model::records::Rollback;
use config_snapshot_policy::model::selection::is_dns_subdomain;
use serde::Deserialize;

use super::{failed, refused, Capability};
use crate::cluster::Cluster;
use crate::cluster::Preconditions;
use crate::lifecycle::{guard, Effect, PatchIntent, Room};

/// The host cannot take the call now; the same call later may pass.
fn busy(message: &str) -> HostError {
    HostError::new(Code::Unavailable, message)
}

/// The most keys a watch rollout's snapshot selects.
const MAX_KEYS: usize = 1024;

impl Capability {
    pub(super) fn adopt(&self, request: Adopt) -> Result<Queued, HostError> {
        let Adopt { owner, snapshots } = request;
        let (owner_kind, owner_name) = (owner.kind, owner.name);
        if kinds::find(&owner_kind).is_none_or(|k| !k.is_revision() && k.role != kinds::Role::Run) {
            return Err(refused(format!(
                "refused: adopt owner must be a revision (ReplicaSet, ControllerRevision, Job) or a Pod, not {owner_kind:?}"
            )));
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
        for snapshot in snapshots {
            let found = self
                .cluster
                .get(snapshot.kind.kind(), ns, &snapshot.name)
                .map_err(failed)?;
            if found.is_some_and(|o| config_snapshot_policy::model::keys::is_snapshot(&o)) {
                existing.push(snapshot);
            }
        }
        if existing.is_empty() {
            return Ok(Queued { queued: false });
        }
        // A promise the queue keeps (docs/design.md, "Garbage collection"):
        // with its namespace's share taken, the revision is refused and its
        // controller retries, rather than created with an adoption that is
        // dropped. Only the namespace's own share refuses it: were a full
        // queue to, a few namespaces filling it would have every other
        // namespace's revisions refused. So the queue may pass `capacity`,
        // by at most the shares of the namespaces that hold one.
        if self.in_flight.room(ns) == Room::FullForNamespace {
            return Err(busy("this namespace holds its share of the deferred-effect queue"));
        }
        let snapshots = existing;
        self.stage(Effect::Adopt {
            namespace: self.caller.namespace.clone(),
            owner_kind,
            owner_name,
            snapshots,
            stored_as: Some(self.stored_as()),
        });
        Ok(Queued { queued: true })
    }

    pub(super) fn delete_snapshot(&self, request: DeleteSnapshot) -> Result<Deleted, HostError> {
        let DeleteSnapshot {
            kind,
            name,
            uid,
            resource_version,
        } = request;
        let kind = kind.kind();
        let ns = &self.caller.namespace;
        let existing = self
            .cluster
            .get(kind, ns, &name)
            .map_err(failed)?
            .ok_or_else(|| HostError::new(Code::NotFound, format!("{kind} {name:?} not found")))?;
        let preconditions = Preconditions { uid, resource_version };
        // What the namespace names, listed by the host, not taken from the
        // guest: whatever it asks, a snapshot in use stays.
        let named = guard::Named::listed(&self.cluster, ns).map_err(failed)?;
        guard::delete_snapshot(
            &self.cluster,
            &self.in_flight,
            self.prover(),
            &existing,
            &preconditions,
            &named,
        )?;
        self.observer.note(format!("snapshot {kind}/{name} swept"));
        Ok(Deleted { deleted: true })
    }

    pub(super) fn patch_workload(&self, mut request: PatchWorkload) -> Result<Queued, HostError> {
        let workload = request.kind;
        let kind = workload.kind();
        if !workload.watches() {
            return Err(refused(format!(
                "refused: patch_workload applies to workloads that watch, not {kind:?}"
            )));
        }
        if request.api_version != workload.api_version() {
            return Err(refused(format!(
                "refused: patch_workload applies to {} {kind}, not {}",
                workload.api_version(),
                request.api_version
            )));
        }
        let template = workload.template();
        let inside = format!("{template}/");
        for op in &request.patch {
            let op = json_patch::PatchOperation::deserialize(op)
                .map_err(|e| refused(format!("refused: invalid JSON Patch: {e}")))?;
            let from = match &op {
                json_patch::PatchOperation::Move(m) => Some(m.from.to_string()),
                json_patch::PatchOperation::Copy(c) => Some(c.from.to_string()),
                _ => None,
            };
            for path in std::iter::once(op.path().to_string()).chain(from) {
                if !path.starts_with(&inside) {
                    return Err(refused(format!(
                        "refused: patch_workload may touch only {template}/..., not {path}"
                    )));
                }
            }
        }
        // The snapshot the rollout makes: named as an object is, of keys a
        // ConfigMap or Secret can have, for content given by its hash.
        if !is_dns_subdomain(&request.snapshot) || !is_dns_subdomain(&request.name) {
            return Err(refused("refused: patch_workload names a workload and a snapshot"));
        }
        let hash = &request.source.content_hash;
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(refused("refused: patch_workload needs the content's hash"));
        }
        if let Some(keys) = &request.keys {
            if keys.len() > MAX_KEYS || keys.iter().any(|k| k.is_empty() || k.len() > 253) {
                return Err(refused(format!(
                    "refused: patch_workload's keys: at most {MAX_KEYS} names"
                )));
            }
        }
        // The rollbacks the patch saw, as the guest says, but never more
        // than the workload has had: a guest that claimed more would keep a
        // rollback that comes before the patch lands from voiding it. The
        // guest found the workload through the same cache (serve) or store
        // (replay), so an honest count is never above this one.
        let had = self
            .cluster
            .get(kind, &self.caller.namespace, &request.name)
            .map_err(failed)?
            .and_then(|w| Rollback::of(&w))
            .map_or(0, |r| r.count);
        request.rollbacks = request.rollbacks.min(had);
        self.stage(Effect::Patch(PatchIntent::new(&self.caller.namespace, request)));
        Ok(Queued { queued: true })
    }
}
