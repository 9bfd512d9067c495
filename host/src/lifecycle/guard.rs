//! The host's invariants on deleting a snapshot, whoever asks: the guest's
//! sweep, the timed sweep, a dropped patch's clean-up (docs/design.md,
//! "Host capability contract"). Only a snapshot the host proves it made
//! (docs/security.md), only the very object and version that was judged,
//! never one an effect on its way will make a workload reference.

use config_snapshot_policy::host::host_error::{Code, HostError};
use config_snapshot_policy::model::object::ObjectExt;
use serde_json::Value;

use super::in_flight::InFlight;
use crate::cluster::proof::Prover;
use crate::cluster::{key, Cluster, Preconditions};

/// Deletes `snapshot` under `preconditions` if every invariant holds.
pub fn delete_snapshot(
    cluster: &dyn Cluster,
    in_flight: &InFlight,
    prover: &Prover,
    snapshot: &Value,
    preconditions: &Preconditions,
) -> Result<(), HostError> {
    let (kind, ns, name) = key(snapshot);
    require_ours(prover, snapshot)?;
    if snapshot.uid() != Some(preconditions.uid.as_str()) {
        return Err(HostError::new(Code::Conflict, format!("{kind} {name} has another uid")));
    }
    if in_flight.awaits(&(kind.clone(), ns.clone(), name.clone())) {
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
