//! What an answer may keep (docs/design.md, "Revocation"): a snapshot the
//! answer names without making it, and that the live object's template
//! does not name already, must not be revoked and must exist. Such names
//! come from a revision's template put back (`kubectl rollout undo`, and
//! its equivalents for every kind), a reference repointed by hand, or a
//! manifest exported with its snapshot names and created again.
//!
//! A revoked snapshot, or one since deleted, would have the pods fail to
//! start (`CreateContainerConfigError`), or start without their config
//! where the reference is optional: the write is refused instead, with a
//! message that says why, and nothing dangles. A name the live object
//! names already costs nothing: its pods run on it, or fail, whatever this
//! write says.

use super::{Change, Planner, Target, Write};
use crate::model::references::{Reference, SourceRefs};
use crate::model::request::{Rejection, SAY};
use crate::model::settings::OnSnapshotFailure;
use crate::model::source::SourceId;

impl Planner<'_> {
    /// Refuses the write if it keeps a snapshot the live object does not
    /// name and that was revoked or no longer exists. The record first,
    /// from the host's cache (it is written before the snapshots it names
    /// are deleted); then each such snapshot, read as fresh as the request.
    /// Not for the host's own watch rollout, whose snapshot the host made
    /// from the source just before its patch: only the record is looked at
    /// then. A read of a snapshot that fails is judged by
    /// `onSnapshotFailure`, as a failed read of a source is: refused, or
    /// admitted as the write left it, with a warning (an outage is no
    /// proof that a snapshot is gone).
    pub(super) fn check_kept(
        &self,
        change: Change,
        (groups, targets): (&[SourceRefs], &[Target]),
        writes: &[Write],
        old_refs: &[Reference],
        warnings: &mut Vec<String>,
    ) -> Result<(), Rejection> {
        let kept: Vec<(&SourceId, &str)> = groups
            .iter()
            .zip(targets)
            .filter_map(|(group, target)| match target {
                Target::Snapshot(name) => Some((&group.id, name.as_str())),
                Target::Source => None,
            })
            .filter(|(_, name)| !writes.iter().any(|w| w.name == *name))
            .filter(|(id, name)| !old_refs.iter().any(|r| r.kind == id.kind && r.name == *name))
            .collect();
        if kept.is_empty() {
            return Ok(());
        }
        let record = self
            .lookup
            .revocations()
            .map_err(|e| Rejection::new(format!("{SAY}{e}"), 500))?;
        let gone = |id: &SourceId, name: &str, why: String| {
            Rejection::new(format!("{SAY}snapshot {name} of {id} {why}; roll forward instead"), 409)
        };
        for (id, name) in &kept {
            if let Some(revocation) = record.revoking(id, name) {
                return Err(gone(id, name, format!("was {revocation}")));
            }
        }
        if change == Change::WatchRollout {
            return Ok(());
        }
        for (id, name) in kept {
            let what = format!("snapshot {name} of {id}");
            match self.lookup.source(id.kind, name) {
                Ok(Some(_)) => {}
                Ok(None) => return Err(gone(id, name, "no longer exists".to_string())),
                Err(e) => match self.settings.on_snapshot_failure {
                    OnSnapshotFailure::Reject => {
                        return Err(Rejection::new(format!("{SAY}could not read {what}: {e}"), 500))
                    }
                    OnSnapshotFailure::Warn => warnings.push(format!(
                        "{SAY}could not read {what}, left its references unchanged: {e}"
                    )),
                },
            }
        }
        Ok(())
    }
}
