//! What kind of write an admission is (docs/design.md, "Workload
//! admission", step 4): judged on the normalised templates, and against
//! the workload's revisions when only a revision can tell a rollback.

use crate::model::object::ObjectExt;
use serde_json::Value;

use super::{Change, Planner, RevisionMatch};
use crate::model::records::WatchRollout;
use crate::model::references::Reference;
use crate::model::request::SAY;
use crate::model::template::{self, Snapshots};

impl Planner<'_> {
    pub(super) fn classify(
        &self,
        refs: &[Reference],
        old_refs: &[Reference],
        known: &Snapshots,
        warnings: &mut Vec<String>,
    ) -> Change {
        let mut revisions: Option<RevisionMatch> = None;
        let (Some(old), Some(old_template)) = (self.old, self.old_template()) else {
            return Change::Create;
        };
        let new_normal = template::normalise_with(self.template(), known);
        let mut matched = || *revisions.get_or_insert_with(|| self.match_revisions(&new_normal, known, warnings));
        if template::normalise_with(old_template, known) == new_normal {
            // A reference now naming another snapshot moved. One naming its
            // source again is a re-applied manifest (server-side apply
            // writes source names back): nothing moved.
            let moved = refs
                .iter()
                .zip(old_refs)
                .any(|(a, b)| a.name != b.name && known.contains(a.kind, &a.name));
            if self.template() == old_template {
                Change::NoOp
            } else if WatchRollout::made(self.object, old) {
                Change::WatchRollout
            } else if matched().exact {
                // Whatever moved (references, `renewed-at`, names back to a
                // source): a revision's template put back is a rollback.
                Change::Rollback
            } else if moved {
                Change::Repointed
            } else {
                // A source name written back over its snapshot (server-side
                // apply of the manifest), or the policy's annotations
                // changed: nothing a user changed.
                Change::NoOp
            }
        } else if matched().normalised {
            Change::Rollback
        } else {
            Change::RollForward
        }
    }

    /// Looks the new template up among this workload's revisions. The
    /// lookup lists them with field masks, so only owners and templates
    /// cross the host boundary.
    pub(super) fn match_revisions(
        &self,
        normalised: &Value,
        known: &Snapshots,
        warnings: &mut Vec<String>,
    ) -> RevisionMatch {
        let uid = self.object.uid();
        let selector = label_selector(self.object.pointer("/spec/selector/matchLabels"));
        let revision = self.kind.revisions();
        let template_mask = revision
            .template
            .unwrap_or_default()
            .trim_start_matches('/')
            .replace('/', ".");
        let masks = ["metadata.ownerReferences", template_mask.as_str()];
        let revisions = match self.lookup.revisions(revision, selector, &masks) {
            Ok(items) => items,
            Err(e) => {
                warnings.push(format!(
                    "{SAY}could not list {}s to detect a rollback, treated as a new rollout: {e}",
                    revision.kind
                ));
                return RevisionMatch::default();
            }
        };
        let new_raw = template::without_controller_marks(self.template());
        let mut found = RevisionMatch::default();
        for rev in revisions.iter().filter(|r| owned_by(r, uid, self.kind.kind())) {
            let Some(t) = revision.template_of(rev) else { continue };
            if template::normalise_with(t, known) == *normalised {
                found.normalised = true;
                found.exact |= template::without_controller_marks(t) == new_raw;
            }
        }
        found
    }
}

fn owned_by(object: &Value, uid: Option<&str>, kind: &str) -> bool {
    object.owner_references().iter().any(|o| {
        o.get("kind").and_then(Value::as_str) == Some(kind)
            && uid.is_none_or(|uid| o.get("uid").and_then(Value::as_str) == Some(uid))
    })
}

/// `matchLabels` as a label selector string, to narrow the revision list.
fn label_selector(match_labels: Option<&Value>) -> Option<String> {
    let labels = match_labels?.as_object()?;
    let parts: Vec<String> = labels
        .iter()
        .filter_map(|(k, v)| v.as_str().map(|v| format!("{k}={v}")))
        .collect();
    (!parts.is_empty()).then(|| parts.join(","))
}
