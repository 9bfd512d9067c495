//! What an admission records: the renewal it makes, if one is due, and
//! the rollback record the workload carries afterwards (docs/design.md,
//! "A rollback always wins").

use crate::model::object::ObjectExt;
use serde_json::Value;

use crate::model::content::Content;
use crate::model::duration::parse_rfc3339;
use crate::model::keys;
use crate::model::records::{generation, Rollback};
use crate::model::references::{Reference, SourceRefs};
use crate::model::template::{self, Snapshots};

use super::{Change, Planner, Target};

impl Planner<'_> {
    /// Whether a renewal is due now, and the `renewed-at` to record. The
    /// renew period runs from the last renewal or the last rollback,
    /// whichever is later.
    pub(super) fn renewal(&self, change: Change) -> (bool, Option<i64>) {
        let Some(every) = self.optin.renew_secs else {
            return (false, None);
        };
        let renewed_in = |t: &Value| t.annotation(keys::RENEWED_AT).and_then(parse_rfc3339);
        // A rollback brings its revision's renewal back with it. Any other
        // write that drops the mark (`kubectl replace`, Argo CD's
        // Replace=true: the manifest never carried it) keeps the live one:
        // the host wrote it, not the user, and re-syncing a manifest is no
        // reason to renew.
        let renewed = match change {
            Change::Rollback => renewed_in(self.template()),
            _ => renewed_in(self.template()).or_else(|| self.old_template().and_then(renewed_in)),
        };
        if change == Change::Rollback || !change.may_renew() {
            return (false, renewed);
        }
        let rolled_back = self.old.and_then(Rollback::of).map(|r| r.at);
        let last = renewed.max(rolled_back);
        let now = self.now;
        match last {
            Some(t) if now.saturating_sub(t) < every as i64 => (false, renewed),
            _ => (true, Some(now)),
        }
    }

    /// The rollback record the workload carries after this admission.
    pub(super) fn rollback_record(
        &self,
        change: Change,
        renewing: bool,
        groups: &[SourceRefs],
        targets: &[Target],
        old_refs: &[Reference],
        known: &Snapshots,
    ) -> Option<Rollback> {
        match change {
            // A record copied from another object speaks of its generations.
            Change::Create => None,
            Change::Rollback => Some(Rollback {
                // Settled by the admission once the written spec is known
                // (`records::generation_after`).
                generation: self.old.map(generation).unwrap_or(0) + 1,
                count: self.old.map_or(0, Rollback::count_of) + 1,
                at: self.now,
                // Every source it pins, not only those it watches now: a
                // source's word can make it a watcher later (`readers:
                // watch` written after the undo), and the periodic pass
                // must not then roll the rollback forward to the content
                // it declined (docs/design.md, "The source decides").
                sources: groups
                    .iter()
                    .filter(|g| self.optin.snapshots(&g.id, self.settings))
                    .filter_map(|g| Some((g.id.clone(), self.declined(g)?)))
                    .collect(),
            }),
            // The record is the host's bookkeeping: it is carried from the
            // live object, whatever the write says (`kubectl rollout undo`
            // copies a ReplicaSet's older annotations back).
            _ => {
                let mut record = self.old.and_then(Rollback::of)?;
                if renewing || change == Change::RollForward {
                    record.sources.clear();
                } else {
                    // A source whose references moved is no longer held.
                    // They are compared as this admission leaves them: a
                    // re-sync that writes the source's name back (apply,
                    // server-side apply, replace) gets the live snapshot,
                    // so nothing moved and the rollback still holds.
                    let old_groups = template::group_by_source(old_refs, known);
                    record.sources.retain(|(id, _)| {
                        let before = old_groups
                            .iter()
                            .find(|g| g.id == *id)
                            .map(|g| g.refs.iter().map(|r| r.name.clone()).collect::<Vec<_>>());
                        let after = groups
                            .iter()
                            .zip(targets)
                            .find(|(g, _)| g.id == *id)
                            .map(|(g, target)| {
                                let name = match target {
                                    Target::Snapshot(name) => name.clone(),
                                    Target::Source => g.id.name.clone(),
                                };
                                vec![name; g.refs.len()]
                            });
                        after == before
                    });
                }
                Some(record)
            }
        }
    }

    /// The snapshot the source's current content would get: what this
    /// rollback declines. `""` when the source could not be read (nothing
    /// may roll it forward until its references move); none when it does
    /// not exist (its creation is a change).
    pub(super) fn declined(&self, group: &SourceRefs) -> Option<String> {
        let named = |source: &Value| -> Option<String> {
            let content = Content::from_object(group.id.kind, source).ok()?;
            let content = content.subset(group.key_subset().as_ref());
            // A name the host cannot give declines any content: nothing
            // may roll it forward until its references move.
            Some(
                self.lookup
                    .snapshot_name(&group.id, &content)
                    .map(|n| n.name)
                    .unwrap_or_default(),
            )
        };
        match self.lookup.source(group.id.kind, &group.id.name) {
            Ok(Some(source)) => named(&source),
            Ok(None) => None,
            Err(_) => Some(String::new()),
        }
    }
}
