//! The host's invariants on deleting a snapshot, whoever asks: the guest's
//! sweep, the timed sweep, a dropped patch's clean-up (docs/design.md,
//! "Host capability contract"). Only a snapshot the host proves it made
//! (docs/security.md), only the very object and version that was judged,
//! never one a workload, revision or Pod of its namespace names, nor one an
//! effect on its way will make a workload reference. The guest decides what
//! to sweep from lists the host answered, and the host judges again: a
//! guest that asks to delete what is in use (a policy of another build, a
//! bug) deletes nothing.

use std::collections::HashSet;

use config_snapshot_policy::host::host_error::{Code, HostError};
use config_snapshot_policy::model::kinds;
use config_snapshot_policy::model::object::ObjectExt;
use serde_json::Value;

use super::in_flight::InFlight;
use super::pass::add_references;
use crate::cluster::proof::Prover;
use crate::cluster::{self, key, Cluster, Key, Preconditions, Selector};

/// What the holders (workloads, revisions, Pods) of one namespace, or of
/// every namespace, name, as the host listed them: what a delete must show
/// the guard. Made only from a listing of every kind of holder: the guard's
/// own ([`Named::listed`]), or one the host's sweep made already
/// ([`Named::among`]).
pub struct Named {
    keys: HashSet<Key>,
    /// The namespace listed; `None`: every namespace.
    scope: Option<String>,
}

impl Named {
    /// What the holders of `namespace` name, listed from `cluster` now
    /// (serve: its caches, whose lag the sweep's grace period covers).
    pub fn listed(cluster: &dyn Cluster, namespace: &str) -> cluster::Result<Named> {
        let mut keys = HashSet::new();
        for holder in kinds::holders() {
            cluster.list(holder.kind, Some(namespace), &Selector::default(), &mut |o| {
                add_references(&mut keys, o)
            })?;
        }
        Ok(Named {
            keys,
            scope: Some(namespace.to_string()),
        })
    }

    /// What `objects` name: every holder of `scope` (a namespace, or
    /// `None`: every one), as the caller listed them, with whatever else.
    pub(crate) fn among(objects: &[&Value], scope: Option<&str>) -> Named {
        let mut keys = HashSet::new();
        for object in objects {
            add_references(&mut keys, object);
        }
        Named {
            keys,
            scope: scope.map(str::to_string),
        }
    }

    /// The snapshots named, as (kind, namespace, name).
    pub(crate) fn keys(&self) -> &HashSet<Key> {
        &self.keys
    }

    /// Whether the listing speaks for `namespace`.
    fn covers(&self, namespace: &str) -> bool {
        self.scope.as_deref().is_none_or(|listed| listed == namespace)
    }
}

/// Deletes `snapshot` under `preconditions` if every invariant holds:
/// ours, the object judged, named by no holder in `named` (a listing of its
/// namespace) and awaited by no effect.
pub fn delete_snapshot(
    cluster: &dyn Cluster,
    in_flight: &InFlight,
    prover: &Prover,
    snapshot: &Value,
    preconditions: &Preconditions,
    named: &Named,
) -> Result<(), HostError> {
    let (kind, ns, name) = key(snapshot);
    require_ours(prover, snapshot)?;
    if snapshot.uid() != Some(preconditions.uid.as_str()) {
        return Err(HostError::new(Code::Conflict, format!("{kind} {name} has another uid")));
    }
    if !named.covers(&ns) {
        return Err(HostError::new(
            Code::Refused,
            format!("refused: {kind} {name}: what its namespace's workloads, revisions and Pods name was not listed"),
        ));
    }
    let snapshot_key = (kind.clone(), ns.clone(), name.clone());
    if named.keys.contains(&snapshot_key) {
        return Err(HostError::new(
            Code::Refused,
            format!("refused: {kind} {name} is named by a workload, revision or Pod in its namespace"),
        ));
    }
    if in_flight.awaits(&snapshot_key) {
        return Err(HostError::new(
            Code::Refused,
            format!("refused: {kind} {name} is the target of a queued watch rollout"),
        ));
    }
    cluster
        .delete(&kind, &ns, &name, preconditions)
        .map_err(|e| HostError::new(e.code(), e.to_string()))
}

/// Refused unless `object` is a snapshot this installation made: signed
/// by a key of its ring.
pub(crate) fn require_ours(prover: &Prover, object: &Value) -> Result<(), HostError> {
    prover.verify(object).map_err(|why| {
        let (kind, _, name) = key(object);
        HostError::new(
            Code::Refused,
            format!("refused: {kind} {name} is not a snapshot config-snapshot made: {why}"),
        )
    })
}
