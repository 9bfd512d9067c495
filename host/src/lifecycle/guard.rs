//! The host's invariants on deleting a snapshot, whoever asks: the guest's
//! sweep, the timed sweep, a dropped patch's clean-up (docs/design.md,
//! "Host capability contract"). Only ours, only the very object and
//! version that was judged, never one an effect on its way will make a
//! workload reference.

use config_snapshot_policy::host_error::{Code, HostError};
use config_snapshot_policy::keys;
use serde_json::Value;

use super::register::Register;
use crate::cluster::{key, Cluster, Preconditions};

/// Deletes `snapshot` under `preconditions` if every invariant holds.
pub fn delete_snapshot(
    cluster: &dyn Cluster,
    register: &Register,
    snapshot: &Value,
    preconditions: &Preconditions,
) -> Result<(), HostError> {
    let (kind, ns, name) = key(snapshot);
    require_managed(snapshot, &name)?;
    if snapshot["metadata"]["uid"] != preconditions.uid.as_str() {
        return Err(HostError::new(Code::Conflict, format!("{kind} {name} has another uid")));
    }
    if register.awaits(&(kind.clone(), ns.clone(), name.clone())) {
        return Err(HostError::new(
            Code::Refused,
            format!("refused: {kind} {name} is the target of a queued watch rollout"),
        ));
    }
    cluster
        .delete(&kind, &ns, &name, preconditions)
        .map_err(|e| HostError::new(e.code(), e.to_string()))
}

/// Refused unless `object` carries config-snapshot's label.
pub fn require_managed(object: &Value, name: &str) -> Result<(), HostError> {
    if keys::is_snapshot(object) {
        Ok(())
    } else {
        Err(HostError::new(
            Code::Refused,
            format!(
                "refused: {name} lacks the label {}={}",
                keys::MANAGED_BY,
                keys::MANAGED_BY_VALUE
            ),
        ))
    }
}
